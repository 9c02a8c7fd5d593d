//! What the agent counts, for Prometheus (`[metrics] listen`) and `dpuctl status`.
//!
//! One [`Metrics`] per agent holds every metric family in a `prometheus-client`
//! registry. The hot paths never look a label set up: a session is given its tenant's
//! [`TenantMetrics`] when it attaches, a handle of plain atomic counters and histograms
//! that belong to the families, and the engine's threads count through it. A label
//! lookup happens only on paths that are rare by nature (an error's status, a gRPC
//! call's method) or at scrape time.
//!
//! What is cheaper to read than to count (sessions, handles, regions, requests in
//! flight, key versions, the transports' own figures) is read when scraped, through
//! [`Gauges`], which the agent implements; so this room imports none above it.
//!
//! The families, their labels and meaning are listed in `docs/metrics.md`.
//!
//! What it deliberately does not do: push anywhere, keep history, or label by
//! anything an untrusted host chooses (paths, session ids, unknown method names):
//! every label value comes from a closed set or the agent's own tenant table.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use dpuio_backend::{Attr, Container, DirEntry, NsPath, Object, OpenOptions};
use dpuio_proto::wire;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::runtime::lock;

pub mod grpc;
pub mod http;

/// What a tenant did: data-plane requests and namespace calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
    Mount,
    Lookup,
    Stat,
    Mkdir,
    Readdir,
    Open,
    Create,
    Close,
    Remove,
    Rename,
    Truncate,
    Sync,
    /// A data-plane entry too malformed to say what it asked for.
    Unknown,
}

impl Op {
    pub const ALL: [Op; 15] = [
        Op::Read,
        Op::Write,
        Op::Mount,
        Op::Lookup,
        Op::Stat,
        Op::Mkdir,
        Op::Readdir,
        Op::Open,
        Op::Create,
        Op::Close,
        Op::Remove,
        Op::Rename,
        Op::Truncate,
        Op::Sync,
        Op::Unknown,
    ];

    /// The `op` label.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Mount => "mount",
            Op::Lookup => "lookup",
            Op::Stat => "stat",
            Op::Mkdir => "mkdir",
            Op::Readdir => "readdir",
            Op::Open => "open",
            Op::Create => "create",
            Op::Close => "close",
            Op::Remove => "remove",
            Op::Rename => "rename",
            Op::Truncate => "truncate",
            Op::Sync => "sync",
            Op::Unknown => "unknown",
        }
    }

    /// The operation of a data-plane opcode.
    pub fn of(opcode: wire::Opcode) -> Op {
        match opcode {
            wire::Opcode::Read => Op::Read,
            wire::Opcode::Write => Op::Write,
        }
    }

    /// The operation of a metadata entry on the data plane, named as its gRPC call is;
    /// an open-read (open, read whole, close in one entry) counts as a read.
    pub fn of_meta(opcode: wire::MetaOpcode) -> Op {
        match opcode {
            wire::MetaOpcode::Stat | wire::MetaOpcode::StatHandle => Op::Stat,
            wire::MetaOpcode::Open => Op::Open,
            wire::MetaOpcode::Create => Op::Create,
            wire::MetaOpcode::Close => Op::Close,
            wire::MetaOpcode::OpenRead => Op::Read,
            wire::MetaOpcode::Lookup => Op::Lookup,
            wire::MetaOpcode::Readdir => Op::Readdir,
            wire::MetaOpcode::Remove => Op::Remove,
        }
    }
}

/// The `status` label of a data-plane completion.
pub fn wire_status_name(status: wire::Status) -> &'static str {
    match status {
        wire::Status::Ok => "ok",
        wire::Status::Malformed => "malformed",
        wire::Status::BadRegion => "bad_region",
        wire::Status::OutOfRange => "out_of_range",
        wire::Status::BadHandle => "bad_handle",
        wire::Status::Access => "access",
        wire::Status::TooLarge => "too_large",
        wire::Status::Io => "io",
        wire::Status::Busy => "busy",
        wire::Status::Integrity => "integrity",
        wire::Status::Cancelled => "cancelled",
        wire::Status::Unavailable => "unavailable",
        // A status added to the wire format after this list.
        _ => "other",
    }
}

