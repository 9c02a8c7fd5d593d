//! The host's ring core against a ring in a plain byte vector, the test playing the
//! agent: each test runs in microseconds.

use std::time::{Duration, Instant};

use super::meta::{self, Answer, MetaCall, Range};
use super::session::{self, RingState};
use super::wait::{self, Idle, Quiet, Sleep, Waiter};
use super::*;
use crate::wire::{MetaOpcode, Opcode, Status, Submission};

/// A ring's memory and its host core, as the shim's driver keeps them.
struct Mem {
    ring: HostRing,
    bytes: Vec<u8>,
}

impl Mem {
    fn new(entries: u32) -> Mem {
        Mem::at(entries, 0)
    }

    fn at(entries: u32, start: u64) -> Mem {
        Mem { ring: HostRing::starting_at(entries, start), bytes: vec![0; wire::ring_bytes(entries)] }
    }

    fn push(&mut self, user_data: u64) -> Result<(), PushError> {
        let pushed = self.ring.push(&read(user_data), true)?;
        self.write(pushed);
        Ok(())
    }

    fn write(&mut self, p: Pushed) {
        self.bytes[p.offset..p.offset + SQE_BYTES].copy_from_slice(&p.bytes);
    }

    /// The entry the agent finds at submission index `index`.
    fn entry(&self, index: u64) -> [u8; SQE_BYTES] {
        let at = wire::sqe_offset(self.ring.entries(), index);
        self.bytes[at..at + SQE_BYTES].try_into().unwrap()
    }

    /// The agent posts a completion at completion index `index`, echoing `echo`.
    fn post(&mut self, index: u64, echo: u64, result: u64) {
        let c = Completion { user_data: echo, status: 0, result, seq: index.wrapping_add(1) };
        let at = wire::cqe_offset(self.ring.entries(), index);
        self.bytes[at..at + CQE_BYTES].copy_from_slice(&c.encode());
    }

    /// What the driver's poll does: every completion that is there, in ring order.
    fn poll(&mut self) -> Vec<Completion> {
        let mut out = Vec::new();
        while let Some(next) = self.ring.next_completion() {
            let seq = u64::from_le_bytes(self.bytes[next.seq_offset..next.seq_offset + 8].try_into().unwrap());
            if seq != next.seq {
                break;
            }
            let bytes = self.bytes[next.offset..next.offset + CQE_BYTES].try_into().unwrap();
            let Some(reaped) = self.ring.reap(&bytes) else { break };
            out.push(reaped.completion);
        }
        out
    }
}

fn read(user_data: u64) -> [u8; SQE_BYTES] {
    Submission {
        opcode: Opcode::Read,
        flags: 0,
        user_data,
        handle: 7,
        region_id: 1,
        file_offset: 0,
        region_offset: 0,
        length: 4096,
    }
    .encode()
}

fn user_data(entry: &[u8; SQE_BYTES]) -> u64 {
    Submission::peek_user_data(entry)
}

#[test]
fn entries_go_out_tagged_with_their_slot_and_come_back_with_the_callers_user_data() {
    let mut m = Mem::new(4);
    let t0 = Instant::now();
    for u in [100, 101, 102] {
        m.push(u).unwrap();
    }
    assert_eq!((m.ring.in_flight(), m.ring.staged(), m.ring.submitted(), m.ring.room()), (3, 3, 0, 1));
    let tags: Vec<u64> = (0..3).map(|i| user_data(&m.entry(i))).collect();
    assert_eq!(tags, [0, 1, 2], "the slots go out as user_data");
    assert_eq!(m.ring.submit(t0), Submit { count: 3, sq_tail: 3 });
    assert_eq!(m.ring.submit(t0), Submit { count: 0, sq_tail: 3 }, "nothing staged: no doorbell");
    // The agent answers out of order (completions take the next CQ slot, whichever entry).
    m.post(0, tags[2], 30);
    m.post(1, tags[0], 10);
    let done = m.poll();
    assert_eq!(done.iter().map(|c| (c.user_data, c.result)).collect::<Vec<_>>(), [(102, 30), (100, 10)]);
    assert_eq!(m.ring.next_completion().map(|n| n.seq), Some(3));
    m.post(2, tags[1], 20);
    assert_eq!(m.poll()[0].user_data, 101);
    assert_eq!((m.ring.in_flight(), m.ring.room()), (0, 4));
    assert!(HostRing::needs_doorbell(0) && !HostRing::needs_doorbell(1));
}

