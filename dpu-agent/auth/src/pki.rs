//! Who is calling: a development PKI, client bundles and SPIFFE identities.
//!
//! # Files
//!
//! [`DevPki::load_or_create`] keeps, in its directory (created with mode `0700`):
//!
//! | file | contents | mode |
//! |---|---|---|
//! | `ca.pem` | development CA certificate (ECDSA P-256, 10 years, path length 0) | `0644` |
//! | `ca.key` | its private key, PKCS#8 PEM | `0600` |
//! | `server.pem` | agent certificate, SANs `localhost`, `127.0.0.1`, `::1` and the configured names, EKU serverAuth, 1 year | `0644` |
//! | `server.key` | its private key, PKCS#8 PEM | `0600` |
//!
//! [`issue_client`] and [`issue_admin`] write a bundle for one client into a directory of
//! its own: `client.pem` (EKU clientAuth, one SAN URI, the SPIFFE ID), `client.key`
//! (`0600`) and `ca.pem` (to verify the agent). That is everything `host-shim` (or
//! `grpcurl -cacert ca.pem -cert client.pem -key client.key`) needs.
//!
//! A private key file that group or others can read is refused with
//! [`PkiError::KeyPermissions`], never silently fixed: something already exposed the key.
//!
//! # Identities
//!
//! A client is identified by the single URI SAN of its certificate, an X.509-SVID style
//! SPIFFE ID: `spiffe://<trust-domain>/tenant/<name>` for a tenant,
//! `spiffe://<trust-domain>/admin` for the administrator ([`Identity`]).
//! [`identity_from_cert_der`] extracts it and checks the trust domain and the name.
//!
//! It does **not** validate the chain: that is the TLS layer's job, done during the
//! handshake by rustls's `WebPkiClientVerifier` built from the CA roots (see
//! [`server_config`] and [`client_verifier`]). Only a certificate that passed it reaches
//! `tonic::Request::peer_certs()`, so the agent must call [`identity_from_peer_certs`] on
//! those, never on a certificate taken from a request body.
//!
//! # What this module does not do
//!
//! Revocation (CRLs), rotation of the CA, or anything production-grade about key
//! custody: the development CA is for one box and CI. Production deployments point the
//! agent at their own CA and server certificate and still use [`server_config`] and
//! [`identity_from_peer_certs`].

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use time::{Duration, OffsetDateTime};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use zeroize::Zeroizing;

use crate::files::{self, FileError};
use crate::names::{self, NameError};

mod identity;

use identity::parse_cert;
pub use identity::{Identity, IdentityError, identity_from_cert_der, identity_from_peer_certs};

/// File name of the CA certificate (in the PKI directory and in client bundles).
pub const CA_CERT_FILE: &str = "ca.pem";
/// File name of the CA private key.
pub const CA_KEY_FILE: &str = "ca.key";
/// File name of the agent's certificate.
pub const SERVER_CERT_FILE: &str = "server.pem";
/// File name of the agent's private key.
pub const SERVER_KEY_FILE: &str = "server.key";
/// File name of a client certificate in a bundle.
pub const CLIENT_CERT_FILE: &str = "client.pem";
/// File name of a client private key in a bundle.
pub const CLIENT_KEY_FILE: &str = "client.key";

/// Lifetime of a new development CA.
pub const CA_VALIDITY_DAYS: u32 = 3650;
/// Lifetime of a new server certificate.
pub const SERVER_VALIDITY_DAYS: u32 = 365;
/// A loaded server certificate with less than this left is renewed.
pub const SERVER_RENEW_BEFORE_DAYS: u32 = 30;
/// Longest lifetime [`issue_client`] accepts.
pub const MAX_CLIENT_VALIDITY_DAYS: u32 = 3650;
/// Most extra server names [`DevPki::load_or_create`] accepts.
pub const MAX_SERVER_NAMES: usize = 64;
/// Longest trust domain (SPIFFE: 255 bytes).
pub const MAX_TRUST_DOMAIN_BYTES: usize = 255;

/// Certificates are valid from a little before they were made, for clock skew
/// between the agent and its clients.
const BACKDATE: Duration = Duration::hours(1);

/// The ALPN protocol tonic requires.
const ALPN_H2: &[u8] = b"h2";

