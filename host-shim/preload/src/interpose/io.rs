//! read, write, seek, truncate, allocate: the calls on a descriptor's bytes.

use super::*;

pub(super) fn file_of(n: &Node) -> Result<&Arc<FileState>, PosixError> {
    match n {
        Node::File(f) => Ok(f),
        Node::Directory { path, .. } => Err(errno_error(libc::EISDIR, format!("{path}: is a directory"))),
    }
}

/// Read into `buf` at `at`, or at the descriptor's offset (advancing it).
fn do_read(n: &Node, buf: &mut [u8], at: Option<u64>) -> Result<isize, PosixError> {
    let f = file_of(n)?;
    let handle = f.handle()?;
    let m = mount()?;
    let done = match at {
        Some(offset) => m.read_at(&handle, buf, offset)?,
        None => {
            let offset = f.offset.load(Ordering::Acquire);
            let done = m.read_at(&handle, buf, offset)?;
            f.offset.store(offset + done as u64, Ordering::Release);
            done
        }
    };
    Ok(done as isize)
}

fn do_write(n: &Node, buf: &[u8], at: Option<u64>) -> Result<isize, PosixError> {
    let f = file_of(n)?;
    let handle = f.handle()?;
    let m = mount()?;
    let done = match at {
        Some(offset) => m.write_at(&handle, buf, offset)?.1,
        None => {
            let (offset, done) = m.write_at(&handle, buf, f.offset.load(Ordering::Acquire))?;
            f.offset.store(offset + done as u64, Ordering::Release);
            done
        }
    };
    Ok(done as isize)
}

/// The caller's buffer as a slice (empty for a zero length, whatever the pointer).
pub(super) unsafe fn buffer<'a>(buf: *mut c_void, len: size_t) -> &'a mut [u8] {
    if len == 0 || buf.is_null() {
        return &mut [];
    }
    // SAFETY: the caller passes `len` writable bytes at `buf` (read(2)'s contract).
    unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) }
}

