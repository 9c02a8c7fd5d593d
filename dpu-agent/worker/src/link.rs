//! One channel's socket as the agent reads it: a read that finds nothing yet waits for
//! as long as the worker shows signs of life, and no longer.
//!
//! A worker stuck in a slow DAOS call is alive (its counters thread beats in the staging
//! memory's counters page every half second: [`crate::staging::Mapping::beat`]), and
//! DAOS's own deadline bounds the call; a worker that stopped as a whole (SIGSTOP, a
//! deadlock, a machine too starved to schedule it) beats no more, and a read waiting on
//! it fails after [`SILENT_LIMIT`], so the caller takes the worker as lost: it is killed
//! and the call runs again on a new one. Without this a call waited for such a worker
//! forever, and the agent's thread with it (the data plane's engine for a put/get host's
//! namespace calls: every tenant's host held up by one tenant's worker).
//!
//! Not here: what a lost worker's calls become ([`crate::client`]), the engine's reads,
//! made only when the channel is readable ([`crate::direct`], which sets a patience for
//! the rest of a report).

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::staging::Staging;

/// How long a worker may show no sign of life while a read waits for it before it is
/// taken as lost: eight of its beats missed.
pub(crate) const SILENT_LIMIT: Duration = Duration::from_secs(4);

/// How often a waiting read looks at the worker's beat.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// What a waiter last saw of a worker's beat: the count, and when it last moved.
pub(crate) struct Pulse {
    beats: u64,
    moved: Instant,
}

impl Pulse {
    /// The beat of the worker whose staging is `staging`, as of now.
    pub(crate) fn new(staging: &Staging) -> Pulse {
        Pulse { beats: staging.mapping.beats(), moved: Instant::now() }
    }

    /// Whether the worker has not beaten for [`SILENT_LIMIT`] (looking at its beat now).
    pub(crate) fn silent(&mut self, staging: &Staging) -> bool {
        let beats = staging.mapping.beats();
        if beats != self.beats {
            *self = Pulse { beats, moved: Instant::now() };
        }
        self.moved.elapsed() >= SILENT_LIMIT
    }

    /// The error of a wait given up because the worker went [`Pulse::silent`].
    pub(crate) fn silence() -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the worker showed no sign of life for {} s while the agent waited for it \
                 (stopped or hung as a whole): taken as lost",
                SILENT_LIMIT.as_secs()
            ),
        )
    }
}

/// A channel's socket, with the staging memory its worker beats in.
pub(crate) struct Link {
    stream: UnixStream,
    staging: Arc<Staging>,
    /// At most this long for a read to get bytes, whatever the beat says (`None`: as
    /// long as the worker lives).
    pub(crate) patience: Option<Duration>,
}

impl Link {
    pub(crate) fn new(stream: UnixStream, staging: Arc<Staging>) -> Link {
        Link { stream, staging, patience: None }
    }

    /// Wait up to `slice` for the socket to be readable.
    fn wait(&self, slice: Duration) -> io::Result<()> {
        let mut fd = libc::pollfd { fd: self.stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ms = libc::c_int::try_from(slice.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: one live pollfd, nfds 1.
        if unsafe { libc::poll(&mut fd, 1, ms) } < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(())
    }
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let started = Instant::now();
        let mut pulse = Pulse::new(&self.staging);
        loop {
            match rustix::net::recv(&self.stream, &mut *buf, rustix::net::RecvFlags::DONTWAIT) {
                Ok((n, _)) => return Ok(n),
                Err(rustix::io::Errno::AGAIN) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
            let mut slice = LOOK_EVERY;
            if let Some(patience) = self.patience {
                let left = patience.saturating_sub(started.elapsed());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the worker's answer stopped in the middle for {patience:.1?}"),
                    ));
                }
                slice = slice.min(left);
            }
            self.wait(slice)?;
            if pulse.silent(&self.staging) {
                return Err(Pulse::silence());
            }
        }
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

impl AsFd for Link {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_waits_while_the_worker_beats_and_gives_up_when_it_stops() {
        let staging = Arc::new(Staging::new("dpuio-test-link", 1, 4096).unwrap());
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let mut link = Link::new(ours, staging.clone());

        // A worker that beats and answers after a while longer than the silent limit.
        let beating = {
            let staging = staging.clone();
            std::thread::spawn(move || {
                let until = Instant::now() + SILENT_LIMIT + Duration::from_secs(1);
                while Instant::now() < until {
                    staging.mapping.beat();
                    std::thread::sleep(Duration::from_millis(100));
                }
                theirs.write_all(b"late").unwrap();
                theirs
            })
        };
        let mut got = [0u8; 4];
        link.read_exact(&mut got).expect("a beating worker is waited for");
        assert_eq!(&got, b"late");
        let _theirs = beating.join().unwrap();

        // A worker that beats no more: the read gives up after the limit.
        let started = Instant::now();
        let err = link.read(&mut got).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("no sign of life"), "{err}");
        let waited = started.elapsed();
        assert!(waited >= SILENT_LIMIT && waited < SILENT_LIMIT * 3, "gave up after {waited:?}");

        // With a patience, a silent socket fails after it, beat or not.
        link.patience = Some(Duration::from_millis(300));
        staging.mapping.beat();
        let err = link.read(&mut got).unwrap_err();
        assert!(err.to_string().contains("stopped in the middle"), "{err}");
    }
}
