//! The control plane end to end: a real `dpu-agent` driven through the shim library
//! and through raw gRPC, including every kind of bad request.

use dpuio_proto::v1 as pb;
use dpuio_shim::{Access, Client, ConnectOptions, EntryKind};
use dpuio_tests::AgentProcess;
use tonic::Code;

async fn client(agent: &AgentProcess) -> Client {
    Client::connect(ConnectOptions {
        agent: agent.url(),
        tls: agent.tls(),
        client_name: "e2e".into(),
        ..ConnectOptions::default()
    })
    .await
    .expect("attach")
}

fn code<T: std::fmt::Debug>(r: dpuio_shim::Result<T>) -> (Code, String) {
    let e = r.expect_err("expected an error");
    (e.code().expect("an agent error"), e.to_string())
}

#[tokio::test]
async fn namespace_operations_and_their_errors() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    let c = client(&agent).await;
    assert_eq!(c.tenant(), "default");
    assert_eq!(c.container(), "default");
    assert!(c.chunk_bytes() > 0);

    c.mkdir("/a", false).await.unwrap();
    c.mkdir("/a/b/c", true).await.unwrap();
    c.mkdir("/a/b/c", true).await.unwrap(); // -p tolerates existing
    let (k, m) = code(c.mkdir("/a", false).await);
    assert_eq!(k, Code::AlreadyExists, "{m}");
    assert!(m.contains("/a"), "{m}");
    let (k, m) = code(c.mkdir("/missing/x", false).await);
    assert_eq!(k, Code::NotFound, "{m}");

    let f = c.create("/a/f", true).await.unwrap();
    f.truncate(4096).await.unwrap();
    assert_eq!(f.stat().await.unwrap().size, 4096);
    f.close().await.unwrap();
    let (k, _) = code(c.create("/a/f", true).await);
    assert_eq!(k, Code::AlreadyExists);

    let st = c.stat("/a/f").await.unwrap();
    assert_eq!((st.kind, st.size), (EntryKind::File, 4096));
    assert_eq!(c.stat("/a").await.unwrap().kind, EntryKind::Directory);

    // A read-only handle cannot change the file.
    let ro = c.open("/a/f", Access::ReadOnly).await.unwrap();
    let (k, m) = code(ro.truncate(0).await);
    assert_eq!(k, Code::PermissionDenied, "{m}");
    assert!(m.contains("read-only"), "{m}");
    ro.close().await.unwrap();
    let (k, _) = code(c.open("/a", Access::ReadOnly).await);
    assert_eq!(k, Code::FailedPrecondition);

    let names: Vec<String> = c.readdir("/a").await.unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["b", "f"]);

    c.rename("/a/f", "/a/g").await.unwrap();
    let (k, _) = code(c.stat("/a/f").await);
    assert_eq!(k, Code::NotFound);
    let (k, m) = code(c.rename("/a", "/a/b/inside").await);
    assert_eq!(k, Code::InvalidArgument, "{m}");
    c.mkdir("/z", false).await.unwrap();
    let (k, _) = code(c.rename("/a/g", "/z").await);
    assert_eq!(k, Code::AlreadyExists);

    let (k, m) = code(c.remove("/a", false).await);
    assert_eq!(k, Code::FailedPrecondition, "{m}");
    assert!(m.contains("not empty"), "{m}");
    c.remove("/a", true).await.unwrap();
    let (k, _) = code(c.stat("/a/b/c").await);
    assert_eq!(k, Code::NotFound);

    // Paths that are never valid are refused by name, before touching storage.
    for (bad, needle) in [("/x/../../etc", ".."), ("/./x", "."), ("", "empty"), ("/a\0b", "NUL")] {
        let (k, m) = code(c.stat(bad).await);
        assert_eq!(k, Code::InvalidArgument, "{bad:?}: {m}");
        assert!(m.contains(needle), "{bad:?}: {m}");
    }
    let long = format!("/{}", "n".repeat(256));
    let (k, m) = code(c.mkdir(&long, false).await);
    assert_eq!(k, Code::InvalidArgument, "{m}");

    // Batched lookup: each path gets its own answer.
    let results = c.lookup(&["/z".into(), "/nope".into(), "/../x".into()]).await.unwrap();
    assert_eq!(results[0].as_ref().unwrap().kind, EntryKind::Directory);
    assert_eq!(results[1].as_ref().unwrap_err().code(), Some(Code::NotFound));
    assert_eq!(results[2].as_ref().unwrap_err().code(), Some(Code::InvalidArgument));

    c.sync().await.unwrap();
    c.detach().await.unwrap();
}

