//! `dpuctl deploy` against a real `sshd` (Debian's openssh-server) in a network
//! namespace this test makes ("the DPU", joined to this namespace by a veth pair), with
//! `--root DIR` for the install since no systemd runs here.
//!
//! The package is the real one from `./x package` (`target/packages/dpuio-agent_*_amd64.deb`,
//! or `$DPUIO_AGENT_DEB`). Without a package, root, `ip netns` or sshd, the test says it is
//! skipped and why. Everything it makes (namespace, veth, sshd, the deployed agent) is
//! removed when it ends, also when it fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use dpuio_tests::{binary, command_in, ok_stdout};

fn skip(reason: &str) {
    eprintln!("SKIPPED deploy_over_ssh: {reason}");
}

/// The agent package to deploy, if one was built.
fn agent_package() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DPUIO_AGENT_DEB") {
        return Some(PathBuf::from(p));
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/packages");
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("dpuio-agent_") && name.ends_with("_amd64.deb")
        })
        .collect();
    found.sort();
    found.pop()
}

fn sh(cmd: &str) -> Output {
    Command::new("sh").args(["-c", cmd]).output().expect("run sh")
}

/// A namespace "dpu" with sshd on a veth address; torn down on drop.
struct Dpu {
    ns: String,
    veth: String,
    host_ip: String,
    dpu_ip: String,
    sshd: Option<Child>,
    dir: PathBuf,
    key: PathBuf,
}

impl Dpu {
    fn start(dir: &Path) -> Result<Dpu, String> {
        let id = std::process::id();
        let net = 1 + id % 250;
        let mut dpu = Dpu {
            ns: format!("dpuio-dpu-{id}"),
            veth: format!("dpuh{}", id % 100_000),
            host_ip: format!("10.201.{net}.1"),
            dpu_ip: format!("10.201.{net}.2"),
            sshd: None,
            dir: dir.to_owned(),
            key: dir.join("client_key"),
        };
        let peer = format!("dpud{}", id % 100_000);
        let setup = format!(
            "ip netns add {ns} && ip link add {veth} type veth peer name {peer} && ip link set {peer} netns {ns} && \
             ip addr add {host}/30 dev {veth} && ip link set {veth} up && \
             ip netns exec {ns} ip addr add {dpu}/30 dev {peer} && ip netns exec {ns} ip link set {peer} up && \
             ip netns exec {ns} ip link set lo up",
            ns = dpu.ns,
            veth = dpu.veth,
            host = dpu.host_ip,
            dpu = dpu.dpu_ip,
        );
        let out = sh(&setup);
        if !out.status.success() {
            return Err(format!(
                "network namespaces are not permitted here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        // Keys: the DPU's host key and the operator's key, authorised for root.
        for (file, what) in [(dir.join("host_key"), "host"), (dpu.key.clone(), "client")] {
            let out = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", what, "-f"])
                .arg(&file)
                .output()
                .map_err(|e| format!("ssh-keygen: {e}"))?;
            assert!(out.status.success(), "ssh-keygen: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys")).unwrap();
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port 22\nListenAddress {ip}\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
                 PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 UsePAM no\nStrictModes no\nPidFile {d}/sshd.pid\nSubsystem sftp /usr/lib/openssh/sftp-server\n",
                ip = dpu.dpu_ip,
                d = dir.display()
            ),
        )
        .unwrap();
        std::fs::create_dir_all("/run/sshd").map_err(|e| format!("/run/sshd: {e}"))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &dpu.ns, "/usr/sbin/sshd", "-D", "-e", "-f"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("sshd.log")).unwrap())
            .spawn()
            .map_err(|e| format!("start sshd: {e}"))?;
        dpu.sshd = Some(child);
        // Wait until sshd accepts a login.
        for _ in 0..100 {
            if dpu.ssh("true").status.success() {
                return Ok(dpu);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "sshd did not accept a login: {}",
            std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
        ))
    }

    fn ssh_options(&self) -> Vec<String> {
        let mut a: Vec<String> = vec!["--identity".into(), self.key.to_string_lossy().into_owned()];
        for o in ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"] {
            a.extend(["--ssh-option".into(), o.into()]);
        }
        a
    }

    fn ssh(&self, script: &str) -> Output {
        Command::new("ssh")
            .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"])
            .args(["-o", "LogLevel=ERROR", "-i"])
            .arg(&self.key)
            .arg(format!("root@{}", self.dpu_ip))
            .arg(script)
            .output()
            .expect("run ssh")
    }

    /// `dpuctl deploy` to this DPU with `extra` arguments.
    fn deploy(&self, home: &Path, extra: &[&str]) -> Output {
        command_in("dpuctl", home)
            .arg("deploy")
            .args(["--target", &format!("root@{}", self.dpu_ip)])
            .args(self.ssh_options())
            .args(extra)
            .output()
            .expect("run dpuctl deploy")
    }
}

