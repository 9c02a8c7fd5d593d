//! `dpuio bench`: the same workload through the shim (UCX shared memory, UCX TCP) and
//! through plain POSIX calls on the same file system, interleaved in one run so the
//! ratios are measured under the same machine load.
//!
//! Workloads: `seq-read`, `seq-write`, `rand-read` (block size, queue depth), `metadata`
//! (create, stat, readdir, remove rates), `unet3d` (DLIO's 3D U-Net shape: accelerator
//! utilisation and the most simulated accelerators kept at AU >= 90%) and `checkpoint`
//! (write with fsync, then read back).
//!
//! With `--backend daos` the baseline of the block workloads, metadata, unet3d and
//! checkpoint is libdfs, on the same DAOS container the agent serves (the way pydaos
//! reads), in a child `dpuio-bench-agent` that runs each baseline step when asked
//! (`crate::libdfs`), so the rounds still interleave.
//!
//! POSIX queue depth is emulated the way fio's psync engine does it: `queue_depth`
//! threads each doing blocking `pread`s. Host CPU is this process's CPU time
//! (all threads, the shim's progress thread included) per GiB moved; agent CPU, when
//! `--agent-pid` is given, comes from `/proc/PID/stat` (10 ms resolution).

use std::os::unix::fs::FileExt;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dpuio_bench_core::child::Request;
use dpuio_bench_core::{
    BENCH_DIR, BENCH_FILE, BaselineFile, Figures, LIBDFS, Meter, Workload, baseline_cell, offset, process_cpu,
};
use dpuio_shim::cli::ConnectArgs;
use dpuio_shim::{Access, Client, ConnectOptions, DataPlaneOptions, RegionAccess, process_cpu_time};
use rand::{Rng, SeedableRng};

use crate::args::{BenchArgs, BenchBackend, ChildPath};
use crate::libdfs::Libdfs;
use crate::preload_path::PreloadPath;
use crate::setup::{
    DECRYPT, DFUSE, FUSE, FsPath, PIL4DFS, PRELOAD, SAMPLE_WORKLOAD, Setup, bench_error, encrypted_client,
};
use crate::tcp_stream::{StreamSource, TCP_STREAM};

