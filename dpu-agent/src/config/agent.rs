//! `[agent]`, `[tls]`, `[admin]` and `[metrics]`: where the agent listens and how its
//! listeners are secured.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::check::Checker;
use super::{AdminConfig, Config, TlsConfig, TlsFiles};

impl Checker {
    /// `[agent]`: the control plane's listeners, the data directory, the lease.
    pub(super) fn agent(&mut self, agent: &toml::Table, config: &mut Config) {
        self.unknown_keys("agent", agent, &["listen", "health_listen", "data_dir", "lease_ms"]);
        if let Some(listen) = self.string(agent, "agent", "listen") {
            match listen.parse::<SocketAddr>() {
                Ok(addr) => config.listen = addr,
                Err(_) => self
                    .issue("agent.listen", format!("{listen:?} is not an IP:port address such as \"127.0.0.1:7300\"")),
            }
        }
        if let Some(listen) = self.string(agent, "agent", "health_listen") {
            match listen.parse::<SocketAddr>() {
                Ok(addr) if addr == config.listen && addr.port() != 0 => {
                    self.issue("agent.health_listen", format!("{addr} is agent.listen already; use another port"))
                }
                Ok(addr) => config.health_listen = Some(addr),
                Err(_) => self.issue(
                    "agent.health_listen",
                    format!("{listen:?} is not an IP:port address such as \"0.0.0.0:7301\""),
                ),
            }
        }
        if let Some(dir) = self.string(agent, "agent", "data_dir") {
            if dir.is_empty() {
                self.issue("agent.data_dir", "must not be empty");
            } else {
                config.data_dir = PathBuf::from(dir);
            }
        }
        if let Some(ms) = self.integer(agent, "agent", "lease_ms", 1_000, 3_600_000) {
            config.lease_ms = ms as u64;
        }
    }

    /// `[tls]`: mutual TLS or plaintext, the trust domain, production files.
    pub(super) fn tls(&mut self, t: &toml::Table, tls: &mut TlsConfig) {
        self.unknown_keys("tls", t, &["mode", "trust_domain", "cert", "key", "client_ca", "client_bundle_dir"]);
        match self.string(t, "tls", "mode").as_deref() {
            None | Some("mtls") => {}
            Some("off") => tls.mtls = false,
            Some(other) => self.issue("tls.mode", format!("{other:?}: expected \"mtls\" or \"off\"")),
        }
        if let Some(domain) = self.string(t, "tls", "trust_domain") {
            match dpuio_auth::pki::validate_trust_domain(&domain) {
                Ok(()) => tls.trust_domain = domain,
                Err(e) => self.issue("tls.trust_domain", e.to_string()),
            }
        }
        let files: Vec<Option<String>> =
            ["cert", "key", "client_ca"].iter().map(|k| self.string(t, "tls", k).filter(|v| !v.is_empty())).collect();
        match files.as_slice() {
            [Some(cert), Some(key), Some(ca)] => {
                tls.files = Some(TlsFiles { cert: cert.into(), key: key.into(), client_ca: ca.into() })
            }
            [None, None, None] => {}
            _ => self.issue(
                "tls",
                "cert, key and client_ca go together: name all three (production) or none (a development CA under data_dir/pki)",
            ),
        }
        if let Some(dir) = self.string(t, "tls", "client_bundle_dir").filter(|d| !d.is_empty()) {
            tls.client_bundle_dir = Some(PathBuf::from(dir));
        }
    }

    /// `[admin]`: the operator's socket.
    pub(super) fn admin(&mut self, admin: &toml::Table, config: &mut AdminConfig) {
        self.unknown_keys("admin", admin, &["socket"]);
        if let Some(socket) = self.string(admin, "admin", "socket") {
            if socket.is_empty() {
                self.issue("admin.socket", "must not be empty");
            } else {
                config.socket = Some(PathBuf::from(socket));
            }
        }
    }

    /// `[metrics]`: where `GET /metrics` is served (checked against the other listeners).
    pub(super) fn metrics(&mut self, metrics: &toml::Table, config: &mut Config) {
        self.unknown_keys("metrics", metrics, &["listen"]);
        if let Some(listen) = self.string(metrics, "metrics", "listen") {
            let taken = [Some(config.listen), config.health_listen];
            match listen.parse::<SocketAddr>() {
                Ok(addr) if addr.port() != 0 && taken.contains(&Some(addr)) => self.issue(
                    "metrics.listen",
                    format!("{addr} is agent.listen or agent.health_listen already; use another port"),
                ),
                Ok(addr) => config.metrics.listen = Some(addr),
                Err(_) => self.issue(
                    "metrics.listen",
                    format!("{listen:?} is not an IP:port address such as \"127.0.0.1:9464\""),
                ),
            }
        }
    }
}
