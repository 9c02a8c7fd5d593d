//! Who a client certificate speaks for: the SPIFFE ID in its one URI SAN, read into an
//! [`Identity`] (a tenant or the administrator), and why that failed ([`IdentityError`]).

use std::fmt;

use rustls_pki_types::CertificateDer;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use crate::names::{self, NameError, NameKind};

/// Who a client certificate speaks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// A tenant, by name (checked by [`names::validate_identifier`]).
    Tenant(String),
    /// The administrator (the `Admin` service, on its own listener).
    Admin,
}

impl Identity {
    /// A tenant identity, with the name checked.
    pub fn tenant(name: &str) -> Result<Identity, NameError> {
        names::validate_identifier(NameKind::Tenant, name)?;
        Ok(Identity::Tenant(name.to_owned()))
    }

    /// The SPIFFE ID of this identity in `trust_domain`.
    pub fn spiffe_id(&self, trust_domain: &str) -> String {
        match self {
            Identity::Tenant(name) => format!("spiffe://{trust_domain}/tenant/{name}"),
            Identity::Admin => format!("spiffe://{trust_domain}/admin"),
        }
    }

    /// The tenant name, or `None` for the administrator.
    pub fn tenant_name(&self) -> Option<&str> {
        match self {
            Identity::Tenant(name) => Some(name),
            Identity::Admin => None,
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Tenant(name) => write!(f, "tenant {name}"),
            Identity::Admin => f.write_str("admin"),
        }
    }
}

/// Why no [`Identity`] could be read from a certificate. Each variant is something the
/// client's operator must fix in how the certificate was issued.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The TLS session carries no client certificate (client auth is optional on this
    /// listener, or the request did not come over TLS).
    #[error("no client certificate: connect with mTLS (client.pem and client.key from the agent's CA)")]
    NoPeerCertificate,
    /// The bytes are not one DER X.509 certificate.
    #[error("not an X.509 certificate: {reason}")]
    NotACertificate {
        /// What the parser said.
        reason: String,
    },
    /// The certificate has no URI subject alternative name, so it names no SPIFFE ID.
    #[error("the client certificate has no URI SAN; it needs exactly one, spiffe://<trust-domain>/tenant/<name>")]
    NoUriSan,
    /// The certificate has more than one URI SAN; an X.509-SVID has exactly one, so
    /// which identity it speaks for would be ambiguous.
    #[error("the client certificate has {count} URI SANs; it needs exactly one SPIFFE ID")]
    SeveralUriSans {
        /// How many URI SANs were found.
        count: usize,
    },
    /// The URI SAN is not a `spiffe://` URI.
    #[error("the client certificate's URI SAN {uri:?} is not a SPIFFE ID (spiffe://<trust-domain>/...)")]
    NotSpiffe {
        /// The URI (shortened).
        uri: String,
    },
    /// The SPIFFE ID belongs to another trust domain.
    #[error("the client certificate is for trust domain {found:?}, this agent serves {expected:?}")]
    WrongTrustDomain {
        /// This agent's trust domain.
        expected: String,
        /// The certificate's (shortened).
        found: String,
    },
    /// The SPIFFE ID's path is neither `/tenant/<name>` nor `/admin`.
    #[error("the SPIFFE ID path {path:?} is neither /tenant/<name> nor /admin")]
    MalformedPath {
        /// The path (shortened).
        path: String,
    },
    /// The tenant name in the SPIFFE ID is not a valid tenant name.
    #[error("the SPIFFE ID names an invalid tenant: {0}")]
    BadTenantName(NameError),
    /// The certificate chain does not lead to the client CA, or is not valid now.
    #[error(
        "the client certificate is not trusted ({reason}): use one issued by this agent's client CA (dpuctl cert issue)"
    )]
    NotTrusted {
        /// What the chain check said.
        reason: String,
    },
}

/// The [`Identity`] named by a client certificate (DER): exactly one URI SAN, a SPIFFE
/// ID in `trust_domain` whose path is `/tenant/<valid name>` or `/admin`.
///
/// Does not validate the chain, the validity period or the key usage: rustls did that
/// during the handshake (see the module documentation). Call it on certificates from
/// `tonic::Request::peer_certs()` only.
pub fn identity_from_cert_der(der: &[u8], trust_domain: &str) -> Result<Identity, IdentityError> {
    let cert = parse_cert(der).map_err(|reason| IdentityError::NotACertificate { reason })?;
    let san = cert.subject_alternative_name().map_err(|e| IdentityError::NotACertificate { reason: e.to_string() })?;
    let uris: Vec<&str> = san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|name| if let GeneralName::URI(u) = name { Some(*u) } else { None })
        })
        .into_iter()
        .flatten()
        .collect();
    match uris.as_slice() {
        [] => Err(IdentityError::NoUriSan),
        [uri] => parse_spiffe_id(uri, trust_domain),
        more => Err(IdentityError::SeveralUriSans { count: more.len() }),
    }
}

/// [`identity_from_cert_der`] on the leaf of a verified peer chain, as returned by
/// `tonic::Request::peer_certs()` or `rustls::CommonState::peer_certificates()`.
pub fn identity_from_peer_certs(certs: &[CertificateDer<'_>], trust_domain: &str) -> Result<Identity, IdentityError> {
    let leaf = certs.first().ok_or(IdentityError::NoPeerCertificate)?;
    identity_from_cert_der(leaf, trust_domain)
}

/// Parse a SPIFFE ID in `trust_domain` into an [`Identity`].
fn parse_spiffe_id(uri: &str, trust_domain: &str) -> Result<Identity, IdentityError> {
    let Some(rest) = uri.strip_prefix("spiffe://") else {
        return Err(IdentityError::NotSpiffe { uri: names::quote(uri) });
    };
    let (domain, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if domain != trust_domain {
        return Err(IdentityError::WrongTrustDomain { expected: trust_domain.to_owned(), found: names::quote(domain) });
    }
    if path == "/admin" {
        return Ok(Identity::Admin);
    }
    match path.strip_prefix("/tenant/") {
        Some(name) if !name.contains('/') => Identity::tenant(name).map_err(IdentityError::BadTenantName),
        _ => Err(IdentityError::MalformedPath { path: names::quote(path) }),
    }
}

/// Parse exactly one DER certificate (no trailing bytes).
pub(super) fn parse_cert(der: &[u8]) -> Result<X509Certificate<'_>, String> {
    let (rest, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        return Err(format!("{} trailing bytes after the certificate", rest.len()));
    }
    Ok(cert)
}
