//! The wrapping backend: [`EncryptedContainer`] implements [`Container`] over a raw
//! container, keeps the container-level state (settings, the registry of open
//! files' shared states, the rotation lock), and opens [`EncryptedObject`]s.
//!
//! On the objects and the settings below it; rotation, above, adds its methods to
//! [`EncryptedContainer`].

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use dpuio_backend::{Attr, Container, DirEntry, EntryKind, NsPath, Object, OpenOptions, Result};
use dpuio_crypto::{self as crypto, FileContext, HEADER_BYTES};

use crate::object::{EncryptedObject, FileState, Kind, classify};
use crate::settings::{EncryptionSettings, Shared};

/// A container whose files are encrypted: see the crate documentation. A handle:
/// every `EncryptedContainer` made from the same [`EncryptedContainer::new`] (see
/// [`EncryptionSettings::running_container`]) shares one state.
pub struct EncryptedContainer {
    pub(crate) core: Arc<Core>,
}

/// The state of one encrypted container.
pub(crate) struct Core {
    pub(crate) inner: Arc<dyn Container>,
    pub(crate) shared: Arc<Shared>,
    /// Open files by the backend's object id, so every open of a file shares its state.
    files: Mutex<Registry>,
    /// Held through a whole rotation: one at a time per container.
    pub(crate) rotation: Mutex<()>,
}

#[derive(Default)]
struct Registry {
    files: HashMap<u64, Weak<FileState>>,
    /// Size at which dead entries are swept next.
    sweep_at: usize,
}

impl fmt::Debug for EncryptedContainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptedContainer")
            .field("container", &self.core.inner.name())
            .field("settings", &self.core.shared.settings)
            .field("key_version", &self.key_version())
            .finish_non_exhaustive()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data (maps and lists of weak pointers, or a unit that only serialises);
    // going on after a panic elsewhere is safe.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EncryptedContainer {
    /// Wrap `inner` (the raw container) with `settings`, after
    /// [`EncryptionSettings::validate`].
    pub fn new(inner: Arc<dyn Container>, settings: EncryptionSettings) -> crypto::Result<Self> {
        settings.validate()?;
        let ctx = FileContext::new(&settings.tenant, &settings.container)?;
        let key_version = AtomicU32::new(settings.key_version);
        let running = settings.running.clone();
        let core = Arc::new(Core {
            inner,
            shared: Arc::new(Shared { settings, ctx, key_version }),
            files: Mutex::new(Registry::default()),
            rotation: Mutex::new(()),
        });
        let registered: Arc<dyn Any + Send + Sync> = core.clone();
        let mut running = lock(&running);
        running.retain(|c| c.strong_count() > 0);
        running.push(Arc::downgrade(&registered));
        Ok(Self { core })
    }

    /// The raw container underneath (ciphertext).
    pub fn inner(&self) -> &Arc<dyn Container> {
        &self.core.inner
    }

    /// The settings this container was made with (`key_version` as configured; see
    /// [`EncryptedContainer::key_version`] for the current one).
    pub fn settings(&self) -> &EncryptionSettings {
        &self.core.shared.settings
    }

    /// The KEK version new files are wrapped under now.
    pub fn key_version(&self) -> u32 {
        self.core.shared.key_version.load(Ordering::SeqCst)
    }

    /// The shared state of the file `inner` is open on.
    pub(crate) fn file_state(&self, inner: &dyn Object) -> Result<Arc<FileState>> {
        let id = inner.stat()?.object_id;
        let mut registry = lock(&self.core.files);
        if let Some(file) = registry.files.get(&id).and_then(Weak::upgrade) {
            return Ok(file);
        }
        let file = Arc::new(FileState::new(self.core.shared.clone()));
        if registry.files.len() >= registry.sweep_at {
            registry.files.retain(|_, f| f.strong_count() > 0);
            registry.sweep_at = (registry.files.len() * 2).max(64);
        }
        registry.files.insert(id, Arc::downgrade(&file));
        Ok(file)
    }

    /// Plaintext size of a file, from its stored header (unauthenticated: fine for
    /// `stat`, as `dpuio_crypto` says).
    fn plaintext_size(&self, path: &NsPath, attr: &Attr) -> Result<u64> {
        if attr.kind != EntryKind::File || attr.size == 0 {
            return Ok(attr.size);
        }
        let object = self.core.inner.open(path, OpenOptions::default(), 0)?;
        let mut first = [0u8; HEADER_BYTES];
        let got = object.read_at(&mut first, 0)?;
        Ok(match classify(&self.core.shared.settings, path, &first[..got])? {
            Kind::Empty => 0,
            Kind::Plain => attr.size,
            Kind::Header(header) => header.plaintext_bytes(),
        })
    }
}

