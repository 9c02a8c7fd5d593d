//! Reaching the agent: the control-plane channel, mutual TLS with the client bundle,
//! and errors that say which of address, bundle or agent is wrong.

use std::path::PathBuf;
use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::error::{Error, Result};

/// How the shim proves who it is to the agent (mutual TLS).
///
/// Each file not given is taken from the bundle directory: `bundle_dir`, else
/// `$DPUIO_CONFIG_DIR`, else `$HOME/.config/dpuio`, which holds `ca.pem`, `client.pem`
/// and `client.key`. A `dpu-agent` started on this machine with no TLS files configured
/// writes a development bundle for its default tenant there, so a local agent needs no
/// setup; `dpuctl cert issue --tenant NAME --out DIR` makes one for any tenant.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// The client certificate (PEM); `$DPUIO_CERT` by default.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM); `$DPUIO_KEY` by default.
    pub key: Option<PathBuf>,
    /// The CA that issued the agent's certificate (PEM); `$DPUIO_CA` by default.
    pub ca: Option<PathBuf>,
    /// Where the files not named above are.
    pub bundle_dir: Option<PathBuf>,
    /// The name the agent's certificate must carry (default: the address's host).
    pub server_name: Option<String>,
}

impl TlsOptions {
    /// Files named by `$DPUIO_CERT`, `$DPUIO_KEY`, `$DPUIO_CA`, `$DPUIO_CONFIG_DIR`.
    pub fn from_env() -> TlsOptions {
        let path = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        TlsOptions {
            cert: path("DPUIO_CERT"),
            key: path("DPUIO_KEY"),
            ca: path("DPUIO_CA"),
            bundle_dir: path("DPUIO_CONFIG_DIR"),
            server_name: None,
        }
    }

    /// Only a bundle directory.
    pub fn bundle(dir: impl Into<PathBuf>) -> TlsOptions {
        TlsOptions { bundle_dir: Some(dir.into()), ..TlsOptions::default() }
    }

    fn bundle_dir(&self) -> Option<PathBuf> {
        self.bundle_dir.clone().or_else(|| {
            std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".config/dpuio"))
        })
    }

    /// The tonic TLS settings for an agent at `host`.
    fn client_config(&self, host: &str) -> Result<ClientTlsConfig> {
        let dir = self.bundle_dir();
        let pick = |given: &Option<PathBuf>, file: &str| given.clone().or_else(|| dir.as_ref().map(|d| d.join(file)));
        let files = [
            (pick(&self.cert, "client.pem"), "client certificate"),
            (pick(&self.key, "client.key"), "client key"),
            (pick(&self.ca, "ca.pem"), "CA certificate"),
        ];
        let mut pems = Vec::new();
        for (path, what) in files {
            let Some(path) = path else {
                return Err(Error::Tls { reason: format!("no {what}: $HOME is not set; pass --cert, --key and --ca") });
            };
            let pem = std::fs::read(&path).map_err(|e| Error::Tls {
                reason: format!(
                    "cannot read the {what} {}: {e}. A dpu-agent on this machine writes a development bundle to \
                     $DPUIO_CONFIG_DIR or ~/.config/dpuio on start; `dpuctl cert issue --tenant NAME --out DIR` makes \
                     one; or pass --cert/--key/--ca",
                    path.display()
                ),
            })?;
            pems.push(pem);
        }
        let [cert, key, ca] =
            <[Vec<u8>; 3]>::try_from(pems).map_err(|_| Error::Tls { reason: "internal: three files".into() })?;
        // Say which file is wrong here: rustls would only report a failed handshake.
        for (pem, marker, what) in [
            (&cert, "-----BEGIN CERTIFICATE-----", "client certificate"),
            (&key, "PRIVATE KEY-----", "client key"),
            (&ca, "-----BEGIN CERTIFICATE-----", "CA certificate"),
        ] {
            if !String::from_utf8_lossy(pem).contains(marker) {
                return Err(Error::Tls {
                    reason: format!(
                        "the {what} file holds no PEM block \"{marker}\": pass the files of a client bundle"
                    ),
                });
            }
        }
        let name =
            self.server_name.clone().unwrap_or_else(|| host.trim_start_matches('[').trim_end_matches(']').to_owned());
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key))
            .domain_name(name))
    }
}

/// Where the agent is, as parsed from an address: the URL to dial and whether it is
/// plaintext.
fn agent_endpoint(address: &str) -> Result<(Endpoint, bool)> {
    let bad = |reason: String| Error::Address { address: address.to_owned(), reason };
    let (plaintext, rest) = match address.split_once("://") {
        Some(("http", rest)) => (true, rest),
        Some(("https", rest)) => (false, rest),
        Some((scheme, _)) => {
            return Err(bad(format!(
                "unknown scheme {scheme:?}: use HOST:PORT (mTLS) or http://HOST:PORT (plaintext)"
            )));
        }
        None => (false, address),
    };
    let url = format!("{}://{rest}", if plaintext { "http" } else { "https" });
    let endpoint = Endpoint::from_shared(url).map_err(|e| bad(e.to_string()))?;
    Ok((endpoint, plaintext))
}

