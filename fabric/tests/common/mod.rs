//! Two-process harness: the test binary re-executes itself with a role in the
//! environment, and the two sides talk in lines over the child's stdin/stdout.
//!
//! Parent -> child: `key value...` lines on stdin.
//! Child -> parent: `@fabric key value...` lines on stdout (libtest's own output is
//! mixed in and ignored).

#![allow(dead_code)] // each test file uses a different subset

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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
