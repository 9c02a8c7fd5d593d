//! The envelope (data key wrapped by the tenant's KEK), the header tag, and per-block
//! sealing: [`FileCipher`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use zeroize::Zeroize;

use crate::error::{Error, Result};
use crate::header::{FILE_ID_BYTES, FileHeader, FileId, HEADER_TAG_COVERS, WrappedKey};
use crate::keys::{DataKey, Kek, Secret};
use crate::layout::{BLOCK_OVERHEAD_BYTES, BlockWrite, HEADER_BYTES, Layout};
use crate::provider::{Aes256GcmKey, CryptoProvider, KEY_BYTES, NONCE_BYTES, Nonce, TAG_BYTES};

/// Longest tenant or container name bound into the AAD.
pub const MAX_NAME_BYTES: usize = 255;

/// Seals one data key may make with random nonces: NIST SP 800-38D §8.3 caps the
/// invocations of the authenticated encryption function with random 96-bit IVs at
/// 2^32 per key, which keeps the chance of any nonce repeating below 2^-32.
pub const MAX_SEALS_PER_KEY: u64 = 1 << 32;

// AAD domain labels: a block, a wrapped key and a header tag can never be taken for
// one another, even under the same key. Same length, so the layout after them is
// fixed.
const BLOCK_LABEL: &[u8; 16] = b"dpuio/block/v1\0\0";
const WRAP_LABEL: &[u8; 16] = b"dpuio/dkwrap/v1\0";
const HEADER_LABEL: &[u8; 16] = b"dpuio/header/v1\0";

/// Where a file lives: the tenant and container names bound into every AAD.
///
/// Bound by name, so renaming a tenant or container makes its files unreadable
/// unless they are copied (re-encrypted) under the new name: give both stable names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileContext {
    tenant: String,
    container: String,
}

impl FileContext {
    /// A context; both names must be 1 to [`MAX_NAME_BYTES`] bytes.
    pub fn new(tenant: &str, container: &str) -> Result<Self> {
        for (what, name) in [("tenant", tenant), ("container", container)] {
            if name.is_empty() {
                return Err(Error::InvalidName { what, reason: "empty" });
            }
            if name.len() > MAX_NAME_BYTES {
                return Err(Error::InvalidName { what, reason: "longer than 255 bytes" });
            }
        }
        Ok(Self { tenant: tenant.to_owned(), container: container.to_owned() })
    }

    /// The tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The container.
    pub fn container(&self) -> &str {
        &self.container
    }

    /// `label || len(tenant) || tenant || len(container) || container || file id`;
    /// one-byte lengths make the encoding unambiguous.
    fn aad_prefix(&self, label: &[u8; 16], file_id: &FileId) -> Vec<u8> {
        let mut aad = Vec::with_capacity(MAX_AAD_BYTES);
        aad.extend_from_slice(label);
        for name in [&self.tenant, &self.container] {
            aad.push(name.len() as u8); // at most MAX_NAME_BYTES, checked in new()
            aad.extend_from_slice(name.as_bytes());
        }
        aad.extend_from_slice(&file_id.0);
        aad
    }
}

/// Longest AAD this crate builds (labels, two names, file id, versions, index).
const MAX_AAD_BYTES: usize = 16 + 2 * (1 + MAX_NAME_BYTES) + FILE_ID_BYTES + 4 + 8;

fn wrap_aad(ctx: &FileContext, file_id: &FileId, key_version: u32, origin_key_version: u32) -> Vec<u8> {
    let mut aad = ctx.aad_prefix(WRAP_LABEL, file_id);
    aad.extend_from_slice(&key_version.to_le_bytes());
    aad.extend_from_slice(&origin_key_version.to_le_bytes());
    aad
}

fn check_kek(ctx: &FileContext, kek: &Kek, key_version: u32) -> Result<()> {
    if kek.tenant() != ctx.tenant() || kek.version() != key_version {
        return Err(Error::KeyMismatch {
            expected_tenant: ctx.tenant().to_owned(),
            expected_version: key_version,
            got_tenant: kek.tenant().to_owned(),
            got_version: kek.version(),
        });
    }
    Ok(())
}

