//! The transport abstraction: what the agent and the shim need from a data plane,
//! and no more. UCX ([`crate::ucx`]) is the first implementation; a libfabric one
//! follows with the same shape (`fi_mr_reg`/`fi_mr_key`, `fi_av_insert`,
//! `fi_write`/`fi_read` plus a counter for flush, `fi_send` for doorbells, the
//! wait object of the completion queue for the event fd).
//!
//! Four small traits: [`Transport`] (one context + worker: regions, addresses,
//! endpoints, progress, doorbell receipt), [`Region`] (local memory a peer may access),
//! [`Endpoint`] (one-sided operations towards one peer) and [`RemoteKey`] (permission
//! to access one peer region). Operations are *posted* and complete at
//! [`Endpoint::flush`]: that is the only completion notion the protocol needs ("payload,
//! flush, completion entry").

use std::ops::{Deref, DerefMut};
use std::os::fd::RawFd;
use std::time::Duration;

use crate::doorbell::Doorbell;
use crate::error::{Error, Result};
use crate::memory::{MappedRemote, SharedMemory};

/// One transport instance: a context plus one worker (the unit of progress).
///
/// Thread model: implementations are `Send + Sync` and every method takes `&self`;
/// calls from several threads are serialised inside (see the crate docs).
pub trait Transport: Send + Sync {
    /// Local memory registered with this transport.
    type Region: Region;
    /// A connection to one peer worker.
    type Endpoint: Endpoint<Region = Self::Region>;

    /// Short implementation name for logs ("ucx").
    fn name(&self) -> &'static str;

    /// Allocates `len` bytes *through the transport* so peers can access them
    /// without this process's help where the transport allows it.
    fn alloc_region(&self, len: usize) -> Result<Self::Region>;

    /// This worker's address, to be sent to the peer (over the control plane) so it
    /// can [`Transport::connect`] back.
    fn address(&self) -> Result<Vec<u8>>;

    /// Creates an endpoint to the worker whose address is `peer_address`, returning
    /// once it is usable (or failing with [`Error::Timeout`] if the peer does not
    /// answer on a transport that needs its help to connect).
    fn connect(&self, peer_address: &[u8]) -> Result<Self::Endpoint>;

    /// Makes progress on communication (receives doorbells, completes posted
    /// operations, answers peers on two-sided transports). Returns the number of events
    /// processed; 0 means idle. Never blocks.
    fn progress(&self) -> usize;

    /// A file descriptor that becomes readable when [`Transport::progress`] has work.
    /// Register it with epoll / tokio `AsyncFd`; call [`Transport::arm`] before each
    /// sleep.
    fn event_fd(&self) -> Result<RawFd>;

    /// Prepares the event fd for a sleep. `Ok(true)`: nothing pending, safe to sleep on
    /// the fd. `Ok(false)`: events are pending, call `progress` (until it returns 0)
    /// and arm again.
    fn arm(&self) -> Result<bool>;

    /// Makes the event fd readable from any thread (to stop a sleeping progress loop).
    fn wake(&self) -> Result<()>;

    /// Whether the event fd becomes readable by itself when a peer's doorbell arrives
    /// or a posted operation completes (UCX: always). `false` where the transport has
    /// no such fd (libfabric's shm provider): the fd then only reports
    /// [`Transport::wake`], and a loop waiting for doorbells must sleep in short
    /// slices (or poll its rings) instead of relying on the fd.
    fn wakes_on_receive(&self) -> bool {
        true
    }

    /// Moves doorbells received so far into `out`. Returns how many were dropped
    /// since the last call because the queue was full; if non-zero, scan every ring.
    fn take_doorbells(&self, out: &mut Vec<Doorbell>) -> u64;

    /// Arms and sleeps on the event fd up to `timeout`. Returns `Ok(true)` when woken
    /// (or work was already pending), `Ok(false)` on timeout. Call `progress` after.
    fn wait(&self, timeout: Duration) -> Result<bool>
    where
        Self: Sized,
    {
        wait_any(&[self], timeout)
    }
}

/// Arms every transport and sleeps on all their event fds at once, up to `timeout`:
/// one thread serving several workers (UCX and libfabric) sleeps here. Returns
/// `Ok(true)` when one was woken or had work pending, `Ok(false)` on timeout. Call
/// `progress` on each after.
pub fn wait_any<T: Transport>(transports: &[&T], timeout: Duration) -> Result<bool> {
    wait_any_or(transports, &[], timeout)
}

/// [`wait_any`], also woken when one of `fds` (other descriptors the caller serves:
/// sockets of its own) is readable.
pub fn wait_any_or<T: Transport>(transports: &[&T], fds: &[std::os::fd::RawFd], timeout: Duration) -> Result<bool> {
    let mut polled = Vec::with_capacity(transports.len() + fds.len());
    for t in transports {
        if !t.arm()? {
            return Ok(true);
        }
        polled.push(libc::pollfd { fd: t.event_fd()?, events: libc::POLLIN, revents: 0 });
    }
    polled.extend(fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }));
    let mut fds = polled;
    let timeout_ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: fds is a live Vec of pollfds and nfds is its length.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    match n {
        n if n > 0 => Ok(true),
        0 => Ok(false),
        _ => {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                Ok(true)
            } else {
                Err(Error::Io { op: "poll on the transport event fds", source: err })
            }
        }
    }
}

