//! Starting a worker process under a tenant's identity, and who that identity is.
//!
//! The worker is the agent's own executable (`dpu-agent tenant-worker`), started with:
//! the tenant's uid and gid and no supplementary groups (so no capabilities survive:
//! the kernel clears them when a root process takes a non-zero uid), a session of its
//! own (no terminal signals from the agent's), `PR_SET_PDEATHSIG` so it dies with the
//! agent, `PR_SET_NO_NEW_PRIVS`, `/` as its directory, and its end of the control
//! socket as fd 3.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The fd a worker finds its control socket on.
pub const CONTROL_FD: i32 = 3;

/// A tenant's DAOS identity: a user and group of this machine, which `daos_agent`
/// vouches for to the DAOS servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub group: String,
    pub uid: u32,
    pub gid: u32,
}

impl Identity {
    /// Look `user` up, and `group` (empty: the user's primary group). The error says
    /// what is missing and how to make it.
    pub fn resolve(user: &str, group: &str) -> Result<Identity, String> {
        let (uid, primary_gid) = lookup_user(user)?
            .ok_or_else(|| format!("no user {user:?} on this machine: create it (useradd --system {user})"))?;
        let (group, gid) = if group.is_empty() {
            let name = group_name(primary_gid)?.unwrap_or_else(|| primary_gid.to_string());
            (name, primary_gid)
        } else {
            let gid = lookup_group(group)?
                .ok_or_else(|| format!("no group {group:?} on this machine: create it (groupadd --system {group})"))?;
            (group.to_owned(), gid)
        };
        if uid == 0 || gid == 0 {
            return Err(format!(
                "user {user:?} / group {group:?} is root's: a tenant's DAOS identity must be an unprivileged user \
                 and group of its own"
            ));
        }
        Ok(Identity { user: user.to_owned(), group, uid, gid })
    }
}

fn lookup_user(name: &str) -> Result<Option<(u32, u32)>, String> {
    let c = CString::new(name).map_err(|_| format!("user name {name:?} holds a NUL byte"))?;
    let mut buf = vec![0u8; 16 << 10];
    // SAFETY: passwd is plain old data, filled by getpwnam_r.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; buf outlives it and is only read
    // through pw's fields, which we copy out before buf goes.
    let rc = unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
    if rc != 0 {
        return Err(format!("looking up user {name:?}: {}", io::Error::from_raw_os_error(rc)));
    }
    Ok((!out.is_null()).then_some((pw.pw_uid, pw.pw_gid)))
}

