//! Unit tests of the wrapper, over the `local` backend in a temporary directory.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::thread;

use dpuio_backend::local::LocalBackend;
use dpuio_backend::{Attr, Backend, Container, DirEntry, Error, NsPath, Object, OpenOptions, Result};
use dpuio_crypto::{
    AWS_LC_RS, BLOCK_OVERHEAD_BYTES, CryptoProvider, FileKeySource, HEADER_BYTES, KeySource, Layout, MAGIC, RUST_CRYPTO,
};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::{EncryptedContainer, EncryptionSettings, MAX_ZERO_FILL_BYTES, PlaintextFiles, key_status, rotate};

const B: usize = 4096;
const SB: usize = B + BLOCK_OVERHEAD_BYTES;
const H: usize = HEADER_BYTES;

/// A local backend in a temporary directory (in memory where there is one), and a
/// directory of 0600 key files.
struct Env {
    dir: tempfile::TempDir,
    backend: LocalBackend,
}

impl Env {
    fn new() -> Env {
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() { tempfile::tempdir_in(shm).unwrap() } else { tempfile::tempdir().unwrap() };
        let backend = LocalBackend::open(dir.path().join("root")).unwrap();
        fs::create_dir(dir.path().join("keys")).unwrap();
        Env { dir, backend }
    }

    fn raw(&self, container: &str) -> Arc<dyn Container> {
        self.backend.mount(container, true).unwrap()
    }

    /// A fresh random key in a 0600 file.
    fn key_file(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join("keys").join(name);
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        let mut file = fs::File::create(&path).unwrap();
        file.write_all(&key).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    fn stored(&self, container: &str, path: &str) -> PathBuf {
        self.dir.path().join("root/containers").join(container).join(path.trim_start_matches('/'))
    }
}

fn source(keys: &[(&str, u32, &Path)]) -> Arc<dyn KeySource> {
    let mut source = FileKeySource::new();
    for (tenant, version, path) in keys {
        source.add_key_file(tenant, *version, path).unwrap();
    }
    Arc::new(source)
}

fn settings(tenant: &str, container: &str, keys: Arc<dyn KeySource>, key_version: u32) -> EncryptionSettings {
    EncryptionSettings {
        tenant: tenant.into(),
        container: container.into(),
        provider: &AWS_LC_RS,
        key_source: keys,
        key_version,
        block_bytes: B as u32,
        plaintext_files: PlaintextFiles::ReadOnly,
        running: Arc::default(),
    }
}

fn encrypted(raw: &Arc<dyn Container>, settings: EncryptionSettings) -> EncryptedContainer {
    EncryptedContainer::new(raw.clone(), settings).unwrap()
}

/// One tenant "t" with key version 1, container "c".
fn single() -> (Env, Arc<dyn Container>, EncryptedContainer) {
    let env = Env::new();
    let raw = env.raw("c");
    let key = env.key_file("t1");
    let enc = encrypted(&raw, settings("t", "c", source(&[("t", 1, &key)]), 1));
    (env, raw, enc)
}

fn p(s: &str) -> NsPath {
    NsPath::parse(s).unwrap()
}

fn rw() -> OpenOptions {
    OpenOptions { write: true, create: true, ..OpenOptions::default() }
}

fn ro() -> OpenOptions {
    OpenOptions::default()
}

fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

fn read_all(object: &dyn Object) -> Vec<u8> {
    let size = object.stat().unwrap().size as usize;
    let mut buf = vec![0u8; size + 10];
    let n = object.read_at(&mut buf, 0).unwrap();
    buf.truncate(n);
    buf
}

fn flip(path: &Path, at: usize) {
    let file = fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, at as u64).unwrap();
    file.write_all_at(&[byte[0] ^ 0x5a], at as u64).unwrap();
}

fn copy_range(from: &Path, from_at: usize, to: &Path, to_at: usize, len: usize) {
    let bytes = fs::read(from).unwrap()[from_at..from_at + len].to_vec();
    fs::OpenOptions::new().write(true).open(to).unwrap().write_all_at(&bytes, to_at as u64).unwrap();
}

fn is_integrity(r: &Result<impl std::fmt::Debug>, block: Option<u64>) -> bool {
    matches!(r, Err(Error::Integrity { block_index, .. }) if *block_index == block)
}

fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() { all_files(&path, out) } else { out.push(path) }
    }
}

#[test]
fn a_marker_written_appears_nowhere_in_storage() {
    let (env, _raw, enc) = single();
    let marker = b"MARKER-4f1c-plaintext-never-stored";
    enc.mkdir(&p("/dir"), 0o755).unwrap();
    let a = enc.open(&p("/a"), rw(), 0o644).unwrap();
    a.write_at(marker, 0).unwrap();
    let b = enc.open(&p("/dir/b"), rw(), 0o644).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    b.write_at(&random_bytes(&mut rng, 5 * B + 300), 0).unwrap();
    // Straddling a block boundary, inside a block, at the end, past the end.
    for at in [B - 5, 2 * B + 77, 5 * B + 300 - marker.len(), 7 * B + 1] {
        b.write_at(marker, at as u64).unwrap();
    }
    b.truncate(6 * B as u64 + 3).unwrap();
    b.write_at(&marker.repeat(200), 3).unwrap();
    b.sync().unwrap();
    enc.sync().unwrap();
    let content = read_all(&*b);
    assert_eq!(content.len(), 6 * B + 3);
    assert_eq!(&content[3..3 + marker.len()], marker);
    assert_eq!(&read_all(&*a), marker);
    // Sizes seen through the wrapper are plaintext sizes.
    assert_eq!(enc.stat(&p("/dir/b")).unwrap().size, 6 * B as u64 + 3);
    assert_eq!(a.stat().unwrap().size, marker.len() as u64);
    let (listing, _) = enc.readdir(&p("/dir"), None, 10).unwrap();
    assert_eq!((listing[0].name.as_str(), listing[0].attr.size), ("b", 6 * B as u64 + 3));

    let mut files = Vec::new();
    all_files(env.dir.path().join("root").as_path(), &mut files);
    assert_eq!(files.len(), 2);
    for file in files {
        let stored = fs::read(&file).unwrap();
        assert_eq!(&stored[..8], &MAGIC, "{}", file.display());
        assert!(!stored.windows(marker.len()).any(|w| w == marker), "marker found in {}", file.display());
        assert!(!stored.windows(8).any(|w| w == &marker[..8]), "marker prefix found in {}", file.display());
    }
    assert_eq!(fs::metadata(env.stored("c", "/dir/b")).unwrap().len(), (H + 6 * SB + 3 + 28) as u64);
}

