//! The agent's state: tenants, mounted containers, sessions and their handles.
//!
//! Everything here is plain data behind short-held locks; no lock is held across a
//! backend call or an await. Every table has a limit (sessions per agent, handles per
//! session) so that an untrusted host cannot grow the agent without bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use dpuio_backend::{Backend, Container, Object};

use crate::dataplane::{DataPlane, HostRegion, HostRing, Peer};
use crate::engine::{HandleInfo, RegionInfo, SessionView};

use crate::config::{Config, Limits, TenantConfig};
use crate::error::{Error, Result};

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
    pub(crate) encryption: Mutex<HashMap<String, crate::encryption::EncryptionSettings>>,
}

/// One attached host process.
pub struct Session {
    pub id: u64,
    pub tenant: String,
    pub container_name: String,
    pub client_name: String,
    pub attached_at: SystemTime,
    container: Mutex<Option<Arc<dyn Container>>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    lease_deadline: Mutex<Instant>,
    peer: Mutex<Option<Arc<Peer>>>,
    regions: Mutex<HashMap<u32, Arc<HostRegion>>>,
    rings: Mutex<HashMap<u32, Arc<HostRing>>>,
    next_region_id: std::sync::atomic::AtomicU32,
}

/// An open file of a session.
pub struct Handle {
    pub object: Arc<dyn Object>,
    pub writable: bool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind (maps of
    // Arcs); going on with it is safer than taking the whole agent down.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A fresh id that is neither 0 (reserved for "none" on the wire) nor guessable.
fn fresh_id() -> u64 {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return id;
        }
    }
}

