//! The embedded `local` backend: DFS semantics over a directory of the machine's own
//! file system, the default when no DAOS pool is configured.
//!
//! # Layout
//!
//! `<root>/containers/<name>/` is the tree of container `<name>`, exactly as clients
//! see it: a client directory is a directory, a client file a file, an object id an
//! inode number. Nothing else is stored (no metadata files, no journal), so a root can
//! be inspected, backed up or repaired with ordinary tools, and crash safety is the
//! file system's own: every metadata change is one system call (`mkdirat`,
//! `unlinkat`, `renameat2`, `openat(O_CREAT|O_EXCL)`), which journaling file systems
//! apply atomically.
//!
//! # Design, by concern
//!
//! - Containment (`fsops.rs`): every lookup walks from the container's root descriptor
//!   one component at a time with `O_NOFOLLOW`, so links are refused
//!   ([`Error::UnsupportedEntry`]) and nothing outside the tree is reachable.
//! - Batched listing (`listing.rs`): sorted name lists are cached between `readdir`
//!   batches, bounded in directories and bytes, so a directory of n entries is read and
//!   sorted once, not once per batch.
//! - Durability (`dirty.rs`): the container remembers, within bounds, which directories
//!   and files it changed; [`Container::sync`] fsyncs those (or calls `syncfs` if the
//!   set overflowed); [`Object::sync`] fsyncs the file and, when that open created it,
//!   its directory. An acknowledged write is in the kernel's page cache before it is
//!   acknowledged, so a `kill -9` of the agent loses nothing; the fsyncs are for a
//!   crash or power loss of the machine.
//! - Rename: `renameat2(RENAME_NOREPLACE)`, which moves files and directories in one
//!   atomic, crash-safe step and fails instead of replacing an existing destination,
//!   with no window between a check and the move. On a file system without that flag
//!   it falls back to check-then-rename, where a destination created by someone else
//!   in that instant is replaced; within one agent that needs two clients racing on
//!   one name. (Hard link + unlink would be no-replace for files but not directories,
//!   and a crash between the two leaves both names.)
//!
//! One agent owns a root: mounts of a container share one state, but two agents (or
//! two `LocalBackend`s) on the same root would not see each other's cached listings
//! invalidated, and would only notice each other's changes at timestamp granularity.
//!
//! Deliberately not here: object classes and chunk layout (`Layout` is accepted and
//! ignored; `chunk_bytes` only tells the data plane where to split I/O), quotas,
//! extended attributes, links, and sharing a root between agents.

mod container;
mod dirty;
mod fsops;
mod listing;
mod object;

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rustix::fs::Mode;
use rustix::io::Errno;

use self::container::LocalContainer;
use self::listing::ListingCache;
#[cfg(doc)]
use crate::Object;
use crate::{Backend, Container, Error, Result, validate_name};

/// Chunk size the data plane splits I/O at unless configured otherwise: 1 MiB, the
/// DAOS default, so `local` and `daos` behave alike.
pub const DEFAULT_CHUNK_BYTES: u64 = 1 << 20;

/// Most entries one `readdir` batch returns, whatever `max` asks for (the agent's own
/// `max_readdir_batch` cannot be configured higher). A batch costs about 100 bytes
/// per entry, so this bounds one batch to a few MiB.
pub const MAX_READDIR_BATCH: usize = 1 << 16;

/// Tunables of a [`LocalBackend`]; [`Default`] suits a DPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalOptions {
    /// What [`Container::chunk_bytes`] reports.
    pub chunk_bytes: u64,
    /// Memory for sorted directory listings kept between `readdir` batches, over all
    /// containers. A directory whose listing is larger is listed without the cache, at
    /// the cost of one full scan per batch.
    pub listing_cache_bytes: usize,
    /// How many directories' listings are kept at once, over all containers.
    pub listing_cache_dirs: usize,
    /// Changed directories each container remembers for its next sync; beyond this the
    /// sync flushes the whole file system (`syncfs`) instead.
    pub max_dirty_dirs: usize,
    /// Written files each container remembers (and keeps open) for its next sync;
    /// beyond this the sync flushes the whole file system instead.
    pub max_dirty_files: usize,
}

impl Default for LocalOptions {
    fn default() -> LocalOptions {
        LocalOptions {
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            // A million 30-byte names take about 38 MB.
            listing_cache_bytes: 64 << 20,
            listing_cache_dirs: 64,
            max_dirty_dirs: 4096,
            max_dirty_files: 1024,
        }
    }
}

/// The embedded backend: containers are directory trees under `<root>/containers/`.
#[derive(Debug)]
pub struct LocalBackend {
    root: PathBuf,
    /// `<root>/containers`, opened once; containers are found relative to it.
    containers: OwnedFd,
    options: LocalOptions,
    listings: Arc<ListingCache>,
    /// Mounted containers, so that every mount of a name shares one dirty set and one
    /// view of the listing cache. Weak: a container unused by everyone goes away.
    mounted: Mutex<HashMap<String, Weak<LocalContainer>>>,
    /// Distinguishes container instances in the listing cache.
    next_id: AtomicU64,
}

