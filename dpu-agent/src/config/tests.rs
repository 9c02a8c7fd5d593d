//! The config parser: every section, its defaults, and every mistake named.

use super::*;

fn issues(text: &str) -> Vec<ConfigIssue> {
    match Config::parse(text) {
        Err(ParseError::Invalid(issues)) => issues,
        other => panic!("expected issues, got {other:?}"),
    }
}

#[test]
fn empty_config_is_the_default() {
    assert_eq!(Config::parse("").unwrap(), Config::default());
}

#[test]
fn full_config_parses() {
    let config = Config::parse(
        r#"
        [agent]
        listen = "127.0.0.1:0"
        data_dir = "/srv/dpuio"
        lease_ms = 5000
        [backend]
        kind = "local"
        [data_plane]
        idle_poll_us = 2000
        [limits]
        max_sessions = 8
        max_io_bytes = 1048576
        [[tenants]]
        name = "vision"
        container = "imagenet"
        [[tenants]]
        name = "nlp"
        container = "c4"
        "#,
    )
    .unwrap();
    assert_eq!(config.listen.port(), 0);
    assert_eq!(config.backend, BackendConfig::Local { path: "/srv/dpuio".into() });
    assert_eq!(config.limits.max_sessions, 8);
    assert_eq!(config.limits.max_io_bytes, 1 << 20);
    assert_eq!(config.tenants.len(), 2);
    assert_eq!(config.lease_ms, 5000);
    assert_eq!(config.data_plane.idle_poll_us, 2000);
}

#[test]
fn data_plane_providers_pick_the_workers() {
    use fabric::any::Spec;
    let names = |c: &Config| {
        c.data_plane
            .lanes()
            .iter()
            .map(|l| format!("{}|{}|{}", l.spec.provider(), l.spec.fabric_provider(), l.required))
            .collect::<Vec<_>>()
    };
    // The default: UCX, plus libfabric where it opens (never fatal).
    let config = Config::parse("").unwrap();
    assert_eq!(names(&config), ["ucx||true", "ofi|shm|false", "ofi|tcp;ofi_rxm|false", "ofi|verbs;ofi_rxm|false"]);
    // Named: each must open, and the transports pick libfabric's providers.
    let config = Config::parse("[data_plane]\nproviders = [\"ofi\"]\ntransports = \"tcp\"\n").unwrap();
    assert_eq!(names(&config), ["ofi|tcp;ofi_rxm|true"]);
    let config = Config::parse("[data_plane]\nproviders = [\"ucx\", \"ofi\"]\ntransports = \"shm\"\n").unwrap();
    assert_eq!(names(&config), ["ucx||true", "ofi|shm|true"]);
    assert_eq!(config.data_plane.lanes()[0].spec, Spec::Ucx(fabric::FabricConfig::shm()));
    for bad in ["providers = [\"verbs\"]", "providers = []", "providers = \"ucx\"", "providers = [1]"] {
        let found = issues(&format!("[data_plane]\n{bad}\n"));
        assert_eq!(found[0].key, "data_plane.providers", "{bad}");
        assert!(found[0].reason.contains("ucx"), "{bad}: {found:?}");
    }
}

#[test]
fn data_plane_interface_puts_the_network_lanes_on_it() {
    use fabric::any::Spec;
    let config = Config::parse("[data_plane]\ninterface = \"veth-dpu\"\n").unwrap();
    assert_eq!(config.data_plane.interface.as_deref(), Some("veth-dpu"));
    let lanes = config.data_plane.lanes();
    let Spec::Ucx(ucx) = &lanes[0].spec else { panic!("UCX first: {lanes:?}") };
    assert_eq!(ucx.ucx_options, [("NET_DEVICES".to_owned(), "veth-dpu".to_owned())]);
    let domains: Vec<_> = lanes[1..]
        .iter()
        .map(|l| match &l.spec {
            Spec::Ofi(c) => (c.provider.as_str(), c.domain.as_deref()),
            Spec::Ucx(_) => panic!("one UCX lane"),
        })
        .collect();
    assert_eq!(
        domains,
        [("shm", None), ("tcp;ofi_rxm", Some("veth-dpu")), ("verbs;ofi_rxm", None)],
        "only libfabric tcp's domains are interfaces"
    );
    assert_eq!(Config::parse("").unwrap().data_plane.interface, None);
    for (bad, says) in [
        ("interface = \"\"", "1 to 15 bytes"),
        ("interface = \"a-very-long-interface\"", "1 to 15 bytes"),
        ("interface = \"eth0:1\"", "not an interface name"),
        ("interface = 3", "expected a string"),
    ] {
        let found = issues(&format!("[data_plane]\n{bad}\n"));
        assert_eq!(found[0].key, "data_plane.interface", "{bad}");
        assert!(found[0].reason.contains(says), "{bad}: {found:?}");
    }
}

