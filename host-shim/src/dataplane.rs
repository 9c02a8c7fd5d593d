//! The host side of the data plane: registered memory, rings, and I/O through them.
//!
//! The shim allocates every region *through the transport* (UCX `ucp_mem_map` with
//! `ALLOCATE`), so on shared memory the agent writes it with no help from this process.
//! A request is a 64-byte submission entry written into a ring in this process's
//! memory, published with a release store of the ring's `sq_tail`, and announced with
//! a doorbell. The agent moves the payload and writes the completion entry back into
//! this process's memory; the shim finds it by polling its own memory (no syscall, no
//! payload byte touched).
//!
//! Over TCP, UCX and libfabric carry puts as messages this process must receive, and
//! libfabric's shm provider needs this process to hand back command-queue slots, so
//! the shim runs a progress thread there; its CPU time is reported by
//! [`DataPlaneStats`], never hidden. Which provider: [`DataPlaneOptions::transports`].
//!
//! Rings: one per thread doing I/O, up to [`DataPlaneOptions::rings`]; a call takes a
//! free ring for the duration of its submit-and-wait, so threads never share a ring at
//! the same time and need no lock on the fast path beyond taking it.

use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use dpuio_proto::v1 as pb;
use dpuio_proto::wire::{self, Completion, MetaOpcode, MetaSubmission, Opcode, Submission};
use fabric::any::{self, Spec};
use fabric::transport::{Endpoint as _, Region as _};
use fabric::{FabricConfig, ProgressThread, Transport};
use pb::memory_client::MemoryClient;
use tonic::transport::Channel;

use crate::error::{Error, Result};
use crate::resume::{Liveness, RegionRecord, Registry};

/// How the host side of the data plane is set up.
#[derive(Debug, Clone)]
pub struct DataPlaneOptions {
    /// The data plane: `"ucx-shm"`, `"ucx-tcp"`, `"ofi-shm"`, `"ofi-tcp"` (libfabric),
    /// `"auto"` (UCX with the transports it picks, else libfabric shm, else tcp: the
    /// first the agent offers), `"shm"` / `"tcp"` (UCX, as before), or a UCX_TLS list.
    pub transports: String,
    /// Rings (one per concurrently submitting thread).
    pub rings: usize,
    /// Entries per ring (a power of two): the queue depth one thread can reach.
    pub ring_entries: u32,
    /// How long a wait for a completion may take before it fails.
    pub timeout: Duration,
    /// The network interface (as `ip link` names it) the network transports use: UCX's
    /// `NET_DEVICES` and the libfabric tcp domain. The agent answers over the same one:
    /// give it an address on that interface's network (`[data_plane] interface` on
    /// the agent). `None`: the providers choose. Default: `$DPUIO_INTERFACE`.
    pub interface: Option<String>,
}

impl Default for DataPlaneOptions {
    fn default() -> Self {
        DataPlaneOptions {
            transports: std::env::var("DPUIO_TRANSPORT").unwrap_or_else(|_| "auto".into()),
            rings: std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(2, 16),
            ring_entries: 128,
            timeout: Duration::from_secs(60),
            interface: std::env::var("DPUIO_INTERFACE").ok().filter(|i| !i.is_empty()),
        }
    }
}

impl DataPlaneOptions {
    /// What to offer the agent at Attach, in order: the first it accepts is used.
    pub(crate) fn candidates(&self) -> Result<Vec<Spec>> {
        let t = self.transports.trim();
        let specs = match t {
            "auto" => vec![
                Spec::Ucx(FabricConfig::default()),
                Spec::parse("ofi-shm").expect("a preset"),
                Spec::parse("ofi-tcp").expect("a preset"),
            ],
            _ => match Spec::parse(t).or_else(|| FabricConfig::preset(t).map(Spec::Ucx)) {
                Some(spec) => vec![spec],
                None if t.is_empty() || t.starts_with("ofi") || t.starts_with("ucx-") => {
                    return Err(Error::DataPlane {
                        op: "configure the transport".into(),
                        reason: format!(
                            "transport {t:?}: expected one of {}, auto, or a UCX_TLS list such as \"posix,tcp\"",
                            Spec::CHOICES.join(", ")
                        ),
                    });
                }
                None => vec![Spec::Ucx(FabricConfig::with_transports(t))],
            },
        };
        let specs = match &self.interface {
            None => specs,
            Some(name) => {
                let refused = |reason: String| Error::DataPlane {
                    op: "configure the transport".into(),
                    reason: format!("interface (DPUIO_INTERFACE, --interface) {reason}"),
                };
                fabric::config::check_interface_name(name).map_err(refused)?;
                fabric::config::check_interface(name).map_err(|e| refused(e.to_string()))?;
                specs.into_iter().map(|s| s.on_interface(name)).collect()
            }
        };
        for spec in &specs {
            let checked = match spec {
                Spec::Ucx(c) => c.validate(),
                Spec::Ofi(c) => c.validate(),
            };
            checked.map_err(|e| Error::DataPlane { op: "configure the transport".into(), reason: e.to_string() })?;
        }
        Ok(specs)
    }
}

/// Whether this process must progress the transport for the agent's operations to
/// land: everything but UCX's one-sided shared-memory preset.
fn needs_progress_thread(spec: &Spec) -> bool {
    match spec {
        Spec::Ucx(c) => c.transports.as_deref() != Some(fabric::SHM_TRANSPORTS),
        Spec::Ofi(_) => true,
    }
}

/// Polls of the completion ring before a waiting thread sleeps. Measured: one futex
/// sleep and wake per wait is the host's main cost at queue depth 1, and a longer spin
/// only adds to it, so the spin is short.
const SPIN_POLLS: u32 = 32;
/// A wait whose next completion is due later than this (the ring's usual latency over
/// the requests in flight) skips the spin before the first sleep.
const LONG_WAIT: Duration = Duration::from_micros(20);

/// Where the agent cannot wake a waiting thread (no shared mapping), it sleeps in
/// steps growing from 5 us up to 5 << this (160 us): longer steps saved little CPU
/// and added up to a step of latency to every request.
const MAX_SLEEP_SHIFT: u32 = 5;

/// How long a metadata call without payload (stat, lookup, open, create, close, a
/// listing batch) polls for its answer before sleeping. Measured on a 2-core VM: a ring
/// stat takes 20-25 us, of which the sleeping thread's wake-up is a third.
const META_SPIN: Duration = Duration::from_micros(50);

