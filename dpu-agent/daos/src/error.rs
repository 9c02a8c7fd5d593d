//! DAOS return codes, named the way DAOS names them.
//!
//! `daos_*` calls return a negative DER code (`-DER_NONEXIST`); `dfs_*` calls a positive
//! errno. Both are kept as they came, with the call that returned them, so a message
//! reads `daos_pool_connect2: DER_NONEXIST (The specified entity does not exist)`.

use std::fmt;

/// DER codes the backend acts on (daos_errno.h: GURT errors from 1000, DAOS from 2000).
/// `tests::der_numbers_match_libgurt` checks each against `d_errstr` of the loaded library.
pub mod der {
    pub const NO_PERM: i32 = 1001;
    pub const NO_HDL: i32 = 1002;
    pub const INVAL: i32 = 1003;
    pub const EXIST: i32 = 1004;
    pub const NONEXIST: i32 = 1005;
    pub const UNREACH: i32 = 1006;
    pub const NOSPACE: i32 = 1007;
    pub const TIMEDOUT: i32 = 1011;
    pub const BUSY: i32 = 1012;
    pub const AGAIN: i32 = 1013;
    pub const HG: i32 = 1020;
    pub const EXCLUDED: i32 = 1032;
    pub const GRPVER: i32 = 1036;
    pub const STALE: i32 = 2007;
    pub const NOTLEADER: i32 = 2008;
    pub const TX_RESTART: i32 = 2025;
    pub const AGENT_INCOMPAT: i32 = 2029;
    pub const AGENT_COMM: i32 = 2034;
    pub const NO_SERVICE: i32 = 2039;
    pub const NONEXIST_CONT: i32 = 2050;
}

/// What a DAOS call returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// A DER code from a `daos_*` call, as a positive number (`der::NONEXIST`).
    Der(i32),
    /// An errno from a `dfs_*` call.
    Errno(i32),
    /// DAOS did not answer the call by its deadline (`crate::deadline`): with every
    /// engine gone libdaos retries without end and returns nothing.
    NoAnswer,
}

/// A failed DAOS call: which function, what it returned, and the DAOS name of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub call: &'static str,
    pub code: Code,
    /// `DER_NONEXIST`, `ENOENT`...
    pub name: String,
    /// DAOS's or the C library's one-line description.
    pub description: String,
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", self.call, self.name, self.description)
    }
}

impl std::error::Error for CallError {}

impl CallError {
    /// The errno this failure means to the C library (DAOS's own `daos_der2errno` for the
    /// DER codes we map; EIO for the rest).
    pub fn errno(&self) -> i32 {
        match self.code {
            Code::Errno(e) => e,
            Code::Der(der::NO_PERM) => libc::EPERM,
            Code::Der(der::INVAL) => libc::EINVAL,
            Code::Der(der::EXIST) => libc::EEXIST,
            Code::Der(der::NONEXIST) => libc::ENOENT,
            Code::Der(der::NOSPACE) => libc::ENOSPC,
            Code::Der(der::UNREACH) => libc::EHOSTUNREACH,
            Code::Der(der::TIMEDOUT) => libc::ETIMEDOUT,
            Code::Der(_) => libc::EIO,
            Code::NoAnswer => libc::ETIMEDOUT,
        }
    }
}

/// The symbolic name of an errno (what `dfs_*` return), for messages.
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENOTSUP => "ENOTSUP",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EPROTO => "EPROTO",
        libc::ENODATA => "ENODATA",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EDQUOT => "EDQUOT",
        libc::ESTALE => "ESTALE",
        libc::EAGAIN => "EAGAIN",
        _ => "errno",
    }
}
