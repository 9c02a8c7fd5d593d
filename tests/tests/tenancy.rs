//! Tenant isolation end to end: with tenant A's identity, every namespace call and
//! data-plane entry against tenant B's files, handles, sessions and tokens is refused,
//! and B's data is unchanged byte for byte; delegated tokens never do more than their
//! parent; certificates from another CA or none at all are UNAUTHENTICATED; a tenant
//! removed at run time loses its sessions at once and keeps its data.
//!
//! Each tenant has a container of its own: two trees of the local backend, or, with
//! `DPUIO_TEST_BACKEND=daos`, two DAOS containers of one pool (see
//! [`StorageUnderTest`]). Every test here runs on both, also those about certificates
//! and tokens only: they cost a container each and show that attaching works the same.

use std::path::Path;
use std::time::Duration;

use dpuio_proto::v1 as pb;
use dpuio_shim::{Access, Client, ConnectOptions, DataPlaneOptions, IoStatus, RegionAccess, TlsOptions};
use dpuio_tests::{AgentProcess, StorageUnderTest, ok_stdout};
use tonic::Code;

struct Setup {
    _dir: tempfile::TempDir,
    agent: AgentProcess,
    certs: std::path::PathBuf,
    /// After `agent`: the agent is gone before the containers are destroyed.
    storage: StorageUnderTest,
}

/// An agent with tenants "a" and "b", each in its own container.
fn start_two_tenants(test: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let storage = StorageUnderTest::new(test, &data_dir);
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "{}[[tenants]]\nname = \"a\"\ncontainer = \"{}\"\n{}[[tenants]]\nname = \"b\"\ncontainer = \"{}\"\n{}",
            storage.backend_config(),
            storage.container("a"),
            storage.tenant_settings("a"),
            storage.container("b"),
            storage.tenant_settings("b")
        ),
    )
    .unwrap();
    let agent = AgentProcess::start(&data_dir, &["--config", config.to_str().unwrap()]);
    let certs = dir.path().join("certs");
    for t in ["a", "b"] {
        let out_dir = certs.join(t);
        ok_stdout(&agent.dpuctl(&["cert", "issue", "--tenant", t, "--out", out_dir.to_str().unwrap()]));
    }
    Setup { _dir: dir, agent, certs, storage }
}

impl Setup {
    fn options(&self, tenant: &str) -> ConnectOptions {
        ConnectOptions {
            agent: self.agent.url(),
            tls: TlsOptions::bundle(self.certs.join(tenant)),
            data_plane: Some(DataPlaneOptions { transports: "shm".into(), rings: 1, ..Default::default() }),
            ..ConnectOptions::default()
        }
    }

    async fn client(&self, tenant: &str) -> Client {
        Client::connect(self.options(tenant)).await.unwrap_or_else(|e| panic!("attach as {tenant}: {e}"))
    }

    async fn channel(&self, bundle: &Path) -> tonic::transport::Channel {
        self.agent.channel_with(bundle).await
    }
}

fn code<T>(r: dpuio_shim::Result<T>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(e) => e.code().unwrap_or(Code::Unknown),
    }
}

