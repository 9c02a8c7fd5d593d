//! The temporary files of unfinished whole-file puts, which the agent removes.
//!
//! A put of `DIR/NAME` writes `DIR/.NAME.dpuio-put.SUFFIX` ([`dpuio_proto::put`]), then
//! renames it over `DIR/NAME`. A host process that dies between the two, or a session
//! that ends there, leaves the temporary file, which nothing reads. The agent sees every
//! Create of a name of that shape (over gRPC and as a ring's metadata entry: both run
//! `crate::namespace::open`) and notes it here, under the session that made it, until it
//! is renamed or removed. What is still noted when the session ends for good (Detach,
//! a lapsed lease, the tenant removed) is removed then.
//!
//! An agent restart ends no session for good: a client rides it out by attaching again
//! and re-opening its files (`host-shim/src/resume.rs`), its unfinished put's temporary
//! file among them. So the notes are kept in a journal in the data directory
//! ([`journal`]), and a starting agent takes every temporary file it lists as
//! *unclaimed*: a session of the same tenant that opens it for writing (the resumed
//! client) claims it, and what is still unclaimed one lease after the start is removed,
//! as the session would have been reaped had the agent not restarted. Start-up touches
//! exactly the files the journal lists: it never walks a container.
//!
//! This room is the register (which session made which temporary file, and what is
//! due) without I/O, [`Leftovers`] (the register and its journal under one lock, so the
//! journal records changes in the order they happened), and the journal's file
//! adapter. The removals themselves (backend, log, metrics) are the agent's
//! (`crate::state`).
//!
//! Not here: temporary files no journal lists (made by an agent older than the
//! journal, or by a client writing such names behind dpuio's back); those stay until
//! someone removes them (`dpuio rm`), as before.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use dpuio_backend::NsPath;

use crate::runtime::lock;

pub mod journal;

use journal::Journal;

/// A put's temporary file, and the session that made it (or last claimed it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Temp {
    pub session: u64,
    pub tenant: String,
    pub container: String,
    pub path: NsPath,
}

/// A change the journal records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A session made (or claimed) the temporary file.
    Made(Temp),
    /// It was renamed, removed, or found gone.
    Gone { container: String, path: NsPath },
}

/// Why a temporary file was removed: the `reason` label of the metrics, and the log's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// Its session was detached (by its client, or because its tenant was removed).
    SessionClosed,
    /// Its session's lease lapsed (its host died or lost the agent for longer than the lease).
    SessionExpired,
    /// An earlier run of the agent noted it, and no session claimed it within a lease
    /// of this start.
    NotResumed,
}

impl Why {
    /// The `reason` label.
    pub fn name(self) -> &'static str {
        match self {
            Why::SessionClosed => "session_closed",
            Why::SessionExpired => "session_expired",
            Why::NotResumed => "not_resumed",
        }
    }

    /// What happened, for the log.
    pub fn describe(self) -> &'static str {
        match self {
            Why::SessionClosed => "its session was detached before the put was renamed into place",
            Why::SessionExpired => "its session's lease lapsed before the put was renamed into place",
            Why::NotResumed => {
                "an earlier run of the agent noted it and no resumed session claimed it within a lease of this start"
            }
        }
    }
}

/// Whether `path` names a put's temporary file.
pub fn is_put_temp(path: &NsPath) -> bool {
    path.file_name().and_then(dpuio_proto::put::target_of).is_some()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Session,
    /// Noted by an earlier run (or kept after a failed removal): removed at `until`
    /// unless a session claims it first.
    Unclaimed {
        until: Instant,
    },
}

type Key = (String, NsPath);

#[derive(Clone, Debug)]
struct Entry {
    session: u64,
    tenant: String,
    owner: Owner,
}

/// Which session made which temporary file: the rules, without I/O.
#[derive(Debug, Default)]
pub struct Register {
    temps: HashMap<Key, Entry>,
    /// Temporary files per session (owned ones only), for its limit.
    per_session: HashMap<u64, u32>,
}

/// What noting a Create did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Noted {
    /// What the journal must record before the file is made.
    pub record: Record,
    /// The register did not know the file: if the Create fails, forget it again.
    pub fresh: bool,
}

impl Register {
    /// The register a start makes of the journal's `records`: every temporary file
    /// still listed, unclaimed until `until`.
    pub fn recovered(records: impl IntoIterator<Item = Record>, until: Instant) -> Register {
        let mut r = Register::default();
        for record in records {
            match record {
                Record::Made(t) => {
                    r.temps.insert(
                        (t.container, t.path),
                        Entry { session: t.session, tenant: t.tenant, owner: Owner::Unclaimed { until } },
                    );
                }
                Record::Gone { container, path } => {
                    r.temps.remove(&(container, path));
                }
            }
        }
        r
    }

