//! The figures as a person reads them: what each row and column means (`legend`), the
//! table of each workload with the targets checked against the baseline of the same run,
//! each with what it stands for, and at the end what dpuio did better than the baseline
//! and what it cost (`summary`). `--json` prints one object per row instead (the same
//! fields every run, for scripts).

use dpuio_bench_core::{Figures, LIBDFS};

use crate::args::BenchArgs;
use crate::setup::{DECRYPT, DFUSE, FUSE, PIL4DFS, PRELOAD, SAMPLE_WORKLOAD};
use crate::tcp_stream::TCP_STREAM;

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

/// DAOS's own host clients, which a DAOS user would run instead of dpuio: the peers of
/// `--backend daos`.
const PEERS: [&str; 3] = [LIBDFS, DFUSE, PIL4DFS];

/// The fastest peer on `t`'s workload in the same run.
fn best_peer<'a>(all: &'a [Figures], t: &Figures) -> Option<&'a Figures> {
    all.iter()
        .filter(|p| PEERS.contains(&p.path.as_str()) && p.workload == t.workload && rate(p) > 0.0)
        .max_by(|a, b| rate(a).total_cmp(&rate(b)))
}

/// Host CPU per unit of work: seconds per GiB for byte workloads, per operation for
/// metadata ones.
fn host_cpu_per_unit(t: &Figures) -> f64 {
    match t.bytes > 0 {
        true => t.host_cpu_s_per_gib(),
        false => t.host_cpu.as_secs_f64() / t.ops.max(1) as f64,
    }
}

/// `t` against `peer`: the rate's ratio and the host CPU per unit's ratio.
fn against(t: &Figures, peer: &Figures) -> (f64, f64) {
    (rate(t) / rate(peer), host_cpu_per_unit(t) / host_cpu_per_unit(peer))
}

pub fn report(totals: &[Figures], args: &BenchArgs) {
    if args.json {
        for t in totals {
            let base = baseline(totals, t);
            let peer = best_peer(totals, t);
            let bytes = t.bytes > 0;
            println!(
                "{{\"workload\":\"{}\",\"path\":\"{}\",\"block_bytes\":{},\"queue_depth\":{},\"threads\":{},\"gib_per_s\":{},\"iops\":{:.0},\"p50_us\":{},\"p99_us\":{},\"host_cpu_s_per_gib\":{},\"agent_cpu_s_per_gib\":{},\"ratio_to_posix\":{},\"host_cpu_ratio_to_posix\":{},\"host_cpu_us_per_op\":{:.2},\"au\":{},\"accelerators\":{},\"seconds\":{:.2},\"best_peer\":{},\"ratio_to_best_peer\":{},\"host_cpu_ratio_to_best_peer\":{}}}",
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
                peer.map_or("null".into(), |p| format!("\"{}\"", p.path)),
                opt(peer.map(|p| against(t, p).0), 3),
                opt(peer.map(|p| against(t, p).1), 4),
            );
        }
        return;
    }
    table(totals);
    for gap in gaps(totals, &args.paths) {
        println!("{gap}");
    }
    for target in targets(totals) {
        println!("{target}");
    }
}

/// The row names a `--paths` entry gives.
fn rows_of(path: &str) -> &str {
    match path {
        "shm" | "ucx-shm" | "shim" => "shim-ucx-sm",
        "tcp" | "ucx-tcp" => "shim-ucx-tcp",
        "ofi-shm" => "shim-ofi-shm",
        "ofi-tcp" => "shim-ofi-tcp",
        other => other,
    }
}

/// Why `path` has no row for `workload`, which other paths have: said under the table, so
/// that a missing row is never silent.
fn gap_reason(path: &str, workload: &str) -> &'static str {
    match path {
        TCP_STREAM => "one TCP stream reads no files: it is the bar of seq-read only",
        LIBDFS if workload.starts_with(SAMPLE_WORKLOAD) => {
            "dpuio-bench-agent's libdfs baseline runs create, stat, readdir and remove, not the sample rows"
        }
        "posix" => "no --posix-root (or --backend daos, where there is no directory to read)",
        _ => "not measured on this path (a bug of the bench: it should say why)",
    }
}

