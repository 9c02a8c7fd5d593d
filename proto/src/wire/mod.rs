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
use crate::reason::Reason;

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
/// Agent-owned u32 (in the `sq_head` line): non-zero once the agent no longer serves
/// this ring (its session ended: detached, lease lapsed, tenant removed), so a host
/// waiting on it stops (shared memory only; elsewhere the host's keep-alive learns it).
pub const RING_CLOSED_OFFSET: usize = 144;
/// [`RING_CLOSED_OFFSET`]'s value when the agent ended the session (detached, lease
/// lapsed, tenant removed).
pub const RING_CLOSED_ENDED: u32 = 1;
/// [`RING_CLOSED_OFFSET`]'s value when the agent is stopping (SIGTERM): a client may
/// attach again once it is back.
pub const RING_CLOSED_STOPPING: u32 = 2;
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

/// What the host's two indices open on a ring, checked against the agent's own.
///
/// `sq_tail` and `cq_head` are written by the host and trusted for nothing: indices
/// that claim more submissions than the ring holds, or more unreaped completions than
/// it holds, mean the host broke the ring. All four counters wrap past `u64::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingWindow {
    /// Submissions published and not yet taken: `sq_tail - sq_head`, at most `entries`.
    pub submitted: u64,
    /// Completion slots free for the agent: `entries - (cq_tail - cq_head)`.
    pub completion_room: u64,
}

