//! Tests of the envelope, the header tag and block sealing (cipher.rs), across both
//! providers.

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::cipher::unwrap;
use crate::*;

const PROVIDERS: [&'static dyn CryptoProvider; 2] = [&AWS_LC_RS, &RUST_CRYPTO];
const B: u32 = 4096;

fn ctx(tenant: &str, container: &str) -> FileContext {
    FileContext::new(tenant, container).unwrap()
}

fn kek(tenant: &str, version: u32) -> Kek {
    Kek::generate(&AWS_LC_RS, tenant, version).unwrap()
}

fn sealed(cipher: &FileCipher, index: u64, plaintext: &[u8]) -> Vec<u8> {
    let mut stored = vec![0u8; plaintext.len() + BLOCK_OVERHEAD_BYTES];
    assert_eq!(cipher.seal_block(index, plaintext, &mut stored).unwrap(), stored.len());
    stored
}

fn open(cipher: &FileCipher, index: u64, stored: &[u8]) -> Result<Vec<u8>> {
    let mut out = vec![0u8; stored.len().saturating_sub(BLOCK_OVERHEAD_BYTES)];
    let n = cipher.open_block(index, stored, &mut out)?;
    out.truncate(n);
    Ok(out)
}

#[test]
fn file_cipher_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<FileCipher>();
    assert_send_sync::<FileKeySource>();
}

#[test]
fn seal_and_open_round_trip_in_every_combination_of_providers() {
    let c = ctx("vision", "vision");
    let k = kek("vision", 1);
    let plaintext: Vec<u8> = (0..B).map(|i| (i * 7) as u8).collect();
    for creator in PROVIDERS {
        let (writer, mut header) = FileCipher::create(creator, &c, &k, B).unwrap();
        writer.set_plaintext_bytes(&mut header, u64::from(B) + 100).unwrap();
        let full = sealed(&writer, 0, &plaintext);
        let short = sealed(&writer, 1, &plaintext[..100]);
        let encoded = header.encode();
        for reader in PROVIDERS {
            let header = FileHeader::decode(&encoded).unwrap();
            let cipher = FileCipher::open(reader, &c, &header, &k).unwrap();
            assert_eq!(open(&cipher, 0, &full).unwrap(), plaintext, "{} -> {}", creator.name(), reader.name());
            assert_eq!(open(&cipher, 1, &short).unwrap(), &plaintext[..100]);
            let mut in_place = full.clone();
            assert_eq!(cipher.open_block_in_place(0, &mut in_place).unwrap(), &plaintext[..]);
            // In-place sealing: plaintext already at stored[12..].
            let mut stored = vec![0u8; 300 + BLOCK_OVERHEAD_BYTES];
            stored[NONCE_BYTES..NONCE_BYTES + 300].copy_from_slice(&plaintext[..300]);
            cipher.seal_block_in_place(5, &mut stored).unwrap();
            assert_ne!(&stored[NONCE_BYTES..NONCE_BYTES + 300], &plaintext[..300]);
            assert_eq!(open(&writer, 5, &stored).unwrap(), &plaintext[..300]);
        }
    }
}

