//! The data plane on the agent: the host's regions and rings, and the engine thread
//! that serves them with one-sided RMA.
//!
//! The host writes submission entries into a ring in its own registered memory and
//! rings a doorbell (a small active message naming its session and ring). The engine
//! thread then, for each new entry: fetches it, decodes it strictly
//! ([`dpuio_proto::wire`]), validates it against the session ([`crate::validate`]), runs
//! the backend read or write chunk by chunk, moves the payload, and posts the
//! completion entry. The host's CPU takes no part after the doorbell.
//!
//! How bytes reach host memory depends on what the transport allows:
//!
//! - **Mapped** (UCX shared memory, `ucp_rkey_ptr`): the host region is mapped into the
//!   agent, so the backend reads the file *straight into host memory* and writes it
//!   straight from there: one copy, the one `pread` does anyway. Completions are
//!   published with a release store of their `seq` word.
//! - **Remote** (TCP, RDMA): payload goes through a staging region of the agent with
//!   put/get; the backend read of the next chunk overlaps the put of the previous
//!   one, and a flush orders "payload, then completion entry, then its `seq` word".
//!
//! QoS: an entry that passes validation counts against its tenant's in-flight limit
//! from the moment it is taken off the ring until its completion is posted; a tenant
//! at its limit has its rings left alone (parked) until one of its requests finishes.
//! While a single unlimited tenant has work and nothing is queued, entries run as they
//! are taken (no queueing cost); otherwise they go through the [`crate::qos::Scheduler`]
//! (per-tenant token buckets, start-time fair queueing by weight) and run in the order
//! it gives. Throttled entries wait, never fail; the engine sleeps until the soonest
//! one is due, and a doorbell from another tenant wakes it at once.
//!
//! The decisions live in two rooms without I/O, unit-tested with no transport: the
//! ring protocol of one ring ([`protocol`]: the host's indices, entries, the session's
//! rights, the tenant's room and how runs ended in; fetch, run, queue, complete and
//! finish actions out; and [`protocol::Staged`], the put/get steps of a request over
//! the staging region), and which rings the engine looks at when, and whether it spins
//! or sleeps ([`readiness`]). This file is their driver: it reads doorbells, ring
//! indices and entries (mapped loads or gets), performs the actions (backend calls,
//! puts, flushes, completions, the polling and futex words), hands mapped requests to
//! the I/O threads and queued ones to the QoS scheduler, and waits on the transport.
//!
//! Thread model: one engine thread owns the staging region and does all ring work;
//! `[data_plane] io_threads` I/O threads run the backend I/O of mapped requests, each on
//! its backend's [`IoQueue`] (over DAOS an event queue keeping up to 32 pieces in flight);
//! gRPC handlers register peers, regions and rings (UCX serialises the worker inside
//! [`fabric`]). Nothing the host writes is trusted: a ring whose indices make no sense
//! is stopped, an entry that fails a check gets an error completion, and a peer that
//! fails a transfer has its data plane closed, never the agent's.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dpuio_backend::{IoOp, IoQueue, IoRequest, OneAtATime};
use dpuio_proto::wire::{self, Completion, MetaSubmission, Opcode, Submission};
use fabric::any;
use fabric::transport::{Endpoint as _, RemoteKey as _};
use fabric::{MappedRemote, Transport};

use crate::config::{Lane, QosConfig};
use crate::validate::{self, RegionAccess};
use crate::metrics::{BackendTimes, Metrics, Op, TenantMetrics, TransportGauges, timed};
use crate::qos::{Scheduler, TenantSlot};
use crate::runtime::lock;
use protocol::{Action, BackendFailure, Ran, Step};
use readiness::{Idle, Readiness, RingKey};
use sessions::{Agent, Handle, Session};

pub mod meta;
pub mod protocol;
pub mod readiness;
pub mod sessions;

/// Bytes of the staging region used for ring entries and counters (1024 submissions).
const SCRATCH_BYTES: usize = 64 * 1024;
/// How long a flush may take before the peer is declared dead.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the engine sleeps at a time while a transport whose event fd does not
/// report doorbells (libfabric shm) has peers: their doorbells are seen by polling.
const NO_FD_SLICE: Duration = Duration::from_millis(1);
/// How long the engine keeps polling after its last piece of work while such a
/// transport has peers (a host at queue depth 1 submits again within this).
const NO_FD_SPIN: Duration = Duration::from_micros(500);
/// Queued requests the engine runs before it looks at the rings again.
const QUEUE_BATCH: usize = 64;

/// Why a data-plane call failed.
#[derive(Debug, thiserror::Error)]
pub enum DataPlaneError {
    #[error("data plane transport: {0}")]
    Fabric(#[from] fabric::Error),
    #[error("{0}")]
    Invalid(String),
    /// The host asked for a provider this agent does not run.
    #[error("{0}")]
    NotOffered(String),
}

/// `TransportInfo.library` of this agent: `"libfabric MAJOR.MINOR"` once libfabric is
/// loaded, else empty.
pub fn library() -> String {
    fabric::ofi::loaded_library().map_or_else(String::new, |(_, (major, minor))| format!("libfabric {major}.{minor}"))
}

/// Why a host on `host_library` cannot use libfabric provider `fabric_provider` with an
/// agent on `agent_library`, if it cannot. libfabric shm's shared-memory protocol is
/// private to a release (a 1.17 host and a 1.22 agent hang each other, the agent
/// spinning): it needs the same version on both sides. Protocols between machines (tcp,
/// verbs with rxm) are versioned on the wire and are not refused here. A host that does
/// not say (an older shim) is let through.
pub fn library_mismatch(fabric_provider: &str, host_library: &str, agent_library: &str) -> Option<String> {
    (fabric_provider == fabric::ofi::SHM_PROVIDER && !host_library.is_empty() && host_library != agent_library).then(
        || {
            format!(
                "libfabric shm needs the same libfabric on both sides (its shared-memory protocol changes between \
                 releases): this agent runs {agent_library}, the host {host_library}. Use ucx-shm or ofi-tcp, or load \
                 the agent's libfabric in the host process (LD_LIBRARY_PATH)"
            )
        },
    )
}

/// A host region the agent may access.
pub struct HostRegion {
    pub id: u32,
    pub addr: u64,
    pub length: u64,
    pub access: RegionAccess,
    key: any::RemoteKey,
    mapped: Option<MappedRemote>,
}

/// A ring pair the host registered.
pub struct HostRing {
    pub id: u32,
    region: Arc<HostRegion>,
    offset: u64,
    entries: u32,
    /// Next submission index the agent will take.
    sq_head: AtomicU64,
    /// Next completion index the agent will post.
    cq_tail: AtomicU64,
    /// Set when the host wrote indices that make no sense: the ring is not served again.
    broken: AtomicBool,
}

/// The data-plane side of one session: the endpoint to the host's worker, and what it
/// registered.
pub struct Peer {
    pub endpoint: any::Endpoint,
    /// Which of the data plane's workers the endpoint belongs to.
    lane: usize,
    /// Peers of that worker (this one included while it lives).
    lane_peers: Arc<AtomicU64>,
    /// Set when a transfer to this host failed: its rings are not served again.
    failed: AtomicBool,
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.lane_peers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One worker of the data plane (a provider and its transports), with its address.
struct Worker {
    worker: Arc<any::Worker>,
    address: Vec<u8>,
    /// Sessions attached through this worker.
    peers: Arc<AtomicU64>,
}

impl Worker {
    fn new(address: Vec<u8>, worker: any::Worker) -> Worker {
        Worker { worker: Arc::new(worker), address, peers: Arc::new(AtomicU64::new(0)) }
    }
}

impl HostRegion {
    pub fn info(&self) -> validate::RegionInfo {
        validate::RegionInfo { length: self.length, access: self.access }
    }
    pub fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }
}

impl HostRing {
    pub fn region_id(&self) -> u32 {
        self.region.id
    }

    /// Tell a host waiting on this ring that it is no longer served, and `why`
    /// (`wire::RING_CLOSED_ENDED` or `wire::RING_CLOSED_STOPPING`), where the ring is
    /// mapped (see `wire::RING_CLOSED_OFFSET`).
    pub fn mark_closed(&self, why: u32) {
        if let Some(m) = &self.region.mapped {
            m.store_u32_release(self.offset as usize + wire::RING_CLOSED_OFFSET, why);
            wake_waiters(self);
        }
    }
}

/// The agent's data plane: one worker per provider and transport it offers (UCX, and
/// libfabric's shm and tcp), and the engine thread that serves them all.
pub struct DataPlane {
    workers: Vec<Worker>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The I/O threads: joined at shutdown, so their backend queues (DAOS event queues,
    /// which hold the DAOS runtime) are gone before the agent finalises DAOS.
    io_threads: Mutex<Vec<JoinHandle<()>>>,
    /// Tenants' buckets, fair queue and in-flight counts: the engine's, shared so
    /// [`Agent::set_qos`] changes them at once.
    qos: Arc<Mutex<Scheduler<Queued>>>,
}

impl DataPlane {
    /// Open a worker per lane. One that is not `required` and does not open (libfabric
    /// where the agent was not told to offer it) is left out with a warning. The engine
    /// thread starts with [`DataPlane::start`].
    pub fn open(lanes: &[Lane]) -> Result<DataPlane, DataPlaneError> {
        let mut workers = Vec::new();
        for lane in lanes {
            let opened = any::Worker::open(&lane.spec).and_then(|w| Ok((w.address()?, w)));
            match opened {
                Ok((address, worker)) => workers.push(Worker::new(address, worker)),
                // Absent here (verbs without an RDMA NIC): worth a line, not a warning.
                Err(e @ fabric::Error::ProviderUnavailable { .. }) if !lane.required => tracing::info!(
                    provider = lane.spec.provider(), fabric = lane.spec.fabric_provider(), error = %e,
                    "data-plane provider not offered here"
                ),
                Err(e) if !lane.required => tracing::warn!(
                    provider = lane.spec.provider(), fabric = lane.spec.fabric_provider(), error = %e,
                    "data-plane provider not offered: it did not open (name it in [data_plane] providers to make this fatal)"
                ),
                Err(e) => {
                    return Err(DataPlaneError::Invalid(format!(
                        "{} {}: {e}",
                        lane.spec.provider(),
                        lane.spec.fabric_provider()
                    )));
                }
            }
        }
        if let Some((path, (major, minor))) = fabric::ofi::loaded_library() {
            tracing::info!(path, version = %format!("{major}.{minor}"), "libfabric loaded");
        }
        DataPlane::from_workers(workers)
    }

