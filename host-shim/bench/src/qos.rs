//! `dpuio bench qos`: tenant isolation on one agent, measured from two tenants' hosts.
//!
//! Tenant A (rate-limited by its `[tenants.qos]`) reads large blocks as fast as it can;
//! tenant B (unlimited) reads 4 KiB blocks at a low fixed rate and records each
//! request's latency. Per round: B alone, then B while A loads the agent. The report is
//! A's achieved rate against its configured limit (targets: within 10%) and B's p99
//! with A running against B's p99 alone (target: at most 2x).
//!
//! With `--agent-bin` the benchmark starts its own agent with a generated two-tenant
//! config (plaintext on loopback) in a temporary directory; otherwise it uses `--agent`,
//! which must already serve the two tenants, and `--qos-limit` must state A's
//! configured bytes/s.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dpuio_shim::cli::ConnectArgs;
use dpuio_shim::{Access, Client, ConnectOptions, DataPlaneOptions, RegionAccess};
use rand::{Rng, SeedableRng};

use dpuio_bench_core::BENCH_DIR;

use crate::args::{BenchArgs, QosArgs};

const A_FILE: &str = "/.dpuio-bench/qos-a";
const B_FILE: &str = "/.dpuio-bench/qos-b";
const A_FILE_BYTES: u64 = 32 << 20;
const B_FILE_BYTES: u64 = 16 << 20;
const B_BLOCK: u64 = 4096;
/// A runs this long before B's measurement starts, so A's burst is spent.
const WARM_UP: Duration = Duration::from_millis(500);

fn err(reason: impl std::fmt::Display) -> dpuio_shim::Error {
    dpuio_shim::Error::DataPlane { op: "bench qos".into(), reason: reason.to_string() }
}

/// What one run measured.
#[derive(Debug, Default)]
pub struct QosFigures {
    pub a_limit_bytes_per_s: u64,
    pub a_bytes: u64,
    pub a_window: Duration,
    pub b_solo_us: Vec<u32>,
    pub b_loaded_us: Vec<u32>,
}

impl QosFigures {
    pub fn a_bytes_per_s(&self) -> f64 {
        self.a_bytes as f64 / self.a_window.as_secs_f64()
    }
    /// A's achieved rate over its limit.
    pub fn a_ratio(&self) -> f64 {
        self.a_bytes_per_s() / self.a_limit_bytes_per_s as f64
    }
    /// B's p99 with A running over B's p99 alone.
    pub fn b_p99_ratio(&self) -> f64 {
        percentile(&self.b_loaded_us, 0.99) / percentile(&self.b_solo_us, 0.99)
    }
}

fn percentile(v: &[u32], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_unstable();
    f64::from(v[((v.len() as f64 - 1.0) * p).round() as usize])
}

/// How long an agent this benchmark starts may take to report its address.
const AGENT_STARTUP: Duration = Duration::from_secs(30);

/// `--agent-bin`: an agent of this benchmark's own, with a two-tenant config (plaintext
/// on loopback; A limited to `--qos-limit`), in a scratch directory that goes with it.
fn start_agent(bin: &Path, q: &QosArgs) -> dpuio_shim::Result<dpuio_harness::Agent> {
    let config = format!(
        "[tls]\nmode = \"off\"\n\n\
         [[tenants]]\nname = \"{a}\"\ncontainer = \"{a}\"\n[tenants.qos]\nbytes_per_s = {limit}\nburst_bytes = {burst}\n\n\
         [[tenants]]\nname = \"{b}\"\ncontainer = \"{b}\"\n",
        a = q.qos_tenant_a,
        b = q.qos_tenant_b,
        limit = q.qos_limit,
        burst = q.qos_burst.max(q.qos_a_block),
    );
    dpuio_harness::start_with_config(Command::new(bin), &config, AGENT_STARTUP).map_err(err)
}

/// Attach as `tenant` by name: the two tenants' agent serves plaintext, so no TLS files
/// and no token of the caller's apply (only the data plane's interface does).
async fn connect(options: &ConnectArgs, agent: &str, tenant: &str, rings: usize) -> dpuio_shim::Result<Client> {
    Client::connect(ConnectOptions {
        agent: agent.to_owned(),
        tenant: tenant.to_owned(),
        client_name: format!("dpuio bench qos ({tenant})"),
        data_plane: Some(DataPlaneOptions {
            transports: "shm".into(),
            rings,
            interface: options.interface.clone(),
            ..Default::default()
        }),
        ..ConnectOptions::default()
    })
    .await
}

