//! The host's side of a ring pair, as state machines without I/O: what the host does
//! with a ring, given what it reads there. The agent's side is the engine's
//! `dataplane/protocol.rs`; the two meet only in the bytes of [`crate::wire`].
//!
//! The host owns `sq_tail` (entries it published) and `cq_head` (completions it reaped).
//! A [`HostRing`] keeps both, with the slot each unfinished entry holds, and answers
//! in values: where to write an entry and which bytes ([`HostRing::push`]), which
//! `sq_tail` to publish ([`HostRing::submit`]), where the next completion will appear
//! and which `seq` word says it has ([`HostRing::next_completion`]), and what a
//! completion's bytes mean ([`HostRing::reap`]). The driver (the shim's `dataplane`)
//! performs: it stores, loads, fences, rings the doorbell and sleeps.
//!
//! Around it, without I/O either: how a waiting thread spins and sleeps ([`wait`]),
//! what becomes of unfinished entries when the agent restarts and the session moves
//! to a new ring ([`session`]), and the host's choices for metadata entries: where
//! their requests and answers go in a ring's region, how many go in one submission,
//! when one runs again, how an answer reads ([`meta`]).
//!
//! Nothing here trusts the agent: a completion is taken only when its `seq` word is the
//! one expected next, never when nothing is in flight; an echo that names no slot
//! is answered as the agent said; no sequence of agent writes can make the host's
//! counters claim more in flight than the ring holds.
//!
//! Not here: memory (loads and stores of the ring's words, its entries, the answer
//! areas), the futex, the doorbell's transport, the clock (every `now` is passed in),
//! the session's liveness (the shim's `resume`).

pub mod meta;
pub mod session;
mod slots;
pub mod wait;

use std::time::{Duration, Instant};

use crate::wire::{self, CQE_BYTES, Completion, SQE_BYTES};

pub use slots::Pending;
use slots::{Slots, with_user_data};

/// The host's side of one ring pair.
#[derive(Debug)]
pub struct HostRing {
    entries: u32,
    /// Entries pushed: `[0, sq_tail)`, published or not.
    sq_tail: u64,
    /// Completions reaped: `[0, cq_head)`.
    cq_head: u64,
    /// Entries pushed and not yet published (the newest ones).
    staged: u64,
    slots: Slots,
    latency: Latency,
}

/// Why an entry could not be pushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// As many entries in flight as the ring holds.
    #[error("the ring is full: submit and reap completions first")]
    Full,
    /// Every slot is held (an agent that echoed other values for some entries, whose
    /// slots stay held until nothing is in flight).
    #[error("no free slot: submit and reap completions first")]
    NoSlot,
}

/// An entry to write: `bytes` at `offset` of the ring's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    pub offset: usize,
    pub bytes: [u8; SQE_BYTES],
}

/// Entries to make visible to the agent ([`HostRing::submit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submit {
    /// How many were staged; 0: nothing to publish, no doorbell.
    pub count: u64,
    /// Store this at [`wire::SQ_TAIL_OFFSET`] (release), then decide on the doorbell
    /// ([`HostRing::needs_doorbell`]).
    pub sq_tail: u64,
}

/// Where the next completion appears once the agent posts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextCompletion {
    /// The completion entry's offset in the ring's region.
    pub offset: usize,
    /// Its `seq` word's offset: load it (acquire) and compare with `seq`.
    pub seq_offset: usize,
    /// The value that says the entry is posted: the completion's index plus one.
    pub seq: u64,
}

/// A completion taken ([`HostRing::reap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    /// The completion, with the caller's `user_data` in place of the slot's.
    pub completion: Completion,
    /// Store this at [`wire::CQ_HEAD_OFFSET`] (release): the slot is the agent's again.
    pub cq_head: u64,
}

impl HostRing {
    /// A new ring of `entries` (a power of two, as [`wire::RingHeader`] checks).
    pub fn new(entries: u32) -> HostRing {
        HostRing::starting_at(entries, 0)
    }

    /// A ring whose counters start at `index` on both sides (a ring is registered at
    /// 0; other starts test the counters' wrap past `u64::MAX`).
    pub fn starting_at(entries: u32, index: u64) -> HostRing {
        HostRing {
            entries,
            sq_tail: index,
            cq_head: index,
            staged: 0,
            slots: Slots::new(entries),
            latency: Latency::default(),
        }
    }

    /// Entries of the ring.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Entries pushed so far: the `sq_tail` the next publication stores.
    pub fn sq_tail(&self) -> u64 {
        self.sq_tail
    }

    /// Completions reaped so far: the `cq_head` last stored.
    pub fn cq_head(&self) -> u64 {
        self.cq_head
    }

    /// Entries pushed and not yet reaped (staged ones included).
    pub fn in_flight(&self) -> u64 {
        self.sq_tail.wrapping_sub(self.cq_head)
    }

    /// Entries pushed and not yet published.
    pub fn staged(&self) -> u64 {
        self.staged
    }

    /// Entries published and not yet reaped.
    pub fn submitted(&self) -> u64 {
        self.in_flight() - self.staged
    }

    /// Entries that can still be pushed before completions must be reaped.
    pub fn room(&self) -> u64 {
        u64::from(self.entries) - self.in_flight()
    }

