//! The ring protocol against a simulated host ring, with no transport: each test runs
//! in microseconds.

use dpuio_proto::wire::{self, Completion, Opcode, SQE_BYTES, Status, Submission};

use super::*;
use crate::validate::{HandleInfo, RegionAccess, RegionInfo, SessionView};

/// Handle 7 (read and write), region 1 (1 MiB, both directions, mapped) and region 2
/// (the same, reached with put/get).
struct FakeSession;

const HANDLE: u64 = 7;
const REGION: u32 = 1;
const REMOTE_REGION: u32 = 2;
const MAX_IO: u64 = 1 << 20;

impl SessionView for FakeSession {
    fn handle(&self, id: u64) -> Option<HandleInfo> {
        (id == HANDLE).then_some(HandleInfo { readable: true, writable: true })
    }
    fn region(&self, id: u32) -> Option<RegionInfo> {
        let access = RegionAccess { agent_writes: true, agent_reads: true };
        matches!(id, REGION | REMOTE_REGION).then_some(RegionInfo { length: 1 << 20, access, mapped: id == REGION })
    }
}

pub(crate) fn read(user_data: u64) -> [u8; SQE_BYTES] {
    Submission {
        opcode: Opcode::Read,
        flags: 0,
        user_data,
        handle: HANDLE,
        region_id: REGION,
        file_offset: 0,
        region_offset: 0,
        length: 4096,
    }
    .encode()
}

/// The host's side of a ring pair, as the shim keeps it: it writes entries and
/// `sq_tail`, reaps completions by their `seq` word and publishes `cq_head`.
pub(crate) struct HostRing {
    entries: u32,
    sq: Vec<[u8; SQE_BYTES]>,
    cq: Vec<Option<Completion>>,
    sq_tail: u64,
    cq_head: u64,
}

impl HostRing {
    pub(crate) fn new(entries: u32) -> HostRing {
        HostRing::at(entries, 0)
    }

    /// A ring whose indices start at `start` (both sides agree on it).
    fn at(entries: u32, start: u64) -> HostRing {
        let n = entries as usize;
        HostRing { entries, sq: vec![[0; SQE_BYTES]; n], cq: vec![None; n], sq_tail: start, cq_head: start }
    }

    fn slot(&self, index: u64) -> usize {
        (index % u64::from(self.entries)) as usize
    }

    /// Submit an entry; the host keeps within its ring (it knows the agent's cq room
    /// from what it reaped).
    pub(crate) fn submit(&mut self, entry: [u8; SQE_BYTES]) {
        assert!(self.sq_tail.wrapping_sub(self.cq_head) < u64::from(self.entries), "host overfilled its ring");
        let slot = self.slot(self.sq_tail);
        self.sq[slot] = entry;
        self.sq_tail = self.sq_tail.wrapping_add(1);
    }

    /// Every completion posted in order from `cq_head`.
    pub(crate) fn reap(&mut self) -> Vec<Completion> {
        let mut out = Vec::new();
        loop {
            let slot = self.slot(self.cq_head);
            match self.cq[slot] {
                Some(c) if c.seq == self.cq_head.wrapping_add(1) => {
                    out.push(c);
                    self.cq[slot] = None;
                    self.cq_head = self.cq_head.wrapping_add(1);
                }
                _ => return out,
            }
        }
    }

    fn indices(&self) -> HostIndices {
        HostIndices { sq_tail: self.sq_tail, cq_head: self.cq_head }
    }
}

/// How serving a ring once ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Served {
    Broken,
    Idle,
    Finished {
        taken: u64,
        more: bool,
        wake: bool,
    },
    /// A transfer failed at the action numbered here; nothing was asked after it.
    Failed {
        actions: usize,
    },
}

/// The agent's side in the tests: the driver's job done on the simulated ring.
pub(crate) struct Driver {
    cursor: Cursor,
    entries: u32,
    /// How the ring is reached (put/get unless a test maps it).
    memory: RingMemory,
    /// Whether the I/O threads take the open-reads handed to them.
    workers_take: bool,
    /// The ring's tenant has its calls made by a worker process
    /// ([`Batch::offloading_every_meta`]).
    every_meta: bool,
    /// The refusals counted as they were posted: (user data, opcode, status).
    refusals: Vec<(u64, Option<Opcode>, Status)>,
    /// Every action the machine gave, in order.
    log: Vec<Action>,
    queued: Vec<(Submission, u64)>,
    /// Report a transfer failure instead of performing the action of this number.
    fail_at: Option<usize>,
    /// How direct runs end.
    run: fn(&Submission) -> Ran,
}

