//! What every workload needs ([`Setup`]: the shim clients, the baselines, the agent's
//! pid, the progress shown), and the clocks it reads for the measuring loops the
//! benchmarks share.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use dpuio_bench_core::child::Request;
use dpuio_bench_core::{Context, Figures, Spinner, process_cpu};
use dpuio_shim::{Client, process_cpu_time};

use crate::libdfs::Libdfs;

/// The path name of `dpuio mount` in the figures.
pub const FUSE: &str = "fuse";
/// The path name of DAOS's FUSE daemon in the figures.
pub const DFUSE: &str = "dfuse";
/// The path name of DAOS's interception library (libpil4dfs) in the figures.
pub const PIL4DFS: &str = "pil4dfs";
/// The path name of `libdpuio_preload.so` in the figures.
pub const PRELOAD: &str = "preload";
/// The preload library's file name, as `cargo build` and the dpuio-host package put it.
pub const PRELOAD_LIBRARY: &str = "libdpuio_preload.so";
/// The small-file sample row of the metadata workload: a whole 128 KiB file opened,
/// read and closed per operation (a training sample).
pub const SAMPLE_WORKLOAD: &str = "metadata-sample128k";

pub fn bench_error(reason: impl std::fmt::Display) -> dpuio_shim::Error {
    dpuio_shim::Error::DataPlane { op: "bench".into(), reason: reason.to_string() }
}

/// The suffix of the rows of the tenant with inline encryption (`--encrypted-bundle`).
pub const DECRYPT: &str = "+decrypt";

/// `--encrypted-bundle DIR`'s client, unless it attached as the tenant of the other rows
/// (which would label plain reads as decrypted).
pub fn encrypted_client(encrypted: Client, plain: &Client, dir: &Path) -> dpuio_shim::Result<Client> {
    if encrypted.tenant() != plain.tenant() {
        return Ok(encrypted);
    }
    Err(bench_error(format!(
        "--encrypted-bundle {}: attached as tenant {:?}, the tenant of the other rows; give the bundle of a tenant \
         with [tenants.encryption] (dpuctl cert issue --tenant NAME --out DIR). A plaintext agent (http://) \
         ignores bundles",
        dir.display(),
        encrypted.tenant()
    )))
}

/// A path whose rows are this program's own POSIX code (std::fs, `pread`, `pwrite`) on
/// a directory that holds the container's files: the container's directory itself
/// (`posix`; in a child, `preload` or `pil4dfs`), or a FUSE mount of it (`fuse`, `dfuse`).
pub struct FsPath {
    /// The name of its rows.
    pub label: &'static str,
    pub root: PathBuf,
    /// Another host process that does this path's work (a FUSE daemon): its CPU time is
    /// host CPU of the path.
    pub helper_pid: Option<u32>,
    /// Read the block workloads' file once before measuring, so that every round reads
    /// the same page cache (the container's directory; a mount without caching has none).
    pub warm: bool,
}

/// What every workload needs: the shim clients, the POSIX paths, the agent's pid.
pub struct Setup {
    pub clients: Vec<(String, Client)>,
    /// The paths that run the POSIX code, in the order of their rows.
    pub fs_paths: Vec<FsPath>,
    /// `--backend daos`: the tenant's container mounted by libdfs in a child.
    pub libdfs: Option<Mutex<Libdfs>>,
    pub agent_pid: Option<u32>,
    /// The `fuse` path's mount, when asked for: held for the run, unmounted when dropped.
    pub _fuse: Option<crate::fuse_path::FuseMount>,
    /// The `dfuse` path's mount (also the `pil4dfs` path's), when asked for: the same.
    pub _dfuse: Option<crate::dfuse_path::DfuseMount>,
    pub progress: indicatif::MultiProgress,
    /// The `tcp-stream` path's source, when asked for.
    pub stream: Option<crate::tcp_stream::StreamSource>,
}

impl Setup {
    /// CPU time of the host's side of `path` so far: this process, and the helper
    /// process of a FUSE path (its daemon) too.
    pub fn host_cpu(&self, path: &str) -> Duration {
        process_cpu_time() + self.helper_cpu(path)
    }

    /// CPU time so far of `path`'s helper process, if it has one.
    pub fn helper_cpu(&self, path: &str) -> Duration {
        let helper = self.fs_paths.iter().find(|p| p.label == path).and_then(|p| p.helper_pid);
        helper.and_then(process_cpu).unwrap_or_default()
    }

    /// CPU time of the agent so far, when its pid is known.
    pub fn agent_cpu(&self) -> Option<Duration> {
        self.agent_pid.and_then(process_cpu)
    }

    /// The first client of each tenant (the `+decrypt` rows are a second tenant's): the
    /// workloads write their files through each, so every tenant reads the same bytes
    /// from its own container.
    pub fn writers(&self) -> impl Iterator<Item = &Client> {
        let plain = self.clients.first();
        let encrypted = self.clients.iter().find(|(name, _)| name.ends_with(DECRYPT));
        plain.into_iter().chain(encrypted).map(|(_, client)| client)
    }

    /// A spinner on stderr for one measurement.
    pub fn spinner(&self, message: String) -> indicatif::ProgressBar {
        let bar = self.progress.add(indicatif::ProgressBar::new_spinner());
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}").expect("a valid progress template"),
        );
        bar.set_message(message);
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    }
}

impl Setup {
    /// The libdfs baseline's figures of `request` (`--backend daos`), its step shown
    /// as `message` while the child runs it.
    pub fn ask_libdfs(&self, message: String, request: &Request) -> dpuio_shim::Result<Vec<Figures>> {
        let Some(libdfs) = &self.libdfs else { return Ok(Vec::new()) };
        let bar = self.spinner(message);
        let answer = tokio::task::block_in_place(|| {
            libdfs.lock().map_err(|_| "libdfs baseline: a step panicked".to_owned())?.ask(request)
        });
        bar.finish_and_clear();
        answer.map_err(bench_error)
    }
}

/// The clocks and spinners of the measuring loops the benchmarks share.
impl Context for Setup {
    fn host_cpu(&self, path: &str) -> Duration {
        Setup::host_cpu(self, path)
    }
    fn agent_cpu(&self) -> Option<Duration> {
        Setup::agent_cpu(self)
    }
    fn spinner(&self, message: String) -> Box<dyn Spinner + '_> {
        Box::new(Bar(Setup::spinner(self, message)))
    }
}

/// A spinner of [`Setup::spinner`], cleared when finished.
struct Bar(indicatif::ProgressBar);

impl Spinner for Bar {
    fn finish(self: Box<Self>) {
        self.0.finish_and_clear();
    }
}
