//! Views of memory that another party may write at any time: [`HostBytes`] (to read
//! from) and [`HostBytesMut`] (to write into).
//!
//! On shared memory the agent maps the host's registered region into its own address
//! space and `pread`s files straight into it. The host is another process, untrusted
//! and running concurrently: it may write any byte of its region at any moment, and a
//! host that submits overlapping requests makes two agent threads fill the same bytes
//! at once. A `&[u8]` over such memory promises the compiler that the bytes do not
//! change while it lives, and a `&mut [u8]` that nothing else reads or writes them;
//! neither holds, so making either is undefined behaviour in Rust's model, whatever
//! the code then does with it.
//!
//! These types are a pointer, a length and a lifetime, and never produce a Rust
//! reference to the memory. The bytes move only by raw copies
//! ([`std::ptr::copy_nonoverlapping`]) into or out of memory the agent owns, or by
//! handing the pointer to the kernel (`pread`/`pwrite`) or to C (DAOS scatter/gather
//! lists). This is the shape of `VolatileSlice` in rust-vmm's `vm-memory`, which
//! Firecracker uses for guest memory, the same problem one level down.
//!
//! What that buys, and what it does not: the compiler assumes nothing about the bytes
//! between two accesses, so no optimisation rests on a promise the host can break. A
//! racing writer can still leave *torn* bytes: a copy out may see part of an old and
//! part of a new value, and two copies out of the same range may differ. So code that
//! reads host memory copies it once into memory it owns and works only on that copy
//! (decode, check, encrypt), and treats the content as untrusted input. Bytes are
//! `u8`, with no invalid values, so a torn copy is wrong data, never an invalid value.
//!
//! The lifetime `'a` ties a view to whatever keeps the memory mapped (a borrowed
//! region, a borrowed slice); it does not claim exclusive access. A view made from a
//! Rust slice (`From<&mut [u8]>`, `From<&[u8]>`) borrows it for `'a`, so agent-owned
//! buffers pass through the same interfaces at no cost.
//!
//! Why a crate of its own: both the data plane (`fabric`, which maps the memory) and
//! the storage backends (`dpuio-backend` and the crates that implement it, which fill
//! and drain it) need the type, and neither may depend on the other. The host's shim
//! uses it too, for its own registered regions, which the agent writes while a request
//! on them is in flight: the same shape on both sides of the ring. It is the only
//! `unsafe` below them: the constructor from a raw pointer, the copies, and the system
//! calls on the pointer.
//!
//! What it deliberately does not do: atomics or ordering (ring indices are words read
//! and written with `fabric::SharedMemory`'s atomic accessors), mapping or keeping
//! memory mapped (the owner of the mapping does), or any validation of the content.

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;

/// `len` bytes at `ptr`, which this process may read while another party (the host,
/// a device, another agent thread filling an overlapping range) writes them. See the
/// crate docs: copy out once, then use the copy.
#[derive(Clone, Copy)]
pub struct HostBytes<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _memory: PhantomData<&'a [u8]>,
}

/// `len` bytes at `ptr`, which this process may write while another party reads or
/// writes them. Not `Clone`: like a `&mut`, one view is one writer in this process's
/// code (sub-views borrow it), although overlapping views of the same memory may exist
/// elsewhere, which is sound because no view is a reference.
pub struct HostBytesMut<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _memory: PhantomData<&'a mut [u8]>,
}

// SAFETY: a view is a pointer and a length into memory that is valid for 'a whichever
// thread uses it (constructor contract); it owns nothing thread-bound, and every access
// through it is a raw copy or a system call, which is as sound from one thread as from
// another (concurrent writers are the accepted condition of the whole type).
unsafe impl Send for HostBytes<'_> {}
// SAFETY: &HostBytes only reads (raw copies out), as above.
unsafe impl Sync for HostBytes<'_> {}
// SAFETY: as for HostBytes.
unsafe impl Send for HostBytesMut<'_> {}
// SAFETY: &HostBytesMut only reads (raw copies out, pointers); writing needs &mut.
unsafe impl Sync for HostBytesMut<'_> {}

