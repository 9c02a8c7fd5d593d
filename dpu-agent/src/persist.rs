//! Settings that persist: what `dpuctl` changes (tenants added and removed, QoS, session
//! limits, rotated-in key versions) is kept in a state file in the data directory and
//! applied at the next start, merged with the config file.
//!
//! This room is the model and the rules, without I/O: [`PersistedState`] (the file's
//! content), the `record_*` functions that note a change made at run time, [`merge`]
//! (what a start makes of the config file and the state file), [`origins`] (where each
//! setting in force came from, for `dpuctl status`) and the text format ([`parse`],
//! [`render`]). Reading and writing the file (atomically) is [`store`], a thin adapter.
//!
//! The precedence rule, which docs/config.md states for operators: a change made with
//! `dpuctl` to a setting the config file names records the config's value it replaced.
//! At each start the change applies while the config still says that value; once the
//! operator edits that setting in the config file, the config wins, and the change is
//! dropped from the state file with a warning in the log. So the config file stays the
//! source of truth for what it names, and a change made with `dpuctl` survives restarts
//! until someone changes the config under it. Two exceptions, both on the side of
//! caution: a tenant of the config removed with `dpuctl tenant rm` stays removed until
//! `dpuctl tenant add` brings it back or the config no longer names it (a revoked tenant
//! must not come back with a restart), and a rotated-in key version is kept as long as
//! the config does not name that version (files are wrapped under it).
//!
//! What it deliberately does not do: hold key material. A rotated-in key is recorded by
//! its version and the path of its file, as the config names keys; the file stays where
//! the operator put it, with its mode 0600.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{QosConfig, TenantConfig, check_identifier};

pub mod store;

/// The state file's name in the data directory.
pub const STATE_FILE_NAME: &str = "state.toml";
/// The format version this agent reads and writes.
pub const STATE_VERSION: u32 = 1;

/// The state file of the agent whose data directory is `data_dir`.
pub fn state_file(data_dir: &Path) -> PathBuf {
    data_dir.join(STATE_FILE_NAME)
}

/// What the state file holds: per tenant, the changes made with `dpuctl` that are
/// still in force.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PersistedState {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tenants: BTreeMap<String, TenantRecord>,
}

/// One tenant's changes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantRecord {
    /// Set: added with `dpuctl tenant add`; the config file does not name it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added: Option<Added>,
    /// Set: a tenant of the config file removed with `dpuctl tenant rm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<Removed>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<Override<QosRecord>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Override<TenantLimits>>,
    /// Key versions rotated in with `dpuctl key rotate`, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<KeyRecord>,
}

impl TenantRecord {
    fn is_empty(&self) -> bool {
        *self == TenantRecord::default()
    }
}

/// `dpuctl tenant add` of a tenant the config does not name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Added {
    pub container: String,
    pub changed_unix_s: u64,
    /// `--daos-user` / `--daos-group` (empty: none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub daos_user: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub daos_group: String,
}

/// `dpuctl tenant rm` of a tenant the config names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Removed {
    pub changed_unix_s: u64,
}

/// A setting changed with `dpuctl`: the value in force, and what the config file said
/// when the change was made (absent for a tenant added with `dpuctl`, which the config
/// does not name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Override<T> {
    pub value: T,
    // No `default`: it would ask `T: Default`, and a missing `Option` is `None` anyway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<T>,
    pub changed_unix_s: u64,
}

/// `[tenants.qos]`, with the config's key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosRecord {
    pub bytes_per_s: u64,
    pub ops_per_s: u64,
    pub burst_bytes: u64,
    pub burst_ops: u64,
    pub weight: u32,
    pub max_inflight: u32,
}

impl From<&QosConfig> for QosRecord {
    fn from(q: &QosConfig) -> Self {
        QosRecord {
            bytes_per_s: q.limits.bytes_per_s,
            ops_per_s: q.limits.ops_per_s,
            burst_bytes: q.limits.bytes_burst,
            burst_ops: q.limits.ops_burst,
            weight: q.weight,
            max_inflight: q.max_inflight,
        }
    }
}

impl From<QosRecord> for QosConfig {
    fn from(r: QosRecord) -> Self {
        let mut q = QosConfig::default();
        q.limits.bytes_per_s = r.bytes_per_s;
        q.limits.ops_per_s = r.ops_per_s;
        q.limits.bytes_burst = r.burst_bytes;
        q.limits.ops_burst = r.burst_ops;
        q.weight = r.weight;
        q.max_inflight = r.max_inflight;
        q
    }
}

