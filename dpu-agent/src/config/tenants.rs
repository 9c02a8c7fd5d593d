//! `[[tenants]]`: each tenant's names, session limits, `[tenants.qos]` and
//! `[tenants.encryption]`.

use std::collections::HashSet;
use std::path::PathBuf;

use super::check::{Checker, check_identifier, join};
use super::{EncryptionConfig, QosConfig, TenantConfig};

impl Checker {
    pub(super) fn tenants(&mut self, items: &[toml::Value]) -> Vec<TenantConfig> {
        let mut tenants = Vec::new();
        let mut names = HashSet::new();
        let mut containers = HashSet::new();
        if items.is_empty() {
            self.issue("tenants", "at least one tenant is needed");
        }
        for (i, item) in items.iter().enumerate() {
            let prefix = format!("tenants[{i}]");
            let toml::Value::Table(t) = item else {
                self.issue(&prefix, format!("expected a table, found {}", item.type_str()));
                continue;
            };
            self.unknown_keys(
                &prefix,
                t,
                &[
                    "name",
                    "container",
                    "encryption",
                    "max_sessions",
                    "max_handles_per_session",
                    "max_regions_per_session",
                    "qos",
                    "object_class",
                    "daos_user",
                    "daos_group",
                ],
            );
            let max_sessions = self.integer(t, &prefix, "max_sessions", 1, 1 << 20).map(|n| n as u32);
            let max_handles_per_session =
                self.integer(t, &prefix, "max_handles_per_session", 1, 1 << 20).map(|n| n as u32);
            let max_regions_per_session =
                self.integer(t, &prefix, "max_regions_per_session", 1, 1 << 16).map(|n| n as u32);
            let qos = match t.get("qos") {
                None => QosConfig::default(),
                Some(toml::Value::Table(q)) => self.qos(&format!("{prefix}.qos"), q),
                Some(other) => {
                    self.issue(format!("{prefix}.qos"), format!("expected a table, found {}", other.type_str()));
                    QosConfig::default()
                }
            };
            let encryption = match t.get("encryption") {
                None => None,
                Some(toml::Value::Table(e)) => self.encryption(&format!("{prefix}.encryption"), e),
                Some(other) => {
                    self.issue(format!("{prefix}.encryption"), format!("expected a table, found {}", other.type_str()));
                    None
                }
            };
            let object_class = self.string(t, &prefix, "object_class").unwrap_or_default();
            self.object_class(&join(&prefix, "object_class"), &object_class, "[backend] object_class");
            let daos_user = self.string(t, &prefix, "daos_user").unwrap_or_default();
            let daos_group = self.string(t, &prefix, "daos_group").unwrap_or_default();
            self.daos_identity(&prefix, &daos_user, &daos_group);
            let name = self.string(t, &prefix, "name");
            let container = self.string(t, &prefix, "container");
            let (Some(name), Some(container)) = (name, container) else {
                for key in ["name", "container"] {
                    if !t.contains_key(key) {
                        self.issue(join(&prefix, key), "missing; every tenant needs a name and a container");
                    }
                }
                continue;
            };
            let mut ok = true;
            for (key, value) in [("name", &name), ("container", &container)] {
                if let Err(reason) = check_identifier(value) {
                    self.issue(join(&prefix, key), format!("{value:?} {reason}"));
                    ok = false;
                }
            }
            if !names.insert(name.clone()) {
                self.issue(join(&prefix, "name"), format!("tenant {name:?} is defined twice"));
                ok = false;
            }
            if !containers.insert(container.clone()) {
                self.issue(
                    join(&prefix, "container"),
                    format!(
                        "container {container:?} already belongs to another tenant; tenants never share a container"
                    ),
                );
                ok = false;
            }
            if ok {
                tenants.push(TenantConfig {
                    name,
                    container,
                    encryption,
                    max_sessions,
                    max_handles_per_session,
                    max_regions_per_session,
                    qos,
                    object_class,
                    daos_user,
                    daos_group,
                });
            }
        }
        tenants
    }

