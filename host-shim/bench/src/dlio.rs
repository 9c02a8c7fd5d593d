//! `dpuio bench unet3d`: DLIO's 3D U-Net workload (MLPerf Storage), scaled to fit a
//! small machine.
//!
//! Shape, as DLIO defines it: one sample per file, sample sizes normally distributed
//! (DLIO: mean 146 MiB, stdev 68 MiB; here `--unet3d-mean-bytes`, `--unet3d-stdev-bytes`),
//! batch 7, 4 reader threads per accelerator, and a computation time per step from an
//! accelerator profile (h100 0.323 s, a100 0.636 s) times `--compute-scale`. Each
//! simulated accelerator prefetches batches with its readers while it "computes" (sleeps).
//! Accelerator utilisation (AU) is compute time over wall time, the first step excluded.
//! The search raises the number of accelerators until AU drops below 90%.
//!
//! Through the shim a reader opens the sample and has the agent put it into the reader's
//! registered region (the host touches no payload byte); through POSIX it reads the file
//! into memory with `std::fs::read`, as a plain-POSIX `Dataset` does; over DAOS
//! (`--backend daos`) the baseline is libdfs in this process: open, stat, one `dfs_read`
//! of the whole sample into memory, close, as pydaos loads a file.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dpuio_shim::{Access, Client, RegionAccess};
use rand::{Rng, SeedableRng};

use crate::workloads::{BENCH_DIR, Figures, Setup};

/// Accelerator profiles: computation time per step, from DLIO's unet3d configs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Accelerator {
    H100,
    A100,
}

impl Accelerator {
    fn step_seconds(self) -> f64 {
        match self {
            Accelerator::H100 => 0.323,
            Accelerator::A100 => 0.636,
        }
    }
}

/// Options of the unet3d workload.
#[derive(clap::Args, Debug, Clone)]
pub struct Unet3dArgs {
    /// unet3d: samples (one file each) in the dataset.
    #[arg(long, default_value_t = 48)]
    pub unet3d_samples: usize,
    /// unet3d: mean sample size.
    #[arg(long, default_value = "8MiB", value_parser = crate::workloads::parse_bytes)]
    pub unet3d_mean_bytes: u64,
    /// unet3d: standard deviation of the sample size.
    #[arg(long, default_value = "2MiB", value_parser = crate::workloads::parse_bytes)]
    pub unet3d_stdev_bytes: u64,
    /// unet3d: samples per step.
    #[arg(long, default_value_t = 7)]
    pub unet3d_batch: usize,
    /// unet3d: reader threads per accelerator.
    #[arg(long, default_value_t = 4)]
    pub unet3d_read_threads: usize,
    /// unet3d: steps per accelerator per trial.
    #[arg(long, default_value_t = 8)]
    pub unet3d_steps: usize,
    /// unet3d: accelerator profile.
    #[arg(long, value_enum, default_value = "h100")]
    pub accelerator: Accelerator,
    /// unet3d: factor on the profile's computation time (1.0 = DLIO's figure).
    #[arg(long, default_value_t = 0.1)]
    pub compute_scale: f64,
    /// unet3d: stop the search here.
    #[arg(long, default_value_t = 8)]
    pub max_accelerators: u32,
}

impl Unet3dArgs {
    /// These options as command-line arguments (for the preload path's child).
    pub fn to_args(&self) -> Vec<String> {
        let accelerator = clap::ValueEnum::to_possible_value(&self.accelerator).map(|v| v.get_name().to_owned());
        [
            ("unet3d-samples", self.unet3d_samples.to_string()),
            ("unet3d-mean-bytes", self.unet3d_mean_bytes.to_string()),
            ("unet3d-stdev-bytes", self.unet3d_stdev_bytes.to_string()),
            ("unet3d-batch", self.unet3d_batch.to_string()),
            ("unet3d-read-threads", self.unet3d_read_threads.to_string()),
            ("unet3d-steps", self.unet3d_steps.to_string()),
            ("accelerator", accelerator.unwrap_or_default()),
            ("compute-scale", self.compute_scale.to_string()),
            ("max-accelerators", self.max_accelerators.to_string()),
        ]
        .into_iter()
        .flat_map(|(name, value)| [format!("--{name}"), value])
        .collect()
    }
}