/// The `status`/`code` label of a gRPC status code (the names of the gRPC spec, in
/// lower case).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "ok",
        Cancelled => "cancelled",
        Unknown => "unknown",
        InvalidArgument => "invalid_argument",
        DeadlineExceeded => "deadline_exceeded",
        NotFound => "not_found",
        AlreadyExists => "already_exists",
        PermissionDenied => "permission_denied",
        ResourceExhausted => "resource_exhausted",
        FailedPrecondition => "failed_precondition",
        Aborted => "aborted",
        OutOfRange => "out_of_range",
        Unimplemented => "unimplemented",
        Internal => "internal",
        Unavailable => "unavailable",
        DataLoss => "data_loss",
        Unauthenticated => "unauthenticated",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabel {
    tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantOpLabels {
    tenant: String,
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    tenant: String,
    op: &'static str,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantReasonLabels {
    tenant: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodCodeLabels {
    method: String,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantMemoryLabel {
    tenant: String,
    memory: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabel {
    provider: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;
type Seconds = Counter<f64, AtomicU64>;

/// Data-plane requests and backend calls: 1 µs to about 8 s, doubling.
fn io_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-6, 2.0, 24))
}

/// gRPC calls: 50 µs to about 6.5 s, doubling.
fn call_histogram() -> Histogram {
    Histogram::new(exponential_buckets(50e-6, 2.0, 18))
}

/// The agent's metrics: the registry the exposition encodes, the families, and the
/// per-tenant handles made so far.
pub struct Metrics {
    registry: Mutex<Registry>,
    read_bytes: Family<TenantLabel, Counter>,
    written_bytes: Family<TenantLabel, Counter>,
    ops: Family<TenantOpLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    request_seconds: Histograms<TenantOpLabels>,
    throttled_seconds: Family<TenantLabel, Seconds>,
    integrity_failures: Family<TenantLabel, Counter>,
    grpc_seconds: Histograms<MethodLabel>,
    grpc_calls: Family<MethodCodeLabels, Counter>,
    backend_seconds: Histograms<OpLabel>,
    /// Doorbells the engine received that do not decode as one (the transports count
    /// those that fail their own framing: `dpuio_transport_malformed_doorbells_total`).
    pub undecodable_doorbells: Counter,
    /// Rings stopped because their host wrote indices that make no sense.
    pub broken_rings: Counter,
    /// Hosts whose data plane was closed after a transfer to them failed.
    pub failed_peers: Counter,
    put_temps_removed: Family<TenantReasonLabels, Counter>,
    put_temps_not_removed: Family<TenantLabel, Counter>,
    tenants: Mutex<HashMap<String, Arc<TenantMetrics>>>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// Every family registered, no tenant yet.
    pub fn new() -> Metrics {
        let m = Metrics {
            registry: Mutex::new(Registry::with_prefix("dpuio")),
            read_bytes: Family::default(),
            written_bytes: Family::default(),
            ops: Family::default(),
            errors: Family::default(),
            request_seconds: Family::new_with_constructor(io_histogram as fn() -> Histogram),
            throttled_seconds: Family::default(),
            integrity_failures: Family::default(),
            grpc_seconds: Family::new_with_constructor(call_histogram as fn() -> Histogram),
            grpc_calls: Family::default(),
            backend_seconds: Family::new_with_constructor(io_histogram as fn() -> Histogram),
            undecodable_doorbells: Counter::default(),
            broken_rings: Counter::default(),
            failed_peers: Counter::default(),
            put_temps_removed: Family::default(),
            put_temps_not_removed: Family::default(),
            tenants: Mutex::new(HashMap::new()),
        };
        {
            let mut r = lock(&m.registry);
            for (name, help, family) in [
                ("read_bytes", "Bytes the tenant read on the data plane", &m.read_bytes),
                ("written_bytes", "Bytes the tenant wrote on the data plane", &m.written_bytes),
                (
                    "integrity_failures",
                    "Data-plane requests that failed an integrity check (encrypted tenants)",
                    &m.integrity_failures,
                ),
            ] {
                r.register(name, help, family.clone());
            }
            r.register(
                "operations",
                "Operations the tenant completed (data-plane requests and namespace calls), failed ones included",
                m.ops.clone(),
            );
            r.register("errors", "Operations of the tenant that failed or were refused, by status", m.errors.clone());
            r.register(
                "request_duration_seconds",
                "Data-plane requests from taken off the ring to completed (QoS queueing included)",
                m.request_seconds.clone(),
            );
            r.register(
                "qos_throttled_seconds",
                "Time the tenant's data-plane requests waited in the QoS scheduler (rates and fair sharing)",
                m.throttled_seconds.clone(),
            );
            r.register(
                "grpc_request_duration_seconds",
                "Control-plane gRPC calls until their response headers, by method",
                m.grpc_seconds.clone(),
            );
            r.register("grpc_requests", "Control-plane gRPC calls by method and status code", m.grpc_calls.clone());
            r.register(
                "backend_duration_seconds",
                "Storage backend calls, all tenants, by backend operation",
                m.backend_seconds.clone(),
            );
            r.register(
                "put_temps_removed",
                "Temporary files of unfinished whole-file puts the agent removed, by why (session_closed, \
                 session_expired, not_resumed)",
                m.put_temps_removed.clone(),
            );
            r.register(
                "put_temps_remove_failures",
                "Removals of a put's temporary file that failed (tried again a lease later, and at the next start)",
                m.put_temps_not_removed.clone(),
            );
            for (name, help, counter) in [
                ("doorbells_undecodable", "Doorbells the engine could not decode (ignored)", &m.undecodable_doorbells),
                (
                    "rings_broken",
                    "Rings no longer served: their host wrote indices that make no sense",
                    &m.broken_rings,
                ),
                ("peers_failed", "Hosts whose data plane was closed after a transfer to them failed", &m.failed_peers),
            ] {
                r.register(name, help, counter.clone());
            }
        }
        m
    }

    /// The handle of `tenant`'s counters, made on first use (a configured tenant's
    /// series exist from the start, at zero).
    pub fn tenant(&self, tenant: &str) -> Arc<TenantMetrics> {
        if let Some(t) = lock(&self.tenants).get(tenant) {
            return t.clone();
        }
        let made = Arc::new(TenantMetrics::new(self, tenant));
        lock(&self.tenants).entry(tenant.to_owned()).or_insert(made).clone()
    }

    /// The backend's histograms, for a thread that calls the backend.
    pub fn backend_times(&self) -> BackendTimes {
        let h = |op| self.backend_seconds.get_or_create_owned(&OpLabel { op });
        BackendTimes {
            read: h("read"),
            write: h("write"),
            sync: h("sync"),
            stat: h("stat"),
            mkdir: h("mkdir"),
            readdir: h("readdir"),
            open: h("open"),
            remove: h("remove"),
            rename: h("rename"),
            truncate: h("truncate"),
            sync_container: h("sync_container"),
        }
    }

    /// A control-plane call to `method` (`package.Service/Method`) ended with `code`.
    /// Unknown methods (answered `unimplemented`) are counted as `unknown`: their
    /// names come from the client.
    pub fn grpc_call(&self, method: &str, code: tonic::Code, elapsed: Duration) {
        let method = if code == tonic::Code::Unimplemented { "unknown" } else { method }.to_owned();
        self.grpc_calls.get_or_create(&MethodCodeLabels { method: method.clone(), code: code_name(code) }).inc();
        self.grpc_seconds.get_or_create(&MethodLabel { method }).observe(elapsed.as_secs_f64());
    }

    /// The agent removed a put's temporary file of `tenant` for `reason`.
    pub fn put_temp_removed(&self, tenant: &str, reason: &'static str) {
        self.put_temps_removed.get_or_create(&TenantReasonLabels { tenant: tenant.to_owned(), reason }).inc();
    }

    /// Removing a put's temporary file of `tenant` failed.
    pub fn put_temp_not_removed(&self, tenant: &str) {
        self.put_temps_not_removed.get_or_create(&TenantLabel { tenant: tenant.to_owned() }).inc();
    }

    /// How many puts' temporary files of `tenant` were removed for `reason`, so far.
    pub fn put_temps_removed(&self, tenant: &str, reason: &'static str) -> u64 {
        self.put_temps_removed.get_or_create(&TenantReasonLabels { tenant: tenant.to_owned(), reason }).get()
    }

    /// Read scrape-time figures from `gauges` while it lives (the agent, which holds
    /// these metrics: hence a weak reference).
    pub fn register_gauges(&self, gauges: Weak<dyn Gauges>) {
        lock(&self.registry).register_collector(Box::new(GaugeCollector(gauges)));
    }

    /// The exposition: OpenMetrics text, or the Prometheus text format 0.0.4.
    pub fn encode(&self, format: Format) -> Result<String, fmt::Error> {
        let mut out = String::new();
        let registry = lock(&self.registry);
        match format {
            Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry)?,
            Format::Text004 => prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?,
        }
        Ok(out)
    }

    /// Per tenant, the figures `dpuctl status` shows, by tenant name.
    pub fn headline(&self) -> Vec<Headline> {
        let mut all: Vec<Headline> = lock(&self.tenants)
            .values()
            .map(|t| Headline {
                tenant: t.tenant.clone(),
                read_bytes: t.read_bytes.get(),
                written_bytes: t.written_bytes.get(),
                operations: t.ops.iter().map(Counter::get).sum(),
                errors: t.errors_total.load(Ordering::Relaxed),
            })
            .collect();
        all.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        all
    }
}

/// An exposition format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
    /// `text/plain; version=0.0.4`.
    Text004,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text004 => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// One tenant's headline figures since the agent started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Headline {
    pub tenant: String,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub operations: u64,
    pub errors: u64,
}

