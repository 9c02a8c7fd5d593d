//! The staging memory a worker reads into and writes from: one `memfd` that the agent
//! makes and both processes map shared, cut into slots of a chunk each.
//!
//! A DPU's agent stages payload in its own memory anyway (DAOS reads land there before
//! they are put to the host); a worker process only moves where that memory lives.
//! Slots are lent to one call at a time and come back when the call's reply is in;
//! [`Staging::take`] waits while all are lent, so the memory is bounded.
//!
//! After the slots, one page holds the worker's DAOS retry counters, which the worker
//! publishes there and the agent reads for its metrics without a call (a worker stuck in
//! DAOS still has them read), and the worker's beat, which tells a waiting call that the
//! worker still runs.

use std::sync::atomic::{AtomicU64, Ordering};

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex};

use host_bytes::{HostBytes, HostBytesMut};

/// Bytes at the end of the memfd for the worker's counters.
const COUNTERS_BYTES: usize = 4096;

/// The worker's DAOS retry counters, in the order of [`dpuio_daos::RetryStats`]'s fields,
/// then [`BEATS`].
const COUNTERS: usize = 7;

/// The counter the worker's counters thread bumps each time it publishes: its beat.
const BEATS: usize = 6;

/// A shared, read-write mapping of `len` bytes of a file from `offset`: the staging
/// memfd here, a host region's file in a worker ([`crate::host`]).
pub(crate) struct MappedFile {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access goes through HostBytes
// views, which make no aliasing promises (the other process may write it too).
unsafe impl Send for MappedFile {}
// SAFETY: as above.
unsafe impl Sync for MappedFile {}

impl MappedFile {
    /// Map `len` bytes of `fd` from `offset` (a multiple of the page size).
    pub(crate) fn map(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<MappedFile> {
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("file offset {offset} is too large")))?;
        // SAFETY: a fresh shared mapping of a file we hold; nothing else in this
        // process refers to the address range it returns.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))?;
        Ok(MappedFile { ptr, len })
    }

    /// The address of byte `offset`, when `offset + len` is within `limit` bytes (at most
    /// the mapping's); `what` names the memory in the error.
    fn at(&self, offset: u64, len: u64, limit: usize, what: &str) -> io::Result<*mut u8> {
        match offset.checked_add(len) {
            // SAFETY: inside the mapping (limit <= self.len).
            Some(end) if end <= limit.min(self.len) as u64 => Ok(unsafe { self.ptr.as_ptr().add(offset as usize) }),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what} range {offset}+{len} is outside the {} bytes of {what} memory", limit.min(self.len)),
            )),
        }
    }

    /// `len` bytes at `offset` of the first `limit`, to read from.
    pub(crate) fn bytes(&self, offset: u64, len: u64, limit: usize, what: &str) -> io::Result<HostBytes<'_>> {
        let at = self.at(offset, len, limit, what)?;
        // SAFETY: the range is inside the mapping (checked), which lives as long as
        // the borrow of self.
        Ok(unsafe { HostBytes::from_raw_parts(at, len as usize) })
    }

    /// `len` bytes at `offset` of the first `limit`, to write into.
    pub(crate) fn bytes_mut(&self, offset: u64, len: u64, limit: usize, what: &str) -> io::Result<HostBytesMut<'_>> {
        let at = self.at(offset, len, limit, what)?;
        // SAFETY: as in bytes; HostBytesMut promises no exclusive access, which is
        // what shared memory another process also writes needs.
        Ok(unsafe { HostBytesMut::from_raw_parts(at, len as usize) })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // SAFETY: the range was mapped in `map` and no view outlives self.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A shared mapping of the staging memfd.
pub struct Mapping {
    fd: OwnedFd,
    /// The slots, then the counters page.
    file: MappedFile,
}

impl Mapping {
    /// A new memfd of `len` bytes of slots and the counters page, mapped.
    pub fn create(name: &str, len: usize) -> io::Result<Mapping> {
        let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&fd, (len + COUNTERS_BYTES) as u64)?;
        Mapping::map(fd)
    }

    /// Map a memfd made by [`Mapping::create`] (in the other process), all of it.
    pub fn map(fd: OwnedFd) -> io::Result<Mapping> {
        let len = rustix::fs::fstat(&fd)?.st_size as usize;
        if len <= COUNTERS_BYTES || len % COUNTERS_BYTES != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the staging memfd has {len} bytes: not slots and a counters page"),
            ));
        }
        let file = MappedFile::map(fd.as_fd(), 0, len)?;
        Ok(Mapping { fd, file })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Bytes of slots (the counters page is not one).
    fn slots_len(&self) -> usize {
        self.file.len() - COUNTERS_BYTES
    }

    /// Counter `i` of the counters page.
    fn counter(&self, i: usize) -> &AtomicU64 {
        assert!(i < COUNTERS);
        // SAFETY: the counters page lies inside the mapping (checked in `map`), is
        // page-aligned (so every word is 8-aligned), and is only ever accessed through
        // atomics, by this process and the other; the borrow ends before self drops.
        unsafe { AtomicU64::from_ptr(self.file.ptr.as_ptr().add(self.slots_len()).cast::<u64>().add(i)) }
    }

    /// Publish the worker's counters (the worker's side).
    pub fn publish(&self, stats: &dpuio_daos::RetryStats) {
        let words =
            [stats.retried_calls, stats.retries, stats.recovered, stats.gave_up, stats.unanswered, stats.refused];
        for (i, w) in words.into_iter().enumerate() {
            self.counter(i).store(w, Ordering::Relaxed);
        }
    }

    /// The counters the worker last published (the agent's side; as the worker wrote
    /// them: for metrics only).
    pub fn published(&self) -> dpuio_daos::RetryStats {
        let w = |i| self.counter(i).load(Ordering::Relaxed);
        dpuio_daos::RetryStats {
            retried_calls: w(0),
            retries: w(1),
            recovered: w(2),
            gave_up: w(3),
            unanswered: w(4),
            refused: w(5),
        }
    }

    /// A sign of life (the worker's side, from a thread no DAOS call holds up).
    pub fn beat(&self) {
        self.counter(BEATS).fetch_add(1, Ordering::Relaxed);
    }

    /// The worker's beats so far (the agent's side): a count that stops moving says the
    /// worker stopped as a whole ([`crate::link`]).
    pub fn beats(&self) -> u64 {
        self.counter(BEATS).load(Ordering::Relaxed)
    }

    /// `len` bytes at `offset`, to read from.
    pub fn bytes(&self, offset: u64, len: u64) -> io::Result<HostBytes<'_>> {
        self.file.bytes(offset, len, self.slots_len(), "staging")
    }

    /// `len` bytes at `offset`, to write into.
    pub fn bytes_mut(&self, offset: u64, len: u64) -> io::Result<HostBytesMut<'_>> {
        self.file.bytes_mut(offset, len, self.slots_len(), "staging")
    }
}

