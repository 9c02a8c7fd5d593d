//! What others read of the agent: the data plane's view ([`AgentView`]: the backend,
//! limits, tenants and the data-plane half of each session), and the metrics' (its
//! gauges when scraped, and the headline figures of `dpuctl status`).

use std::collections::HashMap;
use std::sync::Arc;

use dpuio_backend::Backend;

use super::Agent;
use crate::config::{Limits, TenantConfig};
use crate::dataplane::sessions::{self, AgentView};
use crate::metrics::{Gauges, Metrics, TenantGauges, TransportGauges};
use crate::runtime::lock;

impl Agent {
    /// Per tenant, the headline figures `dpuctl status` shows: its metrics' totals and
    /// its sessions now.
    pub fn tenant_figures(&self) -> Vec<dpuio_proto::v1::TenantFigures> {
        let sessions = self.session_list();
        self.metrics
            .headline()
            .into_iter()
            .map(|h| dpuio_proto::v1::TenantFigures {
                sessions: sessions.iter().filter(|s| s.tenant == h.tenant).count() as u32,
                tenant: h.tenant,
                read_bytes: h.read_bytes,
                written_bytes: h.written_bytes,
                operations: h.operations,
                errors: h.errors,
            })
            .collect()
    }
}

/// The engine's view of the agent: the data-plane half of each session.
impl AgentView for Agent {
    fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }
    /// Over DAOS, pieces on the objects of tenants whose calls run in workers go to
    /// their workers in batches (see `dpuio_worker::routed`); such a tenant may also be
    /// added after the data plane started.
    fn io_queue(&self) -> dpuio_backend::Result<Box<dyn dpuio_backend::IoQueue>> {
        let main = self.backend.io_queue()?;
        Ok(if self.backend.kind() == "daos" { dpuio_worker::routed(main) } else { main })
    }
    fn limits(&self) -> &Limits {
        Agent::limits(self)
    }
    fn tenant(&self, tenant: &str) -> Option<TenantConfig> {
        Agent::tenant(self, tenant)
    }
    fn has_tenant(&self, tenant: &str) -> bool {
        Agent::has_tenant(self, tenant)
    }
    fn sessions_io(&self) -> Vec<Arc<sessions::Session>> {
        lock(&self.sessions).values().map(|s| s.io.clone()).collect()
    }
    fn session_io(&self, id: u64) -> Option<Arc<sessions::Session>> {
        lock(&self.sessions).get(&id).map(|s| s.io.clone())
    }
    fn namespace(&self) -> Option<&dyn crate::dataplane::meta::Namespace> {
        Some(self) // the policy of `crate::namespace`, as over gRPC
    }
    fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// What the metrics read when scraped.
impl Gauges for Agent {
    fn tenants(&self) -> Vec<TenantGauges> {
        let mut by_name: HashMap<String, TenantGauges> = HashMap::new();
        for t in lock(&self.tenants).values() {
            let key_version = t
                .encryption
                .as_ref()
                .map(|_| lock(&self.encryption).get(&t.container).map_or(0, |settings| settings.key_version));
            by_name.insert(t.name.clone(), TenantGauges { tenant: t.name.clone(), key_version, ..Default::default() });
        }
        for s in self.session_list() {
            let Some(g) = by_name.get_mut(&s.tenant) else { continue }; // removed, still detaching
            g.sessions += 1;
            g.open_handles += s.io.handle_count() as u64;
            g.regions += s.io.region_count() as u64;
        }
        if let Some(dp) = self.dataplane() {
            for (tenant, n) in dp.requests_in_flight() {
                if let Some(g) = by_name.get_mut(&*tenant) {
                    g.requests_in_flight = n.into();
                }
            }
        }
        for (tenant, worker) in lock(&self.workers).iter() {
            if let Some(g) = by_name.get_mut(tenant) {
                g.worker_restarts = Some(worker.restarts());
                g.worker_pieces = Some(worker.pieces());
            }
        }
        let mut all: Vec<TenantGauges> = by_name.into_values().collect();
        all.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        all
    }

    fn transports(&self) -> Vec<TransportGauges> {
        self.dataplane().map(|dp| dp.transport_gauges()).unwrap_or_default()
    }

    /// The agent's own DAOS retry counters and its tenant workers' together.
    fn daos_retries(&self) -> Option<dpuio_daos::RetryStats> {
        if self.backend.kind() != "daos" {
            return None;
        }
        let mut stats = dpuio_daos::retry_stats();
        for worker in lock(&self.workers).values() {
            stats += worker.retry_stats();
        }
        Some(stats)
    }
}
