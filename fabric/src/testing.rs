//! A loopback transport: a **test double** of [`Transport`] for tests that run both
//! sides of the data plane in one process. Never for product code: it exists only with
//! this crate's `testing` feature (off by default), which consumers enable for their
//! tests alone (`[dev-dependencies] fabric = { …, features = ["testing"] }`).
//!
//! It gives the agent's ring engine a peer without UCX or libfabric, so its logic is
//! tested in milliseconds by a test that plays the host: the host and the agent are
//! each a [`LoopbackWorker`] of this process, and [`crate::any::Worker::LoopbackForTests`]
//! carries one wherever an `any::Worker` is expected.
//!
//! What it models, and how:
//!
//! * **Regions** are page-aligned, zeroed memory of this process. A packed key names
//!   the worker and region; unpacking it checks the declared range against the real
//!   allocation ([`Error::RemoteRangeUnmapped`] otherwise), as the UCX code checks
//!   `/proc/self/maps`. A key keeps the memory alive, like an attached shared segment.
//! * **Mapped or put/get**: a worker made with [`PeerAccess::Mapped`] lets peers
//!   [`map`](transport::RemoteKey::map) its regions (UCX shared memory: the agent's mapped
//!   path); with [`PeerAccess::PutGet`] `map` returns `None` (TCP, RDMA: the put/get
//!   path).
//! * **Put, get, put_bytes** are bounds-checked copies, *posted*: they land at the
//!   next flush ([`transport::Endpoint::flush`]), in the order posted, so a caller that forgets a
//!   flush reads stale bytes in its test. Bytes are copied with relaxed atomic
//!   accesses between SeqCst fences, so a peer thread polling a ring word with atomics
//!   races with nothing, and a release/acquire pair on a word orders what came before.
//! * **Failures on demand**: [`LoopbackWorker::fail_transfers_after`] lets a number of
//!   further operations towards that worker succeed and fails every later one (post,
//!   flush or doorbell) with [`Error::Io`] until [`LoopbackWorker::heal`]; a flush
//!   that fails discards what it had not delivered. That is a host that vanishes in
//!   the middle of a transfer.
//! * **Doorbells** go straight into the target worker's bounded queue and signal its
//!   event fd (an `eventfd`), as [`LoopbackWorker::wake`] does.
//!
//! What it deliberately does not model: latency, reordering among posted operations,
//! partial delivery within one operation, and anything across processes (addresses
//! are only meaningful in the process that made them).

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::doorbell::{Doorbell, DoorbellQueue, MAX_DOORBELL_BYTES};
use crate::error::{Error, Result};
use crate::memory::{MappedRemote, SharedMemory};
use crate::transport::{self, DeclaredRange, Transport, local_range};

/// `"loopback"`: the provider name of loopback workers (the agent's lanes match on it).
pub const PROVIDER: &str = "loopback";

/// Leading bytes of a loopback worker address and of a packed loopback key.
const ADDRESS_MAGIC: &[u8; 4] = b"lbw1";
const KEY_MAGIC: &[u8; 4] = b"lbk1";
/// Regions are aligned (and their sizes rounded) to this, like the transports' pages.
const PAGE_BYTES: usize = 4096;
/// Doorbells queued per worker before they count as overflowed.
const DOORBELL_QUEUE_LEN: usize = 4096;
/// Operations posted on one endpoint and not yet flushed before `put`/`get` say Busy.
const MAX_PENDING_OPS: usize = 4096;

/// The live loopback workers of this process, by id, for `connect`.
static WORKERS: Mutex<Vec<(u64, Weak<WorkerInner>)>> = Mutex::new(Vec::new());
static NEXT_WORKER_ID: AtomicU64 = AtomicU64::new(1);

/// How peers reach a loopback worker's regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerAccess {
    /// Peers may map them ([`map`](transport::RemoteKey::map) gives `Some`), as over UCX
    /// shared memory.
    Mapped,
    /// Peers only put and get (`map` gives `None`), as over TCP or RDMA.
    PutGet,
}

