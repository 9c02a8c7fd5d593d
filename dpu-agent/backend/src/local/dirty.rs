//! What [`Container::sync`](crate::Container::sync) still has to make durable.
//!
//! Two kinds of change reach the disk only with an `fsync`: file data, and directory
//! entries (create, mkdir, remove, rename live in the parent directory). Fsyncing the
//! whole tree on every sync would cost one call per file in the container, so the
//! container remembers what it changed since the last sync:
//!
//! - directories, by path, whose entries changed (and new directories themselves);
//!   a rename rewrites remembered paths below the moved directory, so nothing is lost
//!   to a rename between the change and the sync;
//! - files written or truncated, by open descriptor (`Arc<File>`), because a path
//!   could have been renamed since the write; the descriptor stays open until the
//!   sync, even if its object is dropped first, which is what makes "dropped without
//!   sync" durable at the next container sync.
//!
//! Bounds: at most `max_dirs` paths (each at most [`MAX_PATH_BYTES`]) and `max_files`
//! descriptors. Past either, the set is dropped and marked overflowed, and the next
//! sync flushes the container's whole file system with `syncfs(2)` instead: one call
//! that covers everything, cheaper than walking a large tree, at the price of also
//! flushing other data on that file system.
//!
//! No I/O here beyond holding descriptors; the container does the fsyncs.
//!
//! [`MAX_PATH_BYTES`]: crate::MAX_PATH_BYTES

use std::cmp::Reverse;
use std::collections::HashSet;
use std::fs::File;
use std::mem;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::NsPath;

/// A value no epoch ever has: "this object is not registered for any sync yet".
pub(super) const UNREGISTERED: u64 = u64::MAX;

/// The changes of one container not yet made durable; see the module docs.
#[derive(Debug)]
pub(super) struct SyncState {
    max_dirs: usize,
    max_files: usize,
    /// Bumped, under the lock, each time a sync takes the pending changes. An object
    /// that registered its file in the current epoch need not register again, which
    /// keeps the lock off the write path after the first write of each epoch.
    epoch: AtomicU64,
    inner: Mutex<Dirty>,
}

#[derive(Debug, Default)]
struct Dirty {
    dirs: HashSet<NsPath>,
    files: Vec<(NsPath, Arc<File>)>,
    overflowed: bool,
}

/// What one sync must flush.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// Directories to fsync, deepest first, so a new directory is durable before the
    /// entry that names it.
    pub dirs: Vec<NsPath>,
    /// Files with the path they were opened by (for messages; it may be stale).
    pub files: Vec<(NsPath, Arc<File>)>,
    /// The set overflowed: flush the whole file system instead.
    pub everything: bool,
}

impl SyncState {
    pub(super) fn new(max_dirs: usize, max_files: usize) -> SyncState {
        SyncState { max_dirs, max_files, epoch: AtomicU64::new(0), inner: Mutex::default() }
    }

    /// The entries of directory `path` changed (or it was created).
    pub(super) fn mark_dir(&self, path: &NsPath) {
        let mut dirty = self.lock();
        if dirty.overflowed || dirty.dirs.contains(path) {
            return;
        }
        if dirty.dirs.len() >= self.max_dirs {
            dirty.overflow();
        } else {
            dirty.dirs.insert(path.clone());
        }
    }

    /// An object wrote to `file`; `registered` is the object's own record of the
    /// epoch it last registered in (start it at [`UNREGISTERED`]).
    pub(super) fn mark_written(&self, path: &NsPath, file: &Arc<File>, registered: &AtomicU64) {
        if registered.load(Ordering::Acquire) == self.epoch.load(Ordering::Acquire) {
            return;
        }
        let mut dirty = self.lock();
        let epoch = self.epoch.load(Ordering::Acquire);
        if registered.load(Ordering::Acquire) == epoch {
            return; // another thread writing through the same object got here first
        }
        dirty.push_file(path, Arc::clone(file), self.max_files);
        registered.store(epoch, Ordering::Release);
    }

    /// A file changed through a descriptor no object owns (truncate by path).
    pub(super) fn add_file(&self, path: &NsPath, file: File) {
        self.lock().push_file(path, Arc::new(file), self.max_files);
    }

    /// `from` was renamed to `to`: remembered directories below `from` now live below
    /// `to`.
    pub(super) fn moved(&self, from: &NsPath, to: &NsPath) {
        let mut dirty = self.lock();
        if dirty.overflowed {
            return;
        }
        let below: Vec<NsPath> = dirty.dirs.iter().filter(|p| p.starts_with(from)).cloned().collect();
        for old in below {
            dirty.dirs.remove(&old);
            match rebase(&old, from, to) {
                Some(new) => {
                    dirty.dirs.insert(new);
                }
                // Deeper than a path can be: cannot be named, so flush everything.
                None => return dirty.overflow(),
            }
        }
    }

