//! The control-plane services: `dpuio.v1.Session` and `dpuio.v1.Namespace`.
//!
//! These are adapters: they decode a request, call the policy that checks it against the
//! session and runs it ([`crate::namespace`], [`crate::state`]) on the blocking pool
//! where it calls the backend, and encode the answer. Every error becomes a status in
//! [`crate::error`].

use std::pin::Pin;
use std::sync::Arc;

use dpuio_backend::{Attr, EntryKind, Layout, OpenOptions};
use dpuio_proto::v1 as pb;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::caller::Caller;
use crate::dataplane::DataPlaneError;
use crate::error::{Error, Result};
use crate::metrics::{Op, TenantMetrics};
use crate::namespace;
use crate::runtime::blocking;
use crate::state::{Agent, Session};

pub fn attr_to_proto(a: &Attr) -> pb::Attr {
    pb::Attr {
        kind: match a.kind {
            EntryKind::File => pb::EntryKind::File,
            EntryKind::Directory => pb::EntryKind::Directory,
        } as i32,
        size: a.size,
        mode: a.mode,
        mtime_ns: a.mtime_ns,
        object_id: a.object_id,
    }
}

/// `dpuio.v1.Session`.
pub struct SessionService {
    agent: Arc<Agent>,
}

impl SessionService {
    pub fn new(agent: Arc<Agent>) -> Self {
        SessionService { agent }
    }
}

#[tonic::async_trait]
impl pb::session_server::Session for SessionService {
    async fn attach(
        &self,
        request: Request<pb::AttachRequest>,
    ) -> std::result::Result<Response<pb::AttachResponse>, Status> {
        let caller = Caller::of(&request)?;
        let peer = request.remote_addr();
        let req = request.into_inner();
        let (tenant, rights) = self.agent.authorize_attach(&caller, &req.tenant, &req.capability_token)?;
        // Check the transport before the session exists, so a refused one leaves nothing behind.
        let dataplane = match &req.transport {
            None => None,
            Some(t) => {
                let Some(dp) = self.agent.dataplane().cloned() else {
                    return Err(Error::invalid(
                        "transport",
                        "this agent runs no data plane; attach without a transport",
                    )
                    .into());
                };
                // libfabric workers of different providers (shm, tcp) cannot talk: the
                // host names its provider as the first of its transports.
                let provider = if t.provider == "libfabric" { fabric::any::OFI } else { t.provider.as_str() };
                let fabric_provider = match provider {
                    fabric::any::OFI => t.transports.first().cloned().unwrap_or_default(),
                    _ => String::new(),
                };
                Some((dp, provider.to_owned(), fabric_provider, t.library.clone(), t.worker_address.clone()))
            }
        };
        let session = self.agent.attach(&tenant, &req.client_name, rights)?;
        self.agent.set_connection(&session, peer);
        let mut agent_transport = None;
        if let Some((dp, provider, fabric_provider, host_library, host_address)) = dataplane {
            let connected = blocking(move || {
                dp.connect(&provider, &fabric_provider, &host_library, &host_address)
                    .map(|(peer, address, describe)| (peer, provider, address, describe))
                    .map_err(|e| match e {
                        DataPlaneError::NotOffered(_) => Error::invalid("transport.provider", e.to_string()),
                        e => Error::invalid("transport.worker_address", e.to_string()),
                    })
            })
            .await;
            match connected {
                Ok((peer, provider, worker_address, describe)) => {
                    session.set_peer(peer);
                    agent_transport = Some(pb::TransportInfo {
                        library: if provider == fabric::any::OFI { crate::dataplane::library() } else { String::new() },
                        provider,
                        worker_address,
                        transports: vec![describe],
                    });
                }
                Err(e) => {
                    let _ = self.agent.detach(session.id);
                    return Err(e.into());
                }
            }
        }
        tracing::info!(session = format!("{:#018x}", session.id), tenant = %session.tenant, client = %session.client_name,
            data_plane = agent_transport.is_some(), "attached");
        let l = self.agent.limits();
        let (max_handles, max_regions) = self.agent.session_limits(&session.tenant);
        Ok(Response::new(pb::AttachResponse {
            session_id: session.id,
            tenant: session.tenant.clone(),
            container: session.container_name.clone(),
            agent_transport,
            limits: Some(pb::Limits {
                max_handles,
                max_regions,
                max_io_bytes: l.max_io_bytes,
                max_inflight: l.max_inflight_per_session,
                max_readdir_batch: l.max_readdir_batch,
                max_lookup_paths: l.max_lookup_paths,
            }),
            lease_ms: self.agent.config.lease_ms,
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        }))
    }

