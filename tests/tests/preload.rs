//! `libdpuio_preload.so` end to end: unmodified programs (coreutils, Python, numpy,
//! fio) run with `LD_PRELOAD` and `DPUIO_MOUNT` against a real agent, on files the
//! `dpuio` CLI wrote; what they read must be byte-identical, what they write must
//! read back through the CLI, and failures must be the errno they expect.
//!
//! The library is built by `cargo build -p dpuio-preload` (./x test does) into
//! target/<profile>/, beside the binaries the other tests start.

use std::path::{Path, PathBuf};
use std::process::Command;

use dpuio_tests::programs::{
    EncryptedAgent, NAMESPACE_ERRNOS, SECOND_BLOCK, encrypted_agent, expect_errnos, fio_write_read_verify, get,
    has_fio, numpy_round_trip, ok, put, python, python_by_path, random_bytes, read_only_token, run, sha256,
};
use dpuio_tests::{AgentProcess, hermetic};

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

#[test]
fn coreutils_read_and_write_dpuio_files_unmodified() {
    let (_dir, agent, scratch) = agent_with_scratch();
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

    // dd both ways: with a block size that does not divide the file, and with blocks of
    // more than a staging region each (several regions' pieces in one submission; the
    // file's end inside the second submission's piece).
    for (bs, name) in [("3M", "dd.bin"), ("10M", "dd10.bin")] {
        ok(preloaded(&agent, "dd")
            .arg(format!("if={MOUNT}/data/big.bin"))
            .arg(format!("of={MOUNT}/data/{name}"))
            .arg(format!("bs={bs}"))
            .arg("status=none"));
        assert!(get(&agent, &scratch, &format!("/data/{name}")) == big, "dd with bs={bs} within dpuio differs");
    }

    // ls -l and find see the tree with sizes and kinds.
    ok(preloaded(&agent, "mkdir").arg(format!("{MOUNT}/data/sub")));
    let ls = ok(preloaded(&agent, "ls").arg("-l").arg(format!("{MOUNT}/data")));
    let line = ls.lines().find(|l| l.ends_with(" big.bin")).unwrap_or_else(|| panic!("ls -l: {ls}"));
    assert!(line.starts_with("-rw") && line.contains(&big.len().to_string()), "ls -l: {line}");
    assert!(ls.lines().any(|l| l.starts_with('d') && l.ends_with(" sub")), "ls -l: {ls}");
    let found = ok(preloaded(&agent, "find").arg(MOUNT).arg("-type").arg("f"));
    let mut found: Vec<&str> = found.lines().collect();
    found.sort();
    let want: Vec<String> = ["big.bin", "copied.bin", "dd.bin", "dd10.bin", "small.txt"]
        .iter()
        .map(|n| format!("{MOUNT}/data/{n}"))
        .collect();
    assert_eq!(found, want);
}

