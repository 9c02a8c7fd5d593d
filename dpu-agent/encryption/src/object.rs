//! One encrypted file: [`EncryptedObject`] (one open of it), the state every open of
//! the file shares (`FileState`: header, data key, meta lock and block stripes), and
//! the block paths: how a read opens blocks into the caller's buffer, how a write or
//! truncate plans, seals and stores blocks and then the header, in the crash order
//! the crate documentation gives.
//!
//! On the settings below it; the container above makes the objects.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use dpuio_backend::{Attr, Error, HostBytes, HostBytesMut, NsPath, Object, Result};
use dpuio_crypto::{
    self as crypto, BlockWrite, FORMAT_VERSION, FileCipher, FileHeader, HEADER_BYTES, Layout, MAGIC, WritePlan,
};

use crate::error::{crypto_error, internal};
use crate::settings::{EncryptionSettings, PlaintextFiles, Shared};

/// Block lock stripes per open file.
const LOCK_STRIPES: usize = 64;
/// Stored bytes moved by one backend call at most: blocks are read, sealed and
/// written in groups of about this size (one `pread`/`pwrite`, one `dfs_read`/
/// `dfs_write`, per group). One data-plane piece (256 KiB) is one group, and a group
/// stays in a core's L2 between the backend call and the cipher.
const STAGING_BYTES: usize = 256 << 10;
/// Writes up to this size seal their fully written blocks before they take the
/// exclusive lock when they extend the file (the staging memory is about this size).
const PRESEAL_MAX_BYTES: usize = 4 << 20;
/// Most zero bytes one write or truncate may add past the end of an encrypted file.
/// An encrypted file has no holes (a block never sealed cannot be told from one
/// storage zeroed), so growing by N bytes seals and writes N bytes; this bounds the
/// time one request can hold a file's exclusive lock.
pub const MAX_ZERO_FILL_BYTES: u64 = 64 << 30;
/// Bytes compared with the start of a header to tell a (possibly damaged) header
/// from plaintext: magic, format version, header size.
const SIGNATURE_BYTES: usize = 12;
/// A file whose first [`SIGNATURE_BYTES`] differ from a header's in at most this many
/// bytes is taken for a header (damaged if it does not decode).
const SIGNATURE_TOLERANCE: usize = 4;

/// One open of an encrypted (or plaintext) file; shares its state with every other
/// open of the file through the same [`EncryptedContainer`].
///
/// [`EncryptedContainer`]: crate::EncryptedContainer
pub struct EncryptedObject {
    pub(crate) inner: Arc<dyn Object>,
    pub(crate) file: Arc<FileState>,
}

impl fmt::Debug for EncryptedObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptedObject")
            .field("path", self.inner.path())
            .field("writable", &self.inner.writable())
            .finish_non_exhaustive()
    }
}

impl EncryptedObject {
    fn check_writable(&self, what: &str) -> Result<()> {
        if self.inner.writable() {
            return Ok(());
        }
        Err(Error::AccessMode {
            path: self.inner.path().to_string(),
            reason: format!("{what} needs an object opened for writing; this one is read-only"),
        })
    }
}

impl Object for EncryptedObject {
    fn path(&self) -> &NsPath {
        self.inner.path()
    }

    fn writable(&self) -> bool {
        self.inner.writable()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.read_into(buf.into(), offset)
    }

    /// Blocks are opened in scratch memory and copied into `buf` once their tag checked
    /// (see `read_blocks`); plaintext files go straight through.
    fn read_into(&self, buf: HostBytesMut<'_>, offset: u64) -> Result<usize> {
        let path = self.inner.path();
        let meta = self.file.loaded(&*self.inner, path)?;
        match &meta.mode {
            Mode::Encrypted(sealed) => read_blocks(&self.file, &*self.inner, path, sealed, buf, offset),
            Mode::Plain => self.inner.read_into(buf, offset),
            Mode::Empty | Mode::Unloaded => Ok(0),
        }
    }

