//! Endpoints (a peer's address in the address vector), remote keys, posted
//! operations.

use std::fmt;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use libfabric_sys as sys;

use super::region::KEY_MAGIC;
use super::shared::{Hold, OpState, WorkerShared};
use super::{Completion, Region, ofi_error};
use crate::doorbell::MAX_DOORBELL_BYTES;
use crate::error::{Error, Result};
use crate::memory::MappedRemote;
use crate::transport::{self, DeclaredRange, Endpoint as _, local_range};

/// One peer: its `fi_addr_t` in the worker's address vector, used with the worker's
/// one RDM endpoint. `Send + Sync`, cheap to clone. The address-vector entry stays
/// for the worker's lifetime (the connection rxm made for it closes with the worker).
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<EndpointInner>,
}

struct EndpointInner {
    worker: Arc<WorkerShared>,
    addr: sys::fi_addr_t,
    state: Arc<OpState>,
}

impl Endpoint {
    pub(crate) fn new(worker: Arc<WorkerShared>, addr: sys::fi_addr_t) -> Endpoint {
        Endpoint { inner: Arc::new(EndpointInner { worker, addr, state: OpState::new() }) }
    }

    fn probe(&self, key: &RemoteKey) -> Result<()> {
        let (hold, dst, desc) = self.inner.worker.hold_bytes(&[0u8])?;
        let dst = dst.cast_mut();
        self.post_rma("probe remote key (fi_readmsg)", hold, dst, 1, desc, key.inner.range.addr, key, false)?;
        let timeout = Duration::from_millis(self.inner.worker.config.connect_timeout_ms);
        self.flush(timeout).map_err(|err| match err {
            Error::Timeout { timeout_ms, .. } => {
                Error::Timeout { op: "probe remote key (is the peer progressing?)", timeout_ms }
            }
            other => other,
        })
    }

    #[allow(clippy::too_many_arguments)] // one private helper for both directions
    fn post_rma(
        &self,
        op: &'static str,
        hold: Hold,
        local: *mut u8,
        len: usize,
        desc: *mut std::ffi::c_void,
        remote_addr: u64,
        key: &RemoteKey,
        write: bool,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let worker = &self.inner.worker;
        let iov = sys::iovec { iov_base: local.cast(), iov_len: len };
        let rma =
            sys::fi_rma_iov { addr: worker.target_addr(key.inner.range.addr, remote_addr), len, key: key.inner.key };
        let mut desc = desc;
        let mut flags = u64::from(sys::FI_COMPLETION);
        if write && worker.completion() == Completion::Delivery {
            flags |= u64::from(sys::FI_DELIVERY_COMPLETE);
        }
        let ep = worker.ep;
        let peer = self.inner.addr;
        let desc_ptr: *mut *mut std::ffi::c_void =
            if worker.mr_local() { ptr::from_mut(&mut desc) } else { ptr::null_mut() };
        worker.post(op, &self.inner.state, hold, |context| {
            let msg = sys::fi_msg_rma {
                msg_iov: &iov,
                desc: desc_ptr,
                iov_count: 1,
                addr: peer,
                rma_iov: &rma,
                rma_iov_count: 1,
                context,
                data: 0,
            };
            // SAFETY: called by Worker::post with the domain lock held; ep open; msg,
            // iov, rma and desc live for the call (the provider copies the
            // descriptors); the local bytes stay valid until the completion entry,
            // because the Hold recorded under `context` keeps them (a region or
            // copied bytes); the remote range was checked against the key's declared
            // range.
            unsafe { if write { sys::fi_writemsg(ep, &msg, flags) } else { sys::fi_readmsg(ep, &msg, flags) } }
        })
    }

    /// Operations posted on this endpoint and not yet completed.
    fn in_flight(&self) -> usize {
        self.inner.state.in_flight.load(Ordering::Acquire)
    }

    fn local_range(&self, local: &Region, offset: usize, len: usize) -> Result<*mut u8> {
        if !Arc::ptr_eq(local.inner.domain(), &self.inner.worker.domain) {
            return Err(Error::ForeignRegion);
        }
        local_range(local, offset, len)
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint").field("in_flight", &self.in_flight()).finish_non_exhaustive()
    }
}

/// A peer region's remote key (the 64-bit `fi_mr_key`) with the range the peer
/// declared for it. Plain data: nothing to release.
#[derive(Clone)]
pub struct RemoteKey {
    inner: Arc<RkeyInner>,
}

struct RkeyInner {
    key: u64,
    range: DeclaredRange,
}

impl fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.range.debug_key("RemoteKey", f)
    }
}

impl transport::RemoteKey for RemoteKey {
    /// Always `Ok(None)` after checking the range: libfabric offers no portable
    /// mapping of a peer's memory (shm's CMA path copies with `process_vm_writev`);
    /// use put/get.
    fn map(&self, remote_addr: u64, len: usize) -> Result<Option<MappedRemote>> {
        self.inner.range.check(remote_addr, len)?;
        Ok(None)
    }

    fn remote_addr(&self) -> u64 {
        self.inner.range.addr
    }

    fn len(&self) -> u64 {
        self.inner.range.len
    }
}

impl transport::Endpoint for Endpoint {
    type Region = Region;
    type RemoteKey = RemoteKey;

