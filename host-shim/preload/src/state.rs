//! The library's state: the prefix, the mount (attached lazily, again after fork) and
//! the table from descriptor numbers to open dpuio files and directories.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use dpuio_shim::posix::{Mount, OpenFile, OpenFlags, Opened, PosixError, mount_relative};
use dpuio_shim::{Attr, EntryKind};

/// Descriptors at or above this number are never dpuio's: the fast path for every
/// other descriptor is one load from [`MARKED`].
pub const MAX_FDS: usize = 1 << 16;

/// `MARKED[fd]`: `fd` is in [`table`]. Read without a lock by every interposer.
static MARKED: [AtomicBool; MAX_FDS] = [const { AtomicBool::new(false) }; MAX_FDS];

thread_local! {
    /// Set while this thread is inside the library: calls it makes then (the
    /// runtime's, the transport's) go straight to libc.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the recursion guard set.
pub fn inside<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            INSIDE.with(|i| i.set(self.0));
        }
    }
    let _reset = Reset(INSIDE.with(|i| i.replace(true)));
    f()
}

/// True when this thread is already inside the library.
pub fn is_inside() -> bool {
    INSIDE.try_with(|i| i.get()).unwrap_or(true)
}

/// `$DPUIO_MOUNT` without trailing slashes, or `None` (then the library is inert).
pub fn prefix() -> Option<&'static str> {
    static PREFIX: OnceLock<Option<String>> = OnceLock::new();
    PREFIX
        .get_or_init(|| {
            let p = std::env::var("DPUIO_MOUNT").ok()?;
            let p = p.trim_end_matches('/');
            (p.starts_with('/') && !p.is_empty()).then(|| p.to_owned())
        })
        .as_deref()
}

/// The dpuio path of a C path under the prefix, `None` for any other (or a null one).
///
/// # Safety
/// `path` is null or a NUL-terminated string.
pub unsafe fn dpuio_path(path: *const c_char) -> Option<String> {
    let prefix = prefix()?;
    if path.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract (that of the libc
    // function being interposed).
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    // The cheap test first: most paths of most programs are elsewhere.
    if !bytes.starts_with(prefix.as_bytes()) {
        return None;
    }
    mount_relative(prefix, std::str::from_utf8(bytes).ok()?)
}

/// The mount of this process, if attached (a forked child may see its parent's).
static MOUNT: Mutex<Option<&'static Mount>> = Mutex::new(None);

/// The mount of this process, attached on first use and again in a forked child (the
/// parent's is leaked there: its runtime threads and transport state are the
/// parent's).
pub fn mount() -> Result<&'static Mount, PosixError> {
    let mut mount = MOUNT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = *mount
        && !m.is_foreign()
    {
        return Ok(m);
    }
    let name = format!("dpuio-preload {} pid {}", std::env::args().next().unwrap_or_default(), std::process::id());
    let attached = Mount::from_env(&name).inspect_err(|e| {
        eprintln!("dpuio-preload: cannot attach to the agent for {}: {e}", prefix().unwrap_or(""));
    })?;
    let m: &'static Mount = Box::leak(Box::new(attached));
    *mount = Some(m);
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a function with no preconditions; handlers survive fork, and
    // the handler itself checks whose mount it finds.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(detach_at_exit);
    });
    Ok(m)
}

/// At exit, end the session now rather than leave it (and its open handles) to the
/// lease: short-lived programs (`find -exec`, shell loops) would otherwise pile up
/// sessions at the agent. Written handles are synced by the agent on detach.
extern "C" fn detach_at_exit() {
    let mount = MOUNT.try_lock().ok().and_then(|m| *m);
    if let Some(m) = mount.filter(|m| !m.is_foreign()) {
        // On a thread of its own: glibc has destroyed this thread's thread-locals
        // (tokio's runtime context among them) before it runs atexit handlers.
        let detach = std::thread::Builder::new().name("dpuio-detach".into()).spawn(move || {
            inside(|| {
                report(m);
                m.session().detach()
            })
        });
        if let Ok(thread) = detach {
            let _ = thread.join();
        }
    }
}