/// A file of 3 full blocks and a 100-byte one, its content, and its stored path.
fn three_and_a_bit(env: &Env, enc: &EncryptedContainer, name: &str, seed: u64) -> (Vec<u8>, PathBuf) {
    let content = random_bytes(&mut StdRng::seed_from_u64(seed), 3 * B + 100);
    let f = enc.open(&p(name), rw(), 0o644).unwrap();
    f.write_at(&content, 0).unwrap();
    (content, env.stored(enc.name(), name))
}

/// Read block `index` of `object`, which must fail with an integrity error naming
/// that block and release none of its plaintext.
fn assert_block_fails(object: &dyn Object, index: usize, content: &[u8], why: &str) {
    let range = index * B..((index + 1) * B).min(content.len());
    let mut buf = vec![0xeeu8; range.len()];
    let r = object.read_at(&mut buf, range.start as u64);
    assert!(is_integrity(&r, Some(index as u64)), "{why}: {r:?}");
    assert!(buf.iter().all(|&b| b == 0 || b == 0xee), "{why}: plaintext released");
    // A read spanning the whole file fails too.
    let mut all = vec![0u8; content.len()];
    assert!(matches!(object.read_at(&mut all, 0), Err(Error::Integrity { block_index: Some(_), .. })), "{why}");
}

fn assert_block_reads(object: &dyn Object, index: usize, content: &[u8]) {
    let range = index * B..((index + 1) * B).min(content.len());
    let mut buf = vec![0u8; range.len()];
    assert_eq!(object.read_at(&mut buf, range.start as u64).unwrap(), range.len());
    assert!(buf == content[range], "block {index}");
}

#[test]
fn flipping_any_byte_of_a_block_fails_that_block_only() {
    let (env, _raw, enc) = single();
    let (content, stored) = three_and_a_bit(&env, &enc, "/f", 2);
    let f = enc.open(&p("/f"), ro(), 0).unwrap();
    // Every byte of block 1 (nonce, ciphertext, tag) and of the short last block.
    let targets = (H + SB..H + 2 * SB).map(|at| (1, at)).chain((H + 3 * SB..H + 3 * SB + 128).map(|at| (3, at)));
    for (index, at) in targets {
        flip(&stored, at);
        assert_block_fails(&*f, index, &content, &format!("byte {at}"));
        for other in (0..4).filter(|&i| i != index) {
            assert_block_reads(&*f, other, &content);
        }
        flip(&stored, at);
    }
    assert_eq!(read_all(&*f), content);
    // Sampled bytes of the other blocks.
    for at in [H, H + 11, H + 12, H + 2000, H + SB - 16, H + SB - 1, H + 2 * SB + 5, H + 3 * SB - 1] {
        flip(&stored, at);
        let index = (at - H) / SB;
        assert_block_fails(&*f, index, &content, &format!("byte {at}"));
        flip(&stored, at);
    }
}

#[test]
fn flipping_any_byte_of_the_header_fails_the_open() {
    let (env, _raw, enc) = single();
    let (content, stored) = three_and_a_bit(&env, &enc, "/f", 3);
    for at in 0..H {
        flip(&stored, at);
        let r = enc.open(&p("/f"), ro(), 0);
        match (at, &r) {
            (_, Err(Error::Integrity { block_index: None, .. })) => {}
            // The key version: the source has no key of the flipped version.
            (24..=27, Err(Error::Key { reason, .. })) => assert!(reason.contains("\"t\""), "{reason}"),
            _ => panic!("header byte {at}: {:?}", r.map(|_| ())),
        }
        // The wrapped data key (nonce, ciphertext, tag) fails as a wrong key would.
        if (48..108).contains(&at) {
            let Err(Error::Integrity { detail, .. }) = r else { unreachable!() };
            assert!(detail.contains("tenant \"t\" version 1"), "{detail}");
        }
        flip(&stored, at);
    }
    assert_eq!(read_all(&*enc.open(&p("/f"), ro(), 0).unwrap()), content);
}

