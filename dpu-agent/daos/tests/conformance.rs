//! Backend conformance: the same cases over `local` and `daos`.
//!
//! The daos half runs against a real DAOS system when one is reachable: `DAOS_POOL`
//! names the pool and a `daos_agent` answers at `DAOS_AGENT_DRPC_DIR` (what
//! `../shared/daos/daos-up.sh` sets up; `source RUNDIR/env`). Otherwise each daos case
//! prints that it is skipped and why, and passes, unless `DPUIO_REQUIRE_DAOS=1` (set by
//! `./x test`'s DAOS tier), which turns a skip into a failure. There is no fake DAOS.
//!
//! Each daos case gets its own container (created as POSIX on first use), so cases run
//! in parallel against one system.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use dpuio_backend::local::LocalBackend;
use dpuio_backend::{
    Attr, Backend, Container, EntryKind, Error, IoOp, IoQueue, IoRequest, Layout, NsPath, Object, OpenOptions,
};
use dpuio_daos::{DaosBackend, DaosOptions};

fn p(s: &str) -> NsPath {
    NsPath::parse(s).unwrap()
}

fn create() -> OpenOptions {
    OpenOptions { write: true, create: true, ..OpenOptions::default() }
}

fn rw() -> OpenOptions {
    OpenOptions { write: true, ..OpenOptions::default() }
}

/// A local container in a fresh directory (the directory lives as long as the test), in
/// memory where there is `/dev/shm`: the many-entries case makes 10^5 files, which a
/// busy disk's journal turns into minutes.
fn local(_case: &str) -> Option<(Box<dyn std::any::Any>, Arc<dyn Container>)> {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm).unwrap() } else { tempfile::tempdir().unwrap() };
    let backend = LocalBackend::open(dir.path().join("root")).unwrap();
    let c = backend.mount("c", true).unwrap();
    Some((Box::new((dir, backend)), c))
}

/// Why the daos half cannot run here, if it cannot.
fn daos_unavailable() -> Option<String> {
    let Some(pool) = std::env::var("DAOS_POOL").ok().filter(|p| !p.is_empty()) else {
        return Some(
            "DAOS_POOL is not set (start DAOS with ../shared/daos/daos-up.sh RUNDIR and source RUNDIR/env)".into(),
        );
    };
    let socket = dpuio_daos::default_agent_socket_dir().join("daos_agent.sock");
    if !socket.exists() {
        return Some(format!("no daos_agent socket at {} (pool {pool})", socket.display()));
    }
    if let Err(e) = dpuio_daos::load_libraries() {
        return Some(e.to_string());
    }
    None
}

fn daos_backend() -> &'static DaosBackend {
    static BACKEND: OnceLock<DaosBackend> = OnceLock::new();
    BACKEND.get_or_init(|| {
        DaosBackend::open(DaosOptions {
            pool: std::env::var("DAOS_POOL").unwrap(),
            system: "daos_server".into(),
            agent_socket_dir: dpuio_daos::default_agent_socket_dir(),
            create_containers: true,
            chunk_bytes: dpuio_daos::DEFAULT_CHUNK_BYTES,
            object_class: String::new(),
            retry: std::time::Duration::from_secs(120),
            private_containers: false,
            redundancy_factor: 0,
            redundancy_level: 0,
            call_timeout: std::time::Duration::from_secs(180),
            // As the agent runs it: the cases see that its own removes and renames
            // forget the directories they touch.
            dir_cache: dpuio_daos::DEFAULT_DIR_CACHE,
        })
        .unwrap_or_else(|e| panic!("DAOS is reachable but the backend did not open: {e}"))
    })
}

