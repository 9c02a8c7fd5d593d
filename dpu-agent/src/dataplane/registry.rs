//! The data plane's workers and what hosts register on them: a host's endpoint
//! (Attach), its regions and its rings (`Memory.RegisterRegion`, `RegisterRing`), each
//! checked before the engine may touch it; and how the workers describe themselves for
//! logs, status and metrics.
//!
//! Not here: the tables of a session that hold what was registered
//! ([`super::sessions`]), and the engine that serves it ([`super::driver`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dpuio_proto::wire;
use fabric::Transport;
use fabric::any;
use fabric::transport::{Endpoint as _, RemoteKey as _};

use super::DataPlane;
use super::host_memory::{self, HostRegion, HostRing, Peer};
use crate::metrics::TransportGauges;
use crate::validate::RegionAccess;

/// Why a data-plane call failed.
#[derive(Debug, thiserror::Error)]
pub enum DataPlaneError {
    #[error("data plane transport: {0}")]
    Fabric(#[from] fabric::Error),
    #[error("{0}")]
    Invalid(String),
    /// The host asked for a provider this agent does not run.
    #[error("{0}")]
    NotOffered(String),
}

/// `TransportInfo.library` of this agent: `"libfabric MAJOR.MINOR"` once libfabric is
/// loaded, else empty.
pub fn library() -> String {
    fabric::ofi::loaded_library().map_or_else(String::new, |(_, (major, minor))| format!("libfabric {major}.{minor}"))
}

/// Why a host on `host_library` cannot use libfabric provider `fabric_provider` with an
/// agent on `agent_library`, if it cannot. libfabric shm's shared-memory protocol is
/// private to a release (a 1.17 host and a 1.22 agent hang each other, the agent
/// spinning): it needs the same version on both sides. Protocols between machines (tcp,
/// verbs with rxm) are versioned on the wire and are not refused here. A host that does
/// not say (an older shim) is let through.
pub fn library_mismatch(fabric_provider: &str, host_library: &str, agent_library: &str) -> Option<String> {
    (fabric_provider == fabric::ofi::SHM_PROVIDER && !host_library.is_empty() && host_library != agent_library).then(
        || {
            format!(
                "libfabric shm needs the same libfabric on both sides (its shared-memory protocol changes between \
                 releases): this agent runs {agent_library}, the host {host_library}. Use ucx-shm or ofi-tcp, or load \
                 the agent's libfabric in the host process (LD_LIBRARY_PATH)"
            )
        },
    )
}

/// One worker of the data plane (a provider and its transports), with its address.
pub(super) struct Worker {
    pub worker: Arc<any::Worker>,
    pub address: Vec<u8>,
    /// Sessions attached through this worker.
    pub peers: Arc<AtomicU64>,
}

impl Worker {
    pub fn new(address: Vec<u8>, worker: any::Worker) -> Worker {
        Worker { worker: Arc::new(worker), address, peers: Arc::new(AtomicU64::new(0)) }
    }
}

/// `provider`, or `provider (libfabric provider)`: how errors and logs name a worker.
fn offer_name(w: &any::Worker) -> String {
    match w.fabric_provider() {
        "" => w.provider().to_owned(),
        f => format!("{} ({f})", w.provider()),
    }
}

impl DataPlane {
    /// Each worker's figures now, for the metrics.
    pub fn transport_gauges(&self) -> Vec<TransportGauges> {
        self.workers
            .iter()
            .map(|w| TransportGauges {
                provider: offer_name(&w.worker),
                peers: w.peers.load(Ordering::Relaxed),
                malformed_doorbells: w.worker.malformed_doorbells(),
            })
            .collect()
    }

