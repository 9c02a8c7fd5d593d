//! Calls DAOS may never answer: a deadline on each blocking DAOS call.
//!
//! With every engine gone, a DFS call does not fail: libdaos's object layer treats
//! `DER_TIMEDOUT` and network errors as retryable and makes the RPC again, refreshing the
//! pool map between tries, without end (`obj_retry_error` and `obj_retry_cb` in DAOS 2.9's
//! `src/object/cli_obj.c`), so the call blocks until DAOS is back. Nothing in DAOS bounds
//! it: `daos_event_abort` is a no-op ("we don't support task and RPC abort",
//! `src/client/api/event.c`), and the object layer's `no_retry` is not reachable through
//! the API. [`crate::retry`]'s bound acts only on failures DAOS returns.
//!
//! So the backend makes each blocking call on a *call thread* of this module and waits
//! for it at most the deadline (`[backend] call_timeout_seconds`). A call whose time is
//! up is answered [`Code::NoAnswer`] (the client hears `UNAVAILABLE`), and is left to
//! finish on its thread: it owns everything it passes to DAOS (its names, out-pointers,
//! and `Arc`s of the handles), so nothing is freed under DAOS, and once DAOS answers its
//! result is dropped (an object it opened is released) and the thread is free again.
//!
//! What a stuck call costs: its thread, and while DAOS does not answer, its polling: a
//! blocking DAOS call progresses the network itself (`daos_event_priv_wait`), and with
//! `D_POLL_TIMEOUT` at its default of 0 that is a busy loop, up to a core per stuck call
//! (what a stopping agent burned for half an hour, waiting on one).
//! Stuck calls are therefore limited ([`MAX_STUCK`]): past it, a call is answered at once
//! without reaching DAOS. They are listed for the agent's shutdown report
//! ([`stuck_calls`]).
//!
//! Not here: data-plane reads and writes on an event queue or into a borrowed host
//! region; they cannot be left behind on a thread, because the memory DAOS writes is not
//! theirs to keep (see docs/daos.md, "Not done yet").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dpuio_backend::threads::{Job, Pool};

use crate::error::{CallError, Code};

/// Calls left waiting on DAOS at most; past this, calls are answered without DAOS.
pub const MAX_STUCK: usize = 32;
/// The call threads; 16 idle ones are kept for the next calls, more end when their
/// call is done.
static CALL_THREADS: Pool = Pool::new("dpuio-daos-call", 16);

/// Calls past their deadline, and calls refused while others were: for the metrics
/// (`crate::retry::retry_stats`).
pub(crate) static UNANSWERED: AtomicU64 = AtomicU64::new(0);
pub(crate) static REFUSED: AtomicU64 = AtomicU64::new(0);

/// A call whose deadline passed and that DAOS has not answered yet.
struct Stuck {
    id: u64,
    what: String,
    since: Instant,
}

struct Calls {
    stuck: Vec<Stuck>,
    next_id: u64,
    /// When the last call went to DAOS while others were stuck.
    last_probe: Option<Instant>,
}

static CALLS: Mutex<Calls> = Mutex::new(Calls { stuck: Vec::new(), next_id: 0, last_probe: None });

fn calls() -> MutexGuard<'static, Calls> {
    CALLS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The calls DAOS has left unanswered past their deadline: what each was and how long
/// it has waited, oldest first.
pub fn stuck_calls() -> Vec<(String, Duration)> {
    calls().stuck.iter().map(|s| (s.what.clone(), s.since.elapsed())).collect()
}

/// End the process with `status` at once, running no teardown: no Rust destructors, no
/// C `atexit` handlers, no library destructors (libdaos's, mercury's, UCX's). For an
/// agent stopping while [`stuck_calls`] is not empty: those calls still run inside DAOS
/// on their threads, and tearing the libraries down under them crashed the process
/// (SIGSEGV after its last message, so it ended by the signal, not with `status`).
/// Standard error is unbuffered; standard output is flushed first.
pub fn exit_leaving_calls_in_daos(status: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: _exit ends the process; it touches no memory of this one.
    unsafe { libc::_exit(status) }
}

