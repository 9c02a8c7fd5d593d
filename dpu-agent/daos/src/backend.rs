//! [`DaosBackend`]: the `dpuio-backend` traits over DFS.
//!
//! One pool connection per backend; each container (a tenant's DAOS container label) is
//! opened and mounted with `dfs_mount` on first use. Paths are resolved with `dfs_lookup`
//! from the container root, and every operation on a name goes through its parent
//! directory object, the way DFS is meant to be used.
//!
//! Confinement: a tenant's namespace is its whole container, so nothing DFS resolves can
//! leave it; symbolic links (dpuio never makes them, another DAOS client could) are not
//! served: a final component that is a link is [`Error::UnsupportedEntry`] and listings
//! skip links, as `local` does.
//!
//! Known differences from `local`, by DFS's nature:
//! - Listings come in DFS's hash order, not by name; anchors are authenticated DFS
//!   positions ([`crate::anchor`]).
//! - Rename refuses an existing destination by a check before `dfs_move` (DFS has no
//!   no-replace move in its public API), so two clients racing on one destination name
//!   can see one replace the other.
//! - `sync` is `dfs_sync`, which DFS documents as a no-op: a DFS write is durable when
//!   it completes.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dpuio_backend::{
    Attr, Backend, Container, DirEntry, EntryKind, Error, HostBytes, HostBytesMut, INTO_OWN_SUBTREE, IoOp, IoQueue,
    IoRequest, NsPath, Object, OpenOptions, Result, check_rename, check_replace, invalid_rename,
};

use crate::anchor::AnchorKey;
use crate::deadline;
use crate::dfs::{AsyncIo, EventQueue, Fs, Obj, Pool, Runtime, SetupError, Stat};
use crate::dir_cache::DirCache;
use crate::error::{CallError, Code, der};
use crate::retry::{self, Retry, Tries};
use crate::sys::daos_anchor_t;

/// DFS's default chunk size (`DFS_DEFAULT_CHUNK_SIZE`), also the data plane's split size.
pub const DEFAULT_CHUNK_BYTES: u64 = 1 << 20;

/// Chunk sizes a client may ask for in `CreateRequest` (the config's `chunk_bytes` range).
pub const MIN_CHUNK_BYTES: u64 = 4096;
pub const MAX_CHUNK_BYTES: u64 = 1 << 30;

/// Reads and writes one I/O thread keeps in flight on its DAOS event queue. Enough to
/// cover a queue depth of 32 pieces of a few hundred KiB each; more only queues inside
/// libdaos.
pub const IO_QUEUE_DEPTH: usize = 32;

/// Most entries one `dfs_readdirplus` call is asked for; a larger batch takes several
/// calls. Bounds the scratch memory of a call to about 1.7 MiB.
const READDIR_CALL_ENTRIES: usize = 4096;

/// How to reach the pool and what new files look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaosOptions {
    /// Pool label or UUID.
    pub pool: String,
    /// DAOS system name (`daos_server` unless the servers were configured otherwise).
    pub system: String,
    /// Directory of the local `daos_agent`'s `daos_agent.sock`.
    pub agent_socket_dir: PathBuf,
    /// Create a tenant's missing container as a POSIX container on first use.
    pub create_containers: bool,
    /// Chunk size of new files, and where the data plane splits I/O.
    pub chunk_bytes: u64,
    /// Object class name of new files and directories (`SX`, `RP_2G1`...); empty for
    /// the container's default.
    pub object_class: String,
    /// How long a DAOS call that fails transiently (an engine gone, a pool map moving)
    /// is made again before the client hears of it; zero: never.
    pub retry: Duration,
    /// Containers this backend creates admit only their owner, this process's DAOS user
    /// (the owner-group entry DAOS adds is removed): set in a tenant's worker process,
    /// which runs as the tenant's `daos_user`.
    pub private_containers: bool,
    /// Redundancy factor (`rd_fac`, 0-4) of the containers this backend creates; 0:
    /// DAOS's default (RF0).
    pub redundancy_factor: u32,
    /// The fault domain level it counts: 1 rank (engine), 2 node; 0: DAOS's default (node).
    pub redundancy_level: u32,
    /// The longest a metadata call, its retries included, waits for DAOS before the
    /// client hears `UNAVAILABLE` (with every engine gone DAOS answers nothing); also
    /// when data-plane I/O left waiting is listed as stuck. Zero: no deadline.
    pub call_timeout: Duration,
    /// How long a directory found by its path is used again for calls on the names in
    /// it before it is looked up afresh ([`crate::dir_cache`]); zero: never kept.
    pub dir_cache: Duration,
}

/// [`DaosOptions::dir_cache`] unless configured: dfuse's default for directories
/// (`dentry-dir-time`).
pub const DEFAULT_DIR_CACHE: Duration = Duration::from_secs(5);