/// Every single-byte change of a stored block (nonce, ciphertext or tag) is an
/// integrity error, and the output holds no plaintext afterwards, for both the
/// out-of-place and the in-place open and both providers.
#[test]
fn any_flipped_byte_of_a_block_fails_and_releases_nothing() {
    let c = ctx("t", "c");
    let k = kek("t", 1);
    let plaintext = [0x5au8; 100];
    for provider in PROVIDERS {
        let (cipher, _) = FileCipher::create(provider, &c, &k, B).unwrap();
        let stored = sealed(&cipher, 3, &plaintext);
        for at in 0..stored.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut bad = stored.clone();
                bad[at] ^= flip;
                let mut out = [0xaau8; 200];
                let err = cipher.open_block(3, &bad, &mut out).err().unwrap();
                assert!(matches!(err, Error::Integrity { block_index: 3 }), "{} byte {at}: {err:?}", provider.name());
                assert!(err.is_integrity());
                assert!(out[..100].iter().all(|&b| b == 0), "{} byte {at}: plaintext left", provider.name());
                assert!(out[100..].iter().all(|&b| b == 0xaa), "bytes past the block are not touched");
                let body = cipher.open_block_in_place(3, &mut bad).err().unwrap();
                assert!(matches!(body, Error::Integrity { block_index: 3 }));
                assert!(bad[NONCE_BYTES..NONCE_BYTES + 100].iter().all(|&b| b == 0), "in place, byte {at}");
            }
        }
        // Truncated or padded stored blocks fail too.
        for len in [0, 1, 28, 29, stored.len() - 1] {
            assert!(matches!(open(&cipher, 3, &stored[..len]), Err(Error::Integrity { .. })), "len {len}");
        }
        let mut longer = stored.clone();
        longer.push(0);
        assert!(matches!(open(&cipher, 3, &longer), Err(Error::Integrity { .. })));
    }
}

#[test]
fn swapped_and_moved_blocks_are_detected() {
    let c = ctx("vision", "shared");
    let k = kek("vision", 1);
    let (file_a, _) = FileCipher::create(&AWS_LC_RS, &c, &k, B).unwrap();
    let (file_b, _) = FileCipher::create(&AWS_LC_RS, &c, &k, B).unwrap();
    let block0 = sealed(&file_a, 0, &[1; 64]);
    let block1 = sealed(&file_a, 1, &[2; 64]);
    // Within a file: each block opens only at its own index.
    assert!(matches!(open(&file_a, 1, &block0), Err(Error::Integrity { block_index: 1 })));
    assert!(matches!(open(&file_a, 0, &block1), Err(Error::Integrity { block_index: 0 })));
    // Between files of the same tenant and container.
    assert!(matches!(open(&file_b, 0, &block0), Err(Error::Integrity { .. })));
    // Between tenants.
    let other = ctx("nlp", "shared");
    let (file_c, _) = FileCipher::create(&AWS_LC_RS, &other, &kek("nlp", 1), B).unwrap();
    assert!(matches!(open(&file_c, 0, &block0), Err(Error::Integrity { .. })));
}

/// Different files always have different data keys, which alone stops moved
/// blocks. This checks the AAD binding on its own: the *same* data key and file id
/// under a different tenant, container, origin version or index does not open.
#[test]
fn block_aad_binds_tenant_container_file_origin_version_and_index() {
    let c = ctx("vision", "box");
    let k = kek("vision", 4);
    let (cipher, header) = FileCipher::create(&AWS_LC_RS, &c, &k, B).unwrap();
    let data_key = unwrap(&AWS_LC_RS, &c, &k, &header).unwrap();
    let block = sealed(&cipher, 9, &[7; 33]);
    let same = FileCipher::from_parts(&AWS_LC_RS, &c, &data_key, &header).unwrap();
    assert_eq!(open(&same, 9, &block).unwrap(), [7; 33]);
    let mut other_file = header.clone();
    other_file.file_id.0[0] ^= 1;
    let mut other_origin = header.clone();
    other_origin.origin_key_version += 1;
    let variants = [
        (ctx("nlp", "box"), header.clone()),
        (ctx("vision", "box2"), header.clone()),
        (ctx("visio", "nbox"), header.clone()), // same bytes if names were not length-prefixed
        (c.clone(), other_file),
        (c.clone(), other_origin),
    ];
    for (context, h) in variants {
        let moved = FileCipher::from_parts(&AWS_LC_RS, &context, &data_key, &h).unwrap();
        assert!(matches!(open(&moved, 9, &block), Err(Error::Integrity { block_index: 9 })), "{context:?}");
    }
    assert!(open(&same, 8, &block).is_err());
}

