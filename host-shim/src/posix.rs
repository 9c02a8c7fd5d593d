//! A blocking, path-based POSIX layer over the client, for callers that stand in for a
//! file system: the `LD_PRELOAD` library (`host-shim/preload`) and `dpuio mount` (FUSE).
//!
//! It adds what POSIX callers take for granted and the dpuio API leaves out:
//! - a [`Mount`] attached from the environment (the `DPUIO_*` variables of the CLI);
//! - `errno` on every failure ([`PosixError`]), from [`Error::errno`];
//! - reads and writes between the caller's own memory and the file: data lands in a
//!   registered region from a small pool that is registered once and reused, then is
//!   copied once into the caller's buffer (what `pread` from the page cache costs
//!   anyway). Nothing is registered per call;
//! - POSIX shapes of namespace calls: `unlink` of a directory is `EISDIR`, `rmdir` of a
//!   file `ENOTDIR`, `rename` replaces a file that exists, `open` with `O_CREAT` but no
//!   `O_EXCL` opens or creates;
//! - fewer round trips where POSIX callers make many: a listing's attributes answer the
//!   stats that follow it for a TTL ([`Mount::set_listing_ttl`]), a handle
//!   closed with nothing written through it is closed with the next call
//!   ([`Mount::close`]), small files opened read-only are read whole at open
//!   ([`Mount::set_snapshot_bytes`]).
//!
//! What it deliberately does not do: file descriptors, offsets shared between them,
//! prefixes and path rewriting beyond [`mount_relative`], which belong to the caller.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

mod listed;

use crate::blocking::{Code, Failure, Session};
use crate::cli::ConnectArgs;
use crate::{
    Access, Attr, Buffer, DataPlaneOptions, EntryKind, Error, File, RegionPool, RegisteredRegion, Slot, SlotPool,
};

/// Bytes of each registered staging region; longer reads and writes go through it in
/// pieces of this size.
pub const REGION_BYTES: usize = 4 << 20;
/// Staging regions per mount at most (a thread without a free one waits).
const MAX_REGIONS: usize = 8;
/// Reads and writes of at most this many bytes take a slot of one shared region instead
/// of a whole region (a sample, a FUSE read, a 4 KiB block): a region holds 32, so as many
/// threads doing small I/O each have one, where the whole regions (as many as the
/// session's rings, two on a 2-core host) let only that many run at once.
const SLOT_BYTES: usize = 128 << 10;
/// Regions one read or write longer than a region stages in at once, when free: its
/// pieces go to the agent in one submission and run side by side, not one after the
/// other (an 8 MiB checkpoint chunk is two 4 MiB pieces).
const REGIONS_PER_CALL: usize = 4;

/// A mount's registered staging: whole regions, and slots of one more for small I/O.
#[derive(Clone)]
struct Staging {
    regions: RegionPool,
    slots: Option<Arc<SlotPool>>,
}

/// What one read or write stages its bytes in while it runs.
enum Staged {
    Region(Buffer),
    Slot(Slot),
}

impl Staging {
    /// A slot for `len` bytes that fit one, a whole region otherwise (waiting for one).
    fn take(&self, len: usize) -> Staged {
        match &self.slots {
            Some(slots) if len <= slots.slot_bytes() => Staged::Slot(slots.get()),
            _ => Staged::Region(self.regions.get()),
        }
    }

    /// Staging for `len` bytes: [`Staging::take`]'s, and for more than a region holds,
    /// further regions (up to [`REGIONS_PER_CALL`] in all) as far as they are free now:
    /// waiting for a second while holding one could wait for ever.
    fn take_for(&self, len: usize) -> Vec<Staged> {
        let first = self.take(len);
        let room = first.range().2;
        let mut staged = vec![first];
        if matches!(staged[0], Staged::Region(_)) {
            let wanted = len.div_ceil(room).min(REGIONS_PER_CALL);
            while staged.len() < wanted {
                let Some(more) = self.regions.try_get() else { break };
                staged.push(Staged::Region(more));
            }
        }
        staged
    }
}

