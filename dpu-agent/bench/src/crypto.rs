//! `dpuio bench crypto`: AES-256-GCM seal and open throughput of the agent's crypto
//! providers (aws-lc-rs, the default, and RustCrypto `aes-gcm`) through the real
//! block path ([`dpuio_crypto::measure`]: a fresh nonce, the AAD and a tag per
//! block), side by side with `openssl speed -evp aes-256-gcm` at the same block
//! sizes, in one run, interleaved round by round so every figure sees the same
//! machine load.
//!
//! Like `openssl speed`, one thread, one block buffer kept in cache: this measures the
//! cipher, not memory bandwidth. It runs on the machine it is started on; start it on
//! the DPU to see the agent's figures.
//!
//! The divisor is CPU time by default, as `openssl speed` does by default (its user
//! time; here the measuring thread's CPU time, warm-up included in both bytes and
//! time): on a shared machine, wall-clock figures measure the neighbours as much as
//! the cipher. `--elapsed` switches both to wall-clock time (`openssl speed
//! -elapsed`). OpenSSL's `open` figure is `-decrypt`, which
//! decrypts and computes the tag without a valid tag to compare (its own speed test
//! does not authenticate), so it is the same work as ours. Each cell reports the best
//! of `--rounds` (on a shared machine the best is the cipher, the spread is the
//! neighbours).
//!
//! Target: the default provider at least 0.9x OpenSSL at the same block size, so that
//! sealing on the agent is no reason to reach for OpenSSL instead.

use std::process::Command;
use std::time::Duration;

use dpuio_crypto::{CryptoProvider, Op, default_provider, measure, provider_by_name};

const GIB: f64 = (1u64 << 30) as f64;
/// Bytes of the short first measurement that sizes the timed ones.
const CALIBRATION_BYTES: u64 = 32 << 20;
/// The target: default provider / OpenSSL (see the module docs).
const TARGET_RATIO: f64 = 0.9;

/// Options of `dpuio bench crypto`.
#[derive(clap::Args, Debug, Clone)]
pub struct CryptoBenchArgs {
    /// One JSON object per result on stdout instead of a table (target lines go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Seconds per measurement (each provider, operation and block size; openssl's
    /// `-seconds`, rounded to whole seconds, at least 1).
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Measurements per cell, interleaved; the best is reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Encryption block sizes in bytes (powers of two from 4 KiB to 16 MiB).
    #[arg(long, value_delimiter = ',', default_value = "65536,1048576")]
    pub block_bytes: Vec<u32>,
    /// Providers to measure (aws-lc-rs, rustcrypto).
    #[arg(long, value_delimiter = ',', default_value = "aws-lc-rs,rustcrypto")]
    pub providers: Vec<String>,
    /// The openssl program to compare with; skipped with a note if it cannot be run.
    #[arg(long, default_value = "openssl")]
    pub openssl: String,
    /// Divide by wall-clock time instead of CPU time (ours and openssl's).
    #[arg(long)]
    pub elapsed: bool,
}

/// One measured cell.
#[derive(Debug, Clone, PartialEq)]
pub struct CryptoFigure {
    /// `aws-lc-rs`, `rustcrypto` or `openssl`.
    pub provider: String,
    pub op: Op,
    pub block_bytes: u32,
    /// Best of the rounds.
    pub gib_per_s: f64,
    /// Bytes and time (CPU or wall clock, see `--elapsed`) of the best round.
    pub bytes: u64,
    pub elapsed: Duration,
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// [`measure`] once, timed by wall clock (`elapsed`) or by this thread's CPU time.
fn measure_one(
    provider: &'static dyn CryptoProvider,
    op: Op,
    block_bytes: u32,
    total: u64,
    elapsed: bool,
) -> Result<CryptoFigure, String> {
    let cpu_start = thread_cpu();
    let t = measure(provider, op, block_bytes, total).map_err(|e| e.to_string())?;
    let cpu = thread_cpu().saturating_sub(cpu_start);
    let (bytes, time) = if elapsed {
        (t.bytes, t.elapsed)
    } else {
        // measure() warms up on a tenth of the blocks (at least one) before its timed
        // part; the CPU clock ran through both.
        let blocks = t.bytes / u64::from(block_bytes);
        (t.bytes + (blocks / 10).max(1) * u64::from(block_bytes), cpu)
    };
    Ok(CryptoFigure {
        provider: t.provider.to_owned(),
        op,
        block_bytes,
        gib_per_s: bytes as f64 / GIB / time.as_secs_f64().max(1e-9),
        bytes,
        elapsed: time,
    })
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Seal => "seal",
        Op::Open => "open",
        Op::OpenCopy => "open+copy",
    }
}

