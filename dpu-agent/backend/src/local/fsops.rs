//! The system calls of the local backend, every one relative to a directory descriptor.
//!
//! A lookup starts at the container's root descriptor and opens one component at a
//! time with `O_DIRECTORY | O_NOFOLLOW`; the last component is then used through an
//! `*at` call that does not follow links either. So a symbolic link anywhere in a path
//! is refused, never followed, and no path can lead outside the container: names
//! cannot contain `/` or be `..` ([`NsPath`] guarantees it) and each step stays on a
//! descriptor already inside. Because every step holds a descriptor, a link or rename
//! appearing while the agent walks cannot redirect it (no check-then-use window, which
//! a `symlink_metadata` check of a path would have). Bind mounts placed inside a
//! container by an administrator are crossed like directories; that is the one way out
//! this does not close.
//!
//! Host paths never appear here, so no error can carry one: every message names the
//! container-relative path, passed in as `shown`.
//!
//! Cost: one `openat` per component per operation, like the lookup walk of DFS.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use super::listing::DirVersion;
use crate::{Attr, EntryKind, Error, NsPath, Result};

/// Largest file size and end of any I/O range: `off_t` is signed.
pub(super) const MAX_FILE_BYTES: u64 = i64::MAX as u64;

/// How a directory on the walk is opened. `O_RDONLY` rather than `O_PATH`, because the
/// same descriptor is read (`readdir`) and fsynced, which `O_PATH` cannot.
pub(super) fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Open the directory that `path` names.
pub(super) fn open_dir(root: &OwnedFd, path: &NsPath) -> Result<OwnedFd> {
    let mut dir = rustix::fs::openat(root, c".", dir_flags(), Mode::empty())
        .map_err(|e| io_error(path.as_str(), "open directory", e))?;
    // `end` marks how much of the normalised text the walk has covered, so an error
    // names the component that failed, not the whole path.
    let mut end = 0;
    for name in path.components() {
        end += 1 + name.len();
        let shown = &path.as_str()[..end];
        dir =
            rustix::fs::openat(&dir, name, dir_flags(), Mode::empty()).map_err(|e| walk_error(&dir, name, shown, e))?;
    }
    Ok(dir)
}

/// Why opening directory `name` in `parent` failed with `e`.
fn walk_error(parent: &OwnedFd, name: &str, shown: &str, e: Errno) -> Error {
    match e {
        Errno::NOENT => Error::NotFound { path: shown.to_owned() },
        // O_NOFOLLOW on a link gives ELOOP and O_DIRECTORY on anything else ENOTDIR;
        // look at the entry to say which it was.
        Errno::NOTDIR | Errno::LOOP => match stat_at(parent, name, shown) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => unsupported(shown, FileType::Symlink),
            _ => Error::NotADirectory { path: shown.to_owned() },
        },
        e => io_error(shown, "open directory", e),
    }
}

/// `lstat` of `name` in `dir`; a missing entry is [`Error::NotFound`].
pub(super) fn stat_at(dir: &OwnedFd, name: &str, shown: &str) -> Result<Stat> {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| match e {
        Errno::NOENT => Error::NotFound { path: shown.to_owned() },
        e => io_error(shown, "stat", e),
    })
}

/// `fstat`.
pub(super) fn stat_fd(fd: impl AsFd, shown: &str) -> Result<Stat> {
    rustix::fs::fstat(fd).map_err(|e| io_error(shown, "stat", e))
}

pub(super) fn file_type(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// The attributes of a file or directory; anything else is refused.
#[allow(clippy::unnecessary_cast, reason = "`Stat` field widths differ between architectures")]
pub(super) fn attr(st: &Stat, shown: &str) -> Result<Attr> {
    let kind = match file_type(st) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Directory,
        other => return Err(unsupported(shown, other)),
    };
    Ok(Attr {
        kind,
        size: if kind == EntryKind::File { st.st_size as u64 } else { 0 },
        mode: (st.st_mode as u32) & 0o7777,
        mtime_ns: (st.st_mtime as i64).saturating_mul(1_000_000_000).saturating_add(st.st_mtime_nsec as i64),
        object_id: st.st_ino as u64,
    })
}