/// A fresh DAOS container for one case, or `None` (with the reason printed) when no
/// DAOS system is reachable.
fn daos(case: &str) -> Option<(Box<dyn std::any::Any>, Arc<dyn Container>)> {
    if let Some(why) = daos_unavailable() {
        assert!(std::env::var("DPUIO_REQUIRE_DAOS").as_deref() != Ok("1"), "DPUIO_REQUIRE_DAOS=1 but: {why}");
        eprintln!("daos::{case}: skipped: {why}");
        return None;
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let label = format!("conf-{case}-{}-{}", std::process::id(), nanos % 1_000_000_000);
    let label: String = label.chars().take(120).collect();
    let c = daos_backend().mount(&label, true).unwrap_or_else(|e| panic!("mount {label}: {e}"));
    Some((Box::new(()), c))
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod local {
            $( #[test] fn $case() { if let Some((_keep, c)) = super::local(stringify!($case)) { super::$case(&*c) } } )*
        }
        mod daos {
            $( #[test] fn $case() { if let Some((_keep, c)) = super::daos(stringify!($case)) { super::$case(&*c) } } )*
        }
    };
}

conformance!(
    stat_and_mkdir,
    open_create_and_modes,
    open_stat_answers_as_open_and_stat,
    remove_files_and_trees,
    a_directory_made_again_under_an_old_name_is_the_new_one,
    rename_rules,
    invalid_names_and_escapes,
    readdir_batches_resume_and_errors,
    readdir_many_entries,
    files_beyond_the_chunk_size,
    random_io_against_a_model,
    truncate_grows_and_shrinks,
    persists_across_mounts,
);

fn touch(c: &dyn Container, path: &str) {
    c.open(&p(path), create(), 0o644).unwrap();
}

fn stat_and_mkdir(c: &dyn Container) {
    let root = c.stat(&NsPath::root()).unwrap();
    assert_eq!(root.kind, EntryKind::Directory);
    let a = c.mkdir(&p("/a"), 0o750).unwrap();
    assert_eq!((a.kind, a.size, a.mode), (EntryKind::Directory, 0, 0o750));
    assert!(matches!(c.mkdir(&p("/a"), 0o755), Err(Error::AlreadyExists { path }) if path == "/a"));
    assert!(matches!(c.mkdir(&p("/missing/b"), 0o755), Err(Error::NotFound { .. })));
    touch(c, "/a/f");
    assert!(matches!(c.mkdir(&p("/a/f/x"), 0o755), Err(Error::NotADirectory { .. })));
    assert!(matches!(c.stat(&p("/nope")), Err(Error::NotFound { path }) if path == "/nope"));
    assert!(matches!(c.stat(&p("/a/f/x")), Err(Error::NotADirectory { .. } | Error::NotFound { .. })));
    let f = c.stat(&p("/a/f")).unwrap();
    assert_eq!((f.kind, f.size, f.mode), (EntryKind::File, 0, 0o644));
    assert_ne!(f.object_id, c.stat(&p("/a")).unwrap().object_id, "object ids tell entries apart");
    assert!(f.mtime_ns > 1_600_000_000_000_000_000, "mtime is nanoseconds since the epoch: {}", f.mtime_ns);
}

fn open_create_and_modes(c: &dyn Container) {
    assert!(matches!(c.open(&p("/f"), OpenOptions::default(), 0), Err(Error::NotFound { .. })));
    assert!(matches!(c.open(&p("/none/f"), create(), 0o644), Err(Error::NotFound { .. })));
    let f = c.open(&p("/f"), create(), 0o600).unwrap();
    assert!(f.writable());
    f.write_at(b"hello", 0).unwrap();
    let exclusive = OpenOptions { exclusive: true, ..create() };
    assert!(matches!(c.open(&p("/f"), exclusive, 0o644), Err(Error::AlreadyExists { .. })));
    c.mkdir(&p("/d"), 0o755).unwrap();
    assert!(matches!(c.open(&p("/d"), OpenOptions::default(), 0), Err(Error::IsADirectory { .. })));
    assert!(matches!(c.open(&p("/d"), create(), 0o644), Err(Error::IsADirectory { .. })));
    assert!(matches!(c.open(&NsPath::root(), OpenOptions::default(), 0), Err(Error::IsADirectory { .. })));
    let bad = OpenOptions { truncate: true, ..OpenOptions::default() };
    assert!(matches!(c.open(&p("/f"), bad, 0), Err(Error::InvalidArgument(_))));
    let bad = OpenOptions { exclusive: true, ..OpenOptions::default() };
    assert!(matches!(c.open(&p("/f"), bad, 0), Err(Error::InvalidArgument(_))));

    let ro = c.open(&p("/f"), OpenOptions::default(), 0).unwrap();
    assert!(!ro.writable());
    assert!(matches!(ro.write_at(b"x", 0), Err(Error::AccessMode { .. })));
    assert!(matches!(ro.truncate(0), Err(Error::AccessMode { .. })));
    let mut buf = [0u8; 16];
    assert_eq!(ro.read_at(&mut buf, 0).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    assert_eq!(ro.read_at(&mut buf, 5).unwrap(), 0, "a read at the end of the file is empty");
    assert_eq!(ro.read_at(&mut buf, 1 << 40).unwrap(), 0, "a read past the end is empty");
    assert_eq!(ro.stat().unwrap().size, 5);
    ro.sync().unwrap();

    let truncating = OpenOptions { truncate: true, ..rw() };
    let t = c.open(&p("/f"), truncating, 0).unwrap();
    assert_eq!(t.stat().unwrap().size, 0);
    assert_eq!(c.stat(&p("/f")).unwrap().size, 0);

    // Layout hints are accepted by both backends.
    let layout = OpenOptions { layout: Layout { chunk_bytes: 1 << 16, object_class: 0 }, ..create() };
    let g = c.open(&p("/g"), layout, 0o644).unwrap();
    g.write_at(&[7u8; 200_000], 0).unwrap();
    assert_eq!(c.stat(&p("/g")).unwrap().size, 200_000);
    c.sync().unwrap();
}

/// `open_stat` (one DFS lookup on the DAOS backend where it neither creates nor
/// truncates) answers what `open` and the object's `stat` answer, errors included.
fn open_stat_answers_as_open_and_stat(c: &dyn Container) {
    c.mkdir(&p("/d"), 0o755).unwrap();
    let f = c.open(&p("/d/f"), create(), 0o640).unwrap();
    f.write_at(&[3u8; 70_000], 0).unwrap();
    f.sync().unwrap();
    for options in [OpenOptions::default(), rw()] {
        let (object, attr) = c.open_stat(&p("/d/f"), options, 0).unwrap();
        let opened = c.open(&p("/d/f"), options, 0).unwrap();
        assert_eq!(attr, opened.stat().unwrap(), "{options:?}");
        assert_eq!((attr.kind, attr.size, attr.mode), (EntryKind::File, 70_000, 0o640));
        assert_eq!(object.writable(), options.write);
        let mut buf = [0u8; 8];
        assert_eq!(object.read_at(&mut buf, 69_996).unwrap(), 4);
        if options.write {
            object.write_at(b"xy", 70_000).unwrap();
            assert_eq!(object.stat().unwrap().size, 70_002);
        } else {
            assert!(matches!(object.write_at(b"x", 0), Err(Error::AccessMode { .. })));
        }
    }
    let (_, created) = c.open_stat(&p("/d/g"), OpenOptions { exclusive: true, ..create() }, 0o600).unwrap();
    assert_eq!((created.kind, created.size, created.mode), (EntryKind::File, 0, 0o600));
    // What a create answers (DFS: from the entry it wrote) is what a stat then says.
    let same_as_stat = |path: &str, attr: Attr| {
        let stat = c.stat(&p(path)).unwrap();
        assert_eq!(
            (attr.kind, attr.size, attr.mode, attr.object_id),
            (stat.kind, stat.size, stat.mode, stat.object_id)
        );
        assert!((attr.mtime_ns - stat.mtime_ns).abs() < 2_000_000_000, "{path}: {attr:?} against {stat:?}");
    };
    same_as_stat("/d/g", created);
    // A create of an existing file opens it as it is (size and mode kept).
    let (object, existing) = c.open_stat(&p("/d/f"), create(), 0o600).unwrap();
    assert_eq!((existing.kind, existing.size, existing.mode), (EntryKind::File, 70_002, 0o640));
    assert!(object.writable());
    same_as_stat("/d/f", existing);
    assert!(matches!(
        c.open_stat(&p("/d/f"), OpenOptions { exclusive: true, ..create() }, 0o600),
        Err(Error::AlreadyExists { .. })
    ));
    assert!(matches!(c.open_stat(&p("/d"), create(), 0o600), Err(Error::IsADirectory { .. })));
    let (_, truncated) = c.open_stat(&p("/d/f"), OpenOptions { truncate: true, ..rw() }, 0).unwrap();
    assert_eq!(truncated.size, 0);
    assert!(matches!(c.open_stat(&p("/d/nope"), OpenOptions::default(), 0), Err(Error::NotFound { .. })));
    assert!(matches!(
        c.open_stat(&p("/d/f/x"), OpenOptions::default(), 0),
        Err(Error::NotADirectory { .. } | Error::NotFound { .. })
    ));
    assert!(matches!(c.open_stat(&p("/d"), OpenOptions::default(), 0), Err(Error::IsADirectory { .. })));
    assert!(matches!(c.open_stat(&p("/d"), rw(), 0), Err(Error::IsADirectory { .. })));
    assert!(matches!(c.open_stat(&NsPath::root(), OpenOptions::default(), 0), Err(Error::IsADirectory { .. })));
}

/// A directory removed or renamed through this container and then made again under its
/// old name: calls by that name reach the new one (the DAOS backend keeps directories it
/// found, and forgets those its own calls removed or moved).
fn a_directory_made_again_under_an_old_name_is_the_new_one(c: &dyn Container) {
    let names = |dir: &str| {
        let mut names: Vec<String> = c.readdir(&p(dir), None, 100).unwrap().0.into_iter().map(|e| e.name).collect();
        names.sort();
        names
    };
    c.mkdir(&p("/r"), 0o755).unwrap();
    c.mkdir(&p("/r/s"), 0o755).unwrap();
    touch(c, "/r/s/old");
    assert_eq!(c.stat(&p("/r/s/old")).unwrap().kind, EntryKind::File);
    c.remove(&p("/r"), true).unwrap();
    c.mkdir(&p("/r"), 0o755).unwrap();
    c.mkdir(&p("/r/s"), 0o755).unwrap();
    touch(c, "/r/s/new");
    assert_eq!(names("/r/s"), ["new"]);
    assert!(matches!(c.stat(&p("/r/s/old")), Err(Error::NotFound { .. })));

    c.rename(&p("/r"), &p("/moved")).unwrap();
    c.mkdir(&p("/r"), 0o755).unwrap();
    assert!(matches!(c.stat(&p("/r/s/new")), Err(Error::NotFound { .. })));
    c.mkdir(&p("/r/s"), 0o755).unwrap();
    touch(c, "/r/s/again");
    assert_eq!(names("/r/s"), ["again"]);
    assert_eq!(names("/moved/s"), ["new"]);
    assert_eq!(c.stat(&p("/moved/s/new")).unwrap().kind, EntryKind::File);
}

fn remove_files_and_trees(c: &dyn Container) {
    touch(c, "/f");
    c.remove(&p("/f"), false).unwrap();
    assert!(matches!(c.stat(&p("/f")), Err(Error::NotFound { .. })));
    assert!(matches!(c.remove(&p("/f"), false), Err(Error::NotFound { .. })));
    assert!(matches!(c.remove(&p("/no/f"), false), Err(Error::NotFound { .. })));
    c.mkdir(&p("/empty"), 0o755).unwrap();
    c.remove(&p("/empty"), false).unwrap();
    c.mkdir(&p("/t"), 0o755).unwrap();
    c.mkdir(&p("/t/u"), 0o755).unwrap();
    touch(c, "/t/u/f");
    touch(c, "/t/g");
    assert!(matches!(c.remove(&p("/t"), false), Err(Error::DirectoryNotEmpty { path }) if path == "/t"));
    c.remove(&p("/t"), true).unwrap();
    assert!(matches!(c.stat(&p("/t")), Err(Error::NotFound { .. })));
    assert!(matches!(c.stat(&p("/t/u/f")), Err(Error::NotFound { .. } | Error::NotADirectory { .. })));
    assert!(c.remove(&NsPath::root(), true).is_err(), "the root cannot be removed");
    assert!(c.stat(&NsPath::root()).is_ok());
}

fn rename_rules(c: &dyn Container) {
    let f = c.open(&p("/f"), create(), 0o644).unwrap();
    f.write_at(b"data", 0).unwrap();
    drop(f);
    c.rename(&p("/f"), &p("/g")).unwrap();
    assert!(matches!(c.stat(&p("/f")), Err(Error::NotFound { .. })));
    assert_eq!(c.stat(&p("/g")).unwrap().size, 4);
    touch(c, "/h");
    assert!(matches!(c.rename(&p("/g"), &p("/h")), Err(Error::AlreadyExists { path }) if path == "/h"));
    assert_eq!(c.stat(&p("/g")).unwrap().size, 4, "a refused rename changes nothing");
    assert!(matches!(c.rename(&p("/missing"), &p("/x")), Err(Error::NotFound { .. })));
    assert!(matches!(c.rename(&p("/g"), &p("/nodir/x")), Err(Error::NotFound { .. })));
    c.mkdir(&p("/d"), 0o755).unwrap();
    c.mkdir(&p("/d/e"), 0o755).unwrap();
    touch(c, "/d/e/f");
    assert!(matches!(c.rename(&p("/d"), &p("/d/e/inside")), Err(Error::InvalidRename { .. })));
    assert!(matches!(
        c.rename(&NsPath::root(), &p("/r")),
        Err(Error::InvalidRename { .. } | Error::InvalidArgument(_))
    ));
    c.rename(&p("/d"), &p("/moved")).unwrap();
    assert_eq!(c.stat(&p("/moved/e/f")).unwrap().kind, EntryKind::File);
    c.rename(&p("/g"), &p("/moved/e/g")).unwrap();
    let mut buf = [0u8; 4];
    c.open(&p("/moved/e/g"), OpenOptions::default(), 0).unwrap().read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"data");
}

fn invalid_names_and_escapes(c: &dyn Container) {
    // Paths are validated before any backend sees them; the backend never gets a way out.
    for bad in ["", "/a/../../etc", "..", "/./x", "a\0b"] {
        assert!(matches!(NsPath::parse(bad), Err(Error::InvalidPath { .. })), "{bad:?}");
    }
    assert!(matches!(NsPath::root().join("a/b"), Err(Error::InvalidPath { .. })));
    assert!(matches!(NsPath::parse(&format!("/{}", "n".repeat(256))), Err(Error::InvalidPath { .. })));
    // The longest valid name works end to end.
    let long = format!("/{}", "n".repeat(255));
    touch(c, &long);
    assert_eq!(c.stat(&p(&long)).unwrap().kind, EntryKind::File);
    // Names DFS and POSIX allow but shells dislike are plain names.
    for odd in ["/sp ace", "/é", "/-dash", "/.hidden", "/a:b"] {
        touch(c, odd);
        assert_eq!(c.stat(&p(odd)).unwrap().kind, EntryKind::File, "{odd}");
    }
    assert!(matches!(c.readdir(&NsPath::root(), None, 0), Err(Error::InvalidArgument(_))));
}

/// Every entry of `dir` in batches of `batch`, checking the batch contract.
fn list_all(c: &dyn Container, dir: &str, batch: usize) -> Vec<String> {
    let mut names = Vec::new();
    let mut anchor: Option<String> = None;
    loop {
        let (entries, next) = c.readdir(&p(dir), anchor.as_deref(), batch).unwrap();
        assert!(entries.len() <= batch);
        if next.is_some() {
            assert!(!entries.is_empty(), "a batch that says more follow is never empty");
        }
        names.extend(entries.into_iter().map(|e| e.name));
        match next {
            Some(next) => anchor = Some(next),
            None => return names,
        }
    }
}

fn readdir_batches_resume_and_errors(c: &dyn Container) {
    c.mkdir(&p("/d"), 0o755).unwrap();
    assert_eq!(c.readdir(&p("/d"), None, 10).unwrap(), (vec![], None));
    for i in 0..25 {
        touch(c, &format!("/d/f{i:02}"));
    }
    c.mkdir(&p("/d/sub"), 0o755).unwrap();
    let all = list_all(c, "/d", 7);
    assert_eq!(all.len(), 26);
    assert_eq!(all.iter().collect::<HashSet<_>>().len(), 26, "no entry twice");
    let (first, next) = c.readdir(&p("/d"), None, 10).unwrap();
    let next = next.expect("more follow");
    // Resuming twice from one anchor gives the same batch.
    let a = c.readdir(&p("/d"), Some(&next), 5).unwrap();
    let b = c.readdir(&p("/d"), Some(&next), 5).unwrap();
    assert_eq!(a.0, b.0);
    assert!(first.iter().all(|e| !a.0.contains(e)));
    let sub = first.iter().chain(&a.0).find(|e| e.name == "sub");
    if let Some(sub) = sub {
        assert_eq!(sub.attr.kind, EntryKind::Directory);
    }
    assert!(matches!(c.readdir(&p("/missing"), None, 10), Err(Error::NotFound { .. })));
    assert!(matches!(c.readdir(&p("/d/f00"), None, 10), Err(Error::NotADirectory { .. })));
}

fn entries_for_many() -> usize {
    std::env::var("DPUIO_CONFORMANCE_ENTRIES").ok().and_then(|n| n.parse().ok()).unwrap_or(20_000)
}

/// Threads that make the many entries: concurrent creates in one directory, as a job's
/// loaders make them. Two, not more: over DAOS on the 2-core test machine more threads
/// made the creates slower, not faster (10^4 creates in 8.7 s from one thread, 12.3 s from
/// two, 23.0 s from eight, each call's thread hop included; 18.2 s from eight without it):
/// the client's synchronous calls contend with each other and the engine for the cores,
/// and eight creators took 193 s of the DAOS tier for 10^5 entries.
const CREATORS: usize = 2;

fn readdir_many_entries(c: &dyn Container) {
    let n = entries_for_many();
    c.mkdir(&p("/big"), 0o755).unwrap();
    let started = std::time::Instant::now();
    // From several threads, as a job's loaders make files (see CREATORS).
    std::thread::scope(|s| {
        for t in 0..CREATORS {
            s.spawn(move || {
                for i in (t..n).step_by(CREATORS) {
                    c.open(&p(&format!("/big/entry-{i:07}")), create(), 0o644).unwrap();
                }
            });
        }
    });
    let created = started.elapsed();
    let started = std::time::Instant::now();
    let names = list_all(c, "/big", 4096);
    eprintln!("{n} entries: created in {created:?}, listed in batches of 4096 in {:?}", started.elapsed());
    assert_eq!(names.len(), n);
    let unique: HashSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), n);
    assert!((0..n).all(|i| unique.contains(&format!("entry-{i:07}"))));
}

fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64).map(|i| ((offset + i) % 251) as u8).collect()
}

fn files_beyond_the_chunk_size(c: &dyn Container) {
    let chunk = c.chunk_bytes();
    assert!(chunk > 0);
    let len = (chunk * 3 + chunk / 2) as usize;
    let f = c.open(&p("/big"), create(), 0o644).unwrap();
    f.write_at(&pattern(0, len), 0).unwrap();
    assert_eq!(f.stat().unwrap().size, len as u64);
    let mut whole = vec![0u8; len + 100];
    assert_eq!(f.read_at(&mut whole, 0).unwrap(), len);
    assert!(whole[..len] == pattern(0, len)[..]);
    // Reads that straddle chunk boundaries.
    for offset in [chunk - 1, chunk - 100, 2 * chunk - 7, 3 * chunk] {
        let mut buf = vec![0u8; 1000];
        let n = f.read_at(&mut buf, offset).unwrap();
        assert_eq!(n, 1000.min(len - offset as usize));
        assert_eq!(buf[..n], pattern(offset, n)[..], "at {offset}");
    }
    // A sparse write far past the end: the hole reads as zeros.
    f.write_at(b"tail", 10 * chunk).unwrap();
    assert_eq!(f.stat().unwrap().size, 10 * chunk + 4);
    let mut hole = vec![1u8; 4096];
    assert_eq!(f.read_at(&mut hole, 5 * chunk).unwrap(), 4096);
    assert!(hole.iter().all(|&b| b == 0));
}

