//! Unit tests of the local container: every namespace operation on a real tree.

use std::fs;
use std::os::unix::fs::symlink;
use std::time::Instant;

use super::super::tests::{fills, mounted, mounted_in_memory, mounted_with, p};
use super::*;
use crate::{Backend, EntryKind, MAX_NAME_BYTES};

fn create() -> OpenOptions {
    OpenOptions { create: true, write: true, ..OpenOptions::default() }
}

fn touch(c: &dyn Container, path: &str) {
    c.open(&p(path), create(), 0o644).unwrap();
}

fn write(c: &dyn Container, path: &str, data: &[u8]) {
    c.open(&p(path), create(), 0o644).unwrap().write_at(data, 0).unwrap();
}

/// `readdir` with "more follow" as a bool, the shape these tests were written in.
fn rd(c: &dyn Container, path: &NsPath, anchor: Option<&str>, max: usize) -> Result<(Vec<DirEntry>, bool)> {
    c.readdir(path, anchor, max).map(|(entries, next)| (entries, next.is_some()))
}

fn names(c: &dyn Container, path: &str) -> Vec<String> {
    let (entries, more) = rd(c, &p(path), None, usize::MAX).unwrap();
    assert!(!more);
    entries.into_iter().map(|e| e.name).collect()
}

#[track_caller]
fn assert_not_found(r: Result<impl Sized>, path: &str) {
    match r {
        Err(Error::NotFound { path: got }) => assert_eq!(got, path),
        Err(e) => panic!("expected NotFound {path}, got {e:?}"),
        Ok(_) => panic!("expected NotFound {path}, got Ok"),
    }
}

#[track_caller]
fn expect_err<T>(r: Result<T>) -> Error {
    match r {
        Err(e) => e,
        Ok(_) => panic!("expected an error"),
    }
}

#[test]
fn stat_root_file_and_directory() {
    let (_dir, _backend, c) = mounted();
    let root = c.stat(&NsPath::root()).unwrap();
    assert_eq!((root.kind, root.size), (EntryKind::Directory, 0));
    write(&*c, "/f", b"hello");
    let f = c.stat(&p("/f")).unwrap();
    assert_eq!((f.kind, f.size, f.mode), (EntryKind::File, 5, 0o644));
    assert!(f.mtime_ns > 1_600_000_000_000_000_000, "{}", f.mtime_ns);
    assert_ne!(f.object_id, root.object_id);
    assert_not_found(c.stat(&p("/missing")), "/missing");
    assert_not_found(c.stat(&p("/missing/deeper")), "/missing");
    match expect_err(c.stat(&p("/f/x"))) {
        Error::NotADirectory { path } => assert_eq!(path, "/f"),
        e => panic!("{e:?}"),
    }
}

#[test]
fn mkdir_cases() {
    let (_dir, _backend, c) = mounted();
    let a = c.mkdir(&p("/a"), 0o750).unwrap();
    assert_eq!((a.kind, a.mode), (EntryKind::Directory, 0o750));
    c.mkdir(&p("/a/b"), 0o755).unwrap();
    // Owner access is always kept, set-id bits never.
    assert_eq!(c.mkdir(&p("/locked"), 0o7000).unwrap().mode, 0o700);
    assert_not_found(c.mkdir(&p("/x/y"), 0o755), "/x");
    assert!(matches!(c.mkdir(&p("/a"), 0o755), Err(Error::AlreadyExists { path }) if path == "/a"));
    assert!(matches!(c.mkdir(&NsPath::root(), 0o755), Err(Error::AlreadyExists { .. })));
    touch(&*c, "/f");
    assert!(matches!(c.mkdir(&p("/f"), 0o755), Err(Error::AlreadyExists { .. })));
    assert!(matches!(c.mkdir(&p("/f/d"), 0o755), Err(Error::NotADirectory { path }) if path == "/f"));
}

