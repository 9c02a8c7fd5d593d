//! Engine faults under a job: a real `dpu-agent` on a DAOS pool over three engines
//! (`tests/daos-engines.sh up RUNDIR 3`, which `./x test`'s DAOS tier starts for this test
//! after its one-engine system is down), a container with redundancy factor 1 at the rank
//! level and the tenant's files replicated (`[[tenants]] object_class = "RP_2G1"`), and a host job that reads a dataset and writes
//! checkpoints through the shim while one engine is SIGKILLed, then started again and
//! reintegrated. The job must see no error and no wrong byte; the stall is printed.
//!
//! Needs `DAOS_RUNDIR`, `DAOS_POOL`, `DAOS_ENGINES` (3 or more), `DAOS_POOL_LEADER` and
//! `DAOS_AGENT_DRPC_DIR` from `RUNDIR/env`; without them the test says it is skipped and
//! why (a failure under `DPUIO_REQUIRE_DAOS=1`).

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dpuio_tests::daos::{engines, label, script};
use dpuio_tests::{AgentProcess, seeded_bytes};

const FILES: usize = 4;
const FILE_BYTES: usize = 4 << 20;
const CHECKPOINT_SLOTS: u64 = 3;

/// One step of the job: when it started, how long it took, what went wrong.
struct Step {
    started: Instant,
    took: Duration,
    error: Option<String>,
}

fn dataset(i: usize) -> Vec<u8> {
    seeded_bytes(FILE_BYTES, 500 + i as u64)
}

fn checkpoint(step: u64) -> Vec<u8> {
    seeded_bytes(FILE_BYTES, 9_000 + step)
}

/// The job: each step reads every dataset file (checking each byte) and writes one
/// checkpoint (a whole-file put into one of a few slots), until `stop`.
fn job(client: dpuio_shim::Client, stop: Arc<AtomicBool>, steps: Arc<Mutex<Vec<Step>>>) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let expected: Vec<Vec<u8>> = (0..FILES).map(dataset).collect();
    let mut step = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let mut error = None;
        for (i, want) in expected.iter().enumerate() {
            match client.read_file(&format!("/data/f{i}")) {
                Ok(got) if got == *want => {}
                Ok(got) => error = Some(format!("step {step}: /data/f{i} read back {} bytes that differ", got.len())),
                Err(e) => error = Some(format!("step {step}: read /data/f{i}: {e}")),
            }
        }
        let path = format!("/ckpt/slot{}", step % CHECKPOINT_SLOTS);
        if let Err(e) = runtime.block_on(client.put_bytes(&path, &checkpoint(step))) {
            error.get_or_insert(format!("step {step}: checkpoint {path}: {e}"));
        }
        steps.lock().unwrap().push(Step { started, took: started.elapsed(), error });
        step += 1;
    }
}

