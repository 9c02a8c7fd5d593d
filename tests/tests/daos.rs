//! End to end over the DAOS backend: a real `dpu-agent` with `[backend] kind = "daos"`
//! against a real DAOS system, driven by the `dpuio` CLI, and checked from outside dpuio
//! with DAOS's own `daos` tool.
//!
//! Needs what `../shared/daos/daos-up.sh RUNDIR` sets up (`source RUNDIR/env`): `DAOS_POOL`,
//! a `daos_agent` at `DAOS_AGENT_DRPC_DIR`, and `daos` on `PATH`. Without them each test
//! prints that it is skipped and why, unless `DPUIO_REQUIRE_DAOS=1` (`./x test`'s DAOS
//! tier), which makes a skip a failure. Each test uses its own containers in the pool.

use std::path::{Path, PathBuf};
use std::process::Command;

use dpuio_tests::daos::{Daos, label};
use dpuio_tests::{AgentProcess, ok_stdout};

fn daos(test: &str) -> Option<Daos> {
    dpuio_tests::daos::system(test)
}

fn config(dir: &Path, d: &Daos, container: &str, create: bool, extra_tenant: &str) -> PathBuf {
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            "[backend]\nkind = \"daos\"\npool = \"{}\"\nagent_socket_dir = \"{}\"\ncreate_containers = {create}\n\n\
             [[tenants]]\nname = \"default\"\ncontainer = \"{container}\"\n{extra_tenant}",
            d.pool,
            d.socket_dir.display()
        ),
    )
    .unwrap();
    path
}

fn random_file(path: &Path, bytes: usize, seed: u64) -> Vec<u8> {
    let data = dpuio_tests::seeded_bytes(bytes, seed);
    std::fs::write(path, &data).unwrap();
    data
}

fn daos_copy_out(d: &Daos, container: &str, path: &str, dst: &Path) {
    dpuio_tests::daos::copy_out(d, container, path, dst);
}