    /// The host may change its bytes while they are read: copy them once into memory
    /// of this thread, then seal only from that copy. Sealing reads the plaintext more
    /// than once (a block presealed under the shared lock may be sealed again under the
    /// exclusive one, a partial block is patched), and reading the host's memory each
    /// time would let one write store blocks sealed from different versions of its
    /// bytes; a cipher that reads its input twice could even tag other bytes than it
    /// encrypted.
    fn write_from(&self, buf: HostBytes<'_>, offset: u64) -> Result<()> {
        let mut plain = PLAIN.with(|p| std::mem::take(&mut *p.borrow_mut()));
        plain.resize(buf.len(), 0);
        buf.copy_to_slice(&mut plain);
        let written = self.write_at(&plain, offset);
        // Kept for the next write unless a large one grew it; the plaintext goes with it
        // either way (the next use overwrites what it copies out).
        if plain.capacity() <= STAGING_BYTES {
            PLAIN.with(|p| *p.borrow_mut() = plain);
        }
        written
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_writable("write")?;
        if buf.is_empty() {
            return Ok(());
        }
        let path = self.inner.path();
        let end = offset.checked_add(buf.len() as u64).ok_or_else(|| past_end(path, offset))?;
        let mut presealed = None;
        {
            let meta = self.file.loaded(&*self.inner, path)?;
            if let (Mode::Encrypted(sealed), true) = (&meta.mode, meta.consistent) {
                let size = sealed.header.plaintext_bytes();
                if end <= size {
                    // Inside the file: shared meta lock, exclusive block stripes.
                    let plan = sealed.cipher.layout().write_plan(offset, buf.len() as u64, size);
                    let plan = plan.map_err(|e| crypto_error(path, e))?;
                    return apply_plan(Some(&self.file), &*self.inner, path, &sealed.cipher, plan, buf, None);
                }
                if buf.len() <= PRESEAL_MAX_BYTES && offset.saturating_sub(size) <= MAX_ZERO_FILL_BYTES {
                    presealed = Some(preseal(path, &sealed.cipher, offset, buf, size)?);
                }
            }
        }
        let mut meta = self.file.writer(&*self.inner, path)?;
        let Mode::Encrypted(sealed) = &mut meta.mode else {
            return Err(internal(path, "no encrypted state after preparing a write"));
        };
        let size = sealed.header.plaintext_bytes();
        if offset.saturating_sub(size) > MAX_ZERO_FILL_BYTES {
            return Err(too_far(path, size, offset));
        }
        let plan =
            sealed.cipher.layout().write_plan(offset, buf.len() as u64, size).map_err(|e| crypto_error(path, e))?;
        let new_size = plan.new_plaintext_bytes();
        // Blocks first, the header with the new size last.
        let written = apply_plan(None, &*self.inner, path, &sealed.cipher, plan, buf, presealed.as_ref())
            .and_then(|()| commit_size(&*self.inner, path, sealed, new_size));
        if written.is_err() {
            // Blocks may be stored past the size now: check again before the next write.
            meta.consistent = false;
        }
        written
    }

    fn stat(&self) -> Result<Attr> {
        let mut attr = self.inner.stat()?;
        let meta = self.file.loaded(&*self.inner, self.inner.path())?;
        attr.size = match &meta.mode {
            Mode::Encrypted(sealed) => sealed.header.plaintext_bytes(),
            Mode::Plain => attr.size,
            Mode::Empty | Mode::Unloaded => 0,
        };
        Ok(attr)
    }

    fn truncate(&self, size: u64) -> Result<()> {
        self.check_writable("truncate")?;
        let path = self.inner.path();
        let mut meta = self.file.writer(&*self.inner, path)?;
        let Mode::Encrypted(sealed) = &mut meta.mode else {
            return Err(internal(path, "no encrypted state after preparing a truncate"));
        };
        let resized = resize(&*self.inner, path, sealed, size);
        if resized.is_err() {
            meta.consistent = false;
        }
        resized
    }

    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
}

/// The shared state of one file.
pub(crate) struct FileState {
    shared: Arc<Shared>,
    meta: RwLock<Meta>,
    stripes: [RwLock<()>; LOCK_STRIPES],
}

