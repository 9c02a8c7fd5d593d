//! The agent's OCI image and its kubelet static pod:
//!
//! * the archive `dpu-agent-VERSION-ARCH.oci.tar` (`./x package` writes both architectures
//!   into target/packages; `./x test` builds both from the debug builds into
//!   `$DPUIO_IMAGE_DIR`, which is looked in first) is a valid OCI layout for skopeo, every
//!   blob matches its digest, and its config names the agent's entrypoint, command, port
//!   and architecture;
//! * the root filesystem of its one layer runs the agent (chroot into it, with /proc, /sys
//!   and /dev mounted in a mount namespace of its own, as a container runtime would; the
//!   arm64 one under `qemu-aarch64-static`), with the image's own command, environment and
//!   packaged config: it answers grpc.health.v1 on its plaintext health port and over TLS
//!   on its control-plane port, its UCX and libfabric (tcp) data planes come up, the image's `dpuctl status`
//!   answers over the admin socket, and SIGTERM stops it cleanly;
//! * the variant with the DAOS client, `dpu-agent-daos-VERSION-ARCH.oci.tar` (tag
//!   `VERSION-daos`), is as valid and its agent serves the same way; in its root the
//!   static pod's daos-agent container command (`daos_agent` from its installed path, the
//!   config from /etc/dpuio) starts and makes its socket in /var/run/daos_agent, where the
//!   image's `dpu-agent check-config` finds it, with the DAOS libraries loading from
//!   /usr/lib/daos and no DPUIO_DAOS_PREFIX; `daos` and `dmg` run; SIGTERM stops it;
//! * with the DAOS tier's system up (`DAOS_POOL`, `DAOS_RUNDIR`), the DAOS image as the pod
//!   runs it (its daos_agent, its agent on `kind = "daos"`) serves the native `dpuio` from
//!   that pool: put/get byte-identical, read back by DAOS's own `daos filesystem copy`;
//! * `deploy/bluefield/dpu-agent.yaml` parses and names that image, its probes and ports,
//!   and runs daos_agent beside the agent: same image, one shared socket directory, one
//!   read-only config directory, one PID namespace.
//!
//! A missing tool, archive or privilege skips a test with the reason printed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use dpuio_tests::{AgentProcess, ok_stdout};
use serde_json::Value;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const IMAGE: &str = "localhost/dpuio/dpu-agent";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where archives are looked for: `$DPUIO_IMAGE_DIR` (./x test's debug-built amd64 image),
/// then target/packages (`./x package`).
fn image_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("DPUIO_IMAGE_DIR").map(PathBuf::from).into_iter().collect();
    dirs.push(workspace().join("target/packages"));
    dirs
}

fn archive(arch: &str) -> Option<PathBuf> {
    find_archive(&format!("dpu-agent-{VERSION}-{arch}.oci.tar"))
}

/// The variant with the DAOS client (`build-oci.py --daos-client`).
fn daos_archive(arch: &str) -> Option<PathBuf> {
    find_archive(&format!("dpu-agent-daos-{VERSION}-{arch}.oci.tar"))
}

fn find_archive(name: &str) -> Option<PathBuf> {
    let found = image_dirs().into_iter().map(|d| d.join(name)).find(|p| p.is_file());
    if found.is_none() {
        let dirs: Vec<String> = image_dirs().iter().map(|d| d.display().to_string()).collect();
        eprintln!("SKIPPED: no {name} in {} (`./x package` and `./x test` build it)", dirs.join(" or "));
    }
    found
}

fn have(tool: &str) -> bool {
    let found =
        Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIPPED: {tool} is not installed");
    }
    found
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program).args(args).output().unwrap_or_else(|e| panic!("run {program}: {e}"))
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array().unwrap_or_else(|| panic!("not an array: {v}")).iter().map(|s| s.as_str().unwrap()).collect()
}

/// skopeo reads the layout, copies every blob out of it (checking each digest), and the
/// config says what the agent's image must say; `tag` is the image's tag.
fn layout_is_valid(path: Option<PathBuf>, arch: &str, tag: &str) -> Option<Value> {
    let path = path?;
    if !have("skopeo") {
        return None;
    }
    let reference = format!("oci-archive:{}", path.display());
    let inspect = json(&ok_stdout(&run("skopeo", &["inspect", &reference])));
    assert_eq!(inspect["Architecture"], arch, "{inspect}");
    assert_eq!(inspect["Os"], "linux");
    assert_eq!(inspect["Labels"]["org.opencontainers.image.version"], VERSION);

    let config = json(&ok_stdout(&run("skopeo", &["inspect", "--config", &reference])));
    assert_eq!(config["architecture"], arch);
    assert_eq!(config["os"], "linux");
    let c = &config["config"];
    assert_eq!(strings(&c["Entrypoint"]), ["/usr/bin/dpu-agent"]);
    assert_eq!(strings(&c["Cmd"]), ["serve", "--config", "/etc/dpuio/agent.toml"]);
    assert!(c["ExposedPorts"].get("7300/tcp").is_some(), "{c}");
    assert_eq!(c["StopSignal"], "SIGTERM");
    assert!(config["rootfs"]["diff_ids"].as_array().is_some_and(|d| d.len() == 1), "{config}");

    // A copy out of the archive reads and verifies every blob.
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("copy");
    ok_stdout(&run("skopeo", &["copy", "--quiet", &reference, &format!("dir:{}", copy.display())]));
    let manifest = json(&std::fs::read_to_string(copy.join("manifest.json")).unwrap());
    assert_eq!(manifest["layers"].as_array().unwrap().len(), 1);

    // The name containerd gives it on import, which the static pod uses.
    let index = json(&ok_stdout(&run("tar", &["-xOf", path.to_str().unwrap(), "index.json"])));
    let annotations = &index["manifests"][0]["annotations"];
    assert_eq!(annotations["io.containerd.image.name"], format!("{IMAGE}:{tag}").as_str());
    assert_eq!(annotations["org.opencontainers.image.ref.name"], tag);
    Some(inspect["Labels"].clone())
}

