//! The ring engine, run for real (its thread, its I/O threads, the local backend in a
//! temporary directory) over `fabric::testing`, the loopback test double of the
//! transport: each test plays the host in this process with the host's own ring core,
//! [`dpuio_proto::host_ring`], as `host-shim` does over UCX (ring header, submission
//! entries, a release store of `sq_tail`, a doorbell, completions found by their `seq`
//! word), and checks bytes and statuses. Hostile hosts store counters of their own
//! making beside it.
//!
//! No UCX or libfabric worker is opened here: every worker is a `LoopbackWorker`, and
//! the agent is [`TestAgent`], a test double of [`AgentView`].
//!
//! Both ways the engine reaches host memory are covered: a host worker made with
//! [`PeerAccess::Mapped`] gives the mapped path (shared memory), [`PeerAccess::PutGet`]
//! the put/get path through the staging region (TCP, RDMA).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use dpuio_backend::local::LocalBackend;
use dpuio_backend::{Attr, Backend, Container, IoQueue, NsPath, Object, OpenOptions};
use dpuio_proto::host_ring::HostRing;
use dpuio_proto::wire::{self, Completion, Opcode, Submission};
use fabric::Transport;
use fabric::any;
use fabric::testing::{self, LoopbackWorker, PeerAccess};
use fabric::transport::{Endpoint as _, Region as _};

use super::policy::SPLIT_BYTES;
use super::protocol::RING_BATCH;
use super::readiness::IDLE_SCAN;
use super::sessions::{AgentView, Handle, Session};
use super::{DataPlane, Peer};
use crate::config::{Limits, QosConfig, TenantConfig};
use crate::metrics::Metrics;
use crate::runtime::lock;
use crate::validate::RegionAccess;

/// The methods of [`Object`] a test double of an open file passes to its `inner`
/// object unchanged, by name.
macro_rules! delegate_to_inner {
    ($($method:ident),*) => { $(delegate_to_inner!(@one $method);)* };
    (@one path) => { fn path(&self) -> &NsPath { self.inner.path() } };
    (@one writable) => { fn writable(&self) -> bool { self.inner.writable() } };
    (@one write_at) => {
        fn write_at(&self, buf: &[u8], offset: u64) -> dpuio_backend::Result<()> { self.inner.write_at(buf, offset) }
    };
    (@one stat) => { fn stat(&self) -> dpuio_backend::Result<Attr> { self.inner.stat() } };
    (@one truncate) => { fn truncate(&self, size: u64) -> dpuio_backend::Result<()> { self.inner.truncate(size) } };
    (@one sync) => { fn sync(&self) -> dpuio_backend::Result<()> { self.inner.sync() } };
}

/// How long a test waits for something the engine should do in microseconds.
const PATIENCE: Duration = Duration::from_secs(20);
/// Longer than the engine's safety-net scan: what has not happened by then is not
/// going to happen on its own.
const SETTLE: Duration = Duration::from_millis(IDLE_SCAN.as_millis() as u64 + 150);
const TENANT: &str = "t1";

/// A test double of the agent: the local backend in a temporary directory, default
/// limits, and tenants and sessions in plain tables.
struct TestAgent {
    backend: Arc<dyn Backend>,
    limits: Limits,
    tenants: HashMap<String, TenantConfig>,
    sessions: Mutex<Vec<Arc<Session>>>,
    metrics: Arc<Metrics>,
    /// The I/O threads' queues: `None`, the local backend's (one piece at a time).
    io_queue: Option<fn() -> Box<dyn IoQueue>>,
    /// What metadata entries run through: `None`, none (they are refused).
    namespace: Option<Box<dyn super::meta::Namespace>>,
}

impl AgentView for TestAgent {
    fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }
    fn namespace(&self) -> Option<&dyn super::meta::Namespace> {
        self.namespace.as_deref()
    }
    fn io_queue(&self) -> dpuio_backend::Result<Box<dyn IoQueue>> {
        match self.io_queue {
            Some(make) => Ok(make()),
            None => self.backend.io_queue(),
        }
    }
    fn limits(&self) -> &Limits {
        &self.limits
    }
    fn tenant(&self, tenant: &str) -> Option<TenantConfig> {
        self.tenants.get(tenant).cloned()
    }
    fn has_tenant(&self, tenant: &str) -> bool {
        self.tenants.contains_key(tenant)
    }
    fn sessions_io(&self) -> Vec<Arc<Session>> {
        lock(&self.sessions).clone()
    }
    fn session_io(&self, id: u64) -> Option<Arc<Session>> {
        lock(&self.sessions).iter().find(|s| s.id == id).cloned()
    }
    fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// The agent side: the test agent, a container, and a data plane on one loopback
