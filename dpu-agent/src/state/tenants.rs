//! The agent's tenants and their containers: the table, changed at run time with
//! `dpuctl` (and kept in the state file), each tenant's limits and QoS, and the
//! containers mounted (and wrapped in inline encryption) once and shared.

use std::sync::Arc;

use dpuio_auth::qos::MAX_WEIGHT;
use dpuio_backend::{Backend, Container};

use super::Agent;
use crate::config::{BackendConfig, QosConfig, TenantConfig};
use crate::error::{Error, Result};
use crate::metrics::TimedContainer;
use crate::runtime::lock;

impl Agent {
    /// Make a change that persists: `change` applies it and records it in the state;
    /// see [`crate::persist::store::Store::change`]. Without a state file the record
    /// goes nowhere.
    pub fn change_persisted<T>(
        &self,
        change: impl FnOnce(&mut crate::persist::PersistedState) -> Result<T>,
    ) -> Result<T> {
        match self.persisted() {
            Some(store) => store.change(change),
            None => change(&mut crate::persist::PersistedState::default()),
        }
    }

    /// Where each tenant's settings came from, for `dpuctl status`.
    pub fn setting_origins(&self) -> Vec<crate::persist::TenantOrigins> {
        let state = self.persisted().map(|s| s.state()).unwrap_or_default();
        crate::persist::origins(&self.config.tenants, &state, &self.tenant_list())
    }

    /// The session limits of `tenant` now: its own where set, else `[limits]`'s.
    /// Returns (open handles per session, regions per session).
    pub fn session_limits(&self, tenant: &str) -> (u32, u32) {
        let l = self.limits();
        let tenants = lock(&self.tenants);
        let own = tenants.get(tenant);
        (
            own.and_then(|t| t.max_handles_per_session).unwrap_or(l.max_handles_per_session),
            own.and_then(|t| t.max_regions_per_session).unwrap_or(l.max_regions_per_session),
        )
    }

    /// Change a tenant's session limits from now on (`None` keeps [limits]'s);
    /// sessions already attached are held to them at their next open or registration.
    pub fn set_tenant_limits(
        &self,
        tenant: &str,
        max_sessions: Option<u32>,
        handles: Option<u32>,
        regions: Option<u32>,
    ) -> Result<()> {
        let mut tenants = lock(&self.tenants);
        let t = tenants
            .get_mut(tenant)
            .ok_or_else(|| Error::invalid("tenant", format!("tenant {tenant:?} is not configured on this agent")))?;
        t.max_sessions = max_sessions;
        t.max_handles_per_session = handles;
        t.max_regions_per_session = regions;
        Ok(())
    }

    /// Change a tenant's QoS (rates, bursts, weight, in-flight limit) now: in the
    /// agent's tenant table and in the data-plane engine's buckets and queue. Requests
    /// already admitted are not recalled; queued ones wait under the new limits.
    pub fn set_qos(&self, tenant: &str, qos: QosConfig) -> Result<()> {
        if !(1..=MAX_WEIGHT).contains(&qos.weight) {
            return Err(Error::invalid("weight", format!("{}: a weight is from 1 to {MAX_WEIGHT}", qos.weight)));
        }
        if qos.max_inflight == 0 {
            return Err(Error::invalid("max_inflight", "0: a tenant needs at least one request in flight"));
        }
        {
            let mut tenants = lock(&self.tenants);
            let Some(config) = tenants.get_mut(tenant) else {
                return Err(Error::invalid(
                    "tenant",
                    format!("tenant {tenant:?} is not configured on this agent; add it first (dpuctl tenant add)"),
                ));
            };
            config.qos = qos;
        }
        // After the table: an engine that meets the tenant for the first time meanwhile
        // reads the new settings; one that already knows it is told here.
        if let Some(dp) = self.dataplane() {
            dp.set_qos(tenant, &qos);
        }
        Ok(())
    }

    /// Whether `tenant` is configured now.
    pub fn has_tenant(&self, tenant: &str) -> bool {
        lock(&self.tenants).contains_key(tenant)
    }

    /// The tenant's configuration now.
    pub fn tenant(&self, tenant: &str) -> Option<TenantConfig> {
        lock(&self.tenants).get(tenant).cloned()
    }

