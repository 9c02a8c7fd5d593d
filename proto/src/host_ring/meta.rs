//! The host's choices for metadata entries ([`crate::wire::MetaSubmission`]): where
//! their requests and answers go in a ring's region, how many go in one submission,
//! when one runs again after an agent restart, and what its completion says about its
//! answer range.
//!
//! Each ring's region holds, after the ring itself, a request area (the paths of the
//! entries in flight) and an answer area (an answer header, and an open-read's file
//! bytes, a lookup's records or a listing batch). A call may also name a range of a
//! region of its own for the answer (a training sample read straight where it is used).

use std::time::Duration;

use crate::wire::{self, META_ANSWER_HEADER_BYTES, MetaOpcode, MetaSubmission, Status};

/// Bytes of each ring's metadata request area (the paths of one entry), after the ring.
pub const REQUEST_BYTES: usize = 64 * 1024;

/// Bytes of each ring's metadata answer area: a header, and an open-read's file bytes
/// (a whole 128 KiB training sample and more), a lookup's records or a listing batch.
pub const ANSWER_BYTES: usize = 512 * 1024;

/// File bytes an open-read into the ring's answer area can return (the area less its
/// header).
pub const OPEN_READ_BYTES: usize = ANSWER_BYTES - META_ANSWER_HEADER_BYTES as usize;

/// How long a metadata call without payload (stat, lookup, open, create, close, a
/// listing batch) polls for its answer before sleeping, where answers usually come
/// that fast ([`MetaLatency`]). Measured on a 2-core VM: a ring stat takes 20-25 us
/// on the local backend, of which the sleeping thread's wake-up is a third.
pub const SPIN: Duration = Duration::from_micros(50);

/// How long this data plane's metadata answers usually take (a moving average, from
/// submission to answer), so that a call spins for its answer ([`MetaCall::spin`]) only
/// where answers usually come within the spin. Over DAOS a stat's answer takes 200-250 us
/// (the agent's DAOS call), so a 50 us spin always ended in the sleep anyway: it was most
/// of the host's CPU per call (0.5x-1.8x of libdfs's per stat, create or remove). A call
/// that sleeps is answered a wake-up later, which the average then includes, so a fast
/// backend is still seen as fast and spun for.
#[derive(Debug, Default)]
pub struct MetaLatency {
    average_ns: std::sync::atomic::AtomicU64,
}

impl MetaLatency {
    /// How long `call` polls for its answer before sleeping: its own spin, or none when
    /// answers usually take longer than that.
    pub fn spin(&self, call: &MetaCall<'_>) -> Duration {
        let spin = call.spin();
        let usual = Duration::from_nanos(self.average_ns.load(std::sync::atomic::Ordering::Relaxed));
        if usual > spin { Duration::ZERO } else { spin }
    }

    /// A call was answered `took` after it was submitted.
    pub fn answered(&self, took: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let sample = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        // Concurrent calls may lose each other's sample; an average needs none of them.
        let old = self.average_ns.load(Relaxed);
        let new = if old == 0 { sample } else { old - old / 8 + sample / 8 };
        self.average_ns.store(new.max(1), Relaxed);
    }
}

/// Times an entry lost with a restarted agent's ring runs again on the next one before
/// the call says so.
pub const LOST_RETRIES: u32 = 3;

/// Submissions of one group of a batch ([`group`]) before entries lost again and again
/// complete as lost.
pub const BATCH_ROUNDS: u32 = 4;

/// A lookup's answer room per path (a record and a generous message): how many paths
/// one entry's answer area holds.
const LOOKUP_RECORD_ROOM: usize = 256;

/// Bytes of a region that holds a ring of `entries` and its metadata areas.
pub const fn region_bytes(entries: u32) -> usize {
    request_offset(entries) + REQUEST_BYTES + ANSWER_BYTES
}

/// Where a ring's request area starts in its region (page-aligned, after the ring).
pub const fn request_offset(entries: u32) -> usize {
    (wire::ring_bytes(entries) + 4095) & !4095
}

/// Where a ring's answer area starts in its region.
pub const fn answer_offset(entries: u32) -> usize {
    request_offset(entries) + REQUEST_BYTES
}

/// A metadata entry to run: the operation, its flags, handle, strings and argument.
#[derive(Debug, Clone, Copy)]
pub struct MetaCall<'a> {
    pub opcode: MetaOpcode,
    pub flags: u16,
    pub handle: u64,
    pub strings: &'a [&'a str],
    pub arg: u32,
}