/// worker (its engine started by [`Rig::start`]).
struct Rig {
    agent: Arc<TestAgent>,
    dp: Arc<DataPlane>,
    container: Arc<dyn Container>,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn new(tenants: &[(&str, QosConfig)]) -> Rig {
        Rig::with(tenants, None, |_| None)
    }

    /// A rig whose I/O threads use queues `io_queue` makes, and whose metadata entries
    /// run through what `namespace` makes of its container.
    fn with(
        tenants: &[(&str, QosConfig)],
        io_queue: Option<fn() -> Box<dyn IoQueue>>,
        namespace: impl FnOnce(Arc<dyn Container>) -> Option<Box<dyn super::meta::Namespace>>,
    ) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let backend: Arc<dyn Backend> = Arc::new(LocalBackend::open(dir.path()).unwrap());
        let container = backend.mount("c", true).unwrap();
        let tenants = tenants
            .iter()
            .map(|(name, qos)| (name.to_string(), TenantConfig { qos: *qos, ..TenantConfig::new(name, "c") }))
            .collect();
        let agent = Arc::new(TestAgent {
            backend,
            limits: Limits::default(),
            tenants,
            sessions: Mutex::default(),
            metrics: Arc::new(Metrics::new()),
            io_queue,
            namespace: namespace(container.clone()),
        });
        let worker = LoopbackWorker::new(PeerAccess::PutGet).unwrap();
        let dp = Arc::new(DataPlane::with_workers(vec![any::Worker::LoopbackForTests(worker)]).unwrap());
        assert!(dp.describe().starts_with("loopback [loopback test double"), "{}", dp.describe());
        assert!(dp.summary().starts_with("loopback (address ") && !dp.summary().contains('\n'), "{}", dp.summary());
        Rig { agent, dp, container, _dir: dir }
    }

    fn start(&self, chunk_bytes: usize, io_threads: usize) {
        self.dp.start(self.agent.clone(), chunk_bytes, io_threads, Duration::from_micros(50)).unwrap();
    }

    /// A file holding `bytes`, opened for reading and writing.
    fn file(&self, name: &str, bytes: &[u8]) -> Arc<dyn Object> {
        let options = OpenOptions { write: true, create: true, ..OpenOptions::default() };
        let object = self.container.open(&NsPath::parse(name).unwrap(), options, 0o644).unwrap();
        object.write_at(bytes, 0).unwrap();
        object
    }

    /// A host attached to the data plane, in a session of `tenant`.
    fn host(&self, tenant: &str, access: PeerAccess) -> Host {
        let loopback = LoopbackWorker::new(access).unwrap();
        let worker = any::Worker::LoopbackForTests(loopback.clone());
        let session = Arc::new(Session::new(tenant, None, self.agent.metrics.tenant(tenant)));
        let (peer, agent_address, _) = self.dp.connect(testing::PROVIDER, "", "", &worker.address().unwrap()).unwrap();
        session.set_peer(peer.clone());
        let endpoint = worker.connect(&agent_address).unwrap();
        lock(&self.agent.sessions).push(session.clone());
        Host { loopback, worker, endpoint, session, peer }
    }

    /// The engine's view of a ring: (whether its peer failed, whether it is broken).
    fn ring_state(&self, host: &Host, ring: &Ring) -> (bool, bool) {
        let (_, peer, ring) = self.agent.ring(host.session.id, ring.id).expect("ring registered");
        (peer.failed.load(Ordering::Relaxed), ring.broken.load(Ordering::Relaxed))
    }
}

/// What a test's host holds: its worker, its endpoint to the agent (for doorbells) and
/// its session on the agent.
struct Host {
    loopback: LoopbackWorker,
    worker: any::Worker,
    endpoint: any::Endpoint,
    session: Arc<Session>,
    peer: Arc<Peer>,
}

/// A registered region of a host.
struct HostMemory {
    id: u32,
    region: any::Region,
}

/// The host's side of one ring: the shim's ring core over the ring's memory.
struct Ring {
    id: u32,
    session_id: u64,
    mem: HostMemory,
    core: HostRing,
}

impl Host {
    fn region(&self, rig: &Rig, len: usize) -> HostMemory {
        let region = self.worker.alloc_region(len).unwrap();
        let id = self.session.next_region_id();
        let access = RegionAccess { agent_writes: true, agent_reads: true };
        let registered =
            rig.dp.register_region(&self.peer, id, region.addr(), len as u64, &region.packed_key().unwrap(), access);
        let registered = registered.unwrap();
        assert_eq!(registered.is_mapped(), self.loopback.access() == PeerAccess::Mapped);
        self.session.add_region(registered, 64).unwrap();
        HostMemory { id, region }
    }

