//! Inline encryption core of `dpu-agent`: key sources, the envelope (a random data
//! key per file, wrapped by the tenant's key-encryption key), per-block AES-256-GCM
//! sealing, the file header, and the block layout arithmetic.
//!
//! The agent encrypts on the DPU, so neither the host nor the storage ever sees a key
//! or a plaintext byte at rest. This crate is the logic of that, with plain values in
//! and out.
//!
//! **What it deliberately does not do.** No I/O except reading key files (the engine
//! reads and writes stored blocks and headers through the backend); no clock except
//! in [`measure`]; no key caching policy, no KMS client (the [`KeySource`] trait is
//! where one goes); no home-made cryptography (AES-256-GCM comes from aws-lc-rs or
//! RustCrypto, behind [`CryptoProvider`]).
//!
//! # Keys and envelope
//!
//! Each tenant has key-encryption keys ([`Kek`]) by version, from a [`KeySource`]
//! ([`FileKeySource`] reads 0600 key files). Each file gets a random 256-bit data key
//! at create time, wrapped with AES-256-GCM under the tenant's current KEK, and stored
//! in the file header with the KEK version. The wrap's AAD binds tenant, container,
//! file id, the KEK version and the origin key version, so a header cannot be moved
//! to another tenant, container or file, nor relabelled with another version;
//! [`Error::WrongKey`] names tenant and version when it does not unwrap. Rotation
//! ([`FileHeader::rewrap`]) re-wraps the data key under a newer KEK without touching
//! data blocks.
//!
//! # On-disk format
//!
//! ```text
//! stored file = [header 256 B][block 0][block 1]...   (see `Layout`)
//! block i     = [nonce 12][AES-256-GCM ciphertext, same length as the plaintext][tag 16]
//! ```
//!
//! The header layout is documented on [`FileHeader`]'s module (magic `DPUIOENC`,
//! format version 1, block size, plaintext size, key versions, file id, wrapped key,
//! header tag; little-endian; a strict decoder). Overhead: 28 bytes per block
//! (0.043 % at 64 KiB, 0.68 % at 4 KiB, 0.0027 % at 1 MiB) plus the 256-byte header
//! per file. Every block but the last is full; plaintext offsets map to stored ones by
//! arithmetic alone ([`Layout`]).
//!
//! The header carries its own tag (AES-GCM with an empty plaintext, under the data
//! key, over every header byte before it). Without it the plaintext size would be
//! forgeable: storage could cut whole blocks off the end and shrink the size, and
//! the file would read back shorter without an error.
//!
//! # AAD and nonces
//!
//! Block AAD = `"dpuio/block/v1" || tenant || container || file id || origin key
//! version || block index` (names length-prefixed). So a block swapped with another
//! block of the same file, or moved from another file, container or tenant, fails to
//! open ([`Error::Integrity`]); and in any case each file has its own data key. The
//! key version bound into blocks is the *origin* version (the KEK version the data
//! key was made under), not the current wrapping version: rotation changes the
//! latter and must not invalidate blocks.
//!
//! Nonces are 96 random bits from the provider's secure generator (AWS-LC's
//! fork-safe DRBG, or `getrandom`) for every seal, including every rewrite of a
//! block. Nothing is counted on disk, so a crash cannot roll a counter back into
//! reuse. Bound: NIST SP 800-38D §8.3 allows at most 2^32 seals per key with random
//! IVs (collision probability below 2^-32). Keys here are per file, so the bound is
//! per file: 2^32 block seals and header updates over the file's life, 256 TiB of
//! writes at 64 KiB blocks. [`FileCipher`] refuses to seal past 2^32 in one process
//! ([`Error::NonceBudgetExhausted`]); a file that could ever approach the bound across
//! restarts must be copied to a fresh data key first. A KEK seals once per file
//! created or re-wrapped: rotate it long before 2^32 of those.
//!
//! # Default block size: 64 KiB ([`DEFAULT_BLOCK_BYTES`])
//!
//! - 1 MiB training reads: 16 blocks (17 when unaligned), opened one after another
//!   while the previous one is being put to the host; each 64 KiB block stays in the
//!   core's L2 between decryption and RMA, which a 1 MiB block would not.
//! - 4 KiB random reads: a read opens the whole block, so 64 KiB blocks read and
//!   decrypt 16x the bytes asked for (1 MiB blocks: 256x). Tenants whose load is small
//!   random reads set 4 KiB or 16 KiB blocks per tenant; files smaller than a block
//!   are one short block anyway.
//! - Per-block overhead: 28 stored bytes (0.043 %) and a fixed CPU cost per seal or
//!   open (a nonce from the generator, AAD, GHASH finalisation, call overhead) of a
//!   fraction of a microsecond: around 1 % of a 64 KiB block's time, a large part of a
//!   4 KiB block's.
//! - Writes smaller than a block are read-modify-write of the block
//!   ([`Layout::write_plan`], [`FileCipher::patch_block`]); checkpoints write large
//!   sequential ranges, which are whole blocks.
//!
//! # Rules for the engine
//!
//! - Open: read the first [`HEADER_BYTES`], [`FileHeader::decode`], fetch the KEK of
//!   [`FileHeader::key_version`], [`FileCipher::open`] (which authenticates the header).
//! - Read: for each block of [`Layout::blocks`], read [`Layout::read_range`] (the
//!   last block runs to the end of the stored file) and [`FileCipher::read_block`],
//!   which opens, trims to the file size and reports a truncated block as an
//!   integrity error.
//! - Before the first write to a file: if the stored size is not
//!   [`Layout::stored_bytes`] of its size (an agent crash mid-write), apply
//!   [`Layout::repair_plan`] and cut the stored file to that size.
//! - Write or grow: for each [`BlockWrite`] of [`Layout::write_plan`] (or
//!   [`Layout::resize_plan`]) read the old block if it [`BlockWrite::needs_read`],
//!   [`FileCipher::patch_block`], write the block; then
//!   [`FileCipher::set_plaintext_bytes`] and write the header. Blocks first, header
//!   last: a crash in between leaves the old size, and readers trim to it.
//! - Shrink: header first, then the one block of [`Layout::resize_plan`], then cut
//!   the stored file to [`Layout::stored_bytes`].
//! - The orders above protect against an agent crash. Against power loss, data not
//!   yet synced is lost anyway; the engine can keep the size in memory and write the
//!   header at `Sync`/`Close` (and around truncation), with a sync between blocks and
//!   header. Whatever is lost or torn reads back as an integrity error, never as
//!   wrong data (a backend that writes a block atomically, as a DAOS update does,
//!   never tears one).
//! - Never serve plaintext of a block whose open failed ([`Error::is_integrity`]).
//!
//! What authentication cannot catch, by construction: storage replaying an *older*
//! valid version of a block or of the whole file (no trusted counter exists outside
//! storage), and a whole file replaced by another whole file of the same tenant and
//! container.
//!
//! # Example
//!
//! ```
//! use dpuio_crypto::{AWS_LC_RS, FileCipher, FileContext, FileHeader, Kek, DEFAULT_BLOCK_BYTES};
//!
//! let ctx = FileContext::new("vision", "vision")?;
//! let kek = Kek::generate(&AWS_LC_RS, "vision", 1)?; // normally from a KeySource
//! let (cipher, mut header) = FileCipher::create(&AWS_LC_RS, &ctx, &kek, DEFAULT_BLOCK_BYTES)?;
//!
//! let mut stored = vec![0u8; cipher.layout().stored_block_bytes()];
//! let n = cipher.seal_block(0, b"hello", &mut stored)?;
//! cipher.set_plaintext_bytes(&mut header, 5)?;
//! let on_disk = header.encode();
//!
//! let header = FileHeader::decode(&on_disk)?;
//! let cipher = FileCipher::open(&AWS_LC_RS, &ctx, &header, &kek)?;
//! let mut plaintext = [0u8; 5];
//! assert_eq!(cipher.open_block(0, &stored[..n], &mut plaintext)?, 5);
//! assert_eq!(&plaintext, b"hello");
//! # Ok::<(), dpuio_crypto::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod bench;
mod cipher;
mod error;
mod header;
mod keys;
mod layout;
mod provider;

#[cfg(test)]
mod cipher_tests;
#[cfg(test)]
mod vectors;

pub use bench::{Op, Throughput, measure};
pub use cipher::{FileCipher, FileContext, MAX_NAME_BYTES, MAX_SEALS_PER_KEY};
pub use error::{Error, Result};
pub use header::{FILE_ID_BYTES, FORMAT_VERSION, FileHeader, FileId, MAGIC, WrappedKey};
pub use keys::{DataKey, FileKeySource, Kek, KeySource, RotatingKeySource};
pub use layout::{
    BLOCK_OVERHEAD_BYTES, BlockWrite, DEFAULT_BLOCK_BYTES, HEADER_BYTES, Layout, MAX_BLOCK_BYTES, MAX_PLAINTEXT_BYTES,
    MIN_BLOCK_BYTES, WritePlan,
};
pub use provider::{
    AWS_LC_RS, Aes256GcmKey, AwsLcRs, CryptoProvider, KEY_BYTES, NONCE_BYTES, Nonce, PROVIDER_NAMES, RUST_CRYPTO,
    RustCrypto, TAG_BYTES, Tag, TagMismatch, default_provider, provider_by_name,
};
