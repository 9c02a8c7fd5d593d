//! Riding out an agent restart.
//!
//! A DPU agent is upgraded or restarted under running training jobs. When it comes
//! back it knows nothing of their sessions, so the client attaches again, registers
//! its regions and re-opens its files *under the ids its ring entries already carry*
//! (the agent lets a session claim them), registers fresh rings, and submits again
//! what had not completed. The caller sees a stall, not an error.
//!
//! The rule that keeps this safe: a client re-attaches only once the agent has said
//! it does not know the session (the `no-session` reason). While the agent merely
//! does not answer, the old session may still live on it, serving the old rings, so
//! the client waits and asks again; it never runs two sessions' worth of the same
//! requests at once. What it submits again: reads, and writes (a write carries its
//! file offset, so running it twice leaves the same bytes); ring entries that point
//! into the old ring's own memory (metadata answers) cannot move and complete with
//! [`wire::Status::Lost`], which the calls that made them retry where that is safe.
//!
//! This module holds the I/O-free parts: the options, what a keep-alive's answer says
//! about the agent, and the tables of what to restore. The async work (attach, register,
//! open) is in `client.rs`, the rings in `dataplane.rs`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dpuio_proto::reason::{METADATA_KEY, Reason};

/// How a client rides out a lost agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeOptions {
    /// How long calls wait for a lost agent to come back (and the client to attach
    /// again) before they fail. Zero: do not resume; a restarted agent's "no such
    /// session" ends the session as before. Default 60 s, or `$DPUIO_RESUME_S`.
    pub max_wait: Duration,
    /// How long a wait for completions may go without one before the client asks the
    /// agent whether it is still there (a keep-alive out of turn). Default 500 ms.
    pub probe_after: Duration,
}

impl Default for ResumeOptions {
    fn default() -> Self {
        let max_wait = std::env::var("DPUIO_RESUME_S")
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map_or(Duration::from_secs(60), Duration::from_secs_f64);
        ResumeOptions { max_wait, probe_after: Duration::from_millis(500) }
    }
}

impl ResumeOptions {
    /// Whether the client resumes at all.
    pub fn enabled(&self) -> bool {
        !self.max_wait.is_zero()
    }
}

/// What an answer (or its absence) from the agent says about the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The agent answered for the session (or answered at all, with an error that
    /// says nothing about the session).
    Alive,
    /// Nothing answered: the agent is down, restarting or unreachable. Its session
    /// may still live, so do not attach again yet.
    Unreachable,
    /// The agent answered that it does not know the session (it restarted, or the
    /// lease lapsed): attach again.
    Forgotten,
    /// The agent ended the session for a reason resuming cannot fix (token expired,
    /// tenant removed, refused).
    Ended,
}

/// What a keep-alive's result says (see [`Probe`]).
pub(crate) fn classify(result: &Result<(), tonic::Status>) -> Probe {
    let Err(status) = result else { return Probe::Alive };
    let reason = status.metadata().get(METADATA_KEY).and_then(|v| v.to_str().ok()).and_then(Reason::parse);
    match status.code() {
        _ if reason == Some(Reason::NoSession) => Probe::Forgotten,
        // The agent answered: its storage is what is unavailable.
        _ if reason == Some(Reason::StorageUnavailable) => Probe::Alive,
        tonic::Code::FailedPrecondition | tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => Probe::Ended,
        // Connection refused or reset, a deadline, an agent draining: ask again later.
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            Probe::Unreachable
        }
        // Any other answer came from an agent that is there.
        _ => Probe::Alive,
    }
}

/// Whether a failed gRPC call may be sent again once the client has resumed: the agent
/// did not run it (it did not know the session, or nothing answered the connection).
/// `idempotent` calls may also go again after a connection lost mid-call.
pub(crate) fn worth_resending(status: &tonic::Status, idempotent: bool) -> bool {
    match classify(&Err(status.clone())) {
        Probe::Forgotten => true,
        Probe::Unreachable => {
            idempotent
                || (status.code() == tonic::Code::Unavailable
                    && ["tcp connect error", "Connection refused", "error trying to connect"]
                        .iter()
                        .any(|m| status.message().contains(m)))
        }
        Probe::Alive | Probe::Ended => false,
    }
}

