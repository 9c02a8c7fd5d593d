//! The fabric and domain one worker opens, shared by it and every region registered
//! with it: the lowest room of the provider, and the lock every libfabric call takes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use libfabric_sys as sys;

/// Fabric and domain, shared by the worker and every region; closed when the last
/// of them goes. Holds the lock that serialises every libfabric call (module docs).
pub(crate) struct DomainInner {
    pub(super) lock: Mutex<()>,
    pub(super) api: &'static sys::Api,
    pub(super) infos: *mut sys::fi_info,
    pub(super) fabric: *mut sys::fid_fabric,
    pub(crate) domain: *mut sys::fid_domain,
    pub(super) mr_local: bool,
    pub(super) virt_addr: bool,
    /// Without `FI_MR_PROV_KEY` (tcp) the application picks the keys, unique per domain.
    pub(super) prov_key: bool,
    pub(super) next_key: AtomicU64,
}

// SAFETY: the raw handles are only used under `lock` (or read-only: the fi_info list
// after fi_getinfo), and closed once in Drop.
unsafe impl Send for DomainInner {}
// SAFETY: as above.
unsafe impl Sync for DomainInner {}

impl DomainInner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `requested_key` for the next registration: ignored under
    /// `FI_MR_PROV_KEY`, otherwise unique in this domain.
    pub(crate) fn requested_key(&self) -> u64 {
        if self.prov_key { 0 } else { self.next_key.fetch_add(1, Ordering::Relaxed) }
    }
}

impl Drop for DomainInner {
    fn drop(&mut self) {
        // SAFETY: every region and the worker hold an Arc to this value, so their
        // registrations and endpoint objects are closed; each handle is closed once,
        // domain before fabric, and the info list freed last.
        unsafe {
            if !self.domain.is_null() {
                sys::fi_close(&mut (*self.domain).fid);
            }
            if !self.fabric.is_null() {
                sys::fi_close(&mut (*self.fabric).fid);
            }
            (self.api.fi_freeinfo)(self.infos);
        }
    }
}
