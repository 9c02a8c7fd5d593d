//! `dpuio mount` end to end: the container mounted with FUSE against a real agent, and
//! unmodified programs (coreutils, Python, numpy, fio) on files the `dpuio` CLI wrote;
//! what they read must be byte-identical, what they write must read back through the
//! CLI, failures must be the errno they expect, and the mount must go away on SIGTERM
//! and on `fusermount3 -u` with the process exiting 0.
//!
//! Each test that mounts says `SKIPPED: ...` and returns where this machine cannot
//! mount FUSE (no `/dev/fuse`, or mounting not permitted): the rest of the suite must
//! not depend on a privilege a CI runner may lack. A mount is always undone by a drop
//! guard, so a failing test leaves none behind.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dpuio_tests::programs::{
    EncryptedAgent, NAMESPACE_ERRNOS, SECOND_BLOCK, encrypted_agent, expect_errnos, fio_write_read_verify, get,
    has_fio, numpy_round_trip, ok, put, python, python_by_path, random_bytes, read_only_token, run, sha256,
};
use dpuio_tests::{AgentProcess, command_in, ok_stdout};

/// How long a mount may take to appear, or a stopped mount process to exit.
const WAIT: Duration = Duration::from_secs(30);

/// Whether `path` is a mount point now, per /proc/self/mounts.
fn is_mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("read /proc/self/mounts");
    let want = path.to_str().expect("utf-8");
    mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(want))
}

/// A `dpuio mount --foreground` process and its mount point; dropping it unmounts
/// (lazily, should the test have left a file open) and reaps the process.
struct Mounted {
    child: Child,
    point: PathBuf,
    log: PathBuf,
}

impl Mounted {
    fn path(&self, inside: &str) -> String {
        format!("{}{inside}", self.point.display())
    }

    /// What the mount process wrote to stderr so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait for the process to exit by itself; its exit code.
    fn wait(&mut self) -> Option<i32> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for dpuio mount") {
                return status.code();
            }
            assert!(Instant::now() < deadline, "dpuio mount did not exit within {WAIT:?}: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if is_mounted(&self.point) {
            let _ = Command::new("umount").arg("-l").arg(&self.point).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Why this machine cannot mount FUSE, if it cannot even try.
fn fuse_unavailable() -> Option<String> {
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => None,
        Err(e) => Some(format!("cannot open /dev/fuse: {e}")),
    }
}