impl EncryptionSettings {
    /// The container [`EncryptedContainer::new`] made from these settings (or a clone
    /// of them) that is still in use, if any: a handle sharing its state, open files
    /// and locks.
    pub fn running_container(&self) -> Option<EncryptedContainer> {
        let core = lock(&self.running).iter().rev().find_map(Weak::upgrade)?;
        // Only `EncryptedContainer::new` registers, and always a `Core`.
        core.downcast::<Core>().ok().map(|core| EncryptedContainer { core })
    }
}

impl Container for EncryptedContainer {
    fn name(&self) -> &str {
        self.core.inner.name()
    }

    fn chunk_bytes(&self) -> u64 {
        self.core.inner.chunk_bytes()
    }

    fn stat(&self, path: &NsPath) -> Result<Attr> {
        let mut attr = self.core.inner.stat(path)?;
        attr.size = self.plaintext_size(path, &attr)?;
        Ok(attr)
    }

    fn mkdir(&self, path: &NsPath, mode: u32) -> Result<Attr> {
        self.core.inner.mkdir(path, mode)
    }

    fn readdir(&self, path: &NsPath, anchor: Option<&str>, max: usize) -> Result<(Vec<DirEntry>, Option<String>)> {
        let (mut entries, next) = self.core.inner.readdir(path, anchor, max)?;
        for entry in &mut entries {
            if entry.attr.kind != EntryKind::File {
                continue;
            }
            // One damaged file must not fail the listing of its directory: it shows as
            // size 0 here, and its own stat or open reports the error.
            let size = path.join(&entry.name).and_then(|p| self.plaintext_size(&p, &entry.attr));
            entry.attr.size = size.unwrap_or_else(|e| {
                tracing::warn!(container = self.core.inner.name(), error = %e, "readdir: no plaintext size");
                0
            });
        }
        Ok((entries, next))
    }

    fn open(&self, path: &NsPath, options: OpenOptions, mode: u32) -> Result<Arc<dyn Object>> {
        // Truncation is done here (a fresh header), never by the backend, which
        // would leave an empty file without one; without write access the backend
        // refuses it as it would anyway.
        let replace = options.truncate && options.write;
        let inner_options = OpenOptions { truncate: options.truncate && !options.write, ..options };
        let inner = self.core.inner.open(path, inner_options, mode)?;
        let file = self.file_state(&*inner)?;
        if replace {
            file.replace(&*inner, path)?;
        } else if options.write {
            file.prepare_writer(&*inner, path)?;
        } else {
            drop(file.loaded(&*inner, path)?);
        }
        Ok(Arc::new(EncryptedObject { inner, file }))
    }

    fn remove(&self, path: &NsPath, recursive: bool) -> Result<()> {
        self.core.inner.remove(path, recursive)
    }

    fn rename(&self, from: &NsPath, to: &NsPath) -> Result<()> {
        // The AAD binds the file id in the header, not the path: renames are free.
        self.core.inner.rename(from, to)
    }

    fn replace(&self, from: &NsPath, to: &NsPath) -> Result<()> {
        // As for rename: the header binds the file id, not the path, and the file keeps
        // its header, key version and nonce state; the replaced file's go with it.
        self.core.inner.replace(from, to)
    }

    fn truncate(&self, path: &NsPath, size: u64) -> Result<()> {
        let options = OpenOptions { write: true, truncate: size == 0, ..OpenOptions::default() };
        let object = self.open(path, options, 0)?;
        if size > 0 { object.truncate(size) } else { Ok(()) }
    }

    fn sync(&self) -> Result<()> {
        self.core.inner.sync()
    }
}
