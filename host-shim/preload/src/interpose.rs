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

use dpuio_shim::posix::Listing;
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

// What the rooms below share: a directory's listing state, which `close` and `lseek`
// drop as well as the directory calls.

/// A `DIR*` this library made. Told apart from libc's by address ([`DIRS`]).
struct Dir {
    fd: c_int,
    path: String,
    stream: Option<Listing>,
    /// `.` and `..` still to be returned (2, 1, then 0).
    dots: u8,
    entry: libc::dirent64,
    position: i64,
    /// `entry` holds an entry not yet handed out (it did not fit a `getdents64` buffer).
    held: bool,
}

/// Listings of directory descriptors read with `getdents64` rather than a `DIR*`.
fn listings() -> &'static Mutex<std::collections::HashMap<c_int, Box<Dir>>> {
    static LISTINGS: OnceLock<Mutex<std::collections::HashMap<c_int, Box<Dir>>>> = OnceLock::new();
    LISTINGS.get_or_init(|| Mutex::new(std::collections::HashMap::new()))
}

mod dirs;
mod io;
mod mmap;
mod namespace;
mod open;
mod stat;
mod stdio;
#[cfg(test)]
mod tests;
