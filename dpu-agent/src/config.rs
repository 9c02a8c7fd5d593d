//! The agent's TOML configuration and `check-config`.
//!
//! The file is walked by hand rather than through `serde` so that one pass reports
//! *every* mistake (serde stops at the first), each with its key path and the reason,
//! the way an operator wants to fix a config in one round trip.
//!
//! ```toml
//! [agent]
//! listen = "127.0.0.1:7300"   # any address: mTLS is on by default
//! data_dir = "./dpuio-data"
//! lease_ms = 30000
//!
//! [tls]
//! mode = "mtls"               # or "off": plaintext, loopback listeners only
//! trust_domain = "dpuio.local"
//! # cert, key, client_ca: production files; default a development CA under data_dir/pki
//!
//! [admin]
//! socket = "./dpuio-data/admin.sock"
//!
//! [metrics]
//! listen = "127.0.0.1:9464"  # Prometheus GET /metrics; absent: no metrics listener
//!
//! [backend]
//! kind = "local"              # the embedded backend
//! path = "./dpuio-data"       # default: data_dir
//! # or DAOS (libdfs loaded at run time; see docs/daos.md):
//! # kind = "daos"
//! # pool = "tank"                       # label or UUID; required
//! # system = "daos_server"              # the DAOS system name
//! # agent_socket_dir = "/var/run/daos_agent"  # default: DAOS_AGENT_DRPC_DIR, else this
//! # create_containers = false           # true: a missing tenant container is created (POSIX)
//! # chunk_bytes = 1048576               # chunk size of new files
//! # object_class = ""                   # e.g. "SX", "RP_2G1"; empty: the container's default
//!
//! [limits]
//! max_sessions = 1024
//!
//! [[tenants]]
//! name = "default"
//! container = "default"
//! max_sessions = 64           # default: [limits] max_sessions
//! [tenants.qos]               # 0 or absent: unlimited
//! bytes_per_s = 1073741824
//! ops_per_s = 100000
//! burst_bytes = 67108864
//! burst_ops = 1000
//! weight = 1                  # share when tenants compete
//! max_inflight = 256          # data-plane requests in flight, all sessions
//! ```

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The default control-plane address: loopback, so a fresh agent is reachable only
/// from its own machine.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7300";
/// Where a fresh agent keeps its data when nothing says otherwise.
pub const DEFAULT_DATA_DIR: &str = "./dpuio-data";
/// The tenant and container a fresh agent creates.
pub const DEFAULT_TENANT: &str = "default";

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    /// A plaintext listener that serves only `grpc.health.v1` (for kubelet's `grpc` probe,
    /// which speaks no TLS); none by default.
    pub health_listen: Option<SocketAddr>,
    pub data_dir: PathBuf,
    pub lease_ms: u64,
    pub backend: BackendConfig,
    pub limits: Limits,
    pub tenants: Vec<TenantConfig>,
    pub data_plane: DataPlaneConfig,
    pub tls: TlsConfig,
    pub admin: AdminConfig,
    pub metrics: MetricsConfig,
}

/// The default SPIFFE trust domain of a development PKI.
pub const DEFAULT_TRUST_DOMAIN: &str = "dpuio.local";

/// `[tls]`: how the control plane authenticates clients.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsConfig {
    /// Mutual TLS (the default), or plaintext on a loopback listener.
    pub mtls: bool,
    /// The SPIFFE trust domain client certificates must name.
    pub trust_domain: String,
    /// Production files: the server certificate chain, its key, and the CA that
    /// issues client certificates. All three or none (none: a development CA under
    /// `data_dir/pki`, made on first start).
    pub files: Option<TlsFiles>,
    /// Where the development client bundle of the default tenant is written on start
    /// (`None`: `$DPUIO_CONFIG_DIR`, else `$HOME/.config/dpuio`).
    pub client_bundle_dir: Option<PathBuf>,
}

/// Operator-provided certificate files.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig { mtls: true, trust_domain: DEFAULT_TRUST_DOMAIN.into(), files: None, client_bundle_dir: None }
    }
}

/// `[admin]`: the operator's listener.
#[derive(Debug, Clone, PartialEq)]
pub struct AdminConfig {
    /// The Unix socket of the Admin service (`None`: `data_dir/admin.sock`). Only the
    /// agent's own user and root may connect.
    pub socket: Option<PathBuf>,
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetricsConfig {
    /// Where `GET /metrics` is served, in plaintext (`None`: nowhere). Port 0 takes a
    /// free port; the agent logs the one it bound.
    pub listen: Option<SocketAddr>,
}

/// `[tenants.qos]`: a tenant's share of the data plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QosConfig {
    /// Rates and bursts; 0 means unlimited.
    pub limits: dpuio_auth::qos::QosLimits,
    /// Share of service when several tenants are backlogged.
    pub weight: u32,
    /// Data-plane requests of the tenant in flight at once, over all its sessions.
    pub max_inflight: u32,
}

impl Default for QosConfig {
    fn default() -> Self {
        QosConfig { limits: dpuio_auth::qos::QosLimits::UNLIMITED, weight: 1, max_inflight: 1024 }
    }
}

/// The data plane: UCX and libfabric workers, with the transports they may use.
#[derive(Debug, Clone, PartialEq)]
pub struct DataPlaneConfig {
    /// Off: control plane only (no Memory service, attaches with a transport refused).
    pub enabled: bool,
    /// `"auto"` (UCX chooses: rc/dc on RDMA hardware, shared memory and TCP here),
    /// `"shm"`, `"tcp"`, or a UCX_TLS-style list such as `"posix,sysv,cma,tcp,self"`.
    /// For libfabric it picks the providers: shm for `"shm"`, tcp for `"tcp"`, both
    /// (and verbs where present) for `"auto"`, by the names in a list.
    pub transports: String,
    /// `["ucx"]`, `["ofi"]` or both. `None` (the default): UCX, plus libfabric where it
    /// opens (a warning otherwise); named explicitly, each must open.
    pub providers: Option<Vec<String>>,
    /// Threads that run backend I/O for requests whose host memory is mapped.
    pub io_threads: u32,
    /// The network interface the data plane's network transports use (UCX
    /// `NET_DEVICES`, the libfabric tcp domain); `None`: the providers choose (UCX
    /// uses every interface, libfabric tcp its first). Its form is checked here, that
    /// it exists when the agent starts (a config is often checked on another machine).
    pub interface: Option<String>,
    /// How long (microseconds) the engine keeps polling its rings after its last piece
    /// of work before it sleeps. While it polls, a host submitting its next request
    /// rings no doorbell and waits for no wake-up of the agent, which saves the host a
    /// system call per request; polling costs the agent a core meanwhile. On a DPU,
    /// whose cores serve nothing else, a millisecond or more is the better choice; on
    /// a machine shared with the jobs it serves, keep it short.
    pub idle_poll_us: u32,
}

