//! One container of the local backend: the DFS namespace operations over its tree.
//!
//! Every operation first walks to the parent directory ([`fsops::open_dir`]), then acts
//! on the last component with one `*at` system call, then records what it changed:
//! the parent's listing is dropped from the cache and the parent is marked for the
//! next sync. The order matters: the record comes after the change, so a listing read
//! concurrently is either discarded or already shows the change.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::dirty::SyncState;
use super::fsops::{self, MAX_FILE_BYTES, file_type, io_error, open_dir, stat_at};
use super::listing::{DirVersion, Key, Listing, ListingCache, Smallest};
use super::object::LocalObject;
use super::{LocalOptions, MAX_READDIR_BATCH};
use crate::{Attr, Container, DirEntry, Error, NsPath, Object, OpenOptions, Result};

/// How often `open` retries when the entry changes between its probe and its open
/// (removed, or created by someone else); only a concurrent client can cause that.
const OPEN_ATTEMPTS: usize = 4;

#[derive(Debug)]
pub(super) struct LocalContainer {
    /// This instance in the backend's listing cache.
    id: u64,
    name: String,
    chunk_bytes: u64,
    /// The container's directory; every lookup starts here.
    root: OwnedFd,
    listings: Arc<ListingCache>,
    dirty: Arc<SyncState>,
}

impl LocalContainer {
    pub(super) fn new(
        id: u64,
        name: String,
        root: OwnedFd,
        options: &LocalOptions,
        listings: Arc<ListingCache>,
    ) -> LocalContainer {
        LocalContainer {
            id,
            name,
            chunk_bytes: options.chunk_bytes,
            root,
            listings,
            dirty: Arc::new(SyncState::new(options.max_dirty_dirs, options.max_dirty_files)),
        }
    }

    /// The parent directory of a non-root `path`, opened, with its path and the last
    /// component.
    fn parent_of<'p>(&self, path: &'p NsPath) -> Result<(OwnedFd, NsPath, &'p str)> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(Error::InvalidArgument(format!("{path}: the container root has no parent")));
        };
        Ok((open_dir(&self.root, &parent)?, parent, name))
    }

    /// The entries of directory `dir` changed.
    fn changed(&self, dir: &NsPath) {
        self.listings.invalidate(self.id, dir);
        self.dirty.mark_dir(dir);
    }

    /// The attributes of entry `name` of `dir` for a listing; `None` if it vanished
    /// since the names were read or is not something a listing shows.
    fn entry_attr(&self, dir: &OwnedFd, path: &NsPath, name: &str) -> Result<Option<Attr>> {
        let shown = || {
            if path.is_root() { format!("/{name}") } else { format!("{path}/{name}") }
        };
        match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => match file_type(&st) {
                FileType::RegularFile | FileType::Directory => fsops::attr(&st, &shown()).map(Some),
                // Links and special files are not part of the namespace the agent
                // serves; stat or open of one says why.
                _ => Ok(None),
            },
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(io_error(&shown(), "stat", e)),
        }
    }

    /// Read and sort the names of `dir` into the cache; `None` if the directory is too
    /// large to cache.
    fn fill(&self, dir: &OwnedFd, path: &NsPath, key: Key, version: DirVersion) -> Result<Option<Arc<Listing>>> {
        let ticket = self.listings.begin_fill(key.clone());
        let budget = self.listings.max_listing_bytes();
        let (mut names, mut bytes, mut fits) = (Vec::new(), 0, true);
        let read = fsops::for_each_name(dir, path.as_str(), |name| {
            bytes += Listing::cost_bytes(name.len());
            fits = bytes <= budget;
            if fits {
                names.push(Box::<str>::from(name));
            }
            fits
        });
        if let Err(e) = read {
            self.listings.abandon(&key, ticket);
            return Err(e);
        }
        if !fits {
            self.listings.abandon(&key, ticket);
            return Ok(None);
        }
        let listing = Arc::new(Listing::from_names(names));
        self.listings.finish_fill(&key, ticket, version, &listing);
        Ok(Some(listing))
    }

    fn batch_from_listing(
        &self,
        dir: &OwnedFd,
        path: &NsPath,
        listing: &Listing,
        anchor: Option<&str>,
        max: usize,
    ) -> Result<(Vec<DirEntry>, bool)> {
        let mut entries = Vec::with_capacity(max.min(listing.len()));
        let mut next = listing.position_after(anchor);
        while next < listing.len() && entries.len() < max {
            let name = listing.name(next);
            next += 1;
            if let Some(attr) = self.entry_attr(dir, path, name)? {
                entries.push(DirEntry { name: name.to_owned(), attr });
            }
        }
        Ok((entries, next < listing.len()))
    }

    /// A batch of a directory too large to cache: one full scan per round, keeping only
    /// the smallest names; a second round only if entries vanished under the first.
    /// One batch in bytewise name order after the name `anchor`, and whether more follow.
    fn list(&self, path: &NsPath, anchor: Option<&str>, max: usize) -> Result<(Vec<DirEntry>, bool)> {
        if let Some(anchor) = anchor {
            crate::validate_name(anchor).map_err(|e| {
                Error::InvalidArgument(format!("{path}: readdir anchor is not a name from a previous batch: {e}"))
            })?;
        }
        if max == 0 {
            return Err(Error::InvalidArgument(format!("{path}: readdir needs room for at least one entry")));
        }
        let max = max.min(MAX_READDIR_BATCH);
        let dir = open_dir(&self.root, path)?;
        // Taken before the names are read: if the directory changes meanwhile, the
        // cached listing carries the older version and is not reused.
        let version = fsops::dir_version(&fsops::stat_fd(&dir, path.as_str())?);
        let key = (self.id, path.clone());
        let listing = match self.listings.get(&key, version) {
            Some(listing) => Some(listing),
            None => self.fill(&dir, path, key, version)?,
        };
        match listing {
            Some(listing) => self.batch_from_listing(&dir, path, &listing, anchor, max),
            None => self.batch_by_scan(&dir, path, anchor, max),
        }
    }

    fn batch_by_scan(
        &self,
        dir: &OwnedFd,
        path: &NsPath,
        anchor: Option<&str>,
        max: usize,
    ) -> Result<(Vec<DirEntry>, bool)> {
        let mut entries = Vec::new();
        let mut cursor: Option<Box<str>> = None;
        loop {
            let mut smallest = Smallest::new(cursor.as_deref().or(anchor), max - entries.len());
            fsops::for_each_name(dir, path.as_str(), |name| {
                smallest.offer(name);
                true
            })?;
            let (names, more) = smallest.finish();
            for name in &names {
                if let Some(attr) = self.entry_attr(dir, path, name)? {
                    entries.push(DirEntry { name: name.to_string(), attr });
                }
            }
            if entries.len() == max || !more {
                return Ok((entries, more));
            }
            cursor = names.last().cloned();
        }
    }

    fn flush(&self, pending: super::dirty::Pending) -> Result<()> {
        if pending.everything {
            return rustix::fs::syncfs(&self.root).map_err(|e| io_error("/", "syncfs", e));
        }
        for (path, file) in &pending.files {
            file.sync_all().map_err(|source| Error::Io { context: format!("{path}: fsync"), source })?;
        }
        for path in &pending.dirs {
            let dir = match open_dir(&self.root, path) {
                Ok(dir) => dir,
                // Gone or replaced since: its removal is an entry change of its parent,
                // which is in the set too.
                Err(Error::NotFound { .. } | Error::NotADirectory { .. } | Error::UnsupportedEntry { .. }) => {
                    continue;
                }
                Err(e) => return Err(e),
            };
            rustix::fs::fsync(&dir).map_err(|e| io_error(path.as_str(), "fsync", e))?;
        }
        Ok(())
    }

    /// Wrap a freshly opened file; `created_in` is its directory if this open made it.
    fn object(
        &self,
        path: &NsPath,
        fd: OwnedFd,
        options: OpenOptions,
        created_in: Option<OwnedFd>,
    ) -> Result<Arc<dyn Object>> {
        // The probe said "regular file", but the entry may have been swapped since.
        let st = fsops::stat_fd(&fd, path.as_str())?;
        match file_type(&st) {
            FileType::RegularFile => {}
            FileType::Directory => {
                return Err(Error::IsADirectory { path: path.to_string() });
            }
            other => return Err(fsops::unsupported(path.as_str(), other)),
        }
        let object = LocalObject::new(path.clone(), File::from(fd), options.write, created_in, Arc::clone(&self.dirty));
        if options.truncate {
            object.note_write();
        }
        Ok(Arc::new(object))
    }
}

