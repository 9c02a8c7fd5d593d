//! `startup`: what a process pays at start for dpuio being there. Programs that never
//! name a dpuio path (`/bin/true`, `python3 -c pass`) are started plain and under
//! `libdpuio_preload.so` with `DPUIO_MOUNT` set (the library active, its prefix never
//! touched), and `dpuio --help` and `python3 -c 'import dpuio'` beside what they add
//! to (`/bin/true`, `python3 -c pass`). Each start is a `fork`/`exec` timed from spawn
//! to the parent's `wait`, the variants taking turns run after run so that the machine's
//! load falls on all of them alike; the rows give medians and the 10th and 90th
//! percentiles, and the difference of the medians against the targets (preload within
//! 5 ms of a plain start, the CLI's `--help` within 10 ms).
//!
//! No agent is involved: these programs never attach. What it deliberately does not do:
//! time a program that does touch the prefix (attaching is the workloads' business), or
//! say where the time goes (`strace -tt`, `LD_DEBUG=statistics`, `perf` do).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use dpuio_bench_core::companion;

use crate::args::StartupArgs;
use crate::setup::PRELOAD_LIBRARY;

/// A start within this of the plain one counts as free (issue 26, item 5).
const PRELOAD_TARGET_MS: f64 = 5.0;
/// `dpuio --help`'s bar over a plain start.
const CLI_TARGET_MS: f64 = 10.0;

/// One way of starting a program: what the rows name it, and its command.
#[derive(Clone)]
struct Start {
    name: String,
    program: PathBuf,
    args: Vec<OsString>,
    /// Under the preload library (with its `DPUIO_MOUNT`), or with neither variable.
    preloaded: bool,
}

/// A row: `subject` against `baseline`, with the bar on the difference of medians.
struct Row {
    name: &'static str,
    baseline: usize,
    subject: usize,
    target_ms: Option<f64>,
}

/// Medians and spread of one start's times, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub p10_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
}

impl Spread {
    /// The spread of `samples_ms` (not empty).
    pub fn of(samples_ms: &[f64]) -> Spread {
        let mut v = samples_ms.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
        Spread { p10_ms: at(0.10), p50_ms: at(0.50), p90_ms: at(0.90) }
    }
}

/// The verdict on a difference of medians: "met", "not met", or "-" without a bar.
pub fn verdict(difference_ms: f64, target_ms: Option<f64>) -> &'static str {
    match target_ms {
        None => "-",
        Some(t) if difference_ms <= t => "met",
        Some(_) => "not met",
    }
}

pub fn run(args: &StartupArgs, json: bool) -> Result<(), String> {
    if args.startup_runs < 3 {
        return Err(format!("--startup-runs {}: give at least 3 (medians need a few)", args.startup_runs));
    }
    let library = companion("DPUIO_PRELOAD_LIBRARY", PRELOAD_LIBRARY, "dpuio-preload", "startup")?;
    let cli = companion("DPUIO_CLI", "dpuio", "host-shim", "startup")?;
    let prefix = format!("/dpuio-bench-startup-{}", std::process::id());
    let start = |name: &str, program: PathBuf, args: &[&str], preloaded: bool| Start {
        name: name.to_owned(),
        program,
        args: args.iter().map(OsString::from).collect(),
        preloaded,
    };
    let true_bin = PathBuf::from("/bin/true");
    let mut starts = vec![
        start("/bin/true", true_bin.clone(), &[], false),
        start("/bin/true, preloaded", true_bin, &[], true),
        start("dpuio --help", cli, &["--help"], false),
    ];
    let mut rows = vec![
        Row {
            name: "/bin/true under libdpuio_preload.so",
            baseline: 0,
            subject: 1,
            target_ms: Some(PRELOAD_TARGET_MS),
        },
        Row { name: "dpuio --help, over /bin/true", baseline: 0, subject: 2, target_ms: Some(CLI_TARGET_MS) },
    ];
    let mut notes = Vec::new();
    match python(&args.startup_python) {
        Ok(python) => {
            notes.push(format!("python3 is {}", python.display()));
            let at = starts.len();
            starts.push(start("python3 -c pass", python.clone(), &["-c", "pass"], false));
            starts.push(start("python3 -c pass, preloaded", python.clone(), &["-c", "pass"], true));
            rows.push(Row {
                name: "python3 -c pass under libdpuio_preload.so",
                baseline: at,
                subject: at + 1,
                target_ms: Some(PRELOAD_TARGET_MS),
            });
            let import = start("python3 -c 'import dpuio'", python, &["-c", "import dpuio"], false);
            match check(&import, &library, &prefix) {
                Ok(()) => {
                    starts.push(import);
                    rows.push(Row {
                        name: "import dpuio, over python3 -c pass",
                        baseline: at,
                        subject: at + 2,
                        target_ms: None,
                    });
                }
                Err(e) => {
                    notes.push(format!("import dpuio skipped: {e} (install host-shim/python, or set PYTHONPATH)"))
                }
            }
        }
        Err(e) => notes.push(format!("python rows skipped: {e}")),
    }
    for s in &starts {
        check(s, &library, &prefix)?;
    }

    let mut samples_ms: Vec<Vec<f64>> = vec![Vec::with_capacity(args.startup_runs); starts.len()];
    for run in 0..args.startup_runs {
        // Each run in another order, so no variant always follows the same one.
        for k in 0..starts.len() {
            let i = (k + run) % starts.len();
            samples_ms[i].push(time(&starts[i], &library, &prefix)?);
        }
    }
    let spreads: Vec<Spread> = samples_ms.iter().map(|s| Spread::of(s)).collect();
    report(args, &starts, &rows, &spreads, &notes, &library, json);
    Ok(())
}

