//! The `fuse` path: `dpuio mount` on a directory of its own for the length of the run,
//! so the benchmarks read the container by path through the kernel, as an unmodified
//! program does. The mount process runs on the host, so its CPU time counts as host
//! CPU beside this process's ([`FuseMount::pid`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dpuio_shim::cli::ConnectArgs;

/// How long a mount may take to appear.
const MOUNT_WAIT: Duration = Duration::from_secs(30);
/// How long the mount process has to unmount and exit after SIGTERM.
const UNMOUNT_WAIT: Duration = Duration::from_secs(10);

/// A `dpuio mount --foreground` serving `dir`; unmounted (SIGTERM) and removed on drop.
pub struct FuseMount {
    pub dir: PathBuf,
    child: Child,
}

impl FuseMount {
    /// Mount the container at a new directory under the temporary directory with the
    /// connection options given to this benchmark; waits until the kernel lists it.
    pub fn start(connect: &ConnectArgs) -> Result<FuseMount, String> {
        let dpuio = dpuio_program();
        let dir = std::env::temp_dir().join(format!("dpuio-bench-fuse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("fuse path: create {}: {e}", dir.display()))?;
        let child = Command::new(&dpuio)
            .arg("mount")
            .arg(&dir)
            .arg("--foreground")
            .envs(connect.to_env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "fuse path: cannot run {} (the fuse path needs dpuio beside dpuio-bench or on PATH): {e}",
                    dpuio.display()
                )
            })?;
        let mut mount = FuseMount { dir, child };
        let deadline = Instant::now() + MOUNT_WAIT;
        while !is_mounted(&mount.dir) {
            if let Ok(Some(status)) = mount.child.try_wait() {
                return Err(format!(
                    "fuse path: `dpuio mount {}` exited with {status} (its error is above)",
                    mount.dir.display()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("fuse path: {} was not mounted after {MOUNT_WAIT:?}", mount.dir.display()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(mount)
    }

    /// The mount process, whose CPU time is host CPU of the fuse path.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        // SIGTERM unmounts and exits 0; a process that does not is killed, and the
        // kernel mount (if any is left) is detached lazily.
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + UNMOUNT_WAIT;
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            eprintln!("dpuio bench: the fuse mount at {} did not exit on SIGTERM; killing it", self.dir.display());
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = Command::new("fusermount3").arg("-uz").arg(&self.dir).status();
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `dpuio` beside this executable (an install or a cargo target directory holds both),
/// else `dpuio` on PATH.
fn dpuio_program() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("dpuio")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("dpuio"))
}

/// `dir` is a mount point in this process's mount namespace.
pub fn is_mounted(dir: &Path) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else { return false };
    let dir = dir.to_string_lossy();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(&*dir))
}
