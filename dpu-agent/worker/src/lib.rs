//! A tenant's DAOS worker: the agent's DAOS calls for one tenant, made from a process of
//! its own that runs as the tenant's DAOS user and group.
//!
//! DAOS authenticates the calling process (uid and gid, vouched for by `daos_agent`) and
//! enforces pool and container ACLs per user and group. An agent that holds every
//! tenant's container under its own uid leaves DAOS unable to tell the tenants apart; a
//! worker per tenant gives each tenant's data a DAOS principal of its own, so a flaw in
//! the agent's own tenant checks cannot reach another tenant's container: DAOS refuses
//! it (`DER_NO_PERM`).
//!
//! - [`client::WorkerBackend`] is the agent's side: a `Backend` whose calls go to the
//!   worker over Unix stream channels, payload through shared staging memory
//!   ([`staging`]), restarting a lost worker and reopening what the tenant had open.
//! - [`serve::run`] is the worker's side (`dpu-agent tenant-worker`), over the DAOS
//!   backend.
//! - [`spawn`] starts the worker as the tenant's identity, with no other privilege.
//! - [`direct`]: pieces the data plane's engine sends to a worker without waiting for
//!   the answer (put/get hosts' reads and writes).
//! - [`link`]: a channel's reads wait only while its worker shows signs of life, so a
//!   worker stopped as a whole is taken as lost rather than waited for.
//! - [`host`]: host regions the agent has mapped, lent to the workers so that their
//!   pieces move bytes between DAOS and the host's memory with no staging copy.
//!
//! Not here: which tenants get a worker (the agent's config), the agent's own tenant
//! checks (done before a call reaches a backend), encryption (the agent wraps the
//! worker's containers as it wraps any other).

pub mod client;
mod control;
pub mod direct;
pub mod host;
mod link;
mod queue;
pub mod serve;
pub mod spawn;
pub mod staging;
mod wire;

pub use client::{WorkerBackend, foreign_principals};
pub use queue::routed;
pub use spawn::Identity;
pub use wire::Setup;

/// A mutex's guard, also after a thread panicked holding it (the data stays usable: each
/// map here is changed in one step).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
