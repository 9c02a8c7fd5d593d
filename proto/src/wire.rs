//! The data plane's wire format: rings of fixed-size little-endian entries in host
//! memory that the agent reads and writes with one-sided RMA.
//!
//! One ring pair (a submission queue, SQ, and a completion queue, CQ) per host thread,
//! in the shape of io_uring and 3FS USRBIO, laid out in one registered region:
//!
//! ```text
//! offset                      size             written by
//! 0     RingHeader            64               host, once (magic, version, entries)
//! 64    sq_tail: u64          64 (cache line)  host: entries [0, sq_tail) submitted
//! 128   sq_head: u64          64               agent: entries [0, sq_head) consumed
//! 192   cq_tail: u64          64               agent: completions [0, cq_tail) posted
//! 256   cq_head: u64          64               host: completions [0, cq_head) reaped
//!       (136: agent_wakes u32, 264: cq_waiters u32, 268: cq_futex u32: see below)
//! 320   SQ: entries x 64 B
//! ...   CQ: entries x 32 B
//! ```
//!
//! Indices grow without wrapping (u64); slot = index & (entries - 1). The host owns
//! sq_tail and cq_head, the agent sq_head and cq_tail. Each counter sits on its own
//! cache line so that a remote write of one never tears or invalidates another.
//!
//! Everything in this memory comes from an untrusted host: [`Submission::decode`] and
//! [`RingHeader::decode`] reject any byte pattern that is not exactly a valid value
//! (unknown version or opcode, reserved bits set, zero length), so the engine only ever
//! sees well-formed requests. Validating them against the session (handles, regions,
//! ranges, rights) is the engine's job, not this module's.

/// `"DPRG"` little-endian: marks a ring header.
pub const RING_MAGIC: u32 = u32::from_le_bytes(*b"DPRG");
/// The wire format version this build speaks.
pub const WIRE_VERSION: u16 = 1;
/// Size of the ring header.
pub const HEADER_BYTES: usize = 64;
/// Offsets of the four ring counters.
pub const SQ_TAIL_OFFSET: usize = 64;
pub const SQ_HEAD_OFFSET: usize = 128;
pub const CQ_TAIL_OFFSET: usize = 192;
pub const CQ_HEAD_OFFSET: usize = 256;
/// Agent-owned (in the `sq_head` line): 1 when the agent wakes this ring's waiters
/// through [`CQ_FUTEX_OFFSET`] (it has the ring mapped, i.e. shared memory); 0 means
/// the host must poll.
pub const AGENT_WAKES_OFFSET: usize = 136;
/// Agent-owned (in the `sq_head` line): non-zero while the agent polls this ring's
/// `sq_tail` by itself; the host then needs no doorbell. The host fences (SeqCst)
/// between publishing `sq_tail` and reading this word, the agent between clearing it
/// and its last look at `sq_tail`, so a submission is never left unseen.
pub const AGENT_POLLING_OFFSET: usize = 140;
/// Host-owned (in the `cq_head` line): non-zero while a host thread sleeps on
/// [`CQ_FUTEX_OFFSET`] waiting for completions.
pub const CQ_WAITERS_OFFSET: usize = 264;
/// Agent-owned u32 futex word: bumped (and woken) after completions are posted while
/// [`CQ_WAITERS_OFFSET`] is set. Both sides fence (SeqCst) between their store and
/// their load of the other's word, so a wake-up is never lost.
pub const CQ_FUTEX_OFFSET: usize = 268;
/// Where the submission entries start.
pub const SQ_OFFSET: usize = 320;
/// Size of one submission entry.
pub const SQE_BYTES: usize = 64;
/// Size of one completion entry.
pub const CQE_BYTES: usize = 32;
/// Largest ring: 64 Ki entries (4 MiB of submissions) is far past any useful depth.
pub const MAX_RING_ENTRIES: u32 = 1 << 16;

/// Bytes a ring of `entries` entries needs, header included.
pub const fn ring_bytes(entries: u32) -> usize {
    SQ_OFFSET + entries as usize * (SQE_BYTES + CQE_BYTES)
}

/// Offset of submission slot `index & (entries - 1)`.
pub const fn sqe_offset(entries: u32, index: u64) -> usize {
    SQ_OFFSET + (index & (entries as u64 - 1)) as usize * SQE_BYTES
}

/// Offset of completion slot `index & (entries - 1)`.
pub const fn cqe_offset(entries: u32, index: u64) -> usize {
    SQ_OFFSET + entries as usize * SQE_BYTES + (index & (entries as u64 - 1)) as usize * CQE_BYTES
}

