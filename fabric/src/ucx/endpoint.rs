//! Endpoints, remote keys, and posted operations.

use std::any::Any;
use std::ffi::c_void;
use std::fmt;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering, fence};
use std::time::Duration;

use ucx_sys as sys;

use super::api;

use super::region::RegionInner;
use super::shared::{DOORBELL_AM_ID, Graveyard, WorkerShared};
use super::{Region, capture_stream};
use crate::doorbell::MAX_DOORBELL_BYTES;
use crate::error::{Error, Result, check};
use crate::memory::{MappedRemote, SharedMapping, shared_mapping_of};
use crate::transport::{self, DeclaredRange, Endpoint as _, local_range};

/// A connection from this worker to one peer worker (`ucp_ep_h`). `Send + Sync`; all
/// methods take `&self`. Dropping the last reference (remote keys and posted
/// operations hold one too) closes it gracefully, waiting at most
/// `FabricConfig::close_timeout_ms`. Cheap to clone (a reference).
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<EndpointInner>,
}

pub(crate) struct EndpointInner {
    worker: Arc<WorkerShared>,
    handle: sys::ucp_ep_h,
    state: Arc<OpState>,
}

/// Bookkeeping shared with completion callbacks.
struct OpState {
    in_flight: AtomicUsize,
    /// First failure status of an operation since the last flush (0 = none).
    first_error: AtomicI32,
}

// SAFETY: the endpoint's worker runs in UCS_THREAD_MODE_MULTI, so UCX serialises every
// call on the handle; Rust-side state is atomic.
unsafe impl Send for EndpointInner {}
// SAFETY: as above.
unsafe impl Sync for EndpointInner {}

impl Drop for EndpointInner {
    fn drop(&mut self) {
        // Flush mode (not FORCE: that requires UCP_ERR_HANDLING_MODE_PEER everywhere).
        let param = sys::ucp_request_param_t::default();
        // SAFETY: the handle is live and closed exactly once; param asks for nothing.
        let request = unsafe { api().ucp_ep_close_nbx(self.handle, &param) };
        if sys::UCS_PTR_IS_PTR(request) {
            let timeout = Duration::from_millis(self.worker.context().config().close_timeout_ms);
            // A peer that does not answer only costs the timeout; UCX then finishes
            // (or fails) the close on its own.
            let _ = self.worker.wait_request(request, timeout, "close endpoint");
        }
    }
}

/// What a posted operation keeps alive until UCX is done with it.
struct Hold {
    _region: Option<Arc<RegionInner>>,
    _key: Option<Arc<RkeyInner>>,
    _bytes: Option<Box<[u8]>>,
}

/// The `user_data` of a posted operation's completion callback.
struct Pending {
    state: Arc<OpState>,
    graveyard: Arc<Graveyard>,
    hold: Hold,
}

/// `ucp_send_nbx_callback_t` of every posted operation.
unsafe extern "C" fn op_completed(request: *mut c_void, status: sys::ucs_status_t, user_data: *mut c_void) {
    // SAFETY: user_data is the Box<Pending> leaked by Endpoint::post for this request;
    // UCX calls this callback exactly once per request, so the Box is reclaimed once.
    let pending = unsafe { Box::from_raw(user_data.cast::<Pending>()) };
    if status != sys::UCS_OK {
        let _ = pending.state.first_error.compare_exchange(0, i32::from(status), Ordering::AcqRel, Ordering::Acquire);
    }
    pending.state.in_flight.fetch_sub(1, Ordering::AcqRel);
    // SAFETY: the request is complete and owned by us (we never freed it elsewhere).
    unsafe { api().ucp_request_free(request) };
    let Pending { graveyard, hold, .. } = *pending;
    // Dropping `hold` here could unmap a region or close an endpoint from inside UCX
    // progress; leave it for Worker::progress to drop after UCX returns.
    graveyard.lock().unwrap_or_else(|p| p.into_inner()).push(Box::new(hold));
}

impl Endpoint {
    pub(crate) fn create(worker: Arc<WorkerShared>, peer_address: &[u8]) -> Result<Endpoint> {
        if peer_address.is_empty() {
            return Err(Error::Config("empty peer worker address".into()));
        }
        let params = sys::ucp_ep_params_t {
            field_mask: u64::from(sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE),
            address: peer_address.as_ptr().cast(),
            err_mode: sys::UCP_ERR_HANDLING_MODE_NONE,
            ..Default::default()
        };
        let mut handle: sys::ucp_ep_h = ptr::null_mut();
        // SAFETY: worker live; params initialised with a matching mask; the address
        // bytes live for the call (UCX copies what it needs); handle writable.
        let status = unsafe { api().ucp_ep_create(worker.handle(), &params, &mut handle) };
        check("create endpoint (ucp_ep_create)", status)?;
        Ok(Endpoint {
            inner: Arc::new(EndpointInner {
                worker,
                handle,
                state: Arc::new(OpState { in_flight: AtomicUsize::new(0), first_error: AtomicI32::new(0) }),
            }),
        })
    }

