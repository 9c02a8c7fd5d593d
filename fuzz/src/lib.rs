//! Fixtures shared by the fuzz targets in `fuzz_targets/`, and the seed corpus.
//!
//! Each target feeds bytes from libFuzzer to one family of dpuio's decoders of
//! untrusted bytes and checks more than the absence of panics: where an encoder exists,
//! that a decoded value encodes back to exactly the bytes it came from (the decoders are
//! strict) and that encode-then-decode is the identity; where bytes are authenticated,
//! that altered bytes are refused and never yield other plaintext or wider rights.
//!
//! [`config`] is the agent's own parser, `dpu-agent/src/config.rs`, compiled here by
//! path: the `dpu-agent` crate would bring tonic, tokio and the whole agent into a
//! sanitizer build for one function that needs only `toml`, `fabric` and `dpuio-auth`.
//!
//! Not here: the decoders' unit tests (beside the code) and the agent's I/O.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dpuio_auth::token::{OpMask, Scope, TokenAuthority};
use dpuio_crypto::{AWS_LC_RS, CryptoProvider, FileCipher, FileContext, FileHeader, Kek};
use dpuio_proto::wire;

#[allow(dead_code, clippy::all)]
#[path = "../../dpu-agent/src/config.rs"]
pub mod config;

/// The crypto provider the agent uses by default.
pub const PROVIDER: &dyn CryptoProvider = &AWS_LC_RS;
/// Tenant and container of the encrypted-file fixtures.
pub const TENANT: &str = "fuzz";
pub const CONTAINER: &str = "corpus";
/// Block size of the encrypted-file fixtures (the smallest layout: the fastest to seal).
pub const BLOCK_BYTES: u32 = 4096;
/// A fixed key-encryption key, so that headers in the committed corpus open.
const KEK_BYTES: [u8; 32] = *b"dpuio fuzz corpus key, no secret";

/// The fixtures' key-encryption key (version 1).
pub fn kek() -> Kek {
    Kek::from_bytes(TENANT, 1, &KEK_BYTES).expect("a 32-byte key")
}

/// The fixtures' file context.
pub fn context() -> FileContext {
    FileContext::new(TENANT, CONTAINER).expect("valid names")
}

/// A file cipher (a fresh random data key per process) and its header.
pub fn file() -> &'static (FileCipher, FileHeader) {
    static FILE: OnceLock<(FileCipher, FileHeader)> = OnceLock::new();
    FILE.get_or_init(|| FileCipher::create(PROVIDER, &context(), &kek(), BLOCK_BYTES).expect("create a file"))
}

/// A second file whose cipher must never seal: blocks "read" from it are all forged.
pub fn unsealing_file() -> &'static (FileCipher, FileHeader) {
    static FILE: OnceLock<(FileCipher, FileHeader)> = OnceLock::new();
    FILE.get_or_init(|| FileCipher::create(PROVIDER, &context(), &kek(), BLOCK_BYTES).expect("create a file"))
}

/// "Now" for token checks: fixed, so that a run is reproducible (2026-01-01).
pub fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_767_225_600)
}

/// A token authority with a fixed root key, so that tokens in the committed corpus
/// verify. Loaded from a PKCS#8 PEM written to a private temporary directory, the way
/// the agent loads its `token-root.key`.
pub fn authority() -> &'static TokenAuthority {
    static AUTHORITY: OnceLock<TokenAuthority> = OnceLock::new();
    AUTHORITY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dpuio-fuzz-token-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_root_key(&dir);
        let authority = TokenAuthority::load_or_create(&dir).expect("load the fixed token root key");
        let _ = std::fs::remove_dir_all(&dir);
        authority
    })
}