fn ok(sub: &Submission) -> Ran {
    Ran::Done { status: Status::Ok, result: sub.length }
}

impl Driver {
    pub(crate) fn new(entries: u32) -> Driver {
        Driver::at(entries, 0)
    }

    fn at(entries: u32, start: u64) -> Driver {
        Driver {
            cursor: Cursor { sq_head: start, cq_tail: start },
            entries,
            memory: RingMemory::Remote,
            workers_take: true,
            every_meta: false,
            refusals: Vec::new(),
            log: Vec::new(),
            queued: Vec::new(),
            fail_at: None,
            run: ok,
        }
    }

    pub(crate) fn serve(&mut self, host: &mut HostRing, tenant: Tenant) -> Served {
        let mut batch = match self.cursor.serve(self.entries, self.memory, host.indices(), tenant) {
            Serve::Broken => return Served::Broken,
            Serve::Idle => return Served::Idle,
            Serve::Batch(b) if self.every_meta => b.offloading_every_meta(),
            Serve::Batch(b) => b,
        };
        let start = self.cursor;
        let mut actions = 0;
        while let Some(action) = batch.poll() {
            self.log.push(action);
            actions += 1;
            if self.fail_at == Some(actions) {
                batch.transfer_failed();
                assert_eq!(batch.poll(), None, "asked for more after a transfer failed");
                return Served::Failed { actions };
            }
            match action {
                Action::Fetch { index } => batch.fetched(&host.sq[host.slot(index)], &FakeSession, MAX_IO),
                Action::Run { sub, .. } => batch.ran((self.run)(&sub)),
                Action::Queue { sub, cq_index } => self.queued.push((sub, cq_index)),
                Action::Meta { meta, .. } => {
                    batch.ran(Ran::Done { status: Status::Ok, result: u64::from(meta.answer_length) })
                }
                Action::Offload { .. } => batch.offloaded(self.workers_take),
                Action::Complete { index, completion, count } => {
                    if let Count::Refused { opcode, status } = count {
                        assert_eq!(status as i32, completion.status, "counted with the status it is posted with");
                        self.refusals.push((completion.user_data, opcode, status));
                    }
                    // Never over a completion the host has not reaped.
                    assert!(index.wrapping_sub(host.cq_head) < u64::from(self.entries), "posted outside the room");
                    assert_eq!(completion.seq, index.wrapping_add(1));
                    let slot = host.slot(index);
                    host.cq[slot] = Some(completion);
                }
                Action::Finish { cursor, wake, more } => {
                    self.cursor = cursor;
                    return Served::Finished { taken: cursor.sq_head.wrapping_sub(start.sq_head), more, wake };
                }
            }
        }
        panic!("the batch stopped without finishing and without a failure");
    }
}

pub(crate) const UNLIMITED: Tenant = Tenant::Direct { room: u32::MAX };

#[test]
fn many_laps_of_a_small_ring_complete_every_entry_once_in_order() {
    let (mut host, mut agent) = (HostRing::new(4), Driver::new(4));
    let mut next = 0u64;
    let mut reaped = Vec::new();
    // Uneven bursts, so submissions and completions wrap at every offset of the ring.
    for burst in (0..400).map(|i| 1 + i % 4) {
        for _ in 0..burst {
            host.submit(read(next));
            next += 1;
        }
        assert!(matches!(agent.serve(&mut host, UNLIMITED), Served::Finished { more: false, wake: true, .. }));
        reaped.extend(host.reap());
    }
    assert_eq!(reaped.len() as u64, next);
    for (i, c) in reaped.iter().enumerate() {
        assert_eq!((c.user_data, c.status, c.result, c.seq), (i as u64, Status::Ok as i32, 4096, i as u64 + 1));
    }
    assert_eq!(agent.cursor, Cursor { sq_head: next, cq_tail: next });
}

#[test]
fn indices_wrap_past_u64_max() {
    let start = u64::MAX - 5;
    let (mut host, mut agent) = (HostRing::at(8, start), Driver::at(8, start));
    for round in 0..4u64 {
        for i in 0..5 {
            host.submit(read(round * 5 + i));
        }
        assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: 5, more: false, wake: true });
        let reaped = host.reap();
        assert_eq!(
            reaped.iter().map(|c| c.user_data).collect::<Vec<_>>(),
            (round * 5..round * 5 + 5).collect::<Vec<_>>()
        );
    }
    assert_eq!(agent.cursor.sq_head, start.wrapping_add(20));
    assert!(agent.cursor.sq_head < start, "the cursor went past u64::MAX");
}