#[test]
fn amd64_image_is_a_valid_oci_layout_of_the_agent() {
    layout_is_valid(archive("amd64"), "amd64", VERSION);
}

#[test]
fn arm64_image_is_a_valid_oci_layout_of_the_agent() {
    layout_is_valid(archive("arm64"), "arm64", VERSION);
}

/// The DAOS variant: tagged VERSION-daos, naming its daos-client package, which is among
/// the image's packages.
fn daos_layout_is_valid(arch: &str) {
    let Some(labels) = layout_is_valid(daos_archive(arch), arch, &format!("{VERSION}-daos")) else { return };
    let package =
        labels["io.dpuio.daos-client"].as_str().unwrap_or_else(|| panic!("no io.dpuio.daos-client: {labels}"));
    assert!(package.starts_with("daos-client_") && package.ends_with(&format!("_{arch}.deb")), "{package}");
    let packages = labels["io.dpuio.runtime-packages"].as_str().unwrap();
    assert!(packages.contains(&format!("daos-client:{arch} ")), "{packages}");
}

#[test]
fn amd64_daos_image_is_a_valid_oci_layout() {
    daos_layout_is_valid("amd64");
}

#[test]
fn arm64_daos_image_is_a_valid_oci_layout() {
    daos_layout_is_valid("arm64");
}

/// The image's layer unpacked into `dir/rootfs`, and its config.
fn unpack(archive: &Path, dir: &Path) -> (PathBuf, Value) {
    let layout = dir.join("layout");
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&layout).unwrap();
    std::fs::create_dir_all(&rootfs).unwrap();
    ok_stdout(&run("tar", &["-xf", archive.to_str().unwrap(), "-C", layout.to_str().unwrap()]));
    let blob =
        |digest: &Value| layout.join("blobs/sha256").join(digest.as_str().unwrap().trim_start_matches("sha256:"));
    let index = json(&std::fs::read_to_string(layout.join("index.json")).unwrap());
    let manifest = json(&std::fs::read_to_string(blob(&index["manifests"][0]["digest"])).unwrap());
    let config = json(&std::fs::read_to_string(blob(&manifest["config"]["digest"])).unwrap());
    for layer in manifest["layers"].as_array().unwrap() {
        let file = blob(&layer["digest"]);
        ok_stdout(&run("tar", &["-xzf", file.to_str().unwrap(), "-C", rootfs.to_str().unwrap()]));
    }
    (rootfs, config)
}

/// A scratch directory that is kept, not removed, if anything is still mounted under it
/// (removing it would then reach into the host's /dev or /sys).
struct Scratch(Option<tempfile::TempDir>);

impl Drop for Scratch {
    fn drop(&mut self) {
        let dir = self.0.take().unwrap();
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        if mounts.contains(dir.path().to_str().unwrap()) {
            eprintln!("keeping {}: something is still mounted under it", dir.path().display());
            let _ = dir.keep();
        }
    }
}

/// `argv` run as a container runtime would run it in `rootfs`: chrooted, in a mount
/// namespace of its own with /proc, /sys and /dev mounted (they go away with it), with
/// only the image's environment `env` (`KEY=VALUE`).
fn in_root(rootfs: &Path, argv: &[String], env: Vec<&str>) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-ec"])
        .arg(
            r#"r=$1; shift
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /dev "$r/dev"
exec chroot "$r" "$@""#,
        )
        .arg("sh")
        .arg(rootfs)
        .args(argv)
        .env_clear()
        .envs(env.iter().map(|kv| kv.split_once('=').unwrap_or_else(|| panic!("{kv:?} in the image's Env"))));
    cmd
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

async fn health(channel: tonic::transport::Channel) -> i32 {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest { service: String::new() })
        .await
        .expect("grpc.health.v1 Check");
    reply.into_inner().status
}

/// Whether the tests that chroot into an image can run here (root, unshare, the emulator).
fn can_run_roots(emulator: Option<&str>) -> bool {
    if ok_stdout(&run("id", &["-u"])).trim() != "0" {
        eprintln!("SKIPPED: chroot and the mounts of a container's root need root");
        return false;
    }
    have("unshare") && emulator.is_none_or(have)
}

/// The archive's root filesystem unpacked in `dir`, its config, and the argv prefix that
/// runs a program of it (`emulator`, copied into the root, when it is not for this machine).
fn unpack_runnable(path: &Path, dir: &Path, emulator: Option<&str>) -> (PathBuf, Value, Vec<String>) {
    let (rootfs, config) = unpack(path, dir);
    let mut prefix: Vec<String> = Vec::new();
    if let Some(emulator) = emulator {
        let host = ok_stdout(&run("sh", &["-c", &format!("command -v {emulator}")]));
        std::fs::copy(host.trim(), rootfs.join(emulator)).unwrap();
        prefix.push(format!("/{emulator}"));
    }
    (rootfs, config, prefix)
}

