//! mmap of a dpuio descriptor: a private copy of the file's bytes.

use super::io::file_of;
use super::*;

/// A read-only map of a dpuio file is its bytes read into anonymous memory: right for
/// readers (`np.load(mmap_mode="r")`), a copy rather than a view. A writable shared map
/// cannot be kept in step with the file, so it fails with `ENODEV` ("this file system
/// does not do mmap") rather than silently dropping writes. A private writable map is
/// a copy by definition and works.
fn do_mmap(
    n: &Node,
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    offset: off_t,
) -> Result<*mut c_void, PosixError> {
    let f = file_of(n)?;
    if flags & libc::MAP_SHARED != 0 && prot & libc::PROT_WRITE != 0 {
        return Err(errno_error(libc::ENODEV, format!("{}: writable shared mmap of a dpuio file", f.path)));
    }
    if offset < 0 || len == 0 {
        return Err(errno_error(libc::EINVAL, "mmap: bad offset or length"));
    }
    let anonymous = (flags & !(libc::MAP_SHARED | libc::MAP_SHARED_VALIDATE)) | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    let p = libc_call!(mmap(addr, len, libc::PROT_READ | libc::PROT_WRITE, anonymous, -1, 0)
        as fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void);
    if p == libc::MAP_FAILED {
        // SAFETY: reads this thread's errno.
        return Err(errno_error(unsafe { *libc::__errno_location() }, "mmap: anonymous memory"));
    }
    // SAFETY: `len` bytes just mapped readable and writable, ours alone until returned.
    let memory = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
    // Past the end of the file the map reads as zeros, as anonymous memory does.
    let filled = mount()?.read_at(&*f.handle()?, memory, offset as u64);
    let protected = filled.is_ok() && {
        // SAFETY: the mapping made above, narrowed to what the caller asked for.
        unsafe { libc::mprotect(p, len, prot) == 0 }
    };
    if !protected {
        // SAFETY: the mapping made above, never handed out.
        unsafe { libc::munmap(p, len) };
        filled?;
        return Err(errno_error(libc::EINVAL, "mmap: protection"));
    }
    Ok(p)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    if flags & libc::MAP_ANONYMOUS == 0
        && let Some(n) = node(fd)
    {
        return inside(|| do_mmap(&n, addr, len, prot, flags, offset).unwrap_or_else(|e| fail_map(e.errno)));
    }
    libc_call!(
        mmap(addr, len, prot, flags, fd, offset) as fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    // SAFETY: the caller's arguments (mmap64 is mmap on 64-bit Linux).
    unsafe { mmap(addr, len, prot, flags, fd, offset) }
}

/// mmap fails with MAP_FAILED, not NULL.
fn fail_map(errno: c_int) -> *mut c_void {
    set_errno(errno);
    libc::MAP_FAILED
}
