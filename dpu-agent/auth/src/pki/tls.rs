//! The agent's rustls configurations: TLS 1.3, ALPN `h2`, and client certificates
//! checked during the handshake ([`server_config`]) or deferred to every request
//! ([`deferred_server_config`]), so that a refusal can say why.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::identity::IdentityError;
use super::{ALPN_H2, PkiError, tls_err};

/// A rustls server configuration for the agent's gRPC listener: presents
/// `server_cert_pem` (a chain, leaf first) with `server_key_pem`, **requires** a client
/// certificate chaining to a CA in `client_ca_pem` (rustls's `WebPkiClientVerifier`:
/// signature chain, validity period, clientAuth EKU), TLS 1.3 only, ALPN `h2` (tonic
/// needs it).
///
/// Use it with `tokio_rustls::TlsAcceptor` and `tonic::transport::Server::serve_with_incoming`;
/// `Request::peer_certs()` then returns the verified client chain.
pub fn server_config(
    server_cert_pem: &str,
    server_key_pem: &str,
    client_ca_pem: &str,
    provider: Arc<CryptoProvider>,
) -> Result<rustls::ServerConfig, PkiError> {
    let chain =
        CertificateDer::pem_slice_iter(server_cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>().map_err(tls_err)?;
    let key = PrivateKeyDer::from_pem_slice(server_key_pem.as_bytes()).map_err(tls_err)?;
    let verifier = client_verifier(client_ca_pem, provider.clone())?;
    tls13_config(chain, key, verifier, provider)
}

/// The client certificate verifier [`server_config`] uses: client certificates are
/// mandatory and must chain to one of the CAs in `client_ca_pem`.
pub fn client_verifier(
    client_ca_pem: &str,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, PkiError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
        roots.add(cert.map_err(tls_err)?).map_err(tls_err)?;
    }
    if roots.is_empty() {
        return Err(PkiError::Tls { reason: "the client CA PEM holds no certificate".into() });
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build().map_err(tls_err)
}

/// A client-certificate verifier that lets the handshake finish without a valid
/// client certificate, so the request can be refused with a gRPC status that says why
/// (UNAUTHENTICATED: no certificate, another CA, expired) instead of a bare TLS alert.
///
/// It still checks, during the handshake, that the client holds the private key of
/// whatever certificate it sent (the TLS 1.3 CertificateVerify signature); only the
/// chain check is deferred. Every request must then pass [`DeferredClientVerifier::check`]
/// (the agent does it in one interceptor in front of every service but health).
#[derive(Debug)]
pub struct DeferredClientVerifier {
    strict: Arc<dyn ClientCertVerifier>,
}

impl DeferredClientVerifier {
    /// A verifier deferring to the chain checks of a strict one for `client_ca_pem`.
    pub fn new(client_ca_pem: &str, provider: Arc<CryptoProvider>) -> Result<DeferredClientVerifier, PkiError> {
        Ok(DeferredClientVerifier { strict: client_verifier(client_ca_pem, provider)? })
    }

    /// The deferred check: the chain leads to the client CA and is valid at `now`.
    pub fn check(&self, chain: &[CertificateDer<'_>], now: rustls_pki_types::UnixTime) -> Result<(), IdentityError> {
        let (leaf, intermediates) = chain.split_first().ok_or(IdentityError::NoPeerCertificate)?;
        self.strict
            .verify_client_cert(leaf, intermediates, now)
            .map(|_| ())
            .map_err(|e| IdentityError::NotTrusted { reason: e.to_string() })
    }
}

impl ClientCertVerifier for DeferredClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.strict.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        // Deferred to `check`, on every request.
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.strict.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.strict.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.strict.supported_verify_schemes()
    }
}

/// A TLS 1.3 server config whose client-certificate check is deferred to the returned
/// verifier's [`DeferredClientVerifier::check`], which the caller must run on every
/// request.
pub fn deferred_server_config(
    server_cert_pem: &str,
    server_key_pem: &str,
    client_ca_pem: &str,
    provider: Arc<CryptoProvider>,
) -> Result<(rustls::ServerConfig, Arc<DeferredClientVerifier>), PkiError> {
    let chain =
        CertificateDer::pem_slice_iter(server_cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>().map_err(tls_err)?;
    if chain.is_empty() {
        return Err(PkiError::Tls { reason: "the server certificate PEM holds no certificate".into() });
    }
    let key = PrivateKeyDer::from_pem_slice(server_key_pem.as_bytes()).map_err(tls_err)?;
    let verifier = Arc::new(DeferredClientVerifier::new(client_ca_pem, provider.clone())?);
    Ok((tls13_config(chain, key, verifier.clone(), provider)?, verifier))
}

/// TLS 1.3 only, `verifier` on client certificates, `chain` and `key` presented, ALPN
/// `h2` (tonic needs it).
fn tls13_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    verifier: Arc<dyn ClientCertVerifier>,
    provider: Arc<CryptoProvider>,
) -> Result<rustls::ServerConfig, PkiError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(tls_err)?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}