/// A line for each path asked for in `paths` that has no row of a workload this table
/// has rows of, with why.
fn gaps(totals: &[Figures], paths: &[String]) -> Vec<String> {
    let mut workloads: Vec<&str> = Vec::new();
    for t in totals {
        if !workloads.contains(&t.workload.as_str()) {
            workloads.push(&t.workload);
        }
    }
    let mut out = Vec::new();
    for path in paths.iter().map(|p| rows_of(p)) {
        let has = |w: &str| totals.iter().any(|t| t.path == path && t.workload == w);
        let missing: Vec<&str> = workloads.iter().copied().filter(|w| !has(w)).collect();
        // One line per reason.
        let mut reasons: Vec<(&str, Vec<&str>)> = Vec::new();
        for w in missing {
            let why = gap_reason(path, w);
            match reasons.iter_mut().find(|(r, _)| *r == why) {
                Some((_, ws)) => ws.push(w),
                None => reasons.push((why, vec![w])),
            }
        }
        for (why, ws) in reasons {
            out.push(wrap("", &format!("no {path} row of {}: {why}", ws.join(", "))));
        }
    }
    out
}

/// What a row's path reads, said at the end of its table row and in the plot's legend:
/// the baselines read the bytes as stored, and the encrypted tenant's rows decrypt.
pub fn note(path: &str) -> Option<&'static str> {
    match path {
        "posix" => Some("the stored bytes, no dpuio"),
        LIBDFS => Some("the stored bytes, DAOS client, no dpuio"),
        DFUSE => Some("DAOS's FUSE daemon, no dpuio"),
        PIL4DFS => Some("DAOS client preloaded into the job, no dpuio"),
        TCP_STREAM => Some("one TCP stream, no dpuio, no file"),
        p if p.ends_with(DECRYPT) => Some("the agent decrypts"),
        _ => None,
    }
}

/// What a row's path is, for the legend.
fn describe(path: &str) -> String {
    if let Some(plain) = path.strip_suffix(DECRYPT) {
        return format!(
            "{plain} as the tenant with inline encryption: the same files, stored encrypted; the agent \
             decrypts every block (AES-256-GCM) before it puts it into this host's memory, the host does no crypto"
        );
    }
    match path {
        "posix" => "this process's own read/pread on the tenant's directory (--posix-root): the bytes as stored, \
                    without dpuio; the baseline, the denominator of every \"vs base\""
            .into(),
        LIBDFS => "the DAOS client (libdfs) in dpuio-bench-agent, a child of this process, on the same container, \
                    without dpuio, the way pydaos reads: the baseline of \"vs base\", and a peer"
            .into(),
        "shim-ucx-sm" => "dpuio's shim over UCX shared memory: the host posts each request on a ring in memory it \
                          registered, the agent reads the file and puts the bytes there; the host touches no payload byte"
            .into(),
        "shim-ucx-tcp" => {
            "the same over UCX TCP, for hosts that share no memory with the agent (on a BlueField, RDMA)".into()
        }
        "shim-ofi-shm" => "the same over libfabric's shm provider".into(),
        "shim-ofi-tcp" => "the same over libfabric's tcp provider".into(),
        FUSE => "`dpuio mount` read by path through the kernel; the mount process's CPU counts as host CPU".into(),
        DFUSE => "DAOS's own FUSE daemon (dfuse, caching off unless --dfuse-caching) mounting the same container, \
                  this process's POSIX code on the mount; the daemon's CPU counts as host CPU: a peer"
            .into(),
        PIL4DFS => "the POSIX code in a child process under DAOS's libpil4dfs.so on the dfuse mount: the DAOS client \
                    in the job's process; its whole CPU and the daemon's count as host CPU: a peer"
            .into(),
        PRELOAD => "the POSIX code in a child process under libdpuio_preload.so; its whole CPU counts as host CPU"
            .into(),
        TCP_STREAM => "seq-read only: one plain TCP stream read in blocks of the same size on the path to the agent's \
                       address (zeros from a source, no file, no dpuio): the bar of the TCP transports; host CPU is \
                       the reading thread's"
            .into(),
        other => other.to_owned(),
    }
}

