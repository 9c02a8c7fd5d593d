//! The interposed libc functions.
//!
//! Each one first asks, as cheaply as it can, whether its path or descriptor is
//! dpuio's: a path must start with the prefix, a descriptor must be marked (one atomic
//! load). Everything else goes to libc unchanged. Variadic C signatures (`open`,
//! `openat`, `fcntl`) are defined with their optional argument as a fixed one: on the
//! x86-64 and AArch64 Linux calling conventions a variadic integer or pointer argument
//! travels exactly like a fixed one, and it is read only when the call defines it.
// The safety contract of every interposer is that of the libc function of the same name
// (valid pointers and lengths from the C caller); writing it out 70 times says nothing.
#![allow(clippy::missing_safety_doc)]

use std::collections::HashSet;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use dpuio_shim::blocking::DirStream;
use dpuio_shim::posix::{OpenFlags, Opened, PosixError, join};
use dpuio_shim::{Attr, EntryKind};
use libc::{FILE, mode_t, off_t, size_t, ssize_t};

use crate::state::{
    FileState, Node, dpuio_path, fill_stat, fill_statx, inode, insert, inside, is_inside, is_marked, lookup, mount,
    remove,
};

/// A return value that can say "failed" (`-1`, or a null pointer) with `errno` set.
trait Failed {
    fn failed() -> Self;
}
impl Failed for c_int {
    fn failed() -> Self {
        -1
    }
}
impl Failed for i64 {
    fn failed() -> Self {
        -1
    }
}
impl Failed for isize {
    fn failed() -> Self {
        -1
    }
}
impl<T> Failed for *mut T {
    fn failed() -> Self {
        std::ptr::null_mut()
    }
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = e };
}

fn fail<T: Failed>(e: c_int) -> T {
    set_errno(e);
    T::failed()
}

/// The value of a dpuio call, or its failure as `errno`.
fn answer<T: Failed>(r: Result<T, PosixError>) -> T {
    r.unwrap_or_else(|e| fail(e.errno))
}

/// The next definition of `$name` (libc's), as `Option<fn>`.
macro_rules! real {
    ($name:ident as fn($($t:ty),*) -> $r:ty) => {{
        static PTR: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
        let mut p = PTR.load(Ordering::Relaxed);
        if p.is_null() {
            // SAFETY: a NUL-terminated symbol name; RTLD_NEXT looks in the objects loaded
            // after this library, where libc's definition is.
            p = unsafe { libc::dlsym(libc::RTLD_NEXT, concat!(stringify!($name), "\0").as_ptr().cast()) };
            PTR.store(p, Ordering::Relaxed);
        }
        // SAFETY: what dlsym found for this name is libc's function of that name, whose C
        // type is the one written here; a null pointer becomes `None`.
        unsafe { std::mem::transmute::<*mut c_void, Option<unsafe extern "C" fn($($t),*) -> $r>>(p) }
    }};
}

/// Call libc's `$name` with the caller's arguments.
macro_rules! libc_call {
    ($name:ident($($a:expr),*) as fn($($t:ty),*) -> $r:ty) => {
        match real!($name as fn($($t),*) -> $r) {
            // SAFETY: the caller's own arguments, passed unchanged to the function the
            // caller meant to call.
            Some(f) => unsafe { f($($a),*) },
            None => fail::<$r>(libc::ENOSYS),
        }
    };
}

/// Defines one interposer per name, all with the same parameters and body: the plain,
/// 64-bit, `at` and glibc-versioned spellings of one call
/// (`interpose! { fn open | open64 (…) -> c_int { … } }`). The body returns what dpuio
/// answers; when it falls through, the call goes on to libc's function of the name
/// being defined, with the caller's arguments.
macro_rules! interpose {
    (fn $($rest:tt)+) => {
        interpose!(@names [] $($rest)+);
    };
    (@names [$($n:ident)*] $next:ident | $($rest:tt)+) => {
        interpose!(@names [$($n)* $next] $($rest)+);
    };
    (@names [$($n:ident)*] $last:ident $params:tt -> $r:ty $body:block) => {
        $(interpose!(@one $n $params $body -> $r);)*
        interpose!(@one $last $params $body -> $r);
    };
    (@one $name:ident ($($arg:ident: $t:ty),* $(,)?) $body:block -> $r:ty) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $t),*) -> $r {
            $body
            libc_call!($name($($arg),*) as fn($($t),*) -> $r)
        }
    };
}

