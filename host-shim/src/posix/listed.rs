//! Attributes a directory listing brought, kept for the calls that follow it.
//!
//! The agent lists a directory with each entry's attributes (DAOS's
//! `dfs_readdirplus`). Programs that list and then look at each entry (`ls -l`, `du`,
//! `find -size`, `rm -r`, Python's `os.scandir` with `entry.stat()`) then ask for each
//! entry's attributes again: one round trip per entry that the listing already
//! answered. A mount with a listing TTL answers `stat` of a listed path, and the kind
//! check of `unlink` and `rmdir`, from the listing for that long, as NFS's
//! readdirplus and a FUSE kernel cache do (`dpuio mount`'s kernel TTL is one second too).
//!
//! What this process changes is never answered stale: every change through the mount
//! forgets its path first (a rename, everything) and counts a change; a listing that
//! was opened before a change keeps nothing it brings after it (its batches may have
//! been read before the change reached the agent). Changes by other processes show
//! once the TTL has passed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::blocking::DirStream;
use crate::{Attr, DirEntry};

/// Entries kept at most; past it the expired go, and if that is not enough, all.
const MAX_ENTRIES: usize = 1 << 16;

/// The attributes of recently listed paths.
#[derive(Default)]
pub(super) struct Listed {
    /// How long a listed entry answers, in milliseconds (0: off).
    ttl_ms: AtomicU64,
    /// Changes made through the mount so far.
    changes: AtomicU64,
    /// Entries in `entries`, read without the lock (the write path's test).
    held: AtomicUsize,
    entries: Mutex<HashMap<String, (Attr, Instant)>>,
}

impl Listed {
    pub(super) fn set_ttl(&self, ttl: Duration) {
        self.ttl_ms.store(ttl.as_millis().min(u64::MAX as u128) as u64, Ordering::Relaxed);
        if ttl.is_zero() {
            self.forget_all();
        }
    }

    fn ttl(&self) -> Option<Duration> {
        let ms = self.ttl_ms.load(Ordering::Relaxed);
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// The attributes of `path` as a listing within the TTL gave them.
    pub(super) fn get(&self, path: &str) -> Option<Attr> {
        if self.held.load(Ordering::Acquire) == 0 {
            return None;
        }
        let ttl = self.ttl()?;
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (attr, at) = entries.get(path)?;
        (at.elapsed() < ttl).then(|| attr.clone())
    }

    /// This process is about to change `path` (create, write, truncate, remove).
    pub(super) fn changing(&self, path: &str) {
        self.changes.fetch_add(1, Ordering::AcqRel);
        if self.held.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.remove(path).is_some() {
            self.held.store(entries.len(), Ordering::Release);
        }
    }

    /// This process is about to change what is under a path (a rename): nothing listed
    /// before stays.
    pub(super) fn forget_all(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
        if self.held.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.clear();
        self.held.store(0, Ordering::Release);
    }

    /// Keep `entries` of `dir`, listed by a stream opened when `changes_at_open`
    /// changes had been made; nothing when one was made since.
    fn remember(&self, dir: &str, listed: &[DirEntry], changes_at_open: u64) {
        if listed.is_empty() || self.ttl().is_none() || self.changes.load(Ordering::Acquire) != changes_at_open {
            return;
        }
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        // Checked again under the lock: a change that forgot its path before this
        // took it must not see its old attributes put back.
        if self.changes.load(Ordering::Acquire) != changes_at_open {
            return;
        }
        if entries.len() + listed.len() > MAX_ENTRIES {
            let ttl = self.ttl().unwrap_or_default();
            entries.retain(|_, (_, at)| at.elapsed() < ttl);
            if entries.len() + listed.len() > MAX_ENTRIES {
                entries.clear();
            }
        }
        for e in listed.iter().take(MAX_ENTRIES) {
            entries.insert(super::join(dir, &e.name), (e.attr.clone(), now));
        }
        self.held.store(entries.len(), Ordering::Release);
    }
}

/// A directory's entries streamed from the agent ([`DirStream`]), each kept in the
/// mount's [`Listed`] as it is handed out.
pub struct Listing {
    dir: String,
    stream: DirStream,
    listed: std::sync::Arc<Listed>,
    changes_at_open: u64,
}

impl Listing {
    pub(super) fn new(dir: &str, stream: DirStream, listed: std::sync::Arc<Listed>) -> Listing {
        let changes_at_open = listed.changes.load(Ordering::Acquire);
        Listing { dir: dir.to_owned(), stream, listed, changes_at_open }
    }

    /// The next entry, `None` at the end. Blocking.
    pub fn next_entry(&mut self) -> super::Result<Option<DirEntry>> {
        let entry = self.stream.next_entry()?;
        if let Some(e) = &entry {
            self.listed.remember(&self.dir, std::slice::from_ref(e), self.changes_at_open);
        }
        Ok(entry)
    }

    /// The next whole batch, `None` at the end. Blocking.
    pub fn next_batch(&mut self) -> super::Result<Option<Vec<DirEntry>>> {
        let batch = self.stream.next_batch()?;
        if let Some(b) = &batch {
            self.listed.remember(&self.dir, b, self.changes_at_open);
        }
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EntryKind;

    fn entry(name: &str, size: u64) -> DirEntry {
        DirEntry {
            name: name.into(),
            attr: Attr { kind: EntryKind::File, size, mode: 0o644, mtime_ns: 0, object_id: 0 },
        }
    }

    fn on(ttl: Duration) -> Listed {
        let l = Listed::default();
        l.set_ttl(ttl);
        l
    }

    #[test]
    fn a_listed_entry_answers_until_its_path_changes() {
        let l = on(Duration::from_secs(60));
        let at = l.changes.load(Ordering::Acquire);
        l.remember("/d", &[entry("a", 1), entry("b", 2)], at);
        assert_eq!(l.get("/d/a").map(|a| a.size), Some(1));
        assert_eq!(l.get("/d/b").map(|a| a.size), Some(2));
        assert!(l.get("/d/c").is_none());
        l.changing("/d/a");
        assert!(l.get("/d/a").is_none(), "a changed path is asked again");
        assert_eq!(l.get("/d/b").map(|a| a.size), Some(2), "other entries stay");
        l.forget_all();
        assert!(l.get("/d/b").is_none());
    }

    #[test]
    fn a_listing_opened_before_a_change_keeps_nothing() {
        let l = on(Duration::from_secs(60));
        let at = l.changes.load(Ordering::Acquire);
        l.changing("/d/a");
        l.remember("/d", &[entry("a", 1)], at);
        assert!(l.get("/d/a").is_none(), "the listing may have been read before the change");
    }

    #[test]
    fn off_or_expired_answers_nothing() {
        let off = Listed::default();
        off.remember("/d", &[entry("a", 1)], 0);
        assert!(off.get("/d/a").is_none(), "no TTL: nothing kept");
        let short = on(Duration::from_millis(1));
        short.remember("/d", &[entry("a", 1)], 0);
        std::thread::sleep(Duration::from_millis(5));
        assert!(short.get("/d/a").is_none(), "past the TTL");
    }

    #[test]
    fn entries_stay_bounded() {
        let l = on(Duration::from_secs(60));
        let many: Vec<DirEntry> = (0..MAX_ENTRIES).map(|i| entry(&format!("f{i}"), 0)).collect();
        l.remember("/d", &many, 0);
        l.remember("/e", &[entry("x", 9)], 0);
        assert!(l.held.load(Ordering::Acquire) <= MAX_ENTRIES);
        assert_eq!(l.get("/e/x").map(|a| a.size), Some(9), "the newest listing is kept");
    }
}
