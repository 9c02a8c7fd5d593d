//! Harness for the end-to-end tests: find the workspace's binaries, start a real
//! `dpu-agent` on a free loopback port in its own data directory, run the `dpuio` CLI.
//!
//! The binaries are the ones `cargo build --workspace --bins` made next to the test
//! executable (the README's test command builds them first).
#![forbid(unsafe_code)]

pub mod arm64;
pub mod daos;
pub mod daos_server;
pub mod hostile;
pub mod netns;
pub mod programs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Path of a workspace binary built in the same profile as this test.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile> directory");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the binaries first with `cargo build --workspace --bins` (./x test does)",
        path.display()
    );
    path
}

/// The variables through which a user's shell could steer a client or an agent: tests
/// never inherit them.
const USER_SETTINGS: [&str; 9] = [
    "DPUIO_AGENT",
    "DPUIO_CERT",
    "DPUIO_KEY",
    "DPUIO_CA",
    "DPUIO_TOKEN",
    "DPUIO_TENANT",
    "DPUIO_TRANSPORT",
    "DPUIO_INTERFACE",
    "DPUIO_CONFIG_DIR",
];

/// Make `cmd` independent of the user's home directory and environment: `HOME` is
/// `home` (created if missing), `DPUIO_CONFIG_DIR` is `home/.config/dpuio`, and none of
/// the user's `DPUIO_*` settings are passed on. A bundle an earlier run left in the real
/// `~/.config/dpuio` can then neither hide a failure nor be overwritten.
pub fn hermetic<'a>(cmd: &'a mut Command, home: &Path) -> &'a mut Command {
    std::fs::create_dir_all(home).expect("create a scratch HOME");
    for name in USER_SETTINGS {
        cmd.env_remove(name);
    }
    cmd.env("HOME", home).env("DPUIO_CONFIG_DIR", home.join(".config/dpuio"))
}

/// A workspace binary run with a scratch `HOME` (see [`hermetic`]).
pub fn command_in(name: &str, home: &Path) -> Command {
    let mut c = Command::new(binary(name));
    hermetic(&mut c, home);
    c
}

/// The backend of agents started without `--config`: `local` unless
/// `DPUIO_TEST_BACKEND=daos`, which gives each such agent a config with
/// `[backend] kind = "daos"` in the pool `DAOS_POOL` and a container of its own for the
/// default tenant (how `./x test`'s DAOS tier runs the end-to-end tests over DAOS).
pub fn daos_pool_under_test() -> Option<String> {
    match std::env::var("DPUIO_TEST_BACKEND").as_deref() {
        Ok("daos") => Some(
            std::env::var("DAOS_POOL")
                .ok()
                .filter(|p| !p.is_empty())
                .expect("DPUIO_TEST_BACKEND=daos needs DAOS_POOL (source the env file of daos-up.sh)"),
        ),
        Ok("local") | Err(_) => None,
        Ok(other) => panic!("DPUIO_TEST_BACKEND={other:?}: expected local or daos"),
    }
}

/// `prefix-PID-NANOS`: a DAOS container label (or the start of one) that no other test,
/// run or engineer sharing the pool uses.
fn unique_label(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{prefix}-{}-{}", std::process::id(), nanos % 1_000_000_000_000)
}

/// Run DAOS's own `daos` tool (as `user` if given: the tenant's DAOS identity), which
/// must succeed; its stdout.
fn daos_tool(user: Option<&str>, args: &[&std::ffi::OsStr]) -> String {
    let mut tool = match user {
        Some(user) => daos::daos_as(user),
        None => Command::new("daos"),
    };
    let out = tool
        .args(args)
        .output()
        .expect("run daos (is DAOS's bin directory on PATH? source the env file of daos-up.sh)");
    assert!(
        out.status.success(),
        "daos {}: {}",
        args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Give a scratch directory of the test's to a tenant's DAOS user (not root), who copies
/// into it.
fn give_to(dir: &Path, user: &str) {
    let out = Command::new("chown").arg(user).arg(dir).output().expect("run chown");
    assert!(out.status.success(), "chown {user} {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
}

/// Every entry under `dir` with its bytes, keyed by its path relative to `dir`
/// (directories end in `/` and have no bytes).
fn snapshot_tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("list {}: {e}", d.display())) {
            let path = entry.expect("a directory entry").path();
            let name = path.strip_prefix(dir).expect("under dir").display().to_string();
            let kind = std::fs::symlink_metadata(&path).expect("stat an entry").file_type();
            if kind.is_dir() {
                out.insert(name + "/", Vec::new());
                pending.push(path);
            } else if kind.is_file() {
                let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                out.insert(name, bytes);
            }
        }
    }
    out
}