/// A loopback worker: a test double of a transport worker (see the module docs).
/// Cheap to clone (a handle); `Send + Sync`.
#[derive(Clone)]
pub struct LoopbackWorker {
    inner: Arc<WorkerInner>,
}

struct WorkerInner {
    id: u64,
    access: PeerAccess,
    event_fd: OwnedFd,
    /// Set by `wake` and by doorbells; `arm` reports it (and clears it).
    signalled: AtomicBool,
    doorbells: DoorbellQueue,
    /// This worker's live regions, for unpacking keys.
    regions: Mutex<HashMap<u64, Weak<Allocation>>>,
    next_region_id: AtomicU64,
    /// Operations towards this worker still allowed before every one fails
    /// (`u64::MAX`: no limit). See [`LoopbackWorker::fail_transfers_after`].
    ops_before_failure: AtomicU64,
}

impl Drop for WorkerInner {
    fn drop(&mut self) {
        let mut workers = WORKERS.lock().unwrap_or_else(|p| p.into_inner());
        workers.retain(|(id, _)| *id != self.id);
    }
}

impl WorkerInner {
    fn signal(&self) {
        self.signalled.store(true, Ordering::SeqCst);
        let one = 1u64;
        // SAFETY: event_fd is an open nonblocking eventfd owned by self; `one` is 8
        // readable bytes. EAGAIN (counter saturated) still leaves the fd readable.
        unsafe { libc::write(self.event_fd.as_raw_fd(), ptr::from_ref(&one).cast(), 8) };
    }

    /// Counts one operation towards this worker against the failure switch.
    fn admit(&self, op: &'static str) -> Result<()> {
        let allowed = self.ops_before_failure.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| match left {
            0 => None,
            u64::MAX => Some(u64::MAX),
            n => Some(n - 1),
        });
        allowed.map(|_| ()).map_err(|_| Error::Io {
            op,
            source: std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "loopback test double: transfers to this worker were made to fail",
            ),
        })
    }
}

impl LoopbackWorker {
    /// A new worker in this process whose regions peers reach as `access` says.
    pub fn new(access: PeerAccess) -> Result<LoopbackWorker> {
        // SAFETY: eventfd has no pointer arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::Io { op: "create loopback eventfd", source: std::io::Error::last_os_error() });
        }
        // SAFETY: fd is a new descriptor owned by nobody else.
        let event_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let inner = Arc::new(WorkerInner {
            id: NEXT_WORKER_ID.fetch_add(1, Ordering::Relaxed),
            access,
            event_fd,
            signalled: AtomicBool::new(false),
            doorbells: DoorbellQueue::new(DOORBELL_QUEUE_LEN),
            regions: Mutex::new(HashMap::new()),
            next_region_id: AtomicU64::new(1),
            ops_before_failure: AtomicU64::new(u64::MAX),
        });
        WORKERS.lock().unwrap_or_else(|p| p.into_inner()).push((inner.id, Arc::downgrade(&inner)));
        Ok(LoopbackWorker { inner })
    }

    /// How peers reach this worker's regions.
    pub fn access(&self) -> PeerAccess {
        self.inner.access
    }

    /// Lets `ops` more operations towards this worker succeed (puts, gets, flushes and
    /// doorbells of any peer's endpoint to it), then fails every later one until
    /// [`LoopbackWorker::heal`]. `0` fails the next one.
    pub fn fail_transfers_after(&self, ops: u64) {
        self.inner.ops_before_failure.store(ops.min(u64::MAX - 1), Ordering::SeqCst);
    }

    /// Undoes [`LoopbackWorker::fail_transfers_after`]: operations succeed again.
    pub fn heal(&self) {
        self.inner.ops_before_failure.store(u64::MAX, Ordering::SeqCst);
    }

    /// Doorbells that arrived too long and were dropped.
    pub fn malformed_doorbells(&self) -> u64 {
        self.inner.doorbells.malformed()
    }

    /// What this is, for logs.
    pub fn describe(&self) -> String {
        format!("loopback test double, worker {} ({:?})", self.inner.id, self.inner.access)
    }
}

