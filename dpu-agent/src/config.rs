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
//! # retry_seconds = 120                 # how long a DAOS call failing transiently (an engine
//! #                                     # gone, the pool map moving) is made again; 0: never
//! # call_timeout_seconds = 180          # the longest a DAOS call waits for DAOS (every engine
//! #                                     # gone: DAOS answers nothing) before UNAVAILABLE
//! # dir_cache_seconds = 5               # how long a directory found by path is used again
//! #                                     # (dfuse's default); 0: looked up every time
//!
//! [limits]
//! max_sessions = 1024
//!
//! [[tenants]]
//! name = "default"
//! container = "default"
//! max_sessions = 64           # default: [limits] max_sessions
//! object_class = "RP_2G1"     # DAOS only: this tenant's new files; default [backend] object_class
//! daos_user = "dpuio-acme"    # DAOS only: its DAOS calls run as this user, in a worker process
//! daos_group = "dpuio-acme"   # that worker's group; default the user's primary group
//! [tenants.qos]               # 0 or absent: unlimited
//! bytes_per_s = 1073741824
//! ops_per_s = 100000
//! burst_bytes = 67108864
//! burst_ops = 1000
//! weight = 1                  # share when tenants compete
//! max_inflight = 256          # data-plane requests in flight, all sessions
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use check::Checker;
pub use check::{check_daos_label, check_identifier};

// The checker, by section. Each file is named by `#[path]` because the fuzz crate
// compiles this file by path (fuzz/src/lib.rs): there `config.rs` is read as a `mod.rs`,
// and a plain `mod check;` would be looked for beside it rather than under `config/`.
#[path = "config/agent.rs"]
mod agent;
#[path = "config/backend.rs"]
mod backend;
#[path = "config/check.rs"]
mod check;
#[path = "config/data_plane.rs"]
mod data_plane;
#[path = "config/tenants.rs"]
mod tenants;

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
    /// How long a DAOS call that fails transiently is made again before the client
    /// hears of it (0: never).
    pub retry_seconds: u64,
    /// Redundancy factor (`rd_fac`) of the containers the agent creates; 0: DAOS's default.
    pub redundancy_factor: u32,
    /// The fault domain it counts: 1 rank, 2 node; 0: DAOS's default (node).
    pub redundancy_level: u32,
    /// The longest a DAOS metadata call, its retries included, waits for DAOS before
    /// the client hears `UNAVAILABLE`; at least `retry_seconds`.
    pub call_timeout_seconds: u64,
    /// How long a directory found by path is used again as the parent of calls on its
    /// names before it is looked up afresh (0: never kept).
    pub dir_cache_seconds: u64,
}

/// The DAOS system name DAOS uses unless its servers are configured otherwise.
pub const DEFAULT_DAOS_SYSTEM: &str = "daos_server";
/// How long DAOS calls failing transiently are retried unless the config says: past
/// DAOS's own RPC timeout (60 s) plus the time the system takes to exclude a dead engine
/// (about 20 s), with room to spare. The shim waits longer than this for a completion.
pub const DEFAULT_RETRY_SECONDS: u64 = 120;
/// How long a DAOS call may go unanswered unless the config says: the retry bound plus
/// DAOS's own 60 s RPC timeout for the last try. The shim waits longer (300 s).
pub const DEFAULT_CALL_TIMEOUT_SECONDS: u64 = 180;
/// DFS's default chunk size.
pub const DEFAULT_DAOS_CHUNK_BYTES: u64 = 1 << 20;

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
    /// DAOS object class of this tenant's new files and directories (`RP_2G1`, `EC_2P1G1`);
    /// empty: `[backend] object_class`.
    pub object_class: String,
    /// DAOS user whose identity this tenant's DAOS calls carry, from a worker process of
    /// its own (empty: the agent's own, in-process).
    pub daos_user: String,
    /// That worker's group (empty: the user's primary group).
    pub daos_group: String,
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
            object_class: String::new(),
            daos_user: String::new(),
            daos_group: String::new(),
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

#[cfg(test)]
#[path = "config/tests.rs"]
mod tests;