#[test]
fn two_seals_of_the_same_block_use_different_nonces() {
    let (cipher, _) = FileCipher::create(&AWS_LC_RS, &ctx("t", "c"), &kek("t", 1), B).unwrap();
    let mut nonces = std::collections::HashSet::new();
    let first = sealed(&cipher, 0, &[0; 64]);
    for _ in 0..1000 {
        let again = sealed(&cipher, 0, &[0; 64]);
        assert_ne!(again[NONCE_BYTES..], first[NONCE_BYTES..], "same ciphertext twice");
        assert!(nonces.insert(again[..NONCE_BYTES].to_vec()), "nonce repeated");
    }
}

#[test]
fn nonce_budget_is_enforced() {
    let (cipher, _) = FileCipher::create(&AWS_LC_RS, &ctx("t", "c"), &kek("t", 1), B).unwrap();
    cipher.force_seals(MAX_SEALS_PER_KEY - 1);
    let mut stored = [0u8; 64];
    cipher.seal_block(0, &[1; 10], &mut stored).unwrap();
    assert!(matches!(cipher.seal_block(0, &[1; 10], &mut stored), Err(Error::NonceBudgetExhausted { .. })));
    assert!(matches!(cipher.seal_block(0, &[1; 10], &mut stored), Err(Error::NonceBudgetExhausted { .. })));
    // Opening is unaffected.
    assert_eq!(open(&cipher, 0, &stored[..38]).unwrap(), [1; 10]);
}

#[test]
fn wrong_or_mismatched_key_names_tenant_and_version() {
    let c = ctx("vision", "vision");
    let k = kek("vision", 2);
    let (_, header) = FileCipher::create(&AWS_LC_RS, &c, &k, B).unwrap();
    // Another key behind the same version (a wrong key file).
    let err = FileCipher::open(&AWS_LC_RS, &c, &header, &kek("vision", 2)).err().unwrap();
    assert!(matches!(&err, Error::WrongKey { tenant, key_version: 2 } if tenant == "vision"), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("\"vision\"") && message.contains("version 2"), "{message}");
    // The right bytes under another version label, or another tenant's key.
    for wrong in [kek("vision", 3), kek("nlp", 2)] {
        let err = FileCipher::open(&AWS_LC_RS, &c, &header, &wrong).err().unwrap();
        assert!(matches!(err, Error::KeyMismatch { expected_version: 2, .. }), "{err:?}");
        assert!(err.to_string().contains("version 2"));
    }
    // The right key, but the header presented as another tenant's or container's.
    for moved in [ctx("nlp", "vision"), ctx("vision", "other")] {
        let err = FileCipher::open(&AWS_LC_RS, &moved, &header, &Kek::generate(&AWS_LC_RS, moved.tenant(), 2).unwrap());
        assert!(matches!(err, Err(Error::WrongKey { .. })));
    }
    // A missing key: the source names tenant and version (see keys.rs tests too).
    let source = FileKeySource::new();
    let err = source.key_encryption_key("vision", header.key_version()).err().unwrap();
    assert!(matches!(&err, Error::KeyNotFound { tenant, key_version: 2, .. } if tenant == "vision"));
    // Create refuses a key of another tenant.
    assert!(matches!(FileCipher::create(&AWS_LC_RS, &c, &kek("nlp", 1), B), Err(Error::KeyMismatch { .. })));
}