#[test]
fn hostile_indices_break_the_ring() {
    let entries = 8u32;
    let n = u64::from(entries);
    let cursor = Cursor { sq_head: 100, cq_tail: 100 };
    let serve = |sq_tail: u64, cq_head: u64| {
        cursor.serve(entries, RingMemory::Remote, HostIndices { sq_tail, cq_head }, UNLIMITED)
    };
    // sq_tail more than a ring ahead, or behind the agent's head.
    assert!(matches!(serve(100 + n + 1, 100), Serve::Broken));
    assert!(matches!(serve(u64::MAX, 100), Serve::Broken));
    assert!(matches!(serve(99, 100), Serve::Broken));
    // cq_head ahead of what the agent posted, or more than a ring behind it.
    assert!(matches!(serve(100, 101), Serve::Broken));
    assert!(matches!(serve(100, 100 - n - 1), Serve::Broken));
    assert!(matches!(serve(100, 0), Serve::Broken));
    // The edges are legal: a full submission ring; a full completion ring (nothing to
    // take until the host reaps).
    assert!(matches!(serve(100 + n, 100), Serve::Batch(_)));
    assert!(matches!(serve(100 + n, 100 - n), Serve::Idle));
}

#[test]
fn any_indices_never_panic_and_never_post_outside_the_room() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(14);
    for _ in 0..2000 {
        let entries = 1u32 << rng.random_range(1..6);
        let start: u64 = rng.random();
        let mut agent = Driver::at(entries, start);
        let mut host = HostRing::at(entries, start);
        for (i, entry) in host.sq.iter_mut().enumerate() {
            *entry = if rng.random_bool(0.8) { read(i as u64) } else { rng.random() };
        }
        // Small offsets around the truth, and anything at all.
        let near = |rng: &mut rand::rngs::StdRng| {
            start.wrapping_add(rng.random_range(0..3 * u64::from(entries))).wrapping_sub(u64::from(entries))
        };
        host.sq_tail = if rng.random_bool(0.5) { near(&mut rng) } else { rng.random() };
        host.cq_head = if rng.random_bool(0.5) { near(&mut rng) } else { rng.random() };
        let sane = host.sq_tail.wrapping_sub(start) <= u64::from(entries)
            && start.wrapping_sub(host.cq_head) <= u64::from(entries);
        match agent.serve(&mut host, UNLIMITED) {
            Served::Broken => assert!(!sane),
            Served::Idle | Served::Finished { .. } => assert!(sane),
            Served::Failed { .. } => unreachable!(),
        }
    }
}

#[test]
fn a_batch_stops_at_ring_batch_then_comes_back() {
    let (mut host, mut agent) = (HostRing::new(256), Driver::new(256));
    for i in 0..200 {
        host.submit(read(i));
    }
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: RING_BATCH, more: true, wake: true });
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: RING_BATCH, more: true, wake: true });
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: RING_BATCH, more: true, wake: true });
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: 8, more: false, wake: true });
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Idle);
    assert_eq!(host.reap().len(), 200);
}

#[test]
fn a_batch_takes_no_more_than_the_completion_ring_has_room_for() {
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    for i in 0..8 {
        host.submit(read(i));
    }
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: 8, more: false, wake: true });
    // The host reaps 3 and publishes 5 (2 of them entries of the last lap it leaves in
    // place): room for 3 completions only.
    host.cq_head += 3;
    for i in 8..11 {
        host.submit(read(i));
    }
    host.sq_tail += 2; // two more than the room (entries already in place)
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: 3, more: true, wake: true });
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Idle, "completion ring full");
    host.cq_head += 5;
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: 2, more: false, wake: true });
}

#[test]
fn a_tenant_without_room_takes_nothing_and_resumes_with_room() {
    let (mut host, mut agent) = (HostRing::new(16), Driver::new(16));
    for i in 0..10 {
        host.submit(read(i));
    }
    assert_eq!(agent.serve(&mut host, Tenant::Queued { room: 0 }), Served::Idle);
    assert!(agent.log.is_empty(), "nothing fetched for a tenant without room");
    assert_eq!(
        agent.serve(&mut host, Tenant::Queued { room: 4 }),
        Served::Finished { taken: 4, more: true, wake: false }
    );
    assert_eq!(
        agent.queued.iter().map(|(s, i)| (s.user_data, *i)).collect::<Vec<_>>(),
        [(0, 0), (1, 1), (2, 2), (3, 3)]
    );
    assert_eq!(
        agent.serve(&mut host, Tenant::Direct { room: 100 }),
        Served::Finished { taken: 6, more: false, wake: true }
    );
    assert_eq!(host.reap().len(), 0, "slots 0..4 wait for the queued requests");
}

