//! `[data_plane]`: which providers and transports the agent offers, on which
//! interface, with how many I/O threads, and how long the engine polls.

use super::check::Checker;
use super::{Config, PROVIDERS};

impl Checker {
    /// `[data_plane]`.
    pub(super) fn data_plane(&mut self, dp: &toml::Table, config: &mut Config) {
        self.unknown_keys(
            "data_plane",
            dp,
            &["enabled", "transports", "providers", "io_threads", "interface", "idle_poll_us"],
        );
        match dp.get("providers") {
            None => {}
            Some(toml::Value::Array(items)) => {
                let names: Vec<String> = items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect();
                let unknown: Vec<&String> = names.iter().filter(|n| !PROVIDERS.contains(&n.as_str())).collect();
                if names.len() != items.len() || names.is_empty() || !unknown.is_empty() {
                    self.issue(
                        "data_plane.providers",
                        format!(
                            "expected a non-empty list of {:?}, found {}",
                            PROVIDERS,
                            toml::Value::Array(items.clone())
                        ),
                    );
                } else {
                    config.data_plane.providers = Some(names);
                }
            }
            Some(other) => self.issue(
                "data_plane.providers",
                format!("expected a list such as [\"ucx\", \"ofi\"], found {}", other.type_str()),
            ),
        }
        if let Some(n) = self.integer(dp, "data_plane", "io_threads", 1, 256) {
            config.data_plane.io_threads = n as u32;
        }
        if let Some(us) = self.integer(dp, "data_plane", "idle_poll_us", 0, 1_000_000) {
            config.data_plane.idle_poll_us = us as u32;
        }
        if let Some(name) = self.string(dp, "data_plane", "interface") {
            match fabric::config::check_interface_name(&name) {
                Ok(()) => config.data_plane.interface = Some(name),
                Err(reason) => self
                    .issue("data_plane.interface", format!("{reason}; name a network interface as `ip link` lists it")),
            }
        }
        match dp.get("enabled") {
            None => {}
            Some(toml::Value::Boolean(b)) => config.data_plane.enabled = *b,
            Some(other) => {
                self.issue("data_plane.enabled", format!("expected true or false, found {}", other.type_str()))
            }
        }
        if let Some(t) = self.string(dp, "data_plane", "transports") {
            let known = [
                "posix", "sysv", "cma", "knem", "xpmem", "tcp", "self", "rc", "rc_x", "rc_v", "dc", "dc_x", "ud",
                "ud_x", "ud_v", "sm", "shm", "ib", "all", "cuda", "rocm",
            ];
            let preset = fabric::FabricConfig::PRESETS.contains(&t.as_str());
            let unknown: Vec<&str> =
                t.split(',').map(str::trim).filter(|n| !known.contains(&n.trim_start_matches('^'))).collect();
            if t.is_empty() || (!preset && !unknown.is_empty()) {
                self.issue(
                    "data_plane.transports",
                    format!("{t:?}: expected \"auto\", \"shm\", \"tcp\" or a UCX_TLS list such as \"posix,sysv,cma,tcp,self\"; unknown: {}", unknown.join(", ")),
                );
            } else {
                config.data_plane.transports = t;
            }
        }
    }
}
