//! The ring's layout in its region, its header, and the window the host's indices open.

use super::{WireError, u16_at, u32_at};

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
/// Offset of a completion entry's `seq` word, published after the bytes before it.
pub const CQE_SEQ_OFFSET: usize = 24;
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