impl Default for DataPlaneConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
        DataPlaneConfig {
            enabled: true,
            transports: "auto".into(),
            providers: None,
            io_threads: cores.clamp(1, 16),
            interface: None,
            idle_poll_us: 50,
        }
    }
}

/// The data-plane providers an agent may offer (`[data_plane] providers`).
pub const PROVIDERS: &[&str] = &[fabric::any::UCX, fabric::any::OFI];

/// One worker the agent opens, and whether failing to open it stops the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Lane {
    pub spec: fabric::any::Spec,
    pub required: bool,
}

impl DataPlaneConfig {
    /// The UCX configuration `transports` means.
    pub fn fabric(&self) -> fabric::FabricConfig {
        fabric::FabricConfig::preset(&self.transports).unwrap_or_else(|| {
            let mut c = fabric::FabricConfig::default();
            c.transports = Some(self.transports.clone());
            c
        })
    }

    /// The workers to open, UCX first, on [`DataPlaneConfig::interface`] if one is set.
    pub fn lanes(&self) -> Vec<Lane> {
        let mut lanes = self.lanes_on_any_interface();
        if let Some(name) = &self.interface {
            for lane in &mut lanes {
                lane.spec = lane.spec.clone().on_interface(name);
            }
        }
        lanes
    }

    fn lanes_on_any_interface(&self) -> Vec<Lane> {
        use fabric::ofi::{self, OfiConfig};
        let named = |p: &str| self.providers.as_ref().is_some_and(|list| list.iter().any(|n| n == p));
        let mut lanes = Vec::new();
        if self.providers.is_none() || named(fabric::any::UCX) {
            lanes.push(Lane { spec: fabric::any::Spec::Ucx(self.fabric()), required: true });
        }
        if self.providers.is_none() || named(fabric::any::OFI) {
            let list: Vec<&str> = self.transports.split(',').map(str::trim).collect();
            let has = |names: &[&str]| list.iter().any(|t| names.contains(t));
            let auto = self.transports == "auto";
            let mut wanted = Vec::new();
            if auto || has(&["shm", "sm", "posix", "sysv", "cma"]) {
                wanted.push((ofi::SHM_PROVIDER, true));
            }
            if auto || has(&["tcp"]) {
                wanted.push((ofi::TCP_PROVIDER, true));
            }
            if auto || has(&["rc", "rc_x", "rc_v", "dc", "dc_x", "ud", "ud_x", "ud_v", "ib"]) {
                // The RDMA path on real NICs: absent here, so never required by "auto".
                wanted.push((ofi::VERBS_PROVIDER, !auto));
            }
            for (provider, required) in wanted {
                lanes.push(Lane {
                    spec: fabric::any::Spec::Ofi(OfiConfig::provider(provider)),
                    required: required && self.providers.is_some(),
                });
            }
        }
        lanes
    }
}

/// Which backend stores the data.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendConfig {
    /// The embedded backend: containers as directory trees under `path`.
    Local { path: PathBuf },
    /// DAOS: each tenant's `container` is a DAOS container label in `pool`.
    Daos(DaosConfig),
}

/// `[backend] kind = "daos"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaosConfig {
    /// Pool label or UUID.
    pub pool: String,
    /// DAOS system name.
    pub system: String,
    /// Directory of `daos_agent.sock`; `None`: `DAOS_AGENT_DRPC_DIR`, else DAOS's default.
    pub agent_socket_dir: Option<PathBuf>,
    /// Create a tenant's missing container as a POSIX container on first use.
    pub create_containers: bool,
    /// Chunk size of new files, and where the data plane splits I/O.
    pub chunk_bytes: u64,
    /// Object class name of new files and directories; empty: the container's default.
    pub object_class: String,
}

/// The DAOS system name DAOS uses unless its servers are configured otherwise.
pub const DEFAULT_DAOS_SYSTEM: &str = "daos_server";
/// DFS's default chunk size.
pub const DEFAULT_DAOS_CHUNK_BYTES: u64 = 1 << 20;

const LOCAL_KEYS: &[&str] = &["path"];
const DAOS_KEYS: &[&str] = &["pool", "system", "agent_socket_dir", "create_containers", "chunk_bytes", "object_class"];

/// Limits on everything that grows.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub max_sessions: u32,
    pub max_handles_per_session: u32,
    pub max_regions_per_session: u32,
    pub max_io_bytes: u64,
    pub max_inflight_per_session: u32,
    pub max_readdir_batch: u32,
    pub max_lookup_paths: u32,
    pub max_message_bytes: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sessions: 1024,
            max_handles_per_session: 4096,
            max_regions_per_session: 256,
            max_io_bytes: 64 << 20,
            max_inflight_per_session: 256,
            max_readdir_batch: 4096,
            max_lookup_paths: 4096,
            max_message_bytes: 4 << 20,
        }
    }
}

/// One tenant: who may attach, and which container it sees.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantConfig {
    pub name: String,
    pub container: String,
    /// Inline encryption of this tenant's new files, if on.
    pub encryption: Option<EncryptionConfig>,
    /// Sessions of this tenant at once (`None`: only the agent-wide limit).
    pub max_sessions: Option<u32>,
    /// Open handles per session of this tenant (`None`: `[limits]`).
    pub max_handles_per_session: Option<u32>,
    /// Registered regions (and rings) per session of this tenant (`None`: `[limits]`).
    pub max_regions_per_session: Option<u32>,
    pub qos: QosConfig,
}

impl TenantConfig {
    /// A tenant with defaults for everything but its names.
    pub fn new(name: &str, container: &str) -> TenantConfig {
        TenantConfig {
            name: name.to_owned(),
            container: container.to_owned(),
            encryption: None,
            max_sessions: None,
            max_handles_per_session: None,
            max_regions_per_session: None,
            qos: QosConfig::default(),
        }
    }
}

/// `[tenants.encryption]`: the tenant's key-encryption keys and how files are sealed.
#[derive(Debug, Clone, PartialEq)]
pub struct EncryptionConfig {
    /// (key version, key file): a file holds 32 raw bytes or 64 hex digits, mode 0600.
    pub keys: Vec<(u32, PathBuf)>,
    /// The version that wraps new files' data keys (default: the highest).
    pub key_version: Option<u32>,
    /// Bytes per sealed block (default 64 KiB).
    pub block_bytes: Option<u32>,
    /// "aws-lc-rs" (default) or "rustcrypto".
    pub provider: Option<String>,
}

/// One mistake in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Dotted key path, e.g. `tenants[1].container`.
    pub key: String,
    pub reason: String,
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

