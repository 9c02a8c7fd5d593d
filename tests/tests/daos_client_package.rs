//! The `daos-client` Debian packages of deploy/daos (`$DPUIO_PACKAGE_DIR`, or
//! target/packages: `daos-client_*_{amd64,arm64}.deb`):
//!
//! * each package's contents: every ELF file is for its architecture with `$ORIGIN` run
//!   paths, the control data is valid and its Depends sane, the unit, the conffile and the
//!   pkg-config file are there, and nothing of the DAOS server is;
//! * the amd64 package installed with `dpkg -i` on this machine, against the running DAOS
//!   system of `daos-up.sh` (`DAOS_POOL`...): the package's own `daos_agent`, as its system
//!   user, serves a `dpu-agent` with `[backend] kind = "daos"` that has neither
//!   `DPUIO_DAOS_PREFIX` nor `LD_LIBRARY_PATH`: a put/get round trip is byte-identical, the
//!   agent says it loaded DAOS from /usr/lib/daos/lib64, and the package's `daos` lists the
//!   container. Then the package is purged and what the test made is removed, also when
//!   it fails.
//!
//! Without the packages, or without root for the install, each test says it is skipped
//! and why; without a running DAOS system too, unless `DPUIO_REQUIRE_DAOS=1` (`./x test`'s
//! DAOS tier), which makes that a failure.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use dpuio_tests::{AgentProcess, binary, ok_stdout};

fn package_dir() -> PathBuf {
    std::env::var_os("DPUIO_PACKAGE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/packages"))
}

fn package(arch: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(package_dir())
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let file = p.file_name().unwrap().to_string_lossy();
            file.starts_with("daos-client_") && file.ends_with(&format!("_{arch}.deb"))
        })
        .collect();
    found.sort();
    found.pop()
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap_or_else(|e| panic!("run {program}: {e}"))
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && magic == *b"\x7fELF"
}

/// Every regular file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file() {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Names a file of the DAOS server (engine, control server, their libraries, SPDK/DPDK/PMDK).
fn is_server_file(path: &str) -> bool {
    [
        "daos_server",
        "daos_engine",
        "daos_srv",
        "spdk",
        "dpdk",
        "librte_",
        "pmdk",
        "libpmem",
        "libdav",
        "libvos",
        "libbio",
        "/ddb",
        "/dlck",
        "daos_metrics",
    ]
    .iter()
    .any(|s| path.contains(s))
}

