//! What a tenant configures for its container ([`EncryptionSettings`],
//! [`PlaintextFiles`]) and what every file of one container shares (`Shared`: the
//! settings, the AAD context, the current key version).
//!
//! Below the objects and the container, which both read it. Settings reach the
//! container made from them (see [`EncryptionSettings::running_container`], in the
//! container room) through [`Running`], which names no type of the rooms above.

use std::any::Any;
use std::fmt;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, Weak};

use dpuio_backend::{NsPath, Result};
use dpuio_crypto::{self as crypto, CryptoProvider, FileContext, Kek, KeySource, Layout};

use crate::error::crypto_error;

/// The containers made from one set of settings, shared by every clone of them: weak
/// handles to each container's state, which only the container room (that registers
/// and reads them) knows the type of, so that the settings stay below it.
pub(crate) type Running = Arc<Mutex<Vec<Weak<dyn Any + Send + Sync>>>>;

/// What to do with a non-empty file that has no encryption header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlaintextFiles {
    /// Serve it read-only, as plaintext: it predates encryption on this tenant. The
    /// default, since turning encryption on applies to new files.
    #[default]
    ReadOnly,
    /// Report it as an integrity error: for a tenant encrypted from its first file,
    /// where a file without a header can only be one whose header was erased.
    Refuse,
}

/// Inline encryption settings of one tenant's container.
#[derive(Clone)]
pub struct EncryptionSettings {
    /// The tenant, bound into every AAD and the name its KEKs are fetched by.
    pub tenant: String,
    /// The container, bound into every AAD. Give tenants and containers stable
    /// names: renaming either makes its files unreadable until re-encrypted.
    pub container: String,
    /// The AES-GCM implementation ([`dpuio_crypto::default_provider`]: aws-lc-rs).
    pub provider: &'static dyn CryptoProvider,
    /// Where KEKs come from, by tenant and version.
    pub key_source: Arc<dyn KeySource>,
    /// The KEK version new files are wrapped under. Files keep the version they were
    /// wrapped under until [`EncryptedContainer::rotate`] re-wraps them.
    ///
    /// [`EncryptedContainer::rotate`]: crate::EncryptedContainer::rotate
    pub key_version: u32,
    /// Encryption block size of new files (a power of two from 4 KiB to 16 MiB;
    /// default [`dpuio_crypto::DEFAULT_BLOCK_BYTES`], 64 KiB). Existing files keep
    /// theirs (it is in their header).
    pub block_bytes: u32,
    /// Files without a header.
    pub plaintext_files: PlaintextFiles,
    /// The containers made from these settings (every clone shares the list), so
    /// whoever holds the settings reaches the running one: key rotation does.
    pub(crate) running: Running,
}

impl EncryptionSettings {
    /// Settings with the defaults: aws-lc-rs, 64 KiB blocks, plaintext files
    /// read-only, and the key source's highest version for `tenant` as the current
    /// one. Checked with [`EncryptionSettings::validate`].
    pub fn new(tenant: &str, container: &str, key_source: Arc<dyn KeySource>) -> crypto::Result<Self> {
        let key_version = key_source.current_key_version(tenant)?;
        let settings = Self {
            tenant: tenant.to_owned(),
            container: container.to_owned(),
            provider: crypto::default_provider(),
            key_source,
            key_version,
            block_bytes: crypto::DEFAULT_BLOCK_BYTES,
            plaintext_files: PlaintextFiles::default(),
            running: Arc::default(),
        };
        settings.validate()?;
        Ok(settings)
    }

    /// Check what can be checked before the first file: names that fit the AAD, a
    /// valid block size, and a current KEK the key source has.
    pub fn validate(&self) -> crypto::Result<()> {
        FileContext::new(&self.tenant, &self.container)?;
        Layout::new(self.block_bytes)?;
        self.key_source.key_encryption_key(&self.tenant, self.key_version)?;
        Ok(())
    }
}

impl fmt::Debug for EncryptionSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptionSettings")
            .field("tenant", &self.tenant)
            .field("container", &self.container)
            .field("provider", &self.provider.name())
            .field("key_version", &self.key_version)
            .field("block_bytes", &self.block_bytes)
            .field("plaintext_files", &self.plaintext_files)
            .finish_non_exhaustive()
    }
}

/// What every file of a container shares: settings, AAD context, current version.
pub(crate) struct Shared {
    pub(crate) settings: EncryptionSettings,
    pub(crate) ctx: FileContext,
    /// The KEK version new files are wrapped under (rotation moves it).
    pub(crate) key_version: AtomicU32,
}

impl Shared {
    pub(crate) fn kek(&self, path: &NsPath, key_version: u32) -> Result<Arc<Kek>> {
        self.settings
            .key_source
            .key_encryption_key(&self.settings.tenant, key_version)
            .map_err(|e| crypto_error(path, e))
    }
}