#[test]
fn malformed_and_refused_entries_complete_with_their_status_and_the_ring_goes_on() {
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    let mut garbage = read(41);
    garbage[2] = 9; // no such opcode
    host.submit(garbage);
    let mut bad_handle = Submission::decode(&read(42)).unwrap();
    bad_handle.handle = 99;
    host.submit(bad_handle.encode());
    host.submit(read(43));
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: 3, more: false, wake: true });
    let got: Vec<(u64, i32)> = host.reap().iter().map(|c| (c.user_data, c.status)).collect();
    assert_eq!(got, [(41, Status::Malformed as i32), (42, Status::BadHandle as i32), (43, Status::Ok as i32)]);
    // The refusals are counted as they are posted; the read that ran, as it ran.
    let refused = [(41, None, Status::Malformed), (42, Some(Opcode::Read), Status::BadHandle)];
    assert_eq!(agent.refusals, refused);
}

#[test]
fn a_removed_tenants_valid_entries_are_cancelled() {
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    host.submit(read(1));
    assert_eq!(agent.serve(&mut host, Tenant::Removed), Served::Finished { taken: 1, more: false, wake: true });
    assert_eq!(host.reap()[0].status, Status::Cancelled as i32);
    assert!(!agent.log.iter().any(|a| matches!(a, Action::Run { .. } | Action::Queue { .. })));
}

#[test]
fn a_run_on_the_workers_posts_nothing_here() {
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    agent.run = |_| Ran::OnWorkers;
    host.submit(read(1));
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: 1, more: false, wake: false });
    assert!(host.reap().is_empty());
    let failed = |_: &Submission| Ran::Done { status: Status::Io, result: 0 };
    agent.run = failed;
    host.submit(read(2));
    agent.serve(&mut host, UNLIMITED);
    host.cq_head += 1; // the workers' completion, reaped
    assert_eq!(host.reap().iter().map(|c| (c.user_data, c.status)).collect::<Vec<_>>(), [(2, Status::Io as i32)]);
}

#[test]
fn a_transfer_failure_at_any_step_stops_the_batch_before_its_completion() {
    // Entry 0 runs, entry 1 is malformed: Fetch, Run, Complete, Fetch, Complete, Finish.
    let mut garbage = read(1);
    garbage[0] = 0;
    for fail_at in 1..=6 {
        let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
        host.submit(read(0));
        host.submit(garbage);
        agent.fail_at = Some(fail_at);
        assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Failed { actions: fail_at });
        assert_eq!(agent.cursor, Cursor::default(), "the ring's cursor stays where it was");
        // Only completions handed out before the failure were posted.
        let handed: Vec<u64> = agent.log[..fail_at - 1]
            .iter()
            .filter_map(|a| match a {
                Action::Complete { completion, .. } => Some(completion.user_data),
                _ => None,
            })
            .collect();
        assert_eq!(host.reap().iter().map(|c| c.user_data).collect::<Vec<_>>(), handed, "fail_at {fail_at}");
    }
}

#[test]
fn answers_out_of_turn_are_ignored() {
    let (mut host, agent) = (HostRing::new(8), Driver::new(8));
    host.submit(read(1));
    let Serve::Batch(mut batch) = agent.cursor.serve(8, RingMemory::Remote, host.indices(), UNLIMITED) else {
        panic!("a batch")
    };
    batch.ran(Ran::Done { status: Status::Ok, result: 1 }); // no run is out
    assert_eq!(batch.poll(), Some(Action::Fetch { index: 0 }));
    assert_eq!(batch.poll(), None, "waits for the entry");
    batch.ran(Ran::OnWorkers); // not a fetch answer
    batch.offloaded(false); // no open-read is out
    assert_eq!(batch.poll(), None);
    batch.fetched(&read(1), &FakeSession, MAX_IO);
    batch.fetched(&read(2), &FakeSession, MAX_IO); // one fetch was out, not two
    assert!(matches!(batch.poll(), Some(Action::Run { cq_index: 0, .. })));
    batch.ran(Ran::OnWorkers);
    assert_eq!(
        batch.poll(),
        Some(Action::Finish { cursor: Cursor { sq_head: 1, cq_tail: 1 }, wake: false, more: false })
    );
    assert_eq!(batch.poll(), None);
}

#[test]
fn completions_seq_wraps_with_the_index() {
    assert_eq!(
        completion(5, 9, Status::Ok, 3),
        Completion { user_data: 5, status: Status::Ok as i32, result: 3, seq: 10 }
    );
    assert_eq!(completion(5, u64::MAX, Status::Ok, 3).seq, 0);
}

