//! Metadata entries: namespace operations whose request (paths) and answer
//! (attributes, a handle, directory entries, file bytes) live in host regions the
//! entry names, and the formats of both; and [`Entry`], an entry of either kind (this
//! room sits above `entry`, whose head it shares).

use super::entry::{Submission, check_head, entry_head};
use super::{SQE_BYTES, WireError, u16_at, u32_at, u64_at};
use crate::reason::Reason;

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
    /// Remove the file or empty directory at the path (`Namespace.Remove`); flag
    /// [`META_RECURSIVE`] removes a whole tree. Answer: the header alone.
    Remove = 11,
}

/// Metadata flag: [`MetaOpcode::Open`] for reading and writing.
pub const META_WRITE: u16 = 1 << 1;
/// Metadata flag: [`MetaOpcode::Open`] truncating the file (needs [`META_WRITE`]).
pub const META_TRUNCATE: u16 = 1 << 2;
/// Metadata flag: [`MetaOpcode::Create`] fails if the file exists.
pub const META_EXCLUSIVE: u16 = 1 << 3;
/// Metadata flag: [`MetaOpcode::Remove`] of a directory and everything under it.
pub const META_RECURSIVE: u16 = 1 << 4;
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
/// namespace refuses completes with [`Status::Refused`](super::Status::Refused) and an error record
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

impl MetaOpcode {
    pub(super) fn from_u8(b: u8) -> Option<MetaOpcode> {
        use MetaOpcode::*;
        [Stat, StatHandle, Open, Create, Close, OpenRead, Lookup, Readdir, Remove].into_iter().find(|o| *o as u8 == b)
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
            MetaOpcode::Remove => META_RECURSIVE,
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
/// 16 AttrRecord (32 bytes; zero for Close, Lookup, Readdir, Remove)
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

/// The answer of a refused metadata entry ([`Status::Refused`](super::Status::Refused)): `u32 code` (see
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

/// One path's result in a lookup answer: `u32 code` (a [`CodeWord`]; 0: found),
/// `u32 message length`, an [`AttrRecord`] (zero unless found), the message, zero
/// padding to 8 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupRecord {
    pub code: u32,
    pub attr: AttrRecord,
    pub message: String,
}

/// One entry of a listing batch: `u16 name length`, 6 zero bytes, an [`AttrRecord`],
/// the name, zero padding to 8 bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirRecord {
    pub name: String,
    pub attr: AttrRecord,
}

impl LookupRecord {
    /// Append the record to an answer.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.code.to_le_bytes());
        out.extend_from_slice(&(self.message.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.attr.encode());
        out.extend_from_slice(self.message.as_bytes());
        out.resize(pad8(out.len()), 0);
    }
}

impl DirRecord {
    /// Append the record to an answer; `None` (nothing appended) if the name is longer
    /// than 65535 bytes.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Option<()> {
        let len = u16::try_from(self.name.len()).ok()?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&[0; 6]);
        out.extend_from_slice(&self.attr.encode());
        out.extend_from_slice(self.name.as_bytes());
        out.resize(pad8(out.len()), 0);
        Some(())
    }
}

/// A record of an answer runs past the bytes the answer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an answer record runs past the answer")]
pub struct RecordOverrun;

