//! Storage backends of `dpu-agent`.
//!
//! A backend gives DFS semantics (the DAOS File System API that `libdfs` offers): a
//! backend holds *containers*, a container is a tree of directories and files, and
//! files are read and written at byte offsets through open *objects*. The agent's
//! engine speaks only to these traits, so the embedded [`local`] backend and the DAOS
//! backend (crate `dpuio-daos`, libdfs loaded at run time) are interchangeable.
//!
//! Why the traits are synchronous: both implementations are blocking calls at heart
//! (`pread`/`fsync` here; `dfs_read`/`dfs_write` with a NULL event in libdfs). The
//! agent runs them on its blocking pool or its data-plane threads; an async trait would
//! only move the same blocking call behind a boxed future. Where a backend can keep
//! many reads and writes in flight from one thread (DAOS event queues), it says so with
//! an [`IoQueue`] per I/O thread ([`Backend::io_queue`]): the data plane hands it a
//! batch of pieces and is told of each as it completes. The batch borrows its memory
//! for the call, so no I/O outlives the buffers it reads into or writes from.
//!
//! Memory a piece reads into or writes from may be the host's own region, mapped into
//! the agent, which the host may write at any moment: it is a [`HostBytesMut`] /
//! [`HostBytes`] view (pointer and length, never a Rust reference), and
//! [`Object::read_into`] / [`Object::write_from`] take it. A backend reads into it with
//! one copy (`pread` straight into the view, a DAOS iov over it) and never reads back
//! what it wrote; a writer that looks at the bytes (the inline encryption) copies them
//! once into memory of its own first. Agent-owned buffers convert at no cost
//! (`From<&mut [u8]>`), and [`Object::read_at`] / [`Object::write_at`] take them as
//! slices.
//!
//! What this crate deliberately does not do: authentication, tenancy, quotas or
//! encryption (the agent's engine does those before it calls a backend), and any
//! network I/O.
#![forbid(unsafe_code)]

pub mod local;
mod path;
mod rename;
mod staged;
pub mod threads;

pub use dpuio_proto::attr::{Attr, DirEntry, EntryKind};
pub use host_bytes::{HostBytes, HostBytesMut, LentMemory};
pub use path::{MAX_NAME_BYTES, MAX_PATH_BYTES, NsPath, validate_name};
pub use rename::{INTO_OWN_SUBTREE, check_rename, check_replace, invalid_rename};
pub use staged::Staged;

use std::any::Any;
use std::sync::Arc;

