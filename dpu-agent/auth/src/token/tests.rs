use std::fs;
use std::os::unix::fs::PermissionsExt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// A fixed "now" (2027-01-15), so tests never depend on the clock.
const NOW_S: u64 = 1_800_000_000;

fn at(s: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(s)
}

fn now() -> SystemTime {
    at(NOW_S)
}

fn scope() -> Scope {
    Scope {
        tenant: "acme".into(),
        container: "train".into(),
        prefix: "/datasets".into(),
        ops: OpMask::READ | OpMask::WRITE,
        expires_at: at(NOW_S + 3600),
    }
}

fn narrower(prefix: &str, ops: OpMask, expires_s: u64) -> Scope {
    Scope { prefix: prefix.into(), ops, expires_at: at(expires_s), ..scope() }
}

fn decode(token: &str) -> Vec<u8> {
    URL_SAFE.decode(token).unwrap()
}

fn encode(bytes: &[u8]) -> String {
    URL_SAFE.encode(bytes)
}

/// Append a raw Datalog block, as a holder using another biscuit tool could.
fn append_raw(authority: &TokenAuthority, token: &str, code: &str) -> String {
    let parsed = parse(&authority.public_key(), token).unwrap();
    parsed.append(BlockBuilder::new().code(code).unwrap()).unwrap().to_base64().unwrap()
}

#[test]
fn mint_and_verify() {
    let authority = TokenAuthority::generate();
    let token = authority.mint(&scope()).unwrap();
    let rights = authority.verify(&token, now()).unwrap();
    assert_eq!(rights.tenant(), "acme");
    assert_eq!(rights.container(), "train");
    assert_eq!(rights.prefix(), "/datasets");
    assert_eq!(rights.ops(), OpMask::READ | OpMask::WRITE);
    assert_eq!(rights.expires_at(), at(NOW_S + 3600));
    assert_eq!(rights.blocks(), 1);
    assert_eq!(rights.to_scope(), scope());

    assert!(rights.allows(Op::Read, "/datasets"));
    assert!(rights.allows(Op::Write, "/datasets/imagenet/0001.jpg"));
    assert!(!rights.allows(Op::Read, "/database"));
    assert!(!rights.allows(Op::Read, "/"));
    assert!(!rights.allows(Op::Delete, "/datasets/x"));
    assert!(!rights.allows(Op::Create, "/datasets/x"));
    assert!(!rights.allows(Op::Read, "/datasets/../etc"), "non-normalised paths are refused");
    assert!(rights.allows_all(OpMask::READ | OpMask::WRITE, "/datasets/x"));
    assert!(!rights.allows_all(OpMask::READ | OpMask::CREATE, "/datasets/x"));
    assert!(!rights.allows_all(OpMask::NONE, "/datasets/x"));
    assert!(rights.allows_at(Op::Read, "/datasets/x", at(NOW_S + 3599)));
    assert!(!rights.allows_at(Op::Read, "/datasets/x", at(NOW_S + 3600)));

    // The public key alone verifies.
    let public = TokenPublicKey::from_pem(&authority.public_key().to_pem()).unwrap();
    assert_eq!(verify(&public, &token, now()).unwrap(), rights);

    // Sub-second expiry is truncated: the token expires up to a second early.
    let fractional = Scope { expires_at: at(NOW_S + 10) + Duration::from_millis(999), ..scope() };
    let rights = authority.verify(&authority.mint(&fractional).unwrap(), now()).unwrap();
    assert_eq!(rights.expires_at(), at(NOW_S + 10));

    // Root prefix covers everything.
    let root = Scope { prefix: "/".into(), ops: OpMask::ALL, ..scope() };
    let rights = authority.verify(&authority.mint(&root).unwrap(), now()).unwrap();
    assert_eq!(rights.ops(), OpMask::ALL);
    assert!(rights.allows(Op::Delete, "/"));
    assert!(rights.allows(Op::Delete, "/a/b"));
}

