//! The host's side of a ring (`dpuio_proto::host_ring`) driven against an agent that
//! writes anything into the completion queue: honest completions, echoes of other
//! entries or of nothing, wrong `seq` words, torn entries, completions for entries never
//! published. The other side of `ring_indices` (the agent's checks of what a host
//! writes). Whatever the agent writes:
//! - the host's counters never claim more in flight than the ring holds, and a push
//!   fails only when the ring is full or (with entries in flight) every slot is held;
//! - a completion is taken only for a published entry, and only when its `seq` word is
//!   the one expected next; every offset the core names lies in its queue;
//! - an echo of a held slot gives back that entry's caller `user_data`, once; any other
//!   echo is handed on as the agent wrote it;
//! - a session move resubmits the unfinished entries in the order they were pushed, or
//!   reports them lost, and loses none silently;
//! - a waiter's sleep never exceeds the longest sleep nor passes its deadline.
#![no_main]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dpuio_fuzz::Input;
use dpuio_proto::host_ring::wait::{self, Idle, Sleep, Waiter};
use dpuio_proto::host_ring::{HostRing, PushError, Pushed, session};
use dpuio_proto::wire::{self, CQE_BYTES, Completion, Opcode, SQE_BYTES, Submission};
use libfuzzer_sys::fuzz_target;

/// The caller's `user_data` values: far above any slot number, so that an echo of a
/// slot and a caller's value are told apart.
const CALLER: u64 = 1 << 63;

/// A ring in a byte vector, its host core, and what the host expects of it.
struct Model {
    ring: HostRing,
    mem: Vec<u8>,
    /// The slot each unfinished entry holds (its tag on the wire) and its caller's
    /// `user_data`.
    held: HashMap<u64, u64>,
    /// Order of pushing per caller `user_data` (kept across a session move).
    order: HashMap<u64, u64>,
    pushes: u64,
    /// Where the agent posts its next completion (it keeps its own counter).
    agent_cq_tail: u64,
}

impl Model {
    fn new(entries: u32, start: u64) -> Model {
        Model {
            ring: HostRing::starting_at(entries, start),
            mem: vec![0; wire::ring_bytes(entries)],
            held: HashMap::new(),
            order: HashMap::new(),
            pushes: 0,
            agent_cq_tail: start,
        }
    }

    fn entries(&self) -> u32 {
        self.ring.entries()
    }

    /// Write an entry the core pushed, checking where it goes; returns its tag.
    fn write(&mut self, p: Pushed) -> u64 {
        let sq = wire::SQ_OFFSET..wire::SQ_OFFSET + self.entries() as usize * SQE_BYTES;
        assert!(sq.contains(&p.offset) && p.offset + SQE_BYTES <= sq.end, "an entry outside the SQ");
        self.mem[p.offset..p.offset + SQE_BYTES].copy_from_slice(&p.bytes);
        let tag = Submission::peek_user_data(&p.bytes);
        assert!(tag < u64::from(self.entries()), "an entry goes out tagged with its slot");
        tag
    }

    fn push(&mut self, movable: bool) {
        let user_data = CALLER | self.pushes;
        self.pushes += 1;
        let entry = Submission {
            opcode: Opcode::Read,
            flags: 0,
            user_data,
            handle: 7,
            region_id: 1,
            file_offset: 0,
            region_offset: 0,
            length: 4096,
        }
        .encode();
        let (room, in_flight) = (self.ring.room(), self.ring.in_flight());
        match self.ring.push(&entry, movable) {
            Ok(p) => {
                assert!(room > 0);
                let tag = self.write(p);
                assert!(self.held.insert(tag, user_data).is_none(), "a slot handed out twice");
                self.order.insert(user_data, self.pushes);
            }
            Err(PushError::Full) => assert_eq!(room, 0, "full with room left"),
            Err(PushError::NoSlot) => assert!(room > 0 && in_flight > 0, "no slot with nothing in flight"),
        }
    }

    fn submit(&mut self, now: Instant) {
        let staged = self.ring.staged();
        let s = self.ring.submit(now);
        assert_eq!(s.count, staged);
        assert_eq!(self.ring.staged(), 0);
    }