/// Why a DAOS backend could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error(
        "[backend] object_class {name:?} is not a DAOS object class this libdaos knows: use a name such as SX, S1, \
         RP_2G1 or EC_2P1G1 (see `daos container create --help`), or leave it empty for the container's default"
    )]
    ObjectClass { name: String },
    #[error("cannot connect to DAOS pool {pool:?} of system {system:?}: {error}: {hint}")]
    Pool { pool: String, system: String, error: Box<CallError>, hint: String },
}

/// The DAOS backend: one pool, a DFS mount per container.
pub struct DaosBackend {
    pool: Arc<Pool>,
    options: DaosOptions,
    object_class: u32,
    anchors: Arc<AnchorKey>,
}

impl DaosBackend {
    /// Initialise DAOS in this process (once), connect to the pool.
    pub fn open(options: DaosOptions) -> std::result::Result<DaosBackend, OpenError> {
        let rt = Runtime::get(&options.agent_socket_dir, options.call_timeout)?;
        let object_class = match options.object_class.as_str() {
            "" => 0,
            name => rt.object_class(name).ok_or_else(|| OpenError::ObjectClass { name: name.to_owned() })?,
        };
        // Bounded like every blocking call: with every engine gone DAOS would leave an
        // agent starting here waiting for them without end.
        let (connecting, pool_name, system) = (rt.clone(), options.pool.clone(), options.system.clone());
        let connected = deadline::call("daos_pool_connect", &options.pool, options.call_timeout, move || {
            connecting.connect(&pool_name, &system)
        });
        let pool = connected.map_err(|error| {
            let hint = match error.code {
                Code::NoAnswer => format!(
                    "DAOS did not answer within [backend] call_timeout_seconds ({:.0?}): are the engines up (`dmg \
                     system query`)? The agent needs its pool to start",
                    options.call_timeout
                ),
                Code::Der(der::NONEXIST) => format!(
                    "no such pool: create it (dmg pool create {} --size=...) or set [backend] pool to an existing pool's \
                     label or UUID (dmg pool list)",
                    options.pool
                ),
                Code::Der(der::NO_PERM) => format!(
                    "the pool's ACL does not let this agent's user (uid {}) connect: grant it with \
                     `dmg pool update-acl {} --entry A::<user>@:rw`, or run the agent as a user the ACL allows",
                    real_uid(),
                    options.pool
                ),
                Code::Der(der::UNREACH | der::TIMEDOUT | der::AGENT_COMM | der::AGENT_INCOMPAT) => format!(
                    "the DAOS servers are not reachable through the daos_agent at {}: check `dmg system query` and \
                     that [backend] system names the servers' system",
                    options.agent_socket_dir.display()
                ),
                _ => "check the pool with `dmg pool query`".to_owned(),
            };
            OpenError::Pool { pool: options.pool.clone(), system: options.system.clone(), error: Box::new(error), hint }
        })?;
        Ok(DaosBackend { pool, options, object_class, anchors: Arc::new(AnchorKey::random()) })
    }

    /// The options this backend was opened with.
    pub fn options(&self) -> &DaosOptions {
        &self.options
    }
}

fn real_uid() -> u32 {
    // The real uid is what daos_agent vouches for.
    std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(u32::MAX)
}

impl Backend for DaosBackend {
    fn kind(&self) -> &'static str {
        "daos"
    }

    fn io_queue(&self) -> Result<Box<dyn IoQueue>> {
        let eq = self.pool.event_queue(IO_QUEUE_DEPTH).map_err(|e| io_error("DAOS event queue", e))?;
        Ok(Box::new(DaosIoQueue { eq, call_timeout: self.options.call_timeout }))
    }

    fn mount(&self, container: &str, create: bool) -> Result<Arc<dyn Container>> {
        self.mount_with_class(container, create, "")
    }

    fn mount_with_class(&self, container: &str, create: bool, object_class: &str) -> Result<Arc<dyn Container>> {
        Ok(self.open_container(container, create, object_class)?)
    }
}

