//! Key rotation and key status: re-wrapping every file's data key from one KEK
//! version to another without touching data blocks, through a running
//! [`EncryptedContainer`] (so open files take part) or on a raw container no agent
//! serves ([`rotate`]); counting files per version ([`key_status`]) to tell when a
//! version can be retired.
//!
//! The top room: on the container, the objects' shared state and the settings.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use dpuio_backend::{Attr, Container, EntryKind, Error, NsPath, Object, OpenOptions, Result};
use dpuio_crypto::{self as crypto, FileContext, FileHeader, HEADER_BYTES, Kek};

use crate::container::{EncryptedContainer, lock};
use crate::error::crypto_error;
use crate::object::{Kind, Mode, RawKind, classify, classify_raw};
use crate::settings::{EncryptionSettings, Shared};

/// Failures a [`RotationReport`] or [`KeyStatus`] lists by path; more are counted.
pub const MAX_REPORTED_FAILURES: usize = 100;
/// Entries asked for per `readdir` batch when walking a container.
const WALK_BATCH: usize = 1024;

impl EncryptedContainer {
    /// Files per key version in this container (see [`key_status`]).
    pub fn key_status(&self) -> Result<KeyStatus> {
        key_status(&*self.core.inner)
    }

    /// Re-wrap the data key of every file wrapped under `old_version` with
    /// `new_version`, without touching data blocks; files stay readable throughout,
    /// open ones included. New files are wrapped under `new_version` from the start of
    /// the walk (so none is missed). Both KEKs must be in the key source. Files that
    /// fail are listed in the report and left as they were: keep the old key until
    /// [`KeyStatus`] shows nothing uses it. Ends with a container sync.
    pub fn rotate(&self, old_version: u32, new_version: u32) -> Result<RotationReport> {
        let _one_at_a_time = lock(&self.core.rotation);
        self.rotate_locked(old_version, new_version)
    }

    /// Key rotation to a new key file: add it to the key source as the tenant's next
    /// version ([`KeySource::add_next_key_file`]), make that current for new files,
    /// and re-wrap every file of the current version under it
    /// ([`EncryptedContainer::rotate`]). One rotation at a time per container, so
    /// versions move strictly up.
    ///
    /// [`KeySource::add_next_key_file`]: dpuio_crypto::KeySource::add_next_key_file
    pub fn rotate_to_key_file(&self, key_file: &std::path::Path) -> std::result::Result<KeyChange, RotateError> {
        let _one_at_a_time = lock(&self.core.rotation);
        let shared = &self.core.shared;
        let new_version = shared
            .settings
            .key_source
            .add_next_key_file(&shared.settings.tenant, key_file)
            .map_err(RotateError::KeyFile)?;
        let old_version = self.key_version();
        let report = self.rotate_locked(old_version, new_version).map_err(|source| RotateError::Rewrap {
            old_version,
            new_version,
            source,
        })?;
        Ok(KeyChange { old_version, new_version, report })
    }

    fn rotate_locked(&self, old_version: u32, new_version: u32) -> Result<RotationReport> {
        let (old_kek, new_kek) = rotation_keys(&self.core.shared, old_version, new_version)?;
        // Before the walk, and sequentially consistent with the loads of file creation:
        // a file the walk does not list yet is created under the new version.
        self.core.shared.key_version.store(new_version, Ordering::SeqCst);
        let mut report = RotationReport::default();
        walk_files(&*self.core.inner, |path, _| {
            let outcome = self.rotate_file(path, &old_kek, &new_kek);
            report.count(path, outcome);
        })?;
        self.core.inner.sync()?;
        Ok(report)
    }

    fn rotate_file(&self, path: &NsPath, old_kek: &Kek, new_kek: &Kek) -> Result<Rewrap> {
        let inner = self.core.inner.open(path, OpenOptions { write: true, ..OpenOptions::default() }, 0)?;
        let file = self.file_state(&*inner)?;
        let mut meta = file.loaded_mut(&*inner, path)?;
        match &mut meta.mode {
            Mode::Encrypted(sealed) => rewrap(&self.core.shared, path, &*inner, &mut sealed.header, old_kek, new_kek),
            _ => Ok(Rewrap::Unencrypted),
        }
    }
}

/// What rotation did with one file.
enum Rewrap {
    Rewrapped,
    AlreadyNew,
    OtherVersion,
    Unencrypted,
}

