//! Metadata entries through a ring (stat, open, create, close, open-read, lookup,
//! readdir, remove): the request goes into the ring's request area, the answer comes back into
//! its answer area or a caller's region. The choices (areas, groups, which entries run
//! again after an agent restart, how an answer reads) are
//! [`dpuio_proto::host_ring::meta`]'s; this file writes, submits, waits and reads.

use std::sync::Arc;

use dpuio_proto::host_ring::meta::{self, Answer, MetaCall, Range};
use dpuio_proto::wire::{self, MetaOpcode, Opcode};
use host_bytes::HostBytes;

use super::{DataPlane, RegisteredRegion, Request};
use crate::error::{Error, Result};

/// Where a metadata entry's answer goes ([`DataPlane::metadata`]).
#[derive(Clone, Copy)]
pub(crate) enum AnswerTo<'a> {
    /// The ring's own answer area, at most this many bytes of it (up to
    /// [`meta::ANSWER_BYTES`]).
    Ring(u32),
    /// A range of a caller's region: the region, an offset and a length.
    Region(&'a RegisteredRegion, u64, u32),
}

impl AnswerTo<'_> {
    /// The whole of the ring's answer area.
    pub(crate) const RING: AnswerTo<'static> = AnswerTo::Ring(meta::ANSWER_BYTES as u32);
}

/// Owed closes ([`DataPlane::close_later`]) sent along with one metadata call at most.
const OWED_PER_CALL: usize = 16;
/// Owed closes kept at most: past it they are sent at once.
const OWED_MAX: usize = 32;
/// An owed close's answer range, at the end of the ring's answer area (a header).
const OWED_ANSWER: usize = wire::META_ANSWER_HEADER_BYTES as usize;
/// The `user_data` of owed closes in a call's submission (the call's own is 0).
const OWED_TAG: u64 = u64::MAX;

/// Whether a call's answer leaves the tail of the ring's answer area to owed closes:
/// answers of a header or a few records, and answers into a caller's region. Not
/// listings, lookups and open-reads, which fill what room they are given.
fn carries_owed(call: &MetaCall<'_>, to: AnswerTo<'_>) -> bool {
    matches!(to, AnswerTo::Region(..))
        || matches!(
            call.opcode,
            MetaOpcode::Stat
                | MetaOpcode::StatHandle
                | MetaOpcode::Open
                | MetaOpcode::Create
                | MetaOpcode::Close
                | MetaOpcode::Remove
        )
}

/// The request of `call`, or why it cannot go on a ring.
fn request(op: &str, call: &MetaCall<'_>, whose: &str) -> Result<Vec<u8>> {
    call.request().ok_or_else(|| Error::DataPlane {
        op: op.to_owned(),
        reason: format!("{whose} paths exceed {} bytes (or one exceeds 65535)", meta::REQUEST_BYTES),
    })
}

/// The metadata entry of `opcode` on an open handle.
pub(crate) fn on_handle(opcode: MetaOpcode, handle: u64) -> MetaCall<'static> {
    MetaCall { opcode, flags: 0, handle, strings: &[], arg: 0 }
}