impl LoopbackWorker {
    /// A region over `alloc` (its first `len` bytes), known to this worker's keys.
    fn region(&self, alloc: Arc<Allocation>, len: usize) -> Result<LoopbackRegion> {
        let id = self.inner.next_region_id.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the allocation is valid for reads and writes of `len` bytes until it
        // drops, and the region holds it (`alloc`) for at least as long as `mem`.
        let mem = unsafe { SharedMemory::new(alloc.ptr.as_ptr(), len) };
        self.inner.regions.lock().unwrap_or_else(|p| p.into_inner()).insert(id, Arc::downgrade(&alloc));
        Ok(LoopbackRegion { mem, alloc, worker: self.inner.clone(), id })
    }

    /// A region over memory the caller mapped, as `any::Worker::register_lent`.
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` must be valid for reads and writes for as long as `keep` lives.
    pub unsafe fn register_lent(
        &self,
        ptr: *mut u8,
        len: usize,
        keep: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<LoopbackRegion> {
        let ptr = NonNull::new(ptr).ok_or_else(|| invalid("register lent memory (loopback)", "a null pointer"))?;
        self.region(Arc::new(Allocation { ptr, len, layout: None, _lent: Some(keep) }), len)
    }
}

impl fmt::Debug for LoopbackWorker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoopbackWorker").field("id", &self.inner.id).field("access", &self.inner.access).finish()
    }
}

impl Transport for LoopbackWorker {
    type Region = LoopbackRegion;
    type Endpoint = LoopbackEndpoint;

    fn name(&self) -> &'static str {
        PROVIDER
    }

    fn alloc_region(&self, len: usize) -> Result<LoopbackRegion> {
        self.region(Allocation::new(len)?, len)
    }

    fn address(&self) -> Result<Vec<u8>> {
        let mut address = ADDRESS_MAGIC.to_vec();
        address.extend_from_slice(&self.inner.id.to_le_bytes());
        Ok(address)
    }

    fn connect(&self, peer_address: &[u8]) -> Result<LoopbackEndpoint> {
        let id = parse(peer_address, ADDRESS_MAGIC, 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .ok_or_else(|| invalid("connect (loopback)", "not a loopback worker address"))?;
        // Upgrade outside the lock: the last reference may drop here, and its Drop locks.
        let weak = {
            let workers = WORKERS.lock().unwrap_or_else(|p| p.into_inner());
            workers.iter().find(|(w, _)| *w == id).map(|(_, weak)| weak.clone())
        };
        let peer = weak
            .and_then(|w| w.upgrade())
            .ok_or_else(|| invalid("connect (loopback)", "no loopback worker with this address in this process"))?;
        Ok(LoopbackEndpoint {
            inner: Arc::new(EndpointInner { own: self.inner.clone(), peer, pending: Mutex::new(Vec::new()) }),
        })
    }

    /// Everything happens when posted or flushed: nothing is left for progress.
    fn progress(&self) -> usize {
        0
    }

    fn event_fd(&self) -> Result<RawFd> {
        Ok(self.inner.event_fd.as_raw_fd())
    }

    fn arm(&self) -> Result<bool> {
        let mut counter = 0u64;
        // SAFETY: event_fd is an open nonblocking eventfd; counter is 8 writable bytes.
        // EAGAIN (nothing to drain) is the normal case.
        unsafe { libc::read(self.inner.event_fd.as_raw_fd(), ptr::from_mut(&mut counter).cast(), 8) };
        // After the drain: a signal that comes later writes the fd again.
        Ok(!self.inner.signalled.swap(false, Ordering::SeqCst))
    }

    fn wake(&self) -> Result<()> {
        self.inner.signal();
        Ok(())
    }

    fn take_doorbells(&self, out: &mut Vec<Doorbell>) -> u64 {
        self.inner.doorbells.take(out)
    }
}

/// Page-aligned, zeroed memory of this process; freed when the last region, key,
/// mapping or posted operation using it is gone.
struct Allocation {
    ptr: NonNull<u8>,
    len: usize,
    /// `None` for memory a caller lent ([`LoopbackWorker::register_lent`]), kept by
    /// `_lent` and not freed here.
    layout: Option<std::alloc::Layout>,
    _lent: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: the allocation is plain memory owned by this value and freed once in Drop;
// every access goes through the atomic copies below or through SharedMemory, whose
// discipline the memory module documents.
unsafe impl Send for Allocation {}
// SAFETY: as above.
unsafe impl Sync for Allocation {}

impl Allocation {
    fn new(len: usize) -> Result<Arc<Allocation>> {
        let too_big = || Error::OutOfRange {
            what: "allowed region size (1 byte to isize::MAX)",
            offset: 0,
            len: len as u64,
            bound: isize::MAX as u64,
        };
        if len == 0 {
            return Err(too_big());
        }
        let rounded = len.checked_next_multiple_of(PAGE_BYTES).ok_or_else(too_big)?;
        let layout = std::alloc::Layout::from_size_align(rounded, PAGE_BYTES).map_err(|_| too_big())?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::Io {
            op: "allocate loopback region",
            source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
        })?;
        Ok(Arc::new(Allocation { ptr, len, layout: Some(layout), _lent: None }))
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Copies `out.len()` bytes at `offset` out, with atomic loads.
    ///
    /// # Panics
    /// If the range is outside the allocation (callers check it first).
    fn load(&self, offset: usize, out: &mut [u8]) {
        assert!(offset.checked_add(out.len()).is_some_and(|end| end <= self.len), "loopback load out of range");
        let base = self.ptr.as_ptr().wrapping_add(offset);
        let mut i = 0;
        while i < out.len() {
            let p = base.wrapping_add(i);
            if (p as usize).is_multiple_of(8) && i + 8 <= out.len() {
                // SAFETY: p..p+8 lies inside the live allocation (checked above) and is
                // 8-aligned; concurrent accesses to these bytes by peers are atomic or
                // ordered by their protocol (module docs).
                let word = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) }.load(Ordering::Relaxed);
                out[i..i + 8].copy_from_slice(&word.to_ne_bytes());
                i += 8;
            } else {
                // SAFETY: p lies inside the live allocation (checked above); as above.
                out[i] = unsafe { AtomicU8::from_ptr(p) }.load(Ordering::Relaxed);
                i += 1;
            }
        }
    }

    /// Copies `data` in at `offset`, with atomic stores.
    ///
    /// # Panics
    /// If the range is outside the allocation (callers check it first).
    fn store(&self, offset: usize, data: &[u8]) {
        assert!(offset.checked_add(data.len()).is_some_and(|end| end <= self.len), "loopback store out of range");
        let base = self.ptr.as_ptr().wrapping_add(offset);
        let mut i = 0;
        while i < data.len() {
            let p = base.wrapping_add(i);
            if (p as usize).is_multiple_of(8) && i + 8 <= data.len() {
                let word = u64::from_ne_bytes(data[i..i + 8].try_into().expect("8 bytes"));
                // SAFETY: as in load.
                unsafe { AtomicU64::from_ptr(p.cast::<u64>()) }.store(word, Ordering::Relaxed);
                i += 8;
            } else {
                // SAFETY: as in load.
                unsafe { AtomicU8::from_ptr(p) }.store(data[i], Ordering::Relaxed);
                i += 1;
            }
        }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: ptr came from alloc_zeroed with this layout and is freed only here.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// Local memory of a [`LoopbackWorker`]. Dereferences to [`SharedMemory`].
pub struct LoopbackRegion {
    mem: SharedMemory,
    alloc: Arc<Allocation>,
    worker: Arc<WorkerInner>,
    id: u64,
}

impl Drop for LoopbackRegion {
    fn drop(&mut self) {
        // New keys can no longer be unpacked; keys already unpacked keep the memory.
        self.worker.regions.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

impl Deref for LoopbackRegion {
    type Target = SharedMemory;
    fn deref(&self) -> &SharedMemory {
        &self.mem
    }
}

impl DerefMut for LoopbackRegion {
    fn deref_mut(&mut self) -> &mut SharedMemory {
        &mut self.mem
    }
}

impl fmt::Debug for LoopbackRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoopbackRegion").field("worker", &self.worker.id).field("mem", &self.mem).finish()
    }
}

impl transport::Region for LoopbackRegion {
    /// `"lbk1"`, the worker id and the region id: no secret, this is a test double.
    fn packed_key(&self) -> Result<Vec<u8>> {
        let mut key = KEY_MAGIC.to_vec();
        key.extend_from_slice(&self.worker.id.to_le_bytes());
        key.extend_from_slice(&self.id.to_le_bytes());
        Ok(key)
    }
}

/// A peer region's key, unpacked on a [`LoopbackEndpoint`].
#[derive(Clone)]
pub struct LoopbackRemoteKey {
    inner: Arc<KeyInner>,
}

struct KeyInner {
    alloc: Arc<Allocation>,
    /// The worker the region belongs to (the endpoint's peer).
    owner: u64,
    mappable: bool,
    range: DeclaredRange,
}

impl KeyInner {
    /// Offset in the allocation of `[addr, addr + len)`, which must lie in the declared range.
    fn offset_of(&self, addr: u64, len: usize) -> Result<usize> {
        self.range.check(addr, len)?;
        Ok((addr - self.alloc.addr()) as usize)
    }
}

impl transport::RemoteKey for LoopbackRemoteKey {
    /// First byte of the peer region (as declared when unpacking).
    fn remote_addr(&self) -> u64 {
        self.inner.range.addr
    }

    /// Length of the peer region (as declared when unpacking).
    fn len(&self) -> u64 {
        self.inner.range.len
    }

    /// The peer's memory as a [`MappedRemote`] if its worker is [`PeerAccess::Mapped`],
    /// `None` otherwise. The range must lie in the declared one.
    fn map(&self, remote_addr: u64, len: usize) -> Result<Option<MappedRemote>> {
        let offset = self.inner.offset_of(remote_addr, len)?;
        if !self.inner.mappable {
            return Ok(None);
        }
        let keep: Arc<dyn Any + Send + Sync> = self.inner.alloc.clone();
        // SAFETY: offset..offset+len lies inside the allocation (offset_of checked it
        // against the declared range, which unpack checked against the allocation);
        // `keep` holds the allocation, so it stays valid as long as the mapping.
        Ok(Some(unsafe {
            MappedRemote::new(self.inner.alloc.ptr.as_ptr().wrapping_add(offset), len, remote_addr, None, keep)
        }))
    }
}

impl fmt::Debug for LoopbackRemoteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.range.debug_key("LoopbackRemoteKey", f)
    }
}

/// An endpoint from one loopback worker to another (or to itself).
#[derive(Clone)]
pub struct LoopbackEndpoint {
    inner: Arc<EndpointInner>,
}

struct EndpointInner {
    own: Arc<WorkerInner>,
    peer: Arc<WorkerInner>,
    /// Posted operations, delivered at the next flush.
    pending: Mutex<Vec<Op>>,
}

/// A posted copy: from an allocation range, or from bytes copied at post time.
struct Op {
    from: Source,
    to: Arc<Allocation>,
    to_offset: usize,
}

enum Source {
    Memory { alloc: Arc<Allocation>, offset: usize, len: usize },
    Bytes(Box<[u8]>),
}

impl Op {
    fn deliver(&self) {
        let data = match &self.from {
            Source::Bytes(b) => b.to_vec(),
            Source::Memory { alloc, offset, len } => {
                let mut buf = vec![0u8; *len];
                alloc.load(*offset, &mut buf);
                buf
            }
        };
        self.to.store(self.to_offset, &data);
    }
}

impl LoopbackEndpoint {
    fn local_offset(&self, local: &LoopbackRegion, offset: usize, len: usize) -> Result<()> {
        if local.worker.id != self.inner.own.id {
            return Err(Error::ForeignRegion);
        }
        local_range(local, offset, len).map(drop)
    }

    fn check_key(&self, key: &LoopbackRemoteKey) -> Result<()> {
        if key.inner.owner == self.inner.peer.id {
            Ok(())
        } else {
            Err(invalid("use remote key (loopback)", "the key was unpacked for another peer"))
        }
    }

    fn post(&self, op: &'static str, posted: Op) -> Result<()> {
        self.inner.peer.admit(op)?;
        let mut pending = self.inner.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.len() >= MAX_PENDING_OPS {
            return Err(Error::Busy { in_flight: pending.len(), max: MAX_PENDING_OPS });
        }
        pending.push(posted);
        Ok(())
    }
}

impl transport::Endpoint for LoopbackEndpoint {
    type Region = LoopbackRegion;
    type RemoteKey = LoopbackRemoteKey;

    fn unpack_key(&self, packed: &[u8], remote_addr: u64, len: u64) -> Result<LoopbackRemoteKey> {
        let body =
            parse(packed, KEY_MAGIC, 16).ok_or_else(|| invalid("unpack key (loopback)", "not a loopback key"))?;
        let owner = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
        let region = u64::from_le_bytes(body[8..].try_into().expect("8 bytes"));
        if owner != self.inner.peer.id {
            return Err(invalid(
                "unpack key (loopback)",
                "the key belongs to another worker than this endpoint's peer",
            ));
        }
        let alloc =
            self.inner.peer.regions.lock().unwrap_or_else(|p| p.into_inner()).get(&region).and_then(Weak::upgrade);
        let alloc = alloc.ok_or_else(|| invalid("unpack key (loopback)", "the peer has no such region (any more)"))?;
        let inside = remote_addr >= alloc.addr()
            && remote_addr.checked_add(len).is_some_and(|end| end <= alloc.addr() + alloc.len as u64);
        if !inside {
            return Err(Error::RemoteRangeUnmapped { addr: remote_addr, len });
        }
        Ok(LoopbackRemoteKey {
            inner: Arc::new(KeyInner {
                alloc,
                owner,
                mappable: self.inner.peer.access == PeerAccess::Mapped,
                // Inside the allocation (checked above), so it does not wrap.
                range: DeclaredRange { addr: remote_addr, len },
            }),
        })
    }

    fn put(
        &self,
        local: &LoopbackRegion,
        local_offset: usize,
        len: usize,
        remote_addr: u64,
        key: &LoopbackRemoteKey,
    ) -> Result<()> {
        self.local_offset(local, local_offset, len)?;
        self.check_key(key)?;
        let to_offset = key.inner.offset_of(remote_addr, len)?;
        let from = Source::Memory { alloc: local.alloc.clone(), offset: local_offset, len };
        self.post("put (loopback)", Op { from, to: key.inner.alloc.clone(), to_offset })
    }

    fn put_bytes(&self, data: &[u8], remote_addr: u64, key: &LoopbackRemoteKey) -> Result<()> {
        self.check_key(key)?;
        let to_offset = key.inner.offset_of(remote_addr, data.len())?;
        self.post(
            "put bytes (loopback)",
            Op { from: Source::Bytes(data.into()), to: key.inner.alloc.clone(), to_offset },
        )
    }

    fn get(
        &self,
        local: &LoopbackRegion,
        local_offset: usize,
        len: usize,
        remote_addr: u64,
        key: &LoopbackRemoteKey,
    ) -> Result<()> {
        self.local_offset(local, local_offset, len)?;
        self.check_key(key)?;
        let offset = key.inner.offset_of(remote_addr, len)?;
        let from = Source::Memory { alloc: key.inner.alloc.clone(), offset, len };
        self.post("get (loopback)", Op { from, to: local.alloc.clone(), to_offset: local_offset })
    }

    /// Delivers everything posted, in order, at once (the timeout is never needed).
    fn flush(&self, _timeout: Duration) -> Result<()> {
        let ops = std::mem::take(&mut *self.inner.pending.lock().unwrap_or_else(|p| p.into_inner()));
        // A failing flush delivers nothing of what it had: the ops are dropped here.
        self.inner.peer.admit("flush (loopback)")?;
        for op in &ops {
            // Pairs a peer's release store of a ring word with our reading after it,
            // and our writes before a completion word with its acquire load of it.
            fence(Ordering::SeqCst);
            op.deliver();
            fence(Ordering::SeqCst);
        }
        Ok(())
    }

    fn send_doorbell(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_DOORBELL_BYTES {
            return Err(Error::DoorbellTooLong { len: bytes.len(), max: MAX_DOORBELL_BYTES });
        }
        self.inner.peer.admit("send doorbell (loopback)")?;
        self.inner.peer.doorbells.push(bytes);
        self.inner.peer.signal();
        Ok(())
    }

    fn describe(&self) -> String {
        format!("loopback test double, worker {} to worker {}", self.inner.own.id, self.inner.peer.id)
    }
}

impl fmt::Debug for LoopbackEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoopbackEndpoint").field("own", &self.inner.own.id).field("peer", &self.inner.peer.id).finish()
    }
}

/// The `len` bytes after `magic`, if `bytes` is exactly that.
fn parse<'a>(bytes: &'a [u8], magic: &[u8; 4], len: usize) -> Option<&'a [u8]> {
    let body = bytes.strip_prefix(magic.as_slice())?;
    (body.len() == len).then_some(body)
}

fn invalid(op: &'static str, why: &'static str) -> Error {
    Error::Io { op, source: std::io::Error::new(std::io::ErrorKind::InvalidInput, why) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Endpoint as _, Region as _, RemoteKey as _};

    const T: Duration = Duration::from_secs(1);

    fn pair(access: PeerAccess) -> (LoopbackWorker, LoopbackWorker, LoopbackEndpoint) {
        let host = LoopbackWorker::new(access).unwrap();
        let agent = LoopbackWorker::new(PeerAccess::PutGet).unwrap();
        let ep = agent.connect(&host.address().unwrap()).unwrap();
        (host, agent, ep)
    }

    #[test]
    fn put_get_land_at_flush_and_are_bounds_checked() {
        let (host, agent, ep) = pair(PeerAccess::PutGet);
        let target = host.alloc_region(10_000).unwrap();
        assert_eq!(target.addr() % PAGE_BYTES as u64, 0, "page-aligned");
        let key = ep.unpack_key(&target.packed_key().unwrap(), target.addr() + 8, 1000).unwrap();
        assert!(key.map(target.addr() + 8, 8).unwrap().is_none(), "PutGet workers do not map");
        let mut staging = agent.alloc_region(4096).unwrap();
        staging.write_at(0, b"payload!");
        ep.put(&staging, 0, 8, target.addr() + 9, &key).unwrap();
        ep.put_bytes(b"seq", target.addr() + 100, &key).unwrap();
        assert_eq!(target.bytes(9, 8).to_vec(), [0; 8], "posted, not yet delivered");
        ep.flush(T).unwrap();
        assert_eq!(target.bytes(9, 8).to_vec(), b"payload!");
        assert_eq!(target.bytes(100, 3).to_vec(), b"seq");
        ep.get(&staging, 100, 3, target.addr() + 100, &key).unwrap();
        ep.flush(T).unwrap();
        assert_eq!(staging.bytes(100, 3).to_vec(), b"seq");

        let outside = ep.put_bytes(b"x", target.addr() + 1008, &key).unwrap_err();
        assert!(matches!(outside, Error::OutOfRange { .. }), "{outside}");
        let before = ep.get(&staging, 0, 8, target.addr() + 7, &key).unwrap_err();
        assert!(matches!(before, Error::OutOfRange { .. }), "{before}");
        let local = ep.put(&staging, 4090, 8, target.addr() + 8, &key).unwrap_err();
        assert!(matches!(local, Error::OutOfRange { .. }), "{local}");
        let foreign = ep.put(&target, 0, 8, target.addr() + 8, &key).unwrap_err();
        assert!(matches!(foreign, Error::ForeignRegion), "{foreign}");
        let overlong = ep.unpack_key(&target.packed_key().unwrap(), target.addr(), 10_001).unwrap_err();
        assert!(matches!(overlong, Error::RemoteRangeUnmapped { .. }), "{overlong}");
        assert!(ep.unpack_key(b"lbk1junk", target.addr(), 8).is_err());
    }

    #[test]
    fn mapped_workers_map_their_regions() {
        let (host, _agent, ep) = pair(PeerAccess::Mapped);
        let target = host.alloc_region(4096).unwrap();
        let key = ep.unpack_key(&target.packed_key().unwrap(), target.addr(), 4096).unwrap();
        let mapped = key.map(target.addr() + 64, 64).unwrap().expect("Mapped workers map");
        mapped.store_u64_release(8, 42);
        assert_eq!(target.load_u64_acquire(72), 42);
        assert!(key.map(target.addr() + 4090, 8).is_err(), "beyond the declared range");
        drop(target);
        assert_eq!(mapped.load_u64_acquire(8), 42, "the key keeps the memory");
    }

    #[test]
    fn failures_on_demand_then_heal() {
        let (host, agent, ep) = pair(PeerAccess::PutGet);
        let target = host.alloc_region(4096).unwrap();
        let key = ep.unpack_key(&target.packed_key().unwrap(), target.addr(), 4096).unwrap();
        let staging = agent.alloc_region(4096).unwrap();
        host.fail_transfers_after(1);
        ep.put_bytes(b"lost", target.addr(), &key).unwrap();
        assert!(ep.flush(T).is_err(), "the second operation fails");
        assert!(ep.get(&staging, 0, 8, target.addr(), &key).is_err(), "and every one after it");
        host.heal();
        ep.flush(T).unwrap();
        assert_eq!(target.bytes(0, 4).to_vec(), [0; 4], "a failed flush delivered nothing");
    }

    #[test]
    fn doorbells_wake_the_event_fd() {
        let (host, agent, _) = pair(PeerAccess::PutGet);
        let to_agent = host.connect(&agent.address().unwrap()).unwrap();
        assert!(agent.arm().unwrap(), "nothing pending");
        assert!(!agent.wait(Duration::from_millis(1)).unwrap(), "times out");
        to_agent.send_doorbell(b"ring 7").unwrap();
        assert!(agent.wait(Duration::from_secs(5)).unwrap());
        let mut bells = Vec::new();
        assert_eq!(agent.take_doorbells(&mut bells), 0);
        assert_eq!(bells.len(), 1);
        assert_eq!(bells[0].as_bytes(), b"ring 7");
        agent.wake().unwrap();
        assert!(agent.wait(Duration::from_secs(5)).unwrap(), "wake");
        assert!(to_agent.send_doorbell(&[0; MAX_DOORBELL_BYTES + 1]).is_err());
        assert!(agent.connect(b"lbw1\0\0\0\0\0\0\0\0").is_err(), "no worker 0");
    }
}
