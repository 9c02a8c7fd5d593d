use std::time::Duration;

use dpuio_proto::wire::Status;

use super::http::answer;
use super::*;

/// The value of the sample line `name{labels}` in `text` (labels as encoded).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.split(' ').next()?.parse().ok())
}

#[test]
fn tenant_handles_count_into_the_families() {
    let m = Metrics::new();
    let t = m.tenant("a");
    assert!(Arc::ptr_eq(&t, &m.tenant("a")), "one handle per tenant");
    t.request(Op::Read, Status::Ok, 4096, Duration::from_micros(30));
    t.request(Op::Read, Status::Ok, 100, Duration::from_micros(10));
    t.request(Op::Write, Status::Integrity, 0, Duration::from_millis(1));
    t.completed(Op::Unknown, Status::Malformed);
    t.call(Op::Stat, Ok(()));
    t.call(Op::Stat, Err(tonic::Code::PermissionDenied));
    t.throttled(Duration::from_millis(250));

    let text = m.encode(Format::Text004).unwrap();
    let tenant = r#"tenant="a""#;
    assert_eq!(sample(&text, &format!("dpuio_read_bytes_total{{{tenant}}}")), Some(4196.0), "{text}");
    assert_eq!(sample(&text, &format!("dpuio_written_bytes_total{{{tenant}}}")), Some(0.0));
    assert_eq!(sample(&text, &format!(r#"dpuio_operations_total{{{tenant},op="read"}}"#)), Some(2.0));
    assert_eq!(sample(&text, &format!(r#"dpuio_operations_total{{{tenant},op="write"}}"#)), Some(1.0));
    assert_eq!(sample(&text, &format!(r#"dpuio_operations_total{{{tenant},op="stat"}}"#)), Some(2.0));
    assert_eq!(sample(&text, &format!(r#"dpuio_errors_total{{{tenant},op="write",status="integrity"}}"#)), Some(1.0));
    assert_eq!(sample(&text, &format!(r#"dpuio_errors_total{{{tenant},op="unknown",status="malformed"}}"#)), Some(1.0));
    assert_eq!(
        sample(&text, &format!(r#"dpuio_errors_total{{{tenant},op="stat",status="permission_denied"}}"#)),
        Some(1.0)
    );
    assert_eq!(sample(&text, &format!("dpuio_integrity_failures_total{{{tenant}}}")), Some(1.0));
    assert_eq!(sample(&text, &format!("dpuio_qos_throttled_seconds_total{{{tenant}}}")), Some(0.25));
    assert_eq!(sample(&text, &format!(r#"dpuio_request_duration_seconds_count{{{tenant},op="read"}}"#)), Some(2.0));
    assert_eq!(
        m.headline(),
        [Headline { tenant: "a".into(), read_bytes: 4196, written_bytes: 0, operations: 6, errors: 3 }]
    );
}

#[test]
fn grpc_calls_of_unknown_methods_share_one_label() {
    let m = Metrics::new();
    m.grpc_call("dpuio.v1.Namespace/Stat", tonic::Code::Ok, Duration::from_micros(200));
    m.grpc_call("dpuio.v1.Namespace/Stat", tonic::Code::NotFound, Duration::from_micros(200));
    m.grpc_call("dpuio.v1.Namespace/Made-Up-1", tonic::Code::Unimplemented, Duration::ZERO);
    m.grpc_call("dpuio.v1.Namespace/Made-Up-2", tonic::Code::Unimplemented, Duration::ZERO);
    let text = m.encode(Format::Text004).unwrap();
    let calls = |labels: &str| sample(&text, &format!("dpuio_grpc_requests_total{{{labels}}}"));
    assert_eq!(calls(r#"method="dpuio.v1.Namespace/Stat",code="ok""#), Some(1.0));
    assert_eq!(calls(r#"method="dpuio.v1.Namespace/Stat",code="not_found""#), Some(1.0));
    assert_eq!(calls(r#"method="unknown",code="unimplemented""#), Some(2.0));
    assert!(!text.contains("Made-Up"), "{text}");
}

#[derive(Debug)]
struct Fixed;

impl Gauges for Fixed {
    fn tenants(&self) -> Vec<TenantGauges> {
        vec![TenantGauges {
            tenant: "a".into(),
            sessions: 2,
            open_handles: 3,
            regions: 4,
            requests_in_flight: 5,
            key_version: Some(7),
            worker_restarts: Some(1),
            worker_pieces: Some((11, 12)),
        }]
    }
    fn transports(&self) -> Vec<TransportGauges> {
        vec![TransportGauges { provider: "ucx".into(), peers: 2, malformed_doorbells: 9 }]
    }
}

#[test]
fn gauges_are_read_when_scraped_while_their_source_lives() {
    let m = Metrics::new();
    let source: Arc<dyn Gauges> = Arc::new(Fixed);
    m.register_gauges(Arc::downgrade(&source));
    let text = m.encode(Format::OpenMetrics).unwrap();
    for (series, value) in [
        (r#"dpuio_sessions{tenant="a"}"#, 2.0),
        (r#"dpuio_open_handles{tenant="a"}"#, 3.0),
        (r#"dpuio_regions{tenant="a"}"#, 4.0),
        (r#"dpuio_requests_in_flight{tenant="a"}"#, 5.0),
        (r#"dpuio_key_version{tenant="a"}"#, 7.0),
        (r#"dpuio_daos_worker_restarts_total{tenant="a"}"#, 1.0),
        (r#"dpuio_daos_worker_pieces_total{tenant="a",memory="host"}"#, 11.0),
        (r#"dpuio_daos_worker_pieces_total{tenant="a",memory="staging"}"#, 12.0),
        (r#"dpuio_transport_peers{provider="ucx"}"#, 2.0),
        (r#"dpuio_transport_malformed_doorbells_total{provider="ucx"}"#, 9.0),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series} in {text}");
    }
    assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with EOF");
    drop(source);
    assert!(!m.encode(Format::OpenMetrics).unwrap().contains("dpuio_sessions"));
}

#[test]
fn the_endpoint_answers_get_metrics_and_nothing_else() {
    let m = Metrics::new();
    m.tenant("a");
    let get = |head: &str| answer(head.as_bytes(), &m);

    let plain = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!((plain.status, plain.content_type), (200, "text/plain; version=0.0.4; charset=utf-8"));
    assert!(plain.body.contains(r#"dpuio_read_bytes_total{tenant="a"} 0"#), "{}", plain.body);
    let open = get("GET /metrics?x=1 HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n");
    assert_eq!((open.status, open.content_type), (200, "application/openmetrics-text; version=1.0.0; charset=utf-8"));
    assert!(open.body.ends_with("# EOF\n"));

    assert_eq!(get("GET / HTTP/1.1\r\n\r\n").status, 404);
    assert_eq!(get("GET /metricsx HTTP/1.0\r\n\r\n").status, 404);
    assert_eq!(get("POST /metrics HTTP/1.1\r\n\r\n").status, 405);
    assert_eq!(get("GET /metrics\r\n\r\n").status, 400);
    assert_eq!(get("GET /metrics SPDY/3\r\n\r\n").status, 400);
    assert_eq!(answer(&[0xff, 0xfe, b'\r', b'\n'], &m).status, 400);

    let wire = String::from_utf8(get("PUT /metrics HTTP/1.1\r\n\r\n").to_bytes()).unwrap();
    assert!(wire.starts_with("HTTP/1.1 405 Method Not Allowed\r\n") && wire.contains("\r\nallow: GET, HEAD\r\n"));
    assert!(wire.contains("content-length: 28\r\n"), "{wire}");
}
