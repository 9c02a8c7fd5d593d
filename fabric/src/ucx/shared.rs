//! What a UCX worker shares with its endpoints: the `ucp_worker_h`, its doorbell queue,
//! progress, and the graveyard of what finished operations kept alive. Below both the
//! worker and its endpoints, so that an endpoint holds the worker's state without
//! naming the worker.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ucx_sys as sys;

use super::api;

use super::Context;
use crate::doorbell::DoorbellQueue;
use crate::error::{Error, Result, check};

/// Active-message id of doorbells.
pub(crate) const DOORBELL_AM_ID: u32 = 0xd0;

/// The state of one UCX worker created with `UCS_THREAD_MODE_MULTI`, shared by the
/// [`super::Worker`] handles and every endpoint made from them; the worker is
/// destroyed when the last of them goes.
pub(crate) struct WorkerShared {
    pub(super) ctx: Context,
    pub(super) handle: sys::ucp_worker_h,
    /// Boxed so its address (the AM handler's argument) is stable.
    pub(super) doorbells: Box<DoorbellQueue>,
    /// What completed operations kept alive, to be released outside UCX callbacks.
    pub(super) graveyard: Arc<Graveyard>,
}

/// References released by completion callbacks, dropped after `ucp_worker_progress`
/// returns (see the module docs of `ucx`).
pub(crate) type Graveyard = Mutex<Vec<Box<dyn Send>>>;

// SAFETY: the worker runs in UCS_THREAD_MODE_MULTI (checked at creation), so UCX locks
// every call made on the handle; the Rust-side state is Mutex/atomic protected.
unsafe impl Send for WorkerShared {}
// SAFETY: as above.
unsafe impl Sync for WorkerShared {}

impl Drop for WorkerShared {
    fn drop(&mut self) {
        reap(&self.graveyard);
        // SAFETY: the handle came from ucp_worker_create; endpoints hold an Arc to this
        // value, so none is left. Destroying the worker may complete outstanding
        // requests, whose callbacks touch only the graveyard (still alive here).
        unsafe { api().ucp_worker_destroy(self.handle) };
        reap(&self.graveyard);
        // `doorbells` drops after this body: the AM handler can no longer run.
    }
}

fn reap(graveyard: &Graveyard) {
    // Take the list before dropping its contents: a drop may close an endpoint, which
    // progresses the worker and may land here again.
    let dead = std::mem::take(&mut *graveyard.lock().unwrap_or_else(|p| p.into_inner()));
    drop(dead);
}

impl WorkerShared {
    /// The context the worker belongs to.
    pub(crate) fn context(&self) -> &Context {
        &self.ctx
    }

    /// Progresses communication once (`ucp_worker_progress`), then releases what the
    /// operations completed meanwhile kept alive; the number of events handled.
    pub(crate) fn progress(&self) -> usize {
        // SAFETY: worker live; MULTI mode makes concurrent calls safe.
        let n = unsafe { api().ucp_worker_progress(self.handle) };
        reap(&self.graveyard);
        n as usize
    }

    /// Progresses until `request` completes or `timeout` passes, then frees it.
    pub(crate) fn wait_request(
        &self,
        request: sys::ucs_status_ptr_t,
        timeout: Duration,
        op: &'static str,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut idle_rounds = 0u32;
        loop {
            if self.progress() == 0 {
                idle_rounds += 1;
            } else {
                idle_rounds = 0;
            }
            // SAFETY: request is a live request handle we own until ucp_request_free.
            let status = unsafe { api().ucp_request_check_status(request) };
            if status != sys::UCS_INPROGRESS {
                // SAFETY: completed request owned by us, freed exactly once.
                unsafe { api().ucp_request_free(request) };
                return check(op, status);
            }
            if Instant::now() >= deadline {
                // SAFETY: as above; UCX finishes the operation internally and invokes
                // no callback for it (none was set).
                unsafe { api().ucp_request_free(request) };
                return Err(Error::Timeout { op, timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX) });
            }
            // A peer that is not progressing (TCP) would otherwise cost a whole core.
            if idle_rounds > 1000 {
                std::thread::sleep(Duration::from_micros(50));
            } else if idle_rounds > 100 {
                std::thread::yield_now();
            }
        }
    }

    pub(crate) fn handle(&self) -> sys::ucp_worker_h {
        self.handle
    }

    pub(crate) fn graveyard(&self) -> &Arc<Graveyard> {
        &self.graveyard
    }
}
