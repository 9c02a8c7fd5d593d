//! The sentence dpuio exists for: the aarch64 agent runs the DAOS client. The aarch64
//! `dpu-agent` under `qemu-aarch64-static`, with `[backend] kind = "daos"`, loads the
//! aarch64 DAOS client built from the same sources as the servers (the prebuilt tree of
//! `../shared/daos`, `$DPUIO_ARM64_DAOS_PREFIX`) and talks to an aarch64 `daos_agent`, also
//! under qemu, of the running DAOS system (x86-64 servers); the native x86-64 host moves
//! data with it and DAOS's own x86-64 `daos` tool reads what it wrote.
//!
//! No loader tricks: no `LD_LIBRARY_PATH`, the DAOS libraries found through
//! `DPUIO_DAOS_PREFIX` and their `$ORIGIN` run paths, libfabric the DAOS client's own.
//! Skipped with the reason without the aarch64 build, qemu or the aarch64 DAOS client; a
//! failure instead under `DPUIO_REQUIRE_DAOS=1` (the DAOS tier).

use std::path::{Path, PathBuf};
use std::time::Duration;

use dpuio_shim::{Client, ConnectOptions, DataPlaneOptions, EntryKind};
use dpuio_tests::arm64::{self, DaosAgent};
use dpuio_tests::daos::{self as daos_system, Daos};
use dpuio_tests::{AgentProcess, mapped_files, ok_stdout, seeded_bytes};

/// Everything the test needs, or why it is skipped.
struct Setup {
    daos: Daos,
    agent: PathBuf,
    prefix: PathBuf,
}

fn setup(test: &str) -> Option<Setup> {
    let daos = daos_system::system(test)?;
    match (arm64::program("dpu-agent"), arm64::daos_prefix()) {
        (Ok(agent), Ok(prefix)) => Some(Setup { daos, agent, prefix }),
        (Err(why), _) | (_, Err(why)) => {
            daos_system::skip(test, &why);
            None
        }
    }
}