/// Why the PKI could not be loaded, created or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PkiError {
    /// A file could not be read, written or created.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A private key file can be read by group or others. It may already have leaked:
    /// replace it (or, if you are sure it did not, `chmod 600` it).
    #[error("{}: private key is readable by group or others (mode {mode:03o}); refusing to use it: \
             check who could read it, then `chmod 600` it or delete it to have a new one made", path.display())]
    KeyPermissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A key or certificate path is a directory, a device, or too large to be one.
    #[error("{}: not a key or certificate file ({reason})", path.display())]
    NotAKeyFile {
        /// The path.
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
    /// Only one of `ca.pem` and `ca.key` exists. A new CA would silently invalidate
    /// every client bundle issued so far, so this is left to the operator.
    #[error("{} exists but {} does not: restore it, or remove both to create a new CA \
             (which invalidates all client certificates issued so far)", present.display(), missing.display())]
    IncompleteCa {
        /// The file that exists.
        present: PathBuf,
        /// The file that is missing.
        missing: PathBuf,
    },
    /// A PEM file does not hold what it should (corrupt, wrong kind, wrong algorithm).
    #[error("{}: {reason}", path.display())]
    InvalidPem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The CA certificate and key on disk do not belong together.
    #[error("{} does not match the key in {}", cert.display(), key.display())]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// The development CA has expired. Remove `ca.pem` and `ca.key` to create a new one,
    /// then reissue client bundles.
    #[error("{}: the development CA has expired; remove ca.pem and ca.key to create a new one \
             and reissue client bundles", path.display())]
    CaExpired {
        /// The CA certificate file.
        path: PathBuf,
    },
    /// The trust domain is not a valid SPIFFE trust domain name.
    #[error("trust domain {value:?}: {reason}")]
    BadTrustDomain {
        /// The offending value (shortened).
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A server name is neither an IP address nor a valid DNS name, or there are too many.
    #[error("server name {name:?}: {reason}")]
    BadServerName {
        /// The offending name (shortened).
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The tenant name for a client certificate is invalid.
    #[error(transparent)]
    BadTenant(#[from] NameError),
    /// The requested certificate lifetime is zero or above [`MAX_CLIENT_VALIDITY_DAYS`].
    #[error("validity of {days} days: must be 1 to {MAX_CLIENT_VALIDITY_DAYS} days")]
    BadValidity {
        /// The requested number of days.
        days: u32,
    },
    /// rcgen could not generate a key or sign a certificate.
    #[error("could not generate the {what}: {reason}")]
    Generate {
        /// What was being generated.
        what: &'static str,
        /// rcgen's error.
        reason: String,
    },
    /// rustls refused the certificates or keys when building a TLS configuration.
    #[error("TLS configuration: {reason}")]
    Tls {
        /// rustls's error.
        reason: String,
    },
}

impl From<FileError> for PkiError {
    fn from(e: FileError) -> Self {
        match e {
            FileError::Io { path, source } => PkiError::Io { path, source },
            FileError::Permissions { path, mode } => PkiError::KeyPermissions { path, mode },
            FileError::NotAKeyFile { path, reason } => PkiError::NotAKeyFile { path, reason },
        }
    }
}

fn generate_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |e| PkiError::Generate { what, reason: e.to_string() }
}

fn tls_err(e: impl fmt::Display) -> PkiError {
    PkiError::Tls { reason: e.to_string() }
}

/// The development certificate authority: its certificate, and the key to sign with.
///
/// Holds a private key: no `Debug`, no `Clone`.
pub struct CertificateAuthority {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    cert_path: PathBuf,
}

impl CertificateAuthority {
    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Where the CA certificate is stored.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// A root store holding only this CA, for client or server verifiers.
    pub fn root_store(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        // Our own certificate, parsed when loaded: cannot fail.
        let (added, _) = roots.add_parsable_certificates([self.cert_der.clone()]);
        debug_assert_eq!(added, 1);
        roots
    }

    /// Load `ca.pem` and `ca.key`, checking that they belong together and that the CA
    /// has not expired.
    fn load(cert_path: &Path, key_path: &Path) -> Result<CertificateAuthority, PkiError> {
        let cert_pem = files::read_public(cert_path)?;
        let key_pem = files::read_secret(key_path)?;
        let key = KeyPair::from_pem(&key_pem)
            .map_err(|e| PkiError::InvalidPem { path: key_path.to_owned(), reason: format!("CA key: {e}") })?;
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| PkiError::InvalidPem { path: cert_path.to_owned(), reason: format!("CA certificate: {e}") })?;
        let cert =
            parse_cert(&cert_der).map_err(|reason| PkiError::InvalidPem { path: cert_path.to_owned(), reason })?;
        if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(PkiError::KeyMismatch { cert: cert_path.to_owned(), key: key_path.to_owned() });
        }
        if cert.validity().not_after.timestamp() <= OffsetDateTime::now_utc().unix_timestamp() {
            return Err(PkiError::CaExpired { path: cert_path.to_owned() });
        }
        let issuer = Issuer::from_ca_cert_der(&cert_der, key)
            .map_err(|e| PkiError::InvalidPem { path: cert_path.to_owned(), reason: format!("CA certificate: {e}") })?;
        Ok(CertificateAuthority { cert_pem, cert_der, issuer, cert_path: cert_path.to_owned() })
    }

    /// Make a new CA and store it (key first, so a crash never leaves a certificate
    /// without its key).
    fn create(cert_path: &Path, key_path: &Path, trust_domain: &str) -> Result<CertificateAuthority, PkiError> {
        let key = KeyPair::generate().map_err(generate_err("CA key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(&format!("dpuio development CA ({trust_domain})"));
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        set_validity(&mut params, CA_VALIDITY_DAYS);
        let cert = params.self_signed(&key).map_err(generate_err("CA certificate"))?;
        files::write_secret(key_path, key.serialize_pem().as_bytes())?;
        files::write_public(cert_path, cert.pem().as_bytes())?;
        let cert_der = cert.der().clone();
        Ok(CertificateAuthority {
            cert_pem: cert.pem(),
            cert_der,
            issuer: Issuer::new(params, key),
            cert_path: cert_path.to_owned(),
        })
    }
}

/// A certificate with its private key, as stored on disk. Holds a private key: no
/// `Debug`, no `Clone`.
pub struct CertifiedKey {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    key_pem: Zeroizing<String>,
    key_der: PrivateKeyDer<'static>,
    cert_path: PathBuf,
    key_path: PathBuf,
}

impl CertifiedKey {
    fn new(
        cert_pem: String,
        cert_der: CertificateDer<'static>,
        key_pem: Zeroizing<String>,
        cert_path: PathBuf,
        key_path: PathBuf,
    ) -> Result<CertifiedKey, PkiError> {
        let key_der = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| PkiError::InvalidPem { path: key_path.clone(), reason: e.to_string() })?;
        Ok(CertifiedKey { cert_pem, cert_der, key_pem, key_der, cert_path, key_path })
    }

    /// The certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The certificate, DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// The private key, PKCS#8 PEM.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The private key, DER, for rustls.
    pub fn private_key_der(&self) -> PrivateKeyDer<'static> {
        self.key_der.clone_key()
    }

    /// Where the certificate is stored.
    pub fn cert_path(&self) -> &Path {
        &self.cert_path
    }

    /// Where the private key is stored.
    pub fn key_path(&self) -> &Path {
        &self.key_path
    }
}

