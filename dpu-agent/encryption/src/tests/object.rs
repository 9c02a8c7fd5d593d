//! One file's blocks: tampering fails exactly the block touched, random access
//! against a plaintext model, concurrent and parallel writers, reads in groups.

use super::*;

#[test]
fn flipping_any_byte_of_a_block_fails_that_block_only() {
    let (env, _raw, enc) = single();
    let (content, stored) = three_and_a_bit(&env, &enc, "/f", 2);
    let f = enc.open(&p("/f"), ro(), 0).unwrap();
    // Every byte of block 1 (nonce, ciphertext, tag) and of the short last block.
    let targets = (H + SB..H + 2 * SB).map(|at| (1, at)).chain((H + 3 * SB..H + 3 * SB + 128).map(|at| (3, at)));
    for (index, at) in targets {
        flip(&stored, at);
        assert_block_fails(&*f, index, &content, &format!("byte {at}"));
        for other in (0..4).filter(|&i| i != index) {
            assert_block_reads(&*f, other, &content);
        }
        flip(&stored, at);
    }
    assert_eq!(read_all(&*f), content);
    // Sampled bytes of the other blocks.
    for at in [H, H + 11, H + 12, H + 2000, H + SB - 16, H + SB - 1, H + 2 * SB + 5, H + 3 * SB - 1] {
        flip(&stored, at);
        let index = (at - H) / SB;
        assert_block_fails(&*f, index, &content, &format!("byte {at}"));
        flip(&stored, at);
    }
}

#[test]
fn flipping_any_byte_of_the_header_fails_the_open() {
    let (env, _raw, enc) = single();
    let (content, stored) = three_and_a_bit(&env, &enc, "/f", 3);
    for at in 0..H {
        flip(&stored, at);
        let r = enc.open(&p("/f"), ro(), 0);
        match (at, &r) {
            (_, Err(Error::Integrity { block_index: None, .. })) => {}
            // The key version: the source has no key of the flipped version.
            (24..=27, Err(Error::Key { reason, .. })) => assert!(reason.contains("\"t\""), "{reason}"),
            _ => panic!("header byte {at}: {:?}", r.map(|_| ())),
        }
        // The wrapped data key (nonce, ciphertext, tag) fails as a wrong key would.
        if (48..108).contains(&at) {
            let Err(Error::Integrity { detail, .. }) = r else { unreachable!() };
            assert!(detail.contains("tenant \"t\" version 1"), "{detail}");
        }
        flip(&stored, at);
    }
    assert_eq!(read_all(&*enc.open(&p("/f"), ro(), 0).unwrap()), content);
}

#[test]
fn moved_blocks_are_detected() {
    let env = Env::new();
    let key = env.key_file("shared");
    // Two tenants under the very same key bytes: only the binding tells them apart.
    let keys = source(&[("t", 1, &key), ("u", 1, &key)]);
    let (raw_c, raw_d) = (env.raw("c"), env.raw("d"));
    let enc = encrypted(&raw_c, settings("t", "c", keys.clone(), 1));
    let other_tenant = encrypted(&raw_d, settings("u", "d", keys, 1));
    let (x, x_path) = three_and_a_bit(&env, &enc, "/x", 4);
    let (y, y_path) = three_and_a_bit(&env, &enc, "/y", 5);
    let (_, z_path) = three_and_a_bit(&env, &other_tenant, "/z", 6);
    let original_x = fs::read(&x_path).unwrap();
    let original_y = fs::read(&y_path).unwrap();

    // Blocks 0 and 1 of one file swapped.
    let mut swapped = original_x.clone();
    swapped[H..H + SB].copy_from_slice(&original_x[H + SB..H + 2 * SB]);
    swapped[H + SB..H + 2 * SB].copy_from_slice(&original_x[H..H + SB]);
    fs::write(&x_path, &swapped).unwrap();
    let f = enc.open(&p("/x"), ro(), 0).unwrap();
    assert_block_fails(&*f, 0, &x, "swapped within a file");
    assert_block_fails(&*f, 1, &x, "swapped within a file");
    assert_block_reads(&*f, 2, &x);
    fs::write(&x_path, &original_x).unwrap();

    // Block 1 of another file of the same container.
    copy_range(&y_path, H + SB, &x_path, H + SB, SB);
    assert_block_fails(&*f, 1, &x, "from another file");
    fs::write(&x_path, &original_x).unwrap();

    // Block 1 of another tenant's file.
    copy_range(&z_path, H + SB, &x_path, H + SB, SB);
    assert_block_fails(&*f, 1, &x, "from another tenant");
    fs::write(&x_path, &original_x).unwrap();
    assert_eq!(read_all(&*f), x);
    drop(f);

    // Another file's whole header: its envelope opens, none of this file's blocks do.
    copy_range(&y_path, 0, &x_path, 0, H);
    let f = enc.open(&p("/x"), ro(), 0).unwrap();
    assert_block_fails(&*f, 0, &x, "header from another file");
    drop(f);
    fs::write(&x_path, &original_x).unwrap();
    // A header from another tenant does not even unwrap.
    copy_range(&z_path, 0, &x_path, 0, H);
    assert!(is_integrity(&enc.open(&p("/x"), ro(), 0).map(|_| ()), None));
    fs::write(&x_path, &original_x).unwrap();
    assert_eq!(read_all(&*enc.open(&p("/y"), ro(), 0).unwrap()), y);
    assert_eq!(fs::read(&y_path).unwrap(), original_y);
}