/// Local memory registered with a transport. Dereferences to [`SharedMemory`] for byte
/// access; [`SharedMemory::addr`] is the address a peer uses. Unregistered (and freed)
/// on drop; keep it alive while any peer may still access it.
pub trait Region: Deref<Target = SharedMemory> + DerefMut + Send + Sync {
    /// The packed remote key a peer needs to access this region
    /// ([`Endpoint::unpack_key`] on its side). Opaque bytes; send with the address and
    /// length over the control plane.
    fn packed_key(&self) -> Result<Vec<u8>>;
}

/// Permission to access one peer region, unpacked on one endpoint.
pub trait RemoteKey: Send + Sync {
    /// First byte of the peer region (as declared when unpacking).
    fn remote_addr(&self) -> u64;

    /// Length of the peer region (as declared when unpacking).
    fn len(&self) -> u64;

    /// True if the declared region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Maps `len` bytes of the peer region starting at `remote_addr` directly into this
    /// process, where the transport allows it (shared memory). `Ok(None)` when it does
    /// not (TCP, RDMA): use put/get then.
    fn map(&self, remote_addr: u64, len: usize) -> Result<Option<MappedRemote>>;
}

/// A peer region's range as declared when its key was unpacked: every access through
/// the key must lie inside it. One check for every provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeclaredRange {
    pub(crate) addr: u64,
    pub(crate) len: u64,
}

impl DeclaredRange {
    /// `[addr, addr + len)`, refused when it wraps the address space.
    pub(crate) fn new(addr: u64, len: u64) -> Result<DeclaredRange> {
        if addr.checked_add(len).is_none() {
            return Err(Error::OutOfRange { what: "address space", offset: addr, len, bound: u64::MAX });
        }
        Ok(DeclaredRange { addr, len })
    }

    /// `Name { remote_addr: 0x…, len: … }`: how every provider's remote key prints.
    pub(crate) fn debug_key(&self, name: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(name).field("remote_addr", &format_args!("{:#x}", self.addr)).field("len", &self.len).finish()
    }

    /// Whether `[addr, addr + len)` lies inside the declared range.
    pub(crate) fn check(&self, addr: u64, len: usize) -> Result<()> {
        let len = len as u64;
        let end = self.addr + self.len; // checked in `new`
        match addr.checked_add(len) {
            Some(stop) if addr >= self.addr && stop <= end => Ok(()),
            _ => Err(Error::OutOfRange {
                what: "remote key's declared range (bound is its end address)",
                offset: addr,
                len,
                bound: end,
            }),
        }
    }
}

/// The address of `len` bytes at `offset` of a local region, checked against its size.
pub(crate) fn local_range(local: &SharedMemory, offset: usize, len: usize) -> Result<*mut u8> {
    match offset.checked_add(len) {
        Some(end) if end <= local.len() => Ok(local.as_ptr().wrapping_add(offset)),
        _ => Err(Error::OutOfRange {
            what: "local region",
            offset: offset as u64,
            len: len as u64,
            bound: local.len() as u64,
        }),
    }
}

/// One-sided operations towards one peer worker.
///
/// `put`/`get`/`put_bytes` only *post*: the data is in place at the target (put) or
/// in the local region (get) once a later [`Endpoint::flush`] returns `Ok`. Operations
/// posted on one endpoint are not ordered among themselves; flush between them where
/// order matters (payload, flush, completion entry). All ranges are checked: remote
/// ones against the key's declared range, local ones against the region.
pub trait Endpoint: Send + Sync {
    /// The local region type of the same transport.
    type Region;
    /// Remote keys unpacked on this endpoint.
    type RemoteKey: RemoteKey;

    /// Unpacks a key the peer sent for its region `[remote_addr, remote_addr + len)`.
    /// The declared range bounds every later access through the key.
    fn unpack_key(&self, packed: &[u8], remote_addr: u64, len: u64) -> Result<Self::RemoteKey>;

    /// Posts a write of `local[local_offset..][..len]` to `remote_addr`.
    fn put(
        &self,
        local: &Self::Region,
        local_offset: usize,
        len: usize,
        remote_addr: u64,
        key: &Self::RemoteKey,
    ) -> Result<()>;

    /// Posts a write of a small buffer (copied first), e.g. a completion entry or a
    /// ring tail. A write of an aligned 8-byte word is not guaranteed to be atomic on
    /// every transport: pair it with a sequence or phase field the reader checks.
    fn put_bytes(&self, data: &[u8], remote_addr: u64, key: &Self::RemoteKey) -> Result<()>;

    /// Posts a read of `len` bytes at `remote_addr` into `local[local_offset..]`.
    fn get(
        &self,
        local: &Self::Region,
        local_offset: usize,
        len: usize,
        remote_addr: u64,
        key: &Self::RemoteKey,
    ) -> Result<()>;

    /// Waits (progressing the worker) until every operation posted on this endpoint
    /// before the call is complete at the target, or `timeout` passes
    /// ([`Error::Timeout`]). Reports the first error of any operation completed since
    /// the previous flush.
    fn flush(&self, timeout: Duration) -> Result<()>;

    /// Sends a doorbell (at most [`crate::MAX_DOORBELL_BYTES`]) to the peer's worker.
    /// Posted like a put; progress or flush completes it.
    fn send_doorbell(&self, bytes: &[u8]) -> Result<()>;

    /// Human-readable description of what the transport chose for this endpoint (for
    /// logs), e.g. `"sysv/memory (am am_bw#0), posix/memory, cma/memory (rma_bw#0)"`.
    fn describe(&self) -> String;
}