/// Defines interposers that are another interposer called with adjusted arguments
/// (`_FORTIFY_SOURCE`'s checked spellings, `creat`): `name => target` pairs sharing one
/// parameter list and one argument list
/// (`interpose_as! { fn __open_2 => open | … (…) -> c_int = (path, flags, 0) }`).
macro_rules! interpose_as {
    (fn $($rest:tt)+) => {
        interpose_as!(@pairs [] $($rest)+);
    };
    (@pairs [$($n:ident $to:ident)*] $name:ident => $target:ident | $($rest:tt)+) => {
        interpose_as!(@pairs [$($n $to)* $name $target] $($rest)+);
    };
    (@pairs [$($n:ident $to:ident)*] $name:ident => $target:ident $params:tt -> $r:ty = $args:tt) => {
        $(interpose_as!(@one $n $to $params $args -> $r);)*
        interpose_as!(@one $name $target $params $args -> $r);
    };
    (@one $name:ident $target:ident ($($arg:ident: $t:ty),* $(,)?) ($($a:expr),* $(,)?) -> $r:ty) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $t),*) -> $r {
            // SAFETY: the caller's arguments, passed on under the same contract.
            unsafe { $target($($a),*) }
        }
    };
}

/// Run a dpuio operation with the recursion guard, mapping its failure to `errno`.
fn dpuio<T: Failed>(f: impl FnOnce() -> Result<T, PosixError>) -> T {
    inside(|| answer(f()))
}

/// The dpuio path named by `path` relative to `dirfd`: an absolute path under the
/// prefix, or a relative one from a dpuio directory descriptor.
unsafe fn at_path(dirfd: c_int, path: *const c_char) -> Option<String> {
    if path.is_null() || is_inside() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated (the caller's contract).
    let name = unsafe { CStr::from_ptr(path) }.to_bytes();
    if name.first() == Some(&b'/') {
        // SAFETY: as above.
        return unsafe { dpuio_path(path) };
    }
    if name.is_empty() || dirfd == libc::AT_FDCWD || !is_marked(dirfd) {
        return None;
    }
    match lookup(dirfd).as_deref() {
        Some(Node::Directory { path: dir, .. }) => Some(join(dir, std::str::from_utf8(name).ok()?)),
        _ => None,
    }
}

/// The node of `fd` when it is dpuio's (and this thread is not inside the library).
fn node(fd: c_int) -> Option<Arc<Node>> {
    if is_inside() { None } else { lookup(fd) }
}

fn errno_error(errno: c_int, message: impl Into<String>) -> PosixError {
    PosixError { errno, message: message.into() }
}

/// A kernel descriptor that reserves a number for a dpuio file or directory: an
/// `O_PATH` descriptor, so that any call reaching the kernel with it fails (`EBADF`)
/// rather than reading or writing something else. It refers to an empty memfd named
/// after what it stands for ([`label`]), so that a program this one execs finds its
/// inherited dpuio descriptors again ([`inherit`]); `/dev/null` where memfds or `/proc`
/// are missing (then inherited descriptors stay `EBADF` after exec).
fn placeholder(flags: c_int, label: &str) -> Result<c_int, PosixError> {
    let cloexec = flags & libc::O_CLOEXEC;
    let open = |path: &CStr| {
        libc_call!(open64(path.as_ptr(), libc::O_PATH | cloexec, 0) as fn(*const c_char, c_int, mode_t) -> c_int)
    };
    if let Ok(name) = std::ffi::CString::new(label) {
        // SAFETY: a NUL-terminated name; the memfd is closed below, its O_PATH
        // descriptor keeps the inode (and its name) alive.
        let memfd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if memfd >= 0 {
            let proc_path = std::ffi::CString::new(format!("/proc/self/fd/{memfd}")).unwrap_or_default();
            let fd = open(&proc_path);
            libc_call!(close(memfd) as fn(c_int) -> c_int);
            if fd >= 0 {
                return Ok(fd);
            }
        }
    }
    let fd = open(c"/dev/null");
    if fd < 0 {
        // SAFETY: reads this thread's errno.
        return Err(errno_error(unsafe { *libc::__errno_location() }, "reserve a descriptor"));
    }
    Ok(fd)
}

/// Prefix of a placeholder memfd's name: `dpuio:d:PATH` for a directory,
/// `dpuio:FLAGS:PATH` for a file (FLAGS: its access mode and `O_APPEND`, in hex).
const LABEL: &str = "dpuio:";

fn label(node: &Node, flags: c_int) -> String {
    match node {
        Node::Directory { path, .. } => format!("{LABEL}d:{path}"),
        Node::File(f) => format!("{LABEL}{:x}:{}", flags & (libc::O_ACCMODE | libc::O_APPEND), f.path),
    }
}

/// What a placeholder's `/proc/self/fd` link names, if it is one of ours.
fn parse_label(link: &str) -> Option<Node> {
    let rest = link.strip_prefix("/memfd:")?.strip_suffix(" (deleted)")?.strip_prefix(LABEL)?;
    let (kind, path) = rest.split_once(':')?;
    if !path.starts_with('/') {
        return None;
    }
    if kind == "d" {
        let attr = Attr { kind: EntryKind::Directory, size: 0, mode: 0, mtime_ns: 0, object_id: 0 };
        return Some(Node::Directory { path: path.to_owned(), attr });
    }
    let flags = c_int::from_str_radix(kind, 16).ok()?;
    Some(Node::File(Arc::new(FileState::inherited(path.to_owned(), open_flags(flags)))))
}

/// After exec: find the dpuio descriptors this program inherited (their placeholders
/// survive exec unless close-on-exec) and mark them; each reopens its file by path on
/// first use, at offset 0 (or the end, with `O_APPEND`), as `cat < /mnt/dpuio/f` or
/// `prog > /mnt/dpuio/out` in a shell need.
pub fn inherit() {
    inside(|| {
        let Ok(entries) = std::fs::read_dir("/proc/self/fd") else { return };
        for entry in entries.flatten() {
            let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<c_int>().ok()) else { continue };
            let Ok(link) = std::fs::read_link(entry.path()) else { continue };
            if let Some(node) = link.to_str().and_then(parse_label) {
                insert(fd, Arc::new(node));
            }
        }
    });
}

