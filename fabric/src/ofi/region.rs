//! Local memory registered with a libfabric domain.

use std::ffi::c_void;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr;
use std::sync::Arc;

use libfabric_sys as sys;

use super::check;
use super::domain::DomainInner;
use crate::error::{Error, Result};
use crate::memory::SharedMemory;

/// Leading bytes of a packed ofi key: a UCX key (or garbage) is refused at unpack.
pub(crate) const KEY_MAGIC: &[u8; 4] = b"ofi1";

/// A memory registration (`fid_mr`), closed on drop under the domain lock.
pub(crate) struct Mr {
    domain: Arc<DomainInner>,
    mr: *mut sys::fid_mr,
}

// SAFETY: the fid is only used under the domain lock (desc/key reads are plain loads
// of fields written at registration) and closed once in Drop.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `len` bytes at `buf` for `access` (`FI_*` bits).
    ///
    /// # Safety
    ///
    /// `buf..buf+len` must stay mapped until the returned value is dropped.
    pub(crate) unsafe fn register(domain: Arc<DomainInner>, buf: *const u8, len: usize, access: u64) -> Result<Mr> {
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        let ret = {
            let _guard = domain.lock();
            // SAFETY: the domain is open (held by `domain`); buf..buf+len is mapped
            // (caller's contract); mr is writable.
            unsafe {
                sys::fi_mr_reg(
                    domain.domain,
                    buf.cast(),
                    len,
                    access,
                    0,
                    domain.requested_key(),
                    0,
                    &mut mr,
                    ptr::null_mut(),
                )
            }
        };
        check("register memory (fi_mr_reg)", ret)?;
        Ok(Mr { domain, mr })
    }

    /// The descriptor to pass for local buffers when the provider wants `FI_MR_LOCAL`.
    pub(crate) fn desc(&self) -> *mut c_void {
        // SAFETY: mr is live; fi_mr_desc reads a field of it.
        unsafe { sys::fi_mr_desc(self.mr) }
    }

    /// The remote key (`fi_mr_key`).
    pub(crate) fn key(&self) -> u64 {
        // SAFETY: mr is live; fi_mr_key reads a field of it.
        unsafe { sys::fi_mr_key(self.mr) }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let _guard = self.domain.lock();
        // SAFETY: mr came from fi_mr_reg and is closed exactly once; whoever posted
        // operations with it holds this value until their completion, so none is in
        // flight.
        unsafe { sys::fi_close(&mut (*self.mr).fid) };
    }
}

/// Local memory mapped anonymously and registered with the domain for local and
/// remote read/write. Dereferences to [`SharedMemory`]; its [`SharedMemory::addr`]
/// and packed key ([`crate::transport::Region::packed_key`]) are what a peer needs.
///
/// Not `Clone`: dropping it closes the registration (once no posted operation uses
/// it) and unmaps the memory; the peer must have stopped using it before.
pub struct Region {
    mem: SharedMemory,
    pub(crate) inner: Arc<RegionInner>,
}

pub(crate) struct RegionInner {
    // Field order is drop order: the registration is closed before the memory it
    // covers is unmapped.
    mr: Mr,
    _memory: Memory,
}

/// What a region's bytes are: an anonymous mapping of its own, or memory the caller
/// lent (kept alive by the value it gave, see [`Region::lent`]).
#[allow(dead_code)] // held for their drops only
enum Memory {
    Own(Mapping),
    Lent(Arc<dyn std::any::Any + Send + Sync>),
}

/// An anonymous mapping, unmapped on drop.
struct Mapping {
    ptr: *mut c_void,
    len: usize,
}

// SAFETY: the mapping is owned memory, not tied to a thread; unmapped once in Drop.
unsafe impl Send for Mapping {}
// SAFETY: Mapping has no methods taking &self.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap and are unmapped once.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// What a region is registered for: local and remote read/write, sends and receives.
fn region_access() -> u64 {
    u64::from(sys::FI_READ | sys::FI_WRITE | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE)
        | u64::from(sys::FI_SEND | sys::FI_RECV)
}

impl Region {
    pub(crate) fn allocate(domain: Arc<DomainInner>, len: usize) -> Result<Region> {
        if len == 0 || len > isize::MAX as usize / 2 {
            return Err(Error::OutOfRange {
                what: "allowed region size (1 byte to isize::MAX / 2)",
                offset: 0,
                len: len as u64,
                bound: isize::MAX as u64 / 2,
            });
        }
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
        let map_len = len.div_ceil(page) * page;
        // SAFETY: an anonymous private mapping at an address of the kernel's choice;
        // no file, no fixed address.
        let map = unsafe {
            libc::mmap(
                ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(Error::Io { op: "map region memory (mmap)", source: std::io::Error::last_os_error() });
        }
        let mapping = Mapping { ptr: map, len: map_len };
        let access = region_access();
        // SAFETY: the mapping lives in `mapping`, which is moved into RegionInner and
        // (by field order there) dropped after the Mr; on error it is unmapped here,
        // after the failed registration.
        let mr = unsafe { Mr::register(domain, map.cast(), map_len, access) }?;
        let inner = Arc::new(RegionInner { mr, _memory: Memory::Own(mapping) });
        // SAFETY: map..map+len is mapped read/write until RegionInner is dropped,
        // which the Region outlives through its Arc.
        let mem = unsafe { SharedMemory::new(map.cast(), len) };
        Ok(Region { mem, inner })
    }
}

impl Region {
    /// Registers `len` bytes at `ptr` that the caller mapped (memory shared with
    /// another process, say), for local and remote read/write; `keep` holds the mapping
    /// and is dropped after the registration is closed.
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` must be mapped read/write for as long as `keep` lives.
    pub(crate) unsafe fn lent(
        domain: Arc<DomainInner>,
        ptr: *mut u8,
        len: usize,
        keep: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<Region> {
        let access = region_access();
        // SAFETY: the caller keeps the range mapped while `keep` lives, and RegionInner
        // drops `keep` after the Mr (field order).
        let mr = unsafe { Mr::register(domain, ptr, len, access) }?;
        let inner = Arc::new(RegionInner { mr, _memory: Memory::Lent(keep) });
        // SAFETY: as above; the Region holds `inner` for as long as `mem`.
        let mem = unsafe { SharedMemory::new(ptr, len) };
        Ok(Region { mem, inner })
    }
}

impl RegionInner {
    pub(crate) fn desc(&self) -> *mut c_void {
        self.mr.desc()
    }

    pub(crate) fn domain(&self) -> &Arc<DomainInner> {
        &self.mr.domain
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
    /// The packed remote key: `"ofi1"` and the 64-bit `fi_mr_key`, little-endian.
    /// Send it with [`SharedMemory::addr`] and the length over the control plane.
    ///
    /// A capability for remote access: send it only over the authenticated control
    /// plane, never log it. (On shm's CMA path the provider does not check keys at
    /// all: same-user processes get no isolation from each other, as with UCX.)
    fn packed_key(&self) -> Result<Vec<u8>> {
        let mut out = KEY_MAGIC.to_vec();
        out.extend_from_slice(&self.inner.mr.key().to_le_bytes());
        Ok(out)
    }
}
