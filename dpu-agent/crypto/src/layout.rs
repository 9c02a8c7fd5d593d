//! Where plaintext bytes live in a stored (encrypted) file, and what a write or a
//! resize must re-seal.
//!
//! ```text
//! stored file:  [header HEADER_BYTES][block 0][block 1]...[block n-1]
//! block i:      [nonce 12][ciphertext: min(B, size - i*B) bytes][tag 16]
//! ```
//!
//! Plaintext block `i` covers `i*B .. (i+1)*B`; every block but the last is full; the
//! last holds the rest (never empty). All arithmetic is on `u64` and bounded by
//! [`MAX_PLAINTEXT_BYTES`], so nothing here can overflow.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::provider::{NONCE_BYTES, TAG_BYTES};

/// Size of the file header in bytes: where block 0 starts. The header's fields are
/// `crate::header`'s; only its size is part of the layout.
pub const HEADER_BYTES: usize = 256;
/// Bytes a stored block adds to its plaintext: nonce and tag.
pub const BLOCK_OVERHEAD_BYTES: usize = NONCE_BYTES + TAG_BYTES;
/// Smallest encryption block: one page.
pub const MIN_BLOCK_BYTES: u32 = 4 * 1024;
/// Largest encryption block (a bound on staging buffers).
pub const MAX_BLOCK_BYTES: u32 = 16 * 1024 * 1024;
/// Default encryption block; see the crate documentation for why 64 KiB.
pub const DEFAULT_BLOCK_BYTES: u32 = 64 * 1024;
/// Largest plaintext size of an encrypted file (4 EiB): far past any backend, and
/// small enough that every stored offset fits in a `u64`.
pub const MAX_PLAINTEXT_BYTES: u64 = 1 << 62;

/// The block geometry of one file: its encryption block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    block_bytes: u32,
}

impl Layout {
    /// A layout with `block_bytes` per block: a power of two from
    /// [`MIN_BLOCK_BYTES`] to [`MAX_BLOCK_BYTES`].
    pub fn new(block_bytes: u32) -> Result<Self> {
        if !block_bytes.is_power_of_two() || !(MIN_BLOCK_BYTES..=MAX_BLOCK_BYTES).contains(&block_bytes) {
            return Err(Error::InvalidBlockSize {
                block_bytes: block_bytes.into(),
                min: MIN_BLOCK_BYTES,
                max: MAX_BLOCK_BYTES,
            });
        }
        Ok(Self { block_bytes })
    }

    /// Plaintext bytes of a full block.
    pub fn block_bytes(&self) -> u32 {
        self.block_bytes
    }

    /// Stored bytes of a full block (`block_bytes + 28`).
    pub fn stored_block_bytes(&self) -> usize {
        self.block_bytes as usize + BLOCK_OVERHEAD_BYTES
    }

    fn b(&self) -> u64 {
        self.block_bytes.into()
    }

    fn check(what: &'static str, value: u64) -> Result<u64> {
        if value > MAX_PLAINTEXT_BYTES {
            return Err(Error::OutOfRange { what, value, max: MAX_PLAINTEXT_BYTES });
        }
        Ok(value)
    }

    /// Indices of the blocks a plaintext range touches (empty for `len == 0`).
    pub fn blocks(&self, offset: u64, len: u64) -> Result<Range<u64>> {
        let end = Self::check("end of range", Self::check("offset", offset)?.saturating_add(len))?;
        if len == 0 {
            return Ok(0..0);
        }
        Ok(offset / self.b()..end.div_ceil(self.b()))
    }

    /// Index of the block holding plaintext byte `offset`.
    pub fn block_index(&self, offset: u64) -> u64 {
        offset.min(MAX_PLAINTEXT_BYTES) / self.b()
    }

    /// Number of blocks of a file of `plaintext_bytes`.
    pub fn block_count(&self, plaintext_bytes: u64) -> u64 {
        plaintext_bytes.min(MAX_PLAINTEXT_BYTES).div_ceil(self.b())
    }

    /// Plaintext offset where block `index` starts (saturating for indices past
    /// [`Layout::max_block_index`]).
    pub fn block_offset(&self, index: u64) -> u64 {
        index.saturating_mul(self.b())
    }

    /// The last block index any file can have.
    pub fn max_block_index(&self) -> u64 {
        MAX_PLAINTEXT_BYTES / self.b() - 1
    }