fn random_io_against_a_model(c: &dyn Container) {
    use rand::{Rng, RngCore, SeedableRng};
    const SIZE: usize = 4 << 20;
    const THREADS: usize = 4;
    let f = c.open(&p("/model"), create(), 0o644).unwrap();
    f.write_at(&vec![0u8; SIZE], 0).unwrap();
    // Each thread owns one stripe: concurrent I/O on one object, a model per stripe.
    let stripe = SIZE / THREADS;
    let models: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let f = f.clone();
                s.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64 + 1);
                    let base = t * stripe;
                    let mut model = vec![0u8; stripe];
                    for _ in 0..150 {
                        let off = rng.random_range(0..stripe);
                        let len = rng.random_range(1..=(stripe - off).min(200_000));
                        if rng.random_bool(0.5) {
                            let mut data = vec![0u8; len];
                            rng.fill_bytes(&mut data);
                            f.write_at(&data, (base + off) as u64).unwrap();
                            model[off..off + len].copy_from_slice(&data);
                        } else {
                            let mut buf = vec![0u8; len];
                            assert_eq!(f.read_at(&mut buf, (base + off) as u64).unwrap(), len);
                            assert!(
                                buf == model[off..off + len],
                                "thread {t}: read at {off}+{len} differs from the model"
                            );
                        }
                    }
                    model
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let expected: Vec<u8> = models.concat();
    let mut all = vec![0u8; SIZE];
    let g = c.open(&p("/model"), OpenOptions::default(), 0).unwrap();
    assert_eq!(g.read_at(&mut all, 0).unwrap(), SIZE);
    assert!(all == expected, "the file differs from the model");
}

