//! The connection options of dpuio's command lines, `dpuio` and `dpuio-bench`: one
//! spelling of each flag and of its `DPUIO_*` variable, and one way from them to
//! [`ConnectOptions`]. `dpuio bench` hands them to `dpuio-bench` through those
//! variables ([`ConnectArgs::to_env`]).

use std::ffi::OsString;
use std::path::PathBuf;

use crate::{ConnectOptions, DEFAULT_AGENT, TlsOptions};

/// How to reach and attach to the agent.
#[derive(clap::Args, Debug, Clone)]
pub struct ConnectArgs {
    /// Agent address: HOST:PORT (mutual TLS) or http://HOST:PORT (plaintext, agents with [tls] mode = "off").
    #[arg(long, env = "DPUIO_AGENT", default_value = DEFAULT_AGENT, global = true)]
    pub agent: String,
    /// Tenant to attach as (plaintext agents only: with TLS the certificate decides; default: the agent's default tenant).
    #[arg(long, env = "DPUIO_TENANT", default_value = "", hide_default_value = true, global = true)]
    pub tenant: String,
    /// Client certificate (PEM) [default: client.pem in $DPUIO_CONFIG_DIR or ~/.config/dpuio].
    #[arg(long, env = "DPUIO_CERT", global = true)]
    pub cert: Option<PathBuf>,
    /// Client private key (PEM) [default: client.key beside the certificate bundle].
    #[arg(long, env = "DPUIO_KEY", global = true)]
    pub key: Option<PathBuf>,
    /// CA certificate that signed the agent's certificate (PEM) [default: ca.pem in the bundle].
    #[arg(long, env = "DPUIO_CA", global = true)]
    pub ca: Option<PathBuf>,
    /// Name the agent's certificate must carry [default: the host of --agent].
    #[arg(long, env = "DPUIO_TLS_SERVER_NAME", global = true)]
    pub tls_server_name: Option<String>,
    /// Capability token to attach with (e.g. from `dpuio delegate`), narrowing what this command may do.
    #[arg(
        long,
        env = "DPUIO_TOKEN",
        default_value = "",
        hide_default_value = true,
        hide_env_values = true,
        global = true
    )]
    pub token: String,
    /// Network interface (as `ip link` names it) for the network transports (ucx-tcp,
    /// ofi-tcp, UCX's part of auto), for machines with several or an agent in another
    /// network namespace [default: the transports choose].
    #[arg(long, env = "DPUIO_INTERFACE", global = true)]
    pub interface: Option<String>,
}

impl ConnectArgs {
    /// Options to attach as `client_name`, without a data plane: the TLS files named
    /// here, else those of `$DPUIO_CERT`, `$DPUIO_KEY`, `$DPUIO_CA`, `$DPUIO_CONFIG_DIR`.
    pub fn connect_options(&self, client_name: &str) -> ConnectOptions {
        let mut tls = TlsOptions::from_env();
        tls.cert = self.cert.clone().or(tls.cert);
        tls.key = self.key.clone().or(tls.key);
        tls.ca = self.ca.clone().or(tls.ca);
        tls.server_name = self.tls_server_name.clone();
        ConnectOptions {
            agent: self.agent.clone(),
            tenant: self.tenant.clone(),
            client_name: client_name.to_owned(),
            tls,
            capability_token: self.token.clone(),
            ..ConnectOptions::default()
        }
    }

    /// The `DPUIO_*` variables that give another program parsing [`ConnectArgs`] these
    /// values: by environment rather than arguments, so that a token never shows on a
    /// command line (`ps`). Unset options are left out; the other program inherits the
    /// rest of the environment anyway.
    pub fn to_env(&self) -> Vec<(&'static str, OsString)> {
        let mut env = vec![("DPUIO_AGENT", OsString::from(&self.agent))];
        let texts = [("DPUIO_TENANT", &self.tenant), ("DPUIO_TOKEN", &self.token)];
        env.extend(texts.into_iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (k, v.into())));
        let paths = [("DPUIO_CERT", &self.cert), ("DPUIO_KEY", &self.key), ("DPUIO_CA", &self.ca)];
        env.extend(paths.into_iter().filter_map(|(k, v)| Some((k, v.clone()?.into_os_string()))));
        let names = [("DPUIO_TLS_SERVER_NAME", &self.tls_server_name), ("DPUIO_INTERFACE", &self.interface)];
        env.extend(names.into_iter().filter_map(|(k, v)| Some((k, v.clone()?.into()))));
        env
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        connect: ConnectArgs,
    }

    #[test]
    fn the_variables_carry_every_option_given() {
        let cli = Cli::try_parse_from([
            "x",
            "--agent=http://h:1",
            "--tenant=t",
            "--cert=c.pem",
            "--key=c.key",
            "--ca=ca.pem",
            "--tls-server-name=n",
            "--token=s",
            "--interface=eth1",
        ])
        .expect("parses");
        let env = cli.connect.to_env();
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_str().expect("utf-8").to_owned());
        for (k, v) in [
            ("DPUIO_AGENT", "http://h:1"),
            ("DPUIO_TENANT", "t"),
            ("DPUIO_CERT", "c.pem"),
            ("DPUIO_KEY", "c.key"),
            ("DPUIO_CA", "ca.pem"),
            ("DPUIO_TLS_SERVER_NAME", "n"),
            ("DPUIO_TOKEN", "s"),
            ("DPUIO_INTERFACE", "eth1"),
        ] {
            assert_eq!(get(k).as_deref(), Some(v), "{k}");
        }
    }
}