    /// Plaintext bytes block `index` holds in a file of `plaintext_bytes` (0 past the
    /// end).
    pub fn block_len(&self, index: u64, plaintext_bytes: u64) -> usize {
        let start = self.block_offset(index);
        // At most block_bytes, so it fits in usize.
        plaintext_bytes.min(MAX_PLAINTEXT_BYTES).saturating_sub(start).min(self.b()) as usize
    }

    /// Offset of block `index` in the stored file (saturating for indices past
    /// [`Layout::max_block_index`]).
    pub fn stored_offset(&self, index: u64) -> u64 {
        index.saturating_mul(self.stored_block_bytes() as u64).saturating_add(HEADER_BYTES as u64)
    }

    /// Stored bytes of block `index` in a file of `plaintext_bytes` (0 past the end).
    pub fn stored_block_len(&self, index: u64, plaintext_bytes: u64) -> usize {
        match self.block_len(index, plaintext_bytes) {
            0 => 0,
            n => n + BLOCK_OVERHEAD_BYTES,
        }
    }

    /// The stored bytes to read for block `index` of a file of `plaintext_bytes`
    /// whose stored file is `stored_file_bytes` long: a full stored block, except for
    /// the last block, which runs to the end of the stored file (at most a full
    /// block). Empty past the end of the file.
    ///
    /// In a consistent file the last block ends exactly at the end of the stored file.
    /// After an agent crash between a block write and the header write it can be
    /// longer than the header's size says; reading to the end of the stored file lets
    /// [`crate::FileCipher::read_block`] still open it (it tries the exact length
    /// first) and trim it.
    pub fn read_range(&self, index: u64, plaintext_bytes: u64, stored_file_bytes: u64) -> Range<u64> {
        let start = self.stored_offset(index);
        let count = self.block_count(plaintext_bytes);
        if index >= count {
            return start..start;
        }
        let full_end = start.saturating_add(self.stored_block_bytes() as u64);
        let end = if index + 1 == count { full_end.min(stored_file_bytes.max(start)) } else { full_end };
        start..end
    }

    /// Stored size of a file of `plaintext_bytes` (header included).
    pub fn stored_bytes(&self, plaintext_bytes: u64) -> u64 {
        let size = plaintext_bytes.min(MAX_PLAINTEXT_BYTES);
        let full = size / self.b();
        let rest = size % self.b();
        let last = if rest == 0 { 0 } else { rest + BLOCK_OVERHEAD_BYTES as u64 };
        HEADER_BYTES as u64 + full * self.stored_block_bytes() as u64 + last
    }

    /// The plaintext size a stored size implies, or `None` if no plaintext size
    /// gives that stored size (a torn or tampered file: shorter than the header, or a
    /// last block too short to hold nonce, tag and one byte).
    pub fn plaintext_bytes_for_stored(&self, stored_bytes: u64) -> Option<u64> {
        let body = stored_bytes.checked_sub(HEADER_BYTES as u64)?;
        let stored_block = self.stored_block_bytes() as u64;
        let rest = body % stored_block;
        let last = match rest {
            0 => 0,
            r if r > BLOCK_OVERHEAD_BYTES as u64 => r - BLOCK_OVERHEAD_BYTES as u64,
            _ => return None,
        };
        let size = (body / stored_block) * self.b() + last;
        (size <= MAX_PLAINTEXT_BYTES).then_some(size)
    }

    /// The blocks to seal for a write of `len` bytes at `offset` into a file of
    /// `old_plaintext_bytes`, in index order. A write past the end also re-seals the
    /// old last block (extended with zeros) and seals zero blocks for the gap: a block
    /// that was never sealed cannot be told from a zeroed-out one, so there are no
    /// holes. Each entry says whether the old block must be read first
    /// ([`BlockWrite::keep_bytes`]); [`crate::FileCipher::patch_block`] does the rest.
    pub fn write_plan(&self, offset: u64, len: u64, old_plaintext_bytes: u64) -> Result<WritePlan> {
        let old = Self::check("file size", old_plaintext_bytes)?;
        let end = Self::check("end of write", Self::check("offset", offset)?.saturating_add(len))?;
        if len == 0 {
            return Ok(WritePlan { layout: *self, old, new: old, write: offset..offset, next: 0, end: 0 });
        }
        let new = old.max(end);
        let first = offset.min(old) / self.b();
        Ok(WritePlan { layout: *self, old, new, write: offset..end, next: first, end: end.div_ceil(self.b()) })
    }

