//! How much: token buckets, per-tenant admission and fair scheduling across tenants.
//!
//! Pure logic: no I/O, no clock. Every call takes `now: Instant`, so tests run with a
//! simulated clock (a base `Instant` plus offsets) and the agent passes
//! `Instant::now()` (or `tokio::time::Instant::now().into_std()`).
//!
//! - [`TokenBucket`]: a rate and a burst, integer arithmetic in nanosecond-scaled
//!   units (no drift over long runs). A request larger than the burst is admitted when
//!   the bucket is full and leaves a debt, so big chunks pass at the configured average
//!   rate instead of never.
//! - [`TenantQos`]: a bytes bucket and an ops bucket; [`TenantQos::admit`] takes from
//!   both or from neither.
//! - [`FairQueue`]: per-tenant FIFO queues served by start-time fair queueing (SFQ,
//!   Goyal, Vin and Cheng, SIGCOMM 1996) among the tenants whose buckets admit their
//!   head item. Chosen over deficit round robin because its latency bound does not
//!   depend on a quantum: a newly active tenant's item gets the lowest start tag and is
//!   served next, so it waits at most for the item already in service.
//!
//! # Fairness unit
//!
//! Service is measured in `cost_bytes + item_overhead_bytes` divided by the tenant's
//! weight. The per-item overhead (default [`DEFAULT_ITEM_OVERHEAD_BYTES`]) charges
//! metadata operations and tiny reads for the work they cause, and stops a tenant that
//! sends zero-byte items from being served ahead of everyone else forever.
//!
//! # Throttled tenants
//!
//! A tenant whose bucket does not admit its head item is skipped, and its start tag is
//! raised to the current virtual time, so it does not bank credit while throttled and
//! cannot burst past others when its bucket refills (its bucket already bounds it).
//!
//! # Not here
//!
//! In-flight limits and the timer that wakes the dispatcher: the engine keeps those and
//! uses [`FairQueue::next_ready_in`] to know how long to sleep.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Token units are scaled by this (one per nanosecond at one unit per second), so
/// refills are exact integers.
const SCALE: i128 = 1_000_000_000;

/// Default virtual cost added to every item, in bytes.
pub const DEFAULT_ITEM_OVERHEAD_BYTES: u64 = 4096;

/// Largest tenant weight.
pub const MAX_WEIGHT: u32 = 1000;

/// Default per-tenant queue length limit.
pub const DEFAULT_MAX_QUEUED: usize = 1024;

/// A token bucket: `rate_per_s` units per second, at most `burst` stored.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate_per_s: u64,
    burst: u64,
    /// Stored units times [`SCALE`]; negative after a take larger than the burst.
    balance: i128,
    /// When `balance` was last brought up to date; `None` until first use.
    last: Option<Instant>,
}

impl TokenBucket {
    /// A bucket refilling at `rate_per_s` up to `burst`, starting full. Rate 0 means
    /// unlimited; burst 0 means one second's worth (`rate_per_s`).
    pub fn new(rate_per_s: u64, burst: u64) -> TokenBucket {
        let burst = if burst == 0 { rate_per_s } else { burst };
        TokenBucket { rate_per_s, burst, balance: i128::from(burst) * SCALE, last: None }
    }

    /// A bucket that admits everything.
    pub fn unlimited() -> TokenBucket {
        TokenBucket::new(0, 0)
    }

    /// The refill rate, units per second (0: unlimited).
    pub fn rate_per_s(&self) -> u64 {
        self.rate_per_s
    }

    /// The most units stored.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Whether the bucket admits everything.
    pub fn is_unlimited(&self) -> bool {
        self.rate_per_s == 0
    }

    /// Change rate and burst at run time. Time up to `now` is accounted at the old rate;
    /// the stored amount is capped at the new burst (a debt is kept).
    pub fn set_limits(&mut self, rate_per_s: u64, burst: u64, now: Instant) {
        self.refill(now);
        let was_unlimited = self.is_unlimited();
        let burst = if burst == 0 { rate_per_s } else { burst };
        self.rate_per_s = rate_per_s;
        self.burst = burst;
        let cap = i128::from(burst) * SCALE;
        self.balance = if was_unlimited { cap } else { self.balance.min(cap) };
    }

    /// Take `amount` if the bucket admits it at `now`; otherwise `Err(wait)`, how long
    /// until it will (assuming nothing else is taken meanwhile).
    pub fn try_take(&mut self, amount: u64, now: Instant) -> Result<(), Duration> {
        match self.wait_for(amount, now) {
            Duration::ZERO => {
                self.take(amount);
                Ok(())
            }
            wait => Err(wait),
        }
    }

