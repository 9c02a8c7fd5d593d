//! An I/O thread's queue in an agent whose tenants may run in workers: pieces on a
//! worker's objects go to that worker as one request per batch, where its own DAOS event
//! queue keeps them in flight together; the other pieces go to the agent's own queue,
//! which runs them while the workers work.
//!
//! Without this a worker's object would run one piece at a time on each I/O thread
//! (the agent's DAOS queue does not know it), which is a queue depth of two on a
//! two-core DPU.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use dpuio_backend::{Error, IoOp, IoQueue, IoRequest, Object, Result};

use crate::client::{Process, Shared, WorkerObject, worker_object};
use crate::host;
use crate::staging::Slot;
use crate::wire::{self, Piece, Request};

/// Pieces a batch may hold (the depth of a worker's DAOS event queue).
const DEPTH: usize = 32;

/// `main`, with pieces on worker objects sent to their workers.
pub fn routed(main: Box<dyn IoQueue>) -> Box<dyn IoQueue> {
    Box::new(RoutedQueue { main })
}

struct RoutedQueue {
    main: Box<dyn IoQueue>,
}

/// A worker's share of a batch: its process and the batch positions of its pieces.
struct Group {
    shared: Arc<Shared>,
    process: Option<Arc<Process>>,
    positions: Vec<usize>,
}

/// A request sent to a worker: the channel its reply comes on, and per piece its batch
/// position and staging slot (none where the piece is in a host region the worker has
/// mapped, [`crate::host`]).
struct Sent<'a> {
    process: &'a Process,
    channel: crate::client::Channel,
    pieces: Vec<(usize, Option<Slot>, u64)>,
}

impl IoQueue for RoutedQueue {
    fn depth(&self) -> usize {
        self.main.depth().max(DEPTH)
    }

    fn overlaps(&self, object: &dyn Object) -> bool {
        worker_object(object).is_some() || self.main.overlaps(object)
    }

    fn deadline(&self) -> Option<std::time::Duration> {
        self.main.deadline()
    }