/// The pieces of bytes `from..len` of a call, one per staging buffer in order until
/// they are all placed, all sent in one submission: (buffer, where the piece starts in the
/// call's bytes, its length).
fn pieces(staged: &[Staged], from: usize, len: usize) -> impl Iterator<Item = (&Staged, usize, usize)> {
    staged.iter().scan(from, move |at, buffer| {
        let n = len.saturating_sub(*at).min(buffer.range().2);
        let piece = (buffer, *at, n);
        *at += n;
        (n > 0).then_some(piece)
    })
}

impl Staged {
    /// The region, where in it the staged bytes start, and how many it holds.
    fn range(&self) -> (&RegisteredRegion, usize, usize) {
        match self {
            Staged::Region(buffer) => (buffer, 0, buffer.len()),
            Staged::Slot(slot) => (slot.region(), slot.offset(), slot.capacity()),
        }
    }
}

/// A failure with the `errno` a POSIX program expects and a message for people.
#[derive(Debug, Clone)]
pub struct PosixError {
    pub errno: i32,
    pub message: String,
}

impl PosixError {
    pub fn new(errno: rustix::io::Errno, message: impl Into<String>) -> PosixError {
        PosixError { errno: errno.raw_os_error(), message: message.into() }
    }
}

impl std::fmt::Display for PosixError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (errno {})", self.message, self.errno)
    }
}

impl std::error::Error for PosixError {}

impl From<Error> for PosixError {
    fn from(e: Error) -> PosixError {
        PosixError { errno: e.errno(), message: e.to_string() }
    }
}

impl From<Failure> for PosixError {
    fn from(f: Failure) -> PosixError {
        use rustix::io::Errno;
        let errno = match f.code {
            Code::InvalidArgument | Code::OutOfRange => Errno::INVAL,
            Code::NotFound => Errno::NOENT,
            Code::AlreadyExists => Errno::EXIST,
            Code::PermissionDenied => Errno::ACCESS,
            Code::ResourceExhausted => Errno::MFILE,
            Code::TimedOut => Errno::TIMEDOUT,
            Code::Busy => Errno::AGAIN,
            Code::Closed => Errno::BADF,
            Code::Unsupported => Errno::NOSYS,
            Code::FailedPrecondition
            | Code::Unavailable
            | Code::Io
            | Code::Integrity
            | Code::Protocol
            | Code::Internal => Errno::IO,
        };
        PosixError { errno: errno.raw_os_error(), message: f.message }
    }
}

pub type Result<T> = std::result::Result<T, PosixError>;

/// The path inside the container that `path` names when the mount is at `prefix`, or
/// `None` when `path` is not under it. Lexical, like the kernel's view of a mount
/// point without symlinks: `//` and `.` collapse, `..` climbs (so
/// `/mnt/dpuio/../etc` is not under `/mnt/dpuio`). `path` must be absolute.
pub fn mount_relative(prefix: &str, path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    let mut base = prefix.split('/').filter(|p| !p.is_empty() && *p != ".");
    let mut rest = parts.iter();
    for want in base.by_ref() {
        if rest.next() != Some(&want) {
            return None;
        }
    }
    let inside: Vec<&str> = rest.copied().collect();
    Some(format!("/{}", inside.join("/")))
}

/// `name` resolved against the container directory `dir` (both as dpuio paths), with
/// the same lexical rules as [`mount_relative`]; `..` never climbs above the root.
pub fn join(dir: &str, name: &str) -> String {
    if name.starts_with('/') {
        return mount_relative("/", name).unwrap_or_else(|| "/".into());
    }
    mount_relative("/", &format!("{dir}/{name}")).unwrap_or_else(|| "/".into())
}

/// How a file is opened, from `open(2)` flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenFlags {
    pub read: bool,
    pub write: bool,
    pub create: bool,
    pub exclusive: bool,
    pub truncate: bool,
    pub append: bool,
}

/// What `open` found.
pub enum Opened {
    File(OpenFile),
    /// A directory opened for reading (`opendir`, `O_DIRECTORY`, `fts`): no handle at the
    /// agent, its attributes as of open.
    Directory(Attr),
}

/// An open file: the agent's handle, or a small file's bytes, and how it was opened.
/// Offsets are the caller's.
pub struct OpenFile {
    backing: Backing,
    flags: OpenFlags,
    /// Size as far as this handle knows (for `O_APPEND` and `SEEK_END` without a round
    /// trip): the size at open, grown by this handle's writes.
    size: AtomicU64,
    /// Written or truncated through this handle (its close then waits for durability).
    changed: AtomicBool,
}

