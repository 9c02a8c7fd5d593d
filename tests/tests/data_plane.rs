//! The data plane end to end, over real transports between separate processes, each
//! test over UCX and libfabric (shm and tcp each, see [`TRANSPORTS`]): payload and
//! completions reach a *stopped* host on the one-sided ones, hostile ring entries are
//! refused one by one while other sessions go on, data survives concurrent random I/O
//! byte for byte, and 256 MiB go through `dpuio put` and `get` unchanged.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use dpuio_shim::{Client, ConnectOptions, DataPlaneOptions};
use dpuio_tests::{AgentProcess, ok_stdout};

/// Every data plane the agent offers by default, as clients name them.
const TRANSPORTS: [&str; 4] = ["ucx-shm", "ucx-tcp", "ofi-shm", "ofi-tcp"];
/// Those where the agent moves payload into host memory without the host's CPU.
const ONE_SIDED: [&str; 2] = ["ucx-shm", "ofi-shm"];

/// `transports` without libfabric shm where this run's agents cannot offer it to this
/// host ([`dpuio_tests::daos::ofi_shm_refused`]), saying so.
fn usable(transports: &[&'static str]) -> Vec<&'static str> {
    let refused = dpuio_tests::daos::ofi_shm_refused();
    transports
        .iter()
        .copied()
        .filter(|t| match (&refused, *t) {
            (Some(why), "ofi-shm") => {
                eprintln!("ofi-shm skipped: {why}");
                false
            }
            _ => true,
        })
        .collect()
}

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(7).wrapping_add(3) % 251) as u8
}

fn write_pattern_file(agent: &AgentProcess, name: &str, bytes: u64) {
    let data: Vec<u8> = (0..bytes).map(pattern).collect();
    agent.seed_file(name, &data);
}

async fn data_client(agent: &AgentProcess, transports: &str) -> Client {
    Client::connect(ConnectOptions {
        agent: agent.url(),
        tls: agent.tls(),
        client_name: "e2e data".into(),
        data_plane: Some(DataPlaneOptions { transports: transports.into(), rings: 2, ..Default::default() }),
        ..ConnectOptions::default()
    })
    .await
    .expect("attach with a data plane")
}

#[test]
fn stopped_host_receives_payload_and_completion() {
    const BYTES: u64 = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    write_pattern_file(&agent, "big", BYTES);
    for transport in usable(&ONE_SIDED) {
        stopped_host_read(&agent, transport, BYTES);
    }
}

