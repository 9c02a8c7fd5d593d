//! Starting and stopping the agent: backend, listener, services, signals.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpuio_backend::Backend;
use dpuio_backend::local::LocalBackend;
use dpuio_daos::{DaosBackend, DaosOptions};
use dpuio_proto::v1 as pb;
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;

use crate::config::{BackendConfig, Config, DaosConfig};
use crate::connection::{ClosedConnections, Tracked};
use crate::dataplane::DataPlane;
use crate::leftovers::{Leftovers, Register};
use crate::metrics::grpc::GrpcMetricsLayer;
use crate::serve_error::ServeError;
use crate::service::{MemoryService, NamespaceService, SessionService};
use crate::state::{Agent, Parts};

/// The DAOS backend's options from its config section.
pub fn daos_options(daos: &DaosConfig) -> DaosOptions {
    DaosOptions {
        pool: daos.pool.clone(),
        system: daos.system.clone(),
        agent_socket_dir: daos.agent_socket_dir.clone().unwrap_or_else(dpuio_daos::default_agent_socket_dir),
        create_containers: daos.create_containers,
        chunk_bytes: daos.chunk_bytes,
        object_class: daos.object_class.clone(),
        retry: std::time::Duration::from_secs(daos.retry_seconds),
        private_containers: false,
        redundancy_factor: daos.redundancy_factor,
        redundancy_level: daos.redundancy_level,
        call_timeout: std::time::Duration::from_secs(daos.call_timeout_seconds),
        dir_cache: std::time::Duration::from_secs(daos.dir_cache_seconds),
    }
}

/// Build the agent's state from a config: open the backend, gather what the agent is
/// made of (the state file's changes, the token key, the tenants' encryption), assemble
/// it, create the containers, and start its data plane on it.
pub fn build_agent(config: Config) -> Result<Arc<Agent>, ServeError> {
    let (backend, chunk_bytes): (Arc<dyn Backend>, u64) = match &config.backend {
        BackendConfig::Local { path } => {
            let backend = LocalBackend::open(path.clone())
                .map_err(|source| ServeError::Backend { path: path.display().to_string(), source })?;
            (Arc::new(backend), dpuio_backend::local::DEFAULT_CHUNK_BYTES)
        }
        BackendConfig::Daos(daos) => {
            let backend = DaosBackend::open(daos_options(daos))?;
            tracing::info!(pool = daos.pool, system = daos.system, "DAOS backend up");
            (Arc::new(backend), daos.chunk_bytes)
        }
    };
    let (store, merged) = persisted_settings(&config)?;
    let token_dir = config.data_dir.join("tokens");
    let tokens = dpuio_auth::token::TokenAuthority::load_or_create(&token_dir)
        .map_err(|e| ServeError::Tls(format!("capability token key in {}: {e}", token_dir.display())))?;
    // Tenants removed with dpuctl too: `dpuctl tenant add` may bring them back, encrypted.
    let mut encryption = HashMap::new();
    for tenant in merged.tenants.iter().chain(&merged.removed) {
        if let Some(enc) = &tenant.encryption {
            let settings = crate::keys::encryption_settings(&tenant.name, &tenant.container, enc)?;
            encryption.insert(tenant.container.clone(), settings);
        }
    }
    let leftovers = recovered_leftovers(&config)?;
    let data_plane = config.data_plane.clone();
    let agent = Agent::assemble(Parts {
        config,
        tenants: merged.tenants,
        backend,
        tokens,
        persisted: Some(store),
        encryption,
        leftovers,
    });
    agent.prepare_containers().map_err(ServeError::Containers)?;
    if data_plane.enabled {
        if let Some(name) = &data_plane.interface {
            fabric::config::check_interface(name).map_err(ServeError::Interface)?;
        }
        let dp = Arc::new(DataPlane::open(&data_plane.lanes()).map_err(ServeError::DataPlane)?);
        dp.start(
            agent.clone(),
            chunk_bytes as usize,
            data_plane.io_threads as usize,
            Duration::from_micros(data_plane.idle_poll_us.into()),
        )
        .map_err(ServeError::DataPlane)?;
        tracing::info!(transport = %dp.summary(), "data plane up");
        tracing::debug!(transport = %dp.describe(), "data-plane transports in detail");
        agent.set_dataplane(dp);
    }
    Ok(agent)
}

