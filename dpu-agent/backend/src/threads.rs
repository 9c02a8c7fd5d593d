//! Threads for calls that may wait long (a DAOS call that DAOS may not answer, a call to
//! a tenant's worker process that may have stopped): each job gets a thread of its own,
//! an idle one when there is one, else a new one, so a call that waits holds up only
//! itself. A pool keeps at most `max_idle` threads waiting for the next job; the others
//! end when their job is done.

use std::sync::{Mutex, mpsc};

/// A job for a [`Pool`].
pub type Job = Box<dyn FnOnce() + Send>;

/// Threads that take one job at a time, made as needed.
pub struct Pool {
    /// The threads' name (Linux keeps 15 bytes of it).
    name: &'static str,
    max_idle: usize,
    /// Each idle thread's channel.
    idle: Mutex<Vec<mpsc::Sender<Job>>>,
}

impl Pool {
    pub const fn new(name: &'static str, max_idle: usize) -> Pool {
        Pool { name, max_idle, idle: Mutex::new(Vec::new()) }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<mpsc::Sender<Job>>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Run `job` on an idle thread of the pool, or on a new one. An error only where no
    /// thread can be made (the process is out of threads or memory), with `job`, unrun.
    pub fn submit(&'static self, mut job: Job) -> Result<(), (std::io::Error, Job)> {
        loop {
            let Some(thread) = self.idle().pop() else { break };
            match thread.send(job) {
                Ok(()) => return Ok(()),
                // That thread ended (it cannot, short of a panic): try the next.
                Err(mpsc::SendError(back)) => job = back,
            }
        }
        let (tx, rx) = mpsc::channel::<Job>();
        // The thread keeps a sender to its own channel, to offer itself again when idle.
        let own = tx.clone();
        let spawned = std::thread::Builder::new().name(self.name.to_owned()).spawn(move || {
            for job in rx.iter() {
                job();
                let mut idle = self.idle();
                if idle.len() >= self.max_idle {
                    break;
                }
                idle.push(own.clone());
            }
        });
        if let Err(e) = spawned {
            return Err((e, job));
        }
        tx.send(job).map_err(|mpsc::SendError(job)| {
            (std::io::Error::other(format!("a new {} thread ended at once", self.name)), job)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    static POOL: Pool = Pool::new("test-pool", 2);

    #[test]
    fn a_job_that_waits_holds_up_no_other_and_idle_threads_are_reused_up_to_the_limit() {
        // One job blocks until told; the others run meanwhile, each on a thread.
        let (release, blocked) = mpsc::channel::<()>();
        POOL.submit(Box::new(move || {
            let _ = blocked.recv();
        }))
        .map_err(|(e, _)| e)
        .unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..5 {
            let done = done.clone();
            POOL.submit(Box::new(move || {
                std::thread::sleep(Duration::from_millis(20));
                done.fetch_add(1, Ordering::SeqCst);
            }))
            .map_err(|(e, _)| e)
            .unwrap();
        }
        let since = Instant::now();
        while done.load(Ordering::SeqCst) < 5 {
            assert!(since.elapsed() < Duration::from_secs(10), "jobs waited for the blocked one");
            std::thread::sleep(Duration::from_millis(5));
        }
        release.send(()).unwrap();
        // At most two stay idle; a job after them runs on one of them.
        let since = Instant::now();
        while POOL.idle().len() < 2 {
            assert!(since.elapsed() < Duration::from_secs(10), "no thread went idle");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(POOL.idle().len(), 2, "more idle threads kept than the pool's limit");
        let (tx, rx) = mpsc::channel();
        let name = move || tx.send(std::thread::current().name().map(str::to_owned)).unwrap();
        POOL.submit(Box::new(name)).map_err(|(e, _)| e).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap().as_deref(), Some("test-pool"));
    }
}
