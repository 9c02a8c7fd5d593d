//! Doorbells, the 16-byte hints a host sends the agent (`Doorbell::decode`).
#![no_main]

use dpuio_proto::wire::Doorbell;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|b: &[u8]| {
    if let Some(bell) = Doorbell::decode(b) {
        assert_eq!(&bell.encode()[..], b, "a doorbell re-encodes to its bytes");
    }
});