/// A tenant's session limits (absent: the agent-wide `[limits]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_handles_per_session: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_regions_per_session: Option<u32>,
}

impl TenantLimits {
    pub fn of(t: &TenantConfig) -> TenantLimits {
        TenantLimits {
            max_sessions: t.max_sessions,
            max_handles_per_session: t.max_handles_per_session,
            max_regions_per_session: t.max_regions_per_session,
        }
    }

    fn apply_to(self, t: &mut TenantConfig) {
        t.max_sessions = self.max_sessions;
        t.max_handles_per_session = self.max_handles_per_session;
        t.max_regions_per_session = self.max_regions_per_session;
    }
}

/// A key version rotated in with `dpuctl key rotate`: its file (never its bytes), and
/// the current version the config file gave when it was rotated in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRecord {
    pub version: u32,
    pub file: PathBuf,
    pub config_key_version: u32,
    pub changed_unix_s: u64,
}

/// The version that wraps new files' data keys by the config alone: its `key_version`,
/// else the highest version it names.
pub fn config_key_version(t: &TenantConfig) -> Option<u32> {
    let enc = t.encryption.as_ref()?;
    enc.key_version.or_else(|| enc.keys.iter().map(|k| k.0).max())
}

fn config_tenant<'c>(config: &'c [TenantConfig], name: &str) -> Option<&'c TenantConfig> {
    config.iter().find(|t| t.name == name)
}

impl PersistedState {
    /// `tenant` was added with `dpuctl tenant add` at `now`. For a tenant the config
    /// names (removed earlier with `dpuctl`), this ends the removal and keeps the QoS
    /// and limits it was added with where they differ from the config's.
    pub fn record_add(&mut self, config: &[TenantConfig], tenant: &TenantConfig, now: u64) {
        let record = self.tenants.entry(tenant.name.clone()).or_default();
        match config_tenant(config, &tenant.name) {
            Some(c) => {
                record.removed = None;
                record.qos = overriding(QosRecord::from(&c.qos), QosRecord::from(&tenant.qos), now);
                record.limits = overriding(TenantLimits::of(c), TenantLimits::of(tenant), now);
            }
            None => {
                *record = TenantRecord {
                    added: Some(Added {
                        container: tenant.container.clone(),
                        changed_unix_s: now,
                        daos_user: tenant.daos_user.clone(),
                        daos_group: tenant.daos_group.clone(),
                    }),
                    qos: Some(Override { value: QosRecord::from(&tenant.qos), config: None, changed_unix_s: now }),
                    limits: Some(Override { value: TenantLimits::of(tenant), config: None, changed_unix_s: now }),
                    ..TenantRecord::default()
                };
            }
        }
        self.tidy(&tenant.name);
    }

    /// `name` was removed with `dpuctl tenant rm` at `now`. A tenant the config names
    /// stays removed across restarts (its rotated-in keys are kept: its files are
    /// wrapped under them); one added with `dpuctl` is forgotten.
    pub fn record_remove(&mut self, config: &[TenantConfig], name: &str, now: u64) {
        if config_tenant(config, name).is_some() {
            let record = self.tenants.entry(name.to_owned()).or_default();
            let keys = std::mem::take(&mut record.keys);
            *record = TenantRecord { removed: Some(Removed { changed_unix_s: now }), keys, ..TenantRecord::default() };
        } else {
            self.tenants.remove(name);
        }
    }

    /// The tenant's QoS was set to `qos` at `now`. Setting a config tenant back to
    /// the config's QoS ends the override.
    pub fn record_qos(&mut self, config: &[TenantConfig], name: &str, qos: &QosConfig, now: u64) {
        let value = QosRecord::from(qos);
        let record = self.tenants.entry(name.to_owned()).or_default();
        record.qos = match config_tenant(config, name) {
            Some(c) => overriding(QosRecord::from(&c.qos), value, now),
            None => Some(Override { value, config: None, changed_unix_s: now }),
        };
        self.tidy(name);
    }

    /// The tenant's session limits were set to `limits` at `now`.
    pub fn record_limits(&mut self, config: &[TenantConfig], name: &str, limits: TenantLimits, now: u64) {
        let record = self.tenants.entry(name.to_owned()).or_default();
        record.limits = match config_tenant(config, name) {
            Some(c) => overriding(TenantLimits::of(c), limits, now),
            None => Some(Override { value: limits, config: None, changed_unix_s: now }),
        };
        self.tidy(name);
    }

