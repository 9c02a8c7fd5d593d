//! The checker: walks the TOML table section by section (the sections' own checks are
//! in the files beside this one), collecting every issue rather than stopping at the
//! first, and the name checks the agent uses elsewhere too.

use super::{Config, ConfigIssue, Limits};

/// Collects issues while building a [`Config`] from defaults and the table.
#[derive(Default)]
pub(super) struct Checker {
    pub(super) issues: Vec<ConfigIssue>,
}

impl Checker {
    pub(super) fn issue(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.issues.push(ConfigIssue { key: key.into(), reason: reason.into() });
    }

    pub(super) fn unknown_keys(&mut self, prefix: &str, table: &toml::Table, known: &[&str]) {
        for key in table.keys() {
            if !known.contains(&key.as_str()) {
                self.issue(join(prefix, key), format!("unknown key; expected one of: {}", known.join(", ")));
            }
        }
    }

    pub(super) fn section<'t>(&mut self, table: &'t toml::Table, name: &str) -> Option<&'t toml::Table> {
        match table.get(name) {
            None => None,
            Some(toml::Value::Table(t)) => Some(t),
            Some(other) => {
                self.issue(name, format!("expected a table ([{name}]), found {}", other.type_str()));
                None
            }
        }
    }

    pub(super) fn string(&mut self, t: &toml::Table, prefix: &str, key: &str) -> Option<String> {
        match t.get(key)? {
            toml::Value::String(s) => Some(s.clone()),
            other => {
                self.issue(join(prefix, key), format!("expected a string, found {}", other.type_str()));
                None
            }
        }
    }

    pub(super) fn integer(&mut self, t: &toml::Table, prefix: &str, key: &str, min: i64, max: i64) -> Option<i64> {
        match t.get(key)? {
            toml::Value::Integer(n) if (min..=max).contains(n) => Some(*n),
            toml::Value::Integer(n) => {
                self.issue(join(prefix, key), format!("{n} is out of range; expected {min} to {max}"));
                None
            }
            other => {
                self.issue(join(prefix, key), format!("expected an integer, found {}", other.type_str()));
                None
            }
        }
    }

    /// The whole file, section by section in a fixed order (so the issues come in that
    /// order too), on top of the defaults.
    pub(super) fn config(&mut self, root: &toml::Table) -> Config {
        let mut config = Config::default();
        self.unknown_keys(
            "",
            root,
            &["agent", "backend", "limits", "tenants", "data_plane", "tls", "admin", "metrics"],
        );
        if let Some(agent) = self.section(root, "agent") {
            self.agent(agent, &mut config);
        }
        let backend = self.section(root, "backend");
        config.backend = self.backend(backend, &config.data_dir);
        if let Some(dp) = self.section(root, "data_plane") {
            self.data_plane(dp, &mut config);
        }

        if let Some(limits) = self.section(root, "limits") {
            self.limits(limits, &mut config.limits);
        }

        if let Some(tls) = self.section(root, "tls") {
            self.tls(tls, &mut config.tls);
        }
        if !config.tls.mtls && !config.listen.ip().is_loopback() {
            self.issue(
                "tls.mode",
                format!(
                    "\"off\" serves plaintext, which is allowed on a loopback listener only, and agent.listen is {}: \
                     use mode = \"mtls\" or listen on 127.0.0.1",
                    config.listen
                ),
            );
        }
        if let Some(admin) = self.section(root, "admin") {
            self.admin(admin, &mut config.admin);
        }
        if let Some(metrics) = self.section(root, "metrics") {
            self.metrics(metrics, &mut config);
        }

        match root.get("tenants") {
            None => {}
            Some(toml::Value::Array(items)) => config.tenants = self.tenants(items),
            Some(other) => {
                self.issue("tenants", format!("expected an array of tables ([[tenants]]), found {}", other.type_str()))
            }
        }
        // From the text, not `config.backend`: a DAOS section with mistakes of its own
        // leaves the local default there.
        let daos = root.get("backend").and_then(|b| b.get("kind")).and_then(toml::Value::as_str) == Some("daos");
        if !daos {
            for (i, t) in config.tenants.iter().enumerate().filter(|(_, t)| !t.object_class.is_empty()) {
                self.issue(
                    format!("tenants[{i}].object_class"),
                    format!(
                        "{:?}: object classes are DAOS's; the local backend has none (set [backend] kind = \"daos\", or \
                         leave it out)",
                        t.object_class
                    ),
                );
            }
            for (i, t) in config.tenants.iter().enumerate().filter(|(_, t)| !t.daos_user.is_empty()) {
                self.issue(
                    format!("tenants[{i}].daos_user"),
                    format!(
                        "{:?}: a DAOS identity needs the DAOS backend (set [backend] kind = \"daos\", or leave it out)",
                        t.daos_user
                    ),
                );
            }
        }
        config
    }

    /// `[limits]`: the bound on everything that grows.
    pub(super) fn limits(&mut self, t: &toml::Table, limits: &mut Limits) {
        const U32: i64 = u32::MAX as i64;
        let fields: [(&str, &mut u32, i64, i64); 7] = [
            ("max_sessions", &mut limits.max_sessions, 1, 1 << 20),
            ("max_handles_per_session", &mut limits.max_handles_per_session, 1, 1 << 20),
            ("max_regions_per_session", &mut limits.max_regions_per_session, 1, 1 << 16),
            ("max_inflight_per_session", &mut limits.max_inflight_per_session, 1, 1 << 16),
            ("max_readdir_batch", &mut limits.max_readdir_batch, 1, 1 << 16),
            ("max_lookup_paths", &mut limits.max_lookup_paths, 1, 1 << 16),
            ("max_message_bytes", &mut limits.max_message_bytes, 4096, U32),
        ];
        let mut known: Vec<&str> = fields.iter().map(|f| f.0).collect();
        known.push("max_io_bytes");
        self.unknown_keys("limits", t, &known);
        for (key, slot, min, max) in fields {
            if let Some(n) = self.integer(t, "limits", key, min, max) {
                *slot = n as u32;
            }
        }
        if let Some(n) = self.integer(t, "limits", "max_io_bytes", 4096, 1 << 32) {
            limits.max_io_bytes = n as u64;
        }
    }
}

/// Names of tenants and containers: what a file name, a SPIFFE path segment and a
/// DAOS label all accept.
pub fn check_identifier(value: &str) -> Result<(), &'static str> {
    if value.is_empty() || value.len() > 63 {
        return Err("must be 1 to 63 characters long");
    }
    if value.starts_with(['.', '-']) {
        return Err("must not start with '.' or '-'");
    }
    if !value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
        return Err("may only contain ASCII letters, digits, '-', '_' and '.'");
    }
    Ok(())
}

/// A DAOS pool or container label (`DAOS_PROP_LABEL_MAX_LEN` 127; letters, digits,
/// `_ . : -`), or a UUID.
pub fn check_daos_label(value: &str) -> Result<(), &'static str> {
    if value.is_empty() || value.len() > 127 {
        return Err("must be 1 to 127 characters long (a DAOS label or UUID)");
    }
    if !value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-')) {
        return Err("may only contain ASCII letters, digits, '_', '.', ':' and '-' (a DAOS label or UUID)");
    }
    Ok(())
}

pub(super) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() { key.to_owned() } else { format!("{prefix}.{key}") }
}
