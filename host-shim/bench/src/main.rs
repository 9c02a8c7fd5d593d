//! `dpuio-bench`, run as `dpuio bench`: dpuio's benchmarks.
//!
//! The workloads (`workloads`, `dlio`) run the same I/O through the shim and through a
//! baseline without dpuio (POSIX on the container's directory, or libdfs in this process
//! over DAOS), interleaved, and report throughput, latency and CPU per GiB (`plot` draws
//! them); `qos` measures tenant isolation on one agent, starting its own with
//! `--agent-bin` through `dpuio-harness`, as the end-to-end tests do; `crypto` measures
//! the agent's ciphers against `openssl speed`; `soak` runs a mixed workload of three
//! tenants on an agent of its own for minutes and watches its memory, fds and regions.
//!
//! A program of its own rather than part of the `dpuio` command, so that the host
//! library and the CLI do not carry plotting, progress bars, libdfs and the agent's
//! crypto; `dpuio bench ARGS` runs this program with `ARGS` and dpuio's connection
//! options in their `DPUIO_*` variables. What it deliberately does not do: judge a
//! machine (the targets it prints are the issues', for comparing runs) or tune
//! anything it measures.
#![forbid(unsafe_code)]

mod crypto;
mod dlio;
mod fuse_path;
mod plot;
mod preload_path;
mod qos;
mod report;
mod soak;
mod workloads;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dpuio_shim::cli::ConnectArgs;

/// Measure workloads through the shim and through POSIX (or libdfs) on the same files,
/// tenant QoS (`qos`), or the agent's ciphers against OpenSSL (`crypto`).
#[derive(Parser)]
#[command(name = "dpuio-bench", version)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct Cli {
    /// The same as dpuio's (which passes its own on); not used by `crypto`.
    #[command(flatten, next_help_heading = "Connection (as for dpuio)")]
    connect: ConnectArgs,
    #[command(subcommand)]
    which: Option<Which>,
    #[command(flatten)]
    workloads: workloads::BenchArgs,
}

#[derive(Subcommand)]
enum Which {
    /// AES-256-GCM seal/open throughput per crypto provider, against `openssl speed`.
    Crypto(crypto::CryptoBenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // As invoked: `dpuio bench` when dpuio runs it, else `dpuio-bench`.
    let me = std::env::args_os()
        .next()
        .and_then(|a| std::path::Path::new(&a).file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "dpuio-bench".to_owned());
    let result = match cli.which {
        Some(Which::Crypto(args)) => crypto::run(args),
        None => match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(runtime) => runtime.block_on(workloads::run(&cli.connect, cli.workloads)).map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot start the async runtime: {e}")),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{me}: {e}");
            ExitCode::FAILURE
        }
    }
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
    fn interface_is_taken_as_dpuio_takes_it() {
        let cli =
            Cli::try_parse_from(["dpuio-bench", "seq-read", "--paths", "tcp", "--interface", "veth1"]).expect("parses");
        assert_eq!(cli.connect.interface.as_deref(), Some("veth1"));
        assert!(cli.which.is_none());
        let crypto = Cli::try_parse_from(["dpuio-bench", "crypto", "--rounds", "1"]).expect("parses");
        assert!(matches!(crypto.which, Some(Which::Crypto(_))));
    }
}
