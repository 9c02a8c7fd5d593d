//! What the data plane serves each session from, and what it needs of the agent.
//!
//! A [`Session`] here is a session's data-plane half: its open handles (with what they
//! allow, fixed at open), its host's endpoint ([`Peer`]), and the regions and rings the
//! host registered, each table with its limit, and the lookups the engine and the
//! `Memory` service make on them. The tables exist whether or not the agent runs a data
//! plane: the control plane's Stat, Truncate and Sync by handle use the handles too. The
//! control-plane half of a session (its rights, lease and mounted container) is
//! `state::Session`, which holds one of these.
//!
//! [`AgentView`] is what the engine needs of the agent: the backend, limits and tenants,
//! and the sessions. The agent (`state::Agent`) implements it, so the data plane
//! imports nothing of the rooms above it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use dpuio_backend::{Backend, Object};

use super::host_memory::{HostRegion, HostRing, Peer};
use super::meta;
use crate::config::{Limits, TenantConfig};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, TenantMetrics};
use crate::runtime::lock;
use crate::validate::{HandleInfo, RegionInfo, SessionView};

/// What the engine needs of the agent it serves.
pub trait AgentView: Send + Sync {
    /// The storage backend (each I/O thread makes its queue from it).
    fn backend(&self) -> &Arc<dyn Backend>;
    /// The queue of one I/O thread: the backend's, unless the agent says otherwise.
    fn io_queue(&self) -> dpuio_backend::Result<Box<dyn dpuio_backend::IoQueue>> {
        self.backend().io_queue()
    }
    /// The agent's limits (`max_io_bytes` bounds every request).
    fn limits(&self) -> &Limits;
    /// A tenant's configuration now (for its QoS); `None` once it is removed.
    fn tenant(&self, tenant: &str) -> Option<TenantConfig>;
    /// Whether `tenant` is configured now.
    fn has_tenant(&self, tenant: &str) -> bool;
    /// The data-plane half of every attached session.
    fn sessions_io(&self) -> Vec<Arc<Session>>;
    /// The data-plane half of the attached session `id`.
    fn session_io(&self, id: u64) -> Option<Arc<Session>>;
    /// What the agent counts (the engine counts transport figures and backend times;
    /// requests count through their session's [`Session::metrics`]).
    fn metrics(&self) -> &Arc<Metrics>;

    /// The namespace policy metadata entries run through (`None`: they are refused).
    fn namespace(&self) -> Option<&dyn meta::Namespace> {
        None
    }

    /// Every ring of every session, for a full scan.
    fn all_rings(&self) -> Vec<(u64, u32)> {
        self.sessions_io().iter().flat_map(|s| lock(&s.rings).keys().map(|r| (s.id, *r)).collect::<Vec<_>>()).collect()
    }

    /// A ring with its session and peer, if all still exist.
    fn ring(&self, session_id: u64, ring_id: u32) -> Option<(Arc<Session>, Arc<Peer>, Arc<HostRing>)> {
        let session = self.session_io(session_id)?;
        let peer = lock(&session.peer).clone()?;
        let ring = lock(&session.rings).get(&ring_id).cloned()?;
        Some((session, peer, ring))
    }
}

/// The agent as the engine names it: whatever implements [`AgentView`].
pub type Agent = dyn AgentView;

/// Run a metadata request through the agent's namespace policy (the gRPC handlers' own).
pub(super) fn namespace_call(agent: &Agent, session_id: u64, request: meta::Request) -> Result<meta::Reply> {
    match agent.namespace() {
        Some(ns) => ns.metadata(session_id, request),
        None => Err(Error::Unavailable("serving no namespace on its data plane")),
    }
}

/// A session's data-plane half: what the engine and the handlers that register memory
/// or use handles share.
pub struct Session {
    pub id: u64,
    pub tenant: String,
    /// The tenant's counters, looked up once when the session attaches.
    pub metrics: Arc<TenantMetrics>,
    /// The tenant's DAOS calls are made by a worker process of its own (`daos_user`),
    /// which may stop answering for seconds: the engine hands its metadata entries to
    /// threads while other tenants' rings are served (`Engine::isolates`).
    pub in_worker: bool,
    /// When the session's rights end (`None`: with the session); from then on its
    /// handles move no data.
    expires_at: Option<SystemTime>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    peer: Mutex<Option<Arc<Peer>>>,
    regions: Mutex<HashMap<u32, Arc<HostRegion>>>,
    rings: Mutex<HashMap<u32, Arc<HostRing>>>,
    next_region_id: AtomicU32,
}

