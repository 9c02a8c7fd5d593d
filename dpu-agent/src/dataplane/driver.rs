//! The engine thread, the data plane's driver: it reads doorbells, ring indices and
//! entries (mapped loads or gets), hands what it read to the ring protocol
//! ([`protocol`]) and to [`readiness`], and performs what they answer: backend calls
//! ([`super::execute`]), completions, the polling and futex words ([`host_memory`]),
//! mapped requests to the I/O threads ([`super::io`]) and queued ones to the QoS
//! scheduler; then it waits on the transport.
//!
//! One engine thread owns the staging regions and does all ring work; nothing it reads
//! from a host is trusted (see the ring protocol), and a host whose transfer fails has
//! its data plane closed, never the agent's.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dpuio_proto::wire::{self, MetaSubmission, Submission};
use fabric::Transport;
use fabric::any;

use super::execute::Exec;
use super::host_memory::{self, HostAccess, HostRing, LentRegions, Peer, STAGING_PAIRS, StagingPairs};
use super::io::{self, AnswerInto, Job, Memory, MetaCall, Offloaded};
use super::meta;
use super::policy::{self, Placement};
use super::protocol::{self, Action, Count, Ran, RingMemory};
use super::readiness::{Idle, Readiness, RingKey};
use super::registry::DataPlaneError;
use super::sessions::{Agent, Session};
use super::staged::{MetaEntry, Pending, RingCompletions, StagedIo, WaitingMeta};
use crate::metrics::{BackendTimes, Metrics, Op};
use crate::qos::{Scheduler, TenantSlot};
use crate::runtime::lock;

/// How long the engine sleeps at a time while a transport whose event fd does not
/// report doorbells (libfabric shm) has peers: their doorbells are seen by polling.
const NO_FD_SLICE: Duration = Duration::from_millis(1);
/// How long the engine keeps polling after its last piece of work while such a
/// transport has peers (a host at queue depth 1 submits again within this).
const NO_FD_SPIN: Duration = Duration::from_micros(500);
/// Queued requests the engine runs before it looks at the rings again.
const QUEUE_BATCH: usize = 64;

/// The engine's view of one worker: its staging region for put/get, and whether any
/// session uses it.
pub(super) struct EngineLane {
    pub(super) worker: Arc<any::Worker>,
    pub(super) staging: any::Region,
    pub(super) lent: LentRegions,
    pub(super) pairs: StagingPairs,
    pub(super) peers: Arc<AtomicU64>,
}

pub(super) struct Engine {
    pub(super) agent: Arc<Agent>,
    pub(super) lanes: Vec<EngineLane>,
    pub(super) chunk_bytes: usize,
    pub(super) stop: Arc<AtomicBool>,
    /// Pieces of requests, for the I/O workers (bounded: in-flight work is).
    pub(super) jobs: crossbeam_channel::Sender<Job>,
    /// Requests of put/get hosts on the I/O threads, through staged-I/O memory.
    pub(super) staged: StagedIo,
    /// The workers' queues keep many pieces in flight (the backend has asynchronous
    /// I/O): hand them every piece, none inline.
    pub(super) io_overlaps: bool,
    pub(super) qos: Arc<Mutex<Scheduler<Queued>>>,
    /// Cores to run a request's pieces on (the engine's and the I/O threads').
    pub(super) cores: u64,
    /// How long to keep polling after the last piece of work before sleeping (a
    /// doorbell arriving meanwhile costs no wake-up): `[data_plane] idle_poll_us`.
    pub(super) idle_poll: Duration,
    /// Agent-wide figures (doorbells, rings, peers); requests count through their
    /// session's tenant handle.
    pub(super) metrics: Arc<Metrics>,
    /// The backend calls the engine makes itself (inline requests).
    pub(super) backend_times: BackendTimes,
    /// Whose rings the engine served lately ([`Neighbours::isolate`]).
    pub(super) neighbours: Neighbours,
}

/// How long after serving another tenant's ring the engine counts it as in use
/// ([`Neighbours::isolate`]): a job's next call follows its last within this while it is
/// busy.
const NEIGHBOURS_FOR: Duration = Duration::from_millis(100);