#[test]
fn health_listen_is_checked() {
    let config = Config::parse("[agent]\nlisten = \"0.0.0.0:7300\"\nhealth_listen = \"0.0.0.0:7301\"\n").unwrap();
    assert_eq!(config.health_listen, Some("0.0.0.0:7301".parse().unwrap()));
    assert_eq!(Config::parse("").unwrap().health_listen, None);
    let found = issues("[agent]\nlisten = \"0.0.0.0:7300\"\nhealth_listen = \"0.0.0.0:7300\"\n");
    assert_eq!(found[0].key, "agent.health_listen");
    assert!(found[0].reason.contains("agent.listen already"), "{found:?}");
    let found = issues("[agent]\nhealth_listen = \"7301\"\n");
    assert!(found[0].reason.contains("not an IP:port"), "{found:?}");
}

#[test]
fn metrics_listen_is_checked() {
    assert_eq!(Config::parse("").unwrap().metrics.listen, None, "off unless configured");
    let config = Config::parse("[metrics]\nlisten = \"127.0.0.1:9464\"\n").unwrap();
    assert_eq!(config.metrics.listen, Some("127.0.0.1:9464".parse().unwrap()));
    let any_port = Config::parse("[agent]\nlisten = \"127.0.0.1:0\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n");
    assert_eq!(any_port.unwrap().metrics.listen, Some("127.0.0.1:0".parse().unwrap()));
    for (bad, says) in [
        ("listen = \"9464\"", "not an IP:port address"),
        ("listen = \"localhost:9464\"", "not an IP:port address"),
        ("listen = 9464", "expected a string"),
        ("listen = \"127.0.0.1:7300\"", "agent.listen or agent.health_listen already"),
        ("port = 9464", "unknown key"),
    ] {
        let found = issues(&format!("[agent]\nlisten = \"127.0.0.1:7300\"\n[metrics]\n{bad}\n"));
        assert_eq!(found.len(), 1, "{bad}: {found:?}");
        assert!(found[0].key.starts_with("metrics."), "{bad}: {found:?}");
        assert!(found[0].reason.contains(says), "{bad}: {found:?}");
    }
    let found = issues("metrics = 1\n");
    assert!(found[0].key == "metrics" && found[0].reason.contains("expected a table"), "{found:?}");
}

#[test]
fn daos_backend_parses_with_defaults_and_every_key() {
    let config = Config::parse("[backend]\nkind = \"daos\"\npool = \"tank\"\n").unwrap();
    assert_eq!(
        config.backend,
        BackendConfig::Daos(DaosConfig {
            pool: "tank".into(),
            system: "daos_server".into(),
            agent_socket_dir: None,
            create_containers: false,
            chunk_bytes: 1 << 20,
            object_class: String::new(),
            retry_seconds: crate::config::DEFAULT_RETRY_SECONDS,
            redundancy_factor: 0,
            redundancy_level: 0,
            call_timeout_seconds: crate::config::DEFAULT_CALL_TIMEOUT_SECONDS,
            dir_cache_seconds: 5,
        })
    );
    let config = Config::parse(
        r#"
        [backend]
        kind = "daos"
        pool = "6f1e8c3a-62a0-4c5c-9f2b-0d3c1a2b4c5d"
        system = "prod"
        agent_socket_dir = "/run/daos_agent"
        create_containers = true
        chunk_bytes = 8388608
        object_class = "RP_2G1"
        redundancy_factor = 1
        redundancy_level = "rank"
        "#,
    )
    .unwrap();
    let BackendConfig::Daos(d) = config.backend else { panic!("not daos") };
    assert_eq!((d.system.as_str(), d.chunk_bytes, d.object_class.as_str()), ("prod", 8 << 20, "RP_2G1"));
    assert_eq!((d.redundancy_factor, d.redundancy_level), (1, 1));
    let found =
        issues("[backend]\nkind = \"daos\"\npool = \"t\"\nredundancy_factor = 5\nredundancy_level = \"rack\"\n");
    let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["backend.redundancy_factor", "backend.redundancy_level"], "{found:?}");
    assert_eq!((d.agent_socket_dir, d.create_containers), (Some("/run/daos_agent".into()), true));
}

