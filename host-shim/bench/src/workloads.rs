//! `dpuio bench`: the same workload through the shim (UCX shared memory, UCX TCP) and
//! through plain POSIX calls on the same file system, interleaved in one run so the
//! ratios are measured under the same machine load.
//!
//! Workloads: `seq-read`, `seq-write`, `rand-read` (block size, queue depth), `metadata`
//! (create, stat, readdir, remove rates), `unet3d` (DLIO's 3D U-Net shape: accelerator
//! utilisation and the most simulated accelerators kept at AU >= 90%) and `checkpoint`
//! (write with fsync, then read back).
//!
//! With `--backend daos` the baseline of the block workloads, metadata and checkpoint is
//! libdfs in this process, on the same DAOS container the agent serves (the way pydaos
//! reads); unet3d then runs through the shim only, without a baseline.
//!
//! POSIX queue depth is emulated the way fio's psync engine does it: `queue_depth`
//! threads each doing blocking `pread`s. Host CPU is this process's CPU time
//! (all threads, the shim's progress thread included) per GiB moved; agent CPU, when
//! `--agent-pid` is given, comes from `/proc/PID/stat` (10 ms resolution).

use std::os::unix::fs::FileExt;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpuio_shim::cli::ConnectArgs;
use dpuio_shim::{Access, Client, ConnectOptions, DataPlaneOptions, RegionAccess, process_cpu_time};
use rand::{Rng, SeedableRng};

const GIB: f64 = (1u64 << 30) as f64;

/// A byte count with an optional binary suffix: `4096`, `4KiB`, `1MiB`, `2GiB` (`K`, `M`,
/// `G` mean the same).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a byte count such as 4096, 64KiB or 1GiB"))?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" | "k" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        "T" | "TiB" => 40,
        other => return Err(format!("unknown unit {other:?} in {s:?}; use KiB, MiB, GiB or TiB")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("{s:?} is too large"))
}

/// Which backend the agent under test runs, hence which baseline is fair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchBackend {
    Local,
    Daos,
}

/// The baseline of a block workload: the same file, read and written without dpuio.
trait BaselineFile: Send + Sync {
    fn read_block(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
    fn write_block(&self, buf: &[u8], offset: u64) -> std::io::Result<()>;
}

impl BaselineFile for std::fs::File {
    fn read_block(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
    fn write_block(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }
}

/// A DFS object opened by libdfs in this process.
struct DfsFile(Arc<dyn dpuio_backend::Object>);

impl BaselineFile for DfsFile {
    fn read_block(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self.0.read_at(buf, offset) {
            Ok(n) if n == buf.len() => Ok(()),
            Ok(n) => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("short read of {n}"))),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }
    fn write_block(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset).map_err(|e| std::io::Error::other(e.to_string()))
    }
}

/// Which way the bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    SeqRead,
    SeqWrite,
    RandRead,
    Metadata,
    Unet3d,
    Checkpoint,
    /// Two tenants: a rate-limited one loading the agent, an unlimited one measuring
    /// latency (run on its own; see `qos.rs`).
    Qos,
    /// Three tenants (one encrypted) in a mixed loop for `--minutes`, sampling the
    /// agent's RSS, fds and regions (run on its own with `--agent-bin`; see `soak.rs`).
    Soak,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::SeqRead => "seq-read",
            Workload::SeqWrite => "seq-write",
            Workload::RandRead => "rand-read",
            Workload::Metadata => "metadata",
            Workload::Unet3d => "unet3d",
            Workload::Checkpoint => "checkpoint",
            Workload::Qos => "qos",
            Workload::Soak => "soak",
        }
    }
}

/// Options of `dpuio bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Workloads to run, in order.
    #[arg(value_enum, required = true)]
    pub workloads: Vec<Workload>,
    /// Block size in bytes (default: 1 MiB for seq-read, 4 KiB for rand-read).
    #[arg(long, value_parser = parse_bytes)]
    pub block_bytes: Option<u64>,
    /// Requests in flight (POSIX: this many threads).
    #[arg(long)]
    pub queue_depth: Option<usize>,
    /// Threads, each with its own ring and `--queue-depth` requests in flight (POSIX:
    /// threads x queue depth threads doing pread/pwrite).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Size of the benchmark file in the container.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    pub file_bytes: u64,
    /// Seconds per measurement; each path is measured `--rounds` times, interleaved.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Paths to compare: any of posix, shm (UCX shared memory), tcp (UCX TCP), ofi-shm,
    /// ofi-tcp (libfabric's shm and tcp providers), fuse (`dpuio mount` on a directory of
    /// its own, read by path: metadata and unet3d; its mount process's CPU counts as host
    /// CPU), preload (the POSIX code in a child process under libdpuio_preload.so, found
    /// beside dpuio-bench or at $DPUIO_PRELOAD_LIBRARY; its whole CPU counts as host CPU).
    #[arg(long, value_delimiter = ',', default_value = "posix,shm,tcp")]
    pub paths: Vec<String>,
    /// The container's directory on this machine (for the POSIX baseline on the same
    /// file), e.g. ./dpuio-data/containers/default. Without it the POSIX path is skipped.
    #[arg(long)]
    pub posix_root: Option<PathBuf>,
    /// The agent's backend: `local` (the baseline is POSIX on --posix-root) or `daos`
    /// (the baseline reads and writes the same DAOS file with libdfs in this process, the
    /// way pydaos does; needs --daos-pool and --daos-container).
    #[arg(long, value_enum, default_value_t = BenchBackend::Local)]
    pub backend: BenchBackend,
    /// daos: the pool (label or UUID) of the agent's `[backend]`.
    #[arg(long)]
    pub daos_pool: Option<String>,
    /// daos: the tenant's container label.
    #[arg(long)]
    pub daos_container: Option<String>,
    /// daos: the daos_agent's socket directory [default: $DAOS_AGENT_DRPC_DIR, else /var/run/daos_agent].
    #[arg(long)]
    pub daos_agent_socket_dir: Option<PathBuf>,
    /// The agent's process id, to report its CPU per GiB.
    #[arg(long)]
    pub agent_pid: Option<u32>,
    /// Also run every shim path as a second tenant, one whose files the agent stores
    /// encrypted: DIR holds that tenant's client bundle (ca.pem, client.pem, client.key,
    /// as `dpuctl cert issue --tenant NAME --out DIR` writes it). Its rows are named
    /// PATH+decrypt: the agent decrypts every block before it puts it into this host's
    /// memory. Both tenants get the same files; --posix-root stays the first tenant's.
    #[arg(long, value_name = "DIR")]
    pub encrypted_bundle: Option<PathBuf>,
    /// One JSON object per result on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write a PNG of throughput and host CPU per GiB, shim against POSIX.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Run as the preload path's child (set by `--paths preload`, not by hand): the
    /// POSIX code on --posix-root, which is DPUIO_MOUNT, its figures on stdout for the
    /// parent.
    #[arg(long, hide = true)]
    pub preload_child: bool,
    /// metadata: samples per batch in the batched 128 KiB sample row (a DataLoader batch:
    /// one submission and one wait per batch through the shim).
    #[arg(long, default_value_t = 16)]
    pub sample_batch: usize,
    /// metadata: files created, stated, listed and removed per path.
    #[arg(long, default_value_t = 2000)]
    pub metadata_files: usize,
    #[command(flatten)]
    pub unet3d: crate::dlio::Unet3dArgs,
    /// checkpoint: size of the checkpoint written and read back.
    #[arg(long, default_value = "512MiB", value_parser = parse_bytes)]
    pub checkpoint_bytes: u64,
    #[command(flatten)]
    pub qos: crate::qos::QosArgs,
    #[command(flatten)]
    pub soak: crate::soak::SoakArgs,
}

