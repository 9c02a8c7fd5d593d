//! Key rotation through a running container and offline, and key status.

use super::*;

#[test]
fn rotation_rewraps_every_file_and_keeps_it_readable() {
    let env = Env::new();
    let raw = env.raw("c");
    let (k1, k2, k3) = (env.key_file("k1"), env.key_file("k2"), env.key_file("k3"));
    let v1 = encrypted(&raw, settings("t", "c", source(&[("t", 1, &k1)]), 1));
    let mut rng = StdRng::seed_from_u64(11);
    v1.mkdir(&p("/d"), 0o755).unwrap();
    v1.mkdir(&p("/d/e"), 0o755).unwrap();
    let mut files = BTreeMap::new();
    for (name, len) in [("/a", 10), ("/d/b", 3 * B + 1), ("/d/e/c", 0), ("/d/e/z", B)] {
        let data = random_bytes(&mut rng, len);
        v1.open(&p(name), rw(), 0o644).unwrap().write_at(&data, 0).unwrap();
        files.insert(name, data);
    }
    // A plaintext file from before encryption, and an empty one without a header.
    raw.open(&p("/legacy"), rw(), 0o644).unwrap().write_at(b"plain", 0).unwrap();
    raw.open(&p("/d/empty"), rw(), 0o644).unwrap();
    let status = key_status(&*raw).unwrap();
    assert_eq!(status.files_by_version, BTreeMap::from([(1, 4)]));
    assert_eq!((status.unencrypted, status.unreadable), (2, 0));
    assert!(!status.can_retire(1) && status.can_retire(2));
    drop(v1);

    // The agent gets version 2 and rotates while files are open.
    let both = encrypted(&raw, settings("t", "c", source(&[("t", 1, &k1), ("t", 2, &k2)]), 1));
    let reader = both.open(&p("/d/b"), ro(), 0).unwrap();
    let writer = both.open(&p("/a"), rw(), 0).unwrap();
    let report = both.rotate(1, 2).unwrap();
    assert_eq!((report.rewrapped, report.unencrypted, report.failed), (4, 2, 0), "{report:?}");
    assert_eq!(both.key_version(), 2);
    assert_eq!(read_all(&*reader), files["/d/b"]);
    writer.write_at(b"after rotation", 5).unwrap();
    writer.truncate(40).unwrap();
    let mut a = files["/a"][..5].to_vec();
    a.extend_from_slice(b"after rotation");
    a.resize(40, 0);
    files.insert("/a", a);
    both.open(&p("/new"), rw(), 0o644).unwrap().write_at(b"new file", 0).unwrap();
    files.insert("/new", b"new file".to_vec());
    drop((reader, writer));
    let status = both.key_status().unwrap();
    assert_eq!(status.files_by_version, BTreeMap::from([(2, 5)]));
    assert!(status.can_retire(1));
    // Again: nothing left to do.
    assert_eq!(both.rotate(1, 2).unwrap().already_new, 5);
    assert!(matches!(both.rotate(2, 2), Err(Error::InvalidArgument(_))));
    assert!(matches!(both.rotate(2, 7), Err(Error::Key { .. })));

    // Version 1 retired: everything reads with version 2 alone.
    let v2 = encrypted(&raw, settings("t", "c", source(&[("t", 2, &k2)]), 2));
    for (name, data) in &files {
        assert_eq!(&read_all(&*v2.open(&p(name), ro(), 0).unwrap()), data, "{name}");
    }
    drop(v2);

    // Offline rotation on the raw container, 2 -> 3.
    let s23 = settings("t", "c", source(&[("t", 2, &k2), ("t", 3, &k3)]), 3);
    let report = rotate(&*raw, &s23, 2, 3).unwrap();
    assert_eq!((report.rewrapped, report.unencrypted, report.failed), (5, 2, 0), "{report:?}");
    assert_eq!(key_status(&*raw).unwrap().files_by_version, BTreeMap::from([(3, 5)]));
    let v3 = encrypted(&raw, settings("t", "c", source(&[("t", 3, &k3)]), 3));
    for (name, data) in &files {
        assert_eq!(&read_all(&*v3.open(&p(name), ro(), 0).unwrap()), data, "{name}");
    }
    // A damaged header is reported, and keeps its key from being retired.
    flip(&env.stored("c", "/d/b"), 3);
    let status = key_status(&*raw).unwrap();
    assert_eq!((status.unreadable, status.unreadable_files[0].0.as_str()), (1, "/d/b"));
    assert!(!status.can_retire(2));
    let s34 = settings("t", "c", source(&[("t", 3, &k3), ("t", 4, &k1)]), 4);
    let report = rotate(&*raw, &s34, 3, 4).unwrap();
    assert_eq!((report.rewrapped, report.failed, report.failures[0].0.as_str()), (4, 1, "/d/b"));
}
