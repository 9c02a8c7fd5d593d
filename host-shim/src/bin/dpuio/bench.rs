//! `dpuio bench`: the same workload through the shim (UCX shared memory, UCX TCP) and
//! through plain POSIX `pread` on the same file, interleaved in one run so the ratios
//! are measured under the same machine load.
//!
//! POSIX queue depth is emulated the way fio's psync engine does it: `queue_depth`
//! threads each doing blocking `pread`s. Host CPU is this process's CPU time
//! (all threads, the shim's progress thread included) per GiB moved; agent CPU, when
//! `--agent-pid` is given, comes from `/proc/PID/stat` (10 ms resolution).

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpuio_shim::{Access, Client, ConnectOptions, DataPlaneOptions, RegionAccess, process_cpu_time};
use rand::{Rng, SeedableRng};

const GIB: f64 = (1u64 << 30) as f64;

/// Which way the bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    SeqRead,
    RandRead,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::SeqRead => "seq-read",
            Workload::RandRead => "rand-read",
        }
    }
}

/// Options of `dpuio bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Workload to run.
    #[arg(value_enum)]
    pub workload: Workload,
    /// Block size in bytes (default: 1 MiB for seq-read, 4 KiB for rand-read).
    #[arg(long)]
    pub block_bytes: Option<u64>,
    /// Requests in flight (POSIX: this many threads).
    #[arg(long)]
    pub queue_depth: Option<usize>,
    /// Size of the benchmark file in the container.
    #[arg(long, default_value_t = 1 << 30)]
    pub file_bytes: u64,
    /// Seconds per measurement; each path is measured `--rounds` times, interleaved.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Paths to compare: any of posix, shm, tcp.
    #[arg(long, value_delimiter = ',', default_value = "posix,shm,tcp")]
    pub paths: Vec<String>,
    /// The container's directory on this machine (for the POSIX baseline on the same
    /// file), e.g. ./dpuio-data/containers/default. Without it the POSIX path is skipped.
    #[arg(long)]
    pub posix_root: Option<PathBuf>,
    /// The agent's process id, to report its CPU per GiB.
    #[arg(long)]
    pub agent_pid: Option<u32>,
    /// One JSON object per result on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One measured cell.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub workload: &'static str,
    pub path: String,
    pub block_bytes: u64,
    pub queue_depth: usize,
    pub bytes: u64,
    pub ops: u64,
    pub wall: Duration,
    pub host_cpu: Duration,
    pub agent_cpu: Option<Duration>,
    pub latencies_us: Vec<u32>,
}

impl Figures {
    fn gib_per_s(&self) -> f64 {
        self.bytes as f64 / GIB / self.wall.as_secs_f64()
    }
    fn iops(&self) -> f64 {
        self.ops as f64 / self.wall.as_secs_f64()
    }
    fn host_cpu_s_per_gib(&self) -> f64 {
        self.host_cpu.as_secs_f64() / (self.bytes as f64 / GIB)
    }
    fn agent_cpu_s_per_gib(&self) -> Option<f64> {
        self.agent_cpu.map(|c| c.as_secs_f64() / (self.bytes as f64 / GIB))
    }
    fn percentile_us(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        let mut v = self.latencies_us.clone();
        v.sort_unstable();
        let i = ((v.len() as f64 - 1.0) * p).round() as usize;
        f64::from(v[i])
    }
    fn merge(&mut self, other: Figures) {
        self.bytes += other.bytes;
        self.ops += other.ops;
        self.wall += other.wall;
        self.host_cpu += other.host_cpu;
        self.agent_cpu = match (self.agent_cpu, other.agent_cpu) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        self.latencies_us.extend(other.latencies_us);
    }
}

/// CPU time of another process from /proc (user + system, clock ticks of 10 ms).
fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

const BENCH_FILE: &str = "/.dpuio-bench/data";