/// Start the image's entrypoint and command, with its environment, chrooted into its root
/// filesystem (under `emulator`, copied in, when the image is not for this machine), and
/// check that it serves.
fn agent_runs_in_its_root(path: Option<PathBuf>, arch: &str, emulator: Option<&str>) {
    let Some(path) = path else { return };
    if !can_run_roots(emulator) {
        return;
    }
    let scratch = Scratch(Some(tempfile::tempdir().unwrap()));
    let tmp = scratch.0.as_ref().unwrap();
    let (rootfs, config, prefix) = unpack_runnable(&path, tmp.path(), emulator);
    let c = &config["config"];
    let mut argv: Vec<String> = prefix.clone();
    argv.extend(strings(&c["Entrypoint"]).into_iter().map(String::from));
    argv.extend(strings(&c["Cmd"]).into_iter().map(String::from));
    // As the static pod adds a health listener; a free port, loopback only, for the test.
    let health_port = free_port();
    argv.extend([
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--health-listen".into(),
        format!("127.0.0.1:{health_port}"),
    ]);

    let log_path = tmp.path().join("agent.log");
    let mut cmd = in_root(&rootfs, &argv, strings(&c["Env"]));
    cmd.env("RUST_LOG", "info").stderr(std::fs::File::create(&log_path).unwrap());
    let started = std::time::Instant::now();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    // Under emulation the first start makes the development CA: give it time.
    let process = dpuio_harness::start(cmd, Duration::from_secs(180))
        .unwrap_or_else(|e| panic!("the agent in the image: {e}:\n{}", log()));
    let up = started.elapsed();
    // The harness's handle on this agent (kill on drop, signal, wait); its data directory
    // is the image's /var/lib/dpuio (the packaged config's).
    let agent = AgentProcess::adopt(process, &rootfs.join("var/lib/dpuio"), None);

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    // Plaintext, on the health port only: what kubelet's grpc probe does.
    let plain = rt.block_on(async {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{health_port}")).unwrap();
        health(endpoint.connect().await.expect("connect to the health port")).await
    });
    assert_eq!(plain, serving, "{}", log());
    // Over TLS on the control-plane port, trusting the development CA the agent made in the
    // image's data directory (health needs no client certificate; every other service does).
    let ca =
        std::fs::read(agent.data_dir.join("pki/ca.pem")).unwrap_or_else(|e| panic!("the agent's CA: {e}\n{}", log()));
    let tls = rt.block_on(async {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
        let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("127.0.0.1");
        let endpoint = Endpoint::from_shared(format!("https://{}", agent.addr)).unwrap().tls_config(tls).unwrap();
        health(endpoint.connect().await.expect("TLS connection to the agent")).await
    });
    assert_eq!(tls, serving);
    assert!(log().contains("data plane up"), "UCX did not start in the image's root:\n{}", log());
    // UCX's transport modules (/usr/lib/<triplet>/ucx in the image) were found and loaded:
    // without them only self, tcp, sysv and posix are listed.
    let line = log().lines().find(|l| l.contains("data plane up")).unwrap_or_default().to_owned();
    let modules = line.split("modules ").nth(1).and_then(|m| m.split(';').next()).unwrap_or_default().to_owned();
    for module in ["ib", "rdmacm", "cma"] {
        assert!(
            modules.split(' ').any(|m| m == module),
            "UCX did not load its {module} module from the image:\n{}",
            log()
        );
    }
    // libfabric, which the agent loads at run time (no DT_NEEDED names it), is in the image.
    assert!(line.contains("ofi (tcp;ofi_rxm)"), "no libfabric tcp transport from the image:\n{}", log());

    // The image's own dpuctl, in the same root, over the packaged config's admin socket.
    let mut argv = prefix.clone();
    argv.extend(["/usr/bin/dpuctl", "--socket", "/run/dpuio/admin.sock", "status"].map(String::from));
    let mut dpuctl = in_root(&rootfs, &argv, strings(&c["Env"]));
    let status = ok_stdout(&dpuctl.output().unwrap());
    assert!(status.contains("backend   local"), "{status}");
    assert!(status.contains(VERSION), "{status}");

    // SIGTERM, as kubelet stops a pod: a clean exit, and the mounts went with the namespace.
    // The clients go first: their runtime runs only inside block_on, so their connections
    // could not answer the GOAWAY of the agent's graceful shutdown, which waits for them.
    drop(rt);
    let mut agent = agent;
    agent.signal("TERM");
    assert_eq!(agent.wait(Duration::from_secs(60)), Some(0), "{}", log());
    eprintln!(
        "{arch}: the agent of {}{} listened after {:.2} s, answered health (plaintext and TLS) and dpuctl status, exited 0 on SIGTERM after {:.2} s",
        path.file_name().unwrap().to_string_lossy(),
        emulator.map(|e| format!(" under {e}")).unwrap_or_default(),
        up.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(rootfs.to_str().unwrap()), "mounts left behind:\n{mounts}");
}

#[test]
fn amd64_agent_runs_and_answers_health_in_its_image_root() {
    agent_runs_in_its_root(archive("amd64"), "amd64", None);
}