/// A test double: an object of no backend's own type, so a queue must run it with
/// `read_at`/`write_at` (as it does the inline encryption wrapper's objects).
struct ForeignObjectDouble(Arc<dyn Object>);

impl Object for ForeignObjectDouble {
    fn path(&self) -> &NsPath {
        self.0.path()
    }
    fn writable(&self) -> bool {
        self.0.writable()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> dpuio_backend::Result<usize> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> dpuio_backend::Result<()> {
        self.0.write_at(buf, offset)
    }
    fn stat(&self) -> dpuio_backend::Result<dpuio_backend::Attr> {
        self.0.stat()
    }
    fn truncate(&self, size: u64) -> dpuio_backend::Result<()> {
        self.0.truncate(size)
    }
    fn sync(&self) -> dpuio_backend::Result<()> {
        self.0.sync()
    }
}

/// Run `batch` on `q`, checking that each piece completes exactly once.
fn run_batch(q: &mut dyn IoQueue, batch: &mut [IoRequest<'_>]) -> Vec<dpuio_backend::Result<usize>> {
    let mut results: Vec<Option<dpuio_backend::Result<usize>>> = (0..batch.len()).map(|_| None).collect();
    q.run(batch, &mut |i, r| {
        assert!(results[i].is_none(), "piece {i} completed twice");
        results[i] = Some(r);
    });
    results.into_iter().enumerate().map(|(i, r)| r.unwrap_or_else(|| panic!("piece {i} never completed"))).collect()
}

/// The I/O queue of one data-plane thread: batches larger than its depth, pieces across
/// chunk boundaries and past the end of the file, a write through a read-only handle
/// and an object the queue must run itself, all in one batch, against a model.
fn io_queue_against_a_model(c: &dyn Container, q: &mut dyn IoQueue) {
    use rand::{Rng, RngCore, SeedableRng};
    const PIECE: usize = 96 << 10;
    let pieces = q.depth() * 2 + 3;
    let size = pieces * PIECE;
    let f = c.open(&p("/queued"), create(), 0o644).unwrap();
    let foreign = ForeignObjectDouble(c.open(&p("/queued"), rw(), 0).unwrap());
    let read_only = c.open(&p("/queued"), OpenOptions::default(), 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut model = vec![0u8; size];
    rng.fill_bytes(&mut model);

    // Every piece written in one batch, in shuffled order, every fifth through the
    // foreign object; one more write through the read-only handle must fail alone.
    let mut order: Vec<usize> = (0..pieces).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    let junk = vec![0xeeu8; PIECE];
    let mut batch: Vec<IoRequest<'_>> = order
        .iter()
        .map(|&k| IoRequest {
            object: if k % 5 == 0 { &foreign as &dyn Object } else { &*f },
            offset: (k * PIECE) as u64,
            op: IoOp::Write(model[k * PIECE..][..PIECE].into()),
        })
        .collect();
    batch.insert(pieces / 2, IoRequest { object: &*read_only, offset: 0, op: IoOp::Write(junk[..].into()) });
    let results = run_batch(q, &mut batch);
    for (i, r) in results.iter().enumerate() {
        if i == pieces / 2 {
            assert!(matches!(r, Err(Error::AccessMode { .. })), "write through a read-only handle: {r:?}");
        } else {
            assert_eq!(*r.as_ref().unwrap(), PIECE, "write {i}");
        }
    }
    assert_eq!(f.stat().unwrap().size, size as u64);

    // Read it back in one batch: pieces at odd offsets (across chunk boundaries), one
    // across the end of the file (short) and one past it (0 bytes).
    let mut bufs: Vec<Vec<u8>> = (0..pieces + 2).map(|_| vec![0u8; PIECE]).collect();
    let offsets: Vec<usize> =
        (0..pieces).map(|k| (k * PIECE + k * 4099) % (size - PIECE)).chain([size - PIECE / 3, size + 1]).collect();
    let mut batch: Vec<IoRequest<'_>> = bufs
        .iter_mut()
        .zip(&offsets)
        .enumerate()
        .map(|(k, (buf, &off))| IoRequest {
            object: if k % 7 == 3 { &foreign as &dyn Object } else { &*read_only },
            offset: off as u64,
            op: IoOp::Read(buf.as_mut_slice().into()),
        })
        .collect();
    let results = run_batch(q, &mut batch);
    drop(batch);
    for (k, (r, &off)) in results.iter().zip(&offsets).enumerate() {
        let n = *r.as_ref().unwrap_or_else(|e| panic!("read {k} at {off}: {e}"));
        assert_eq!(n, size.saturating_sub(off).min(PIECE), "read {k} at {off}");
        assert!(bufs[k][..n] == model[off.min(size)..][..n], "read {k} at {off} differs from the model");
    }
}

#[test]
fn local_io_queue_against_a_model() {
    let (keep, c) = local("io_queue").unwrap();
    let (_, backend) = keep.downcast_ref::<(tempfile::TempDir, LocalBackend)>().unwrap();
    let mut q = backend.io_queue().unwrap();
    assert_eq!(q.depth(), 1, "local runs pieces one at a time");
    io_queue_against_a_model(&*c, &mut *q);
}

#[test]
fn daos_io_queue_against_a_model() {
    let Some((_keep, c)) = daos("io_queue") else { return };
    let mut q = daos_backend().io_queue().unwrap();
    assert!(q.depth() > 1, "a DAOS event queue keeps pieces in flight");
    io_queue_against_a_model(&*c, &mut *q);
}

fn truncate_grows_and_shrinks(c: &dyn Container) {
    let f = c.open(&p("/t"), create(), 0o644).unwrap();
    f.write_at(&pattern(0, 10_000), 0).unwrap();
    f.truncate(100).unwrap();
    assert_eq!(f.stat().unwrap().size, 100);
    let mut buf = vec![9u8; 200];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), 100);
    assert_eq!(buf[..100], pattern(0, 100)[..]);
    c.truncate(&p("/t"), 5000).unwrap();
    assert_eq!(c.stat(&p("/t")).unwrap().size, 5000);
    let mut buf = vec![9u8; 5000];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), 5000);
    assert!(buf[100..].iter().all(|&b| b == 0), "a grown file reads zeros, not old bytes");
    f.truncate(0).unwrap();
    assert_eq!(c.stat(&p("/t")).unwrap().size, 0);
    c.mkdir(&p("/dir"), 0o755).unwrap();
    assert!(matches!(c.truncate(&p("/dir"), 0), Err(Error::IsADirectory { .. })));
    assert!(matches!(c.truncate(&p("/none"), 0), Err(Error::NotFound { .. })));
    f.sync().unwrap();
    c.sync().unwrap();
}

