//! The `dpuio` CLI, `check-config`, graceful stop and durability across SIGKILL.

use std::time::Duration;

use dpuio_shim::{Client, ConnectOptions};
use dpuio_tests::{AgentProcess, command_in, ok_stdout};

#[test]
fn cli_mkdir_then_ls() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    ok_stdout(&agent.cli(&["mkdir", "/a"]));
    ok_stdout(&agent.cli(&["mkdir", "-p", "/b/c/d"]));
    ok_stdout(&agent.cli(&["touch", "/b/file"]));
    assert_eq!(ok_stdout(&agent.cli(&["ls", "/"])), "a\nb\n");
    assert_eq!(ok_stdout(&agent.cli(&["ls"])), "a\nb\n");
    let long = ok_stdout(&agent.cli(&["ls", "-l", "/b"]));
    assert!(long.starts_with('d') && long.contains(" c\n") && long.contains(" file\n"), "{long}");
    ok_stdout(&agent.cli(&["mv", "/a", "/a2"]));
    ok_stdout(&agent.cli(&["rm", "-r", "/b"]));
    assert_eq!(ok_stdout(&agent.cli(&["ls"])), "a2\n");
    assert!(ok_stdout(&agent.cli(&["stat", "/a2"])).contains(" /a2"));

    // Errors: exit 1 with the agent's reason, naming the path.
    let out = agent.cli(&["rm", "/nope"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NOT_FOUND") && err.contains("/nope"), "{err}");
    let out = agent.cli(&["mkdir", "/a2/../../etc"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("INVALID_ARGUMENT"));
}

/// `dpuio ls -l | head`: a reader that goes away is no error worth a word (and no
/// panic): the commands printing to stdout stop quietly with 141, as coreutils do.
#[test]
fn cli_output_into_a_closed_pipe_is_quiet() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    for i in 0..50 {
        agent.seed_file(&format!("/f{i:03}"), b"x");
    }
    agent.seed_file("/big", &vec![7u8; 1 << 20]);
    for args in [&["ls", "-l", "/"][..], &["ls", "/"], &["stat", "/f000", "/f001"], &["cat", "/big"], &["delegate"]] {
        let mut child =
            agent.command("dpuio").args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take()); // closed before the first line is printed
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?} said: {err}");
    }
}