    fn ring(&self, rig: &Rig, entries: u32) -> Ring {
        let mut mem = self.region(rig, wire::ring_bytes(entries));
        mem.region.write_at(0, &wire::RingHeader { entries }.encode());
        let id = self.session.next_region_id();
        let region = self.session.host_region(mem.id).unwrap();
        let ring = rig.dp.register_ring(&self.peer, id, region, 0, entries).unwrap();
        self.session.add_ring(ring, 64).unwrap();
        Ring { id, session_id: self.session.id, mem, core: HostRing::new(entries) }
    }

    fn handle(&self, object: Arc<dyn Object>) -> u64 {
        self.session.add_handle(Handle { object, readable: true, writable: true }, 64, 0).unwrap()
    }

    fn ring_doorbell(&self, ring: &Ring) {
        self.endpoint
            .send_doorbell(&wire::Doorbell { session_id: ring.session_id, ring_id: ring.id }.encode())
            .unwrap();
    }
}

impl Ring {
    fn mem(&self) -> &fabric::SharedMemory {
        &self.mem.region
    }

    /// Writes the next entry (not yet visible to the agent: see [`Ring::publish`]).
    /// The entry's `user_data` travels as a slot number, as from the shim; [`Ring::reap`]
    /// gives it back.
    fn push(&mut self, sub: &Submission) {
        self.push_bytes(&sub.encode());
    }

    fn push_bytes(&mut self, entry: &[u8; wire::SQE_BYTES]) {
        let pushed = self.core.push(entry, false).expect("the test overfilled its ring");
        self.mem.region.write_at(pushed.offset, &pushed.bytes);
    }

    /// Makes the pushed entries visible (again, if a hostile store came between).
    fn publish(&mut self) {
        let submit = self.core.submit(Instant::now());
        self.mem().store_u64_release(wire::SQ_TAIL_OFFSET, submit.sq_tail);
    }

    /// Publishes the entries pushed so far and rings the doorbell.
    fn submit(&mut self, host: &Host) {
        self.publish();
        host.ring_doorbell(self);
    }

    /// The completion at `index` if the agent has posted it.
    fn posted(&self, index: u64) -> Option<Completion> {
        let at = wire::cqe_offset(self.core.entries(), index);
        if self.mem().load_u64_acquire(at + wire::CQE_SEQ_OFFSET) != index + 1 {
            return None;
        }
        let mut bytes = [0u8; wire::CQE_BYTES];
        self.mem().read_at(at, &mut bytes);
        Some(Completion::decode(&bytes).unwrap())
    }

    /// The next completion, waiting for it.
    fn reap(&mut self) -> Completion {
        let next = self.core.next_completion().expect("nothing submitted to reap");
        wait_for(|| (self.mem().load_u64_acquire(next.seq_offset) == next.seq).then_some(()), "a completion");
        let mut bytes = [0u8; wire::CQE_BYTES];
        self.mem().read_at(next.offset, &mut bytes);
        let reaped = self.core.reap(&bytes).expect("the completion whose seq word was posted");
        self.core.completed(Instant::now());
        self.mem().store_u64_release(wire::CQ_HEAD_OFFSET, reaped.cq_head);
        reaped.completion
    }

    /// Completions posted and not reaped, in ring order (some may still be missing).
    fn posted_count(&self) -> usize {
        (self.core.cq_head()..self.core.sq_tail()).filter(|&i| self.posted(i).is_some()).count()
    }

    /// The agent's advisory `sq_head`: how many entries it has taken off the ring.
    fn agent_sq_head(&self) -> u64 {
        self.mem().load_u64_acquire(wire::SQ_HEAD_OFFSET)
    }
}

/// Polls `check` until it gives a value; panics naming `what` after [`PATIENCE`].
fn wait_for<T>(mut check: impl FnMut() -> Option<T>, what: &str) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Bytes that differ at every offset and between seeds, so a misplaced copy shows.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| ((i ^ seed.rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8).collect()
}

fn sub(
    opcode: Opcode,
    handle: u64,
    region: &HostMemory,
    file_offset: u64,
    region_offset: u64,
    length: u64,
) -> Submission {
    Submission { opcode, flags: 0, user_data: 0, handle, region_id: region.id, file_offset, region_offset, length }
}

fn read(
    handle: u64,
    region: &HostMemory,
    file_offset: u64,
    region_offset: u64,
    length: u64,
    user_data: u64,
) -> Submission {
    Submission { user_data, ..sub(Opcode::Read, handle, region, file_offset, region_offset, length) }
}

#[track_caller]
fn assert_ok(c: &Completion, user_data: u64, result: u64) {
    assert_eq!(
        (c.user_data, wire::Status::from_i32(c.status), c.result),
        (user_data, Some(wire::Status::Ok), result),
        "completion {c:?}"
    );
}

// ---------------------------------------------------------------------------------
// Ring wrap-around: far more entries than the ring holds, indices many laps past it.