/// One tenant's counters, shared with the families: what a session counts with.
pub struct TenantMetrics {
    tenant: String,
    read_bytes: Counter,
    written_bytes: Counter,
    /// By [`Op`], in the order of [`Op::ALL`].
    ops: [Counter; Op::ALL.len()],
    read_seconds: Histogram,
    write_seconds: Histogram,
    throttled_seconds: Seconds,
    integrity_failures: Counter,
    /// The family: an error's status is known only when it happens.
    errors: Family<ErrorLabels, Counter>,
    /// Every error of the tenant, whatever its operation and status.
    errors_total: AtomicU64,
}

impl fmt::Debug for TenantMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantMetrics").field("tenant", &self.tenant).finish_non_exhaustive()
    }
}

impl TenantMetrics {
    fn new(m: &Metrics, tenant: &str) -> TenantMetrics {
        let label = TenantLabel { tenant: tenant.to_owned() };
        let op = |op: Op| TenantOpLabels { tenant: tenant.to_owned(), op: op.name() };
        TenantMetrics {
            tenant: tenant.to_owned(),
            read_bytes: m.read_bytes.get_or_create_owned(&label),
            written_bytes: m.written_bytes.get_or_create_owned(&label),
            ops: Op::ALL.map(|o| m.ops.get_or_create_owned(&op(o))),
            read_seconds: m.request_seconds.get_or_create_owned(&op(Op::Read)),
            write_seconds: m.request_seconds.get_or_create_owned(&op(Op::Write)),
            throttled_seconds: m.throttled_seconds.get_or_create_owned(&label),
            integrity_failures: m.integrity_failures.get_or_create_owned(&label),
            errors: m.errors.clone(),
            errors_total: AtomicU64::new(0),
        }
    }