/// Run the benchmark and print it.
pub fn run(args: CryptoBenchArgs) -> Result<(), String> {
    if args.rounds == 0 || args.seconds.is_nan() || args.seconds <= 0.0 {
        return Err("--rounds and --seconds must be positive".into());
    }
    let providers: Vec<&'static dyn CryptoProvider> = args
        .providers
        .iter()
        .map(|name| provider_by_name(name).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let mut openssl = Some(args.openssl.as_str());
    let mut figures: Vec<CryptoFigure> = Vec::new();
    for &block_bytes in &args.block_bytes {
        // Size each provider's measurement to about --seconds.
        let mut totals = Vec::with_capacity(providers.len() * 2);
        for &provider in &providers {
            for op in [Op::Seal, Op::Open] {
                let probe = measure(provider, op, block_bytes, CALIBRATION_BYTES).map_err(|e| e.to_string())?;
                let total = (probe.gib_per_s() * GIB * args.seconds) as u64;
                totals.push((provider, op, total.max(u64::from(block_bytes))));
            }
        }
        for _ in 0..args.rounds {
            for &(provider, op, total) in &totals {
                keep_best(&mut figures, measure_one(provider, op, block_bytes, total, args.elapsed)?);
            }
            for op in [Op::Seal, Op::Open] {
                let Some(program) = openssl else { break };
                match openssl_speed(program, op, block_bytes, args.seconds, args.elapsed) {
                    Ok(figure) => keep_best(&mut figures, figure),
                    Err(reason) => {
                        eprintln!("dpuio bench crypto: openssl skipped: {reason}");
                        openssl = None;
                    }
                }
            }
        }
    }
    report(&figures, &args);
    Ok(())
}

/// Record `figure`, or keep the better of it and the one already recorded for its cell.
fn keep_best(figures: &mut Vec<CryptoFigure>, figure: CryptoFigure) {
    let same = |f: &&mut CryptoFigure| {
        f.provider == figure.provider && f.op == figure.op && f.block_bytes == figure.block_bytes
    };
    match figures.iter_mut().find(same) {
        Some(best) if best.gib_per_s >= figure.gib_per_s => {}
        Some(best) => *best = figure,
        None => figures.push(figure),
    }
}

/// `openssl speed -evp aes-256-gcm -bytes N -seconds S` (with `-decrypt` for open,
/// `-elapsed` for wall-clock time).
fn openssl_speed(program: &str, op: Op, block_bytes: u32, seconds: f64, elapsed: bool) -> Result<CryptoFigure, String> {
    let whole_seconds = seconds.round().max(1.0) as u64;
    let mut command = Command::new(program);
    command.arg("speed");
    if op == Op::Open {
        command.arg("-decrypt");
    }
    if elapsed {
        command.arg("-elapsed");
    }
    command.args(["-evp", "aes-256-gcm", "-bytes", &block_bytes.to_string(), "-seconds", &whole_seconds.to_string()]);
    let output = command.output().map_err(|e| format!("cannot run {program}: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("{program} speed failed ({}): {}", output.status, stderr.trim()));
    }
    let bytes_per_s = parse_openssl_speed(&stdout)
        .ok_or_else(|| format!("cannot read the result of {program} speed from its last line: {stdout:?}"))?;
    let elapsed = Duration::from_secs(whole_seconds);
    Ok(CryptoFigure {
        provider: "openssl".into(),
        op,
        block_bytes,
        gib_per_s: bytes_per_s / GIB,
        bytes: (bytes_per_s * elapsed.as_secs_f64()) as u64,
        elapsed,
    })
}

/// Bytes per second from the last line of `openssl speed` with one block size:
/// `AES-256-GCM    2910087.53k`, in thousands of bytes per second.
fn parse_openssl_speed(stdout: &str) -> Option<f64> {
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty())?;
    let value = last.split_whitespace().last()?;
    let thousands: f64 = value.strip_suffix('k')?.parse().ok()?;
    (thousands.is_finite() && thousands > 0.0).then_some(thousands * 1000.0)
}

fn block_name(block_bytes: u32) -> String {
    match block_bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b % 1024 == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn report(figures: &[CryptoFigure], args: &CryptoBenchArgs) {
    let openssl = |op: Op, block_bytes: u32| {
        figures.iter().find(|f| f.provider == "openssl" && f.op == op && f.block_bytes == block_bytes)
    };
    if args.json {
        for f in figures {
            let ratio = openssl(f.op, f.block_bytes)
                .filter(|_| f.provider != "openssl")
                .map_or("null".to_owned(), |o| format!("{:.3}", f.gib_per_s / o.gib_per_s));
            println!(
                "{{\"provider\":\"{}\",\"op\":\"{}\",\"block_bytes\":{},\"gib_per_s\":{:.4},\"bytes\":{},\"seconds\":{:.3},\"clock\":\"{}\",\"rounds\":{},\"ratio_to_openssl\":{}}}",
                f.provider,
                op_name(f.op),
                f.block_bytes,
                f.gib_per_s,
                f.bytes,
                f.elapsed.as_secs_f64(),
                if args.elapsed { "wall" } else { "cpu" },
                args.rounds,
                ratio,
            );
        }
    } else {
        println!("{:<11} {:<5} {:>8} {:>8} {:>10}", "provider", "op", "block", "GiB/s", "vs openssl");
        for f in figures {
            let ratio = openssl(f.op, f.block_bytes)
                .filter(|_| f.provider != "openssl")
                .map_or("-".to_owned(), |o| format!("{:.2}x", f.gib_per_s / o.gib_per_s));
            println!(
                "{:<11} {:<5} {:>8} {:>8.3} {:>10}",
                f.provider,
                op_name(f.op),
                block_name(f.block_bytes),
                f.gib_per_s,
                ratio
            );
        }
    }
    let default = default_provider().name();
    for f in figures.iter().filter(|f| f.provider == default) {
        let line = match openssl(f.op, f.block_bytes) {
            Some(o) => {
                let ratio = f.gib_per_s / o.gib_per_s;
                let verdict = if ratio >= TARGET_RATIO { "met" } else { "NOT met" };
                format!(
                    "target: default provider ({default}) >= {TARGET_RATIO}x OpenSSL at the same block size, {} {}: {ratio:.2}x  {verdict}",
                    op_name(f.op),
                    block_name(f.block_bytes)
                )
            }
            None => format!(
                "target: default provider ({default}) >= {TARGET_RATIO}x OpenSSL at the same block size, {} {}: no OpenSSL figure",
                op_name(f.op),
                block_name(f.block_bytes)
            ),
        };
        if args.json { eprintln!("{line}") } else { println!("{line}") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_last_line_of_openssl_speed() {
        let out = "The 'numbers' are in 1000s of bytes per second processed.\n\
                   type          65536 bytes\nAES-256-GCM    2910087.53k\n";
        assert_eq!(parse_openssl_speed(out), Some(2_910_087_530.0));
        assert_eq!(parse_openssl_speed("AES-256-GCM 0.00k\n"), None);
        assert_eq!(parse_openssl_speed("garbage\n"), None);
        assert_eq!(parse_openssl_speed(""), None);
        assert_eq!(block_name(65536), "64 KiB");
        assert_eq!(block_name(1 << 20), "1 MiB");
    }

    #[test]
    fn keeps_the_best_round_per_cell() {
        let fig = |provider: &str, gib_per_s| CryptoFigure {
            provider: provider.into(),
            op: Op::Seal,
            block_bytes: 65536,
            gib_per_s,
            bytes: 1,
            elapsed: Duration::from_secs(1),
        };
        let mut figures = Vec::new();
        keep_best(&mut figures, fig("a", 1.0));
        keep_best(&mut figures, fig("a", 3.0));
        keep_best(&mut figures, fig("a", 2.0));
        keep_best(&mut figures, fig("b", 0.5));
        assert_eq!(figures.iter().map(|f| f.gib_per_s).collect::<Vec<_>>(), [3.0, 0.5]);
    }
}