/// One blocking DAOS call at a time in this process, as long as calls are quick: held
/// around each try of a call made through [`crate::backend`]'s bounded calls.
///
/// Every blocking DAOS call waits on the same CaRT context (the thread-private event of
/// `daos_event_priv_wait` belongs to libdaos's global context), and only one thread
/// progresses a context at a time. The others wait in CaRT's
/// `crt_hg_progress_multi_trylock` (`src/cart/crt_hg.c`) with `pthread_cond_timedwait` on
/// a condition variable made with the default clock (`CLOCK_REALTIME`) against a deadline
/// read from `CLOCK_MONOTONIC_COARSE`: the deadline is always long past, so the wait
/// returns at once and each waiting thread spins on futex calls until the progressing
/// one is done (seen: eight threads creating files made 108k futex calls in 8 s, at 150%
/// CPU mostly in the kernel, and ran 2.6x slower than one; with every engine gone, the
/// stuck calls' threads spun at 194% of this 2-core machine). A waiter here sleeps
/// instead; what DAOS can overlap, the calls on event queues (data-plane reads and
/// writes, each I/O thread's queue a context of its own), is not held here.
///
/// A call that holds the gate longer than [`GATE_PATIENCE`] (a recursive remove of a large
/// tree, a call waiting out the RPC timeout of a lost engine) does not hold up the others:
/// past it they go on beside it, spinning as before, rather than waiting up to their own
/// deadline and answering `UNAVAILABLE` for a DAOS that answers. Once the holder is past
/// `deadline` (listed as stuck: DAOS is not answering), waiters wait for it, since going
/// on would only add a spinning thread.
pub(crate) fn one_at_a_time<T>(deadline: Duration, call: impl FnOnce() -> T) -> T {
    let _turn = Turn::take(deadline);
    call()
}

/// How long a call waits for the one ahead of it before it goes on beside it.
pub(crate) const GATE_PATIENCE: Duration = Duration::from_millis(50);

/// When the call holding the gate took it (`None`: free).
static GATE: Mutex<Option<Instant>> = Mutex::new(None);
static GATE_FREED: std::sync::Condvar = std::sync::Condvar::new();

/// A turn at the gate: `held` when this call holds it (and frees it when dropped), not
/// when it went on beside a slow holder.
struct Turn {
    held: bool,
}

impl Turn {
    fn take(deadline: Duration) -> Turn {
        let asked = Instant::now();
        let mut gate = GATE.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let Some(since) = *gate else {
                *gate = Some(Instant::now());
                return Turn { held: true };
            };
            let holder_stuck = !deadline.is_zero() && since.elapsed() >= deadline;
            let waited = asked.elapsed();
            let wait = if holder_stuck {
                Duration::from_secs(1)
            } else if waited >= GATE_PATIENCE {
                return Turn { held: false };
            } else {
                GATE_PATIENCE - waited
            };
            gate = GATE_FREED.wait_timeout(gate, wait).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.held {
            *GATE.lock().unwrap_or_else(|e| e.into_inner()) = None;
            GATE_FREED.notify_one();
        }
    }
}

