//! The deployment in miniature: three machines as network namespaces ([`ThreeMachines`]),
//! "storage" running a DAOS system of its own on its veth address (not loopback),
//! "dpu" running the aarch64 `dpu-agent` under qemu-user with its aarch64 `daos_agent`
//! (the DAOS client cross-built for aarch64), "host" running the job. The host reaches
//! the agent on the DPU's host-facing veth (mutual TLS, UCX tcp or libfabric tcp), the
//! agent reaches DAOS on its storage-facing veth, and there is no route between host and
//! storage: every byte the host reads from DAOS passes through the agent.
//!
//! Needs root (namespaces, the DAOS server's tmpfs), DAOS's x86-64 server build
//! ([`dpuio_tests::daos_server`]), the aarch64 build and the aarch64 DAOS client
//! ([`dpuio_tests::arm64`]); skipped with the reason otherwise, a failure under
//! `DPUIO_REQUIRE_DAOS=1`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use dpuio_tests::arm64::{self, DaosAgent};
use dpuio_tests::daos::skip;
use dpuio_tests::daos_server::{self, DaosSystem, Engine, Options};
use dpuio_tests::netns::{Side, ThreeMachines};
use dpuio_tests::{AgentProcess, binary, hermetic, ok_stdout, seeded_bytes};

struct Setup {
    net: ThreeMachines,
    agent: PathBuf,
    prefix: PathBuf,
}

fn setup(test: &str) -> Option<Setup> {
    let ready = daos_server::server_prefix()
        .and_then(|_| arm64::program("dpu-agent"))
        .and_then(|agent| arm64::daos_prefix().map(|prefix| (agent, prefix)))
        .and_then(|(agent, prefix)| ThreeMachines::create().map(|net| Setup { net, agent, prefix }));
    match ready {
        Ok(setup) => Some(setup),
        Err(why) => {
            skip(test, &why);
            None
        }
    }
}

fn output(mut c: Command) -> Output {
    c.output().expect("run a command on the host machine")
}

