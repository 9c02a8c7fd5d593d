//! `dpuio bench soak`: a mixed workload of several tenants on one agent for a given time,
//! watching what the agent holds.
//!
//! The benchmark starts its own agent (`--agent-bin`, as `qos` does) with three tenants:
//! two plain ones and one with inline encryption (a random key in the scratch
//! directory), plaintext on loopback, with its metrics on a free port. Each tenant runs
//! one client in a loop of rounds: sequential writes and reads of a 4 MiB file, checked;
//! metadata (mkdir, 32 small files created, stat, listed, removed); a checkpoint (an
//! 8 MiB whole-file put over the last one, read back and checked); the client detaches
//! and attaches again every 16 rounds so sessions come and go too. Every `--sample-s`
//! seconds it samples the agent from /proc (RSS, open fds) and its metrics (regions,
//! sessions, open handles, the sum of `dpuio_errors_total`), and prints one line; the
//! last line is a summary: RSS growth from the first sample after warm-up (a tenth of
//! the run, at least one sample) to the last, and the errors counted by the clients
//! (any failed call or a read that differs from what was written) and by the agent.
//!
//! What it deliberately does not do: measure throughput (the other workloads do), or
//! judge the figures: the summary shows them, `docs/benchmarks.md` records them.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dpuio_shim::cli::ConnectArgs;
use dpuio_shim::{Client, ConnectOptions, DataPlaneOptions, RegionAccess};
use rand::{Rng, SeedableRng};

use crate::args::SoakArgs;

const TENANTS: [(&str, bool); 3] = [("soak-a", false), ("soak-b", false), ("soak-enc", true)];
const DATA_FILE_BYTES: usize = 4 << 20;
const CHECKPOINT_BYTES: usize = 8 << 20;
const SMALL_FILES: usize = 32;
const ROUNDS_PER_SESSION: u64 = 16;
const AGENT_STARTUP: Duration = Duration::from_secs(30);

fn err(reason: impl std::fmt::Display) -> dpuio_shim::Error {
    dpuio_shim::Error::DataPlane { op: "bench soak".into(), reason: reason.to_string() }
}

/// The agent of this run, with its tenants' config, in a scratch directory that goes
/// with it.
fn start_agent(bin: &Path, scratch: &Path) -> dpuio_shim::Result<dpuio_harness::Agent> {
    use std::os::unix::fs::PermissionsExt;
    let key = scratch.join("soak-enc.key");
    let bytes: [u8; 32] = rand::random();
    std::fs::write(&key, bytes)
        .and_then(|()| std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)))
        .map_err(err)?;
    let mut config = String::from("[tls]\nmode = \"off\"\n\n[metrics]\nlisten = \"127.0.0.1:0\"\n\n");
    for (name, encrypted) in TENANTS {
        config.push_str(&format!("[[tenants]]\nname = \"{name}\"\ncontainer = \"{name}\"\n"));
        if encrypted {
            config.push_str(&format!("[tenants.encryption]\nkey_file = \"{}\"\nblock_bytes = 65536\n", key.display()));
        }
        config.push('\n');
    }
    dpuio_harness::start_with_config(Command::new(bin), &config, AGENT_STARTUP).map_err(err)
}

async fn connect(options: &ConnectArgs, agent: &str, tenant: &str) -> dpuio_shim::Result<Client> {
    Client::connect(ConnectOptions {
        agent: agent.to_owned(),
        tenant: tenant.to_owned(),
        client_name: format!("dpuio bench soak ({tenant})"),
        data_plane: Some(DataPlaneOptions {
            transports: "shm".into(),
            rings: 1,
            interface: options.interface.clone(),
            ..Default::default()
        }),
        ..ConnectOptions::default()
    })
    .await
}

/// What the clients counted.
#[derive(Default)]
struct Counts {
    rounds: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
}

