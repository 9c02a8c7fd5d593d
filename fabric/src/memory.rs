//! Bytes shared with a peer: local regions and direct mappings of remote ones.
//!
//! # How memory a peer writes is reached
//!
//! A region is written by another process or a DMA engine at times Rust cannot see.
//! A `&[u8]` promises that nothing changes the bytes while it lives, and a `&mut [u8]`
//! that nothing else touches them; over memory a peer writes concurrently, neither
//! holds. So access from `&self`, which several threads use at once on the agent, goes
//! through views that are never Rust references: [`SharedMemory::bytes`] and
//! [`SharedMemory::bytes_mut`] hand out [`HostBytes`] / [`HostBytesMut`] (pointer,
//! length, lifetime; raw copies, and `pread`/`pwrite` or C calls on the pointer), and
//! [`SharedMemory::read_at`] copies out. Several views of one range may exist at once
//! (a host that submits overlapping requests makes two agent threads fill the same
//! bytes): that changes which bytes the host receives, and nothing in this process.
//! The bytes are `u8`, with no invalid values, and every access is bounds-checked
//! against the region's length; content read from a peer's memory is untrusted input,
//! copied once before it is used (see the `host-bytes` crate docs).
//!
//! [`SharedMemory::as_slice`] and [`SharedMemory::as_mut_slice`] are `unsafe`: a Rust
//! slice is sound only while no other process or device writes the bytes, and nothing
//! here can know that. Their callers promise it (this crate's tests, over memory their
//! own completed transfers filled); the agent and the host's shim use the views only.
//!
//! Ring indices are words both sides access concurrently by design; read and write
//! them only through the atomic accessors (`load_u64_acquire`, `store_u64_release`,
//! ...), never through a slice or a view, and keep them in a range no slice is held over.

use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use host_bytes::{HostBytes, HostBytesMut};

