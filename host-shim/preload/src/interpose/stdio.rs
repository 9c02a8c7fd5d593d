//! stdio: fopen and the FILE streams over dpuio descriptors.

use super::io::{lseek64, read, write};
use super::open::close;
use super::*;

#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

unsafe extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut FILE;
}

unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, len: size_t) -> ssize_t {
    // SAFETY: stdio's buffer of `len` bytes; the cookie is the descriptor.
    unsafe { read(cookie as usize as c_int, buf.cast(), len) }
}

unsafe extern "C" fn cookie_write(cookie: *mut c_void, buf: *const c_char, len: size_t) -> ssize_t {
    // SAFETY: as above.
    let r = unsafe { write(cookie as usize as c_int, buf.cast(), len) };
    // A cookie writer reports failure as 0 bytes.
    r.max(0)
}

unsafe extern "C" fn cookie_seek(cookie: *mut c_void, position: *mut i64, whence: c_int) -> c_int {
    // SAFETY: stdio passes a valid position to read and update.
    let r = unsafe { lseek64(cookie as usize as c_int, *position, whence) };
    if r < 0 {
        return -1;
    }
    // SAFETY: as above.
    unsafe { *position = r };
    0
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    // SAFETY: the descriptor the stream owns.
    unsafe { close(cookie as usize as c_int) }
}

/// A stdio stream over a dpuio descriptor (glibc's own streams read with internal
/// calls this library cannot see, so `fopen` and `fdopen` make cookie streams).
fn stream(fd: c_int, mode: *const c_char) -> *mut FILE {
    let io = CookieIo {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: Some(cookie_seek),
        close: Some(cookie_close),
    };
    // SAFETY: the cookie is a descriptor number, never dereferenced; the mode is the
    // caller's string.
    let fp = unsafe { fopencookie(fd as usize as *mut c_void, mode, io) };
    if !fp.is_null() {
        // One read of a staging region per refill rather than one per 4 KiB.
        // SAFETY: a new stream with no I/O yet; stdio allocates the buffer.
        unsafe { libc::setvbuf(fp, std::ptr::null_mut(), libc::_IOFBF, 1 << 20) };
    }
    fp
}

/// `open(2)` flags of an `fopen` mode.
pub(super) fn mode_flags(mode: &[u8]) -> Option<c_int> {
    let mut flags = match mode.first()? {
        b'r' => libc::O_RDONLY,
        b'w' => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        b'a' => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    for c in &mode[1..] {
        match c {
            b'+' => flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR,
            b'x' => flags |= libc::O_EXCL,
            b'e' => flags |= libc::O_CLOEXEC,
            _ => {}
        }
    }
    Some(flags)
}

unsafe fn do_fopen(path: &str, mode: *const c_char) -> *mut FILE {
    // SAFETY: the caller's NUL-terminated mode.
    let Some(flags) = (!mode.is_null()).then(|| unsafe { CStr::from_ptr(mode) }.to_bytes()).and_then(mode_flags) else {
        return fail(libc::EINVAL);
    };
    let fd = dpuio(|| do_open(path, flags));
    if fd < 0 {
        return std::ptr::null_mut();
    }
    let fp = stream(fd, mode);
    if fp.is_null() {
        // SAFETY: the descriptor just opened.
        unsafe { close(fd) };
    }
    fp
}

interpose! {
    fn fopen | fopen64 (path: *const c_char, mode: *const c_char) -> *mut FILE {
        // SAFETY: the caller's path.
        if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
            // SAFETY: the caller's mode.
            return unsafe { do_fopen(&p, mode) };
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    if node(fd).is_some() {
        return stream(fd, mode);
    }
    libc_call!(fdopen(fd, mode) as fn(c_int, *const c_char) -> *mut FILE)
}
