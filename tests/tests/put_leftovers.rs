//! The temporary files of whole-file puts that never finished are removed by the agent:
//! when the session that made one ends for good (its client detached, or was killed and
//! its session reaped), and after an agent restart when no resumed session claims it
//! within a lease; a session that rides out the restart keeps its put and finishes it.
//!
//! An unfinished put is made real: `dpuio put` from a FIFO that the test opens and never
//! writes, so the CLI has created its temporary file and waits for bytes; it is then
//! killed with SIGKILL. Both ways a Create reaches the agent are exercised: the CLI puts
//! over the data plane (a ring metadata entry), the in-process client has none (gRPC).
//! Runs on the local backend, or on DAOS with `DPUIO_TEST_BACKEND=daos` (the same calls,
//! through the backend trait).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use dpuio_shim::Client;
use dpuio_tests::{AgentProcess, StorageUnderTest, ok_stdout};

/// Short, so that what waits a lease waits 2 s.
const LEASE_MS: u64 = 2000;
/// For the client that must resume within a lease of the restarted agent serving: room
/// for a loaded machine.
const RESUME_LEASE_MS: u64 = 5000;

struct Setup {
    dir: tempfile::TempDir,
    /// Kept for the test's length: on DAOS, its containers go when it is dropped.
    _storage: StorageUnderTest,
    config: PathBuf,
    lease_ms: u64,
}

impl Setup {
    fn new(test: &str, lease_ms: u64) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let storage = StorageUnderTest::new(test, dir.path());
        let config = dir.path().join("agent.toml");
        let text = format!(
            "[agent]\nlease_ms = {lease_ms}\n[metrics]\nlisten = \"127.0.0.1:0\"\n{}[[tenants]]\nname = \"default\"\n\
             container = \"{}\"\n",
            storage.backend_config(),
            storage.container("leftovers")
        );
        std::fs::write(&config, text).unwrap();
        Setup { dir, _storage: storage, config, lease_ms }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// An agent on this setup's data directory and config (at `listen`, if given).
    fn start(&self, listen: Option<&str>) -> AgentProcess {
        let config = self.config.to_str().unwrap();
        let mut args = vec!["--config", config];
        if let Some(addr) = listen {
            args.extend(["--listen", addr]);
        }
        AgentProcess::start(&self.data_dir(), &args)
    }

    /// SIGKILL `agent`, and start its successor on the same address and data directory.
    fn restart(&self, mut agent: AgentProcess) -> AgentProcess {
        let addr = agent.addr.clone();
        agent.process.kill();
        drop(agent);
        self.start(Some(&addr))
    }
}

/// The names in the container directory `dir`, hidden ones included.
fn names(agent: &AgentProcess, dir: &str) -> Vec<String> {
    ok_stdout(&agent.cli(&["ls", dir])).lines().map(str::to_owned).collect()
}

