//! Per-tenant QoS settings changed at run time.

use crate::config::QosConfig;
use crate::error::{Error, Result};
use crate::state::{Agent, lock};

impl Agent {
    /// Change a tenant's QoS from now on.
    pub fn set_qos(&self, tenant: &str, qos: QosConfig) -> Result<()> {
        let mut tenants = lock(&self.tenants);
        let t = tenants
            .get_mut(tenant)
            .ok_or_else(|| Error::invalid("tenant", format!("tenant {tenant:?} is not configured on this agent")))?;
        t.qos = qos;
        Ok(())
    }
}