    /// The blocks to seal when a file of `old_plaintext_bytes` is resized to
    /// `new_plaintext_bytes`.
    ///
    /// Growing seals zeros up to the new size (the old last block extended, then zero
    /// blocks), like a write past the end: seal the blocks, then write the header.
    /// Shrinking re-seals at most the new last block, cut short: write the header
    /// first, then the block, then cut the stored file to [`Layout::stored_bytes`] of
    /// the new size. Every crash point in between leaves a file that reads back
    /// (see [`crate::FileCipher::read_block`]) and that [`Layout::repair_plan`] makes
    /// consistent again.
    pub fn resize_plan(&self, old_plaintext_bytes: u64, new_plaintext_bytes: u64) -> Result<WritePlan> {
        let old = Self::check("file size", old_plaintext_bytes)?;
        let new = Self::check("new file size", new_plaintext_bytes)?;
        let b = self.b();
        let (next, end) = if new > old {
            (old / b, new.div_ceil(b))
        } else if new < old && new % b != 0 {
            (new / b, new / b + 1)
        } else {
            (0, 0)
        };
        Ok(WritePlan { layout: *self, old, new, write: new..new, next, end })
    }

    /// What makes a file consistent again after an agent crash left its stored size
    /// different from [`Layout::stored_bytes`] of its (header) size: re-seal the last
    /// block at its exact length (when it is partial), then cut the stored file to
    /// [`Layout::stored_bytes`]. Empty when the file is consistent. Run it before the
    /// first write to a file opened for writing. (A stored file *shorter* than its
    /// size cannot be repaired: its reads report [`Error::Integrity`].)
    pub fn repair_plan(&self, plaintext_bytes: u64, stored_file_bytes: u64) -> Result<WritePlan> {
        let size = Self::check("file size", plaintext_bytes)?;
        let b = self.b();
        let (next, end) = if stored_file_bytes > self.stored_bytes(size) && size % b != 0 {
            (size / b, size / b + 1)
        } else {
            (0, 0)
        };
        Ok(WritePlan { layout: *self, old: size, new: size, write: size..size, next, end })
    }
}

/// What to seal for one block of a write or resize. To build the block: start from
/// `new_len` zero bytes; if `keep_bytes > 0`, open the old stored block and keep its
/// first `keep_bytes`; copy `data` of the caller's buffer to `write_at`; seal with a
/// fresh nonce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockWrite {
    /// The block.
    pub index: u64,
    /// Plaintext bytes of the block under the old size (what the old stored block
    /// holds in a consistent file).
    pub old_len: usize,
    /// Bytes of the old block's plaintext to keep (0: the old block need not be read).
    pub keep_bytes: usize,
    /// Offset inside the block where the written data goes.
    pub write_at: usize,
    /// The part of the caller's write buffer that lands in this block (empty for
    /// blocks that are only extended or zero-filled).
    pub data: Range<usize>,
    /// Plaintext bytes of the block after the write.
    pub new_len: usize,
}

impl BlockWrite {
    /// Whether the old block must be read (and opened) before it is re-sealed.
    pub fn needs_read(&self) -> bool {
        self.keep_bytes > 0
    }
}

/// The blocks of a write or resize, in index order (an iterator: a write far past
/// the end yields many zero blocks without allocating for them).
#[derive(Debug, Clone)]
pub struct WritePlan {
    layout: Layout,
    old: u64,
    new: u64,
    write: Range<u64>,
    next: u64,
    end: u64,
}

impl WritePlan {
    /// Plaintext size of the file once every block of the plan is sealed.
    pub fn new_plaintext_bytes(&self) -> u64 {
        self.new
    }
}

impl Iterator for WritePlan {
    type Item = BlockWrite;

    fn next(&mut self) -> Option<BlockWrite> {
        if self.next >= self.end {
            return None;
        }
        let index = self.next;
        self.next += 1;
        let layout = self.layout;
        let start = layout.block_offset(index);
        let old_len = layout.block_len(index, self.old);
        let new_len = layout.block_len(index, self.new);
        let block = start..start.saturating_add(layout.b());
        let overlaps = !self.write.is_empty() && self.write.start < block.end && self.write.end > block.start;
        let (write_at, data, covers_old) = if overlaps {
            let from = self.write.start.max(block.start);
            let to = self.write.end.min(block.end);
            let data = (from - self.write.start) as usize..(to - self.write.start) as usize;
            let (at, upto) = ((from - start) as usize, (to - start) as usize);
            (at, data, at == 0 && upto >= old_len.min(new_len))
        } else {
            (0, 0..0, false)
        };
        let keep_bytes = if covers_old { 0 } else { old_len.min(new_len) };
        Some(BlockWrite { index, old_len, keep_bytes, write_at, data, new_len })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.end.saturating_sub(self.next)).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = 4096;
    const S: u64 = B + 28;
    const H: u64 = HEADER_BYTES as u64;

