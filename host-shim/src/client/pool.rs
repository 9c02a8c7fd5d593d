//! Registered buffers handed out without a round trip to the agent.

use std::sync::Arc;

use crate::dataplane::RegisteredRegion;

struct PoolShared {
    free: std::sync::Mutex<Vec<RegisteredRegion>>,
    returned: std::sync::Condvar,
}

/// Registered buffers handed out without a round trip to the agent; a [`Buffer`]
/// goes back to the pool when dropped.
#[derive(Clone)]
pub struct RegionPool {
    shared: Arc<PoolShared>,
}

impl RegionPool {
    /// A pool of the registered regions `free`.
    pub(super) fn new(free: Vec<RegisteredRegion>) -> RegionPool {
        RegionPool {
            shared: Arc::new(PoolShared { free: std::sync::Mutex::new(free), returned: std::sync::Condvar::new() }),
        }
    }

    /// A free buffer, waiting for one if all are in use.
    pub fn get(&self) -> Buffer {
        let mut free = self.shared.free.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(region) = free.pop() {
                return Buffer { region: Some(region), pool: self.shared.clone() };
            }
            free = self.shared.returned.wait(free).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// A free buffer, or `None` if all are in use.
    pub fn try_get(&self) -> Option<Buffer> {
        let region = self.shared.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        Some(Buffer { region: Some(region), pool: self.shared.clone() })
    }
}

/// A registered buffer from a [`RegionPool`].
pub struct Buffer {
    region: Option<RegisteredRegion>,
    pool: Arc<PoolShared>,
}

impl std::ops::Deref for Buffer {
    type Target = RegisteredRegion;
    fn deref(&self) -> &RegisteredRegion {
        self.region.as_ref().expect("a live buffer holds its region")
    }
}

impl std::ops::DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut RegisteredRegion {
        self.region.as_mut().expect("a live buffer holds its region")
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            self.pool.free.lock().unwrap_or_else(|p| p.into_inner()).push(region);
            self.pool.returned.notify_one();
        }
    }
}
