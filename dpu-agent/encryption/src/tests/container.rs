//! The container as the engine sees it: only ciphertext stored, plaintext sizes in
//! stat and listings, keys checked up front, files from before encryption.

use super::*;

#[test]
fn a_marker_written_appears_nowhere_in_storage() {
    let (env, _raw, enc) = single();
    let marker = b"MARKER-4f1c-plaintext-never-stored";
    enc.mkdir(&p("/dir"), 0o755).unwrap();
    let a = enc.open(&p("/a"), rw(), 0o644).unwrap();
    a.write_at(marker, 0).unwrap();
    let b = enc.open(&p("/dir/b"), rw(), 0o644).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    b.write_at(&random_bytes(&mut rng, 5 * B + 300), 0).unwrap();
    // Straddling a block boundary, inside a block, at the end, past the end.
    for at in [B - 5, 2 * B + 77, 5 * B + 300 - marker.len(), 7 * B + 1] {
        b.write_at(marker, at as u64).unwrap();
    }
    b.truncate(6 * B as u64 + 3).unwrap();
    b.write_at(&marker.repeat(200), 3).unwrap();
    b.sync().unwrap();
    enc.sync().unwrap();
    let content = read_all(&*b);
    assert_eq!(content.len(), 6 * B + 3);
    assert_eq!(&content[3..3 + marker.len()], marker);
    assert_eq!(&read_all(&*a), marker);
    // Sizes seen through the wrapper are plaintext sizes.
    assert_eq!(enc.stat(&p("/dir/b")).unwrap().size, 6 * B as u64 + 3);
    assert_eq!(a.stat().unwrap().size, marker.len() as u64);
    let (listing, _) = enc.readdir(&p("/dir"), None, 10).unwrap();
    assert_eq!((listing[0].name.as_str(), listing[0].attr.size), ("b", 6 * B as u64 + 3));

    let mut files = Vec::new();
    all_files(env.dir.path().join("root").as_path(), &mut files);
    assert_eq!(files.len(), 2);
    for file in files {
        let stored = fs::read(&file).unwrap();
        assert_eq!(&stored[..8], &MAGIC, "{}", file.display());
        assert!(!stored.windows(marker.len()).any(|w| w == marker), "marker found in {}", file.display());
        assert!(!stored.windows(8).any(|w| w == &marker[..8]), "marker prefix found in {}", file.display());
    }
    assert_eq!(fs::metadata(env.stored("c", "/dir/b")).unwrap().len(), (H + 6 * SB + 3 + 28) as u64);
}

#[test]
fn wrong_or_missing_keys_name_tenant_and_version() {
    let env = Env::new();
    let raw = env.raw("c");
    let (k1, k2, other) = (env.key_file("k1"), env.key_file("k2"), env.key_file("other"));
    let enc = encrypted(&raw, settings("t", "c", source(&[("t", 1, &k1)]), 1));
    enc.open(&p("/f"), rw(), 0o644).unwrap().write_at(b"secret", 0).unwrap();

    // The key of version 1 is not in the source.
    let missing = encrypted(&raw, settings("t", "c", source(&[("t", 2, &k2)]), 2));
    let Err(Error::Key { path, reason }) = missing.open(&p("/f"), ro(), 0) else { panic!("expected a key error") };
    assert_eq!(path, "/f");
    assert!(reason.contains("\"t\"") && reason.contains("version 1"), "{reason}");
    // Stat needs no key (the size is in the header).
    assert_eq!(missing.stat(&p("/f")).unwrap().size, 6);

    // Another key behind version 1.
    let wrong = encrypted(&raw, settings("t", "c", source(&[("t", 1, &other)]), 1));
    let Err(Error::Integrity { block_index: None, detail, .. }) = wrong.open(&p("/f"), ro(), 0) else {
        panic!("expected an integrity error")
    };
    assert!(detail.contains("tenant \"t\" version 1") && detail.contains("wrong key"), "{detail}");

    // A current version the source lacks is refused up front.
    let err = EncryptedContainer::new(raw.clone(), settings("t", "c", source(&[("t", 1, &k1)]), 3)).unwrap_err();
    assert!(err.to_string().contains("\"t\"") && err.to_string().contains("version 3"), "{err}");
    // And a new file cannot be made without the current key.
    let settings_new = EncryptionSettings::new("t", "c", source(&[("t", 1, &k1), ("t", 4, &k2)])).unwrap();
    assert_eq!((settings_new.key_version, settings_new.block_bytes), (4, dpuio_crypto::DEFAULT_BLOCK_BYTES));
    assert!(format!("{settings_new:?}").contains("aws-lc-rs"));

    // A key file others can read is refused by the source, with the fix.
    let loose = env.key_file("loose");
    fs::set_permissions(&loose, fs::Permissions::from_mode(0o644)).unwrap();
    let err = FileKeySource::new().add_key_file("t", 9, &loose).unwrap_err();
    assert!(err.to_string().contains("chmod 600"), "{err}");
}

