//! The DAOS event queue of one I/O thread: many `dfs_read` and `dfs_write` calls in flight
//! from one thread, each with the memory DAOS writes until it completes, where blocking
//! calls would need a thread each.
//!
//! Not here: the handles the calls are made on ([`super::Obj`], [`super::Runtime`]), and
//! which pieces go together into a batch (the backend's `IoQueue`, `crate::backend`).

use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use dpuio_backend::{HostBytes, HostBytesMut};

use super::{Obj, Runtime, der_error, errno_error};
use crate::deadline::Waiting;
use crate::error::CallError;
use crate::sys::{self, daos_event_t, daos_handle_t};

/// One asynchronous read or write for [`EventQueue::run`], with the memory it borrows.
pub enum AsyncIo<'a> {
    Read { obj: &'a Obj, buf: HostBytesMut<'a>, offset: u64 },
    Write { obj: &'a Obj, buf: HostBytes<'a>, offset: u64 },
}

/// What DAOS holds a pointer to while one call is in flight: its event, and the
/// scatter/gather list, buffer descriptor and read-size word that `dfs_read` and
/// `dfs_write` keep until completion (libdfs stores the sgl pointer in the task and
/// writes the read size from its completion callback). `ev` comes first, so the event
/// pointer `daos_eq_poll` returns is the slot's address.
#[repr(C)]
struct Slot {
    ev: daos_event_t,
    iov: sys::d_iov_t,
    sgl: sys::d_sg_list_t,
    read: u64,
    /// The batch index of the operation using this slot.
    index: usize,
    /// Bytes asked for (a write completes with all of them).
    len: usize,
    is_read: bool,
}
const _: () = assert!(std::mem::offset_of!(Slot, ev) == 0);

/// A DAOS event queue (`daos_eq_create`) with a fixed number of slots: one thread keeps
/// up to `depth` reads and writes in flight with it, where blocking calls would need a
/// thread each.
///
/// Soundness rests on one rule: [`EventQueue::run`] does not return, not even by
/// unwinding, while an operation it launched is in flight, so the buffers a batch
/// borrows, and the slots, outlive every DAOS access to them.
pub struct EventQueue {
    rt: Arc<Runtime>,
    eqh: daos_handle_t,
    /// Every slot, allocated once with `Box::into_raw` and freed in `Drop`; only raw
    /// pointers to them exist, because DAOS writes them while they are in flight.
    slots: Vec<*mut Slot>,
    idle: Vec<*mut Slot>,
    /// `daos_eq_poll`'s output array.
    polled: Vec<*mut daos_event_t>,
}

// SAFETY: the queue and its slots are owned by one thread at a time (not Sync); nothing
// in flight survives `run`, so moving the queue to another thread between calls hands
// over idle slots and an EQ that DAOS lets any thread use.
unsafe impl Send for EventQueue {}

impl EventQueue {
    pub(super) fn new(rt: Arc<Runtime>, depth: usize) -> Result<EventQueue, CallError> {
        let depth = depth.clamp(1, 1024);
        let mut eqh = daos_handle_t::default();
        // SAFETY: daos_init ran (rt holds it); eqh is a valid out-pointer.
        let rc = unsafe { (rt.api.daos_eq_create)(&mut eqh) };
        if rc != 0 {
            return Err(der_error(rt.api, "daos_eq_create", rc));
        }
        let slots: Vec<*mut Slot> = (0..depth)
            .map(|_| {
                Box::into_raw(Box::new(Slot {
                    ev: daos_event_t::ZERO,
                    iov: sys::d_iov_t { iov_buf: ptr::null_mut(), iov_buf_len: 0, iov_len: 0 },
                    sgl: sys::d_sg_list_t { sg_nr: 0, sg_nr_out: 0, sg_iovs: ptr::null_mut() },
                    read: 0,
                    index: 0,
                    len: 0,
                    is_read: false,
                }))
            })
            .collect();
        Ok(EventQueue { rt, eqh, idle: slots.clone(), slots, polled: vec![ptr::null_mut(); depth] })
    }