/// `dir/token-root.key`: the ed25519 PKCS#8 v1 encoding of a fixed 32-byte seed.
fn write_root_key(dir: &std::path::Path) {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    const PKCS8_ED25519_PREFIX: [u8; 16] =
        [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
    let mut der = PKCS8_ED25519_PREFIX.to_vec();
    der.extend_from_slice(b"dpuio fuzz token root, public!!!");
    let pem = format!("-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n", base64(&der));
    std::fs::DirBuilder::new().mode(0o700).recursive(true).create(dir).expect("create the key directory");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join("token-root.key"))
        .expect("create token-root.key");
    f.write_all(pem.as_bytes()).expect("write token-root.key");
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::new();
    for c in bytes.chunks(3) {
        let n = u32::from(c[0]) << 16 | u32::from(*c.get(1).unwrap_or(&0)) << 8 | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// Bytes the fuzzer steers, read front to back; zeros once they run out.
pub struct Input<'a>(pub &'a [u8]);

impl<'a> Input<'a> {
    pub fn u8(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        first
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, i| acc | u64::from(self.u8()) << (8 * i))
    }

    /// A string of at most `max` bytes: a length byte, then that many bytes (lossy UTF-8).
    pub fn string(&mut self, max: usize) -> String {
        let n = usize::from(self.u8()).min(max).min(self.0.len());
        let (s, rest) = self.0.split_at(n);
        self.0 = rest;
        String::from_utf8_lossy(s).into_owned()
    }

    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
}