/// Which tenant's ring the engine served last, and until when another tenant counts as
/// in use, so that the engine knows whether anyone would wait for it.
#[derive(Default)]
pub(super) struct Neighbours {
    last: String,
    until: Option<Instant>,
}

impl Neighbours {
    /// A batch of `tenant`'s ring is served: whether its metadata entries go to threads
    /// of their own. A tenant whose calls its worker process makes (`in_worker`) has them
    /// made off the engine while another tenant's ring was served within
    /// [`NEIGHBOURS_FOR`]: a worker may stop answering for seconds (until it is taken as
    /// lost and replaced), and the engine, which serves every ring, must not wait for it
    /// then. Alone, the tenant has its calls made on the engine, which then holds up no
    /// one else, and saves the hand-off (a thread's wake-up and the engine's own, per
    /// call: 0.6x of the rate of stat, create and remove here).
    fn isolate(&mut self, tenant: &str, in_worker: bool) -> bool {
        if self.last != tenant {
            if !self.last.is_empty() {
                self.until = Some(Instant::now() + NEIGHBOURS_FOR);
            }
            tenant.clone_into(&mut self.last);
        }
        in_worker && self.until.is_some_and(|until| Instant::now() < until)
    }
}

/// A ring being served, with what its entries need: session, peer and tenant.
struct Serving {
    key: RingKey,
    session: Arc<Session>,
    peer: Arc<Peer>,
    ring: Arc<HostRing>,
    /// `None`: the session's tenant is no longer configured (removed at run time).
    tenant: Option<Arc<TenantSlot>>,
}

/// A validated entry waiting in the scheduler; it already has its completion slot and
/// counts in its tenant's in-flight requests.
pub(super) struct Queued {
    serving: Arc<Serving>,
    /// Its wait in the queue, from when it was taken, is QoS throttling.
    taken: Taken,
}

/// A validated entry taken off a ring: the request, its completion slot, and when it
/// was taken (its latency counts from there).
#[derive(Clone, Copy)]
struct Taken {
    sub: Submission,
    cq_index: u64,
    at: Instant,
}

