//! Two-process harness: the test binary re-executes itself with a role in the
//! environment, and the two sides talk in lines over the child's stdin/stdout.
//!
//! Parent -> child: `key value...` lines on stdin.
//! Child -> parent: `@fabric key value...` lines on stdout (libtest's own output is
//! mixed in and ignored).
//!
//! On top of the line protocol, the "host" role both transports' tests share (the
//! shim's side: allocates and publishes a region, optionally runs a progress thread,
//! answers the parent's commands) and the parent's handle on it ([`Host`]). What the
//! host serves is written against the `Transport` trait only, so that UCX and
//! libfabric are tested through one host and differ only in how the worker opens.
//!
//! Region layout of the host role: the u64 completion word at `COMPLETION_OFFSET`
//! (0), the payload from `PAYLOAD_OFFSET` on.

#![allow(dead_code)] // each test file uses a different subset

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fabric::transport::{Endpoint as _, Region as _};
use fabric::{Doorbell, Error, ProgressThread, Transport};

/// Environment variable carrying the child's role.
pub const ROLE_ENV: &str = "FABRIC_TEST_ROLE";
const MARK: &str = "@fabric ";
const RECV_TIMEOUT: Duration = Duration::from_secs(20);

/// The role this process was started in, if it is a child.
pub fn child_role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// A child process running one test function in a role.
pub struct Child {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Child {
    /// Starts this test binary running only `test_name`, with `role` and extra env.
    pub fn spawn(test_name: &str, role: &str, env: &[(&str, String)]) -> Child {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.args([test_name, "--exact", "--nocapture", "--test-threads=1", "--include-ignored"])
            .env(ROLE_ENV, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child test process");
        let stdin = child.stdin.take().expect("child stdin");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(pos) = line.find(MARK)
                    && tx.send(line[pos + MARK.len()..].to_owned()).is_err()
                {
                    break;
                }
            }
        });
        Child { child, stdin, lines }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends one command line.
    pub fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to child");
        self.stdin.flush().expect("flush to child");
    }

    /// Waits for the child's next `@fabric key ...` line and returns the rest.
    pub fn recv(&mut self, key: &str) -> String {
        let deadline = Instant::now() + RECV_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|e| panic!("child sent no {key:?} line: {e}"));
            let (k, rest) = line.split_once(' ').unwrap_or((&line, ""));
            if k == key {
                return rest.to_owned();
            }
            assert_ne!(k, "error", "child failed: {rest}");
        }
    }

    /// Like [`Child::recv`], calling `progress` while waiting (the child may need this
    /// process's transport to progress before it can answer).
    pub fn recv_progressing(&mut self, key: &str, mut progress: impl FnMut()) -> String {
        let deadline = Instant::now() + RECV_TIMEOUT;
        loop {
            match self.lines.recv_timeout(Duration::from_millis(1)) {
                Ok(line) => {
                    let (k, rest) = line.split_once(' ').unwrap_or((&line, ""));
                    if k == key {
                        return rest.to_owned();
                    }
                    assert_ne!(k, "error", "child failed: {rest}");
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    assert!(Instant::now() < deadline, "child sent no {key:?} line");
                    progress();
                }
                Err(e) => panic!("child sent no {key:?} line: {e}"),
            }
        }
    }

    /// Like [`Child::recv`], but `None` if the child ends (closes stdout) first.
    pub fn recv_optional(&self, key: &str) -> Option<String> {
        while let Ok(line) = self.lines.recv_timeout(RECV_TIMEOUT) {
            let (k, rest) = line.split_once(' ').unwrap_or((&line, ""));
            if k == key {
                return Some(rest.to_owned());
            }
        }
        None
    }

    /// True once the child has exited.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_some()
    }

    /// Waits for the child to exit and checks it passed.
    pub fn wait_success(&mut self) {
        let status = self.child.wait().expect("wait for child");
        assert!(status.success(), "child exited with {status}");
    }

    pub fn stop(&self) {
        // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped).
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGSTOP) }, 0);
        wait_for_state(self.pid(), 'T');
    }

    pub fn cont(&self) {
        // SAFETY: as in stop.
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGCONT) }, 0);
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.cont();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Child side: publish a value to the parent.
pub fn publish(key: &str, value: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{MARK}{key} {value}").unwrap();
    out.flush().unwrap();
}

