//! `dpuio mount MOUNTPOINT`: the tenant's container as a FUSE file system, for static
//! binaries and everything else the `LD_PRELOAD` library cannot reach.
//!
//! This is an adapter: the kernel's requests (by inode number) become calls of
//! [`dpuio_shim::posix::Mount`] (by path), whose `errno`s go back unchanged, so a
//! program sees the same failures as under the preload library: `ENOENT`, `EEXIST`,
//! `EACCES` for what the capability denies, `EIO` for data that failed its integrity
//! check. Paths become inode numbers in [`Inodes`](crate::inodes::Inodes).
//!
//! What the kernel is asked for: its page cache (`FOPEN_KEEP_CACHE` when a file is
//! unchanged since it was last opened), entries and attributes cached for [`TTL`],
//! reads and writes of up to [`IO_BYTES`] (readahead too, where it may set it: root),
//! `readdirplus` (so `ls -l` costs one listing,
//! not a stat per entry), and several threads serving requests, each with a
//! data-plane ring of its own.
//!
//! What it deliberately leaves out: modes, owners and times are not stored by dpuio,
//! so `chmod`, `chown` and `utime` succeed and change nothing (files show the mounting
//! user as owner); no links, symlinks, device nodes or extended attributes (`ENOSYS`);
//! `rename` of a directory over an existing one is not atomic (see [`Mount::rename`]); `statfs`
//! reports fixed figures, since the agent tells no capacity.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use dpuio_shim::DataPlaneOptions;
use dpuio_shim::cli::ConnectArgs;
use dpuio_shim::posix::Mount;
use fuser::MountOption;

mod fs;

use fs::DpuioFs;

/// How long the kernel may keep entries and attributes without asking again.
const TTL: Duration = Duration::from_secs(1);
/// Largest read and write the kernel sends (its own ceiling is 256 pages, 1 MiB), and
/// the `st_blksize` files report, so `cp` and `cat` move data in pieces this large.
const IO_BYTES: u32 = 1 << 20;
/// Open files and directories of the mount at most (`EMFILE` past it).
const MAX_HANDLES: usize = 1 << 16;
/// How long to wait, after unmounting, for the request threads to finish.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// What a background mount prints on stdout once it serves (see [`start_in_background`]).
const READY_LINE: &str = "ready";

/// What `dpuio mount` takes.
#[derive(clap::Args)]
pub struct MountArgs {
    /// An existing directory to mount the container on (what it holds is hidden while
    /// mounted).
    mountpoint: PathBuf,
    /// Stay in the foreground and log to stderr until unmounted (by SIGTERM, SIGINT or
    /// `fusermount3 -u MOUNTPOINT`); without it, `dpuio mount` returns once the mount
    /// serves and a background process keeps serving it.
    #[arg(short, long)]
    foreground: bool,
    /// Threads serving the kernel's requests, each with a data-plane ring of its own.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    threads: u16,
    /// Set by a background mount on the process it starts: report readiness or the
    /// failure on stdout.
    #[arg(long, hide = true)]
    background_child: bool,
}