/// The names in `dir` of temporary files of puts of `target`.
fn temps_of(agent: &AgentProcess, dir: &str, target: &str) -> Vec<String> {
    names(agent, dir).into_iter().filter(|n| dpuio_proto::put::is_temp_of(n, target)).collect()
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

/// `dpuio put FIFO remote` that has created its temporary file and waits for bytes that
/// never come: the CLI process, the FIFO's writing end (kept open), and the temp's name.
fn unfinished_put(agent: &AgentProcess, scratch: &Path, dir: &str, name: &str) -> (Child, std::fs::File, String) {
    let fifo = scratch.join(format!("{name}.fifo"));
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("run mkfifo");
    assert!(made.success(), "mkfifo {}", fifo.display());
    let child = agent
        .command("dpuio")
        .args(["put", fifo.to_str().unwrap(), &format!("{dir}/{name}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dpuio put");
    // Opening the writing end waits for the CLI to open the reading end.
    let writer = std::fs::OpenOptions::new().write(true).open(&fifo).expect("open the FIFO for writing");
    let mut temp = Vec::new();
    wait_until("the put's temporary file appears", Duration::from_secs(20), || {
        temp = temps_of(agent, dir, name);
        !temp.is_empty()
    });
    assert_eq!(temp.len(), 1, "{temp:?}");
    (child, writer, temp.remove(0))
}

/// The value of the sample `dpuio_put_temps_removed_total{reason=REASON,tenant=default}`.
fn removed(agent: &AgentProcess, reason: &str) -> u64 {
    let addr = agent.process.metrics_addr().expect("the agent serves metrics");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to /metrics");
    stream.write_all(b"GET /metrics HTTP/1.0\r\nAccept: text/plain\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.lines()
        .filter(|l| l.starts_with("dpuio_put_temps_removed_total{"))
        .filter(|l| l.contains("tenant=\"default\"") && l.contains(&format!("reason=\"{reason}\"")))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_put_killed_mid_way_leaves_no_temporary_file_once_its_session_is_reaped() {
    let setup = Setup::new("killed", LEASE_MS);
    let agent = setup.start(None);
    ok_stdout(&agent.cli(&["mkdir", "-p", "/d"]));
    let (mut child, writer, temp) = unfinished_put(&agent, setup.dir.path(), "/d", "model.pt");
    // While its session lives (a lease and more), the temporary file stays.
    std::thread::sleep(Duration::from_millis(setup.lease_ms + 1000));
    assert_eq!(temps_of(&agent, "/d", "model.pt"), std::slice::from_ref(&temp), "removed while its put still ran");
    let killed = Instant::now();
    child.kill().expect("SIGKILL dpuio put");
    child.wait().unwrap();
    drop(writer);
    wait_until("the killed put's temporary file goes", Duration::from_secs(15), || {
        temps_of(&agent, "/d", "model.pt").is_empty()
    });
    eprintln!("the temporary file {temp} went {:?} after its client was killed", killed.elapsed());
    assert!(!names(&agent, "/d").contains(&"model.pt".to_owned()), "the put never finished");
    assert_eq!(removed(&agent, "session_expired"), 1);
}

#[test]
fn after_a_restart_the_temporary_files_of_sessions_that_did_not_resume_go() {
    let setup = Setup::new("restart", LEASE_MS);
    let agent = setup.start(None);
    ok_stdout(&agent.cli(&["mkdir", "-p", "/d"]));
    let (mut child, writer, temp) = unfinished_put(&agent, setup.dir.path(), "/d", "ckpt");
    // The agent dies first, then its client: no session ended on the agent that noted it.
    let mut agent = agent;
    agent.process.kill();
    child.kill().expect("SIGKILL dpuio put");
    child.wait().unwrap();
    drop(writer);
    let agent = setup.restart(agent);
    let took = wait_until("the unclaimed temporary file goes after the restart", Duration::from_secs(15), || {
        temps_of(&agent, "/d", "ckpt").is_empty()
    });
    eprintln!("the temporary file {temp} went {took:?} after the agent was up again (lease {} ms)", setup.lease_ms);
    assert_eq!(removed(&agent, "not_resumed"), 1);
}

#[test]
fn a_session_that_resumes_after_a_restart_keeps_its_put_and_detaching_removes_the_rest() {
    let setup = Setup::new("resume", RESUME_LEASE_MS);
    let mut agent = setup.start(None);
    ok_stdout(&agent.cli(&["mkdir", "-p", "/d"]));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = runtime.block_on(Client::connect(agent.connect_options())).expect("attach");
    let first = client.session_id();
    let kept = runtime.block_on(client.put("/d/kept")).expect("start a put");
    agent = setup.restart(agent);
    wait_until("the client attaches again", Duration::from_secs(20), || {
        let _ = runtime.block_on(client.stat("/d"));
        client.session_id() != first
    });
    // Longer than a lease after the restart: the resumed session holds it.
    std::thread::sleep(Duration::from_millis(setup.lease_ms + 1500));
    let temp = kept.temp_path().rsplit('/').next().unwrap().to_owned();
    assert_eq!(temps_of(&agent, "/d", "kept"), [temp], "the resumed session's temporary file stays");
    runtime.block_on(kept.commit()).expect("the put finishes on the resumed session");
    assert!(names(&agent, "/d").contains(&"kept".to_owned()));
    assert_eq!(removed(&agent, "not_resumed"), 0);

    // A put left unfinished by a client that detaches: its temporary file goes with the session.
    let left = runtime.block_on(client.put("/d/left")).expect("start another put");
    assert_eq!(temps_of(&agent, "/d", "left").len(), 1);
    drop(left);
    runtime.block_on(client.detach()).expect("detach");
    assert!(temps_of(&agent, "/d", "left").is_empty(), "gone once Detach returned");
    assert_eq!(temps_of(&agent, "/d", "kept"), Vec::<String>::new());
    assert_eq!(removed(&agent, "session_closed"), 1);
}
