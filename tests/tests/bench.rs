//! `dpuio bench` end to end at tiny sizes: every workload runs through the shim and
//! POSIX, `--json` gives the fields the reports are built from, and `--plot` writes a PNG.

use dpuio_tests::{AgentProcess, ok_stdout};

#[test]
fn every_workload_reports_json_and_a_plot() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &[]);
    let root = agent.data_dir.join("containers/default");
    let plot = dir.path().join("bench.png");
    let pid = agent.process.id().to_string();
    let out = ok_stdout(&agent.cli(&[
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
        "--file-bytes",
        "16MiB",
        "--seconds",
        "0.2",
        "--rounds",
        "1",
        "--threads",
        "2",
        "--metadata-files",
        "20",
        "--checkpoint-bytes",
        "16MiB",
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
        "--plot",
        plot.to_str().unwrap(),
    ]));
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