#[test]
fn python_opens_lists_and_writes_by_path() {
    let (_dir, agent, scratch) = agent_with_scratch();
    let want_sha = python_by_path(preloaded(&agent, python().to_str().unwrap()), MOUNT, &agent, &scratch);
    let script = format!(
        r#"
import hashlib, os
m = "{MOUNT}"
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
    assert!(out.contains("getdents64 ['.', '..', 'a.bin', 'b.txt']"), "{out}");
    assert!(out.contains("seekdir True ."), "{out}");
    assert!(out.contains(&format!("mmap sha {want_sha}")), "{out}");
    assert!(out.contains("fork child exit 0") && out.contains("parent still reads True"), "{out}");

    // numpy: np.save/np.load by path, and an .npz (a zip read with seeks).
    numpy_round_trip(preloaded(&agent, python().to_str().unwrap()), MOUNT, &agent, &scratch);
}

#[test]
fn failures_are_the_errno_programs_expect() {
    let (_dir, agent, scratch) = agent_with_scratch();
    put(&agent, &scratch, "/shared/ok.txt", b"ok\n");
    put(&agent, &scratch, "/secret/key.txt", b"secret\n");
    put(&agent, &scratch, "/full/f.txt", b"f\n");
    expect_errnos(preloaded(&agent, python().to_str().unwrap()), MOUNT, NAMESPACE_ERRNOS);

    // A token narrowed to /shared: inside it reads, outside it is EACCES, from cat too.
    let token = read_only_token(&agent, "/shared");
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
    if !has_fio() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    fio_write_read_verify(&agent, || preloaded(&agent, "fio"), dir.path(), &format!("{MOUNT}/fio"));
}

#[test]
fn tampered_data_is_eio_and_none_of_it_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let EncryptedAgent { agent, storage } = encrypted_agent(dir.path(), "preload-integrity");
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

/// A small file opened read-only is read whole at open (one submission) and served from
/// that copy: a descriptor keeps seeing the file as it was at open, a new open sees the
/// new file (close-to-open consistency), and `DPUIO_SNAPSHOT_BYTES=0` turns it off.
#[test]
fn small_files_opened_read_only_read_as_of_open() {
    let (_dir, agent, scratch) = agent_with_scratch();
    let script = format!(
        r#"
import os, sys
fd = os.open("{MOUNT}/snap/s.bin", os.O_RDONLY)
print("size at open", os.fstat(fd).st_size, flush=True)
sys.stdin.readline()  # the test puts a new version meanwhile
print("old descriptor", os.pread(fd, 100, 0).decode(), os.fstat(fd).st_size)
os.close(fd)
with open("{MOUNT}/snap/s.bin", "rb") as f:
    print("new open", f.read().decode())
"#
    );
    for (snapshot_bytes, old_sees) in [(None, "old 3"), (Some("0"), "new version 11")] {
        put(&agent, &scratch, "/snap/s.bin", b"old");
        let mut command = preloaded(&agent, python().to_str().unwrap());
        command.arg("-c").arg(&script).env("DPUIO_PRELOAD_STATS", "1");
        if let Some(v) = snapshot_bytes {
            command.env("DPUIO_SNAPSHOT_BYTES", v);
        }
        let (rest, stderr) =
            changed_midway(&agent, command, "size at open 3", "/snap/s.bin", &format!("{snapshot_bytes:?}"));
        assert_eq!(rest, [format!("old descriptor {old_sees}"), "new open new version".to_owned()], "{stderr}");
        let whole =
            if snapshot_bytes.is_none() { "read 14 bytes of small files whole at open" } else { "read 0 bytes of" };
        assert!(stderr.contains(whole), "{snapshot_bytes:?}: {stderr}");
    }
}

/// `stat` of an entry a listing just brought is answered from the listing for the
/// mount's TTL (`DPUIO_LISTING_TTL_MS`): another client's change shows after it, this
/// process's own changes at once; 0 asks the agent each time, and a bad value is refused
/// with the variable named.
#[test]
fn a_listing_answers_stat_of_its_entries_for_its_ttl() {
    let (_dir, agent, scratch) = agent_with_scratch();
    let script = format!(
        r#"
import os, sys
d = "{MOUNT}/ls"
print("listed", sorted(os.listdir(d)), flush=True)
sys.stdin.readline()  # the test writes a.bin in place meanwhile, from another client
print("a", os.stat(d + "/a.bin").st_size)
with open(d + "/b.bin", "ab") as f:
    f.write(b"xyz")
print("b", os.stat(d + "/b.bin").st_size)
os.unlink(d + "/b.bin")
print("b gone", not os.path.exists(d + "/b.bin"))
"#
    );
    for (ttl, a_size) in [("60000", 3), ("0", 11)] {
        put(&agent, &scratch, "/ls/a.bin", b"old");
        put(&agent, &scratch, "/ls/b.bin", b"old");
        let mut command = preloaded(&agent, python().to_str().unwrap());
        command.arg("-c").arg(&script).env("DPUIO_LISTING_TTL_MS", ttl);
        let (rest, stderr) =
            changed_midway(&agent, command, "listed ['a.bin', 'b.bin']", "/ls/a.bin", &format!("TTL {ttl}"));
        assert_eq!(rest, [format!("a {a_size}"), "b 6".into(), "b gone True".into()], "TTL {ttl}: {stderr}");
    }
    let out = preloaded(&agent, python().to_str().unwrap())
        .arg("-c")
        .arg(format!("import os; os.stat('{MOUNT}/ls/a.bin')"))
        .env("DPUIO_LISTING_TTL_MS", "soon")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bad TTL must fail the call: {stderr}");
    assert!(stderr.contains("DPUIO_LISTING_TTL_MS=\"soon\": not a number of milliseconds"), "{stderr}");
}

/// A file created or opened to read and closed with nothing written costs no round trip
/// for its close: the close goes with the process's next call. The agent still gets
/// every close before the next open: a program that creates, then reads, many files one
/// at a time stays under a limit of four handles per session, and what it wrote reads
/// back whole.
#[test]
fn closes_of_unwritten_files_ride_with_the_next_call_and_free_their_handles() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        "[limits]\nmax_handles_per_session = 4\n[[tenants]]\nname = \"default\"\ncontainer = \"default\"\n",
    )
    .unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let script = format!(
        r#"
import os
d = "{MOUNT}/many"
os.makedirs(d, exist_ok=True)
for i in range(64):
    open(f"{{d}}/e{{i}}", "x").close()
for i in range(8):
    with open(f"{{d}}/w{{i}}", "wb") as f:
        f.write(bytes([i]) * 100000)
n = 0
for i in range(8):
    for _ in range(8):
        with open(f"{{d}}/w{{i}}", "rb") as f:
            n += len(f.read()) if f.read(1) == bytes([i]) else -1
print(len(os.listdir(d)), n)
"#
    );
    let out = preloaded(&agent, python().to_str().unwrap())
        .arg("-c")
        .arg(&script)
        .env("DPUIO_SNAPSHOT_BYTES", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("72 {}", 64 * 99_999), "{stderr}");
}