/// What an open file reads from.
enum Backing {
    /// A handle at the agent.
    Handle(File),
    /// A small file opened read-only, read whole at open in one submission (an
    /// open-read: the agent holds no handle): its bytes and attributes as of open.
    Snapshot(Snapshot),
}

struct Snapshot {
    path: String,
    attr: Attr,
    data: Vec<u8>,
    /// The mount's snapshots, given the bytes and the buffer back on drop.
    store: Arc<Snapshots>,
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        self.store.held.fetch_sub(self.data.len() as u64, Ordering::AcqRel);
        self.store.give_back(std::mem::take(&mut self.data));
    }
}

/// What a mount's snapshots hold, and their buffers for reuse: a new vector per small
/// file (128 KiB, a sample) is mmapped and faulted in by glibc's malloc each time,
/// which cost a sample read more than its round trip.
#[derive(Default)]
struct Snapshots {
    /// Bytes held in live snapshots.
    held: AtomicU64,
    spares: Mutex<Vec<Vec<u8>>>,
}

/// Buffers of dropped snapshots a mount keeps for the next ones.
const SNAPSHOT_SPARES: usize = 16;

impl Snapshots {
    fn take(&self) -> Vec<u8> {
        self.spares.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default()
    }

    fn give_back(&self, buffer: Vec<u8>) {
        let mut spares = self.spares.lock().unwrap_or_else(|p| p.into_inner());
        if spares.len() < SNAPSHOT_SPARES && buffer.capacity() > 0 {
            spares.push(buffer);
        }
    }
}

impl OpenFile {
    pub fn path(&self) -> &str {
        match &self.backing {
            Backing::Handle(file) => file.path(),
            Backing::Snapshot(s) => &s.path,
        }
    }
    pub fn flags(&self) -> OpenFlags {
        self.flags
    }
    /// The attributes as of open (no round trip; [`Mount::fstat`] asks the agent).
    pub fn attr(&self) -> &Attr {
        match &self.backing {
            Backing::Handle(file) => file.attr(),
            Backing::Snapshot(s) => &s.attr,
        }
    }

    /// The agent's handle; `EBADF` for a snapshot, which has none (only read-only
    /// calls reach a snapshot, and those answer without the agent).
    fn handle(&self) -> Result<&File> {
        match &self.backing {
            Backing::Handle(file) => Ok(file),
            Backing::Snapshot(s) => {
                Err(PosixError::new(rustix::io::Errno::BADF, format!("{}: opened read-only", s.path)))
            }
        }
    }
    /// The size this handle knows of (see [`Mount::fstat`] for the agent's).
    pub fn known_size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }
}

/// Bytes moved through a mount and copied between its regions and callers' buffers.
#[derive(Debug, Clone, Copy, Default)]
pub struct MountStats {
    /// Read through handles: copied once, from a region into the caller's buffer.
    pub bytes_read: u64,
    /// Read whole at open into snapshots: copied twice, out of the ring's answer area
    /// into the snapshot, and from there into the caller's buffer.
    pub bytes_snapshot: u64,
    pub bytes_written: u64,
}

/// Files opened read-only up to this size are read whole at open by default
/// ([`Mount::set_snapshot_bytes`]): a training sample costs one submission instead of an
/// open, an fstat, reads and a close.
pub const SNAPSHOT_BYTES: usize = 256 * 1024;
/// Bytes a mount holds in snapshots at most; files opened beyond it get handles.
const SNAPSHOT_HELD_BYTES: u64 = 64 << 20;
/// How long a mount attached from the environment answers `stat` of a listed entry from
/// its listing by default ([`Mount::set_listing_ttl`]): `dpuio mount`'s kernel TTL.
pub const LISTING_TTL: std::time::Duration = std::time::Duration::from_secs(1);

pub use listed::Listing;

/// An attached session used the POSIX way.
pub struct Mount {
    session: Session,
    staging: Mutex<Option<Staging>>,
    region_bytes: usize,
    bytes_read: AtomicU64,
    bytes_snapshot: AtomicU64,
    bytes_written: AtomicU64,
    snapshot_bytes: AtomicU64,
    snapshots: Arc<Snapshots>,
    listed: Arc<listed::Listed>,
}

