//! The session's control plane (gRPC): which session it is now (a new one after each
//! resume), its clients, and how a call the agent did not run goes again once the client
//! has attached to the restarted agent.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use dpuio_proto::v1 as pb;
use pb::namespace_client::NamespaceClient;
use pb::session_client::SessionClient;
use tonic::transport::Channel;

use crate::error::{Error, Result};
use crate::resume::{self, Liveness};

/// The session's gRPC clients and the state its calls need.
pub(crate) struct Control {
    /// The session on the agent now (a new one after each resume).
    session_id: AtomicU64,
    pub(super) session: SessionClient<Channel>,
    pub(super) namespace: NamespaceClient<Channel>,
    pub(super) live: Arc<Liveness>,
    /// Paths per `Lookup` call: the agent's limit (at least 1).
    pub(super) max_lookup_paths: usize,
}

impl Control {
    pub(super) fn new(channel: Channel, session_id: u64, live: Arc<Liveness>, max_lookup_paths: u32) -> Control {
        Control {
            session_id: AtomicU64::new(session_id),
            session: SessionClient::new(channel.clone()),
            namespace: NamespaceClient::new(channel),
            live,
            max_lookup_paths: (max_lookup_paths as usize).max(1),
        }
    }

    pub(crate) fn session_id(&self) -> u64 {
        self.session_id.load(Ordering::Acquire)
    }

    /// The session resumed as `session_id`.
    pub(super) fn set_session_id(&self, session_id: u64) {
        self.session_id.store(session_id, Ordering::Release);
    }

    /// Run a control-plane call for the current session. If the agent did not run it
    /// (it restarted and does not know the session, or could not be reached), wait for
    /// the next word from the agent (the client attaches again in the meantime where it
    /// must) and send it again, for as long as the resume options allow. `idempotent`
    /// calls are also sent again after a connection lost mid-call.
    pub(crate) async fn call<T, F, Fut>(&self, op: &str, idempotent: bool, f: F) -> Result<T>
    where
        F: Fn(u64) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = Instant::now() + self.live.options.max_wait;
        loop {
            let seen = self.live.epoch();
            match f(self.session_id()).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s)
                    if self.live.options.enabled()
                        && resume::worth_resending(&s, idempotent)
                        && Instant::now() < deadline =>
                {
                    self.live
                        .next_probe(seen)
                        .await
                        .map_err(|why| Error::from_status(op, tonic::Status::unavailable(why)))?;
                }
                Err(s) => return Err(Error::from_status(op, s)),
            }
        }
    }

    /// A clone of the namespace client, for one call.
    pub(crate) fn ns(&self) -> NamespaceClient<Channel> {
        self.namespace.clone()
    }
}
