//! `dpu-agent`: the dpuio agent that runs on the DPU.
//!
//! It serves the `dpuio.v1` control plane (sessions and the namespace of each tenant's
//! container) over gRPC and runs the storage backend. Its modules are rooms that import
//! downwards only (`tests/tests/rooms.rs` fails on a loop or an upward arrow), from the bottom up:
//!
//! - leaves: configuration ([`config`]), errors and their one mapping to statuses
//!   ([`error`]), the checks of every ring entry ([`validate`]), who is calling
//!   ([`caller`]), connections that report their closing ([`connection`]), and how the code waits (`runtime`: the lock helper, blocking calls
//!   off the async runtime); what the agent counts, and its `GET /metrics` endpoint
//!   ([`metrics`]: the rooms above count into it, and the agent hands it its figures
//!   through [`metrics::Gauges`]);
//! - the data-plane scheduler ([`qos`]), then the data plane ([`dataplane`]): its
//!   decisions without I/O ([`dataplane::protocol`], its `policy`,
//!   [`dataplane::readiness`]), host memory, the I/O threads, and the engine thread
//!   that drives them, which owns what it serves each session from (handles, peer,
//!   regions, rings: [`dataplane::sessions`]) and sees the agent only through
//!   [`dataplane::sessions::AgentView`];
//! - the changes made with `dpuctl` that persist, and how they merge with the config
//!   at start ([`persist`]: the rules without I/O, and the state file's adapter);
//! - the temporary files of unfinished whole-file puts, which sessions made and the
//!   agent removes when they end, and their journal ([`leftovers`]);
//! - state and policy: tenants, sessions and their rights ([`state`]); what starting
//!   and stopping can fail with ([`serve_error`]);
//! - on state: namespace policy ([`namespace`]), the tenants' keys ([`keys`]), TLS and
//!   the check in front of every service ([`tls`]);
//! - the gRPC adapters, which only translate protobuf ([`service`], [`admin`]);
//! - process life ([`server`]).
//!
//! [`deploy`] (`dpuctl deploy`) stands apart, on the configuration only.
//!
//! Inline encryption is not a room here: it wraps a backend, so it lives beside the
//! backends in the `dpuio_encryption` crate, and [`state`] wraps a tenant's container
//! in it when it mounts the container.
//!
//! What it deliberately does not do here: touch payload on the control plane (file
//! data moves only on the data plane), or hold any `unsafe` code.
#![forbid(unsafe_code)]

pub mod admin;
pub mod caller;
pub mod config;
pub mod connection;
pub mod dataplane;
pub mod deploy;
pub mod error;
pub mod keys;
pub mod leftovers;
pub mod metrics;
pub mod namespace;
pub mod persist;
pub mod qos;
mod runtime;
pub mod serve_error;
pub mod server;
pub mod service;
pub mod state;
pub mod tls;
pub mod validate;
