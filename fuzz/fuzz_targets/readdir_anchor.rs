//! Readdir anchors, the position tokens a client hands back to continue a listing on
//! the DAOS backend (`AnchorKey::decode`): only a token this key issued for this
//! directory of this container is accepted, and it gives back exactly the position.
//!
//! Input: `mode u8`, `container`, `dir` (length-prefixed), then for mode 0 a token,
//! for mode 1 the anchor's 120 bytes and `(position u16, replacement u8)` alterations
//! of the token issued for them.
#![no_main]

use std::sync::OnceLock;

use dpuio_daos::{AnchorKey, DAOS_ANCHOR_BYTES, daos_anchor_t};
use dpuio_fuzz::Input;
use libfuzzer_sys::fuzz_target;

fn key() -> &'static AnchorKey {
    static KEY: OnceLock<AnchorKey> = OnceLock::new();
    KEY.get_or_init(AnchorKey::random)
}

fuzz_target!(|b: &[u8]| {
    let mut input = Input(b);
    let mode = input.u8();
    let (container, dir) = (input.string(64), input.string(64));
    if mode % 2 == 0 {
        let token = String::from_utf8_lossy(input.rest());
        // A key drawn in this process issued none of these.
        assert!(key().decode(&container, &dir, &token).is_err(), "a token from elsewhere is refused");
        return;
    }
    let mut bytes = [0u8; DAOS_ANCHOR_BYTES];
    for byte in bytes.iter_mut() {
        *byte = input.u8();
    }
    let anchor = daos_anchor_t::from_bytes(&bytes);
    assert_eq!(anchor.to_bytes(), bytes);
    let token = key().encode(&container, &dir, &anchor);
    let back = key().decode(&container, &dir, &token).expect("an issued token is accepted");
    assert_eq!(back.to_bytes(), bytes, "a token gives back its position");
    assert!(key().decode(&container, &format!("{dir}/x"), &token).is_err(), "not for another directory");
    let mut altered = token.clone().into_bytes();
    while input.0.len() >= 3 {
        let (at, to) = (usize::from(input.u16()), input.u8());
        if let Some(c) = altered.get_mut(at) {
            *c = to;
        }
    }
    let altered = String::from_utf8_lossy(&altered);
    if let Ok(a) = key().decode(&container, &dir, &altered) {
        assert_eq!(altered, token, "an altered token is refused");
        assert_eq!(a.to_bytes(), bytes);
    }
});