/// The seed corpus: `(target, name, bytes)`, small valid encodings of what each
/// target decodes (`examples/seed_corpus.rs` writes them to `corpus/<target>/`).
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use wire::*;
    let mut out: Vec<(&'static str, String, Vec<u8>)> = Vec::new();
    let mut add = |target: &'static str, name: &str, bytes: Vec<u8>| out.push((target, name.to_owned(), bytes));

    // Ring entries: one of each data opcode and each metadata opcode.
    for (i, (opcode, flags)) in
        [(Opcode::Read, 0), (Opcode::Write, 0), (Opcode::Write, FLAG_SYNC)].into_iter().enumerate()
    {
        let sub = Submission {
            opcode,
            flags,
            user_data: 42 + i as u64,
            handle: 7,
            region_id: 1,
            file_offset: 4096,
            region_offset: 0,
            length: 65536,
        };
        if let Ok(Entry::Io(back)) = Entry::decode(&sub.encode()) {
            add("ring_entry", &format!("io-{opcode:?}-{flags}"), back.encode().to_vec());
        }
    }
    for (opcode, handle, request, arg) in [
        (MetaOpcode::Stat, 0, 16, 0),
        (MetaOpcode::StatHandle, 9, 0, 0),
        (MetaOpcode::Open, 0, 16, 0),
        (MetaOpcode::Create, 0, 16, 0o644),
        (MetaOpcode::Close, 9, 0, 0),
        (MetaOpcode::OpenRead, 0, 16, 0),
        (MetaOpcode::Lookup, 0, 32, 2),
        (MetaOpcode::Readdir, 0, 24, 0),
    ] {
        let m = MetaSubmission {
            opcode,
            flags: 0,
            user_data: 5,
            handle,
            request_region: if request > 0 { 1 } else { 0 },
            answer_region: 2,
            request_offset: 0,
            answer_offset: 0,
            request_length: request,
            answer_length: 4096,
            arg,
        };
        if MetaSubmission::decode(&m.encode()) == Ok(m) {
            add("ring_entry", &format!("meta-{opcode:?}"), m.encode().to_vec());
        }
    }

    // Ring header and indices: header, then the agent's sq_head, cq_tail and the host's
    // sq_tail, cq_head.
    for (name, entries, idx) in [
        ("fresh", 8u32, [0u64, 0, 0, 0]),
        ("busy", 64, [100, 98, 130, 90]),
        ("wrap", 2, [u64::MAX, u64::MAX - 1, 1, u64::MAX - 1]),
    ] {
        let mut b = RingHeader { entries }.encode().to_vec();
        for i in idx {
            b.extend_from_slice(&i.to_le_bytes());
        }
        add("ring_indices", name, b);
    }

    // The host's side of a ring: a ring size (log2) and where its counters start, then
    // operations, each a clock step (us) and an opcode with its arguments (see
    // fuzz_targets/host_ring.rs): 0 push, 1 submit, 2 an honest completion, 3 any
    // completion, 4 raw bytes in the CQ, 5 poll, 6 withdraw or move, 7 a wait.
    let (push, submit, honest, poll, wait) = ([1, 0, 0], [1, 1], [1, 2], [1, 5], [1, 7, 0x10, 0x27, 50, 1]);
    let honest_round: Vec<u8> =
        [&push[..], &push, &push, &submit, &honest, &honest, &poll, &honest, &poll, &wait].concat();
    add("host_ring", "honest", [&[2u8, 0][..], &honest_round].concat());
    add("host_ring", "wrap", [&[1u8, 1][..], &honest_round, &honest_round].concat());
    let hostile: Vec<u8> = [
        &[2u8, 0][..],
        &push,
        &submit,
        &push,
        &[1, 3, 0, 77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        &poll,
        &[1, 6, 0],
        &push,
        &push,
        &submit,
        &[1, 6, 1, 1],
        &honest,
        &poll,
    ]
    .concat();
    add("host_ring", "hostile", hostile);

    add("doorbell", "bell", Doorbell { session_id: 0x1234_5678, ring_id: 3 }.encode().to_vec());

    // Metadata requests: a count byte, then the strings.
    for (name, strings) in
        [("stat", vec!["/datasets/a.bin"]), ("readdir", vec!["/datasets", ""]), ("lookup", vec!["/a", "/b/c"])]
    {
        let mut b = vec![strings.len() as u8];
        b.extend(encode_strings(&strings).unwrap_or_default());
        add("meta_request", name, b);
    }

    // Metadata answers: a header with its record, a refusal, a completion.
    let attr =
        AttrRecord { kind: KIND_FILE, mode: 0o644, size: 1 << 20, mtime_ns: 1_700_000_000_000_000_000, object_id: 77 };
    let header = MetaHeader { handle: 3, chunk_bytes: 1 << 20, attr, count: 1, more: true };
    add("meta_answer", "header", header.encode().to_vec());
    add("meta_answer", "attr", attr.encode().to_vec());
    let refusal = MetaError { code: CodeWord { code: 5, reason: None }, message: "no such file".into() };
    add("meta_answer", "refusal", refusal.encode(64));
    add("meta_answer", "completion", Completion { user_data: 9, status: 0, result: 4096, seq: 1 }.encode().to_vec());

    // Encrypted files: a header that opens under the fixed key; block reads with no
    // tampering, a flipped byte, a truncated block.
    let (_, header) = FileCipher::create(PROVIDER, &context(), &kek(), BLOCK_BYTES).expect("create a file");
    add("crypto_header", "header", header.encode().to_vec());
    add("crypto_block", "intact", vec![0, 0x00, 0x10]);
    add("crypto_block", "flipped", vec![1, 0x20, 0x03, 0, 5, 0, 0x40]);
    add("crypto_block", "short", vec![2, 0x00, 0x10, 1, 100]);

    // Tokens: mode 0 verifies the bytes as a token; mode 1 mints from a scope the rest
    // describes, then attenuates and alters it.
    let scope = Scope {
        tenant: "acme".into(),
        container: "training".into(),
        prefix: "/datasets".into(),
        ops: OpMask::READ | OpMask::WRITE,
        expires_at: now() + Duration::from_secs(3600),
    };
    if let Ok(token) = authority().mint(&scope) {
        let mut b = vec![0];
        b.extend_from_slice(token.as_bytes());
        add("token", "minted", b);
    }
    add("token", "scope", vec![1, 1, 3, 2, 9, 3, 0, 0, 0, 7, 5, 0]);

    // Readdir anchors: mode 0 a raw token; mode 1 anchor bytes to encode and alter.
    let mut b = vec![0];
    b.extend_from_slice(format!("dfs1.{}.{}", "00".repeat(120), "ab".repeat(16)).as_bytes());
    add("readdir_anchor", "raw", b);
    let mut b = vec![1, 3, 4];
    b.extend_from_slice(&[7u8; 120]);
    add("readdir_anchor", "mutate", b);

    // The config file: the example of the parser's own documentation, and a small one.
    let doc: String = include_str!("../../dpu-agent/src/config.rs")
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .skip_while(|l| !l.starts_with("//! ```toml"))
        .skip(1)
        .take_while(|l| !l.starts_with("//! ```"))
        .map(|l| format!("{}\n", l.trim_start_matches("//!").trim_start()))
        .collect();
    add("config", "documented", doc.into_bytes());
    add(
        "config",
        "daos",
        b"[backend]\nkind = \"daos\"\npool = \"tank\"\n\n[[tenants]]\nname = \"a\"\ncontainer = \"a\"\n".to_vec(),
    );

    // Names: mode byte, then the string.
    add("names", "path", b"\x00/datasets/imagenet/train".to_vec());
    add("names", "ops", b"\x01read, write,create".to_vec());
    add("names", "name", b"\x02shard-0001.tar".to_vec());
    out
}