/// Make `call` on a call thread and wait for it at most `deadline` (`Duration::ZERO`:
/// no deadline, the call is made here). `call_name` is the DAOS function for the error,
/// `what` names the call for logs (a path).
pub fn call<T: Send + 'static>(
    call_name: &'static str,
    what: &str,
    deadline: Duration,
    call: impl FnOnce() -> Result<T, CallError> + Send + 'static,
) -> Result<T, CallError> {
    if deadline.is_zero() {
        return call();
    }
    let started = Instant::now();
    probe_or_refuse(call_name, deadline)?;
    let id = {
        let mut calls = calls();
        calls.next_id += 1;
        calls.next_id
    };
    let (tx, rx) = mpsc::sync_channel(1);
    let what = what.to_owned();
    let listed_as = format!("{call_name} {what}");
    let job: Job = Box::new(move || {
        let result = call();
        // Under the lock, so that the caller either takes the answer or lists the call
        // as stuck, never both nor neither.
        let mut calls = calls();
        let len = calls.stuck.len();
        calls.stuck.retain(|s| s.id != id);
        if calls.stuck.len() < len {
            tracing::warn!(call = call_name, what, after = %format!("{:.1?}", started.elapsed()),
                "a DAOS call left unanswered at its deadline came back");
        }
        let _ = tx.send(result);
    });
    if let Err((e, _)) = CALL_THREADS.submit(job) {
        return Err(no_answer(call_name, format!("no thread to make it on: {e}")));
    }
    match rx.recv_timeout(deadline) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(no_answer(call_name, "its call thread ended without an answer (it panicked)".to_owned()))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let mut calls = calls();
            if let Ok(result) = rx.try_recv() {
                return result;
            }
            calls.stuck.push(Stuck { id, what: listed_as.clone(), since: started });
            // DAOS just proved silent: the next probe is due a deadline from now.
            calls.last_probe = Some(Instant::now());
            drop(calls);
            UNANSWERED.fetch_add(1, Ordering::Relaxed);
            tracing::error!(call = listed_as, waited = %format!("{:.1?}", started.elapsed()),
                "DAOS did not answer by the deadline ([backend] call_timeout_seconds); answering unavailable, the \
                 call stays on its thread until DAOS answers");
            Err(no_answer(call_name, format!("DAOS did not answer within {deadline:.0?}")))
        }
    }
}

/// While DAOS leaves calls unanswered, new calls are answered at once rather than each
/// left waiting on a thread of its own: all but one a deadline period, counted from the
/// last call that went unanswered (the probe, which finds DAOS back even if the stuck
/// calls were to stay stuck), and all past [`MAX_STUCK`].
/// The stuck calls come back once DAOS answers again (seen: some 10 s after `dmg system
/// start`), and calls go through again from then on.
fn probe_or_refuse(call_name: &'static str, deadline: Duration) -> Result<(), CallError> {
    let mut calls = calls();
    let Some(oldest) = calls.stuck.first() else { return Ok(()) };
    let why = format!(
        "not sent: DAOS has left {} call(s) unanswered (the oldest, {}, for {:.0?})",
        calls.stuck.len(),
        oldest.what,
        oldest.since.elapsed()
    );
    let probe_due = calls.last_probe.is_none_or(|t| t.elapsed() >= deadline);
    if calls.stuck.len() >= MAX_STUCK || !probe_due {
        REFUSED.fetch_add(1, Ordering::Relaxed);
        return Err(no_answer(call_name, why));
    }
    calls.last_probe = Some(Instant::now());
    Ok(())
}

/// For calls that cannot be left behind on a thread (reads and writes into memory the
/// caller lends DAOS): `Err` while DAOS leaves calls unanswered, so that none is made
/// to wait for a DAOS known not to answer.
pub fn refuse_while_stuck(call_name: &'static str) -> Result<(), CallError> {
    let calls = calls();
    match calls.stuck.first() {
        None => Ok(()),
        Some(oldest) => Err(refused(no_answer(
            call_name,
            format!(
                "not sent: DAOS has left {} call(s) unanswered (the oldest, {}, for {:.0?})",
                calls.stuck.len(),
                oldest.what,
                oldest.since.elapsed()
            ),
        ))),
    }
}

fn refused(e: CallError) -> CallError {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    e
}

/// A wait that cannot be abandoned (I/O on an event queue, whose memory DAOS may still
/// write) listed as stuck from its deadline until it ends, so that the shutdown report
/// names it and new calls are refused meanwhile.
pub struct Waiting {
    what: String,
    since: Instant,
    deadline: Duration,
    listed: Option<u64>,
}

impl Waiting {
    pub fn new(what: String, deadline: Duration) -> Waiting {
        Waiting { what, since: Instant::now(), deadline, listed: None }
    }