/// Any single-byte change of the stored header makes decode or open fail; changes
/// in the wrapped key read as a wrong key (indistinguishable, by design).
#[test]
fn any_flipped_byte_of_the_header_is_refused() {
    let c = ctx("t", "c");
    let k = kek("t", 1);
    for provider in PROVIDERS {
        let (cipher, mut header) = FileCipher::create(provider, &c, &k, B).unwrap();
        cipher.set_plaintext_bytes(&mut header, 12345).unwrap();
        let good = header.encode();
        assert!(FileCipher::open(provider, &c, &FileHeader::decode(&good).unwrap(), &k).is_ok());
        for at in 0..HEADER_BYTES {
            let mut bad = good;
            bad[at] ^= 0x04;
            let result = FileHeader::decode(&bad).and_then(|h| FileCipher::open(provider, &c, &h, &k));
            let err = result.err().unwrap_or_else(|| panic!("{}: byte {at} accepted", provider.name()));
            if (48..108).contains(&at) {
                assert!(matches!(err, Error::WrongKey { .. }) && err.is_integrity(), "byte {at}: {err:?}");
            }
            if (16..24).contains(&at) || at >= 228 {
                assert!(matches!(err, Error::HeaderIntegrity { .. }), "byte {at}: {err:?}");
            }
        }
    }
}

#[test]
fn rewrap_keeps_data_readable_and_retires_the_old_key() {
    let c = ctx("vision", "vision");
    let (v1, v2) = (kek("vision", 1), kek("vision", 2));
    let (cipher, mut header) = FileCipher::create(&AWS_LC_RS, &c, &v1, B).unwrap();
    let block = sealed(&cipher, 0, b"survives rotation");
    cipher.set_plaintext_bytes(&mut header, 17).unwrap();
    let before = header.clone();

    // A wrong "old" key changes nothing.
    let mut copy = header.clone();
    assert!(matches!(copy.rewrap(&AWS_LC_RS, &c, &kek("vision", 1), &v2), Err(Error::WrongKey { .. })));
    assert_eq!(copy, before);
    // Nor does a tampered header: its size must not be laundered into a valid tag.
    let mut tampered = header.clone();
    tampered.plaintext_bytes = 1 << 30;
    assert!(matches!(tampered.rewrap(&AWS_LC_RS, &c, &v1, &v2), Err(Error::HeaderIntegrity { .. })));

    header.rewrap(&AWS_LC_RS, &c, &v1, &v2).unwrap();
    assert_eq!((header.key_version(), header.origin_key_version(), header.plaintext_bytes()), (2, 1, 17));
    assert_ne!(header.wrapped_key(), before.wrapped_key());
    let header = FileHeader::decode(&header.encode()).unwrap();
    let reopened = FileCipher::open(&RUST_CRYPTO, &c, &header, &v2).unwrap();
    assert_eq!(open(&reopened, 0, &block).unwrap(), b"survives rotation");
    // The old key no longer opens it: refused by version, and its bytes presented
    // as version 2 do not unwrap.
    assert!(matches!(FileCipher::open(&AWS_LC_RS, &c, &header, &v1), Err(Error::KeyMismatch { .. })));
    let mut old_bytes_as_v2 = [0u8; 32];
    old_bytes_as_v2.copy_from_slice(v1.secret().bytes());
    let impostor = Kek::from_bytes("vision", 2, &old_bytes_as_v2).unwrap();
    assert!(matches!(
        FileCipher::open(&AWS_LC_RS, &c, &header, &impostor),
        Err(Error::WrongKey { key_version: 2, .. })
    ));
    // Rotation is repeatable, and back to an old version is allowed (a rollback of a
    // bad rotation), still without touching blocks.
    let mut header = header;
    let v3 = kek("vision", 3);
    header.rewrap(&AWS_LC_RS, &c, &v2, &v3).unwrap();
    header.rewrap(&AWS_LC_RS, &c, &v3, &v1).unwrap();
    assert_eq!(
        open(&FileCipher::open(&AWS_LC_RS, &c, &header, &v1).unwrap(), 0, &block).unwrap(),
        b"survives rotation"
    );
}