/// Open the control-plane channel to the agent at `address`.
///
/// Reachability comes first: when the client bundle is not usable *and* nothing answers
/// at the address, the error is [`Error::Connect`] (UNAVAILABLE, worth retrying) and its
/// reason names the bundle problem too. An agent started on this machine writes the
/// development bundle when it starts, so a job launched before its agent has a reason to
/// wait and retry; telling such a user only about certificates would send them to the
/// wrong fix. When the agent does answer, a bad bundle is [`Error::Tls`]
/// (INVALID_ARGUMENT), as before. The same rule holds for the C ABI, Python and the CLI,
/// which all attach through here.
pub(super) async fn connect_channel(address: &str, tls: &TlsOptions, timeout: Duration) -> Result<Channel> {
    let (endpoint, plaintext) = agent_endpoint(address)?;
    let endpoint = endpoint.connect_timeout(timeout).tcp_nodelay(true);
    let endpoint = if plaintext {
        endpoint
    } else {
        let uri = endpoint.uri().clone();
        let host = uri.host().unwrap_or("localhost").to_owned();
        let configured = tls
            .client_config(&host)
            .and_then(|config| endpoint.tls_config(config).map_err(|e| Error::Tls { reason: error_chain(&e) }));
        match configured {
            Ok(endpoint) => endpoint,
            Err(Error::Tls { reason }) => {
                return Err(match probe(&uri, timeout).await {
                    Ok(()) => Error::Tls { reason },
                    Err(unreachable) => Error::Connect {
                        address: address.to_owned(),
                        reason: format!("{unreachable}; besides, the client bundle is not usable: {reason}"),
                    },
                });
            }
            Err(other) => return Err(other),
        }
    };
    endpoint.connect().await.map_err(|source| connect_error(address, &source))
}

/// Whether anything accepts a TCP connection at `uri` within `timeout`.
async fn probe(uri: &tonic::transport::Uri, timeout: Duration) -> std::result::Result<(), String> {
    let host = uri.host().unwrap_or("localhost").trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(443);
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("tcp connect error: {e}")),
        Err(_) => Err(format!("no answer within {} ms", timeout.as_millis())),
    }
}

/// Why a connection failed: an agent certificate this client does not trust is a TLS
/// setting to fix, not an agent that is down.
fn connect_error(address: &str, source: &tonic::transport::Error) -> Error {
    let reason = error_chain(source);
    if reason.contains("invalid peer certificate") {
        return Error::Tls {
            reason: format!(
                "the agent at {address} presented a certificate this client does not trust ({reason}): use the ca.pem of \
                 the agent that issued your bundle (--ca), or --tls-server-name with a name the certificate carries"
            ),
        };
    }
    if reason.contains("InvalidContentType") || reason.contains("corrupt message") {
        return Error::Tls {
            reason: format!(
                "the agent at {address} does not speak TLS ({reason}): an agent with [tls] mode = \"off\" is reached \
                 with http://{address}"
            ),
        };
    }
    Error::Connect { address: address.to_owned(), reason }
}

/// Why Attach, the first call on a channel, failed. A plaintext client (`http://`)
/// reaching an agent that serves mutual TLS gets only "operation was canceled", "h2
/// protocol error" or "transport error" from tonic (which one depends on timing): the
/// agent drops the connection at the HTTP/2 preface, before any answer.
pub(super) fn attach_error(address: &str, status: tonic::Status) -> Error {
    let dropped = matches!(
        status.code(),
        tonic::Code::Cancelled | tonic::Code::Unknown | tonic::Code::Unavailable | tonic::Code::Internal
    ) && ["transport error", "h2 protocol error", "operation was canceled"]
        .iter()
        .any(|m| status.message().contains(m));
    if dropped && address.starts_with("http://") {
        return Error::Connect {
            address: address.to_owned(),
            reason: format!(
                "the agent closed the connection without an answer ({}); it most likely serves mutual TLS: \
                 connect to HOST:PORT without http:// with a client bundle (--cert/--key/--ca, or \
                 DPUIO_CONFIG_DIR); http:// is for agents with [tls] mode = \"off\"",
                status.message()
            ),
        };
    }
    Error::from_status("attach", status)
}

/// An error and its sources on one line: tonic's transport errors say little at the top.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Client, ConnectOptions};

    /// Options for `address` whose client bundle directory does not exist, whatever is
    /// in the home directory or the environment of the test process.
    fn without_bundle(address: &str) -> ConnectOptions {
        let missing = std::env::temp_dir().join(format!("dpuio-no-bundle-{}", std::process::id()));
        ConnectOptions {
            agent: address.to_owned(),
            tls: TlsOptions::bundle(missing),
            connect_timeout: Duration::from_secs(2),
            capability_token: String::new(),
            ..ConnectOptions::default()
        }
    }

    fn connect_error_of(options: ConnectOptions) -> Error {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        match runtime.block_on(Client::connect(options)) {
            Ok(_) => panic!("connected with no agent and no client bundle"),
            Err(e) => e,
        }
    }

    #[test]
    fn no_bundle_and_no_agent_is_unreachable_and_names_the_bundle() {
        let e = connect_error_of(without_bundle("127.0.0.1:1"));
        let text = e.to_string();
        assert!(matches!(e, Error::Connect { .. }), "{e:?}");
        assert!(text.starts_with("cannot reach the agent at 127.0.0.1:1: "), "{text}");
        assert!(text.contains("the client bundle is not usable: cannot read the client certificate"), "{text}");
    }

    #[test]
    fn no_bundle_with_something_listening_is_a_tls_setting() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let e = connect_error_of(without_bundle(&address));
        assert!(matches!(e, Error::Tls { .. }), "{e:?}");
        assert!(e.to_string().contains("cannot read the client certificate"), "{e}");
    }

    #[test]
    fn plaintext_without_an_agent_is_unreachable() {
        let e = connect_error_of(without_bundle("http://127.0.0.1:1"));
        assert!(matches!(e, Error::Connect { .. }), "{e:?}");
        assert!(!e.to_string().contains("bundle"), "a plaintext address needs no bundle: {e}");
    }
}
