//! The doorbell: the small message a host sends after publishing submissions.

use super::{u32_at, u64_at};

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
}