/// One round of the tenant's mix; the first failure ends it with its reason.
async fn round(c: &Client, dir: &str, k: u64, rng: &mut rand::rngs::StdRng, counts: &Counts) -> dpuio_shim::Result<()> {
    // Writes, then reads checked against them.
    let mut data = vec![0u8; DATA_FILE_BYTES];
    rng.fill(&mut data[..]);
    let path = format!("{dir}/data");
    let file = c.create(&path, false).await?;
    let mut region = c.register_region(1 << 20, RegionAccess::ReadWrite).await?;
    let mut outcome = Ok(());
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        region.write_at(0, piece);
        if let Err(e) = file.write_at(&region, piece.len() as u64, (i << 20) as u64) {
            outcome = Err(e);
            break;
        }
    }
    if outcome.is_ok() {
        for (i, piece) in data.chunks(1 << 20).enumerate() {
            match file.read_at(&region, (i << 20) as u64) {
                Ok(n) if n as usize == piece.len() && region.bytes(0, piece.len()).to_vec() == piece => {}
                Ok(n) => {
                    outcome = Err(err(format!("{path}: block {i} read back {n} bytes that differ from those written")));
                    break;
                }
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
    }
    let freed = c.deregister_region(region).await;
    let closed = file.close().await;
    outcome.and(freed).and(closed)?;
    counts.bytes.fetch_add(2 * DATA_FILE_BYTES as u64, Ordering::Relaxed);

    // Metadata.
    let meta = format!("{dir}/meta-{k}");
    c.mkdir(&meta, false).await?;
    for i in 0..SMALL_FILES {
        c.create(&format!("{meta}/f{i}"), true).await?.close().await?;
    }
    for i in 0..SMALL_FILES {
        c.stat(&format!("{meta}/f{i}")).await?;
    }
    let listed = c.readdir(&meta).await?.len();
    if listed != SMALL_FILES {
        return Err(err(format!("{meta}: listed {listed} entries, made {SMALL_FILES}")));
    }
    c.remove(&meta, true).await?;

    // A checkpoint: a whole-file put over the last one, read back.
    let mut checkpoint = vec![0u8; CHECKPOINT_BYTES];
    rng.fill(&mut checkpoint[..]);
    let path = format!("{dir}/checkpoint");
    c.put_bytes(&path, &checkpoint).await?;
    let back = c.read_file(&path)?;
    if back != checkpoint {
        return Err(err(format!(
            "{path}: read back {} bytes that differ from the {} put",
            back.len(),
            checkpoint.len()
        )));
    }
    counts.bytes.fetch_add(2 * CHECKPOINT_BYTES as u64, Ordering::Relaxed);
    Ok(())
}

/// One tenant's loop until `stop`: a session for every ROUNDS_PER_SESSION rounds.
async fn tenant_loop(
    options: ConnectArgs,
    agent: String,
    tenant: &'static str,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(tenant.len() as u64 * 7919);
    let dir = "/soak";
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let client = match connect(&options, &agent, tenant).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("soak: {tenant}: attach: {e}");
                counts.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(e) = client.mkdir(dir, true).await {
            eprintln!("soak: {tenant}: mkdir {dir}: {e}");
            counts.errors.fetch_add(1, Ordering::Relaxed);
        }
        for _ in 0..ROUNDS_PER_SESSION {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            k += 1;
            match round(&client, dir, k, &mut rng, &counts).await {
                Ok(()) => {
                    counts.rounds.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    eprintln!("soak: {tenant}: round {k}: {e}");
                    counts.errors.fetch_add(1, Ordering::Relaxed);
                    let _ = client.remove(&format!("{dir}/meta-{k}"), true).await;
                }
            }
        }
        if let Err(e) = client.detach().await {
            eprintln!("soak: {tenant}: detach: {e}");
            counts.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One look at the agent.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    at_s: f64,
    rss_kib: u64,
    fds: u64,
    regions: f64,
    sessions: f64,
    handles: f64,
    agent_errors: f64,
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// `GET /metrics` from the agent's metrics listener.
fn scrape(addr: &str) -> std::io::Result<String> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text)
}

/// The sum of every series of metric `name` (all its labels).
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b) // from +0.0: an empty sum prints as 0, not -0
}

fn sample(pid: u32, metrics: &str, started: Instant) -> dpuio_shim::Result<Sample> {
    let text = scrape(metrics).map_err(|e| err(format!("scrape http://{metrics}/metrics: {e}")))?;
    Ok(Sample {
        at_s: started.elapsed().as_secs_f64(),
        rss_kib: rss_kib(pid).ok_or_else(|| err(format!("no VmRSS in /proc/{pid}/status: is the agent gone?")))?,
        fds: open_fds(pid).ok_or_else(|| err(format!("cannot list /proc/{pid}/fd")))?,
        regions: metric_sum(&text, "dpuio_regions"),
        sessions: metric_sum(&text, "dpuio_sessions"),
        handles: metric_sum(&text, "dpuio_open_handles"),
        agent_errors: metric_sum(&text, "dpuio_errors_total"),
    })
}

