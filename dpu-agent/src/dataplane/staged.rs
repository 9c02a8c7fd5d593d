//! Staged requests on the I/O threads: payload requests and open-reads of hosts reached
//! with put/get (TCP, RDMA: a DPU's hosts) over a backend with asynchronous I/O (DAOS).
//!
//! Each lane has staged-I/O memory of its own (`dpuio-staged-io`, slots of a chunk,
//! registered with the lane's worker once, when first needed). The engine takes a slot
//! per piece of a request (a write's bytes got from the host into them first) and hands
//! the pieces to the I/O threads, which read into (write from) the slots on their event
//! queues, many in flight. The last piece hands the request back ([`Back`]); the engine
//! puts a read's bytes from the slots to the host, posts the completions of what came
//! back together (one flush for all), and the slots are free again. A request of more
//! pieces than its lane has slots runs in rounds, each of half the slots, its bytes put
//! to (got from) the host before the next starts (the rest of the slots keep other
//! requests going beside it). An open-read (and any metadata entry of a tenant whose
//! calls its worker process makes) takes slots for its answer range, laid end to end: an
//! I/O thread (a thread of its own, [`io::hand_off_meta`]) runs its namespace call and
//! writes the answer (an open-read's header and file bytes) or the error record there,
//! and the engine puts them to the host. Requests and open-reads that find too few slots free
//! wait in their lane's queue, in order. So the engine does no storage I/O for such
//! rings' payload and samples: their reads overlap in storage as a mapped ring's do,
//! and a read DAOS keeps does not hold up the engine, which serves every host of every
//! transport.
//!
//! Where the backend keeps a deadline ([`dpuio_backend::IoQueue::deadline`]: DAOS's
//! `call_timeout_seconds`), a request whose round storage has not answered by then, and
//! a request or open-read that waited that long for slots, is answered `UNAVAILABLE`
//! (every engine lost): the host's call ends rather than waits for DAOS. A round's
//! slots stay with storage, which may still write them, until it answers; its
//! completion is then dropped.
//!
//! Not here: where a request runs ([`super::policy::place`]: objects that lend memory
//! of their own, a tenant DAOS worker's, and backends without asynchronous I/O stay on
//! the engine, [`super::execute`], as do open-reads whose answer range is longer than
//! a lane's slots and every request of a lane whose transport refused the memory), and
//! the I/O threads ([`super::io`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpuio_backend::LentMemory;
use dpuio_proto::wire::{self, Opcode, Submission};
use dpuio_worker::staging::{Slot, Staging};
use fabric::any;
use fabric::transport::Endpoint as _;

use super::host_memory::{FLUSH_TIMEOUT, HostRegion, HostRing, Peer};
use super::io::{self, Back, InFlight, Job, Memory, MetaCall, Offloaded, StagedAnswer, StagedMemory};
use super::protocol;
use super::sessions::Handle;
use super::to_worker::ToWorker;
use crate::metrics::{BackendTimes, Metrics, Op, TenantMetrics};
use crate::qos::TenantSlot;
use crate::validate::Chunk;

/// Bytes of a lane's staged-I/O memory, in slots of a chunk (at least
/// [`MIN_SLOTS`], at most [`MAX_SLOTS`]): 32 requests of a chunk or less in flight
/// with 1 MiB chunks, as many as one DAOS event queue keeps.
const STAGED_IO_BYTES: usize = 32 << 20;
const MIN_SLOTS: usize = 8;
const MAX_SLOTS: usize = 64;
/// How often the engine looks for what the backend's deadline passed for, while any
/// staged request is out or waiting.
const EXPIRY_LOOK: Duration = Duration::from_millis(100);

/// A staged request the engine took: what it needs, from its ring to its pieces.
pub(super) struct Pending {
    pub session_id: u64,
    pub peer: Arc<Peer>,
    pub ring: Arc<HostRing>,
    pub metrics: Arc<TenantMetrics>,
    /// Counts it in flight until its completion is posted.
    pub tenant: Arc<TenantSlot>,
    pub sub: Submission,
    pub cq_index: u64,
    pub taken_at: Instant,
    pub region: Arc<HostRegion>,
    pub handle: Arc<Handle>,
    /// The pieces still to run (all of them, or the rounds after those that ran, which
    /// went clean).
    pub pieces: Vec<Chunk>,
}

