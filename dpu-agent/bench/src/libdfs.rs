//! The libdfs baseline of `dpuio bench --backend daos`: the tenant's DAOS container
//! mounted by libdfs in this process (the way pydaos reads), and the baseline's part of
//! each workload run on it when `dpuio-bench` asks. The shim's part of the workload has
//! written the files first; the figures go back on stdout (`dpuio_bench_core::child`).
//!
//! One blocking DFS call per step, as pydaos makes them: `dfs_read`/`dfs_write` of
//! whole blocks from threads (the block workloads), the namespace calls (metadata),
//! open, stat, one `dfs_read` of a whole sample, close (unet3d), chunked writes then
//! reads (checkpoint). Host CPU is this process's: libdfs and its threads.

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dpuio_backend::{Backend, Container, Error, NsPath, Object, OpenOptions};
use dpuio_bench_core::child::{self, DONE, ERROR, READY, Request};
use dpuio_bench_core::unet3d::{self, Loader};
use dpuio_bench_core::{
    BENCH_DIR, BENCH_FILE, BaselineFile, Context, Figures, LIBDFS, Meter, Spinner, baseline_cell, process_cpu,
    process_cpu_time,
};
use rand::{Rng, SeedableRng};

/// Options of `dpuio-bench-agent libdfs` (given by `dpuio-bench`).
#[derive(clap::Args, Debug, Clone)]
pub struct LibdfsArgs {
    /// The pool (label or UUID) of the agent's `[backend]`.
    #[arg(long)]
    pub pool: String,
    /// The tenant's container label.
    #[arg(long)]
    pub container: String,
    /// The daos_agent's socket directory [default: $DAOS_AGENT_DRPC_DIR, else /var/run/daos_agent].
    #[arg(long)]
    pub agent_socket_dir: Option<PathBuf>,
    /// The agent's process id, to report its CPU per GiB.
    #[arg(long)]
    pub agent_pid: Option<u32>,
}

/// Mount the container, say so, then answer requests until stdin closes.
pub fn serve(args: &LibdfsArgs) -> Result<(), String> {
    let dfs = match mount(args) {
        Ok(dfs) => dfs,
        Err(e) => {
            // The parent reports it as its own error, as when libdfs ran in it; saying
            // it on stderr too would say it twice.
            println!("{ERROR}libdfs baseline: {e}");
            std::process::exit(1);
        }
    };
    println!("{READY}");
    let here = Here { agent_pid: args.agent_pid };
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| format!("reading a request: {e}"))?;
        let answer = serde_json::from_str::<Request>(&line)
            .map_err(|e| format!("not a request ({e}): {line}"))
            .and_then(|request| answer(&here, &dfs, request));
        match answer {
            Ok(figures) => {
                child::send(&figures);
                println!("{DONE}");
            }
            Err(e) => println!("{ERROR}{e}"),
        }
    }
    Ok(())
}

fn mount(args: &LibdfsArgs) -> Result<Arc<dyn Container>, String> {
    let backend = dpuio_daos::DaosBackend::open(dpuio_daos::DaosOptions {
        pool: args.pool.clone(),
        system: "daos_server".into(),
        agent_socket_dir: args.agent_socket_dir.clone().unwrap_or_else(dpuio_daos::default_agent_socket_dir),
        create_containers: false,
        chunk_bytes: dpuio_daos::DEFAULT_CHUNK_BYTES,
        object_class: String::new(),
        // libdfs as a job would call it: no retries of its own.
        retry: std::time::Duration::ZERO,
        private_containers: false,
        redundancy_factor: 0,
        redundancy_level: 0,
        // Nor a deadline: each call made on the calling thread, as libdfs's own.
        call_timeout: std::time::Duration::ZERO,
        // Nor a directory cache: every path looked up as a job's `dfs_lookup` does.
        dir_cache: std::time::Duration::ZERO,
    })
    .map_err(|e| e.to_string())?;
    backend.mount(&args.container, false).map_err(|e| e.to_string())
}

fn answer(here: &Here, dfs: &Arc<dyn Container>, request: Request) -> Result<Vec<Figures>, String> {
    match request {
        Request::Block { workload, block_bytes, queue_depth, file_bytes, seconds, seed } => {
            let path = NsPath::parse(BENCH_FILE).map_err(|e| e.to_string())?;
            let options = OpenOptions { write: true, ..Default::default() };
            let object = dfs.open(&path, options, 0).map_err(|e| format!("libdfs baseline: {e}"))?;
            let duration = Duration::from_secs_f64(seconds);
            let file = DfsFile(object);
            let mut fig =
                baseline_cell(&file, workload, block_bytes, queue_depth, file_bytes, duration, seed, here.agent_pid);
            fig.path = LIBDFS.into();
            Ok(vec![fig])
        }
        Request::Metadata { files } => metadata(here, &**dfs, files).map_err(|e| format!("libdfs metadata: {e}")),
        Request::Unet3d(args) => {
            let search = unet3d::search(LIBDFS, &loader(dfs.clone()), &args, here);
            Ok(vec![search.map_err(|e| format!("unet3d {LIBDFS}: {e}"))?])
        }
        Request::Checkpoint { bytes } => checkpoint(here, &**dfs, bytes),
    }
}

/// This process's clocks; no progress shown (the parent shows its own while it waits).
struct Here {
    agent_pid: Option<u32>,
}