pub(crate) struct Meta {
    pub(crate) mode: Mode,
    /// The stored size has been checked against the header (and repaired) since the
    /// state was loaded: writes may take the shared path.
    consistent: bool,
}

pub(crate) enum Mode {
    /// Not read from storage yet (or a replacement failed half-way): load first.
    Unloaded,
    /// An empty stored file: an empty encrypted file whose header comes with the
    /// first writable open.
    Empty,
    /// A file without a header, served read-only ([`PlaintextFiles::ReadOnly`]).
    Plain,
    Encrypted(Box<Sealed>),
}

/// An encrypted file: its data key (in the cipher) and its header as stored.
pub(crate) struct Sealed {
    pub(crate) cipher: FileCipher,
    pub(crate) header: FileHeader,
}

impl FileState {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            meta: RwLock::new(Meta { mode: Mode::Unloaded, consistent: false }),
            stripes: std::array::from_fn(|_| RwLock::new(())),
        }
    }

    fn read_meta(&self) -> RwLockReadGuard<'_, Meta> {
        self.meta.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_meta(&self) -> RwLockWriteGuard<'_, Meta> {
        self.meta.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The state, loaded from storage if it was not yet, under the shared lock.
    pub(crate) fn loaded(&self, inner: &dyn Object, path: &NsPath) -> Result<RwLockReadGuard<'_, Meta>> {
        loop {
            let meta = self.read_meta();
            if !matches!(meta.mode, Mode::Unloaded) {
                return Ok(meta);
            }
            drop(meta);
            drop(self.loaded_mut(inner, path)?);
        }
    }

    /// The state, loaded from storage if it was not yet, under the exclusive lock.
    pub(crate) fn loaded_mut(&self, inner: &dyn Object, path: &NsPath) -> Result<RwLockWriteGuard<'_, Meta>> {
        let mut meta = self.write_meta();
        if matches!(meta.mode, Mode::Unloaded) {
            meta.mode = load(&self.shared, inner, path)?;
            meta.consistent = false;
        }
        Ok(meta)
    }

    /// What a writable open must find: an encrypted file (an empty one gets its
    /// header now, so a missing current key shows at open), never a plaintext one.
    pub(crate) fn prepare_writer(&self, inner: &dyn Object, path: &NsPath) -> Result<()> {
        {
            let meta = self.loaded(inner, path)?;
            if matches!(meta.mode, Mode::Encrypted(_)) {
                return Ok(());
            }
        }
        drop(self.writer(inner, path)?);
        Ok(())
    }

    /// The exclusive lock on an encrypted, consistent state, for a size change: an
    /// empty file gets its header, a stored file longer than its header says is
    /// repaired; a plaintext file is refused.
    fn writer(&self, inner: &dyn Object, path: &NsPath) -> Result<RwLockWriteGuard<'_, Meta>> {
        let mut meta = self.loaded_mut(inner, path)?;
        match &meta.mode {
            Mode::Plain => return Err(plaintext_read_only(path)),
            Mode::Empty => {
                meta.mode = Mode::Encrypted(Box::new(create_header(&self.shared, inner, path)?));
                meta.consistent = true;
            }
            Mode::Encrypted(_) | Mode::Unloaded => {}
        }
        if !meta.consistent {
            if let Mode::Encrypted(sealed) = &meta.mode {
                repair(inner, path, sealed)?;
            }
            meta.consistent = true;
        }
        Ok(meta)
    }

    /// Create or open with truncate: the file becomes an empty encrypted file with a
    /// fresh data key under the current KEK, whatever it held (encrypted, plaintext,
    /// or damaged). Cut first, header second: a crash in between leaves an empty
    /// file, which is an empty encrypted file.
    pub(crate) fn replace(&self, inner: &dyn Object, path: &NsPath) -> Result<()> {
        // The new envelope first, so a missing key fails before anything is cut.
        let mut sealed = new_envelope(&self.shared, path)?;
        let mut meta = self.write_meta();
        if sealed.header.key_version() != self.shared.key_version.load(Ordering::SeqCst) {
            // A rotation made another version current meanwhile and may have walked
            // past this file already: wrap under the current one (under the lock that
            // the rotation takes for this file).
            sealed = new_envelope(&self.shared, path)?;
        }
        meta.mode = Mode::Unloaded;
        inner.truncate(0)?;
        meta.mode = Mode::Empty;
        inner.write_at(&sealed.header.encode(), 0)?;
        meta.mode = Mode::Encrypted(Box::new(sealed));
        meta.consistent = true;
        Ok(())
    }

    /// Guards on the stripes of `blocks` (at most [`LOCK_STRIPES`] of them), taken in
    /// ascending stripe order.
    fn lock_stripes(&self, blocks: Range<u64>, exclusive: bool) -> Vec<StripeGuard<'_>> {
        let mut ids: Vec<usize> = blocks.map(|i| (i % LOCK_STRIPES as u64) as usize).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|id| {
                let stripe = &self.stripes[id];
                if exclusive {
                    StripeGuard::Write(stripe.write().unwrap_or_else(PoisonError::into_inner))
                } else {
                    StripeGuard::Read(stripe.read().unwrap_or_else(PoisonError::into_inner))
                }
            })
            .collect()
    }
}

