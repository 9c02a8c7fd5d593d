//! The ring protocol of one ring pair, as a state machine without I/O (in the way
//! `quinn-proto` holds QUIC): what the agent does with a ring, given what the host
//! wrote there.
//!
//! The host owns `sq_tail` (submissions it published) and `cq_head` (completions it
//! reaped); the agent owns `sq_head` (the next submission it takes) and `cq_tail` (the
//! next completion it posts), kept here as a [`Cursor`]. All four are `u64` counters
//! that only grow, wrapping past `u64::MAX`, and index the rings modulo their entries
//! ([`dpuio_proto::wire`]). None of the host's values is trusted: indices that claim
//! more submissions than the ring holds, or more unreaped completions than it holds,
//! break the ring ([`Serve::Broken`]); every entry is decoded strictly and validated
//! against the session ([`crate::validate::validate`]) before anything runs.
//!
//! Serving a ring once is a [`Batch`]. The driver (the engine thread, `driver.rs`)
//! reads the host's indices and hands them to [`Cursor::serve`] with how the ring is
//! reached and the tenant's room ([`Tenant::of`]); then it performs what
//! [`Batch::poll`] returns until it returns `None`, feeding back what it was asked for:
//! the entry bytes it fetched ([`Batch::fetched`]), how a run ended ([`Batch::ran`]),
//! whether the I/O threads took an open-read ([`Batch::offloaded`]), or that a transfer
//! to the host failed ([`Batch::transfer_failed`]: nothing more is asked, no completion
//! is posted, and the ring's cursor is not advanced). The last action,
//! [`Action::Finish`], carries the cursor to keep and whether more entries wait.
//!
//! The machine decides what the driver would otherwise have to: whether a valid entry
//! runs at once or is queued (the tenant's mode), which open-reads go to the I/O
//! threads (on a mapped ring, with entries behind them, so a loader's batch of samples
//! is read in parallel and the last runs on the engine), and whether a completion is
//! still to count in its tenant's figures ([`Count`]: a refusal is counted when it is
//! posted, a request that ran was counted as it ran).
//!
//! A batch takes at most [`RING_BATCH`] entries, no more than the completion ring and
//! the tenant have room for, so one busy ring cannot starve the others and a tenant
//! never has more requests in flight than its `max_inflight`.
//!
//! A request whose host region is not mapped moves its payload through the agent's
//! staging region: [`Staged`] gives its steps (backend read into one half while the put
//! of the other is in flight, a flush before a half is reused; get, flush, write; sync).
//!
//! Not here: host memory (mapped loads and stores, put/get/flush), the backend, the
//! clock, the QoS scheduler's queue (the driver queues what [`Action::Queue`] names),
//! where a request runs and in how many pieces (`policy`), and which rings are looked
//! at when ([`super::readiness`]).

use dpuio_proto::wire::{self, Completion, Entry, MetaOpcode, MetaSubmission, Status, Submission};

use super::policy;
pub use super::policy::BackendFailure;
use crate::validate::{self, SessionView};

/// Submissions taken from one ring before the engine turns to the next, so one busy
/// ring cannot starve the others.
pub const RING_BATCH: u64 = 64;

/// Where the agent stands in one ring pair: the next submission it takes and the next
/// completion slot it posts. A new ring starts at zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    pub sq_head: u64,
    pub cq_tail: u64,
}

/// The host's indices, as the driver read them from the ring header (untrusted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostIndices {
    pub sq_tail: u64,
    pub cq_head: u64,
}

/// How the ring's tenant takes the valid entries of this batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenant {
    /// They run as they are taken ([`Action::Run`]): one unlimited tenant has work and
    /// nothing is queued. `room` is its room for requests in flight.
    Direct { room: u32 },
    /// They go to the QoS scheduler ([`Action::Queue`]).
    Queued { room: u32 },
    /// The tenant was removed at run time and its sessions are ending: they complete as
    /// `Cancelled`.
    Removed,
}