fn lookup_group(name: &str) -> Result<Option<u32>, String> {
    let c = CString::new(name).map_err(|_| format!("group name {name:?} holds a NUL byte"))?;
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: group is plain old data, filled by getgrnam_r.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: as in lookup_user.
    let rc = unsafe { libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
    if rc != 0 {
        return Err(format!("looking up group {name:?}: {}", io::Error::from_raw_os_error(rc)));
    }
    Ok((!out.is_null()).then_some(gr.gr_gid))
}

fn group_name(gid: u32) -> Result<Option<String>, String> {
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: as in lookup_group.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: as in lookup_user.
    let rc = unsafe { libc::getgrgid_r(gid, &mut gr, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
    if rc != 0 {
        return Err(format!("looking up group {gid}: {}", io::Error::from_raw_os_error(rc)));
    }
    // SAFETY: on success gr_name points into buf, NUL-terminated.
    Ok((!out.is_null()).then(|| unsafe { CStr::from_ptr(gr.gr_name) }.to_string_lossy().into_owned()))
}

/// Start `exe tenant-worker --tenant TENANT` as `identity`, with `control` as its fd 3.
pub fn start(exe: &Path, tenant: &str, identity: &Identity, control: OwnedFd) -> io::Result<Child> {
    let parent = std::process::id() as i32;
    let fd = control.as_raw_fd();
    let mut command = Command::new(exe);
    command
        .arg("tenant-worker")
        .arg("--tenant")
        .arg(tenant)
        .stdin(Stdio::null())
        // libgurt opens D_LOG_FILE by name, and the agent's stderr (/dev/stderr: a file
        // or pipe of root's) is not the tenant's to open. An empty D_LOG_FILE makes it log
        // to stdout, which is the agent's stderr, inherited: open already.
        .stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?))
        .env("D_LOG_FILE", "")
        .current_dir("/")
        // std drops the supplementary groups (setgroups(0)) before setgid/setuid when
        // it runs as root and is given a uid.
        .gid(identity.gid)
        .uid(identity.uid);
    // SAFETY: the closure runs in the forked child before exec and calls only
    // async-signal-safe functions (dup2, setsid, prctl, getppid, _exit); it runs after
    // std's setuid, which is what keeps the parent-death signal (a credential change
    // clears it).
    unsafe {
        command.pre_exec(move || {
            // dup2 onto itself would keep close-on-exec; clear it then.
            let moved = if fd == CONTROL_FD { libc::fcntl(fd, libc::F_SETFD, 0) } else { libc::dup2(fd, CONTROL_FD) };
            if moved < 0 || libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0
                || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) != 0
            {
                return Err(io::Error::last_os_error());
            }
            // The agent died between fork and prctl: nobody would kill us.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let child = spawn_from_a_lasting_thread(command);
    drop(control);
    child
}

/// A process-lifetime thread that forks every worker. The parent-death signal fires
/// when the *thread* that forked the child exits, not the process: a worker forked from
/// a thread of a pool (tokio's blocking threads leave after ten idle seconds) would be
/// killed with it.
fn spawn_from_a_lasting_thread(command: Command) -> io::Result<Child> {
    type Job = (Command, std::sync::mpsc::Sender<io::Result<Child>>);
    static SPAWNER: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<Job>>> = std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let started = std::thread::Builder::new().name("dpuio-worker-spawner".into()).spawn(move || {
            for (mut command, reply) in queue {
                let _ = reply.send(command.spawn());
            }
        });
        if let Err(e) = started {
            tracing::error!(error = %e, "cannot start the thread that starts tenant workers");
        }
        std::sync::Mutex::new(jobs)
    });
    let (reply, answer) = std::sync::mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((command, reply))
        .map_err(|_| io::Error::other("the thread that starts tenant workers is gone"))?;
    answer.recv().map_err(|_| io::Error::other("the thread that starts tenant workers is gone"))?
}

/// The control socket a worker was started with (fd 3), taken once.
pub fn inherited_control() -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // fcntl(F_GETFD) says whether fd 3 is open at all (a worker started by hand).
    // SAFETY: F_GETFD reads flags only.
    if unsafe { libc::fcntl(CONTROL_FD, libc::F_GETFD) } < 0 {
        return Err(io::Error::other(
            "no control socket on fd 3: `dpu-agent tenant-worker` is started by the agent, not by hand",
        ));
    }
    // SAFETY: fd 3 is open (checked) and nothing else in this process owns it: the
    // agent dup2'd it there for us, and this is called once, at start.
    let fd = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    // Not inherited by anything this worker might start.
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_outlives_the_thread_that_asked_for_it() {
        // The parent-death signal follows the forking thread: a child forked by a thread
        // that then ends must not get it.
        let asked = std::thread::spawn(|| {
            let mut command = Command::new("sleep");
            command.arg("30");
            // SAFETY: prctl is async-signal-safe; the closure runs in the forked child.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            spawn_from_a_lasting_thread(command)
        });
        let mut child = asked.join().unwrap().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let status = child.try_wait().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(status.is_none(), "the child died with the thread that asked for it: {status:?}");
    }

    #[test]
    fn root_and_unknown_names_are_refused_with_what_to_do() {
        let err = Identity::resolve("root", "").unwrap_err();
        assert!(err.contains("unprivileged"), "{err}");
        let err = Identity::resolve("dpuio-no-such-user-xyz", "").unwrap_err();
        assert!(err.contains("useradd --system dpuio-no-such-user-xyz"), "{err}");
        let err = Identity::resolve("nobody", "dpuio-no-such-group-xyz").unwrap_err();
        assert!(err.contains("groupadd --system"), "{err}");
        let nobody = Identity::resolve("nobody", "").unwrap();
        assert_ne!(nobody.uid, 0);
    }
}