#[test]
fn a_job_rides_out_the_loss_and_return_of_an_engine() {
    let test = "a_job_rides_out_the_loss_and_return_of_an_engine";
    let Some(d) = engines(test, 3) else { return };
    let dir = tempfile::tempdir().unwrap();
    let container = label("faults");
    // The agent creates the container: redundancy factor 1 counted in ranks (every engine
    // here is on one node, one fault domain), and the tenant's files replicated: one
    // engine may go without losing a byte.
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[backend]\nkind = \"daos\"\npool = \"{}\"\nagent_socket_dir = \"{}\"\n\
             create_containers = true\nredundancy_factor = 1\nredundancy_level = \"rank\"\n\n\
             [metrics]\nlisten = \"127.0.0.1:0\"\n\n\
             [[tenants]]\nname = \"default\"\ncontainer = \"{container}\"\nobject_class = \"RP_2G1\"\n",
            d.pool,
            d.socket_dir.display()
        ),
    )
    .unwrap();
    // The DAOS client's RPC timeout, 60 s by default, is how long a call to the dead
    // engine waits before the client goes to a replica under the new pool map: most of
    // the job's stall. A DPU deployment may set it lower; so does this test (the tier's
    // time), and the stall it prints is with it. `DPUIO_FAULT_CRT_TIMEOUT=60` measures the default.
    let crt_timeout = std::env::var("DPUIO_FAULT_CRT_TIMEOUT").unwrap_or_else(|_| "20".into());
    let mut program = Command::new(dpuio_tests::binary("dpu-agent"));
    program.env("CRT_TIMEOUT", &crt_timeout);
    let agent = AgentProcess::start_program(
        program,
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
        Duration::from_secs(60),
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let options = dpuio_shim::ConnectOptions { data_plane: Some(Default::default()), ..agent.connect_options() };
    let client = runtime.block_on(dpuio_shim::Client::connect(options)).unwrap();
    runtime.block_on(async {
        client.mkdir("/data", true).await.unwrap();
        client.mkdir("/ckpt", true).await.unwrap();
        for i in 0..FILES {
            client.put_bytes(&format!("/data/f{i}"), &dataset(i)).await.unwrap();
        }
    });

    let stop = Arc::new(AtomicBool::new(false));
    let steps = Arc::new(Mutex::new(Vec::new()));
    let running = {
        let (client, stop, steps) = (client.clone(), stop.clone(), steps.clone());
        std::thread::spawn(move || job(client, stop, steps))
    };
    let steps_done = || steps.lock().unwrap().len();
    let wait_for = |what: &str, enough: &dyn Fn() -> bool, limit: Duration| {
        let since = Instant::now();
        while !enough() {
            assert!(!running.is_finished(), "the job ended early");
            assert!(since.elapsed() < limit, "{what}: not within {limit:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait_for("three steps before the fault", &|| steps_done() >= 3, Duration::from_secs(120));

    // Not the pool service's leader: a new leader's election is another wait, and with
    // three replicas the service keeps its majority either way.
    let victim = ((d.leader + 1) % d.engines).to_string();
    let rundir = d.rundir.to_str().unwrap();
    script(&["kill", rundir, &victim]);
    let killed = Instant::now();
    // Steps that began after the loss and finished: DAOS serves degraded (the dead
    // rank excluded, reads from the other replica, new files on the engines left).
    let after = |since: Instant| steps.lock().unwrap().iter().filter(|s| s.started > since).count();
    wait_for("two steps with the engine gone", &|| after(killed) >= 2, Duration::from_secs(420));
    let degraded = killed.elapsed();

    script(&["restart", rundir, &victim]);
    let back = Instant::now();
    wait_for("two steps after reintegration", &|| after(back) >= 2, Duration::from_secs(300));
    stop.store(true, Ordering::Relaxed);
    running.join().expect("the job panicked");

    let steps = steps.lock().unwrap();
    let errors: Vec<&str> = steps.iter().filter_map(|s| s.error.as_deref()).collect();
    let before: Vec<&Step> = steps.iter().filter(|s| s.started + s.took < killed).collect();
    let slowest = steps.iter().map(|s| s.took).max().unwrap_or_default();
    let typical = before.iter().map(|s| s.took).max().unwrap_or_default();
    eprintln!(
        "engine fault (CRT_TIMEOUT={crt_timeout} s): {} steps ({} before the kill, slowest of those {typical:.2?}); \
         slowest step {slowest:.2?}; two degraded steps done {degraded:.1?} after the kill; rank {victim} back and \
         rebuilt {:.1?} after it",
        steps.len(),
        before.len(),
        back.duration_since(killed)
    );
    assert!(errors.is_empty(), "the job saw errors: {errors:#?}");

    // Afterwards, with every engine back: the same bytes.
    for i in 0..FILES {
        assert!(client.read_file(&format!("/data/f{i}")).unwrap() == dataset(i), "/data/f{i} differs afterwards");
    }
    let last = steps.len() as u64;
    for step in last.saturating_sub(CHECKPOINT_SLOTS)..last {
        let path = format!("/ckpt/slot{}", step % CHECKPOINT_SLOTS);
        assert!(client.read_file(&path).unwrap() == checkpoint(step), "{path} is not step {step}'s checkpoint");
    }
    // The tenant's object class, as DAOS itself reports it for a file the agent made.
    // Tried a few times: right after the rebuild DAOS's own tool once aborted in libdaos
    // (`reserve_grp_by_rf` assertion in obj_class.c) before printing anything.
    let mut attr = String::new();
    for _ in 0..5 {
        let out = Command::new("daos")
            .args(["filesystem", "get-attr", &d.pool, &container, "--dfs-path=/ckpt/slot0"])
            .output()
            .expect("run daos");
        attr = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if out.status.success() {
            break;
        }
        std::thread::sleep(Duration::from_secs(3));
    }
    assert!(attr.contains("RP_2G1"), "a checkpoint's object class, says daos filesystem get-attr: {attr}");
    // The container's redundancy, as the agent created it, says daos container get-prop.
    // DAOS's own tool aborts while the pool has fewer targets in than fault domains (an
    // assertion in DAOS's reserve_grp_by_rf, `target_nr >= domain_cur`): what runs saw when
    // tests/daos-engines.sh killed one rank and restarted another (fixed: it finds the
    // engine by its rank now). Should a rank still be settling, it is asked again, every 5 s
    // for up to two minutes.
    let get_prop =
        || Command::new("daos").args(["container", "get-prop", &d.pool, &container]).output().expect("run daos");
    let asking = Instant::now();
    let mut props = get_prop();
    while !props.status.success() && asking.elapsed() < Duration::from_secs(120) {
        eprintln!("daos container get-prop failed ({}); asking again in 5 s", props.status);
        std::thread::sleep(Duration::from_secs(5));
        props = get_prop();
    }
    assert!(props.status.success(), "daos container get-prop: {}", String::from_utf8_lossy(&props.stderr));
    let props = format!("{}{}", String::from_utf8_lossy(&props.stdout), String::from_utf8_lossy(&props.stderr));
    let line = |key: &str| props.lines().find(|l| l.contains(key)).unwrap_or("").to_owned();
    // Lines such as "Redundancy Factor (0-4)  1" and "Redundancy Level (rank=1, node=2)  rank".
    assert!(line("Redundancy Factor").trim_end().ends_with(" 1"), "the container's redundancy factor: {props}");
    assert!(line("Redundancy Level").trim_end().ends_with(" rank"), "the container's redundancy level: {props}");

    // What the agent says happened: its DAOS retry counters.
    let metrics = dpuio_tests::scrape_metrics(agent.process.metrics_addr().expect("[metrics] listen is set"));
    let figures: Vec<&str> = metrics.lines().filter(|l| l.starts_with("dpuio_daos_")).collect();
    eprintln!("the agent's DAOS retry counters after the fault: {figures:?}");
    assert!(figures.iter().any(|l| l.starts_with("dpuio_daos_retried_calls")), "no DAOS retry counters in:\n{metrics}");
}