/// Why a config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not TOML.
    #[error("{path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    /// The file is TOML but has mistakes; every one is listed.
    #[error("{path} has {} mistake(s):\n{}", issues.len(), issues.iter().map(|i| format!("  - {i}")).collect::<Vec<_>>().join("\n"))]
    Invalid { path: PathBuf, issues: Vec<ConfigIssue> },
}

impl Default for Config {
    /// What `dpu-agent serve` runs with no config: embedded backend under
    /// `./dpuio-data`, one default tenant and container, loopback listener.
    fn default() -> Self {
        Config {
            listen: DEFAULT_LISTEN.parse().expect("constant address parses"),
            health_listen: None,
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            lease_ms: 30_000,
            backend: BackendConfig::Local { path: PathBuf::from(DEFAULT_DATA_DIR) },
            limits: Limits::default(),
            tenants: vec![TenantConfig::new(DEFAULT_TENANT, DEFAULT_TENANT)],
            data_plane: DataPlaneConfig::default(),
            tls: TlsConfig::default(),
            admin: AdminConfig { socket: None },
            metrics: MetricsConfig::default(),
        }
    }
}

impl Config {
    /// Read and check a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Config::parse(&text).map_err(|e| match e {
            ParseError::Syntax(message) => ConfigError::Syntax { path: path.to_owned(), message },
            ParseError::Invalid(issues) => ConfigError::Invalid { path: path.to_owned(), issues },
        })
    }

    /// Check config text; relative paths stay relative (to the agent's working directory).
    pub fn parse(text: &str) -> Result<Config, ParseError> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| ParseError::Syntax(e.to_string()))?;
        let mut c = Checker::default();
        let config = c.config(&table);
        if c.issues.is_empty() { Ok(config) } else { Err(ParseError::Invalid(c.issues)) }
    }

    /// Whether the control plane may listen here without TLS: loopback only.
    pub fn listen_is_loopback(&self) -> bool {
        self.listen.ip().is_loopback()
    }

    /// The Admin service's Unix socket.
    pub fn admin_socket(&self) -> PathBuf {
        self.admin.socket.clone().unwrap_or_else(|| self.data_dir.join("admin.sock"))
    }

    /// The tenant a client gets when it names none: the only one, or `default`.
    pub fn default_tenant(&self) -> Option<&TenantConfig> {
        match self.tenants.as_slice() {
            [only] => Some(only),
            all => all.iter().find(|t| t.name == DEFAULT_TENANT),
        }
    }
}

/// Why config text was refused.
#[derive(Debug)]
pub enum ParseError {
    Syntax(String),
    Invalid(Vec<ConfigIssue>),
}

/// Collects issues while building a [`Config`] from defaults and the table.
#[derive(Default)]
struct Checker {
    issues: Vec<ConfigIssue>,
}

impl Checker {
    fn issue(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.issues.push(ConfigIssue { key: key.into(), reason: reason.into() });
    }

    fn unknown_keys(&mut self, prefix: &str, table: &toml::Table, known: &[&str]) {
        for key in table.keys() {
            if !known.contains(&key.as_str()) {
                self.issue(join(prefix, key), format!("unknown key; expected one of: {}", known.join(", ")));
            }
        }
    }