#[test]
fn a_tenant_names_its_object_class_and_retries_have_a_bound() {
    let config = Config::parse(
        r#"
        [backend]
        kind = "daos"
        pool = "tank"
        retry_seconds = 30
        [[tenants]]
        name = "replicated"
        container = "r"
        object_class = "RP_2G1"
        [[tenants]]
        name = "plain"
        container = "p"
        "#,
    )
    .unwrap();
    let BackendConfig::Daos(d) = &config.backend else { panic!("not daos") };
    assert_eq!((d.retry_seconds, d.call_timeout_seconds), (30, 180));
    let long = Config::parse("[backend]\nkind = \"daos\"\npool = \"tank\"\nretry_seconds = 600\n").unwrap();
    let BackendConfig::Daos(d) = &long.backend else { panic!("not daos") };
    assert_eq!(d.call_timeout_seconds, 660, "unset, it leaves the last try DAOS's 60 s RPC timeout");
    let set = Config::parse("[backend]\nkind = \"daos\"\npool = \"t\"\nretry_seconds = 5\ncall_timeout_seconds = 10\n");
    let BackendConfig::Daos(d) = &set.unwrap().backend else { panic!("not daos") };
    assert_eq!((d.retry_seconds, d.call_timeout_seconds), (5, 10));
    let off = Config::parse("[backend]\nkind = \"daos\"\npool = \"t\"\ndir_cache_seconds = 0\n").unwrap();
    let BackendConfig::Daos(d) = &off.backend else { panic!("not daos") };
    assert_eq!(d.dir_cache_seconds, 0);
    let long = issues("[backend]\nkind = \"daos\"\npool = \"t\"\ndir_cache_seconds = 86400\n");
    assert_eq!(long.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(), ["backend.dir_cache_seconds"], "{long:?}");
    let short = issues("[backend]\nkind = \"daos\"\npool = \"t\"\nretry_seconds = 30\ncall_timeout_seconds = 20\n");
    assert_eq!(short.len(), 1, "{short:?}");
    assert_eq!(short[0].key, "backend.call_timeout_seconds");
    assert!(short[0].reason.contains("shorter than retry_seconds (30)"), "{short:?}");
    let classes: Vec<&str> = config.tenants.iter().map(|t| t.object_class.as_str()).collect();
    assert_eq!(classes, ["RP_2G1", ""]);

    let found = issues(
        r#"
        [backend]
        kind = "daos"
        pool = "tank"
        retry_seconds = -1
        [[tenants]]
        name = "a"
        container = "a"
        object_class = "rp2"
        "#,
    );
    let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["backend.retry_seconds", "tenants[0].object_class"], "{found:?}");
    let local = issues("[[tenants]]\nname = \"a\"\ncontainer = \"a\"\nobject_class = \"RP_2G1\"\n");
    assert_eq!(local.len(), 1, "{local:?}");
    assert_eq!(local[0].key, "tenants[0].object_class");
    assert!(local[0].reason.contains("local backend has none"), "{local:?}");
}

#[test]
fn daos_backend_mistakes_are_all_named() {
    let found = issues(
        r#"
        [backend]
        kind = "daos"
        path = "/srv"
        system = ""
        agent_socket_dir = "relative/dir"
        create_containers = "yes"
        chunk_bytes = 1000
        object_class = "rp 2"
        "#,
    );
    let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "backend.path",
            "backend.pool",
            "backend.system",
            "backend.agent_socket_dir",
            "backend.create_containers",
            "backend.chunk_bytes",
            "backend.object_class"
        ],
        "{found:?}"
    );
    assert!(found[0].reason.contains("kind = \"local\" only"), "{found:?}");
    assert!(found[1].reason.contains("label or UUID of the pool"), "{found:?}");
    let found = issues("[backend]\npool = \"tank\"\n");
    assert_eq!(found[0].key, "backend.pool");
    assert!(found[0].reason.contains("kind = \"daos\" only"), "{found:?}");
    let found = issues("[backend]\nkind = \"daos\"\npool = \"bad/label\"\n");
    assert!(found[0].reason.contains("DAOS label"), "{found:?}");
}

#[test]
fn three_mistakes_are_all_named() {
    let found = issues(
        r#"
        [agent]
        listen = "localhost"
        lease_ms = "soon"
        [backend]
        kind = "nfs"
        "#,
    );
    let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["agent.listen", "agent.lease_ms", "backend.kind"], "{found:?}");
    assert!(found[0].reason.contains("IP:port"));
    assert!(found[1].reason.contains("expected an integer"));
    assert!(found[2].reason.contains("unknown backend \"nfs\"; expected \"local\" or \"daos\""));
}