/// Random reads, writes (partial, across blocks, sparse) and truncates against a
/// plaintext model, reopening now and then (also through a fresh container, which
/// loads everything from storage again).
fn model_run(provider: &'static dyn CryptoProvider, seed: u64, ops: usize) {
    let env = Env::new();
    let raw = env.raw("c");
    let key = env.key_file("k");
    let make = || {
        let mut s = settings("t", "c", source(&[("t", 1, &key)]), 1);
        s.provider = provider;
        encrypted(&raw, s)
    };
    let mut enc = make();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model: Vec<u8> = Vec::new();
    let mut f = enc.open(&p("/m"), rw(), 0o644).unwrap();
    for op in 0..ops {
        match rng.random_range(0..100) {
            0..40 => {
                let offset =
                    if rng.random_bool(0.2) { rng.random_range(0..6) * B } else { rng.random_range(0..6 * B + 50) };
                let len = if rng.random_bool(0.2) { rng.random_range(1..3) * B } else { rng.random_range(1..3 * B) };
                let data = random_bytes(&mut rng, len);
                f.write_at(&data, offset as u64).unwrap();
                if model.len() < offset + len {
                    model.resize(offset + len, 0);
                }
                model[offset..offset + len].copy_from_slice(&data);
            }
            40..75 => {
                let offset = rng.random_range(0..7 * B);
                let len = rng.random_range(0..3 * B);
                let mut buf = vec![0xaau8; len];
                let n = f.read_at(&mut buf, offset as u64).unwrap();
                let want = model.len().saturating_sub(offset).min(len);
                assert_eq!(n, want, "op {op}: read {len} at {offset} of {}", model.len());
                assert!(n == 0 || buf[..n] == model[offset..offset + n], "op {op}: read {len} at {offset}");
            }
            75..85 => {
                let size = rng.random_range(0..6 * B);
                f.truncate(size as u64).unwrap();
                model.resize(size, 0);
            }
            85..88 => {
                // Sparse: well past the end.
                let offset = model.len() + rng.random_range(B..8 * B);
                f.write_at(b"far", offset as u64).unwrap();
                model.resize(offset, 0);
                model.extend_from_slice(b"far");
            }
            88..94 => {
                drop(f);
                if rng.random_bool(0.5) {
                    enc = make();
                }
                f = enc.open(&p("/m"), rw(), 0).unwrap();
            }
            _ => {
                assert_eq!(f.stat().unwrap().size, model.len() as u64, "op {op}");
                assert_eq!(enc.stat(&p("/m")).unwrap().size, model.len() as u64, "op {op}");
                let layout = Layout::new(B as u32).unwrap();
                assert_eq!(fs::metadata(env.stored("c", "/m")).unwrap().len(), layout.stored_bytes(model.len() as u64));
            }
        }
    }
    assert_eq!(read_all(&*f), model);
    // Another open shares the state; a read-only one sees the same bytes.
    assert_eq!(read_all(&*enc.open(&p("/m"), ro(), 0).unwrap()), model);
    assert_eq!(read_all(&*make().open(&p("/m"), ro(), 0).unwrap()), model);
}

#[test]
fn random_access_matches_a_plaintext_model() {
    model_run(&AWS_LC_RS, 7, 1500);
    model_run(&RUST_CRYPTO, 8, 300);
}

/// The pattern byte at file offset `at` written by writer `t`.
fn pattern(t: usize, at: usize) -> u8 {
    ((at % 251) as u8) ^ (t as u8 + 1) ^ 0x80
}