unsafe fn iovecs<'a>(iov: *const libc::iovec, count: c_int) -> &'a [libc::iovec] {
    if iov.is_null() || count <= 0 {
        return &[];
    }
    // SAFETY: the caller passes `count` iovecs at `iov` (readv(2)'s contract).
    unsafe { std::slice::from_raw_parts(iov, count as usize) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    if let Some(n) = node(fd) {
        // SAFETY: the caller's buffer.
        let b = unsafe { buffer(buf, len) };
        return dpuio(|| do_read(&n, b, None));
    }
    libc_call!(read(fd, buf, len) as fn(c_int, *mut c_void, size_t) -> ssize_t)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t) -> ssize_t {
    if let Some(n) = node(fd) {
        // SAFETY: the caller's buffer, at most `buflen` bytes (the fortified check).
        let b = unsafe { buffer(buf, len.min(buflen)) };
        return dpuio(|| do_read(&n, b, None));
    }
    libc_call!(__read_chk(fd, buf, len, buflen) as fn(c_int, *mut c_void, size_t, size_t) -> ssize_t)
}

interpose! {
    fn pread | pread64 (fd: c_int, buf: *mut c_void, len: size_t, offset: off_t) -> ssize_t {
        if let Some(n) = node(fd) {
            if offset < 0 {
                return fail(libc::EINVAL);
            }
            // SAFETY: the caller's buffer.
            let b = unsafe { buffer(buf, len) };
            return dpuio(|| do_read(&n, b, Some(offset as u64)));
        }
    }
}

interpose_as! {
    fn __pread_chk => pread | __pread64_chk => pread64
        (fd: c_int, buf: *mut c_void, len: size_t, offset: off_t, buflen: size_t) -> ssize_t
        = (fd, buf, len.min(buflen), offset)
}

/// readv/preadv: one read per vector, stopping at a short one.
fn do_readv(n: &Node, iov: &[libc::iovec], at: Option<u64>) -> Result<isize, PosixError> {
    vectored(iov, at, |b, at| do_read(n, b, at))
}

/// writev/pwritev: one write per vector, stopping at a short one.
fn do_writev(n: &Node, iov: &[libc::iovec], at: Option<u64>) -> Result<isize, PosixError> {
    vectored(iov, at, |b, at| do_write(n, b, at))
}

/// `op` on each vector in turn at `at` (advanced by what each moved), stopping at the
/// first short one; the bytes moved.
fn vectored(
    iov: &[libc::iovec],
    mut at: Option<u64>,
    mut op: impl FnMut(&mut [u8], Option<u64>) -> Result<isize, PosixError>,
) -> Result<isize, PosixError> {
    let mut total = 0isize;
    for v in iov {
        // SAFETY: each iovec names `iov_len` bytes the caller lets the call write (readv(2))
        // or read (writev(2)).
        let b = unsafe { buffer(v.iov_base, v.iov_len) };
        let done = op(b, at)?;
        total += done;
        at = at.map(|a| a + done as u64);
        if (done as usize) < v.iov_len {
            break;
        }
    }
    Ok(total)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, count: c_int) -> ssize_t {
    if let Some(n) = node(fd) {
        // SAFETY: the caller's vectors.
        let v = unsafe { iovecs(iov, count) };
        return dpuio(|| do_readv(&n, v, None));
    }
    libc_call!(readv(fd, iov, count) as fn(c_int, *const libc::iovec, c_int) -> ssize_t)
}

interpose! {
    fn preadv | preadv64 (fd: c_int, iov: *const libc::iovec, count: c_int, offset: off_t) -> ssize_t {
        if let Some(n) = node(fd) {
            // SAFETY: the caller's vectors.
            let v = unsafe { iovecs(iov, count) };
            return dpuio(|| do_readv(&n, v, Some(offset.max(0) as u64)));
        }
    }
}

// `preadv2`/`pwritev2` (Python's `os.preadv` uses them): an offset of -1 means the
// descriptor's own; the RWF_* hints mean nothing here.
interpose! {
    fn preadv2 | preadv64v2 (fd: c_int, iov: *const libc::iovec, count: c_int, offset: off_t, flags: c_int) -> ssize_t {
        if let Some(n) = node(fd) {
            // SAFETY: the caller's vectors.
            let v = unsafe { iovecs(iov, count) };
            return dpuio(|| do_readv(&n, v, (offset >= 0).then_some(offset as u64)));
        }
    }
}

interpose! {
    fn pwritev2 | pwritev64v2 (fd: c_int, iov: *const libc::iovec, count: c_int, offset: off_t, flags: c_int) -> ssize_t {
        if let Some(n) = node(fd) {
            // SAFETY: the caller's vectors.
            let v = unsafe { iovecs(iov, count) };
            return dpuio(|| do_writev(&n, v, (offset >= 0).then_some(offset as u64)));
        }
    }
}

interpose! {
    fn pwritev | pwritev64 (fd: c_int, iov: *const libc::iovec, count: c_int, offset: off_t) -> ssize_t {
        if let Some(n) = node(fd) {
            // SAFETY: the caller's vectors.
            let v = unsafe { iovecs(iov, count) };
            return dpuio(|| do_writev(&n, v, Some(offset.max(0) as u64)));
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    if let Some(n) = node(fd) {
        // SAFETY: the caller's buffer, only read.
        let b = unsafe { buffer(buf.cast_mut(), len) };
        return dpuio(|| do_write(&n, b, None));
    }
    libc_call!(write(fd, buf, len) as fn(c_int, *const c_void, size_t) -> ssize_t)
}

interpose! {
    fn pwrite | pwrite64 (fd: c_int, buf: *const c_void, len: size_t, offset: off_t) -> ssize_t {
        if let Some(n) = node(fd) {
            if offset < 0 {
                return fail(libc::EINVAL);
            }
            // SAFETY: the caller's buffer, only read.
            let b = unsafe { buffer(buf.cast_mut(), len) };
            return dpuio(|| do_write(&n, b, Some(offset as u64)));
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, count: c_int) -> ssize_t {
    if let Some(n) = node(fd) {
        // SAFETY: the caller's vectors.
        let v = unsafe { iovecs(iov, count) };
        return dpuio(|| do_writev(&n, v, None));
    }
    libc_call!(writev(fd, iov, count) as fn(c_int, *const libc::iovec, c_int) -> ssize_t)
}

fn do_lseek(fd: c_int, n: &Node, offset: off_t, whence: c_int) -> Result<off_t, PosixError> {
    let f = match n {
        Node::File(f) => f,
        // Rewinding a directory descriptor starts its getdents64 listing again.
        Node::Directory { .. } => {
            let listing = listings().lock().unwrap_or_else(|p| p.into_inner()).remove(&fd);
            drop(listing);
            return Ok(0);
        }
    };
    let size = || -> Result<i64, PosixError> { Ok(mount()?.fstat(&*f.handle()?)?.size as i64) };
    let current = f.offset.load(Ordering::Acquire) as i64;
    let target = match whence {
        libc::SEEK_SET => offset,
        libc::SEEK_CUR => current.saturating_add(offset),
        libc::SEEK_END => size()?.saturating_add(offset),
        libc::SEEK_DATA => {
            // No holes: data everywhere before the end.
            if offset >= size()? {
                return Err(errno_error(libc::ENXIO, "SEEK_DATA past the end"));
            }
            offset
        }
        libc::SEEK_HOLE => {
            let s = size()?;
            if offset > s {
                return Err(errno_error(libc::ENXIO, "SEEK_HOLE past the end"));
            }
            s
        }
        _ => return Err(errno_error(libc::EINVAL, "lseek: bad whence")),
    };
    if target < 0 {
        return Err(errno_error(libc::EINVAL, "lseek: negative offset"));
    }
    f.offset.store(target as u64, Ordering::Release);
    Ok(target)
}

interpose! {
    fn lseek | lseek64 (fd: c_int, offset: off_t, whence: c_int) -> off_t {
        if let Some(n) = node(fd) {
            return dpuio(|| do_lseek(fd, &n, offset, whence));
        }
    }
}

interpose! {
    fn fsync | fdatasync (fd: c_int) -> c_int {
        if let Some(n) = node(fd) {
            return dpuio(|| match &*n {
                Node::File(f) => mount()?.fsync(&*f.handle()?).map(|()| 0),
                Node::Directory { .. } => Ok(0),
            });
        }
    }
}

fn do_ftruncate(n: &Node, size: off_t) -> Result<c_int, PosixError> {
    if size < 0 {
        return Err(errno_error(libc::EINVAL, "ftruncate: negative size"));
    }
    let f = file_of(n)?;
    mount()?.ftruncate(&*f.handle()?, size as u64).map(|()| 0)
}

interpose! {
    fn ftruncate | ftruncate64 (fd: c_int, size: off_t) -> c_int {
        if let Some(n) = node(fd) {
            return dpuio(|| do_ftruncate(&n, size));
        }
    }
}

interpose! {
    fn truncate | truncate64 (path: *const c_char, size: off_t) -> c_int {
        // SAFETY: the caller's path.
        if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
            return dpuio(|| mount()?.truncate(&p, size.max(0) as u64).map(|()| 0));
        }
    }
}

/// Reserve space: dpuio allocates on write, so only a size that grows is kept (as
/// `posix_fallocate` promises); `FALLOC_FL_KEEP_SIZE` is a no-op, other modes (punching
/// holes, collapsing ranges) are `EOPNOTSUPP`.
fn do_fallocate(n: &Node, mode: c_int, offset: off_t, len: off_t) -> Result<c_int, PosixError> {
    if offset < 0 || len <= 0 {
        return Err(errno_error(libc::EINVAL, "fallocate: bad offset or length"));
    }
    let f = file_of(n)?;
    match mode {
        0 => {
            let handle = f.handle()?;
            let m = mount()?;
            let end = (offset as u64).saturating_add(len as u64);
            if m.fstat(&handle)?.size < end {
                m.ftruncate(&handle, end)?;
            }
            Ok(0)
        }
        libc::FALLOC_FL_KEEP_SIZE => Ok(0),
        _ => Err(errno_error(libc::EOPNOTSUPP, "fallocate: mode not supported by dpuio")),
    }
}

interpose! {
    fn fallocate | fallocate64 (fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int {
        if let Some(n) = node(fd) {
            return dpuio(|| do_fallocate(&n, mode, offset, len));
        }
    }
}

/// `posix_fallocate` returns the error number rather than setting `errno`.
fn posix_fallocate_result(n: &Node, offset: off_t, len: off_t) -> c_int {
    inside(|| match do_fallocate(n, 0, offset, len) {
        Ok(_) => 0,
        Err(e) => e.errno,
    })
}

interpose! {
    fn posix_fallocate | posix_fallocate64 (fd: c_int, offset: off_t, len: off_t) -> c_int {
        if let Some(n) = node(fd) {
            return posix_fallocate_result(&n, offset, len);
        }
    }
}

/// `cp` tries the kernel's copy first; between two file systems it says `EXDEV`,
/// after which programs fall back to read and write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut i64,
    fd_out: c_int,
    off_out: *mut i64,
    len: size_t,
    flags: std::ffi::c_uint,
) -> ssize_t {
    if !is_inside() && (is_marked(fd_in) || is_marked(fd_out)) {
        return fail(libc::EXDEV);
    }
    libc_call!(copy_file_range(fd_in, off_in, fd_out, off_out, len, flags)
        as fn(c_int, *mut i64, c_int, *mut i64, size_t, std::ffi::c_uint) -> ssize_t)
}

interpose! {
    fn posix_fadvise | posix_fadvise64 (fd: c_int, offset: off_t, len: off_t, advice: c_int) -> c_int {
        if !is_inside() && is_marked(fd) {
            return 0; // advice only; posix_fadvise returns the error number, not -1
        }
    }
}