impl Tenant {
    /// The tenant of a ring this round: `room` is its room for requests in flight
    /// (`None`: it was removed), `direct` whether this round's entries run as they are
    /// taken (`policy::runs_direct`).
    pub fn of(room: Option<u32>, direct: bool) -> Tenant {
        match room {
            None => Tenant::Removed,
            Some(room) if direct => Tenant::Direct { room },
            Some(room) => Tenant::Queued { room },
        }
    }
}

/// How the agent reaches a ring's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingMemory {
    /// Mapped into the agent (shared memory): the I/O threads can post its completions
    /// themselves, so open-reads may go to them ([`Action::Offload`]) when entries wait
    /// behind them (the last of a batch runs here, sparing a hand-off).
    Mapped,
    /// Mapped, over a backend whose reads may wait on storage without bound (DAOS: a
    /// read in flight when every engine is lost waits until DAOS answers, as DAOS may
    /// still write the memory it was lent): every open-read goes to the I/O threads, the
    /// last of a batch too, so that the engine never waits on storage and keeps
    /// answering the ring's other entries (refused at once while DAOS is silent).
    MappedStalling,
    /// Through put/get (TCP, RDMA): only the engine posts its completions.
    Remote,
    /// Through put/get, over a backend whose reads may wait on storage without bound:
    /// every open-read goes to the I/O threads, which write its answer into staged-I/O
    /// slots the engine then puts to the host and completes, so that the engine never
    /// waits on storage for such a ring either, and a batch of samples is read in
    /// parallel.
    RemoteStalling,
}

/// What serving a ring now comes to.
#[derive(Debug)]
pub enum Serve {
    /// The host's indices make no sense (more submitted, or more unreaped, than the
    /// ring holds): the ring is not served again.
    Broken,
    /// Nothing to take now: no new submission, a full completion ring, or a tenant with
    /// no room.
    Idle,
    /// Entries to take: perform the batch's actions.
    Batch(Batch),
}

/// What the driver does next for a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Read submission entry `index` (at [`wire::sqe_offset`]) and give its bytes to
    /// [`Batch::fetched`].
    Fetch { index: u64 },
    /// Run this validated request now (it counts in the tenant's in-flight requests from
    /// here), then report with [`Batch::ran`]. Its completion goes to `cq_index`.
    Run { sub: Submission, cq_index: u64 },
    /// Queue this validated request in the QoS scheduler; its completion goes to
    /// `cq_index` when it has run.
    Queue { sub: Submission, cq_index: u64 },
    /// Run this metadata entry, whose memory ranges were checked, now (like a gRPC
    /// namespace call it is not queued behind payload), then report with
    /// [`Batch::ran`]. Its completion goes to `cq_index`.
    Meta { meta: MetaSubmission, cq_index: u64 },
    /// Hand this metadata entry off the engine: an open-read to the I/O threads (its ring
    /// and memory ranges are mapped and more entries wait behind it, so a batch of
    /// samples is read in parallel; or the backend may stall), or any entry of a tenant
    /// whose calls a worker process makes ([`Batch::offloading_every_meta`]). Report with
    /// [`Batch::offloaded`]: taken (the thread that runs it writes its answer and has its
    /// completion posted, and counts it), or not (it runs here, as [`Action::Meta`]). Its
    /// completion goes to `cq_index`.
    Offload { meta: MetaSubmission, cq_index: u64 },
    /// Post this completion at `index`: the request's payload first, then the entry,
    /// then its `seq` word; count it in the tenant's figures if `count` says so.
    Complete { index: u64, completion: Completion, count: Count },
    /// The batch is done: keep `cursor`, store `cursor.sq_head` as the ring's advisory
    /// `sq_head`, wake the host's waiters if `wake` (a completion was posted), and come
    /// back to the ring if `more` entries wait.
    Finish { cursor: Cursor, wake: bool, more: bool },
}

/// Whether a posted completion is still to count in its tenant's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// It ran here and was counted as it ran (with its bytes and latency).
    Counted,
    /// It was refused (malformed, a failed check, its tenant removed): count it now with
    /// `status`, as an operation of `opcode` (`None`: not a payload entry, or not one
    /// that decodes).
    Refused { opcode: Option<wire::Opcode>, status: Status },
}

