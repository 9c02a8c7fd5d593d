//! Key types and key sources.
//!
//! Two kinds of key exist, both 256-bit AES keys:
//!
//! - a tenant's **key-encryption key** ([`Kek`]), named by tenant and version, that
//!   comes from a [`KeySource`] and only ever wraps data keys;
//! - a file's **data key** ([`DataKey`]), random, made when the file is created, that
//!   seals the file's blocks and its header tag, and is stored only wrapped.
//!
//! Key bytes live in one heap allocation each (so moving a key never copies them),
//! are wiped when the key is dropped, and have no `Clone`. `Debug` prints the tenant
//! and version but never the bytes. The only I/O in this crate is reading key files,
//! here.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use zeroize::{Zeroize, Zeroizing};

use crate::error::{Error, Result};
use crate::provider::{CryptoProvider, KEY_BYTES};

/// 32 secret bytes in their own allocation, wiped on drop. Crate-private: the public
/// key types wrap it and expose the bytes only to providers.
pub(crate) struct Secret(Box<[u8; KEY_BYTES]>);

impl Secret {
    pub(crate) fn zeroed() -> Self {
        Self(Box::new([0; KEY_BYTES]))
    }

    pub(crate) fn random(provider: &dyn CryptoProvider) -> Result<Self> {
        let mut secret = Self::zeroed();
        provider.fill_random(&mut secret.0[..])?;
        Ok(secret)
    }

    pub(crate) fn bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8; KEY_BYTES] {
        &mut self.0
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// A tenant's key-encryption key (KEK) of one version. It wraps and unwraps the data
/// keys of that tenant's files and is never used on data blocks.
///
/// No `Clone` (share it as `Arc<Kek>`); `Debug` shows tenant and version only.
pub struct Kek {
    tenant: String,
    version: u32,
    secret: Secret,
}

impl Kek {
    /// A key-encryption key from 32 bytes the caller holds (for example from a KMS).
    /// The caller wipes its own copy.
    pub fn from_bytes(tenant: &str, version: u32, key: &[u8]) -> Result<Self> {
        if key.len() != KEY_BYTES {
            return Err(Error::BufferSize { what: "key-encryption key", got: key.len(), expected: KEY_BYTES });
        }
        let mut secret = Secret::zeroed();
        secret.bytes_mut().copy_from_slice(key);
        Ok(Self { tenant: tenant.to_owned(), version, secret })
    }

    /// A fresh random key-encryption key (tests, benchmarks, key generation tools).
    pub fn generate(provider: &dyn CryptoProvider, tenant: &str, version: u32) -> Result<Self> {
        Ok(Self { tenant: tenant.to_owned(), version, secret: Secret::random(provider)? })
    }

    /// Read a key file: 32 raw bytes, or 64 hexadecimal digits (either case) with an
    /// optional trailing `\n`.
    ///
    /// Refused, before the content is read: a file whose mode lets group or others
    /// read, write or execute it (`mode & 0o077 != 0`, as ssh does for private keys;
    /// [`Error::KeyFilePermissions`] says to `chmod 600` it), and anything but a regular
    /// file. The checks use the opened file (`fstat`), so a file swapped between check
    /// and read cannot slip through. Symbolic links are followed: Kubernetes secret
    /// volumes are links, and the target's mode is what is checked. An all-zero key is
    /// refused too: it is what `truncate -s 32` makes, never a key.
    pub fn from_file(tenant: &str, version: u32, path: &Path) -> Result<Self> {
        Ok(Self { tenant: tenant.to_owned(), version, secret: read_key_file(path)? })
    }

    /// The tenant this key belongs to.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The key's version.
    pub fn version(&self) -> u32 {
        self.version
    }

    pub(crate) fn secret(&self) -> &Secret {
        &self.secret
    }
}

impl fmt::Debug for Kek {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kek").field("tenant", &self.tenant).field("version", &self.version).finish_non_exhaustive()
    }
}

/// A file's data key: random per file, stored only wrapped by a [`Kek`]. It never
/// leaves this crate in clear; [`crate::FileCipher`] holds it, prepared for the
/// provider. Public so that callers can name the type; it has no accessor.
pub struct DataKey {
    secret: Secret,
}

