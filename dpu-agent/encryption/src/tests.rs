//! Unit tests of the wrapper, over the `local` backend in a temporary directory: the
//! shared set-up and checks here, the tests by room beside it.

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
use dpuio_backend::{
    Attr, Backend, Container, DirEntry, Error, HostBytes, HostBytesMut, NsPath, Object, OpenOptions, Result,
};
use dpuio_crypto::{
    AWS_LC_RS, BLOCK_OVERHEAD_BYTES, CryptoProvider, FileKeySource, HEADER_BYTES, KeySource, Layout, MAGIC, RUST_CRYPTO,
};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::{EncryptedContainer, EncryptionSettings, MAX_ZERO_FILL_BYTES, PlaintextFiles, key_status, rotate};

mod container;
mod crash;
mod object;
mod rotation;

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