/// How a run the driver was asked for ([`Action::Run`], [`Action::Meta`]) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ran {
    /// It went to the I/O threads, which post its completion.
    OnWorkers,
    /// It ran here; its completion is still to post.
    Done { status: Status, result: u64 },
}

/// Serving one ring once: up to [`RING_BATCH`] entries.
#[derive(Debug)]
pub struct Batch {
    /// Advanced as entries are taken.
    cursor: Cursor,
    /// The host's `sq_tail` when the batch began.
    sq_tail: u64,
    /// Entries still to take.
    left: u64,
    tenant: Tenant,
    memory: RingMemory,
    /// Every metadata entry goes off the engine, not only open-reads
    /// ([`Batch::offloading_every_meta`]).
    every_meta: bool,
    next: Next,
    /// A completion was handed out.
    wake: bool,
}

/// Where a batch is.
#[derive(Debug)]
enum Next {
    /// Fetch the next entry, or finish.
    Fetch,
    /// A fetch is out: waiting for [`Batch::fetched`].
    AwaitEntry,
    /// An action decided and not yet handed out.
    Act(Action),
    /// A run is out: waiting for [`Batch::ran`].
    AwaitRun { user_data: u64, cq_index: u64 },
    /// An open-read was handed to the I/O threads: waiting for [`Batch::offloaded`].
    AwaitOffload { meta: MetaSubmission, cq_index: u64 },
    /// Finished, or a transfer failed.
    Done,
}

impl Cursor {
    /// Serve a ring of `entries` entries in `memory` whose host published `seen`, for
    /// `tenant`.
    pub fn serve(self, entries: u32, memory: RingMemory, seen: HostIndices, tenant: Tenant) -> Serve {
        let Some(window) = wire::RingWindow::check(entries, self.sq_head, self.cq_tail, seen.sq_tail, seen.cq_head)
        else {
            return Serve::Broken;
        };
        // Take what was submitted, as far as the completion ring and the tenant have room.
        let tenant_room = match tenant {
            Tenant::Direct { room } | Tenant::Queued { room } => u64::from(room),
            Tenant::Removed => RING_BATCH,
        };
        let take = window.submitted.min(window.completion_room).min(RING_BATCH).min(tenant_room);
        if take == 0 {
            return Serve::Idle;
        }
        Serve::Batch(Batch {
            cursor: self,
            sq_tail: seen.sq_tail,
            left: take,
            tenant,
            memory,
            every_meta: false,
            next: Next::Fetch,
            wake: false,
        })
    }
}

impl Batch {
    /// This batch hands every metadata entry off the engine ([`Action::Offload`]), not
    /// only open-reads: for a tenant whose calls a worker process of its own makes, which
    /// may stop answering for seconds (until it is taken as lost and replaced) or hang in
    /// DAOS up to its deadline. The engine, which serves every ring, then never waits for
    /// such a call. Where the entry's memory does not allow it, it still runs here.
    pub fn offloading_every_meta(mut self) -> Batch {
        self.every_meta = true;
        self
    }

    /// The next action to perform; `None` while the batch waits for the driver's
    /// answer to the last one, and once it is over.
    pub fn poll(&mut self) -> Option<Action> {
        let action = match std::mem::replace(&mut self.next, Next::Done) {
            Next::Fetch if self.left == 0 => {
                Action::Finish { cursor: self.cursor, wake: self.wake, more: self.sq_tail != self.cursor.sq_head }
            }
            Next::Fetch => {
                self.next = Next::AwaitEntry;
                Action::Fetch { index: self.cursor.sq_head }
            }
            Next::Act(action) => {
                self.next = match action {
                    Action::Run { sub, cq_index } => Next::AwaitRun { user_data: sub.user_data, cq_index },
                    Action::Meta { meta, cq_index } => Next::AwaitRun { user_data: meta.user_data, cq_index },
                    Action::Offload { meta, cq_index } => Next::AwaitOffload { meta, cq_index },
                    _ => Next::Fetch,
                };
                self.wake |= matches!(action, Action::Complete { .. });
                action
            }
            waiting @ (Next::AwaitEntry | Next::AwaitRun { .. } | Next::AwaitOffload { .. }) => {
                self.next = waiting;
                return None;
            }
            Next::Done => return None,
        };
        Some(action)
    }

