//! Host memory as the agent reaches it: a host's endpoint ([`Peer`]), the regions and
//! rings it registered ([`HostRegion`], [`HostRing`]), and every load, store, put and get
//! the data plane makes into them, at the offsets [`dpuio_proto::wire`] names.
//!
//! A region is reached one of two ways, and each function here takes both:
//!
//! - **mapped** (UCX shared memory, `ucp_rkey_ptr`): plain copies, acquire loads and
//!   release stores on the mapping, and a futex wake for host threads asleep on a ring;
//! - **remote** (TCP, RDMA): puts and gets through the engine's staging region of the
//!   peer's lane ([`HostAccess`]), each flushed before the staging bytes are reused.
//!
//! The staging region of a lane is laid out as [`SCRATCH_BYTES`] of scratch (ring
//! entries, indices, metadata answers) and then [`STAGING_PAIRS`] pairs of halves of a
//! chunk each (payload), handed out in turn by [`StagingPairs`].
//!
//! Not here: what to read or write when (the driver performs what the ring protocol
//! asks), and the checks of what the host wrote (`protocol`, `crate::validate`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dpuio_backend::LentMemory;
use dpuio_proto::wire::{self, Completion};
use fabric::any;
use fabric::transport::Endpoint as _;
use fabric::{MappedRemote, Transport};

use crate::metrics::Metrics;
use crate::validate::{self, RegionAccess};

/// Bytes of the staging region used for ring entries and counters (1024 submissions).
pub(super) const SCRATCH_BYTES: usize = 64 * 1024;
/// Pairs of chunk-sized staging halves per lane, after the scratch bytes: each staged
/// request takes the next pair ([`StagingPairs::claim`]), so the payload puts of this
/// many requests may be in flight at once; the engine flushes a pair's puts only when
/// it comes round to it again, and posts completions in groups of this many (see the
/// driver). With one pair, every request waited for its own payload, then its
/// completion, before the next began: over TCP that was four round trips per request.
pub(super) const STAGING_PAIRS: usize = 4;
/// How long a flush may take before the peer is declared dead.
pub(super) const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// The data-plane side of one session: the endpoint to the host's worker, and what it
/// registered.
pub struct Peer {
    pub endpoint: any::Endpoint,
    /// Which of the data plane's workers the endpoint belongs to.
    pub(super) lane: usize,
    /// Peers of that worker (this one included while it lives).
    pub(super) lane_peers: Arc<AtomicU64>,
    /// Set when a transfer to this host failed: its rings are not served again.
    pub(super) failed: AtomicBool,
}

impl Peer {
    /// Whether the engine still serves `ring` of this host: no transfer to the host
    /// failed, and the host did not break the ring's protocol.
    pub(super) fn serves(&self, ring: &HostRing) -> bool {
        !self.failed.load(Ordering::Relaxed) && !ring.broken.load(Ordering::Relaxed)
    }

    /// A transfer to this host (of session `session_id`) failed with `e`: its rings are
    /// not served again.
    pub(super) fn fail(&self, metrics: &Metrics, session_id: u64, e: &dyn std::fmt::Display) {
        self.failed.store(true, Ordering::Relaxed);
        metrics.failed_peers.inc();
        tracing::warn!(session = format!("{:#018x}", session_id), error = %e,
            "data plane to this host failed; its rings are no longer served");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.lane_peers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A host region the agent may access.
pub struct HostRegion {
    pub id: u32,
    pub addr: u64,
    pub length: u64,
    pub access: RegionAccess,
    /// The mapping lent to tenant workers (`dpuio_worker::host`), given back before the
    /// mapping goes (fields drop in order).
    pub(super) _lent: Option<dpuio_worker::host::Lent>,
    pub(super) key: any::RemoteKey,
    pub(super) mapped: Option<MappedRemote>,
}

/// A ring pair the host registered.
pub struct HostRing {
    pub id: u32,
    pub(super) region: Arc<HostRegion>,
    pub(super) offset: u64,
    pub(super) entries: u32,
    /// Next submission index the agent will take.
    pub(super) sq_head: AtomicU64,
    /// Next completion index the agent will post.
    pub(super) cq_tail: AtomicU64,
    /// Set when the host wrote indices that make no sense: the ring is not served again.
    pub(super) broken: AtomicBool,
}

impl HostRegion {
    pub fn info(&self) -> validate::RegionInfo {
        validate::RegionInfo { length: self.length, access: self.access, mapped: self.mapped.is_some() }
    }
    pub fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }
}

impl HostRing {
    pub fn region_id(&self) -> u32 {
        self.region.id
    }