    /// Whether the deadline passed; lists the wait as stuck the first time it has.
    pub fn check(&mut self) -> bool {
        if self.deadline.is_zero() || self.since.elapsed() < self.deadline {
            return false;
        }
        if self.listed.is_none() {
            let mut calls = calls();
            calls.next_id += 1;
            let id = calls.next_id;
            calls.stuck.push(Stuck { id, what: self.what.clone(), since: self.since });
            calls.last_probe = Some(Instant::now());
            self.listed = Some(id);
            UNANSWERED.fetch_add(1, Ordering::Relaxed);
            drop(calls);
            tracing::error!(what = self.what, waited = %format!("{:.1?}", self.since.elapsed()),
                "DAOS did not answer by the deadline ([backend] call_timeout_seconds); this I/O waits for DAOS (DAOS \
                 writes the memory it was given until it completes), other calls are answered unavailable meanwhile");
        }
        true
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(id) = self.listed {
            calls().stuck.retain(|s| s.id != id);
            tracing::warn!(what = self.what, after = %format!("{:.1?}", self.since.elapsed()),
                "DAOS I/O left unanswered at its deadline came back");
        }
    }
}

fn no_answer(call: &'static str, description: String) -> CallError {
    CallError { call, code: Code::NoAnswer, name: "no answer".to_owned(), description }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_take_turns_and_a_slow_one_holds_the_others_only_briefly_unless_it_is_stuck() {
        let long = Duration::from_secs(60);
        // A quick holder: the next call waits for it.
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let o = order.clone();
        let first = std::thread::spawn(move || {
            one_at_a_time(long, || {
                std::thread::sleep(Duration::from_millis(20));
                o.lock().unwrap().push("first done");
            })
        });
        std::thread::sleep(Duration::from_millis(5));
        one_at_a_time(long, || order.lock().unwrap().push("second"));
        first.join().unwrap();
        assert_eq!(*order.lock().unwrap(), ["first done", "second"], "the second call went on beside a quick one");

        // A slow holder (not past its deadline): the next call goes on after the patience.
        let (release, hold) = mpsc::channel::<()>();
        let slow = std::thread::spawn(move || one_at_a_time(long, || hold.recv().unwrap()));
        std::thread::sleep(Duration::from_millis(20));
        let asked = Instant::now();
        one_at_a_time(long, || ());
        let waited = asked.elapsed();
        assert!(waited >= GATE_PATIENCE - Duration::from_millis(25), "went on after {waited:?}");
        assert!(waited < Duration::from_secs(5), "waited {waited:?} for a slow call");
        release.send(()).unwrap();
        slow.join().unwrap();

        // A holder past its deadline (stuck): the next call waits until it is done.
        let (release, hold) = mpsc::channel::<()>();
        let short = Duration::from_millis(10);
        let stuck = std::thread::spawn(move || one_at_a_time(short, || hold.recv().unwrap()));
        std::thread::sleep(Duration::from_millis(30));
        let (done_tx, done) = mpsc::channel();
        let waiter = std::thread::spawn(move || one_at_a_time(short, || done_tx.send(()).unwrap()));
        assert!(done.recv_timeout(Duration::from_millis(300)).is_err(), "a call went on beside a stuck one");
        release.send(()).unwrap();
        done.recv_timeout(Duration::from_secs(5)).expect("the call once the stuck one was done");
        stuck.join().unwrap();
        waiter.join().unwrap();
    }

    #[test]
    fn an_answer_in_time_is_returned_and_a_late_one_is_answered_no_answer() {
        let got = call("dfs_stat", "/a", Duration::from_secs(5), || Ok(7));
        assert_eq!(got, Ok(7));

        let (release, hold) = mpsc::channel::<()>();
        let started = Instant::now();
        let got: Result<u32, _> = call("dfs_lookup", "/slow", Duration::from_millis(200), move || {
            let _ = hold.recv();
            Ok(1)
        });
        let e = got.unwrap_err();
        assert_eq!(e.code, Code::NoAnswer);
        assert!(e.to_string().starts_with("dfs_lookup: no answer (DAOS did not answer within"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(stuck_calls().iter().any(|(what, _)| what == "dfs_lookup /slow"), "{:?}", stuck_calls());

        // DAOS answers at last: the call leaves the stuck list.
        release.send(()).unwrap();
        let since = Instant::now();
        while stuck_calls().iter().any(|(what, _)| what == "dfs_lookup /slow") {
            assert!(since.elapsed() < Duration::from_secs(5), "the answered call stayed listed as stuck");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(call("dfs_stat", "/b", Duration::from_secs(5), || Ok(8)), Ok(8), "threads are reused");
    }
}