    /// Reads the first byte of the key's range and flushes: a bad key fails here
    /// rather than at the first data transfer, and over TCP the round trip guarantees
    /// the peer has finished its side of the connection handshake before any bulk
    /// data is sent (UCX 1.13 crashes a TCP target that stalls with a bulk put
    /// arriving during its handshake; see the crate docs).
    fn probe(&self, key: &RemoteKey) -> Result<()> {
        let buf: Box<[u8]> = Box::new([0u8]);
        let dst = buf.as_ptr().cast_mut();
        let hold = Hold { _region: None, _key: Some(key.inner.clone()), _bytes: Some(buf) };
        let (rkey, addr) = (key.inner.handle, key.inner.range.addr);
        self.post("probe remote key (ucp_get_nbx)", hold, None, |param| {
            // SAFETY: endpoint and rkey live; dst is one writable byte in a heap
            // buffer the Hold owns until the operation completes.
            unsafe { api().ucp_get_nbx(self.inner.handle, dst.cast(), 1, addr, rkey, param) }
        })?;
        let timeout = Duration::from_millis(self.inner.worker.context().config().connect_timeout_ms);
        self.flush(timeout).map_err(|err| match err {
            Error::Timeout { timeout_ms, .. } => {
                Error::Timeout { op: "probe remote key (is the peer progressing?)", timeout_ms }
            }
            other => other,
        })
    }

    /// The raw `ucp_ep_print_info` text (lanes, transports, thresholds).
    fn print_info(&self) -> String {
        capture_stream(|stream| {
            // SAFETY: endpoint live; stream valid for the call.
            unsafe { api().ucp_ep_print_info(self.inner.handle, stream) }
        })
    }

    /// Posted operations not yet completed by UCX.
    fn in_flight(&self) -> usize {
        self.inner.state.in_flight.load(Ordering::Acquire)
    }

    fn local_range(&self, local: &Region, offset: usize, len: usize) -> Result<*mut u8> {
        if !Arc::ptr_eq(local.inner().context(), self.inner.worker.context().inner()) {
            return Err(Error::ForeignRegion);
        }
        local_range(local, offset, len)
    }

    /// Posts one operation with a completion callback that releases `hold`.
    fn post(
        &self,
        op: &'static str,
        hold: Hold,
        memh: Option<sys::ucp_mem_h>,
        call: impl FnOnce(*const sys::ucp_request_param_t) -> sys::ucs_status_ptr_t,
    ) -> Result<()> {
        let state = &self.inner.state;
        let max = self.inner.worker.context().config().max_in_flight_ops;
        let in_flight = state.in_flight.fetch_add(1, Ordering::AcqRel);
        if in_flight >= max {
            state.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::Busy { in_flight, max });
        }
        let pending = Box::into_raw(Box::new(Pending {
            state: state.clone(),
            graveyard: self.inner.worker.graveyard().clone(),
            hold,
        }));
        let mut param = sys::ucp_request_param_t {
            op_attr_mask: sys::UCP_OP_ATTR_FIELD_CALLBACK | sys::UCP_OP_ATTR_FIELD_USER_DATA,
            user_data: pending.cast(),
            ..Default::default()
        };
        param.cb.send = Some(op_completed);
        if let Some(memh) = memh {
            param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_MEMH;
            param.memh = memh;
        }
        let request = call(&param);
        if sys::UCS_PTR_IS_PTR(request) {
            // The callback owns `pending` now, and may already have run on another
            // thread: touch neither.
            return Ok(());
        }
        // Completed in place or failed: UCX will not call the callback.
        state.in_flight.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: `pending` came from Box::into_raw above and no callback will see it.
        drop(unsafe { Box::from_raw(pending) });
        check(op, sys::UCS_PTR_STATUS(request))
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint").field("in_flight", &self.in_flight()).finish_non_exhaustive()
    }
}

