//! Validation of ring entries, with no I/O: is a ring entry allowed, and how is it
//! split into backend operations.
//!
//! Everything a host writes into its rings is untrusted. [`validate`] checks one decoded
//! submission against what the session owns (its open handles and registered regions)
//! and the agent's limits, in a fixed order so the status a host gets is predictable:
//!
//! 1. length within `max_io_bytes`                      → `TooLarge`
//! 2. the handle is open in this session                → `BadHandle`
//! 3. a write needs a writable handle                   → `Access`
//! 4. the region is registered in this session          → `BadRegion`
//! 5. the region allows the agent this direction        → `Access`
//! 6. region range inside the region, file range finite → `OutOfRange`
//!
//! The adapters (the data-plane thread, UCX, the backend) only ever act on a
//! [`Validated`] request. [`chunks`] splits one into backend operations at chunk
//! boundaries so large requests pipeline and no single backend call is unbounded.

use dpuio_proto::wire::{MetaSubmission, Opcode, Status, Submission};

/// Which directions the agent may move data for a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionAccess {
    /// The agent may put into the region (file reads land there).
    pub agent_writes: bool,
    /// The agent may get from the region (file writes come from there).
    pub agent_reads: bool,
}

/// What the engine needs to know about a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionInfo {
    pub length: u64,
    pub access: RegionAccess,
    /// The agent has it mapped (shared memory): its I/O threads can write into it.
    /// Not a check: validation is the same either way.
    pub mapped: bool,
}

/// What the engine needs to know about an open handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleInfo {
    /// Reads may fill host memory from the file (open mode and capability).
    pub readable: bool,
    /// Writes may change the file (open mode and capability).
    pub writable: bool,
}

/// The session as the engine sees it.
pub trait SessionView {
    fn handle(&self, id: u64) -> Option<HandleInfo>;
    fn region(&self, id: u32) -> Option<RegionInfo>;
}

/// A submission that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validated {
    pub submission: Submission,
    pub region: RegionInfo,
}

/// Check one submission (see the module docs for the order of checks).
pub fn validate(sub: &Submission, session: &impl SessionView, max_io_bytes: u64) -> Result<Validated, Status> {
    if sub.length > max_io_bytes {
        return Err(Status::TooLarge);
    }
    let handle = session.handle(sub.handle).ok_or(Status::BadHandle)?;
    let permitted = match sub.opcode {
        Opcode::Read => handle.readable,
        Opcode::Write => handle.writable,
    };
    if !permitted {
        return Err(Status::Access);
    }
    let region = session.region(sub.region_id).ok_or(Status::BadRegion)?;
    let allowed = match sub.opcode {
        Opcode::Read => region.access.agent_writes,
        Opcode::Write => region.access.agent_reads,
    };
    if !allowed {
        return Err(Status::Access);
    }
    let region_end = sub.region_offset.checked_add(sub.length).ok_or(Status::OutOfRange)?;
    if region_end > region.length {
        return Err(Status::OutOfRange);
    }
    // File offsets are i64 in every backend (off_t, daos_off_t is u64 but DFS caps at
    // i64 for POSIX); refuse anything that would overflow it.
    let file_end = sub.file_offset.checked_add(sub.length).ok_or(Status::OutOfRange)?;
    if file_end > i64::MAX as u64 {
        return Err(Status::OutOfRange);
    }
    Ok(Validated { submission: *sub, region })
}