/// What [`DevPki::load_or_create`] did with the server certificate, for the agent's log.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerCertStatus {
    /// Loaded from disk, still valid for all requested names.
    Loaded,
    /// Made because it did not exist (first start).
    Created,
    /// Made again because the stored one was unusable; the reason says why.
    Renewed {
        /// Why the old one was replaced.
        reason: String,
    },
}

/// The development PKI of one agent: the CA and the agent's server certificate.
///
/// Holds private keys: no `Debug`, no `Clone`.
pub struct DevPki {
    dir: PathBuf,
    trust_domain: String,
    ca: CertificateAuthority,
    server: CertifiedKey,
    server_status: ServerCertStatus,
}

impl DevPki {
    /// Load the PKI from `dir`, creating what is missing (see the module documentation
    /// for the files).
    ///
    /// - No CA: a new one is made. Only one of `ca.pem`/`ca.key`: error
    ///   ([`PkiError::IncompleteCa`]). An expired CA: error.
    /// - The server certificate is made again (see [`DevPki::server_status`]) if it is
    ///   missing, unreadable as a certificate, not signed by this CA, not valid for
    ///   `localhost`, `127.0.0.1`, `::1` and every name in `server_names`, or has less
    ///   than [`SERVER_RENEW_BEFORE_DAYS`] left.
    /// - A private key readable by group or others is an error, never regenerated over.
    ///
    /// `server_names` are DNS names or IP addresses the agent is reached by.
    pub fn load_or_create(dir: &Path, trust_domain: &str, server_names: &[&str]) -> Result<DevPki, PkiError> {
        validate_trust_domain(trust_domain)?;
        let sans = server_sans(server_names)?;
        files::create_dir(dir)?;
        let (ca_cert, ca_key) = (dir.join(CA_CERT_FILE), dir.join(CA_KEY_FILE));
        let ca = match (files::exists(&ca_cert), files::exists(&ca_key)) {
            (true, true) => CertificateAuthority::load(&ca_cert, &ca_key)?,
            (false, false) => CertificateAuthority::create(&ca_cert, &ca_key, trust_domain)?,
            (true, false) => return Err(PkiError::IncompleteCa { present: ca_cert, missing: ca_key }),
            (false, true) => return Err(PkiError::IncompleteCa { present: ca_key, missing: ca_cert }),
        };
        let (server_cert, server_key) = (dir.join(SERVER_CERT_FILE), dir.join(SERVER_KEY_FILE));
        let (server, server_status) = match (files::exists(&server_cert), files::exists(&server_key)) {
            (true, true) => match load_server(&ca, &server_cert, &server_key, &sans)? {
                Ok(server) => (server, ServerCertStatus::Loaded),
                Err(reason) => {
                    (create_server(&ca, &server_cert, &server_key, &sans)?, ServerCertStatus::Renewed { reason })
                }
            },
            (false, false) => (create_server(&ca, &server_cert, &server_key, &sans)?, ServerCertStatus::Created),
            (true, false) | (false, true) => (
                create_server(&ca, &server_cert, &server_key, &sans)?,
                ServerCertStatus::Renewed { reason: "only one of server.pem and server.key existed".into() },
            ),
        };
        Ok(DevPki { dir: dir.to_owned(), trust_domain: trust_domain.to_owned(), ca, server, server_status })
    }