#[derive(clap::Parser)]
struct FromEnv {
    #[command(flatten)]
    connect: ConnectArgs,
}

impl Mount {
    /// Attach with the `DPUIO_*` variables the `dpuio` CLI reads (`DPUIO_AGENT`,
    /// `DPUIO_CERT`/`KEY`/`CA`, `DPUIO_CONFIG_DIR`, `DPUIO_TOKEN`, `DPUIO_TENANT`,
    /// `DPUIO_TRANSPORT`, `DPUIO_INTERFACE`), with a data plane; `DPUIO_SNAPSHOT_BYTES`
    /// and `DPUIO_LISTING_TTL_MS` set [`Mount::set_snapshot_bytes`] and
    /// [`Mount::set_listing_ttl`] ([`LISTING_TTL`] without it).
    pub fn from_env(client_name: &str) -> Result<Mount> {
        use clap::Parser;
        let args = FromEnv::try_parse_from([client_name])
            .map_err(|e| PosixError::new(rustix::io::Errno::INVAL, format!("the DPUIO_* variables: {e}")))?;
        let mut options = args.connect.connect_options(client_name);
        options.data_plane = Some(DataPlaneOptions { interface: args.connect.interface, ..Default::default() });
        let mount = Mount::attach(options)?;
        if let Ok(v) = std::env::var("DPUIO_SNAPSHOT_BYTES") {
            let bytes = v.parse().map_err(|_| {
                PosixError::new(rustix::io::Errno::INVAL, format!("DPUIO_SNAPSHOT_BYTES={v:?}: not a number of bytes"))
            })?;
            mount.set_snapshot_bytes(bytes);
        }
        let ttl = match std::env::var("DPUIO_LISTING_TTL_MS") {
            Ok(v) => std::time::Duration::from_millis(v.parse().map_err(|_| {
                PosixError::new(
                    rustix::io::Errno::INVAL,
                    format!("DPUIO_LISTING_TTL_MS={v:?}: not a number of milliseconds (0 turns it off)"),
                )
            })?),
            Err(_) => LISTING_TTL,
        };
        mount.set_listing_ttl(ttl);
        Ok(mount)
    }

    /// Files opened read-only and at most this large are read whole at open, in one
    /// submission, and served from that copy: reads and `fstat` see the file as it was
    /// at open (close-to-open consistency, as NFS gives), and the agent holds no handle
    /// for them. 0 turns it off. Default [`SNAPSHOT_BYTES`]; at most 512 KiB - 64 (one
    /// answer area).
    pub fn set_snapshot_bytes(&self, bytes: usize) {
        let bytes = bytes.min(dpuio_proto::host_ring::meta::OPEN_READ_BYTES);
        self.snapshot_bytes.store(bytes as u64, Ordering::Relaxed);
    }

    /// How long `stat` of an entry a listing of this mount brought (and the kind check
    /// of `unlink` and `rmdir`) is answered from that listing, as NFS's readdirplus
    /// does; zero (the default of [`Mount::attach`]) asks the agent each time. What this
    /// process changes through the mount is never answered stale; changes by other
    /// processes show after the TTL.
    pub fn set_listing_ttl(&self, ttl: std::time::Duration) {
        self.listed.set_ttl(ttl);
    }

    /// Attach with `options` (which must ask for a data plane to move data).
    pub fn attach(options: crate::ConnectOptions) -> Result<Mount> {
        let session = Session::attach(options)?;
        let region_bytes = REGION_BYTES.min(session.max_io_bytes().max(4096) as usize);
        Ok(Mount {
            session,
            staging: Mutex::new(None),
            region_bytes,
            bytes_read: AtomicU64::new(0),
            bytes_snapshot: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            snapshot_bytes: AtomicU64::new(SNAPSHOT_BYTES as u64),
            snapshots: Default::default(),
            listed: Default::default(),
        })
    }

    /// The blocking session underneath.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// True in a process other than the one that attached (a forked child): every call
    /// fails with `EBADF` there and the caller should attach a mount of its own.
    pub fn is_foreign(&self) -> bool {
        self.session.is_foreign()
    }

