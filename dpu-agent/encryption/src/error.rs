//! What the wrapper reports: `dpuio_crypto` errors about a file mapped to backend
//! errors, in one place, so every room names the same failure the same way.
//!
//! The lowest room: it names no other.

use dpuio_backend::{Error, NsPath};
use dpuio_crypto as crypto;

/// Map a crate error about `path` to a backend error.
pub(crate) fn crypto_error(path: &NsPath, e: crypto::Error) -> Error {
    use crypto::Error as C;
    let path = path.to_string();
    match e {
        C::Integrity { block_index } => Error::Integrity {
            path,
            block_index: Some(block_index),
            detail: "the stored block was altered, moved or truncated; no plaintext of it was released".to_owned(),
        },
        C::HeaderIntegrity { .. } | C::WrongKey { .. } | C::MalformedHeader { .. } | C::UnsupportedVersion { .. } => {
            Error::Integrity { path, block_index: None, detail: e.to_string() }
        }
        C::KeyNotFound { .. }
        | C::NoKeys { .. }
        | C::KeyMismatch { .. }
        | C::DuplicateKey { .. }
        | C::KeyFilePermissions { .. }
        | C::KeyFileRead { .. }
        | C::KeyFileFormat { .. }
        | C::NonceBudgetExhausted { .. } => Error::Key { path, reason: e.to_string() },
        C::OutOfRange { .. } => Error::InvalidArgument(format!("{path}: {e}")),
        other => Error::Io {
            context: format!("{path}: inline encryption"),
            source: std::io::Error::other(other.to_string()),
        },
    }
}

/// A broken invariant of the wrapper (a bug, not the storage's doing) about `path`.
pub(crate) fn internal(path: &NsPath, what: &str) -> Error {
    Error::Io { context: format!("{path}: inline encryption"), source: std::io::Error::other(what.to_owned()) }
}
