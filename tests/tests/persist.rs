//! Settings that persist: what `dpuctl` changes (tenants, QoS,
//! limits, rotated-in keys) is written to the state file in the data directory and in
//! force again after the agent restarts, after SIGTERM and after SIGKILL; the config
//! file wins for a setting it changed since; a corrupt state file stops the start with
//! its name and what to do.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dpuio_tests::{AgentProcess, binary, hermetic, ok_stdout};

fn write_key(path: &Path, byte: u8) {
    std::fs::write(path, [byte; 32]).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("agent.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn start(data: &Path, config: &Path) -> AgentProcess {
    AgentProcess::start(data, &["--config", config.to_str().unwrap()])
}

/// Stop with SIGTERM (exit 0) or SIGKILL.
fn stop(mut agent: AgentProcess, signal: &str) {
    agent.signal(signal);
    let status = agent.wait(Duration::from_secs(20));
    if signal == "TERM" {
        assert_eq!(status, Some(0), "a clean exit on SIGTERM");
    }
}

/// The line of `tenant list` (or of `status`'s origins table) that starts with `tenant`.
fn line_of<'a>(text: &'a str, tenant: &str) -> &'a str {
    text.lines()
        .rfind(|l| l.split_whitespace().next() == Some(tenant))
        .unwrap_or_else(|| panic!("no {tenant} in:\n{text}"))
}

/// `dpu-agent serve` on `data` that must fail to start: its exit status and stderr.
fn failed_start(data: &Path, config: Option<&Path>) -> (Option<i32>, String) {
    let mut program = Command::new(binary("dpu-agent"));
    hermetic(&mut program, &data.join(".home"));
    let mut command = dpuio_harness::serve_command(program, data);
    command.args(["--listen", "127.0.0.1:0"]);
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the agent started although it should not have");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    (status.code(), err)
}

const PLAINTEXT: &str = "[tls]\nmode = \"off\"\n[[tenants]]\nname = \"default\"\ncontainer = \"default\"\n";

