//! A token's values: the operations and scope it grants, the effective rights of a
//! verified token, one concrete request, how an attenuation would widen its parent, and
//! why minting, attenuating or verifying failed ([`TokenError`]).

use std::fmt;
use std::ops::{BitAnd, BitOr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::SystemTime;

use super::{AUTHORIZER_MAX_TIME, MAX_BLOCKS, MAX_TOKEN_CHARS};
use crate::files::FileError;
use crate::names::{self, NameError};

/// An operation on a container's namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// Read file data, stat, list directories.
    Read,
    /// Write file data, truncate, sync.
    Write,
    /// Create files and directories.
    Create,
    /// Remove files and directories (rename needs delete on the source).
    Delete,
}

impl Op {
    /// All operations, in bit order.
    pub const ALL: [Op; 4] = [Op::Read, Op::Write, Op::Create, Op::Delete];

    /// The mask with only this operation.
    pub const fn mask(self) -> OpMask {
        match self {
            Op::Read => OpMask::READ,
            Op::Write => OpMask::WRITE,
            Op::Create => OpMask::CREATE,
            Op::Delete => OpMask::DELETE,
        }
    }

    /// The name used in tokens, config and the CLI.
    pub const fn as_str(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Create => "create",
            Op::Delete => "delete",
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Op {
    type Err = TokenError;

    fn from_str(s: &str) -> Result<Op, TokenError> {
        Op::ALL
            .into_iter()
            .find(|op| op.as_str() == s)
            .ok_or_else(|| TokenError::InvalidScope { reason: format!("unknown operation {:?}", names::quote(s)) })
    }
}

/// A set of [`Op`]s as a bitmask: `READ = 1`, `WRITE = 2`, `CREATE = 4`, `DELETE = 8`.
/// The bit values are part of the interface (they may travel in the data-plane wire
/// format).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct OpMask(pub(super) u8);

impl OpMask {
    /// No operation.
    pub const NONE: OpMask = OpMask(0);
    /// [`Op::Read`].
    pub const READ: OpMask = OpMask(1);
    /// [`Op::Write`].
    pub const WRITE: OpMask = OpMask(2);
    /// [`Op::Create`].
    pub const CREATE: OpMask = OpMask(4);
    /// [`Op::Delete`].
    pub const DELETE: OpMask = OpMask(8);
    /// Every operation.
    pub const ALL: OpMask = OpMask(15);

    /// The raw bits.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// The mask with these bits, or `None` if a bit names no operation.
    pub const fn from_bits(bits: u8) -> Option<OpMask> {
        if bits & !OpMask::ALL.0 == 0 { Some(OpMask(bits)) } else { None }
    }

    /// Whether every operation in `other` is in `self`.
    pub const fn contains(self, other: OpMask) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether `op` is in the mask.
    pub const fn has(self, op: Op) -> bool {
        self.contains(op.mask())
    }

    /// Whether the mask is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The operations in `self` but not in `other`.
    pub const fn difference(self, other: OpMask) -> OpMask {
        OpMask(self.0 & !other.0)
    }

    /// The operations in the mask, in bit order.
    pub fn iter(self) -> impl Iterator<Item = Op> {
        Op::ALL.into_iter().filter(move |op| self.has(*op))
    }

    /// Parse a comma-separated list such as `read,write` (empty string: no operation).
    pub fn parse_list(s: &str) -> Result<OpMask, TokenError> {
        s.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .try_fold(OpMask::NONE, |acc, name| Ok(acc | name.parse::<Op>()?.mask()))
    }
}

impl BitOr for OpMask {
    type Output = OpMask;
    fn bitor(self, rhs: OpMask) -> OpMask {
        OpMask(self.0 | rhs.0)
    }
}

impl BitAnd for OpMask {
    type Output = OpMask;
    fn bitand(self, rhs: OpMask) -> OpMask {
        OpMask(self.0 & rhs.0)
    }
}

impl From<Op> for OpMask {
    fn from(op: Op) -> OpMask {
        op.mask()
    }
}

impl fmt::Display for OpMask {
    /// `read,write`; `none` for the empty mask.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        for (i, op) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(op.as_str())?;
        }
        Ok(())
    }
}

impl fmt::Debug for OpMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpMask({self})")
    }
}

/// What a token grants, as asked for when minting or attenuating.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The tenant (a valid identifier).
    pub tenant: String,
    /// The one container the token is for (a valid identifier).
    pub container: String,
    /// The subtree the token covers, a normalised path (`/` for the whole container).
    pub prefix: String,
    /// The operations granted; not empty.
    pub ops: OpMask,
    /// The token is valid strictly before this instant (whole seconds: sub-second
    /// parts are dropped, i.e. it expires up to one second early).
    pub expires_at: SystemTime,
}