#[test]
fn concurrent_writers_of_disjoint_ranges_and_a_reader() {
    let (_env, _raw, enc) = single();
    let f = enc.open(&p("/f"), rw(), 0o644).unwrap();
    const PIECE: usize = 3000; // not block aligned: neighbours share blocks
    const THREADS: usize = 4;
    const PIECES: usize = 40;
    let total = PIECE * THREADS * PIECES;
    let owner = |at: usize| (at / PIECE) % THREADS;
    let done = std::sync::atomic::AtomicBool::new(false);
    thread::scope(|s| {
        let mut writers = Vec::new();
        for t in 0..THREADS {
            let f = &f;
            writers.push(s.spawn(move || {
                for i in 0..PIECES {
                    let start = (i * THREADS + t) * PIECE;
                    let data: Vec<u8> = (start..start + PIECE).map(|at| pattern(t, at)).collect();
                    f.write_at(&data, start as u64).unwrap();
                }
            }));
        }
        let (f, done) = (&f, &done);
        s.spawn(move || {
            let mut rng = StdRng::seed_from_u64(9);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let offset = rng.random_range(0..total);
                let mut buf = vec![0u8; rng.random_range(1..3 * B)];
                let n = f.read_at(&mut buf, offset as u64).expect("a reader never sees a torn block");
                for (k, &b) in buf[..n].iter().enumerate() {
                    let at = offset + k;
                    assert!(b == 0 || b == pattern(owner(at), at), "byte {at}: {b}");
                }
            }
        });
        for writer in writers {
            writer.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let content = read_all(&*f);
    assert_eq!(content.len(), total);
    for (at, &b) in content.iter().enumerate() {
        assert_eq!(b, pattern(owner(at), at), "byte {at}");
    }
}

#[test]
fn parallel_pieces_of_one_large_write_to_a_new_file() {
    // The data plane's shape: 256 KiB pieces of one request on several threads, at
    // the default 64 KiB blocks; every piece extends the file.
    let env = Env::new();
    let raw = env.raw("c");
    let key = env.key_file("k");
    let mut s = settings("t", "c", source(&[("t", 1, &key)]), 1);
    s.block_bytes = dpuio_crypto::DEFAULT_BLOCK_BYTES;
    let enc = encrypted(&raw, s);
    let f = enc.open(&p("/big"), rw(), 0o644).unwrap();
    let content = random_bytes(&mut StdRng::seed_from_u64(10), 16 * 256 * 1024 + 1000);
    let pieces: Vec<(usize, &[u8])> =
        content.chunks(256 * 1024).enumerate().map(|(i, c)| (i * 256 * 1024, c)).collect();
    thread::scope(|scope| {
        for lane in 0..4 {
            let (f, pieces) = (&f, &pieces);
            scope.spawn(move || {
                // Highest offsets first on some lanes: pieces land out of order.
                let mine: Vec<_> = pieces.iter().skip(lane).step_by(4).collect();
                let order: Box<dyn Iterator<Item = _>> =
                    if lane % 2 == 0 { Box::new(mine.into_iter()) } else { Box::new(mine.into_iter().rev()) };
                for (at, piece) in order {
                    f.write_at(piece, *at as u64).unwrap();
                }
            });
        }
    });
    assert_eq!(read_all(&*f), content);
    let mut pieces_back = vec![0u8; content.len()];
    thread::scope(|scope| {
        for (k, chunk) in pieces_back.chunks_mut(256 * 1024).enumerate() {
            let f = &f;
            scope.spawn(move || {
                assert_eq!(f.read_at(chunk, (k * 256 * 1024) as u64).unwrap(), chunk.len());
            });
        }
    });
    assert!(pieces_back == content);
}

#[test]
fn reads_at_the_default_block_size_fail_block_by_block() {
    // The default 64 KiB blocks: reads in groups of 4 blocks (one backend read each).
    const L: usize = dpuio_crypto::DEFAULT_BLOCK_BYTES as usize;
    const SL: usize = L + BLOCK_OVERHEAD_BYTES;
    let env = Env::new();
    let raw = env.raw("c");
    let key = env.key_file("k");
    let mut s = settings("t", "c", source(&[("t", 1, &key)]), 1);
    s.block_bytes = L as u32;
    let enc = encrypted(&raw, s);
    let content = random_bytes(&mut StdRng::seed_from_u64(14), 8 * L + 500);
    enc.open(&p("/f"), rw(), 0o644).unwrap().write_at(&content, 0).unwrap();
    let f = enc.open(&p("/f"), ro(), 0).unwrap();
    let read = |from: usize, len: usize| {
        let mut buf = vec![0xeeu8; len];
        f.read_at(&mut buf, from as u64).map(|n| {
            buf.truncate(n);
            buf
        })
    };
    // Aligned whole blocks (two groups), one block, and unaligned reads.
    assert!(read(0, 8 * L).unwrap() == content[..8 * L]);
    assert!(read(2 * L, 4 * L).unwrap() == content[2 * L..6 * L]);
    assert!(read(5 * L, L).unwrap() == content[5 * L..6 * L]);
    assert!(read(L - 3, 2 * L).unwrap() == content[L - 3..3 * L - 3]);
    assert!(read(7 * L, 2 * L).unwrap() == content[7 * L..]);

    // A flipped byte of block 4's nonce, ciphertext or tag fails block 4 only, and
    // the reader's buffer holds none of its plaintext.
    let stored = env.stored("c", "/f");
    for at in [H + 4 * SL, H + 4 * SL + 12 + 777, H + 5 * SL - 1] {
        flip(&stored, at);
        for (from, len) in [(0, 8 * L), (4 * L, L), (4 * L, 2 * L), (3 * L, 2 * L)] {
            let mut buf = vec![0xeeu8; len];
            let r = f.read_at(&mut buf, from as u64);
            assert!(is_integrity(&r, Some(4)), "byte {at}, read {from}+{len}: {r:?}");
            let block4 = &buf[4 * L - from..5 * L - from];
            assert!(block4.iter().all(|&b| b == 0 || b == 0xee), "byte {at}: plaintext of block 4 released");
        }
        assert!(read(5 * L, 3 * L).unwrap() == content[5 * L..8 * L]);
        assert!(read(0, 4 * L).unwrap() == content[..4 * L]);
        flip(&stored, at);
    }
    // A stored file cut inside block 6 fails block 6 as truncated.
    let file = fs::OpenOptions::new().write(true).open(&stored).unwrap();
    file.set_len((H + 6 * SL + 100) as u64).unwrap();
    assert!(is_integrity(&read(4 * L, 4 * L), Some(6)));
    assert!(read(4 * L, 2 * L).unwrap() == content[4 * L..6 * L]);
}

/// Sequential writes and reads in 256 KiB pieces (as the data plane splits them),
/// one thread, through the wrapper against the same on a plain file, page cache:
/// `cargo test --release -p dpuio-encryption --lib throughput -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check; run in release"]
fn throughput_against_plain() {
    let (_env, raw, enc) = single();
    let mut s = enc.settings().clone();
    s.block_bytes = dpuio_crypto::DEFAULT_BLOCK_BYTES;
    let enc = encrypted(&raw, s);
    const FILE: usize = 256 << 20;
    let data = random_bytes(&mut StdRng::seed_from_u64(13), FILE);
    let plain = raw.open(&p("/plain"), rw(), 0o644).unwrap();
    let sealed = enc.open(&p("/sealed"), rw(), 0o644).unwrap();
    for (name, object) in [("plain", &plain), ("encrypted", &sealed)] {
        let start = std::time::Instant::now();
        for (k, piece) in data.chunks(256 << 10).enumerate() {
            object.write_at(piece, (k * (256 << 10)) as u64).unwrap();
        }
        let gib_per_s = FILE as f64 / (1u64 << 30) as f64 / start.elapsed().as_secs_f64();
        println!("write (new file): {name:<9} {gib_per_s:.2} GiB/s");
    }
    let mut buf = vec![0u8; 1 << 20];
    for round in 0..3 {
        for (name, object) in [("plain", &plain), ("encrypted", &sealed)] {
            let start = std::time::Instant::now();
            for offset in (0..FILE).step_by(256 << 10) {
                let piece = &mut buf[offset % (1 << 20)..][..256 << 10];
                assert_eq!(object.read_at(piece, offset as u64).unwrap(), 256 << 10);
            }
            let gib_per_s = FILE as f64 / (1u64 << 30) as f64 / start.elapsed().as_secs_f64();
            println!("read round {round}: {name:<9} {gib_per_s:.2} GiB/s");
        }
    }
}

#[test]
fn views_write_and_read_as_slices_do() {
    let (_env, _raw, enc) = single();
    let mut rng = StdRng::seed_from_u64(41);
    let content = random_bytes(&mut rng, 3 * B + 100);
    let f = enc.open(&p("/v"), rw(), 0o644).unwrap();
    // A whole-block write, a patch inside a block and an extension, each from a view.
    f.write_from(HostBytes::from(&content[..2 * B]), 0).unwrap();
    f.write_from(HostBytes::from(&content[..]).slice(B + 7..2 * B + 300), (B + 7) as u64).unwrap();
    f.write_from(HostBytes::from(&content[..]).slice(2 * B + 300..), (2 * B + 300) as u64).unwrap();
    assert_eq!(read_all(&*f), content);
    // Reads into a part of a larger view, across blocks and short at the end.
    let mut out = vec![0xee; 2 * B];
    let mut view = HostBytesMut::from(&mut out[..]);
    let got = f.read_into(view.slice_mut(10..10 + B + 200), (2 * B + 50) as u64).unwrap();
    assert_eq!(got, B + 50);
    assert_eq!(&out[10..10 + got], &content[2 * B + 50..]);
    assert!(out[..10].iter().chain(&out[10 + got..]).all(|&b| b == 0xee), "nothing outside the bytes read");
}