/// Turns `ucp_ep_print_info` output into one line listing the lanes and the roles
/// UCX gave them. UCX 1.13 prints one line per lane like
/// `lane[2]:  3:cma/memory.0 md[3]  -> md[3]/cma/sysdev[255] rma_bw#0`; roles are
/// `am`, `am_bw#i` (bulk active messages), `rma_bw#i` (rendezvous), `amo`, `wireup`.
/// RMA to a remote key uses the lanes whose memory domain can reach the key's
/// memory, which UCX does not label here (with the shm preset that is the sysv or
/// posix lane, because regions are allocated from those memory domains).
fn summarize_lanes(info: &str) -> Option<String> {
    let mut lanes: Vec<String> = Vec::new();
    for line in info.lines() {
        let line = line.trim_start_matches('#').trim();
        let Some(rest) = line.strip_prefix("lane[") else {
            continue;
        };
        let (_, rest) = rest.split_once(':')?;
        let resource = rest.split_whitespace().next()?; // "3:cma/memory.0"
        let tl = resource.split_once(':').map_or(resource, |(_, r)| r);
        let tl = tl.rsplit_once('.').map_or(tl, |(name, _)| name);
        // After "-> md[3]/cma/sysdev[255]" come the roles.
        let roles: Vec<&str> = rest.split_once("->").map_or("", |(_, r)| r).split_whitespace().skip(1).collect();
        if roles.is_empty() {
            lanes.push(tl.to_owned());
        } else {
            lanes.push(format!("{tl} ({})", roles.join(" ")));
        }
    }
    if lanes.is_empty() { None } else { Some(lanes.join(", ")) }
}

/// A peer region's remote key unpacked on one endpoint (`ucp_rkey_h`), with the range
/// the peer declared for it. Keeps its endpoint alive; destroyed when the last user
/// (including posted operations and [`MappedRemote`]s) is gone.
#[derive(Clone)]
pub struct RemoteKey {
    inner: Arc<RkeyInner>,
}

struct RkeyInner {
    _ep: Arc<EndpointInner>,
    handle: sys::ucp_rkey_h,
    range: DeclaredRange,
    /// Where UCX mapped the peer's segment in this process (shared memory only).
    backing: Option<SharedMapping>,
}

// SAFETY: the rkey is only used for RMA posted under the worker lock (MULTI), for
// ucp_rkey_ptr (a read-only lookup), and destroyed once in Drop.
unsafe impl Send for RkeyInner {}
// SAFETY: as above.
unsafe impl Sync for RkeyInner {}

impl Drop for RkeyInner {
    fn drop(&mut self) {
        // SAFETY: handle came from ucp_ep_rkey_unpack; the endpoint it was unpacked on
        // is kept alive by `_ep`; no posted operation uses it (they hold this Arc).
        unsafe { api().ucp_rkey_destroy(self.handle) };
    }
}

impl RkeyInner {
    /// `ucp_rkey_ptr`: the local address of remote `addr`, or `None` when the
    /// transport cannot map remote memory.
    fn local_ptr(&self, addr: u64) -> Result<Option<*mut u8>> {
        let mut local: *mut c_void = ptr::null_mut();
        // SAFETY: rkey live; local writable.
        let status = unsafe { api().ucp_rkey_ptr(self.handle, addr, &mut local) };
        match status {
            sys::UCS_OK if !local.is_null() => Ok(Some(local.cast())),
            sys::UCS_OK | sys::UCS_ERR_UNREACHABLE | sys::UCS_ERR_UNSUPPORTED => Ok(None),
            other => Err(Error::ucx("map remote memory (ucp_rkey_ptr)", other)),
        }
    }
}

impl fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.range.debug_key("RemoteKey", f)
    }
}

