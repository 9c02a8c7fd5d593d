//! Who is calling: the [`Caller`] the interceptor (`tls::Authenticator`) puts in each
//! request's extensions, and what it may use.
//!
//! A leaf room: the policy that binds sessions to tenants (`state`) and the adapters
//! that establish or read the caller (`tls`, `service`) all import it from here.

use tonic::Status;

/// Who made a request, as the interceptor established it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A tenant, from its client certificate.
    Tenant(String),
    /// A plaintext loopback listener (`[tls] mode = "off"`): the request names the tenant.
    Unauthenticated,
}

impl Caller {
    /// The caller of a request that passed the interceptor (`tls::Authenticator`).
    pub fn of<T>(request: &tonic::Request<T>) -> Result<Caller, Status> {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| Status::internal("request reached a service without passing authentication"))
    }

    /// Whether this caller may use something that belongs to `tenant`.
    pub fn may_use(&self, tenant: &str) -> bool {
        match self {
            Caller::Tenant(t) => t == tenant,
            Caller::Unauthenticated => true,
        }
    }
}