impl Agent {
    pub fn new(config: Config, backend: Arc<dyn Backend>) -> Agent {
        let tenants = config.tenants.iter().map(|t| (t.name.clone(), t.clone())).collect();
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
        }
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
    pub fn set_encryption(&self, container: &str, settings: crate::encryption::EncryptionSettings) {
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
        let mut mounted = self.backend.mount(name, true)?;
        // Wrapped once and cached: every open of a file must share the wrapper's
        // per-file state and locks.
        if let Some(settings) = lock(&self.encryption).get(name).cloned() {
            mounted = Arc::new(
                crate::encryption::EncryptedContainer::new(mounted, settings)
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

    /// Start a session for `tenant`.
    pub fn attach(&self, tenant: &str, client_name: &str) -> Result<Arc<Session>> {
        if self.is_draining() {
            return Err(Error::Unavailable("shutting down"));
        }
        let container_name = match lock(&self.tenants).get(tenant) {
            Some(t) => t.container.clone(),
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
        let session = Arc::new(Session {
            id: fresh_id(),
            tenant: tenant.to_owned(),
            container_name,
            client_name: client_name.to_owned(),
            attached_at: SystemTime::now(),
            container: Mutex::new(None),
            handles: Mutex::new(HashMap::new()),
            lease_deadline: Mutex::new(Instant::now() + self.lease()),
            peer: Mutex::new(None),
            regions: Mutex::new(HashMap::new()),
            rings: Mutex::new(HashMap::new()),
            next_region_id: std::sync::atomic::AtomicU32::new(1),
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
        let Some(session) = lock(&self.sessions).remove(&id) else {
            return Ok(false);
        };
        session.close_all()?;
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
            if let Err(e) = self.detach(id) {
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

    /// Every ring of every session, for a full scan.
    pub fn all_rings(&self) -> Vec<(u64, u32)> {
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        sessions.iter().flat_map(|s| lock(&s.rings).keys().map(|r| (s.id, *r)).collect::<Vec<_>>()).collect()
    }

    /// A ring with its session and peer, if all still exist.
    pub fn ring(&self, session_id: u64, ring_id: u32) -> Option<(Arc<Session>, Arc<Peer>, Arc<HostRing>)> {
        let session = lock(&self.sessions).get(&session_id).cloned()?;
        let peer = lock(&session.peer).clone()?;
        let ring = lock(&session.rings).get(&ring_id).cloned()?;
        Some((session, peer, ring))
    }

    /// Number of sessions attached now.
    pub fn session_count(&self) -> usize {
        lock(&self.sessions).len()
    }
}

impl Session {
    /// The mounted container, or [`Error::NotMounted`].
    pub fn container(&self) -> Result<Arc<dyn Container>> {
        lock(&self.container).clone().ok_or(Error::NotMounted { id: self.id })
    }

    /// Register an open object; fails past the per-session limit.
    pub fn add_handle(&self, object: Arc<dyn Object>, limit: u32) -> Result<u64> {
        let mut handles = lock(&self.handles);
        if handles.len() >= limit as usize {
            return Err(Error::Limit { what: "open handles in this session", limit: limit.into() });
        }
        let writable = object.writable();
        let id = fresh_id();
        handles.insert(id, Arc::new(Handle { object, writable }));
        Ok(id)
    }

    /// The handle `id` of this session; handles of other sessions are not found.
    pub fn handle(&self, id: u64) -> Result<Arc<Handle>> {
        lock(&self.handles).get(&id).cloned().ok_or(Error::NoHandle { handle: id })
    }

    /// Forget a handle; a writable one is synced first so `Close` means durable.
    pub fn close_handle(&self, id: u64) -> Result<()> {
        let handle = lock(&self.handles).remove(&id).ok_or(Error::NoHandle { handle: id })?;
        if handle.writable {
            handle.object.sync()?;
        }
        Ok(())
    }

    /// Bind the session to its host's data-plane endpoint (Attach).
    pub fn set_peer(&self, peer: Arc<Peer>) {
        *lock(&self.peer) = Some(peer);
    }

    /// The data-plane endpoint, or why there is none.
    pub fn peer(&self) -> Result<Arc<Peer>> {
        lock(&self.peer).clone().ok_or_else(|| {
            Error::invalid(
                "session_id",
                "this session attached without a data-plane transport; attach with one to register memory",
            )
        })
    }

    /// A fresh region id (never 0, never reused within the session).
    pub fn next_region_id(&self) -> u32 {
        self.next_region_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Add a registered region; fails past the per-session limit.
    pub fn add_region(&self, region: HostRegion, limit: u32) -> Result<Arc<HostRegion>> {
        let mut regions = lock(&self.regions);
        if regions.len() >= limit as usize {
            return Err(Error::Limit { what: "registered regions in this session", limit: limit.into() });
        }
        let region = Arc::new(region);
        regions.insert(region.id, region.clone());
        Ok(region)
    }

    /// A registered region of this session.
    pub fn host_region(&self, id: u32) -> Option<Arc<HostRegion>> {
        lock(&self.regions).get(&id).cloned()
    }

    /// Forget a region; refused while a ring lives in it.
    pub fn remove_region(&self, id: u32) -> Result<()> {
        if lock(&self.rings).values().any(|r| r.region_id() == id) {
            return Err(Error::invalid("region_id", format!("region {id} holds a ring: deregister the ring first")));
        }
        lock(&self.regions)
            .remove(&id)
            .map(|_| ())
            .ok_or_else(|| Error::invalid("region_id", format!("region {id} is not registered in this session")))
    }

    /// Add a ring; at most one per region offset, bounded by the region limit.
    pub fn add_ring(&self, ring: HostRing, limit: u32) -> Result<()> {
        let mut rings = lock(&self.rings);
        if rings.len() >= limit as usize {
            return Err(Error::Limit { what: "rings in this session", limit: limit.into() });
        }
        rings.insert(ring.id, Arc::new(ring));
        Ok(())
    }

    /// Forget a ring.
    pub fn remove_ring(&self, id: u32) -> Result<()> {
        lock(&self.rings)
            .remove(&id)
            .map(|_| ())
            .ok_or_else(|| Error::invalid("ring_id", format!("ring {id} is not registered in this session")))
    }

    pub fn region_count(&self) -> usize {
        lock(&self.regions).len()
    }

    pub fn handle_count(&self) -> usize {
        lock(&self.handles).len()
    }

    fn close_all(&self) -> Result<()> {
        // Rings and regions first, so the engine stops touching this host's memory.
        lock(&self.rings).clear();
        lock(&self.regions).clear();
        lock(&self.peer).take();
        let handles: Vec<Arc<Handle>> = lock(&self.handles).drain().map(|(_, h)| h).collect();
        let mut first_error = None;
        for h in handles.into_iter().filter(|h| h.writable) {
            if let Err(e) = h.object.sync() {
                first_error.get_or_insert(Error::from(e));
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl SessionView for Session {
    fn handle(&self, id: u64) -> Option<HandleInfo> {
        lock(&self.handles).get(&id).map(|h| HandleInfo { writable: h.writable })
    }
    fn region(&self, id: u32) -> Option<RegionInfo> {
        lock(&self.regions).get(&id).map(|r| r.info())
    }
}