impl DataKey {
    /// A fresh random data key from the provider's random generator.
    pub fn generate(provider: &dyn CryptoProvider) -> Result<Self> {
        Ok(Self { secret: Secret::random(provider)? })
    }

    pub(crate) fn from_secret(secret: Secret) -> Self {
        Self { secret }
    }

    pub(crate) fn secret(&self) -> &Secret {
        &self.secret
    }
}

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DataKey(<redacted>)")
    }
}

/// Where key-encryption keys come from. The file source ([`FileKeySource`]) is the
/// first; a KMS or KMIP source implements the same trait (and may cache, which is why
/// keys come back as `Arc<Kek>`).
pub trait KeySource: Send + Sync {
    /// The key-encryption key of `tenant` at `key_version`; [`Error::KeyNotFound`]
    /// names both when the source does not have it.
    fn key_encryption_key(&self, tenant: &str, key_version: u32) -> Result<Arc<Kek>>;

    /// The versions this source knows for `tenant`, ascending (empty if none).
    fn key_versions(&self, tenant: &str) -> Result<Vec<u32>>;

    /// The version new files of `tenant` are wrapped under: the highest known. Files
    /// keep the version they were wrapped under until they are re-wrapped.
    fn current_key_version(&self, tenant: &str) -> Result<u32> {
        self.key_versions(tenant)?.last().copied().ok_or_else(|| Error::NoKeys { tenant: tenant.to_owned() })
    }

    /// Key rotation: read the key file at `path` (checked as [`Kek::from_file`] says)
    /// as `tenant`'s next key version, one above the highest it has, and return that
    /// version. Known versions never change. A source that cannot grow while the
    /// agent runs refuses with [`Error::FixedKeySource`], the default.
    fn add_next_key_file(&self, tenant: &str, path: &Path) -> Result<u32> {
        let _ = path;
        Err(Error::FixedKeySource { tenant: tenant.to_owned() })
    }
}

/// Key-encryption keys read from files, one file per tenant and version.
///
/// Files are read and checked when they are added, so a bad key file stops the agent
/// at start (or `check-config`), not at the first file open. A version is immutable:
/// a new key is a new version in a new file.
#[derive(Default)]
pub struct FileKeySource {
    tenants: BTreeMap<String, BTreeMap<u32, (PathBuf, Arc<Kek>)>>,
}

impl FileKeySource {
    /// An empty source.
    pub fn new() -> Self {
        Self::default()
    }

    /// Read the key file at `path` as `tenant`'s key of `key_version`.
    pub fn add_key_file(&mut self, tenant: &str, key_version: u32, path: impl Into<PathBuf>) -> Result<()> {
        let path = path.into();
        if self.key_file(tenant, key_version).is_some() {
            return Err(Error::DuplicateKey { tenant: tenant.to_owned(), key_version });
        }
        let kek = Kek::from_file(tenant, key_version, &path)?;
        self.tenants.entry(tenant.to_owned()).or_default().insert(key_version, (path, Arc::new(kek)));
        Ok(())
    }

    /// The file a key was read from.
    pub fn key_file(&self, tenant: &str, key_version: u32) -> Option<&Path> {
        self.tenants.get(tenant)?.get(&key_version).map(|(path, _)| path.as_path())
    }

    /// Add `secret`, read from `path`, as `tenant`'s version after its highest (1 if
    /// it has none); a key equal to one of its known versions is refused
    /// ([`Error::KeyReused`]).
    fn add_next(&mut self, tenant: &str, path: &Path, secret: Secret) -> Result<u32> {
        let versions = self.tenants.entry(tenant.to_owned()).or_default();
        for (version, (_, kek)) in versions.iter() {
            if aws_lc_rs::constant_time::verify_slices_are_equal(kek.secret().bytes(), secret.bytes()).is_ok() {
                return Err(Error::KeyReused { tenant: tenant.to_owned(), key_version: *version });
            }
        }
        let highest = versions.keys().next_back().copied().unwrap_or(0);
        let version = highest.checked_add(1).ok_or(Error::OutOfRange {
            what: "key version",
            value: u64::from(highest) + 1,
            max: u64::from(u32::MAX),
        })?;
        let kek = Kek { tenant: tenant.to_owned(), version, secret };
        versions.insert(version, (path.to_owned(), Arc::new(kek)));
        Ok(version)
    }
}