/// Wrap `data_key` under `kek` (AES-256-GCM, random nonce, AAD binding tenant,
/// container, file id and both key versions).
///
/// A KEK seals once per file created and once per re-wrap, with a random nonce: keep
/// that below 2^32 per KEK version (rotate long before).
fn wrap(
    provider: &dyn CryptoProvider,
    ctx: &FileContext,
    kek: &Kek,
    data_key: &DataKey,
    file_id: &FileId,
    origin_key_version: u32,
) -> Result<WrappedKey> {
    let aead = provider.aes_256_gcm(kek.secret().bytes())?;
    let mut nonce = [0u8; NONCE_BYTES];
    provider.fill_random(&mut nonce)?;
    let mut ciphertext = [0u8; KEY_BYTES];
    let tag = aead.seal(
        &nonce,
        &wrap_aad(ctx, file_id, kek.version(), origin_key_version),
        data_key.secret().bytes(),
        &mut ciphertext,
    )?;
    Ok(WrappedKey { nonce, ciphertext, tag })
}

/// Unwrap the header's data key with `kek`, which must be the tenant's key of the
/// header's key version.
pub(crate) fn unwrap(
    provider: &dyn CryptoProvider,
    ctx: &FileContext,
    kek: &Kek,
    header: &FileHeader,
) -> Result<DataKey> {
    check_kek(ctx, kek, header.key_version)?;
    let aead = provider.aes_256_gcm(kek.secret().bytes())?;
    let w = &header.wrapped_key;
    let aad = wrap_aad(ctx, &header.file_id, header.key_version, header.origin_key_version);
    let mut secret = Secret::zeroed();
    aead.open(&w.nonce, &aad, &w.ciphertext, &w.tag, secret.bytes_mut())
        .map_err(|_| Error::WrongKey { tenant: ctx.tenant().to_owned(), key_version: header.key_version })?;
    Ok(DataKey::from_secret(secret))
}

impl FileHeader {
    /// Key rotation: re-wrap the data key from `old_kek` (the header's key version)
    /// to `new_kek`, of the same tenant. Data blocks are untouched and stay readable:
    /// they are bound to the origin key version, which does not change. Afterwards
    /// `old_kek` no longer opens this header. Write the header back with
    /// [`FileHeader::encode`].
    pub fn rewrap(
        &mut self,
        provider: &'static dyn CryptoProvider,
        ctx: &FileContext,
        old_kek: &Kek,
        new_kek: &Kek,
    ) -> Result<()> {
        let data_key = unwrap(provider, ctx, old_kek, self)?;
        // The header tag must verify before we re-tag it, or a tampered size would
        // be laundered into a valid header.
        let cipher = FileCipher::from_parts(provider, ctx, &data_key, self)?;
        cipher.verify_header(self)?;
        check_kek(ctx, new_kek, new_kek.version())?;
        let mut rewrapped = self.clone();
        rewrapped.wrapped_key = wrap(provider, ctx, new_kek, &data_key, &self.file_id, self.origin_key_version)?;
        rewrapped.key_version = new_kek.version();
        cipher.seal_header(&mut rewrapped)?;
        *self = rewrapped;
        Ok(())
    }
}

/// The encryption state of one open file: its prepared data key, its context and
/// geometry. Cheap to share across threads (`Send + Sync`): blocks of one file can be
/// sealed and opened in parallel.
///
/// Every block is sealed with a fresh random 96-bit nonce from the provider, so a
/// (key, nonce) pair never repeats: not on rewrites of the same block, not after a
/// crash (there is no counter to lose). This instance refuses to seal more than
/// [`MAX_SEALS_PER_KEY`] times.
pub struct FileCipher {
    provider: &'static dyn CryptoProvider,
    key: Box<dyn Aes256GcmKey>,
    tenant: String,
    file_id: FileId,
    layout: Layout,
    origin_key_version: u32,
    /// Block AAD without the index: `BLOCK_LABEL || names || file id || origin version`.
    block_aad: Vec<u8>,
    /// Header-tag AAD prefix: `HEADER_LABEL || names || file id`.
    header_aad: Vec<u8>,
    seals: AtomicU64,
}