/// How long the supervisor waits between probes: a third of the lease while the
/// agent answers, a tenth of a second while it does not.
pub(crate) fn probe_period(lease_ms: u64, unreachable: bool) -> Duration {
    if unreachable { Duration::from_millis(100) } else { Duration::from_millis((lease_ms / 3).max(100)) }
}

/// The session's state as the threads waiting on rings see it: a generation that grows
/// each time the client resumes, and why it gave up, once it has; and for calls waiting
/// to be sent again, an epoch that grows with every probe of the agent.
pub(crate) struct Liveness {
    generation: AtomicU64,
    failed: Mutex<Option<String>>,
    kick: tokio::sync::Notify,
    epoch: tokio::sync::watch::Sender<u64>,
    pub options: ResumeOptions,
}

impl Liveness {
    pub fn new(options: ResumeOptions) -> Liveness {
        Liveness {
            generation: AtomicU64::new(0),
            failed: Mutex::new(None),
            kick: tokio::sync::Notify::new(),
            epoch: tokio::sync::watch::channel(0).0,
            options,
        }
    }

    /// Resumes so far (0 until the first).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Why the client stopped waiting for the agent, once it has.
    pub fn failed(&self) -> Option<String> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Ask the supervisor to probe the agent now (a wait has gone quiet). Cheap; may
    /// be called from any thread.
    pub fn suspect(&self) {
        self.kick.notify_one();
    }

    /// Wait for a call to [`Liveness::suspect`].
    pub async fn suspected(&self) {
        self.kick.notified().await;
    }

    /// The client has resumed: waiters move to the new session's rings.
    pub fn resumed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.probed();
    }

    /// The supervisor has heard (or not heard) from the agent: calls waiting for that
    /// try again.
    pub fn probed(&self) {
        self.epoch.send_modify(|e| *e += 1);
    }

    /// The client gives up on the agent: waiters fail with `why`.
    pub fn give_up(&self, why: String) {
        *self.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.probed();
    }

    /// Probes so far (see [`Liveness::next_probe`]).
    pub fn epoch(&self) -> u64 {
        *self.epoch.borrow()
    }

    /// Ask for a probe and wait (async) until one has happened since epoch `seen`;
    /// `Err` says why the client gave up on the agent.
    pub async fn next_probe(&self, seen: u64) -> Result<(), String> {
        let mut rx = self.epoch.subscribe();
        self.suspect();
        loop {
            if let Some(why) = self.failed() {
                return Err(why);
            }
            if *rx.borrow_and_update() != seen {
                return Ok(());
            }
            if rx.changed().await.is_err() {
                return Err("the client was dropped".into());
            }
        }
    }
}

/// A region to register again after a restart, under the id its entries carry.
#[derive(Debug, Clone)]
pub(crate) struct RegionRecord {
    pub address: u64,
    pub length: u64,
    pub remote_key: Vec<u8>,
    pub access: i32,
}

/// A file to open again after a restart, under the handle its entries carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileRecord {
    pub path: String,
    pub write: bool,
}

/// What a session must restore after a restart: its registered regions and open
/// files, by the ids the agent gave them.
#[derive(Default)]
pub(crate) struct Registry {
    regions: Mutex<HashMap<u32, RegionRecord>>,
    files: Mutex<HashMap<u64, FileRecord>>,
}