#[test]
fn expired() {
    let authority = TokenAuthority::generate();
    let token = authority.mint(&scope()).unwrap();
    authority.verify(&token, at(NOW_S + 3599)).unwrap();
    for t in [NOW_S + 3600, NOW_S + 100_000] {
        let err = authority.verify(&token, at(t)).unwrap_err();
        assert!(matches!(err, TokenError::Expired { expired_unix_s } if expired_unix_s == NOW_S + 3600), "{err}");
    }
    // Minted already expired: never verifies.
    let stale = authority.mint(&Scope { expires_at: at(NOW_S - 1), ..scope() }).unwrap();
    assert!(matches!(authority.verify(&stale, now()), Err(TokenError::Expired { .. })));
}

#[test]
fn wrong_tenant_or_container() {
    let authority = TokenAuthority::generate();
    let token = authority.mint(&scope()).unwrap();
    authority.verify_for(&token, "acme", now()).unwrap();
    let err = authority.verify_for(&token, "globex", now()).unwrap_err();
    assert!(
        matches!(&err, TokenError::WrongTenant { token, caller } if token == "acme" && caller == "globex"),
        "{err}"
    );

    let request = Request { tenant: "acme", container: "train", op: Op::Read, path: "/datasets/a" };
    authority.authorize(&token, &request, now()).unwrap();
    let err = authority.authorize(&token, &Request { tenant: "globex", ..request }, now()).unwrap_err();
    assert!(matches!(err, TokenError::WrongTenant { .. }), "{err}");
    let err = authority.authorize(&token, &Request { container: "other", ..request }, now()).unwrap_err();
    assert!(matches!(err, TokenError::WrongContainer { .. }), "{err}");
}

#[test]
fn authorize_runs_the_datalog_on_the_request() {
    let authority = TokenAuthority::generate();
    let parent = authority.mint(&scope()).unwrap();
    let child =
        attenuate(&parent, &authority.public_key(), &narrower("/datasets/a", OpMask::READ, NOW_S + 60), now()).unwrap();
    let request = Request { tenant: "acme", container: "train", op: Op::Read, path: "/datasets/a/x" };
    let rights = authority.authorize(&child, &request, now()).unwrap();
    assert_eq!(rights.ops(), OpMask::READ);

    for (op, path) in [(Op::Write, "/datasets/a/x"), (Op::Read, "/datasets/b"), (Op::Read, "/datasets/ab")] {
        let err = authority.authorize(&child, &Request { op, path, ..request }, now()).unwrap_err();
        match &err {
            TokenError::Denied { reason, .. } => assert!(reason.contains("check if"), "{reason}"),
            other => panic!("{op} {path}: {other}"),
        }
    }
    // The parent allows the write, with the same request.
    authority.authorize(&parent, &Request { op: Op::Write, ..request }, now()).unwrap();
    // A non-normalised path is refused before the Datalog sees it.
    let err = authority.authorize(&parent, &Request { path: "/datasets/a/../../etc", ..request }, now()).unwrap_err();
    assert!(matches!(err, TokenError::Denied { .. }), "{err}");
    // Expiry of the child, not of the parent.
    let err = authority.authorize(&child, &request, at(NOW_S + 60)).unwrap_err();
    assert!(matches!(err, TokenError::Expired { .. }), "{err}");
}

#[test]
fn altered_token_fails() {
    let authority = TokenAuthority::generate();
    let token = authority.mint(&scope()).unwrap();
    let bytes = decode(&token);

    // Flip a bit in the authority block's signature: precisely a signature error.
    let parsed = parse(&authority.public_key(), &token).unwrap();
    let signature = parsed.container().authority.signature.to_bytes().to_vec();
    let at_sig = bytes.windows(signature.len()).position(|w| w == signature.as_slice()).unwrap();
    let mut altered = bytes.clone();
    altered[at_sig + 10] ^= 0x01;
    let err = authority.verify(&encode(&altered), now()).unwrap_err();
    assert!(matches!(err, TokenError::BadSignature), "{err}");

    // Flip a bit in the signed block contents (the tenant name).
    let at_tenant = bytes.windows(4).position(|w| w == b"acme").unwrap();
    let mut altered = bytes.clone();
    altered[at_tenant] = b'b';
    let err = authority.verify(&encode(&altered), now()).unwrap_err();
    assert!(matches!(err, TokenError::BadSignature), "{err}");

    // Every single-bit flip anywhere is an error, never a token.
    for i in 0..bytes.len() {
        for bit in [0x01, 0x80] {
            let mut altered = bytes.clone();
            altered[i] ^= bit;
            assert!(authority.verify(&encode(&altered), now()).is_err(), "byte {i} bit {bit:#x}");
        }
    }
}

