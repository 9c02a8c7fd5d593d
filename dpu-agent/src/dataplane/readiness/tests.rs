//! The engine loop's bookkeeping with a hand-driven clock.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::*;
use crate::dataplane::protocol::RING_BATCH;
use crate::dataplane::protocol::tests::{Driver, HostRing, Served, UNLIMITED, read};

const A: RingKey = (1, 1);
const B: RingKey = (2, 7);
const SPIN: Duration = Duration::from_micros(50);

fn pending<R, T>(r: &mut Readiness<R, T>) -> Vec<RingKey> {
    let mut keys: Vec<RingKey> = r.take_pending().collect();
    keys.sort();
    keys
}

#[test]
fn two_full_rings_take_turns_a_batch_each() {
    let mut rings = [(A, HostRing::new(256), Driver::new(256)), (B, HostRing::new(256), Driver::new(256))];
    for (_, host, _) in &mut rings {
        for i in 0..200 {
            host.submit(read(i));
        }
    }
    let mut ready: Readiness<(), ()> = Readiness::new(Instant::now());
    ready.ready(A);
    ready.ready(B);
    // The engine's round: every pending ring once, those with more pending again.
    let mut served: Vec<(RingKey, u64)> = Vec::new();
    for _round in 0..10 {
        let keys: Vec<RingKey> = ready.take_pending().collect();
        for key in keys {
            let (_, host, agent) = rings.iter_mut().find(|(k, ..)| *k == key).expect("a ring");
            let Served::Finished { taken, more, .. } = agent.serve(host, UNLIMITED) else { panic!("a batch") };
            served.push((key, taken));
            if more {
                ready.ready(key);
            }
        }
    }
    let total = |key| served.iter().filter(|(k, _)| *k == key).map(|(_, n)| n).sum::<u64>();
    assert_eq!((total(A), total(B)), (200, 200));
    assert!(served.iter().all(|(_, n)| *n <= RING_BATCH));
    // While both have work, neither gets two batches before the other gets one.
    let both_busy = served.len() - 2;
    for pair in served[..both_busy].chunks(2) {
        assert_ne!(pair[0].0, pair[1].0, "{served:?}");
    }
}

#[test]
fn a_parked_ring_waits_for_room_whatever_rings_for_it() {
    let room = Rc::new(Cell::new(0u32));
    let mut ready: Readiness<&str, Rc<Cell<u32>>> = Readiness::new(Instant::now());
    ready.heat(A, "ring A");
    ready.heat(B, "ring B");
    assert_eq!(ready.park(A, room.clone()), Some("ring A"), "a parked ring is polled no more");
    assert_eq!(ready.hot().iter().map(|(k, _)| *k).collect::<Vec<_>>(), [B]);
    ready.ready(A); // its doorbell
    ready.ready(B);
    ready.unpark(|t| t.get());
    assert_eq!(pending(&mut ready), [B]);
    room.set(1);
    ready.unpark(|t| t.get());
    assert_eq!(pending(&mut ready), [A], "room back: served again");
    room.set(0);
    ready.unpark(|t| t.get());
    assert_eq!(pending(&mut ready), [], "unparked once, not parked again by itself");
    assert_eq!(ready.park(A, room.clone()), None, "was not hot");
}

#[test]
fn idle_spins_after_work_then_sleeps() {
    let t0 = Instant::now();
    let mut ready: Readiness<(), ()> = Readiness::new(t0);
    ready.ready(A);
    assert_eq!(ready.idle(|| t0, None, SPIN), Idle::Work);
    pending(&mut ready);
    assert!((0..1000).all(|_| ready.idle(|| t0, None, SPIN) == Idle::Spin), "work just ended");
    let later = t0 + Duration::from_millis(1);
    let first_sleep = (1..=64).find(|_| ready.idle(|| later, None, SPIN) == Idle::Sleep);
    assert!(first_sleep.is_some(), "sleeps within a look at the clock");
    assert_eq!(ready.idle(|| later, Some(Duration::ZERO), SPIN), Idle::Work, "a queued request is due");
    // That was work: spin again first, then sleep though a request is due later.
    assert_eq!(ready.idle(|| later, Some(Duration::from_millis(5)), SPIN), Idle::Spin);
    let after = later + Duration::from_millis(1);
    let kinds: Vec<Idle> = (0..64).map(|_| ready.idle(|| after, Some(Duration::from_millis(5)), SPIN)).collect();
    assert!(kinds.contains(&Idle::Sleep), "a request due later does not keep it awake");
}

#[test]
fn sleep_ends_at_the_scan_or_the_first_due_request() {
    let t0 = Instant::now();
    let mut ready: Readiness<(), ()> = Readiness::new(t0);
    assert!(ready.scan_due(), "the first round scans every ring");
    ready.scanned(t0);
    assert!(!ready.scan_due());
    let now = t0 + Duration::from_millis(50);
    assert_eq!(ready.sleep_for(now, None), Duration::from_millis(150));
    assert_eq!(ready.sleep_for(now, Some(Duration::from_micros(1200))), Duration::from_millis(2), "rounded up");
    assert_eq!(ready.sleep_for(now, Some(Duration::from_nanos(1))), Duration::from_millis(1), "never 0: no spin");
    assert_eq!(ready.sleep_for(t0 + IDLE_SCAN * 2, None), Duration::ZERO);
    ready.woke(t0 + IDLE_SCAN - Duration::from_millis(1));
    assert!(!ready.scan_due());
    ready.woke(t0 + IDLE_SCAN);
    assert!(ready.scan_due(), "the safety-net scan");
    ready.scanned(t0 + IDLE_SCAN);
    assert!(!ready.scan_due());
    ready.lost_doorbells();
    assert!(ready.scan_due(), "lost doorbells: look at every ring");
}

#[test]
fn cooling_finds_entries_published_before_the_flags_cleared() {
    let mut ready: Readiness<bool, ()> = Readiness::new(Instant::now());
    ready.heat(A, true);
    ready.heat(B, false);
    ready.heat(A, false); // already hot: kept as it was
    ready.poll_hot(|work| *work);
    assert_eq!(pending(&mut ready), [A]);
    assert!(ready.cool(|work| *work), "A had work: do not sleep");
    assert!(ready.hot().is_empty());
    assert_eq!(pending(&mut ready), [A]);
    assert!(!ready.cool(|work| *work), "nothing hot any more");
}
