//! The running DAOS system of the tests that need one (`./x test`'s DAOS tier starts it
//! with `../shared/daos/daos-up.sh RUNDIR` and exports what `RUNDIR/env` says): where it
//! is, container labels that clean up after their test, DAOS's own view of a file.
//!
//! Without a system each test prints that it is skipped and why, unless
//! `DPUIO_REQUIRE_DAOS=1` (the DAOS tier), which makes a skip a failure.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The DAOS system under test.
pub struct Daos {
    /// `DAOS_POOL`.
    pub pool: String,
    /// The directory of the `daos_agent` socket (`DAOS_AGENT_DRPC_DIR`).
    pub socket_dir: PathBuf,
}

/// The system, or `None` after printing why `test` is skipped (a failure under
/// `DPUIO_REQUIRE_DAOS=1`).
pub fn system(test: &str) -> Option<Daos> {
    let pool = std::env::var("DAOS_POOL").ok().filter(|p| !p.is_empty());
    let socket_dir =
        std::env::var_os("DAOS_AGENT_DRPC_DIR").map_or_else(|| "/var/run/daos_agent".into(), PathBuf::from);
    let daos_tool = Command::new("daos").arg("version").output().is_ok_and(|o| o.status.success());
    let why = match (&pool, socket_dir.join("daos_agent.sock").exists(), daos_tool) {
        (None, _, _) => {
            "DAOS_POOL is not set (start DAOS with ../shared/daos/daos-up.sh RUNDIR, then source RUNDIR/env)".to_owned()
        }
        (_, false, _) => format!("no daos_agent socket in {}", socket_dir.display()),
        (_, _, false) => "the daos tool is not on PATH".to_owned(),
        (Some(pool), true, true) => return Some(Daos { pool: pool.clone(), socket_dir }),
    };
    skip(test, &why);
    None
}

/// Print that `test` is skipped and why; panic instead under `DPUIO_REQUIRE_DAOS=1`.
pub fn skip(test: &str, why: &str) {
    assert!(std::env::var("DPUIO_REQUIRE_DAOS").as_deref() != Ok("1"), "{test}: DPUIO_REQUIRE_DAOS=1 but: {why}");
    eprintln!("{test}: skipped: {why}");
}

/// A container label no other test or run uses; the container is destroyed when the
/// test's thread ends, so the shared pool gets its space back.
pub fn label(test: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let label = format!("e2e-{test}-{}-{}", std::process::id(), nanos % 1_000_000_000);
    CREATED.with(|c| c.0.borrow_mut().push(label.clone()));
    label
}

thread_local! {
    static CREATED: Cleanup = const { Cleanup(RefCell::new(Vec::new())) };
}

struct Cleanup(RefCell<Vec<String>>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Ok(pool) = std::env::var("DAOS_POOL") else { return };
        for container in self.0.borrow().iter() {
            let _ = Command::new("daos").args(["container", "destroy", "--force", &pool, container]).output();
        }
    }
}