impl KeySource for FileKeySource {
    fn key_encryption_key(&self, tenant: &str, key_version: u32) -> Result<Arc<Kek>> {
        match self.tenants.get(tenant).and_then(|versions| versions.get(&key_version)) {
            Some((_, kek)) => Ok(Arc::clone(kek)),
            None => {
                Err(Error::KeyNotFound { tenant: tenant.to_owned(), key_version, known: self.key_versions(tenant)? })
            }
        }
    }

    fn key_versions(&self, tenant: &str) -> Result<Vec<u32>> {
        Ok(self.tenants.get(tenant).map(|versions| versions.keys().copied().collect()).unwrap_or_default())
    }
}

impl fmt::Debug for FileKeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (tenant, versions) in &self.tenants {
            for (version, (path, _)) in versions {
                map.entry(&format_args!("{tenant}/v{version}"), path);
            }
        }
        map.finish()
    }
}

/// A [`FileKeySource`] that takes new key versions while the agent runs
/// ([`KeySource::add_next_key_file`]): what key rotation adds the new key to.
///
/// Readers (a file open fetching its KEK) take a shared lock for a map lookup; a new
/// version is read and checked before it becomes visible, and known versions never
/// change, so a file that opened under a version keeps opening under it.
#[derive(Default)]
pub struct RotatingKeySource {
    files: RwLock<FileKeySource>,
}

impl RotatingKeySource {
    /// A source starting with the keys of `files` (read at start).
    pub fn new(files: FileKeySource) -> Self {
        Self { files: RwLock::new(files) }
    }

    /// The file a key was read from.
    pub fn key_file(&self, tenant: &str, key_version: u32) -> Option<PathBuf> {
        self.read().key_file(tenant, key_version).map(Path::to_owned)
    }

    fn read(&self) -> RwLockReadGuard<'_, FileKeySource> {
        // Plain data (maps of paths and Arcs), complete after every insert.
        self.files.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl KeySource for RotatingKeySource {
    fn key_encryption_key(&self, tenant: &str, key_version: u32) -> Result<Arc<Kek>> {
        self.read().key_encryption_key(tenant, key_version)
    }

    fn key_versions(&self, tenant: &str) -> Result<Vec<u32>> {
        self.read().key_versions(tenant)
    }

    fn add_next_key_file(&self, tenant: &str, path: &Path) -> Result<u32> {
        // Read outside the lock (a slow file system must not hold up file opens); the
        // version is chosen and inserted under one write lock, so two rotations never
        // get the same one.
        let secret = read_key_file(path)?;
        self.files.write().unwrap_or_else(PoisonError::into_inner).add_next(tenant, path, secret)
    }
}

impl fmt::Debug for RotatingKeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.read().fmt(f)
    }
}

/// The longest key file accepted: 64 hex digits and `\n`. One byte more is read to
/// tell "too long" from "exactly this long".
const MAX_KEY_FILE_BYTES: usize = 2 * KEY_BYTES + 1;

/// Read a 256-bit key from a file; the checks are listed at [`Kek::from_file`].
pub(crate) fn read_key_file(path: &Path) -> Result<Secret> {
    let read_error = |source| Error::KeyFileRead { path: path.to_owned(), source };
    let format_error = |reason| Error::KeyFileFormat { path: path.to_owned(), reason };
    let mut file = File::open(path).map_err(read_error)?;
    let metadata = file.metadata().map_err(read_error)?;
    if !metadata.is_file() {
        return Err(format_error("not a regular file"));
    }
    let mode = metadata.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(Error::KeyFilePermissions { path: path.to_owned(), mode });
    }
    let mut content = Zeroizing::new([0u8; MAX_KEY_FILE_BYTES + 1]);
    let mut len = 0;
    while len < content.len() {
        match file.read(&mut content[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_error(e)),
        }
    }
    parse_key(&content[..len]).map_err(format_error)
}

