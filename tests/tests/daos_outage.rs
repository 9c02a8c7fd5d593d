//! Every DAOS engine lost under a job, and back: a real `dpu-agent` on the pool of
//! `tests/daos-engines.sh` (`./x test`'s DAOS tier runs this after `daos_faults.rs`, on
//! the same three-engine system) with `[backend] retry_seconds = 5` and
//! `call_timeout_seconds = 10`, and a host job that reads a dataset and writes a new
//! checkpoint each step through the shim while its loader reads samples back to back.
//! Every engine is SIGKILLed:
//! - a read DAOS holds at the loss waits for DAOS on an I/O thread, never on the engine
//!   that answers the other calls (a CI run's stat waited 600 s, most likely behind one),
//!   also a read of a host the agent reaches with put/get (a second client over UCX's
//!   tcp reading a sample whole and 1 MiB of a file at a time: its staged I/O and open-reads ran on
//!   the engine before, and one such read held by DAOS held up every host's data plane);
//!   that client's calls that run while DAOS is gone end within the deadline and some slack
//!   (its I/O is in agent memory, staged: answered `UNAVAILABLE` at the deadline rather
//!   than when DAOS is back);
//! - calls are answered `UNAVAILABLE`, naming the DAOS call and what to check, within
//!   the deadline and some slack, and at once while DAOS stays silent;
//! - a second agent, SIGTERMed while DAOS is gone, exits within its drain bound
//!   (`call_timeout_seconds` + 5 s) with a non-zero status and a message saying so;
//! - a third agent, started while DAOS is gone, exits within twice `call_timeout_seconds`
//!   (`daos_init`, then the pool connect) and some slack, its error naming the DAOS call
//!   and what to check;
//! - the system is started again (`dmg system start`): the same agent process serves
//!   the job again, every dataset file and every checkpoint it acknowledged reads back
//!   the same, and no read ever returned a wrong byte.
//!
//! Prints the time to the first `UNAVAILABLE`, the time to serve again, the drain's exit
//! time and the agent's CPU while DAOS was gone.
//!
//! Needs `RUNDIR/env` of `tests/daos-engines.sh` (any number of engines); without it the
//! test says it is skipped and why (a failure under `DPUIO_REQUIRE_DAOS=1`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dpuio_tests::daos::{engines, label, script};
use dpuio_tests::{AgentProcess, seeded_bytes};

const FILES: usize = 3;
const FILE_BYTES: usize = 1 << 20;
const RETRY_SECONDS: u64 = 5;
const CALL_TIMEOUT_SECONDS: u64 = 10;
/// The agent's drain bound past the deadline (`DRAIN_MARGIN` in dpu-agent's server.rs).
const DRAIN_MARGIN: Duration = Duration::from_secs(5);
/// Room for a loaded 2-core machine on top of each bound.
const SLACK: Duration = Duration::from_secs(10);
/// A read DAOS holds at the loss keeps its I/O thread until DAOS answers: the job's,
/// the loader's and the tcp reader's may hold three; the test's own data-plane reads
/// need another.
const IO_THREADS: usize = 5;

fn dataset(i: usize) -> Vec<u8> {
    seeded_bytes(FILE_BYTES, 700 + i as u64)
}

fn checkpoint(step: u64) -> Vec<u8> {
    seeded_bytes(FILE_BYTES / 2, 19_000 + step)
}

/// One call of the job: when it began and ended, and how it went.
struct Call {
    started: Instant,
    ended: Instant,
    what: String,
    error: Option<String>,
    /// The agent said UNAVAILABLE.
    unavailable: bool,
}

/// What the job saw: its calls, the checkpoints the agent acknowledged, wrong bytes.
#[derive(Default)]
struct Seen {
    calls: Vec<Call>,
    acknowledged: Vec<u64>,
    wrong: Vec<String>,
}