    fn own(&mut self, key: Key, session: u64, tenant: &str) -> Option<Entry> {
        *self.per_session.entry(session).or_default() += 1;
        let previous = self.temps.insert(key, Entry { session, tenant: tenant.to_owned(), owner: Owner::Session });
        if let Some(p) = &previous {
            self.disown(p);
        }
        previous
    }

    fn disown(&mut self, entry: &Entry) {
        if entry.owner == Owner::Session
            && let Some(n) = self.per_session.get_mut(&entry.session)
        {
            *n -= 1;
            if *n == 0 {
                self.per_session.remove(&entry.session);
            }
        }
    }

    /// Session `session` of `tenant` creates `path` in `container`: note it if it is a
    /// put's temporary file. `Err(limit)` when the session already has `limit` of them.
    /// `None`: nothing to note (not such a file, or the session's already).
    pub fn create(
        &mut self,
        session: u64,
        tenant: &str,
        container: &str,
        path: &NsPath,
        limit: u32,
    ) -> Result<Option<Noted>, u32> {
        if !is_put_temp(path) {
            return Ok(None);
        }
        let key = (container.to_owned(), path.clone());
        if let Some(e) = self.temps.get(&key)
            && e.owner == Owner::Session
            && e.session == session
        {
            return Ok(None);
        }
        if self.per_session.get(&session).copied().unwrap_or(0) >= limit {
            return Err(limit);
        }
        let fresh = self.own(key, session, tenant).is_none();
        let temp = Temp { session, tenant: tenant.to_owned(), container: container.to_owned(), path: path.clone() };
        Ok(Some(Noted { record: Record::Made(temp), fresh }))
    }

    /// Session `session` of `tenant` opened `path` of `container` for writing: if it
    /// is an unclaimed temporary file of the same tenant (a client resuming its put
    /// after an agent restart), the session claims it. Returns what the journal records.
    pub fn opened_for_write(&mut self, session: u64, tenant: &str, container: &str, path: &NsPath) -> Option<Record> {
        if self.temps.is_empty() || !is_put_temp(path) {
            return None; // every open for writing asks: the common answer costs no allocation
        }
        let key = (container.to_owned(), path.clone());
        let e = self.temps.get(&key)?;
        if !matches!(e.owner, Owner::Unclaimed { .. }) || e.tenant != tenant {
            return None;
        }
        self.own(key, session, tenant);
        let temp = Temp { session, tenant: tenant.to_owned(), container: container.to_owned(), path: path.clone() };
        Some(Record::Made(temp))
    }

    /// `path` of `container` is no longer there as a temporary file (renamed, removed,
    /// or its Create failed): forget it. Returns what the journal records, if it was noted.
    pub fn gone(&mut self, container: &str, path: &NsPath) -> Option<Record> {
        if self.temps.is_empty() {
            return None; // every rename and removal asks
        }
        let key = (container.to_owned(), path.clone());
        let e = self.temps.remove(&key)?;
        self.disown(&e);
        Some(Record::Gone { container: key.0, path: key.1 })
    }

    /// Session `session` ended for good: its temporary files, to remove (forgotten here).
    pub fn session_ended(&mut self, session: u64) -> Vec<Temp> {
        self.take(|e| e.owner == Owner::Session && e.session == session)
    }

    /// The unclaimed temporary files due at `now`, to remove (forgotten here).
    pub fn due(&mut self, now: Instant) -> Vec<Temp> {
        self.take(|e| matches!(e.owner, Owner::Unclaimed { until } if until <= now))
    }