/// A metadata entry of a put/get host (an open-read; any entry of a worker tenant)
/// waiting for staged-I/O slots for its answer range: the job, once given them.
pub(super) struct WaitingMeta {
    pub entry: MetaEntry,
    pub answer_length: u32,
    pub job: Box<dyn FnOnce(StagedAnswer) -> MetaCall + Send>,
}

/// Where a staged metadata entry's completion goes, for when it is answered without its
/// job.
#[derive(Clone)]
pub(super) struct MetaEntry {
    pub peer: Arc<Peer>,
    pub ring: Arc<HostRing>,
    pub session_id: u64,
    pub user_data: u64,
    pub cq_index: u64,
}

impl WaitingMeta {
    /// The slots of `slot_bytes` its answer range takes.
    fn slots(&self, slot_bytes: usize) -> usize {
        (self.answer_length as usize).div_ceil(slot_bytes)
    }
}

/// What waits in a lane's queue for free slots, in the order the engine took them.
enum Waiting {
    Request(Pending),
    Meta(WaitingMeta),
}

impl Waiting {
    /// The slots it needs to start (a request: its next round's) in a lane of
    /// `lane_slots` slots of `slot_bytes`.
    fn slots(&self, lane_slots: usize, slot_bytes: usize) -> usize {
        match self {
            Waiting::Request(p) => round(p.pieces.len(), lane_slots),
            Waiting::Meta(o) => o.slots(slot_bytes),
        }
    }
}

/// Staged-I/O memory registered with a lane's transport, and what waits for its slots:
/// the lane's own, or a tenant DAOS worker's staging (whose pieces the engine sends to
/// the worker, [`super::to_worker`]).
struct Pool {
    staging: Arc<Staging>,
    region: any::Region,
    /// What waits for slots, and since when.
    pending: VecDeque<(Instant, Waiting)>,
}

impl Pool {
    fn slots(&self) -> usize {
        self.staging.slots()
    }
}

/// One lane's staged-I/O memory, made when first needed, the tenant workers' staging it
/// registered, and the requests waiting for their slots.
struct LaneStaged {
    worker: Arc<any::Worker>,
    own: Option<Pool>,
    /// The memory could not be made or registered: this lane's requests run on the
    /// engine, through its staging pairs (said once in the log).
    refused: bool,
    /// Tenant workers' staging, registered when a request first used it; dropped once
    /// its worker is gone and nothing here holds a slot of it.
    tenants: Vec<Pool>,
}

impl LaneStaged {
    /// The lane's own pool, its memory made and registered with the lane's worker on
    /// first use; `None` where that failed.
    fn own(&mut self, chunk_bytes: usize) -> Option<&mut Pool> {
        if self.own.is_none() && !self.refused {
            let slots = (STAGED_IO_BYTES / chunk_bytes.max(1)).clamp(MIN_SLOTS, MAX_SLOTS);
            let made = Staging::new("dpuio-staged-io", slots, chunk_bytes as u64)
                .map_err(|e| e.to_string())
                .map(Arc::new)
                .and_then(|s| {
                    let lent: Arc<dyn LentMemory> = s.clone();
                    self.worker.register_lent(lent).map(|r| (s, r)).map_err(|e| e.to_string())
                });
            match made {
                Ok((staging, region)) => self.own = Some(Pool { staging, region, pending: VecDeque::new() }),
                Err(e) => {
                    tracing::warn!(error = %e, transport = self.worker.provider(),
                        "the data plane cannot make staged-I/O memory for this transport; \
                         its payload requests run on the engine thread, one at a time");
                    self.refused = true;
                }
            }
        }
        self.own.as_mut()
    }

    /// The pool of a tenant worker's `staging`, registered with the lane's worker on
    /// first use; `None` where that failed (said in the log).
    fn tenant(&mut self, staging: Arc<Staging>) -> Option<&mut Pool> {
        let i = match self.tenants.iter().position(|p| Arc::ptr_eq(&p.staging, &staging)) {
            Some(i) => i,
            None => {
                let lent: Arc<dyn LentMemory> = staging.clone();
                match self.worker.register_lent(lent) {
                    Ok(region) => self.tenants.push(Pool { staging, region, pending: VecDeque::new() }),
                    Err(e) => {
                        tracing::warn!(error = %e, transport = self.worker.provider(),
                            "the data plane cannot register a tenant worker's staging with this transport; \
                             the tenant's payload requests run on the engine thread, one at a time");
                        return None;
                    }
                }
                self.tenants.len() - 1
            }
        };
        self.tenants.get_mut(i)
    }