/// The job: each step reads every dataset file (checking each byte) and writes a
/// checkpoint of its own (`/ckpt/stepN`), until `stop`; a failed call is noted, and the
/// job goes on after a short pause, as a training job that retries would.
fn job(client: dpuio_shim::Client, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let expected: Vec<Vec<u8>> = (0..FILES).map(dataset).collect();
    let mut step = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for (i, want) in expected.iter().enumerate() {
            read_checked(&client, &seen, &format!("/data/f{i}"), want, &format!("step {step}"));
        }
        let path = format!("/ckpt/step{step}");
        let started = Instant::now();
        let result = runtime.block_on(client.put_bytes(&path, &checkpoint(step))).map(|_| ());
        if result.is_ok() {
            seen.lock().unwrap().acknowledged.push(step);
        }
        note(&seen, format!("put {path}"), started, result);
        step += 1;
    }
}

/// Read `path` whole, note wrong bytes (as of `when`) and the call; see [`note`].
fn read_checked(client: &dpuio_shim::Client, seen: &Mutex<Seen>, path: &str, want: &[u8], when: &str) {
    let started = Instant::now();
    let result = client.read_file(path).map(|got| {
        if got != want {
            seen.lock().unwrap().wrong.push(format!("{when}: {path}: {} bytes that differ", got.len()));
        }
    });
    note(seen, format!("read {path} ({when})"), started, result);
}

/// Note a call of the job; after a failed one, pause as a training job that retries would.
fn note(seen: &Mutex<Seen>, what: String, started: Instant, result: Result<(), dpuio_shim::Error>) {
    let (error, unavailable) = match &result {
        Ok(()) => (None, false),
        Err(e) => (Some(e.to_string()), e.code() == Some(tonic::Code::Unavailable)),
    };
    let failed = error.is_some();
    seen.lock().unwrap().calls.push(Call { started, ended: Instant::now(), what, error, unavailable });
    if failed {
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Sample files a second thread of the job reads one after another, each in a single
/// open-read (under the shim's answer area), so that at the loss one is most likely in
/// DAOS's hands with its bytes still to come.
const SAMPLES: usize = 4;
const SAMPLE_BYTES: usize = 256 << 10;

fn sample(i: usize) -> Vec<u8> {
    seeded_bytes(SAMPLE_BYTES, 900 + i as u64)
}

/// The job's loader: reads the samples back to back (checking each byte) until `stop`.
/// A read DAOS holds at the loss waits for DAOS on an I/O thread; the engine, which
/// answers the other calls, must not be the one waiting.
fn loader(client: dpuio_shim::Client, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    let expected: Vec<Vec<u8>> = (0..SAMPLES).map(sample).collect();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let path = format!("/data/s{}", i % SAMPLES);
        read_checked(&client, &seen, &path, &expected[i % SAMPLES], &format!("sample read {i}"));
        i += 1;
    }
}

/// A host the agent reaches with put/get (UCX's tcp): reads `/data/f1` (each byte
/// checked) until `stop`: every third time a sample whole (one open-read, as a loader
/// reads it), else 1 MiB of `/data/f1` through a handle of its own, so that at the loss
/// one such read is most likely in DAOS's hands. Each is one DAOS step, so each is
/// bounded by one deadline (a file longer than an open-read's answer is read in four:
/// the open-read, an open, the rest, a close, each with its own deadline).
fn tcp_reader(client: dpuio_shim::Client, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let file = runtime.block_on(client.open("/data/f1", dpuio_shim::Access::ReadOnly)).expect("tcp: open /data/f1");
    let region = runtime
        .block_on(client.register_region(FILE_BYTES, dpuio_shim::RegionAccess::WriteByAgent))
        .expect("tcp: register a region");
    let want = dataset(1);
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if i.is_multiple_of(3) {
            let n = (i as usize / 3) % SAMPLES;
            read_checked(&client, &seen, &format!("/data/s{n}"), &sample(n), &format!("tcp read {i}"));
        } else {
            let started = Instant::now();
            let result = file.read_at(&region, 0).map(|n| {
                if n != want.len() as u64 || region.bytes(0, want.len()).to_vec() != want {
                    seen.lock().unwrap().wrong.push(format!("tcp read {i}: {n} bytes, not /data/f1's"));
                }
            });
            note(&seen, format!("tcp read {i} of /data/f1"), started, result);
        }
        i += 1;
    }
}

/// CPU seconds a process has used (user + system), from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks: f64 = fields.get(11..13).map_or(0.0, |t| t.iter().filter_map(|v| v.parse::<f64>().ok()).sum());
    // Clock ticks of USER_HZ, which Linux fixes at 100 on the platforms we run.
    ticks / 100.0
}

