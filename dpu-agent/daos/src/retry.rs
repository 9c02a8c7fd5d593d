//! Riding out DAOS faults: which failures are transient, and how long a call is tried
//! again before the client hears of it.
//!
//! When an engine dies, DAOS's clients see RPCs to it time out (the RPC timeout, 60 s by
//! default), the system excludes the rank (SWIM notices in about 20 s) and the pool map
//! moves on; a call made again then goes to the replicas that remain. Until then a DFS
//! call fails with `ETIMEDOUT`, `EHOSTUNREACH`, `ESTALE`... Those are retried here with a
//! growing pause, up to [`Retry::deadline`]; what is not transient (a missing file, no
//! permission, no space, too many failures for the redundancy factor) is answered at
//! once. Each retried call is counted, logged once when it starts retrying and once when
//! it recovers or gives up, so an operator sees what happened.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{CallError, Code, der};

/// Tries and outcomes of retried DAOS calls since the process started (every backend of
/// it together), for the agent's metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RetryStats {
    /// Calls that failed transiently at least once.
    pub retried_calls: u64,
    /// Attempts made again (a call retried three times counts three).
    pub retries: u64,
    /// Retried calls that then succeeded (or failed with a non-transient error).
    pub recovered: u64,
    /// Retried calls still failing at the deadline: answered as unavailable.
    pub gave_up: u64,
    /// Calls DAOS left unanswered past `[backend] call_timeout_seconds` (answered
    /// unavailable, or data-plane I/O that waited on): `crate::deadline`.
    pub unanswered: u64,
    /// Calls answered unavailable without being sent, while DAOS left others unanswered.
    pub refused: u64,
}

impl std::ops::AddAssign for RetryStats {
    /// Counts of two processes together (the agent's and its tenant workers').
    fn add_assign(&mut self, o: RetryStats) {
        self.retried_calls += o.retried_calls;
        self.retries += o.retries;
        self.recovered += o.recovered;
        self.gave_up += o.gave_up;
        self.unanswered += o.unanswered;
        self.refused += o.refused;
    }
}

static RETRIED_CALLS: AtomicU64 = AtomicU64::new(0);
static RETRIES: AtomicU64 = AtomicU64::new(0);
static RECOVERED: AtomicU64 = AtomicU64::new(0);
static GAVE_UP: AtomicU64 = AtomicU64::new(0);

/// The counts so far.
pub fn retry_stats() -> RetryStats {
    RetryStats {
        retried_calls: RETRIED_CALLS.load(Ordering::Relaxed),
        retries: RETRIES.load(Ordering::Relaxed),
        recovered: RECOVERED.load(Ordering::Relaxed),
        gave_up: GAVE_UP.load(Ordering::Relaxed),
        unanswered: crate::deadline::UNANSWERED.load(Ordering::Relaxed),
        refused: crate::deadline::REFUSED.load(Ordering::Relaxed),
    }
}

/// Whether DAOS may well succeed if the call is made again: the engine or the network
/// is gone for now, or the pool map moved under the call.
pub fn is_transient(e: &CallError) -> bool {
    match e.code {
        Code::Errno(errno) => matches!(
            errno,
            libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::EAGAIN | libc::EBUSY | libc::ESTALE | libc::ERESTART
        ),
        Code::Der(code) => matches!(
            code,
            der::UNREACH
                | der::TIMEDOUT
                | der::BUSY
                | der::AGAIN
                | der::HG
                | der::EXCLUDED
                | der::GRPVER
                | der::STALE
                | der::NOTLEADER
                | der::TX_RESTART
                | der::NO_SERVICE
        ),
        // The call's whole time is up (crate::deadline): nothing is left to retry in.
        Code::NoAnswer => false,
    }
}

/// How long transient failures are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// From the first failure; `Duration::ZERO` answers the first failure as it is.
    pub deadline: Duration,
}

/// The first pause between tries; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(2);

impl Retry {
    /// Make `call` until it succeeds, fails for good, or transient failures have lasted
    /// past the deadline (then the last failure is returned). `what` names the call for
    /// the log (a path, or the call and its path).
    pub fn run<T>(&self, what: &str, mut call: impl FnMut() -> Result<T, CallError>) -> Result<T, CallError> {
        match call() {
            Err(e) if is_transient(&e) && !self.deadline.is_zero() => self.resume(Tries::start(what, &e), call),
            other => other,
        }
    }

    /// Go on retrying a call whose first try failed transiently (`tries`), e.g. a
    /// piece that failed on an event queue and is made again as a blocking call.
    pub fn resume<T>(&self, mut tries: Tries, mut call: impl FnMut() -> Result<T, CallError>) -> Result<T, CallError> {
        loop {
            let Some(pause) = tries.pause(self.deadline) else {
                return Err(tries.give_up());
            };
            std::thread::sleep(pause);
            match call() {
                Err(e) if is_transient(&e) => tries.failed(&e),
                other => {
                    tries.recovered(other.as_ref().err());
                    return other;
                }
            }
        }
    }
}

