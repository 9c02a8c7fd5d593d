//! open, close, dup, fcntl: the calls that make, copy and drop a descriptor.

use super::*;

interpose! {
    fn open | open64 (path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
        // SAFETY: the caller's path.
        if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
            return dpuio(|| do_open(&p, flags));
        }
    }
}

// `_FORTIFY_SOURCE` spellings of `open` without a mode.
interpose_as! {
    fn __open_2 => open | __open64_2 => open64 (path: *const c_char, flags: c_int) -> c_int = (path, flags, 0)
}

interpose! {
    fn openat | openat64 (dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
        // SAFETY: the caller's path.
        if let Some(p) = unsafe { at_path(dirfd, path) } {
            return dpuio(|| do_open(&p, flags));
        }
    }
}

interpose_as! {
    fn __openat_2 => openat | __openat64_2 => openat64 (dirfd: c_int, path: *const c_char, flags: c_int) -> c_int
        = (dirfd, path, flags, 0)
}

interpose_as! {
    fn creat => open64 | creat64 => open64 (path: *const c_char, mode: mode_t) -> c_int
        = (path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, mode)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if !is_inside() && is_marked(fd) {
        // The agent's handle closes when the last descriptor of it goes (dup).
        let gone = remove(fd);
        let listing = listings().lock().unwrap_or_else(|p| p.into_inner()).remove(&fd);
        inside(|| drop((gone, listing)));
    }
    libc_call!(close(fd) as fn(c_int) -> c_int)
}

/// Give the new descriptor `r` (a duplicate of `old`) the node of `old`.
fn duplicated(old: Arc<Node>, r: c_int) -> c_int {
    if r >= 0 && !insert(r, old) {
        libc_call!(close(r) as fn(c_int) -> c_int);
        return fail(libc::EMFILE);
    }
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let r = libc_call!(dup(fd) as fn(c_int) -> c_int);
    match node(fd) {
        Some(n) => duplicated(n, r),
        None => r,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old != new && !is_inside() && is_marked(new) {
        let gone = remove(new);
        inside(|| drop(gone));
    }
    let r = libc_call!(dup2(old, new) as fn(c_int, c_int) -> c_int);
    match node(old) {
        Some(n) if old != new => duplicated(n, r),
        _ => r,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old != new && !is_inside() && is_marked(new) {
        let gone = remove(new);
        inside(|| drop(gone));
    }
    let r = libc_call!(dup3(old, new, flags) as fn(c_int, c_int, c_int) -> c_int);
    match node(old) {
        Some(n) => duplicated(n, r),
        None => r,
    }
}

fn do_fcntl(fd: c_int, n: Arc<Node>, cmd: c_int, arg: usize) -> c_int {
    match cmd {
        libc::F_GETFL => match &*n {
            Node::File(f) => {
                let access = match (f.flags.read, f.flags.write) {
                    (true, true) => libc::O_RDWR,
                    (false, true) => libc::O_WRONLY,
                    _ => libc::O_RDONLY,
                };
                access | if f.flags.append { libc::O_APPEND } else { 0 } | libc::O_LARGEFILE
            }
            Node::Directory { .. } => libc::O_RDONLY | libc::O_DIRECTORY | libc::O_LARGEFILE,
        },
        // O_NONBLOCK and friends mean nothing to a file here; O_APPEND cannot change.
        libc::F_SETFL => 0,
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            let r = libc_call!(fcntl(fd, cmd, arg) as fn(c_int, c_int, usize) -> c_int);
            duplicated(n, r)
        }
        // F_GETFD/F_SETFD (close-on-exec) are the placeholder's, so the kernel's; locks and
        // the rest fail there with EBADF.
        _ => libc_call!(fcntl(fd, cmd, arg) as fn(c_int, c_int, usize) -> c_int),
    }
}

interpose! {
    fn fcntl | fcntl64 (fd: c_int, cmd: c_int, arg: usize) -> c_int {
        if let Some(n) = node(fd) {
            return do_fcntl(fd, n, cmd, arg);
        }
    }
}