/// With `DPUIO_PRELOAD_STATS` set, one line on stderr at exit: the bytes this process
/// moved through dpuio (each copied once between a staging region and the program's
/// buffer, or twice for small files read whole at open) and the host CPU the whole
/// process used, for judging what the copies cost.
fn report(m: &Mount) {
    if std::env::var_os("DPUIO_PRELOAD_STATS").is_none() {
        return;
    }
    let stats = m.stats();
    let cpu = dpuio_shim::process_cpu_time();
    let progress = m.session().client().map(|c| c.data_plane_stats().progress_cpu).unwrap_or_default();
    eprintln!(
        "dpuio-preload: pid {} read {} bytes, wrote {} bytes (one copy each), read {} bytes of small files \
         whole at open (two copies); process CPU {:.3} s (data-plane progress thread {:.3} s)",
        std::process::id(),
        stats.bytes_read,
        stats.bytes_written,
        stats.bytes_snapshot,
        cpu.as_secs_f64(),
        progress.as_secs_f64()
    );
}

/// What a descriptor stands for.
pub enum Node {
    File(Arc<FileState>),
    /// A directory opened for reading (fts, `O_DIRECTORY`, `opendir`'s descriptor).
    Directory {
        path: String,
        attr: Attr,
    },
}

/// An open dpuio file shared by every descriptor duplicated from one `open` (they share
/// the offset, as kernel descriptors do).
pub struct FileState {
    pub path: String,
    pub flags: OpenFlags,
    pub offset: AtomicU64,
    /// The handle and the process that opened it: another process (a forked child)
    /// reopens the path and leaks the parent's handle.
    handle: Mutex<Option<(u32, Arc<OpenFile>)>>,
}

impl FileState {
    pub fn new(open: OpenFile) -> FileState {
        FileState {
            path: open.path().to_owned(),
            flags: open.flags(),
            offset: AtomicU64::new(0),
            handle: Mutex::new(Some((std::process::id(), Arc::new(open)))),
        }
    }

    /// A file inherited across exec: reopened by path on first use.
    pub fn inherited(path: String, flags: OpenFlags) -> FileState {
        FileState { path, flags, offset: AtomicU64::new(0), handle: Mutex::new(None) }
    }

    /// The handle of this process (reopened after fork or exec).
    pub fn handle(&self) -> Result<Arc<OpenFile>, PosixError> {
        let mut handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        match handle.as_ref() {
            Some((pid, file)) if *pid == std::process::id() => return Ok(file.clone()),
            _ => {}
        }
        let flags = OpenFlags { create: false, exclusive: false, truncate: false, ..self.flags };
        let Opened::File(file) = mount()?.open(&self.path, flags)? else {
            return Err(PosixError { errno: libc::EISDIR, message: format!("{}: is a directory now", self.path) });
        };
        let file = Arc::new(file);
        std::mem::forget(handle.replace((std::process::id(), file.clone())));
        Ok(file)
    }
}

impl Drop for FileState {
    fn drop(&mut self) {
        let handle = self.handle.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        match handle {
            Some((pid, file)) if pid == std::process::id() => {
                if let (Ok(file), Ok(m)) = (Arc::try_unwrap(file), mount()) {
                    let _ = m.close(file);
                }
            }
            // The parent's handle: its state is not this process's to drop.
            other => std::mem::forget(other),
        }
    }
}

fn table() -> &'static Mutex<HashMap<c_int, Arc<Node>>> {
    static TABLE: OnceLock<Mutex<HashMap<c_int, Arc<Node>>>> = OnceLock::new();
    TABLE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Whether `fd` is a dpuio descriptor (one atomic load).
pub fn is_marked(fd: c_int) -> bool {
    usize::try_from(fd).ok().and_then(|i| MARKED.get(i)).is_some_and(|m| m.load(Ordering::Acquire))
}

/// The node of a dpuio descriptor.
pub fn lookup(fd: c_int) -> Option<Arc<Node>> {
    if !is_marked(fd) {
        return None;
    }
    table().lock().unwrap_or_else(|p| p.into_inner()).get(&fd).cloned()
}

/// Record `fd` as standing for `node`; false if the number is too large to mark.
pub fn insert(fd: c_int, node: Arc<Node>) -> bool {
    let Some(mark) = usize::try_from(fd).ok().and_then(|i| MARKED.get(i)) else { return false };
    table().lock().unwrap_or_else(|p| p.into_inner()).insert(fd, node);
    mark.store(true, Ordering::Release);
    true
}

