//! What the host reads back from the agent on the data plane: metadata answer
//! headers, attribute records, refusals and completions (`MetaHeader`, `AttrRecord`,
//! `MetaError`, `Completion::decode`). The host checks them too: a misbehaving or
//! older agent must not crash a client.
#![no_main]

use dpuio_proto::wire::{AttrRecord, CQE_BYTES, Completion, MetaError, MetaHeader, Status};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|b: &[u8]| {
    if let Some(header) = MetaHeader::decode(b) {
        assert_eq!(&header.encode()[..], &b[..header.encode().len()], "an answer header re-encodes to its bytes");
    }
    if let Some(attr) = AttrRecord::decode(b) {
        assert_eq!(&attr.encode()[..], &b[..attr.encode().len()], "an attribute record re-encodes to its bytes");
    }
    if let Some(error) = MetaError::decode(b) {
        let _ = error.code.reason;
        for room in [8, 16, b.len()] {
            let encoded = error.encode(room);
            assert!(encoded.len() <= room.max(8));
            let back = MetaError::decode(&encoded).expect("an encoded refusal decodes");
            assert_eq!(back.code, error.code);
            assert!(error.message.starts_with(&back.message), "a cut message is a prefix");
        }
    }
    if let Ok(c) = Completion::decode(b) {
        let again = c.encode();
        assert_eq!(Completion::decode(&again), Ok(c));
        assert_eq!(again[..12], b[..12]);
        assert_eq!(again[16..CQE_BYTES], b[16..CQE_BYTES]);
        if let Some(status) = Status::from_i32(c.status) {
            let _ = status.describe();
        }
    }
});