#[test]
fn open_modes() {
    let (_dir, _backend, c) = mounted();
    let ro = OpenOptions::default();
    assert_not_found(c.open(&p("/f"), ro, 0), "/f");
    assert_not_found(c.open(&p("/nodir/f"), create(), 0o644), "/nodir");

    let f = c.open(&p("/f"), create(), 0o640).unwrap();
    assert!(f.writable());
    assert_eq!(f.path(), &p("/f"));
    assert_eq!(f.stat().unwrap().mode, 0o640);
    f.write_at(b"data", 0).unwrap();

    // Plain open of an existing file, create without exclusive: same file, kept.
    let again = c.open(&p("/f"), create(), 0o600).unwrap();
    assert_eq!(again.stat().unwrap().size, 4);
    assert_eq!(again.stat().unwrap().object_id, f.stat().unwrap().object_id);

    let excl = OpenOptions { exclusive: true, ..create() };
    assert!(matches!(c.open(&p("/f"), excl, 0o644), Err(Error::AlreadyExists { path }) if path == "/f"));
    c.open(&p("/g"), excl, 0o644).unwrap();

    let read_only = c.open(&p("/f"), ro, 0).unwrap();
    assert!(!read_only.writable());
    match expect_err(read_only.write_at(b"x", 0)) {
        Error::AccessMode { path, .. } => assert_eq!(path, "/f"),
        e => panic!("{e:?}"),
    }
    assert!(matches!(read_only.truncate(0), Err(Error::AccessMode { .. })));
    read_only.sync().unwrap();

    let trunc = OpenOptions { truncate: true, write: true, ..OpenOptions::default() };
    assert_eq!(c.open(&p("/f"), trunc, 0).unwrap().stat().unwrap().size, 0);

    let bad_trunc = OpenOptions { truncate: true, ..OpenOptions::default() };
    assert!(matches!(c.open(&p("/f"), bad_trunc, 0), Err(Error::InvalidArgument(_))));
    let bad_excl = OpenOptions { exclusive: true, ..OpenOptions::default() };
    assert!(matches!(c.open(&p("/f"), bad_excl, 0), Err(Error::InvalidArgument(_))));

    // A read-only create makes the file.
    c.open(&p("/ro-created"), OpenOptions { create: true, ..OpenOptions::default() }, 0o644).unwrap();
    assert_eq!(c.stat(&p("/ro-created")).unwrap().size, 0);

    // The layout hints are accepted and ignored.
    let hinted = OpenOptions { layout: crate::Layout { chunk_bytes: 4096, object_class: 7 }, ..create() };
    c.open(&p("/hinted"), hinted, 0o644).unwrap();
}

#[test]
fn open_of_a_directory_is_refused_in_every_mode() {
    let (_dir, _backend, c) = mounted();
    c.mkdir(&p("/d"), 0o755).unwrap();
    for options in [OpenOptions::default(), create(), OpenOptions { write: true, ..OpenOptions::default() }] {
        match expect_err(c.open(&p("/d"), options, 0o644)) {
            Error::IsADirectory { path } => assert_eq!(path, "/d"),
            e => panic!("{options:?}: {e:?}"),
        }
        assert!(matches!(c.open(&NsPath::root(), options, 0o644), Err(Error::IsADirectory { .. })));
    }
}

#[test]
fn remove_cases() {
    let (_dir, _backend, c) = mounted();
    touch(&*c, "/f");
    c.remove(&p("/f"), false).unwrap();
    assert_not_found(c.stat(&p("/f")), "/f");
    assert_not_found(c.remove(&p("/f"), false), "/f");
    assert_not_found(c.remove(&p("/x/f"), true), "/x");

    c.mkdir(&p("/empty"), 0o755).unwrap();
    c.remove(&p("/empty"), false).unwrap();

    c.mkdir(&p("/d"), 0o755).unwrap();
    c.mkdir(&p("/d/sub"), 0o755).unwrap();
    write(&*c, "/d/sub/f", b"x");
    touch(&*c, "/d/g");
    match expect_err(c.remove(&p("/d"), false)) {
        Error::DirectoryNotEmpty { path } => assert_eq!(path, "/d"),
        e => panic!("{e:?}"),
    }
    c.stat(&p("/d/sub/f")).unwrap();
    c.remove(&p("/d"), true).unwrap();
    assert_not_found(c.stat(&p("/d")), "/d");
    // Recursive on a file is just a remove.
    touch(&*c, "/h");
    c.remove(&p("/h"), true).unwrap();

    assert!(matches!(c.remove(&NsPath::root(), true), Err(Error::InvalidArgument(_))));
    assert!(names(&*c, "/").is_empty());
}