    /// The directory holding the PKI.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The SPIFFE trust domain this PKI issues identities in.
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// The certificate authority.
    pub fn ca(&self) -> &CertificateAuthority {
        &self.ca
    }

    /// The agent's server certificate and key.
    pub fn server(&self) -> &CertifiedKey {
        &self.server
    }

    /// What happened to the server certificate during loading.
    pub fn server_status(&self) -> &ServerCertStatus {
        &self.server_status
    }

    /// [`issue_client`] with this PKI's CA and trust domain.
    pub fn issue_client(&self, tenant: &str, out_dir: &Path, validity_days: u32) -> Result<ClientBundle, PkiError> {
        issue_client(&self.ca, tenant, &self.trust_domain, out_dir, validity_days)
    }

    /// [`issue_admin`] with this PKI's CA and trust domain.
    pub fn issue_admin(&self, out_dir: &Path, validity_days: u32) -> Result<ClientBundle, PkiError> {
        issue_admin(&self.ca, &self.trust_domain, out_dir, validity_days)
    }

    /// [`server_config`] for this PKI's server certificate, trusting client
    /// certificates from its CA.
    pub fn server_config(&self, provider: Arc<CryptoProvider>) -> Result<rustls::ServerConfig, PkiError> {
        server_config(&self.server.cert_pem, &self.server.key_pem, &self.ca.cert_pem, provider)
    }
}

/// A client's credentials as written by [`issue_client`] / [`issue_admin`]. Holds a
/// private key: no `Debug`, no `Clone`.
pub struct ClientBundle {
    identity: Identity,
    spiffe_id: String,
    dir: PathBuf,
    cert: CertifiedKey,
    ca_pem: String,
    ca_path: PathBuf,
}

impl ClientBundle {
    /// Who the certificate speaks for.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The SPIFFE ID in the certificate's URI SAN.
    pub fn spiffe_id(&self) -> &str {
        &self.spiffe_id
    }

    /// The bundle directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The client certificate and key (`client.pem`, `client.key`).
    pub fn cert(&self) -> &CertifiedKey {
        &self.cert
    }

    /// The CA certificate, PEM (to verify the agent).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Where the CA certificate was written (`ca.pem`).
    pub fn ca_path(&self) -> &Path {
        &self.ca_path
    }

    /// A rustls client configuration presenting this bundle's certificate and trusting
    /// only the agent's CA, TLS 1.3 only, ALPN `h2`. For clients that build their own
    /// rustls stack; tonic clients can instead use `ClientTlsConfig` with the PEMs.
    pub fn client_config(&self, provider: Arc<CryptoProvider>) -> Result<rustls::ClientConfig, PkiError> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(cert.map_err(tls_err)?).map_err(tls_err)?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_err)?
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![self.cert.cert_der.clone()], self.cert.private_key_der())
            .map_err(tls_err)?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(config)
    }
}