/// Why bytes from the host were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The ring header does not start with [`RING_MAGIC`].
    #[error("not a dpuio ring: bad magic {found:#010x}")]
    BadMagic { found: u32 },
    /// A version this build does not speak.
    #[error("wire version {found} is not supported (this build speaks {WIRE_VERSION})")]
    Version { found: u16 },
    /// Ring size not a power of two in 2..=MAX_RING_ENTRIES.
    #[error("ring of {found} entries: must be a power of two from 2 to {MAX_RING_ENTRIES}")]
    RingEntries { found: u32 },
    /// Unknown opcode.
    #[error("unknown opcode {found}")]
    Opcode { found: u8 },
    /// Flag bits this version does not define.
    #[error("undefined flag bits {found:#06x}")]
    Flags { found: u16 },
    /// A reserved field is not zero.
    #[error("reserved bytes at offset {offset} are not zero")]
    Reserved { offset: usize },
    /// A data request of zero bytes.
    #[error("length is zero")]
    ZeroLength,
    /// Fewer bytes than an entry.
    #[error("{found} bytes; an entry is {expected}")]
    Short { found: usize, expected: usize },
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The ring header, written once by the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingHeader {
    pub entries: u32,
}

impl RingHeader {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&RING_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&WIRE_VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.entries.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<RingHeader, WireError> {
        if b.len() < HEADER_BYTES {
            return Err(WireError::Short { found: b.len(), expected: HEADER_BYTES });
        }
        let magic = u32_at(b, 0);
        if magic != RING_MAGIC {
            return Err(WireError::BadMagic { found: magic });
        }
        let version = u16_at(b, 4);
        if version != WIRE_VERSION {
            return Err(WireError::Version { found: version });
        }
        if u16_at(b, 6) != 0 {
            return Err(WireError::Reserved { offset: 6 });
        }
        let entries = u32_at(b, 8);
        if !entries.is_power_of_two() || !(2..=MAX_RING_ENTRIES).contains(&entries) {
            return Err(WireError::RingEntries { found: entries });
        }
        if let Some(i) = b[12..HEADER_BYTES].iter().position(|&x| x != 0) {
            return Err(WireError::Reserved { offset: 12 + i });
        }
        Ok(RingHeader { entries })
    }
}

/// What a submission asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    /// Read `length` bytes of the file at `file_offset` into the region at `region_offset`.
    Read = 1,
    /// Write `length` bytes from the region at `region_offset` to the file at `file_offset`.
    Write = 2,
}

/// Flag: after a write, make the file durable before completing.
pub const FLAG_SYNC: u16 = 1;
const KNOWN_FLAGS: u16 = FLAG_SYNC;

/// One submission entry (64 bytes).
///
/// ```text
/// 0  u16 version   2  u8 opcode   3  u8 reserved   4  u16 flags   6  u16 reserved
/// 8  u64 user_data (echoed in the completion)
/// 16 u64 handle    24 u32 region_id   28 u32 reserved
/// 32 u64 file_offset   40 u64 region_offset   48 u64 length   56 u64 reserved
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submission {
    pub opcode: Opcode,
    pub flags: u16,
    pub user_data: u64,
    pub handle: u64,
    pub region_id: u32,
    pub file_offset: u64,
    pub region_offset: u64,
    pub length: u64,
}

impl Submission {
    pub fn encode(&self) -> [u8; SQE_BYTES] {
        let mut b = [0u8; SQE_BYTES];
        b[0..2].copy_from_slice(&WIRE_VERSION.to_le_bytes());
        b[2] = self.opcode as u8;
        b[4..6].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.user_data.to_le_bytes());
        b[16..24].copy_from_slice(&self.handle.to_le_bytes());
        b[24..28].copy_from_slice(&self.region_id.to_le_bytes());
        b[32..40].copy_from_slice(&self.file_offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.region_offset.to_le_bytes());
        b[48..56].copy_from_slice(&self.length.to_le_bytes());
        b
    }

    /// Decode an entry, refusing anything that is not exactly a valid submission.
    /// The `user_data` of a refused entry is still readable with [`Submission::peek_user_data`]
    /// so the agent can fail it by name.
    pub fn decode(b: &[u8]) -> Result<Submission, WireError> {
        if b.len() < SQE_BYTES {
            return Err(WireError::Short { found: b.len(), expected: SQE_BYTES });
        }
        let version = u16_at(b, 0);
        if version != WIRE_VERSION {
            return Err(WireError::Version { found: version });
        }
        let opcode = match b[2] {
            1 => Opcode::Read,
            2 => Opcode::Write,
            found => return Err(WireError::Opcode { found }),
        };
        for (offset, zero) in
            [(3, b[3] == 0), (6, u16_at(b, 6) == 0), (28, u32_at(b, 28) == 0), (56, u64_at(b, 56) == 0)]
        {
            if !zero {
                return Err(WireError::Reserved { offset });
            }
        }
        let flags = u16_at(b, 4);
        if flags & !KNOWN_FLAGS != 0 {
            return Err(WireError::Flags { found: flags });
        }
        let length = u64_at(b, 48);
        if length == 0 {
            return Err(WireError::ZeroLength);
        }
        Ok(Submission {
            opcode,
            flags,
            user_data: u64_at(b, 8),
            handle: u64_at(b, 16),
            region_id: u32_at(b, 24),
            file_offset: u64_at(b, 32),
            region_offset: u64_at(b, 40),
            length,
        })
    }

    /// The user_data field of any 64 bytes, valid entry or not.
    pub fn peek_user_data(b: &[u8]) -> u64 {
        if b.len() >= 16 { u64_at(b, 8) } else { 0 }
    }
}