/// Mode bits for a new entry: permission bits only (no set-id or sticky bits on
/// anything the agent makes), and always owner access, because the agent, not the
/// file system, enforces clients' access and must be able to reach what it made.
fn creation_mode(mode: u32, owner: u32) -> Mode {
    Mode::from_bits_truncate((mode & 0o777) | owner)
}

fn open_error(path: &NsPath, e: Errno) -> Error {
    let shown = path.to_string();
    match e {
        Errno::NOENT => Error::NotFound { path: shown },
        Errno::EXIST => Error::AlreadyExists { path: shown },
        Errno::ISDIR => Error::IsADirectory { path: shown },
        Errno::LOOP => fsops::unsupported(&shown, FileType::Symlink),
        e => io_error(&shown, "open", e),
    }
}

impl Container for LocalContainer {
    fn name(&self) -> &str {
        &self.name
    }

    fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    fn stat(&self, path: &NsPath) -> Result<Attr> {
        let st = if path.is_root() {
            fsops::stat_fd(&self.root, "/")?
        } else {
            let (dir, _, name) = self.parent_of(path)?;
            stat_at(&dir, name, path.as_str())?
        };
        fsops::attr(&st, path.as_str())
    }

    fn mkdir(&self, path: &NsPath, mode: u32) -> Result<Attr> {
        if path.is_root() {
            return Err(Error::AlreadyExists { path: path.to_string() });
        }
        let (dir, parent, name) = self.parent_of(path)?;
        rustix::fs::mkdirat(&dir, name, creation_mode(mode, 0o700)).map_err(|e| match e {
            Errno::EXIST => Error::AlreadyExists { path: path.to_string() },
            // The parent was removed after the walk opened it.
            Errno::NOENT => Error::NotFound { path: parent.to_string() },
            e => io_error(path.as_str(), "mkdir", e),
        })?;
        self.changed(&parent);
        // The new directory too: a child created in it before the next sync needs it
        // durable first, and fsyncing an empty directory is cheap.
        self.dirty.mark_dir(path);
        fsops::attr(&stat_at(&dir, name, path.as_str())?, path.as_str())
    }

    fn readdir(&self, path: &NsPath, anchor: Option<&str>, max: usize) -> Result<(Vec<DirEntry>, Option<String>)> {
        let (entries, more) = self.list(path, anchor, max)?;
        let next = if more { entries.last().map(|e| e.name.clone()) } else { None };
        Ok((entries, next))
    }

