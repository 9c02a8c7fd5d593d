//! The entries of a ring not yet completed, kept so that they can go out again on a new
//! ring after an agent restart.
//!
//! Each entry goes out with its slot number as `user_data` (completions come in any
//! order, and the caller's `user_data` is any value it likes); the completion's echo
//! names the slot, and the slot gives the caller's `user_data` back.

use crate::wire::{SQE_BYTES, SQE_USER_DATA_OFFSET};

/// An entry that was pushed and has not completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The entry as the caller gave it (its own `user_data` in place).
    pub entry: [u8; SQE_BYTES],
    /// The caller's `user_data`.
    pub user_data: u64,
    /// Whether it can go to another ring as it is: not when it points into its ring's
    /// own memory (metadata requests and answers).
    pub movable: bool,
}

#[derive(Debug)]
struct Slot {
    pending: Pending,
    /// Order of pushing, kept when the entry moves to another ring.
    seq: u64,
}

/// The slot table of one ring: as many slots as entries.
#[derive(Debug)]
pub(super) struct Slots {
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    next_seq: u64,
}

impl Slots {
    pub(super) fn new(entries: u32) -> Slots {
        Slots { slots: (0..entries).map(|_| None).collect(), free: (0..entries).rev().collect(), next_seq: 0 }
    }

    /// Slots holding an entry.
    pub(super) fn held(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Keep `entry`; returns the slot number that goes out as its `user_data`, or `None`
    /// when every slot is held.
    pub(super) fn take(&mut self, entry: &[u8; SQE_BYTES], movable: bool) -> Option<u32> {
        let slot = self.free.pop()?;
        let user_data = user_data_of(entry);
        self.next_seq += 1;
        let pending = Pending { entry: *entry, user_data, movable };
        self.slots[slot as usize] = Some(Slot { pending, seq: self.next_seq });
        Some(slot)
    }

    /// The caller's `user_data` of the entry in `slot`, which is done; `None` if the
    /// echo names no held slot (an agent that echoes something else).
    pub(super) fn finish(&mut self, slot: u64) -> Option<u64> {
        let s = self.slots.get_mut(usize::try_from(slot).ok()?)?.take()?;
        self.free.push(slot as u32);
        Some(s.pending.user_data)
    }

    /// Forget the newest `n` entries (pushed, never published, withdrawn).
    pub(super) fn withdraw(&mut self, n: u64) {
        for _ in 0..n {
            let newest = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| Some((i, s.as_ref()?.seq)))
                .max_by_key(|(_, seq)| *seq);
            if let Some((i, _)) = newest {
                self.slots[i] = None;
                self.free.push(i as u32);
            }
        }
    }

    /// Every entry not completed, oldest first, leaving the slots empty.
    pub(super) fn drain(&mut self) -> Vec<Pending> {
        let mut all: Vec<Slot> = self.slots.iter_mut().filter_map(Option::take).collect();
        all.sort_by_key(|s| s.seq);
        self.free = (0..self.slots.len() as u32).rev().collect();
        all.into_iter().map(|s| s.pending).collect()
    }
}

/// The `user_data` field of an entry.
pub(super) fn user_data_of(entry: &[u8; SQE_BYTES]) -> u64 {
    let at = SQE_USER_DATA_OFFSET;
    u64::from_le_bytes(entry[at..at + 8].try_into().expect("8 bytes"))
}

/// `entry` with `user_data` in place of its own.
pub(super) fn with_user_data(entry: &[u8; SQE_BYTES], user_data: u64) -> [u8; SQE_BYTES] {
    let mut tagged = *entry;
    let at = SQE_USER_DATA_OFFSET;
    tagged[at..at + 8].copy_from_slice(&user_data.to_le_bytes());
    tagged
}
