//! The paths whose POSIX code runs under a preloaded library, in a child: `preload` and
//! `pil4dfs`. The same POSIX code as the `posix` rows (std::fs, `pread`, `pwrite`), run
//! by a child `dpuio-bench` with `LD_PRELOAD` set and `--posix-root` a prefix the library
//! intercepts, so that every file call under it goes where an unmodified program's
//! would:
//!
//! - `preload`: `libdpuio_preload.so` with `DPUIO_MOUNT` a prefix of its own (no real
//!   directory), the calls going to dpuio;
//! - `pil4dfs`: DAOS's `libpil4dfs.so` with the prefix the `dfuse` path's mount of the
//!   container: libpil4dfs finds dfuse mounts in the mount table, asks dfuse which pool
//!   and container each serves, and runs the DAOS client in the job's process for calls
//!   under them; what it does not intercept goes through the kernel to dfuse, so the
//!   daemon's CPU counts as the child's host CPU too (`--host-cpu-pid`).
//!
//! The child measures its own cells (its whole CPU time is host CPU: the program, the
//! library's copies and its threads) and sends them back as JSON lines on stdout.
//!
//! A child per workload rather than interleaved rounds: the library is loaded at exec,
//! so it cannot be switched on for some cells of one process.

use std::ffi::OsString;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use dpuio_shim::cli::ConnectArgs;

use dpuio_bench_core::{Figures, Workload, child, companion};

use crate::args::{BenchArgs, ChildPath};
use crate::dfuse_path::DfuseMount;
use crate::setup::PRELOAD_LIBRARY;

/// One preloaded path: its library, the prefix its child works under, what else the
/// child's environment needs.
pub struct PreloadPath {
    path: ChildPath,
    library: PathBuf,
    /// The child's --posix-root.
    prefix: String,
    env: Vec<(&'static str, OsString)>,
    /// Another process whose CPU time is the child's host CPU too.
    host_cpu_pid: Option<u32>,
}

impl PreloadPath {
    /// dpuio's library at `$DPUIO_PRELOAD_LIBRARY`, else beside this program; the child
    /// attaches with dpuio's connection settings.
    pub fn preload(connect: &ConnectArgs) -> Result<PreloadPath, String> {
        let library = companion("DPUIO_PRELOAD_LIBRARY", PRELOAD_LIBRARY, "dpuio-preload", "preload path")?;
        let prefix = format!("/dpuio-bench-preload-{}", std::process::id());
        let mut env: Vec<(&'static str, OsString)> = vec![
            ("DPUIO_MOUNT", prefix.clone().into()),
            // As docs/unmodified-apps.md asks of preloaded programs: UCX's mmap hooks
            // would route the program's mmap around the library.
            ("UCX_MEM_MMAP_HOOK_MODE", std::env::var_os("UCX_MEM_MMAP_HOOK_MODE").unwrap_or("none".into())),
            ("DPUIO_AGENT", connect.agent.clone().into()),
            ("DPUIO_TENANT", connect.tenant.clone().into()),
            ("DPUIO_TOKEN", connect.token.clone().into()),
        ];
        let optional = [
            ("DPUIO_CERT", connect.cert.as_ref().map(|p| p.as_os_str().to_owned())),
            ("DPUIO_KEY", connect.key.as_ref().map(|p| p.as_os_str().to_owned())),
            ("DPUIO_CA", connect.ca.as_ref().map(|p| p.as_os_str().to_owned())),
            ("DPUIO_TLS_SERVER_NAME", connect.tls_server_name.as_ref().map(Into::into)),
            ("DPUIO_INTERFACE", connect.interface.as_ref().map(Into::into)),
        ];
        env.extend(optional.into_iter().filter_map(|(name, value)| value.map(|v| (name, v))));
        Ok(PreloadPath { path: ChildPath::Preload, library, prefix, env, host_cpu_pid: None })
    }

    /// DAOS's libpil4dfs on `dfuse`'s mount of the container; the child reaches the
    /// daos_agent at `--daos-agent-socket-dir` if given (else as DAOS's clients do).
    pub fn pil4dfs(dfuse: &DfuseMount, args: &BenchArgs) -> Result<PreloadPath, String> {
        let library = dfuse.pil4dfs_library()?;
        let mut env: Vec<(&'static str, OsString)> = Vec::new();
        if let Some(dir) = &args.daos_agent_socket_dir {
            env.push(("DAOS_AGENT_DRPC_DIR", dir.as_os_str().to_owned()));
        }
        Ok(PreloadPath {
            path: ChildPath::Pil4dfs,
            library,
            prefix: dfuse.dir.to_string_lossy().into_owned(),
            env,
            host_cpu_pid: Some(dfuse.pid()),
        })
    }

    /// The name of its rows.
    pub fn name(&self) -> &'static str {
        self.path.name()
    }

    /// Run `workload`'s POSIX code in a child under the library; its figures.
    pub fn run(&self, args: &BenchArgs, workload: Workload) -> Result<Vec<Figures>, String> {
        let name = self.name();
        let me = std::env::current_exe().map_err(|e| format!("{name} path: where is this program? {e}"))?;
        let mut running = Command::new(me)
            .args(args.child_args(workload, &self.prefix, self.path, self.host_cpu_pid))
            .env("LD_PRELOAD", &self.library)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{name} path: cannot start the child: {e}"))?;
        let stdout = running.stdout.take().ok_or_else(|| format!("{name} path: the child's stdout"))?;
        let mut figures = Vec::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("{name} path: reading the child's output: {e}"))?;
            match child::receive(&line) {
                Some(figure) => figures.push(figure.map_err(|e| format!("{name} path: {e}"))?),
                None => println!("{line}"),
            }
        }
        let status = running.wait().map_err(|e| format!("{name} path: waiting for the child: {e}"))?;
        if !status.success() {
            return Err(format!(
                "{name} path: the child ({}) exited with {status} (its error is above)",
                self.library.display()
            ));
        }
        Ok(figures)
    }
}
