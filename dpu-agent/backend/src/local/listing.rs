//! Sorted directory listings kept between `readdir` batches.
//!
//! Why this exists: `readdir` hands a directory out in batches ordered bytewise by
//! name, each resuming after an anchor name. The file system's own order (hash order
//! on ext4 and xfs) is not by name, so every batch needs the sorted names. Reading and
//! sorting the directory for each batch costs O(n log n) per batch, O(n²/batch) for
//! the whole directory: a million entries in batches of 1000 would be a thousand full
//! scans. Instead the first batch sorts the names once and leaves them here; later
//! batches binary-search their anchor, so listing n entries costs one scan and one
//! sort overall. Only names are kept: attributes come from a `stat` of each entry a
//! batch returns, so sizes and times are never stale.
//!
//! Bounds: at most `max_dirs` directories and `max_bytes` of listing (name bytes plus
//! one `usize` of index per name) over the whole backend; least recently used
//! listings go first. A directory whose names alone exceed `max_bytes` is never
//! cached: it is served by [`Smallest`] instead, one full scan per batch with memory
//! bounded by the batch size (quadratic time again, the price of bounded memory).
//! While a listing is built the names are held twice (a `Box<str>` each, then the
//! packed copy), so the transient peak per concurrent fill is about 3 × its size.
//!
//! Staleness: a listing is keyed by container and path and remembers the directory's
//! [`DirVersion`] from before its names were read; a hit needs the same version. Every
//! mutation through a container drops the listings of the directories it touched, and
//! a fill that raced with such a mutation is not kept (each fill holds a ticket that
//! the mutation revokes). Changes made behind the agent's back are noticed only when
//! they move the directory's version, i.e. at the file system's timestamp granularity.
//!
//! No I/O here: the container reads names and versions and passes them in.

use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap};
use std::mem::size_of;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::NsPath;

/// Which directory a listing belongs to: (container instance id, path in it).
pub(super) type Key = (u64, NsPath);

/// What must not have changed for a cached listing to be reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DirVersion {
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub size_bytes: u64,
}

/// The names of one directory, sorted bytewise, packed into one buffer: a million
/// 20-byte names take 28 MB here instead of about 48 MB as separate strings.
#[derive(Debug)]
pub(super) struct Listing {
    arena: String,
    /// `ends[i]` is where name `i` ends in `arena`; it starts where `i - 1` ends.
    ends: Vec<usize>,
}

impl Listing {
    /// What a name of `len` bytes costs in a listing, for budgets.
    pub(super) fn cost_bytes(len: usize) -> usize {
        len + size_of::<usize>()
    }

    pub(super) fn from_names(mut names: Vec<Box<str>>) -> Listing {
        // `str` orders bytewise, which is the order readdir promises.
        names.sort_unstable();
        let total: usize = names.iter().map(|n| n.len()).sum();
        let mut arena = String::with_capacity(total);
        let mut ends = Vec::with_capacity(names.len());
        for name in &names {
            arena.push_str(name);
            ends.push(arena.len());
        }
        Listing { arena, ends }
    }

    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(super) fn name(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.arena[start..self.ends[i]]
    }