impl RingWindow {
    /// The window of a ring of `entries` whose agent stands at `sq_head`/`cq_tail` and
    /// whose host wrote `sq_tail`/`cq_head`; `None` if the host's indices are impossible.
    pub fn check(entries: u32, sq_head: u64, cq_tail: u64, sq_tail: u64, cq_head: u64) -> Option<RingWindow> {
        let entries = u64::from(entries);
        let submitted = sq_tail.wrapping_sub(sq_head);
        let unreaped = cq_tail.wrapping_sub(cq_head);
        if submitted > entries || unreaped > entries {
            return None;
        }
        Some(RingWindow { submitted, completion_room: entries - unreaped })
    }
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
    /// A field of a metadata entry holds a value its opcode does not take (a handle
    /// for a path operation, an empty or oversized request, a short answer range).
    #[error("field at offset {offset} holds a value this opcode does not take")]
    Field { offset: usize },
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

/// The first 24 bytes every entry shares: version, opcode, flags, user data, handle.
/// Where an entry carries its `user_data` (echoed in its completion).
pub const SQE_USER_DATA_OFFSET: usize = 8;

fn entry_head(opcode: u8, flags: u16, user_data: u64, handle: u64) -> [u8; SQE_BYTES] {
    let mut b = [0u8; SQE_BYTES];
    b[0..2].copy_from_slice(&WIRE_VERSION.to_le_bytes());
    b[2] = opcode;
    b[4..6].copy_from_slice(&flags.to_le_bytes());
    b[8..16].copy_from_slice(&user_data.to_le_bytes());
    b[16..24].copy_from_slice(&handle.to_le_bytes());
    b
}

/// An entry is whole and of this wire version.
fn check_head(b: &[u8]) -> Result<(), WireError> {
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

/// What a metadata entry asks for: a namespace operation whose request (paths) and
/// answer (attributes, a handle, directory entries, file bytes) live in host regions
/// the entry names ([`MetaSubmission`]). The gRPC `Namespace` call of the same name
/// does the same thing under the same checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MetaOpcode {
    /// Attributes of the path in the request (`Namespace.Stat` by path).
    Stat = 3,
    /// Attributes of the open file `handle` (`Namespace.Stat` by handle). No request.
    StatHandle = 4,
    /// Open an existing file (`Namespace.Open`); flags [`META_WRITE`], [`META_TRUNCATE`].
    /// Answer: a new session handle, usable and closeable over gRPC too.
    Open = 5,
    /// Create (or truncate) and open a file for writing (`Namespace.Create`); flag
    /// [`META_EXCLUSIVE`], `arg` the mode bits (0: 0644).
    Create = 6,
    /// Close `handle` (`Namespace.Close`); a written file is durable when it completes.
    Close = 7,
    /// Open the path read-only, read it from offset 0 into the answer after its header,
    /// close it: a whole small file (a training sample) in one submission. No handle
    /// outlives the entry.
    OpenRead = 8,
    /// Attributes of `arg` paths (`Namespace.Lookup`), one record each.
    Lookup = 9,
    /// One batch of a directory listing (`Namespace.Readdir`): the request holds the
    /// path and the anchor to start after (empty: from the start), `arg` the most
    /// entries wanted (0: the agent's default).
    Readdir = 10,
}

/// Metadata flag: [`MetaOpcode::Open`] for reading and writing.
pub const META_WRITE: u16 = 1 << 1;
/// Metadata flag: [`MetaOpcode::Open`] truncating the file (needs [`META_WRITE`]).
pub const META_TRUNCATE: u16 = 1 << 2;
/// Metadata flag: [`MetaOpcode::Create`] fails if the file exists.
pub const META_EXCLUSIVE: u16 = 1 << 3;
/// Largest request range of a metadata entry (paths of one lookup).
pub const MAX_META_REQUEST_BYTES: u32 = 1 << 20;
/// Smallest answer range: every answer, an error's too, starts with this header.
pub const META_ANSWER_HEADER_BYTES: u32 = 64;

/// A metadata submission entry (64 bytes); the opcode says it is one.
///
/// ```text
/// 0  u16 version   2 u8 opcode   3 u8 reserved   4 u16 flags   6 u16 reserved
/// 8  u64 user_data (echoed in the completion)
/// 16 u64 handle (StatHandle, Close; 0 otherwise)
/// 24 u32 request_region   28 u32 answer_region
/// 32 u64 request_offset   40 u64 answer_offset
/// 48 u32 request_length   52 u32 answer_length
/// 56 u32 arg (Create: mode; Lookup: paths; Readdir: most entries; 0 otherwise)
/// 60 u32 reserved
/// ```
///
/// The request range holds strings, each a `u16` little-endian byte length and that
/// many bytes (UTF-8), exactly as many as the opcode takes and nothing after them
/// (see [`decode_strings`]). The answer range receives a [`MetaHeader`] and what
/// follows it; its completion's `result` is the answer bytes written. An operation the
/// namespace refuses completes with [`Status::Refused`] and an error record
/// ([`MetaError`]) in the answer range: the gRPC code and message the same call over
/// gRPC gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaSubmission {
    pub opcode: MetaOpcode,
    pub flags: u16,
    pub user_data: u64,
    pub handle: u64,
    pub request_region: u32,
    pub answer_region: u32,
    pub request_offset: u64,
    pub answer_offset: u64,
    pub request_length: u32,
    pub answer_length: u32,
    pub arg: u32,
}

impl MetaOpcode {
    fn from_u8(b: u8) -> Option<MetaOpcode> {
        use MetaOpcode::*;
        [Stat, StatHandle, Open, Create, Close, OpenRead, Lookup, Readdir].into_iter().find(|o| *o as u8 == b)
    }

    /// Whether the operation names an open handle rather than carrying paths.
    pub fn by_handle(self) -> bool {
        matches!(self, MetaOpcode::StatHandle | MetaOpcode::Close)
    }

    /// How many strings the request holds (`arg` for a lookup).
    pub fn strings(self, arg: u32) -> usize {
        match self {
            MetaOpcode::StatHandle | MetaOpcode::Close => 0,
            MetaOpcode::Readdir => 2,
            MetaOpcode::Lookup => arg as usize,
            _ => 1,
        }
    }

    fn flags(self) -> u16 {
        match self {
            MetaOpcode::Open => META_WRITE | META_TRUNCATE,
            MetaOpcode::Create => META_EXCLUSIVE,
            _ => 0,
        }
    }
}

