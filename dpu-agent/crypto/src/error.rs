//! The one error type of this crate.
//!
//! No variant ever carries key bytes, plaintext or ciphertext: messages name the
//! tenant, key version, file, block index or key file path, and say what to do.

use std::path::PathBuf;

/// Everything this crate can report. Each variant says what went wrong and, where
/// there is one, what the operator should do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A key file can be read or written by its group or by others (`mode & 0o077 !=
    /// 0`). The file is refused before its content is read.
    #[error(
        "key file {} has mode {mode:04o}: group or others can access it; run `chmod 600 {}` \
         (for a Kubernetes secret volume set defaultMode: 0400)",
        path.display(),
        path.display()
    )]
    KeyFilePermissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits (`st_mode & 0o7777`).
        mode: u32,
    },
    /// A key file could not be opened or read.
    #[error("cannot read key file {}: {source}", path.display())]
    KeyFileRead {
        /// The key file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A key file does not hold a 256-bit key in one of the two accepted forms: 32 raw
    /// bytes, or 64 hexadecimal digits with an optional trailing newline. The content is
    /// never quoted.
    #[error(
        "key file {} is not a 256-bit key: {reason} (expected 32 raw bytes, or 64 hex digits and an \
         optional newline; make one with `head -c 32 /dev/urandom > FILE` or `openssl rand -hex 32 > FILE`)",
        path.display()
    )]
    KeyFileFormat {
        /// The key file.
        path: PathBuf,
        /// What is wrong with it, without quoting it.
        reason: &'static str,
    },
    /// The key source has no key-encryption key for this tenant and version.
    #[error(
        "no key-encryption key for tenant {tenant:?} version {key_version} (known versions: {known:?}); \
         add the key of that version to the tenant's key source"
    )]
    KeyNotFound {
        /// The tenant.
        tenant: String,
        /// The version asked for.
        key_version: u32,
        /// The versions the source does know for this tenant, ascending.
        known: Vec<u32>,
    },
    /// The key source has no key-encryption key at all for this tenant, so no new
    /// file of it can be encrypted.
    #[error("tenant {tenant:?} has no key-encryption key; add a key (file) for it to the key source")]
    NoKeys {
        /// The tenant.
        tenant: String,
    },
    /// A key source was given the same tenant and version twice.
    #[error("tenant {tenant:?} key version {key_version} is defined twice in the key source")]
    DuplicateKey {
        /// The tenant.
        tenant: String,
        /// The repeated version.
        key_version: u32,
    },
    /// The key source cannot take key versions while the agent runs (keys read once
    /// at start, or kept in a KMS, where they are rotated).
    #[error(
        "the key source of tenant {tenant:?} takes no new keys while the agent runs; add the key version to \
         its configuration and restart the agent"
    )]
    FixedKeySource {
        /// The tenant.
        tenant: String,
    },
    /// A new key version would hold the same key as a version the source already has:
    /// rotating to it would change nothing.
    #[error(
        "the new key for tenant {tenant:?} is the key of its version {key_version} already; a rotation needs \
         a fresh key (`head -c 32 /dev/urandom > FILE`, then `chmod 600 FILE`)"
    )]
    KeyReused {
        /// The tenant.
        tenant: String,
        /// The version that already holds this key.
        key_version: u32,
    },
    /// A file's data key did not unwrap: its tag did not verify under this tenant's
    /// key-encryption key of that version. Either the key is the wrong one (another
    /// key file behind the same version), or the file header was altered, or it belongs
    /// to another tenant, container or file. The two cases cannot be told apart, by
    /// design of authenticated encryption.
    #[error(
        "the key-encryption key of tenant {tenant:?} version {key_version} does not unwrap this file's \
         data key: wrong key for that version, or the file header was altered or copied from another \
         file, container or tenant"
    )]
    WrongKey {
        /// The tenant whose key was tried.
        tenant: String,
        /// The key version the header names.
        key_version: u32,
    },
    /// The key-encryption key handed in is not the one the header names (another
    /// tenant, or another version). Fetch the key by the header's tenant and version.
    #[error(
        "file is wrapped under tenant {expected_tenant:?} key version {expected_version}, \
         but the key given is tenant {got_tenant:?} version {got_version}"
    )]
    KeyMismatch {
        /// Tenant of the file (from the file context).
        expected_tenant: String,
        /// Key version the header names.
        expected_version: u32,
        /// Tenant of the key that was given.
        got_tenant: String,
        /// Version of the key that was given.
        got_version: u32,
    },
    /// A stored block failed authentication: its nonce, ciphertext or tag was
    /// altered, it was moved from another position, file, container or tenant, or it is
    /// shorter than a sealed block can be. No plaintext of it was released.
    #[error("integrity error in block {block_index}: the stored block was altered, moved or truncated")]
    Integrity {
        /// Index of the block (plaintext offset / block size).
        block_index: u64,
    },
    /// The file header's own tag failed: a header field (plaintext size, block size,
    /// versions, reserved bytes) was altered after the file's data key unwrapped.
    #[error("integrity error in the file header: a field was altered (tenant {tenant:?})")]
    HeaderIntegrity {
        /// The tenant of the file.
        tenant: String,
    },
    /// The bytes are not a file header this crate can read. The reason names the field.
    #[error("malformed file header: {reason}")]
    MalformedHeader {
        /// Which check failed.
        reason: &'static str,
    },
    /// The header is of a format version this build does not know.
    #[error("file header format version {version} is not supported (this build reads version {supported})")]
    UnsupportedVersion {
        /// Version found in the header.
        version: u16,
        /// Version this build reads and writes.
        supported: u16,
    },
    /// A block size outside what the format allows.
    #[error("invalid encryption block size {block_bytes}: it must be a power of two from {min} to {max} bytes")]
    InvalidBlockSize {
        /// The size asked for.
        block_bytes: u64,
        /// Smallest allowed.
        min: u32,
        /// Largest allowed.
        max: u32,
    },
    /// A tenant or container name that cannot be bound into the AAD (empty, or over
    /// [`crate::MAX_NAME_BYTES`]).
    #[error("invalid {what} name for encryption: {reason}")]
    InvalidName {
        /// `"tenant"` or `"container"`.
        what: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A plaintext offset or size past [`crate::MAX_PLAINTEXT_BYTES`], or a block
    /// index past the last block such a file can have.
    #[error("{what} {value} is past the largest encrypted file ({max} bytes)")]
    OutOfRange {
        /// What the number is (`"offset"`, `"block index"`, ...).
        what: &'static str,
        /// The number.
        value: u64,
        /// The largest plaintext size a file can have.
        max: u64,
    },
    /// A caller-supplied buffer has the wrong length. A programming error in the
    /// caller, reported instead of panicking.
    #[error("{what}: buffer of {got} bytes, expected {expected}")]
    BufferSize {
        /// Which buffer.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The length needed (or the largest allowed).
        expected: usize,
    },
    /// This data key has sealed as many blocks as random 96-bit nonces allow (NIST
    /// SP 800-38D §8.3: at most 2^32 invocations per key). Re-encrypt the file under a
    /// fresh data key.
    #[error("data key has sealed {seals} blocks, the limit for random nonces; re-encrypt the file")]
    NonceBudgetExhausted {
        /// Seals made with the key.
        seals: u64,
    },
    /// The random number generator failed (the OS or the crypto library would not
    /// give random bytes). Nothing was sealed.
    #[error("random number generator of provider {provider} failed")]
    Random {
        /// The provider's name.
        provider: &'static str,
    },
    /// The crypto library refused an operation this crate expected to succeed (for
    /// example a key it would not load). Not an integrity failure.
    #[error("crypto provider {provider} failed to {op}")]
    Provider {
        /// The provider's name.
        provider: &'static str,
        /// What it was asked to do.
        op: &'static str,
    },
    /// No provider of that name is built in.
    #[error("unknown crypto provider {name:?} (known: {known:?})")]
    UnknownProvider {
        /// The name asked for.
        name: String,
        /// Names of the built-in providers.
        known: &'static [&'static str],
    },
}

impl Error {
    /// Whether stored bytes failed authentication: [`Error::Integrity`],
    /// [`Error::HeaderIntegrity`], or [`Error::WrongKey`] (a wrong key and an altered
    /// wrapped key look the same). The agent maps these to one status (data loss),
    /// never to "not found" or "retry".
    pub fn is_integrity(&self) -> bool {
        matches!(self, Self::Integrity { .. } | Self::HeaderIntegrity { .. } | Self::WrongKey { .. })
    }
}

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