impl BenchArgs {
    /// The arguments of the preload path's child for `workload`: the POSIX code on
    /// `prefix` (its DPUIO_MOUNT), with this run's sizes and times.
    pub fn child_args(&self, workload: Workload, prefix: &str) -> Vec<String> {
        let mut a: Vec<String> = vec![workload.name().into(), "--paths".into(), "posix".into()];
        a.extend(["--posix-root".into(), prefix.into(), "--preload-child".into()]);
        let mut opt = |name: &str, value: String| a.extend([format!("--{name}"), value]);
        opt("file-bytes", self.file_bytes.to_string());
        opt("seconds", self.seconds.to_string());
        opt("rounds", self.rounds.to_string());
        opt("threads", self.threads.to_string());
        opt("metadata-files", self.metadata_files.to_string());
        opt("sample-batch", self.sample_batch.to_string());
        opt("checkpoint-bytes", self.checkpoint_bytes.to_string());
        if let Some(b) = self.block_bytes {
            opt("block-bytes", b.to_string());
        }
        if let Some(q) = self.queue_depth {
            opt("queue-depth", q.to_string());
        }
        if let Some(pid) = self.agent_pid {
            opt("agent-pid", pid.to_string());
        }
        a.extend(self.unet3d.to_args());
        a
    }
}

/// One measured cell.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Figures {
    pub workload: String,
    pub path: String,
    pub block_bytes: u64,
    pub queue_depth: usize,
    pub threads: usize,
    pub bytes: u64,
    pub ops: u64,
    pub wall: Duration,
    pub host_cpu: Duration,
    pub agent_cpu: Option<Duration>,
    pub latencies_us: Vec<u32>,
    /// unet3d: accelerator utilisation at the largest passing accelerator count.
    pub au: Option<f64>,
    /// unet3d: the most simulated accelerators kept at AU >= 90%.
    pub accelerators: Option<u32>,
}

impl Figures {
    pub fn gib_per_s(&self) -> f64 {
        self.bytes as f64 / GIB / self.wall.as_secs_f64()
    }
    pub fn iops(&self) -> f64 {
        self.ops as f64 / self.wall.as_secs_f64()
    }
    pub fn host_cpu_s_per_gib(&self) -> f64 {
        self.host_cpu.as_secs_f64() / (self.bytes as f64 / GIB)
    }
    pub fn agent_cpu_s_per_gib(&self) -> Option<f64> {
        self.agent_cpu.map(|c| c.as_secs_f64() / (self.bytes as f64 / GIB))
    }
    pub fn percentile_us(&self, p: f64) -> f64 {
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
        if other.au.is_some() {
            self.au = other.au;
            self.accelerators = other.accelerators;
        }
    }
}

/// CPU time of another process from /proc (user + system, clock ticks of 10 ms).
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

const BENCH_FILE: &str = "/.dpuio-bench/data";
/// Where the benchmarks keep their files in the container.
pub const BENCH_DIR: &str = "/.dpuio-bench";
/// The path name of `dpuio mount` in the figures.
pub const FUSE: &str = "fuse";
/// The path name of `libdpuio_preload.so` in the figures.
pub const PRELOAD: &str = "preload";

fn bench_error(reason: impl std::fmt::Display) -> dpuio_shim::Error {
    dpuio_shim::Error::DataPlane { op: "bench".into(), reason: reason.to_string() }
}

/// The suffix of the rows of the tenant with inline encryption (`--encrypted-bundle`).
pub const DECRYPT: &str = "+decrypt";

/// `--encrypted-bundle DIR`'s client, unless it attached as the tenant of the other rows
/// (which would label plain reads as decrypted).
fn encrypted_client(encrypted: Client, plain: &Client, dir: &Path) -> dpuio_shim::Result<Client> {
    if encrypted.tenant() != plain.tenant() {
        return Ok(encrypted);
    }
    Err(bench_error(format!(
        "--encrypted-bundle {}: attached as tenant {:?}, the tenant of the other rows; give the bundle of a tenant \
         with [tenants.encryption] (dpuctl cert issue --tenant NAME --out DIR). A plaintext agent (http://) \
         ignores bundles",
        dir.display(),
        encrypted.tenant()
    )))
}