/// The two accepted forms of a key file's content. Errors never quote the content.
fn parse_key(content: &[u8]) -> std::result::Result<Secret, &'static str> {
    let mut secret = Secret::zeroed();
    match content.len() {
        KEY_BYTES => secret.bytes_mut().copy_from_slice(content),
        n if n == 2 * KEY_BYTES || (n == 2 * KEY_BYTES + 1 && content[n - 1] == b'\n') => {
            for (out, pair) in secret.bytes_mut().iter_mut().zip(content[..2 * KEY_BYTES].chunks_exact(2)) {
                let (Some(high), Some(low)) = (hex_digit(pair[0]), hex_digit(pair[1])) else {
                    return Err("64 characters but not all hexadecimal digits");
                };
                *out = high << 4 | low;
            }
        }
        0 => return Err("the file is empty"),
        n if n > MAX_KEY_FILE_BYTES => return Err("the file is longer than any accepted form"),
        _ => return Err("its length is neither 32 bytes nor 64 hex digits"),
    }
    if secret.bytes().iter().all(|&b| b == 0) {
        return Err("all bytes are zero");
    }
    Ok(secret)
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::io::Write;

    use super::*;
    use crate::provider::AWS_LC_RS;

    fn key_file(dir: &tempfile::TempDir, name: &str, content: &[u8], mode: u32) -> PathBuf {
        let path = dir.path().join(name);
        let mut file = File::create(&path).unwrap();
        file.write_all(content).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191A1B1C1D1E1F";

    #[test]
    fn raw_and_hex_forms_read_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let raw: Vec<u8> = (0u8..32).collect();
        let forms = [
            key_file(&dir, "raw", &raw, 0o600),
            key_file(&dir, "hex", HEX.as_bytes(), 0o400),
            key_file(&dir, "hex-nl", format!("{HEX}\n").as_bytes(), 0o600),
        ];
        for path in &forms {
            let secret = read_key_file(path).unwrap();
            assert_eq!(&secret.bytes()[..], &raw[..], "{}", path.display());
        }
    }

    #[test]
    fn key_file_readable_by_others_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = key_file(&dir, "k", HEX.as_bytes(), 0o644);
        let err = read_key_file(&path).err().unwrap();
        assert!(matches!(err, Error::KeyFilePermissions { mode: 0o644, .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains(&format!("chmod 600 {}", path.display())), "{message}");
        assert!(message.contains("0644"), "{message}");
        for mode in [0o640, 0o604, 0o620, 0o610, 0o601] {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            assert!(matches!(read_key_file(&path), Err(Error::KeyFilePermissions { .. })), "{mode:o}");
        }
    }

    #[test]
    fn malformed_key_files_are_refused_without_quoting_them() {
        let dir = tempfile::tempdir().unwrap();
        let bad_hex = format!("{}zz", &HEX[..62]);
        let cases: [(&str, &[u8]); 6] = [
            ("empty", b""),
            ("short", &[7u8; 31]),
            ("raw-nl", &[7u8; 33]),
            ("zeros", &[0u8; 32]),
            ("bad-hex", bad_hex.as_bytes()),
            ("long", &[b'a'; 200]),
        ];
        for (name, content) in cases {
            let path = key_file(&dir, name, content, 0o600);
            let err = read_key_file(&path).err().unwrap();
            assert!(matches!(err, Error::KeyFileFormat { .. }), "{name}: {err:?}");
            assert!(!err.to_string().contains(&HEX[..20]), "{name}");
        }
        let missing = dir.path().join("missing");
        assert!(matches!(read_key_file(&missing), Err(Error::KeyFileRead { .. })));
        assert!(matches!(
            read_key_file(dir.path()),
            Err(Error::KeyFileFormat { .. } | Error::KeyFilePermissions { .. })
        ));
    }

    #[test]
    fn file_source_names_tenant_and_version_when_a_key_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let mut source = FileKeySource::new();
        source.add_key_file("vision", 1, key_file(&dir, "v1", HEX.as_bytes(), 0o600)).unwrap();
        source.add_key_file("vision", 3, key_file(&dir, "v3", &[9u8; 32], 0o600)).unwrap();
        assert!(matches!(
            source.add_key_file("vision", 3, dir.path().join("v3")),
            Err(Error::DuplicateKey { key_version: 3, .. })
        ));
        assert_eq!(source.key_versions("vision").unwrap(), [1, 3]);
        assert_eq!(source.current_key_version("vision").unwrap(), 3);
        assert_eq!(source.key_encryption_key("vision", 1).unwrap().version(), 1);
        let err = source.key_encryption_key("vision", 2).err().unwrap();
        let message = err.to_string();
        assert!(
            message.contains("\"vision\"") && message.contains("version 2") && message.contains("[1, 3]"),
            "{message}"
        );
        assert!(matches!(source.current_key_version("nlp"), Err(Error::NoKeys { .. })));
        assert!(format!("{source:?}").contains("vision/v3"));
    }

    #[test]
    fn rotating_source_adds_the_next_version_and_refuses_bad_or_reused_keys() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = FileKeySource::new();
        files.add_key_file("vision", 2, key_file(&dir, "v2", HEX.as_bytes(), 0o600)).unwrap();
        assert!(matches!(files.add_next_key_file("vision", &dir.path().join("v2")), Err(Error::FixedKeySource { .. })));
        let source = RotatingKeySource::new(files);
        let before = source.key_encryption_key("vision", 2).unwrap();

        let v3 = key_file(&dir, "v3", &[3u8; 32], 0o600);
        assert_eq!(source.add_next_key_file("vision", &v3).unwrap(), 3);
        assert_eq!(source.key_versions("vision").unwrap(), [2, 3]);
        assert_eq!(source.current_key_version("vision").unwrap(), 3);
        assert_eq!(source.key_file("vision", 3).unwrap(), v3);
        // Known versions do not change.
        assert!(Arc::ptr_eq(&before, &source.key_encryption_key("vision", 2).unwrap()));

        // Refused, and nothing added: loose mode, bad content, a key already known.
        let loose = key_file(&dir, "loose", &[4u8; 32], 0o640);
        assert!(matches!(source.add_next_key_file("vision", &loose), Err(Error::KeyFilePermissions { .. })));
        let short = key_file(&dir, "short", &[4u8; 31], 0o600);
        assert!(matches!(source.add_next_key_file("vision", &short), Err(Error::KeyFileFormat { .. })));
        let again = key_file(&dir, "again", format!("{HEX}\n").as_bytes(), 0o600);
        let err = source.add_next_key_file("vision", &again).unwrap_err();
        assert!(matches!(err, Error::KeyReused { key_version: 2, .. }), "{err:?}");
        assert!(err.to_string().contains("\"vision\"") && err.to_string().contains("version 2"), "{err}");
        assert_eq!(source.key_versions("vision").unwrap(), [2, 3]);

        // A tenant without keys starts at version 1; tenants do not share versions.
        assert_eq!(source.add_next_key_file("nlp", &key_file(&dir, "n1", &[5u8; 32], 0o600)).unwrap(), 1);
        assert_eq!(source.add_next_key_file("vision", &key_file(&dir, "v4", &[6u8; 32], 0o600)).unwrap(), 4);
        assert!(format!("{source:?}").contains("vision/v4"));
    }

    #[test]
    fn debug_output_never_shows_key_bytes() {
        let kek = Kek::from_bytes("t", 7, &[0xab; 32]).unwrap();
        let data = DataKey::generate(&AWS_LC_RS).unwrap();
        for text in [format!("{kek:?}"), format!("{data:?}")] {
            assert!(!text.contains("ab, ab") && !text.contains("171") && !text.contains("abab"), "{text}");
        }
        assert!(format!("{kek:?}").contains("version: 7"));
        assert!(Kek::from_bytes("t", 1, &[1; 31]).is_err());
    }
}
