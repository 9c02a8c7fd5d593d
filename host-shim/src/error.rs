//! The shim's error type.

use dpuio_proto::reason::{METADATA_KEY, Reason};

/// What went wrong talking to the agent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The agent address is not usable.
    #[error("invalid agent address {address:?}: {reason}")]
    Address { address: String, reason: String },
    /// No connection to the agent.
    #[error(
        "cannot reach the agent at {address}: {reason} (is `dpu-agent serve` running there? set --agent or DPUIO_AGENT)"
    )]
    Connect { address: String, reason: String },
    /// The client certificate, key or CA could not be used.
    #[error("TLS: {reason}")]
    Tls { reason: String },
    /// The agent answered with an error; `message` is its reason for people, `reason`
    /// the finer cause under `code` when the agent named one (see
    /// [`dpuio_proto::reason`]).
    #[error("{op}: {}: {message}", code_name(*code))]
    Agent { op: String, code: tonic::Code, message: String, reason: Option<Reason> },
    /// The data plane could not be set up or used.
    #[error("{op}: {reason}")]
    DataPlane { op: String, reason: String },
    /// The agent completed a data-plane request with an error.
    #[error("{op}: {} ({status:?})", status.describe())]
    Io { op: String, status: dpuio_proto::wire::Status },
    /// The agent answered something this shim cannot use.
    #[error("{op}: unexpected answer from the agent: {reason}")]
    Protocol { op: String, reason: String },
}

/// Result with the shim [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn from_status(op: impl Into<String>, status: tonic::Status) -> Error {
        let reason = status.metadata().get(METADATA_KEY).and_then(|v| v.to_str().ok()).and_then(Reason::parse);
        Error::Agent { op: op.into(), code: status.code(), message: status.message().to_owned(), reason }
    }

    /// An error the agent answered on the data plane (code and reason as there).
    pub(crate) fn agent(op: impl Into<String>, code: dpuio_proto::wire::CodeWord, message: String) -> Error {
        Error::Agent { op: op.into(), code: tonic::Code::from_i32(i32::from(code.code)), message, reason: code.reason }
    }

    /// The `errno` a POSIX program expects for this error (the `LD_PRELOAD` library and
    /// FUSE answer with it). Capability and tenancy denials are `EACCES`; data that
    /// failed an integrity check is `EIO` (none of it was released); an agent that
    /// cannot be reached is `EIO` too, since a file system has no better word for it.
    pub fn errno(&self) -> i32 {
        use rustix::io::Errno;
        let e = match self {
            Error::Agent { code, reason: Some(reason), .. } => match (code, reason) {
                (_, Reason::NotADirectory) => Errno::NOTDIR,
                (_, Reason::IsADirectory) => Errno::ISDIR,
                (_, Reason::DirectoryNotEmpty) => Errno::NOTEMPTY,
                (_, Reason::NoSpace) => Errno::NOSPC,
                _ => grpc_errno(*code),
            },
            Error::Agent { code, .. } => grpc_errno(*code),
            Error::Io { status, .. } => return io_errno(*status),
            Error::Address { .. } | Error::Tls { .. } => Errno::INVAL,
            Error::Connect { .. } | Error::DataPlane { .. } | Error::Protocol { .. } => Errno::IO,
        };
        e.raw_os_error()
    }

    /// The gRPC code, for errors that came from the agent: its answer's code, or for a
    /// data-plane completion whose storage does not answer, `UNAVAILABLE` (the same
    /// condition as a gRPC call answered so).
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Agent { code, .. } => Some(*code),
            Error::Io { status: dpuio_proto::wire::Status::Unavailable, .. } => Some(tonic::Code::Unavailable),
            _ => None,
        }
    }
}

fn grpc_errno(code: tonic::Code) -> rustix::io::Errno {
    use rustix::io::Errno;
    use tonic::Code::*;
    match code {
        NotFound => Errno::NOENT,
        AlreadyExists => Errno::EXIST,
        PermissionDenied | Unauthenticated => Errno::ACCESS,
        InvalidArgument | OutOfRange => Errno::INVAL,
        // The agent's limits (handles, sessions): too many open files, as a kernel says.
        ResourceExhausted => Errno::MFILE,
        DeadlineExceeded => Errno::TIMEDOUT,
        Unimplemented => Errno::NOSYS,
        Cancelled => Errno::INTR,
        // FAILED_PRECONDITION without a reason: a session that lapsed, a missing key.
        Ok | Unknown | FailedPrecondition | Aborted | Internal | Unavailable | DataLoss => Errno::IO,
    }
}

/// The `errno` of a data-plane completion status (0 for `Ok`).
pub(crate) fn io_errno(status: dpuio_proto::wire::Status) -> i32 {
    use dpuio_proto::wire::Status as S;
    use rustix::io::Errno;
    let e = match status {
        S::Ok => return 0,
        S::Access => Errno::ACCESS,
        S::OutOfRange | S::Malformed | S::BadRegion | S::TooLarge => Errno::INVAL,
        S::BadHandle => Errno::BADF,
        S::Busy | S::Lost => Errno::AGAIN,
        S::Cancelled => Errno::INTR,
        // Integrity: stored data failed authentication; nothing of it was released.
        _ => Errno::IO,
    };
    e.raw_os_error()
}

fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(code: tonic::Code, reason: Option<Reason>) -> Error {
        Error::Agent { op: "op".into(), code, message: "m".into(), reason }
    }

    #[test]
    fn errno_follows_the_reason_then_the_code() {
        use rustix::io::Errno;
        let cases = [
            (agent(tonic::Code::NotFound, None), Errno::NOENT),
            (agent(tonic::Code::AlreadyExists, None), Errno::EXIST),
            (agent(tonic::Code::PermissionDenied, None), Errno::ACCESS),
            (agent(tonic::Code::FailedPrecondition, Some(Reason::NotADirectory)), Errno::NOTDIR),
            (agent(tonic::Code::FailedPrecondition, Some(Reason::IsADirectory)), Errno::ISDIR),
            (agent(tonic::Code::FailedPrecondition, Some(Reason::DirectoryNotEmpty)), Errno::NOTEMPTY),
            (agent(tonic::Code::FailedPrecondition, None), Errno::IO),
            (agent(tonic::Code::DataLoss, None), Errno::IO),
            (Error::Io { op: "read".into(), status: dpuio_proto::wire::Status::Integrity }, Errno::IO),
            // Storage gone: to a POSIX program an I/O error, as any storage failure.
            (Error::Io { op: "read".into(), status: dpuio_proto::wire::Status::Unavailable }, Errno::IO),
            (Error::Io { op: "write".into(), status: dpuio_proto::wire::Status::Access }, Errno::ACCESS),
        ];
        for (e, want) in cases {
            assert_eq!(e.errno(), want.raw_os_error(), "{e:?}");
        }
    }

    #[test]
    fn a_status_with_reason_metadata_keeps_it() {
        let mut status = tonic::Status::failed_precondition("/d: directory not empty");
        status.metadata_mut().insert(METADATA_KEY, tonic::metadata::MetadataValue::from_static("directory-not-empty"));
        let e = Error::from_status("remove /d", status);
        assert_eq!(e.errno(), rustix::io::Errno::NOTEMPTY.raw_os_error());
        let unknown = tonic::Status::failed_precondition("x");
        assert_eq!(Error::from_status("x", unknown).errno(), rustix::io::Errno::IO.raw_os_error());
    }
}