    /// Tell a host waiting on this ring that it is no longer served, and `why`
    /// (`wire::RING_CLOSED_ENDED` or `wire::RING_CLOSED_STOPPING`), where the ring is
    /// mapped (see `wire::RING_CLOSED_OFFSET`).
    pub fn mark_closed(&self, why: u32) {
        if let Some(m) = &self.region.mapped {
            m.store_u32_release(self.offset as usize + wire::RING_CLOSED_OFFSET, why);
            wake_waiters(self);
        }
    }
}

/// The engine's access to one host: mapped copies where its region is mapped, else
/// puts and gets through the staging region of the host's lane, or straight from
/// memory a backend lent ([`LentRegions`]).
pub(super) struct HostAccess<'a> {
    pub peer: &'a Peer,
    pub staging: &'a mut any::Region,
    pub lent: &'a mut LentRegions,
    pub pairs: &'a mut StagingPairs,
}

/// Which of a lane's [`STAGING_PAIRS`] may still have puts in flight, and through
/// which endpoint: a pair is handed out again only after that endpoint was flushed.
pub(super) struct StagingPairs {
    dirty: [Option<any::Endpoint>; STAGING_PAIRS],
    next: usize,
}

impl StagingPairs {
    pub fn new() -> StagingPairs {
        StagingPairs { dirty: Default::default(), next: 0 }
    }

    /// The next pair, for a request whose puts go through `endpoint`: the puts made from
    /// it for an earlier request are flushed first. A flush that fails belongs to that
    /// earlier request's host, which its own next transfer finds gone; it is logged and
    /// not held against this request's.
    pub fn claim(&mut self, endpoint: &any::Endpoint) -> usize {
        let pair = self.next;
        self.next = (pair + 1) % STAGING_PAIRS;
        if let Some(earlier) = self.dirty[pair].replace(endpoint.clone())
            && let Err(e) = earlier.flush(FLUSH_TIMEOUT)
        {
            tracing::warn!(error = %e, "a staging pair's earlier puts did not complete; reusing it");
        }
        pair
    }

    /// Where half `half` of pair `pair` begins in the staging region, for chunks of
    /// `chunk_bytes`.
    pub fn offset(pair: usize, half: usize, chunk_bytes: usize) -> usize {
        SCRATCH_BYTES + (2 * pair + half) * chunk_bytes
    }

    /// The staging region's size for chunks of `chunk_bytes`.
    pub fn region_bytes(chunk_bytes: usize) -> usize {
        SCRATCH_BYTES + 2 * STAGING_PAIRS * chunk_bytes
    }
}

/// Backends' staging memory registered with one lane's worker (a tenant DAOS worker's
/// memfd, [`dpuio_backend::Object::read_staged`]): a read's bytes are put to the host
/// from there, not copied into the lane's staging region first. Registered on first
/// use; an entry whose memory nobody else holds any more (its worker process is gone)
/// is dropped when the next is made.
pub(super) struct LentRegions {
    worker: Arc<any::Worker>,
    regions: Vec<(Arc<dyn LentMemory>, any::Region)>,
    /// The transport refused to register lent memory: copy instead, and say so once.
    refused: bool,
}

