//! What a libfabric worker shares with its endpoints: the objects it opened, the table
//! of posted operations with what each holds, the completion queue that finishes them,
//! and the doorbell receive buffers. Below both the worker and its endpoints, so that
//! an endpoint posts through the worker's state without naming the worker.

use std::collections::HashMap;
use std::ffi::c_void;
use std::os::fd::{OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libfabric_sys as sys;

use super::domain::DomainInner;
use super::region::{Mr, RegionInner};
use super::{Completion, OfiConfig, ofi_error};
use crate::doorbell::{DoorbellQueue, MAX_DOORBELL_BYTES};
use crate::error::{Error, Result};

/// Completion entries read per `fi_cq_read` call.
pub(super) const CQ_BATCH: usize = 16;
/// Tokens (libfabric `context` values) of receive slots carry this bit.
const RECV_TOKEN: u64 = 1 << 63;

/// Per-endpoint bookkeeping shared with posted operations.
pub(crate) struct OpState {
    pub(crate) in_flight: AtomicUsize,
    /// First error number of an operation since the last flush (0 = none).
    pub(crate) first_error: AtomicI32,
}

impl OpState {
    pub(crate) fn new() -> Arc<OpState> {
        Arc::new(OpState { in_flight: AtomicUsize::new(0), first_error: AtomicI32::new(0) })
    }
}

/// What a posted operation keeps alive until its completion entry is read. The
/// fields are never read: they are held for their `Drop`.
pub(crate) enum Hold {
    Region {
        _region: Arc<RegionInner>,
    },
    /// Copied bytes and, under `FI_MR_LOCAL`, their registration (declared first:
    /// closed before the bytes are freed).
    Bytes {
        _mr: Option<Mr>,
        _bytes: Box<[u8]>,
    },
}

pub(super) struct Pending {
    state: Arc<OpState>,
    _hold: Hold,
}

/// Receive buffers for doorbells, registered when the provider wants `FI_MR_LOCAL`.
pub(super) struct RecvPool {
    // Field order is drop order: the registration goes before the buffers.
    pub(super) mr: Option<Mr>,
    pub(super) bufs: Box<[[u8; MAX_DOORBELL_BYTES]]>,
}

/// The state of one libfabric worker (fabric, domain, address vector, completion
/// queue, RDM endpoint, posted operations), shared by the [`super::Worker`] handles
/// and every endpoint made from them; closed when the last of them goes.
pub(crate) struct WorkerShared {
    pub(crate) domain: Arc<DomainInner>,
    pub(crate) config: OfiConfig,
    pub(super) av: *mut sys::fid_av,
    pub(super) cq: *mut sys::fid_cq,
    pub(crate) ep: *mut sys::fid_ep,
    pub(super) wait_fd: RawFd,
    /// Our own eventfd when the completion queue has no fd wait object (shm).
    pub(super) own_fd: Option<OwnedFd>,
    pub(super) doorbells: DoorbellQueue,
    /// Under the domain lock in practice; a Mutex of its own keeps Rust honest.
    pub(super) ops: Mutex<Ops>,
    pub(super) recv: Mutex<RecvPool>,
    pub(super) describe: String,
}

#[derive(Default)]
pub(super) struct Ops {
    pub(super) next_token: u64,
    pub(super) table: HashMap<u64, Pending>,
}

// SAFETY: the raw handles are used only under the domain lock and closed once in
// Drop; everything else is Mutex/atomic protected.
unsafe impl Send for WorkerShared {}
// SAFETY: as above.
unsafe impl Sync for WorkerShared {}

impl Drop for WorkerShared {
    fn drop(&mut self) {
        let _guard = self.domain.lock();
        // SAFETY: endpoints hold an Arc to this value, so none is left; the endpoint
        // is closed before the objects bound to it, each exactly once. Operations
        // still posted are abandoned with the endpoint; their holds drop after this
        // body (the registrations they hold close under the lock, taken again then).
        unsafe {
            if !self.ep.is_null() {
                sys::fi_close(&mut (*self.ep).fid);
            }
            if !self.cq.is_null() {
                sys::fi_close(&mut (*self.cq).fid);
            }
            if !self.av.is_null() {
                sys::fi_close(&mut (*self.av).fid);
            }
        }
        drop(_guard);
        let ops = std::mem::take(&mut self.ops.lock().unwrap_or_else(|p| p.into_inner()).table);
        drop(ops);
    }
}

impl WorkerShared {
    /// Reads the completion queue until it is empty; returns the entries handled.
    /// Completed operations release what they held; doorbells land in the queue read
    /// by [`crate::Transport::take_doorbells`]. Over `tcp;ofi_rxm` this is also what answers
    /// peers (manual progress).
    pub(crate) fn progress(&self) -> usize {
        let mut dead = Vec::new();
        let n = {
            let _guard = self.domain.lock();
            self.progress_locked(&mut dead)
        };
        drop(dead);
        n
    }

    /// [`WorkerShared::progress`] with the domain lock held; released holds go to `dead`.
    pub(crate) fn progress_locked(&self, dead: &mut Vec<Hold>) -> usize {
        let mut handled = 0;
        loop {
            let mut entries = [sys::fi_cq_data_entry::default(); CQ_BATCH];
            // SAFETY: cq open (lock held); entries has room for CQ_BATCH entries of
            // the queue's format (FI_CQ_FORMAT_DATA).
            let n = unsafe { sys::fi_cq_read(self.cq, entries.as_mut_ptr().cast(), CQ_BATCH) };
            if n > 0 {
                let n = n as usize;
                for e in &entries[..n] {
                    self.complete(e.op_context as u64, 0, e.len, dead);
                }
                handled += n;
                continue;
            }
            if n == -(sys::FI_EAVAIL as isize) {
                let mut err = sys::fi_cq_err_entry::default();
                // SAFETY: cq open; err writable; err_data_size 0 lets the provider use
                // its own buffer for error data.
                let m = unsafe { sys::fi_cq_readerr(self.cq, &mut err, 0) };
                if m == 1 {
                    self.complete(err.op_context as u64, err.err.max(1), err.len, dead);
                    handled += 1;
                    continue;
                }
            }
            return handled;
        }
    }

    fn complete(&self, token: u64, err: i32, len: usize, dead: &mut Vec<Hold>) {
        if token & RECV_TOKEN != 0 {
            let slot = (token & !RECV_TOKEN) as usize;
            if err == 0 {
                let pool = self.recv.lock().unwrap_or_else(|p| p.into_inner());
                match pool.bufs.get(slot) {
                    Some(buf) if len <= MAX_DOORBELL_BYTES => self.doorbells.push(&buf[..len]),
                    _ => self.doorbells.note_malformed(),
                }
            } else if err != sys::FI_ECANCELED as i32 {
                // Too long (FI_ETRUNC) or otherwise broken: a misbehaving peer.
                self.doorbells.note_malformed();
            }
            // A slot that cannot be reposted is lost; later doorbells use the others.
            let _ = self.post_recv(slot);
            return;
        }
        let pending = self.ops.lock().unwrap_or_else(|p| p.into_inner()).table.remove(&token);
        if let Some(p) = pending {
            if err != 0 {
                let _ = p.state.first_error.compare_exchange(0, err, Ordering::AcqRel, Ordering::Acquire);
            }
            p.state.in_flight.fetch_sub(1, Ordering::AcqRel);
            dead.push(p._hold);
        }
    }

    /// Posts receive slot `slot` (domain lock held by the caller).
    pub(super) fn post_recv(&self, slot: usize) -> Result<()> {
        let pool = self.recv.lock().unwrap_or_else(|p| p.into_inner());
        let Some(buf) = pool.bufs.get(slot) else { return Ok(()) };
        let desc = pool.mr.as_ref().map_or(ptr::null_mut(), Mr::desc);
        let token = RECV_TOKEN | slot as u64;
        // SAFETY: ep open (caller holds the lock); the buffer is MAX_DOORBELL_BYTES in
        // a boxed slice owned by the worker, which closes the endpoint (cancelling the
        // receive) before freeing it; token is an integer context we never
        // dereference.
        let ret = unsafe {
            sys::fi_recv(
                self.ep,
                buf.as_ptr().cast_mut().cast(),
                MAX_DOORBELL_BYTES,
                desc,
                sys::FI_ADDR_UNSPEC,
                token as *mut c_void,
            )
        };
        if ret < 0 { Err(ofi_error("post doorbell receive (fi_recv)", ret as i64)) } else { Ok(()) }
    }

    /// Records a posted operation under a new token and calls `post` with it,
    /// retrying (progressing in between) while the provider says `FI_EAGAIN`, up to
    /// `connect_timeout_ms`, then [`Error::Again`].
    pub(crate) fn post(
        &self,
        op: &'static str,
        state: &Arc<OpState>,
        hold: Hold,
        post: impl Fn(*mut c_void) -> isize,
    ) -> Result<()> {
        let max = self.config.max_in_flight_ops;
        let token = {
            let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
            if ops.table.len() >= max {
                return Err(Error::Busy { in_flight: ops.table.len(), max });
            }
            let token = ops.next_token;
            ops.next_token = (ops.next_token + 1) & !RECV_TOKEN;
            ops.table.insert(token, Pending { state: state.clone(), _hold: hold });
            token
        };
        state.in_flight.fetch_add(1, Ordering::AcqRel);
        let deadline = Instant::now() + Duration::from_millis(self.config.connect_timeout_ms);
        let mut dead = Vec::new();
        let result = loop {
            let ret = {
                let _guard = self.domain.lock();
                let ret = post(token as *mut c_void);
                if ret == -(sys::FI_EAGAIN as isize) {
                    self.progress_locked(&mut dead);
                }
                ret
            };
            drop(std::mem::take(&mut dead));
            if ret >= 0 {
                break Ok(());
            }
            if ret != -(sys::FI_EAGAIN as isize) {
                break Err(ofi_error(op, ret as i64));
            }
            if Instant::now() >= deadline {
                break Err(Error::Again { op, waited_ms: self.config.connect_timeout_ms });
            }
            std::thread::yield_now();
        };
        if result.is_err() {
            // Not posted: no completion will come for the token.
            let p = self.ops.lock().unwrap_or_else(|p| p.into_inner()).table.remove(&token);
            if p.is_some() {
                state.in_flight.fetch_sub(1, Ordering::AcqRel);
            }
        }
        result
    }

    /// Copies `data` for a posted operation, registered if the provider wants
    /// `FI_MR_LOCAL`. Returns the hold and the pointer and descriptor to post.
    pub(crate) fn hold_bytes(&self, data: &[u8]) -> Result<(Hold, *const u8, *mut c_void)> {
        let bytes: Box<[u8]> = if data.is_empty() { Box::new([0u8]) } else { data.into() };
        let ptr = bytes.as_ptr();
        let mr = if self.domain.mr_local {
            // SAFETY: the bytes are boxed (stable address) and travel in the same Hold
            // as the Mr, declared after it, so they are freed after it is closed.
            Some(unsafe {
                Mr::register(self.domain.clone(), ptr, bytes.len(), u64::from(sys::FI_WRITE | sys::FI_SEND))
            }?)
        } else {
            None
        };
        let desc = mr.as_ref().map_or(ptr::null_mut(), Mr::desc);
        Ok((Hold::Bytes { _mr: mr, _bytes: bytes }, ptr, desc))
    }

    /// Remote address to post for `addr` in a region whose base the peer declared
    /// as `base`: the address itself under `FI_MR_VIRT_ADDR`, else the offset.
    pub(crate) fn target_addr(&self, base: u64, addr: u64) -> u64 {
        if self.domain.virt_addr { addr } else { addr - base }
    }

    pub(crate) fn mr_local(&self) -> bool {
        self.domain.mr_local
    }

    pub(crate) fn completion(&self) -> Completion {
        self.config.completion
    }
}
