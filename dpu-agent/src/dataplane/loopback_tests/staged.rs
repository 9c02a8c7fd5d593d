//! Staged requests over a backend with asynchronous I/O (`dataplane::staged`): a host
//! reached with put/get, I/O threads whose queues overlap every object's pieces. The
//! engine moves the bytes between its staged-I/O slots and the host; the I/O threads
//! do the storage I/O, many requests in flight.

use dpuio_backend::IoRequest;

use super::*;

/// A test double of an event queue (DAOS's): it overlaps every object's pieces, as an
/// event queue does, and runs a batch's pieces last first, each to its end on this
/// thread, so their completions come back out of order.
struct ReversingQueueForTests;

impl IoQueue for ReversingQueueForTests {
    fn depth(&self) -> usize {
        8
    }
    fn overlaps(&self, _: &dyn Object) -> bool {
        true
    }
    fn run(&mut self, batch: &mut [IoRequest<'_>], done: &mut dyn FnMut(usize, dpuio_backend::Result<usize>)) {
        for (i, request) in batch.iter_mut().enumerate().rev() {
            done(i, request.run_blocking());
        }
    }
}

fn reversing_queue() -> Box<dyn IoQueue> {
    Box::new(ReversingQueueForTests)
}

/// A chunk of 4 MiB: the lane's staged-I/O memory has 8 slots (32 MiB).
const CHUNK: usize = 4 << 20;
const SLOTS: usize = 8;
const SMALL: u64 = 4096;

fn rig() -> Rig {
    let rig = Rig::with_io_queue(&[(TENANT, QosConfig::default())], Some(reversing_queue));
    rig.start(CHUNK, 2);
    rig
}

/// A file whose reads of every second piece of `SPLIT_BYTES` wait for a permit.
fn gated(rig: &Rig, input: &[u8]) -> Arc<GatedObject> {
    Arc::new(GatedObject {
        inner: rig.file("gated", input),
        permits: Mutex::new(0),
        changed: Condvar::new(),
        waiting: AtomicUsize::new(0),
    })
}

#[test]
fn staged_reads_and_writes_run_on_the_io_threads_byte_exact() {
    let rig = rig();
    let host = rig.host(TENANT, PeerAccess::PutGet);
    let input = pattern(11, 2 * CHUNK + 5000);
    let object = rig.file("in", &input);
    let handle = host.handle(object.clone());
    let mut data = host.region(&rig, 3 * CHUNK);
    let mut ring = host.ring(&rig, 32);
    // More small reads than there are slots, in flight at once; one short at the end of
    // the file, one past it, and one across both chunk boundaries (three pieces).
    let end = input.len() as u64;
    let mut reads: Vec<(u64, u64, u64)> =
        (0..20u64).map(|i| ((i * 104_729) % (end - SMALL), i * SMALL, SMALL)).collect();
    reads.push((end - 1000, 20 * SMALL, SMALL));
    reads.push((end + 10, 21 * SMALL, SMALL));
    reads.push((CHUNK as u64 - 100, CHUNK as u64, CHUNK as u64 + 200));
    for (i, &(file_offset, region_offset, length)) in reads.iter().enumerate() {
        ring.push(&read(handle, &data, file_offset, region_offset, length, i as u64));
    }
    ring.submit(&host);
    let bytes = |i: usize| {
        let (file_offset, _, length) = reads[i];
        let from = (file_offset as usize).min(input.len());
        &input[from..(file_offset + length).min(end) as usize]
    };
    for i in 0..reads.len() {
        assert_ok(&ring.reap(), i as u64, bytes(i).len() as u64);
    }
    let host_bytes = copy(&data.region);
    for (i, &(_, region_offset, _)) in reads.iter().enumerate() {
        let want = bytes(i);
        assert!(host_bytes[region_offset as usize..][..want.len()] == *want, "read {i} put other bytes to the host");
    }

    // A synced write across both chunk boundaries is got from the host into three slots.
    let output = pattern(12, CHUNK + 300);
    data.region.write_at(0, &output);
    let at = CHUNK as u64 - 200;
    let write = sub(Opcode::Write, handle, &data, at, 0, output.len() as u64);
    ring.push(&Submission { user_data: 99, flags: wire::FLAG_SYNC, ..write });
    ring.submit(&host);
    assert_ok(&ring.reap(), 99, output.len() as u64);
    let mut written = vec![0u8; output.len()];
    assert_eq!(object.read_at(&mut written, at).unwrap(), output.len());
    assert!(written == output, "the host's bytes reached the file through the slots");
}

/// Before staged requests went to the I/O threads, the engine ran a put/get host's
/// read itself, and a read storage kept held up every ring of the lane.
#[test]
fn a_staged_read_storage_holds_does_not_hold_up_the_engine() {
    let rig = rig();
    let host = rig.host(TENANT, PeerAccess::PutGet);
    let input = pattern(13, 2 * SPLIT_BYTES as usize);
    let gate = gated(&rig, &input);
    let _open_gate = OpenOnDrop(gate.clone()); // a failing test must not hang its I/O threads
    let handle = host.handle(gate.clone());
    let data = host.region(&rig, 2 * SMALL as usize);
    let (mut held, mut other) = (host.ring(&rig, 8), host.ring(&rig, 8));
    held.push(&read(handle, &data, SPLIT_BYTES, 0, SMALL, 1));
    held.submit(&host);
    wait_for(|| (gate.waiting.load(Ordering::SeqCst) == 1).then_some(()), "the read to wait in storage");
    other.push(&read(handle, &data, 0, SMALL, SMALL, 2));
    other.submit(&host);
    assert_ok(&other.reap(), 2, SMALL);
    assert_eq!(held.posted_count(), 0, "the held read is still in storage");
    gate.release(1);
    assert_ok(&held.reap(), 1, SMALL);
    let bytes = copy(&data.region);
    assert!(bytes[..SMALL as usize] == input[SPLIT_BYTES as usize..][..SMALL as usize], "the held read's bytes");
    assert!(bytes[SMALL as usize..] == input[..SMALL as usize], "the other ring's read's bytes");
}

#[test]
fn staged_requests_wait_in_order_for_free_slots() {
    let rig = rig();
    let host = rig.host(TENANT, PeerAccess::PutGet);
    let input = pattern(14, 4 * SLOTS * SPLIT_BYTES as usize);
    let gate = gated(&rig, &input);
    let _open_gate = OpenOnDrop(gate.clone());
    let handle = host.handle(gate.clone());
    let data = host.region(&rig, 2 * SLOTS * SMALL as usize);
    let mut ring = host.ring(&rig, 32);
    // As many held reads as there are slots (odd pieces wait for a permit), then as many
    // that storage would answer at once: they wait for the slots the held ones have.
    let file_offset = |i: u64| match i < SLOTS as u64 {
        true => (2 * i + 1) * SPLIT_BYTES,
        false => 2 * (i - SLOTS as u64) * SPLIT_BYTES,
    };
    let n = 2 * SLOTS as u64;
    for i in 0..n {
        ring.push(&read(handle, &data, file_offset(i), i * SMALL, SMALL, i));
    }
    ring.submit(&host);
    wait_for(|| (ring.agent_sq_head() == n).then_some(()), "the engine to take every entry");
    std::thread::sleep(SETTLE);
    assert_eq!(ring.posted_count(), 0, "reads without a slot waited for one, none ran on the engine");
    gate.release(SLOTS);
    for i in 0..n {
        assert_ok(&ring.reap(), i, SMALL);
    }
    let bytes = copy(&data.region);
    for i in 0..n {
        let want = &input[file_offset(i) as usize..][..SMALL as usize];
        assert!(bytes[(i * SMALL) as usize..][..SMALL as usize] == *want, "read {i}");
    }
}