#[test]
fn header_size_updates_are_authenticated() {
    let c = ctx("t", "c");
    let k = kek("t", 1);
    let (cipher, mut header) = FileCipher::create(&AWS_LC_RS, &c, &k, B).unwrap();
    cipher.set_plaintext_bytes(&mut header, 3 * u64::from(B)).unwrap();
    let mut forged = header.clone();
    forged.plaintext_bytes = u64::from(B); // storage cutting the file short
    assert!(matches!(FileCipher::open(&AWS_LC_RS, &c, &forged, &k), Err(Error::HeaderIntegrity { .. })));
    assert_eq!(FileCipher::open(&AWS_LC_RS, &c, &header, &k).unwrap().file_id(), header.file_id());
    // Headers of another file cannot be re-tagged by this cipher.
    let (_, other) = FileCipher::create(&AWS_LC_RS, &c, &k, B).unwrap();
    let mut other = other;
    assert!(matches!(cipher.set_plaintext_bytes(&mut other, 1), Err(Error::HeaderIntegrity { .. })));
    assert!(cipher.set_plaintext_bytes(&mut header, MAX_PLAINTEXT_BYTES + 1).is_err());
}

#[test]
fn buffer_and_index_misuse_is_an_error_not_a_panic() {
    let (cipher, _) = FileCipher::create(&AWS_LC_RS, &ctx("t", "c"), &kek("t", 1), B).unwrap();
    let mut big = vec![0u8; B as usize + 100];
    assert!(matches!(cipher.seal_block(0, &[], &mut big), Err(Error::BufferSize { .. })));
    assert!(matches!(cipher.seal_block(0, &vec![0; B as usize + 1], &mut big), Err(Error::BufferSize { .. })));
    assert!(matches!(cipher.seal_block(0, &[1; 10], &mut [0; 37]), Err(Error::BufferSize { .. })));
    assert!(matches!(cipher.seal_block(u64::MAX, &[1; 10], &mut big), Err(Error::OutOfRange { .. })));
    assert!(matches!(cipher.seal_block_in_place(0, &mut [0; 28]), Err(Error::BufferSize { .. })));
    let stored = sealed(&cipher, 0, &[3; 50]);
    assert!(matches!(cipher.open_block(0, &stored, &mut [0; 49]), Err(Error::BufferSize { .. })));
    assert!(matches!(FileContext::new("", "c"), Err(Error::InvalidName { what: "tenant", .. })));
    assert!(matches!(FileContext::new("t", &"x".repeat(256)), Err(Error::InvalidName { what: "container", .. })));
    assert!(matches!(
        FileCipher::create(&AWS_LC_RS, &ctx("t", "c"), &kek("t", 1), 1000),
        Err(Error::InvalidBlockSize { .. })
    ));
    let debug = format!("{cipher:?}");
    assert!(debug.contains("aws-lc-rs") && debug.contains("block_bytes: 4096"), "{debug}");
}

/// A stored file kept in memory, written only through write/resize/repair plans
/// and `patch_block`, read back through `read_range` and `read_block`, checked
/// against a plain copy.
struct Model {
    cipher: FileCipher,
    header: FileHeader,
    stored: Vec<u8>,
}

/// Where the agent "crashes" during an update.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Stop {
    /// The update completes.
    Never,
    /// Growing: after the blocks, before the header. Shrinking: after the header,
    /// before the block.
    Middle,
    /// Shrinking: after the block, before the stored file is cut.
    BeforeCut,
}

impl Model {
    fn seal_blocks(&mut self, plan: WritePlan, data: &[u8]) {
        let layout = self.cipher.layout();
        let old = self.header.plaintext_bytes();
        let mut out = vec![0u8; layout.stored_block_bytes()];
        for block in plan {
            let range = layout.read_range(block.index, old, self.stored.len() as u64);
            let old_stored =
                if block.needs_read() { &self.stored[range.start as usize..range.end as usize] } else { &[] };
            let n = self.cipher.patch_block(&block, old_stored, data, &mut out).unwrap();
            let at = layout.stored_offset(block.index) as usize;
            if self.stored.len() < at + n {
                self.stored.resize(at + n, 0);
            }
            self.stored[at..at + n].copy_from_slice(&out[..n]);
        }
    }

    fn write_header(&mut self, size: u64) {
        self.cipher.set_plaintext_bytes(&mut self.header, size).unwrap();
        self.stored[..HEADER_BYTES].copy_from_slice(&self.header.encode());
    }