#[test]
fn other_authority_fails() {
    let ours = TokenAuthority::generate();
    let theirs = TokenAuthority::generate();
    let token = theirs.mint(&scope()).unwrap();
    let err = ours.verify(&token, now()).unwrap_err();
    assert!(
        matches!(err, TokenError::UnknownAuthority { expected, found } if expected == ours.public_key().key_id()
            && found == Some(theirs.public_key().key_id())),
        "{err}"
    );
    // Another key claiming to be ours (our key id): the signature does not verify.
    let mut params = scope_params("/", OpMask::ALL, NOW_S + 3600);
    params.insert("tenant".into(), Term::Str("acme".into()));
    params.insert("container".into(), Term::Str("train".into()));
    let forged = Biscuit::builder()
        .merge(BlockBuilder::new().code_with_params(AUTHORITY_CODE, params, HashMap::new()).unwrap())
        .root_key_id(ours.public_key().key_id())
        .build(&KeyPair::new())
        .unwrap()
        .to_base64()
        .unwrap();
    let err = ours.verify(&forged, now()).unwrap_err();
    assert!(matches!(err, TokenError::BadSignature), "{err}");
}

#[test]
fn attenuation_narrows() {
    let authority = TokenAuthority::generate();
    let pk = authority.public_key();
    let parent = authority.mint(&scope()).unwrap();
    let child_scope = narrower("/datasets/imagenet", OpMask::READ, NOW_S + 600);
    let child = attenuate(&parent, &pk, &child_scope, now()).unwrap();
    let rights = authority.verify(&child, now()).unwrap();
    assert_eq!(rights.to_scope(), child_scope);
    assert_eq!(rights.blocks(), 2);
    assert!(rights.allows(Op::Read, "/datasets/imagenet/x"));
    assert!(!rights.allows(Op::Read, "/datasets/other"));
    assert!(!rights.allows(Op::Write, "/datasets/imagenet/x"));
    assert!(matches!(authority.verify(&child, at(NOW_S + 600)), Err(TokenError::Expired { .. })));
    // The parent is unchanged.
    assert_eq!(authority.verify(&parent, now()).unwrap().to_scope(), scope());

    // Same scope again is allowed (not wider), and a grandchild narrows further.
    let same = attenuate(&child, &pk, &child_scope, now()).unwrap();
    assert_eq!(authority.verify(&same, now()).unwrap().to_scope(), child_scope);
    let grandchild_scope = narrower("/datasets/imagenet/train", OpMask::READ, NOW_S + 60);
    let grandchild = attenuate(&child, &pk, &grandchild_scope, now()).unwrap();
    let rights = authority.verify(&grandchild, now()).unwrap();
    assert_eq!(rights.to_scope(), grandchild_scope);
    assert_eq!(rights.blocks(), 3);
}