impl Engine {
    pub fn run(&mut self) {
        let mut bells = Vec::new();
        // Which rings to look at when; hot rings are polled directly while the engine
        // spins, with agent_polling set so their hosts skip the doorbell.
        let mut ready: Readiness<Arc<HostRing>, Arc<TenantSlot>> = Readiness::new(Instant::now());
        while !self.stop.load(Ordering::SeqCst) {
            bells.clear();
            for lane in &self.lanes {
                while lane.worker.progress() > 0 {}
                if lane.worker.take_doorbells(&mut bells) > 0 {
                    ready.lost_doorbells();
                }
            }
            if self.finish_staged() {
                ready.worked(Instant::now());
            }
            self.expire_staged();
            for bell in &bells {
                match wire::Doorbell::decode(bell.as_bytes()) {
                    Some(d) => ready.ready((d.session_id, d.ring_id)),
                    None => {
                        self.metrics.undecodable_doorbells.inc();
                        tracing::debug!("malformed doorbell ignored");
                    }
                }
            }
            if ready.scan_due() {
                for key in self.agent.all_rings() {
                    ready.ready(key);
                }
                self.drop_removed_tenants();
                ready.scanned(Instant::now());
            }
            ready.poll_hot(|ring| host_memory::ring_has_work(ring));
            ready.unpark(|tenant| tenant.room());
            let queued_wait = self.queued_wait();
            let spin = if self.polls_for_doorbells() { NO_FD_SPIN.max(self.idle_poll) } else { self.idle_poll };
            match ready.idle(Instant::now, queued_wait, spin) {
                Idle::Work => {}
                Idle::Spin => {
                    std::hint::spin_loop();
                    continue;
                }
                Idle::Sleep => {
                    // Going to sleep: hosts must ring again. Clear the flags, then look
                    // once more (pairs with the host's fence after publishing sq_tail).
                    for (_, ring) in ready.hot() {
                        host_memory::set_polling(ring, false);
                    }
                    std::sync::atomic::fence(Ordering::SeqCst);
                    if ready.cool(|ring| host_memory::ring_has_work(ring)) {
                        continue;
                    }
                    if let Err(e) = self.wait(ready.sleep_for(Instant::now(), queued_wait)) {
                        tracing::error!(error = %e, "engine cannot wait on the transport; polling");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    ready.woke(Instant::now());
                    continue;
                }
            }
            let serving = self.resolve(ready.take_pending());
            let tenants = serving.iter().map(|s| s.tenant.as_ref().map(|t| (Arc::as_ptr(t), t.is_unlimited())));
            let direct = policy::runs_direct(queued_wait.is_none(), tenants);
            for s in serving {
                let key = s.key;
                if let Some(tenant) = &s.tenant
                    && tenant.room() == 0
                {
                    park(&mut ready, &s, tenant);
                    continue;
                }
                if s.ring.region.mapped.is_some() && !ready.is_hot(key) {
                    host_memory::set_polling(&s.ring, true);
                    ready.heat(key, s.ring.clone());
                }
                match self.serve_ring(&s, direct) {
                    Ok(true) => match &s.tenant {
                        Some(tenant) if tenant.room() == 0 => park(&mut ready, &s, tenant),
                        _ => ready.ready(key), // more waiting: come back after the others
                    },
                    Ok(false) => {}
                    Err(e) => s.peer.fail(&self.metrics, s.session.id, &e),
                }
            }
            self.serve_queue(QUEUE_BATCH);
            self.staged.send_to_workers();
        }
        for (_, ring) in ready.hot() {
            host_memory::set_polling(ring, false);
        }
    }

    /// The engine's access to `peer`'s memory, through the staging region of its lane.
    fn host<'a>(&'a mut self, peer: &'a Peer) -> HostAccess<'a> {
        let lane = &mut self.lanes[peer.lane];
        HostAccess { peer, staging: &mut lane.staging, lent: &mut lane.lent, pairs: &mut lane.pairs }
    }

    /// What runs a request of `peer` here.
    fn exec<'a>(&'a mut self, peer: &'a Peer) -> Exec<'a> {
        let lane = &mut self.lanes[peer.lane];
        Exec {
            host: HostAccess { peer, staging: &mut lane.staging, lent: &mut lane.lent, pairs: &mut lane.pairs },
            agent: &*self.agent,
            chunk_bytes: self.chunk_bytes,
            times: &self.backend_times,
        }
    }

    /// Whether a worker with peers does not wake the engine on their doorbells
    /// (libfabric shm): the engine then polls for them.
    fn polls_for_doorbells(&self) -> bool {
        self.lanes.iter().any(|l| !l.worker.wakes_on_receive() && l.peers.load(Ordering::Relaxed) > 0)
    }

    /// Sleep until a worker has work or is woken, or `timeout` passes (at most
    /// [`NO_FD_SLICE`] while [`Engine::polls_for_doorbells`]).
    fn wait(&self, mut timeout: Duration) -> Result<bool, fabric::Error> {
        if self.polls_for_doorbells() {
            timeout = timeout.min(NO_FD_SLICE);
        }
        let workers: Vec<&any::Worker> = self.lanes.iter().map(|l| &*l.worker).collect();
        fabric::wait_any_or(&workers, &self.staged.worker_fds(), timeout)
    }

    /// The rings behind `keys` that still exist and are served, with their tenants.
    fn resolve(&self, keys: impl Iterator<Item = RingKey>) -> Vec<Arc<Serving>> {
        let rings: Vec<_> = keys
            .filter_map(|key| {
                let (session, peer, ring) = self.agent.ring(key.0, key.1)?;
                peer.serves(&ring).then_some((key, session, peer, ring))
            })
            .collect();
        if rings.is_empty() {
            return Vec::new();
        }
        let now = Instant::now();
        let mut scheduler = lock(&self.qos);
        rings
            .into_iter()
            .map(|(key, session, peer, ring)| {
                let tenant = scheduler.slot(&session.tenant, now, || self.agent.tenant(&session.tenant).map(|t| t.qos));
                Arc::new(Serving { key, session, peer, ring, tenant })
            })
            .collect()
    }

    /// How long until a queued request may run (`None`: nothing queued).
    fn queued_wait(&self) -> Option<Duration> {
        let mut scheduler = lock(&self.qos);
        if scheduler.is_empty() {
            return None;
        }
        scheduler.next_ready_in(Instant::now())
    }

    /// Forget tenants removed from the agent; their queued requests complete as
    /// cancelled.
    fn drop_removed_tenants(&mut self) {
        let dropped = lock(&self.qos).retain_tenants(|name| self.agent.has_tenant(name));
        for q in dropped {
            let s = &q.serving;
            let Taken { sub, cq_index, .. } = q.taken;
            s.session.metrics.completed(Op::of(sub.opcode), wire::Status::Cancelled);
            let completion = protocol::completion(sub.user_data, cq_index, wire::Status::Cancelled, 0);
            if let Some(tenant) = &s.tenant {
                let _ = tenant.finish(1); // the tenant is gone: nobody waits for its room
            }
            match self.host(&s.peer).post_completion(&s.ring, cq_index, &completion) {
                Ok(()) => host_memory::wake_waiters(&s.ring),
                Err(e) => s.peer.fail(&self.metrics, s.session.id, &DataPlaneError::from(e)),
            }
        }
    }

    /// Run up to `budget` queued requests in the scheduler's order.
    fn serve_queue(&mut self, budget: usize) {
        let mut posted: Vec<Arc<HostRing>> = Vec::new();
        for _ in 0..budget {
            let next = {
                let mut scheduler = lock(&self.qos);
                if scheduler.is_empty() {
                    break;
                }
                scheduler.pop(Instant::now())
            };
            let Some(q) = next else { break }; // every queued tenant is over its rate
            let s = &q.serving;
            let Some(tenant) = &s.tenant else { continue }; // only known tenants are queued
            if !s.peer.serves(&s.ring) {
                let _ = tenant.finish(1); // its host is gone; the engine is running anyway
                continue;
            }
            let Taken { sub, cq_index, at } = q.taken;
            s.session.metrics.throttled(at.elapsed());
            let ran = self.run_entry(s, tenant, &q.taken).and_then(|ran| {
                let Ran::Done { status, result } = ran else { return Ok(false) };
                let completion = protocol::completion(sub.user_data, cq_index, status, result);
                self.host(&s.peer).post_completion(&s.ring, cq_index, &completion)?;
                Ok(true)
            });
            match ran {
                Ok(false) => {}
                Ok(true) => {
                    if !posted.iter().any(|r| Arc::ptr_eq(r, &s.ring)) {
                        posted.push(s.ring.clone());
                    }
                }
                Err(e) => s.peer.fail(&self.metrics, s.session.id, &e),
            }
        }
        for ring in posted {
            host_memory::wake_waiters(&ring);
        }
    }

    /// Run one validated entry that counts in `tenant`'s in-flight requests: on the I/O
    /// workers (they post its completion), or here (its completion is the caller's to
    /// post).
    fn run_entry(&mut self, s: &Arc<Serving>, tenant: &Arc<TenantSlot>, taken: &Taken) -> Result<Ran, DataPlaneError> {
        if self.hand_off(s, taken, tenant)? {
            return Ok(Ran::OnWorkers);
        }
        let session = &*s.session;
        let outcome = self.exec(&s.peer).execute(session, &taken.sub);
        // Parked rings are looked at by this thread on its next round: no wake needed.
        let _ = tenant.finish(1);
        let (status, result) = outcome?;
        session.metrics.request(Op::of(taken.sub.opcode), status, result, taken.at.elapsed());
        Ok(Ran::Done { status, result })
    }

    /// Serve one ring once through its protocol machine ([`protocol::Batch`]): take up
    /// to [`protocol::RING_BATCH`] submissions (no more than its tenant has room for); invalid ones
    /// complete with their error at once; valid ones run now (`direct`) or go to the
    /// scheduler. Returns whether more remain.
    fn serve_ring(&mut self, s: &Arc<Serving>, direct: bool) -> Result<bool, DataPlaneError> {
        let (session, peer, ring) = (&*s.session, &*s.peer, &s.ring);
        let base = ring.offset;
        let remote = !ring.region.is_mapped();
        let (sq_tail, cq_head) = if remote {
            // One get for both indices (a round trip each over TCP).
            let mut lines = [0u8; wire::CQ_HEAD_OFFSET + 8 - wire::SQ_TAIL_OFFSET];
            self.host(peer).read(&ring.region, base + wire::SQ_TAIL_OFFSET as u64, &mut lines)?;
            let word =
                |at: usize| u64::from_le_bytes(lines[at - wire::SQ_TAIL_OFFSET..][..8].try_into().expect("8 bytes"));
            (word(wire::SQ_TAIL_OFFSET), word(wire::CQ_HEAD_OFFSET))
        } else {
            let sq_tail = self.host(peer).load_u64(&ring.region, base + wire::SQ_TAIL_OFFSET as u64)?;
            (sq_tail, self.host(peer).load_u64(&ring.region, base + wire::CQ_HEAD_OFFSET as u64)?)
        };
        let cursor = protocol::Cursor {
            sq_head: ring.sq_head.load(Ordering::Relaxed),
            cq_tail: ring.cq_tail.load(Ordering::Relaxed),
        };
        let tenant = protocol::Tenant::of(s.tenant.as_ref().map(|t| t.room()), direct);
        // A backend with asynchronous I/O (DAOS) is storage across a network that can go
        // silent: the engine leaves every mapped open-read to the I/O threads.
        let memory = match (ring.region.is_mapped(), self.io_overlaps) {
            (true, false) => RingMemory::Mapped,
            (true, true) => RingMemory::MappedStalling,
            (false, false) => RingMemory::Remote,
            (false, true) => RingMemory::RemoteStalling,
        };
        let mut batch = match cursor.serve(ring.entries, memory, protocol::HostIndices { sq_tail, cq_head }, tenant) {
            protocol::Serve::Batch(batch) if self.neighbours.isolate(&session.tenant, session.in_worker) => {
                batch.offloading_every_meta()
            }
            protocol::Serve::Batch(batch) => batch,
            protocol::Serve::Idle => return Ok(false),
            protocol::Serve::Broken => {
                ring.broken.store(true, Ordering::Relaxed);
                self.metrics.broken_rings.inc();
                tracing::warn!(
                    session = format!("{:#018x}", session.id),
                    ring = ring.id,
                    sq_tail,
                    cq_head,
                    "ring indices out of range: the host broke the ring protocol; ring no longer served"
                );
                return Ok(false);
            }
        };
        let mut entry = [0u8; wire::SQE_BYTES];
        // Remote rings: the published entries, fetched with one get from the first
        // fetch's index up to sq_tail (or the ring's end), and completions posted in
        // groups (`HostAccess::post_completions`) once STAGING_PAIRS requests' payload
        // is out, and at the batch's end.
        let mut fetched: (u64, Vec<u8>) = (0, Vec::new());
        let mut posting: Vec<(u64, wire::Completion)> = Vec::new();
        // This batch's entries handed off the engine (see AnswerInto::Mapped).
        let mut group: Option<Arc<AtomicUsize>> = None;
        // Counted when pushed to the scheduler at the end: a transfer failure before
        // then must not leave them counted.
        let mut queued = Vec::new();
        // The batch's entries were all waiting when it began: their latency counts from
        // here (one clock read a batch, not one an entry).
        let taken_at = Instant::now();
        while let Some(action) = batch.poll() {
            let performed = match (action, &s.tenant) {
                (Action::Fetch { index }, _) if remote => {
                    let (first, entries) = &mut fetched;
                    let have = (entries.len() / wire::SQE_BYTES) as u64;
                    let read = if index.wrapping_sub(*first) < have {
                        Ok(())
                    } else {
                        // Published entries from `index` on, no further than the ring's
                        // end (the window was checked: sq_tail - index <= entries).
                        let to_end = u64::from(ring.entries) - (index & (u64::from(ring.entries) - 1));
                        let n = sq_tail.wrapping_sub(index).clamp(1, to_end.min(protocol::RING_BATCH));
                        *first = index;
                        entries.resize(n as usize * wire::SQE_BYTES, 0);
                        let at = base + wire::sqe_offset(ring.entries, index) as u64;
                        self.host(peer).read_range(&ring.region, at, entries)
                    };
                    read.map_err(DataPlaneError::from).map(|()| {
                        let i = index.wrapping_sub(fetched.0) as usize * wire::SQE_BYTES;
                        entry.copy_from_slice(&fetched.1[i..i + wire::SQE_BYTES]);
                        batch.fetched(&entry, session, self.agent.limits().max_io_bytes);
                    })
                }
                (Action::Fetch { index }, _) => {
                    let at = base + wire::sqe_offset(ring.entries, index) as u64;
                    self.host(peer).read(&ring.region, at, &mut entry).map_err(DataPlaneError::from).map(|()| {
                        batch.fetched(&entry, session, self.agent.limits().max_io_bytes);
                    })
                }
                (Action::Run { sub, cq_index }, Some(tenant)) => {
                    tenant.start(1);
                    let taken = Taken { sub, cq_index, at: taken_at };
                    self.run_entry(s, tenant, &taken).map(|ran| batch.ran(ran))
                }
                (Action::Queue { sub, cq_index }, Some(_)) => {
                    queued.push(Queued { serving: s.clone(), taken: Taken { sub, cq_index, at: taken_at } });
                    Ok(())
                }
                // Not given (a removed tenant is Tenant::Removed: its entries are
                // cancelled), but if it were, the host still gets its completion.
                (Action::Run { sub, .. }, None) => {
                    session.metrics.completed(Op::of(sub.opcode), wire::Status::Cancelled);
                    batch.ran(Ran::Done { status: wire::Status::Cancelled, result: 0 });
                    Ok(())
                }
                (Action::Queue { sub, cq_index }, None) => {
                    session.metrics.completed(Op::of(sub.opcode), wire::Status::Cancelled);
                    let completion = protocol::completion(sub.user_data, cq_index, wire::Status::Cancelled, 0);
                    self.host(peer).post_completion(ring, cq_index, &completion).map_err(DataPlaneError::from)
                }
                (Action::Offload { meta, cq_index }, _) => {
                    self.hand_off_meta(s, &meta, cq_index, &mut group).map(|taken| batch.offloaded(taken))
                }
                // Counted as it runs (run_meta).
                (Action::Meta { meta, .. }, _) => self
                    .exec(peer)
                    .run_meta(session, &meta)
                    .map(|(status, result)| batch.ran(Ran::Done { status, result })),
                (Action::Complete { index, completion, count }, _) => {
                    if let Count::Refused { opcode, status } = count {
                        session.metrics.completed(opcode.map_or(Op::Unknown, Op::of), status);
                    }
                    if remote {
                        posting.push((index, completion));
                        if posting.len() < STAGING_PAIRS {
                            Ok(())
                        } else {
                            let posted = self.host(peer).post_completions(ring, &posting);
                            posting.clear();
                            posted.map_err(DataPlaneError::from)
                        }
                    } else {
                        self.host(peer).post_completion(ring, index, &completion).map_err(DataPlaneError::from)
                    }
                }
                (Action::Finish { cursor, wake, more }, _) => {
                    if let Err(e) = self.host(peer).post_completions(ring, &posting) {
                        batch.transfer_failed();
                        return Err(e.into());
                    }
                    ring.sq_head.store(cursor.sq_head, Ordering::Relaxed);
                    ring.cq_tail.store(cursor.cq_tail, Ordering::Relaxed);
                    // Open-reads still running on the I/O threads: the last of them wakes
                    // the host, for the completions posted here too (one wake-up for the
                    // batch). The fence orders this batch's completions before the load,
                    // against the workers' decrements.
                    let workers_wake = group.as_ref().is_some_and(|g| {
                        std::sync::atomic::fence(Ordering::SeqCst);
                        g.load(Ordering::SeqCst) > 0
                    });
                    return self.finish_batch(s, cursor.sq_head, queued, wake && !workers_wake, more);
                }
            };
            if let Err(e) = performed {
                // The host is gone: the batch asks for nothing more and the ring keeps
                // its cursor; the caller closes the peer's data plane.
                batch.transfer_failed();
                return Err(e);
            }
        }
        Ok(false) // not reached: a batch ends with Finish unless a transfer failed
    }

    /// The end of a ring's batch: queue its valid entries in the scheduler, store the
    /// advisory `sq_head`, wake the host's waiters if a completion was posted.
    fn finish_batch(
        &mut self,
        s: &Serving,
        sq_head: u64,
        queued: Vec<Queued>,
        mut wake: bool,
        more: bool,
    ) -> Result<bool, DataPlaneError> {
        let (peer, ring) = (&*s.peer, &s.ring);
        if let (false, Some(tenant)) = (queued.is_empty(), &s.tenant) {
            let mut refused = Vec::new();
            {
                let mut scheduler = lock(&self.qos);
                for q in queued {
                    let cost = q.taken.sub.length;
                    match scheduler.push(tenant, q, cost) {
                        Ok(()) => tenant.start(1),
                        Err(q) => refused.push(q),
                    }
                }
            }
            // Only when the tenant's max_inflight was lowered below its queue at run
            // time: the host may submit again.
            for q in refused {
                let Taken { sub, cq_index, .. } = q.taken;
                s.session.metrics.completed(Op::of(sub.opcode), wire::Status::Busy);
                let completion = protocol::completion(sub.user_data, cq_index, wire::Status::Busy, 0);
                self.host(peer).post_completion(ring, cq_index, &completion)?;
                wake = true;
            }
        }
        // Advisory for the host (it trusts the seq words, not this).
        self.host(peer).store_u64(&ring.region, ring.offset + wire::SQ_HEAD_OFFSET as u64, sq_head)?;
        if wake {
            host_memory::wake_waiters(ring);
        }
        Ok(more)
    }

    /// Hand a request to the I/O threads where [`policy::place`] puts it: they run its
    /// pieces and post its completion (mapped), or hand it back for its puts and
    /// completion ([`super::staged`]). `Ok(false)` when it runs here; an `Err` is a
    /// transfer failure (the request is finished).
    fn hand_off(&mut self, s: &Arc<Serving>, taken: &Taken, tenant: &Arc<TenantSlot>) -> Result<bool, DataPlaneError> {
        let (session, ring) = (&*s.session, &s.ring);
        let Taken { sub, cq_index, at: taken_at } = *taken;
        let Some(region) = session.host_region(sub.region_id) else { return Ok(false) };
        let Ok(handle) = session.handle(sub.handle) else { return Ok(false) };
        let mapped = region.is_mapped() && ring.region.is_mapped();
        // An object lending memory of its own for put/get moves its bytes from there, on
        // the engine; but a tenant DAOS worker's goes to the worker, its slots in the
        // worker's staging ([`super::to_worker`]).
        let object = &*handle.object;
        let overlaps =
            self.io_overlaps && (mapped || !object.lends_staging() || dpuio_worker::direct::is_worker(object));
        let (pieces, engine_first) = match policy::place(&sub, mapped, overlaps, self.cores, self.chunk_bytes as u64) {
            Placement::Here => return Ok(false),
            Placement::Staged { pieces } => {
                let p = Pending {
                    session_id: session.id,
                    peer: s.peer.clone(),
                    ring: ring.clone(),
                    metrics: session.metrics.clone(),
                    tenant: tenant.clone(),
                    sub,
                    cq_index,
                    taken_at,
                    region,
                    handle,
                    pieces,
                };
                return Ok(self.staged.take(p)?);
            }
            Placement::Workers { pieces, engine_first } => (pieces, engine_first),
        };
        let request = Offloaded {
            session_id: session.id,
            ring: ring.clone(),
            region,
            memory: Memory::Mapped,
            handle,
            sub,
            cq_index,
            tenant: tenant.clone(),
            engine: self.lanes[0].worker.clone(),
            metrics: session.metrics.clone(),
            taken_at,
        };
        io::hand_off(&self.jobs, request, &pieces, engine_first, &self.backend_times);
        Ok(true)
    }

    /// Hand the metadata entry `m` off the engine ([`io::hand_off_meta`]), as the ring
    /// protocol asked: its request is copied out of host memory and decoded here.
    /// `Ok(false)` when it cannot go (a range deregistered since, a request that does not
    /// decode, a put/get host's answer range longer than its lane's staged-I/O slots): it
    /// then runs here (refused with its reason where it cannot run). An `Err` is a
    /// transfer failure (the host is gone).
    fn hand_off_meta(
        &mut self,
        s: &Serving,
        m: &MetaSubmission,
        cq_index: u64,
        group: &mut Option<Arc<AtomicUsize>>,
    ) -> Result<bool, DataPlaneError> {
        let Some(answer) = s.session.host_region(m.answer_region) else { return Ok(false) };
        let mapped = answer.is_mapped() && s.ring.region.is_mapped();
        let mut bytes = vec![0u8; m.request_length as usize];
        if m.request_length > 0 {
            let Some(request) = s.session.host_region(m.request_region) else { return Ok(false) };
            self.host(&s.peer).read_range(&request, m.request_offset, &mut bytes)?;
        }
        let Ok(asked) = meta::request(m, &bytes) else { return Ok(false) };
        let (agent, chunk_bytes, in_worker) = (self.agent.clone(), self.chunk_bytes, s.session.in_worker);
        let (session_id, metrics, ring, m) = (s.session.id, s.session.metrics.clone(), s.ring.clone(), *m);
        let job = move |into| MetaCall {
            agent,
            session_id,
            metrics,
            ring,
            answer,
            meta: m,
            asked,
            cq_index,
            chunk_bytes,
            into,
            in_worker,
        };
        if !mapped {
            let entry =
                MetaEntry { peer: s.peer.clone(), ring: s.ring.clone(), session_id, user_data: m.user_data, cq_index };
            let job = Box::new(move |staged| job(AnswerInto::Staged(staged)));
            let o = WaitingMeta { entry, answer_length: m.answer_length, job };
            return Ok(self.staged.take_meta(o).is_ok());
        }
        let group = group.get_or_insert_with(Default::default).clone();
        group.fetch_add(1, Ordering::AcqRel);
        io::hand_off_meta(&self.jobs, job(AnswerInto::Mapped { group }));
        Ok(true)
    }
}

/// Leave a ring alone until its tenant has room: no polling (its host rings the
/// doorbell again), and a wake from the request that makes room.
fn park(ready: &mut Readiness<Arc<HostRing>, Arc<TenantSlot>>, s: &Serving, tenant: &Arc<TenantSlot>) {
    tenant.park();
    if let Some(ring) = ready.park(s.key, tenant.clone()) {
        host_memory::set_polling(&ring, false);
    }
}

impl Engine {
    /// Finish the staged requests the I/O threads handed back ([`super::staged`]): the
    /// completions of each ring posted together (one flush for their puts), their slots
    /// freed, then the requests that waited for slots started. Whether any came back.
    fn finish_staged(&mut self) -> bool {
        let Some(finished) = self.staged.finished(&self.metrics) else { return false };
        self.post_staged(&finished.rings);
        drop(finished);
        self.staged.start_waiting(&self.metrics);
        self.staged.send_to_workers();
        true
    }