    fn cut(&mut self) {
        let size = self.header.plaintext_bytes();
        self.stored.truncate(self.cipher.layout().stored_bytes(size) as usize);
    }

    /// A write or resize plan, in the order the crate documentation gives.
    fn update(&mut self, plan: WritePlan, data: &[u8], stop: Stop) {
        let old = self.header.plaintext_bytes();
        let new = plan.new_plaintext_bytes();
        if new >= old {
            self.seal_blocks(plan, data);
            if stop == Stop::Middle {
                return;
            }
            self.write_header(new);
        } else {
            self.write_header(new);
            if stop == Stop::Middle {
                return;
            }
            // The plan was made for the old size; its blocks know their old length.
            let layout = self.cipher.layout();
            let mut out = vec![0u8; layout.stored_block_bytes()];
            for block in plan {
                let range = layout.read_range(block.index, old, self.stored.len() as u64);
                let n = self
                    .cipher
                    .patch_block(&block, &self.stored[range.start as usize..range.end as usize], &[], &mut out)
                    .unwrap();
                let at = layout.stored_offset(block.index) as usize;
                self.stored[at..at + n].copy_from_slice(&out[..n]);
            }
            if stop == Stop::BeforeCut {
                return;
            }
            self.cut();
        }
    }

    /// What the engine does before writing to a file that may have crashed.
    fn repair(&mut self) {
        let size = self.header.plaintext_bytes();
        let plan = self.cipher.layout().repair_plan(size, self.stored.len() as u64).unwrap();
        self.seal_blocks(plan, &[]);
        self.cut();
    }

    fn read_all(&self) -> Vec<u8> {
        let layout = self.cipher.layout();
        let size = self.header.plaintext_bytes();
        let stored_bytes = self.stored.len() as u64;
        let mut out = vec![0u8; size as usize];
        for index in layout.blocks(0, size).unwrap() {
            let mut block = vec![0u8; layout.block_bytes() as usize];
            let range = layout.read_range(index, size, stored_bytes);
            let stored = &self.stored[range.start as usize..range.end as usize];
            let n = self.cipher.read_block(index, size, stored, &mut block).unwrap();
            assert_eq!(n, layout.block_len(index, size));
            assert!(block[n..].iter().all(|&b| b == 0), "bytes past the file size released");
            let at = layout.block_offset(index) as usize;
            out[at..at + n].copy_from_slice(&block[..n]);
        }
        out
    }

    fn consistent(&self) -> bool {
        self.stored.len() as u64 == self.cipher.layout().stored_bytes(self.header.plaintext_bytes())
    }
}

