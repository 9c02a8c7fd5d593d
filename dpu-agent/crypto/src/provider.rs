//! Crypto providers: the AES-256-GCM and random-number implementations behind one
//! trait, in the manner of rustls's `CryptoProvider`.
//!
//! Built in: [`AWS_LC_RS`] (the default: AWS-LC's assembly AES-GCM, FIPS-capable) and
//! [`RUST_CRYPTO`] (RustCrypto `aes-gcm`, pure Rust, with AES-NI/CLMUL or ARMv8 crypto
//! extensions detected at run time). Both produce identical bytes; the tests hold
//! them to each other and to published vectors. Another provider (for example the
//! BlueField crypto engine through DOCA) implements the same two traits.
//!
//! A provider sees 96-bit nonces chosen by this crate ([`crate::FileCipher`] draws
//! them from [`CryptoProvider::fill_random`]); it never chooses one itself.

use std::fmt;

use zeroize::Zeroize;

use crate::error::{Error, Result};

/// Bytes of an AES-256 key.
pub const KEY_BYTES: usize = 32;
/// Bytes of an AES-GCM nonce (96 bits, the only length GCM handles without hashing).
pub const NONCE_BYTES: usize = 12;
/// Bytes of an AES-GCM tag (full 128 bits; never truncated).
pub const TAG_BYTES: usize = 16;

/// An AES-GCM nonce.
pub type Nonce = [u8; NONCE_BYTES];
/// An AES-GCM authentication tag.
pub type Tag = [u8; TAG_BYTES];

/// An open failed: the tag did not verify. Deliberately carries nothing; the caller
/// knows which block or key it was and reports that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagMismatch;

/// A source of AES-256-GCM keys and of random bytes.
pub trait CryptoProvider: Send + Sync + fmt::Debug + 'static {
    /// Short name for config, logs and the benchmark (`"aws-lc-rs"`, `"rustcrypto"`).
    fn name(&self) -> &'static str;

    /// Prepare `key` (expand its schedule) for sealing and opening. The provider
    /// keeps no reference to `key`.
    fn aes_256_gcm(&self, key: &[u8; KEY_BYTES]) -> Result<Box<dyn Aes256GcmKey>>;

    /// Fill `dest` with bytes from a cryptographically secure generator that stays
    /// safe across `fork` and restarts (no state that could repeat).
    fn fill_random(&self, dest: &mut [u8]) -> Result<()>;
}

/// One prepared AES-256-GCM key. Nonces are always 96 bits and tags 128 bits.
///
/// Contract of every open: on [`TagMismatch`] the output buffer holds zeros, never
/// partial plaintext. (Libraries decrypt before they compare the tag, and say the
/// output is unspecified on failure; implementations wipe it.)
pub trait Aes256GcmKey: Send + Sync {
    /// Encrypt `buf` in place; returns the tag.
    fn seal_in_place(&self, nonce: &Nonce, aad: &[u8], buf: &mut [u8]) -> Result<Tag>;

    /// Check `tag` and decrypt `buf` in place. On failure `buf` is zeroed.
    fn open_in_place(
        &self,
        nonce: &Nonce,
        aad: &[u8],
        buf: &mut [u8],
        tag: &Tag,
    ) -> std::result::Result<(), TagMismatch>;

    /// Encrypt `plaintext` into `out` (same length); returns the tag. The default
    /// copies, then seals in place.
    fn seal(&self, nonce: &Nonce, aad: &[u8], plaintext: &[u8], out: &mut [u8]) -> Result<Tag> {
        if out.len() != plaintext.len() {
            return Err(Error::BufferSize { what: "seal output", got: out.len(), expected: plaintext.len() });
        }
        out.copy_from_slice(plaintext);
        self.seal_in_place(nonce, aad, out)
    }

    /// Check `tag` and decrypt `ciphertext` into `out`. `out` must be exactly as long
    /// as `ciphertext`; a length mismatch fails like a bad tag (closed). On failure
    /// `out` is zeroed. The default copies, then opens in place.
    fn open(
        &self,
        nonce: &Nonce,
        aad: &[u8],
        ciphertext: &[u8],
        tag: &Tag,
        out: &mut [u8],
    ) -> std::result::Result<(), TagMismatch> {
        if out.len() != ciphertext.len() {
            out.zeroize();
            return Err(TagMismatch);
        }
        out.copy_from_slice(ciphertext);
        self.open_in_place(nonce, aad, out, tag)
    }
}

