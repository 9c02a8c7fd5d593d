//! Single-thread AES-256-GCM throughput of both providers through the block path:
//!
//! ```sh
//! cargo run --release --example throughput [TOTAL_MIB] [ROUNDS]
//! ```
//!
//! For each provider, operation and block size (64 KiB and 1 MiB), runs
//! [`dpuio_crypto::measure`] ROUNDS times (default 3) over TOTAL_MIB MiB (default
//! 1024) and prints the best and the median round: on a shared machine the best is
//! the cipher, the spread is the neighbours. Compare with
//! `openssl speed -evp aes-256-gcm -bytes 65536 -seconds 2` on the same machine.

use dpuio_crypto::{AWS_LC_RS, CryptoProvider, Op, RUST_CRYPTO, measure};

fn main() -> Result<(), dpuio_crypto::Error> {
    let mut args = std::env::args().skip(1);
    let total_mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3).max(1);
    println!("{:<11} {:<5} {:>8} {:>11} {:>11} {:>10}", "provider", "op", "block", "best GiB/s", "median", "best MB/s");
    let providers: [&'static dyn CryptoProvider; 2] = [&AWS_LC_RS, &RUST_CRYPTO];
    for provider in providers {
        for block_bytes in [64 << 10, 1 << 20] {
            for op in [Op::Seal, Op::Open, Op::OpenCopy] {
                let mut runs = Vec::with_capacity(rounds);
                for _ in 0..rounds {
                    runs.push(measure(provider, op, block_bytes, total_mib << 20)?);
                }
                runs.sort_by(|a, b| b.gib_per_s().total_cmp(&a.gib_per_s()));
                let best = runs[0];
                println!(
                    "{:<11} {:<5} {:>5} KiB {:>11.2} {:>11.2} {:>10.0}",
                    best.provider,
                    format!("{op:?}").to_lowercase(),
                    block_bytes >> 10,
                    best.gib_per_s(),
                    runs[rounds / 2].gib_per_s(),
                    best.bytes as f64 / best.elapsed.as_secs_f64() / 1e6,
                );
            }
        }
    }
    Ok(())
}
