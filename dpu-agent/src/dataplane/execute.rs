//! Requests the engine thread runs itself: a payload request whose memory is mapped
//! (the backend reads into, or writes from, host memory directly), one whose memory is
//! reached with put/get (the steps [`protocol::Staged`] gives, through the staging
//! region of the host's lane), and a metadata entry (its request copied out of host
//! memory once, run through the agent's namespace policy, its answer written back).
//!
//! Every function here performs; none decides what runs where (the ring protocol and
//! [`super::policy`] do). Backend failures become error completions; only a transport
//! failure (the host is gone) is an `Err`.

use std::sync::Arc;
use std::time::Instant;

use dpuio_backend::{Object, Staged};
use dpuio_proto::wire::{self, MetaSubmission, Opcode, Submission};
use fabric::transport::Endpoint as _;

use super::host_memory::{FLUSH_TIMEOUT, HostAccess, HostRegion, StagingPairs};
use super::protocol::{self, Step};
use super::registry::DataPlaneError;
use super::sessions::{self, Agent, Session};
use super::{meta, policy};
use crate::metrics::{BackendTimes, timed};
use crate::validate;

/// What the engine runs a request with: its access to the request's host, its chunk
/// size (a staging half), and where backend times go.
pub(super) struct Exec<'a> {
    pub host: HostAccess<'a>,
    pub agent: &'a Agent,
    pub chunk_bytes: usize,
    pub times: &'a BackendTimes,
}

