//! `dpuctl` against a running agent over its admin socket: status, sessions, QoS,
//! key rotation and status, drain; and the socket refuses what it should.

use std::os::unix::fs::PermissionsExt;

use dpuio_tests::{AgentProcess, ok_stdout};

fn write_key(path: &std::path::Path, byte: u8) {
    std::fs::write(path, [byte; 32]).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn status_sessions_qos_and_drain() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &[]);
    let socket = agent.data_dir.join("admin.sock");
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the admin socket is for the agent's user only");

    let status = ok_stdout(&agent.dpuctl(&["status"]));
    assert!(status.contains("backend   local") && status.contains("tenants   1"), "{status}");
    ok_stdout(&agent.cli(&["mkdir", "/x"]));
    assert_eq!(ok_stdout(&agent.dpuctl(&["sessions"])).lines().count(), 1, "only the header: the CLI detached");

    let out = ok_stdout(&agent.dpuctl(&["tenant", "set-qos", "default", "--bytes-per-s", "64MiB", "--weight", "2"]));
    assert!(out.contains("67108864 B/s"), "{out}");
    let list = ok_stdout(&agent.dpuctl(&["tenant", "list"]));
    assert!(list.contains("bytes 67108864 B/s") && list.contains("weight 2"), "{list}");
    let out = agent.dpuctl(&["tenant", "set-qos", "nobody", "--ops-per-s", "5"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not configured"), "{out:?}");
    let out = agent.dpuctl(&["tenant", "set-qos", "default", "--bytes-per-s", "lots"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a size"), "{out:?}");

    ok_stdout(&agent.dpuctl(&["drain"]));
    let out = agent.cli(&["ls"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("UNAVAILABLE"), "{out:?}");
    assert!(ok_stdout(&agent.dpuctl(&["status"])).contains("draining  true"));

    let out = agent.command("dpuctl").args(["--socket", "/nonexistent/admin.sock", "status"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the agent's admin socket"), "{out:?}");
}

#[test]
fn key_rotation_rewraps_without_losing_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let (k1, k2) = (dir.path().join("k1"), dir.path().join("k2"));
    write_key(&k1, 1);
    write_key(&k2, 2);
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[[tenants]]\nname = \"default\"\ncontainer = \"default\"\n[tenants.encryption]\nkey_file = \"{}\"\n",
            k1.display()
        ),
    )
    .unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let local = dir.path().join("in.bin");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    std::fs::write(&local, &data).unwrap();
    for name in ["/a", "/b"] {
        ok_stdout(&agent.cli(&["--transport", "shm", "put", local.to_str().unwrap(), name]));
    }
    let before = ok_stdout(&agent.dpuctl(&["key", "status", "--tenant", "default"]));
    assert!(before.contains("current key version 1") && before.contains("version 1: 2 file(s), current"), "{before}");

    let out = ok_stdout(&agent.dpuctl(&["key", "rotate", "--tenant", "default", "--new-key", k2.to_str().unwrap()]));
    assert!(out.contains("key version 1 -> 2: 2 re-wrapped"), "{out}");
    let after = ok_stdout(&agent.dpuctl(&["key", "status", "--tenant", "default"]));
    assert!(after.contains("version 1: 0 file(s), can be retired"), "{after}");
    assert!(after.contains("version 2: 2 file(s), current"), "{after}");
    let back = dir.path().join("back.bin");
    ok_stdout(&agent.cli(&["--transport", "shm", "get", "/a", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), data);

    // Bad requests: a loosely protected key, a missing file, a tenant without encryption.
    let loose = dir.path().join("loose");
    std::fs::write(&loose, [3u8; 32]).unwrap();
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = agent.dpuctl(&["key", "rotate", "--tenant", "default", "--new-key", loose.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("group or others"), "{err}");
    let out = agent.dpuctl(&["key", "rotate", "--tenant", "default", "--new-key", "/nonexistent"]);
    assert!(!out.status.success());
    let out = agent.dpuctl(&["key", "status", "--tenant", "nobody"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("nobody"), "{out:?}");
}

#[tokio::test]
async fn session_limits_per_tenant_change_at_run_time() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &[]);
    let out = ok_stdout(&agent.dpuctl(&["tenant", "set-limits", "default", "--max-handles-per-session", "1"]));
    assert!(out.contains("handles per session 1"), "{out}");
    assert!(ok_stdout(&agent.dpuctl(&["tenant", "list"])).contains("handles/session 1"));
    let c = dpuio_shim::Client::connect(agent.connect_options()).await.unwrap();
    assert_eq!(c.limits().max_handles, 1, "Attach reports the tenant's limit");
    let _first = c.create("/1", true).await.unwrap();
    let e = c.create("/2", true).await.err().unwrap_or_else(|| panic!("a second handle past the tenant's limit"));
    assert_eq!(e.code(), Some(tonic::Code::ResourceExhausted), "{e}");
    assert!(e.to_string().contains("open handles"), "{e}");
    // Back to the agent-wide limit: the same session may open more.
    ok_stdout(&agent.dpuctl(&["tenant", "set-limits", "default"]));
    c.create("/2", true).await.unwrap();
    let out = agent.dpuctl(&["tenant", "set-limits", "nobody", "--max-sessions", "3"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not configured"), "{out:?}");
}
