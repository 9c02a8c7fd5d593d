//! How the host's side of the data plane is set up: the transport options, the candidates
//! offered to the agent at Attach, the worker opened before it, and what the transport
//! reports afterwards.

use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

use dpuio_proto::v1 as pb;
use fabric::any::{self, Spec};
use fabric::transport::Endpoint as _;
use fabric::{FabricConfig, ProgressThread, Transport};
use pb::memory_client::MemoryClient;
use tonic::transport::Channel;

use super::{Conn, DataPlane};
use crate::error::{Error, Result};
use crate::resume::{Liveness, Registry};

/// How the host side of the data plane is set up.
#[derive(Debug, Clone)]
pub struct DataPlaneOptions {
    /// The data plane: `"ucx-shm"`, `"ucx-tcp"`, `"ofi-shm"`, `"ofi-tcp"` (libfabric),
    /// `"auto"` (UCX with the transports it picks, else libfabric shm, else tcp: the
    /// first the agent offers), `"shm"` / `"tcp"` (UCX, as before), or a UCX_TLS list.
    pub transports: String,
    /// Rings at first (one per concurrently submitting thread); a call that finds none
    /// free for 20 ms registers another, up to four times this many in all and at least 32.
    pub rings: usize,
    /// Entries per ring (a power of two): the queue depth one thread can reach.
    pub ring_entries: u32,
    /// How long a wait for a completion may take before it fails.
    pub timeout: Duration,
    /// The network interface (as `ip link` names it) the network transports use: UCX's
    /// `NET_DEVICES` and the libfabric tcp domain. The agent answers over the same one:
    /// give it an address on that interface's network (`[data_plane] interface` on
    /// the agent). `None`: the providers choose. Default: `$DPUIO_INTERFACE`.
    pub interface: Option<String>,
}

impl Default for DataPlaneOptions {
    fn default() -> Self {
        DataPlaneOptions {
            transports: std::env::var("DPUIO_TRANSPORT").unwrap_or_else(|_| "auto".into()),
            rings: std::thread::available_parallelism().map_or(4, |n| n.get()).clamp(2, 16),
            ring_entries: 128,
            // Longer than the agent takes to answer when its storage stalls: over DAOS
            // it retries a call through an engine's loss for up to its retry_seconds
            // (120 s by default) after DAOS's own 60 s RPC timeout. An agent that is
            // gone is found by the keep-alive long before this.
            timeout: Duration::from_secs(300),
            interface: std::env::var("DPUIO_INTERFACE").ok().filter(|i| !i.is_empty()),
        }
    }
}

impl DataPlaneOptions {
    /// What to offer the agent at Attach, in order: the first it accepts is used.
    pub(crate) fn candidates(&self) -> Result<Vec<Spec>> {
        let t = self.transports.trim();
        let specs = match t {
            "auto" => vec![
                Spec::Ucx(FabricConfig::default()),
                Spec::parse("ofi-shm").expect("a preset"),
                Spec::parse("ofi-tcp").expect("a preset"),
            ],
            _ => match Spec::parse(t).or_else(|| FabricConfig::preset(t).map(Spec::Ucx)) {
                Some(spec) => vec![spec],
                None if t.is_empty() || t.starts_with("ofi") || t.starts_with("ucx-") => {
                    return Err(Error::DataPlane {
                        op: "configure the transport".into(),
                        reason: format!(
                            "transport {t:?}: expected one of {}, auto, or a UCX_TLS list such as \"posix,tcp\"",
                            Spec::CHOICES.join(", ")
                        ),
                    });
                }
                None => vec![Spec::Ucx(FabricConfig::with_transports(t))],
            },
        };
        let specs = match &self.interface {
            None => specs,
            Some(name) => {
                let refused = |reason: String| Error::DataPlane {
                    op: "configure the transport".into(),
                    reason: format!("interface (DPUIO_INTERFACE, --interface) {reason}"),
                };
                fabric::config::check_interface_name(name).map_err(refused)?;
                fabric::config::check_interface(name).map_err(|e| refused(e.to_string()))?;
                specs.into_iter().map(|s| s.on_interface(name)).collect()
            }
        };
        for spec in &specs {
            let checked = match spec {
                Spec::Ucx(c) => c.validate(),
                Spec::Ofi(c) => c.validate(),
            };
            checked.map_err(|e| Error::DataPlane { op: "configure the transport".into(), reason: e.to_string() })?;
        }
        Ok(specs)
    }
}

