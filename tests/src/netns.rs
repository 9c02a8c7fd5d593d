//! Several machines on one: network namespaces "host" and "dpu" joined by a veth pair
//! ([`TwoHosts`], `tests/two_hosts.rs`), or "storage", "dpu" and "host" with the DPU
//! between the two others ([`ThreeMachines`], `tests/three_machines.rs`), so an
//! end-to-end test can put the agent, its client and DAOS on either side of a real
//! network path, with nothing but that path between them.
//!
//! Made with iproute2 (`ip netns`, `ip link`), which needs root. [`TwoHosts::create`]
//! says why it cannot (not root, no `ip`, namespaces refused) so that the caller can
//! report the test skipped. Everything made is removed when the value is dropped, also
//! on a panic. The veth pair is created inside the two namespaces and never enters the
//! machine's own, so its names cannot clash with anything there, and deleting the
//! namespaces deletes it. The namespace names carry the test process's pid and a
//! counter, so parallel tests and runs do not clash and a leftover of a killed run
//! says which process made it.
//!
//! Drop every process started in a namespace before the [`TwoHosts`] (declare the
//! `TwoHosts` first): a namespace with a process in it outlives `ip netns del`, so
//! the drop kills (and names) any it still finds there.

use std::ffi::OsStr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// One side: its namespace, its end of the veth pair and that end's address.
#[derive(Debug, Clone)]
pub struct Side {
    /// The namespace, as `ip netns list` shows it.
    pub netns: String,
    /// The veth end in it, as `ip link` shows it there.
    pub interface: String,
    /// Its IPv4 address (in a /24 shared with the other side).
    pub ip: String,
}

impl Side {
    /// `program` run in this side's network namespace (`ip netns exec`, which execs
    /// it: the child's pid is the program's, so signals reach it). The environment is
    /// passed on; the file system is the test's.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns]).arg(program);
        c
    }

    /// `program` run on this side as a client of `agent`: the agent's address and
    /// client bundle, this side's interface for the data plane (`DPUIO_INTERFACE`), a
    /// scratch `HOME` of its own, warnings only in the log.
    pub fn client(&self, agent: &crate::AgentProcess, program: impl AsRef<OsStr>) -> Command {
        let mut c = self.command(program);
        crate::hermetic(&mut c, &agent.data_dir.join(format!(".home-{}", self.interface)));
        c.env("DPUIO_AGENT", agent.url())
            .env("DPUIO_CONFIG_DIR", agent.client_dir())
            .env("DPUIO_INTERFACE", &self.interface)
            .env("RUST_LOG", "warn");
        c
    }

    /// Wait until the veth end's operational state is UP, at most `timeout`.
    fn wait_until_operational(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let out = Command::new("ip")
                .args(["-n", &self.netns, "-o", "link", "show", "dev", &self.interface])
                .output()
                .expect("run ip link show");
            let line = String::from_utf8_lossy(&out.stdout);
            if line.contains(" state UP ") {
                return;
            }
            assert!(Instant::now() < deadline, "{} in {} not up after {timeout:?}: {line}", self.interface, self.netns);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Bytes received and sent on this side's veth end so far (from the namespace's
    /// `/proc/net/dev`).
    pub fn interface_bytes(&self) -> u64 {
        let out = self.command("cat").arg("/proc/net/dev").output().expect("run ip netns exec cat");
        assert!(out.status.success(), "read /proc/net/dev in {}: {}", self.netns, String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        let counters: Vec<u64> = text
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(name, _)| name.trim() == self.interface)
            .unwrap_or_else(|| panic!("{} is not in /proc/net/dev of {}: {text}", self.interface, self.netns))
            .1
            .split_whitespace()
            .map(|n| n.parse().expect("a counter"))
            .collect();
        // Eight receive counters (bytes first), then the transmit ones (bytes first).
        counters[0] + counters[8]
    }
}

/// The two namespaces and the veth pair between them; removed on drop.
pub struct TwoHosts {
    pub host: Side,
    pub dpu: Side,
    _made: Namespaces,
}

/// Three machines as a BlueField deployment has them: "storage" (the DAOS servers),
/// "dpu" (the agent and its daos_agent) and "host" (the job), with a veth pair between
/// storage and dpu (`10.78.N.0/24`) and one between dpu and host (`10.79.N.0/24`). There
/// is no route between host and storage: the host reaches storage only through the agent.
pub struct ThreeMachines {
    /// The storage machine's end of the storage link.
    pub storage: Side,
    /// The DPU's end of the storage link.
    pub dpu_storage: Side,
    /// The DPU's end of the host link.
    pub dpu_host: Side,
    /// The host's end of the host link.
    pub host: Side,
    _made: Namespaces,
}

/// Tells apart the topologies one test process makes.
static PAIRS: AtomicU32 = AtomicU32::new(0);

/// Namespaces made so far: deleted on drop (with any process left in them).
struct Namespaces(Vec<String>);

