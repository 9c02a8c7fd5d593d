//! The client: one attached, mounted session and the calls on it.
//!
//! Rooms: [`tls`] (reaching the agent: the channel, mutual TLS, errors that say which
//! of address, bundle or agent is wrong), [`control`] (the session's gRPC clients and
//! the resending of calls across an agent restart), [`namespace`] (the namespace calls
//! behind one interface, with its gRPC implementation) and [`ring`] (its data-plane
//! ring implementation, and what only a ring carries), [`file`] (an open file),
//! [`supervise`] (the lease and the resume after an agent restart), [`pool`] (registered
//! buffers). Here: connecting, and the client's calls, each given to the path that
//! carries it.

mod control;
mod file;
mod namespace;
mod pool;
mod ring;
mod supervise;
mod tls;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use dpuio_proto::attr::{Attr, DirEntry};
use dpuio_proto::v1 as pb;
use pb::namespace_client::NamespaceClient;
use pb::session_client::SessionClient;
use tonic::transport::Channel;

use crate::dataplane::{self, Batch, DataPlane, DataPlaneOptions, DataPlaneStats, Done, RegisteredRegion, Request};
use crate::error::{Error, Result};
use crate::resume::{self, Liveness, Probe, Registry, ResumeOptions};
use control::Control;
use namespace::Namespace;
use ring::RingNamespace;

pub use file::File;
pub use pool::{Buffer, RegionPool, Slot, SlotPool};
pub use tls::TlsOptions;

/// Where the CLI and library look for the agent when nothing says otherwise. An
/// address without a scheme (or `https://`) is reached with mutual TLS; `http://`
/// means plaintext, which agents allow on loopback with `[tls] mode = "off"` only.
pub const DEFAULT_AGENT: &str = "127.0.0.1:7300";

/// How a file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

/// How to reach and attach to the agent.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// `host:port` or `http://host:port`.
    pub agent: String,
    /// Tenant to attach as; honoured by agents without client authentication. Empty
    /// lets the agent choose its default tenant.
    pub tenant: String,
    /// Shown in the agent's logs and session list.
    pub client_name: String,
    pub connect_timeout: Duration,
    /// Set up the data plane (regions, rings) so files can be read and written; `None`
    /// attaches a control-only session (enough for `ls`, `mkdir`, ...).
    pub data_plane: Option<DataPlaneOptions>,
    /// Client certificate for mutual TLS (unused with an `http://` address).
    pub tls: TlsOptions,
    /// A capability token (from a parent's [`Client::delegate`]) that narrows what this
    /// session may do; empty for the tenant's full rights. `$DPUIO_TOKEN` by default.
    pub capability_token: String,
    /// How the client rides out an agent restart (see [`crate::resume`]).
    pub resume: ResumeOptions,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            agent: std::env::var("DPUIO_AGENT").unwrap_or_else(|_| DEFAULT_AGENT.to_owned()),
            tenant: String::new(),
            client_name: format!(
                "{} pid {}",
                std::env::args().next().unwrap_or_else(|| "dpuio".into()),
                std::process::id()
            ),
            connect_timeout: Duration::from_secs(5),
            data_plane: None,
            tls: TlsOptions::from_env(),
            capability_token: std::env::var("DPUIO_TOKEN").unwrap_or_default(),
            resume: ResumeOptions::default(),
        }
    }
}

struct Inner {
    control: Arc<Control>,
    supervisor: tokio::task::JoinHandle<()>,
    /// The namespace over the data plane, when the session has one.
    ring: Option<RingNamespace>,
    /// The open files (and, through the data plane, the regions) to restore.
    registry: Arc<Registry>,
    /// What attached the session, to attach again after an agent restart: the
    /// options, and the transport offered (this worker's address, which stays).
    options: ConnectOptions,
    offer: Option<pb::TransportInfo>,
    container: String,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.supervisor.abort();
    }
}

impl Inner {
    fn data(&self) -> Option<&Arc<DataPlane>> {
        self.ring.as_ref().map(|r| &r.dp)
    }

    /// Where a namespace call goes: over the ring when the session has a data plane,
    /// unless the session is known to have ended (gRPC then says why).
    fn namespace(&self) -> &dyn Namespace {
        match &self.ring {
            Some(ring) if !ring.dp.is_ended() => ring,
            _ => &*self.control,
        }
    }

    /// Where a call on an open handle goes: over the ring whenever the session has a
    /// data plane.
    fn handle_namespace(&self) -> &dyn Namespace {
        match &self.ring {
            Some(ring) => ring,
            None => &*self.control,
        }
    }
}