/// `dpuio mount --foreground` of `agent`'s container on a new directory in `dir`, with
/// `env` added; `None` (after saying `SKIPPED`) where mounting is not permitted here.
fn mount(agent: &AgentProcess, dir: &Path, env: &[(&str, &str)]) -> Option<Mounted> {
    if let Some(reason) = fuse_unavailable() {
        eprintln!("SKIPPED: {reason}");
        return None;
    }
    let point = dir.join(format!("mnt-{}", std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap().as_nanos()));
    std::fs::create_dir_all(&point).unwrap();
    let point = point.canonicalize().unwrap();
    let log = point.with_extension("log");
    let mut command = agent.command("dpuio");
    command
        .arg("mount")
        .arg(&point)
        .arg("--foreground")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let child = command.spawn().expect("run dpuio mount");
    let mut mounted = Mounted { child, point, log };
    let deadline = Instant::now() + WAIT;
    while !is_mounted(&mounted.point) {
        if let Some(status) = mounted.child.try_wait().unwrap() {
            let log = mounted.log();
            if log.contains("not permitted") || log.contains("/dev/fuse") {
                eprintln!("SKIPPED: {}", log.trim());
                return None;
            }
            panic!("dpuio mount exited ({status}) before mounting: {log}");
        }
        assert!(Instant::now() < deadline, "no mount within {WAIT:?}: {}", mounted.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(mounted)
}

fn scratch(dir: &Path) -> PathBuf {
    let scratch = dir.join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    scratch
}

#[test]
fn coreutils_read_and_write_through_the_mount() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    let scratch = scratch(dir.path());
    // Larger than the kernel's largest read (1 MiB) and a staging region (4 MiB).
    let big = random_bytes(9 * 1024 * 1024 + 12345);
    put(&agent, &scratch, "/data/big.bin", &big);
    put(&agent, &scratch, "/data/small.txt", b"hello, dpuio\n");
    let local_big = scratch.join("big.bin");
    std::fs::write(&local_big, &big).unwrap();
    let Some(m) = mount(&agent, dir.path(), &[]) else { return };

    // The mount's readahead: 1 MiB where the mount may set it (root), so files read in
    // order go to the agent in 1 MiB requests, not the kernel's first 128 KiB.
    let dev = std::fs::metadata(&m.point).unwrap().dev();
    let knob = format!("/sys/class/bdi/{}:{}/read_ahead_kb", dev >> 8 & 0xfff, (dev & 0xff) | (dev >> 12 & !0xff));
    let readahead = std::fs::read_to_string(&knob).unwrap_or_default();
    if run(Command::new("id").arg("-u")).stdout == b"0\n" {
        assert_eq!(readahead.trim(), "1024", "{knob}; the mount said: {}", m.log());
    } else {
        assert!(m.log().contains("readahead stays at 128 KiB"), "a mount that may not set it says so: {}", m.log());
    }

    assert_eq!(ok(Command::new("cat").arg(m.path("/data/small.txt"))), "hello, dpuio\n");
    let want = sha256(Command::new("sha256sum").arg(&local_big));
    assert_eq!(sha256(Command::new("sha256sum").arg(m.path("/data/big.bin"))), want);
    // Twice: the second read may come from the page cache and must be the same.
    assert_eq!(sha256(Command::new("sha256sum").arg(m.path("/data/big.bin"))), want);
    let catted = run(Command::new("cat").arg(m.path("/data/big.bin")));
    assert!(catted.status.success() && catted.stdout == big, "cat of a 9 MiB file differs");
    // An open of a file the kernel still holds unchanged is not opened at the agent until
    // a read reaches the daemon: with the pages dropped under the descriptor, that read
    // opens it and reads the same bytes.
    for name in ["big.bin", "small.txt"] {
        let script = format!(
            "import os\np = {:?}\na = open(p, 'rb').read()\nfd = os.open(p, os.O_RDONLY)\n\
             os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)\nb = os.pread(fd, len(a) + 1, 0)\n\
             os.close(fd)\nprint(a == b, len(b))",
            m.path(&format!("/data/{name}"))
        );
        let want = if name == "big.bin" { big.len() } else { 13 };
        assert_eq!(ok(Command::new(python()).arg("-c").arg(&script)).trim(), format!("True {want}"), "{name}");
    }

    // cp out of the mount and into it.
    let out = scratch.join("out.bin");
    ok(Command::new("cp").arg(m.path("/data/big.bin")).arg(&out));
    assert!(std::fs::read(&out).unwrap() == big, "cp out of the mount differs");
    ok(Command::new("cp").arg(&local_big).arg(m.path("/data/copied.bin")));
    assert!(get(&agent, &scratch, "/data/copied.bin") == big, "cp into the mount differs");

    // dd within the mount, with a block size that does not divide the file.
    ok(Command::new("dd")
        .arg(format!("if={}", m.path("/data/big.bin")))
        .arg(format!("of={}", m.path("/data/dd.bin")))
        .arg("bs=3M")
        .arg("status=none"));
    assert!(get(&agent, &scratch, "/data/dd.bin") == big, "dd within the mount differs");

    // Overwrite a file in place: a reader sees the new bytes, not cached old ones.
    ok(Command::new("cp").arg(m.path("/data/small.txt")).arg(m.path("/data/copied.bin")));
    assert_eq!(ok(Command::new("cat").arg(m.path("/data/copied.bin"))), "hello, dpuio\n");

    // ls -l and find see the tree with sizes and kinds.
    ok(Command::new("mkdir").arg(m.path("/data/sub")));
    let ls = ok(Command::new("ls").arg("-l").arg(m.path("/data")));
    let line = ls.lines().find(|l| l.ends_with(" big.bin")).unwrap_or_else(|| panic!("ls -l: {ls}"));
    assert!(line.starts_with("-rw") && line.contains(&big.len().to_string()), "ls -l: {line}");
    assert!(ls.lines().any(|l| l.starts_with('d') && l.ends_with(" sub")), "ls -l: {ls}");
    let found = ok(Command::new("find").arg(&m.point).arg("-type").arg("f"));
    let mut found: Vec<&str> = found.lines().collect();
    found.sort();
    let want: Vec<String> =
        ["big.bin", "copied.bin", "dd.bin", "small.txt"].iter().map(|n| m.path(&format!("/data/{n}"))).collect();
    assert_eq!(found, want);

    // mv and rm through the mount are what the CLI sees.
    ok(Command::new("mv").arg(m.path("/data/dd.bin")).arg(m.path("/data/sub/moved.bin")));
    ok(Command::new("rm").arg(m.path("/data/copied.bin")));
    let listed = ok_stdout(&agent.cli(&["ls", "/data/sub"]));
    assert_eq!(listed.trim(), "moved.bin");
    assert!(!ok_stdout(&agent.cli(&["ls", "/data"])).contains("copied.bin"));
    // The daemon removes without asking what the entry is; the kernel refuses the wrong
    // kind first, and DAOS or the local backend a directory that is not empty.
    let refused = |c: &mut Command, why: &str| {
        let out = run(c);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(why), "{c:?}: {stderr}");
    };
    refused(Command::new("unlink").arg(m.path("/data/sub")), "Is a directory");
    refused(Command::new("rmdir").arg(m.path("/data/small.txt")), "Not a directory");
    refused(Command::new("rmdir").arg(m.path("/data/sub")), "not empty");
    ok(Command::new("mkdir").arg(m.path("/data/empty")));
    ok(Command::new("rmdir").arg(m.path("/data/empty")));
    assert!(!ok_stdout(&agent.cli(&["ls", "/data"])).contains("empty"));

    // Changed by another client to bytes of the same length: once the attributes are
    // stale (1 s) the next open sees a new modification time and drops the cached pages.
    put(&agent, &scratch, "/data/small.txt", b"HELLO, DPUIO\n");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(ok(Command::new("cat").arg(m.path("/data/small.txt"))), "HELLO, DPUIO\n");
}

