//! `dpuctl deploy`: install a `dpuio-agent` package on a DPU over SSH and start it.
//!
//! The steps, each printed before it runs (and only printed with `--dry-run`):
//!
//! 1. read the package's control fields and the config here (the same parser as the
//!    agent's `check-config`);
//! 2. reach the target (`ssh ... uname -m`) and compare its architecture with the
//!    package's;
//! 3. copy the package, the config and the certificates into a fresh staging directory;
//! 4. preflight: unpack the new package in the staging directory, run its `dpu-agent
//!    --version` (its libraries resolve on the target) and its `check-config` on the new
//!    config. Nothing outside the staging directory has changed up to here;
//! 5. back up what the install replaces (the binaries and `/etc/dpuio`);
//! 6. install (`dpkg -i`, or `dpkg-deb -x` into `--root DIR`), the config and the
//!    certificates;
//! 7. restart the agent (`systemctl restart dpu-agent`, or, under `--root`, stop the
//!    agent recorded in `DIR/run/dpu-agent.pid` and start the new one in the background);
//! 8. wait until the new agent answers `dpuctl status` over its admin socket on the
//!    target. If it does not within the timeout, put the backup back, start the previous
//!    agent again and say so: a DPU is never left half-upgraded.
//!
//! What it deliberately does not do: manage SSH keys or known hosts (the system `ssh`
//! and its options do), or install the static pod (a kubelet manifest is copied by the
//! operator's own tooling; see docs/deploy.md).

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::config::Config;

/// Where the agent's binaries, config and certificates go on the target (under the
/// install root).
const BIN: &str = "usr/bin/dpu-agent";
const CTL: &str = "usr/bin/dpuctl";
const CONF_DIR: &str = "etc/dpuio";
/// The systemd unit the package installs, and the system user it runs as.
const UNIT: &str = "dpu-agent.service";
const SERVICE_GROUP: &str = "dpuio";

/// A failed step: which one, why, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployError {
    /// The step's name as printed (`reach the target`, `install`, ...).
    pub step: String,
    /// What went wrong (with the command's own words where there is a command).
    pub reason: String,
    /// What the operator can do.
    pub hint: String,
}

impl fmt::Display for DeployError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "deploy: step \"{}\" failed: {}\n  what to do: {}", self.step, self.reason, self.hint)
    }
}

impl std::error::Error for DeployError {}

fn fail(step: &str, reason: impl Into<String>, hint: impl Into<String>) -> DeployError {
    DeployError { step: step.to_owned(), reason: reason.into(), hint: hint.into() }
}

/// `[USER@]HOST[:PORT]`; an IPv6 host is written in brackets (`[fd00::2]:22`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

impl FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Target, String> {
        let bad = |why: &str| format!("invalid target {s:?}: {why} (expected [USER@]HOST[:PORT])");
        let (user, rest) = match s.rsplit_once('@') {
            Some(("", _)) => return Err(bad("empty user")),
            Some((u, r)) => (Some(u.to_owned()), r),
            None => (None, s),
        };
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
            match after {
                "" => (host, None),
                p => (host, Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ]"))?)),
            }
        } else {
            match rest.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            }
        };
        if host.is_empty() || host.starts_with('-') || host.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(bad("not a host name or address"));
        }
        let port = match port {
            Some(p) => Some(p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| bad("port is not 1..65535"))?),
            None => None,
        };
        Ok(Target { user, host: host.to_owned(), port })
    }
}

impl Target {
    /// `user@host` for ssh, `user@[v6]` for scp's `HOST:PATH` syntax.
    fn login(&self, brackets: bool) -> String {
        let host = if brackets && self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        match &self.user {
            Some(u) => format!("{u}@{host}"),
            None => host,
        }
    }

    /// The address hosts attach to: the target's host with the agent's port.
    fn attach_address(&self, port: u16) -> String {
        if self.host.contains(':') { format!("[{}]:{port}", self.host) } else { format!("{}:{port}", self.host) }
    }
}

/// The Debian architecture a `uname -m` answer runs.
pub fn debian_arch(machine: &str) -> Option<&'static str> {
    match machine.trim() {
        "aarch64" | "arm64" => Some("arm64"),
        "x86_64" | "amd64" => Some("amd64"),
        _ => None,
    }
}

/// How the agent is installed and run on the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Install {
    /// `dpkg -i` and the package's systemd unit (a DPU's Ubuntu).
    Systemd,
    /// The package unpacked under this absolute prefix, the agent started in the
    /// background with its pid in `DIR/run/dpu-agent.pid` (no systemd needed).
    Root(PathBuf),
}

