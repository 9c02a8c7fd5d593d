//! Open directories by path, kept for a short time ([`DirCache`]).
//!
//! Every call on a name goes through its parent directory's DFS object, and finding that
//! object is a `dfs_lookup` of the parent's path: one fetch from DAOS per component of
//! it. DAOS's own clients keep the directories they found: dfuse for 5 s unless told
//! otherwise (its `dentry-dir-time`), libpil4dfs for 60 s (`D_IL_DCACHE_REC_TIMEOUT`). The
//! agent keeps them for `[backend] dir_cache_seconds` (default 5; 0 turns it off).
//!
//! What that means, as for dfuse and libpil4dfs: the agent's own removes and renames
//! forget what they touch at once, but a directory another DAOS client (or another
//! agent) removes or renames can still be used by its old path here until its entry
//! expires; a file created in it then lands in the removed directory (where nothing
//! finds it) or in the renamed one.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dpuio_backend::NsPath;

/// At most this many directories are kept; when full, the expired ones go, and if none
/// had expired, all of them.
const MAX_DIRS: usize = 4096;

/// Directories (`T`: an open DFS object) by path, each kept for `keep` from when it was
/// found.
pub(crate) struct DirCache<T> {
    keep: Duration,
    dirs: Mutex<HashMap<NsPath, (Arc<T>, Instant)>>,
}

impl<T> DirCache<T> {
    /// A cache keeping each directory for `keep`; zero keeps none.
    pub(crate) fn new(keep: Duration) -> DirCache<T> {
        DirCache { keep, dirs: Mutex::new(HashMap::new()) }
    }

    fn dirs(&self) -> MutexGuard<'_, HashMap<NsPath, (Arc<T>, Instant)>> {
        self.dirs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether it keeps anything (`keep` is not zero).
    pub(crate) fn keeps(&self) -> bool {
        !self.keep.is_zero()
    }

    /// The directory at `path`, if it was found less than `keep` ago.
    pub(crate) fn get(&self, path: &NsPath) -> Option<Arc<T>> {
        if self.keep.is_zero() {
            return None;
        }
        let mut dirs = self.dirs();
        match dirs.get(path) {
            Some((dir, found)) if found.elapsed() < self.keep => Some(dir.clone()),
            Some(_) => {
                dirs.remove(path);
                None
            }
            None => None,
        }
    }

    /// Keep `dir`, just found at `path`.
    pub(crate) fn put(&self, path: &NsPath, dir: &Arc<T>) {
        if self.keep.is_zero() {
            return;
        }
        let mut dirs = self.dirs();
        if dirs.len() >= MAX_DIRS && !dirs.contains_key(path) {
            let keep = self.keep;
            dirs.retain(|_, (_, found)| found.elapsed() < keep);
            if dirs.len() >= MAX_DIRS {
                dirs.clear();
            }
        }
        dirs.insert(path.clone(), (dir.clone(), Instant::now()));
    }

    /// Forget `path` and every directory under it (it was removed or renamed, or may
    /// have been).
    pub(crate) fn forget(&self, path: &NsPath) {
        if self.keep.is_zero() {
            return;
        }
        self.dirs().retain(|dir, _| !dir.starts_with(path));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> NsPath {
        NsPath::parse(s).unwrap()
    }

    #[test]
    fn a_directory_is_kept_until_it_expires_or_is_forgotten_with_its_parent() {
        let cache = DirCache::new(Duration::from_secs(60));
        for (i, d) in ["/a", "/a/b", "/a/b/c", "/ab", "/z"].into_iter().enumerate() {
            cache.put(&p(d), &Arc::new(i));
        }
        assert_eq!(cache.get(&p("/a/b")).as_deref(), Some(&1));
        cache.forget(&p("/a/b"));
        assert_eq!(cache.get(&p("/a/b")), None);
        assert_eq!(cache.get(&p("/a/b/c")), None, "under the forgotten one");
        assert_eq!(cache.get(&p("/a")).as_deref(), Some(&0), "its parent stays");
        cache.forget(&p("/a"));
        assert_eq!(cache.get(&p("/ab")).as_deref(), Some(&3), "a sibling sharing the prefix stays");
        cache.forget(&NsPath::root());
        assert_eq!(cache.get(&p("/z")), None, "the root's forget takes all");

        let short = DirCache::new(Duration::from_millis(20));
        short.put(&p("/a"), &Arc::new(1));
        assert!(short.get(&p("/a")).is_some());
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(short.get(&p("/a")), None, "expired");

        let off = DirCache::new(Duration::ZERO);
        off.put(&p("/a"), &Arc::new(1));
        assert_eq!(off.get(&p("/a")), None, "zero keeps nothing");
    }

    #[test]
    fn a_full_cache_drops_the_expired_then_everything() {
        let cache = DirCache::new(Duration::from_secs(60));
        for i in 0..MAX_DIRS {
            cache.put(&p(&format!("/d{i}")), &Arc::new(i));
        }
        cache.put(&p("/d0"), &Arc::new(7));
        assert_eq!(cache.dirs().len(), MAX_DIRS, "replacing a kept one makes no room");
        cache.put(&p("/new"), &Arc::new(1));
        assert_eq!(cache.dirs().len(), 1, "none had expired: all went");
        assert!(cache.get(&p("/new")).is_some());
    }
}