#[tokio::test]
async fn tenant_a_cannot_reach_tenant_b() {
    let s = start_two_tenants("ten-matrix");
    let b = s.client("b").await;
    b.mkdir("/secret", false).await.unwrap();
    let region = b.register_region(1 << 20, RegionAccess::ReadWrite).await.unwrap();
    let file = b.create("/secret/data.bin", true).await.unwrap();
    assert_eq!(file.write_at(&region, 1 << 20, 0).unwrap(), 1 << 20);
    file.sync().await.unwrap();
    let before = s.storage.snapshot("b");
    assert!(before.contains_key("secret/data.bin"), "{:?}", before.keys());

    let a = s.client("a").await;
    // By path, in A's own namespace: B's paths do not exist there, and escapes are
    // refused, also by the name B's container has in the storage (a DAOS label).
    let cb = s.storage.container("b");
    let tricks = [
        "/secret/data.bin".to_owned(),
        format!("/../{cb}/secret/data.bin"),
        format!("/secret/../../{cb}/secret/data.bin"),
        format!("../{cb}/secret/data.bin"),
        "/..".to_owned(),
        format!("/%2e%2e/{cb}/secret/data.bin"),
        format!("//{cb}/secret/data.bin"),
        format!("/./../{cb}"),
        "/secret/data.bin\0".to_owned(),
        format!("{cb}/secret/data.bin"),
    ];
    for path in &tricks {
        let path = path.as_str();
        for (what, c) in [
            ("stat", code(a.stat(path).await)),
            ("open", code(a.open(path, Access::ReadOnly).await)),
            ("open rw", code(a.open(path, Access::ReadWrite).await)),
            ("remove", code(a.remove(path, true).await)),
            ("truncate", code(a.truncate(path, 0).await)),
            ("rename", code(a.rename(path, "/stolen").await)),
            ("readdir", code(a.readdir(path).await)),
        ] {
            assert!(matches!(c, Code::NotFound | Code::InvalidArgument), "A's {what} of {path:?} answered {c:?}");
        }
        let looked = a.lookup(&[path.to_owned()]).await.unwrap();
        assert!(looked[0].is_err(), "lookup {path:?}");
    }

    // B's container by name, B's session id, B's handle.
    let channel = s.channel(&s.certs.join("a")).await;
    let mut ns = pb::namespace_client::NamespaceClient::new(channel.clone());
    let mut sessions = pb::session_client::SessionClient::new(channel.clone());
    let mut memory = pb::memory_client::MemoryClient::new(channel);
    let e = ns.mount(pb::MountRequest { session_id: a.session_id(), container: cb.clone() }).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let sid = b.session_id();
    let path = || Some(pb::stat_request::Target::Path("/secret/data.bin".into()));
    let refused = [
        ns.stat(pb::StatRequest { session_id: sid, target: path() }).await.map(|_| ()),
        ns.open(pb::OpenRequest { session_id: sid, path: "/secret/data.bin".into(), ..Default::default() })
            .await
            .map(|_| ()),
        ns.remove(pb::RemoveRequest { session_id: sid, path: "/secret".into(), recursive: true }).await.map(|_| ()),
        ns.mount(pb::MountRequest { session_id: sid, container: String::new() }).await.map(|_| ()),
        ns.close(pb::CloseRequest { session_id: sid, handle: file.handle() }).await.map(|_| ()),
        sessions.keep_alive(pb::KeepAliveRequest { session_id: sid }).await.map(|_| ()),
        sessions.delegate(pb::DelegateRequest { session_id: sid, ..Default::default() }).await.map(|_| ()),
        sessions.detach(pb::DetachRequest { session_id: sid }).await.map(|_| ()),
        memory
            .deregister_region(pb::DeregisterRegionRequest { session_id: sid, region_id: region.id() })
            .await
            .map(|_| ()),
    ];
    for (i, r) in refused.into_iter().enumerate() {
        let e = r.expect_err("B's session used with A's certificate");
        assert_eq!(e.code(), Code::FailedPrecondition, "call {i}: {e:?}");
        assert!(e.message().contains("not attached"), "call {i}: {}", e.message());
    }
    // B's handle in A's session, on the control plane and on the data plane.
    let e = ns
        .truncate(pb::TruncateRequest {
            session_id: a.session_id(),
            target: Some(pb::truncate_request::Target::Handle(file.handle())),
            size: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let a_region = a.register_region(1 << 20, RegionAccess::ReadWrite).await.unwrap();
    let mine = a.create("/mine", true).await.unwrap();
    for opcode in [dpuio_shim::Opcode::Read, dpuio_shim::Opcode::Write] {
        let mut request = mine.read_request(&a_region, 0, 4096, 0);
        request.opcode = opcode;
        request.handle = file.handle();
        let done = a.submit(vec![request]).await.unwrap();
        assert_eq!(done[0].result, Err(IoStatus::BadHandle), "{opcode:?} through B's handle");
    }

    // B's token, presented by A.
    let (b_token, _) = b.delegate("", &[], 0).await.unwrap();
    let stolen =
        Client::connect(ConnectOptions { capability_token: b_token, data_plane: None, ..s.options("a") }).await;
    let e = stolen.err().unwrap_or_else(|| panic!("A attaching with B's token"));
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    assert!(e.to_string().contains("tenant \"b\""), "{e}");
    // A asking to attach as B.
    let e = sessions
        .attach(pb::AttachRequest { tenant: "b".into(), ..Default::default() })
        .await
        .expect_err("A attaching as B");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    assert_eq!(s.storage.snapshot("b"), before, "B's data changed");
    assert_eq!(file.read_at(&region, 0).unwrap(), 1 << 20, "B still reads its file");
    // What A made went into A's container, and nothing of B's did.
    let a_stored = s.storage.snapshot("a");
    assert_eq!(a_stored.keys().collect::<Vec<_>>(), ["mine"], "A's container");
}

#[tokio::test]
async fn bad_certificates_and_tokens_are_unauthenticated() {
    let s = start_two_tenants("ten-certs");
    let a = s.client("a").await;

    // A certificate for tenant "a" from another CA (same trust domain, same name).
    let foreign = tempfile::tempdir().unwrap();
    let pki = dpuio_auth::pki::DevPki::load_or_create(&foreign.path().join("ca"), "dpuio.local", &[]).unwrap();
    pki.issue_client("a", &foreign.path().join("a"), 1).unwrap();
    let e = Client::connect(ConnectOptions {
        tls: TlsOptions {
            cert: Some(foreign.path().join("a/client.pem")),
            key: Some(foreign.path().join("a/client.key")),
            ca: Some(s.certs.join("a/ca.pem")),
            ..TlsOptions::default()
        },
        data_plane: None,
        ..s.options("a")
    })
    .await
    .err()
    .unwrap_or_else(|| panic!("a certificate from another CA"));
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    assert!(e.to_string().contains("not trusted"), "{e}");

    // No client certificate at all.
    let channel = {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(std::fs::read(s.certs.join("a/ca.pem")).unwrap()))
            .domain_name("127.0.0.1");
        Endpoint::from_shared(format!("https://{}", s.agent.addr)).unwrap().tls_config(tls).unwrap().connect().await
    }
    .unwrap();
    let e = pb::session_client::SessionClient::new(channel)
        .attach(pb::AttachRequest::default())
        .await
        .expect_err("no client certificate");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("no client certificate"), "{}", e.message());

    // Plaintext against the TLS listener does not get anywhere.
    let plain = Client::connect(ConnectOptions { agent: format!("http://{}", s.agent.addr), ..s.options("a") }).await;
    assert!(plain.is_err());

    // Tokens: altered signature, truncated, garbage, expired.
    let (token, _) = a.delegate("", &["read".into()], 0).await.unwrap();
    let mut altered = token.clone().into_bytes();
    let i = altered.len() - 10;
    altered[i] = if altered[i] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    let truncated = token[..token.len() - 40].to_owned();
    let (short, _) = a.delegate("", &[], 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    for (what, t) in
        [("altered", altered), ("truncated", truncated), ("garbage", "not-a-token".into()), ("expired", short)]
    {
        let e = Client::connect(ConnectOptions { capability_token: t, data_plane: None, ..s.options("a") })
            .await
            .err()
            .unwrap_or_else(|| panic!("{what} token accepted"));
        assert_eq!(e.code(), Some(Code::Unauthenticated), "{what}: {e}");
    }
}

#[tokio::test]
async fn a_delegated_token_never_does_more_than_its_parent() {
    let s = start_two_tenants("ten-delegate");
    let parent = s.client("a").await;
    parent.mkdir("/data", false).await.unwrap();
    let region = parent.register_region(1 << 16, RegionAccess::ReadWrite).await.unwrap();
    let f = parent.create("/data/x", true).await.unwrap();
    f.write_at(&region, 4096, 0).unwrap();
    f.close().await.unwrap();
    parent.create("/outside", true).await.unwrap().close().await.unwrap();

    let (token, expires) = parent.delegate("/data", &["read".into()], 60).await.unwrap();
    let child = Client::connect(ConnectOptions { capability_token: token.clone(), ..s.options("a") }).await.unwrap();
    // What it may do: read under /data, on both planes.
    let x = child.open("/data/x", Access::ReadOnly).await.unwrap();
    let child_region = child.register_region(1 << 16, RegionAccess::ReadWrite).await.unwrap();
    assert_eq!(x.read_at(&child_region, 0).unwrap(), 4096);
    assert_eq!(child.readdir("/data").await.unwrap().len(), 1);
    // What it may not: write, create, delete, or anything outside /data.
    for (what, c) in [
        ("create", code(child.create("/data/y", false).await)),
        ("open rw", code(child.open("/data/x", Access::ReadWrite).await)),
        ("mkdir", code(child.mkdir("/data/d", false).await)),
        ("remove", code(child.remove("/data/x", false).await)),
        ("rename", code(child.rename("/data/x", "/data/z").await)),
        ("truncate", code(child.truncate("/data/x", 0).await)),
        ("stat outside", code(child.stat("/outside").await)),
        ("open outside", code(child.open("/outside", Access::ReadOnly).await)),
        ("list root", code(child.readdir("/").await)),
    ] {
        assert_eq!(c, Code::PermissionDenied, "the read-only /data delegate could {what}");
    }
    // A data-plane write through the read-only handle.
    let done = child.submit(vec![x.write_request(&child_region, 0, 4096, 0)]).await.unwrap();
    assert_eq!(done[0].result, Err(IoStatus::Access));
    // Widening a delegation: a wider prefix, more operations, a longer life.
    for (what, prefix, ops, life) in
        [("prefix", "/", vec![], 0), ("write", "", vec!["write".to_owned()], 0), ("lifetime", "", vec![], 3600)]
    {
        let e = child.delegate(prefix, &ops, life).await.err().unwrap_or_else(|| panic!("widened {what}"));
        assert_eq!(e.code(), Some(Code::PermissionDenied), "{what}: {e}");
    }
    // A narrower grandchild is fine, and its expiry is within the parent's.
    let (_, grandchild_expires) = child.delegate("/data/x", &[], 30).await.unwrap();
    assert!(grandchild_expires <= expires);
    // Bad requests.
    assert_eq!(code(parent.delegate("", &["fly".into()], 0).await), Code::InvalidArgument);
    assert_eq!(code(parent.delegate("/../etc", &[], 0).await), Code::InvalidArgument);
}

/// A whole-file put needs create and write in the target's directory and nothing more:
/// a token without delete publishes its temporary file, a read-only one is refused
/// before anything is written, and the replacing rename of anything but a put's own
/// temporary file still needs delete on the source.
#[tokio::test]
async fn a_put_needs_the_rights_of_a_put_and_no_more() {
    let s = start_two_tenants("ten-put");
    let parent = s.client("a").await;
    parent.mkdir("/data", false).await.unwrap();
    parent.put_bytes("/data/model", b"old").await.unwrap();
    parent.put_bytes("/data/other", b"other").await.unwrap();

    let (writer, _) = parent.delegate("/data", &["create".into(), "write".into(), "read".into()], 60).await.unwrap();
    let writer = Client::connect(ConnectOptions { capability_token: writer, ..s.options("a") }).await.unwrap();
    assert_eq!(writer.put_bytes("/data/model", b"new contents").await.unwrap(), 12);
    assert_eq!(parent.read_file("/data/model").unwrap(), b"new contents");
    let names: Vec<String> = parent.readdir("/data").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["model", "other"], "no temporary file is left");
    // The exception is for a put's own temporary file only.
    assert_eq!(code(writer.rename_replace("/data/other", "/data/model").await), Code::PermissionDenied);
    let stray = ".other.dpuio-put.0123";
    writer.create(&format!("/data/{stray}"), true).await.unwrap().close().await.unwrap();
    assert_eq!(code(writer.rename_replace(&format!("/data/{stray}"), "/data/model").await), Code::PermissionDenied);
    parent.remove(&format!("/data/{stray}"), false).await.unwrap();
    assert_eq!(parent.read_file("/data/model").unwrap(), b"new contents");

    let (reader, _) = parent.delegate("/data", &["read".into()], 60).await.unwrap();
    let reader = Client::connect(ConnectOptions { capability_token: reader, ..s.options("a") }).await.unwrap();
    let e = reader.put_bytes("/data/model", b"x").await.expect_err("a read-only token put a file");
    assert_eq!(e.code(), Some(Code::PermissionDenied), "{e}");
    assert!(e.to_string().contains("create its temporary file"), "{e}");
    // A token scoped to the file alone does not reach the temporary name beside it.
    let (single, _) = parent.delegate("/data/model", &[], 60).await.unwrap();
    let single = Client::connect(ConnectOptions { capability_token: single, ..s.options("a") }).await.unwrap();
    let e = single.put_bytes("/data/model", b"x").await.expect_err("a put outside the token's prefix");
    assert!(e.to_string().contains("needs create and write in the directory of /data/model"), "{e}");
    assert_eq!(parent.read_file("/data/model").unwrap(), b"new contents");
}

