//! Encrypted blocks as read back from storage (`FileCipher::read_block`,
//! `open_block`): a genuine block is sealed, then altered as the input says (bytes
//! flipped, cut short, run on); reading it must give the genuine plaintext or an
//! error, never a panic and never other bytes. The whole input is also read raw by a
//! second file, which never seals anything (so the fuzzer cannot learn one of its blocks
//! from the comparisons it traces): those bytes must always be refused.
//!
//! Input: `index u8, len u16` (plaintext bytes in the block, at most one block), then
//! `cut u8`, `extend u8`, then `(position u16, xor u8)` alterations.
#![no_main]

use dpuio_crypto::BLOCK_OVERHEAD_BYTES;
use dpuio_fuzz::{BLOCK_BYTES, Input, file, unsealing_file};
use libfuzzer_sys::fuzz_target;

const BLOCK: usize = BLOCK_BYTES as usize;

fuzz_target!(|b: &[u8]| {
    let (cipher, _) = file();
    let mut input = Input(b);
    let index = u64::from(input.u8() % 4);
    let len = usize::from(input.u16()) % (BLOCK + 1);
    let plaintext_bytes = index * u64::from(BLOCK_BYTES) + len as u64;
    let genuine: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ index as u8).collect();
    let mut stored = vec![0u8; len + BLOCK_OVERHEAD_BYTES];
    if len > 0 {
        cipher.seal_block(index, &genuine, &mut stored).expect("seal a block");
    }
    let sealed = stored.clone();
    let (cut, extend) = (usize::from(input.u8()), usize::from(input.u8()));
    stored.truncate(stored.len().saturating_sub(cut));
    stored.extend(std::iter::repeat_n(0xa5, extend));
    while input.0.len() >= 3 {
        let (at, xor) = (usize::from(input.u16()), input.u8());
        if let Some(byte) = stored.get_mut(at) {
            *byte ^= xor;
        }
    }
    let mut plaintext = vec![0u8; BLOCK.max(stored.len())];
    match cipher.read_block(index, plaintext_bytes, &stored, &mut plaintext) {
        Ok(n) => {
            assert_eq!(n, len);
            assert_eq!(&plaintext[..n], &genuine[..], "a block read back is the genuine plaintext");
        }
        Err(_) => assert!(len > 0 && stored.get(..sealed.len()) != Some(&sealed[..]), "an intact block reads back"),
    }
    // Bytes nobody sealed with this data key (fresh, and never used to seal): refused.
    let mut raw = vec![0u8; b.len()];
    assert!(unsealing_file().0.open_block(index, b, &mut raw).is_err(), "unsealed bytes are refused");
});
