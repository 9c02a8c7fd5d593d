//! The `preload` path: the same POSIX code as the `posix` rows (std::fs, `pread`,
//! `pwrite`), run by a child `dpuio-bench` under `LD_PRELOAD=libdpuio_preload.so` with
//! `DPUIO_MOUNT` set to a prefix of its own as `--posix-root`, so that every file call
//! under it goes to dpuio exactly as an unmodified program's would. The child measures
//! its own cells (its whole CPU time is host CPU: the program, the library's copy into
//! the caller's buffer and its threads) and sends them back as JSON lines on stdout.
//!
//! A child per workload rather than interleaved rounds: the library is loaded at exec,
//! so it cannot be switched on for some cells of one process.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use dpuio_shim::cli::ConnectArgs;

use dpuio_bench_core::{Figures, Workload, child, companion};

use crate::args::BenchArgs;
use crate::setup::PRELOAD_LIBRARY;

pub struct PreloadPath {
    library: PathBuf,
    /// DPUIO_MOUNT of the child: a prefix no real directory needs to exist under.
    prefix: String,
}

impl PreloadPath {
    /// The library at `$DPUIO_PRELOAD_LIBRARY`, else beside this program.
    pub fn find() -> Result<PreloadPath, String> {
        let library = companion("DPUIO_PRELOAD_LIBRARY", PRELOAD_LIBRARY, "dpuio-preload", "preload path")?;
        let prefix = format!("/dpuio-bench-preload-{}", std::process::id());
        Ok(PreloadPath { library, prefix })
    }

    /// Run `workload`'s POSIX code in a child under the library; its figures.
    pub fn run(&self, connect: &ConnectArgs, args: &BenchArgs, workload: Workload) -> Result<Vec<Figures>, String> {
        let me = std::env::current_exe().map_err(|e| format!("preload path: where is this program? {e}"))?;
        let mut child = Command::new(me);
        child
            .args(args.child_args(workload, &self.prefix))
            .env("LD_PRELOAD", &self.library)
            .env("DPUIO_MOUNT", &self.prefix)
            // As docs/unmodified-apps.md asks of preloaded programs: UCX's mmap hooks
            // would route the program's mmap around the library.
            .env("UCX_MEM_MMAP_HOOK_MODE", std::env::var_os("UCX_MEM_MMAP_HOOK_MODE").unwrap_or("none".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        // The library attaches with dpuio's connection settings, from the environment.
        let optional = [
            ("DPUIO_CERT", connect.cert.as_ref().map(|p| p.as_os_str().to_owned())),
            ("DPUIO_KEY", connect.key.as_ref().map(|p| p.as_os_str().to_owned())),
            ("DPUIO_CA", connect.ca.as_ref().map(|p| p.as_os_str().to_owned())),
            ("DPUIO_TLS_SERVER_NAME", connect.tls_server_name.as_ref().map(Into::into)),
            ("DPUIO_INTERFACE", connect.interface.as_ref().map(Into::into)),
        ];
        child
            .env("DPUIO_AGENT", &connect.agent)
            .env("DPUIO_TENANT", &connect.tenant)
            .env("DPUIO_TOKEN", &connect.token);
        for (name, value) in optional {
            if let Some(v) = value {
                child.env(name, v);
            }
        }
        let mut running = child.spawn().map_err(|e| format!("preload path: cannot start the child: {e}"))?;
        let stdout = running.stdout.take().ok_or("preload path: the child's stdout")?;
        let mut figures = Vec::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("preload path: reading the child's output: {e}"))?;
            match child::receive(&line) {
                Some(figure) => figures.push(figure.map_err(|e| format!("preload path: {e}"))?),
                None => println!("{line}"),
            }
        }
        let status = running.wait().map_err(|e| format!("preload path: waiting for the child: {e}"))?;
        if !status.success() {
            return Err(format!("preload path: the child exited with {status} (its error is above)"));
        }
        Ok(figures)
    }
}