    fn section<'t>(&mut self, table: &'t toml::Table, name: &str) -> Option<&'t toml::Table> {
        match table.get(name) {
            None => None,
            Some(toml::Value::Table(t)) => Some(t),
            Some(other) => {
                self.issue(name, format!("expected a table ([{name}]), found {}", other.type_str()));
                None
            }
        }
    }

    fn string(&mut self, t: &toml::Table, prefix: &str, key: &str) -> Option<String> {
        match t.get(key)? {
            toml::Value::String(s) => Some(s.clone()),
            other => {
                self.issue(join(prefix, key), format!("expected a string, found {}", other.type_str()));
                None
            }
        }
    }

    fn integer(&mut self, t: &toml::Table, prefix: &str, key: &str, min: i64, max: i64) -> Option<i64> {
        match t.get(key)? {
            toml::Value::Integer(n) if (min..=max).contains(n) => Some(*n),
            toml::Value::Integer(n) => {
                self.issue(join(prefix, key), format!("{n} is out of range; expected {min} to {max}"));
                None
            }
            other => {
                self.issue(join(prefix, key), format!("expected an integer, found {}", other.type_str()));
                None
            }
        }
    }

    fn config(&mut self, root: &toml::Table) -> Config {
        let mut config = Config::default();
        self.unknown_keys(
            "",
            root,
            &["agent", "backend", "limits", "tenants", "data_plane", "tls", "admin", "metrics"],
        );

        let mut backend_path = None;
        if let Some(agent) = self.section(root, "agent") {
            self.unknown_keys("agent", agent, &["listen", "health_listen", "data_dir", "lease_ms"]);
            if let Some(listen) = self.string(agent, "agent", "listen") {
                match listen.parse::<SocketAddr>() {
                    Ok(addr) => config.listen = addr,
                    Err(_) => self.issue(
                        "agent.listen",
                        format!("{listen:?} is not an IP:port address such as \"127.0.0.1:7300\""),
                    ),
                }
            }
            if let Some(listen) = self.string(agent, "agent", "health_listen") {
                match listen.parse::<SocketAddr>() {
                    Ok(addr) if addr == config.listen && addr.port() != 0 => {
                        self.issue("agent.health_listen", format!("{addr} is agent.listen already; use another port"))
                    }
                    Ok(addr) => config.health_listen = Some(addr),
                    Err(_) => self.issue(
                        "agent.health_listen",
                        format!("{listen:?} is not an IP:port address such as \"0.0.0.0:7301\""),
                    ),
                }
            }
            if let Some(dir) = self.string(agent, "agent", "data_dir") {
                if dir.is_empty() {
                    self.issue("agent.data_dir", "must not be empty");
                } else {
                    config.data_dir = PathBuf::from(dir);
                }
            }
            if let Some(ms) = self.integer(agent, "agent", "lease_ms", 1_000, 3_600_000) {
                config.lease_ms = ms as u64;
            }
        }

        let mut daos = None;
        if let Some(backend) = self.section(root, "backend") {
            let mut known = vec!["kind"];
            known.extend(LOCAL_KEYS);
            known.extend(DAOS_KEYS);
            self.unknown_keys("backend", backend, &known);
            let kind = self.string(backend, "backend", "kind");
            // Keys of the other kind are mistakes too: a `pool` under kind = "local" means
            // the operator believes they are on DAOS.
            let (theirs, other_kind) = match kind.as_deref() {
                None | Some("local") => (DAOS_KEYS, "daos"),
                Some("daos") => (LOCAL_KEYS, "local"),
                Some(other) => {
                    self.issue("backend.kind", format!("unknown backend {other:?}; expected \"local\" or \"daos\""));
                    (&[][..], "")
                }
            };
            for key in theirs {
                if backend.contains_key(*key) {
                    self.issue(
                        join("backend", key),
                        format!("applies to kind = \"{other_kind}\" only; remove it or set kind = \"{other_kind}\""),
                    );
                }
            }
            if kind.as_deref() == Some("daos") {
                daos = self.daos(backend);
            } else if let Some(path) = self.string(backend, "backend", "path") {
                if path.is_empty() {
                    self.issue("backend.path", "must not be empty");
                } else {
                    backend_path = Some(PathBuf::from(path));
                }
            }
        }
        config.backend = match daos {
            Some(daos) => BackendConfig::Daos(daos),
            None => BackendConfig::Local { path: backend_path.unwrap_or_else(|| config.data_dir.clone()) },
        };

        if let Some(dp) = self.section(root, "data_plane") {
            self.unknown_keys(
                "data_plane",
                dp,
                &["enabled", "transports", "providers", "io_threads", "interface", "idle_poll_us"],
            );
            match dp.get("providers") {
                None => {}
                Some(toml::Value::Array(items)) => {
                    let names: Vec<String> = items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect();
                    let unknown: Vec<&String> = names.iter().filter(|n| !PROVIDERS.contains(&n.as_str())).collect();
                    if names.len() != items.len() || names.is_empty() || !unknown.is_empty() {
                        self.issue(
                            "data_plane.providers",
                            format!(
                                "expected a non-empty list of {:?}, found {}",
                                PROVIDERS,
                                toml::Value::Array(items.clone())
                            ),
                        );
                    } else {
                        config.data_plane.providers = Some(names);
                    }
                }
                Some(other) => self.issue(
                    "data_plane.providers",
                    format!("expected a list such as [\"ucx\", \"ofi\"], found {}", other.type_str()),
                ),
            }
            if let Some(n) = self.integer(dp, "data_plane", "io_threads", 1, 256) {
                config.data_plane.io_threads = n as u32;
            }
            if let Some(us) = self.integer(dp, "data_plane", "idle_poll_us", 0, 1_000_000) {
                config.data_plane.idle_poll_us = us as u32;
            }
            if let Some(name) = self.string(dp, "data_plane", "interface") {
                match fabric::config::check_interface_name(&name) {
                    Ok(()) => config.data_plane.interface = Some(name),
                    Err(reason) => self.issue(
                        "data_plane.interface",
                        format!("{reason}; name a network interface as `ip link` lists it"),
                    ),
                }
            }
            match dp.get("enabled") {
                None => {}
                Some(toml::Value::Boolean(b)) => config.data_plane.enabled = *b,
                Some(other) => {
                    self.issue("data_plane.enabled", format!("expected true or false, found {}", other.type_str()))
                }
            }
            if let Some(t) = self.string(dp, "data_plane", "transports") {
                let known = [
                    "posix", "sysv", "cma", "knem", "xpmem", "tcp", "self", "rc", "rc_x", "rc_v", "dc", "dc_x", "ud",
                    "ud_x", "ud_v", "sm", "shm", "ib", "all", "cuda", "rocm",
                ];
                let preset = fabric::FabricConfig::PRESETS.contains(&t.as_str());
                let unknown: Vec<&str> =
                    t.split(',').map(str::trim).filter(|n| !known.contains(&n.trim_start_matches('^'))).collect();
                if t.is_empty() || (!preset && !unknown.is_empty()) {
                    self.issue(
                        "data_plane.transports",
                        format!("{t:?}: expected \"auto\", \"shm\", \"tcp\" or a UCX_TLS list such as \"posix,sysv,cma,tcp,self\"; unknown: {}", unknown.join(", ")),
                    );
                } else {
                    config.data_plane.transports = t;
                }
            }
        }

        if let Some(limits) = self.section(root, "limits") {
            self.limits(limits, &mut config.limits);
        }

        if let Some(tls) = self.section(root, "tls") {
            self.tls(tls, &mut config.tls);
        }
        if !config.tls.mtls && !config.listen.ip().is_loopback() {
            self.issue(
                "tls.mode",
                format!(
                    "\"off\" serves plaintext, which is allowed on a loopback listener only, and agent.listen is {}: \
                     use mode = \"mtls\" or listen on 127.0.0.1",
                    config.listen
                ),
            );
        }
        if let Some(admin) = self.section(root, "admin") {
            self.unknown_keys("admin", admin, &["socket"]);
            if let Some(socket) = self.string(admin, "admin", "socket") {
                if socket.is_empty() {
                    self.issue("admin.socket", "must not be empty");
                } else {
                    config.admin.socket = Some(PathBuf::from(socket));
                }
            }
        }
        if let Some(metrics) = self.section(root, "metrics") {
            self.unknown_keys("metrics", metrics, &["listen"]);
            if let Some(listen) = self.string(metrics, "metrics", "listen") {
                let taken = [Some(config.listen), config.health_listen];
                match listen.parse::<SocketAddr>() {
                    Ok(addr) if addr.port() != 0 && taken.contains(&Some(addr)) => self.issue(
                        "metrics.listen",
                        format!("{addr} is agent.listen or agent.health_listen already; use another port"),
                    ),
                    Ok(addr) => config.metrics.listen = Some(addr),
                    Err(_) => self.issue(
                        "metrics.listen",
                        format!("{listen:?} is not an IP:port address such as \"127.0.0.1:9464\""),
                    ),
                }
            }
        }

        match root.get("tenants") {
            None => {}
            Some(toml::Value::Array(items)) => config.tenants = self.tenants(items),
            Some(other) => {
                self.issue("tenants", format!("expected an array of tables ([[tenants]]), found {}", other.type_str()))
            }
        }
        config
    }

    /// The keys of `[backend] kind = "daos"`; `None` (with issues) if one is wrong.
    fn daos(&mut self, t: &toml::Table) -> Option<DaosConfig> {
        let issues = self.issues.len();
        let pool = self.string(t, "backend", "pool");
        match pool.as_deref() {
            None if !t.contains_key("pool") => self.issue(
                "backend.pool",
                "missing; kind = \"daos\" needs the label or UUID of the pool (dmg pool list shows them)",
            ),
            Some(p) => {
                if let Err(reason) = check_daos_label(p) {
                    self.issue("backend.pool", format!("{p:?} {reason}"));
                }
            }
            None => {}
        }
        let system = self.string(t, "backend", "system").unwrap_or_else(|| DEFAULT_DAOS_SYSTEM.to_owned());
        if system.is_empty() || system.len() > 63 || !system.bytes().all(|b| b.is_ascii_graphic()) {
            self.issue(
                "backend.system",
                format!("{system:?} is not a DAOS system name (1 to 63 printable characters; default \"daos_server\")"),
            );
        }
        let agent_socket_dir = match self.string(t, "backend", "agent_socket_dir") {
            Some(d) if d.is_empty() => {
                self.issue("backend.agent_socket_dir", "must not be empty (leave it out for the default)");
                None
            }
            Some(d) if !Path::new(&d).is_absolute() => {
                self.issue("backend.agent_socket_dir", format!("{d:?} must be an absolute path"));
                None
            }
            Some(d) => Some(PathBuf::from(d)),
            None => None,
        };
        let create_containers = match t.get("create_containers") {
            None => false,
            Some(toml::Value::Boolean(b)) => *b,
            Some(other) => {
                self.issue("backend.create_containers", format!("expected true or false, found {}", other.type_str()));
                false
            }
        };
        let chunk_bytes =
            self.integer(t, "backend", "chunk_bytes", 4096, 1 << 30).map_or(DEFAULT_DAOS_CHUNK_BYTES, |n| n as u64);
        if !chunk_bytes.is_multiple_of(4096) {
            self.issue("backend.chunk_bytes", format!("{chunk_bytes} is not a multiple of 4096"));
        }
        let object_class = self.string(t, "backend", "object_class").unwrap_or_default();
        if object_class.len() > 32
            || !object_class.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        {
            self.issue(
                "backend.object_class",
                format!(
                    "{object_class:?} is not a DAOS object class name such as \"SX\", \"S1\" or \"RP_2G1\" \
                     (upper-case letters, digits and '_'); leave it out for the container's default"
                ),
            );
        }
        (self.issues.len() == issues).then(|| DaosConfig {
            pool: pool.unwrap_or_default(),
            system,
            agent_socket_dir,
            create_containers,
            chunk_bytes,
            object_class,
        })
    }

    fn limits(&mut self, t: &toml::Table, limits: &mut Limits) {
        const U32: i64 = u32::MAX as i64;
        let fields: [(&str, &mut u32, i64, i64); 7] = [
            ("max_sessions", &mut limits.max_sessions, 1, 1 << 20),
            ("max_handles_per_session", &mut limits.max_handles_per_session, 1, 1 << 20),
            ("max_regions_per_session", &mut limits.max_regions_per_session, 1, 1 << 16),
            ("max_inflight_per_session", &mut limits.max_inflight_per_session, 1, 1 << 16),
            ("max_readdir_batch", &mut limits.max_readdir_batch, 1, 1 << 16),
            ("max_lookup_paths", &mut limits.max_lookup_paths, 1, 1 << 16),
            ("max_message_bytes", &mut limits.max_message_bytes, 4096, U32),
        ];
        let mut known: Vec<&str> = fields.iter().map(|f| f.0).collect();
        known.push("max_io_bytes");
        self.unknown_keys("limits", t, &known);
        for (key, slot, min, max) in fields {
            if let Some(n) = self.integer(t, "limits", key, min, max) {
                *slot = n as u32;
            }
        }
        if let Some(n) = self.integer(t, "limits", "max_io_bytes", 4096, 1 << 32) {
            limits.max_io_bytes = n as u64;
        }
    }

    fn tenants(&mut self, items: &[toml::Value]) -> Vec<TenantConfig> {
        let mut tenants = Vec::new();
        let mut names = HashSet::new();
        let mut containers = HashSet::new();
        if items.is_empty() {
            self.issue("tenants", "at least one tenant is needed");
        }
        for (i, item) in items.iter().enumerate() {
            let prefix = format!("tenants[{i}]");
            let toml::Value::Table(t) = item else {
                self.issue(&prefix, format!("expected a table, found {}", item.type_str()));
                continue;
            };
            self.unknown_keys(
                &prefix,
                t,
                &[
                    "name",
                    "container",
                    "encryption",
                    "max_sessions",
                    "max_handles_per_session",
                    "max_regions_per_session",
                    "qos",
                ],
            );
            let max_sessions = self.integer(t, &prefix, "max_sessions", 1, 1 << 20).map(|n| n as u32);
            let max_handles_per_session =
                self.integer(t, &prefix, "max_handles_per_session", 1, 1 << 20).map(|n| n as u32);
            let max_regions_per_session =
                self.integer(t, &prefix, "max_regions_per_session", 1, 1 << 16).map(|n| n as u32);
            let qos = match t.get("qos") {
                None => QosConfig::default(),
                Some(toml::Value::Table(q)) => self.qos(&format!("{prefix}.qos"), q),
                Some(other) => {
                    self.issue(format!("{prefix}.qos"), format!("expected a table, found {}", other.type_str()));
                    QosConfig::default()
                }
            };
            let encryption = match t.get("encryption") {
                None => None,
                Some(toml::Value::Table(e)) => self.encryption(&format!("{prefix}.encryption"), e),
                Some(other) => {
                    self.issue(format!("{prefix}.encryption"), format!("expected a table, found {}", other.type_str()));
                    None
                }
            };
            let name = self.string(t, &prefix, "name");
            let container = self.string(t, &prefix, "container");
            let (Some(name), Some(container)) = (name, container) else {
                for key in ["name", "container"] {
                    if !t.contains_key(key) {
                        self.issue(join(&prefix, key), "missing; every tenant needs a name and a container");
                    }
                }
                continue;
            };
            let mut ok = true;
            for (key, value) in [("name", &name), ("container", &container)] {
                if let Err(reason) = check_identifier(value) {
                    self.issue(join(&prefix, key), format!("{value:?} {reason}"));
                    ok = false;
                }
            }
            if !names.insert(name.clone()) {
                self.issue(join(&prefix, "name"), format!("tenant {name:?} is defined twice"));
                ok = false;
            }
            if !containers.insert(container.clone()) {
                self.issue(
                    join(&prefix, "container"),
                    format!(
                        "container {container:?} already belongs to another tenant; tenants never share a container"
                    ),
                );
                ok = false;
            }
            if ok {
                tenants.push(TenantConfig {
                    name,
                    container,
                    encryption,
                    max_sessions,
                    max_handles_per_session,
                    max_regions_per_session,
                    qos,
                });
            }
        }
        tenants
    }
}

