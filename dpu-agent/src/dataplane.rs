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
//!   Several requests' payload is in flight at once: each takes the next of the lane's
//!   `STAGING_PAIRS` pairs of staging halves (flushed only when it comes round again),
//!   a batch's submissions are fetched with one get, its two indices with another, and
//!   its completions are posted in groups (one flush for the group's payload, the
//!   entries, one flush, the `seq` words). Over TCP each flush is a round trip through
//!   the host's progress thread; per 1 MiB request there were four, now about one.
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
//! The decisions live in rooms without I/O, unit-tested with no transport: the ring
//! protocol of one ring ([`protocol`]: the host's indices, entries, the session's
//! rights, the tenant's room and how runs ended in; fetch, run, queue, hand-off,
//! complete (and how to count it) and finish actions out; and [`protocol::Staged`], the
//! put/get steps of a request over the staging region), where a request runs and in how
//! many pieces, and whether a round's rings run their entries at once or through the
//! scheduler (`policy`), which rings the engine looks at when, and whether it spins or
//! sleeps ([`readiness`]), and how a metadata entry's answer is laid out ([`meta`]).
//! The rooms that perform them, from the bottom up:
//!
//! - `host_memory`: a host's endpoint, regions and rings, and every load, store, put
//!   and get into them, at the offsets the wire format names;
//! - [`sessions`]: what each session registered (handles, peer, regions, rings), and
//!   what the engine needs of the agent ([`sessions::AgentView`]);
//! - `registry`: the workers, and registering a host's endpoint, regions and rings;
//! - `io`: the I/O threads, which run mapped requests' pieces and open-reads and post
//!   their completions themselves;
//! - `execute`: requests the engine runs itself (mapped, staged, metadata);
//! - `driver`: the engine thread, which reads doorbells, ring indices and entries,
//!   performs what the cores answer and waits on the transport;
//! - this file: the data plane's life (open, start, shut down).
//!
//! Thread model: one engine thread owns the staging region and does all ring work;
//! `[data_plane] io_threads` I/O threads run the backend I/O of mapped requests, each on
//! its backend's [`IoQueue`] (over DAOS an event queue keeping up to 32 pieces in flight);
//! gRPC handlers register peers, regions and rings (UCX serialises the worker inside
//! [`fabric`]). Nothing the host writes is trusted: a ring whose indices make no sense
//! is stopped, an entry that fails a check gets an error completion, and a peer that
//! fails a transfer has its data plane closed, never the agent's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fabric::Transport;
use fabric::any;

use crate::config::{Lane, QosConfig};
use crate::qos::Scheduler;
use crate::runtime::lock;
use driver::{Engine, EngineLane, Queued};
use host_memory::{LentRegions, StagingPairs};
use io::{IO_QUEUE, Job};
use registry::Worker;
use sessions::Agent;
use staged::StagedIo;

mod driver;
mod execute;
mod host_memory;
mod io;
pub mod meta;
mod policy;
pub mod protocol;
pub mod readiness;
mod registry;
pub mod sessions;
mod staged;
mod to_worker;

pub use host_memory::{HostRegion, HostRing, Peer};
pub use registry::{DataPlaneError, library, library_mismatch};

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
            let staging = w.worker.alloc_region(StagingPairs::region_bytes(chunk_bytes))?;
            let lent = LentRegions::new(w.worker.clone());
            let pairs = StagingPairs::new();
            lanes.push(EngineLane { worker: w.worker.clone(), staging, lent, pairs, peers: w.peers.clone() });
        }
        let (jobs, queue) = crossbeam_channel::bounded::<Job>(IO_QUEUE);
        let metrics = agent.metrics().clone();
        let backend_times = metrics.backend_times();
        let (mut io_overlaps, mut io_deadline) = (false, None);
        for i in 0..io_threads.max(1) {
            let queue = queue.clone();
            let times = backend_times.clone();
            let io = agent
                .io_queue()
                .map_err(|e| DataPlaneError::Invalid(format!("cannot make the I/O queue of an I/O thread: {e}")))?;
            io_overlaps = io.depth() > 1;
            io_deadline = io.deadline();
            let thread = std::thread::Builder::new()
                .name(format!("dpuio-io-{i}"))
                .spawn(move || io::io_worker(queue, io, &times))
                .map_err(|e| DataPlaneError::Invalid(format!("cannot start an I/O thread: {e}")))?;
            self.io_threads.lock().unwrap_or_else(|p| p.into_inner()).push(thread);
        }
        let workers: Vec<_> = lanes.iter().map(|l| l.worker.clone()).collect();
        let staged = StagedIo::new(&workers, jobs.clone(), chunk_bytes, backend_times.clone(), io_deadline);
        let mut engine = Engine {
            agent,
            lanes,
            chunk_bytes,
            stop: self.stop.clone(),
            jobs,
            staged,
            io_overlaps,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u64).min(io_threads as u64 + 1),
            qos: self.qos.clone(),
            idle_poll,
            metrics,
            backend_times,
            neighbours: Default::default(),
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
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod loopback_tests;