    /// The tenant's name.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    fn error(&self, op: Op, status: &'static str) {
        self.errors.get_or_create(&ErrorLabels { tenant: self.tenant.clone(), op: op.name(), status }).inc();
        self.errors_total.fetch_add(1, Ordering::Relaxed);
    }

    /// A data-plane request ran and completed with `status` after `elapsed` (from when
    /// it was taken off its ring), having moved `bytes`.
    pub fn request(&self, op: Op, status: wire::Status, bytes: u64, elapsed: Duration) {
        let (seconds, moved) = match op {
            Op::Write => (&self.write_seconds, &self.written_bytes),
            _ => (&self.read_seconds, &self.read_bytes),
        };
        seconds.observe(elapsed.as_secs_f64());
        moved.inc_by(bytes);
        self.completed(op, status);
    }

    /// A data-plane entry completed with `status`: one that ran (through
    /// [`TenantMetrics::request`]), or one refused without running (it failed
    /// validation, its tenant is gone, or its queue was over a lowered limit).
    pub fn completed(&self, op: Op, status: wire::Status) {
        self.ops[op as usize].inc();
        if status == wire::Status::Ok {
            return;
        }
        if status == wire::Status::Integrity {
            self.integrity_failures.inc();
        }
        self.error(op, wire_status_name(status));
    }

    /// A namespace call of the tenant ended: `Err` with its status code.
    pub fn call(&self, op: Op, outcome: Result<(), tonic::Code>) {
        self.ops[op as usize].inc();
        if let Err(code) = outcome {
            self.error(op, code_name(code));
        }
    }

    /// Requests of the tenant waited this long in the QoS scheduler.
    pub fn throttled(&self, waited: Duration) {
        self.throttled_seconds.inc_by(waited.as_secs_f64());
    }
}

