//! The I/O threads: backend I/O of requests, so that the engine thread moves on to the
//! next entry while storage works.
//!
//! The engine hands them [`Job`]s over a bounded channel: the pieces of a request
//! ([`Piece`], sharing one [`InFlight`]), and open-reads of a batch of samples
//! ([`MetaCall`]). A request's memory is the host's, mapped (the last piece to finish
//! posts the completion straight into the mapped ring), or slots of the lane's
//! staged-I/O memory ([`Memory::Staged`]: the host is reached with put/get, which only
//! the engine does; the last piece hands the request back to it). Each thread runs its
//! pieces on its backend's [`IoQueue`]: over DAOS an event queue keeping many pieces in
//! flight, over the local backend one `pread` or `pwrite` at a time.
//!
//! Not here: which requests come here and in how many pieces (the engine's decisions,
//! [`super::policy`]), moving staged bytes to and from the host ([`super::staged`]),
//! and requests the engine runs itself ([`super::execute`]).

use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dpuio_backend::threads::Pool;
use dpuio_backend::{HostBytes, HostBytesMut, IoOp, IoQueue, IoRequest, OneAtATime};
use dpuio_proto::wire::{self, MetaSubmission, Opcode, Submission};
use dpuio_worker::staging::{Slot, Staging};
use fabric::Transport;
use fabric::any;

use super::host_memory::{self, HostRegion, HostRing, Peer};
use super::protocol::{self, BackendFailure};
use super::sessions::{self, Agent, Handle};
use super::{meta, policy};
use crate::metrics::{BackendTimes, Op, TenantMetrics, timed};
use crate::qos::TenantSlot;
use crate::validate;

/// Jobs queued for the I/O threads at most; the engine waits when it is full.
pub(super) const IO_QUEUE: usize = 1024;

/// A validated request the engine hands to the I/O threads.
pub(super) struct Offloaded {
    pub session_id: u64,
    pub ring: Arc<HostRing>,
    pub region: Arc<HostRegion>,
    /// Where its pieces read into and write from.
    pub memory: Memory,
    pub handle: Arc<Handle>,
    pub sub: Submission,
    pub cq_index: u64,
    /// Counts this request in flight until its completion is posted.
    pub tenant: Arc<TenantSlot>,
    /// Woken when finishing this request makes room for a parked tenant.
    pub engine: Arc<any::Worker>,
    /// The session's tenant counters, and when the request was taken off its ring.
    pub metrics: Arc<TenantMetrics>,
    pub taken_at: Instant,
}

/// Where an offloaded request's pieces read into and write from.
pub(super) enum Memory {
    /// The host's region and ring, both mapped: the last piece posts the completion.
    Mapped,
    /// A slot of the lane's staged-I/O memory per piece: the last piece hands the
    /// request back to the engine, which puts a read's bytes to the host and posts
    /// the completion (a write's bytes were got into the slots before).
    Staged(Box<StagedMemory>),
}

/// A staged request's slots of the lane's staged-I/O memory (one per piece of this
/// round, in order), and where it goes back to ([`super::staged`]).
pub(super) struct StagedMemory {
    pub staging: Arc<Staging>,
    /// Where in `staging` each piece's slot is.
    pub offsets: Vec<u64>,
    /// The slots themselves, taken by the engine when the request comes back: they are
    /// free once it is done with them, while the I/O thread may still hold the request
    /// (until its batch ends), so a request waiting for them never waits for that.
    pub slots: Mutex<Vec<Slot>>,
    /// This round's pieces: a request of more pieces than its lane has slots runs in
    /// rounds, one after another.
    pub pieces: Vec<validate::Chunk>,
    /// The pieces of the rounds after this one (the rounds before, if any, all went
    /// clean: nothing failed, no read came up short).
    pub rest: Vec<validate::Chunk>,
    pub peer: Arc<Peer>,
    /// The engine's channel for finished staged requests.
    pub done: crossbeam_channel::Sender<Back>,
}