/// The storage behind an agent whose test writes its own config: the `[backend]` section
/// for that config, the container names to give its tenants, and a view of the stored
/// bytes from outside dpuio, the same calls for both backends.
///
/// `local` (the default): containers are trees under `DATA_DIR/containers`, named as
/// the test names them. With `DPUIO_TEST_BACKEND=daos`: containers are DAOS containers
/// in `DAOS_POOL` whose labels start with a prefix of this value's own, so tests sharing
/// the pool never meet; they are created by the agent (`create_containers = true`) and
/// destroyed when this value is dropped. An agent restarted on the same config reaches
/// the same containers as long as this value lives: keep it for the whole test, and
/// declare it before the agents so that they are gone when the containers are destroyed.
pub struct StorageUnderTest {
    data_dir: PathBuf,
    daos: Option<DaosContainers>,
}

struct DaosContainers {
    pool: String,
    /// `DPUIO_TEST_DAOS_IDENTITY=1`: each tenant NAME runs as the DAOS user
    /// `dpuio-t-NAME` (a worker process of its own), and its container is seen from
    /// outside as that user (root is not in its ACL).
    identities: bool,
    prefix: String,
    /// Every label handed out: the containers to destroy (an agent creates them on
    /// first use, so some may not exist).
    labels: Mutex<BTreeSet<String>>,
}

impl StorageUnderTest {
    /// Storage for the agents of one test that keep their data in `data_dir`; `test`
    /// (a short tag) goes into the DAOS labels so that a leftover container names its test.
    pub fn new(test: &str, data_dir: &Path) -> StorageUnderTest {
        let daos = daos_pool_under_test().map(|pool| {
            let tag: String = test.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').take(16).collect();
            let identities = std::env::var("DPUIO_TEST_DAOS_IDENTITY").as_deref() == Ok("1");
            DaosContainers {
                pool,
                identities,
                prefix: unique_label(&format!("e2e-{tag}")),
                labels: Mutex::new(BTreeSet::new()),
            }
        });
        StorageUnderTest { data_dir: data_dir.to_owned(), daos }
    }

    /// The `[backend]` section of the agent's config (empty for `local`, the default):
    /// put it before the `[[tenants]]`.
    pub fn backend_config(&self) -> String {
        match &self.daos {
            None => String::new(),
            Some(d) => format!("[backend]\nkind = \"daos\"\npool = \"{}\"\ncreate_containers = true\n", d.pool),
        }
    }

    /// Lines for the `[[tenants]]` table of tenant `name` beyond its name and container:
    /// its DAOS identity under `DPUIO_TEST_DAOS_IDENTITY=1` (the user made and admitted
    /// to the pool first), else nothing.
    pub fn tenant_settings(&self, name: &str) -> String {
        match &self.daos {
            Some(d) if d.identities => {
                let daos = daos::Daos { pool: d.pool.clone(), socket_dir: PathBuf::new() };
                let user =
                    daos::tenant_identity(&daos, name).unwrap_or_else(|e| panic!("tenant {name}'s DAOS user: {e}"));
                format!("daos_user = \"{user}\"\n")
            }
            _ => String::new(),
        }
    }

    /// Who sees tenant `name`'s container from outside: its DAOS user, or root.
    fn outside_user(&self, name: &str) -> Option<String> {
        self.daos.as_ref().filter(|d| d.identities).map(|_| format!("dpuio-t-{name}"))
    }

    /// The container to configure for what the test calls `name`: `name` itself on
    /// `local`, `PREFIX-name` on DAOS. The same `name` always gives the same container.
    pub fn container(&self, name: &str) -> String {
        match &self.daos {
            None => name.to_owned(),
            Some(d) => {
                let label = format!("{}-{name}", d.prefix);
                d.labels.lock().unwrap_or_else(|e| e.into_inner()).insert(label.clone());
                label
            }
        }
    }

