//! Two machines on one: network namespaces "host" and "dpu" joined by a veth pair, so
//! an end-to-end test can put the agent and its client on either side of a real
//! network path, with nothing but that path between them (`tests/two_hosts.rs`).
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
    /// The namespaces made so far, deleted on drop.
    made: Vec<String>,
}

/// Tells apart the pairs one test process makes.
static PAIRS: AtomicU32 = AtomicU32::new(0);

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
        match effective_uid() {
            Some(0) => {}
            Some(uid) => return Err(format!("network namespaces need root (`ip netns add`); running as uid {uid}")),
            None => return Err("cannot tell this process's user id from /proc/self/status".into()),
        }
        let n = PAIRS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("dpuio-{}-{n}", std::process::id());
        let side = |role: &str, interface: &str, host: u8| Side {
            netns: format!("{prefix}-{role}"),
            interface: interface.to_owned(),
            ip: format!("10.77.{}.{host}", n % 256),
        };
        let mut pair =
            TwoHosts { host: side("host", "veth-host", 1), dpu: side("dpu", "veth-dpu", 2), made: Vec::new() };
        for netns in [pair.host.netns.clone(), pair.dpu.netns.clone()] {
            ip(&["netns", "add", &netns])?;
            pair.made.push(netns);
        }
        let (host, dpu) = (&pair.host, &pair.dpu);
        let steps: [&[&str]; 7] = [
            &[
                "-n",
                &host.netns,
                "link",
                "add",
                &host.interface,
                "type",
                "veth",
                "peer",
                "name",
                &dpu.interface,
                "netns",
                &dpu.netns,
            ],
            &["-n", &host.netns, "addr", "add", &format!("{}/24", host.ip), "dev", &host.interface],
            &["-n", &dpu.netns, "addr", "add", &format!("{}/24", dpu.ip), "dev", &dpu.interface],
            &["-n", &host.netns, "link", "set", &host.interface, "up"],
            &["-n", &dpu.netns, "link", "set", &dpu.interface, "up"],
            &["-n", &host.netns, "link", "set", "lo", "up"],
            &["-n", &dpu.netns, "link", "set", "lo", "up"],
        ];
        for step in steps {
            // `pair` is dropped by the panic, which deletes the namespaces.
            ip(step).unwrap_or_else(|e| panic!("setting up the namespaces: {e}"));
        }
        // The kernel makes a veth end operational (IFF_RUNNING) a moment after both ends
        // are up, and until then UCX and libfabric tcp leave the interface out: a
        // process started at once would find no way to the other side.
        for side in [&pair.host, &pair.dpu] {
            side.wait_until_operational(Duration::from_secs(10));
        }
        Ok(pair)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for netns in self.made.iter().rev() {
            // A process left in a namespace would keep it, and the veth, alive after
            // `ip netns del`: only this test's processes can be in these namespaces.
            if let Ok(out) = Command::new("ip").args(["netns", "pids", netns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    eprintln!("TwoHosts: process {pid} was left in {netns}: killing it");
                    let _ = Command::new("kill").args(["-KILL", pid]).status();
                }
            }
            if let Err(e) = ip(&["netns", "del", netns]) {
                eprintln!("TwoHosts: {e} (remove it by hand: ip netns del {netns})");
            }
        }
    }
}