impl fmt::Debug for FileCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileCipher")
            .field("provider", &self.provider.name())
            .field("tenant", &self.tenant)
            .field("file_id", &self.file_id)
            .field("block_bytes", &self.layout.block_bytes())
            .field("origin_key_version", &self.origin_key_version)
            .finish_non_exhaustive()
    }
}

impl FileCipher {
    /// A new file: a random data key and file id, the data key wrapped under `kek`
    /// (the tenant's current key), and the header (plaintext size 0) to store at
    /// offset 0.
    pub fn create(
        provider: &'static dyn CryptoProvider,
        ctx: &FileContext,
        kek: &Kek,
        block_bytes: u32,
    ) -> Result<(Self, FileHeader)> {
        check_kek(ctx, kek, kek.version())?;
        let layout = Layout::new(block_bytes)?;
        let data_key = DataKey::generate(provider)?;
        let mut file_id = FileId([0; FILE_ID_BYTES]);
        provider.fill_random(&mut file_id.0)?;
        let wrapped_key = wrap(provider, ctx, kek, &data_key, &file_id, kek.version())?;
        let mut header = FileHeader {
            layout,
            plaintext_bytes: 0,
            key_version: kek.version(),
            origin_key_version: kek.version(),
            file_id,
            wrapped_key,
            header_nonce: [0; NONCE_BYTES],
            header_tag: [0; TAG_BYTES],
        };
        let cipher = Self::from_parts(provider, ctx, &data_key, &header)?;
        cipher.seal_header(&mut header)?;
        Ok((cipher, header))
    }

    /// Open an existing file: unwrap its data key with `kek` (the tenant's key of
    /// [`FileHeader::key_version`]) and check the header tag. After this the header's
    /// fields, plaintext size included, are authenticated.
    pub fn open(
        provider: &'static dyn CryptoProvider,
        ctx: &FileContext,
        header: &FileHeader,
        kek: &Kek,
    ) -> Result<Self> {
        let data_key = unwrap(provider, ctx, kek, header)?;
        let cipher = Self::from_parts(provider, ctx, &data_key, header)?;
        cipher.verify_header(header)?;
        Ok(cipher)
    }

    pub(crate) fn from_parts(
        provider: &'static dyn CryptoProvider,
        ctx: &FileContext,
        data_key: &DataKey,
        header: &FileHeader,
    ) -> Result<Self> {
        let mut block_aad = ctx.aad_prefix(BLOCK_LABEL, &header.file_id);
        block_aad.extend_from_slice(&header.origin_key_version.to_le_bytes());
        Ok(Self {
            provider,
            key: provider.aes_256_gcm(data_key.secret().bytes())?,
            tenant: ctx.tenant().to_owned(),
            file_id: header.file_id,
            layout: header.layout,
            origin_key_version: header.origin_key_version,
            block_aad,
            header_aad: ctx.aad_prefix(HEADER_LABEL, &header.file_id),
            seals: AtomicU64::new(0),
        })
    }

    #[cfg(test)]
    pub(crate) fn force_seals(&self, seals: u64) {
        self.seals.store(seals, Ordering::Relaxed);
    }

    /// The file's block geometry.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The file's id.
    pub fn file_id(&self) -> FileId {
        self.file_id
    }

    /// The only place nonces come from: the provider's secure generator, counted
    /// against [`MAX_SEALS_PER_KEY`].
    fn next_nonce(&self) -> Result<Nonce> {
        let seals = self.seals.fetch_add(1, Ordering::Relaxed);
        if seals >= MAX_SEALS_PER_KEY {
            self.seals.store(MAX_SEALS_PER_KEY, Ordering::Relaxed);
            return Err(Error::NonceBudgetExhausted { seals });
        }
        let mut nonce = [0u8; NONCE_BYTES];
        self.provider.fill_random(&mut nonce)?;
        Ok(nonce)
    }

    /// Block AAD: the prefix and the block index, on the stack.
    fn block_aad(&self, index: u64, out: &mut [u8; MAX_AAD_BYTES]) -> usize {
        let n = self.block_aad.len();
        out[..n].copy_from_slice(&self.block_aad);
        out[n..n + 8].copy_from_slice(&index.to_le_bytes());
        n + 8
    }