/// Where a request's bytes go, or an answer goes: a region, an offset and a length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub region: u32,
    pub offset: u64,
    pub length: u32,
}

impl MetaCall<'_> {
    /// Its encoded request (the strings), or `None` when it does not fit the request
    /// area (or one string exceeds 65535 bytes).
    pub fn request(&self) -> Option<Vec<u8>> {
        wire::encode_strings(self.strings).filter(|r| r.len() <= REQUEST_BYTES)
    }

    /// Its entry, with its encoded request at `request` (none when empty) and its answer
    /// going to `answer`. `user_data` is 0: the ring sets its own.
    pub fn entry(&self, request: Range, answer: Range) -> MetaSubmission {
        let has_request = request.length > 0;
        MetaSubmission {
            opcode: self.opcode,
            flags: self.flags,
            user_data: 0,
            handle: self.handle,
            request_region: if has_request { request.region } else { 0 },
            answer_region: answer.region,
            request_offset: if has_request { request.offset } else { 0 },
            answer_offset: answer.offset,
            request_length: request.length,
            answer_length: answer.length,
            arg: self.arg,
        }
    }

    /// Whether it may run again on the next session's ring when the agent restarted
    /// before answering: not when running it twice could answer differently (an
    /// exclusive create that did run would then fail with "exists", a remove that did
    /// run with "no such file").
    pub fn runs_again(&self) -> bool {
        match self.opcode {
            MetaOpcode::Create => self.flags & wire::META_EXCLUSIVE == 0,
            MetaOpcode::Remove => false,
            _ => true,
        }
    }

    /// How long its wait polls before sleeping: pure metadata answers in tens of
    /// microseconds; an open-read moves a file and sleeps like any payload wait.
    pub fn spin(&self) -> Duration {
        if self.opcode == MetaOpcode::OpenRead { Duration::ZERO } else { SPIN }
    }
}

/// How many of the requests of `lengths` (bytes each, in order) go out in one
/// submission on a ring with `room` free entries: as many as the ring (at least one
/// entry) and its request area hold. Each request fits the area alone
/// ([`MetaCall::request`]), so a group is never empty while requests remain.
pub fn group(lengths: &[usize], room: u64) -> usize {
    let (mut n, mut bytes) = (0, 0);
    while n < lengths.len() && (n as u64) < room.max(1) && bytes + lengths[n] <= REQUEST_BYTES {
        bytes += lengths[n];
        n += 1;
    }
    n
}

/// How many of `paths` (in order) one lookup entry takes: as many as the agent's limit
/// (`per_entry`), the request area and (at a generous 256 bytes a record) the answer
/// area allow. 0 when the first path alone exceeds the request area (it goes over gRPC).
pub fn lookup_group<S: AsRef<str>>(paths: &[S], per_entry: usize) -> usize {
    let (mut n, mut bytes) = (0, 0);
    while n < paths.len()
        && n < per_entry
        && n < ANSWER_BYTES / LOOKUP_RECORD_ROOM
        && bytes + 2 + paths[n].as_ref().len() <= REQUEST_BYTES
    {
        bytes += 2 + paths[n].as_ref().len();
        n += 1;
    }
    n
}

/// What a metadata entry's completion says about its answer range of `length` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// It ran: this many answer bytes were written.
    Written(usize),
    /// It claims more answer bytes than its range holds.
    TooLong(u64),
    /// The namespace refused it: the range starts with an error record
    /// ([`wire::MetaError`]), [`refusal_bytes`] long.
    Refused,
    /// It failed with this status (no answer).
    Failed(Status),
}

impl Answer {
    /// The answer of a completion's `result` for a range of `length` bytes.
    pub fn of(result: Result<u64, Status>, length: u32) -> Answer {
        match result {
            Ok(n) if n <= u64::from(length) => Answer::Written(n as usize),
            Ok(n) => Answer::TooLong(n),
            Err(Status::Refused) if length >= 8 => Answer::Refused,
            Err(status) => Answer::Failed(status),
        }
    }
}

/// Bytes of the error record of a refusal whose first 8 bytes are `head`, in a range of
/// `length` bytes: the record's message is cut to the range.
pub fn refusal_bytes(head: &[u8; 8], length: u32) -> usize {
    let message = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    8 + message.min((length as usize).saturating_sub(8))
}
