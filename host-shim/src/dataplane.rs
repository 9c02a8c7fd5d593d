//! The host side of the data plane: registered memory, rings, and I/O through them.
//!
//! The shim allocates every region *through the transport* (UCX `ucp_mem_map` with
//! `ALLOCATE`), so on shared memory the agent writes it with no help from this process.
//! A request is a 64-byte submission entry written into a ring in this process's
//! memory, published with a release store of the ring's `sq_tail`, and announced with
//! a doorbell. The agent moves the payload and writes the completion entry back into
//! this process's memory; the shim finds it by polling its own memory (no syscall, no
//! payload byte touched).
//!
//! Over TCP, UCX and libfabric carry puts as messages this process must receive, and
//! libfabric's shm provider needs this process to hand back command-queue slots, so
//! the shim runs a progress thread there; its CPU time is reported by
//! [`DataPlaneStats`], never hidden. Which provider: [`DataPlaneOptions::transports`].
//!
//! Rings: one per thread doing I/O, [`DataPlaneOptions::rings`] of them at first; a call
//! takes a free ring for the duration of its submit-and-wait, so threads never share a
//! ring at the same time and need no lock on the fast path beyond taking it. A call that
//! finds none free for [`RING_GROW_AFTER`] registers one more, up to [`RINGS_PER_RING`]
//! times the first count and at least [`RING_BOUND_AT_LEAST`]: a ring whose request the
//! agent's storage keeps (a read DAOS holds while its engines are gone) stays with that
//! request, and the session's other calls, a stat the agent can refuse at once among
//! them, must not wait for it; and a process's many threads each doing one small read at
//! a time (a loader's, through the preload library) each need a ring to have that many
//! reads in flight. Rings made beyond the first count are given back to the agent once
//! free for [`RING_IDLE`], one each time a call gives its ring back, and all such at each
//! probe of the client's supervisor ([`DataPlane::retire_idle`]).
//!
//! Rooms: [`options`](self::options) (the transport, the candidates offered at Attach, the
//! worker opened before it), [`region`](self::region) (registered memory, reached through
//! views), [`batch`](self::batch) (requests through a ring: the driver of the I/O-free
//! core [`dpuio_proto::host_ring`]), [`meta`](self::meta) (metadata entries through a
//! ring), and here the session's rings and its connection to the agent.

mod batch;
mod meta;
mod options;
mod region;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use dpuio_proto::host_ring::{HostRing, meta as ring_meta};
use dpuio_proto::v1 as pb;
use dpuio_proto::wire;
use fabric::any;
use fabric::transport::Endpoint as _;
use fabric::{ProgressThread, Transport};
use pb::memory_client::MemoryClient;
use tonic::transport::Channel;

use crate::error::{Error, Result};
use crate::resume::{Liveness, Registry};

use batch::Ring;
pub use batch::{Batch, Done, Request};
pub(crate) use meta::{AnswerTo, on_handle};
pub(crate) use options::prepare;
pub use options::{DataPlaneOptions, DataPlaneStats, TransportInfo};
pub use region::RegisteredRegion;

/// How long a call waits for a free ring before it registers one more.
pub(crate) const RING_GROW_AFTER: Duration = Duration::from_millis(20);
/// How long a ring the session grew beyond [`DataPlaneOptions::rings`] stays free before
/// it is given back to the agent (deregistered, its memory freed): the rings of a burst of
/// calls serve the next burst within this, and after it no longer hold the agent's tables
/// (`max_regions_per_session` counts rings) and the host's memory.
pub(crate) const RING_IDLE: Duration = Duration::from_secs(10);
/// How many rings a session may grow to, as a multiple of [`DataPlaneOptions::rings`] (the
/// agent may allow fewer: `max_regions_per_session` counts rings).
pub(crate) const RINGS_PER_RING: usize = 4;
/// The least number of rings a session may grow to, whatever the first count: 32 threads
/// reading at once through the preload library on a 2-core host (8 rings by the multiple
/// alone) had a quarter of them waiting for a ring, and the thread that gave one back
/// mostly took it again before a waiter woke (p99 of 4 KiB reads over 100 ms).
pub(crate) const RING_BOUND_AT_LEAST: usize = 32;