    fn pools(&self) -> impl Iterator<Item = &Pool> {
        self.own.iter().chain(&self.tenants)
    }

    fn pools_mut(&mut self) -> impl Iterator<Item = &mut Pool> {
        self.own.iter_mut().chain(&mut self.tenants)
    }

    /// The pool whose memory is `staging`.
    fn pool_of(&mut self, staging: &Arc<Staging>) -> Option<&mut Pool> {
        self.pools_mut().find(|p| Arc::ptr_eq(&p.staging, staging))
    }

    /// The registered region of `staging` (registered before any request took a slot).
    fn region(&self, staging: &Arc<Staging>) -> &any::Region {
        &self.pools().find(|p| Arc::ptr_eq(&p.staging, staging)).expect("slots are taken from a registered pool").region
    }

    /// Drop the pools of workers that are gone: nothing but the pool (and its
    /// registration) holds their staging, nothing waits.
    fn drop_gone_workers(&mut self) {
        self.tenants.retain(|p| !p.pending.is_empty() || Arc::strong_count(&p.staging) > 2);
    }
}

/// Add `completion` to `ring`'s in `rings`.
fn add(
    rings: &mut Vec<RingCompletions>,
    ring: &Arc<HostRing>,
    peer: &Arc<Peer>,
    session_id: u64,
    completion: (u64, wire::Completion),
) {
    match rings.iter_mut().find(|c| Arc::ptr_eq(&c.ring, ring)) {
        Some(c) => c.completions.push(completion),
        None => rings.push(RingCompletions {
            ring: ring.clone(),
            peer: peer.clone(),
            session_id,
            completions: vec![completion],
        }),
    }
}

/// The pieces of the next round of a request with `pieces` still to run, in a lane of
/// `lane_slots` slots: all of them where they fit, else half the lane's slots, so that
/// other requests keep going beside a long one.
fn round(pieces: usize, lane_slots: usize) -> usize {
    match pieces <= lane_slots {
        true => pieces,
        false => (lane_slots / 2).max(1),
    }
}

/// A staged metadata entry's `UNAVAILABLE` completion added to `rings` (where its host is served).
fn unavailable_meta(rings: &mut Vec<RingCompletions>, e: &MetaEntry) {
    if e.peer.serves(&e.ring) {
        let completion = protocol::completion(e.user_data, e.cq_index, wire::Status::Unavailable, 0);
        add(rings, &e.ring, &e.peer, e.session_id, (e.cq_index, completion));
    }
}

/// `n` free slots of `staging`, or none (those taken go back).
fn take_slots(staging: &Arc<Staging>, n: usize) -> Option<Vec<Slot>> {
    (0..n).map(|_| staging.try_take()).collect()
}

/// A request's round or an open-read on the I/O threads, kept for its deadline.
struct Started {
    at: Instant,
    out: Out,
    /// Answered `UNAVAILABLE` at its deadline: when it comes back it only frees its slots.
    answered: bool,
}

enum Out {
    Request(Arc<InFlight>),
    /// By the ticket its answer comes back with.
    Meta {
        ticket: u64,
        entry: MetaEntry,
    },
}

/// The engine's staged requests: each lane's staged-I/O memory and waiting requests,
/// and the channel the I/O threads hand finished ones back on.
pub(super) struct StagedIo {
    lanes: Vec<LaneStaged>,
    /// Rounds on the I/O threads, where the backend keeps a deadline.
    started: Vec<Started>,
    deadline: Option<Duration>,
    /// When to look for what the deadline passed for next.
    next_look: Instant,
    /// The ticket of the next open-read handed out.
    next_ticket: u64,
    done: (crossbeam_channel::Sender<Back>, crossbeam_channel::Receiver<Back>),
    jobs: crossbeam_channel::Sender<Job>,
    chunk_bytes: usize,
    times: BackendTimes,
    /// Woken by the I/O threads when they hand a request back.
    engine: Arc<any::Worker>,
    /// Requests on tenant workers' objects, sent to the workers.
    to_worker: ToWorker,
}

/// Staged requests the I/O threads finished, their reads' bytes put to the hosts: the
/// completions to post, per ring. Their slots are free once this drops, after the
/// completions' flush.
pub(super) struct Finished {
    pub rings: Vec<RingCompletions>,
    _answers: Vec<Back>,
    _slots: Vec<Slot>,
}