#[test]
fn a_completion_is_taken_only_when_its_seq_word_is_the_one_expected() {
    let mut m = Mem::new(2);
    let t0 = Instant::now();
    // One lap: entries 0 and 1 complete, so the CQ holds seq 1 and 2.
    for u in 0..2 {
        m.push(u).unwrap();
    }
    m.ring.submit(t0);
    m.post(0, 0, 0);
    m.post(1, 1, 0);
    assert_eq!(m.poll().len(), 2);
    // Index 2 reuses slot 0, whose seq (1) is a lap old: not taken.
    m.push(2).unwrap();
    m.ring.submit(t0);
    assert!(m.poll().is_empty(), "a completion of the previous lap");
    let next = m.ring.next_completion().unwrap();
    assert_eq!((next.offset, next.seq), (wire::cqe_offset(2, 2), 3));
    // Bytes whose own seq disagrees (torn, or rewritten after the word was read).
    let mut torn = Completion { user_data: 0, status: 0, result: 0, seq: 9 }.encode();
    assert_eq!(m.ring.reap(&torn), None);
    torn[wire::CQE_SEQ_OFFSET..].copy_from_slice(&3u64.to_le_bytes());
    assert_eq!(m.ring.reap(&torn).map(|r| r.cq_head), Some(3));
}

#[test]
fn completions_for_nothing_in_flight_or_for_unpublished_entries_are_not_taken() {
    // Regression: a completion posted where nothing was submitted used to be taken,
    // which made the host's in-flight count wrap.
    let mut m = Mem::new(4);
    m.post(0, 0, 1);
    assert!(m.ring.next_completion().is_none());
    assert!(m.ring.reap(&Completion { user_data: 0, status: 0, result: 0, seq: 1 }.encode()).is_none());
    assert!(m.poll().is_empty());
    // An entry pushed but not published cannot have completed either.
    m.push(5).unwrap();
    assert!(m.poll().is_empty(), "not published");
    m.ring.submit(Instant::now());
    assert_eq!(m.poll()[0].user_data, 5);
}

#[test]
fn counters_wrap_past_u64_max() {
    let mut m = Mem::at(4, u64::MAX - 5);
    let t0 = Instant::now();
    for u in 0..40u64 {
        m.push(u).unwrap();
        m.ring.submit(t0);
        let index = (u64::MAX - 5).wrapping_add(u);
        m.post(index, user_data(&m.entry(index)), u);
        let done = m.poll();
        assert_eq!(done.len(), 1, "entry {u}");
        assert_eq!((done[0].user_data, done[0].result), (u, u));
    }
    assert_eq!(m.ring.in_flight(), 0);
}

#[test]
fn a_full_ring_refuses_and_an_echo_of_no_slot_is_answered_as_said() {
    let mut m = Mem::new(2);
    m.push(1).unwrap();
    m.push(2).unwrap();
    assert_eq!(m.push(3), Err(PushError::Full));
    m.ring.submit(Instant::now());
    // The agent echoes values that name no slot: answered as it said, slots stay held.
    m.post(0, 77, 0);
    assert_eq!(m.poll()[0].user_data, 77);
    assert_eq!(m.push(3), Err(PushError::NoSlot), "a slot is free in the ring, none in the table");
    // Once nothing is in flight, the held slots are freed.
    m.post(1, 78, 0);
    assert_eq!(m.poll()[0].user_data, 78);
    m.push(3).unwrap();
    m.push(4).unwrap();
}

#[test]
fn withdrawn_entries_leave_the_ring_as_it_was() {
    let mut m = Mem::new(4);
    m.push(1).unwrap();
    m.ring.submit(Instant::now());
    m.push(2).unwrap();
    m.push(3).unwrap();
    m.ring.withdraw_staged();
    assert_eq!((m.ring.in_flight(), m.ring.staged(), m.ring.submitted()), (1, 0, 1));
    m.push(4).unwrap();
    m.push(5).unwrap();
    m.push(6).unwrap();
    assert_eq!(m.push(7), Err(PushError::Full), "the withdrawn slots are free again, not more");
}

