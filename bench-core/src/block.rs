//! The block workloads (seq-read, seq-write, rand-read) on a file read and written
//! without dpuio: POSIX on the container's directory, the preload child's, or libdfs.

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::{Figures, process_cpu, process_cpu_time};

/// Which way the bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
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
    /// Process start: programs that never touch dpuio, plain and under the preload
    /// library, and `dpuio --help` (run on its own, no agent; see `startup.rs`).
    Startup,
}

impl Workload {
    /// The name of its rows in the figures (as on the command line).
    pub fn name(self) -> &'static str {
        match self {
            Workload::SeqRead => "seq-read",
            Workload::SeqWrite => "seq-write",
            Workload::RandRead => "rand-read",
            Workload::Metadata => "metadata",
            Workload::Unet3d => "unet3d",
            Workload::Checkpoint => "checkpoint",
            Workload::Qos => "qos",
            Workload::Soak => "soak",
            Workload::Startup => "startup",
        }
    }
}

/// The baseline of a block workload: the same file, read and written without dpuio.
pub trait BaselineFile: Send + Sync {
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

/// Where request `i` of a block workload reads or writes: block `i` in turn, or a
/// random block for rand-read.
pub fn offset(workload: Workload, i: u64, block: u64, file_bytes: u64, rng: &mut impl Rng) -> u64 {
    let blocks = file_bytes / block;
    if workload == Workload::RandRead { rng.random_range(0..blocks) * block } else { (i % blocks) * block }
}

/// One cell of a block workload on a baseline file: `qd` threads, each doing blocking
/// reads or writes of `block` bytes (fio's psync engine at that queue depth), for
/// `duration`. Host CPU is this process's; agent CPU is `agent_pid`'s, if given.
#[allow(clippy::too_many_arguments)]
pub fn baseline_cell(
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
