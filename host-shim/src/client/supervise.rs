//! Supervision: the lease kept alive, and an agent restart ridden out (see
//! [`crate::resume`]): the session attached again, its regions registered and its
//! files re-opened under their ids, fresh rings, and the calls and waits moved to it.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use dpuio_proto::v1 as pb;
use pb::session_client::SessionClient;
use tonic::transport::Channel;

use super::Inner;
use crate::dataplane;
use crate::error::{Error, Result};
use crate::resume::{self, Liveness, Probe};

/// Keep the session alive, and ride out an agent restart: renew the lease at a third
/// of it; when a renewal (or a probe asked for by a quiet wait, [`Liveness::suspect`])
/// finds the agent unreachable, ask every 100 ms; when the agent says it does not know
/// the session, attach again ([`Inner::resume`]). Gives up after
/// [`ResumeOptions::max_wait`] without an agent, or at once when the agent ended the
/// session for good (or resuming is off), so that waiting calls say why.
pub(super) async fn supervise(inner: Weak<Inner>, live: Arc<Liveness>, lease_ms: u64) {
    let mut unreachable_since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(resume::probe_period(lease_ms, unreachable_since.is_some())) => {}
            _ = live.suspected() => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        if let Some(ring) = &inner.ring {
            ring.dp.retire_idle(); // an idle session's grown rings
        }
        let session_id = inner.control.session_id();
        let answer = tokio::time::timeout(
            Duration::from_secs(2),
            inner.control.session.clone().keep_alive(pb::KeepAliveRequest { session_id }),
        )
        .await
        .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("no answer to a keep-alive within 2 s")))
        .map(|_| ());
        let resuming = live.options.enabled();
        let outcome = match resume::classify(&answer) {
            Probe::Alive => {
                if unreachable_since.take().is_some() {
                    tracing::info!(session = format!("{session_id:#018x}"), "the agent answers again");
                }
                Ok(())
            }
            Probe::Unreachable => Err(answer.err().map(|s| s.message().to_owned()).unwrap_or_default()),
            Probe::Forgotten if resuming => match inner.resume().await {
                Ok(()) => {
                    unreachable_since = None;
                    Ok(())
                }
                Err(e)
                    if e.code().is_some_and(|c| {
                        matches!(
                            c,
                            tonic::Code::PermissionDenied | tonic::Code::Unauthenticated | tonic::Code::InvalidArgument
                        )
                    }) =>
                {
                    inner.give_up(format!("the agent restarted and refused to attach this client again: {e}"));
                    return;
                }
                Err(e) => Err(format!("attaching again: {e}")),
            },
            Probe::Forgotten | Probe::Ended => {
                // The session is gone (detached, lease lapsed, tenant removed): the agent
                // no longer serves its rings, so ring calls waiting now say why instead
                // of waiting out their timeout; gRPC calls say so themselves.
                if let (Some(data), Err(status)) = (inner.data(), answer) {
                    data.session_ended(status);
                }
                live.probed();
                return;
            }
        };
        if let Err(why) = outcome {
            let since = *unreachable_since.get_or_insert_with(|| {
                tracing::warn!(agent = %inner.options.agent, error = %why, "the agent does not answer; waiting for it");
                Instant::now()
            });
            if resuming && since.elapsed() >= live.options.max_wait {
                inner.give_up(format!(
                    "the agent at {} has not come back within {:?} (DPUIO_RESUME_S): {why}",
                    inner.options.agent, live.options.max_wait
                ));
                return;
            }
        }
        live.probed();
    }
}

/// Renew the lease of `session_id` at a third of it, for ever (the caller aborts the
/// task): while a new client mounts and sets up its data plane, before [`supervise`]
/// runs. A failed renewal is left to the calls under way, which say why.
pub(super) async fn keep_lease(mut session: SessionClient<Channel>, session_id: u64, lease_ms: u64) {
    loop {
        tokio::time::sleep(Duration::from_millis(lease_ms.max(300) / 3)).await;
        if let Err(e) = session.keep_alive(pb::KeepAliveRequest { session_id }).await {
            tracing::debug!(error = %e, "keeping the lease while connecting");
        }
    }
}

impl Inner {
    /// Attach again to an agent that no longer knows the session: a new session with
    /// the same options and transport, the container mounted, every region registered
    /// and every open file re-opened under its id, fresh rings. Then calls and waiting
    /// rings move to it.
    pub(super) async fn resume(&self) -> Result<()> {
        let old = self.control.session_id();
        let attached = self
            .control
            .session
            .clone()
            .attach(pb::AttachRequest {
                client_name: self.options.client_name.clone(),
                tenant: self.options.tenant.clone(),
                transport: self.offer.clone(),
                capability_token: self.options.capability_token.clone(),
            })
            .await
            .map_err(|s| Error::from_status("attach again", s))?
            .into_inner();
        let session_id = attached.session_id;
        let restored = self.restore(session_id, &attached).await;
        let reattached = match restored {
            Ok(r) => r,
            Err(e) => {
                // Leave no half-restored session behind.
                let _ = self.control.session.clone().detach(pb::DetachRequest { session_id }).await;
                return Err(e);
            }
        };
        self.control.set_session_id(session_id);
        match (self.data(), reattached) {
            (Some(dp), Some(r)) => dp.install(r),
            _ => self.control.live.resumed(),
        }
        tracing::info!(
            old = format!("{old:#018x}"),
            new = format!("{session_id:#018x}"),
            files = self.registry.files().len(),
            "attached again after the agent restarted"
        );
        Ok(())
    }

    async fn restore(&self, session_id: u64, attached: &pb::AttachResponse) -> Result<Option<dataplane::Reattached>> {
        let mut ns = self.control.ns();
        ns.mount(pb::MountRequest { session_id, container: self.container.clone() })
            .await
            .map_err(|s| Error::from_status("mount again", s))?;
        let reattached = match self.data() {
            Some(dp) => {
                let agent = attached.agent_transport.as_ref().ok_or_else(|| Error::Protocol {
                    op: "attach again".into(),
                    reason: "the agent accepted the transport but sent no worker address".into(),
                })?;
                Some(dp.reattach(session_id, &agent.worker_address).await?)
            }
            None => None,
        };
        for (handle, file) in self.registry.files() {
            let access = if file.write { pb::Access::ReadWrite } else { pb::Access::ReadOnly };
            let request =
                pb::OpenRequest { session_id, path: file.path.clone(), access: access as i32, truncate: false, handle };
            if let Err(s) = ns.open(request).await {
                // Gone or no longer allowed: requests on it fail as on a closed handle.
                tracing::warn!(path = %file.path, error = %s.message(), "cannot open a file again after the agent restarted");
            }
        }
        Ok(reattached)
    }

    /// Stop waiting for the agent: calls and waiting rings fail with `why`.
    pub(super) fn give_up(&self, why: String) {
        tracing::error!(agent = %self.options.agent, "{why}");
        if let Some(data) = self.data() {
            data.session_ended(tonic::Status::unavailable(why.clone()));
        }
        self.control.live.give_up(why);
    }
}
