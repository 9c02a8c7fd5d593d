//! The agent and its host on two "machines": network namespaces `dpu` and `host` joined
//! by a veth pair ([`dpuio_tests::netns`]), the real `dpu-agent serve` in one, the real
//! `dpuio` CLI and `dpuio-test-host` in the other, with only the veth between them. The
//! control plane is mutual TLS to the agent's veth address (the development PKI puts
//! that address in the server certificate); the data plane is UCX tcp and libfabric
//! tcp on the veth, chosen on both sides by name (`[data_plane] interface`,
//! `DPUIO_INTERFACE`).
//!
//! Namespaces need root: elsewhere each test prints "skipped: REASON" and passes.
//! Shared-memory transports are not tested here: network namespaces do not separate
//! memory, so they would pass without crossing the "network".

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use dpuio_tests::netns::{Side, TwoHosts};
use dpuio_tests::{AgentProcess, binary, command_in, ok_stdout};

/// The namespaces, or why this machine cannot make them (printed as the skip).
fn two_hosts_or_skip() -> Option<TwoHosts> {
    match TwoHosts::create() {
        Ok(net) => Some(net),
        Err(why) => {
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// A `dpu-agent serve` in the dpu namespace, listening on its veth address only, its
/// data plane on the veth.
fn start_agent(net: &TwoHosts, dir: &Path) -> AgentProcess {
    let config = dir.join("agent.toml");
    std::fs::write(&config, format!("[data_plane]\ninterface = \"{}\"\n", net.dpu.interface)).unwrap();
    let listen = format!("{}:0", net.dpu.ip);
    let agent = AgentProcess::start_program(
        net.dpu.command(binary("dpu-agent")),
        &dir.join("data"),
        &["--listen", &listen, "--config", config.to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert!(agent.addr.starts_with(&format!("{}:", net.dpu.ip)), "agent listens on {}", agent.addr);
    assert!(!agent.plaintext, "the agent beyond loopback serves mutual TLS");
    agent
}

fn on_host(host: &Side, agent: &AgentProcess, name: &str) -> Command {
    host.client(agent, binary(name))
}

fn output(mut c: Command) -> Output {
    c.output().expect("run a command in the host namespace")
}

fn put_get_round_trip(transport: &str) {
    const BYTES: usize = 64 << 20;
    let Some(net) = two_hosts_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&net, dir.path());
    let local = dir.path().join("in.bin");
    let mut data = vec![0u8; BYTES];
    use rand::{Rng, SeedableRng};
    rand::rngs::StdRng::seed_from_u64(7).fill(&mut data[..]);
    std::fs::write(&local, &data).unwrap();
    let back = dir.path().join("back.bin");
    let cli = |args: &[&str]| {
        let mut c = on_host(&net.host, &agent, "dpuio");
        c.args(["--transport", transport]).args(args);
        ok_stdout(&output(c))
    };
    let before = net.host.interface_bytes();
    cli(&["put", local.to_str().unwrap(), "/copy.bin"]);
    cli(&["get", "/copy.bin", back.to_str().unwrap()]);
    let moved = net.host.interface_bytes() - before;
    assert!(std::fs::read(&back).unwrap() == data, "{transport}: get differs from put");
    // The payload went both ways over the veth: nothing else joins the namespaces.
    assert!(
        moved >= 2 * BYTES as u64,
        "{transport}: only {moved} bytes crossed the veth for a put and a get of {BYTES}"
    );
    assert!(cli(&["stat", "/copy.bin"]).contains(&BYTES.to_string()));
    eprintln!("{transport}: put and get of {BYTES} bytes, {moved} bytes on the veth");
}

#[test]
fn put_then_get_64_mib_across_namespaces_ucx_tcp() {
    put_get_round_trip("ucx-tcp");
}

#[test]
fn put_then_get_64_mib_across_namespaces_ofi_tcp() {
    put_get_round_trip("ofi-tcp");
}

/// `dpuio-test-host hostile` in the host namespace: every check passes and is printed.
fn hostile_entries(transport: &str) {
    let Some(net) = two_hosts_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&net, dir.path());
    agent.seed_file("data", &dpuio_tests::hostile::pattern_bytes());
    let mut c = on_host(&net.host, &agent, "dpuio-test-host");
    c.args(["hostile", &agent.url(), transport, "/data"]);
    let out = output(c);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = format!("{transport}:\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{report}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() > 10 && lines[..lines.len() - 1].iter().all(|l| l.starts_with("ok ")), "{report}");
    assert_eq!(lines.last(), Some(&format!("checks={} failed=0", lines.len() - 1).as_str()), "{report}");
    for case in ["region of another session", "guessed handle", "100 entries of random bytes", "session b still reads"]
    {
        assert!(stdout.contains(&format!("ok {case}: ")), "{case} not checked: {report}");
    }
}

#[test]
fn hostile_entries_across_namespaces_ucx_tcp() {
    hostile_entries("ucx-tcp");
}

#[test]
fn hostile_entries_across_namespaces_ofi_tcp() {
    hostile_entries("ofi-tcp");
}

#[test]
fn mtls_control_plane_on_the_veth_address() {
    let Some(net) = two_hosts_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&net, dir.path());
    let cli = |args: &[&str]| {
        let mut c = on_host(&net.host, &agent, "dpuio");
        c.args(args);
        output(c)
    };
    // The server certificate names the veth address (the client checks the address's
    // host against it), and the client certificate names the tenant.
    ok_stdout(&cli(&["mkdir", "-p", "/across"]));
    ok_stdout(&cli(&["touch", "/across/file"]));
    assert!(ok_stdout(&cli(&["ls", "/across"])).contains("file"));

    let refused = |out: Output, what: &str| -> String {
        assert!(!out.status.success(), "{what} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // The certificate is checked: another name than the ones it carries fails, and
    // the refusal lists them, the veth address among them.
    let stderr = refused(cli(&["--tls-server-name", "not-the-agent.example", "ls", "/"]), "a wrong server name");
    assert!(stderr.contains("certificate not valid for name \"not-the-agent.example\""), "{stderr}");
    assert!(stderr.contains(&format!("IpAddress({})", net.dpu.ip)), "the veth address is not a SAN: {stderr}");
    // No client certificate, no service.
    let empty = dir.path().join("no-bundle");
    let stderr = refused(cli(&["--cert", empty.join("client.pem").to_str().unwrap(), "ls", "/"]), "no client bundle");
    assert!(stderr.contains("cannot read the client certificate"), "{stderr}");
    // No plaintext beyond loopback.
    let stderr = refused(cli(&["--agent", &format!("http://{}", agent.addr), "ls", "/"]), "plaintext");
    assert!(stderr.contains("mutual TLS"), "{stderr}");
    // The agent listens on the dpu side's veth only: from the host side's loopback
    // there is nothing at its port.
    let port = agent.addr.rsplit_once(':').unwrap().1;
    let stderr = refused(cli(&["--agent", &format!("127.0.0.1:{port}"), "ls", "/"]), "loopback in the host namespace");
    assert!(stderr.contains("cannot reach the agent"), "{stderr}");
}

/// A bad interface name stops the agent and the CLI with a message that names it and
/// the interfaces there are (this needs no namespace: the names are checked first).
#[test]
fn an_unknown_interface_is_refused_naming_the_ones_there_are() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, "[data_plane]\ninterface = \"dpuio-nosuch0\"\n").unwrap();
    let out = command_in("dpu-agent", &dir.path().join("home"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve started on a missing interface");
    assert!(
        stderr.contains("[data_plane] interface: network interface \"dpuio-nosuch0\" does not exist here")
            && stderr.contains("lo"),
        "{stderr}"
    );
    let checked = Command::new(binary("dpu-agent")).arg("check-config").arg(&config).output().unwrap();
    let stdout = ok_stdout(&checked);
    assert!(stdout.contains("note: [data_plane] interface on this machine: network interface"), "{stdout}");

    let agent = AgentProcess::start(&dir.path().join("agent"), &[]);
    let local = dir.path().join("in.bin");
    std::fs::write(&local, b"x").unwrap();
    for (flag, says) in [
        ("dpuio-nosuch0", "network interface \"dpuio-nosuch0\" does not exist here"),
        ("eth0:1", "\"eth0:1\" is not an interface name"),
    ] {
        let out = agent.cli(&["--transport", "ucx-tcp", "--interface", flag, "put", local.to_str().unwrap(), "/x"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: put succeeded");
        assert!(stderr.contains(says) && stderr.contains("DPUIO_INTERFACE"), "{flag}: {stderr}");
    }
}
