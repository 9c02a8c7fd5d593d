//! Which rings the engine looks at when, and whether it spins or sleeps: the engine
//! loop's bookkeeping, without I/O and with the clock as a parameter.
//!
//! A ring is *pending* when something says it may have work: its doorbell, a full scan
//! (at start, when the transport lost doorbells, and every [`IDLE_SCAN`] as a safety
//! net), a hot ring whose host published more, a batch that left entries behind
//! ([`super::protocol::Action::Finish`] `more`), or its tenant having room again. Each
//! round the engine takes every pending ring ([`Readiness::take_pending`]) and serves
//! each once, at most a [`super::protocol::RING_BATCH`]; a ring with more is pending
//! again for the next round, after the others, so between two batches of one busy ring
//! every other ready ring gets one.
//!
//! A ring is *hot* while the engine polls it directly (mapped memory, recent work): the
//! driver sets the ring's `agent_polling` word so the host skips its doorbell, and
//! clears it before sleeping ([`Readiness::cool`]). A ring is *parked* while its tenant
//! has no room for another request in flight: it is neither polled nor served, even on
//! a doorbell, until [`Readiness::unpark`] sees room.
//!
//! With nothing pending and nothing queued due, the engine spins for a while after its
//! last work (a doorbell meanwhile costs no wake-up), then sleeps until the next scan or
//! the first throttled request is due ([`Readiness::idle`], [`Readiness::sleep_for`]).
//!
//! Not here: reading doorbells or ring indices, setting the polling words, the wait on
//! the transport, the QoS queue (the driver passes in how long until its next request is
//! due), and what a ring's batch does ([`super::protocol`]).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long the engine sleeps with nothing to do before it scans every ring anyway
/// (a safety net for a lost doorbell; doorbells wake it at once).
pub const IDLE_SCAN: Duration = Duration::from_millis(200);
/// Rounds of an idle loop between looks at the clock: the engine spins on the rings
/// and doorbells in between.
const SPINS_PER_CLOCK: u32 = 64;

/// A ring by session id and ring id, as doorbells name it.
pub type RingKey = (u64, u32);

/// What the engine does when it has looked at its rings and queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Rings are pending or a queued request is due: serve them.
    Work,
    /// Nothing to do, but work ended recently: poll again at once.
    Spin,
    /// Nothing to do for a while: cool the hot rings ([`Readiness::cool`]), then sleep
    /// for [`Readiness::sleep_for`].
    Sleep,
}

/// The engine loop's view of its rings. `R` is how the driver reaches a hot ring to
/// poll it; `T` is a parked ring's tenant, asked for its room.
pub struct Readiness<R, T> {
    pending: HashSet<RingKey>,
    hot: Vec<(RingKey, R)>,
    parked: HashMap<RingKey, T>,
    scan_all: bool,
    last_scan: Instant,
    last_work: Instant,
    spins: u32,
}

impl<R, T> Readiness<R, T> {
    /// Nothing known yet: the first round scans every ring.
    pub fn new(now: Instant) -> Readiness<R, T> {
        Readiness {
            pending: HashSet::new(),
            hot: Vec::new(),
            parked: HashMap::new(),
            scan_all: true,
            last_scan: now,
            last_work: now,
            spins: 0,
        }
    }

    /// The ring may have work (its doorbell, a hot ring's new entries, a scan).
    pub fn ready(&mut self, key: RingKey) {
        self.pending.insert(key);
    }

    /// The transport dropped doorbells: look at every ring next round.
    pub fn lost_doorbells(&mut self) {
        self.scan_all = true;
    }

    /// Whether to scan every ring now: mark them [`Readiness::ready`], then call
    /// [`Readiness::scanned`].
    pub fn scan_due(&self) -> bool {
        self.scan_all
    }

    /// Every ring was marked ready at `now`.
    pub fn scanned(&mut self, now: Instant) {
        self.scan_all = false;
        self.last_scan = now;
    }

    /// The rings polled directly, for the driver to check for new entries.
    pub fn hot(&self) -> &[(RingKey, R)] {
        &self.hot
    }