    async fn keep_alive(
        &self,
        request: Request<pb::KeepAliveRequest>,
    ) -> std::result::Result<Response<pb::KeepAliveResponse>, Status> {
        let caller = Caller::of(&request)?;
        let session = self.agent.session_for(request.get_ref().session_id, &caller)?;
        self.agent.set_connection(&session, request.remote_addr());
        self.agent.keep_alive(request.into_inner().session_id)?;
        Ok(Response::new(pb::KeepAliveResponse { lease_ms: self.agent.config.lease_ms }))
    }

    async fn delegate(
        &self,
        request: Request<pb::DelegateRequest>,
    ) -> std::result::Result<Response<pb::DelegateResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.agent.session_for(req.session_id, &caller)?;
        let (token, expires_at) = self.agent.delegate(&session, &req.path_prefix, &req.operations, req.lifetime_s)?;
        let expires_unix_s = expires_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        tracing::info!(session = format!("{:#018x}", session.id), tenant = %session.tenant, expires_unix_s, "delegated a capability token");
        Ok(Response::new(pb::DelegateResponse { capability_token: token, expires_unix_s }))
    }

    async fn detach(
        &self,
        request: Request<pb::DetachRequest>,
    ) -> std::result::Result<Response<pb::DetachResponse>, Status> {
        let caller = Caller::of(&request)?;
        let id = request.into_inner().session_id;
        self.agent.session_for(id, &caller)?;
        let agent = self.agent.clone();
        if !blocking(move || agent.detach(id)).await? {
            return Err(Error::NoSession { id }.into());
        }
        tracing::info!(session = format!("{id:#018x}"), "detached");
        Ok(Response::new(pb::DetachResponse {}))
    }
}

/// `result`, counted as a namespace call `op` of the session's tenant.
fn counted<T>(metrics: &TenantMetrics, op: Op, result: Result<T>) -> Result<T> {
    metrics.call(op, result.as_ref().map(|_| ()).map_err(Error::code));
    result
}

/// `dpuio.v1.Namespace`.
pub struct NamespaceService {
    agent: Arc<Agent>,
}

impl NamespaceService {
    pub fn new(agent: Arc<Agent>) -> Self {
        NamespaceService { agent }
    }

    fn session(&self, id: u64, caller: &Caller) -> Result<Arc<Session>> {
        self.agent.session_for(id, caller)
    }
}

type ReaddirStream = Pin<Box<dyn Stream<Item = std::result::Result<pb::ReaddirResponse, Status>> + Send>>;