pub async fn run(agent: &str, tenant: &str, args: BenchArgs) -> dpuio_shim::Result<()> {
    let block = args.block_bytes.unwrap_or(match args.workload {
        Workload::SeqRead => 1 << 20,
        Workload::RandRead => 4096,
    });
    let qd = args.queue_depth.unwrap_or(match args.workload {
        Workload::SeqRead => 1,
        Workload::RandRead => 32,
    });
    let file_bytes = args.file_bytes - args.file_bytes % block;
    let connect = |transports: &str| {
        Client::connect(ConnectOptions {
            agent: agent.to_owned(),
            tenant: tenant.to_owned(),
            client_name: format!("dpuio bench ({transports})"),
            data_plane: Some(DataPlaneOptions { transports: transports.to_owned(), rings: 2, ..Default::default() }),
            ..ConnectOptions::default()
        })
    };
    let mut clients = Vec::new();
    for path in &args.paths {
        match path.as_str() {
            "shm" | "tcp" => {
                clients.push((format!("shim-ucx-{}", if path == "shm" { "sm" } else { "tcp" }), connect(path).await?))
            }
            "posix" => {}
            other => {
                return Err(dpuio_shim::Error::DataPlane {
                    op: "bench".into(),
                    reason: format!("unknown path {other:?}; use posix, shm or tcp"),
                });
            }
        }
    }
    let Some((_, first)) = clients.first() else {
        return Err(dpuio_shim::Error::DataPlane {
            op: "bench".into(),
            reason: "name at least one of shm, tcp".into(),
        });
    };
    prepare_file(first, file_bytes).await?;
    let posix_file = match (&args.posix_root, args.paths.iter().any(|p| p == "posix")) {
        (Some(root), true) => {
            let path = root.join(BENCH_FILE.trim_start_matches('/'));
            Some(Arc::new(std::fs::File::open(&path).map_err(|e| dpuio_shim::Error::DataPlane {
                op: format!("open {} for the POSIX baseline", path.display()),
                reason: format!("{e} (is --posix-root the container's directory?)"),
            })?))
        }
        (None, true) => {
            eprintln!("dpuio bench: POSIX baseline skipped: pass --posix-root <container directory>");
            None
        }
        _ => None,
    };
    // Warm the page cache, so every path reads the same cached file.
    if let Some(f) = &posix_file {
        let mut buf = vec![0u8; 4 << 20];
        let mut at = 0;
        while at < file_bytes {
            at += f.read_at(&mut buf, at).unwrap_or(0).max(1) as u64;
        }
    }
    let duration = Duration::from_secs_f64(args.seconds);
    let mut totals: Vec<Figures> = Vec::new();
    for round in 0..args.rounds {
        let mut cells = Vec::new();
        if let Some(f) = &posix_file {
            let f = f.clone();
            let (w, pid) = (args.workload, args.agent_pid);
            let mut fig = tokio::task::spawn_blocking(move || {
                posix_cell(&f, w, block, qd, file_bytes, duration, round as u64, pid)
            })
            .await
            .expect("posix bench thread");
            fig.path = "posix".into();
            cells.push(fig);
        }
        for (name, client) in &clients {
            let mut fig =
                shim_cell(client, args.workload, block, qd, file_bytes, duration, round as u64, args.agent_pid).await?;
            fig.path = name.clone();
            cells.push(fig);
        }
        for cell in cells {
            match totals.iter_mut().find(|t| t.path == cell.path) {
                Some(t) => t.merge(cell),
                None => totals.push(cell),
            }
        }
    }
    report(&totals, &args);
    for (_, c) in clients {
        c.detach().await?;
    }
    Ok(())
}

/// Create the benchmark file through the shim unless it already has the right size.
async fn prepare_file(client: &Client, file_bytes: u64) -> dpuio_shim::Result<()> {
    if let Ok(a) = client.stat(BENCH_FILE).await {
        if a.size == file_bytes {
            return Ok(());
        }
    }
    client.mkdir("/.dpuio-bench", true).await?;
    let file = client.create(BENCH_FILE, false).await?;
    const CHUNK: u64 = 4 << 20;
    let mut region = client.register_region(CHUNK as usize, RegionAccess::ReadByAgent).await?;
    rand::rngs::StdRng::seed_from_u64(1).fill(region.memory_mut().as_mut_slice());
    let mut at = 0;
    while at < file_bytes {
        let n = CHUNK.min(file_bytes - at);
        let c = client.clone();
        let req = file.write_request(&region, 0, n, at);
        let done = tokio::task::spawn_blocking(move || c.submit_blocking(&[req]))
            .await
            .map_err(|e| dpuio_shim::Error::DataPlane { op: "bench".into(), reason: e.to_string() })??;
        done[0].result.map_err(|status| dpuio_shim::Error::Io { op: "write the bench file".into(), status })?;
        at += n;
    }
    file.close().await?;
    client.deregister_region(region).await
}

