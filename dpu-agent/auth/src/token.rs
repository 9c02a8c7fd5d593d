//! What a caller may do: capability tokens, and the rights they compile to.
//!
//! A token is a [biscuit](https://www.biscuitsec.org) (biscuit-auth 6, ed25519): a chain
//! of signed Datalog blocks. The agent's [`TokenAuthority`] holds the root key and mints
//! the first (authority) block; any holder can append a block that narrows it
//! ([`attenuate`]), without the root key and without asking the agent, e.g. a training
//! job handing a DataLoader worker a read-only token for one directory. Verifying needs
//! only the root *public* key ([`TokenPublicKey`]).
//!
//! # Token format (version 1)
//!
//! Authority block, signed by the root key:
//!
//! ```text
//! tenant("acme");
//! container("training");
//! scope("/datasets", {"read", "write"}, 2030-01-01T00:00:00Z);
//! check if operation($op), {"read", "write"}.contains($op);
//! check if path($p), $p == "/datasets" || $p.starts_with("/datasets/");
//! check if time($t), $t < 2030-01-01T00:00:00Z;
//! ```
//!
//! Each attenuation block declares its narrowed scope the same way and enforces it with
//! the same three checks:
//!
//! ```text
//! scope("/datasets/imagenet", {"read"}, 2029-06-01T00:00:00Z);
//! check if operation($op), {"read"}.contains($op);
//! check if path($p), $p == "/datasets/imagenet" || $p.starts_with("/datasets/imagenet/");
//! check if time($t), $t < 2029-06-01T00:00:00Z;
//! ```
//!
//! The authorizer supplies `operation`, `path` and `time`; biscuit's scoping makes each
//! block's facts visible only to that block, so an appended block cannot add rights, and
//! every block's checks must pass, so the effective rights are the intersection.
//!
//! # How verification works
//!
//! [`TokenAuthority::verify`] (or [`verify`] with a public key):
//!
//! 1. parses the token and checks the signature chain (biscuit): an altered byte, a
//!    removed last block or another root key fails here;
//! 2. requires every block to be exactly in the format above: it re-renders the block
//!    from its declared `scope` fact and compares. A block written by some other tool
//!    (other checks, rules, third-party blocks) is refused rather than half understood,
//!    because [`Rights`] must never allow what the Datalog would deny;
//! 3. computes the candidate intersection (deepest prefix, common operations, earliest
//!    expiry) and then *confirms it with biscuit's authorizer*: the operations are those
//!    for which authorization at the prefix succeeds now, and authorization must succeed
//!    one second before the expiry. So the result is what the Datalog checks accept, not
//!    what the blocks claim.
//!
//! [`TokenAuthority::authorize`] also runs the authorizer for one concrete request, for
//! the moments the design calls for a full check (session attach, open, delegate). The
//! data plane then checks each entry against the [`Rights`] value alone: an
//! [`OpMask`] test, a component-wise prefix test and an expiry test, no Datalog.
//!
//! # Limits
//!
//! Tokens longer than [`MAX_TOKEN_CHARS`] or with more than [`MAX_BLOCKS`] blocks are
//! refused before any parsing beyond the length check; Datalog runs with explicit
//! [`AUTHORIZER_MAX_TIME`], fact and iteration limits.
//!
//! # Not here
//!
//! Revocation lists, token storage and the binding of a token to a session: the agent
//! does those with the values this module returns.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use biscuit_auth::builder::Term;
use biscuit_auth::error::{Format, Logic, Signature, Token as BiscuitError};
use biscuit_auth::{AuthorizerBuilder, AuthorizerLimits, Biscuit, BlockBuilder, KeyPair, PublicKey};

use crate::files;
use crate::names::{self, NameKind};

mod rights;

use rights::internal;
pub use rights::{Op, OpMask, Request, Rights, Scope, TokenError, Widening};

/// File name of the root private key (PKCS#8 PEM, mode `0600`).
pub const ROOT_KEY_FILE: &str = "token-root.key";
/// File name of the root public key (SPKI PEM, mode `0644`), for verifiers elsewhere.
pub const PUBLIC_KEY_FILE: &str = "token-root.pub";

