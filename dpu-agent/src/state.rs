//! The agent's state: tenants, mounted containers and sessions, and the policy on them
//! (who may attach as which tenant, with what rights, how many sessions).
//!
//! Everything here is plain data behind short-held locks; no lock is held across a
//! backend call or an await. Every table has a limit (sessions per agent, handles per
//! session) so that an untrusted host cannot grow the agent without bound. A session's
//! handles, regions and rings are tables of the data plane
//! ([`crate::dataplane::sessions`]), which the session holds as [`Session::io`].
//!
//! The agent is split by concern: its tenants and their containers (`tenants`), who
//! may attach with what rights and the tokens that carry them (`rights`), the sessions'
//! life from attach to detach (`lifecycle`), the temporary files of the puts they left
//! unfinished (`puts`), and what the data plane and the metrics read of it (`views`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use dpuio_auth::token::{Op, TokenAuthority};
use dpuio_backend::{Backend, Container, Object};
use dpuio_encryption::EncryptionSettings;

use crate::config::{Config, Limits, TenantConfig};
use crate::dataplane::sessions::{self, Handle};
use crate::dataplane::{DataPlane, Peer};
use crate::error::{Error, Result};
use crate::leftovers::Leftovers;
use crate::metrics::{Gauges, Metrics};
use crate::persist::store::Store;
use crate::runtime::lock;

mod lifecycle;
mod puts;
mod rights;
mod tenants;
mod views;

pub use rights::SessionRights;

/// The whole agent: what the services share.
pub struct Agent {
    pub config: Config,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) tenants: Mutex<HashMap<String, TenantConfig>>,
    pub(crate) containers: Mutex<HashMap<String, Arc<dyn Container>>>,
    /// Per tenant with a `daos_user`: the backend its worker process runs.
    pub(crate) workers: Mutex<HashMap<String, Arc<dpuio_worker::WorkerBackend>>>,
    pub(crate) sessions: Mutex<HashMap<u64, Arc<Session>>>,
    draining: AtomicBool,
    pub started: Instant,
    dataplane: OnceLock<Arc<DataPlane>>,
    /// Per container: how its files are encrypted (tenants with encryption on).
    pub(crate) encryption: Mutex<HashMap<String, EncryptionSettings>>,
    /// Signs and verifies capability tokens (its key lives under `data_dir/tokens`).
    pub tokens: TokenAuthority,
    /// What the agent counts; each session counts through its tenant's handle.
    pub metrics: Arc<Metrics>,
    /// Where `GET /metrics` is served, once bound.
    metrics_addr: OnceLock<SocketAddr>,
    /// The state file that keeps what `dpuctl` changes.
    persisted: Option<Store>,
    /// The temporary files of unfinished puts, by the session that made them.
    pub(crate) leftovers: Leftovers,
}

/// What an agent is assembled from, all gathered before it is ([`Agent::assemble`]):
/// afterwards only what exists once it runs is added (its data plane, which serves it,
/// and where its metrics listener bound).
pub struct Parts {
    pub config: Config,
    /// The tenants it serves: the config's merged with the state file's changes
    /// ([`crate::persist::merge`]); `config.tenants` stays what the config file says.
    pub tenants: Vec<TenantConfig>,
    pub backend: Arc<dyn Backend>,
    /// Signs and verifies capability tokens.
    pub tokens: TokenAuthority,
    /// The state file that keeps what `dpuctl` changes (`None`: changes last as long
    /// as the agent does).
    pub persisted: Option<Store>,
    /// Per container: how its files are encrypted.
    pub encryption: HashMap<String, EncryptionSettings>,
    /// The temporary files of unfinished puts an earlier run noted, and their journal.
    pub leftovers: Leftovers,
}

/// One attached host process.
pub struct Session {
    pub id: u64,
    pub tenant: String,
    pub container_name: String,
    pub client_name: String,
    pub attached_at: SystemTime,
    pub rights: SessionRights,
    /// What the data plane serves the session from: its open handles, its host's
    /// endpoint, and the regions and rings the host registered.
    pub io: Arc<sessions::Session>,
    container: Mutex<Option<Arc<dyn Container>>>,
    lease_deadline: Mutex<Instant>,
    /// The host's connection (its peer address) the session was attached or last
    /// renewed over; see [`Agent::connection_closed`].
    connection: Mutex<Option<SocketAddr>>,
}

