//! The agent's error type and its one mapping to gRPC statuses.
//!
//! Every message names the path, id or field concerned and, where there is one, what
//! to do about it: the host is untrusted, but its operator still deserves to know why.

use dpuio_backend::Error as BackendError;
use dpuio_proto::reason::{METADATA_KEY, Reason};
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

/// Why the agent refused or failed a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backend refused or failed the operation.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A request field is malformed or out of range.
    #[error("{field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },
    /// The session id is not attached (never was, detached, or its lease lapsed).
    #[error("session {id:#018x} is not attached (it was detached, its lease lapsed, or the id is wrong): attach again")]
    NoSession { id: u64 },
    /// A namespace call came before `Mount`.
    #[error("session {id:#018x} has not mounted its container: call Mount first")]
    NotMounted { id: u64 },
    /// The handle is not open in this session.
    #[error("handle {handle:#018x} is not open in this session")]
    NoHandle { handle: u64 },
    /// The caller may not do this (another tenant's container, a write through a
    /// read-only handle, an unknown tenant).
    #[error("{0}")]
    PermissionDenied(String),
    /// The caller's identity or capability token was not accepted.
    #[error("{0}")]
    Unauthenticated(String),
    /// A limit was reached; the message names the limit and its value.
    #[error("{what}: limit of {limit} reached")]
    Limit { what: &'static str, limit: u64 },
    /// The agent is shutting down or draining and takes no new work.
    #[error("the agent is {0}; retry against another agent or later")]
    Unavailable(&'static str),
    /// A request named a tenant that this agent does not serve.
    #[error("tenant {tenant:?} is not configured on this agent: check the name against the agent's config")]
    UnknownTenant { tenant: String },
    /// A key request (rotate, status) for a tenant without inline encryption.
    #[error(
        "tenant {tenant:?} does not encrypt its files, so it has no keys to rotate or list: turn encryption on \
         with [tenants.encryption] in the agent's config and restart the agent (it applies to new files)"
    )]
    NotEncrypted { tenant: String },
    /// A bug or an environment failure inside the agent.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Result with the agent [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { field, reason: reason.into() }
    }

    /// The gRPC status code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            Error::Backend(e) => backend_code(e),
            Error::InvalidArgument { .. } => Code::InvalidArgument,
            Error::NoSession { .. } | Error::NotMounted { .. } => Code::FailedPrecondition,
            Error::NoHandle { .. } | Error::UnknownTenant { .. } => Code::NotFound,
            Error::NotEncrypted { .. } => Code::FailedPrecondition,
            Error::PermissionDenied(_) => Code::PermissionDenied,
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::Limit { .. } => Code::ResourceExhausted,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Internal(_) => Code::Internal,
        }
    }
}

/// The finer reason under [`Error::code`] that POSIX clients need (see
/// [`dpuio_proto::reason`]); `None` where the code says enough.
pub fn reason(e: &Error) -> Option<Reason> {
    if let Error::NoSession { .. } = e {
        return Some(Reason::NoSession);
    }
    let Error::Backend(b) = e else { return None };
    match b {
        BackendError::NotADirectory { .. } => Some(Reason::NotADirectory),
        BackendError::IsADirectory { .. } => Some(Reason::IsADirectory),
        BackendError::DirectoryNotEmpty { .. } => Some(Reason::DirectoryNotEmpty),
        BackendError::Io { .. } if backend_code(b) == Code::ResourceExhausted => Some(Reason::NoSpace),
        // Not "the agent is gone": a client resending at once would wait on DAOS again.
        BackendError::Unavailable { .. } => Some(Reason::StorageUnavailable),
        _ => None,
    }
}

fn backend_code(e: &BackendError) -> Code {
    match e {
        BackendError::InvalidPath { .. } | BackendError::InvalidArgument(_) | BackendError::InvalidRename { .. } => {
            Code::InvalidArgument
        }
        BackendError::NotFound { .. } | BackendError::NoSuchContainer { .. } => Code::NotFound,
        BackendError::AlreadyExists { .. } => Code::AlreadyExists,
        BackendError::NotADirectory { .. }
        | BackendError::IsADirectory { .. }
        | BackendError::DirectoryNotEmpty { .. }
        | BackendError::UnsupportedEntry { .. } => Code::FailedPrecondition,
        BackendError::AccessMode { .. } | BackendError::Denied { .. } => Code::PermissionDenied,
        BackendError::Unavailable { .. } => Code::Unavailable,
        // Inline encryption: stored data failed authentication; never "not found" or
        // "retry", and no plaintext of it was released.
        BackendError::Integrity { .. } => Code::DataLoss,
        // The tenant's key source lacks the key version the file needs.
        BackendError::Key { .. } => Code::FailedPrecondition,
        BackendError::Io { source, .. } => match source.raw_os_error() {
            Some(code) if code == 28 || code == 122 => Code::ResourceExhausted, // ENOSPC, EDQUOT
            _ => Code::Internal,
        },
        _ => Code::Internal,
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let code = e.code();
        if code == Code::Internal {
            tracing::error!(error = %e, "internal error answered to a client");
        }
        let mut status = Status::new(code, e.to_string());
        if let Some(r) = reason(&e) {
            status.metadata_mut().insert(METADATA_KEY, MetadataValue::from_static(r.as_str()));
        }
        status
    }
}