    fn run(&mut self, batch: &mut [IoRequest<'_>], done: &mut dyn FnMut(usize, Result<usize>)) {
        // The agent's own pieces first, the workers' after, remembering where each was.
        let mut origin: Vec<usize> = (0..batch.len()).collect();
        let mut own = 0;
        for i in 0..batch.len() {
            if worker_object(batch[i].object).is_none() {
                batch.swap(i, own);
                origin.swap(i, own);
                own += 1;
            }
        }
        if own == batch.len() {
            return self.main.run(batch, done);
        }
        let (mine, theirs) = batch.split_at_mut(own);
        let origin_theirs = &origin[own..];

        let mut groups: Vec<Group> = Vec::new();
        for (pos, request) in theirs.iter().enumerate() {
            let shared = worker_object(request.object).map(WorkerObject::shared).cloned();
            let Some(shared) = shared else { continue };
            match groups.iter_mut().find(|g| Arc::ptr_eq(&g.shared, &shared)) {
                Some(g) => g.positions.push(pos),
                None => groups.push(Group { shared, process: None, positions: vec![pos] }),
            }
        }
        for g in &mut groups {
            g.process = g.shared.process().ok();
        }
        // Send every worker its pieces that got a slot; the rest run one by one below.
        let mut leftover: Vec<usize> = Vec::new();
        let mut sent: Vec<Sent<'_>> = Vec::new();
        for g in &groups {
            let Some(process) = g.process.as_ref() else {
                leftover.extend(&g.positions);
                continue;
            };
            match send(process, &g.shared, theirs, &g.positions, &mut leftover) {
                Ok(Some(s)) => sent.push(s),
                Ok(None) => {}
                Err(positions) => leftover.extend(positions),
            }
        }
        self.main.run(mine, &mut |i, r| done(origin[i], r));
        for s in sent {
            if let Err(positions) = collect(s, theirs, &mut |pos, r| done(origin_theirs[pos], r)) {
                leftover.extend(positions);
            }
        }
        // Pieces without a slot, or whose worker was lost: one at a time, each made on
        // a new worker if need be.
        leftover.sort_unstable();
        for pos in leftover {
            done(origin_theirs[pos], theirs[pos].run_blocking());
        }
    }
}

/// Send `positions` of `theirs` to `process` as one request: a piece in a host region
/// the worker has mapped names it, any other takes a staging slot (a write's bytes copied
/// in). Pieces without either go to `leftover`; `Err` returns the positions when the
/// worker cannot take it.
fn send<'a>(
    process: &'a Arc<Process>,
    shared: &Shared,
    theirs: &[IoRequest<'_>],
    positions: &[usize],
    leftover: &mut Vec<usize>,
) -> std::result::Result<Option<Sent<'a>>, Vec<usize>> {
    let mut pieces = Vec::with_capacity(positions.len());
    let mut wire_pieces = Vec::with_capacity(positions.len());
    for &pos in positions {
        let request = &theirs[pos];
        let len = request.len() as u64;
        let object = worker_object(request.object).expect("grouped as a worker object");
        let Ok(id) = object.id(process) else {
            leftover.push(pos);
            continue;
        };
        let write = matches!(request.op, IoOp::Write(_));
        let (ptr, bytes) = match &request.op {
            IoOp::Read(dst) => (dst.as_ptr(), dst.len()),
            IoOp::Write(src) => (src.as_ptr(), src.len()),
        };
        if let Some((file, at)) = host::find(ptr, bytes).filter(|(file, _)| process.has_host(file)) {
            wire_pieces.push(Piece {
                object: id,
                offset: request.offset,
                staging: at,
                len,
                write,
                host: Some(file.id),
            });
            pieces.push((pos, None, len));
            shared.host_pieces.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let Some(slot) = (len <= shared.slot_bytes).then(|| process.staging.try_take()).flatten() else {
            leftover.push(pos);
            continue;
        };
        if let IoOp::Write(bytes) = &request.op {
            let Ok(mut staged) = process.staging.mapping.bytes_mut(slot.offset, len) else {
                leftover.push(pos);
                continue;
            };
            staged.copy_from_view(*bytes);
        }
        wire_pieces.push(Piece { object: id, offset: request.offset, staging: slot.offset, len, write, host: None });
        pieces.push((pos, Some(slot), len));
        shared.staged_pieces.fetch_add(1, Ordering::Relaxed);
    }
    if pieces.is_empty() {
        return Ok(None);
    }
    let back = |pieces: Vec<(usize, Option<Slot>, u64)>| pieces.into_iter().map(|(pos, _, _)| pos).collect::<Vec<_>>();
    let Ok(mut channel) = process.channel().map_err(|l| l.0) else { return Err(back(pieces)) };
    if wire::send(channel.get_mut(), &Request::Io { pieces: wire_pieces }).is_err() {
        process.lost.store(true, Ordering::Relaxed);
        return Err(back(pieces));
    }
    Ok(Some(Sent { process, channel, pieces }))
}

/// The reply to a [`Sent`]: `done(position, outcome)` for each piece as the worker
/// reports it, a read's bytes first copied out of its slot. `Err` returns the positions
/// not reported when the worker was lost.
fn collect(
    mut s: Sent<'_>,
    theirs: &mut [IoRequest<'_>],
    done: &mut dyn FnMut(usize, Result<usize>),
) -> std::result::Result<(), Vec<usize>> {
    let mut reported = vec![false; s.pieces.len()];
    let staging = &s.process.staging.mapping;
    let pieces = &s.pieces;
    let answered = wire::recv_pieces(&mut s.channel, pieces.len(), &mut |index, result| {
        let (pos, slot, len) = (&pieces[index].0, &pieces[index].1, pieces[index].2);
        reported[index] = true;
        let outcome = match result {
            Ok(n) => {
                let n = n.min(len);
                match (&mut theirs[*pos].op, slot) {
                    (IoOp::Read(dst), Some(slot)) => match staging.bytes(slot.offset, n) {
                        Ok(staged) => {
                            dst.slice_mut(..n as usize).copy_from_view(staged);
                            Ok(n as usize)
                        }
                        Err(e) => Err(Error::InvalidArgument(e.to_string())),
                    },
                    // In the host's memory already, or written.
                    _ => Ok(n as usize),
                }
            }
            Err(e) => Err(e.into()),
        };
        done(*pos, outcome);
    });
    match answered {
        Ok(()) => {
            s.process.give_back(s.channel);
            Ok(())
        }
        Err(_) => {
            s.process.lost.store(true, Ordering::Relaxed);
            Err(s.pieces.iter().zip(&reported).filter(|(_, r)| !**r).map(|((pos, _, _), _)| *pos).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test double of the agent's own queue that keeps a deadline, as DAOS's does.
    struct DeadlineQueueForTests;

    impl IoQueue for DeadlineQueueForTests {
        fn depth(&self) -> usize {
            1
        }
        fn overlaps(&self, _: &dyn Object) -> bool {
            false
        }
        fn deadline(&self) -> Option<std::time::Duration> {
            Some(std::time::Duration::from_secs(7))
        }
        fn run(&mut self, batch: &mut [IoRequest<'_>], done: &mut dyn FnMut(usize, Result<usize>)) {
            for (i, request) in batch.iter_mut().enumerate() {
                done(i, request.run_blocking());
            }
        }
    }

    /// The data plane reads the deadline of the queue it is given, this one in an agent
    /// with workers: without it, staged I/O DAOS held was never answered at its deadline.
    #[test]
    fn the_routed_queue_keeps_the_deadline_of_the_agents_own() {
        assert_eq!(routed(Box::new(DeadlineQueueForTests)).deadline(), Some(std::time::Duration::from_secs(7)));
    }
}