/// Run a staged request against a simulated staging region and host region; returns
/// its steps and how it ended. `read_bytes(k)` is what the backend read of chunk `k`
/// returns; `fail(k)` fails the backend piece of chunk `k` (or the sync, `k` = chunks).
fn staged(
    sub: Submission,
    chunk_bytes: u64,
    read_bytes: impl Fn(usize, u64) -> usize,
    fail: impl Fn(usize) -> Option<BackendFailure>,
) -> (Vec<Step>, Option<(Status, u64)>) {
    let mut transfer = Staged::new(sub, chunk_bytes);
    let (mut steps, mut pieces) = (Vec::new(), 0);
    // Which halves hold a put not flushed yet.
    let mut unflushed = [false; 2];
    while let Some(step) = transfer.poll() {
        steps.push(step);
        assert!(steps.len() < 1000, "runaway: {steps:?}");
        match step {
            Step::Read { chunk, half } => {
                assert!(!unflushed[half], "half {half} overwritten before its put was flushed: {steps:?}");
                let k = pieces;
                pieces += 1;
                transfer.read(fail(k).map_or(Ok(read_bytes(k, chunk.length)), Err));
            }
            Step::Put { half, .. } => unflushed[half] = true,
            Step::Flush => unflushed = [false; 2],
            Step::Get { .. } => {}
            Step::Write { .. } => {
                let k = pieces;
                pieces += 1;
                transfer.wrote(fail(k).map_or(Ok(()), Err));
            }
            Step::Sync => transfer.synced(fail(pieces).map_or(Ok(()), Err)),
            Step::Done { status, result } => {
                assert_eq!(transfer.poll(), None, "nothing after done");
                return (steps, Some((status, result)));
            }
        }
    }
    (steps, None)
}

fn sub_at(opcode: Opcode, flags: u16, file_offset: u64, length: u64) -> Submission {
    Submission {
        opcode,
        flags,
        user_data: 1,
        handle: HANDLE,
        region_id: REGION,
        file_offset,
        region_offset: 1000,
        length,
    }
}

#[test]
fn a_staged_read_double_buffers_and_flushes_before_reusing_a_half() {
    let whole = |_, len: u64| len as usize;
    let (steps, end) = staged(sub_at(Opcode::Read, 0, 50, 350), 100, whole, |_| None);
    assert_eq!(end, Some((Status::Ok, 350)));
    let put = |half, len, region_offset| Step::Put { half, len, region_offset };
    let reads: Vec<(u64, usize)> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Read { chunk, half } => Some((chunk.file_offset, *half)),
            _ => None,
        })
        .collect();
    assert_eq!(reads, [(50, 0), (100, 1), (200, 0), (300, 1)], "chunks at file chunk boundaries, halves in turn");
    let puts: Vec<Step> = steps.iter().copied().filter(|s| matches!(s, Step::Put { .. })).collect();
    assert_eq!(puts, [put(0, 50, 1000), put(1, 100, 1050), put(0, 100, 1150), put(1, 100, 1250)]);
    assert_eq!(steps.iter().filter(|s| **s == Step::Flush).count(), 2, "one flush per reuse of a half");
    assert!(!steps.contains(&Step::Sync), "reads never sync");
}

#[test]
fn a_short_read_ends_the_request_at_the_end_of_the_file() {
    let eof_in_second = |k, len: u64| if k == 1 { 30 } else { len as usize };
    let (steps, end) = staged(sub_at(Opcode::Read, 0, 0, 400), 100, eof_in_second, |_| None);
    assert_eq!(end, Some((Status::Ok, 130)));
    assert_eq!(steps.iter().filter(|s| matches!(s, Step::Read { .. })).count(), 2);
    assert_eq!(steps[steps.len() - 2], Step::Put { half: 1, len: 30, region_offset: 1100 });
    let (steps, end) = staged(sub_at(Opcode::Read, 0, 0, 400), 100, |_, _| 0, |_| None);
    assert_eq!((steps.len(), end), (2, Some((Status::Ok, 0))), "nothing to put at all");
}

#[test]
fn a_staged_write_gets_flushes_then_writes_each_chunk_and_syncs_if_asked() {
    let (steps, end) = staged(sub_at(Opcode::Write, wire::FLAG_SYNC, 0, 150), 100, |_, _| 0, |_| None);
    assert_eq!(end, Some((Status::Ok, 150)));
    let kinds: Vec<&str> = steps
        .iter()
        .map(|s| match s {
            Step::Get { .. } => "get",
            Step::Flush => "flush",
            Step::Write { .. } => "write",
            Step::Sync => "sync",
            Step::Done { .. } => "done",
            Step::Read { .. } | Step::Put { .. } => "?",
        })
        .collect();
    assert_eq!(kinds, ["get", "flush", "write", "get", "flush", "write", "sync", "done"]);
}