const DATASET: &str = "unet3d";
const READ_CHUNK: u64 = 4 << 20;

fn sample_sizes(args: &Unet3dArgs) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let (mean, sd) = (args.unet3d_mean_bytes as f64, args.unet3d_stdev_bytes as f64);
    (0..args.unet3d_samples)
        .map(|_| {
            // Box-Muller: one normal draw from two uniform ones.
            let (u1, u2): (f64, f64) = (rng.random_range(f64::EPSILON..1.0), rng.random());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            (mean + sd * z).clamp(mean / 4.0, mean * 3.0).max(4096.0) as u64
        })
        .collect()
}

fn sample_path(i: usize) -> String {
    format!("{BENCH_DIR}/{DATASET}/sample_{i:05}.npz")
}

/// Write the dataset through the shim unless it is there with the right sizes.
async fn prepare(client: &Client, sizes: &[u64]) -> dpuio_shim::Result<()> {
    let paths: Vec<String> = (0..sizes.len()).map(sample_path).collect();
    let existing = client.lookup(&paths).await?;
    if existing.iter().zip(sizes).all(|(a, &n)| a.as_ref().is_ok_and(|a| a.size == n)) {
        return Ok(());
    }
    client.mkdir(&format!("{BENCH_DIR}/{DATASET}"), true).await?;
    let mut region = client.register_region(READ_CHUNK as usize, RegionAccess::ReadByAgent).await?;
    let mut bytes = vec![0u8; region.len()];
    rand::rngs::StdRng::seed_from_u64(4).fill(&mut bytes[..]);
    region.write_at(0, &bytes);
    for (path, &size) in paths.iter().zip(sizes) {
        let file = client.create(path, false).await?;
        let requests: Vec<_> = (0..size.div_ceil(READ_CHUNK))
            .map(|k| file.write_request(&region, 0, READ_CHUNK.min(size - k * READ_CHUNK), k * READ_CHUNK))
            .collect();
        for d in client.submit(requests).await? {
            d.result.map_err(|status| dpuio_shim::Error::Io { op: format!("write {path}"), status })?;
        }
        file.close().await?;
    }
    client.deregister_region(region).await
}

/// How a reader thread loads one sample; returns the bytes loaded.
type Loader = Arc<dyn Fn(usize, usize) -> Result<u64, String> + Send + Sync>;

fn posix_loader(root: PathBuf) -> Loader {
    Arc::new(move |_reader, i| {
        let p = root.join(sample_path(i).trim_start_matches('/'));
        std::fs::read(&p).map(|v| v.len() as u64).map_err(|e| format!("{}: {e}", p.display()))
    })
}

fn dfs_loader(dfs: Arc<dyn dpuio_backend::Container>) -> Loader {
    Arc::new(move |_reader, i| {
        let path = sample_path(i);
        let fail = |e: dpuio_backend::Error| format!("libdfs {path}: {e}");
        let ns = dpuio_backend::NsPath::parse(&path).map_err(|e| format!("{path}: {e}"))?;
        let object = dfs.open(&ns, dpuio_backend::OpenOptions::default(), 0).map_err(fail)?;
        let mut sample = vec![0u8; object.stat().map_err(fail)?.size as usize];
        object.read_at(&mut sample, 0).map(|n| n as u64).map_err(fail)
    })
}