impl transport::RemoteKey for RemoteKey {
    /// Maps `len` bytes of the peer's memory at `remote_addr` into this process
    /// (`ucp_rkey_ptr`) where the transport allows it: `Some` over shared memory
    /// (posix, sysv), `None` over TCP, CMA and RDMA. The range must lie in the key's
    /// declared range, which was checked against UCX's mapping at unpack time.
    fn map(&self, remote_addr: u64, len: usize) -> Result<Option<MappedRemote>> {
        self.inner.range.check(remote_addr, len)?;
        let Some(local) = self.inner.local_ptr(remote_addr)? else {
            return Ok(None);
        };
        let keep: Arc<dyn Any + Send + Sync> = self.inner.clone();
        // SAFETY: UCX mapped the peer's segment while unpacking the key and keeps it
        // mapped until ucp_rkey_destroy, which waits for `keep`. At unpack we checked
        // that the whole declared range lies inside that shared mapping, and just now
        // that remote_addr..+len lies inside the declared range; the offset within
        // the segment is the same on both sides.
        Ok(Some(unsafe { MappedRemote::new(local, len, remote_addr, self.inner.backing, keep) }))
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

    /// Unpacks a key the peer packed for its region `[remote_addr, remote_addr+len)`
    /// (`ucp_ep_rkey_unpack`). The declared range bounds all later accesses through the
    /// key. Where UCX maps the peer's memory directly (shared memory), the declared
    /// range is also checked against that mapping ([`Error::RemoteRangeUnmapped`]).
    ///
    /// Then probes the key with a one-byte get and a flush of the endpoint (waiting
    /// at most `FabricConfig::connect_timeout_ms`): on shared memory that needs
    /// nothing from the peer; over TCP the peer must progress.
    fn unpack_key(&self, packed: &[u8], remote_addr: u64, len: u64) -> Result<RemoteKey> {
        let range = DeclaredRange::new(remote_addr, len)?;
        if packed.is_empty() {
            return Err(Error::Config("empty packed remote key".into()));
        }
        let mut handle: sys::ucp_rkey_h = ptr::null_mut();
        // SAFETY: endpoint live; packed is readable for the call; handle writable.
        // (UCX trusts the packed bytes; they come from an authenticated peer.)
        let status = unsafe { api().ucp_ep_rkey_unpack(self.inner.handle, packed.as_ptr().cast(), &mut handle) };
        check("unpack remote key (ucp_ep_rkey_unpack)", status)?;
        let mut inner = RkeyInner { _ep: self.inner.clone(), handle, range, backing: None };
        if let Some(local) = inner.local_ptr(remote_addr)? {
            let covered = usize::try_from(len).ok().map(|len| shared_mapping_of(local as usize, len));
            match covered {
                Some(Ok(Some(mapping))) => inner.backing = Some(mapping),
                Some(Err(source)) => {
                    return Err(Error::Io { op: "read /proc/self/maps to check a mapped remote key", source });
                }
                _ => return Err(Error::RemoteRangeUnmapped { addr: remote_addr, len }),
            }
        }
        let key = RemoteKey { inner: Arc::new(inner) };
        if len > 0 {
            self.probe(&key)?;
        }
        Ok(key)
    }

    /// Posts a put of `local[local_offset..][..len]` to `remote_addr` (`ucp_put_nbx`,
    /// passing the region's memory handle). Complete at the next successful
    /// [`Endpoint::flush`].
    fn put(&self, local: &Region, local_offset: usize, len: usize, remote_addr: u64, key: &RemoteKey) -> Result<()> {
        let src = self.local_range(local, local_offset, len)?;
        key.inner.range.check(remote_addr, len)?;
        let hold = Hold { _region: Some(local.inner().clone()), _key: Some(key.inner.clone()), _bytes: None };
        let rkey = key.inner.handle;
        self.post("post put (ucp_put_nbx)", hold, Some(local.inner().memh()), |param| {
            // SAFETY: endpoint and rkey live; src..src+len lies in the local region,
            // which the Hold keeps mapped until the callback (or until return when
            // completed in place); param is valid for the call.
            unsafe { api().ucp_put_nbx(self.inner.handle, src.cast(), len, remote_addr, rkey, param) }
        })
    }

    /// Posts a put of a copy of `data` (completion entries, ring tails). Complete at the
    /// next successful [`Endpoint::flush`].
    fn put_bytes(&self, data: &[u8], remote_addr: u64, key: &RemoteKey) -> Result<()> {
        key.inner.range.check(remote_addr, data.len())?;
        let bytes: Box<[u8]> = data.into();
        let src = bytes.as_ptr();
        let hold = Hold { _region: None, _key: Some(key.inner.clone()), _bytes: Some(bytes) };
        let rkey = key.inner.handle;
        self.post("post put of bytes (ucp_put_nbx)", hold, None, |param| {
            // SAFETY: endpoint and rkey live; src points to data.len() bytes in a heap
            // buffer the Hold owns until the operation completes (moving the Box does
            // not move its contents).
            unsafe { api().ucp_put_nbx(self.inner.handle, src.cast(), data.len(), remote_addr, rkey, param) }
        })
    }

    /// Posts a get of `len` bytes at `remote_addr` into `local[local_offset..]`
    /// (`ucp_get_nbx`). The bytes are in place at the next successful
    /// [`Endpoint::flush`].
    fn get(&self, local: &Region, local_offset: usize, len: usize, remote_addr: u64, key: &RemoteKey) -> Result<()> {
        let dst = self.local_range(local, local_offset, len)?;
        key.inner.range.check(remote_addr, len)?;
        let hold = Hold { _region: Some(local.inner().clone()), _key: Some(key.inner.clone()), _bytes: None };
        let rkey = key.inner.handle;
        self.post("post get (ucp_get_nbx)", hold, Some(local.inner().memh()), |param| {
            // SAFETY: as in put; UCX writes into dst..dst+len, inside the local region
            // kept mapped by the Hold. Those bytes are plain u8 (see crate::memory).
            unsafe { api().ucp_get_nbx(self.inner.handle, dst.cast(), len, remote_addr, rkey, param) }
        })
    }

    /// Waits until every operation posted on this endpoint before the call is complete
    /// at the target (`ucp_ep_flush_nbx`, progressing the worker), or `timeout` passes.
    /// Then reports the first failure of an operation since the previous flush.
    ///
    /// After `Ok`, a following put is ordered after everything flushed: "put payload,
    /// flush, put completion" delivers the payload first. A CPU fence is issued too, so
    /// this also holds for transports that write with CPU stores (shared memory).
    fn flush(&self, timeout: Duration) -> Result<()> {
        let param = sys::ucp_request_param_t::default();
        // SAFETY: endpoint live; param asks for no callback (we poll the request).
        let request = unsafe { api().ucp_ep_flush_nbx(self.inner.handle, &param) };
        if sys::UCS_PTR_IS_ERR(request) {
            return Err(Error::ucx("flush endpoint (ucp_ep_flush_nbx)", sys::UCS_PTR_RAW_STATUS(request)));
        }
        if sys::UCS_PTR_IS_PTR(request) {
            self.inner.worker.wait_request(request, timeout, "flush endpoint (ucp_ep_flush_nbx)")?;
        }
        // Flush completion runs posted operations' callbacks; release what they held.
        self.inner.worker.progress();
        fence(Ordering::SeqCst);
        match self.inner.state.first_error.swap(0, Ordering::AcqRel) {
            0 => Ok(()),
            status => Err(Error::ucx("an operation posted before this flush failed", status as sys::ucs_status_t)),
        }
    }

    /// Sends a doorbell of at most [`MAX_DOORBELL_BYTES`] to the peer worker
    /// (`ucp_am_send_nbx`, eager). Posted; completes with progress or flush.
    fn send_doorbell(&self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_DOORBELL_BYTES {
            return Err(Error::DoorbellTooLong { len: bytes.len(), max: MAX_DOORBELL_BYTES });
        }
        let header: Box<[u8]> = bytes.into();
        let header_ptr = header.as_ptr();
        let hold = Hold { _region: None, _key: None, _bytes: Some(header) };
        self.post("send doorbell (ucp_am_send_nbx)", hold, None, |param| {
            // SAFETY: endpoint live; the header bytes live in a heap buffer owned by the
            // Hold until completion; no data buffer (null, 0).
            unsafe {
                api().ucp_am_send_nbx(
                    self.inner.handle,
                    DOORBELL_AM_ID,
                    header_ptr.cast(),
                    bytes.len(),
                    ptr::null(),
                    0,
                    param,
                )
            }
        })
    }

    /// The transports UCX chose for this endpoint and their roles, from
    /// `ucp_ep_print_info`, e.g. `"sysv/memory (am am_bw#0), posix/memory, cma/memory
    /// (rma_bw#0)"` (shm preset) or `"tcp/lo (am am_bw#0 rma_bw#0), tcp/eth0
    /// (am_bw#1 rma_bw#1)"`. For logs. Falls back to the raw text if the format is
    /// not recognised.
    fn describe(&self) -> String {
        let raw = self.print_info();
        summarize_lanes(&raw).unwrap_or(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::summarize_lanes;

    #[test]
    fn lane_summary() {
        let info = "\
#
# UCP endpoint
#
#               peer: <no debug data>
#                 lane[0]:  3:posix/memory.0 md[3]          -> md[3]/posix/sysdev[255] rma_bw#0 am am_bw#0
#                 lane[1]:  5:cma/memory.0 md[5]            -> md[5]/cma/sysdev[255] rma_bw#1
#
";
        assert_eq!(summarize_lanes(info).as_deref(), Some("posix/memory (rma_bw#0 am am_bw#0), cma/memory (rma_bw#1)"));
        assert_eq!(summarize_lanes("garbage"), None);
    }
}
