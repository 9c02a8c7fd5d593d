//! `libdpuio_preload.so` end to end: unmodified programs (coreutils, Python, numpy,
//! fio) run with `LD_PRELOAD` and `DPUIO_MOUNT` against a real agent, on files the
//! `dpuio` CLI wrote; what they read must be byte-identical, what they write must
//! read back through the CLI, and failures must be the errno they expect.
//!
//! The library is built by `cargo build -p dpuio-preload` (./x test does) into
//! target/<profile>/, beside the binaries the other tests start.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dpuio_tests::{AgentProcess, hermetic, ok_stdout, python};

const MOUNT: &str = "/mnt/dpuio";

fn preload_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let lib = dir.join("libdpuio_preload.so");
    assert!(
        lib.is_file(),
        "{} is missing: build it first with `cargo build -p dpuio-preload` (./x test does)",
        lib.display()
    );
    lib
}

/// `program` with the preload library, the mount prefix and this agent's address and
/// client bundle, and nothing of the user's environment. UCX's mmap hooks are off, as
/// docs/unmodified-apps.md asks of programs that `mmap` dpuio files: UCX rewrites the
/// `mmap` relocations of loaded objects and would route `mmap` around the library.
fn preloaded(agent: &AgentProcess, program: &str) -> Command {
    let mut c = Command::new(program);
    hermetic(&mut c, &agent.data_dir.join(".home"));
    c.env("DPUIO_AGENT", agent.url())
        .env("DPUIO_CONFIG_DIR", agent.client_dir())
        .env("LD_PRELOAD", preload_library())
        .env("DPUIO_MOUNT", MOUNT)
        .env("UCX_MEM_MMAP_HOOK_MODE", "none");
    c
}

fn run(c: &mut Command) -> Output {
    c.output().unwrap_or_else(|e| panic!("run {c:?}: {e}"))
}

fn ok(c: &mut Command) -> String {
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

fn random_bytes(len: usize) -> Vec<u8> {
    use rand::RngCore;
    let mut data = vec![0u8; len];
    rand::rng().fill_bytes(&mut data);
    data
}

/// Write `data` to `path` in the container with `dpuio put` (its parent made first).
fn put(agent: &AgentProcess, scratch: &Path, path: &str, data: &[u8]) {
    if let Some((parent, _)) = path.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
        ok_stdout(&agent.cli(&["mkdir", "-p", parent]));
    }
    let local = scratch.join(format!("put-{}", path.replace('/', "_")));
    std::fs::write(&local, data).expect("stage a file");
    ok_stdout(&agent.cli(&["put", local.to_str().expect("utf-8"), path]));
}

/// Read `path` of the container with `dpuio get`.
fn get(agent: &AgentProcess, scratch: &Path, path: &str) -> Vec<u8> {
    let local = scratch.join(format!("get-{}", path.replace('/', "_")));
    let _ = std::fs::remove_file(&local);
    ok_stdout(&agent.cli(&["get", path, local.to_str().expect("utf-8")]));
    std::fs::read(&local).expect("read what dpuio get wrote")
}

fn sha256(c: &mut Command) -> String {
    ok(c).split_whitespace().next().expect("a digest").to_owned()
}