impl<'a> HostBytes<'a> {
    /// A view of `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` must be non-null and valid for reads of `len` bytes for all of `'a` (the
    /// memory stays mapped and is not freed), and `len` must not exceed `isize::MAX`.
    /// Other parties may write the bytes at any time, but this process must not hold a
    /// Rust reference (`&mut [u8]`) through which they are written during `'a`.
    pub unsafe fn from_raw_parts(ptr: *const u8, len: usize) -> HostBytes<'a> {
        HostBytes {
            ptr: NonNull::new(ptr.cast_mut()).expect("HostBytes::from_raw_parts with a null pointer"),
            len,
            _memory: PhantomData,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the view covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte, for system calls and C functions that only read through it
    /// (`pwrite`, a DAOS iov of a write; C's type may be `*mut`, the callee must not
    /// write). Valid for `len` bytes for `'a`.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Copies the bytes into `out`, which must be exactly as long.
    ///
    /// The bytes may be changing while they are copied: `out` gets some value of each
    /// byte (possibly a mix of old and new across the range), and a second copy may
    /// differ from the first. Copy once and use the copy.
    ///
    /// # Panics
    /// If `out.len() != self.len()`.
    pub fn copy_to_slice(&self, out: &mut [u8]) {
        assert_eq!(out.len(), self.len, "HostBytes::copy_to_slice into a slice of another length");
        // SAFETY: the source is valid for reads of len bytes (constructor contract);
        // `out` is a distinct, exclusively borrowed Rust buffer of the same length, so
        // the ranges cannot overlap (no Rust reference to the source exists).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), out.as_mut_ptr(), self.len) }
    }

    /// The bytes, copied once into a new vector (see [`HostBytes::copy_to_slice`]).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0; self.len];
        self.copy_to_slice(&mut out);
        out
    }

    /// The sub-view `range`, or `None` if it does not lie inside this one.
    pub fn get(&self, range: impl RangeBounds<usize>) -> Option<HostBytes<'a>> {
        let (start, len) = bounds(&range, self.len)?;
        Some(HostBytes {
            // SAFETY: start <= self.len, so the result stays inside (or one past the
            // end of) the memory this view covers.
            ptr: unsafe { self.ptr.add(start) },
            len,
            _memory: PhantomData,
        })
    }

    /// The sub-view `range`.
    ///
    /// # Panics
    /// If `range` does not lie inside the view, like slice indexing.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> HostBytes<'a> {
        let len = self.len;
        self.get(range).unwrap_or_else(|| out_of_range(len))
    }

    /// One `pwrite(2)` of the bytes to `fd` at `offset`; returns the bytes written
    /// (possibly fewer: the caller loops, as with [`std::os::unix::fs::FileExt::write_at`]).
    /// The kernel reads the memory directly, with no copy in this process.
    pub fn pwrite(&self, fd: impl AsFd, offset: u64) -> io::Result<usize> {
        let offset = file_offset(offset)?;
        // SAFETY: the pointer is valid for reads of len bytes (constructor contract) and
        // the kernel only reads it; fd is a borrowed, open descriptor for the call.
        let n = unsafe { libc::pwrite(fd.as_fd().as_raw_fd(), self.ptr.as_ptr().cast(), self.len, offset) };
        syscall_result(n)
    }

    /// One `write(2)` of the bytes to `fd` at its file position (a pipe, a terminal, a
    /// socket); returns the bytes written (possibly fewer: the caller loops, as with
    /// [`std::io::Write::write`]). The kernel reads the memory directly.
    pub fn write(&self, fd: impl AsFd) -> io::Result<usize> {
        // SAFETY: as in pwrite.
        let n = unsafe { libc::write(fd.as_fd().as_raw_fd(), self.ptr.as_ptr().cast(), self.len) };
        syscall_result(n)
    }
}

impl<'a> HostBytesMut<'a> {
    /// A writable view of `len` bytes at `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` must be non-null and valid for reads and writes of `len` bytes for all of
    /// `'a` (the memory stays mapped, writable, and is not freed), and `len` must not
    /// exceed `isize::MAX`. Other parties, and other views, may read and write the
    /// bytes at any time, but this process must not hold a Rust reference (`&[u8]` or
    /// `&mut [u8]`) to them during `'a`.
    pub unsafe fn from_raw_parts(ptr: *mut u8, len: usize) -> HostBytesMut<'a> {
        HostBytesMut {
            ptr: NonNull::new(ptr).expect("HostBytesMut::from_raw_parts with a null pointer"),
            len,
            _memory: PhantomData,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the view covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte, for reading (see [`HostBytes::as_ptr`]).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The first byte, for system calls and C functions that write the memory
    /// (`pread`, a DAOS iov of a read). Valid for `len` bytes for `'a`.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// A read-only view of the same bytes, for as long as this one is borrowed.
    pub fn as_bytes(&self) -> HostBytes<'_> {
        HostBytes { ptr: self.ptr, len: self.len, _memory: PhantomData }
    }