fn persists_across_mounts(c: &dyn Container) {
    let f = c.open(&p("/kept"), create(), 0o644).unwrap();
    f.write_at(&pattern(0, 300_000), 0).unwrap();
    f.sync().unwrap();
    drop(f);
    c.mkdir(&p("/kept-dir"), 0o755).unwrap();
    c.sync().unwrap();
    // A second mount of the same container (for daos: a second dfs_mount) sees it all.
    let name = c.name().to_owned();
    let again: Arc<dyn Container> = match daos_unavailable() {
        None if name.starts_with("conf-") => daos_backend().mount(&name, false).unwrap(),
        _ => return, // local: covered by the local backend's own tests
    };
    let mut buf = vec![0u8; 300_000];
    assert_eq!(again.open(&p("/kept"), OpenOptions::default(), 0).unwrap().read_at(&mut buf, 0).unwrap(), 300_000);
    assert!(buf == pattern(0, 300_000));
    assert_eq!(again.stat(&p("/kept-dir")).unwrap().kind, EntryKind::Directory);
}

#[test]
fn daos_anchor_from_another_directory_or_altered_is_refused() {
    let Some((_keep, c)) = daos("anchors") else { return };
    for d in ["/a", "/b"] {
        c.mkdir(&p(d), 0o755).unwrap();
        for i in 0..10 {
            touch(&*c, &format!("{d}/f{i}"));
        }
    }
    let (_, next) = c.readdir(&p("/a"), None, 3).unwrap();
    let anchor = next.unwrap();
    assert!(anchor.starts_with("dfs1."), "{anchor}");
    let refused = |r: dpuio_backend::Result<_>| match r {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("anchor refused"), "{msg}"),
        other => panic!("{other:?}"),
    };
    refused(c.readdir(&p("/b"), Some(&anchor), 3));
    let mut altered = anchor.clone().into_bytes();
    altered[10] = if altered[10] == b'0' { b'1' } else { b'0' };
    refused(c.readdir(&p("/a"), Some(std::str::from_utf8(&altered).unwrap()), 3));
    refused(c.readdir(&p("/a"), Some("f3"), 3));
    refused(c.readdir(&p("/a"), Some(""), 3));
}

