//! `dpuio bench` end to end at tiny sizes: every workload runs through the shim and
//! POSIX, `--json` gives the fields the reports are built from, and `--plot` writes a PNG;
//! with `--encrypted-bundle` (what `./x demo` runs) a second, encrypted tenant reads the
//! same files and the output says which rows decrypt and what dpuio did and cost.

use std::process::Command;

use dpuio_tests::programs::write_key;
use dpuio_tests::{AgentProcess, binary, hermetic, ok_stdout};

/// Sizes and times small enough for a test: every measurement a fraction of a second.
const TINY: &[&str] = &[
    "--file-bytes",
    "16MiB",
    "--seconds",
    "0.2",
    "--rounds",
    "1",
    "--unet3d-samples",
    "8",
    "--unet3d-mean-bytes",
    "1MiB",
    "--unet3d-stdev-bytes",
    "256KiB",
    "--unet3d-steps",
    "3",
    "--max-accelerators",
    "2",
    "--compute-scale",
    "0.02",
];

#[test]
fn every_workload_reports_json_and_a_plot() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &[]);
    let root = agent.data_dir.join("containers/default");
    let plot = dir.path().join("bench.png");
    let pid = agent.process.id().to_string();
    let args = [
        "bench",
        "seq-read",
        "rand-read",
        "seq-write",
        "metadata",
        "checkpoint",
        "unet3d",
        "--json",
        "--paths",
        "posix,shm,preload",
        "--posix-root",
        root.to_str().unwrap(),
        "--agent-pid",
        &pid,
        "--threads",
        "2",
        "--metadata-files",
        "20",
        "--checkpoint-bytes",
        "16MiB",
        "--plot",
        plot.to_str().unwrap(),
    ];
    let out = ok_stdout(&agent.cli(&[&args[..], TINY].concat()));
    let lines: Vec<&str> = out.lines().collect();
    for workload in ["seq-read", "rand-read", "seq-write", "metadata-create", "checkpoint-write", "unet3d"] {
        for path in ["posix", "shim-ucx-sm"] {
            let line = lines
                .iter()
                .find(|l| {
                    l.contains(&format!("\"workload\":\"{workload}\"")) && l.contains(&format!("\"path\":\"{path}\""))
                })
                .unwrap_or_else(|| panic!("no {workload}/{path} result in:\n{out}"));
            for field in [
                "gib_per_s",
                "iops",
                "p50_us",
                "p99_us",
                "host_cpu_s_per_gib",
                "agent_cpu_s_per_gib",
                "ratio_to_posix",
                "au",
                "accelerators",
            ] {
                assert!(line.contains(&format!("\"{field}\":")), "{field} missing: {line}");
            }
            if path == "shim-ucx-sm" {
                assert!(!line.contains("\"ratio_to_posix\":null"), "no ratio: {line}");
            }
        }
    }
    // The preload path: the POSIX code in a child under libdpuio_preload.so (built
    // beside dpuio by ./x test), compared with POSIX like the shim.
    for workload in
        ["seq-read", "seq-write", "metadata-stat", "metadata-sample128k", "metadata-sample128k-batch16", "unet3d"]
    {
        let line = lines
            .iter()
            .find(|l| l.contains(&format!("\"workload\":\"{workload}\"")) && l.contains("\"path\":\"preload\""))
            .unwrap_or_else(|| panic!("no {workload}/preload result in:\n{out}"));
        assert!(!line.contains("\"ratio_to_posix\":null") && !line.contains("\"iops\":0,"), "{line}");
    }
    let batched = lines
        .iter()
        .find(|l| l.contains("\"workload\":\"metadata-sample128k-batch16\"") && l.contains("\"path\":\"shim-ucx-sm\""))
        .unwrap_or_else(|| panic!("no batched sample row in:\n{out}"));
    assert!(!batched.contains("\"ratio_to_posix\":null"), "{batched}");
    let unet = lines.iter().find(|l| l.contains("\"workload\":\"unet3d\"")).unwrap();
    assert!(!unet.contains("\"au\":null") && !unet.contains("\"accelerators\":null"), "{unet}");
    let png = std::fs::read(&plot).expect("plot written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn an_encrypted_tenant_reads_the_same_files_and_the_output_says_what_each_row_is() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("encrypted.key");
    write_key(&key, 0o600);
    // The local backend whatever the tier: the POSIX baseline reads the container's tree.
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[[tenants]]\nname = \"default\"\ncontainer = \"default\"\n\n\
             [[tenants]]\nname = \"encrypted\"\ncontainer = \"encrypted\"\n\
             [tenants.encryption]\nkey_file = \"{}\"\n",
            key.display()
        ),
    )
    .unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let bundle = dir.path().join("encrypted-bundle");
    ok_stdout(&agent.dpuctl(&["cert", "issue", "--tenant", "encrypted", "--out", bundle.to_str().unwrap()]));
    let root = agent.data_dir.join("containers/default");
    let plot = dir.path().join("bench.png");
    let pid = agent.process.id().to_string();
    let run = |bundle: &std::path::Path| {
        let args = [
            "bench",
            "seq-read",
            "unet3d",
            "--paths",
            "posix,shm",
            "--posix-root",
            root.to_str().unwrap(),
            "--encrypted-bundle",
            bundle.to_str().unwrap(),
            "--agent-pid",
            &pid,
            "--plot",
            plot.to_str().unwrap(),
        ];
        agent.cli(&[&args[..], TINY].concat())
    };
    let out = ok_stdout(&run(&bundle));
    let rows = |path: &str| out.lines().filter(|l| l.split_whitespace().nth(1) == Some(path)).count();
    // For seq-read and unet3d each: a table row, a line in "what dpuio did better" and
    // one in "what decrypting cost".
    assert_eq!(rows("shim-ucx-sm+decrypt"), 6, "{out}");
    assert!(out.lines().any(|l| l.starts_with("seq-read") && l.ends_with("<- the agent decrypts")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("seq-read") && l.ends_with("<- the stored bytes, no dpuio")), "{out}");
    assert!(out.contains("shim-ucx-sm+decrypt  shim-ucx-sm as the tenant with inline encryption"), "legend:\n{out}");
    assert!(out.contains("target: seq-read shim-ucx-sm throughput") && out.contains("        means: "), "{out}");
    assert!(out.contains("what dpuio did better, and what it cost") && out.contains("what decrypting cost"), "{out}");
    // The encrypted tenant's container holds ciphertext of the files the plain one holds as is.
    let stored = |tenant: &str| std::fs::read(agent.data_dir.join(tenant).join(".dpuio-bench/data")).unwrap();
    let (plain, encrypted) = (stored("containers/default"), stored("containers/encrypted"));
    assert_eq!(plain.len(), 16 << 20);
    assert!(encrypted.len() > plain.len() && !encrypted.windows(64).any(|w| w == &plain[4096..4160]));
    assert_eq!(&std::fs::read(&plot).expect("plot written")[..4], b"\x89PNG");

    // The bundle of the tenant the other rows attach as would label plain reads as decrypted.
    let out = run(&agent.client_dir());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the tenant of the other rows") && err.contains("dpuctl cert issue"), "{err}");
}

