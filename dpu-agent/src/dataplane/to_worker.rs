//! Staged requests on a tenant DAOS worker's objects, run by the worker with no thread
//! of the agent waiting for it ([`dpuio_worker::direct`]).
//!
//! The engine took slots of the worker's own staging for such a request
//! ([`super::staged`]); here its pieces, with those of the other requests started in the
//! same round of the engine, go to the worker as one request per worker (at most
//! [`PIECES_PER_REQUEST`] pieces, the depth of its DAOS event queue), and the engine
//! reads the worker's reports as they arrive: on each of its rounds, and woken by them
//! when it sleeps. The last piece of a request hands it back as the I/O threads do
//! ([`io::Back`]): the engine puts a read's bytes from the slots to the host.
//!
//! A worker that stops answering holds up only its tenant's requests, which its deadline
//! answers `UNAVAILABLE` (their slots stay out until the worker answers or is lost). One
//! that stops as a whole (no beat for a few seconds, [`dpuio_worker::direct::Sent::stopped`])
//! is taken as lost. The pieces a lost worker (or one replaced since the slots were
//! taken) did not report are made again one at a time through the blocking object calls,
//! which start a new worker (and kill a stopped one), on a thread of their own
//! ([`io::run_pieces_aside`]): the engine does not wait for the new worker to start.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpuio_proto::wire::Opcode;
use dpuio_worker::direct::{self, DirectPiece, Sent};
use dpuio_worker::staging::Staging;

use super::io::{self, InFlight, Memory};
use crate::metrics::BackendTimes;

/// Pieces in one request to a worker: the depth of its DAOS event queue.
const PIECES_PER_REQUEST: usize = 32;

/// How often the engine looks at the beats of the workers it has requests out with.
const BEATS_EVERY: Duration = Duration::from_millis(250);

/// Pieces of staged requests: the request, and the index of the piece in it.
type Pieces = Vec<(Arc<InFlight>, usize)>;

/// A request to a worker, and per piece the staged request and its piece's index.
struct Out {
    sent: Sent,
    pieces: Pieces,
    at: Instant,
}

/// The engine's requests to tenant workers.
pub(super) struct ToWorker {
    /// Started since the last send: their pieces go out together.
    unsent: Vec<Arc<InFlight>>,
    out: Vec<Out>,
    times: BackendTimes,
    beats_looked: Instant,
}

impl ToWorker {
    pub fn new(times: BackendTimes) -> ToWorker {
        ToWorker { unsent: Vec::new(), out: Vec::new(), times, beats_looked: Instant::now() }
    }

    /// Take `request` (its slots in its worker's staging) for the next [`ToWorker::send`].
    pub fn queue(&mut self, request: Arc<InFlight>) -> Arc<InFlight> {
        self.unsent.push(request.clone());
        request
    }

    /// Send the pieces taken since the last send, one request per worker (and per
    /// [`PIECES_PER_REQUEST`] pieces). Pieces a worker cannot take run here.
    pub fn send(&mut self) {
        if self.unsent.is_empty() {
            return;
        }
        let mut groups: Vec<(Arc<Staging>, Pieces)> = Vec::new();
        for request in std::mem::take(&mut self.unsent) {
            let Memory::Staged(staged) = &request.request.memory else { continue };
            for index in 0..staged.pieces.len() {
                let i = match groups
                    .iter()
                    .rposition(|(s, p)| Arc::ptr_eq(s, &staged.staging) && p.len() < PIECES_PER_REQUEST)
                {
                    Some(i) => i,
                    None => {
                        groups.push((staged.staging.clone(), Vec::new()));
                        groups.len() - 1
                    }
                };
                groups[i].1.push((request.clone(), index));
            }
        }
        for (staging, pieces) in groups {
            let wire: Vec<DirectPiece<'_>> = pieces
                .iter()
                .map(|(request, index)| {
                    let Memory::Staged(staged) = &request.request.memory else { unreachable!("grouped as staged") };
                    let piece = &staged.pieces[*index];
                    DirectPiece {
                        object: &*request.request.handle.object,
                        offset: piece.file_offset,
                        slot: staged.offsets[*index],
                        len: piece.length,
                        write: request.request.sub.opcode == Opcode::Write,
                    }
                })
                .collect();
            match direct::send(&staging, &wire) {
                Ok(sent) => self.out.push(Out { sent, pieces, at: Instant::now() }),
                Err(e) => {
                    tracing::warn!(error = %e, "a tenant worker cannot take staged pieces; they are made one at a time");
                    io::run_pieces_aside(pieces, &self.times);
                }
            }
        }
    }

    /// Take the reports the workers sent, without waiting for more: each piece's outcome
    /// to its request (the last hands it back). The pieces of a lost worker run here.
    pub fn read(&mut self) {
        if self.out.is_empty() {
            return;
        }
        let mut polled: Vec<rustix::event::PollFd<'_>> =
            self.out.iter().map(|o| rustix::event::PollFd::new(o, rustix::event::PollFlags::IN)).collect();
        let zero = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
        let readable: Vec<bool> = match rustix::event::poll(&mut polled, Some(&zero)) {
            Ok(_) => polled.iter().map(|p| !p.revents().is_empty()).collect(),
            Err(_) => vec![false; polled.len()],
        };
        drop(polled);
        let beats = self.beats_looked.elapsed() >= BEATS_EVERY;
        if beats {
            self.beats_looked = Instant::now();
        }
        // From the last, so that a finished one's place takes one already looked at.
        for i in (0..self.out.len()).rev() {
            let Out { sent, pieces, at } = &mut self.out[i];
            let read = if readable[i] || sent.buffered() {
                let elapsed = at.elapsed();
                let times = &self.times;
                sent.read(readable[i], &mut |index, outcome| {
                    let (request, index) = &pieces[index];
                    let Memory::Staged(staged) = &request.request.memory else { return };
                    observe(times, request, elapsed);
                    request.piece_outcome(&staged.pieces[*index], outcome.map(|n| n as usize), times);
                })
            } else if let Some(silence) = beats.then(|| sent.stopped()).flatten() {
                Err(silence)
            } else {
                continue;
            };
            match read {
                Ok(false) => {}
                Ok(true) => self.out.swap_remove(i).sent.finish(),
                Err(e) => {
                    let out = self.out.swap_remove(i);
                    let missing = out.sent.missing();
                    tracing::warn!(error = %e, pieces = missing.len(),
                        "lost a tenant's DAOS worker with staged pieces out; they are made again, on a new worker");
                    let again = missing.into_iter().map(|m| out.pieces[m].clone()).collect();
                    io::run_pieces_aside(again, &self.times);
                }
            }
        }
    }

    /// The descriptors the workers' reports arrive on, for the engine to sleep on.
    pub fn fds(&self) -> Vec<RawFd> {
        self.out.iter().map(|o| o.sent.fd().as_raw_fd()).collect()
    }
}

/// A piece's time in storage, by its request's operation.
fn observe(times: &BackendTimes, request: &InFlight, elapsed: Duration) {
    let h = if request.request.sub.opcode == Opcode::Read { &times.read } else { &times.write };
    h.observe(elapsed.as_secs_f64());
}

impl AsFd for Out {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.sent.fd()
    }
}
