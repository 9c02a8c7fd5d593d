//! The header of an encrypted file as read back from storage (`FileHeader::decode`,
//! then `FileCipher::open` under the tenant's key): stored bytes are untrusted, so any
//! 256 bytes must give a header that re-encodes exactly, or an error; and opening must
//! fail unless the header's tag and wrapped key are genuine.
#![no_main]

use dpuio_crypto::{FileCipher, FileHeader};
use dpuio_fuzz::{PROVIDER, context, kek};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|b: &[u8]| {
    let Ok(header) = FileHeader::decode(b) else { return };
    assert_eq!(&header.encode()[..], b, "a header re-encodes to its bytes");
    if let Ok(cipher) = FileCipher::open(PROVIDER, &context(), &header, &kek()) {
        assert_eq!(cipher.file_id(), header.file_id());
        assert_eq!(cipher.layout(), header.layout());
    }
});