#[test]
fn tenant_mistakes() {
    let found = issues(
        r#"
        colour = "blue"
        [[tenants]]
        name = "a"
        container = "shared"
        [[tenants]]
        name = "a"
        container = "shared"
        [[tenants]]
        name = "../etc"
        [[tenants]]
        name = "b"
        container = "x"
        quota = 3
        "#,
    );
    let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        keys,
        ["colour", "tenants[1].name", "tenants[1].container", "tenants[2].container", "tenants[3].quota"],
        "{found:?}"
    );
}

#[test]
fn out_of_range_and_plaintext_beyond_loopback() {
    let found = issues(
        r#"
        [agent]
        listen = "0.0.0.0:7300"
        [limits]
        max_sessions = 0
        max_io_bytes = -1
        [data_plane]
        idle_poll_us = 2000000
        [tls]
        mode = "off"
        "#,
    );
    let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        keys,
        ["data_plane.idle_poll_us", "limits.max_sessions", "limits.max_io_bytes", "tls.mode"],
        "{found:?}"
    );
    assert!(found[0].reason.contains("out of range"));
    assert!(found[3].reason.contains("loopback"), "{found:?}");
    // With mTLS (the default) any address is fine.
    assert!(Config::parse("[agent]\nlisten = \"0.0.0.0:7300\"\n").is_ok());
}

#[test]
fn tls_admin_and_qos_sections() {
    let config = Config::parse(
        r#"
        [tls]
        trust_domain = "cluster.example"
        cert = "/etc/dpuio/server.pem"
        key = "/etc/dpuio/server.key"
        client_ca = "/etc/dpuio/clients-ca.pem"
        [admin]
        socket = "/run/dpuio/admin.sock"
        [[tenants]]
        name = "a"
        container = "a"
        max_sessions = 4
        max_handles_per_session = 8
        max_regions_per_session = 2
        [tenants.qos]
        bytes_per_s = 1000000
        burst_bytes = 2000000
        ops_per_s = 500
        weight = 3
        max_inflight = 16
        "#,
    )
    .unwrap();
    assert!(config.tls.mtls);
    assert_eq!(config.tls.trust_domain, "cluster.example");
    assert_eq!(config.tls.files.as_ref().unwrap().client_ca, PathBuf::from("/etc/dpuio/clients-ca.pem"));
    assert_eq!(config.admin_socket(), PathBuf::from("/run/dpuio/admin.sock"));
    let t = &config.tenants[0];
    assert_eq!(t.max_sessions, Some(4));
    assert_eq!((t.max_handles_per_session, t.max_regions_per_session), (Some(8), Some(2)));
    assert_eq!((t.qos.limits.bytes_per_s, t.qos.limits.bytes_burst, t.qos.limits.ops_per_s), (1000000, 2000000, 500));
    assert_eq!((t.qos.weight, t.qos.max_inflight), (3, 16));

    let found = issues(
        "[tls]\nmode = \"maybe\"\ncert = \"/x\"\ntrust_domain = \"UPPER\"\n[[tenants]]\nname = \"a\"\ncontainer = \"a\"\n[tenants.qos]\nweight = 0\nrate = 1\n",
    );
    let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        keys,
        ["tls.mode", "tls.trust_domain", "tls", "tenants[0].qos.rate", "tenants[0].qos.weight"],
        "{found:?}"
    );
}

#[test]
fn encryption_config() {
    let config = Config::parse(
        "[[tenants]]\nname = \"a\"\ncontainer = \"c\"\n[tenants.encryption]\nkeys = [{ version = 1, file = \"/k1\" }, { version = 2, file = \"/k2\" }]\nblock_bytes = 4096\n",
    )
    .unwrap();
    let e = config.tenants[0].encryption.as_ref().unwrap();
    assert_eq!(e.keys.len(), 2);
    assert_eq!(e.block_bytes, Some(4096));
    let found = issues(
        "[[tenants]]\nname = \"a\"\ncontainer = \"c\"\n[tenants.encryption]\nkey_file = \"/k\"\nkey_version = 3\nblock_bytes = 5000\nprovider = \"rot13\"\n",
    );
    let keys: Vec<&str> = found.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        keys,
        ["tenants[0].encryption.key_version", "tenants[0].encryption.block_bytes", "tenants[0].encryption.provider"]
    );
}

#[test]
fn syntax_error_is_reported() {
    assert!(matches!(Config::parse("[agent"), Err(ParseError::Syntax(_))));
}

#[test]
fn identifiers() {
    assert!(check_identifier("team-a_1.x").is_ok());
    for bad in ["", ".hidden", "-x", "a/b", "a b", &"x".repeat(64)] {
        assert!(check_identifier(bad).is_err(), "{bad:?}");
    }
}
