//! Reading and writing key material and certificates.
//!
//! Writes go to a temporary file in the same directory, are synced, then renamed over
//! the target, so a crash leaves either the old file or the new one, never half a key.
//! Secret files are created with mode `0600` from the start (not chmod-ed afterwards, so
//! there is no window in which they are readable by others). Reading a secret checks the
//! mode of the *opened* file, so a swap between check and read cannot slip a readable
//! key past the check.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

/// Largest key or certificate file we read. PEM files here are a few KiB.
pub(crate) const MAX_FILE_BYTES: u64 = 64 * 1024;

/// Mode of secret files (private keys).
pub(crate) const SECRET_MODE: u32 = 0o600;

/// Mode of public files (certificates, public keys).
pub(crate) const PUBLIC_MODE: u32 = 0o644;

/// Mode of directories we create to hold keys.
pub(crate) const DIR_MODE: u32 = 0o700;

/// A problem with one file; the modules wrap it into their own error types.
#[derive(Debug)]
pub(crate) enum FileError {
    /// The operating system refused (not found, permission denied, disk full, ...).
    Io { path: PathBuf, source: io::Error },
    /// A secret file can be read by group or others.
    Permissions { path: PathBuf, mode: u32 },
    /// Not a regular file, or larger than [`MAX_FILE_BYTES`].
    NotAKeyFile { path: PathBuf, reason: &'static str },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FileError + '_ {
    move |source| FileError::Io { path: path.to_owned(), source }
}

/// Create `dir` (and parents) with mode `0700` if it does not exist.
pub(crate) fn create_dir(dir: &Path) -> Result<(), FileError> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir).map_err(io_err(dir))
}

/// Atomically replace `path` with `contents`, created with `mode`.
pub(crate) fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), FileError> {
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp-{}", std::process::id()));
    // A leftover from a crashed run of this same pid would make create_new fail.
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp)?;
        // The umask may have removed bits from `mode`; never added any, but set it
        // exactly so public files are readable regardless of umask.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(contents)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            File::open(parent)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(io_err(path))
}

/// Write a private key: mode `0600`.
pub(crate) fn write_secret(path: &Path, contents: &[u8]) -> Result<(), FileError> {
    write_atomic(path, contents, SECRET_MODE)
}

/// Write a certificate or public key: mode `0644`.
pub(crate) fn write_public(path: &Path, contents: &[u8]) -> Result<(), FileError> {
    write_atomic(path, contents, PUBLIC_MODE)
}

/// Read a private key, refusing one that group or others may read.
pub(crate) fn read_secret(path: &Path) -> Result<Zeroizing<String>, FileError> {
    let file = File::open(path).map_err(io_err(path))?;
    let meta = file.metadata().map_err(io_err(path))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(FileError::Permissions { path: path.to_owned(), mode });
    }
    read_limited(file, path, &meta).map(Zeroizing::new)
}

/// Read a certificate or public key.
pub(crate) fn read_public(path: &Path) -> Result<String, FileError> {
    let file = File::open(path).map_err(io_err(path))?;
    let meta = file.metadata().map_err(io_err(path))?;
    read_limited(file, path, &meta)
}

fn read_limited(file: File, path: &Path, meta: &fs::Metadata) -> Result<String, FileError> {
    if !meta.is_file() {
        return Err(FileError::NotAKeyFile { path: path.to_owned(), reason: "not a regular file" });
    }
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text).map_err(io_err(path))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(FileError::NotAKeyFile { path: path.to_owned(), reason: "larger than 64 KiB" });
    }
    Ok(text)
}

/// Whether `path` exists (following links); an error other than "not found" counts as
/// existing, so the following read reports it instead of us silently regenerating.
pub(crate) fn exists(path: &Path) -> bool {
    match fs::metadata(path) {
        Ok(_) => true,
        Err(e) => e.kind() != io::ErrorKind::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_round_trip_and_modes() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        create_dir(&sub).unwrap();
        assert_eq!(fs::metadata(&sub).unwrap().permissions().mode() & 0o777, DIR_MODE);
        let key = sub.join("k.key");
        write_secret(&key, b"secret").unwrap();
        assert_eq!(fs::metadata(&key).unwrap().permissions().mode() & 0o777, SECRET_MODE);
        assert_eq!(read_secret(&key).unwrap().as_str(), "secret");
        let public = sub.join("c.pem");
        write_public(&public, b"cert").unwrap();
        assert_eq!(fs::metadata(&public).unwrap().permissions().mode() & 0o777, PUBLIC_MODE);
        // Overwrite keeps the mode and replaces the contents.
        write_secret(&key, b"other").unwrap();
        assert_eq!(read_secret(&key).unwrap().as_str(), "other");
        // No temporary files left behind.
        assert_eq!(fs::read_dir(&sub).unwrap().count(), 2);
    }

    #[test]
    fn readable_secret_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k.key");
        write_secret(&key, b"secret").unwrap();
        for mode in [0o640, 0o604, 0o644] {
            fs::set_permissions(&key, fs::Permissions::from_mode(mode)).unwrap();
            match read_secret(&key) {
                Err(FileError::Permissions { mode: m, .. }) => assert_eq!(m, mode),
                other => panic!("mode {mode:o}: {other:?}"),
            }
        }
    }

    #[test]
    fn oversized_and_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.pem");
        write_public(&big, &vec![b'a'; MAX_FILE_BYTES as usize + 1]).unwrap();
        assert!(matches!(read_public(&big), Err(FileError::NotAKeyFile { .. })));
        assert!(matches!(read_public(dir.path()), Err(FileError::NotAKeyFile { .. })));
        assert!(!exists(&dir.path().join("missing")));
        assert!(exists(&big));
    }
}