/// Longest token accepted or produced, in base64 characters. A fresh token with a
/// short prefix is about 580; each attenuation block adds about 450 plus three times its
/// prefix length, so [`MAX_BLOCKS`] blocks with short prefixes fit.
pub const MAX_TOKEN_CHARS: usize = 8 * 1024;
/// Most blocks in a token (the authority block plus attenuations).
pub const MAX_BLOCKS: usize = 16;
/// Time budget of one Datalog run. Generous: a run on these tokens takes microseconds
/// and its work is bounded by the fact and iteration limits and [`MAX_BLOCKS`]; the
/// budget only stops a run that the machine starves. 100 ms was too little: under
/// load, fuzzing saw a genuine token refused as "unrecognized" (docs/fuzzing.md). A run
/// out of time is [`TokenError::TimedOut`], never a refusal.
pub const AUTHORIZER_MAX_TIME: Duration = Duration::from_secs(1);

const AUTHORITY_CODE: &str = r#"
tenant({tenant});
container({container});
scope({prefix}, {ops}, {expires});
check if operation($op), {ops}.contains($op);
check if path($p), $p == {prefix} || $p.starts_with({prefix_dir});
check if time($t), $t < {expires};
"#;

const ATTENUATION_CODE: &str = r#"
scope({prefix}, {ops}, {expires});
check if operation($op), {ops}.contains($op);
check if path($p), $p == {prefix} || $p.starts_with({prefix_dir});
check if time($t), $t < {expires};
"#;

/// The root public key that verifies tokens. Safe to copy and publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenPublicKey(PublicKey);

impl TokenPublicKey {
    /// SPKI PEM, as in `token-root.pub`.
    pub fn to_pem(&self) -> String {
        // Serialising an ed25519 public key cannot fail.
        self.0.to_pem().expect("ed25519 public key encodes as PEM")
    }

    /// Parse SPKI PEM.
    pub fn from_pem(pem: &str) -> Result<TokenPublicKey, TokenError> {
        PublicKey::from_pem(pem)
            .map(TokenPublicKey)
            .map_err(|e| TokenError::InvalidKey { path: PathBuf::from("<public key>"), reason: e.to_string() })
    }

    /// A short identifier of this key, written into tokens so that a token from another
    /// authority gets a precise error. A hint only: security rests on the signature.
    pub fn key_id(&self) -> u32 {
        let bytes = self.0.to_bytes();
        u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
    }
}

/// The agent's token authority: the root signing key. No `Debug`, no `Clone` (it holds
/// a private key; biscuit's ed25519 key is zeroized on drop).
pub struct TokenAuthority {
    root: KeyPair,
    public: TokenPublicKey,
}

impl TokenAuthority {
    /// A new authority with a fresh key, not stored anywhere (tests, ephemeral agents).
    pub fn generate() -> TokenAuthority {
        TokenAuthority::from_key_pair(KeyPair::new())
    }

    fn from_key_pair(root: KeyPair) -> TokenAuthority {
        let public = TokenPublicKey(root.public());
        TokenAuthority { root, public }
    }

    /// Load the root key from `dir/token-root.key`, or create it (and
    /// `dir/token-root.pub`) on first start. `dir` is created with mode `0700` if
    /// missing. A key readable by group or others is refused
    /// ([`TokenError::KeyPermissions`]); a public key file that does not match the
    /// private key is an error; a missing public key file is written again.
    ///
    /// A new root key invalidates every token issued before, which is harmless for
    /// short-lived tokens: clients attach again.
    pub fn load_or_create(dir: &Path) -> Result<TokenAuthority, TokenError> {
        files::create_dir(dir)?;
        let (key_path, pub_path) = (dir.join(ROOT_KEY_FILE), dir.join(PUBLIC_KEY_FILE));
        let authority = if files::exists(&key_path) {
            let pem = files::read_secret(&key_path)?;
            let root = KeyPair::from_private_key_pem(&pem)
                .map_err(|e| TokenError::InvalidKey { path: key_path.clone(), reason: e.to_string() })?;
            TokenAuthority::from_key_pair(root)
        } else {
            let authority = TokenAuthority::generate();
            let pem = authority.root.to_private_key_pem().map_err(internal)?;
            files::write_secret(&key_path, pem.as_bytes())?;
            authority
        };
        if files::exists(&pub_path) {
            let stored = files::read_public(&pub_path)?;
            let matches = PublicKey::from_pem(&stored).is_ok_and(|key| key == authority.public.0);
            if !matches {
                return Err(TokenError::InvalidKey {
                    path: pub_path,
                    reason: format!(
                        "does not hold the public key of {ROOT_KEY_FILE}; delete it to have it written again"
                    ),
                });
            }
        } else {
            files::write_public(&pub_path, authority.public.to_pem().as_bytes())?;
        }
        Ok(authority)
    }

