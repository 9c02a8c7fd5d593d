use std::fs;
use std::os::unix::fs::PermissionsExt;

use rustls::pki_types::{ServerName, UnixTime};
use rustls::{ClientConnection, ServerConnection};

use super::*;

const TD: &str = "dpuio.test";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A certificate signed by `ca` with arbitrary SANs, for identity edge cases that
/// `issue_client` refuses to make.
fn cert_with_sans(ca: &CertificateAuthority, sans: Vec<SanType>) -> Vec<u8> {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names = sans;
    params.signed_by(&key, &ca.issuer).unwrap().der().to_vec()
}

fn uri(s: &str) -> SanType {
    SanType::URI(s.to_owned().try_into().unwrap())
}

#[test]
fn create_then_load() {
    let dir = tempfile::tempdir().unwrap();
    let pki_dir = dir.path().join("pki");
    let pki = DevPki::load_or_create(&pki_dir, TD, &["agent.example.org", "10.1.2.3"]).unwrap();
    assert_eq!(pki.server_status(), &ServerCertStatus::Created);
    assert_eq!(mode(&pki_dir), 0o700);
    assert_eq!(mode(&pki_dir.join(CA_KEY_FILE)), 0o600);
    assert_eq!(mode(&pki_dir.join(SERVER_KEY_FILE)), 0o600);
    assert_eq!(mode(&pki_dir.join(CA_CERT_FILE)), 0o644);
    assert_eq!(mode(&pki_dir.join(SERVER_CERT_FILE)), 0o644);

    let server = parse_cert(pki.server().cert_der()).unwrap();
    let sans = cert_sans(&server);
    for want in ["localhost", "agent.example.org"] {
        assert!(sans.contains(&SanType::DnsName(want.try_into().unwrap())), "{want}");
    }
    for want in ["127.0.0.1", "::1", "10.1.2.3"] {
        assert!(sans.contains(&SanType::IpAddress(want.parse().unwrap())), "{want}");
    }
    assert!(server.verify_signature(Some(parse_cert(pki.ca().cert_der()).unwrap().public_key())).is_ok());

    let again = DevPki::load_or_create(&pki_dir, TD, &["agent.example.org", "10.1.2.3"]).unwrap();
    assert_eq!(again.server_status(), &ServerCertStatus::Loaded);
    assert_eq!(again.ca().cert_pem(), pki.ca().cert_pem());
    assert_eq!(again.server().cert_pem(), pki.server().cert_pem());
    assert_eq!(again.server().key_pem(), pki.server().key_pem());
    // A subset of the names is still covered.
    let subset = DevPki::load_or_create(&pki_dir, TD, &["10.1.2.3"]).unwrap();
    assert_eq!(subset.server_status(), &ServerCertStatus::Loaded);
}

