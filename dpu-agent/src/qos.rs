//! Tenant QoS on the agent: the data-plane scheduler's bookkeeping.
//!
//! The fairness and rate logic itself is [`dpuio_auth::qos::FairQueue`] (start-time
//! fair queueing over per-tenant token buckets). This module adds what the engine
//! needs around it, still without I/O and with the clock as a parameter:
//!
//! - [`TenantSlot`]: one tenant's in-flight count against its `max_inflight`, shared
//!   with the I/O workers that finish requests. A request counts from the moment the
//!   engine takes it off a ring until its completion is posted, whether it waits in the
//!   queue or runs; a tenant with no room has its rings left alone (the entries stay in
//!   host memory), so backpressure reaches the host without failing anything.
//! - [`Scheduler`]: the fair queue plus the tenants' slots, configured lazily from the
//!   agent's tenant table when a tenant's first entry arrives, so tenants added at run
//!   time are served without telling the engine; removed ones are dropped by
//!   [`Scheduler::retain_tenants`].
//!
//! Not here: the engine's loop, its sleeping and waking (`dataplane`); the Admin
//! service's entry point, `Agent::set_qos` (`state`), which changes the tenant table and
//! then the engine's buckets through [`Scheduler::reconfigure`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use dpuio_auth::qos::{FairQueue, TenantConfig as FairConfig};

use crate::config::QosConfig;

/// One tenant's share of the engine: its in-flight count and whether it is limited.
#[derive(Debug)]
pub struct TenantSlot {
    name: Arc<str>,
    inflight: AtomicU32,
    max_inflight: AtomicU32,
    unlimited: AtomicBool,
    /// Set while the engine has rings of this tenant parked for lack of room: the
    /// request that makes room wakes the engine.
    wake_on_room: AtomicBool,
}

impl TenantSlot {
    fn new(name: &str, qos: &QosConfig) -> TenantSlot {
        let slot = TenantSlot {
            name: Arc::from(name),
            inflight: AtomicU32::new(0),
            max_inflight: AtomicU32::new(0),
            unlimited: AtomicBool::new(true),
            wake_on_room: AtomicBool::new(false),
        };
        slot.apply(qos);
        slot
    }

    fn apply(&self, qos: &QosConfig) {
        self.max_inflight.store(qos.max_inflight.max(1), Ordering::SeqCst);
        self.unlimited.store(qos.limits.bytes_per_s == 0 && qos.limits.ops_per_s == 0, Ordering::Relaxed);
    }

    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether neither a bytes nor an ops rate limits the tenant.
    pub fn is_unlimited(&self) -> bool {
        self.unlimited.load(Ordering::Relaxed)
    }

    /// Requests the tenant may still start.
    pub fn room(&self) -> u32 {
        self.max_inflight.load(Ordering::SeqCst).saturating_sub(self.inflight.load(Ordering::SeqCst))
    }

    /// Requests in flight now.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::SeqCst)
    }

    /// `n` requests were taken off a ring.
    pub fn start(&self, n: u32) {
        self.inflight.fetch_add(n, Ordering::SeqCst);
    }

    /// `n` requests completed (or were dropped). Returns whether the engine asked to be
    /// woken when room appears (see [`TenantSlot::park`]); the flag is cleared.
    #[must_use = "wake the engine when this returns true"]
    pub fn finish(&self, n: u32) -> bool {
        let before = self.inflight.fetch_sub(n, Ordering::SeqCst);
        debug_assert!(before >= n, "tenant {}: more requests finished than started", self.name);
        self.wake_on_room.load(Ordering::SeqCst) && self.wake_on_room.swap(false, Ordering::SeqCst)
    }

    /// The engine leaves the tenant's rings until room appears; ask to be woken then.
    /// The engine must check [`TenantSlot::room`] again after this (a request may have
    /// finished just before).
    pub fn park(&self) {
        self.wake_on_room.store(true, Ordering::SeqCst);
    }
}

/// The engine's scheduler: per-tenant buckets and fair queueing of the requests that
/// passed validation, and each tenant's in-flight slot. `T` is the engine's queued
/// request (plain values in the tests).
pub struct Scheduler<T> {
    queue: FairQueue<T>,
    tenants: HashMap<Arc<str>, Arc<TenantSlot>>,
}

impl<T> Default for Scheduler<T> {
    fn default() -> Scheduler<T> {
        Scheduler::new()
    }
}