    /// The public key that verifies this authority's tokens.
    pub fn public_key(&self) -> TokenPublicKey {
        self.public
    }

    /// Mint a token granting exactly `scope`. Returns the token, URL-safe base64.
    ///
    /// The scope is checked: valid tenant and container names, a normalised prefix, at
    /// least one operation, an expiry after the Unix epoch. Minting does not read the
    /// clock, so an expiry in the past makes a token that never verifies.
    pub fn mint(&self, scope: &Scope) -> Result<String, TokenError> {
        let expires = check_scope(scope)?;
        let mut params = scope_params(&scope.prefix, scope.ops, expires);
        params.insert("tenant".into(), Term::Str(scope.tenant.clone()));
        params.insert("container".into(), Term::Str(scope.container.clone()));
        let block = BlockBuilder::new().code_with_params(AUTHORITY_CODE, params, HashMap::new()).map_err(internal)?;
        let token =
            Biscuit::builder().merge(block).root_key_id(self.public.key_id()).build(&self.root).map_err(internal)?;
        within_size(token.to_base64().map_err(internal)?)
    }

    /// Verify `token` at `now` and return its effective rights. See the module
    /// documentation for what is checked.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Rights, TokenError> {
        verify(&self.public, token, now)
    }

    /// [`TokenAuthority::verify`], and the token must belong to `tenant` (the caller's
    /// mTLS identity).
    pub fn verify_for(&self, token: &str, tenant: &str, now: SystemTime) -> Result<Rights, TokenError> {
        verify_for(&self.public, token, tenant, now)
    }

    /// Verify `token` and run biscuit's authorizer on one concrete request: right
    /// tenant and container, and every block's checks pass for this operation, path and
    /// time. Returns the effective rights for later per-entry checks.
    pub fn authorize(&self, token: &str, request: &Request<'_>, now: SystemTime) -> Result<Rights, TokenError> {
        authorize(&self.public, token, request, now)
    }
}

/// Verify `token` at `now` with the authority's public key; see the module
/// documentation.
pub fn verify(public_key: &TokenPublicKey, token: &str, now: SystemTime) -> Result<Rights, TokenError> {
    let parsed = parse(public_key, token)?;
    effective_rights(&parsed, now)
}

/// [`verify`], and the token must belong to `tenant`.
pub fn verify_for(
    public_key: &TokenPublicKey,
    token: &str,
    tenant: &str,
    now: SystemTime,
) -> Result<Rights, TokenError> {
    let rights = verify(public_key, token, now)?;
    if rights.tenant != tenant {
        return Err(TokenError::WrongTenant { token: rights.tenant, caller: names::quote(tenant) });
    }
    Ok(rights)
}

/// [`TokenAuthority::authorize`] with a public key.
pub fn authorize(
    public_key: &TokenPublicKey,
    token: &str,
    request: &Request<'_>,
    now: SystemTime,
) -> Result<Rights, TokenError> {
    let parsed = parse(public_key, token)?;
    let rights = effective_rights(&parsed, now)?;
    if rights.tenant != request.tenant {
        return Err(TokenError::WrongTenant { token: rights.tenant, caller: names::quote(request.tenant) });
    }
    if rights.container != request.container {
        return Err(TokenError::WrongContainer { token: rights.container, requested: names::quote(request.container) });
    }
    let denied = |reason: String| TokenError::Denied { op: request.op, path: names::quote(request.path), reason };
    names::validate_path(request.path).map_err(|e| denied(e.to_string()))?;
    run_authorizer(&parsed, request.op, request.path, unix_s(now)?, Some((request.tenant, request.container)))
        .map_err(|r| r.or_else(denied))?;
    // The Datalog said yes; the compiled rights must agree, or they are not a faithful
    // compilation and must not be used.
    if !rights.allows(request.op, request.path) {
        return Err(internal("rights and authorizer disagree"));
    }
    Ok(rights)
}