#[test]
fn python_and_numpy_by_path_through_the_mount() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    let scratch = scratch(dir.path());
    let Some(m) = mount(&agent, dir.path(), &[]) else { return };
    let root = m.point.to_str().expect("utf-8");
    python_by_path(Command::new(python()), root, &agent, &scratch);
    // ftruncate through an open file (setattr with a handle).
    let script = format!(
        "import os\nwith open('{root}/out/renamed.txt', 'r+') as f:\n    f.truncate(10)\nprint(os.stat('{root}/out/renamed.txt').st_size)"
    );
    assert_eq!(ok(Command::new(python()).arg("-c").arg(&script)).trim(), "10");
    assert_eq!(get(&agent, &scratch, "/out/renamed.txt"), "line\n".repeat(2).into_bytes());
    numpy_round_trip(Command::new(python()), root, &agent, &scratch);
}

#[test]
fn fio_verifies_what_it_wrote_through_the_mount() {
    if !has_fio() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    let Some(m) = mount(&agent, dir.path(), &[]) else { return };
    fio_write_read_verify(&agent, || Command::new("fio"), dir.path(), &m.path("/fio"));
}

#[test]
fn failures_are_the_errno_programs_expect() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    let scratch = scratch(dir.path());
    put(&agent, &scratch, "/shared/ok.txt", b"ok\n");
    put(&agent, &scratch, "/secret/key.txt", b"secret\n");
    put(&agent, &scratch, "/full/f.txt", b"f\n");
    let Some(m) = mount(&agent, dir.path(), &[]) else { return };
    expect_errnos(Command::new(python()), m.point.to_str().expect("utf-8"), NAMESPACE_ERRNOS);
    drop(m);

    // A mount attached with a token narrowed to /shared: inside it reads, outside it is
    // EACCES, from cat and from Python.
    let token = read_only_token(&agent, "/shared");
    let Some(narrowed) = mount(&agent, dir.path(), &[("DPUIO_TOKEN", &token)]) else { return };
    assert_eq!(ok(Command::new("cat").arg(narrowed.path("/shared/ok.txt"))), "ok\n");
    let denied = run(Command::new("cat").arg(narrowed.path("/secret/key.txt")));
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(!denied.status.success() && denied.stdout.is_empty(), "read outside the token's prefix: {denied:?}");
    assert!(stderr.contains("Permission denied"), "cat should say EACCES: {stderr}");
    let checks = r#"
expect("EACCES open", errno.EACCES, open, m + "/secret/key.txt")
expect("EACCES listdir", errno.EACCES, os.listdir, m + "/secret")
expect("EACCES write", errno.EACCES, open, m + "/shared/new.txt", "w")
"#;
    expect_errnos(Command::new(python()), narrowed.point.to_str().expect("utf-8"), checks);
}