#[test]
fn daos_missing_container_and_pool_are_reported_with_what_to_do() {
    if let Some(why) = daos_unavailable() {
        eprintln!("daos_missing_container_and_pool: skipped: {why}");
        return;
    }
    let strict =
        DaosBackend::open(DaosOptions { create_containers: false, ..daos_backend().options().clone() }).unwrap();
    let err = strict.mount("no-such-container-here", true).err().expect("missing container");
    let msg = err.to_string();
    assert!(matches!(err, Error::NoSuchContainer { .. }), "{msg}");
    assert!(msg.contains("DER_NONEXIST") && msg.contains("daos container create"), "{msg}");
    let err = DaosBackend::open(DaosOptions { pool: "no-such-pool".into(), ..daos_backend().options().clone() })
        .err()
        .expect("missing pool");
    let msg = err.to_string();
    assert!(msg.contains("no-such-pool") && msg.contains("DER_NONEXIST") && msg.contains("dmg pool create"), "{msg}");
}

#[test]
fn der_numbers_match_libgurt() {
    if dpuio_daos::load_libraries().is_err() {
        eprintln!("der_numbers_match_libgurt: skipped: the DAOS libraries are not installed here");
        return;
    }
    use dpuio_daos::error::der;
    for (code, name) in [
        (der::NO_PERM, "DER_NO_PERM"),
        (der::NO_HDL, "DER_NO_HDL"),
        (der::INVAL, "DER_INVAL"),
        (der::EXIST, "DER_EXIST"),
        (der::NONEXIST, "DER_NONEXIST"),
        (der::UNREACH, "DER_UNREACH"),
        (der::NOSPACE, "DER_NOSPACE"),
        (der::TIMEDOUT, "DER_TIMEDOUT"),
        (der::BUSY, "DER_BUSY"),
        (der::AGAIN, "DER_AGAIN"),
        (der::HG, "DER_HG"),
        (der::EXCLUDED, "DER_EXCLUDED"),
        (der::GRPVER, "DER_GRPVER"),
        (der::STALE, "DER_STALE"),
        (der::NOTLEADER, "DER_NOTLEADER"),
        (der::TX_RESTART, "DER_TX_RESTART"),
        (der::NO_SERVICE, "DER_NO_SERVICE"),
        (der::AGENT_INCOMPAT, "DER_AGENT_INCOMPAT"),
        (der::AGENT_COMM, "DER_AGENT_COMM"),
        (der::NONEXIST_CONT, "DER_CONT_NONEXIST"),
    ] {
        assert_eq!(dpuio_daos::der_name(code).unwrap(), name);
    }
}