pub async fn run(options: &ConnectArgs, args: &SoakArgs, agent_bin: Option<&PathBuf>) -> dpuio_shim::Result<()> {
    let bin = agent_bin.ok_or_else(|| {
        err("soak starts an agent of its own with three tenants (one encrypted): pass --agent-bin PATH/dpu-agent")
    })?;
    if !(args.minutes > 0.0 && args.sample_s > 0.0) {
        return Err(err("--minutes and --sample-s must be positive"));
    }
    let scratch = tempfile_dir()?;
    let agent = start_agent(bin, &scratch)?;
    let metrics = agent.metrics_addr().ok_or_else(|| err("the agent reported no metrics address"))?.to_owned();
    let (pid, url) = (agent.id(), agent.url());
    println!(
        "soak: agent pid {pid} at {url}, metrics {metrics}; tenants {}; {} min, a sample every {} s",
        TENANTS
            .iter()
            .map(|(n, e)| if *e { format!("{n} (encrypted)") } else { (*n).to_owned() })
            .collect::<Vec<_>>()
            .join(", "),
        args.minutes,
        args.sample_s
    );
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let started = Instant::now();
    // A thread and runtime per tenant: its ring calls block that thread only, while
    // the runtime's worker renews the session's lease.
    let mut tasks = Vec::new();
    for (name, _) in TENANTS {
        let (options, url, stop, counts) = (options.clone(), url.clone(), stop.clone(), counts.clone());
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().map_err(err)?;
        tasks.push(std::thread::spawn(move || runtime.block_on(tenant_loop(options, url, name, stop, counts))));
    }
    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    let period = Duration::from_secs_f64(args.sample_s);
    let mut samples: Vec<Sample> = Vec::new();
    let mut failure = None;
    println!(
        "{:>8} {:>9} {:>5} {:>7} {:>8} {:>7} {:>7} {:>8} {:>13}",
        "t_s", "rss_MiB", "fds", "regions", "sessions", "handles", "rounds", "errors", "agent_errors"
    );
    loop {
        tokio::time::sleep(period.min(duration.saturating_sub(started.elapsed()))).await;
        match sample(pid, &metrics, started) {
            Ok(s) => {
                println!(
                    "{:>8.0} {:>9.1} {:>5} {:>7} {:>8} {:>7} {:>7} {:>8} {:>13}",
                    s.at_s,
                    s.rss_kib as f64 / 1024.0,
                    s.fds,
                    s.regions,
                    s.sessions,
                    s.handles,
                    counts.rounds.load(Ordering::Relaxed),
                    counts.errors.load(Ordering::Relaxed),
                    s.agent_errors
                );
                samples.push(s);
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
        if started.elapsed() >= duration {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.join();
    }
    drop(agent);
    let _ = std::fs::remove_dir_all(&scratch);
    if let Some(e) = failure {
        return Err(e);
    }
    let warm = samples
        .iter()
        .find(|s| s.at_s >= duration.as_secs_f64() / 10.0)
        .or(samples.first())
        .copied()
        .unwrap_or_default();
    let last = samples.last().copied().unwrap_or_default();
    let growth = (last.rss_kib as f64 - warm.rss_kib as f64) / (warm.rss_kib.max(1) as f64) * 100.0;
    let max = |f: fn(&Sample) -> f64| samples.iter().map(f).fold(0.0, f64::max);
    println!(
        "soak summary: {:.1} min, {} rounds, {:.1} GiB moved; RSS {:.1} MiB at {:.0} s -> {:.1} MiB at {:.0} s ({growth:+.2}%); \
         fds {} -> {} (max {}); regions max {} (last {}); errors: clients {}, agent {}",
        started.elapsed().as_secs_f64() / 60.0,
        counts.rounds.load(Ordering::Relaxed),
        counts.bytes.load(Ordering::Relaxed) as f64 / (1u64 << 30) as f64,
        warm.rss_kib as f64 / 1024.0,
        warm.at_s,
        last.rss_kib as f64 / 1024.0,
        last.at_s,
        warm.fds,
        last.fds,
        max(|s| s.fds as f64),
        max(|s| s.regions),
        last.regions,
        counts.errors.load(Ordering::Relaxed),
        last.agent_errors
    );
    Ok(())
}

/// A scratch directory for the key file (the agent's own scratch directory is made by
/// the harness).
fn tempfile_dir() -> dpuio_shim::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("dpuio-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| err(format!("create {}: {e}", dir.display())))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_add_every_label_set_of_one_name_only() {
        let text = "# HELP dpuio_regions x\ndpuio_regions{tenant=\"a\"} 3\ndpuio_regions{tenant=\"b\"} 4\n\
                    dpuio_regions_total 100\ndpuio_errors_total{tenant=\"a\",op=\"read\",status=\"io\"} 2\n";
        assert_eq!(metric_sum(text, "dpuio_regions"), 7.0);
        assert_eq!(metric_sum(text, "dpuio_errors_total"), 2.0);
        assert_eq!(metric_sum(text, "dpuio_sessions"), 0.0);
    }
}
