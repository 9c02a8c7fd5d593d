//! Why the agent could not start or stop cleanly: [`ServeError`].
//!
//! Its own room, below every room that starts something (the TLS set-up, the tenants'
//! keys, the admin socket, the server), so none of them imports the server for it.

use std::net::SocketAddr;

/// Why the agent could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot open the local backend at {path}: {source}")]
    Backend {
        path: String,
        #[source]
        source: dpuio_backend::Error,
    },
    #[error("cannot open the DAOS backend: {0}")]
    Daos(#[from] dpuio_daos::OpenError),
    #[error("tenant {tenant}: encryption: {source}")]
    Encryption {
        tenant: String,
        #[source]
        source: dpuio_crypto::Error,
    },
    /// The state file (what `dpuctl` changed) could not be read or is not usable.
    #[error("{0}")]
    State(Box<crate::persist::store::StateError>),
    /// The journal of unfinished puts cannot be read, or is not what this agent writes.
    #[error("{0}")]
    PutJournal(Box<crate::leftovers::journal::JournalError>),
    /// The journal of unfinished puts cannot be rewritten at start.
    #[error(
        "cannot write the journal of unfinished puts {path}: {source} (the data directory must be writable by the agent)"
    )]
    PutJournalWrite {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A key version rotated in with `dpuctl` and recorded in the state file cannot be read.
    #[error("{0}")]
    PersistedKey(Box<PersistedKeyError>),
    #[error("cannot prepare the tenants' containers: {0}")]
    Containers(#[source] crate::error::Error),
    #[error("cannot listen on {addr}: {source} (is another agent running there? pick another --listen address)")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("cannot install a signal handler: {0}")]
    Signal(#[source] std::io::Error),
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error(
        "cannot start the data plane: {0} (set [data_plane] transports, or enabled = false for a control-plane-only agent)"
    )]
    DataPlane(#[source] crate::dataplane::DataPlaneError),
    /// `[data_plane] interface` names no network interface of the agent's network namespace.
    #[error("[data_plane] interface: {0} (name one of them, or remove the key to let the providers choose)")]
    Interface(#[source] fabric::Error),
    #[error("shutting down: {0}")]
    Shutdown(#[source] crate::error::Error),
    /// The agent stopped while DAOS still left calls unanswered (every engine gone):
    /// what DAOS acknowledged is kept, a change answered UNAVAILABLE may or may not apply.
    #[error(
        "stopped with {} DAOS call(s) unanswered: {calls}. DAOS did not answer them (every engine gone?): check \
         `dmg system query`; what DAOS acknowledged is kept, a change answered UNAVAILABLE may or may not have been \
         applied",
        .count
    )]
    DaosUnanswered { count: usize, calls: String },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("admin socket {path}: {source}")]
    AdminSocket {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl From<crate::persist::store::StateError> for ServeError {
    fn from(e: crate::persist::store::StateError) -> Self {
        ServeError::State(Box::new(e)) // boxed: every start-up result carries a ServeError
    }
}

/// A key version rotated in with `dpuctl`, recorded in the state file, whose file cannot
/// be used at start.
#[derive(Debug, thiserror::Error)]
#[error(
    "tenant {tenant}: key version {version} was rotated in with dpuctl and is recorded in the state file {state_file}, \
     but its file cannot be used: {source}; files wrapped under it need it: restore {file} (mode 0600), \
     or name the key in the tenant's [tenants.encryption] keys"
)]
pub struct PersistedKeyError {
    pub tenant: String,
    pub version: u32,
    pub file: String,
    pub state_file: String,
    #[source]
    pub source: dpuio_crypto::Error,
}