/// Histograms of backend calls, looked up once per thread that makes them.
#[derive(Clone, Debug)]
pub struct BackendTimes {
    pub read: Histogram,
    pub write: Histogram,
    pub sync: Histogram,
    stat: Histogram,
    mkdir: Histogram,
    readdir: Histogram,
    open: Histogram,
    remove: Histogram,
    rename: Histogram,
    truncate: Histogram,
    sync_container: Histogram,
}

/// Run `f`, recording how long it took in `h`.
pub fn timed<T>(h: &Histogram, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    h.observe(start.elapsed().as_secs_f64());
    out
}

/// A backend container whose namespace calls are timed into the backend histogram.
/// Objects it opens are the backend's own: their reads and writes are timed where the
/// data plane calls them.
pub struct TimedContainer {
    inner: Arc<dyn Container>,
    times: BackendTimes,
}

impl TimedContainer {
    pub fn new(inner: Arc<dyn Container>, times: BackendTimes) -> TimedContainer {
        TimedContainer { inner, times }
    }
}

impl Container for TimedContainer {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn chunk_bytes(&self) -> u64 {
        self.inner.chunk_bytes()
    }
    fn stat(&self, path: &NsPath) -> dpuio_backend::Result<Attr> {
        timed(&self.times.stat, || self.inner.stat(path))
    }
    fn mkdir(&self, path: &NsPath, mode: u32) -> dpuio_backend::Result<Attr> {
        timed(&self.times.mkdir, || self.inner.mkdir(path, mode))
    }
    fn readdir(
        &self,
        path: &NsPath,
        anchor: Option<&str>,
        max: usize,
    ) -> dpuio_backend::Result<(Vec<DirEntry>, Option<String>)> {
        timed(&self.times.readdir, || self.inner.readdir(path, anchor, max))
    }
    fn open(&self, path: &NsPath, options: OpenOptions, mode: u32) -> dpuio_backend::Result<Arc<dyn Object>> {
        timed(&self.times.open, || self.inner.open(path, options, mode))
    }
    fn open_stat(
        &self,
        path: &NsPath,
        options: OpenOptions,
        mode: u32,
    ) -> dpuio_backend::Result<(Arc<dyn Object>, Attr)> {
        timed(&self.times.open, || self.inner.open_stat(path, options, mode))
    }
    fn remove(&self, path: &NsPath, recursive: bool) -> dpuio_backend::Result<()> {
        timed(&self.times.remove, || self.inner.remove(path, recursive))
    }
    fn rename(&self, from: &NsPath, to: &NsPath) -> dpuio_backend::Result<()> {
        timed(&self.times.rename, || self.inner.rename(from, to))
    }
    fn replace(&self, from: &NsPath, to: &NsPath) -> dpuio_backend::Result<()> {
        timed(&self.times.rename, || self.inner.replace(from, to))
    }
    fn truncate(&self, path: &NsPath, size: u64) -> dpuio_backend::Result<()> {
        timed(&self.times.truncate, || self.inner.truncate(path, size))
    }
    fn sync(&self) -> dpuio_backend::Result<()> {
        timed(&self.times.sync_container, || self.inner.sync())
    }
}

/// Figures read when scraped, from the agent.
pub trait Gauges: Send + Sync {
    /// Every configured tenant's figures now.
    fn tenants(&self) -> Vec<TenantGauges>;
    /// Every data-plane transport's figures now.
    fn transports(&self) -> Vec<TransportGauges>;
    /// The DAOS client's retried calls since start (DAOS backend only).
    fn daos_retries(&self) -> Option<dpuio_daos::RetryStats> {
        None
    }
}

/// One tenant's figures now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantGauges {
    pub tenant: String,
    pub sessions: u64,
    pub open_handles: u64,
    pub regions: u64,
    pub requests_in_flight: u64,
    /// The key version new files are wrapped under (encrypted tenants).
    pub key_version: Option<u32>,
    /// Times its DAOS worker was lost and replaced (tenants with a `daos_user` whose
    /// worker has started).
    pub worker_restarts: Option<u64>,
    /// Pieces of mapped I/O its DAOS worker ran straight in host memory, and through
    /// staging (tenants with a `daos_user`).
    pub worker_pieces: Option<(u64, u64)>,
}

/// One data-plane transport's figures now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransportGauges {
    /// `ucx`, or `ofi (shm)`: how the agent names what it offers.
    pub provider: String,
    /// Sessions attached through it.
    pub peers: u64,
    /// Doorbells that failed the transport's own framing, since start.
    pub malformed_doorbells: u64,
}

