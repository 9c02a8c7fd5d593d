//! A host process for the data-plane end-to-end tests: it attaches through the shim and
//! does what a test needs done from *another process* than the test itself (so the
//! test can stop it, or run two at once). Not a test double: it uses the real shim.
//!
//! ```text
//! dpuio-test-host stopped-read AGENT TRANSPORT PATH BYTES
//!     over TRANSPORT (a one-sided one: ucx-shm, ofi-shm) read PATH into a fresh region; print "submitted", wait for a line on stdin
//!     (the test stops and resumes this process meanwhile), then look for the
//!     completion once, without waiting, and check the payload pattern.
//! dpuio-test-host integrity AGENT TRANSPORT PATH FILE_BYTES IO_BYTES SEED
//!     random-offset writes and reads on PATH checked against a model of the file.
//! dpuio-test-host overwrite-stream AGENT PATH FILE_BYTES SEED
//!     create PATH and fill it with generation 0 (`generation_byte`), sync, print
//!     "ready"; then overwrite random ranges (1 byte to 1 MiB, unaligned, inside the
//!     file) one at a time with generations 1, 2, ...: print "begin G OFFSET LENGTH"
//!     right before each write is submitted (its data is ready) and "end G" once it
//!     completed. Runs until a
//!     write fails (the agent was killed), then prints "stopped G: WHY" and exits 0.
//! dpuio-test-host qos-load AGENT TENANT PATH BLOCK DEPTH SECONDS
//!     attach as TENANT and read PATH (at least BLOCK bytes) from its start, over and
//!     over, BLOCK bytes at a time with DEPTH reads in flight, for SECONDS; print
//!     "bytes=N seconds=S". Any failed read is an error.
//! dpuio-test-host hostile AGENT TRANSPORT PATH
//!     attach twice over TRANSPORT and submit the hostile ring entries of
//!     `dpuio_tests::hostile` on PATH (holding `hostile::pattern_bytes`): print one line
//!     per check, "ok NAME: DETAIL" or "FAILED NAME: DETAIL", then "checks=N failed=F";
//!     exit 1 if any failed.
//! ```
//!
//! The client bundle, and `DPUIO_INTERFACE`, come from the environment as for any
//! client of the shim.
#![forbid(unsafe_code)]

use std::io::{BufRead, Write};
use std::time::Duration;

use dpuio_shim::{Access, Client, ConnectOptions, DataPlaneOptions, RegionAccess, process_cpu_time};
use rand::{Rng, SeedableRng};

/// The byte the tests put at file offset `i`.
pub fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(7).wrapping_add(3) % 251) as u8
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let result = match args.first().map(String::as_str) {
        Some("stopped-read") if args.len() == 5 => {
            runtime.block_on(stopped_read(&args[1], &args[2], &args[3], args[4].parse().expect("BYTES")))
        }
        Some("integrity") if args.len() == 7 => runtime.block_on(integrity(
            &args[1],
            &args[2],
            &args[3],
            args[4].parse().expect("FILE_BYTES"),
            args[5].parse().expect("IO_BYTES"),
            args[6].parse().expect("SEED"),
        )),
        Some("overwrite-stream") if args.len() == 5 => runtime.block_on(overwrite_stream(
            &args[1],
            &args[2],
            args[3].parse().expect("FILE_BYTES"),
            args[4].parse().expect("SEED"),
        )),
        Some("qos-load") if args.len() == 7 => runtime.block_on(qos_load(
            &args[1],
            &args[2],
            &args[3],
            args[4].parse().expect("BLOCK"),
            args[5].parse().expect("DEPTH"),
            args[6].parse().expect("SECONDS"),
        )),
        Some("hostile") if args.len() == 4 => runtime.block_on(hostile(&args[1], &args[2], &args[3])),
        _ => Err("usage: see the module docs of tests/src/bin/dpuio-test-host.rs".to_owned()),
    };
    if let Err(e) = result {
        eprintln!("dpuio-test-host: {e}");
        std::process::exit(1);
    }
}

async fn connect(agent: &str, transports: &str) -> Result<Client, String> {
    Client::connect(ConnectOptions {
        agent: agent.to_owned(),
        client_name: "dpuio-test-host".into(),
        data_plane: Some(DataPlaneOptions { transports: transports.to_owned(), rings: 2, ..Default::default() }),
        ..ConnectOptions::default()
    })
    .await
    .map_err(|e| e.to_string())
}

/// See the module docs: the checks of `dpuio_tests::hostile`, one line each.
async fn hostile(agent: &str, transport: &str, path: &str) -> Result<(), String> {
    let a = connect(agent, transport).await?;
    let b = connect(agent, transport).await?;
    let checks = dpuio_tests::hostile::hostile_entries(&a, &b, path).await;
    for check in &checks {
        println!("{check}");
    }
    let failed = checks.iter().filter(|c| !c.passed).count();
    println!("checks={} failed={failed}", checks.len());
    for client in [a, b] {
        client.detach().await.map_err(|e| e.to_string())?;
    }
    if failed == 0 { Ok(()) } else { Err(format!("{failed} of {} checks failed", checks.len())) }
}