    /// The agent writes `bytes` as the completion at its next index.
    fn post(&mut self, bytes: [u8; CQE_BYTES]) {
        let at = wire::cqe_offset(self.entries(), self.agent_cq_tail);
        self.mem[at..at + CQE_BYTES].copy_from_slice(&bytes);
        self.agent_cq_tail = self.agent_cq_tail.wrapping_add(1);
    }

    /// What the driver's poll does: take every completion that is there.
    fn poll(&mut self, now: Instant) {
        let mut took = false;
        while let Some(next) = self.ring.next_completion() {
            assert!(self.ring.submitted() > 0, "a completion due with nothing published");
            let cq_start = wire::SQ_OFFSET + self.entries() as usize * SQE_BYTES;
            assert!(
                next.offset >= cq_start && next.offset + CQE_BYTES <= self.mem.len(),
                "a completion outside the CQ"
            );
            assert_eq!(next.seq_offset, next.offset + wire::CQE_SEQ_OFFSET);
            let seq = u64::from_le_bytes(self.mem[next.seq_offset..next.seq_offset + 8].try_into().unwrap());
            if seq != next.seq {
                break;
            }
            let bytes: [u8; CQE_BYTES] = self.mem[next.offset..next.offset + CQE_BYTES].try_into().unwrap();
            let (in_flight, submitted) = (self.ring.in_flight(), self.ring.submitted());
            let Some(reaped) = self.ring.reap(&bytes) else {
                // Only a completion the decoder refuses is left where it is.
                assert!(Completion::decode(&bytes).is_err(), "a completion with the expected seq not taken");
                break;
            };
            took = true;
            assert_eq!(self.ring.in_flight(), in_flight - 1);
            assert_eq!(self.ring.submitted(), submitted - 1);
            let echo = Completion::decode(&bytes).unwrap().user_data;
            match self.held.remove(&echo) {
                Some(caller) => assert_eq!(reaped.completion.user_data, caller, "the echo of a held slot"),
                None => assert_eq!(reaped.completion.user_data, echo, "another echo is handed on"),
            }
            if self.ring.in_flight() == 0 {
                // Nothing in flight: slots still held by entries whose completions echoed
                // something else are free again.
                self.held.clear();
            }
        }
        if took {
            self.ring.completed(now);
        }
    }

    fn withdraw(&mut self) {
        let (in_flight, staged) = (self.ring.in_flight(), self.ring.staged());
        self.ring.withdraw_staged();
        assert_eq!(self.ring.in_flight(), in_flight - staged);
        // The newest entries held go: the staged ones, unless an agent's echo of a staged
        // slot freed one of them early (then an older entry's slot goes instead, and its
        // completion is handed on as the agent wrote it).
        let mut newest: Vec<(u64, u64)> = self.held.iter().map(|(&tag, u)| (self.order[u], tag)).collect();
        newest.sort_unstable_by(|a, b| b.cmp(a));
        for (_, tag) in newest.into_iter().take(staged as usize) {
            self.held.remove(&tag);
        }
        if self.ring.in_flight() == 0 {
            self.held.clear(); // nothing in flight: every slot is free again
        }
    }

    /// The agent restarted: the unfinished entries go to a new ring of `entries`.
    fn move_to(&mut self, entries: u32, now: Instant) {
        let pending = self.ring.drain();
        assert_eq!((self.ring.staged(), self.ring.in_flight() >= self.ring.submitted()), (0, true));
        let mut want: Vec<u64> = self.held.values().copied().collect();
        want.sort_by_key(|u| self.order[u]);
        let got: Vec<u64> = pending.iter().map(|p| p.user_data).collect();
        assert_eq!(got, want, "every unfinished entry, oldest first");
        // Movable entries go while the new ring has room; the rest are lost.
        let (mut going, mut lost) = (Vec::new(), Vec::new());
        for p in &pending {
            if p.movable && (going.len() as u64) < u64::from(entries) {
                going.push(p.user_data);
            } else {
                lost.push(p.user_data);
            }
        }
        let mut new = Model::new(entries, 0);
        new.order = std::mem::take(&mut self.order);
        new.pushes = self.pushes;
        let moved = session::resubmit(pending, &mut new.ring);
        assert_eq!(moved.lost, lost, "lost in order, none silently");
        assert_eq!(moved.writes.len(), going.len());
        for (write, caller) in moved.writes.into_iter().zip(going) {
            let tag = new.write(write);
            assert!(new.held.insert(tag, caller).is_none(), "a slot handed out twice");
        }
        new.submit(now);
        *self = new;
    }
}