#[test]
fn moved_blocks_are_detected() {
    let env = Env::new();
    let key = env.key_file("shared");
    // Two tenants under the very same key bytes: only the binding tells them apart.
    let keys = source(&[("t", 1, &key), ("u", 1, &key)]);
    let (raw_c, raw_d) = (env.raw("c"), env.raw("d"));
    let enc = encrypted(&raw_c, settings("t", "c", keys.clone(), 1));
    let other_tenant = encrypted(&raw_d, settings("u", "d", keys, 1));
    let (x, x_path) = three_and_a_bit(&env, &enc, "/x", 4);
    let (y, y_path) = three_and_a_bit(&env, &enc, "/y", 5);
    let (_, z_path) = three_and_a_bit(&env, &other_tenant, "/z", 6);
    let original_x = fs::read(&x_path).unwrap();
    let original_y = fs::read(&y_path).unwrap();

    // Blocks 0 and 1 of one file swapped.
    let mut swapped = original_x.clone();
    swapped[H..H + SB].copy_from_slice(&original_x[H + SB..H + 2 * SB]);
    swapped[H + SB..H + 2 * SB].copy_from_slice(&original_x[H..H + SB]);
    fs::write(&x_path, &swapped).unwrap();
    let f = enc.open(&p("/x"), ro(), 0).unwrap();
    assert_block_fails(&*f, 0, &x, "swapped within a file");
    assert_block_fails(&*f, 1, &x, "swapped within a file");
    assert_block_reads(&*f, 2, &x);
    fs::write(&x_path, &original_x).unwrap();

    // Block 1 of another file of the same container.
    copy_range(&y_path, H + SB, &x_path, H + SB, SB);
    assert_block_fails(&*f, 1, &x, "from another file");
    fs::write(&x_path, &original_x).unwrap();

    // Block 1 of another tenant's file.
    copy_range(&z_path, H + SB, &x_path, H + SB, SB);
    assert_block_fails(&*f, 1, &x, "from another tenant");
    fs::write(&x_path, &original_x).unwrap();
    assert_eq!(read_all(&*f), x);
    drop(f);

    // Another file's whole header: its envelope opens, none of this file's blocks do.
    copy_range(&y_path, 0, &x_path, 0, H);
    let f = enc.open(&p("/x"), ro(), 0).unwrap();
    assert_block_fails(&*f, 0, &x, "header from another file");
    drop(f);
    fs::write(&x_path, &original_x).unwrap();
    // A header from another tenant does not even unwrap.
    copy_range(&z_path, 0, &x_path, 0, H);
    assert!(is_integrity(&enc.open(&p("/x"), ro(), 0).map(|_| ()), None));
    fs::write(&x_path, &original_x).unwrap();
    assert_eq!(read_all(&*enc.open(&p("/y"), ro(), 0).unwrap()), y);
    assert_eq!(fs::read(&y_path).unwrap(), original_y);
}

#[test]
fn wrong_or_missing_keys_name_tenant_and_version() {
    let env = Env::new();
    let raw = env.raw("c");
    let (k1, k2, other) = (env.key_file("k1"), env.key_file("k2"), env.key_file("other"));
    let enc = encrypted(&raw, settings("t", "c", source(&[("t", 1, &k1)]), 1));
    enc.open(&p("/f"), rw(), 0o644).unwrap().write_at(b"secret", 0).unwrap();

    // The key of version 1 is not in the source.
    let missing = encrypted(&raw, settings("t", "c", source(&[("t", 2, &k2)]), 2));
    let Err(Error::Key { path, reason }) = missing.open(&p("/f"), ro(), 0) else { panic!("expected a key error") };
    assert_eq!(path, "/f");
    assert!(reason.contains("\"t\"") && reason.contains("version 1"), "{reason}");
    // Stat needs no key (the size is in the header).
    assert_eq!(missing.stat(&p("/f")).unwrap().size, 6);

    // Another key behind version 1.
    let wrong = encrypted(&raw, settings("t", "c", source(&[("t", 1, &other)]), 1));
    let Err(Error::Integrity { block_index: None, detail, .. }) = wrong.open(&p("/f"), ro(), 0) else {
        panic!("expected an integrity error")
    };
    assert!(detail.contains("tenant \"t\" version 1") && detail.contains("wrong key"), "{detail}");

    // A current version the source lacks is refused up front.
    let err = EncryptedContainer::new(raw.clone(), settings("t", "c", source(&[("t", 1, &k1)]), 3)).unwrap_err();
    assert!(err.to_string().contains("\"t\"") && err.to_string().contains("version 3"), "{err}");
    // And a new file cannot be made without the current key.
    let settings_new = EncryptionSettings::new("t", "c", source(&[("t", 1, &k1), ("t", 4, &k2)])).unwrap();
    assert_eq!((settings_new.key_version, settings_new.block_bytes), (4, dpuio_crypto::DEFAULT_BLOCK_BYTES));
    assert!(format!("{settings_new:?}").contains("aws-lc-rs"));

    // A key file others can read is refused by the source, with the fix.
    let loose = env.key_file("loose");
    fs::set_permissions(&loose, fs::Permissions::from_mode(0o644)).unwrap();
    let err = FileKeySource::new().add_key_file("t", 9, &loose).unwrap_err();
    assert!(err.to_string().contains("chmod 600"), "{err}");
}

/// Random reads, writes (partial, across blocks, sparse) and truncates against a
/// plaintext model, reopening now and then (also through a fresh container, which
/// loads everything from storage again).
fn model_run(provider: &'static dyn CryptoProvider, seed: u64, ops: usize) {
    let env = Env::new();
    let raw = env.raw("c");
    let key = env.key_file("k");
    let make = || {
        let mut s = settings("t", "c", source(&[("t", 1, &key)]), 1);
        s.provider = provider;
        encrypted(&raw, s)
    };
    let mut enc = make();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model: Vec<u8> = Vec::new();
    let mut f = enc.open(&p("/m"), rw(), 0o644).unwrap();
    for op in 0..ops {
        match rng.random_range(0..100) {
            0..40 => {
                let offset =
                    if rng.random_bool(0.2) { rng.random_range(0..6) * B } else { rng.random_range(0..6 * B + 50) };
                let len = if rng.random_bool(0.2) { rng.random_range(1..3) * B } else { rng.random_range(1..3 * B) };
                let data = random_bytes(&mut rng, len);
                f.write_at(&data, offset as u64).unwrap();
                if model.len() < offset + len {
                    model.resize(offset + len, 0);
                }
                model[offset..offset + len].copy_from_slice(&data);
            }
            40..75 => {
                let offset = rng.random_range(0..7 * B);
                let len = rng.random_range(0..3 * B);
                let mut buf = vec![0xaau8; len];
                let n = f.read_at(&mut buf, offset as u64).unwrap();
                let want = model.len().saturating_sub(offset).min(len);
                assert_eq!(n, want, "op {op}: read {len} at {offset} of {}", model.len());
                assert!(n == 0 || buf[..n] == model[offset..offset + n], "op {op}: read {len} at {offset}");
            }
            75..85 => {
                let size = rng.random_range(0..6 * B);
                f.truncate(size as u64).unwrap();
                model.resize(size, 0);
            }
            85..88 => {
                // Sparse: well past the end.
                let offset = model.len() + rng.random_range(B..8 * B);
                f.write_at(b"far", offset as u64).unwrap();
                model.resize(offset, 0);
                model.extend_from_slice(b"far");
            }
            88..94 => {
                drop(f);
                if rng.random_bool(0.5) {
                    enc = make();
                }
                f = enc.open(&p("/m"), rw(), 0).unwrap();
            }
            _ => {
                assert_eq!(f.stat().unwrap().size, model.len() as u64, "op {op}");
                assert_eq!(enc.stat(&p("/m")).unwrap().size, model.len() as u64, "op {op}");
                let layout = Layout::new(B as u32).unwrap();
                assert_eq!(fs::metadata(env.stored("c", "/m")).unwrap().len(), layout.stored_bytes(model.len() as u64));
            }
        }
    }
    assert_eq!(read_all(&*f), model);
    // Another open shares the state; a read-only one sees the same bytes.
    assert_eq!(read_all(&*enc.open(&p("/m"), ro(), 0).unwrap()), model);
    assert_eq!(read_all(&*make().open(&p("/m"), ro(), 0).unwrap()), model);
}