#[test]
fn attenuation_cannot_widen() {
    let authority = TokenAuthority::generate();
    let pk = authority.public_key();
    let parent = authority.mint(&scope()).unwrap();
    let exp = NOW_S + 3600;
    let cases = [
        (narrower("/", OpMask::READ, exp), "Prefix"),
        (narrower("/other", OpMask::READ, exp), "Prefix"),
        (narrower("/datasetsX", OpMask::READ, exp), "Prefix"),
        (narrower("/datasets/a", OpMask::READ | OpMask::DELETE, exp), "Ops"),
        (narrower("/datasets/a", OpMask::READ, exp + 1), "Expiry"),
        (Scope { tenant: "globex".into(), ..scope() }, "Tenant"),
        (Scope { container: "other".into(), ..scope() }, "Container"),
    ];
    for (wider, want) in cases {
        let err = attenuate(&parent, &pk, &wider, now()).unwrap_err();
        match &err {
            TokenError::Widening(w) => assert!(format!("{w:?}").starts_with(want), "{want}: {w:?}"),
            other => panic!("{want}: {other}"),
        }
        assert!(err.to_string().starts_with("attenuation cannot widen"), "{err}");
    }
    let err = attenuate(&parent, &pk, &narrower("/datasets", OpMask::READ | OpMask::DELETE, exp), now()).unwrap_err();
    assert!(matches!(err, TokenError::Widening(Widening::Ops { extra }) if extra == OpMask::DELETE));
    // Nor to an expiry that has passed already: the token could never be used.
    for past in [NOW_S, NOW_S - 60] {
        let err = attenuate(&parent, &pk, &narrower("/datasets", OpMask::READ, past), now()).unwrap_err();
        assert!(matches!(&err, TokenError::InvalidScope { reason } if reason.contains("not after now")), "{err}");
    }
    // An expired parent cannot be attenuated.
    let err = attenuate(&parent, &pk, &narrower("/datasets", OpMask::READ, exp), at(exp)).unwrap_err();
    assert!(matches!(err, TokenError::Expired { .. }), "{err}");
}

#[test]
fn a_wider_block_still_verifies_to_the_intersection() {
    // A holder can append any dpuio block without our `attenuate` (with another
    // biscuit tool); verification must still yield no more than the parent.
    let authority = TokenAuthority::generate();
    let parent = parse(&authority.public_key(), &authority.mint(&scope()).unwrap()).unwrap();
    let exp = NOW_S + 3600;

    let wider_everything = append_scope_block(&parent, "/", OpMask::ALL, exp + 1_000_000).unwrap();
    assert_eq!(authority.verify(&wider_everything, now()).unwrap().to_scope(), scope());

    let mixed = append_scope_block(&parent, "/datasets/a", OpMask::READ | OpMask::DELETE, exp + 10).unwrap();
    let rights = authority.verify(&mixed, now()).unwrap();
    assert_eq!(rights.to_scope(), narrower("/datasets/a", OpMask::READ, exp));

    // Disjoint prefix or operations: nothing is left.
    let disjoint = append_scope_block(&parent, "/elsewhere", OpMask::READ, exp).unwrap();
    assert!(matches!(authority.verify(&disjoint, now()), Err(TokenError::Empty { .. })));
    let no_ops = append_scope_block(&parent, "/datasets", OpMask::DELETE, exp).unwrap();
    assert!(matches!(authority.verify(&no_ops, now()), Err(TokenError::Empty { .. })));

    // A wider block after a narrower one does not undo it.
    let narrow = parse(&authority.public_key(), &mixed).unwrap();
    let rewiden = append_scope_block(&narrow, "/datasets", OpMask::READ | OpMask::WRITE, exp).unwrap();
    assert_eq!(authority.verify(&rewiden, now()).unwrap().to_scope(), narrower("/datasets/a", OpMask::READ, exp));
}

