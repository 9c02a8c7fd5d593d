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

use crate::config::{Config, Limits, TenantConfig};
use crate::error::{Error, Result};

/// The whole agent: what the services share.
pub struct Agent {
    pub config: Config,
    backend: Arc<dyn Backend>,
    tenants: Mutex<HashMap<String, TenantConfig>>,
    containers: Mutex<HashMap<String, Arc<dyn Container>>>,
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
    draining: AtomicBool,
    pub started: Instant,
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
}

/// An open file of a session.
pub struct Handle {
    pub object: Arc<dyn Object>,
    pub writable: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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

    /// Create every tenant's container that does not exist yet, so a fresh agent is
    /// ready to use; called once at start.
    pub fn prepare_containers(&self) -> Result<()> {
        let tenants: Vec<TenantConfig> = lock(&self.tenants).values().cloned().collect();
        for tenant in tenants {
            self.container(&tenant.container)?;
        }
        Ok(())
    }

    fn container(&self, name: &str) -> Result<Arc<dyn Container>> {
        if let Some(c) = lock(&self.containers).get(name) {
            return Ok(c.clone());
        }
        let mounted = self.backend.mount(name, true)?;
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

    pub fn handle_count(&self) -> usize {
        lock(&self.handles).len()
    }

    fn close_all(&self) -> Result<()> {
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
