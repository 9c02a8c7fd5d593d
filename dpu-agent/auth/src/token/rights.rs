//! What a token grants: operations ([`Op`], [`OpMask`]) under a path prefix until an
//! expiry ([`Scope`]), what a verified token leaves ([`Rights`]), what a request asks
//! for ([`Request`]), and why an attenuation may not widen a parent ([`Widening`]).

use std::fmt;
use std::ops::{BitAnd, BitOr};
use std::str::FromStr;
use std::time::SystemTime;

use super::TokenError;
use crate::names;

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
pub struct OpMask(u8);

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