    /// A data plane on workers opened already, one lane each (the engine's tests run it
    /// on `fabric::testing` loopback workers). The engine thread starts with
    /// [`DataPlane::start`].
    pub fn with_workers(workers: Vec<any::Worker>) -> Result<DataPlane, DataPlaneError> {
        let workers = workers.into_iter().map(|w| Ok(Worker::new(w.address()?, w)));
        DataPlane::from_workers(workers.collect::<Result<_, fabric::Error>>()?)
    }

    fn from_workers(workers: Vec<Worker>) -> Result<DataPlane, DataPlaneError> {
        if workers.is_empty() {
            return Err(DataPlaneError::Invalid("no data-plane provider opened".into()));
        }
        Ok(DataPlane {
            workers,
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
            io_threads: Mutex::new(Vec::new()),
            qos: Arc::new(Mutex::new(Scheduler::new())),
        })
    }

    /// Apply a tenant's new QoS to the engine now (see [`Agent::set_qos`]), and wake
    /// the engine so requests waiting under the old limits are looked at again.
    pub(crate) fn set_qos(&self, tenant: &str, qos: &QosConfig) {
        lock(&self.qos).reconfigure(tenant, qos, Instant::now());
        self.wake_engine();
    }

    /// The engine sleeps on every worker's event fd: waking the first wakes it.
    fn wake_engine(&self) {
        let _ = self.workers[0].worker.wake();
    }

    /// Each tenant's data-plane requests in flight now (tenants the engine has met).
    pub fn requests_in_flight(&self) -> Vec<(Arc<str>, u32)> {
        lock(&self.qos).in_flight()
    }

    /// Each worker's figures now, for the metrics.
    pub fn transport_gauges(&self) -> Vec<TransportGauges> {
        self.workers
            .iter()
            .map(|w| TransportGauges {
                provider: offer_name(&w.worker),
                peers: w.peers.load(Ordering::Relaxed),
                malformed_doorbells: w.worker.malformed_doorbells(),
            })
            .collect()
    }