impl DaosBackend {
    /// [`Backend::mount_with_class`], as the DAOS type (whose [`DaosContainer::acl`] a
    /// tenant's worker reads).
    pub fn open_container(&self, container: &str, create: bool, object_class: &str) -> Result<Arc<DaosContainer>> {
        let object_class = match object_class {
            "" => self.object_class,
            name => self.pool.object_class(name).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "container {container:?}: object class {name:?} is not one this libdaos knows: use a name such as \
                     SX, S1, RP_2G1 or EC_2P1G1 (see `daos container create --help`)"
                ))
            })?,
        };
        let pool = &self.options.pool;
        let create = create && self.options.create_containers;
        let retry = Retry { deadline: self.options.retry };
        let call_timeout = self.options.call_timeout;
        let (mounting, label) = (self.pool.clone(), container.to_owned());
        let (private, redundancy) =
            (self.options.private_containers, (self.options.redundancy_factor, self.options.redundancy_level));
        let fs = deadline::call("dfs_mount", container, call_timeout, move || {
            retry.run(&label, || mounting.mount(&label, create, private, redundancy))
        })
        .map_err(|e| {
            let what = format!("DAOS container {container:?} of pool {pool:?}");
            match e.code {
                Code::Der(der::NONEXIST | der::NONEXIST_CONT) => Error::NoSuchContainer {
                    name: container.to_owned(),
                    hint: format!(
                        " in DAOS pool {pool:?} ({e}): create it with `daos container create {pool} {container} \
                         --type=POSIX`, or set [backend] create_containers = true"
                    ),
                },
                Code::Der(der::NO_PERM) | Code::Errno(libc::EPERM | libc::EACCES) => Error::Denied {
                    what,
                    // dfs_* turn DER_NO_PERM into EPERM; name both.
                    reason: format!(
                        "{e}{}: grant this agent's user (uid {}) access with `daos container update-acl {pool} \
                         {container} --entry A::<user>@:rwdtTaAo`",
                        if matches!(e.code, Code::Errno(_)) { " (DER_NO_PERM from DAOS)" } else { "" },
                        real_uid()
                    ),
                },
                Code::Der(der::UNREACH | der::TIMEDOUT | der::AGENT_COMM) | Code::NoAnswer => {
                    Error::Unavailable { what, reason: format!("{e}: {CHECK_DAOS}") }
                }
                Code::Errno(libc::EINVAL) if e.call == "dfs_mount" => Error::InvalidArgument(format!(
                    "{what} is not a POSIX (DFS) container ({e}): give the tenant a container made with \
                     `daos container create {pool} <label> --type=POSIX`"
                )),
                _ => io_error(&what, e),
            }
        })?;
        Ok(Arc::new(DaosContainer {
            fs,
            name: container.to_owned(),
            chunk_bytes: self.options.chunk_bytes,
            object_class,
            anchors: self.anchors.clone(),
            retry,
            call_timeout,
            dirs: DirCache::new(self.options.dir_cache),
        }))
    }
}

/// A mounted DFS container.
pub struct DaosContainer {
    fs: Arc<Fs>,
    name: String,
    chunk_bytes: u64,
    object_class: u32,
    anchors: Arc<AnchorKey>,
    retry: Retry,
    call_timeout: Duration,
    /// Directories found by path, used as parents again for a while.
    dirs: DirCache<Obj>,
}

/// What an operator checks when DAOS does not answer or cannot be reached.
const CHECK_DAOS: &str = "check that every DAOS engine is up (`dmg system query`: all Joined) and the DAOS client log; \
    the agent serves again once DAOS answers, with no restart";

/// A DAOS failure at `path` as a backend error, with the DAOS name in the message.
fn map(path: &str, e: CallError) -> Error {
    let path = path.to_owned();
    match e.code {
        Code::Errno(libc::ENOENT) | Code::Der(der::NONEXIST) => Error::NotFound { path },
        Code::Errno(libc::EEXIST) | Code::Der(der::EXIST) => Error::AlreadyExists { path },
        Code::Errno(libc::ENOTDIR) => Error::NotADirectory { path },
        Code::Errno(libc::EISDIR) => Error::IsADirectory { path },
        Code::Errno(libc::ENOTEMPTY) => Error::DirectoryNotEmpty { path },
        Code::Errno(libc::ENAMETOOLONG) => Error::InvalidPath { path, reason: e.to_string() },
        Code::Errno(libc::EINVAL) | Code::Der(der::INVAL) => Error::InvalidArgument(format!("{path}: {e}")),
        Code::Errno(libc::EPERM | libc::EACCES) | Code::Der(der::NO_PERM) => {
            Error::Denied { what: path, reason: format!("{e}: check the container's ACL (daos container get-acl)") }
        }
        Code::NoAnswer => {
            Error::Unavailable { what: path, reason: format!("{e} ([backend] call_timeout_seconds): {CHECK_DAOS}") }
        }
        _ if retry::is_transient(&e) => Error::Unavailable {
            what: path,
            reason: format!("{e}, still failing at the retry deadline ([backend] retry_seconds): {CHECK_DAOS}"),
        },
        _ => io_error(&path, e),
    }
}

/// `call` made on a call thread and again while it fails transiently (see [`Retry`]),
/// all of it within `call_timeout` ([`deadline::call`]). `name` is the DAOS function.
fn bounded<T: Send + 'static>(
    retry: Retry,
    call_timeout: Duration,
    name: &'static str,
    path: &str,
    mut call: impl FnMut() -> std::result::Result<T, CallError> + Send + 'static,
) -> std::result::Result<T, CallError> {
    let what = path.to_owned();
    deadline::call(name, path, call_timeout, move || {
        retry.run(&what, || deadline::one_at_a_time(call_timeout, &mut call))
    })
}

fn io_error(what: &str, e: CallError) -> Error {
    Error::Io { context: format!("{what}: {e}"), source: std::io::Error::from_raw_os_error(e.errno()) }
}

