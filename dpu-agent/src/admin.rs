//! `dpuio.v1.Admin`: the operator's service, on a Unix socket of its own.
//!
//! Only the agent's own user and root may connect: the socket is created with mode
//! 0600 and every accepted connection's peer credentials are checked, so a tenant
//! with a client certificate (or a shell as another user) cannot reach it. `dpuctl`
//! is its client.
//!
//! Changes made here (tenants added or removed, QoS, session limits, rotated-in keys)
//! are recorded in the state file of the data directory once they are in force, and
//! applied again at the next start ([`crate::persist`] has the rules: the config file
//! wins for a setting it changed since).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use dpuio_proto::v1 as pb;
use tokio::net::{UnixListener, UnixStream};
use tonic::{Request, Response, Status};

use crate::config::{QosConfig, TenantConfig, check_identifier};
use crate::error::{Error, Result};
use crate::persist::store::now_unix_s;
use crate::persist::{Origin, TenantLimits, TenantOrigins};
use crate::runtime::blocking;
use crate::serve_error::ServeError;
use crate::state::Agent;
use crate::tls::ControlTls;

/// The Admin service.
pub struct AdminService {
    agent: Arc<Agent>,
    tls: Option<Arc<ControlTls>>,
}

impl AdminService {
    pub fn new(agent: Arc<Agent>, tls: Option<Arc<ControlTls>>) -> Self {
        AdminService { agent, tls }
    }
}

/// Bind the admin socket: mode 0600, a stale socket file from an earlier run replaced.
pub fn bind(path: &Path) -> std::result::Result<UnixListener, ServeError> {
    let fail = |source| ServeError::AdminSocket { path: path.display().to_string(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    if std::fs::symlink_metadata(path).is_ok() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(fail(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another agent answers on it (stop it, or set [admin] socket)",
            )));
        }
        std::fs::remove_file(path).map_err(fail)?;
    }
    let listener = UnixListener::bind(path).map_err(fail)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
    Ok(listener)
}