/// Completion status codes (negative: the request failed; the data region is then
/// unspecified for reads, the file unchanged or partly written for writes as `result` says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
#[non_exhaustive]
pub enum Status {
    Ok = 0,
    /// The entry is malformed (see [`WireError`]).
    Malformed = -1,
    /// The region id is not registered in this session.
    BadRegion = -2,
    /// The region range lies outside the region, or the file range overflows.
    OutOfRange = -3,
    /// The handle is not open in this session.
    BadHandle = -4,
    /// The handle or region does not allow this access (write through a read-only handle).
    Access = -5,
    /// Longer than the agent's max_io_bytes.
    TooLarge = -6,
    /// The backend failed.
    Io = -7,
    /// The session or tenant is over a limit; submit again later.
    Busy = -8,
    /// The data failed an integrity check; no data was released.
    Integrity = -9,
    /// The session is ending.
    Cancelled = -10,
}

impl Status {
    pub fn from_i32(v: i32) -> Option<Status> {
        use Status::*;
        [Ok, Malformed, BadRegion, OutOfRange, BadHandle, Access, TooLarge, Io, Busy, Integrity, Cancelled]
            .into_iter()
            .find(|s| *s as i32 == v)
    }

    /// A short description for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Malformed => "malformed submission entry",
            Status::BadRegion => "region not registered in this session",
            Status::OutOfRange => "range outside the region or file",
            Status::BadHandle => "handle not open in this session",
            Status::Access => "access not allowed by the handle or region",
            Status::TooLarge => "request longer than the agent's max_io_bytes",
            Status::Io => "backend I/O error",
            Status::Busy => "over a session or tenant limit; retry",
            Status::Integrity => "integrity check failed",
            Status::Cancelled => "session ending",
        }
    }
}

/// One completion entry (32 bytes):
/// `0 u64 user_data, 8 i32 status, 12 u32 reserved, 16 u64 result (bytes), 24 u64 seq`.
///
/// `seq` is the completion's index plus one. The host knows which index it expects
/// next, so it takes an entry as posted only when `seq` matches: no transport has to
/// make the `cq_tail` write atomic, and an entry left from the previous lap of the ring
/// is never mistaken for a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub user_data: u64,
    /// A [`Status`] as i32 (kept raw: the host decodes it with [`Status::from_i32`]).
    pub status: i32,
    /// Bytes transferred (a read at end of file is short).
    pub result: u64,
    /// Completion index + 1 (see the type's docs).
    pub seq: u64,
}

impl Completion {
    pub fn encode(&self) -> [u8; CQE_BYTES] {
        let mut b = [0u8; CQE_BYTES];
        b[0..8].copy_from_slice(&self.user_data.to_le_bytes());
        b[8..12].copy_from_slice(&self.status.to_le_bytes());
        b[16..24].copy_from_slice(&self.result.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Completion, WireError> {
        if b.len() < CQE_BYTES {
            return Err(WireError::Short { found: b.len(), expected: CQE_BYTES });
        }
        Ok(Completion {
            user_data: u64_at(b, 0),
            status: u32_at(b, 8) as i32,
            result: u64_at(b, 16),
            seq: u64_at(b, 24),
        })
    }
}

/// Bytes of a [`Doorbell`].
pub const DOORBELL_BYTES: usize = 16;

/// The small message a host sends the agent after publishing submissions on a ring:
/// `session_id u64 LE, ring_id u32 LE, 0u32`. Only a hint: the agent reads the ring
/// itself, and also scans every ring now and then in case one is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doorbell {
    pub session_id: u64,
    pub ring_id: u32,
}

impl Doorbell {
    pub fn encode(&self) -> [u8; DOORBELL_BYTES] {
        let mut b = [0u8; DOORBELL_BYTES];
        b[..8].copy_from_slice(&self.session_id.to_le_bytes());
        b[8..12].copy_from_slice(&self.ring_id.to_le_bytes());
        b
    }