/// Everything a backend can report. Each variant names the path or object it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A path or name that can never be valid: empty component, `.` or `..`, a NUL
    /// byte, a component over [`MAX_NAME_BYTES`], or a path over [`MAX_PATH_BYTES`].
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: String },
    /// A request argument outside what the backend accepts (for example an offset
    /// past the largest file size).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The path, or one of its parents, does not exist.
    #[error("{path}: no such file or directory")]
    NotFound { path: String },
    /// Create, mkdir or rename onto a name that is already taken.
    #[error("{path}: already exists")]
    AlreadyExists { path: String },
    /// A directory was expected (a parent in a path, or `readdir`).
    #[error("{path}: not a directory")]
    NotADirectory { path: String },
    /// A file was expected (open, truncate) but the path is a directory.
    #[error("{path}: is a directory")]
    IsADirectory { path: String },
    /// Remove of a directory that still has entries, without `recursive`.
    #[error("{path}: directory not empty (remove it with recursive set)")]
    DirectoryNotEmpty { path: String },
    /// Rename of a directory into its own subtree, or of the container root.
    #[error("cannot rename {from} to {to}: {reason}")]
    InvalidRename { from: String, to: String, reason: String },
    /// The container does not exist and `create` was not asked for.
    #[error("container {name:?} does not exist{hint}")]
    NoSuchContainer {
        name: String,
        /// What to do, with its leading separator (`": create it with ..."`), or empty.
        hint: String,
    },
    /// An object was used for an access its open mode does not allow.
    #[error("{path}: {reason}")]
    AccessMode { path: String, reason: String },
    /// An entry the backend will not serve: a symbolic link, device, FIFO or socket
    /// found in the container. The agent never makes these, so one was put there
    /// behind its back; `local` never follows links, which is what keeps a container
    /// inside its own tree.
    #[error("{path}: {reason}")]
    UnsupportedEntry { path: String, reason: String },
    /// The storage refused the caller's credentials (DAOS `DER_NO_PERM`, or an ACL of
    /// the pool or container). `what` names the pool or container, `reason` the call,
    /// the DAOS error and what to do.
    #[error("{what}: permission denied: {reason}")]
    Denied { what: String, reason: String },
    /// The storage service cannot be reached now (no `daos_agent`, DER_UNREACH,
    /// DER_TIMEDOUT); retrying later may work. `reason` says what to check.
    #[error("{what}: storage unavailable: {reason}")]
    Unavailable { what: String, reason: String },
    /// The storage underneath failed; the source says how.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Stored bytes failed authentication (reported by the agent's inline encryption,
    /// which wraps a backend): a block was altered, moved from another position, file,
    /// container or tenant, or truncated (`block_index` names it); or the file header
    /// was (`block_index` is `None`: the header tag failed, the header is malformed,
    /// or the tenant's key of the header's version does not unwrap the data key,
    /// which a wrong key and an altered wrapped key look like). No plaintext of the
    /// failed block was released. `detail` says which, naming tenant and key version
    /// where they matter, never key bytes.
    #[error("{path}: integrity error in {}: {detail}", integrity_place(.block_index))]
    Integrity { path: String, block_index: Option<u64>, detail: String },
    /// A key-encryption key the file needs is not available: the tenant's key source
    /// has no key of the version the file header names (the key was retired too
    /// early, or is not configured), or the file's data key has sealed as many blocks
    /// as it safely can. `reason` names tenant and key version and what to do.
    #[error("{path}: {reason}")]
    Key { path: String, reason: String },
}

fn integrity_place(block_index: &Option<u64>) -> String {
    match block_index {
        Some(index) => format!("block {index}"),
        None => "the file header".to_owned(),
    }
}

/// Result with the backend [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// How a file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenOptions {
    /// Allow `write_at` and `truncate`. (`sync` works in any mode: a read-only
    /// object that created its file still has a directory entry to make durable.)
    pub write: bool,
    /// Create the file if it does not exist.
    pub create: bool,
    /// With `create`: fail with [`Error::AlreadyExists`] if it exists.
    pub exclusive: bool,
    /// Truncate to zero length on open (needs `write`).
    pub truncate: bool,
    /// Options that only a DAOS backend honours; `local` records nothing of them.
    pub layout: Layout,
}

/// Object layout hints in the shape of `dfs_open`'s `oclass` and `chunk_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layout {
    /// Chunk size in bytes; 0 means the container's default.
    pub chunk_bytes: u64,
    /// DAOS object class id; 0 means the container's default.
    pub object_class: u32,
}

/// A storage backend: a set of containers.
pub trait Backend: Send + Sync + 'static {
    /// Short name for logs and status (`"local"`, `"daos"`).
    fn kind(&self) -> &'static str;
    /// Open a container by name, creating it first if `create` is set.
    fn mount(&self, container: &str, create: bool) -> Result<Arc<dyn Container>>;
    /// [`Backend::mount`], with the object class of the container's new files and
    /// directories named (`RP_2G1`...; empty: the backend's default). A backend without
    /// object classes refuses a name.
    fn mount_with_class(&self, container: &str, create: bool, object_class: &str) -> Result<Arc<dyn Container>> {
        if object_class.is_empty() {
            return self.mount(container, create);
        }
        Err(Error::InvalidArgument(format!(
            "container {container:?}: object class {object_class:?} is DAOS's; the {} backend has no object classes",
            self.kind()
        )))
    }
    /// A queue for one I/O thread. The default runs each piece in turn with
    /// [`Object::read_at`] / [`Object::write_at`]; a backend with asynchronous I/O
    /// returns one that keeps a batch in flight.
    fn io_queue(&self) -> Result<Box<dyn IoQueue>> {
        Ok(Box::new(OneAtATime))
    }
}