    fn layout() -> Layout {
        Layout::new(B as u32).unwrap()
    }

    #[test]
    fn block_sizes_are_checked() {
        for ok in [4096, 65536, 1 << 20, 16 << 20] {
            assert_eq!(Layout::new(ok).unwrap().block_bytes(), ok);
        }
        for bad in [0, 1, 2048, 4095, 65535, 100_000, 32 << 20] {
            assert!(matches!(Layout::new(bad), Err(Error::InvalidBlockSize { .. })), "{bad}");
        }
    }

    #[test]
    fn ranges_map_to_blocks() {
        let l = layout();
        assert_eq!(l.blocks(0, 0).unwrap(), 0..0);
        assert_eq!(l.blocks(0, 1).unwrap(), 0..1);
        assert_eq!(l.blocks(0, B).unwrap(), 0..1);
        assert_eq!(l.blocks(B - 1, 2).unwrap(), 0..2);
        assert_eq!(l.blocks(3 * B, 16 * B).unwrap(), 3..19);
        assert_eq!(l.blocks(5, 10 * B).unwrap(), 0..11);
        assert!(matches!(l.blocks(MAX_PLAINTEXT_BYTES, 1), Err(Error::OutOfRange { .. })));
        assert!(matches!(l.blocks(u64::MAX, 0), Err(Error::OutOfRange { .. })));
        assert_eq!(l.block_count(0), 0);
        assert_eq!(l.block_count(B + 1), 2);
    }

    #[test]
    fn stored_offsets_and_sizes() {
        let l = layout();
        assert_eq!(l.stored_offset(0), H);
        assert_eq!(l.stored_offset(3), H + 3 * S);
        assert_eq!(l.stored_bytes(0), H);
        assert_eq!(l.stored_bytes(1), H + 29);
        assert_eq!(l.stored_bytes(B), H + S);
        assert_eq!(l.stored_bytes(2 * B + 10), H + 2 * S + 38);
        assert_eq!(l.block_len(2, 2 * B + 10), 10);
        assert_eq!(l.block_len(3, 2 * B + 10), 0);
        assert_eq!(l.stored_block_len(1, 2 * B + 10), S as usize);
        // The last block runs to the end of the stored file, at most a full block.
        let size = 2 * B + 10;
        let stored = l.stored_bytes(size);
        assert_eq!(l.read_range(1, size, stored), H + S..H + 2 * S);
        assert_eq!(l.read_range(2, size, stored), H + 2 * S..H + 2 * S + 38);
        assert_eq!(l.read_range(2, size, stored + 50), H + 2 * S..H + 2 * S + 88);
        assert_eq!(l.read_range(2, size, stored + S), H + 2 * S..H + 3 * S);
        assert_eq!(l.read_range(2, size, 0), H + 2 * S..H + 2 * S);
        assert_eq!(l.read_range(3, size, stored + S), H + 3 * S..H + 3 * S);

        for size in [0, 1, 27, 28, 29, B - 1, B, B + 1, 7 * B + 100, MAX_PLAINTEXT_BYTES] {
            assert_eq!(l.plaintext_bytes_for_stored(l.stored_bytes(size)), Some(size), "{size}");
        }
        for impossible in [0, H - 1, H + 1, H + 28, H + S + 28] {
            assert_eq!(l.plaintext_bytes_for_stored(impossible), None, "{impossible}");
        }
        assert_eq!(l.plaintext_bytes_for_stored(u64::MAX), None);
        // Extremes saturate instead of overflowing.
        assert!(l.stored_offset(u64::MAX) > l.stored_offset(l.max_block_index()));
        assert_eq!(l.block_len(u64::MAX, u64::MAX), 0);
    }

    fn plan(offset: u64, len: u64, old: u64) -> Vec<BlockWrite> {
        no_old(layout().write_plan(offset, len, old).unwrap())
    }

