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

//!
//! One file per sub-format: the ring's layout, header and the window of the host's
//! indices (`ring.rs`); submission and completion entries (`entry.rs`); metadata
//! entries with their requests and answers (`metadata.rs`); the doorbell
//! (`doorbell.rs`). All of it is re-exported here: `wire::Submission`, `wire::ring_bytes`.

mod doorbell;
mod entry;
mod metadata;
mod ring;

pub use doorbell::*;
pub use entry::*;
pub use metadata::*;
pub use ring::*;

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