#[tonic::async_trait]
impl pb::namespace_server::Namespace for NamespaceService {
    async fn mount(
        &self,
        request: Request<pb::MountRequest>,
    ) -> std::result::Result<Response<pb::MountResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.session(req.session_id, &caller)?;
        let (agent, metrics) = (self.agent.clone(), session.io.metrics.clone());
        let mounted = blocking(move || namespace::mount(&agent, &session, &req.container)).await;
        let (c, root) = counted(&metrics, Op::Mount, mounted)?;
        Ok(Response::new(pb::MountResponse {
            container: c.name().to_owned(),
            chunk_bytes: c.chunk_bytes(),
            root: Some(attr_to_proto(&root)),
        }))
    }

    async fn lookup(
        &self,
        request: Request<pb::LookupRequest>,
    ) -> std::result::Result<Response<pb::LookupResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.session(req.session_id, &caller)?;
        let (limit, metrics) = (self.agent.limits().max_lookup_paths, session.io.metrics.clone());
        let outcomes =
            counted(&metrics, Op::Lookup, blocking(move || namespace::lookup(&session, req.paths, limit)).await)?;
        let results = outcomes
            .into_iter()
            .map(|(path, outcome)| match outcome {
                Ok(attr) => pb::LookupResult {
                    path,
                    result: Some(pb::lookup_result::Result::Attr(attr_to_proto(&attr))),
                    code: 0,
                },
                Err(e) => pb::LookupResult {
                    path,
                    code: e.code() as i32,
                    result: Some(pb::lookup_result::Result::Error(e.to_string())),
                },
            })
            .collect();
        Ok(Response::new(pb::LookupResponse { results }))
    }

    async fn stat(&self, request: Request<pb::StatRequest>) -> std::result::Result<Response<pb::StatResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.session(req.session_id, &caller)?;
        let metrics = session.io.metrics.clone();
        let attr = match req.target {
            Some(pb::stat_request::Target::Path(raw)) => blocking(move || namespace::stat(&session, &raw)).await,
            Some(pb::stat_request::Target::Handle(h)) => blocking(move || namespace::stat_handle(&session, h)).await,
            None => Err(Error::invalid("target", "give a path or a handle")),
        };
        let attr = counted(&metrics, Op::Stat, attr)?;
        Ok(Response::new(pb::StatResponse { attr: Some(attr_to_proto(&attr)) }))
    }

    async fn mkdir(
        &self,
        request: Request<pb::MkdirRequest>,
    ) -> std::result::Result<Response<pb::MkdirResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.session(req.session_id, &caller)?;
        let mode = if req.mode == 0 { 0o755 } else { req.mode & 0o7777 };
        let metrics = session.io.metrics.clone();
        let made = blocking(move || namespace::mkdir(&session, &req.path, mode, req.parents)).await;
        let attr = counted(&metrics, Op::Mkdir, made)?;
        Ok(Response::new(pb::MkdirResponse { attr: Some(attr_to_proto(&attr)) }))
    }

    type ReaddirStream = ReaddirStream;

    async fn readdir(
        &self,
        request: Request<pb::ReaddirRequest>,
    ) -> std::result::Result<Response<ReaddirStream>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.session(req.session_id, &caller)?;
        let metrics = session.io.metrics.clone();
        let (container, p) =
            namespace::readdir_target(&session, &req.path).inspect_err(|e| metrics.call(Op::Readdir, Err(e.code())))?;
        // The anchor is the backend's own opaque token; the backend checks it (a name
        // for `local`, an authenticated DFS anchor for `daos`).
        let max = self.agent.limits().max_readdir_batch;
        let batch = namespace::readdir_batch(req.batch_size, max);
        // The first batch is fetched before answering, so a missing directory is an
        // error status rather than an error inside the stream.
        // Counted once, by how the first batch ended (a listing is one call; its later
        // batches are the same call's stream).
        let first = {
            let (c, p, anchor) = (container.clone(), p.clone(), req.anchor.clone());
            let listed =
                blocking(move || Ok(c.readdir(&p, (!anchor.is_empty()).then_some(anchor.as_str()), batch)?)).await;
            counted(&metrics, Op::Readdir, listed)?
        };
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move {
            let mut next = Some(first);
            while let Some((entries, more)) = next.take() {
                let anchor = more.clone().unwrap_or_default();
                let response = pb::ReaddirResponse {
                    entries: entries
                        .iter()
                        .map(|e| pb::DirEntry { name: e.name.clone(), attr: Some(attr_to_proto(&e.attr)) })
                        .collect(),
                    anchor: anchor.clone(),
                    done: more.is_none(),
                };
                if tx.send(Ok(response)).await.is_err() || more.is_none() {
                    return; // the client went away, or the listing is complete
                }
                let (c, p) = (container.clone(), p.clone());
                match blocking(move || Ok(c.readdir(&p, Some(&anchor), batch)?)).await {
                    Ok(batch) => next = Some(batch),
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn open(&self, request: Request<pb::OpenRequest>) -> std::result::Result<Response<pb::OpenResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let write = match pb::Access::try_from(req.access) {
            Ok(pb::Access::Unspecified | pb::Access::ReadOnly) => false,
            Ok(pb::Access::ReadWrite) => true,
            Err(_) => return Err(Error::invalid("access", format!("unknown access mode {}", req.access)).into()),
        };
        let options = namespace::open_options(write, req.truncate)?;
        self.open_with(req.session_id, &caller, req.path, options, 0, Op::Open, req.handle).await
    }

    async fn create(
        &self,
        request: Request<pb::CreateRequest>,
    ) -> std::result::Result<Response<pb::OpenResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let layout = Layout { chunk_bytes: req.chunk_bytes, object_class: req.object_class };
        let (options, mode) = namespace::create_options(req.exclusive, req.mode, layout);
        self.open_with(req.session_id, &caller, req.path, options, mode, Op::Create, 0).await
    }

    async fn close(
        &self,
        request: Request<pb::CloseRequest>,
    ) -> std::result::Result<Response<pb::CloseResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.session(req.session_id, &caller)?;
        let metrics = session.io.metrics.clone();
        counted(&metrics, Op::Close, blocking(move || session.io.close_handle(req.handle)).await)?;
        Ok(Response::new(pb::CloseResponse {}))
    }

    async fn remove(
        &self,
        request: Request<pb::RemoveRequest>,
    ) -> std::result::Result<Response<pb::RemoveResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.session(req.session_id, &caller)?;
        let (agent, metrics) = (self.agent.clone(), session.io.metrics.clone());
        let removed = blocking(move || namespace::remove(&agent, &session, &req.path, req.recursive)).await;
        counted(&metrics, Op::Remove, removed)?;
        Ok(Response::new(pb::RemoveResponse {}))
    }

    async fn rename(
        &self,
        request: Request<pb::RenameRequest>,
    ) -> std::result::Result<Response<pb::RenameResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.session(req.session_id, &caller)?;
        let (agent, metrics) = (self.agent.clone(), session.io.metrics.clone());
        counted(
            &metrics,
            Op::Rename,
            blocking(move || namespace::rename(&agent, &session, &req.from, &req.to, req.replace)).await,
        )?;
        Ok(Response::new(pb::RenameResponse {}))
    }

    async fn truncate(
        &self,
        request: Request<pb::TruncateRequest>,
    ) -> std::result::Result<Response<pb::TruncateResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.session(req.session_id, &caller)?;
        let (size, metrics) = (req.size, session.io.metrics.clone());
        let truncated = match req.target {
            Some(pb::truncate_request::Target::Path(raw)) => {
                blocking(move || namespace::truncate(&session, &raw, size)).await
            }
            Some(pb::truncate_request::Target::Handle(h)) => {
                blocking(move || namespace::truncate_handle(&session, h, size)).await
            }
            None => Err(Error::invalid("target", "give a path or a handle")),
        };
        counted(&metrics, Op::Truncate, truncated)?;
        Ok(Response::new(pb::TruncateResponse {}))
    }

    async fn sync(&self, request: Request<pb::SyncRequest>) -> std::result::Result<Response<pb::SyncResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.session(req.session_id, &caller)?;
        let metrics = session.io.metrics.clone();
        counted(&metrics, Op::Sync, blocking(move || namespace::sync(&session, req.handle)).await)?;
        Ok(Response::new(pb::SyncResponse {}))
    }
}

