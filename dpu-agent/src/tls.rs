//! Who is calling: the control plane's TLS listener and the check in front of every
//! service.
//!
//! With `[tls] mode = "mtls"` (the default) the listener speaks TLS 1.3 only and asks
//! every client for a certificate. The handshake accepts a missing or foreign
//! certificate (it still proves the client holds the key of whatever it sent), so that
//! [`Authenticator`] can refuse each request with UNAUTHENTICATED and a reason, rather
//! than the client seeing a bare TLS alert. A request passes when the certificate
//! chain leads to the client CA, its SAN URI is `spiffe://<trust-domain>/tenant/<name>`
//! and that tenant is configured now. The tenant is then handed to the services as a
//! [`Caller`] in the request's extensions; sessions, handles and regions are bound to it.
//!
//! On first start with no certificate files configured, a development CA and server
//! certificate are made under `data_dir/pki`, and a client bundle for the default tenant
//! is written where `dpuio`, the shim library and the Python package look by default
//! (`$DPUIO_CONFIG_DIR`, else `$HOME/.config/dpuio`), so one machine stays zero-config.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dpuio_auth::pki::{self, DeferredClientVerifier, DevPki, Identity};
use rustls::pki_types::{CertificateDer, UnixTime};
use tokio::net::TcpListener;
use tonic::Status;

use crate::caller::Caller;
use crate::config::Config;
use crate::runtime::lock;
use crate::serve_error::ServeError;
use crate::state::Agent;

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a verified certificate is trusted before its chain is checked again.
const VERIFIED_FOR: Duration = Duration::from_secs(60);
/// Verified certificates remembered at once.
const CACHE_ENTRIES: usize = 1024;
/// Days a development client certificate is valid.
pub const DEV_CLIENT_VALIDITY_DAYS: u32 = 365;

/// The listener's TLS setup.
pub struct ControlTls {
    pub server_config: Arc<rustls::ServerConfig>,
    pub verifier: Arc<DeferredClientVerifier>,
    pub trust_domain: String,
    /// The development PKI, when no certificate files are configured (it can issue
    /// client certificates for `dpuctl cert issue`).
    pub dev_pki: Option<DevPki>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn read_pem(what: &'static str, path: &Path) -> Result<String, ServeError> {
    std::fs::read_to_string(path)
        .map_err(|e| ServeError::Tls(format!("cannot read the {what} {}: {e}", path.display())))
}

/// The directory the development client bundle goes to (and clients read from).
pub fn default_client_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DPUIO_CONFIG_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".config/dpuio"))
}

/// Set up TLS from the config: operator files, or the development PKI (made on first
/// start). `None` when the config turns TLS off.
pub fn prepare(config: &Config) -> Result<Option<ControlTls>, ServeError> {
    if !config.tls.mtls {
        return Ok(None);
    }
    let tls = &config.tls;
    if let Some(files) = &tls.files {
        let (cert, key, ca) = (
            read_pem("server certificate", &files.cert)?,
            read_pem("server key", &files.key)?,
            read_pem("client CA", &files.client_ca)?,
        );
        let (server_config, verifier) =
            pki::deferred_server_config(&cert, &key, &ca, provider()).map_err(|e| ServeError::Tls(e.to_string()))?;
        return Ok(Some(ControlTls {
            server_config: Arc::new(server_config),
            verifier,
            trust_domain: tls.trust_domain.clone(),
            dev_pki: None,
        }));
    }
    let mut names: Vec<String> = Vec::new();
    if !config.listen.ip().is_unspecified() {
        names.push(config.listen.ip().to_string());
    }
    if let Ok(host) = rustix::system::uname().nodename().to_str()
        && !host.is_empty()
        && pki::validate_trust_domain(&host.to_ascii_lowercase()).is_ok()
    {
        names.push(host.to_ascii_lowercase());
    }
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let dir = config.data_dir.join("pki");
    let dev = DevPki::load_or_create(&dir, &tls.trust_domain, &name_refs)
        .map_err(|e| ServeError::Tls(format!("development PKI in {}: {e}", dir.display())))?;
    tracing::info!(dir = %dir.display(), server_certificate = ?dev.server_status(), "development PKI ready");
    let (server_config, verifier) =
        pki::deferred_server_config(dev.server().cert_pem(), dev.server().key_pem(), dev.ca().cert_pem(), provider())
            .map_err(|e| ServeError::Tls(e.to_string()))?;
    let bundle_dir = tls.client_bundle_dir.clone().or_else(default_client_dir);
    if let (Some(tenant), Some(dir)) = (config.default_tenant(), bundle_dir)
        && let Err(e) = write_dev_bundle(&dev, &tenant.name, &dir)
    {
        // Not fatal: clients can still use `dpuctl cert issue` or --cert/--key/--ca.
        tracing::warn!(error = %e, "no development client bundle");
    }
    Ok(Some(ControlTls {
        server_config: Arc::new(server_config),
        verifier,
        trust_domain: tls.trust_domain.clone(),
        dev_pki: Some(dev),
    }))
}

