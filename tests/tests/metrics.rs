//! `[metrics] listen`: a real agent's `GET /metrics` after a known workload through the
//! shim's CLI, parsed by a parser nobody here wrote (Python's `prometheus_client`, the
//! reference client library), and checked against the workload's bytes and operations;
//! `dpuctl status` shows the same figures.
//!
//! Without an interpreter that imports `prometheus_client` (`./x test` installs it into
//! `.venv`), the parser's part prints SKIPPED and why; the endpoint's own checks still run.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use dpuio_tests::{AgentProcess, ok_stdout, python};

/// The two files put and got. Each is smaller than the CLI's transfer chunk (4 MiB), so
/// each is one data-plane write and one read.
const SIZES: [usize; 2] = [1_048_583, 300_001];

/// `GET path` on `addr` with `accept`: (status code, headers, body).
fn http_get(addr: &str, path: &str, accept: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
    (status, head.to_owned(), body.to_owned())
}

/// The samples of an exposition as Python's `prometheus_client` parses them, one
/// `name{label=value,...} value` line each (labels sorted); `Err` says why it cannot run.
fn parse_with_prometheus_client(text: &str) -> Result<Vec<String>, String> {
    let interpreter = python();
    let script = "import sys\n\
        try:\n    from prometheus_client.parser import text_string_to_metric_families\n\
        except ImportError as e:\n    print('IMPORT', e); sys.exit(3)\n\
        for family in text_string_to_metric_families(sys.stdin.read()):\n\
        \x20   for s in family.samples:\n\
        \x20       labels = ','.join(f'{k}={v}' for k, v in sorted(s.labels.items()))\n\
        \x20       print(f'{s.name}{{{labels}}} {s.value!r}')\n";
    let mut child = Command::new(&interpreter)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", interpreter.display()))?;
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    match out.status.code() {
        Some(0) => Ok(stdout.lines().map(str::to_owned).collect()),
        Some(3) => Err(format!("{} cannot import prometheus_client: {stdout}", interpreter.display())),
        _ => panic!("prometheus_client refused the exposition: {}\n{text}", String::from_utf8_lossy(&out.stderr)),
    }
}

