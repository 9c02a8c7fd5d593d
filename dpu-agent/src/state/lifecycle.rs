//! A session's life: attach (within the agent's and the tenant's limits), lease
//! renewals, the host's connection, mounting its container, and the end (detach, a
//! lapsed lease, a closed connection, shutdown) that closes and syncs its handles and,
//! unless the agent is only stopping, removes its unfinished puts' temporary files.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use dpuio_backend::Container;

use super::{Agent, DISCONNECTED_GRACE, Session, SessionRights};
use crate::caller::Caller;
use crate::dataplane::sessions;
use crate::error::{Error, Result};
use crate::leftovers::Why;
use crate::runtime::lock;

/// How a session ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// Detached: by its client, or because its tenant was removed.
    Closed,
    /// Its lease lapsed.
    Expired,
    /// The agent stops; its host may attach again to the next one.
    Stopping,
}

impl Agent {
    /// Every attached session.
    pub fn session_list(&self) -> Vec<Arc<Session>> {
        let mut all: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        all.sort_by(|a, b| (&a.tenant, a.attached_at).cmp(&(&b.tenant, b.attached_at)));
        all
    }

    /// The session `id` if it belongs to a tenant `caller` may act for. Another
    /// tenant's session is reported exactly like an unknown id.
    pub fn session_for(&self, id: u64, caller: &Caller) -> Result<Arc<Session>> {
        let session = self.session(id)?;
        if !caller.may_use(&session.tenant) {
            return Err(Error::NoSession { id });
        }
        Ok(session)
    }
    /// Start a session for `tenant` with `rights`.
    pub fn attach(&self, tenant: &str, client_name: &str, rights: SessionRights) -> Result<Arc<Session>> {
        if self.is_draining() {
            return Err(Error::Unavailable("shutting down"));
        }
        let (container_name, tenant_max, in_worker) = match lock(&self.tenants).get(tenant) {
            Some(t) => (t.container.clone(), t.max_sessions, !t.daos_user.is_empty()),
            None => {
                return Err(Error::PermissionDenied(format!("tenant {tenant:?} is not configured on this agent")));
            }
        };
        if client_name.len() > 256 {
            return Err(Error::invalid("client_name", "longer than 256 bytes"));
        }
        let mut sessions = lock(&self.sessions);
        let limit = self.limits().max_sessions;
        if sessions.len() >= limit as usize {
            return Err(Error::Limit { what: "sessions on this agent", limit: limit.into() });
        }
        if let Some(max) = tenant_max
            && sessions.values().filter(|s| s.tenant == tenant).count() >= max as usize
        {
            return Err(Error::Limit { what: "sessions of this tenant", limit: max.into() });
        }
        let mut io = sessions::Session::new(tenant, rights.expires_at, self.metrics.tenant(tenant));
        io.in_worker = in_worker;
        let io = Arc::new(io);
        let session = Arc::new(Session {
            id: io.id,
            tenant: tenant.to_owned(),
            container_name,
            client_name: client_name.to_owned(),
            attached_at: SystemTime::now(),
            rights,
            io,
            container: Mutex::new(None),
            lease_deadline: Mutex::new(Instant::now() + self.lease()),
            connection: Mutex::new(None),
        });
        sessions.insert(session.id, session.clone());
        Ok(session)
    }

    /// The live session with this id; renews nothing.
    pub fn session(&self, id: u64) -> Result<Arc<Session>> {
        lock(&self.sessions).get(&id).cloned().ok_or(Error::NoSession { id })
    }

    /// Renew a session's lease.
    pub fn keep_alive(&self, id: u64) -> Result<()> {
        let session = self.session(id)?;
        *lock(&session.lease_deadline) = Instant::now() + self.lease();
        Ok(())
    }

    /// Note the connection (peer address) a session's host uses: when it closes, the
    /// session ends soon after ([`Agent::connection_closed`]).
    pub fn set_connection(&self, session: &Session, peer: Option<SocketAddr>) {
        if peer.is_some() {
            *lock(&session.connection) = peer;
        }
    }

    /// The connection from `peer` closed: its sessions' leases now end at
    /// [`DISCONNECTED_GRACE`] from `now` (the reaper detaches them then, unless a
    /// renewal over another connection came first). Returns their ids.
    pub fn connection_closed(&self, peer: SocketAddr, now: Instant) -> Vec<u64> {
        let sessions: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        let mut orphaned = Vec::new();
        for s in sessions {
            let mut connection = lock(&s.connection);
            if *connection == Some(peer) {
                *connection = None;
                let mut deadline = lock(&s.lease_deadline);
                *deadline = (*deadline).min(now + DISCONNECTED_GRACE);
                orphaned.push(s.id);
            }
        }
        orphaned
    }

    /// Mount the session's container; `requested` empty means the tenant's own.
    pub fn mount(&self, session: &Session, requested: &str) -> Result<Arc<dyn Container>> {
        if !requested.is_empty() && requested != session.container_name {
            return Err(Error::PermissionDenied(format!(
                "tenant {:?} has no access to container {requested:?}; its container is {:?}",
                session.tenant, session.container_name
            )));
        }
        let container = self.container(&session.container_name)?;
        *lock(&session.container) = Some(container.clone());
        Ok(container)
    }

    /// End a session: close (and sync) its written handles, and remove the temporary
    /// files of the puts it left unfinished. Returns whether it existed.
    pub fn detach(&self, id: u64) -> Result<bool> {
        self.end_session(id, Ending::Closed)
    }

    /// End a session for `how` it ends: for good (its unfinished puts' temporary files
    /// go), or because the agent stops (its host may attach again later and resume them).
    fn end_session(&self, id: u64, how: Ending) -> Result<bool> {
        let Some(session) = lock(&self.sessions).remove(&id) else {
            return Ok(false);
        };
        let closed = session.io.close_all(how == Ending::Stopping);
        let why = match how {
            Ending::Closed => Why::SessionClosed,
            Ending::Expired => Why::SessionExpired,
            Ending::Stopping => {
                closed?;
                return Ok(true);
            }
        };
        // After its handles are closed: a temporary file is removed only once nothing
        // of the session writes it.
        self.remove_put_temps(self.leftovers.session_ended(id), why);
        closed?;
        Ok(true)
    }

    /// Detach sessions whose lease lapsed, and remove the unclaimed temporary files of
    /// puts that are due; returns the sessions' ids.
    pub fn reap_expired(&self, now: Instant) -> Vec<u64> {
        let expired: Vec<u64> =
            lock(&self.sessions).values().filter(|s| *lock(&s.lease_deadline) < now).map(|s| s.id).collect();
        for id in &expired {
            if let Err(e) = self.end_session(*id, Ending::Expired) {
                tracing::warn!(session = format!("{id:#018x}"), error = %e, "closing an expired session");
            }
        }
        self.remove_unclaimed_put_temps(now);
        expired
    }

    /// Close every session and make every container durable (shutdown).
    pub fn close_everything(&self) -> Result<()> {
        let ids: Vec<u64> = lock(&self.sessions).keys().copied().collect();
        let mut first_error = None;
        for id in ids {
            if let Err(e) = self.end_session(id, Ending::Stopping) {
                first_error.get_or_insert(e);
            }
        }
        let containers: Vec<Arc<dyn Container>> = lock(&self.containers).values().cloned().collect();
        for c in containers {
            if let Err(e) = c.sync() {
                first_error.get_or_insert(e.into());
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Number of sessions attached now.
    pub fn session_count(&self) -> usize {
        lock(&self.sessions).len()
    }
}
