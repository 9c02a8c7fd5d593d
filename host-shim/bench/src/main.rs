//! `dpuio-bench`, run as `dpuio bench`: dpuio's benchmarks.
//!
//! The workloads (`workloads`, `dlio`) run the same I/O through the shim and through a
//! baseline without dpuio (POSIX on the container's directory, or libdfs over DAOS in
//! a child `dpuio-bench-agent`, see `libdfs`), interleaved, and report throughput,
//! latency and CPU per GiB (`plot` draws them); `qos` measures tenant isolation on one
//! agent, starting its own with `--agent-bin` through `dpuio-harness`, as the
//! end-to-end tests do; `crypto` runs `dpuio-bench-agent crypto`, which measures the
//! agent's ciphers against `openssl speed`; `soak` runs a mixed workload of three
//! tenants on an agent of its own for minutes and watches its memory, fds and regions;
//! `startup` times process starts with and without the preload library (no agent).
//!
//! A program of its own rather than part of the `dpuio` command, so that the host
//! library and the CLI do not carry plotting and progress bars; and it links no crate
//! of the agent (libdfs, the agent's crypto): what needs them is `dpuio-bench-agent`'s.
//! `dpuio bench ARGS` runs this program with `ARGS` and dpuio's connection
//! options in their `DPUIO_*` variables. What it deliberately does not do: judge a
//! machine (the targets it prints are fixed bars, for comparing runs) or tune
//! anything it measures.
#![forbid(unsafe_code)]

mod args;
mod dfuse_path;
mod dlio;
mod fuse_path;
mod libdfs;
mod plot;
mod preload_path;
mod qos;
mod report;
mod setup;
mod soak;
mod startup;
mod tcp_stream;
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
    workloads: args::BenchArgs,
}

#[derive(Subcommand)]
enum Which {
    /// AES-256-GCM seal/open throughput per crypto provider, against `openssl speed`
    /// (`dpuio-bench-agent crypto`, found beside this program or at $DPUIO_BENCH_AGENT;
    /// `crypto --help` lists its options).
    #[command(disable_help_flag = true)]
    Crypto {
        /// The options of `dpuio-bench-agent crypto`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// The other end of the tcp-stream path, for an agent in another network namespace or
    /// machine: run it there, beside the agent; it prints the address it listens on (give
    /// it as --stream-source) and writes zeros to every connection until killed.
    StreamSource {
        /// HOST:PORT to listen on (port 0: the kernel picks one, printed).
        #[arg(long, value_name = "HOST:PORT")]
        listen: String,
    },
}

/// `crypto`: the agent-side program with `args`, under this program's name (its usage and
/// errors then read as ours did); its exit status.
fn crypto(me: &str, args: &[std::ffi::OsString]) -> Result<ExitCode, String> {
    use std::os::unix::process::CommandExt;
    let program = libdfs::program("crypto")?;
    let status = std::process::Command::new(&program)
        .arg0(me)
        .arg("crypto")
        .args(args)
        .status()
        .map_err(|e| format!("crypto: cannot start {}: {e}", program.display()))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(code.clamp(1, 255) as u8),
        None => ExitCode::FAILURE,
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let me = dpuio_bench_core::invoked_as("dpuio-bench");
    let result = match cli.which {
        // Its errors are its own to say.
        Some(Which::Crypto { args }) => match crypto(&me, &args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Some(Which::StreamSource { listen }) => tcp_stream::serve_forever(&listen),
        None => match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(runtime) => runtime.block_on(workloads::run(&cli.connect, cli.workloads)).map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot start the async runtime: {e}")),
        },
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
    fn interface_is_taken_as_dpuio_takes_it() {
        let cli =
            Cli::try_parse_from(["dpuio-bench", "seq-read", "--paths", "tcp", "--interface", "veth1"]).expect("parses");
        assert_eq!(cli.connect.interface.as_deref(), Some("veth1"));
        assert!(cli.which.is_none());
        let crypto = Cli::try_parse_from(["dpuio-bench", "crypto", "--rounds", "1"]).expect("parses");
        assert!(matches!(crypto.which, Some(Which::Crypto { args }) if args == ["--rounds", "1"]));
    }
}
