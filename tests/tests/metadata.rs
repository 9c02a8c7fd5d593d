//! Metadata over the data plane end to end: stat, open/create/close, lookup, readdir,
//! remove and open-read travel as ring entries (over UCX shm, libfabric tcp and shm) and give
//! the same answers and the same errors, code and message, as the gRPC calls; handles
//! opened on the ring are the session's handles on both planes; a delegated token
//! limited to a prefix is enforced on the ring exactly as over gRPC; hostile metadata
//! entries are refused one by one.

use dpuio_proto::v1 as pb;
use dpuio_proto::wire;
use dpuio_shim::{Access, Client, ConnectOptions, DataPlaneOptions, IoStatus, RegionAccess};
use dpuio_tests::AgentProcess;

const TRANSPORTS: [&str; 3] = ["ucx-shm", "ofi-tcp", "ofi-shm"];

fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(7).wrapping_add(3) % 251) as u8
}

fn options(agent: &AgentProcess, transport: Option<&str>, token: &str) -> ConnectOptions {
    ConnectOptions {
        client_name: "e2e metadata".into(),
        data_plane: transport.map(|t| DataPlaneOptions {
            transports: t.into(),
            rings: 2,
            ..DataPlaneOptions::default()
        }),
        capability_token: token.to_owned(),
        ..agent.connect_options()
    }
}