/// The state file of `config`'s data directory, merged with the config's tenants
/// ([`crate::persist::merge`]): what was dropped from it is logged, and it is rewritten
/// without those records. The key files it names are checked here, so that a missing
/// one is reported as the state file's.
fn persisted_settings(config: &Config) -> Result<(crate::persist::store::Store, crate::persist::Merged), ServeError> {
    use crate::persist::{NoteKind, store};
    let path = crate::persist::state_file(&config.data_dir);
    let persisted = store::load(&path)?;
    let merged = crate::persist::merge(&config.tenants, &persisted);
    for note in &merged.notes {
        match note.kind {
            NoteKind::Superseded => tracing::warn!(state_file = %path.display(), "{note}"),
            NoteKind::Redundant => tracing::info!(state_file = %path.display(), "{note}"),
        }
    }
    for (name, record) in &merged.state.tenants {
        for key in &record.keys {
            let mut probe = dpuio_crypto::FileKeySource::new();
            probe.add_key_file(name, key.version, &key.file).map_err(|source| {
                ServeError::PersistedKey(Box::new(crate::serve_error::PersistedKeyError {
                    tenant: name.clone(),
                    version: key.version,
                    file: key.file.display().to_string(),
                    state_file: path.display().to_string(),
                    source,
                }))
            })?;
        }
    }
    let changes = merged.state.tenants.len();
    let store = store::Store::new(path.clone(), merged.state.clone());
    if merged.state != persisted {
        store.save()?;
    }
    if changes > 0 {
        tracing::info!(state_file = %path.display(), tenants = changes, "applied the changes made with dpuctl");
    }
    Ok((store, merged))
}

/// The temporary files of puts the previous run noted and did not see end
/// ([`crate::leftovers`]): unclaimed for one lease from when the agent serves (a resumed
/// session claims its own; [`Agent::serving_from`]), then removed; the journal rewritten
/// to list just them.
fn recovered_leftovers(config: &Config) -> Result<Leftovers, ServeError> {
    use crate::leftovers::journal::{self, Journal};
    let path = journal::journal_file(&config.data_dir);
    let (records, torn) = journal::load(&path).map_err(|e| ServeError::PutJournal(Box::new(e)))?;
    if torn {
        tracing::warn!(journal = %path.display(), "the last line of the journal of unfinished puts was cut short (a \
            crash of the machine while it was written); dropped: that put's temporary file, if any, is not removed");
    }
    let register = Register::recovered(records, Instant::now() + Duration::from_millis(config.lease_ms));
    let journal = Journal::create(&path, &register.records())
        .map_err(|source| ServeError::PutJournalWrite { path: path.display().to_string(), source })?;
    let (_, unclaimed) = register.counts();
    if unclaimed > 0 {
        tracing::info!(journal = %path.display(), temporary_files = unclaimed, lease_ms = config.lease_ms,
            "puts the previous run left unfinished: their temporary files wait a lease for their clients to resume, then go");
    }
    Ok(Leftovers::with_journal(register, journal))
}

/// Where a started agent listens, for [`serve`]'s caller to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    /// The control plane's bound address.
    pub addr: SocketAddr,
    /// Whether the control plane speaks mutual TLS.
    pub mtls: bool,
    /// The bound address of `GET /metrics` (`[metrics] listen`), if configured.
    pub metrics: Option<SocketAddr>,
}

