//! The data plane end to end, over real transports between separate processes, each
//! test over UCX and libfabric (shm and tcp each, see [`TRANSPORTS`]): payload and
//! completions reach a *stopped* host on the one-sided ones, hostile ring entries are
//! refused one by one while other sessions go on, data survives concurrent random I/O
//! byte for byte, and 256 MiB go through `dpuio put` and `get` unchanged.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use dpuio_shim::{Access, Client, ConnectOptions, DataPlaneOptions, IoStatus, Opcode, RegionAccess, Request};
use dpuio_tests::{AgentProcess, ok_stdout};

/// Every data plane the agent offers by default, as clients name them.
const TRANSPORTS: [&str; 4] = ["ucx-shm", "ucx-tcp", "ofi-shm", "ofi-tcp"];
/// Those where the agent moves payload into host memory without the host's CPU.
const ONE_SIDED: [&str; 2] = ["ucx-shm", "ofi-shm"];

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
    for transport in ONE_SIDED {
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
    write_pattern_file(&agent, "data", 1 << 20);
    for transport in TRANSPORTS {
        hostile_entries(&agent, transport).await;
    }
}

async fn hostile_entries(agent: &AgentProcess, transport: &str) {
    let a = data_client(agent, transport).await;
    let b = data_client(agent, transport).await;

    let ro = a.open("/data", Access::ReadOnly).await.unwrap();
    let region = a.register_region(64 << 10, RegionAccess::ReadWrite).await.unwrap();
    let read_only_region = a.register_region(4096, RegionAccess::ReadByAgent).await.unwrap();
    // B owns more regions than A, so B has region ids that A does not.
    let mut b_regions = Vec::new();
    for _ in 0..4 {
        b_regions.push(b.register_region(4096, RegionAccess::ReadWrite).await.unwrap());
    }
    let b_file = b.open("/data", Access::ReadOnly).await.unwrap();
    let foreign_region = b_regions.last().unwrap().id();

    let good = ro.read_request(&region, 0, 4096, 0);
    let cases: Vec<(&str, Request, IoStatus)> = vec![
        (
            "region offset past the end",
            Request { region_offset: (64 << 10) - 10, length: 100, ..good },
            IoStatus::OutOfRange,
        ),
        ("longer than the region", Request { length: (64 << 10) + 1, ..good }, IoStatus::OutOfRange),
        ("offset overflow", Request { region_offset: u64::MAX - 1, length: 4, ..good }, IoStatus::OutOfRange),
        ("region of another session", Request { region_id: foreign_region, ..good }, IoStatus::BadRegion),
        ("handle of another session", Request { handle: b_file.handle(), ..good }, IoStatus::BadHandle),
        ("guessed handle", Request { handle: 0x1234_5678, ..good }, IoStatus::BadHandle),
        ("write through a read-only handle", Request { opcode: Opcode::Write, ..good }, IoStatus::Access),
        (
            "read into a region the agent may not write",
            Request { region_id: read_only_region.id(), ..good },
            IoStatus::Access,
        ),
        ("zero length", Request { length: 0, ..good }, IoStatus::Malformed),
        ("over max_io_bytes", Request { length: 1 << 40, ..good }, IoStatus::TooLarge),
    ];
    let a2 = a.clone();
    let (results, garbage) = tokio::task::spawn_blocking(move || {
        let mut batch = a2.batch().unwrap();
        for (i, (_, r, _)) in cases.iter().enumerate() {
            batch.push(&Request { user_data: i as u64, ..*r }).unwrap();
        }
        batch.submit().unwrap();
        let done = batch.wait(cases.len(), Duration::from_secs(30)).unwrap();
        // Random bytes as ring entries.
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..100 {
            let mut e = [0u8; 64];
            rng.fill(&mut e[..]);
            batch.push_raw_entry(&e).unwrap();
        }
        batch.submit().unwrap();
        let garbage = batch.wait(100, Duration::from_secs(30)).unwrap();
        (done.into_iter().zip(cases).collect::<Vec<_>>(), garbage)
    })
    .await
    .unwrap();
    for (done, (name, _, want)) in results {
        assert_eq!(done.result, Err(want), "{transport}: {name}");
    }
    assert_eq!(garbage.len(), 100);
    assert!(garbage.iter().all(|d| d.result == Err(IoStatus::Malformed)), "{garbage:?}");

    // Both sessions still work, with the right bytes.
    for client in [&a, &b] {
        let file = client.open("/data", Access::ReadOnly).await.unwrap();
        let buf = client.register_region(8192, RegionAccess::WriteByAgent).await.unwrap();
        let c = client.clone();
        let req = file.read_request(&buf, 0, 8192, 1000);
        let done = tokio::task::spawn_blocking(move || c.submit_blocking(&[req])).await.unwrap().unwrap();
        assert_eq!(done[0].result, Ok(8192));
        assert!(buf.memory().as_slice().iter().enumerate().all(|(i, &x)| x == pattern(1000 + i as u64)));
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