/// One piece of I/O handed to an [`IoQueue`].
pub struct IoRequest<'a> {
    pub object: &'a dyn Object,
    /// Byte offset in the file.
    pub offset: u64,
    pub op: IoOp<'a>,
}

/// What an [`IoRequest`] does, with the memory it borrows until it completes: views,
/// because on the data plane it is the host's mapped region (an agent-owned buffer
/// converts with `.into()`).
pub enum IoOp<'a> {
    /// Read into the memory; completes with the bytes read (short only at end of file).
    Read(HostBytesMut<'a>),
    /// Write all of the memory; completes with its length.
    Write(HostBytes<'a>),
}

impl IoRequest<'_> {
    /// Run this piece on the calling thread, as [`OneAtATime`] does.
    pub fn run_blocking(&mut self) -> Result<usize> {
        match &mut self.op {
            IoOp::Read(buf) => self.object.read_into(buf.reborrow(), self.offset),
            IoOp::Write(buf) => self.object.write_from(*buf, self.offset).map(|()| buf.len()),
        }
    }

    /// The bytes this piece reads or writes.
    pub fn len(&self) -> usize {
        match &self.op {
            IoOp::Read(buf) => buf.len(),
            IoOp::Write(buf) => buf.len(),
        }
    }

    /// Whether the piece moves no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Reads and writes driven by one thread, in batches. A queue is used by one thread at
/// a time (it is `Send`, not `Sync`): DAOS event queues are per thread.
pub trait IoQueue: Send {
    /// Most pieces [`IoQueue::run`] keeps in flight at once; 1 for a queue that runs
    /// them one after the other (the caller then hands it one piece at a time, so
    /// other threads take the rest).
    fn depth(&self) -> usize;
    /// Whether `run` overlaps this object's I/O with other pieces' (false: it runs it
    /// on the calling thread with `read_at`/`write_at`, e.g. an object of the inline
    /// encryption wrapper, which reads, checks and decrypts in one call).
    fn overlaps(&self, object: &dyn Object) -> bool;
    /// How long a piece may go unanswered before the storage is taken not to answer now
    /// (DAOS: `[backend] call_timeout_seconds`); `None` where no bound is kept. The I/O
    /// still runs to its end ([`IoQueue::run`]); what is answered meanwhile is the
    /// caller's: memory of its own that the storage may still write can answer its
    /// request as unavailable, and keeps the memory until the piece completes.
    fn deadline(&self) -> Option<std::time::Duration> {
        None
    }
    /// Run every piece of `batch`, calling `done(index, result)` once for each as it
    /// completes, in completion order. Returns when all have completed; no I/O on the
    /// batch's memory continues after it returns, whatever `done` does.
    fn run(&mut self, batch: &mut [IoRequest<'_>], done: &mut dyn FnMut(usize, Result<usize>));
}

/// The [`IoQueue`] of a backend without asynchronous I/O: each piece in turn.
pub struct OneAtATime;

impl IoQueue for OneAtATime {
    fn depth(&self) -> usize {
        1
    }

    fn overlaps(&self, _: &dyn Object) -> bool {
        false
    }

    fn run(&mut self, batch: &mut [IoRequest<'_>], done: &mut dyn FnMut(usize, Result<usize>)) {
        for (i, request) in batch.iter_mut().enumerate() {
            done(i, request.run_blocking());
        }
    }
}

/// A mounted container: a tree of directories and files.
///
/// Every path is an [`NsPath`], already validated and relative to the container root.
pub trait Container: Send + Sync {
    /// The container's name.
    fn name(&self) -> &str;
    /// Default chunk size: the data plane splits I/O at these boundaries.
    fn chunk_bytes(&self) -> u64;
    /// Attributes of an entry.
    fn stat(&self, path: &NsPath) -> Result<Attr>;
    /// Create a directory; its parent must exist.
    fn mkdir(&self, path: &NsPath, mode: u32) -> Result<Attr>;
    /// List a directory in batches. The first batch starts with `anchor` of `None`; each
    /// batch returns its entries and, when more follow, the anchor of the next batch
    /// (`None` once the listing is complete). A batch that has a next anchor is never
    /// empty. Anchors are opaque strings issued by the backend: `local` lists bytewise
    /// by name and its anchor is the last name returned; `daos` lists in DFS's hash
    /// order and its anchor encodes the DFS iteration position, authenticated so that a
    /// forged or altered anchor is [`Error::InvalidArgument`]. `max` of 0 is
    /// [`Error::InvalidArgument`]; a backend may return fewer than `max` (`local` caps a
    /// batch at [`local::MAX_READDIR_BATCH`]).
    fn readdir(&self, path: &NsPath, anchor: Option<&str>, max: usize) -> Result<(Vec<DirEntry>, Option<String>)>;
    /// Open (and maybe create) a file.
    fn open(&self, path: &NsPath, options: OpenOptions, mode: u32) -> Result<Arc<dyn Object>>;
    /// [`Container::open`], with the file's attributes as opened (what a client's open
    /// answers with). The default opens and then stats the object; a backend whose
    /// lookup reports both at once (DFS's `dfs_lookup`) overrides it to make one call
    /// where it can.
    fn open_stat(&self, path: &NsPath, options: OpenOptions, mode: u32) -> Result<(Arc<dyn Object>, Attr)> {
        let object = self.open(path, options, mode)?;
        let attr = object.stat()?;
        Ok((object, attr))
    }
    /// Remove a file or an empty directory; with `recursive`, a directory and all under it.
    fn remove(&self, path: &NsPath, recursive: bool) -> Result<()>;
    /// Rename an entry; fails with [`Error::AlreadyExists`] if `to` exists.
    fn rename(&self, from: &NsPath, to: &NsPath) -> Result<()>;
    /// Rename the file `from` to `to`, replacing a file at `to` in one step: a reader (or
    /// a restart after a crash) finds the old file or the new one at `to`, never neither
    /// and never a mix. This is how a whole-file put publishes its temporary file. `from`
    /// must be a file ([`Error::IsADirectory`] otherwise) and so must `to` if it exists.
    /// The change is durable after the next [`Container::sync`].
    fn replace(&self, from: &NsPath, to: &NsPath) -> Result<()>;
    /// Set a file's size by path.
    fn truncate(&self, path: &NsPath, size: u64) -> Result<()>;
    /// Make every acknowledged change in the container durable.
    fn sync(&self) -> Result<()>;
}

/// An open file.
pub trait Object: Send + Sync {
    /// The path it was opened by (for messages).
    fn path(&self) -> &NsPath;
    /// Whether it was opened for writing.
    fn writable(&self) -> bool;
    /// Read at `offset` into `buf`; returns the bytes read (short only at end of file).
    ///
    /// An object implements `read_at` or [`Object::read_into`] (and `write_at` or
    /// [`Object::write_from`]): each has a default in terms of the other, so one that
    /// implements neither of a pair calls itself forever. The default here reads
    /// through the view of `buf`, which is what a backend that reads straight into a
    /// view (`pread`, a DAOS iov) does for its own buffers too.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.read_into(buf.into(), offset)
    }
    /// Write all of `buf` at `offset`. The default writes from the view of `buf`
    /// ([`Object::write_from`]); see [`Object::read_at`] for the pairs.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_from(buf.into(), offset)
    }
    /// [`Object::read_at`] into memory the host may read and write meanwhile (its
    /// mapped region). Same result; the backend must write the memory only through the
    /// view and never rely on reading back what it wrote.
    ///
    /// The default reads into a buffer of its own with [`Object::read_at`] and copies
    /// that out: correct for any object that implements `read_at`, at the price of a
    /// copy. Backends that can read straight into the view (`pread`, a DAOS iov)
    /// override it; the data plane's mapped reads depend on that for their one copy.
    fn read_into(&self, mut buf: HostBytesMut<'_>, offset: u64) -> Result<usize> {
        let mut own = vec![0; buf.len()];
        let n = self.read_at(&mut own, offset)?;
        buf.slice_mut(..n).copy_from_slice(&own[..n]);
        Ok(n)
    }
    /// [`Object::write_at`] from memory the host may write meanwhile. The bytes may
    /// change while they are read: a backend that looks at them more than once (to
    /// encrypt and then tag them, say) copies them once into memory of its own and
    /// uses only that copy.
    ///
    /// The default does exactly that copy and calls [`Object::write_at`] (for objects
    /// that implement it); backends that hand the memory straight to the storage
    /// (`pwrite`, a DAOS iov), which reads each byte once, override it.
    fn write_from(&self, buf: HostBytes<'_>, offset: u64) -> Result<()> {
        self.write_at(&buf.to_vec(), offset)
    }
    /// Whether [`Object::read_staged`] and [`Object::staging_for_write`] lend memory of
    /// the backend's own (a tenant DAOS worker's staging): a caller that moves bytes
    /// with put/get then moves them from and into that memory, and gives no buffer of
    /// its own. The default: no.
    fn lends_staging(&self) -> bool {
        false
    }
    /// Read up to `len` bytes at `offset` into memory of the backend's own, lent to
    /// the caller until the returned [`Staged`] drops: for a caller that moves the bytes
    /// on from there (a put from memory its transport registered) instead of giving a
    /// buffer. The same bytes as [`Object::read_into`], one copy fewer where the backend
    /// would otherwise copy out of such memory (a DAOS worker's staging).
    ///
    /// `None`, the default: the object has no such memory; use `read_into`.
    fn read_staged(&self, offset: u64, len: usize) -> Option<Result<Staged>> {
        let _ = (offset, len);
        None
    }
    /// `len` bytes of memory of the backend's own for a write's bytes, lent to the
    /// caller to fill (a get from the host into memory its transport registered) and
    /// hand to [`Object::write_staged`]: one copy fewer than [`Object::write_from`]
    /// where the backend would otherwise copy into such memory (a DAOS worker's
    /// staging).
    ///
    /// `None`, the default: the object has no such memory; use `write_from`.
    fn staging_for_write(&self, len: usize) -> Option<Result<Staged>> {
        let _ = len;
        None
    }
    /// Write the bytes of `staged` (from [`Object::staging_for_write`], filled by the
    /// caller) at `offset`. The default writes them with [`Object::write_from`].
    fn write_staged(&self, staged: Staged, offset: u64) -> Result<()> {
        self.write_from(staged.bytes(), offset)
    }
    /// Current attributes (size included).
    fn stat(&self) -> Result<Attr>;
    /// Set the size.
    fn truncate(&self, size: u64) -> Result<()>;
    /// Make this file's data and its directory entry durable. The agent's `Close` is
    /// `sync` and then dropping the object; dropping alone promises nothing until the
    /// next [`Container::sync`].
    fn sync(&self) -> Result<()>;
    /// This object as its backend's own type, for that backend's [`IoQueue`] (which
    /// runs asynchronous I/O on objects it recognises). `None`, the default: queues
    /// run it with `read_at`/`write_at`.
    fn as_any(&self) -> Option<&dyn Any> {
        None
    }
}