fn install(node: Node, flags: c_int) -> Result<c_int, PosixError> {
    let fd = placeholder(flags, &label(&node, flags))?;
    if !insert(fd, Arc::new(node)) {
        libc_call!(close(fd) as fn(c_int) -> c_int);
        return Err(errno_error(libc::EMFILE, "descriptor number too large for dpuio"));
    }
    Ok(fd)
}

fn open_flags(flags: c_int) -> OpenFlags {
    let access = flags & libc::O_ACCMODE;
    OpenFlags {
        read: access != libc::O_WRONLY,
        write: access != libc::O_RDONLY,
        create: flags & libc::O_CREAT != 0,
        exclusive: flags & libc::O_EXCL != 0,
        truncate: flags & libc::O_TRUNC != 0,
        append: flags & libc::O_APPEND != 0,
    }
}

fn do_open(path: &str, flags: c_int) -> Result<c_int, PosixError> {
    let m = mount()?;
    if flags & libc::O_DIRECTORY != 0 {
        let attr = m.open_directory(path)?;
        return install(Node::Directory { path: path.to_owned(), attr }, flags);
    }
    let node = match m.open(path, open_flags(flags))? {
        Opened::File(file) => Node::File(Arc::new(FileState::new(file))),
        Opened::Directory(attr) => Node::Directory { path: path.to_owned(), attr },
    };
    install(node, flags)
}

// ---- open, close, dup -------------------------------------------------------------

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

// ---- read, write, seek --------------------------------------------------------------

