//! `dpu-agent`: the dpuio agent that runs on the DPU.
//!
//! It serves the `dpuio.v1` control plane (sessions and the namespace of each tenant's
//! container) over gRPC and runs the storage backend. The modules split as
//! configuration ([`config`]), state and policy ([`state`]), the gRPC adapters
//! ([`service`]), errors and their one mapping to statuses ([`error`]), and process
//! life ([`server`]).
//!
//! What it deliberately does not do here: touch payload on the control plane (file
//! data moves only on the data plane), or hold any `unsafe` code.
#![forbid(unsafe_code)]

pub mod admin;
pub mod caller;
pub mod config;
pub mod dataplane;
pub mod deploy;
pub mod encryption;
pub mod engine;
pub mod error;
pub mod keys;
pub mod namespace;
pub mod qos;
mod runtime;
pub mod serve_error;
pub mod server;
pub mod service;
pub mod state;
pub mod tls;
