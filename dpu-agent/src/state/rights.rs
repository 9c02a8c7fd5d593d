//! Who may attach as which tenant, and with what rights: the caller's certificate, a
//! capability token narrowing the session, and the delegations a session makes for its
//! children (never more than it holds).

use std::time::{Duration, SystemTime};

use dpuio_auth::token::{Op, OpMask, TokenError};
use dpuio_backend::NsPath;

use super::{Agent, Session};
use crate::caller::Caller;
use crate::error::{Error, Result};

/// What a session may do: all of its tenant's container, or what its capability
/// token grants. Checked on every namespace call; compiled into each handle's
/// [`HandleInfo`](crate::validate::HandleInfo) for the data plane.
#[derive(Clone, Debug)]
pub struct SessionRights {
    pub ops: OpMask,
    /// The subtree the session may touch (`/` for the whole container).
    pub prefix: NsPath,
    /// When the rights end (`None`: with the session).
    pub expires_at: Option<SystemTime>,
    /// The token the session attached with; delegations attenuate it.
    pub token: Option<String>,
}

impl SessionRights {
    /// Everything in the tenant's container, for as long as the session lives.
    pub fn full() -> SessionRights {
        SessionRights { ops: OpMask::ALL, prefix: NsPath::root(), expires_at: None, token: None }
    }

    pub fn expired(&self, now: SystemTime) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }

    /// Whether `op` on `path` is allowed now; the error says what the token grants.
    pub fn check(&self, op: Op, path: &NsPath) -> Result<()> {
        if self.expired(SystemTime::now()) {
            return Err(Error::Unauthenticated(
                "the session's capability token has expired; attach again with a fresh token".into(),
            ));
        }
        if !self.ops.contains(op.mask()) {
            return Err(Error::PermissionDenied(format!(
                "the session's capability token does not allow {op} (it allows {}); ask the parent for a delegation that does",
                self.ops
            )));
        }
        if !dpuio_auth::names::path_within(path.as_str(), self.prefix.as_str()) {
            return Err(Error::PermissionDenied(format!(
                "{path} is outside the session's capability prefix {}",
                self.prefix
            )));
        }
        Ok(())
    }
}

/// Lifetime of a delegation from a session without a token, when none is asked for.
const DEFAULT_DELEGATION: Duration = Duration::from_secs(3600);
/// Longest delegation.
const MAX_DELEGATION: Duration = Duration::from_secs(7 * 24 * 3600);

impl Agent {
    /// Which tenant an Attach is for and what the session may do: the caller's
    /// certificate decides the tenant (a plaintext loopback listener takes the named
    /// one); a capability token narrows the rights and must be this agent's, for that
    /// tenant and its container, unexpired and unaltered.
    pub fn authorize_attach(&self, caller: &Caller, requested: &str, token: &str) -> Result<(String, SessionRights)> {
        let now = SystemTime::now();
        let verified = if token.is_empty() {
            None
        } else {
            Some(self.tokens.verify(token, now).map_err(|e| match e {
                TokenError::TimedOut => Error::Unavailable("checking the capability token ran out of time; try again"),
                e => Error::Unauthenticated(format!("capability_token: {e}")),
            })?)
        };
        let tenant = match caller {
            Caller::Tenant(t) => {
                if !requested.is_empty() && requested != t {
                    return Err(Error::PermissionDenied(format!(
                        "the client certificate is for tenant {t:?}; it cannot attach as tenant {requested:?}"
                    )));
                }
                t.clone()
            }
            Caller::Unauthenticated if !requested.is_empty() => requested.to_owned(),
            Caller::Unauthenticated => match &verified {
                Some(rights) => rights.tenant().to_owned(),
                None => self.default_tenant()?,
            },
        };
        let Some(rights) = verified else {
            return Ok((tenant, SessionRights::full()));
        };
        if rights.tenant() != tenant {
            return Err(Error::Unauthenticated(format!(
                "capability_token: the token is for tenant {:?}, but the caller is tenant {tenant:?}",
                rights.tenant()
            )));
        }
        let container = self
            .tenant(&tenant)
            .map(|t| t.container)
            .ok_or_else(|| Error::PermissionDenied(format!("tenant {tenant:?} is not configured on this agent")))?;
        if rights.container() != container {
            return Err(Error::Unauthenticated(format!(
                "capability_token: the token is for container {:?}, tenant {tenant:?} has {container:?}",
                rights.container()
            )));
        }
        let prefix = NsPath::parse(rights.prefix())
            .map_err(|e| Error::Unauthenticated(format!("capability_token: its prefix is not a path: {e}")))?;
        Ok((
            tenant,
            SessionRights {
                ops: rights.ops(),
                prefix,
                expires_at: Some(rights.expires_at()),
                token: Some(token.to_owned()),
            },
        ))
    }