    /// A block write; `old_len` is checked separately where it matters.
    fn bw(index: u64, keep_bytes: usize, write_at: usize, data: Range<usize>, new_len: usize) -> BlockWrite {
        BlockWrite { index, old_len: 0, keep_bytes, write_at, data, new_len }
    }

    fn no_old(plan: WritePlan) -> Vec<BlockWrite> {
        plan.map(|w| BlockWrite { old_len: 0, ..w }).collect()
    }

    const BU: usize = B as usize;

    #[test]
    fn write_plans() {
        // Aligned full-block overwrite: nothing to read.
        assert_eq!(plan(B, B, 4 * B), [bw(1, 0, 0, 0..BU, BU)]);
        // Partial overwrite inside the file: read-modify-write.
        assert_eq!(plan(B + 10, 5, 4 * B), [bw(1, BU, 10, 0..5, BU)]);
        // Spanning two blocks: both partial.
        assert_eq!(plan(B - 3, 6, 4 * B), [bw(0, BU, BU - 3, 0..3, BU), bw(1, BU, 0, 3..6, BU)]);
        // Append to a partial last block: keep the old bytes, grow the block.
        assert_eq!(plan(100, 50, 100), [bw(0, 100, 100, 0..50, 150)]);
        // Overwrite from the block start past the old end: nothing to keep.
        assert_eq!(plan(0, 150, 100), [bw(0, 0, 0, 0..150, 150)]);
        // Write into an empty file at an offset: zeros before it, nothing to read.
        assert_eq!(plan(10, 5, 0), [bw(0, 0, 10, 0..5, 15)]);
        // Write past the end: extend the old last block, a zero block, then the data.
        assert_eq!(plan(2 * B + 1, 2, 100), [bw(0, 100, 0, 0..0, BU), bw(1, 0, 0, 0..0, BU), bw(2, 0, 1, 0..2, 3)]);
        // Writing exactly at the old end of a full block starts a new block.
        assert_eq!(plan(B, 1, B), [bw(1, 0, 0, 0..1, 1)]);
        assert!(plan(7, 0, 100).is_empty());
        let p = layout().write_plan(2 * B + 1, 2, 100).unwrap();
        assert_eq!((p.new_plaintext_bytes(), p.clone().count()), (2 * B + 3, 3));
        assert!(bw(0, 1, 0, 0..0, 1).needs_read() && !bw(0, 0, 0, 0..0, 1).needs_read());
    }

    #[test]
    fn resize_plans() {
        let l = layout();
        let resize = |old, new| no_old(l.resize_plan(old, new).unwrap());
        assert!(resize(3 * B, 2 * B).is_empty());
        assert_eq!(resize(3 * B, 2 * B + 7), [bw(2, 7, 0, 0..0, 7)]);
        assert_eq!(l.resize_plan(3 * B, 2 * B + 7).unwrap().next().unwrap().old_len, BU);
        assert_eq!(l.resize_plan(2 * B + 9, 2 * B + 7).unwrap().next().unwrap().old_len, 9);
        assert_eq!(l.resize_plan(3 * B, 7).unwrap().new_plaintext_bytes(), 7);
        assert_eq!(resize(10, 2 * B + 7), [bw(0, 10, 0, 0..0, BU), bw(1, 0, 0, 0..0, BU), bw(2, 0, 0, 0..0, 7)]);
        assert_eq!(resize(B, B + 1), [bw(1, 0, 0, 0..0, 1)]);
        assert!(resize(5, 5).is_empty());
        assert!(l.resize_plan(0, MAX_PLAINTEXT_BYTES + 1).is_err());
    }

    #[test]
    fn repair_plans() {
        let l = layout();
        let size = 2 * B + 7;
        let repair = |stored| no_old(l.repair_plan(size, stored).unwrap());
        assert!(repair(l.stored_bytes(size)).is_empty());
        assert!(repair(l.stored_bytes(size) - 1).is_empty(), "a short file cannot be repaired");
        assert_eq!(repair(l.stored_bytes(size) + 1), [bw(2, 7, 0, 0..0, 7)]);
        assert_eq!(l.repair_plan(size, l.stored_bytes(size) + 1).unwrap().next().unwrap().old_len, 7);
        assert!(l.repair_plan(2 * B, l.stored_bytes(2 * B) + S).unwrap().next().is_none());
    }
}