impl LentRegions {
    pub fn new(worker: Arc<any::Worker>) -> LentRegions {
        LentRegions { worker, regions: Vec::new(), refused: false }
    }

    /// `memory` registered with this lane's worker; `None` where the transport refuses
    /// it (the caller copies into its staging region instead).
    pub fn region(&mut self, memory: &Arc<dyn LentMemory>) -> Option<&any::Region> {
        if self.refused {
            return None;
        }
        let same = |m: &Arc<dyn LentMemory>| std::ptr::addr_eq(Arc::as_ptr(m), Arc::as_ptr(memory));
        if let Some(i) = self.regions.iter().position(|(m, _)| same(m)) {
            return Some(&self.regions[i].1);
        }
        self.regions.retain(|(m, _)| Arc::strong_count(m) > 2); // ours and the registration's
        match self.worker.register_lent(memory.clone()) {
            Ok(region) => {
                self.regions.push((memory.clone(), region));
                self.regions.last().map(|(_, r)| r)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the data plane cannot register a tenant worker's staging memory; \
                    its reads are copied into the lane's staging region instead");
                self.refused = true;
                None
            }
        }
    }
}

impl HostAccess<'_> {
    /// Copy host memory at `offset` of `region` into `out` (at most the scratch size
    /// where it is not mapped).
    pub fn read(&mut self, region: &HostRegion, offset: u64, out: &mut [u8]) -> Result<(), fabric::Error> {
        match &region.mapped {
            Some(m) => m.read_at(offset as usize, out),
            None => {
                self.peer.endpoint.get(self.staging, 0, out.len(), region.addr + offset, &region.key)?;
                self.peer.endpoint.flush(FLUSH_TIMEOUT)?;
                self.staging.read_at(0, out);
            }
        }
        Ok(())
    }

    /// Copy host memory at `offset` of `region` into `out`, in scratch-sized gets
    /// where it is not mapped.
    pub fn read_range(&mut self, region: &HostRegion, offset: u64, out: &mut [u8]) -> Result<(), fabric::Error> {
        for (i, piece) in out.chunks_mut(SCRATCH_BYTES).enumerate() {
            self.read(region, offset + (i * SCRATCH_BYTES) as u64, piece)?;
        }
        Ok(())
    }

    /// An index the host publishes (an acquire load where mapped).
    pub fn load_u64(&mut self, region: &HostRegion, offset: u64) -> Result<u64, fabric::Error> {
        if let Some(m) = &region.mapped {
            return Ok(m.load_u64_acquire(offset as usize));
        }
        let mut b = [0u8; 8];
        self.read(region, offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Publish an index to the host (a release store where mapped).
    pub fn store_u64(&mut self, region: &HostRegion, offset: u64, value: u64) -> Result<(), fabric::Error> {
        match &region.mapped {
            Some(m) => m.store_u64_release(offset as usize, value),
            None => {
                self.peer.endpoint.put_bytes(&value.to_le_bytes(), region.addr + offset, &region.key)?;
                self.peer.endpoint.flush(FLUSH_TIMEOUT)?;
            }
        }
        Ok(())
    }

    /// Write `bytes` into `region` at `offset`: a copy into a mapped region, else
    /// scratch-sized puts, each flushed before the scratch is reused.
    pub fn write(&mut self, region: &HostRegion, offset: u64, bytes: &[u8]) -> Result<(), fabric::Error> {
        if let Some(m) = &region.mapped {
            m.bytes_mut(offset as usize, bytes.len()).copy_from_slice(bytes);
            return Ok(());
        }
        for (i, piece) in bytes.chunks(SCRATCH_BYTES).enumerate() {
            self.staging.write_at(0, piece);
            let to = region.addr + offset + (i * SCRATCH_BYTES) as u64;
            self.peer.endpoint.put(self.staging, 0, piece.len(), to, &region.key)?;
            self.peer.endpoint.flush(FLUSH_TIMEOUT)?;
        }
        Ok(())
    }

    /// Post `c` at `index` of `ring`. Payload first, then the entry, then its `seq`
    /// word: a host that sees the seq sees everything before it. Waking the ring's
    /// waiters is the caller's.
    pub fn post_completion(&mut self, ring: &HostRing, index: u64, c: &Completion) -> Result<(), fabric::Error> {
        if ring.region.mapped.is_some() {
            post_mapped(ring, index, c);
            return Ok(());
        }
        let region = &ring.region;
        let at = region.addr + ring.offset + wire::cqe_offset(ring.entries, index) as u64;
        let bytes = c.encode();
        let (body, seq) = bytes.split_at(wire::CQE_SEQ_OFFSET);
        let endpoint = &self.peer.endpoint;
        endpoint.flush(FLUSH_TIMEOUT)?; // payload puts of this request
        endpoint.put_bytes(body, at, &region.key)?;
        endpoint.flush(FLUSH_TIMEOUT)?;
        endpoint.put_bytes(seq, at + wire::CQE_SEQ_OFFSET as u64, &region.key)?;
        endpoint.flush(FLUSH_TIMEOUT)?;
        Ok(())
    }

    /// Post completions `posted` (index, entry) of `ring`, which is not mapped, in one
    /// go: a flush (the payload puts of their requests), every entry but its `seq`
    /// word, a flush, then every `seq` word. Three round trips for the group rather than
    /// three for each; a host that sees a seq sees its entry and payload. The seq puts
    /// are not waited for: they hold their own bytes, and the next flush of the
    /// endpoint reports a failure.
    pub fn post_completions(&mut self, ring: &HostRing, posted: &[(u64, Completion)]) -> Result<(), fabric::Error> {
        if posted.is_empty() {
            return Ok(());
        }
        let region = &ring.region;
        let at = |index| region.addr + ring.offset + wire::cqe_offset(ring.entries, index) as u64;
        let endpoint = &self.peer.endpoint;
        endpoint.flush(FLUSH_TIMEOUT)?;
        for (index, c) in posted {
            endpoint.put_bytes(&c.encode()[..wire::CQE_SEQ_OFFSET], at(*index), &region.key)?;
        }
        endpoint.flush(FLUSH_TIMEOUT)?;
        for (index, c) in posted {
            let bytes = c.encode();
            endpoint.put_bytes(
                &bytes[wire::CQE_SEQ_OFFSET..],
                at(*index) + wire::CQE_SEQ_OFFSET as u64,
                &region.key,
            )?;
        }
        Ok(())
    }

    /// Read up to `length` bytes of `object` from offset 0 into `region` at `at`,
    /// chunk by chunk (straight into a mapped region, else through staging and puts).
    /// The inner result is the backend's: bytes read (short at end of file) or why not.
    pub fn read_object(
        &mut self,
        region: &HostRegion,
        at: u64,
        length: u64,
        object: &dyn dpuio_backend::Object,
        chunk_bytes: usize,
    ) -> Result<Result<u64, dpuio_backend::Error>, fabric::Error> {
        if let Some(m) = &region.mapped {
            return Ok(read_object_mapped(object, m, at, length, chunk_bytes));
        }
        let mut done = 0u64;
        let from = StagingPairs::offset(self.pairs.claim(&self.peer.endpoint), 0, chunk_bytes);
        for c in validate::chunks(0, at, length, chunk_bytes as u64) {
            let dst = self.staging.bytes_mut(from, c.length as usize);
            let read = object.read_into(dst, c.file_offset);
            if let Ok(n @ 1..) = read {
                self.peer.endpoint.put(self.staging, from, n, region.addr + c.region_offset, &region.key)?;
                self.peer.endpoint.flush(FLUSH_TIMEOUT)?;
            }
            match read {
                Ok(n) => {
                    done += n as u64;
                    if (n as u64) < c.length {
                        break; // end of file
                    }
                }
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(Ok(done))
    }
}

/// Post `c` at `index` of a mapped ring: the entry, then (a release store) its `seq`
/// word. Waking the ring's waiters is the caller's.
pub(super) fn post_mapped(ring: &HostRing, index: u64, c: &Completion) {
    let mem = ring.region.mapped.as_ref().expect("posted into mapped rings only");
    let at = ring.offset as usize + wire::cqe_offset(ring.entries, index);
    mem.bytes_mut(at, wire::CQE_SEQ_OFFSET).copy_from_slice(&c.encode()[..wire::CQE_SEQ_OFFSET]);
    mem.store_u64_release(at + wire::CQE_SEQ_OFFSET, c.seq);
}

/// Read up to `length` bytes of `object` from offset 0 straight into mapped host
/// memory at `at`, chunk by chunk: the bytes read (short at end of file) or why not.
pub(super) fn read_object_mapped(
    object: &dyn dpuio_backend::Object,
    mapped: &fabric::SharedMemory,
    at: u64,
    length: u64,
    chunk_bytes: usize,
) -> Result<u64, dpuio_backend::Error> {
    let mut done = 0u64;
    for c in validate::chunks(0, at, length, chunk_bytes as u64) {
        let n = object.read_into(mapped.bytes_mut(c.region_offset as usize, c.length as usize), c.file_offset)?;
        done += n as u64;
        if (n as u64) < c.length {
            break; // end of file
        }
    }
    Ok(done)
}

/// Read host memory outside the engine (ring registration): mapped, or a get through a
/// small temporary region.
pub(super) fn read_blocking(
    worker: &any::Worker,
    peer: &Peer,
    region: &HostRegion,
    offset: u64,
    out: &mut [u8],
) -> Result<(), fabric::Error> {
    if let Some(m) = &region.mapped {
        m.read_at(offset as usize, out);
        return Ok(());
    }
    let tmp = worker.alloc_region(out.len().max(64))?;
    peer.endpoint.get(&tmp, 0, out.len(), region.addr + offset, &region.key)?;
    peer.endpoint.flush(FLUSH_TIMEOUT)?;
    tmp.read_at(0, out);
    Ok(())
}

/// Whether a mapped ring has submissions the engine has not taken.
pub(super) fn ring_has_work(ring: &HostRing) -> bool {
    ring.region.mapped.as_ref().is_some_and(|m| {
        m.load_u64_acquire(ring.offset as usize + wire::SQ_TAIL_OFFSET) != ring.sq_head.load(Ordering::Relaxed)
    })
}

/// Tell the host whether the engine is polling this ring (see wire::AGENT_POLLING_OFFSET).
pub(super) fn set_polling(ring: &HostRing, on: bool) {
    if let Some(m) = &ring.region.mapped {
        m.store_u32_release(ring.offset as usize + wire::AGENT_POLLING_OFFSET, u32::from(on));
    }
}

/// Tell the host that this agent can wake its waiters on a mapped ring at `offset` of
/// `region` (see wire::AGENT_WAKES_OFFSET).
pub(super) fn set_agent_wakes(region: &HostRegion, offset: u64) {
    if let Some(m) = &region.mapped {
        m.store_u32_release(offset as usize + wire::AGENT_WAKES_OFFSET, 1);
    }
}

/// Wake host threads sleeping on this ring's futex word, if any (shared memory only).
pub(super) fn wake_waiters(ring: &HostRing) {
    let Some(m) = &ring.region.mapped else { return };
    let base = ring.offset as usize;
    // Pairs with the host's fence between setting cq_waiters and re-checking the ring.
    std::sync::atomic::fence(Ordering::SeqCst);
    if m.load_u32_acquire(base + wire::CQ_WAITERS_OFFSET) != 0 {
        let word = m.atomic_u32(base + wire::CQ_FUTEX_OFFSET);
        word.fetch_add(1, Ordering::SeqCst);
        // Not FUTEX_PRIVATE: the word lives in memory shared with the host process.
        let _ = rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
    }
}
