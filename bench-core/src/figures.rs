//! The figures of one measured cell, and how a step's clocks are read.

use std::time::{Duration, Instant};

use crate::GIB;

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
    /// Adds another round of the same cell.
    pub fn merge(&mut self, other: Figures) {
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

/// Where a measurement reads its clocks and shows what it is doing: the program that
/// runs it (the parent with its progress bars and its fuse mount's CPU, or a child
/// that shows nothing).
pub trait Context: Sync {
    /// CPU time of the host's side of `path` so far.
    fn host_cpu(&self, path: &str) -> Duration;
    /// CPU time of the agent so far, when its pid is known.
    fn agent_cpu(&self) -> Option<Duration>;
    /// Shows `message` while a step runs, until the spinner is finished.
    fn spinner(&self, message: String) -> Box<dyn Spinner + '_>;
}

/// What [`Context::spinner`] shows; gone once finished.
pub trait Spinner {
    fn finish(self: Box<Self>);
}

/// Wall clock, host CPU and agent CPU started together, for one measured step.
pub struct Meter<'a> {
    context: &'a dyn Context,
    path: &'a str,
    cpu0: Duration,
    agent0: Option<Duration>,
    t0: Instant,
}

impl<'a> Meter<'a> {
    /// Figures of `path` from now (its host CPU as [`Context::host_cpu`] counts it).
    pub fn start(context: &'a dyn Context, path: &'a str) -> Self {
        Meter { context, path, cpu0: context.host_cpu(path), agent0: context.agent_cpu(), t0: Instant::now() }
    }

    pub fn finish(self, workload: &str, ops: u64, bytes: u64) -> Figures {
        Figures {
            workload: workload.to_owned(),
            path: self.path.to_owned(),
            ops,
            bytes,
            wall: self.t0.elapsed(),
            host_cpu: self.context.host_cpu(self.path).saturating_sub(self.cpu0),
            agent_cpu: self.agent0.and_then(|a0| self.context.agent_cpu().map(|a1| a1.saturating_sub(a0))),
            ..Figures::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_of_a_cell_add_up() {
        let round = |ops| Figures {
            ops,
            bytes: ops * 4096,
            wall: Duration::from_secs(1),
            latencies_us: vec![1, 2],
            ..Figures::default()
        };
        let mut total = round(10);
        total.merge(round(30));
        assert_eq!((total.ops, total.latencies_us.len()), (40, 4));
        assert_eq!(total.iops(), 20.0);
        assert_eq!(total.percentile_us(0.99), 2.0);
    }
}
