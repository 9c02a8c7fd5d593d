//! The file header: fixed size, versioned, little-endian, at offset 0 of every stored
//! file.
//!
//! ```text
//! offset size field
//!      0    8 magic "DPUIOENC"
//!      8    2 format version (1)
//!     10    2 header size in bytes (256)
//!     12    4 block size in bytes (power of two, 4 KiB to 16 MiB)
//!     16    8 plaintext size in bytes (at most 2^62)
//!     24    4 key version: the KEK version that wraps the data key now
//!     28    4 origin key version: the KEK version the data key was made under
//!     32   16 file id (random, made at create)
//!     48   12 wrap nonce          \
//!     60   32 wrapped data key     } AES-256-GCM under the tenant's KEK
//!     92   16 wrap tag            /
//!    108  120 reserved, zero
//!    228   12 header nonce        \ AES-256-GCM tag, under the file's data key,
//!    240   16 header tag          / over bytes 0..228 (empty plaintext)
//! ```
//!
//! [`FileHeader::decode`] is strict: exact length, magic, version, header size,
//! block size, plaintext size bound, zero reserved bytes. It needs no key, so `stat`
//! can show the plaintext size; that size is *unauthenticated* until
//! [`crate::FileCipher::open`] has checked the header tag.

use std::fmt;

use crate::error::{Error, Result};
use crate::layout::{HEADER_BYTES, Layout, MAX_PLAINTEXT_BYTES};
use crate::provider::{KEY_BYTES, NONCE_BYTES, Nonce, TAG_BYTES, Tag};

/// The first eight bytes of every encrypted file.
pub const MAGIC: [u8; 8] = *b"DPUIOENC";
/// The header format version this build reads and writes.
pub const FORMAT_VERSION: u16 = 1;
/// Bytes of a file id.
pub const FILE_ID_BYTES: usize = 16;

const WRAP_AT: usize = 48;
const RESERVED_AT: usize = WRAP_AT + WrappedKey::BYTES;
/// Bytes covered by the header tag: everything before the header nonce.
pub(crate) const HEADER_TAG_COVERS: usize = HEADER_BYTES - NONCE_BYTES - TAG_BYTES;

/// A random 128-bit file id, made when the file is created and bound into the AAD of
/// the wrapped key and of every block. Kept in the header rather than taken from the
/// backend (an inode or DAOS object id) so that copying or restoring a file, which
/// changes those, keeps it readable.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId(pub [u8; FILE_ID_BYTES]);

impl fmt::Display for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for FileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileId({self})")
    }
}

/// A data key wrapped (AES-256-GCM) under a key-encryption key: nonce, 32 bytes of
/// ciphertext, tag. Ciphertext, so `Debug` and `Clone` are harmless.
#[derive(Clone, PartialEq, Eq)]
pub struct WrappedKey {
    pub(crate) nonce: Nonce,
    pub(crate) ciphertext: [u8; KEY_BYTES],
    pub(crate) tag: Tag,
}

impl WrappedKey {
    /// Encoded size.
    pub const BYTES: usize = NONCE_BYTES + KEY_BYTES + TAG_BYTES;

    fn encode_into(&self, out: &mut [u8]) {
        out[..NONCE_BYTES].copy_from_slice(&self.nonce);
        out[NONCE_BYTES..NONCE_BYTES + KEY_BYTES].copy_from_slice(&self.ciphertext);
        out[NONCE_BYTES + KEY_BYTES..Self::BYTES].copy_from_slice(&self.tag);
    }

    fn decode(bytes: &[u8]) -> Self {
        let mut key = Self { nonce: [0; NONCE_BYTES], ciphertext: [0; KEY_BYTES], tag: [0; TAG_BYTES] };
        key.nonce.copy_from_slice(&bytes[..NONCE_BYTES]);
        key.ciphertext.copy_from_slice(&bytes[NONCE_BYTES..NONCE_BYTES + KEY_BYTES]);
        key.tag.copy_from_slice(&bytes[NONCE_BYTES + KEY_BYTES..Self::BYTES]);
        key
    }
}

impl fmt::Debug for WrappedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WrappedKey(..)")
    }
}

/// A decoded file header. Made by [`crate::FileCipher::create`] or
/// [`FileHeader::decode`]; changed only through [`crate::FileCipher`] (size) and
/// [`FileHeader::rewrap`] (key rotation), which keep its tag right.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHeader {
    pub(crate) layout: Layout,
    pub(crate) plaintext_bytes: u64,
    pub(crate) key_version: u32,
    pub(crate) origin_key_version: u32,
    pub(crate) file_id: FileId,
    pub(crate) wrapped_key: WrappedKey,
    pub(crate) header_nonce: Nonce,
    pub(crate) header_tag: Tag,
}