/// The state of one retried call (or one retried piece of a batch): when it began, how
/// many tries, the next pause, the last failure.
pub struct Tries {
    what: String,
    since: Instant,
    tries: u32,
    pause: Duration,
    last: CallError,
}

impl Tries {
    /// A call failed transiently for the first time: count it and say so.
    pub fn start(what: &str, e: &CallError) -> Tries {
        RETRIED_CALLS.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(what, error = %e, "DAOS call failed transiently; retrying");
        Tries { what: what.to_owned(), since: Instant::now(), tries: 1, pause: FIRST_PAUSE, last: e.clone() }
    }

    /// The pause before the next try, or `None` when the deadline has passed.
    pub fn pause(&mut self, deadline: Duration) -> Option<Duration> {
        let left = deadline.checked_sub(self.since.elapsed())?;
        if left.is_zero() {
            return None;
        }
        let pause = self.pause.min(left);
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        RETRIES.fetch_add(1, Ordering::Relaxed);
        self.tries += 1;
        Some(pause)
    }

    /// Another transient failure.
    pub fn failed(&mut self, e: &CallError) {
        self.last = e.clone();
    }

    /// The call came back: with success, or with a failure that is not transient.
    pub fn recovered(&self, error: Option<&CallError>) {
        RECOVERED.fetch_add(1, Ordering::Relaxed);
        let waited = format!("{:.1?}", self.since.elapsed());
        match error {
            None => tracing::warn!(what = %self.what, tries = self.tries, waited, "DAOS call succeeded after retries"),
            Some(e) => tracing::warn!(
                what = %self.what, tries = self.tries, waited, error = %e,
                "DAOS call failed for good after retries"
            ),
        }
    }

    /// The deadline passed: the last failure goes to the client.
    pub fn give_up(&self) -> CallError {
        GAVE_UP.fetch_add(1, Ordering::Relaxed);
        let last = self.last.clone();
        tracing::error!(
            what = %self.what, tries = self.tries, waited = %format!("{:.1?}", self.since.elapsed()), error = %last,
            "DAOS still failing at the retry deadline ([backend] retry_seconds); answering unavailable"
        );
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno(e: i32) -> CallError {
        CallError { call: "dfs_read", code: Code::Errno(e), name: String::new(), description: String::new() }
    }

    #[test]
    fn only_transient_failures_are_retried_and_a_recovery_returns_the_value() {
        let retry = Retry { deadline: Duration::from_secs(5) };
        let mut calls = 0;
        let got = retry.run("/f", || {
            calls += 1;
            if calls < 3 { Err(errno(libc::ETIMEDOUT)) } else { Ok(7) }
        });
        assert_eq!((got, calls), (Ok(7), 3));

        let mut calls = 0;
        let got: Result<(), _> = retry.run("/f", || {
            calls += 1;
            Err(errno(libc::ENOENT))
        });
        assert_eq!((got.unwrap_err().code, calls), (Code::Errno(libc::ENOENT), 1), "ENOENT is not retried");
    }

    #[test]
    fn the_deadline_ends_the_retries_with_the_last_failure() {
        let retry = Retry { deadline: Duration::from_millis(350) };
        let started = Instant::now();
        let mut calls = 0;
        let got: Result<(), _> = retry.run("/f", || {
            calls += 1;
            Err(errno(if calls == 1 { libc::ETIMEDOUT } else { libc::EHOSTUNREACH }))
        });
        assert_eq!(got.unwrap_err().code, Code::Errno(libc::EHOSTUNREACH));
        assert!(calls >= 3, "100 + 200 ms of pauses fit: {calls} calls");
        assert!(started.elapsed() < Duration::from_secs(2));

        let none = Retry { deadline: Duration::ZERO };
        let mut calls = 0;
        let _: Result<(), _> = none.run("/f", || {
            calls += 1;
            Err(errno(libc::ETIMEDOUT))
        });
        assert_eq!(calls, 1, "a zero deadline does not retry");
    }

    #[test]
    fn der_codes_of_a_moving_pool_are_transient() {
        for code in [der::TIMEDOUT, der::UNREACH, der::EXCLUDED, der::STALE, der::GRPVER] {
            assert!(is_transient(&CallError {
                call: "daos_x",
                code: Code::Der(code),
                name: "".into(),
                description: "".into()
            }));
        }
        for code in [der::NO_PERM, der::NONEXIST, der::NOSPACE, der::INVAL] {
            assert!(!is_transient(&CallError {
                call: "daos_x",
                code: Code::Der(code),
                name: "".into(),
                description: "".into()
            }));
        }
    }
}