    /// What the workers are (for logs and status).
    pub fn describe(&self) -> String {
        self.workers
            .iter()
            .map(|w| format!("{} [{}]", w.worker.provider(), w.worker.describe()))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// One line for the start-up log: per worker, what it offers, its modules and its
    /// address length, e.g. `ucx (modules self tcp sysv posix ib rdmacm cma; address 179
    /// bytes), ofi (shm) (address 37 bytes)`; [`DataPlane::describe`] has the
    /// transports' own (multi-line) account.
    pub fn summary(&self) -> String {
        self.workers
            .iter()
            .map(|w| {
                let modules = w.worker.modules();
                let modules =
                    if modules.is_empty() { String::new() } else { format!("modules {}; ", modules.join(" ")) };
                format!("{} ({modules}address {} bytes)", offer_name(&w.worker), w.address.len())
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// What this agent offers, as `provider` or `provider (libfabric provider)`.
    pub fn offers(&self) -> String {
        self.workers.iter().map(|w| offer_name(&w.worker)).collect::<Vec<_>>().join(", ")
    }

    /// Make an endpoint to a host worker (Attach) on the worker of `provider` (and,
    /// for libfabric, `fabric_provider`). Returns the peer and this agent's address on
    /// that worker, with what it is, for `AttachResponse.agent_transport`.
    pub fn connect(
        &self,
        provider: &str,
        fabric_provider: &str,
        host_library: &str,
        host_address: &[u8],
    ) -> Result<(Arc<Peer>, Vec<u8>, String), DataPlaneError> {
        let Some(lane) = self
            .workers
            .iter()
            .position(|w| w.worker.provider() == provider && w.worker.fabric_provider() == fabric_provider)
        else {
            let asked = if fabric_provider.is_empty() {
                format!("{provider:?}")
            } else {
                format!("{provider:?} ({fabric_provider})")
            };
            return Err(DataPlaneError::NotOffered(format!(
                "{asked} is not offered by this agent; it offers {} (see [data_plane] providers and transports)",
                self.offers()
            )));
        };
        if let Some(refusal) = library_mismatch(fabric_provider, host_library, &library()) {
            return Err(DataPlaneError::NotOffered(refusal));
        }
        if host_address.is_empty() || host_address.len() > 64 * 1024 {
            return Err(DataPlaneError::Invalid(format!(
                "worker_address of {} bytes: expected a {provider} worker address (1 byte to 64 KiB)",
                host_address.len()
            )));
        }
        let w = &self.workers[lane];
        let endpoint = w.worker.connect(host_address)?;
        w.peers.fetch_add(1, Ordering::Relaxed);
        let peer = Arc::new(Peer { endpoint, lane, lane_peers: w.peers.clone(), failed: AtomicBool::new(false) });
        // A doorbell-less worker now has someone to poll for.
        self.wake_engine();
        Ok((peer, w.address.clone(), w.worker.describe()))
    }

    /// Unpack and, where the transport allows, map a host region (Memory.RegisterRegion).
    pub fn register_region(
        &self,
        peer: &Peer,
        id: u32,
        addr: u64,
        length: u64,
        packed_key: &[u8],
        access: RegionAccess,
    ) -> Result<HostRegion, DataPlaneError> {
        let key = peer.endpoint.unpack_key(packed_key, addr, length)?;
        let mapped = match usize::try_from(length) {
            Ok(len) => key.map(addr, len)?,
            Err(_) => None,
        };
        // Tenant workers read into and write from a mapped region themselves.
        let lent = mapped.as_ref().and_then(|m| {
            let backing = m.backing()?;
            let map_file = backing.map_file();
            let mapping = dpuio_worker::host::Mapping {
                start: backing.start,
                end: backing.end,
                object_offset: backing.object_offset,
                map_file: &map_file,
            };
            dpuio_worker::host::lend(m.as_ptr(), m.len(), mapping)
        });
        Ok(HostRegion { id, addr, length, access, _lent: lent, key, mapped })
    }

    /// Check a ring's header in host memory and start serving it (Memory.RegisterRing).
    pub fn register_ring(
        &self,
        peer: &Peer,
        id: u32,
        region: Arc<HostRegion>,
        offset: u64,
        entries: u32,
    ) -> Result<HostRing, DataPlaneError> {
        let header = wire::RingHeader { entries }.encode();
        let bytes = wire::ring_bytes(entries) as u64;
        if !entries.is_power_of_two() || !(2..=wire::MAX_RING_ENTRIES).contains(&entries) {
            return Err(DataPlaneError::Invalid(format!(
                "entries = {entries}: a ring has a power of two from 2 to {} entries",
                wire::MAX_RING_ENTRIES
            )));
        }
        if !offset.is_multiple_of(64) || offset.checked_add(bytes).is_none_or(|end| end > region.length) {
            return Err(DataPlaneError::Invalid(format!(
                "a ring of {entries} entries needs {bytes} bytes at a 64-byte aligned offset inside region {} \
                 ({} bytes); offset {offset} does not fit",
                region.id, region.length
            )));
        }
        if !(region.access.agent_reads && region.access.agent_writes) {
            return Err(DataPlaneError::Invalid(format!(
                "region {} must be registered REGION_ACCESS_READ_WRITE to hold a ring",
                region.id
            )));
        }
        // The header the host wrote must say the same thing as the request.
        let mut found = [0u8; wire::HEADER_BYTES];
        host_memory::read_blocking(&self.workers[peer.lane].worker, peer, &region, offset, &mut found)?;
        let decoded = wire::RingHeader::decode(&found)
            .map_err(|e| DataPlaneError::Invalid(format!("ring header at offset {offset}: {e}")))?;
        if found != header || decoded.entries != entries {
            return Err(DataPlaneError::Invalid(format!(
                "ring header at offset {offset} says {} entries, the request {entries}",
                decoded.entries
            )));
        }
        // This agent can wake the host's waiters on this ring.
        host_memory::set_agent_wakes(&region, offset);
        Ok(HostRing {
            id,
            region,
            offset,
            entries,
            sq_head: AtomicU64::new(0),
            cq_tail: AtomicU64::new(0),
            broken: AtomicBool::new(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::library_mismatch;

    #[test]
    fn libfabric_shm_needs_one_version_on_both_sides_and_the_rest_does_not() {
        let refusal = library_mismatch("shm", "libfabric 1.17", "libfabric 1.22").expect("refused");
        assert!(refusal.contains("libfabric 1.17") && refusal.contains("libfabric 1.22"), "{refusal}");
        assert!(refusal.contains("ucx-shm or ofi-tcp"), "{refusal}");
        assert_eq!(library_mismatch("shm", "libfabric 1.22", "libfabric 1.22"), None);
        assert_eq!(library_mismatch("tcp;ofi_rxm", "libfabric 1.17", "libfabric 1.22"), None);
        assert_eq!(library_mismatch("shm", "", "libfabric 1.22"), None, "an older shim that does not say");
    }
}