/// Connections from the agent's own user or root; others are closed at once.
pub fn incoming(listener: UnixListener) -> impl tokio_stream::Stream<Item = std::io::Result<UnixStream>> {
    let me = rustix::process::geteuid().as_raw();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            match stream.peer_cred() {
                Ok(cred) if cred.uid() == me || cred.uid() == 0 => {
                    if tx.send(Ok(stream)).await.is_err() {
                        return;
                    }
                }
                Ok(cred) => tracing::warn!(uid = cred.uid(), "admin connection from another user refused"),
                Err(e) => tracing::warn!(error = %e, "admin connection without peer credentials refused"),
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

fn qos_to_proto(q: &QosConfig) -> pb::Qos {
    pb::Qos {
        bytes_per_s: q.limits.bytes_per_s,
        ops_per_s: q.limits.ops_per_s,
        burst_bytes: q.limits.bytes_burst,
        burst_ops: q.limits.ops_burst,
        weight: q.weight,
        max_inflight: q.max_inflight,
    }
}

fn qos_from_proto(q: Option<pb::Qos>) -> Result<QosConfig> {
    let mut out = QosConfig::default();
    let Some(q) = q else { return Ok(out) };
    out.limits.bytes_per_s = q.bytes_per_s;
    out.limits.ops_per_s = q.ops_per_s;
    out.limits.bytes_burst = q.burst_bytes;
    out.limits.ops_burst = q.burst_ops;
    // What the config file accepts (TOML integers are signed): the state file keeps it.
    for (field, v) in [
        ("qos.bytes_per_s", q.bytes_per_s),
        ("qos.ops_per_s", q.ops_per_s),
        ("qos.burst_bytes", q.burst_bytes),
        ("qos.burst_ops", q.burst_ops),
    ] {
        if v > i64::MAX as u64 {
            return Err(Error::invalid(field, format!("{v} is more than the largest value, {}", i64::MAX)));
        }
    }
    if q.weight > dpuio_auth::qos::MAX_WEIGHT {
        return Err(Error::invalid(
            "qos.weight",
            format!("{} is more than the largest weight, {}", q.weight, dpuio_auth::qos::MAX_WEIGHT),
        ));
    }
    if q.weight > 0 {
        out.weight = q.weight;
    }
    if q.max_inflight > 0 {
        out.max_inflight = q.max_inflight;
    }
    Ok(out)
}

/// The DAOS identity of a tenant being added: the config's for a tenant it names (the
/// request may repeat it, not change it), else the request's, checked as the config
/// checks it.
fn daos_identity(
    agent: &Agent,
    configured: Option<&TenantConfig>,
    t: &pb::Tenant,
) -> std::result::Result<(String, String), Status> {
    if let Some(c) = configured {
        if !t.daos_user.is_empty() && (t.daos_user != c.daos_user || t.daos_group != c.daos_group) {
            return Err(Error::invalid(
                "tenant.daos_user",
                format!(
                    "tenant {:?} is named in the config file with DAOS user {:?}: leave --daos-user out, or change \
                     the config file",
                    t.name, c.daos_user
                ),
            )
            .into());
        }
        return Ok((c.daos_user.clone(), c.daos_group.clone()));
    }
    if t.daos_user.is_empty() {
        if !t.daos_group.is_empty() {
            return Err(Error::invalid(
                "tenant.daos_group",
                "needs --daos-user: a DAOS identity is a user and its group",
            )
            .into());
        }
        return Ok((String::new(), String::new()));
    }
    if !matches!(agent.config.backend, crate::config::BackendConfig::Daos(_)) {
        return Err(Error::invalid(
            "tenant.daos_user",
            "a DAOS identity needs the DAOS backend; this agent's backend is not DAOS",
        )
        .into());
    }
    dpuio_worker::Identity::resolve(&t.daos_user, &t.daos_group)
        .map_err(|reason| Error::invalid("tenant.daos_user", reason))?;
    Ok((t.daos_user.clone(), t.daos_group.clone()))
}

fn tenant_to_proto(t: &TenantConfig) -> pb::Tenant {
    pb::Tenant {
        name: t.name.clone(),
        container: t.container.clone(),
        qos: Some(qos_to_proto(&t.qos)),
        max_sessions: t.max_sessions.unwrap_or(0),
        encrypted: t.encryption.is_some(),
        max_handles_per_session: t.max_handles_per_session.unwrap_or(0),
        max_regions_per_session: t.max_regions_per_session.unwrap_or(0),
        daos_user: t.daos_user.clone(),
        daos_group: t.daos_group.clone(),
    }
}

fn origin_to_proto(o: Origin) -> pb::Origin {
    match o {
        Origin::Config => pb::Origin { source: "config".into(), changed_unix_s: 0 },
        Origin::Dpuctl { changed_unix_s } => {
            pb::Origin { source: "dpuctl".into(), changed_unix_s: i64::try_from(changed_unix_s).unwrap_or(i64::MAX) }
        }
    }
}

fn origins_to_proto(o: TenantOrigins) -> pb::TenantOrigins {
    pb::TenantOrigins {
        tenant: o.tenant,
        entry: Some(origin_to_proto(o.entry)),
        qos: Some(origin_to_proto(o.qos)),
        limits: Some(origin_to_proto(o.limits)),
        key: o.key.map(origin_to_proto),
        removed: o.removed.map(|changed_unix_s| origin_to_proto(Origin::Dpuctl { changed_unix_s })),
    }
}

fn name(field: &'static str, value: &str) -> Result<()> {
    check_identifier(value).map_err(|reason| Error::invalid(field, format!("{value:?} {reason}")))
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn status(&self, _: Request<pb::StatusRequest>) -> std::result::Result<Response<pb::StatusResponse>, Status> {
        Ok(Response::new(pb::StatusResponse {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            backend: self.agent.backend_kind().to_owned(),
            uptime_s: self.agent.started.elapsed().as_secs(),
            sessions: self.agent.session_count() as u32,
            tenants: self.agent.tenant_list().len() as u32,
            draining: self.agent.is_draining(),
            tenant_figures: self.agent.tenant_figures(),
            metrics_listen: self.agent.metrics_addr().map(|a| a.to_string()).unwrap_or_default(),
            state_file: self.agent.persisted().map(|s| s.path().display().to_string()).unwrap_or_default(),
            origins: self.agent.setting_origins().into_iter().map(origins_to_proto).collect(),
        }))
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> std::result::Result<Response<pb::ListSessionsResponse>, Status> {
        let tenant = request.into_inner().tenant;
        let sessions = self
            .agent
            .session_list()
            .into_iter()
            .filter(|s| tenant.is_empty() || s.tenant == tenant)
            .map(|s| pb::SessionInfo {
                session_id: s.id,
                tenant: s.tenant.clone(),
                client_name: s.client_name.clone(),
                open_handles: s.io.handle_count() as u32,
                regions: s.io.region_count() as u32,
                attached_unix_s: s.attached_at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64),
            })
            .collect();
        Ok(Response::new(pb::ListSessionsResponse { sessions }))
    }

    async fn list_tenants(
        &self,
        _: Request<pb::ListTenantsRequest>,
    ) -> std::result::Result<Response<pb::ListTenantsResponse>, Status> {
        let tenants = self.agent.tenant_list().iter().map(tenant_to_proto).collect();
        Ok(Response::new(pb::ListTenantsResponse { tenants }))
    }

    async fn add_tenant(
        &self,
        request: Request<pb::AddTenantRequest>,
    ) -> std::result::Result<Response<pb::AddTenantResponse>, Status> {
        let t = request.into_inner().tenant.ok_or_else(|| Error::invalid("tenant", "missing"))?;
        name("tenant.name", &t.name)?;
        // A tenant the config names (removed earlier with dpuctl) comes back with its
        // config's container and encryption.
        let configured = self.agent.config.tenants.iter().find(|c| c.name == t.name);
        let container = match configured {
            Some(c) if t.container.is_empty() || t.container == c.container => c.container.clone(),
            Some(c) => {
                return Err(Error::invalid(
                    "tenant.container",
                    format!(
                        "tenant {:?} is named in the config file with container {:?}: add it back with that container \
                         (or leave --container out), or change the config file",
                        t.name, c.container
                    ),
                )
                .into());
            }
            None if t.container.is_empty() => t.name.clone(),
            None => t.container.clone(),
        };
        name("tenant.container", &container)?;
        let mut tenant = TenantConfig::new(&t.name, &container);
        tenant.encryption = configured.and_then(|c| c.encryption.clone());
        tenant.qos = qos_from_proto(t.qos)?;
        tenant.max_sessions = (t.max_sessions > 0).then_some(t.max_sessions);
        tenant.max_handles_per_session = (t.max_handles_per_session > 0).then_some(t.max_handles_per_session);
        tenant.max_regions_per_session = (t.max_regions_per_session > 0).then_some(t.max_regions_per_session);
        (tenant.daos_user, tenant.daos_group) = daos_identity(&self.agent, configured, &t)?;
        let agent = self.agent.clone();
        blocking(move || {
            agent.change_persisted(|state| {
                agent.add_tenant(tenant.clone())?;
                state.record_add(&agent.config.tenants, &tenant, now_unix_s());
                Ok(())
            })
        })
        .await?;
        tracing::info!(tenant = %t.name, container, "tenant added");
        Ok(Response::new(pb::AddTenantResponse {}))
    }

    async fn remove_tenant(
        &self,
        request: Request<pb::RemoveTenantRequest>,
    ) -> std::result::Result<Response<pb::RemoveTenantResponse>, Status> {
        let tenant = request.into_inner().name;
        let agent = self.agent.clone();
        let removed = tenant.clone();
        let detached = blocking(move || {
            agent.change_persisted(|state| {
                // Recorded even when detaching a session failed: the tenant is gone.
                let had = agent.has_tenant(&removed);
                let outcome = agent.remove_tenant(&removed);
                if had && !agent.has_tenant(&removed) {
                    state.record_remove(&agent.config.tenants, &removed, now_unix_s());
                }
                outcome
            })
        })
        .await?;
        tracing::info!(tenant, detached, "tenant removed; its data stays on disk");
        Ok(Response::new(pb::RemoveTenantResponse { detached_sessions: detached as u32 }))
    }

    async fn set_qos(
        &self,
        request: Request<pb::SetQosRequest>,
    ) -> std::result::Result<Response<pb::SetQosResponse>, Status> {
        let req = request.into_inner();
        let qos = qos_from_proto(req.qos)?;
        let (agent, tenant) = (self.agent.clone(), req.tenant.clone());
        blocking(move || {
            agent.change_persisted(|state| {
                agent.set_qos(&tenant, qos)?;
                state.record_qos(&agent.config.tenants, &tenant, &qos, now_unix_s());
                Ok(())
            })
        })
        .await?;
        tracing::info!(tenant = %req.tenant, ?qos, "QoS changed");
        Ok(Response::new(pb::SetQosResponse {}))
    }

    async fn set_limits(
        &self,
        request: Request<pb::SetLimitsRequest>,
    ) -> std::result::Result<Response<pb::SetLimitsResponse>, Status> {
        let r = request.into_inner();
        let some = |n: u32| (n > 0).then_some(n);
        let limits = TenantLimits {
            max_sessions: some(r.max_sessions),
            max_handles_per_session: some(r.max_handles_per_session),
            max_regions_per_session: some(r.max_regions_per_session),
        };
        let (agent, tenant) = (self.agent.clone(), r.tenant.clone());
        blocking(move || {
            agent.change_persisted(|state| {
                agent.set_tenant_limits(
                    &tenant,
                    limits.max_sessions,
                    limits.max_handles_per_session,
                    limits.max_regions_per_session,
                )?;
                state.record_limits(&agent.config.tenants, &tenant, limits, now_unix_s());
                Ok(())
            })
        })
        .await?;
        tracing::info!(tenant = %r.tenant, r.max_sessions, r.max_handles_per_session, r.max_regions_per_session, "limits changed");
        Ok(Response::new(pb::SetLimitsResponse {}))
    }

    async fn drain(&self, _: Request<pb::DrainRequest>) -> std::result::Result<Response<pb::DrainResponse>, Status> {
        self.agent.set_draining();
        tracing::info!("draining: no new sessions");
        Ok(Response::new(pb::DrainResponse {}))
    }

    async fn issue_cert(
        &self,
        request: Request<pb::IssueCertRequest>,
    ) -> std::result::Result<Response<pb::IssueCertResponse>, Status> {
        let req = request.into_inner();
        name("tenant", &req.tenant)?;
        if !self.agent.has_tenant(&req.tenant) {
            return Err(Error::invalid(
                "tenant",
                format!("{:?} is not configured on this agent: add it first (dpuctl tenant add)", req.tenant),
            )
            .into());
        }
        let tls = self.tls.clone().ok_or_else(|| {
            Error::PermissionDenied(
                "this agent runs without TLS ([tls] mode = \"off\"): there is no CA to issue from".into(),
            )
        })?;
        let days = if req.validity_days == 0 { crate::tls::DEV_CLIENT_VALIDITY_DAYS } else { req.validity_days };
        let work = self.agent.config.data_dir.join("pki").join(format!("issue-{:016x}", rand::random::<u64>()));
        let tenant = req.tenant.clone();
        let issued = blocking(move || {
            let dev = tls.dev_pki.as_ref().ok_or_else(|| {
                Error::PermissionDenied(
                    "this agent uses operator certificate files ([tls] cert/key/client_ca): issue client certificates from that CA".into(),
                )
            })?;
            let outcome = dev
                .issue_client(&tenant, &work, days)
                .map_err(|e| Error::invalid("tenant", e.to_string()))
                .and_then(|bundle| {
                    let key = std::fs::read_to_string(bundle.cert().key_path())
                        .map_err(|e| Error::Internal(format!("reading the issued key: {e}")))?;
                    Ok(pb::IssueCertResponse {
                        cert_pem: bundle.cert().cert_pem().to_owned(),
                        key_pem: key,
                        ca_pem: bundle.ca_pem().to_owned(),
                        spiffe_id: bundle.spiffe_id().to_owned(),
                    })
                });
            let _ = std::fs::remove_dir_all(&work);
            outcome
        })
        .await?;
        tracing::info!(tenant = %req.tenant, spiffe_id = %issued.spiffe_id, days, "client certificate issued");
        Ok(Response::new(issued))
    }

    async fn rotate_key(
        &self,
        request: Request<pb::RotateKeyRequest>,
    ) -> std::result::Result<Response<pb::RotateKeyResponse>, Status> {
        let req = request.into_inner();
        if req.new_key_file.is_empty() {
            return Err(Error::invalid("new_key_file", "name the file holding the new key").into());
        }
        let agent = self.agent.clone();
        // Absolute, as the state file records it: the agent's working directory may differ at the next start.
        let file = std::path::absolute(PathBuf::from(&req.new_key_file))
            .map_err(|e| Error::invalid("new_key_file", format!("{:?}: {e}", req.new_key_file)))?;
        let tenant = req.tenant.clone();
        let r = blocking(move || {
            agent.change_persisted(|state| {
                let before = agent.current_key_version(&tenant);
                let outcome = agent.rotate_key(&tenant, &file);
                // Also when re-wrapping failed half-way: the new version is current and
                // wraps the files written since, so the next start must have it.
                if let Some(version) = agent.current_key_version(&tenant).filter(|v| Some(*v) != before) {
                    state.record_key(&agent.config.tenants, &tenant, version, &file, now_unix_s());
                }
                outcome
            })
        })
        .await?;
        tracing::info!(tenant = %req.tenant, old = r.old_version, new = r.new_version, rewrapped = r.report.rewrapped, failed = r.report.failed, "key rotated");
        Ok(Response::new(pb::RotateKeyResponse {
            old_version: r.old_version,
            new_version: r.new_version,
            rewrapped: r.report.rewrapped,
            already_new: r.report.already_new,
            other_version: r.report.other_version,
            unencrypted: r.report.unencrypted,
            failed: r.report.failed,
            failures: r.report.failures.iter().map(|(p, e)| format!("{p}: {e}")).collect(),
        }))
    }

    async fn key_status(
        &self,
        request: Request<pb::KeyStatusRequest>,
    ) -> std::result::Result<Response<pb::KeyStatusResponse>, Status> {
        let tenant = request.into_inner().tenant;
        let agent = self.agent.clone();
        let k = blocking(move || agent.key_status(&tenant)).await?;
        let versions = k
            .versions
            .iter()
            .map(|&v| pb::KeyVersionFiles {
                version: v,
                files: k.status.files(v),
                current: v == k.current_version,
                can_retire: v != k.current_version && k.status.can_retire(v),
            })
            .collect();
        Ok(Response::new(pb::KeyStatusResponse {
            current_version: k.current_version,
            versions,
            unencrypted: k.status.unencrypted,
            unreadable: k.status.unreadable,
            unreadable_files: k.status.unreadable_files.iter().map(|(p, e)| format!("{p}: {e}")).collect(),
        }))
    }
}