impl Checker {
    fn tls(&mut self, t: &toml::Table, tls: &mut TlsConfig) {
        self.unknown_keys("tls", t, &["mode", "trust_domain", "cert", "key", "client_ca", "client_bundle_dir"]);
        match self.string(t, "tls", "mode").as_deref() {
            None | Some("mtls") => {}
            Some("off") => tls.mtls = false,
            Some(other) => self.issue("tls.mode", format!("{other:?}: expected \"mtls\" or \"off\"")),
        }
        if let Some(domain) = self.string(t, "tls", "trust_domain") {
            match dpuio_auth::pki::validate_trust_domain(&domain) {
                Ok(()) => tls.trust_domain = domain,
                Err(e) => self.issue("tls.trust_domain", e.to_string()),
            }
        }
        let files: Vec<Option<String>> =
            ["cert", "key", "client_ca"].iter().map(|k| self.string(t, "tls", k).filter(|v| !v.is_empty())).collect();
        match files.as_slice() {
            [Some(cert), Some(key), Some(ca)] => {
                tls.files = Some(TlsFiles { cert: cert.into(), key: key.into(), client_ca: ca.into() })
            }
            [None, None, None] => {}
            _ => self.issue(
                "tls",
                "cert, key and client_ca go together: name all three (production) or none (a development CA under data_dir/pki)",
            ),
        }
        if let Some(dir) = self.string(t, "tls", "client_bundle_dir").filter(|d| !d.is_empty()) {
            tls.client_bundle_dir = Some(PathBuf::from(dir));
        }
    }

