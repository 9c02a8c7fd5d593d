use super::*;
use dpuio_backend::NsPath;

use crate::config::QosConfig;
use crate::metrics::{Gauges, TenantGauges};
use crate::qos::tests::qos;

#[test]
fn set_qos_changes_the_table_and_refuses_unknown_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::config::Config {
        tenants: vec![crate::config::TenantConfig::new("a", "a")],
        ..crate::config::Config::default()
    };
    let backend = dpuio_backend::local::LocalBackend::open(dir.path().to_owned()).unwrap();
    let agent = Agent::new(config, Arc::new(backend));
    let new = qos(64 << 20, 5, 32);
    agent.set_qos("a", new).unwrap();
    assert_eq!(agent.tenant("a").unwrap().qos, new);
    let e = agent.set_qos("b", new).unwrap_err();
    assert!(e.to_string().contains("tenant \"b\" is not configured"), "{e}");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(agent.set_qos("a", QosConfig { weight: 0, ..new }).is_err());
    assert!(agent.set_qos("a", QosConfig { max_inflight: 0, ..new }).is_err());
    assert_eq!(agent.tenant("a").unwrap().qos, new, "a refused change leaves the table alone");
}

#[test]
fn scraped_gauges_count_each_tenants_sessions_and_handles() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::config::Config {
        tenants: vec![crate::config::TenantConfig::new("a", "a"), crate::config::TenantConfig::new("b", "b")],
        ..crate::config::Config::default()
    };
    let backend = dpuio_backend::local::LocalBackend::open(dir.path().to_owned()).unwrap();
    let agent = Agent::new(config, Arc::new(backend));
    let session = agent.attach("a", "test", SessionRights::full()).unwrap();
    let container = agent.mount(&session, "").unwrap();
    let options = dpuio_backend::OpenOptions { write: true, create: true, ..Default::default() };
    let object = container.open(&NsPath::parse("/f").unwrap(), options, 0o644).unwrap();
    session.add_handle(object, 8, 0).unwrap();

    let gauges = Gauges::tenants(&agent);
    let a = TenantGauges { tenant: "a".into(), sessions: 1, open_handles: 1, ..Default::default() };
    assert_eq!(gauges, [a, TenantGauges { tenant: "b".into(), ..Default::default() }]);
    assert!(Gauges::transports(&agent).is_empty(), "no data plane");
    let figures = agent.tenant_figures();
    assert_eq!(figures.iter().map(|f| (f.tenant.as_str(), f.sessions)).collect::<Vec<_>>(), [("a", 1), ("b", 0)]);
    // The container is timed below everything else: its open shows in the backend's figures.
    let text = agent.metrics.encode(crate::metrics::Format::Text004).unwrap();
    assert!(text.contains("dpuio_backend_duration_seconds_count{op=\"open\"} 1\n"), "{text}");

    agent.detach(session.id).unwrap();
    assert_eq!(Gauges::tenants(&agent)[0].sessions, 0);
}

#[test]
fn a_temporary_file_noted_in_a_container_that_is_gone_is_forgotten_and_no_container_made() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        crate::config::Config { tenants: vec![crate::config::TenantConfig::new("a", "a")], ..Default::default() };
    let backend = dpuio_backend::local::LocalBackend::open(dir.path().to_owned()).unwrap();
    let agent = Agent::new(config, Arc::new(backend));
    let temp = crate::leftovers::Temp {
        session: 1,
        tenant: "a".into(),
        container: "destroyed".into(),
        path: NsPath::parse("/.f.dpuio-put.1").unwrap(),
    };
    agent.remove_put_temps(vec![temp], crate::leftovers::Why::NotResumed);
    assert!(!dir.path().join("containers/destroyed").exists(), "not made again to remove a file from");
    assert_eq!(agent.put_temps(), (0, 0), "forgotten, not tried again");
    assert_eq!(agent.metrics.put_temps_removed("a", "not_resumed"), 0, "nothing was there to remove");
}
