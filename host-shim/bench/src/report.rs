//! The figures as a person reads them: the table of each workload, and the targets
//! checked against the baseline of the same run.

use crate::workloads::{BenchArgs, FUSE, Figures, LIBDFS, PRELOAD, SAMPLE_WORKLOAD};

fn opt(v: Option<f64>, digits: usize) -> String {
    v.filter(|v| v.is_finite()).map_or("null".into(), |v| format!("{v:.digits$}"))
}

/// The baseline figures of the same workload (POSIX, or libdfs over DAOS), the
/// denominator of every ratio.
fn baseline<'a>(all: &'a [Figures], t: &Figures) -> Option<&'a Figures> {
    all.iter().find(|p| (p.path == "posix" || p.path == LIBDFS) && p.workload == t.workload)
}

/// Throughput for byte workloads, operation rate for metadata ones.
fn rate(t: &Figures) -> f64 {
    if t.bytes > 0 { t.gib_per_s() } else { t.iops() }
}

pub fn report(totals: &[Figures], args: &BenchArgs) {
    if args.json {
        for t in totals {
            let base = baseline(totals, t);
            let bytes = t.bytes > 0;
            println!(
                "{{\"workload\":\"{}\",\"path\":\"{}\",\"block_bytes\":{},\"queue_depth\":{},\"threads\":{},\"gib_per_s\":{},\"iops\":{:.0},\"p50_us\":{},\"p99_us\":{},\"host_cpu_s_per_gib\":{},\"agent_cpu_s_per_gib\":{},\"ratio_to_posix\":{},\"host_cpu_ratio_to_posix\":{},\"host_cpu_us_per_op\":{:.2},\"au\":{},\"accelerators\":{},\"seconds\":{:.2}}}",
                t.workload,
                t.path,
                t.block_bytes,
                t.queue_depth,
                t.threads,
                opt(bytes.then(|| t.gib_per_s()), 4),
                t.iops(),
                opt((!t.latencies_us.is_empty()).then(|| t.percentile_us(0.5)), 1),
                opt((!t.latencies_us.is_empty()).then(|| t.percentile_us(0.99)), 1),
                opt(bytes.then(|| t.host_cpu_s_per_gib()), 5),
                opt(t.agent_cpu_s_per_gib().filter(|_| bytes), 5),
                opt(base.map(|p| rate(t) / rate(p)), 3),
                opt(base.filter(|_| bytes).map(|p| t.host_cpu_s_per_gib() / p.host_cpu_s_per_gib()), 4),
                t.host_cpu.as_secs_f64() * 1e6 / t.ops.max(1) as f64,
                opt(t.au, 3),
                t.accelerators.map_or("null".into(), |a| a.to_string()),
                t.wall.as_secs_f64(),
            );
        }
        return;
    }
    println!(
        "{:<18} {:<13} {:>8} {:>3} {:>8} {:>9} {:>8} {:>8} {:>10} {:>10} {:>8} {:>5} {:>4}",
        "workload",
        "path",
        "block",
        "qd",
        "GiB/s",
        "ops/s",
        "p50 us",
        "p99 us",
        "host s/GiB",
        "agent s/GiB",
        "vs base",
        "AU",
        "acc"
    );
    for t in totals {
        let bytes = t.bytes > 0;
        let dash = || "-".to_owned();
        println!(
            "{:<18} {:<13} {:>8} {:>3} {:>8} {:>9.0} {:>8} {:>8} {:>10} {:>10} {:>8} {:>5} {:>4}",
            t.workload,
            t.path,
            if t.block_bytes > 0 { t.block_bytes.to_string() } else { dash() },
            if t.queue_depth > 0 { t.queue_depth.to_string() } else { dash() },
            if bytes { format!("{:.3}", t.gib_per_s()) } else { dash() },
            t.iops(),
            if t.latencies_us.is_empty() { dash() } else { format!("{:.0}", t.percentile_us(0.5)) },
            if t.latencies_us.is_empty() { dash() } else { format!("{:.0}", t.percentile_us(0.99)) },
            if bytes { format!("{:.4}", t.host_cpu_s_per_gib()) } else { dash() },
            t.agent_cpu_s_per_gib().filter(|_| bytes).map_or_else(dash, |v| format!("{v:.4}")),
            baseline(totals, t).map_or_else(dash, |p| format!("{:.2}x", rate(t) / rate(p))),
            t.au.map_or_else(dash, |v| format!("{:.0}%", v * 100.0)),
            t.accelerators.map_or_else(dash, |a| a.to_string()),
        );
    }
    targets(totals);
}

