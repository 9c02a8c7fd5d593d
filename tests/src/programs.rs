//! Running unmodified programs on dpuio files and checking what they did: the shared
//! steps of the transparent paths' tests (`tests/preload.rs`, `tests/fuse.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{AgentProcess, StorageUnderTest, ok_stdout};

/// Run `c` to completion.
pub fn run(c: &mut Command) -> Output {
    c.output().unwrap_or_else(|e| panic!("run {c:?}: {e}"))
}

/// The stdout of `c`, which must succeed (else a panic with its output).
pub fn ok(c: &mut Command) -> String {
    let out = run(c);
    assert!(
        out.status.success(),
        "{c:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn random_bytes(len: usize) -> Vec<u8> {
    use rand::RngCore;
    let mut data = vec![0u8; len];
    rand::rng().fill_bytes(&mut data);
    data
}

/// Write `data` to `path` in the container with `dpuio put` (its parent made first),
/// staged in `scratch`.
pub fn put(agent: &AgentProcess, scratch: &Path, path: &str, data: &[u8]) {
    if let Some((parent, _)) = path.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
        ok_stdout(&agent.cli(&["mkdir", "-p", parent]));
    }
    let local = scratch.join(format!("put-{}", path.replace('/', "_")));
    std::fs::write(&local, data).expect("stage a file");
    ok_stdout(&agent.cli(&["put", local.to_str().expect("utf-8"), path]));
}

/// Read `path` of the container with `dpuio get` (through `scratch`).
pub fn get(agent: &AgentProcess, scratch: &Path, path: &str) -> Vec<u8> {
    let local = scratch.join(format!("get-{}", path.replace('/', "_")));
    let _ = std::fs::remove_file(&local);
    ok_stdout(&agent.cli(&["get", path, local.to_str().expect("utf-8")]));
    std::fs::read(&local).expect("read what dpuio get wrote")
}

/// The digest `sha256sum` (run as `c`) prints.
pub fn sha256(c: &mut Command) -> String {
    ok(c).split_whitespace().next().expect("a digest").to_owned()
}

/// The interpreter for the Python steps (the venv's, where `./x` installs numpy).
pub use crate::python;

/// Whether [`python`] can import numpy.
pub fn has_numpy() -> bool {
    Command::new(python()).args(["-c", "import numpy"]).output().is_ok_and(|o| o.status.success())
}

/// numpy by path under `root` (the container's root as the program sees it), run by
/// `python` (a [`python`] command, preloaded or not): `np.save`/`np.load` of a 12 MB
/// array, an `.npz` (a zip read with seeks) and `np.load` with `mmap_mode`, into the
/// container's `/out`, which must exist. What numpy wrote must be a real `.npy` to
/// `dpuio get`. Skipped, with the reason, without numpy.
pub fn numpy_round_trip(mut python: Command, root: &str, agent: &AgentProcess, scratch: &Path) {
    if !has_numpy() {
        eprintln!(
            "numpy part skipped: {} cannot import numpy (./x test installs it into .venv)",
            self::python().display()
        );
        return;
    }
    let script = format!(
        r#"
import numpy as np
m = "{root}"
a = np.arange(3_000_000, dtype=np.float32).reshape(1000, 3000)
np.save(m + "/out/a.npy", a)
b = np.load(m + "/out/a.npy")
assert (a == b).all() and b.dtype == np.float32, "npy round trip"
np.savez(m + "/out/c.npz", x=a[:10], y=np.ones(7))
z = np.load(m + "/out/c.npz")
assert (z["x"] == a[:10]).all() and (z["y"] == 1).all(), "npz round trip"
c = np.load(m + "/out/a.npy", mmap_mode="r")
assert (c[999] == a[999]).all(), "np.load with mmap_mode"
print("numpy ok")
"#
    );
    let out = ok(python.arg("-c").arg(&script));
    assert!(out.contains("numpy ok"), "{out}");
    let npy = get(agent, scratch, "/out/a.npy");
    assert!(npy.starts_with(b"\x93NUMPY") && npy.len() > 12_000_000, "a.npy: {} bytes", npy.len());
}

