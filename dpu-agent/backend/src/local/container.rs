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
use crate::{
    Attr, Container, DirEntry, Error, INTO_OWN_SUBTREE, NsPath, Object, OpenOptions, Result, check_rename,
    check_replace, invalid_rename,
};

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
        check_rename(from, to)?;
        let (from_dir, from_parent, from_name) = self.parent_of(from)?;
        let is_dir = file_type(&stat_at(&from_dir, from_name, from.as_str())?) == FileType::Directory;
        if to == from {
            return Err(Error::AlreadyExists { path: to.to_string() });
        }
        if to.starts_with(from) {
            return Err(if is_dir {
                invalid_rename(from, to, INTO_OWN_SUBTREE)
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
            Errno::INVAL => invalid_rename(from, to, INTO_OWN_SUBTREE),
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
        check_replace(from, to)?;
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
mod tests;