/// Everything `dpuctl deploy` was asked.
#[derive(Debug, Clone)]
pub struct Options {
    pub target: Target,
    /// A `dpuio-agent_VERSION_ARCH.deb` (`./x package` writes them to target/packages).
    pub package: PathBuf,
    /// The agent config to install as `/etc/dpuio/agent.toml`.
    pub config: PathBuf,
    /// A directory of certificates and keys to install as `/etc/dpuio/certs`.
    pub certs: Option<PathBuf>,
    /// `ssh -i`.
    pub identity: Option<PathBuf>,
    /// More `ssh -o` options (`StrictHostKeyChecking=accept-new`, ...).
    pub ssh_options: Vec<String>,
    pub install: Install,
    /// How long the new agent has to answer after its start.
    pub health_timeout: Duration,
    /// Print every step, run none.
    pub dry_run: bool,
}

/// What a successful deploy reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployed {
    pub version: String,
    pub arch: String,
    /// `HOST:PORT` for `DPUIO_AGENT` / `--agent`.
    pub attach: String,
    /// The config listens on loopback only: hosts cannot reach it.
    pub loopback_only: bool,
}

/// Quote for a POSIX shell.
fn quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Runs (or, dry, prints) the commands of the steps.
struct Runner<'a> {
    out: &'a mut dyn Write,
    dry_run: bool,
    step_no: usize,
    step: String,
}

impl Runner<'_> {
    fn step(&mut self, name: &str) {
        self.step_no += 1;
        self.step = name.to_owned();
        let _ = writeln!(self.out, "[{}] {name}", self.step_no);
    }

    fn note(&mut self, text: &str) {
        let _ = writeln!(self.out, "    {text}");
    }

    /// Run `argv`; its stdout, or the step's error with the command's stderr.
    fn run(&mut self, argv: &[String], hint: &str) -> Result<String, DeployError> {
        let shown = argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ");
        let _ = writeln!(self.out, "    $ {shown}");
        if self.dry_run {
            return Ok(String::new());
        }
        self.run_quietly(argv).map_err(|reason| fail(&self.step, reason, hint))
    }

    fn run_quietly(&self, argv: &[String]) -> Result<String, String> {
        let output = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", argv[0]))?;
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let said: Vec<&str> = stderr.lines().chain(stdout.lines()).filter(|l| !l.trim().is_empty()).collect();
        let tail = said[said.len().saturating_sub(6)..].join(" | ");
        Err(format!("`{}` {}: {}", argv[0], output.status, if tail.is_empty() { "no output" } else { &tail }))
    }
}

/// The ssh and scp command lines for a target.
struct Remote<'a> {
    o: &'a Options,
}

impl Remote<'_> {
    fn common(&self, port_flag: &str) -> Vec<String> {
        let mut a = vec!["-o".into(), "BatchMode=yes".into(), "-o".into(), "ConnectTimeout=10".into()];
        if let Some(p) = self.o.target.port {
            a.extend([port_flag.to_owned(), p.to_string()]);
        }
        if let Some(id) = &self.o.identity {
            a.extend(["-i".into(), id.to_string_lossy().into_owned()]);
        }
        for opt in &self.o.ssh_options {
            a.extend(["-o".into(), opt.clone()]);
        }
        a
    }

    /// `ssh ... TARGET SCRIPT` (the remote user's shell runs SCRIPT; a host never starts
    /// with `-`, so it cannot be taken for an option).
    fn ssh(&self, script: &str) -> Vec<String> {
        let mut a = vec!["ssh".to_owned()];
        a.extend(self.common("-p"));
        a.extend([self.o.target.login(false), script.to_owned()]);
        a
    }

    /// `scp -r ... FILES TARGET:DIR/`.
    fn scp(&self, files: &[&Path], dir: &str) -> Vec<String> {
        let mut a = vec!["scp".to_owned(), "-q".into(), "-r".into()];
        a.extend(self.common("-P"));
        a.extend(files.iter().map(|f| f.to_string_lossy().into_owned()));
        a.push(format!("{}:{dir}/", self.o.target.login(true)));
        a
    }
}