/// Check the memory a metadata entry names: its request range must lie in a region
/// of the session the agent may read, its answer range in one the agent may write,
/// and the answer no longer than `max_io_bytes`. In order: `TooLarge`, then for the
/// request and then the answer `BadRegion`, `Access`, `OutOfRange`. What the
/// operation itself may do (paths, rights, handles) is the namespace's to check, with
/// the errors gRPC gives.
pub fn validate_meta(m: &MetaSubmission, session: &impl SessionView, max_io_bytes: u64) -> Result<(), Status> {
    if u64::from(m.answer_length) > max_io_bytes {
        return Err(Status::TooLarge);
    }
    let within = |id: u32, offset: u64, length: u32, agent_writes: bool| {
        let region = session.region(id).ok_or(Status::BadRegion)?;
        let allowed = if agent_writes { region.access.agent_writes } else { region.access.agent_reads };
        if !allowed {
            return Err(Status::Access);
        }
        match offset.checked_add(u64::from(length)) {
            Some(end) if end <= region.length => Ok(()),
            _ => Err(Status::OutOfRange),
        }
    };
    if m.request_length > 0 {
        within(m.request_region, m.request_offset, m.request_length, false)?;
    }
    within(m.answer_region, m.answer_offset, m.answer_length, true)
}

/// One backend operation of a request: `length` bytes at `file_offset`, to or from
/// `region_offset` of the request's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub file_offset: u64,
    pub region_offset: u64,
    pub length: u64,
}