fn fair_config(qos: &QosConfig) -> FairConfig {
    FairConfig {
        limits: qos.limits,
        weight: qos.weight,
        // A request is counted in flight while it waits, so a tenant never has more
        // queued than this.
        max_queued: qos.max_inflight.max(1) as usize,
    }
}

impl<T> Scheduler<T> {
    /// No tenants yet.
    pub fn new() -> Scheduler<T> {
        Scheduler { queue: FairQueue::new(), tenants: HashMap::new() }
    }

    /// The tenant's slot; on first use its settings come from `lookup` (the agent's
    /// tenant table). `None` if the tenant is not configured (removed at run time).
    pub fn slot(
        &mut self,
        tenant: &str,
        now: Instant,
        lookup: impl FnOnce() -> Option<QosConfig>,
    ) -> Option<Arc<TenantSlot>> {
        if let Some(slot) = self.tenants.get(tenant) {
            return Some(slot.clone());
        }
        let qos = lookup()?;
        Some(self.configure(tenant, &qos, now))
    }

    /// Add a tenant or change its settings now.
    pub fn configure(&mut self, tenant: &str, qos: &QosConfig, now: Instant) -> Arc<TenantSlot> {
        self.queue.configure(tenant, fair_config(qos), now);
        match self.tenants.get(tenant) {
            Some(slot) => {
                slot.apply(qos);
                slot.clone()
            }
            None => {
                let slot = Arc::new(TenantSlot::new(tenant, qos));
                self.tenants.insert(slot.name.clone(), slot.clone());
                slot
            }
        }
    }

    /// Change a tenant's settings if the scheduler knows it (otherwise its first
    /// request will read them from the tenant table).
    pub fn reconfigure(&mut self, tenant: &str, qos: &QosConfig, now: Instant) {
        if self.tenants.contains_key(tenant) {
            self.configure(tenant, qos, now);
        }
    }

    /// Queue a request of `cost_bytes` for the tenant; given back if refused (a queue
    /// over a limit lowered at run time).
    pub fn push(&mut self, tenant: &TenantSlot, item: T, cost_bytes: u64) -> std::result::Result<(), T> {
        self.queue.push(&tenant.name, item, cost_bytes).map_err(|rejected| rejected.item)
    }

    /// The next request to run now, fairly among tenants whose buckets admit their next
    /// one; its cost is taken from its tenant's buckets.
    pub fn pop(&mut self, now: Instant) -> Option<T> {
        self.queue.pop(now).map(|(_, item)| item)
    }