impl Namespaces {
    /// Check that this process may make namespaces; the reason if not.
    fn permitted() -> Result<(), String> {
        match effective_uid() {
            Some(0) => Ok(()),
            Some(uid) => Err(format!("network namespaces need root (`ip netns add`); running as uid {uid}")),
            None => Err("cannot tell this process's user id from /proc/self/status".into()),
        }
    }

    /// `ip netns add NAME` with its loopback up.
    fn add(&mut self, netns: &str) -> Result<(), String> {
        ip(&["netns", "add", netns])?;
        self.0.push(netns.to_owned());
        ip(&["-n", netns, "link", "set", "lo", "up"])
    }
}

/// A veth pair between `a` and `b` (each made in its own namespace), addressed in a /24,
/// up and operational. Panics: it runs once the namespaces exist (the machine can).
fn link(a: &Side, b: &Side) {
    let steps: [&[&str]; 5] = [
        &["-n", &a.netns, "link", "add", &a.interface, "type", "veth", "peer", "name", &b.interface, "netns", &b.netns],
        &["-n", &a.netns, "addr", "add", &format!("{}/24", a.ip), "dev", &a.interface],
        &["-n", &b.netns, "addr", "add", &format!("{}/24", b.ip), "dev", &b.interface],
        &["-n", &a.netns, "link", "set", &a.interface, "up"],
        &["-n", &b.netns, "link", "set", &b.interface, "up"],
    ];
    for step in steps {
        ip(step).unwrap_or_else(|e| panic!("setting up the namespaces: {e}"));
    }
    // The kernel makes a veth end operational (IFF_RUNNING) a moment after both ends
    // are up, and until then UCX and libfabric tcp leave the interface out: a process
    // started at once would find no way to the other side.
    for side in [a, b] {
        side.wait_until_operational(Duration::from_secs(10));
    }
}

/// Run `ip ARGS`; the reason when it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => "`ip` (iproute2) is not installed".to_owned(),
        _ => format!("cannot run ip: {e}"),
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("`ip {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// The effective user id of this process (from `/proc/self/status`).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

impl TwoHosts {
    /// Make the namespaces `dpuio-PID-N-host` and `dpuio-PID-N-dpu` with a veth pair
    /// `veth-host` (10.77.N.1/24) and `veth-dpu` (10.77.N.2/24) between them, both up
    /// with their loopback. `Err` says why this machine cannot (the caller skips); a
    /// failure after the namespaces exist is a panic (the machine can, and did not).
    pub fn create() -> Result<TwoHosts, String> {
        Namespaces::permitted()?;
        let n = PAIRS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("dpuio-{}-{n}", std::process::id());
        let side = |role: &str, interface: &str, host: u8| Side {
            netns: format!("{prefix}-{role}"),
            interface: interface.to_owned(),
            ip: format!("10.77.{}.{host}", n % 256),
        };
        let (host, dpu) = (side("host", "veth-host", 1), side("dpu", "veth-dpu", 2));
        let mut made = Namespaces(Vec::new());
        made.add(&host.netns)?;
        made.add(&dpu.netns)?;
        link(&host, &dpu);
        Ok(TwoHosts { host, dpu, _made: made })
    }
}

impl ThreeMachines {
    /// Make `dpuio-PID-N-{storage,dpu,host}` with `veth-storage` (10.78.N.1) to
    /// `veth-dpu-s` (10.78.N.2) and `veth-dpu-h` (10.79.N.1) to `veth-host` (10.79.N.2).
    /// `Err` says why this machine cannot (the caller skips).
    pub fn create() -> Result<ThreeMachines, String> {
        Namespaces::permitted()?;
        let n = PAIRS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("dpuio-{}-{n}", std::process::id());
        let side = |role: &str, interface: &str, net: u8, host: u8| Side {
            netns: format!("{prefix}-{role}"),
            interface: interface.to_owned(),
            ip: format!("10.{net}.{}.{host}", n % 256),
        };
        let storage = side("storage", "veth-storage", 78, 1);
        let dpu_storage = side("dpu", "veth-dpu-s", 78, 2);
        let dpu_host = side("dpu", "veth-dpu-h", 79, 1);
        let host = side("host", "veth-host", 79, 2);
        let mut made = Namespaces(Vec::new());
        for netns in [&storage.netns, &dpu_storage.netns, &host.netns] {
            made.add(netns)?;
        }
        link(&storage, &dpu_storage);
        link(&dpu_host, &host);
        Ok(ThreeMachines { storage, dpu_storage, dpu_host, host, _made: made })
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for netns in self.0.iter().rev() {
            // A process left in a namespace would keep it, and the veth, alive after
            // `ip netns del`: only this test's processes can be in these namespaces.
            if let Ok(out) = Command::new("ip").args(["netns", "pids", netns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    eprintln!("netns: process {pid} was left in {netns}: killing it");
                    let _ = Command::new("kill").args(["-KILL", pid]).status();
                }
            }
            if let Err(e) = ip(&["netns", "del", netns]) {
                eprintln!("netns: {e} (remove it by hand: ip netns del {netns})");
            }
        }
    }
}
