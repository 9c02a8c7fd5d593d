//! The Debian packages `./x package` writes (target/packages, or `$DPUIO_PACKAGE_DIR`):
//!
//! * arm64: the binaries are aarch64 ELF files, the control data is valid and names the
//!   UCX runtime (and recommends libfabric1, the agent daos-client too), the config is a
//!   conffile;
//! * amd64: both packages install with `dpkg -i` on this machine, the installed agent starts
//!   from its installed paths and config as its own system user, the installed `dpuio` puts
//!   a file, and a C program built with `pkg-config --cflags --libs dpuio` reads it back.
//!   Then both are purged and what the test made is removed.
//!
//! Without packages, or without root for the install, each test says it is skipped and why.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use dpuio_tests::ok_stdout;

fn package_dir() -> PathBuf {
    std::env::var_os("DPUIO_PACKAGE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/packages"))
}

fn package(name: &str, arch: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(package_dir())
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let file = p.file_name().unwrap().to_string_lossy();
            file.starts_with(&format!("{name}_")) && file.ends_with(&format!("_{arch}.deb"))
        })
        .collect();
    found.sort();
    found.pop()
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap_or_else(|e| panic!("run {program}: {e}"))
}

#[test]
fn arm64_packages_hold_aarch64_binaries_and_valid_control_data() {
    let (Some(agent), Some(host)) = (package("dpuio-agent", "arm64"), package("dpuio-host", "arm64")) else {
        eprintln!("SKIPPED: no arm64 packages in {}: `./x package` builds them", package_dir().display());
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    for (deb, files) in [
        (&agent, &["usr/bin/dpu-agent", "usr/bin/dpuctl"][..]),
        (
            &host,
            &[
                "usr/bin/dpuio",
                "usr/bin/dpuio-bench",
                "usr/bin/dpuio-bench-agent",
                "usr/lib/aarch64-linux-gnu/libdpuio.so",
            ][..],
        ),
    ] {
        let info = ok_stdout(&run("dpkg-deb", &["--info", deb.to_str().unwrap()]));
        assert!(info.contains("Architecture: arm64"), "{info}");
        assert!(info.contains("libucx0 (>="), "Depends must name the UCX runtime:\n{info}");
        let root = tmp.path().join(deb.file_stem().unwrap());
        ok_stdout(&run("dpkg-deb", &["-x", deb.to_str().unwrap(), root.to_str().unwrap()]));
        for f in files {
            let kind = ok_stdout(&run("file", &["-b", root.join(f).to_str().unwrap()]));
            assert!(kind.contains("ARM aarch64"), "{f} is not aarch64: {kind}");
        }
    }
    // The DAOS backend's libraries and daos_agent, and libfabric (loaded at run time by the
    // ofi transports): wanted, not required (the local backend and UCX serve without them).
    let recommends = |deb: &Path| ok_stdout(&run("dpkg-deb", &["--field", deb.to_str().unwrap(), "Recommends"]));
    assert_eq!(recommends(&agent).trim(), "daos-client, libfabric1");
    assert_eq!(recommends(&host).trim(), "libfabric1");
    let contents = ok_stdout(&run("dpkg-deb", &["--contents", agent.to_str().unwrap()]));
    for path in ["./etc/dpuio/agent.toml", "./lib/systemd/system/dpu-agent.service"] {
        assert!(contents.contains(path), "{path} missing:\n{contents}");
    }
    let conffiles = ok_stdout(&run("dpkg-deb", &["--info", agent.to_str().unwrap(), "conffiles"]));
    assert_eq!(conffiles.trim(), "/etc/dpuio/agent.toml");
    let contents = ok_stdout(&run("dpkg-deb", &["--contents", host.to_str().unwrap()]));
    for path in ["./usr/include/dpuio.h", "./usr/lib/aarch64-linux-gnu/libdpuio.a", "pkgconfig/dpuio.pc"] {
        assert!(contents.contains(path), "{path} missing:\n{contents}");
    }
}

/// Removes what the install test made, also when it fails.
struct Installed {
    agent: Option<dpuio_harness::Agent>,
    made_user: bool,
}

impl Drop for Installed {
    fn drop(&mut self) {
        drop(self.agent.take()); // killed before its package goes
        let _ = run("dpkg", &["--purge", "dpuio-agent", "dpuio-host"]);
        let _ = std::fs::remove_dir_all("/var/lib/dpuio");
        let _ = std::fs::remove_dir_all("/run/dpuio");
        if self.made_user {
            let _ = run("deluser", &["--quiet", "--system", "dpuio"]);
        }
    }
}

#[test]
fn amd64_packages_install_and_the_installed_agent_serves() {
    let (Some(agent_deb), Some(host_deb)) = (package("dpuio-agent", "amd64"), package("dpuio-host", "amd64")) else {
        eprintln!("SKIPPED: no amd64 packages in {}: `./x package` builds them", package_dir().display());
        return;
    };
    if ok_stdout(&run("id", &["-u"])).trim() != "0" {
        eprintln!("SKIPPED: dpkg -i needs root");
        return;
    }
    for existing in ["/usr/bin/dpu-agent", "/usr/bin/dpuio", "/var/lib/dpuio", "/etc/dpuio"] {
        if Path::new(existing).exists() {
            eprintln!("SKIPPED: {existing} exists on this machine: not installing over it");
            return;
        }
    }
    let made_user = !run("getent", &["passwd", "dpuio"]).status.success();
    let mut installed = Installed { agent: None, made_user };
    let out = run("dpkg", &["-i", agent_deb.to_str().unwrap(), host_deb.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "dpkg -i failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(run("getent", &["passwd", "dpuio"]).status.success(), "the package made no dpuio user");
    ok_stdout(&run("/usr/bin/dpu-agent", &["check-config", "/etc/dpuio/agent.toml"]));
    let mode = ok_stdout(&run("stat", &["-c", "%a %G", "/etc/dpuio/agent.toml"]));
    assert_eq!(mode.trim(), "640 dpuio", "the config must be readable by the agent's group only");

    // What systemd does for the unit (StateDirectory, RuntimeDirectory, User, Environment).
    for dir in ["/var/lib/dpuio", "/run/dpuio"] {
        std::fs::create_dir_all(dir).unwrap();
        ok_stdout(&run("chown", &["dpuio:dpuio", dir]));
    }
    // As the unit's User=dpuio, started directly (not through runuser) so that the child
    // this test kills is the agent itself.
    let id_of = |flag: &str| -> u32 { ok_stdout(&run("id", &[flag, "dpuio"])).trim().parse().unwrap() };
    let mut command = Command::new("/usr/bin/dpu-agent");
    command
        .args(["serve", "--config", "/etc/dpuio/agent.toml", "--listen", "127.0.0.1:0"])
        .uid(id_of("-u"))
        .gid(id_of("-g"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/var/lib/dpuio")
        .env("DPUIO_CONFIG_DIR", "/var/lib/dpuio/client")
        .stderr(Stdio::inherit());
    let agent =
        dpuio_harness::start(command, Duration::from_secs(30)).unwrap_or_else(|e| panic!("the installed agent: {e}"));
    let addr = agent.addr().to_owned();
    installed.agent = Some(agent);
    let status = ok_stdout(&run("/usr/bin/dpuctl", &["--socket", "/run/dpuio/admin.sock", "status"]));
    assert!(status.contains("backend   local"), "{status}");

    // The installed CLI writes a file; a C program built against the installed library
    // (pkg-config only, nothing from this repository but the example's source) reads it.
    let tmp = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(3u32 << 20) + 77).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let local = tmp.path().join("sample.bin");
    std::fs::write(&local, &data).unwrap();
    // The packaged config names its tenants: their client bundles come from the admin
    // socket, as an operator makes them (docs/deploy.md).
    let certs = tmp.path().join("vision-certs");
    ok_stdout(&run(
        "/usr/bin/dpuctl",
        &["--socket", "/run/dpuio/admin.sock", "cert", "issue", "--tenant", "vision", "--out", certs.to_str().unwrap()],
    ));
    let client = |cmd: &mut Command| -> Output {
        cmd.env("DPUIO_AGENT", &addr)
            .env("DPUIO_CONFIG_DIR", &certs)
            // The client (root) and the agent (dpuio) are different users, as a host and a
            // DPU are different machines: UCX shared memory between two users is refused
            // (UCS_ERR_SHMEM_SEGMENT), TCP is what crosses.
            .env("DPUIO_TRANSPORT", "tcp")
            .env("HOME", tmp.path())
            .output()
            .unwrap()
    };
    ok_stdout(&client(Command::new("/usr/bin/dpuio").args(["put", local.to_str().unwrap(), "/sample.bin"])));
    let flags = ok_stdout(&run("pkg-config", &["--cflags", "--libs", "dpuio"]));
    let exe = tmp.path().join("read_file");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/c/read_file.c");
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-O1", "-o"]).arg(&exe).arg(&source).args(flags.split_whitespace());
    let out = cc.output().unwrap();
    assert!(out.status.success(), "cc with pkg-config failed: {}", String::from_utf8_lossy(&out.stderr));
    let out = client(Command::new(&exe).args(["/sample.bin", "1048576", "4"]));
    let said = ok_stdout(&out);
    assert!(said.contains(&format!("size={}", data.len())), "{said}");
    let fnv = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    assert!(said.contains(&format!("fnv1a64={fnv:016x}")), "checksum differs: {said}");

    // SIGTERM stops the installed agent cleanly, as systemctl stop does.
    let mut agent = installed.agent.take().unwrap();
    ok_stdout(&run("kill", &["-TERM", &agent.id().to_string()]));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = agent.child_mut().try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "the installed agent did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "the installed agent exited with {status}");
    drop(installed);
    assert!(!Path::new("/usr/bin/dpu-agent").exists(), "purge left the agent behind");
}