    /// Key `version`, read from `file`, was rotated in for `name` at `now` and is
    /// current. Only a tenant the config names has encryption, so only it has keys.
    pub fn record_key(&mut self, config: &[TenantConfig], name: &str, version: u32, file: &Path, now: u64) {
        let Some(config_version) = config_tenant(config, name).and_then(config_key_version) else { return };
        let record = self.tenants.entry(name.to_owned()).or_default();
        record.keys.retain(|k| k.version != version);
        record.keys.push(KeyRecord {
            version,
            file: file.to_owned(),
            config_key_version: config_version,
            changed_unix_s: now,
        });
    }

    /// Drop the tenant's record if nothing is left in it.
    fn tidy(&mut self, name: &str) {
        if self.tenants.get(name).is_some_and(TenantRecord::is_empty) {
            self.tenants.remove(name);
        }
    }
}

/// An override of `config` by `value`, or none when they are the same.
fn overriding<T: PartialEq>(config: T, value: T, now: u64) -> Option<Override<T>> {
    (value != config).then(|| Override { value, config: Some(config), changed_unix_s: now })
}

/// What a start makes of the config file's tenants and the state file.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    /// The tenants in force: the config's (with the changes that still apply), then
    /// those added with `dpuctl`, by name.
    pub tenants: Vec<TenantConfig>,
    /// Tenants of the config kept out by `dpuctl tenant rm`: not served, but their
    /// encryption is set up so that `dpuctl tenant add` can bring them back.
    pub removed: Vec<TenantConfig>,
    /// The state file to go on with: the records that still apply.
    pub state: PersistedState,
    /// What was dropped from the state file, and why, for the log.
    pub notes: Vec<Note>,
}

/// A record of the state file that no longer applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub tenant: String,
    pub kind: NoteKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoteKind {
    /// A change made with `dpuctl` is no longer in force: the config file changed that
    /// setting since (the operator should know: logged as a warning).
    Superseded,
    /// A record says what the config file now says itself, or is about a tenant the
    /// config no longer names.
    Redundant,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tenant {:?}: {}", self.tenant, self.message)
    }
}

/// The tenants in force at start: the config file's, with the state file's changes
/// applied by the precedence rule (see the module doc), and the state file cleaned
/// of records that no longer apply.
pub fn merge(config: &[TenantConfig], state: &PersistedState) -> Merged {
    let mut out =
        Merged { tenants: Vec::new(), removed: Vec::new(), state: PersistedState::default(), notes: Vec::new() };
    let mut note = |tenant: &str, kind, message: String| {
        out.notes.push(Note { tenant: tenant.to_owned(), kind, message });
    };
    for c in config {
        let Some(record) = state.tenants.get(&c.name) else {
            out.tenants.push(c.clone());
            continue;
        };
        if let Some(added) = &record.added {
            note(
                &c.name,
                NoteKind::Redundant,
                format!(
                    "added with dpuctl at {} and now named in the config file: the config's entry is used, \
                     and the state file's record of it is dropped",
                    added.changed_unix_s
                ),
            );
            out.tenants.push(c.clone());
            continue;
        }
        let mut tenant = c.clone();
        let mut kept = TenantRecord { removed: record.removed, ..TenantRecord::default() };
        if let Some(q) = &record.qos {
            if q.config == Some(QosRecord::from(&c.qos)) {
                tenant.qos = q.value.into();
                kept.qos = Some(q.clone());
            } else {
                note(
                    &c.name,
                    NoteKind::Superseded,
                    format!(
                        "the QoS set with dpuctl at {} no longer applies: the config file's [tenants.qos] changed since, and the config wins",
                        q.changed_unix_s
                    ),
                );
            }
        }
        if let Some(l) = &record.limits {
            if l.config == Some(TenantLimits::of(c)) {
                l.value.apply_to(&mut tenant);
                kept.limits = Some(l.clone());
            } else {
                note(
                    &c.name,
                    NoteKind::Superseded,
                    format!(
                        "the session limits set with dpuctl at {} no longer apply: the config file's limits of the tenant changed since, and the config wins",
                        l.changed_unix_s
                    ),
                );
            }
        }
        merge_keys(c, &record.keys, &mut tenant, &mut kept, &mut note);
        if kept.removed.is_some() {
            out.removed.push(tenant);
        } else {
            out.tenants.push(tenant);
        }
        if !kept.is_empty() {
            out.state.tenants.insert(c.name.clone(), kept);
        }
    }

    let containers: BTreeMap<&str, &str> = config.iter().map(|c| (c.container.as_str(), c.name.as_str())).collect();
    let named: BTreeSet<&str> = config.iter().map(|c| c.name.as_str()).collect();
    for (name, record) in state.tenants.iter().filter(|(n, _)| !named.contains(n.as_str())) {
        let Some(added) = &record.added else {
            note(
                name,
                NoteKind::Redundant,
                "no longer named in the config file: the state file's changes to it are dropped".into(),
            );
            continue;
        };
        if let Some(owner) = containers.get(added.container.as_str()) {
            note(
                name,
                NoteKind::Superseded,
                format!(
                    "added with dpuctl at {} with container {:?}, which the config file now gives tenant {owner:?}: \
                     tenants never share a container, so it is not served and is dropped from the state file",
                    added.changed_unix_s, added.container
                ),
            );
            continue;
        }
        let mut tenant = TenantConfig::new(name, &added.container);
        tenant.daos_user = added.daos_user.clone();
        tenant.daos_group = added.daos_group.clone();
        if let Some(q) = &record.qos {
            tenant.qos = q.value.into();
        }
        if let Some(l) = &record.limits {
            l.value.apply_to(&mut tenant);
        }
        out.tenants.push(tenant);
        let kept = TenantRecord {
            added: Some(added.clone()),
            qos: record.qos.clone(),
            limits: record.limits.clone(),
            ..TenantRecord::default()
        };
        out.state.tenants.insert(name.clone(), kept);
    }
    out
}