fuzz_target!(|b: &[u8]| {
    let mut input = Input(b);
    let entries = 1u32 << (input.u8() % 5);
    // Counters from 0, just below their wrap past u64::MAX, or anywhere.
    let start = match input.u8() % 3 {
        0 => 0,
        1 => u64::MAX - 3,
        _ => input.u64(),
    };
    let mut m = Model::new(entries, start);
    let t0 = Instant::now();
    let mut now = t0;
    for _ in 0..256 {
        if input.0.is_empty() {
            break;
        }
        now += Duration::from_micros(u64::from(input.u8()));
        match input.u8() % 8 {
            0 => {
                let movable = input.u8() & 1 == 0;
                m.push(movable);
            }
            1 => m.submit(now),
            2 => {
                // An honest agent: the next submission's tag, the seq it should carry.
                let index = m.agent_cq_tail;
                let at = wire::sqe_offset(m.entries(), index);
                let entry: [u8; SQE_BYTES] = m.mem[at..at + SQE_BYTES].try_into().unwrap();
                let tag = Submission::peek_user_data(&entry);
                let c = Completion { user_data: tag, status: 0, result: 4096, seq: index.wrapping_add(1) };
                m.post(c.encode());
            }
            3 => {
                // Any echo, status and seq.
                let c = Completion {
                    user_data: if input.u8() & 1 == 0 { u64::from(input.u8()) } else { input.u64() },
                    status: i32::from(input.u8() as i8),
                    result: input.u64(),
                    seq: if input.u8() & 1 == 0 { m.agent_cq_tail.wrapping_add(1) } else { input.u64() },
                };
                m.post(c.encode());
            }
            4 => {
                // Raw bytes anywhere in the CQ (a torn or garbled entry).
                let slot = u64::from(input.u8());
                let at = wire::cqe_offset(m.entries(), slot);
                let mut bytes = [0u8; CQE_BYTES];
                for b in &mut bytes {
                    *b = input.u8();
                }
                m.mem[at..at + CQE_BYTES].copy_from_slice(&bytes);
            }
            5 => m.poll(now),
            6 => {
                if input.u8() & 1 == 0 {
                    m.withdraw();
                } else {
                    m.move_to(1 << (input.u8() % 5), now);
                }
            }
            _ => {
                let timeout = Duration::from_micros(u64::from(input.u16()));
                let spin = Duration::from_micros(u64::from(input.u8()));
                let mut w = Waiter::new(now, timeout, spin, &m.ring);
                let mut at = now;
                for _ in 0..wait::SPIN_POLLS + 4 {
                    if w.idle(|| at) == Idle::Spin {
                        continue;
                    }
                    let left = (now + timeout).saturating_duration_since(at).min(wait::MAX_SLEEP);
                    let slept = match w.sleep(at, input.u8() & 1 == 0, &m.ring) {
                        Sleep::Futex(d) => {
                            assert_eq!(d, left, "a futex sleep lasts to the deadline, at most the longest");
                            d
                        }
                        Sleep::For(d) => {
                            let step = Duration::from_micros(5 << wait::MAX_SLEEP_SHIFT);
                            assert!(d <= left.max(step), "a sleep past the deadline and longer than a step");
                            d
                        }
                    };
                    at += slept;
                }
            }
        }
        assert!(m.ring.in_flight() <= u64::from(m.entries()), "more in flight than the ring holds");
        assert!(m.ring.staged() <= m.ring.in_flight());
        assert_eq!(m.ring.room(), u64::from(m.entries()) - m.ring.in_flight());
        assert!(m.held.len() <= m.entries() as usize);
    }
});