#[tokio::test]
async fn tenants_qos_and_limits_changed_with_dpuctl_survive_sigterm_and_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = write_config(dir.path(), PLAINTEXT);
    let agent = start(&data, &config);
    let out = ok_stdout(&agent.dpuctl(&[
        "tenant",
        "add",
        "extra",
        "--container",
        "extra-data",
        "--max-handles-per-session",
        "1",
        "--bytes-per-s",
        "32MiB",
    ]));
    assert!(out.contains("kept in the agent's state file"), "{out}");
    ok_stdout(&agent.dpuctl(&["tenant", "set-qos", "default", "--ops-per-s", "500", "--weight", "3"]));
    let state = std::fs::read_to_string(data.join("state.toml")).unwrap();
    assert!(state.starts_with("# dpu-agent state file") && state.contains("version = 1"), "{state}");
    let leftovers: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("state.toml") && n != "state.toml")
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    stop(agent, "TERM");

    // Back after SIGTERM: the added tenant with its container, QoS and limits, the QoS of
    // the config's tenant, and status says where each came from.
    let agent = start(&data, &config);
    let list = ok_stdout(&agent.dpuctl(&["tenant", "list"]));
    let extra = line_of(&list, "extra");
    assert!(
        extra.contains("container extra-data")
            && extra.contains("handles/session 1")
            && extra.contains("bytes 33554432 B/s"),
        "{list}"
    );
    let default = line_of(&list, "default");
    assert!(default.contains("ops 500 /s") && default.contains("weight 3"), "{list}");
    let status = ok_stdout(&agent.dpuctl(&["status"]));
    assert!(status.contains(&format!("state     {}", data.join("state.toml").display())), "{status}");
    let origins = status.split("where settings came from").nth(1).unwrap_or_else(|| panic!("{status}"));
    let extra = line_of(origins, "extra");
    assert_eq!(extra.matches("dpuctl 20").count(), 3, "tenant, qos and limits from dpuctl: {status}");
    let default: Vec<&str> = line_of(origins, "default").split_whitespace().collect();
    assert_eq!(default[1], "config", "{status}");
    assert_eq!(default[2], "dpuctl", "{status}");
    assert!(default.ends_with(&["config", "-"]), "limits from the config, no key: {status}");

    // The added tenant attaches and does I/O, and its limit holds.
    let local = dir.path().join("in.bin");
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 13) as u8).collect();
    std::fs::write(&local, &payload).unwrap();
    ok_stdout(&agent.cli(&["--tenant", "extra", "--transport", "shm", "put", local.to_str().unwrap(), "/f"]));
    let back = dir.path().join("back.bin");
    ok_stdout(&agent.cli(&["--tenant", "extra", "--transport", "shm", "get", "/f", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), payload);
    let c =
        dpuio_shim::Client::connect(dpuio_shim::ConnectOptions { tenant: "extra".into(), ..agent.connect_options() })
            .await
            .unwrap();
    assert_eq!(c.limits().max_handles, 1, "the persisted limit is in force");
    let _first = c.create("/1", true).await.unwrap();
    let e = c.create("/2", true).await.err().unwrap_or_else(|| panic!("a second handle past the tenant's limit"));
    assert_eq!(e.code(), Some(tonic::Code::ResourceExhausted), "{e}");
    drop((_first, c));

    // Changes acknowledged just before a SIGKILL: the limit back to the agent's, another
    // tenant added, and the config's tenant removed.
    ok_stdout(&agent.dpuctl(&["tenant", "set-limits", "extra"]));
    ok_stdout(&agent.dpuctl(&["tenant", "add", "more"]));
    ok_stdout(&agent.dpuctl(&["tenant", "rm", "default"]));
    stop(agent, "KILL");

    let agent = start(&data, &config);
    let list = ok_stdout(&agent.dpuctl(&["tenant", "list"]));
    assert!(line_of(&list, "extra").contains("handles/session agent limit"), "{list}");
    assert!(list.lines().any(|l| l.starts_with("more ")), "{list}");
    assert!(!list.lines().any(|l| l.starts_with("default ")), "a removed tenant of the config stays removed: {list}");
    let status = ok_stdout(&agent.dpuctl(&["status"]));
    assert!(line_of(&status, "default").contains("removed by dpuctl 20"), "{status}");
    let out = agent.cli(&["--tenant", "default", "ls", "/"]);
    assert!(!out.status.success(), "the removed tenant cannot attach: {out:?}");
    // The files of the added tenant are still there.
    ok_stdout(&agent.cli(&["--tenant", "extra", "--transport", "shm", "get", "/f", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), payload);

    // Added back, with a container other than the config's: refused; with the config's: back for good.
    let out = agent.dpuctl(&["tenant", "add", "default", "--container", "elsewhere"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("named in the config file with container \"default\""),
        "{out:?}"
    );
    ok_stdout(&agent.dpuctl(&["tenant", "add", "default"]));
    stop(agent, "KILL");
    let agent = start(&data, &config);
    let list = ok_stdout(&agent.dpuctl(&["tenant", "list"]));
    assert!(list.lines().any(|l| l.starts_with("default ")), "{list}");
    ok_stdout(&agent.cli(&["--tenant", "default", "ls", "/"]));
}

#[test]
fn the_config_file_wins_once_it_changes_a_setting_changed_with_dpuctl() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config_text = |weight: u32| format!("{PLAINTEXT}[tenants.qos]\nweight = {weight}\n");
    let config = write_config(dir.path(), &config_text(2));
    let agent = start(&data, &config);
    ok_stdout(&agent.dpuctl(&["tenant", "set-qos", "default", "--weight", "5"]));
    ok_stdout(&agent.dpuctl(&["tenant", "set-limits", "default", "--max-sessions", "3"]));
    stop(agent, "TERM");

    // Same config: the changes made with dpuctl are in force.
    let agent = start(&data, &config);
    let list = ok_stdout(&agent.dpuctl(&["tenant", "list"]));
    assert!(list.contains("weight 5") && list.contains("max sessions 3"), "{list}");
    stop(agent, "TERM");

    // The operator edits the tenant's QoS in the config: the config wins for the QoS
    // (and the state file forgets that change); the limits, untouched there, stay.
    write_config(dir.path(), &config_text(7));
    let agent = start(&data, &config);
    let list = ok_stdout(&agent.dpuctl(&["tenant", "list"]));
    assert!(list.contains("weight 7") && list.contains("max sessions 3"), "{list}");
    let status = ok_stdout(&agent.dpuctl(&["status"]));
    let origins = status.split("where settings came from").nth(1).unwrap_or_else(|| panic!("{status}"));
    let default: Vec<&str> = line_of(origins, "default").split_whitespace().collect();
    assert_eq!((default[1], default[2], default[3]), ("config", "config", "dpuctl"), "{status}");
    let state = std::fs::read_to_string(data.join("state.toml")).unwrap();
    assert!(!state.contains("[tenants.default.qos"), "{state}");
    stop(agent, "TERM");

    // Setting the config back does not bring the dropped change back.
    write_config(dir.path(), &config_text(2));
    let agent = start(&data, &config);
    assert!(ok_stdout(&agent.dpuctl(&["tenant", "list"])).contains("weight 2"));
}

#[test]
fn a_rotated_in_key_survives_sigkill_opens_old_files_and_wraps_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (k1, k2) = (dir.path().join("k1"), dir.path().join("k2"));
    write_key(&k1, 1);
    write_key(&k2, 2);
    let config = write_config(
        dir.path(),
        &format!(
            "[[tenants]]\nname = \"default\"\ncontainer = \"default\"\n[tenants.encryption]\nkey_file = \"{}\"\n",
            k1.display()
        ),
    );
    let agent = start(&data, &config);
    let local = dir.path().join("in.bin");
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    std::fs::write(&local, &payload).unwrap();
    ok_stdout(&agent.cli(&["--transport", "shm", "put", local.to_str().unwrap(), "/a"]));
    let out = ok_stdout(&agent.dpuctl(&["key", "rotate", "--tenant", "default", "--new-key", k2.to_str().unwrap()]));
    assert!(out.contains("key version 1 -> 2: 1 re-wrapped"), "{out}");
    let state = std::fs::read_to_string(data.join("state.toml")).unwrap();
    assert!(state.contains(&format!("file = \"{}\"", k2.display())), "{state}");
    assert!(!state.contains(&"02".repeat(16)) && !state.contains('\u{2}'), "no key bytes in the state file: {state}");
    stop(agent, "KILL");

    let agent = start(&data, &config);
    let keys = ok_stdout(&agent.dpuctl(&["key", "status", "--tenant", "default"]));
    assert!(keys.contains("current key version 2") && keys.contains("version 2: 1 file(s), current"), "{keys}");
    let back = dir.path().join("back.bin");
    ok_stdout(&agent.cli(&["--transport", "shm", "get", "/a", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), payload, "the file re-wrapped before the restart opens");
    ok_stdout(&agent.cli(&["--transport", "shm", "put", local.to_str().unwrap(), "/b"]));
    let keys = ok_stdout(&agent.dpuctl(&["key", "status", "--tenant", "default"]));
    assert!(keys.contains("version 2: 2 file(s), current"), "new files are wrapped under the rotated-in key: {keys}");
    let status = ok_stdout(&agent.dpuctl(&["status"]));
    let origins = status.split("where settings came from").nth(1).unwrap_or_else(|| panic!("{status}"));
    assert!(line_of(origins, "default").trim_end().ends_with("UTC"), "the key's origin is dpuctl: {status}");
    stop(agent, "TERM");

    // The rotated-in key's file gone: the start stops and names it and the state file.
    let moved = dir.path().join("k2.moved");
    std::fs::rename(&k2, &moved).unwrap();
    let (code, err) = failed_start(&data, Some(&config));
    assert_ne!(code, Some(0));
    assert!(
        err.contains(&k2.display().to_string())
            && err.contains(&data.join("state.toml").display().to_string())
            && err.contains("key version 2 was rotated in with dpuctl"),
        "{err}"
    );
    std::fs::rename(&moved, &k2).unwrap();
    let agent = start(&data, &config);
    ok_stdout(&agent.cli(&["--transport", "shm", "get", "/b", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), payload);
}

#[test]
fn a_corrupt_or_newer_state_file_stops_the_start_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let state = data.join("state.toml");
    for (text, says) in [
        ("version = 1\n[tenants.a\n", "is not valid TOML"),
        ("version = 9\n", "has version 9, and this dpu-agent reads version 1"),
        ("tenants = {}\n", "has no version"),
        ("version = 1\n[tenants.a]\nwhatever = 1\n", "whatever"),
    ] {
        std::fs::write(&state, text).unwrap();
        let (code, err) = failed_start(&data, None);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(&state.display().to_string()) && err.contains(says), "{says}: {err}");
        assert!(err.contains("move the file away") || err.contains("move it away"), "{err}");
        assert_eq!(std::fs::read_to_string(&state).unwrap(), text, "never overwritten");
    }
    // Moved away, as the message says: the agent starts from the config alone.
    std::fs::rename(&state, data.join("state.toml.broken")).unwrap();
    let agent = AgentProcess::start(&data, &[]);
    ok_stdout(&agent.dpuctl(&["status"]));
}