/// A contiguous range of bytes that a peer may read or write (see the module docs for
/// the access discipline). Reached through [`crate::ucx::Region`] (local memory,
/// registered) or [`MappedRemote`] (a peer's region mapped into this process).
///
/// Offsets are relative to the start of the range. Accessors panic on out-of-range or
/// misaligned offsets, like slice indexing: offsets come from validated entries, and a
/// bad one is a bug in the caller.
pub struct SharedMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: SharedMemory is a pointer and a length to memory that is not owned by any
// thread; the owning type (Region, MappedRemote) keeps it mapped. All accesses are
// bounds-checked and the concurrency discipline is documented on the module.
unsafe impl Send for SharedMemory {}
// SAFETY: shared (&self) access only reads the bytes, or writes them through atomics
// or raw copies that the module docs restrict to ranges no slice covers.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// # Safety
    ///
    /// `ptr` must be non-null and valid for reads and writes of `len` bytes for as long
    /// as the returned value (and anything borrowing from it) lives; the caller's type
    /// must keep the mapping alive that long. `len` must not exceed `isize::MAX`.
    pub(crate) unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        SharedMemory { ptr: NonNull::new(ptr).expect("SharedMemory::new with a null pointer"), len }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the range is empty (never for regions: they are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the range in this process's address space, for handing to C (the shim's
    /// C ABI) or to `read(2)`-style calls.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Start of the range as the integer address a peer needs for remote access to a
    /// local region (what goes into `RegisterRegion`).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The bytes as a Rust slice. Prefer [`SharedMemory::bytes`] or
    /// [`SharedMemory::read_at`], which need no promise.
    ///
    /// # Safety
    ///
    /// While the slice lives, no other process, device or peer writes these bytes (no
    /// transfer into them is in flight, and none starts), and no view of them writes
    /// in this process. A peer that holds the region's key may write it at any time:
    /// a region registered with a peer qualifies only while the protocol gives it no
    /// request on it.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr/len describe a live mapping (constructor contract); u8 has no
        // invalid values; the caller promises no one writes the bytes while the slice
        // lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes as a mutable Rust slice. Prefer [`SharedMemory::write_at`] or
    /// [`SharedMemory::bytes_mut`], which need no promise.
    ///
    /// # Safety
    ///
    /// As for [`SharedMemory::as_slice`], and no other process, device or peer reads
    /// or writes these bytes while the slice lives. `&mut self` excludes other Rust
    /// access in this process.
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self guarantees no other Rust reference to
        // these bytes exists in this process for the lifetime of the result.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Copies `out.len()` bytes starting at `offset` into `out`.
    ///
    /// # Panics
    /// If the range lies outside the memory.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) {
        let src = self.checked(offset, out.len(), 1);
        // SAFETY: checked() proved src..src+len lies inside the mapping; out is a
        // distinct Rust buffer, so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) }
    }

    /// A writable view of `len` bytes at `offset`, from a shared reference: several
    /// threads fill *disjoint* ranges of one mapped host region at once (the agent's
    /// I/O workers `pread` files straight into it). A view, not a `&mut [u8]`: the peer
    /// may read and write the bytes meanwhile, and a peer that submits overlapping
    /// requests makes two views overlap (see the module docs).
    ///
    /// # Panics
    /// If the range lies outside the memory.
    pub fn bytes_mut(&self, offset: usize, len: usize) -> HostBytesMut<'_> {
        let p = self.checked(offset, len, 1);
        // SAFETY: checked() proved p..p+len lies inside the mapping, which the owning
        // type keeps mapped and writable at least as long as &self. No Rust reference to
        // the bytes coexists with the view in this process: as_mut_slice needs &mut
        // self, which the view's borrow of &self excludes, and as_slice is restricted
        // (module docs) to memory nobody writes meanwhile, which a view would.
        unsafe { HostBytesMut::from_raw_parts(p, len) }
    }

    /// A view of `len` bytes at `offset`, for reading (writing a range to a file). The
    /// peer may write the bytes meanwhile: copy once, use the copy.
    ///
    /// # Panics
    /// If the range lies outside the memory.
    pub fn bytes(&self, offset: usize, len: usize) -> HostBytes<'_> {
        let p = self.checked(offset, len, 1);
        // SAFETY: as in bytes_mut; the view only reads.
        unsafe { HostBytes::from_raw_parts(p, len) }
    }

    /// Copies `data` into the memory at `offset`.
    ///
    /// # Panics
    /// If the range lies outside the memory.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) {
        let dst = self.checked(offset, data.len(), 1);
        // SAFETY: checked() proved the destination lies inside the mapping; &mut self
        // excludes Rust readers; data is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) }
    }

    /// Atomically loads the naturally aligned `u64` at `offset` with acquire ordering:
    /// everything the writer stored before its release store of this word is visible
    /// afterwards. For ring indices written by the peer.
    ///
    /// # Panics
    /// If `offset` is out of range or the address is not 8-byte aligned.
    pub fn load_u64_acquire(&self, offset: usize) -> u64 {
        self.atomic_u64(offset).load(Ordering::Acquire)
    }

    /// Atomically stores `value` at `offset` with release ordering (for ring indices).
    ///
    /// # Panics
    /// If `offset` is out of range or the address is not 8-byte aligned.
    pub fn store_u64_release(&self, offset: usize, value: u64) {
        self.atomic_u64(offset).store(value, Ordering::Release)
    }

    /// 32-bit twin of [`SharedMemory::load_u64_acquire`].
    ///
    /// # Panics
    /// If `offset` is out of range or the address is not 4-byte aligned.
    pub fn load_u32_acquire(&self, offset: usize) -> u32 {
        self.atomic_u32(offset).load(Ordering::Acquire)
    }

    /// 32-bit twin of [`SharedMemory::store_u64_release`].
    ///
    /// # Panics
    /// If `offset` is out of range or the address is not 4-byte aligned.
    pub fn store_u32_release(&self, offset: usize, value: u32) {
        self.atomic_u32(offset).store(value, Ordering::Release)
    }

    /// The `u64` at `offset` as an atomic, for orderings or read-modify-write
    /// operations the shortcuts above do not cover. Atomic RMW is atomic only against
    /// CPU accesses (shared memory); an RDMA NIC writing the word is not covered.
    ///
    /// # Panics
    /// If `offset` is out of range or the address is not 8-byte aligned.
    pub fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        let p = self.checked(offset, 8, 8);
        // SAFETY: checked() proved 8 in-range bytes at an 8-aligned address, valid for
        // the lifetime of &self; AtomicU64 has the size and alignment of u64 and all
        // concurrent accesses to index words are atomic by the module's discipline.
        unsafe { AtomicU64::from_ptr(p.cast::<u64>()) }
    }

    /// The `u32` at `offset` as an atomic; see [`SharedMemory::atomic_u64`].
    ///
    /// # Panics
    /// If `offset` is out of range or the address is not 4-byte aligned.
    pub fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        let p = self.checked(offset, 4, 4);
        // SAFETY: as in atomic_u64, with 4 bytes and 4-byte alignment.
        unsafe { AtomicU32::from_ptr(p.cast::<u32>()) }
    }

    /// Pointer to `len` in-range bytes at `offset`, aligned to `align`, or a panic.
    fn checked(&self, offset: usize, len: usize, align: usize) -> *mut u8 {
        let end = offset.checked_add(len);
        assert!(
            end.is_some_and(|end| end <= self.len),
            "shared memory access {offset}+{len} outside {} bytes",
            self.len
        );
        // The pointer is derived inside the allocation, so wrapping_add stays in it.
        let p = self.ptr.as_ptr().wrapping_add(offset);
        assert!(
            (p as usize).is_multiple_of(align),
            "shared memory access at offset {offset} is not {align}-byte aligned"
        );
        p
    }
}

