//! An open file of the local backend: positioned I/O with `pread`/`pwrite`.
//!
//! Positioned calls share no file offset, so one object serves concurrent reads and
//! writes from many data-plane threads without a lock.

use std::fs::File;
use std::io::ErrorKind;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use super::dirty::{SyncState, UNREGISTERED};
use super::fsops::{self, MAX_FILE_BYTES, io_error};
use crate::{Attr, Error, HostBytes, HostBytesMut, NsPath, Object, Result};

#[derive(Debug)]
pub(super) struct LocalObject {
    path: NsPath,
    /// Shared with the container's dirty set, which may keep it open past this object
    /// until the next container sync.
    file: Arc<File>,
    writable: bool,
    /// The directory this open created the file in, until a sync has made the new
    /// entry durable. A descriptor, not a path: the file may be renamed meanwhile.
    created_in: Mutex<Option<OwnedFd>>,
    dirty: Arc<SyncState>,
    /// The sync epoch this object last registered its file in (see `dirty`).
    registered: AtomicU64,
}

impl LocalObject {
    pub(super) fn new(
        path: NsPath,
        file: File,
        writable: bool,
        created_in: Option<OwnedFd>,
        dirty: Arc<SyncState>,
    ) -> LocalObject {
        LocalObject {
            path,
            file: Arc::new(file),
            writable,
            created_in: Mutex::new(created_in),
            dirty,
            registered: AtomicU64::new(UNREGISTERED),
        }
    }

    /// The file's data changed: the next container sync must fsync it.
    pub(super) fn note_write(&self) {
        self.dirty.mark_written(&self.path, &self.file, &self.registered);
    }

    fn check_writable(&self, what: &str) -> Result<()> {
        if self.writable {
            return Ok(());
        }
        Err(Error::AccessMode {
            path: self.path.to_string(),
            reason: format!("{what} needs an object opened for writing; this one is read-only"),
        })
    }

    /// `offset..offset + len` must end within the largest file size.
    fn check_range(&self, offset: u64, len: usize) -> Result<()> {
        let end = offset.checked_add(len as u64);
        if end.is_some_and(|end| end <= MAX_FILE_BYTES) {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "{}: {len} bytes at offset {offset} end past the largest file size ({MAX_FILE_BYTES})",
            self.path
        )))
    }

    fn io(&self, op: &str, source: std::io::Error) -> Error {
        Error::Io { context: format!("{}: {op}", self.path), source }
    }
}

impl Object for LocalObject {
    fn path(&self) -> &NsPath {
        &self.path
    }

    fn writable(&self) -> bool {
        self.writable
    }

