//! Requests through one ring: the driver of [`dpuio_proto::host_ring`]. The core decides
//! (which slot, which bytes where, whether a completion is there, how long to spin and
//! sleep, what moves to a resumed session); this file performs: the stores and loads of
//! the ring's memory, the doorbell, the futex and the sleeps, and the checks of the
//! session's liveness between them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dpuio_proto::host_ring::session::{self, RingState};
use dpuio_proto::host_ring::wait::{Idle, Quiet, Sleep, Waiter};
use dpuio_proto::host_ring::{HostRing, Pushed};
use dpuio_proto::wire::{self, Completion, Opcode, Submission};
use fabric::Transport as _;

use super::{DataPlane, RegisteredRegion};
use crate::error::{Error, Result};

/// One ring of the session: its region, its id on the agent, the core that keeps its
/// indices and slots, and the session generation ([`crate::resume::Liveness`]) it was
/// registered in.
pub(super) struct Ring {
    pub(super) id: u32,
    pub(super) region: RegisteredRegion,
    pub(super) core: HostRing,
    pub(super) generation: u64,
    /// When it was last given back (or made).
    pub(super) freed: std::time::Instant,
}

impl Ring {
    fn mem(&self) -> &fabric::SharedMemory {
        self.region.shared()
    }

    /// Write an entry the core pushed.
    fn write(&mut self, p: Pushed) {
        self.region.write_at(p.offset, &p.bytes);
    }

    /// Publish `sq_tail` (release: the entries before it are written).
    pub(super) fn publish(&self, sq_tail: u64) {
        self.mem().store_u64_release(wire::SQ_TAIL_OFFSET, sq_tail);
    }

    /// Whether the agent polls the ring by itself (read after a SeqCst fence).
    pub(super) fn agent_polling(&self) -> u32 {
        self.mem().load_u32_acquire(wire::AGENT_POLLING_OFFSET)
    }

    /// Whether the next completion is there (without taking it).
    fn completion_ready(&self) -> bool {
        self.core.next_completion().is_some_and(|next| self.mem().load_u64_acquire(next.seq_offset) == next.seq)
    }

    /// The next completion, if the agent has posted it.
    fn reap(&mut self) -> Option<Completion> {
        let next = self.core.next_completion()?;
        if self.mem().load_u64_acquire(next.seq_offset) != next.seq {
            return None;
        }
        let mut bytes = [0u8; wire::CQE_BYTES];
        self.mem().read_at(next.offset, &mut bytes);
        let reaped = self.core.reap(&bytes)?;
        self.mem().store_u64_release(wire::CQ_HEAD_OFFSET, reaped.cq_head);
        Some(reaped.completion)
    }

    /// Whether the agent wakes this ring's waiters through its futex word (it has the
    /// ring mapped: shared memory).
    fn agent_wakes(&self) -> bool {
        self.mem().load_u32_acquire(wire::AGENT_WAKES_OFFSET) == 1
    }

    /// The agent's word on whether it still serves the ring.
    fn closed(&self) -> u32 {
        self.mem().load_u32_acquire(wire::RING_CLOSED_OFFSET)
    }

    /// Sleep on the ring's futex until the agent posts a completion or `timeout` passes.
    fn sleep_on_futex(&self, timeout: Duration) {
        use rustix::thread::futex;
        let mem = self.mem();
        let word = mem.atomic_u32(wire::CQ_FUTEX_OFFSET);
        let seen = word.load(std::sync::atomic::Ordering::Acquire);
        mem.store_u32_release(wire::CQ_WAITERS_OFFSET, 1);
        // Pairs with the agent's fence between posting a completion and reading cq_waiters.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if !self.completion_ready() {
            let ts =
                rustix::time::Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: i64::from(timeout.subsec_nanos()) };
            // Shared (not FUTEX_PRIVATE): the agent wakes it from another process.
            let _ = futex::wait(word, futex::Flags::empty(), seen, Some(&ts));
        }
        mem.store_u32_release(wire::CQ_WAITERS_OFFSET, 0);
    }
}

/// One request in a batch.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    pub opcode: Opcode,
    pub handle: u64,
    pub region_id: u32,
    pub region_offset: u64,
    pub file_offset: u64,
    pub length: u64,
    /// Make a write durable before it completes.
    pub sync: bool,
    /// Echoed in the completion.
    pub user_data: u64,
}

impl Request {
    /// The submission entry.
    pub(super) fn entry(&self) -> [u8; wire::SQE_BYTES] {
        Submission {
            opcode: self.opcode,
            flags: if self.sync { wire::FLAG_SYNC } else { 0 },
            user_data: self.user_data,
            handle: self.handle,
            region_id: self.region_id,
            file_offset: self.file_offset,
            region_offset: self.region_offset,
            length: self.length,
        }
        .encode()
    }
}