impl FileHeader {
    /// Block geometry of the file.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Encryption block size of the file.
    pub fn block_bytes(&self) -> u32 {
        self.layout.block_bytes()
    }

    /// Plaintext size. Unauthenticated on a header fresh from [`FileHeader::decode`]
    /// (fine for `stat`); authenticated once [`crate::FileCipher::open`] accepted the
    /// header.
    pub fn plaintext_bytes(&self) -> u64 {
        self.plaintext_bytes
    }

    /// Version of the tenant's key-encryption key that wraps the data key: fetch
    /// that version from the key source to open the file.
    pub fn key_version(&self) -> u32 {
        self.key_version
    }

    /// Version of the key-encryption key the data key was first wrapped under. Bound
    /// into every block's AAD; rotation does not change it, so blocks stay valid.
    pub fn origin_key_version(&self) -> u32 {
        self.origin_key_version
    }

    /// The file's id.
    pub fn file_id(&self) -> FileId {
        self.file_id
    }

    /// The wrapped data key.
    pub fn wrapped_key(&self) -> &WrappedKey {
        &self.wrapped_key
    }

    /// Encode, little-endian, [`HEADER_BYTES`] long.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        self.encode_covered(&mut out);
        out[HEADER_TAG_COVERS..HEADER_TAG_COVERS + NONCE_BYTES].copy_from_slice(&self.header_nonce);
        out[HEADER_TAG_COVERS + NONCE_BYTES..].copy_from_slice(&self.header_tag);
        out
    }

    /// The bytes the header tag covers (everything but nonce and tag).
    pub(crate) fn encode_covered(&self, out: &mut [u8; HEADER_BYTES]) {
        out[0..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[10..12].copy_from_slice(&(HEADER_BYTES as u16).to_le_bytes());
        out[12..16].copy_from_slice(&self.layout.block_bytes().to_le_bytes());
        out[16..24].copy_from_slice(&self.plaintext_bytes.to_le_bytes());
        out[24..28].copy_from_slice(&self.key_version.to_le_bytes());
        out[28..32].copy_from_slice(&self.origin_key_version.to_le_bytes());
        out[32..48].copy_from_slice(&self.file_id.0);
        self.wrapped_key.encode_into(&mut out[WRAP_AT..RESERVED_AT]);
        out[RESERVED_AT..HEADER_TAG_COVERS].fill(0);
    }

    /// Decode a header, rejecting anything malformed. `bytes` must be exactly
    /// [`HEADER_BYTES`] long (read the first `HEADER_BYTES` of the stored file; a
    /// shorter file is truncated). Never panics, whatever the input.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let malformed = |reason| Err(Error::MalformedHeader { reason });
        let Ok(bytes) = <&[u8; HEADER_BYTES]>::try_from(bytes) else {
            return malformed(if bytes.len() < HEADER_BYTES {
                "shorter than a header (truncated file?)"
            } else {
                "longer than a header"
            });
        };
        let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        let u32_at = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let u64_at = |at: usize| (u64::from(u32_at(at + 4)) << 32) | u64::from(u32_at(at));
        if bytes[0..8] != MAGIC {
            return malformed("bad magic: not a dpuio encrypted file");
        }
        let version = u16_at(8);
        if version != FORMAT_VERSION {
            return Err(Error::UnsupportedVersion { version, supported: FORMAT_VERSION });
        }
        if usize::from(u16_at(10)) != HEADER_BYTES {
            return malformed("header size field is not 256");
        }
        let Ok(layout) = Layout::new(u32_at(12)) else {
            return malformed("block size is not a power of two from 4 KiB to 16 MiB");
        };
        let plaintext_bytes = u64_at(16);
        if plaintext_bytes > MAX_PLAINTEXT_BYTES {
            return malformed("plaintext size is past the largest file");
        }
        if bytes[RESERVED_AT..HEADER_TAG_COVERS].iter().any(|&b| b != 0) {
            return malformed("reserved bytes are not zero");
        }
        let mut file_id = [0u8; FILE_ID_BYTES];
        file_id.copy_from_slice(&bytes[32..48]);
        let mut header_nonce = [0u8; NONCE_BYTES];
        header_nonce.copy_from_slice(&bytes[HEADER_TAG_COVERS..HEADER_TAG_COVERS + NONCE_BYTES]);
        let mut header_tag = [0u8; TAG_BYTES];
        header_tag.copy_from_slice(&bytes[HEADER_TAG_COVERS + NONCE_BYTES..]);
        Ok(Self {
            layout,
            plaintext_bytes,
            key_version: u32_at(24),
            origin_key_version: u32_at(28),
            file_id: FileId(file_id),
            wrapped_key: WrappedKey::decode(&bytes[WRAP_AT..RESERVED_AT]),
            header_nonce,
            header_tag,
        })
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, RngCore, SeedableRng};

    use super::*;

    fn sample() -> FileHeader {
        FileHeader {
            layout: Layout::new(65536).unwrap(),
            plaintext_bytes: 0x0102_0304_0506,
            key_version: 7,
            origin_key_version: 3,
            file_id: FileId([0x11; 16]),
            wrapped_key: WrappedKey { nonce: [0x22; 12], ciphertext: [0x33; 32], tag: [0x44; 16] },
            header_nonce: [0x55; 12],
            header_tag: [0x66; 16],
        }
    }

    #[test]
    fn layout_is_as_documented() {
        let bytes = sample().encode();
        assert_eq!(&bytes[0..8], b"DPUIOENC");
        assert_eq!(bytes[8..12], [1, 0, 0, 1]);
        assert_eq!(bytes[12..16], 65536u32.to_le_bytes());
        assert_eq!(bytes[16..24], [6, 5, 4, 3, 2, 1, 0, 0]);
        assert_eq!(bytes[24..32], [7, 0, 0, 0, 3, 0, 0, 0]);
        assert_eq!(bytes[32..48], [0x11; 16]);
        assert_eq!(bytes[48..60], [0x22; 12]);
        assert_eq!(bytes[60..92], [0x33; 32]);
        assert_eq!(bytes[92..108], [0x44; 16]);
        assert!(bytes[108..228].iter().all(|&b| b == 0));
        assert_eq!(bytes[228..240], [0x55; 12]);
        assert_eq!(bytes[240..256], [0x66; 16]);
        assert_eq!(FileHeader::decode(&bytes).unwrap(), sample());
        assert_eq!(sample().file_id.to_string(), "11".repeat(16));
    }

    #[test]
    fn decoder_rejects_malformed_headers() {
        let good = sample().encode();
        for len in [0, 1, 8, 100, HEADER_BYTES - 1, HEADER_BYTES + 1, 4096] {
            let mut bytes = good.to_vec();
            bytes.resize(len, 0);
            assert!(matches!(FileHeader::decode(&bytes), Err(Error::MalformedHeader { .. })), "length {len}");
        }
        let mutate = |at: usize, value: u8| {
            let mut bytes = good;
            bytes[at] = value;
            FileHeader::decode(&bytes)
        };
        assert!(matches!(mutate(0, b'X'), Err(Error::MalformedHeader { reason }) if reason.contains("magic")));
        assert!(matches!(mutate(8, 2), Err(Error::UnsupportedVersion { version: 2, supported: 1 })));
        assert!(matches!(mutate(9, 1), Err(Error::UnsupportedVersion { .. })));
        assert!(matches!(mutate(10, 1), Err(Error::MalformedHeader { .. })));
        assert!(matches!(mutate(11, 0), Err(Error::MalformedHeader { .. })));
        assert!(matches!(mutate(12, 1), Err(Error::MalformedHeader { reason }) if reason.contains("block size")));
        assert!(matches!(mutate(23, 0x40), Err(Error::MalformedHeader { reason }) if reason.contains("plaintext")));
        for at in 108..228 {
            assert!(matches!(mutate(at, 1), Err(Error::MalformedHeader { reason }) if reason.contains("reserved")));
        }
        // Block sizes at and past the limits.
        for (size, ok) in [(4096u32, true), (16 << 20, true), (2048, false), (32 << 20, false), (0, false)] {
            let mut bytes = good;
            bytes[12..16].copy_from_slice(&size.to_le_bytes());
            assert_eq!(FileHeader::decode(&bytes).is_ok(), ok, "{size}");
        }
    }

    /// Decoder of untrusted bytes: random inputs (and random single-byte changes of a
    /// good header) never panic, and whatever decodes re-encodes to the same bytes.
    #[test]
    fn random_bytes_never_panic() {
        let mut rng = StdRng::seed_from_u64(0x5eed_0002);
        let good = sample().encode();
        let mut buf = [0u8; HEADER_BYTES + 8];
        for i in 0..100_000 {
            let input: &[u8] = if i % 2 == 0 {
                let len = if i % 4 == 0 { HEADER_BYTES } else { rng.random_range(0..buf.len()) };
                rng.fill_bytes(&mut buf[..len]);
                &buf[..len]
            } else {
                buf[..HEADER_BYTES].copy_from_slice(&good);
                for _ in 0..rng.random_range(1..4) {
                    buf[rng.random_range(0..HEADER_BYTES)] = rng.random();
                }
                &buf[..HEADER_BYTES]
            };
            if let Ok(header) = FileHeader::decode(input) {
                assert_eq!(&header.encode()[..], input);
            }
        }
    }
}