impl MetaSubmission {
    pub fn encode(&self) -> [u8; SQE_BYTES] {
        let mut b = entry_head(self.opcode as u8, self.flags, self.user_data, self.handle);
        b[24..28].copy_from_slice(&self.request_region.to_le_bytes());
        b[28..32].copy_from_slice(&self.answer_region.to_le_bytes());
        b[32..40].copy_from_slice(&self.request_offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.answer_offset.to_le_bytes());
        b[48..52].copy_from_slice(&self.request_length.to_le_bytes());
        b[52..56].copy_from_slice(&self.answer_length.to_le_bytes());
        b[56..60].copy_from_slice(&self.arg.to_le_bytes());
        b
    }

    /// Decode a metadata entry, refusing anything that is not exactly a valid one: an
    /// unknown opcode or flag, reserved bytes set, a handle where the opcode takes
    /// none (or none where it takes one), a request range where it takes none (or
    /// none, or one past [`MAX_META_REQUEST_BYTES`], where it takes one), an answer
    /// range shorter than [`META_ANSWER_HEADER_BYTES`], a mode past `0o7777`, a lookup
    /// of no paths.
    pub fn decode(b: &[u8]) -> Result<MetaSubmission, WireError> {
        check_head(b)?;
        let opcode = MetaOpcode::from_u8(b[2]).ok_or(WireError::Opcode { found: b[2] })?;
        for (offset, zero) in [(3, b[3] == 0), (6, u16_at(b, 6) == 0), (60, u32_at(b, 60) == 0)] {
            if !zero {
                return Err(WireError::Reserved { offset });
            }
        }
        let flags = u16_at(b, 4);
        if flags & !opcode.flags() != 0 {
            return Err(WireError::Flags { found: flags });
        }
        let m = MetaSubmission {
            opcode,
            flags,
            user_data: u64_at(b, 8),
            handle: u64_at(b, 16),
            request_region: u32_at(b, 24),
            answer_region: u32_at(b, 28),
            request_offset: u64_at(b, 32),
            answer_offset: u64_at(b, 40),
            request_length: u32_at(b, 48),
            answer_length: u32_at(b, 52),
            arg: u32_at(b, 56),
        };
        let field = |offset| Err(WireError::Field { offset });
        if opcode.by_handle() {
            if m.handle == 0 {
                return field(16);
            }
            if m.request_region != 0 || m.request_offset != 0 || m.request_length != 0 {
                return field(24);
            }
        } else {
            if m.handle != 0 {
                return field(16);
            }
            if m.request_length == 0 || m.request_length > MAX_META_REQUEST_BYTES {
                return field(48);
            }
        }
        if m.answer_length < META_ANSWER_HEADER_BYTES {
            return field(52);
        }
        let arg_ok = match opcode {
            MetaOpcode::Create => m.arg <= 0o7777,
            MetaOpcode::Lookup => m.arg > 0,
            MetaOpcode::Readdir => true,
            _ => m.arg == 0,
        };
        if !arg_ok {
            return field(56);
        }
        if flags & META_TRUNCATE != 0 && flags & META_WRITE == 0 {
            return Err(WireError::Flags { found: flags });
        }
        Ok(m)
    }
}

/// One submission entry of either kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// A read or write of an open handle.
    Io(Submission),
    /// A namespace operation.
    Meta(MetaSubmission),
}

impl Entry {
    /// Decode any entry strictly (the opcode says which kind).
    pub fn decode(b: &[u8]) -> Result<Entry, WireError> {
        match b.get(2) {
            Some(op) if MetaOpcode::from_u8(*op).is_some() => MetaSubmission::decode(b).map(Entry::Meta),
            _ => Submission::decode(b).map(Entry::Io),
        }
    }
}

/// Encode `strings` as a metadata request: each a `u16` LE length and its bytes.
/// `None` if one is longer than `u16::MAX` bytes.
pub fn encode_strings<S: AsRef<str>>(strings: &[S]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(strings.iter().map(|s| 2 + s.as_ref().len()).sum());
    for s in strings {
        let len = u16::try_from(s.as_ref().len()).ok()?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(s.as_ref().as_bytes());
    }
    Some(out)
}