/// The data plane of one session.
pub(crate) struct DataPlane {
    worker: any::Worker,
    /// The transport's event fd does not report the agent's work (libfabric shm):
    /// progress when completions are reaped, when the agent has just finished with
    /// this process's memory, rather than often from the progress thread, whose
    /// progress spins on a lock the agent holds while it writes here (measured: half
    /// of the host's CPU of a sequential read at 2 ms slices).
    progress_on_reap: bool,
    /// How long metadata answers usually take: whether a call spins for its answer.
    meta_latency: dpuio_proto::host_ring::meta::MetaLatency,
    /// The session and the connection to its agent: replaced when the client resumes
    /// after an agent restart (the worker, its regions and this table stay).
    conn: RwLock<Arc<Conn>>,
    progress: Mutex<Option<ProgressThread>>,
    memory: MemoryClient<Channel>,
    /// Free rings of the current generation.
    rings: Mutex<Vec<Ring>>,
    ring_freed: Condvar,
    /// Rings of the current generation given up by a batch whose requests the agent never
    /// completed (it may still write into them): never handed out again.
    abandoned: AtomicUsize,
    /// Rings of the current generation registered (or being registered): free, taken or
    /// abandoned.
    made: AtomicUsize,
    /// The agent refused a further ring in this generation (its region limit): calls
    /// wait for a free one.
    growth_refused: AtomicBool,
    /// A further ring is being registered ([`DataPlane::grow`]).
    growing: AtomicBool,
    /// The runtime the session's gRPC calls run on: a ring registered from a blocking
    /// call is registered there.
    runtime: tokio::runtime::Handle,
    options: DataPlaneOptions,
    /// Set when the keep-alive learns the session is gone: why (the agent's answer).
    ended: Mutex<Option<tonic::Status>>,
    live: Arc<Liveness>,
    registry: Arc<Registry>,
    /// Handles closed by the caller with nothing written through them, whose close the
    /// agent has not been sent yet: it goes with the next metadata call, in the same
    /// submission ([`DataPlane::close_later`]).
    owed_closes: Mutex<Vec<u64>>,
    /// Held while a thread rings the agent's doorbell on the shared UCX or libfabric
    /// worker: its own lock is a spinlock, and with more calling threads than cores
    /// (a job's 32 readers through the preload on 2 cores) they spun on it, a holder
    /// preempted, for a sixth of the machine; here they sleep instead.
    doorbell: Mutex<()>,
}

/// A session set up on a restarted agent, not yet serving ([`DataPlane::install`]).
pub(crate) struct Reattached {
    conn: Conn,
    rings: Vec<Ring>,
}

/// A session's connection to its agent's worker.
struct Conn {
    endpoint: any::Endpoint,
    session_id: u64,
    generation: u64,
}

impl DataPlane {
    /// The session the data plane serves now.
    pub(crate) fn session_id(&self) -> u64 {
        self.conn().session_id
    }