/// Issue a tenant client bundle: a certificate with the single SAN URI
/// `spiffe://<trust_domain>/tenant/<tenant>`, signed by `ca`, valid for `validity_days`
/// (1 to [`MAX_CLIENT_VALIDITY_DAYS`]); writes `client.pem`, `client.key` (`0600`) and
/// `ca.pem` into `out_dir` (created `0700` if missing), replacing earlier files.
pub fn issue_client(
    ca: &CertificateAuthority,
    tenant: &str,
    trust_domain: &str,
    out_dir: &Path,
    validity_days: u32,
) -> Result<ClientBundle, PkiError> {
    issue(ca, Identity::tenant(tenant)?, trust_domain, out_dir, validity_days)
}

/// Issue the administrator's bundle: SAN URI `spiffe://<trust_domain>/admin`; otherwise
/// as [`issue_client`].
pub fn issue_admin(
    ca: &CertificateAuthority,
    trust_domain: &str,
    out_dir: &Path,
    validity_days: u32,
) -> Result<ClientBundle, PkiError> {
    issue(ca, Identity::Admin, trust_domain, out_dir, validity_days)
}

fn issue(
    ca: &CertificateAuthority,
    identity: Identity,
    trust_domain: &str,
    out_dir: &Path,
    validity_days: u32,
) -> Result<ClientBundle, PkiError> {
    validate_trust_domain(trust_domain)?;
    if validity_days == 0 || validity_days > MAX_CLIENT_VALIDITY_DAYS {
        return Err(PkiError::BadValidity { days: validity_days });
    }
    let spiffe_id = identity.spiffe_id(trust_domain);
    let uri = spiffe_id
        .clone()
        .try_into()
        .map_err(|e: rcgen::Error| PkiError::Generate { what: "client certificate SAN", reason: e.to_string() })?;
    let key = KeyPair::generate().map_err(generate_err("client key"))?;
    let mut params = CertificateParams::default();
    let common_name = match &identity {
        Identity::Tenant(name) => name.as_str(),
        Identity::Admin => "admin",
    };
    params.distinguished_name = distinguished_name(common_name);
    params.subject_alt_names = vec![SanType::URI(uri)];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, validity_days);
    let cert = params.signed_by(&key, &ca.issuer).map_err(generate_err("client certificate"))?;

    files::create_dir(out_dir)?;
    let (cert_path, key_path, ca_path) =
        (out_dir.join(CLIENT_CERT_FILE), out_dir.join(CLIENT_KEY_FILE), out_dir.join(CA_CERT_FILE));
    let key_pem = Zeroizing::new(key.serialize_pem());
    files::write_secret(&key_path, key_pem.as_bytes())?;
    files::write_public(&cert_path, cert.pem().as_bytes())?;
    files::write_public(&ca_path, ca.cert_pem.as_bytes())?;
    Ok(ClientBundle {
        identity,
        spiffe_id,
        dir: out_dir.to_owned(),
        cert: CertifiedKey::new(cert.pem(), cert.der().clone(), key_pem, cert_path, key_path)?,
        ca_pem: ca.cert_pem.clone(),
        ca_path,
    })
}

/// Check a SPIFFE trust domain name: 1 to 255 bytes of `[a-z0-9._-]`.
pub fn validate_trust_domain(trust_domain: &str) -> Result<(), PkiError> {
    let refuse = |reason| Err(PkiError::BadTrustDomain { value: names::quote(trust_domain), reason });
    if trust_domain.is_empty() || trust_domain.len() > MAX_TRUST_DOMAIN_BYTES {
        return refuse("must be 1 to 255 characters long");
    }
    if !trust_domain.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')) {
        return refuse("may only contain lowercase ASCII letters, digits, '.', '-' and '_' (SPIFFE)");
    }
    Ok(())
}

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
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(tls_err)?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
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

/// The server's SANs: the fixed local names plus `server_names`, deduplicated.
fn server_sans(server_names: &[&str]) -> Result<Vec<SanType>, PkiError> {
    if server_names.len() > MAX_SERVER_NAMES {
        return Err(PkiError::BadServerName {
            name: server_names.len().to_string(),
            reason: format!("at most {MAX_SERVER_NAMES} server names"),
        });
    }
    let mut sans: Vec<SanType> = Vec::new();
    for name in ["localhost", "127.0.0.1", "::1"].iter().chain(server_names) {
        let san = match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                validate_dns_name(name)?;
                SanType::DnsName((*name).try_into().map_err(|e: rcgen::Error| PkiError::BadServerName {
                    name: names::quote(name),
                    reason: e.to_string(),
                })?)
            }
        };
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    Ok(sans)
}

