//! Doorbells: tiny messages from the host telling the agent "look at ring N".
//!
//! A doorbell carries only bytes chosen by the sender (the `proto` crate defines them:
//! a session and ring id). The transport does not say which endpoint sent it, on
//! purpose: the agent maps the id in the doorbell to a session itself and treats the
//! bytes as untrusted. A doorbell is a hint that work may be waiting, never the work:
//! losing one (queue overflow) must only delay, which is why overflow is counted and
//! reported so the agent can scan all rings.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Largest doorbell in bytes. Doorbells travel inline in one eager message.
pub const MAX_DOORBELL_BYTES: usize = 64;

/// One received (or to be sent) doorbell: up to [`MAX_DOORBELL_BYTES`] bytes, stored
/// inline so receiving one never allocates.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Doorbell {
    len: u8,
    bytes: [u8; MAX_DOORBELL_BYTES],
}

impl Doorbell {
    /// Copies `bytes` into a doorbell.
    pub fn new(bytes: &[u8]) -> Result<Self> {
        if bytes.len() > MAX_DOORBELL_BYTES {
            return Err(Error::DoorbellTooLong { len: bytes.len(), max: MAX_DOORBELL_BYTES });
        }
        let mut buf = [0u8; MAX_DOORBELL_BYTES];
        buf[..bytes.len()].copy_from_slice(bytes);
        Ok(Doorbell { len: bytes.len() as u8, bytes: buf })
    }

    /// The bytes the sender chose.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Doorbell({:02x?})", self.as_bytes())
    }
}

/// Bounded queue between the transport's receive callback and the consumer.
pub(crate) struct DoorbellQueue {
    queue: Mutex<VecDeque<Doorbell>>,
    capacity: usize,
    overflowed: AtomicU64,
    malformed: AtomicU64,
}

impl DoorbellQueue {
    pub(crate) fn new(capacity: usize) -> Self {
        DoorbellQueue {
            queue: Mutex::new(VecDeque::with_capacity(capacity.min(1024))),
            capacity,
            overflowed: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
        }
    }

    /// Called from the receive path (inside transport progress): must not panic.
    pub(crate) fn push(&self, bytes: &[u8]) {
        let Ok(doorbell) = Doorbell::new(bytes) else {
            self.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= self.capacity {
            self.overflowed.fetch_add(1, Ordering::Relaxed);
        } else {
            q.push_back(doorbell);
        }
    }

    pub(crate) fn note_malformed(&self) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
    }

    /// Moves all queued doorbells to `out`; returns how many overflowed since the last
    /// call.
    pub(crate) fn take(&self, out: &mut Vec<Doorbell>) -> u64 {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        out.extend(q.drain(..));
        drop(q);
        self.overflowed.swap(0, Ordering::Relaxed)
    }

    pub(crate) fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doorbell_limits() {
        assert_eq!(Doorbell::new(b"ring 7").unwrap().as_bytes(), b"ring 7");
        assert_eq!(Doorbell::new(&[]).unwrap().as_bytes(), b"");
        assert!(Doorbell::new(&[0; MAX_DOORBELL_BYTES]).is_ok());
        assert!(matches!(
            Doorbell::new(&[0; MAX_DOORBELL_BYTES + 1]),
            Err(Error::DoorbellTooLong { len: 65, max: 64 })
        ));
    }

    #[test]
    fn queue_is_bounded_and_reports_overflow() {
        let q = DoorbellQueue::new(2);
        q.push(b"a");
        q.push(b"b");
        q.push(b"c");
        q.push(&[0; 100]);
        let mut out = Vec::new();
        assert_eq!(q.take(&mut out), 1);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].as_bytes(), b"b");
        assert_eq!(q.malformed(), 1);
        out.clear();
        assert_eq!(q.take(&mut out), 0, "overflow count resets");
        assert!(out.is_empty());
    }
}