#[test]
fn daos_layout_from_a_client_is_checked_and_object_classes_resolve() {
    let Some((_keep, c)) = daos("layout") else { return };
    for bad in [1, 4095, (1 << 30) + 1, u64::MAX] {
        let options = OpenOptions { layout: Layout { chunk_bytes: bad, object_class: 0 }, ..create() };
        match c.open(&p("/f"), options, 0o644) {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains("chunk size"), "{msg}"),
            other => panic!("chunk {bad}: {:?}", other.map(|_| ())),
        }
    }
    let err =
        DaosBackend::open(DaosOptions { object_class: "NO_SUCH_CLASS".into(), ..daos_backend().options().clone() })
            .err()
            .expect("an unknown object class is refused");
    assert!(err.to_string().contains("NO_SUCH_CLASS"), "{err}");
    let sx = DaosBackend::open(DaosOptions { object_class: "SX".into(), ..daos_backend().options().clone() }).unwrap();
    let label = format!("conf-sx-{}", std::process::id());
    let c = sx.mount(&label, true).unwrap();
    let f = c.open(&p("/wide"), create(), 0o644).unwrap();
    f.write_at(&[5u8; 3 << 20], 0).unwrap();
    assert_eq!(c.stat(&p("/wide")).unwrap().size, 3 << 20);
}
