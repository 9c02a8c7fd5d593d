//! Start a real `dpu-agent` process and know when it serves: the one start-up path of
//! the end-to-end tests (`dpuio-tests`) and of the benchmarks that bring their own agent
//! (`dpuio-bench qos --agent-bin`).
//!
//! An agent is ready when it prints its first stdout line, `dpu-agent listening on ADDR
//! (mtls|plaintext)`, followed by `metrics ADDR` when it serves `[metrics] listen`; [`start`] waits for that line, keeps draining stdout afterwards
//! (an agent must never block on a full pipe) and hands back an [`Agent`] that kills
//! and reaps the process when dropped, also when the start fails half-way.
//!
//! What it deliberately leaves to its callers: which binary runs (a build, an installed
//! package, an emulator, a chroot), the environment (the tests make it hermetic), where
//! stderr goes, and everything after start-up (clients, signals, DAOS containers).
#![forbid(unsafe_code)]

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

/// What an agent prints first, once it listens.
const READY_PREFIX: &str = "dpu-agent listening on ";

/// `--listen` for an agent on loopback at a port the kernel picks (the agent reports it).
pub const LOOPBACK_ANY_PORT: &str = "127.0.0.1:0";

/// Why an agent did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The scratch directory or the config file could not be made.
    #[error("{what}: {source}")]
    Scratch { what: String, source: std::io::Error },
    /// The program could not be run at all (missing, not executable).
    #[error("cannot run {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    /// The agent ended (or closed its stdout) before it reported its address: its
    /// stderr says why.
    #[error("the agent exited before it reported its address ({})", status.map_or("still running, stdout closed".to_owned(), |s| s.to_string()))]
    Exited { status: Option<ExitStatus> },
    /// The agent reported nothing within the start-up time.
    #[error("the agent did not report its address within {startup:?}")]
    Timeout { startup: Duration },
    /// The first line was not the address: not a `dpu-agent serve`, or another version.
    #[error("unexpected first line from the agent: {line:?}")]
    UnexpectedLine { line: String },
}

/// A running agent, killed and reaped when dropped (then its scratch directory, if
/// [`start_with_config`] made one, is removed).
pub struct Agent {
    child: Child,
    addr: String,
    plaintext: bool,
    metrics: Option<String>,
    /// Declared last: removed after the process is gone.
    _scratch: Option<tempfile::TempDir>,
}

impl Agent {
    /// `IP:PORT` the agent listens on.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `IP:PORT` of the agent's `GET /metrics`, if its config has `[metrics] listen`.
    pub fn metrics_addr(&self) -> Option<&str> {
        self.metrics.as_deref()
    }

    /// The agent serves plaintext (`[tls] mode = "off"`), not mutual TLS.
    pub fn plaintext(&self) -> bool {
        self.plaintext
    }

    /// The address for the shim library and the CLI: `ADDR` (mutual TLS), or
    /// `http://ADDR` for a plaintext agent.
    pub fn url(&self) -> String {
        if self.plaintext { format!("http://{}", self.addr) } else { self.addr.clone() }
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The process, to signal it or wait for it.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Kill the agent (if it still runs) and reap it; dropping does the same.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `program serve --data-dir DATA_DIR`, logging warnings only, with the development
/// client bundle written to `DATA_DIR/client` instead of the user's `~/.config/dpuio`
/// (so that agents started side by side each have their own). Callers add `--listen`,
/// `--config` and the rest.
pub fn serve_command(mut program: Command, data_dir: &Path) -> Command {
    program
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .env("RUST_LOG", "warn")
        .env("DPUIO_CONFIG_DIR", data_dir.join("client"));
    program
}

/// Start `agent` (a complete `dpu-agent serve ...` command line, possibly wrapped in an
/// emulator or a chroot) with its stdout piped, and wait at most `startup` for its
/// address. stderr and the environment stay as the caller set them.
pub fn start(mut agent: Command, startup: Duration) -> Result<Agent, StartError> {
    let mut child = agent.stdout(Stdio::piped()).spawn().map_err(|source| StartError::Spawn {
        program: Path::new(agent.get_program()).display().to_string(),
        source,
    })?;
    let stdout = child.stdout.take();
    // From here on a failure drops `agent`, which kills the process: an agent left
    // running would outlive its test or benchmark and hold its terminal open.
    let mut agent = Agent { child, addr: String::new(), plaintext: false, metrics: None, _scratch: None };
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(stdout) = stdout {
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {} // keep draining so the agent never blocks on stdout
        });
    }
    let line = match rx.recv_timeout(startup) {
        Ok(line) => line,
        Err(RecvTimeoutError::Timeout) => return Err(StartError::Timeout { startup }),
        Err(RecvTimeoutError::Disconnected) => {
            // stdout closed: give the process a moment to finish exiting, for its status.
            let status = (0..50).find_map(|_| {
                let status = agent.child.try_wait().ok().flatten();
                if status.is_none() {
                    std::thread::sleep(Duration::from_millis(10));
                }
                status
            });
            return Err(StartError::Exited { status });
        }
    };
    let (addr, plaintext) = parse_ready_line(&line).ok_or_else(|| StartError::UnexpectedLine { line: line.clone() })?;
    agent.addr = addr;
    agent.plaintext = plaintext;
    agent.metrics = parse_metrics_addr(&line);
    Ok(agent)
}