/// What every workload needs: the shim clients, the POSIX root, the agent's pid.
pub struct Setup {
    pub clients: Vec<(String, Client)>,
    pub posix_root: Option<PathBuf>,
    /// `--backend daos`: the tenant's container mounted by libdfs in this process.
    pub dfs: Option<Arc<dyn dpuio_backend::Container>>,
    pub agent_pid: Option<u32>,
    /// The `fuse` path's mount, when asked for.
    pub fuse: Option<crate::fuse_path::FuseMount>,
    /// The name of the rows of the POSIX code on `posix_root`: `posix`, or `preload` in
    /// the preload path's child ([`crate::preload_path`]).
    pub posix_label: &'static str,
    pub progress: indicatif::MultiProgress,
}

impl Setup {
    /// CPU time of the host's side of `path` so far: this process, and for the fuse path
    /// the mount process too.
    pub fn host_cpu(&self, path: &str) -> Duration {
        let mount = self.fuse.as_ref().filter(|_| path == FUSE).and_then(|f| process_cpu(f.pid()));
        process_cpu_time() + mount.unwrap_or_default()
    }

    /// CPU time of the agent so far, when its pid is known.
    pub fn agent_cpu(&self) -> Option<Duration> {
        self.agent_pid.and_then(process_cpu)
    }

    /// The first client of each tenant (the `+decrypt` rows are a second tenant's): the
    /// workloads write their files through each, so every tenant reads the same bytes
    /// from its own container.
    pub fn writers(&self) -> impl Iterator<Item = &Client> {
        let plain = self.clients.first();
        let encrypted = self.clients.iter().find(|(name, _)| name.ends_with(DECRYPT));
        plain.into_iter().chain(encrypted).map(|(_, client)| client)
    }

    /// A spinner on stderr for one measurement.
    pub fn spinner(&self, message: String) -> indicatif::ProgressBar {
        let bar = self.progress.add(indicatif::ProgressBar::new_spinner());
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}").expect("a valid progress template"),
        );
        bar.set_message(message);
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    }
}