#[test]
fn coreutils_read_and_write_dpuio_files_unmodified() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    // Larger than a staging region (4 MiB) and not a multiple of anything.
    let big = random_bytes(9 * 1024 * 1024 + 12345);
    put(&agent, &scratch, "/data/big.bin", &big);
    put(&agent, &scratch, "/data/small.txt", b"hello, dpuio\n");
    let local_big = scratch.join("big.bin");
    std::fs::write(&local_big, &big).unwrap();

    // cat and sha256sum (stdio through fopen) read byte-identical data.
    assert_eq!(ok(preloaded(&agent, "cat").arg(format!("{MOUNT}/data/small.txt"))), "hello, dpuio\n");
    let want = sha256(Command::new("sha256sum").arg(&local_big));
    assert_eq!(sha256(preloaded(&agent, "sha256sum").arg(format!("{MOUNT}/data/big.bin"))), want);
    let catted = run(preloaded(&agent, "cat").arg(format!("{MOUNT}/data/big.bin")).env("DPUIO_PRELOAD_STATS", "1"));
    assert!(catted.status.success() && catted.stdout == big, "cat of a 9 MiB file differs");
    // The copy is reported: every byte read was copied once from a region.
    let stats = String::from_utf8_lossy(&catted.stderr);
    assert!(stats.contains(&format!("read {} bytes, wrote 0 bytes (one copy each)", big.len())), "{stats}");

    // Paths outside the prefix still reach the local file system.
    assert_eq!(sha256(preloaded(&agent, "sha256sum").arg(&local_big)), want);

    // cp out of dpuio and into it.
    let out = scratch.join("out.bin");
    ok(preloaded(&agent, "cp").arg(format!("{MOUNT}/data/big.bin")).arg(&out));
    assert!(std::fs::read(&out).unwrap() == big, "cp out of dpuio differs");
    ok(preloaded(&agent, "cp").arg(&local_big).arg(format!("{MOUNT}/data/copied.bin")));
    assert!(get(&agent, &scratch, "/data/copied.bin") == big, "cp into dpuio differs");

    // dd both ways, with a block size that does not divide the file.
    ok(preloaded(&agent, "dd")
        .arg(format!("if={MOUNT}/data/big.bin"))
        .arg(format!("of={MOUNT}/data/dd.bin"))
        .arg("bs=3M")
        .arg("status=none"));
    assert!(get(&agent, &scratch, "/data/dd.bin") == big, "dd within dpuio differs");

    // ls -l and find see the tree with sizes and kinds.
    ok(preloaded(&agent, "mkdir").arg(format!("{MOUNT}/data/sub")));
    let ls = ok(preloaded(&agent, "ls").arg("-l").arg(format!("{MOUNT}/data")));
    let line = ls.lines().find(|l| l.ends_with(" big.bin")).unwrap_or_else(|| panic!("ls -l: {ls}"));
    assert!(line.starts_with("-rw") && line.contains(&big.len().to_string()), "ls -l: {line}");
    assert!(ls.lines().any(|l| l.starts_with('d') && l.ends_with(" sub")), "ls -l: {ls}");
    let found = ok(preloaded(&agent, "find").arg(MOUNT).arg("-type").arg("f"));
    let mut found: Vec<&str> = found.lines().collect();
    found.sort();
    let want: Vec<String> =
        ["big.bin", "copied.bin", "dd.bin", "small.txt"].iter().map(|n| format!("{MOUNT}/data/{n}")).collect();
    assert_eq!(found, want);
}