fn file_of(n: &Node) -> Result<&Arc<FileState>, PosixError> {
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
unsafe fn buffer<'a>(buf: *mut c_void, len: size_t) -> &'a mut [u8] {
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
fn do_readv(n: &Node, iov: &[libc::iovec], mut at: Option<u64>) -> Result<isize, PosixError> {
    let mut total = 0isize;
    for v in iov {
        // SAFETY: each iovec names `iov_len` writable bytes (readv(2)'s contract).
        let b = unsafe { buffer(v.iov_base, v.iov_len) };
        let done = do_read(n, b, at)?;
        total += done;
        at = at.map(|a| a + done as u64);
        if (done as usize) < v.iov_len {
            break;
        }
    }
    Ok(total)
}

fn do_writev(n: &Node, iov: &[libc::iovec], mut at: Option<u64>) -> Result<isize, PosixError> {
    let mut total = 0isize;
    for v in iov {
        // SAFETY: each iovec names `iov_len` readable bytes (writev(2)'s contract).
        let b = unsafe { buffer(v.iov_base, v.iov_len) };
        let done = do_write(n, b, at)?;
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

// ---- stat ---------------------------------------------------------------------------

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

// ---- namespace ----------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
        return dpuio(|| mount()?.mkdir(&p).map(|()| 0));
    }
    libc_call!(mkdir(path, mode) as fn(*const c_char, mode_t) -> c_int)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(dirfd, path) } {
        return dpuio(|| mount()?.mkdir(&p).map(|()| 0));
    }
    libc_call!(mkdirat(dirfd, path, mode) as fn(c_int, *const c_char, mode_t) -> c_int)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
        return dpuio(|| mount()?.rmdir(&p).map(|()| 0));
    }
    libc_call!(rmdir(path) as fn(*const c_char) -> c_int)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
        return dpuio(|| mount()?.unlink(&p).map(|()| 0));
    }
    libc_call!(unlink(path) as fn(*const c_char) -> c_int)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(dirfd, path) } {
        return dpuio(|| {
            let m = mount()?;
            if flags & libc::AT_REMOVEDIR != 0 { m.rmdir(&p) } else { m.unlink(&p) }.map(|()| 0)
        });
    }
    libc_call!(unlinkat(dirfd, path, flags) as fn(c_int, *const c_char, c_int) -> c_int)
}