/// Each reader thread (by index) owns one registered region as large as the largest sample.
async fn shim_loader(client: &Client, readers: usize, max_sample: u64) -> dpuio_shim::Result<Loader> {
    let mut regions = Vec::with_capacity(readers);
    for _ in 0..readers {
        regions.push(client.register_region(max_sample as usize, RegionAccess::WriteByAgent).await?);
    }
    let regions = Arc::new(regions);
    let client = client.clone();
    let runtime = tokio::runtime::Handle::current();
    Ok(Arc::new(move |reader, i| {
        let path = sample_path(i);
        let file = runtime.block_on(client.open(&path, Access::ReadOnly)).map_err(|e| e.to_string())?;
        let size = file.attr().size;
        let region = &regions[reader];
        let requests: Vec<_> = (0..size.div_ceil(READ_CHUNK))
            .map(|k| file.read_request(region, k * READ_CHUNK, READ_CHUNK.min(size - k * READ_CHUNK), k * READ_CHUNK))
            .collect();
        let mut loaded = 0;
        for d in client.submit_blocking(&requests).map_err(|e| e.to_string())? {
            loaded += d.result.map_err(|s| format!("read {path}: {}", s.describe()))?;
        }
        runtime.block_on(file.close()).map_err(|e| e.to_string())?;
        Ok(loaded)
    }))
}

/// One trial: `accelerators` simulated accelerators, each with its readers.
struct Trial {
    au: f64,
    samples: u64,
    bytes: u64,
    wall: Duration,
    host_cpu: Duration,
    agent_cpu: Option<Duration>,
}

fn trial(
    load: &Loader,
    args: &Unet3dArgs,
    accelerators: u32,
    host_cpu: &dyn Fn() -> Duration,
    setup_agent: &dyn Fn() -> Option<Duration>,
) -> Result<Trial, String> {
    let compute = Duration::from_secs_f64(args.accelerator.step_seconds() * args.compute_scale);
    let per_acc = args.unet3d_batch * args.unet3d_steps;
    let n = args.unet3d_samples;
    let (cpu0, agent0, t0) = (host_cpu(), setup_agent(), Instant::now());
    let results: Vec<Result<(f64, u64), String>> = std::thread::scope(|s| {
        let accs: Vec<_> = (0..accelerators)
            .map(|a| {
                s.spawn(move || -> Result<(f64, u64), String> {
                    // This accelerator's sample order: a seeded shuffle, as a sharded sampler gives.
                    let mut rng = rand::rngs::StdRng::seed_from_u64(100 + u64::from(a));
                    let order: Arc<Vec<usize>> = Arc::new((0..per_acc).map(|_| rng.random_range(0..n)).collect());
                    let next = Arc::new(AtomicUsize::new(0));
                    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<u64, String>>(args.unet3d_batch * 2);
                    let readers: Vec<_> = (0..args.unet3d_read_threads)
                        .map(|r| {
                            let (order, next, tx, load) = (order.clone(), next.clone(), tx.clone(), load.clone());
                            let reader = a as usize * args.unet3d_read_threads + r;
                            std::thread::spawn(move || {
                                loop {
                                    let k = next.fetch_add(1, Ordering::Relaxed);
                                    if k >= order.len() || tx.send(load(reader, order[k])).is_err() {
                                        return;
                                    }
                                }
                            })
                        })
                        .collect();
                    drop(tx);
                    let mut bytes = 0;
                    let mut compute_total = Duration::ZERO;
                    let mut after_first = None;
                    for step in 0..args.unet3d_steps {
                        for _ in 0..args.unet3d_batch {
                            bytes += rx.recv().map_err(|_| "a reader stopped early".to_owned())??;
                        }
                        std::thread::sleep(compute);
                        if step == 0 {
                            after_first = Some(Instant::now()); // DLIO leaves the first step out
                        } else {
                            compute_total += compute;
                        }
                    }
                    for r in readers {
                        let _ = r.join();
                    }
                    let wall = after_first.map_or(Duration::ZERO, |t| t.elapsed());
                    Ok((compute_total.as_secs_f64() / wall.as_secs_f64().max(1e-9), bytes))
                })
            })
            .collect();
        accs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("accelerator thread panicked".into()))).collect()
    });
    let wall = t0.elapsed();
    let mut au_sum = 0.0;
    let mut bytes = 0;
    for r in results {
        let (au, b) = r?;
        au_sum += au;
        bytes += b;
    }
    Ok(Trial {
        au: au_sum / f64::from(accelerators),
        samples: u64::from(accelerators) * per_acc as u64,
        bytes,
        wall,
        host_cpu: host_cpu().saturating_sub(cpu0),
        agent_cpu: agent0.and_then(|a0| setup_agent().map(|a1| a1.saturating_sub(a0))),
    })
}