    /// A capability token for a child of `session` (e.g. a DataLoader worker): the
    /// session's rights narrowed to `prefix`, `operations` and `lifetime_s` (empty or
    /// zero keep the parent's). It can never do more than the session: the token is an
    /// attenuation of the session's own, and the agent refuses any widening.
    pub fn delegate(
        &self,
        session: &Session,
        prefix: &str,
        operations: &[String],
        lifetime_s: u64,
    ) -> Result<(String, SystemTime)> {
        use dpuio_auth::token::Scope;
        let now = SystemTime::now();
        if lifetime_s > MAX_DELEGATION.as_secs() {
            return Err(Error::invalid(
                "lifetime_s",
                format!("{lifetime_s} s is longer than the limit of {} s", MAX_DELEGATION.as_secs()),
            ));
        }
        let lifetime = (lifetime_s > 0).then(|| Duration::from_secs(lifetime_s));
        let parent = match &session.rights.token {
            Some(token) => token.clone(),
            None => {
                // A session with no token holds its tenant's rights for its own life: the
                // root of its delegations lasts as long as the longest child may.
                let scope = Scope {
                    tenant: session.tenant.clone(),
                    container: session.container_name.clone(),
                    prefix: session.rights.prefix.to_string(),
                    ops: session.rights.ops,
                    expires_at: now + lifetime.unwrap_or(DEFAULT_DELEGATION),
                };
                self.tokens.mint(&scope).map_err(|e| Error::Internal(format!("minting a session token: {e}")))?
            }
        };
        let parent_rights = self.tokens.verify(&parent, now).map_err(|e| match e {
            TokenError::TimedOut => Error::Unavailable("checking the capability token ran out of time; try again"),
            e => Error::Unauthenticated(e.to_string()),
        })?;
        let mut scope = parent_rights.to_scope();
        if !prefix.is_empty() {
            scope.prefix = NsPath::parse(prefix)
                .map_err(|e| Error::invalid("path_prefix", format!("{prefix:?} is not a path: {e}")))?
                .to_string();
        }
        if !operations.is_empty() {
            scope.ops = dpuio_auth::token::OpMask::parse_list(&operations.join(",")).map_err(|e| {
                Error::invalid("operations", format!("{e}; use any of \"read\", \"write\", \"create\", \"delete\""))
            })?;
            if scope.ops.is_empty() {
                return Err(Error::invalid("operations", "names no operation"));
            }
        }
        if let Some(lifetime) = lifetime {
            scope.expires_at = now + lifetime;
        }
        let token =
            dpuio_auth::token::attenuate(&parent, &self.tokens.public_key(), &scope, now).map_err(|e| match e {
                TokenError::Widening(_) => {
                    Error::PermissionDenied(format!("a delegation cannot do more than its parent: {e}"))
                }
                TokenError::InvalidScope { .. } | TokenError::InvalidName(_) => {
                    Error::invalid("path_prefix", e.to_string())
                }
                TokenError::Expired { .. } => Error::Unauthenticated(e.to_string()),
                other => Error::Internal(format!("attenuating a token: {other}")),
            })?;
        Ok((token, scope.expires_at))
    }
}
