//! Registered buffers handed out without a round trip to the agent.

use std::sync::{Arc, Condvar, Mutex};

use crate::dataplane::RegisteredRegion;

/// Things handed out and given back; a taker waits while none is free.
struct FreeList<T> {
    free: Mutex<Vec<T>>,
    returned: Condvar,
}

impl<T> FreeList<T> {
    fn new(free: Vec<T>) -> FreeList<T> {
        FreeList { free: Mutex::new(free), returned: Condvar::new() }
    }

    fn take(&self) -> T {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(item) = free.pop() {
                return item;
            }
            free = self.returned.wait(free).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn try_take(&self) -> Option<T> {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    fn give_back(&self, item: T) {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).push(item);
        self.returned.notify_one();
    }
}

/// Registered buffers handed out without a round trip to the agent; a [`Buffer`]
/// goes back to the pool when dropped.
#[derive(Clone)]
pub struct RegionPool {
    shared: Arc<FreeList<RegisteredRegion>>,
}

impl RegionPool {
    /// A pool of the registered regions `free`.
    pub(super) fn new(free: Vec<RegisteredRegion>) -> RegionPool {
        RegionPool { shared: Arc::new(FreeList::new(free)) }
    }

    /// A free buffer, waiting for one if all are in use.
    pub fn get(&self) -> Buffer {
        Buffer { region: Some(self.shared.take()), pool: self.shared.clone() }
    }

    /// A free buffer, or `None` if all are in use.
    pub fn try_get(&self) -> Option<Buffer> {
        Some(Buffer { region: Some(self.shared.try_take()?), pool: self.shared.clone() })
    }
}

/// A registered buffer from a [`RegionPool`].
pub struct Buffer {
    region: Option<RegisteredRegion>,
    pool: Arc<FreeList<RegisteredRegion>>,
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
            self.pool.give_back(region);
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
    free: FreeList<usize>,
}

impl SlotPool {
    /// The slots of `region` (a whole buffer kept for them), `slot_bytes` each; `None`
    /// when the region holds fewer than two.
    pub fn new(region: Buffer, slot_bytes: usize) -> Option<Arc<SlotPool>> {
        let count = region.len().checked_div(slot_bytes).filter(|&n| n >= 2)?;
        let free = (0..count).rev().map(|i| i * slot_bytes).collect();
        Some(Arc::new(SlotPool { region, slot_bytes, free: FreeList::new(free) }))
    }

    /// Bytes of each slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// A free slot, waiting for one if all are in use.
    pub fn get(self: &Arc<SlotPool>) -> Slot {
        Slot { pool: self.clone(), offset: self.free.take() }
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
        self.pool.free.give_back(self.offset);
    }
}