/// How long a session outlives the connection it came over: a host that reconnects
/// and renews within it keeps the session; a dead one is forgotten after it.
pub const DISCONNECTED_GRACE: Duration = Duration::from_secs(2);

impl Agent {
    /// An agent serving the config's tenants with a fresh token key, no state file and
    /// no encryption (tests and tools build it by hand; it is not the source of its
    /// metrics' gauges).
    pub fn new(config: Config, backend: Arc<dyn Backend>) -> Agent {
        let tenants = config.tenants.clone();
        let tokens = TokenAuthority::generate();
        Agent::from_parts(Parts {
            config,
            tenants,
            backend,
            tokens,
            persisted: None,
            encryption: HashMap::new(),
            leftovers: Leftovers::in_memory(),
        })
    }

    /// The agent made of `parts`, and the source of its metrics' gauges.
    pub fn assemble(parts: Parts) -> Arc<Agent> {
        Arc::new_cyclic(|me: &Weak<Agent>| {
            let agent = Agent::from_parts(parts);
            let gauges: Weak<dyn Gauges> = me.clone();
            agent.metrics.register_gauges(gauges);
            agent
        })
    }

    fn from_parts(parts: Parts) -> Agent {
        let Parts { config, tenants, backend, tokens, persisted, encryption, leftovers } = parts;
        let metrics = Arc::new(Metrics::new());
        for t in &tenants {
            metrics.tenant(&t.name); // its series exist, at zero, before its first session
        }
        let tenants = tenants.into_iter().map(|t| (t.name.clone(), t)).collect();
        Agent {
            config,
            backend,
            tenants: Mutex::new(tenants),
            containers: Mutex::new(HashMap::new()),
            workers: Mutex::new(HashMap::new()),
            sessions: Mutex::new(HashMap::new()),
            draining: AtomicBool::new(false),
            started: Instant::now(),
            dataplane: OnceLock::new(),
            encryption: Mutex::new(encryption),
            tokens,
            metrics,
            metrics_addr: OnceLock::new(),
            persisted,
            leftovers,
        }
    }

    /// The state file, if this agent keeps one (an agent built by hand, as unit tests
    /// do, has none: its changes last as long as it does).
    pub fn persisted(&self) -> Option<&Store> {
        self.persisted.as_ref()
    }

    pub fn limits(&self) -> &Limits {
        &self.config.limits
    }

    pub fn backend_kind(&self) -> &'static str {
        self.backend.kind()
    }

    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.config.lease_ms)
    }

    /// Stop taking new sessions (shutdown or drain).
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Install the data plane (once, at start: it is started on the assembled agent,
    /// which it serves).
    pub fn set_dataplane(&self, dp: Arc<DataPlane>) {
        let _ = self.dataplane.set(dp);
    }

    /// The data plane, if this agent runs one.
    pub fn dataplane(&self) -> Option<&Arc<DataPlane>> {
        self.dataplane.get()
    }

    /// Note where `GET /metrics` is served (once, at start).
    pub fn set_metrics_addr(&self, addr: SocketAddr) {
        let _ = self.metrics_addr.set(addr);
    }

    /// Where `GET /metrics` is served, if it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr.get().copied()
    }
}

impl Session {
    /// The mounted container, or [`Error::NotMounted`].
    pub fn container(&self) -> Result<Arc<dyn Container>> {
        lock(&self.container).clone().ok_or(Error::NotMounted { id: self.id })
    }

    /// Register an open object; fails past the per-session limit. What the data plane
    /// may do with it is fixed now: the open mode narrowed by the session's rights.
    /// `claim`: the id to open it under (0: a fresh one; see [`sessions::Session::add_handle`]).
    pub fn add_handle(&self, object: Arc<dyn Object>, limit: u32, claim: u64) -> Result<u64> {
        let path = object.path().clone();
        let readable = self.rights.check(Op::Read, &path).is_ok();
        let writable = object.writable() && self.rights.check(Op::Write, &path).is_ok();
        self.io.add_handle(Handle { object, readable, writable }, limit, claim)
    }

    /// Bind the session to its host's data-plane endpoint (Attach).
    pub fn set_peer(&self, peer: Arc<Peer>) {
        self.io.set_peer(peer);
    }
}

#[cfg(test)]
mod tests;