/// Split a request at file chunk boundaries (`chunk_bytes` > 0): the first and last
/// chunks may be partial, the others are whole chunks, so each backend operation
/// touches one storage chunk (one DAOS dkey) and no more.
pub fn chunks(file_offset: u64, region_offset: u64, length: u64, chunk_bytes: u64) -> impl Iterator<Item = Chunk> {
    assert!(chunk_bytes > 0, "chunk_bytes must be positive");
    let end = file_offset + length;
    let mut at = file_offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let boundary = (at / chunk_bytes + 1).saturating_mul(chunk_bytes);
        let next = boundary.min(end);
        let chunk = Chunk { file_offset: at, region_offset: region_offset + (at - file_offset), length: next - at };
        at = next;
        Some(chunk)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct FakeSession {
        handles: HashMap<u64, HandleInfo>,
        regions: HashMap<u32, RegionInfo>,
    }

    impl SessionView for FakeSession {
        fn handle(&self, id: u64) -> Option<HandleInfo> {
            self.handles.get(&id).copied()
        }
        fn region(&self, id: u32) -> Option<RegionInfo> {
            self.regions.get(&id).copied()
        }
    }

    const RW: RegionAccess = RegionAccess { agent_writes: true, agent_reads: true };

    fn session() -> FakeSession {
        FakeSession {
            handles: [
                (10, HandleInfo { readable: true, writable: false }),
                (11, HandleInfo { readable: true, writable: true }),
                (12, HandleInfo { readable: false, writable: true }),
            ]
            .into(),
            regions: [
                (1, RegionInfo { length: 1 << 20, access: RW, mapped: false }),
                (
                    2,
                    RegionInfo {
                        length: 4096,
                        access: RegionAccess { agent_writes: true, agent_reads: false },
                        mapped: false,
                    },
                ),
            ]
            .into(),
        }
    }

    fn read(handle: u64, region_id: u32, region_offset: u64, length: u64) -> Submission {
        Submission {
            opcode: Opcode::Read,
            flags: 0,
            user_data: 1,
            handle,
            region_id,
            file_offset: 0,
            region_offset,
            length,
        }
    }

    #[test]
    fn a_good_read_and_write_pass() {
        let s = session();
        assert!(validate(&read(10, 1, 0, 1 << 20), &s, 1 << 20).is_ok());
        let mut w = read(11, 1, 4096, 4096);
        w.opcode = Opcode::Write;
        assert!(validate(&w, &s, 1 << 20).is_ok());
    }

    #[test]
    fn each_check_has_its_status() {
        let s = session();
        let max = 1 << 20;
        assert_eq!(validate(&read(10, 1, 0, max + 1), &s, max), Err(Status::TooLarge));
        assert_eq!(validate(&read(99, 1, 0, 10), &s, max), Err(Status::BadHandle));
        let mut w = read(10, 1, 0, 10);
        w.opcode = Opcode::Write;
        assert_eq!(validate(&w, &s, max), Err(Status::Access), "write through a read-only handle");
        assert_eq!(validate(&read(12, 1, 0, 10), &s, max), Err(Status::Access), "read without the read right");
        assert_eq!(validate(&read(10, 9, 0, 10), &s, max), Err(Status::BadRegion));
        let mut w = read(11, 2, 0, 10);
        w.opcode = Opcode::Write;
        assert_eq!(validate(&w, &s, max), Err(Status::Access), "agent may not read region 2");
        assert_eq!(validate(&read(10, 2, 4000, 97), &s, max), Err(Status::OutOfRange));
        assert_eq!(validate(&read(10, 2, u64::MAX, 2), &s, max), Err(Status::OutOfRange));
        let mut far = read(10, 1, 0, 10);
        far.file_offset = i64::MAX as u64 - 5;
        assert_eq!(validate(&far, &s, max), Err(Status::OutOfRange));
        far.file_offset = u64::MAX - 5;
        assert_eq!(validate(&far, &s, max), Err(Status::OutOfRange));
    }

    #[test]
    fn chunks_split_at_file_boundaries() {
        let c: Vec<Chunk> = chunks(100, 0, 250, 100).collect();
        assert_eq!(
            c,
            [
                Chunk { file_offset: 100, region_offset: 0, length: 100 },
                Chunk { file_offset: 200, region_offset: 100, length: 100 },
                Chunk { file_offset: 300, region_offset: 200, length: 50 },
            ]
        );
        let c: Vec<Chunk> = chunks(150, 8, 10, 100).collect();
        assert_eq!(c, [Chunk { file_offset: 150, region_offset: 8, length: 10 }]);
        let c: Vec<Chunk> = chunks(50, 0, 100, 100).collect();
        assert_eq!(c.iter().map(|c| c.length).collect::<Vec<_>>(), [50, 50]);
        assert_eq!(chunks(0, 0, 0, 100).count(), 0);
    }

    #[test]
    fn chunks_cover_every_byte_once() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..2000 {
            let (off, len, chunk) =
                (rng.random_range(0..10_000u64), rng.random_range(0..5_000u64), rng.random_range(1..700u64));
            let mut next = off;
            for c in chunks(off, 7, len, chunk) {
                assert_eq!(c.file_offset, next);
                assert_eq!(c.region_offset, 7 + (c.file_offset - off));
                assert!(c.length > 0 && c.length <= chunk);
                assert!(c.file_offset / chunk == (c.file_offset + c.length - 1) / chunk, "one chunk per op");
                next += c.length;
            }
            assert_eq!(next, off + len);
        }
    }

    #[test]
    fn metadata_memory_checks() {
        use dpuio_proto::wire::MetaOpcode;
        let s = session();
        let m = MetaSubmission {
            opcode: MetaOpcode::Stat,
            flags: 0,
            user_data: 1,
            handle: 0,
            request_region: 1,
            answer_region: 2,
            request_offset: 0,
            answer_offset: 0,
            request_length: 10,
            answer_length: 4096,
            arg: 0,
        };
        let max = 1 << 20;
        assert_eq!(validate_meta(&m, &s, max), Ok(()));
        assert_eq!(validate_meta(&m, &s, 4095), Err(Status::TooLarge));
        assert_eq!(validate_meta(&MetaSubmission { request_region: 9, ..m }, &s, max), Err(Status::BadRegion));
        assert_eq!(validate_meta(&MetaSubmission { answer_region: 9, ..m }, &s, max), Err(Status::BadRegion));
        assert_eq!(
            validate_meta(&MetaSubmission { request_region: 2, ..m }, &s, max),
            Err(Status::Access),
            "the agent may not read region 2"
        );
        assert_eq!(validate_meta(&MetaSubmission { answer_offset: 1, ..m }, &s, max), Err(Status::OutOfRange));
        assert_eq!(validate_meta(&MetaSubmission { request_offset: u64::MAX, ..m }, &s, max), Err(Status::OutOfRange));
        let close = MetaSubmission { request_region: 0, request_length: 0, ..m };
        assert_eq!(validate_meta(&close, &s, max), Ok(()), "no request range to check");
    }
}