    /// Every tenant, by name.
    pub fn tenant_list(&self) -> Vec<TenantConfig> {
        let mut all: Vec<TenantConfig> = lock(&self.tenants).values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Add a tenant at run time and create its container. Its name and container must
    /// be new: tenants never share a container.
    pub fn add_tenant(&self, tenant: TenantConfig) -> Result<()> {
        {
            let mut tenants = lock(&self.tenants);
            if tenants.contains_key(&tenant.name) {
                return Err(Error::invalid("tenant.name", format!("tenant {:?} exists already", tenant.name)));
            }
            if let Some(owner) = tenants.values().find(|t| t.container == tenant.container) {
                return Err(Error::invalid(
                    "tenant.container",
                    format!(
                        "container {:?} belongs to tenant {:?}; tenants never share a container",
                        tenant.container, owner.name
                    ),
                ));
            }
            tenants.insert(tenant.name.clone(), tenant.clone());
        }
        if let Err(e) = self.container(&tenant.container) {
            lock(&self.tenants).remove(&tenant.name);
            return Err(e);
        }
        self.metrics.tenant(&tenant.name);
        Ok(())
    }

    /// Remove a tenant at run time: from now on its certificate and tokens are
    /// refused, and its sessions are detached at once (their written files synced).
    /// Its container's data stays on disk. Returns how many sessions were detached.
    pub fn remove_tenant(&self, tenant: &str) -> Result<usize> {
        if lock(&self.tenants).remove(tenant).is_none() {
            return Err(Error::invalid("name", format!("tenant {tenant:?} is not configured on this agent")));
        }
        let ids: Vec<u64> = lock(&self.sessions).values().filter(|s| s.tenant == tenant).map(|s| s.id).collect();
        let mut first_error = None;
        for id in &ids {
            if let Err(e) = self.detach(*id) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(ids.len()), Err)
    }

    /// Encrypt the files of `container` from now on (before the first mount of it).
    pub fn set_encryption(&self, container: &str, settings: dpuio_encryption::EncryptionSettings) {
        lock(&self.encryption).insert(container.to_owned(), settings);
    }

    /// Create every tenant's container that does not exist yet, so a fresh agent is
    /// ready to use; called once at start.
    pub fn prepare_containers(&self) -> Result<()> {
        let mut tenants: Vec<TenantConfig> = lock(&self.tenants).values().cloned().collect();
        // In name order: the same order on every start, for the log and for tests.
        tenants.sort_by(|a, b| a.name.cmp(&b.name));
        for tenant in tenants {
            self.container(&tenant.container)?;
        }
        Ok(())
    }

    pub(crate) fn container(&self, name: &str) -> Result<Arc<dyn Container>> {
        if let Some(c) = lock(&self.containers).get(name) {
            return Ok(c.clone());
        }
        // Tenants never share a container: its tenant's object class, if it names one.
        let object_class = self.tenant_of(name).map(|t| t.object_class).unwrap_or_default();
        let backend = self.backend_for(name)?.mount_with_class(name, true, &object_class)?;
        self.check_acl(name);
        let mut mounted: Arc<dyn Container> = Arc::new(TimedContainer::new(backend, self.metrics.backend_times()));
        // Wrapped once and cached: every open of a file must share the wrapper's
        // per-file state and locks.
        if let Some(settings) = lock(&self.encryption).get(name).cloned() {
            mounted = Arc::new(
                dpuio_encryption::EncryptedContainer::new(mounted, settings)
                    .map_err(|e| Error::Internal(format!("container {name}: {e}")))?,
            );
        }
        Ok(lock(&self.containers).entry(name.to_owned()).or_insert(mounted).clone())
    }

    fn tenant_of(&self, container: &str) -> Option<TenantConfig> {
        lock(&self.tenants).values().find(|t| t.container == container).cloned()
    }

    /// The backend that serves `container`: its tenant's worker when the tenant has a
    /// DAOS identity of its own (started on first use), else the agent's own.
    pub(crate) fn backend_for(&self, container: &str) -> Result<Arc<dyn Backend>> {
        let Some(tenant) = self.tenant_of(container).filter(|t| !t.daos_user.is_empty()) else {
            return Ok(self.backend.clone());
        };
        if let Some(w) = lock(&self.workers).get(&tenant.name) {
            return Ok(w.clone());
        }
        let BackendConfig::Daos(daos) = &self.config.backend else {
            return Err(Error::invalid(
                "tenant.daos_user",
                format!("tenant {:?} names a DAOS user, but this agent's backend is not DAOS", tenant.name),
            ));
        };
        let identity = dpuio_worker::Identity::resolve(&tenant.daos_user, &tenant.daos_group)
            .map_err(|reason| Error::invalid("tenant.daos_user", format!("tenant {:?}: {reason}", tenant.name)))?;
        let exe = std::env::current_exe()
            .map_err(|e| Error::Internal(format!("cannot find the agent's own executable for a worker: {e}")))?;
        let setup = daos.worker_setup(&tenant.name);
        let worker = Arc::new(dpuio_worker::WorkerBackend::new(&tenant.name, identity, setup, exe));
        Ok(lock(&self.workers).entry(tenant.name).or_insert(worker).clone())
    }

    /// Say, at mount, whether the container of a tenant with a DAOS identity admits
    /// principals other than that identity (it then is not the tenant's alone).
    fn check_acl(&self, container: &str) {
        let Some(tenant) = self.tenant_of(container) else { return };
        let Some(worker) = lock(&self.workers).get(&tenant.name).cloned() else { return };
        match worker.acl(container) {
            Ok((owner, entries)) => {
                let foreign = dpuio_worker::foreign_principals(worker.identity(), &owner, &entries);
                if foreign.is_empty() {
                    tracing::info!(tenant = tenant.name, container, owner, acl = ?entries,
                        "the tenant's DAOS container admits its DAOS user only");
                } else {
                    tracing::warn!(tenant = tenant.name, container, owner, admits = ?foreign,
                        "the tenant's DAOS container admits other principals than its DAOS user {}: remove them \
                         (`daos container delete-acl POOL {container} --principal=...`)", worker.identity().user);
                }
            }
            Err(e) => tracing::warn!(tenant = tenant.name, container, error = %e, "cannot read the container's ACL"),
        }
    }

    pub(super) fn default_tenant(&self) -> Result<String> {
        let tenants = lock(&self.tenants);
        if tenants.len() == 1 {
            return Ok(tenants.keys().next().cloned().unwrap_or_default());
        }
        if tenants.contains_key(crate::config::DEFAULT_TENANT) {
            return Ok(crate::config::DEFAULT_TENANT.to_owned());
        }
        Err(Error::invalid(
            "tenant",
            "this agent serves several tenants and none is named \"default\": name the tenant to attach as",
        ))
    }
}