    fn take(&mut self, which: impl Fn(&Entry) -> bool) -> Vec<Temp> {
        let keys: Vec<Key> = self.temps.iter().filter(|(_, e)| which(e)).map(|(k, _)| k.clone()).collect();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(e) = self.temps.remove(&key) {
                self.disown(&e);
                out.push(Temp { session: e.session, tenant: e.tenant, container: key.0, path: key.1 });
            }
        }
        out.sort_by(|a, b| (&a.container, &a.path.as_str()).cmp(&(&b.container, &b.path.as_str())));
        out
    }

    /// Every unclaimed temporary file now waits until `until`: a start counts the lease
    /// from when the agent serves, not from when it read the journal (opening a DAOS
    /// backend and its containers takes a while, and clients cannot claim meanwhile).
    pub fn wait_until(&mut self, until: Instant) {
        for e in self.temps.values_mut() {
            if let Owner::Unclaimed { until: u } = &mut e.owner {
                *u = until;
            }
        }
    }

    /// Note `temp` again, unclaimed until `until` (its removal failed: try again then).
    pub fn retry(&mut self, temp: Temp, until: Instant) {
        let entry = Entry { session: temp.session, tenant: temp.tenant, owner: Owner::Unclaimed { until } };
        if let Some(previous) = self.temps.insert((temp.container, temp.path), entry) {
            self.disown(&previous);
        }
    }

    /// Everything noted, as the records a compacted journal holds.
    pub fn records(&self) -> Vec<Record> {
        let mut all: Vec<Record> = self
            .temps
            .iter()
            .map(|((container, path), e)| {
                Record::Made(Temp {
                    session: e.session,
                    tenant: e.tenant.clone(),
                    container: container.clone(),
                    path: path.clone(),
                })
            })
            .collect();
        all.sort_by_key(|r| match r {
            Record::Made(t) => (t.container.clone(), t.path.as_str().to_owned()),
            Record::Gone { container, path } => (container.clone(), path.as_str().to_owned()),
        });
        all
    }

    /// Temporary files noted now: owned by a session, and unclaimed.
    pub fn counts(&self) -> (usize, usize) {
        let owned = self.temps.values().filter(|e| e.owner == Owner::Session).count();
        (owned, self.temps.len() - owned)
    }
}

/// The register and the journal that keeps it across restarts, changed under one lock.
/// A journal that cannot be written is logged, never an error of the put: the agent
/// still removes what it noted when a session ends; only a restart forgets it.
pub struct Leftovers {
    register: Mutex<Register>,
    journal: Option<Journal>,
}

impl Leftovers {
    /// Notes kept in memory only (agents built by hand, as unit tests do).
    pub fn in_memory() -> Leftovers {
        Leftovers { register: Mutex::new(Register::default()), journal: None }
    }

    /// The register a start recovered, kept in `journal`.
    pub fn with_journal(register: Register, journal: Journal) -> Leftovers {
        Leftovers { register: Mutex::new(register), journal: Some(journal) }
    }

    fn journal(&self, register: &Register, record: &Record) {
        let Some(j) = &self.journal else { return };
        if let Err(e) = j.append(record, || register.records()) {
            tracing::error!(journal = %j.path().display(), error = %e,
                "cannot record a put's temporary file; it is still removed when its session ends, but not after a restart");
        }
    }

    /// See [`Register::create`]; the note is in the journal (written, flushed to disk by
    /// [`Leftovers::flush`]) before this returns. `Ok(true)`: a fresh note, to
    /// [`Leftovers::gone`] if the Create fails.
    pub fn create(&self, session: u64, tenant: &str, container: &str, path: &NsPath, limit: u32) -> Result<bool, u32> {
        let mut r = lock(&self.register);
        let Some(noted) = r.create(session, tenant, container, path, limit)? else { return Ok(false) };
        self.journal(&r, &noted.record);
        Ok(noted.fresh)
    }

    /// Flush the journal to disk if it changed (every [`journal::FLUSH_EVERY`], and at
    /// shutdown).
    pub fn flush(&self) {
        if let Some(j) = &self.journal
            && let Err(e) = j.flush()
        {
            tracing::error!(journal = %j.path().display(), error = %e, "cannot flush the journal of unfinished puts to disk");
        }
    }

    /// See [`Register::opened_for_write`]; returns whether the session claimed it.
    pub fn opened_for_write(&self, session: u64, tenant: &str, container: &str, path: &NsPath) -> bool {
        let mut r = lock(&self.register);
        let Some(record) = r.opened_for_write(session, tenant, container, path) else { return false };
        self.journal(&r, &record);
        true
    }

    /// See [`Register::gone`].
    pub fn gone(&self, container: &str, path: &NsPath) {
        let mut r = lock(&self.register);
        if let Some(record) = r.gone(container, path) {
            self.journal(&r, &record);
        }
    }

    /// See [`Register::session_ended`]; the journal keeps them until [`Leftovers::removed`].
    pub fn session_ended(&self, session: u64) -> Vec<Temp> {
        lock(&self.register).session_ended(session)
    }

    /// See [`Register::due`]; the journal keeps them until [`Leftovers::removed`].
    pub fn due(&self, now: Instant) -> Vec<Temp> {
        lock(&self.register).due(now)
    }

    /// `temp` (taken with [`Leftovers::session_ended`] or [`Leftovers::due`]) is gone.
    pub fn removed(&self, temp: &Temp) {
        let r = lock(&self.register);
        self.journal(&r, &Record::Gone { container: temp.container.clone(), path: temp.path.clone() });
    }