/// What the rows and the columns mean, printed once before the first table.
pub fn legend(paths: &[&str], agent_here: bool) {
    let width = paths.iter().map(|p| p.len()).max().unwrap_or(0);
    println!("rows (each path reads the same files, the paths in turn, so every ratio is of one run):");
    for path in paths {
        println!("{}", wrap(&format!("  {path:<width$}  "), &describe(path)));
    }
    let agent = match agent_here {
        true => {
            "CPU seconds the agent spent per GiB moved; it ran on this machine, so it took them from the job's \
             cores (on a BlueField it has Arm cores of its own)"
        }
        false => "CPU seconds the agent spent per GiB moved (with --agent-pid)",
    };
    println!("columns:");
    for (column, meaning) in [
        ("GiB/s, ops/s", "the rate: bytes, or operations (files for metadata), per second"),
        ("p50, p99 us", "a request's latency, the median and the 99th percentile"),
        ("host s/GiB", "CPU seconds this process (the host) spent per GiB moved: the training job's cores"),
        ("agent s/GiB", agent),
        ("vs base", "the rate over the baseline's rate in the same run (above 1.00x: faster)"),
        (
            "vs peer, cpu",
            "over DAOS: the rate over that of the fastest of DAOS's host clients (libdfs, dfuse, pil4dfs) on the \
             same workload, and the host CPU per GiB (per operation for metadata) over that peer's",
        ),
        ("AU, acc", "unet3d: accelerator utilisation, and the most simulated accelerators kept at AU >= 90%"),
    ] {
        println!("{}", wrap(&format!("  {column:<12}  "), meaning));
    }
    println!();
}

/// Lines no wider than a terminal's usual 120 columns: `lead`, then `text` word by word,
/// continued under its first word.
fn wrap(lead: &str, text: &str) -> String {
    const WIDTH: usize = 120;
    let indent = " ".repeat(lead.len());
    let mut out = lead.to_owned();
    let mut line = lead.len();
    for (i, word) in text.split_whitespace().enumerate() {
        if i > 0 && line + 1 + word.len() > WIDTH {
            out.push('\n');
            out.push_str(&indent);
            line = indent.len();
        } else if i > 0 {
            out.push(' ');
            line += 1;
        }
        out.push_str(word);
        line += word.len();
    }
    out
}