/// The agent's side: the mapping and its slots.
pub struct Staging {
    pub mapping: Mapping,
    slots: usize,
    slot_bytes: u64,
    free: Mutex<Vec<u64>>,
    returned: Condvar,
}

impl Staging {
    /// `slots` slots of `slot_bytes` each, in a new memfd.
    pub fn new(name: &str, slots: usize, slot_bytes: u64) -> io::Result<Staging> {
        let mapping = Mapping::create(name, slots * slot_bytes as usize)?;
        Ok(Staging {
            mapping,
            slots,
            slot_bytes,
            free: Mutex::new((0..slots as u64).rev().map(|i| i * slot_bytes).collect()),
            returned: Condvar::new(),
        })
    }

    /// How many slots it has.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The bytes of each slot.
    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// A free slot, if one is.
    pub fn try_take(self: &Arc<Self>) -> Option<Slot> {
        let offset = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        Some(Slot { staging: self.clone(), offset })
    }

    /// A free slot's offset, waiting while all are lent.
    pub fn take(self: &Arc<Self>) -> Slot {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(offset) = free.pop() {
                return Slot { staging: self.clone(), offset };
            }
            free = self.returned.wait(free).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The staging memory as the data plane sees it: what it registers with its
/// transports to put a read's bytes straight from a slot ([`dpuio_backend::Staged`]).
// SAFETY: the span is the mapping's, fixed at creation and unmapped only when the
// Staging (and so the Mapping) drops.
unsafe impl host_bytes::LentMemory for Staging {
    fn span(&self) -> (*mut u8, usize) {
        (self.mapping.file.ptr.as_ptr(), self.mapping.slots_len())
    }
}

/// A slot lent to one call (or, for a staged read, to whoever holds its bytes); back to
/// the free list when dropped.
pub struct Slot {
    staging: Arc<Staging>,
    pub offset: u64,
}

impl Slot {
    /// The staging memory the slot is in.
    pub fn staging(&self) -> &Arc<Staging> {
        &self.staging
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.staging.free.lock().unwrap_or_else(|p| p.into_inner()).push(self.offset);
        self.staging.returned.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_mappings_see_the_same_bytes_and_ranges_are_checked() {
        let staging = Arc::new(Staging::new("dpuio-test-staging", 2, 4096).unwrap());
        let other = Mapping::map(staging.mapping.fd().try_clone_to_owned().unwrap()).unwrap();
        let slot = staging.take();
        staging.mapping.bytes_mut(slot.offset, 5).unwrap().copy_from_slice(b"hello");
        assert_eq!(other.bytes(slot.offset, 5).unwrap().to_vec(), b"hello");
        let err = other.bytes(8190, 3).unwrap_err();
        assert!(err.to_string().contains("outside the 8192 bytes"), "{err}");
        assert!(other.bytes(u64::MAX, 2).is_err());
        let second = staging.take();
        assert_ne!(second.offset, slot.offset);
        let err = other.bytes(8192, 1).unwrap_err();
        assert!(err.to_string().contains("outside"), "the counters page is no slot: {err}");
    }

    #[test]
    fn the_workers_counters_reach_the_other_mapping() {
        let staging = Staging::new("dpuio-test-counters", 1, 4096).unwrap();
        let worker = Mapping::map(staging.mapping.fd().try_clone_to_owned().unwrap()).unwrap();
        let stats = dpuio_daos::RetryStats {
            retried_calls: 1,
            retries: 2,
            recovered: 3,
            gave_up: 4,
            unanswered: 5,
            refused: 6,
        };
        worker.publish(&stats);
        assert_eq!(staging.mapping.published(), stats);
        assert_eq!(staging.mapping.beats(), 0);
        worker.beat();
        worker.beat();
        assert_eq!(staging.mapping.beats(), 2, "the beat is no retry counter");
        assert_eq!(staging.mapping.published(), stats);
        let bad = rustix::fs::memfd_create("dpuio-test-short", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&bad, 100).unwrap();
        let err = Mapping::map(bad).err().expect("a memfd without a counters page is refused");
        assert!(err.to_string().contains("not slots and a counters page"), "{err}");
    }
}