fn kind_of(path: &str, st: &Stat) -> Result<EntryKind> {
    match st.mode & libc::S_IFMT {
        libc::S_IFDIR => Ok(EntryKind::Directory),
        libc::S_IFREG => Ok(EntryKind::File),
        libc::S_IFLNK => Err(Error::UnsupportedEntry {
            path: path.to_owned(),
            reason: "is a symbolic link, which dpuio does not follow or serve".to_owned(),
        }),
        other => Err(Error::UnsupportedEntry {
            path: path.to_owned(),
            reason: format!("is an entry of type {other:#o}, which dpuio does not serve"),
        }),
    }
}

/// `attr` with `object_id` from the DAOS object id (DFS leaves `st_ino` 0). The 128-bit
/// oid is folded to 64 bits: `lo` is the container's object sequence number and the low
/// half of `hi` its high part, so distinct objects of a container keep distinct ids.
fn with_object_id(mut attr: Attr, obj: &Obj, path: &NsPath) -> Result<Attr> {
    let oid = obj.info().map_err(|e| map(path.as_str(), e))?.doi_oid;
    attr.object_id = oid.lo ^ (oid.hi << 32);
    Ok(attr)
}

/// Attributes from a DFS stat. `object_id` is `st_ino`, which DFS leaves 0: listings
/// report 0 (finding each entry's oid would cost a lookup per entry); `stat` of a path
/// or an object fills it in with [`with_object_id`].
fn attr(path: &str, st: &Stat) -> Result<Attr> {
    let kind = kind_of(path, st)?;
    Ok(Attr {
        kind,
        size: if kind == EntryKind::File { st.size } else { 0 },
        mode: st.mode & 0o7777,
        mtime_ns: st.mtime_ns,
        object_id: st.ino,
    })
}

impl DaosContainer {
    /// The container's owner (`user@`) and its ACL entries in DAOS's own format
    /// (`A::OWNER@:rwdtTaAo`), as `daos container get-acl` prints them.
    pub fn acl(&self) -> Result<(String, Vec<String>)> {
        let fs = self.fs.clone();
        self.bounded("daos_cont_get_acl", &NsPath::root(), move || fs.acl())
    }

    /// The open directory `path` (its stat checked to be a directory), opened
    /// read-write: DFS refuses entries made or removed through a read-only parent.
    /// Kept for a while ([`DirCache`]) and used again from there.
    fn dir(&self, path: &NsPath) -> Result<Arc<Obj>> {
        if let Some(dir) = self.dirs.get(path) {
            return Ok(dir);
        }
        let (obj, st) = self.lookup(path, true)?;
        match kind_of(path.as_str(), &st)? {
            EntryKind::Directory => {
                let dir = Arc::new(obj);
                self.dirs.put(path, &dir);
                Ok(dir)
            }
            EntryKind::File => Err(Error::NotADirectory { path: path.to_string() }),
        }
    }

    /// The entry at `path` opened (read-write with `write`) and its stat. With
    /// directories kept, one `dfs_lookup_rel` in its parent (itself from the cache
    /// when there): one fetch from DAOS for the entry, where a whole path's lookup
    /// makes one per component. A parent in which the name is not found is forgotten,
    /// in case another client removed or renamed it.
    fn lookup_entry(&self, path: &NsPath, write: bool) -> Result<(Obj, Stat)> {
        let (Some(parent), Some(name), true) = (path.parent(), path.file_name(), self.dirs.keeps()) else {
            return self.lookup(path, write);
        };
        let dir = if parent.is_root() { None } else { Some(self.dir(&parent)?) };
        let (fs, name) = (self.fs.clone(), name.to_owned());
        let found = self.bounded("dfs_lookup_rel", path, move || fs.lookup_rel(dir.as_deref(), &name, write));
        if let Err(Error::NotFound { .. } | Error::NotADirectory { .. }) = &found {
            self.dirs.forget(&parent);
        }
        found
    }

    /// `dfs_lookup` of `path`, bounded.
    fn lookup(&self, path: &NsPath, write: bool) -> Result<(Obj, Stat)> {
        let (fs, p) = (self.fs.clone(), path.to_string());
        bounded(self.retry, self.call_timeout, "dfs_lookup", path.as_str(), move || fs.lookup(&p, write))
            .map_err(|e| map(path.as_str(), e))
    }