    /// How long until `amount` is admitted (zero: now). Takes nothing.
    pub fn wait_for(&mut self, amount: u64, now: Instant) -> Duration {
        if self.is_unlimited() {
            return Duration::ZERO;
        }
        self.refill(now);
        let needed = i128::from(amount.min(self.burst)) * SCALE - self.balance;
        if needed <= 0 {
            return Duration::ZERO;
        }
        let rate = i128::from(self.rate_per_s);
        let nanos = (needed + rate - 1) / rate;
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Take `amount` unconditionally (after [`TokenBucket::wait_for`] said zero).
    fn take(&mut self, amount: u64) {
        if !self.is_unlimited() {
            self.balance -= i128::from(amount) * SCALE;
        }
    }

    fn refill(&mut self, now: Instant) {
        let Some(last) = self.last else {
            self.last = Some(now);
            return;
        };
        // A `now` earlier than the last one (callers on several threads) refills nothing
        // and does not move the reference point back.
        let Some(elapsed) = now.checked_duration_since(last) else {
            return;
        };
        self.last = Some(now);
        let cap = i128::from(self.burst) * SCALE;
        let added = elapsed.as_nanos().saturating_mul(u128::from(self.rate_per_s));
        let added = i128::try_from(added).unwrap_or(i128::MAX);
        self.balance = self.balance.saturating_add(added).min(cap);
    }
}

/// Rate limits of one tenant. A rate of 0 means unlimited; a burst of 0 means one
/// second's worth.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QosLimits {
    /// Payload bytes per second.
    pub bytes_per_s: u64,
    /// Most bytes admitted at once after an idle period.
    pub bytes_burst: u64,
    /// Operations per second.
    pub ops_per_s: u64,
    /// Most operations admitted at once after an idle period.
    pub ops_burst: u64,
}

impl QosLimits {
    /// No limit.
    pub const UNLIMITED: QosLimits = QosLimits { bytes_per_s: 0, bytes_burst: 0, ops_per_s: 0, ops_burst: 0 };
}

/// Whether an operation may start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Yes; its bytes and one operation were taken from the buckets.
    Now,
    /// Not before this much time has passed; nothing was taken.
    After(Duration),
}

/// The two buckets of one tenant.
#[derive(Clone, Debug)]
pub struct TenantQos {
    /// Payload bytes.
    pub bytes: TokenBucket,
    /// Operations.
    pub ops: TokenBucket,
}

impl TenantQos {
    /// Buckets for `limits`, starting full.
    pub fn new(limits: QosLimits) -> TenantQos {
        TenantQos {
            bytes: TokenBucket::new(limits.bytes_per_s, limits.bytes_burst),
            ops: TokenBucket::new(limits.ops_per_s, limits.ops_burst),
        }
    }

    /// The current limits (bursts as resolved: 0 became the rate).
    pub fn limits(&self) -> QosLimits {
        QosLimits {
            bytes_per_s: self.bytes.rate_per_s(),
            bytes_burst: self.bytes.burst(),
            ops_per_s: self.ops.rate_per_s(),
            ops_burst: self.ops.burst(),
        }
    }

    /// Change the limits at run time (see [`TokenBucket::set_limits`]).
    pub fn set_limits(&mut self, limits: QosLimits, now: Instant) {
        self.bytes.set_limits(limits.bytes_per_s, limits.bytes_burst, now);
        self.ops.set_limits(limits.ops_per_s, limits.ops_burst, now);
    }

    /// How long until an operation of `bytes` is admitted (zero: now). Takes nothing.
    pub fn wait_for(&mut self, bytes: u64, now: Instant) -> Duration {
        self.bytes.wait_for(bytes, now).max(self.ops.wait_for(1, now))
    }

    /// Admit an operation of `bytes` at `now`: take from both buckets, or from neither.
    pub fn admit(&mut self, bytes: u64, now: Instant) -> Admission {
        match self.wait_for(bytes, now) {
            Duration::ZERO => {
                self.bytes.take(bytes);
                self.ops.take(1);
                Admission::Now
            }
            wait => Admission::After(wait),
        }
    }
}

/// Settings of one tenant in a [`FairQueue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantConfig {
    /// Rate limits.
    pub limits: QosLimits,
    /// Share of service when several tenants are backlogged (1 to [`MAX_WEIGHT`]; a
    /// tenant of weight 2 gets twice the service of one of weight 1).
    pub weight: u32,
    /// Most items queued for the tenant; [`FairQueue::push`] refuses more.
    pub max_queued: usize,
}

impl Default for TenantConfig {
    fn default() -> TenantConfig {
        TenantConfig { limits: QosLimits::UNLIMITED, weight: 1, max_queued: DEFAULT_MAX_QUEUED }
    }
}