/// Where the agent cannot wake a waiting thread, its first sleep is this share of the
/// ring's usual latency (hybrid polling, as Linux does for NVMe). Measured on libfabric
/// shm, 1 MiB reads at queue depth 1: 75% cut the host's wake-ups but tripled the
/// median latency (150 to 400 us), because the agent's engine, which has no doorbell
/// fd to sleep on there, went to sleep between requests; half keeps it polling.
const FIRST_SLEEP_PERCENT: u32 = 50;

/// Bytes of each ring's metadata request area (the paths of one entry), after the ring.
pub(crate) const META_REQUEST_BYTES: usize = 64 * 1024;
/// Bytes of each ring's metadata answer area: a header, and an open-read's file bytes
/// (a whole 128 KiB training sample and more), a lookup's records or a listing batch.
pub(crate) const META_ANSWER_BYTES: usize = 512 * 1024;

/// Where a ring's metadata areas start in its region (page-aligned, after the ring).
const fn meta_request_offset(entries: u32) -> usize {
    (wire::ring_bytes(entries) + 4095) & !4095
}

/// Where a metadata entry's answer goes ([`DataPlane::metadata`]).
#[derive(Clone, Copy)]
pub(crate) enum AnswerTo<'a> {
    /// The ring's own answer area, at most this many bytes of it (up to
    /// [`META_ANSWER_BYTES`]).
    Ring(u32),
    /// A range of a caller's region: the region, an offset and a length.
    Region(&'a RegisteredRegion, u64, u32),
}

impl AnswerTo<'_> {
    /// The whole of the ring's answer area.
    pub(crate) const RING: AnswerTo<'static> = AnswerTo::Ring(META_ANSWER_BYTES as u32);
}

/// A metadata entry to run ([`DataPlane::metadata`]).
pub(crate) struct MetaCall<'a> {
    pub opcode: MetaOpcode,
    pub flags: u16,
    pub handle: u64,
    pub strings: &'a [&'a str],
    pub arg: u32,
}

impl MetaCall<'_> {
    /// Its entry, with its encoded request at `(region, offset, length)` (none when
    /// empty) and its answer going to `(region, offset, length)`. The batch sets
    /// `user_data`.
    fn entry(&self, request: (u32, usize, usize), answer: (u32, u64, u32)) -> MetaSubmission {
        let ((request_region, request_offset, request_length), has_request) = (request, request.2 > 0);
        MetaSubmission {
            opcode: self.opcode,
            flags: self.flags,
            user_data: 0,
            handle: self.handle,
            request_region: if has_request { request_region } else { 0 },
            answer_region: answer.0,
            request_offset: if has_request { request_offset as u64 } else { 0 },
            answer_offset: answer.1,
            request_length: request_length as u32,
            answer_length: answer.2,
            arg: self.arg,
        }
    }
}

/// What the data plane cost this process so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct DataPlaneStats {
    /// CPU time of the progress thread (zero on shared memory, where there is none).
    pub progress_cpu: Duration,
}

/// The transport a session's data plane runs on: what `"auto"` chose, for logs,
/// `dpuio --verbose`, `Client.transport` in Python and `dpuio_client_transport`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportInfo {
    /// `"ucx"`, `"ofi-shm"` or `"ofi-tcp"` (libfabric): the provider, and for libfabric
    /// its provider, in the names `transports` takes.
    pub name: String,
    /// `"ucx"` or `"ofi"`.
    pub provider: String,
    /// The libfabric provider (`"shm"`, `"tcp;ofi_rxm"`); empty for UCX.
    pub fabric_provider: String,
    /// What the transport says of the connection to the agent: UCX's lanes (e.g.
    /// `"posix/memory (rma_bw#0 am am_bw#0), cma/memory (rma_bw#1)"`), libfabric's
    /// provider, fabric and domain. One line.
    pub detail: String,
}

impl TransportInfo {
    fn of(worker: &any::Worker, endpoint: &any::Endpoint) -> TransportInfo {
        let provider = worker.provider().to_owned();
        let fabric_provider = worker.fabric_provider().to_owned();
        let name = match fabric_provider.split(';').next() {
            Some(f) if !f.is_empty() => format!("{provider}-{f}"),
            _ => provider.clone(),
        };
        let detail =
            endpoint.describe().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ");
        TransportInfo { name, provider, fabric_provider, detail }
    }
}

/// A region of this process's memory registered with the agent.
pub struct RegisteredRegion {
    region: any::Region,
    id: u32,
    /// Where the session keeps it for registering again after an agent restart (not
    /// for the rings' own regions, which are made anew).
    registry: Option<Weak<Registry>>,
}

impl Drop for RegisteredRegion {
    fn drop(&mut self) {
        // Its memory goes now: a resumed session must not register it again.
        if let Some(registry) = self.registry.as_ref().and_then(Weak::upgrade) {
            registry.remove_region(self.id);
        }
    }
}

impl RegisteredRegion {
    /// Region id in ring entries.
    pub fn id(&self) -> u32 {
        self.id
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.region.len()
    }
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }
    /// The bytes (see [`fabric::SharedMemory`] for why a slice over memory the agent
    /// writes is sound: only read a range after its completion).
    pub fn memory(&self) -> &fabric::SharedMemory {
        &self.region
    }
    /// The bytes, writable (to prepare a write's payload).
    pub fn memory_mut(&mut self) -> &mut fabric::SharedMemory {
        &mut self.region
    }
}

struct Ring {
    id: u32,
    region: RegisteredRegion,
    entries: u32,
    sq_tail: u64,
    cq_head: u64,
    /// When the oldest submission not yet answered by a completion was submitted.
    submitted_at: Option<Instant>,
    /// Moving average of the time from a submission to its first completion: where the
    /// agent cannot wake this ring, a waiter sleeps most of it in one go (hybrid
    /// polling, as Linux does for NVMe) instead of many short steps.
    latency: Duration,
    /// The session generation ([`Liveness::generation`]) the ring was registered in.
    generation: u64,
    /// The entries not yet completed, by the slot their `user_data` names.
    slots: Slots,
}