    /// `call` bounded ([`bounded`]) with this container's settings, a failure mapped
    /// for `path`.
    fn bounded<T: Send + 'static>(
        &self,
        name: &'static str,
        path: &NsPath,
        call: impl FnMut() -> std::result::Result<T, CallError> + Send + 'static,
    ) -> Result<T> {
        bounded(self.retry, self.call_timeout, name, path.as_str(), call).map_err(|e| map(path.as_str(), e))
    }

    /// The parent directory object of a non-root path (`None`: the root) and the name.
    fn parent<'p>(&self, path: &'p NsPath) -> Result<(Option<Arc<Obj>>, &'p str)> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(Error::InvalidArgument(format!("{path}: the container root has no parent")));
        };
        let dir = if parent.is_root() { None } else { Some(self.dir(&parent)?) };
        Ok((dir, name))
    }

    /// Stat of `name` in `parent`; `None` when it does not exist.
    fn probe(&self, parent: Option<&Arc<Obj>>, name: &str, path: &NsPath) -> Result<Option<Stat>> {
        let (fs, parent, name) = (self.fs.clone(), parent.cloned(), name.to_owned());
        let stat = move || fs.stat(parent.as_deref(), &name);
        match bounded(self.retry, self.call_timeout, "dfs_stat", path.as_str(), stat) {
            Ok(st) => Ok(Some(st)),
            Err(e) if e.code == Code::Errno(libc::ENOENT) => Ok(None),
            Err(e) => Err(map(path.as_str(), e)),
        }
    }

    /// Open (and maybe create) the file at `path`; with `create`, also its attributes as
    /// opened (one `dfs_open_stat`, which for a file it creates costs no more than
    /// `dfs_open`).
    fn open_object(&self, path: &NsPath, options: OpenOptions, mode: u32) -> Result<(DaosObject, Option<Stat>)> {
        if options.truncate && !options.write {
            return Err(Error::InvalidArgument(format!("{path}: truncate on open needs write")));
        }
        if options.exclusive && !options.create {
            return Err(Error::InvalidArgument(format!("{path}: exclusive applies only with create")));
        }
        if path.is_root() {
            return Err(Error::IsADirectory { path: path.to_string() });
        }
        let (parent, name) = self.parent(path)?;
        // DFS opens whatever the name is; the type is checked before any side effect
        // (O_TRUNC), so a directory or link is refused untouched. An exclusive create
        // needs no look first: DFS's O_EXCL refuses any existing name (`EEXIST`).
        let exclusive_create = options.create && options.exclusive && !options.truncate;
        let existing = if exclusive_create { None } else { self.probe(parent.as_ref(), name, path)? };
        match existing {
            Some(st) => {
                if options.create && options.exclusive {
                    return Err(Error::AlreadyExists { path: path.to_string() });
                }
                if kind_of(path.as_str(), &st)? == EntryKind::Directory {
                    return Err(Error::IsADirectory { path: path.to_string() });
                }
            }
            None if !options.create => return Err(Error::NotFound { path: path.to_string() }),
            None => {}
        }
        let mut flags = if options.write { libc::O_RDWR } else { libc::O_RDONLY };
        if options.create {
            flags |= libc::O_CREAT;
        }
        if options.exclusive {
            flags |= libc::O_EXCL;
        }
        if options.truncate {
            flags |= libc::O_TRUNC;
        }
        let layout = options.layout;
        // The chunk size comes from an untrusted CreateRequest: a 1-byte chunk would turn
        // one file into millions of DAOS records.
        if layout.chunk_bytes != 0 && !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&layout.chunk_bytes) {
            return Err(Error::InvalidArgument(format!(
                "{path}: chunk size {} is outside {MIN_CHUNK_BYTES} to {MAX_CHUNK_BYTES} bytes (0 takes the \
                 container's default)",
                layout.chunk_bytes
            )));
        }
        let object_class = if layout.object_class != 0 { layout.object_class } else { self.object_class };
        let chunk_bytes = if layout.chunk_bytes != 0 { layout.chunk_bytes } else { self.chunk_bytes };
        let (fs, name, mode) = (self.fs.clone(), name.to_owned(), libc::S_IFREG | (mode & 0o7777));
        let (call, create) = if options.create { ("dfs_open_stat", true) } else { ("dfs_open", false) };
        let (obj, stat) = self.bounded(call, path, move || {
            fs.open(parent.as_deref(), &name, mode, flags, object_class, chunk_bytes, create)
        })?;
        Ok((self.object(obj, path, options.write), stat))
    }

    /// `obj`, opened at `path`, as this container's object.
    fn object(&self, obj: Obj, path: &NsPath, writable: bool) -> DaosObject {
        DaosObject {
            obj: Arc::new(obj),
            path: path.clone(),
            writable,
            retry: self.retry,
            call_timeout: self.call_timeout,
        }
    }
}

/// One side of a rename: the path, its parent directory (`None`: the root) and its name.
type Side<'a> = (&'a NsPath, Option<Arc<Obj>>, &'a str);

impl DaosContainer {
    /// `dfs_move`, bounded.
    /// Both paths' kept directories are forgotten, whatever the answer.
    fn bounded_rename(
        &self,
        (from, src_parent, src_name): Side<'_>,
        (to, dst_parent, dst_name): Side<'_>,
    ) -> Result<()> {
        let (fs, src_name, dst_name) = (self.fs.clone(), src_name.to_owned(), dst_name.to_owned());
        let moved = self.bounded("dfs_move", from, move || {
            fs.rename(src_parent.as_deref(), &src_name, dst_parent.as_deref(), &dst_name)
        });
        self.dirs.forget(from);
        self.dirs.forget(to);
        moved
    }
}

impl Container for DaosContainer {
    fn name(&self) -> &str {
        &self.name
    }

    fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    fn stat(&self, path: &NsPath) -> Result<Attr> {
        let (obj, st) = self.lookup_entry(path, false)?;
        with_object_id(attr(path.as_str(), &st)?, &obj, path)
    }

    fn mkdir(&self, path: &NsPath, mode: u32) -> Result<Attr> {
        if path.is_root() {
            return Err(Error::AlreadyExists { path: path.to_string() });
        }
        let (parent, name) = self.parent(path)?;
        let (fs, name, class) = (self.fs.clone(), name.to_owned(), self.object_class);
        self.bounded("dfs_mkdir", path, move || fs.mkdir(parent.as_deref(), &name, mode & 0o7777, class))?;
        self.stat(path)
    }

    fn readdir(&self, path: &NsPath, anchor: Option<&str>, max: usize) -> Result<(Vec<DirEntry>, Option<String>)> {
        if max == 0 {
            return Err(Error::InvalidArgument(format!("{path}: readdir needs room for at least one entry")));
        }
        let dir = self.dir(path)?;
        let mut position = match anchor {
            None => daos_anchor_t::ZERO,
            Some(token) => self.anchors.decode(&self.name, path.as_str(), token).map_err(|why| {
                Error::InvalidArgument(format!(
                    "{path}: readdir anchor refused: {why}; list the directory again from the start (no anchor)"
                ))
            })?,
        };
        let mut entries = Vec::new();
        while entries.len() < max && !position.is_eof() {
            let want = (max - entries.len()).min(READDIR_CALL_ENTRIES) as u32;
            let (fs, from, dir) = (self.fs.clone(), position, dir.clone());
            // Each try starts from the same position: a failed call may have moved its copy.
            let (batch, next) = self.bounded("dfs_readdirplus", path, move || {
                let mut at = from;
                fs.readdir(&dir, &mut at, want).map(|batch| (batch, at))
            })?;
            position = next;
            for (name, st) in batch {
                let Ok(child) = path.join(&name) else {
                    tracing::warn!(container = self.name, dir = %path, name, "readdir: skipping a name dpuio cannot serve");
                    continue;
                };
                match attr(child.as_str(), &st) {
                    Ok(attr) => entries.push(DirEntry { name, attr }),
                    Err(e) => tracing::debug!(container = self.name, error = %e, "readdir: skipped"),
                }
            }
        }
        let next = (!position.is_eof()).then(|| self.anchors.encode(&self.name, path.as_str(), &position));
        Ok((entries, next))
    }

    fn open(&self, path: &NsPath, options: OpenOptions, mode: u32) -> Result<Arc<dyn Object>> {
        Ok(Arc::new(self.open_object(path, options, mode)?.0))
    }

    /// An open that neither creates nor truncates is one `dfs_lookup`, which opens the
    /// file and stats it in one call (where [`Container::open`] and a stat are the
    /// parent's lookup, a `dfs_stat` probe, `dfs_open` and `dfs_ostat`); a create is
    /// the parent's lookup and one `dfs_open_stat` (no `dfs_ostat`, which reads the
    /// entry and the file's size again: a create through the ring took 2.3x libdfs's
    /// `dfs_open`).
    fn open_stat(&self, path: &NsPath, options: OpenOptions, mode: u32) -> Result<(Arc<dyn Object>, Attr)> {
        if options.create || options.truncate || path.is_root() {
            let (object, stat) = self.open_object(path, options, mode)?;
            let attr = match stat {
                Some(st) => with_object_id(attr(path.as_str(), &st)?, &object.obj, path)?,
                None => object.stat()?,
            };
            return Ok((Arc::new(object), attr));
        }
        let (obj, st) = self.lookup_entry(path, options.write)?;
        if kind_of(path.as_str(), &st)? == EntryKind::Directory {
            return Err(Error::IsADirectory { path: path.to_string() });
        }
        let attr = with_object_id(attr(path.as_str(), &st)?, &obj, path)?;
        Ok((Arc::new(self.object(obj, path, options.write)), attr))
    }

    fn remove(&self, path: &NsPath, recursive: bool) -> Result<()> {
        if path.is_root() {
            return Err(Error::InvalidArgument("/: the container root cannot be removed".to_owned()));
        }
        let (parent, name) = self.parent(path)?;
        let (fs, name) = (self.fs.clone(), name.to_owned());
        let removed = self.bounded("dfs_remove", path, move || fs.remove(parent.as_deref(), &name, recursive));
        // Forgotten whatever the answer: a recursive remove may have gone part way.
        self.dirs.forget(path);
        removed
    }

    fn rename(&self, from: &NsPath, to: &NsPath) -> Result<()> {
        check_rename(from, to)?;
        if to.starts_with(from) && to != from {
            return Err(invalid_rename(from, to, INTO_OWN_SUBTREE));
        }
        let (src_parent, src_name) = self.parent(from)?;
        let (dst_parent, dst_name) = self.parent(to)?;
        if self.probe(src_parent.as_ref(), src_name, from)?.is_none() {
            return Err(Error::NotFound { path: from.to_string() });
        }
        if self.probe(dst_parent.as_ref(), dst_name, to)?.is_some() {
            return Err(Error::AlreadyExists { path: to.to_string() });
        }
        self.bounded_rename((from, src_parent, src_name), (to, dst_parent, dst_name))
    }