/// Write `bytes` of a file through the shim unless it has that size already.
async fn prepare(client: &Client, path: &str, bytes: u64) -> dpuio_shim::Result<()> {
    if client.stat(path).await.is_ok_and(|a| a.size == bytes) {
        return Ok(());
    }
    client.mkdir(BENCH_DIR, true).await?;
    let file = client.create(path, false).await?;
    const CHUNK: u64 = 1 << 20;
    let mut region = client.register_region(CHUNK as usize, RegionAccess::ReadByAgent).await?;
    let mut random = vec![0u8; region.len()];
    rand::rngs::StdRng::seed_from_u64(5).fill(&mut random[..]);
    region.write_at(0, &random);
    let requests: Vec<_> = (0..bytes / CHUNK).map(|i| file.write_request(&region, 0, CHUNK, i * CHUNK)).collect();
    let c = client.clone();
    tokio::task::spawn_blocking(move || -> dpuio_shim::Result<()> {
        for r in requests {
            c.submit_blocking(&[r])?[0]
                .result
                .map_err(|status| dpuio_shim::Error::Io { op: "bench qos".into(), status })?;
        }
        Ok(())
    })
    .await
    .map_err(err)??;
    file.close().await?;
    client.deregister_region(region).await
}

/// Tenant A: `depth` reads of `block` in flight, sequential over its file, until
/// `stop`. While `measuring` is set, completed bytes are added to `bytes`.
fn a_load(
    c: &Client,
    requests: &[dpuio_shim::Request],
    block: u64,
    stop: &AtomicBool,
    measuring: &AtomicBool,
    bytes: &AtomicU64,
) -> dpuio_shim::Result<()> {
    let mut batch = c.batch()?;
    let blocks = A_FILE_BYTES / block;
    let mut next = 0u64;
    for (k, r) in requests.iter().enumerate() {
        batch.push(&dpuio_shim::Request { file_offset: (next % blocks) * block, user_data: k as u64, ..*r })?;
        next += 1;
    }
    batch.submit()?;
    while batch.in_flight() > 0 {
        let done = batch.wait(1, Duration::from_secs(60))?;
        let going = !stop.load(Ordering::Relaxed);
        for d in done {
            let n = d.result.map_err(|status| dpuio_shim::Error::Io { op: "bench qos: tenant A".into(), status })?;
            if measuring.load(Ordering::Relaxed) {
                bytes.fetch_add(n, Ordering::Relaxed);
            }
            if going {
                let k = d.user_data as usize;
                batch.push(&dpuio_shim::Request { file_offset: (next % blocks) * block, ..requests[k] })?;
                next += 1;
            }
        }
        batch.submit()?;
    }
    Ok(())
}

/// Tenant B: one 4 KiB read every 1/rate s at a random offset for `duration`;
/// returns each latency in microseconds.
fn b_probe(c: &Client, request: dpuio_shim::Request, rate: u32, duration: Duration) -> dpuio_shim::Result<Vec<u32>> {
    let mut batch = c.batch()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let period = Duration::from_secs(1) / rate.max(1);
    let start = Instant::now();
    let mut due = start;
    let mut lat = Vec::new();
    while start.elapsed() < duration {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        due += period;
        let at = rng.random_range(0..B_FILE_BYTES / B_BLOCK) * B_BLOCK;
        let t0 = Instant::now();
        batch.push(&dpuio_shim::Request { file_offset: at, ..request })?;
        batch.submit()?;
        let done = batch.wait(1, Duration::from_secs(30))?;
        lat.push(t0.elapsed().as_micros() as u32);
        for d in done {
            d.result.map_err(|status| dpuio_shim::Error::Io { op: "bench qos: tenant B".into(), status })?;
        }
    }
    Ok(lat)
}

/// Measure (see the module docs).
pub async fn measure(options: &ConnectArgs, args: &BenchArgs) -> dpuio_shim::Result<QosFigures> {
    let q = &args.qos;
    if q.qos_limit == 0 || q.qos_a_block == 0 || q.qos_a_block > A_FILE_BYTES || q.qos_a_depth == 0 {
        return Err(err("--qos-limit, --qos-a-block (at most 32 MiB) and --qos-a-depth must be positive"));
    }
    let own = match &q.agent_bin {
        Some(bin) => Some(start_agent(bin, q)?),
        None => None,
    };
    let agent = own.as_ref().map_or_else(|| options.agent.clone(), dpuio_harness::Agent::url);
    let a = connect(options, &agent, &q.qos_tenant_a, 1).await?;
    let b = connect(options, &agent, &q.qos_tenant_b, 1).await?;
    prepare(&a, A_FILE, A_FILE_BYTES).await?;
    prepare(&b, B_FILE, B_FILE_BYTES).await?;
    let a_file = a.open(A_FILE, Access::ReadOnly).await?;
    let b_file = b.open(B_FILE, Access::ReadOnly).await?;
    let mut a_regions = Vec::new();
    for _ in 0..q.qos_a_depth {
        a_regions.push(a.register_region(q.qos_a_block as usize, RegionAccess::WriteByAgent).await?);
    }
    let b_region = b.register_region(B_BLOCK as usize, RegionAccess::WriteByAgent).await?;
    let a_requests: Vec<_> = a_regions.iter().map(|r| a_file.read_request(r, 0, q.qos_a_block, 0)).collect();
    let b_request = b_file.read_request(&b_region, 0, B_BLOCK, 0);
    let duration = Duration::from_secs_f64(args.seconds);
    let (rate, block, rounds) = (q.qos_b_rate, q.qos_a_block, args.rounds.max(1));
    let limit = q.qos_limit;
    let (ac, bc) = (a.clone(), b.clone());
    let figures = tokio::task::spawn_blocking(move || -> dpuio_shim::Result<QosFigures> {
        let mut f = QosFigures { a_limit_bytes_per_s: limit, ..QosFigures::default() };
        // Not measured: B's first requests fault its file into the page cache.
        b_probe(&bc, b_request, rate, WARM_UP)?;
        for _ in 0..rounds {
            f.b_solo_us.extend(b_probe(&bc, b_request, rate, duration)?);
            let stop = AtomicBool::new(false);
            let measuring = AtomicBool::new(false);
            let bytes = AtomicU64::new(0);
            let (loaded, window) = std::thread::scope(|s| -> dpuio_shim::Result<(Vec<u32>, Duration)> {
                let load = s.spawn(|| a_load(&ac, &a_requests, block, &stop, &measuring, &bytes));
                std::thread::sleep(WARM_UP);
                measuring.store(true, Ordering::Relaxed);
                let t0 = Instant::now();
                let probed = b_probe(&bc, b_request, rate, duration);
                measuring.store(false, Ordering::Relaxed);
                let window = t0.elapsed();
                stop.store(true, Ordering::Relaxed);
                load.join().map_err(|_| err("tenant A's thread panicked"))??;
                Ok((probed?, window))
            })?;
            f.b_loaded_us.extend(loaded);
            f.a_bytes += bytes.load(Ordering::Relaxed);
            f.a_window += window;
        }
        Ok(f)
    })
    .await
    .map_err(err)??;
    for r in a_regions {
        a.deregister_region(r).await?;
    }
    b.deregister_region(b_region).await?;
    a_file.close().await?;
    b_file.close().await?;
    a.detach().await?;
    b.detach().await?;
    drop(own);
    Ok(figures)
}