/// Why a metadata request's bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// A length prefix runs past the request range.
    #[error("string {index} of the request runs past its end")]
    Truncated { index: usize },
    /// A string is not UTF-8.
    #[error("string {index} of the request is not UTF-8")]
    Utf8 { index: usize },
    /// Bytes left after the strings the opcode takes.
    #[error("{extra} bytes after the request's {count} strings")]
    Trailing { count: usize, extra: usize },
}

/// The `count` strings of a metadata request (bytes the agent copied out of host
/// memory once), exactly: a short, non-UTF-8 or overlong request is refused.
pub fn decode_strings(b: &[u8], count: usize) -> Result<Vec<String>, RequestError> {
    let mut out = Vec::with_capacity(count.min(b.len() / 2));
    let mut at = 0usize;
    for index in 0..count {
        let len = match b.get(at..at + 2) {
            Some(l) => usize::from(u16::from_le_bytes([l[0], l[1]])),
            None => return Err(RequestError::Truncated { index }),
        };
        let bytes = b.get(at + 2..at + 2 + len).ok_or(RequestError::Truncated { index })?;
        out.push(String::from_utf8(bytes.to_vec()).map_err(|_| RequestError::Utf8 { index })?);
        at += 2 + len;
    }
    if at != b.len() {
        return Err(RequestError::Trailing { count, extra: b.len() - at });
    }
    Ok(out)
}

/// Bytes of an [`AttrRecord`].
pub const ATTR_BYTES: usize = 32;

/// Attributes as the answer of a metadata entry carries them (32 bytes):
/// `0 u8 kind (1 file, 2 directory), 1..4 zero, 4 u32 mode, 8 u64 size,
/// 16 i64 mtime_ns, 24 u64 object_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttrRecord {
    pub kind: u8,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub object_id: u64,
}

/// [`AttrRecord::kind`] of a file.
pub const KIND_FILE: u8 = 1;
/// [`AttrRecord::kind`] of a directory.
pub const KIND_DIRECTORY: u8 = 2;

impl AttrRecord {
    pub fn encode(&self) -> [u8; ATTR_BYTES] {
        let mut b = [0u8; ATTR_BYTES];
        b[0] = self.kind;
        b[4..8].copy_from_slice(&self.mode.to_le_bytes());
        b[8..16].copy_from_slice(&self.size.to_le_bytes());
        b[16..24].copy_from_slice(&self.mtime_ns.to_le_bytes());
        b[24..32].copy_from_slice(&self.object_id.to_le_bytes());
        b
    }

    /// `None` unless the kind is known and the reserved bytes are zero (the agent
    /// wrote it; the host still checks what it reads).
    pub fn decode(b: &[u8]) -> Option<AttrRecord> {
        if b.len() < ATTR_BYTES || !matches!(b[0], KIND_FILE | KIND_DIRECTORY) || b[1..4] != [0, 0, 0] {
            return None;
        }
        Some(AttrRecord {
            kind: b[0],
            mode: u32_at(b, 4),
            size: u64_at(b, 8),
            mtime_ns: u64_at(b, 16) as i64,
            object_id: u64_at(b, 24),
        })
    }
}

/// The first [`META_ANSWER_HEADER_BYTES`] of every successful metadata answer:
///
/// ```text
/// 0  u64 handle (Open, Create; 0 otherwise)   8 u64 chunk_bytes (Open, Create)
/// 16 AttrRecord (32 bytes; zero for Close, Lookup, Readdir)
/// 48 u64 count: file bytes after the header (OpenRead), records (Lookup), entries (Readdir)
/// 56 u32 more (Readdir: 1 if the listing goes on after this batch)   60 u32 zero
/// ```
///
/// After the header: OpenRead's file bytes; Lookup's records (per path: `u32 code`
/// (a [`CodeWord`]; 0: found), `u32 message length`, an [`AttrRecord`], the message, zero padding to
/// 8 bytes); Readdir's entries (per entry: `u16 name length`, 6 zero bytes, an
/// [`AttrRecord`], the name, zero padding to 8 bytes) then the anchor to continue
/// after (`u16` length and bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetaHeader {
    pub handle: u64,
    pub chunk_bytes: u64,
    pub attr: AttrRecord,
    pub count: u64,
    pub more: bool,
}