impl NamespaceService {
    #[allow(clippy::too_many_arguments)] // the fields of Open and Create, one call for both
    async fn open_with(
        &self,
        session_id: u64,
        caller: &Caller,
        raw: String,
        options: OpenOptions,
        mode: u32,
        op: Op,
        claim: u64,
    ) -> std::result::Result<Response<pb::OpenResponse>, Status> {
        let session = self.session(session_id, caller)?;
        let limit = self.agent.session_limits(&session.tenant).0;
        let (agent, metrics) = (self.agent.clone(), session.io.metrics.clone());
        let opened = blocking(move || namespace::open(&agent, &session, &raw, options, mode, limit, claim)).await;
        let (handle, attr, chunk_bytes) = counted(&metrics, op, opened)?;
        Ok(Response::new(pb::OpenResponse { handle, attr: Some(attr_to_proto(&attr)), chunk_bytes }))
    }
}

/// `dpuio.v1.Memory`: the host's regions and rings.
pub struct MemoryService {
    agent: Arc<Agent>,
}

impl MemoryService {
    pub fn new(agent: Arc<Agent>) -> Self {
        MemoryService { agent }
    }

    fn dataplane(&self) -> Result<Arc<crate::dataplane::DataPlane>> {
        self.agent.dataplane().cloned().ok_or_else(|| Error::invalid("session_id", "this agent runs no data plane"))
    }
}