/// The rotated-in keys of config tenant `c`: each version the config does not name is
/// added to the tenant's keys; the newest rotation's version is current while the
/// config's current version is still the one it replaced.
fn merge_keys(
    c: &TenantConfig,
    keys: &[KeyRecord],
    tenant: &mut TenantConfig,
    kept: &mut TenantRecord,
    note: &mut impl FnMut(&str, NoteKind, String),
) {
    if keys.is_empty() {
        return;
    }
    let (Some(enc), Some(config_version)) = (tenant.encryption.as_mut(), config_key_version(c)) else {
        note(
            &c.name,
            NoteKind::Superseded,
            format!(
                "the config file no longer encrypts the tenant ([tenants.encryption]): the key versions rotated in with dpuctl ({}) are dropped",
                keys.iter().map(|k| k.version.to_string()).collect::<Vec<_>>().join(", ")
            ),
        );
        return;
    };
    for k in keys {
        match enc.keys.iter().find(|(v, _)| *v == k.version) {
            Some((_, file)) if *file == k.file => note(
                &c.name,
                NoteKind::Redundant,
                format!(
                    "key version {} is in the config file now: the state file's record of it is dropped",
                    k.version
                ),
            ),
            Some((_, file)) => note(
                &c.name,
                NoteKind::Superseded,
                format!(
                    "key version {} was rotated in with dpuctl at {} from {}, and the config file names another file for that version ({}): the config wins",
                    k.version,
                    k.changed_unix_s,
                    k.file.display(),
                    file.display()
                ),
            ),
            None => {
                enc.keys.push((k.version, k.file.clone()));
                kept.keys.push(k.clone());
            }
        }
    }
    let Some(newest) = keys.last() else { return };
    if newest.config_key_version == config_version {
        if enc.keys.iter().any(|(v, _)| *v == newest.version) {
            enc.key_version = Some(newest.version);
        }
    } else if newest.version != config_version {
        note(
            &c.name,
            NoteKind::Superseded,
            format!(
                "key version {} became current with dpuctl at {}, and the config file's current version changed since (to {config_version}): \
                 new files are wrapped under version {config_version}",
                newest.version, newest.changed_unix_s
            ),
        );
    }
}

/// Where a setting in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The config file (or its defaults).
    Config,
    /// A change made with `dpuctl` at this time, kept in the state file.
    Dpuctl { changed_unix_s: u64 },
}

/// Where each of a tenant's settings came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantOrigins {
    pub tenant: String,
    /// The tenant itself: named in the config file, or added with `dpuctl`.
    pub entry: Origin,
    pub qos: Origin,
    pub limits: Origin,
    /// The current key version; `None` for a tenant without encryption.
    pub key: Option<Origin>,
    /// Set: a tenant of the config file removed with `dpuctl tenant rm`.
    pub removed: Option<u64>,
}