/// The entries of a ring not yet completed, so that they can be submitted again on a
/// new ring after an agent restart. Each entry goes out with its slot number as
/// `user_data` (completions come in any order); its completion gives the caller's back.
struct Slots {
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    next_seq: u64,
}

struct Slot {
    entry: [u8; wire::SQE_BYTES],
    user_data: u64,
    /// Order of submission, kept when submitted again.
    seq: u64,
    /// Whether it can go to another ring as it is: not when it points into its ring's
    /// own memory (metadata requests and answers).
    movable: bool,
}

impl Slots {
    fn new(entries: u32) -> Slots {
        Slots { slots: (0..entries).map(|_| None).collect(), free: (0..entries).rev().collect(), next_seq: 0 }
    }

    /// Keep `entry`; returns the slot number that goes out as its `user_data`.
    fn take(&mut self, entry: &[u8; wire::SQE_BYTES], movable: bool) -> Option<u32> {
        let slot = self.free.pop()?;
        let at = wire::SQE_USER_DATA_OFFSET;
        let user_data = u64::from_le_bytes(entry[at..at + 8].try_into().expect("8 bytes"));
        self.next_seq += 1;
        self.slots[slot as usize] = Some(Slot { entry: *entry, user_data, seq: self.next_seq, movable });
        Some(slot)
    }

    /// The caller's `user_data` of the entry in `slot`, which is done.
    fn finish(&mut self, slot: u64) -> Option<u64> {
        let s = self.slots.get_mut(usize::try_from(slot).ok()?)?.take()?;
        self.free.push(slot as u32);
        Some(s.user_data)
    }

    /// Forget the newest `n` entries (pushed, never submitted, withdrawn).
    fn withdraw(&mut self, n: u64) {
        for _ in 0..n {
            let newest = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| Some((i, s.as_ref()?.seq)))
                .max_by_key(|(_, seq)| *seq);
            if let Some((i, _)) = newest {
                self.slots[i] = None;
                self.free.push(i as u32);
            }
        }
    }

    /// Every entry not completed, oldest first, leaving the slots empty.
    fn drain(&mut self) -> Vec<Slot> {
        let mut all: Vec<Slot> = self.slots.iter_mut().filter_map(Option::take).collect();
        all.sort_by_key(|s| s.seq);
        self.free = (0..self.slots.len() as u32).rev().collect();
        all
    }
}

impl Ring {
    fn mem(&self) -> &fabric::SharedMemory {
        &self.region.region
    }

    /// Requests submitted and not yet reaped.
    fn in_flight(&self) -> u64 {
        self.sq_tail - self.cq_head
    }

    fn publish(&self) {
        self.mem().store_u64_release(wire::SQ_TAIL_OFFSET, self.sq_tail);
    }

    /// Whether the next completion is there (without taking it).
    fn completion_ready(&self) -> bool {
        self.cq_head != self.sq_tail
            && self.mem().load_u64_acquire(wire::cqe_offset(self.entries, self.cq_head) + 24) == self.cq_head + 1
    }

    /// Sleep until the agent posts a completion or `timeout` passes, if the agent
    /// wakes this ring's waiters (shared memory); returns false if it does not, and the
    /// caller must poll.
    fn sleep_on_futex(&self, timeout: Duration) -> bool {
        use rustix::thread::futex;
        let mem = self.mem();
        if mem.load_u32_acquire(wire::AGENT_WAKES_OFFSET) != 1 {
            return false;
        }
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
        true
    }

    /// The next completion, if the agent has posted it.
    fn reap(&mut self) -> Option<Completion> {
        if self.cq_head == self.sq_tail && self.slots.free.len() != self.slots.slots.len() {
            return None;
        }
        let at = wire::cqe_offset(self.entries, self.cq_head);
        if self.mem().load_u64_acquire(at + 24) != self.cq_head + 1 {
            return None;
        }
        let mut bytes = [0u8; wire::CQE_BYTES];
        self.mem().read_at(at, &mut bytes);
        let mut c = Completion::decode(&bytes).ok()?;
        self.cq_head += 1;
        self.mem().store_u64_release(wire::CQ_HEAD_OFFSET, self.cq_head);
        // An agent that echoes something else is answered as it said.
        if let Some(user_data) = self.slots.finish(c.user_data) {
            c.user_data = user_data;
        }
        if self.cq_head == self.sq_tail && self.slots.free.len() != self.slots.slots.len() {
            // Nothing in flight: an entry whose completion echoed something else (a
            // hostile test's) no longer holds its slot.
            self.slots.drain();
        }
        Some(c)
    }
}

/// A metadata entry's outcome, read out of its answer range at `at` (`length` bytes):
/// `parse` for a success, the namespace's refusal as the [`Error::Agent`] gRPC gives,
/// any other status as an I/O error.
fn meta_answer<T>(
    op: &str,
    mem: &fabric::SharedMemory,
    at: usize,
    length: u32,
    result: std::result::Result<u64, wire::Status>,
    parse: impl FnOnce(&fabric::SharedMemory, usize, usize) -> Result<T>,
) -> Result<T> {
    match result {
        Ok(n) if n <= u64::from(length) => parse(mem, at, n as usize),
        Ok(n) => Err(Error::Protocol { op: op.to_owned(), reason: format!("an answer of {n} bytes") }),
        Err(wire::Status::Refused) if length >= 8 => {
            let mut head = [0u8; 8];
            mem.read_at(at, &mut head);
            let len = (u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize).min(length as usize - 8);
            let mut record = vec![0u8; 8 + len];
            mem.read_at(at, &mut record);
            let e = wire::MetaError::decode(&record)
                .ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: "a malformed error record".into() })?;
            Err(Error::agent(op, e.code, e.message))
        }
        Err(status) => Err(Error::Io { op: op.to_owned(), status }),
    }
}

/// The data plane of one session.
pub(crate) struct DataPlane {
    worker: any::Worker,
    /// The transport's event fd does not report the agent's work (libfabric shm):
    /// progress when completions are reaped, when the agent has just finished with
    /// this process's memory, rather than often from the progress thread, whose
    /// progress spins on a lock the agent holds while it writes here (measured: half
    /// of the host's CPU of a sequential read at 2 ms slices).
    progress_on_reap: bool,
    /// The session and the connection to its agent: replaced when the client resumes
    /// after an agent restart (the worker, its regions and this table stay).
    conn: RwLock<Arc<Conn>>,
    progress: Mutex<Option<ProgressThread>>,
    memory: MemoryClient<Channel>,
    /// Free rings of the current generation.
    rings: Mutex<Vec<Ring>>,
    ring_freed: Condvar,
    options: DataPlaneOptions,
    /// Set when the keep-alive learns the session is gone: why (the agent's answer).
    ended: Mutex<Option<tonic::Status>>,
    live: Arc<Liveness>,
    registry: Arc<Registry>,
}