/// `daos filesystem copy` of one file out of a container: DAOS's own view of it.
pub fn copy_out(d: &Daos, container: &str, path: &str, dst: &Path) {
    let out = Command::new("daos")
        .args(["filesystem", "copy", "--src", &format!("daos://{}/{container}{path}", d.pool), "--dst"])
        .arg(dst)
        .output()
        .expect("run daos");
    assert!(out.status.success(), "daos filesystem copy failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// A `daos_agent.yml` for another `daos_agent` of the running system: the access
/// points, port and transport of the tier's own agent config (`$DAOS_RUNDIR/daos_agent.yml`,
/// which daos-up.sh writes), with `runtime_dir` and `log_file` of the caller's.
pub fn agent_config(runtime_dir: &Path, log_file: &Path) -> Result<String, String> {
    let rundir = std::env::var_os("DAOS_RUNDIR").ok_or("DAOS_RUNDIR is not set (source the env file of daos-up.sh)")?;
    let path = Path::new(&rundir).join("daos_agent.yml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let mut out: String = text
        .lines()
        .filter(|l| !l.starts_with("runtime_dir:") && !l.starts_with("log_file:"))
        .map(|l| format!("{l}\n"))
        .collect();
    out.push_str(&format!("runtime_dir: {}\nlog_file: {}\n", runtime_dir.display(), log_file.display()));
    Ok(out)
}

/// Wait (at most a minute) for a `daos_agent`'s socket in `socket_dir`; its `stderr`
/// file in the panic otherwise.
pub fn wait_for_socket(socket_dir: &Path, stderr: &Path) {
    let started = std::time::Instant::now();
    while !socket_dir.join("daos_agent.sock").exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the daos_agent made no socket in {} within 60 s: {}",
            socket_dir.display(),
            std::fs::read_to_string(stderr).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Why libfabric shm cannot join a test's host and an agent on the DAOS backend, if it
/// cannot: the agent's libfabric is the DAOS client's (1.22, which mercury needs), this
/// process's Debian's (1.17), and shm's protocol is private to a release, so the agent
/// refuses the pair (`tests/daos.rs` checks that refusal). `None` when the agents of
/// this run are not on DAOS or both sides run one version.
pub fn ofi_shm_refused() -> Option<String> {
    crate::daos_pool_under_test()?;
    let prefix = std::env::var_os("DAOS_PREFIX").map_or_else(|| PathBuf::from("/opt/daos"), PathBuf::from);
    let pc = prefix.join("prereq/release/ofi/lib64/pkgconfig/libfabric.pc");
    let text = std::fs::read_to_string(&pc).ok()?;
    let daos: Vec<u32> = text
        .lines()
        .find_map(|l| l.strip_prefix("Version:"))?
        .trim()
        .split('.')
        .filter_map(|n| n.parse().ok())
        .collect();
    let (major, minor) = libfabric_sys::api().ok()?.version();
    (daos.get(..2) != Some(&[major, minor][..])).then(|| {
        format!(
            "the agent runs the DAOS client's libfabric {}.{} and this host libfabric {major}.{minor}: libfabric shm needs \
             one version on both sides, and the agent refuses the pair (checked in tests/daos.rs)",
            daos[0], daos.get(1).copied().unwrap_or(0)
        )
    })
}

/// A DAOS identity for tenant `name` of the tests: the system user `dpuio-t-NAME` (made
/// with `useradd --system` if missing: the tests run as root) with read-write access to
/// the pool (`dmg pool update-acl`, through `$DAOS_RUNDIR/daos_control.yml`). Returns
/// the user's name, or why it cannot be made.
pub fn tenant_identity(d: &Daos, name: &str) -> Result<String, String> {
    let user = format!("dpuio-t-{name}");
    let exists = Command::new("id").arg(&user).output().is_ok_and(|o| o.status.success());
    if !exists {
        let out = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", &user])
            .output()
            .map_err(|e| format!("run useradd: {e}"))?;
        // Another test of this run may have made it meanwhile (exit 9: already exists).
        if !out.status.success() && out.status.code() != Some(9) {
            return Err(format!("useradd {user}: {}", String::from_utf8_lossy(&out.stderr)));
        }
    }
    let rundir = std::env::var_os("DAOS_RUNDIR").ok_or("DAOS_RUNDIR is not set (source the env file of daos-up.sh)")?;
    // Tests running side by side update the pool's ACL at once, and DAOS refuses a pool
    // operation while another holds the pool ("pool ... is locked", "retry the pool
    // operation"): retry that, a few seconds at most.
    for attempt in 0.. {
        let out = Command::new("dmg")
            .arg("-o")
            .arg(Path::new(&rundir).join("daos_control.yml"))
            .args(["pool", "update-acl", &d.pool, "--entry", &format!("A::{user}@:rw")])
            .output()
            .map_err(|e| format!("run dmg: {e}"))?;
        let said = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            break;
        }
        if !said.contains("is locked") || attempt == 40 {
            return Err(format!("dmg pool update-acl for {user}: {said}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    Ok(user)
}

/// The `daos` tool run as `user` (runuser), to see DAOS as a tenant's identity sees it.
pub fn daos_as(user: &str) -> Command {
    let mut c = Command::new("runuser");
    c.args(["-u", user, "--", "daos"]);
    c
}

/// The multi-engine system of `tests/daos-engines.sh` (`RUNDIR/env` in the environment).
pub struct Engines {
    pub rundir: PathBuf,
    pub pool: String,
    pub socket_dir: PathBuf,
    pub engines: u32,
    /// The rank of the pool service's leader.
    pub leader: u32,
}

/// The system of `tests/daos-engines.sh` if it has at least `min_engines` engines, or
/// `None` after printing why `test` is skipped (a failure under `DPUIO_REQUIRE_DAOS=1`).
pub fn engines(test: &str, min_engines: u32) -> Option<Engines> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let (Some(rundir), Some(pool), Some(socket_dir)) =
        (var("DAOS_RUNDIR"), var("DAOS_POOL"), var("DAOS_AGENT_DRPC_DIR"))
    else {
        skip(test, "no DAOS system (start one with tests/daos-engines.sh up RUNDIR 3, then source RUNDIR/env)");
        return None;
    };
    let engines = var("DAOS_ENGINES").and_then(|n| n.parse().ok()).unwrap_or(1);
    let leader = var("DAOS_POOL_LEADER").and_then(|n| n.parse().ok());
    match leader {
        Some(leader) if engines >= min_engines => {
            Some(Engines { rundir: rundir.into(), pool, socket_dir: socket_dir.into(), engines, leader })
        }
        _ => {
            skip(
                test,
                &format!(
                    "the DAOS system of {rundir} has {engines} engine(s) and no DAOS_POOL_LEADER: this test needs a \
                     system of tests/daos-engines.sh with at least {min_engines} (tests/daos-engines.sh up RUNDIR 3)"
                ),
            );
            None
        }
    }
}

/// Run `tests/daos-engines.sh ARGS`; panics with its output if it fails.
pub fn script(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("daos-engines.sh");
    let out = Command::new(&script).args(args).output().expect("run tests/daos-engines.sh");
    assert!(
        out.status.success(),
        "daos-engines.sh {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
