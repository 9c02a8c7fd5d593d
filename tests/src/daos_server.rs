//! A DAOS system of the test's own: `daos_server` with RAM-backed engines (tmpfs SCM, no
//! NVMe, no hugepages) over `ofi+tcp`, started in namespaces of its own so that it
//! neither sees nor disturbs another system on the machine: a network namespace (a
//! "storage" machine of [`crate::netns`]) or the machine's, and always its own PID,
//! mount and IPC namespaces (`unshare`). `daos_server` refuses to start when another
//! process of its name is in `/proc`, and engines of two systems would share SysV
//! shared memory; in a PID and IPC namespace of its own neither happens, and when the
//! test ends the kernel takes every process of the system down with the namespace's
//! first process, and its tmpfs with the mount namespace.
//!
//! What it does, in order: write `daos_server.yml` (one engine per
//! [`Engine`]), start the server, `dmg storage format`, wait for every rank to join,
//! create a pool over all engines. The binaries are DAOS's x86-64 build
//! (`$DAOS_PREFIX`, which `daos-up.sh`'s env file sets, else `/opt/daos`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::netns::Side;

/// One engine: the interface and port its fabric endpoint uses.
#[derive(Debug, Clone)]
pub struct Engine {
    /// `fabric_iface` (e.g. `lo`, or a veth).
    pub interface: String,
    /// `fabric_iface_port`.
    pub port: u16,
    /// SCM (tmpfs) size in GiB: at least 4 (DAOS refuses less); only what is written
    /// takes memory.
    pub scm_gib: u32,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the system keeps its configs, sockets, logs and SCM mount points.
    pub rundir: PathBuf,
    /// The network namespace to run in (`None`: the machine's).
    pub netns: Option<Side>,
    /// The address the control plane (and the management service) listens on, as
    /// clients name it in `access_points`.
    pub address: String,
    /// The control-plane port.
    pub port: u16,
    /// The engines (at least one).
    pub engines: Vec<Engine>,
    /// The pool created over every engine, and its size (e.g. `"1GB"`).
    pub pool: String,
    pub pool_size: String,
}

/// A running system; stopped (every process killed, its tmpfs gone) when dropped.
pub struct DaosSystem {
    options: Options,
    prefix: PathBuf,
    server: Child,
}

/// Where DAOS's x86-64 build is: `$DAOS_PREFIX`, else `/opt/daos`, or why it is not
/// there.
pub fn server_prefix() -> Result<PathBuf, String> {
    let prefix = std::env::var_os("DAOS_PREFIX").map_or_else(|| PathBuf::from("/opt/daos"), PathBuf::from);
    for f in ["bin/daos_server", "bin/daos_engine", "bin/dmg"] {
        if !prefix.join(f).exists() {
            return Err(format!(
                "{} is missing: unpack DAOS's build there (../shared/daos/daos-up.sh does) or set DAOS_PREFIX",
                prefix.join(f).display()
            ));
        }
    }
    Ok(prefix)
}

impl DaosSystem {
    /// Start the system and create its pool; panics with the server's log on failure.
    pub fn start(options: Options) -> DaosSystem {
        let prefix = server_prefix().unwrap_or_else(|e| panic!("{e}"));
        let r = &options.rundir;
        for d in ["log", "sock", "mnt"] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        std::fs::write(r.join("daos_server.yml"), server_config(&options)).unwrap();
        std::fs::write(r.join("daos_control.yml"), control_config(&options)).unwrap();
        // Its own PID, mount and IPC namespaces; --kill-child takes the server (and with
        // it, as the namespace's first process, every engine) down with `unshare`.
        let mut command = in_netns(&options.netns, "unshare");
        command
            .args(["--pid", "--fork", "--mount-proc", "--ipc", "--kill-child"])
            .arg(prefix.join("bin/daos_server"))
            .arg("start")
            .arg("-o")
            .arg(r.join("daos_server.yml"))
            .stdout(std::fs::File::create(r.join("log/server.stdout")).unwrap())
            .stderr(std::fs::File::create(r.join("log/server.stderr")).unwrap());
        let server = command.spawn().expect("start daos_server under unshare");
        let mut system = DaosSystem { options, prefix, server };
        // Before the format the system answers no query ("system is uninitialized"):
        // the format itself is what succeeds once the control plane listens.
        system.wait("dmg storage format succeeds", Duration::from_secs(90), |s| {
            s.dmg(&["storage", "format"]).status.success()
        });
        let ranks = system.options.engines.len();
        system.wait("every rank joins", Duration::from_secs(180), |s| {
            let out = s.dmg(&["system", "query", "--verbose"]);
            String::from_utf8_lossy(&out.stdout).matches("Joined").count() >= ranks
        });
        let pool = system.dmg(&["pool", "create", "--size", &system.options.pool_size, &system.options.pool]);
        assert!(pool.status.success(), "dmg pool create: {}", system.describe_failure(&pool));
        system
    }

    /// `address:port`, as a client's `access_points` names it.
    pub fn access_point(&self) -> String {
        format!("{}:{}", self.options.address, self.options.port)
    }

    /// The pool's label.
    pub fn pool(&self) -> &str {
        &self.options.pool
    }

    /// `dmg ARGS` against this system, run where the server runs.
    pub fn dmg(&self, args: &[&str]) -> Output {
        in_netns(&self.options.netns, self.prefix.join("bin/dmg"))
            .arg("-o")
            .arg(self.options.rundir.join("daos_control.yml"))
            .args(args)
            .output()
            .expect("run dmg")
    }