    fn header_aad(&self, header: &FileHeader) -> Result<Vec<u8>> {
        if header.file_id != self.file_id
            || header.layout != self.layout
            || header.origin_key_version != self.origin_key_version
        {
            return Err(Error::HeaderIntegrity { tenant: self.tenant.clone() });
        }
        let mut covered = [0u8; HEADER_BYTES];
        header.encode_covered(&mut covered);
        let mut aad = Vec::with_capacity(self.header_aad.len() + HEADER_TAG_COVERS);
        aad.extend_from_slice(&self.header_aad);
        aad.extend_from_slice(&covered[..HEADER_TAG_COVERS]);
        Ok(aad)
    }

    /// Re-tag `header` with a fresh nonce (after a field changed).
    fn seal_header(&self, header: &mut FileHeader) -> Result<()> {
        let aad = self.header_aad(header)?;
        let nonce = self.next_nonce()?;
        header.header_tag = self.key.seal_in_place(&nonce, &aad, &mut [])?;
        header.header_nonce = nonce;
        Ok(())
    }

    fn verify_header(&self, header: &FileHeader) -> Result<()> {
        let aad = self.header_aad(header)?;
        self.key
            .open_in_place(&header.header_nonce, &aad, &mut [], &header.header_tag)
            .map_err(|_| Error::HeaderIntegrity { tenant: self.tenant.clone() })
    }

    /// Record a new plaintext size in `header` and re-tag it. Write the header back
    /// after the blocks it covers (a crash in between leaves the old size, and the
    /// reader trims to it).
    pub fn set_plaintext_bytes(&self, header: &mut FileHeader, plaintext_bytes: u64) -> Result<()> {
        if plaintext_bytes > crate::MAX_PLAINTEXT_BYTES {
            return Err(Error::OutOfRange {
                what: "file size",
                value: plaintext_bytes,
                max: crate::MAX_PLAINTEXT_BYTES,
            });
        }
        let mut updated = header.clone();
        updated.plaintext_bytes = plaintext_bytes;
        self.seal_header(&mut updated)?;
        *header = updated;
        Ok(())
    }

    fn check_index(&self, index: u64) -> Result<()> {
        if index > self.layout.max_block_index() {
            return Err(Error::OutOfRange { what: "block index", value: index, max: crate::MAX_PLAINTEXT_BYTES });
        }
        Ok(())
    }

    /// Plaintext length of a stored block of `stored_len` bytes, or an integrity
    /// error if no sealed block of this file has that length.
    fn stored_plaintext_len(&self, index: u64, stored_len: usize) -> Result<usize> {
        match stored_len.checked_sub(BLOCK_OVERHEAD_BYTES) {
            Some(n) if n >= 1 && n <= self.layout.block_bytes() as usize => Ok(n),
            _ => Err(Error::Integrity { block_index: index }),
        }
    }

    /// Seal block `index` in place. `stored` is laid out as the stored block will be:
    /// 12 bytes for the nonce, the plaintext (1 to `block_bytes`), 16 bytes for the
    /// tag; nonce and tag are filled in. The zero-copy path: receive the plaintext
    /// straight at `stored[12..]`.
    pub fn seal_block_in_place(&self, index: u64, stored: &mut [u8]) -> Result<()> {
        self.check_index(index)?;
        let n = stored.len().saturating_sub(BLOCK_OVERHEAD_BYTES);
        if n == 0 || n > self.layout.block_bytes() as usize {
            return Err(Error::BufferSize {
                what: "stored block to seal (plaintext + 28)",
                got: stored.len(),
                expected: self.layout.stored_block_bytes(),
            });
        }
        let mut aad = [0u8; MAX_AAD_BYTES];
        let aad_len = self.block_aad(index, &mut aad);
        let nonce = self.next_nonce()?;
        let (head, rest) = stored.split_at_mut(NONCE_BYTES);
        let (body, tail) = rest.split_at_mut(n);
        tail.copy_from_slice(&self.key.seal_in_place(&nonce, &aad[..aad_len], body)?);
        head.copy_from_slice(&nonce);
        Ok(())
    }

