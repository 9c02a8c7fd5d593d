//! SIGKILL of the agent at random points during whole-file puts, then a restart on the
//! same data directory: no acknowledged put is lost and nothing reads back silently
//! wrong.
//!
//! Each round starts the agent (a plain tenant in even rounds, an encrypted one in odd
//! rounds, each on its own data directory kept across rounds), runs `dpuio put` in a
//! loop (over one existing file, alternating with new files), and kills the agent with
//! SIGKILL during the first or second put over the existing file, a random fraction (0
//! to 1.2) of a put's time into it: while the CLI starts, writes, commits, or just after. A put is acknowledged when `dpuio put`
//! exited 0. After a restart, the file put over is byte for byte the last acknowledged
//! version or the one in flight, never anything else (no truncation, no hole, no mix;
//! on the encrypted tenant, no read error either); every acknowledged new file reads
//! back whole; a new file in flight is absent or whole. Temporary files the kills left
//! are counted and removed with `dpuio rm`.
//!
//! `DPUIO_CRASH_ROUNDS` (default 12) sets the number of kills, `DPUIO_CRASH_PUT_MIB`
//! (default 32) the size of the file put over, `DPUIO_CRASH_SEED` the random seed (else
//! one is drawn and printed). The full matrix is `DPUIO_CRASH_ROUNDS=100`.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use dpuio_tests::programs::{encrypted_config, write_key};
use dpuio_tests::{AgentProcess, StorageUnderTest, ok_stdout};
use rand::{Rng, SeedableRng};

const TARGET: &str = "/crash/target";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The contents of version `generation` of a file of `bytes` bytes: each 8-byte word
/// holds the generation and its own offset, so a read that mixes versions, misses a
/// piece or finds zeros names what it found.
fn version(generation: u64, bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes);
    let mut at = 0u64;
    while out.len() < bytes {
        out.extend_from_slice(&((generation << 40) | at).to_le_bytes());
        at += 8;
    }
    out.truncate(bytes);
    out
}

/// Which version `data` is, if it is exactly one of `candidates`.
fn which(data: &[u8], candidates: &[(u64, &[u8])]) -> Option<u64> {
    candidates.iter().find(|(_, c)| *c == data).map(|(g, _)| *g)
}

/// What `data` looks like, for a failure message: its size and the first word that
/// is not version `expected`.
fn describe(data: &[u8], expected: &[u8]) -> String {
    let first_diff = data.iter().zip(expected).position(|(a, b)| a != b);
    let word = |at: usize| data.get(at / 8 * 8..at / 8 * 8 + 8).map(|w| u64::from_le_bytes(w.try_into().unwrap()));
    format!(
        "{} bytes (expected {}), first difference at {first_diff:?}, word there {:?}",
        data.len(),
        expected.len(),
        first_diff.and_then(word).map(|w| format!("generation {} offset {}", w >> 40, w & ((1 << 40) - 1)))
    )
}

/// One agent configuration: its data directory and config, kept across rounds.
struct Tenant {
    name: &'static str,
    data_dir: PathBuf,
    args: Vec<String>,
}

impl Tenant {
    fn new(root: &Path, storage: &StorageUnderTest, encrypted: bool) -> Tenant {
        let name = if encrypted { "encrypted" } else { "plain" };
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let config = if encrypted {
            let key = dir.join("tenant.key");
            write_key(&key, 0o600);
            encrypted_config(&dir, &key, storage)
        } else {
            let config = dir.join("agent.toml");
            let text = format!(
                "{}[[tenants]]\nname = \"default\"\ncontainer = \"{}\"\n",
                storage.backend_config(),
                storage.container("plain")
            );
            std::fs::write(&config, text).unwrap();
            config
        };
        Tenant { name, data_dir: dir.join("data"), args: vec!["--config".into(), config.display().to_string()] }
    }

    fn start(&self) -> AgentProcess {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        AgentProcess::start(&self.data_dir, &args)
    }
}

fn put(agent: &AgentProcess, local: &Path, remote: &str) -> Child {
    agent
        .command("dpuio")
        // The agent comes back only after the round's puts: a put caught by the kill
        // waits for it 1 s, not the 60 s default (the loop would give up at 20 s).
        .env("DPUIO_RESUME_S", "1")
        .args(["--transport", "shm", "put"])
        .arg(local)
        .arg(remote)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dpuio put")
}

