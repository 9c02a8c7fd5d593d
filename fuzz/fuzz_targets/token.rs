//! Capability tokens (biscuit, ed25519): what a client presents on every attach and
//! request (`token::verify`, `authorize`, `attenuate`).
//!
//! Mode 0 verifies the rest of the input as a token. Mode 1 mints a token for a scope
//! the input describes, checks that it verifies to exactly that scope, attenuates it to
//! a narrower one the input describes, and alters the result as the input says: an
//! altered token is refused or grants exactly what the unaltered one did, never more.
//! Mode 1's tokens are made once per pair of scopes and kept (see [`make`]): a crash
//! input reproduces alone all the same, since making them is deterministic in what it
//! checks.
#![no_main]

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use dpuio_auth::token::{self, Op, OpMask, Request, Scope};
use dpuio_fuzz::{Input, authority, now};
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 4] = ["acme", "training", "a", "b-2"];
const PREFIXES: [&str; 6] = ["/", "/datasets", "/datasets/imagenet", "/a/b", "/datasets/x y", "/data"];

fn scope(input: &mut Input<'_>) -> Scope {
    Scope {
        tenant: NAMES[usize::from(input.u8() % 4)].to_owned(),
        container: NAMES[usize::from(input.u8() % 4)].to_owned(),
        prefix: PREFIXES[usize::from(input.u8() % 6)].to_owned(),
        ops: OpMask::from_bits(input.u8() & 15).unwrap_or(OpMask::READ),
        expires_at: now() + Duration::from_secs(u64::from(input.u16())) - Duration::from_secs(60),
    }
}

/// What mode 1 makes of the scope bytes before the alterations: the token (minted, or
/// attenuated from it) and the rights it verifies to. Minting, attenuating and their
/// checks cost milliseconds (signatures, Datalog) against microseconds for verifying an
/// altered copy, so they are made once per pair of scopes (the first 12 bytes after the
/// mode) and kept for the inputs libFuzzer derives by changing the alterations.
type Made = Option<(String, token::Rights)>;

fn make(input: &mut Input<'_>) -> Made {
    let public = authority().public_key();
    let wanted = scope(input);
    let narrower = scope(input);
    let Ok(minted) = authority().mint(&wanted) else { return None };
    let Ok(rights) = token::verify(&public, &minted, now()) else {
        assert!(wanted.expires_at <= now() || wanted.ops.is_empty(), "a fresh token verifies");
        return None;
    };
    assert_eq!(
        (rights.tenant(), rights.container(), rights.prefix()),
        (&*wanted.tenant, &*wanted.container, &*wanted.prefix)
    );
    assert_eq!(rights.ops(), wanted.ops);
    match token::attenuate(&minted, &public, &narrower, now()) {
        Ok(narrowed) => {
            let r = token::verify(&public, &narrowed, now()).expect("an attenuated token verifies");
            assert!(rights.ops().contains(r.ops()), "attenuation never adds operations");
            assert!(dpuio_auth::names::path_within(r.prefix(), rights.prefix()), "nor widens the prefix");
            assert!(r.expires_at() <= rights.expires_at());
            Some((narrowed, r))
        }
        Err(_) => Some((minted, rights)),
    }
}

thread_local! {
    static MADE: RefCell<HashMap<[u8; 12], Made>> = RefCell::new(HashMap::new());
}

fuzz_target!(|b: &[u8]| {
    let public = authority().public_key();
    let mut input = Input(b);
    if input.u8() % 2 == 0 {
        let text = String::from_utf8_lossy(input.rest());
        if let Ok(rights) = token::verify(&public, &text, now()) {
            assert!(!rights.is_expired(now()));
            let request =
                Request { tenant: rights.tenant(), container: rights.container(), op: Op::Read, path: rights.prefix() };
            let _ = token::authorize(&public, &text, &request, now());
        }
        return;
    }
    let mut key = [0u8; 12];
    let scopes = &input.0[..input.0.len().min(12)];
    key[..scopes.len()].copy_from_slice(scopes);
    let made = MADE.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= 1 << 16 {
            m.clear();
        }
        m.entry(key).or_insert_with(|| make(&mut Input(&key))).clone()
    });
    input.0 = &input.0[scopes.len()..];
    let Some((token, honest)) = made else { return };
    let mut altered = token.clone().into_bytes();
    while input.0.len() >= 3 {
        let (at, to) = (usize::from(input.u16()), input.u8());
        if let Some(c) = altered.get_mut(at) {
            *c = to;
        }
    }
    if altered == token.as_bytes() {
        return;
    }
    let altered = String::from_utf8_lossy(&altered);
    if let Ok(r) = token::verify(&public, &altered, now()) {
        assert_eq!(r, honest, "an altered token grants nothing else");
    }
});