/// What identifies this state of a directory, for the listing cache.
#[allow(clippy::unnecessary_cast, reason = "`Stat` field widths differ between architectures")]
pub(super) fn dir_version(st: &Stat) -> DirVersion {
    let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
    DirVersion {
        dev: st.st_dev as u64,
        ino: st.st_ino as u64,
        mtime_ns: ns(st.st_mtime as i64, st.st_mtime_nsec as i64),
        ctime_ns: ns(st.st_ctime as i64, st.st_ctime_nsec as i64),
        size_bytes: st.st_size as u64,
    }
}

/// The error for an entry the backend does not serve.
pub(super) fn unsupported(shown: &str, kind: FileType) -> Error {
    let what = match kind {
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        _ => "of an unknown type",
    };
    Error::UnsupportedEntry {
        path: shown.to_owned(),
        reason: format!(
            "is {what}, not a file or directory; the local backend never follows links or \
             serves special files (something other than the agent put it there)"
        ),
    }
}

/// A failure of the storage underneath, named by container path and operation.
pub(super) fn io_error(shown: &str, op: &str, e: Errno) -> Error {
    Error::Io { context: format!("{shown}: {op}"), source: e.into() }
}

/// Call `f` with each name in `dir` that can be a container entry (UTF-8, not `.` or
/// `..`), in the file system's order. Stops early if `f` returns false.
pub(super) fn for_each_name(dir: &OwnedFd, shown: &str, mut f: impl FnMut(&str) -> bool) -> Result<()> {
    // `read_from` opens its own descriptor of the directory, so each scan starts at the
    // beginning whatever scans came before on `dir`.
    let entries = Dir::read_from(dir).map_err(|e| io_error(shown, "read directory", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_error(shown, "read directory", e))?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        // The agent only makes UTF-8 names; others cannot be addressed by an NsPath,
        // so they are not listed.
        if let Ok(name) = name.to_str() {
            if !f(name) {
                break;
            }
        }
    }
    Ok(())
}

/// Remove directory `name` in `parent` and everything below it. Links inside are
/// removed, never followed. Entries that vanish meanwhile are no error; the directory
/// itself vanishing is [`Error::NotFound`].
pub(super) fn remove_tree<N>(parent: BorrowedFd<'_>, name: N, shown: &str) -> Result<()>
where
    N: rustix::path::Arg + Copy,
{
    let fd = rustix::fs::openat(parent, name, dir_flags(), Mode::empty()).map_err(|e| match e {
        Errno::NOENT => Error::NotFound { path: shown.to_owned() },
        e => io_error(shown, "open directory", e),
    })?;
    let mut dir = Dir::new(fd).map_err(|e| io_error(shown, "read directory", e))?;
    // Entries are unlinked while the directory is read, as `rm -r` does; a rescan
    // mops up any entry that appeared meanwhile (a concurrent create).
    const PASSES: usize = 3;
    let mut pass = 1;
    loop {
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(|e| io_error(shown, "read directory", e))?;
            let child = entry.file_name();
            if child == c"." || child == c".." {
                continue;
            }
            let child_shown = format!("{shown}/{}", child.to_string_lossy());
            let here = dir.fd().map_err(|e| io_error(shown, "read directory", e))?;
            let is_dir = match entry.file_type() {
                FileType::Directory => true,
                FileType::Unknown => match rustix::fs::statat(here, child, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => file_type(&st) == FileType::Directory,
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(io_error(&child_shown, "stat", e)),
                },
                _ => false,
            };
            if is_dir {
                match remove_tree(here, child, &child_shown) {
                    Ok(()) | Err(Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            } else {
                match rustix::fs::unlinkat(here, child, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => return Err(io_error(&child_shown, "remove", e)),
                }
            }
        }
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) => return Ok(()),
            Err(Errno::NOTEMPTY | Errno::EXIST) if pass < PASSES => {
                pass += 1;
                dir.rewind();
            }
            Err(Errno::NOTEMPTY | Errno::EXIST) => {
                return Err(Error::DirectoryNotEmpty { path: shown.to_owned() });
            }
            Err(e) => return Err(io_error(shown, "remove directory", e)),
        }
    }
}