#[test]
fn arm64_agent_runs_and_answers_health_in_its_image_root_under_qemu() {
    agent_runs_in_its_root(archive("arm64"), "arm64", Some("qemu-aarch64-static"));
}

#[test]
fn amd64_agent_runs_and_answers_health_in_its_daos_image_root() {
    agent_runs_in_its_root(daos_archive("amd64"), "amd64", None);
}

#[test]
fn arm64_agent_runs_and_answers_health_in_its_daos_image_root_under_qemu() {
    agent_runs_in_its_root(daos_archive("arm64"), "arm64", Some("qemu-aarch64-static"));
}

/// The static pod, parsed with python3's yaml module (None, said, when it is missing).
fn static_pod() -> Option<Value> {
    let file = workspace().join("deploy/bluefield/dpu-agent.yaml");
    if !have("python3") {
        return None;
    }
    let out = Command::new("python3")
        .args(["-c", "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))"])
        .arg(&file)
        .output()
        .unwrap();
    if String::from_utf8_lossy(&out.stderr).contains("No module named 'yaml'") {
        eprintln!("SKIPPED: python3's yaml module is missing (apt-get install python3-yaml)");
        return None;
    }
    Some(json(&ok_stdout(&out)))
}

fn pod_container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("the pod has no container {name}"))
}