/// Where the settings of each tenant in force (`live`) came from, then the tenants of
/// the config kept out with `dpuctl tenant rm`; by name.
pub fn origins(config: &[TenantConfig], state: &PersistedState, live: &[TenantConfig]) -> Vec<TenantOrigins> {
    let mut out = Vec::new();
    for t in live {
        let record = state.tenants.get(&t.name);
        let entry = match record.and_then(|r| r.added.as_ref()) {
            Some(a) if config_tenant(config, &t.name).is_none() => Origin::Dpuctl { changed_unix_s: a.changed_unix_s },
            _ => Origin::Config,
        };
        let stamp =
            |changed: Option<u64>| changed.map_or(Origin::Config, |changed_unix_s| Origin::Dpuctl { changed_unix_s });
        out.push(TenantOrigins {
            tenant: t.name.clone(),
            entry,
            qos: stamp(record.and_then(|r| r.qos.as_ref()).map(|o| o.changed_unix_s)),
            limits: stamp(record.and_then(|r| r.limits.as_ref()).map(|o| o.changed_unix_s)),
            key: t.encryption.as_ref().map(|_| stamp(record.and_then(|r| r.keys.last()).map(|k| k.changed_unix_s))),
            removed: None,
        });
    }
    for (name, record) in &state.tenants {
        if let (Some(removed), Some(c)) = (record.removed, config_tenant(config, name))
            && !live.iter().any(|t| t.name == *name)
        {
            out.push(TenantOrigins {
                tenant: name.clone(),
                entry: Origin::Config,
                qos: Origin::Config,
                limits: Origin::Config,
                key: c.encryption.as_ref().map(|_| Origin::Config),
                removed: Some(removed.changed_unix_s),
            });
        }
    }
    out.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    out
}

/// Why the text of a state file was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// Not TOML.
    Syntax(String),
    /// No `version`, or one this agent does not read.
    Version { found: Option<String> },
    /// TOML of version 1 with a wrong key, type or value.
    Invalid(String),
}

/// The first lines of every state file, for whoever opens it.
const HEADER: &str = "\
# dpu-agent state file: the changes made with dpuctl (tenants added and removed, QoS,
# session limits, rotated-in key versions), applied at every start. Written by the agent
# (atomically) on every change; the config file wins for a setting it changed since.
# Key files are named here, never copied. See docs/config.md, \"Settings that persist\".
";

#[derive(Serialize)]
struct FileOut<'a> {
    version: u32,
    #[serde(skip_serializing_if = "no_tenants")]
    tenants: &'a BTreeMap<String, TenantRecord>,
}

fn no_tenants(tenants: &&BTreeMap<String, TenantRecord>) -> bool {
    tenants.is_empty()
}

/// The state file's text.
pub fn render(state: &PersistedState) -> Result<String, FormatError> {
    let body = toml::to_string_pretty(&FileOut { version: STATE_VERSION, tenants: &state.tenants })
        .map_err(|e| FormatError::Invalid(e.to_string()))?;
    Ok(format!("{HEADER}\n{body}"))
}

/// A state file's content from its text, checked.
pub fn parse(text: &str) -> Result<PersistedState, FormatError> {
    let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| FormatError::Syntax(e.to_string()))?;
    match table.remove("version") {
        Some(toml::Value::Integer(v)) if v == i64::from(STATE_VERSION) => {}
        Some(other) => return Err(FormatError::Version { found: Some(other.to_string()) }),
        None => return Err(FormatError::Version { found: None }),
    }
    let state: PersistedState =
        toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| FormatError::Invalid(e.to_string()))?;
    check(&state).map_err(FormatError::Invalid)?;
    Ok(state)
}