    /// A shorter-lived view of the same bytes, to hand to a call without giving this
    /// one up.
    pub fn reborrow(&mut self) -> HostBytesMut<'_> {
        HostBytesMut { ptr: self.ptr, len: self.len, _memory: PhantomData }
    }

    /// Copies `src`, which must be exactly as long, into the bytes. Another party may
    /// read the bytes while they are written, and see some of them old.
    ///
    /// # Panics
    /// If `src.len() != self.len()`.
    pub fn copy_from_slice(&mut self, src: &[u8]) {
        assert_eq!(src.len(), self.len, "HostBytesMut::copy_from_slice from a slice of another length");
        // SAFETY: the destination is valid for writes of len bytes (constructor
        // contract); `src` is a Rust buffer borrowed for the call, and no Rust reference
        // to the destination exists, so the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr(), self.len) }
    }

    /// Copies the bytes into `out`; see [`HostBytes::copy_to_slice`].
    ///
    /// # Panics
    /// If `out.len() != self.len()`.
    pub fn copy_to_slice(&self, out: &mut [u8]) {
        self.as_bytes().copy_to_slice(out)
    }

    /// Copies the view `src`, exactly as long, into the bytes: one copy between two
    /// regions that other parties may read or write meanwhile (shared staging memory
    /// and a host's mapped region). The views must not overlap; `memmove` semantics
    /// keep even that from being undefined, only unspecified.
    ///
    /// # Panics
    /// If `src.len() != self.len()`.
    pub fn copy_from_view(&mut self, src: HostBytes<'_>) {
        assert_eq!(src.len(), self.len, "HostBytesMut::copy_from_view from a view of another length");
        // SAFETY: both are valid for len bytes (constructor contracts); no Rust
        // reference to either exists, and `copy` (memmove) tolerates an overlap.
        unsafe { std::ptr::copy(src.as_ptr(), self.ptr.as_ptr(), self.len) }
    }

    /// The sub-view `range` for as long as this one is borrowed, or `None` if it does
    /// not lie inside this one.
    pub fn get_mut(&mut self, range: impl RangeBounds<usize>) -> Option<HostBytesMut<'_>> {
        self.reborrow().into_get(range)
    }

    /// The sub-view `range` for as long as this one is borrowed.
    ///
    /// # Panics
    /// If `range` does not lie inside the view, like slice indexing.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> HostBytesMut<'_> {
        self.reborrow().into_slice(range)
    }

    /// This view narrowed to `range`, keeping its lifetime.
    ///
    /// # Panics
    /// If `range` does not lie inside the view, like slice indexing.
    pub fn into_slice(self, range: impl RangeBounds<usize>) -> HostBytesMut<'a> {
        let len = self.len;
        self.into_get(range).unwrap_or_else(|| out_of_range(len))
    }

    fn into_get(self, range: impl RangeBounds<usize>) -> Option<HostBytesMut<'a>> {
        let (start, len) = bounds(&range, self.len)?;
        Some(HostBytesMut {
            // SAFETY: start <= self.len, so the result stays inside (or one past the
            // end of) the memory this view covers.
            ptr: unsafe { self.ptr.add(start) },
            len,
            _memory: PhantomData,
        })
    }

    /// One `pread(2)` from `fd` at `offset` into the bytes; returns the bytes read
    /// (possibly fewer before the end of the file: the caller loops, as with
    /// [`std::os::unix::fs::FileExt::read_at`]). The kernel writes the memory
    /// directly: one copy, from the page cache to the view.
    pub fn pread(&mut self, fd: impl AsFd, offset: u64) -> io::Result<usize> {
        let offset = file_offset(offset)?;
        // SAFETY: the pointer is valid for writes of len bytes (constructor contract),
        // and the kernel writes at most len bytes through it; fd is a borrowed, open
        // descriptor for the call.
        let n = unsafe { libc::pread(fd.as_fd().as_raw_fd(), self.ptr.as_ptr().cast(), self.len, offset) };
        syscall_result(n)
    }

    /// One `read(2)` from `fd` at its file position into the bytes (a pipe, a terminal,
    /// a socket); returns the bytes read (possibly fewer; 0 at the end: the caller loops,
    /// as with [`std::io::Read::read`]). The kernel writes the memory directly.
    pub fn read(&mut self, fd: impl AsFd) -> io::Result<usize> {
        // SAFETY: as in pread.
        let n = unsafe { libc::read(fd.as_fd().as_raw_fd(), self.ptr.as_ptr().cast(), self.len) };
        syscall_result(n)
    }
}

impl<'a> From<&'a [u8]> for HostBytes<'a> {
    /// A view of agent-owned bytes, borrowed (and so unchanged) for `'a`.
    fn from(bytes: &'a [u8]) -> Self {
        HostBytes { ptr: NonNull::from(bytes).cast(), len: bytes.len(), _memory: PhantomData }
    }
}

