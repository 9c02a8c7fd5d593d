//! Host memory a tenant's worker reads into and writes from itself.
//!
//! Where the agent has a host's region mapped (UCX shared memory, `ucp_rkey_ptr`), its
//! in-process DAOS path reads straight into that mapping. A worker's pieces went through
//! a staging slot instead, then a copy between the slot and the host's memory: one copy
//! per byte that the in-process path does not make, on the DPU's few cores. Here the data
//! plane lends each mapped region to the workers for as long as it is registered
//! ([`lend`], kept alive by the [`Lent`] it returns): the agent opens the file behind the
//! mapping (`/proc/self/map_files`, which needs `CAP_SYS_ADMIN` or
//! `CAP_CHECKPOINT_RESTORE`, as an agent that starts workers as other users has) and hands
//! the worker a descriptor of it; the worker maps the same bytes, and a piece whose bytes
//! lie in a lent region names the region and the offset in it instead of a slot.
//!
//! A worker maps a region once, on the first piece in it, and answers whether it could;
//! when the region's [`Lent`] drops (the host deregistered it, or its session ended,
//! after the I/O on it finished), every worker that mapped it is told to unmap it.
//! Regions that cannot be lent (not a shared file mapping, no privilege) and workers that
//! cannot map one keep the staging path, said once in the log.
//!
//! A worker holds only regions of its own tenant's sessions: the pieces that name a
//! region are that tenant's requests.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::lock;

/// Whether any tenant has a worker: only then does the data plane lend its regions.
static WANTED: AtomicBool = AtomicBool::new(false);
/// Said once: why regions are not lent.
static REFUSED_SAID: AtomicBool = AtomicBool::new(false);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// The lent regions by their mapping's first address in the agent and their id (two
/// regions may lie in one mapping).
static LENT: Mutex<BTreeMap<(usize, u64), Arc<HostFile>>> = Mutex::new(BTreeMap::new());

/// A tenant has a worker from now on: mapped regions registered after this are lent.
pub(crate) fn wanted() {
    WANTED.store(true, Ordering::Relaxed);
}

/// A worker process that mapped lent regions: told when one is given back.
pub(crate) trait Holder: Send + Sync {
    /// Region `id` was given back: the worker is to unmap it.
    fn forget_host(&self, id: u64);
}

/// One lent region: the whole mapping (one `/proc/self/maps` line) that holds it.
pub(crate) struct HostFile {
    pub(crate) id: u64,
    /// The mapping's first address and length in the agent, and its offset in the file.
    start: usize,
    pub(crate) len: usize,
    pub(crate) file_offset: u64,
    file: OwnedFd,
    /// The workers that mapped it, told to unmap it when it is given back.
    holders: Mutex<Vec<Weak<dyn Holder>>>,
}

impl HostFile {
    /// The file, to hand to a worker.
    pub(crate) fn file(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// `holder` mapped it.
    pub(crate) fn held_by(&self, holder: Weak<dyn Holder>) {
        lock(&self.holders).push(holder);
    }
}

/// A region lent to the workers while this lives (see the module's text).
pub struct Lent(Arc<HostFile>);

/// Where a mapped region lies: the shared mapping of one object that holds it (as the
/// transport found it when it mapped the region), contiguous in memory and in the object.
#[derive(Debug, Clone, Copy)]
pub struct Mapping<'a> {
    /// The mapping's first address and end in this process.
    pub start: usize,
    pub end: usize,
    /// The offset of `start` in the object.
    pub object_offset: u64,
    /// The `/proc/self/map_files` entry that opens the object.
    pub map_file: &'a str,
}

/// Lend the mapped region `[ptr, ptr + len)`, which lies in `mapping`, to the workers,
/// if any tenant has one and the mapping's object can be opened; `None` otherwise (why,
/// the first time, in the log).
pub fn lend(ptr: *const u8, len: usize, mapping: Mapping<'_>) -> Option<Lent> {
    if !WANTED.load(Ordering::Relaxed) || len == 0 {
        return None;
    }
    match open_mapping(ptr as usize, len, mapping) {
        Ok(file) => {
            let file = Arc::new(file);
            lock(&LENT).insert((file.start, file.id), file.clone());
            Some(Lent(file))
        }
        Err(e) => {
            if !REFUSED_SAID.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e,
                    "host regions are not lent to tenant workers: their pieces go through staging, one copy more");
            }
            None
        }
    }
}

/// The object behind `mapping`, opened through its `/proc/self/map_files` entry, to lend
/// `[addr, addr + len)`.
fn open_mapping(addr: usize, len: usize, mapping: Mapping<'_>) -> io::Result<HostFile> {
    let inside = mapping.start <= addr && addr.checked_add(len).is_some_and(|end| end <= mapping.end);
    if !inside {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{addr:#x}+{len} is not inside the mapping {:#x}-{:#x}", mapping.start, mapping.end),
        ));
    }
    let path = mapping.map_file;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("opening {path}: {e}")))?;
    Ok(HostFile {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        start: mapping.start,
        len: mapping.end - mapping.start,
        file_offset: mapping.object_offset,
        file: file.into(),
        holders: Mutex::new(Vec::new()),
    })
}

impl Drop for Lent {
    fn drop(&mut self) {
        lock(&LENT).remove(&(self.0.start, self.0.id));
        for holder in lock(&self.0.holders).drain(..) {
            if let Some(process) = holder.upgrade() {
                process.forget_host(self.0.id);
            }
        }
    }
}

/// The lent region holding `[ptr, ptr + len)`, and the offset of `ptr` in it.
pub(crate) fn find(ptr: *const u8, len: usize) -> Option<(Arc<HostFile>, u64)> {
    let addr = ptr as usize;
    let end = addr.checked_add(len)?;
    // Mappings do not overlap: only the last to start at or before addr can hold it.
    let lent = lock(&LENT);
    let (_, file) = lent.range(..=(addr, u64::MAX)).next_back()?;
    (end <= file.start + file.len).then(|| (file.clone(), (addr - file.start) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memfd_mapping_is_lent_found_and_given_back() {
        wanted();
        let fd = rustix::fs::memfd_create("dpuio-test-host", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 4 << 20).unwrap();
        let ours = crate::staging::MappedFile::map(fd.as_fd(), 0, 4 << 20).unwrap();
        let mut view = ours.bytes_mut(4096, 8, 4 << 20, "test").unwrap();
        let ptr = view.as_ptr();
        let start = ptr as usize - 4096;
        let map_file = format!("/proc/self/map_files/{start:x}-{:x}", start + (4 << 20));
        let mapping = Mapping { start, end: start + (4 << 20), object_offset: 0, map_file: &map_file };
        let outside = Mapping { start: start + 8192, ..mapping };
        assert!(lend(ptr, 8, outside).is_none(), "a region outside the mapping named");
        let Some(lent) = lend(ptr, 8, mapping) else {
            eprintln!("skipped: /proc/self/map_files cannot be opened here (needs CAP_SYS_ADMIN)");
            return;
        };
        let (file, offset) = find(ptr, 8).expect("found while lent");
        assert_eq!(offset, 4096);
        // The worker's side: the same bytes through the descriptor lent.
        let theirs = crate::staging::MappedFile::map(file.file(), file.file_offset, file.len).unwrap();
        view.copy_from_slice(b"dpuio-ok");
        assert_eq!(theirs.bytes(offset, 8, file.len, "test").unwrap().to_vec(), b"dpuio-ok");
        assert!(find(ptr, 5 << 20).is_none(), "longer than the region");
        drop(lent);
        assert!(find(ptr, 8).is_none(), "given back");
    }
}