/// An agent on a temporary directory, and a scratch directory for the CLI's files.
fn agent_with_scratch() -> (tempfile::TempDir, AgentProcess, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    (dir, agent, scratch)
}

/// Run `command`, a preloaded program that prints `first`, then waits for a line on its
/// stdin while another client writes "new version" over the start of the file at `path`
/// in place; it must then succeed. The lines it printed after `first`, and its stderr.
fn changed_midway(
    agent: &AgentProcess,
    mut command: Command,
    first: &str,
    path: &str,
    case: &str,
) -> (Vec<String>, String) {
    use std::io::{BufRead, BufReader, Write};
    let mut child = command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), first, "{case}");
    write_in_place(agent, path, b"new version");
    writeln!(child.stdin.as_mut().unwrap()).unwrap();
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{case}: {rest:?} {stderr}");
    (rest, stderr)
}

/// Write `data` at offset 0 of the file at `path` in place (through a handle, as another
/// client's writer would), not as `dpuio put`'s replacing rename.
fn write_in_place(agent: &AgentProcess, path: &str, data: &[u8]) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let options = dpuio_shim::ConnectOptions { data_plane: Some(Default::default()), ..agent.connect_options() };
        let client = dpuio_shim::Client::connect(options).await.unwrap();
        let mut region = client.register_region(4096, dpuio_shim::RegionAccess::ReadWrite).await.unwrap();
        region.write_at(0, data);
        let file = client.open(path, dpuio_shim::Access::ReadWrite).await.unwrap();
        assert_eq!(file.write_at(&region, data.len() as u64, 0).unwrap(), data.len() as u64);
        file.close().await.unwrap();
        client.detach().await.unwrap();
    });
}

/// The shared objects in a `/proc/PID/maps` listing whose file name contains `name`.
fn mapped(maps: &str, name: &str) -> bool {
    maps.lines().filter_map(|l| l.split_whitespace().nth(5)).any(|path| path.contains(name))
}

#[test]
fn a_program_that_never_touches_the_prefix_loads_no_transport() {
    let (_dir, agent, scratch) = agent_with_scratch();
    put(&agent, &scratch, "/data/small.txt", b"hello\n");

    // cat's own maps: the library is loaded (so the check below means something), and
    // neither UCX nor libfabric is: their constructors would cost every process under
    // the library about 2 ms and 0.2 s at start.
    let untouched = ok(preloaded(&agent, "cat").arg("/proc/self/maps"));
    assert!(mapped(&untouched, "libdpuio_preload.so"), "the library was not loaded:\n{untouched}");
    for transport in ["libucp.so", "libucs.so", "libuct.so", "libfabric.so"] {
        assert!(
            !mapped(&untouched, transport),
            "{transport} loaded by a program that never touched {MOUNT}:\n{untouched}"
        );
    }

    // The same program reading a dpuio file first has attached by the time it lists its
    // maps: the transport is loaded then, and the listing shows it.
    let touched = ok(preloaded(&agent, "cat").arg(format!("{MOUNT}/data/small.txt")).arg("/proc/self/maps"));
    assert!(touched.starts_with("hello\n"), "{touched}");
    assert!(
        mapped(&touched, "libucp.so") || mapped(&touched, "libfabric.so"),
        "no transport library mapped after reading {MOUNT}/data/small.txt:\n{touched}"
    );
}