    /// Take everything pending, starting a new epoch.
    pub(super) fn take(&self) -> Pending {
        let mut dirty = self.lock();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let Dirty { dirs, files, overflowed } = mem::take(&mut *dirty);
        let mut dirs: Vec<NsPath> = dirs.into_iter().collect();
        dirs.sort_by_key(|p| Reverse(p.components().count()));
        Pending { dirs, files, everything: overflowed }
    }

    /// A sync failed part way: what it took is lost track of, so the next sync must
    /// flush everything.
    pub(super) fn flush_everything_next(&self) {
        self.lock().overflow();
    }

    fn lock(&self) -> MutexGuard<'_, Dirty> {
        // Every update leaves the set valid (at worst overflowed), so a panic while
        // holding the lock cannot leave it half-changed in a way that loses changes.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Dirty {
    fn push_file(&mut self, path: &NsPath, file: Arc<File>, max_files: usize) {
        if self.overflowed {
            return;
        }
        if self.files.len() >= max_files {
            self.overflow();
        } else {
            self.files.push((path.clone(), file));
        }
    }

    fn overflow(&mut self) {
        self.overflowed = true;
        // Release the memory and the descriptors now: syncfs will not need them.
        self.dirs = HashSet::new();
        self.files = Vec::new();
    }
}

/// `path` (below `from`) moved to below `to`; `None` if the result is too long.
fn rebase(path: &NsPath, from: &NsPath, to: &NsPath) -> Option<NsPath> {
    let rest = path.as_str().strip_prefix(from.as_str())?;
    let base = if to.is_root() { "" } else { to.as_str() };
    NsPath::parse(&format!("{base}{rest}")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> NsPath {
        NsPath::parse(s).unwrap()
    }

    fn temp_file() -> Arc<File> {
        Arc::new(tempfile::tempfile().unwrap())
    }

    #[test]
    fn dirs_are_deduplicated_and_deepest_first() {
        let state = SyncState::new(8, 8);
        for path in ["/a", "/a/b/c", "/", "/a", "/a/b"] {
            state.mark_dir(&p(path));
        }
        let pending = state.take();
        assert_eq!(pending.dirs, [p("/a/b/c"), p("/a/b"), p("/a"), p("/")]);
        assert!(!pending.everything);
        assert!(state.take().dirs.is_empty());
    }

    #[test]
    fn a_written_file_registers_once_per_epoch() {
        let state = SyncState::new(8, 8);
        let file = temp_file();
        let registered = AtomicU64::new(UNREGISTERED);
        state.mark_written(&p("/f"), &file, &registered);
        state.mark_written(&p("/f"), &file, &registered);
        assert_eq!(state.take().files.len(), 1);
        // A new epoch: the next write registers again.
        state.mark_written(&p("/f"), &file, &registered);
        assert_eq!(state.take().files.len(), 1);
        assert_eq!(state.take().files.len(), 0);
    }

    #[test]
    fn overflow_means_everything() {
        let state = SyncState::new(2, 1);
        state.mark_dir(&p("/a"));
        state.mark_dir(&p("/b"));
        state.mark_dir(&p("/b"));
        assert!(!state.take().everything);

        for path in ["/a", "/b", "/c"] {
            state.mark_dir(&p(path));
        }
        let pending = state.take();
        assert!(pending.everything && pending.dirs.is_empty());

        state.add_file(&p("/f"), tempfile::tempfile().unwrap());
        state.add_file(&p("/g"), tempfile::tempfile().unwrap());
        let pending = state.take();
        assert!(pending.everything && pending.files.is_empty());
        assert!(!state.take().everything);

        state.flush_everything_next();
        assert!(state.take().everything);
    }

    #[test]
    fn rename_moves_remembered_dirs() {
        let state = SyncState::new(8, 8);
        for path in ["/a", "/a/x", "/a/x/y", "/ab"] {
            state.mark_dir(&p(path));
        }
        state.moved(&p("/a/x"), &p("/b/z"));
        let mut dirs = state.take().dirs;
        dirs.sort_by(|l, r| l.as_str().cmp(r.as_str()));
        assert_eq!(dirs, [p("/a"), p("/ab"), p("/b/z"), p("/b/z/y")]);
    }

    #[test]
    fn rename_past_the_path_limit_overflows() {
        let state = SyncState::new(8, 8);
        let name = "n".repeat(crate::MAX_NAME_BYTES);
        let deep = p(&format!("/a{}", format!("/{name}").repeat(15)));
        state.mark_dir(&deep);
        state.moved(&p("/a"), &p(&format!("/{name}/{name}")));
        assert!(state.take().everything);
    }
}
