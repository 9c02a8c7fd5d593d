//! A tenant worker's pieces started by the data plane's engine, which does not wait for
//! their answer: it sends a request and reads the worker's reports as they arrive,
//! between its other work (the channel's descriptor is among those it sleeps on).
//!
//! This is how a host reached with put/get (TCP, RDMA: a DPU's hosts) reads and writes a
//! worker tenant's files: the engine takes slots of the worker's own staging memory
//! (which the transports register), gets a write's bytes from the host into them, sends
//! the pieces, and once the worker reports them puts a read's bytes from the slots to
//! the host. No thread of the agent waits for a worker, so a worker that stops
//! answering holds up its own tenant's requests only (answered `UNAVAILABLE` at the
//! backend's deadline), and a tenant's pieces are in flight together in the worker's
//! DAOS event queue rather than one after another on the engine.
//!
//! Not here: the slots, rounds and deadlines (the data plane's staged I/O), what the
//! pieces the worker is lost with become (run again by the caller through the
//! blocking [`dpuio_backend::Object`] calls, which start a new worker).

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dpuio_backend::{Error, Object, Result};

use crate::client::{Channel, Fault, Process, worker_object};
use crate::link::Pulse;
use crate::staging::Staging;
use crate::wire::{self, Piece, Reply, Reports, Request};

/// How long the engine waits for the rest of a report whose first bytes arrived. The
/// worker writes each whole, so only a worker stopped inside a write makes it wait;
/// the channel is taken as lost then.
const PARTIAL_REPORT_WAIT: Duration = Duration::from_secs(1);

/// Whether `object` is a tenant worker's (its pieces can be sent with [`send`]).
pub fn is_worker(object: &dyn Object) -> bool {
    worker_object(object).is_some()
}

/// The staging memory of the worker that serves `object` now (started if there is
/// none): where the pieces sent with [`send`] have their slots. `None` where `object` is
/// not a worker's.
pub fn staging(object: &dyn Object) -> Option<Result<Arc<Staging>>> {
    let object = worker_object(object)?;
    Some(object.shared().process().map(|p| p.staging.clone()))
}

/// One piece for [`send`]: `len` bytes of `object` at `offset`, read into (written from)
/// the slot at `slot` in the worker's staging.
pub struct DirectPiece<'a> {
    pub object: &'a dyn Object,
    pub offset: u64,
    pub slot: u64,
    pub len: u64,
    pub write: bool,
}

/// Pieces sent to a worker, not all reported yet.
pub struct Sent {
    process: Arc<Process>,
    channel: Channel,
    reports: Reports,
    pulse: Pulse,
}

/// Send `pieces` as one request to the worker whose staging is `staging` (their slots
/// are there; each piece's object is served by that worker's tenant). An error where
/// they cannot go: the worker was replaced since the slots were taken (they mean
/// nothing to a new one), or it is lost, or an object cannot be named to it; the caller
/// runs them another way.
pub fn send(staging: &Arc<Staging>, pieces: &[DirectPiece<'_>]) -> Result<Sent> {
    let gone = |reason: String| Error::Unavailable { what: "a tenant's DAOS worker".into(), reason };
    let objects = pieces
        .iter()
        .map(|p| worker_object(p.object))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::InvalidArgument("pieces sent to a worker must be a worker's objects".into()))?;
    let Some(first) = objects.first() else { return Err(Error::InvalidArgument("no pieces to send".into())) };
    let process = first.shared().process()?;
    if !Arc::ptr_eq(&process.staging, staging) {
        return Err(gone("the worker whose staging holds the pieces' slots was replaced".into()));
    }
    let lost = |e: std::io::Error| {
        process.lost.store(true, Ordering::Relaxed);
        gone(e.to_string())
    };
    let mut wire_pieces = Vec::with_capacity(pieces.len());
    for (p, object) in pieces.iter().zip(&objects) {
        let id = match object.id(&process) {
            Ok(id) => id,
            Err(Fault::Backend(e)) => return Err(e),
            Err(Fault::Lost(l)) => return Err(lost(l.0)),
        };
        wire_pieces.push(Piece {
            object: id,
            offset: p.offset,
            staging: p.slot,
            len: p.len,
            write: p.write,
            host: None,
        });
    }
    let mut channel = process.channel().map_err(|l| lost(l.0))?;
    channel.get_mut().patience = Some(PARTIAL_REPORT_WAIT);
    wire::send(channel.get_mut(), &Request::Io { pieces: wire_pieces }).map_err(lost)?;
    first.shared().staged_pieces.fetch_add(pieces.len() as u64, Ordering::Relaxed);
    let pulse = Pulse::new(&process.staging);
    Ok(Sent { process: process.clone(), channel, reports: Reports::new(pieces.len()), pulse })
}

impl Sent {
    /// The channel the reports arrive on: readable when some did.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.channel.get_ref().as_fd()
    }

    /// Whether reports read from the channel wait in its buffer (the descriptor does
    /// not say so).
    pub fn buffered(&self) -> bool {
        !self.channel.buffer().is_empty()
    }

    /// Take the reports that arrived (`readable`: the descriptor said so; else only those
    /// buffered), `on_piece(index, outcome)` for each, without waiting for more. Whether
    /// every piece is reported. An error means the worker is lost (marked so: the next
    /// call starts a new one); the pieces not reported ([`Sent::missing`]) are the
    /// caller's to run again.
    pub fn read(&mut self, readable: bool, on_piece: &mut dyn FnMut(usize, Result<u64>)) -> std::io::Result<bool> {
        let mut next = readable || self.buffered();
        while next {
            let reply = wire::recv::<Reply>(&mut self.channel).inspect_err(|_| self.lost())?;
            if self.reports.take(reply, &mut |i, r| on_piece(i, r.map_err(Error::from))).inspect_err(|_| self.lost())? {
                return Ok(true);
            }
            next = self.buffered();
        }
        Ok(false)
    }

    /// Why the worker is taken as stopped as a whole, if it is: no beat for
    /// 4 s since the pieces went (or since its last beat). It is then marked
    /// lost (the next call replaces it) and the pieces not reported are the caller's to
    /// run again; a worker merely slow in DAOS beats on and is waited for.
    pub fn stopped(&mut self) -> Option<std::io::Error> {
        if !self.pulse.silent(&self.process.staging) {
            return None;
        }
        self.lost();
        Some(Pulse::silence())
    }

    /// The pieces not reported.
    pub fn missing(&self) -> Vec<usize> {
        self.reports.missing().collect()
    }

    fn lost(&self) {
        self.process.lost.store(true, Ordering::Relaxed);
    }

    /// The worker answered every piece: its channel serves other calls again.
    pub fn finish(mut self) {
        if self.reports.missing().next().is_some() || self.process.lost.load(Ordering::Relaxed) {
            return;
        }
        self.channel.get_mut().patience = None;
        self.process.give_back(self.channel);
    }
}