#[test]
fn a_slot_held_by_a_misechoed_entry_is_freed_once_a_withdrawal_leaves_nothing_in_flight() {
    // Found while modelling the ring for the host_ring fuzz target: an entry whose
    // completion echoed another value kept its slot when the staged entries behind it
    // were withdrawn and nothing was left in flight; no reap would free it, so each such
    // echo cost the ring a slot for good (a one-entry ring refused every later push).
    let mut m = Mem::new(2);
    m.push(1).unwrap();
    m.ring.submit(Instant::now());
    m.push(2).unwrap(); // staged
    m.post(0, 77, 0);
    assert_eq!(m.poll()[0].user_data, 77);
    assert_eq!((m.ring.in_flight(), m.ring.staged()), (1, 1), "entry 1's slot is still held");
    m.ring.withdraw_staged();
    assert_eq!(m.ring.in_flight(), 0);
    m.push(3).unwrap();
    m.push(4).unwrap();
    assert_eq!(m.push(5), Err(PushError::Full), "both slots are free again, not more");
}

#[test]
fn a_session_move_resubmits_what_can_move_in_order_and_loses_the_rest() {
    let mut old = Mem::new(4);
    let pushed = |m: &mut Mem, u: u64, movable: bool| {
        let p = m.ring.push(&read(u), movable).unwrap();
        m.write(p);
    };
    pushed(&mut old, 10, true);
    pushed(&mut old, 11, false);
    old.ring.submit(Instant::now());
    pushed(&mut old, 12, true); // staged, never published
    let mut new = Mem::new(4);
    let moved = session::resubmit(old.ring.drain(), &mut new.ring);
    assert_eq!(moved.lost, [11]);
    assert_eq!(moved.writes.len(), 2);
    for w in moved.writes {
        new.write(w);
    }
    assert_eq!(new.ring.submit(Instant::now()).count, 2);
    assert_eq!((user_data(&new.entry(0)), user_data(&new.entry(1))), (0, 1), "slots of the new ring");
    new.post(0, 1, 0);
    new.post(1, 0, 0);
    assert_eq!(new.poll().iter().map(|c| c.user_data).collect::<Vec<_>>(), [12, 10]);
    assert_eq!(old.ring.staged(), 0);
    assert!(old.ring.drain().is_empty(), "the old ring holds nothing");
    // A shorter new ring loses what does not fit.
    let mut old = Mem::new(4);
    for u in 0..3 {
        pushed(&mut old, u, true);
    }
    let moved = session::resubmit(old.ring.drain(), &mut HostRing::new(2));
    assert_eq!((moved.writes.len(), moved.lost), (2, vec![2]));
}

#[test]
fn the_latency_is_a_moving_average_from_publication_to_completion() {
    let mut m = Mem::new(4);
    let t0 = Instant::now();
    let us = Duration::from_micros;
    assert_eq!((m.ring.latency(), m.ring.waiting_for(t0)), (Duration::ZERO, None));
    m.push(1).unwrap();
    m.push(2).unwrap();
    m.ring.submit(t0);
    assert_eq!(m.ring.waiting_for(t0 + us(3)), Some(us(3)));
    m.post(0, 0, 0);
    m.poll();
    m.ring.completed(t0 + us(80));
    assert_eq!(m.ring.latency(), us(80), "the first sample is the average");
    assert_eq!(m.ring.waiting_for(t0 + us(90)), Some(us(10)), "restarted: one is still in flight");
    m.post(1, 1, 0);
    m.poll();
    m.ring.completed(t0 + us(96));
    assert_eq!(m.ring.latency(), (us(80) * 7 + us(16)) / 8);
    assert_eq!(m.ring.waiting_for(t0 + us(100)), None, "nothing in flight");
    m.ring.completed(t0 + us(200));
    assert_eq!(m.ring.latency(), (us(80) * 7 + us(16)) / 8, "no publication, no sample");
}