/// A session set up on a restarted agent, not yet serving ([`DataPlane::install`]).
pub(crate) struct Reattached {
    conn: Conn,
    rings: Vec<Ring>,
}

/// A session's connection to its agent's worker.
struct Conn {
    endpoint: any::Endpoint,
    session_id: u64,
    generation: u64,
}

/// The host's transport before Attach: its worker address goes into the request.
pub(crate) struct Prepared {
    worker: any::Worker,
    progress: Option<ProgressThread>,
    pub(crate) address: Vec<u8>,
    options: DataPlaneOptions,
}

impl Prepared {
    /// What goes into `AttachRequest.transport`: the provider, this worker's address,
    /// and for libfabric its provider name (workers of different ones cannot talk).
    pub(crate) fn transport_info(&self) -> pb::TransportInfo {
        pb::TransportInfo {
            provider: self.worker.provider().to_owned(),
            worker_address: self.address.clone(),
            transports: match self.worker.fabric_provider() {
                "" => vec![],
                f => vec![f.to_owned()],
            },
            library: library_of(&self.worker),
        }
    }
}

/// `TransportInfo.library`: `"libfabric MAJOR.MINOR"` for a libfabric worker (its library
/// is loaded once it opened), empty for UCX.
fn library_of(worker: &any::Worker) -> String {
    match (worker.provider(), fabric::ofi::loaded_library()) {
        (any::OFI, Some((_, (major, minor)))) => format!("libfabric {major}.{minor}"),
        _ => String::new(),
    }
}

/// Open the worker `spec` names (one of [`DataPlaneOptions::candidates`]).
pub(crate) fn prepare(options: DataPlaneOptions, spec: &Spec) -> Result<Prepared> {
    let fabric_error = |op: &str| {
        let op = op.to_owned();
        move |e: fabric::Error| Error::DataPlane { op: op.clone(), reason: e.to_string() }
    };
    let worker = any::Worker::open(spec).map_err(fabric_error("open the transport"))?;
    let address = worker.address().map_err(fabric_error("get the worker address"))?;
    // Start progress before Attach: over TCP (and libfabric shm's first exchange) the
    // agent's connect needs this side's answer.
    let progress = if needs_progress_thread(spec) {
        Some(
            ProgressThread::spawn(worker.clone(), "dpuio-progress")
                .map_err(fabric_error("start the progress thread"))?,
        )
    } else {
        None
    };
    Ok(Prepared { worker, progress, address, options })
}

impl Prepared {
    /// Connect to the agent's worker and register the rings (after Attach).
    pub(crate) async fn finish(
        self,
        session_id: u64,
        agent_address: &[u8],
        channel: Channel,
        live: Arc<Liveness>,
    ) -> Result<DataPlane> {
        let endpoint = connect(&self.worker, agent_address).await?;
        let dp = DataPlane {
            progress_on_reap: !self.worker.wakes_on_receive(),
            worker: self.worker,
            conn: RwLock::new(Arc::new(Conn { endpoint, session_id, generation: live.generation() })),
            progress: Mutex::new(self.progress),
            memory: MemoryClient::new(channel),
            rings: Mutex::new(Vec::new()),
            ring_freed: Condvar::new(),
            options: self.options,
            ended: Mutex::new(None),
            live,
            registry: Arc::new(Registry::default()),
        };
        let rings = dp.new_rings(session_id, dp.live.generation()).await?;
        *dp.rings.lock().unwrap_or_else(|p| p.into_inner()) = rings;
        Ok(dp)
    }
}