/// What the CLI says when the agent is not there, the client bundle is not usable, or
/// both. Reachability comes first (the same rule as the library, the C ABI and Python):
/// with no agent the error is "cannot reach the agent" and names the bundle problem too;
/// with something listening, the bundle problem alone.
#[test]
fn cli_without_an_agent_says_so() {
    let home = tempfile::tempdir().unwrap();
    let dpuio = || command_in("dpuio", home.path());
    let out = dpuio().args(["--agent", "http://127.0.0.1:9", "ls"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the agent at http://127.0.0.1:9"), "{err}");
    // With TLS (the default), no client bundle and no agent: unreachable, and the
    // message says where it looked for the bundle.
    let out = dpuio().args(["--agent", "127.0.0.1:9", "ls"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the agent at 127.0.0.1:9"), "{err}");
    assert!(err.contains("cannot read the client certificate") && err.contains("dpuctl cert issue"), "{err}");
    assert!(err.contains(home.path().join(".config/dpuio/client.pem").to_str().unwrap()), "{err}");
    // Something listens there: the bundle is the problem.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listening = listener.local_addr().unwrap().to_string();
    let out = dpuio().args(["--agent", &listening, "ls"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TLS: cannot read the client certificate"), "{err}");
    assert!(!err.contains("cannot reach"), "{err}");
    // A file that is not a certificate is named as such before any TLS handshake.
    let garbage = home.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let out = dpuio()
        .args(["--agent", &listening, "--cert", garbage.to_str().unwrap(), "--key"])
        .arg(&garbage)
        .args(["--ca"])
        .arg(&garbage)
        .arg("ls")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the client certificate file holds no PEM block"), "{err}");
}

#[test]
fn check_config_names_every_mistake() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[agent]\nlisten = \"nowhere\"\n[backend]\nkind = \"nfs\"\n[[tenants]]\nname = \"a b\"\ncontainer = \"c\"\n",
    )
    .unwrap();
    let out = command_in("dpu-agent", &dir.path().join("home")).arg("check-config").arg(&bad).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("3 mistake(s)"), "{err}");
    for key in ["agent.listen", "backend.kind", "tenants[0].name"] {
        assert!(err.contains(key), "{key} missing from: {err}");
    }

    let good = dir.path().join("good.toml");
    std::fs::write(&good, "[[tenants]]\nname = \"vision\"\ncontainer = \"imagenet\"\n").unwrap();
    let out = command_in("dpu-agent", &dir.path().join("home")).arg("check-config").arg(&good).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn sigterm_stops_cleanly_with_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start(dir.path(), &[]);
    ok_stdout(&agent.cli(&["mkdir", "/x"]));
    agent.signal("TERM");
    assert_eq!(agent.wait(Duration::from_secs(20)), Some(0));
}

#[tokio::test]
async fn acknowledged_changes_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start(dir.path(), &[]);
    let c = Client::connect(ConnectOptions { agent: agent.url(), tls: agent.tls(), ..ConnectOptions::default() })
        .await
        .unwrap();
    c.mkdir("/ckpt/epoch-1", true).await.unwrap();
    let f = c.create("/ckpt/epoch-1/model.tmp", true).await.unwrap();
    f.truncate(1 << 20).await.unwrap();
    f.close().await.unwrap(); // durable once Close returns
    c.rename("/ckpt/epoch-1/model.tmp", "/ckpt/epoch-1/model.pt").await.unwrap();
    c.mkdir("/later", false).await.unwrap();
    c.sync().await.unwrap(); // and the renames and mkdirs with it

    agent.signal("KILL");
    agent.wait(Duration::from_secs(10));
    drop(c);

    let restarted = AgentProcess::start(dir.path(), &[]);
    let c =
        Client::connect(ConnectOptions { agent: restarted.url(), tls: restarted.tls(), ..ConnectOptions::default() })
            .await
            .unwrap();
    assert_eq!(c.stat("/ckpt/epoch-1/model.pt").await.unwrap().size, 1 << 20);
    assert!(c.stat("/later").await.is_ok());
    assert!(c.stat("/ckpt/epoch-1/model.tmp").await.is_err());
}

#[test]
fn plaintext_beyond_loopback_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("plain.toml");
    std::fs::write(&config, "[tls]\nmode = \"off\"\n").unwrap();
    let out = command_in("dpu-agent", &dir.path().join("home"))
        .args(["serve", "--config", config.to_str().unwrap(), "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a loopback address") && err.contains("mode = \"mtls\""), "{err}");
}

/// A client speaking the other protocol than the agent hears why, and what to change:
/// plaintext (`http://`) against mutual TLS, and TLS against a plaintext agent.
#[test]
fn plaintext_and_tls_mismatches_say_what_to_change() {
    let dir = tempfile::tempdir().unwrap();
    let tls_agent = AgentProcess::start(&dir.path().join("tls"), &[]);
    assert!(!tls_agent.plaintext);
    let out = tls_agent.cli(&["--agent", &format!("http://{}", tls_agent.addr), "ls", "/"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mutual TLS") && err.contains("without http://"), "{err}");

    let config = dir.path().join("plain.toml");
    std::fs::write(&config, "[tls]\nmode = \"off\"\n").unwrap();
    let plain_agent = AgentProcess::start(&dir.path().join("plain"), &["--config", config.to_str().unwrap()]);
    assert!(plain_agent.plaintext);
    // The TLS agent's bundle, presented to the plaintext one.
    let out = tls_agent.cli(&["--agent", &plain_agent.addr, "ls", "/"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not speak TLS") && err.contains("http://"), "{err}");
}
