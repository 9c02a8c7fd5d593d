//! The engine's decisions beyond one ring, without I/O: whether a round's rings run
//! their valid entries as they are taken or through the QoS scheduler
//! ([`runs_direct`]), where a payload request runs and in how many pieces ([`place`]),
//! and what a request the I/O threads ran completes with ([`pieces_outcome`]).
//! Unit-tested here with plain values.
//!
//! Not here: what happens to one ring's entries ([`super::protocol`]), and which rings
//! the engine looks at when ([`super::readiness`]).

use dpuio_proto::wire::{self, Opcode, Status, Submission};

use crate::validate::{self, Chunk};

/// With blocking backend calls, mapped requests are split so that the engine and the
/// I/O workers share one large request (a chunk boundary of the backend is always a
/// piece boundary): a request of at most one backend chunk in as many pieces as there
/// are cores to run them (a power of two from this size up to the chunk), a larger one
/// in pieces of this size. Measured on 2 cores, 1 MiB reads at queue depth 1: 256 KiB
/// pieces (the engine and two workers on two cores) reached 0.74x-1.00x of POSIX,
/// 512 KiB pieces (the engine and one worker) 1.14x-1.20x at a lower host CPU, whole
/// chunks 0.60x; for unet3d's 4 MiB reads, many in flight, 1 MiB pieces cost its
/// host about a fifth more CPU than 256 KiB ones. Queues that overlap I/O split at the
/// backend's chunk size instead: their pieces run concurrently anyway, and a smaller
/// piece only adds a storage call (over DAOS, an RPC) per piece.
pub const SPLIT_BYTES: u64 = 256 * 1024;

/// Whether this round's rings run their valid entries as they are taken
/// (`protocol::Tenant::Direct`), as fast as without QoS, rather than through the
/// scheduler: only when nothing is queued (`queue_empty`) and every ring is one
/// unlimited tenant's. `tenants` gives each ring's tenant as who it is and whether it is
/// unlimited (`None`: removed at run time).
pub fn runs_direct<K: PartialEq>(queue_empty: bool, tenants: impl IntoIterator<Item = Option<(K, bool)>>) -> bool {
    if !queue_empty {
        return false;
    }
    let mut tenants = tenants.into_iter();
    let Some(Some((first, true))) = tenants.next() else { return false };
    tenants.all(|t| t.is_some_and(|(k, _)| k == first))
}

/// Where a validated payload request runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// On the engine thread, now: its memory is reached with put/get, or it is one
    /// piece that costs less inline than a hand-off.
    Here,
    /// On the I/O threads, in `pieces` (the last to finish posts the completion). With
    /// `engine_first`, the engine runs the first piece itself rather than idle while the
    /// threads wake (blocking backend calls).
    Workers { pieces: Vec<Chunk>, engine_first: bool },
    /// Its memory is reached with put/get and the backend has asynchronous I/O: on the
    /// I/O threads too, in `pieces` of at most a chunk, each read into (or written
    /// from) a slot of the lane's staged-I/O memory; the engine moves the bytes between
    /// the slots and the host, and posts the completion. So the engine never waits on
    /// storage for such a ring either, and many of its requests are in flight at once.
    Staged { pieces: Vec<Chunk> },
}

/// Where `sub` runs: `mapped` whether its region and its ring are both mapped (the I/O
/// threads write host memory directly), `overlaps` whether the I/O threads' queues keep
/// many pieces in flight (the backend has asynchronous I/O, and the object does not
/// lend memory of its own for put/get), `cores` the cores to run one request's pieces
/// on, `chunk_bytes` the backend's chunk.
pub fn place(sub: &Submission, mapped: bool, overlaps: bool, cores: u64, chunk_bytes: u64) -> Placement {
    if !mapped {
        let pieces: Vec<Chunk> = match overlaps {
            true => validate::chunks(sub.file_offset, sub.region_offset, sub.length, chunk_bytes).collect(),
            false => Vec::new(),
        };
        return match pieces.is_empty() {
            true => Placement::Here,
            false => Placement::Staged { pieces },
        };
    }
    let split = if overlaps { chunk_bytes } else { split_bytes(sub.length, cores, chunk_bytes) };
    let pieces: Vec<Chunk> = validate::chunks(sub.file_offset, sub.region_offset, sub.length, split).collect();
    // With blocking backend calls one piece is cheaper inline than a hand-off to a
    // worker; with overlapping queues every piece goes to them, so the engine never
    // waits on storage and the workers keep many pieces in flight.
    if pieces.is_empty() || (pieces.len() == 1 && !overlaps) {
        return Placement::Here;
    }
    Placement::Workers { pieces, engine_first: !overlaps }
}