    pub fn stats(&self) -> MountStats {
        MountStats {
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_snapshot: self.bytes_snapshot.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
        }
    }

    fn call<T>(&self, f: impl std::future::Future<Output = crate::Result<T>>) -> Result<T> {
        Ok(self.session.run(f)??)
    }

    pub fn stat(&self, path: &str) -> Result<Attr> {
        if let Some(attr) = self.listed.get(path) {
            return Ok(attr);
        }
        let client = self.session.client()?;
        self.call(client.stat(path))
    }

    /// Open `path` as `open(2)` would with `flags`.
    pub fn open(&self, path: &str, flags: OpenFlags) -> Result<Opened> {
        if let Some(snapshot) = self.snapshot(path, flags)? {
            let size = AtomicU64::new(snapshot.attr.size);
            return Ok(Opened::File(OpenFile {
                backing: Backing::Snapshot(snapshot),
                flags,
                size,
                changed: Default::default(),
            }));
        }
        if flags.write || flags.create || flags.truncate {
            self.listed.changing(path);
        }
        let client = self.session.client()?;
        let access = if flags.write { Access::ReadWrite } else { Access::ReadOnly };
        let file = if flags.create && flags.exclusive {
            self.call(client.create(path, true))?
        } else if flags.create && flags.truncate {
            self.call(client.create(path, false))?
        } else if flags.create {
            match self.call(client.open(path, Access::ReadWrite)) {
                Err(e) if e.errno == rustix::io::Errno::NOENT.raw_os_error() => {
                    match self.call(client.create(path, true)) {
                        // Another process made it meanwhile: open what it made.
                        Err(e) if e.errno == rustix::io::Errno::EXIST.raw_os_error() => {
                            self.call(client.open(path, Access::ReadWrite))?
                        }
                        other => other?,
                    }
                }
                other => other?,
            }
        } else {
            match self.call(client.open(path, access)) {
                Ok(file) => file,
                Err(e) if e.errno == rustix::io::Errno::ISDIR.raw_os_error() && !flags.write => {
                    return Ok(Opened::Directory(self.stat(path)?));
                }
                Err(e) => return Err(e),
            }
        };
        if flags.truncate && !flags.create && flags.write && file.attr().size != 0 {
            self.call(file.truncate(0))?;
        }
        let size = if flags.truncate { 0 } else { file.attr().size };
        // A truncation at open is a change its close makes durable, as a write's.
        let changed = flags.truncate.into();
        Ok(Opened::File(OpenFile { backing: Backing::Handle(file), flags, size: AtomicU64::new(size), changed }))
    }

    /// A read-only open of a small file as one open-read, when snapshots are on and the
    /// mount holds room for one. `Ok(None)` sends the caller the usual way: a larger
    /// file (its head is dropped), a directory, a session without a data plane, and
    /// failures other than a missing file or a denial (an integrity failure, say, then
    /// comes from the read, as without snapshots).
    fn snapshot(&self, path: &str, flags: OpenFlags) -> Result<Option<Snapshot>> {
        let max = self.snapshot_bytes.load(Ordering::Relaxed) as usize;
        if max == 0 || flags.write || flags.create || flags.truncate || flags.append {
            return Ok(None);
        }
        if self.snapshots.held.load(Ordering::Acquire) + max as u64 > SNAPSHOT_HELD_BYTES {
            return Ok(None);
        }
        let Ok(client) = self.session.data_client() else { return Ok(None) };
        let mut data = self.snapshots.take();
        let attr = match client.read_head_into(path, max, &mut data) {
            Ok(attr) => attr,
            Err(e) => {
                self.snapshots.give_back(data);
                let e = PosixError::from(e);
                use rustix::io::Errno;
                let definite = [Errno::NOENT, Errno::ACCESS, Errno::NOTDIR].map(Errno::raw_os_error);
                return if definite.contains(&e.errno) { Err(e) } else { Ok(None) };
            }
        };
        if attr.kind != EntryKind::File || data.len() as u64 != attr.size {
            self.snapshots.give_back(data);
            return Ok(None);
        }
        self.snapshots.held.fetch_add(data.len() as u64, Ordering::AcqRel);
        self.bytes_snapshot.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(Some(Snapshot { path: path.to_owned(), attr, data, store: self.snapshots.clone() }))
    }