/// Serve until SIGINT or SIGTERM, then finish in-flight calls, close every session
/// (syncing written files), sync the containers and return.
///
/// `on_listening` is called with the bound addresses once the listeners are up (the
/// binary prints them, so a port of 0 is usable).
pub async fn serve(config: Config, on_listening: impl FnOnce(Listening)) -> Result<(), ServeError> {
    let listen = config.listen;
    let max_message_bytes = config.limits.max_message_bytes as usize;
    let agent = build_agent(config)?;
    let tls = crate::tls::prepare(&agent.config)?;
    let auth = crate::tls::Authenticator::new(agent.clone(), tls.as_ref());
    let intercept = move |request| auth.intercept(request);
    let (listener, local) = bind(listen).await?;

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<pb::session_server::SessionServer<SessionService>>().await;
    health_reporter.set_serving::<pb::namespace_server::NamespaceServer<NamespaceService>>().await;
    // Both reflection versions: grpcurl and Python grpcio still ask v1alpha.
    let reflection_builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection = InterceptedService::new(reflection_builder().build_v1()?, intercept.clone());
    let reflection_alpha = InterceptedService::new(reflection_builder().build_v1alpha()?, intercept.clone());

    let session = InterceptedService::new(
        pb::session_server::SessionServer::new(SessionService::new(agent.clone()))
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes),
        intercept.clone(),
    );
    let namespace = InterceptedService::new(
        pb::namespace_server::NamespaceServer::new(NamespaceService::new(agent.clone()))
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes),
        intercept.clone(),
    );
    let memory = agent.dataplane().is_some().then(|| {
        InterceptedService::new(
            pb::memory_server::MemoryServer::new(MemoryService::new(agent.clone()))
                .max_decoding_message_size(max_message_bytes)
                .max_encoding_message_size(max_message_bytes),
            intercept.clone(),
        )
    });
    if memory.is_some() {
        health_reporter.set_serving::<pb::memory_server::MemoryServer<MemoryService>>().await;
    }

    let tls = tls.map(Arc::new);
    let admin_path = agent.config.admin_socket();
    let admin_listener = crate::admin::bind(&admin_path)?;
    let admin_service = pb::admin_server::AdminServer::new(crate::admin::AdminService::new(agent.clone(), tls.clone()));
    let admin = Sidecar::spawn("admin service", |stopped| {
        let incoming = crate::admin::incoming(admin_listener);
        tonic::transport::Server::builder().add_service(admin_service).serve_with_incoming_shutdown(incoming, stopped)
    });
    tracing::info!(socket = %admin_path.display(), "admin service listening");

    // kubelet's `grpc` probe speaks no TLS: health alone, in plaintext, where configured.
    let health = match agent.config.health_listen {
        Some(addr) => {
            let health_service = health_service.clone();
            let listening = "health service (grpc.health.v1, plaintext) listening";
            let (_, served) = Sidecar::listen(addr, "health service", listening, |listener, stopped| {
                let incoming = incoming(listener, None);
                tonic::transport::Server::builder()
                    .add_service(health_service)
                    .serve_with_incoming_shutdown(incoming, stopped)
            })
            .await?;
            Some(served)
        }
        None => None,
    };

    let metrics = match agent.config.metrics.listen {
        Some(addr) => {
            let figures = agent.metrics.clone();
            let listening = "metrics (Prometheus, GET /metrics) listening";
            let (bound, served) = Sidecar::listen(addr, "metrics", listening, |listener, stopped| async move {
                crate::metrics::http::serve(listener, figures, stopped).await;
                Ok::<(), std::convert::Infallible>(())
            })
            .await?;
            agent.set_metrics_addr(bound);
            Some((bound, served))
        }
        None => None,
    };

    agent.serving_from(Instant::now());
    let reaper = tokio::spawn(reap_sessions(agent.clone()));
    let flusher = tokio::spawn(flush_put_journal(agent.clone()));
    let (closed_tx, closed_rx) = tokio::sync::mpsc::unbounded_channel();
    let orphans = tokio::spawn(reap_orphans(agent.clone(), closed_rx));
    let signalled = shutdown_signal(agent.clone(), drain_bound(&agent.config))?;
    // From the signal on, health says NOT_SERVING (kubelet's readiness, load balancers)
    // while calls in flight finish.
    let draining = health_reporter.clone();
    let stop = async move {
        signalled.await;
        draining.set_service_status("", tonic_health::ServingStatus::NotServing).await;
    };
    tracing::info!(%local, backend = agent.backend_kind(), tenants = agent.config.tenants.len(), mtls = tls.is_some(), "serving");
    on_listening(Listening { addr: local, mtls: tls.is_some(), metrics: metrics.as_ref().map(|(bound, _)| *bound) });

    let router = tonic::transport::Server::builder()
        .layer(GrpcMetricsLayer::new(agent.metrics.clone()))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(session)
        .add_service(namespace)
        .add_optional_service(memory);
    match &tls {
        Some(tls) => {
            router
                .serve_with_incoming_shutdown(
                    crate::tls::tls_incoming(listener, tls.server_config.clone(), Some(closed_tx)),
                    stop,
                )
                .await?
        }
        None => router.serve_with_incoming_shutdown(incoming(listener, Some(closed_tx)), stop).await?,
    }

    reaper.abort();
    orphans.abort();
    flusher.abort();
    if let Some((_, served)) = metrics {
        served.stop().await;
    }
    if let Some(health) = health {
        health.stop().await;
    }
    admin.stop().await;
    let _ = std::fs::remove_file(&admin_path);
    let sessions = agent.session_count();
    let closing = agent.clone();
    tokio::task::spawn_blocking(move || closing.close_everything())
        .await
        .map_err(|e| ServeError::Shutdown(crate::error::Error::Internal(e.to_string())))?
        .map_err(ServeError::Shutdown)?;
    if let Some(dp) = agent.dataplane() {
        dp.shutdown();
    }
    agent.flush_put_journal();
    // Not a clean stop while DAOS still owes answers: say which, and exit non-zero.
    let stuck = dpuio_daos::stuck_calls();
    if !stuck.is_empty() {
        for (call, waited) in &stuck {
            tracing::error!(call, waited = %format!("{waited:.0?}"), "stopping: DAOS has not answered this call");
        }
        let calls: Vec<String> = stuck.iter().map(|(call, waited)| format!("{call} ({waited:.0?})")).collect();
        return Err(ServeError::DaosUnanswered { count: stuck.len(), calls: calls.join(", ") });
    }
    tracing::info!(sessions, "stopped: sessions closed, containers synced");
    Ok(())
}