#[test]
fn recursive_remove_of_a_wide_and_deep_tree() {
    let (_dir, _backend, c) = mounted();
    let mut path = p("/top");
    c.mkdir(&path, 0o755).unwrap();
    for depth in 0..20 {
        for i in 0..5 {
            touch(&*c, &format!("{path}/f{i}"));
        }
        path = path.join(&format!("d{depth}")).unwrap();
        c.mkdir(&path, 0o755).unwrap();
    }
    c.remove(&p("/top"), true).unwrap();
    assert!(names(&*c, "/").is_empty());
}

#[test]
fn replace_swaps_a_file_in_one_step_and_refuses_directories() {
    let (_dir, _backend, c) = mounted();
    write(&*c, "/old", b"old contents");
    write(&*c, "/.old.dpuio-put.x", b"new");
    c.replace(&p("/.old.dpuio-put.x"), &p("/old")).unwrap();
    assert_not_found(c.stat(&p("/.old.dpuio-put.x")), "/.old.dpuio-put.x");
    assert_eq!(c.stat(&p("/old")).unwrap().size, 3);
    // Onto a name that does not exist: an ordinary rename.
    c.replace(&p("/old"), &p("/fresh")).unwrap();
    assert_eq!(c.stat(&p("/fresh")).unwrap().size, 3);
    // Never a directory, either side; never itself or the root.
    c.mkdir(&p("/d"), 0o755).unwrap();
    assert!(matches!(c.replace(&p("/fresh"), &p("/d")), Err(Error::IsADirectory { path }) if path == "/d"));
    assert!(matches!(c.replace(&p("/d"), &p("/fresh")), Err(Error::IsADirectory { path }) if path == "/d"));
    assert!(matches!(c.replace(&p("/fresh"), &p("/fresh")), Err(Error::InvalidRename { .. })));
    assert!(matches!(c.replace(&p("/fresh"), &p("/")), Err(Error::InvalidRename { .. })));
    assert_not_found(c.replace(&p("/missing"), &p("/fresh")), "/missing");
    assert_eq!(c.stat(&p("/fresh")).unwrap().size, 3);
    assert_eq!(c.stat(&p("/d")).unwrap().kind, EntryKind::Directory);
    c.sync().unwrap();
}

#[test]
fn rename_cases() {
    let (_dir, _backend, c) = mounted();
    write(&*c, "/f", b"content");
    c.rename(&p("/f"), &p("/g")).unwrap();
    assert_not_found(c.stat(&p("/f")), "/f");
    assert_eq!(c.stat(&p("/g")).unwrap().size, 7);

    // Into another directory, and a directory with its contents.
    c.mkdir(&p("/d"), 0o755).unwrap();
    c.rename(&p("/g"), &p("/d/g")).unwrap();
    c.rename(&p("/d"), &p("/e")).unwrap();
    assert_eq!(c.stat(&p("/e/g")).unwrap().size, 7);

    assert_not_found(c.rename(&p("/missing"), &p("/x")), "/missing");
    assert_not_found(c.rename(&p("/e/g"), &p("/nodir/g")), "/nodir");

    // Never replaces: file onto file, file onto directory, directory onto file.
    touch(&*c, "/other");
    c.mkdir(&p("/dir2"), 0o755).unwrap();
    for (from, to) in [("/e/g", "/other"), ("/e/g", "/dir2"), ("/dir2", "/other"), ("/e", "/dir2")] {
        match expect_err(c.rename(&p(from), &p(to))) {
            Error::AlreadyExists { path } => assert_eq!(path, to),
            e => panic!("{from} -> {to}: {e:?}"),
        }
    }
    assert_eq!(c.stat(&p("/other")).unwrap().size, 0);
    assert!(matches!(c.rename(&p("/e"), &p("/e")), Err(Error::AlreadyExists { .. })));

    // Into its own subtree, and the root.
    c.mkdir(&p("/e/sub"), 0o755).unwrap();
    for (from, to) in [("/e", "/e/sub/x"), ("/e", "/e/x"), ("/", "/x"), ("/e", "/")] {
        assert!(matches!(c.rename(&p(from), &p(to)), Err(Error::InvalidRename { .. })), "{from} -> {to}");
    }
    // A file "into itself" is a file used as a directory.
    assert!(matches!(c.rename(&p("/other"), &p("/other/x")), Err(Error::NotADirectory { .. })));
    // A sibling with a common prefix is not a subtree.
    c.rename(&p("/e"), &p("/e2")).unwrap();
    c.rename(&p("/e2"), &p("/e")).unwrap();
    assert_eq!(c.stat(&p("/e/g")).unwrap().size, 7);
}

