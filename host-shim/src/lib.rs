//! `dpuio_shim`: the host side of dpuio.
//!
//! A host process attaches to the agent (on the DPU) over the `dpuio.v1` control plane
//! and works on its tenant's container through [`Client`]: namespace calls and file
//! handles. The shim never moves payload over gRPC; file data travels only on the data
//! plane, where the agent reads and writes the host's registered memory itself.
//!
//! What it deliberately does not do: decide policy (the agent checks everything the
//! host sends) or retry behind the caller's back (errors come back with the agent's
//! reason). The one exception is an agent restart ([`resume`]): calls the agent did
//! not run are sent again once the client has attached to the new agent.
#![forbid(unsafe_code)]

pub mod blocking;
pub mod cli;
mod client;
mod dataplane;
mod error;
pub mod posix;
mod put;
pub mod resume;

pub use client::{Access, Buffer, Client, ConnectOptions, DEFAULT_AGENT, File, RegionPool, Slot, SlotPool, TlsOptions};
pub use dataplane::{Batch, DataPlaneOptions, DataPlaneStats, Done, RegisteredRegion, Request, TransportInfo};
pub use dpuio_proto::attr::{Attr, DirEntry, EntryKind};
pub use dpuio_proto::v1::RegionAccess;
pub use dpuio_proto::wire::{Opcode, Status as IoStatus};
pub use error::{Error, Result};
pub use host_bytes::{HostBytes, HostBytesMut};
pub use put::{Put, temp_path as put_temp_path};
pub use resume::ResumeOptions;

/// CPU time this process has used so far (all threads: the caller's and the shim's
/// progress thread), for reporting host CPU per GiB moved.
pub fn process_cpu_time() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}