impl Context for Here {
    fn host_cpu(&self, _path: &str) -> Duration {
        process_cpu_time()
    }
    fn agent_cpu(&self) -> Option<Duration> {
        self.agent_pid.and_then(process_cpu)
    }
    fn spinner(&self, _message: String) -> Box<dyn Spinner + '_> {
        Box::new(Silent)
    }
}

struct Silent;

impl Spinner for Silent {
    fn finish(self: Box<Self>) {}
}

/// A DFS object opened by libdfs in this process.
struct DfsFile(Arc<dyn Object>);

impl BaselineFile for DfsFile {
    fn read_block(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        match self.0.read_at(buf, offset) {
            Ok(n) if n == buf.len() => Ok(()),
            Ok(n) => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("short read of {n}"))),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }
    fn write_block(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.0.write_at(buf, offset).map_err(|e| std::io::Error::other(e.to_string()))
    }
}

/// BENCH_DIR in the container, through libdfs.
fn ensure_bench_dir(dfs: &dyn Container) -> dpuio_backend::Result<()> {
    let dir = NsPath::parse(BENCH_DIR)?;
    match dfs.mkdir(&dir, 0o755) {
        Ok(_) | Err(Error::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The metadata steps with libdfs in this process: the same names and calls as the
/// shim's, one blocking DFS call each.
fn metadata(here: &Here, dfs: &dyn Container, files: usize) -> dpuio_backend::Result<Vec<Figures>> {
    let dir = NsPath::parse(&format!("{BENCH_DIR}/meta-{LIBDFS}"))?;
    let _ = dfs.remove(&dir, true);
    ensure_bench_dir(dfs)?;
    dfs.mkdir(&dir, 0o755)?;
    let names: Vec<NsPath> = (0..files).map(|i| dir.join(&format!("f{i:07}"))).collect::<Result<_, _>>()?;
    let create = OpenOptions { write: true, create: true, exclusive: true, ..OpenOptions::default() };
    let mut out = Vec::new();
    for op in ["create", "stat", "readdir", "remove"] {
        let meter = Meter::start(here, LIBDFS);
        match op {
            "create" => names.iter().try_for_each(|n| dfs.open(n, create, 0o644).map(drop))?,
            "stat" => names.iter().try_for_each(|n| dfs.stat(n).map(drop))?,
            "readdir" => {
                let (mut listed, mut anchor) = (0, None::<String>);
                loop {
                    let (entries, next) = dfs.readdir(&dir, anchor.as_deref(), 4096)?;
                    listed += entries.len();
                    match next {
                        Some(next) => anchor = Some(next),
                        None => break,
                    }
                }
                if listed != files {
                    return Err(Error::InvalidArgument(format!("listed {listed} of {files} files")));
                }
            }
            _ => names.iter().try_for_each(|n| dfs.remove(n, false))?,
        }
        out.push(meter.finish(&format!("metadata-{op}"), files as u64, 0));
    }
    Ok(out)
}

/// How a unet3d reader loads a sample through libdfs: open, stat, one read of the whole
/// sample into memory, close.
fn loader(dfs: Arc<dyn Container>) -> Loader {
    Arc::new(move |_reader, i| {
        let path = unet3d::sample_path(i);
        let fail = |e: Error| format!("libdfs {path}: {e}");
        let ns = NsPath::parse(&path).map_err(|e| format!("{path}: {e}"))?;
        let object = dfs.open(&ns, OpenOptions::default(), 0).map_err(fail)?;
        let mut sample = vec![0u8; object.stat().map_err(fail)?.size as usize];
        object.read_at(&mut sample, 0).map(|n| n as u64).map_err(fail)
    })
}

/// Write a checkpoint in chunks and make it durable, then read it back: the same chunks,
/// `dfs_write` then `dfs_read`, one at a time (a DFS write is durable when it returns;
/// the sync is DFS's no-op).
fn checkpoint(here: &Here, dfs: &dyn Container, bytes: u64) -> Result<Vec<Figures>, String> {
    const CHUNK: u64 = 8 << 20;
    let bytes = bytes.max(CHUNK) / CHUNK * CHUNK;
    let mut data = vec![0u8; CHUNK as usize];
    rand::rngs::StdRng::seed_from_u64(9).fill(&mut data[..]);
    let fail = |e: Error| format!("libdfs checkpoint: {e}");
    let path = NsPath::parse(&format!("{BENCH_DIR}/checkpoint-{LIBDFS}.pt")).map_err(fail)?;
    ensure_bench_dir(dfs).map_err(fail)?;
    let mut out = Vec::new();
    let meter = Meter::start(here, LIBDFS);
    let create = OpenOptions { write: true, create: true, truncate: true, ..OpenOptions::default() };
    let f = dfs.open(&path, create, 0o644).map_err(fail)?;
    for i in 0..bytes / CHUNK {
        f.write_at(&data, i * CHUNK).map_err(fail)?;
    }
    f.sync().map_err(fail)?;
    out.push(meter.finish("checkpoint-write", bytes / CHUNK, bytes));
    let meter = Meter::start(here, LIBDFS);
    let mut buf = vec![0u8; CHUNK as usize];
    for i in 0..bytes / CHUNK {
        if f.read_at(&mut buf, i * CHUNK).map_err(fail)? != CHUNK as usize {
            return Err("libdfs checkpoint: short read".into());
        }
    }
    out.push(meter.finish("checkpoint-read", bytes / CHUNK, bytes));
    drop(f);
    let _ = dfs.remove(&path, false);
    Ok(out)
}