#[test]
fn random_access_matches_a_plaintext_model() {
    model_run(&AWS_LC_RS, 7, 1500);
    model_run(&RUST_CRYPTO, 8, 300);
}

/// The pattern byte at file offset `at` written by writer `t`.
fn pattern(t: usize, at: usize) -> u8 {
    ((at % 251) as u8) ^ (t as u8 + 1) ^ 0x80
}

#[test]
fn concurrent_writers_of_disjoint_ranges_and_a_reader() {
    let (_env, _raw, enc) = single();
    let f = enc.open(&p("/f"), rw(), 0o644).unwrap();
    const PIECE: usize = 3000; // not block aligned: neighbours share blocks
    const THREADS: usize = 4;
    const PIECES: usize = 40;
    let total = PIECE * THREADS * PIECES;
    let owner = |at: usize| (at / PIECE) % THREADS;
    let done = std::sync::atomic::AtomicBool::new(false);
    thread::scope(|s| {
        let mut writers = Vec::new();
        for t in 0..THREADS {
            let f = &f;
            writers.push(s.spawn(move || {
                for i in 0..PIECES {
                    let start = (i * THREADS + t) * PIECE;
                    let data: Vec<u8> = (start..start + PIECE).map(|at| pattern(t, at)).collect();
                    f.write_at(&data, start as u64).unwrap();
                }
            }));
        }
        let (f, done) = (&f, &done);
        s.spawn(move || {
            let mut rng = StdRng::seed_from_u64(9);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let offset = rng.random_range(0..total);
                let mut buf = vec![0u8; rng.random_range(1..3 * B)];
                let n = f.read_at(&mut buf, offset as u64).expect("a reader never sees a torn block");
                for (k, &b) in buf[..n].iter().enumerate() {
                    let at = offset + k;
                    assert!(b == 0 || b == pattern(owner(at), at), "byte {at}: {b}");
                }
            }
        });
        for writer in writers {
            writer.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let content = read_all(&*f);
    assert_eq!(content.len(), total);
    for (at, &b) in content.iter().enumerate() {
        assert_eq!(b, pattern(owner(at), at), "byte {at}");
    }
}

#[test]
fn parallel_pieces_of_one_large_write_to_a_new_file() {
    // The data plane's shape: 256 KiB pieces of one request on several threads, at
    // the default 64 KiB blocks; every piece extends the file.
    let env = Env::new();
    let raw = env.raw("c");
    let key = env.key_file("k");
    let mut s = settings("t", "c", source(&[("t", 1, &key)]), 1);
    s.block_bytes = dpuio_crypto::DEFAULT_BLOCK_BYTES;
    let enc = encrypted(&raw, s);
    let f = enc.open(&p("/big"), rw(), 0o644).unwrap();
    let content = random_bytes(&mut StdRng::seed_from_u64(10), 16 * 256 * 1024 + 1000);
    let pieces: Vec<(usize, &[u8])> =
        content.chunks(256 * 1024).enumerate().map(|(i, c)| (i * 256 * 1024, c)).collect();
    thread::scope(|scope| {
        for lane in 0..4 {
            let (f, pieces) = (&f, &pieces);
            scope.spawn(move || {
                // Highest offsets first on some lanes: pieces land out of order.
                let mine: Vec<_> = pieces.iter().skip(lane).step_by(4).collect();
                let order: Box<dyn Iterator<Item = _>> =
                    if lane % 2 == 0 { Box::new(mine.into_iter()) } else { Box::new(mine.into_iter().rev()) };
                for (at, piece) in order {
                    f.write_at(piece, *at as u64).unwrap();
                }
            });
        }
    });
    assert_eq!(read_all(&*f), content);
    let mut pieces_back = vec![0u8; content.len()];
    thread::scope(|scope| {
        for (k, chunk) in pieces_back.chunks_mut(256 * 1024).enumerate() {
            let f = &f;
            scope.spawn(move || {
                assert_eq!(f.read_at(chunk, (k * 256 * 1024) as u64).unwrap(), chunk.len());
            });
        }
    });
    assert!(pieces_back == content);
}

#[test]
fn reads_at_the_default_block_size_fail_block_by_block() {
    // The default 64 KiB blocks: reads in groups of 4 blocks (one backend read each).
    const L: usize = dpuio_crypto::DEFAULT_BLOCK_BYTES as usize;
    const SL: usize = L + BLOCK_OVERHEAD_BYTES;
    let env = Env::new();
    let raw = env.raw("c");
    let key = env.key_file("k");
    let mut s = settings("t", "c", source(&[("t", 1, &key)]), 1);
    s.block_bytes = L as u32;
    let enc = encrypted(&raw, s);
    let content = random_bytes(&mut StdRng::seed_from_u64(14), 8 * L + 500);
    enc.open(&p("/f"), rw(), 0o644).unwrap().write_at(&content, 0).unwrap();
    let f = enc.open(&p("/f"), ro(), 0).unwrap();
    let read = |from: usize, len: usize| {
        let mut buf = vec![0xeeu8; len];
        f.read_at(&mut buf, from as u64).map(|n| {
            buf.truncate(n);
            buf
        })
    };
    // Aligned whole blocks (two groups), one block, and unaligned reads.
    assert!(read(0, 8 * L).unwrap() == content[..8 * L]);
    assert!(read(2 * L, 4 * L).unwrap() == content[2 * L..6 * L]);
    assert!(read(5 * L, L).unwrap() == content[5 * L..6 * L]);
    assert!(read(L - 3, 2 * L).unwrap() == content[L - 3..3 * L - 3]);
    assert!(read(7 * L, 2 * L).unwrap() == content[7 * L..]);

    // A flipped byte of block 4's nonce, ciphertext or tag fails block 4 only, and
    // the reader's buffer holds none of its plaintext.
    let stored = env.stored("c", "/f");
    for at in [H + 4 * SL, H + 4 * SL + 12 + 777, H + 5 * SL - 1] {
        flip(&stored, at);
        for (from, len) in [(0, 8 * L), (4 * L, L), (4 * L, 2 * L), (3 * L, 2 * L)] {
            let mut buf = vec![0xeeu8; len];
            let r = f.read_at(&mut buf, from as u64);
            assert!(is_integrity(&r, Some(4)), "byte {at}, read {from}+{len}: {r:?}");
            let block4 = &buf[4 * L - from..5 * L - from];
            assert!(block4.iter().all(|&b| b == 0 || b == 0xee), "byte {at}: plaintext of block 4 released");
        }
        assert!(read(5 * L, 3 * L).unwrap() == content[5 * L..8 * L]);
        assert!(read(0, 4 * L).unwrap() == content[..4 * L]);
        flip(&stored, at);
    }
    // A stored file cut inside block 6 fails block 6 as truncated.
    let file = fs::OpenOptions::new().write(true).open(&stored).unwrap();
    file.set_len((H + 6 * SL + 100) as u64).unwrap();
    assert!(is_integrity(&read(4 * L, 4 * L), Some(6)));
    assert!(read(4 * L, 2 * L).unwrap() == content[4 * L..6 * L]);
}

#[test]
fn rotation_rewraps_every_file_and_keeps_it_readable() {
    let env = Env::new();
    let raw = env.raw("c");
    let (k1, k2, k3) = (env.key_file("k1"), env.key_file("k2"), env.key_file("k3"));
    let v1 = encrypted(&raw, settings("t", "c", source(&[("t", 1, &k1)]), 1));
    let mut rng = StdRng::seed_from_u64(11);
    v1.mkdir(&p("/d"), 0o755).unwrap();
    v1.mkdir(&p("/d/e"), 0o755).unwrap();
    let mut files = BTreeMap::new();
    for (name, len) in [("/a", 10), ("/d/b", 3 * B + 1), ("/d/e/c", 0), ("/d/e/z", B)] {
        let data = random_bytes(&mut rng, len);
        v1.open(&p(name), rw(), 0o644).unwrap().write_at(&data, 0).unwrap();
        files.insert(name, data);
    }
    // A plaintext file from before encryption, and an empty one without a header.
    raw.open(&p("/legacy"), rw(), 0o644).unwrap().write_at(b"plain", 0).unwrap();
    raw.open(&p("/d/empty"), rw(), 0o644).unwrap();
    let status = key_status(&*raw).unwrap();
    assert_eq!(status.files_by_version, BTreeMap::from([(1, 4)]));
    assert_eq!((status.unencrypted, status.unreadable), (2, 0));
    assert!(!status.can_retire(1) && status.can_retire(2));
    drop(v1);

    // The agent gets version 2 and rotates while files are open.
    let both = encrypted(&raw, settings("t", "c", source(&[("t", 1, &k1), ("t", 2, &k2)]), 1));
    let reader = both.open(&p("/d/b"), ro(), 0).unwrap();
    let writer = both.open(&p("/a"), rw(), 0).unwrap();
    let report = both.rotate(1, 2).unwrap();
    assert_eq!((report.rewrapped, report.unencrypted, report.failed), (4, 2, 0), "{report:?}");
    assert_eq!(both.key_version(), 2);
    assert_eq!(read_all(&*reader), files["/d/b"]);
    writer.write_at(b"after rotation", 5).unwrap();
    writer.truncate(40).unwrap();
    let mut a = files["/a"][..5].to_vec();
    a.extend_from_slice(b"after rotation");
    a.resize(40, 0);
    files.insert("/a", a);
    both.open(&p("/new"), rw(), 0o644).unwrap().write_at(b"new file", 0).unwrap();
    files.insert("/new", b"new file".to_vec());
    drop((reader, writer));
    let status = both.key_status().unwrap();
    assert_eq!(status.files_by_version, BTreeMap::from([(2, 5)]));
    assert!(status.can_retire(1));
    // Again: nothing left to do.
    assert_eq!(both.rotate(1, 2).unwrap().already_new, 5);
    assert!(matches!(both.rotate(2, 2), Err(Error::InvalidArgument(_))));
    assert!(matches!(both.rotate(2, 7), Err(Error::Key { .. })));

    // Version 1 retired: everything reads with version 2 alone.
    let v2 = encrypted(&raw, settings("t", "c", source(&[("t", 2, &k2)]), 2));
    for (name, data) in &files {
        assert_eq!(&read_all(&*v2.open(&p(name), ro(), 0).unwrap()), data, "{name}");
    }
    drop(v2);

    // Offline rotation on the raw container, 2 -> 3.
    let s23 = settings("t", "c", source(&[("t", 2, &k2), ("t", 3, &k3)]), 3);
    let report = rotate(&*raw, &s23, 2, 3).unwrap();
    assert_eq!((report.rewrapped, report.unencrypted, report.failed), (5, 2, 0), "{report:?}");
    assert_eq!(key_status(&*raw).unwrap().files_by_version, BTreeMap::from([(3, 5)]));
    let v3 = encrypted(&raw, settings("t", "c", source(&[("t", 3, &k3)]), 3));
    for (name, data) in &files {
        assert_eq!(&read_all(&*v3.open(&p(name), ro(), 0).unwrap()), data, "{name}");
    }
    // A damaged header is reported, and keeps its key from being retired.
    flip(&env.stored("c", "/d/b"), 3);
    let status = key_status(&*raw).unwrap();
    assert_eq!((status.unreadable, status.unreadable_files[0].0.as_str()), (1, "/d/b"));
    assert!(!status.can_retire(2));
    let s34 = settings("t", "c", source(&[("t", 3, &k3), ("t", 4, &k1)]), 4);
    let report = rotate(&*raw, &s34, 3, 4).unwrap();
    assert_eq!((report.rewrapped, report.failed, report.failures[0].0.as_str()), (4, 1, "/d/b"));
}

#[test]
fn files_from_before_encryption_stay_readable_as_plaintext() {
    let (env, raw, enc) = single();
    raw.open(&p("/old"), rw(), 0o644).unwrap().write_at(b"hello plaintext", 0).unwrap();
    raw.open(&p("/blank"), rw(), 0o644).unwrap();
    assert_eq!(enc.stat(&p("/old")).unwrap().size, 15);
    let old = enc.open(&p("/old"), ro(), 0).unwrap();
    assert_eq!(read_all(&*old), b"hello plaintext");
    let mut part = [0u8; 5];
    assert_eq!(old.read_at(&mut part, 6).unwrap(), 5);
    assert_eq!(&part, b"plain");
    let (listing, _) = enc.readdir(&NsPath::root(), None, 10).unwrap();
    let sizes: Vec<(&str, u64)> = listing.iter().map(|e| (e.name.as_str(), e.attr.size)).collect();
    assert_eq!(sizes, [("blank", 0), ("old", 15)]);
    // Not writable in place (new bytes would be stored in the clear)...
    let Err(Error::AccessMode { reason, .. }) = enc.open(&p("/old"), OpenOptions { write: true, ..ro() }, 0) else {
        panic!("a plaintext file opened for writing")
    };
    assert!(reason.contains("plaintext"), "{reason}");
    assert!(matches!(enc.truncate(&p("/old"), 3), Err(Error::AccessMode { .. })));
    // ...but creating it again stores it encrypted, and the old handle follows.
    let new = enc.open(&p("/old"), OpenOptions { truncate: true, ..rw() }, 0).unwrap();
    new.write_at(b"now secret", 0).unwrap();
    assert_eq!(read_all(&*old), b"now secret");
    let stored = fs::read(env.stored("c", "/old")).unwrap();
    assert!(stored.starts_with(&MAGIC) && !stored.windows(6).any(|w| w == b"secret"));
    // An empty file is an empty encrypted file: the first writable open gives it a header.
    assert_eq!(read_all(&*enc.open(&p("/blank"), ro(), 0).unwrap()), b"");
    enc.open(&p("/blank"), OpenOptions { write: true, ..ro() }, 0).unwrap();
    assert_eq!(fs::metadata(env.stored("c", "/blank")).unwrap().len(), H as u64);
    assert_eq!(enc.stat(&p("/blank")).unwrap().size, 0);
    // Truncating a plaintext file to 0 makes it an empty encrypted one too.
    raw.open(&p("/old2"), rw(), 0o644).unwrap().write_at(b"more plaintext", 0).unwrap();
    enc.truncate(&p("/old2"), 0).unwrap();
    assert!(fs::read(env.stored("c", "/old2")).unwrap().starts_with(&MAGIC));

    // Something that looks like a damaged header is never served as plaintext.
    let mut near = MAGIC.to_vec();
    near[7] = b'X';
    near.extend_from_slice(&[1, 0, 0, 1]);
    near.extend_from_slice(&[0u8; 300]);
    raw.open(&p("/near"), rw(), 0o644).unwrap().write_at(&near, 0).unwrap();
    assert!(is_integrity(&enc.open(&p("/near"), ro(), 0).map(|_| ()), None));

    // A tenant that refuses plaintext files reports them as integrity errors.
    let key = env.key_file("strict");
    let mut strict = settings("t", "c", source(&[("t", 1, &key)]), 1);
    strict.plaintext_files = PlaintextFiles::Refuse;
    let strict = encrypted(&raw, strict);
    raw.open(&p("/old3"), rw(), 0o644).unwrap().write_at(b"plaintext", 0).unwrap();
    assert!(is_integrity(&strict.open(&p("/old3"), ro(), 0).map(|_| ()), None));
    assert!(is_integrity(&strict.stat(&p("/old3")), None));
}

/// A container whose objects stop writing after a budget of mutating calls, the
/// last one torn at a page boundary of the file, as a `kill -9` of the agent in the
/// middle of a large `pwrite` leaves it.
struct Crashing {
    inner: Arc<dyn Container>,
    budget: Arc<AtomicI64>,
}

struct CrashingObject {
    inner: Arc<dyn Object>,
    budget: Arc<AtomicI64>,
}

fn crashed() -> Error {
    Error::Io { context: "crash".into(), source: std::io::Error::other("the agent was killed") }
}

impl Container for Crashing {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn chunk_bytes(&self) -> u64 {
        self.inner.chunk_bytes()
    }
    fn stat(&self, path: &NsPath) -> Result<Attr> {
        self.inner.stat(path)
    }
    fn mkdir(&self, path: &NsPath, mode: u32) -> Result<Attr> {
        self.inner.mkdir(path, mode)
    }
    fn readdir(&self, path: &NsPath, anchor: Option<&str>, max: usize) -> Result<(Vec<DirEntry>, Option<String>)> {
        self.inner.readdir(path, anchor, max)
    }
    fn open(&self, path: &NsPath, options: OpenOptions, mode: u32) -> Result<Arc<dyn Object>> {
        let inner = self.inner.open(path, options, mode)?;
        Ok(Arc::new(CrashingObject { inner, budget: self.budget.clone() }))
    }
    fn remove(&self, path: &NsPath, recursive: bool) -> Result<()> {
        self.inner.remove(path, recursive)
    }
    fn rename(&self, from: &NsPath, to: &NsPath) -> Result<()> {
        self.inner.rename(from, to)
    }
    fn truncate(&self, path: &NsPath, size: u64) -> Result<()> {
        self.inner.truncate(path, size)
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
}

impl Object for CrashingObject {
    fn path(&self) -> &NsPath {
        self.inner.path()
    }
    fn writable(&self) -> bool {
        self.inner.writable()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        match self.budget.fetch_sub(1, Ordering::SeqCst) {
            left if left > 0 => self.inner.write_at(buf, offset),
            0 => {
                let cut = ((offset as usize + buf.len() / 2) / 4096 * 4096).saturating_sub(offset as usize);
                if cut > 0 && cut < buf.len() {
                    self.inner.write_at(&buf[..cut], offset)?;
                }
                Err(crashed())
            }
            _ => Err(crashed()),
        }
    }
    fn stat(&self) -> Result<Attr> {
        self.inner.stat()
    }
    fn truncate(&self, size: u64) -> Result<()> {
        if self.budget.fetch_sub(1, Ordering::SeqCst) > 0 { self.inner.truncate(size) } else { Err(crashed()) }
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
}

enum CrashOp {
    Write(usize, Vec<u8>),
    Truncate(usize),
}

/// After a crash at any point of any kind of write or truncate, the file opens,
/// its size is the old or the new one, and every block reads as its old or new
/// content or fails with an integrity error; and the next write repairs it.
#[test]
fn a_crash_at_any_point_leaves_old_or_new_blocks() {
    let env = Env::new();
    let raw = env.raw("c");
    let key = env.key_file("k");
    let keys = source(&[("t", 1, &key)]);
    let enc = encrypted(&raw, settings("t", "c", keys.clone(), 1));
    let stored_path = env.stored("c", "/f");
    let mut rng = StdRng::seed_from_u64(12);
    let mut integrity_seen = 0;
    for round in 0..150 {
        // A fresh file with random content.
        let len = rng.random_range(1..5 * B);
        let base = random_bytes(&mut rng, len);
        let f = enc.open(&p("/f"), OpenOptions { truncate: true, ..rw() }, 0o644).unwrap();
        f.write_at(&base, 0).unwrap();
        drop(f);
        let image = fs::read(&stored_path).unwrap();
        let op = match round % 5 {
            0 | 1 => {
                let at = rng.random_range(0..base.len() + 2 * B);
                let len = rng.random_range(1..3 * B);
                CrashOp::Write(at, random_bytes(&mut rng, len))
            }
            2 => CrashOp::Write(base.len() + rng.random_range(0..3 * B), random_bytes(&mut rng, B + 7)),
            3 => CrashOp::Truncate(rng.random_range(0..base.len())),
            _ => CrashOp::Truncate(base.len() + rng.random_range(1..3 * B)),
        };
        let mut after = base.clone();
        match &op {
            CrashOp::Write(at, data) => {
                after.resize(after.len().max(at + data.len()), 0);
                after[*at..at + data.len()].copy_from_slice(data);
            }
            CrashOp::Truncate(size) => after.resize(*size, 0),
        }
        for budget in 0.. {
            fs::write(&stored_path, &image).unwrap();
            let crashing: Arc<dyn Container> =
                Arc::new(Crashing { inner: raw.clone(), budget: Arc::new(AtomicI64::new(budget)) });
            let doomed = encrypted(&crashing, settings("t", "c", keys.clone(), 1));
            let f = doomed.open(&p("/f"), OpenOptions { write: true, ..ro() }, 0).unwrap();
            let outcome = match &op {
                CrashOp::Write(at, data) => f.write_at(data, *at as u64),
                CrashOp::Truncate(size) => f.truncate(*size as u64),
            };
            drop((f, doomed));
            // What a restarted agent sees.
            let fresh = encrypted(&raw, settings("t", "c", keys.clone(), 1));
            let f = fresh.open(&p("/f"), ro(), 0).unwrap();
            let size = f.stat().unwrap().size as usize;
            assert!(size == base.len() || size == after.len(), "round {round} budget {budget}: size {size}");
            let fits = |model: &[u8], range: &Range<usize>, got: &[u8]| model.get(range.clone()) == Some(got);
            let mut seen = Vec::with_capacity(size);
            let mut torn = false;
            for index in 0..size.div_ceil(B) {
                let range = index * B..((index + 1) * B).min(size);
                let mut buf = vec![0u8; range.len()];
                match f.read_at(&mut buf, range.start as u64) {
                    Ok(n) => {
                        assert_eq!(n, range.len());
                        assert!(
                            fits(&base, &range, &buf) || fits(&after, &range, &buf),
                            "round {round} budget {budget}: block {index} is neither old nor new"
                        );
                    }
                    Err(Error::Integrity { block_index: Some(i), .. }) if i == index as u64 => {
                        integrity_seen += 1;
                        torn = true;
                        assert!(outcome.is_err(), "round {round}: integrity error after a completed op");
                    }
                    Err(e) => panic!("round {round} budget {budget}: block {index}: {e}"),
                }
                seen.extend_from_slice(&buf);
            }
            drop(f);
            // The restarted agent writes on: repair, then an append reads back (a
            // torn block cannot be extended: that file is created again instead).
            let (options, at) = if torn { (OpenOptions { truncate: true, ..rw() }, 0) } else { (rw(), size) };
            let f = fresh.open(&p("/f"), options, 0).unwrap();
            f.write_at(b"tail", at as u64).unwrap();
            let mut tail = [0u8; 4];
            assert_eq!(f.read_at(&mut tail, at as u64).unwrap(), 4);
            assert_eq!(&tail, b"tail");
            let layout = Layout::new(B as u32).unwrap();
            assert_eq!(fs::metadata(&stored_path).unwrap().len(), layout.stored_bytes(at as u64 + 4));
            if outcome.is_ok() {
                assert_eq!(seen, after, "round {round}: the op completed");
                break;
            }
        }
    }
    assert!(integrity_seen > 0, "no torn block was ever produced: the test does not test");
}

/// Sequential writes and reads in 256 KiB pieces (as the data plane splits them),
/// one thread, through the wrapper against the same on a plain file, page cache:
/// `cargo test --release -p dpuio-encryption --lib throughput -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check; run in release"]
fn throughput_against_plain() {
    let (_env, raw, enc) = single();
    let mut s = enc.settings().clone();
    s.block_bytes = dpuio_crypto::DEFAULT_BLOCK_BYTES;
    let enc = encrypted(&raw, s);
    const FILE: usize = 256 << 20;
    let data = random_bytes(&mut StdRng::seed_from_u64(13), FILE);
    let plain = raw.open(&p("/plain"), rw(), 0o644).unwrap();
    let sealed = enc.open(&p("/sealed"), rw(), 0o644).unwrap();
    for (name, object) in [("plain", &plain), ("encrypted", &sealed)] {
        let start = std::time::Instant::now();
        for (k, piece) in data.chunks(256 << 10).enumerate() {
            object.write_at(piece, (k * (256 << 10)) as u64).unwrap();
        }
        let gib_per_s = FILE as f64 / (1u64 << 30) as f64 / start.elapsed().as_secs_f64();
        println!("write (new file): {name:<9} {gib_per_s:.2} GiB/s");
    }
    let mut buf = vec![0u8; 1 << 20];
    for round in 0..3 {
        for (name, object) in [("plain", &plain), ("encrypted", &sealed)] {
            let start = std::time::Instant::now();
            for offset in (0..FILE).step_by(256 << 10) {
                let piece = &mut buf[offset % (1 << 20)..][..256 << 10];
                assert_eq!(object.read_at(piece, offset as u64).unwrap(), 256 << 10);
            }
            let gib_per_s = FILE as f64 / (1u64 << 30) as f64 / start.elapsed().as_secs_f64();
            println!("read round {round}: {name:<9} {gib_per_s:.2} GiB/s");
        }
    }
}

#[test]
fn container_truncate_stat_and_readdir_speak_plaintext_sizes() {
    let (env, _raw, enc) = single();
    let f = enc.open(&p("/f"), rw(), 0o644).unwrap();
    f.write_at(&[7u8; 3 * B + 5], 0).unwrap();
    enc.truncate(&p("/f"), B as u64 + 1).unwrap();
    assert_eq!(f.stat().unwrap().size, B as u64 + 1);
    enc.truncate(&p("/f"), 2 * B as u64).unwrap();
    let mut content = vec![7u8; B + 1];
    content.resize(2 * B, 0);
    assert_eq!(read_all(&*f), content);
    assert_eq!(enc.stat(&p("/f")).unwrap().size, 2 * B as u64);
    enc.rename(&p("/f"), &p("/g")).unwrap();
    assert_eq!(read_all(&*enc.open(&p("/g"), ro(), 0).unwrap()), content);
    assert_eq!(fs::metadata(env.stored("c", "/g")).unwrap().len(), (H + 2 * SB) as u64);
    // Truncating to 0 by path makes a fresh envelope; the open handle follows.
    enc.truncate(&p("/g"), 0).unwrap();
    assert_eq!(f.stat().unwrap().size, 0);
    f.write_at(b"again", 2).unwrap();
    assert_eq!(read_all(&*f), b"\0\0again");
    let (listing, more) = enc.readdir(&NsPath::root(), None, 10).unwrap();
    assert_eq!((listing.len(), listing[0].attr.size, more), (1, 7, None));
    // A damaged header: stat reports it, the listing shows size 0 and goes on.
    flip(&env.stored("c", "/g"), 0);
    assert!(is_integrity(&enc.stat(&p("/g")), None));
    assert_eq!(enc.readdir(&NsPath::root(), None, 10).unwrap().0[0].attr.size, 0);
    // Growth past the limit of one request is refused before any work.
    flip(&env.stored("c", "/g"), 0);
    assert!(matches!(f.truncate(MAX_ZERO_FILL_BYTES + 100), Err(Error::InvalidArgument(_))));
    assert!(matches!(f.write_at(b"x", MAX_ZERO_FILL_BYTES + 100), Err(Error::InvalidArgument(_))));
    let read_only = enc.open(&p("/g"), ro(), 0).unwrap();
    assert!(matches!(read_only.write_at(b"x", 0), Err(Error::AccessMode { .. })));
    assert!(matches!(read_only.truncate(0), Err(Error::AccessMode { .. })));
}