fn region_access(raw: i32) -> Result<crate::validate::RegionAccess> {
    use crate::validate::RegionAccess;
    match pb::RegionAccess::try_from(raw) {
        Ok(pb::RegionAccess::WriteByAgent) => Ok(RegionAccess { agent_writes: true, agent_reads: false }),
        Ok(pb::RegionAccess::ReadByAgent) => Ok(RegionAccess { agent_writes: false, agent_reads: true }),
        Ok(pb::RegionAccess::ReadWrite) => Ok(RegionAccess { agent_writes: true, agent_reads: true }),
        _ => Err(Error::invalid(
            "access",
            format!("{raw} is not a region access; use WRITE_BY_AGENT, READ_BY_AGENT or READ_WRITE"),
        )),
    }
}

#[tonic::async_trait]
impl pb::memory_server::Memory for MemoryService {
    async fn register_region(
        &self,
        request: Request<pb::RegisterRegionRequest>,
    ) -> std::result::Result<Response<pb::RegisterRegionResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.agent.session_for(req.session_id, &caller)?;
        let peer = session.io.peer()?;
        let dp = self.dataplane()?;
        let access = region_access(req.access)?;
        if req.length == 0 || req.address.checked_add(req.length).is_none() {
            return Err(Error::invalid(
                "length",
                format!("{} bytes at {:#x} is not a region", req.length, req.address),
            )
            .into());
        }
        if req.remote_key.is_empty() || req.remote_key.len() > 64 * 1024 {
            return Err(Error::invalid(
                "remote_key",
                format!("{} bytes: expected a packed remote key", req.remote_key.len()),
            )
            .into());
        }
        let limit = self.agent.session_limits(&session.tenant).1;
        if session.io.region_count() >= limit as usize {
            return Err(Error::Limit { what: "registered regions in this session", limit: limit.into() }.into());
        }
        let id = match req.region_id {
            0 => session.io.next_region_id(),
            claim => session.io.claim_region_id(claim)?,
        };
        let region = blocking(move || {
            let region = dp
                .register_region(&peer, id, req.address, req.length, &req.remote_key, access)
                .map_err(|e| Error::invalid("remote_key", format!("cannot use the region: {e}")))?;
            session.io.add_region(region, limit)
        })
        .await?;
        tracing::debug!(region = region.id, bytes = region.length, mapped = region.is_mapped(), "region registered");
        Ok(Response::new(pb::RegisterRegionResponse { region_id: region.id }))
    }

    async fn deregister_region(
        &self,
        request: Request<pb::DeregisterRegionRequest>,
    ) -> std::result::Result<Response<pb::DeregisterRegionResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        self.agent.session_for(req.session_id, &caller)?.io.remove_region(req.region_id)?;
        Ok(Response::new(pb::DeregisterRegionResponse {}))
    }

    async fn register_ring(
        &self,
        request: Request<pb::RegisterRingRequest>,
    ) -> std::result::Result<Response<pb::RegisterRingResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        let session = self.agent.session_for(req.session_id, &caller)?;
        let peer = session.io.peer()?;
        let dp = self.dataplane()?;
        let region = session.io.host_region(req.region_id).ok_or_else(|| {
            Error::invalid("region_id", format!("region {} is not registered in this session", req.region_id))
        })?;
        let limit = self.agent.session_limits(&session.tenant).1;
        let id = session.io.next_region_id();
        blocking(move || {
            let ring = dp
                .register_ring(&peer, id, region, req.offset, req.entries)
                .map_err(|e| Error::invalid("entries", e.to_string()))?;
            session.io.add_ring(ring, limit)
        })
        .await?;
        Ok(Response::new(pb::RegisterRingResponse { ring_id: id }))
    }

    async fn deregister_ring(
        &self,
        request: Request<pb::DeregisterRingRequest>,
    ) -> std::result::Result<Response<pb::DeregisterRingResponse>, Status> {
        let caller = Caller::of(&request)?;
        let req = request.into_inner();
        self.agent.session_for(req.session_id, &caller)?.io.remove_ring(req.ring_id)?;
        Ok(Response::new(pb::DeregisterRingResponse {}))
    }
}
