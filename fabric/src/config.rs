//! Transport selection and data-plane limits.

use crate::error::{Error, Result};

/// `UCX_TLS` of the shared-memory preset: the two UCX transports whose memory
/// domains allocate regions as shared segments that a peer writes with plain stores
/// (`self` serves a worker talking to itself). `cma` is left out on purpose: UCX 1.13
/// uses it only for rendezvous, never for `ucp_put`/`ucp_get`. See the crate docs,
/// "Which transports are one-sided".
pub const SHM_TRANSPORTS: &str = "sysv,posix,self";

/// `UCX_TLS` of the TCP preset. TCP in UCX 1.13 emulates put/get with messages the
/// target's worker must progress: the host needs a progress thread.
pub const TCP_TRANSPORTS: &str = "tcp,self";

/// How to build a transport context. Consumers map their own config files onto this
/// (the agent's TOML, the shim's environment); this crate reads no files.
///
/// Construct with [`FabricConfig::default`] (let UCX choose: right on RDMA hardware),
/// [`FabricConfig::shm`], [`FabricConfig::tcp`] or [`FabricConfig::preset`], then
/// adjust fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FabricConfig {
    /// `UCX_TLS`-style transport list, e.g. `"sysv,posix,self"` or `"tcp,self"`.
    /// `None` leaves the choice to UCX (and to a `UCX_TLS` environment variable, if
    /// set); on RDMA hardware that selects rc/dc. `Some` overrides the environment.
    pub transports: Option<String>,
    /// Further UCX options as (name, value) with the name *without* the `UCX_` prefix,
    /// e.g. `("NET_DEVICES", "eth1")`. Applied after `transports`; they override the
    /// environment too.
    pub ucx_options: Vec<(String, String)>,
    /// Doorbells buffered between [`crate::Transport::progress`] and
    /// [`crate::Transport::take_doorbells`]; more are counted as overflowed and dropped.
    pub doorbell_queue_len: usize,
    /// Operations posted on one endpoint and not yet completed by the transport before
    /// `put`/`get` return [`Error::Busy`].
    pub max_in_flight_ops: usize,
    /// How long [`crate::Transport::connect`] waits for the endpoint to be wired up
    /// (immediate on shared memory; a TCP handshake needs the peer to progress).
    pub connect_timeout_ms: u64,
    /// How long dropping an endpoint waits for UCX to close it gracefully (progressing
    /// the worker) before abandoning the close.
    pub close_timeout_ms: u64,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            transports: None,
            ucx_options: Vec::new(),
            doorbell_queue_len: 4096,
            max_in_flight_ops: 4096,
            connect_timeout_ms: 10_000,
            close_timeout_ms: 1000,
        }
    }
}

impl FabricConfig {
    /// Shared memory between processes of one machine ([`SHM_TRANSPORTS`]): one-sided,
    /// so a stopped host still receives payload.
    pub fn shm() -> Self {
        FabricConfig { transports: Some(SHM_TRANSPORTS.to_owned()), ..FabricConfig::default() }
    }

    /// TCP ([`TCP_TRANSPORTS`]): works across hosts and network namespaces, but the
    /// target of a put must progress its worker (a progress thread on the host).
    pub fn tcp() -> Self {
        FabricConfig { transports: Some(TCP_TRANSPORTS.to_owned()), ..FabricConfig::default() }
    }

    /// Defaults with an explicit `UCX_TLS`-style transport list, e.g. `"rc_x,self"`.
    pub fn with_transports(transports: impl Into<String>) -> Self {
        FabricConfig { transports: Some(transports.into()), ..FabricConfig::default() }
    }

    /// A preset by name: `"shm"`, `"tcp"`, or `"auto"` (UCX chooses). `None` for any
    /// other name, so config checkers can list the valid ones.
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "shm" => Some(Self::shm()),
            "tcp" => Some(Self::tcp()),
            "auto" => Some(Self::default()),
            _ => None,
        }
    }

    /// Names accepted by [`FabricConfig::preset`].
    pub const PRESETS: &'static [&'static str] = &["shm", "tcp", "auto"];

    /// Checks what UCX would otherwise reject obscurely.
    pub fn validate(&self) -> Result<()> {
        if let Some(tls) = &self.transports {
            if tls.trim().is_empty() {
                return Err(Error::Config("transports is empty; use None to let UCX choose".into()));
            }
            no_nul("transports", tls)?;
        }
        for (name, value) in &self.ucx_options {
            if name.is_empty() || name.starts_with("UCX_") {
                return Err(Error::Config(format!(
                    "UCX option name {name:?} must be non-empty and given without the UCX_ prefix"
                )));
            }
            no_nul("UCX option name", name)?;
            no_nul("UCX option value", value)?;
        }
        if self.doorbell_queue_len == 0 {
            return Err(Error::Config("doorbell_queue_len must be at least 1".into()));
        }
        if self.max_in_flight_ops == 0 {
            return Err(Error::Config("max_in_flight_ops must be at least 1".into()));
        }
        Ok(())
    }
}