fn offset(workload: Workload, i: u64, block: u64, file_bytes: u64, rng: &mut impl Rng) -> u64 {
    let blocks = file_bytes / block;
    match workload {
        Workload::SeqRead => (i % blocks) * block,
        Workload::RandRead => rng.random_range(0..blocks) * block,
    }
}

#[allow(clippy::too_many_arguments)]
fn posix_cell(
    file: &std::fs::File,
    workload: Workload,
    block: u64,
    qd: usize,
    file_bytes: u64,
    duration: Duration,
    seed: u64,
    agent_pid: Option<u32>,
) -> Figures {
    let cpu0 = process_cpu_time();
    let agent0 = agent_pid.and_then(process_cpu);
    let start = Instant::now();
    let per_thread: Vec<(u64, Vec<u32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..qd)
            .map(|t| {
                s.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 1000 + t as u64);
                    let mut buf = vec![0u8; block as usize];
                    let mut lat = Vec::new();
                    let mut i = t as u64;
                    while start.elapsed() < duration {
                        let at = offset(workload, i, block, file_bytes, &mut rng);
                        let t0 = Instant::now();
                        let _ = file.read_at(&mut buf, at);
                        lat.push(t0.elapsed().as_micros() as u32);
                        i += qd as u64;
                    }
                    (lat.len() as u64, lat)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("posix thread")).collect()
    });
    let wall = start.elapsed();
    let ops: u64 = per_thread.iter().map(|p| p.0).sum();
    Figures {
        workload: workload.name(),
        block_bytes: block,
        queue_depth: qd,
        bytes: ops * block,
        ops,
        wall,
        host_cpu: process_cpu_time() - cpu0,
        agent_cpu: agent0.and_then(|a0| agent_pid.and_then(process_cpu).map(|a1| a1.saturating_sub(a0))),
        latencies_us: per_thread.into_iter().flat_map(|p| p.1).collect(),
        ..Figures::default()
    }
}

#[allow(clippy::too_many_arguments)]
async fn shim_cell(
    client: &Client,
    workload: Workload,
    block: u64,
    qd: usize,
    file_bytes: u64,
    duration: Duration,
    seed: u64,
    agent_pid: Option<u32>,
) -> dpuio_shim::Result<Figures> {
    let file = client.open(BENCH_FILE, Access::ReadOnly).await?;
    let mut regions = Vec::with_capacity(qd);
    for _ in 0..qd {
        regions.push(client.register_region(block as usize, RegionAccess::WriteByAgent).await?);
    }
    let c = client.clone();
    let handle = file.handle();
    let requests: Vec<_> = regions.iter().map(|r| file.read_request(r, 0, block, 0)).collect();
    let fig = tokio::task::spawn_blocking(move || -> dpuio_shim::Result<Figures> {
        let mut batch = c.batch()?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed + 77);
        let mut sent_at = vec![Instant::now(); qd];
        let mut lat = Vec::new();
        let mut i = 0u64;
        let cpu0 = process_cpu_time();
        let agent0 = agent_pid.and_then(process_cpu);
        let start = Instant::now();
        // Keep qd requests in flight; slot k's request reads into region k.
        for (k, base) in requests.iter().enumerate() {
            let at = offset(workload, i, block, file_bytes, &mut rng);
            i += 1;
            batch.push(&dpuio_shim::Request { file_offset: at, user_data: k as u64, handle, ..*base })?;
            sent_at[k] = Instant::now();
        }
        batch.submit()?;
        let mut ops = 0u64;
        while batch.in_flight() > 0 {
            let done = batch.wait(1, Duration::from_secs(30))?;
            let now = Instant::now();
            let keep_going = start.elapsed() < duration;
            for d in done {
                let k = d.user_data as usize;
                d.result.map_err(|status| dpuio_shim::Error::Io { op: "bench read".into(), status })?;
                ops += 1;
                lat.push((now - sent_at[k]).as_micros() as u32);
                if keep_going {
                    let at = offset(workload, i, block, file_bytes, &mut rng);
                    i += 1;
                    batch.push(&dpuio_shim::Request { file_offset: at, user_data: k as u64, ..requests[k] })?;
                    sent_at[k] = Instant::now();
                }
            }
            batch.submit()?;
        }
        let wall = start.elapsed();
        Ok(Figures {
            workload: workload.name(),
            block_bytes: block,
            queue_depth: qd,
            bytes: ops * block,
            ops,
            wall,
            host_cpu: process_cpu_time() - cpu0,
            agent_cpu: agent0.and_then(|a0| agent_pid.and_then(process_cpu).map(|a1| a1.saturating_sub(a0))),
            latencies_us: lat,
            ..Figures::default()
        })
    })
    .await
    .map_err(|e| dpuio_shim::Error::DataPlane { op: "bench".into(), reason: e.to_string() })??;
    for r in regions {
        client.deregister_region(r).await?;
    }
    file.close().await?;
    Ok(fig)
}

