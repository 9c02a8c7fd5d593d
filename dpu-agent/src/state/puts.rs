//! The temporary files of the puts sessions left unfinished (see [`crate::leftovers`]):
//! noted as sessions make, claim, rename and remove them, and removed through the
//! tenant's container (the `Container` trait, so on every backend), with a log line
//! and a count for each.

use std::sync::Arc;
use std::time::Instant;

use dpuio_backend::{Container, NsPath};

use super::{Agent, Session};
use crate::error::{Error, Result};
use crate::leftovers::{Temp, Why};
use crate::runtime::lock;

impl Agent {
    /// `session` is about to create `path`: note it if it is a put's temporary file
    /// (in the journal, before the backend makes it). Fails past `limit` such files in the
    /// session. `Ok(true)`: a fresh note, for [`Agent::put_temp_gone`] if the Create fails.
    pub(crate) fn put_temp_creating(&self, session: &Session, path: &NsPath, limit: u32) -> Result<bool> {
        self.leftovers.create(session.id, &session.tenant, &session.container_name, path, limit).map_err(|limit| {
            Error::Limit {
                what: "unfinished puts in this session (temporary files not yet renamed over their target or removed)",
                limit: limit.into(),
            }
        })
    }

    /// `session` opened `path` for writing: if it is a put's temporary file that an
    /// earlier run of the agent noted and no session holds (a client resuming its put
    /// after a restart), the session takes it over.
    pub(crate) fn put_temp_opened(&self, session: &Session, path: &NsPath) {
        if self.leftovers.opened_for_write(session.id, &session.tenant, &session.container_name, path) {
            tracing::info!(session = format!("{:#018x}", session.id), tenant = %session.tenant, path = %path,
                "a resumed session claimed the temporary file of its unfinished put");
        }
    }

    /// `path` of `session`'s container is no longer a put's temporary file there
    /// (renamed or removed through the agent, or its Create failed).
    pub(crate) fn put_temp_gone(&self, session: &Session, path: &NsPath) {
        self.leftovers.gone(&session.container_name, path);
    }

    /// Remove `temps`, for `why`: each is logged and counted; one that is already gone
    /// counts as removed; a failure is logged, counted, and tried again a lease later
    /// (and, if the agent stops first, at its next start).
    pub(crate) fn remove_put_temps(&self, temps: Vec<Temp>, why: Why) {
        for temp in temps {
            let removed = self.container_to_clean(&temp.container).and_then(|c| match c {
                None => Ok(false), // the container went, and the file with it
                Some(c) => match c.remove(&temp.path, false) {
                    Ok(()) => Ok(true),
                    Err(dpuio_backend::Error::NotFound { .. }) => Ok(false),
                    Err(e) => Err(e.into()),
                },
            });
            let session = format!("{:#018x}", temp.session);
            match removed {
                Ok(existed) => {
                    if existed {
                        tracing::info!(tenant = %temp.tenant, container = %temp.container, path = %temp.path,
                            session, reason = why.name(), "removed the temporary file of an unfinished put: {}",
                            why.describe());
                        self.metrics.put_temp_removed(&temp.tenant, why.name());
                    } else {
                        tracing::debug!(tenant = %temp.tenant, path = %temp.path, session,
                            "the temporary file of an unfinished put was already gone");
                    }
                    self.leftovers.removed(&temp);
                }
                Err(e) => {
                    tracing::warn!(tenant = %temp.tenant, container = %temp.container, path = %temp.path, session,
                        reason = why.name(), error = %e,
                        "cannot remove the temporary file of an unfinished put; trying again in a lease");
                    self.metrics.put_temp_not_removed(&temp.tenant);
                    self.leftovers.retry(temp, Instant::now() + self.lease());
                }
            }
        }
    }

    /// The container `name` to remove a temporary file from: the mounted one, else the
    /// backend's, never created (a tenant's container destroyed since an earlier run
    /// noted a file in it is not made again for this); `None` if it no longer exists.
    fn container_to_clean(&self, name: &str) -> Result<Option<Arc<dyn Container>>> {
        if let Some(c) = lock(&self.containers).get(name) {
            return Ok(Some(c.clone()));
        }
        match self.backend_for(name)?.mount(name, false) {
            Ok(c) => Ok(Some(c)),
            Err(dpuio_backend::Error::NoSuchContainer { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Remove the unclaimed temporary files of puts due at `now` (noted by an earlier
    /// run and not claimed within a lease of this start, or a failed removal's retry).
    pub fn remove_unclaimed_put_temps(&self, now: Instant) {
        let due = self.leftovers.due(now);
        if !due.is_empty() {
            self.remove_put_temps(due, Why::NotResumed);
        }
    }

    /// The agent serves from now on: the unclaimed temporary files an earlier run noted
    /// are removed a lease from now, unless resumed sessions claim them first.
    pub fn serving_from(&self, now: Instant) {
        self.leftovers.wait_until(now + self.lease());
    }

    /// Flush the journal of unfinished puts to disk if it changed.
    pub fn flush_put_journal(&self) {
        self.leftovers.flush();
    }

    /// Temporary files of unfinished puts noted now: held by a session, and unclaimed.
    pub fn put_temps(&self) -> (usize, usize) {
        self.leftovers.counts()
    }
}