    /// What the workers are (for logs and status).
    pub fn describe(&self) -> String {
        self.workers
            .iter()
            .map(|w| format!("{} [{}]", w.worker.provider(), w.worker.describe()))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// One line for the start-up log: per worker, what it offers, its modules and its
    /// address length, e.g. `ucx (modules self tcp sysv posix ib rdmacm cma; address 179
    /// bytes), ofi (shm) (address 37 bytes)`; [`DataPlane::describe`] has the
    /// transports' own (multi-line) account.
    pub fn summary(&self) -> String {
        self.workers
            .iter()
            .map(|w| {
                let modules = w.worker.modules();
                let modules =
                    if modules.is_empty() { String::new() } else { format!("modules {}; ", modules.join(" ")) };
                format!("{} ({modules}address {} bytes)", offer_name(&w.worker), w.address.len())
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// What this agent offers, as `provider` or `provider (libfabric provider)`.
    pub fn offers(&self) -> String {
        self.workers.iter().map(|w| offer_name(&w.worker)).collect::<Vec<_>>().join(", ")
    }

    /// Start the engine thread serving `agent`'s sessions.
    pub fn start(
        self: &Arc<Self>,
        agent: Arc<Agent>,
        chunk_bytes: usize,
        io_threads: usize,
        idle_poll: Duration,
    ) -> Result<(), DataPlaneError> {
        let mut lanes = Vec::new();
        for w in &self.workers {
            let staging = w.worker.alloc_region(SCRATCH_BYTES + 2 * chunk_bytes)?;
            lanes.push(EngineLane { worker: w.worker.clone(), staging, peers: w.peers.clone() });
        }
        let (jobs, queue) = crossbeam_channel::bounded::<Job>(IO_QUEUE);
        let metrics = agent.metrics().clone();
        let backend_times = metrics.backend_times();
        let mut io_overlaps = false;
        for i in 0..io_threads.max(1) {
            let queue = queue.clone();
            let times = backend_times.clone();
            let io = agent
                .backend()
                .io_queue()
                .map_err(|e| DataPlaneError::Invalid(format!("cannot make the I/O queue of an I/O thread: {e}")))?;
            io_overlaps = io.depth() > 1;
            let thread = std::thread::Builder::new()
                .name(format!("dpuio-io-{i}"))
                .spawn(move || io_worker(queue, io, &times))
                .map_err(|e| DataPlaneError::Invalid(format!("cannot start an I/O thread: {e}")))?;
            self.io_threads.lock().unwrap_or_else(|p| p.into_inner()).push(thread);
        }
        let mut engine = Engine {
            agent,
            lanes,
            chunk_bytes,
            stop: self.stop.clone(),
            jobs,
            io_overlaps,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u64).min(io_threads as u64 + 1),
            qos: self.qos.clone(),
            idle_poll,
            metrics,
            backend_times,
        };
        let thread = std::thread::Builder::new()
            .name("dpuio-engine".into())
            .spawn(move || engine.run())
            .map_err(|e| DataPlaneError::Invalid(format!("cannot start the engine thread: {e}")))?;
        *self.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
        Ok(())
    }

    /// Stop the engine thread after the work in hand, then the I/O threads (they stop
    /// once the engine, which holds their queue's only sender, is gone).
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake_engine();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
        for t in std::mem::take(&mut *self.io_threads.lock().unwrap_or_else(|p| p.into_inner())) {
            let _ = t.join();
        }
    }

    /// Make an endpoint to a host worker (Attach) on the worker of `provider` (and,
    /// for libfabric, `fabric_provider`). Returns the peer and this agent's address on
    /// that worker, with what it is, for `AttachResponse.agent_transport`.
    pub fn connect(
        &self,
        provider: &str,
        fabric_provider: &str,
        host_library: &str,
        host_address: &[u8],
    ) -> Result<(Arc<Peer>, Vec<u8>, String), DataPlaneError> {
        let Some(lane) = self
            .workers
            .iter()
            .position(|w| w.worker.provider() == provider && w.worker.fabric_provider() == fabric_provider)
        else {
            let asked = if fabric_provider.is_empty() {
                format!("{provider:?}")
            } else {
                format!("{provider:?} ({fabric_provider})")
            };
            return Err(DataPlaneError::NotOffered(format!(
                "{asked} is not offered by this agent; it offers {} (see [data_plane] providers and transports)",
                self.offers()
            )));
        };
        if let Some(refusal) = library_mismatch(fabric_provider, host_library, &library()) {
            return Err(DataPlaneError::NotOffered(refusal));
        }
        if host_address.is_empty() || host_address.len() > 64 * 1024 {
            return Err(DataPlaneError::Invalid(format!(
                "worker_address of {} bytes: expected a {provider} worker address (1 byte to 64 KiB)",
                host_address.len()
            )));
        }
        let w = &self.workers[lane];
        let endpoint = w.worker.connect(host_address)?;
        w.peers.fetch_add(1, Ordering::Relaxed);
        let peer = Arc::new(Peer { endpoint, lane, lane_peers: w.peers.clone(), failed: AtomicBool::new(false) });
        // A doorbell-less worker now has someone to poll for.
        self.wake_engine();
        Ok((peer, w.address.clone(), w.worker.describe()))
    }

    /// Unpack and, where the transport allows, map a host region (Memory.RegisterRegion).
    pub fn register_region(
        &self,
        peer: &Peer,
        id: u32,
        addr: u64,
        length: u64,
        packed_key: &[u8],
        access: RegionAccess,
    ) -> Result<HostRegion, DataPlaneError> {
        let key = peer.endpoint.unpack_key(packed_key, addr, length)?;
        let mapped = match usize::try_from(length) {
            Ok(len) => key.map(addr, len)?,
            Err(_) => None,
        };
        Ok(HostRegion { id, addr, length, access, key, mapped })
    }

    /// Check a ring's header in host memory and start serving it (Memory.RegisterRing).
    pub fn register_ring(
        &self,
        peer: &Peer,
        id: u32,
        region: Arc<HostRegion>,
        offset: u64,
        entries: u32,
    ) -> Result<HostRing, DataPlaneError> {
        let header = wire::RingHeader { entries }.encode();
        let bytes = wire::ring_bytes(entries) as u64;
        if !entries.is_power_of_two() || !(2..=wire::MAX_RING_ENTRIES).contains(&entries) {
            return Err(DataPlaneError::Invalid(format!(
                "entries = {entries}: a ring has a power of two from 2 to {} entries",
                wire::MAX_RING_ENTRIES
            )));
        }
        if !offset.is_multiple_of(64) || offset.checked_add(bytes).is_none_or(|end| end > region.length) {
            return Err(DataPlaneError::Invalid(format!(
                "a ring of {entries} entries needs {bytes} bytes at a 64-byte aligned offset inside region {} \
                 ({} bytes); offset {offset} does not fit",
                region.id, region.length
            )));
        }
        if !(region.access.agent_reads && region.access.agent_writes) {
            return Err(DataPlaneError::Invalid(format!(
                "region {} must be registered REGION_ACCESS_READ_WRITE to hold a ring",
                region.id
            )));
        }
        // The header the host wrote must say the same thing as the request.
        let mut found = [0u8; wire::HEADER_BYTES];
        read_host_blocking(&self.workers[peer.lane].worker, peer, &region, offset, &mut found)?;
        let decoded = wire::RingHeader::decode(&found)
            .map_err(|e| DataPlaneError::Invalid(format!("ring header at offset {offset}: {e}")))?;
        if found != header || decoded.entries != entries {
            return Err(DataPlaneError::Invalid(format!(
                "ring header at offset {offset} says {} entries, the request {entries}",
                decoded.entries
            )));
        }
        if let Some(m) = &region.mapped {
            // This agent can wake the host's waiters on this ring (see wire::AGENT_WAKES_OFFSET).
            m.store_u32_release(offset as usize + wire::AGENT_WAKES_OFFSET, 1);
        }
        Ok(HostRing {
            id,
            region,
            offset,
            entries,
            sq_head: AtomicU64::new(0),
            cq_tail: AtomicU64::new(0),
            broken: AtomicBool::new(false),
        })
    }
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Read host memory outside the engine (ring registration): mapped, or a get through a
/// small temporary region.
fn read_host_blocking(
    worker: &any::Worker,
    peer: &Peer,
    region: &HostRegion,
    offset: u64,
    out: &mut [u8],
) -> Result<(), DataPlaneError> {
    if let Some(m) = &region.mapped {
        m.read_at(offset as usize, out);
        return Ok(());
    }
    let tmp = worker.alloc_region(out.len().max(64))?;
    peer.endpoint.get(&tmp, 0, out.len(), region.addr + offset, &region.key)?;
    peer.endpoint.flush(FLUSH_TIMEOUT)?;
    tmp.read_at(0, out);
    Ok(())
}

/// `provider`, or `provider (libfabric provider)`: how errors and logs name a worker.
fn offer_name(w: &any::Worker) -> String {
    match w.fabric_provider() {
        "" => w.provider().to_owned(),
        f => format!("{} ({f})", w.provider()),
    }
}

/// The engine's view of one worker: its staging region for put/get, and whether any
/// session uses it.
struct EngineLane {
    worker: Arc<any::Worker>,
    staging: any::Region,
    peers: Arc<AtomicU64>,
}

struct Engine {
    agent: Arc<Agent>,
    lanes: Vec<EngineLane>,
    chunk_bytes: usize,
    stop: Arc<AtomicBool>,
    /// Chunks of mapped requests, for the I/O workers (bounded: in-flight work is).
    jobs: crossbeam_channel::Sender<Job>,
    /// The workers' queues keep many pieces in flight (the backend has asynchronous
    /// I/O): hand them every piece, none inline.
    io_overlaps: bool,
    qos: Arc<Mutex<Scheduler<Queued>>>,
    /// Cores to run a request's pieces on (the engine's and the I/O threads').
    cores: u64,
    /// How long to keep polling after the last piece of work before sleeping (a
    /// doorbell arriving meanwhile costs no wake-up): `[data_plane] idle_poll_us`.
    idle_poll: Duration,
    /// Agent-wide figures (doorbells, rings, peers); requests count through their
    /// session's tenant handle.
    metrics: Arc<Metrics>,
    /// The backend calls the engine makes itself (inline requests).
    backend_times: BackendTimes,
}

/// A ring being served, with what its entries need: session, peer and tenant.
struct Serving {
    key: RingKey,
    session: Arc<Session>,
    peer: Arc<Peer>,
    ring: Arc<HostRing>,
    /// `None`: the session's tenant is no longer configured (removed at run time).
    tenant: Option<Arc<TenantSlot>>,
}

/// A validated entry waiting in the scheduler; it already has its completion slot and
/// counts in its tenant's in-flight requests.
struct Queued {
    serving: Arc<Serving>,
    /// Its wait in the queue, from when it was taken, is QoS throttling.
    taken: Taken,
}

/// A validated entry taken off a ring: the request, its completion slot, and when it
/// was taken (its latency counts from there).
#[derive(Clone, Copy)]
struct Taken {
    sub: Submission,
    cq_index: u64,
    at: Instant,
}

/// Chunk jobs queued for the I/O workers at most; the engine waits when it is full.
const IO_QUEUE: usize = 1024;
/// With blocking backend calls, mapped requests are split so that the engine and the
/// I/O workers share one large request (a chunk boundary of the backend is always a
/// piece boundary): a request of at most one backend chunk in as many pieces as there
/// are cores to run them (a power of two from this size up to the chunk), a larger one
/// in pieces of this size. Measured on 2 cores, 1 MiB reads at queue depth 1: 256 KiB
/// pieces (the engine and two workers on two cores) reached 0.74x-1.00x of POSIX,
/// 512 KiB pieces (the engine and one worker) 1.14x-1.20x at a lower host CPU, whole
/// chunks 0.60x; for unet3d's 4 MiB reads, many in flight, 1 MiB pieces cost its
/// host about a fifth more CPU than 256 KiB ones. Queues that overlap I/O split at the
/// backend's chunk size instead: their pieces run concurrently anyway, and a smaller
/// piece only adds a storage call (over DAOS, an RPC) per piece.
const SPLIT_BYTES: u64 = 256 * 1024;

/// The piece size for a mapped request of `length` bytes ([`SPLIT_BYTES`]).
fn split_bytes(length: u64, cores: u64, chunk_bytes: u64) -> u64 {
    let floor = SPLIT_BYTES.min(chunk_bytes).max(1);
    if length > chunk_bytes {
        return floor;
    }
    length.div_ceil(cores.max(1)).next_power_of_two().clamp(floor, chunk_bytes.max(1))
}

/// A mapped request in flight on the I/O workers.
struct InFlight {
    session_id: u64,
    ring: Arc<HostRing>,
    region: Arc<HostRegion>,
    handle: Arc<Handle>,
    sub: Submission,
    cq_index: u64,
    pieces_left: std::sync::atomic::AtomicUsize,
    /// Lowest file offset where a read came up short (end of file); u64::MAX if none.
    short_end: AtomicU64,
    failed: AtomicBool,
    /// A piece failed an integrity check (inline encryption): the completion says so.
    integrity: AtomicBool,
    /// Counts this request in flight until its completion is posted.
    tenant: Arc<TenantSlot>,
    /// Woken when finishing this request makes room for a parked tenant.
    engine: Arc<any::Worker>,
    /// The session's tenant counters, and when the request was taken off its ring.
    metrics: Arc<TenantMetrics>,
    taken_at: Instant,
}

/// Work for the I/O threads.
enum Job {
    /// A piece of a mapped request.
    Piece(Piece),
    /// An open-read whose rings and regions are mapped: a batch of them (a loader's
    /// samples) runs on all the threads at once rather than one after another on the
    /// engine's.
    OpenRead(Box<OpenRead>),
}

struct Piece {
    request: Arc<InFlight>,
    piece: validate::Chunk,
}

/// An open-read entry taken off a mapped ring, run on an I/O thread: the namespace call,
/// the file's bytes and header written into the mapped answer range, its completion
/// posted as [`finish_mapped`] posts a request's.
struct OpenRead {
    agent: Arc<Agent>,
    session_id: u64,
    metrics: Arc<TenantMetrics>,
    ring: Arc<HostRing>,
    answer: Arc<HostRegion>,
    meta: MetaSubmission,
    asked: meta::Request,
    cq_index: u64,
    chunk_bytes: usize,
    /// The open-reads of one ring batch still running: the last to finish wakes the
    /// host (one wake-up for a loader's batch, not one per sample).
    group: Arc<std::sync::atomic::AtomicUsize>,
}

impl OpenRead {
    fn run(self) {
        let started = Instant::now();
        let m = &self.meta;
        let mapped = self.answer.mapped.as_ref().expect("only mapped open-reads are queued");
        let answered = namespace_call(&*self.agent, self.session_id, self.asked).and_then(|reply| {
            let meta::Reply::Object { object, attr } = reply else {
                return Err(crate::error::Error::invalid("opcode", "an open-read answered without a file"));
            };
            let header = u64::from(wire::META_ANSWER_HEADER_BYTES);
            let want = attr.size.min(u64::from(m.answer_length).saturating_sub(header));
            let done = read_object_mapped(&*object, mapped, m.answer_offset + header, want, self.chunk_bytes)?;
            let head = meta::open_read_header(&attr, done);
            mapped.bytes_mut(m.answer_offset as usize, head.len()).copy_from_slice(&head);
            Ok(header + done)
        });
        count_meta(&self.metrics, m.opcode, &answered, started);
        let (status, result) = match answered {
            Ok(written) => (wire::Status::Ok, written),
            Err(refused) => {
                let record = meta::error_answer(&refused, m.answer_length as usize);
                mapped.bytes_mut(m.answer_offset as usize, record.len()).copy_from_slice(&record);
                (wire::Status::Refused, record.len() as u64)
            }
        };
        post_mapped(&self.ring, self.cq_index, &protocol::completion(m.user_data, self.cq_index, status, result));
        if self.group.fetch_sub(1, Ordering::SeqCst) == 1 {
            wake_waiters(&self.ring);
        }
    }
}

/// Run a metadata request through the agent's namespace policy (the gRPC handlers' own).
fn namespace_call(agent: &Agent, session_id: u64, request: meta::Request) -> crate::error::Result<meta::Reply> {
    match agent.namespace() {
        Some(ns) => ns.metadata(session_id, request),
        None => Err(crate::error::Error::Unavailable("serving no namespace on its data plane")),
    }
}

/// Read up to `length` bytes of `object` from offset 0 straight into mapped host
/// memory at `at`, chunk by chunk: the bytes read (short at end of file) or why not.
fn read_object_mapped(
    object: &dyn dpuio_backend::Object,
    mapped: &fabric::SharedMemory,
    at: u64,
    length: u64,
    chunk_bytes: usize,
) -> Result<u64, dpuio_backend::Error> {
    let mut done = 0u64;
    for c in validate::chunks(0, at, length, chunk_bytes as u64) {
        let n = object.read_into(mapped.bytes_mut(c.region_offset as usize, c.length as usize), c.file_offset)?;
        done += n as u64;
        if (n as u64) < c.length {
            break; // end of file
        }
    }
    Ok(done)
}

/// How a metadata entry went, counted as the same call over gRPC is: by operation,
/// refusals by their code; an open-read also as a read of the file bytes it wrote after
/// its header.
fn count_meta(
    metrics: &TenantMetrics,
    opcode: wire::MetaOpcode,
    answered: &crate::error::Result<u64>,
    started: Instant,
) {
    let op = Op::of_meta(opcode);
    match (answered, op) {
        (Ok(written), Op::Read) => metrics.request(
            op,
            wire::Status::Ok,
            written.saturating_sub(u64::from(wire::META_ANSWER_HEADER_BYTES)),
            started.elapsed(),
        ),
        (Ok(_), _) => metrics.call(op, Ok(())),
        (Err(refused), _) => metrics.call(op, Err(refused.code())),
    }
}

/// Post `c` at `cq_index` of a mapped ring: the entry, then its `seq` word. Waking the
/// ring's waiters is the caller's.
fn post_mapped(ring: &HostRing, cq_index: u64, c: &Completion) {
    let mem = ring.region.mapped.as_ref().expect("posted into mapped rings only");
    let at = ring.offset as usize + wire::cqe_offset(ring.entries, cq_index);
    mem.bytes_mut(at, 24).copy_from_slice(&c.encode()[..24]);
    mem.store_u64_release(at + 24, c.seq);
}

/// An I/O thread: takes pieces of mapped requests and runs them on its backend's
/// queue. With a queue that overlaps I/O (DAOS event queues) it takes every piece that
/// is waiting, up to the queue's depth, and runs them as one batch, so one thread keeps
/// many backend reads in flight; with a one-at-a-time queue (`local`) it takes one piece
/// and leaves the rest to the other threads.
fn io_worker(queue: crossbeam_channel::Receiver<Job>, mut io: Box<dyn IoQueue>, times: &BackendTimes) {
    let mut batch: Vec<Piece> = Vec::with_capacity(io.depth());
    while let Ok(job) = queue.recv() {
        let mut after: Option<Box<OpenRead>> = None;
        let first = match job {
            Job::Piece(p) => p,
            Job::OpenRead(o) => {
                o.run();
                continue;
            }
        };
        let overlaps = io.overlaps(&*first.request.handle.object);
        batch.push(first);
        // A piece the queue would run on this thread ends the batch: it must not hold
        // back the pieces gathered before it longer than it takes itself.
        while overlaps && batch.len() < io.depth() {
            match queue.try_recv() {
                Ok(Job::Piece(p)) => {
                    let stop = !io.overlaps(&*p.request.handle.object);
                    batch.push(p);
                    if stop {
                        break;
                    }
                }
                Ok(Job::OpenRead(o)) => {
                    after = Some(o); // runs on this thread: after the batch
                    break;
                }
                Err(_) => break,
            }
        }
        run_pieces(&mut *io, &batch, times);
        batch.clear();
        if let Some(o) = after {
            o.run();
        }
    }
}

/// Run pieces of mapped requests; the last piece of each request posts its completion.
///
/// Each piece's backend time goes to `times`: on a queue that overlaps its pieces, from
/// the batch's start to the piece's outcome (they were all submitted together); on one
/// that runs them one after another, from the previous outcome.
fn run_pieces(io: &mut dyn IoQueue, batch: &[Piece], times: &BackendTimes) {
    let overlapped = io.depth() > 1;
    let mut requests: Vec<IoRequest<'_>> = batch
        .iter()
        .map(|Piece { request: r, piece }| {
            let mapped = r.region.mapped.as_ref().expect("only mapped requests are queued");
            let (at, len) = (piece.region_offset as usize, piece.length as usize);
            IoRequest {
                object: &*r.handle.object,
                offset: piece.file_offset,
                op: match r.sub.opcode {
                    Opcode::Read => IoOp::Read(mapped.bytes_mut(at, len)),
                    Opcode::Write => IoOp::Write(mapped.bytes(at, len)),
                },
            }
        })
        .collect();
    let started = Instant::now();
    let mut last = started;
    io.run(&mut requests, &mut |i, outcome| {
        let Piece { request: r, piece } = &batch[i];
        let now = Instant::now();
        let h = if r.sub.opcode == Opcode::Read { &times.read } else { &times.write };
        h.observe(now.duration_since(if overlapped { started } else { last }).as_secs_f64());
        last = now;
        match outcome {
            Ok(n) if r.sub.opcode == Opcode::Read && (n as u64) < piece.length => {
                r.short_end.fetch_min(piece.file_offset + n as u64, Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(session = format!("{:#018x}", r.session_id), error = %e, "backend I/O failed");
                if matches!(e, dpuio_backend::Error::Integrity { .. }) {
                    r.integrity.store(true, Ordering::Relaxed);
                }
                r.failed.store(true, Ordering::Relaxed);
            }
        }
        if r.pieces_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            finish_mapped(r, times);
        }
    });
}

/// The last piece of a mapped request is done: sync if asked, post the completion.
fn finish_mapped(r: &InFlight, times: &BackendTimes) {
    let mut failed = r.failed.load(Ordering::Relaxed);
    if !failed
        && r.sub.opcode == Opcode::Write
        && r.sub.flags & wire::FLAG_SYNC != 0
        && let Err(e) = timed(&times.sync, || r.handle.object.sync())
    {
        tracing::warn!(session = format!("{:#018x}", r.session_id), error = %e, "sync after write failed");
        failed = true;
    }
    let short_end = r.short_end.load(Ordering::Relaxed);
    let result = if short_end == u64::MAX { r.sub.length } else { short_end.saturating_sub(r.sub.file_offset) };
    let status = match (failed, r.integrity.load(Ordering::Relaxed)) {
        (false, _) => wire::Status::Ok,
        (true, true) => wire::Status::Integrity,
        (true, false) => wire::Status::Io,
    };
    let result = if failed { 0 } else { result };
    post_mapped(&r.ring, r.cq_index, &protocol::completion(r.sub.user_data, r.cq_index, status, result));
    wake_waiters(&r.ring);
    r.metrics.request(Op::of(r.sub.opcode), status, result, r.taken_at.elapsed());
    if r.tenant.finish(1) {
        let _ = r.engine.wake();
    }
}

/// Whether a mapped ring has submissions the engine has not taken.
fn ring_has_work(ring: &HostRing) -> bool {
    ring.region.mapped.as_ref().is_some_and(|m| {
        m.load_u64_acquire(ring.offset as usize + wire::SQ_TAIL_OFFSET) != ring.sq_head.load(Ordering::Relaxed)
    })
}

/// Tell the host whether the engine is polling this ring (see wire::AGENT_POLLING_OFFSET).
fn set_polling(ring: &HostRing, on: bool) {
    if let Some(m) = &ring.region.mapped {
        m.store_u32_release(ring.offset as usize + wire::AGENT_POLLING_OFFSET, u32::from(on));
    }
}

/// Wake host threads sleeping on this ring's futex word, if any (shared memory only).
fn wake_waiters(ring: &HostRing) {
    let Some(m) = &ring.region.mapped else { return };
    let base = ring.offset as usize;
    // Pairs with the host's fence between setting cq_waiters and re-checking the ring.
    std::sync::atomic::fence(Ordering::SeqCst);
    if m.load_u32_acquire(base + wire::CQ_WAITERS_OFFSET) != 0 {
        let word = m.atomic_u32(base + wire::CQ_FUTEX_OFFSET);
        word.fetch_add(1, Ordering::SeqCst);
        // Not FUTEX_PRIVATE: the word lives in memory shared with the host process.
        let _ = rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
    }
}

impl Engine {
    fn run(&mut self) {
        let mut bells = Vec::new();
        // Which rings to look at when; hot rings are polled directly while the engine
        // spins, with agent_polling set so their hosts skip the doorbell.
        let mut ready: Readiness<Arc<HostRing>, Arc<TenantSlot>> = Readiness::new(Instant::now());
        while !self.stop.load(Ordering::SeqCst) {
            bells.clear();
            for lane in &self.lanes {
                while lane.worker.progress() > 0 {}
                if lane.worker.take_doorbells(&mut bells) > 0 {
                    ready.lost_doorbells();
                }
            }
            for bell in &bells {
                match wire::Doorbell::decode(bell.as_bytes()) {
                    Some(d) => ready.ready((d.session_id, d.ring_id)),
                    None => {
                        self.metrics.undecodable_doorbells.inc();
                        tracing::debug!("malformed doorbell ignored");
                    }
                }
            }
            if ready.scan_due() {
                for key in self.agent.all_rings() {
                    ready.ready(key);
                }
                self.drop_removed_tenants();
                ready.scanned(Instant::now());
            }
            ready.poll_hot(|ring| ring_has_work(ring));
            ready.unpark(|tenant| tenant.room());
            let queued_wait = self.queued_wait();
            let spin = if self.polls_for_doorbells() { NO_FD_SPIN.max(self.idle_poll) } else { self.idle_poll };
            match ready.idle(Instant::now, queued_wait, spin) {
                Idle::Work => {}
                Idle::Spin => {
                    std::hint::spin_loop();
                    continue;
                }
                Idle::Sleep => {
                    // Going to sleep: hosts must ring again. Clear the flags, then look
                    // once more (pairs with the host's fence after publishing sq_tail).
                    for (_, ring) in ready.hot() {
                        set_polling(ring, false);
                    }
                    std::sync::atomic::fence(Ordering::SeqCst);
                    if ready.cool(|ring| ring_has_work(ring)) {
                        continue;
                    }
                    if let Err(e) = self.wait(ready.sleep_for(Instant::now(), queued_wait)) {
                        tracing::error!(error = %e, "engine cannot wait on the transport; polling");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    ready.woke(Instant::now());
                    continue;
                }
            }
            let serving = self.resolve(ready.take_pending());
            // One unlimited tenant with work and nothing queued: run entries as they
            // are taken, as fast as without QoS. Otherwise the scheduler decides.
            let direct = queued_wait.is_none()
                && serving.first().is_some_and(|first| {
                    first.tenant.as_ref().is_some_and(|t| t.is_unlimited())
                        && serving.iter().all(|s| match (&s.tenant, &first.tenant) {
                            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                            _ => false,
                        })
                });
            for s in serving {
                let key = s.key;
                if let Some(tenant) = &s.tenant
                    && tenant.room() == 0
                {
                    park(&mut ready, &s, tenant);
                    continue;
                }
                if s.ring.region.mapped.is_some() && !ready.is_hot(key) {
                    set_polling(&s.ring, true);
                    ready.heat(key, s.ring.clone());
                }
                match self.serve_ring(&s, direct) {
                    Ok(true) => match &s.tenant {
                        Some(tenant) if tenant.room() == 0 => park(&mut ready, &s, tenant),
                        _ => ready.ready(key), // more waiting: come back after the others
                    },
                    Ok(false) => {}
                    Err(e) => fail_peer(&self.metrics, &s, &e),
                }
            }
            self.serve_queue(QUEUE_BATCH);
        }
        for (_, ring) in ready.hot() {
            set_polling(ring, false);
        }
    }

    /// Whether a worker with peers does not wake the engine on their doorbells
    /// (libfabric shm): the engine then polls for them.
    fn polls_for_doorbells(&self) -> bool {
        self.lanes.iter().any(|l| !l.worker.wakes_on_receive() && l.peers.load(Ordering::Relaxed) > 0)
    }

    /// Sleep until a worker has work or is woken, or `timeout` passes (at most
    /// [`NO_FD_SLICE`] while [`Engine::polls_for_doorbells`]).
    fn wait(&self, mut timeout: Duration) -> Result<bool, fabric::Error> {
        if self.polls_for_doorbells() {
            timeout = timeout.min(NO_FD_SLICE);
        }
        let workers: Vec<&any::Worker> = self.lanes.iter().map(|l| &*l.worker).collect();
        fabric::wait_any(&workers, timeout)
    }

    /// The rings behind `keys` that still exist and are served, with their tenants.
    fn resolve(&self, keys: impl Iterator<Item = RingKey>) -> Vec<Arc<Serving>> {
        let rings: Vec<_> = keys
            .filter_map(|key| {
                let (session, peer, ring) = self.agent.ring(key.0, key.1)?;
                let served = !peer.failed.load(Ordering::Relaxed) && !ring.broken.load(Ordering::Relaxed);
                served.then_some((key, session, peer, ring))
            })
            .collect();
        if rings.is_empty() {
            return Vec::new();
        }
        let now = Instant::now();
        let mut scheduler = lock(&self.qos);
        rings
            .into_iter()
            .map(|(key, session, peer, ring)| {
                let tenant = scheduler.slot(&session.tenant, now, || self.agent.tenant(&session.tenant).map(|t| t.qos));
                Arc::new(Serving { key, session, peer, ring, tenant })
            })
            .collect()
    }

    /// How long until a queued request may run (`None`: nothing queued).
    fn queued_wait(&self) -> Option<Duration> {
        let mut scheduler = lock(&self.qos);
        if scheduler.is_empty() {
            return None;
        }
        scheduler.next_ready_in(Instant::now())
    }

    /// Forget tenants removed from the agent; their queued requests complete as
    /// cancelled.
    fn drop_removed_tenants(&mut self) {
        let dropped = lock(&self.qos).retain_tenants(|name| self.agent.has_tenant(name));
        for q in dropped {
            let s = &q.serving;
            let Taken { sub, cq_index, .. } = q.taken;
            s.session.metrics.completed(Op::of(sub.opcode), wire::Status::Cancelled);
            let completion = protocol::completion(sub.user_data, cq_index, wire::Status::Cancelled, 0);
            if let Some(tenant) = &s.tenant {
                let _ = tenant.finish(1); // the tenant is gone: nobody waits for its room
            }
            match self.post_completion(&s.peer, &s.ring, cq_index, &completion) {
                Ok(()) => wake_waiters(&s.ring),
                Err(e) => fail_peer(&self.metrics, s, &e),
            }
        }
    }

    /// Run up to `budget` queued requests in the scheduler's order.
    fn serve_queue(&mut self, budget: usize) {
        let mut posted: Vec<Arc<HostRing>> = Vec::new();
        for _ in 0..budget {
            let next = {
                let mut scheduler = lock(&self.qos);
                if scheduler.is_empty() {
                    break;
                }
                scheduler.pop(Instant::now())
            };
            let Some(q) = next else { break }; // every queued tenant is over its rate
            let s = &q.serving;
            let Some(tenant) = &s.tenant else { continue }; // only known tenants are queued
            if s.peer.failed.load(Ordering::Relaxed) || s.ring.broken.load(Ordering::Relaxed) {
                let _ = tenant.finish(1); // its host is gone; the engine is running anyway
                continue;
            }
            let Taken { sub, cq_index, at } = q.taken;
            s.session.metrics.throttled(at.elapsed());
            let ran = self.run_entry(&s.session, &s.peer, &s.ring, tenant, &q.taken).and_then(|ran| {
                let Ran::Done { status, result } = ran else { return Ok(false) };
                let completion = protocol::completion(sub.user_data, cq_index, status, result);
                self.post_completion(&s.peer, &s.ring, cq_index, &completion).map(|()| true)
            });
            match ran {
                Ok(false) => {}
                Ok(true) => {
                    if !posted.iter().any(|r| Arc::ptr_eq(r, &s.ring)) {
                        posted.push(s.ring.clone());
                    }
                }
                Err(e) => fail_peer(&self.metrics, s, &e),
            }
        }
        for ring in posted {
            wake_waiters(&ring);
        }
    }

    /// Run one validated entry that counts in `tenant`'s in-flight requests: on the I/O
    /// workers (they post its completion), or here (its completion is the caller's to
    /// post).
    fn run_entry(
        &mut self,
        session: &Session,
        peer: &Peer,
        ring: &Arc<HostRing>,
        tenant: &Arc<TenantSlot>,
        taken: &Taken,
    ) -> Result<Ran, DataPlaneError> {
        if self.dispatch(session, ring, taken, tenant).is_some() {
            return Ok(Ran::OnWorkers);
        }
        let outcome = self.execute(session, peer, &taken.sub);
        // Parked rings are looked at by this thread on its next round: no wake needed.
        let _ = tenant.finish(1);
        let (status, result) = outcome?;
        session.metrics.request(Op::of(taken.sub.opcode), status, result, taken.at.elapsed());
        Ok(Ran::Done { status, result })
    }

    /// Serve one ring once through its protocol machine ([`protocol::Batch`]): take up
    /// to [`protocol::RING_BATCH`] submissions (no more than its tenant has room for); invalid ones
    /// complete with their error at once; valid ones run now (`direct`) or go to the
    /// scheduler. Returns whether more remain.
    fn serve_ring(&mut self, s: &Arc<Serving>, direct: bool) -> Result<bool, DataPlaneError> {
        let (session, peer, ring) = (&*s.session, &*s.peer, &s.ring);
        let base = ring.offset;
        let sq_tail = self.load_u64(peer, &ring.region, base + wire::SQ_TAIL_OFFSET as u64)?;
        let cq_head = self.load_u64(peer, &ring.region, base + wire::CQ_HEAD_OFFSET as u64)?;
        let cursor = protocol::Cursor {
            sq_head: ring.sq_head.load(Ordering::Relaxed),
            cq_tail: ring.cq_tail.load(Ordering::Relaxed),
        };
        let tenant = match &s.tenant {
            None => protocol::Tenant::Removed,
            Some(t) if direct => protocol::Tenant::Direct { room: t.room() },
            Some(t) => protocol::Tenant::Queued { room: t.room() },
        };
        let mut batch = match cursor.serve(ring.entries, protocol::HostIndices { sq_tail, cq_head }, tenant) {
            protocol::Serve::Batch(batch) => batch,
            protocol::Serve::Idle => return Ok(false),
            protocol::Serve::Broken => {
                ring.broken.store(true, Ordering::Relaxed);
                self.metrics.broken_rings.inc();
                tracing::warn!(
                    session = format!("{:#018x}", session.id),
                    ring = ring.id,
                    sq_tail,
                    cq_head,
                    "ring indices out of range: the host broke the ring protocol; ring no longer served"
                );
                return Ok(false);
            }
        };
        let mut entry = [0u8; wire::SQE_BYTES];
        // Submissions waiting behind the one fetched last (the host's count: used only to
        // choose where an open-read runs).
        let mut behind = sq_tail.wrapping_sub(cursor.sq_head);
        // This batch's open-reads on the I/O threads (see OpenRead::group).
        let mut group: Option<Arc<std::sync::atomic::AtomicUsize>> = None;
        // Counted when pushed to the scheduler at the end: a transfer failure before
        // then must not leave them counted.
        let mut queued = Vec::new();
        // Whether the next completion is that of an entry that ran here (counted when it
        // ran); any other is a refusal, counted when posted.
        let mut ran_here = false;
        // The batch's entries were all waiting when it began: their latency counts from
        // here (one clock read a batch, not one an entry).
        let taken_at = Instant::now();
        while let Some(action) = batch.poll() {
            let performed = match (action, &s.tenant) {
                (Action::Fetch { index }, _) => {
                    behind = behind.saturating_sub(1);
                    let at = base + wire::sqe_offset(ring.entries, index) as u64;
                    self.read_host(peer, &ring.region, at, &mut entry).map(|()| {
                        batch.fetched(&entry, session, self.agent.limits().max_io_bytes);
                    })
                }
                (Action::Run { sub, cq_index }, Some(tenant)) => {
                    tenant.start(1);
                    let taken = Taken { sub, cq_index, at: taken_at };
                    self.run_entry(session, peer, ring, tenant, &taken).map(|ran| {
                        ran_here = matches!(ran, Ran::Done { .. });
                        batch.ran(ran)
                    })
                }
                (Action::Queue { sub, cq_index }, Some(_)) => {
                    queued.push(Queued { serving: s.clone(), taken: Taken { sub, cq_index, at: taken_at } });
                    Ok(())
                }
                // Not given (a removed tenant is Tenant::Removed: its entries are
                // cancelled), but if it were, the host still gets its completion.
                (Action::Run { .. }, None) => {
                    batch.ran(Ran::Done { status: wire::Status::Cancelled, result: 0 });
                    Ok(())
                }
                (Action::Queue { sub, cq_index }, None) => {
                    session.metrics.completed(Op::of(sub.opcode), wire::Status::Cancelled);
                    let completion = protocol::completion(sub.user_data, cq_index, wire::Status::Cancelled, 0);
                    self.post_completion(peer, ring, cq_index, &completion)
                }
                // An open-read with more entries behind it goes to the I/O threads, so a
                // batch of samples is read in parallel; the last one runs here.
                (Action::Meta { meta, cq_index }, _)
                    if behind > 0 && self.dispatch_open_read(s, &meta, cq_index, &mut group) =>
                {
                    batch.ran(Ran::OnWorkers);
                    Ok(())
                }
                (Action::Meta { meta, .. }, _) => self.run_meta(session, peer, &meta).map(|(status, result)| {
                    ran_here = true; // counted as it ran (run_meta)
                    batch.ran(Ran::Done { status, result });
                }),
                (Action::Complete { index, completion }, _) => {
                    if !std::mem::take(&mut ran_here) {
                        let op = Submission::decode(&entry).map_or(Op::Unknown, |sub| Op::of(sub.opcode));
                        let status = wire::Status::from_i32(completion.status).unwrap_or(wire::Status::Io);
                        session.metrics.completed(op, status);
                    }
                    self.post_completion(peer, ring, index, &completion)
                }
                (Action::Finish { cursor, wake, more }, _) => {
                    ring.sq_head.store(cursor.sq_head, Ordering::Relaxed);
                    ring.cq_tail.store(cursor.cq_tail, Ordering::Relaxed);
                    // Open-reads still running on the I/O threads: the last of them wakes
                    // the host, for the completions posted here too (one wake-up for the
                    // batch). The fence orders this batch's completions before the load,
                    // against the workers' decrements.
                    let workers_wake = group.as_ref().is_some_and(|g| {
                        std::sync::atomic::fence(Ordering::SeqCst);
                        g.load(Ordering::SeqCst) > 0
                    });
                    return self.finish_batch(s, cursor.sq_head, queued, wake && !workers_wake, more);
                }
            };
            if let Err(e) = performed {
                // The host is gone: the batch asks for nothing more and the ring keeps
                // its cursor; the caller closes the peer's data plane.
                batch.transfer_failed();
                return Err(e);
            }
        }
        Ok(false) // not reached: a batch ends with Finish unless a transfer failed
    }

    /// The end of a ring's batch: queue its valid entries in the scheduler, store the
    /// advisory `sq_head`, wake the host's waiters if a completion was posted.
    fn finish_batch(
        &mut self,
        s: &Serving,
        sq_head: u64,
        queued: Vec<Queued>,
        mut wake: bool,
        more: bool,
    ) -> Result<bool, DataPlaneError> {
        let (peer, ring) = (&*s.peer, &s.ring);
        if let (false, Some(tenant)) = (queued.is_empty(), &s.tenant) {
            let mut refused = Vec::new();
            {
                let mut scheduler = lock(&self.qos);
                for q in queued {
                    let cost = q.taken.sub.length;
                    match scheduler.push(tenant, q, cost) {
                        Ok(()) => tenant.start(1),
                        Err(q) => refused.push(q),
                    }
                }
            }
            // Only when the tenant's max_inflight was lowered below its queue at run
            // time: the host may submit again.
            for q in refused {
                let Taken { sub, cq_index, .. } = q.taken;
                s.session.metrics.completed(Op::of(sub.opcode), wire::Status::Busy);
                let completion = protocol::completion(sub.user_data, cq_index, wire::Status::Busy, 0);
                self.post_completion(peer, ring, cq_index, &completion)?;
                wake = true;
            }
        }
        // Advisory for the host (it trusts the seq words, not this).
        self.store_u64(peer, &ring.region, ring.offset + wire::SQ_HEAD_OFFSET as u64, sq_head)?;
        if wake {
            wake_waiters(ring);
        }
        Ok(more)
    }

    /// Queue a request whose region and ring are mapped on the I/O workers, split in
    /// pieces. `None` when it must run inline (an unmapped region: put/get).
    fn dispatch(
        &mut self,
        session: &Session,
        ring: &Arc<HostRing>,
        taken: &Taken,
        tenant: &Arc<TenantSlot>,
    ) -> Option<()> {
        let Taken { sub, cq_index, at: taken_at } = *taken;
        let region = session.host_region(sub.region_id)?;
        region.mapped.as_ref()?;
        ring.region.mapped.as_ref()?;
        let handle = session.handle(sub.handle).ok()?;
        let split = match self.io_overlaps {
            true => self.chunk_bytes as u64,
            false => split_bytes(sub.length, self.cores, self.chunk_bytes as u64),
        };
        let pieces: Vec<validate::Chunk> =
            validate::chunks(sub.file_offset, sub.region_offset, sub.length, split).collect();
        // With blocking backend calls one piece is cheaper inline than a hand-off to a
        // worker; with overlapping queues every piece goes to them, so the engine never
        // waits on storage and the workers keep many pieces in flight.
        if pieces.is_empty() || (pieces.len() == 1 && !self.io_overlaps) {
            return None;
        }
        let request = Arc::new(InFlight {
            session_id: session.id,
            ring: ring.clone(),
            region,
            handle,
            sub,
            cq_index,
            pieces_left: std::sync::atomic::AtomicUsize::new(pieces.len()),
            short_end: AtomicU64::new(u64::MAX),
            failed: AtomicBool::new(false),
            integrity: AtomicBool::new(false),
            tenant: tenant.clone(),
            engine: self.lanes[0].worker.clone(),
            metrics: session.metrics.clone(),
            taken_at,
        });
        // Blocking backend calls: the engine takes the first piece itself rather than
        // idling while workers wake.
        let inline = (!self.io_overlaps).then(|| pieces[0]);
        for &piece in &pieces[usize::from(inline.is_some())..] {
            if self.jobs.send(Job::Piece(Piece { request: request.clone(), piece })).is_err() {
                // The workers are gone (shutdown): fail this piece.
                request.failed.store(true, Ordering::Relaxed);
                if request.pieces_left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    finish_mapped(&request, &self.backend_times);
                }
            }
        }
        if let Some(piece) = inline {
            run_pieces(&mut OneAtATime, &[Piece { request, piece }], &self.backend_times);
        }
        Some(())
    }

    /// Run one validated request. Backend failures become error completions; only a
    /// transport failure (the host is gone) is an `Err`.
    fn execute(
        &mut self,
        session: &Session,
        peer: &Peer,
        sub: &Submission,
    ) -> Result<(wire::Status, u64), DataPlaneError> {
        let (Ok(handle), Some(region)) = (session.handle(sub.handle), session.host_region(sub.region_id)) else {
            return Ok((wire::Status::BadHandle, 0)); // closed between validation and now
        };
        let object = &handle.object;
        let chunk_bytes = self.chunk_bytes as u64;
        let mut done = 0u64;
        match (&region.mapped, sub.opcode) {
            (Some(mapped), Opcode::Read) => {
                for c in validate::chunks(sub.file_offset, sub.region_offset, sub.length, chunk_bytes) {
                    let dst = mapped.bytes_mut(c.region_offset as usize, c.length as usize);
                    match timed(&self.backend_times.read, || object.read_into(dst, c.file_offset)) {
                        Ok(n) => {
                            done += n as u64;
                            if (n as u64) < c.length {
                                break; // end of file
                            }
                        }
                        Err(e) => return Ok(io_failed(session, sub, &e)),
                    }
                }
            }
            (Some(mapped), Opcode::Write) => {
                for c in validate::chunks(sub.file_offset, sub.region_offset, sub.length, chunk_bytes) {
                    let src = mapped.bytes(c.region_offset as usize, c.length as usize);
                    if let Err(e) = timed(&self.backend_times.write, || object.write_from(src, c.file_offset)) {
                        return Ok(io_failed(session, sub, &e));
                    }
                    done += c.length;
                }
            }
            (None, _) => return self.execute_staged(session, peer, sub, &region, object),
        }
        if sub.opcode == Opcode::Write
            && sub.flags & wire::FLAG_SYNC != 0
            && let Err(e) = timed(&self.backend_times.sync, || object.sync())
        {
            return Ok(io_failed(session, sub, &e));
        }
        Ok((wire::Status::Ok, done))
    }

    /// Run one validated request whose region is not mapped: its payload moves
    /// through this lane's staging region in the steps [`protocol::Staged`] gives.
    fn execute_staged(
        &mut self,
        session: &Session,
        peer: &Peer,
        sub: &Submission,
        region: &HostRegion,
        object: &Arc<dyn dpuio_backend::Object>,
    ) -> Result<(wire::Status, u64), DataPlaneError> {
        let half_bytes = self.chunk_bytes;
        let staging = &mut self.lanes[peer.lane].staging;
        let failure = |e: dpuio_backend::Error| match io_failed(session, sub, &e).0 {
            wire::Status::Integrity => BackendFailure::Integrity,
            _ => BackendFailure::Io,
        };
        let mut transfer = protocol::Staged::new(*sub, self.chunk_bytes as u64);
        while let Some(step) = transfer.poll() {
            match step {
                Step::Read { chunk, half } => {
                    let at = SCRATCH_BYTES + half * half_bytes;
                    let dst = &mut staging.as_mut_slice()[at..][..chunk.length as usize];
                    let read = timed(&self.backend_times.read, || object.read_at(dst, chunk.file_offset));
                    transfer.read(read.map_err(failure));
                }
                Step::Put { half, len, region_offset } => {
                    let at = SCRATCH_BYTES + half * half_bytes;
                    peer.endpoint.put(staging, at, len, region.addr + region_offset, &region.key)?;
                }
                Step::Get { chunk } => {
                    let (len, from) = (chunk.length as usize, region.addr + chunk.region_offset);
                    peer.endpoint.get(staging, SCRATCH_BYTES, len, from, &region.key)?;
                }
                Step::Flush => peer.endpoint.flush(FLUSH_TIMEOUT)?,
                Step::Write { chunk } => {
                    let src = &staging.as_slice()[SCRATCH_BYTES..][..chunk.length as usize];
                    let wrote = timed(&self.backend_times.write, || object.write_at(src, chunk.file_offset));
                    transfer.wrote(wrote.map_err(failure));
                }
                Step::Sync => transfer.synced(timed(&self.backend_times.sync, || object.sync()).map_err(failure)),
                Step::Done { status, result } => return Ok((status, result)),
            }
        }
        // Not reached: a staged request always ends with Step::Done.
        Ok((wire::Status::Io, 0))
    }

    /// Queue an open-read on the I/O threads when its ring and regions are mapped (the
    /// threads write host memory directly); false to run it here instead.
    fn dispatch_open_read(
        &mut self,
        s: &Serving,
        m: &MetaSubmission,
        cq_index: u64,
        group: &mut Option<Arc<std::sync::atomic::AtomicUsize>>,
    ) -> bool {
        if m.opcode != wire::MetaOpcode::OpenRead || s.ring.region.mapped.is_none() {
            return false;
        }
        let (Some(answer), Some(request)) =
            (s.session.host_region(m.answer_region), s.session.host_region(m.request_region))
        else {
            return false;
        };
        let Some(mapped) = request.mapped.as_ref().filter(|_| answer.mapped.is_some()) else { return false };
        let bytes = mapped.bytes(m.request_offset as usize, m.request_length as usize).to_vec();
        let Ok(asked) = meta::request(m, &bytes) else { return false }; // refused here, with its reason
        let group = group.get_or_insert_with(Default::default).clone();
        group.fetch_add(1, Ordering::AcqRel);
        let job = OpenRead {
            agent: self.agent.clone(),
            session_id: s.session.id,
            metrics: s.session.metrics.clone(),
            ring: s.ring.clone(),
            answer,
            meta: *m,
            asked,
            cq_index,
            chunk_bytes: self.chunk_bytes,
            group,
        };
        if let Err(crossbeam_channel::SendError(Job::OpenRead(job))) = self.jobs.send(Job::OpenRead(Box::new(job))) {
            job.run(); // the workers are gone (shutdown): run it here
        }
        true
    }

    /// Run one metadata entry whose memory ranges were checked: copy its request out
    /// of host memory once, run it through the agent's namespace policy (the gRPC
    /// handlers' own), and write the answer, or the error gRPC would give, into its
    /// answer range. Only a transport failure is an `Err`.
    fn run_meta(
        &mut self,
        session: &Session,
        peer: &Peer,
        m: &MetaSubmission,
    ) -> Result<(wire::Status, u64), DataPlaneError> {
        let Some(answer) = session.host_region(m.answer_region) else {
            return Ok((wire::Status::BadRegion, 0)); // deregistered since validation
        };
        let mut request = vec![0u8; m.request_length as usize];
        if m.request_length > 0 {
            let Some(region) = session.host_region(m.request_region) else {
                return Ok((wire::Status::BadRegion, 0));
            };
            self.read_host_range(peer, &region, m.request_offset, &mut request)?;
        }
        let started = Instant::now();
        let answered = match meta::request(m, &request) {
            Ok(asked) => self.meta_answer(session.id, peer, &answer, m, asked)?,
            Err(e) => Err(e),
        };
        count_meta(&session.metrics, m.opcode, &answered, started);
        match answered {
            Ok(written) => Ok((wire::Status::Ok, written)),
            Err(refused) => {
                let record = meta::error_answer(&refused, m.answer_length as usize);
                self.write_host(peer, &answer, m.answer_offset, &record)?;
                Ok((wire::Status::Refused, record.len() as u64))
            }
        }
    }

    /// Run `asked` and write its answer: the bytes written, or why the namespace
    /// refused it.
    fn meta_answer(
        &mut self,
        session_id: u64,
        peer: &Peer,
        answer: &HostRegion,
        m: &MetaSubmission,
        mut asked: meta::Request,
    ) -> Result<crate::error::Result<u64>, DataPlaneError> {
        let room = m.answer_length as usize;
        let mut reply = match namespace_call(&*self.agent, session_id, asked.clone()) {
            Ok(reply) => reply,
            Err(e) => return Ok(Err(e)),
        };
        if let meta::Reply::Object { object, attr } = &reply {
            let header = u64::from(wire::META_ANSWER_HEADER_BYTES);
            let want = attr.size.min(u64::from(m.answer_length).saturating_sub(header));
            return Ok(match self.read_object_to_host(peer, answer, m.answer_offset + header, want, object)? {
                Ok(n) => {
                    self.write_host(peer, answer, m.answer_offset, &meta::open_read_header(attr, n))?;
                    Ok(header + n)
                }
                Err(e) => Err(e.into()),
            });
        }
        loop {
            let need = match meta::answer(&reply, room) {
                Ok(bytes) => {
                    self.write_host(peer, answer, m.answer_offset, &bytes)?;
                    return Ok(Ok(bytes.len() as u64));
                }
                Err(need) => need,
            };
            // A batch of a listing that does not fit: ask again for as many entries
            // as fit on average (fewer each time, so this ends).
            match (&reply, &mut asked) {
                (meta::Reply::Dir { entries, .. }, meta::Request::Readdir { max, .. }) if entries.len() > 1 => {
                    *max = ((entries.len() * room / need) as u32).clamp(1, entries.len() as u32 - 1);
                    reply = match namespace_call(&*self.agent, session_id, asked.clone()) {
                        Ok(r) => r,
                        Err(e) => return Ok(Err(e)),
                    };
                }
                _ => {
                    return Ok(Err(crate::error::Error::invalid(
                        "answer_length",
                        format!("the answer needs {need} bytes; the entry gives {room}"),
                    )));
                }
            }
        }
    }

    /// Read up to `length` bytes of `object` from offset 0 into `region` at `at`,
    /// chunk by chunk (straight into a mapped region, else through staging and puts).
    /// The inner result is the backend's: bytes read (short at end of file) or why not.
    fn read_object_to_host(
        &mut self,
        peer: &Peer,
        region: &HostRegion,
        at: u64,
        length: u64,
        object: &Arc<dyn dpuio_backend::Object>,
    ) -> Result<Result<u64, dpuio_backend::Error>, DataPlaneError> {
        if let Some(m) = &region.mapped {
            return Ok(read_object_mapped(&**object, m, at, length, self.chunk_bytes));
        }
        let mut done = 0u64;
        for c in validate::chunks(0, at, length, self.chunk_bytes as u64) {
            let staging = &mut self.lanes[peer.lane].staging;
            let dst = &mut staging.as_mut_slice()[SCRATCH_BYTES..][..c.length as usize];
            let read = object.read_at(dst, c.file_offset);
            if let Ok(n @ 1..) = read {
                peer.endpoint.put(staging, SCRATCH_BYTES, n, region.addr + c.region_offset, &region.key)?;
                peer.endpoint.flush(FLUSH_TIMEOUT)?;
            }
            match read {
                Ok(n) => {
                    done += n as u64;
                    if (n as u64) < c.length {
                        break; // end of file
                    }
                }
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(Ok(done))
    }

    /// Copy host memory at `offset` of `region` into `out`, in scratch-sized gets
    /// where it is not mapped.
    fn read_host_range(
        &mut self,
        peer: &Peer,
        region: &HostRegion,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), DataPlaneError> {
        for (i, piece) in out.chunks_mut(SCRATCH_BYTES).enumerate() {
            self.read_host(peer, region, offset + (i * SCRATCH_BYTES) as u64, piece)?;
        }
        Ok(())
    }

    /// Write `bytes` into `region` at `offset`: a copy into a mapped region, else
    /// scratch-sized puts, each flushed before the scratch is reused.
    fn write_host(
        &mut self,
        peer: &Peer,
        region: &HostRegion,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), DataPlaneError> {
        if let Some(m) = &region.mapped {
            m.bytes_mut(offset as usize, bytes.len()).copy_from_slice(bytes);
            return Ok(());
        }
        let staging = &mut self.lanes[peer.lane].staging;
        for (i, piece) in bytes.chunks(SCRATCH_BYTES).enumerate() {
            staging.write_at(0, piece);
            let to = region.addr + offset + (i * SCRATCH_BYTES) as u64;
            peer.endpoint.put(staging, 0, piece.len(), to, &region.key)?;
            peer.endpoint.flush(FLUSH_TIMEOUT)?;
        }
        Ok(())
    }

    /// Payload first, then the entry, then its `seq` word: a host that sees the seq
    /// sees everything before it.
    fn post_completion(
        &mut self,
        peer: &Peer,
        ring: &HostRing,
        index: u64,
        c: &Completion,
    ) -> Result<(), DataPlaneError> {
        let at = ring.offset + wire::cqe_offset(ring.entries, index) as u64;
        let bytes = c.encode();
        match &ring.region.mapped {
            Some(m) => {
                m.bytes_mut(at as usize, 24).copy_from_slice(&bytes[..24]);
                m.store_u64_release(at as usize + 24, c.seq);
            }
            None => {
                peer.endpoint.flush(FLUSH_TIMEOUT)?; // payload puts of this request
                peer.endpoint.put_bytes(&bytes[..24], ring.region.addr + at, &ring.region.key)?;
                peer.endpoint.flush(FLUSH_TIMEOUT)?;
                peer.endpoint.put_bytes(&bytes[24..], ring.region.addr + at + 24, &ring.region.key)?;
                peer.endpoint.flush(FLUSH_TIMEOUT)?;
            }
        }
        Ok(())
    }

    fn read_host(
        &mut self,
        peer: &Peer,
        region: &HostRegion,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), DataPlaneError> {
        match &region.mapped {
            Some(m) => m.read_at(offset as usize, out),
            None => {
                let staging = &self.lanes[peer.lane].staging;
                peer.endpoint.get(staging, 0, out.len(), region.addr + offset, &region.key)?;
                peer.endpoint.flush(FLUSH_TIMEOUT)?;
                staging.read_at(0, out);
            }
        }
        Ok(())
    }

    fn load_u64(&mut self, peer: &Peer, region: &HostRegion, offset: u64) -> Result<u64, DataPlaneError> {
        if let Some(m) = &region.mapped {
            return Ok(m.load_u64_acquire(offset as usize));
        }
        let mut b = [0u8; 8];
        self.read_host(peer, region, offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn store_u64(&mut self, peer: &Peer, region: &HostRegion, offset: u64, value: u64) -> Result<(), DataPlaneError> {
        match &region.mapped {
            Some(m) => m.store_u64_release(offset as usize, value),
            None => {
                peer.endpoint.put_bytes(&value.to_le_bytes(), region.addr + offset, &region.key)?;
                peer.endpoint.flush(FLUSH_TIMEOUT)?;
            }
        }
        Ok(())
    }
}

/// Leave a ring alone until its tenant has room: no polling (its host rings the
/// doorbell again), and a wake from the request that makes room.
fn park(ready: &mut Readiness<Arc<HostRing>, Arc<TenantSlot>>, s: &Serving, tenant: &Arc<TenantSlot>) {
    tenant.park();
    if let Some(ring) = ready.park(s.key, tenant.clone()) {
        set_polling(&ring, false);
    }
}

/// A transfer to this host failed: its rings are not served again.
fn fail_peer(metrics: &Metrics, s: &Serving, e: &DataPlaneError) {
    s.peer.failed.store(true, Ordering::Relaxed);
    metrics.failed_peers.inc();
    tracing::warn!(session = format!("{:#018x}", s.session.id), error = %e,
        "data plane to this host failed; its rings are no longer served");
}

fn io_failed(session: &Session, sub: &Submission, e: &dpuio_backend::Error) -> (wire::Status, u64) {
    tracing::warn!(session = format!("{:#018x}", session.id), handle = format!("{:#018x}", sub.handle), error = %e,
        "backend I/O failed");
    match e {
        dpuio_backend::Error::Integrity { .. } => (wire::Status::Integrity, 0),
        _ => (wire::Status::Io, 0),
    }
}

#[cfg(test)]
mod loopback_tests;

#[cfg(test)]
mod tests {
    use super::{library_mismatch, split_bytes};

    #[test]
    fn libfabric_shm_needs_one_version_on_both_sides_and_the_rest_does_not() {
        let refusal = library_mismatch("shm", "libfabric 1.17", "libfabric 1.22").expect("refused");
        assert!(refusal.contains("libfabric 1.17") && refusal.contains("libfabric 1.22"), "{refusal}");
        assert!(refusal.contains("ucx-shm or ofi-tcp"), "{refusal}");
        assert_eq!(library_mismatch("shm", "libfabric 1.22", "libfabric 1.22"), None);
        assert_eq!(library_mismatch("tcp;ofi_rxm", "libfabric 1.17", "libfabric 1.22"), None);
        assert_eq!(library_mismatch("shm", "", "libfabric 1.22"), None, "an older shim that does not say");
    }

    #[test]
    fn a_request_splits_in_as_many_pieces_as_cores_within_the_bounds() {
        const KIB: u64 = 1024;
        const MIB: u64 = 1024 * KIB;
        // Two cores: a 1 MiB read in two halves; one larger than a chunk in the
        // smallest pieces (many such requests are in flight at once).
        assert_eq!(split_bytes(MIB, 2, MIB), 512 * KIB);
        assert_eq!(split_bytes(4 * MIB, 2, MIB), 256 * KIB);
        // Many cores: never smaller than SPLIT_BYTES.
        assert_eq!(split_bytes(MIB, 16, MIB), 256 * KIB);
        // An odd length rounds up to a power of two, so chunk boundaries stay piece boundaries.
        assert_eq!(split_bytes(MIB + 1, 2, 4 * MIB), MIB);
        assert_eq!(split_bytes(3 * MIB, 2, 4 * MIB), 2 * MIB);
        assert_eq!((4 * MIB) % split_bytes(3 * MIB, 3, 4 * MIB), 0);
        // One core, a small chunk, a zero length: bounded, never zero.
        assert_eq!(split_bytes(MIB, 1, MIB), MIB);
        assert_eq!(split_bytes(MIB, 2, 64 * KIB), 64 * KIB);
        assert_eq!(split_bytes(0, 2, MIB), 256 * KIB);
    }
}