/// AWS-LC through `aws-lc-rs` (the default provider).
///
/// It uses `LessSafeKey` because this crate supplies the nonces. In a FIPS build
/// (`aws-lc-rs/fips`), FIPS 140-3 wants the module to generate GCM IVs itself
/// (`RandomizedNonceKey`); that switch would live here and in
/// [`crate::FileCipher`]'s one nonce function, with the on-disk format unchanged.
#[derive(Debug, Clone, Copy, Default)]
pub struct AwsLcRs;

/// RustCrypto `aes-gcm` (pure Rust).
#[derive(Debug, Clone, Copy, Default)]
pub struct RustCrypto;

/// The aws-lc-rs provider.
pub static AWS_LC_RS: AwsLcRs = AwsLcRs;
/// The RustCrypto provider.
pub static RUST_CRYPTO: RustCrypto = RustCrypto;

/// Names of the built-in providers, default first.
pub const PROVIDER_NAMES: &[&str] = &["aws-lc-rs", "rustcrypto"];

/// The default provider: aws-lc-rs.
pub fn default_provider() -> &'static dyn CryptoProvider {
    &AWS_LC_RS
}

/// A built-in provider by its [`CryptoProvider::name`] (for config and the CLI).
pub fn provider_by_name(name: &str) -> Result<&'static dyn CryptoProvider> {
    match name {
        "aws-lc-rs" => Ok(&AWS_LC_RS),
        "rustcrypto" => Ok(&RUST_CRYPTO),
        _ => Err(Error::UnknownProvider { name: name.to_owned(), known: PROVIDER_NAMES }),
    }
}

mod aws {
    use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
    use zeroize::Zeroize;

    use super::{Aes256GcmKey, AwsLcRs, CryptoProvider, KEY_BYTES, TAG_BYTES, Tag, TagMismatch};
    use crate::error::{Error, Result};

    const NAME: &str = "aws-lc-rs";

    impl CryptoProvider for AwsLcRs {
        fn name(&self) -> &'static str {
            NAME
        }

        fn aes_256_gcm(&self, key: &[u8; KEY_BYTES]) -> Result<Box<dyn Aes256GcmKey>> {
            let key =
                UnboundKey::new(&AES_256_GCM, key).map_err(|_| Error::Provider { provider: NAME, op: "load a key" })?;
            Ok(Box::new(Key(LessSafeKey::new(key))))
        }

        fn fill_random(&self, dest: &mut [u8]) -> Result<()> {
            // AWS-LC's generator: a DRBG seeded from the OS, reseeded on fork.
            aws_lc_rs::rand::fill(dest).map_err(|_| Error::Random { provider: NAME })
        }
    }

    struct Key(LessSafeKey);

    fn tag_array(tag: &[u8]) -> Result<Tag> {
        tag.try_into().map_err(|_| Error::Provider { provider: NAME, op: "return a 16-byte tag" })
    }

    impl Aes256GcmKey for Key {
        fn seal_in_place(&self, nonce: &[u8; 12], aad: &[u8], buf: &mut [u8]) -> Result<Tag> {
            let tag = self
                .0
                .seal_in_place_separate_tag(Nonce::assume_unique_for_key(*nonce), Aad::from(aad), buf)
                .map_err(|_| Error::Provider { provider: NAME, op: "seal" })?;
            tag_array(tag.as_ref())
        }

        fn open_in_place(
            &self,
            nonce: &[u8; 12],
            aad: &[u8],
            buf: &mut [u8],
            tag: &Tag,
        ) -> std::result::Result<(), TagMismatch> {
            match self.0.open_in_place_separate_tag(Nonce::assume_unique_for_key(*nonce), Aad::from(aad), tag, buf) {
                Ok(_) => Ok(()),
                Err(_) => {
                    buf.zeroize();
                    Err(TagMismatch)
                }
            }
        }

        fn seal(&self, nonce: &[u8; 12], aad: &[u8], plaintext: &[u8], out: &mut [u8]) -> Result<Tag> {
            if out.len() != plaintext.len() {
                return Err(Error::BufferSize { what: "seal output", got: out.len(), expected: plaintext.len() });
            }
            let mut tag = [0u8; TAG_BYTES];
            self.0
                .seal_out_of_place_scatter(
                    Nonce::assume_unique_for_key(*nonce),
                    Aad::from(aad),
                    plaintext,
                    out,
                    &[],
                    &mut tag,
                )
                .map_err(|_| Error::Provider { provider: NAME, op: "seal" })?;
            Ok(tag)
        }

        fn open(
            &self,
            nonce: &[u8; 12],
            aad: &[u8],
            ciphertext: &[u8],
            tag: &Tag,
            out: &mut [u8],
        ) -> std::result::Result<(), TagMismatch> {
            let opened = out.len() == ciphertext.len()
                && self
                    .0
                    .open_separate_gather(Nonce::assume_unique_for_key(*nonce), Aad::from(aad), ciphertext, tag, out)
                    .is_ok();
            if opened {
                Ok(())
            } else {
                out.zeroize();
                Err(TagMismatch)
            }
        }
    }
}