/// A metadata entry's outcome, read out of its answer range in `region` at `offset`
/// (`length` bytes): `parse` for a success (a view of the bytes written), the
/// namespace's refusal as the [`Error::Agent`] gRPC gives, any other status as an I/O
/// error.
fn answer<T>(
    op: &str,
    region: &RegisteredRegion,
    offset: u64,
    length: u32,
    result: std::result::Result<u64, wire::Status>,
    parse: impl FnOnce(HostBytes<'_>) -> Result<T>,
) -> Result<T> {
    let at = usize::try_from(offset).unwrap_or(usize::MAX);
    let inside = |n: usize| at.checked_add(n).is_some_and(|end| end <= region.len());
    match Answer::of(result, length) {
        Answer::Written(n) if inside(n) => parse(region.bytes(at, n)),
        Answer::Written(n) => Err(Error::Protocol { op: op.to_owned(), reason: format!("an answer of {n} bytes") }),
        Answer::TooLong(n) => Err(Error::Protocol { op: op.to_owned(), reason: format!("an answer of {n} bytes") }),
        Answer::Refused if inside(8) => {
            let mut head = [0u8; 8];
            region.read_at(at, &mut head);
            let bytes = meta::refusal_bytes(&head, length);
            let malformed = || Error::Protocol { op: op.to_owned(), reason: "a malformed error record".into() };
            if !inside(bytes) {
                return Err(malformed());
            }
            let e = wire::MetaError::decode(&region.bytes(at, bytes).to_vec()).ok_or_else(malformed)?;
            Err(Error::agent(op, e.code, e.message))
        }
        Answer::Refused => Err(Error::Io { op: op.to_owned(), status: wire::Status::Refused }),
        Answer::Failed(status) => Err(Error::Io { op: op.to_owned(), status }),
    }
}

impl DataPlane {
    /// Run one metadata entry on a ring of its own and wait for it. Its strings go
    /// into the ring's request area; the answer lands where `to` says (the ring's answer
    /// area, or a range of a caller's region). `parse` reads a successful answer (a
    /// view of the bytes written) while the ring is held. A refusal by the namespace is
    /// the same [`Error::Agent`] the gRPC call gives. Blocking (a round trip of
    /// microseconds on shared memory).
    pub(crate) fn metadata<T>(
        self: &Arc<Self>,
        op: &str,
        call: &MetaCall<'_>,
        to: AnswerTo<'_>,
        parse: impl FnOnce(HostBytes<'_>) -> Result<T>,
    ) -> Result<T> {
        let request = request(op, call, "the request's")?;
        if let Some(status) = self.ended() {
            return Err(Error::from_status(op, status)); // before taking a ring it would lose
        }
        let mut batch = self.batch()?;
        let mut owed = if carries_owed(call, to) { self.take_owed(batch.room().saturating_sub(1)) } else { Vec::new() };
        let mut attempts = 0;
        let (answer_to, result) = loop {
            let ring = batch.ring();
            let (entries, ring_region) = (ring.core.entries(), ring.region.id);
            let request_at = meta::request_offset(entries);
            ring.region.write_at(request_at, &request);
            // Owed closes answer into the tail of the answer area, the call in the rest.
            let tail = meta::answer_offset(entries) + meta::ANSWER_BYTES;
            for (i, handle) in owed.iter().enumerate() {
                let answer = Range {
                    region: ring_region,
                    offset: (tail - (i + 1) * OWED_ANSWER) as u64,
                    length: OWED_ANSWER as u32,
                };
                let no_request = Range { region: 0, offset: 0, length: 0 };
                let mut entry = on_handle(MetaOpcode::Close, *handle).entry(no_request, answer);
                entry.user_data = OWED_TAG;
                batch.push_entry(&entry.encode(), false)?;
            }
            let answer_to = match to {
                AnswerTo::Region(r, offset, length) => Range { region: r.id, offset, length },
                AnswerTo::Ring(length) => Range {
                    region: ring_region,
                    offset: meta::answer_offset(entries) as u64,
                    length: length.min((meta::ANSWER_BYTES - owed.len() * OWED_ANSWER) as u32),
                },
            };
            let request_range = Range { region: ring_region, offset: request_at as u64, length: request.len() as u32 };
            batch.push_entry(&call.entry(request_range, answer_to).encode(), false)?;
            let submitted = std::time::Instant::now();
            batch.submit()?;
            let done = batch.wait_spinning(1 + owed.len(), self.options.timeout, self.meta_latency.spin(call))?;
            self.meta_latency.answered(submitted.elapsed());
            // An owed close that failed (a handle an agent restart forgot) is nobody's
            // to act on: nothing was written through it.
            owed.clear();
            let result = done
                .iter()
                .find(|d| d.user_data != OWED_TAG)
                .ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: "no completion".into() })?
                .result;
            // Lost with a restarted agent's ring: run it once more on the new one, if
            // running it twice answers the same.
            match result {
                Err(wire::Status::Lost) if call.runs_again() && attempts < meta::LOST_RETRIES => attempts += 1,
                _ => break (answer_to, result),
            }
        };
        let region = match to {
            AnswerTo::Region(r, ..) => r,
            AnswerTo::Ring(_) => &batch.ring().region,
        };
        answer(op, region, answer_to.offset, answer_to.length, result, parse)
    }

    /// Close `handle` (one nothing was written through: no durability to wait for) with
    /// the next metadata call of this process, in its submission, rather than with a
    /// round trip of its own: a file created or opened and closed again costs one
    /// round trip, not two. Past [`OWED_MAX`] owed, they are sent now. Until then the
    /// agent holds the handle (an unwritten one: nothing of it is lost if the session
    /// ends first, which closes it).
    pub(crate) fn close_later(self: &Arc<Self>, handle: u64) -> Result<()> {
        let mut owed = self.owed_closes.lock().unwrap_or_else(|p| p.into_inner());
        owed.push(handle);
        if owed.len() < OWED_MAX {
            return Ok(());
        }
        drop(owed);
        while let Some(handle) = self.owed_closes.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            let close = on_handle(MetaOpcode::Close, handle);
            match self.metadata("close", &close, AnswerTo::RING, |_| Ok(())) {
                // A handle an agent restart forgot: closed already.
                Err(Error::Agent { .. }) => {}
                other => other?,
            }
        }
        Ok(())
    }

    /// Up to `room` owed closes (at most [`OWED_PER_CALL`]) to send with a call.
    fn take_owed(&self, room: usize) -> Vec<u64> {
        let mut owed = self.owed_closes.lock().unwrap_or_else(|p| p.into_inner());
        let keep = owed.len() - owed.len().min(room).min(OWED_PER_CALL);
        owed.split_off(keep)
    }

    /// Several metadata entries in one submission, each answering into its own range of
    /// a caller's region (a region, an offset and a length), e.g. a loader's batch of
    /// training samples as open-reads: one doorbell and one wait for all of them,
    /// where [`DataPlane::metadata`] pays a wait per entry. Entries go out in groups
    /// that fit a ring and its request area. Each gets its own result, in order, its
    /// errors named by its own `op`; `parse` reads a successful answer as in
    /// [`DataPlane::metadata`]. Only entries that may run twice belong here (an agent
    /// restart runs unanswered ones again). Blocking.
    pub(crate) fn metadata_batch<T>(
        self: &Arc<Self>,
        calls: &[(String, MetaCall<'_>, (&RegisteredRegion, u64, u32))],
        parse: impl Fn(&str, HostBytes<'_>) -> Result<T>,
    ) -> Result<Vec<Result<T>>> {
        let op = calls.first().map_or("metadata", |(op, ..)| op.as_str());
        let requests = calls.iter().map(|(_, call, _)| request(op, call, "an entry's")).collect::<Result<Vec<_>>>()?;
        if let Some(status) = self.ended() {
            return Err(Error::from_status(op, status));
        }
        let lengths: Vec<usize> = requests.iter().map(Vec::len).collect();
        let mut results: Vec<Option<std::result::Result<u64, wire::Status>>> = vec![None; calls.len()];
        let mut batch = self.batch()?;
        let mut next = 0;
        while next < calls.len() {
            let end = next + meta::group(&lengths[next..], batch.room() as u64);
            let mut pending: Vec<usize> = (next..end).collect();
            for _round in 0..meta::BATCH_ROUNDS {
                let ring = batch.ring();
                let (ring_region, mut request_at) = (ring.region.id, meta::request_offset(ring.core.entries()));
                for &i in &pending {
                    let (_, call, (region, offset, length)) = &calls[i];
                    batch.ring().region.write_at(request_at, &requests[i]);
                    let request_range =
                        Range { region: ring_region, offset: request_at as u64, length: requests[i].len() as u32 };
                    let mut entry =
                        call.entry(request_range, Range { region: region.id, offset: *offset, length: *length });
                    entry.user_data = i as u64;
                    batch.push_entry(&entry.encode(), false)?;
                    request_at += requests[i].len();
                }
                batch.submit()?;
                let done = batch.wait(pending.len(), self.options.timeout)?;
                pending.clear();
                for d in done {
                    let Some(slot) = results.get_mut(d.user_data as usize) else { continue };
                    match d.result {
                        // Lost with a restarted agent's ring: run it again on the new one.
                        Err(wire::Status::Lost) => pending.push(d.user_data as usize),
                        r => *slot = Some(r),
                    }
                }
                pending.retain(|&i| results[i].is_none());
                if pending.is_empty() {
                    break;
                }
            }
            for i in pending {
                results[i] = Some(Err(wire::Status::Lost)); // lost again and again: say so
            }
            next = end;
        }
        Ok(calls
            .iter()
            .zip(results)
            .map(|((op, _, (region, offset, length)), result)| match result {
                Some(result) => answer(op, region, *offset, *length, result, |view| parse(op, view)),
                // A completion that echoed another entry's user_data instead of this one's.
                None => Err(Error::Protocol { op: op.clone(), reason: "no completion for this entry".into() }),
            })
            .collect())
    }

    /// Read `handle` from `data.len()` up to `size` bytes (or its end) into `data`,
    /// through the ring's answer area. Blocking.
    pub(crate) fn read_through_ring(
        self: &Arc<Self>,
        op: &str,
        handle: u64,
        data: &mut Vec<u8>,
        size: u64,
    ) -> Result<()> {
        let mut batch = self.batch()?;
        while (data.len() as u64) < size {
            let ring = batch.ring();
            let at = meta::answer_offset(ring.core.entries());
            let request = Request {
                opcode: Opcode::Read,
                handle,
                region_id: ring.region.id,
                region_offset: at as u64,
                file_offset: data.len() as u64,
                length: (size - data.len() as u64).min(meta::ANSWER_BYTES as u64),
                sync: false,
                user_data: 0,
            };
            batch.push_entry(&request.entry(), false)?;
            batch.submit()?;
            let done = batch.wait(1, self.options.timeout)?;
            let d =
                done.first().ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: "no completion".into() })?;
            if d.result == Err(wire::Status::Lost) {
                continue; // into the old ring's memory: read it again into the new one's
            }
            let n = d.result.map_err(|status| Error::Io { op: op.to_owned(), status })? as usize;
            if n == 0 {
                break; // the file shrank
            }
            let start = data.len();
            data.resize(start + n.min(meta::ANSWER_BYTES), 0);
            batch.ring().region.read_at(at, &mut data[start..]);
        }
        Ok(())
    }
}