impl fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedMemory")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

/// A peer's region mapped directly into this process (UCX `ucp_rkey_ptr` over shared
/// memory). The agent uses it to `read(2)` a file straight into host memory, with no
/// staging copy and no put. Dereferences to [`SharedMemory`]: the views of
/// [`SharedMemory::bytes_mut`] and [`SharedMemory::bytes`] are the data path (never
/// `as_slice`/`as_mut_slice`: the host writes this memory when it likes),
/// `store_u64_release` publishes ring tails.
///
/// Keeps the remote key (and so UCX's attachment of the segment) alive. The mapping
/// stays valid even if the peer exits: the segment is freed when the last process
/// detaches it.
pub struct MappedRemote {
    mem: SharedMemory,
    remote_addr: u64,
    backing: Option<SharedMapping>,
    _key: Arc<dyn Any + Send + Sync>,
}

impl MappedRemote {
    /// # Safety
    ///
    /// Same as [`SharedMemory::new`]; `key` must keep the mapping of `ptr..ptr+len`
    /// alive for as long as it is alive. `backing`, where known, holds that range.
    pub(crate) unsafe fn new(
        ptr: *mut u8,
        len: usize,
        remote_addr: u64,
        backing: Option<SharedMapping>,
        key: Arc<dyn Any + Send + Sync>,
    ) -> Self {
        MappedRemote {
            // SAFETY: forwarded contract.
            mem: unsafe { SharedMemory::new(ptr, len) },
            remote_addr,
            backing,
            _key: key,
        }
    }

    /// The shared mapping of the object that holds this memory (a shared-memory
    /// transport's segment), where the transport checked it.
    pub fn backing(&self) -> Option<&SharedMapping> {
        self.backing.as_ref()
    }

    /// The peer's address of the first mapped byte (what the mapping was asked for).
    pub fn remote_addr(&self) -> u64 {
        self.remote_addr
    }
}

impl Deref for MappedRemote {
    type Target = SharedMemory;
    fn deref(&self) -> &SharedMemory {
        &self.mem
    }
}

impl DerefMut for MappedRemote {
    fn deref_mut(&mut self) -> &mut SharedMemory {
        &mut self.mem
    }
}