/// What [`EncryptedContainer::rotate_to_key_file`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyChange {
    /// The version that was current before (the one files were re-wrapped from).
    pub old_version: u32,
    /// The new key's version, current now.
    pub new_version: u32,
    /// What happened to each file.
    pub report: RotationReport,
}

/// Why [`EncryptedContainer::rotate_to_key_file`] failed.
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    /// The new key file was refused (unreadable, not a 256-bit key, accessible by
    /// group or others, or a key the tenant has already); nothing changed.
    #[error(transparent)]
    KeyFile(crypto::Error),
    /// The new version was added and made current, but the walk over the container
    /// stopped. Every file stays readable (the old key is kept); those still on the
    /// old version show in the key status.
    #[error(
        "key version {new_version} was added and is current, but re-wrapping the files of version \
         {old_version} stopped: {source}; files stay readable, keep version {old_version} until the key \
         status shows no file under it"
    )]
    Rewrap {
        /// The version files were being re-wrapped from.
        old_version: u32,
        /// The new, current version.
        new_version: u32,
        /// What stopped the walk.
        source: Error,
    },
}

/// What [`rotate`] or [`EncryptedContainer::rotate`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RotationReport {
    /// Files whose data key was re-wrapped from the old version to the new one.
    pub rewrapped: u64,
    /// Files already on the new version (an earlier, interrupted rotation, or files
    /// created during this one).
    pub already_new: u64,
    /// Encrypted files on another version, left as they are.
    pub other_version: u64,
    /// Plaintext files, and empty files with no header yet.
    pub unencrypted: u64,
    /// Files that could not be re-wrapped (the old key must stay until they are
    /// dealt with).
    pub failed: u64,
    /// Path and error of the first [`MAX_REPORTED_FAILURES`] failures.
    pub failures: Vec<(String, String)>,
}

impl RotationReport {
    fn count(&mut self, path: &NsPath, outcome: Result<Rewrap>) {
        match outcome {
            Ok(Rewrap::Rewrapped) => self.rewrapped += 1,
            Ok(Rewrap::AlreadyNew) => self.already_new += 1,
            Ok(Rewrap::OtherVersion) => self.other_version += 1,
            Ok(Rewrap::Unencrypted) => self.unencrypted += 1,
            Err(e) => {
                self.failed += 1;
                if self.failures.len() < MAX_REPORTED_FAILURES {
                    self.failures.push((path.to_string(), e.to_string()));
                }
            }
        }
    }
}

fn rotation_keys(shared: &Shared, old_version: u32, new_version: u32) -> Result<(Arc<Kek>, Arc<Kek>)> {
    if old_version == new_version {
        return Err(Error::InvalidArgument(format!(
            "key rotation from version {old_version} to the same version: give a new version"
        )));
    }
    let root = NsPath::root();
    Ok((shared.kek(&root, old_version)?, shared.kek(&root, new_version)?))
}

/// Re-wrap one header from `old_kek` to `new_kek` and write it at offset 0 (one
/// 256-byte write: a crash leaves the old or the new header, both valid while the
/// old key exists).
fn rewrap(
    shared: &Shared,
    path: &NsPath,
    object: &dyn Object,
    header: &mut FileHeader,
    old_kek: &Kek,
    new_kek: &Kek,
) -> Result<Rewrap> {
    if header.key_version() == new_kek.version() {
        return Ok(Rewrap::AlreadyNew);
    }
    if header.key_version() != old_kek.version() {
        return Ok(Rewrap::OtherVersion);
    }
    let mut rewrapped = header.clone();
    rewrapped.rewrap(shared.settings.provider, &shared.ctx, old_kek, new_kek).map_err(|e| crypto_error(path, e))?;
    object.write_at(&rewrapped.encode(), 0)?;
    *header = rewrapped;
    Ok(Rewrap::Rewrapped)
}