/// The config of an agent of this test, written to `dir/NAME.toml`.
fn agent_config(dir: &std::path::Path, name: &str, pool: &str, socket_dir: &str, container: &str) -> PathBuf {
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "[backend]\nkind = \"daos\"\npool = \"{pool}\"\nagent_socket_dir = \"{socket_dir}\"\n\
             retry_seconds = {RETRY_SECONDS}\ncall_timeout_seconds = {CALL_TIMEOUT_SECONDS}\n\n\
             [data_plane]\nio_threads = {IO_THREADS}\n\n\
             [metrics]\nlisten = \"127.0.0.1:0\"\n\n\
             [[tenants]]\nname = \"default\"\ncontainer = \"{container}\"\n"
        ),
    )
    .unwrap();
    config
}

/// `dpu-agent` with DAOS's RPC timeout shortened: how soon a call to a dead engine fails
/// inside libdaos (which then tries again, without end); shorter than its default 60 s
/// for the tier's time.
fn agent_program() -> Command {
    let mut program = Command::new(dpuio_tests::binary("dpu-agent"));
    program.env("CRT_TIMEOUT", "10");
    program
}

fn start_agent(dir: &std::path::Path, name: &str, pool: &str, socket_dir: &str, container: &str) -> AgentProcess {
    let config = agent_config(dir, name, pool, socket_dir, container);
    let mut program = agent_program();
    program.stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap());
    AgentProcess::start_program(
        program,
        &dir.join(format!("{name}-data")),
        &["--config", config.to_str().unwrap()],
        Duration::from_secs(60),
    )
}