/// The piece size for a mapped request of `length` bytes ([`SPLIT_BYTES`]).
pub fn split_bytes(length: u64, cores: u64, chunk_bytes: u64) -> u64 {
    let floor = SPLIT_BYTES.min(chunk_bytes).max(1);
    if length > chunk_bytes {
        return floor;
    }
    length.div_ceil(cores.max(1)).next_power_of_two().clamp(floor, chunk_bytes.max(1))
}

/// Whether `sub` is made durable after its last byte is written ([`wire::FLAG_SYNC`]).
pub fn syncs(sub: &Submission) -> bool {
    sub.opcode == Opcode::Write && sub.flags & wire::FLAG_SYNC != 0
}

/// How a backend piece of a request failed, in rising order: where several pieces of
/// one request fail, the completion names the highest (an integrity failure is never
/// hidden behind another; a hard error not behind a "retry later").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum BackendFailure {
    /// The storage does not answer now (DAOS engines down); retrying later may work.
    Unavailable = 1,
    /// Any other error.
    Io = 2,
    /// An integrity check failed (inline encryption).
    Integrity = 3,
}

impl BackendFailure {
    /// The completion status of a request that failed so.
    pub fn status(self) -> Status {
        match self {
            BackendFailure::Unavailable => Status::Unavailable,
            BackendFailure::Io => Status::Io,
            BackendFailure::Integrity => Status::Integrity,
        }
    }

    /// The failure a rank from [`BackendFailure`] `as u8` names (0: none).
    pub fn from_rank(rank: u8) -> Option<BackendFailure> {
        [BackendFailure::Unavailable, BackendFailure::Io, BackendFailure::Integrity]
            .into_iter()
            .find(|f| *f as u8 == rank)
    }
}

/// How a request whose backend call failed with `e` failed: `Integrity` when an
/// integrity check failed (inline encryption), `Unavailable` when the storage does not
/// answer now (the host may retry later), else `Io`.
pub fn failure(e: &dpuio_backend::Error) -> BackendFailure {
    match e {
        dpuio_backend::Error::Integrity { .. } => BackendFailure::Integrity,
        dpuio_backend::Error::Unavailable { .. } => BackendFailure::Unavailable,
        _ => BackendFailure::Io,
    }
}

/// The completion status of a request whose backend call failed with `e` ([`failure`]).
pub fn failure_status(e: &dpuio_backend::Error) -> Status {
    failure(e).status()
}