/// An endpoint from `worker` to the agent's worker at `address`.
async fn connect(worker: &any::Worker, address: &[u8]) -> Result<any::Endpoint> {
    let worker = worker.clone();
    let address = address.to_vec();
    tokio::task::spawn_blocking(move || worker.connect(&address))
        .await
        .map_err(|e| Error::DataPlane { op: "connect to the agent".into(), reason: e.to_string() })?
        .map_err(|e| Error::DataPlane { op: "connect to the agent".into(), reason: e.to_string() })
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
    fn entry(&self) -> [u8; wire::SQE_BYTES] {
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

impl DataPlane {
    /// The session the data plane serves now.
    pub(crate) fn session_id(&self) -> u64 {
        self.conn().session_id
    }

    fn conn(&self) -> Arc<Conn> {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Allocate a region through the transport and register it with the agent; kept
    /// for registering again under the same id after an agent restart.
    pub(crate) async fn register(&self, length: usize, access: pb::RegionAccess) -> Result<RegisteredRegion> {
        let (region, record) = self.alloc(length, access)?;
        let id = self.register_memory(self.session_id(), &record, 0).await?;
        self.registry.add_region(id, record);
        Ok(RegisteredRegion { region, id, registry: Some(Arc::downgrade(&self.registry)) })
    }

    fn alloc(&self, length: usize, access: pb::RegionAccess) -> Result<(any::Region, RegionRecord)> {
        let region = self
            .worker
            .alloc_region(length)
            .map_err(|e| Error::DataPlane { op: format!("allocate a {length}-byte region"), reason: e.to_string() })?;
        let remote_key = region
            .packed_key()
            .map_err(|e| Error::DataPlane { op: "pack the region's key".into(), reason: e.to_string() })?;
        let record = RegionRecord { address: region.addr(), length: length as u64, remote_key, access: access as i32 };
        Ok((region, record))
    }

    /// Register memory in `session_id` under `claim` (0: the agent picks the id).
    async fn register_memory(&self, session_id: u64, r: &RegionRecord, claim: u32) -> Result<u32> {
        let answer = self
            .memory
            .clone()
            .register_region(pb::RegisterRegionRequest {
                session_id,
                address: r.address,
                length: r.length,
                remote_key: r.remote_key.clone(),
                access: r.access,
                region_id: claim,
            })
            .await
            .map_err(|s| Error::from_status("register region", s))?;
        Ok(answer.into_inner().region_id)
    }

    pub(crate) async fn deregister(&self, region: RegisteredRegion) -> Result<()> {
        self.memory
            .clone()
            .deregister_region(pb::DeregisterRegionRequest { session_id: self.session_id(), region_id: region.id })
            .await
            .map_err(|s| Error::from_status("deregister region", s))?;
        drop(region); // unmapped only after the agent forgot it
        Ok(())
    }

    /// The session's rings, registered in `session_id`.
    async fn new_rings(&self, session_id: u64, generation: u64) -> Result<Vec<Ring>> {
        let mut rings = Vec::with_capacity(self.options.rings);
        for _ in 0..self.options.rings {
            rings.push(self.new_ring(session_id, generation).await?);
        }
        Ok(rings)
    }

    async fn new_ring(&self, session_id: u64, generation: u64) -> Result<Ring> {
        let entries = self.options.ring_entries;
        // The ring, then its metadata areas: one registration serves both.
        let bytes = meta_request_offset(entries) + META_REQUEST_BYTES + META_ANSWER_BYTES;
        let (memory, record) = self.alloc(bytes, pb::RegionAccess::ReadWrite)?;
        let id = self.register_memory(session_id, &record, 0).await?;
        let mut region = RegisteredRegion { region: memory, id, registry: None };
        region.region.write_at(0, &wire::RingHeader { entries }.encode());
        let r = self
            .memory
            .clone()
            .register_ring(pb::RegisterRingRequest { session_id, region_id: region.id, offset: 0, entries })
            .await
            .map_err(|s| Error::from_status("register ring", s))?;
        Ok(Ring {
            id: r.into_inner().ring_id,
            region,
            entries,
            sq_tail: 0,
            cq_head: 0,
            submitted_at: None,
            latency: Duration::ZERO,
            generation,
            slots: Slots::new(entries),
        })
    }

    /// Set up `session_id` on a restarted agent (whose worker is at `agent_address`):
    /// connect to it, register every region again under its id, and fresh rings. The
    /// caller re-opens the files, then [`DataPlane::install`]s it.
    pub(crate) async fn reattach(&self, session_id: u64, agent_address: &[u8]) -> Result<Reattached> {
        let endpoint = connect(&self.worker, agent_address).await?;
        // Regions first: their ids are claimed, the rings' come after them.
        for (id, record) in self.registry.regions() {
            self.register_memory(session_id, &record, id).await?;
        }
        let generation = self.conn().generation + 1;
        let rings = self.new_rings(session_id, generation).await?;
        Ok(Reattached { conn: Conn { endpoint, session_id, generation }, rings })
    }

    /// Serve the new session: calls take its rings, and waiters move their entries
    /// to them.
    pub(crate) fn install(&self, new: Reattached) {
        let old = std::mem::replace(&mut *self.conn.write().unwrap_or_else(|p| p.into_inner()), Arc::new(new.conn));
        let stale = std::mem::replace(&mut *self.rings.lock().unwrap_or_else(|p| p.into_inner()), new.rings);
        *self.ended.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.live.resumed();
        self.ring_freed.notify_all();
        // Closing the old endpoint may wait out its close timeout (its peer is gone).
        std::thread::spawn(move || drop((old, stale)));
    }

    /// The session's regions and files, for a resume.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    fn take_ring(&self) -> Ring {
        let mut rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = rings.pop() {
                return r;
            }
            rings = self.ring_freed.wait(rings).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn give_ring(&self, ring: Ring) {
        let mut rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        if ring.generation != self.conn().generation {
            return; // of a session the agent no longer has: freed
        }
        rings.push(ring);
        drop(rings);
        self.ring_freed.notify_one();
    }

    fn ring_doorbell(&self, ring: &Ring) -> Result<()> {
        ring.publish();
        // Pairs with the agent's fence between clearing agent_polling and its last look
        // at sq_tail: if it still polls, it will see this tail without a doorbell.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        if ring.mem().load_u32_acquire(wire::AGENT_POLLING_OFFSET) != 0 {
            return Ok(());
        }
        let conn = self.conn.read().unwrap_or_else(|p| p.into_inner());
        if conn.generation != ring.generation {
            return Ok(()); // the waiter moves the entries to a ring of the new session
        }
        let rung =
            conn.endpoint.send_doorbell(&wire::Doorbell { session_id: conn.session_id, ring_id: ring.id }.encode());
        if let Err(e) = rung {
            if !self.live.options.enabled() {
                return Err(Error::DataPlane { op: "ring the doorbell".into(), reason: e.to_string() });
            }
            // The agent may be gone: find out, and resubmit on the next session if so.
            tracing::debug!(error = %e, "doorbell failed; probing the agent");
            self.live.suspect();
            return Ok(());
        }
        // Push the doorbell out now (on shared memory nobody else progresses this side).
        self.worker.progress();
        Ok(())
    }

    /// A batch on a ring of its own (see [`Batch`]).
    pub(crate) fn batch(self: &std::sync::Arc<Self>) -> Batch {
        let ring = self.take_ring();
        Batch { dp: self.clone(), ring: Some(ring), staged: 0, lost: Vec::new(), quiet_since: None }
    }

    /// Submit `requests` (any number: they go in ring-sized waves) and wait for all of
    /// them. Blocking; never call from an async task (use `spawn_blocking`).
    pub(crate) fn run(self: &std::sync::Arc<Self>, requests: &[Request]) -> Result<Vec<Done>> {
        if let Some(status) = self.ended() {
            return Err(Error::from_status("submit", status));
        }
        let mut batch = self.batch();
        let mut done = Vec::with_capacity(requests.len());
        let mut next = 0;
        while done.len() < requests.len() {
            while next < requests.len() && batch.room() > 0 {
                batch.push(&requests[next])?;
                next += 1;
            }
            batch.submit()?;
            done.extend(batch.wait(1, self.options.timeout)?);
        }
        Ok(done)
    }

    /// Run one metadata entry on a ring of its own and wait for it. Its strings go
    /// into the ring's request area; the answer lands where `to` says (the ring's answer
    /// area, or a range of a caller's region). `parse` reads a successful
    /// answer (memory, offset, bytes written) while the ring is held. A refusal by the
    /// namespace is the same [`Error::Agent`] the gRPC call gives. Blocking (a round
    /// trip of microseconds on shared memory).
    pub(crate) fn metadata<T>(
        self: &std::sync::Arc<Self>,
        op: &str,
        call: &MetaCall<'_>,
        to: AnswerTo<'_>,
        parse: impl FnOnce(&fabric::SharedMemory, usize, usize) -> Result<T>,
    ) -> Result<T> {
        let request =
            wire::encode_strings(call.strings).filter(|r| r.len() <= META_REQUEST_BYTES).ok_or_else(|| {
                Error::DataPlane {
                    op: op.to_owned(),
                    reason: format!("the request's paths exceed {META_REQUEST_BYTES} bytes (or one exceeds 65535)"),
                }
            })?;
        if let Some(status) = self.ended() {
            return Err(Error::from_status(op, status)); // before taking a ring it would lose
        }
        // Run once more on the next session's ring if the agent restarted before it
        // answered, unless running it twice could answer differently (an exclusive
        // create that did run would then fail with "exists").
        let repeatable = !(call.opcode == MetaOpcode::Create && call.flags & wire::META_EXCLUSIVE != 0);
        let mut batch = self.batch();
        let mut attempts = 0;
        let (answer_offset, answer_length, result) = loop {
            let ring = batch.ring();
            let request_at = meta_request_offset(ring.entries);
            ring.region.region.write_at(request_at, &request);
            let (answer_region, answer_offset, answer_length) = match to {
                AnswerTo::Region(r, offset, length) => (r.id, offset, length),
                AnswerTo::Ring(length) => {
                    (ring.region.id, (request_at + META_REQUEST_BYTES) as u64, length.min(META_ANSWER_BYTES as u32))
                }
            };
            let entry =
                call.entry((ring.region.id, request_at, request.len()), (answer_region, answer_offset, answer_length));
            batch.push_entry(&entry.encode(), false)?;
            batch.submit()?;
            // Pure metadata answers in tens of microseconds: poll for it. An open-read
            // moves a file and sleeps like any payload wait.
            let spin = if call.opcode == MetaOpcode::OpenRead { Duration::ZERO } else { META_SPIN };
            let done = batch.wait_spinning(1, self.options.timeout, spin)?;
            let result = done
                .first()
                .ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: "no completion".into() })?
                .result;
            match result {
                Err(wire::Status::Lost) if repeatable && attempts < 3 => attempts += 1,
                _ => break (answer_offset, answer_length, result),
            }
        };
        let mem = match to {
            AnswerTo::Region(r, ..) => r.memory(),
            AnswerTo::Ring(_) => batch.ring().mem(),
        };
        meta_answer(op, mem, answer_offset as usize, answer_length, result, parse)
    }

    /// Several metadata entries in one submission, each answering into its own range of
    /// a caller's region (a region, an offset and a length), e.g. a loader's batch of
    /// training samples as open-reads: one doorbell and one wait for all of them,
    /// where [`DataPlane::metadata`] pays a wait per entry. Entries go out in groups
    /// that fit a ring and its request area. Each gets its own result, in order, its
    /// errors named by its own `op`; `parse` reads a successful answer as in
    /// [`DataPlane::metadata`]. Only entries that may run twice belong here (an agent
    /// restart runs unanswered ones again). Blocking.
    pub(crate) fn metadata_batch<T>(
        self: &std::sync::Arc<Self>,
        calls: &[(String, MetaCall<'_>, (&RegisteredRegion, u64, u32))],
        parse: impl Fn(&str, &fabric::SharedMemory, usize, usize) -> Result<T>,
    ) -> Result<Vec<Result<T>>> {
        let op = calls.first().map_or("metadata", |(op, ..)| op.as_str());
        let mut requests = Vec::with_capacity(calls.len());
        for (_, call, _) in calls {
            let request =
                wire::encode_strings(call.strings).filter(|r| r.len() <= META_REQUEST_BYTES).ok_or_else(|| {
                    Error::DataPlane {
                        op: op.to_owned(),
                        reason: format!("an entry's paths exceed {META_REQUEST_BYTES} bytes (or one exceeds 65535)"),
                    }
                })?;
            requests.push(request);
        }
        if let Some(status) = self.ended() {
            return Err(Error::from_status(op, status));
        }
        let mut results: Vec<Option<std::result::Result<u64, wire::Status>>> = vec![None; calls.len()];
        let mut batch = self.batch();
        let mut next = 0;
        while next < calls.len() {
            // One group: as many entries as the ring and its request area hold.
            let room = batch.room().max(1);
            let (mut end, mut bytes) = (next, 0);
            while end < calls.len() && end - next < room && bytes + requests[end].len() <= META_REQUEST_BYTES {
                bytes += requests[end].len();
                end += 1;
            }
            let mut pending: Vec<usize> = (next..end).collect();
            for _attempt in 0..4 {
                let ring = batch.ring();
                let (ring_id, mut request_at) = (ring.region.id, meta_request_offset(ring.entries));
                for &i in &pending {
                    let (_, call, (region, offset, length)) = &calls[i];
                    batch.ring().region.region.write_at(request_at, &requests[i]);
                    let mut entry = call.entry((ring_id, request_at, requests[i].len()), (region.id, *offset, *length));
                    entry.user_data = i as u64;
                    batch.push_entry(&entry.encode(), false)?;
                    request_at += requests[i].len();
                }
                batch.submit()?;
                let done = batch.wait(pending.len(), self.options.timeout)?;
                pending.clear();
                for d in done {
                    let Some(slot) = results.get_mut(d.user_data as usize) else { continue };
                    match d.result {
                        // Lost with a restarted agent's ring: run it again on the new one.
                        Err(wire::Status::Lost) => pending.push(d.user_data as usize),
                        r => *slot = Some(r),
                    }
                }
                pending.retain(|&i| results[i].is_none());
                if pending.is_empty() {
                    break;
                }
            }
            for i in pending {
                results[i] = Some(Err(wire::Status::Lost)); // lost again and again: say so
            }
            next = end;
        }
        Ok(calls
            .iter()
            .zip(results)
            .map(|((op, _, (region, offset, length)), result)| match result {
                Some(result) => {
                    meta_answer(op, region.memory(), *offset as usize, *length, result, |m, at, n| parse(op, m, at, n))
                }
                // A completion that echoed another entry's user_data instead of this one's.
                None => Err(Error::Protocol { op: op.clone(), reason: "no completion for this entry".into() }),
            })
            .collect())
    }

    /// Read `handle` from `data.len()` up to `size` bytes (or its end) into `data`,
    /// through the ring's answer area. Blocking.
    pub(crate) fn read_through_ring(
        self: &std::sync::Arc<Self>,
        op: &str,
        handle: u64,
        data: &mut Vec<u8>,
        size: u64,
    ) -> Result<()> {
        let mut batch = self.batch();
        while (data.len() as u64) < size {
            let ring = batch.ring();
            let at = meta_request_offset(ring.entries) + META_REQUEST_BYTES;
            let request = Request {
                opcode: Opcode::Read,
                handle,
                region_id: ring.region.id,
                region_offset: at as u64,
                file_offset: data.len() as u64,
                length: (size - data.len() as u64).min(META_ANSWER_BYTES as u64),
                sync: false,
                user_data: 0,
            };
            batch.push_entry(&request.entry(), false)?;
            batch.submit()?;
            let done = batch.wait(1, self.options.timeout)?;
            let d =
                done.first().ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: "no completion".into() })?;
            if d.result == Err(wire::Status::Lost) {
                continue; // into the old ring's memory: read it again into the new one's
            }
            let n = d.result.map_err(|status| Error::Io { op: op.to_owned(), status })? as usize;
            if n == 0 {
                break; // the file shrank
            }
            let start = data.len();
            data.resize(start + n.min(META_ANSWER_BYTES), 0);
            batch.ring().mem().read_at(at, &mut data[start..]);
        }
        Ok(())
    }

    /// The session ended on the agent (`status` says why): waits on its rings stop.
    pub(crate) fn session_ended(&self, status: tonic::Status) {
        *self.ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
    }

    /// Whether the session is known to have ended on the agent.
    pub(crate) fn is_ended(&self) -> bool {
        self.ended().is_some()
    }

    fn ended(&self) -> Option<tonic::Status> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn transport(&self) -> TransportInfo {
        TransportInfo::of(&self.worker, &self.conn().endpoint)
    }

    pub(crate) fn stats(&self) -> DataPlaneStats {
        let progress = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        DataPlaneStats { progress_cpu: progress.as_ref().map(|p| p.report().cpu_time).unwrap_or_default() }
    }
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
    dp: std::sync::Arc<DataPlane>,
    ring: Option<Ring>,
    staged: u64,
    /// Completions made here (entries lost with an old session's ring), handed out by
    /// the next [`Batch::poll`].
    lost: Vec<Done>,
    /// When the last completion came (or the first wait began): a wait that goes quiet
    /// for [`crate::ResumeOptions::probe_after`] asks whether the agent is there.
    quiet_since: Option<Instant>,
}