#[test]
fn a_backend_failure_mid_transfer_ends_the_request_with_its_status_and_moves_nothing_more() {
    for (opcode, flags) in [(Opcode::Read, 0), (Opcode::Write, wire::FLAG_SYNC)] {
        // Pieces 0..4, and the sync of the write (piece 4).
        for at in 0..=4 {
            for failure in [BackendFailure::Unavailable, BackendFailure::Io, BackendFailure::Integrity] {
                let (steps, end) =
                    staged(sub_at(opcode, flags, 0, 400), 100, |_, len| len as usize, |k| (k == at).then_some(failure));
                let want = failure.status();
                if opcode == Opcode::Read && at == 4 {
                    assert_eq!(end, Some((Status::Ok, 400)), "a read has no piece 4");
                    continue;
                }
                assert_eq!(end, Some((want, 0)), "{opcode:?} failing at {at}");
                // The failed piece is the last one run (the sync, piece 4, follows 4 writes).
                let pieces_run = if at < 4 { at + 1 } else { 4 };
                let run = steps.iter().filter(|s| matches!(s, Step::Read { .. } | Step::Write { .. })).count();
                assert_eq!(run, pieces_run, "{opcode:?} failing at {at}");
                assert!(
                    matches!(steps[steps.len() - 2], Step::Read { .. } | Step::Write { .. } | Step::Sync),
                    "done right after the failed piece: {steps:?}"
                );
            }
        }
    }
}

fn stat(user_data: u64) -> wire::MetaSubmission {
    wire::MetaSubmission {
        opcode: wire::MetaOpcode::Stat,
        flags: 0,
        user_data,
        handle: 0,
        request_region: REGION,
        answer_region: REGION,
        request_offset: 0,
        answer_offset: 4096,
        request_length: 8,
        answer_length: 64,
        arg: 0,
    }
}

#[test]
fn metadata_entries_run_at_once_even_for_a_queued_tenant() {
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    host.submit(stat(1).encode());
    host.submit(read(2));
    let queued = Tenant::Queued { room: 8 };
    assert_eq!(agent.serve(&mut host, queued), Served::Finished { taken: 2, more: false, wake: true });
    assert!(matches!(agent.log[1], Action::Meta { cq_index: 0, meta } if meta == stat(1)));
    assert_eq!(agent.queued.len(), 1, "the read is queued, the stat is not");
    let c = host.reap();
    assert_eq!((c[0].user_data, c[0].status, c[0].result), (1, Status::Ok as i32, 64));
}

#[test]
fn hostile_metadata_entries_complete_with_their_status() {
    let (mut host, mut agent) = (HostRing::new(16), Driver::new(16));
    let s = stat(0);
    let cases = [
        (wire::MetaSubmission { user_data: 1, request_region: 9, ..s }.encode(), Status::BadRegion),
        (wire::MetaSubmission { user_data: 2, answer_region: 9, ..s }.encode(), Status::BadRegion),
        (wire::MetaSubmission { user_data: 3, answer_offset: (1 << 20) - 63, ..s }.encode(), Status::OutOfRange),
        (wire::MetaSubmission { user_data: 4, request_offset: u64::MAX - 2, ..s }.encode(), Status::OutOfRange),
        (wire::MetaSubmission { user_data: 5, answer_length: (1 << 20) + 64, ..s }.encode(), Status::TooLarge),
        (wire::MetaSubmission { user_data: 6, handle: 7, ..s }.encode(), Status::Malformed),
        (wire::MetaSubmission { user_data: 7, answer_length: 8, ..s }.encode(), Status::Malformed),
        (
            wire::MetaSubmission { user_data: 8, request_length: wire::MAX_META_REQUEST_BYTES + 1, ..s }.encode(),
            Status::Malformed,
        ),
    ];
    for (entry, _) in &cases {
        host.submit(*entry);
    }
    host.submit(stat(99).encode());
    assert!(matches!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: 9, .. }));
    let got: Vec<(u64, i32)> = host.reap().iter().map(|c| (c.user_data, c.status)).collect();
    let mut want: Vec<(u64, i32)> = cases.iter().map(|(e, st)| (Submission::peek_user_data(e), *st as i32)).collect();
    want.push((99, Status::Ok as i32));
    assert_eq!(got, want);
    assert_eq!(agent.log.iter().filter(|a| matches!(a, Action::Meta { .. })).count(), 1, "only the good one runs");
}

