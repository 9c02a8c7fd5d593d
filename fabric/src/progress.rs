//! A progress thread for transports whose peers need this process's help (TCP,
//! libfabric shm).
//!
//! Over TCP, UCX and libfabric carry a put as a message the *target's* worker must
//! progress to write into memory; libfabric's shm provider needs the target to hand
//! back command-queue slots (see [`crate::ofi`]). The host shim therefore runs one of
//! these. It sleeps on the
//! event fd between events, and it measures its own CPU time so the cost is reported,
//! not hidden (DESIGN.md, "Data plane").

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::transport::Transport;

/// Longest sleep between checks of the stop flag, in case a wake-up is lost.
const IDLE_WAKE: Duration = Duration::from_millis(200);
/// Sleep between rounds on a transport whose event fd does not report peers' work
/// ([`Transport::wakes_on_receive`] false: libfabric shm). Its peers' one-sided
/// operations each hold a slot of this side's command queue (1024) until this side
/// progresses; the owner should progress where it knows a peer has just finished with
/// its memory (the shim does when it reaps completions), and this thread is the
/// safety net. Frequent progress costs more than wake-ups: shm's progress spins on a
/// lock the peer holds while it writes into this process (measured: at 2 ms slices,
/// half of the host's CPU of a sequential read was that spin).
const NO_FD_SLICE: Duration = Duration::from_millis(50);

/// What a progress thread cost and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgressReport {
    /// CPU time the thread consumed (user + system), from `CLOCK_THREAD_CPUTIME_ID`.
    pub cpu_time: Duration,
    /// Times the thread woke from its event-fd sleep.
    pub wakeups: u64,
    /// Events handled by `progress` (its summed return values).
    pub events: u64,
}

#[derive(Default)]
struct Stats {
    cpu_ns: AtomicU64,
    wakeups: AtomicU64,
    events: AtomicU64,
}

impl Stats {
    fn report(&self) -> ProgressReport {
        ProgressReport {
            cpu_time: Duration::from_nanos(self.cpu_ns.load(Ordering::Relaxed)),
            wakeups: self.wakeups.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
        }
    }
}

/// A thread that progresses a transport until stopped (or dropped): it calls
/// `progress` until idle, arms the event fd and sleeps on it.
pub struct ProgressThread {
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    wake: Box<dyn Fn() + Send + Sync>,
    thread: Option<JoinHandle<()>>,
}

impl ProgressThread {
    /// Starts a thread named `name` progressing `transport` (a clone of the handle).
    pub fn spawn<T: Transport + Clone + 'static>(transport: T, name: &str) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::default());
        let waker = transport.clone();
        let (stop2, stats2) = (stop.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || run(&transport, &stop2, &stats2))
            .map_err(|source| Error::Io { op: "spawn progress thread", source })?;
        Ok(ProgressThread {
            stop,
            stats,
            wake: Box::new(move || {
                let _ = waker.wake();
            }),
            thread: Some(thread),
        })
    }

    /// Cost and activity so far.
    pub fn report(&self) -> ProgressReport {
        self.stats.report()
    }

    /// Stops and joins the thread; returns its final report.
    pub fn stop(mut self) -> ProgressReport {
        self.shutdown();
        self.stats.report()
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        (self.wake)();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run<T: Transport>(transport: &T, stop: &AtomicBool, stats: &Stats) {
    while !stop.load(Ordering::Acquire) {
        let mut events = 0usize;
        loop {
            let n = transport.progress();
            if n == 0 {
                break;
            }
            events += n;
        }
        stats.events.fetch_add(events as u64, Ordering::Relaxed);
        stats.cpu_ns.store(thread_cpu_ns(), Ordering::Relaxed);
        if stop.load(Ordering::Acquire) {
            break;
        }
        let slice = if transport.wakes_on_receive() { IDLE_WAKE } else { NO_FD_SLICE };
        match transport.wait(slice) {
            Ok(true) => {
                stats.wakeups.fetch_add(1, Ordering::Relaxed);
            }
            Ok(false) => {}
            // The fd is unusable (should not happen); degrade to polling gently.
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    stats.cpu_ns.store(thread_cpu_ns(), Ordering::Relaxed);
}

/// CPU time of the calling thread in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid, writable timespec; the clock id is a constant Linux knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}