#[test]
fn put_get_256_mib_over_daos_and_daos_sees_the_same_bytes() {
    let Some(d) = daos("put_get_256_mib_over_daos") else { return };
    let dir = tempfile::tempdir().unwrap();
    let container = label("putget");
    let config = config(dir.path(), &d, &container, true, "");
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let local = dir.path().join("in.bin");
    let data = random_file(&local, 256 << 20, 12);
    let back = dir.path().join("back.bin");
    let started = std::time::Instant::now();
    ok_stdout(&agent.cli(&["--transport", "shm", "put", local.to_str().unwrap(), "/copy.bin"]));
    let put = started.elapsed();
    let started = std::time::Instant::now();
    ok_stdout(&agent.cli(&["--transport", "shm", "get", "/copy.bin", back.to_str().unwrap()]));
    eprintln!("256 MiB over daos: put {put:?}, get {:?}", started.elapsed());
    assert!(std::fs::read(&back).unwrap() == data, "get differs from put");
    assert!(ok_stdout(&agent.cli(&["stat", "/copy.bin"])).contains(&(256u64 << 20).to_string()));

    // From outside dpuio: DAOS's own tool finds the file with the same bytes.
    let outside = dir.path().join("outside.bin");
    daos_copy_out(&d, &container, "/copy.bin", &outside);
    assert!(std::fs::read(&outside).unwrap() == data, "daos filesystem copy differs from what was put");

    // A host reached with put/get (UCX's tcp): its requests' DAOS I/O runs on the I/O
    // threads through the agent's staged-I/O slots, many in flight, not on the engine.
    let tcp_data = random_file(&local, (40 << 20) + 12345, 13);
    ok_stdout(&agent.cli(&["--transport", "tcp", "put", local.to_str().unwrap(), "/tcp.bin"]));
    ok_stdout(&agent.cli(&["--transport", "tcp", "get", "/tcp.bin", back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == tcp_data, "tcp: get differs from put");
    daos_copy_out(&d, &container, "/tcp.bin", &outside);
    assert!(std::fs::read(&outside).unwrap() == tcp_data, "tcp: daos filesystem copy differs from what was put");
}

#[test]
fn namespace_operations_through_the_agent() {
    let Some(d) = daos("namespace_operations_through_the_agent") else { return };
    let dir = tempfile::tempdir().unwrap();
    let container = label("ns");
    let config = config(dir.path(), &d, &container, true, "");
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    ok_stdout(&agent.cli(&["mkdir", "-p", "/a/b"]));
    let names: Vec<String> = (0..300).map(|i| format!("/a/b/f{i:03}")).collect();
    let mut args = vec!["touch"];
    args.extend(names.iter().map(String::as_str));
    ok_stdout(&agent.cli(&args));
    let listing = ok_stdout(&agent.cli(&["ls", "/a/b"]));
    assert_eq!(listing.lines().count(), 300, "{listing}");
    ok_stdout(&agent.cli(&["mv", "/a/b/f000", "/a/moved"]));
    let out = agent.cli(&["mv", "/a/b/f001", "/a/moved"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("exists"), "{out:?}");
    let out = agent.cli(&["rm", "/a"]);
    assert!(!out.status.success(), "a non-empty directory is not removed without -r");
    ok_stdout(&agent.cli(&["rm", "-r", "/a"]));
    let out = agent.cli(&["stat", "/a"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no such file"), "{out:?}");
}

#[test]
fn encrypted_tenant_over_daos_stores_only_ciphertext_and_tampering_is_detected() {
    let Some(d) = daos("encrypted_tenant_over_daos") else { return };
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("kek");
    let key_bytes: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37).wrapping_add(5)).collect();
    std::fs::write(&key, &key_bytes).unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let container = label("enc");
    let encryption = format!("[tenants.encryption]\nkey_file = \"{}\"\n", key.display());
    let config = config(dir.path(), &d, &container, true, &encryption);
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let local = dir.path().join("in.bin");
    let data = random_file(&local, 3 << 20, 4);
    ok_stdout(&agent.cli(&["--transport", "shm", "put", local.to_str().unwrap(), "/secret.bin"]));
    let back = dir.path().join("back.bin");
    ok_stdout(&agent.cli(&["--transport", "shm", "get", "/secret.bin", back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == data, "get differs from put");
    // What DAOS holds is not the plaintext, nor contains any 4 KiB of it.
    let raw = dir.path().join("raw.bin");
    daos_copy_out(&d, &container, "/secret.bin", &raw);
    let raw = std::fs::read(&raw).unwrap();
    assert!(raw.len() > data.len(), "stored size {} holds header and tags", raw.len());
    assert!(!raw.windows(4096).take(1).any(|w| data.windows(4096).step_by(4096).any(|p| p == w)));
    assert!(raw[..data.len()] != data[..]);

    // Another DAOS client (libdfs in this process) flips one byte of stored ciphertext in
    // the second block: the agent refuses to release that data.
    {
        use dpuio_backend::{Backend, NsPath, OpenOptions};
        let outside = dpuio_daos::DaosBackend::open(dpuio_daos::DaosOptions {
            pool: d.pool.clone(),
            system: "daos_server".into(),
            agent_socket_dir: d.socket_dir.clone(),
            create_containers: false,
            chunk_bytes: dpuio_daos::DEFAULT_CHUNK_BYTES,
            object_class: String::new(),
            retry: std::time::Duration::ZERO,
            private_containers: false,
            redundancy_factor: 0,
            redundancy_level: 0,
            call_timeout: std::time::Duration::ZERO,
            dir_cache: std::time::Duration::ZERO,
        })
        .unwrap();
        let c = outside.mount(&container, false).unwrap();
        let f = c.open(&NsPath::parse("/secret.bin").unwrap(), OpenOptions { write: true, ..Default::default() }, 0);
        let f = f.unwrap();
        let at = 256 + 65536 + 28 + 100;
        let mut byte = [0u8; 1];
        assert_eq!(f.read_at(&mut byte, at).unwrap(), 1);
        byte[0] ^= 1;
        f.write_at(&byte, at).unwrap();
    }
    let out = agent.cli(&["--transport", "shm", "get", "/secret.bin", back.to_str().unwrap()]);
    assert!(!out.status.success(), "a tampered block was served");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("integrity"), "{err}");
}

/// Run `dpu-agent serve` with `config` (data under `dir`), which must fail; its stderr.
fn serve_fails(dir: &Path, config: &Path) -> String {
    let out = dpuio_tests::command_in("dpu-agent", &dir.join(".home"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve started with {}", config.display());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn serve_names_a_missing_container_and_what_to_do() {
    let Some(d) = daos("serve_names_a_missing_container") else { return };
    let dir = tempfile::tempdir().unwrap();
    let container = label("missing");
    let config = config(dir.path(), &d, &container, false, "");
    let stderr = serve_fails(dir.path(), &config);
    assert!(
        stderr.contains(&container)
            && stderr.contains("DER_NONEXIST")
            && stderr.contains("daos container create")
            && stderr.contains("create_containers = true"),
        "{stderr}"
    );
}

#[test]
fn serve_names_a_permission_denial_and_what_to_do() {
    let Some(d) = daos("serve_names_a_permission_denial") else { return };
    let dir = tempfile::tempdir().unwrap();
    let container = label("noperm");
    let daos_ok = |args: &[&str]| {
        let out = Command::new("daos").args(args).output().unwrap();
        assert!(out.status.success(), "daos {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    daos_ok(&["container", "create", &d.pool, &container, "--type=POSIX"]);
    // The owner keeps only read: opening for DFS read-write is refused (DER_NO_PERM).
    let acl = dir.path().join("acl.txt");
    std::fs::write(&acl, "A::OWNER@:r\n").unwrap();
    daos_ok(&["container", "overwrite-acl", &d.pool, &container, &format!("--acl-file={}", acl.display())]);
    let config = config(dir.path(), &d, &container, false, "");
    let stderr = serve_fails(dir.path(), &config);
    assert!(
        stderr.contains(&container)
            && stderr.contains("permission denied")
            && stderr.contains("DER_NO_PERM")
            && stderr.contains("daos container update-acl"),
        "{stderr}"
    );
}

#[test]
fn two_tenants_in_two_containers_of_one_pool_never_see_each_other() {
    let Some(d) = daos("two_tenants_in_two_containers") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (ca, cb) = (label("tenant-a"), label("tenant-b"));
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[backend]\nkind = \"daos\"\npool = \"{}\"\nagent_socket_dir = \"{}\"\ncreate_containers = true\n\
             [[tenants]]\nname = \"a\"\ncontainer = \"{ca}\"\n[[tenants]]\nname = \"b\"\ncontainer = \"{cb}\"\n",
            d.pool,
            d.socket_dir.display()
        ),
    )
    .unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let certs = dir.path().join("certs");
    for t in ["a", "b"] {
        ok_stdout(&agent.dpuctl(&["cert", "issue", "--tenant", t, "--out", certs.join(t).to_str().unwrap()]));
    }
    let as_tenant = |t: &str, args: &[&str]| {
        agent.command("dpuio").env("DPUIO_CONFIG_DIR", certs.join(t)).args(args).output().unwrap()
    };
    let (fa, fb) = (dir.path().join("a.bin"), dir.path().join("b.bin"));
    let (da, db) = (random_file(&fa, 2 << 20, 21), random_file(&fb, 1 << 20, 22));
    ok_stdout(&as_tenant("a", &["--transport", "shm", "put", fa.to_str().unwrap(), "/secret.bin"]));
    // B's namespace is its own container: A's file is not there, by name or listing.
    assert_eq!(ok_stdout(&as_tenant("b", &["ls", "/"])).trim(), "");
    let out = as_tenant("b", &["stat", "/secret.bin"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no such file"), "{out:?}");
    ok_stdout(&as_tenant("b", &["--transport", "shm", "put", fb.to_str().unwrap(), "/secret.bin"]));
    let back = dir.path().join("back.bin");
    ok_stdout(&as_tenant("a", &["--transport", "shm", "get", "/secret.bin", back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == da, "tenant a reads its own bytes, not b's");
    // And DAOS holds each tenant's bytes in that tenant's container only.
    let (oa, ob) = (dir.path().join("oa.bin"), dir.path().join("ob.bin"));
    daos_copy_out(&d, &ca, "/secret.bin", &oa);
    daos_copy_out(&d, &cb, "/secret.bin", &ob);
    assert!(std::fs::read(&oa).unwrap() == da && std::fs::read(&ob).unwrap() == db);
}

#[test]
fn acknowledged_writes_survive_sigkill_of_the_agent() {
    let Some(d) = daos("acknowledged_writes_survive_sigkill") else { return };
    let dir = tempfile::tempdir().unwrap();
    let container = label("kill");
    let config = config(dir.path(), &d, &container, true, "");
    let local = dir.path().join("in.bin");
    let data = random_file(&local, 16 << 20, 31);
    let mut agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    ok_stdout(&agent.cli(&["--transport", "shm", "put", local.to_str().unwrap(), "/kept.bin"]));
    ok_stdout(&agent.cli(&["mkdir", "/kept-dir"]));
    agent.signal("KILL");
    agent.wait(std::time::Duration::from_secs(10));
    drop(agent);
    // Nothing was synced or unmounted: what put acknowledged is in DAOS all the same.
    let outside = dir.path().join("outside.bin");
    daos_copy_out(&d, &container, "/kept.bin", &outside);
    assert!(std::fs::read(&outside).unwrap() == data);
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let back = dir.path().join("back.bin");
    ok_stdout(&agent.cli(&["--transport", "shm", "get", "/kept.bin", back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == data);
    assert!(ok_stdout(&agent.cli(&["stat", "/kept-dir"])).contains("dir"));
}

/// SIGTERM after I/O drains, closes every DAOS handle (the I/O threads' event queues
/// included) and finalises DAOS before the agent exits 0: the last thing it logs.
#[test]
fn sigterm_finalises_daos_after_the_event_queues_are_gone() {
    let Some(d) = daos("sigterm_finalises_daos") else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &d, &label("fini"), true, "");
    let (home, client_dir, log) = (dir.path().join("home"), dir.path().join("client"), dir.path().join("agent.log"));
    let mut command = dpuio_tests::command_in("dpu-agent", &home);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config", config.to_str().unwrap(), "--data-dir"])
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "info")
        .env("DPUIO_CONFIG_DIR", &client_dir)
        .stderr(std::fs::File::create(&log).unwrap());
    let mut agent =
        dpuio_harness::start(command, std::time::Duration::from_secs(60)).unwrap_or_else(|e| panic!("dpu-agent: {e}"));
    let addr = agent.addr().to_owned();
    let local = dir.path().join("in.bin");
    random_file(&local, 8 << 20, 5);
    let out = dpuio_tests::command_in("dpuio", &home)
        .args(["--agent", &addr, "--transport", "shm", "put", local.to_str().unwrap(), "/f.bin"])
        .env("DPUIO_CONFIG_DIR", &client_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "put: {}", String::from_utf8_lossy(&out.stderr));
    let _ = Command::new("kill").args(["-TERM", &agent.id().to_string()]).status();
    let status = agent.child_mut().wait().unwrap();
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "agent exit {status}: {log}");
    let (stopped, fini) = (log.find("stopped: sessions closed"), log.find("DAOS client finalised (daos_fini)"));
    assert!(stopped.is_some() && fini > stopped, "no daos_fini after the drain in the agent's log:\n{log}");
}

/// No loader tricks: the agent serves over DAOS with no LD_LIBRARY_PATH, and its
/// libfabric transports run on the libfabric the DAOS client brought (1.22, which
/// mercury needs), loaded once: the process maps one libfabric, DAOS's. A host on
/// Debian's libfabric 1.17 moves data with it over tcp (a protocol versioned on the
/// wire); libfabric shm, whose shared-memory protocol is private to a release, is
/// refused naming both versions instead of hanging both sides.
#[test]
fn the_data_plane_runs_on_the_daos_clients_libfabric_with_no_loader_path() {
    let Some(d) = daos("data_plane_on_daos_libfabric") else { return };
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &d, &label("ofi"), true, "");
    let mut command = dpuio_tests::command_in("dpu-agent", &dir.path().join("home"));
    command.env_remove("LD_LIBRARY_PATH").env_remove("LD_PRELOAD");
    let agent = AgentProcess::start_program(
        command,
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
        std::time::Duration::from_secs(60),
    );
    let local = dir.path().join("in.bin");
    let data = random_file(&local, 16 << 20, 31);
    let back = dir.path().join("back.bin");
    ok_stdout(&agent.cli(&["--transport", "ofi-tcp", "put", local.to_str().unwrap(), "/tcp.bin"]));
    ok_stdout(&agent.cli(&["--transport", "ofi-tcp", "get", "/tcp.bin", back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == data, "ofi-tcp: get differs from put");
    let out = agent.cli(&["--transport", "ofi-shm", "put", local.to_str().unwrap(), "/shm.bin"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("same libfabric on both sides")
            && stderr.contains("libfabric 1.22")
            && stderr.contains("libfabric 1.17"),
        "ofi-shm between libfabric 1.17 and 1.22: {out:?}"
    );
    let files = dpuio_tests::mapped_files(agent.process.id(), "/libfabric.so");
    assert!(
        files.len() == 1 && files[0].contains("/prereq/release/ofi/"),
        "the agent should map exactly one libfabric, the DAOS client's; it maps {files:?}"
    );
}

/// A libfabric older than DAOS needs, loaded before the DAOS client (here by
/// LD_PRELOAD), is named with its version and what to do, not left to mercury's
/// "version FABRIC_1.7 not found".
#[test]
fn an_older_libfabric_loaded_first_is_named_with_what_to_do() {
    let Some(d) = daos("older_libfabric_loaded_first") else { return };
    let system = ["/usr/lib/x86_64-linux-gnu/libfabric.so.1", "/usr/lib/aarch64-linux-gnu/libfabric.so.1"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("Debian's libfabric1 (./x installs libfabric-dev)");
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &d, &label("conflict"), true, "");
    let out = dpuio_tests::command_in("dpu-agent", &dir.path().join(".home"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&config)
        .env("LD_PRELOAD", system)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve started with an old libfabric preloaded: {stderr}");
    assert!(
        stderr.contains("libfabric 1.")
            && stderr.contains("already loaded")
            && stderr.contains(">= 1.20")
            && stderr.contains("LD_PRELOAD"),
        "{stderr}"
    );
}

/// `dpuio bench --backend daos` with DAOS's own host clients as peers: dfuse and
/// libpil4dfs read the container the agent serves (the files the shim wrote), every path
/// gives rows, each row is put against the fastest peer, and no mount is left behind.
#[test]
fn bench_puts_dpuio_against_dfuse_and_pil4dfs_on_the_same_container() {
    let Some(d) = daos("bench_peers") else { return };
    if !Path::new("/dev/fuse").exists() || Command::new("fusermount3").arg("-V").output().is_err() {
        dpuio_tests::daos::skip("bench_peers", "no /dev/fuse or no fusermount3 (apt-get install fuse3)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let container = label("peers");
    let config = config(dir.path(), &d, &container, true, "");
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let pid = agent.process.id().to_string();
    #[rustfmt::skip]
    let args = [
        "bench", "seq-read", "metadata", "--json", "--backend", "daos", "--daos-pool", &d.pool,
        "--daos-container", &container, "--daos-agent-socket-dir", d.socket_dir.to_str().unwrap(),
        "--paths", "libdfs,dfuse,pil4dfs,shim,preload,fuse", "--agent-pid", &pid,
        "--file-bytes", "16MiB", "--seconds", "0.2", "--rounds", "1", "--metadata-files", "20",
    ];
    let out = ok_stdout(&agent.cli(&args));
    let row = |workload: &str, path: &str| {
        out.lines()
            .find(|l| {
                l.contains(&format!("\"workload\":\"{workload}\"")) && l.contains(&format!("\"path\":\"{path}\""))
            })
            .unwrap_or_else(|| panic!("no {workload}/{path} row in:\n{out}"))
    };
    for path in ["libdfs", "dfuse", "pil4dfs", "shim-ucx-sm", "preload", "fuse"] {
        for workload in ["seq-read", "metadata-stat"] {
            let line = row(workload, path);
            assert!(!line.contains("\"iops\":0,") && !line.contains("\"best_peer\":null"), "{line}");
        }
    }
    // (dfuse and pil4dfs open the file the shim wrote, or the bench fails with their error.)
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains("dpuio-bench-dfuse-") && !mounts.contains("dpuio-bench-fuse-"), "left behind:\n{mounts}");
}