#[test]
fn a_removed_tenants_metadata_entries_are_cancelled() {
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    host.submit(stat(1).encode());
    assert_eq!(agent.serve(&mut host, Tenant::Removed), Served::Finished { taken: 1, more: false, wake: true });
    assert_eq!(host.reap()[0].status, Status::Cancelled as i32);
}

fn open_read(user_data: u64) -> wire::MetaSubmission {
    wire::MetaSubmission { opcode: wire::MetaOpcode::OpenRead, ..stat(user_data) }
}

/// The actions of `log` that ran an entry, as (kind, cq_index).
fn runs(log: &[Action]) -> Vec<(&'static str, u64)> {
    log.iter()
        .filter_map(|a| match a {
            Action::Offload { cq_index, .. } => Some(("workers", *cq_index)),
            Action::Meta { cq_index, .. } => Some(("here", *cq_index)),
            Action::Run { cq_index, .. } => Some(("run", *cq_index)),
            _ => None,
        })
        .collect()
}

#[test]
fn open_reads_with_entries_behind_them_go_to_the_workers_on_a_mapped_ring() {
    let (mut host, mut agent) = (HostRing::new(16), Driver::new(16));
    agent.memory = RingMemory::Mapped;
    for i in 0..3 {
        host.submit(open_read(i).encode());
    }
    host.submit(stat(3).encode());
    host.submit(open_read(4).encode());
    // The workers post the completions of what they take; the last runs here.
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: 5, more: false, wake: true });
    assert_eq!(runs(&agent.log), [("workers", 0), ("workers", 1), ("workers", 2), ("here", 3), ("here", 4)]);
    assert_eq!(host.reap().len(), 0, "slots 0..3 wait for the workers' completions");

    // Behind means published when the batch began: a batch cut at RING_BATCH still
    // has entries behind its last one.
    let (mut host, mut agent) = (HostRing::new(128), Driver::new(128));
    agent.memory = RingMemory::Mapped;
    for i in 0..RING_BATCH + 1 {
        host.submit(open_read(i).encode());
    }
    assert!(matches!(agent.serve(&mut host, UNLIMITED), Served::Finished { more: true, .. }));
    assert!(runs(&agent.log).iter().all(|(kind, _)| *kind == "workers"), "{:?}", runs(&agent.log));
}

#[test]
fn over_storage_that_may_stall_every_open_read_goes_to_the_workers_the_last_too() {
    let (mut host, mut agent) = (HostRing::new(16), Driver::new(16));
    agent.memory = RingMemory::MappedStalling;
    host.submit(open_read(0).encode());
    host.submit(stat(1).encode());
    host.submit(open_read(2).encode());
    agent.serve(&mut host, UNLIMITED);
    // The engine runs the stat only: it never waits on a read DAOS may hold.
    assert_eq!(runs(&agent.log), [("workers", 0), ("here", 1), ("workers", 2)]);

    // A range the workers cannot write still runs here, as on a mapped ring.
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    agent.memory = RingMemory::MappedStalling;
    host.submit(wire::MetaSubmission { answer_region: REMOTE_REGION, ..open_read(0) }.encode());
    agent.serve(&mut host, UNLIMITED);
    assert_eq!(runs(&agent.log), [("here", 0)]);
}

#[test]
fn open_reads_stay_here_on_a_remote_ring_or_with_a_remote_range() {
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    host.submit(open_read(0).encode());
    host.submit(open_read(1).encode());
    agent.serve(&mut host, UNLIMITED);
    assert_eq!(runs(&agent.log), [("here", 0), ("here", 1)], "the workers cannot post into a remote ring");

    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    agent.memory = RingMemory::Mapped;
    host.submit(wire::MetaSubmission { answer_region: REMOTE_REGION, ..open_read(0) }.encode());
    host.submit(wire::MetaSubmission { request_region: REMOTE_REGION, ..open_read(1) }.encode());
    host.submit(open_read(2).encode());
    agent.serve(&mut host, UNLIMITED);
    assert_eq!(runs(&agent.log), [("here", 0), ("here", 1), ("here", 2)], "the workers write mapped ranges only");
    assert_eq!(host.reap().iter().map(|c| c.user_data).collect::<Vec<_>>(), [0, 1, 2]);
}