impl Drop for Dpu {
    fn drop(&mut self) {
        // The deployed agent (if any), sshd, the namespace and the veth.
        let pid = self.dir.join("root/run/dpu-agent.pid");
        if let Ok(pid) = std::fs::read_to_string(pid) {
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
        }
        if let Some(mut c) = self.sshd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = sh(&format!(
            "ip netns pids {0} | xargs -r kill -KILL; ip netns del {0}; ip link del {1}",
            self.ns, self.veth
        ));
    }
}

fn agent_config(dir: &Path, root: &Path, listen: &str, extra: &str) -> PathBuf {
    let file = dir.join(format!("agent-{}.toml", listen.replace([':', '.'], "_")));
    std::fs::write(
        &file,
        format!(
            "[agent]\nlisten = \"{listen}\"\ndata_dir = \"{r}/var/lib/dpuio\"\n\n[tls]\nclient_bundle_dir = \"{r}/etc/dpuio/client\"\n{extra}",
            r = root.display()
        ),
    )
    .unwrap();
    file
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The pid the deployed agent runs as, and whether it answers over its admin socket.
fn deployed_agent(root: &Path) -> (String, bool) {
    let pid = std::fs::read_to_string(root.join("run/dpu-agent.pid")).unwrap_or_default().trim().to_owned();
    let answers = Command::new(binary("dpuctl"))
        .arg("--socket")
        .arg(root.join("var/lib/dpuio/admin.sock"))
        .arg("status")
        .output()
        .is_ok_and(|o| o.status.success());
    (pid, answers)
}

#[test]
fn deploy_over_ssh() {
    let Some(package) = agent_package() else {
        return skip("no dpuio-agent amd64 package: `./x package` builds target/packages/ (or set DPUIO_AGENT_DEB)");
    };
    if !Path::new("/usr/sbin/sshd").exists() {
        return skip("/usr/sbin/sshd is missing (apt-get install openssh-server; ./x test does)");
    }
    if !rustix_is_root() {
        return skip("network namespaces need root");
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let home = dir.join("home");
    let dpu = match Dpu::start(dir) {
        Ok(d) => d,
        Err(reason) => return skip(&reason),
    };
    let root = dir.join("root");
    let listen = format!("{}:7300", dpu.dpu_ip);
    let config = agent_config(dir, &root, &listen, "");
    let root_arg = root.to_str().unwrap();
    let common = ["--package", package.to_str().unwrap(), "--root", root_arg];

    // --dry-run prints every step and changes nothing.
    let out = dpu.deploy(&home, &[&common[..], &["--config", config.to_str().unwrap(), "--dry-run"]].concat());
    let said = ok_stdout(&out);
    for step in ["[1] check the package", "[2] reach the target", "[4] preflight", "[6] install", "[8] wait until"] {
        assert!(said.contains(step), "{step:?} missing from the dry run:\n{said}");
    }
    assert!(said.contains("$ ssh ") && said.contains("dpkg-deb -x") && said.contains("nothing was changed"), "{said}");
    assert!(!root.exists(), "a dry run installed something");

    // A real deploy: the agent runs in the DPU's namespace and answers on its veth address.
    let out = dpu.deploy(&home, &[&common[..], &["--config", config.to_str().unwrap()]].concat());
    let said = ok_stdout(&out);
    assert!(said.contains(&format!("hosts attach with: DPUIO_AGENT={listen}")), "{said}");
    let (first_pid, answers) = deployed_agent(&root);
    assert!(answers && !first_pid.is_empty(), "the deployed agent does not answer:\n{said}");
    // A host attaches across the veth with the bundle the agent wrote (mutual TLS).
    let bundle = root.join("etc/dpuio/client");
    let out = command_in("dpuio", &home)
        .args(["--agent", &listen, "--cert"])
        .arg(bundle.join("client.pem"))
        .arg("--key")
        .arg(bundle.join("client.key"))
        .arg("--ca")
        .arg(bundle.join("ca.pem"))
        .args(["mkdir", "-p", "/deployed/ok"])
        .output()
        .unwrap();
    ok_stdout(&out);
    assert!(root.join("var/lib/dpuio/containers/default/deployed/ok").is_dir());

    // Bad input: each stops at its step, says what to do, and the running agent stays.
    let unreachable = command_in("dpuctl", &home)
        .args(["deploy", "--target", &format!("root@{}:2", dpu.dpu_ip)])
        .args(dpu.ssh_options())
        .args(common)
        .args(["--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let err = stderr(&unreachable);
    assert_eq!(unreachable.status.code(), Some(1), "{err}");
    assert!(err.contains("step \"reach the target\" failed") && err.contains("what to do: check that"), "{err}");

    // A package for another architecture (a test double: the real package relabelled arm64).
    let unpacked = dir.join("relabel");
    assert!(Command::new("dpkg-deb").arg("-R").arg(&package).arg(&unpacked).status().unwrap().success());
    let control = unpacked.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control).unwrap();
    let relabelled: String = text
        .lines()
        .map(|l| if l.starts_with("Architecture:") { "Architecture: arm64" } else { l })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&control, relabelled + "\n").unwrap();
    let arm = dir.join("dpuio-agent_test-relabelled_arm64.deb");
    assert!(
        Command::new("dpkg-deb").args(["-b", "-Zgzip"]).arg(&unpacked).arg(&arm).output().unwrap().status.success()
    );
    let out = dpu
        .deploy(&home, &["--package", arm.to_str().unwrap(), "--root", root_arg, "--config", config.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(
        err.contains("step \"check the architecture\" failed") && err.contains("but the package is arm64"),
        "{err}"
    );

    // A config with a mistake: refused here, before anything is copied.
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, std::fs::read_to_string(&config).unwrap() + "\n[agent.nonsense]\nx = 1\n").unwrap();
    let out = dpu.deploy(&home, &[&common[..], &["--config", bad.to_str().unwrap()]].concat());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("step \"check the package and the config here\" failed") && err.contains("check-config"),
        "{err}"
    );

    // A package whose agent cannot run on the target (a test double: the real package with
    // its dpu-agent cut short): stopped at the preflight, nothing installed.
    let agent_binary = unpacked.join("usr/bin/dpu-agent");
    let head = std::fs::read(&agent_binary).unwrap()[..4096].to_vec();
    std::fs::write(&agent_binary, head).unwrap();
    std::fs::write(&control, text.clone()).unwrap();
    let broken = dir.join("dpuio-agent_test-broken_amd64.deb");
    assert!(
        Command::new("dpkg-deb").args(["-b", "-Zgzip"]).arg(&unpacked).arg(&broken).output().unwrap().status.success()
    );
    let out = dpu.deploy(
        &home,
        &["--package", broken.to_str().unwrap(), "--root", root_arg, "--config", config.to_str().unwrap()],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("step \"preflight the new agent (nothing installed yet)\" failed"), "{err}");
    assert!(err.contains("the running agent was not touched"), "{err}");
    assert_eq!(deployed_agent(&root), (first_pid.clone(), true), "a broken package touched the running agent");
    let installed = std::fs::read(root.join("usr/bin/dpu-agent")).unwrap();
    assert!(installed.len() > 4096, "the broken binary was installed");

    // A config that passes the checks but whose agent never answers (it cannot bind an
    // address the DPU does not have): the previous agent and config are put back.
    let never = agent_config(dir, &root, "10.201.255.254:7300", "");
    let out =
        dpu.deploy(&home, &[&common[..], &["--config", never.to_str().unwrap(), "--health-timeout-s", "5"]].concat());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("step \"wait until the new agent answers\" failed"), "{err}");
    assert!(err.contains("the previous agent and config are back and answer again"), "{err}");
    let (pid, answers) = deployed_agent(&root);
    assert!(answers, "the previous agent was not put back: {err}");
    assert_ne!(pid, first_pid, "the previous agent should have been restarted");
    let installed = std::fs::read_to_string(root.join("etc/dpuio/agent.toml")).unwrap();
    assert!(installed.contains(&listen), "the previous config was not put back:\n{installed}");
    drop(dpu);
}

fn rustix_is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
