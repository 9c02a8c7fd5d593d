//! The options of `dpuio bench`: the workloads', and those of `qos` and `soak`, which
//! run on their own. The bottom room of this program: every other one may read them.

use std::path::PathBuf;

use dpuio_bench_core::unet3d::Unet3dArgs;
use dpuio_bench_core::{Workload, parse_bytes};

/// Which backend the agent under test runs, hence which baseline is fair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchBackend {
    Local,
    Daos,
}

/// The paths whose POSIX code runs in a child process under a preloaded library.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ChildPath {
    /// dpuio's `libdpuio_preload.so`.
    Preload,
    /// DAOS's `libpil4dfs.so` on a dfuse mount.
    Pil4dfs,
}

impl ChildPath {
    /// The name of its rows (as in --paths).
    pub fn name(self) -> &'static str {
        match self {
            ChildPath::Preload => "preload",
            ChildPath::Pil4dfs => "pil4dfs",
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
    /// Paths to compare: any of posix, shm (or shim: UCX shared memory), tcp (UCX TCP), ofi-shm,
    /// ofi-tcp (libfabric's shm and tcp providers), fuse (`dpuio mount` on a directory of
    /// its own, the POSIX code on it; its mount process's CPU counts as host CPU), preload (the POSIX code in a child process under libdpuio_preload.so, found
    /// beside dpuio-bench or at $DPUIO_PRELOAD_LIBRARY; its whole CPU counts as host CPU),
    /// tcp-stream (seq-read: one plain TCP stream on the path to the agent's address, the
    /// bar of the TCP transports; see --stream-source). With --backend daos also DAOS's
    /// own host clients on the same container and files: libdfs (always run over DAOS),
    /// dfuse (DAOS's FUSE daemon mounting the container, the POSIX code on the mount, the
    /// daemon's CPU counted as host CPU; $DPUIO_DFUSE, else dfuse on PATH, else
    /// /opt/daos/bin/dfuse) and pil4dfs (the POSIX code in a child under DAOS's
    /// libpil4dfs.so on that dfuse mount, its whole CPU and the daemon's counted;
    /// $DPUIO_PIL4DFS_LIBRARY, else libpil4dfs.so beside dfuse's lib64).
    #[arg(long, value_delimiter = ',', default_value = "posix,shm,tcp")]
    pub paths: Vec<String>,
    /// tcp-stream: the address of a `dpuio-bench stream-source` started beside the agent
    /// (when the agent is in another network namespace or machine); without it the
    /// source is a thread of this program listening on the agent's host address.
    #[arg(long, value_name = "HOST:PORT")]
    pub stream_source: Option<String>,
    /// The container's directory on this machine (for the POSIX baseline on the same
    /// file), e.g. ./dpuio-data/containers/default. Without it the POSIX path is skipped.
    #[arg(long)]
    pub posix_root: Option<PathBuf>,
    /// The agent's backend: `local` (the baseline is POSIX on --posix-root) or `daos`
    /// (the baseline reads and writes the same DAOS file with libdfs, the way pydaos
    /// does, in a dpuio-bench-agent found beside dpuio-bench or at $DPUIO_BENCH_AGENT;
    /// needs --daos-pool and --daos-container).
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
    /// Run as a child of the preload or pil4dfs path (set by `--paths preload` or
    /// `--paths pil4dfs`, not by hand): the POSIX code on --posix-root (DPUIO_MOUNT, or
    /// the dfuse mount libpil4dfs intercepts), its rows named after the path, its
    /// figures on stdout for the parent.
    #[arg(long, hide = true, value_enum, value_name = "PATH")]
    pub preload_child: Option<ChildPath>,
    /// A child's: another process whose CPU time counts as this path's host CPU (the
    /// pil4dfs child's: the dfuse daemon, which serves what libpil4dfs passes through).
    #[arg(long, hide = true, value_name = "PID")]
    pub host_cpu_pid: Option<u32>,
    /// dfuse: mount with DAOS's caching on (dfuse's default: the kernel's page cache and
    /// dentry cache). Off by default, so that the dfuse rows read DAOS as every other
    /// path does, not this machine's page cache.
    #[arg(long)]
    pub dfuse_caching: bool,
    /// metadata: samples per batch in the batched 128 KiB sample row (a DataLoader batch:
    /// one submission and one wait per batch through the shim).
    #[arg(long, default_value_t = 16)]
    pub sample_batch: usize,
    /// metadata: files created, stated, listed and removed per path.
    #[arg(long, default_value_t = 2000)]
    pub metadata_files: usize,
    #[command(flatten)]
    pub unet3d: Unet3dArgs,
    /// checkpoint: size of the checkpoint written and read back.
    #[arg(long, default_value = "512MiB", value_parser = parse_bytes)]
    pub checkpoint_bytes: u64,
    #[command(flatten)]
    pub qos: QosArgs,
    #[command(flatten)]
    pub soak: SoakArgs,
    #[command(flatten)]
    pub startup: StartupArgs,
}

impl BenchArgs {
    /// The arguments of a child of the preload or pil4dfs `path` for `workload`: the
    /// POSIX code on `prefix` (DPUIO_MOUNT, or the dfuse mount), with this run's sizes
    /// and times; `host_cpu_pid`'s CPU counts as the child's host CPU too.
    pub fn child_args(
        &self,
        workload: Workload,
        prefix: &str,
        path: ChildPath,
        host_cpu_pid: Option<u32>,
    ) -> Vec<String> {
        let mut a: Vec<String> = vec![workload.name().into(), "--paths".into(), "posix".into()];
        a.extend(["--posix-root".into(), prefix.into(), "--preload-child".into(), path.name().into()]);
        if let Some(pid) = host_cpu_pid {
            a.extend(["--host-cpu-pid".into(), pid.to_string()]);
        }
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

/// Options of `dpuio bench qos`.
#[derive(clap::Args, Debug, Clone)]
pub struct QosArgs {
    /// qos, soak: start this dpu-agent binary with a generated config (qos: two tenants,
    /// instead of using --agent; soak: three, one encrypted; soak needs it).
    #[arg(long)]
    pub agent_bin: Option<PathBuf>,
    /// qos: tenant A's bytes per second (the limit written into the generated config,
    /// or the one the --agent is configured with).
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    pub qos_limit: u64,
    /// qos: tenant A's burst (generated config only).
    #[arg(long, default_value = "4MiB", value_parser = parse_bytes)]
    pub qos_burst: u64,
    /// qos: the rate-limited tenant.
    #[arg(long, default_value = "a")]
    pub qos_tenant_a: String,
    /// qos: the unlimited tenant that measures latency.
    #[arg(long, default_value = "b")]
    pub qos_tenant_b: String,
    /// qos: A's request size.
    #[arg(long, default_value = "1MiB", value_parser = parse_bytes)]
    pub qos_a_block: u64,
    /// qos: A's requests in flight.
    #[arg(long, default_value_t = 8)]
    pub qos_a_depth: usize,
    /// qos: B's requests per second (one at a time, 4 KiB each).
    #[arg(long, default_value_t = 500)]
    pub qos_b_rate: u32,
}

/// Options of `dpuio bench soak`.
#[derive(clap::Args, Debug, Clone)]
pub struct SoakArgs {
    /// soak: minutes to run.
    #[arg(long, default_value_t = 1.0)]
    pub minutes: f64,
    /// soak: seconds between samples of the agent.
    #[arg(long, default_value_t = 10.0)]
    pub sample_s: f64,
}

/// Options of `dpuio bench startup`.
#[derive(clap::Args, Debug, Clone)]
pub struct StartupArgs {
    /// startup: starts of each program in each variant, the variants taking turns; the
    /// figures are medians and percentiles over them.
    #[arg(long, default_value_t = 200)]
    pub startup_runs: usize,
    /// startup: the Python interpreter timed (`-c pass`, `-c 'import dpuio'`); a pyenv
    /// shim is resolved to the interpreter it runs (its own start is a chain of shells).
    #[arg(long, default_value = "python3")]
    pub startup_python: String,
}