#[test]
fn a_host_job_reads_from_daos_through_the_aarch64_agent_on_the_dpu() {
    let Some(s) = setup("three_machines") else { return };
    let net = &s.net;
    let dir = tempfile::tempdir().unwrap();

    // storage: DAOS on its veth address, one engine, one pool.
    let system = DaosSystem::start(Options {
        rundir: dir.path().join("storage"),
        netns: Some(net.storage.clone()),
        address: net.storage.ip.clone(),
        port: 10001,
        engines: vec![Engine { interface: net.storage.interface.clone(), port: 31416, scm_gib: 4 }],
        pool: "tank".into(),
        pool_size: "1GB".into(),
    });

    // dpu: the aarch64 daos_agent for that system, on the storage-facing veth.
    let dpu = dir.path().join("dpu");
    std::fs::create_dir_all(&dpu).unwrap();
    let socket_dir = dpu.join("daos-agent-run");
    let yml = system.agent_config(&socket_dir, &dpu.join("daos_agent.log"), Some(&net.dpu_storage.interface));
    let daos_agent = DaosAgent::start_in(&s.prefix, &dpu, &yml, &socket_dir, Some(&net.dpu_storage));

    // dpu: the aarch64 dpu-agent, DAOS backend, serving hosts on the host-facing veth.
    let config = dpu.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[backend]\nkind = \"daos\"\npool = \"{}\"\nagent_socket_dir = \"{}\"\ncreate_containers = true\n\n\
             [data_plane]\ninterface = \"{}\"\n\n[[tenants]]\nname = \"default\"\ncontainer = \"datasets\"\n",
            system.pool(),
            daos_agent.socket_dir.display(),
            net.dpu_host.interface
        ),
    )
    .unwrap();
    let log = dpu.join("agent.log");
    let mut command = net.dpu_host.command(arm64::QEMU);
    command.arg(&s.agent);
    hermetic(&mut command, &dpu.join("home"));
    let data = dpu.join("data");
    command
        .args(["serve", "--listen", &format!("{}:0", net.dpu_host.ip), "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(&data)
        .env("RUST_LOG", "info")
        .env("DPUIO_CONFIG_DIR", data.join("client"))
        .env("DPUIO_DAOS_PREFIX", &s.prefix)
        .env_remove("LD_LIBRARY_PATH")
        .stderr(std::fs::File::create(&log).unwrap());
    let process = dpuio_harness::start(command, Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("the aarch64 agent: {e}\n{}", std::fs::read_to_string(&log).unwrap_or_default()));
    let agent = AgentProcess::adopt(process, &data, None);
    assert!(agent.addr.starts_with(&format!("{}:", net.dpu_host.ip)) && !agent.plaintext, "{}", agent.addr);

    // host: put and get over UCX tcp and libfabric tcp, mutual TLS to the DPU's address.
    let data_bytes = seeded_bytes(32 << 20, 3);
    let local = dir.path().join("in.bin");
    std::fs::write(&local, &data_bytes).unwrap();
    for transport in ["ucx-tcp", "ofi-tcp"] {
        let path = format!("/{transport}.bin");
        let back = dir.path().join(format!("{transport}.back"));
        let cli = |args: &[&str]| {
            let mut c = net.host.client(&agent, binary("dpuio"));
            c.args(["--transport", transport]).args(args);
            ok_stdout(&output(c))
        };
        cli(&["put", local.to_str().unwrap(), &path]);
        cli(&["get", &path, back.to_str().unwrap()]);
        assert!(std::fs::read(&back).unwrap() == data_bytes, "{transport}: get differs from put");
    }

    // DAOS holds the file: read back on the storage machine with DAOS's own tool, through
    // a daos_agent there.
    let storage_agent_dir = dir.path().join("storage-agent");
    std::fs::create_dir_all(&storage_agent_dir).unwrap();
    let storage_socket = storage_agent_dir.join("run");
    let yml = system.agent_config(&storage_socket, &storage_agent_dir.join("daos_agent.log"), None);
    let storage_agent =
        dpuio_tests::daos_server::ClientAgent::start(&system, &storage_agent_dir, &yml, &storage_socket);
    let seen = dir.path().join("seen.bin");
    let out = storage_agent
        .daos()
        .args(["filesystem", "copy", "--src", "daos://tank/datasets/ucx-tcp.bin", "--dst"])
        .arg(&seen)
        .output()
        .unwrap();
    assert!(out.status.success(), "daos filesystem copy on storage: {}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read(&seen).unwrap() == data_bytes, "DAOS holds other bytes than the host put");
    drop(storage_agent);

    // host: a Python Dataset epoch (dpuio.data.MapDataset over numpy samples).
    python_epoch(&net.host, &agent, dir.path());

    agent.signal("TERM");
    let mut agent = agent;
    assert_eq!(agent.wait(Duration::from_secs(120)), Some(0), "{}", std::fs::read_to_string(&log).unwrap());
    drop(daos_agent);
    drop(system);
}

/// One epoch of a `MapDataset` of 64 numpy samples in batches of 8, from the host
/// machine, with the venv's Python and the dpuio package `./x test` built there.
fn python_epoch(host: &Side, agent: &AgentProcess, dir: &Path) {
    let python = dpuio_tests::python();
    let has_dpuio =
        Command::new(&python).args(["-c", "import dpuio, numpy"]).output().is_ok_and(|o| o.status.success());
    if !has_dpuio {
        skip(
            "three_machines: python epoch",
            &format!("{} cannot import dpuio and numpy (./x test builds them into .venv)", python.display()),
        );
        return;
    }
    let script = dir.join("epoch.py");
    std::fs::write(
        &script,
        r#"
import io, numpy as np, dpuio
from dpuio.data import MapDataset
client = dpuio.Client(transports="tcp")
client.mkdir("/train")
samples = {}
for i in range(64):
    a = np.arange(i, i + 4096, dtype=np.int32).reshape(64, 64)
    buf = io.BytesIO(); np.save(buf, a)
    client.write_bytes(f"/train/s{i:03}.npy", buf.getvalue())
    samples[f"/train/s{i:03}.npy"] = a
ds = MapDataset("/train", dpuio.npy, client=client)
assert len(ds) == 64, len(ds)
seen = 0
for start in range(0, len(ds), 8):
    batch = ds.__getitems__(list(range(start, start + 8)))
    for k, a in enumerate(batch):
        np.testing.assert_array_equal(a, samples[ds.objects[start + k][0]])
        seen += 1
print(f"epoch: {seen} samples")
"#,
    )
    .unwrap();
    let mut c = host.client(agent, &python);
    c.arg(&script);
    let out = output(c);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("epoch: 64 samples"),
        "python epoch on the host machine: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