/// Bind the TCP listener at `addr`: the listener, and the address it bound (port 0
/// takes a free one).
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServeError> {
    let listener = TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(|source| ServeError::Bind { addr, source })?;
    Ok((listener, bound))
}

/// A service beside the control plane (the admin socket, plaintext health, metrics),
/// served on a task of its own until [`Sidecar::stop`].
struct Sidecar<E> {
    /// How the logs name it.
    name: &'static str,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), E>>,
}

impl<E: std::fmt::Display + Send + 'static> Sidecar<E> {
    /// Serve `serve(stopped)` on a task; `stopped` completes when [`Sidecar::stop`] is
    /// called.
    fn spawn<F>(name: &'static str, serve: impl FnOnce(BoxFuture) -> F) -> Sidecar<E>
    where
        F: std::future::Future<Output = Result<(), E>> + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(Box::pin(async {
            let _ = stopped.await;
        })));
        Sidecar { name, stop, task }
    }

    /// Bind a plaintext TCP listener at `addr`, log `listening` with the address it
    /// bound, and serve `serve(listener, stopped)` there ([`Sidecar::spawn`]).
    async fn listen<F>(
        addr: SocketAddr,
        name: &'static str,
        listening: &'static str,
        serve: impl FnOnce(TcpListener, BoxFuture) -> F,
    ) -> Result<(SocketAddr, Sidecar<E>), ServeError>
    where
        F: std::future::Future<Output = Result<(), E>> + Send + 'static,
    {
        let (listener, bound) = bind(addr).await?;
        tracing::info!(%bound, "{listening}");
        Ok((bound, Sidecar::spawn(name, |stopped| serve(listener, stopped))))
    }

    /// Stop it and wait until it has; an error it stopped with is logged.
    async fn stop(self) {
        let _ = self.stop.send(());
        if let Ok(Err(e)) = self.task.await {
            tracing::warn!(error = %e, "{} stopped with an error", self.name);
        }
    }
}

/// The future a [`Sidecar`] is told to stop with.
type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Accepted connections with Nagle off: every control-plane call is a small request
/// that must not wait for a delayed ACK. Each reports its closing to `closed`.
fn incoming(
    listener: TcpListener,
    closed: Option<ClosedConnections>,
) -> impl tokio_stream::Stream<Item = std::io::Result<Tracked>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(move |stream| {
        let stream = stream?;
        stream.set_nodelay(true)?;
        Ok(Tracked::new(stream, closed.clone()))
    })
}

/// How long past the signal a stopping agent may take to drain before it exits anyway
/// (over DAOS): a metadata call waits for DAOS at most `call_timeout_seconds`, and the
/// drain makes at most one more (the containers' sync), so a drain still going after
/// that and [`DRAIN_MARGIN`] waits for a DAOS that does not answer: data-plane I/O DAOS
/// holds, which cannot be abandoned, or a call stuck before the signal.
fn drain_bound(config: &Config) -> Option<Duration> {
    match &config.backend {
        BackendConfig::Daos(daos) => Some(Duration::from_secs(daos.call_timeout_seconds) + DRAIN_MARGIN),
        // Local file system calls return (or the kernel's own timeouts end them).
        BackendConfig::Local { .. } => None,
    }
}

/// What a drain may take beyond one DAOS call's deadline: closing sessions and flushing.
const DRAIN_MARGIN: Duration = Duration::from_secs(5);