/// The value of `"field":` in a JSON line of numbers (enough for these lines).
fn number(line: &str, field: &str) -> f64 {
    let at = line.find(&format!("\"{field}\":")).unwrap_or_else(|| panic!("{field} missing: {line}"));
    let rest = &line[at + field.len() + 3..];
    rest[..rest.find([',', '}']).unwrap()].parse().unwrap_or_else(|e| panic!("{field}: {e}: {line}"))
}

#[test]
fn startup_times_starts_with_and_without_the_library_and_needs_no_agent() {
    let home = tempfile::tempdir().unwrap();
    let bench = |args: &[&str]| {
        let mut c = Command::new(binary("dpuio"));
        hermetic(&mut c, home.path());
        c.arg("bench").args(args).output().expect("run dpuio bench")
    };
    let out = ok_stdout(&bench(&["startup", "--startup-runs", "5", "--json"]));
    for row in ["/bin/true under libdpuio_preload.so", "dpuio --help, over /bin/true"] {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("\"row\":\"{row}\"")))
            .unwrap_or_else(|| panic!("no row {row:?} in:\n{out}"));
        let (base, with) = (number(line, "baseline_p50_ms"), number(line, "p50_ms"));
        assert!(base > 0.0 && with > 0.0, "{line}");
        assert!((number(line, "difference_ms") - (with - base)).abs() < 1e-9, "{line}");
        assert!(line.contains("\"met\":true") || line.contains("\"met\":false"), "{line}");
        assert!(number(line, "p10_ms") <= with && with <= number(line, "p90_ms"), "{line}");
    }

    let few = bench(&["startup", "--startup-runs", "1"]);
    assert!(!few.status.success());
    assert!(String::from_utf8_lossy(&few.stderr).contains("--startup-runs 1: give at least 3"), "{few:?}");
    let mixed = bench(&["startup", "seq-read"]);
    assert!(!mixed.status.success());
    assert!(String::from_utf8_lossy(&mixed.stderr).contains("run it alone"), "{mixed:?}");
}

#[test]
fn tcp_stream_is_the_bar_of_the_tcp_rows() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &[]);
    let args = ["bench", "seq-read", "--paths", "tcp,tcp-stream", "--queue-depth", "2"];
    let out = ok_stdout(&agent.cli(&[&args[..], TINY].concat()));
    let stream = out
        .lines()
        .find(|l| l.contains("tcp-stream") && l.starts_with("seq-read"))
        .unwrap_or_else(|| panic!("no tcp-stream row in:\n{out}"));
    let gib_per_s: f64 = stream.split_whitespace().nth(4).and_then(|v| v.parse().ok()).expect("GiB/s");
    assert!(gib_per_s > 0.0, "{stream}");
    assert!(out.contains("target: seq-read shim-ucx-tcp (1024 KiB, 2 in flight) >= 0.8x tcp-stream: "), "{out}");

    // Not a TCP stream of its own for a remote agent: the source must be named.
    let remote = agent.cli(&[&args[..], &["--stream-source", "no-port"], TINY].concat());
    assert!(!remote.status.success());
    assert!(String::from_utf8_lossy(&remote.stderr).contains("--stream-source no-port: not an address"), "{remote:?}");
}