/// Random writes and resizes, with agent crashes at every documented point: after
/// each step the file reads back as the plain model says; after a crash it still
/// reads (at the size its header has), and a repair makes it consistent again.
#[test]
fn random_writes_resizes_and_crashes_match_a_plain_file() {
    let c = ctx("t", "c");
    let k = kek("t", 1);
    let mut rng = StdRng::seed_from_u64(0x5eed_0003);
    let (cipher, header) = FileCipher::create(&AWS_LC_RS, &c, &k, B).unwrap();
    let mut model = Model { cipher, stored: header.encode().to_vec(), header };
    let mut plain: Vec<u8> = Vec::new();
    let bu = B as u64;
    let mut crashes = 0;
    for step in 0..400 {
        let size = plain.len() as u64;
        let stop = match step % 5 {
            1 => Stop::Middle,
            3 => Stop::BeforeCut,
            _ => Stop::Never,
        };
        let mut data = Vec::new();
        let (plan, expected) = if step % 4 == 3 {
            let new = if rng.random() { rng.random_range(0..=size) } else { rng.random_range(size..=size + 3 * bu) };
            let mut expected = plain.clone();
            expected.resize(new as usize, 0);
            (model.cipher.layout().resize_plan(size, new).unwrap(), expected)
        } else {
            let offset = rng.random_range(0..=size + 2 * bu);
            let len = match step % 3 {
                0 => rng.random_range(1..64),
                1 => rng.random_range(1..3 * bu),
                _ => bu * rng.random_range(1..3),
            };
            data = vec![0u8; len as usize];
            rng.fill_bytes(&mut data);
            let mut expected = plain.clone();
            let end = (offset + len) as usize;
            if expected.len() < end {
                expected.resize(end, 0);
            }
            expected[offset as usize..end].copy_from_slice(&data);
            (model.cipher.layout().write_plan(offset, len, size).unwrap(), expected)
        };
        let shrink = (expected.len() as u64) < size;
        model.update(plan, &data, stop);
        let crashed = match stop {
            Stop::Never => false,
            Stop::Middle => true,
            Stop::BeforeCut => shrink,
        };
        if crashed {
            crashes += 1;
            // Restart: decode the header from "disk", reopen, read, repair.
            let header = FileHeader::decode(&model.stored[..HEADER_BYTES]).unwrap();
            model.cipher = FileCipher::open(&AWS_LC_RS, &c, &header, &k).unwrap();
            model.header = header;
            let visible = model.header.plaintext_bytes() as usize;
            // Growing: the old size, with the new blocks' content. Shrinking: the new size.
            assert_eq!(visible, if shrink { expected.len() } else { plain.len() }, "step {step}");
            assert!(model.read_all() == expected[..visible], "after crash, step {step} {stop:?}");
            model.repair();
            assert!(model.consistent(), "step {step}");
            assert!(model.read_all() == expected[..visible], "after repair, step {step}");
            plain = expected[..visible].to_vec();
        } else {
            plain = expected;
            assert!(model.consistent(), "step {step}");
            assert!(model.read_all() == plain, "step {step}");
        }
        if plain.len() > 40 * B as usize {
            model.update(model.cipher.layout().resize_plan(plain.len() as u64, 0).unwrap(), &[], Stop::Never);
            plain.clear();
        }
    }
    assert!(crashes > 50, "{crashes}");
}

#[test]
fn patch_of_a_corrupt_or_short_old_block_releases_nothing() {
    let (cipher, _) = FileCipher::create(&AWS_LC_RS, &ctx("t", "c"), &kek("t", 1), B).unwrap();
    let layout = cipher.layout();
    let old = sealed(&cipher, 0, &[9; 100]);
    let mut out = vec![0u8; layout.stored_block_bytes()];
    let plan = layout.write_plan(10, 5, 100).unwrap().next().unwrap();
    let mut bad = old.clone();
    bad[50] ^= 1;
    assert!(matches!(cipher.patch_block(&plan, &bad, &[1; 5], &mut out), Err(Error::Integrity { block_index: 0 })));
    assert!(out.iter().all(|&b| b == 0));
    // The header says 200 bytes but the stored block holds 100: truncated.
    let plan = layout.write_plan(150, 5, 200).unwrap().next().unwrap();
    assert!(matches!(cipher.patch_block(&plan, &old, &[1; 5], &mut out), Err(Error::Integrity { .. })));
    assert!(out.iter().all(|&b| b == 0));
    assert!(matches!(cipher.patch_block(&plan, &old, &[1; 5], &mut out[..100]), Err(Error::BufferSize { .. })));
    // A crash left the block longer than the header's size: the extra bytes become
    // zeros, not resurrected data.
    let plan = layout.write_plan(60, 0, 50).unwrap().next();
    assert!(plan.is_none());
    let plan = layout.resize_plan(50, 80).unwrap().next().unwrap();
    let n = cipher.patch_block(&plan, &old, &[], &mut out).unwrap();
    let reopened = open(&cipher, 0, &out[..n]).unwrap();
    assert_eq!(&reopened[..50], &[9; 50]);
    assert_eq!(&reopened[50..], &[0; 30]);
}