/// What the types do not say: names, ranges, and records that cannot go together.
fn check(state: &PersistedState) -> Result<(), String> {
    let max_weight = dpuio_auth::qos::MAX_WEIGHT;
    for (name, r) in &state.tenants {
        let at = |key: &str| format!("tenants.{name}.{key}");
        check_identifier(name).map_err(|reason| format!("tenant name {name:?} {reason}"))?;
        if let Some(a) = &r.added {
            check_identifier(&a.container)
                .map_err(|reason| format!("{}: {:?} {reason}", at("added.container"), a.container))?;
            if r.removed.is_some() || !r.keys.is_empty() {
                return Err(format!("tenants.{name}: a tenant added with dpuctl has no removed mark and no keys"));
            }
        }
        if let Some(q) = &r.qos {
            for (which, v) in [("value", Some(q.value)), ("config", q.config)] {
                let Some(v) = v else { continue };
                if !(1..=max_weight).contains(&v.weight) {
                    return Err(format!(
                        "{}: {} is not a weight from 1 to {max_weight}",
                        at(&format!("qos.{which}.weight")),
                        v.weight
                    ));
                }
                if v.max_inflight == 0 {
                    return Err(format!("{}: must be at least 1", at(&format!("qos.{which}.max_inflight"))));
                }
            }
        }
        let mut versions = BTreeSet::new();
        for k in &r.keys {
            if k.version == 0 || !versions.insert(k.version) {
                return Err(format!("{}: version {} is 0 or appears twice", at("keys"), k.version));
            }
            if !k.file.is_absolute() {
                return Err(format!("{}: {} is not an absolute path", at("keys.file"), k.file.display()));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EncryptionConfig;

    fn qos(bytes_per_s: u64, weight: u32) -> QosConfig {
        let mut q = QosConfig::default();
        q.limits.bytes_per_s = bytes_per_s;
        q.weight = weight;
        q
    }

    fn encrypted(name: &str, keys: &[(u32, &str)]) -> TenantConfig {
        let mut t = TenantConfig::new(name, name);
        t.encryption = Some(EncryptionConfig {
            keys: keys.iter().map(|(v, f)| (*v, PathBuf::from(f))).collect(),
            key_version: None,
            block_bytes: None,
            provider: None,
        });
        t
    }

    fn names(tenants: &[TenantConfig]) -> Vec<&str> {
        tenants.iter().map(|t| t.name.as_str()).collect()
    }

    #[test]
    fn an_empty_state_changes_nothing() {
        let config = vec![TenantConfig::new("a", "a"), encrypted("b", &[(1, "/k1")])];
        let merged = merge(&config, &PersistedState::default());
        assert_eq!(merged.tenants, config);
        assert!(merged.removed.is_empty() && merged.notes.is_empty());
        assert_eq!(merged.state, PersistedState::default());
    }

    #[test]
    fn changes_to_config_tenants_apply_while_the_config_says_what_they_replaced() {
        let mut config = vec![TenantConfig::new("a", "a")];
        let mut state = PersistedState::default();
        state.record_qos(&config, "a", &qos(64 << 20, 3), 100);
        let limits = TenantLimits { max_handles_per_session: Some(1), ..TenantLimits::default() };
        state.record_limits(&config, "a", limits, 101);

        let merged = merge(&config, &state);
        assert_eq!(merged.tenants[0].qos, qos(64 << 20, 3));
        assert_eq!(merged.tenants[0].max_handles_per_session, Some(1));
        assert_eq!(merged.state, state, "everything still applies");
        assert!(merged.notes.is_empty());
        let o = &origins(&config, &merged.state, &merged.tenants)[0];
        assert_eq!(
            (o.entry, o.qos, o.limits, o.key),
            (Origin::Config, Origin::Dpuctl { changed_unix_s: 100 }, Origin::Dpuctl { changed_unix_s: 101 }, None)
        );

        // The operator edits the tenant's QoS in the config: the config wins from then
        // on, the limits (unchanged in the config) still apply.
        config[0].qos = qos(1 << 30, 1);
        let merged = merge(&config, &state);
        assert_eq!(merged.tenants[0].qos, qos(1 << 30, 1));
        assert_eq!(merged.tenants[0].max_handles_per_session, Some(1));
        assert!(merged.state.tenants["a"].qos.is_none() && merged.state.tenants["a"].limits.is_some());
        assert_eq!(merged.notes.len(), 1);
        assert_eq!(merged.notes[0].kind, NoteKind::Superseded);
        assert!(
            merged.notes[0].to_string().contains("tenant \"a\": the QoS set with dpuctl at 100"),
            "{}",
            merged.notes[0]
        );
        // Even if the config is later set back: the dropped change stays dropped.
        config[0].qos = QosConfig::default();
        assert_eq!(merge(&config, &merged.state).tenants[0].qos, QosConfig::default());
    }

    #[test]
    fn setting_a_config_tenant_back_to_the_config_ends_the_override() {
        let config = vec![TenantConfig::new("a", "a")];
        let mut state = PersistedState::default();
        state.record_qos(&config, "a", &qos(5, 2), 1);
        assert!(state.tenants.contains_key("a"));
        state.record_qos(&config, "a", &QosConfig::default(), 2);
        assert_eq!(state, PersistedState::default());
        let o = &origins(&config, &state, &config)[0];
        assert_eq!(o.qos, Origin::Config);
    }

    #[test]
    fn added_tenants_come_back_until_the_config_names_them() {
        let mut config = vec![TenantConfig::new("a", "a")];
        let mut state = PersistedState::default();
        let mut extra = TenantConfig::new("extra", "extra-data");
        extra.qos = qos(7, 4);
        extra.max_sessions = Some(2);
        state.record_add(&config, &extra, 50);
        state.record_qos(&config, "extra", &qos(9, 4), 60);

        let merged = merge(&config, &state);
        assert_eq!(names(&merged.tenants), ["a", "extra"]);
        let back = &merged.tenants[1];
        assert_eq!((back.container.as_str(), back.qos, back.max_sessions), ("extra-data", qos(9, 4), Some(2)));
        let o = &origins(&config, &merged.state, &merged.tenants)[1];
        assert_eq!(
            (o.entry, o.qos, o.limits),
            (
                Origin::Dpuctl { changed_unix_s: 50 },
                Origin::Dpuctl { changed_unix_s: 60 },
                Origin::Dpuctl { changed_unix_s: 50 }
            )
        );

        // Written into the config (as an operator keeps it): the config's entry is used.
        config.push(TenantConfig::new("extra", "extra-data"));
        let merged = merge(&config, &state);
        assert_eq!(merged.tenants, config);
        assert_eq!(merged.state, PersistedState::default());
        assert_eq!(merged.notes[0].kind, NoteKind::Redundant);

        // A config tenant that takes its container: the added one is not served.
        let config = vec![TenantConfig::new("a", "a"), TenantConfig::new("b", "extra-data")];
        let merged = merge(&config, &state);
        assert_eq!(names(&merged.tenants), ["a", "b"]);
        assert_eq!(merged.notes[0].kind, NoteKind::Superseded);
        assert!(merged.notes[0].message.contains("tenant \"b\""), "{}", merged.notes[0]);

        // Removing an added tenant forgets it.
        state.record_remove(&[TenantConfig::new("a", "a")], "extra", 70);
        assert_eq!(state, PersistedState::default());
    }

    #[test]
    fn a_removed_config_tenant_stays_removed_until_added_back() {
        let config = vec![TenantConfig::new("a", "a"), encrypted("b", &[(1, "/k1")])];
        let mut state = PersistedState::default();
        state.record_key(&config, "b", 2, Path::new("/k2"), 10);
        state.record_qos(&config, "b", &qos(1, 1), 11);
        state.record_remove(&config, "b", 20);

        let merged = merge(&config, &state);
        assert_eq!(names(&merged.tenants), ["a"]);
        assert_eq!(names(&merged.removed), ["b"]);
        let keys = &merged.removed[0].encryption.as_ref().unwrap().keys;
        assert_eq!(keys.len(), 2, "its rotated-in key is kept: its files are wrapped under it");
        assert!(merged.state.tenants["b"].qos.is_none(), "its QoS went with it");
        let all = origins(&config, &merged.state, &merged.tenants);
        assert_eq!(all[1].removed, Some(20));
        assert_eq!(all[1].key, Some(Origin::Config));

        // dpuctl tenant add brings it back, with its config's QoS.
        state.record_add(&config, &merged.removed[0], 30);
        let merged = merge(&config, &state);
        assert_eq!(names(&merged.tenants), ["a", "b"]);
        assert!(merged.removed.is_empty());
        assert_eq!(merged.tenants[1].qos, QosConfig::default());
        assert_eq!(merged.tenants[1].encryption.as_ref().unwrap().key_version, Some(2));

        // A removal is forgotten once the config no longer names the tenant.
        state.record_remove(&config, "b", 40);
        let merged = merge(&config[..1], &state);
        assert_eq!(merged.state, PersistedState::default());
        assert_eq!(merged.notes[0].kind, NoteKind::Redundant);
    }

    #[test]
    fn rotated_in_keys_are_added_and_the_newest_is_current() {
        let mut config = vec![encrypted("v", &[(1, "/k1")])];
        let mut state = PersistedState::default();
        state.record_key(&config, "v", 2, Path::new("/k2"), 10);
        state.record_key(&config, "v", 3, Path::new("/k3"), 20);
        assert_eq!(state.tenants["v"].keys[1].config_key_version, 1);

        let merged = merge(&config, &state);
        let enc = merged.tenants[0].encryption.as_ref().unwrap();
        assert_eq!(enc.keys, [(1, "/k1".into()), (2, "/k2".into()), (3, "/k3".into())]);
        assert_eq!(enc.key_version, Some(3));
        assert_eq!(
            origins(&config, &merged.state, &merged.tenants)[0].key,
            Some(Origin::Dpuctl { changed_unix_s: 20 })
        );

        // The operator writes version 3 into the config (same file): that record goes,
        // version 2 is still added, 3 is current by the config.
        config[0].encryption.as_mut().unwrap().keys.push((3, "/k3".into()));
        let merged = merge(&config, &state);
        let enc = merged.tenants[0].encryption.as_ref().unwrap();
        assert_eq!(enc.keys, [(1, "/k1".into()), (3, "/k3".into()), (2, "/k2".into())]);
        assert_eq!(enc.key_version, None, "the config's highest, 3");
        assert_eq!(merged.state.tenants["v"].keys.len(), 1);
        assert!(merged.notes.iter().all(|n| n.kind == NoteKind::Redundant), "{:?}", merged.notes);

        // Another file for version 2 in the config: the config wins.
        config[0].encryption.as_mut().unwrap().keys.push((2, "/elsewhere".into()));
        let merged = merge(&config, &state);
        assert!(merged.state.tenants.is_empty());
        assert!(merged.notes.iter().any(|n| n.kind == NoteKind::Superseded && n.message.contains("/elsewhere")));

        // The config pins key_version after the rotation: it wins.
        let mut pinned = vec![encrypted("v", &[(1, "/k1"), (5, "/k5")])];
        pinned[0].encryption.as_mut().unwrap().key_version = Some(1);
        let mut state = PersistedState::default();
        state.record_key(&pinned, "v", 6, Path::new("/k6"), 10);
        pinned[0].encryption.as_mut().unwrap().key_version = Some(5);
        let merged = merge(&pinned, &state);
        let enc = merged.tenants[0].encryption.as_ref().unwrap();
        assert_eq!((enc.key_version, enc.keys.len()), (Some(5), 3), "the key is kept to open files, 5 is current");
        assert!(merged.notes.iter().any(|n| n.kind == NoteKind::Superseded));

        // Encryption turned off in the config: the keys go.
        let merged = merge(&[TenantConfig::new("v", "v")], &state);
        assert!(merged.state.tenants.is_empty() && merged.notes[0].kind == NoteKind::Superseded);
    }

    #[test]
    fn the_text_round_trips_and_says_what_it_is() {
        let config = vec![TenantConfig::new("a", "a"), encrypted("b", &[(1, "/k1")])];
        let mut state = PersistedState::default();
        state.record_qos(&config, "a", &qos(5, 2), 1);
        state.record_add(&config, &TenantConfig::new("c.d", "c"), 2);
        state.record_key(&config, "b", 2, Path::new("/keys/k2"), 3);
        let text = render(&state).unwrap();
        assert!(text.starts_with("# dpu-agent state file") && text.contains("version = 1"), "{text}");
        assert!(text.contains("file = \"/keys/k2\""), "{text}");
        assert_eq!(parse(&text).unwrap(), state);
        assert_eq!(parse(&render(&PersistedState::default()).unwrap()).unwrap(), PersistedState::default());
    }

    #[test]
    fn bad_text_is_refused_with_the_reason() {
        assert!(matches!(parse("version = 1\n[tenants"), Err(FormatError::Syntax(_))));
        assert_eq!(parse("[tenants]\n"), Err(FormatError::Version { found: None }));
        assert_eq!(parse("version = 2\n"), Err(FormatError::Version { found: Some("2".into()) }));
        let e = parse("version = 1\n[tenants.a]\ncolour = 1\n").unwrap_err();
        assert!(matches!(&e, FormatError::Invalid(m) if m.contains("colour")), "{e:?}");
        let e = parse("version = 1\n[tenants.\"-x\"]\n").unwrap_err();
        assert!(matches!(&e, FormatError::Invalid(m) if m.contains("\"-x\"")), "{e:?}");
        let weight0 = "version = 1\n[tenants.a.qos]\nchanged_unix_s = 1\n[tenants.a.qos.value]\n\
                       bytes_per_s = 0\nops_per_s = 0\nburst_bytes = 0\nburst_ops = 0\nweight = 0\nmax_inflight = 1\n";
        let e = parse(weight0).unwrap_err();
        assert!(matches!(&e, FormatError::Invalid(m) if m.contains("qos.value.weight")), "{e:?}");
        let relative =
            "version = 1\n[[tenants.a.keys]]\nversion = 2\nfile = \"k2\"\nconfig_key_version = 1\nchanged_unix_s = 1\n";
        let e = parse(relative).unwrap_err();
        assert!(matches!(&e, FormatError::Invalid(m) if m.contains("not an absolute path")), "{e:?}");
    }
}
