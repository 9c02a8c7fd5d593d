//! The UCX worker: the [`crate::Transport`] of UCX. Progress, addresses, endpoints,
//! doorbell receipt and the event fd; its state lives in `shared`, where its endpoints
//! reach it too.

use std::ffi::c_void;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::{Arc, Mutex};

use ucx_sys as sys;

use super::api;

use super::shared::{DOORBELL_AM_ID, WorkerShared};
use super::{Context, Endpoint, Region};
use crate::doorbell::{Doorbell, DoorbellQueue};
use crate::error::{Error, Result, check};
use crate::transport::Transport;

/// A UCX worker (`ucp_worker_h`) created with `UCS_THREAD_MODE_MULTI`: `Send + Sync`,
/// every method takes `&self`, and UCX serialises concurrent calls with the worker
/// lock. Cheap to clone (a reference): hand a clone to a progress thread.
///
/// Receives doorbells from the moment it exists; drain them with
/// [`Transport::take_doorbells`] after [`Transport::progress`].
#[derive(Clone)]
pub struct Worker {
    shared: Arc<WorkerShared>,
}

impl Worker {
    /// Opens a context with `config` and creates one worker on it: the usual way to
    /// get a transport.
    pub fn open(config: &crate::FabricConfig) -> Result<Worker> {
        Context::new(config)?.create_worker()
    }

    pub(crate) fn new(ctx: Context) -> Result<Worker> {
        let params = sys::ucp_worker_params_t {
            field_mask: u64::from(sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE),
            thread_mode: sys::UCS_THREAD_MODE_MULTI,
            ..Default::default()
        };
        let mut handle: sys::ucp_worker_h = ptr::null_mut();
        // SAFETY: the context is live (ctx); params is initialised with a matching
        // field mask; handle is writable.
        let status = unsafe { api().ucp_worker_create(ctx.inner().handle(), &params, &mut handle) };
        check("create worker (ucp_worker_create)", status)?;
        let doorbell_queue_len = ctx.config().doorbell_queue_len;
        // From here on, dropping `shared` destroys the worker.
        let shared = Arc::new(WorkerShared {
            ctx,
            handle,
            doorbells: Box::new(DoorbellQueue::new(doorbell_queue_len)),
            graveyard: Arc::new(Mutex::new(Vec::new())),
        });

        let mut attr = sys::ucp_worker_attr_t {
            field_mask: u64::from(sys::UCP_WORKER_ATTR_FIELD_THREAD_MODE),
            ..Default::default()
        };
        // SAFETY: worker live; attr writable with a matching mask.
        let status = unsafe { api().ucp_worker_query(shared.handle, &mut attr) };
        check("query worker thread mode (ucp_worker_query)", status)?;
        if attr.thread_mode != sys::UCS_THREAD_MODE_MULTI {
            return Err(Error::ThreadMode { granted: attr.thread_mode });
        }

        let handler = sys::ucp_am_handler_param_t {
            field_mask: u64::from(
                sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                    | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                    | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG
                    | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
            ),
            id: DOORBELL_AM_ID,
            flags: sys::UCP_AM_FLAG_WHOLE_MSG,
            cb: Some(doorbell_received),
            arg: ptr::from_ref::<DoorbellQueue>(&shared.doorbells).cast_mut().cast::<c_void>(),
        };
        // SAFETY: worker live; the handler argument points into a Box owned by the
        // worker's shared state, which outlives the worker handle (destroyed first in
        // Drop); the callback only takes a shared reference to it.
        let status = unsafe { api().ucp_worker_set_am_recv_handler(shared.handle, &handler) };
        check("register doorbell handler (ucp_worker_set_am_recv_handler)", status)?;
        Ok(Worker { shared })
    }

    /// The context this worker belongs to.
    pub fn context(&self) -> &Context {
        self.shared.context()
    }

    /// Active messages on the doorbell id that were not doorbells (too long, or
    /// carrying data), dropped since the worker was created. A count above zero means
    /// a misbehaving peer.
    pub fn malformed_doorbells(&self) -> u64 {
        self.shared.doorbells.malformed()
    }
}