struct GaugeCollector(Weak<dyn Gauges>);

impl fmt::Debug for GaugeCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GaugeCollector")
    }
}

/// Encode a family built for this scrape.
fn encode_family<M: EncodeMetric>(encoder: &mut DescriptorEncoder<'_>, name: &str, help: &str, m: &M) -> fmt::Result {
    m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)
}

impl Collector for GaugeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let Some(gauges) = self.0.upgrade() else { return Ok(()) };
        let tenant_gauge = || Family::<TenantLabel, Gauge>::default();
        let (sessions, handles, regions, in_flight, keys) =
            (tenant_gauge(), tenant_gauge(), tenant_gauge(), tenant_gauge(), tenant_gauge());
        let restarts = Family::<TenantLabel, Counter>::default();
        let pieces = Family::<TenantMemoryLabel, Counter>::default();
        let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for t in gauges.tenants() {
            let label = TenantLabel { tenant: t.tenant };
            sessions.get_or_create(&label).set(as_i64(t.sessions));
            handles.get_or_create(&label).set(as_i64(t.open_handles));
            regions.get_or_create(&label).set(as_i64(t.regions));
            in_flight.get_or_create(&label).set(as_i64(t.requests_in_flight));
            if let Some(v) = t.key_version {
                keys.get_or_create(&label).set(v.into());
            }
            if let Some(n) = t.worker_restarts {
                restarts.get_or_create(&label).inc_by(n);
            }
            if let Some((host, staging)) = t.worker_pieces {
                for (memory, n) in [("host", host), ("staging", staging)] {
                    pieces.get_or_create(&TenantMemoryLabel { tenant: label.tenant.clone(), memory }).inc_by(n);
                }
            }
        }
        let e = &mut encoder;
        encode_family(e, "sessions", "Sessions attached now", &sessions)?;
        encode_family(e, "open_handles", "Open file handles now, all sessions of the tenant", &handles)?;
        encode_family(e, "regions", "Registered host memory regions now", &regions)?;
        encode_family(e, "requests_in_flight", "Data-plane requests taken and not yet completed", &in_flight)?;
        encode_family(e, "key_version", "The key version new files are wrapped under (encrypted tenants)", &keys)?;
        encode_family(
            e,
            "daos_worker_restarts",
            "Times the tenant's DAOS worker process was lost and replaced (tenants with a daos_user)",
            &restarts,
        )?;
        encode_family(
            e,
            "daos_worker_pieces",
            "Pieces of mapped I/O the tenant's DAOS worker ran straight in host memory, or through staging",
            &pieces,
        )?;

        let peers = Family::<ProviderLabel, Gauge>::default();
        let malformed = Family::<ProviderLabel, Counter>::default();
        for t in gauges.transports() {
            let label = ProviderLabel { provider: t.provider };
            peers.get_or_create(&label).set(as_i64(t.peers));
            malformed.get_or_create(&label).inc_by(t.malformed_doorbells);
        }
        encode_family(e, "transport_peers", "Sessions attached through each data-plane transport", &peers)?;
        encode_family(
            e,
            "transport_malformed_doorbells",
            "Doorbells that failed the transport's own framing (ignored)",
            &malformed,
        )?;
        if let Some(r) = gauges.daos_retries() {
            let counter = |n: u64| {
                let c = Counter::<u64>::default();
                c.inc_by(n);
                c
            };
            let families = [
                (
                    "daos_retried_calls",
                    "DAOS calls that failed transiently (engine gone, pool map moving) and were retried",
                    r.retried_calls,
                ),
                ("daos_retries", "Retries of those calls (one call may be retried many times)", r.retries),
                (
                    "daos_recovered_calls",
                    "Retried DAOS calls that then returned (succeeded, or failed for good)",
                    r.recovered,
                ),
                (
                    "daos_gave_up_calls",
                    "Retried DAOS calls still failing at [backend] retry_seconds: answered UNAVAILABLE",
                    r.gave_up,
                ),
                (
                    "daos_unanswered_calls",
                    "DAOS calls left unanswered past [backend] call_timeout_seconds (every engine gone?)",
                    r.unanswered,
                ),
                (
                    "daos_refused_calls",
                    "DAOS calls answered UNAVAILABLE without being sent, while DAOS left others unanswered",
                    r.refused,
                ),
            ];
            for (name, help, n) in families {
                encode_family(e, name, help, &counter(n))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
