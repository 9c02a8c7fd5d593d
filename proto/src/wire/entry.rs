//! Submission entries (64 bytes: a read or write, or a metadata operation) and
//! completion entries (32 bytes), with the statuses a completion carries.

use super::{CQE_BYTES, SQE_BYTES, WIRE_VERSION, WireError, u16_at, u32_at, u64_at};

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

/// The first 24 bytes every entry shares: version, opcode, flags, user data, handle.
/// Where an entry carries its `user_data` (echoed in its completion).
pub const SQE_USER_DATA_OFFSET: usize = 8;

pub(super) fn entry_head(opcode: u8, flags: u16, user_data: u64, handle: u64) -> [u8; SQE_BYTES] {
    let mut b = [0u8; SQE_BYTES];
    b[0..2].copy_from_slice(&WIRE_VERSION.to_le_bytes());
    b[2] = opcode;
    b[4..6].copy_from_slice(&flags.to_le_bytes());
    b[8..16].copy_from_slice(&user_data.to_le_bytes());
    b[16..24].copy_from_slice(&handle.to_le_bytes());
    b
}

/// An entry is whole and of this wire version.
pub(super) fn check_head(b: &[u8]) -> Result<(), WireError> {
    if b.len() < SQE_BYTES {
        return Err(WireError::Short { found: b.len(), expected: SQE_BYTES });
    }
    let version = u16_at(b, 0);
    if version != WIRE_VERSION {
        return Err(WireError::Version { found: version });
    }
    Ok(())
}

impl Submission {
    pub fn encode(&self) -> [u8; SQE_BYTES] {
        let mut b = entry_head(self.opcode as u8, self.flags, self.user_data, self.handle);
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
        check_head(b)?;
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
    /// The namespace refused or failed a metadata entry; its answer range holds the
    /// reason ([`MetaError`](super::MetaError): the gRPC code and message).
    Refused = -11,
    /// Never sent by an agent: the host's client completes an entry with it when the
    /// agent restarted before answering and the entry could not be submitted again
    /// (it pointed into the old ring's own memory). It may or may not have run.
    Lost = -12,
    /// The storage behind the agent does not answer now (every DAOS engine down or
    /// unreachable, or DAOS leaving calls unanswered past the agent's deadline): nothing
    /// was done, or a write may be partly done; submitting again later may succeed.
    Unavailable = -13,
}

impl Status {
    pub fn from_i32(v: i32) -> Option<Status> {
        use Status::*;
        [
            Ok,
            Malformed,
            BadRegion,
            OutOfRange,
            BadHandle,
            Access,
            TooLarge,
            Io,
            Busy,
            Integrity,
            Cancelled,
            Refused,
            Lost,
            Unavailable,
        ]
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
            Status::Refused => "refused by the namespace",
            Status::Lost => "the agent restarted before answering; it may or may not have run: submit it again",
            Status::Unavailable => "the storage behind the agent does not answer now (check its engines); retry later",
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

    /// What it says: the bytes moved, or why not (a status this build does not know
    /// reads as [`Status::Malformed`]).
    pub fn outcome(&self) -> Result<u64, Status> {
        match Status::from_i32(self.status) {
            Some(Status::Ok) => Ok(self.result),
            Some(status) => Err(status),
            None => Err(Status::Malformed),
        }
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

#[cfg(test)]
pub(super) mod tests {
    use super::super::WireError;
    use super::super::ring::RingHeader;
    use super::*;

    pub(crate) fn sample() -> Submission {
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
    fn completions_round_trip() {
        let c = Completion { user_data: 9, status: Status::OutOfRange as i32, result: 3, seq: 12 };
        assert_eq!(Completion::decode(&c.encode()), Ok(c));
        assert_eq!(Status::from_i32(c.status), Some(Status::OutOfRange));
        assert_eq!(c.outcome(), Err(Status::OutOfRange));
        assert_eq!(Completion { status: 0, ..c }.outcome(), Ok(3));
        assert_eq!(Completion { status: -99, ..c }.outcome(), Err(Status::Malformed), "an unknown status");
    }
}