/// The checks on one package's contents and control data.
fn check_contents(deb: &Path, arch: &str, elf_kind: &str) {
    let deb_s = deb.to_str().unwrap();
    let info = ok_stdout(&run("dpkg-deb", &["--info", deb_s]));
    assert!(info.contains("Package: daos-client\n"), "{info}");
    assert!(info.contains(&format!("Architecture: {arch}\n")), "{info}");
    assert!(info.contains("Version: 2.9.100-1\n"), "{info}");
    let depends = info.lines().find_map(|l| l.trim().strip_prefix("Depends: ")).expect("a Depends field");
    // Sane: every entry is a package with an optional version; the C library, the
    // system libraries DAOS links (hwloc, UCX for mercury's plugin) and adduser (postinst)
    // are there, and nothing names an architecture or the package itself.
    for entry in depends.split(", ") {
        let name = entry.split(' ').next().unwrap();
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c)),
            "Depends entry {entry:?} in {depends}"
        );
        assert!(name != "daos-client" && !entry.contains(':'), "Depends entry {entry:?}");
        if let Some(version) = entry.strip_prefix(name) {
            let version = version.trim();
            assert!(
                version.is_empty() || (version.starts_with("(>= ") && version.ends_with(')')),
                "Depends entry {entry:?}"
            );
        }
    }
    for needed in ["libc6 (>= ", "libhwloc15", "libucx0", "libuuid1", "adduser"] {
        assert!(depends.contains(needed), "Depends lacks {needed}: {depends}");
    }
    let conffiles = ok_stdout(&run("dpkg-deb", &["--info", deb_s, "conffiles"]));
    assert_eq!(conffiles.trim(), "/etc/daos/daos_agent.yml");
    let postinst = ok_stdout(&run("dpkg-deb", &["--info", deb_s, "postinst"]));
    assert!(postinst.contains("adduser --system") && postinst.contains("daos_agent"), "{postinst}");

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    ok_stdout(&run("dpkg-deb", &["-x", deb_s, root.to_str().unwrap()]));
    let d = root.join("usr/lib/daos");
    for f in [
        "bin/daos",
        "bin/daos_agent",
        "bin/dmg",
        "bin/dfuse",
        "lib64/libdfs.so",
        "lib64/libdaos.so.2",
        "lib64/libgurt.so.4",
        "lib64/libcart.so.4",
        "lib64/libdaos_common.so",
        "lib64/libduns.so",
        "lib64/libioil.so",
        "lib64/libpil4dfs.so",
        "include/daos.h",
        "include/daos_fs.h",
        "prereq/release/ofi/lib64/libfabric.so.1",
        "prereq/release/mercury/lib64/libmercury.so.2",
        "prereq/release/mercury/lib64/libna.so.6",
        "prereq/release/mercury/lib64/mercury/libna_plugin_ofi.so",
        "prereq/release/argobots/lib64/libabt.so.1",
        "prereq/release/isal/lib64/libisal.so.2",
        "prereq/release/isal_crypto/lib64/libisal_crypto.so.2",
    ] {
        assert!(d.join(f).exists(), "{deb_s}: /usr/lib/daos/{f} missing");
    }
    for tool in ["daos", "daos_agent", "dfuse", "dmg"] {
        let link =
            std::fs::read_link(root.join("usr/bin").join(tool)).unwrap_or_else(|e| panic!("/usr/bin/{tool}: {e}"));
        assert_eq!(link, Path::new("../lib/daos/bin").join(tool));
    }
    let triplet = if arch == "arm64" { "aarch64-linux-gnu" } else { "x86_64-linux-gnu" };
    let pc = std::fs::read_to_string(root.join(format!("usr/lib/{triplet}/pkgconfig/daos.pc"))).unwrap();
    assert!(pc.contains("prefix=/usr/lib/daos\n") && pc.contains("Cflags: -I${includedir}"), "{pc}");
    assert!(pc.contains("Libs: -L${libdir} -Wl,-rpath,${libdir} -ldfs -ldaos -lgurt"), "{pc}");
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/daos_agent.service")).unwrap();
    for line in [
        "User=daos_agent",
        "ExecStart=/usr/bin/daos_agent -o /etc/daos/daos_agent.yml",
        "RuntimeDirectory=daos_agent",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=\n",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "LimitMEMLOCK=infinity",
    ] {
        assert!(unit.contains(line), "daos_agent.service lacks {line:?}:\n{unit}");
    }
    let yml = std::fs::read_to_string(root.join("etc/daos/daos_agent.yml")).unwrap();
    for key in
        ["#name:", "#access_points:", "#port:", "#transport_config:", "#runtime_dir: /run/daos_agent", "#log_file:"]
    {
        assert!(yml.contains(key), "daos_agent.yml lacks {key}");
    }

    let mut elves = 0;
    for f in files(root) {
        let rel = f.strip_prefix(root).unwrap().display().to_string();
        assert!(!is_server_file(&format!("/{rel}")), "{deb_s}: server file /{rel}");
        if !is_elf(&f) {
            continue;
        }
        elves += 1;
        let kind = ok_stdout(&run("file", &["-b", f.to_str().unwrap()]));
        assert!(kind.contains(elf_kind), "/{rel} is not {elf_kind}: {kind}");
        let dynamic = ok_stdout(&run("readelf", &["-d", f.to_str().unwrap()]));
        for line in dynamic.lines().filter(|l| l.contains("(RUNPATH)") || l.contains("(RPATH)")) {
            let paths = line.split('[').nth(1).unwrap_or("").trim_end_matches(']');
            assert!(paths.split(':').all(|p| p.starts_with("$ORIGIN")), "/{rel}: run path outside the package: {line}");
        }
    }
    assert!(elves >= 20, "{deb_s}: only {elves} ELF files");
}

#[test]
fn daos_client_packages_hold_the_client_for_their_architecture_and_nothing_of_the_server() {
    let packages: Vec<(&str, &str, PathBuf)> = [("arm64", "ARM aarch64"), ("amd64", "x86-64")]
        .into_iter()
        .filter_map(|(arch, kind)| package(arch).map(|p| (arch, kind, p)))
        .collect();
    if packages.iter().all(|(arch, _, _)| *arch != "arm64") {
        eprintln!(
            "SKIPPED: no daos-client arm64 package in {}: deploy/daos/build-deb.sh makes it (./x test's DAOS tier does)",
            package_dir().display()
        );
        return;
    }
    for (arch, kind, deb) in packages {
        check_contents(&deb, arch, kind);
    }
}