/// The issues' targets, printed with the figures they are judged by.
fn targets(totals: &[Figures]) {
    let sm = |w: &str| totals.iter().find(|t| t.path == "shim-ucx-sm" && t.workload == w);
    let px = |w: &str| totals.iter().find(|t| (t.path == "posix" || t.path == LIBDFS) && t.workload == w);
    let base = if totals.iter().any(|t| t.path == LIBDFS) { LIBDFS } else { "posix" };
    if let (Some(s), Some(p)) = (sm("seq-read"), px("seq-read")) {
        let thr = s.gib_per_s() / p.gib_per_s();
        let cpu = s.host_cpu_s_per_gib() / p.host_cpu_s_per_gib();
        println!(
            "target: seq-read shim-ucx-sm throughput >= 0.8x {base} (aim 1.0x): {thr:.2}x  {}",
            verdict(thr >= 0.8)
        );
        println!(
            "target: seq-read shim-ucx-sm host CPU/GiB <= 10% of {base}: {:.1}%  {}",
            cpu * 100.0,
            verdict(cpu <= 0.10)
        );
    }
    if let (Some(s), Some(p)) = (sm("rand-read"), px("rand-read")) {
        let iops = s.iops() / p.iops();
        println!(
            "target: rand-read shim-ucx-sm IOPS >= 0.5x {base}: {iops:.2}x  {} (p50 {:.0} us, p99 {:.0} us; {base} p50 {:.0} us, p99 {:.0} us)",
            verdict(iops >= 0.5),
            s.percentile_us(0.5),
            s.percentile_us(0.99),
            p.percentile_us(0.5),
            p.percentile_us(0.99)
        );
    }
    if let (Some(s), Some(p)) = (sm("unet3d"), px("unet3d")) {
        let (sa, pa) = (s.accelerators.unwrap_or(0), p.accelerators.unwrap_or(0));
        let cpu = s.host_cpu_s_per_gib() / p.host_cpu_s_per_gib();
        println!("target: unet3d accelerators at AU >= 90%, shim >= {base}: {sa} vs {pa}  {}", verdict(sa >= pa));
        println!("target: unet3d shim host CPU/GiB <= 10% of {base}: {:.1}%  {}", cpu * 100.0, verdict(cpu <= 0.10));
        if base == LIBDFS {
            let thr = s.gib_per_s() / p.gib_per_s();
            println!("target: unet3d shim throughput >= 0.8x {base}: {thr:.2}x  {}", verdict(thr >= 0.8));
        }
    }
    if base == LIBDFS {
        // The DAOS issue's bar for every workload: 0.8x of libdfs in the bench process.
        for op in ["create", "stat", "readdir", "remove"] {
            let w = format!("metadata-{op}");
            if let (Some(s), Some(p)) = (sm(&w), px(&w)) {
                let r = s.iops() / p.iops();
                println!("target: {w} shim ops/s >= 0.8x {base}: {r:.2}x  {}", verdict(r >= 0.8));
            }
        }
    }
    // Metadata on the data plane and small samples (issue 15's floors), for every path
    // that reads by path or through the ring, against POSIX in the same run.
    for path in ["shim-ucx-sm", PRELOAD, FUSE] {
        let row = |w: &str| totals.iter().find(|t| t.path == path && t.workload == w);
        if let (Some(s), Some(p)) = (row("metadata-stat"), px("metadata-stat")) {
            let r = s.iops() / p.iops();
            println!("target: metadata-stat {path} ops/s >= 0.1x {base} (aim 0.25x): {r:.3}x  {}", verdict(r >= 0.1));
        }
        let samples = totals.iter().filter(|t| t.path == path && t.workload.starts_with(SAMPLE_WORKLOAD));
        for w in samples.map(|t| t.workload.as_str()) {
            if let (Some(s), Some(p)) = (row(w), px(w)) {
                let thr = s.gib_per_s() / p.gib_per_s();
                let cpu = s.host_cpu_s_per_gib() / p.host_cpu_s_per_gib();
                println!(
                    "target: {w} {path} >= 0.5x {base} (aim 0.8x) at host CPU <= 0.10x: {thr:.2}x at {cpu:.2}x  {}",
                    verdict(thr >= 0.5 && cpu <= 0.10)
                );
            }
        }
    }
    for w in ["checkpoint-write", "checkpoint-read"] {
        if let (Some(s), Some(p)) = (sm(w), px(w)) {
            let r = s.gib_per_s() / p.gib_per_s();
            println!("target: {w} shim >= 0.8x {base} (with fsync): {r:.2}x  {}", verdict(r >= 0.8));
        }
    }
    // libfabric's shm provider against UCX shared memory, measured in the same run.
    let ofi = |w: &str| totals.iter().find(|t| t.path == "shim-ofi-shm" && t.workload == w);
    if let (Some(o), Some(u)) = (ofi("seq-read"), sm("seq-read")) {
        let thr = o.gib_per_s() / u.gib_per_s();
        let cpu = o.host_cpu_s_per_gib() / u.host_cpu_s_per_gib();
        println!("target: seq-read shim-ofi-shm throughput >= 0.8x shim-ucx-sm: {thr:.2}x  {}", verdict(thr >= 0.8));
        println!("target: seq-read shim-ofi-shm host CPU/GiB <= 1.5x shim-ucx-sm: {cpu:.2}x  {}", verdict(cpu <= 1.5));
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}