/// One workload's rows; over DAOS, with each row against the fastest peer.
fn table(totals: &[Figures]) {
    let width = totals.iter().map(|t| t.path.len()).max().unwrap_or(0).max(13);
    let peers = totals.iter().any(|t| PEERS.contains(&t.path.as_str()));
    let mut head = format!(
        "{:<18} {:<width$} {:>8} {:>3} {:>8} {:>9} {:>8} {:>8} {:>10} {:>11} {:>8} {:>5} {:>4}",
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
    if peers {
        head.push_str(&format!(" {:>8} {:>7} {:<8}", "vs peer", "cpu", "peer"));
    }
    println!("{head}");
    for t in totals {
        let bytes = t.bytes > 0;
        let dash = || "-".to_owned();
        let mut row = format!(
            "{:<18} {:<width$} {:>8} {:>3} {:>8} {:>9.0} {:>8} {:>8} {:>10} {:>11} {:>8} {:>5} {:>4}",
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
        if peers {
            let cells = best_peer(totals, t).map(|p| {
                let (thr, cpu) = against(t, p);
                (format!("{thr:.2}x"), format!("{cpu:.2}x"), p.path.clone())
            });
            let (thr, cpu, peer) = cells.unwrap_or_else(|| (dash(), dash(), dash()));
            row.push_str(&format!(" {thr:>8} {cpu:>7} {peer:<8}"));
        }
        match note(&t.path) {
            Some(note) => println!("{row}  <- {note}"),
            None => println!("{row}"),
        }
    }
}

/// A throughput ratio, and which way it goes.
fn faster(ratio: f64) -> String {
    let way = match ratio {
        r if r >= 1.05 => "faster",
        r if r > 0.95 => "as fast",
        _ => "slower",
    };
    format!("{ratio:.2}x ({way})")
}

/// A CPU ratio, and how much less (or more) that is.
fn cheaper(ratio: f64) -> String {
    match ratio {
        r if r < 1.0 => format!("{r:.2}x ({:.0}% less)", (1.0 - r) * 100.0),
        r => format!("{r:.2}x (more)"),
    }
}

/// What dpuio did better than the baseline and what it cost, for the byte workloads of
/// the whole run: every dpuio row against the baseline of the same workload, then each
/// encrypted tenant's row against the plain tenant's row of the same path.
pub fn summary(all: &[Figures], agent_here: bool) {
    for line in summary_lines(all, agent_here) {
        println!("{line}");
    }
}

fn summary_lines(all: &[Figures], agent_here: bool) -> Vec<String> {
    let mut out = Vec::new();
    let rows: Vec<(&Figures, &Figures)> = all
        .iter()
        .filter(|t| t.bytes > 0 && note(&t.path).is_none_or(|_| t.path.ends_with(DECRYPT)))
        .filter_map(|t| baseline(all, t).map(|b| (t, b)))
        .collect();
    let Some((_, first_base)) = rows.first() else {
        return out;
    };
    let base = first_base.path.as_str();
    let pw = rows.iter().map(|(t, _)| t.path.len()).max().unwrap_or(0).max(4);
    let ww = rows.iter().map(|(t, _)| t.workload.len()).max().unwrap_or(0).max(8);
    let agent = |t: &Figures| t.agent_cpu_s_per_gib().map_or_else(|| "-".to_owned(), |a| format!("{a:.4}"));
    out.push(String::new());
    out.push(format!(
        "what dpuio did better, and what it cost: each path against {base}, the same files, the same run"
    ));
    out.push(format!(
        "  {:<ww$} {:<pw$}  {:<16} {:<16} {:>10} {:>10}  {:>11}  {}",
        "workload", "path", "throughput", "host CPU/GiB", "host s/GiB", "base s/GiB", "agent s/GiB", "accelerators"
    ));
    for (t, b) in &rows {
        let accelerators = match (t.accelerators, b.accelerators) {
            (Some(a), Some(pa)) => format!("{a} (base {pa})"),
            _ => "-".to_owned(),
        };
        out.push(format!(
            "  {:<ww$} {:<pw$}  {:<16} {:<16} {:>10.4} {:>10.4}  {:>11}  {accelerators}",
            t.workload,
            t.path,
            faster(t.gib_per_s() / b.gib_per_s()),
            cheaper(t.host_cpu_s_per_gib() / b.host_cpu_s_per_gib()),
            t.host_cpu_s_per_gib(),
            b.host_cpu_s_per_gib(),
            agent(t),
        ));
    }
    let decrypting: Vec<(&Figures, &Figures)> = all
        .iter()
        .filter(|t| t.bytes > 0)
        .filter_map(|t| {
            let plain = t.path.strip_suffix(DECRYPT)?;
            all.iter().find(|p| p.path == plain && p.workload == t.workload).map(|p| (t, p))
        })
        .collect();
    if !decrypting.is_empty() {
        out.push(String::new());
        out.push(
            "what decrypting cost: the encrypted tenant's rows against the plain tenant's on the same path".into(),
        );
        out.push(format!(
            "  {:<ww$} {:<pw$}  {:<16} {:>11} {:>11}  {:>10} {:>10}",
            "workload", "path", "throughput", "agent s/GiB", "plain", "host s/GiB", "plain"
        ));
        for (t, p) in decrypting {
            out.push(format!(
                "  {:<ww$} {:<pw$}  {:<16} {:>11} {:>11}  {:>10.4} {:>10.4}",
                t.workload,
                t.path,
                faster(t.gib_per_s() / p.gib_per_s()),
                agent(t),
                agent(p),
                t.host_cpu_s_per_gib(),
                p.host_cpu_s_per_gib(),
            ));
        }
        out.push("  (the agent decrypts; the host does no crypto)".into());
    }
    if agent_here {
        out.push(format!(
            "the agent ran on this machine, on the cores {base} used too; on a BlueField it runs on the DPU's own \
             Arm cores and the host pays only its host CPU"
        ));
    }
    out
}

/// What each target stands for, printed under it: a target is a bar set for comparing
/// runs, and a bare ratio does not say why it is the bar.
mod meaning {
    pub const READ_SPEED: &str = "the job should not read slower because the agent does the reading: at least 0.8x of reading the same files itself";
    pub const HOST_CPU: &str = "the point of the DPU: the host's cores are the training job's, so reading through dpuio should cost them at most a tenth of what reading the files costs them";
    pub const RAND_READ: &str =
        "small reads, many in flight: each one crosses to the agent and back, so half the baseline's rate is the floor";
    pub const ACCELERATORS: &str = "the training job's own measure: as many simulated accelerators kept computing at least 90% of the time as with the baseline";
    pub const DAOS: &str =
        "over DAOS: at least 0.8x of the DAOS client (libdfs) running inside the job's process, the way pydaos reads";
    pub const STAT: &str = "a stat crosses to the agent and back where a local one is a system call: a tenth of its rate is the floor, a quarter the aim";
    pub const SAMPLE: &str = "a training sample (a whole 128 KiB file opened, read and closed): half the baseline's rate at a tenth of its host CPU";
    pub const CHECKPOINT: &str = "a checkpoint made durable (fsync, or the agent's on close) and read back at least 0.8x as fast as the baseline";
    pub const TCP: &str = "a TCP transport against what one plain TCP stream carries on the same path: the transport's own round trips and copies should leave at least 0.8x of it (the bar is for 1 MiB reads, 8 in flight)";
    pub const PEER_SHIM: &str = "what a DAOS user would run instead of dpuio (libdfs in the job, dfuse, libpil4dfs): at least as fast as the fastest of them, at a tenth of its host CPU, the rest on the DPU";
    pub const PEER_PRELOAD: &str = "both preload a library into an unmodified program: dpuio's should read at least 0.8x as fast as DAOS's, costing the job's cores less";
    pub const PEER_FUSE: &str = "both serve the container through the kernel's FUSE: dpuio's mount should read at least 0.8x as fast as DAOS's daemon, costing the host's cores less";
    pub const OFI: &str =
        "libfabric's shared-memory transport, the second one, against UCX's: nearly as fast at not much more host CPU";
}

/// One target checked: what is compared, the figure, met or not, what it stands for.
struct Target {
    claim: String,
    figure: String,
    met: bool,
    meaning: &'static str,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "target: {}: {}  {}", self.claim, self.figure, verdict(self.met))?;
        write!(f, "{}", wrap("        means: ", self.meaning))
    }
}

/// The targets this workload's rows are judged by, each with its figure and meaning.
fn targets(totals: &[Figures]) -> Vec<Target> {
    let mut out = Vec::new();
    let mut target = |claim: String, figure: String, met: bool, meaning: &'static str| {
        out.push(Target { claim, figure, met, meaning });
    };
    let sm = |w: &str| totals.iter().find(|t| t.path == "shim-ucx-sm" && t.workload == w);
    let px = |w: &str| totals.iter().find(|t| (t.path == "posix" || t.path == LIBDFS) && t.workload == w);
    let base = if totals.iter().any(|t| t.path == LIBDFS) { LIBDFS } else { "posix" };
    let (read_speed, host_cpu) = (meaning::READ_SPEED, meaning::HOST_CPU);
    if let (Some(s), Some(p)) = (sm("seq-read"), px("seq-read")) {
        let thr = s.gib_per_s() / p.gib_per_s();
        let cpu = s.host_cpu_s_per_gib() / p.host_cpu_s_per_gib();
        let claim = format!("seq-read shim-ucx-sm throughput >= 0.8x {base} (aim 1.0x)");
        target(claim, format!("{thr:.2}x"), thr >= 0.8, read_speed);
        let claim = format!("seq-read shim-ucx-sm host CPU/GiB <= 10% of {base}");
        target(claim, format!("{:.1}%", cpu * 100.0), cpu <= 0.10, host_cpu);
    }
    if let (Some(s), Some(p)) = (sm("rand-read"), px("rand-read")) {
        let iops = s.iops() / p.iops();
        let (s50, s99, p50, p99) =
            (s.percentile_us(0.5), s.percentile_us(0.99), p.percentile_us(0.5), p.percentile_us(0.99));
        target(
            format!("rand-read shim-ucx-sm IOPS >= 0.5x {base}"),
            format!("{iops:.2}x (p50 {s50:.0} us, p99 {s99:.0} us; {base} p50 {p50:.0} us, p99 {p99:.0} us)"),
            iops >= 0.5,
            meaning::RAND_READ,
        );
    }
    if let (Some(s), Some(p)) = (sm("unet3d"), px("unet3d")) {
        let (sa, pa) = (s.accelerators.unwrap_or(0), p.accelerators.unwrap_or(0));
        let cpu = s.host_cpu_s_per_gib() / p.host_cpu_s_per_gib();
        let claim = format!("unet3d accelerators at AU >= 90%, shim >= {base}");
        target(claim, format!("{sa} vs {pa}"), sa >= pa, meaning::ACCELERATORS);
        let claim = format!("unet3d shim host CPU/GiB <= 10% of {base}");
        target(claim, format!("{:.1}%", cpu * 100.0), cpu <= 0.10, host_cpu);
        if base == LIBDFS {
            let thr = s.gib_per_s() / p.gib_per_s();
            target(format!("unet3d shim throughput >= 0.8x {base}"), format!("{thr:.2}x"), thr >= 0.8, meaning::DAOS);
        }
    }
    if base == LIBDFS {
        // Over DAOS every metadata call has the same bar as the reads: 0.8x of libdfs.
        for op in ["create", "stat", "readdir", "remove"] {
            let w = format!("metadata-{op}");
            if let (Some(s), Some(p)) = (sm(&w), px(&w)) {
                let r = s.iops() / p.iops();
                target(format!("{w} shim ops/s >= 0.8x {base}"), format!("{r:.2}x"), r >= 0.8, meaning::DAOS);
            }
        }
    }
    // Metadata on the data plane and small samples, for every path that reads by path or
    // through the ring, against POSIX in the same run.
    for path in ["shim-ucx-sm", PRELOAD, FUSE] {
        let row = |w: &str| totals.iter().find(|t| t.path == path && t.workload == w);
        if let (Some(s), Some(p)) = (row("metadata-stat"), px("metadata-stat")) {
            let r = s.iops() / p.iops();
            let claim = format!("metadata-stat {path} ops/s >= 0.1x {base} (aim 0.25x)");
            target(claim, format!("{r:.3}x"), r >= 0.1, meaning::STAT);
        }
        let samples = totals.iter().filter(|t| t.path == path && t.workload.starts_with(SAMPLE_WORKLOAD));
        for w in samples.map(|t| t.workload.as_str()) {
            if let (Some(s), Some(p)) = (row(w), px(w)) {
                let thr = s.gib_per_s() / p.gib_per_s();
                let cpu = s.host_cpu_s_per_gib() / p.host_cpu_s_per_gib();
                target(
                    format!("{w} {path} >= 0.5x {base} (aim 0.8x) at host CPU <= 0.10x"),
                    format!("{thr:.2}x at {cpu:.2}x"),
                    thr >= 0.5 && cpu <= 0.10,
                    meaning::SAMPLE,
                );
            }
        }
    }
    for w in ["checkpoint-write", "checkpoint-read"] {
        if let (Some(s), Some(p)) = (sm(w), px(w)) {
            let r = s.gib_per_s() / p.gib_per_s();
            let claim = format!("{w} shim >= 0.8x {base} (with fsync)");
            target(claim, format!("{r:.2}x"), r >= 0.8, meaning::CHECKPOINT);
        }
    }
    // Over DAOS, against DAOS's own host clients on each row (issue 26's bars).
    let mut workloads: Vec<&str> = Vec::new();
    for t in totals.iter().filter(|t| PEERS.contains(&t.path.as_str())) {
        if !workloads.contains(&t.workload.as_str()) {
            workloads.push(&t.workload);
        }
    }
    let unit = |t: &Figures| if t.bytes > 0 { "host CPU/GiB" } else { "host CPU/op" };
    for w in workloads {
        let row = |path: &str| totals.iter().find(|t| t.path == path && t.workload == w);
        if let Some(s) = row("shim-ucx-sm")
            && let Some(p) = best_peer(totals, s)
        {
            let (thr, cpu) = against(s, p);
            target(
                format!("{w} shim-ucx-sm >= 1.0x the best peer ({}) at {} <= 0.10x", p.path, unit(s)),
                format!("{thr:.2}x at {cpu:.3}x"),
                thr >= 1.0 && cpu <= 0.10,
                meaning::PEER_SHIM,
            );
        }
        for (ours, peer, meaning) in [(PRELOAD, PIL4DFS, meaning::PEER_PRELOAD), (FUSE, DFUSE, meaning::PEER_FUSE)] {
            if let (Some(s), Some(p)) = (row(ours), row(peer)) {
                let (thr, cpu) = against(s, p);
                target(
                    format!("{w} {ours} >= 0.8x {peer} at lower {}", unit(s)),
                    format!("{thr:.2}x at {cpu:.2}x"),
                    thr >= 0.8 && cpu < 1.0,
                    meaning,
                );
            }
        }
    }
    // The TCP transports against one TCP stream on the same path, in the same run.
    let stream = totals.iter().find(|t| t.path == TCP_STREAM && t.workload == "seq-read");
    for path in ["shim-ucx-tcp", "shim-ofi-tcp"] {
        let row = totals.iter().find(|t| t.path == path && t.workload == "seq-read");
        if let (Some(s), Some(b)) = (row, stream) {
            let r = s.gib_per_s() / b.gib_per_s();
            target(
                format!(
                    "seq-read {path} ({} KiB, {} in flight) >= 0.8x {TCP_STREAM}",
                    s.block_bytes >> 10,
                    s.queue_depth
                ),
                format!("{r:.2}x ({:.3} of {:.3} GiB/s)", s.gib_per_s(), b.gib_per_s()),
                r >= 0.8,
                meaning::TCP,
            );
        }
    }
    // libfabric's shm provider against UCX shared memory, measured in the same run.
    let ofi = |w: &str| totals.iter().find(|t| t.path == "shim-ofi-shm" && t.workload == w);
    if let (Some(o), Some(u)) = (ofi("seq-read"), sm("seq-read")) {
        let thr = o.gib_per_s() / u.gib_per_s();
        let cpu = o.host_cpu_s_per_gib() / u.host_cpu_s_per_gib();
        let claim = "seq-read shim-ofi-shm throughput >= 0.8x shim-ucx-sm".to_owned();
        target(claim, format!("{thr:.2}x"), thr >= 0.8, meaning::OFI);
        let claim = "seq-read shim-ofi-shm host CPU/GiB <= 1.5x shim-ucx-sm".to_owned();
        target(claim, format!("{cpu:.2}x"), cpu <= 1.5, meaning::OFI);
    }
    out
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A byte workload's row: `gib` GiB in one second, `host_ms` and `agent_ms` of CPU.
    fn row(workload: &str, path: &str, gib: u64, host_ms: u64, agent_ms: u64) -> Figures {
        Figures {
            workload: workload.into(),
            path: path.into(),
            bytes: gib << 30,
            ops: gib * 1024,
            wall: Duration::from_secs(1),
            host_cpu: Duration::from_millis(host_ms),
            agent_cpu: Some(Duration::from_millis(agent_ms)),
            ..Figures::default()
        }
    }

    #[test]
    fn the_baselines_read_the_stored_bytes_and_the_encrypted_rows_decrypt() {
        assert_eq!(note("posix"), Some("the stored bytes, no dpuio"));
        assert!(note(LIBDFS).is_some_and(|n| n.starts_with("the stored bytes")));
        assert_eq!(note("shim-ucx-sm+decrypt"), Some("the agent decrypts"));
        assert_eq!(note("shim-ucx-sm"), None);
        assert!(describe("shim-ucx-tcp+decrypt").starts_with("shim-ucx-tcp as the tenant with inline encryption"));
    }

    #[test]
    fn long_explanations_wrap_under_their_first_word() {
        let text = "word ".repeat(60);
        let wrapped = wrap("  lead  ", &text);
        let lines: Vec<&str> = wrapped.lines().collect();
        assert!(lines.len() > 2 && lines.iter().all(|l| l.len() <= 120), "{wrapped}");
        assert!(lines[0].starts_with("  lead  word") && lines[1].starts_with("        word"), "{wrapped}");
        assert_eq!(wrapped.split_whitespace().filter(|w| *w == "word").count(), 60);
        assert_eq!(wrap("x ", "short"), "x short");
    }

    #[test]
    fn every_target_says_what_it_means() {
        let rows = [row("seq-read", "posix", 10, 400, 10), row("seq-read", "shim-ucx-sm", 12, 50, 2000)];
        let targets = targets(&rows);
        assert_eq!(targets.len(), 2, "throughput and host CPU");
        let text: Vec<String> = targets.iter().map(ToString::to_string).collect();
        assert!(text[0].starts_with("target: seq-read shim-ucx-sm throughput >= 0.8x posix (aim 1.0x): 1.20x  met\n"));
        assert!(text[1].starts_with("target: seq-read shim-ucx-sm host CPU/GiB <= 10% of posix: 10.4%  NOT met\n"));
        for t in &text {
            assert!(t.lines().nth(1).is_some_and(|l| l.trim_start().starts_with("means: ") && l.len() > 40), "{t}");
        }
    }

    #[test]
    fn over_daos_each_row_meets_the_fastest_peer_and_the_targets_say_met_or_not() {
        let rows = [
            row("seq-read", LIBDFS, 2, 800, 0),
            row("seq-read", DFUSE, 1, 900, 0),
            row("seq-read", PIL4DFS, 3, 1500, 0),
            row("seq-read", "shim-ucx-sm", 4, 100, 3000),
            row("seq-read", PRELOAD, 2, 1200, 3000),
            row("seq-read", FUSE, 1, 810, 3000),
        ];
        assert_eq!(best_peer(&rows, &rows[3]).map(|p| p.path.as_str()), Some(PIL4DFS), "the fastest, not the first");
        let (thr, cpu) = against(&rows[3], &rows[2]);
        assert!((thr - 4.0 / 3.0).abs() < 1e-9 && (cpu - (100.0 / 4.0) / (1500.0 / 3.0)).abs() < 1e-9);
        let text: Vec<String> = targets(&rows).iter().map(ToString::to_string).collect();
        let line = |start: &str| text.iter().find(|t| t.starts_with(start)).unwrap_or_else(|| panic!("{text:#?}"));
        assert!(line("target: seq-read shim-ucx-sm >= 1.0x the best peer (pil4dfs)").contains("1.33x at 0.050x  met"));
        // preload: 0.67x of pil4dfs's rate, at 1.2x its host CPU per GiB.
        assert!(line("target: seq-read preload >= 0.8x pil4dfs").contains("0.67x at 1.20x  NOT met"));
        // fuse: as fast as dfuse, at less host CPU.
        assert!(line("target: seq-read fuse >= 0.8x dfuse").contains("1.00x at 0.90x  met"));
    }

    #[test]
    fn a_path_without_a_row_says_why() {
        let rows = [
            row("seq-read", "shim-ucx-sm", 1, 10, 0),
            row("seq-read", TCP_STREAM, 1, 10, 0),
            row("metadata-sample128k", "shim-ucx-sm", 1, 10, 0),
        ];
        let paths: Vec<String> = ["shim", "tcp-stream", "libdfs"].map(String::from).into();
        let gaps = gaps(&rows, &paths);
        assert_eq!(gaps.len(), 3, "{gaps:#?}");
        assert!(gaps[0].starts_with("no tcp-stream row of metadata-sample128k: one TCP stream"), "{}", gaps[0]);
        assert!(gaps[1].starts_with("no libdfs row of seq-read: not measured"), "{}", gaps[1]);
        assert!(gaps[2].starts_with("no libdfs row of metadata-sample128k: dpuio-bench-agent"), "{}", gaps[2]);
    }

    #[test]
    fn the_summary_compares_dpuio_with_the_baseline_and_decrypting_with_plain() {
        let rows = [
            row("seq-read", "posix", 10, 400, 0),
            row("seq-read", "shim-ucx-sm", 12, 40, 2000),
            row("seq-read", "shim-ucx-sm+decrypt", 6, 30, 3000),
        ];
        let lines = summary_lines(&rows, true);
        let text = lines.join("\n");
        let line =
            |start: &str| lines.iter().filter(|l| l.trim_start().starts_with(start)).cloned().collect::<Vec<_>>();
        let did = line("seq-read");
        assert_eq!(did.len(), 3, "two rows against posix, one against the plain tenant:\n{text}");
        assert!(did[0].contains("shim-ucx-sm ") && did[0].contains("1.20x (faster)"), "{}", did[0]);
        assert!(did[0].contains("0.08x (92% less)"), "{}", did[0]);
        assert!(did[1].contains("shim-ucx-sm+decrypt") && did[1].contains("0.60x (slower)"), "{}", did[1]);
        assert!(
            did[2].contains("0.50x (slower)") && did[2].contains("0.5000") && did[2].contains("0.1667"),
            "{}",
            did[2]
        );
        assert!(!lines.iter().any(|l| l.trim_start().starts_with("seq-read") && l.contains(" posix ")), "{text}");
        assert!(text.contains("the agent ran on this machine"), "{text}");
        assert!(summary_lines(&rows[..1], false).is_empty(), "no dpuio row, no summary");
    }
}
