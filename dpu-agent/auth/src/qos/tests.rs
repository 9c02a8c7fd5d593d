use super::*;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

fn limits(bytes_per_s: u64, bytes_burst: u64) -> QosLimits {
    QosLimits { bytes_per_s, bytes_burst, ..QosLimits::UNLIMITED }
}

fn config(limits: QosLimits) -> TenantConfig {
    TenantConfig { limits, ..TenantConfig::default() }
}

#[test]
fn bucket_basics() {
    let t0 = Instant::now();
    let mut unlimited = TokenBucket::unlimited();
    assert!(unlimited.is_unlimited());
    for _ in 0..1000 {
        unlimited.try_take(u64::MAX, t0).unwrap();
    }

    // 1000 units/s, burst 100: starts full.
    let mut b = TokenBucket::new(1000, 100);
    b.try_take(60, t0).unwrap();
    b.try_take(40, t0).unwrap();
    // Empty: 10 units need 10 ms.
    assert_eq!(b.try_take(10, t0), Err(10 * MS));
    assert_eq!(b.try_take(10, t0 + 5 * MS), Err(5 * MS));
    b.try_take(10, t0 + 10 * MS).unwrap();
    // Refill stops at the burst.
    assert_eq!(b.wait_for(100, t0 + 10 * S), Duration::ZERO);
    b.try_take(100, t0 + 10 * S).unwrap();
    assert_eq!(b.wait_for(1, t0 + 10 * S), MS);

    // Sub-nanosecond waits round up, never down to zero.
    let mut fast = TokenBucket::new(3_000_000_000, 1);
    fast.try_take(1, t0).unwrap();
    assert_eq!(fast.wait_for(1, t0), Duration::from_nanos(1));

    // Burst 0 is one second's worth.
    assert_eq!(TokenBucket::new(500, 0).burst(), 500);
}

#[test]
fn bucket_larger_than_burst_leaves_a_debt() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(1000, 100);
    // 1000 units with a burst of 100: admitted when full, then 1 s of debt.
    b.try_take(1000, t0).unwrap();
    assert_eq!(b.wait_for(1, t0), Duration::from_millis(901));
    assert!(b.try_take(1000, t0 + 900 * MS).is_err());
    // Full again after the debt (900 ms) plus the burst (100 ms).
    b.try_take(1000, t0 + 1000 * MS).unwrap();
    // Long-run rate is the configured one: 10 such takes need ~9 s more.
    let mut now = t0 + 1000 * MS;
    let mut taken = 1;
    while taken < 10 {
        match b.try_take(1000, now) {
            Ok(()) => taken += 1,
            Err(wait) => now += wait,
        }
    }
    assert_eq!(now - t0, 10 * S);
}

#[test]
fn bucket_time_going_backwards_is_harmless() {
    let t0 = Instant::now() + 10 * S;
    let mut b = TokenBucket::new(1000, 100);
    b.try_take(100, t0).unwrap();
    // An earlier `now` refills nothing and does not move the reference back.
    assert_eq!(b.wait_for(50, t0 - 5 * S), 50 * MS);
    assert_eq!(b.wait_for(50, t0 + 50 * MS), Duration::ZERO);
}

#[test]
fn bucket_set_limits() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(1000, 1000);
    b.try_take(1000, t0).unwrap();
    // 500 ms at the old rate is 500 units; then the burst drops to 200: capped.
    b.set_limits(100, 200, t0 + 500 * MS);
    assert_eq!(b.wait_for(200, t0 + 500 * MS), Duration::ZERO);
    b.try_take(200, t0 + 500 * MS).unwrap();
    assert_eq!(b.wait_for(100, t0 + 500 * MS), S, "new rate: 100/s");
    // Unlimited and back: starts full.
    b.set_limits(0, 0, t0 + S);
    b.try_take(u64::MAX, t0 + S).unwrap();
    b.set_limits(10, 10, t0 + S);
    b.try_take(10, t0 + S).unwrap();
    assert!(b.try_take(1, t0 + S).is_err());
}