/// A `DAOS_POOL` of a running system and the port of its access point, or why not.
fn daos_system() -> Result<(String, u16), String> {
    let pool = std::env::var("DAOS_POOL")
        .ok()
        .filter(|p| !p.is_empty())
        .ok_or("DAOS_POOL is not set (start DAOS with ../shared/daos/daos-up.sh RUNDIR, then source RUNDIR/env)")?;
    // daos-up.sh's agent config names the port; DAOS_PORT (its setting) or 10001 otherwise.
    let from_rundir = std::env::var_os("DAOS_RUNDIR")
        .and_then(|r| std::fs::read_to_string(Path::new(&r).join("daos_agent.yml")).ok())
        .and_then(|yml| yml.lines().find_map(|l| l.strip_prefix("port:").map(|p| p.trim().to_owned())));
    let port = from_rundir.or_else(|| std::env::var("DAOS_PORT").ok()).unwrap_or_else(|| "10001".into());
    let port: u16 = port.parse().map_err(|_| format!("the DAOS port {port:?} is not a number"))?;
    if std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).is_err() {
        return Err(format!("no DAOS server listens on localhost:{port}"));
    }
    Ok((pool, port))
}

/// Undoes the install test, in order, also when it fails: the dpu-agent, the container,
/// the package's daos_agent, the package, the user its postinst made.
struct Installed {
    agent: Option<AgentProcess>,
    daos_agent: Option<Child>,
    container: Option<(String, String, PathBuf)>,
    made_user: bool,
}