pub async fn run(options: &ConnectArgs, args: BenchArgs) -> dpuio_shim::Result<()> {
    if args.workloads.contains(&Workload::Soak) {
        if args.workloads.len() > 1 {
            return Err(bench_error(
                "soak starts an agent of its own: run it alone (dpuio bench soak --agent-bin ...)",
            ));
        }
        return crate::soak::run(options, &args.soak, args.qos.agent_bin.as_ref()).await;
    }
    if args.workloads.contains(&Workload::Qos) {
        if args.workloads.len() > 1 {
            return Err(bench_error("qos attaches as two tenants of its own: run it alone (dpuio bench qos)"));
        }
        return crate::qos::run(options, &args).await;
    }
    // `bundle`: the encrypted tenant's client bundle (--encrypted-bundle), else the
    // connection options' tenant.
    let connect = |transports: &str, bundle: Option<&Path>| {
        let mut connect = options.connect_options(&format!("dpuio bench ({transports})"));
        if let Some(dir) = bundle {
            connect.tls = dpuio_shim::TlsOptions {
                server_name: options.tls_server_name.clone(),
                ..dpuio_shim::TlsOptions::bundle(dir)
            };
        }
        Client::connect(ConnectOptions {
            data_plane: Some(DataPlaneOptions {
                transports: transports.to_owned(),
                rings: 8,
                interface: options.interface.clone(),
                ..Default::default()
            }),
            ..connect
        })
    };
    let mut clients = Vec::new();
    for path in &args.paths {
        let (label, transports) = match path.as_str() {
            "shm" | "ucx-shm" => ("shim-ucx-sm", "ucx-shm"),
            "tcp" | "ucx-tcp" => ("shim-ucx-tcp", "ucx-tcp"),
            "ofi-shm" => ("shim-ofi-shm", "ofi-shm"),
            "ofi-tcp" => ("shim-ofi-tcp", "ofi-tcp"),
            "posix" | "fuse" | "preload" => continue,
            other => {
                return Err(bench_error(format!(
                    "unknown path {other:?}; use posix, shm, tcp, ofi-shm, ofi-tcp, fuse or preload"
                )));
            }
        };
        let client = connect(transports, None).await?;
        // The encrypted tenant's row right after the plain one, measured in turn.
        let encrypted = match &args.encrypted_bundle {
            Some(dir) => Some(encrypted_client(connect(transports, Some(dir)).await?, &client, dir)?),
            None => None,
        };
        clients.push((label.to_owned(), client));
        clients.extend(encrypted.map(|c| (format!("{label}{DECRYPT}"), c)));
    }
    if clients.is_empty() && !args.preload_child {
        return Err(bench_error(
            "name at least one of shm, tcp, ofi-shm, ofi-tcp in --paths (it writes the files every path reads)",
        ));
    }
    let fuse = match args.paths.iter().any(|p| p == "fuse") {
        true => Some(crate::fuse_path::FuseMount::start(options).map_err(bench_error)?),
        false => None,
    };
    let preload = match args.paths.iter().any(|p| p == PRELOAD) {
        true => Some(crate::preload_path::PreloadPath::find().map_err(bench_error)?),
        false => None,
    };
    let posix_root = match (&args.posix_root, args.paths.iter().any(|p| p == "posix")) {
        (Some(root), true) => Some(root.clone()),
        (None, true) => {
            eprintln!("dpuio bench: POSIX baseline skipped: pass --posix-root <container directory>");
            None
        }
        _ => None,
    };
    let dfs = match args.backend {
        BenchBackend::Local => None,
        BenchBackend::Daos => Some(mount_dfs(&args)?),
    };
    let posix_root = if dfs.is_some() {
        if posix_root.is_some() {
            return Err(bench_error("--posix-root is for --backend local; over DAOS the baseline is libdfs"));
        }
        None
    } else {
        posix_root
    };
    let progress = indicatif::MultiProgress::new();
    if args.json {
        progress.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let posix_label = if args.preload_child { PRELOAD } else { "posix" };
    let setup = Setup { clients, posix_root, dfs, agent_pid: args.agent_pid, fuse, posix_label, progress };
    if !args.json && !args.preload_child {
        let mut paths: Vec<&str> = Vec::new();
        paths.extend(setup.posix_root.as_ref().map(|_| posix_label));
        paths.extend(setup.dfs.as_ref().map(|_| LIBDFS));
        paths.extend(setup.clients.iter().map(|(name, _)| name.as_str()));
        paths.extend(setup.fuse.as_ref().map(|_| FUSE));
        paths.extend(preload.as_ref().map(|_| PRELOAD));
        crate::report::legend(&paths, args.agent_pid.is_some());
    }
    let mut all: Vec<Figures> = Vec::new();
    for &workload in &args.workloads {
        let figures = match workload {
            Workload::SeqRead | Workload::RandRead | Workload::SeqWrite => {
                block_workload(&setup, &args, workload).await?
            }
            Workload::Metadata => metadata(&setup, args.metadata_files, args.seconds, args.sample_batch).await?,
            Workload::Unet3d => crate::dlio::unet3d(&setup, &args.unet3d).await?,
            Workload::Checkpoint => checkpoint(&setup, args.checkpoint_bytes).await?,
            Workload::Qos => return Err(bench_error("qos runs on its own")), // handled above
            Workload::Soak => return Err(bench_error("soak runs on its own")), // handled above
        };
        let mut figures = figures;
        if let Some(preload) = &preload {
            let bar = setup.spinner(format!("{} {PRELOAD} (a child process)", workload.name()));
            figures.extend(preload.run(options, &args, workload).map_err(bench_error)?);
            bar.finish_and_clear();
        }
        if args.preload_child {
            crate::preload_path::send(&figures);
            continue;
        }
        crate::report::report(&figures, &args);
        all.extend(figures);
    }
    if !args.json && !args.preload_child {
        crate::report::summary(&all, args.agent_pid.is_some());
    }
    if let Some(path) = &args.plot {
        crate::plot::plot(&all, path).map_err(bench_error)?;
        if !args.json {
            println!("plot written to {}", path.display());
        }
    }
    for (_, c) in setup.clients {
        c.detach().await?;
    }
    Ok(())
}

/// `--backend daos`: mount the tenant's container with libdfs in this process.
fn mount_dfs(args: &BenchArgs) -> dpuio_shim::Result<Arc<dyn dpuio_backend::Container>> {
    use dpuio_backend::Backend;
    let (Some(pool), Some(container)) = (&args.daos_pool, &args.daos_container) else {
        return Err(bench_error(
            "--backend daos needs --daos-pool and --daos-container (the agent's pool and the tenant's container label)",
        ));
    };
    let backend = dpuio_daos::DaosBackend::open(dpuio_daos::DaosOptions {
        pool: pool.clone(),
        system: "daos_server".into(),
        agent_socket_dir: args.daos_agent_socket_dir.clone().unwrap_or_else(dpuio_daos::default_agent_socket_dir),
        create_containers: false,
        chunk_bytes: dpuio_daos::DEFAULT_CHUNK_BYTES,
        object_class: String::new(),
    })
    .map_err(|e| bench_error(format!("libdfs baseline: {e}")))?;
    backend.mount(container, false).map_err(|e| bench_error(format!("libdfs baseline: {e}")))
}

/// seq-read, seq-write, rand-read: rounds of one cell per path, interleaved.
async fn block_workload(setup: &Setup, args: &BenchArgs, workload: Workload) -> dpuio_shim::Result<Vec<Figures>> {
    let block = args.block_bytes.unwrap_or(match workload {
        Workload::RandRead => 4096,
        _ => 1 << 20,
    });
    let qd = args.queue_depth.unwrap_or(match workload {
        Workload::RandRead => 32,
        _ => 1,
    });
    let threads = args.threads;
    if block == 0 || qd == 0 || threads == 0 || args.file_bytes < block {
        return Err(bench_error(
            "block size, queue depth and threads must be positive and the file at least one block",
        ));
    }
    let file_bytes = args.file_bytes - args.file_bytes % block;
    for client in setup.writers() {
        prepare_file(client, file_bytes).await?;
    }
    let baseline_file: Option<(&str, Arc<dyn BaselineFile>)> = match (&setup.posix_root, &setup.dfs) {
        (Some(root), _) => {
            let path = root.join(BENCH_FILE.trim_start_matches('/'));
            let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(|e| {
                bench_error(format!(
                    "open {} for the POSIX baseline: {e} (is --posix-root the container's directory?)",
                    path.display()
                ))
            })?;
            // Warm the page cache, so every path reads the same cached file.
            let mut buf = vec![0u8; 4 << 20];
            let mut at = 0;
            while at < file_bytes {
                at += file.read_at(&mut buf, at).unwrap_or(0).max(1) as u64;
            }
            Some((setup.posix_label, Arc::new(file)))
        }
        (None, Some(dfs)) => {
            let path = dpuio_backend::NsPath::parse(BENCH_FILE).map_err(bench_error)?;
            let options = dpuio_backend::OpenOptions { write: true, ..Default::default() };
            let object = dfs.open(&path, options, 0).map_err(|e| bench_error(format!("libdfs baseline: {e}")))?;
            Some((LIBDFS, Arc::new(DfsFile(object))))
        }
        (None, None) => None,
    };
    let duration = Duration::from_secs_f64(args.seconds);
    let mut totals: Vec<Figures> = Vec::new();
    for round in 0..args.rounds {
        let mut cells = Vec::new();
        if let Some((name, f)) = &baseline_file {
            let bar = setup.spinner(format!("{} {name}, round {}", workload.name(), round + 1));
            let f = f.clone();
            let pid = setup.agent_pid;
            let mut fig = tokio::task::spawn_blocking(move || {
                posix_cell(&*f, workload, block, qd * threads, file_bytes, duration, round as u64, pid)
            })
            .await
            .map_err(bench_error)?;
            bar.finish_and_clear();
            fig.path = (*name).into();
            cells.push(fig);
        }
        for (name, client) in &setup.clients {
            let bar = setup.spinner(format!("{} {name}, round {}", workload.name(), round + 1));
            let mut fig =
                shim_cell(client, workload, block, qd, threads, file_bytes, duration, round as u64, setup.agent_pid)
                    .await?;
            bar.finish_and_clear();
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
    Ok(totals)
}

/// The metadata rows through std::fs on `root` (the container's directory, or the fuse
/// path's mount of it), labelled `path`.
fn fs_metadata(
    setup: &Setup,
    root: &Path,
    path: &str,
    files: usize,
    seconds: f64,
    sample_batch: usize,
) -> dpuio_shim::Result<Vec<Figures>> {
    let mut out = Vec::new();
    let bar = setup.spinner(format!("metadata {path}"));
    let dir = root.join(BENCH_DIR.trim_start_matches('/')).join(format!("meta-{path}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(bench_error)?;
    let names: Vec<PathBuf> = (0..files).map(|i| dir.join(format!("f{i:07}"))).collect();
    let steps: [(&str, &dyn Fn() -> std::io::Result<()>); 4] = [
        ("create", &|| names.iter().try_for_each(|n| std::fs::File::create_new(n).map(drop))),
        ("stat", &|| names.iter().try_for_each(|n| std::fs::metadata(n).map(drop))),
        ("readdir", &|| std::fs::read_dir(&dir)?.try_for_each(|e| e.and_then(|e| e.metadata()).map(drop))),
        ("remove", &|| names.iter().try_for_each(std::fs::remove_file)),
    ];
    for (op, step) in steps {
        let meter = Meter::start(setup, path);
        step().map_err(|e| bench_error(format!("{path} metadata {op}: {e}")))?;
        out.push(meter.finish(&format!("metadata-{op}"), files as u64, 0));
    }
    // Small-file samples: open + read + close of a whole 128 KiB file each.
    let data = sample_bytes();
    let samples: Vec<PathBuf> = (0..sample_count(files)).map(|i| dir.join(format!("s{i:05}"))).collect();
    for n in &samples {
        std::fs::write(n, &data).map_err(bench_error)?;
    }
    let read = |n: &PathBuf| -> dpuio_shim::Result<()> {
        let got = std::fs::read(n).map_err(|e| bench_error(format!("{path} sample read: {e}")))?;
        std::hint::black_box(&got);
        Ok(())
    };
    let meter = Meter::start(setup, path);
    let ops = passes(seconds, samples.len(), || samples.iter().try_for_each(read))?;
    out.push(meter.finish(SAMPLE_WORKLOAD, ops, ops * SAMPLE_BYTES as u64));
    // The same samples a loader's batch at a time: POSIX has no batched open-read, so
    // each is still its own open, read and close.
    let meter = Meter::start(setup, path);
    let ops = passes(seconds, samples.len(), || {
        samples.chunks(sample_batch).try_for_each(|batch| batch.iter().try_for_each(read))
    })?;
    out.push(meter.finish(&sample_batch_workload(sample_batch), ops, ops * SAMPLE_BYTES as u64));
    let _ = std::fs::remove_dir_all(&dir);
    bar.finish_and_clear();
    Ok(out)
}

/// Files per second for create, stat, readdir and remove, through the shim's namespace
/// calls and through std::fs on the container's directory.
async fn metadata(setup: &Setup, files: usize, seconds: f64, sample_batch: usize) -> dpuio_shim::Result<Vec<Figures>> {
    if sample_batch == 0 {
        return Err(bench_error("--sample-batch must be at least 1"));
    }
    let mut out = Vec::new();
    if let Some(root) = &setup.posix_root {
        out.extend(fs_metadata(setup, root, setup.posix_label, files, seconds, sample_batch)?);
    }
    if let Some(mount) = &setup.fuse {
        out.extend(fs_metadata(setup, &mount.dir, FUSE, files, seconds, sample_batch)?);
    }
    if let Some(dfs) = &setup.dfs {
        let bar = setup.spinner(format!("metadata {LIBDFS}"));
        out.extend(dfs_metadata(setup, &**dfs, files).map_err(|e| bench_error(format!("libdfs metadata: {e}")))?);
        bar.finish_and_clear();
    }
    for (name, client) in &setup.clients {
        let bar = setup.spinner(format!("metadata {name}"));
        let dir = format!("{BENCH_DIR}/meta-{name}");
        let _ = client.remove(&dir, true).await;
        client.mkdir(&dir, true).await?;
        let names: Vec<String> = (0..files).map(|i| format!("{dir}/f{i:07}")).collect();
        for op in ["create", "stat", "readdir", "remove"] {
            let meter = Meter::start(setup, name);
            match op {
                "create" => {
                    for n in &names {
                        client.create(n, true).await?.close().await?;
                    }
                }
                "stat" => {
                    for n in &names {
                        client.stat(n).await?;
                    }
                }
                "readdir" => {
                    let listed = client.readdir(&dir).await?.len();
                    if listed != files {
                        return Err(bench_error(format!("readdir listed {listed} of {files} files")));
                    }
                }
                _ => {
                    for n in &names {
                        client.remove(n, false).await?;
                    }
                }
            }
            out.push(meter.finish(&format!("metadata-{op}"), files as u64, 0));
        }
        // Small-file samples: one open-read submission each, into a registered region
        // (no byte through this process's CPU).
        let mut region = client.register_region(SAMPLE_BYTES + 4096, dpuio_shim::RegionAccess::ReadWrite).await?;
        region.write_at(0, &sample_bytes());
        let samples: Vec<String> = (0..sample_count(files)).map(|i| format!("{dir}/s{i:05}")).collect();
        for n in &samples {
            let f = client.create(n, true).await?;
            f.write_at(&region, SAMPLE_BYTES as u64, 0)?;
            f.close().await?;
        }
        let meter = Meter::start(setup, name);
        let ops = passes(seconds, samples.len(), || {
            samples.iter().try_for_each(|n| {
                let (_, read) = client.read_sample(n, &region, 0, (SAMPLE_BYTES + 4096) as u32)?;
                match read == SAMPLE_BYTES as u64 {
                    true => Ok(()),
                    false => Err(bench_error(format!("sample {n}: read {read} of {SAMPLE_BYTES} bytes"))),
                }
            })
        })?;
        out.push(meter.finish(SAMPLE_WORKLOAD, ops, ops * SAMPLE_BYTES as u64));
        // A loader's batch at a time: one submission of sample_batch open-reads, each
        // into its own range of one region, and one wait (Client::read_samples).
        let slot = (SAMPLE_BYTES + 4096) as u64;
        let batch_region =
            client.register_region(sample_batch * slot as usize, dpuio_shim::RegionAccess::ReadWrite).await?;
        let meter = Meter::start(setup, name);
        let ops = passes(seconds, samples.len(), || {
            samples.chunks(sample_batch).try_for_each(|batch| {
                let wanted: Vec<(&str, u64, u32)> =
                    batch.iter().enumerate().map(|(i, n)| (n.as_str(), i as u64 * slot, slot as u32)).collect();
                for (n, read) in batch.iter().zip(client.read_samples(&batch_region, &wanted)?) {
                    let (_, read) = read?;
                    if read != SAMPLE_BYTES as u64 {
                        return Err(bench_error(format!("sample {n}: read {read} of {SAMPLE_BYTES} bytes")));
                    }
                }
                Ok(())
            })
        })?;
        out.push(meter.finish(&sample_batch_workload(sample_batch), ops, ops * SAMPLE_BYTES as u64));
        let _ = client.remove(&dir, true).await;
        client.deregister_region(batch_region).await?;
        client.deregister_region(region).await?;
        bar.finish_and_clear();
    }
    Ok(out)
}

/// The small-file sample row of the metadata workload: a whole 128 KiB file opened,
/// read and closed per operation (a training sample).
pub const SAMPLE_WORKLOAD: &str = "metadata-sample128k";
const SAMPLE_BYTES: usize = 128 * 1024;
/// The same samples read a loader's batch (`--sample-batch`) at a time.
fn sample_batch_workload(batch: usize) -> String {
    format!("{SAMPLE_WORKLOAD}-batch{batch}")
}

/// Run `pass` (one pass over `per_pass` samples) until `seconds` have passed, at least
/// once; the samples read.
fn passes(seconds: f64, per_pass: usize, mut pass: impl FnMut() -> dpuio_shim::Result<()>) -> dpuio_shim::Result<u64> {
    let (start, mut done) = (Instant::now(), 0u64);
    loop {
        pass()?;
        done += per_pass as u64;
        if start.elapsed().as_secs_f64() >= seconds {
            return Ok(done);
        }
    }
}

fn sample_count(files: usize) -> usize {
    files.clamp(1, 1000)
}

fn sample_bytes() -> Vec<u8> {
    (0..SAMPLE_BYTES).map(|i| (i * 7 + 3) as u8).collect()
}

/// BENCH_DIR in the container, through libdfs.
fn ensure_bench_dir(dfs: &dyn dpuio_backend::Container) -> dpuio_backend::Result<()> {
    let dir = dpuio_backend::NsPath::parse(BENCH_DIR)?;
    match dfs.mkdir(&dir, 0o755) {
        Ok(_) | Err(dpuio_backend::Error::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The metadata steps with libdfs in this process (`--backend daos`): the same names and
/// calls as the shim's, one blocking DFS call each.
fn dfs_metadata(
    setup: &Setup,
    dfs: &dyn dpuio_backend::Container,
    files: usize,
) -> dpuio_backend::Result<Vec<Figures>> {
    use dpuio_backend::{NsPath, OpenOptions};
    let dir = NsPath::parse(&format!("{BENCH_DIR}/meta-{LIBDFS}"))?;
    let _ = dfs.remove(&dir, true);
    ensure_bench_dir(dfs)?;
    dfs.mkdir(&dir, 0o755)?;
    let names: Vec<NsPath> = (0..files).map(|i| dir.join(&format!("f{i:07}"))).collect::<Result<_, _>>()?;
    let create = OpenOptions { write: true, create: true, exclusive: true, ..OpenOptions::default() };
    let mut out = Vec::new();
    for op in ["create", "stat", "readdir", "remove"] {
        let meter = Meter::start(setup, LIBDFS);
        match op {
            "create" => names.iter().try_for_each(|n| dfs.open(n, create, 0o644).map(drop))?,
            "stat" => names.iter().try_for_each(|n| dfs.stat(n).map(drop))?,
            "readdir" => {
                let (mut listed, mut anchor) = (0, None::<String>);
                loop {
                    let (entries, next) = dfs.readdir(&dir, anchor.as_deref(), 4096)?;
                    listed += entries.len();
                    match next {
                        Some(next) => anchor = Some(next),
                        None => break,
                    }
                }
                if listed != files {
                    return Err(dpuio_backend::Error::InvalidArgument(format!("listed {listed} of {files} files")));
                }
            }
            _ => names.iter().try_for_each(|n| dfs.remove(n, false))?,
        }
        out.push(meter.finish(&format!("metadata-{op}"), files as u64, 0));
    }
    Ok(out)
}

/// Wall clock, host CPU and agent CPU started together, for one measured step.
struct Meter<'a> {
    setup: &'a Setup,
    path: &'a str,
    cpu0: Duration,
    agent0: Option<Duration>,
    t0: Instant,
}

impl<'a> Meter<'a> {
    /// Figures of `path` from now (its host CPU as [`Setup::host_cpu`] counts it).
    fn start(setup: &'a Setup, path: &'a str) -> Self {
        Meter { setup, path, cpu0: setup.host_cpu(path), agent0: setup.agent_cpu(), t0: Instant::now() }
    }

    fn finish(self, workload: &str, ops: u64, bytes: u64) -> Figures {
        Figures {
            workload: workload.to_owned(),
            path: self.path.to_owned(),
            ops,
            bytes,
            wall: self.t0.elapsed(),
            host_cpu: self.setup.host_cpu(self.path).saturating_sub(self.cpu0),
            agent_cpu: self.agent0.and_then(|a0| self.setup.agent_cpu().map(|a1| a1.saturating_sub(a0))),
            ..Figures::default()
        }
    }
}

/// Write a checkpoint in chunks and make it durable (fsync / Close), then read it back.
async fn checkpoint(setup: &Setup, bytes: u64) -> dpuio_shim::Result<Vec<Figures>> {
    const CHUNK: u64 = 8 << 20;
    const DEPTH: usize = 4;
    let bytes = bytes.max(CHUNK) / CHUNK * CHUNK;
    let mut out = Vec::new();
    let mut data = vec![0u8; CHUNK as usize];
    rand::rngs::StdRng::seed_from_u64(9).fill(&mut data[..]);
    if let Some(root) = &setup.posix_root {
        let label = setup.posix_label;
        let bar = setup.spinner(format!("checkpoint {label}"));
        // ext4's ordered journal makes an fsync also write out earlier dirty data: start
        // every path's checkpoint from a clean page cache.
        rustix::fs::sync();
        let path = root.join(BENCH_DIR.trim_start_matches('/')).join(format!("checkpoint-{label}.pt"));
        let meter = Meter::start(setup, label);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(bench_error)?;
        for i in 0..bytes / CHUNK {
            f.write_all_at(&data, i * CHUNK).map_err(bench_error)?;
        }
        f.sync_all().map_err(bench_error)?;
        out.push(meter.finish("checkpoint-write", bytes / CHUNK, bytes));
        let meter = Meter::start(setup, label);
        let mut buf = vec![0u8; CHUNK as usize];
        for i in 0..bytes / CHUNK {
            f.read_exact_at(&mut buf, i * CHUNK).map_err(bench_error)?;
        }
        out.push(meter.finish("checkpoint-read", bytes / CHUNK, bytes));
        let _ = std::fs::remove_file(&path);
        bar.finish_and_clear();
    }
    if let Some(dfs) = &setup.dfs {
        // libdfs in this process: the same chunks, dfs_write then dfs_read, one at a time
        // (a DFS write is durable when it returns; the sync is DFS's no-op).
        use dpuio_backend::{NsPath, OpenOptions};
        let bar = setup.spinner(format!("checkpoint {LIBDFS}"));
        let fail = |e: dpuio_backend::Error| bench_error(format!("libdfs checkpoint: {e}"));
        let path = NsPath::parse(&format!("{BENCH_DIR}/checkpoint-{LIBDFS}.pt")).map_err(fail)?;
        ensure_bench_dir(&**dfs).map_err(fail)?;
        let meter = Meter::start(setup, LIBDFS);
        let create = OpenOptions { write: true, create: true, truncate: true, ..OpenOptions::default() };
        let f = dfs.open(&path, create, 0o644).map_err(fail)?;
        for i in 0..bytes / CHUNK {
            f.write_at(&data, i * CHUNK).map_err(fail)?;
        }
        f.sync().map_err(fail)?;
        out.push(meter.finish("checkpoint-write", bytes / CHUNK, bytes));
        let meter = Meter::start(setup, LIBDFS);
        let mut buf = vec![0u8; CHUNK as usize];
        for i in 0..bytes / CHUNK {
            if f.read_at(&mut buf, i * CHUNK).map_err(fail)? != CHUNK as usize {
                return Err(bench_error("libdfs checkpoint: short read"));
            }
        }
        out.push(meter.finish("checkpoint-read", bytes / CHUNK, bytes));
        drop(f);
        let _ = dfs.remove(&path, false);
        bar.finish_and_clear();
    }
    for (name, client) in &setup.clients {
        let bar = setup.spinner(format!("checkpoint {name}"));
        rustix::fs::sync();
        let path = format!("{BENCH_DIR}/checkpoint-{name}.pt");
        let mut regions = Vec::new();
        for _ in 0..DEPTH {
            let mut r = client.register_region(CHUNK as usize, RegionAccess::ReadWrite).await?;
            r.write_at(0, &data);
            regions.push(r);
        }
        let meter = Meter::start(setup, name);
        let file = client.create(&path, false).await?;
        let requests: Vec<_> =
            (0..bytes / CHUNK).map(|i| file.write_request(&regions[i as usize % DEPTH], 0, CHUNK, i * CHUNK)).collect();
        run_waves(client, requests, DEPTH).await?;
        file.close().await?; // durable once Close returns (the agent fsyncs)
        out.push(meter.finish("checkpoint-write", bytes / CHUNK, bytes));
        let meter = Meter::start(setup, name);
        let file = client.open(&path, Access::ReadOnly).await?;
        let requests: Vec<_> =
            (0..bytes / CHUNK).map(|i| file.read_request(&regions[i as usize % DEPTH], 0, CHUNK, i * CHUNK)).collect();
        run_waves(client, requests, DEPTH).await?;
        file.close().await?;
        out.push(meter.finish("checkpoint-read", bytes / CHUNK, bytes));
        client.remove(&path, false).await?;
        for r in regions {
            client.deregister_region(r).await?;
        }
        bar.finish_and_clear();
    }
    Ok(out)
}

/// Run requests `depth` at a time (each wave waits for all of its requests).
async fn run_waves(client: &Client, requests: Vec<dpuio_shim::Request>, depth: usize) -> dpuio_shim::Result<()> {
    let c = client.clone();
    tokio::task::spawn_blocking(move || -> dpuio_shim::Result<()> {
        for wave in requests.chunks(depth) {
            for d in c.submit_blocking(wave)? {
                d.result.map_err(|status| dpuio_shim::Error::Io { op: "bench".into(), status })?;
            }
        }
        Ok(())
    })
    .await
    .map_err(bench_error)?
}

/// Create the benchmark file through the shim unless it already has the right size.
async fn prepare_file(client: &Client, file_bytes: u64) -> dpuio_shim::Result<()> {
    if let Ok(a) = client.stat(BENCH_FILE).await
        && a.size == file_bytes
    {
        return Ok(());
    }
    client.mkdir("/.dpuio-bench", true).await?;
    let file = client.create(BENCH_FILE, false).await?;
    const CHUNK: u64 = 4 << 20;
    let mut region = client.register_region(CHUNK as usize, RegionAccess::ReadByAgent).await?;
    let mut bytes = vec![0u8; region.len()];
    rand::rngs::StdRng::seed_from_u64(1).fill(&mut bytes[..]);
    region.write_at(0, &bytes);
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
    if workload == Workload::RandRead { rng.random_range(0..blocks) * block } else { (i % blocks) * block }
}

#[allow(clippy::too_many_arguments)]
fn posix_cell(
    file: &dyn BaselineFile,
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
                        let _ = if workload == Workload::SeqWrite {
                            file.write_block(&buf, at)
                        } else {
                            file.read_block(&mut buf, at)
                        };
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
        workload: workload.name().into(),
        block_bytes: block,
        queue_depth: qd,
        threads: 1,
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
    threads: usize,
    file_bytes: u64,
    duration: Duration,
    seed: u64,
    agent_pid: Option<u32>,
) -> dpuio_shim::Result<Figures> {
    let writing = workload == Workload::SeqWrite;
    let file = client.open(BENCH_FILE, if writing { Access::ReadWrite } else { Access::ReadOnly }).await?;
    let mut regions = Vec::with_capacity(qd * threads);
    for _ in 0..qd * threads {
        regions.push(client.register_region(block as usize, RegionAccess::ReadWrite).await?);
    }
    let requests: Vec<_> = regions
        .iter()
        .map(|r| if writing { file.write_request(r, 0, block, 0) } else { file.read_request(r, 0, block, 0) })
        .collect();
    let c = client.clone();
    let fig = tokio::task::spawn_blocking(move || -> dpuio_shim::Result<Figures> {
        let cpu0 = process_cpu_time();
        let agent0 = agent_pid.and_then(process_cpu);
        let start = Instant::now();
        let per_thread: Vec<dpuio_shim::Result<(u64, Vec<u32>)>> = std::thread::scope(|s| {
            let handles: Vec<_> = requests
                .chunks(qd)
                .enumerate()
                .map(|(t, mine)| {
                    let c = &c;
                    s.spawn(move || {
                        ring_loop(
                            c,
                            mine,
                            workload,
                            block,
                            file_bytes,
                            duration,
                            start,
                            seed * 1000 + t as u64,
                            t,
                            threads,
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(bench_error("bench thread panicked"))))
                .collect()
        });
        let wall = start.elapsed();
        let mut ops = 0;
        let mut lat = Vec::new();
        for r in per_thread {
            let (n, l) = r?;
            ops += n;
            lat.extend(l);
        }
        Ok(Figures {
            workload: workload.name().into(),
            block_bytes: block,
            queue_depth: qd,
            threads,
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

/// One thread's share of a shim cell: its own ring, `requests.len()` requests kept in
/// flight (slot k's request uses region k) until `duration` has passed.
#[allow(clippy::too_many_arguments)]
fn ring_loop(
    c: &Client,
    requests: &[dpuio_shim::Request],
    workload: Workload,
    block: u64,
    file_bytes: u64,
    duration: Duration,
    start: Instant,
    seed: u64,
    thread: usize,
    threads: usize,
) -> dpuio_shim::Result<(u64, Vec<u32>)> {
    let mut batch = c.batch()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed + 77);
    let qd = requests.len();
    let mut sent_at = vec![Instant::now(); qd];
    let mut lat = Vec::new();
    // Sequential workloads: thread t reads blocks t, t + threads, ... in order.
    let mut i = thread as u64;
    let step = threads as u64;
    for (k, base) in requests.iter().enumerate() {
        let at = offset(workload, i, block, file_bytes, &mut rng);
        i += step;
        batch.push(&dpuio_shim::Request { file_offset: at, user_data: k as u64, ..*base })?;
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
            d.result.map_err(|status| dpuio_shim::Error::Io { op: format!("bench {}", workload.name()), status })?;
            ops += 1;
            lat.push((now - sent_at[k]).as_micros() as u32);
            if keep_going {
                let at = offset(workload, i, block, file_bytes, &mut rng);
                i += step;
                batch.push(&dpuio_shim::Request { file_offset: at, user_data: k as u64, ..requests[k] })?;
                sent_at[k] = Instant::now();
            }
        }
        batch.submit()?;
    }
    Ok((ops, lat))
}

/// The path name of the libdfs baseline (`--backend daos`).
pub const LIBDFS: &str = "libdfs";