/// Start `program` with `config` (the text of an agent config) in a scratch directory
/// of its own: the config in `DIR/agent.toml`, the data in `DIR/data`, listening on
/// loopback at a free port. The directory goes when the returned agent is dropped.
pub fn start_with_config(program: Command, config: &str, startup: Duration) -> Result<Agent, StartError> {
    let scratch = tempfile::Builder::new()
        .prefix("dpuio-agent-")
        .tempdir()
        .map_err(|source| StartError::Scratch { what: "create a scratch directory".into(), source })?;
    let config_path = write_config(scratch.path(), config)?;
    let mut agent = serve_command(program, &scratch.path().join("data"));
    agent.args([OsStr::new("--config"), config_path.as_os_str()]).args(["--listen", LOOPBACK_ANY_PORT]);
    let mut started = start(agent, startup)?;
    started._scratch = Some(scratch);
    Ok(started)
}

/// Write `text` as `dir/agent.toml` (creating `dir`); its path.
pub fn write_config(dir: &Path, text: &str) -> Result<PathBuf, StartError> {
    let path = dir.join("agent.toml");
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, text))
        .map_err(|source| StartError::Scratch { what: format!("write {}", path.display()), source })?;
    Ok(path)
}

/// `(ADDR, plaintext)` from `dpu-agent listening on ADDR (plaintext)`; an agent that
/// names no mode serves mutual TLS.
fn parse_ready_line(line: &str) -> Option<(String, bool)> {
    let mut words = line.strip_prefix(READY_PREFIX)?.split_whitespace();
    let addr = words.next()?;
    Some((addr.to_owned(), words.next() == Some("(plaintext)")))
}

/// `ADDR` from a ready line that ends `metrics ADDR`.
fn parse_metrics_addr(line: &str) -> Option<String> {
    let mut words = line.strip_prefix(READY_PREFIX)?.split_whitespace().skip_while(|w| *w != "metrics");
    words.next()?;
    words.next().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_gives_the_address_and_the_mode() {
        let parse = |l: &str| parse_ready_line(l);
        assert_eq!(parse("dpu-agent listening on 127.0.0.1:4000 (mtls)"), Some(("127.0.0.1:4000".into(), false)));
        assert_eq!(parse("dpu-agent listening on [::1]:9 (plaintext)"), Some(("[::1]:9".into(), true)));
        assert_eq!(parse("dpu-agent listening on 10.0.0.1:7300"), Some(("10.0.0.1:7300".into(), false)));
        assert_eq!(parse("dpu-agent listening on "), None);
        let with_metrics = "dpu-agent listening on 127.0.0.1:4000 (plaintext) metrics 127.0.0.1:9464";
        assert_eq!(parse(with_metrics), Some(("127.0.0.1:4000".into(), true)));
        assert_eq!(parse_metrics_addr(with_metrics).as_deref(), Some("127.0.0.1:9464"));
        assert_eq!(parse_metrics_addr("dpu-agent listening on 127.0.0.1:4000 (mtls)"), None);
        assert_eq!(parse("error: no such file"), None);
    }

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn a_program_that_prints_the_line_is_an_agent_until_dropped() {
        let agent =
            start(sh("echo 'dpu-agent listening on 127.0.0.1:5 (plaintext)'; exec sleep 30"), Duration::from_secs(10))
                .expect("started");
        assert_eq!(agent.url(), "http://127.0.0.1:5");
        let pid = agent.id();
        drop(agent);
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the process is reaped when dropped");
    }

    #[test]
    fn an_early_exit_a_silence_and_a_wrong_line_are_told_apart() {
        let err = |script, startup| start(sh(script), startup).err().expect("fails").to_string();
        assert!(
            err("exit 3", Duration::from_secs(10)).contains("exited before it reported its address (exit status: 3)")
        );
        assert!(err("exec sleep 30", Duration::from_millis(200)).contains("within 200ms"));
        assert!(err("echo hello; exec sleep 30", Duration::from_secs(10)).contains("\"hello\""));
        assert!(err("", Duration::from_secs(10)).contains("exited"));
        let missing = start(Command::new("/nonexistent/dpu-agent"), Duration::from_secs(1)).err().expect("fails");
        assert!(missing.to_string().starts_with("cannot run /nonexistent/dpu-agent"), "{missing}");
    }

    #[test]
    fn a_config_lives_in_a_scratch_directory_removed_with_the_agent() {
        // `sh -c SCRIPT serve --data-dir D --config C --listen L`: $0.. are those words.
        let script = "test -f \"$4\" && echo \"dpu-agent listening on 127.0.0.1:6 (mtls) $4\"; exec sleep 30";
        let agent = start_with_config(sh(script), "[tls]\nmode = \"off\"\n", Duration::from_secs(10)).expect("started");
        let dir = agent._scratch.as_ref().expect("a scratch directory").path().to_owned();
        assert_eq!(std::fs::read_to_string(dir.join("agent.toml")).unwrap(), "[tls]\nmode = \"off\"\n");
        assert_eq!(agent.addr(), "127.0.0.1:6");
        drop(agent);
        assert!(!dir.exists());
    }
}