async fn stopped_read(agent: &str, transport: &str, path: &str, bytes: usize) -> Result<(), String> {
    let client = connect(agent, transport).await?;
    let file = client.open(path, Access::ReadOnly).await.map_err(|e| e.to_string())?;
    let region = client.register_region(bytes, RegionAccess::WriteByAgent).await.map_err(|e| e.to_string())?;
    let mut batch = client.batch().map_err(|e| e.to_string())?;
    batch.push(&file.read_request(&region, 0, bytes as u64, 0)).map_err(|e| e.to_string())?;
    let cpu_before = process_cpu_time();
    batch.submit().map_err(|e| e.to_string())?;
    println!("submitted");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).map_err(|e| e.to_string())?;
    // One look, no waiting: the completion must already be in this process's memory.
    let done = batch.poll();
    let cpu_ns = (process_cpu_time() - cpu_before).as_nanos();
    let present = done.len() == 1;
    let result = done.first().map(|d| d.result);
    // A copy: if the completion is not there, the agent may still be writing the region.
    let payload = region.bytes(0, region.len()).to_vec();
    let payload_ok = payload.iter().enumerate().all(|(i, &b)| b == pattern(i as u64));
    println!("present={present} result={result:?} payload_ok={payload_ok} cpu_ns={cpu_ns}");
    if !present {
        // Let the request finish before the region goes away.
        batch.wait(1, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    }
    drop(batch);
    client.detach().await.map_err(|e| e.to_string())
}

/// Random writes and reads through the data plane, checked against a model.
async fn integrity(
    agent: &str,
    transports: &str,
    path: &str,
    file_bytes: u64,
    io_bytes: u64,
    seed: u64,
) -> Result<(), String> {
    let client = connect(agent, transports).await?;
    let file = client.create(path, false).await.map_err(|e| e.to_string())?;
    let mut model = vec![0u8; file_bytes as usize];
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    const MAX_IO: u64 = 1 << 20;
    let mut region =
        client.register_region(MAX_IO as usize, RegionAccess::ReadWrite).await.map_err(|e| e.to_string())?;
    let cpu_before = process_cpu_time();
    let mut moved = 0u64;
    let mut checked = 0u64;
    let c = client.clone();
    while moved < io_bytes {
        let len = rng.random_range(1..=MAX_IO.min(file_bytes));
        let off = rng.random_range(0..=file_bytes - len);
        if rng.random_bool(0.5) {
            let data = &mut model[off as usize..][..len as usize];
            rng.fill(data);
            region.write_at(0, data);
            let req = file.write_request(&region, 0, len, off);
            let done = tokio::task::block_in_place(|| c.submit_blocking(&[req])).map_err(|e| e.to_string())?;
            if done[0].result != Ok(len) {
                return Err(format!("write {len} at {off}: {:?}", done[0].result));
            }
        } else {
            let req = file.read_request(&region, 0, len, off);
            let done = tokio::task::block_in_place(|| c.submit_blocking(&[req])).map_err(|e| e.to_string())?;
            let got = done[0].result.map_err(|s| format!("read {len} at {off}: {s:?}"))?;
            // The file only grows through our writes; past its end a read is short.
            let want = &model[off as usize..][..got as usize];
            if region.bytes(0, got as usize).to_vec() != want {
                return Err(format!("read {len} at {off}: data differs from what was written"));
            }
            checked += got;
        }
        moved += len;
    }
    // A final full read, checksummed against the model.
    let mut reread = 0u64;
    let mut digest_file = 0u64;
    let mut digest_model = 0u64;
    while reread < file_bytes {
        let len = MAX_IO.min(file_bytes - reread);
        let req = file.read_request(&region, 0, len, reread);
        let done = tokio::task::block_in_place(|| c.submit_blocking(&[req])).map_err(|e| e.to_string())?;
        let got = done[0].result.map_err(|s| format!("final read at {reread}: {s:?}"))?;
        digest_file = fnv(digest_file, &region.bytes(0, got as usize).to_vec());
        let expect_len = got as usize;
        digest_model = fnv(digest_model, &model[reread as usize..][..expect_len]);
        if got == 0 {
            break;
        }
        reread += got;
    }
    let cpu = process_cpu_time() - cpu_before;
    println!(
        "moved={moved} checked={checked} digest_file={digest_file:016x} digest_model={digest_model:016x} cpu_ms={}",
        cpu.as_millis()
    );
    file.close().await.map_err(|e| e.to_string())?;
    if digest_file != digest_model {
        return Err("final checksum differs".into());
    }
    Ok(())
}

/// The byte at file offset `i` after write generation `g` of `overwrite-stream`
/// covered it (generation 0 fills the file). Two generations differ in most bytes of
/// any range, so a block that mixes them, or holds another offset's bytes, shows.
/// The end-to-end test has its own copy; both must change together.
pub fn generation_byte(g: u64, i: u64) -> u8 {
    let x = (i / 8).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ g.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    let x = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (x >> (8 * (i % 8))) as u8
}