    /// The entry asked for by [`Action::Fetch`]: decode it, validate it against
    /// `session`, and decide what becomes of it. Ignored unless a fetch is out.
    pub fn fetched(&mut self, entry: &[u8; wire::SQE_BYTES], session: &impl SessionView, max_io_bytes: u64) {
        if !matches!(self.next, Next::AwaitEntry) {
            return;
        }
        let cq_index = self.cursor.cq_tail;
        self.cursor.sq_head = self.cursor.sq_head.wrapping_add(1);
        self.cursor.cq_tail = self.cursor.cq_tail.wrapping_add(1);
        self.left -= 1;
        let checked = match Entry::decode(entry) {
            Err(_) => Err(Status::Malformed),
            Ok(Entry::Io(sub)) => validate::validate(&sub, session, max_io_bytes).map(|v| Entry::Io(v.submission)),
            Ok(Entry::Meta(m)) => validate::validate_meta(&m, session, max_io_bytes).map(|()| Entry::Meta(m)),
        };
        let refused = |status| Action::Complete {
            index: cq_index,
            completion: completion(Submission::peek_user_data(entry), cq_index, status, 0),
            count: Count::Refused { opcode: Submission::decode(entry).ok().map(|sub| sub.opcode), status },
        };
        self.next = Next::Act(match (checked, self.tenant) {
            (Err(status), _) => refused(status),
            (Ok(_), Tenant::Removed) => refused(Status::Cancelled),
            (Ok(Entry::Meta(meta)), _) if self.offloads(&meta, session) => Action::Offload { meta, cq_index },
            (Ok(Entry::Meta(meta)), _) => Action::Meta { meta, cq_index },
            (Ok(Entry::Io(sub)), Tenant::Direct { .. }) => Action::Run { sub, cq_index },
            (Ok(Entry::Io(sub)), Tenant::Queued { .. }) => Action::Queue { sub, cq_index },
        });
    }

    /// Whether the open-read `meta`, just taken, goes off the engine (to the I/O
    /// threads): its ring and both its memory ranges are mapped (the threads write the
    /// answer and post the completion themselves), and the host had published more
    /// entries behind it (the last of a batch runs on the engine, which would otherwise
    /// wait) or the backend may stall ([`RingMemory::MappedStalling`]); or the ring is
    /// reached with put/get over a backend that may stall ([`RingMemory::RemoteStalling`]).
    /// With [`Batch::offloading_every_meta`], every metadata entry goes off the engine
    /// where its memory allows (a request range of no bytes needs no mapping).
    fn offloads(&self, meta: &MetaSubmission, session: &impl SessionView) -> bool {
        let mapped = |id| session.region(id).is_some_and(|r| r.mapped);
        let behind = self.sq_tail != self.cursor.sq_head;
        let ranges_mapped = || mapped(meta.answer_region) && (meta.request_length == 0 || mapped(meta.request_region));
        if self.every_meta {
            return match self.memory {
                RingMemory::Mapped | RingMemory::MappedStalling => ranges_mapped(),
                RingMemory::Remote | RingMemory::RemoteStalling => true,
            };
        }
        meta.opcode == MetaOpcode::OpenRead
            && match self.memory {
                RingMemory::Mapped => behind && ranges_mapped(),
                RingMemory::MappedStalling => ranges_mapped(),
                RingMemory::RemoteStalling => true,
                RingMemory::Remote => false,
            }
    }

    /// How the run asked for by [`Action::Run`] or [`Action::Meta`] ended. Ignored
    /// unless a run is out.
    pub fn ran(&mut self, ran: Ran) {
        let Next::AwaitRun { user_data, cq_index } = self.next else { return };
        self.next = match ran {
            Ran::OnWorkers => Next::Fetch,
            Ran::Done { status, result } => Next::Act(Action::Complete {
                index: cq_index,
                completion: completion(user_data, cq_index, status, result),
                count: Count::Counted,
            }),
        };
    }