    fn qos(&mut self, prefix: &str, t: &toml::Table) -> QosConfig {
        self.unknown_keys(
            prefix,
            t,
            &["bytes_per_s", "ops_per_s", "burst_bytes", "burst_ops", "weight", "max_inflight"],
        );
        let mut q = QosConfig::default();
        let max = i64::MAX;
        let get = |c: &mut Checker, key: &str| c.integer(t, prefix, key, 0, max).map(|n| n as u64);
        q.limits.bytes_per_s = get(self, "bytes_per_s").unwrap_or(0);
        q.limits.ops_per_s = get(self, "ops_per_s").unwrap_or(0);
        q.limits.bytes_burst = get(self, "burst_bytes").unwrap_or(0);
        q.limits.ops_burst = get(self, "burst_ops").unwrap_or(0);
        if let Some(w) = self.integer(t, prefix, "weight", 1, dpuio_auth::qos::MAX_WEIGHT.into()) {
            q.weight = w as u32;
        }
        if let Some(n) = self.integer(t, prefix, "max_inflight", 1, 1 << 20) {
            q.max_inflight = n as u32;
        }
        q
    }

    fn encryption(&mut self, prefix: &str, t: &toml::Table) -> Option<EncryptionConfig> {
        self.unknown_keys(prefix, t, &["key_file", "keys", "key_version", "block_bytes", "provider"]);
        let mut keys = Vec::new();
        if let Some(file) = self.string(t, prefix, "key_file") {
            keys.push((1, PathBuf::from(file)));
        }
        match t.get("keys") {
            None => {}
            Some(toml::Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let at = format!("{prefix}.keys[{i}]");
                    let toml::Value::Table(k) = item else {
                        self.issue(&at, "expected { version = N, file = \"PATH\" }");
                        continue;
                    };
                    self.unknown_keys(&at, k, &["version", "file"]);
                    let version = self.integer(k, &at, "version", 1, u32::MAX as i64);
                    let file = self.string(k, &at, "file");
                    match (version, file) {
                        (Some(v), Some(f)) => keys.push((v as u32, PathBuf::from(f))),
                        _ => self.issue(&at, "every key needs a version and a file"),
                    }
                }
            }
            Some(other) => {
                self.issue(format!("{prefix}.keys"), format!("expected an array, found {}", other.type_str()))
            }
        }
        if keys.is_empty() {
            self.issue(
                prefix,
                "name the key-encryption key: key_file = \"PATH\" or keys = [{ version = 1, file = \"PATH\" }]",
            );
            return None;
        }
        let mut versions: Vec<u32> = keys.iter().map(|k| k.0).collect();
        versions.sort_unstable();
        if versions.windows(2).any(|w| w[0] == w[1]) {
            self.issue(format!("{prefix}.keys"), "a key version appears twice");
        }
        let key_version = self.integer(t, prefix, "key_version", 1, u32::MAX as i64).map(|v| v as u32);
        if let Some(v) = key_version
            && !versions.contains(&v)
        {
            self.issue(format!("{prefix}.key_version"), format!("version {v} has no key; known: {versions:?}"));
        }
        let block_bytes = self.integer(t, prefix, "block_bytes", 4096, 16 << 20).map(|b| b as u32);
        if let Some(b) = block_bytes
            && !b.is_power_of_two()
        {
            self.issue(format!("{prefix}.block_bytes"), format!("{b} is not a power of two (4 KiB to 16 MiB)"));
        }
        let provider = self.string(t, prefix, "provider");
        if let Some(p) = &provider
            && !["aws-lc-rs", "rustcrypto"].contains(&p.as_str())
        {
            self.issue(format!("{prefix}.provider"), format!("{p:?}: expected \"aws-lc-rs\" or \"rustcrypto\""));
        }
        Some(EncryptionConfig { keys, key_version, block_bytes, provider })
    }
}

/// Names of tenants and containers: what a file name, a SPIFFE path segment and a
/// DAOS label all accept.
pub fn check_identifier(value: &str) -> Result<(), &'static str> {
    if value.is_empty() || value.len() > 63 {
        return Err("must be 1 to 63 characters long");
    }
    if value.starts_with(['.', '-']) {
        return Err("must not start with '.' or '-'");
    }
    if !value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
        return Err("may only contain ASCII letters, digits, '-', '_' and '.'");
    }
    Ok(())
}