#[test]
fn every_engine_lost_calls_fail_unavailable_and_the_same_agent_serves_again() {
    let test = "every_engine_lost_calls_fail_unavailable_and_the_same_agent_serves_again";
    let Some(d) = engines(test, 1) else { return };
    // Kept when the test fails: the agents' logs are what tells why.
    let dir = std::env::temp_dir().join(format!("dpuio-daos-outage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    eprintln!("agent logs in {} (removed if the test passes)", dir.display());
    let container = label("outage");
    let created = Command::new("daos")
        .args(["container", "create", &d.pool, &container, "--type=POSIX"])
        .output()
        .expect("run daos");
    assert!(created.status.success(), "daos container create: {}", String::from_utf8_lossy(&created.stderr));
    let socket_dir = d.socket_dir.to_str().unwrap();
    let agent = start_agent(&dir, "agent", &d.pool, socket_dir, &container);
    // A second agent on the same container, SIGTERMed while DAOS is gone.
    let mut stopping = start_agent(&dir, "stopping", &d.pool, socket_dir, &container);

    let runtime = tokio::runtime::Runtime::new().unwrap();
    // One ring at first for the test's three threads (the job, the loader, the checks): a
    // ring whose read DAOS holds stays held until DAOS answers (DAOS may still write the
    // memory it was lent), and with every ring so held the checks' stat must get a ring
    // registered for it, not wait for one given back (with a fixed two, a cold CI run's
    // stat waited 10 minutes, until killed).
    let rings = dpuio_shim::DataPlaneOptions { rings: 1, ..Default::default() };
    let connect = |a: &AgentProcess| {
        let options = dpuio_shim::ConnectOptions { data_plane: Some(rings.clone()), ..a.connect_options() };
        runtime.block_on(dpuio_shim::Client::connect(options)).unwrap()
    };
    let client = connect(&agent);
    let tcp = {
        let over_tcp = dpuio_shim::DataPlaneOptions { transports: "tcp".into(), ..rings.clone() };
        let options = dpuio_shim::ConnectOptions { data_plane: Some(over_tcp), ..agent.connect_options() };
        runtime.block_on(dpuio_shim::Client::connect(options)).unwrap()
    };
    runtime.block_on(async {
        client.mkdir("/data", true).await.unwrap();
        client.mkdir("/ckpt", true).await.unwrap();
        for i in 0..FILES {
            client.put_bytes(&format!("/data/f{i}"), &dataset(i)).await.unwrap();
        }
        for i in 0..SAMPLES {
            client.put_bytes(&format!("/data/s{i}"), &sample(i)).await.unwrap();
        }
    });
    let other = connect(&stopping);
    assert_eq!(other.read_file("/data/f0").unwrap(), dataset(0), "the second agent serves before the loss");

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let running = {
        let (client, stop, seen) = (client.clone(), stop.clone(), seen.clone());
        std::thread::spawn(move || job(client, stop, seen))
    };
    let loading = {
        let (client, stop, seen) = (client.clone(), stop.clone(), seen.clone());
        std::thread::spawn(move || loader(client, stop, seen))
    };
    let tcp_reading = {
        let (tcp, stop, seen) = (tcp.clone(), stop.clone(), seen.clone());
        std::thread::spawn(move || tcp_reader(tcp, stop, seen))
    };
    let since = Instant::now();
    let tcp_reads =
        |seen: &Seen| seen.calls.iter().filter(|c| c.what.contains("tcp read") && c.error.is_none()).count();
    while seen.lock().unwrap().acknowledged.len() < 2 || tcp_reads(&seen.lock().unwrap()) < 2 {
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "two steps and tcp reads before the loss: not within 120 s"
        );
        assert!(!running.is_finished(), "the job ended early");
        std::thread::sleep(Duration::from_millis(100));
    }

    // A file held open across the loss, to read through the data plane after it.
    let held = runtime.block_on(client.open("/data/f0", dpuio_shim::Access::ReadOnly)).expect("open /data/f0");
    let held_region = runtime
        .block_on(client.register_region(1 << 20, dpuio_shim::RegionAccess::WriteByAgent))
        .expect("register a region");
    let tcp_file = runtime.block_on(tcp.open("/data/f2", dpuio_shim::Access::ReadOnly)).expect("tcp: open /data/f2");
    let tcp_region = runtime
        .block_on(tcp.register_region(1 << 20, dpuio_shim::RegionAccess::WriteByAgent))
        .expect("tcp: register a region");

    let rundir = d.rundir.to_str().unwrap();
    let cpu_before = cpu_seconds(agent.process.id());
    script(&["kill-all", rundir]);
    let killed = Instant::now();

    // A call made now waits for DAOS until the deadline, then hears UNAVAILABLE naming
    // the DAOS call and what to check.
    let first = runtime.block_on(client.stat("/data/f1")).expect_err("a stat with every engine gone");
    let to_error = killed.elapsed();
    let message = first.to_string();
    eprintln!("first UNAVAILABLE {to_error:.1?} after the loss: {message}");
    assert_eq!(first.code(), Some(tonic::Code::Unavailable), "{message}");
    assert!(message.contains("no answer") && message.contains("dmg system query"), "{message}");
    let bound = Duration::from_secs(CALL_TIMEOUT_SECONDS) + SLACK;
    assert!(to_error < bound, "the first UNAVAILABLE came {to_error:.1?} after the loss, past {bound:?}");
    // While DAOS stays silent, calls are answered at once.
    let asked = Instant::now();
    let again = runtime.block_on(client.stat("/data/f2")).expect_err("a second stat with every engine gone");
    let to_second_error = asked.elapsed();
    eprintln!("the next {to_second_error:.2?} after it was asked: {again}");
    assert_eq!(again.code(), Some(tonic::Code::Unavailable), "{again}");
    assert!(to_second_error < Duration::from_secs(5), "the second UNAVAILABLE took {to_second_error:.1?}: {again}");
    // Through the ring too (an open-read), not only over gRPC.
    let ring = client.read_file("/data/f2").expect_err("a ring open-read with every engine gone");
    eprintln!("a ring open-read with every engine gone: {ring}");
    // A data-plane read on the file opened before: not sent to DAOS, and the host hears
    // UNAVAILABLE (storage gone, retry later), not a bare I/O error.
    let asked = Instant::now();
    let refused = held.read_at(&held_region, 0).expect_err("a data-plane read with every engine gone");
    eprintln!("a data-plane read with every engine gone, {:.2?} after it was asked: {refused}", asked.elapsed());
    assert_eq!(refused.code(), Some(tonic::Code::Unavailable), "{refused}");
    assert!(refused.to_string().contains("does not answer"), "{refused}");
    // The same over tcp, on a ring of its own beside the tcp reader's held one.
    let asked = Instant::now();
    let tcp_refused = tcp_file.read_at(&tcp_region, 0).expect_err("a data-plane read over tcp with every engine gone");
    let tcp_refused_after = asked.elapsed();
    eprintln!(
        "a data-plane read over tcp with every engine gone, {tcp_refused_after:.2?} after it was asked: {tcp_refused}"
    );
    assert_eq!(tcp_refused.code(), Some(tonic::Code::Unavailable), "{tcp_refused}");
    assert!(tcp_refused_after < Duration::from_secs(5), "the tcp read took {tcp_refused_after:.1?}: {tcp_refused}");

    // The second agent, with a call of its own waiting on DAOS, is told to stop.
    let waiting = {
        let other = other.clone();
        std::thread::spawn(move || other.read_file("/data/f1"))
    };
    std::thread::sleep(Duration::from_secs(1));
    stopping.signal("TERM");
    let signalled = Instant::now();
    let drain_bound = Duration::from_secs(CALL_TIMEOUT_SECONDS) + DRAIN_MARGIN + SLACK;
    let status = stopping.wait(drain_bound);
    let drained = signalled.elapsed();
    eprintln!("the second agent exited {status:?} {drained:.1?} after SIGTERM");
    let log = std::fs::read_to_string(dir.join("stopping.log")).unwrap_or_default();
    assert!(matches!(status, Some(code) if code != 0), "a drain on a dead DAOS exited with {status:?}:\n{log}");
    let said: Vec<&str> = log.lines().filter(|l| l.starts_with("dpu-agent:")).collect();
    assert!(!said.is_empty(), "the stopped agent said nothing on its way out:\n{log}");
    // Its call ends with the agent (the shim's keep-alive finds it gone); not waited for.
    drop(waiting);

    // An agent started now does not wait for DAOS without end: its `daos_init` and pool
    // connect have the same deadline each, and it exits saying what to check.
    let config = agent_config(&dir, "starting", &d.pool, socket_dir, &container);
    let mut starting = agent_program()
        .args(["serve", "--config", config.to_str().unwrap(), "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("starting-data"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("starting.log")).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let start_bound = Duration::from_secs(2 * CALL_TIMEOUT_SECONDS) + SLACK;
    let start_status = loop {
        if let Some(status) = starting.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > start_bound + SLACK {
            let _ = starting.kill();
            let _ = starting.wait();
            panic!("an agent started with every engine gone was still starting after {:.1?}", started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let gave_up = started.elapsed();
    let log = std::fs::read_to_string(dir.join("starting.log")).unwrap_or_default();
    eprintln!("an agent started with every engine gone exited {start_status} after {gave_up:.1?}");
    assert!(!start_status.success(), "it started without its pool:\n{log}");
    assert!(
        (log.contains("daos_init") || log.contains("daos_pool_connect"))
            && log.contains("call_timeout_seconds")
            && log.contains("dmg system query"),
        "its error names the call, the deadline and what to check:\n{log}"
    );
    assert!(gave_up < start_bound, "it gave up after {gave_up:.1?}, past {start_bound:?}");

    // DAOS back: the same agent process serves again.
    let down_for = killed.elapsed();
    let cpu_down = cpu_seconds(agent.process.id()) - cpu_before;
    let starting = Instant::now();
    script(&["start-all", rundir]);
    let back = Instant::now();
    let start_all = back - starting;
    let served = loop {
        match runtime.block_on(client.stat("/data/f0")) {
            Ok(_) => break back.elapsed(),
            Err(e) => {
                assert_eq!(e.code(), Some(tonic::Code::Unavailable), "while DAOS comes back: {e}");
                assert!(back.elapsed() < Duration::from_secs(180), "not served again 180 s after the restart: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    };
    let since = Instant::now();
    let clean_after = |seen: &Seen| {
        seen.calls
            .iter()
            .filter(|c| c.started > back + served && c.error.is_none() && c.what.starts_with("put"))
            .count()
    };
    while clean_after(&seen.lock().unwrap()) < 2 {
        assert!(since.elapsed() < Duration::from_secs(180), "the job did not do two clean steps after DAOS came back");
        assert!(!running.is_finished(), "the job ended early");
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    running.join().expect("the job panicked");
    loading.join().expect("the loader panicked");
    tcp_reading.join().expect("the tcp reader panicked");

    let seen = seen.lock().unwrap();
    assert!(seen.wrong.is_empty(), "reads returned wrong bytes: {:#?}", seen.wrong);
    let errors: Vec<&Call> = seen.calls.iter().filter(|c| c.error.is_some()).collect();
    let slowest = seen.calls.iter().filter(|c| c.started > killed).map(|c| c.ended - c.started).max();
    // A call in flight at the loss whose data-plane I/O DAOS held: over shared memory it
    // waits for DAOS (the memory is the host's) and ends once DAOS is back, not bounded,
    // shown; over tcp (staged in agent memory) it is answered at the deadline.
    let in_flight = || seen.calls.iter().filter(|c| c.started <= killed && c.ended > killed);
    let bound = Duration::from_secs(CALL_TIMEOUT_SECONDS) + SLACK;
    // Every tcp call that ran while DAOS was gone (in flight at the loss, or begun after
    // it and sent to DAOS before the first deadline passed) ends within the deadline.
    let mut slowest_tcp = Duration::ZERO;
    for c in seen.calls.iter().filter(|c| c.what.contains("tcp") && c.ended > killed) {
        let took = c.ended.duration_since(c.started.max(killed));
        slowest_tcp = slowest_tcp.max(took);
        assert!(took < bound, "{} ran {took:.1?} while DAOS was gone, past {bound:?}: {:?}", c.what, c.error);
    }
    eprintln!("the slowest tcp call while DAOS was gone: {slowest_tcp:.1?}");
    let spanning = in_flight().map(|c| {
        let outcome = if c.error.is_some() { "failed" } else { "succeeded" };
        format!("{} {outcome} after {:.1?}", c.what, c.ended - c.started)
    });
    let spanning: Vec<String> = spanning.collect();
    let kinds: Vec<String> = errors
        .iter()
        .map(|c| format!("{} after {:.1?}: {}", c.what, c.started.duration_since(killed), c.error.as_deref().unwrap()))
        .collect();
    eprintln!(
        "every engine lost (CRT_TIMEOUT=10 s, retry_seconds={RETRY_SECONDS}, call_timeout_seconds=\
         {CALL_TIMEOUT_SECONDS}): first UNAVAILABLE {to_error:.1?} after the loss, the next {to_second_error:.2?}; \
         second agent exited {status:?} {drained:.1?} after SIGTERM; DAOS down {down_for:.1?}, the agent's CPU meanwhile \
         {cpu_down:.1} s ({:.0}% of a core); served again {served:.1?} after `start-all` returned ({start_all:.1?}: every engine joined, the pool answering); job: {} calls, {} \
         failed ({} of them UNAVAILABLE), the slowest begun after the loss {slowest:.1?}; in flight at the loss: {spanning:?}",
        100.0 * cpu_down / down_for.as_secs_f64(),
        seen.calls.len(),
        errors.len(),
        errors.iter().filter(|c| c.unavailable).count(),
    );
    eprintln!("the job's failed calls: {kinds:#?}");
    eprintln!("what the second agent said on its way out: {said:#?}");

    // What the agent says happened.
    let metrics = dpuio_tests::scrape_metrics(agent.process.metrics_addr().expect("[metrics] listen is set"));
    let figures: Vec<&str> = metrics.lines().filter(|l| l.starts_with("dpuio_daos_")).collect();
    eprintln!("the agent's DAOS counters afterwards: {figures:?}");
    let unanswered = figures.iter().find_map(|l| l.strip_prefix("dpuio_daos_unanswered_calls_total "));
    assert!(unanswered.is_some_and(|n| n.trim() != "0"), "no unanswered DAOS call counted: {figures:?}");

    // Nothing acknowledged is lost: every dataset file and acknowledged checkpoint.
    for i in 0..FILES {
        assert!(client.read_file(&format!("/data/f{i}")).unwrap() == dataset(i), "/data/f{i} differs afterwards");
    }
    for i in 0..SAMPLES {
        assert!(client.read_file(&format!("/data/s{i}")).unwrap() == sample(i), "/data/s{i} differs afterwards");
    }
    for &step in &seen.acknowledged {
        let path = format!("/ckpt/step{step}");
        assert!(client.read_file(&path).unwrap() == checkpoint(step), "{path} (acknowledged) is not step {step}'s");
    }
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
}