    /// How long until [`Scheduler::pop`] can return something (`None`: nothing queued).
    pub fn next_ready_in(&mut self, now: Instant) -> Option<Duration> {
        self.queue.next_ready_in(now)
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Drop the tenants `keep` rejects (removed from the agent); returns their queued
    /// requests, for the engine to complete. Requests of theirs already running keep
    /// their slot alive until they finish.
    pub fn retain_tenants(&mut self, keep: impl Fn(&str) -> bool) -> Vec<T> {
        let gone: Vec<Arc<str>> = self.tenants.keys().filter(|name| !keep(name)).cloned().collect();
        let mut dropped = Vec::new();
        for name in gone {
            self.tenants.remove(&name);
            dropped.extend(self.queue.remove_tenant(&name));
        }
        dropped
    }

    /// Tenants known to the scheduler.
    pub fn tenant_count(&self) -> usize {
        self.tenants.len()
    }

    /// Each known tenant's requests in flight now (queued or running).
    pub fn in_flight(&self) -> Vec<(Arc<str>, u32)> {
        self.tenants.iter().map(|(name, slot)| (name.clone(), slot.inflight())).collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use dpuio_auth::qos::QosLimits;

    /// A tenant's QoS with a byte rate (burst a tenth of it), a weight and an in-flight cap.
    pub(crate) fn qos(bytes_per_s: u64, weight: u32, max_inflight: u32) -> QosConfig {
        QosConfig {
            limits: QosLimits { bytes_per_s, bytes_burst: bytes_per_s / 10, ops_per_s: 0, ops_burst: 0 },
            weight,
            max_inflight,
        }
    }

    #[test]
    fn slots_are_configured_lazily_and_unknown_tenants_get_none() {
        let mut s: Scheduler<u32> = Scheduler::new();
        let now = Instant::now();
        let a = s.slot("a", now, || Some(qos(0, 1, 4))).expect("configured tenant");
        assert!(a.is_unlimited());
        assert_eq!(a.room(), 4);
        // Known now: the lookup is not consulted again.
        let again = s.slot("a", now, || panic!("looked up twice")).unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        assert!(s.slot("gone", now, || None).is_none());
        assert_eq!(s.tenant_count(), 1);
    }

    #[test]
    fn inflight_room_and_the_wake_flag() {
        let mut s: Scheduler<u32> = Scheduler::new();
        let a = s.slot("a", Instant::now(), || Some(qos(0, 1, 2))).unwrap();
        a.start(2);
        assert_eq!(a.room(), 0);
        assert!(!a.finish(1), "nobody parked: no wake");
        a.start(1);
        a.park();
        assert!(a.finish(1), "the engine parked: wake it once");
        a.start(1);
        assert!(!a.finish(1), "the flag was cleared");
        assert_eq!((a.inflight(), a.room()), (1, 1));
        // Lowering the limit below what is in flight leaves no room until it drains.
        s.configure("a", &qos(0, 1, 1), Instant::now());
        assert_eq!(a.room(), 0);
        assert!(!a.finish(1));
        assert_eq!(a.room(), 1);
    }

    #[test]
    fn a_limited_tenant_waits_while_an_unlimited_one_goes_on() {
        let mut s: Scheduler<(char, u32)> = Scheduler::new();
        let t0 = Instant::now();
        // 1 MiB/s with a 100 KiB burst; requests of 64 KiB.
        let a = s.slot("a", t0, || Some(qos(1 << 20, 1, 256))).unwrap();
        let b = s.slot("b", t0, || Some(qos(0, 1, 64))).unwrap();
        assert!(!a.is_unlimited());
        for i in 0..10 {
            s.push(&a, ('a', i), 64 << 10).unwrap();
        }
        assert_eq!(s.pop(t0), Some(('a', 0)));
        assert_eq!(s.pop(t0), None, "a's burst is spent: a waits, nothing fails");
        let wait = s.next_ready_in(t0).expect("a is queued");
        assert!(wait > Duration::ZERO && wait <= Duration::from_millis(63), "{wait:?}");
        s.push(&b, ('b', 0), 4096).unwrap();
        assert_eq!(s.pop(t0), Some(('b', 0)), "b is not held up by a's limit");
        assert_eq!(s.pop(t0 + wait), Some(('a', 1)));
        // Over a simulated second a gets about its rate.
        let mut served = 0u64;
        let mut now = t0 + wait;
        let end = t0 + Duration::from_secs(1);
        for i in 0..100 {
            s.push(&a, ('a', 100 + i), 64 << 10).unwrap();
        }
        while now < end {
            while let Some(_item) = s.pop(now) {
                served += 64 << 10;
            }
            now += s.next_ready_in(now).unwrap_or(Duration::from_millis(1)).max(Duration::from_micros(1));
        }
        let rate = served as f64 / (1 << 20) as f64;
        assert!((0.85..=1.15).contains(&rate), "a got {rate:.2} MiB in a second at 1 MiB/s");
    }

    #[test]
    fn backlogged_unlimited_tenants_share_by_weight() {
        let mut s: Scheduler<char> = Scheduler::new();
        let now = Instant::now();
        let a = s.slot("a", now, || Some(qos(0, 1, 1000))).unwrap();
        let b = s.slot("b", now, || Some(qos(0, 3, 1000))).unwrap();
        for _ in 0..400 {
            s.push(&a, 'a', 64 << 10).unwrap();
            s.push(&b, 'b', 64 << 10).unwrap();
        }
        let first: Vec<char> = (0..200).map(|_| s.pop(now).unwrap()).collect();
        let bs = first.iter().filter(|&&c| c == 'b').count();
        assert!((145..=155).contains(&bs), "weight 3 against 1 should get 3/4 of 200, got {bs}");
    }

    #[test]
    fn removed_tenants_give_back_their_queue() {
        let mut s: Scheduler<u32> = Scheduler::new();
        let now = Instant::now();
        let a = s.slot("a", now, || Some(qos(0, 1, 8))).unwrap();
        let b = s.slot("b", now, || Some(qos(0, 1, 8))).unwrap();
        s.push(&a, 1, 10).unwrap();
        s.push(&b, 2, 10).unwrap();
        s.push(&a, 3, 10).unwrap();
        assert_eq!(s.retain_tenants(|t| t != "a"), [1, 3]);
        assert_eq!(s.tenant_count(), 1);
        assert_eq!(s.pop(now), Some(2));
        assert!(s.is_empty());
        // A tenant added again starts afresh.
        let a2 = s.slot("a", now, || Some(qos(0, 1, 8))).unwrap();
        assert!(!Arc::ptr_eq(&a, &a2));
    }
}