/// How one request ended.
#[derive(Debug, Clone, Copy)]
pub struct Done {
    pub user_data: u64,
    /// Bytes moved, or the agent's reason.
    pub result: std::result::Result<u64, wire::Status>,
}

/// Requests prepared, submitted and completed through one ring, in the shape of 3FS
/// USRBIO and cuFile's batch API: [`Batch::push`] entries, [`Batch::submit`] them
/// (one doorbell for all), then [`Batch::poll`] or [`Batch::wait`] for completions.
///
/// A batch holds its ring until dropped; dropping it with requests in flight waits for
/// them (the agent may still be writing into their regions).
///
/// When the agent restarts, the client attaches again (see [`crate::resume`]) and a
/// batch moves its entries that had not completed to a ring of the new session; the
/// caller sees a stall. Entries that pointed into the old ring's memory complete with
/// [`wire::Status::Lost`].
pub struct Batch {
    pub(super) dp: Arc<DataPlane>,
    pub(super) ring: Option<Ring>,
    /// Completions made here (entries lost with an old session's ring), handed out by
    /// the next [`Batch::poll`].
    pub(super) lost: Vec<Done>,
    /// How long waits have gone without a completion: a wait that goes quiet for
    /// [`crate::ResumeOptions::probe_after`] asks whether the agent is there.
    pub(super) quiet: Quiet,
}

impl Batch {
    pub(super) fn ring(&mut self) -> &mut Ring {
        self.ring.as_mut().expect("a live batch holds its ring")
    }

    fn core(&self) -> &HostRing {
        &self.ring.as_ref().expect("a live batch holds its ring").core
    }

    /// Entries that can still be pushed before completions must be reaped.
    pub fn room(&self) -> usize {
        self.core().room() as usize
    }