/// Forget `fd`; its node is closed at the agent when no other descriptor holds it.
pub fn remove(fd: c_int) -> Option<Arc<Node>> {
    let mark = usize::try_from(fd).ok().and_then(|i| MARKED.get(i))?;
    let node = table().lock().unwrap_or_else(|p| p.into_inner()).remove(&fd);
    mark.store(false, Ordering::Release);
    node
}

/// A stable inode number: the agent's object id, else a hash of the path (never 0,
/// which `ls` and `fts` treat as "unknown").
pub fn inode(path: &str, attr: &Attr) -> u64 {
    if attr.object_id != 0 {
        return attr.object_id;
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    h.finish() | 1
}

/// The device number every dpuio entry reports: one file system, distinct from others.
pub const DEVICE: u64 = 0xd9_1000;
/// The block size reported to programs: they size their reads by it, and one read of a
/// staging region's size is one request on the ring.
pub const BLOCK_BYTES: i64 = dpuio_shim::posix::REGION_BYTES as i64;

/// `st_mode` of an entry.
pub fn mode(attr: &Attr) -> u32 {
    let (kind, default) = match attr.kind {
        EntryKind::Directory => (libc::S_IFDIR, 0o755),
        EntryKind::File => (libc::S_IFREG, 0o644),
    };
    let perms = attr.mode & 0o7777;
    kind | if perms == 0 { default } else { perms }
}

/// Fill a `struct stat` from attributes.
pub fn fill_stat(st: &mut libc::stat64, path: &str, attr: &Attr) {
    // SAFETY: all-zero bytes are a valid `stat64` (integers only).
    *st = unsafe { std::mem::zeroed() };
    st.st_dev = DEVICE;
    st.st_ino = inode(path, attr);
    st.st_mode = mode(attr);
    // 1 for directories too: "link count unknown", so fts and find never skip
    // subdirectories on the strength of a count this file system does not keep.
    st.st_nlink = 1;
    // SAFETY: getuid/getgid cannot fail.
    st.st_uid = unsafe { libc::getuid() };
    // SAFETY: as above.
    st.st_gid = unsafe { libc::getgid() };
    st.st_size = attr.size as i64;
    st.st_blksize = BLOCK_BYTES;
    st.st_blocks = attr.size.div_ceil(512) as i64;
    let (s, ns) = (attr.mtime_ns.div_euclid(1_000_000_000), attr.mtime_ns.rem_euclid(1_000_000_000));
    st.st_mtime = s;
    st.st_mtime_nsec = ns;
    st.st_ctime = s;
    st.st_ctime_nsec = ns;
    st.st_atime = s;
    st.st_atime_nsec = ns;
}

/// Fill a `struct statx` from attributes.
pub fn fill_statx(stx: &mut libc::statx, path: &str, attr: &Attr) {
    // SAFETY: all-zero bytes are a valid `statx` (integers and padding only).
    *stx = unsafe { std::mem::zeroed() };
    stx.stx_mask = libc::STATX_BASIC_STATS;
    stx.stx_blksize = BLOCK_BYTES as u32;
    stx.stx_nlink = 1;
    // SAFETY: getuid/getgid cannot fail.
    stx.stx_uid = unsafe { libc::getuid() };
    // SAFETY: as above.
    stx.stx_gid = unsafe { libc::getgid() };
    stx.stx_mode = mode(attr) as u16;
    stx.stx_ino = inode(path, attr);
    stx.stx_size = attr.size;
    stx.stx_blocks = attr.size.div_ceil(512);
    // SAFETY: all-zero bytes are a valid `statx_timestamp`.
    let mut t: libc::statx_timestamp = unsafe { std::mem::zeroed() };
    t.tv_sec = attr.mtime_ns.div_euclid(1_000_000_000);
    t.tv_nsec = attr.mtime_ns.rem_euclid(1_000_000_000) as u32;
    stx.stx_atime = t;
    stx.stx_mtime = t;
    stx.stx_ctime = t;
    stx.stx_dev_major = (DEVICE >> 8) as u32;
    stx.stx_dev_minor = (DEVICE & 0xff) as u32;
}
