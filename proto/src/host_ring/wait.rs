//! How a host thread waits for completions: spin briefly (small requests complete in
//! microseconds), then sleep, on the ring's futex where the agent wakes it, else in
//! steps, so that a long request costs the host almost no CPU.
//!
//! [`Waiter`] decides; the driver polls the ring between its answers, performs the
//! sleeps, and checks the session (ended, closed, resumed) before each sleep.

use std::time::{Duration, Instant};

use super::HostRing;

/// Polls of the completion ring before a waiting thread sleeps. Measured: one futex
/// sleep and wake per wait is the host's main cost at queue depth 1, and a longer spin
/// only adds to it, so the spin is short.
pub const SPIN_POLLS: u32 = 32;

/// A wait whose next completion is due later than this (the ring's usual latency over
/// the requests in flight) skips the spin before the first sleep. Measured: the spin
/// was a tenth of the host's CPU of 1 MiB reads at queue depth 1, while at depth 32 (a
/// completion every few microseconds) it keeps the waiting thread out of a sleep.
pub const LONG_WAIT: Duration = Duration::from_micros(20);

/// Where the agent cannot wake a waiting thread (no shared mapping), it sleeps in
/// steps growing from 5 us up to 5 << this (160 us): longer steps saved little CPU
/// and added up to a step of latency to every request.
pub const MAX_SLEEP_SHIFT: u32 = 5;

/// Where the agent cannot wake a waiting thread, its first sleep is this share of the
/// ring's usual latency (hybrid polling, as Linux does for NVMe). Measured on libfabric
/// shm, 1 MiB reads at queue depth 1: 75% cut the host's wake-ups but tripled the
/// median latency (150 to 400 us), because the agent's engine, which has no doorbell
/// fd to sleep on there, went to sleep between requests; half keeps it polling.
pub const FIRST_SLEEP_PERCENT: u32 = 50;

/// A first sleep shorter than this is taken in steps instead.
const MIN_FIRST_SLEEP: Duration = Duration::from_micros(20);

/// The longest single sleep: the waiter looks at the session at least this often.
pub const MAX_SLEEP: Duration = Duration::from_millis(100);

/// One wait for completions.
#[derive(Debug, Clone)]
pub struct Waiter {
    timeout: Duration,
    deadline: Instant,
    /// Poll until then before the first sleep (calls that carry no payload).
    spin_until: Option<Instant>,
    /// Polls (then sleeps) since the last completion.
    idle: u32,
}

/// What a waiter does after a poll that found nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Poll again at once (`std::hint::spin_loop` between).
    Spin,
    /// Check the session, then sleep ([`Waiter::sleep`]).
    Sleep,
}

/// How to sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sleep {
    /// On the ring's futex, for at most this long (the agent wakes it on a completion).
    Futex(Duration),
    /// For this long, then poll.
    For(Duration),
}

impl Waiter {
    /// A wait that may last `timeout`, polling for `spin` before its first sleep (zero:
    /// the usual short spin), on `ring` as it is now.
    pub fn new(now: Instant, timeout: Duration, spin: Duration, ring: &HostRing) -> Waiter {
        // When the next completion is far off, sleep without the short spin.
        let next_due = ring.latency() / (ring.in_flight() as u32).max(1);
        Waiter {
            timeout,
            deadline: now + timeout,
            spin_until: (!spin.is_zero()).then(|| now + spin),
            idle: if next_due > LONG_WAIT { SPIN_POLLS - 1 } else { 0 },
        }
    }

    /// A poll found completions: the next quiet spell starts with a spin.
    pub fn progressed(&mut self) {
        self.idle = 0;
    }

    /// A poll found nothing: spin, or go on to sleep. `now` is read only once the short
    /// spin is over: a spinning waiter does not pay for the clock each poll.
    pub fn idle(&mut self, now: impl FnOnce() -> Instant) -> Idle {
        self.idle += 1;
        if self.idle < SPIN_POLLS {
            return Idle::Spin;
        }
        if self.spin_until.is_some_and(|t| now() < t) {
            self.idle = SPIN_POLLS - 1; // the first sleep is still to come
            return Idle::Spin;
        }
        Idle::Sleep
    }

    /// The entries moved to another ring: the wait starts over, with its whole timeout.
    pub fn restart(&mut self, now: Instant) {
        self.deadline = now + self.timeout;
        self.idle = 0;
    }

    /// Whether the wait has lasted past its timeout.
    pub fn expired(&self, now: Instant) -> bool {
        now > self.deadline
    }

    /// The wait's timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How to sleep now: on the futex if the agent wakes this ring's waiters
    /// (`agent_wakes`, its [`crate::wire::AGENT_WAKES_OFFSET`] word is 1); else the
    /// first sleep takes most of the ring's usual latency, less what has passed, and
    /// later ones grow in steps. Never past the deadline, nor longer than [`MAX_SLEEP`].
    pub fn sleep(&self, now: Instant, agent_wakes: bool, ring: &HostRing) -> Sleep {
        let left = self.deadline.saturating_duration_since(now).min(MAX_SLEEP);
        if agent_wakes {
            return Sleep::Futex(left);
        }
        let first =
            (ring.latency() * FIRST_SLEEP_PERCENT / 100).saturating_sub(ring.waiting_for(now).unwrap_or(Duration::MAX));
        if self.idle == SPIN_POLLS && first > MIN_FIRST_SLEEP {
            Sleep::For(first.min(left))
        } else {
            Sleep::For(Duration::from_micros(5 << (self.idle - SPIN_POLLS).min(MAX_SLEEP_SHIFT)))
        }
    }
}

/// A wait that goes quiet for a while asks whether the agent is there (a keep-alive out
/// of turn). Kept by a batch across its waits.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet {
    since: Option<Instant>,
}

impl Quiet {
    /// A completion came.
    pub fn heard(&mut self) {
        self.since = None;
    }

    /// Nothing came at `now`: whether to probe the agent, having heard nothing for
    /// `probe_after` (the quiet spell then starts again).
    pub fn probe(&mut self, now: Instant, probe_after: Duration) -> bool {
        let since = *self.since.get_or_insert(now);
        if now.saturating_duration_since(since) >= probe_after {
            self.since = Some(now);
            return true;
        }
        false
    }
}
