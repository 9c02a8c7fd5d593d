//! Regions of this process's memory registered with the agent, and their registration.
//!
//! The agent writes a region while a request that reads into it is in flight, and reads
//! it while a write from it is, from another process (or a DMA engine) at times Rust
//! cannot see. So a region is reached as the agent reaches the host's memory: through
//! [`HostBytes`] / [`HostBytesMut`] views (pointer and length, never a Rust reference),
//! copies in and out ([`RegisteredRegion::read_at`], [`RegisteredRegion::write_at`]),
//! and `read(2)`/`write(2)` straight on a view; C and Python get the address.
//!
//! The protocol gives each byte range one owner at a time: the agent fills a range, then
//! posts the completion with release ordering, and the host reads the range only after
//! an acquire load saw that completion. A view does not rely on it: bytes read while the
//! agent writes them are wrong data, never undefined behaviour.

use std::sync::{Arc, Weak};

use dpuio_proto::v1 as pb;
use fabric::Transport as _;
use fabric::any;
use fabric::transport::Region as _;
use host_bytes::{HostBytes, HostBytesMut};

use super::DataPlane;
use crate::error::{Error, Result};
use crate::resume::{RegionRecord, Registry};

/// A region of this process's memory registered with the agent.
pub struct RegisteredRegion {
    pub(super) region: any::Region,
    pub(super) id: u32,
    /// Where the session keeps it for registering again after an agent restart (not
    /// for the rings' own regions, which are made anew).
    pub(super) registry: Option<Weak<Registry>>,
}

impl Drop for RegisteredRegion {
    fn drop(&mut self) {
        // Its memory goes now: a resumed session must not register it again.
        if let Some(registry) = self.registry.as_ref().and_then(Weak::upgrade) {
            registry.remove_region(self.id);
        }
    }
}

impl RegisteredRegion {
    /// Region id in ring entries.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.region.len()
    }

    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    /// The first byte, for callers in C and Python (`dpuio_region_ptr`, a numpy array
    /// over the region): valid for [`RegisteredRegion::len`] bytes while the region
    /// lives. Read a range only after the request that fills it completed, and write one
    /// only while no request on it is in flight.
    pub fn as_ptr(&self) -> *mut u8 {
        self.region.as_ptr()
    }

    /// A view of `len` bytes at `offset`, to copy out of (or `write(2)` from) once the
    /// request that filled them completed.
    ///
    /// # Panics
    /// If the range lies outside the region.
    pub fn bytes(&self, offset: usize, len: usize) -> HostBytes<'_> {
        self.region.bytes(offset, len)
    }

    /// A writable view of `len` bytes at `offset`, to fill (or `read(2)` into) before a
    /// write from them is submitted.
    ///
    /// # Panics
    /// If the range lies outside the region.
    pub fn bytes_mut(&mut self, offset: usize, len: usize) -> HostBytesMut<'_> {
        self.region.bytes_mut(offset, len)
    }

    /// Copies `out.len()` bytes at `offset` into `out`.
    ///
    /// # Panics
    /// If the range lies outside the region.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) {
        self.region.read_at(offset, out)
    }

    /// Copies `data` into the region at `offset`.
    ///
    /// # Panics
    /// If the range lies outside the region.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) {
        self.region.write_at(offset, data)
    }

    /// Copies `data` into the region at `offset` through a shared reference: for a range
    /// its caller holds alone (a [`crate::Slot`]) while other threads use other ranges
    /// of the same region.
    ///
    /// # Panics
    /// If the range lies outside the region.
    pub fn write_shared(&self, offset: usize, data: &[u8]) {
        self.region.bytes_mut(offset, data.len()).copy_from_slice(data)
    }

    /// The memory's words, for the ring's counters (atomics) and entries.
    pub(super) fn shared(&self) -> &fabric::SharedMemory {
        &self.region
    }
}

impl DataPlane {
    /// Allocate a region through the transport and register it with the agent; kept
    /// for registering again under the same id after an agent restart.
    pub(crate) async fn register(&self, length: usize, access: pb::RegionAccess) -> Result<RegisteredRegion> {
        let (region, record) = self.alloc(length, access)?;
        let id = self.register_memory(self.session_id(), &record, 0).await?;
        self.registry.add_region(id, record);
        Ok(RegisteredRegion { region, id, registry: Some(Arc::downgrade(&self.registry)) })
    }

    pub(super) fn alloc(&self, length: usize, access: pb::RegionAccess) -> Result<(any::Region, RegionRecord)> {
        let region = self
            .worker
            .alloc_region(length)
            .map_err(|e| Error::DataPlane { op: format!("allocate a {length}-byte region"), reason: e.to_string() })?;
        let remote_key = region
            .packed_key()
            .map_err(|e| Error::DataPlane { op: "pack the region's key".into(), reason: e.to_string() })?;
        let record = RegionRecord { address: region.addr(), length: length as u64, remote_key, access: access as i32 };
        Ok((region, record))
    }

    /// Register memory in `session_id` under `claim` (0: the agent picks the id).
    pub(super) async fn register_memory(&self, session_id: u64, r: &RegionRecord, claim: u32) -> Result<u32> {
        let answer = self
            .memory
            .clone()
            .register_region(pb::RegisterRegionRequest {
                session_id,
                address: r.address,
                length: r.length,
                remote_key: r.remote_key.clone(),
                access: r.access,
                region_id: claim,
            })
            .await
            .map_err(|s| Error::from_status("register region", s))?;
        Ok(answer.into_inner().region_id)
    }

    pub(crate) async fn deregister(&self, region: RegisteredRegion) -> Result<()> {
        self.memory
            .clone()
            .deregister_region(pb::DeregisterRegionRequest { session_id: self.session_id(), region_id: region.id })
            .await
            .map_err(|s| Error::from_status("deregister region", s))?;
        drop(region); // unmapped only after the agent forgot it
        Ok(())
    }
}