#[test]
fn tenant_qos_takes_both_or_neither() {
    let t0 = Instant::now();
    let mut qos =
        TenantQos::new(QosLimits { bytes_per_s: 1_000_000, bytes_burst: 1_000_000, ops_per_s: 10, ops_burst: 2 });
    assert_eq!(qos.admit(100, t0), Admission::Now);
    assert_eq!(qos.admit(100, t0), Admission::Now);
    // Ops exhausted: the bytes bucket is not charged.
    assert_eq!(qos.admit(100, t0), Admission::After(100 * MS));
    assert_eq!(qos.bytes.wait_for(999_800, t0), Duration::ZERO);
    // Bytes exhausted: the ops bucket is not charged.
    assert_eq!(qos.admit(999_800, t0 + 100 * MS), Admission::Now);
    // 200 bytes left plus 100 ms of refill: 99 800 bytes short, 99.8 ms.
    assert_eq!(qos.admit(200_000, t0 + 200 * MS), Admission::After(Duration::from_micros(99_800)));
    assert_eq!(qos.ops.wait_for(1, t0 + 200 * MS), Duration::ZERO);
    assert_eq!(qos.limits().ops_burst, 2);
    qos.set_limits(QosLimits::UNLIMITED, t0 + 200 * MS);
    assert_eq!(qos.admit(u64::MAX, t0 + 200 * MS), Admission::Now);
}

/// A dispatcher on a simulated clock: pops whenever the queue allows, each item taking
/// `cost / link_bytes_per_s` of service (0: instantaneous), and sleeps until
/// `next_ready_in` when everything is throttled.
struct Sim {
    t0: Instant,
    now: Instant,
    link_bytes_per_s: u64,
}

impl Sim {
    fn new(link_bytes_per_s: u64) -> Sim {
        let t0 = Instant::now();
        Sim { t0, now: t0, link_bytes_per_s }
    }

    fn service(&self, cost: u64) -> Duration {
        (cost * 1_000_000_000).checked_div(self.link_bytes_per_s).map_or(Duration::ZERO, Duration::from_nanos)
    }

    /// Pop one item, or advance the clock to when one (or `deadline`) is due. Returns
    /// the item, and the time it was popped.
    fn step<T>(&mut self, q: &mut FairQueue<T>, deadline: Instant) -> Option<(Arc<str>, T, Instant)> {
        if let Some((tenant, item)) = q.pop(self.now) {
            return Some((tenant, item, self.now));
        }
        let wait = q.next_ready_in(self.now).unwrap_or(deadline.saturating_duration_since(self.now));
        assert!(!wait.is_zero(), "pop returned None although an item was ready");
        self.now = (self.now + wait).min(deadline.max(self.now + Duration::from_nanos(1)));
        None
    }
}

#[test]
fn rate_limited_tenant_gets_its_rate() {
    const RATE: u64 = 10_000_000; // 10 MB/s
    const ITEM: u64 = 4096;
    let mut sim = Sim::new(0);
    let mut q = FairQueue::new();
    q.configure("a", config(limits(RATE, RATE / 10)), sim.now);
    let end = sim.t0 + 10 * S;
    let mut bytes = 0u64;
    while sim.now < end {
        while q.queued("a") < 64 {
            q.push("a", (), ITEM).unwrap();
        }
        if let Some((_, (), _)) = sim.step(&mut q, end) {
            bytes += ITEM;
        }
    }
    let expected = RATE * 10;
    let error = (bytes as f64 - expected as f64).abs() / expected as f64;
    assert!(error <= 0.02, "{bytes} bytes in 10 s, expected {expected} ±2% (error {error:.4})");
}

#[test]
fn set_limits_takes_effect_at_run_time() {
    const ITEM: u64 = 8192;
    let mut sim = Sim::new(0);
    let mut q = FairQueue::new();
    q.configure("a", config(limits(1_000_000, 100_000)), sim.now);
    let mut per_phase = [0u64; 2];
    for (phase, (rate, until)) in [(1_000_000u64, 5u32), (4_000_000, 10)].into_iter().enumerate() {
        if phase == 1 {
            q.set_limits("a", limits(rate, 100_000), sim.now).unwrap();
            assert_eq!(q.limits("a").unwrap().bytes_per_s, rate);
        }
        let end = sim.t0 + until * S;
        while sim.now < end {
            while q.queued("a") < 16 {
                q.push("a", (), ITEM).unwrap();
            }
            if sim.step(&mut q, end).is_some() {
                per_phase[phase] += ITEM;
            }
        }
    }
    for (got, want) in per_phase.into_iter().zip([5_000_000u64, 20_000_000]) {
        let error = (got as f64 - want as f64).abs() / want as f64;
        assert!(error <= 0.03, "got {got}, want {want} ({error:.4})");
    }
    assert!(matches!(q.set_limits("nobody", QosLimits::UNLIMITED, sim.now), Err(QosError::UnknownTenant { .. })));
}