fn stopped_host_read(agent: &AgentProcess, transport: &str, bytes: u64) {
    const BYTES: u64 = 64 << 20;
    assert_eq!(bytes, BYTES);
    let mut host = agent
        .command("dpuio-test-host")
        .args(["stopped-read", &agent.addr, transport, "/big", &BYTES.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(host.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "submitted");
    let pid = host.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    // The agent has the host's memory mapped: it finishes while the host cannot run.
    std::thread::sleep(Duration::from_secs(2));
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    assert!(state.split_whitespace().nth(2) == Some("T"), "{transport}: host not stopped: {state}");
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    host.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(host.wait().unwrap().success());
    eprintln!("{transport}: stopped host reports: {}", line.trim());
    assert!(line.contains("present=true"), "{transport}: completion not in host memory on resume: {line}");
    assert!(line.contains(&format!("result=Some(Ok({BYTES}))")), "{transport}: {line}");
    assert!(line.contains("payload_ok=true"), "{transport}: {line}");
    let cpu_ns: u64 = line.rsplit("cpu_ns=").next().unwrap().trim().parse().unwrap();
    assert!(cpu_ns < 20_000_000, "{transport}: host CPU across the stop was {cpu_ns} ns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_entries_get_error_completions_and_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    write_pattern_file(&agent, "data", dpuio_tests::hostile::FILE_BYTES);
    for transport in usable(&TRANSPORTS) {
        hostile_entries(&agent, transport).await;
    }
}

async fn hostile_entries(agent: &AgentProcess, transport: &str) {
    let a = data_client(agent, transport).await;
    let b = data_client(agent, transport).await;
    // The cases are shared with `dpuio-test-host hostile` (tests/two_hosts.rs).
    for check in dpuio_tests::hostile::hostile_entries(&a, &b, "/data").await {
        assert!(check.passed, "{transport}: {check}");
    }
}

fn run_integrity(transport: &str, io_bytes: u64) {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    let hosts: Vec<_> = (0..2)
        .map(|i| {
            agent
                .command("dpuio-test-host")
                .args(["integrity", &agent.addr, transport, &format!("/f{i}"), &(48u64 << 20).to_string()])
                .arg(io_bytes.to_string())
                .arg((100 + i).to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for host in hosts {
        let out = host.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
        eprintln!("{transport}: {}", stdout.trim());
    }
}

#[test]
fn two_hosts_random_io_ucx_shm_half_a_gib_each() {
    run_integrity("ucx-shm", 512 << 20);
}

#[test]
fn two_hosts_random_io_ucx_tcp() {
    run_integrity("ucx-tcp", 64 << 20);
}

#[test]
fn two_hosts_random_io_ofi_shm() {
    if usable(&["ofi-shm"]).is_empty() {
        return;
    }
    run_integrity("ofi-shm", 128 << 20);
}

#[test]
fn two_hosts_random_io_ofi_tcp() {
    run_integrity("ofi-tcp", 64 << 20);
}

fn put_get_round_trip(transport: &str, bytes: usize) {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &[]);
    let local = dir.path().join("in.bin");
    let mut data = vec![0u8; bytes];
    use rand::{Rng, SeedableRng};
    rand::rngs::StdRng::seed_from_u64(5).fill(&mut data[..]);
    std::fs::write(&local, &data).unwrap();
    let back = dir.path().join("back.bin");
    ok_stdout(&agent.cli(&["--transport", transport, "put", local.to_str().unwrap(), "/copy.bin"]));
    ok_stdout(&agent.cli(&["--transport", transport, "get", "/copy.bin", back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == data, "{transport}: get differs from put");
    assert!(ok_stdout(&agent.cli(&["stat", "/copy.bin"])).contains(&bytes.to_string()));
}

#[test]
fn put_then_get_256_mib_ucx_shm() {
    put_get_round_trip("ucx-shm", 256 << 20);
}

#[test]
fn put_then_get_256_mib_ucx_tcp() {
    put_get_round_trip("ucx-tcp", 256 << 20);
}

#[test]
fn put_then_get_256_mib_ofi_shm() {
    if usable(&["ofi-shm"]).is_empty() {
        return;
    }
    put_get_round_trip("ofi-shm", 256 << 20);
}

#[test]
fn put_then_get_256_mib_ofi_tcp() {
    put_get_round_trip("ofi-tcp", 256 << 20);
}

#[test]
fn a_provider_the_agent_does_not_run_is_refused_clearly_and_auto_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, "[data_plane]\nproviders = [\"ofi\"]\ntransports = \"tcp\"\n").unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let local = dir.path().join("in.bin");
    std::fs::write(&local, b"over whatever both sides share").unwrap();
    for (asked, named) in [("ucx-shm", "\"ucx\""), ("ofi-shm", "\"ofi\" (shm)")] {
        let out = agent.cli(&["--transport", asked, "put", local.to_str().unwrap(), "/x"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{asked} attached to an agent that runs only ofi tcp");
        assert!(
            stderr.contains(&format!("{named} is not offered by this agent; it offers ofi (tcp;ofi_rxm)")),
            "{asked}: {stderr}"
        );
    }
    ok_stdout(&agent.cli(&["--transport", "auto", "put", local.to_str().unwrap(), "/x"]));
    let back = dir.path().join("back.bin");
    ok_stdout(&agent.cli(&["--transport", "auto", "get", "/x", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(back).unwrap(), b"over whatever both sides share");
    let out = agent.cli(&["--transport", "ofi-carrier-pigeon", "put", local.to_str().unwrap(), "/y"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("transport \"ofi-carrier-pigeon\": expected one of ucx-shm, ucx-tcp, ofi-shm, ofi-tcp, auto"),
        "{stderr}"
    );
}