    fn replace(&self, from: &NsPath, to: &NsPath) -> Result<()> {
        check_replace(from, to)?;
        let (src_parent, src_name) = self.parent(from)?;
        let (dst_parent, dst_name) = self.parent(to)?;
        match self.probe(src_parent.as_ref(), src_name, from)? {
            None => return Err(Error::NotFound { path: from.to_string() }),
            Some(st) if kind_of(from.as_str(), &st)? != EntryKind::File => {
                return Err(Error::IsADirectory { path: from.to_string() });
            }
            Some(_) => {}
        }
        if let Some(st) = self.probe(dst_parent.as_ref(), dst_name, to)?
            && kind_of(to.as_str(), &st)? != EntryKind::File
        {
            return Err(Error::IsADirectory { path: to.to_string() });
        }
        // dfs_move replaces an existing entry: it removes the old entry (and punches its
        // object), then inserts the moved one. With DFS_USE_DTX=1 in the agent's
        // environment both happen in one DAOS transaction; without it a crash between
        // the two leaves no entry at `to` (the new data stays under `from`): see
        // docs/daos.md.
        self.bounded_rename((from, src_parent, src_name), (to, dst_parent, dst_name))
    }

    fn truncate(&self, path: &NsPath, size: u64) -> Result<()> {
        let object = self.open_object(path, OpenOptions { write: true, ..OpenOptions::default() }, 0)?.0;
        object.truncate(size)
    }

    fn sync(&self) -> Result<()> {
        let fs = self.fs.clone();
        self.bounded("dfs_sync", &NsPath::root(), move || fs.sync())
    }
}

/// The [`IoQueue`] of one I/O thread: a DAOS event queue. Pieces on [`DaosObject`]s run
/// as asynchronous `dfs_read`/`dfs_write` calls, [`IO_QUEUE_DEPTH`] at once; any other
/// object (the inline encryption wrapper, which checks and decrypts inside its
/// `read_at`) runs on the calling thread after them (the data plane ends a batch at the
/// first such piece, so at most one waits for the others).
struct DaosIoQueue {
    eq: EventQueue,
    /// When a batch DAOS leaves unanswered is listed as stuck.
    call_timeout: Duration,
}

fn daos_object(object: &dyn Object) -> Option<&DaosObject> {
    object.as_any()?.downcast_ref::<DaosObject>()
}

impl IoQueue for DaosIoQueue {
    fn depth(&self) -> usize {
        self.eq.depth()
    }

    fn overlaps(&self, object: &dyn Object) -> bool {
        daos_object(object).is_some()
    }

    fn deadline(&self) -> Option<Duration> {
        Some(self.call_timeout)
    }