    /// Whether the entry of [`Action::Offload`] was taken off the engine; one that was
    /// not (its memory went away, its request does not decode) runs here next, as
    /// [`Action::Meta`]. Ignored unless an entry is out for it.
    pub fn offloaded(&mut self, taken: bool) {
        let Next::AwaitOffload { meta, cq_index } = self.next else { return };
        self.next = if taken { Next::Fetch } else { Next::Act(Action::Meta { meta, cq_index }) };
    }

    /// A transfer to the host failed during the last action: its data plane is closed,
    /// so the batch asks for nothing more and never finishes (the cursor stays).
    pub fn transfer_failed(&mut self) {
        self.next = Next::Done;
    }
}

/// One step of a request whose payload moves through the agent's staging region
/// (transports without mapped host memory: TCP, RDMA). The request has a pair of
/// staging halves of a chunk each (the driver's; several requests' pairs may be in flight), so the backend read of a chunk overlaps the put of the one
/// before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Backend read of `chunk` into staging half `half`; report with [`Staged::read`].
    Read { chunk: validate::Chunk, half: usize },
    /// Put the first `len` bytes of staging half `half` to the request's region at
    /// `region_offset`.
    Put { half: usize, len: usize, region_offset: u64 },
    /// Get `chunk` from the request's region into staging half 0.
    Get { chunk: validate::Chunk },
    /// Wait until every put and get issued so far is done (a flush).
    Flush,
    /// Backend write of `chunk` from staging half 0; report with [`Staged::wrote`].
    Write { chunk: validate::Chunk },
    /// Make the file durable ([`wire::FLAG_SYNC`]); report with [`Staged::synced`].
    Sync,
    /// The request is done: its completion has this status and result (payload puts
    /// may still be in flight: posting the completion flushes first).
    Done { status: Status, result: u64 },
}

/// A validated request moving through the staging region, chunk by chunk. A
/// transfer failure (put, get or flush) is not reported: the peer's data plane closes
/// and the request is dropped with it.
#[derive(Debug)]
pub struct Staged {
    sub: Submission,
    chunk_bytes: u64,
    /// Chunks started.
    started: usize,
    /// File offset of the next chunk.
    at: u64,
    /// Bytes moved so far.
    done: u64,
    next: StagedNext,
}

#[derive(Debug, Clone, Copy)]
enum StagedNext {
    /// Start the next chunk, or end.
    Chunk,
    /// Hand out this step, then go on as `then`.
    Step(Step, StagedThen),
    AwaitRead {
        chunk: validate::Chunk,
        half: usize,
    },
    AwaitWrite {
        chunk: validate::Chunk,
    },
    AwaitSync,
    Done,
}

/// Where a staged request goes once a step is handed out.
#[derive(Debug, Clone, Copy)]
enum StagedThen {
    Chunk,
    End,
    Read { chunk: validate::Chunk, half: usize },
    AwaitRead { chunk: validate::Chunk, half: usize },
    Flush(validate::Chunk),
    Write(validate::Chunk),
    AwaitWrite(validate::Chunk),
    AwaitSync,
    Done,
}

impl Staged {
    /// Move `sub`'s payload in chunks of `chunk_bytes` (> 0: the size of a staging half).
    pub fn new(sub: Submission, chunk_bytes: u64) -> Staged {
        Staged { sub, chunk_bytes, started: 0, at: sub.file_offset, done: 0, next: StagedNext::Chunk }
    }

    /// The next step; `None` while a backend piece is out, and after [`Step::Done`].
    pub fn poll(&mut self) -> Option<Step> {
        loop {
            match self.next {
                StagedNext::Chunk => self.next = self.next_chunk(),
                StagedNext::Step(step, then) => {
                    self.next = match then {
                        StagedThen::Chunk => StagedNext::Chunk,
                        StagedThen::End => self.end(),
                        StagedThen::Read { chunk, half } => {
                            StagedNext::Step(Step::Read { chunk, half }, StagedThen::AwaitRead { chunk, half })
                        }
                        StagedThen::AwaitRead { chunk, half } => StagedNext::AwaitRead { chunk, half },
                        StagedThen::Flush(chunk) => StagedNext::Step(Step::Flush, StagedThen::Write(chunk)),
                        StagedThen::Write(chunk) => {
                            StagedNext::Step(Step::Write { chunk }, StagedThen::AwaitWrite(chunk))
                        }
                        StagedThen::AwaitWrite(chunk) => StagedNext::AwaitWrite { chunk },
                        StagedThen::AwaitSync => StagedNext::AwaitSync,
                        StagedThen::Done => StagedNext::Done,
                    };
                    return Some(step);
                }
                StagedNext::AwaitRead { .. } | StagedNext::AwaitWrite { .. } | StagedNext::AwaitSync => return None,
                StagedNext::Done => return None,
            }
        }
    }