    /// Most operations in flight at once.
    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    /// Run every operation of `ops`, at most [`EventQueue::depth`] in flight, calling
    /// `done(index, result)` for each as it completes (bytes read, short only at the
    /// end of the file; or bytes written). Returns when all have completed: DAOS writes
    /// the memory they borrow until then, so a batch DAOS does not answer (every engine
    /// gone) waits for it, listed as stuck from `deadline` on ([`Waiting`]).
    pub fn run(
        &mut self,
        ops: &mut [AsyncIo<'_>],
        deadline: Duration,
        done: &mut dyn FnMut(usize, Result<usize, CallError>),
    ) {
        let waiting = Waiting::new(format!("dfs_read/dfs_write: a batch of {} on an event queue", ops.len()), deadline);
        // Drains what is still in flight if `done` panics, before the borrows end.
        let mut batch = Batch { eq: self, launched: 0, waiting };
        let mut next = 0;
        while next < ops.len() || batch.launched > 0 {
            while next < ops.len()
                && let Some(slot) = batch.eq.idle.pop()
            {
                // SAFETY: the slot is idle (in no DAOS call); ops[next] borrows its
                // buffer and object until `run` returns, and `run` returns only once
                // this operation completed (the Batch guard).
                match unsafe { batch.eq.launch(slot, next, &mut ops[next]) } {
                    Ok(()) => batch.launched += 1,
                    Err(e) => {
                        batch.eq.idle.push(slot);
                        done(next, Err(e));
                    }
                }
                next += 1;
            }
            if batch.launched > 0 {
                for (index, result) in batch.poll() {
                    done(index, result);
                }
            }
        }
    }

    /// Start `op` with `slot`'s event.
    ///
    /// # Safety
    /// `slot` is one of this queue's idle slots, and the memory and object `op`
    /// borrows stay valid until the event is polled.
    unsafe fn launch(&mut self, slot: *mut Slot, index: usize, op: &mut AsyncIo<'_>) -> Result<(), CallError> {
        let api = self.rt.api;
        // SAFETY: slot is a live allocation of ours that no DAOS call uses (idle), and
        // no reference to it exists.
        let s = unsafe { &mut *slot };
        // SAFETY: the event is idle (finalised after its last use, or never used), the
        // EQ is open, and there is no parent event.
        let rc = unsafe { (api.daos_event_init)(&mut s.ev, self.eqh, ptr::null_mut()) };
        if rc != 0 {
            return Err(der_error(api, "daos_event_init", rc));
        }
        s.index = index;
        s.read = 0;
        let (call, rc) = match op {
            AsyncIo::Read { obj, buf, offset } => {
                s.is_read = true;
                s.len = buf.len();
                s.iov = sys::d_iov_t { iov_buf: buf.as_mut_ptr().cast(), iov_buf_len: buf.len(), iov_len: buf.len() };
                s.sgl = sys::d_sg_list_t { sg_nr: 1, sg_nr_out: 0, sg_iovs: &mut s.iov };
                // SAFETY: dfs and obj are open (obj borrows its mount); sgl, iov, read
                // and ev live in the slot, and buf is borrowed, until the event is
                // polled (caller's contract); DAOS writes buf only through the sgl.
                let rc = unsafe { (api.dfs_read)(obj.fs.dfs, obj.obj, &mut s.sgl, *offset, &mut s.read, &mut s.ev) };
                ("dfs_read", rc)
            }
            AsyncIo::Write { obj, buf, offset } => {
                s.is_read = false;
                s.len = buf.len();
                // DFS only reads through iov_buf on a write; the pointer is *mut by C's type.
                s.iov = sys::d_iov_t {
                    iov_buf: buf.as_ptr().cast_mut().cast(),
                    iov_buf_len: buf.len(),
                    iov_len: buf.len(),
                };
                s.sgl = sys::d_sg_list_t { sg_nr: 1, sg_nr_out: 0, sg_iovs: &mut s.iov };
                // SAFETY: as for the read; DFS only reads buf.
                let rc = unsafe { (api.dfs_write)(obj.fs.dfs, obj.obj, &mut s.sgl, *offset, &mut s.ev) };
                ("dfs_write", rc)
            }
        };
        if rc != 0 {
            // libdfs returns an error only before it launches the event (argument
            // checks, task creation); from then on the result comes in ev_error.
            // SAFETY: the event was initialised above and not launched.
            unsafe { (api.daos_event_fini)(&mut s.ev) };
            return Err(errno_error(call, rc));
        }
        Ok(())
    }
}

/// A batch in progress: how many of its operations are in flight.
struct Batch<'q> {
    eq: &'q mut EventQueue,
    launched: usize,
    waiting: Waiting,
}

