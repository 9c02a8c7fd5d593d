//! The shim's error type.

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
    /// The agent answered with an error; `message` is its reason.
    #[error("{op}: {}: {message}", code_name(*code))]
    Agent { op: String, code: tonic::Code, message: String },
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
        Error::Agent { op: op.into(), code: status.code(), message: status.message().to_owned() }
    }

    /// The gRPC code, for errors that came from the agent.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Agent { code, .. } => Some(*code),
            _ => None,
        }
    }
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