/// Both paths dpuio's, or neither: a rename across the prefix is `EXDEV`, as between
/// two mounts.
unsafe fn rename_paths(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
) -> Option<Result<(String, String), c_int>> {
    // SAFETY: the caller's paths.
    let (a, b) = unsafe { (at_path(olddir, old), at_path(newdir, new)) };
    match (a, b) {
        (Some(a), Some(b)) => Some(Ok((a, b))),
        (None, None) => None,
        _ => Some(Err(libc::EXDEV)),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    // SAFETY: the caller's paths.
    match unsafe { rename_paths(libc::AT_FDCWD, old, libc::AT_FDCWD, new) } {
        Some(Ok((a, b))) => dpuio(|| mount()?.rename(&a, &b).map(|()| 0)),
        Some(Err(e)) => fail(e),
        None => libc_call!(rename(old, new) as fn(*const c_char, *const c_char) -> c_int),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat(olddir: c_int, old: *const c_char, newdir: c_int, new: *const c_char) -> c_int {
    // SAFETY: the caller's paths.
    match unsafe { rename_paths(olddir, old, newdir, new) } {
        Some(Ok((a, b))) => dpuio(|| mount()?.rename(&a, &b).map(|()| 0)),
        Some(Err(e)) => fail(e),
        None => {
            libc_call!(renameat(olddir, old, newdir, new) as fn(c_int, *const c_char, c_int, *const c_char) -> c_int)
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat2(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    flags: std::ffi::c_uint,
) -> c_int {
    // SAFETY: the caller's paths.
    match unsafe { rename_paths(olddir, old, newdir, new) } {
        // RENAME_NOREPLACE is what the agent does anyway; other flags it cannot do.
        Some(Ok((a, b))) if flags == 0 => dpuio(|| mount()?.rename(&a, &b).map(|()| 0)),
        Some(Ok((a, b))) if flags == libc::RENAME_NOREPLACE => dpuio(|| mount()?.rename_noreplace(&a, &b).map(|()| 0)),
        Some(Ok(_)) => fail(libc::EINVAL),
        Some(Err(e)) => fail(e),
        None => libc_call!(renameat2(olddir, old, newdir, new, flags)
            as fn(c_int, *const c_char, c_int, *const c_char, std::ffi::c_uint) -> c_int),
    }
}

// ---- directories --------------------------------------------------------------------

/// A `DIR*` this library made. Told apart from libc's by address ([`DIRS`]).
struct Dir {
    fd: c_int,
    path: String,
    stream: Option<DirStream>,
    /// `.` and `..` still to be returned (2, 1, then 0).
    dots: u8,
    entry: libc::dirent64,
    position: i64,
    /// `entry` holds an entry not yet handed out (it did not fit a `getdents64` buffer).
    held: bool,
}

static OPEN_DIRS: AtomicUsize = AtomicUsize::new(0);

fn dirs() -> &'static Mutex<HashSet<usize>> {
    static DIRS: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    DIRS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Our `Dir` behind `d`, if `d` is one of ours.
fn our_dir<'a>(d: *mut c_void) -> Option<&'a mut Dir> {
    if is_inside() || OPEN_DIRS.load(Ordering::Acquire) == 0 || d.is_null() {
        return None;
    }
    if !dirs().lock().unwrap_or_else(|p| p.into_inner()).contains(&(d as usize)) {
        return None;
    }
    // SAFETY: the address is in DIRS, so it is a live `Box<Dir>` this library made and
    // has not freed; DIR streams are not shared between threads without locking (POSIX).
    Some(unsafe { &mut *d.cast::<Dir>() })
}

fn new_dir(fd: c_int, path: String) -> *mut c_void {
    // SAFETY: all-zero bytes are a valid dirent64.
    let entry: libc::dirent64 = unsafe { std::mem::zeroed() };
    let d = Box::into_raw(Box::new(Dir { fd, path, stream: None, dots: 2, entry, position: 0, held: false }))
        .cast::<c_void>();
    dirs().lock().unwrap_or_else(|p| p.into_inner()).insert(d as usize);
    OPEN_DIRS.fetch_add(1, Ordering::AcqRel);
    d
}

fn do_opendir(path: &str) -> Result<*mut c_void, PosixError> {
    let fd = do_open(path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC)?;
    Ok(new_dir(fd, path.to_owned()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut c_void {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
        return dpuio(|| do_opendir(&p));
    }
    libc_call!(opendir(path) as fn(*const c_char) -> *mut c_void)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut c_void {
    if let Some(n) = node(fd) {
        return match &*n {
            Node::Directory { path, .. } => new_dir(fd, path.clone()),
            Node::File(_) => fail(libc::ENOTDIR),
        };
    }
    libc_call!(fdopendir(fd) as fn(c_int) -> *mut c_void)
}

/// The next entry of `d`, into `d.entry`; `Ok(false)` at the end.
fn next_entry(d: &mut Dir) -> Result<bool, PosixError> {
    let (name, ino, kind) = if d.dots > 0 {
        d.dots -= 1;
        let name = if d.dots == 1 { "." } else { ".." };
        (
            name.to_owned(),
            inode(&d.path, &Attr { kind: EntryKind::Directory, size: 0, mode: 0, mtime_ns: 0, object_id: 0 }),
            libc::DT_DIR,
        )
    } else {
        if d.stream.is_none() {
            d.stream = Some(mount()?.readdir(&d.path)?);
        }
        let Some(stream) = d.stream.as_mut() else { return Ok(false) };
        match stream.next_entry()? {
            None => return Ok(false),
            Some(e) => {
                let path = join(&d.path, &e.name);
                let kind = if e.attr.kind == EntryKind::Directory { libc::DT_DIR } else { libc::DT_REG };
                (e.name, inode(&path, &e.attr), kind)
            }
        }
    };
    d.position += 1;
    d.entry.d_ino = ino;
    d.entry.d_off = d.position;
    d.entry.d_type = kind;
    d.entry.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
    let bytes = name.as_bytes();
    let n = bytes.len().min(d.entry.d_name.len() - 1);
    for (dst, src) in d.entry.d_name.iter_mut().zip(&bytes[..n]) {
        *dst = *src as c_char;
    }
    d.entry.d_name[n] = 0;
    Ok(true)
}

fn do_readdir(d: &mut Dir) -> *mut libc::dirent64 {
    inside(|| match next_entry(d) {
        Ok(true) => &mut d.entry as *mut libc::dirent64,
        // The end: NULL with errno untouched.
        Ok(false) => std::ptr::null_mut(),
        Err(e) => fail(e.errno),
    })
}

interpose! {
    fn readdir | readdir64 (d: *mut c_void) -> *mut libc::dirent64 {
        if let Some(dir) = our_dir(d) {
            return do_readdir(dir);
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn closedir(d: *mut c_void) -> c_int {
    if let Some(dir) = our_dir(d) {
        let fd = dir.fd;
        dirs().lock().unwrap_or_else(|p| p.into_inner()).remove(&(d as usize));
        OPEN_DIRS.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: made by Box::into_raw in new_dir and now out of DIRS: freed once.
        inside(|| drop(unsafe { Box::from_raw(d.cast::<Dir>()) }));
        // SAFETY: the descriptor this stream owned.
        return unsafe { close(fd) };
    }
    libc_call!(closedir(d) as fn(*mut c_void) -> c_int)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dirfd(d: *mut c_void) -> c_int {
    if let Some(dir) = our_dir(d) {
        return dir.fd;
    }
    libc_call!(dirfd(d) as fn(*mut c_void) -> c_int)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rewinddir(d: *mut c_void) {
    if let Some(dir) = our_dir(d) {
        inside(|| {
            dir.stream = None;
            dir.dots = 2;
            dir.position = 0;
            dir.held = false;
        });
        return;
    }
    if let Some(f) = real!(rewinddir as fn(*mut c_void) -> ()) {
        // SAFETY: the caller's stream, to libc's function.
        unsafe { f(d) }
    }
}

// Every libc function that takes a `DIR*` must be here: handed one of ours, libc's
// would read a `Dir` as its own structure.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn telldir(d: *mut c_void) -> std::ffi::c_long {
    if let Some(dir) = our_dir(d) {
        return dir.position as std::ffi::c_long;
    }
    libc_call!(telldir(d) as fn(*mut c_void) -> std::ffi::c_long)
}

/// Back to a position `telldir` gave: start over and skip that many entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn seekdir(d: *mut c_void, position: std::ffi::c_long) {
    if let Some(dir) = our_dir(d) {
        inside(|| {
            dir.stream = None;
            dir.dots = 2;
            dir.position = 0;
            dir.held = false;
            while (dir.position as std::ffi::c_long) < position {
                if !matches!(next_entry(dir), Ok(true)) {
                    break;
                }
            }
        });
        return;
    }
    if let Some(f) = real!(seekdir as fn(*mut c_void, std::ffi::c_long) -> ()) {
        // SAFETY: the caller's stream, to libc's function.
        unsafe { f(d, position) }
    }
}

/// The reentrant form: the entry is copied into the caller's `entry`.
unsafe fn our_readdir_r(dir: &mut Dir, entry: *mut libc::dirent64, result: *mut *mut libc::dirent64) -> c_int {
    inside(|| match next_entry(dir) {
        Ok(true) => {
            // SAFETY: the caller's dirent and result pointers (readdir_r's contract).
            unsafe {
                *entry = dir.entry;
                *result = entry;
            }
            0
        }
        Ok(false) => {
            // SAFETY: as above.
            unsafe { *result = std::ptr::null_mut() };
            0
        }
        Err(e) => e.errno,
    })
}

interpose! {
    fn readdir_r | readdir64_r (d: *mut c_void, entry: *mut libc::dirent64, result: *mut *mut libc::dirent64) -> c_int {
        if let Some(dir) = our_dir(d) {
            // SAFETY: the caller's arguments.
            return unsafe { our_readdir_r(dir, entry, result) };
        }
    }
}

/// Listings of directory descriptors read with `getdents64` rather than a `DIR*`.
fn listings() -> &'static Mutex<std::collections::HashMap<c_int, Box<Dir>>> {
    static LISTINGS: OnceLock<Mutex<std::collections::HashMap<c_int, Box<Dir>>>> = OnceLock::new();
    LISTINGS.get_or_init(|| Mutex::new(std::collections::HashMap::new()))
}

/// Offset of `d_name` in a kernel `linux_dirent64` record.
const DIRENT_NAME_OFFSET: usize = 19;

fn do_getdents(fd: c_int, path: &str, out: &mut [u8]) -> Result<isize, PosixError> {
    let mut listings = listings().lock().unwrap_or_else(|p| p.into_inner());
    let d = listings.entry(fd).or_insert_with(|| {
        // SAFETY: all-zero bytes are a valid dirent64.
        let entry: libc::dirent64 = unsafe { std::mem::zeroed() };
        Box::new(Dir { fd, path: path.to_owned(), stream: None, dots: 2, entry, position: 0, held: false })
    });
    let mut used = 0;
    loop {
        if !d.held {
            if !next_entry(d)? {
                break;
            }
            d.held = true;
        }
        let name: Vec<u8> = d.entry.d_name.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
        let reclen = (DIRENT_NAME_OFFSET + name.len() + 1).next_multiple_of(8);
        if used + reclen > out.len() {
            if used == 0 {
                return Err(errno_error(libc::EINVAL, "getdents64: buffer too small for the next entry"));
            }
            break;
        }
        let record = &mut out[used..used + reclen];
        record.fill(0);
        record[0..8].copy_from_slice(&d.entry.d_ino.to_ne_bytes());
        record[8..16].copy_from_slice(&d.entry.d_off.to_ne_bytes());
        record[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
        record[18] = d.entry.d_type;
        record[DIRENT_NAME_OFFSET..DIRENT_NAME_OFFSET + name.len()].copy_from_slice(&name);
        used += reclen;
        d.held = false;
    }
    Ok(used as isize)
}

/// Direct readers of directory descriptors (glibc's own `readdir` uses an internal
/// call; this is for programs that call `getdents64` themselves).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    if let Some(n) = node(fd) {
        return match &*n {
            Node::Directory { path, .. } => {
                // SAFETY: the caller's buffer of `len` bytes.
                let out = unsafe { buffer(buf, len) };
                dpuio(|| do_getdents(fd, path, out))
            }
            Node::File(_) => fail(libc::ENOTDIR),
        };
    }
    libc_call!(getdents64(fd, buf, len) as fn(c_int, *mut c_void, size_t) -> ssize_t)
}

// ---- stdio --------------------------------------------------------------------------

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
fn mode_flags(mode: &[u8]) -> Option<c_int> {
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

// ---- mmap ---------------------------------------------------------------------------

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fopen_modes_are_the_open_flags_of_the_c_standard() {
        use libc::{O_APPEND, O_CLOEXEC, O_CREAT, O_EXCL, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY};
        let cases: [(&[u8], Option<c_int>); 9] = [
            (b"r", Some(O_RDONLY)),
            (b"rb", Some(O_RDONLY)),
            (b"r+", Some(O_RDWR)),
            (b"w", Some(O_WRONLY | O_CREAT | O_TRUNC)),
            (b"wb+", Some(O_RDWR | O_CREAT | O_TRUNC)),
            (b"a", Some(O_WRONLY | O_CREAT | O_APPEND)),
            (b"wx", Some(O_WRONLY | O_CREAT | O_TRUNC | O_EXCL)),
            (b"re", Some(O_RDONLY | O_CLOEXEC)),
            (b"q", None),
        ];
        for (mode, want) in cases {
            assert_eq!(mode_flags(mode), want, "{}", String::from_utf8_lossy(mode));
        }
    }

    #[test]
    fn open_flags_say_which_way_and_how() {
        let f = open_flags(libc::O_RDONLY);
        assert!(f.read && !f.write && !f.create);
        let f = open_flags(libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL);
        assert!(!f.read && f.write && f.create && f.exclusive && !f.truncate);
        let f = open_flags(libc::O_RDWR | libc::O_APPEND | libc::O_TRUNC);
        assert!(f.read && f.write && f.append && f.truncate);
    }

    #[test]
    fn placeholder_labels_name_what_an_exec_inherits() {
        let attr = Attr { kind: EntryKind::Directory, size: 0, mode: 0, mtime_ns: 0, object_id: 0 };
        let dir = Node::Directory { path: "/a/b".into(), attr };
        assert_eq!(label(&dir, libc::O_RDONLY), "dpuio:d:/a/b");
        let link = |label: &str| format!("/memfd:{label} (deleted)");
        assert!(matches!(parse_label(&link("dpuio:d:/a/b")), Some(Node::Directory { path, .. }) if path == "/a/b"));
        let Some(Node::File(f)) = parse_label(&link("dpuio:401:/x y/z")) else { panic!("a file label") };
        assert_eq!(f.path, "/x y/z");
        assert!(f.flags.write && !f.flags.read && f.flags.append && !f.flags.create);
        for other in
            ["/dev/null", "/memfd:other (deleted)", "/memfd:dpuio:zz:/p (deleted)", "/memfd:dpuio:0:rel (deleted)"]
        {
            assert!(parse_label(other).is_none(), "{other}");
        }
    }

    #[test]
    fn without_a_prefix_nothing_is_dpuio() {
        // The test process has no DPUIO_MOUNT: every path goes to libc.
        // SAFETY: a NUL-terminated literal.
        assert!(unsafe { at_path(libc::AT_FDCWD, c"/mnt/dpuio/x".as_ptr()) }.is_none());
        assert!(!is_marked(0) && !is_marked(-1) && !is_marked(1 << 20));
    }
}