/// The value of one sample, as the parser gave it.
fn value(samples: &[String], series: &str) -> Option<f64> {
    samples.iter().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn per_tenant_counters_match_a_known_workload() {
    let dir = tempfile::tempdir().unwrap();
    let config = dpuio_harness::write_config(dir.path(), "[metrics]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let metrics = agent.process.metrics_addr().expect("the ready line names the metrics address").to_owned();

    // The workload: two files put and got over the data plane, three stats, one stat
    // refused by a capability token confined to /sub.
    for (i, size) in SIZES.iter().enumerate() {
        let local = dir.path().join(format!("in{i}"));
        std::fs::write(&local, (0..*size).map(|k| (k * 31 + i) as u8).collect::<Vec<u8>>()).unwrap();
        ok_stdout(&agent.cli(&["--transport", "shm", "put", local.to_str().unwrap(), &format!("/f{i}")]));
    }
    for (i, size) in SIZES.iter().enumerate() {
        let back = dir.path().join(format!("back{i}"));
        ok_stdout(&agent.cli(&["--transport", "shm", "get", &format!("/f{i}"), back.to_str().unwrap()]));
        assert_eq!(std::fs::read(&back).unwrap().len(), *size);
    }
    ok_stdout(&agent.cli(&["stat", "/f0", "/f1", "/f0"]));
    let token = ok_stdout(&agent.cli(&["delegate", "--prefix", "/sub"])).trim().to_owned();
    let denied = agent.cli(&["--token", &token, "stat", "/f0"]);
    assert!(!denied.status.success(), "a stat outside the token's prefix is refused");
    assert!(String::from_utf8_lossy(&denied.stderr).contains("PERMISSION_DENIED"), "{denied:?}");

    let (status, head, _) = http_get(&metrics, "/nothing-here", "*/*");
    assert_eq!(status, 404, "{head}");
    let (status, head, openmetrics) = http_get(&metrics, "/metrics", "application/openmetrics-text;version=1.0.0");
    assert_eq!(status, 200);
    assert!(head.contains("content-type: application/openmetrics-text; version=1.0.0"), "{head}");
    assert!(openmetrics.ends_with("# EOF\n"));
    let (status, head, text) = http_get(&metrics, "/metrics", "text/plain");
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/plain; version=0.0.4"), "{head}");

    let status = ok_stdout(&agent.dpuctl(&["status"]));
    let total: usize = SIZES.iter().sum();
    let figures = status.lines().find(|l| l.starts_with("default ")).unwrap_or_else(|| panic!("{status}"));
    let columns: Vec<&str> = figures.split_whitespace().collect();
    let bytes = total.to_string();
    assert_eq!(columns[..4], ["default", "0", bytes.as_str(), bytes.as_str()], "{status}");
    assert_eq!(columns[5], "1", "one error, the denial: {status}");
    assert!(status.contains(&format!("metrics   {metrics}")), "{status}");

    let samples = match parse_with_prometheus_client(&text) {
        Ok(samples) => samples,
        Err(why) => {
            eprintln!("SKIPPED: the check with prometheus_client: {why}");
            return;
        }
    };
    let tenant = "tenant=default";
    let get =
        |series: &str| value(&samples, series).unwrap_or_else(|| panic!("no {series} in:\n{}", samples.join("\n")));
    assert_eq!(get(&format!("dpuio_written_bytes_total{{{tenant}}}")), total as f64);
    assert_eq!(get(&format!("dpuio_read_bytes_total{{{tenant}}}")), total as f64);
    let ops = |op: &str| get(&format!("dpuio_operations_total{{op={op},{tenant}}}"));
    let n = SIZES.len() as f64;
    assert_eq!((ops("write"), ops("read")), (n, n), "one request per file each way");
    assert_eq!((ops("create"), ops("open"), ops("close")), (n, n, 2.0 * n));
    assert_eq!(ops("stat"), 4.0, "three stats and the denied one");
    assert_eq!(get(&format!("dpuio_errors_total{{op=stat,status=permission_denied,{tenant}}}")), 1.0);
    assert_eq!(samples.iter().filter(|s| s.starts_with("dpuio_errors_total{")).count(), 1, "no other error");
    for op in ["read", "write"] {
        assert_eq!(get(&format!("dpuio_request_duration_seconds_count{{op={op},{tenant}}}")), n);
    }
    let stat = "method=dpuio.v1.Namespace/Stat";
    assert_eq!(get(&format!("dpuio_grpc_requests_total{{code=ok,{stat}}}")), 3.0);
    assert_eq!(get(&format!("dpuio_grpc_requests_total{{code=permission_denied,{stat}}}")), 1.0);
    assert_eq!(get("dpuio_grpc_request_duration_seconds_count{method=dpuio.v1.Namespace/Stat}"), 4.0);
    assert!(get("dpuio_backend_duration_seconds_count{op=write}") >= n, "the backend wrote both files");
    assert_eq!(get(&format!("dpuio_sessions{{{tenant}}}")), 0.0, "every CLI run detached");
    assert_eq!(get(&format!("dpuio_requests_in_flight{{{tenant}}}")), 0.0);
    assert!(samples.iter().any(|s| s.starts_with("dpuio_transport_malformed_doorbells_total{provider=")));
}

/// Whether the exposition has the sample line `series value`.
fn has_sample(text: &str, series: &str, value: &str) -> bool {
    text.lines().any(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')) == Some(value))
}

#[test]
fn the_key_version_follows_a_rotation() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let keys = [dir.path().join("k1"), dir.path().join("k2")];
    for (byte, key) in keys.iter().enumerate() {
        std::fs::write(key, [byte as u8 + 1; 32]).unwrap();
        std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let text = format!(
        "[metrics]\nlisten = \"127.0.0.1:0\"\n[[tenants]]\nname = \"default\"\ncontainer = \"default\"\n\
         [tenants.encryption]\nkey_file = \"{}\"\n",
        keys[0].display()
    );
    let config = dpuio_harness::write_config(dir.path(), &text).unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let metrics = agent.process.metrics_addr().expect("the ready line names the metrics address").to_owned();
    let series = r#"dpuio_key_version{tenant="default"}"#;
    let (_, _, before) = http_get(&metrics, "/metrics", "text/plain");
    assert!(has_sample(&before, series, "1"), "{before}");
    ok_stdout(&agent.dpuctl(&["key", "rotate", "--tenant", "default", "--new-key", keys[1].to_str().unwrap()]));
    let (_, _, after) = http_get(&metrics, "/metrics", "text/plain");
    assert!(has_sample(&after, series, "2"), "{after}");
}