pub async fn run(options: &ConnectArgs, args: BenchArgs) -> dpuio_shim::Result<()> {
    if args.workloads.contains(&Workload::Soak) {
        if args.workloads.len() > 1 {
            return Err(bench_error(
                "soak starts an agent of its own: run it alone (dpuio bench soak --agent-bin ...)",
            ));
        }
        return crate::soak::run(options, &args.soak, args.qos.agent_bin.as_ref()).await;
    }
    if args.workloads.contains(&Workload::Startup) {
        if args.workloads.len() > 1 {
            return Err(bench_error(
                "startup times process starts, which other workloads running beside would disturb: run it alone \
                 (dpuio bench startup)",
            ));
        }
        return crate::startup::run(&args.startup, args.json).map_err(bench_error);
    }
    if args.workloads.contains(&Workload::Qos) {
        if args.workloads.len() > 1 {
            return Err(bench_error("qos attaches as two tenants of its own: run it alone (dpuio bench qos)"));
        }
        return crate::qos::run(options, &args).await;
    }
    // `bundle`: the encrypted tenant's client bundle (--encrypted-bundle), else the
    // connection options' tenant.
    let connect = |transports: &str, bundle: Option<&Path>| {
        let mut connect = options.connect_options(&format!("dpuio bench ({transports})"));
        if let Some(dir) = bundle {
            connect.tls = dpuio_shim::TlsOptions {
                server_name: options.tls_server_name.clone(),
                ..dpuio_shim::TlsOptions::bundle(dir)
            };
        }
        Client::connect(ConnectOptions {
            data_plane: Some(DataPlaneOptions {
                transports: transports.to_owned(),
                rings: 8,
                interface: options.interface.clone(),
                ..Default::default()
            }),
            ..connect
        })
    };
    let mut clients = Vec::new();
    for path in &args.paths {
        let (label, transports) = match path.as_str() {
            "shm" | "ucx-shm" | "shim" => ("shim-ucx-sm", "ucx-shm"),
            "tcp" | "ucx-tcp" => ("shim-ucx-tcp", "ucx-tcp"),
            "ofi-shm" => ("shim-ofi-shm", "ofi-shm"),
            "ofi-tcp" => ("shim-ofi-tcp", "ofi-tcp"),
            "posix" | FUSE | PRELOAD | TCP_STREAM | LIBDFS | DFUSE | PIL4DFS => continue,
            other => {
                return Err(bench_error(format!(
                    "unknown path {other:?}; use posix, shm, tcp, ofi-shm, ofi-tcp, fuse, preload, tcp-stream, or \
                     with --backend daos libdfs, dfuse and pil4dfs"
                )));
            }
        };
        let client = connect(transports, None).await?;
        // The encrypted tenant's row right after the plain one, measured in turn.
        let encrypted = match &args.encrypted_bundle {
            Some(dir) => Some(encrypted_client(connect(transports, Some(dir)).await?, &client, dir)?),
            None => None,
        };
        clients.push((label.to_owned(), client));
        clients.extend(encrypted.map(|c| (format!("{label}{DECRYPT}"), c)));
    }
    let child = args.preload_child.is_some();
    if args.preload_child == Some(ChildPath::Pil4dfs) {
        // libpil4dfs's statx dereferences the path without a check, and Rust's std, after
        // the first statx that fails (a file not there yet), probes whether statx works
        // by calling it with a null path: a SIGSEGV in libpil4dfs. One statx that succeeds
        // first tells std that statx works, so it never probes.
        std::fs::metadata("/").map_err(|e| bench_error(format!("pil4dfs path: stat /: {e}")))?;
    }
    if clients.is_empty() && !child {
        return Err(bench_error(
            "name at least one of shm, tcp, ofi-shm, ofi-tcp in --paths (it writes the files every path reads)",
        ));
    }
    let asked = |path: &str| args.paths.iter().any(|p| p == path);
    let daos = args.backend == BenchBackend::Daos;
    for peer in [LIBDFS, DFUSE, PIL4DFS] {
        if asked(peer) && !daos {
            return Err(bench_error(format!(
                "--paths {peer} is DAOS's own host client: it needs --backend daos (with --daos-pool and \
                 --daos-container, the agent's pool and the tenant's container)"
            )));
        }
    }
    let fuse = match asked(FUSE) {
        true => Some(crate::fuse_path::FuseMount::start(options).map_err(bench_error)?),
        false => None,
    };
    // pil4dfs needs the mount as much as dfuse does.
    let dfuse = match asked(DFUSE) || asked(PIL4DFS) {
        true => Some(crate::dfuse_path::DfuseMount::start(&args).map_err(bench_error)?),
        false => None,
    };
    let mut children = Vec::new();
    if asked(PRELOAD) {
        children.push(PreloadPath::preload(options).map_err(bench_error)?);
    }
    if let (Some(mount), true) = (&dfuse, asked(PIL4DFS)) {
        children.push(PreloadPath::pil4dfs(mount, &args).map_err(bench_error)?);
    }
    let stream = match asked(TCP_STREAM) {
        true => Some(StreamSource::start(&options.agent, args.stream_source.as_deref()).map_err(bench_error)?),
        false => None,
    };
    let posix_root = match (&args.posix_root, asked("posix")) {
        (Some(root), true) => Some(root.clone()),
        (None, true) => {
            eprintln!("dpuio bench: POSIX baseline skipped: pass --posix-root <container directory>");
            None
        }
        _ => None,
    };
    let libdfs = match args.backend {
        BenchBackend::Local => None,
        BenchBackend::Daos => Some(Mutex::new(Libdfs::start(&args).map_err(bench_error)?)),
    };
    if libdfs.is_some() && posix_root.is_some() {
        return Err(bench_error(
            "--posix-root is for --backend local; over DAOS the baselines are libdfs, dfuse and pil4dfs",
        ));
    }
    let progress = indicatif::MultiProgress::new();
    if args.json {
        progress.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    // The POSIX code's paths: the container's directory (named after the child's path
    // in a child), dpuio's FUSE mount, DAOS's.
    let mut fs_paths = Vec::new();
    if let Some(root) = posix_root {
        let label = args.preload_child.map_or("posix", |c| c.name());
        // pil4dfs reads DAOS (no page cache to warm); preload the agent's files.
        let warm = args.preload_child != Some(ChildPath::Pil4dfs);
        fs_paths.push(FsPath { label, root, helper_pid: args.host_cpu_pid, warm });
    }
    if let Some(mount) = &fuse {
        fs_paths.push(FsPath { label: FUSE, root: mount.dir.clone(), helper_pid: Some(mount.pid()), warm: false });
    }
    if let (Some(mount), true) = (&dfuse, asked(DFUSE)) {
        let warm = args.dfuse_caching;
        fs_paths.push(FsPath { label: DFUSE, root: mount.dir.clone(), helper_pid: Some(mount.pid()), warm });
    }
    let setup =
        Setup { clients, fs_paths, libdfs, agent_pid: args.agent_pid, _fuse: fuse, _dfuse: dfuse, progress, stream };
    if !args.json && !child {
        let mut paths: Vec<&str> = Vec::new();
        paths.extend(setup.fs_paths.iter().filter(|p| p.label == "posix").map(|p| p.label));
        paths.extend(setup.libdfs.as_ref().map(|_| LIBDFS));
        paths.extend(setup.clients.iter().map(|(name, _)| name.as_str()));
        paths.extend(setup.fs_paths.iter().filter(|p| p.label != "posix").map(|p| p.label));
        paths.extend(children.iter().map(|c| c.name()));
        paths.extend(setup.stream.as_ref().map(|_| TCP_STREAM));
        crate::report::legend(&paths, args.agent_pid.is_some());
    }
    let mut all: Vec<Figures> = Vec::new();
    for &workload in &args.workloads {
        let figures = match workload {
            Workload::SeqRead | Workload::RandRead | Workload::SeqWrite => {
                block_workload(&setup, &args, workload).await?
            }
            Workload::Metadata => metadata(&setup, args.metadata_files, args.seconds, args.sample_batch).await?,
            Workload::Unet3d => crate::dlio::unet3d(&setup, &args.unet3d).await?,
            Workload::Checkpoint => checkpoint(&setup, args.checkpoint_bytes).await?,
            Workload::Qos => return Err(bench_error("qos runs on its own")), // handled above
            Workload::Soak => return Err(bench_error("soak runs on its own")), // handled above
            Workload::Startup => return Err(bench_error("startup runs on its own")), // handled above
        };
        let mut figures = figures;
        for path in &children {
            let bar = setup.spinner(format!("{} {} (a child process)", workload.name(), path.name()));
            figures.extend(path.run(&args, workload).map_err(bench_error)?);
            bar.finish_and_clear();
        }
        if child {
            dpuio_bench_core::child::send(&figures);
            continue;
        }
        crate::report::report(&figures, &args);
        all.extend(figures);
    }
    if !args.json && !child {
        crate::report::summary(&all, args.agent_pid.is_some());
    }
    if let Some(path) = &args.plot {
        crate::plot::plot(&all, path).map_err(bench_error)?;
        if !args.json {
            println!("plot written to {}", path.display());
        }
    }
    for (_, c) in setup.clients {
        c.detach().await?;
    }
    Ok(())
}

/// seq-read, seq-write, rand-read: rounds of one cell per path, interleaved.
async fn block_workload(setup: &Setup, args: &BenchArgs, workload: Workload) -> dpuio_shim::Result<Vec<Figures>> {
    let block = args.block_bytes.unwrap_or(match workload {
        Workload::RandRead => 4096,
        _ => 1 << 20,
    });
    let qd = args.queue_depth.unwrap_or(match workload {
        Workload::RandRead => 32,
        _ => 1,
    });
    let threads = args.threads;
    if block == 0 || qd == 0 || threads == 0 || args.file_bytes < block {
        return Err(bench_error(
            "block size, queue depth and threads must be positive and the file at least one block",
        ));
    }
    let file_bytes = args.file_bytes - args.file_bytes % block;
    for client in setup.writers() {
        prepare_file(client, file_bytes).await?;
    }
    let mut baseline_files: Vec<(&FsPath, Arc<dyn BaselineFile>)> = Vec::new();
    for fs in &setup.fs_paths {
        let path = fs.root.join(BENCH_FILE.trim_start_matches('/'));
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(|e| {
            bench_error(format!(
                "{}: open {}: {e} (is --posix-root the container's directory?)",
                fs.label,
                path.display()
            ))
        })?;
        if fs.warm {
            // Warm the page cache, so every round reads the same cached file.
            let mut buf = vec![0u8; 4 << 20];
            let mut at = 0;
            while at < file_bytes {
                at += file.read_at(&mut buf, at).unwrap_or(0).max(1) as u64;
            }
        }
        baseline_files.push((fs, Arc::new(file)));
    }
    let duration = Duration::from_secs_f64(args.seconds);
    let mut totals: Vec<Figures> = Vec::new();
    for round in 0..args.rounds {
        let mut cells = Vec::new();
        for (fs, f) in &baseline_files {
            let name = fs.label;
            let bar = setup.spinner(format!("{} {name}, round {}", workload.name(), round + 1));
            let f = f.clone();
            let pid = setup.agent_pid;
            let helper0 = setup.helper_cpu(name);
            let mut fig = tokio::task::spawn_blocking(move || {
                baseline_cell(&*f, workload, block, qd * threads, file_bytes, duration, round as u64, pid)
            })
            .await
            .map_err(bench_error)?;
            // A FUSE daemon's share of the work is host CPU too.
            fig.host_cpu += setup.helper_cpu(name).saturating_sub(helper0);
            bar.finish_and_clear();
            fig.path = name.into();
            cells.push(fig);
        }
        let request = Request::Block {
            workload,
            block_bytes: block,
            queue_depth: qd * threads,
            file_bytes,
            seconds: args.seconds,
            seed: round as u64,
        };
        cells.extend(setup.ask_libdfs(format!("{} {LIBDFS}, round {}", workload.name(), round + 1), &request)?);
        // One TCP stream on the transports' path: the bar of the TCP rows (reads only).
        if let (Some(source), Workload::SeqRead) = (setup.stream, workload) {
            let bar = setup.spinner(format!("{} {TCP_STREAM}, round {}", workload.name(), round + 1));
            let mut fig = tokio::task::spawn_blocking(move || source.cell(block, duration))
                .await
                .map_err(bench_error)?
                .map_err(bench_error)?;
            bar.finish_and_clear();
            fig.workload = workload.name().into();
            cells.push(fig);
        }
        for (name, client) in &setup.clients {
            let bar = setup.spinner(format!("{} {name}, round {}", workload.name(), round + 1));
            let mut fig =
                shim_cell(client, workload, block, qd, threads, file_bytes, duration, round as u64, setup.agent_pid)
                    .await?;
            bar.finish_and_clear();
            fig.path = name.clone();
            cells.push(fig);
        }
        for cell in cells {
            match totals.iter_mut().find(|t| t.path == cell.path) {
                Some(t) => t.merge(cell),
                None => totals.push(cell),
            }
        }
    }
    Ok(totals)
}

/// The metadata rows through std::fs on `root` (the container's directory, or a FUSE
/// mount of it), labelled `path`.
fn fs_metadata(
    setup: &Setup,
    root: &Path,
    path: &str,
    files: usize,
    seconds: f64,
    sample_batch: usize,
) -> dpuio_shim::Result<Vec<Figures>> {
    let mut out = Vec::new();
    let bar = setup.spinner(format!("metadata {path}"));
    let dir = root.join(BENCH_DIR.trim_start_matches('/')).join(format!("meta-{path}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(bench_error)?;
    let names: Vec<PathBuf> = (0..files).map(|i| dir.join(format!("f{i:07}"))).collect();
    let steps: [(&str, &dyn Fn() -> std::io::Result<()>); 4] = [
        ("create", &|| names.iter().try_for_each(|n| std::fs::File::create_new(n).map(drop))),
        ("stat", &|| names.iter().try_for_each(|n| std::fs::metadata(n).map(drop))),
        ("readdir", &|| std::fs::read_dir(&dir)?.try_for_each(|e| e.and_then(|e| e.metadata()).map(drop))),
        ("remove", &|| names.iter().try_for_each(std::fs::remove_file)),
    ];
    for (op, step) in steps {
        let meter = Meter::start(setup, path);
        step().map_err(|e| bench_error(format!("{path} metadata {op}: {e}")))?;
        out.push(meter.finish(&format!("metadata-{op}"), files as u64, 0));
    }
    // Small-file samples: open + read + close of a whole 128 KiB file each.
    let data = sample_bytes();
    let samples: Vec<PathBuf> = (0..sample_count(files)).map(|i| dir.join(format!("s{i:05}"))).collect();
    for n in &samples {
        std::fs::write(n, &data).map_err(bench_error)?;
    }
    // Into one buffer kept across samples, as a loader filling its batch's buffers does,
    // with the calls of `std::fs::read` (open, fstat for the size, which may fail as it
    // may there: libpil4dfs's `statx` of a descriptor does; reads to the end, close). A
    // fresh 128 KiB vector per sample would make the rows depend on glibc's malloc
    // history instead of the path: such vectors are mmapped and faulted in each time
    // until the process happens to free a larger mmapped block, which raises malloc's
    // threshold (the same build measured 0.8 and 2.2 GiB/s by that alone).
    let buffer = std::cell::RefCell::new(Vec::with_capacity(SAMPLE_BYTES + 4096));
    let read = |n: &PathBuf| -> dpuio_shim::Result<()> {
        use std::io::Read;
        let failed = |e: std::io::Error| bench_error(format!("{path} sample read {}: {e}", n.display()));
        let mut buffer = buffer.borrow_mut();
        buffer.clear();
        let mut file = std::fs::File::open(n).map_err(failed)?;
        if let Ok(size) = file.metadata().map(|m| m.len() as usize) {
            buffer.reserve(size);
        }
        file.read_to_end(&mut buffer).map_err(failed)?;
        std::hint::black_box(&buffer[..]);
        Ok(())
    };
    let meter = Meter::start(setup, path);
    let ops = passes(seconds, samples.len(), || samples.iter().try_for_each(read))?;
    out.push(meter.finish(SAMPLE_WORKLOAD, ops, ops * SAMPLE_BYTES as u64));
    // The same samples a loader's batch at a time: POSIX has no batched open-read, so
    // each is still its own open, read and close.
    let meter = Meter::start(setup, path);
    let ops = passes(seconds, samples.len(), || {
        samples.chunks(sample_batch).try_for_each(|batch| batch.iter().try_for_each(read))
    })?;
    out.push(meter.finish(&sample_batch_workload(sample_batch), ops, ops * SAMPLE_BYTES as u64));
    let _ = std::fs::remove_dir_all(&dir);
    bar.finish_and_clear();
    Ok(out)
}

/// Files per second for create, stat, readdir and remove, through the shim's namespace
/// calls and through std::fs on the container's directory.
async fn metadata(setup: &Setup, files: usize, seconds: f64, sample_batch: usize) -> dpuio_shim::Result<Vec<Figures>> {
    if sample_batch == 0 {
        return Err(bench_error("--sample-batch must be at least 1"));
    }
    let mut out = Vec::new();
    for fs in &setup.fs_paths {
        out.extend(fs_metadata(setup, &fs.root, fs.label, files, seconds, sample_batch)?);
    }
    out.extend(setup.ask_libdfs(format!("metadata {LIBDFS}"), &Request::Metadata { files })?);
    for (name, client) in &setup.clients {
        let bar = setup.spinner(format!("metadata {name}"));
        let dir = format!("{BENCH_DIR}/meta-{name}");
        let _ = client.remove(&dir, true).await;
        client.mkdir(&dir, true).await?;
        let names: Vec<String> = (0..files).map(|i| format!("{dir}/f{i:07}")).collect();
        for op in ["create", "stat", "readdir", "remove"] {
            let meter = Meter::start(setup, name);
            match op {
                "create" => {
                    for n in &names {
                        client.create(n, true).await?.close().await?;
                    }
                }
                "stat" => {
                    for n in &names {
                        client.stat(n).await?;
                    }
                }
                "readdir" => {
                    let listed = client.readdir(&dir).await?.len();
                    if listed != files {
                        return Err(bench_error(format!("readdir listed {listed} of {files} files")));
                    }
                }
                _ => {
                    for n in &names {
                        client.remove(n, false).await?;
                    }
                }
            }
            out.push(meter.finish(&format!("metadata-{op}"), files as u64, 0));
        }
        // Small-file samples: one open-read submission each, into a registered region
        // (no byte through this process's CPU).
        let mut region = client.register_region(SAMPLE_BYTES + 4096, dpuio_shim::RegionAccess::ReadWrite).await?;
        region.write_at(0, &sample_bytes());
        let samples: Vec<String> = (0..sample_count(files)).map(|i| format!("{dir}/s{i:05}")).collect();
        for n in &samples {
            let f = client.create(n, true).await?;
            f.write_at(&region, SAMPLE_BYTES as u64, 0)?;
            f.close().await?;
        }
        let meter = Meter::start(setup, name);
        let ops = passes(seconds, samples.len(), || {
            samples.iter().try_for_each(|n| {
                let (_, read) = client.read_sample(n, &region, 0, (SAMPLE_BYTES + 4096) as u32)?;
                match read == SAMPLE_BYTES as u64 {
                    true => Ok(()),
                    false => Err(bench_error(format!("sample {n}: read {read} of {SAMPLE_BYTES} bytes"))),
                }
            })
        })?;
        out.push(meter.finish(SAMPLE_WORKLOAD, ops, ops * SAMPLE_BYTES as u64));
        // A loader's batch at a time: one submission of sample_batch open-reads, each
        // into its own range of one region, and one wait (Client::read_samples).
        let slot = (SAMPLE_BYTES + 4096) as u64;
        let batch_region =
            client.register_region(sample_batch * slot as usize, dpuio_shim::RegionAccess::ReadWrite).await?;
        let meter = Meter::start(setup, name);
        let ops = passes(seconds, samples.len(), || {
            samples.chunks(sample_batch).try_for_each(|batch| {
                let wanted: Vec<(&str, u64, u32)> =
                    batch.iter().enumerate().map(|(i, n)| (n.as_str(), i as u64 * slot, slot as u32)).collect();
                for (n, read) in batch.iter().zip(client.read_samples(&batch_region, &wanted)?) {
                    let (_, read) = read?;
                    if read != SAMPLE_BYTES as u64 {
                        return Err(bench_error(format!("sample {n}: read {read} of {SAMPLE_BYTES} bytes")));
                    }
                }
                Ok(())
            })
        })?;
        out.push(meter.finish(&sample_batch_workload(sample_batch), ops, ops * SAMPLE_BYTES as u64));
        let _ = client.remove(&dir, true).await;
        client.deregister_region(batch_region).await?;
        client.deregister_region(region).await?;
        bar.finish_and_clear();
    }
    Ok(out)
}

const SAMPLE_BYTES: usize = 128 * 1024;
/// The same samples read a loader's batch (`--sample-batch`) at a time.
fn sample_batch_workload(batch: usize) -> String {
    format!("{SAMPLE_WORKLOAD}-batch{batch}")
}

/// Run `pass` (one pass over `per_pass` samples) until `seconds` have passed, at least
/// once; the samples read.
fn passes(seconds: f64, per_pass: usize, mut pass: impl FnMut() -> dpuio_shim::Result<()>) -> dpuio_shim::Result<u64> {
    let (start, mut done) = (Instant::now(), 0u64);
    loop {
        pass()?;
        done += per_pass as u64;
        if start.elapsed().as_secs_f64() >= seconds {
            return Ok(done);
        }
    }
}

fn sample_count(files: usize) -> usize {
    files.clamp(1, 1000)
}

fn sample_bytes() -> Vec<u8> {
    (0..SAMPLE_BYTES).map(|i| (i * 7 + 3) as u8).collect()
}

/// Write a checkpoint in chunks and make it durable (fsync / Close), then read it back.
async fn checkpoint(setup: &Setup, bytes: u64) -> dpuio_shim::Result<Vec<Figures>> {
    const CHUNK: u64 = 8 << 20;
    const DEPTH: usize = 4;
    let bytes = bytes.max(CHUNK) / CHUNK * CHUNK;
    let mut out = Vec::new();
    let mut data = vec![0u8; CHUNK as usize];
    rand::rngs::StdRng::seed_from_u64(9).fill(&mut data[..]);
    // Every path writes its checkpoint into the bench's directory, which a run that
    // starts with checkpoint has not made yet.
    for client in setup.writers() {
        client.mkdir(BENCH_DIR, true).await?;
    }
    for fs in &setup.fs_paths {
        let (label, root) = (fs.label, &fs.root);
        let bar = setup.spinner(format!("checkpoint {label}"));
        // ext4's ordered journal makes an fsync also write out earlier dirty data: start
        // every path's checkpoint from a clean page cache.
        rustix::fs::sync();
        let path = root.join(BENCH_DIR.trim_start_matches('/')).join(format!("checkpoint-{label}.pt"));
        let meter = Meter::start(setup, label);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| bench_error(format!("{label} checkpoint: create {}: {e}", path.display())))?;
        for i in 0..bytes / CHUNK {
            f.write_all_at(&data, i * CHUNK).map_err(bench_error)?;
        }
        f.sync_all().map_err(bench_error)?;
        out.push(meter.finish("checkpoint-write", bytes / CHUNK, bytes));
        let meter = Meter::start(setup, label);
        let mut buf = vec![0u8; CHUNK as usize];
        for i in 0..bytes / CHUNK {
            f.read_exact_at(&mut buf, i * CHUNK).map_err(bench_error)?;
        }
        out.push(meter.finish("checkpoint-read", bytes / CHUNK, bytes));
        let _ = std::fs::remove_file(&path);
        bar.finish_and_clear();
    }
    // libdfs: the same chunks, dfs_write then dfs_read, one at a time (a DFS write is
    // durable when it returns; the sync is DFS's no-op).
    out.extend(setup.ask_libdfs(format!("checkpoint {LIBDFS}"), &Request::Checkpoint { bytes })?);
    for (name, client) in &setup.clients {
        let bar = setup.spinner(format!("checkpoint {name}"));
        rustix::fs::sync();
        let path = format!("{BENCH_DIR}/checkpoint-{name}.pt");
        let mut regions = Vec::new();
        for _ in 0..DEPTH {
            let mut r = client.register_region(CHUNK as usize, RegionAccess::ReadWrite).await?;
            r.write_at(0, &data);
            regions.push(r);
        }
        let meter = Meter::start(setup, name);
        let file = client.create(&path, false).await?;
        let requests: Vec<_> =
            (0..bytes / CHUNK).map(|i| file.write_request(&regions[i as usize % DEPTH], 0, CHUNK, i * CHUNK)).collect();
        run_waves(client, requests, DEPTH).await?;
        file.close().await?; // durable once Close returns (the agent fsyncs)
        out.push(meter.finish("checkpoint-write", bytes / CHUNK, bytes));
        let meter = Meter::start(setup, name);
        let file = client.open(&path, Access::ReadOnly).await?;
        let requests: Vec<_> =
            (0..bytes / CHUNK).map(|i| file.read_request(&regions[i as usize % DEPTH], 0, CHUNK, i * CHUNK)).collect();
        run_waves(client, requests, DEPTH).await?;
        file.close().await?;
        out.push(meter.finish("checkpoint-read", bytes / CHUNK, bytes));
        client.remove(&path, false).await?;
        for r in regions {
            client.deregister_region(r).await?;
        }
        bar.finish_and_clear();
    }
    Ok(out)
}

/// Run requests `depth` at a time (each wave waits for all of its requests).
async fn run_waves(client: &Client, requests: Vec<dpuio_shim::Request>, depth: usize) -> dpuio_shim::Result<()> {
    let c = client.clone();
    tokio::task::spawn_blocking(move || -> dpuio_shim::Result<()> {
        for wave in requests.chunks(depth) {
            for d in c.submit_blocking(wave)? {
                d.result.map_err(|status| dpuio_shim::Error::Io { op: "bench".into(), status })?;
            }
        }
        Ok(())
    })
    .await
    .map_err(bench_error)?
}

/// Create the benchmark file through the shim unless it already has the right size.
async fn prepare_file(client: &Client, file_bytes: u64) -> dpuio_shim::Result<()> {
    if let Ok(a) = client.stat(BENCH_FILE).await
        && a.size == file_bytes
    {
        return Ok(());
    }
    client.mkdir("/.dpuio-bench", true).await?;
    let file = client.create(BENCH_FILE, false).await?;
    const CHUNK: u64 = 4 << 20;
    let mut region = client.register_region(CHUNK as usize, RegionAccess::ReadByAgent).await?;
    let mut bytes = vec![0u8; region.len()];
    rand::rngs::StdRng::seed_from_u64(1).fill(&mut bytes[..]);
    region.write_at(0, &bytes);
    let mut at = 0;
    while at < file_bytes {
        let n = CHUNK.min(file_bytes - at);
        let c = client.clone();
        let req = file.write_request(&region, 0, n, at);
        let done = tokio::task::spawn_blocking(move || c.submit_blocking(&[req]))
            .await
            .map_err(|e| dpuio_shim::Error::DataPlane { op: "bench".into(), reason: e.to_string() })??;
        done[0].result.map_err(|status| dpuio_shim::Error::Io { op: "write the bench file".into(), status })?;
        at += n;
    }
    file.close().await?;
    client.deregister_region(region).await
}

#[allow(clippy::too_many_arguments)]
async fn shim_cell(
    client: &Client,
    workload: Workload,
    block: u64,
    qd: usize,
    threads: usize,
    file_bytes: u64,
    duration: Duration,
    seed: u64,
    agent_pid: Option<u32>,
) -> dpuio_shim::Result<Figures> {
    let writing = workload == Workload::SeqWrite;
    let file = client.open(BENCH_FILE, if writing { Access::ReadWrite } else { Access::ReadOnly }).await?;
    let mut regions = Vec::with_capacity(qd * threads);
    for _ in 0..qd * threads {
        regions.push(client.register_region(block as usize, RegionAccess::ReadWrite).await?);
    }
    let requests: Vec<_> = regions
        .iter()
        .map(|r| if writing { file.write_request(r, 0, block, 0) } else { file.read_request(r, 0, block, 0) })
        .collect();
    let c = client.clone();
    let fig = tokio::task::spawn_blocking(move || -> dpuio_shim::Result<Figures> {
        let cpu0 = process_cpu_time();
        let agent0 = agent_pid.and_then(process_cpu);
        let start = Instant::now();
        let per_thread: Vec<dpuio_shim::Result<(u64, Vec<u32>)>> = std::thread::scope(|s| {
            let handles: Vec<_> = requests
                .chunks(qd)
                .enumerate()
                .map(|(t, mine)| {
                    let c = &c;
                    s.spawn(move || {
                        ring_loop(
                            c,
                            mine,
                            workload,
                            block,
                            file_bytes,
                            duration,
                            start,
                            seed * 1000 + t as u64,
                            t,
                            threads,
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(bench_error("bench thread panicked"))))
                .collect()
        });
        let wall = start.elapsed();
        let mut ops = 0;
        let mut lat = Vec::new();
        for r in per_thread {
            let (n, l) = r?;
            ops += n;
            lat.extend(l);
        }
        Ok(Figures {
            workload: workload.name().into(),
            block_bytes: block,
            queue_depth: qd,
            threads,
            bytes: ops * block,
            ops,
            wall,
            host_cpu: process_cpu_time() - cpu0,
            agent_cpu: agent0.and_then(|a0| agent_pid.and_then(process_cpu).map(|a1| a1.saturating_sub(a0))),
            latencies_us: lat,
            ..Figures::default()
        })
    })
    .await
    .map_err(|e| dpuio_shim::Error::DataPlane { op: "bench".into(), reason: e.to_string() })??;
    for r in regions {
        client.deregister_region(r).await?;
    }
    file.close().await?;
    Ok(fig)
}

/// One thread's share of a shim cell: its own ring, `requests.len()` requests kept in
/// flight (slot k's request uses region k) until `duration` has passed.
#[allow(clippy::too_many_arguments)]
fn ring_loop(
    c: &Client,
    requests: &[dpuio_shim::Request],
    workload: Workload,
    block: u64,
    file_bytes: u64,
    duration: Duration,
    start: Instant,
    seed: u64,
    thread: usize,
    threads: usize,
) -> dpuio_shim::Result<(u64, Vec<u32>)> {
    let mut batch = c.batch()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed + 77);
    let qd = requests.len();
    let mut sent_at = vec![Instant::now(); qd];
    let mut lat = Vec::new();
    // Sequential workloads: thread t reads blocks t, t + threads, ... in order.
    let mut i = thread as u64;
    let step = threads as u64;
    for (k, base) in requests.iter().enumerate() {
        let at = offset(workload, i, block, file_bytes, &mut rng);
        i += step;
        batch.push(&dpuio_shim::Request { file_offset: at, user_data: k as u64, ..*base })?;
        sent_at[k] = Instant::now();
    }
    batch.submit()?;
    let mut ops = 0u64;
    while batch.in_flight() > 0 {
        let done = batch.wait(1, Duration::from_secs(30))?;
        let now = Instant::now();
        let keep_going = start.elapsed() < duration;
        for d in done {
            let k = d.user_data as usize;
            d.result.map_err(|status| dpuio_shim::Error::Io { op: format!("bench {}", workload.name()), status })?;
            ops += 1;
            lat.push((now - sent_at[k]).as_micros() as u32);
            if keep_going {
                let at = offset(workload, i, block, file_bytes, &mut rng);
                i += step;
                batch.push(&dpuio_shim::Request { file_offset: at, user_data: k as u64, ..requests[k] })?;
                sent_at[k] = Instant::now();
            }
        }
        batch.submit()?;
    }
    Ok((ops, lat))
}