#[tokio::test]
async fn readdir_streams_in_batches_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    let c = client(&agent).await;
    c.mkdir("/many", false).await.unwrap();
    // Files made directly in the backend tree: the listing, not creation, is under test.
    let root = dir.path().join("containers/default/many");
    for i in 0..3000 {
        std::fs::File::create(root.join(format!("f{i:05}"))).unwrap();
    }
    let mut batches = Vec::new();
    c.readdir_batches("/many", None, 256, |b| {
        batches.push(b.len());
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(batches.iter().sum::<usize>(), 3000);
    assert!(batches.iter().all(|&n| n <= 256), "{batches:?}");
    assert_eq!(batches.len(), 3000usize.div_ceil(256));

    let mut names = Vec::new();
    c.readdir_batches("/many", Some("f02990"), 0, |b| {
        names.extend(b.into_iter().map(|e| e.name));
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(names.len(), 9);
    assert_eq!(names.first().map(String::as_str), Some("f02991"));
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
}

#[tokio::test]
async fn forged_sessions_handles_and_containers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    let a = client(&agent).await;
    let b = client(&agent).await;
    let file = a.create("/secret", true).await.unwrap();

    let channel = agent.channel().await;
    let mut ns = pb::namespace_client::NamespaceClient::new(channel.clone());
    let mut sessions = pb::session_client::SessionClient::new(channel);

    // A session id nobody attached.
    let e = ns
        .stat(pb::StatRequest { session_id: 0x1234, target: Some(pb::stat_request::Target::Path("/".into())) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("not attached"), "{}", e.message());

    // A's handle used from B's session.
    let e = ns
        .truncate(pb::TruncateRequest {
            session_id: b.session_id(),
            target: Some(pb::truncate_request::Target::Handle(file.handle())),
            size: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // A container that is not the tenant's.
    let e = ns.mount(pb::MountRequest { session_id: b.session_id(), container: "other".into() }).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // An unknown tenant, and a session used after detach.
    let e = sessions.attach(pb::AttachRequest { tenant: "mallory".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let b_id = b.session_id();
    b.detach().await.unwrap();
    let e = ns
        .stat(pb::StatRequest { session_id: b_id, target: Some(pb::stat_request::Target::Path("/".into())) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);

    // A malformed request: no target.
    let e = ns.stat(pb::StatRequest { session_id: a.session_id(), target: None }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    file.close().await.unwrap();
}

#[tokio::test]
async fn limits_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        "[limits]\nmax_sessions = 2\nmax_handles_per_session = 2\nmax_lookup_paths = 4\nmax_message_bytes = 65536\n",
    )
    .unwrap();
    let agent = AgentProcess::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()]);
    let c = client(&agent).await;
    let _other = client(&agent).await;
    let third =
        Client::connect(ConnectOptions { agent: agent.url(), tls: agent.tls(), ..ConnectOptions::default() }).await;
    assert_eq!(third.err().and_then(|e| e.code()), Some(Code::ResourceExhausted));

    let _f1 = c.create("/1", true).await.unwrap();
    let _f2 = c.create("/2", true).await.unwrap();
    let (k, m) = code(c.create("/3", true).await);
    assert_eq!(k, Code::ResourceExhausted, "{m}");
    assert!(m.contains("open handles"), "{m}");

    // The library splits lookups to the agent's limit; a raw oversized call is refused.
    let paths: Vec<String> = (0..10).map(|i| format!("/{i}")).collect();
    assert_eq!(c.lookup(&paths).await.unwrap().len(), 10);
    let channel = agent.channel().await;
    let mut ns = pb::namespace_client::NamespaceClient::new(channel);
    let e = ns.lookup(pb::LookupRequest { session_id: c.session_id(), paths: paths.clone() }).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    // A message over max_message_bytes never reaches the service.
    let e = ns
        .lookup(pb::LookupRequest { session_id: c.session_id(), paths: vec!["/x".repeat(40_000)] })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
}
