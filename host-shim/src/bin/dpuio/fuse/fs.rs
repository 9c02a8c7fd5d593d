//! The file system the kernel talks to: its requests by inode number become calls of
//! [`Mount`] by path, with the open files and directory listings of the mount.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dpuio_shim::posix::{Mount, OpenFile, OpenFlags, Opened, PosixError, join};
use dpuio_shim::{Attr, DirEntry, EntryKind};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use super::{IO_BYTES, MAX_HANDLES, TTL};
use crate::inodes::Inodes;

/// An open file of the mount.
struct OpenHandle {
    /// The agent's open file: from the open, or from the first call that needs it when
    /// the open was answered from the kernel's cache ([`DpuioFs::open`]).
    file: OnceLock<OpenFile>,
    /// What opens it then.
    path: String,
    flags: OpenFlags,
    /// Written since the last flush or fsync: `close(2)` then makes it durable.
    dirty: AtomicBool,
}

impl OpenHandle {
    fn opened(file: OpenFile) -> OpenHandle {
        let (path, flags) = (file.path().to_owned(), file.flags());
        OpenHandle { file: OnceLock::from(file), path, flags, dirty: AtomicBool::new(false) }
    }

    /// A read-only open the kernel's page cache is expected to answer: the agent's
    /// open waits for a read that reaches the daemon.
    fn lazy(path: String, flags: OpenFlags) -> OpenHandle {
        OpenHandle { file: OnceLock::new(), path, flags, dirty: AtomicBool::new(false) }
    }

    /// The open file, opened at the agent now if it was not.
    fn open_file(&self, mount: &Mount) -> Result<&OpenFile, PosixError> {
        if let Some(file) = self.file.get() {
            return Ok(file);
        }
        let Opened::File(file) = mount.open(&self.path, self.flags)? else {
            return Err(PosixError::new(rustix::io::Errno::ISDIR, format!("{}: is a directory now", self.path)));
        };
        // Two reads racing to open: the second's file is closed again.
        if let Err(extra) = self.file.set(file) {
            let _ = mount.close(extra);
        }
        Ok(self.file.get().expect("set above"))
    }
}

/// An open directory: what was listed so far (the kernel reads on by offset).
struct Listing {
    path: String,
    attr: Attr,
    stream: dpuio_shim::posix::Listing,
    entries: Vec<DirEntry>,
    finished: bool,
}

impl Listing {
    /// The entry at `index`, fetching batches up to it.
    fn get(&mut self, index: usize) -> Result<Option<&DirEntry>, PosixError> {
        while self.entries.len() <= index && !self.finished {
            match self.stream.next_batch()? {
                Some(batch) => self.entries.extend(batch),
                None => self.finished = true,
            }
        }
        Ok(self.entries.get(index))
    }
}

#[derive(Clone)]
enum Handle {
    File(Arc<OpenHandle>),
    Directory(Arc<Mutex<Listing>>),
}