    fn open(&self, path: &NsPath, options: OpenOptions, mode: u32) -> Result<Arc<dyn Object>> {
        if options.truncate && !options.write {
            return Err(Error::InvalidArgument(format!("{path}: truncate on open needs write")));
        }
        if options.exclusive && !options.create {
            return Err(Error::InvalidArgument(format!("{path}: exclusive applies only with create")));
        }
        if path.is_root() {
            return Err(Error::IsADirectory { path: path.to_string() });
        }
        let (dir, parent, name) = self.parent_of(path)?;
        let access = if options.write { OFlags::RDWR } else { OFlags::RDONLY };
        let flags = access | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        // Probe first, rather than a plain O_CREAT: it checks the type before any side
        // effect (O_TRUNC), and it is the only way to know whether this open created
        // the file, which decides whether its sync must also fsync the directory.
        for _ in 0..OPEN_ATTEMPTS {
            match stat_at(&dir, name, path.as_str()) {
                Ok(st) => {
                    match file_type(&st) {
                        FileType::RegularFile => {}
                        FileType::Directory => {
                            return Err(Error::IsADirectory { path: path.to_string() });
                        }
                        other => return Err(fsops::unsupported(path.as_str(), other)),
                    }
                    if options.exclusive {
                        return Err(Error::AlreadyExists { path: path.to_string() });
                    }
                    let flags = if options.truncate { flags | OFlags::TRUNC } else { flags };
                    match rustix::fs::openat(&dir, name, flags, Mode::empty()) {
                        Ok(fd) => return self.object(path, fd, options, None),
                        Err(Errno::NOENT) => continue, // removed since the probe
                        Err(e) => return Err(open_error(path, e)),
                    }
                }
                Err(Error::NotFound { .. }) if options.create => {
                    let flags = flags | OFlags::CREATE | OFlags::EXCL;
                    match rustix::fs::openat(&dir, name, flags, creation_mode(mode, 0o600)) {
                        Ok(fd) => {
                            self.changed(&parent);
                            return self.object(path, fd, options, Some(dir));
                        }
                        Err(Errno::EXIST) if !options.exclusive => continue, // created since the probe
                        Err(e) => return Err(open_error(path, e)),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Io {
            context: format!("{path}: open"),
            source: io::Error::other("the entry kept changing under concurrent requests; retry"),
        })
    }

    fn remove(&self, path: &NsPath, recursive: bool) -> Result<()> {
        if path.is_root() {
            return Err(Error::InvalidArgument(
                "the container root cannot be removed (remove its entries, or the container)".into(),
            ));
        }
        let (dir, parent, name) = self.parent_of(path)?;
        let st = stat_at(&dir, name, path.as_str())?;
        let not_found = || Error::NotFound { path: path.to_string() };
        // Links and special files are removed like files: unlinking never follows.
        if file_type(&st) != FileType::Directory {
            rustix::fs::unlinkat(&dir, name, AtFlags::empty()).map_err(|e| match e {
                Errno::NOENT => not_found(),
                e => io_error(path.as_str(), "remove", e),
            })?;
        } else if recursive {
            fsops::remove_tree(dir.as_fd(), name, path.as_str())?;
        } else {
            rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR).map_err(|e| match e {
                Errno::NOENT => not_found(),
                Errno::NOTEMPTY | Errno::EXIST => Error::DirectoryNotEmpty { path: path.to_string() },
                e => io_error(path.as_str(), "remove directory", e),
            })?;
        }
        self.changed(&parent);
        self.listings.invalidate_tree(self.id, path);
        Ok(())
    }

    fn rename(&self, from: &NsPath, to: &NsPath) -> Result<()> {
        let invalid = |reason: &str| Error::InvalidRename {
            from: from.to_string(),
            to: to.to_string(),
            reason: reason.to_owned(),
        };
        if from.is_root() {
            return Err(invalid("the container root cannot be renamed"));
        }
        if to.is_root() {
            return Err(invalid("the container root cannot be replaced"));
        }
        let (from_dir, from_parent, from_name) = self.parent_of(from)?;
        let is_dir = file_type(&stat_at(&from_dir, from_name, from.as_str())?) == FileType::Directory;
        if to == from {
            return Err(Error::AlreadyExists { path: to.to_string() });
        }
        if to.starts_with(from) {
            return Err(if is_dir {
                invalid("a directory cannot move into its own subtree")
            } else {
                Error::NotADirectory { path: from.to_string() }
            });
        }
        let (to_dir, to_parent, to_name) = self.parent_of(to)?;
        let renamed = rustix::fs::renameat_with(&from_dir, from_name, &to_dir, to_name, RenameFlags::NOREPLACE);
        let renamed = match renamed {
            // The flag is unknown to this kernel or file system: check, then rename
            // (the race this leaves is described in the module docs of `local`).
            Err(Errno::INVAL | Errno::NOSYS) => match rustix::fs::statat(&to_dir, to_name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(_) => Err(Errno::EXIST),
                Err(Errno::NOENT) => rustix::fs::renameat(&from_dir, from_name, &to_dir, to_name),
                Err(e) => Err(e),
            },
            other => other,
        };
        renamed.map_err(|e| match e {
            Errno::EXIST | Errno::NOTEMPTY => Error::AlreadyExists { path: to.to_string() },
            Errno::NOENT => Error::NotFound { path: from.to_string() },
            // Only left for a directory moved into its own subtree by a concurrent rename.
            Errno::INVAL => invalid("a directory cannot move into its own subtree"),
            e => io_error(&format!("{from} -> {to}"), "rename", e),
        })?;
        self.changed(&from_parent);
        self.changed(&to_parent);
        self.dirty.moved(from, to);
        if is_dir {
            // Its `..` entry changed.
            self.dirty.mark_dir(to);
        }
        self.listings.invalidate_tree(self.id, from);
        self.listings.invalidate_tree(self.id, to);
        Ok(())
    }

    fn replace(&self, from: &NsPath, to: &NsPath) -> Result<()> {
        let invalid = |reason: &str| Error::InvalidRename {
            from: from.to_string(),
            to: to.to_string(),
            reason: reason.to_owned(),
        };
        if from.is_root() || to.is_root() {
            return Err(invalid("the container root cannot be renamed or replaced"));
        }
        if from == to {
            return Err(invalid("a file cannot replace itself"));
        }
        let (from_dir, from_parent, from_name) = self.parent_of(from)?;
        if file_type(&stat_at(&from_dir, from_name, from.as_str())?) != FileType::RegularFile {
            return Err(Error::IsADirectory { path: from.to_string() });
        }
        let (to_dir, to_parent, to_name) = self.parent_of(to)?;
        match rustix::fs::statat(&to_dir, to_name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if file_type(&st) == FileType::RegularFile => {}
            Ok(_) => return Err(Error::IsADirectory { path: to.to_string() }),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(io_error(to.as_str(), "stat", e)),
        }
        // rename(2) swaps the directory entry in one step: the old inode stays whole
        // until the entry points at the new one, and a crash leaves one or the other.
        // A directory that appeared at `to` since the check is refused by the kernel.
        rustix::fs::renameat(&from_dir, from_name, &to_dir, to_name).map_err(|e| match e {
            Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST => Error::IsADirectory { path: to.to_string() },
            Errno::NOENT => Error::NotFound { path: from.to_string() },
            e => io_error(&format!("{from} -> {to}"), "rename", e),
        })?;
        self.changed(&from_parent);
        self.changed(&to_parent);
        self.listings.invalidate_tree(self.id, from);
        self.listings.invalidate_tree(self.id, to);
        Ok(())
    }

    fn truncate(&self, path: &NsPath, size: u64) -> Result<()> {
        if path.is_root() {
            return Err(Error::IsADirectory { path: path.to_string() });
        }
        if size > MAX_FILE_BYTES {
            return Err(Error::InvalidArgument(format!("{path}: size {size} is past the largest file size")));
        }
        let (dir, _, name) = self.parent_of(path)?;
        match file_type(&stat_at(&dir, name, path.as_str())?) {
            FileType::RegularFile => {}
            FileType::Directory => {
                return Err(Error::IsADirectory { path: path.to_string() });
            }
            other => return Err(fsops::unsupported(path.as_str(), other)),
        }
        let fd = rustix::fs::openat(&dir, name, OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| open_error(path, e))?;
        let file = File::from(fd);
        file.set_len(size).map_err(|source| Error::Io { context: format!("{path}: truncate"), source })?;
        self.dirty.add_file(path, file);
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        let pending = self.dirty.take();
        let result = self.flush(pending);
        if result.is_err() {
            self.dirty.flush_everything_next();
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::time::Instant;

    use super::super::tests::{fills, mounted, mounted_in_memory, mounted_with, p};
    use super::*;
    use crate::{Backend, EntryKind, MAX_NAME_BYTES};

    fn create() -> OpenOptions {
        OpenOptions { create: true, write: true, ..OpenOptions::default() }
    }

    fn touch(c: &dyn Container, path: &str) {
        c.open(&p(path), create(), 0o644).unwrap();
    }

    fn write(c: &dyn Container, path: &str, data: &[u8]) {
        c.open(&p(path), create(), 0o644).unwrap().write_at(data, 0).unwrap();
    }

    /// `readdir` with "more follow" as a bool, the shape these tests were written in.
    fn rd(c: &dyn Container, path: &NsPath, anchor: Option<&str>, max: usize) -> Result<(Vec<DirEntry>, bool)> {
        c.readdir(path, anchor, max).map(|(entries, next)| (entries, next.is_some()))
    }

    fn names(c: &dyn Container, path: &str) -> Vec<String> {
        let (entries, more) = rd(c, &p(path), None, usize::MAX).unwrap();
        assert!(!more);
        entries.into_iter().map(|e| e.name).collect()
    }

    #[track_caller]
    fn assert_not_found(r: Result<impl Sized>, path: &str) {
        match r {
            Err(Error::NotFound { path: got }) => assert_eq!(got, path),
            Err(e) => panic!("expected NotFound {path}, got {e:?}"),
            Ok(_) => panic!("expected NotFound {path}, got Ok"),
        }
    }

    #[track_caller]
    fn expect_err<T>(r: Result<T>) -> Error {
        match r {
            Err(e) => e,
            Ok(_) => panic!("expected an error"),
        }
    }

    #[test]
    fn stat_root_file_and_directory() {
        let (_dir, _backend, c) = mounted();
        let root = c.stat(&NsPath::root()).unwrap();
        assert_eq!((root.kind, root.size), (EntryKind::Directory, 0));
        write(&*c, "/f", b"hello");
        let f = c.stat(&p("/f")).unwrap();
        assert_eq!((f.kind, f.size, f.mode), (EntryKind::File, 5, 0o644));
        assert!(f.mtime_ns > 1_600_000_000_000_000_000, "{}", f.mtime_ns);
        assert_ne!(f.object_id, root.object_id);
        assert_not_found(c.stat(&p("/missing")), "/missing");
        assert_not_found(c.stat(&p("/missing/deeper")), "/missing");
        match expect_err(c.stat(&p("/f/x"))) {
            Error::NotADirectory { path } => assert_eq!(path, "/f"),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn mkdir_cases() {
        let (_dir, _backend, c) = mounted();
        let a = c.mkdir(&p("/a"), 0o750).unwrap();
        assert_eq!((a.kind, a.mode), (EntryKind::Directory, 0o750));
        c.mkdir(&p("/a/b"), 0o755).unwrap();
        // Owner access is always kept, set-id bits never.
        assert_eq!(c.mkdir(&p("/locked"), 0o7000).unwrap().mode, 0o700);
        assert_not_found(c.mkdir(&p("/x/y"), 0o755), "/x");
        assert!(matches!(c.mkdir(&p("/a"), 0o755), Err(Error::AlreadyExists { path }) if path == "/a"));
        assert!(matches!(c.mkdir(&NsPath::root(), 0o755), Err(Error::AlreadyExists { .. })));
        touch(&*c, "/f");
        assert!(matches!(c.mkdir(&p("/f"), 0o755), Err(Error::AlreadyExists { .. })));
        assert!(matches!(c.mkdir(&p("/f/d"), 0o755), Err(Error::NotADirectory { path }) if path == "/f"));
    }

    #[test]
    fn open_modes() {
        let (_dir, _backend, c) = mounted();
        let ro = OpenOptions::default();
        assert_not_found(c.open(&p("/f"), ro, 0), "/f");
        assert_not_found(c.open(&p("/nodir/f"), create(), 0o644), "/nodir");

        let f = c.open(&p("/f"), create(), 0o640).unwrap();
        assert!(f.writable());
        assert_eq!(f.path(), &p("/f"));
        assert_eq!(f.stat().unwrap().mode, 0o640);
        f.write_at(b"data", 0).unwrap();

        // Plain open of an existing file, create without exclusive: same file, kept.
        let again = c.open(&p("/f"), create(), 0o600).unwrap();
        assert_eq!(again.stat().unwrap().size, 4);
        assert_eq!(again.stat().unwrap().object_id, f.stat().unwrap().object_id);

        let excl = OpenOptions { exclusive: true, ..create() };
        assert!(matches!(c.open(&p("/f"), excl, 0o644), Err(Error::AlreadyExists { path }) if path == "/f"));
        c.open(&p("/g"), excl, 0o644).unwrap();

        let read_only = c.open(&p("/f"), ro, 0).unwrap();
        assert!(!read_only.writable());
        match expect_err(read_only.write_at(b"x", 0)) {
            Error::AccessMode { path, .. } => assert_eq!(path, "/f"),
            e => panic!("{e:?}"),
        }
        assert!(matches!(read_only.truncate(0), Err(Error::AccessMode { .. })));
        read_only.sync().unwrap();

        let trunc = OpenOptions { truncate: true, write: true, ..OpenOptions::default() };
        assert_eq!(c.open(&p("/f"), trunc, 0).unwrap().stat().unwrap().size, 0);

        let bad_trunc = OpenOptions { truncate: true, ..OpenOptions::default() };
        assert!(matches!(c.open(&p("/f"), bad_trunc, 0), Err(Error::InvalidArgument(_))));
        let bad_excl = OpenOptions { exclusive: true, ..OpenOptions::default() };
        assert!(matches!(c.open(&p("/f"), bad_excl, 0), Err(Error::InvalidArgument(_))));

        // A read-only create makes the file.
        c.open(&p("/ro-created"), OpenOptions { create: true, ..OpenOptions::default() }, 0o644).unwrap();
        assert_eq!(c.stat(&p("/ro-created")).unwrap().size, 0);

        // The layout hints are accepted and ignored.
        let hinted = OpenOptions { layout: crate::Layout { chunk_bytes: 4096, object_class: 7 }, ..create() };
        c.open(&p("/hinted"), hinted, 0o644).unwrap();
    }

    #[test]
    fn open_of_a_directory_is_refused_in_every_mode() {
        let (_dir, _backend, c) = mounted();
        c.mkdir(&p("/d"), 0o755).unwrap();
        for options in [OpenOptions::default(), create(), OpenOptions { write: true, ..OpenOptions::default() }] {
            match expect_err(c.open(&p("/d"), options, 0o644)) {
                Error::IsADirectory { path } => assert_eq!(path, "/d"),
                e => panic!("{options:?}: {e:?}"),
            }
            assert!(matches!(c.open(&NsPath::root(), options, 0o644), Err(Error::IsADirectory { .. })));
        }
    }

    #[test]
    fn remove_cases() {
        let (_dir, _backend, c) = mounted();
        touch(&*c, "/f");
        c.remove(&p("/f"), false).unwrap();
        assert_not_found(c.stat(&p("/f")), "/f");
        assert_not_found(c.remove(&p("/f"), false), "/f");
        assert_not_found(c.remove(&p("/x/f"), true), "/x");

        c.mkdir(&p("/empty"), 0o755).unwrap();
        c.remove(&p("/empty"), false).unwrap();

        c.mkdir(&p("/d"), 0o755).unwrap();
        c.mkdir(&p("/d/sub"), 0o755).unwrap();
        write(&*c, "/d/sub/f", b"x");
        touch(&*c, "/d/g");
        match expect_err(c.remove(&p("/d"), false)) {
            Error::DirectoryNotEmpty { path } => assert_eq!(path, "/d"),
            e => panic!("{e:?}"),
        }
        c.stat(&p("/d/sub/f")).unwrap();
        c.remove(&p("/d"), true).unwrap();
        assert_not_found(c.stat(&p("/d")), "/d");
        // Recursive on a file is just a remove.
        touch(&*c, "/h");
        c.remove(&p("/h"), true).unwrap();

        assert!(matches!(c.remove(&NsPath::root(), true), Err(Error::InvalidArgument(_))));
        assert!(names(&*c, "/").is_empty());
    }

    #[test]
    fn recursive_remove_of_a_wide_and_deep_tree() {
        let (_dir, _backend, c) = mounted();
        let mut path = p("/top");
        c.mkdir(&path, 0o755).unwrap();
        for depth in 0..20 {
            for i in 0..5 {
                touch(&*c, &format!("{path}/f{i}"));
            }
            path = path.join(&format!("d{depth}")).unwrap();
            c.mkdir(&path, 0o755).unwrap();
        }
        c.remove(&p("/top"), true).unwrap();
        assert!(names(&*c, "/").is_empty());
    }

    #[test]
    fn replace_swaps_a_file_in_one_step_and_refuses_directories() {
        let (_dir, _backend, c) = mounted();
        write(&*c, "/old", b"old contents");
        write(&*c, "/.old.dpuio-put.x", b"new");
        c.replace(&p("/.old.dpuio-put.x"), &p("/old")).unwrap();
        assert_not_found(c.stat(&p("/.old.dpuio-put.x")), "/.old.dpuio-put.x");
        assert_eq!(c.stat(&p("/old")).unwrap().size, 3);
        // Onto a name that does not exist: an ordinary rename.
        c.replace(&p("/old"), &p("/fresh")).unwrap();
        assert_eq!(c.stat(&p("/fresh")).unwrap().size, 3);
        // Never a directory, either side; never itself or the root.
        c.mkdir(&p("/d"), 0o755).unwrap();
        assert!(matches!(c.replace(&p("/fresh"), &p("/d")), Err(Error::IsADirectory { path }) if path == "/d"));
        assert!(matches!(c.replace(&p("/d"), &p("/fresh")), Err(Error::IsADirectory { path }) if path == "/d"));
        assert!(matches!(c.replace(&p("/fresh"), &p("/fresh")), Err(Error::InvalidRename { .. })));
        assert!(matches!(c.replace(&p("/fresh"), &p("/")), Err(Error::InvalidRename { .. })));
        assert_not_found(c.replace(&p("/missing"), &p("/fresh")), "/missing");
        assert_eq!(c.stat(&p("/fresh")).unwrap().size, 3);
        assert_eq!(c.stat(&p("/d")).unwrap().kind, EntryKind::Directory);
        c.sync().unwrap();
    }

    #[test]
    fn rename_cases() {
        let (_dir, _backend, c) = mounted();
        write(&*c, "/f", b"content");
        c.rename(&p("/f"), &p("/g")).unwrap();
        assert_not_found(c.stat(&p("/f")), "/f");
        assert_eq!(c.stat(&p("/g")).unwrap().size, 7);

        // Into another directory, and a directory with its contents.
        c.mkdir(&p("/d"), 0o755).unwrap();
        c.rename(&p("/g"), &p("/d/g")).unwrap();
        c.rename(&p("/d"), &p("/e")).unwrap();
        assert_eq!(c.stat(&p("/e/g")).unwrap().size, 7);

        assert_not_found(c.rename(&p("/missing"), &p("/x")), "/missing");
        assert_not_found(c.rename(&p("/e/g"), &p("/nodir/g")), "/nodir");

        // Never replaces: file onto file, file onto directory, directory onto file.
        touch(&*c, "/other");
        c.mkdir(&p("/dir2"), 0o755).unwrap();
        for (from, to) in [("/e/g", "/other"), ("/e/g", "/dir2"), ("/dir2", "/other"), ("/e", "/dir2")] {
            match expect_err(c.rename(&p(from), &p(to))) {
                Error::AlreadyExists { path } => assert_eq!(path, to),
                e => panic!("{from} -> {to}: {e:?}"),
            }
        }
        assert_eq!(c.stat(&p("/other")).unwrap().size, 0);
        assert!(matches!(c.rename(&p("/e"), &p("/e")), Err(Error::AlreadyExists { .. })));

        // Into its own subtree, and the root.
        c.mkdir(&p("/e/sub"), 0o755).unwrap();
        for (from, to) in [("/e", "/e/sub/x"), ("/e", "/e/x"), ("/", "/x"), ("/e", "/")] {
            assert!(matches!(c.rename(&p(from), &p(to)), Err(Error::InvalidRename { .. })), "{from} -> {to}");
        }
        // A file "into itself" is a file used as a directory.
        assert!(matches!(c.rename(&p("/other"), &p("/other/x")), Err(Error::NotADirectory { .. })));
        // A sibling with a common prefix is not a subtree.
        c.rename(&p("/e"), &p("/e2")).unwrap();
        c.rename(&p("/e2"), &p("/e")).unwrap();
        assert_eq!(c.stat(&p("/e/g")).unwrap().size, 7);
    }

    #[test]
    fn truncate_by_path() {
        let (_dir, _backend, c) = mounted();
        write(&*c, "/f", b"0123456789");
        c.truncate(&p("/f"), 4).unwrap();
        assert_eq!(c.stat(&p("/f")).unwrap().size, 4);
        c.truncate(&p("/f"), 1 << 30).unwrap();
        assert_eq!(c.stat(&p("/f")).unwrap().size, 1 << 30);
        let mut buf = [9u8; 8];
        let f = c.open(&p("/f"), OpenOptions::default(), 0).unwrap();
        assert_eq!(f.read_at(&mut buf, 2).unwrap(), 8);
        assert_eq!(buf, [b'2', b'3', 0, 0, 0, 0, 0, 0]);

        c.mkdir(&p("/d"), 0o755).unwrap();
        assert!(matches!(c.truncate(&p("/d"), 0), Err(Error::IsADirectory { path }) if path == "/d"));
        assert!(matches!(c.truncate(&NsPath::root(), 0), Err(Error::IsADirectory { .. })));
        assert_not_found(c.truncate(&p("/missing"), 0), "/missing");
        assert!(matches!(c.truncate(&p("/f"), u64::MAX), Err(Error::InvalidArgument(_))));
        c.sync().unwrap();
    }

    #[test]
    fn readdir_orders_batches_and_resumes() {
        let (_dir, _backend, c) = mounted();
        for name in ["b", "a", "C", "é", "aa", "z"] {
            touch(&*c, &format!("/{name}"));
        }
        c.mkdir(&p("/dir"), 0o755).unwrap();
        assert_eq!(names(&*c, "/"), ["C", "a", "aa", "b", "dir", "z", "é"]);

        let (first, more) = rd(&*c, &NsPath::root(), None, 3).unwrap();
        assert!(more);
        assert_eq!(first.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["C", "a", "aa"]);
        let (second, more) = rd(&*c, &NsPath::root(), Some("aa"), 3).unwrap();
        assert!(more);
        assert_eq!(second.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["b", "dir", "z"]);
        let (last, more) = rd(&*c, &NsPath::root(), Some("z"), 3).unwrap();
        assert!(!more);
        assert_eq!(last.len(), 1);
        // Exactly filling the batch at the end is not "more".
        assert!(!rd(&*c, &NsPath::root(), Some("b"), 3).unwrap().1);
        // An anchor that no longer exists still resumes in order.
        let (after, _) = rd(&*c, &NsPath::root(), Some("ab"), 1).unwrap();
        assert_eq!(after[0].name, "b");
        assert_eq!(rd(&*c, &NsPath::root(), Some("é"), 3).unwrap(), (vec![], false));

        // Attributes come with the entries.
        let dir = second.iter().find(|e| e.name == "dir").unwrap();
        assert_eq!(dir.attr, c.stat(&p("/dir")).unwrap());
        assert_eq!(second[0].attr.kind, EntryKind::File);

        assert_eq!(rd(&*c, &p("/dir"), None, 10).unwrap(), (vec![], false));
        assert!(matches!(rd(&*c, &NsPath::root(), None, 0), Err(Error::InvalidArgument(_))));
        assert!(matches!(rd(&*c, &p("/a"), None, 10), Err(Error::NotADirectory { path }) if path == "/a"));
        assert_not_found(rd(&*c, &p("/missing"), None, 10), "/missing");
    }

    #[test]
    fn readdir_sees_changes_between_batches() {
        let (_dir, _backend, c) = mounted();
        for name in ["a", "c", "e"] {
            touch(&*c, &format!("/{name}"));
        }
        assert_eq!(rd(&*c, &NsPath::root(), None, 1).unwrap().0[0].name, "a");
        touch(&*c, "/d");
        c.remove(&p("/c"), false).unwrap();
        let (rest, more) = rd(&*c, &NsPath::root(), Some("a"), 10).unwrap();
        assert!(!more);
        assert_eq!(rest.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["d", "e"]);
        c.rename(&p("/e"), &p("/b")).unwrap();
        c.mkdir(&p("/f"), 0o755).unwrap();
        assert_eq!(names(&*c, "/"), ["a", "b", "d", "f"]);
    }

    #[test]
    fn readdir_of_20k_entries_in_batches_reads_the_directory_once() {
        let (dir, backend, c) = mounted_in_memory();
        c.mkdir(&p("/big"), 0o755).unwrap();
        // Made behind the container's back, for speed; the names are what matter.
        let host = dir.path().join("root/containers/c/big");
        for i in 0..20_000 {
            fs::File::create(host.join(format!("entry-{i:05}"))).unwrap();
        }
        let fills_before = fills(&backend);
        let started = Instant::now();
        let (mut anchor, mut seen, mut batches) = (None::<String>, 0, 0);
        loop {
            let (entries, more) = rd(&*c, &p("/big"), anchor.as_deref(), 1000).unwrap();
            assert_eq!(entries.len(), if more { 1000 } else { 20_000 - seen });
            for (k, entry) in entries.iter().enumerate() {
                assert_eq!(entry.name, format!("entry-{:05}", seen + k));
            }
            seen += entries.len();
            batches += 1;
            anchor = entries.last().map(|e| e.name.clone());
            if !more {
                break;
            }
        }
        assert_eq!((seen, batches), (20_000, 20));
        // The guard against O(n²): one scan for all twenty batches.
        assert_eq!(fills(&backend) - fills_before, 1);
        eprintln!("20 batches of 1000 in {:?}", started.elapsed());
    }

    #[test]
    fn listings_racing_with_creates_never_stay_stale() {
        let (_dir, _backend, c) = mounted_in_memory();
        c.mkdir(&p("/d"), 0o755).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..400 {
                    touch(&*c, &format!("/d/f{i:03}"));
                }
            });
            s.spawn(|| {
                for _ in 0..200 {
                    let listed = names(&*c, "/d");
                    assert!(listed.windows(2).all(|w| w[0] < w[1]), "sorted, no duplicates");
                }
            });
        });
        // Every create happened after some fill began; none may hide behind a cached
        // listing whose directory version did not visibly change.
        let listed = names(&*c, "/d");
        assert_eq!(listed, (0..400).map(|i| format!("f{i:03}")).collect::<Vec<_>>());
    }

    #[test]
    fn readdir_of_a_directory_too_large_to_cache_is_still_complete() {
        let options = super::super::LocalOptions { listing_cache_bytes: 64, ..Default::default() };
        let (dir, _backend, c) = mounted_with(options);
        for i in (0..50).rev() {
            touch(&*c, &format!("/n{i:02}"));
        }
        // Not listed: links and special files.
        symlink("/etc", dir.path().join("root/containers/c/n25x")).unwrap();
        let mut all = Vec::new();
        let mut anchor = None::<String>;
        loop {
            let (entries, more) = rd(&*c, &NsPath::root(), anchor.as_deref(), 7).unwrap();
            assert!(entries.len() == 7 || !more);
            all.extend(entries.into_iter().map(|e| e.name));
            anchor = all.last().cloned();
            if !more {
                break;
            }
        }
        assert_eq!(all, (0..50).map(|i| format!("n{i:02}")).collect::<Vec<_>>());
    }

    #[test]
    fn readdir_skips_what_it_cannot_serve() {
        let (dir, _backend, c) = mounted();
        touch(&*c, "/a");
        let host = dir.path().join("root/containers/c");
        symlink(dir.path(), host.join("link")).unwrap();
        assert_eq!(names(&*c, "/"), ["a"]);
    }

    #[test]
    fn paths_cannot_leave_the_container() {
        let (dir, backend, c) = mounted();
        // Escapes never parse.
        for escape in ["/a/../../etc", "/../c2", "..", "/./x"] {
            assert!(matches!(NsPath::parse(escape), Err(Error::InvalidPath { .. })), "{escape}");
        }
        // A neighbour container and a secret outside the root.
        let neighbour = backend.mount("neighbour", true).unwrap();
        write(&*neighbour, "/secret", b"neighbour data");
        fs::write(dir.path().join("outside"), b"host data").unwrap();

        // Links planted in the tree (by anyone but the agent) are refused, not followed.
        let host = dir.path().join("root/containers/c");
        symlink(dir.path(), host.join("up")).unwrap();
        symlink(dir.path().join("outside"), host.join("file-link")).unwrap();
        symlink("../neighbour", host.join("rel")).unwrap();
        for path in ["/up", "/up/outside", "/file-link", "/rel/secret", "/rel"] {
            let path = p(path);
            let refused = |r: Result<()>| match r {
                Err(Error::UnsupportedEntry { path: shown, reason }) => {
                    assert!(reason.contains("symbolic link"), "{reason}");
                    assert!(!shown.contains(dir.path().to_str().unwrap()), "host path leaked: {shown}");
                }
                other => panic!("{path}: {other:?}"),
            };
            refused(c.stat(&path).map(drop));
            refused(c.open(&path, OpenOptions::default(), 0).map(drop));
            refused(c.open(&path, create(), 0o644).map(drop));
            if path.components().count() > 1 {
                refused(c.mkdir(&path, 0o755).map(drop));
                refused(rd(&*c, &path, None, 10).map(drop));
                refused(c.truncate(&path, 0));
            }
        }
        // The error names the component that is a link, not the whole path.
        match expect_err(c.open(&p("/up/outside"), create(), 0o644)) {
            Error::UnsupportedEntry { path, .. } => assert_eq!(path, "/up"),
            e => panic!("{e:?}"),
        }
        // Removing a link removes the link only.
        c.remove(&p("/file-link"), false).unwrap();
        c.remove(&p("/up"), true).unwrap();
        assert_eq!(fs::read(dir.path().join("outside")).unwrap(), b"host data");
        // Recursive remove does not descend through a link either.
        c.mkdir(&p("/d"), 0o755).unwrap();
        symlink(dir.path(), host.join("d/up")).unwrap();
        c.remove(&p("/d"), true).unwrap();
        assert_eq!(fs::read(dir.path().join("outside")).unwrap(), b"host data");
        let mut buf = [0u8; 14];
        neighbour.open(&p("/secret"), OpenOptions::default(), 0).unwrap().read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"neighbour data");
    }

    #[test]
    fn errors_never_name_host_paths() {
        let (dir, _backend, c) = mounted();
        let host = dir.path().to_str().unwrap().to_owned();
        let errors = [
            expect_err(c.stat(&p("/nope"))),
            expect_err(c.mkdir(&p("/a/b"), 0o755)),
            expect_err(rd(&*c, &p("/x"), None, 1)),
            expect_err(c.rename(&p("/x"), &p("/y"))),
        ];
        for e in errors {
            assert!(!e.to_string().contains(&host), "{e}");
        }
    }

    #[test]
    fn invalid_names_never_reach_the_container() {
        let (_dir, _backend, c) = mounted();
        let long = "n".repeat(MAX_NAME_BYTES + 1);
        for bad in ["", ".", "..", "a/b", "a\0b", long.as_str()] {
            assert!(matches!(NsPath::root().join(bad), Err(Error::InvalidPath { .. })), "{bad:?}");
        }
        // The longest valid name works end to end.
        let longest = NsPath::root().join(&"n".repeat(MAX_NAME_BYTES)).unwrap();
        c.mkdir(&longest, 0o755).unwrap();
        c.stat(&longest).unwrap();
    }

    #[test]
    fn sync_flushes_what_changed() {
        let (_dir, _backend, c) = mounted();
        c.mkdir(&p("/a"), 0o755).unwrap();
        c.mkdir(&p("/a/b"), 0o755).unwrap();
        write(&*c, "/a/b/f", b"data");
        c.rename(&p("/a"), &p("/z")).unwrap();
        c.truncate(&p("/z/b/f"), 2).unwrap();
        touch(&*c, "/gone");
        c.remove(&p("/gone"), false).unwrap();
        c.sync().unwrap();
        c.sync().unwrap();
    }

    #[test]
    fn sync_after_overflow_flushes_everything() {
        let options = super::super::LocalOptions { max_dirty_dirs: 2, max_dirty_files: 1, ..Default::default() };
        let (_dir, _backend, c) = mounted_with(options);
        for i in 0..5 {
            c.mkdir(&p(&format!("/d{i}")), 0o755).unwrap();
            write(&*c, &format!("/d{i}/f"), b"x");
        }
        c.sync().unwrap();
        c.sync().unwrap();
    }
}