#[test]
fn python_opens_lists_and_writes_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let data = random_bytes(5 * 1024 * 1024 + 7);
    put(&agent, &scratch, "/ds/a.bin", &data);
    put(&agent, &scratch, "/ds/b.txt", b"b\n");
    let script = format!(
        r#"
import hashlib, os
m = "{MOUNT}"
with open(m + "/ds/a.bin", "rb") as f:
    print("sha", hashlib.sha256(f.read()).hexdigest())
print("listdir", sorted(os.listdir(m + "/ds")))
print("scandir", sorted((e.name, e.is_dir(), e.stat().st_size) for e in os.scandir(m + "/ds")))
# getdents64 called directly, with a buffer that holds two records at a time.
import ctypes, struct
libc = ctypes.CDLL(None, use_errno=True)
dfd = os.open(m + "/ds", os.O_RDONLY | os.O_DIRECTORY)
buf = ctypes.create_string_buffer(64)
names = []
while True:
    n = libc.getdents64(dfd, buf, 64)
    assert n >= 0, os.strerror(ctypes.get_errno())
    if n == 0:
        break
    raw, off = buf.raw[:n], 0
    while off < n:
        reclen = struct.unpack_from("H", raw, off + 16)[0]
        names.append(raw[off + 19:off + reclen].split(b"\0")[0].decode())
        off += reclen
os.close(dfd)
print("getdents64", sorted(names))
# telldir/seekdir on a DIR* of the library's own.
libc.opendir.restype = libc.readdir.restype = ctypes.c_void_p
libc.readdir.argtypes = libc.telldir.argtypes = libc.closedir.argtypes = [ctypes.c_void_p]
libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
libc.telldir.restype = ctypes.c_long
d = libc.opendir((m + "/ds").encode())
name = lambda e: ctypes.string_at(e + 19).decode()
first = name(libc.readdir(d))
mark = libc.telldir(d)
after = [name(libc.readdir(d)) for _ in range(3)]
libc.seekdir(d, mark)
again = [name(libc.readdir(d)) for _ in range(3)]
assert libc.readdir(d) is None and libc.closedir(d) == 0
print("seekdir", after == again, first)
os.mkdir(m + "/out")
with open(m + "/out/w.txt", "w") as f:
    f.write("line\n" * 1000)
with open(m + "/out/w.txt") as f:
    assert f.read() == "line\n" * 1000
os.rename(m + "/out/w.txt", m + "/out/renamed.txt")
print("size", os.stat(m + "/out/renamed.txt").st_size)

# mmap: a read-only map is the file's bytes; a writable shared one is refused (ENODEV).
import errno, mmap
fd = os.open(m + "/ds/a.bin", os.O_RDONLY)
with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
    print("mmap sha", hashlib.sha256(mm[:]).hexdigest())
rw = os.open(m + "/ds/b.txt", os.O_RDWR)
try:
    mmap.mmap(rw, 0, access=mmap.ACCESS_WRITE)
    raise AssertionError("writable shared mmap of a dpuio file was allowed")
except OSError as e:
    assert e.errno == errno.ENODEV, e
os.close(rw)

# fork: the child reattaches, reads an inherited descriptor and opens files of its own.
head = os.pread(fd, 16, 0)
pid = os.fork()
if pid == 0:
    try:
        ok = os.pread(fd, 16, 0) == head and open(m + "/ds/b.txt").read() == "b\n"
        os._exit(0 if ok else 3)
    except BaseException as e:
        print("child:", e)
        os._exit(4)
_, status = os.waitpid(pid, 0)
print("fork child exit", os.waitstatus_to_exitcode(status))
print("parent still reads", os.pread(fd, 16, 0) == head)
os.close(fd)
"#
    );
    let out = ok(preloaded(&agent, python().to_str().unwrap()).arg("-c").arg(&script));
    let want_sha = sha256(Command::new("sha256sum").arg({
        let p = scratch.join("a.bin");
        std::fs::write(&p, &data).unwrap();
        p
    }));
    assert!(out.contains(&format!("sha {want_sha}")), "{out}");
    assert!(out.contains("listdir ['a.bin', 'b.txt']"), "{out}");
    assert!(out.contains(&format!("scandir [('a.bin', False, {}), ('b.txt', False, 2)]", data.len())), "{out}");
    assert!(out.contains("size 5000"), "{out}");
    assert!(out.contains("getdents64 ['.', '..', 'a.bin', 'b.txt']"), "{out}");
    assert!(out.contains("seekdir True ."), "{out}");
    assert!(out.contains(&format!("mmap sha {want_sha}")), "{out}");
    assert!(out.contains("fork child exit 0") && out.contains("parent still reads True"), "{out}");
    assert_eq!(get(&agent, &scratch, "/out/renamed.txt"), "line\n".repeat(1000).into_bytes());

    // numpy: np.save/np.load by path, and an .npz (a zip read with seeks).
    let has_numpy = Command::new(python()).args(["-c", "import numpy"]).output().is_ok_and(|o| o.status.success());
    if !has_numpy {
        eprintln!("numpy part skipped: {} cannot import numpy (./x test installs it into .venv)", python().display());
        return;
    }
    let script = format!(
        r#"
import numpy as np
m = "{MOUNT}"
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
    let out = ok(preloaded(&agent, python().to_str().unwrap()).arg("-c").arg(&script));
    assert!(out.contains("numpy ok"), "{out}");
    // What numpy wrote is a real .npy file to any other reader.
    let npy = get(&agent, &scratch, "/out/a.npy");
    assert!(npy.starts_with(b"\x93NUMPY") && npy.len() > 12_000_000, "a.npy: {} bytes", npy.len());
}

#[test]
fn failures_are_the_errno_programs_expect() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    put(&agent, &scratch, "/shared/ok.txt", b"ok\n");
    put(&agent, &scratch, "/secret/key.txt", b"secret\n");
    put(&agent, &scratch, "/full/f.txt", b"f\n");
    let script = format!(
        r#"
import errno, os
m = "{MOUNT}"
def expect(name, code, f, *args):
    try:
        f(*args)
    except OSError as e:
        assert e.errno == code, f"{{name}}: errno {{e.errno}} ({{os.strerror(e.errno)}}), wanted {{code}}"
        print(name, "ok")
        return
    raise AssertionError(f"{{name}}: no error")
expect("ENOENT", errno.ENOENT, open, m + "/nope.txt")
expect("ENOENT stat", errno.ENOENT, os.stat, m + "/nope/deeper")
expect("EEXIST", errno.EEXIST, os.mkdir, m + "/shared")
expect("EEXIST O_EXCL", errno.EEXIST, os.open, m + "/shared/ok.txt", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
expect("ENOTEMPTY", errno.ENOTEMPTY, os.rmdir, m + "/full")
expect("ENOTDIR", errno.ENOTDIR, os.rmdir, m + "/full/f.txt")
expect("EISDIR", errno.EISDIR, os.unlink, m + "/full")
expect("EISDIR write", errno.EISDIR, open, m + "/full", "w")
"#
    );
    let out = ok(preloaded(&agent, python().to_str().unwrap()).arg("-c").arg(&script));
    for name in ["ENOENT", "EEXIST", "EEXIST O_EXCL", "ENOTEMPTY", "ENOTDIR", "EISDIR", "EISDIR write"] {
        assert!(out.lines().any(|l| l == format!("{name} ok")), "{name}: {out}");
    }

    // A token narrowed to /shared: inside it reads, outside it is EACCES, from cat too.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let token = runtime.block_on(async {
        let client = dpuio_shim::Client::connect(agent.connect_options()).await.expect("attach");
        client.delegate("/shared", &["read".into()], 300).await.expect("delegate").0
    });
    let narrowed = |program: &str| {
        let mut c = preloaded(&agent, program);
        c.env("DPUIO_TOKEN", &token);
        c
    };
    assert_eq!(ok(narrowed("cat").arg(format!("{MOUNT}/shared/ok.txt"))), "ok\n");
    let denied = run(narrowed("cat").arg(format!("{MOUNT}/secret/key.txt")));
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(!denied.status.success() && denied.stdout.is_empty(), "read outside the token's prefix: {denied:?}");
    assert!(stderr.contains("Permission denied"), "cat should say EACCES: {stderr}");
    let script = format!(
        r#"
import errno, os
for f, args in [(open, ("{MOUNT}/secret/key.txt",)), (os.stat, ("{MOUNT}/secret/key.txt",)), (os.listdir, ("{MOUNT}/secret",))]:
    try:
        f(*args)
        raise AssertionError(f"{{f.__name__}}: allowed outside the token's prefix")
    except PermissionError as e:
        assert e.errno == errno.EACCES
print("EACCES ok")
"#
    );
    let out = ok(narrowed(python().to_str().unwrap()).arg("-c").arg(&script));
    assert!(out.contains("EACCES ok"), "{out}");
}

