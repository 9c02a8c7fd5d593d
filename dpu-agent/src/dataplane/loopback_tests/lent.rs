//! Staged reads: a backend that reads into memory of its own (a tenant DAOS worker's
//! staging) has its bytes put to the host straight from there, and gets each slot back
//! once the put is flushed.

use super::*;

/// A test double of a worker's object: reads go into a slot of a real staging memfd
/// (the worker crate's), taken with `try_take`, so a slot the engine kept too long
/// fails the read instead of waiting.
struct StagingObjectForTests {
    inner: Arc<dyn Object>,
    staging: Arc<dpuio_worker::staging::Staging>,
    staged: AtomicUsize,
    written: AtomicUsize,
}

impl StagingObjectForTests {
    fn slot(&self) -> dpuio_backend::Result<dpuio_worker::staging::Slot> {
        let slot = self.staging.try_take();
        slot.ok_or_else(|| dpuio_backend::Error::InvalidArgument("every staging slot is still lent".into()))
    }
}

impl Object for StagingObjectForTests {
    delegate_to_inner!(path, writable);
    fn read_at(&self, buf: &mut [u8], offset: u64) -> dpuio_backend::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn lends_staging(&self) -> bool {
        true
    }
    fn read_staged(&self, offset: u64, len: usize) -> Option<dpuio_backend::Result<dpuio_backend::Staged>> {
        let slot = match self.slot() {
            Ok(slot) => slot,
            Err(e) => return Some(Err(e)),
        };
        let into = self.staging.mapping.bytes_mut(slot.offset, len as u64).unwrap();
        let n = match self.inner.read_into(into, offset) {
            Ok(n) => n,
            Err(e) => return Some(Err(e)),
        };
        self.staged.fetch_add(1, Ordering::SeqCst);
        let at = slot.offset as usize;
        Some(Ok(dpuio_backend::Staged::new(self.staging.clone(), at, n, Box::new(slot)).unwrap()))
    }
    fn staging_for_write(&self, len: usize) -> Option<dpuio_backend::Result<dpuio_backend::Staged>> {
        Some(self.slot().map(|slot| {
            let at = slot.offset as usize;
            dpuio_backend::Staged::new(self.staging.clone(), at, len, Box::new(slot)).unwrap()
        }))
    }
    fn write_staged(&self, staged: dpuio_backend::Staged, offset: u64) -> dpuio_backend::Result<()> {
        self.written.fetch_add(1, Ordering::SeqCst);
        self.inner.write_from(staged.bytes(), offset)
    }
    delegate_to_inner!(write_at, stat, truncate, sync);
}

#[test]
fn staged_reads_and_writes_move_through_the_backends_memory_and_its_slots_come_back() {
    const CHUNK: usize = 64 << 10;
    let rig = Rig::new(&[(TENANT, QosConfig::default())]);
    rig.start(CHUNK, 1);
    let host = rig.host(TENANT, PeerAccess::PutGet);
    // Three and a half chunks: both halves, a flush before each half is reused, and a
    // short last chunk. Two slots only: a slot not given back fails the next read.
    let input = pattern(7, 3 * CHUNK + CHUNK / 2);
    let staging = Arc::new(dpuio_worker::staging::Staging::new("dpuio-test-lent", 2, CHUNK as u64).unwrap());
    let object = Arc::new(StagingObjectForTests {
        inner: rig.file("lent", &input),
        staging: staging.clone(),
        staged: AtomicUsize::new(0),
        written: AtomicUsize::new(0),
    });
    let handle = host.handle(object.clone());
    let mut data = host.region(&rig, 4 * CHUNK);
    let mut ring = host.ring(&rig, 8);
    for (i, (file_offset, length)) in [(0, 4 * CHUNK), (1000, CHUNK), (5, 2 * CHUNK + 3)].into_iter().enumerate() {
        ring.push(&read(handle, &data, file_offset as u64, 0, length as u64, i as u64));
        ring.submit(&host);
        let c = ring.reap();
        let want = &input[file_offset..(file_offset + length).min(input.len())];
        assert_ok(&c, i as u64, want.len() as u64);
        assert_eq!(&copy(&data.region)[..want.len()], want, "read {i} put the staged bytes to the host");
        let (a, b) = (staging.try_take(), staging.try_take());
        assert!(a.is_some() && b.is_some(), "read {i}: both slots are free again once it completed");
    }
    // Chunks end at multiples of CHUNK in the file: 4, then 2 and 3 for the unaligned reads.
    assert_eq!(object.staged.load(Ordering::SeqCst), 4 + 2 + 3, "every chunk was read into the staging slots");

    // A write of two and a bit chunks is got from the host into the slots and written
    // from there.
    let output = pattern(8, 2 * CHUNK + 100);
    data.region.write_at(0, &output);
    ring.push(&Submission { user_data: 9, ..sub(Opcode::Write, handle, &data, 10, 0, output.len() as u64) });
    ring.submit(&host);
    assert_ok(&ring.reap(), 9, output.len() as u64);
    let mut written = vec![0u8; output.len()];
    assert_eq!(object.read_at(&mut written, 10).unwrap(), output.len());
    assert_eq!(written, output, "the host's bytes reached the file through the slots");
    assert_eq!(object.written.load(Ordering::SeqCst), 3, "each chunk was written from a slot");
    let (a, b) = (staging.try_take(), staging.try_take());
    assert!(a.is_some() && b.is_some(), "both slots are free again after the write");
}