impl Registry {
    pub fn add_region(&self, id: u32, record: RegionRecord) {
        self.regions.lock().unwrap_or_else(|p| p.into_inner()).insert(id, record);
    }
    pub fn remove_region(&self, id: u32) {
        self.regions.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }
    /// The regions, lowest id first (the order they were registered in).
    pub fn regions(&self) -> Vec<(u32, RegionRecord)> {
        let mut all: Vec<_> =
            self.regions.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (*k, v.clone())).collect();
        all.sort_by_key(|(id, _)| *id);
        all
    }
    pub fn add_file(&self, handle: u64, record: FileRecord) {
        self.files.lock().unwrap_or_else(|p| p.into_inner()).insert(handle, record);
    }
    pub fn remove_file(&self, handle: u64) {
        self.files.lock().unwrap_or_else(|p| p.into_inner()).remove(&handle);
    }
    pub fn files(&self) -> Vec<(u64, FileRecord)> {
        self.files.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (*k, v.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_reason(code: tonic::Code, reason: Reason) -> tonic::Status {
        let mut s = tonic::Status::new(code, "m");
        s.metadata_mut().insert(METADATA_KEY, reason.as_str().parse().unwrap());
        s
    }

    #[test]
    fn only_a_forgotten_session_is_attached_again() {
        assert_eq!(classify(&Ok(())), Probe::Alive);
        assert_eq!(classify(&Err(with_reason(tonic::Code::FailedPrecondition, Reason::NoSession))), Probe::Forgotten);
        assert_eq!(classify(&Err(tonic::Status::unavailable("tcp connect error"))), Probe::Unreachable);
        assert_eq!(classify(&Err(tonic::Status::deadline_exceeded("slow"))), Probe::Unreachable);
        assert_eq!(classify(&Err(tonic::Status::failed_precondition("session ended"))), Probe::Ended);
        assert_eq!(classify(&Err(tonic::Status::unauthenticated("token expired"))), Probe::Ended);
    }

    #[test]
    fn calls_go_again_only_when_the_agent_did_not_run_them() {
        let forgotten = with_reason(tonic::Code::FailedPrecondition, Reason::NoSession);
        assert!(worth_resending(&forgotten, false));
        let refused = tonic::Status::unavailable("error trying to connect: tcp connect error: Connection refused");
        assert!(worth_resending(&refused, false));
        let reset = tonic::Status::unknown("h2 protocol error: connection reset");
        assert!(!worth_resending(&reset, false), "a rename may have run before the connection dropped");
        assert!(worth_resending(&reset, true));
        assert!(!worth_resending(&tonic::Status::not_found("no such file"), true));
        assert!(!worth_resending(&tonic::Status::failed_precondition("not mounted"), true));
        let storage = with_reason(tonic::Code::Unavailable, Reason::StorageUnavailable);
        assert_eq!(classify(&Err(storage.clone())), Probe::Alive, "the agent answered; DAOS did not");
        assert!(!worth_resending(&storage, true), "resent at once, it would wait on DAOS again");
    }

    #[test]
    fn resume_is_on_unless_the_wait_is_zero() {
        assert!(ResumeOptions { max_wait: Duration::from_secs(1), probe_after: Duration::ZERO }.enabled());
        assert!(!ResumeOptions { max_wait: Duration::ZERO, probe_after: Duration::ZERO }.enabled());
    }

    #[test]
    fn waiters_see_a_probe_a_resume_and_a_give_up() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let live = std::sync::Arc::new(Liveness::new(ResumeOptions::default()));
        let l = live.clone();
        rt.block_on(async move {
            let seen = l.epoch();
            let waiter = tokio::spawn({
                let l = l.clone();
                async move { l.next_probe(seen).await }
            });
            tokio::task::yield_now().await;
            assert!(!waiter.is_finished(), "no probe yet");
            l.probed();
            assert_eq!(waiter.await.unwrap(), Ok(()));
            let seen = l.epoch();
            l.resumed();
            assert_eq!(l.next_probe(seen).await, Ok(()));
            l.give_up("gone".into());
            assert_eq!(l.next_probe(l.epoch()).await, Err("gone".into()));
        });
        assert_eq!(live.generation(), 1);
    }

    #[test]
    fn regions_come_back_in_the_order_they_were_registered() {
        let r = Registry::default();
        let rec = RegionRecord { address: 1, length: 2, remote_key: vec![3], access: 0 };
        r.add_region(7, rec.clone());
        r.add_region(2, rec.clone());
        r.add_region(5, rec);
        r.remove_region(5);
        assert_eq!(r.regions().iter().map(|(id, _)| *id).collect::<Vec<_>>(), [2, 7]);
        r.add_file(9, FileRecord { path: "/a".into(), write: true });
        r.remove_file(9);
        assert!(r.files().is_empty());
    }
}