/// What a request that ran on the I/O threads completes with (status, bytes), from
/// how its pieces went: `failure` the highest failure of them (or of the sync after a
/// write), `short_end` the lowest file offset where a read came up short at the end of
/// the file (`u64::MAX`: none did).
pub fn pieces_outcome(sub: &Submission, failure: Option<BackendFailure>, short_end: u64) -> (Status, u64) {
    match failure {
        Some(f) => (f.status(), 0),
        None if short_end == u64::MAX => (Status::Ok, sub.length),
        None => (Status::Ok, short_end.saturating_sub(sub.file_offset)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;

    fn sub(opcode: Opcode, file_offset: u64, length: u64) -> Submission {
        Submission { opcode, flags: 0, user_data: 1, handle: 2, region_id: 3, file_offset, region_offset: 0, length }
    }

    #[test]
    fn a_request_splits_in_as_many_pieces_as_cores_within_the_bounds() {
        // Two cores: a 1 MiB read in two halves; one larger than a chunk in the
        // smallest pieces (many such requests are in flight at once).
        assert_eq!(split_bytes(MIB, 2, MIB), 512 * KIB);
        assert_eq!(split_bytes(4 * MIB, 2, MIB), 256 * KIB);
        // Many cores: never smaller than SPLIT_BYTES.
        assert_eq!(split_bytes(MIB, 16, MIB), 256 * KIB);
        // An odd length rounds up to a power of two, so chunk boundaries stay piece boundaries.
        assert_eq!(split_bytes(MIB + 1, 2, 4 * MIB), MIB);
        assert_eq!(split_bytes(3 * MIB, 2, 4 * MIB), 2 * MIB);
        assert_eq!((4 * MIB) % split_bytes(3 * MIB, 3, 4 * MIB), 0);
        // One core, a small chunk, a zero length: bounded, never zero.
        assert_eq!(split_bytes(MIB, 1, MIB), MIB);
        assert_eq!(split_bytes(MIB, 2, 64 * KIB), 64 * KIB);
        assert_eq!(split_bytes(0, 2, MIB), 256 * KIB);
    }

    #[test]
    fn only_one_unlimited_tenant_with_nothing_queued_runs_direct() {
        let unlimited = |k: &'static str| Some((k, true));
        assert!(runs_direct(true, [unlimited("a"), unlimited("a")]));
        assert!(!runs_direct(false, [unlimited("a")]), "something is queued: the scheduler keeps the order");
        assert!(!runs_direct(true, [unlimited("a"), unlimited("b")]), "two tenants share by weight");
        assert!(!runs_direct(true, [Some(("a", false))]), "a limited tenant goes through its buckets");
        assert!(!runs_direct(true, [unlimited("a"), None]), "a removed tenant's ring");
        assert!(!runs_direct(true, [None, unlimited("a")]));
        assert!(!runs_direct::<&str>(true, []), "no ring");
    }

    #[test]
    fn put_get_and_single_pieces_run_here_and_the_rest_on_the_workers() {
        let read = sub(Opcode::Read, 0, MIB);
        assert_eq!(place(&read, false, false, 2, MIB), Placement::Here, "not mapped: put/get through staging");
        // Not mapped, asynchronous I/O: staged pieces of a chunk at most on the workers.
        let Placement::Staged { pieces } = place(&sub(Opcode::Write, MIB / 2, 2 * MIB), false, true, 2, MIB) else {
            panic!()
        };
        assert_eq!(
            pieces.iter().map(|p| (p.region_offset, p.length)).collect::<Vec<_>>(),
            [(0, MIB / 2), (MIB / 2, MIB), (3 * MIB / 2, MIB / 2)]
        );
        assert_eq!(place(&sub(Opcode::Read, 0, 0), false, true, 2, MIB), Placement::Here, "nothing to move");
        assert_eq!(place(&sub(Opcode::Read, 0, 0), true, true, 2, MIB), Placement::Here, "nothing to move");
        // Blocking calls: a small request is one piece, cheaper here than a hand-off.
        assert_eq!(place(&sub(Opcode::Read, 0, 4 * KIB), true, false, 2, MIB), Placement::Here);
        // Blocking calls: two halves, the engine taking the first.
        let Placement::Workers { pieces, engine_first } = place(&read, true, false, 2, MIB) else { panic!() };
        assert!(engine_first);
        assert_eq!(
            pieces.iter().map(|p| (p.file_offset, p.length)).collect::<Vec<_>>(),
            [(0, MIB / 2), (MIB / 2, MIB / 2)]
        );
        // Overlapping queues: every piece to the workers, split at the chunk only.
        let small = sub(Opcode::Write, 5, 4 * KIB);
        assert_eq!(
            place(&small, true, true, 2, MIB),
            Placement::Workers {
                pieces: vec![Chunk { file_offset: 5, region_offset: 0, length: 4 * KIB }],
                engine_first: false
            }
        );
        let Placement::Workers { pieces, .. } = place(&sub(Opcode::Read, MIB / 2, 2 * MIB), true, true, 2, MIB) else {
            panic!()
        };
        assert_eq!(pieces.iter().map(|p| p.length).collect::<Vec<_>>(), [MIB / 2, MIB, MIB / 2]);
    }

    #[test]
    fn pieces_complete_with_the_bytes_up_to_the_end_of_the_file_or_the_failure() {
        let read = sub(Opcode::Read, 100, 1000);
        assert_eq!(pieces_outcome(&read, None, u64::MAX), (Status::Ok, 1000));
        assert_eq!(pieces_outcome(&read, None, 600), (Status::Ok, 500), "end of file at 600");
        assert_eq!(pieces_outcome(&read, None, 100), (Status::Ok, 0), "nothing past the end");
        assert_eq!(pieces_outcome(&read, Some(BackendFailure::Io), 600), (Status::Io, 0));
        assert_eq!(pieces_outcome(&read, Some(BackendFailure::Integrity), u64::MAX), (Status::Integrity, 0));
        assert_eq!(pieces_outcome(&read, Some(BackendFailure::Unavailable), u64::MAX), (Status::Unavailable, 0));
        // Pieces failing differently: the highest failure names the request.
        assert!(BackendFailure::Unavailable < BackendFailure::Io && BackendFailure::Io < BackendFailure::Integrity);
        for f in [BackendFailure::Unavailable, BackendFailure::Io, BackendFailure::Integrity] {
            assert_eq!(BackendFailure::from_rank(f as u8), Some(f));
        }
        assert_eq!(BackendFailure::from_rank(0), None);
    }

    #[test]
    fn only_writes_with_the_sync_flag_sync_and_integrity_failures_say_so() {
        assert!(!syncs(&sub(Opcode::Write, 0, 1)));
        assert!(syncs(&Submission { flags: wire::FLAG_SYNC, ..sub(Opcode::Write, 0, 1) }));
        assert!(!syncs(&Submission { flags: wire::FLAG_SYNC, ..sub(Opcode::Read, 0, 1) }));
        let integrity =
            dpuio_backend::Error::Integrity { path: "/f".into(), block_index: Some(3), detail: "tag".into() };
        assert_eq!(failure_status(&integrity), Status::Integrity);
        let io = dpuio_backend::Error::Io { context: "/f".into(), source: std::io::Error::other("disk") };
        assert_eq!(failure_status(&io), Status::Io);
        let gone = dpuio_backend::Error::Unavailable { what: "/f".into(), reason: "dfs_read: no answer".into() };
        assert_eq!(failure_status(&gone), Status::Unavailable);
    }
}
