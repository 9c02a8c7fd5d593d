//! Finer reasons under a coarse gRPC code, for clients that must tell them apart.
//!
//! gRPC codes are coarse on purpose: "not a directory", "is a directory" and "directory
//! not empty" are all `FAILED_PRECONDITION`, and the message text is for people and may
//! change. A POSIX client (the shim's `LD_PRELOAD` library, a FUSE file system) must
//! still answer `ENOTDIR`, `EISDIR` or `ENOTEMPTY`. The agent therefore puts one stable,
//! lower-case token in the response metadata under [`METADATA_KEY`]; the code and the
//! message stay what they were, so clients that do not look keep working.

/// The ASCII metadata key (trailer) that carries a [`Reason`].
pub const METADATA_KEY: &str = "dpuio-reason";

/// A reason the agent names beside its gRPC code. New reasons may be added; a client
/// treats an unknown token as no reason at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// A path component that must be a directory is a file (`ENOTDIR`).
    NotADirectory,
    /// A file was expected but the path is a directory (`EISDIR`).
    IsADirectory,
    /// The directory to remove or replace has entries (`ENOTEMPTY`).
    DirectoryNotEmpty,
    /// The backend's storage or quota is full (`ENOSPC`).
    NoSpace,
    /// The agent does not know the session (it restarted, or the lease lapsed): a
    /// client may attach again and resume; the call was not run.
    NoSession,
    /// The agent is there but its storage is not (DAOS answered nothing by the call's
    /// deadline, or failed transiently past the retry bound): an `UNAVAILABLE` that a
    /// client must not take for a lost agent and resend at once.
    StorageUnavailable,
}

impl Reason {
    /// The token on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotADirectory => "not-a-directory",
            Reason::IsADirectory => "is-a-directory",
            Reason::DirectoryNotEmpty => "directory-not-empty",
            Reason::NoSpace => "no-space",
            Reason::NoSession => "no-session",
            Reason::StorageUnavailable => "storage-unavailable",
        }
    }

    /// The reason's number on the data plane, where an error record has no room for
    /// a token: 1 and up (0 is "no reason").
    pub fn number(self) -> u16 {
        match self {
            Reason::NotADirectory => 1,
            Reason::IsADirectory => 2,
            Reason::DirectoryNotEmpty => 3,
            Reason::NoSpace => 4,
            Reason::NoSession => 5,
            Reason::StorageUnavailable => 6,
        }
    }

    /// The reason a number names, `None` for 0 and numbers this build does not know.
    pub fn from_number(n: u16) -> Option<Reason> {
        ALL.into_iter().find(|r| r.number() == n)
    }

    /// The reason a token names, `None` for tokens this build does not know.
    pub fn parse(token: &str) -> Option<Reason> {
        ALL.into_iter().find(|r| r.as_str() == token)
    }
}

const ALL: [Reason; 6] = [
    Reason::NotADirectory,
    Reason::IsADirectory,
    Reason::DirectoryNotEmpty,
    Reason::NoSpace,
    Reason::NoSession,
    Reason::StorageUnavailable,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_round_trips_and_unknown_tokens_are_none() {
        for r in ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
            assert_eq!(Reason::from_number(r.number()), Some(r));
        }
        assert_eq!(Reason::from_number(0), None);
        assert_eq!(Reason::from_number(999), None);
        assert_eq!(Reason::parse("NOT-A-DIRECTORY"), None);
        assert_eq!(Reason::parse(""), None);
    }
}