/// `ucp_am_recv_callback_t` for doorbells: copy the header into the queue.
unsafe extern "C" fn doorbell_received(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    _data: *mut c_void,
    length: usize,
    _param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: arg is the DoorbellQueue registered with the handler; the worker (and so
    // this callback) is destroyed before the queue is dropped.
    let queue = unsafe { &*arg.cast::<DoorbellQueue>() };
    if length != 0 || (header.is_null() && header_length != 0) {
        // Doorbells carry no data. Returning UCS_OK drops the data (including a
        // rendezvous descriptor, whose sender then completes).
        queue.note_malformed();
        return sys::UCS_OK;
    }
    let bytes = if header_length == 0 {
        &[][..]
    } else {
        // SAFETY: UCX passes header_length readable bytes at header, valid for the
        // duration of the callback; we copy them out before returning.
        unsafe { std::slice::from_raw_parts(header.cast::<u8>(), header_length) }
    };
    queue.push(bytes);
    sys::UCS_OK
}

impl Transport for Worker {
    type Region = Region;
    type Endpoint = Endpoint;

    fn name(&self) -> &'static str {
        "ucx"
    }

    /// Allocates a region on this worker's context; see [`Context::alloc_region`].
    fn alloc_region(&self, len: usize) -> Result<Region> {
        self.shared.context().alloc_region(len)
    }

    /// This worker's address (`ucp_worker_get_address`), for the peer's
    /// [`Transport::connect`]. Opaque bytes of a few hundred bytes.
    fn address(&self) -> Result<Vec<u8>> {
        let mut addr: *mut sys::ucp_address_t = ptr::null_mut();
        let mut len: usize = 0;
        // SAFETY: worker live; out-parameters writable.
        let status = unsafe { api().ucp_worker_get_address(self.shared.handle, &mut addr, &mut len) };
        check("get worker address (ucp_worker_get_address)", status)?;
        // SAFETY: on success UCX returns len readable bytes at addr.
        let bytes = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) }.to_vec();
        // SAFETY: addr came from ucp_worker_get_address on this worker; released once.
        unsafe { api().ucp_worker_release_address(self.shared.handle, addr) };
        Ok(bytes)
    }

    /// Creates an endpoint to the worker whose [`Transport::address`] is
    /// `peer_address` and waits (progressing this worker) until it is wired up, at
    /// most `FabricConfig::connect_timeout_ms`. On shared memory this needs nothing
    /// from the peer (it may even be stopped); over TCP the peer must progress its
    /// worker.
    ///
    /// UCX parses the address; it is not hardened against malformed input, so accept
    /// addresses only from authenticated peers (the control plane's mTLS session).
    fn connect(&self, peer_address: &[u8]) -> Result<Endpoint> {
        Endpoint::create(self.shared.clone(), peer_address)
    }

    /// Progresses communication once; returns the number of events handled (0 when
    /// idle). Doorbells received land in the queue read by
    /// [`Transport::take_doorbells`].
    fn progress(&self) -> usize {
        self.shared.progress()
    }

    /// The worker's event fd (`ucp_worker_get_efd`): readable when there is work for
    /// [`Transport::progress`]. Register it with epoll / tokio `AsyncFd`, and call
    /// [`Transport::arm`] before each sleep. Owned by the worker: do not close it.
    fn event_fd(&self) -> Result<RawFd> {
        let mut fd: i32 = -1;
        // SAFETY: worker live (created with UCP_FEATURE_WAKEUP); fd writable.
        let status = unsafe { api().ucp_worker_get_efd(self.shared.handle, &mut fd) };
        check("get worker event fd (ucp_worker_get_efd)", status)?;
        Ok(fd)
    }

    /// `ucp_worker_arm`: `Ok(true)` if nothing is pending and it is safe to sleep on
    /// the event fd, `Ok(false)` if events are pending (progress, then arm again).
    fn arm(&self) -> Result<bool> {
        // SAFETY: worker live.
        let status = unsafe { api().ucp_worker_arm(self.shared.handle) };
        match status {
            sys::UCS_OK => Ok(true),
            sys::UCS_ERR_BUSY => Ok(false),
            other => Err(Error::ucx("arm worker event fd (ucp_worker_arm)", other)),
        }
    }

    /// Wakes a thread sleeping on the event fd (`ucp_worker_signal`).
    fn wake(&self) -> Result<()> {
        // SAFETY: worker live; ucp_worker_signal is callable from any thread.
        let status = unsafe { api().ucp_worker_signal(self.shared.handle) };
        check("wake worker (ucp_worker_signal)", status)
    }

    /// Moves the doorbells received so far into `out`; returns how many were dropped
    /// since the last call because the queue (`FabricConfig::doorbell_queue_len`) was
    /// full. If non-zero, scan every ring.
    fn take_doorbells(&self, out: &mut Vec<Doorbell>) -> u64 {
        self.shared.doorbells.take(out)
    }
}