impl LocalBackend {
    /// Open (creating if missing) a backend rooted at `root`, with default options.
    pub fn open(root: impl Into<PathBuf>) -> Result<LocalBackend> {
        LocalBackend::open_with(root, LocalOptions::default())
    }

    /// Open (creating if missing) a backend rooted at `root`.
    ///
    /// `root` itself may be or contain a symbolic link: it is the operator's choice.
    /// Errors here name the host path, since they are for the operator, not a client.
    pub fn open_with(root: impl Into<PathBuf>, options: LocalOptions) -> Result<LocalBackend> {
        let root = root.into();
        if options.chunk_bytes == 0 {
            return Err(Error::InvalidArgument("local backend: chunk_bytes must be at least 1".into()));
        }
        let containers = root.join("containers");
        let host_error = |what: &str, path: &Path, source: io::Error| Error::Io {
            context: format!("local backend: {what} {}", path.display()),
            source,
        };
        if !containers.is_dir() {
            fs::create_dir_all(&containers).map_err(|e| host_error("create", &containers, e))?;
            // Make the new directories themselves durable, or a crash could take
            // `containers/` (and every container made in it since) away again. Only the
            // two lowest levels: deeper missing parents are an installation's job.
            let parent = match root.parent() {
                Some(parent) if !parent.as_os_str().is_empty() => parent,
                _ => Path::new("."),
            };
            for dir in [root.as_path(), parent] {
                fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| host_error("fsync", dir, e))?;
            }
        }
        let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC;
        let fd = rustix::fs::openat(rustix::fs::CWD, &containers, flags, Mode::empty())
            .map_err(|e| host_error("open", &containers, e.into()))?;
        let listings = Arc::new(ListingCache::new(options.listing_cache_dirs, options.listing_cache_bytes));
        Ok(LocalBackend {
            root,
            containers: fd,
            options,
            listings,
            mounted: Mutex::default(),
            next_id: AtomicU64::new(1),
        })
    }

    /// The directory this backend was opened on.
    pub fn root(&self) -> &Path {
        &self.root
    }

    #[cfg(test)]
    fn listing_fills(&self) -> u64 {
        self.listings.fills()
    }
}

impl Backend for LocalBackend {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn mount(&self, container: &str, create: bool) -> Result<Arc<dyn Container>> {
        validate_container_name(container)?;
        // Held across the create so that two first mounts of a name make one state.
        let mut mounted = self.mounted.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(existing) = mounted.get(container).and_then(Weak::upgrade) {
            return Ok(existing);
        }
        let shown = format!("container {container:?}");
        if create {
            match rustix::fs::mkdirat(&self.containers, container, Mode::from_bits_truncate(0o700)) {
                Ok(()) => rustix::fs::fsync(&self.containers).map_err(|e| fsops::io_error(&shown, "fsync", e))?,
                Err(Errno::EXIST) => {}
                Err(e) => return Err(fsops::io_error(&shown, "create", e)),
            }
        }
        let root =
            rustix::fs::openat(&self.containers, container, fsops::dir_flags(), Mode::empty()).map_err(
                |e| match e {
                    Errno::NOENT => Error::NoSuchContainer { name: container.to_owned(), hint: String::new() },
                    Errno::LOOP | Errno::NOTDIR => Error::UnsupportedEntry {
                        path: shown.clone(),
                        reason: "its place in the backend root is not a directory (a link or file put there by \
                             something other than the agent)"
                            .into(),
                    },
                    e => fsops::io_error(&shown, "open", e),
                },
            )?;
        let state = Arc::new(LocalContainer::new(
            self.next_id.fetch_add(1, Ordering::Relaxed),
            container.to_owned(),
            root,
            &self.options,
            Arc::clone(&self.listings),
        ));
        mounted.retain(|_, weak| weak.strong_count() > 0);
        mounted.insert(container.to_owned(), Arc::downgrade(&state));
        Ok(state)
    }
}