/// Whether this process must progress the transport for the agent's operations to
/// land: everything but UCX's one-sided shared-memory preset.
fn needs_progress_thread(spec: &Spec) -> bool {
    match spec {
        Spec::Ucx(c) => c.transports.as_deref() != Some(fabric::SHM_TRANSPORTS),
        Spec::Ofi(_) => true,
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct DataPlaneStats {
    /// CPU time of the progress thread (zero on shared memory, where there is none).
    pub progress_cpu: Duration,
}

/// The transport a session's data plane runs on: what `"auto"` chose, for logs,
/// `dpuio --verbose`, `Client.transport` in Python and `dpuio_client_transport`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportInfo {
    /// `"ucx"`, `"ofi-shm"` or `"ofi-tcp"` (libfabric): the provider, and for libfabric
    /// its provider, in the names `transports` takes.
    pub name: String,
    /// `"ucx"` or `"ofi"`.
    pub provider: String,
    /// The libfabric provider (`"shm"`, `"tcp;ofi_rxm"`); empty for UCX.
    pub fabric_provider: String,
    /// What the transport says of the connection to the agent: UCX's lanes (e.g.
    /// `"posix/memory (rma_bw#0 am am_bw#0), cma/memory (rma_bw#1)"`), libfabric's
    /// provider, fabric and domain. One line.
    pub detail: String,
}

impl TransportInfo {
    pub(super) fn of(worker: &any::Worker, endpoint: &any::Endpoint) -> TransportInfo {
        let provider = worker.provider().to_owned();
        let fabric_provider = worker.fabric_provider().to_owned();
        let name = match fabric_provider.split(';').next() {
            Some(f) if !f.is_empty() => format!("{provider}-{f}"),
            _ => provider.clone(),
        };
        let detail =
            endpoint.describe().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ");
        TransportInfo { name, provider, fabric_provider, detail }
    }
}

/// The host's transport before Attach: its worker address goes into the request.
pub(crate) struct Prepared {
    worker: any::Worker,
    progress: Option<ProgressThread>,
    pub(crate) address: Vec<u8>,
    options: DataPlaneOptions,
}

impl Prepared {
    /// What goes into `AttachRequest.transport`: the provider, this worker's address,
    /// and for libfabric its provider name (workers of different ones cannot talk).
    pub(crate) fn transport_info(&self) -> pb::TransportInfo {
        pb::TransportInfo {
            provider: self.worker.provider().to_owned(),
            worker_address: self.address.clone(),
            transports: match self.worker.fabric_provider() {
                "" => vec![],
                f => vec![f.to_owned()],
            },
            library: library_of(&self.worker),
        }
    }
}

/// `TransportInfo.library`: `"libfabric MAJOR.MINOR"` for a libfabric worker (its library
/// is loaded once it opened), empty for UCX.
fn library_of(worker: &any::Worker) -> String {
    match (worker.provider(), fabric::ofi::loaded_library()) {
        (any::OFI, Some((_, (major, minor)))) => format!("libfabric {major}.{minor}"),
        _ => String::new(),
    }
}

/// Open the worker `spec` names (one of [`DataPlaneOptions::candidates`]).
pub(crate) fn prepare(options: DataPlaneOptions, spec: &Spec) -> Result<Prepared> {
    let fabric_error = |op: &str| {
        let op = op.to_owned();
        move |e: fabric::Error| Error::DataPlane { op: op.clone(), reason: e.to_string() }
    };
    let worker = any::Worker::open(spec).map_err(fabric_error("open the transport"))?;
    let address = worker.address().map_err(fabric_error("get the worker address"))?;
    // Start progress before Attach: over TCP (and libfabric shm's first exchange) the
    // agent's connect needs this side's answer.
    let progress = if needs_progress_thread(spec) {
        Some(
            ProgressThread::spawn(worker.clone(), "dpuio-progress")
                .map_err(fabric_error("start the progress thread"))?,
        )
    } else {
        None
    };
    Ok(Prepared { worker, progress, address, options })
}

impl Prepared {
    /// Connect to the agent's worker and register the rings (after Attach).
    pub(crate) async fn finish(
        self,
        session_id: u64,
        agent_address: &[u8],
        channel: Channel,
        live: Arc<Liveness>,
    ) -> Result<DataPlane> {
        let endpoint = connect(&self.worker, agent_address).await?;
        let dp = DataPlane {
            progress_on_reap: !self.worker.wakes_on_receive(),
            meta_latency: Default::default(),
            worker: self.worker,
            conn: RwLock::new(Arc::new(Conn { endpoint, session_id, generation: live.generation() })),
            progress: Mutex::new(self.progress),
            memory: MemoryClient::new(channel),
            rings: Mutex::new(Vec::new()),
            ring_freed: Condvar::new(),
            abandoned: Default::default(),
            made: Default::default(),
            growth_refused: Default::default(),
            owed_closes: Default::default(),
            doorbell: Default::default(),
            growing: Default::default(),
            runtime: tokio::runtime::Handle::current(),
            options: self.options,
            ended: Mutex::new(None),
            live,
            registry: Arc::new(Registry::default()),
        };
        let rings = dp.new_rings(session_id, dp.live.generation()).await?;
        dp.made.store(rings.len(), std::sync::atomic::Ordering::Release);
        *dp.rings.lock().unwrap_or_else(|p| p.into_inner()) = rings;
        Ok(dp)
    }
}

/// An endpoint from `worker` to the agent's worker at `address`.
pub(super) async fn connect(worker: &any::Worker, address: &[u8]) -> Result<any::Endpoint> {
    let worker = worker.clone();
    let address = address.to_vec();
    tokio::task::spawn_blocking(move || worker.connect(&address))
        .await
        .map_err(|e| Error::DataPlane { op: "connect to the agent".into(), reason: e.to_string() })?
        .map_err(|e| Error::DataPlane { op: "connect to the agent".into(), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(transports: &str, interface: Option<&str>) -> DataPlaneOptions {
        DataPlaneOptions {
            transports: transports.into(),
            interface: interface.map(str::to_owned),
            ..DataPlaneOptions::default()
        }
    }

    #[test]
    fn an_interface_puts_every_network_candidate_on_it() {
        let specs = options("auto", Some("lo")).candidates().unwrap();
        let Spec::Ucx(ucx) = &specs[0] else { panic!("UCX first: {specs:?}") };
        assert_eq!(ucx.ucx_options, [("NET_DEVICES".to_owned(), "lo".to_owned())]);
        let Spec::Ofi(tcp) = &specs[2] else { panic!("ofi-tcp last: {specs:?}") };
        assert_eq!(tcp.domain.as_deref(), Some("lo"));
        assert_eq!(options("ofi-shm", Some("lo")).candidates().unwrap(), [Spec::parse("ofi-shm").unwrap()]);
        assert_eq!(options("ofi-tcp", None).candidates().unwrap(), [Spec::parse("ofi-tcp").unwrap()]);
    }

    #[test]
    fn an_interface_that_is_not_there_is_refused_naming_those_that_are() {
        let text = options("ucx-tcp", Some("dpuio-nosuch0")).candidates().unwrap_err().to_string();
        assert!(
            text.contains("interface (DPUIO_INTERFACE, --interface) network interface \"dpuio-nosuch0\""),
            "{text}"
        );
        assert!(text.contains("does not exist here") && text.contains("lo"), "{text}");
        let text = options("ucx-tcp", Some("eth0:1")).candidates().unwrap_err().to_string();
        assert!(text.contains("\"eth0:1\" is not an interface name"), "{text}");
    }
}
