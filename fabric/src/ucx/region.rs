//! Local memory allocated and registered through UCX.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr;
use std::sync::Arc;

use ucx_sys as sys;

use super::api;

use super::ContextInner;
use crate::error::{Error, Result, check};
use crate::memory::SharedMemory;

/// Local memory allocated through UCX and registered for remote access
/// (`ucp_mem_map` with `UCP_MEM_MAP_ALLOCATE`). Dereferences to [`SharedMemory`] for
/// byte access; its [`SharedMemory::addr`] and packed key
/// ([`crate::transport::Region::packed_key`]) are what a peer needs.
///
/// Not `Clone`: one owner decides when the region goes. Dropping it unregisters and
/// frees the memory once no posted operation uses it any more; the *peer* must have
/// stopped using it before that (the control plane's `DeregisterRegion`).
pub struct Region {
    mem: SharedMemory,
    inner: Arc<RegionInner>,
}

pub(crate) struct RegionInner {
    ctx: Arc<ContextInner>,
    memh: sys::ucp_mem_h,
    /// Memory the caller lent ([`Region::lent`]): kept until after `ucp_mem_unmap`.
    _lent: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: memh is an opaque handle; the only calls made with it (ucp_rkey_pack,
// ucp_mem_unmap, use as a local memh in RMA) are guarded by the context lock
// (mt_workers_shared) or the worker lock (UCS_THREAD_MODE_MULTI).
unsafe impl Send for RegionInner {}
// SAFETY: as above.
unsafe impl Sync for RegionInner {}

impl Drop for RegionInner {
    fn drop(&mut self) {
        // SAFETY: memh came from ucp_mem_map on this context, which the Arc keeps
        // alive; every posted operation using the memory holds an Arc to this value,
        // so none is in flight. Failure would leak the mapping; nothing to do then.
        unsafe { api().ucp_mem_unmap(self.ctx.handle(), self.memh) };
    }
}

impl Region {
    /// Registers `len` bytes at `ptr` that the caller mapped (`ucp_mem_map` without
    /// `ALLOCATE`); `keep` holds the mapping and is dropped after `ucp_mem_unmap`.
    /// Such memory is a source or target of this process's own puts and gets; on
    /// shared-memory transports peers cannot attach it (see the crate docs).
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` must be mapped read/write for as long as `keep` lives.
    pub(crate) unsafe fn lent(
        ctx: Arc<ContextInner>,
        ptr: *mut u8,
        len: usize,
        keep: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<Region> {
        let params = sys::ucp_mem_map_params_t {
            field_mask: u64::from(sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH),
            address: ptr.cast(),
            length: len,
            ..Default::default()
        };
        let mut memh: sys::ucp_mem_h = ptr::null_mut();
        // SAFETY: the context is live (ctx); params names the caller's mapping, which
        // stays mapped while `keep` lives (caller's contract), and `keep` is dropped
        // only after ucp_mem_unmap (RegionInner's Drop runs before its fields drop).
        let status = unsafe { api().ucp_mem_map(ctx.handle(), &params, &mut memh) };
        check("register lent memory (ucp_mem_map)", status)?;
        let inner = Arc::new(RegionInner { ctx, memh, _lent: Some(keep) });
        // SAFETY: as above; the Region holds `inner` for as long as `mem`.
        let mem = unsafe { SharedMemory::new(ptr, len) };
        Ok(Region { mem, inner })
    }

    pub(crate) fn allocate(ctx: Arc<ContextInner>, len: usize) -> Result<Region> {
        if len == 0 || len > isize::MAX as usize {
            return Err(Error::OutOfRange {
                what: "allowed region size (1 byte to isize::MAX)",
                offset: 0,
                len: len as u64,
                bound: isize::MAX as u64,
            });
        }
        let params = sys::ucp_mem_map_params_t {
            field_mask: u64::from(
                sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
                    | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
                    | sys::UCP_MEM_MAP_PARAM_FIELD_FLAGS,
            ),
            address: ptr::null_mut(),
            length: len,
            flags: sys::UCP_MEM_MAP_ALLOCATE,
            ..Default::default()
        };
        let mut memh: sys::ucp_mem_h = ptr::null_mut();
        // SAFETY: the context is live (ctx); params is initialised and its field mask
        // names only set fields; memh is writable.
        let status = unsafe { api().ucp_mem_map(ctx.handle(), &params, &mut memh) };
        check("allocate region (ucp_mem_map ALLOCATE)", status)?;
        let inner = Arc::new(RegionInner { ctx, memh, _lent: None });

        let mut attr = sys::ucp_mem_attr_t {
            field_mask: u64::from(sys::UCP_MEM_ATTR_FIELD_ADDRESS | sys::UCP_MEM_ATTR_FIELD_LENGTH),
            ..Default::default()
        };
        // SAFETY: memh is live (inner); attr is writable and its mask names the fields
        // UCX should fill.
        let status = unsafe { api().ucp_mem_query(inner.memh, &mut attr) };
        check("query region address (ucp_mem_query)", status)?;
        if attr.address.is_null() || attr.length < len {
            return Err(Error::OutOfRange {
                what: "memory UCX allocated",
                offset: 0,
                len: len as u64,
                bound: attr.length as u64,
            });
        }
        // SAFETY: UCX allocated attr.length >= len bytes at attr.address, readable and
        // writable, mapped until ucp_mem_unmap, which only runs when `inner` drops; the
        // Region holds `inner` for at least as long as `mem`.
        let mem = unsafe { SharedMemory::new(attr.address.cast(), len) };
        Ok(Region { mem, inner })
    }

    pub(crate) fn inner(&self) -> &Arc<RegionInner> {
        &self.inner
    }
}

impl RegionInner {
    pub(crate) fn memh(&self) -> sys::ucp_mem_h {
        self.memh
    }

    pub(crate) fn context(&self) -> &Arc<ContextInner> {
        &self.ctx
    }
}

impl Deref for Region {
    type Target = SharedMemory;
    fn deref(&self) -> &SharedMemory {
        &self.mem
    }
}

impl DerefMut for Region {
    fn deref_mut(&mut self) -> &mut SharedMemory {
        &mut self.mem
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region").field("mem", &self.mem).finish()
    }
}

impl crate::transport::Region for Region {
    /// The packed remote key of this region (`ucp_rkey_pack`): opaque bytes to send to
    /// the peer along with [`SharedMemory::addr`] and [`SharedMemory::len`].
    ///
    /// It is a capability: over RDMA it grants remote access to the region, and over
    /// shared memory any process of the same user holding it can attach the segment.
    /// Send it only over the authenticated control plane; never log it.
    fn packed_key(&self) -> Result<Vec<u8>> {
        let mut buf: *mut std::ffi::c_void = ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: context and memh are live; buf and size are writable.
        let status = unsafe { api().ucp_rkey_pack(self.inner.ctx.handle(), self.inner.memh, &mut buf, &mut size) };
        check("pack remote key (ucp_rkey_pack)", status)?;
        // SAFETY: on success UCX returns size readable bytes at buf.
        let key = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), size) }.to_vec();
        // SAFETY: buf came from ucp_rkey_pack and is released exactly once.
        unsafe { api().ucp_rkey_buffer_release(buf) };
        Ok(key)
    }
}