fn wrap_around(access: PeerAccess) {
    let rig = Rig::new(&[(TENANT, QosConfig::default())]);
    rig.start(64 << 10, 1);
    let host = rig.host(TENANT, access);
    let input = pattern(1, 64 << 10);
    let src = host.handle(rig.file("in", &input));
    let out_file = rig.file("out", &[]);
    let dst = host.handle(out_file.clone());
    let mut data = host.region(&rig, 64 << 10);
    let mut ring = host.ring(&rig, 4);

    // 40 requests through 4 slots, the ring kept full: ten laps. Every third one writes.
    const N: u64 = 40;
    let shape = |i: u64| (i * 1237, i * 1536, 1000 + i); // file offset, region offset, length
    let (mut next, mut done) = (0u64, 0u64);
    while done < N {
        while next < N && ring.core.room() > 0 {
            let (file_offset, region_offset, length) = shape(next);
            let entry = if next % 3 == 2 {
                data.region.write_at(region_offset as usize, &pattern(1000 + next, length as usize));
                Submission { user_data: next, ..sub(Opcode::Write, dst, &data, file_offset, region_offset, length) }
            } else {
                read(src, &data, file_offset, region_offset, length, next)
            };
            ring.push(&entry);
            next += 1;
        }
        ring.submit(&host);
        let c = ring.reap();
        let (file_offset, region_offset, length) = shape(done);
        assert_ok(&c, done, length);
        assert_eq!(c.seq, done + 1);
        let (at, len) = (region_offset as usize, length as usize);
        if done % 3 == 2 {
            let mut written = vec![0u8; len];
            assert_eq!(out_file.read_at(&mut written, file_offset).unwrap(), len);
            assert_eq!(written, pattern(1000 + done, len), "write {done} put the region's bytes in the file");
        } else {
            let want = &input[file_offset as usize..][..len];
            assert_eq!(&copy(&data.region)[at..at + len], want, "read {done} landed where asked");
        }
        done += 1;
    }
    // The advisory sq_head is stored after the batch's completions: wait for it (under
    // qemu the host reaped the last completion before the engine got there).
    wait_for(
        || (ring.agent_sq_head() == N).then_some(()),
        "the agent's sq_head to count every entry, past the ring size",
    );
}

#[test]
fn wrap_around_mapped() {
    wrap_around(PeerAccess::Mapped);
}

#[test]
fn wrap_around_put_get() {
    wrap_around(PeerAccess::PutGet);
}

// ---------------------------------------------------------------------------------
// Hostile indices: a ring whose host claims more submissions than slots, or reaped
// completions the agent never posted, is not served again; its neighbours are.

fn hostile_indices(access: PeerAccess) {
    let rig = Rig::new(&[(TENANT, QosConfig::default())]);
    rig.start(64 << 10, 1);
    let host = rig.host(TENANT, access);
    let input = pattern(2, 16 << 10);
    let file = host.handle(rig.file("in", &input));
    let data = host.region(&rig, 16 << 10);
    let valid = |i: u64| read(file, &data, i * 100, i * 512, 300, i);

    let mut far_ahead = host.ring(&rig, 8); // sq_tail 2^40
    let mut one_too_many = host.ring(&rig, 8); // sq_tail = entries + 1
    let mut reaped_ahead = host.ring(&rig, 8); // cq_head past anything posted
    let mut full = host.ring(&rig, 8); // sq_tail = entries: the largest legal value
    let mut good = host.ring(&rig, 8);

    for ring in [&mut far_ahead, &mut one_too_many, &mut reaped_ahead, &mut full] {
        for i in 0..8 {
            ring.push(&valid(i));
        }
    }
    far_ahead.mem().store_u64_release(wire::SQ_TAIL_OFFSET, 1 << 40);
    one_too_many.mem().store_u64_release(wire::SQ_TAIL_OFFSET, 9);
    reaped_ahead.publish();
    reaped_ahead.mem().store_u64_release(wire::CQ_HEAD_OFFSET, 3);
    full.publish();
    good.push(&valid(0));
    good.push(&valid(1));
    good.publish();
    for ring in [&far_ahead, &one_too_many, &reaped_ahead, &full, &good] {
        host.ring_doorbell(ring);
    }

    for i in 0..2 {
        assert_ok(&good.reap(), i, 300);
    }
    for i in 0..8 {
        assert_ok(&full.reap(), i, 300);
    }
    for (name, ring) in [("far_ahead", &far_ahead), ("one_too_many", &one_too_many), ("reaped_ahead", &reaped_ahead)] {
        wait_for(|| rig.ring_state(&host, ring).1.then_some(()), name);
        assert_eq!(ring.posted_count(), 0, "{name}: no completion posted");
        let cq = wire::cqe_offset(8, 0);
        assert!(copy(ring.mem())[cq..cq + 8 * wire::CQE_BYTES].iter().all(|&b| b == 0), "{name}: CQ untouched");
        assert_eq!(ring.agent_sq_head(), 0, "{name}: nothing taken");
    }
    assert_eq!(rig.ring_state(&host, &full), (false, false));
    assert_eq!(rig.ring_state(&host, &good), (false, false));

    // The host comes to its senses: too late, the broken rings stay unserved.
    far_ahead.publish(); // sq_tail 8 again
    one_too_many.publish();
    reaped_ahead.mem().store_u64_release(wire::CQ_HEAD_OFFSET, 0);
    for ring in [&far_ahead, &one_too_many, &reaped_ahead] {
        host.ring_doorbell(ring);
    }
    // While the good ring goes on.
    good.push(&valid(2));
    good.submit(&host);
    assert_ok(&good.reap(), 2, 300);
    std::thread::sleep(SETTLE);
    for ring in [&far_ahead, &one_too_many, &reaped_ahead] {
        assert_eq!(ring.posted_count(), 0);
        assert_eq!(ring.agent_sq_head(), 0);
    }
    assert_eq!(&copy(&data.region)[1024..1324], &input[200..500]);
}