#[test]
fn tampered_data_is_eio_and_none_of_it_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let EncryptedAgent { agent, storage } = encrypted_agent(dir.path(), "fuse-integrity");
    let scratch = scratch(dir.path());
    let plain = random_bytes(300_000);
    put(&agent, &scratch, "/enc.bin", &plain);
    put(&agent, &scratch, "/intact.bin", &plain);
    storage.alter_stored("default", "/enc.bin", |bytes| bytes[SECOND_BLOCK + 100] ^= 1);
    let Some(m) = mount(&agent, dir.path(), &[]) else { return };
    assert!(run(Command::new("cat").arg(m.path("/intact.bin"))).stdout == plain, "an intact encrypted file reads");
    let catted = run(Command::new("cat").arg(m.path("/enc.bin")));
    let stderr = String::from_utf8_lossy(&catted.stderr);
    assert!(!catted.status.success() && stderr.contains("Input/output error"), "cat: {stderr}");
    // The kernel may retry page by page and hand out the intact first block; nothing
    // of the tampered one.
    assert!(
        catted.stdout.len() <= 65536 && plain.starts_with(&catted.stdout),
        "cat released {} bytes of a read that failed",
        catted.stdout.len()
    );
    assert!(m.log().contains("Integrity") || m.log().contains("integrity"), "the mount logs why: {}", m.log());
}

#[test]
fn sigterm_and_fusermount_unmount_and_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    let Some(mut m) = mount(&agent, dir.path(), &[]) else { return };
    ok(Command::new("ls").arg(&m.point));
    ok(Command::new("kill").arg("-TERM").arg(m.child.id().to_string()));
    assert_eq!(m.wait(), Some(0), "exit status after SIGTERM: {}", m.log());
    assert!(!is_mounted(&m.point), "still mounted after SIGTERM");
    drop(m);

    if Command::new("fusermount3").arg("-V").output().is_err() {
        eprintln!("SKIPPED (fusermount3 part): fusermount3 is not installed (./x test installs fuse3)");
        return;
    }
    let Some(mut m) = mount(&agent, dir.path(), &[]) else { return };
    ok(Command::new("fusermount3").arg("-u").arg(&m.point));
    assert_eq!(m.wait(), Some(0), "exit status after fusermount3 -u: {}", m.log());
    assert!(!is_mounted(&m.point));

    // Without --foreground: it returns once the mount serves, and a background process
    // serves it until unmounted.
    let point = m.point.clone();
    let out = agent.command("dpuio").arg("mount").arg(&point).output().expect("run dpuio mount");
    assert!(out.status.success(), "background mount: {}", String::from_utf8_lossy(&out.stderr));
    assert!(is_mounted(&point), "mounted once dpuio mount returned");
    ok(Command::new("ls").arg(&point));
    ok(Command::new("fusermount3").arg("-u").arg(&point));
    assert!(!is_mounted(&point));
}

#[test]
fn a_mount_point_that_is_missing_or_not_a_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let missing = dir.path().join("missing");
    let out = run(command_in("dpuio", &home).arg("mount").arg(&missing).arg("--foreground"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("does not exist"), "{stderr}");
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let out = run(command_in("dpuio", &home).arg("mount").arg(&file));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("is not a directory"), "{stderr}");

    // A user who may not open /dev/fuse (it is root's alone here) is told so.
    use std::os::unix::fs::PermissionsExt;
    let device = std::fs::metadata("/dev/fuse").map(|m| m.permissions().mode());
    let is_root = run(Command::new("id").arg("-u")).stdout == b"0\n";
    if !is_root || device.as_ref().map_or(true, |mode| mode & 0o006 != 0) || !Path::new("/usr/bin/setpriv").exists() {
        eprintln!("SKIPPED (the /dev/fuse part): needs root, setpriv and a /dev/fuse closed to others ({device:?})");
        return;
    }
    let point = dir.path().join("point");
    std::fs::create_dir(&point).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = || {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(dpuio_tests::binary("dpuio"));
        c
    };
    if !run(as_nobody().arg("--version")).status.success() {
        eprintln!("SKIPPED (the /dev/fuse part): user 65534 cannot run the dpuio binary where it was built");
        return;
    }
    let out = run(as_nobody().arg("mount").arg(&point).arg("--foreground"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("cannot open /dev/fuse: Permission denied"), "{stderr}");
}

#[test]
fn a_process_that_may_not_mount_is_told_why() {
    // Root without CAP_SYS_ADMIN: mount(2) is refused, and so is fusermount3.
    let is_root = run(Command::new("id").arg("-u")).stdout == b"0\n";
    if !is_root || !Path::new("/usr/bin/setpriv").exists() || fuse_unavailable().is_some() {
        eprintln!("SKIPPED: needs root, setpriv and /dev/fuse");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    let point = dir.path().join("point");
    std::fs::create_dir(&point).unwrap();
    let command = agent.command("dpuio");
    let out = run(Command::new("setpriv")
        .arg("--bounding-set=-sys_admin")
        .arg(command.get_program())
        .arg("mount")
        .arg(&point)
        .envs(command.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .env_remove("DPUIO_TOKEN"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("is not permitted"), "{stderr}");
    assert!(!is_mounted(&point.canonicalize().unwrap()));
}