    /// A `daos_agent.yml` for a client machine of this system: its access point, the
    /// agent's `runtime_dir` and `log_file`, and the client's fabric interface (the one
    /// facing this system).
    pub fn agent_config(&self, runtime_dir: &Path, log_file: &Path, interface: Option<&str>) -> String {
        let mut yml = format!(
            "name: daos_server\naccess_points: ['{}']\nport: {}\ntransport_config:\n  allow_insecure: true\n\
             runtime_dir: {}\nlog_file: {}\n",
            self.access_point(),
            self.options.port,
            runtime_dir.display(),
            log_file.display()
        );
        if let Some(interface) = interface {
            yml.push_str(&format!(
                "fabric_ifaces:\n- numa_node: 0\n  devices:\n  - iface: {interface}\n    domain: {interface}\n"
            ));
        }
        yml
    }

    fn wait(&mut self, what: &str, timeout: Duration, mut done: impl FnMut(&DaosSystem) -> bool) {
        let started = Instant::now();
        loop {
            if done(self) {
                return;
            }
            if let Ok(Some(status)) = self.server.try_wait() {
                panic!("daos_server exited ({status}) before {what}: {}", self.logs());
            }
            assert!(started.elapsed() < timeout, "DAOS: not done within {timeout:?}: {what}: {}", self.logs());
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn describe_failure(&self, out: &Output) -> String {
        format!("{}{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr), self.logs())
    }

    /// The tails of the server's and engines' logs.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        let mut files =
            vec![self.options.rundir.join("log/server.stdout"), self.options.rundir.join("log/daos_server.log")];
        files.extend(
            (0..self.options.engines.len()).map(|i| self.options.rundir.join(format!("log/daos_engine.{i}.log"))),
        );
        for f in files {
            let body = std::fs::read_to_string(&f).unwrap_or_default();
            let tail: Vec<&str> = body.lines().rev().take(15).collect();
            text.push_str(&format!("\n--- {} ---\n", f.display()));
            for l in tail.iter().rev() {
                text.push_str(l);
                text.push('\n');
            }
        }
        text
    }
}

impl Drop for DaosSystem {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

fn in_netns(netns: &Option<Side>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    match netns {
        Some(side) => side.command(program),
        None => Command::new(program),
    }
}

fn server_config(o: &Options) -> String {
    let r = &o.rundir;
    let mut yml = format!(
        "name: daos_server\nmgmt_svc_replicas: ['{}']\nport: {}\nprovider: ofi+tcp\nsocket_dir: {}\n\
         control_log_file: {}\ncontrol_log_mask: INFO\nhelper_log_file: {}\ntransport_config:\n  allow_insecure: true\n\
         disable_hugepages: true\nnr_hugepages: 0\nsystem_ram_reserved: 1\nengines:\n",
        o.address,
        o.port,
        r.join("sock").display(),
        r.join("log/daos_server.log").display(),
        r.join("log/daos_server_helper.log").display(),
    );
    for (i, e) in o.engines.iter().enumerate() {
        yml.push_str(&format!(
            "  -\n    targets: 1\n    nr_xs_helpers: 0\n    fabric_iface: {}\n    fabric_iface_port: {}\n    \
             log_file: {}\n    log_mask: ERR\n    env_vars:\n      - FI_SOCKETS_MAX_CONN_RETRY=1\n      \
             - FI_SOCKETS_CONN_TIMEOUT=2000\n      - DAOS_TARGET_OVERSUBSCRIBE=1\n    storage:\n      -\n        \
             class: ram\n        scm_size: {}\n        scm_mount: {}\n",
            e.interface,
            e.port,
            r.join(format!("log/daos_engine.{i}.log")).display(),
            e.scm_gib,
            r.join(format!("mnt/daos{i}")).display(),
        ));
    }
    yml
}

fn control_config(o: &Options) -> String {
    format!(
        "name: daos_server\nport: {}\nhostlist: ['{}:{}']\ntransport_config:\n  allow_insecure: true\n",
        o.port, o.address, o.port
    )
}

/// DAOS's x86-64 `daos_agent`, on the machine of a [`DaosSystem`] (its netns), for
/// DAOS's own tools there; killed when dropped.
pub struct ClientAgent {
    child: Child,
    socket_dir: PathBuf,
    netns: Option<Side>,
    prefix: PathBuf,
}

impl ClientAgent {
    /// Start it with `config` (from [`DaosSystem::agent_config`], whose `runtime_dir` is
    /// `socket_dir`) in `dir`, and wait for its socket.
    pub fn start(system: &DaosSystem, dir: &Path, config: &str, socket_dir: &Path) -> ClientAgent {
        std::fs::create_dir_all(socket_dir).unwrap();
        let path = dir.join("daos_agent.yml");
        std::fs::write(&path, config).unwrap();
        let child = in_netns(&system.options.netns, system.prefix.join("bin/daos_agent"))
            .arg("-o")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("daos_agent.stderr")).unwrap())
            .spawn()
            .expect("start daos_agent");
        let agent = ClientAgent {
            child,
            socket_dir: socket_dir.to_owned(),
            netns: system.options.netns.clone(),
            prefix: system.prefix.clone(),
        };
        crate::daos::wait_for_socket(socket_dir, &dir.join("daos_agent.stderr"));
        agent
    }

    /// DAOS's `daos` tool through this agent.
    pub fn daos(&self) -> Command {
        let mut c = in_netns(&self.netns, self.prefix.join("bin/daos"));
        c.env("DAOS_AGENT_DRPC_DIR", &self.socket_dir).env_remove("LD_LIBRARY_PATH");
        c
    }
}

impl Drop for ClientAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