/// Child side: command lines from the parent, split into words; ends at `exit`/EOF.
pub fn commands() -> impl Iterator<Item = Vec<String>> {
    std::io::stdin()
        .lines()
        .map_while(Result::ok)
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .take_while(|w| w.first().map(String::as_str) != Some("exit"))
}

/// (state letter, utime+stime clock ticks) of a process from /proc/<pid>/stat.
pub fn proc_stat(pid: i32) -> (char, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/pid/stat");
    // The command name is in parentheses and may contain spaces: split after it.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let state = fields[0].chars().next().unwrap();
    // After the comm: state is field 3 of stat(5); utime 14, stime 15 -> here 11, 12.
    let utime: u64 = fields[11].parse().unwrap();
    let stime: u64 = fields[12].parse().unwrap();
    (state, utime + stime)
}

fn wait_for_state(pid: i32, want: char) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while proc_stat(pid).0 != want {
        assert!(Instant::now() < deadline, "process {pid} never reached state {want}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// CPU time (user + system) of this process in microseconds, from getrusage.
pub fn self_cpu_us() -> u64 {
    // SAFETY: a zeroed rusage is a valid value; getrusage only writes it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is writable; RUSAGE_SELF is valid.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    let us = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000 + tv.tv_usec as u64;
    us(ru.ru_utime) + us(ru.ru_stime)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit")).collect()
}

/// Deterministic test payload: word k of a buffer is a hash of (seed, k).
/// Fill all of `mem` with the pattern of `seed`, through a copy: the memory is shared
/// with a peer, so it is written with copies, never through a Rust slice.
pub fn fill_memory(mem: &mut fabric::SharedMemory, seed: u64) {
    let mut bytes = vec![0u8; mem.len()];
    fill_pattern(&mut bytes, seed);
    mem.write_at(0, &bytes);
}

/// A copy of all of `mem` (shared with a peer: read with a copy, never a Rust slice).
pub fn copy_of(mem: &fabric::SharedMemory) -> Vec<u8> {
    mem.bytes(0, mem.len()).to_vec()
}

pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    for (k, chunk) in buf.chunks_mut(8).enumerate() {
        let w = pattern_word(seed, k as u64).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// Offset of the first byte differing from the pattern, if any.
pub fn check_pattern(buf: &[u8], seed: u64) -> Option<usize> {
    for (k, chunk) in buf.chunks(8).enumerate() {
        let w = pattern_word(seed, k as u64).to_le_bytes();
        if chunk != &w[..chunk.len()] {
            let i = chunk.iter().zip(w).position(|(a, b)| *a != b).unwrap();
            return Some(k * 8 + i);
        }
    }
    None
}

fn pattern_word(seed: u64, k: u64) -> u64 {
    // splitmix64
    let mut z = seed.wrapping_add(k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------- the host role

pub const MIB: usize = 1 << 20;
pub const PAYLOAD_OFFSET: usize = 4096;
pub const COMPLETION_OFFSET: usize = 0;
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
pub const COMPLETION: u64 = 0xC0_4D1E7E_u64;

/// Size of the host's region, set by [`Host::spawn`].
const REGION_BYTES_ENV: &str = "FABRIC_TEST_REGION_BYTES";
/// `thread` if the host runs a progress thread, `none` if not.
const PROGRESS_ENV: &str = "FABRIC_TEST_PROGRESS";

/// Child side: a variable the parent must have set.
pub fn child_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child needs {name}"))
}

/// Child side: argument `i` of a command line, as a number.
pub fn arg(cmd: &[String], i: usize) -> u64 {
    cmd[i].parse().unwrap()
}

/// Child side, the host: allocates the region the parent asked for on `t`, publishes
/// how to reach it (`info`), then serves the parent's commands until `exit`.
/// `extra` handles the commands a test file adds (given the command, `t` and the
/// region) and returns false for one it does not know.
pub fn serve_host<T: Transport + Clone + 'static>(t: T, mut extra: impl FnMut(&[String], &T, &T::Region) -> bool) {
    let len: usize = child_env(REGION_BYTES_ENV).parse().unwrap();
    let region = t.alloc_region(len).expect("host: allocate region");
    publish(
        "info",
        format!(
            "{} {} {} {} {}",
            hex(&t.address().unwrap()),
            region.addr(),
            region.len(),
            hex(&region.packed_key().unwrap()),
            std::process::id()
        ),
    );
    let progress =
        (child_env(PROGRESS_ENV) == "thread").then(|| ProgressThread::spawn(t.clone(), "host-progress").unwrap());
    let mut ep = None;
    for cmd in commands() {
        match cmd[0].as_str() {
            "check" => {
                let (seed, off, n) = (arg(&cmd, 1), arg(&cmd, 2) as usize, arg(&cmd, 3) as usize);
                match check_pattern(&region.bytes(off, n).to_vec(), seed) {
                    None => publish("check", "ok"),
                    Some(at) => publish("check", format!("mismatch at byte {at}")),
                }
            }
            "word" => publish("word", region.load_u64_acquire(arg(&cmd, 1) as usize)),
            "cpu" => publish("cpu", self_cpu_us()),
            "connect" => ep = Some(t.connect(&unhex(&cmd[1])).expect("host: connect to agent")),
            "doorbell" => {
                let ep = ep.as_ref().expect("connect first");
                ep.send_doorbell(&unhex(&cmd[1])).expect("host: send doorbell");
                ep.flush(FLUSH_TIMEOUT).expect("host: flush doorbell");
                publish("doorbell", "sent");
            }
            other => assert!(extra(&cmd, &t, &region), "host: unknown command {other}"),
        }
    }
    drop(ep);
    if let Some(p) = progress {
        let r = p.stop();
        publish("progress", format!("{} {} {}", r.cpu_time.as_micros(), r.wakeups, r.events));
    }
}

/// For [`serve_host`]: no commands beyond the shared ones.
pub fn no_extra<T: Transport>(_: &[String], _: &T, _: &T::Region) -> bool {
    false
}

// ---------------------------------------------------------------- the agent's handle on the host

/// A host child and what it published about its region.
pub struct Host {
    pub child: Child,
    pub address: Vec<u8>,
    pub region_addr: u64,
    pub region_len: u64,
    pub key: Vec<u8>,
}

impl Host {
    /// Starts this binary's `test` as a child in `role` (which must end in
    /// [`serve_host`]) with a region of `region_len` bytes, and reads its `info`.
    pub fn spawn(test: &str, role: &str, region_len: usize, progress_thread: bool, env: &[(&str, String)]) -> Host {
        let mut all = vec![
            (REGION_BYTES_ENV, region_len.to_string()),
            (PROGRESS_ENV, if progress_thread { "thread" } else { "none" }.to_owned()),
        ];
        all.extend(env.iter().cloned());
        let mut child = Child::spawn(test, role, &all);
        let info = child.recv("info");
        let f: Vec<&str> = info.split(' ').collect();
        Host {
            address: unhex(f[0]),
            region_addr: f[1].parse().unwrap(),
            region_len: f[2].parse().unwrap(),
            key: unhex(f[3]),
            child,
        }
    }

    pub fn check(&mut self, seed: u64, off: usize, len: usize) -> String {
        self.child.send(&format!("check {seed} {off} {len}"));
        self.child.recv("check")
    }

    pub fn cpu_us(&mut self) -> u64 {
        self.child.send("cpu");
        self.child.recv("cpu").parse().unwrap()
    }

    pub fn word(&mut self, off: usize) -> u64 {
        self.child.send(&format!("word {off}"));
        self.child.recv("word").parse().unwrap()
    }

    /// Ends the child while progressing the agent, so that endpoint closes that need
    /// the agent's answer (UCX over TCP, libfabric's rxm) complete. Returns the
    /// report of the host's progress thread, if it ran one.
    pub fn finish<T: Transport>(mut self, agent: &T) -> Option<String> {
        self.child.send("exit");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.child.exited() {
            assert!(Instant::now() < deadline, "host did not exit");
            agent.progress();
            std::thread::sleep(Duration::from_millis(1));
        }
        self.child.wait_success();
        self.child.recv_optional("progress")
    }

    /// [`Host::finish`], printing the progress thread's report under `[test]`.
    pub fn finish_reporting<T: Transport>(self, test: &str, agent: &T) {
        if let Some(p) = self.finish(agent) {
            eprintln!("[{test}] host progress thread: cpu_us wakeups events = {p}");
        }
    }
}

pub type Key<T> = <<T as Transport>::Endpoint as fabric::transport::Endpoint>::RemoteKey;

/// The agent connects to the host and unpacks the key of its whole region.
pub fn attach<T: Transport>(t: &T, host: &Host) -> (T::Endpoint, Key<T>) {
    let ep = t.connect(&host.address).expect("agent: connect to host");
    let key = ep.unpack_key(&host.key, host.region_addr, host.region_len).expect("agent: unpack host key");
    (ep, key)
}

/// One put of `staging[..len]` to `remote` and its flush; how long both took.
pub fn put_flush<T: Transport>(
    ep: &T::Endpoint,
    staging: &T::Region,
    len: usize,
    remote: u64,
    key: &Key<T>,
) -> Duration {
    timed_flush(ep, || ep.put(staging, 0, len, remote, key))
}

/// One get of `len` bytes at `remote` into `readback` and its flush; how long both
/// took.
pub fn get_flush<T: Transport>(
    ep: &T::Endpoint,
    readback: &T::Region,
    len: usize,
    remote: u64,
    key: &Key<T>,
) -> Duration {
    timed_flush(ep, || ep.get(readback, 0, len, remote, key))
}

fn timed_flush<E: fabric::transport::Endpoint>(ep: &E, post: impl FnOnce() -> fabric::Result<()>) -> Duration {
    let t0 = Instant::now();
    post().unwrap();
    ep.flush(FLUSH_TIMEOUT).unwrap();
    t0.elapsed()
}

/// The doorbell [`ring_doorbell`] has the host send.
pub const RING: &[u8] = b"session 7 ring 3";

/// What the agent saw of the host's doorbell.
pub struct Rung {
    pub got: Vec<Doorbell>,
    /// Waits on the event fd that ended woken.
    pub woken: u32,
    /// Waits that ended by their timeout.
    pub timeouts: u32,
}

/// The host connects to the agent and rings [`RING`] while the agent sleeps on its
/// event fd in waits of `wait_slice`: the doorbell must wake it (or be found after a
/// slice where the transport's fd does not wake on receive).
pub fn ring_doorbell<T: Transport>(agent: &T, host: &mut Host, wait_slice: Duration) -> Rung {
    host.child.send(&format!("connect {}", hex(&agent.address().unwrap())));

    // Sleep on the event fd before the host sends: the doorbell must wake us.
    while !agent.arm().unwrap() {
        agent.progress();
    }
    host.child.send(&format!("doorbell {}", hex(RING)));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let (mut woken, mut timeouts) = (0, 0);
    while got.is_empty() {
        assert!(Instant::now() < deadline, "no doorbell");
        if agent.wait(wait_slice).unwrap() {
            woken += 1;
        } else {
            timeouts += 1;
        }
        while agent.progress() > 0 {}
        assert_eq!(agent.take_doorbells(&mut got), 0, "nothing overflowed");
    }
    // The host's flush of its doorbell may need us to finish a handshake.
    assert_eq!(
        host.child.recv_progressing("doorbell", || {
            agent.progress();
        }),
        "sent"
    );
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].as_bytes(), RING);
    Rung { got, woken, timeouts }
}

/// The checks every transport makes on untrusted ranges before it posts anything:
/// beyond the key's range at either end, beyond the local region, a doorbell too
/// long, and a local region of another context (`other`, opened only then).
pub fn assert_ranges_refused<T: Transport>(
    agent: &T,
    ep: &T::Endpoint,
    key: &Key<T>,
    host: &Host,
    other: impl FnOnce() -> T,
) {
    let staging = agent.alloc_region(16).unwrap();
    let end = host.region_addr + host.region_len;
    assert!(matches!(ep.put(&staging, 0, 16, end - 8, key), Err(Error::OutOfRange { .. })));
    assert!(matches!(ep.get(&staging, 0, 16, host.region_addr - 1, key), Err(Error::OutOfRange { .. })));
    assert!(matches!(ep.put(&staging, 8, 16, host.region_addr, key), Err(Error::OutOfRange { .. })));
    assert!(matches!(ep.put_bytes(&[0; 9], end - 8, key), Err(Error::OutOfRange { .. })));
    assert!(matches!(ep.send_doorbell(&[0; 65]), Err(Error::DoorbellTooLong { .. })));

    // A region of another context is not usable as a local buffer here.
    let other = other();
    let foreign = other.alloc_region(16).unwrap();
    assert!(matches!(ep.put(&foreign, 0, 16, host.region_addr, key), Err(Error::ForeignRegion)));
}