/// The effective rights of a verified token: the intersection of all its blocks,
/// confirmed by the Datalog authorizer. A plain value, cheap to check on every
/// data-plane entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rights {
    pub(super) tenant: String,
    pub(super) container: String,
    pub(super) prefix: String,
    pub(super) ops: OpMask,
    pub(super) expires_at: SystemTime,
    pub(super) blocks: usize,
}

impl Rights {
    /// The tenant the token belongs to. Compare it with the mTLS identity, or use
    /// [`TokenAuthority::verify_for`] / [`verify_for`], which do.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The container the token is for.
    pub fn container(&self) -> &str {
        &self.container
    }

    /// The subtree the token covers (normalised; `/` for the whole container).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The operations granted.
    pub fn ops(&self) -> OpMask {
        self.ops
    }

    /// The token is valid strictly before this instant.
    pub fn expires_at(&self) -> SystemTime {
        self.expires_at
    }

    /// How many blocks the token has (1 for a token straight from the authority).
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Whether `op` on `path` is allowed: `op` is granted and `path` is the prefix or
    /// below it, component by component (`/data` allows `/data/x`, not `/database`).
    /// `path` must be normalised (`NsPath::as_str()`); any other string is refused.
    ///
    /// Does not look at the clock: see [`Rights::allows_at`] and
    /// [`Rights::is_expired`].
    pub fn allows(&self, op: Op, path: &str) -> bool {
        self.allows_all(op.mask(), path)
    }

    /// [`Rights::allows`] for several operations at once (e.g. create and write).
    pub fn allows_all(&self, ops: OpMask, path: &str) -> bool {
        // The prefix was checked when the token was verified; only `path` needs it.
        !ops.is_empty()
            && self.ops.contains(ops)
            && names::validate_path(path).is_ok()
            && names::within_normalised(path, &self.prefix)
    }

    /// [`Rights::allows`] and not expired at `now`.
    pub fn allows_at(&self, op: Op, path: &str, now: SystemTime) -> bool {
        !self.is_expired(now) && self.allows(op, path)
    }

    /// Whether the token has expired at `now`.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        now >= self.expires_at
    }

    /// These rights as a [`Scope`], e.g. as the starting point of a narrower delegation.
    pub fn to_scope(&self) -> Scope {
        Scope {
            tenant: self.tenant.clone(),
            container: self.container.clone(),
            prefix: self.prefix.clone(),
            ops: self.ops,
            expires_at: self.expires_at,
        }
    }
}

/// One concrete request, for [`TokenAuthority::authorize`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// The caller's tenant (from mTLS).
    pub tenant: &'a str,
    /// The container addressed.
    pub container: &'a str,
    /// The operation.
    pub op: Op,
    /// The path, normalised.
    pub path: &'a str,
}

/// How an attenuation would widen its parent; see [`TokenError::Widening`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Widening {
    /// A different tenant.
    Tenant {
        /// The parent's.
        parent: String,
        /// Requested.
        requested: String,
    },
    /// A different container.
    Container {
        /// The parent's.
        parent: String,
        /// Requested.
        requested: String,
    },
    /// A prefix outside the parent's.
    Prefix {
        /// The parent's.
        parent: String,
        /// Requested.
        requested: String,
    },
    /// Operations the parent does not have.
    Ops {
        /// The operations asked for beyond the parent's.
        extra: OpMask,
    },
    /// A later expiry.
    Expiry {
        /// The parent's expiry, seconds since the Unix epoch.
        parent_unix_s: u64,
        /// Requested, seconds since the Unix epoch.
        requested_unix_s: u64,
    },
}

impl fmt::Display for Widening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Widening::Tenant { parent, requested } => write!(f, "tenant {requested:?} is not the token's {parent:?}"),
            Widening::Container { parent, requested } => {
                write!(f, "container {requested:?} is not the token's {parent:?}")
            }
            Widening::Prefix { parent, requested } => {
                write!(f, "prefix {requested:?} is outside the token's {parent:?}")
            }
            Widening::Ops { extra } => write!(f, "operations {extra} are not granted by the token"),
            Widening::Expiry { parent_unix_s, requested_unix_s } => {
                write!(f, "expiry {requested_unix_s} (Unix s) is after the token's {parent_unix_s}")
            }
        }
    }
}