/// An attached session with its container mounted.
///
/// Cheap to clone; clones share the session. The lease is renewed in the background
/// while any clone (or open [`File`]) lives; [`Client::detach`] ends it at once,
/// otherwise the agent detaches it when the lease lapses.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    tenant: String,
    container: String,
    chunk_bytes: u64,
    limits: pb::Limits,
}

/// A task stopped when this is dropped (on every way out of a function).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Client {
    /// Connect, attach and mount the tenant's container.
    pub async fn connect(options: ConnectOptions) -> Result<Client> {
        // A process linking the data plane carries libfabric's dependencies' load-time
        // handlers (SIGTERM and crashes exit 1): this host process ends as signalled.
        fabric::drop_load_time_signal_handlers();
        let channel = tls::connect_channel(&options.agent, &options.tls, options.connect_timeout).await?;
        let mut session = SessionClient::new(channel.clone());
        let mut namespace = NamespaceClient::new(channel.clone());
        let candidates = match &options.data_plane {
            Some(dp) => dp.candidates()?,
            None => Vec::new(),
        };
        let mut offered = candidates.into_iter().peekable();
        let (prepared, attached) = loop {
            let prepared = match (options.data_plane.clone(), offered.next()) {
                (Some(dp), Some(spec)) => Some(
                    tokio::task::spawn_blocking(move || dataplane::prepare(dp, &spec))
                        .await
                        .map_err(|e| Error::DataPlane { op: "open the transport".into(), reason: e.to_string() })??,
                ),
                _ => None,
            };
            let attached = session
                .attach(pb::AttachRequest {
                    client_name: options.client_name.clone(),
                    tenant: options.tenant.clone(),
                    transport: prepared.as_ref().map(|p| p.transport_info()),
                    capability_token: options.capability_token.clone(),
                })
                .await;
            match attached {
                Ok(a) => break (prepared, a.into_inner()),
                // "auto": the agent does not run this provider; offer the next.
                Err(s)
                    if s.code() == tonic::Code::InvalidArgument
                        && s.message().contains("transport.provider")
                        && offered.peek().is_some() =>
                {
                    continue;
                }
                Err(s) => return Err(tls::attach_error(&options.agent, s)),
            }
        };
        let session_id = attached.session_id;
        // Until the supervisor runs, keep the lease: the mount waits on the storage, which
        // may take minutes while DAOS rides out the loss of an engine.
        let early_lease =
            AbortOnDrop(tokio::spawn(supervise::keep_lease(session.clone(), session_id, attached.lease_ms)));
        let mounted = namespace
            .mount(pb::MountRequest { session_id, container: attached.container.clone() })
            .await
            .map_err(|s| Error::from_status("mount", s))?
            .into_inner();
        let live = Arc::new(Liveness::new(options.resume.clone()));
        let offer = prepared.as_ref().map(|p| p.transport_info());
        let limits = attached.limits.unwrap_or_default();
        let control = Arc::new(Control::new(channel.clone(), session_id, live.clone(), limits.max_lookup_paths));
        let ring = match prepared {
            Some(p) => {
                let agent = attached.agent_transport.as_ref().ok_or_else(|| Error::Protocol {
                    op: "attach".into(),
                    reason: "the agent accepted a transport but sent no worker address".into(),
                })?;
                let dp = Arc::new(p.finish(session_id, &agent.worker_address, channel, live.clone()).await?);
                Some(RingNamespace::new(dp, control.clone()))
            }
            None => None,
        };
        let registry = ring.as_ref().map_or_else(|| Arc::new(Registry::default()), |r| r.dp.registry().clone());
        let lease_ms = attached.lease_ms;
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| Inner {
            control,
            supervisor: tokio::spawn(supervise::supervise(weak.clone(), live, lease_ms)),
            ring,
            registry,
            options,
            offer,
            container: attached.container,
        });
        drop(early_lease);
        Ok(Client {
            inner,
            tenant: attached.tenant,
            container: mounted.container,
            chunk_bytes: mounted.chunk_bytes,
            limits,
        })
    }

    /// The session on the agent now (a new one each time the client resumes after an
    /// agent restart).
    pub fn session_id(&self) -> u64 {
        self.inner.control.session_id()
    }

    /// Run a control-plane call for the current session, sent again after an agent
    /// restart where the agent did not run it (see [`Control::call`]).
    pub(crate) async fn call<T, F, Fut>(&self, op: &str, idempotent: bool, f: F) -> Result<T>
    where
        F: Fn(u64) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.inner.control.call(op, idempotent, f).await
    }

    /// A capability token for a child process (e.g. a DataLoader worker), narrower than
    /// this session's: paths under `prefix`, `operations` (any of "read", "write",
    /// "create", "delete"), for `lifetime_s` seconds; empty or 0 keep this session's.
    /// The child attaches with it in [`ConnectOptions::capability_token`]. Returns the
    /// token and its expiry in Unix seconds.
    pub async fn delegate(&self, prefix: &str, operations: &[String], lifetime_s: u64) -> Result<(String, i64)> {
        let r = self
            .call("delegate", true, |session_id| {
                let mut session = self.inner.control.session.clone();
                let request = pb::DelegateRequest {
                    session_id,
                    path_prefix: prefix.to_owned(),
                    operations: operations.to_vec(),
                    lifetime_s,
                };
                async move { session.delegate(request).await }
            })
            .await?;
        Ok((r.capability_token, r.expires_unix_s))
    }
    pub fn tenant(&self) -> &str {
        &self.tenant
    }
    pub fn container(&self) -> &str {
        &self.container
    }
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }
    /// The limits the agent applies to this session.
    pub fn limits(&self) -> &pb::Limits {
        &self.limits
    }

    pub(crate) fn ns(&self) -> NamespaceClient<Channel> {
        self.inner.control.ns()
    }

    /// Attributes of a path (over the ring when the session has a data plane).
    pub async fn stat(&self, path: &str) -> Result<Attr> {
        self.inner.namespace().stat(&format!("stat {path}"), path).await
    }

    /// Attributes of many paths in as few calls as the agent's limit allows; each path
    /// gets its own result.
    pub async fn lookup(&self, paths: &[String]) -> Result<Vec<Result<Attr>>> {
        self.inner.namespace().lookup(paths).await
    }

    /// Create a directory (with `parents`, also its missing ancestors, like `mkdir -p`).
    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<Attr> {
        let op = format!("mkdir {path}");
        // `mkdir -p` may run twice; a plain mkdir that ran would then fail with "exists".
        let r = self
            .call(&op, parents, |session_id| {
                let mut ns = self.ns();
                let request = pb::MkdirRequest { session_id, path: path.to_owned(), mode: 0, parents };
                async move { ns.mkdir(request).await }
            })
            .await?;
        namespace::attr_from(&op, r.attr)
    }

    /// Stream a directory in batches; `each` sees every batch in order, so a huge
    /// directory never has to fit in memory. Starts after `anchor` if given.
    pub async fn readdir_batches(
        &self,
        path: &str,
        anchor: Option<&str>,
        batch_size: u32,
        mut each: impl FnMut(Vec<DirEntry>) -> Result<()>,
    ) -> Result<()> {
        let op = format!("readdir {path}");
        let mut listing = self.inner.namespace().readdir(&op, path, anchor, batch_size).await?;
        while let Some(batch) = listing.next_batch().await? {
            each(batch)?;
        }
        Ok(())
    }

    /// A whole directory listing, in name order.
    pub async fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let mut all = Vec::new();
        self.readdir_batches(path, None, 0, |batch| {
            all.extend(batch);
            Ok(())
        })
        .await?;
        Ok(all)
    }

    /// Open an existing file.
    pub async fn open(&self, path: &str, access: Access) -> Result<File> {
        let opened = self.inner.namespace().open(&format!("open {path}"), path, access).await?;
        Ok(File::opened(&self.inner, opened, path, access == Access::ReadWrite))
    }

    /// Create a file (or, unless `exclusive`, truncate an existing one) and open it
    /// for writing.
    pub async fn create(&self, path: &str, exclusive: bool) -> Result<File> {
        let opened = self.inner.namespace().create(&format!("create {path}"), path, exclusive).await?;
        Ok(File::opened(&self.inner, opened, path, true))
    }

    /// Remove a file or an empty directory; `recursive` removes a whole tree (over the
    /// ring when the session has a data plane).
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        self.inner.namespace().remove(&format!("remove {path}"), path, recursive).await
    }

    /// Rename; fails if `to` exists.
    pub async fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.call(&format!("rename {from} to {to}"), false, |session_id| {
            let mut ns = self.ns();
            let request = pb::RenameRequest { session_id, from: from.to_owned(), to: to.to_owned(), replace: false };
            async move { ns.rename(request).await }
        })
        .await?;
        Ok(())
    }

    /// Set a file's size by path.
    pub async fn truncate(&self, path: &str, size: u64) -> Result<()> {
        self.call(&format!("truncate {path}"), true, |session_id| {
            let mut ns = self.ns();
            let request = pb::TruncateRequest {
                session_id,
                target: Some(pb::truncate_request::Target::Path(path.to_owned())),
                size,
            };
            async move { ns.truncate(request).await }
        })
        .await?;
        Ok(())
    }

    /// Make every acknowledged change in the container durable.
    pub async fn sync(&self) -> Result<()> {
        self.call("sync", true, |session_id| {
            let mut ns = self.ns();
            async move { ns.sync(pb::SyncRequest { session_id, handle: 0 }).await }
        })
        .await?;
        Ok(())
    }

    /// A batch of data-plane requests on a ring of its own (blocking calls).
    pub fn batch(&self) -> Result<Batch> {
        self.data()?.batch()
    }

    fn data(&self) -> Result<&Arc<DataPlane>> {
        self.inner.data().ok_or_else(|| Error::DataPlane {
            op: "data plane".into(),
            reason: "this client attached without a data plane; set ConnectOptions::data_plane".into(),
        })
    }

    /// Allocate `length` bytes through the transport and register them with the agent.
    /// `access` says which way the agent may move data (reads land in WRITE_BY_AGENT
    /// regions, writes come from READ_BY_AGENT ones; READ_WRITE for both).
    pub async fn register_region(&self, length: usize, access: pb::RegionAccess) -> Result<RegisteredRegion> {
        let dp = self.data()?;
        let live = &self.inner.control.live;
        let deadline = Instant::now() + live.options.max_wait;
        loop {
            let seen = live.epoch();
            match dp.register(length, access).await {
                // Registered in a session the agent had forgotten: again in the next.
                Err(e @ Error::Agent { reason: Some(dpuio_proto::reason::Reason::NoSession), .. })
                    if live.options.enabled() && Instant::now() < deadline =>
                {
                    live.next_probe(seen).await.map_err(|why| Error::DataPlane { op: e.to_string(), reason: why })?;
                }
                r => return r,
            }
        }
    }

    /// Tell the agent to forget a region, then free it.
    pub async fn deregister_region(&self, region: RegisteredRegion) -> Result<()> {
        self.data()?.deregister(region).await
    }

    /// A pool of `count` registered buffers of `buffer_bytes` each.
    pub async fn region_pool(&self, buffer_bytes: usize, count: usize) -> Result<RegionPool> {
        let mut free = Vec::with_capacity(count);
        for _ in 0..count {
            free.push(self.register_region(buffer_bytes, pb::RegionAccess::ReadWrite).await?);
        }
        Ok(RegionPool::new(free))
    }

    /// Submit a batch of requests through one ring and wait for all of them (blocking:
    /// from async code use [`Client::submit`]).
    pub fn submit_blocking(&self, requests: &[Request]) -> Result<Vec<Done>> {
        self.data()?.run(requests)
    }

    /// [`Client::submit_blocking`] on the blocking pool.
    pub async fn submit(&self, requests: Vec<Request>) -> Result<Vec<Done>> {
        let client = self.clone();
        tokio::task::spawn_blocking(move || client.submit_blocking(&requests))
            .await
            .map_err(|e| Error::DataPlane { op: "submit".into(), reason: e.to_string() })?
    }

    /// The data plane's transport (what `"auto"` chose); `None` without a data plane.
    pub fn transport(&self) -> Option<crate::TransportInfo> {
        self.inner.data().map(|d| d.transport())
    }

    /// CPU time the data plane's progress thread has used (zero on shared memory).
    pub fn data_plane_stats(&self) -> DataPlaneStats {
        self.inner.data().map(|d| d.stats()).unwrap_or_default()
    }

    /// End the session now (its written handles are synced by the agent). A session
    /// the agent no longer knows (it restarted, or reaped it) counts as ended.
    pub async fn detach(self) -> Result<()> {
        self.inner.supervisor.abort();
        let mut session = self.inner.control.session.clone();
        match session.detach(pb::DetachRequest { session_id: self.session_id() }).await {
            // An agent that restarted (or reaped it) no longer has the session: ended.
            Err(s) if resume::classify(&Err(s.clone())) == Probe::Forgotten => Ok(()),
            Err(s) => Err(Error::from_status("detach", s)),
            Ok(_) => Ok(()),
        }
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("session_id", &format_args!("{:#018x}", self.session_id()))
            .field("tenant", &self.tenant)
            .field("container", &self.container)
            .finish()
    }
}