#[tokio::test]
async fn removing_a_tenant_detaches_its_sessions_and_keeps_its_data() {
    let s = start_two_tenants("ten-remove");
    let b = s.client("b").await;
    b.create("/kept", true).await.unwrap().close().await.unwrap();
    let a = s.client("a").await;
    let out = ok_stdout(&s.agent.dpuctl(&["tenant", "rm", "b"]));
    assert!(out.contains("1 session(s) detached"), "{out}");
    let e = b.stat("/kept").await.expect_err("B's session after removal");
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    let e = Client::connect(s.options("b")).await.err().unwrap_or_else(|| panic!("B attaching after removal"));
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    assert!(s.storage.snapshot("b").contains_key("kept"), "B's data stays in its container");
    a.stat("/").await.expect("A is unaffected");

    // Added back at run time, B sees its data again.
    ok_stdout(&s.agent.dpuctl(&["tenant", "add", "b", "--container", &s.storage.container("b")]));
    let b = s.client("b").await;
    b.stat("/kept").await.unwrap();
    let sessions = ok_stdout(&s.agent.dpuctl(&["sessions", "--tenant", "b"]));
    assert_eq!(sessions.lines().count(), 2, "{sessions}");
    // Bad admin requests get clear errors.
    let out = s.agent.dpuctl(&["tenant", "add", "c", "--container", &s.storage.container("a")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("belongs to tenant \"a\""));
    let out = s.agent.dpuctl(&["tenant", "add", "bad name"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("may only contain"), "{out:?}");
    let out = s.agent.dpuctl(&["tenant", "rm", "nobody"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not configured"), "{out:?}");
}