impl MetaHeader {
    pub fn encode(&self) -> [u8; META_ANSWER_HEADER_BYTES as usize] {
        let mut b = [0u8; META_ANSWER_HEADER_BYTES as usize];
        b[0..8].copy_from_slice(&self.handle.to_le_bytes());
        b[8..16].copy_from_slice(&self.chunk_bytes.to_le_bytes());
        b[16..48].copy_from_slice(&self.attr.encode());
        b[48..56].copy_from_slice(&self.count.to_le_bytes());
        b[56] = u8::from(self.more);
        b
    }

    /// The header of an answer (an all-zero attribute record reads as the default).
    pub fn decode(b: &[u8]) -> Option<MetaHeader> {
        if b.len() < META_ANSWER_HEADER_BYTES as usize || b[57..64].iter().any(|&x| x != 0) || b[56] > 1 {
            return None;
        }
        let attr =
            if b[16..48].iter().all(|&x| x == 0) { AttrRecord::default() } else { AttrRecord::decode(&b[16..48])? };
        Some(MetaHeader {
            handle: u64_at(b, 0),
            chunk_bytes: u64_at(b, 8),
            attr,
            count: u64_at(b, 48),
            more: b[56] == 1,
        })
    }
}

/// The answer of a refused metadata entry ([`Status::Refused`]): `u32 code` (see
/// [`CodeWord`]), `u32 message length`, the message (UTF-8, cut to fit the answer range).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaError {
    pub code: CodeWord,
    pub message: String,
}

/// An error's `u32` on the data plane: the gRPC status code in the low 16 bits and the
/// finer [`Reason`]'s number (0: none) in the high 16, so a POSIX client can tell
/// `ENOTDIR` from `ENOTEMPTY` as it can from gRPC's `dpuio-reason` metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CodeWord {
    pub code: u16,
    pub reason: Option<Reason>,
}

impl CodeWord {
    pub fn to_u32(self) -> u32 {
        u32::from(self.code) | u32::from(self.reason.map_or(0, Reason::number)) << 16
    }

    /// An unknown reason number reads as none (a newer agent may name more).
    pub fn from_u32(w: u32) -> CodeWord {
        CodeWord { code: w as u16, reason: Reason::from_number((w >> 16) as u16) }
    }
}

impl MetaError {
    /// At most `room` bytes (at least 8); the message is cut at a character boundary.
    pub fn encode(&self, room: usize) -> Vec<u8> {
        let mut cut = self.message.len().min(room.saturating_sub(8));
        while !self.message.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut b = Vec::with_capacity(8 + cut);
        b.extend_from_slice(&self.code.to_u32().to_le_bytes());
        b.extend_from_slice(&(cut as u32).to_le_bytes());
        b.extend_from_slice(&self.message.as_bytes()[..cut]);
        b
    }

    pub fn decode(b: &[u8]) -> Option<MetaError> {
        if b.len() < 8 {
            return None;
        }
        let len = u32_at(b, 4) as usize;
        let message = b.get(8..8usize.checked_add(len)?)?;
        Some(MetaError {
            code: CodeWord::from_u32(u32_at(b, 0)),
            message: String::from_utf8_lossy(message).into_owned(),
        })
    }
}

/// Round `n` up to a multiple of 8 (records in answers are 8-byte aligned).
pub const fn pad8(n: usize) -> usize {
    (n + 7) & !7
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
    /// reason ([`MetaError`]: the gRPC code and message).
    Refused = -11,
    /// Never sent by an agent: the host's client completes an entry with it when the
    /// agent restarted before answering and the entry could not be submitted again
    /// (it pointed into the old ring's own memory). It may or may not have run.
    Lost = -12,
}