#[test]
fn a_waiter_spins_briefly_then_sleeps_in_growing_steps() {
    let ring = HostRing::new(4);
    let t0 = Instant::now();
    let mut w = Waiter::new(t0, Duration::from_secs(1), Duration::ZERO, &ring);
    for _ in 1..wait::SPIN_POLLS {
        assert_eq!(w.idle(|| t0), Idle::Spin);
    }
    let mut steps = Vec::new();
    for _ in 0..8 {
        assert_eq!(w.idle(|| t0), Idle::Sleep);
        let Sleep::For(d) = w.sleep(t0, false, &ring) else { panic!("no futex") };
        steps.push(d.as_micros());
    }
    assert_eq!(steps, [5, 10, 20, 40, 80, 160, 160, 160]);
    assert_eq!(w.sleep(t0, true, &ring), Sleep::Futex(wait::MAX_SLEEP), "at most 100 ms at a time");
    let near = t0 + Duration::from_millis(990);
    assert_eq!(w.sleep(near, true, &ring), Sleep::Futex(Duration::from_millis(10)), "never past the deadline");
    assert!(!w.expired(t0 + Duration::from_secs(1)) && w.expired(t0 + Duration::from_millis(1001)));
    w.progressed();
    assert_eq!(w.idle(|| t0), Idle::Spin, "after a completion, a spin again");
    w.restart(t0 + Duration::from_secs(5));
    assert!(!w.expired(t0 + Duration::from_secs(5)), "a moved wait has its whole timeout again");
}

#[test]
fn a_waiter_sleeps_most_of_a_long_latency_at_once_and_metadata_calls_spin_longer() {
    let us = Duration::from_micros;
    let t0 = Instant::now();
    let mut m = Mem::new(4);
    m.push(1).unwrap();
    m.ring.submit(t0);
    m.post(0, 0, 0);
    m.poll();
    m.ring.completed(t0 + us(400)); // a usual latency of 400 us
    m.push(2).unwrap();
    let t1 = t0 + us(1000);
    m.ring.submit(t1);
    // The next completion is far off: no spin, and the first sleep is half the latency,
    // less what has passed since the submission.
    let mut w = Waiter::new(t1, Duration::from_secs(1), Duration::ZERO, &m.ring);
    assert_eq!(w.idle(|| t1), Idle::Sleep);
    assert_eq!(w.sleep(t1 + us(50), false, &m.ring), Sleep::For(us(150)));
    assert_eq!(w.sleep(t1 + us(190), false, &m.ring), Sleep::For(us(5)), "too little left: a step");
    // A metadata call polls for its whole spin before the first sleep.
    let mut w = Waiter::new(t1, Duration::from_secs(1), meta::SPIN, &HostRing::new(4));
    for _ in 0..100 {
        assert_eq!(w.idle(|| t1 + us(49)), Idle::Spin);
    }
    assert_eq!(w.idle(|| t1 + us(50)), Idle::Sleep);
}

#[test]
fn a_quiet_wait_probes_the_agent_once_per_spell() {
    let (t0, ms) = (Instant::now(), Duration::from_millis);
    let mut q = Quiet::default();
    assert!(!q.probe(t0, ms(500)));
    assert!(!q.probe(t0 + ms(499), ms(500)));
    assert!(q.probe(t0 + ms(500), ms(500)));
    assert!(!q.probe(t0 + ms(900), ms(500)), "the spell starts again after a probe");
    q.heard();
    assert!(!q.probe(t0 + ms(2000), ms(500)));
}

#[test]
fn the_agents_closed_word_decides_whether_a_wait_goes_on() {
    assert_eq!(RingState::of(0, true), RingState::Served);
    assert_eq!(RingState::of(wire::RING_CLOSED_STOPPING, true), RingState::Stopping);
    assert_eq!(RingState::of(wire::RING_CLOSED_STOPPING, false), RingState::Ended);
    assert_eq!(RingState::of(wire::RING_CLOSED_ENDED, true), RingState::Ended);
    assert_eq!(RingState::of(77, true), RingState::Ended);
}

#[test]
fn metadata_areas_follow_the_ring_page_aligned() {
    assert_eq!(meta::request_offset(128), 16384, "320 + 128 * 96 = 12608, rounded up to a page");
    assert_eq!(meta::answer_offset(128), 16384 + 64 * 1024);
    assert_eq!(meta::region_bytes(128), 16384 + 64 * 1024 + 512 * 1024);
    assert_eq!(meta::request_offset(2) % 4096, 0);
}