    fn conn(&self) -> Arc<Conn> {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The session's rings, registered in `session_id`.
    async fn new_rings(&self, session_id: u64, generation: u64) -> Result<Vec<Ring>> {
        let mut rings = Vec::with_capacity(self.options.rings);
        for _ in 0..self.options.rings {
            rings.push(self.new_ring(session_id, generation).await?);
        }
        Ok(rings)
    }

    async fn new_ring(&self, session_id: u64, generation: u64) -> Result<Ring> {
        let entries = self.options.ring_entries;
        // The ring, then its metadata areas: one registration serves both.
        let (memory, record) = self.alloc(ring_meta::region_bytes(entries), pb::RegionAccess::ReadWrite)?;
        let id = self.register_memory(session_id, &record, 0).await?;
        let mut region = RegisteredRegion { region: memory, id, registry: None };
        region.write_at(0, &wire::RingHeader { entries }.encode());
        let r = self
            .memory
            .clone()
            .register_ring(pb::RegisterRingRequest { session_id, region_id: region.id, offset: 0, entries })
            .await
            .map_err(|s| Error::from_status("register ring", s))?;
        let (id, freed) = (r.into_inner().ring_id, Instant::now());
        Ok(Ring { id, region, core: HostRing::new(entries), generation, freed })
    }

    /// Set up `session_id` on a restarted agent (whose worker is at `agent_address`):
    /// connect to it, register every region again under its id, and fresh rings. The
    /// caller re-opens the files, then [`DataPlane::install`]s it.
    pub(crate) async fn reattach(&self, session_id: u64, agent_address: &[u8]) -> Result<Reattached> {
        let endpoint = options::connect(&self.worker, agent_address).await?;
        // Regions first: their ids are claimed, the rings' come after them.
        for (id, record) in self.registry.regions() {
            self.register_memory(session_id, &record, id).await?;
        }
        let generation = self.conn().generation + 1;
        let rings = self.new_rings(session_id, generation).await?;
        Ok(Reattached { conn: Conn { endpoint, session_id, generation }, rings })
    }

    /// Serve the new session: calls take its rings, and waiters move their entries
    /// to them.
    pub(crate) fn install(&self, new: Reattached) {
        let old = std::mem::replace(&mut *self.conn.write().unwrap_or_else(|p| p.into_inner()), Arc::new(new.conn));
        self.made.store(new.rings.len(), Ordering::Release);
        let stale = std::mem::replace(&mut *self.rings.lock().unwrap_or_else(|p| p.into_inner()), new.rings);
        self.abandoned.store(0, Ordering::Release);
        self.growth_refused.store(false, Ordering::Release);
        *self.ended.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.live.resumed();
        self.ring_freed.notify_all();
        // Closing the old endpoint may wait out its close timeout (its peer is gone).
        std::thread::spawn(move || drop((old, stale)));
    }

    /// The session's regions and files, for a resume.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// A free ring of the current generation: one given back, else, after
    /// [`RING_GROW_AFTER`] without one while the session may grow, the one registered for
    /// it (or any given back first).
    fn take_ring(self: &Arc<Self>) -> Result<Ring> {
        let mut since = Instant::now();
        let mut rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = rings.pop() {
                return Ok(r);
            }
            let made = self.made.load(Ordering::Acquire);
            let most = (self.options.rings * RINGS_PER_RING).max(RING_BOUND_AT_LEAST);
            let may_grow = made < most && !self.growth_refused.load(Ordering::Acquire);
            if !may_grow && self.abandoned.load(Ordering::Acquire) >= made {
                // Waiting would be for ever: no ring will come back.
                return Err(Error::DataPlane {
                    op: "take a ring".into(),
                    reason: format!(
                        "all {made} rings of this session hold requests the agent never completed (see the earlier \
                         timeouts); attach again (a new client or process) to go on"
                    ),
                });
            }
            if !may_grow {
                rings = self.ring_freed.wait(rings).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let waited = since.elapsed();
            if waited >= RING_GROW_AFTER {
                self.grow();
                since = Instant::now();
                continue;
            }
            rings = self.ring_freed.wait_timeout(rings, RING_GROW_AFTER - waited).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Register one more ring of the current generation, on the session's runtime: it
    /// goes to the free rings when registered. Never waits for it (the caller, a blocking
    /// call, may hold the thread that runtime needs: it waits for any ring given back), and
    /// asks for one ring at a time.
    fn grow(self: &Arc<Self>) {
        if self.growing.swap(true, Ordering::AcqRel) {
            return;
        }
        self.made.fetch_add(1, Ordering::AcqRel);
        let (dp, conn) = (self.clone(), self.conn());
        self.runtime.spawn(async move {
            match dp.new_ring(conn.session_id, conn.generation).await {
                Ok(ring) => {
                    tracing::debug!(ring = ring.id, "every ring was busy: registered one more");
                    dp.growing.store(false, Ordering::Release);
                    dp.give_ring(ring);
                }
                Err(e) => {
                    if conn.generation == dp.conn().generation {
                        dp.made.fetch_sub(1, Ordering::AcqRel);
                        dp.growth_refused.store(true, Ordering::Release);
                    }
                    tracing::warn!(error = %e, "no further ring for this session: calls wait for a free one");
                    dp.growing.store(false, Ordering::Release);
                    // Waiters learn that none will come (under the lock they wait on).
                    let _rings = dp.rings.lock().unwrap_or_else(|p| p.into_inner());
                    dp.ring_freed.notify_all();
                }
            }
        });
    }

    /// A batch gives up its ring for good (see [`DataPlane::abandoned`]); waiters for a
    /// ring learn whether any is left.
    fn abandon_ring(&self, ring: Ring) {
        let rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        if ring.generation == self.conn().generation {
            self.abandoned.fetch_add(1, Ordering::AcqRel);
        }
        std::mem::forget(ring);
        drop(rings);
        self.ring_freed.notify_all();
    }

    fn give_ring(&self, mut ring: Ring) {
        let mut rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        if ring.generation != self.conn().generation {
            return; // of a session the agent no longer has: freed
        }
        ring.freed = Instant::now();
        rings.push(ring);
        let idle = self.idle_ring(&mut rings);
        drop(rings);
        self.ring_freed.notify_one();
        if let Some(ring) = idle {
            self.retire(ring);
        }
    }

    /// Give back every ring the session grew beyond its first count that has been free for
    /// [`RING_IDLE`]. The client's supervisor calls it every probe of the agent, so that a
    /// session that makes no call at all shrinks too (a call giving its ring back gives
    /// back one such ring at once).
    pub(crate) fn retire_idle(&self) {
        let idle: Vec<Ring> = {
            let mut rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
            std::iter::from_fn(|| self.idle_ring(&mut rings)).collect()
        };
        for ring in idle {
            self.retire(ring);
        }
    }

    /// A ring the session grew beyond its first count that has been free for
    /// [`RING_IDLE`], taken out of the free rings (the one free longest: they are a stack).
    fn idle_ring(&self, rings: &mut Vec<Ring>) -> Option<Ring> {
        let grown = self.made.load(Ordering::Acquire) > self.options.rings;
        if !grown || rings.first().is_none_or(|r| r.freed.elapsed() < RING_IDLE) {
            return None;
        }
        self.made.fetch_sub(1, Ordering::AcqRel);
        Some(rings.remove(0))
    }

    /// Give `ring` back to the agent (its ring, then its memory's registration), on the
    /// session's runtime; its memory goes once the agent forgot it. A failure (the
    /// session gone) only leaves the agent's entry to the session's end.
    fn retire(&self, ring: Ring) {
        let (memory, session_id) = (self.memory.clone(), self.conn().session_id);
        self.runtime.spawn(async move {
            let ring_id = ring.id;
            let gone = memory.clone().deregister_ring(pb::DeregisterRingRequest { session_id, ring_id }).await;
            let region_id = ring.region.id;
            let freed = match gone {
                Ok(_) => memory.clone().deregister_region(pb::DeregisterRegionRequest { session_id, region_id }).await,
                Err(e) => Err(e),
            };
            match freed {
                Ok(_) => tracing::debug!(ring = ring_id, "an idle ring given back to the agent"),
                Err(e) => tracing::debug!(ring = ring_id, error = %e, "an idle ring could not be given back"),
            }
            drop(ring); // unmapped only after the agent forgot it
        });
    }

    /// Publish `sq_tail` on `ring` and ring the agent's doorbell unless it polls the
    /// ring by itself.
    fn ring_doorbell(&self, ring: &Ring, sq_tail: u64) -> Result<()> {
        ring.publish(sq_tail);
        // Pairs with the agent's fence between clearing agent_polling and its last look
        // at sq_tail: if it still polls, it will see this tail without a doorbell.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if !HostRing::needs_doorbell(ring.agent_polling()) {
            return Ok(());
        }
        let conn = self.conn.read().unwrap_or_else(|p| p.into_inner());
        if conn.generation != ring.generation {
            return Ok(()); // the waiter moves the entries to a ring of the new session
        }
        let _turn = self.doorbell.lock().unwrap_or_else(|p| p.into_inner());
        let rung =
            conn.endpoint.send_doorbell(&wire::Doorbell { session_id: conn.session_id, ring_id: ring.id }.encode());
        if let Err(e) = rung {
            if !self.live.options.enabled() {
                return Err(Error::DataPlane { op: "ring the doorbell".into(), reason: e.to_string() });
            }
            // The agent may be gone: find out, and resubmit on the next session if so.
            tracing::debug!(error = %e, "doorbell failed; probing the agent");
            self.live.suspect();
            return Ok(());
        }
        // Push the doorbell out now (on shared memory nobody else progresses this side).
        self.worker.progress();
        Ok(())
    }

    /// A batch on a ring of its own (see [`Batch`]).
    pub(crate) fn batch(self: &Arc<Self>) -> Result<Batch> {
        let ring = self.take_ring()?;
        Ok(Batch { dp: self.clone(), ring: Some(ring), lost: Vec::new(), quiet: Default::default() })
    }

    /// Submit `requests` (any number: they go in ring-sized waves) and wait for all of
    /// them. Blocking; never call from an async task (use `spawn_blocking`).
    pub(crate) fn run(self: &Arc<Self>, requests: &[Request]) -> Result<Vec<Done>> {
        if let Some(status) = self.ended() {
            return Err(Error::from_status("submit", status));
        }
        let mut batch = self.batch()?;
        let mut done = Vec::with_capacity(requests.len());
        let mut next = 0;
        while done.len() < requests.len() {
            while next < requests.len() && batch.room() > 0 {
                batch.push(&requests[next])?;
                next += 1;
            }
            batch.submit()?;
            done.extend(batch.wait(1, self.options.timeout)?);
        }
        Ok(done)
    }

    /// The session ended on the agent (`status` says why): waits on its rings stop.
    pub(crate) fn session_ended(&self, status: tonic::Status) {
        *self.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
    }

    /// Whether the session is known to have ended on the agent.
    pub(crate) fn is_ended(&self) -> bool {
        self.ended().is_some()
    }

    fn ended(&self) -> Option<tonic::Status> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn transport(&self) -> TransportInfo {
        TransportInfo::of(&self.worker, &self.conn().endpoint)
    }

    pub(crate) fn stats(&self) -> DataPlaneStats {
        let progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        DataPlaneStats { progress_cpu: progress.as_ref().map(|p| p.report().cpu_time).unwrap_or_default() }
    }
}