#[test]
fn over_storage_that_may_stall_a_remote_rings_open_reads_go_to_the_workers() {
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    agent.memory = RingMemory::RemoteStalling;
    host.submit(open_read(0).encode());
    host.submit(stat(1).encode());
    host.submit(wire::MetaSubmission { answer_region: REMOTE_REGION, ..open_read(2) }.encode());
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: 3, more: false, wake: true });
    // Through staged-I/O slots: the ranges need not be mapped; the engine runs the stat only.
    assert_eq!(runs(&agent.log), [("workers", 0), ("here", 1), ("workers", 2)]);
    assert_eq!(
        host.reap().iter().map(|c| c.user_data).collect::<Vec<_>>(),
        [] as [u64; 0],
        "slot 0 waits for the workers"
    );
}

#[test]
fn a_worker_tenants_metadata_entries_all_go_off_the_engine_where_their_memory_allows() {
    let close = |user_data| wire::MetaSubmission {
        opcode: wire::MetaOpcode::Close,
        handle: 7,
        request_region: 0,
        request_length: 0,
        ..stat(user_data)
    };
    // A put/get ring: every metadata entry, through staged-I/O slots; payload as before.
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    (agent.memory, agent.every_meta) = (RingMemory::RemoteStalling, true);
    host.submit(stat(0).encode());
    host.submit(open_read(1).encode());
    host.submit(close(2).encode());
    host.submit(read(3));
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: 4, more: false, wake: true });
    assert_eq!(runs(&agent.log), [("workers", 0), ("workers", 1), ("workers", 2), ("run", 3)]);

    // A mapped ring: the last entry too (the engine never waits for a worker), but an
    // answer range the threads cannot write runs here; a request of no bytes needs no
    // range at all.
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    (agent.memory, agent.every_meta) = (RingMemory::MappedStalling, true);
    host.submit(wire::MetaSubmission { answer_region: REMOTE_REGION, ..stat(0) }.encode());
    host.submit(close(1).encode());
    host.submit(stat(2).encode());
    agent.serve(&mut host, UNLIMITED);
    assert_eq!(runs(&agent.log), [("here", 0), ("workers", 1), ("workers", 2)]);
    assert_eq!(host.reap().iter().map(|c| c.user_data).collect::<Vec<_>>(), [0], "1 and 2 wait for their threads");

    // Without it, the stat and the close run here.
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    agent.memory = RingMemory::MappedStalling;
    host.submit(stat(0).encode());
    host.submit(close(1).encode());
    agent.serve(&mut host, UNLIMITED);
    assert_eq!(runs(&agent.log), [("here", 0), ("here", 1)]);
}

#[test]
fn an_open_read_the_workers_do_not_take_runs_here_in_its_slot() {
    let (mut host, mut agent) = (HostRing::new(8), Driver::new(8));
    agent.memory = RingMemory::Mapped;
    agent.workers_take = false;
    host.submit(open_read(7).encode());
    host.submit(read(8));
    assert_eq!(agent.serve(&mut host, UNLIMITED), Served::Finished { taken: 2, more: false, wake: true });
    assert_eq!(runs(&agent.log), [("workers", 0), ("here", 0), ("run", 1)]);
    let c = host.reap();
    assert_eq!(c.iter().map(|c| (c.user_data, c.seq)).collect::<Vec<_>>(), [(7, 1), (8, 2)]);
    assert!(agent.refusals.is_empty(), "both ran: counted as they ran");
}

#[test]
fn refusals_are_counted_with_the_entrys_opcode_and_metadata_ones_as_unknown() {
    let (mut host, mut agent) = (HostRing::new(16), Driver::new(16));
    let write = Submission { opcode: Opcode::Write, handle: 99, ..Submission::decode(&read(1)).unwrap() };
    host.submit(write.encode());
    host.submit(wire::MetaSubmission { answer_region: 9, ..stat(2) }.encode());
    agent.serve(&mut host, UNLIMITED);
    assert_eq!(agent.refusals, [(1, Some(Opcode::Write), Status::BadHandle), (2, None, Status::BadRegion)]);
    host.reap();
    host.submit(read(3));
    host.submit(stat(4).encode());
    agent.serve(&mut host, Tenant::Removed);
    assert_eq!(agent.refusals[2..], [(3, Some(Opcode::Read), Status::Cancelled), (4, None, Status::Cancelled)]);
}

#[test]
fn a_rings_tenant_is_removed_direct_or_queued() {
    assert_eq!(Tenant::of(None, true), Tenant::Removed);
    assert_eq!(Tenant::of(Some(3), true), Tenant::Direct { room: 3 });
    assert_eq!(Tenant::of(Some(0), false), Tenant::Queued { room: 0 });
}