/// Whether `name` has the form of a Linux network interface name (what the kernel's
/// `dev_valid_name` accepts): 1 to 15 bytes, not `.` or `..`, no `/`, `:` or white
/// space. The reason when it has not.
pub fn check_interface_name(name: &str) -> std::result::Result<(), String> {
    const IFNAMSIZ: usize = 16;
    if name.is_empty() || name.len() >= IFNAMSIZ {
        return Err(format!("{name:?}: an interface name has 1 to {} bytes", IFNAMSIZ - 1));
    }
    if name == "." || name == ".." || name.chars().any(|c| c == '/' || c == ':' || c == '\0' || c.is_whitespace()) {
        return Err(format!("{name:?} is not an interface name (no /, :, white space; not . or ..)"));
    }
    Ok(())
}

/// The network interfaces of this process's network namespace, as `ip link` names
/// them. Read from `/proc/net/dev`, which follows the namespace of the reader even
/// where `/sys` was mounted for another one (`nsenter --net`).
pub fn network_interfaces() -> Result<Vec<String>> {
    let text = std::fs::read_to_string("/proc/net/dev")
        .map_err(|source| Error::Io { op: "list the network interfaces (/proc/net/dev)", source })?;
    // Two header lines, then "  NAME: counters..." per interface.
    Ok(text.lines().skip(2).filter_map(|l| l.split_once(':')).map(|(name, _)| name.trim().to_owned()).collect())
}

/// Checks that `name` is a network interface of this network namespace:
/// [`Error::NoSuchInterface`] (with the ones that exist) otherwise.
pub fn check_interface(name: &str) -> Result<()> {
    let available = network_interfaces()?;
    if available.iter().any(|i| i == name) {
        Ok(())
    } else {
        Err(Error::NoSuchInterface { name: name.to_owned(), available })
    }
}

fn no_nul(what: &str, s: &str) -> Result<()> {
    if s.contains('\0') { Err(Error::Config(format!("{what} {s:?} contains a NUL byte"))) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_by_name() {
        for name in FabricConfig::PRESETS {
            let cfg = FabricConfig::preset(name).expect("listed preset exists");
            cfg.validate().expect("presets are valid");
        }
        assert_eq!(FabricConfig::preset("shm").unwrap().transports.as_deref(), Some(SHM_TRANSPORTS));
        assert_eq!(FabricConfig::preset("auto").unwrap().transports, None);
        assert!(FabricConfig::preset("rdma").is_none());
    }

    #[test]
    fn rejects_what_ucx_would_choke_on() {
        let mut cfg = FabricConfig::shm();
        cfg.transports = Some(" ".into());
        assert!(matches!(cfg.validate(), Err(Error::Config(_))));

        let mut cfg = FabricConfig::tcp();
        cfg.ucx_options.push(("UCX_NET_DEVICES".into(), "lo".into()));
        assert!(matches!(cfg.validate(), Err(Error::Config(_))));

        let mut cfg = FabricConfig::tcp();
        cfg.ucx_options.push(("NET_DEVICES".into(), "l\0o".into()));
        assert!(matches!(cfg.validate(), Err(Error::Config(_))));

        let cfg = FabricConfig { doorbell_queue_len: 0, ..FabricConfig::default() };
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn interface_names_are_checked_for_form_and_existence() {
        for good in ["lo", "eth0", "veth-dpu", "enp65s0f0np0", "a23456789012345"] {
            assert_eq!(check_interface_name(good), Ok(()), "{good}");
        }
        for bad in ["", "a234567890123456", ".", "..", "a/b", "eth0:1", "e th0", "e\0"] {
            assert!(check_interface_name(bad).is_err(), "{bad:?}");
        }
        // Every namespace has a loopback interface.
        let here = network_interfaces().unwrap();
        assert!(here.iter().any(|i| i == "lo"), "{here:?}");
        check_interface("lo").unwrap();
        let e = check_interface("dpuio-nosuch0").unwrap_err().to_string();
        assert!(e.contains("network interface \"dpuio-nosuch0\" does not exist here") && e.contains("lo"), "{e}");
    }
}