    /// See [`Register::wait_until`].
    pub fn wait_until(&self, until: Instant) {
        lock(&self.register).wait_until(until);
    }

    /// See [`Register::retry`].
    pub fn retry(&self, temp: Temp, until: Instant) {
        lock(&self.register).retry(temp, until);
    }

    /// See [`Register::counts`].
    pub fn counts(&self) -> (usize, usize) {
        lock(&self.register).counts()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn p(s: &str) -> NsPath {
        NsPath::parse(s).unwrap()
    }

    const TEMP: &str = "/d/.model.pt.dpuio-put.00ff";

    #[test]
    fn only_put_temporary_names_are_noted_and_each_session_has_a_limit() {
        let mut r = Register::default();
        assert_eq!(r.create(1, "t", "c", &p("/d/model.pt"), 8), Ok(None));
        let noted = r.create(1, "t", "c", &p(TEMP), 8).unwrap().unwrap();
        assert!(noted.fresh);
        assert_eq!(r.create(1, "t", "c", &p(TEMP), 8), Ok(None), "already the session's");
        assert_eq!(r.create(1, "t", "c", &p("/d/.x.dpuio-put.1"), 1), Err(1));
        assert_eq!(r.create(2, "t", "c", &p("/d/.x.dpuio-put.1"), 1).map(|n| n.is_some()), Ok(true));
        assert_eq!(r.counts(), (2, 0));
    }

    #[test]
    fn a_renamed_or_removed_temp_is_forgotten_and_the_rest_goes_with_its_session() {
        let mut r = Register::default();
        for name in ["a", "b", "c"] {
            r.create(7, "t", "c", &p(&format!("/.{name}.dpuio-put.1")), 8).unwrap();
        }
        r.create(8, "t", "c", &p("/.z.dpuio-put.1"), 8).unwrap();
        assert_eq!(
            r.gone("c", &p("/.b.dpuio-put.1")),
            Some(Record::Gone { container: "c".into(), path: p("/.b.dpuio-put.1") })
        );
        assert_eq!(r.gone("c", &p("/.b.dpuio-put.1")), None);
        let ended: Vec<String> = r.session_ended(7).iter().map(|t| t.path.to_string()).collect();
        assert_eq!(ended, ["/.a.dpuio-put.1", "/.c.dpuio-put.1"]);
        assert!(r.session_ended(7).is_empty());
        assert_eq!(r.counts(), (1, 0), "the other session's stays");
        // The limit counts what the session holds now.
        r.create(7, "t", "c", &p("/.n.dpuio-put.1"), 1).unwrap();
    }

    #[test]
    fn after_a_restart_a_resumed_session_claims_its_temp_and_the_rest_is_due_a_lease_later() {
        let start = Instant::now();
        let until = start + Duration::from_secs(30);
        let t = |session, path: &str| Temp { session, tenant: "t".into(), container: "c".into(), path: p(path) };
        let records = vec![
            Record::Made(t(1, "/.a.dpuio-put.1")),
            Record::Made(t(1, "/.b.dpuio-put.1")),
            Record::Made(t(2, "/.c.dpuio-put.1")),
            Record::Gone { container: "c".into(), path: p("/.b.dpuio-put.1") },
        ];
        let mut r = Register::recovered(records, until);
        assert_eq!(r.counts(), (0, 2));
        assert_eq!(r.opened_for_write(9, "other", "c", &p("/.a.dpuio-put.1")), None, "another tenant claims nothing");
        assert_eq!(r.opened_for_write(9, "t", "c", &p("/.a.dpuio-put.1")), Some(Record::Made(t(9, "/.a.dpuio-put.1"))));
        assert_eq!(r.opened_for_write(10, "t", "c", &p("/.a.dpuio-put.1")), None, "claimed once");
        assert!(r.due(start).is_empty(), "nothing before the lease is over");
        r.wait_until(until + Duration::from_secs(5));
        assert!(r.due(until).is_empty(), "the lease counted from when the agent serves");
        let until = until + Duration::from_secs(5);
        assert_eq!(r.due(until), vec![t(2, "/.c.dpuio-put.1")]);
        assert_eq!(r.session_ended(9), vec![t(9, "/.a.dpuio-put.1")]);
        r.retry(t(2, "/.c.dpuio-put.1"), until + Duration::from_secs(30));
        assert_eq!(r.records(), vec![Record::Made(t(2, "/.c.dpuio-put.1"))], "a failed removal stays recorded");
    }
}