/// Append a block to `token` restricting it to `narrower`, which must lie within the
/// token's effective rights at `now` (same tenant and container, a prefix at or below
/// the token's, a subset of its operations, an expiry no later). Anything wider is a
/// [`TokenError::Widening`] error. Verifying the result yields exactly `narrower`
/// (expiry in whole seconds).
///
/// Needs no private key: any holder can attenuate. `public_key` is used to verify the
/// parent first, so a broken or expired parent is reported here, not later.
///
/// `now` is a parameter (this crate reads no clock); the agent passes
/// `SystemTime::now()`.
pub fn attenuate(
    token: &str,
    public_key: &TokenPublicKey,
    narrower: &Scope,
    now: SystemTime,
) -> Result<String, TokenError> {
    let parsed = parse(public_key, token)?;
    let parent = effective_rights(&parsed, now)?;
    let expires = check_scope(narrower)?;
    // A delegation that no request could ever use is a mistake of the asker's.
    let now_s = unix_s(now)?;
    if expires <= now_s {
        return Err(TokenError::InvalidScope {
            reason: format!("expiry {expires} (Unix s) is not after now ({now_s}): ask for a later one"),
        });
    }
    let widening = if narrower.tenant != parent.tenant {
        Some(Widening::Tenant { parent: parent.tenant.clone(), requested: narrower.tenant.clone() })
    } else if narrower.container != parent.container {
        Some(Widening::Container { parent: parent.container.clone(), requested: narrower.container.clone() })
    } else if !names::within_normalised(&narrower.prefix, &parent.prefix) {
        Some(Widening::Prefix { parent: parent.prefix.clone(), requested: narrower.prefix.clone() })
    } else if !parent.ops.contains(narrower.ops) {
        Some(Widening::Ops { extra: narrower.ops.difference(parent.ops) })
    } else if expires > unix_s(parent.expires_at)? {
        Some(Widening::Expiry { parent_unix_s: unix_s(parent.expires_at)?, requested_unix_s: expires })
    } else {
        None
    };
    if let Some(widening) = widening {
        return Err(TokenError::Widening(widening));
    }
    if parsed.block_count() >= MAX_BLOCKS {
        return Err(TokenError::TooManyBlocks { count: parsed.block_count() + 1 });
    }
    append_scope_block(&parsed, &narrower.prefix, narrower.ops, expires)
}

/// Append a scope block without comparing it to the parent. Verification still takes
/// the intersection; tests use this to show that a wider block grants nothing.
fn append_scope_block(parsed: &Biscuit, prefix: &str, ops: OpMask, expires: u64) -> Result<String, TokenError> {
    let block = BlockBuilder::new()
        .code_with_params(ATTENUATION_CODE, scope_params(prefix, ops, expires), HashMap::new())
        .map_err(internal)?;
    let appended = parsed.append(block).map_err(|e| match e {
        BiscuitError::AppendOnSealed | BiscuitError::AlreadySealed => TokenError::Sealed,
        other => internal(other),
    })?;
    within_size(appended.to_base64().map_err(internal)?)
}

/// Refuse to hand out a token that [`verify`] would refuse as too large.
fn within_size(token: String) -> Result<String, TokenError> {
    if token.len() > MAX_TOKEN_CHARS {
        return Err(TokenError::TooLarge { len: token.len() });
    }
    Ok(token)
}

/// Whether biscuit prints `s` in a way that parses back to exactly `s` (see
/// [`read_block`]).
fn printable_exactly(s: &str) -> bool {
    !s.contains(['"', '\\'])
}

/// Check a scope and return its expiry in Unix seconds.
fn check_scope(scope: &Scope) -> Result<u64, TokenError> {
    names::validate_identifier(NameKind::Tenant, &scope.tenant)?;
    names::validate_identifier(NameKind::Container, &scope.container)?;
    names::validate_path(&scope.prefix)?;
    if !printable_exactly(&scope.prefix) {
        return Err(TokenError::InvalidScope {
            reason: format!("prefix {:?}: a token prefix cannot contain '\"' or '\\'", names::quote(&scope.prefix)),
        });
    }
    if scope.ops.is_empty() {
        return Err(TokenError::InvalidScope { reason: "no operation granted".into() });
    }
    let expires = unix_s(scope.expires_at)?;
    if expires == 0 {
        return Err(TokenError::InvalidScope { reason: "expiry must be after the Unix epoch".into() });
    }
    Ok(expires)
}