impl Status {
    pub fn from_i32(v: i32) -> Option<Status> {
        use Status::*;
        [
            Ok, Malformed, BadRegion, OutOfRange, BadHandle, Access, TooLarge, Io, Busy, Integrity, Cancelled, Refused,
            Lost,
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
    fn ring_windows_refuse_impossible_host_indices_across_the_wrap() {
        use super::RingWindow;
        let w = |sq_head, cq_tail, sq_tail, cq_head| RingWindow::check(8, sq_head, cq_tail, sq_tail, cq_head);
        assert_eq!(w(0, 0, 0, 0), Some(RingWindow { submitted: 0, completion_room: 8 }));
        assert_eq!(w(10, 10, 18, 4), Some(RingWindow { submitted: 8, completion_room: 2 }));
        // Counters wrap past u64::MAX.
        assert_eq!(w(u64::MAX, u64::MAX, 2, u64::MAX - 1), Some(RingWindow { submitted: 3, completion_room: 7 }));
        // More submitted than the ring holds; a tail behind the head; more unreaped than it holds.
        assert_eq!(w(10, 10, 19, 10), None);
        assert_eq!(w(10, 10, 9, 10), None);
        assert_eq!(w(10, 10, 10, 11), None);
        assert_eq!(w(10, 20, 10, 11), None);
    }

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

    fn stat_entry() -> MetaSubmission {
        MetaSubmission {
            opcode: MetaOpcode::Stat,
            flags: 0,
            user_data: 0xbeef,
            handle: 0,
            request_region: 3,
            answer_region: 4,
            request_offset: 128,
            answer_offset: 4096,
            request_length: 12,
            answer_length: 64,
            arg: 0,
        }
    }

    #[test]
    fn metadata_entries_round_trip_and_entry_picks_the_kind() {
        let m = stat_entry();
        assert_eq!(MetaSubmission::decode(&m.encode()), Ok(m));
        assert_eq!(Entry::decode(&m.encode()), Ok(Entry::Meta(m)));
        assert_eq!(Submission::peek_user_data(&m.encode()), 0xbeef);
        assert_eq!(Entry::decode(&sample().encode()), Ok(Entry::Io(sample())));
        let close = MetaSubmission {
            opcode: MetaOpcode::Close,
            handle: 9,
            request_region: 0,
            request_offset: 0,
            request_length: 0,
            ..m
        };
        assert_eq!(Entry::decode(&close.encode()), Ok(Entry::Meta(close)));
        let open = MetaSubmission { opcode: MetaOpcode::Open, flags: META_WRITE | META_TRUNCATE, ..m };
        assert_eq!(MetaSubmission::decode(&open.encode()), Ok(open));
        let create = MetaSubmission { opcode: MetaOpcode::Create, flags: META_EXCLUSIVE, arg: 0o600, ..m };
        assert_eq!(MetaSubmission::decode(&create.encode()), Ok(create));
    }

    #[test]
    fn every_metadata_malformation_is_named() {
        let m = stat_entry();
        let good = m.encode();
        for (byte, field) in [(3, 3), (6, 6), (7, 6), (60, 60), (63, 60)] {
            let mut b = good;
            b[byte] = 1;
            assert_eq!(MetaSubmission::decode(&b), Err(WireError::Reserved { offset: field }), "byte {byte}");
        }
        let bad = |e: MetaSubmission| MetaSubmission::decode(&e.encode());
        assert_eq!(bad(MetaSubmission { handle: 5, ..m }), Err(WireError::Field { offset: 16 }), "handle on a path op");
        assert_eq!(bad(MetaSubmission { request_length: 0, ..m }), Err(WireError::Field { offset: 48 }));
        assert_eq!(
            bad(MetaSubmission { request_length: MAX_META_REQUEST_BYTES + 1, ..m }),
            Err(WireError::Field { offset: 48 })
        );
        assert_eq!(bad(MetaSubmission { answer_length: 63, ..m }), Err(WireError::Field { offset: 52 }));
        assert_eq!(bad(MetaSubmission { arg: 1, ..m }), Err(WireError::Field { offset: 56 }));
        assert_eq!(bad(MetaSubmission { flags: META_WRITE, ..m }), Err(WireError::Flags { found: META_WRITE }));
        let open = MetaSubmission { opcode: MetaOpcode::Open, ..m };
        assert_eq!(
            bad(MetaSubmission { flags: META_TRUNCATE, ..open }),
            Err(WireError::Flags { found: META_TRUNCATE })
        );
        let create = MetaSubmission { opcode: MetaOpcode::Create, ..m };
        assert_eq!(bad(MetaSubmission { arg: 0o10000, ..create }), Err(WireError::Field { offset: 56 }));
        let lookup = MetaSubmission { opcode: MetaOpcode::Lookup, ..m };
        assert_eq!(bad(lookup), Err(WireError::Field { offset: 56 }), "a lookup of no paths");
        let close = MetaSubmission { opcode: MetaOpcode::Close, handle: 9, request_length: 0, request_offset: 0, ..m };
        assert_eq!(bad(close), Err(WireError::Field { offset: 24 }), "a request region on a handle op");
        let close = MetaSubmission { request_region: 0, handle: 0, ..close };
        assert_eq!(bad(close), Err(WireError::Field { offset: 16 }), "no handle");
        let mut b = good;
        b[2] = 11;
        assert_eq!(Entry::decode(&b), Err(WireError::Opcode { found: 11 }));
        assert!(matches!(Entry::decode(&good[..40]), Err(WireError::Short { .. })));
    }

    #[test]
    fn request_strings_are_exact() {
        let b = encode_strings(&["/a/b", ""]).unwrap();
        assert_eq!(decode_strings(&b, 2), Ok(vec!["/a/b".to_owned(), String::new()]));
        assert_eq!(decode_strings(&b, 1), Err(RequestError::Trailing { count: 1, extra: 2 }));
        assert_eq!(decode_strings(&b, 3), Err(RequestError::Truncated { index: 2 }));
        assert_eq!(decode_strings(&b[..5], 1), Err(RequestError::Truncated { index: 0 }));
        assert_eq!(decode_strings(&[2, 0, 0xff, 0xfe], 1), Err(RequestError::Utf8 { index: 0 }));
        assert_eq!(decode_strings(&[0xff, 0xff], 1), Err(RequestError::Truncated { index: 0 }));
        assert!(encode_strings(&["x".repeat(70_000)]).is_none());
        // A huge count on a tiny request costs nothing.
        assert_eq!(decode_strings(&[], usize::MAX), Err(RequestError::Truncated { index: 0 }));
    }

    #[test]
    fn answers_round_trip() {
        let attr = AttrRecord { kind: KIND_FILE, mode: 0o644, size: 131072, mtime_ns: -5, object_id: 77 };
        assert_eq!(AttrRecord::decode(&attr.encode()), Some(attr));
        let mut b = attr.encode();
        b[0] = 3;
        assert_eq!(AttrRecord::decode(&b), None);
        let h = MetaHeader { handle: 5, chunk_bytes: 1 << 20, attr, count: 3, more: true };
        assert_eq!(MetaHeader::decode(&h.encode()), Some(h));
        let e =
            MetaError { code: CodeWord { code: 9, reason: Some(Reason::DirectoryNotEmpty) }, message: "é".repeat(40) };
        assert_eq!(MetaError::decode(&e.encode(1000)), Some(e.clone()));
        let cut = MetaError::decode(&e.encode(13)).unwrap();
        assert_eq!(cut.message, "éé", "cut at a character boundary");
        assert_eq!(MetaError::decode(&[1, 0, 0, 0, 255, 255, 255, 255]), None);
        assert_eq!(
            MetaError::decode(&[7, 0, 0x34, 0x12, 0, 0, 0, 0]).unwrap().code,
            CodeWord { code: 7, reason: None }
        );
    }

    #[test]
    fn random_metadata_entries_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut accepted = 0;
        for _ in 0..100_000 {
            let mut b = stat_entry().encode();
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..SQE_BYTES);
                b[at] = rng.random();
            }
            if rng.random_bool(0.3) {
                b[2] = rng.random_range(3..11);
            }
            if let Ok(Entry::Meta(m)) = Entry::decode(&b) {
                accepted += 1;
                assert_eq!(m.encode(), b);
            }
            let _ = decode_strings(&b, usize::from(b[0]));
            let _ = MetaHeader::decode(&b);
            let _ = MetaError::decode(&b);
        }
        assert!(accepted > 1_000, "{accepted}");
    }
}
