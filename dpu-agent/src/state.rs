//! The agent's state: tenants, mounted containers and sessions, and the policy on them
//! (who may attach as which tenant, with what rights, how many sessions).
//!
//! Everything here is plain data behind short-held locks; no lock is held across a
//! backend call or an await. Every table has a limit (sessions per agent, handles per
//! session) so that an untrusted host cannot grow the agent without bound. A session's
//! handles, regions and rings are tables of the data plane
//! ([`crate::dataplane::sessions`]), which the session holds as [`Session::io`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use dpuio_auth::qos::MAX_WEIGHT;
use dpuio_auth::token::{Op, OpMask, TokenAuthority, TokenError};
use dpuio_backend::{Backend, Container, NsPath, Object};

use crate::caller::Caller;
use crate::config::{Config, Limits, QosConfig, TenantConfig};
use crate::dataplane::sessions::{self, AgentView, Handle};
use crate::dataplane::{DataPlane, Peer};
use crate::error::{Error, Result};
use crate::metrics::{Gauges, Metrics, TenantGauges, TimedContainer, TransportGauges};
use crate::runtime::lock;

/// The whole agent: what the services share.
pub struct Agent {
    pub config: Config,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) tenants: Mutex<HashMap<String, TenantConfig>>,
    pub(crate) containers: Mutex<HashMap<String, Arc<dyn Container>>>,
    pub(crate) sessions: Mutex<HashMap<u64, Arc<Session>>>,
    draining: AtomicBool,
    pub started: Instant,
    dataplane: std::sync::OnceLock<Arc<DataPlane>>,
    /// Per container: how its files are encrypted (tenants with encryption on).
    pub(crate) encryption: Mutex<HashMap<String, dpuio_encryption::EncryptionSettings>>,
    /// Signs and verifies capability tokens (its key lives under `data_dir/tokens`).
    pub tokens: TokenAuthority,
    /// What the agent counts; each session counts through its tenant's handle.
    pub metrics: Arc<Metrics>,
    /// Where `GET /metrics` is served, once bound.
    metrics_addr: std::sync::OnceLock<SocketAddr>,
    /// The state file that keeps what `dpuctl` changes (set once, at start).
    persisted: std::sync::OnceLock<crate::persist::store::Store>,
}

/// What a session may do: all of its tenant's container, or what its capability
/// token grants. Checked on every namespace call; compiled into each handle's
/// [`HandleInfo`](crate::validate::HandleInfo) for the data plane.
#[derive(Clone, Debug)]
pub struct SessionRights {
    pub ops: OpMask,
    /// The subtree the session may touch (`/` for the whole container).
    pub prefix: NsPath,
    /// When the rights end (`None`: with the session).
    pub expires_at: Option<SystemTime>,
    /// The token the session attached with; delegations attenuate it.
    pub token: Option<String>,
}

impl SessionRights {
    /// Everything in the tenant's container, for as long as the session lives.
    pub fn full() -> SessionRights {
        SessionRights { ops: OpMask::ALL, prefix: NsPath::root(), expires_at: None, token: None }
    }

    pub fn expired(&self, now: SystemTime) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }

    /// Whether `op` on `path` is allowed now; the error says what the token grants.
    pub fn check(&self, op: Op, path: &NsPath) -> Result<()> {
        if self.expired(SystemTime::now()) {
            return Err(Error::Unauthenticated(
                "the session's capability token has expired; attach again with a fresh token".into(),
            ));
        }
        if !self.ops.contains(op.mask()) {
            return Err(Error::PermissionDenied(format!(
                "the session's capability token does not allow {op} (it allows {}); ask the parent for a delegation that does",
                self.ops
            )));
        }
        if !dpuio_auth::names::path_within(path.as_str(), self.prefix.as_str()) {
            return Err(Error::PermissionDenied(format!(
                "{path} is outside the session's capability prefix {}",
                self.prefix
            )));
        }
        Ok(())
    }
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

/// Lifetime of a delegation from a session without a token, when none is asked for.
const DEFAULT_DELEGATION: Duration = Duration::from_secs(3600);
/// Longest delegation.
const MAX_DELEGATION: Duration = Duration::from_secs(7 * 24 * 3600);

impl Agent {
    /// An agent serving the config's tenants.
    pub fn new(config: Config, backend: Arc<dyn Backend>) -> Agent {
        let tenants = config.tenants.clone();
        Agent::with_tenants(config, tenants, backend)
    }