#[test]
fn truncate_by_path() {
    let (_dir, _backend, c) = mounted();
    write(&*c, "/f", b"0123456789");
    c.truncate(&p("/f"), 4).unwrap();
    assert_eq!(c.stat(&p("/f")).unwrap().size, 4);
    c.truncate(&p("/f"), 1 << 30).unwrap();
    assert_eq!(c.stat(&p("/f")).unwrap().size, 1 << 30);
    let mut buf = [9u8; 8];
    let f = c.open(&p("/f"), OpenOptions::default(), 0).unwrap();
    assert_eq!(f.read_at(&mut buf, 2).unwrap(), 8);
    assert_eq!(buf, [b'2', b'3', 0, 0, 0, 0, 0, 0]);

    c.mkdir(&p("/d"), 0o755).unwrap();
    assert!(matches!(c.truncate(&p("/d"), 0), Err(Error::IsADirectory { path }) if path == "/d"));
    assert!(matches!(c.truncate(&NsPath::root(), 0), Err(Error::IsADirectory { .. })));
    assert_not_found(c.truncate(&p("/missing"), 0), "/missing");
    assert!(matches!(c.truncate(&p("/f"), u64::MAX), Err(Error::InvalidArgument(_))));
    c.sync().unwrap();
}

#[test]
fn readdir_orders_batches_and_resumes() {
    let (_dir, _backend, c) = mounted();
    for name in ["b", "a", "C", "é", "aa", "z"] {
        touch(&*c, &format!("/{name}"));
    }
    c.mkdir(&p("/dir"), 0o755).unwrap();
    assert_eq!(names(&*c, "/"), ["C", "a", "aa", "b", "dir", "z", "é"]);

    let (first, more) = rd(&*c, &NsPath::root(), None, 3).unwrap();
    assert!(more);
    assert_eq!(first.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["C", "a", "aa"]);
    let (second, more) = rd(&*c, &NsPath::root(), Some("aa"), 3).unwrap();
    assert!(more);
    assert_eq!(second.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["b", "dir", "z"]);
    let (last, more) = rd(&*c, &NsPath::root(), Some("z"), 3).unwrap();
    assert!(!more);
    assert_eq!(last.len(), 1);
    // Exactly filling the batch at the end is not "more".
    assert!(!rd(&*c, &NsPath::root(), Some("b"), 3).unwrap().1);
    // An anchor that no longer exists still resumes in order.
    let (after, _) = rd(&*c, &NsPath::root(), Some("ab"), 1).unwrap();
    assert_eq!(after[0].name, "b");
    assert_eq!(rd(&*c, &NsPath::root(), Some("é"), 3).unwrap(), (vec![], false));

    // Attributes come with the entries.
    let dir = second.iter().find(|e| e.name == "dir").unwrap();
    assert_eq!(dir.attr, c.stat(&p("/dir")).unwrap());
    assert_eq!(second[0].attr.kind, EntryKind::File);

    assert_eq!(rd(&*c, &p("/dir"), None, 10).unwrap(), (vec![], false));
    assert!(matches!(rd(&*c, &NsPath::root(), None, 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(rd(&*c, &p("/a"), None, 10), Err(Error::NotADirectory { path }) if path == "/a"));
    assert_not_found(rd(&*c, &p("/missing"), None, 10), "/missing");
}

#[test]
fn readdir_sees_changes_between_batches() {
    let (_dir, _backend, c) = mounted();
    for name in ["a", "c", "e"] {
        touch(&*c, &format!("/{name}"));
    }
    assert_eq!(rd(&*c, &NsPath::root(), None, 1).unwrap().0[0].name, "a");
    touch(&*c, "/d");
    c.remove(&p("/c"), false).unwrap();
    let (rest, more) = rd(&*c, &NsPath::root(), Some("a"), 10).unwrap();
    assert!(!more);
    assert_eq!(rest.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["d", "e"]);
    c.rename(&p("/e"), &p("/b")).unwrap();
    c.mkdir(&p("/f"), 0o755).unwrap();
    assert_eq!(names(&*c, "/"), ["a", "b", "d", "f"]);
}

#[test]
fn readdir_of_20k_entries_in_batches_reads_the_directory_once() {
    let (dir, backend, c) = mounted_in_memory();
    c.mkdir(&p("/big"), 0o755).unwrap();
    // Made behind the container's back, for speed; the names are what matter.
    let host = dir.path().join("root/containers/c/big");
    for i in 0..20_000 {
        fs::File::create(host.join(format!("entry-{i:05}"))).unwrap();
    }
    let fills_before = fills(&backend);
    let started = Instant::now();
    let (mut anchor, mut seen, mut batches) = (None::<String>, 0, 0);
    loop {
        let (entries, more) = rd(&*c, &p("/big"), anchor.as_deref(), 1000).unwrap();
        assert_eq!(entries.len(), if more { 1000 } else { 20_000 - seen });
        for (k, entry) in entries.iter().enumerate() {
            assert_eq!(entry.name, format!("entry-{:05}", seen + k));
        }
        seen += entries.len();
        batches += 1;
        anchor = entries.last().map(|e| e.name.clone());
        if !more {
            break;
        }
    }
    assert_eq!((seen, batches), (20_000, 20));
    // The guard against O(n²): one scan for all twenty batches.
    assert_eq!(fills(&backend) - fills_before, 1);
    eprintln!("20 batches of 1000 in {:?}", started.elapsed());
}

#[test]
fn listings_racing_with_creates_never_stay_stale() {
    let (_dir, _backend, c) = mounted_in_memory();
    c.mkdir(&p("/d"), 0o755).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..400 {
                touch(&*c, &format!("/d/f{i:03}"));
            }
        });
        s.spawn(|| {
            for _ in 0..200 {
                let listed = names(&*c, "/d");
                assert!(listed.windows(2).all(|w| w[0] < w[1]), "sorted, no duplicates");
            }
        });
    });
    // Every create happened after some fill began; none may hide behind a cached
    // listing whose directory version did not visibly change.
    let listed = names(&*c, "/d");
    assert_eq!(listed, (0..400).map(|i| format!("f{i:03}")).collect::<Vec<_>>());
}