    /// `pread` straight into the view: on the data plane, from the page cache into the
    /// host's mapped region, the one copy of a mapped read.
    fn read_into(&self, mut buf: HostBytesMut<'_>, offset: u64) -> Result<usize> {
        self.check_range(offset, buf.len())?;
        // pread may return less than asked before the end of the file (signals, large
        // requests); the contract is "short only at end of file", so loop.
        let mut done = 0;
        while done < buf.len() {
            match buf.slice_mut(done..).pread(&*self.file, offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io("read", e)),
            }
        }
        Ok(done)
    }

    /// `pwrite` straight from the view: the kernel reads each byte once.
    fn write_from(&self, buf: HostBytes<'_>, offset: u64) -> Result<()> {
        self.check_writable("write")?;
        self.check_range(offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let mut done = 0;
        while done < buf.len() {
            match buf.slice(done..).pwrite(&*self.file, offset + done as u64) {
                Ok(0) => return Err(self.io("write", ErrorKind::WriteZero.into())),
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io("write", e)),
            }
        }
        self.note_write();
        Ok(())
    }

    fn stat(&self) -> Result<Attr> {
        fsops::attr(&fsops::stat_fd(&*self.file, self.path.as_str())?, self.path.as_str())
    }

    fn truncate(&self, size: u64) -> Result<()> {
        self.check_writable("truncate")?;
        self.check_range(size, 0)?;
        self.file.set_len(size).map_err(|e| self.io("truncate", e))?;
        self.note_write();
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        self.file.sync_all().map_err(|e| self.io("fsync", e))?;
        let mut created_in = self.created_in.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(dir) = created_in.as_ref() {
            rustix::fs::fsync(dir).map_err(|e| io_error(self.path.as_str(), "fsync directory", e))?;
            // Durable now; later syncs need only the data.
            *created_in = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::super::tests::{mounted, p};
    use crate::{Container, OpenOptions};

    use super::*;

    fn open_new(c: &dyn Container, path: &str) -> Arc<dyn Object> {
        c.open(&p(path), OpenOptions { create: true, write: true, ..Default::default() }, 0o644).unwrap()
    }

    #[test]
    fn views_read_and_write_like_slices() {
        let (_dir, _backend, c) = mounted();
        let f = open_new(&*c, "/v");
        f.write_from(HostBytes::from(&b"0123456789"[..]).slice(2..8), 1).unwrap();
        let mut buf = [b'.'; 10];
        let mut view = HostBytesMut::from(&mut buf[..]);
        assert_eq!(f.read_into(view.slice_mut(3..9), 2).unwrap(), 5, "short at the end of the file");
        assert_eq!(f.read_into(view.slice_mut(..0), 0).unwrap(), 0);
        assert_eq!(&buf, b"...34567..");
        let read_only = c.open(&p("/v"), OpenOptions::default(), 0).unwrap();
        assert!(matches!(read_only.write_from(HostBytes::from(&b"x"[..]), 0), Err(Error::AccessMode { .. })));
        let mut one = [0u8];
        let past = f.read_into(HostBytesMut::from(&mut one[..]), MAX_FILE_BYTES);
        assert!(matches!(past, Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn write_then_read_at_offsets() {
        let (_dir, _backend, c) = mounted();
        let f = open_new(&*c, "/f");
        f.write_at(b"hello world", 0).unwrap();
        f.write_at(b"W", 6).unwrap();
        let mut buf = [0u8; 11];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 11);
        assert_eq!(&buf, b"hello World");
        let mut mid = [0u8; 3];
        assert_eq!(f.read_at(&mut mid, 4).unwrap(), 3);
        assert_eq!(&mid, b"o W");
        // Empty reads and writes are fine anywhere.
        assert_eq!(f.read_at(&mut [], 100).unwrap(), 0);
        f.write_at(&[], 1 << 40).unwrap();
        assert_eq!(f.stat().unwrap().size, 11);
    }

    #[test]
    fn reads_are_short_only_at_end_of_file() {
        let (_dir, _backend, c) = mounted();
        let f = open_new(&*c, "/f");
        f.write_at(b"0123456789", 0).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(f.read_at(&mut buf, 6).unwrap(), 4);
        assert_eq!(&buf[..4], b"6789");
        assert_eq!(f.read_at(&mut buf, 10).unwrap(), 0);
        assert_eq!(f.read_at(&mut buf, 1 << 50).unwrap(), 0);
        // A large read comes back whole.
        let big = vec![7u8; 3 << 20];
        f.write_at(&big, 0).unwrap();
        let mut back = vec![0u8; 3 << 20];
        assert_eq!(f.read_at(&mut back, 0).unwrap(), big.len());
        assert!(back == big);
    }

    #[test]
    fn sparse_writes_read_back_zeros() {
        let (_dir, _backend, c) = mounted();
        let f = open_new(&*c, "/sparse");
        let far = (1u64 << 32) + 5; // past 4 GiB: only a sparse file fits in a test
        f.write_at(b"end", far).unwrap();
        assert_eq!(f.stat().unwrap().size, far + 3);
        let mut hole = [1u8; 16];
        assert_eq!(f.read_at(&mut hole, 1 << 20).unwrap(), 16);
        assert_eq!(hole, [0u8; 16]);
        let mut tail = [0u8; 8];
        assert_eq!(f.read_at(&mut tail, far - 2).unwrap(), 5);
        assert_eq!(&tail[..5], b"\0\0end");
    }

    #[test]
    fn offsets_past_the_largest_file_are_invalid() {
        let (_dir, _backend, c) = mounted();
        let f = open_new(&*c, "/f");
        let mut buf = [0u8; 2];
        for offset in [u64::MAX, MAX_FILE_BYTES, MAX_FILE_BYTES - 1] {
            assert!(matches!(f.write_at(b"xy", offset), Err(Error::InvalidArgument(_))), "{offset}");
            assert!(matches!(f.read_at(&mut buf, offset), Err(Error::InvalidArgument(_))), "{offset}");
        }
        assert!(matches!(f.truncate(u64::MAX), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn truncate_grows_and_shrinks() {
        let (_dir, _backend, c) = mounted();
        let f = open_new(&*c, "/f");
        f.write_at(b"0123456789", 0).unwrap();
        f.truncate(4).unwrap();
        assert_eq!(f.stat().unwrap().size, 4);
        let mut buf = [9u8; 8];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 4);
        f.truncate(8).unwrap();
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 8);
        assert_eq!(&buf, b"0123\0\0\0\0");
        f.truncate(0).unwrap();
        assert_eq!(f.stat().unwrap().size, 0);
    }

    #[test]
    fn stat_follows_the_file_not_the_name() {
        let (_dir, _backend, c) = mounted();
        let f = open_new(&*c, "/f");
        let id = f.stat().unwrap().object_id;
        assert_eq!(c.stat(&p("/f")).unwrap().object_id, id);
        c.rename(&p("/f"), &p("/g")).unwrap();
        f.write_at(b"abc", 0).unwrap();
        assert_eq!(c.stat(&p("/g")).unwrap().size, 3);
        assert_eq!(f.path(), &p("/f")); // the name it was opened by
        f.sync().unwrap();
        c.sync().unwrap();
    }

    #[test]
    fn sync_of_created_and_existing_files() {
        let (_dir, _backend, c) = mounted();
        let created = open_new(&*c, "/new");
        created.write_at(b"x", 0).unwrap();
        created.sync().unwrap();
        created.sync().unwrap();
        let existing = c.open(&p("/new"), OpenOptions { write: true, ..Default::default() }, 0).unwrap();
        existing.write_at(b"y", 1).unwrap();
        existing.sync().unwrap();
        // Dropped without sync: the container's sync still has the descriptor.
        drop(existing);
        c.sync().unwrap();
    }

    #[test]
    fn concurrent_positioned_writes_do_not_interfere() {
        let (_dir, _backend, c) = mounted();
        let f = open_new(&*c, "/f");
        thread::scope(|s| {
            for t in 0..4u8 {
                let f = &f;
                s.spawn(move || {
                    for i in 0..64u64 {
                        f.write_at(&[t; 16], (i * 4 + u64::from(t)) * 16).unwrap();
                    }
                });
            }
        });
        let mut buf = vec![0u8; 64 * 4 * 16];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), buf.len());
        for (block, chunk) in buf.chunks(16).enumerate() {
            assert!(chunk.iter().all(|&b| usize::from(b) == block % 4), "block {block}");
        }
    }
}