/// Completions (index, entry) to post on one ring, with its host and session.
pub(super) struct RingCompletions {
    pub ring: Arc<HostRing>,
    pub peer: Arc<Peer>,
    pub session_id: u64,
    pub completions: Vec<(u64, wire::Completion)>,
}

impl StagedIo {
    /// For the lanes of `workers` (the first one is the engine's to wake); `deadline`
    /// the backend's ([`dpuio_backend::IoQueue::deadline`]).
    pub fn new(
        workers: &[Arc<any::Worker>],
        jobs: crossbeam_channel::Sender<Job>,
        chunk_bytes: usize,
        times: BackendTimes,
        deadline: Option<Duration>,
    ) -> StagedIo {
        let lane =
            |w: &Arc<any::Worker>| LaneStaged { worker: w.clone(), own: None, refused: false, tenants: Vec::new() };
        StagedIo {
            lanes: workers.iter().map(lane).collect(),
            started: Vec::new(),
            deadline,
            next_look: Instant::now(),
            next_ticket: 0,
            done: crossbeam_channel::unbounded(),
            jobs,
            chunk_bytes,
            to_worker: ToWorker::new(times.clone()),
            times,
            engine: workers[0].clone(),
        }
    }

    /// Take the staged request `p` ([`super::policy::Placement::Staged`]): started on
    /// the I/O threads where its lane has slots free (for its first round, if it has
    /// more pieces than the lane has slots), else queued behind the lane's waiting ones.
    /// `Ok(false)` where it cannot go there (the lane has no staged-I/O memory): it runs
    /// on the engine. An `Err` is a transfer failure (the host is gone); the request is
    /// finished then.
    pub fn take(&mut self, p: Pending) -> Result<bool, fabric::Error> {
        let lane = &mut self.lanes[p.peer.lane];
        let pool = match dpuio_worker::direct::staging(&*p.handle.object) {
            None => lane.own(self.chunk_bytes),
            // Its worker's staging, where its slots fit the pieces.
            Some(Ok(staging)) if staging.slot_bytes() >= self.chunk_bytes as u64 => lane.tenant(staging),
            // The worker cannot start (the engine's run gives the error), or its slots are
            // smaller than a piece.
            Some(_) => None,
        };
        let Some(pool) = pool else { return Ok(false) };
        let slots = match pool.pending.is_empty() {
            true => take_slots(&pool.staging, round(p.pieces.len(), pool.slots())),
            false => None, // the pool's waiting ones go first
        };
        match slots {
            Some(slots) => self.start(p, slots)?,
            None => pool.pending.push_back((Instant::now(), Waiting::Request(p))),
        }
        Ok(true)
    }

    /// Hand the metadata entry `o` of a host reached with put/get, its job given
    /// staged-I/O slots for its answer range, off the engine: its thread runs the call and
    /// writes the answer into the slots; the engine puts it to the host. Where too few
    /// slots are free (or others wait for them) it waits in the lane's queue. Given back
    /// where it cannot go there (no staged-I/O memory, or an answer range longer than the
    /// lane's slots): it runs on the engine.
    pub fn take_meta(&mut self, o: WaitingMeta) -> Result<(), WaitingMeta> {
        let chunk_bytes = self.chunk_bytes;
        let Some(pool) = self.lanes[o.entry.peer.lane].own(chunk_bytes) else { return Err(o) };
        let n = o.slots(chunk_bytes);
        if n > pool.slots() {
            return Err(o);
        }
        match pool.pending.is_empty().then(|| take_slots(&pool.staging, n)).flatten() {
            Some(slots) => self.start_meta(o, slots),
            None => pool.pending.push_back((Instant::now(), Waiting::Meta(o))),
        }
        Ok(())
    }