fn get(agent: &AgentProcess, remote: &str, local: &Path) -> Result<Vec<u8>, String> {
    let out = agent.cli(&["--transport", "shm", "get", remote, local.to_str().unwrap()]);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(std::fs::read(local).unwrap())
}

/// What one round's put loop did.
#[derive(Default)]
struct Log {
    /// Versions of TARGET acknowledged, in order.
    target_acked: Vec<u64>,
    /// The version of TARGET whose put was running when the agent died, if any.
    target_in_flight: Option<u64>,
    /// New files acknowledged: path and generation.
    new_acked: Vec<(String, u64)>,
    new_in_flight: Option<(String, u64)>,
}

#[test]
fn killed_during_puts_the_old_or_the_new_version_survives_and_acknowledged_puts_stay() {
    let rounds = env_u64("DPUIO_CRASH_ROUNDS", 12);
    let target_bytes = (env_u64("DPUIO_CRASH_PUT_MIB", 32) << 20) as usize;
    let seed = std::env::var("DPUIO_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("crash: {rounds} rounds, {target_bytes} bytes per put over the target, seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let dir = tempfile::tempdir().unwrap();
    let storage = StorageUnderTest::new("crash", dir.path());
    let tenants = [Tenant::new(dir.path(), &storage, false), Tenant::new(dir.path(), &storage, true)];
    let local = dir.path().join("local");
    std::fs::create_dir_all(&local).unwrap();

    // Acknowledged state per tenant, carried from round to round: the version of
    // TARGET last acknowledged, and every acknowledged new file.
    let mut acked_target = [0u64; 2];
    let mut acked_new: [Vec<(String, u64)>; 2] = [Vec::new(), Vec::new()];
    let mut put_time = [Duration::ZERO; 2];
    for (t, tenant) in tenants.iter().enumerate() {
        let agent = tenant.start();
        ok_stdout(&agent.cli(&["mkdir", "-p", "/crash"]));
        let v = 1_000 * (t as u64 + 1);
        let file = local.join(format!("{}-{v}", tenant.name));
        std::fs::write(&file, version(v, target_bytes)).unwrap();
        let started = Instant::now();
        let out = put(&agent, &file, TARGET).wait_with_output().unwrap();
        assert!(out.status.success(), "first put: {}", String::from_utf8_lossy(&out.stderr));
        put_time[t] = started.elapsed();
        acked_target[t] = v;
        eprintln!("{}: a put of {target_bytes} bytes takes {:?}", tenant.name, put_time[t]);
    }

    let (mut old_seen, mut new_seen, mut temps_left, mut total_acked) = (0, 0, 0, 0);
    for round in 0..rounds {
        let t = (round % 2) as usize;
        let tenant = &tenants[t];
        let mut agent = tenant.start();
        // The kill comes during the `victim`-th put over the target of this round (so
        // some rounds have acknowledged puts before it), a random fraction of a put's
        // time into it: while the CLI starts, writes, commits, or just after.
        let victim = rng.random_range(0..2u32);
        let kill_after = put_time[t].mul_f64(rng.random_range(0.0..1.2));
        let mut killer_start: Option<Instant> = None;
        let mut target_puts = 0u32;
        let mut log = Log::default();
        let mut generation = acked_target[t] + 1;
        let mut killed = false;
        // Puts one after the other, alternating the file put over and a new file,
        // until the agent is killed.
        while !killed {
            let (remote, bytes, over) = if generation % 2 == 0 {
                (TARGET.to_owned(), target_bytes, true)
            } else {
                (format!("/crash/new-{round}-{generation}"), 256 << 10, false)
            };
            let file = local.join(format!("{}-{generation}", tenant.name));
            std::fs::write(&file, version(generation, bytes)).unwrap();
            let mut child = put(&agent, &file, &remote);
            if over {
                log.target_in_flight = Some(generation);
                if target_puts == victim {
                    killer_start = Some(Instant::now());
                }
                target_puts += 1;
            } else {
                log.new_in_flight = Some((remote.clone(), generation));
            }
            let status = loop {
                if !killed && killer_start.is_some_and(|k| k.elapsed() >= kill_after) {
                    agent.process.child_mut().kill().unwrap(); // SIGKILL
                    agent.wait(Duration::from_secs(10));
                    killed = true;
                }
                if let Some(status) = child.try_wait().unwrap() {
                    break Some(status);
                }
                if killed && killer_start.is_some_and(|k| k.elapsed() > kill_after + Duration::from_secs(20)) {
                    // A put still waiting on a dead agent long after: not acknowledged.
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                std::thread::sleep(Duration::from_millis(2));
            };
            let _ = std::fs::remove_file(&file);
            if status.is_some_and(|s| s.success()) {
                if over {
                    log.target_acked.push(generation);
                    log.target_in_flight = None;
                } else {
                    log.new_acked.push((remote, generation));
                    log.new_in_flight = None;
                }
            } else {
                // Failed before the kill (a bug) or because of it.
                assert!(killed, "round {round}: a put failed while the agent ran");
            }
            generation += 1;
        }
        drop(agent);

        // Restart on the same data directory and check.
        let agent = tenant.start();
        if let Some(&last) = log.target_acked.last() {
            acked_target[t] = last;
        }
        total_acked += log.target_acked.len() + log.new_acked.len();
        acked_new[t].extend(log.new_acked.iter().cloned());
        let back = local.join("back");
        let data = get(&agent, TARGET, &back)
            .unwrap_or_else(|e| panic!("round {round} ({}): {TARGET} does not read back: {e}", tenant.name));
        let old = version(acked_target[t], target_bytes);
        let in_flight = log.target_in_flight.map(|g| (g, version(g, target_bytes)));
        let mut candidates: Vec<(u64, &[u8])> = vec![(acked_target[t], &old)];
        if let Some((g, v)) = &in_flight {
            candidates.push((*g, v));
        }
        match which(&data, &candidates) {
            Some(g) if g == acked_target[t] => old_seen += 1,
            Some(g) => {
                new_seen += 1;
                acked_target[t] = g; // it is there now, and the next puts go over it
            }
            None => panic!(
                "round {round} ({}): {TARGET} is neither version {} nor the one in flight {:?}: {}",
                tenant.name,
                acked_target[t],
                log.target_in_flight,
                describe(&data, &old)
            ),
        }
        for (path, g) in &acked_new[t] {
            let data = get(&agent, path, &back)
                .unwrap_or_else(|e| panic!("round {round}: acknowledged {path} does not read back: {e}"));
            let want = version(*g, 256 << 10);
            assert!(data == want, "round {round}: acknowledged {path}: {}", describe(&data, &want));
        }
        if let Some((path, g)) = &log.new_in_flight {
            match get(&agent, path, &back) {
                Ok(data) => assert!(data == version(*g, 256 << 10), "round {round}: {path} in flight is partial"),
                Err(e) => assert!(e.contains("NOT_FOUND"), "round {round}: {path} in flight: {e}"),
            }
        }
        // Temporary files the kill left: nothing reads them; they go with `dpuio rm`.
        let listing = ok_stdout(&agent.cli(&["ls", "/crash"]));
        for name in listing.lines().filter(|n| n.contains(".dpuio-put.")) {
            temps_left += 1;
            ok_stdout(&agent.cli(&["rm", &format!("/crash/{name}")]));
        }
        for name in listing.lines().filter(|n| !n.contains(".dpuio-put.")) {
            assert!(name == "target" || name.starts_with("new-"), "round {round}: unexpected entry {name}");
        }
        eprintln!(
            "round {round} ({}): killed {kill_after:?} into put {victim} over the target; acknowledged {} over, {} \
             new; target is version {}",
            tenant.name,
            log.target_acked.len(),
            log.new_acked.len(),
            acked_target[t]
        );
    }
    eprintln!(
        "crash: {rounds} kills; the target read back as the old version {old_seen} times, as the new one \
         {new_seen} times, never otherwise; {total_acked} acknowledged puts all read back; {temps_left} temporary \
         files left by kills (removed)"
    );
    assert_eq!(old_seen + new_seen, rounds as usize);
    assert!(total_acked > 0, "no put was acknowledged in any round: the kills came too early to test anything");
}