impl Exec<'_> {
    /// Run one validated request. Backend failures become error completions; only a
    /// transport failure (the host is gone) is an `Err`.
    pub fn execute(&mut self, session: &Session, sub: &Submission) -> Result<(wire::Status, u64), DataPlaneError> {
        let (Ok(handle), Some(region)) = (session.handle(sub.handle), session.host_region(sub.region_id)) else {
            return Ok((wire::Status::BadHandle, 0)); // closed between validation and now
        };
        let object = &handle.object;
        let chunk_bytes = self.chunk_bytes as u64;
        let mut done = 0u64;
        match (&region.mapped, sub.opcode) {
            (Some(mapped), Opcode::Read) => {
                for c in validate::chunks(sub.file_offset, sub.region_offset, sub.length, chunk_bytes) {
                    let dst = mapped.bytes_mut(c.region_offset as usize, c.length as usize);
                    match timed(&self.times.read, || object.read_into(dst, c.file_offset)) {
                        Ok(n) => {
                            done += n as u64;
                            if (n as u64) < c.length {
                                break; // end of file
                            }
                        }
                        Err(e) => return Ok(io_failed(session, sub, &e)),
                    }
                }
            }
            (Some(mapped), Opcode::Write) => {
                for c in validate::chunks(sub.file_offset, sub.region_offset, sub.length, chunk_bytes) {
                    let src = mapped.bytes(c.region_offset as usize, c.length as usize);
                    if let Err(e) = timed(&self.times.write, || object.write_from(src, c.file_offset)) {
                        return Ok(io_failed(session, sub, &e));
                    }
                    done += c.length;
                }
            }
            (None, _) => return self.execute_staged(session, sub, &region, object),
        }
        if policy::syncs(sub)
            && let Err(e) = timed(&self.times.sync, || object.sync())
        {
            return Ok(io_failed(session, sub, &e));
        }
        Ok((wire::Status::Ok, done))
    }

    /// Run one validated request whose region is not mapped: its payload moves
    /// through this lane's staging region in the steps [`protocol::Staged`] gives. A
    /// chunk the backend read into memory of its own ([`Object::read_staged`]: a tenant
    /// DAOS worker's staging) is put from there, and that memory is held until the
    /// next flush; a chunk to write is got straight into such memory where the backend
    /// lends it ([`Object::staging_for_write`]).
    fn execute_staged(
        &mut self,
        session: &Session,
        sub: &Submission,
        region: &HostRegion,
        object: &Arc<dyn Object>,
    ) -> Result<(wire::Status, u64), DataPlaneError> {
        let half_bytes = self.chunk_bytes;
        let HostAccess { peer, staging, lent, pairs } = &mut self.host;
        // This request's pair of staging halves; the puts of the request that had it
        // before are done (the pair's flush), those of the requests since may not be.
        let pair = pairs.claim(&peer.endpoint);
        let half_at = |half| StagingPairs::offset(pair, half, half_bytes);
        let failure = |e: dpuio_backend::Error| {
            io_failed(session, sub, &e);
            policy::failure(&e)
        };
        // Per staging half: the backend's memory its last chunk was read into, if any.
        let mut landed: [Option<Staged>; 2] = [None, None];
        // A write's chunk: the backend's memory lent for it, and whether the get went
        // straight there (else it is copied there from the lane's staging).
        let (mut lent_write, mut got_into_lent): (Option<Staged>, bool) = (None, false);
        let mut transfer = protocol::Staged::new(*sub, self.chunk_bytes as u64);
        while let Some(step) = transfer.poll() {
            match step {
                Step::Read { chunk, half } => {
                    let at = half_at(half);
                    let len = chunk.length as usize;
                    let read = timed(&self.times.read, || match object.read_staged(chunk.file_offset, len) {
                        Some(staged) => staged.map(|s| (s.len(), Some(s))),
                        None => object.read_into(staging.bytes_mut(at, len), chunk.file_offset).map(|n| (n, None)),
                    });
                    transfer.read(
                        read.map(|(n, staged)| {
                            landed[half] = staged;
                            n
                        })
                        .map_err(failure),
                    );
                }
                Step::Put { half, len, region_offset } => {
                    let at = half_at(half);
                    let to = region.addr + region_offset;
                    match &landed[half] {
                        Some(s) => match lent.region(s.memory()) {
                            Some(from) => peer.endpoint.put(from, s.offset(), len, to, &region.key)?,
                            None => {
                                staging.bytes_mut(at, len).copy_from_view(s.bytes().slice(..len));
                                peer.endpoint.put(staging, at, len, to, &region.key)?;
                            }
                        },
                        None => peer.endpoint.put(staging, at, len, to, &region.key)?,
                    }
                }
                Step::Get { chunk } => {
                    let (len, from) = (chunk.length as usize, region.addr + chunk.region_offset);
                    lent_write = object.staging_for_write(len).and_then(Result::ok);
                    match lent_write.as_ref().and_then(|s| Some((lent.region(s.memory())?, s.offset()))) {
                        Some((into, at)) => {
                            peer.endpoint.get(into, at, len, from, &region.key)?;
                            got_into_lent = true;
                        }
                        None => {
                            peer.endpoint.get(staging, half_at(0), len, from, &region.key)?;
                            got_into_lent = false;
                        }
                    }
                }
                Step::Flush => {
                    peer.endpoint.flush(FLUSH_TIMEOUT)?;
                    landed = [None, None];
                }
                Step::Write { chunk } => {
                    let src = staging.bytes(half_at(0), chunk.length as usize);
                    let wrote = timed(&self.times.write, || match lent_write.take() {
                        Some(mut into) => {
                            if !got_into_lent {
                                into.bytes_mut().copy_from_view(src);
                            }
                            object.write_staged(into, chunk.file_offset)
                        }
                        None => object.write_from(src, chunk.file_offset),
                    });
                    transfer.wrote(wrote.map_err(failure));
                }
                Step::Sync => transfer.synced(timed(&self.times.sync, || object.sync()).map_err(failure)),
                Step::Done { status, result } => {
                    // Puts from a backend's memory finish before it gets the memory back.
                    if landed.iter().any(Option::is_some) {
                        peer.endpoint.flush(FLUSH_TIMEOUT)?;
                    }
                    return Ok((status, result));
                }
            }
        }
        // Not reached: a staged request always ends with Step::Done.
        Ok((wire::Status::Io, 0))
    }

    /// Run one metadata entry whose memory ranges were checked: copy its request out
    /// of host memory once, run it through the agent's namespace policy (the gRPC
    /// handlers' own), and write the answer, or the error gRPC would give, into its
    /// answer range. Only a transport failure is an `Err`.
    pub fn run_meta(&mut self, session: &Session, m: &MetaSubmission) -> Result<(wire::Status, u64), DataPlaneError> {
        let Some(answer) = session.host_region(m.answer_region) else {
            return Ok((wire::Status::BadRegion, 0)); // deregistered since validation
        };
        let mut request = vec![0u8; m.request_length as usize];
        if m.request_length > 0 {
            let Some(region) = session.host_region(m.request_region) else {
                return Ok((wire::Status::BadRegion, 0));
            };
            self.host.read_range(&region, m.request_offset, &mut request)?;
        }
        let started = Instant::now();
        let answered = match meta::request(m, &request) {
            Ok(asked) => self.meta_answer(session.id, &answer, m, asked)?,
            Err(e) => Err(e),
        };
        meta::count(&session.metrics, m.opcode, &answered, started);
        match answered {
            Ok(written) => Ok((wire::Status::Ok, written)),
            Err(refused) => {
                let record = meta::error_answer(&refused, m.answer_length as usize);
                self.host.write(&answer, m.answer_offset, &record)?;
                Ok((wire::Status::Refused, record.len() as u64))
            }
        }
    }

    /// Run `asked` and write its answer: the bytes written, or why the namespace
    /// refused it.
    fn meta_answer(
        &mut self,
        session_id: u64,
        answer: &HostRegion,
        m: &MetaSubmission,
        asked: meta::Request,
    ) -> Result<crate::error::Result<u64>, DataPlaneError> {
        let room = m.answer_length as usize;
        let reply = match sessions::namespace_call(self.agent, session_id, asked.clone()) {
            Ok(reply) => reply,
            Err(e) => return Ok(Err(e)),
        };
        if let meta::Reply::Object { object, attr } = &reply {
            let header = u64::from(wire::META_ANSWER_HEADER_BYTES);
            let want = attr.size.min(u64::from(m.answer_length).saturating_sub(header));
            let at = m.answer_offset + header;
            return Ok(match self.host.read_object(answer, at, want, &**object, self.chunk_bytes)? {
                Ok(n) => {
                    self.host.write(answer, m.answer_offset, &meta::open_read_header(attr, n))?;
                    Ok(header + n)
                }
                Err(e) => Err(e.into()),
            });
        }
        let call = |asked| sessions::namespace_call(self.agent, session_id, asked);
        Ok(match meta::fitting(reply, asked, room, call) {
            Ok(bytes) => {
                self.host.write(answer, m.answer_offset, &bytes)?;
                Ok(bytes.len() as u64)
            }
            Err(e) => Err(e),
        })
    }
}

/// A backend call of `sub` failed: log it; its completion's status and result.
fn io_failed(session: &Session, sub: &Submission, e: &dpuio_backend::Error) -> (wire::Status, u64) {
    tracing::warn!(session = format!("{:#018x}", session.id), handle = format!("{:#018x}", sub.handle), error = %e,
        "backend I/O failed");
    (policy::failure_status(e), 0)
}
