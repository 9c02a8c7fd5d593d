//! The aarch64 (BlueField) build of `dpu-agent`, run under `qemu-aarch64-static`, serving
//! the native x86-64 `dpuio` CLI and `dpuctl` over mutual TLS and UCX: what a host sees of
//! an agent on a DPU's Arm cores, as far as this machine can show it.
//!
//! The aarch64 binaries are the ones `./x test` cross-builds
//! (`target/cross/aarch64-unknown-linux-gnu/debug`, or `$DPUIO_ARM64_BIN_DIR`). Without
//! them, or without qemu, each test says it is skipped and why.
//!
//! Shared memory between the emulated agent and a native client works: qemu-user runs the
//! agent as an ordinary Linux process of this machine, so UCX's shared-memory transports
//! (POSIX shared memory, and cross-memory attach) connect the two like any two processes,
//! and the test moves the same 64 MiB over `shm` as over `tcp`. On a BlueField the host and
//! the DPU are separate machines: RDMA (or TCP) carries the data there.

use std::path::PathBuf;
use std::time::Duration;

use dpuio_tests::arm64::{self, emulated};
use dpuio_tests::{AgentProcess, ok_stdout};

fn arm64_agent() -> Result<PathBuf, String> {
    arm64::program("dpu-agent")
}

macro_rules! arm64_agent_or_skip {
    () => {
        match arm64_agent() {
            Ok(agent) => agent,
            Err(why) => {
                eprintln!("SKIPPED: {why}");
                return;
            }
        }
    };
}

#[test]
fn emulated_agent_checks_configs() {
    let agent = arm64_agent_or_skip!();
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good.toml");
    std::fs::write(
        &good,
        format!(
            "[agent]\nlisten = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\n[[tenants]]\nname = \"vision\"\ncontainer = \"imagenet\"\n",
            tmp.path().join("data").display()
        ),
    )
    .unwrap();
    let out = emulated(&agent).arg("check-config").arg(&good).output().unwrap();
    assert!(
        out.status.success(),
        "aarch64 check-config rejected a good config: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let bad = tmp.path().join("bad.toml");
    std::fs::write(&bad, "[agent]\nlisten = \"nowhere\"\n").unwrap();
    let out = emulated(&agent).arg("check-config").arg(&bad).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "aarch64 check-config accepted a bad listen address");
    assert!(stderr.contains("listen"), "the error names the bad key: {stderr}");
}

#[test]
fn native_host_uses_an_emulated_aarch64_agent() {
    let agent_bin = arm64_agent_or_skip!();
    let tmp = tempfile::tempdir().unwrap();
    // qemu runs the agent several times slower than the machine: allow for a slow start.
    let agent = AgentProcess::start_program(emulated(&agent_bin), tmp.path(), &[], Duration::from_secs(60));

    // The operator's view over the admin socket: native dpuctl, emulated agent.
    let status = ok_stdout(&agent.dpuctl(&["status"]));
    assert!(status.contains("backend   local") && status.contains("tenants   1"), "dpuctl status: {status}");
    let version = ok_stdout(&emulated(&agent_bin).arg("--version").output().unwrap());
    assert!(version.starts_with("dpu-agent "), "{version}");

    // Attach over mutual TLS, namespace calls.
    ok_stdout(&agent.cli(&["mkdir", "-p", "/from-x86/deeper"]));
    let listing = ok_stdout(&agent.cli(&["ls", "/from-x86"]));
    assert!(listing.lines().any(|l| l.trim() == "deeper"), "ls: {listing}");

    // 64 MiB each way over UCX TCP: the aarch64 agent puts into and gets from the
    // x86-64 host's registered memory.
    let data: Vec<u8> = (0..64u64 << 20).map(|i| (i.wrapping_mul(0x9e37_79b9) >> 13) as u8).collect();
    let local = tmp.path().join("local.bin");
    let back = tmp.path().join("back.bin");
    std::fs::write(&local, &data).unwrap();
    ok_stdout(&agent.cli(&["--transport", "tcp", "put", local.to_str().unwrap(), "/from-x86/deeper/blob"]));
    ok_stdout(&agent.cli(&["--transport", "tcp", "get", "/from-x86/deeper/blob", back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == data, "64 MiB got back from the aarch64 agent differ from what was put");
    let stored = std::fs::read(tmp.path().join("containers/default/from-x86/deeper/blob")).unwrap();
    assert!(stored == data, "the aarch64 agent stored other bytes than it was given");

    // The same over UCX shared memory, across the emulation boundary.
    let back_shm = tmp.path().join("back-shm.bin");
    ok_stdout(&agent.cli(&["--transport", "shm", "put", local.to_str().unwrap(), "/from-x86/shm-blob"]));
    ok_stdout(&agent.cli(&["--transport", "shm", "get", "/from-x86/shm-blob", back_shm.to_str().unwrap()]));
    assert!(std::fs::read(&back_shm).unwrap() == data, "64 MiB over shm from the aarch64 agent differ");
}