/// Run `dpuio mount`: in the foreground, or started in the background.
pub fn command(connect: &ConnectArgs, transport: &str, args: &MountArgs) -> ExitCode {
    if !args.foreground && !args.background_child {
        return start_in_background();
    }
    match serve(connect, transport, args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            if args.background_child {
                // To the starting process, which prints it; it may be gone (never panic).
                let _ = writeln!(std::io::stdout(), "error: {message}");
            }
            let _ = writeln!(std::io::stderr(), "dpuio mount: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Run this same command line again as a background process (its own process group,
/// so a terminal's Ctrl-C does not reach it), and return once it reports that it
/// serves, or with its failure.
fn start_in_background() -> ExitCode {
    let fail = |message: String| {
        let _ = writeln!(std::io::stderr(), "dpuio mount: {message}");
        ExitCode::FAILURE
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return fail(format!("cannot find the dpuio executable to start in the background: {e}")),
    };
    use std::os::unix::process::CommandExt;
    let child = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .arg("--background-child")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => return fail(format!("cannot start the background mount process: {e}")),
    };
    let Some(stdout) = child.stdout.take() else { return fail("no pipe from the background process".into()) };
    match BufReader::new(stdout).lines().next() {
        Some(Ok(line)) if line == READY_LINE => ExitCode::SUCCESS,
        // The child printed its own message to stderr too, but that is /dev/null here.
        Some(Ok(line)) => fail(line.strip_prefix("error: ").unwrap_or(&line).to_owned()),
        _ => {
            let status = child.wait().map_or_else(|e| e.to_string(), |s| s.to_string());
            fail(format!("the background mount process ended before it served ({status})"))
        }
    }
}

/// Mount, serve until unmounted, and end the session.
fn serve(connect: &ConnectArgs, transport: &str, args: &MountArgs) -> Result<(), String> {
    let mountpoint = check_mountpoint(&args.mountpoint)?;
    check_fuse_device()?;
    let threads = usize::from(args.threads);
    let mut options = connect.connect_options("dpuio mount");
    options.data_plane = Some(DataPlaneOptions {
        transports: transport.to_owned(),
        rings: threads,
        interface: connect.interface.clone(),
        ..Default::default()
    });
    let mount = Mount::attach(options).map_err(|e| format!("attach to the agent at {}: {e}", connect.agent))?;
    // The handlers come before the mount, so that no SIGTERM can end the process with
    // the file system mounted and nobody serving it; and after the transport opened,
    // since libfabric's shm provider installs handlers of its own that end in exit(1).
    fabric::restore_default_termination_signals();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("start the signal runtime: {e}"))?;
    let (mut term, mut int) = {
        use tokio::signal::unix::{SignalKind, signal};
        // Entered only to register: the blocking calls below must run outside it.
        let _entered = runtime.enter();
        match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => return Err(format!("install the SIGTERM/SIGINT handlers: {e}")),
        }
    };
    let fs = DpuioFs::new(mount);
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("dpuio:{}", connect.agent)),
        MountOption::Subtype("dpuio".into()),
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoAtime,
        MountOption::CUSTOM(format!("max_read={IO_BYTES}")),
    ];
    config.n_threads = Some(threads);
    config.clone_fd = true;
    let session = fuser::Session::new(fs, &mountpoint, &config).map_err(|e| mount_error(&mountpoint, &e))?;

    let (ended_tx, ended_rx) = tokio::sync::oneshot::channel();
    let server = std::thread::Builder::new()
        .name("dpuio-fuse".into())
        .spawn(move || {
            let _ = ended_tx.send(session.run());
        })
        .map_err(|e| format!("start the request threads: {e}"))?;
    if let Err(why) = raise_readahead(&mountpoint) {
        let _ = writeln!(std::io::stderr(), "dpuio mount: {why}");
    }
    if args.background_child {
        let mut stdout = std::io::stdout();
        let _ = writeln!(stdout, "{READY_LINE}").and_then(|()| stdout.flush());
    } else {
        let _ = writeln!(std::io::stderr(), "dpuio mount: serving {} at {}", connect.agent, mountpoint.display());
    }

    let ended = runtime.block_on(async {
        let mut ended_rx = ended_rx;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            ended = &mut ended_rx => return Ok::<_, String>(ended.ok()),
        }
        unmount(&mountpoint)?;
        Ok(tokio::time::timeout(STOP_TIMEOUT, ended_rx).await.ok().and_then(Result::ok))
    })?;
    match ended {
        // Unmounted (by fusermount3 -u, umount or the signal) and every thread done:
        // the file system, its handles and the session went with the session.
        Some(Ok(())) => {
            let _ = server.join();
            Ok(())
        }
        Some(Err(e)) => Err(format!("serving {}: {e}", mountpoint.display())),
        // Unmounted lazily with files still open: the process exit closes the rest.
        None => Ok(()),
    }
}

/// Let the kernel read ahead [`IO_BYTES`] at a time on the mount, not the 128 KiB every
/// new FUSE mount starts with (the kernel takes the smaller of the file system's
/// `max_readahead` and its default): with 128 KiB, a program reading a file in order gets
/// one request to the agent per 128 KiB, each waiting for storage (over DAOS, 1 MiB reads
/// one at a time ran at a tenth of dfuse's, whose direct I/O sends each read whole). The
/// setting is the mount's backing device's `read_ahead_kb` in sysfs, which only root may
/// write: for other users this says why it stays at 128 KiB.
///
/// The device number comes from `/proc/self/mountinfo`, not from a `stat` of the mount
/// point: a path walk into the new mount holds it while the request is served, and an
/// unmount right after the mount appeared (`fusermount3 -u` in a script) failed with
/// "Device or resource busy".
fn raise_readahead(mountpoint: &Path) -> Result<(), String> {
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("read /proc/self/mountinfo: {e}"))?;
    let device = mount_device(&mountinfo, mountpoint)
        .ok_or_else(|| format!("{} is not in /proc/self/mountinfo", mountpoint.display()))?;
    let knob = format!("/sys/class/bdi/{device}/read_ahead_kb");
    let kib = IO_BYTES / 1024;
    match std::fs::write(&knob, kib.to_string()) {
        Ok(()) => Ok(()),
        Err(e) => Err(format!(
            "the kernel's readahead stays at 128 KiB, so files read in order go to the agent in 128 KiB requests \
             ({knob}: {e}; root may set it to {kib})"
        )),
    }
}