/// An open file of a session.
pub struct Handle {
    pub object: Arc<dyn Object>,
    /// Opened for reading and the session's rights allow reading it.
    pub readable: bool,
    /// Opened for writing and the session's rights allow writing it.
    pub writable: bool,
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

impl Session {
    /// The tables of a new session of `tenant` whose rights end at `expires_at`, under a
    /// fresh id, counting into `metrics` (the tenant's).
    pub fn new(tenant: &str, expires_at: Option<SystemTime>, metrics: Arc<TenantMetrics>) -> Session {
        Session {
            id: fresh_id(),
            tenant: tenant.to_owned(),
            metrics,
            in_worker: false,
            expires_at,
            handles: Mutex::new(HashMap::new()),
            peer: Mutex::new(None),
            regions: Mutex::new(HashMap::new()),
            rings: Mutex::new(HashMap::new()),
            next_region_id: AtomicU32::new(1),
        }
    }

    /// Register an open file under a fresh id, or under `claim` when it is not 0 (a
    /// client resuming after an agent restart keeps the ids its entries carry); fails
    /// past the per-session limit or when the claimed id is open already.
    pub fn add_handle(&self, handle: Handle, limit: u32, claim: u64) -> Result<u64> {
        let mut handles = lock(&self.handles);
        if handles.len() >= limit as usize {
            return Err(Error::Limit { what: "open handles in this session", limit: limit.into() });
        }
        let id = match claim {
            0 => fresh_id(),
            id if handles.contains_key(&id) => {
                return Err(Error::invalid("handle", format!("{id:#x} is open in this session already")));
            }
            id => id,
        };
        handles.insert(id, Arc::new(handle));
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

    /// A fresh region id (never 0, never reused within the session, never one claimed).
    pub fn next_region_id(&self) -> u32 {
        self.next_region_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Take `id` for a region a resuming client registers again ([`add_region`]
    /// refuses it if registered); fresh ids then start above it.
    ///
    /// [`add_region`]: Session::add_region
    pub fn claim_region_id(&self, id: u32) -> Result<u32> {
        if id == 0 || id == u32::MAX {
            return Err(Error::invalid("region_id", format!("{id} cannot be claimed")));
        }
        self.next_region_id.fetch_max(id + 1, Ordering::Relaxed);
        Ok(id)
    }

    /// Add a registered region; fails past the per-session limit.
    pub fn add_region(&self, region: HostRegion, limit: u32) -> Result<Arc<HostRegion>> {
        let mut regions = lock(&self.regions);
        if regions.len() >= limit as usize {
            return Err(Error::Limit { what: "registered regions in this session", limit: limit.into() });
        }
        if regions.contains_key(&region.id) {
            return Err(Error::invalid(
                "region_id",
                format!("region {} is registered in this session already", region.id),
            ));
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

    /// Empty every table (the session ends, or the agent stops: `stopping`): the written
    /// handles are synced.
    pub fn close_all(&self, stopping: bool) -> Result<()> {
        // Rings and regions first, so the engine stops touching this host's memory;
        // a host thread waiting on a ring learns it will not be answered, and why.
        let why = if stopping { dpuio_proto::wire::RING_CLOSED_STOPPING } else { dpuio_proto::wire::RING_CLOSED_ENDED };
        for ring in lock(&self.rings).drain().map(|(_, r)| r) {
            ring.mark_closed(why);
        }
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
        let live = self.expires_at.is_none_or(|at| SystemTime::now() < at);
        lock(&self.handles).get(&id).map(|h| HandleInfo { readable: h.readable && live, writable: h.writable && live })
    }
    fn region(&self, id: u32) -> Option<RegionInfo> {
        lock(&self.regions).get(&id).map(|r| r.info())
    }
}