    /// Answer the staged requests and open-reads the backend's deadline passed for
    /// (`UNAVAILABLE`, [`StagedIo::expire`]).
    fn expire_staged(&mut self) {
        let rings = self.staged.expire();
        if !rings.is_empty() {
            self.post_staged(&rings);
        }
    }

    /// Post staged completions, each ring's together.
    fn post_staged(&mut self, rings: &[RingCompletions]) {
        for c in rings {
            match self.host(&c.peer).post_completions(&c.ring, &c.completions) {
                Ok(()) => host_memory::wake_waiters(&c.ring),
                Err(e) => c.peer.fail(&self.metrics, c.session_id, &DataPlaneError::from(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_tenant_is_isolated_only_while_another_tenant_was_served_lately() {
        let mut n = Neighbours::default();
        // Alone: its calls stay on the engine; a tenant without a worker never moves.
        assert!(!n.isolate("a", true));
        assert!(!n.isolate("a", true));
        // b served: a's next batches go off the engine, b's never (no worker).
        assert!(!n.isolate("b", false));
        assert!(n.isolate("a", true));
        assert!(n.isolate("a", true));
        // b not served for longer than NEIGHBOURS_FOR: alone again.
        std::thread::sleep(NEIGHBOURS_FOR + Duration::from_millis(20));
        assert!(!n.isolate("a", true));
    }
}