#[test]
fn server_cert_is_remade_when_missing_or_insufficient() {
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::load_or_create(dir.path(), TD, &[]).unwrap();
    let ca_pem = pki.ca().cert_pem().to_owned();

    fs::remove_file(dir.path().join(SERVER_CERT_FILE)).unwrap();
    let again = DevPki::load_or_create(dir.path(), TD, &[]).unwrap();
    assert!(matches!(again.server_status(), ServerCertStatus::Renewed { .. }));
    assert_eq!(again.ca().cert_pem(), ca_pem);

    fs::remove_file(dir.path().join(SERVER_CERT_FILE)).unwrap();
    fs::remove_file(dir.path().join(SERVER_KEY_FILE)).unwrap();
    let again = DevPki::load_or_create(dir.path(), TD, &[]).unwrap();
    assert_eq!(again.server_status(), &ServerCertStatus::Created);

    let wider = DevPki::load_or_create(dir.path(), TD, &["new.example.org"]).unwrap();
    match wider.server_status() {
        ServerCertStatus::Renewed { reason } => assert!(reason.contains("new.example.org"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(wider.ca().cert_pem(), ca_pem);

    // A server certificate from another CA is replaced.
    let other = tempfile::tempdir().unwrap();
    DevPki::load_or_create(other.path(), TD, &[]).unwrap();
    for file in [SERVER_CERT_FILE, SERVER_KEY_FILE] {
        fs::copy(other.path().join(file), dir.path().join(file)).unwrap();
    }
    let fixed = DevPki::load_or_create(dir.path(), TD, &[]).unwrap();
    match fixed.server_status() {
        ServerCertStatus::Renewed { reason } => assert!(reason.contains("not signed by this CA"), "{reason}"),
        other => panic!("{other:?}"),
    }

    // Garbage in server.pem is replaced too.
    fs::write(dir.path().join(SERVER_CERT_FILE), "not a certificate").unwrap();
    let fixed = DevPki::load_or_create(dir.path(), TD, &[]).unwrap();
    assert!(matches!(fixed.server_status(), ServerCertStatus::Renewed { .. }));
}

#[test]
fn readable_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    DevPki::load_or_create(dir.path(), TD, &[]).unwrap();
    for file in [CA_KEY_FILE, SERVER_KEY_FILE] {
        let path = dir.path().join(file);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let err = DevPki::load_or_create(dir.path(), TD, &[]).err().expect("must refuse");
        assert!(matches!(err, PkiError::KeyPermissions { mode: 0o640, .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains(file) && message.contains("chmod 600"), "{message}");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    }
    // The server key was not regenerated over: still the same after fixing the mode.
    DevPki::load_or_create(dir.path(), TD, &[]).unwrap();
}

#[test]
fn incomplete_or_mismatched_ca_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    DevPki::load_or_create(dir.path(), TD, &[]).unwrap();
    let key = fs::read(dir.path().join(CA_KEY_FILE)).unwrap();
    fs::remove_file(dir.path().join(CA_KEY_FILE)).unwrap();
    let err = DevPki::load_or_create(dir.path(), TD, &[]).err().unwrap();
    assert!(matches!(err, PkiError::IncompleteCa { .. }), "{err}");

    // Another CA's key next to this CA's certificate.
    let other = tempfile::tempdir().unwrap();
    DevPki::load_or_create(other.path(), TD, &[]).unwrap();
    fs::copy(other.path().join(CA_KEY_FILE), dir.path().join(CA_KEY_FILE)).unwrap();
    let err = DevPki::load_or_create(dir.path(), TD, &[]).err().unwrap();
    assert!(matches!(err, PkiError::KeyMismatch { .. }), "{err}");

    files::write_secret(&dir.path().join(CA_KEY_FILE), b"garbage").unwrap();
    let err = DevPki::load_or_create(dir.path(), TD, &[]).err().unwrap();
    assert!(matches!(err, PkiError::InvalidPem { .. }), "{err}");

    files::write_secret(&dir.path().join(CA_KEY_FILE), &key).unwrap();
    DevPki::load_or_create(dir.path(), TD, &[]).unwrap();
}

#[test]
fn bad_arguments_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for td in ["", "Upper.case", "a/b", "spiffe://x"] {
        let err = DevPki::load_or_create(dir.path(), td, &[]).err().unwrap();
        assert!(matches!(err, PkiError::BadTrustDomain { .. }), "{td:?}: {err}");
    }
    for name in ["", "a b", "-x.example", "x..y"] {
        let err = DevPki::load_or_create(dir.path(), TD, &[name]).err().unwrap();
        assert!(matches!(err, PkiError::BadServerName { .. }), "{name:?}: {err}");
    }
    // Nothing was written for refused arguments.
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);

    let pki = DevPki::load_or_create(dir.path(), TD, &[]).unwrap();
    let out = dir.path().join("c");
    assert!(matches!(pki.issue_client("acme", &out, 0), Err(PkiError::BadValidity { days: 0 })));
    assert!(matches!(pki.issue_client("acme", &out, MAX_CLIENT_VALIDITY_DAYS + 1), Err(PkiError::BadValidity { .. })));
    assert!(matches!(pki.issue_client("../etc", &out, 1), Err(PkiError::BadTenant(_))));
    assert!(matches!(issue_admin(pki.ca(), "BAD", &out, 1), Err(PkiError::BadTrustDomain { .. })));
}

#[test]
fn client_bundle_and_identity() {
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::load_or_create(&dir.path().join("pki"), TD, &[]).unwrap();
    let out = dir.path().join("clients/acme");
    let bundle = pki.issue_client("acme", &out, 30).unwrap();
    assert_eq!(bundle.spiffe_id(), "spiffe://dpuio.test/tenant/acme");
    assert_eq!(bundle.identity(), &Identity::Tenant("acme".into()));
    assert_eq!(mode(&out.join(CLIENT_KEY_FILE)), 0o600);
    assert_eq!(mode(&out.join(CLIENT_CERT_FILE)), 0o644);
    assert_eq!(fs::read_to_string(out.join(CA_CERT_FILE)).unwrap(), pki.ca().cert_pem());
    assert_eq!(fs::read_to_string(out.join(CLIENT_CERT_FILE)).unwrap(), bundle.cert().cert_pem());

    let der = CertificateDer::from_pem_file(out.join(CLIENT_CERT_FILE)).unwrap();
    assert_eq!(identity_from_cert_der(&der, TD).unwrap(), Identity::Tenant("acme".into()));
    assert_eq!(identity_from_peer_certs(std::slice::from_ref(&der), TD).unwrap(), Identity::Tenant("acme".into()));
    assert_eq!(identity_from_peer_certs(&[], TD), Err(IdentityError::NoPeerCertificate));

    let cert = parse_cert(&der).unwrap();
    let days = (cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp()) / 86_400;
    assert_eq!(days, 30, "30 days plus the one-hour backdate, rounded down");

    let admin = pki.issue_admin(&dir.path().join("admin"), 1).unwrap();
    assert_eq!(admin.spiffe_id(), "spiffe://dpuio.test/admin");
    assert_eq!(identity_from_cert_der(admin.cert().cert_der(), TD).unwrap(), Identity::Admin);
    assert_eq!(Identity::Admin.tenant_name(), None);
    assert_eq!(Identity::Tenant("x".into()).to_string(), "tenant x");
}

#[test]
fn identity_errors_are_precise() {
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::load_or_create(dir.path(), TD, &[]).unwrap();
    let ca = pki.ca();

    // Another trust domain, same CA.
    let foreign = issue_client(ca, "acme", "other.test", &dir.path().join("f"), 1).unwrap();
    assert_eq!(
        identity_from_cert_der(foreign.cert().cert_der(), TD),
        Err(IdentityError::WrongTrustDomain { expected: TD.into(), found: "other.test".into() })
    );
    // The server certificate has DNS and IP SANs but no URI.
    assert_eq!(identity_from_cert_der(pki.server().cert_der(), TD), Err(IdentityError::NoUriSan));
    assert_eq!(identity_from_cert_der(&cert_with_sans(ca, vec![]), TD), Err(IdentityError::NoUriSan));
    let two = cert_with_sans(ca, vec![uri("spiffe://dpuio.test/tenant/a"), uri("spiffe://dpuio.test/tenant/b")]);
    assert_eq!(identity_from_cert_der(&two, TD), Err(IdentityError::SeveralUriSans { count: 2 }));
    for (id, want) in [
        ("https://dpuio.test/tenant/a", "NotSpiffe"),
        ("SPIFFE://dpuio.test/tenant/a", "NotSpiffe"),
        ("spiffe://dpuio.test", "MalformedPath"),
        ("spiffe://dpuio.test/", "MalformedPath"),
        ("spiffe://dpuio.test/tenant", "MalformedPath"),
        ("spiffe://dpuio.test/tenant/a/b", "MalformedPath"),
        ("spiffe://dpuio.test/admin/x", "MalformedPath"),
        ("spiffe://dpuio.test/user/a", "MalformedPath"),
        ("spiffe://dpuio.test/tenant/", "BadTenantName"),
        ("spiffe://dpuio.test/tenant/.hidden", "BadTenantName"),
        ("spiffe://dpuio.test/tenant/a%2Fb", "BadTenantName"),
        ("spiffe://dpuio.test/tenant/a?x=1", "BadTenantName"),
        ("spiffe://dpuio.test.evil/tenant/a", "WrongTrustDomain"),
        ("spiffe://evil/dpuio.test/tenant/a", "WrongTrustDomain"),
    ] {
        let err = identity_from_cert_der(&cert_with_sans(ca, vec![uri(id)]), TD).unwrap_err();
        assert!(format!("{err:?}").starts_with(want), "{id}: {err:?}");
    }
    // Not a certificate at all, or with trailing bytes.
    for bad in [&b""[..], b"garbage", &[0x30, 0x82, 0xff, 0xff]] {
        assert!(matches!(identity_from_cert_der(bad, TD), Err(IdentityError::NotACertificate { .. })));
    }
    let mut trailing = pki.server().cert_der().to_vec();
    trailing.push(0);
    assert!(matches!(identity_from_cert_der(&trailing, TD), Err(IdentityError::NotACertificate { .. })));
    // Never panics on arbitrary bytes.
    let der = foreign.cert().cert_der().to_vec();
    for i in 0..der.len() {
        let mut mutated = der.clone();
        mutated[i] ^= 0x5a;
        let _ = identity_from_cert_der(&mutated, TD);
        let _ = identity_from_cert_der(&der[..i], TD);
    }
}

#[test]
fn webpki_verifier_accepts_our_clients_only() {
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::load_or_create(&dir.path().join("a"), TD, &[]).unwrap();
    let other = DevPki::load_or_create(&dir.path().join("b"), TD, &[]).unwrap();
    let ours = pki.issue_client("acme", &dir.path().join("ours"), 1).unwrap();
    let theirs = other.issue_client("acme", &dir.path().join("theirs"), 1).unwrap();

    let verifier = client_verifier(pki.ca().cert_pem(), provider()).unwrap();
    assert!(verifier.client_auth_mandatory());
    verifier.verify_client_cert(ours.cert().cert_der(), &[], UnixTime::now()).unwrap();
    // Same tenant, same trust domain, same SPIFFE ID: only the chain tells them apart.
    assert_eq!(identity_from_cert_der(theirs.cert().cert_der(), TD).unwrap(), Identity::Tenant("acme".into()));
    let err = verifier.verify_client_cert(theirs.cert().cert_der(), &[], UnixTime::now()).unwrap_err();
    assert!(matches!(err, rustls::Error::InvalidCertificate(_)), "{err:?}");
    // A server certificate lacks the clientAuth EKU.
    assert!(verifier.verify_client_cert(pki.server().cert_der(), &[], UnixTime::now()).is_err());
    // Expired: check at a time after the certificate's end.
    let later = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        (OffsetDateTime::now_utc() + Duration::days(2)).unix_timestamp() as u64,
    ));
    assert!(verifier.verify_client_cert(ours.cert().cert_der(), &[], later).is_err());

    assert!(matches!(client_verifier("", provider()), Err(PkiError::Tls { .. })));
}