/// How long one `daos_eq_poll` waits before the batch checks its deadline.
const POLL_SLICE_US: i64 = 1_000_000;

impl Batch<'_> {
    /// Wait for at least one completion; return each completed operation's index and
    /// result, its slot idle again.
    fn poll(&mut self) -> Vec<(usize, Result<usize, CallError>)> {
        let api = self.eq.rt.api;
        let mut failures = 0u32;
        let n = loop {
            // SAFETY: the EQ is open; `polled` holds `depth` pointers, the most DAOS
            // may write; waiting only on running events, a slice at a time.
            let n = unsafe {
                (api.daos_eq_poll)(
                    self.eq.eqh,
                    1,
                    POLL_SLICE_US,
                    self.eq.polled.len() as u32,
                    self.eq.polled.as_mut_ptr(),
                )
            };
            if n == 0 {
                // Nothing completed in this slice: past the deadline the batch is listed
                // as stuck, and goes on waiting (its memory is DAOS's until then).
                self.waiting.check();
                continue;
            }
            if n > 0 {
                break n as usize;
            }
            // Operations are in flight into memory this batch borrows: returning now
            // would let it be freed under them, so retry, and give up only by aborting.
            failures += 1;
            tracing::error!(error = %der_error(api, "daos_eq_poll", n), in_flight = self.launched, "DAOS event queue");
            if failures >= 100 {
                eprintln!("dpu-agent: daos_eq_poll keeps failing with DAOS I/O in flight into host memory; aborting");
                std::process::abort();
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let mut out = Vec::with_capacity(n);
        for &ev in &self.eq.polled[..n.min(self.eq.polled.len())] {
            let slot = ev.cast::<Slot>();
            // SAFETY: every event we launch is the first field of one of our slots, so
            // the pointer DAOS returns is that slot; it is complete, so DAOS no longer
            // writes it.
            let s = unsafe { &mut *slot };
            let result = match s.ev.ev_error {
                0 if s.is_read => Ok((s.read as usize).min(s.len)),
                0 => Ok(s.len),
                errno => Err(errno_error(if s.is_read { "dfs_read" } else { "dfs_write" }, errno)),
            };
            // SAFETY: the event completed and was polled out, which is when DAOS
            // allows finalising it.
            unsafe { (api.daos_event_fini)(&mut s.ev) };
            self.launched -= 1;
            self.eq.idle.push(slot);
            out.push((s.index, result));
        }
        out
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        while self.launched > 0 {
            self.poll();
        }
    }
}

impl Drop for EventQueue {
    fn drop(&mut self) {
        // SAFETY: nothing is in flight (run drains before returning) and every event
        // was finalised, so the EQ is empty.
        let rc = unsafe { (self.rt.api.daos_eq_destroy)(self.eqh, 0) };
        if rc != 0 {
            tracing::warn!(error = %der_error(self.rt.api, "daos_eq_destroy", rc), "DAOS event queue");
        }
        for &slot in &self.slots {
            // SAFETY: allocated with Box::into_raw in `new`, freed once, unused by DAOS.
            drop(unsafe { Box::from_raw(slot) });
        }
    }
}