    /// The directory at `path`, as `opendir` needs it (`ENOTDIR` for a file).
    pub fn open_directory(&self, path: &str) -> Result<Attr> {
        let attr = self.stat(path)?;
        if attr.kind != EntryKind::Directory {
            return Err(PosixError::new(rustix::io::Errno::NOTDIR, format!("{path}: not a directory")));
        }
        Ok(attr)
    }

    /// Stream the entries of the directory at `path`.
    pub fn readdir(&self, path: &str) -> Result<Listing> {
        let stream = crate::blocking::DirStream::open(&self.session, path, 0)?;
        Ok(Listing::new(path, stream, self.listed.clone()))
    }

    /// The mount's staging: made on first use (whole regions, and one more cut into
    /// slots for small I/O where a region holds at least two).
    fn staging(&self) -> Result<Staging> {
        let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(staging) = staging.as_ref() {
            return Ok(staging.clone());
        }
        let client = self.session.data_client()?;
        let count = self.session.rings().clamp(1, MAX_REGIONS);
        let slot_bytes = SLOT_BYTES.min(self.region_bytes);
        let small = self.region_bytes / slot_bytes >= 2;
        let regions = self.call(client.region_pool(self.region_bytes, count + usize::from(small)))?;
        let slots = if small { SlotPool::new(regions.get(), slot_bytes) } else { None };
        let made = Staging { regions, slots };
        *staging = Some(made.clone());
        Ok(made)
    }

