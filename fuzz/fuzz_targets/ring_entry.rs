//! Submission entries as the agent reads them from a host's ring (`Entry::decode`):
//! strict, so a decoded entry encodes back to exactly its 64 bytes, and the data and
//! metadata decoders agree with the dispatch.
#![no_main]

use dpuio_proto::wire::{Entry, MetaSubmission, SQE_BYTES, Submission};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|b: &[u8]| {
    let _ = Submission::peek_user_data(b);
    match Entry::decode(b) {
        Ok(Entry::Io(sub)) => {
            assert_eq!(&sub.encode()[..], &b[..SQE_BYTES], "a data entry re-encodes to its bytes");
            assert_eq!(Submission::decode(&sub.encode()), Ok(sub));
            assert!(MetaSubmission::decode(b).is_err(), "a data entry is no metadata entry");
        }
        Ok(Entry::Meta(m)) => {
            assert_eq!(&m.encode()[..], &b[..SQE_BYTES], "a metadata entry re-encodes to its bytes");
            assert_eq!(MetaSubmission::decode(&m.encode()), Ok(m));
            assert!(Submission::decode(b).is_err(), "a metadata entry is no data entry");
            let _ = m.opcode.strings(m.arg);
        }
        Err(_) => {
            assert!(Submission::decode(b).is_err() && MetaSubmission::decode(b).is_err());
        }
    }
});