/// Key rotation on a raw container (the ciphertext one) that no agent is serving at
/// the same time: re-wrap every file's data key from `old_version` to
/// `new_version`, without touching data blocks. A running agent uses
/// [`EncryptedContainer::rotate`] instead, which shares the per-file state and locks
/// of open files (this function would race with their header writes) and makes the
/// new version current first. Ends with a container sync.
pub fn rotate(
    container: &dyn Container,
    settings: &EncryptionSettings,
    old_version: u32,
    new_version: u32,
) -> Result<RotationReport> {
    let ctx = FileContext::new(&settings.tenant, &settings.container).map_err(|e| crypto_error(&NsPath::root(), e))?;
    let shared = Shared { settings: settings.clone(), ctx, key_version: AtomicU32::new(new_version) };
    let (old_kek, new_kek) = rotation_keys(&shared, old_version, new_version)?;
    let mut report = RotationReport::default();
    walk_files(container, |path, _| {
        let outcome = (|| {
            let object = container.open(path, OpenOptions { write: true, ..OpenOptions::default() }, 0)?;
            let mut first = [0u8; HEADER_BYTES];
            let got = object.read_at(&mut first, 0)?;
            match classify(settings, path, &first[..got])? {
                Kind::Header(mut header) => rewrap(&shared, path, &*object, &mut header, &old_kek, &new_kek),
                Kind::Empty | Kind::Plain => Ok(Rewrap::Unencrypted),
            }
        })();
        report.count(path, outcome);
    })?;
    container.sync()?;
    Ok(report)
}

/// Files of a container per KEK version: what an operator checks before retiring a
/// key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyStatus {
    /// Encrypted files by the KEK version that wraps their data key now.
    pub files_by_version: BTreeMap<u32, u64>,
    /// Plaintext files, and empty files with no header yet.
    pub unencrypted: u64,
    /// Files whose header could not be read or decoded: their version is unknown.
    pub unreadable: u64,
    /// Path and error of the first [`MAX_REPORTED_FAILURES`] unreadable files.
    pub unreadable_files: Vec<(String, String)>,
}

impl KeyStatus {
    /// Files wrapped under `key_version`.
    pub fn files(&self, key_version: u32) -> u64 {
        self.files_by_version.get(&key_version).copied().unwrap_or(0)
    }

    /// Whether `key_version` can be retired: no file uses it, and no file is
    /// unreadable (which might).
    pub fn can_retire(&self, key_version: u32) -> bool {
        self.files(key_version) == 0 && self.unreadable == 0
    }
}

/// Count the files of a raw container (the ciphertext one) per KEK version, from
/// their headers (no key needed).
pub fn key_status(container: &dyn Container) -> Result<KeyStatus> {
    let mut status = KeyStatus::default();
    walk_files(container, |path, _| {
        let header = (|| {
            let object = container.open(path, OpenOptions::default(), 0)?;
            let mut first = [0u8; HEADER_BYTES];
            let got = object.read_at(&mut first, 0)?;
            Ok(classify_raw(&first[..got]))
        })();
        match header {
            Ok(RawKind::Header(Ok(header))) => *status.files_by_version.entry(header.key_version()).or_default() += 1,
            Ok(RawKind::Empty | RawKind::Plain) => status.unencrypted += 1,
            Ok(RawKind::Header(Err(e))) => status.unreadable(path, &crypto_error(path, e)),
            Err(e) => status.unreadable(path, &e),
        }
    })?;
    Ok(status)
}

impl KeyStatus {
    fn unreadable(&mut self, path: &NsPath, e: &Error) {
        self.unreadable += 1;
        if self.unreadable_files.len() < MAX_REPORTED_FAILURES {
            self.unreadable_files.push((path.to_string(), e.to_string()));
        }
    }
}

/// Visit every file of a container (depth first, directories in listing order). A
/// directory removed during the walk is skipped; other listing errors stop it.
fn walk_files(container: &dyn Container, mut visit: impl FnMut(&NsPath, &Attr)) -> Result<()> {
    let mut pending = vec![NsPath::root()];
    while let Some(dir) = pending.pop() {
        let mut anchor: Option<String> = None;
        loop {
            let (entries, next) = match container.readdir(&dir, anchor.as_deref(), WALK_BATCH) {
                Ok(batch) => batch,
                Err(Error::NotFound { .. } | Error::NotADirectory { .. }) if !dir.is_root() => break,
                Err(e) => return Err(e),
            };
            for entry in &entries {
                let path = dir.join(&entry.name)?;
                match entry.attr.kind {
                    EntryKind::Directory => pending.push(path),
                    EntryKind::File => visit(&path, &entry.attr),
                }
            }
            match next {
                Some(next) => anchor = Some(next),
                None => break,
            }
        }
    }
    Ok(())
}