    /// An agent serving `tenants` (the config's merged with the state file's changes:
    /// [`crate::persist::merge`]); `config.tenants` stays what the config file says.
    pub fn with_tenants(config: Config, tenants: Vec<TenantConfig>, backend: Arc<dyn Backend>) -> Agent {
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
            sessions: Mutex::new(HashMap::new()),
            draining: AtomicBool::new(false),
            started: Instant::now(),
            dataplane: std::sync::OnceLock::new(),
            encryption: Mutex::new(HashMap::new()),
            tokens: TokenAuthority::generate(),
            metrics,
            metrics_addr: std::sync::OnceLock::new(),
            persisted: std::sync::OnceLock::new(),
        }
    }

    /// Keep what `dpuctl` changes in `store` from now on (once, at start).
    pub fn set_persisted(&self, store: crate::persist::store::Store) {
        let _ = self.persisted.set(store);
    }

    /// The state file, if this agent keeps one (an agent built by hand, as unit tests
    /// do, has none: its changes last as long as it does).
    pub fn persisted(&self) -> Option<&crate::persist::store::Store> {
        self.persisted.get()
    }

    /// Make a change that persists: `change` applies it and records it in the state;
    /// see [`crate::persist::store::Store::change`]. Without a state file the record
    /// goes nowhere.
    pub fn change_persisted<T>(
        &self,
        change: impl FnOnce(&mut crate::persist::PersistedState) -> Result<T>,
    ) -> Result<T> {
        match self.persisted() {
            Some(store) => store.change(change),
            None => change(&mut crate::persist::PersistedState::default()),
        }
    }

    /// Where each tenant's settings came from, for `dpuctl status`.
    pub fn setting_origins(&self) -> Vec<crate::persist::TenantOrigins> {
        let state = self.persisted().map(|s| s.state()).unwrap_or_default();
        crate::persist::origins(&self.config.tenants, &state, &self.tenant_list())
    }

    /// The session limits of `tenant` now: its own where set, else `[limits]`'s.
    /// Returns (open handles per session, regions per session).
    pub fn session_limits(&self, tenant: &str) -> (u32, u32) {
        let l = self.limits();
        let tenants = lock(&self.tenants);
        let own = tenants.get(tenant);
        (
            own.and_then(|t| t.max_handles_per_session).unwrap_or(l.max_handles_per_session),
            own.and_then(|t| t.max_regions_per_session).unwrap_or(l.max_regions_per_session),
        )
    }

    /// Change a tenant's session limits from now on (`None` keeps [limits]'s);
    /// sessions already attached are held to them at their next open or registration.
    pub fn set_tenant_limits(
        &self,
        tenant: &str,
        max_sessions: Option<u32>,
        handles: Option<u32>,
        regions: Option<u32>,
    ) -> Result<()> {
        let mut tenants = lock(&self.tenants);
        let t = tenants
            .get_mut(tenant)
            .ok_or_else(|| Error::invalid("tenant", format!("tenant {tenant:?} is not configured on this agent")))?;
        t.max_sessions = max_sessions;
        t.max_handles_per_session = handles;
        t.max_regions_per_session = regions;
        Ok(())
    }

    /// Change a tenant's QoS (rates, bursts, weight, in-flight limit) now: in the
    /// agent's tenant table and in the data-plane engine's buckets and queue. Requests
    /// already admitted are not recalled; queued ones wait under the new limits.
    pub fn set_qos(&self, tenant: &str, qos: QosConfig) -> Result<()> {
        if !(1..=MAX_WEIGHT).contains(&qos.weight) {
            return Err(Error::invalid("weight", format!("{}: a weight is from 1 to {MAX_WEIGHT}", qos.weight)));
        }
        if qos.max_inflight == 0 {
            return Err(Error::invalid("max_inflight", "0: a tenant needs at least one request in flight"));
        }
        {
            let mut tenants = lock(&self.tenants);
            let Some(config) = tenants.get_mut(tenant) else {
                return Err(Error::invalid(
                    "tenant",
                    format!("tenant {tenant:?} is not configured on this agent; add it first (dpuctl tenant add)"),
                ));
            };
            config.qos = qos;
        }
        // After the table: an engine that meets the tenant for the first time meanwhile
        // reads the new settings; one that already knows it is told here.
        if let Some(dp) = self.dataplane() {
            dp.set_qos(tenant, &qos);
        }
        Ok(())
    }

    /// Whether `tenant` is configured now.
    pub fn has_tenant(&self, tenant: &str) -> bool {
        lock(&self.tenants).contains_key(tenant)
    }

    /// The tenant's configuration now.
    pub fn tenant(&self, tenant: &str) -> Option<TenantConfig> {
        lock(&self.tenants).get(tenant).cloned()
    }

    /// Every tenant, by name.
    pub fn tenant_list(&self) -> Vec<TenantConfig> {
        let mut all: Vec<TenantConfig> = lock(&self.tenants).values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Every attached session.
    pub fn session_list(&self) -> Vec<Arc<Session>> {
        let mut all: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        all.sort_by(|a, b| (&a.tenant, a.attached_at).cmp(&(&b.tenant, b.attached_at)));
        all
    }

    /// Add a tenant at run time and create its container. Its name and container must
    /// be new: tenants never share a container.
    pub fn add_tenant(&self, tenant: TenantConfig) -> Result<()> {
        {
            let mut tenants = lock(&self.tenants);
            if tenants.contains_key(&tenant.name) {
                return Err(Error::invalid("tenant.name", format!("tenant {:?} exists already", tenant.name)));
            }
            if let Some(owner) = tenants.values().find(|t| t.container == tenant.container) {
                return Err(Error::invalid(
                    "tenant.container",
                    format!(
                        "container {:?} belongs to tenant {:?}; tenants never share a container",
                        tenant.container, owner.name
                    ),
                ));
            }
            tenants.insert(tenant.name.clone(), tenant.clone());
        }
        if let Err(e) = self.container(&tenant.container) {
            lock(&self.tenants).remove(&tenant.name);
            return Err(e);
        }
        self.metrics.tenant(&tenant.name);
        Ok(())
    }

    /// Remove a tenant at run time: from now on its certificate and tokens are
    /// refused, and its sessions are detached at once (their written files synced).
    /// Its container's data stays on disk. Returns how many sessions were detached.
    pub fn remove_tenant(&self, tenant: &str) -> Result<usize> {
        if lock(&self.tenants).remove(tenant).is_none() {
            return Err(Error::invalid("name", format!("tenant {tenant:?} is not configured on this agent")));
        }
        let ids: Vec<u64> = lock(&self.sessions).values().filter(|s| s.tenant == tenant).map(|s| s.id).collect();
        let mut first_error = None;
        for id in &ids {
            if let Err(e) = self.detach(*id) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(ids.len()), Err)
    }

    /// The session `id` if it belongs to a tenant `caller` may act for. Another
    /// tenant's session is reported exactly like an unknown id.
    pub fn session_for(&self, id: u64, caller: &Caller) -> Result<Arc<Session>> {
        let session = self.session(id)?;
        if !caller.may_use(&session.tenant) {
            return Err(Error::NoSession { id });
        }
        Ok(session)
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

    /// Encrypt the files of `container` from now on (before the first mount of it).
    pub fn set_encryption(&self, container: &str, settings: dpuio_encryption::EncryptionSettings) {
        lock(&self.encryption).insert(container.to_owned(), settings);
    }

    /// Create every tenant's container that does not exist yet, so a fresh agent is
    /// ready to use; called once at start.
    pub fn prepare_containers(&self) -> Result<()> {
        let tenants: Vec<TenantConfig> = lock(&self.tenants).values().cloned().collect();
        for tenant in tenants {
            self.container(&tenant.container)?;
        }
        Ok(())
    }

    pub(crate) fn container(&self, name: &str) -> Result<Arc<dyn Container>> {
        if let Some(c) = lock(&self.containers).get(name) {
            return Ok(c.clone());
        }
        let mut mounted: Arc<dyn Container> =
            Arc::new(TimedContainer::new(self.backend.mount(name, true)?, self.metrics.backend_times()));
        // Wrapped once and cached: every open of a file must share the wrapper's
        // per-file state and locks.
        if let Some(settings) = lock(&self.encryption).get(name).cloned() {
            mounted = Arc::new(
                dpuio_encryption::EncryptedContainer::new(mounted, settings)
                    .map_err(|e| Error::Internal(format!("container {name}: {e}")))?,
            );
        }
        Ok(lock(&self.containers).entry(name.to_owned()).or_insert(mounted).clone())
    }

    /// Stop taking new sessions (shutdown or drain).
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Which tenant an Attach is for and what the session may do: the caller's
    /// certificate decides the tenant (a plaintext loopback listener takes the named
    /// one); a capability token narrows the rights and must be this agent's, for that
    /// tenant and its container, unexpired and unaltered.
    pub fn authorize_attach(&self, caller: &Caller, requested: &str, token: &str) -> Result<(String, SessionRights)> {
        let now = SystemTime::now();
        let verified = if token.is_empty() {
            None
        } else {
            Some(self.tokens.verify(token, now).map_err(|e| match e {
                TokenError::TimedOut => Error::Unavailable("checking the capability token ran out of time; try again"),
                e => Error::Unauthenticated(format!("capability_token: {e}")),
            })?)
        };
        let tenant = match caller {
            Caller::Tenant(t) => {
                if !requested.is_empty() && requested != t {
                    return Err(Error::PermissionDenied(format!(
                        "the client certificate is for tenant {t:?}; it cannot attach as tenant {requested:?}"
                    )));
                }
                t.clone()
            }
            Caller::Unauthenticated if !requested.is_empty() => requested.to_owned(),
            Caller::Unauthenticated => match &verified {
                Some(rights) => rights.tenant().to_owned(),
                None => self.default_tenant()?,
            },
        };
        let Some(rights) = verified else {
            return Ok((tenant, SessionRights::full()));
        };
        if rights.tenant() != tenant {
            return Err(Error::Unauthenticated(format!(
                "capability_token: the token is for tenant {:?}, but the caller is tenant {tenant:?}",
                rights.tenant()
            )));
        }
        let container = self
            .tenant(&tenant)
            .map(|t| t.container)
            .ok_or_else(|| Error::PermissionDenied(format!("tenant {tenant:?} is not configured on this agent")))?;
        if rights.container() != container {
            return Err(Error::Unauthenticated(format!(
                "capability_token: the token is for container {:?}, tenant {tenant:?} has {container:?}",
                rights.container()
            )));
        }
        let prefix = NsPath::parse(rights.prefix())
            .map_err(|e| Error::Unauthenticated(format!("capability_token: its prefix is not a path: {e}")))?;
        Ok((
            tenant,
            SessionRights {
                ops: rights.ops(),
                prefix,
                expires_at: Some(rights.expires_at()),
                token: Some(token.to_owned()),
            },
        ))
    }

    fn default_tenant(&self) -> Result<String> {
        let tenants = lock(&self.tenants);
        if tenants.len() == 1 {
            return Ok(tenants.keys().next().cloned().unwrap_or_default());
        }
        if tenants.contains_key(crate::config::DEFAULT_TENANT) {
            return Ok(crate::config::DEFAULT_TENANT.to_owned());
        }
        Err(Error::invalid(
            "tenant",
            "this agent serves several tenants and none is named \"default\": name the tenant to attach as",
        ))
    }

    /// A capability token for a child of `session` (e.g. a DataLoader worker): the
    /// session's rights narrowed to `prefix`, `operations` and `lifetime_s` (empty or
    /// zero keep the parent's). It can never do more than the session: the token is an
    /// attenuation of the session's own, and the agent refuses any widening.
    pub fn delegate(
        &self,
        session: &Session,
        prefix: &str,
        operations: &[String],
        lifetime_s: u64,
    ) -> Result<(String, SystemTime)> {
        use dpuio_auth::token::Scope;
        let now = SystemTime::now();
        if lifetime_s > MAX_DELEGATION.as_secs() {
            return Err(Error::invalid(
                "lifetime_s",
                format!("{lifetime_s} s is longer than the limit of {} s", MAX_DELEGATION.as_secs()),
            ));
        }
        let lifetime = (lifetime_s > 0).then(|| Duration::from_secs(lifetime_s));
        let parent = match &session.rights.token {
            Some(token) => token.clone(),
            None => {
                // A session with no token holds its tenant's rights for its own life: the
                // root of its delegations lasts as long as the longest child may.
                let scope = Scope {
                    tenant: session.tenant.clone(),
                    container: session.container_name.clone(),
                    prefix: session.rights.prefix.to_string(),
                    ops: session.rights.ops,
                    expires_at: now + lifetime.unwrap_or(DEFAULT_DELEGATION),
                };
                self.tokens.mint(&scope).map_err(|e| Error::Internal(format!("minting a session token: {e}")))?
            }
        };
        let parent_rights = self.tokens.verify(&parent, now).map_err(|e| match e {
            TokenError::TimedOut => Error::Unavailable("checking the capability token ran out of time; try again"),
            e => Error::Unauthenticated(e.to_string()),
        })?;
        let mut scope = parent_rights.to_scope();
        if !prefix.is_empty() {
            scope.prefix = NsPath::parse(prefix)
                .map_err(|e| Error::invalid("path_prefix", format!("{prefix:?} is not a path: {e}")))?
                .to_string();
        }
        if !operations.is_empty() {
            scope.ops = dpuio_auth::token::OpMask::parse_list(&operations.join(",")).map_err(|e| {
                Error::invalid("operations", format!("{e}; use any of \"read\", \"write\", \"create\", \"delete\""))
            })?;
            if scope.ops.is_empty() {
                return Err(Error::invalid("operations", "names no operation"));
            }
        }
        if let Some(lifetime) = lifetime {
            scope.expires_at = now + lifetime;
        }
        let token =
            dpuio_auth::token::attenuate(&parent, &self.tokens.public_key(), &scope, now).map_err(|e| match e {
                TokenError::Widening(_) => {
                    Error::PermissionDenied(format!("a delegation cannot do more than its parent: {e}"))
                }
                TokenError::InvalidScope { .. } | TokenError::InvalidName(_) => {
                    Error::invalid("path_prefix", e.to_string())
                }
                TokenError::Expired { .. } => Error::Unauthenticated(e.to_string()),
                other => Error::Internal(format!("attenuating a token: {other}")),
            })?;
        Ok((token, scope.expires_at))
    }

    /// Start a session for `tenant` with `rights`.
    pub fn attach(&self, tenant: &str, client_name: &str, rights: SessionRights) -> Result<Arc<Session>> {
        if self.is_draining() {
            return Err(Error::Unavailable("shutting down"));
        }
        let (container_name, tenant_max) = match lock(&self.tenants).get(tenant) {
            Some(t) => (t.container.clone(), t.max_sessions),
            None => {
                return Err(Error::PermissionDenied(format!("tenant {tenant:?} is not configured on this agent")));
            }
        };
        if client_name.len() > 256 {
            return Err(Error::invalid("client_name", "longer than 256 bytes"));
        }
        let mut sessions = lock(&self.sessions);
        let limit = self.limits().max_sessions;
        if sessions.len() >= limit as usize {
            return Err(Error::Limit { what: "sessions on this agent", limit: limit.into() });
        }
        if let Some(max) = tenant_max
            && sessions.values().filter(|s| s.tenant == tenant).count() >= max as usize
        {
            return Err(Error::Limit { what: "sessions of this tenant", limit: max.into() });
        }
        let io = Arc::new(sessions::Session::new(tenant, rights.expires_at, self.metrics.tenant(tenant)));
        let session = Arc::new(Session {
            id: io.id,
            tenant: tenant.to_owned(),
            container_name,
            client_name: client_name.to_owned(),
            attached_at: SystemTime::now(),
            rights,
            io,
            container: Mutex::new(None),
            lease_deadline: Mutex::new(Instant::now() + self.lease()),
            connection: Mutex::new(None),
        });
        sessions.insert(session.id, session.clone());
        Ok(session)
    }

    /// The live session with this id; renews nothing.
    pub fn session(&self, id: u64) -> Result<Arc<Session>> {
        lock(&self.sessions).get(&id).cloned().ok_or(Error::NoSession { id })
    }

    /// Renew a session's lease.
    pub fn keep_alive(&self, id: u64) -> Result<()> {
        let session = self.session(id)?;
        *lock(&session.lease_deadline) = Instant::now() + self.lease();
        Ok(())
    }

    /// Note the connection (peer address) a session's host uses: when it closes, the
    /// session ends soon after ([`Agent::connection_closed`]).
    pub fn set_connection(&self, session: &Session, peer: Option<SocketAddr>) {
        if peer.is_some() {
            *lock(&session.connection) = peer;
        }
    }

    /// The connection from `peer` closed: its sessions' leases now end at
    /// [`DISCONNECTED_GRACE`] from `now` (the reaper detaches them then, unless a
    /// renewal over another connection came first). Returns their ids.
    pub fn connection_closed(&self, peer: SocketAddr, now: Instant) -> Vec<u64> {
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        let mut orphaned = Vec::new();
        for s in sessions {
            let mut connection = lock(&s.connection);
            if *connection == Some(peer) {
                *connection = None;
                let mut deadline = lock(&s.lease_deadline);
                *deadline = (*deadline).min(now + DISCONNECTED_GRACE);
                orphaned.push(s.id);
            }
        }
        orphaned
    }

    /// Mount the session's container; `requested` empty means the tenant's own.
    pub fn mount(&self, session: &Session, requested: &str) -> Result<Arc<dyn Container>> {
        if !requested.is_empty() && requested != session.container_name {
            return Err(Error::PermissionDenied(format!(
                "tenant {:?} has no access to container {requested:?}; its container is {:?}",
                session.tenant, session.container_name
            )));
        }
        let container = self.container(&session.container_name)?;
        *lock(&session.container) = Some(container.clone());
        Ok(container)
    }

    /// End a session: close (and sync) its written handles. Returns whether it existed.
    pub fn detach(&self, id: u64) -> Result<bool> {
        self.end_session(id, false)
    }

    /// End a session because the agent stops (its host may attach again later) or not.
    fn end_session(&self, id: u64, stopping: bool) -> Result<bool> {
        let Some(session) = lock(&self.sessions).remove(&id) else {
            return Ok(false);
        };
        session.io.close_all(stopping)?;
        Ok(true)
    }

    /// Detach sessions whose lease lapsed; returns their ids.
    pub fn reap_expired(&self, now: Instant) -> Vec<u64> {
        let expired: Vec<u64> =
            lock(&self.sessions).values().filter(|s| *lock(&s.lease_deadline) < now).map(|s| s.id).collect();
        for id in &expired {
            if let Err(e) = self.detach(*id) {
                tracing::warn!(session = format!("{id:#018x}"), error = %e, "closing an expired session");
            }
        }
        expired
    }

    /// Close every session and make every container durable (shutdown).
    pub fn close_everything(&self) -> Result<()> {
        let ids: Vec<u64> = lock(&self.sessions).keys().copied().collect();
        let mut first_error = None;
        for id in ids {
            if let Err(e) = self.end_session(id, true) {
                first_error.get_or_insert(e);
            }
        }
        let containers: Vec<Arc<dyn Container>> = lock(&self.containers).values().cloned().collect();
        for c in containers {
            if let Err(e) = c.sync() {
                first_error.get_or_insert(e.into());
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Install the data plane (once, at start).
    pub fn set_dataplane(&self, dp: Arc<DataPlane>) {
        let _ = self.dataplane.set(dp);
    }

    /// The data plane, if this agent runs one.
    pub fn dataplane(&self) -> Option<&Arc<DataPlane>> {
        self.dataplane.get()
    }

    /// Number of sessions attached now.
    pub fn session_count(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// Note where `GET /metrics` is served (once, at start).
    pub fn set_metrics_addr(&self, addr: SocketAddr) {
        let _ = self.metrics_addr.set(addr);
    }

    /// Where `GET /metrics` is served, if it is.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr.get().copied()
    }

    /// Per tenant, the headline figures `dpuctl status` shows: its metrics' totals and
    /// its sessions now.
    pub fn tenant_figures(&self) -> Vec<dpuio_proto::v1::TenantFigures> {
        let sessions = self.session_list();
        self.metrics
            .headline()
            .into_iter()
            .map(|h| dpuio_proto::v1::TenantFigures {
                sessions: sessions.iter().filter(|s| s.tenant == h.tenant).count() as u32,
                tenant: h.tenant,
                read_bytes: h.read_bytes,
                written_bytes: h.written_bytes,
                operations: h.operations,
                errors: h.errors,
            })
            .collect()
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

/// The engine's view of the agent: the data-plane half of each session.
impl AgentView for Agent {
    fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }
    fn limits(&self) -> &Limits {
        Agent::limits(self)
    }
    fn tenant(&self, tenant: &str) -> Option<TenantConfig> {
        Agent::tenant(self, tenant)
    }
    fn has_tenant(&self, tenant: &str) -> bool {
        Agent::has_tenant(self, tenant)
    }
    fn sessions_io(&self) -> Vec<Arc<sessions::Session>> {
        lock(&self.sessions).values().map(|s| s.io.clone()).collect()
    }
    fn session_io(&self, id: u64) -> Option<Arc<sessions::Session>> {
        lock(&self.sessions).get(&id).map(|s| s.io.clone())
    }
    fn namespace(&self) -> Option<&dyn crate::dataplane::meta::Namespace> {
        Some(self) // the policy of `crate::namespace`, as over gRPC
    }
    fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// What the metrics read when scraped.
impl Gauges for Agent {
    fn tenants(&self) -> Vec<TenantGauges> {
        let mut by_name: HashMap<String, TenantGauges> = HashMap::new();
        for t in lock(&self.tenants).values() {
            let key_version = t
                .encryption
                .as_ref()
                .map(|_| lock(&self.encryption).get(&t.container).map_or(0, |settings| settings.key_version));
            by_name.insert(t.name.clone(), TenantGauges { tenant: t.name.clone(), key_version, ..Default::default() });
        }
        for s in self.session_list() {
            let Some(g) = by_name.get_mut(&s.tenant) else { continue }; // removed, still detaching
            g.sessions += 1;
            g.open_handles += s.io.handle_count() as u64;
            g.regions += s.io.region_count() as u64;
        }
        if let Some(dp) = self.dataplane() {
            for (tenant, n) in dp.requests_in_flight() {
                if let Some(g) = by_name.get_mut(&*tenant) {
                    g.requests_in_flight = n.into();
                }
            }
        }
        let mut all: Vec<TenantGauges> = by_name.into_values().collect();
        all.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        all
    }

    fn transports(&self) -> Vec<TransportGauges> {
        self.dataplane().map(|dp| dp.transport_gauges()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qos::tests::qos;

    #[test]
    fn set_qos_changes_the_table_and_refuses_unknown_tenants() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::config::Config {
            tenants: vec![crate::config::TenantConfig::new("a", "a")],
            ..crate::config::Config::default()
        };
        let backend = dpuio_backend::local::LocalBackend::open(dir.path().to_owned()).unwrap();
        let agent = Agent::new(config, Arc::new(backend));
        let new = qos(64 << 20, 5, 32);
        agent.set_qos("a", new).unwrap();
        assert_eq!(agent.tenant("a").unwrap().qos, new);
        let e = agent.set_qos("b", new).unwrap_err();
        assert!(e.to_string().contains("tenant \"b\" is not configured"), "{e}");
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(agent.set_qos("a", QosConfig { weight: 0, ..new }).is_err());
        assert!(agent.set_qos("a", QosConfig { max_inflight: 0, ..new }).is_err());
        assert_eq!(agent.tenant("a").unwrap().qos, new, "a refused change leaves the table alone");
    }

    #[test]
    fn scraped_gauges_count_each_tenants_sessions_and_handles() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::config::Config {
            tenants: vec![crate::config::TenantConfig::new("a", "a"), crate::config::TenantConfig::new("b", "b")],
            ..crate::config::Config::default()
        };
        let backend = dpuio_backend::local::LocalBackend::open(dir.path().to_owned()).unwrap();
        let agent = Agent::new(config, Arc::new(backend));
        let session = agent.attach("a", "test", SessionRights::full()).unwrap();
        let container = agent.mount(&session, "").unwrap();
        let options = dpuio_backend::OpenOptions { write: true, create: true, ..Default::default() };
        let object = container.open(&NsPath::parse("/f").unwrap(), options, 0o644).unwrap();
        session.add_handle(object, 8, 0).unwrap();

        let gauges = Gauges::tenants(&agent);
        let a = TenantGauges { tenant: "a".into(), sessions: 1, open_handles: 1, ..Default::default() };
        assert_eq!(gauges, [a, TenantGauges { tenant: "b".into(), ..Default::default() }]);
        assert!(Gauges::transports(&agent).is_empty(), "no data plane");
        let figures = agent.tenant_figures();
        assert_eq!(figures.iter().map(|f| (f.tenant.as_str(), f.sessions)).collect::<Vec<_>>(), [("a", 1), ("b", 0)]);
        // The container is timed below everything else: its open shows in the backend's figures.
        let text = agent.metrics.encode(crate::metrics::Format::Text004).unwrap();
        assert!(text.contains("dpuio_backend_duration_seconds_count{op=\"open\"} 1\n"), "{text}");

        agent.detach(session.id).unwrap();
        assert_eq!(Gauges::tenants(&agent)[0].sessions, 0);
    }
}