#[test]
fn readdir_of_a_directory_too_large_to_cache_is_still_complete() {
    let options = super::super::LocalOptions { listing_cache_bytes: 64, ..Default::default() };
    let (dir, _backend, c) = mounted_with(options);
    for i in (0..50).rev() {
        touch(&*c, &format!("/n{i:02}"));
    }
    // Not listed: links and special files.
    symlink("/etc", dir.path().join("root/containers/c/n25x")).unwrap();
    let mut all = Vec::new();
    let mut anchor = None::<String>;
    loop {
        let (entries, more) = rd(&*c, &NsPath::root(), anchor.as_deref(), 7).unwrap();
        assert!(entries.len() == 7 || !more);
        all.extend(entries.into_iter().map(|e| e.name));
        anchor = all.last().cloned();
        if !more {
            break;
        }
    }
    assert_eq!(all, (0..50).map(|i| format!("n{i:02}")).collect::<Vec<_>>());
}

#[test]
fn readdir_skips_what_it_cannot_serve() {
    let (dir, _backend, c) = mounted();
    touch(&*c, "/a");
    let host = dir.path().join("root/containers/c");
    symlink(dir.path(), host.join("link")).unwrap();
    assert_eq!(names(&*c, "/"), ["a"]);
}

#[test]
fn paths_cannot_leave_the_container() {
    let (dir, backend, c) = mounted();
    // Escapes never parse.
    for escape in ["/a/../../etc", "/../c2", "..", "/./x"] {
        assert!(matches!(NsPath::parse(escape), Err(Error::InvalidPath { .. })), "{escape}");
    }
    // A neighbour container and a secret outside the root.
    let neighbour = backend.mount("neighbour", true).unwrap();
    write(&*neighbour, "/secret", b"neighbour data");
    fs::write(dir.path().join("outside"), b"host data").unwrap();

    // Links planted in the tree (by anyone but the agent) are refused, not followed.
    let host = dir.path().join("root/containers/c");
    symlink(dir.path(), host.join("up")).unwrap();
    symlink(dir.path().join("outside"), host.join("file-link")).unwrap();
    symlink("../neighbour", host.join("rel")).unwrap();
    for path in ["/up", "/up/outside", "/file-link", "/rel/secret", "/rel"] {
        let path = p(path);
        let refused = |r: Result<()>| match r {
            Err(Error::UnsupportedEntry { path: shown, reason }) => {
                assert!(reason.contains("symbolic link"), "{reason}");
                assert!(!shown.contains(dir.path().to_str().unwrap()), "host path leaked: {shown}");
            }
            other => panic!("{path}: {other:?}"),
        };
        refused(c.stat(&path).map(drop));
        refused(c.open(&path, OpenOptions::default(), 0).map(drop));
        refused(c.open(&path, create(), 0o644).map(drop));
        if path.components().count() > 1 {
            refused(c.mkdir(&path, 0o755).map(drop));
            refused(rd(&*c, &path, None, 10).map(drop));
            refused(c.truncate(&path, 0));
        }
    }
    // The error names the component that is a link, not the whole path.
    match expect_err(c.open(&p("/up/outside"), create(), 0o644)) {
        Error::UnsupportedEntry { path, .. } => assert_eq!(path, "/up"),
        e => panic!("{e:?}"),
    }
    // Removing a link removes the link only.
    c.remove(&p("/file-link"), false).unwrap();
    c.remove(&p("/up"), true).unwrap();
    assert_eq!(fs::read(dir.path().join("outside")).unwrap(), b"host data");
    // Recursive remove does not descend through a link either.
    c.mkdir(&p("/d"), 0o755).unwrap();
    symlink(dir.path(), host.join("d/up")).unwrap();
    c.remove(&p("/d"), true).unwrap();
    assert_eq!(fs::read(dir.path().join("outside")).unwrap(), b"host data");
    let mut buf = [0u8; 14];
    neighbour.open(&p("/secret"), OpenOptions::default(), 0).unwrap().read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"neighbour data");
}