/// Search the most accelerators a path keeps at AU >= 90%; report that trial (or the
/// one-accelerator trial when none passes).
fn search(path: &str, load: &Loader, args: &Unet3dArgs, setup: &Setup) -> dpuio_shim::Result<Figures> {
    let err = |e: String| dpuio_shim::Error::DataPlane { op: format!("unet3d {path}"), reason: e };
    let agent_cpu = || setup.agent_cpu();
    let host_cpu = || setup.host_cpu(path);
    let mut best: Option<(u32, Trial)> = None;
    let mut first: Option<Trial> = None;
    for n in 1..=args.max_accelerators.max(1) {
        let bar = setup.spinner(format!("unet3d {path}: {n} accelerator(s)"));
        let t = trial(load, args, n, &host_cpu, &agent_cpu).map_err(err)?;
        bar.finish_and_clear();
        let passed = t.au >= 0.9;
        if n == 1 {
            first = Some(Trial { ..t });
            if passed {
                best = first.take().map(|t| (1, t));
            }
        } else if passed {
            best = Some((n, t));
        }
        if !passed {
            break;
        }
    }
    let (accelerators, t) = match best {
        Some((n, t)) => (n, t),
        None => (0, first.expect("the first trial always runs")),
    };
    Ok(Figures {
        workload: "unet3d".into(),
        path: path.to_owned(),
        bytes: t.bytes,
        ops: t.samples,
        wall: t.wall,
        host_cpu: t.host_cpu,
        agent_cpu: t.agent_cpu,
        au: Some(t.au),
        accelerators: Some(accelerators),
        ..Figures::default()
    })
}

pub async fn unet3d(setup: &Setup, args: &Unet3dArgs) -> dpuio_shim::Result<Vec<Figures>> {
    if args.unet3d_samples == 0 || args.unet3d_batch == 0 || args.unet3d_read_threads == 0 || args.unet3d_steps < 2 {
        return Err(dpuio_shim::Error::DataPlane {
            op: "unet3d".into(),
            reason: "samples, batch and read threads must be positive and steps at least 2 (the first is not counted)"
                .into(),
        });
    }
    let sizes = sample_sizes(args);
    let max_sample = sizes.iter().copied().max().unwrap_or(4096);
    for client in setup.writers() {
        prepare(client, &sizes).await?;
    }
    let mut out = Vec::new();
    if let Some(root) = &setup.posix_root {
        let load = posix_loader(root.clone());
        let args = args.clone();
        out.push(tokio::task::block_in_place(|| search(setup.posix_label, &load, &args, setup))?);
    }
    if let Some(dfs) = &setup.dfs {
        let load = dfs_loader(dfs.clone());
        out.push(tokio::task::block_in_place(|| search(crate::workloads::LIBDFS, &load, args, setup))?);
    }
    for (name, client) in &setup.clients {
        let readers = args.unet3d_read_threads * args.max_accelerators.max(1) as usize;
        let load = shim_loader(client, readers, max_sample).await?;
        out.push(tokio::task::block_in_place(|| search(name, &load, args, setup))?);
    }
    if let Some(mount) = &setup.fuse {
        let load = posix_loader(mount.dir.clone());
        out.push(tokio::task::block_in_place(|| search(crate::workloads::FUSE, &load, args, setup))?);
    }
    Ok(out)
}
