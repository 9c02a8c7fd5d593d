//! Session moves: what a waiting host makes of the agent's word on a ring, and what
//! becomes of a ring's unfinished entries when the agent restarted and the client
//! attached again on a new session with new rings.
//!
//! Reads and writes go again, as they are, on the new ring (a write carries its file
//! offset, so running it twice leaves the same bytes). Entries that point into the old
//! ring's own memory (metadata requests and answers) cannot move: they complete as
//! [`wire::Status::Lost`], and the calls that made them run them again where that is safe
//! ([`MetaCall::runs_again`](super::meta::MetaCall::runs_again)).

use super::{HostRing, Pending, Pushed};
use crate::wire;

/// What the agent's [`wire::RING_CLOSED_OFFSET`] word says to a waiting host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingState {
    /// The agent serves the ring.
    Served,
    /// The agent is stopping and the client resumes: probe it, and wait for it to come
    /// back (the waiter's entries then move to the new session).
    Stopping,
    /// The agent ended the session (or stops, and the client does not resume): the
    /// wait fails now, without help from the supervisor, which may share the waiting
    /// thread's runtime.
    Ended,
}

impl RingState {
    /// The state `closed` (the word) says, for a client that `resumes` or not.
    pub fn of(closed: u32, resumes: bool) -> RingState {
        match closed {
            0 => RingState::Served,
            wire::RING_CLOSED_STOPPING if resumes => RingState::Stopping,
            _ => RingState::Ended,
        }
    }
}

/// The unfinished entries of an old ring, submitted again on a new one ([`resubmit`]).
#[derive(Debug, Default)]
pub struct Moved {
    /// Entries to write into the new ring, in the order they were first pushed.
    pub writes: Vec<Pushed>,
    /// The `user_data` of entries that could not move: each completes as
    /// [`wire::Status::Lost`].
    pub lost: Vec<u64>,
}

/// Submit `pending` (an old ring's unfinished entries, from [`HostRing::drain`], oldest
/// first) again on `new`, an empty ring of a new session. Movable entries are pushed with
/// their own `user_data`; the rest, and any that do not fit (a shorter ring), are lost.
/// The caller writes [`Moved::writes`], then submits `new`.
pub fn resubmit(pending: Vec<Pending>, new: &mut HostRing) -> Moved {
    let mut moved = Moved::default();
    for Pending { entry, user_data, movable } in pending {
        match movable.then(|| new.push(&entry, true)) {
            Some(Ok(write)) => moved.writes.push(write),
            _ => moved.lost.push(user_data),
        }
    }
    moved
}