    /// The hot rings `has_work` finds with new entries are pending.
    pub fn poll_hot(&mut self, has_work: impl Fn(&R) -> bool) {
        for (key, ring) in &self.hot {
            if has_work(ring) {
                self.pending.insert(*key);
            }
        }
    }

    /// Whether the ring is polled directly.
    pub fn is_hot(&self, key: RingKey) -> bool {
        self.hot.iter().any(|(k, _)| *k == key)
    }

    /// Poll the ring directly from now (the driver has set its polling word).
    pub fn heat(&mut self, key: RingKey, ring: R) {
        if !self.is_hot(key) {
            self.hot.push((key, ring));
        }
    }

    /// Leave the ring alone until `tenant` has room: not served, not polled. Returns
    /// the ring if it was hot (the driver clears its polling word: its host rings the
    /// doorbell again).
    pub fn park(&mut self, key: RingKey, tenant: T) -> Option<R> {
        self.parked.insert(key, tenant);
        self.pending.remove(&key);
        let i = self.hot.iter().position(|(k, _)| *k == key)?;
        Some(self.hot.swap_remove(i).1)
    }

    /// Rings whose tenant has room again are pending; parked ones are not, whatever
    /// rang for them.
    pub fn unpark(&mut self, room: impl Fn(&T) -> u32) {
        if self.parked.is_empty() {
            return;
        }
        let pending = &mut self.pending;
        self.parked.retain(|key, tenant| {
            let stay = room(tenant) == 0;
            if !stay {
                pending.insert(*key);
            }
            stay
        });
        let parked = &self.parked;
        pending.retain(|key| !parked.contains_key(key));
    }

    /// The engine did work outside the rings (finished requests the I/O threads handed
    /// back): polling goes on from `now`.
    pub fn worked(&mut self, now: Instant) {
        self.last_work = now;
    }

    /// What to do now, `queued_wait` being how long until a queued request is due
    /// (`None`: nothing queued) and `spin` how long to keep polling after the last work.
    /// `now` is read only at work and every 64th idle round: a spinning
    /// engine does not pay for the clock each round.
    pub fn idle(&mut self, now: impl FnOnce() -> Instant, queued_wait: Option<Duration>, spin: Duration) -> Idle {
        if !self.pending.is_empty() || queued_wait == Some(Duration::ZERO) {
            self.last_work = now();
            return Idle::Work;
        }
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(SPINS_PER_CLOCK) || now().saturating_duration_since(self.last_work) < spin {
            return Idle::Spin;
        }
        Idle::Sleep
    }

    /// Going to sleep (the driver has cleared the hot rings' polling words and fenced):
    /// the hot rings `has_work` finds with entries are pending, and none is hot any
    /// more. Returns whether any was pending (then do not sleep).
    pub fn cool(&mut self, has_work: impl Fn(&R) -> bool) -> bool {
        let before = self.pending.len();
        for (key, ring) in self.hot.drain(..) {
            if has_work(&ring) {
                self.pending.insert(key);
            }
        }
        self.pending.len() != before
    }

    /// How long to sleep: until the safety-net scan, or until the first throttled
    /// request is due (in whole milliseconds, rounded up: the transport's wait has no
    /// finer unit, and rounding down would spin).
    pub fn sleep_for(&self, now: Instant, queued_wait: Option<Duration>) -> Duration {
        let mut timeout = IDLE_SCAN.saturating_sub(now.saturating_duration_since(self.last_scan));
        if let Some(wait) = queued_wait {
            timeout = timeout.min(Duration::from_millis(wait.as_nanos().div_ceil(1_000_000) as u64));
        }
        timeout
    }

    /// Woken (or the sleep ended): scan every ring if the safety-net scan is due.
    pub fn woke(&mut self, now: Instant) {
        if now.saturating_duration_since(self.last_scan) >= IDLE_SCAN {
            self.scan_all = true;
        }
    }

    /// Every pending ring, to serve once each this round (in no particular order).
    pub fn take_pending(&mut self) -> impl Iterator<Item = RingKey> + '_ {
        self.pending.drain()
    }
}

#[cfg(test)]
mod tests;
