//! Published AES-256-GCM test vectors, copied verbatim (hex) from their sources.

/// One AEAD test case. `valid == false`: the tag is wrong and open must fail.
pub(crate) struct Vector {
    pub name: &'static str,
    pub key: &'static str,
    pub nonce: &'static str,
    pub aad: &'static str,
    pub msg: &'static str,
    pub ct: &'static str,
    pub tag: &'static str,
    pub valid: bool,
}

const NIST_K: &str = "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308";
const NIST_P: &str = "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72\
                      1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255";
const NIST_C: &str = "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa\
                      8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad";

/// McGrew and Viega, "The Galois/Counter Mode of Operation (GCM)", revised spec
/// submitted to NIST, Appendix B, test cases 13 to 16 (the 256-bit-key cases).
/// Cases 17 and 18 use a 64-bit and a 480-bit IV; both providers take only 96-bit
/// nonces, the only length this crate uses, so they are left out.
pub(crate) const NIST_GCM_256: &[Vector] = &[
    Vector {
        name: "GCM spec test case 13",
        key: "0000000000000000000000000000000000000000000000000000000000000000",
        nonce: "000000000000000000000000",
        aad: "",
        msg: "",
        ct: "",
        tag: "530f8afbc74536b9a963b4f1c4cb738b",
        valid: true,
    },
    Vector {
        name: "GCM spec test case 14",
        key: "0000000000000000000000000000000000000000000000000000000000000000",
        nonce: "000000000000000000000000",
        aad: "",
        msg: "00000000000000000000000000000000",
        ct: "cea7403d4d606b6e074ec5d3baf39d18",
        tag: "d0d1c8a799996bf0265b98b5d48ab919",
        valid: true,
    },
    Vector {
        name: "GCM spec test case 15",
        key: NIST_K,
        nonce: "cafebabefacedbaddecaf888",
        aad: "",
        msg: NIST_P,
        ct: NIST_C,
        tag: "b094dac5d93471bdec1a502270e3cc6c",
        valid: true,
    },
    Vector {
        name: "GCM spec test case 16",
        key: NIST_K,
        nonce: "cafebabefacedbaddecaf888",
        aad: "feedfacedeadbeeffeedfacedeadbeefabaddad2",
        // The first 60 bytes of NIST_P and NIST_C.
        msg: "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72\
              1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
        ct: "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa\
             8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662",
        tag: "76fc6ece0f4e1768cddf8853bb2d551b",
        valid: true,
    },
];

const WP_KEY_SEQ: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const WP_KEY_SPECIAL: &str = "00112233445566778899aabbccddeeff102132435465768798a9bacbdcedfe0f";

/// Project Wycheproof, `testvectors/aes_gcm_test.json` (github.com/C2SP/wycheproof),
/// test group ivSize 96 / keySize 256 / tagSize 128, by `tcId`. The invalid cases
/// carry the right ciphertext and a tag with bits flipped.
pub(crate) const WYCHEPROOF_GCM_256: &[Vector] = &[
    Vector {
        name: "Wycheproof tcId 89",
        key: "2ce6b4c15f85fb2da5cc6c269491eef281980309181249ebf2832bd6d0732d0b",
        nonce: "c064fae9173b173fd6f11f34",
        aad: "498d3075b09fed998280583d61bb36b6ce41f130063b80824d1586e143d349b1\
              26b16aa10fe57343ed223d6364ee602257fe313a7fc9bf9088f027795b8dc1d3",
        msg: "f8a27a4baf00dc0555d222f2fa4fb42dc666ea3c",
        ct: "aed58d8a252f740dba4bf6d36773bd5b41234bba",
        tag: "01f93d7456aa184ebb49bea472b6d65d",
        valid: true,
    },
    Vector {
        name: "Wycheproof tcId 92 (special case: tag all ones)",
        key: WP_KEY_SPECIAL,
        nonce: "000000000000000000000000",
        aad: "",
        msg: "561008fa07a68f5c61285cd013464eaf",
        ct: "23293e9b07ca7d1b0cae7cc489a973b3",
        tag: "ffffffffffffffffffffffffffffffff",
        valid: true,
    },
    Vector {
        name: "Wycheproof tcId 93 (special case: tag all zeros)",
        key: WP_KEY_SPECIAL,
        nonce: "ffffffffffffffffffffffff",
        aad: "",
        msg: "c6152244cea1978d3e0bc274cf8c0b3b",
        ct: "7cb6fc7c6abc009efe9551a99f36a421",
        tag: "00000000000000000000000000000000",
        valid: true,
    },
    Vector {
        name: "Wycheproof tcId 94 (flipped bit 0 in tag)",
        key: WP_KEY_SEQ,
        nonce: "505152535455565758595a5b",
        aad: "",
        msg: "202122232425262728292a2b2c2d2e2f",
        ct: "b2061457c0759fc1749f174ee1ccadfa",
        tag: "9de8fef6d8ab1bf1bf887232eab590dd",
        valid: false,
    },
    Vector {
        name: "Wycheproof tcId 109 (flipped bit 120 in tag)",
        key: WP_KEY_SEQ,
        nonce: "505152535455565758595a5b",
        aad: "",
        msg: "202122232425262728292a2b2c2d2e2f",
        ct: "b2061457c0759fc1749f174ee1ccadfa",
        tag: "9ce8fef6d8ab1bf1bf887232eab590dc",
        valid: false,
    },
    Vector {
        name: "Wycheproof tcId 116 (all bits of tag flipped)",
        key: WP_KEY_SEQ,
        nonce: "505152535455565758595a5b",
        aad: "",
        msg: "202122232425262728292a2b2c2d2e2f",
        ct: "b2061457c0759fc1749f174ee1ccadfa",
        tag: "631701092754e40e40778dcd154a6f22",
        valid: false,
    },
    Vector {
        name: "Wycheproof tcId 117 (tag changed to all zero)",
        key: WP_KEY_SEQ,
        nonce: "505152535455565758595a5b",
        aad: "",
        msg: "202122232425262728292a2b2c2d2e2f",
        ct: "b2061457c0759fc1749f174ee1ccadfa",
        tag: "00000000000000000000000000000000",
        valid: false,
    },
    Vector {
        name: "Wycheproof tcId 118 (tag changed to all 1)",
        key: WP_KEY_SEQ,
        nonce: "505152535455565758595a5b",
        aad: "",
        msg: "202122232425262728292a2b2c2d2e2f",
        ct: "b2061457c0759fc1749f174ee1ccadfa",
        tag: "ffffffffffffffffffffffffffffffff",
        valid: false,
    },
];

/// Decode a hex string of the tables above (panics on a typo: test-only).
pub(crate) fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert!(digits.len() % 2 == 0, "odd hex length");
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).expect("hex digit"))
        .collect()
}