/// The records after an answer's [`MetaHeader`], read in order out of a copy of the
/// answer (the bytes the completion says were written). Text is taken as UTF-8, any
/// invalid bytes replaced; an attribute record that does not decode reads as all zero
/// (a lookup's failed path has one).
#[derive(Debug, Clone)]
pub struct AnswerRecords<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> AnswerRecords<'a> {
    /// The records of `answer`, a whole answer, header included.
    pub fn new(answer: &'a [u8]) -> AnswerRecords<'a> {
        AnswerRecords { bytes: answer, at: META_ANSWER_HEADER_BYTES as usize }
    }

    /// The next lookup result.
    pub fn lookup(&mut self) -> Result<LookupRecord, RecordOverrun> {
        let code = u32_at(self.take(4)?, 0);
        let len = u32_at(self.take(4)?, 0) as usize;
        let attr = self.attr()?;
        let message = self.text(len)?;
        self.pad();
        Ok(LookupRecord { code, attr, message })
    }

    /// The next entry of a listing batch.
    pub fn dir_entry(&mut self) -> Result<DirRecord, RecordOverrun> {
        let len = usize::from(u16_at(self.take(2)?, 0));
        self.take(6)?;
        let attr = self.attr()?;
        let name = self.text(len)?;
        self.pad();
        Ok(DirRecord { name, attr })
    }

    /// The anchor after a listing batch's entries: where the next batch starts.
    pub fn anchor(&mut self) -> Result<String, RecordOverrun> {
        let len = usize::from(u16_at(self.take(2)?, 0));
        self.text(len)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordOverrun> {
        let b = self.bytes.get(self.at..self.at.checked_add(n).ok_or(RecordOverrun)?).ok_or(RecordOverrun)?;
        self.at += n;
        Ok(b)
    }

    fn attr(&mut self) -> Result<AttrRecord, RecordOverrun> {
        Ok(AttrRecord::decode(self.take(ATTR_BYTES)?).unwrap_or_default())
    }

    fn text(&mut self, n: usize) -> Result<String, RecordOverrun> {
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }

    fn pad(&mut self) {
        self.at = pad8(self.at);
    }
}

#[cfg(test)]
mod tests {
    use super::super::entry::tests::sample;
    use crate::reason::Reason;
    use crate::wire::*;

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
        let remove = MetaSubmission { opcode: MetaOpcode::Remove, flags: META_RECURSIVE, ..m };
        assert_eq!(MetaSubmission::decode(&remove.encode()), Ok(remove));
        // Recursive is a remove's flag alone, and a remove takes no mode.
        assert_eq!(
            MetaSubmission::decode(&MetaSubmission { flags: META_RECURSIVE, ..m }.encode()),
            Err(WireError::Flags { found: META_RECURSIVE })
        );
        assert_eq!(
            MetaSubmission::decode(&MetaSubmission { arg: 0o600, ..remove }.encode()),
            Err(WireError::Field { offset: 56 })
        );
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
        b[2] = 12;
        assert_eq!(Entry::decode(&b), Err(WireError::Opcode { found: 12 }));
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

    #[test]
    fn answer_records_round_trip_and_overruns_are_refused() {
        let attr = AttrRecord { kind: KIND_FILE, mode: 0o600, size: 5, mtime_ns: 7, object_id: 8 };
        let mut answer = MetaHeader { count: 2, ..MetaHeader::default() }.encode().to_vec();
        let found = LookupRecord { code: 0, attr, message: String::new() };
        let missing = LookupRecord { code: 5, attr: AttrRecord::default(), message: "no such file".into() };
        found.encode_into(&mut answer);
        missing.encode_into(&mut answer);
        assert_eq!(answer.len() % 8, 0);
        let mut r = AnswerRecords::new(&answer);
        assert_eq!((r.lookup(), r.lookup()), (Ok(found), Ok(missing)));
        assert_eq!(r.lookup(), Err(RecordOverrun));

        let mut listing = MetaHeader { count: 1, more: true, ..MetaHeader::default() }.encode().to_vec();
        let entry = DirRecord { name: "a.bin".into(), attr };
        entry.encode_into(&mut listing).unwrap();
        listing.extend(encode_strings(&["a.bin"]).unwrap());
        let mut r = AnswerRecords::new(&listing);
        assert_eq!(r.dir_entry(), Ok(entry));
        assert_eq!(r.anchor().as_deref(), Ok("a.bin"));
        for cut in 0..listing.len() - 1 {
            let mut r = AnswerRecords::new(&listing[..cut]);
            assert!(r.dir_entry().and_then(|_| r.anchor()).is_err(), "cut at {cut}");
        }
        assert!(DirRecord { name: "x".repeat(70_000), attr }.encode_into(&mut Vec::new()).is_none());
    }
}