/// Why a token could not be minted, attenuated or verified, or a key not loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The token is longer than [`MAX_TOKEN_CHARS`] (when verifying), or would be (when
    /// minting or attenuating: use a shorter prefix or fewer blocks).
    #[error("token of {len} characters is longer than the limit of {MAX_TOKEN_CHARS}")]
    TooLarge {
        /// Its length.
        len: usize,
    },
    /// Not a token at all: bad base64, or bytes that do not decode as a biscuit.
    #[error("malformed token: {reason}")]
    Malformed {
        /// What the decoder said.
        reason: String,
    },
    /// The signature chain does not verify: the token was altered, a block was removed,
    /// or it was signed by another key claiming to be this authority.
    #[error("token signature is invalid (altered or truncated token)")]
    BadSignature,
    /// The token was minted by another authority (another agent, or a root key that has
    /// since been replaced).
    #[error("token was issued by another authority (root key id {found:?}, this agent's is {expected})")]
    UnknownAuthority {
        /// This authority's root key id.
        expected: u32,
        /// The token's.
        found: Option<u32>,
    },
    /// The token has more than [`MAX_BLOCKS`] blocks.
    #[error("token has {count} blocks, more than the limit of {MAX_BLOCKS}: attenuate from a shorter token")]
    TooManyBlocks {
        /// How many it has.
        count: usize,
    },
    /// A block is not in the dpuio token format (made by another tool, third-party
    /// block, extra rules or checks). Refused because its meaning cannot be compiled
    /// into [`Rights`] exactly.
    #[error("token block {block} is not a dpuio scope block: {reason}")]
    Unrecognized {
        /// The block index (0 is the authority block).
        block: usize,
        /// What did not match.
        reason: String,
    },
    /// The token has expired.
    #[error("token expired at {expired_unix_s} (Unix s); ask for a new one (Session.Attach) or a fresh delegation")]
    Expired {
        /// When, in seconds since the Unix epoch.
        expired_unix_s: u64,
    },
    /// The token belongs to another tenant than the caller's mTLS identity.
    #[error("token is for tenant {token:?}, but the caller is tenant {caller:?}")]
    WrongTenant {
        /// The token's tenant.
        token: String,
        /// The caller's.
        caller: String,
    },
    /// The token is for another container than the one addressed.
    #[error("token is for container {token:?}, not {requested:?}")]
    WrongContainer {
        /// The token's container.
        token: String,
        /// The one addressed.
        requested: String,
    },
    /// The blocks' scopes do not intersect: no path or no operation is left.
    #[error("token grants nothing: {reason}")]
    Empty {
        /// Which part of the intersection is empty.
        reason: String,
    },
    /// Checking the token took longer than [`AUTHORIZER_MAX_TIME`] (a starved CPU): it
    /// was neither accepted nor refused; try again.
    #[error("checking the token ran out of time ({} ms): the agent is overloaded; try again", AUTHORIZER_MAX_TIME.as_millis())]
    TimedOut,
    /// The token is sealed (biscuit's final signature) and cannot be attenuated.
    #[error("token is sealed and cannot be attenuated; attenuate the unsealed token it was made from")]
    Sealed,
    /// The authorizer denied a concrete request ([`TokenAuthority::authorize`]).
    #[error("token does not allow {op} on {path:?}: {reason}")]
    Denied {
        /// The operation.
        op: Op,
        /// The path (shortened).
        path: String,
        /// Which restriction failed.
        reason: String,
    },
    /// An attenuation asked for more than its parent has.
    #[error("attenuation cannot widen a token: {0}")]
    Widening(Widening),
    /// A scope given to [`TokenAuthority::mint`] or [`attenuate`] is invalid.
    #[error("invalid token scope: {reason}")]
    InvalidScope {
        /// What is wrong.
        reason: String,
    },
    /// A name in a scope is invalid.
    #[error("invalid token scope: {0}")]
    InvalidName(#[from] NameError),
    /// A key file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The root key file can be read by group or others; see
    /// [`crate::pki::PkiError::KeyPermissions`].
    #[error("{}: private key is readable by group or others (mode {mode:03o}); refusing to use it: \
             check who could read it, then `chmod 600` it or delete it to have a new one made \
             (which invalidates all tokens)", path.display())]
    KeyPermissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A key file does not hold a usable key, or the public key does not match the
    /// private one.
    #[error("{}: {reason}", path.display())]
    InvalidKey {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// biscuit failed where it should not (building a block from our own template).
    #[error("internal token error: {reason}")]
    Internal {
        /// biscuit's error.
        reason: String,
    },
}

impl From<FileError> for TokenError {
    fn from(e: FileError) -> Self {
        match e {
            FileError::Io { path, source } => TokenError::Io { path, source },
            FileError::Permissions { path, mode } => TokenError::KeyPermissions { path, mode },
            FileError::NotAKeyFile { path, reason } => TokenError::InvalidKey { path, reason: reason.into() },
        }
    }
}

pub(super) fn internal(e: impl fmt::Display) -> TokenError {
    TokenError::Internal { reason: e.to_string() }
}
