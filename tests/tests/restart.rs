//! Training jobs survive an agent restart: a client in a read/write/metadata loop
//! keeps running through `kill -9` of the agent and its restart on the same address
//! (and through `dpuctl drain`, SIGTERM and a restart), with no error and a bounded
//! stall; every write it was told had landed reads back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dpuio_shim::{Access, Client, ConnectOptions, DataPlaneOptions, RegionAccess, ResumeOptions};
use dpuio_tests::{AgentProcess, ok_stdout};

const CHUNK: u64 = 1 << 20;
const CHUNKS: u64 = 8;
/// The longest stall a restart may cause a reader.
const MAX_STALL: Duration = Duration::from_secs(5);

fn pattern(seed: u64, i: u64) -> u8 {
    (i.wrapping_mul(31).wrapping_add(seed.wrapping_mul(17)) % 251) as u8
}

/// What the loop saw.
#[derive(Debug, Default)]
struct Run {
    iterations: u64,
    longest: Duration,
    /// Chunks written and acknowledged, with the seed of their last write.
    written: Vec<Option<u64>>,
    sessions: Vec<u64>,
}

/// Read a chunk of `/input` and check it, write a chunk of `/output` (synced), stat
/// both: until `stop`, timing the longest iteration. Any error fails the test.
fn io_loop(client: &Client, runtime: &tokio::runtime::Runtime, stop: &AtomicBool) -> Run {
    let (input, output, mut region) = runtime.block_on(async {
        let input = client.open("/input", Access::ReadOnly).await.expect("open /input");
        let output = client.create("/output", false).await.expect("create /output");
        let region = client.register_region(CHUNK as usize, RegionAccess::ReadWrite).await.expect("a region");
        (input, output, region)
    });
    let mut run = Run { written: vec![None; CHUNKS as usize], ..Run::default() };
    let mut chunk = vec![0u8; CHUNK as usize];
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let i = run.iterations;
        let at = (i % CHUNKS) * CHUNK;
        let n = input.read_at(&region, at).unwrap_or_else(|e| panic!("iteration {i}: read: {e}"));
        assert_eq!(n, CHUNK, "iteration {i}: a short read");
        region.read_at(0, &mut chunk);
        assert!(
            chunk.iter().enumerate().all(|(k, b)| *b == pattern(0, at + k as u64)),
            "iteration {i}: /input reads back wrong at {at}"
        );
        let seed = i + 1;
        let data: Vec<u8> = (0..CHUNK).map(|k| pattern(seed, at + k)).collect();
        region.write_at(0, &data);
        let request = dpuio_shim::Request { sync: true, ..output.write_request(&region, 0, CHUNK, at) };
        let done = client.submit_blocking(&[request]).unwrap_or_else(|e| panic!("iteration {i}: write: {e}"));
        assert_eq!(done[0].result, Ok(CHUNK), "iteration {i}: write");
        run.written[(i % CHUNKS) as usize] = Some(seed);
        runtime.block_on(client.stat("/input")).unwrap_or_else(|e| panic!("iteration {i}: stat: {e}"));
        let session = client.session_id();
        if run.sessions.last() != Some(&session) {
            run.sessions.push(session);
        }
        run.longest = run.longest.max(started.elapsed());
        run.iterations += 1;
    }
    runtime.block_on(output.close()).expect("close /output");
    run
}

/// Run the loop against `agent` while `disrupt` stops it and brings up the agent that
/// replaces it (returned), then check what the loop saw and what it wrote.
fn survives(name: &str, disrupt: impl FnOnce(AgentProcess) -> AgentProcess) {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    let input: Vec<u8> = (0..CHUNK * CHUNKS).map(|i| pattern(0, i)).collect();
    agent.seed_file("/input", &input);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = runtime
        .block_on(Client::connect(ConnectOptions {
            client_name: format!("restart test ({name})"),
            data_plane: Some(DataPlaneOptions { transports: "ucx-shm".into(), rings: 2, ..Default::default() }),
            resume: ResumeOptions { max_wait: Duration::from_secs(30), probe_after: Duration::from_millis(200) },
            ..agent.connect_options()
        }))
        .expect("attach");
    let stop = Arc::new(AtomicBool::new(false));
    let (run, agent) = std::thread::scope(|s| {
        let looping = s.spawn(|| io_loop(&client, &runtime, &stop));
        std::thread::sleep(Duration::from_secs(1));
        let restarted_at = Instant::now();
        let agent = disrupt(agent);
        let restart = restarted_at.elapsed();
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        let run = looping.join().expect("the I/O loop");
        println!(
            "{name}: {} iterations, longest {:?} (agent down and back in {restart:?}), sessions {:x?}",
            run.iterations, run.longest, run.sessions
        );
        (run, agent)
    });
    assert!(run.sessions.len() >= 2, "{name}: the client never attached again: {run:?}");
    assert!(run.longest <= MAX_STALL, "{name}: stalled {:?} (at most {MAX_STALL:?})", run.longest);
    // Every acknowledged write reads back, through a client of the new agent.
    let fresh = runtime.block_on(Client::connect(agent.connect_options())).expect("attach to the new agent");
    let file = runtime.block_on(fresh.open("/output", Access::ReadOnly)).expect("open /output");
    assert_eq!(file.attr().size, CHUNK * CHUNKS, "{name}: /output's size");
    let back = std::fs::read(dir.path().join("containers/default/output")).expect("read /output");
    for (c, seed) in run.written.iter().enumerate() {
        let seed = seed.expect("every chunk written at least once");
        let at = c as u64 * CHUNK;
        let chunk = &back[at as usize..(at + CHUNK) as usize];
        assert!(
            chunk.iter().enumerate().all(|(k, b)| *b == pattern(seed, at + k as u64)),
            "{name}: chunk {c} does not hold its last acknowledged write (seed {seed})"
        );
    }
}

#[test]
fn a_read_write_loop_keeps_running_through_kill_9_and_a_restart() {
    survives("kill -9", |mut agent| {
        agent.signal("KILL");
        agent.wait(Duration::from_secs(10));
        agent.restart()
    });
}

#[test]
fn drain_then_restart_loses_no_request() {
    survives("drain", |mut agent| {
        ok_stdout(&agent.dpuctl(&["drain"]));
        std::thread::sleep(Duration::from_millis(300));
        agent.signal("TERM");
        assert_eq!(agent.wait(Duration::from_secs(30)), Some(0), "the drained agent exits cleanly");
        agent.restart()
    });
}

#[test]
fn with_resume_off_a_restart_ends_the_session_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start(dir.path(), &[]);
    agent.seed_file("/input", &[7u8; 4096]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let client = runtime
        .block_on(Client::connect(ConnectOptions {
            data_plane: Some(DataPlaneOptions { transports: "ucx-shm".into(), rings: 2, ..Default::default() }),
            resume: ResumeOptions { max_wait: Duration::ZERO, probe_after: Duration::from_millis(200) },
            ..agent.connect_options()
        }))
        .expect("attach");
    let first = client.session_id();
    agent.signal("KILL");
    agent.wait(Duration::from_secs(10));
    let agent = agent.restart();
    let e = runtime.block_on(client.stat("/input")).expect_err("a session the new agent does not know");
    assert!(e.to_string().contains("not attached"), "{e}");
    assert_eq!(client.session_id(), first, "no new session without resume");
    drop(agent);
}