impl Batch {
    fn ring(&mut self) -> &mut Ring {
        self.ring.as_mut().expect("a live batch holds its ring")
    }

    /// Entries that can still be pushed before completions must be reaped.
    pub fn room(&self) -> usize {
        let r = self.ring.as_ref().expect("a live batch holds its ring");
        (u64::from(r.entries) - r.in_flight()) as usize
    }

    /// Requests pushed or submitted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.ring.as_ref().map_or(0, |r| r.in_flight() as usize)
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
        if self.room() == 0 {
            return Err(Error::DataPlane {
                op: "push".into(),
                reason: "the ring is full: submit and reap completions first".into(),
            });
        }
        let ring = self.ring();
        let slot = ring.slots.take(entry, movable).ok_or_else(|| Error::DataPlane {
            op: "push".into(),
            reason: "no free slot: submit and reap completions first".into(),
        })?;
        let mut tagged = *entry;
        let at = wire::SQE_USER_DATA_OFFSET;
        tagged[at..at + 8].copy_from_slice(&u64::from(slot).to_le_bytes());
        let at = wire::sqe_offset(ring.entries, ring.sq_tail);
        ring.region.region.write_at(at, &tagged);
        ring.sq_tail += 1;
        self.staged += 1;
        Ok(())
    }

    /// Make the pushed entries visible to the agent and ring its doorbell once.
    /// Returns how many were submitted.
    pub fn submit(&mut self) -> Result<usize> {
        if self.ring().generation != self.dp.live.generation() {
            self.move_to_new_session();
        }
        let staged = std::mem::take(&mut self.staged) as usize;
        if staged > 0 {
            let dp = self.dp.clone();
            let ring = self.ring();
            ring.submitted_at.get_or_insert_with(Instant::now);
            dp.ring_doorbell(ring)?;
        }
        Ok(staged)
    }

    /// The client resumed on a restarted agent: take a ring of the new session and
    /// submit there every entry this one had not completed (entries pushed and not
    /// yet submitted go too); those that cannot move complete with
    /// [`wire::Status::Lost`].
    fn move_to_new_session(&mut self) {
        let Some(mut old) = self.ring.take() else { return };
        let pending = old.slots.drain();
        drop(old); // the agent that served it is gone
        self.ring = Some(self.dp.take_ring());
        let moved = pending.iter().filter(|s| s.movable).count();
        tracing::info!(moved, lost = pending.len() - moved, "resubmitting on the resumed session");
        self.staged = 0;
        for slot in pending {
            if slot.movable {
                // Fits: the new ring is as long as the old one, and empty. The slot
                // kept the entry with the caller's user_data.
                let _ = self.push_entry(&slot.entry, true);
            } else {
                self.lost.push(Done { user_data: slot.user_data, result: Err(wire::Status::Lost) });
            }
        }
        let dp = self.dp.clone();
        let ring = self.ring();
        if ring.in_flight() > 0 {
            ring.submitted_at = Some(Instant::now());
            let _ = dp.ring_doorbell(ring);
        }
        self.staged = 0;
    }

    /// Completions available now, without waiting.
    pub fn poll(&mut self) -> Vec<Done> {
        let mut out = std::mem::take(&mut self.lost);
        let ring = self.ring();
        while let Some(c) = ring.reap() {
            out.push(Done {
                user_data: c.user_data,
                result: match wire::Status::from_i32(c.status) {
                    Some(wire::Status::Ok) => Ok(c.result),
                    Some(s) => Err(s),
                    None => Err(wire::Status::Malformed),
                },
            });
        }
        if !out.is_empty()
            && let Some(at) = ring.submitted_at.take()
        {
            let sample = at.elapsed();
            ring.latency = if ring.latency.is_zero() { sample } else { (ring.latency * 7 + sample) / 8 };
            if ring.in_flight() > 0 {
                ring.submitted_at = Some(Instant::now());
            }
        }
        if !out.is_empty() && self.dp.progress_on_reap {
            // libfabric shm: hand back the command-queue slots the agent's writes took,
            // now that it is done with these requests (see `progress_on_reap`).
            self.dp.worker.progress();
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
        let min = min.min(self.in_flight() - self.staged as usize + self.lost.len());
        let mut deadline = Instant::now() + timeout;
        let spin_until = (!spin.is_zero()).then(|| Instant::now() + spin);
        let mut done = self.poll();
        // When the next completion is far off, sleep without the short spin. Measured: it
        // was a tenth of the host's CPU of 1 MiB reads at queue depth 1, while at depth 32
        // (a completion every few microseconds) it keeps the waiting thread out of a sleep.
        let next_due = self.ring().latency / (self.in_flight() as u32).max(1);
        let mut idle = if next_due > LONG_WAIT { SPIN_POLLS - 1 } else { 0 };
        while done.len() < min {
            let more = self.poll();
            if !more.is_empty() {
                done.extend(more);
                idle = 0;
                self.quiet_since = None;
                continue;
            }
            // Spin briefly (small requests complete in microseconds), then sleep: on the
            // ring's futex where the agent wakes it, else in growing steps, so a long
            // request costs this host almost no CPU.
            idle += 1;
            if idle < SPIN_POLLS {
                std::hint::spin_loop();
                continue;
            }
            if spin_until.is_some_and(|t| Instant::now() < t) {
                idle = SPIN_POLLS - 1; // the first sleep is still to come
                std::hint::spin_loop();
                continue;
            }
            if let Some(status) = self.dp.ended() {
                return Err(Error::from_status("wait for completions", status));
            }
            let live = self.dp.live.clone();
            let closed = self.ring().mem().load_u32_acquire(wire::RING_CLOSED_OFFSET);
            if closed == wire::RING_CLOSED_STOPPING && live.options.enabled() {
                live.suspect(); // the agent stops: wait for it (and the supervisor) below
            } else if closed != 0 {
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
            if live.options.enabled() {
                if let Some(why) = live.failed() {
                    return Err(Error::DataPlane { op: "wait for completions".into(), reason: why });
                }
                if self.ring().generation != live.generation() {
                    self.move_to_new_session();
                    deadline = Instant::now() + timeout;
                    idle = 0;
                    continue;
                }
                // Quiet for a while: is the agent there?
                let quiet = *self.quiet_since.get_or_insert_with(Instant::now);
                if quiet.elapsed() >= live.options.probe_after {
                    live.suspect();
                    self.quiet_since = Some(Instant::now());
                }
            }
            if Instant::now() > deadline {
                return Err(Error::DataPlane {
                    op: "wait for completions".into(),
                    reason: format!(
                        "{} of {min} completions still missing after {timeout:?} (is the agent alive?)",
                        min - done.len()
                    ),
                });
            }
            let left = deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(100));
            let ring = self.ring();
            if !ring.sleep_on_futex(left) {
                // First sleep: most of the usual latency, less what has passed already.
                let first = (ring.latency * FIRST_SLEEP_PERCENT / 100)
                    .saturating_sub(ring.submitted_at.map_or(Duration::MAX, |t| t.elapsed()));
                if idle == SPIN_POLLS && first > Duration::from_micros(20) {
                    std::thread::sleep(first.min(left));
                } else {
                    std::thread::sleep(Duration::from_micros(5 << (idle - SPIN_POLLS).min(MAX_SLEEP_SHIFT)));
                }
            }
        }
        Ok(done)
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if self.dp.ended().is_some() {
            // The agent no longer serves this session's rings: nothing will complete.
            let _ = self.ring.take().map(std::mem::forget);
            return;
        }
        let submitted = self.in_flight() - self.staged as usize;
        if submitted > 0 && self.wait(submitted, self.dp.options.timeout).is_err() {
            // The agent may still write into this ring: never hand it out again.
            let _ = self.ring.take().map(std::mem::forget);
            return;
        }
        if let Some(mut ring) = self.ring.take() {
            // Entries pushed but never submitted are withdrawn.
            ring.sq_tail -= self.staged;
            ring.slots.withdraw(self.staged);
            self.dp.give_ring(ring);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(transports: &str, interface: Option<&str>) -> DataPlaneOptions {
        DataPlaneOptions {
            transports: transports.into(),
            interface: interface.map(str::to_owned),
            ..DataPlaneOptions::default()
        }
    }

    #[test]
    fn an_interface_puts_every_network_candidate_on_it() {
        let specs = options("auto", Some("lo")).candidates().unwrap();
        let Spec::Ucx(ucx) = &specs[0] else { panic!("UCX first: {specs:?}") };
        assert_eq!(ucx.ucx_options, [("NET_DEVICES".to_owned(), "lo".to_owned())]);
        let Spec::Ofi(tcp) = &specs[2] else { panic!("ofi-tcp last: {specs:?}") };
        assert_eq!(tcp.domain.as_deref(), Some("lo"));
        assert_eq!(options("ofi-shm", Some("lo")).candidates().unwrap(), [Spec::parse("ofi-shm").unwrap()]);
        assert_eq!(options("ofi-tcp", None).candidates().unwrap(), [Spec::parse("ofi-tcp").unwrap()]);
    }

    #[test]
    fn an_interface_that_is_not_there_is_refused_naming_those_that_are() {
        let text = options("ucx-tcp", Some("dpuio-nosuch0")).candidates().unwrap_err().to_string();
        assert!(
            text.contains("interface (DPUIO_INTERFACE, --interface) network interface \"dpuio-nosuch0\""),
            "{text}"
        );
        assert!(text.contains("does not exist here") && text.contains("lo"), "{text}");
        let text = options("ucx-tcp", Some("eth0:1")).candidates().unwrap_err().to_string();
        assert!(text.contains("\"eth0:1\" is not an interface name"), "{text}");
    }
}