    /// Unpacks a key the peer packed for its region `[remote_addr, remote_addr+len)`.
    /// The declared range bounds every later access through the key (libfabric
    /// checks the registration's bounds too on tcp and verbs; shm's CMA path does
    /// not check keys).
    ///
    /// Then probes the key with a one-byte read and a flush, waiting at most
    /// `OfiConfig::connect_timeout_ms`: a bad key fails here, and over rxm this makes
    /// the connection (the peer must progress). On shm the peer need not run if it
    /// spoke to us first (see the module docs); otherwise the probe fails with
    /// [`Error::Again`] until it has progressed once.
    fn unpack_key(&self, packed: &[u8], remote_addr: u64, len: u64) -> Result<RemoteKey> {
        let range = DeclaredRange::new(remote_addr, len)?;
        let key = match packed.strip_prefix(KEY_MAGIC.as_slice()).map(<[u8; 8]>::try_from) {
            Some(Ok(k)) => u64::from_le_bytes(k),
            _ => return Err(Error::Config("not a packed libfabric key (\"ofi1\" + 8 bytes)".into())),
        };
        let key = RemoteKey { inner: Arc::new(RkeyInner { key, range }) };
        if len > 0 {
            self.probe(&key)?;
        }
        Ok(key)
    }

    /// Posts a write of `local[local_offset..][..len]` to `remote_addr`
    /// (`fi_writemsg`, one iov each side). In place at the target at the next
    /// successful [`Endpoint::flush`].
    fn put(&self, local: &Region, local_offset: usize, len: usize, remote_addr: u64, key: &RemoteKey) -> Result<()> {
        let src = self.local_range(local, local_offset, len)?;
        key.inner.range.check(remote_addr, len)?;
        let hold = Hold::Region { _region: local.inner.clone() };
        self.post_rma("post write (fi_writemsg)", hold, src, len, local.inner.desc(), remote_addr, key, true)
    }

    /// Posts a write of a copy of `data` (completion entries, ring tails).
    fn put_bytes(&self, data: &[u8], remote_addr: u64, key: &RemoteKey) -> Result<()> {
        key.inner.range.check(remote_addr, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let (hold, src, desc) = self.inner.worker.hold_bytes(data)?;
        self.post_rma(
            "post write of bytes (fi_writemsg)",
            hold,
            src.cast_mut(),
            data.len(),
            desc,
            remote_addr,
            key,
            true,
        )
    }

    /// Posts a read of `len` bytes at `remote_addr` into `local[local_offset..]`
    /// (`fi_readmsg`). In place at the next successful [`Endpoint::flush`].
    fn get(&self, local: &Region, local_offset: usize, len: usize, remote_addr: u64, key: &RemoteKey) -> Result<()> {
        let dst = self.local_range(local, local_offset, len)?;
        key.inner.range.check(remote_addr, len)?;
        let hold = Hold::Region { _region: local.inner.clone() };
        self.post_rma("post read (fi_readmsg)", hold, dst, len, local.inner.desc(), remote_addr, key, false)
    }

    /// Waits, reading the completion queue, until every operation posted on this
    /// endpoint has its completion entry, or `timeout` passes ([`Error::Timeout`]).
    /// Then reports the first failure since the previous flush.
    ///
    /// Completion semantics per provider are in the module docs of [`crate::ofi`]:
    /// after `Ok`, written bytes are at the target on shm (CMA) and, with
    /// `FI_DELIVERY_COMPLETE`, on tcp and verbs. A CPU fence follows, so a later put
    /// is ordered after everything flushed.
    fn flush(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut idle_rounds = 0u32;
        while self.inner.state.in_flight.load(Ordering::Acquire) > 0 {
            if self.inner.worker.progress() == 0 {
                idle_rounds += 1;
            } else {
                idle_rounds = 0;
            }
            if self.inner.state.in_flight.load(Ordering::Acquire) == 0 {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    op: "flush endpoint (fi_cq_read)",
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                });
            }
            // A peer that is not progressing (tcp) would otherwise cost a whole core.
            if idle_rounds > 1000 {
                std::thread::sleep(Duration::from_micros(50));
            } else if idle_rounds > 100 {
                std::thread::yield_now();
            }
        }
        fence(Ordering::SeqCst);
        match self.inner.state.first_error.swap(0, Ordering::AcqRel) {
            0 => Ok(()),
            code => Err(ofi_error("an operation posted before this flush failed", -i64::from(code))),
        }
    }

    /// Sends a doorbell of at most [`MAX_DOORBELL_BYTES`] (`fi_send` into one of the
    /// receive buffers the peer keeps posted). Completes with progress or flush.
    fn send_doorbell(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_DOORBELL_BYTES {
            return Err(Error::DoorbellTooLong { len: bytes.len(), max: MAX_DOORBELL_BYTES });
        }
        let worker = &self.inner.worker;
        let (hold, src, desc) = worker.hold_bytes(bytes)?;
        let (ep, peer, len) = (worker.ep, self.inner.addr, bytes.len());
        worker.post("send doorbell (fi_send)", &self.inner.state, hold, |context| {
            // SAFETY: domain lock held by Worker::post; ep open; src..src+len lives in
            // the Hold recorded under `context` until the completion entry.
            unsafe { sys::fi_send(ep, src.cast_mut().cast(), len, desc, peer, context) }
        })
    }

    /// The provider and domain chosen, for logs.
    fn describe(&self) -> String {
        self.inner.worker.describe.clone()
    }
}