impl fmt::Debug for MappedRemote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedRemote")
            .field("remote_addr", &format_args!("{:#x}", self.remote_addr))
            .field("local", &self.mem)
            .finish()
    }
}

/// The shared mappings of one object that hold a range of this process's memory, per
/// `/proc/self/maps`: one or more read-write shared (`rw-s`) mappings, contiguous in
/// memory and in the object (one mapping split by `mprotect` shows as several lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedMapping {
    /// Where the first of them starts and the last ends, in this process.
    pub start: usize,
    pub end: usize,
    /// The offset of `start` in the object.
    pub object_offset: u64,
    /// Where the first of them ends (the name of its `/proc/self/map_files` entry).
    pub first_end: usize,
}

impl SharedMapping {
    /// The path that opens the object (`/proc/self/map_files`: opening it needs
    /// `CAP_SYS_ADMIN` or `CAP_CHECKPOINT_RESTORE`).
    pub fn map_file(&self) -> String {
        format!("/proc/self/map_files/{:x}-{:x}", self.start, self.first_end)
    }
}

/// The shared mappings of one object that hold all of `[addr, addr+len)`, if any.
///
/// UCX maps a peer's shared-memory segment whole when it unpacks the key, and its
/// shared-memory put is a plain `memcpy` to `mapping + offset` with no bounds check.
/// A peer that declares a region longer than its segment would otherwise direct our
/// writes past the end of that mapping, into whatever the agent has mapped next.
pub(crate) fn shared_mapping_of(addr: usize, len: usize) -> std::io::Result<Option<SharedMapping>> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    Ok(mapping_of(&maps, addr, len))
}