mod rust_crypto {
    use aes_gcm::aead::{AeadInPlace, KeyInit};
    use aes_gcm::{Aes256Gcm, Nonce};
    use zeroize::Zeroize;

    use super::{Aes256GcmKey, CryptoProvider, KEY_BYTES, RustCrypto, Tag, TagMismatch};
    use crate::error::{Error, Result};

    const NAME: &str = "rustcrypto";

    impl CryptoProvider for RustCrypto {
        fn name(&self) -> &'static str {
            NAME
        }

        fn aes_256_gcm(&self, key: &[u8; KEY_BYTES]) -> Result<Box<dyn Aes256GcmKey>> {
            // With the `zeroize` feature the expanded key is wiped on drop.
            Ok(Box::new(Key(Aes256Gcm::new(key.into()))))
        }

        fn fill_random(&self, dest: &mut [u8]) -> Result<()> {
            // The OS generator (getrandom(2)); no user-space state to fork or repeat.
            getrandom::fill(dest).map_err(|_| Error::Random { provider: NAME })
        }
    }

    struct Key(Aes256Gcm);

    impl Aes256GcmKey for Key {
        fn seal_in_place(&self, nonce: &[u8; 12], aad: &[u8], buf: &mut [u8]) -> Result<Tag> {
            let tag = self
                .0
                .encrypt_in_place_detached(Nonce::from_slice(nonce), aad, buf)
                .map_err(|_| Error::Provider { provider: NAME, op: "seal" })?;
            Ok(tag.into())
        }

        fn open_in_place(
            &self,
            nonce: &[u8; 12],
            aad: &[u8],
            buf: &mut [u8],
            tag: &Tag,
        ) -> std::result::Result<(), TagMismatch> {
            match self.0.decrypt_in_place_detached(Nonce::from_slice(nonce), aad, buf, tag.into()) {
                Ok(()) => Ok(()),
                Err(_) => {
                    // aes-gcm 0.10 checks the tag before it decrypts, so `buf` still
                    // holds ciphertext; wiping keeps the contract independent of that.
                    buf.zeroize();
                    Err(TagMismatch)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, RngCore, SeedableRng};

    use super::*;
    use crate::vectors::{NIST_GCM_256, Vector, WYCHEPROOF_GCM_256, hex};

    const PROVIDERS: [&dyn CryptoProvider; 2] = [&AWS_LC_RS, &RUST_CRYPTO];

    fn check_vector(provider: &dyn CryptoProvider, v: &Vector) {
        let key: [u8; 32] = hex(v.key).try_into().unwrap();
        let nonce: Nonce = hex(v.nonce).try_into().unwrap();
        let (aad, msg, ct) = (hex(v.aad), hex(v.msg), hex(v.ct));
        let tag: Tag = hex(v.tag).try_into().unwrap();
        let key = provider.aes_256_gcm(&key).unwrap();
        let name = (provider.name(), v.name);
        if v.valid {
            let mut buf = msg.clone();
            assert_eq!(key.seal_in_place(&nonce, &aad, &mut buf).unwrap(), tag, "{name:?} tag");
            assert_eq!(buf, ct, "{name:?} ciphertext");
            let mut out = vec![0u8; ct.len()];
            assert_eq!(key.seal(&nonce, &aad, &msg, &mut out).unwrap(), tag, "{name:?} seal tag");
            assert_eq!(out, ct, "{name:?} seal ciphertext");
            key.open_in_place(&nonce, &aad, &mut buf, &tag).unwrap();
            assert_eq!(buf, msg, "{name:?} open");
            key.open(&nonce, &aad, &ct, &tag, &mut out).unwrap();
            assert_eq!(out, msg, "{name:?} open out of place");
        } else {
            // The ciphertext is right; only the tag was altered.
            let mut buf = msg.clone();
            assert_ne!(key.seal_in_place(&nonce, &aad, &mut buf).unwrap(), tag, "{name:?}");
            assert_eq!(buf, ct, "{name:?} ciphertext");
            let mut buf = ct.clone();
            assert_eq!(key.open_in_place(&nonce, &aad, &mut buf, &tag), Err(TagMismatch), "{name:?}");
            assert!(buf.iter().all(|&b| b == 0), "{name:?}: buffer not wiped");
            let mut out = vec![0xeeu8; ct.len()];
            assert_eq!(key.open(&nonce, &aad, &ct, &tag, &mut out), Err(TagMismatch), "{name:?}");
            assert!(out.iter().all(|&b| b == 0), "{name:?}: output not wiped");
        }
    }

    #[test]
    fn published_vectors() {
        for provider in PROVIDERS {
            for v in NIST_GCM_256.iter().chain(WYCHEPROOF_GCM_256) {
                check_vector(provider, v);
            }
        }
    }

    /// One provider seals, the other opens; same key, nonce and AAD give the same
    /// bytes. Random lengths include 0, non-multiples of 16 and more than one block
    /// of the 4-way/8-way interleaved assembly paths. Kept to ~100 KiB in total because
    /// RustCrypto is slow in debug builds.
    #[test]
    fn providers_agree_on_random_inputs() {
        let mut rng = StdRng::seed_from_u64(0x5eed_0001);
        for round in 0..200 {
            let mut key = [0u8; 32];
            let mut nonce = [0u8; 12];
            rng.fill_bytes(&mut key);
            rng.fill_bytes(&mut nonce);
            let aad: Vec<u8> = (0..rng.random_range(0..100)).map(|_| rng.random()).collect();
            let len = if round % 50 == 0 { rng.random_range(2000..4000) } else { rng.random_range(0..300) };
            let msg: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            let aws = AWS_LC_RS.aes_256_gcm(&key).unwrap();
            let rc = RUST_CRYPTO.aes_256_gcm(&key).unwrap();
            let (mut a, mut r) = (msg.clone(), msg.clone());
            let tag_a = aws.seal_in_place(&nonce, &aad, &mut a).unwrap();
            let tag_r = rc.seal_in_place(&nonce, &aad, &mut r).unwrap();
            assert_eq!((&a, tag_a), (&r, tag_r), "round {round}");
            rc.open_in_place(&nonce, &aad, &mut a, &tag_a).unwrap();
            aws.open_in_place(&nonce, &aad, &mut r, &tag_r).unwrap();
            assert_eq!(a, msg);
            assert_eq!(r, msg);
        }
    }

    #[test]
    fn random_bytes_differ_and_names_resolve() {
        for provider in PROVIDERS {
            let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
            provider.fill_random(&mut a).unwrap();
            provider.fill_random(&mut b).unwrap();
            assert_ne!(a, b);
            assert_eq!(provider_by_name(provider.name()).unwrap().name(), provider.name());
        }
        assert_eq!(default_provider().name(), "aws-lc-rs");
        let err = provider_by_name("openssl").err().unwrap().to_string();
        assert!(err.contains("openssl") && err.contains("aws-lc-rs"), "{err}");
    }

    #[test]
    fn out_of_place_length_mismatch_fails_closed() {
        for provider in PROVIDERS {
            let key = provider.aes_256_gcm(&[1; 32]).unwrap();
            let mut out = [0u8; 10];
            assert!(matches!(key.seal(&[0; 12], b"", &[1; 11], &mut out), Err(Error::BufferSize { .. })));
            let mut out = [5u8; 10];
            assert_eq!(key.open(&[0; 12], b"", &[1; 11], &[0; 16], &mut out), Err(TagMismatch));
            assert_eq!(out, [0; 10]);
        }
    }
}