fn report(totals: &[Figures], args: &BenchArgs) {
    let posix = totals.iter().find(|t| t.path == "posix");
    if args.json {
        for t in totals {
            let ratio = posix.map(|p| t.gib_per_s() / p.gib_per_s());
            let cpu_ratio = posix.map(|p| t.host_cpu_s_per_gib() / p.host_cpu_s_per_gib());
            println!(
                "{{\"workload\":\"{}\",\"path\":\"{}\",\"block_bytes\":{},\"queue_depth\":{},\"gib_per_s\":{:.4},\"iops\":{:.0},\"p50_us\":{:.1},\"p99_us\":{:.1},\"host_cpu_s_per_gib\":{:.5},\"agent_cpu_s_per_gib\":{},\"ratio_to_posix\":{},\"host_cpu_ratio_to_posix\":{},\"seconds\":{:.2}}}",
                t.workload,
                t.path,
                t.block_bytes,
                t.queue_depth,
                t.gib_per_s(),
                t.iops(),
                t.percentile_us(0.5),
                t.percentile_us(0.99),
                t.host_cpu_s_per_gib(),
                t.agent_cpu_s_per_gib().map_or("null".into(), |v| format!("{v:.5}")),
                ratio.map_or("null".into(), |v| format!("{v:.3}")),
                cpu_ratio.map_or("null".into(), |v| format!("{v:.4}")),
                t.wall.as_secs_f64(),
            );
        }
        return;
    }
    println!(
        "{:<10} {:<14} {:>9} {:>3} {:>9} {:>10} {:>9} {:>9} {:>12} {:>12} {:>9}",
        "workload", "path", "block", "qd", "GiB/s", "IOPS", "p50 us", "p99 us", "host s/GiB", "agent s/GiB", "vs posix"
    );
    for t in totals {
        println!(
            "{:<10} {:<14} {:>9} {:>3} {:>9.3} {:>10.0} {:>9.1} {:>9.1} {:>12.5} {:>12} {:>9}",
            t.workload,
            t.path,
            t.block_bytes,
            t.queue_depth,
            t.gib_per_s(),
            t.iops(),
            t.percentile_us(0.5),
            t.percentile_us(0.99),
            t.host_cpu_s_per_gib(),
            t.agent_cpu_s_per_gib().map_or("-".into(), |v| format!("{v:.5}")),
            posix.map_or("-".into(), |p| format!("{:.2}x", t.gib_per_s() / p.gib_per_s())),
        );
    }
    if let (Some(p), Some(sm)) = (posix, totals.iter().find(|t| t.path == "shim-ucx-sm")) {
        let thr = sm.gib_per_s() / p.gib_per_s();
        let cpu = sm.host_cpu_s_per_gib() / p.host_cpu_s_per_gib();
        match args.workload {
            Workload::SeqRead => {
                println!("target: shim-ucx-sm throughput >= 0.8x posix (aim 1.0x): {thr:.2}x  {}", verdict(thr >= 0.8));
                println!(
                    "target: shim-ucx-sm host CPU/GiB <= 10% of posix: {:.1}%  {}",
                    cpu * 100.0,
                    verdict(cpu <= 0.10)
                );
            }
            Workload::RandRead => {
                let iops = sm.iops() / p.iops();
                println!(
                    "target: shim-ucx-sm IOPS >= 0.5x posix: {iops:.2}x  {} (p50 {:.0} us, p99 {:.0} us; posix p50 {:.0} us, p99 {:.0} us)",
                    verdict(iops >= 0.5),
                    sm.percentile_us(0.5),
                    sm.percentile_us(0.99),
                    p.percentile_us(0.5),
                    p.percentile_us(0.99)
                );
            }
        }
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}