fn mapping_of(maps: &str, addr: usize, len: usize) -> Option<SharedMapping> {
    let end = addr.checked_add(len)?;
    // (start, end, read-write shared, offset, device+inode) per line.
    let parsed = maps.lines().filter_map(|line| {
        let mut fields = line.split_whitespace();
        let (start, stop) = fields.next()?.split_once('-')?;
        let perms = fields.next()?;
        let offset = fields.next()?;
        let dev = fields.next()?;
        let inode = fields.next()?;
        Some((
            usize::from_str_radix(start, 16).ok()?,
            usize::from_str_radix(stop, 16).ok()?,
            perms.as_bytes().get(3) == Some(&b's') && perms.starts_with("rw"),
            u64::from_str_radix(offset, 16).ok()?,
            (dev, inode),
        ))
    });
    let mut found: Option<(SharedMapping, (&str, &str))> = None;
    for (start, stop, shared, offset, object) in parsed {
        match &mut found {
            None if start <= addr && addr < stop => {
                if !shared {
                    return None;
                }
                let mapping = SharedMapping { start, end: stop, object_offset: offset, first_end: stop };
                if end <= stop {
                    return Some(mapping);
                }
                found = Some((mapping, object));
            }
            Some((mapping, first)) if start == mapping.end => {
                let in_object = mapping.object_offset.checked_add((mapping.end - mapping.start) as u64);
                if !shared || *first != object || in_object != Some(offset) {
                    return None;
                }
                mapping.end = stop;
                if end <= stop {
                    return Some(*mapping);
                }
            }
            Some(_) => return None,
            None => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(buf: &mut [u64]) -> SharedMemory {
        // SAFETY: the test keeps `buf` alive and unaliased while the value is used.
        unsafe { SharedMemory::new(buf.as_mut_ptr().cast(), buf.len() * 8) }
    }

    #[test]
    fn atomics_and_copies_round_trip() {
        let mut buf = [0u64; 4];
        let mut m = mem(&mut buf);
        m.store_u64_release(8, 0x1122_3344_5566_7788);
        assert_eq!(m.load_u64_acquire(8), 0x1122_3344_5566_7788);
        m.store_u32_release(4, 7);
        assert_eq!(m.load_u32_acquire(4), 7);
        m.write_at(16, b"hello");
        let mut out = [0u8; 5];
        m.read_at(16, &mut out);
        assert_eq!(&out, b"hello");
        // SAFETY: nothing but this test touches `buf` while the slices live.
        assert_eq!(unsafe { &m.as_slice()[16..21] }, b"hello");
        // SAFETY: as above.
        unsafe { m.as_mut_slice()[31] = 9 };
        // SAFETY: as above.
        assert_eq!(unsafe { m.as_slice()[31] }, 9);
    }

    #[test]
    fn views_fill_and_drain_ranges() {
        let mut buf = [0u64; 4];
        let m = mem(&mut buf);
        // Two views from &self at once, as two I/O threads take them.
        let (mut a, mut b) = (m.bytes_mut(0, 8), m.bytes_mut(8, 8));
        a.copy_from_slice(b"abcdefgh");
        b.slice_mut(..3).copy_from_slice(b"xyz");
        assert_eq!(m.bytes(6, 5).to_vec(), b"ghxyz");
        let mut out = [0u8; 4];
        m.read_at(4, &mut out);
        assert_eq!(&out, b"efgh");
        assert!(m.bytes_mut(32, 0).is_empty());
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn view_out_of_range_panics() {
        let mut buf = [0u64; 2];
        mem(&mut buf).bytes_mut(10, 7);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_range_panics() {
        let mut buf = [0u64; 2];
        mem(&mut buf).load_u64_acquire(9);
    }

    #[test]
    #[should_panic(expected = "aligned")]
    fn misaligned_panics() {
        let mut buf = [0u64; 2];
        mem(&mut buf).load_u64_acquire(4);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn offset_overflow_panics() {
        let mut buf = [0u64; 2];
        let mut out = [0u8; 2];
        mem(&mut buf).read_at(usize::MAX, &mut out);
    }

    const MAPS: &str = "\
7f0000000000-7f0000001000 rw-s 00000000 00:01 42   /SYSV00000000 (deleted)
7f0000001000-7f0000002000 rw-s 00001000 00:01 42   /SYSV00000000 (deleted)
7f0000002000-7f0000003000 rw-p 00000000 00:00 0
7f0000003000-7f0000004000 rw-s 00000000 00:19 77   /dev/shm/ucx_posix (deleted)
7f0000004000-7f0000005000 rw-s 00002000 00:19 77   /dev/shm/ucx_posix (deleted)
";

    #[test]
    fn mapping_rules() {
        let base = 0x7f00_0000_0000usize;
        let sysv = SharedMapping { start: base, end: base + 0x1000, object_offset: 0, first_end: base + 0x1000 };
        assert_eq!(mapping_of(MAPS, base, 0x1000), Some(sysv));
        assert_eq!(mapping_of(MAPS, base + 0x10, 0x20), Some(sysv), "the whole mapping, not the range");
        assert_eq!(
            mapping_of(MAPS, base + 0x800, 0x1000),
            Some(SharedMapping { end: base + 0x2000, ..sysv }),
            "spans same-object pieces"
        );
        assert_eq!(sysv.map_file(), "/proc/self/map_files/7f0000000000-7f0000001000");
        assert_eq!(mapping_of(MAPS, base + 0x800, 0x1900), None, "runs into a private mapping");
        assert_eq!(mapping_of(MAPS, base + 0x2000, 8), None, "private mapping");
        assert_eq!(mapping_of(MAPS, base + 0x3800, 0x1000), None, "the object's next piece is elsewhere in it");
        assert_eq!(
            mapping_of(MAPS, base + 0x3000, 0x1000),
            Some(SharedMapping {
                start: base + 0x3000,
                end: base + 0x4000,
                object_offset: 0,
                first_end: base + 0x4000
            })
        );
        assert_eq!(mapping_of(MAPS, base + 0x4000, 0x1001), None, "past the last mapping");
        assert_eq!(mapping_of(MAPS, 0x1000, 8), None, "unmapped");
        assert_eq!(mapping_of(MAPS, usize::MAX, 2), None, "overflow");
    }
}