#[test]
fn fio_verifies_what_it_wrote_through_the_preload() {
    if Command::new("fio").arg("--version").output().is_err() {
        eprintln!("skipped: fio is not installed (./x test installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    ok_stdout(&agent.cli(&["mkdir", "-p", "/fio"]));
    let common =
        ["--name=dpuio", "--ioengine=psync", "--size=16m", "--bs=256k", "--verify=crc32c", "--output-format=terse"];
    // fio keeps its verify state in the working directory: the test's own.
    let fio = || {
        let mut c = preloaded(&agent, "fio");
        c.current_dir(dir.path());
        c
    };
    // Write with verification headers, then a separate read-only job that verifies.
    ok(fio().args(common).arg(format!("--filename={MOUNT}/fio/file")).arg("--rw=write"));
    ok(fio().args(common).arg(format!("--filename={MOUNT}/fio/file")).arg("--rw=read").arg("--verify_only"));
    // And random writes verified in the same job.
    ok(fio().args(common).arg(format!("--filename={MOUNT}/fio/rand")).arg("--rw=randwrite"));
}

/// Where the second 64 KiB block of an encrypted file is stored: after the 256-byte
/// header and the first block with its 12-byte nonce and 16-byte tag (as in
/// tests/encryption.rs).
const SECOND_BLOCK: usize = 256 + 65536 + 28;

#[test]
fn tampered_data_is_eio_and_none_of_it_is_released() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("tenant.key");
    std::fs::write(&key, (0..32u8).map(|i| i.wrapping_mul(37).wrapping_add(11)).collect::<Vec<u8>>()).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let data_dir = dir.path().join("data");
    let storage = dpuio_tests::StorageUnderTest::new("preload-integrity", &data_dir);
    let config = dir.path().join("agent.toml");
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
    let agent = AgentProcess::start(&data_dir, &["--config", config.to_str().unwrap()]);
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let plain = random_bytes(300_000);
    put(&agent, &scratch, "/enc.bin", &plain);
    let catted = run(preloaded(&agent, "cat").arg(format!("{MOUNT}/enc.bin")));
    assert!(catted.status.success() && catted.stdout == plain, "an intact encrypted file reads back");

    storage.alter_stored("default", "/enc.bin", |bytes| bytes[SECOND_BLOCK + 100] ^= 1);
    let catted = run(preloaded(&agent, "cat").arg(format!("{MOUNT}/enc.bin")));
    let stderr = String::from_utf8_lossy(&catted.stderr);
    assert!(!catted.status.success() && stderr.contains("Input/output error"), "cat: {stderr}");
    assert!(catted.stdout.is_empty(), "cat released {} bytes of a read that failed", catted.stdout.len());
    let script = format!(
        r#"
import errno, os
fd = os.open("{MOUNT}/enc.bin", os.O_RDONLY)
assert len(os.pread(fd, 65536, 0)) == 65536, "the intact first block reads"
try:
    os.pread(fd, 65536, 65536)
    raise AssertionError("the tampered block was released")
except OSError as e:
    assert e.errno == errno.EIO, e
print("EIO ok")
"#
    );
    let out = ok(preloaded(&agent, python().to_str().unwrap()).arg("-c").arg(&script));
    assert!(out.contains("EIO ok"), "{out}");
}