/// A held block stripe.
#[allow(dead_code, reason = "a guard is held for its lifetime, never read")]
enum StripeGuard<'a> {
    Read(RwLockReadGuard<'a, ()>),
    Write(RwLockWriteGuard<'a, ()>),
}

/// What the first bytes of a stored file say it is.
pub(crate) enum Kind {
    Empty,
    Plain,
    Header(FileHeader),
}

/// Tell an empty file, a plaintext file and a header apart from the first bytes
/// (`first`: the first [`HEADER_BYTES`] of the file, or all of a shorter one).
pub(crate) fn classify(settings: &EncryptionSettings, path: &NsPath, first: &[u8]) -> Result<Kind> {
    match classify_raw(first) {
        RawKind::Empty => Ok(Kind::Empty),
        RawKind::Header(Ok(header)) => Ok(Kind::Header(header)),
        RawKind::Header(Err(e)) => Err(crypto_error(path, e)),
        RawKind::Plain => match settings.plaintext_files {
            PlaintextFiles::ReadOnly => Ok(Kind::Plain),
            PlaintextFiles::Refuse => Err(Error::Integrity {
                path: path.to_string(),
                block_index: None,
                detail: "the file has no encryption header, and this tenant's settings refuse plaintext files \
                         (the header was erased, or the file was put there behind the agent's back)"
                    .to_owned(),
            }),
        },
    }
}

pub(crate) enum RawKind {
    Empty,
    Plain,
    Header(crypto::Result<FileHeader>),
}

pub(crate) fn classify_raw(first: &[u8]) -> RawKind {
    if first.is_empty() {
        return RawKind::Empty;
    }
    let mut signature = [0u8; SIGNATURE_BYTES];
    signature[..8].copy_from_slice(&MAGIC);
    signature[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    signature[10..12].copy_from_slice(&(HEADER_BYTES as u16).to_le_bytes());
    let looks_like_header = first.len() >= SIGNATURE_BYTES
        && first.iter().zip(signature).filter(|(a, b)| **a != *b).count() <= SIGNATURE_TOLERANCE;
    if looks_like_header { RawKind::Header(FileHeader::decode(first)) } else { RawKind::Plain }
}

/// Read the state of a file from storage: its header, unwrapped with the tenant's
/// KEK of the header's version (which authenticates the header).
fn load(shared: &Shared, inner: &dyn Object, path: &NsPath) -> Result<Mode> {
    let mut first = [0u8; HEADER_BYTES];
    let got = inner.read_at(&mut first, 0)?;
    Ok(match classify(&shared.settings, path, &first[..got])? {
        Kind::Empty => Mode::Empty,
        Kind::Plain => Mode::Plain,
        Kind::Header(header) => {
            let kek = shared.kek(path, header.key_version())?;
            let cipher = FileCipher::open(shared.settings.provider, &shared.ctx, &header, &kek)
                .map_err(|e| crypto_error(path, e))?;
            Mode::Encrypted(Box::new(Sealed { cipher, header }))
        }
    })
}

/// A new file's envelope: a fresh data key under the current KEK; the header (size
/// 0) is written at offset 0.
fn create_header(shared: &Shared, inner: &dyn Object, path: &NsPath) -> Result<Sealed> {
    let sealed = new_envelope(shared, path)?;
    inner.write_at(&sealed.header.encode(), 0)?;
    Ok(sealed)
}

/// A fresh data key and file id under the current KEK, and its header (size 0).
fn new_envelope(shared: &Shared, path: &NsPath) -> Result<Sealed> {
    let kek = shared.kek(path, shared.key_version.load(Ordering::SeqCst))?;
    let (cipher, header) = FileCipher::create(shared.settings.provider, &shared.ctx, &kek, shared.settings.block_bytes)
        .map_err(|e| crypto_error(path, e))?;
    Ok(Sealed { cipher, header })
}

/// The crate's rule before the first write: a stored file longer than its header's
/// size (a crash between blocks and header, or during a shrink) has its last block
/// re-sealed at its exact length and is cut back.
fn repair(inner: &dyn Object, path: &NsPath, sealed: &Sealed) -> Result<()> {
    let stored = inner.stat()?.size;
    let size = sealed.header.plaintext_bytes();
    let layout = sealed.cipher.layout();
    let exact = layout.stored_bytes(size);
    if stored <= exact {
        return Ok(());
    }
    tracing::info!(path = %path, stored, exact, "repairing an encrypted file left longer than its size by a crash");
    let plan = layout.repair_plan(size, stored).map_err(|e| crypto_error(path, e))?;
    apply_plan(None, inner, path, &sealed.cipher, plan, &[], None)?;
    inner.truncate(exact)
}

/// Record a new plaintext size: re-tag the header and write it (after the blocks).
fn commit_size(inner: &dyn Object, path: &NsPath, sealed: &mut Sealed, size: u64) -> Result<()> {
    if size == sealed.header.plaintext_bytes() {
        return Ok(());
    }
    let mut header = sealed.header.clone();
    sealed.cipher.set_plaintext_bytes(&mut header, size).map_err(|e| crypto_error(path, e))?;
    inner.write_at(&header.encode(), 0)?;
    sealed.header = header;
    Ok(())
}

/// Truncate an encrypted file, under the exclusive lock, in `dpuio_crypto`'s order.
fn resize(inner: &dyn Object, path: &NsPath, sealed: &mut Sealed, size: u64) -> Result<()> {
    let old = sealed.header.plaintext_bytes();
    let layout = sealed.cipher.layout();
    let plan = layout.resize_plan(old, size).map_err(|e| crypto_error(path, e))?;
    if size > old {
        if size - old > MAX_ZERO_FILL_BYTES {
            return Err(too_far(path, old, size));
        }
        // Grow: zero blocks first, the header last.
        apply_plan(None, inner, path, &sealed.cipher, plan, &[], None)?;
        return commit_size(inner, path, sealed, size);
    }
    if size == old {
        return Ok(());
    }
    // Shrink: seal the new last block (if partial) in memory, then header, block, cut.
    let mut last = None;
    for w in plan {
        let mut old_block = vec![0u8; layout.stored_block_bytes()];
        let got = read_old_block(inner, &layout, w.index, &mut old_block)?;
        let mut block = vec![0u8; layout.stored_block_bytes()];
        let n = sealed.cipher.patch_block(&w, &old_block[..got], &[], &mut block).map_err(|e| crypto_error(path, e))?;
        block.truncate(n);
        last = Some((w.index, block));
    }
    commit_size(inner, path, sealed, size)?;
    if let Some((index, block)) = last {
        inner.write_at(&block, layout.stored_offset(index))?;
    }
    inner.truncate(layout.stored_bytes(size))
}

/// Read the old stored block `index` into `out` (a full stored block's room): what
/// [`Layout::read_range`] gives, since the last block of a file runs to the end of
/// the stored file, at most a full block, and the backend's read is short there.
fn read_old_block(inner: &dyn Object, layout: &Layout, index: u64, out: &mut [u8]) -> Result<usize> {
    inner.read_at(out, layout.stored_offset(index))
}

/// Blocks sealed before the exclusive lock: each [`BlockWrite`] with its stored bytes.
struct Presealed {
    blocks: BTreeMap<u64, (BlockWrite, Range<usize>)>,
    stored: Vec<u8>,
}

/// Seal the blocks of a write that its data fully determines (nothing of the old
/// block kept), against the size seen under the shared lock.
fn preseal(path: &NsPath, cipher: &FileCipher, offset: u64, data: &[u8], size: u64) -> Result<Presealed> {
    let layout = cipher.layout();
    let plan = layout.write_plan(offset, data.len() as u64, size).map_err(|e| crypto_error(path, e))?;
    let slot = layout.stored_block_bytes();
    let eligible: Vec<BlockWrite> = plan.filter(|w| !w.needs_read() && !w.data.is_empty()).collect();
    let mut stored = vec![0u8; eligible.len() * slot];
    let mut blocks = BTreeMap::new();
    for (k, w) in eligible.into_iter().enumerate() {
        let at = k * slot;
        let n = seal_one(path, cipher, &w, &[], data, &mut stored[at..at + slot])?;
        blocks.insert(w.index, (w, at..at + n));
    }
    Ok(Presealed { blocks, stored })
}

/// Seal one block of a plan into `out` (a full stored block's room); returns the
/// stored length. A block the write covers whole is sealed straight from `data`.
fn seal_one(
    path: &NsPath,
    cipher: &FileCipher,
    w: &BlockWrite,
    old: &[u8],
    data: &[u8],
    out: &mut [u8],
) -> Result<usize> {
    let sealed = if !w.needs_read() && w.write_at == 0 && w.data.len() == w.new_len {
        cipher.seal_block(w.index, &data[w.data.clone()], out)
    } else {
        cipher.patch_block(w, old, data, out)
    };
    sealed.map_err(|e| crypto_error(path, e))
}

/// Blocks handled per group (one backend call each way).
fn group_blocks(layout: &Layout) -> u64 {
    (STAGING_BYTES / layout.block_bytes() as usize).clamp(1, LOCK_STRIPES) as u64
}

/// Seal and write the blocks of `plan`, in groups of consecutive blocks, each group
/// one backend write. With `stripes`, each group holds its block stripes
/// exclusively (the shared-meta path); without, the caller holds the meta lock
/// exclusively.
fn apply_plan(
    stripes: Option<&FileState>,
    inner: &dyn Object,
    path: &NsPath,
    cipher: &FileCipher,
    mut plan: WritePlan,
    data: &[u8],
    presealed: Option<&Presealed>,
) -> Result<()> {
    let layout = cipher.layout();
    let slot = layout.stored_block_bytes();
    let group = group_blocks(&layout) as usize;
    with_scratch(|scratch| {
        loop {
            let writes: Vec<BlockWrite> = plan.by_ref().take(group).collect();
            let (Some(first), Some(last)) = (writes.first(), writes.last()) else {
                return Ok(());
            };
            let (first, end) = (first.index, last.index + 1);
            let _guards = stripes.map(|s| s.lock_stripes(first..end, true));
            let stage = sized(&mut scratch.stage, writes.len() * slot);
            let mut stored_len = 0;
            for (k, w) in writes.iter().enumerate() {
                if w.index != first + k as u64 || stored_len != k * slot {
                    return Err(internal(path, "write plan blocks are not contiguous"));
                }
                let out = &mut stage[k * slot..(k + 1) * slot];
                let reused = presealed.and_then(|p| {
                    let (planned, range) = p.blocks.get(&w.index)?;
                    (planned == w).then(|| &p.stored[range.clone()])
                });
                let n = match reused {
                    Some(bytes) => {
                        out[..bytes.len()].copy_from_slice(bytes);
                        bytes.len()
                    }
                    None if w.needs_read() => {
                        let old = sized(&mut scratch.block, slot);
                        let got = read_old_block(inner, &layout, w.index, old)?;
                        seal_one(path, cipher, w, &old[..got], data, out)?
                    }
                    None => seal_one(path, cipher, w, &[], data, out)?,
                };
                stored_len += n;
            }
            inner.write_at(&stage[..stored_len], layout.stored_offset(first))?;
        }
    })
}

/// Decrypt the blocks a read touches into `buf`, each through a scratch block of this
/// thread and copied out only once its tag checked: `buf` may be memory the host can
/// read and write while the agent writes it (a mapped region on the data plane, a view
/// the agent must not even read back), and AES-GCM
/// (aws-lc) decrypts before it compares the tag, so decrypting there would show the
/// host a failing block's plaintext for an instant.
fn read_blocks(
    file: &FileState,
    inner: &dyn Object,
    path: &NsPath,
    sealed: &Sealed,
    mut buf: HostBytesMut<'_>,
    offset: u64,
) -> Result<usize> {
    let size = sealed.header.plaintext_bytes();
    if offset >= size || buf.is_empty() {
        return Ok(0);
    }
    let n = usize::try_from(size - offset).unwrap_or(usize::MAX).min(buf.len());
    let end = offset + n as u64;
    let cipher = &sealed.cipher;
    let layout = cipher.layout();
    let slot = layout.stored_block_bytes();
    let blocks = layout.blocks(offset, n as u64).map_err(|e| crypto_error(path, e))?;
    let group = group_blocks(&layout);
    with_scratch(|scratch| {
        let mut index = blocks.start;
        while index < blocks.end {
            let last = (index + group).min(blocks.end);
            let _guards = file.lock_stripes(index..last, false);
            let stage = sized(&mut scratch.stage, (last - index) as usize * slot);
            let got = inner.read_at(stage, layout.stored_offset(index))?;
            for i in index..last {
                let at = (i - index) as usize * slot;
                let stored = &stage[at.min(got)..(at + slot).min(got)];
                let block_start = layout.block_offset(i);
                let block_len = layout.block_len(i, size);
                let from = block_start.max(offset);
                let to = (block_start + block_len as u64).min(end);
                let mut dst = buf.slice_mut((from - offset) as usize..(to - offset) as usize);
                debug_assert!(dst.len() <= block_len);
                let plain = sized(&mut scratch.block, slot);
                cipher.read_block(i, size, stored, plain).map_err(|e| crypto_error(path, e))?;
                let skip = (from - block_start) as usize;
                dst.copy_from_slice(&plain[skip..skip + dst.len()]);
            }
            index = last;
        }
        Ok(n)
    })
}

/// Per-thread staging buffers, reused across calls so the data path allocates
/// nothing: `stage` holds a group of stored blocks, `block` one block (an old stored
/// block to patch, or a plaintext block to copy part of). Every use overwrites what
/// it copies out, so nothing of one file (or tenant) reaches another's buffer.
#[derive(Default)]
struct Scratch {
    stage: Vec<u8>,
    block: Vec<u8>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    /// The one copy of a write's plaintext out of host memory (`write_from`).
    static PLAIN: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    // Taken out for the call, so a nested use (there is none) would get fresh ones.
    let mut scratch = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let out = f(&mut scratch);
    SCRATCH.with(|s| *s.borrow_mut() = scratch);
    out
}

fn sized(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buf.len() < len {
        buf.resize(len, 0);
    }
    &mut buf[..len]
}

fn past_end(path: &NsPath, offset: u64) -> Error {
    Error::InvalidArgument(format!("{path}: a write at offset {offset} ends past the largest file size"))
}

fn too_far(path: &NsPath, size: u64, to: u64) -> Error {
    Error::InvalidArgument(format!(
        "{path}: growing an encrypted file from {size} to {to} bytes would seal more than {MAX_ZERO_FILL_BYTES} \
         zero bytes in one request (encrypted files have no holes); grow it in steps"
    ))
}

fn plaintext_read_only(path: &NsPath) -> Error {
    Error::AccessMode {
        path: path.to_string(),
        reason: "the file is stored in plaintext (it predates encryption on this tenant): it can be read but not \
                 written; create it again (create, or open with truncate) to store it encrypted"
            .to_owned(),
    }
}