/// The text of an error, which names the operation, the gRPC code and the message.
fn text<T: std::fmt::Debug>(r: dpuio_shim::Result<T>) -> String {
    r.expect_err("an error").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_over_the_ring_matches_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    let sample: Vec<u8> = (0..128 * 1024).map(pattern).collect();
    let big: Vec<u8> = (0..(1 << 20) + 12345).map(|i| pattern(i * 3)).collect();
    agent.seed_file("/data/sample", &sample);
    agent.seed_file("/data/big", &big);
    for i in 0..7 {
        agent.seed_file(&format!("/data/dir/f{i}"), &[i as u8; 10]);
    }
    agent.seed_file("/other/secret", b"no");
    let grpc = Client::connect(options(&agent, None, "")).await.unwrap();

    for transport in TRANSPORTS {
        let ring = Client::connect(options(&agent, Some(transport), "")).await.unwrap();
        // Stat by path, and errors identical to gRPC's (code and message).
        assert_eq!(ring.stat("/data/sample").await.unwrap(), grpc.stat("/data/sample").await.unwrap());
        assert_eq!(ring.stat("/").await.unwrap().kind, dpuio_shim::EntryKind::Directory);
        for bad in ["/data/missing", "/../etc", "relative//x", "", "/data/sample/below"] {
            assert_eq!(text(ring.stat(bad).await), text(grpc.stat(bad).await), "{transport}: stat {bad:?}");
        }
        // Open-read of a whole sample in one submission, into a Vec and into a region.
        assert_eq!(ring.read_file("/data/sample").unwrap(), sample, "{transport}");
        assert_eq!(ring.read_file("/data/big").unwrap(), big, "{transport}: larger than one answer");
        let mut region = ring.register_region(256 * 1024, RegionAccess::ReadWrite).await.unwrap();
        let (attr, n) = ring.read_sample("/data/sample", &region, 4096, 200 * 1024).unwrap();
        assert_eq!((attr.size, n), (sample.len() as u64, sample.len() as u64), "{transport}");
        let mut got = vec![0u8; sample.len()];
        region.read_at(4096 + 64, &mut got);
        assert_eq!(got, sample, "{transport}: read_sample bytes");
        assert_eq!(
            text(ring.read_file("/data/nope")),
            text(grpc.open("/data/nope", Access::ReadOnly).await).replace("open /data/nope", "read /data/nope")
        );
        // Open over the ring: an ordinary session handle (stat, read, close by gRPC).
        let f = ring.open("/data/sample", Access::ReadOnly).await.unwrap();
        assert_eq!(f.attr().size, sample.len() as u64);
        assert!(f.chunk_bytes() > 0);
        assert_eq!(f.stat().await.unwrap().size, sample.len() as u64);
        assert_eq!(f.read_at(&region, 0).unwrap(), sample.len() as u64);
        let mut ns = pb::namespace_client::NamespaceClient::new(agent.channel().await);
        ns.close(pb::CloseRequest { session_id: ring.session_id(), handle: f.handle() }).await.unwrap();
        let again = ns.close(pb::CloseRequest { session_id: ring.session_id(), handle: f.handle() }).await.unwrap_err();
        let ring_close = text(f.close().await);
        assert!(ring_close.contains(again.message()), "{transport}: {ring_close} vs {}", again.message());
        // A handle of another session is not found, as over gRPC.
        let other = grpc.open("/data/sample", Access::ReadOnly).await.unwrap();
        let stolen = pb::StatRequest {
            session_id: ring.session_id(),
            target: Some(pb::stat_request::Target::Handle(other.handle())),
        };
        let grpc_says = ns.stat(stolen).await.unwrap_err();
        let mut b = ring.batch().unwrap();
        let entry = wire::MetaSubmission {
            opcode: wire::MetaOpcode::StatHandle,
            flags: 0,
            user_data: 5,
            handle: other.handle(),
            request_region: 0,
            answer_region: region.id(),
            request_offset: 0,
            answer_offset: 0,
            request_length: 0,
            answer_length: 4096,
            arg: 0,
        };
        b.push_raw_entry(&entry.encode()).unwrap();
        b.submit().unwrap();
        let done = b.wait(1, std::time::Duration::from_secs(10)).unwrap();
        assert_eq!(done[0].result, Err(IoStatus::Refused));
        let mut rec = vec![0u8; 4096];
        region.read_at(0, &mut rec);
        let rec = wire::MetaError::decode(&rec).unwrap();
        assert_eq!(
            (rec.code.code, rec.message.as_str()),
            (grpc_says.code() as u16, grpc_says.message()),
            "{transport}"
        );
        // Hostile metadata entries: bad region, range, request bytes; the ring goes on.
        region.write_at(8192, &[3, 0, b'/', 0xff, b'x']);
        let utf8 = wire::MetaSubmission {
            opcode: wire::MetaOpcode::Stat,
            handle: 0,
            request_region: region.id(),
            request_offset: 8192,
            request_length: 5,
            ..entry
        };
        let cases = [
            (wire::MetaSubmission { answer_region: 9999, ..utf8 }, IoStatus::BadRegion),
            (wire::MetaSubmission { answer_offset: 256 * 1024 - 100, ..utf8 }, IoStatus::OutOfRange),
            (wire::MetaSubmission { request_length: 1 << 21, ..utf8 }, IoStatus::Malformed),
            (utf8, IoStatus::Refused),
        ];
        for (e, _) in &cases {
            b.push_raw_entry(&e.encode()).unwrap();
        }
        b.submit().unwrap();
        let done = b.wait(cases.len(), std::time::Duration::from_secs(10)).unwrap();
        let got: Vec<_> = done.iter().map(|d| d.result.err()).collect();
        assert_eq!(got, cases.iter().map(|c| Some(c.1)).collect::<Vec<_>>(), "{transport}");
        drop(b);
        other.close().await.unwrap();
        // Create, stat by handle, close on the ring; the file is there for gRPC.
        let c = ring.create(&format!("/data/new-{transport}"), true).await.unwrap();
        assert_eq!(c.stat().await.unwrap().size, 0);
        c.close().await.unwrap();
        let name = format!("/data/new-{transport}");
        assert_eq!(text(ring.create(&name, true).await), text(grpc.create(&name, true).await));
        // Readdir in small batches and lookup of many paths, as gRPC answers them.
        let mut batches = 0;
        let mut listed = Vec::new();
        ring.readdir_batches("/data/dir", None, 3, |b| {
            batches += 1;
            listed.extend(b);
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(batches, 3, "{transport}");
        assert_eq!(listed, grpc.readdir("/data/dir").await.unwrap(), "{transport}");
        assert_eq!(text(ring.readdir("/data/sample").await), text(grpc.readdir("/data/sample").await));
        let paths: Vec<String> =
            ["/data/sample", "/nope", "/data/dir/f3", "/../x", "/data"].iter().map(|s| s.to_string()).collect();
        let (r, g) = (ring.lookup(&paths).await.unwrap(), grpc.lookup(&paths).await.unwrap());
        assert_eq!(r.len(), g.len());
        for (r, g) in r.into_iter().zip(g) {
            match (r, g) {
                (Ok(r), Ok(g)) => assert_eq!(r, g),
                (Err(r), Err(g)) => assert_eq!(r.to_string(), g.to_string()),
                (r, g) => panic!("{transport}: ring {r:?}, gRPC {g:?}"),
            }
        }
        // Remove over the ring: the file is gone for gRPC; errors as gRPC gives them
        // (missing, a directory with entries, the root), and a tree with `recursive`.
        ring.remove(&name, false).await.unwrap();
        assert_eq!(text(grpc.stat(&name).await), text(ring.stat(&name).await));
        assert!(
            text(grpc.stat(&name).await).contains("NOT_FOUND") || text(grpc.stat(&name).await).contains("NotFound")
        );
        for (bad, recursive) in [(name.as_str(), false), ("/data/dir", false), ("/", true), ("/../x", false)] {
            assert_eq!(
                text(ring.remove(bad, recursive).await),
                text(grpc.remove(bad, recursive).await),
                "{transport}: remove {bad:?}"
            );
        }
        let tree = format!("/data/tree-{transport}");
        grpc.mkdir(&format!("{tree}/a/b"), true).await.unwrap();
        grpc.create(&format!("{tree}/a/b/f"), true).await.unwrap().close().await.unwrap();
        ring.remove(&tree, true).await.unwrap();
        assert!(grpc.stat(&tree).await.is_err(), "{transport}: {tree} removed whole");
        ring.detach().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_token_is_enforced_on_the_ring_as_over_grpc() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    agent.seed_file("/data/x", b"hello");
    agent.seed_file("/outside", b"secret");
    let parent = Client::connect(options(&agent, None, "")).await.unwrap();
    let (token, _) = parent.delegate("/data", &["read".into()], 60).await.unwrap();
    let grpc = Client::connect(options(&agent, None, &token)).await.unwrap();
    for transport in ["ucx-shm", "ofi-tcp"] {
        let ring = Client::connect(options(&agent, Some(transport), &token)).await.unwrap();
        assert_eq!(ring.read_file("/data/x").unwrap(), b"hello");
        assert_eq!(ring.stat("/data/x").await.unwrap().size, 5);
        let pairs = [
            ("stat outside", text(ring.stat("/outside").await), text(grpc.stat("/outside").await)),
            (
                "open outside",
                text(ring.open("/outside", Access::ReadOnly).await),
                text(grpc.open("/outside", Access::ReadOnly).await),
            ),
            (
                "open rw",
                text(ring.open("/data/x", Access::ReadWrite).await),
                text(grpc.open("/data/x", Access::ReadWrite).await),
            ),
            ("create", text(ring.create("/data/y", false).await), text(grpc.create("/data/y", false).await)),
            ("list root", text(ring.readdir("/").await), text(grpc.readdir("/").await)),
            ("remove", text(ring.remove("/data/x", false).await), text(grpc.remove("/data/x", false).await)),
            ("remove outside", text(ring.remove("/outside", false).await), text(grpc.remove("/outside", false).await)),
            (
                "read outside",
                text(ring.read_file("/outside")),
                text(grpc.open("/outside", Access::ReadOnly).await).replace("open /outside", "read /outside"),
            ),
        ];
        for (what, r, g) in pairs {
            assert_eq!(r, g, "{transport}: {what}");
            assert!(r.contains("PERMISSION_DENIED") || r.contains("PermissionDenied"), "{what}: {r}");
        }
        let l = ring.lookup(&["/outside".to_owned()]).await.unwrap();
        let g = grpc.lookup(&["/outside".to_owned()]).await.unwrap();
        assert_eq!(l[0].as_ref().unwrap_err().to_string(), g[0].as_ref().unwrap_err().to_string());
    }
}

/// `read_samples`: a loader's batch of open-reads in one submission, each into its own
/// range of one region, with results of their own (a missing file fails alone), and a
/// batch longer than a ring (300 samples, 128-entry rings) in several submissions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_samples_reads_each_into_its_range_with_a_result_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    let count = 300usize;
    let contents: Vec<Vec<u8>> =
        (0..count).map(|i| (0..(1000 + i * 37) as u64).map(|b| pattern(b + i as u64)).collect()).collect();
    for (i, c) in contents.iter().enumerate() {
        agent.seed_file(&format!("/batch/s{i:03}"), c);
    }
    let slot = 16 * 1024u64;
    for transport in TRANSPORTS {
        let client = Client::connect(options(&agent, Some(transport), "")).await.unwrap();
        let region = client.register_region(count * slot as usize, RegionAccess::ReadWrite).await.unwrap();
        let mut paths: Vec<String> = (0..count).map(|i| format!("/batch/s{i:03}")).collect();
        paths[123] = "/batch/missing".into();
        let wanted: Vec<(&str, u64, u32)> =
            paths.iter().enumerate().map(|(i, p)| (p.as_str(), i as u64 * slot, slot as u32)).collect();
        let results = client.read_samples(&region, &wanted).unwrap();
        assert_eq!(results.len(), count, "{transport}");
        for (i, r) in results.into_iter().enumerate() {
            if i == 123 {
                let e = r.expect_err("the missing sample fails").to_string();
                assert!(e.contains("read /batch/missing: NOT_FOUND"), "{transport}: {e}");
                continue;
            }
            let (attr, n) = r.unwrap_or_else(|e| panic!("{transport}: sample {i}: {e}"));
            assert_eq!((attr.size, n), (contents[i].len() as u64, contents[i].len() as u64), "{transport}: {i}");
            let mut got = vec![0u8; contents[i].len()];
            region.read_at(i * slot as usize + 64, &mut got);
            assert_eq!(got, contents[i], "{transport}: sample {i}'s bytes");
        }
        // A range too small for its header is refused by the agent, for that sample only.
        let tiny = client.read_samples(&region, &[(paths[0].as_str(), 0, 8), (paths[1].as_str(), slot, 16 * 1024)]);
        let tiny = tiny.unwrap();
        assert!(tiny[0].is_err(), "{transport}: an 8-byte answer range");
        assert_eq!(tiny[1].as_ref().map(|(_, n)| *n).ok(), Some(contents[1].len() as u64), "{transport}");
        client.detach().await.unwrap();
    }
}