/// A DNS name for a server certificate: what rustls will accept as a `ServerName`.
fn validate_dns_name(name: &str) -> Result<(), PkiError> {
    rustls_pki_types::DnsName::try_from(name).map(|_| ()).map_err(|_| PkiError::BadServerName {
        name: names::quote(name),
        reason: "neither an IP address nor a valid DNS name".into(),
    })
}

/// Load the server certificate. The outer error is fatal (I/O, key permissions); the
/// inner `Err` is a reason to make a new certificate.
fn load_server(
    ca: &CertificateAuthority,
    cert_path: &Path,
    key_path: &Path,
    sans: &[SanType],
) -> Result<Result<CertifiedKey, String>, PkiError> {
    let cert_pem = files::read_public(cert_path)?;
    let key_pem = files::read_secret(key_path)?;
    let Ok(key) = KeyPair::from_pem(&key_pem) else {
        return Ok(Err("server.key is not a usable private key".into()));
    };
    let Ok(cert_der) = CertificateDer::from_pem_slice(cert_pem.as_bytes()) else {
        return Ok(Err("server.pem holds no certificate".into()));
    };
    let Ok(cert) = parse_cert(&cert_der) else {
        return Ok(Err("server.pem is not a valid certificate".into()));
    };
    let Ok(ca_cert) = parse_cert(&ca.cert_der) else {
        return Ok(Err("the CA certificate cannot be parsed".into()));
    };
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Ok(Err("server.pem and server.key do not match".into()));
    }
    if cert.verify_signature(Some(ca_cert.public_key())).is_err() {
        return Ok(Err("server.pem was not signed by this CA".into()));
    }
    let renew_at = OffsetDateTime::now_utc() + Duration::days(SERVER_RENEW_BEFORE_DAYS.into());
    if cert.validity().not_after.timestamp() <= renew_at.unix_timestamp() {
        return Ok(Err(format!("server.pem expires within {SERVER_RENEW_BEFORE_DAYS} days")));
    }
    let present = cert_sans(&cert);
    if let Some(missing) = sans.iter().find(|san| !present.contains(san)) {
        return Ok(Err(format!("server.pem does not cover {}", describe_san(missing))));
    }
    drop(cert);
    Ok(Ok(CertifiedKey::new(cert_pem, cert_der, key_pem, cert_path.to_owned(), key_path.to_owned())?))
}

fn create_server(
    ca: &CertificateAuthority,
    cert_path: &Path,
    key_path: &Path,
    sans: &[SanType],
) -> Result<CertifiedKey, PkiError> {
    let key = KeyPair::generate().map_err(generate_err("server key"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name("dpu-agent");
    params.subject_alt_names = sans.to_vec();
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, SERVER_VALIDITY_DAYS);
    let cert = params.signed_by(&key, &ca.issuer).map_err(generate_err("server certificate"))?;
    let key_pem = Zeroizing::new(key.serialize_pem());
    files::write_secret(key_path, key_pem.as_bytes())?;
    files::write_public(cert_path, cert.pem().as_bytes())?;
    CertifiedKey::new(cert.pem(), cert.der().clone(), key_pem, cert_path.to_owned(), key_path.to_owned())
}

/// The DNS and IP SANs of a parsed certificate, as rcgen values for comparison.
fn cert_sans(cert: &X509Certificate<'_>) -> Vec<SanType> {
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => (*dns).try_into().ok().map(SanType::DnsName),
            GeneralName::IPAddress(bytes) => match bytes.len() {
                4 => <[u8; 4]>::try_from(*bytes).ok().map(|b| SanType::IpAddress(IpAddr::from(b))),
                16 => <[u8; 16]>::try_from(*bytes).ok().map(|b| SanType::IpAddress(IpAddr::from(b))),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn describe_san(san: &SanType) -> String {
    match san {
        SanType::DnsName(name) => name.as_str().to_owned(),
        SanType::IpAddress(ip) => ip.to_string(),
        other => format!("{other:?}"),
    }
}

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "dpuio");
    dn.push(DnType::CommonName, common_name);
    dn
}

fn set_validity(params: &mut CertificateParams, days: u32) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + Duration::days(days.into());
}

#[cfg(test)]
mod tests;

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
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_client_cert_verifier(verifier.clone())
        .with_single_cert(chain, key)
        .map_err(tls_err)?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok((config, verifier))
}