fn unix_s(t: SystemTime) -> Result<u64, TokenError> {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .map_err(|_| TokenError::InvalidScope { reason: "time before the Unix epoch".into() })
}

fn ops_term(ops: OpMask) -> Term {
    Term::Set(ops.iter().map(|op| Term::Str(op.as_str().to_owned())).collect())
}

fn scope_params(prefix: &str, ops: OpMask, expires: u64) -> HashMap<String, Term> {
    let prefix_dir = if prefix == "/" { "/".to_owned() } else { format!("{prefix}/") };
    HashMap::from([
        ("prefix".to_owned(), Term::Str(prefix.to_owned())),
        ("prefix_dir".to_owned(), Term::Str(prefix_dir)),
        ("ops".to_owned(), ops_term(ops)),
        ("expires".to_owned(), Term::Date(expires)),
    ])
}

/// Decode and check the signature chain; refuse oversized and over-long tokens.
fn parse(public_key: &TokenPublicKey, token: &str) -> Result<Biscuit, TokenError> {
    if token.len() > MAX_TOKEN_CHARS {
        return Err(TokenError::TooLarge { len: token.len() });
    }
    let expected = public_key.key_id();
    let key = public_key.0;
    let provider = move |key_id: Option<u32>| {
        if key_id == Some(expected) { Ok(key) } else { Err(Format::UnknownPublicKey) }
    };
    let parsed = Biscuit::from_base64(token.trim(), provider).map_err(|e| match e {
        BiscuitError::Format(Format::UnknownPublicKey) => {
            TokenError::UnknownAuthority { expected, found: root_key_id_hint(token) }
        }
        BiscuitError::Format(Format::Signature(Signature::InvalidSignature(_)) | Format::SealedSignature) => {
            TokenError::BadSignature
        }
        BiscuitError::Format(Format::Signature(_) | Format::InvalidSignatureSize(_)) => TokenError::BadSignature,
        other => TokenError::Malformed { reason: other.to_string() },
    })?;
    if parsed.block_count() > MAX_BLOCKS {
        return Err(TokenError::TooManyBlocks { count: parsed.block_count() });
    }
    Ok(parsed)
}

/// The root key id a token claims, for the error message only (the signature is not
/// checked: the key is unknown).
fn root_key_id_hint(token: &str) -> Option<u32> {
    biscuit_auth::UnverifiedBiscuit::from_base64(token.trim()).ok().and_then(|t| t.root_key_id())
}

/// A block's declared scope.
struct BlockScope {
    prefix: String,
    ops: OpMask,
    expires: u64,
}