/// A DAOS pool or container label (`DAOS_PROP_LABEL_MAX_LEN` 127; letters, digits,
/// `_ . : -`), or a UUID.
pub fn check_daos_label(value: &str) -> Result<(), &'static str> {
    if value.is_empty() || value.len() > 127 {
        return Err("must be 1 to 127 characters long (a DAOS label or UUID)");
    }
    if !value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-')) {
        return Err("may only contain ASCII letters, digits, '_', '.', ':' and '-' (a DAOS label or UUID)");
    }
    Ok(())
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() { key.to_owned() } else { format!("{prefix}.{key}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issues(text: &str) -> Vec<ConfigIssue> {
        match Config::parse(text) {
            Err(ParseError::Invalid(issues)) => issues,
            other => panic!("expected issues, got {other:?}"),
        }
    }

    #[test]
    fn empty_config_is_the_default() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
    }

    #[test]
    fn full_config_parses() {
        let config = Config::parse(
            r#"
            [agent]
            listen = "127.0.0.1:0"
            data_dir = "/srv/dpuio"
            lease_ms = 5000
            [backend]
            kind = "local"
            [data_plane]
            idle_poll_us = 2000
            [limits]
            max_sessions = 8
            max_io_bytes = 1048576
            [[tenants]]
            name = "vision"
            container = "imagenet"
            [[tenants]]
            name = "nlp"
            container = "c4"
            "#,
        )
        .unwrap();
        assert_eq!(config.listen.port(), 0);
        assert_eq!(config.backend, BackendConfig::Local { path: "/srv/dpuio".into() });
        assert_eq!(config.limits.max_sessions, 8);
        assert_eq!(config.limits.max_io_bytes, 1 << 20);
        assert_eq!(config.tenants.len(), 2);
        assert_eq!(config.lease_ms, 5000);
        assert_eq!(config.data_plane.idle_poll_us, 2000);
    }

    #[test]
    fn data_plane_providers_pick_the_workers() {
        use fabric::any::Spec;
        let names = |c: &Config| {
            c.data_plane
                .lanes()
                .iter()
                .map(|l| format!("{}|{}|{}", l.spec.provider(), l.spec.fabric_provider(), l.required))
                .collect::<Vec<_>>()
        };
        // The default: UCX, plus libfabric where it opens (never fatal).
        let config = Config::parse("").unwrap();
        assert_eq!(names(&config), ["ucx||true", "ofi|shm|false", "ofi|tcp;ofi_rxm|false", "ofi|verbs;ofi_rxm|false"]);
        // Named: each must open, and the transports pick libfabric's providers.
        let config = Config::parse("[data_plane]\nproviders = [\"ofi\"]\ntransports = \"tcp\"\n").unwrap();
        assert_eq!(names(&config), ["ofi|tcp;ofi_rxm|true"]);
        let config = Config::parse("[data_plane]\nproviders = [\"ucx\", \"ofi\"]\ntransports = \"shm\"\n").unwrap();
        assert_eq!(names(&config), ["ucx||true", "ofi|shm|true"]);
        assert_eq!(config.data_plane.lanes()[0].spec, Spec::Ucx(fabric::FabricConfig::shm()));
        for bad in ["providers = [\"verbs\"]", "providers = []", "providers = \"ucx\"", "providers = [1]"] {
            let found = issues(&format!("[data_plane]\n{bad}\n"));
            assert_eq!(found[0].key, "data_plane.providers", "{bad}");
            assert!(found[0].reason.contains("ucx"), "{bad}: {found:?}");
        }
    }

    #[test]
    fn data_plane_interface_puts_the_network_lanes_on_it() {
        use fabric::any::Spec;
        let config = Config::parse("[data_plane]\ninterface = \"veth-dpu\"\n").unwrap();
        assert_eq!(config.data_plane.interface.as_deref(), Some("veth-dpu"));
        let lanes = config.data_plane.lanes();
        let Spec::Ucx(ucx) = &lanes[0].spec else { panic!("UCX first: {lanes:?}") };
        assert_eq!(ucx.ucx_options, [("NET_DEVICES".to_owned(), "veth-dpu".to_owned())]);
        let domains: Vec<_> = lanes[1..]
            .iter()
            .map(|l| match &l.spec {
                Spec::Ofi(c) => (c.provider.as_str(), c.domain.as_deref()),
                Spec::Ucx(_) => panic!("one UCX lane"),
            })
            .collect();
        assert_eq!(
            domains,
            [("shm", None), ("tcp;ofi_rxm", Some("veth-dpu")), ("verbs;ofi_rxm", None)],
            "only libfabric tcp's domains are interfaces"
        );
        assert_eq!(Config::parse("").unwrap().data_plane.interface, None);
        for (bad, says) in [
            ("interface = \"\"", "1 to 15 bytes"),
            ("interface = \"a-very-long-interface\"", "1 to 15 bytes"),
            ("interface = \"eth0:1\"", "not an interface name"),
            ("interface = 3", "expected a string"),
        ] {
            let found = issues(&format!("[data_plane]\n{bad}\n"));
            assert_eq!(found[0].key, "data_plane.interface", "{bad}");
            assert!(found[0].reason.contains(says), "{bad}: {found:?}");
        }
    }

    #[test]
    fn health_listen_is_checked() {
        let config = Config::parse("[agent]\nlisten = \"0.0.0.0:7300\"\nhealth_listen = \"0.0.0.0:7301\"\n").unwrap();
        assert_eq!(config.health_listen, Some("0.0.0.0:7301".parse().unwrap()));
        assert_eq!(Config::parse("").unwrap().health_listen, None);
        let found = issues("[agent]\nlisten = \"0.0.0.0:7300\"\nhealth_listen = \"0.0.0.0:7300\"\n");
        assert_eq!(found[0].key, "agent.health_listen");
        assert!(found[0].reason.contains("agent.listen already"), "{found:?}");
        let found = issues("[agent]\nhealth_listen = \"7301\"\n");
        assert!(found[0].reason.contains("not an IP:port"), "{found:?}");
    }

    #[test]
    fn metrics_listen_is_checked() {
        assert_eq!(Config::parse("").unwrap().metrics.listen, None, "off unless configured");
        let config = Config::parse("[metrics]\nlisten = \"127.0.0.1:9464\"\n").unwrap();
        assert_eq!(config.metrics.listen, Some("127.0.0.1:9464".parse().unwrap()));
        let any_port = Config::parse("[agent]\nlisten = \"127.0.0.1:0\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n");
        assert_eq!(any_port.unwrap().metrics.listen, Some("127.0.0.1:0".parse().unwrap()));
        for (bad, says) in [
            ("listen = \"9464\"", "not an IP:port address"),
            ("listen = \"localhost:9464\"", "not an IP:port address"),
            ("listen = 9464", "expected a string"),
            ("listen = \"127.0.0.1:7300\"", "agent.listen or agent.health_listen already"),
            ("port = 9464", "unknown key"),
        ] {
            let found = issues(&format!("[agent]\nlisten = \"127.0.0.1:7300\"\n[metrics]\n{bad}\n"));
            assert_eq!(found.len(), 1, "{bad}: {found:?}");
            assert!(found[0].key.starts_with("metrics."), "{bad}: {found:?}");
            assert!(found[0].reason.contains(says), "{bad}: {found:?}");
        }
        let found = issues("metrics = 1\n");
        assert!(found[0].key == "metrics" && found[0].reason.contains("expected a table"), "{found:?}");
    }

    #[test]
    fn daos_backend_parses_with_defaults_and_every_key() {
        let config = Config::parse("[backend]\nkind = \"daos\"\npool = \"tank\"\n").unwrap();
        assert_eq!(
            config.backend,
            BackendConfig::Daos(DaosConfig {
                pool: "tank".into(),
                system: "daos_server".into(),
                agent_socket_dir: None,
                create_containers: false,
                chunk_bytes: 1 << 20,
                object_class: String::new(),
            })
        );
        let config = Config::parse(
            r#"
            [backend]
            kind = "daos"
            pool = "6f1e8c3a-62a0-4c5c-9f2b-0d3c1a2b4c5d"
            system = "prod"
            agent_socket_dir = "/run/daos_agent"
            create_containers = true
            chunk_bytes = 8388608
            object_class = "RP_2G1"
            "#,
        )
        .unwrap();
        let BackendConfig::Daos(d) = config.backend else { panic!("not daos") };
        assert_eq!((d.system.as_str(), d.chunk_bytes, d.object_class.as_str()), ("prod", 8 << 20, "RP_2G1"));
        assert_eq!((d.agent_socket_dir, d.create_containers), (Some("/run/daos_agent".into()), true));
    }

    #[test]
    fn daos_backend_mistakes_are_all_named() {
        let found = issues(
            r#"
            [backend]
            kind = "daos"
            path = "/srv"
            system = ""
            agent_socket_dir = "relative/dir"
            create_containers = "yes"
            chunk_bytes = 1000
            object_class = "rp 2"
            "#,
        );
        let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "backend.path",
                "backend.pool",
                "backend.system",
                "backend.agent_socket_dir",
                "backend.create_containers",
                "backend.chunk_bytes",
                "backend.object_class"
            ],
            "{found:?}"
        );
        assert!(found[0].reason.contains("kind = \"local\" only"), "{found:?}");
        assert!(found[1].reason.contains("label or UUID of the pool"), "{found:?}");
        let found = issues("[backend]\npool = \"tank\"\n");
        assert_eq!(found[0].key, "backend.pool");
        assert!(found[0].reason.contains("kind = \"daos\" only"), "{found:?}");
        let found = issues("[backend]\nkind = \"daos\"\npool = \"bad/label\"\n");
        assert!(found[0].reason.contains("DAOS label"), "{found:?}");
    }

    #[test]
    fn three_mistakes_are_all_named() {
        let found = issues(
            r#"
            [agent]
            listen = "localhost"
            lease_ms = "soon"
            [backend]
            kind = "nfs"
            "#,
        );
        let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(keys, ["agent.listen", "agent.lease_ms", "backend.kind"], "{found:?}");
        assert!(found[0].reason.contains("IP:port"));
        assert!(found[1].reason.contains("expected an integer"));
        assert!(found[2].reason.contains("unknown backend \"nfs\"; expected \"local\" or \"daos\""));
    }

    #[test]
    fn tenant_mistakes() {
        let found = issues(
            r#"
            colour = "blue"
            [[tenants]]
            name = "a"
            container = "shared"
            [[tenants]]
            name = "a"
            container = "shared"
            [[tenants]]
            name = "../etc"
            [[tenants]]
            name = "b"
            container = "x"
            quota = 3
            "#,
        );
        let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys,
            ["colour", "tenants[1].name", "tenants[1].container", "tenants[2].container", "tenants[3].quota"],
            "{found:?}"
        );
    }

    #[test]
    fn out_of_range_and_plaintext_beyond_loopback() {
        let found = issues(
            r#"
            [agent]
            listen = "0.0.0.0:7300"
            [limits]
            max_sessions = 0
            max_io_bytes = -1
            [data_plane]
            idle_poll_us = 2000000
            [tls]
            mode = "off"
            "#,
        );
        let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys,
            ["data_plane.idle_poll_us", "limits.max_sessions", "limits.max_io_bytes", "tls.mode"],
            "{found:?}"
        );
        assert!(found[0].reason.contains("out of range"));
        assert!(found[3].reason.contains("loopback"), "{found:?}");
        // With mTLS (the default) any address is fine.
        assert!(Config::parse("[agent]\nlisten = \"0.0.0.0:7300\"\n").is_ok());
    }

    #[test]
    fn tls_admin_and_qos_sections() {
        let config = Config::parse(
            r#"
            [tls]
            trust_domain = "cluster.example"
            cert = "/etc/dpuio/server.pem"
            key = "/etc/dpuio/server.key"
            client_ca = "/etc/dpuio/clients-ca.pem"
            [admin]
            socket = "/run/dpuio/admin.sock"
            [[tenants]]
            name = "a"
            container = "a"
            max_sessions = 4
            max_handles_per_session = 8
            max_regions_per_session = 2
            [tenants.qos]
            bytes_per_s = 1000000
            burst_bytes = 2000000
            ops_per_s = 500
            weight = 3
            max_inflight = 16
            "#,
        )
        .unwrap();
        assert!(config.tls.mtls);
        assert_eq!(config.tls.trust_domain, "cluster.example");
        assert_eq!(config.tls.files.as_ref().unwrap().client_ca, PathBuf::from("/etc/dpuio/clients-ca.pem"));
        assert_eq!(config.admin_socket(), PathBuf::from("/run/dpuio/admin.sock"));
        let t = &config.tenants[0];
        assert_eq!(t.max_sessions, Some(4));
        assert_eq!((t.max_handles_per_session, t.max_regions_per_session), (Some(8), Some(2)));
        assert_eq!(
            (t.qos.limits.bytes_per_s, t.qos.limits.bytes_burst, t.qos.limits.ops_per_s),
            (1000000, 2000000, 500)
        );
        assert_eq!((t.qos.weight, t.qos.max_inflight), (3, 16));

        let found = issues(
            "[tls]\nmode = \"maybe\"\ncert = \"/x\"\ntrust_domain = \"UPPER\"\n[[tenants]]\nname = \"a\"\ncontainer = \"a\"\n[tenants.qos]\nweight = 0\nrate = 1\n",
        );
        let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys,
            ["tls.mode", "tls.trust_domain", "tls", "tenants[0].qos.rate", "tenants[0].qos.weight"],
            "{found:?}"
        );
    }

    #[test]
    fn encryption_config() {
        let config = Config::parse(
            "[[tenants]]\nname = \"a\"\ncontainer = \"c\"\n[tenants.encryption]\nkeys = [{ version = 1, file = \"/k1\" }, { version = 2, file = \"/k2\" }]\nblock_bytes = 4096\n",
        )
        .unwrap();
        let e = config.tenants[0].encryption.as_ref().unwrap();
        assert_eq!(e.keys.len(), 2);
        assert_eq!(e.block_bytes, Some(4096));
        let found = issues(
            "[[tenants]]\nname = \"a\"\ncontainer = \"c\"\n[tenants.encryption]\nkey_file = \"/k\"\nkey_version = 3\nblock_bytes = 5000\nprovider = \"rot13\"\n",
        );
        let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "tenants[0].encryption.key_version",
                "tenants[0].encryption.block_bytes",
                "tenants[0].encryption.provider"
            ]
        );
    }

    #[test]
    fn syntax_error_is_reported() {
        assert!(matches!(Config::parse("[agent"), Err(ParseError::Syntax(_))));
    }

    #[test]
    fn identifiers() {
        assert!(check_identifier("team-a_1.x").is_ok());
        for bad in ["", ".hidden", "-x", "a/b", "a b", &"x".repeat(64)] {
            assert!(check_identifier(bad).is_err(), "{bad:?}");
        }
    }
}