    /// Read into `out` from `offset`; returns the bytes read (fewer only at end of file).
    pub fn read_at(&self, f: &OpenFile, out: &mut [u8], offset: u64) -> Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        if !f.flags.read {
            return Err(PosixError::new(rustix::io::Errno::BADF, format!("{}: not open for reading", f.path())));
        }
        if let Backing::Snapshot(s) = &f.backing {
            // The copy out of the snapshot; the bytes were counted at open.
            let from = s.data.get(offset.min(s.data.len() as u64) as usize..).unwrap_or_default();
            let n = from.len().min(out.len());
            out[..n].copy_from_slice(&from[..n]);
            return Ok(n);
        }
        let staged = self.staging()?.take_for(out.len());
        let handle = f.handle()?;
        let mut done = 0;
        'call: while done < out.len() {
            let requests: Vec<_> = pieces(&staged, done, out.len())
                .map(|(buffer, from, n)| {
                    let (region, at, _) = buffer.range();
                    handle.read_request(region, at as u64, n as u64, offset + from as u64)
                })
                .collect();
            for ((buffer, request), moved) in staged.iter().zip(&requests).zip(self.several(f, "read", &requests)?) {
                let want = request.length as usize;
                let moved = (moved as usize).min(want);
                // The one copy: from the region the agent wrote into the caller's buffer.
                let (region, at, _) = buffer.range();
                region.read_at(at, &mut out[done..done + moved]);
                done += moved;
                if moved < want {
                    break 'call; // end of file
                }
            }
        }
        self.bytes_read.fetch_add(done as u64, Ordering::Relaxed);
        Ok(done)
    }

    /// Write `data` at `offset` (at the end of the file for `O_APPEND`, as far as this
    /// handle knows it); returns the offset written at and the bytes written.
    pub fn write_at(&self, f: &OpenFile, data: &[u8], offset: u64) -> Result<(u64, usize)> {
        if !f.flags.write {
            return Err(PosixError::new(rustix::io::Errno::BADF, format!("{}: not open for writing", f.path())));
        }
        let offset = if f.flags.append { f.known_size() } else { offset };
        if data.is_empty() {
            return Ok((offset, 0));
        }
        self.listed.changing(f.path());
        f.changed.store(true, Ordering::Release);
        let staged = self.staging()?.take_for(data.len());
        let handle = f.handle()?;
        let mut done = 0;
        'call: while done < data.len() {
            let requests: Vec<_> = pieces(&staged, done, data.len())
                .map(|(buffer, from, n)| {
                    let (region, at, _) = buffer.range();
                    region.write_shared(at, &data[from..from + n]);
                    handle.write_request(region, at as u64, n as u64, offset + from as u64)
                })
                .collect();
            for (request, moved) in requests.iter().zip(self.several(f, "write", &requests)?) {
                done += moved.min(request.length) as usize;
                if moved < request.length {
                    break 'call;
                }
            }
        }
        f.size.fetch_max(offset + done as u64, Ordering::AcqRel);
        self.bytes_written.fetch_add(done as u64, Ordering::Relaxed);
        Ok((offset, done))
    }

    /// Run `requests` in one submission: the bytes each moved, in order, or the first
    /// failure.
    fn several(&self, f: &OpenFile, op: &str, requests: &[crate::Request]) -> Result<Vec<u64>> {
        self.session
            .submit(requests)?
            .into_iter()
            .map(|r| {
                r.map_err(|status| PosixError {
                    errno: crate::error::io_errno(status),
                    message: format!("{op} {}: {} ({status:?})", f.path(), status.describe()),
                })
            })
            .collect()
    }

    /// Current attributes of an open file (and what this handle knows of its size).
    /// A snapshot answers with its attributes as of open.
    pub fn fstat(&self, f: &OpenFile) -> Result<Attr> {
        if let Backing::Snapshot(s) = &f.backing {
            return Ok(s.attr.clone());
        }
        let mut attr = self.call(f.handle()?.stat())?;
        attr.size = attr.size.max(f.known_size());
        f.size.store(attr.size, Ordering::Release);
        Ok(attr)
    }

    pub fn ftruncate(&self, f: &OpenFile, size: u64) -> Result<()> {
        if !f.flags.write {
            return Err(PosixError::new(rustix::io::Errno::INVAL, format!("{}: not open for writing", f.path())));
        }
        self.listed.changing(f.path());
        f.changed.store(true, Ordering::Release);
        self.call(f.handle()?.truncate(size))?;
        f.size.store(size, Ordering::Release);
        Ok(())
    }

    /// Nothing to make durable for a snapshot (it was opened read-only).
    pub fn fsync(&self, f: &OpenFile) -> Result<()> {
        match &f.backing {
            Backing::Handle(file) => self.call(file.sync()),
            Backing::Snapshot(_) => Ok(()),
        }
    }

    /// Close the handle at the agent (a written file is durable once this returns); a
    /// snapshot has none. A handle nothing was written through (nor truncated) is
    /// closed with this process's next call to the agent, in its submission
    /// ([`File::close_unwritten`]): a file created and closed, or opened to read and
    /// closed, costs no round trip for its close.
    pub fn close(&self, f: OpenFile) -> Result<()> {
        if f.flags.write {
            self.listed.changing(f.path());
        }
        let changed = f.changed.load(Ordering::Acquire);
        match f.backing {
            Backing::Handle(file) if changed => self.call(file.close()),
            Backing::Handle(file) => self.call(file.close_unwritten()),
            Backing::Snapshot(_) => Ok(()),
        }
    }

    pub fn mkdir(&self, path: &str) -> Result<()> {
        self.listed.changing(path);
        let client = self.session.client()?;
        self.call(client.mkdir(path, false)).map(drop)
    }

    /// Remove a file (`EISDIR` for a directory, as `unlink(2)`).
    pub fn unlink(&self, path: &str) -> Result<()> {
        if self.stat(path)?.kind == EntryKind::Directory {
            return Err(PosixError::new(rustix::io::Errno::ISDIR, format!("unlink {path}: is a directory")));
        }
        self.listed.changing(path);
        self.remove_entry(path)
    }

    /// Remove the file or empty directory at `path` without asking first what it is, for
    /// a caller that knows already: the kernel refuses `unlink` of a directory and `rmdir`
    /// of a file before a FUSE daemon hears of either. One round trip where [`Mount::unlink`]
    /// and [`Mount::rmdir`] make two.
    pub fn remove_checked(&self, path: &str) -> Result<()> {
        self.listed.forget_all();
        self.remove_entry(path)
    }

    /// The agent's remove of `path` (a file, or a directory if empty).
    fn remove_entry(&self, path: &str) -> Result<()> {
        let client = self.session.client()?;
        self.call(client.remove(path, false))
    }

    /// Remove an empty directory (`ENOTDIR` for a file, as `rmdir(2)`).
    pub fn rmdir(&self, path: &str) -> Result<()> {
        if self.stat(path)?.kind != EntryKind::Directory {
            return Err(PosixError::new(rustix::io::Errno::NOTDIR, format!("rmdir {path}: not a directory")));
        }
        self.listed.forget_all();
        self.remove_entry(path)
    }

    /// Rename, replacing a file at `to` as `rename(2)` does: a file over a file in one
    /// step (the agent's replacing rename), so write-then-rename savers get what they
    /// expect. A directory over an empty directory, or a session whose token allows
    /// delete but not write on `to`, removes `to` first: not atomic (a reader may
    /// briefly see no `to`).
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.listed.forget_all();
        let client = self.session.client()?;
        match self.call(client.rename(from, to)) {
            Err(e) if e.errno == rustix::io::Errno::EXIST.raw_os_error() => {
                let (source, target) = (self.stat(from)?, self.stat(to)?);
                if target.kind == EntryKind::Directory && source.kind != EntryKind::Directory {
                    return Err(PosixError::new(
                        rustix::io::Errno::ISDIR,
                        format!("rename {from} to {to}: {to} is a directory"),
                    ));
                }
                if source.kind == EntryKind::File && target.kind == EntryKind::File {
                    match self.call(client.rename_replace(from, to)) {
                        Err(e) if e.errno == rustix::io::Errno::ACCESS.raw_os_error() => {}
                        other => return other,
                    }
                }
                self.call(client.remove(to, false))?;
                self.call(client.rename(from, to))
            }
            other => other,
        }
    }

    /// Rename, failing with `EEXIST` if `to` exists (`RENAME_NOREPLACE`).
    pub fn rename_noreplace(&self, from: &str, to: &str) -> Result<()> {
        self.listed.forget_all();
        let client = self.session.client()?;
        self.call(client.rename(from, to))
    }

    pub fn truncate(&self, path: &str, size: u64) -> Result<()> {
        self.listed.changing(path);
        let client = self.session.client()?;
        self.call(client.truncate(path, size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_buffers_are_reused_and_bounded() {
        let store = Snapshots::default();
        let mut first = store.take();
        first.resize(128 << 10, 7);
        let at = first.as_ptr();
        store.give_back(first);
        let again = store.take();
        assert_eq!((again.as_ptr(), again.capacity() >= 128 << 10), (at, true), "the same buffer comes back");
        for _ in 0..SNAPSHOT_SPARES + 4 {
            store.give_back(vec![0u8; 16]);
        }
        assert_eq!(store.spares.lock().unwrap().len(), SNAPSHOT_SPARES);
        store.give_back(Vec::new());
        assert_eq!(store.spares.lock().unwrap().len(), SNAPSHOT_SPARES, "nothing kept past the bound");
    }

    #[test]
    fn paths_under_the_prefix_map_into_the_container() {
        let m = |p| mount_relative("/mnt/dpuio", p);
        assert_eq!(m("/mnt/dpuio").as_deref(), Some("/"));
        assert_eq!(m("/mnt/dpuio/").as_deref(), Some("/"));
        assert_eq!(m("/mnt/dpuio/a/b").as_deref(), Some("/a/b"));
        assert_eq!(m("//mnt/./dpuio//a/./b/").as_deref(), Some("/a/b"));
        assert_eq!(m("/mnt/dpuio/a/../b").as_deref(), Some("/b"));
        assert_eq!(m("/mnt/dpuiox/a"), None);
        assert_eq!(m("/mnt/dpuio/../etc/passwd"), None);
        assert_eq!(m("/mnt"), None);
        assert_eq!(m("relative/path"), None);
        assert_eq!(mount_relative("/mnt/dpuio/", "/mnt/dpuio/x").as_deref(), Some("/x"));
        assert_eq!(mount_relative("/", "/x/y").as_deref(), Some("/x/y"));
    }

    #[test]
    fn names_join_under_a_directory_and_never_climb_out() {
        assert_eq!(join("/a", "b"), "/a/b");
        assert_eq!(join("/", "b/c"), "/b/c");
        assert_eq!(join("/a/b", ".."), "/a");
        assert_eq!(join("/a", "../../.."), "/");
        assert_eq!(join("/a", "."), "/a");
    }
}