    /// Seal `plaintext` (1 to `block_bytes` bytes) as block `index` into `stored`,
    /// which needs at least `plaintext.len() + 28` bytes. Returns the stored length.
    pub fn seal_block(&self, index: u64, plaintext: &[u8], stored: &mut [u8]) -> Result<usize> {
        self.check_index(index)?;
        let n = plaintext.len();
        if n == 0 || n > self.layout.block_bytes() as usize {
            return Err(Error::BufferSize {
                what: "block plaintext (1 to block size)",
                got: n,
                expected: self.layout.block_bytes() as usize,
            });
        }
        let Some(stored) = stored.get_mut(..n + BLOCK_OVERHEAD_BYTES) else {
            return Err(Error::BufferSize {
                what: "stored block output",
                got: stored.len(),
                expected: n + BLOCK_OVERHEAD_BYTES,
            });
        };
        let mut aad = [0u8; MAX_AAD_BYTES];
        let aad_len = self.block_aad(index, &mut aad);
        let nonce = self.next_nonce()?;
        let (head, rest) = stored.split_at_mut(NONCE_BYTES);
        let (body, tail) = rest.split_at_mut(n);
        tail.copy_from_slice(&self.key.seal(&nonce, &aad[..aad_len], plaintext, body)?);
        head.copy_from_slice(&nonce);
        Ok(n + BLOCK_OVERHEAD_BYTES)
    }

    /// Open stored block `index` into `plaintext`, which needs at least
    /// `stored.len() - 28` bytes. Returns the block's plaintext length; the caller
    /// trims it to the file's plaintext size (a block can be longer than the header
    /// says after a crash between block write and header write).
    ///
    /// On [`Error::Integrity`] the first `stored.len() - 28` bytes of `plaintext` are
    /// zero: nothing of the block is released.
    pub fn open_block(&self, index: u64, stored: &[u8], plaintext: &mut [u8]) -> Result<usize> {
        self.check_index(index)?;
        let n = self.stored_plaintext_len(index, stored.len())?;
        let Some(out) = plaintext.get_mut(..n) else {
            return Err(Error::BufferSize { what: "block plaintext output", got: plaintext.len(), expected: n });
        };
        let mut aad = [0u8; MAX_AAD_BYTES];
        let aad_len = self.block_aad(index, &mut aad);
        let (nonce, rest) = stored.split_at(NONCE_BYTES);
        let (ciphertext, tag) = rest.split_at(n);
        let nonce: &Nonce = nonce.try_into().map_err(|_| Error::Integrity { block_index: index })?;
        let tag: &[u8; TAG_BYTES] = tag.try_into().map_err(|_| Error::Integrity { block_index: index })?;
        if self.key.open(nonce, &aad[..aad_len], ciphertext, tag, out).is_err() {
            out.zeroize(); // the provider contract already did; cheap, and on the failure path only
            return Err(Error::Integrity { block_index: index });
        }
        Ok(n)
    }

    /// Read path: open block `index` of a file whose (authenticated) size is
    /// `plaintext_bytes`, from the bytes [`Layout::read_range`] gave, into
    /// `plaintext` (at least `stored.len() - 28` bytes; a full block always fits).
    /// Returns the bytes of the block that lie inside the file, 0 past the end.
    ///
    /// The stored block is opened at its exact length for that size first; for the
    /// last block, if that fails and the stored file runs on, at the length read (an
    /// agent crash between block and header writes leaves it longer than the size).
    /// Bytes past the file size are zeroed, never released. A stored block shorter
    /// than the size says is [`Error::Integrity`]: the file was truncated.
    pub fn read_block(&self, index: u64, plaintext_bytes: u64, stored: &[u8], plaintext: &mut [u8]) -> Result<usize> {
        let want = self.layout.block_len(index, plaintext_bytes);
        if want > 0 {
            self.open_trimmed(index, want, stored, plaintext)?;
        }
        Ok(want)
    }