#[test]
fn equal_weights_get_equal_service() {
    let now = Instant::now();
    // Different item sizes: fairness is in bytes (no per-item overhead here).
    let mut q = FairQueue::with_item_overhead(0);
    q.configure("small", TenantConfig { max_queued: 100_000, ..config(QosLimits::UNLIMITED) }, now);
    q.configure("big", TenantConfig { max_queued: 100_000, ..config(QosLimits::UNLIMITED) }, now);
    for _ in 0..20_000 {
        q.push("small", 4096u64, 4096).unwrap();
    }
    for _ in 0..2_000 {
        q.push("big", 65536u64, 65536).unwrap();
    }
    let mut served: HashMap<Arc<str>, u64> = HashMap::new();
    for _ in 0..10_000 {
        let (tenant, bytes) = q.pop(now).unwrap();
        *served.entry(tenant).or_default() += bytes;
        let (small, big) = (served.get("small").copied().unwrap_or(0), served.get("big").copied().unwrap_or(0));
        assert!(small.abs_diff(big) <= 65536, "small {small} big {big}");
    }

    // With the default per-item overhead, equal item sizes still split evenly.
    let mut q = FairQueue::new();
    for t in ["a", "b", "c"] {
        q.configure(t, config(QosLimits::UNLIMITED), now);
        for _ in 0..300 {
            q.push(t, (), 16384).unwrap();
        }
    }
    let mut counts: HashMap<Arc<str>, usize> = HashMap::new();
    for i in 1..=600 {
        *counts.entry(q.pop(now).unwrap().0).or_default() += 1;
        let (min, max) = (counts.values().min().unwrap(), counts.values().max().unwrap());
        assert!(i < 3 || max - min <= 1, "{counts:?}");
    }
}

#[test]
fn weights_share_service() {
    let now = Instant::now();
    let mut q = FairQueue::new();
    q.configure("gold", TenantConfig { weight: 3, ..TenantConfig::default() }, now);
    q.configure("bronze", TenantConfig { weight: 1, ..TenantConfig::default() }, now);
    for _ in 0..1000 {
        q.push("gold", (), 4096).unwrap();
        q.push("bronze", (), 4096).unwrap();
    }
    let gold = (0..800).filter(|_| &*q.pop(now).unwrap().0 == "gold").count();
    assert!(gold.abs_diff(600) <= 1, "gold got {gold} of 800");
}

#[test]
fn low_rate_tenant_is_not_delayed_by_a_flood() {
    // A 1 GB/s link. "flood" keeps 1 MiB items queued with no limit; "small" sends a
    // 4 KiB item every 7 ms, well within its limit.
    const FLOOD_ITEM: u64 = 1 << 20;
    const SMALL_ITEM: u64 = 4096;
    let mut sim = Sim::new(1_000_000_000);
    let mut q = FairQueue::new();
    q.configure("flood", TenantConfig { max_queued: 4096, ..TenantConfig::default() }, sim.now);
    q.configure("small", config(QosLimits { ops_per_s: 1000, ..limits(10_000_000, 64 * 1024) }), sim.now);
    let end = sim.t0 + 2 * S;
    let mut next_small = sim.t0 + 3 * MS;
    let mut small_sent = Vec::new();
    let mut worst = Duration::ZERO;
    let mut flood_between = 0usize;
    let mut worst_flood_between = 0usize;
    let mut served_small = 0usize;
    while sim.now < end {
        while q.queued("flood") < 1000 {
            q.push("flood", None, FLOOD_ITEM).unwrap();
        }
        while next_small <= sim.now {
            q.push("small", Some(next_small), SMALL_ITEM).unwrap();
            small_sent.push(next_small);
            next_small += 7 * MS;
        }
        let Some((tenant, sent, at)) = sim.step(&mut q, end) else { continue };
        match sent {
            Some(sent) => {
                served_small += 1;
                worst = worst.max(at - sent);
                worst_flood_between = worst_flood_between.max(flood_between);
                flood_between = 0;
                sim.now += sim.service(SMALL_ITEM);
            }
            None => {
                assert_eq!(&*tenant, "flood");
                if q.queued("small") > 0 {
                    flood_between += 1;
                }
                sim.now += sim.service(FLOOD_ITEM);
            }
        }
    }
    assert!(served_small >= small_sent.len() - 1, "{served_small} of {}", small_sent.len());
    // The small item waits at most for the flood item already in service.
    let one_item = sim.service(FLOOD_ITEM);
    assert!(worst <= one_item, "worst wait {worst:?}, one flood item takes {one_item:?}");
    assert!(worst_flood_between <= 1, "{worst_flood_between} flood items served while a small one waited");
}