/// A container name is also a directory name on the host and appears in URLs, logs
/// and metrics labels, so it is held to a portable alphabet: `[A-Za-z0-9._-]`, not
/// starting with `.` (no hidden directories, no `.`/`..`).
fn validate_container_name(name: &str) -> Result<()> {
    validate_name(name)?;
    let invalid = |reason: String| Err(Error::InvalidPath { path: name.to_owned(), reason });
    if name.starts_with('.') {
        return invalid("a container name cannot start with '.'".into());
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return invalid(format!("a container name uses only A-Z a-z 0-9 . _ -, not {bad:?}"));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{MAX_NAME_BYTES, NsPath};

    /// A backend in a fresh temporary directory and a mounted container `c`.
    pub(crate) fn mounted_with(options: LocalOptions) -> (tempfile::TempDir, LocalBackend, Arc<dyn Container>) {
        mounted_in(tempfile::tempdir().unwrap(), options)
    }

    /// Like [`mounted`], but in memory (`/dev/shm`) where there is one: for tests that
    /// make tens of thousands of entries, which take seconds on a busy disk's journal.
    pub(crate) fn mounted_in_memory() -> (tempfile::TempDir, LocalBackend, Arc<dyn Container>) {
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() { tempfile::tempdir_in(shm).unwrap() } else { tempfile::tempdir().unwrap() };
        mounted_in(dir, LocalOptions::default())
    }

    fn mounted_in(
        dir: tempfile::TempDir,
        options: LocalOptions,
    ) -> (tempfile::TempDir, LocalBackend, Arc<dyn Container>) {
        let backend = LocalBackend::open_with(dir.path().join("root"), options).unwrap();
        let container = backend.mount("c", true).unwrap();
        (dir, backend, container)
    }

    pub(crate) fn mounted() -> (tempfile::TempDir, LocalBackend, Arc<dyn Container>) {
        mounted_with(LocalOptions::default())
    }

    pub(crate) fn p(s: &str) -> NsPath {
        NsPath::parse(s).unwrap()
    }

    pub(crate) fn fills(backend: &LocalBackend) -> u64 {
        backend.listing_fills()
    }

    #[test]
    fn open_creates_the_layout() {
        let dir = tempfile::tempdir().unwrap();
        let backend = LocalBackend::open(dir.path().join("a/b")).unwrap();
        assert_eq!(backend.kind(), "local");
        assert_eq!(backend.root(), dir.path().join("a/b"));
        assert!(dir.path().join("a/b/containers").is_dir());
        // Opening again finds it.
        LocalBackend::open(dir.path().join("a/b")).unwrap();
    }

    #[test]
    fn open_rejects_bad_options_and_unusable_roots() {
        let dir = tempfile::tempdir().unwrap();
        let options = LocalOptions { chunk_bytes: 0, ..LocalOptions::default() };
        assert!(matches!(LocalBackend::open_with(dir.path(), options), Err(Error::InvalidArgument(_))));
        fs::write(dir.path().join("file"), b"").unwrap();
        assert!(matches!(LocalBackend::open(dir.path().join("file")), Err(Error::Io { .. })));
    }

    #[test]
    fn mount_creates_and_finds_containers() {
        let dir = tempfile::tempdir().unwrap();
        let backend = LocalBackend::open(dir.path()).unwrap();
        match backend.mount("missing", false) {
            Err(Error::NoSuchContainer { name, .. }) => assert_eq!(name, "missing"),
            other => panic!("{:?}", other.map(|c| c.name().to_owned())),
        }
        let c = backend.mount("data-1.v2_x", true).unwrap();
        assert_eq!(c.name(), "data-1.v2_x");
        assert_eq!(c.chunk_bytes(), DEFAULT_CHUNK_BYTES);
        assert!(dir.path().join("containers/data-1.v2_x").is_dir());
        drop(c);
        // Existing: found with or without create, and its contents are kept.
        let c = backend.mount("data-1.v2_x", false).unwrap();
        c.mkdir(&p("/d"), 0o755).unwrap();
        drop(c);
        let c = backend.mount("data-1.v2_x", true).unwrap();
        c.stat(&p("/d")).unwrap();
        // Containers are separate trees.
        let other = backend.mount("other", true).unwrap();
        assert!(matches!(other.stat(&p("/d")), Err(Error::NotFound { .. })));
    }

    #[test]
    fn mounts_of_one_name_share_state() {
        let (_dir, backend, c) = mounted();
        let again = backend.mount("c", false).unwrap();
        c.mkdir(&p("/d"), 0o755).unwrap();
        again.readdir(&p("/d"), None, 10).unwrap();
        // A create through one mount is seen at once through the other, cache or not.
        c.open(&p("/d/f"), crate::OpenOptions { create: true, ..Default::default() }, 0o644).unwrap();
        assert_eq!(again.readdir(&p("/d"), None, 10).unwrap().0.len(), 1);
    }

    #[test]
    fn container_names_are_validated() {
        let dir = tempfile::tempdir().unwrap();
        let backend = LocalBackend::open(dir.path()).unwrap();
        let too_long = "n".repeat(MAX_NAME_BYTES + 1);
        for bad in ["", ".", "..", ".hidden", "a/b", "a\0b", "a b", "ä", "a:b", too_long.as_str()] {
            match backend.mount(bad, true) {
                Err(Error::InvalidPath { .. }) => {}
                other => panic!("{bad:?}: {:?}", other.map(|c| c.name().to_owned())),
            }
        }
        backend.mount(&"n".repeat(MAX_NAME_BYTES), true).unwrap();
        assert_eq!(fs::read_dir(dir.path().join("containers")).unwrap().count(), 1);
    }

    #[test]
    fn a_planted_container_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let backend = LocalBackend::open(dir.path().join("root")).unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("root/containers/evil")).unwrap();
        assert!(matches!(backend.mount("evil", false), Err(Error::UnsupportedEntry { .. })));
        assert!(matches!(backend.mount("evil", true), Err(Error::UnsupportedEntry { .. })));
    }
}