#[test]
fn stripping_or_swapping_blocks_fails() {
    let authority = TokenAuthority::generate();
    let pk = authority.public_key();
    let parent = authority.mint(&scope()).unwrap();
    let child = attenuate(&parent, &pk, &narrower("/datasets/a", OpMask::READ, NOW_S + 60), now()).unwrap();
    let parsed = parse(&pk, &child).unwrap();

    // Remove the attenuation block, keep the rest: the proof no longer matches.
    let mut stripped = parsed.container().clone();
    stripped.blocks.pop();
    let err = authority.verify(&encode(&stripped.to_vec().unwrap()), now()).unwrap_err();
    assert!(matches!(err, TokenError::BadSignature | TokenError::Malformed { .. }), "{err}");

    // Replace the attenuation block with a wider one taken from another child of the
    // same parent: its signature was made for the other chain.
    let wide_child =
        attenuate(&parent, &pk, &narrower("/datasets", OpMask::READ | OpMask::WRITE, NOW_S + 3000), now()).unwrap();
    let wide = parse(&pk, &wide_child).unwrap();
    let mut swapped = parsed.container().clone();
    swapped.blocks[0] = wide.container().blocks[0].clone();
    let err = authority.verify(&encode(&swapped.to_vec().unwrap()), now()).unwrap_err();
    assert!(matches!(err, TokenError::BadSignature | TokenError::Malformed { .. }), "{err}");

    // Graft a whole attenuation (block and proof) from a token of another tenant onto
    // this authority block: the block was signed for the other authority block's key.
    let other_parent = authority.mint(&Scope { tenant: "globex".into(), prefix: "/".into(), ..scope() }).unwrap();
    let other_child = attenuate(&other_parent, &pk, &Scope { tenant: "globex".into(), ..scope() }, now()).unwrap();
    let other = parse(&pk, &other_child).unwrap();
    let mut grafted = parsed.container().clone();
    grafted.blocks[0] = other.container().blocks[0].clone();
    grafted.proof = other.container().proof.clone();
    let err = authority.verify(&encode(&grafted.to_vec().unwrap()), now()).unwrap_err();
    assert!(matches!(err, TokenError::BadSignature | TokenError::Malformed { .. }), "{err}");

    // Sealing (biscuit's final signature) removes the proof key; a sealed token still
    // verifies to the same rights but cannot be attenuated further.
    let sealed = parsed.seal().unwrap().to_base64().unwrap();
    assert_eq!(authority.verify(&sealed, now()).unwrap(), authority.verify(&child, now()).unwrap());
    let err = attenuate(&sealed, &pk, &narrower("/datasets/a", OpMask::READ, NOW_S + 30), now()).unwrap_err();
    assert!(matches!(err, TokenError::Sealed), "{err}");

    // The only way to a broader token is the root key: another key's token fails.
    let forged = TokenAuthority::generate().mint(&scope()).unwrap();
    assert!(authority.verify(&forged, now()).is_err());
}

