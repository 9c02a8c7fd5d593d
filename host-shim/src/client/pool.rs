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

/// One registered region cut into slots of `slot_bytes`: each small read or write takes
/// a slot rather than a whole region, so that many threads doing small I/O each have one
/// (a [`RegionPool`] of a few whole regions bounds how many are in flight at once, however
/// many threads ask). A [`Slot`] goes back when dropped.
pub struct SlotPool {
    region: Buffer,
    slot_bytes: usize,
    /// Offsets in the region of the free slots.
    free: std::sync::Mutex<Vec<usize>>,
    returned: std::sync::Condvar,
}

impl SlotPool {
    /// The slots of `region` (a whole buffer kept for them), `slot_bytes` each; `None`
    /// when the region holds fewer than two.
    pub fn new(region: Buffer, slot_bytes: usize) -> Option<Arc<SlotPool>> {
        let count = region.len().checked_div(slot_bytes).filter(|&n| n >= 2)?;
        let free = (0..count).rev().map(|i| i * slot_bytes).collect();
        Some(Arc::new(SlotPool {
            region,
            slot_bytes,
            free: std::sync::Mutex::new(free),
            returned: std::sync::Condvar::new(),
        }))
    }

    /// Bytes of each slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// A free slot, waiting for one if all are in use.
    pub fn get(self: &Arc<SlotPool>) -> Slot {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(offset) = free.pop() {
                return Slot { pool: self.clone(), offset };
            }
            free = self.returned.wait(free).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A slot of a [`SlotPool`]: `slot_bytes` of its region from `offset` on.
pub struct Slot {
    pool: Arc<SlotPool>,
    offset: usize,
}

impl Slot {
    /// The region the slot lies in.
    pub fn region(&self) -> &RegisteredRegion {
        &self.pool.region
    }

    /// Where the slot starts in its region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes the slot holds.
    pub fn capacity(&self) -> usize {
        self.pool.slot_bytes
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.pool.free.lock().unwrap_or_else(|p| p.into_inner()).push(self.offset);
        self.pool.returned.notify_one();
    }
}