#[test]
fn hostile_indices_mapped() {
    hostile_indices(PeerAccess::Mapped);
}

#[test]
fn hostile_indices_put_get() {
    hostile_indices(PeerAccess::PutGet);
}

// ---------------------------------------------------------------------------------
// Batching: a full ring announced by one doorbell is served to the end at once.

fn batching(access: PeerAccess) {
    const N: u32 = 4096; // 64 rounds of RING_BATCH
    const LEN: usize = 256;
    let rig = Rig::new(&[(TENANT, QosConfig::default())]);
    rig.start(64 << 10, 1);
    let host = rig.host(TENANT, access);
    let input = pattern(3, N as usize * LEN + 4096);
    let file = host.handle(rig.file("in", &input));
    let data = host.region(&rig, N as usize * LEN);
    let mut ring = host.ring(&rig, N);
    // Entry i reads file bytes at i * 257 into region bytes at (N - 1 - i) * LEN.
    let shape = |i: u64| (i * 257, (u64::from(N) - 1 - i) * LEN as u64);
    for i in 0..u64::from(N) {
        let (file_offset, region_offset) = shape(i);
        ring.push(&read(file, &data, file_offset, region_offset, LEN as u64, i));
    }
    let started = Instant::now();
    ring.submit(&host); // the only doorbell
    for i in 0..u64::from(N) {
        assert_ok(&ring.reap(), i, LEN as u64);
    }
    let took = started.elapsed();
    // Taking RING_BATCH per doorbell and then waiting for the next safety-net scan
    // would take (N / RING_BATCH - 1) scans: 12.6 s.
    let one_lap_per_scan = IDLE_SCAN * (N / RING_BATCH as u32 - 1);
    assert!(took < one_lap_per_scan / 2, "{N} entries took {took:?}: the engine waited between batches");
    for i in 0..u64::from(N) {
        let (file_offset, region_offset) = shape(i);
        let got = &copy(&data.region)[region_offset as usize..][..LEN];
        assert_eq!(got, &input[file_offset as usize..][..LEN], "entry {i}");
    }
}

#[test]
fn batching_mapped() {
    batching(PeerAccess::Mapped);
}

#[test]
fn batching_put_get() {
    batching(PeerAccess::PutGet);
}

// ---------------------------------------------------------------------------------
// QoS parking: a tenant at max_inflight has its ring left alone (entries stay in host
// memory, none fails), and is served again as each request frees room.

/// A test double of an open file whose reads of every second piece of
/// [`SPLIT_BYTES`] wait for a permit: the I/O threads run those pieces, so requests
/// stay in flight until the test lets them finish. The engine thread runs the first
/// piece of each request itself and is never held up.
struct GatedObject {
    inner: Arc<dyn Object>,
    permits: Mutex<usize>,
    changed: Condvar,
    waiting: AtomicUsize,
}

impl GatedObject {
    fn release(&self, n: usize) {
        *lock(&self.permits) += n;
        self.changed.notify_all();
    }
}

/// Opens the gate for good when the test ends, before the data plane joins its threads.
struct OpenOnDrop(Arc<GatedObject>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.release(usize::MAX / 2);
    }
}

