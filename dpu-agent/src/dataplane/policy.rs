//! The engine's decisions beyond one ring, without I/O: where a request runs and in
//! how many pieces. Unit-tested here with plain values.
//!
//! Not here: what happens to one ring's entries ([`super::protocol`]), and which rings
//! the engine looks at when ([`super::readiness`]).

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

/// The piece size for a mapped request of `length` bytes ([`SPLIT_BYTES`]).
pub fn split_bytes(length: u64, cores: u64, chunk_bytes: u64) -> u64 {
    let floor = SPLIT_BYTES.min(chunk_bytes).max(1);
    if length > chunk_bytes {
        return floor;
    }
    length.div_ceil(cores.max(1)).next_power_of_two().clamp(floor, chunk_bytes.max(1))
}

#[cfg(test)]
mod tests {
    use super::split_bytes;

    #[test]
    fn a_request_splits_in_as_many_pieces_as_cores_within_the_bounds() {
        const KIB: u64 = 1024;
        const MIB: u64 = 1024 * KIB;
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
}
