//! `dpuio-bench-agent`: the benchmarks that need the agent's crates, run by `dpuio bench`
//! (through `dpuio-bench`) rather than by hand.
//!
//! `crypto` measures the agent's ciphers against `openssl speed` (`dpuio bench crypto`
//! runs it with its arguments). `libdfs` is the baseline of `dpuio bench --backend
//! daos`: it mounts the tenant's DAOS container with libdfs in this process, the way
//! pydaos reads, and runs the baseline's part of each workload when `dpuio-bench` asks
//! (requests on stdin, figures on stdout: `dpuio_bench_core::child`), interleaved with
//! the shim's rounds.
//!
//! A program of its own so that `dpuio-bench`, on the host side, depends on no crate of
//! the agent. What it deliberately does not do: talk to an agent, or print tables (the
//! libdfs figures go to `dpuio-bench`, which reports them beside the shim's).
#![forbid(unsafe_code)]

mod crypto;
mod libdfs;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The benchmarks of dpuio that need the agent's crates; `dpuio bench` runs them.
#[derive(Parser)]
#[command(name = "dpuio-bench-agent", version)]
struct Cli {
    #[command(subcommand)]
    which: Which,
}

#[derive(Subcommand)]
enum Which {
    /// AES-256-GCM seal/open throughput per crypto provider, against `openssl speed`.
    Crypto(crypto::CryptoBenchArgs),
    /// The libdfs baseline of `dpuio bench --backend daos`, serving `dpuio-bench`'s
    /// requests on stdin (not by hand).
    Libdfs(libdfs::LibdfsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let me = dpuio_bench_core::invoked_as("dpuio-bench-agent");
    let result = match cli.which {
        Which::Crypto(args) => crypto::run(args),
        Which::Libdfs(args) => libdfs::serve(&args),
    };
    dpuio_bench_core::exit(&me, result)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn both_benchmarks_parse() {
        let crypto = Cli::try_parse_from(["dpuio-bench-agent", "crypto", "--rounds", "1"]).expect("parses");
        assert!(matches!(crypto.which, Which::Crypto(_)));
        let libdfs =
            Cli::try_parse_from(["dpuio-bench-agent", "libdfs", "--pool", "p", "--container", "c"]).expect("parses");
        assert!(matches!(libdfs.which, Which::Libdfs(_)));
    }
}
