//! What dpuio's two benchmark programs share. `dpuio-bench` (`host-shim/bench`) runs the
//! workloads through the shim and the baselines that need nothing of the agent (POSIX,
//! the preload and fuse paths); `dpuio-bench-agent` (`dpu-agent/bench`) runs what needs
//! the agent's crates: the libdfs baseline over DAOS and the cipher benchmark. Neither
//! depends on the other; both depend on this crate, which depends on neither side.
//!
//! Here: the [`Figures`] of one measured cell, and how a child program hands them to
//! its parent and takes requests from it ([`child`]); the [`Meter`] that reads a step's
//! clocks through a [`Context`]; the block workloads' loop over any [`BaselineFile`]
//! ([`baseline_cell`]); DLIO's unet3d shape and its accelerator search ([`unet3d`]).
//!
//! What it deliberately does not do: talk to an agent, load libdfs, print tables or draw
//! plots. Those are the programs' own.
#![forbid(unsafe_code)]

mod block;
pub mod child;
mod figures;
pub mod unet3d;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

pub use block::{BaselineFile, Workload, baseline_cell, offset};
pub use figures::{Context, Figures, Meter, Spinner};

/// Bytes in a GiB, as a float for rates.
pub const GIB: f64 = (1u64 << 30) as f64;

/// Where the benchmarks keep their files in the container.
pub const BENCH_DIR: &str = "/.dpuio-bench";
/// The block workloads' file.
pub const BENCH_FILE: &str = "/.dpuio-bench/data";
/// The path name of the libdfs baseline (`--backend daos`) in the figures.
pub const LIBDFS: &str = "libdfs";

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

/// The name this program was invoked as (`dpuio bench` when dpuio runs dpuio-bench, and
/// dpuio-bench runs dpuio-bench-agent under its own), else `default`: what its errors
/// start with.
pub fn invoked_as(default: &str) -> String {
    std::env::args_os()
        .next()
        .and_then(|a| std::path::Path::new(&a).file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| default.to_owned())
}

/// A program's end: success, or its error on stderr after its name `me`.
pub fn exit(me: &str, result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{me}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A file a benchmark runs or loads (`name`, which `cargo build -p package` puts beside
/// this program): `$var` if set, else beside this program. The error, for `purpose`,
/// says which path is missing and how to get it.
pub fn companion(var: &str, name: &str, package: &str, purpose: &str) -> Result<PathBuf, String> {
    let path = match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => {
            std::env::current_exe().map_err(|e| format!("{purpose}: where is this program? {e}"))?.with_file_name(name)
        }
    };
    if !path.is_file() {
        return Err(format!(
            "{purpose}: {} not found (build it with `cargo build -p {package}`, or set {var})",
            path.display()
        ));
    }
    Ok(path)
}

/// CPU time of this process so far (all threads).
pub fn process_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
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