    fn run(&mut self, batch: &mut [IoRequest<'_>], done: &mut dyn FnMut(usize, Result<usize>)) {
        // Split the batch: DFS objects go to the event queue (remembering their batch
        // index), the rest run here once the queue is drained.
        let mut ops = Vec::with_capacity(batch.len());
        let mut indices = Vec::with_capacity(batch.len());
        let mut objects = Vec::with_capacity(batch.len());
        let mut others = Vec::new();
        // A batch cannot be left behind at a deadline (DAOS writes the memory it lends):
        // none is sent while DAOS leaves calls unanswered.
        let refused = deadline::refuse_while_stuck("dfs_read/dfs_write").err();
        for (i, request) in batch.iter_mut().enumerate() {
            let Some(object) = daos_object(request.object) else {
                others.push(i);
                continue;
            };
            if let Some(e) = &refused {
                done(i, Err(map(object.path.as_str(), e.clone())));
                continue;
            }
            let offset = request.offset;
            match &mut request.op {
                IoOp::Read(buf) => ops.push(AsyncIo::Read { obj: &object.obj, buf: buf.reborrow(), offset }),
                IoOp::Write(buf) => match object.check_write(buf.len(), offset) {
                    Ok(()) => ops.push(AsyncIo::Write { obj: &object.obj, buf: *buf, offset }),
                    Err(e) => {
                        done(i, Err(e));
                        continue;
                    }
                },
            }
            indices.push(i);
            objects.push(object);
        }
        // Reads that came back short before the end of the file (which libdfs does not
        // do today) are finished with blocking reads once the queue is drained, as
        // `read_at` would.
        let read_lens: Vec<Option<usize>> = ops
            .iter()
            .map(|op| match op {
                AsyncIo::Read { buf, .. } => Some(buf.len()),
                AsyncIo::Write { .. } => None,
            })
            .collect();
        let mut short = Vec::new();
        let mut again = Vec::new();
        self.eq.run(&mut ops, self.call_timeout, &mut |k, result| {
            let (i, object) = (indices[k], objects[k]);
            match result {
                Ok(n) if n > 0 && read_lens[k].is_some_and(|len| n < len) => short.push((k, n)),
                Ok(n) => done(i, Ok(n)),
                // An engine gone or the pool map moving: made again below, as blocking
                // calls, until DAOS serves it or the retry deadline passes.
                Err(e) if retry::is_transient(&e) && !object.retry.deadline.is_zero() => {
                    again.push((k, Tries::start(object.path.as_str(), &e)))
                }
                Err(e) => done(i, Err(map(object.path.as_str(), e))),
            }
        });
        drop(ops);
        for (k, n) in short {
            let i = indices[k];
            let rest = match &mut batch[i].op {
                IoOp::Read(buf) => objects[k].read_into(buf.slice_mut(n..), batch[i].offset + n as u64),
                IoOp::Write(_) => Ok(0),
            };
            done(i, rest.map(|m| n + m));
        }
        for (k, tries) in again {
            let (i, object) = (indices[k], objects[k]);
            let offset = batch[i].offset;
            let result = match &mut batch[i].op {
                IoOp::Read(buf) => object.retry.resume(tries, || object.obj.read_at(buf.reborrow(), offset)),
                IoOp::Write(buf) => {
                    object.retry.resume(tries, || object.obj.write_at(*buf, offset).map(|()| buf.len()))
                }
            };
            let result = result.map_err(|e| map(object.path.as_str(), e));
            // A read that comes back short before the end of the file is finished as above.
            let result = match (result, &mut batch[i].op) {
                (Ok(n), IoOp::Read(buf)) if n > 0 && n < buf.len() => {
                    object.read_into(buf.slice_mut(n..), offset + n as u64).map(|m| n + m)
                }
                (result, _) => result,
            };
            done(i, result);
        }
        for i in others {
            done(i, batch[i].run_blocking());
        }
    }
}

/// An open DFS file.
pub struct DaosObject {
    obj: Arc<Obj>,
    path: NsPath,
    writable: bool,
    retry: Retry,
    call_timeout: Duration,
}

impl DaosObject {
    fn read_only(&self, what: &str) -> Error {
        Error::AccessMode { path: self.path.to_string(), reason: format!("{what} needs a handle opened for writing") }
    }

    /// What `write_at` checks before DFS sees a write.
    fn check_write(&self, len: usize, offset: u64) -> Result<()> {
        if !self.writable {
            return Err(self.read_only("write"));
        }
        offset
            .checked_add(len as u64)
            .map(drop)
            .ok_or_else(|| Error::InvalidArgument(format!("{}: offset {offset} + length overflows", self.path)))
    }
}

impl Object for DaosObject {
    fn path(&self) -> &NsPath {
        &self.path
    }

    fn writable(&self) -> bool {
        self.writable
    }

    /// `dfs_read` straight into the view (the host's mapped region on the data plane).
    fn read_into(&self, mut buf: HostBytesMut<'_>, offset: u64) -> Result<usize> {
        // Into memory the caller lends: this call cannot be left behind at a deadline,
        // so none is made while DAOS leaves others unanswered.
        deadline::refuse_while_stuck("dfs_read").map_err(|e| map(self.path.as_str(), e))?;
        let mut done = 0;
        // dfs_read returns short only at the end of the file; loop in case a read over
        // many chunks ever comes back short before it.
        while done < buf.len() {
            let n = self
                .retry
                .run(self.path.as_str(), || self.obj.read_at(buf.slice_mut(done..), offset + done as u64))
                .map_err(|e| map(self.path.as_str(), e))?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }

    /// `dfs_write` straight from the view: DAOS reads each byte once.
    fn write_from(&self, buf: HostBytes<'_>, offset: u64) -> Result<()> {
        self.check_write(buf.len(), offset)?;
        // As for read_into.
        deadline::refuse_while_stuck("dfs_write").map_err(|e| map(self.path.as_str(), e))?;
        self.retry.run(self.path.as_str(), || self.obj.write_at(buf, offset)).map_err(|e| map(self.path.as_str(), e))
    }

    fn stat(&self) -> Result<Attr> {
        let obj = self.obj.clone();
        let st = bounded(self.retry, self.call_timeout, "dfs_ostat", self.path.as_str(), move || obj.stat())
            .map_err(|e| map(self.path.as_str(), e))?;
        with_object_id(attr(self.path.as_str(), &st)?, &self.obj, &self.path)
    }

    fn truncate(&self, size: u64) -> Result<()> {
        if !self.writable {
            return Err(self.read_only("truncate"));
        }
        let obj = self.obj.clone();
        bounded(self.retry, self.call_timeout, "dfs_punch", self.path.as_str(), move || obj.truncate(size))
            .map_err(|e| map(self.path.as_str(), e))
    }

    fn sync(&self) -> Result<()> {
        // A DFS write is durable once dfs_write returns; there is nothing to flush.
        Ok(())
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}