impl StagedMemory {
    /// The first `len` bytes of piece `index`'s slot, to read into.
    fn slot_mut(&self, index: usize, len: usize) -> HostBytesMut<'_> {
        self.staging.mapping.bytes_mut(self.offsets[index], len as u64).expect("a piece is at most a chunk: its slot")
    }

    /// The first `len` bytes of piece `index`'s slot, to write from.
    fn slot(&self, index: usize, len: usize) -> HostBytes<'_> {
        self.staging.mapping.bytes(self.offsets[index], len as u64).expect("a piece is at most a chunk: its slot")
    }

    /// The slots, for the engine to free once it has put their bytes.
    pub(super) fn take_slots(&self) -> Vec<Slot> {
        std::mem::take(&mut *self.slots.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A request in flight on the I/O threads: how its pieces went so far.
pub(super) struct InFlight {
    pub(super) request: Offloaded,
    pieces_left: AtomicUsize,
    /// Lowest file offset where a read came up short (end of file); u64::MAX if none.
    short_end: AtomicU64,
    /// The highest [`BackendFailure`] of its pieces, as its rank (0: none failed).
    failure: AtomicU8,
}

/// Work for the I/O threads.
pub(super) enum Job {
    /// A piece of a mapped request.
    Piece(Piece),
    /// A metadata entry: an open-read (a batch of them, a loader's samples, runs on all
    /// the threads at once rather than one after another on the engine's).
    Meta(Box<MetaCall>),
}

/// What the I/O threads hand back to the engine: requests and open-reads of hosts it
/// reaches with put/get, their bytes in staged-I/O slots ([`super::staged`]).
pub(super) enum Back {
    Request(Arc<InFlight>),
    Meta(Box<AnsweredMeta>),
}

pub(super) struct Piece {
    request: Arc<InFlight>,
    piece: validate::Chunk,
    /// Its place among its request's pieces (its staged-I/O slot).
    index: usize,
}

/// A metadata entry run off the engine: the namespace call, then its answer (an
/// open-read's: the file's bytes and header) written into the answer range (mapped), or
/// into staged-I/O slots the engine puts from; an error record likewise where it is
/// refused. It runs on an I/O thread, or, for a tenant whose calls its worker process
/// makes (`in_worker`), on a thread of its own ([`WORKER_CALLS`]): such a call waits for
/// as long as the worker does not answer, and holds up nothing else meanwhile.
pub(super) struct MetaCall {
    pub agent: Arc<Agent>,
    pub session_id: u64,
    pub metrics: Arc<TenantMetrics>,
    pub ring: Arc<HostRing>,
    pub answer: Arc<HostRegion>,
    pub meta: MetaSubmission,
    pub asked: meta::Request,
    pub cq_index: u64,
    pub chunk_bytes: usize,
    pub into: AnswerInto,
    pub in_worker: bool,
}

/// Where a metadata entry run off the engine writes its answer.
pub(super) enum AnswerInto {
    /// The mapped answer range; the completion is posted into the mapped ring. `group`:
    /// the entries of one ring batch still running, the last to finish wakes the
    /// host (one wake-up for a loader's batch, not one per sample).
    Mapped { group: Arc<AtomicUsize> },
    /// Staged-I/O slots laid end to end as an image of the answer range; handed back to
    /// the engine, which puts it to the host and posts the completion.
    Staged(StagedAnswer),
}

/// The staged-I/O slots of a metadata entry's answer, and where it goes back to.
pub(super) struct StagedAnswer {
    pub slots: Vec<Slot>,
    pub slot_bytes: usize,
    pub peer: Arc<Peer>,
    /// Names it to the engine when it comes back.
    pub ticket: u64,
    pub done: crossbeam_channel::Sender<Back>,
    /// Woken when the answer is handed back.
    pub engine: Arc<any::Worker>,
}

/// A metadata entry answered into staged-I/O slots: the engine puts the first `result`
/// bytes of the image to the answer range and posts the completion.
pub(super) struct AnsweredMeta {
    pub session_id: u64,
    pub ring: Arc<HostRing>,
    pub answer: Arc<HostRegion>,
    pub meta: MetaSubmission,
    pub cq_index: u64,
    pub status: wire::Status,
    pub result: u64,
    pub staged: StagedAnswer,
}

impl StagedAnswer {
    /// The image's bytes `[at, at + len)`, slot by slot: (slot, offset in it, offset in
    /// the image, length).
    pub(super) fn spans(&self, at: usize, len: usize) -> impl Iterator<Item = (&Slot, usize, usize, usize)> {
        let size = self.slot_bytes;
        let last = (at + len).div_ceil(size).min(self.slots.len());
        (at / size..last)
            .map(move |i| {
                let (from, to) = (at.max(i * size), (at + len).min((i + 1) * size));
                (&self.slots[i], from - i * size, from, to - from)
            })
            .filter(|&(.., len)| len > 0)
    }

    /// The `len` bytes at `offset` of `slot`, to write into.
    fn bytes_mut(slot: &Slot, offset: usize, len: usize) -> HostBytesMut<'_> {
        slot.staging().mapping.bytes_mut(slot.offset + offset as u64, len as u64).expect("in its slot")
    }

    /// Copy `bytes` into the image at `at`.
    fn write(&self, at: usize, bytes: &[u8]) {
        for (slot, offset, from, len) in self.spans(at, bytes.len()) {
            StagedAnswer::bytes_mut(slot, offset, len).copy_from_slice(&bytes[from - at..][..len]);
        }
    }

    /// Read up to `length` bytes of `object` from offset 0 into the image at `at`;
    /// the bytes read (short at the end of the file).
    fn read_object(&self, object: &dyn dpuio_backend::Object, at: usize, length: usize) -> dpuio_backend::Result<u64> {
        let mut done = 0usize;
        for (slot, offset, from, len) in self.spans(at, length) {
            let n = object.read_into(StagedAnswer::bytes_mut(slot, offset, len), (from - at) as u64)?;
            done += n;
            if n < len {
                break; // end of file
            }
        }
        Ok(done as u64)
    }
}

impl MetaCall {
    pub fn run(self) {
        let started = Instant::now();
        let MetaCall { agent, session_id, metrics, ring, answer, meta: m, asked, cq_index, chunk_bytes, into, .. } =
            self;
        let header = u64::from(wire::META_ANSWER_HEADER_BYTES);
        let room = m.answer_length as usize;
        let answered = sessions::namespace_call(&*agent, session_id, asked.clone()).and_then(|reply| {
            let meta::Reply::Object { object, attr } = reply else {
                let call = |asked| sessions::namespace_call(&*agent, session_id, asked);
                let bytes = meta::fitting(reply, asked, room, call)?;
                into.write(&answer, m.answer_offset, &bytes);
                return Ok(bytes.len() as u64);
            };
            let want = attr.size.min(u64::from(m.answer_length).saturating_sub(header));
            let done = match &into {
                AnswerInto::Mapped { .. } => {
                    let mapped = answer.mapped.as_ref().expect("a mapped answer range");
                    host_memory::read_object_mapped(&*object, mapped, m.answer_offset + header, want, chunk_bytes)?
                }
                AnswerInto::Staged(staged) => staged.read_object(&*object, header as usize, want as usize)?,
            };
            into.write(&answer, m.answer_offset, &meta::open_read_header(&attr, done));
            Ok(header + done)
        });
        meta::count(&metrics, m.opcode, &answered, started);
        let (status, result) = match answered {
            Ok(written) => (wire::Status::Ok, written),
            Err(refused) => {
                let record = meta::error_answer(&refused, m.answer_length as usize);
                into.write(&answer, m.answer_offset, &record);
                (wire::Status::Refused, record.len() as u64)
            }
        };
        match into {
            AnswerInto::Mapped { group } => {
                let completion = protocol::completion(m.user_data, cq_index, status, result);
                host_memory::post_mapped(&ring, cq_index, &completion);
                if group.fetch_sub(1, Ordering::SeqCst) == 1 {
                    host_memory::wake_waiters(&ring);
                }
            }
            AnswerInto::Staged(staged) => {
                let (done, engine) = (staged.done.clone(), staged.engine.clone());
                let back = AnsweredMeta { session_id, ring, answer, meta: m, cq_index, status, result, staged };
                // The engine is gone only at shutdown: the answer is dropped, its slots freed.
                if done.send(Back::Meta(Box::new(back))).is_ok() {
                    let _ = engine.wake();
                }
            }
        }
    }
}

impl AnswerInto {
    /// Write `bytes` at the start of the answer range (at `answer_offset` of `answer`,
    /// mapped), or of its staged image.
    fn write(&self, answer: &HostRegion, answer_offset: u64, bytes: &[u8]) {
        match self {
            AnswerInto::Mapped { .. } => {
                let mapped = answer.mapped.as_ref().expect("a mapped answer range");
                mapped.bytes_mut(answer_offset as usize, bytes.len()).copy_from_slice(bytes);
            }
            AnswerInto::Staged(staged) => staged.write(0, bytes),
        }
    }
}

/// An I/O thread: takes pieces of mapped requests and runs them on its backend's
/// queue. With a queue that overlaps I/O (DAOS event queues) it takes every piece that
/// is waiting, up to the queue's depth, and runs them as one batch, so one thread keeps
/// many backend reads in flight; with a one-at-a-time queue (`local`) it takes one piece
/// and leaves the rest to the other threads.
pub(super) fn io_worker(queue: crossbeam_channel::Receiver<Job>, mut io: Box<dyn IoQueue>, times: &BackendTimes) {
    let mut batch: Vec<Piece> = Vec::with_capacity(io.depth());
    while let Ok(job) = queue.recv() {
        let mut after: Option<Box<MetaCall>> = None;
        let first = match job {
            Job::Piece(p) => p,
            Job::Meta(o) => {
                o.run();
                continue;
            }
        };
        let overlaps = io.overlaps(&*first.request.request.handle.object);
        batch.push(first);
        // A piece the queue would run on this thread ends the batch: it must not hold
        // back the pieces gathered before it longer than it takes itself.
        while overlaps && batch.len() < io.depth() {
            match queue.try_recv() {
                Ok(Job::Piece(p)) => {
                    let stop = !io.overlaps(&*p.request.request.handle.object);
                    batch.push(p);
                    if stop {
                        break;
                    }
                }
                Ok(Job::Meta(o)) => {
                    after = Some(o); // runs on this thread: after the batch
                    break;
                }
                Err(_) => break,
            }
        }
        run_pieces(&mut *io, &batch, times);
        batch.clear();
        if let Some(o) = after {
            o.run();
        }
    }
}

/// Run pieces of mapped requests; the last piece of each request posts its completion.
///
/// Each piece's backend time goes to `times`: on a queue that overlaps its pieces, from
/// the batch's start to the piece's outcome (they were all submitted together); on one
/// that runs them one after another, from the previous outcome.
fn run_pieces(io: &mut dyn IoQueue, batch: &[Piece], times: &BackendTimes) {
    let overlapped = io.depth() > 1;
    let mut requests: Vec<IoRequest<'_>> = batch
        .iter()
        .map(|Piece { request, piece, index }| {
            let r = &request.request;
            let len = piece.length as usize;
            let op = match (&r.memory, r.sub.opcode) {
                (Memory::Mapped, opcode) => {
                    let mapped = r.region.mapped.as_ref().expect("only mapped requests are queued as such");
                    let at = piece.region_offset as usize;
                    match opcode {
                        Opcode::Read => IoOp::Read(mapped.bytes_mut(at, len)),
                        Opcode::Write => IoOp::Write(mapped.bytes(at, len)),
                    }
                }
                (Memory::Staged(staged), Opcode::Read) => IoOp::Read(staged.slot_mut(*index, len)),
                (Memory::Staged(staged), Opcode::Write) => IoOp::Write(staged.slot(*index, len)),
            };
            IoRequest { object: &*r.handle.object, offset: piece.file_offset, op }
        })
        .collect();
    let started = Instant::now();
    let mut last = started;
    io.run(&mut requests, &mut |i, outcome| {
        let Piece { request: r, piece, .. } = &batch[i];
        let opcode = r.request.sub.opcode;
        let now = Instant::now();
        let h = if opcode == Opcode::Read { &times.read } else { &times.write };
        h.observe(now.duration_since(if overlapped { started } else { last }).as_secs_f64());
        last = now;
        r.piece_outcome(piece, outcome, times);
    });
}

/// Run the `pieces` (request, piece index) of staged requests that a tenant worker could
/// not take, or lost, one backend call at a time on a thread of their own
/// ([`WORKER_CALLS`]): each goes to the tenant's worker again, which may start a new one
/// (seconds), and the engine does not wait for that.
pub(super) fn run_pieces_aside(pieces: Vec<(Arc<InFlight>, usize)>, times: &BackendTimes) {
    let batch: Vec<Piece> = pieces
        .into_iter()
        .filter_map(|(request, index)| {
            let Memory::Staged(staged) = &request.request.memory else { return None };
            let piece = staged.pieces[index];
            Some(Piece { request, piece, index })
        })
        .collect();
    let times = times.clone();
    aside(move || run_pieces(&mut OneAtATime, &batch, &times));
}

impl InFlight {
    /// A request split in `pieces`, none of them run yet.
    pub(super) fn new(request: Offloaded, pieces: usize) -> Arc<InFlight> {
        Arc::new(InFlight {
            request,
            pieces_left: AtomicUsize::new(pieces),
            short_end: AtomicU64::new(u64::MAX),
            failure: AtomicU8::new(0),
        })
    }

    /// The outcome of `piece`, one of its pieces: noted, and the last one finishes the
    /// request.
    pub(super) fn piece_outcome(
        self: &Arc<Self>,
        piece: &validate::Chunk,
        outcome: dpuio_backend::Result<usize>,
        times: &BackendTimes,
    ) {
        match outcome {
            Ok(n) if self.request.sub.opcode == Opcode::Read && (n as u64) < piece.length => {
                self.short_end.fetch_min(piece.file_offset + n as u64, Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(session = format!("{:#018x}", self.request.session_id), error = %e, "backend I/O failed");
                self.failed(policy::failure(&e));
            }
        }
        self.piece_done(times);
    }

    /// One of its pieces is done (its outcome noted): the last one finishes the request.
    fn piece_done(self: &Arc<Self>, times: &BackendTimes) {
        if self.pieces_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish(times);
        }
    }

    /// One of its pieces failed so.
    fn failed(&self, failure: BackendFailure) {
        self.failure.fetch_max(failure as u8, Ordering::Relaxed);
    }

    /// Whether its pieces all went clean: none failed, no read came up short.
    pub(super) fn clean(&self) -> bool {
        self.failure.load(Ordering::Relaxed) == 0 && self.short_end.load(Ordering::Relaxed) == u64::MAX
    }

    /// What the request completes with (status, bytes), from how its pieces went.
    pub(super) fn outcome(&self) -> (wire::Status, u64) {
        let failure = BackendFailure::from_rank(self.failure.load(Ordering::Relaxed));
        policy::pieces_outcome(&self.request.sub, failure, self.short_end.load(Ordering::Relaxed))
    }

    /// The bytes of piece `piece` a read got (short at the end of the file).
    pub(super) fn bytes_read(&self, piece: &validate::Chunk) -> u64 {
        let end = self.short_end.load(Ordering::Relaxed);
        piece.length.min(end.saturating_sub(piece.file_offset))
    }

    /// The last piece is done: sync if asked; post the completion into the mapped
    /// ring, or hand a staged request back to the engine. A tenant worker's sync is made
    /// on a thread of its own ([`WORKER_CALLS`]): the last piece may be done on the
    /// engine, which must not wait for a worker.
    fn finish(self: &Arc<Self>, times: &BackendTimes) {
        let r = &self.request;
        // A request in rounds is made durable after its last round.
        let last_round = match &r.memory {
            Memory::Staged(staged) => staged.rest.is_empty(),
            Memory::Mapped => true,
        };
        let sync = self.failure.load(Ordering::Relaxed) == 0 && last_round && policy::syncs(&r.sub);
        if sync && dpuio_worker::direct::is_worker(&*r.handle.object) {
            let (request, times) = (self.clone(), times.clone());
            aside(move || request.complete(true, &times));
            return;
        }
        self.complete(sync, times);
    }

    /// Sync if `sync`, then post the completion into the mapped ring, or hand a staged
    /// request back to the engine.
    fn complete(self: &Arc<Self>, sync: bool, times: &BackendTimes) {
        let r = &self.request;
        if sync && let Err(e) = timed(&times.sync, || r.handle.object.sync()) {
            tracing::warn!(session = format!("{:#018x}", r.session_id), error = %e, "sync after write failed");
            self.failed(policy::failure(&e));
        }
        if let Memory::Staged(staged) = &r.memory {
            // The engine is gone only at shutdown: the request is dropped, its slots freed.
            if staged.done.send(Back::Request(self.clone())).is_ok() {
                let _ = r.engine.wake();
            }
            return;
        }
        let (status, result) = self.outcome();
        let completion = protocol::completion(r.sub.user_data, r.cq_index, status, result);
        host_memory::post_mapped(&r.ring, r.cq_index, &completion);
        host_memory::wake_waiters(&r.ring);
        r.metrics.request(Op::of(r.sub.opcode), status, result, r.taken_at.elapsed());
        if r.tenant.finish(1) {
            let _ = r.engine.wake();
        }
    }
}

/// Hand a request, split in `pieces`, to the I/O threads; with `engine_first` the
/// caller (the engine) runs the first piece itself, one backend call at a time. A piece
/// the threads cannot take (they are gone: shutdown) fails. The request in flight.
pub(super) fn hand_off(
    jobs: &crossbeam_channel::Sender<Job>,
    request: Offloaded,
    pieces: &[validate::Chunk],
    engine_first: bool,
    times: &BackendTimes,
) -> Arc<InFlight> {
    let request = InFlight::new(request, pieces.len());
    let (first, rest) = match engine_first {
        true => pieces.split_first().map_or((None, pieces), |(first, rest)| (Some(*first), rest)),
        false => (None, pieces),
    };
    let skipped = usize::from(first.is_some());
    for (index, &piece) in rest.iter().enumerate() {
        let index = index + skipped;
        if jobs.send(Job::Piece(Piece { request: request.clone(), piece, index })).is_err() {
            request.failed(BackendFailure::Io);
            request.piece_done(times);
        }
    }
    if let Some(piece) = first {
        run_pieces(&mut OneAtATime, &[Piece { request: request.clone(), piece, index: 0 }], times);
    }
    request
}

/// Threads for the calls of tenants whose DAOS calls their worker processes make, that
/// the engine (or an I/O thread) would otherwise wait for: their metadata entries, the
/// pieces a worker lost, syncs. One job each at a time, so a stopped worker holds up its
/// own calls only.
static WORKER_CALLS: Pool = Pool::new("dpuio-wk-call", 8);

/// Run `job` on a thread of [`WORKER_CALLS`]; where no thread can be made, here.
fn aside(job: impl FnOnce() + Send + 'static) {
    if let Err((e, job)) = WORKER_CALLS.submit(Box::new(job)) {
        tracing::warn!(error = %e, "no thread for a worker tenant's call: it is made here");
        job();
    }
}

/// Hand a metadata entry off the engine ([`MetaCall`]): to a thread of its own where its
/// tenant's calls go to a worker process, else to the I/O threads; where neither can take
/// it (no thread can be made; shutdown), run it here.
pub(super) fn hand_off_meta(jobs: &crossbeam_channel::Sender<Job>, job: MetaCall) {
    if job.in_worker {
        return aside(move || job.run());
    }
    if let Err(crossbeam_channel::SendError(Job::Meta(job))) = jobs.send(Job::Meta(Box::new(job))) {
        job.run();
    }
}