/// Why the queue refused something.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QosError {
    /// The tenant has not been configured with [`FairQueue::configure`].
    #[error("tenant {tenant:?} has no QoS configuration")]
    UnknownTenant {
        /// The tenant.
        tenant: String,
    },
    /// The tenant already has `limit` items queued: back off and retry (the agent
    /// reports this to the client as "resource exhausted").
    #[error("tenant {tenant:?} already has {limit} operations queued; retry later")]
    QueueFull {
        /// The tenant.
        tenant: String,
        /// Its queue length limit.
        limit: usize,
    },
}

/// An item [`FairQueue::push`] refused, given back with the reason.
pub struct Rejected<T> {
    /// The item, untouched.
    pub item: T,
    /// Why.
    pub error: QosError,
}

impl<T> fmt::Debug for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejected").field("error", &self.error).finish_non_exhaustive()
    }
}

impl<T> fmt::Display for Rejected<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<T> std::error::Error for Rejected<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

struct Tenant<T> {
    name: Arc<str>,
    qos: TenantQos,
    weight: u32,
    max_queued: usize,
    queue: VecDeque<(T, u64)>,
    /// Start tag of the head item (valid while the queue is not empty).
    head_tag: u128,
    /// Finish tag of the last item served.
    finish_tag: u128,
    /// The key under which the tenant sits in `ready` (while backlogged).
    key: Option<(u128, u64)>,
}

/// Per-tenant queues served fairly among tenants whose rate limits admit their next
/// item; see the module documentation.
pub struct FairQueue<T> {
    tenants: HashMap<Arc<str>, Tenant<T>>,
    /// Backlogged tenants by (head start tag, arrival sequence number).
    ready: BTreeSet<(u128, u64, Arc<str>)>,
    virtual_time: u128,
    seq: u64,
    len: usize,
    item_overhead_bytes: u64,
}

impl<T> Default for FairQueue<T> {
    fn default() -> FairQueue<T> {
        FairQueue::new()
    }
}

impl<T> fmt::Debug for FairQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairQueue")
            .field("tenants", &self.tenants.len())
            .field("queued", &self.len)
            .field("item_overhead_bytes", &self.item_overhead_bytes)
            .finish()
    }
}

impl<T> FairQueue<T> {
    /// An empty queue with no tenants and [`DEFAULT_ITEM_OVERHEAD_BYTES`].
    pub fn new() -> FairQueue<T> {
        FairQueue::with_item_overhead(DEFAULT_ITEM_OVERHEAD_BYTES)
    }

    /// An empty queue charging `item_overhead_bytes` per item on top of its cost.
    pub fn with_item_overhead(item_overhead_bytes: u64) -> FairQueue<T> {
        FairQueue {
            tenants: HashMap::new(),
            ready: BTreeSet::new(),
            virtual_time: 0,
            seq: 0,
            len: 0,
            item_overhead_bytes,
        }
    }

    /// Add a tenant, or change an existing tenant's settings at run time (its queue is
    /// kept; a lower `max_queued` only refuses new items). The weight is clamped to
    /// 1..=[`MAX_WEIGHT`].
    pub fn configure(&mut self, tenant: &str, config: TenantConfig, now: Instant) {
        let weight = config.weight.clamp(1, MAX_WEIGHT);
        match self.tenants.get_mut(tenant) {
            Some(state) => {
                state.qos.set_limits(config.limits, now);
                state.weight = weight;
                state.max_queued = config.max_queued;
            }
            None => {
                let name: Arc<str> = Arc::from(tenant);
                self.tenants.insert(
                    name.clone(),
                    Tenant {
                        name,
                        qos: TenantQos::new(config.limits),
                        weight,
                        max_queued: config.max_queued,
                        queue: VecDeque::new(),
                        head_tag: 0,
                        finish_tag: 0,
                        key: None,
                    },
                );
            }
        }
    }

    /// Change a tenant's rate limits at run time.
    pub fn set_limits(&mut self, tenant: &str, limits: QosLimits, now: Instant) -> Result<(), QosError> {
        let state = self.tenants.get_mut(tenant).ok_or_else(|| QosError::UnknownTenant { tenant: tenant.into() })?;
        state.qos.set_limits(limits, now);
        Ok(())
    }

    /// A tenant's current limits.
    pub fn limits(&self, tenant: &str) -> Option<QosLimits> {
        self.tenants.get(tenant).map(|state| state.qos.limits())
    }