    /// Every file and directory of container `name` (as given to
    /// [`StorageUnderTest::container`]) with its stored bytes, read as another client
    /// of the storage would: from the local tree, or copied out of DAOS with
    /// `daos filesystem copy`. Keys are paths relative to the container's root;
    /// directories end in `/`.
    pub fn snapshot(&self, name: &str) -> BTreeMap<String, Vec<u8>> {
        match &self.daos {
            None => snapshot_tree(&self.local_root(name)),
            Some(d) => {
                let out = tempfile::tempdir().expect("a scratch directory for the copy");
                if let Some(user) = self.outside_user(name) {
                    // DAOS sets the copied root's permissions on it: the user must own it.
                    give_to(out.path(), &user);
                }
                // The root of a container copied into an existing directory lands in it,
                // not in a subdirectory.
                daos_tool(
                    self.outside_user(name).as_deref(),
                    &[
                        "filesystem".as_ref(),
                        "copy".as_ref(),
                        "--src".as_ref(),
                        format!("daos://{}/{}/", d.pool, self.container(name)).as_ref(),
                        "--dst".as_ref(),
                        out.path().as_os_str(),
                    ],
                );
                snapshot_tree(out.path())
            }
        }
    }

    /// Change the stored bytes of the file at `path` of container `name` behind the
    /// agent's back, as another client of the storage would: `edit` gets the bytes as
    /// stored and must keep their length. On DAOS the file is copied out and copied back
    /// over the same DFS object with `daos filesystem copy` (it keeps the object id; the
    /// length is kept because that copy is not relied on to truncate).
    pub fn alter_stored(&self, name: &str, path: &str, edit: impl FnOnce(&mut Vec<u8>)) {
        let relative = path.trim_start_matches('/');
        match &self.daos {
            None => {
                let file = self.local_root(name).join(relative);
                let mut bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
                let len = bytes.len();
                edit(&mut bytes);
                assert_eq!(bytes.len(), len, "alter_stored keeps the length");
                std::fs::write(&file, bytes).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
            }
            Some(d) => {
                let scratch = tempfile::tempdir().expect("a scratch directory for the copy");
                let user = self.outside_user(name);
                if let Some(user) = &user {
                    give_to(scratch.path(), user);
                }
                let local = scratch.path().join("stored");
                let url = format!("daos://{}/{}/{relative}", d.pool, self.container(name));
                let copy = |src: &std::ffi::OsStr, dst: &std::ffi::OsStr| {
                    daos_tool(
                        user.as_deref(),
                        &["filesystem".as_ref(), "copy".as_ref(), "--src".as_ref(), src, "--dst".as_ref(), dst],
                    );
                };
                copy(url.as_ref(), local.as_os_str());
                let mut bytes = std::fs::read(&local).expect("read the copied-out file");
                let len = bytes.len();
                edit(&mut bytes);
                assert_eq!(bytes.len(), len, "alter_stored keeps the length");
                std::fs::write(&local, bytes).expect("write the edited copy");
                copy(local.as_os_str(), url.as_ref());
            }
        }
    }

    fn local_root(&self, name: &str) -> PathBuf {
        self.data_dir.join("containers").join(name)
    }
}

impl Drop for StorageUnderTest {
    fn drop(&mut self) {
        // The pool is shared by every test and engineer on the machine: give the space back.
        if let Some(d) = &self.daos {
            for label in d.labels.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                // A tenant's own container is its DAOS user's to destroy.
                let owner = label.strip_prefix(&format!("{}-", d.prefix)).and_then(|name| self.outside_user(name));
                let mut tool = owner.as_deref().map_or_else(|| Command::new("daos"), daos::daos_as);
                let _ = tool.args(["container", "destroy", "--force", &d.pool, label]).output();
            }
        }
    }
}

/// The interpreter for the Python parts of the tests: the project's venv (`./x` installs
/// numpy and prometheus-client there) if it exists, else the system's python3.
pub fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    if venv.is_file() { venv } else { PathBuf::from("python3") }
}

/// A running `dpu-agent serve`, killed when dropped (started through
/// [`dpuio_harness`], as `dpuio-bench` starts its own).
pub struct AgentProcess {
    pub process: dpuio_harness::Agent,
    /// `IP:PORT`: `127.0.0.1:PORT` unless started with another `--listen`.
    pub addr: String,
    pub data_dir: PathBuf,
    /// The agent serves plaintext (`[tls] mode = "off"`).
    pub plaintext: bool,
    /// With `DPUIO_TEST_BACKEND=daos`: the pool and the default tenant's container.
    pub daos: Option<(String, String)>,
}

impl AgentProcess {
    /// Start an agent with `--data-dir data_dir --listen 127.0.0.1:0` plus `extra` args
    /// (`--listen` among them replaces the loopback one), and wait until it prints the
    /// address it listens on.
    pub fn start(data_dir: &Path, extra: &[&str]) -> AgentProcess {
        Self::start_program(Command::new(binary("dpu-agent")), data_dir, extra, Duration::from_secs(30))
    }

