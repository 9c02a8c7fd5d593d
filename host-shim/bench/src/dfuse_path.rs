//! The `dfuse` path of `--backend daos`: DAOS's own FUSE daemon mounts the tenant's
//! container (the one the agent serves, `--daos-pool`/`--daos-container`) on a directory
//! of its own for the length of the run, and the POSIX code of the `posix` rows runs on
//! that mount, reading the very files the shim wrote. The daemon is a host process, so
//! its CPU time is host CPU of the path ([`DfuseMount::pid`]). The `pil4dfs` path needs
//! the same mount: libpil4dfs finds its container by asking dfuse about the mount point.
//!
//! Caching is off unless `--dfuse-caching`: with dfuse's default the rounds after the
//! first would read this machine's page cache, not DAOS.
//!
//! Not here: starting DAOS or its agent; the daemon connects through the daos_agent at
//! `--daos-agent-socket-dir` (or `$DAOS_AGENT_DRPC_DIR`) as any DAOS client does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::args::BenchArgs;
use crate::fuse_path::is_mounted;

/// How long dfuse may take to connect to the pool and mount.
const MOUNT_WAIT: Duration = Duration::from_secs(60);
/// How long the daemon has to exit once unmounted.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// A `dfuse --foreground` serving `dir`; unmounted, stopped and the directory removed on
/// drop, whatever happened in between.
pub struct DfuseMount {
    pub dir: PathBuf,
    /// Where dfuse is installed: libpil4dfs is looked for beside it.
    pub program: PathBuf,
    child: Child,
}

impl DfuseMount {
    /// Mount `--daos-container` of `--daos-pool` at a new directory under the temporary
    /// directory; waits until the kernel lists the mount.
    pub fn start(args: &BenchArgs) -> Result<DfuseMount, String> {
        let (Some(pool), Some(container)) = (&args.daos_pool, &args.daos_container) else {
            return Err("the dfuse and pil4dfs paths need --backend daos with --daos-pool and --daos-container".into());
        };
        let program = dfuse_program()?;
        let dir = std::env::temp_dir().join(format!("dpuio-bench-dfuse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("dfuse path: create {}: {e}", dir.display()))?;
        let mut command = Command::new(&program);
        command.arg(&dir).arg(pool).arg(container).arg("--foreground");
        if !args.dfuse_caching {
            command.arg("--disable-caching");
        }
        if let Some(socket_dir) = &args.daos_agent_socket_dir {
            command.env("DAOS_AGENT_DRPC_DIR", socket_dir);
        }
        let child = command.stdin(Stdio::null()).stdout(Stdio::null()).spawn().map_err(|e| {
            format!("dfuse path: cannot run {}: {e} (set DPUIO_DFUSE to DAOS's dfuse)", program.display())
        })?;
        let mut mount = DfuseMount { dir, program, child };
        let deadline = Instant::now() + MOUNT_WAIT;
        while !is_mounted(&mount.dir) {
            if let Ok(Some(status)) = mount.child.try_wait() {
                return Err(format!(
                    "dfuse path: `{} {} {pool} {container}` exited with {status} (its error is above; does the \
                     container exist, and is the daos_agent reachable?)",
                    mount.program.display(),
                    mount.dir.display()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("dfuse path: {} was not mounted after {MOUNT_WAIT:?}", mount.dir.display()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(mount)
    }

    /// The daemon, whose CPU time is host CPU of the dfuse and pil4dfs paths.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// DAOS's libpil4dfs: `$DPUIO_PIL4DFS_LIBRARY`, else in the lib64 beside dfuse's bin.
    pub fn pil4dfs_library(&self) -> Result<PathBuf, String> {
        let path = match std::env::var_os("DPUIO_PIL4DFS_LIBRARY") {
            Some(p) => PathBuf::from(p),
            None => {
                let prefix = self.program.parent().and_then(Path::parent).unwrap_or(Path::new("/"));
                prefix.join("lib64/libpil4dfs.so")
            }
        };
        match path.is_file() {
            true => Ok(path),
            false => Err(format!(
                "pil4dfs path: {} not found (set DPUIO_PIL4DFS_LIBRARY to DAOS's libpil4dfs.so)",
                path.display()
            )),
        }
    }
}

impl Drop for DfuseMount {
    fn drop(&mut self) {
        // Unmounting ends a foreground dfuse; one that does not end gets SIGTERM, then
        // SIGKILL, and a mount left behind is detached lazily.
        let _ = Command::new("fusermount3").arg("-u").arg(&self.dir).stderr(Stdio::null()).status();
        if !exited(&mut self.child, EXIT_WAIT) {
            if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            if !exited(&mut self.child, EXIT_WAIT) {
                eprintln!("dpuio bench: dfuse at {} did not exit; killing it", self.dir.display());
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        if is_mounted(&self.dir) {
            let _ = Command::new("fusermount3").arg("-uz").arg(&self.dir).status();
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `child` has exited, waiting up to `limit` for it.
fn exited(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    !matches!(child.try_wait(), Ok(None))
}

/// `$DPUIO_DFUSE`, else `dfuse` on PATH, else DAOS's default install.
fn dfuse_program() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("DPUIO_DFUSE") {
        return Ok(PathBuf::from(p));
    }
    let on_path =
        std::env::var_os("PATH").iter().flat_map(std::env::split_paths).map(|d| d.join("dfuse")).find(|p| p.is_file());
    let program = on_path.unwrap_or_else(|| PathBuf::from("/opt/daos/bin/dfuse"));
    match program.is_file() {
        true => Ok(program),
        false => Err("dfuse path: DAOS's dfuse is neither on PATH nor at /opt/daos/bin/dfuse (set DPUIO_DFUSE)".into()),
    }
}
