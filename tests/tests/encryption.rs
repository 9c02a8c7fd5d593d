//! Inline encryption end to end: a tenant with `[tenants.encryption]` stores only
//! ciphertext, reads back its plaintext, and tampering is an integrity error.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use dpuio_tests::{AgentProcess, binary, ok_stdout};

fn write_key(path: &std::path::Path, mode: u32) {
    let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37).wrapping_add(11)).collect();
    std::fs::write(path, key).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn config(dir: &std::path::Path, key: &std::path::Path) -> std::path::PathBuf {
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[[tenants]]\nname = \"default\"\ncontainer = \"default\"\n[tenants.encryption]\nkey_file = \"{}\"\nblock_bytes = 65536\n",
            key.display()
        ),
    )
    .unwrap();
    config
}

fn files_under(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files_under(&p, out)
        } else if p.is_file() {
            out.push(p)
        }
    }
}

#[test]
fn only_ciphertext_is_stored_and_tampering_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("tenant.key");
    write_key(&key, 0o600);
    let config = config(dir.path(), &key);
    let data_dir = dir.path().join("data");
    let agent = AgentProcess::start(&data_dir, &["--config", config.to_str().unwrap()]);

    const MARKER: &str = "DPUIO-MARKER-7f3a9c";
    let plain: Vec<u8> = MARKER.bytes().cycle().take(300_000).collect();
    let local = dir.path().join("in.txt");
    std::fs::write(&local, &plain).unwrap();
    ok_stdout(&agent.cli(&["--transport", "shm", "put", local.to_str().unwrap(), "/secret.txt"]));

    let mut stored = Vec::new();
    files_under(&data_dir, &mut stored);
    for f in &stored {
        let bytes = std::fs::read(f).unwrap();
        assert!(!bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()), "marker found in {}", f.display());
    }
    assert!(ok_stdout(&agent.cli(&["stat", "/secret.txt"])).contains(" 300000 "), "stat shows the plaintext size");
    let back = dir.path().join("back.txt");
    ok_stdout(&agent.cli(&["--transport", "shm", "get", "/secret.txt", back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == plain);

    // Flip one byte of stored ciphertext in the second block.
    let file = data_dir.join("containers/default/secret.txt");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[256 + 65536 + 28 + 100] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let out = agent.cli(&["--transport", "shm", "get", "/secret.txt", back.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("integrity"), "{err}");
}

#[test]
fn a_key_file_readable_by_others_stops_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("loose.key");
    write_key(&key, 0o644);
    let config = config(dir.path(), &key);
    let out = Command::new(binary("dpu-agent"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config", config.to_str().unwrap()])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("chmod 600") && err.contains("default"), "{err}");
}
