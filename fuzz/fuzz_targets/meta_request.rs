//! The strings of a metadata request (`decode_strings`): the bytes the agent copies
//! out of a host region. Decoded strings encode back to exactly the request.
#![no_main]

use dpuio_proto::wire::{decode_strings, encode_strings};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|b: &[u8]| {
    let Some((&count, request)) = b.split_first() else { return };
    if let Ok(strings) = decode_strings(request, usize::from(count)) {
        assert_eq!(strings.len(), usize::from(count));
        assert_eq!(encode_strings(&strings).as_deref(), Some(request), "decoded strings re-encode to the request");
    }
});