/// Check that block `index` is exactly a dpuio scope block and return its declared
/// scope (and, for the authority block, tenant and container).
fn read_block(parsed: &Biscuit, index: usize) -> Result<(BlockScope, Option<(String, String)>), TokenError> {
    let unrecognized = |reason: String| TokenError::Unrecognized { block: index, reason };
    if parsed.block_external_key(index).map_err(|e| unrecognized(e.to_string()))?.is_some() {
        return Err(unrecognized("third-party blocks are not used by dpuio".into()));
    }
    // The block is compared with the template through biscuit's printer, which does not
    // escape '"' or '\' in strings: with such a string, different blocks could print
    // alike. Every string a block uses is in its symbol table, so refusing those
    // characters there makes print-then-parse exact.
    let symbols = parsed.block_symbols(index).map_err(|e| unrecognized(e.to_string()))?;
    if let Some(bad) = symbols.iter().find(|s| !printable_exactly(s)) {
        return Err(unrecognized(format!("string {:?} cannot be compared exactly", names::quote(bad))));
    }
    let keys = parsed.block_public_keys(index).map_err(|e| unrecognized(e.to_string()))?;
    if keys.current_offset() != 0 {
        return Err(unrecognized("blocks trusting public keys are not used by dpuio".into()));
    }
    let source = parsed.print_block_source(index).map_err(|e| unrecognized(e.to_string()))?;
    let block = BlockBuilder::new().code(&source).map_err(|e| unrecognized(format!("cannot re-read: {e}")))?;
    let mut scope = None;
    let mut tenant = None;
    let mut container = None;
    for fact in &block.facts {
        let terms = &fact.predicate.terms;
        match (fact.predicate.name.as_str(), terms.as_slice()) {
            ("scope", [Term::Str(prefix), Term::Set(ops), Term::Date(expires)]) if scope.is_none() => {
                let mut mask = OpMask::NONE;
                for op in ops {
                    let Term::Str(name) = op else {
                        return Err(unrecognized("operations must be strings".into()));
                    };
                    mask = mask | name.parse::<Op>().map_err(|e| unrecognized(e.to_string()))?.mask();
                }
                scope = Some(BlockScope { prefix: prefix.clone(), ops: mask, expires: *expires });
            }
            ("tenant", [Term::Str(t)]) if index == 0 && tenant.is_none() => tenant = Some(t.clone()),
            ("container", [Term::Str(c)]) if index == 0 && container.is_none() => container = Some(c.clone()),
            (name, _) => return Err(unrecognized(format!("unexpected fact {name:?}"))),
        }
    }
    let scope = scope.ok_or_else(|| unrecognized("no scope fact".into()))?;
    names::validate_path(&scope.prefix).map_err(|e| unrecognized(e.to_string()))?;
    let mut params = scope_params(&scope.prefix, scope.ops, scope.expires);
    let (code, names) = if index == 0 {
        let (Some(tenant), Some(container)) = (tenant, container) else {
            return Err(unrecognized("the authority block must name a tenant and a container".into()));
        };
        names::validate_identifier(NameKind::Tenant, &tenant).map_err(|e| unrecognized(e.to_string()))?;
        names::validate_identifier(NameKind::Container, &container).map_err(|e| unrecognized(e.to_string()))?;
        params.insert("tenant".into(), Term::Str(tenant.clone()));
        params.insert("container".into(), Term::Str(container.clone()));
        (AUTHORITY_CODE, Some((tenant, container)))
    } else {
        (ATTENUATION_CODE, None)
    };
    let canonical = BlockBuilder::new().code_with_params(code, params, HashMap::new()).map_err(internal)?;
    // Block-level `trusting` scopes are not printed, so not compared; they only widen
    // what this block's own checks can see, and those checks read only the
    // authorizer's `operation`, `path` and `time` facts (third-party blocks, the only
    // other source of facts a scope could reach, are refused above).
    if canonical.to_string() != block.to_string() {
        return Err(unrecognized("its checks or rules differ from the dpuio template".into()));
    }
    Ok((scope, names))
}

/// Compute and confirm the effective rights of a parsed token at `now`.
fn effective_rights(parsed: &Biscuit, now: SystemTime) -> Result<Rights, TokenError> {
    let now_s = unix_s(now)?;
    let blocks = parsed.block_count();
    let mut tenant_container = None;
    let mut prefix = String::new();
    let mut declared_ops = OpMask::ALL;
    let mut expires = u64::MAX;
    for index in 0..blocks {
        let (scope, names) = read_block(parsed, index)?;
        if index == 0 {
            tenant_container = names;
            prefix = scope.prefix;
        } else if names::within_normalised(&scope.prefix, &prefix) {
            prefix = scope.prefix;
        } else if !names::within_normalised(&prefix, &scope.prefix) {
            return Err(TokenError::Empty {
                reason: format!("block {index} restricts to {:?}, outside {prefix:?}", names::quote(&scope.prefix)),
            });
        }
        declared_ops = declared_ops & scope.ops;
        expires = expires.min(scope.expires);
    }
    let Some((tenant, container)) = tenant_container else {
        return Err(TokenError::Unrecognized { block: 0, reason: "no authority block".into() });
    };
    if now_s >= expires {
        return Err(TokenError::Expired { expired_unix_s: expires });
    }
    // Ask the authorizer which operations it allows at the prefix now; those, not the
    // declared ones, are the rights. With well-formed blocks they are the same.
    let mut ops = OpMask::NONE;
    for op in Op::ALL {
        match run_authorizer(parsed, op, &prefix, now_s, None) {
            Ok(()) => ops = ops | op.mask(),
            Err(Refusal::TimedOut) => return Err(TokenError::TimedOut),
            Err(Refusal::Checks(_)) => {}
        }
    }
    if ops != declared_ops {
        return Err(TokenError::Unrecognized {
            block: 0,
            reason: format!("the checks allow {ops} but the blocks declare {declared_ops}"),
        });
    }
    let Some(first) = ops.iter().next() else {
        return Err(TokenError::Empty { reason: "the blocks have no operation in common".into() });
    };
    // The last second before expiry must still be allowed.
    run_authorizer(parsed, first, &prefix, expires - 1, None).map_err(|r| {
        r.or_else(|reason| TokenError::Unrecognized {
            block: 0,
            reason: format!("the checks refuse the last second before the declared expiry: {reason}"),
        })
    })?;
    Ok(Rights { tenant, container, prefix, ops, expires_at: UNIX_EPOCH + Duration::from_secs(expires), blocks })
}

