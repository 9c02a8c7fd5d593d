//! stat, access and extended attributes: what a path or descriptor is.

use super::*;

/// Attributes of a descriptor's file or directory.
fn fd_attr(n: &Node) -> Result<(String, Attr), PosixError> {
    match n {
        Node::File(f) => Ok((f.path.clone(), mount()?.fstat(&*f.handle()?)?)),
        Node::Directory { path, attr } => Ok((path.clone(), attr.clone())),
    }
}

fn stat_into(path: &str, st: *mut libc::stat64) -> Result<c_int, PosixError> {
    let attr = mount()?.stat(path)?;
    // SAFETY: the caller's `struct stat` (same layout as stat64 on 64-bit Linux).
    fill_stat(unsafe { &mut *st }, path, &attr);
    Ok(0)
}

fn fstat_into(n: &Node, st: *mut libc::stat64) -> Result<c_int, PosixError> {
    let (path, attr) = fd_attr(n)?;
    // SAFETY: the caller's `struct stat`.
    fill_stat(unsafe { &mut *st }, &path, &attr);
    Ok(0)
}

interpose! {
    fn stat | stat64 | lstat | lstat64 (path: *const c_char, st: *mut libc::stat64) -> c_int {
        // SAFETY: the caller's path.
        if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
            return dpuio(|| stat_into(&p, st));
        }
    }
}

interpose! {
    fn fstat | fstat64 (fd: c_int, st: *mut libc::stat64) -> c_int {
        if let Some(n) = node(fd) {
            return dpuio(|| fstat_into(&n, st));
        }
    }
}

interpose! {
    fn fstatat | fstatat64 | newfstatat (dirfd: c_int, path: *const c_char, st: *mut libc::stat64, flags: c_int) -> c_int {
        if flags & libc::AT_EMPTY_PATH != 0
            && !path.is_null()
            // SAFETY: non-null, NUL-terminated (the caller's contract).
            && unsafe { *path } == 0
            && let Some(n) = node(dirfd)
        {
            return dpuio(|| fstat_into(&n, st));
        }
        // SAFETY: the caller's path.
        if let Some(p) = unsafe { at_path(dirfd, path) } {
            return dpuio(|| stat_into(&p, st));
        }
    }
}

// The glibc < 2.33 entry points (`__xstat` and friends) that older binaries call.
interpose! {
    fn __xstat | __xstat64 | __lxstat | __lxstat64 (ver: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
        // SAFETY: the caller's path.
        if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
            return dpuio(|| stat_into(&p, st));
        }
    }
}

interpose! {
    fn __fxstat | __fxstat64 (ver: c_int, fd: c_int, st: *mut libc::stat64) -> c_int {
        if let Some(n) = node(fd) {
            return dpuio(|| fstat_into(&n, st));
        }
    }
}

interpose! {
    fn __fxstatat | __fxstatat64
        (ver: c_int, dirfd: c_int, path: *const c_char, st: *mut libc::stat64, flags: c_int) -> c_int
    {
        // SAFETY: the caller's path.
        if let Some(p) = unsafe { at_path(dirfd, path) } {
            return dpuio(|| stat_into(&p, st));
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: std::ffi::c_uint,
    stx: *mut libc::statx,
) -> c_int {
    let fill = |path: &str, attr: &Attr| {
        // SAFETY: the caller's `struct statx`.
        fill_statx(unsafe { &mut *stx }, path, attr);
        Ok(0)
    };
    if flags & libc::AT_EMPTY_PATH != 0
        && !path.is_null()
        // SAFETY: non-null, NUL-terminated.
        && unsafe { *path } == 0
        && let Some(n) = node(dirfd)
    {
        return dpuio(|| {
            let (p, attr) = fd_attr(&n)?;
            fill(&p, &attr)
        });
    }
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(dirfd, path) } {
        return dpuio(|| fill(&p, &mount()?.stat(&p)?));
    }
    libc_call!(statx(dirfd, path, flags, mask, stx)
        as fn(c_int, *const c_char, c_int, std::ffi::c_uint, *mut libc::statx) -> c_int)
}

fn do_access(path: &str) -> Result<c_int, PosixError> {
    // Existence is what programs ask; rights are checked by the agent on each call.
    mount()?.stat(path).map(|_| 0)
}

interpose! {
    fn access | euidaccess (path: *const c_char, mode: c_int) -> c_int {
        // SAFETY: the caller's path.
        if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
            return dpuio(|| do_access(&p));
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(dirfd, path) } {
        return dpuio(|| do_access(&p));
    }
    libc_call!(faccessat(dirfd, path, mode, flags) as fn(c_int, *const c_char, c_int, c_int) -> c_int)
}

// Extended attributes: dpuio keeps none. `ls -l` asks for ACLs on every entry.
interpose! {
    fn getxattr | lgetxattr (path: *const c_char, name: *const c_char, value: *mut c_void, size: size_t) -> ssize_t {
        // SAFETY: the caller's path.
        if unsafe { at_path(libc::AT_FDCWD, path) }.is_some() {
            return fail(libc::ENOTSUP);
        }
    }
}
interpose! {
    fn listxattr | llistxattr (path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t {
        // SAFETY: the caller's path.
        if unsafe { at_path(libc::AT_FDCWD, path) }.is_some() {
            return fail(libc::ENOTSUP);
        }
    }
}