    /// `daos_user` / `daos_group`: a user (and group) of this machine that is not root.
    fn daos_identity(&mut self, prefix: &str, user: &str, group: &str) {
        if user.is_empty() {
            if !group.is_empty() {
                self.issue(join(prefix, "daos_group"), "needs daos_user: a DAOS identity is a user and its group");
            }
            return;
        }
        if let Err(reason) = dpuio_worker::Identity::resolve(user, group) {
            self.issue(join(prefix, "daos_user"), reason);
        }
    }

    pub(super) fn qos(&mut self, prefix: &str, t: &toml::Table) -> QosConfig {
        self.unknown_keys(
            prefix,
            t,
            &["bytes_per_s", "ops_per_s", "burst_bytes", "burst_ops", "weight", "max_inflight"],
        );
        let mut q = QosConfig::default();
        let max = i64::MAX;
        let get = |c: &mut Checker, key: &str| c.integer(t, prefix, key, 0, max).map(|n| n as u64);
        q.limits.bytes_per_s = get(self, "bytes_per_s").unwrap_or(0);
        q.limits.ops_per_s = get(self, "ops_per_s").unwrap_or(0);
        q.limits.bytes_burst = get(self, "burst_bytes").unwrap_or(0);
        q.limits.ops_burst = get(self, "burst_ops").unwrap_or(0);
        if let Some(w) = self.integer(t, prefix, "weight", 1, dpuio_auth::qos::MAX_WEIGHT.into()) {
            q.weight = w as u32;
        }
        if let Some(n) = self.integer(t, prefix, "max_inflight", 1, 1 << 20) {
            q.max_inflight = n as u32;
        }
        q
    }

    pub(super) fn encryption(&mut self, prefix: &str, t: &toml::Table) -> Option<EncryptionConfig> {
        self.unknown_keys(prefix, t, &["key_file", "keys", "key_version", "block_bytes", "provider"]);
        let mut keys = Vec::new();
        if let Some(file) = self.string(t, prefix, "key_file") {
            keys.push((1, PathBuf::from(file)));
        }
        match t.get("keys") {
            None => {}
            Some(toml::Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let at = format!("{prefix}.keys[{i}]");
                    let toml::Value::Table(k) = item else {
                        self.issue(&at, "expected { version = N, file = \"PATH\" }");
                        continue;
                    };
                    self.unknown_keys(&at, k, &["version", "file"]);
                    let version = self.integer(k, &at, "version", 1, u32::MAX as i64);
                    let file = self.string(k, &at, "file");
                    match (version, file) {
                        (Some(v), Some(f)) => keys.push((v as u32, PathBuf::from(f))),
                        _ => self.issue(&at, "every key needs a version and a file"),
                    }
                }
            }
            Some(other) => {
                self.issue(format!("{prefix}.keys"), format!("expected an array, found {}", other.type_str()))
            }
        }
        if keys.is_empty() {
            self.issue(
                prefix,
                "name the key-encryption key: key_file = \"PATH\" or keys = [{ version = 1, file = \"PATH\" }]",
            );
            return None;
        }
        let mut versions: Vec<u32> = keys.iter().map(|k| k.0).collect();
        versions.sort_unstable();
        if versions.windows(2).any(|w| w[0] == w[1]) {
            self.issue(format!("{prefix}.keys"), "a key version appears twice");
        }
        let key_version = self.integer(t, prefix, "key_version", 1, u32::MAX as i64).map(|v| v as u32);
        if let Some(v) = key_version
            && !versions.contains(&v)
        {
            self.issue(format!("{prefix}.key_version"), format!("version {v} has no key; known: {versions:?}"));
        }
        let block_bytes = self.integer(t, prefix, "block_bytes", 4096, 16 << 20).map(|b| b as u32);
        if let Some(b) = block_bytes
            && !b.is_power_of_two()
        {
            self.issue(format!("{prefix}.block_bytes"), format!("{b} is not a power of two (4 KiB to 16 MiB)"));
        }
        let provider = self.string(t, prefix, "provider");
        if let Some(p) = &provider
            && !["aws-lc-rs", "rustcrypto"].contains(&p.as_str())
        {
            self.issue(format!("{prefix}.provider"), format!("{p:?}: expected \"aws-lc-rs\" or \"rustcrypto\""));
        }
        Some(EncryptionConfig { keys, key_version, block_bytes, provider })
    }
}