    /// Like [`AgentProcess::start`], for an agent run by `program` (another build of
    /// `dpu-agent`, or an emulator with the agent as its first argument), waiting at most
    /// `startup` for its address.
    pub fn start_program(mut program: Command, data_dir: &Path, extra: &[&str], startup: Duration) -> AgentProcess {
        let mut daos = None;
        let mut config_args: Vec<PathBuf> = Vec::new();
        if let Some(pool) = daos_pool_under_test().filter(|_| !extra.contains(&"--config")) {
            let container = unique_label("e2e");
            let config = dpuio_harness::write_config(
                data_dir,
                &format!(
                    "[backend]\nkind = \"daos\"\npool = \"{pool}\"\ncreate_containers = true\n\
                     [[tenants]]\nname = \"default\"\ncontainer = \"{container}\"\n"
                ),
            )
            .unwrap_or_else(|e| panic!("the agent's DAOS config: {e}"));
            config_args = vec!["--config".into(), config];
            daos = Some((pool, container));
        }
        let listen: &[&str] =
            if extra.contains(&"--listen") { &[] } else { &["--listen", dpuio_harness::LOOPBACK_ANY_PORT] };
        hermetic(&mut program, &data_dir.join(".home"));
        let mut command = dpuio_harness::serve_command(program, data_dir);
        command.args(listen).args(&config_args).args(extra);
        let process = dpuio_harness::start(command, startup).unwrap_or_else(|e| panic!("dpu-agent: {e}"));
        Self::adopt(process, data_dir, daos)
    }

    /// The handle of the tests on an agent started otherwise (from an image, a package),
    /// whose data directory is `data_dir`.
    pub fn adopt(process: dpuio_harness::Agent, data_dir: &Path, daos: Option<(String, String)>) -> AgentProcess {
        AgentProcess {
            addr: process.addr().to_owned(),
            plaintext: process.plaintext(),
            process,
            data_dir: data_dir.to_owned(),
            daos,
        }
    }

    /// Kill this agent with SIGKILL (if it still runs) and start another on the same
    /// address, data directory and (over DAOS) config and container: what a crash and
    /// its supervisor's restart look like to clients.
    pub fn restart(mut self) -> AgentProcess {
        self.process.kill();
        let daos = self.daos.take(); // the container lives on with the new agent
        let listen = ["--listen", self.addr.as_str()];
        let config = self.data_dir.join("agent.toml");
        let config_arg = config.to_string_lossy().into_owned();
        let mut extra: Vec<&str> = listen.to_vec();
        if daos.is_some() {
            extra.extend(["--config", config_arg.as_str()]);
        }
        let mut again =
            Self::start_program(Command::new(binary("dpu-agent")), &self.data_dir, &extra, Duration::from_secs(30));
        again.daos = daos;
        again
    }

    /// Put a file at `path` of the default tenant's container behind the agent's back,
    /// the way another client of the storage would: into the local tree, or with DAOS's
    /// own `daos filesystem copy` into the DAOS container (its parent made through the
    /// agent first).
    pub fn seed_file(&self, path: &str, data: &[u8]) {
        let relative = path.trim_start_matches('/');
        match &self.daos {
            None => {
                let file = self.data_dir.join("containers/default").join(relative);
                std::fs::create_dir_all(file.parent().expect("a parent")).expect("create the parent");
                std::fs::write(file, data).expect("write into the container's tree");
            }
            Some((pool, container)) => {
                if let Some((parent, _)) = relative.rsplit_once('/') {
                    ok_stdout(&self.cli(&["mkdir", "-p", &format!("/{parent}")]));
                }
                let staged = self.data_dir.join(format!("seed-{}", relative.replace('/', "_")));
                std::fs::write(&staged, data).expect("stage the file");
                let out = Command::new("daos")
                    .args(["filesystem", "copy", "--src"])
                    .arg(&staged)
                    .args(["--dst", &format!("daos://{pool}/{container}/{relative}")])
                    .output()
                    .expect("run daos filesystem copy (is DAOS's bin directory on PATH?)");
                assert!(out.status.success(), "daos filesystem copy: {}", String::from_utf8_lossy(&out.stderr));
                let _ = std::fs::remove_file(staged);
            }
        }
    }

    /// The address for the shim library and the CLI: `ADDR` (mutual TLS: use with
    /// [`AgentProcess::tls`]), or `http://ADDR` for a plaintext agent.
    pub fn url(&self) -> String {
        self.process.url()
    }

