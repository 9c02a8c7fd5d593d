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

/// What every workload needs: the shim clients, the POSIX root, the agent's pid.
pub struct Setup {
    pub clients: Vec<(String, Client)>,
    pub posix_root: Option<PathBuf>,
    /// `--backend daos`: the tenant's container mounted by libdfs in a child.
    pub libdfs: Option<Mutex<Libdfs>>,
    pub agent_pid: Option<u32>,
    /// The `fuse` path's mount, when asked for.
    pub fuse: Option<crate::fuse_path::FuseMount>,
    /// The name of the rows of the POSIX code on `posix_root`: `posix`, or `preload` in
    /// the preload path's child ([`crate::preload_path`]).
    pub posix_label: &'static str,
    pub progress: indicatif::MultiProgress,
    /// The `tcp-stream` path's source, when asked for.
    pub stream: Option<crate::tcp_stream::StreamSource>,
}

impl Setup {
    /// CPU time of the host's side of `path` so far: this process, and for the fuse path
    /// the mount process too.
    pub fn host_cpu(&self, path: &str) -> Duration {
        let mount = self.fuse.as_ref().filter(|_| path == FUSE).and_then(|f| process_cpu(f.pid()));
        process_cpu_time() + mount.unwrap_or_default()
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