#[test]
fn throttled_tenant_does_not_block_others() {
    let mut sim = Sim::new(0);
    let mut q = FairQueue::new();
    q.configure("slow", config(limits(1000, 1000)), sim.now);
    q.configure("fast", config(QosLimits::UNLIMITED), sim.now);
    for _ in 0..10 {
        q.push("slow", "slow", 1000).unwrap();
    }
    // The first slow item uses the burst; the rest must wait 1 s each.
    assert_eq!(&*q.pop(sim.now).unwrap().0, "slow");
    for _ in 0..100 {
        q.push("fast", "fast", 1000).unwrap();
    }
    for _ in 0..100 {
        assert_eq!(q.pop(sim.now).unwrap().1, "fast");
    }
    assert!(q.pop(sim.now).is_none());
    assert_eq!(q.next_ready_in(sim.now), Some(S));
    sim.now += S;
    assert_eq!(q.pop(sim.now).unwrap().1, "slow");
    assert_eq!(q.len(), 8);

    // Throttled for a long time, it does not bank credit: when it refills, a
    // newcomer and it alternate instead of it being served in a burst.
    q.set_limits("slow", QosLimits::UNLIMITED, sim.now).unwrap();
    for _ in 0..8 {
        q.push("fast", "fast", 1000).unwrap();
    }
    let order: Vec<_> = (0..16).map(|_| q.pop(sim.now).unwrap().1).collect();
    for pair in order.chunks(2) {
        assert!(pair.contains(&"slow") && pair.contains(&"fast"), "{order:?}");
    }
    assert!(q.is_empty());
    assert_eq!(q.next_ready_in(sim.now), None);
}

#[test]
fn queue_limits_and_unknown_tenants() {
    let now = Instant::now();
    let mut q = FairQueue::new();
    q.configure("a", TenantConfig { max_queued: 2, ..TenantConfig::default() }, now);
    q.push("a", 1, 10).unwrap();
    q.push("a", 2, 10).unwrap();
    let rejected = q.push("a", 3, 10).unwrap_err();
    assert_eq!(rejected.item, 3);
    assert_eq!(rejected.error, QosError::QueueFull { tenant: "a".into(), limit: 2 });
    assert!(rejected.to_string().contains("retry later"));
    let rejected = q.push("b", 4, 10).unwrap_err();
    assert_eq!(rejected.item, 4);
    assert!(matches!(rejected.error, QosError::UnknownTenant { .. }));

    // Reconfiguring keeps the queue; raising the limit admits more.
    q.configure("a", TenantConfig { max_queued: 3, ..TenantConfig::default() }, now);
    q.push("a", 3, 10).unwrap();
    assert_eq!(q.queued("a"), 3);

    // Removing a tenant gives its items back in order and leaves no trace.
    q.configure("b", TenantConfig::default(), now);
    q.push("b", 9, 10).unwrap();
    assert_eq!(q.remove_tenant("a"), vec![1, 2, 3]);
    assert_eq!(q.remove_tenant("a"), Vec::<i32>::new());
    assert_eq!(q.len(), 1);
    assert_eq!(q.pop(now).unwrap(), (Arc::from("b"), 9));
    assert!(q.pop(now).is_none());
}

#[test]
fn zero_cost_items_cannot_starve_others() {
    let now = Instant::now();
    let mut q = FairQueue::new();
    q.configure("meta", TenantConfig { max_queued: 10_000, ..TenantConfig::default() }, now);
    q.configure("data", TenantConfig::default(), now);
    for _ in 0..10_000 {
        q.push("meta", "meta", 0).unwrap();
    }
    q.push("data", "data", 4096).unwrap();
    // Zero-byte items still cost the per-item overhead: "data" (4 KiB + overhead)
    // is served within the first few pops.
    let position = (0..10).position(|_| q.pop(now).unwrap().1 == "data");
    assert!(position.is_some_and(|p| p <= 2), "{position:?}");
}