    /// The development client bundle the agent wrote for its default tenant.
    pub fn client_dir(&self) -> PathBuf {
        self.data_dir.join("client")
    }

    /// TLS options that use [`AgentProcess::client_dir`].
    pub fn tls(&self) -> dpuio_shim::TlsOptions {
        dpuio_shim::TlsOptions::bundle(self.client_dir())
    }

    /// Options to connect to this agent as its default tenant.
    /// Nothing of the test process's environment (`DPUIO_TOKEN`, ...) is taken.
    pub fn connect_options(&self) -> dpuio_shim::ConnectOptions {
        dpuio_shim::ConnectOptions {
            agent: self.url(),
            tls: self.tls(),
            tenant: String::new(),
            capability_token: String::new(),
            ..dpuio_shim::ConnectOptions::default()
        }
    }

    /// A raw gRPC channel to this agent, with the default tenant's client certificate.
    pub async fn channel(&self) -> tonic::transport::Channel {
        self.channel_with(&self.client_dir()).await
    }

    /// A raw gRPC channel to this agent with the client bundle (ca.pem, client.pem,
    /// client.key) in `bundle`.
    pub async fn channel_with(&self, bundle: &Path) -> tonic::transport::Channel {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
        let read = |file: &str| std::fs::read(bundle.join(file)).expect("a client bundle");
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read("ca.pem")))
            .identity(Identity::from_pem(read("client.pem"), read("client.key")))
            .domain_name("127.0.0.1");
        Endpoint::from_shared(format!("https://{}", self.addr))
            .expect("agent address")
            .tls_config(tls)
            .expect("TLS settings")
            .connect()
            .await
            .expect("connect to the agent")
    }

    /// Run `dpuctl` against this agent's admin socket.
    pub fn dpuctl(&self, args: &[&str]) -> Output {
        self.command("dpuctl").arg("--data-dir").arg(&self.data_dir).args(args).output().expect("run dpuctl")
    }

    /// A command for a workspace binary with this agent's address and client bundle
    /// in its environment (`DPUIO_AGENT`, `DPUIO_CONFIG_DIR`), and the agent's scratch
    /// `HOME` (see [`hermetic`]).
    pub fn command(&self, name: &str) -> Command {
        let mut c = command_in(name, &self.data_dir.join(".home"));
        c.env("DPUIO_AGENT", self.url()).env("DPUIO_CONFIG_DIR", self.client_dir());
        c
    }

    /// Send a signal (`"TERM"`, `"KILL"`, `"STOP"`, `"CONT"`) with kill(1).
    pub fn signal(&self, name: &str) {
        let status =
            Command::new("kill").arg(format!("-{name}")).arg(self.process.id().to_string()).status().expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }

    /// Wait for the agent to exit, at most `timeout`; returns its exit code.
    pub fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.child_mut().try_wait().expect("wait for agent") {
                return status.code();
            }
            if Instant::now() > deadline {
                panic!("dpu-agent did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Run the `dpuio` CLI against this agent.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.command("dpuio").args(args).output().expect("run dpuio")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        // Before the container goes: the agent must not be using it.
        self.process.kill();
        // The tier's pool is shared by every test: give the space back.
        if let Some((pool, container)) = &self.daos {
            let _ = Command::new("daos").args(["container", "destroy", "--force", pool, container]).output();
        }
    }
}

/// `len` bytes of a seeded random stream: the same bytes for the same seed.
pub fn seeded_bytes(len: usize, seed: u64) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut data = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut data[..]);
    data
}

/// The files mapped into process `pid` whose path contains `name` (from
/// `/proc/PID/maps`), each once. Under qemu-user an emulated program's libraries are
/// mappings of the emulator process.
pub fn mapped_files(pid: u32, name: &str) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read /proc/PID/maps");
    let mut files: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.contains(name))
        .map(str::to_owned)
        .collect();
    files.dedup();
    files
}

/// stdout of a successful command, or a panic showing its stderr.
pub fn ok_stdout(out: &Output) -> String {
    assert!(out.status.success(), "command failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).expect("utf-8 output")
}

/// The text of an agent's `GET /metrics` at `addr` (its `[metrics] listen`).
pub fn scrape_metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    stream.write_all(b"GET /metrics HTTP/1.0\r\nAccept: text/plain\r\n\r\n").expect("send the scrape");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read the scrape");
    text
}