/// Run a TLS handshake between two in-memory connections.
fn handshake(client: &mut ClientConnection, server: &mut ServerConnection) -> Result<(), rustls::Error> {
    let mut buf = Vec::new();
    for _ in 0..10 {
        buf.clear();
        client.write_tls(&mut buf).unwrap();
        let mut slice = &buf[..];
        while !slice.is_empty() {
            server.read_tls(&mut slice).unwrap();
            server.process_new_packets()?;
        }
        buf.clear();
        server.write_tls(&mut buf).unwrap();
        let mut slice = &buf[..];
        while !slice.is_empty() {
            client.read_tls(&mut slice).unwrap();
            client.process_new_packets()?;
        }
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(());
        }
    }
    panic!("handshake did not finish");
}

#[test]
fn mtls_handshake_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let pki = DevPki::load_or_create(&dir.path().join("pki"), TD, &[]).unwrap();
    let server_config = Arc::new(pki.server_config(provider()).unwrap());
    let bundle = pki.issue_client("acme", &dir.path().join("acme"), 1).unwrap();

    let mut client = ClientConnection::new(
        Arc::new(bundle.client_config(provider()).unwrap()),
        ServerName::try_from("localhost").unwrap(),
    )
    .unwrap();
    let mut server = ServerConnection::new(server_config.clone()).unwrap();
    handshake(&mut client, &mut server).unwrap();
    assert_eq!(server.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_3));
    assert_eq!(server.alpn_protocol(), Some(&b"h2"[..]));
    let peer = server.peer_certificates().unwrap();
    assert_eq!(identity_from_peer_certs(peer, TD).unwrap(), Identity::Tenant("acme".into()));

    // A client of another CA is rejected by the server during the handshake.
    let other = DevPki::load_or_create(&dir.path().join("other"), TD, &[]).unwrap();
    let stranger = other.issue_client("acme", &dir.path().join("stranger"), 1).unwrap();
    let mut stranger_config = stranger.client_config(provider()).unwrap();
    // Let the stranger trust our server, so that only client authentication can fail.
    stranger_config = {
        let mut roots = pki.ca().root_store();
        roots.add(other.ca().cert_der().clone()).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![stranger.cert().cert_der().clone()], stranger.cert().private_key_der())
            .unwrap();
        config.alpn_protocols = stranger_config.alpn_protocols;
        config
    };
    let mut client =
        ClientConnection::new(Arc::new(stranger_config), ServerName::try_from("127.0.0.1").unwrap()).unwrap();
    let mut server = ServerConnection::new(server_config.clone()).unwrap();
    let err = handshake(&mut client, &mut server).unwrap_err();
    assert!(matches!(err, rustls::Error::InvalidCertificate(_)), "{err:?}");

    // A client without a certificate is rejected too.
    let anonymous = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(pki.ca().root_store())
        .with_no_client_auth();
    let mut client = ClientConnection::new(Arc::new(anonymous), ServerName::try_from("::1").unwrap()).unwrap();
    let mut server = ServerConnection::new(server_config).unwrap();
    assert!(handshake(&mut client, &mut server).is_err());
}