/// Run biscuit's authorizer with `operation`, `path` and `time` facts. The policy
/// requires a tenant and a container in the authority block (the given ones, if any).
/// Why the authorizer did not allow a request.
enum Refusal {
    /// The checks (or the token's shape) refuse it; the description.
    Checks(String),
    /// The run ran out of its time budget: no answer.
    TimedOut,
}

impl Refusal {
    /// The error: a time-out as itself, a refusal as `refused` says.
    fn or_else(self, refused: impl FnOnce(String) -> TokenError) -> TokenError {
        match self {
            Refusal::Checks(reason) => refused(reason),
            Refusal::TimedOut => TokenError::TimedOut,
        }
    }
}

/// `Err` says why not: the failed checks, or no answer in time.
fn run_authorizer(
    parsed: &Biscuit,
    op: Op,
    path: &str,
    now_s: u64,
    tenant_container: Option<(&str, &str)>,
) -> Result<(), Refusal> {
    run_authorizer_within(parsed, op, path, now_s, tenant_container, AUTHORIZER_MAX_TIME)
}

fn run_authorizer_within(
    parsed: &Biscuit,
    op: Op,
    path: &str,
    now_s: u64,
    tenant_container: Option<(&str, &str)>,
    max_time: Duration,
) -> Result<(), Refusal> {
    let policy = match tenant_container {
        Some(_) => "allow if tenant({tenant}), container({container})",
        None => "allow if tenant($t), container($c)",
    };
    let mut params = HashMap::from([
        ("op".to_owned(), Term::Str(op.as_str().to_owned())),
        ("path".to_owned(), Term::Str(path.to_owned())),
        ("now".to_owned(), Term::Date(now_s)),
    ]);
    if let Some((tenant, container)) = tenant_container {
        params.insert("tenant".into(), Term::Str(tenant.to_owned()));
        params.insert("container".into(), Term::Str(container.to_owned()));
    }
    let code = format!("operation({{op}}); path({{path}}); time({{now}}); {policy};");
    let limits = AuthorizerLimits { max_facts: 1000, max_iterations: 100, max_time };
    let refusal = |e: BiscuitError| match e {
        BiscuitError::RunLimit(biscuit_auth::error::RunLimit::Timeout) => Refusal::TimedOut,
        e => Refusal::Checks(describe_failure(&e)),
    };
    let mut authorizer = AuthorizerBuilder::new()
        .code_with_params(code, params, HashMap::new())
        .map_err(refusal)?
        .set_limits(limits)
        .build(parsed)
        .map_err(refusal)?;
    authorizer.authorize().map(|_| ()).map_err(refusal)
}

fn describe_failure(e: &BiscuitError) -> String {
    match e {
        BiscuitError::FailedLogic(Logic::Unauthorized { checks, .. } | Logic::NoMatchingPolicy { checks })
            if !checks.is_empty() =>
        {
            checks.iter().map(|c| c.to_string()).collect::<Vec<_>>().join("; ")
        }
        BiscuitError::FailedLogic(Logic::NoMatchingPolicy { .. }) => "wrong tenant or container".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