/// `dpuio bench qos`: measure and print the figures and the targets they are held to.
pub async fn run(options: &ConnectArgs, args: &BenchArgs) -> dpuio_shim::Result<()> {
    let f = measure(options, args).await?;
    let mib = |b: f64| b / f64::from(1u32 << 20);
    let (solo50, solo99) = (percentile(&f.b_solo_us, 0.5), percentile(&f.b_solo_us, 0.99));
    let (load50, load99) = (percentile(&f.b_loaded_us, 0.5), percentile(&f.b_loaded_us, 0.99));
    if args.json {
        println!(
            "{{\"workload\":\"qos\",\"a_limit_bytes_per_s\":{},\"a_bytes_per_s\":{:.0},\"a_ratio\":{:.4},\"b_solo_p50_us\":{solo50:.1},\"b_solo_p99_us\":{solo99:.1},\"b_loaded_p50_us\":{load50:.1},\"b_loaded_p99_us\":{load99:.1},\"b_p99_ratio\":{:.3},\"b_samples\":{},\"seconds\":{:.2}}}",
            f.a_limit_bytes_per_s,
            f.a_bytes_per_s(),
            f.a_ratio(),
            f.b_p99_ratio(),
            f.b_loaded_us.len(),
            f.a_window.as_secs_f64(),
        );
        return Ok(());
    }
    let q = &args.qos;
    println!(
        "qos: tenant {} limited to {:.1} MiB/s reads {} KiB x {} in flight; tenant {} reads 4 KiB at {}/s",
        q.qos_tenant_a,
        mib(f.a_limit_bytes_per_s as f64),
        q.qos_a_block >> 10,
        q.qos_a_depth,
        q.qos_tenant_b,
        q.qos_b_rate
    );
    println!("{:<26} {:>10} {:>10} {:>10} {:>9}", "", "MiB/s", "p50 us", "p99 us", "samples");
    println!(
        "{:<26} {:>10.1} {:>10} {:>10} {:>9}",
        format!("{} (limit)", q.qos_tenant_a),
        mib(f.a_limit_bytes_per_s as f64),
        "-",
        "-",
        "-"
    );
    println!(
        "{:<26} {:>10.1} {:>10} {:>10} {:>9}",
        format!("{} (achieved)", q.qos_tenant_a),
        mib(f.a_bytes_per_s()),
        "-",
        "-",
        "-"
    );
    println!(
        "{:<26} {:>10} {:>10.0} {:>10.0} {:>9}",
        format!("{} alone", q.qos_tenant_b),
        "-",
        solo50,
        solo99,
        f.b_solo_us.len()
    );
    println!(
        "{:<26} {:>10} {:>10.0} {:>10.0} {:>9}",
        format!("{} with {} loading", q.qos_tenant_b, q.qos_tenant_a),
        "-",
        load50,
        load99,
        f.b_loaded_us.len()
    );
    let off = (f.a_ratio() - 1.0) * 100.0;
    println!(
        "target: qos tenant {} within 10% of its limit: {:+.1}%  {}",
        q.qos_tenant_a,
        off,
        if off.abs() <= 10.0 { "met" } else { "NOT met" }
    );
    println!(
        "target: qos tenant {} p99 with {} loading <= 2x alone: {:.2}x  {}",
        q.qos_tenant_b,
        q.qos_tenant_a,
        f.b_p99_ratio(),
        if f.b_p99_ratio() <= 2.0 { "met" } else { "NOT met" }
    );
    Ok(())
}