impl Object for GatedObject {
    delegate_to_inner!(path, writable);
    fn read_at(&self, buf: &mut [u8], offset: u64) -> dpuio_backend::Result<usize> {
        if (offset / SPLIT_BYTES) % 2 == 1 {
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let mut permits = lock(&self.permits);
            while *permits == 0 {
                permits = self.changed.wait(permits).unwrap_or_else(|p| p.into_inner());
            }
            *permits -= 1;
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.inner.read_at(buf, offset)
    }
    delegate_to_inner!(write_at, stat, truncate, sync);
}

/// Mapped only: requests stay in flight (and a tenant parks) only while the I/O
/// threads run them, and only mapped requests go there; over put/get the engine runs
/// each request to its end before it takes the next, so a tenant never parks.
#[test]
fn qos_parks_a_tenant_at_max_inflight_until_room_frees() {
    const MAX_INFLIGHT: u64 = 2;
    const N: u64 = 6;
    let req = 2 * SPLIT_BYTES; // two pieces: one on the engine, one on an I/O thread
    let rig = Rig::new(&[(TENANT, QosConfig { max_inflight: MAX_INFLIGHT as u32, ..QosConfig::default() })]);
    rig.start(SPLIT_BYTES as usize, 2);
    let host = rig.host(TENANT, PeerAccess::Mapped);
    let input = pattern(4, (N * req) as usize);
    let gate = Arc::new(GatedObject {
        inner: rig.file("in", &input),
        permits: Mutex::new(0),
        changed: Condvar::new(),
        waiting: AtomicUsize::new(0),
    });
    let _open_gate = OpenOnDrop(gate.clone()); // a failing test must not hang its I/O threads
    let file = host.handle(gate.clone());
    let data = host.region(&rig, (N * req) as usize);
    let mut ring = host.ring(&rig, 8);
    for i in 0..N {
        ring.push(&read(file, &data, i * req, i * req, req, i));
    }
    ring.submit(&host);

    let expect_taken = |taken: u64, completed: usize, settle: Duration| {
        wait_for(|| (ring.agent_sq_head() == taken).then_some(()), "the engine to take its share");
        std::thread::sleep(settle);
        assert_eq!(ring.agent_sq_head(), taken, "entries taken while {completed} completed");
        assert_eq!(ring.posted_count(), completed, "nothing completed early, nothing refused");
    };
    // Longer than a safety-net scan: the engine takes no more while the tenant is full.
    expect_taken(MAX_INFLIGHT, 0, SETTLE);
    let both_waiting = || (gate.waiting.load(Ordering::SeqCst) == MAX_INFLIGHT as usize).then_some(());
    wait_for(both_waiting, "the I/O threads to hold both requests");
    for completed in 1..=N as usize {
        gate.release(1);
        wait_for(|| (ring.posted_count() == completed).then_some(()), "a completion after room freed");
        // The engine takes the next entry as soon as room frees, or not at all.
        expect_taken((completed as u64 + MAX_INFLIGHT).min(N), completed, Duration::from_millis(30));
    }
    for i in 0..N {
        let c = ring.reap();
        assert_ok(&c, i, req);
        let range = (i * req) as usize..((i + 1) * req) as usize;
        assert!(copy(&data.region)[range.clone()] == input[range], "request {i}'s bytes");
    }
}

// ---------------------------------------------------------------------------------
// Errors mid-transfer: a host whose transfers start failing, at any point of serving
// a request, has its rings stopped; another session goes on.

/// Put/get only: on the mapped path the engine moves bytes through the mapping, with
/// no transport operation that could fail after registration.
#[test]
fn transfer_errors_stop_only_that_peer() {
    const CHUNK: u64 = 64 << 10;
    const REQ: u64 = 4 * CHUNK; // four puts, double-buffered
    let rig = Rig::new(&[(TENANT, QosConfig::default())]);
    rig.start(CHUNK as usize, 1);
    let input = pattern(5, (4 * REQ) as usize);
    let object = rig.file("in", &input);

    let healthy = rig.host(TENANT, PeerAccess::PutGet);
    let healthy_file = healthy.handle(object.clone());
    let healthy_data = healthy.region(&rig, REQ as usize);
    let mut healthy_ring = healthy.ring(&rig, 64);

    // One failing host per point of failure: the n-th transport operation towards it
    // fails, from the ring's indices through the payload to the completion.
    let mut failed_hosts = Vec::new();
    let (mut partial_payload, mut before_payload) = (false, false);
    for budget in 0..24u64 {
        let host = rig.host(TENANT, PeerAccess::PutGet);
        let file = host.handle(object.clone());
        let data = host.region(&rig, REQ as usize);
        let mut ring = host.ring(&rig, 8);
        host.loopback.fail_transfers_after(budget);
        let mut submitted = 0u64;
        while !host.peer.failed.load(Ordering::Relaxed) {
            assert!(submitted < 4, "budget {budget}: the transfers never failed");
            ring.push(&read(file, &data, submitted * REQ, 0, REQ, submitted));
            ring.submit(&host);
            submitted += 1;
            wait_for(
                || {
                    (host.peer.failed.load(Ordering::Relaxed) || ring.posted(ring.core.cq_head()).is_some())
                        .then_some(())
                },
                "a completion or the peer's failure",
            );
            if ring.posted(ring.core.cq_head()).is_some() {
                let i = ring.core.cq_head();
                assert_ok(&ring.reap(), i, REQ);
                assert!(copy(&data.region) == input[(i * REQ) as usize..][..REQ as usize], "budget {budget}");
            }
        }
        let unfinished = submitted - 1;
        if ring.posted(unfinished).is_none() {
            let want = &input[(unfinished * REQ) as usize..][..REQ as usize];
            let landed = copy(&data.region).iter().zip(want).filter(|(a, b)| a == b).count();
            // Chance matches aside (1 in 256 per byte), none of it or part of it.
            match landed as u64 {
                n if n < REQ / 64 => before_payload |= unfinished == 0,
                n if n < REQ => partial_payload = true,
                _ => {}
            }
        }

        // The healthy session is served all along.
        let i = healthy_ring.core.sq_tail();
        let offset = (budget % 4) * REQ;
        healthy_ring.push(&read(healthy_file, &healthy_data, offset, 0, REQ, i));
        healthy_ring.submit(&healthy);
        assert_ok(&healthy_ring.reap(), i, REQ);
        assert!(copy(&healthy_data.region) == input[offset as usize..][..REQ as usize], "budget {budget}");
        failed_hosts.push((host, ring, file, data));
    }
    assert!(before_payload, "some host failed before any payload moved");
    assert!(partial_payload, "some host failed with part of a payload delivered and no completion");

    // The failed hosts come back: their rings stay stopped.
    let posted: Vec<usize> = failed_hosts.iter().map(|(_, ring, ..)| ring.posted_count()).collect();
    for (host, ring, file, data) in &mut failed_hosts {
        host.loopback.heal();
        let i = ring.core.sq_tail();
        ring.push(&read(*file, data, 0, 0, 512, i));
        ring.submit(host);
    }
    std::thread::sleep(SETTLE);
    let after: Vec<usize> = failed_hosts.iter().map(|(_, ring, ..)| ring.posted_count()).collect();
    assert_eq!(after, posted, "a failed peer's rings are not served again");
    for (host, ring, ..) in &failed_hosts {
        assert_eq!(rig.ring_state(host, ring), (true, false));
    }
    assert_eq!(rig.ring_state(&healthy, &healthy_ring), (false, false));
}

// ---------------------------------------------------------------------------------
// Fairness: two busy rings are served in turns of at most a batch or two, never one
// to its end before the other.

/// The bound on fairness these tests hold the engine to: entries one busy ring may
/// have served in a row while another busy ring waits. The engine's turns are
/// [`RING_BATCH`] (64) entries, and a ring may get the last turn of one round and the
/// first of the next.
const FAIR_RUN: usize = 128;

/// A test double of an open file that logs which ring's file each read is for.
struct RecordingObject {
    inner: Arc<dyn Object>,
    tag: u8,
    log: Arc<Mutex<Vec<u8>>>,
}

impl Object for RecordingObject {
    delegate_to_inner!(path, writable);
    fn read_at(&self, buf: &mut [u8], offset: u64) -> dpuio_backend::Result<usize> {
        lock(&self.log).push(self.tag);
        self.inner.read_at(buf, offset)
    }
    delegate_to_inner!(write_at, stat, truncate, sync);
}

/// Two sessions, each with a full ring of 1024 reads, both submitted before the
/// engine starts (so neither gets a head start); `tenants` says whose sessions they
/// are (one tenant: the engine runs entries as it takes them; two: through the fair
/// queue).
fn fairness(access: PeerAccess, tenants: [&str; 2]) {
    const N: u32 = 1024;
    const LEN: usize = 512;
    let rig = Rig::new(&[(tenants[0], QosConfig::default()), (tenants[1], QosConfig::default())]);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut sides = Vec::new();
    for (tag, tenant) in tenants.into_iter().enumerate() {
        let host = rig.host(tenant, access);
        let input = pattern(10 + tag as u64, N as usize * LEN);
        let object = rig.file(&format!("in{tag}"), &input);
        let file = host.handle(Arc::new(RecordingObject { inner: object, tag: tag as u8, log: log.clone() }));
        let data = host.region(&rig, N as usize * LEN);
        let mut ring = host.ring(&rig, N);
        for i in 0..u64::from(N) {
            ring.push(&read(file, &data, i * LEN as u64, i * LEN as u64, LEN as u64, i));
        }
        ring.submit(&host);
        sides.push((host, ring, data, input));
    }
    rig.start(64 << 10, 1);
    for i in 0..u64::from(N) {
        for (_, ring, ..) in &mut sides {
            assert_ok(&ring.reap(), i, LEN as u64);
        }
    }
    for (tag, (_, _, data, input)) in sides.iter().enumerate() {
        assert!(copy(&data.region) == input[..], "ring {tag}'s bytes");
    }

    let log = lock(&log).clone();
    assert_eq!(log.len(), 2 * N as usize);
    // Until one ring is done, neither runs more than FAIR_RUN entries in a row.
    let mut left = [N; 2];
    let (mut run, mut longest, mut last) = (0usize, 0usize, u8::MAX);
    for &tag in &log {
        if left.contains(&0) {
            break;
        }
        left[usize::from(tag)] -= 1;
        run = if tag == last { run + 1 } else { 1 };
        last = tag;
        longest = longest.max(run);
    }
    assert!(longest <= FAIR_RUN, "one ring ran {longest} entries in a row while the other waited (bound {FAIR_RUN})");
    assert!(left.iter().all(|&l| l as usize <= FAIR_RUN), "both progressed before either finished: {left:?} left");
}

#[test]
fn fairness_one_tenant_mapped() {
    fairness(PeerAccess::Mapped, [TENANT, TENANT]);
}

#[test]
fn fairness_one_tenant_put_get() {
    fairness(PeerAccess::PutGet, [TENANT, TENANT]);
}

#[test]
fn fairness_two_tenants_put_get() {
    fairness(PeerAccess::PutGet, ["t1", "t2"]);
}

// ---------------------------------------------------------------------------------
// Metrics: every completion counts once in its tenant's figures, by how it ended.

fn metrics_count_completions(access: PeerAccess) {
    let rig = Rig::new(&[(TENANT, QosConfig::default())]);
    rig.start(64 << 10, 2);
    let host = rig.host(TENANT, access);
    let size = 1 << 20;
    let file = host.handle(rig.file("in", &pattern(5, size)));
    let data = host.region(&rig, 1 << 20);
    let mut ring = host.ring(&rig, 16);

    // Split over the I/O threads when mapped (longer than SPLIT_BYTES), and a short one.
    let big = 3 * SPLIT_BYTES;
    ring.push(&read(file, &data, 0, 0, big, 1));
    ring.push(&read(file, &data, 100, 0, 300, 2));
    // The end of the file: 100 bytes of the 1000 asked for.
    ring.push(&read(file, &data, size as u64 - 100, 0, 1000, 3));
    ring.push(&Submission { user_data: 4, ..sub(Opcode::Write, file, &data, 0, 0, 500) });
    ring.push(&read(file ^ 1, &data, 0, 0, 10, 5)); // a handle this session does not have
    ring.push_bytes(&[0xa5; wire::SQE_BYTES]); // garbage (but for the slot): no opcode to name
    ring.submit(&host);
    let statuses: Vec<_> = (0..6).map(|_| wire::Status::from_i32(ring.reap().status)).collect();
    let ok = Some(wire::Status::Ok);
    assert_eq!(statuses, [ok, ok, ok, ok, Some(wire::Status::BadHandle), Some(wire::Status::Malformed)]);

    let headline = rig.agent.metrics.headline();
    assert_eq!(headline.len(), 1);
    let h = &headline[0];
    assert_eq!((h.read_bytes, h.written_bytes), (big + 300 + 100, 500), "{h:?}");
    assert_eq!((h.operations, h.errors), (6, 2), "{h:?}");
    let text = rig.agent.metrics.encode(crate::metrics::Format::Text004).unwrap();
    for series in [
        r#"dpuio_operations_total{tenant="t1",op="read"} 4"#,
        r#"dpuio_operations_total{tenant="t1",op="write"} 1"#,
        r#"dpuio_operations_total{tenant="t1",op="unknown"} 1"#,
        r#"dpuio_errors_total{tenant="t1",op="read",status="bad_handle"} 1"#,
        r#"dpuio_errors_total{tenant="t1",op="unknown",status="malformed"} 1"#,
        r#"dpuio_request_duration_seconds_count{tenant="t1",op="read"} 3"#,
        r#"dpuio_request_duration_seconds_count{tenant="t1",op="write"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == series), "{series} in\n{text}");
    }
    let backend_writes =
        text.lines().find_map(|l| l.strip_prefix(r#"dpuio_backend_duration_seconds_count{op="write"} "#));
    assert_eq!(backend_writes, Some("1"), "{text}");
}

#[test]
fn metrics_count_completions_mapped() {
    metrics_count_completions(PeerAccess::Mapped);
}

#[test]
fn metrics_count_completions_put_get() {
    metrics_count_completions(PeerAccess::PutGet);
}

/// A copy of the memory `m` (shared with the engine, which may write it: read with a
/// copy, never through a Rust slice).
fn copy(m: &fabric::SharedMemory) -> Vec<u8> {
    m.bytes(0, m.len()).to_vec()
}

mod lent;
mod staged;