/// Write a client bundle for `tenant` into `dir` unless one from this CA for this
/// tenant is already there.
fn write_dev_bundle(dev: &DevPki, tenant: &str, dir: &Path) -> Result<(), ServeError> {
    let ca_matches = std::fs::read_to_string(dir.join(pki::CA_CERT_FILE)).is_ok_and(|ca| ca == dev.ca().cert_pem());
    let cert_matches = std::fs::read(dir.join(pki::CLIENT_CERT_FILE)).ok().is_some_and(|pem| {
        rustls::pki_types::pem::PemObject::pem_slice_iter(&pem)
            .next()
            .and_then(|c: Result<CertificateDer<'static>, _>| c.ok())
            .and_then(|der| pki::identity_from_cert_der(&der, dev.trust_domain()).ok())
            == Some(Identity::Tenant(tenant.to_owned()))
    });
    if ca_matches && cert_matches && dir.join(pki::CLIENT_KEY_FILE).exists() {
        return Ok(());
    }
    dev.issue_client(tenant, dir, DEV_CLIENT_VALIDITY_DAYS).map_err(|e| {
        ServeError::Tls(format!(
            "cannot write the development client bundle to {}: {e} (set [tls] client_bundle_dir or DPUIO_CONFIG_DIR)",
            dir.display()
        ))
    })?;
    tracing::info!(dir = %dir.display(), tenant, "wrote a development client bundle (ca.pem, client.pem, client.key)");
    Ok(())
}

/// TLS connections from `listener`, each handshake on its own task so a slow client
/// cannot hold up the others.
pub fn tls_incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    closed: Option<crate::connection::ClosedConnections>,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio_rustls::server::TlsStream<crate::connection::Tracked>>> {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let _ = stream.set_nodelay(true);
            let stream = crate::connection::Tracked::new(stream, closed.clone());
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// A leaf certificate's checked outcome (its tenant, or why not) and when it was checked.
type Verified = (Instant, Result<String, String>);

/// The check in front of every service but health: establishes the [`Caller`].
#[derive(Clone)]
pub struct Authenticator {
    agent: Arc<Agent>,
    tls: Option<(Arc<DeferredClientVerifier>, String)>,
    verified: Arc<Mutex<HashMap<Vec<u8>, Verified>>>,
}

impl Authenticator {
    pub fn new(agent: Arc<Agent>, tls: Option<&ControlTls>) -> Authenticator {
        Authenticator {
            agent,
            tls: tls.map(|t| (t.verifier.clone(), t.trust_domain.clone())),
            verified: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The tonic interceptor.
    pub fn intercept(&self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        let caller = self.caller(request.peer_certs().as_deref().map(Vec::as_slice))?;
        request.extensions_mut().insert(caller);
        Ok(request)
    }

    fn caller(&self, chain: Option<&[CertificateDer<'static>]>) -> Result<Caller, Status> {
        let Some((verifier, trust_domain)) = &self.tls else {
            return Ok(Caller::Unauthenticated);
        };
        let chain = chain.filter(|c| !c.is_empty()).ok_or_else(|| {
            Status::unauthenticated(pki::IdentityError::NoPeerCertificate.to_string() + " (dpuio finds ca.pem, client.pem and client.key in $DPUIO_CONFIG_DIR or ~/.config/dpuio, or takes --cert/--key/--ca)")
        })?;
        let leaf = chain[0].as_ref();
        let now = Instant::now();
        let cached = lock(&self.verified).get(leaf).filter(|(at, _)| now - *at < VERIFIED_FOR).cloned();
        let outcome = match cached {
            Some((_, outcome)) => outcome,
            None => {
                let outcome = verifier
                    .check(chain, UnixTime::now())
                    .and_then(|()| pki::identity_from_peer_certs(chain, trust_domain))
                    .map_err(|e| e.to_string())
                    .and_then(|identity| match identity {
                        Identity::Tenant(name) => Ok(name),
                        Identity::Admin => Err("an admin certificate speaks for no tenant; the Admin service is on the agent's Unix socket (dpuctl)".to_owned()),
                    });
                let mut verified = lock(&self.verified);
                if verified.len() >= CACHE_ENTRIES {
                    verified.clear();
                }
                verified.insert(leaf.to_vec(), (now, outcome.clone()));
                outcome
            }
        };
        let tenant = outcome.map_err(Status::unauthenticated)?;
        if !self.agent.has_tenant(&tenant) {
            return Err(Status::unauthenticated(format!(
                "the client certificate is for tenant {tenant:?}, which is not configured on this agent"
            )));
        }
        Ok(Caller::Tenant(tenant))
    }
}