/// The `major:minor` of the newest mount at `mountpoint` in a mountinfo text (fields: id,
/// parent, major:minor, root, mount point, ...; spaces and other bytes in the mount
/// point are written as octal escapes such as `\040`).
fn mount_device(mountinfo: &str, mountpoint: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let want = mountpoint.as_os_str().as_bytes();
    mountinfo
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let device = fields.nth(2)?;
            let point = fields.nth(1)?;
            (unescape_octal(point) == want).then(|| device.to_owned())
        })
        .next_back()
}

/// `\ooo` escapes (as the kernel writes them in mountinfo) to bytes.
fn unescape_octal(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped =
            bytes.get(i + 1..i + 4).filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match escaped {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// Unmount at `mountpoint`; lazily (`MNT_DETACH`) if it is busy, as `umount -l` does.
fn unmount(mountpoint: &Path) -> Result<(), String> {
    use rustix::mount::{UnmountFlags, unmount};
    match unmount(mountpoint, UnmountFlags::empty()) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::BUSY) => unmount(mountpoint, UnmountFlags::DETACH)
            .map_err(|e| format!("unmount {} (busy, then lazily): {e}", mountpoint.display())),
        // Not mounted any more: someone unmounted it while the signal arrived.
        Err(rustix::io::Errno::INVAL) => Ok(()),
        Err(e) if e == rustix::io::Errno::PERM || e == rustix::io::Errno::ACCESS => {
            // Not root: the set-uid helper may unmount what this user mounted.
            let status = std::process::Command::new("fusermount3")
                .arg("-u")
                .arg("-z")
                .arg(mountpoint)
                .status()
                .map_err(|e| format!("unmount {}: run fusermount3: {e}", mountpoint.display()))?;
            status.success().then_some(()).ok_or_else(|| format!("fusermount3 -u {}: {status}", mountpoint.display()))
        }
        Err(e) => Err(format!("unmount {}: {e}", mountpoint.display())),
    }
}

/// The mount point, absolute, if it is an existing directory.
fn check_mountpoint(path: &Path) -> Result<PathBuf, String> {
    let metadata = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("mount point {} does not exist (create it first)", path.display()),
        _ => format!("mount point {}: {e}", path.display()),
    })?;
    if !metadata.is_dir() {
        return Err(format!("mount point {} is not a directory", path.display()));
    }
    path.canonicalize().map_err(|e| format!("mount point {}: {e}", path.display()))
}

/// `/dev/fuse` must be there and open for this user: say so plainly before mounting.
fn check_fuse_device() -> Result<(), String> {
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err("/dev/fuse is missing: load the fuse module (modprobe fuse), or in a container pass the device \
             (--device /dev/fuse)"
                .into())
        }
        Err(e) => Err(format!("cannot open /dev/fuse: {e} (FUSE mounts need access to it: root, or the fuse group)")),
    }
}

fn mount_error(mountpoint: &Path, error: &std::io::Error) -> String {
    // fuser reports a failed fusermount3 as its stderr, of kind Other.
    let text = error.to_string();
    let e = text.trim(); // fusermount3's own line ends in a newline
    let refused = error.kind() == std::io::ErrorKind::PermissionDenied
        || e.contains("not permitted")
        || e.contains("Permission denied");
    if refused {
        format!(
            "mounting at {} is not permitted: {e} (as root this needs CAP_SYS_ADMIN; as another user, \
             fusermount3 from the fuse3 package)",
            mountpoint.display()
        )
    } else if error.kind() == std::io::ErrorKind::NotFound {
        format!(
            "mounting at {} directly is not permitted to this process, and fusermount3, the helper for that \
             case, was not found: {e} (install the fuse3 package)",
            mountpoint.display()
        )
    } else {
        format!("mount at {}: {e}", mountpoint.display())
    }
}

#[cfg(test)]
mod tests {
    use super::mount_device;
    use std::path::Path;

    #[test]
    fn the_newest_mount_at_a_point_names_its_device_and_escapes_are_undone() {
        let mountinfo = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
301 22 0:61 / /tmp/a\\040b rw,nosuid,nodev,noatime - fuse.dpuio dpuio:x rw,user_id=0
302 22 0:62 / /tmp/c rw - fuse.dpuio dpuio:x rw
303 301 0:63 / /tmp/a\\040b rw - fuse.dpuio dpuio:x rw
";
        assert_eq!(mount_device(mountinfo, Path::new("/tmp/a b")).as_deref(), Some("0:63"));
        assert_eq!(mount_device(mountinfo, Path::new("/tmp/c")).as_deref(), Some("0:62"));
        assert_eq!(mount_device(mountinfo, Path::new("/tmp/a\\040b")), None);
        assert_eq!(mount_device(mountinfo, Path::new("/tmp/d")), None);
    }
}