/// The file system the kernel talks to.
pub(super) struct DpuioFs {
    mount: Mount,
    inodes: Mutex<Inodes>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_handle: AtomicU64,
    /// Size and modification time of each file as last opened: what the kernel's
    /// page cache may hold, kept (`FOPEN_KEEP_CACHE`) when the file is unchanged.
    cached: Mutex<HashMap<u64, (u64, i64)>>,
    uid: u32,
    gid: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn errno(e: &PosixError) -> Errno {
    Errno::from_i32(e.errno)
}

thread_local! {
    /// Each request thread's read buffer, reused so a read allocates nothing.
    static READ_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl DpuioFs {
    pub(super) fn new(mount: Mount) -> DpuioFs {
        DpuioFs {
            mount,
            inodes: Mutex::new(Inodes::new()),
            handles: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            cached: Mutex::new(HashMap::new()),
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
        }
    }

    /// A failure for the kernel: the errno; logged when it is an I/O error, whose
    /// cause the program will not see.
    fn fail(&self, op: &str, e: PosixError) -> Errno {
        if e.errno == Errno::EIO.code() {
            let _ = writeln!(std::io::stderr(), "dpuio mount: {op}: {e}");
        }
        errno(&e)
    }

    fn path(&self, ino: INodeNo) -> Result<String, Errno> {
        lock(&self.inodes).path(ino.0).map(str::to_owned).ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<String, Errno> {
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        Ok(join(&self.path(parent)?, name))
    }

    fn attr(&self, ino: u64, a: &Attr) -> FileAttr {
        let (kind, nlink, default_perm) = match a.kind {
            EntryKind::Directory => (FileType::Directory, 2, 0o755),
            EntryKind::File => (FileType::RegularFile, 1, 0o644),
        };
        let perm = match a.mode & 0o7777 {
            0 => default_perm,
            mode => mode as u16,
        };
        let nanos = Duration::from_nanos(a.mtime_ns.unsigned_abs());
        let mtime = if a.mtime_ns >= 0 { UNIX_EPOCH + nanos } else { UNIX_EPOCH - nanos };
        FileAttr {
            ino: INodeNo(ino),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: IO_BYTES,
            flags: 0,
        }
    }

    /// Reply with the entry at `path` (counting a lookup), from `attr`.
    fn entry(&self, path: &str, attr: &Attr, reply: ReplyEntry) {
        let ino = lock(&self.inodes).remember(path);
        reply.entry(&TTL, &self.attr(ino, attr), Generation(0));
    }

    fn add_handle(&self, handle: Handle) -> Result<FileHandle, Errno> {
        let mut handles = lock(&self.handles);
        if handles.len() >= MAX_HANDLES {
            return Err(Errno::EMFILE);
        }
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        handles.insert(fh, handle);
        Ok(FileHandle(fh))
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<OpenHandle>, Errno> {
        match lock(&self.handles).get(&fh.0) {
            Some(Handle::File(f)) => Ok(f.clone()),
            Some(Handle::Directory(_)) => Err(Errno::EISDIR),
            None => Err(Errno::EBADF),
        }
    }

    fn directory(&self, fh: FileHandle) -> Result<Arc<Mutex<Listing>>, Errno> {
        match lock(&self.handles).get(&fh.0) {
            Some(Handle::Directory(d)) => Ok(d.clone()),
            Some(Handle::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::EBADF),
        }
    }

    /// Open `path` with `flags` as a handle; whether the kernel may keep its cached
    /// pages (the file is as it was when last opened).
    fn open_file(&self, path: &str, flags: OpenFlags) -> Result<(OpenFile, bool), PosixError> {
        match self.mount.open(path, flags)? {
            Opened::File(file) => {
                let ino = lock(&self.inodes).assign(path);
                let now = (file.attr().size, file.attr().mtime_ns);
                let keep = lock(&self.cached).insert(ino, now) == Some(now);
                Ok((file, keep))
            }
            Opened::Directory(_) => Err(PosixError::new(rustix::io::Errno::ISDIR, format!("{path}: is a directory"))),
        }
    }

    /// Whether a read-only open of `ino` at `path` can be answered from the kernel's
    /// page cache: it holds pages of the file as it was when last opened, and a stat
    /// (no data, where an open of a small file reads it whole) finds it unchanged.
    fn kernel_keeps(&self, ino: u64, path: &str, flags: OpenFlags) -> bool {
        if flags.write || flags.truncate || flags.create || flags.append {
            return false;
        }
        let Some(then) = lock(&self.cached).get(&ino).copied() else { return false };
        self.mount.stat(path).is_ok_and(|a| a.kind == EntryKind::File && (a.size, a.mtime_ns) == then)
    }

    /// What the kernel's page cache holds of `ino` is stale now.
    fn changed(&self, ino: u64) {
        lock(&self.cached).remove(&ino);
    }

    fn listing_reply<R: DirectoryReply>(&self, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: R) {
        let listing = match self.directory(fh) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let mut listing = lock(&listing);
        let parent = {
            let parent = join(&listing.path, "..");
            lock(&self.inodes).assign(&parent)
        };
        let mut index = offset;
        loop {
            let (name, entry_ino, attr, counted) = match index {
                0 => (".".to_owned(), ino.0, listing.attr.clone(), false),
                1 => ("..".to_owned(), parent, listing.attr.clone(), false),
                n => {
                    let dir = listing.path.clone();
                    let entry = match listing.get((n - 2) as usize) {
                        Ok(Some(entry)) => entry.clone(),
                        Ok(None) => break,
                        Err(e) => return reply.error(self.fail("readdir", e)),
                    };
                    let path = join(&dir, &entry.name);
                    let mut inodes = lock(&self.inodes);
                    let ino = if R::COUNTS_LOOKUPS { inodes.remember(&path) } else { inodes.assign(&path) };
                    (entry.name, ino, entry.attr, R::COUNTS_LOOKUPS)
                }
            };
            if reply.add(INodeNo(entry_ino), index + 1, &name, &self.attr(entry_ino, &attr)) {
                // Full: this entry was not sent, so the kernel holds no lookup of it.
                if counted {
                    lock(&self.inodes).forget(entry_ino, 1);
                }
                break;
            }
            index += 1;
        }
        reply.ok();
    }
}

/// `readdir` and `readdirplus` replies, filled by one loop.
trait DirectoryReply {
    /// The kernel counts a lookup for each entry it receives (`readdirplus`).
    const COUNTS_LOOKUPS: bool;
    /// Add an entry; true when the reply is full and the entry was not added.
    fn add(&mut self, ino: INodeNo, next_offset: u64, name: &str, attr: &FileAttr) -> bool;
    fn ok(self);
    fn error(self, e: Errno);
}

impl DirectoryReply for ReplyDirectory {
    const COUNTS_LOOKUPS: bool = false;
    fn add(&mut self, ino: INodeNo, next_offset: u64, name: &str, attr: &FileAttr) -> bool {
        ReplyDirectory::add(self, ino, next_offset, attr.kind, name)
    }
    fn ok(self) {
        ReplyDirectory::ok(self)
    }
    fn error(self, e: Errno) {
        ReplyDirectory::error(self, e)
    }
}

impl DirectoryReply for ReplyDirectoryPlus {
    const COUNTS_LOOKUPS: bool = true;
    fn add(&mut self, ino: INodeNo, next_offset: u64, name: &str, attr: &FileAttr) -> bool {
        ReplyDirectoryPlus::add(self, ino, next_offset, name, &TTL, attr, Generation(0))
    }
    fn ok(self) {
        ReplyDirectoryPlus::ok(self)
    }
    fn error(self, e: Errno) {
        ReplyDirectoryPlus::error(self, e)
    }
}

/// `open(2)` flags as [`OpenFlags`]. `O_APPEND` is left to the kernel, which sends
/// every write with its offset.
fn open_flags(flags: i32) -> OpenFlags {
    let access = flags & rustix::fs::OFlags::ACCMODE.bits() as i32;
    let has = |f: rustix::fs::OFlags| flags & f.bits() as i32 != 0;
    OpenFlags {
        read: access != rustix::fs::OFlags::WRONLY.bits() as i32,
        write: access != rustix::fs::OFlags::RDONLY.bits() as i32,
        create: has(rustix::fs::OFlags::CREATE),
        exclusive: has(rustix::fs::OFlags::EXCL),
        truncate: has(rustix::fs::OFlags::TRUNC),
        append: false,
    }
}

impl Filesystem for DpuioFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Each is a wish the kernel may cap; what it grants is fine.
        let _ = config.set_max_write(IO_BYTES).or_else(|max| config.set_max_write(max));
        let _ = config.set_max_readahead(IO_BYTES).or_else(|max| config.set_max_readahead(max));
        let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_PARALLEL_DIROPS);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.mount.stat(&path) {
            Ok(attr) => self.entry(&path, &attr, reply),
            Err(e) => reply.error(self.fail("lookup", e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        lock(&self.inodes).forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let attr = match fh.map(|fh| self.file(fh)) {
            Some(Ok(f)) => match f.file.get() {
                Some(file) => self.mount.fstat(file),
                None => self.mount.stat(&f.path),
            },
            _ => match self.path(ino) {
                Ok(path) => self.mount.stat(&path),
                Err(e) => return reply.error(e),
            },
        };
        match attr {
            Ok(attr) => reply.attr(&TTL, &self.attr(ino.0, &attr)),
            // A token narrowed to a prefix may not stat the container's root, yet the
            // mount point is a directory whatever the token says (its entries are
            // still checked one by one).
            Err(e) if ino == INodeNo::ROOT && e.errno == Errno::EACCES.code() => {
                let root = Attr { kind: EntryKind::Directory, size: 0, mode: 0o755, mtime_ns: 0, object_id: 0 };
                reply.attr(&TTL, &self.attr(ino.0, &root))
            }
            Err(e) => reply.error(self.fail("getattr", e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        // Only the size is stored; modes, owners and times are accepted and kept as they
        // are (see the module docs).
        if let Some(size) = size {
            let open = fh.and_then(|fh| self.file(fh).ok()).filter(|f| f.flags.write);
            let truncated = match &open {
                Some(f) => f.open_file(&self.mount).and_then(|file| self.mount.ftruncate(file, size)),
                None => self.mount.truncate(&path, size),
            };
            if let Err(e) = truncated {
                return reply.error(self.fail("truncate", e));
            }
            self.changed(ino.0);
        }
        match self.mount.stat(&path) {
            Ok(attr) => reply.attr(&TTL, &self.attr(ino.0, &attr)),
            Err(e) => reply.error(self.fail("setattr", e)),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, _mode: u32, _umask: u32, reply: ReplyEntry) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.mount.mkdir(&path).and_then(|()| self.mount.stat(&path)) {
            Ok(attr) => self.entry(&path, &attr, reply),
            Err(e) => reply.error(self.fail("mkdir", e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        // The kernel has refused unlink of a directory already (from the entry's
        // attributes, at most TTL old): no stat first.
        self.remove(parent, name, reply, |path| self.mount.remove_checked(path));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, reply, |path| self.mount.remove_checked(path));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (from, to) = match (self.child(parent, name), self.child(newparent, newname)) {
            (Ok(from), Ok(to)) => (from, to),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        let renamed = if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return reply.error(Errno::EINVAL);
        } else if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            self.mount.rename_noreplace(&from, &to)
        } else {
            self.mount.rename(&from, &to)
        };
        match renamed {
            Ok(()) => {
                let mut inodes = lock(&self.inodes);
                if let Some(ino) = inodes.path_ino(&to) {
                    self.changed(ino);
                }
                inodes.renamed(&from, &to);
                reply.ok()
            }
            Err(e) => reply.error(self.fail("rename", e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: fuser::OpenFlags, reply: ReplyOpen) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let flags = open_flags(flags.0);
        let opened = if self.kernel_keeps(ino.0, &path, flags) {
            Ok((OpenHandle::lazy(path, flags), true))
        } else {
            self.open_file(&path, flags).map(|(file, keep)| (OpenHandle::opened(file), keep))
        };
        let added = opened.map_err(|e| self.fail("open", e)).and_then(|(handle, keep)| {
            let fh = self.add_handle(Handle::File(Arc::new(handle)))?;
            Ok((fh, keep))
        });
        match added {
            Ok((fh, keep)) => reply.opened(fh, if keep { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() }),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let f = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        READ_BUFFER.with_borrow_mut(|buffer| {
            buffer.resize(size as usize, 0);
            match f.open_file(&self.mount).and_then(|file| self.mount.read_at(file, buffer, offset)) {
                Ok(n) => reply.data(&buffer[..n]),
                Err(e) => reply.error(self.fail("read", e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let f = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        f.dirty.store(true, Ordering::Release);
        match f.open_file(&self.mount).and_then(|file| self.mount.write_at(file, data, offset)) {
            Ok((_, n)) => {
                self.changed(ino.0);
                reply.written(n as u32)
            }
            Err(e) => reply.error(self.fail("write", e)),
        }
    }

    /// `close(2)` of a descriptor: a file written since the last sync is synced, so
    /// what was written is durable when `close` returns, as the preload path makes it.
    fn flush(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        let f = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        if f.dirty.swap(false, Ordering::AcqRel)
            && let Err(e) = f.open_file(&self.mount).and_then(|file| self.mount.fsync(file))
        {
            return reply.error(self.fail("flush", e));
        }
        reply.ok()
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let handle = lock(&self.handles).remove(&fh.0);
        // The kernel releases a handle once no request uses it, so this is the last
        // reference; should a racing request still hold one, the agent closes the
        // handle when the session ends.
        let Some(Handle::File(f)) = handle else { return reply.ok() };
        match Arc::into_inner(f).and_then(|f| f.file.into_inner()) {
            Some(file) => match self.mount.close(file) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(self.fail("close", e)),
            },
            // Never opened at the agent (its pages were the kernel's), or still in use.
            None => reply.ok(),
        }
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let f = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        f.dirty.store(false, Ordering::Release);
        // Nothing to make durable of a file never opened at the agent.
        let Some(file) = f.file.get() else { return reply.ok() };
        match self.mount.fsync(file) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.fail("fsync", e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: fuser::OpenFlags, reply: ReplyOpen) {
        let path = match self.path(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let listing = self.mount.open_directory(&path).and_then(|attr| {
            let stream = self.mount.readdir(&path)?;
            Ok(Listing { path, attr, stream, entries: Vec::new(), finished: false })
        });
        let added = listing
            .map_err(|e| self.fail("opendir", e))
            .and_then(|l| self.add_handle(Handle::Directory(Arc::new(Mutex::new(l)))));
        match added {
            Ok(fh) => reply.opened(fh, FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        self.listing_reply(ino, fh, offset, reply);
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: ReplyDirectoryPlus) {
        self.listing_reply(ino, fh, offset, reply);
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: fuser::OpenFlags, reply: ReplyEmpty) {
        lock(&self.handles).remove(&fh.0);
        reply.ok();
    }

    /// Fixed figures: the agent tells no capacity, and programs that check free space
    /// before writing (installers, `df`) should neither refuse nor divide by zero.
    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        const BLOCK_BYTES: u32 = 4096;
        const BLOCKS: u64 = (1 << 50) / BLOCK_BYTES as u64; // 1 PiB
        const FILES: u64 = 1 << 32;
        reply.statfs(BLOCKS, BLOCKS, BLOCKS, FILES, FILES, IO_BYTES, 255, BLOCK_BYTES);
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let flags = OpenFlags { create: true, ..open_flags(flags) };
        let (file, _) = match self.open_file(&path, flags) {
            Ok(opened) => opened,
            Err(e) => return reply.error(self.fail("create", e)),
        };
        let attr = file.attr().clone();
        let fh = match self.add_handle(Handle::File(Arc::new(OpenHandle::opened(file)))) {
            Ok(fh) => fh,
            Err(e) => return reply.error(e),
        };
        let ino = lock(&self.inodes).remember(&path);
        reply.created(&TTL, &self.attr(ino, &attr), Generation(0), fh, FopenFlags::empty());
    }
}

impl DpuioFs {
    /// `unlink` or `rmdir` of `name` in `parent` by `remove`.
    fn remove(
        &self,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
        remove: impl FnOnce(&str) -> Result<(), PosixError>,
    ) {
        let path = match self.child(parent, name) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match remove(&path) {
            Ok(()) => {
                let mut inodes = lock(&self.inodes);
                if let Some(ino) = inodes.path_ino(&path) {
                    self.changed(ino);
                }
                inodes.removed(&path);
                reply.ok()
            }
            Err(e) => reply.error(self.fail("remove", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_flags_say_what_the_program_asked_for() {
        use rustix::fs::OFlags;
        let f = |flags: OFlags| open_flags(flags.bits() as i32);
        let read = f(OFlags::RDONLY);
        assert!(read.read && !read.write && !read.create && !read.truncate);
        let write = f(OFlags::WRONLY | OFlags::TRUNC | OFlags::APPEND);
        assert!(!write.read && write.write && write.truncate);
        assert!(!write.append, "the kernel sends appends with their offset");
        let both = f(OFlags::RDWR | OFlags::CREATE | OFlags::EXCL);
        assert!(both.read && both.write && both.create && both.exclusive);
    }
}