    /// `None` unless `b` is exactly [`DOORBELL_BYTES`] long with its reserved word 0.
    pub fn decode(b: &[u8]) -> Option<Doorbell> {
        if b.len() != DOORBELL_BYTES || b[12..].iter().any(|&x| x != 0) {
            return None;
        }
        Some(Doorbell { session_id: u64_at(b, 0), ring_id: u32_at(b, 8) })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn doorbells_round_trip_and_reject_junk() {
        use super::Doorbell;
        let bell = Doorbell { session_id: 7, ring_id: 3 };
        assert_eq!(Doorbell::decode(&bell.encode()), Some(bell));
        assert_eq!(Doorbell::decode(&[0u8; 15]), None);
        assert_eq!(Doorbell::decode(&[0u8; 17]), None);
        let mut b = bell.encode();
        b[15] = 1;
        assert_eq!(Doorbell::decode(&b), None);
    }

    use super::*;

    fn sample() -> Submission {
        Submission {
            opcode: Opcode::Write,
            flags: FLAG_SYNC,
            user_data: 0xfeed,
            handle: 0x1122_3344_5566_7788,
            region_id: 7,
            file_offset: 1 << 40,
            region_offset: 4096,
            length: 1 << 20,
        }
    }

    #[test]
    fn submission_round_trips() {
        let s = sample();
        assert_eq!(Submission::decode(&s.encode()), Ok(s));
        assert_eq!(Submission::peek_user_data(&s.encode()), 0xfeed);
    }

    #[test]
    fn every_malformation_is_named() {
        let good = sample().encode();
        let mut b = good;
        b[0] = 9;
        assert_eq!(Submission::decode(&b), Err(WireError::Version { found: 9 }));
        let mut b = good;
        b[2] = 3;
        assert_eq!(Submission::decode(&b), Err(WireError::Opcode { found: 3 }));
        let mut b = good;
        b[4] = 0x82;
        assert!(matches!(Submission::decode(&b), Err(WireError::Flags { .. })));
        // (byte set, reserved field it belongs to)
        for (byte, field) in [(3, 3), (6, 6), (7, 6), (28, 28), (31, 28), (56, 56), (63, 56)] {
            let mut b = good;
            b[byte] = 1;
            assert_eq!(Submission::decode(&b), Err(WireError::Reserved { offset: field }), "byte {byte}");
        }
        let mut b = good;
        b[48..56].fill(0);
        assert_eq!(Submission::decode(&b), Err(WireError::ZeroLength));
        assert!(matches!(Submission::decode(&good[..63]), Err(WireError::Short { .. })));
    }

    #[test]
    fn random_bytes_never_panic_and_valid_ones_round_trip() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut accepted = 0;
        for i in 0..200_000 {
            let mut b = [0u8; SQE_BYTES];
            rng.fill(&mut b[..]);
            if i % 2 == 0 {
                // Bias half the cases towards almost-valid entries.
                b[0..2].copy_from_slice(&WIRE_VERSION.to_le_bytes());
                b[2] = rng.random_range(0..4);
                b[3] = 0;
                b[5] = 0;
                b[4] &= 1;
                b[6..8].fill(0);
                b[28..32].fill(0);
                b[56..64].fill(0);
            }
            if let Ok(s) = Submission::decode(&b) {
                accepted += 1;
                assert_eq!(s.encode(), b);
            }
            let _ = RingHeader::decode(&b);
            let _ = Completion::decode(&b);
        }
        assert!(accepted > 10_000, "{accepted}");
    }

    #[test]
    fn header_checks() {
        let h = RingHeader { entries: 256 };
        assert_eq!(RingHeader::decode(&h.encode()), Ok(h));
        for bad in [0, 1, 3, 100, MAX_RING_ENTRIES * 2] {
            let b = RingHeader { entries: bad }.encode();
            assert_eq!(RingHeader::decode(&b), Err(WireError::RingEntries { found: bad }));
        }
        let mut b = h.encode();
        b[0] = b'X';
        assert!(matches!(RingHeader::decode(&b), Err(WireError::BadMagic { .. })));
        let mut b = h.encode();
        b[40] = 1;
        assert_eq!(RingHeader::decode(&b), Err(WireError::Reserved { offset: 40 }));
    }

    #[test]
    fn layout_offsets() {
        assert_eq!(ring_bytes(4), 320 + 4 * 96);
        assert_eq!(sqe_offset(4, 5), 320 + 64);
        assert_eq!(cqe_offset(4, 6), 320 + 4 * 64 + 2 * 32);
        let c = Completion { user_data: 9, status: Status::OutOfRange as i32, result: 3, seq: 12 };
        assert_eq!(Completion::decode(&c.encode()), Ok(c));
        assert_eq!(Status::from_i32(c.status), Some(Status::OutOfRange));
    }
}