impl Drop for Installed {
    fn drop(&mut self) {
        drop(self.agent.take());
        if let Some((pool, label, socket_dir)) = self.container.take() {
            let _ = Command::new("/usr/bin/daos")
                .args(["container", "destroy", "--force", &pool, &label])
                .env("DAOS_AGENT_DRPC_DIR", socket_dir)
                .env_remove("LD_LIBRARY_PATH")
                .output();
        }
        if let Some(mut child) = self.daos_agent.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = run("dpkg", &["--purge", "daos-client"]);
        if self.made_user {
            let _ = run("deluser", &["--quiet", "--system", "daos_agent"]);
        }
    }
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> Result<bool, String>) {
    let deadline = Instant::now() + timeout;
    loop {
        match ready() {
            Ok(true) => return,
            Ok(false) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Ok(false) => panic!("{what}: not within {timeout:?}"),
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

#[test]
fn amd64_package_installs_and_dpu_agent_serves_over_its_daos_client() {
    let Some(deb) = package("amd64") else {
        eprintln!(
            "SKIPPED: no daos-client amd64 package in {}: deploy/daos/build-deb.sh makes it (./x test's DAOS tier does)",
            package_dir().display()
        );
        return;
    };
    if ok_stdout(&run("id", &["-u"])).trim() != "0" {
        eprintln!("SKIPPED: dpkg -i needs root");
        return;
    }
    let (pool, port) = match daos_system() {
        Ok(system) => system,
        Err(why) => {
            assert!(std::env::var("DPUIO_REQUIRE_DAOS").as_deref() != Ok("1"), "DPUIO_REQUIRE_DAOS=1 but: {why}");
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    for existing in ["/usr/lib/daos", "/etc/daos", "/usr/bin/daos", "/usr/bin/daos_agent"] {
        if Path::new(existing).exists() {
            eprintln!("SKIPPED: {existing} exists on this machine: not installing over it");
            return;
        }
    }
    let made_user = !run("getent", &["passwd", "daos_agent"]).status.success();
    let mut installed = Installed { agent: None, daos_agent: None, container: None, made_user };
    let out = run("dpkg", &["-i", deb.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "dpkg -i {} failed: {}{}",
        deb.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(run("getent", &["passwd", "daos_agent"]).status.success(), "the package made no daos_agent user");

    // The package's daos_agent as its unit runs it (user daos_agent), pointed at the
    // running system, its socket in a directory of its own.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let run_dir = tmp.path().join("daos_agent");
    std::fs::create_dir(&run_dir).unwrap();
    ok_stdout(&run("chown", &["daos_agent:daos_agent", run_dir.to_str().unwrap()]));
    let agent_yml = tmp.path().join("daos_agent.yml");
    std::fs::write(
        &agent_yml,
        format!(
            "name: daos_server\naccess_points: ['localhost:{port}']\nport: {port}\n\
             transport_config:\n  allow_insecure: true\nruntime_dir: {}\nlog_file: {}\n",
            run_dir.display(),
            run_dir.join("daos_agent.log").display()
        ),
    )
    .unwrap();
    let id_of = |flag: &str| -> u32 { ok_stdout(&run("id", &[flag, "daos_agent"])).trim().parse().unwrap() };
    let daos_agent = Command::new("/usr/bin/daos_agent")
        .arg("-o")
        .arg(&agent_yml)
        .uid(id_of("-u"))
        .gid(id_of("-g"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start /usr/bin/daos_agent");
    installed.daos_agent = Some(daos_agent);
    let socket = run_dir.join("daos_agent.sock");
    wait_for("the package's daos_agent socket", Duration::from_secs(30), || {
        if let Some(status) = installed.daos_agent.as_mut().unwrap().try_wait().unwrap() {
            let log = std::fs::read_to_string(run_dir.join("daos_agent.log")).unwrap_or_default();
            return Err(format!("daos_agent exited ({status}): {log}"));
        }
        Ok(socket.exists())
    });

    // dpu-agent, the workspace's build, with neither DPUIO_DAOS_PREFIX nor LD_LIBRARY_PATH.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let label = format!("pkg-{}-{}", std::process::id(), nanos % 1_000_000_000);
    installed.container = Some((pool.clone(), label.clone(), run_dir.clone()));
    let data_dir = tmp.path().join("data");
    let config = dpuio_harness::write_config(
        tmp.path(),
        &format!(
            "[backend]\nkind = \"daos\"\npool = \"{pool}\"\nagent_socket_dir = \"{}\"\ncreate_containers = true\n\n\
             [[tenants]]\nname = \"default\"\ncontainer = \"{label}\"\n",
            run_dir.display()
        ),
    )
    .unwrap();
    let log_path = tmp.path().join("dpu-agent.log");
    let mut program = Command::new(binary("dpu-agent"));
    dpuio_tests::hermetic(&mut program, &data_dir.join(".home"));
    let mut command = dpuio_harness::serve_command(program, &data_dir);
    command
        .args(["--listen", dpuio_harness::LOOPBACK_ANY_PORT, "--config", config.to_str().unwrap()])
        .env_remove("DPUIO_DAOS_PREFIX")
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("DAOS_AGENT_DRPC_DIR")
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log_path).unwrap());
    let started = dpuio_harness::start(command, Duration::from_secs(60));
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let process = started.unwrap_or_else(|e| panic!("dpu-agent over the package's DAOS client: {e}\n{}", log()));
    let agent = installed.agent.insert(AgentProcess::adopt(process, &data_dir, None));
    assert!(
        log().contains("DAOS client libraries loaded from /usr/lib/daos/lib64"),
        "the agent did not load DAOS from the package:\n{}",
        log()
    );

    eprintln!("{}", log().lines().find(|l| l.contains("DAOS client libraries loaded from")).unwrap_or_default());
    // What the process really mapped: the package's DAOS libraries and its libfabric
    // (mercury's, which the data plane then shares), no other copy of either.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", agent.process.id())).unwrap();
    let mapped = |name: &str| -> Vec<&str> {
        let mut paths: Vec<&str> =
            maps.lines().filter_map(|l| l.split_whitespace().nth(5)).filter(|p| p.contains(name)).collect();
        paths.dedup();
        paths
    };
    for (name, from) in [
        ("/libdfs.so", "/usr/lib/daos/lib64/"),
        ("/libdaos.so", "/usr/lib/daos/lib64/"),
        ("/libfabric.so", "/usr/lib/daos/prereq/release/ofi/lib64/"),
        ("/libmercury.so", "/usr/lib/daos/prereq/release/mercury/lib64/"),
    ] {
        let paths = mapped(name);
        assert!(
            !paths.is_empty() && paths.iter().all(|p| p.starts_with(from)),
            "{name} mapped from {paths:?}, not {from}"
        );
    }

    let input = tmp.path().join("in.bin");
    let data: Vec<u8> = {
        use rand::{Rng, SeedableRng};
        let mut data = vec![0u8; 8 << 20];
        rand::rngs::StdRng::seed_from_u64(23).fill(&mut data[..]);
        data
    };
    std::fs::write(&input, &data).unwrap();
    let back = tmp.path().join("back.bin");
    let started = Instant::now();
    let put = agent.cli(&["--transport", "shm", "put", input.to_str().unwrap(), "/package.bin"]);
    assert!(put.status.success(), "put: {}\nagent log:\n{}", String::from_utf8_lossy(&put.stderr), log());
    let get = agent.cli(&["--transport", "shm", "get", "/package.bin", back.to_str().unwrap()]);
    assert!(get.status.success(), "get: {}\nagent log:\n{}", String::from_utf8_lossy(&get.stderr), log());
    assert!(std::fs::read(&back).unwrap() == data, "get differs from put");
    eprintln!("8 MiB put and get through the package's DAOS client: {:?}", started.elapsed());

    // The package's own daos tool sees the container dpu-agent made.
    let list = Command::new("/usr/bin/daos")
        .args(["container", "list", &pool])
        .env("DAOS_AGENT_DRPC_DIR", &run_dir)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let listing = ok_stdout(&list);
    assert!(listing.contains(&label), "daos container list {pool} lacks {label}:\n{listing}");
}