    /// Index of the first name strictly after `anchor` (0 without one). The anchor need
    /// not be in the listing: it may have been removed since the previous batch.
    pub(super) fn position_after(&self, anchor: Option<&str>) -> usize {
        let Some(anchor) = anchor else { return 0 };
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.name(mid) <= anchor {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    pub(super) fn bytes(&self) -> usize {
        self.arena.len() + self.ends.len() * size_of::<usize>()
    }
}

/// Proof that a fill started; [`ListingCache::finish_fill`] keeps the listing only if
/// no mutation of that directory happened since.
#[derive(Debug)]
pub(super) struct Ticket(u64);

/// The backend-wide cache of listings; see the module docs.
#[derive(Debug)]
pub(super) struct ListingCache {
    max_dirs: usize,
    max_bytes: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    slots: HashMap<Key, Slot>,
    /// Sum of `Listing::bytes` over the cached listings.
    bytes: usize,
    /// Logical clock for least-recently-used eviction.
    clock: u64,
    last_ticket: u64,
    /// Fills begun, i.e. full directory scans, for tests that guard against rescans.
    fills: u64,
}

#[derive(Debug)]
struct Slot {
    /// The fill that may still store into this slot.
    ticket: u64,
    last_used: u64,
    cached: Option<(DirVersion, Arc<Listing>)>,
}

impl ListingCache {
    pub(super) fn new(max_dirs: usize, max_bytes: usize) -> ListingCache {
        ListingCache { max_dirs, max_bytes, inner: Mutex::default() }
    }

    /// The largest listing worth building: a directory over this is scanned instead.
    pub(super) fn max_listing_bytes(&self) -> usize {
        if self.max_dirs == 0 { 0 } else { self.max_bytes }
    }

    /// The cached listing of `key`, if it is still at `version`.
    pub(super) fn get(&self, key: &Key, version: DirVersion) -> Option<Arc<Listing>> {
        let mut inner = self.lock();
        inner.clock += 1;
        let clock = inner.clock;
        let slot = inner.slots.get_mut(key)?;
        match &slot.cached {
            Some((cached, listing)) if *cached == version => {
                slot.last_used = clock;
                Some(Arc::clone(listing))
            }
            _ => None,
        }
    }

    /// Claim `key` for a listing about to be read; drops what was cached there.
    pub(super) fn begin_fill(&self, key: Key) -> Ticket {
        let mut inner = self.lock();
        inner.fills += 1;
        inner.clock += 1;
        inner.last_ticket += 1;
        let (clock, ticket) = (inner.clock, inner.last_ticket);
        let freed = match inner.slots.entry(key.clone()) {
            Entry::Occupied(mut slot) => {
                let slot = slot.get_mut();
                slot.ticket = ticket;
                slot.last_used = clock;
                slot.cached.take().map_or(0, |(_, l)| l.bytes())
            }
            Entry::Vacant(slot) => {
                slot.insert(Slot { ticket, last_used: clock, cached: None });
                0
            }
        };
        inner.bytes -= freed;
        while inner.slots.len() > self.max_dirs && inner.evict_lru(&key) {}
        Ticket(ticket)
    }

    /// Keep `listing` for `key` unless the directory was mutated since `ticket`.
    pub(super) fn finish_fill(&self, key: &Key, ticket: Ticket, version: DirVersion, listing: &Arc<Listing>) {
        let mut inner = self.lock();
        if inner.slots.get(key).is_none_or(|slot| slot.ticket != ticket.0) {
            return;
        }
        let size = listing.bytes();
        if size > self.max_listing_bytes() {
            inner.slots.remove(key);
            return;
        }
        while inner.bytes + size > self.max_bytes && inner.evict_lru(key) {}
        if let Some(slot) = inner.slots.get_mut(key) {
            slot.cached = Some((version, Arc::clone(listing)));
            inner.bytes += size;
        }
    }

    /// Give up a fill (the directory was too large, or reading it failed).
    pub(super) fn abandon(&self, key: &Key, ticket: Ticket) {
        let mut inner = self.lock();
        if inner.slots.get(key).is_some_and(|slot| slot.ticket == ticket.0) {
            inner.remove(key);
        }
    }

    /// The entries of `path` changed: forget its listing and any fill in flight.
    pub(super) fn invalidate(&self, container: u64, path: &NsPath) {
        self.lock().remove(&(container, path.clone()));
    }

    /// `path` was removed or renamed: forget it and every directory below it.
    pub(super) fn invalidate_tree(&self, container: u64, path: &NsPath) {
        let mut inner = self.lock();
        let doomed: Vec<Key> =
            inner.slots.keys().filter(|(c, p)| *c == container && p.starts_with(path)).cloned().collect();
        for key in doomed {
            inner.remove(&key);
        }
    }

    #[cfg(test)]
    pub(super) fn fills(&self) -> u64 {
        self.lock().fills
    }

    #[cfg(test)]
    fn cached_bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The cache holds no invariant a panicking holder could break halfway in a
        // way that matters (worst case a listing is dropped), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Inner {
    fn remove(&mut self, key: &Key) {
        if let Some(slot) = self.slots.remove(key) {
            self.bytes -= slot.cached.map_or(0, |(_, l)| l.bytes());
        }
    }

    /// Evict the least recently used slot other than `keep`; false if there is none.
    /// A linear scan: there are at most `max_dirs` slots (tens).
    fn evict_lru(&mut self, keep: &Key) -> bool {
        let victim = self.slots.iter().filter(|(k, _)| *k != keep).min_by_key(|(_, s)| s.last_used);
        match victim.map(|(k, _)| k.clone()) {
            Some(key) => {
                self.remove(&key);
                true
            }
            None => false,
        }
    }
}

/// Picks, from names offered in any order, the `want` smallest that sort strictly
/// after `after`, in memory bounded by `want`: the batch of a directory too large to
/// cache.
#[derive(Debug)]
pub(super) struct Smallest<'a> {
    after: Option<&'a str>,
    want: usize,
    /// Max-heap of the best `want + 1` so far; the extra one tells whether more follow.
    heap: BinaryHeap<Box<str>>,
}

impl<'a> Smallest<'a> {
    pub(super) fn new(after: Option<&'a str>, want: usize) -> Smallest<'a> {
        Smallest { after, want, heap: BinaryHeap::new() }
    }

    pub(super) fn offer(&mut self, name: &str) {
        if self.after.is_some_and(|after| name <= after) {
            return;
        }
        if self.heap.len() <= self.want {
            self.heap.push(name.into());
        } else if self.heap.peek().is_some_and(|largest| name < &**largest) {
            self.heap.pop();
            self.heap.push(name.into());
        }
    }

    /// The chosen names in order, and whether any other name sorts after them.
    pub(super) fn finish(self) -> (Vec<Box<str>>, bool) {
        let mut names = self.heap.into_sorted_vec();
        let more = names.len() > self.want;
        names.truncate(self.want);
        (names, more)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<Box<str>> {
        list.iter().map(|&n| n.into()).collect()
    }

    fn version(mtime_ns: i64) -> DirVersion {
        DirVersion { dev: 1, ino: 2, mtime_ns, ctime_ns: mtime_ns, size_bytes: 0 }
    }

    fn key(path: &str) -> Key {
        (7, NsPath::parse(path).unwrap())
    }

    fn listing(list: &[&str]) -> Arc<Listing> {
        Arc::new(Listing::from_names(names(list)))
    }

    #[test]
    fn listing_sorts_bytewise_and_finds_anchors() {
        let l = Listing::from_names(names(&["b", "a", "B", "é", "ab", "z"]));
        let all: Vec<&str> = (0..l.len()).map(|i| l.name(i)).collect();
        assert_eq!(all, ["B", "a", "ab", "b", "z", "é"]);
        assert_eq!(l.position_after(None), 0);
        assert_eq!(l.position_after(Some("a")), 2);
        // An anchor that is not (or no longer) there still resumes in order.
        assert_eq!(l.position_after(Some("aa")), 2);
        assert_eq!(l.position_after(Some("")), 0);
        assert_eq!(l.position_after(Some("é")), 6);
        assert_eq!(l.position_after(Some("zz")), 5);
        assert_eq!(l.bytes(), 1 + 1 + 2 + 1 + 1 + 2 + 6 * size_of::<usize>());
    }

    #[test]
    fn empty_listing() {
        let l = Listing::from_names(Vec::new());
        assert_eq!(l.len(), 0);
        assert_eq!(l.position_after(Some("x")), 0);
    }

    #[test]
    fn cache_hits_only_at_the_same_version() {
        let cache = ListingCache::new(4, 1 << 20);
        let t = cache.begin_fill(key("/d"));
        cache.finish_fill(&key("/d"), t, version(1), &listing(&["x"]));
        assert!(cache.get(&key("/d"), version(1)).is_some());
        assert!(cache.get(&key("/d"), version(2)).is_none());
        assert!(cache.get(&key("/other"), version(1)).is_none());
        assert!(cache.get(&(8, NsPath::parse("/d").unwrap()), version(1)).is_none());
    }

    #[test]
    fn a_mutation_during_a_fill_discards_it() {
        let cache = ListingCache::new(4, 1 << 20);
        let t = cache.begin_fill(key("/d"));
        cache.invalidate(7, &NsPath::parse("/d").unwrap());
        cache.finish_fill(&key("/d"), t, version(1), &listing(&["x"]));
        assert!(cache.get(&key("/d"), version(1)).is_none());

        // A second fill supersedes the first.
        let first = cache.begin_fill(key("/d"));
        let second = cache.begin_fill(key("/d"));
        cache.finish_fill(&key("/d"), first, version(1), &listing(&["old"]));
        assert!(cache.get(&key("/d"), version(1)).is_none());
        cache.finish_fill(&key("/d"), second, version(1), &listing(&["new"]));
        assert_eq!(cache.get(&key("/d"), version(1)).unwrap().name(0), "new");
    }

    #[test]
    fn invalidate_tree_is_component_wise_and_per_container() {
        let cache = ListingCache::new(8, 1 << 20);
        for path in ["/a", "/a/b", "/ab", "/c"] {
            let t = cache.begin_fill(key(path));
            cache.finish_fill(&key(path), t, version(1), &listing(&["x"]));
        }
        let t = cache.begin_fill((8, NsPath::parse("/a").unwrap()));
        cache.finish_fill(&(8, NsPath::parse("/a").unwrap()), t, version(1), &listing(&["x"]));

        cache.invalidate_tree(7, &NsPath::parse("/a").unwrap());
        assert!(cache.get(&key("/a"), version(1)).is_none());
        assert!(cache.get(&key("/a/b"), version(1)).is_none());
        assert!(cache.get(&key("/ab"), version(1)).is_some());
        assert!(cache.get(&key("/c"), version(1)).is_some());
        assert!(cache.get(&(8, NsPath::parse("/a").unwrap()), version(1)).is_some());
    }

    #[test]
    fn bounded_by_dirs_evicting_least_recently_used() {
        let cache = ListingCache::new(2, 1 << 20);
        for path in ["/a", "/b"] {
            let t = cache.begin_fill(key(path));
            cache.finish_fill(&key(path), t, version(1), &listing(&["x"]));
        }
        assert!(cache.get(&key("/a"), version(1)).is_some()); // "/b" is now the oldest
        let t = cache.begin_fill(key("/c"));
        cache.finish_fill(&key("/c"), t, version(1), &listing(&["x"]));
        assert!(cache.get(&key("/a"), version(1)).is_some());
        assert!(cache.get(&key("/b"), version(1)).is_none());
        assert!(cache.get(&key("/c"), version(1)).is_some());
    }

    #[test]
    fn bounded_by_bytes() {
        let one = listing(&["0123456789"]).bytes();
        let cache = ListingCache::new(8, 2 * one);
        for path in ["/a", "/b", "/c"] {
            let t = cache.begin_fill(key(path));
            cache.finish_fill(&key(path), t, version(1), &listing(&["0123456789"]));
            assert!(cache.cached_bytes() <= 2 * one);
        }
        assert!(cache.get(&key("/a"), version(1)).is_none());
        assert!(cache.get(&key("/c"), version(1)).is_some());

        // A listing larger than the whole budget is never kept, and evicts nothing.
        let big = listing(&["0123456789", "abcdefghij", "klmnopqrst"]);
        assert!(big.bytes() > 2 * one);
        let t = cache.begin_fill(key("/big"));
        cache.finish_fill(&key("/big"), t, version(1), &big);
        assert!(cache.get(&key("/big"), version(1)).is_none());
        assert!(cache.get(&key("/c"), version(1)).is_some());
        assert_eq!(cache.cached_bytes(), 2 * one);
    }

    #[test]
    fn abandon_and_zero_dirs() {
        let cache = ListingCache::new(4, 1 << 20);
        let t = cache.begin_fill(key("/d"));
        cache.abandon(&key("/d"), t);
        assert_eq!(cache.fills(), 1);
        assert!(cache.lock().slots.is_empty());

        let off = ListingCache::new(0, 1 << 20);
        assert_eq!(off.max_listing_bytes(), 0);
        let t = off.begin_fill(key("/d"));
        off.finish_fill(&key("/d"), t, version(1), &listing(&["x"]));
        assert!(off.get(&key("/d"), version(1)).is_none());
    }

    #[test]
    fn smallest_picks_a_batch_after_the_anchor() {
        let offered = ["e", "a", "d", "b", "c", "f"];
        let pick = |after, want| {
            let mut s = Smallest::new(after, want);
            offered.iter().for_each(|n| s.offer(n));
            let (names, more) = s.finish();
            (names.iter().map(|n| n.to_string()).collect::<Vec<_>>(), more)
        };
        assert_eq!(pick(None, 2), (vec!["a".to_owned(), "b".to_owned()], true));
        assert_eq!(pick(Some("b"), 3), (vec!["c".to_owned(), "d".to_owned(), "e".to_owned()], true));
        assert_eq!(pick(Some("d"), 2), (vec!["e".to_owned(), "f".to_owned()], false));
        assert_eq!(pick(Some("d"), 5), (vec!["e".to_owned(), "f".to_owned()], false));
        assert_eq!(pick(Some("f"), 5), (vec![], false));
        assert_eq!(pick(Some("bb"), 1), (vec!["c".to_owned()], true));
    }
}