/// The exit status of an agent that stopped without DAOS's answer to every call: its
/// drain did not end in time ([`drain_bound`]), or DAOS still left calls unanswered
/// ([`ServeError::DaosUnanswered`]).
pub const EXIT_DRAIN_TIMEOUT: i32 = 3;

/// From the signal on: at `bound`, if the agent is still draining, say what is stuck and
/// exit with [`EXIT_DRAIN_TIMEOUT`], without waiting for DAOS (or syncing on it) for ever.
///
/// It holds the agent weakly: a drain that ends in time drops the agent (and finalises
/// DAOS) as if there were no watchdog.
fn drain_watchdog(agent: std::sync::Weak<Agent>, bound: Duration) {
    let spawned = std::thread::Builder::new().name("dpuio-drain-watchdog".to_owned()).spawn(move || {
        std::thread::sleep(bound);
        let stuck = dpuio_daos::stuck_calls();
        let sessions = agent.upgrade().map_or(0, |a| a.session_count());
        for (call, waited) in &stuck {
            tracing::error!(call, waited = %format!("{waited:.0?}"), "stopping: DAOS has not answered this call");
        }
        let calls: Vec<String> = stuck.iter().map(|(call, waited)| format!("{call} ({waited:.0?})")).collect();
        let message = format!(
            "dpu-agent: the drain did not finish within {bound:.0?} of the signal ([backend] call_timeout_seconds +              {DRAIN_MARGIN:.0?}): {sessions} session(s) still open; DAOS calls unanswered: {}. Exiting without              waiting for DAOS: check `dmg system query` (every engine Joined?); what DAOS acknowledged is kept, a              change it did not acknowledge may or may not have been applied",
            if calls.is_empty() { "none listed (a call still within its deadline)".to_owned() } else { calls.join(", ") }
        );
        tracing::error!(sessions, stuck = stuck.len(), "{message}");
        eprintln!("{message}");
        dpuio_daos::exit_leaving_calls_in_daos(EXIT_DRAIN_TIMEOUT);
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no drain watchdog: the drain is not bounded");
    }
}

fn shutdown_signal(
    agent: Arc<Agent>,
    drain_bound: Option<Duration>,
) -> Result<impl std::future::Future<Output = ()>, ServeError> {
    use tokio::signal::unix::{SignalKind, signal};
    fabric::drop_load_time_signal_handlers();
    fabric::restore_default_termination_signals();
    let mut term = signal(SignalKind::terminate()).map_err(ServeError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ServeError::Signal)?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        // New sessions are refused from here on; calls in flight run to completion.
        agent.set_draining();
        tracing::info!(signal = name, bound = ?drain_bound, "stopping: no new sessions, finishing calls in flight");
        if let Some(bound) = drain_bound {
            drain_watchdog(Arc::downgrade(&agent), bound);
        }
    })
}

/// End the sessions of hosts whose connection closed (a process that died, SIGKILL
/// included), [`crate::state::DISCONNECTED_GRACE`] after it closed, unless the host came
/// back on another connection meanwhile.
async fn reap_orphans(agent: Arc<Agent>, mut closed: tokio::sync::mpsc::UnboundedReceiver<SocketAddr>) {
    while let Some(peer) = closed.recv().await {
        if agent.connection_closed(peer, Instant::now()).is_empty() {
            continue;
        }
        let agent = agent.clone();
        tokio::spawn(async move {
            tokio::time::sleep(crate::state::DISCONNECTED_GRACE + std::time::Duration::from_millis(10)).await;
            if let Ok(ended) = tokio::task::spawn_blocking(move || agent.reap_expired(Instant::now())).await {
                for id in ended {
                    tracing::info!(session = format!("{id:#018x}"), %peer, "host connection closed; session detached");
                }
            }
        });
    }
}

/// Flush the journal of unfinished puts to disk when it changed, once a second.
async fn flush_put_journal(agent: Arc<Agent>) {
    loop {
        tokio::time::sleep(crate::leftovers::journal::FLUSH_EVERY).await;
        let flushing = agent.clone();
        let _ = tokio::task::spawn_blocking(move || flushing.flush_put_journal()).await;
    }
}

async fn reap_sessions(agent: Arc<Agent>) {
    let period = agent.lease() / 4;
    loop {
        tokio::time::sleep(period).await;
        let reaper = agent.clone();
        if let Ok(expired) = tokio::task::spawn_blocking(move || reaper.reap_expired(Instant::now())).await {
            for id in expired {
                tracing::info!(session = format!("{id:#018x}"), "lease lapsed; session detached");
            }
        }
    }
}