/// The interpreter `program` runs: its `sys.executable`, so that a pyenv shim (a
/// chain of shell scripts) is not what gets timed.
fn python(program: &str) -> Result<PathBuf, String> {
    let out = Command::new(program)
        .args(["-c", "import sys; print(sys.executable)"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e} (pass --startup-python PROGRAM)"))?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || path.is_empty() {
        return Err(format!("{program} did not say where its interpreter is ({})", out.status));
    }
    Ok(PathBuf::from(path))
}

fn command(s: &Start, library: &std::path::Path, prefix: &str) -> Command {
    let mut c = Command::new(&s.program);
    c.args(&s.args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    c.env_remove("LD_PRELOAD").env_remove("DPUIO_MOUNT");
    if s.preloaded {
        c.env("LD_PRELOAD", library).env("DPUIO_MOUNT", prefix);
    }
    c
}

/// One start, seen through: it must succeed, and its error is shown if it does not
/// (the timed starts discard their output). It also warms the page cache.
fn check(s: &Start, library: &std::path::Path, prefix: &str) -> Result<(), String> {
    let out = command(s, library, prefix)
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("{}: cannot start {}: {e}", s.name, s.program.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
    Err(format!("{} exited with {}: {last}", s.name, out.status))
}

/// One start's wall time, spawn to wait, in milliseconds.
fn time(s: &Start, library: &std::path::Path, prefix: &str) -> Result<f64, String> {
    let mut c = command(s, library, prefix);
    let t0 = Instant::now();
    let status = c.status().map_err(|e| format!("{}: cannot start {}: {e}", s.name, s.program.display()))?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if !status.success() {
        return Err(format!("{} exited with {status} in a timed run (it succeeded before)", s.name));
    }
    Ok(ms)
}

fn report(
    args: &StartupArgs,
    starts: &[Start],
    rows: &[Row],
    spreads: &[Spread],
    notes: &[String],
    library: &std::path::Path,
    json: bool,
) {
    let cell = |s: Spread| format!("{:.2} ({:.2}-{:.2})", s.p50_ms, s.p10_ms, s.p90_ms);
    if json {
        for r in rows {
            let (b, s) = (spreads[r.baseline], spreads[r.subject]);
            let difference_ms = s.p50_ms - b.p50_ms;
            let line = serde_json::json!({
                "workload": "startup",
                "row": r.name,
                "baseline": starts[r.baseline].name,
                "subject": starts[r.subject].name,
                "runs": args.startup_runs,
                "baseline_p10_ms": b.p10_ms, "baseline_p50_ms": b.p50_ms, "baseline_p90_ms": b.p90_ms,
                "p10_ms": s.p10_ms, "p50_ms": s.p50_ms, "p90_ms": s.p90_ms,
                "difference_ms": difference_ms,
                "target_ms": r.target_ms,
                "met": r.target_ms.map(|t| difference_ms <= t),
            });
            println!("{line}");
        }
        return;
    }
    println!(
        "startup: {} starts of each, taking turns; wall time from spawn to exit in ms, median (10th-90th \
         percentile); preloaded = LD_PRELOAD={} with DPUIO_MOUNT set to a prefix never touched",
        args.startup_runs,
        library.display()
    );
    let header = ["row", "baseline", "with it", "difference", "target", ""];
    let table: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            let (b, s) = (spreads[r.baseline], spreads[r.subject]);
            let difference_ms = s.p50_ms - b.p50_ms;
            [
                r.name.to_owned(),
                cell(b),
                cell(s),
                format!("{difference_ms:+.2} ms"),
                r.target_ms.map_or("-".to_owned(), |t| format!("<= {t} ms")),
                verdict(difference_ms, r.target_ms).to_owned(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for line in &table {
        for (w, c) in widths.iter_mut().zip(line) {
            *w = (*w).max(c.len());
        }
    }
    let print = |cells: &[String]| {
        let line: Vec<String> = cells.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", line.join("  ").trim_end());
    };
    print(&header.map(str::to_owned));
    for line in &table {
        print(line);
    }
    for n in notes {
        println!("note: {n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_nearest_rank_over_sorted_samples() {
        let s = Spread::of(&[5.0, 1.0, 3.0, 2.0, 4.0, 9.0, 8.0, 7.0, 6.0, 10.0, 0.0]);
        assert_eq!(s, Spread { p10_ms: 1.0, p50_ms: 5.0, p90_ms: 9.0 });
        assert_eq!(Spread::of(&[2.5]), Spread { p10_ms: 2.5, p50_ms: 2.5, p90_ms: 2.5 });
    }

    #[test]
    fn verdict_compares_the_difference_with_the_bar() {
        assert_eq!(verdict(4.9, Some(5.0)), "met");
        assert_eq!(verdict(5.0, Some(5.0)), "met");
        assert_eq!(verdict(5.1, Some(5.0)), "not met");
        assert_eq!(verdict(-1.0, Some(5.0)), "met");
        assert_eq!(verdict(50.0, None), "-");
    }
}