/// Whether Debian's fio is there (./x test installs it); if not, says the test is
/// skipped and why.
pub fn has_fio() -> bool {
    let there = Command::new("fio").arg("--version").output().is_ok();
    if !there {
        eprintln!("SKIPPED: fio is not installed (./x test installs it)");
    }
    there
}

/// fio, unmodified, with its `psync` engine and `--verify=crc32c` on files in the
/// container's `/fio` (made here), which the program sees as `dir`; each run made by
/// `fio` in the working directory `work` (where fio keeps its verify state): a
/// sequential write with verification headers, a separate read-only job that verifies
/// them, and random writes verified in the same job; then 4 KiB random writes, each
/// verified, from eight threads of one process at once, each on a file of its own (small
/// I/O shares one staging region between threads: a slot given to two would show here).
pub fn fio_write_read_verify(agent: &AgentProcess, fio: impl Fn() -> Command, work: &Path, dir: &str) {
    ok_stdout(&agent.cli(&["mkdir", "-p", "/fio"]));
    let common = ["--name=dpuio", "--ioengine=psync", "--verify=crc32c", "--output-format=terse"];
    let run = |args: &[&str]| ok(fio().current_dir(work).args(common).args(args));
    run(&[&format!("--filename={dir}/file"), "--size=16m", "--bs=256k", "--rw=write"]);
    run(&[&format!("--filename={dir}/file"), "--size=16m", "--bs=256k", "--rw=read", "--verify_only"]);
    run(&[&format!("--filename={dir}/rand"), "--size=16m", "--bs=256k", "--rw=randwrite"]);
    run(&[
        &format!("--directory={dir}"),
        "--filename_format=small.$jobnum",
        "--size=1m",
        "--bs=4k",
        "--rw=randwrite",
        "--numjobs=8",
        "--thread",
    ]);
}

/// Where the second 64 KiB block of an encrypted file is stored: after the 256-byte
/// header and the first block with its 12-byte nonce and 16-byte tag (as in
/// tests/encryption.rs).
pub const SECOND_BLOCK: usize = 256 + 65536 + 28;

/// An agent whose default tenant encrypts in 64 KiB blocks, and the storage behind it
/// (fields in drop order: the agent goes before its containers).
pub struct EncryptedAgent {
    pub agent: AgentProcess,
    pub storage: StorageUnderTest,
}

/// Write the test tenant key (32 fixed bytes) to `path` with permissions `mode`.
pub fn write_key(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37).wrapping_add(11)).collect();
    std::fs::write(path, key).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `dir/agent.toml`: one tenant, "default", encrypted in 64 KiB blocks with the key at
/// `key`, in the container `storage` names "default".
pub fn encrypted_config(dir: &Path, key: &Path, storage: &StorageUnderTest) -> PathBuf {
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "{}[[tenants]]\nname = \"default\"\ncontainer = \"{}\"\n[tenants.encryption]\nkey_file = \"{}\"\nblock_bytes = 65536\n",
            storage.backend_config(),
            storage.container("default"),
            key.display()
        ),
    )
    .unwrap();
    config
}

/// Start an [`EncryptedAgent`] in `dir` for the test tagged `test`.
pub fn encrypted_agent(dir: &Path, test: &str) -> EncryptedAgent {
    let key = dir.join("tenant.key");
    write_key(&key, 0o600);
    let data_dir = dir.join("data");
    let storage = StorageUnderTest::new(test, &data_dir);
    let config = encrypted_config(dir, &key, &storage);
    let agent = AgentProcess::start(&data_dir, &["--config", config.to_str().unwrap()]);
    EncryptedAgent { agent, storage }
}