#[test]
fn foreign_blocks_are_refused() {
    let authority = TokenAuthority::generate();
    let token = authority.mint(&scope()).unwrap();
    for (code, what) in [
        (r#"check if operation("read");"#, "a different check"),
        (r#"operation("delete"); path("/"); time(2100-01-01T00:00:00Z);"#, "facts that satisfy its own checks"),
        (r#"tenant("globex");"#, "a tenant fact"),
        (r#"right($x) <- operation($x);"#, "a rule"),
        (
            r#"scope("/datasets/a", {"read"}, 2030-01-01T00:00:00Z); check if operation($op), {"read"}.contains($op);"#,
            "a scope without all its checks",
        ),
        (
            r#"scope("/datasets/a\", {\"read\"}, 2030-01-01T00:00:00Z); check if path($p), $p == \"x", {"read"}, 2030-01-01T00:00:00Z);"#,
            "a string that prints like several terms",
        ),
        (
            r#"scope("/datasets/a", {"read"}, 2030-01-01T00:00:00Z);
               check if operation($op), {"read"}.contains($op);
               check if path($p), $p.starts_with("/datasets/a");
               check if time($t), $t < 2030-01-01T00:00:00Z;"#,
            "a string-prefix path check",
        ),
    ] {
        let foreign = append_raw(&authority, &token, code);
        let err = authority.verify(&foreign, now()).unwrap_err();
        assert!(matches!(err, TokenError::Unrecognized { block: 1, .. }), "{what}: {err}");
    }

    // A canonical block written by hand is accepted: the format is the contract.
    let expires = 1_900_000_000u64;
    let canonical = append_raw(
        &authority,
        &token,
        &format!(
            r#"scope("/datasets/a", {{"read"}}, {d});
               check if operation($op), {{"read"}}.contains($op);
               check if path($p), $p == "/datasets/a" || $p.starts_with("/datasets/a/");
               check if time($t), $t < {d};"#,
            d = "2030-03-17T17:46:40Z"
        ),
    );
    let rights = authority.verify(&canonical, now()).unwrap();
    assert_eq!(rights.to_scope(), narrower("/datasets/a", OpMask::READ, (NOW_S + 3600).min(expires)));

    // An authority block signed with our key but not in the format is refused too.
    let odd = Biscuit::builder()
        .code(r#"tenant("acme"); container("train"); scope("/", {"read"}, 2030-01-01T00:00:00Z);"#)
        .unwrap()
        .root_key_id(authority.public_key().key_id())
        .build(&authority.root)
        .unwrap()
        .to_base64()
        .unwrap();
    let err = authority.verify(&odd, now()).unwrap_err();
    assert!(matches!(err, TokenError::Unrecognized { block: 0, .. }), "{err}");
}

#[test]
fn block_limit() {
    let authority = TokenAuthority::generate();
    let pk = authority.public_key();
    let mut token = authority.mint(&scope()).unwrap();
    let fresh_len = token.len();
    for i in 1..MAX_BLOCKS {
        token = attenuate(&token, &pk, &narrower("/datasets", OpMask::READ, NOW_S + 3600 - i as u64), now()).unwrap();
    }
    let rights = authority.verify(&token, now()).unwrap();
    assert_eq!(rights.blocks(), MAX_BLOCKS);
    assert_eq!(rights.expires_at(), at(NOW_S + 3600 - (MAX_BLOCKS as u64 - 1)));
    assert!(token.len() < MAX_TOKEN_CHARS, "{} chars", token.len());
    let per_block = (token.len() - fresh_len) / (MAX_BLOCKS - 1);
    assert!(fresh_len < 600 && per_block < 400, "fresh {fresh_len} chars, {per_block} per block");
    let err = attenuate(&token, &pk, &narrower("/datasets", OpMask::READ, NOW_S + 100), now()).unwrap_err();
    assert!(matches!(err, TokenError::TooManyBlocks { count } if count == MAX_BLOCKS + 1), "{err}");
    // One more block appended by hand is refused at verification.
    let over = append_scope_block(&parse(&pk, &token).unwrap(), "/datasets", OpMask::READ, NOW_S + 100).unwrap();
    assert!(matches!(authority.verify(&over, now()), Err(TokenError::TooManyBlocks { .. })));
}

#[test]
fn garbage_never_panics() {
    let authority = TokenAuthority::generate();
    let token = authority.mint(&scope()).unwrap();
    let child =
        attenuate(&token, &authority.public_key(), &narrower("/datasets/a", OpMask::READ, NOW_S + 60), now()).unwrap();
    let expected = [authority.verify(&token, now()).unwrap(), authority.verify(&child, now()).unwrap()];

    for (input, want) in [("", "malformed"), ("not base64!", "malformed"), ("AAAA", "malformed"), ("====", "malformed")]
    {
        let err = authority.verify(input, now()).unwrap_err();
        assert!(err.to_string().starts_with(want), "{input:?}: {err}");
    }
    let huge = "A".repeat(MAX_TOKEN_CHARS + 1);
    assert!(matches!(authority.verify(&huge, now()), Err(TokenError::TooLarge { .. })));

    let mut rng = StdRng::seed_from_u64(0x5eed);
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/";
    for round in 0..3000 {
        let input = match round % 4 {
            // Random bytes.
            0 => {
                let len = rng.random_range(0..600);
                String::from_utf8_lossy(&(0..len).map(|_| rng.random()).collect::<Vec<u8>>()).into_owned()
            }
            // Random base64 text.
            1 => {
                let len = rng.random_range(0..800);
                (0..len).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
            }
            // Valid base64 of random bytes.
            2 => {
                let len = rng.random_range(0..600);
                encode(&(0..len).map(|_| rng.random()).collect::<Vec<u8>>())
            }
            // A real token with a few characters changed or cut short.
            _ => {
                let base = if rng.random() { &token } else { &child };
                let mut chars: Vec<u8> = base.as_bytes().to_vec();
                if rng.random_bool(0.3) {
                    chars.truncate(rng.random_range(0..chars.len()));
                }
                for _ in 0..rng.random_range(1..4) {
                    if chars.is_empty() {
                        break;
                    }
                    let i = rng.random_range(0..chars.len());
                    chars[i] = ALPHABET[rng.random_range(0..ALPHABET.len())];
                }
                String::from_utf8(chars).unwrap()
            }
        };
        match authority.verify(&input, now()) {
            // A change that decodes to the same bytes (base64 padding bits) is fine.
            Ok(rights) => assert!(expected.contains(&rights), "round {round}: {input:?} verified to {rights:?}"),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
        let _ = attenuate(&input, &authority.public_key(), &scope(), now());
    }
}

#[test]
fn invalid_scopes_are_refused_at_mint() {
    let authority = TokenAuthority::generate();
    let cases = [
        Scope { ops: OpMask::NONE, ..scope() },
        Scope { tenant: "".into(), ..scope() },
        Scope { tenant: "-x".into(), ..scope() },
        Scope { container: "a/b".into(), ..scope() },
        Scope { prefix: "datasets".into(), ..scope() },
        Scope { prefix: "/datasets/".into(), ..scope() },
        Scope { prefix: "/a/../b".into(), ..scope() },
        Scope { expires_at: UNIX_EPOCH, ..scope() },
        Scope { expires_at: UNIX_EPOCH - Duration::from_secs(1), ..scope() },
    ];
    for bad in cases {
        let err = authority.mint(&bad).unwrap_err();
        assert!(matches!(err, TokenError::InvalidScope { .. } | TokenError::InvalidName(_)), "{bad:?}: {err}");
    }
    // A prefix so long that the token would exceed the size limit is refused at mint,
    // not handed out to fail later.
    let long = format!("/{}", vec!["x".repeat(255); 12].join("/"));
    let err = authority.mint(&Scope { prefix: long, ..scope() }).unwrap_err();
    assert!(matches!(err, TokenError::TooLarge { .. }), "{err}");

    // Quotes and backslashes cannot be compared exactly through biscuit's printer, so
    // they are refused in prefixes; values are always passed as parameters, never
    // spliced into Datalog code.
    for prefix in ["/a\"); check if false; (\"", "/a\\b"] {
        let err = authority.mint(&Scope { prefix: prefix.into(), ..scope() }).unwrap_err();
        assert!(matches!(err, TokenError::InvalidScope { .. }), "{prefix}: {err}");
    }
    let odd = Scope { prefix: "/a b/(c);{d}/é".into(), ..scope() };
    let rights = authority.verify(&authority.mint(&odd).unwrap(), now()).unwrap();
    assert_eq!(rights.prefix(), odd.prefix);
}

#[test]
fn root_key_files() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let authority = TokenAuthority::load_or_create(&keys).unwrap();
    let key_path = keys.join(ROOT_KEY_FILE);
    let pub_path = keys.join(PUBLIC_KEY_FILE);
    assert_eq!(fs::metadata(&keys).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(fs::metadata(&key_path).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(fs::metadata(&pub_path).unwrap().permissions().mode() & 0o777, 0o644);
    assert!(fs::read_to_string(&key_path).unwrap().starts_with("-----BEGIN PRIVATE KEY-----"));
    let token = authority.mint(&scope()).unwrap();

    // Reloaded: the same key, old tokens still verify.
    let again = TokenAuthority::load_or_create(&keys).unwrap();
    assert_eq!(again.public_key(), authority.public_key());
    again.verify(&token, now()).unwrap();
    let published = TokenPublicKey::from_pem(&fs::read_to_string(&pub_path).unwrap()).unwrap();
    assert_eq!(published, authority.public_key());

    // A missing public key file is written again.
    fs::remove_file(&pub_path).unwrap();
    TokenAuthority::load_or_create(&keys).unwrap();
    assert!(pub_path.exists());

    // A public key file that does not match is an error.
    fs::write(&pub_path, TokenAuthority::generate().public_key().to_pem()).unwrap();
    assert!(matches!(TokenAuthority::load_or_create(&keys), Err(TokenError::InvalidKey { .. })));
    fs::remove_file(&pub_path).unwrap();

    // A readable key is refused.
    fs::set_permissions(&key_path, fs::Permissions::from_mode(0o644)).unwrap();
    let err = TokenAuthority::load_or_create(&keys).err().unwrap();
    assert!(matches!(err, TokenError::KeyPermissions { mode: 0o644, .. }), "{err}");
    assert!(err.to_string().contains("chmod 600"));

    // Garbage is an invalid key, not a panic and not a silent new key.
    files::write_secret(&key_path, b"garbage").unwrap();
    assert!(matches!(TokenAuthority::load_or_create(&keys), Err(TokenError::InvalidKey { .. })));
}

#[test]
fn op_mask() {
    assert_eq!(OpMask::READ.bits(), 1);
    assert_eq!(OpMask::WRITE.bits(), 2);
    assert_eq!(OpMask::CREATE.bits(), 4);
    assert_eq!(OpMask::DELETE.bits(), 8);
    assert_eq!(OpMask::ALL.bits(), 15);
    assert_eq!(OpMask::from_bits(5), Some(OpMask::READ | OpMask::CREATE));
    assert_eq!(OpMask::from_bits(16), None);
    assert_eq!((OpMask::ALL & OpMask::WRITE), OpMask::WRITE);
    assert_eq!(OpMask::ALL.difference(OpMask::READ | OpMask::WRITE), OpMask::CREATE | OpMask::DELETE);
    assert!(OpMask::ALL.contains(OpMask::READ | OpMask::DELETE));
    assert!(!OpMask::READ.contains(OpMask::READ | OpMask::WRITE));
    assert!(OpMask::READ.contains(OpMask::NONE));
    assert_eq!(OpMask::ALL.to_string(), "read,write,create,delete");
    assert_eq!(OpMask::NONE.to_string(), "none");
    assert_eq!(format!("{:?}", OpMask::READ), "OpMask(read)");
    assert_eq!(OpMask::parse_list("read, delete").unwrap(), OpMask::READ | OpMask::DELETE);
    assert_eq!(OpMask::parse_list("").unwrap(), OpMask::NONE);
    assert!(OpMask::parse_list("read,execute").is_err());
    assert_eq!("create".parse::<Op>().unwrap(), Op::Create);
    assert_eq!(Op::ALL.iter().map(|op| op.mask().bits()).sum::<u8>(), 15);
}

/// Found by fuzzing under load: a run out of time must be no answer, never a refusal
/// (which `effective_rights` took for a token in an unknown format).
#[test]
fn a_run_out_of_time_is_a_time_out_not_a_refusal() {
    let authority = TokenAuthority::generate();
    let token = authority.mint(&scope()).unwrap();
    let parsed = parse(&authority.public_key(), &token).unwrap();
    let timed_out = run_authorizer_within(&parsed, Op::Read, "/datasets", NOW_S, None, Duration::ZERO);
    assert!(matches!(timed_out, Err(Refusal::TimedOut)), "no time at all");
    assert!(matches!(Refusal::TimedOut.or_else(|_| TokenError::BadSignature), TokenError::TimedOut));
    assert!(run_authorizer(&parsed, Op::Read, "/datasets", NOW_S, None).is_ok());
    assert!(matches!(run_authorizer(&parsed, Op::Delete, "/datasets", NOW_S, None), Err(Refusal::Checks(_))));
    let e = TokenError::TimedOut.to_string();
    assert!(e.contains("ran out of time") && e.contains("try again"), "{e}");
}