/// The package's control fields.
fn package_fields(package: &Path) -> Result<(String, String, String), String> {
    let output = Command::new("dpkg-deb")
        .args(["--field"])
        .arg(package)
        .args(["Package", "Version", "Architecture"])
        .output()
        .map_err(|e| format!("cannot run dpkg-deb (apt-get install dpkg): {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{} is not a Debian package: {}",
            package.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')).map(|v| v.trim().to_owned()))
            .ok_or_else(|| format!("{} has no {name} field", package.display()))
    };
    Ok((field("Package")?, field("Version")?, field("Architecture")?))
}

/// Install `o.package` with `o.config` on `o.target` (see the module docs); progress
/// goes to `out`.
pub fn deploy(o: &Options, out: &mut dyn Write) -> Result<Deployed, DeployError> {
    let mut r = Runner { out, dry_run: o.dry_run, step_no: 0, step: String::new() };
    let remote = Remote { o };

    r.step("check the package and the config here");
    let (name, version, arch) = package_fields(&o.package)
        .map_err(|e| fail(&r.step, e, "pass a dpuio-agent package built by `./x package` (target/packages/)"))?;
    if name != "dpuio-agent" {
        return Err(fail(
            &r.step,
            format!("{} is the package {name:?}, not dpuio-agent", o.package.display()),
            "pass target/packages/dpuio-agent_VERSION_ARCH.deb",
        ));
    }
    let config = Config::load(&o.config).map_err(|e| {
        fail(
            &r.step,
            e.to_string(),
            format!("fix {} (dpu-agent check-config explains each mistake)", o.config.display()),
        )
    })?;
    if !config.data_dir.is_absolute() {
        return Err(fail(
            &r.step,
            format!("the config's data_dir {} is relative", config.data_dir.display()),
            "set [agent] data_dir to an absolute path such as /var/lib/dpuio",
        ));
    }
    if let Some(certs) = &o.certs
        && !certs.is_dir()
    {
        return Err(fail(
            &r.step,
            format!("{} is not a directory", certs.display()),
            "pass --certs DIR with the agent's certificates and keys",
        ));
    }
    let root = match &o.install {
        Install::Systemd => "/".to_owned(),
        Install::Root(dir) if dir.is_absolute() => format!("{}/", dir.to_string_lossy().trim_end_matches('/')),
        Install::Root(dir) => {
            return Err(fail(&r.step, format!("--root {} is relative", dir.display()), "pass an absolute --root"));
        }
    };
    let socket = config.admin.socket.clone().unwrap_or_else(|| config.data_dir.join("admin.sock"));
    r.note(&format!(
        "{name} {version} ({arch}); agent listens on {}, data in {}",
        config.listen,
        config.data_dir.display()
    ));

    r.step("reach the target");
    let machine = r.run(
        &remote.ssh("uname -m"),
        &format!(
            "check that {} is up, that sshd listens there, and that your key is accepted (--identity, --ssh-option)",
            o.target.login(false)
        ),
    )?;
    if o.dry_run {
        r.note(&format!("(then compares the target's `uname -m` with the package's architecture {arch})"));
    } else {
        let target_arch = debian_arch(&machine).ok_or_else(|| {
            fail(
                &r.step,
                format!("the target runs {:?}, which dpuio has no package for", machine.trim()),
                "deploy to an arm64 (BlueField) or amd64 machine",
            )
        })?;
        if target_arch != arch {
            return Err(fail(
                "check the architecture",
                format!("the target is {target_arch} ({}) but the package is {arch}", machine.trim()),
                format!("deploy dpuio-agent_{version}_{target_arch}.deb (`./x package` builds both)"),
            ));
        }
        r.note(&format!("target is {target_arch}: matches the package"));
    }

    r.step("stage the package, config and certificates");
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let stage = format!("/tmp/dpuio-deploy.{stamp}.{}", std::process::id());
    r.run(&remote.ssh(&format!("mkdir -m 0700 {}", quote(&stage))), "check that /tmp on the target is writable")?;
    let staged = stage.clone();
    let result = install_and_start(&mut r, &remote, o, &root, &stage, &socket);
    // The staging directory goes whatever happened; a failure to remove it is only noted.
    if !o.dry_run {
        let _ = r.run_quietly(&remote.ssh(&format!("rm -rf {}", quote(&staged))));
    }
    result?;
    let loopback_only = config.listen.ip().is_loopback();
    Ok(Deployed { version, arch, attach: o.target.attach_address(config.listen.port()), loopback_only })
}

fn install_and_start(
    r: &mut Runner<'_>,
    remote: &Remote<'_>,
    o: &Options,
    root: &str,
    stage: &str,
    socket: &Path,
) -> Result<(), DeployError> {
    let q = quote;
    let mut files: Vec<&Path> = vec![&o.package, &o.config];
    if let Some(c) = &o.certs {
        files.push(c);
    }
    r.run(
        &remote.scp(&files, stage),
        "check that the target's sshd allows file transfer (its sftp subsystem) and that its /tmp has room",
    )?;
    let deb = format!("{stage}/{}", o.package.file_name().map_or("agent.deb".into(), |n| n.to_string_lossy()));
    let conf = format!("{stage}/{}", o.config.file_name().map_or("agent.toml".into(), |n| n.to_string_lossy()));
    let certs =
        o.certs.as_ref().map(|c| format!("{stage}/{}", c.file_name().map_or("certs".into(), |n| n.to_string_lossy())));

    r.step("preflight the new agent (nothing installed yet)");
    let new = format!("{stage}/new");
    r.run(
        &remote.ssh(&format!(
            "dpkg-deb -x {deb} {new} && test -x {new}/{BIN} && {new}/{BIN} --version && {new}/{BIN} check-config {conf}",
            deb = q(&deb),
            new = q(&new),
            conf = q(&conf)
        )),
        "the new agent cannot run on the target or refuses the config: read its words above; the running agent was not touched",
    )?;

    r.step("back up what the install replaces");
    let backup = format!("{stage}/previous.tar");
    let had_previous = r.run(
        &remote.ssh(&format!(
            "cd {root} && set -- && for f in {CONF_DIR} {BIN} {CTL}; do if [ -e \"$f\" ]; then set -- \"$@\" \"$f\"; fi; done; \
             if [ $# -gt 0 ]; then tar -cf {backup} \"$@\" && echo previous; else echo none; fi",
            root = q(root),
            backup = q(&backup)
        )),
        "check free space on the target; nothing was changed",
    )?;
    let had_previous = o.dry_run || had_previous.trim() == "previous";

    r.step("install");
    let conf_dir = format!("{root}{CONF_DIR}");
    let mut script = match &o.install {
        Install::Systemd => format!("dpkg --force-confdef --force-confold -i {} && ", q(&deb)),
        Install::Root(_) => format!("mkdir -p {root} && dpkg-deb -x {} {root} && ", q(&deb), root = q(root)),
    };
    script.push_str(&format!(
        "mkdir -p {d} && install -m 0640 {conf} {d}/agent.toml",
        d = q(&conf_dir),
        conf = q(&conf)
    ));
    if let Some(certs) = &certs {
        script.push_str(&format!(
            " && mkdir -p {d}/certs && cp -R {c}/. {d}/certs/ && chmod -R go-rwx {d}/certs",
            d = q(&conf_dir),
            c = q(certs)
        ));
    }
    if o.install == Install::Systemd {
        // The unit runs as its own user: its group reads the config and the certificates.
        script.push_str(&format!(
            " && if getent group {SERVICE_GROUP} >/dev/null; then chgrp -R {SERVICE_GROUP} {d} && chmod -R g+rX {d}; fi",
            d = q(&conf_dir)
        ));
    }
    let installed = r.run(&remote.ssh(&script), "read the install's words above; the previous agent keeps running");
    if let Err(e) = installed {
        if had_previous && !o.dry_run {
            let _ = r.run_quietly(&remote.ssh(&format!("tar -C {} -xf {}", q(root), q(&backup))));
        }
        return Err(e);
    }

    r.step("restart the agent");
    let restart = restart_script(o, root);
    r.run(&remote.ssh(&restart), "read the words above; `dpuctl deploy` put nothing back yet")?;

    r.step("wait until the new agent answers");
    let status = format!("{}{CTL} --socket {} status", q(root), q(&socket.to_string_lossy()));
    if o.dry_run {
        r.run(&remote.ssh(&status), "")?;
        r.note(&format!(
            "(repeated until it succeeds, at most {} s; then the backup is put back)",
            o.health_timeout.as_secs()
        ));
        return Ok(());
    }
    match wait_healthy(r, remote, &status, o.health_timeout) {
        Ok(answer) => {
            for line in answer.lines().take(3) {
                r.note(line);
            }
            Ok(())
        }
        Err(why) => {
            let log = match &o.install {
                Install::Systemd => format!("journalctl -u {UNIT} -n 20 --no-pager"),
                Install::Root(_) => format!("tail -n 20 {}var/log/dpu-agent.log", q(root)),
            };
            let said = r.run_quietly(&remote.ssh(&log)).unwrap_or_default();
            let said = said.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("no log").to_owned();
            let restored = if had_previous {
                r.step("put the previous agent back");
                let back = format!("{}; tar -C {} -xf {} && {restart}", stop_script(o, root), q(root), q(&backup));
                match r.run(&remote.ssh(&back), "").and_then(|_| {
                    wait_healthy(r, remote, &status, o.health_timeout)
                        .map_err(|w| fail("put the previous agent back", w, ""))
                }) {
                    Ok(_) => "the previous agent and config are back and answer again".to_owned(),
                    Err(e) => format!("putting the previous agent back failed too ({})", e.reason),
                }
            } else {
                let _ = r.run_quietly(&remote.ssh(&stop_script(o, root)));
                "there was no previous agent; the new one was stopped".to_owned()
            };
            Err(fail(
                "wait until the new agent answers",
                format!("{why}; its log ends: {said}"),
                format!("{restored}; fix the config or the package and deploy again"),
            ))
        }
    }
}

/// Stop the agent this install runs (no error if none runs).
fn stop_script(o: &Options, root: &str) -> String {
    match &o.install {
        Install::Systemd => format!("systemctl stop {UNIT} || true"),
        Install::Root(_) => {
            let pid = quote(&format!("{root}run/dpu-agent.pid"));
            format!(
                "if [ -f {pid} ] && kill -0 \"$(cat {pid})\" 2>/dev/null; then kill -TERM \"$(cat {pid})\"; \
                 for i in $(seq 100); do kill -0 \"$(cat {pid})\" 2>/dev/null || break; sleep 0.2; done; fi; rm -f {pid}"
            )
        }
    }
}

/// Stop the running agent and start the installed one.
fn restart_script(o: &Options, root: &str) -> String {
    match &o.install {
        Install::Systemd => format!("systemctl daemon-reload && systemctl enable {UNIT} && systemctl restart {UNIT}"),
        Install::Root(_) => {
            let q = quote;
            // Only the agent goes to the background, with none of the ssh session's
            // descriptors, so ssh returns at once; without job control it is no group
            // leader, so setsid execs it in place and $! is the agent's pid.
            format!(
                "{stop}; mkdir -p {run} {log} || exit 1; cd {root} || exit 1; \
                 setsid nohup {root}{BIN} serve --config {root}{CONF_DIR}/agent.toml \
                 >>{log}/dpu-agent.log 2>&1 </dev/null & echo $! > {pid}",
                stop = stop_script(o, root),
                run = q(&format!("{root}run")),
                log = q(&format!("{root}var/log")),
                root = q(root),
                pid = q(&format!("{root}run/dpu-agent.pid")),
            )
        }
    }
}

/// Poll `status` on the target until it succeeds or `timeout` passes.
fn wait_healthy(r: &mut Runner<'_>, remote: &Remote<'_>, status: &str, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let argv = remote.ssh(status);
    loop {
        match r.run_quietly(&argv) {
            Ok(answer) => return Ok(answer),
            Err(why) if Instant::now() >= deadline => {
                return Err(format!("no answer over its admin socket within {} s ({why})", timeout.as_secs()));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        let t: Target = "root@10.0.0.2:2222".parse().unwrap();
        assert_eq!(t, Target { user: Some("root".into()), host: "10.0.0.2".into(), port: Some(2222) });
        let t: Target = "dpu0".parse().unwrap();
        assert_eq!(t, Target { user: None, host: "dpu0".into(), port: None });
        let t: Target = "ubuntu@[fd00::2]:22".parse().unwrap();
        assert_eq!((t.host.as_str(), t.port), ("fd00::2", Some(22)));
        assert_eq!(t.login(true), "ubuntu@[fd00::2]");
        assert_eq!(t.attach_address(7300), "[fd00::2]:7300");
        for bad in ["", "@h", "h:0", "h:99999", "h:x", "-oProxyCommand=x", "[::1", "a b"] {
            assert!(bad.parse::<Target>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn architectures_map_to_debian_names() {
        assert_eq!(debian_arch("aarch64\n"), Some("arm64"));
        assert_eq!(debian_arch("x86_64"), Some("amd64"));
        assert_eq!(debian_arch("riscv64"), None);
    }

    #[test]
    fn quoting_survives_the_shell() {
        assert_eq!(quote("/opt/dpu io"), "'/opt/dpu io'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("/tmp/a-b_c.1"), "/tmp/a-b_c.1");
        let out = Command::new("sh").args(["-c", &format!("printf %s {}", quote("a'b $x \"c\""))]).output().unwrap();
        assert_eq!(out.stdout, b"a'b $x \"c\"");
    }

    #[test]
    fn errors_name_the_step_and_the_fix() {
        let e = fail("reach the target", "ssh exited 255", "check sshd");
        assert_eq!(e.to_string(), "deploy: step \"reach the target\" failed: ssh exited 255\n  what to do: check sshd");
    }
}