/// Python by path under `root` (the container's root as the program sees it), run by
/// `python` (a [`python`] command, preloaded or not), on files `dpuio put` wrote to
/// `/ds`: `open` reads them byte-identical, `os.listdir` and `os.scandir` list them
/// with kinds and sizes; then `os.mkdir`, writing, reading back and `os.rename` leave
/// `/out/renamed.txt` (1000 lines), checked with `dpuio get`. Returns the SHA-256 of
/// `/ds/a.bin` (5 MiB of random bytes) for the caller's own checks.
pub fn python_by_path(mut python: Command, root: &str, agent: &AgentProcess, scratch: &Path) -> String {
    let data = random_bytes(5 * 1024 * 1024 + 7);
    put(agent, scratch, "/ds/a.bin", &data);
    put(agent, scratch, "/ds/b.txt", b"b\n");
    let script = format!(
        r#"
import hashlib, os
m = "{root}"
with open(m + "/ds/a.bin", "rb") as f:
    print("sha", hashlib.sha256(f.read()).hexdigest())
print("listdir", sorted(os.listdir(m + "/ds")))
print("scandir", sorted((e.name, e.is_dir(), e.stat().st_size) for e in os.scandir(m + "/ds")))
os.mkdir(m + "/out")
with open(m + "/out/w.txt", "w") as f:
    f.write("line\n" * 1000)
with open(m + "/out/w.txt") as f:
    assert f.read() == "line\n" * 1000
os.rename(m + "/out/w.txt", m + "/out/renamed.txt")
print("size", os.stat(m + "/out/renamed.txt").st_size)
"#
    );
    let out = ok(python.arg("-c").arg(&script));
    let local = scratch.join("a.bin");
    std::fs::write(&local, &data).unwrap();
    let want_sha = sha256(Command::new("sha256sum").arg(&local));
    assert!(out.contains(&format!("sha {want_sha}")), "{out}");
    assert!(out.contains("listdir ['a.bin', 'b.txt']"), "{out}");
    assert!(out.contains(&format!("scandir [('a.bin', False, {}), ('b.txt', False, 2)]", data.len())), "{out}");
    assert!(out.contains("size 5000"), "{out}");
    assert_eq!(get(agent, scratch, "/out/renamed.txt"), "line\n".repeat(1000).into_bytes());
    want_sha
}

/// Namespace failures every transparent path must report with the errno a program
/// expects, as [`expect_errnos`] checks on the files `/shared/ok.txt` and
/// `/full/f.txt`.
pub const NAMESPACE_ERRNOS: &str = r#"
expect("ENOENT", errno.ENOENT, open, m + "/nope.txt")
expect("ENOENT stat", errno.ENOENT, os.stat, m + "/nope/deeper")
expect("EEXIST", errno.EEXIST, os.mkdir, m + "/shared")
expect("EEXIST O_EXCL", errno.EEXIST, os.open, m + "/shared/ok.txt", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
expect("ENOTEMPTY", errno.ENOTEMPTY, os.rmdir, m + "/full")
expect("ENOTDIR", errno.ENOTDIR, os.rmdir, m + "/full/f.txt")
expect("EISDIR", errno.EISDIR, os.unlink, m + "/full")
expect("EISDIR write", errno.EISDIR, open, m + "/full", "w")
"#;

/// Run `checks`, lines of `expect(NAME, ERRNO, FUNCTION, ARGS...)` with `m` the
/// container's root as the program sees it (`root`), in Python run by `python`; each
/// must fail with its errno.
pub fn expect_errnos(mut python: Command, root: &str, checks: &str) {
    let prelude = r#"
import errno, os, sys
m = sys.argv[1]
def expect(name, code, f, *args):
    try:
        f(*args)
    except OSError as e:
        assert e.errno == code, f"{name}: errno {e.errno} ({os.strerror(e.errno)}), wanted {code}"
        print(name, "ok")
        return
    raise AssertionError(f"{name}: no error")
"#;
    let out = ok(python.arg("-c").arg(format!("{prelude}{checks}")).arg(root));
    for name in checks.lines().filter_map(|l| l.strip_prefix("expect(\"")?.split('"').next()) {
        assert!(out.lines().any(|l| l == format!("{name} ok")), "{name}: {out}");
    }
}

/// A capability token of `agent`'s default tenant narrowed to reading under `prefix`.
pub fn read_only_token(agent: &AgentProcess, prefix: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = dpuio_shim::Client::connect(agent.connect_options()).await.expect("attach");
        client.delegate(prefix, &["read".into()], 300).await.expect("delegate").0
    })
}