    /// Take a slot for `entry` (`movable`: it may go to another session's ring as it
    /// is) and say where its bytes go: the entry with the slot's number as its
    /// `user_data`, which the completion echoes.
    pub fn push(&mut self, entry: &[u8; SQE_BYTES], movable: bool) -> Result<Pushed, PushError> {
        if self.room() == 0 {
            return Err(PushError::Full);
        }
        let slot = self.slots.take(entry, movable).ok_or(PushError::NoSlot)?;
        let offset = wire::sqe_offset(self.entries, self.sq_tail);
        self.sq_tail = self.sq_tail.wrapping_add(1);
        self.staged += 1;
        Ok(Pushed { offset, bytes: with_user_data(entry, u64::from(slot)) })
    }

    /// Publish the staged entries: what to store as `sq_tail`, and how many they are.
    /// The first publication with nothing in flight starts the latency clock.
    pub fn submit(&mut self, now: Instant) -> Submit {
        let count = std::mem::take(&mut self.staged);
        if count > 0 {
            self.latency.submitted_at.get_or_insert(now);
        }
        Submit { count, sq_tail: self.sq_tail }
    }

    /// Whether the agent needs a doorbell after a publication, given its
    /// [`wire::AGENT_POLLING_OFFSET`] word read after a SeqCst fence: not while it polls
    /// the ring by itself.
    pub fn needs_doorbell(agent_polling: u32) -> bool {
        agent_polling == 0
    }

    /// Where the next completion will appear; `None` when nothing published is in
    /// flight (then no completion can be due, whatever the ring's memory holds).
    pub fn next_completion(&self) -> Option<NextCompletion> {
        if self.submitted() == 0 {
            return None;
        }
        let offset = wire::cqe_offset(self.entries, self.cq_head);
        Some(NextCompletion { offset, seq_offset: offset + wire::CQE_SEQ_OFFSET, seq: self.cq_head.wrapping_add(1) })
    }

    /// Take the completion whose bytes the driver read at [`NextCompletion::offset`]
    /// once its `seq` word matched; `None` (nothing taken) if nothing is in flight or
    /// the bytes' `seq` is not the one expected (a torn or stale entry).
    ///
    /// An echo that names a held slot gets the caller's `user_data` back; any other
    /// echo is answered as the agent said. Once nothing is in flight, slots still held
    /// by entries whose completions echoed something else are freed.
    pub fn reap(&mut self, bytes: &[u8; CQE_BYTES]) -> Option<Reaped> {
        let next = self.next_completion()?;
        let mut completion = Completion::decode(bytes).ok()?;
        if completion.seq != next.seq {
            return None;
        }
        self.cq_head = self.cq_head.wrapping_add(1);
        if let Some(user_data) = self.slots.finish(completion.user_data) {
            completion.user_data = user_data;
        }
        if self.in_flight() == 0 && self.slots.held() != 0 {
            self.slots.drain();
        }
        Some(Reaped { completion, cq_head: self.cq_head })
    }

    /// Completions were handed out (reaped ones, or entries lost with an old ring):
    /// one latency sample, from the first publication to now; the clock starts again
    /// if entries are still in flight.
    pub fn completed(&mut self, now: Instant) {
        let in_flight = self.in_flight();
        self.latency.completed(now, in_flight);
    }

    /// Forget the staged entries (pushed, never published): the ring goes back to its
    /// pool as it was before they were pushed. If nothing is in flight then, slots still
    /// held by entries whose completions echoed something else are freed, as after a reap.
    pub fn withdraw_staged(&mut self) {
        let n = std::mem::take(&mut self.staged);
        self.sq_tail = self.sq_tail.wrapping_sub(n);
        self.slots.withdraw(n);
        if self.in_flight() == 0 && self.slots.held() != 0 {
            self.slots.drain();
        }
    }

    /// Every entry not completed, oldest first (staged ones too), leaving the ring with
    /// no slot held. For moving them to another ring: this one is not used again.
    pub fn drain(&mut self) -> Vec<Pending> {
        self.staged = 0;
        self.slots.drain()
    }

    /// The usual time from a publication to its first completion (a moving average);
    /// zero before the first sample.
    pub fn latency(&self) -> Duration {
        self.latency.average
    }

    /// How long ago the oldest unanswered publication was, if one is.
    pub fn waiting_for(&self, now: Instant) -> Option<Duration> {
        self.latency.submitted_at.map(|t| now.saturating_duration_since(t))
    }
}

/// The ring's usual latency: a waiter sleeps most of it in one go where the agent
/// cannot wake it (hybrid polling, as Linux does for NVMe), and skips the spin when the
/// next completion is far off.
#[derive(Debug, Default)]
struct Latency {
    /// When the oldest publication not yet answered by a completion was made.
    submitted_at: Option<Instant>,
    /// Moving average of the time from a publication to its first completion.
    average: Duration,
}

impl Latency {
    fn completed(&mut self, now: Instant, in_flight: u64) {
        let Some(at) = self.submitted_at.take() else { return };
        let sample = now.saturating_duration_since(at);
        self.average = if self.average.is_zero() { sample } else { (self.average * 7 + sample) / 8 };
        if in_flight > 0 {
            self.submitted_at = Some(now);
        }
    }
}

#[cfg(test)]
mod tests;