    /// Remove a tenant and return its queued items, oldest first.
    pub fn remove_tenant(&mut self, tenant: &str) -> Vec<T> {
        let Some(state) = self.tenants.remove(tenant) else {
            return Vec::new();
        };
        if let Some((tag, seq)) = state.key {
            self.ready.remove(&(tag, seq, state.name.clone()));
        }
        self.len -= state.queue.len();
        state.queue.into_iter().map(|(item, _)| item).collect()
    }

    /// Queue `item` for `tenant`; `cost_bytes` is what it will take from the tenant's
    /// bytes bucket (its payload size) and, with the per-item overhead, its share of
    /// service. Refused, with the item given back, for an unknown tenant or a full
    /// queue.
    pub fn push(&mut self, tenant: &str, item: T, cost_bytes: u64) -> Result<(), Rejected<T>> {
        let Some(state) = self.tenants.get_mut(tenant) else {
            return Err(Rejected { item, error: QosError::UnknownTenant { tenant: tenant.into() } });
        };
        if state.queue.len() >= state.max_queued {
            let error = QosError::QueueFull { tenant: tenant.into(), limit: state.max_queued };
            return Err(Rejected { item, error });
        }
        state.queue.push_back((item, cost_bytes));
        self.len += 1;
        if state.queue.len() == 1 {
            // Newly backlogged: start no earlier than now in virtual time (no credit for
            // idle periods), and no earlier than its previous item's finish.
            state.head_tag = self.virtual_time.max(state.finish_tag);
            self.seq += 1;
            state.key = Some((state.head_tag, self.seq));
            self.ready.insert((state.head_tag, self.seq, state.name.clone()));
        }
        Ok(())
    }

    /// The next item to serve at `now`: among tenants whose buckets admit their head
    /// item, the one with the smallest start tag. Its cost and one operation are taken
    /// from the tenant's buckets. `None` if the queue is empty or every backlogged
    /// tenant is throttled; then [`FairQueue::next_ready_in`] says how long to wait.
    pub fn pop(&mut self, now: Instant) -> Option<(Arc<str>, T)> {
        let mut skipped = Vec::new();
        let mut chosen = None;
        for entry in &self.ready {
            let state = self.tenants.get_mut(&entry.2).expect("ready tenants exist");
            let cost = state.queue.front().expect("ready tenants are backlogged").1;
            match state.qos.admit(cost, now) {
                Admission::Now => {
                    chosen = Some(entry.clone());
                    break;
                }
                Admission::After(_) => skipped.push(entry.clone()),
            }
        }
        let item = chosen.map(|entry| {
            self.ready.remove(&entry);
            let (tag, _, name) = entry;
            self.virtual_time = self.virtual_time.max(tag);
            let overhead = self.item_overhead_bytes;
            let state = self.tenants.get_mut(&name).expect("chosen tenant exists");
            let (item, cost) = state.queue.pop_front().expect("chosen tenant is backlogged");
            let service = (u128::from(cost) + u128::from(overhead)) * u128::from(MAX_WEIGHT) / u128::from(state.weight);
            state.finish_tag = tag + service.max(1);
            state.key = None;
            if !state.queue.is_empty() {
                state.head_tag = state.finish_tag;
                self.seq += 1;
                state.key = Some((state.head_tag, self.seq));
                self.ready.insert((state.head_tag, self.seq, name.clone()));
            }
            self.len -= 1;
            (name, item)
        });
        // Throttled tenants do not bank credit: their head starts no earlier than the
        // current virtual time.
        for entry in skipped {
            if entry.0 < self.virtual_time {
                self.ready.remove(&entry);
                let state = self.tenants.get_mut(&entry.2).expect("skipped tenant exists");
                state.head_tag = self.virtual_time;
                state.key = Some((self.virtual_time, entry.1));
                self.ready.insert((self.virtual_time, entry.1, entry.2));
            }
        }
        item
    }

    /// How long until [`FairQueue::pop`] can return an item: `None` if nothing is
    /// queued, zero if something is admissible now, else the shortest wait among the
    /// backlogged tenants' head items (assuming no configuration change meanwhile).
    pub fn next_ready_in(&mut self, now: Instant) -> Option<Duration> {
        let mut soonest = None;
        for entry in &self.ready {
            let state = self.tenants.get_mut(&entry.2).expect("ready tenants exist");
            let cost = state.queue.front().expect("ready tenants are backlogged").1;
            let wait = state.qos.wait_for(cost, now);
            if wait.is_zero() {
                return Some(wait);
            }
            soonest = Some(soonest.map_or(wait, |s: Duration| s.min(wait)));
        }
        soonest
    }

    /// Items queued in all.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Items queued for `tenant`.
    pub fn queued(&self, tenant: &str) -> usize {
        self.tenants.get(tenant).map_or(0, |state| state.queue.len())
    }
}

#[cfg(test)]
mod tests;
