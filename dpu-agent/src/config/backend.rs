//! `[backend]`: the local backend, or DAOS with its pool, system and object layout.

use std::path::{Path, PathBuf};

use super::check::{Checker, check_daos_label, join};
use super::{
    BackendConfig, DEFAULT_CALL_TIMEOUT_SECONDS, DEFAULT_DAOS_CHUNK_BYTES, DEFAULT_DAOS_SYSTEM, DEFAULT_RETRY_SECONDS,
    DaosConfig,
};

const LOCAL_KEYS: &[&str] = &["path"];
const DAOS_KEYS: &[&str] = &[
    "pool",
    "system",
    "agent_socket_dir",
    "create_containers",
    "chunk_bytes",
    "object_class",
    "retry_seconds",
    "redundancy_factor",
    "redundancy_level",
    "call_timeout_seconds",
    "dir_cache_seconds",
];

impl Checker {
    /// `[backend]` (absent: the local backend under `data_dir`). Keys of the other
    /// kind are mistakes too.
    pub(super) fn backend(&mut self, backend: Option<&toml::Table>, data_dir: &Path) -> BackendConfig {
        let mut backend_path = None;
        let mut daos = None;
        if let Some(backend) = backend {
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
        match daos {
            Some(daos) => BackendConfig::Daos(daos),
            None => BackendConfig::Local { path: backend_path.unwrap_or_else(|| data_dir.to_owned()) },
        }
    }

    /// The keys of `[backend] kind = "daos"`; `None` (with issues) if one is wrong.
    pub(super) fn daos(&mut self, t: &toml::Table) -> Option<DaosConfig> {
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
        self.object_class("backend.object_class", &object_class, "the container's default");
        let retry_seconds =
            self.integer(t, "backend", "retry_seconds", 0, 3600).map_or(DEFAULT_RETRY_SECONDS, |n| n as u64);
        let redundancy_factor = self.integer(t, "backend", "redundancy_factor", 0, 4).map_or(0, |n| n as u32);
        let redundancy_level = match self.string(t, "backend", "redundancy_level").as_deref() {
            None => 0,
            Some("rank") => 1,
            Some("node") => 2,
            Some(other) => {
                self.issue(
                    "backend.redundancy_level",
                    format!("{other:?}: expected \"rank\" (engines) or \"node\" (machines, DAOS's default)"),
                );
                0
            }
        };
        // Unset: the retry bound plus DAOS's 60 s RPC timeout for the last try.
        let call_timeout_seconds = self
            .integer(t, "backend", "call_timeout_seconds", 1, 7200)
            .map_or(DEFAULT_CALL_TIMEOUT_SECONDS.max(retry_seconds + 60), |n| n as u64);
        if t.contains_key("call_timeout_seconds") && call_timeout_seconds < retry_seconds {
            self.issue(
                "backend.call_timeout_seconds",
                format!(
                    "{call_timeout_seconds} is shorter than retry_seconds ({retry_seconds}): a call would be cut off \
                     while it is still being retried; make it at least {retry_seconds} (some 60 s more leaves DAOS's \
                     RPC timeout to the last try)"
                ),
            );
        }
        let dir_cache_seconds = self
            .integer(t, "backend", "dir_cache_seconds", 0, 3600)
            .map_or(dpuio_daos::DEFAULT_DIR_CACHE.as_secs(), |n| n as u64);
        (self.issues.len() == issues).then(|| DaosConfig {
            pool: pool.unwrap_or_default(),
            system,
            agent_socket_dir,
            create_containers,
            chunk_bytes,
            object_class,
            retry_seconds,
            redundancy_factor,
            redundancy_level,
            call_timeout_seconds,
            dir_cache_seconds,
        })
    }

    /// Check the shape of an object class name at `key` (DAOS checks that it knows it
    /// when the agent starts); `fallback` says what leaving it out means.
    pub(super) fn object_class(&mut self, key: &str, name: &str, fallback: &str) {
        if name.len() > 32 || !name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_') {
            self.issue(
                key,
                format!(
                    "{name:?} is not a DAOS object class name such as \"SX\", \"S1\", \"RP_2G1\" or \"EC_2P1G1\" \
                     (upper-case letters, digits and '_'); leave it out for {fallback}"
                ),
            );
        }
    }
}

impl super::DaosConfig {
    /// What a tenant's DAOS worker is told of the backend: these settings.
    pub fn worker_setup(&self, tenant: &str) -> dpuio_worker::Setup {
        dpuio_worker::Setup {
            tenant: tenant.to_owned(),
            pool: self.pool.clone(),
            system: self.system.clone(),
            agent_socket_dir: self
                .agent_socket_dir
                .clone()
                .unwrap_or_else(dpuio_daos::default_agent_socket_dir)
                .display()
                .to_string(),
            create_containers: self.create_containers,
            chunk_bytes: self.chunk_bytes,
            object_class: self.object_class.clone(),
            retry_ms: self.retry_seconds.saturating_mul(1000),
            call_timeout_ms: self.call_timeout_seconds.saturating_mul(1000),
            dir_cache_ms: self.dir_cache_seconds.saturating_mul(1000),
            redundancy_factor: self.redundancy_factor,
            redundancy_level: self.redundancy_level,
        }
    }
}