    /// Hand the metadata entry `o` off the engine with `slots` for its answer.
    fn start_meta(&mut self, o: WaitingMeta, slots: Vec<Slot>) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let answer = StagedAnswer {
            slots,
            slot_bytes: self.chunk_bytes,
            peer: o.entry.peer.clone(),
            ticket,
            done: self.done.0.clone(),
            engine: self.engine.clone(),
        };
        if self.deadline.is_some() {
            self.started.push(Started {
                at: Instant::now(),
                out: Out::Meta { ticket, entry: o.entry },
                answered: false,
            });
        }
        io::hand_off_meta(&self.jobs, (o.job)(answer));
    }

    /// Whether what came back (a request's round, or the open-read of `ticket`) was
    /// answered at its deadline already; it is no longer kept for it either way.
    fn answered_at_deadline(&mut self, back: &Back) -> bool {
        let i = self.started.iter().position(|s| match (&s.out, back) {
            (Out::Request(r), Back::Request(f)) => Arc::ptr_eq(r, f),
            (Out::Meta { ticket, .. }, Back::Meta(a)) => *ticket == a.staged.ticket,
            _ => false,
        });
        let answered = i.is_some_and(|i| self.started.swap_remove(i).answered);
        if answered {
            let session = match back {
                Back::Request(f) => f.request.session_id,
                Back::Meta(a) => a.session_id,
            };
            tracing::info!(
                session = format!("{session:#018x}"),
                "storage answered data-plane I/O after it was answered UNAVAILABLE at its deadline; its \
                 staged-I/O slots are free again"
            );
        }
        answered
    }

    /// Start the next round of `p` with `slots` (one per piece of it): a write's bytes
    /// got from the host into them, then its pieces to the I/O threads.
    fn start(&mut self, mut p: Pending, slots: Vec<Slot>) -> Result<(), fabric::Error> {
        let rest = p.pieces.split_off(slots.len());
        let peer = &p.peer;
        let staging = slots[0].staging().clone();
        if p.sub.opcode == Opcode::Write {
            let local = self.lanes[peer.lane].region(&staging);
            let got = p
                .pieces
                .iter()
                .zip(&slots)
                .try_for_each(|(piece, slot)| {
                    let from = p.region.addr + piece.region_offset;
                    peer.endpoint.get(local, slot.offset as usize, piece.length as usize, from, &p.region.key)
                })
                .and_then(|()| peer.endpoint.flush(FLUSH_TIMEOUT));
            if let Err(e) = got {
                let _ = p.tenant.finish(1);
                return Err(e);
            }
        }
        let memory = StagedMemory {
            staging,
            offsets: slots.iter().map(|s| s.offset).collect(),
            slots: std::sync::Mutex::new(slots),
            pieces: p.pieces.clone(),
            rest,
            peer: peer.clone(),
            done: self.done.0.clone(),
        };
        let request = Offloaded {
            session_id: p.session_id,
            ring: p.ring,
            region: p.region,
            memory: Memory::Staged(Box::new(memory)),
            handle: p.handle,
            sub: p.sub,
            cq_index: p.cq_index,
            tenant: p.tenant,
            engine: self.engine.clone(),
            metrics: p.metrics,
            taken_at: p.taken_at,
        };
        // A tenant worker's pieces go to the worker ([`super::to_worker`]), the others to
        // the I/O threads.
        let request = match dpuio_worker::direct::is_worker(&*request.handle.object) {
            true => self.to_worker.queue(InFlight::new(request, p.pieces.len())),
            false => io::hand_off(&self.jobs, request, &p.pieces, false, &self.times),
        };
        if self.deadline.is_some() {
            self.started.push(Started { at: Instant::now(), out: Out::Request(request), answered: false });
        }
        Ok(())
    }

    /// The staged requests and open-reads the I/O threads handed back, their reads' bytes
    /// put to the hosts (a host whose put fails is failed); `None` when none came back.
    /// A request with rounds still to run goes back to the front of its lane's queue.
    pub fn finished(&mut self, metrics: &Metrics) -> Option<Finished> {
        self.to_worker.read();
        let done: Vec<Back> = self.done.1.try_iter().collect();
        if done.is_empty() {
            return None;
        }
        let mut rings: Vec<RingCompletions> = Vec::new();
        let mut next_rounds: Vec<(Pending, Arc<Staging>)> = Vec::new();
        // The requests' slots, held here rather than by the requests, which the I/O
        // threads may still hold until their batch ends.
        let mut slots: Vec<Slot> = Vec::new();
        for back in &done {
            if let Back::Request(f) = back
                && let Memory::Staged(staged) = &f.request.memory
            {
                slots.extend(staged.take_slots());
            }
            if self.answered_at_deadline(back) {
                continue;
            }
            let f = match back {
                Back::Request(f) => f,
                Back::Meta(answered) => {
                    if let Some(completion) = self.put_answer(answered, metrics) {
                        let a = &**answered;
                        add(&mut rings, &a.ring, &a.staged.peer, a.session_id, completion);
                    }
                    continue;
                }
            };
            let r = &f.request;
            let Memory::Staged(staged) = &r.memory else { continue };
            // Rounds run on while nothing failed and no read came up short (past the end
            // of the file the rest would read nothing).
            let more = !staged.rest.is_empty() && f.clean();
            let (status, result) = f.outcome();
            let peer = &staged.peer;
            if !more {
                let _ = r.tenant.finish(1); // parked rings are looked at on the engine's next round
                r.metrics.request(Op::of(r.sub.opcode), status, result, r.taken_at.elapsed());
            }
            // A read's bytes to the host; `Err(None)` where the host is gone.
            let put = match peer.serves(&r.ring) {
                false => Err(None),
                true if r.sub.opcode == Opcode::Read && status == wire::Status::Ok => {
                    let local = self.lanes[peer.lane].region(&staged.staging);
                    let to = |piece: &Chunk| r.region.addr + piece.region_offset;
                    (staged.pieces.iter().zip(&staged.offsets))
                        .try_for_each(|(piece, &at)| match f.bytes_read(piece) {
                            0 => Ok(()),
                            n => peer.endpoint.put(local, at as usize, n as usize, to(piece), &r.region.key),
                        })
                        // The next round may take these slots once this returns: its puts
                        // done first (the last round's are flushed with its completion).
                        .and_then(|()| if more { peer.endpoint.flush(FLUSH_TIMEOUT) } else { Ok(()) })
                        .map_err(Some)
                }
                true => Ok(()),
            };
            if let Err(failed) = put {
                if more {
                    let _ = r.tenant.finish(1); // it ends here
                }
                if let Some(e) = failed {
                    peer.fail(metrics, r.session_id, &e);
                }
                continue;
            }
            if more {
                next_rounds.push((
                    Pending {
                        session_id: r.session_id,
                        peer: peer.clone(),
                        ring: r.ring.clone(),
                        metrics: r.metrics.clone(),
                        tenant: r.tenant.clone(),
                        sub: r.sub,
                        cq_index: r.cq_index,
                        taken_at: r.taken_at,
                        region: r.region.clone(),
                        handle: r.handle.clone(),
                        pieces: staged.rest.clone(),
                    },
                    staged.staging.clone(),
                ));
                continue;
            }
            let completion = (r.cq_index, protocol::completion(r.sub.user_data, r.cq_index, status, result));
            add(&mut rings, &r.ring, peer, r.session_id, completion);
        }
        // Ahead of the lane's waiting ones (they were taken after), in the order they came.
        for (p, staging) in next_rounds.into_iter().rev() {
            match self.lanes[p.peer.lane].pool_of(&staging) {
                Some(pool) => pool.pending.push_front((Instant::now(), Waiting::Request(p))),
                None => {
                    let _ = p.tenant.finish(1); // not reached: its pool holds its slots
                }
            }
        }
        Some(Finished { rings, _answers: done, _slots: slots })
    }

    /// Put a staged metadata entry's answer (the first `result` bytes of its image) to its host; its
    /// completion, or `None` where the host is gone (or its put failed: failed now).
    fn put_answer(&self, a: &io::AnsweredMeta, metrics: &Metrics) -> Option<(u64, wire::Completion)> {
        let peer = &a.staged.peer;
        if !peer.serves(&a.ring) {
            return None;
        }
        let staging = a.staged.slots.first().map(|s| s.staging())?;
        let local = self.lanes[peer.lane].region(staging);
        let to = a.answer.addr + a.meta.answer_offset;
        let put = a.staged.spans(0, a.result as usize).try_for_each(|(slot, offset, from, len)| {
            let at = slot.offset as usize + offset;
            peer.endpoint.put(local, at, len, to + from as u64, &a.answer.key)
        });
        if let Err(e) = put {
            peer.fail(metrics, a.session_id, &e);
            return None;
        }
        Some((a.cq_index, protocol::completion(a.meta.user_data, a.cq_index, a.status, a.result)))
    }

    /// Answer `UNAVAILABLE` what the backend's deadline has passed for: rounds storage
    /// has not answered (their slots stay with it until it does) and what waited that
    /// long for slots. The completions to post, per ring. Looks every [`EXPIRY_LOOK`]
    /// at most (the engine calls it every round), and only while something is out.
    pub fn expire(&mut self) -> Vec<RingCompletions> {
        let mut rings: Vec<RingCompletions> = Vec::new();
        let Some(deadline) = self.deadline else { return rings };
        if self.started.is_empty() && self.lanes.iter().all(|l| l.pools().all(|p| p.pending.is_empty())) {
            return rings;
        }
        let now = Instant::now();
        if now < self.next_look {
            return rings;
        }
        self.next_look = now + EXPIRY_LOOK;
        let unavailable =
            |user_data, cq_index| (cq_index, protocol::completion(user_data, cq_index, wire::Status::Unavailable, 0));
        let mut held = 0;
        for s in self.started.iter_mut().filter(|s| !s.answered && now.duration_since(s.at) >= deadline) {
            s.answered = true;
            held += 1;
            let r = match &s.out {
                Out::Request(f) => &f.request,
                Out::Meta { entry, .. } => {
                    unavailable_meta(&mut rings, entry);
                    continue;
                }
            };
            let Memory::Staged(staged) = &r.memory else { continue };
            let _ = r.tenant.finish(1);
            r.metrics.request(Op::of(r.sub.opcode), wire::Status::Unavailable, 0, r.taken_at.elapsed());
            if staged.peer.serves(&r.ring) {
                add(&mut rings, &r.ring, &staged.peer, r.session_id, unavailable(r.sub.user_data, r.cq_index));
            }
        }
        let mut waited = 0;
        for pool in self.lanes.iter_mut().flat_map(LaneStaged::pools_mut) {
            while pool.pending.front().is_some_and(|(since, _)| now.duration_since(*since) >= deadline) {
                waited += 1;
                match pool.pending.pop_front().expect("looked at").1 {
                    Waiting::Request(p) => {
                        let _ = p.tenant.finish(1);
                        p.metrics.request(Op::of(p.sub.opcode), wire::Status::Unavailable, 0, p.taken_at.elapsed());
                        if p.peer.serves(&p.ring) {
                            add(&mut rings, &p.ring, &p.peer, p.session_id, unavailable(p.sub.user_data, p.cq_index));
                        }
                    }
                    Waiting::Meta(o) => unavailable_meta(&mut rings, &o.entry),
                }
            }
        }
        if held + waited > 0 {
            tracing::warn!(held, waited, deadline = ?deadline,
                "storage has not answered data-plane I/O within the backend's deadline ([backend] \
                 call_timeout_seconds): answered UNAVAILABLE; the staged-I/O slots of the held requests \
                 stay with storage until it answers");
        }
        rings
    }

    /// Send the tenant workers the pieces of the requests started since the last send
    /// ([`super::to_worker`]): the engine calls it before it sleeps or serves again.
    pub fn send_to_workers(&mut self) {
        self.to_worker.send();
    }

    /// The descriptors tenant workers' reports arrive on: the engine sleeps on them too.
    pub fn worker_fds(&self) -> Vec<std::os::fd::RawFd> {
        self.to_worker.fds()
    }

    /// Start the requests and open-reads waiting for slots, in each lane's order, as far
    /// as its slots go.
    pub fn start_waiting(&mut self, metrics: &Metrics) {
        for lane in 0..self.lanes.len() {
            for i in 0..self.lanes[lane].pools().count() {
                loop {
                    let pool = self.lanes[lane].pools_mut().nth(i).expect("counted");
                    let Some((_, w)) = pool.pending.front() else { break };
                    let Some(slots) = take_slots(&pool.staging, w.slots(pool.slots(), self.chunk_bytes)) else { break };
                    match pool.pending.pop_front().expect("looked at").1 {
                        Waiting::Request(p) if !p.peer.serves(&p.ring) => {
                            let _ = p.tenant.finish(1); // its host is gone
                        }
                        Waiting::Request(p) => {
                            let (peer, session_id) = (p.peer.clone(), p.session_id);
                            if let Err(e) = self.start(p, slots) {
                                peer.fail(metrics, session_id, &e);
                            }
                        }
                        Waiting::Meta(o) if !o.entry.peer.serves(&o.entry.ring) => {} // its host is gone
                        Waiting::Meta(o) => self.start_meta(o, slots),
                    }
                }
            }
            self.lanes[lane].drop_gone_workers();
        }
    }
}
