//! Staged requests over a backend with asynchronous I/O (`dataplane::staged`): a host
//! reached with put/get, I/O threads whose queues overlap every object's pieces. The
//! engine moves the bytes between its staged-I/O slots and the host; the I/O threads
//! do the storage I/O, many requests in flight.

use dpuio_backend::IoRequest;
use dpuio_proto::wire::{MetaHeader, MetaOpcode, MetaSubmission};

use super::super::meta::{self, Namespace};
use super::*;

/// A test double of an event queue (DAOS's): it overlaps every object's pieces, as an
/// event queue does, and runs a batch's pieces last first, each to its end on this
/// thread, so their completions come back out of order; it keeps `deadline` as DAOS's
/// queue keeps `call_timeout_seconds`.
struct ReversingQueueForTests {
    deadline: Option<Duration>,
}

impl IoQueue for ReversingQueueForTests {
    fn depth(&self) -> usize {
        8
    }
    fn overlaps(&self, _: &dyn Object) -> bool {
        true
    }
    fn deadline(&self) -> Option<Duration> {
        self.deadline
    }
    fn run(&mut self, batch: &mut [IoRequest<'_>], done: &mut dyn FnMut(usize, dpuio_backend::Result<usize>)) {
        for (i, request) in batch.iter_mut().enumerate().rev() {
            done(i, request.run_blocking());
        }
    }
}

fn reversing_queue() -> Box<dyn IoQueue> {
    Box::new(ReversingQueueForTests { deadline: None })
}

/// The deadline of [`reversing_queue_with_deadline`]'s queues.
const DEADLINE: Duration = Duration::from_millis(400);

fn reversing_queue_with_deadline() -> Box<dyn IoQueue> {
    Box::new(ReversingQueueForTests { deadline: Some(DEADLINE) })
}

/// A chunk of 4 MiB: the lane's staged-I/O memory has 8 slots (32 MiB).
const CHUNK: usize = 4 << 20;
const SLOTS: usize = 8;
const SMALL: u64 = 4096;

fn rig() -> Rig {
    rig_holding().0
}

/// A rig whose I/O threads' queues make `queue`, the namespace double serving the
/// objects of the map it returns.
fn rig_with(queue: fn() -> Box<dyn IoQueue>) -> (Rig, Objects) {
    let objects = Objects::default();
    let given = objects.clone();
    let rig = Rig::with(&[(TENANT, QosConfig::default())], Some(queue), move |container| {
        Some(Box::new(OpenReadsForTests { container, objects: given }))
    });
    rig.start(CHUNK, 2);
    (rig, objects)
}

/// Objects the namespace double opens for a path instead of the container's file.
type Objects = Arc<Mutex<HashMap<String, Arc<dyn Object>>>>;

/// A rig whose namespace double opens the objects of the map it returns where they are.
fn rig_holding() -> (Rig, Objects) {
    rig_with(reversing_queue)
}

/// A test double of the agent's namespace policy: open-reads open the file in the rig's
/// container (or the object the test gave for that path); nothing else runs.
struct OpenReadsForTests {
    container: Arc<dyn Container>,
    objects: Objects,
}

impl Namespace for OpenReadsForTests {
    fn metadata(&self, _: u64, request: meta::Request) -> crate::error::Result<meta::Reply> {
        let meta::Request::OpenRead { path } = request else {
            return Err(crate::error::Error::invalid("opcode", "the test double runs open-reads only"));
        };
        let object = match lock(&self.objects).get(&path) {
            Some(object) => object.clone(),
            None => {
                let at = NsPath::parse(&path).map_err(|e| crate::error::Error::invalid("path", e.to_string()))?;
                self.container.open(&at, OpenOptions::default(), 0).map_err(crate::error::Error::from)?
            }
        };
        let attr = object.stat().map_err(crate::error::Error::from)?;
        Ok(meta::Reply::Object { object, attr })
    }
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

/// An open-read entry of `path`, its request at `request_at` of `mem` (written there),
/// its answer the `answer_length` bytes at `answer_at`.
fn open_read(
    mem: &mut HostMemory,
    request_at: u64,
    path: &str,
    answer_at: u64,
    answer_length: u32,
    user_data: u64,
) -> MetaSubmission {
    let request = wire::encode_strings(&[path]).unwrap();
    mem.region.write_at(request_at as usize, &request);
    MetaSubmission {
        opcode: MetaOpcode::OpenRead,
        flags: 0,
        user_data,
        handle: 0,
        request_region: mem.id,
        answer_region: mem.id,
        request_offset: request_at,
        answer_offset: answer_at,
        request_length: request.len() as u32,
        answer_length,
        arg: 0,
    }
}

/// A put/get host's open-reads: on the I/O threads, their answers (header and file
/// bytes, or the error record) through staged-I/O slots, one across two of them.
#[test]
fn a_put_get_hosts_open_reads_answer_through_staged_slots() {
    let rig = rig();
    let host = rig.host(TENANT, PeerAccess::PutGet);
    let (small, large) = (pattern(21, 100_000), pattern(22, CHUNK + CHUNK / 2));
    rig.file("small", &small);
    rig.file("large", &large);
    let mut mem = host.region(&rig, 3 * CHUNK);
    let mut ring = host.ring(&rig, 8);
    let header = wire::META_ANSWER_HEADER_BYTES as usize;
    // The large one's answer range holds more than a slot: its image spans two.
    let asked = [
        open_read(&mut mem, 0, "/small", 4096, 200_000, 1),
        open_read(&mut mem, 256, "/large", CHUNK as u64, (CHUNK + CHUNK / 4) as u32, 2),
        open_read(&mut mem, 512, "/missing", 300_000, 4096, 3),
    ];
    for m in &asked {
        ring.push_bytes(&m.encode());
    }
    ring.submit(&host);
    let answers: Vec<Completion> = (0..asked.len()).map(|_| ring.reap()).collect();
    let bytes = copy(&mem.region);
    for (m, want) in asked[..2].iter().zip([&small[..], &large[..CHUNK + CHUNK / 4 - header]]) {
        let c = &answers[(m.user_data - 1) as usize];
        assert_ok(c, m.user_data, (header + want.len()) as u64);
        let at = m.answer_offset as usize;
        let head = MetaHeader::decode(&bytes[at..at + header]).expect("a header");
        assert_eq!(head.count, want.len() as u64, "open-read {}: bytes after the header", m.user_data);
        assert!(bytes[at + header..][..want.len()] == *want, "open-read {}: the file's bytes", m.user_data);
    }
    let refused = &answers[2];
    assert_eq!(wire::Status::from_i32(refused.status), Some(wire::Status::Refused), "{refused:?}");
    assert!(refused.result > 0, "an error record was put to the host: {refused:?}");
}

/// A test double of a file whose reads all wait for the gate: it reads the gated file
/// one piece of `SPLIT_BYTES` further on, where every read waits for a permit.
struct HeldForTests(Arc<GatedObject>);

impl Object for HeldForTests {
    fn path(&self) -> &NsPath {
        self.0.path()
    }
    fn writable(&self) -> bool {
        false
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> dpuio_backend::Result<usize> {
        self.0.read_at(buf, offset + SPLIT_BYTES)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> dpuio_backend::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn stat(&self) -> dpuio_backend::Result<Attr> {
        self.0.stat()
    }
    fn truncate(&self, size: u64) -> dpuio_backend::Result<()> {
        self.0.truncate(size)
    }
    fn sync(&self) -> dpuio_backend::Result<()> {
        self.0.sync()
    }
}

/// Before open-reads of a put/get host went to the I/O threads, the engine ran them, and
/// one whose file storage held held up every ring.
#[test]
fn a_put_get_hosts_open_read_storage_holds_does_not_hold_up_the_engine() {
    let (rig, held_paths) = rig_holding();
    let host = rig.host(TENANT, PeerAccess::PutGet);
    let input = pattern(23, 2 * SPLIT_BYTES as usize);
    let gate = gated(&rig, &input);
    let _open_gate = OpenOnDrop(gate.clone());
    lock(&held_paths).insert("/held".into(), Arc::new(HeldForTests(gate.clone())));
    let mut mem = host.region(&rig, 1 << 20);
    let (mut held, mut other) = (host.ring(&rig, 8), host.ring(&rig, 8));
    let header = u64::from(wire::META_ANSWER_HEADER_BYTES);
    held.push_bytes(&open_read(&mut mem, 0, "/held", 4096, (header + SPLIT_BYTES) as u32, 1).encode());
    held.submit(&host);
    wait_for(|| (gate.waiting.load(Ordering::SeqCst) == 1).then_some(()), "the open-read to wait in storage");
    other.push(&read(host.handle(gate.clone()), &mem, 0, 600_000, SMALL, 2));
    other.submit(&host);
    assert_ok(&other.reap(), 2, SMALL);
    assert_eq!(held.posted_count(), 0, "the held open-read is still in storage");
    gate.release(1);
    assert_ok(&held.reap(), 1, header + SPLIT_BYTES);
    let bytes = copy(&mem.region);
    let at = (4096 + header) as usize;
    assert!(bytes[at..][..SPLIT_BYTES as usize] == input[SPLIT_BYTES as usize..], "the held open-read's bytes");
    assert!(bytes[600_000..][..SMALL as usize] == input[..SMALL as usize], "the other ring's read's bytes");
}

/// Before requests ran in rounds, one of more pieces than its lane has slots ran on the
/// engine, and a read storage kept held up every ring.
#[test]
fn a_request_longer_than_the_lanes_slots_runs_in_rounds_on_the_io_threads() {
    let rig = rig();
    let host = rig.host(TENANT, PeerAccess::PutGet);
    let chunk = CHUNK as u64;
    let input = pattern(31, 10 * CHUNK + 5000);
    let gate = gated(&rig, &input);
    let _open_gate = OpenOnDrop(gate.clone());
    let handle = host.handle(gate.clone());
    let mut data = host.region(&rig, 11 * CHUNK);
    let (mut long, mut other) = (host.ring(&rig, 8), host.ring(&rig, 8));
    // Ten pieces over eight slots: the first (from SPLIT_BYTES to the first chunk
    // boundary) waits in storage; another ring's read completes meanwhile.
    long.push(&read(handle, &data, SPLIT_BYTES, 0, 9 * chunk, 1));
    long.submit(&host);
    wait_for(|| (gate.waiting.load(Ordering::SeqCst) == 1).then_some(()), "the first round to wait in storage");
    other.push(&read(handle, &data, 0, 10 * chunk, SMALL, 2));
    other.submit(&host);
    assert_ok(&other.reap(), 2, SMALL);
    assert_eq!(long.posted_count(), 0, "the long read is still in storage");
    gate.release(1);
    assert_ok(&long.reap(), 1, 9 * chunk);
    let bytes = copy(&data.region);
    assert!(bytes[..9 * CHUNK] == input[SPLIT_BYTES as usize..][..9 * CHUNK], "the long read's bytes, every round");
    assert!(bytes[10 * CHUNK..][..SMALL as usize] == input[..SMALL as usize], "the other ring's read's bytes");

    // The end of the file in the second round (the read is short there), and in the
    // first (no second round reads past it).
    long.push(&read(handle, &data, 0, 0, 11 * chunk, 3));
    long.submit(&host);
    assert_ok(&long.reap(), 3, input.len() as u64);
    assert!(copy(&data.region)[..input.len()] == input[..], "the read up to the end of the file");
    let short = rig.file("short", &input[..3 * CHUNK]);
    long.push(&read(host.handle(short), &data, 0, 0, 10 * chunk, 4));
    long.submit(&host);
    assert_ok(&long.reap(), 4, 3 * chunk);

    // A synced write of ten pieces, got from the host round by round.
    let output = pattern(32, 9 * CHUNK + 300);
    data.region.write_at(0, &output);
    let object = rig.file("out", &[]);
    let write = sub(Opcode::Write, host.handle(object.clone()), &data, chunk / 2, 0, output.len() as u64);
    long.push(&Submission { user_data: 5, flags: wire::FLAG_SYNC, ..write });
    long.submit(&host);
    assert_ok(&long.reap(), 5, output.len() as u64);
    let mut written = vec![0u8; output.len()];
    assert_eq!(object.read_at(&mut written, chunk / 2).unwrap(), output.len());
    assert!(written == output, "the host's bytes reached the file, every round");
}

/// Before open-reads waited for slots, one that found too few free ran on the engine.
#[test]
fn open_reads_wait_in_order_for_free_slots() {
    let rig = rig();
    let host = rig.host(TENANT, PeerAccess::PutGet);
    let input = pattern(33, 2 * SLOTS * SPLIT_BYTES as usize);
    let gate = gated(&rig, &input);
    let _open_gate = OpenOnDrop(gate.clone());
    let handle = host.handle(gate.clone());
    let sample = pattern(34, 50_000);
    rig.file("sample", &sample);
    let mut mem = host.region(&rig, 1 << 20);
    let (mut reads, mut samples) = (host.ring(&rig, 16), host.ring(&rig, 8));
    // Every slot held by a read storage keeps, then an open-read of a file storage
    // would answer at once.
    for i in 0..SLOTS as u64 {
        reads.push(&read(handle, &mem, (2 * i + 1) * SPLIT_BYTES, i * SMALL, SMALL, i));
    }
    reads.submit(&host);
    wait_for(|| (reads.agent_sq_head() == SLOTS as u64).then_some(()), "the engine to take every read");
    wait_for(|| (gate.waiting.load(Ordering::SeqCst) > 0).then_some(()), "the reads to wait in storage");
    let header = wire::META_ANSWER_HEADER_BYTES as usize;
    samples.push_bytes(&open_read(&mut mem, 500_000, "/sample", 600_000, 100_000, 100).encode());
    samples.submit(&host);
    wait_for(|| (samples.agent_sq_head() == 1).then_some(()), "the engine to take the open-read");
    std::thread::sleep(SETTLE);
    assert_eq!(samples.posted_count(), 0, "the open-read waits for a slot, it did not run on the engine");
    gate.release(SLOTS);
    for i in 0..SLOTS as u64 {
        assert_ok(&reads.reap(), i, SMALL);
    }
    assert_ok(&samples.reap(), 100, (header + sample.len()) as u64);
    let bytes = copy(&mem.region);
    assert!(bytes[600_000 + header..][..sample.len()] == sample[..], "the open-read's bytes");
}

/// Before staged I/O had a deadline, a host's call on a read DAOS held (every engine
/// lost) waited until DAOS came back, and so did every call waiting for the slots such
/// reads held.
#[test]
fn staged_io_past_the_backends_deadline_is_answered_unavailable() {
    let (rig, held_paths) = rig_with(reversing_queue_with_deadline);
    let host = rig.host(TENANT, PeerAccess::PutGet);
    let input = pattern(41, 4 * SLOTS * SPLIT_BYTES as usize);
    let gate = gated(&rig, &input);
    let _open_gate = OpenOnDrop(gate.clone());
    let handle = host.handle(gate.clone());
    let sample = pattern(42, 10_000);
    rig.file("sample", &sample);
    lock(&held_paths).insert("/held".into(), Arc::new(HeldForTests(gate.clone())));
    let mut mem = host.region(&rig, 1 << 20);
    let (mut reads, mut samples) = (host.ring(&rig, 16), host.ring(&rig, 8));
    // An open-read storage holds, every other slot held by reads storage holds, a read
    // waiting for a slot, an open-read likewise.
    let mut held = host.ring(&rig, 8);
    held.push_bytes(&open_read(&mut mem, 400_000, "/held", 700_000, 4096, 300).encode());
    held.submit(&host);
    wait_for(|| (gate.waiting.load(Ordering::SeqCst) == 1).then_some(()), "the open-read to wait in storage");
    let n = SLOTS as u64;
    for i in 0..n {
        reads.push(&read(handle, &mem, (2 * i + 1) * SPLIT_BYTES, i * SMALL, SMALL, i));
    }
    reads.submit(&host);
    wait_for(|| (reads.agent_sq_head() == n).then_some(()), "the engine to take every read");
    samples.push_bytes(&open_read(&mut mem, 500_000, "/sample", 600_000, 100_000, 100).encode());
    samples.submit(&host);
    let asked = Instant::now();
    let unavailable = |c: &Completion, user_data: u64| {
        assert_eq!(
            (c.user_data, wire::Status::from_i32(c.status)),
            (user_data, Some(wire::Status::Unavailable)),
            "{c:?}"
        )
    };
    let mut answered: Vec<Completion> = (0..n).map(|_| reads.reap()).collect();
    answered.sort_by_key(|c| c.user_data);
    for (i, c) in answered.iter().enumerate() {
        unavailable(c, i as u64);
    }
    unavailable(&samples.reap(), 100);
    unavailable(&held.reap(), 300);
    assert!(asked.elapsed() >= DEADLINE - Duration::from_millis(50), "answered before the deadline");
    // The held reads' slots stay with storage until it answers: its late answers put
    // nothing to the host, and the slots serve again.
    gate.release(SLOTS);
    wait_for(|| (gate.waiting.load(Ordering::SeqCst) == 0).then_some(()), "storage to answer the held reads");
    std::thread::sleep(SETTLE);
    reads.push(&read(handle, &mem, 0, 0, SMALL, 200));
    reads.submit(&host);
    assert_ok(&reads.reap(), 200, SMALL);
    let bytes = copy(&mem.region);
    assert!(bytes[..SMALL as usize] == input[..SMALL as usize], "the read after the storage came back");
    assert!(bytes[SMALL as usize..n as usize * SMALL as usize].iter().all(|&b| b == 0), "late answers put nothing");
    assert!(bytes[700_000..][..4096].iter().all(|&b| b == 0), "the late open-read's answer put nothing");
}

/// A test double of an event queue that keeps its batch a while after the batch's
/// last piece completed, as an I/O thread does until its batch ends.
struct LingeringQueueForTests;

impl IoQueue for LingeringQueueForTests {
    fn depth(&self) -> usize {
        8
    }
    fn overlaps(&self, _: &dyn Object) -> bool {
        true
    }
    fn run(&mut self, batch: &mut [IoRequest<'_>], done: &mut dyn FnMut(usize, dpuio_backend::Result<usize>)) {
        for (i, request) in batch.iter_mut().enumerate() {
            done(i, request.run_blocking());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn lingering_queue() -> Box<dyn IoQueue> {
    Box::new(LingeringQueueForTests)
}

/// Slots were freed only when the last holder of their request let go, the I/O thread
/// at the end of its batch: a request's next round (or a request waiting for slots)
/// looked for them when its last round came back, found them taken, and nothing came
/// back after to look again (a 64 MiB read at depth 1 over TCP hung in the bench).
#[test]
fn a_requests_next_round_finds_the_slots_its_last_round_gave_back() {
    let (rig, _) = rig_with(lingering_queue);
    let host = rig.host(TENANT, PeerAccess::PutGet);
    let input = pattern(51, 10 * CHUNK);
    let handle = host.handle(rig.file("in", &input));
    let data = host.region(&rig, 10 * CHUNK);
    let mut ring = host.ring(&rig, 8);
    ring.push(&read(handle, &data, 0, 0, input.len() as u64, 1));
    ring.submit(&host);
    assert_ok(&ring.reap(), 1, input.len() as u64);
    assert!(copy(&data.region) == input, "every round's bytes");
}