#[test]
fn errors_never_name_host_paths() {
    let (dir, _backend, c) = mounted();
    let host = dir.path().to_str().unwrap().to_owned();
    let errors = [
        expect_err(c.stat(&p("/nope"))),
        expect_err(c.mkdir(&p("/a/b"), 0o755)),
        expect_err(rd(&*c, &p("/x"), None, 1)),
        expect_err(c.rename(&p("/x"), &p("/y"))),
    ];
    for e in errors {
        assert!(!e.to_string().contains(&host), "{e}");
    }
}

#[test]
fn invalid_names_never_reach_the_container() {
    let (_dir, _backend, c) = mounted();
    let long = "n".repeat(MAX_NAME_BYTES + 1);
    for bad in ["", ".", "..", "a/b", "a\0b", long.as_str()] {
        assert!(matches!(NsPath::root().join(bad), Err(Error::InvalidPath { .. })), "{bad:?}");
    }
    // The longest valid name works end to end.
    let longest = NsPath::root().join(&"n".repeat(MAX_NAME_BYTES)).unwrap();
    c.mkdir(&longest, 0o755).unwrap();
    c.stat(&longest).unwrap();
}

#[test]
fn sync_flushes_what_changed() {
    let (_dir, _backend, c) = mounted();
    c.mkdir(&p("/a"), 0o755).unwrap();
    c.mkdir(&p("/a/b"), 0o755).unwrap();
    write(&*c, "/a/b/f", b"data");
    c.rename(&p("/a"), &p("/z")).unwrap();
    c.truncate(&p("/z/b/f"), 2).unwrap();
    touch(&*c, "/gone");
    c.remove(&p("/gone"), false).unwrap();
    c.sync().unwrap();
    c.sync().unwrap();
}

#[test]
fn sync_after_overflow_flushes_everything() {
    let options = super::super::LocalOptions { max_dirty_dirs: 2, max_dirty_files: 1, ..Default::default() };
    let (_dir, _backend, c) = mounted_with(options);
    for i in 0..5 {
        c.mkdir(&p(&format!("/d{i}")), 0o755).unwrap();
        write(&*c, &format!("/d{i}/f"), b"x");
    }
    c.sync().unwrap();
    c.sync().unwrap();
}