#[test]
fn files_from_before_encryption_stay_readable_as_plaintext() {
    let (env, raw, enc) = single();
    raw.open(&p("/old"), rw(), 0o644).unwrap().write_at(b"hello plaintext", 0).unwrap();
    raw.open(&p("/blank"), rw(), 0o644).unwrap();
    assert_eq!(enc.stat(&p("/old")).unwrap().size, 15);
    let old = enc.open(&p("/old"), ro(), 0).unwrap();
    assert_eq!(read_all(&*old), b"hello plaintext");
    let mut part = [0u8; 5];
    assert_eq!(old.read_at(&mut part, 6).unwrap(), 5);
    assert_eq!(&part, b"plain");
    let (listing, _) = enc.readdir(&NsPath::root(), None, 10).unwrap();
    let sizes: Vec<(&str, u64)> = listing.iter().map(|e| (e.name.as_str(), e.attr.size)).collect();
    assert_eq!(sizes, [("blank", 0), ("old", 15)]);
    // Not writable in place (new bytes would be stored in the clear)...
    let Err(Error::AccessMode { reason, .. }) = enc.open(&p("/old"), OpenOptions { write: true, ..ro() }, 0) else {
        panic!("a plaintext file opened for writing")
    };
    assert!(reason.contains("plaintext"), "{reason}");
    assert!(matches!(enc.truncate(&p("/old"), 3), Err(Error::AccessMode { .. })));
    // ...but creating it again stores it encrypted, and the old handle follows.
    let new = enc.open(&p("/old"), OpenOptions { truncate: true, ..rw() }, 0).unwrap();
    new.write_at(b"now secret", 0).unwrap();
    assert_eq!(read_all(&*old), b"now secret");
    let stored = fs::read(env.stored("c", "/old")).unwrap();
    assert!(stored.starts_with(&MAGIC) && !stored.windows(6).any(|w| w == b"secret"));
    // An empty file is an empty encrypted file: the first writable open gives it a header.
    assert_eq!(read_all(&*enc.open(&p("/blank"), ro(), 0).unwrap()), b"");
    enc.open(&p("/blank"), OpenOptions { write: true, ..ro() }, 0).unwrap();
    assert_eq!(fs::metadata(env.stored("c", "/blank")).unwrap().len(), H as u64);
    assert_eq!(enc.stat(&p("/blank")).unwrap().size, 0);
    // Truncating a plaintext file to 0 makes it an empty encrypted one too.
    raw.open(&p("/old2"), rw(), 0o644).unwrap().write_at(b"more plaintext", 0).unwrap();
    enc.truncate(&p("/old2"), 0).unwrap();
    assert!(fs::read(env.stored("c", "/old2")).unwrap().starts_with(&MAGIC));

    // Something that looks like a damaged header is never served as plaintext.
    let mut near = MAGIC.to_vec();
    near[7] = b'X';
    near.extend_from_slice(&[1, 0, 0, 1]);
    near.extend_from_slice(&[0u8; 300]);
    raw.open(&p("/near"), rw(), 0o644).unwrap().write_at(&near, 0).unwrap();
    assert!(is_integrity(&enc.open(&p("/near"), ro(), 0).map(|_| ()), None));

    // A tenant that refuses plaintext files reports them as integrity errors.
    let key = env.key_file("strict");
    let mut strict = settings("t", "c", source(&[("t", 1, &key)]), 1);
    strict.plaintext_files = PlaintextFiles::Refuse;
    let strict = encrypted(&raw, strict);
    raw.open(&p("/old3"), rw(), 0o644).unwrap().write_at(b"plaintext", 0).unwrap();
    assert!(is_integrity(&strict.open(&p("/old3"), ro(), 0).map(|_| ()), None));
    assert!(is_integrity(&strict.stat(&p("/old3")), None));
}

#[test]
fn container_truncate_stat_and_readdir_speak_plaintext_sizes() {
    let (env, _raw, enc) = single();
    let f = enc.open(&p("/f"), rw(), 0o644).unwrap();
    f.write_at(&[7u8; 3 * B + 5], 0).unwrap();
    enc.truncate(&p("/f"), B as u64 + 1).unwrap();
    assert_eq!(f.stat().unwrap().size, B as u64 + 1);
    enc.truncate(&p("/f"), 2 * B as u64).unwrap();
    let mut content = vec![7u8; B + 1];
    content.resize(2 * B, 0);
    assert_eq!(read_all(&*f), content);
    assert_eq!(enc.stat(&p("/f")).unwrap().size, 2 * B as u64);
    enc.rename(&p("/f"), &p("/g")).unwrap();
    assert_eq!(read_all(&*enc.open(&p("/g"), ro(), 0).unwrap()), content);
    assert_eq!(fs::metadata(env.stored("c", "/g")).unwrap().len(), (H + 2 * SB) as u64);
    // Truncating to 0 by path makes a fresh envelope; the open handle follows.
    enc.truncate(&p("/g"), 0).unwrap();
    assert_eq!(f.stat().unwrap().size, 0);
    f.write_at(b"again", 2).unwrap();
    assert_eq!(read_all(&*f), b"\0\0again");
    let (listing, more) = enc.readdir(&NsPath::root(), None, 10).unwrap();
    assert_eq!((listing.len(), listing[0].attr.size, more), (1, 7, None));
    // A damaged header: stat reports it, the listing shows size 0 and goes on.
    flip(&env.stored("c", "/g"), 0);
    assert!(is_integrity(&enc.stat(&p("/g")), None));
    assert_eq!(enc.readdir(&NsPath::root(), None, 10).unwrap().0[0].attr.size, 0);
    // Growth past the limit of one request is refused before any work.
    flip(&env.stored("c", "/g"), 0);
    assert!(matches!(f.truncate(MAX_ZERO_FILL_BYTES + 100), Err(Error::InvalidArgument(_))));
    assert!(matches!(f.write_at(b"x", MAX_ZERO_FILL_BYTES + 100), Err(Error::InvalidArgument(_))));
    let read_only = enc.open(&p("/g"), ro(), 0).unwrap();
    assert!(matches!(read_only.write_at(b"x", 0), Err(Error::AccessMode { .. })));
    assert!(matches!(read_only.truncate(0), Err(Error::AccessMode { .. })));
}