    fn next_chunk(&mut self) -> StagedNext {
        let end = self.sub.file_offset + self.sub.length;
        let region_offset = self.sub.region_offset + (self.at - self.sub.file_offset);
        let Some(chunk) = validate::chunks(self.at, region_offset, end - self.at, self.chunk_bytes).next() else {
            return self.end();
        };
        let k = self.started;
        self.started += 1;
        self.at = chunk.file_offset + chunk.length;
        match self.sub.opcode {
            wire::Opcode::Read => {
                // Double buffer: read chunk k into half k % 2 while chunk k - 1 is in
                // flight; from the third chunk on, a half is free again only after a flush.
                let half = k % 2;
                if k >= 2 {
                    StagedNext::Step(Step::Flush, StagedThen::Read { chunk, half })
                } else {
                    StagedNext::Step(Step::Read { chunk, half }, StagedThen::AwaitRead { chunk, half })
                }
            }
            wire::Opcode::Write => StagedNext::Step(Step::Get { chunk }, StagedThen::Flush(chunk)),
        }
    }

    /// Every chunk moved: sync if asked, then done.
    fn end(&self) -> StagedNext {
        if policy::syncs(&self.sub) {
            return StagedNext::Step(Step::Sync, StagedThen::AwaitSync);
        }
        StagedNext::Step(Step::Done { status: Status::Ok, result: self.done }, StagedThen::Done)
    }

    fn fail(&mut self, failure: BackendFailure) {
        self.next = StagedNext::Step(Step::Done { status: failure.status(), result: 0 }, StagedThen::Done);
    }

    /// The backend read asked for by [`Step::Read`] ended: `Ok(bytes)` (fewer than the
    /// chunk at the end of the file: the request ends there).
    pub fn read(&mut self, outcome: Result<usize, BackendFailure>) {
        let StagedNext::AwaitRead { chunk, half } = self.next else { return };
        let n = match outcome {
            Ok(n) => n.min(chunk.length as usize),
            Err(failure) => return self.fail(failure),
        };
        self.done += n as u64;
        let then = if (n as u64) < chunk.length { StagedThen::End } else { StagedThen::Chunk };
        self.next = if n > 0 {
            StagedNext::Step(Step::Put { half, len: n, region_offset: chunk.region_offset }, then)
        } else {
            match then {
                StagedThen::End => self.end(),
                _ => StagedNext::Chunk,
            }
        };
    }

    /// The backend write asked for by [`Step::Write`] ended.
    pub fn wrote(&mut self, outcome: Result<(), BackendFailure>) {
        let StagedNext::AwaitWrite { chunk } = self.next else { return };
        match outcome {
            Ok(()) => {
                self.done += chunk.length;
                self.next = StagedNext::Chunk;
            }
            Err(failure) => self.fail(failure),
        }
    }

    /// The sync asked for by [`Step::Sync`] ended.
    pub fn synced(&mut self, outcome: Result<(), BackendFailure>) {
        if !matches!(self.next, StagedNext::AwaitSync) {
            return;
        }
        match outcome {
            Ok(()) => {
                self.next = StagedNext::Step(Step::Done { status: Status::Ok, result: self.done }, StagedThen::Done)
            }
            Err(failure) => self.fail(failure),
        }
    }
}

/// The completion entry of the request taken as completion `cq_index`.
pub fn completion(user_data: u64, cq_index: u64, status: Status, result: u64) -> Completion {
    Completion { user_data, status: status as i32, result, seq: cq_index.wrapping_add(1) }
}

/// The simulated host ring of these tests serves the engine loop's tests too.
#[cfg(test)]
pub(super) mod tests;