#[test]
fn metadata_entries_carry_their_request_and_answer_ranges() {
    let call = MetaCall { opcode: MetaOpcode::Stat, flags: 0, handle: 0, strings: &["/a"], arg: 0 };
    let request = call.request().unwrap();
    let e = call.entry(
        Range { region: 3, offset: 8192, length: request.len() as u32 },
        Range { region: 3, offset: 9000, length: 64 },
    );
    assert_eq!((e.request_region, e.request_offset, e.request_length), (3, 8192, 4));
    assert_eq!((e.answer_region, e.answer_offset, e.answer_length), (3, 9000, 64));
    assert_eq!(wire::MetaSubmission::decode(&e.encode()), Ok(e));
    let close = MetaCall { opcode: MetaOpcode::Close, flags: 0, handle: 9, strings: &[], arg: 0 };
    let e = close.entry(Range { region: 3, offset: 8192, length: 0 }, Range { region: 3, offset: 9000, length: 64 });
    assert_eq!((e.request_region, e.request_offset), (0, 0), "no request range without a request");
    assert_eq!(wire::MetaSubmission::decode(&e.encode()), Ok(e));
    let long = "x".repeat(meta::REQUEST_BYTES);
    assert!(MetaCall { strings: &[&long[..60_000], &long[..60_000]], ..call }.request().is_none());
    assert!(call.runs_again() && call.spin() == meta::SPIN);
    let exclusive = MetaCall { opcode: MetaOpcode::Create, flags: wire::META_EXCLUSIVE, ..call };
    assert!(!exclusive.runs_again());
    assert!(MetaCall { opcode: MetaOpcode::Create, ..call }.runs_again());
    assert!(!MetaCall { opcode: MetaOpcode::Remove, ..call }.runs_again(), "a remove that ran would then fail");
    assert_eq!(MetaCall { opcode: MetaOpcode::OpenRead, ..call }.spin(), Duration::ZERO);
}

#[test]
fn metadata_calls_spin_only_where_answers_usually_come_within_the_spin() {
    let call = MetaCall { opcode: MetaOpcode::Stat, flags: 0, handle: 0, strings: &["/f"], arg: 0 };
    let latency = meta::MetaLatency::default();
    assert_eq!(latency.spin(&call), meta::SPIN, "no answer yet: spin");
    latency.answered(Duration::from_micros(22));
    assert_eq!(latency.spin(&call), meta::SPIN, "local answers in 22 us");
    for _ in 0..20 {
        latency.answered(Duration::from_micros(240));
    }
    assert_eq!(latency.spin(&call), Duration::ZERO, "DAOS answers in 240 us: sleep at once");
    // Sleeping adds a wake-up to each answer; a backend fast again is seen as fast.
    for _ in 0..30 {
        latency.answered(Duration::from_micros(30));
    }
    assert_eq!(latency.spin(&call), meta::SPIN);
    let open_read = MetaCall { opcode: MetaOpcode::OpenRead, ..call };
    assert_eq!(latency.spin(&open_read), Duration::ZERO, "an open-read moves a file: never spins");
}

#[test]
fn groups_fit_the_ring_and_the_request_area() {
    assert_eq!(meta::group(&[10; 9], 4), 4);
    assert_eq!(meta::group(&[10; 3], 4), 3);
    assert_eq!(meta::group(&[10; 3], 0), 1, "at least one entry");
    assert_eq!(meta::group(&[40_000, 40_000, 10], 8), 1, "the request area");
    assert_eq!(meta::group(&[], 8), 0);
    let paths: Vec<String> = (0..5000).map(|i| format!("/d/{i:04}")).collect();
    assert_eq!(meta::lookup_group(&paths, 100), 100, "the agent's limit");
    assert_eq!(meta::lookup_group(&paths, 10_000), meta::ANSWER_BYTES / 256, "the answer area");
    let big = vec!["y".repeat(30_000); 4];
    assert_eq!(meta::lookup_group(&big, 10), 2, "the request area");
    assert_eq!(meta::lookup_group(&["z".repeat(meta::REQUEST_BYTES)], 10), 0, "one path too long for it");
}

#[test]
fn answers_are_read_as_their_completion_says() {
    assert_eq!(Answer::of(Ok(64), 64), Answer::Written(64));
    assert_eq!(Answer::of(Ok(65), 64), Answer::TooLong(65));
    assert_eq!(Answer::of(Err(Status::Refused), 64), Answer::Refused);
    assert_eq!(Answer::of(Err(Status::Refused), 7), Answer::Failed(Status::Refused), "no room for a record");
    assert_eq!(Answer::of(Err(Status::Lost), 64), Answer::Failed(Status::Lost));
    let record = wire::MetaError { code: wire::CodeWord::default(), message: "m".repeat(100) }.encode(1000);
    let head: [u8; 8] = record[..8].try_into().unwrap();
    assert_eq!(meta::refusal_bytes(&head, 1000), 108);
    assert_eq!(meta::refusal_bytes(&head, 64), 64, "cut to the range");
}