    /// Open block `index` expecting `want` plaintext bytes: at exactly `want + 28`
    /// stored bytes, else at all of `stored`, then trim to `want`.
    fn open_trimmed(&self, index: u64, want: usize, stored: &[u8], plaintext: &mut [u8]) -> Result<()> {
        let exact = want + BLOCK_OVERHEAD_BYTES;
        let Some(exact_stored) = stored.get(..exact) else {
            return Err(Error::Integrity { block_index: index });
        };
        let first = self.open_block(index, exact_stored, plaintext);
        if first.is_ok() {
            return Ok(());
        }
        if stored.len() == exact {
            return first.map(|_| ());
        }
        let n = self.open_block(index, stored, plaintext)?;
        // `n > want` here: the stored block is longer than `exact`.
        plaintext[want..n].zeroize();
        Ok(())
    }

    /// Open stored block `index` in place; returns the plaintext, `stored[12..len-16]`.
    /// On [`Error::Integrity`] that range is zero.
    pub fn open_block_in_place<'a>(&self, index: u64, stored: &'a mut [u8]) -> Result<&'a mut [u8]> {
        self.check_index(index)?;
        let n = self.stored_plaintext_len(index, stored.len())?;
        let mut aad = [0u8; MAX_AAD_BYTES];
        let aad_len = self.block_aad(index, &mut aad);
        let (head, rest) = stored.split_at_mut(NONCE_BYTES);
        let (body, tail) = rest.split_at_mut(n);
        let nonce: &Nonce = (&*head).try_into().map_err(|_| Error::Integrity { block_index: index })?;
        let tag: &[u8; TAG_BYTES] = (&*tail).try_into().map_err(|_| Error::Integrity { block_index: index })?;
        if self.key.open_in_place(nonce, &aad[..aad_len], body, tag).is_err() {
            body.zeroize();
            return Err(Error::Integrity { block_index: index });
        }
        Ok(body)
    }

    /// Read-modify-write of one block of a [`crate::WritePlan`]: build the block's
    /// new plaintext in `stored` (old bytes kept, `data[plan.data]` copied in, zeros
    /// elsewhere) and seal it with a fresh nonce. `old_stored` is the old stored block
    /// as [`Layout::read_range`] gives it (for the old size) when
    /// [`BlockWrite::needs_read`], ignored otherwise; it is opened like
    /// [`FileCipher::read_block`] does. `stored` must hold a full stored block
    /// ([`Layout::stored_block_bytes`]). Returns the stored length.
    ///
    /// If the old block fails to open, the error is [`Error::Integrity`] and `stored`
    /// holds no plaintext of it.
    pub fn patch_block(&self, plan: &BlockWrite, old_stored: &[u8], data: &[u8], stored: &mut [u8]) -> Result<usize> {
        let block = self.layout.block_bytes() as usize;
        let full = self.layout.stored_block_bytes();
        let Some(stored) = stored.get_mut(..full) else {
            return Err(Error::BufferSize {
                what: "stored block buffer for a patch",
                got: stored.len(),
                expected: full,
            });
        };
        let data = data.get(plan.data.clone()).ok_or(Error::BufferSize {
            what: "write data for a patch",
            got: data.len(),
            expected: plan.data.end,
        })?;
        let new_len = plan.new_len;
        let fits = new_len >= 1
            && new_len <= block
            && plan.keep_bytes <= new_len
            && plan.write_at.checked_add(data.len()).is_some_and(|end| end <= new_len);
        if !fits {
            return Err(Error::BufferSize { what: "block write plan (new length)", got: new_len, expected: block });
        }
        let body = &mut stored[NONCE_BYTES..NONCE_BYTES + block];
        if plan.keep_bytes > 0 {
            if plan.old_len < plan.keep_bytes {
                return Err(Error::BufferSize {
                    what: "block write plan (keep_bytes)",
                    got: plan.keep_bytes,
                    expected: plan.old_len,
                });
            }
            if let Err(e) = self.open_trimmed(plan.index, plan.old_len, old_stored, body) {
                body.zeroize();
                return Err(e);
            }
            body[plan.keep_bytes..].fill(0);
        } else {
            body.fill(0);
        }
        body[plan.write_at..plan.write_at + data.len()].copy_from_slice(data);
        let stored_len = new_len + BLOCK_OVERHEAD_BYTES;
        if let Err(e) = self.seal_block_in_place(plan.index, &mut stored[..stored_len]) {
            stored.zeroize();
            return Err(e);
        }
        Ok(stored_len)
    }
}