    /// Requests pushed or submitted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.ring.as_ref().map_or(0, |r| r.core.in_flight() as usize)
    }

    /// Add a request (not yet visible to the agent: see [`Batch::submit`]).
    pub fn push(&mut self, r: &Request) -> Result<()> {
        self.push_entry(&r.entry(), true)
    }

    /// Add 64 raw bytes as a submission entry, as given but for its `user_data`, which
    /// the completion echoes all the same: for tools and tests that exercise the
    /// agent's checks. A malformed entry completes with [`wire::Status::Malformed`].
    pub fn push_raw_entry(&mut self, entry: &[u8; wire::SQE_BYTES]) -> Result<()> {
        self.push_entry(entry, true)
    }

    /// Add an entry; `movable`: whether it may go to another session's ring as it is.
    pub(crate) fn push_entry(&mut self, entry: &[u8; wire::SQE_BYTES], movable: bool) -> Result<()> {
        let ring = self.ring();
        let pushed = ring
            .core
            .push(entry, movable)
            .map_err(|e| Error::DataPlane { op: "push".into(), reason: e.to_string() })?;
        ring.write(pushed);
        Ok(())
    }

    /// Make the pushed entries visible to the agent and ring its doorbell once.
    /// Returns how many were submitted.
    pub fn submit(&mut self) -> Result<usize> {
        if self.ring().generation != self.dp.live.generation() {
            self.move_to_new_session()?;
        }
        let dp = self.dp.clone();
        let ring = self.ring();
        let submit = ring.core.submit(Instant::now());
        if submit.count > 0 {
            dp.ring_doorbell(ring, submit.sq_tail)?;
        }
        Ok(submit.count as usize)
    }

    /// The client resumed on a restarted agent: take a ring of the new session and
    /// submit there every entry this one had not completed (entries pushed and not
    /// yet submitted go too); those that cannot move complete with
    /// [`wire::Status::Lost`].
    fn move_to_new_session(&mut self) -> Result<()> {
        let Some(mut old) = self.ring.take() else { return Ok(()) };
        let pending = old.core.drain();
        drop(old); // the agent that served it is gone
        let mut ring = self.dp.take_ring()?;
        let moved = session::resubmit(pending, &mut ring.core);
        tracing::info!(moved = moved.writes.len(), lost = moved.lost.len(), "resubmitting on the resumed session");
        for write in moved.writes {
            ring.write(write);
        }
        self.lost.extend(moved.lost.into_iter().map(|user_data| Done { user_data, result: Err(wire::Status::Lost) }));
        let submit = ring.core.submit(Instant::now());
        if submit.count > 0 {
            let _ = self.dp.ring_doorbell(&ring, submit.sq_tail);
        }
        self.ring = Some(ring);
        Ok(())
    }

    /// Completions available now, without waiting.
    pub fn poll(&mut self) -> Vec<Done> {
        let mut out = std::mem::take(&mut self.lost);
        let ring = self.ring();
        while let Some(c) = ring.reap() {
            out.push(Done { user_data: c.user_data, result: c.outcome() });
        }
        if !out.is_empty() {
            ring.core.completed(Instant::now());
            if self.dp.progress_on_reap {
                // libfabric shm: hand back the command-queue slots the agent's writes
                // took, now that it is done with these requests (see `progress_on_reap`).
                self.dp.worker.progress();
            }
        }
        out
    }

    /// Wait until at least `min` completions are available (fewer if fewer are in
    /// flight), or `timeout` passes; returns every completion available then.
    pub fn wait(&mut self, min: usize, timeout: Duration) -> Result<Vec<Done>> {
        self.wait_spinning(min, timeout, Duration::ZERO)
    }

    /// [`Batch::wait`], polling up to `spin` before the first sleep: for calls that
    /// answer in microseconds and carry no payload (a stat), where the wake-up of a
    /// sleeping thread is most of the time a call takes. Polling costs this host the CPU
    /// of the wait, so payload waits do not spin.
    pub(crate) fn wait_spinning(&mut self, min: usize, timeout: Duration, spin: Duration) -> Result<Vec<Done>> {
        let min = min.min(self.core().submitted() as usize + self.lost.len());
        let start = Instant::now();
        let mut done = self.poll();
        let mut waiter = Waiter::new(start, timeout, spin, self.core());
        while done.len() < min {
            let more = self.poll();
            if !more.is_empty() {
                done.extend(more);
                waiter.progressed();
                self.quiet.heard();
                continue;
            }
            if waiter.idle(Instant::now) == Idle::Spin {
                std::hint::spin_loop();
                continue;
            }
            if self.session_moved()? {
                waiter.restart(Instant::now());
                continue;
            }
            let now = Instant::now();
            if waiter.expired(now) {
                return Err(Error::DataPlane {
                    op: "wait for completions".into(),
                    reason: format!(
                        "{} of {min} completions still missing after {timeout:?} (is the agent alive?)",
                        min - done.len()
                    ),
                });
            }
            let ring = self.ring();
            match waiter.sleep(now, ring.agent_wakes(), &ring.core) {
                Sleep::Futex(timeout) => ring.sleep_on_futex(timeout),
                Sleep::For(pause) => std::thread::sleep(pause),
            }
        }
        Ok(done)
    }

    /// Before a waiter sleeps: whether the session still serves this ring. Fails when
    /// it ended (or resuming gave up); `true` when the client resumed and the entries
    /// moved to a ring of the new session; probes the agent when the wait went quiet.
    fn session_moved(&mut self) -> Result<bool> {
        if let Some(status) = self.dp.ended() {
            return Err(Error::from_status("wait for completions", status));
        }
        let live = self.dp.live.clone();
        match RingState::of(self.ring().closed(), live.options.enabled()) {
            RingState::Served => {}
            // The agent stops: wait for it (and the supervisor) below.
            RingState::Stopping => live.suspect(),
            RingState::Ended => {
                // The agent ended the session and says so. Fail now, without help from
                // the supervisor, which may share this thread's runtime; gRPC calls say
                // why, and the next of them attaches again where resuming may.
                live.suspect();
                self.dp.session_ended(tonic::Status::failed_precondition("the session ended"));
                return Err(Error::DataPlane {
                    op: "wait for completions".into(),
                    reason: "the agent no longer serves this session's rings (the session ended)".into(),
                });
            }
        }
        if live.options.enabled() {
            if let Some(why) = live.failed() {
                return Err(Error::DataPlane { op: "wait for completions".into(), reason: why });
            }
            if self.ring().generation != live.generation() {
                self.move_to_new_session()?;
                return Ok(true);
            }
        }
        // Quiet for a while: is the agent there? Also with resuming off: an agent that
        // restarted and forgot the session then fails the wait within a probe, not at
        // the next lease renewal (a third of the lease) or the timeout.
        if self.quiet.probe(Instant::now(), live.options.probe_after) {
            live.suspect();
        }
        Ok(false)
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if self.dp.ended().is_some() {
            // The agent no longer serves this session's rings: nothing will complete.
            let _ = self.ring.take().map(std::mem::forget);
            return;
        }
        let submitted = self.ring.as_ref().map_or(0, |r| r.core.submitted() as usize);
        if submitted > 0 && self.wait(submitted, self.dp.options.timeout).is_err() {
            // The agent may still write into this ring: never hand it out again.
            if let Some(ring) = self.ring.take() {
                self.dp.abandon_ring(ring);
            }
            return;
        }
        if let Some(mut ring) = self.ring.take() {
            // Entries pushed but never submitted are withdrawn.
            ring.core.withdraw_staged();
            self.dp.give_ring(ring);
        }
    }
}