/// Run `argv` in `rootfs` with `env` to completion; its stdout, or a panic with its output.
fn in_root_ok(rootfs: &Path, argv: Vec<String>, env: Vec<&str>) -> String {
    let out = in_root(rootfs, &argv, env).output().unwrap();
    assert!(
        out.status.success(),
        "{argv:?} in the image's root: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// In the DAOS variant's root: the static pod's daos-agent container (its command and
/// arguments, its config in /etc/dpuio) starts daos_agent from its installed path and it
/// makes its socket in /var/run/daos_agent; the image's agent, with the image's
/// environment only (no DPUIO_DAOS_PREFIX, no LD_LIBRARY_PATH), loads the DAOS libraries
/// from /usr/lib/daos and finds that socket (`check-config`); the image's `daos` and `dmg`
/// run; SIGTERM stops daos_agent with exit 0. No DAOS server is needed: daos_agent asks
/// the access points only when a client connects.
fn daos_agent_runs_beside_the_agent_in_its_root(arch: &str, emulator: Option<&str>) {
    let Some(path) = daos_archive(arch) else { return };
    let Some(pod) = static_pod() else { return };
    if !can_run_roots(emulator) {
        return;
    }
    let scratch = Scratch(Some(tempfile::tempdir().unwrap()));
    let tmp = scratch.0.as_ref().unwrap();
    let (rootfs, config, prefix) = unpack_runnable(&path, tmp.path(), emulator);
    let env = strings(&config["config"]["Env"]);
    for forbidden in ["DPUIO_DAOS_PREFIX=", "LD_LIBRARY_PATH=", "DAOS_AGENT_DRPC_DIR="] {
        assert!(!env.iter().any(|e| e.starts_with(forbidden)), "the image's Env sets {forbidden}: {env:?}");
    }
    let daos_version = config["config"]["Labels"]["io.dpuio.daos-client"]
        .as_str()
        .and_then(|p| p.split('_').nth(1))
        .and_then(|v| v.split('-').next())
        .unwrap_or_else(|| panic!("no daos-client version in the labels: {config}"))
        .to_owned();

    // The pod's daos-agent container, as kubelet would start it, with a daos_agent.yml in
    // /etc/dpuio (the directory the pod mounts there). Its access point listens nowhere.
    let daos_agent = pod_container(&pod, "daos-agent");
    let mut argv = prefix.clone();
    argv.extend(strings(&daos_agent["command"]).into_iter().map(String::from));
    let args = strings(&daos_agent["args"]);
    argv.extend(args.iter().map(|a| a.to_string()));
    let yml = args.iter().position(|a| *a == "--config-path").map(|i| args[i + 1]).expect("--config-path");
    assert!(yml.starts_with("/etc/dpuio/"), "daos_agent's config must be in /etc/dpuio: {yml}");
    let port = free_port();
    std::fs::write(
        rootfs.join(yml.trim_start_matches('/')),
        format!("name: daos_server\naccess_points: ['127.0.0.1:{port}']\nport: {port}\ntransport_config:\n  allow_insecure: true\n"),
    )
    .unwrap();
    let log_path = tmp.path().join("daos_agent.log");
    let started = std::time::Instant::now();
    let mut child = in_root(&rootfs, &argv, env.clone())
        .stdout(std::fs::File::create(&log_path).unwrap())
        .stderr(std::fs::File::create(tmp.path().join("daos_agent.err")).unwrap())
        .spawn()
        .expect("start daos_agent in the image's root");
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let guard = Kill(&mut child);
    let log = || {
        std::fs::read_to_string(&log_path).unwrap_or_default()
            + &std::fs::read_to_string(tmp.path().join("daos_agent.err")).unwrap_or_default()
    };
    // /var/run is /run in the image: where the pod mounts the shared emptyDir.
    let socket = rootfs.join("run/daos_agent/daos_agent.sock");
    let listening = "listening on /var/run/daos_agent/daos_agent.sock";
    while !(socket.exists() && log().contains(listening)) {
        if let Some(status) = guard.0.try_wait().unwrap() {
            panic!("daos_agent exited ({status}) in the image's root:\n{}", log());
        }
        assert!(started.elapsed() < Duration::from_secs(60), "daos_agent made no socket within 60 s:\n{}", log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let up = started.elapsed();

    // The image's agent, as the pod's dpu-agent container runs it, over the DAOS backend.
    std::fs::write(
        rootfs.join("etc/dpuio/agent-daos.toml"),
        "[backend]\nkind = \"daos\"\npool = \"tank\"\n\n[[tenants]]\nname = \"default\"\ncontainer = \"vision\"\n",
    )
    .unwrap();
    let mut check = prefix.clone();
    check.extend(["/usr/bin/dpu-agent", "check-config", "/etc/dpuio/agent-daos.toml"].map(String::from));
    let said = in_root_ok(&rootfs, check, env.clone());
    assert!(said.contains("the DAOS client libraries load on this machine"), "{said}");
    assert!(said.contains("a daos_agent socket is at /var/run/daos_agent/daos_agent.sock"), "{said}");

    // The DAOS tools of the image, from their installed paths.
    for (tool, says) in
        [("daos_agent", "DAOS Agent version"), ("daos", "DAOS CLI version"), ("dmg", "DAOS Admin Tool version")]
    {
        let mut argv = prefix.clone();
        argv.extend([format!("/usr/bin/{tool}"), "version".into()]);
        let out = in_root_ok(&rootfs, argv, env.clone());
        assert!(out.contains(&format!("{says} {daos_version}")), "{tool} version: {out}");
    }

    // SIGTERM, as kubelet stops the container.
    ok_stdout(&run("kill", &["-TERM", &guard.0.id().to_string()]));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = guard.0.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "daos_agent did not stop on SIGTERM:\n{}", log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "daos_agent exited {status} on SIGTERM:\n{}", log());
    drop(guard);
    eprintln!(
        "{arch}: the image's daos_agent{} (the pod's command) listened on /var/run/daos_agent after {:.2} s; \
         the image's agent loaded the DAOS libraries and found the socket; daos and dmg {daos_version} ran; \
         daos_agent exited 0 on SIGTERM",
        emulator.map(|e| format!(" under {e}")).unwrap_or_default(),
        up.as_secs_f64()
    );
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(rootfs.to_str().unwrap()), "mounts left behind:\n{mounts}");
}

/// The running DAOS system of `./x test`'s DAOS tier (`source RUNDIR/env` of daos-up.sh):
/// its pool and its control-plane port, or None, said (a failure under
/// `DPUIO_REQUIRE_DAOS=1`).
fn daos_system_under_test() -> Option<(String, u16)> {
    let pool = std::env::var("DAOS_POOL").ok().filter(|p| !p.is_empty());
    let rundir = std::env::var("DAOS_RUNDIR").ok().filter(|p| !p.is_empty());
    let (Some(pool), Some(rundir)) = (pool, rundir) else {
        let why = "DAOS_POOL and DAOS_RUNDIR are not set (start DAOS with ../shared/daos/daos-up.sh RUNDIR, then \
                   source RUNDIR/env; ./x test's DAOS tier does)";
        assert!(std::env::var("DPUIO_REQUIRE_DAOS").as_deref() != Ok("1"), "DPUIO_REQUIRE_DAOS=1 but: {why}");
        eprintln!("SKIPPED: {why}");
        return None;
    };
    // daos-up.sh's daos_agent.yml: `port: N` (the access point is this machine).
    let yml = Path::new(&rundir).join("daos_agent.yml");
    let text = std::fs::read_to_string(&yml).unwrap_or_else(|e| panic!("{}: {e}", yml.display()));
    let port = text
        .lines()
        .find_map(|l| l.strip_prefix("port:"))
        .map(|p| p.trim().parse().unwrap_or_else(|e| panic!("{}: port {p:?}: {e}", yml.display())))
        .unwrap_or(10001);
    Some((pool, port))
}

/// The DAOS image as the pod runs it, against the real DAOS system of the DAOS tier: in
/// the image's root, the pod's daos_agent command with a daos_agent.yml in /etc/dpuio
/// naming that system's access point, and the image's agent (its entrypoint and command,
/// the image's environment only) with `[backend] kind = "daos"` on the tier's pool; the
/// native `dpuio` puts and gets 8 MiB byte-identical over UCX TCP, DAOS's own `daos
/// filesystem copy` reads the same bytes out of the container, and SIGTERM stops the
/// agent with exit 0 after `daos_fini`.
fn daos_image_serves_from_the_pool(arch: &str, emulator: Option<&str>) {
    let Some((pool, port)) = daos_system_under_test() else { return };
    let Some(path) = daos_archive(arch) else { return };
    let Some(pod) = static_pod() else { return };
    if !can_run_roots(emulator) {
        return;
    }
    let scratch = Scratch(Some(tempfile::tempdir().unwrap()));
    let tmp = scratch.0.as_ref().unwrap();
    let (rootfs, config, prefix) = unpack_runnable(&path, tmp.path(), emulator);
    let env = strings(&config["config"]["Env"]);

    let daos_agent = pod_container(&pod, "daos-agent");
    let mut argv = prefix.clone();
    argv.extend(strings(&daos_agent["command"]).into_iter().map(String::from));
    argv.extend(strings(&daos_agent["args"]).into_iter().map(String::from));
    // The image has no /etc/hosts (kubelet brings the DPU's): an address, not localhost.
    std::fs::write(
        rootfs.join("etc/dpuio/daos_agent.yml"),
        format!(
            "name: daos_server\naccess_points: ['127.0.0.1:{port}']\nport: {port}\ntransport_config:\n  allow_insecure: true\n"
        ),
    )
    .unwrap();
    let agent_log = tmp.path().join("daos_agent.log");
    let mut child = in_root(&rootfs, &argv, env.clone())
        .stdout(std::fs::File::create(&agent_log).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("start daos_agent in the image's root");
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let daos_agent = Kill(&mut child);
    let started = std::time::Instant::now();
    while !rootfs.join("run/daos_agent/daos_agent.sock").exists() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "daos_agent made no socket within 60 s:\n{}",
            std::fs::read_to_string(&agent_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // The agent: the image's entrypoint and command, its config in /etc/dpuio as the pod's.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let container = format!("image-{arch}-{}-{}", std::process::id(), nanos % 1_000_000_000_000);
    std::fs::write(
        rootfs.join("etc/dpuio/agent.toml"),
        format!(
            "[agent]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"/var/lib/dpuio\"\n\n[tls]\nmode = \"off\"\n\n\
             [admin]\nsocket = \"/run/dpuio/admin.sock\"\n\n[backend]\nkind = \"daos\"\npool = \"{pool}\"\n\
             create_containers = true\n\n[[tenants]]\nname = \"default\"\ncontainer = \"{container}\"\n"
        ),
    )
    .unwrap();
    let c = &config["config"];
    let mut argv: Vec<String> = prefix.clone();
    argv.extend(strings(&c["Entrypoint"]).into_iter().map(String::from));
    argv.extend(strings(&c["Cmd"]).into_iter().map(String::from));
    let log_path = tmp.path().join("agent.log");
    let mut cmd = in_root(&rootfs, &argv, env.clone());
    cmd.env("RUST_LOG", "info").stderr(std::fs::File::create(&log_path).unwrap());
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let process = dpuio_harness::start(cmd, Duration::from_secs(300))
        .unwrap_or_else(|e| panic!("the agent in the DAOS image over pool {pool}: {e}:\n{}", log()));
    // Destroys the container when dropped (with the host's daos tool).
    let mut agent =
        AgentProcess::adopt(process, &rootfs.join("var/lib/dpuio"), Some((pool.clone(), container.clone())));

    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let src = tmp.path().join("src.bin");
    let back = tmp.path().join("back.bin");
    std::fs::write(&src, &data).unwrap();
    let t0 = std::time::Instant::now();
    ok_stdout(&agent.cli(&["--transport", "ucx-tcp", "put", src.to_str().unwrap(), "/image.bin"]));
    let put = t0.elapsed();
    ok_stdout(&agent.cli(&["--transport", "ucx-tcp", "get", "/image.bin", back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == data, "get returned other bytes than put stored");
    // DAOS's own tool, outside dpuio, reads the file out of the container.
    let seen = tmp.path().join("seen-by-daos.bin");
    let copy = Command::new("daos")
        .args(["filesystem", "copy", "--src"])
        .arg(format!("daos://{pool}/{container}/image.bin"))
        .arg("--dst")
        .arg(&seen)
        .output()
        .expect("run daos (DAOS's bin directory on PATH: source RUNDIR/env)");
    assert!(copy.status.success(), "daos filesystem copy: {}", String::from_utf8_lossy(&copy.stderr));
    assert!(std::fs::read(&seen).unwrap() == data, "DAOS holds other bytes than put stored");

    // The agent's ofi transports use the libfabric DAOS's mercury mapped, not the image's other one.
    assert!(
        log()
            .lines()
            // As mercury's plugin found it: .../mercury/lib64/mercury/../../../ofi/lib64/...
            .any(|l| l.contains("libfabric loaded")
                && l.contains("\"/usr/lib/daos/prereq/release/")
                && l.contains("/ofi/lib64/libfabric.so.1\"")),
        "the agent's libfabric is not DAOS's:\n{}",
        log()
    );
    agent.signal("TERM");
    assert_eq!(agent.wait(Duration::from_secs(120)), Some(0), "{}", log());
    assert!(log().contains("daos_fini"), "the agent did not finalise DAOS:\n{}", log());
    drop(agent);
    drop(daos_agent);
    eprintln!(
        "{arch}: the DAOS image's agent{} and daos_agent served 8 MiB from pool {pool} (put {:.2} s), read back \
         byte-identical by dpuio get and by daos filesystem copy",
        emulator.map(|e| format!(" under {e}")).unwrap_or_default(),
        put.as_secs_f64()
    );
}

#[test]
fn amd64_daos_image_serves_from_a_daos_pool() {
    daos_image_serves_from_the_pool("amd64", None);
}

#[test]
fn arm64_daos_image_serves_from_a_daos_pool_under_qemu() {
    daos_image_serves_from_the_pool("arm64", Some("qemu-aarch64-static"));
}

#[test]
fn amd64_daos_agent_runs_beside_the_agent_in_the_daos_image_root() {
    daos_agent_runs_beside_the_agent_in_its_root("amd64", None);
}

#[test]
fn arm64_daos_agent_runs_beside_the_agent_in_the_daos_image_root_under_qemu() {
    daos_agent_runs_beside_the_agent_in_its_root("arm64", Some("qemu-aarch64-static"));
}

#[test]
fn static_pod_parses_and_names_the_image() {
    let Some(pod) = static_pod() else { return };
    assert_eq!(pod["apiVersion"], "v1");
    assert_eq!(pod["kind"], "Pod");
    let spec = &pod["spec"];
    assert_eq!(spec["hostNetwork"], true);
    let containers = spec["containers"].as_array().unwrap();
    let names: Vec<&str> = containers.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["daos-agent", "dpu-agent"], "daos_agent first (kubelet starts them in this order)");
    let c = pod_container(&pod, "dpu-agent");
    let d = pod_container(&pod, "daos-agent");
    for c in [c, d] {
        assert_eq!(
            c["image"],
            format!("{IMAGE}:{VERSION}-daos").as_str(),
            "both containers must run the DAOS image ./x package builds (one DAOS version)"
        );
        assert_eq!(c["imagePullPolicy"], "Never", "the image is imported, never pulled");
    }
    assert_eq!(pod["metadata"]["labels"]["app.kubernetes.io/version"], VERSION);

    // The image's command with a health listener whose port the probes use.
    let args = strings(&c["args"]);
    assert_eq!(args[..3], ["serve", "--config", "/etc/dpuio/agent.toml"]);
    let health = args.iter().position(|a| *a == "--health-listen").map(|i| args[i + 1]).expect("--health-listen");
    let health_port: u64 = health.rsplit_once(':').unwrap().1.parse().unwrap();
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["grpc"]["port"], health_port, "{probe} must ask grpc.health.v1 on {health}");
    }
    let ports: Vec<u64> = c["ports"].as_array().unwrap().iter().map(|p| p["containerPort"].as_u64().unwrap()).collect();
    assert!(ports.contains(&7300) && ports.contains(&health_port), "{ports:?}");

    // Huge pages: requested, and (as kubelet requires) the request equals the limit.
    let r = &c["resources"];
    assert!(r["requests"]["hugepages-2Mi"].is_string(), "{r}");
    assert_eq!(r["requests"]["hugepages-2Mi"], r["limits"]["hugepages-2Mi"]);
    assert!(c["securityContext"]["capabilities"]["add"].as_array().unwrap().contains(&Value::from("IPC_LOCK")));

    // daos_agent from the image, its config in the directory the agent's is in.
    assert_eq!(strings(&d["command"]), ["/usr/bin/daos_agent"]);
    let dargs = strings(&d["args"]);
    assert_eq!(dargs.last(), Some(&"start"), "{dargs:?}");
    let yml = dargs.iter().position(|a| *a == "--config-path").map(|i| dargs[i + 1]).expect("--config-path");
    assert_eq!(yml, "/etc/dpuio/daos_agent.yml");
    // daos_agent reads /proc/PID of the agent at the other end of its socket (to evict a
    // crashed agent's pool handles): in a PID namespace of its own it sees pid 0.
    assert_eq!(spec["shareProcessNamespace"], true, "daos_agent must see the agent's process");

    // Every mount has its volume; config, certificates, data, admin socket and the RDMA
    // devices come from the DPU.
    let volumes = spec["volumes"].as_array().unwrap();
    let volume = |name: &str| volumes.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no volume {name}"));
    let mounts_of = |c: &Value| -> Vec<(String, String, bool)> {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let name = m["name"].as_str().unwrap().to_owned();
                volume(&name);
                (name, m["mountPath"].as_str().unwrap().to_owned(), m["readOnly"] == true)
            })
            .collect()
    };
    let (mounts, dmounts) = (mounts_of(c), mounts_of(d));
    let mounted = |mounts: &[(String, String, bool)], host: &str, at: &str| -> (String, bool) {
        let v = volumes.iter().find(|v| v["hostPath"]["path"] == host).unwrap_or_else(|| panic!("no hostPath {host}"));
        let name = v["name"].as_str().unwrap();
        let m = mounts.iter().find(|m| m.0 == name && m.1 == at);
        let m = m.unwrap_or_else(|| panic!("{host} is not mounted at {at}: {mounts:?}"));
        (m.0.clone(), m.2)
    };
    for (host, at) in [
        ("/etc/dpuio", "/etc/dpuio"),
        ("/var/lib/dpuio", "/var/lib/dpuio"),
        ("/run/dpuio", "/run/dpuio"),
        ("/dev/infiniband", "/dev/infiniband"),
    ] {
        mounted(&mounts, host, at);
    }
    // One config directory, read-only in both; daos_agent has the fabric devices and its log.
    assert!(mounted(&mounts, "/etc/dpuio", "/etc/dpuio").1, "/etc/dpuio must be read-only in dpu-agent");
    assert!(mounted(&dmounts, "/etc/dpuio", "/etc/dpuio").1, "/etc/dpuio must be read-only in daos-agent");
    mounted(&dmounts, "/dev/infiniband", "/dev/infiniband");
    mounted(&dmounts, "/var/log/daos_agent", "/var/log/daos_agent");
    assert_eq!(d["securityContext"]["privileged"], true, "daos_agent scans the RDMA devices");
    // The dRPC socket directory: one emptyDir, at DAOS's default path in both (where
    // daos_agent makes it and the agent looks without agent_socket_dir).
    let socket_dir = |mounts: &[(String, String, bool)]| -> String {
        let m = mounts
            .iter()
            .find(|m| m.1 == "/var/run/daos_agent")
            .unwrap_or_else(|| panic!("no /var/run/daos_agent: {mounts:?}"));
        assert!(volume(&m.0)["emptyDir"].is_object(), "the socket directory must be the pod's own emptyDir");
        assert!(!m.2, "daos_agent makes its socket there: not read-only");
        m.0.clone()
    };
    assert_eq!(socket_dir(&mounts), socket_dir(&dmounts), "both must mount the same socket directory");
    assert_eq!(volume("hugepages")["emptyDir"]["medium"], "HugePages");
}

/// A containerd of the test's own (its state, root and socket in a scratch directory),
/// stopped when dropped.
struct Containerd {
    child: std::process::Child,
    socket: PathBuf,
}

impl Containerd {
    fn start(dir: &Path) -> Containerd {
        let socket = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
                 disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = \"{socket}\"\n",
                root = dir.join("root").display(),
                state = dir.join("state").display(),
                socket = socket.display()
            ),
        )
        .unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("containerd.log")).unwrap())
            .spawn()
            .expect("start containerd");
        let c = Containerd { child, socket };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !c.ctr(&["version"]).status.success() {
            assert!(std::time::Instant::now() < deadline, "containerd did not answer within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        c
    }

    fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the DPU does with the archive (docs/image.md): containerd imports it under the name
/// the static pod uses, and runc runs the image as it is (entrypoint, command, packaged
/// config, in a network namespace of its own), whose dpuctl then answers inside it.
#[test]
fn amd64_image_imports_into_containerd_and_runs_under_runc() {
    let Some(path) = archive("amd64") else { return };
    if ok_stdout(&run("id", &["-u"])).trim() != "0" {
        eprintln!("SKIPPED: containerd needs root");
        return;
    }
    if !(have("containerd") && have("ctr") && have("runc")) {
        eprintln!("SKIPPED: apt-get install containerd (with runc) for this test");
        return;
    }
    let scratch = Scratch(Some(tempfile::tempdir().unwrap()));
    let containerd = Containerd::start(scratch.0.as_ref().unwrap().path());
    ok_stdout(&containerd.ctr(&["images", "import", "--platform", "linux/amd64", path.to_str().unwrap()]));
    let name = format!("{IMAGE}:{VERSION}");
    let images = ok_stdout(&containerd.ctr(&["images", "ls", "-q"]));
    assert!(images.lines().any(|l| l == name), "imported as {images:?}, not {name}");

    let id = format!("dpuio-image-test-{}", std::process::id());
    ok_stdout(&containerd.ctr(&["run", "-d", &name, &id]));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        let out = containerd.ctr(&[
            "tasks",
            "exec",
            "--exec-id",
            "status",
            &id,
            "/usr/bin/dpuctl",
            "--socket",
            "/run/dpuio/admin.sock",
            "status",
        ]);
        if out.status.success() {
            break String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "dpuctl status in the container: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.contains("backend   local") && status.contains("tenants   2"), "{status}");

    // SIGTERM, as the image's StopSignal says: the task stops, exit status 0.
    ok_stdout(&containerd.ctr(&["tasks", "kill", "--signal", "SIGTERM", &id]));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let tasks = ok_stdout(&containerd.ctr(&["tasks", "ls"]));
        if tasks.lines().any(|l| l.starts_with(&id) && l.contains("STOPPED")) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the agent did not stop on SIGTERM: {tasks}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // ctr warns "task ... exit with non-zero exit code N" when it was not 0.
    let deleted = containerd.ctr(&["tasks", "delete", &id]);
    let said = String::from_utf8_lossy(&deleted.stderr);
    assert!(deleted.status.success() && !said.contains("non-zero exit code"), "{said}");
    ok_stdout(&containerd.ctr(&["containers", "rm", &id]));
    eprintln!(
        "amd64: containerd imported {name}; under runc the image's agent served dpuctl status and stopped on SIGTERM"
    );
}

/// The health port the static pod's probes use: SERVING while the agent serves, NOT_SERVING
/// from SIGTERM on while it drains (kubelet's readiness), and gone once it has stopped.
#[test]
fn health_port_says_not_serving_while_the_agent_drains() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let data = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut agent = AgentProcess::start(data.path(), &["--health-listen", &format!("127.0.0.1:{port}")]);
    // Each probe on its own connection and runtime, as kubelet's are.
    let probe = || -> Option<i32> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}")).unwrap();
            Some(health(endpoint.connect().await.ok()?).await)
        })
    };
    assert_eq!(probe(), Some(ServingStatus::Serving as i32));

    // A client that keeps its connection open and idle (its runtime is not running, so it
    // cannot answer the GOAWAY) holds the graceful shutdown: the agent is draining meanwhile.
    let idle = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let channel = idle.block_on(agent.channel());
    assert_eq!(idle.block_on(health(channel.clone())), ServingStatus::Serving as i32);
    agent.signal("TERM");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while probe() != Some(ServingStatus::NotServing as i32) {
        assert!(std::time::Instant::now() < deadline, "the health port never said NOT_SERVING after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(channel);
    drop(idle);
    assert_eq!(agent.wait(Duration::from_secs(30)), Some(0));
    assert_eq!(probe(), None, "the health port still answers after the agent stopped");
}