/// Start the emulated agent on `config`, its log (info) in `log`.
fn start_agent(s: &Setup, dir: &Path, config: &Path, log: &Path) -> AgentProcess {
    let data = dir.join("data");
    let mut command = arm64::emulated(&s.agent);
    dpuio_tests::hermetic(&mut command, &dir.join("home"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .arg("--data-dir")
        .arg(&data)
        .env("RUST_LOG", "info")
        .env("DPUIO_CONFIG_DIR", data.join("client"))
        .env("DPUIO_DAOS_PREFIX", &s.prefix)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .stderr(std::fs::File::create(log).unwrap());
    // qemu runs the agent several times slower, and daos_init under it takes seconds.
    let process = dpuio_harness::start(command, Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("the aarch64 agent: {e}\n{}", std::fs::read_to_string(log).unwrap_or_default()));
    AgentProcess::adopt(process, &data, None)
}

/// One emulated agent with two tenants in two containers of the pool, one of them
/// encrypted: 64 MiB both ways over UCX tcp and shm, DAOS's own tool reading the file,
/// only ciphertext in the encrypted tenant's container, metadata on the ring answering as
/// gRPC does, and SIGTERM draining and finalising DAOS.
#[test]
fn the_aarch64_agent_serves_a_host_from_daos() {
    let Some(s) = setup("the_aarch64_agent_serves_a_host_from_daos") else { return };
    let dir = tempfile::tempdir().unwrap();
    let dpu = dir.path();
    // The DPU's own daos_agent: aarch64, under qemu, for the same system.
    let config = daos_system::agent_config(&dpu.join("daos-agent-run"), &dpu.join("daos_agent.log"))
        .unwrap_or_else(|e| panic!("{e}"));
    let daos_agent = DaosAgent::start(&s.prefix, dpu, &config, &dpu.join("daos-agent-run"));

    let (plain, sealed) = (daos_system::label("arm64"), daos_system::label("arm64-sealed"));
    let key = dpu.join("vault.key");
    std::fs::write(&key, seeded_bytes(32, 7)).unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let config = dpu.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[backend]\nkind = \"daos\"\npool = \"{}\"\nagent_socket_dir = \"{}\"\ncreate_containers = true\n\n\
             [[tenants]]\nname = \"default\"\ncontainer = \"{plain}\"\n\n\
             [[tenants]]\nname = \"vault\"\ncontainer = \"{sealed}\"\n[tenants.encryption]\nkey_file = \"{}\"\n",
            s.daos.pool,
            daos_agent.socket_dir.display(),
            key.display()
        ),
    )
    .unwrap();
    let log = dpu.join("agent.log");
    let mut agent = start_agent(&s, dpu, &config, &log);

    // 64 MiB each way over UCX tcp and shm, and DAOS's own x86 tool reads the same bytes.
    let data = seeded_bytes(64 << 20, 11);
    let local = dpu.join("in.bin");
    std::fs::write(&local, &data).unwrap();
    for transport in ["tcp", "shm"] {
        let (path, back) = (format!("/{transport}.bin"), dpu.join(format!("{transport}.back")));
        ok_stdout(&agent.cli(&["--transport", transport, "put", local.to_str().unwrap(), &path]));
        ok_stdout(&agent.cli(&["--transport", transport, "get", &path, back.to_str().unwrap()]));
        assert!(std::fs::read(&back).unwrap() == data, "{transport}: 64 MiB got back from the aarch64 agent differ");
        let seen = dpu.join(format!("{transport}.daos"));
        daos_system::copy_out(&s.daos, &plain, &path, &seen);
        assert!(std::fs::read(&seen).unwrap() == data, "DAOS holds other bytes than the aarch64 agent was given");
    }

    // The encrypted tenant: its data round-trips, and DAOS holds only ciphertext.
    let certs = dpu.join("vault-certs");
    ok_stdout(&agent.dpuctl(&["cert", "issue", "--tenant", "vault", "--out", certs.to_str().unwrap()]));
    let vault = |args: &[&str]| agent.command("dpuio").env("DPUIO_CONFIG_DIR", &certs).args(args).output().unwrap();
    let secret = seeded_bytes(3 << 20, 12);
    std::fs::write(dpu.join("secret.bin"), &secret).unwrap();
    ok_stdout(&vault(&["--transport", "shm", "put", dpu.join("secret.bin").to_str().unwrap(), "/secret.bin"]));
    ok_stdout(&vault(&["--transport", "shm", "get", "/secret.bin", dpu.join("secret.back").to_str().unwrap()]));
    assert!(std::fs::read(dpu.join("secret.back")).unwrap() == secret, "the encrypted tenant's round trip");
    daos_system::copy_out(&s.daos, &sealed, "/secret.bin", &dpu.join("secret.daos"));
    let stored = std::fs::read(dpu.join("secret.daos")).unwrap();
    assert!(stored.len() > secret.len(), "stored {} bytes for {} of plaintext", stored.len(), secret.len());
    assert!(!stored.windows(4096).any(|w| w == &secret[..4096]), "plaintext found in DAOS");

    // Metadata on the ring (UCX shm): the same answers as over gRPC.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let options = |transport: Option<&str>| ConnectOptions {
            client_name: "aarch64 metadata".into(),
            data_plane: transport.map(|t| DataPlaneOptions {
                transports: t.into(),
                rings: 1,
                ..DataPlaneOptions::default()
            }),
            ..agent.connect_options()
        };
        let grpc = Client::connect(options(None)).await.unwrap();
        let ring = Client::connect(options(Some("ucx-shm"))).await.unwrap();
        assert_eq!(ring.stat("/tcp.bin").await.unwrap(), grpc.stat("/tcp.bin").await.unwrap());
        assert_eq!(ring.stat("/").await.unwrap().kind, EntryKind::Directory);
        let missing = |r: dpuio_shim::Result<dpuio_shim::Attr>| r.expect_err("no such file").to_string();
        assert_eq!(missing(ring.stat("/nope").await), missing(grpc.stat("/nope").await));
        assert!(ring.read_file("/shm.bin").unwrap() == data, "open-read on the ring");
    });
    drop(runtime);

    let files = mapped_files(agent.process.id(), "/libfabric.so");
    assert!(
        files.len() == 1 && files[0].starts_with(s.prefix.to_str().unwrap()),
        "the aarch64 agent should map one libfabric, its DAOS client's; it maps {files:?}"
    );

    // SIGTERM: the agent drains, closes every DAOS handle and finalises DAOS, exit 0.
    agent.signal("TERM");
    let code = agent.wait(Duration::from_secs(120));
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, Some(0), "the aarch64 agent's exit: {log}");
    let (stopped, fini) = (log.find("stopped: sessions closed"), log.find("DAOS client finalised (daos_fini)"));
    assert!(stopped.is_some() && fini > stopped, "no daos_fini after the drain in the aarch64 agent's log:\n{log}");
}
