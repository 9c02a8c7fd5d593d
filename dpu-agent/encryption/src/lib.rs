//! Inline encryption of `dpu-agent` as a wrapper over any backend:
//! [`EncryptedContainer`] and [`EncryptedObject`] implement the backend traits
//! ([`dpuio_backend`]) over another container, so the engine, the data plane and the
//! control plane stay as they are, and only ciphertext reaches the storage. The
//! cryptography (envelope, block sealing, header, layout arithmetic, write plans) is
//! `dpuio_crypto`, with plain values in and out; this crate is its I/O adapter, and
//! sits beside the backends it wraps, outside the agent binary.
//!
//! # What is stored
//!
//! Each file is `dpuio_crypto`'s header (256 bytes) followed by sealed blocks
//! (`[nonce 12][ciphertext][tag 16]` per block of the tenant's `block_bytes`): 28 bytes
//! per block (0.043 % at the default 64 KiB) plus 256 bytes per file. A new file gets
//! a fresh random data key, wrapped by the tenant's current key-encryption key (KEK).
//! Sizes seen through the wrapper (`stat`, `readdir`, [`Object::stat`], short reads)
//! are plaintext sizes.
//!
//! # Files that are not encrypted
//!
//! Turning encryption on applies to new files. A file is encrypted when it starts with
//! the header magic; one that does not (written before encryption was turned on) is a
//! *plaintext file*: with [`PlaintextFiles::ReadOnly`] (the default) it reads back as it
//! is, stored bytes unchanged, but cannot be opened for writing (new bytes would land in
//! the clear); creating it again (create or open with truncate, or truncating it to
//! size 0) replaces it with an empty encrypted file. A tenant that had encryption from
//! its first file should set [`PlaintextFiles::Refuse`]: then a non-empty file without
//! a header is an integrity error, and storage cannot pass ciphertext off as a
//! plaintext file by erasing a header. Even under `ReadOnly`, a file whose first 12
//! bytes are within a few bytes of a header's (magic, format version, header size) is
//! taken for a damaged header, so a header with a flipped byte is an integrity error
//! and never read as plaintext.
//!
//! An empty stored file (0 bytes: created by a read-only open, or cut by a crash
//! between creation and the header write) is an empty *encrypted* file: the first
//! writable open writes its header, under the tenant's current key.
//!
//! # Concurrency
//!
//! All opens of one file through one [`EncryptedContainer`] share one state (found by
//! the backend's object id): the header in memory, the data key, and the locks.
//!
//! - A *meta* lock (reader-writer) over the header: reads and overwrites inside the
//!   file hold it shared; anything that changes the size (extending writes, truncate)
//!   or the header (creation, repair, rotation) holds it exclusively.
//! - 64 striped block locks (block index mod 64): a read holds the stripes of the
//!   blocks it reads shared, an overwrite holds them exclusively while it reads, patches
//!   and rewrites its blocks. So concurrent writers to one block are serialised (a
//!   read-modify-write never loses another's bytes), a reader never sees a block
//!   mid-rewrite (and so never an integrity error from a torn concurrent rewrite),
//!   and pieces of one request on different blocks run in parallel. Locks are always
//!   taken meta first, then stripes in ascending order, and released per group of
//!   blocks: no deadlock.
//! - An extending write seals the blocks its own data fully determines *before* it
//!   takes the exclusive lock (against the size it saw), and under the lock reuses
//!   each such block whose write plan did not change; only the old last block, zero
//!   blocks for a gap, and the header write happen under the lock. Parallel pieces of
//!   a sequential write to a new file thus seal in parallel.
//!
//! Another process (or another `EncryptedContainer` on the same container) does not
//! share these locks; as the `local` backend says, one agent owns a root.
//!
//! # Crash order (`dpuio_crypto`'s "Rules for the engine")
//!
//! - Write or grow: sealed blocks first, the header with the new size last; a crash
//!   in between leaves the old size, and readers trim to it (a last block re-sealed
//!   longer still opens and is trimmed).
//! - Shrink: the header first, then the re-sealed new last block, then the stored
//!   file is cut.
//! - The first write or truncate through a state loaded from storage first applies
//!   the repair plan (a stored file longer than its header says is cut back).
//! - Overwrites inside the file replace whole sealed blocks with fresh nonces; a
//!   write torn by a crash (a `kill -9` can stop a large `pwrite` between pages) fails
//!   its tag and reads as an integrity error, never as wrong data.
//! - The header is written at every size change (not deferred to `sync`): 256 bytes
//!   at offset 0, within one page. After a power loss without `sync`, what was lost
//!   reads back as an integrity error (`dpuio_crypto`'s rule), never as wrong data.
//!
//! # Errors
//!
//! A block that fails to open is [`Error::Integrity`] with its index (the data plane
//! completes with `Status::Integrity`, gRPC with `DATA_LOSS`); no plaintext of it is
//! released, other blocks still read. Every block is decrypted into a per-thread
//! scratch block and copied into the caller's buffer only after its tag checked:
//! that buffer may be the host's region (the data plane's mapped path), and AES-GCM
//! libraries decrypt before they compare the tag, so decrypting in place would show
//! the host a failing block's plaintext for an instant. What the copy costs is in
//! docs/encryption.md ("Verify, then release"). A header that fails (altered, malformed, or a
//! wrong key of its version, which look the same) is [`Error::Integrity`] without a
//! block index, when the file is opened. A key version the key source lacks is
//! [`Error::Key`] (`FAILED_PRECONDITION`), naming tenant and version.
//!
//! # Rotation
//!
//! [`EncryptedContainer::rotate`] re-wraps every file's data key from one KEK version
//! to another through the shared per-file state (so open files take part), after
//! making the new version current for new files; [`rotate`] does the same on a raw
//! container that no agent is serving. Data blocks are not touched. [`key_status`]
//! counts files per key version: a version no file (and no unreadable file) uses can
//! be retired. [`EncryptedContainer::rotate_to_key_file`] is what the agent runs: it
//! adds a key file to the key source as the next version and rotates to it, one
//! rotation at a time per container. The agent reaches the running container through
//! its settings ([`EncryptionSettings::running_container`]). A file created or
//! re-created during a rotation is wrapped under the version current when it takes
//! its lock, so the walk cannot miss it.
//!
//! Deliberately not here: key sources and key caching (`dpuio_crypto`'s [`KeySource`]),
//! directory or file-name encryption (names stay in the clear), and protection
//! against storage replaying an older valid version of a block or file (no trusted
//! counter exists outside storage; see `dpuio_crypto`'s docs).
//!
//! # Rooms
//!
//! Bottom up, each importing from the rooms below it: `error` (`dpuio_crypto` errors
//! mapped to backend errors, in one place); `settings` ([`EncryptionSettings`],
//! [`PlaintextFiles`], and what every file of a container shares); `object`
//! ([`EncryptedObject`], the state every open of a file shares, and the block read and
//! write paths); `container` ([`EncryptedContainer`]: the wrapping backend and its
//! registry of open files); `rotation` (re-wrapping, [`key_status`]). Whoever holds the
//! settings reaches the container made from them through the settings' list of running
//! containers, which holds them as opaque weak handles so that no name points up. The
//! unit tests are in `tests`.
//!
//! [`Object::stat`]: dpuio_backend::Object::stat
//! [`Error::Integrity`]: dpuio_backend::Error::Integrity
//! [`Error::Key`]: dpuio_backend::Error::Key
//! [`KeySource`]: dpuio_crypto::KeySource
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod container;
mod error;
mod object;
mod rotation;
mod settings;

#[cfg(test)]
mod tests;

pub use container::EncryptedContainer;
pub use object::{EncryptedObject, MAX_ZERO_FILL_BYTES};
pub use rotation::{KeyChange, KeyStatus, MAX_REPORTED_FAILURES, RotateError, RotationReport, key_status, rotate};
pub use settings::{EncryptionSettings, PlaintextFiles};