impl<'a> From<&'a mut [u8]> for HostBytesMut<'a> {
    /// A view of an agent-owned buffer, exclusively borrowed for `'a`.
    fn from(bytes: &'a mut [u8]) -> Self {
        let len = bytes.len();
        HostBytesMut { ptr: NonNull::from(bytes).cast(), len, _memory: PhantomData }
    }
}

impl<'a> From<HostBytesMut<'a>> for HostBytes<'a> {
    fn from(bytes: HostBytesMut<'a>) -> Self {
        HostBytes { ptr: bytes.ptr, len: bytes.len, _memory: PhantomData }
    }
}

// Never the content: it is another party's, and may be anything.
impl fmt::Debug for HostBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBytes").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

impl fmt::Debug for HostBytesMut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBytesMut").field("ptr", &self.ptr).field("len", &self.len).finish()
    }
}

/// `(start, len)` of `range` inside `0..len`, or `None`.
fn bounds(range: &impl RangeBounds<usize>, len: usize) -> Option<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1)?,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start <= end && end <= len { Some((start, end - start)) } else { None }
}

fn out_of_range(len: usize) -> ! {
    panic!("host bytes range outside a view of {len} bytes")
}

fn file_offset(offset: u64) -> io::Result<libc::off_t> {
    libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn syscall_result(n: libc::ssize_t) -> io::Result<usize> {
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Memory mapped in this process for as long as the value lives, which a transport may
/// register and move bytes out of: a backend's staging memory that another process
/// fills (a tenant's DAOS worker), lent to the data plane so that a read's bytes are
/// put to the host straight from it ([`LentMemory::bytes`] for everyone else).
///
/// # Safety
///
/// [`LentMemory::span`] returns the same range on every call, and that range stays
/// mapped readable and writable for as long as the value lives. Others (the process
/// that fills it) may write it at any time: accesses go through views.
pub unsafe trait LentMemory: Send + Sync + 'static {
    /// Where the memory starts in this process, and its length.
    fn span(&self) -> (*mut u8, usize);

    /// `len` bytes at `offset`, to read from; `None` if the range is outside the memory.
    fn bytes(&self, offset: usize, len: usize) -> Option<HostBytes<'_>> {
        let (ptr, size) = self.span();
        if offset.checked_add(len)? > size {
            return None;
        }
        // SAFETY: the range is inside the span (checked), which stays mapped while self
        // lives (the trait's contract) and so for the borrow.
        Some(unsafe { HostBytes::from_raw_parts(ptr.wrapping_add(offset), len) })
    }

    /// `len` bytes at `offset`, to write into; `None` if the range is outside the memory.
    fn bytes_mut(&self, offset: usize, len: usize) -> Option<HostBytesMut<'_>> {
        let (ptr, size) = self.span();
        if offset.checked_add(len)? > size {
            return None;
        }
        // SAFETY: as in `bytes`; HostBytesMut claims no exclusive access, which memory
        // another process writes too needs.
        Some(unsafe { HostBytesMut::from_raw_parts(ptr.wrapping_add(offset), len) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};

    #[test]
    fn copies_in_and_out_of_a_borrowed_buffer() {
        let mut buf = [0u8; 8];
        {
            let mut view = HostBytesMut::from(&mut buf[..]);
            assert_eq!(view.len(), 8);
            view.slice_mut(2..5).copy_from_slice(b"abc");
            let mut out = [0u8; 3];
            view.as_bytes().slice(2..5).copy_to_slice(&mut out);
            assert_eq!(&out, b"abc");
            view.slice_mut(7..).copy_from_slice(b"z");
        }
        assert_eq!(&buf, b"\0\0abc\0\0z");
        let view = HostBytes::from(&buf[..]);
        assert_eq!(view.to_vec(), buf);
        assert_eq!(view.slice(..=2).to_vec(), b"\0\0a");
        assert_eq!(view.slice(8..).len(), 0);
        assert!(view.slice(8..).is_empty());
    }

    #[test]
    fn sub_views_are_bounds_checked() {
        let buf = [0u8; 4];
        let view = HostBytes::from(&buf[..]);
        assert!(view.get(0..4).is_some());
        assert!(view.get(4..4).is_some());
        assert!(view.get(0..5).is_none());
        let (start, end) = (3, 2);
        assert!(view.get(start..end).is_none(), "reversed");
        assert!(view.get(5..).is_none());
        assert!(view.get((Bound::Excluded(usize::MAX), Bound::Unbounded)).is_none(), "start overflows");
        assert!(view.get(..=usize::MAX).is_none(), "end overflows");
        let narrowed = view.slice(1..3);
        assert_eq!((narrowed.len(), narrowed.as_ptr()), (2, buf[1..].as_ptr()));
        assert!(narrowed.get(..3).is_none(), "a sub-view checks against its own length");

        let mut mbuf = [0u8; 4];
        let mut view = HostBytesMut::from(&mut mbuf[..]);
        assert!(view.get_mut(2..5).is_none());
        assert_eq!(view.get_mut(1..).map(|v| v.len()), Some(3));
        let tail = view.into_slice(3..);
        assert_eq!(tail.len(), 1);
    }

    #[test]
    #[should_panic(expected = "outside a view of 4 bytes")]
    fn slicing_past_the_end_panics() {
        let buf = [0u8; 4];
        HostBytes::from(&buf[..]).slice(2..6);
    }

    #[test]
    #[should_panic(expected = "outside a view of 4 bytes")]
    fn mutable_slicing_past_the_end_panics() {
        let mut buf = [0u8; 4];
        HostBytesMut::from(&mut buf[..]).slice_mut(5..);
    }

    #[test]
    #[should_panic(expected = "another length")]
    fn copy_of_another_length_panics() {
        let mut buf = [0u8; 4];
        HostBytesMut::from(&mut buf[..]).copy_from_slice(b"abc");
    }

    #[test]
    #[should_panic(expected = "another length")]
    fn copy_out_of_another_length_panics() {
        let buf = [0u8; 4];
        HostBytes::from(&buf[..]).copy_to_slice(&mut [0u8; 5]);
    }

    #[test]
    fn views_of_raw_memory_move_bytes_without_references() {
        // Memory reached only through a raw pointer, as a mapped peer region is.
        let raw = Box::into_raw(Box::new([7u8; 16])).cast::<u8>();
        {
            // SAFETY: raw points at 16 live bytes for this block; no reference to them
            // exists until the Box is rebuilt below.
            let mut a = unsafe { HostBytesMut::from_raw_parts(raw, 16) };
            // SAFETY: as above; a second, overlapping view is allowed by the contract.
            let b = unsafe { HostBytes::from_raw_parts(raw.cast_const(), 16) };
            a.slice_mut(4..8).copy_from_slice(&[1, 2, 3, 4]);
            assert_eq!(b.slice(3..9).to_vec(), [7, 1, 2, 3, 4, 7]);
            assert_eq!(HostBytes::from(a).as_ptr(), b.as_ptr());
        }
        // SAFETY: raw came from Box::into_raw of a [u8; 16] above and is freed once.
        drop(unsafe { Box::from_raw(raw.cast::<[u8; 16]>()) });
    }

    #[test]
    fn pread_and_pwrite_straight_on_the_view() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"0123456789").unwrap();
        let mut buf = [0u8; 6];
        let mut view = HostBytesMut::from(&mut buf[..]);
        assert_eq!(view.slice_mut(1..5).pread(&file, 3).unwrap(), 4);
        assert_eq!(view.pread(&file, 8).unwrap(), 2, "short at the end of the file");
        assert_eq!(view.pread(&file, 100).unwrap(), 0);
        assert_eq!(&buf, b"89456\0");

        assert_eq!(HostBytes::from(&b"ab"[..]).pwrite(&file, 12).unwrap(), 2);
        let mut all = Vec::new();
        file.seek(SeekFrom::Start(0)).unwrap();
        file.read_to_end(&mut all).unwrap();
        assert_eq!(all, b"0123456789\0\0ab");

        let err = HostBytes::from(&b"x"[..]).pwrite(&file, u64::MAX).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
        let mut one = [0u8; 1];
        let err = HostBytesMut::from(&mut one[..]).pread(&file, u64::MAX).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn read_and_write_at_the_file_position() {
        let (reader, writer) = std::io::pipe().unwrap();
        assert_eq!(HostBytes::from(&b"hello"[..]).slice(1..).write(&writer).unwrap(), 4);
        drop(writer);
        let mut buf = [0u8; 8];
        let mut view = HostBytesMut::from(&mut buf[..]);
        assert_eq!(view.slice_mut(2..).read(&reader).unwrap(), 4);
        assert_eq!(view.read(&reader).unwrap(), 0, "the end");
        assert_eq!(&buf, b"\0\0ello\0\0");
        let err = HostBytes::from(&b"x"[..]).write(&reader).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF), "the read end of a pipe");
    }

    #[test]
    fn views_are_send_and_sync() {
        fn both<T: Send + Sync>() {}
        both::<HostBytes<'static>>();
        both::<HostBytesMut<'static>>();
    }
}
