//! The libdfs baseline of `--backend daos`, in a child: `dpuio-bench-agent libdfs`
//! mounts the tenant's DAOS container with libdfs (the agent's crates, which this
//! program does not link) and runs the baseline's part of each workload when asked,
//! one request at a time, so its rounds interleave with the shim's as before. Its
//! figures are its own process's clocks: libdfs and its threads, as when it ran here.
//!
//! The child is found at `$DPUIO_BENCH_AGENT`, else beside this program (`cargo build
//! --bins` and the dpuio-host package put it there).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use dpuio_bench_core::Figures;
use dpuio_bench_core::child::{self, DONE, ERROR, READY, Request};

use crate::args::BenchArgs;

/// The program's file name, as `cargo build` and the dpuio-host package put it.
pub const PROGRAM: &str = "dpuio-bench-agent";

/// `dpuio-bench-agent` at `$DPUIO_BENCH_AGENT`, else beside this program.
pub fn program(purpose: &str) -> Result<PathBuf, String> {
    dpuio_bench_core::companion("DPUIO_BENCH_AGENT", PROGRAM, "dpuio-bench-agent", purpose)
}

/// A running `dpuio-bench-agent libdfs` with the container mounted.
pub struct Libdfs {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Libdfs {
    /// Start the child on `--daos-pool`/`--daos-container` and wait until it has mounted
    /// the container (a failure is its error, as libdfs said it).
    pub fn start(args: &BenchArgs) -> Result<Libdfs, String> {
        let (Some(pool), Some(container)) = (&args.daos_pool, &args.daos_container) else {
            return Err(
                "--backend daos needs --daos-pool and --daos-container (the agent's pool and the tenant's container label)"
                    .into(),
            );
        };
        let mut command = Command::new(program("libdfs baseline")?);
        command.args(["libdfs", "--pool", pool, "--container", container]);
        if let Some(dir) = &args.daos_agent_socket_dir {
            command.arg("--agent-socket-dir").arg(dir);
        }
        if let Some(pid) = args.agent_pid {
            command.args(["--agent-pid", &pid.to_string()]);
        }
        let mut running = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("libdfs baseline: cannot start {PROGRAM}: {e}"))?;
        let stdin = running.stdin.take();
        let stdout = BufReader::new(running.stdout.take().ok_or("libdfs baseline: the child's stdout")?);
        let mut libdfs = Libdfs { child: running, stdin, stdout };
        libdfs.answer(READY)?;
        Ok(libdfs)
    }

    /// The baseline's figures of `request`.
    pub fn ask(&mut self, request: &Request) -> Result<Vec<Figures>, String> {
        let line = serde_json::to_string(request).map_err(|e| format!("libdfs baseline: encoding a request: {e}"))?;
        let stdin = self.stdin.as_mut().ok_or("libdfs baseline: the child's stdin is closed")?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("libdfs baseline: the child stopped taking requests: {e}"))?;
        self.answer(DONE)
    }

    /// Figure lines until `end`; an error line is the request's error; other lines are
    /// the child's and pass through.
    fn answer(&mut self, end: &str) -> Result<Vec<Figures>, String> {
        let mut figures = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).map_err(|e| format!("libdfs baseline: reading the child: {e}"))?;
            if n == 0 {
                let status = self.child.wait().map_err(|e| format!("libdfs baseline: waiting for the child: {e}"))?;
                return Err(format!("libdfs baseline: {PROGRAM} exited with {status} (its error is above)"));
            }
            let line = line.trim_end_matches('\n');
            if line == end {
                return Ok(figures);
            }
            if let Some(error) = line.strip_prefix(ERROR) {
                return Err(error.to_owned());
            }
            match child::receive(line) {
                Some(figure) => figures.push(figure?),
                None => println!("{line}"),
            }
        }
    }
}

impl Drop for Libdfs {
    /// Closing its stdin ends the child; wait for it, so no process outlives the run.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