/// See the module docs: a stream of overwrites, each announced before it is
/// submitted, until the agent goes away.
async fn overwrite_stream(agent: &str, path: &str, file_bytes: u64, seed: u64) -> Result<(), String> {
    const MAX_IO: u64 = 1 << 20;
    let client = connect(agent, "shm").await?;
    let file = client.create(path, false).await.map_err(|e| e.to_string())?;
    let mut region =
        client.register_region(MAX_IO as usize, RegionAccess::ReadWrite).await.map_err(|e| e.to_string())?;
    let c = client.clone();
    let fill = |region: &mut dpuio_shim::RegisteredRegion, g: u64, off: u64, len: u64| {
        let bytes: Vec<u8> = (0..len).map(|k| generation_byte(g, off + k)).collect();
        region.write_at(0, &bytes);
    };
    let write = |region: &dpuio_shim::RegisteredRegion, off: u64, len: u64| {
        let req = file.write_request(region, 0, len, off);
        match tokio::task::block_in_place(|| c.submit_blocking(&[req])) {
            Ok(done) if done[0].result == Ok(len) => Ok(()),
            Ok(done) => Err(format!("{:?}", done[0].result)),
            Err(e) => Err(e.to_string()),
        }
    };
    let mut at = 0;
    while at < file_bytes {
        let len = MAX_IO.min(file_bytes - at);
        fill(&mut region, 0, at, len);
        write(&region, at, len).map_err(|e| format!("fill at {at}: {e}"))?;
        at += len;
    }
    file.sync().await.map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    let mut say = |line: String| writeln!(out, "{line}").and_then(|()| out.flush()).map_err(|e| e.to_string());
    say("ready".into())?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for g in 1.. {
        let len = rng.random_range(1..=MAX_IO.min(file_bytes));
        let off = rng.random_range(0..=file_bytes - len);
        // Filled first, so a write is in the agent's hands from "begin" to "end".
        fill(&mut region, g, off, len);
        say(format!("begin {g} {off} {len}"))?;
        match write(&region, off, len) {
            Ok(()) => say(format!("end {g}"))?,
            Err(e) => return say(format!("stopped {g}: {e}")),
        }
    }
    Ok(())
}

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    if h == 0 {
        h = 0xcbf2_9ce4_8422_2325;
    }
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Read as fast as the agent lets this tenant; report the bytes read.
async fn qos_load(agent: &str, tenant: &str, path: &str, block: u64, depth: usize, seconds: f64) -> Result<(), String> {
    let client = Client::connect(ConnectOptions {
        agent: agent.to_owned(),
        tenant: tenant.to_owned(),
        client_name: format!("dpuio-test-host qos-load ({tenant})"),
        data_plane: Some(DataPlaneOptions { transports: "shm".into(), rings: 1, ..Default::default() }),
        ..ConnectOptions::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    let file = client.open(path, Access::ReadOnly).await.map_err(|e| e.to_string())?;
    let blocks = client.stat(path).await.map_err(|e| e.to_string())?.size / block;
    if blocks == 0 {
        return Err(format!("{path} is shorter than one block of {block} bytes"));
    }
    let mut regions = Vec::new();
    for _ in 0..depth {
        regions
            .push(client.register_region(block as usize, RegionAccess::WriteByAgent).await.map_err(|e| e.to_string())?);
    }
    let requests: Vec<_> = regions.iter().map(|r| file.read_request(r, 0, block, 0)).collect();
    let c = client.clone();
    let (bytes, elapsed) = tokio::task::block_in_place(|| -> Result<(u64, Duration), String> {
        let mut batch = c.batch().map_err(|e| e.to_string())?;
        let start = std::time::Instant::now();
        let run_for = Duration::from_secs_f64(seconds);
        let mut next = 0u64;
        for (k, r) in requests.iter().enumerate() {
            let req = dpuio_shim::Request { file_offset: (next % blocks) * block, user_data: k as u64, ..*r };
            batch.push(&req).map_err(|e| e.to_string())?;
            next += 1;
        }
        batch.submit().map_err(|e| e.to_string())?;
        let mut bytes = 0u64;
        while batch.in_flight() > 0 {
            let done = batch.wait(1, Duration::from_secs(60)).map_err(|e| e.to_string())?;
            let going = start.elapsed() < run_for;
            for d in done {
                bytes += d.result.map_err(|s| format!("read failed: {s:?}"))?;
                if going {
                    let k = d.user_data as usize;
                    let req = dpuio_shim::Request { file_offset: (next % blocks) * block, ..requests[k] };
                    batch.push(&req).map_err(|e| e.to_string())?;
                    next += 1;
                }
            }
            batch.submit().map_err(|e| e.to_string())?;
        }
        Ok((bytes, start.elapsed()))
    })?;
    println!("bytes={bytes} seconds={:.3}", elapsed.as_secs_f64());
    client.detach().await.map_err(|e| e.to_string())
}
