//! Tenant isolation for `dpu-agent`, without network I/O.
//!
//! Three pieces, each usable (and tested) on its own:
//!
//! - [`pki`]: who is calling. A development certificate authority and certificates made
//!   with rcgen (so `dpu-agent serve` works with no config), client bundles whose SAN URI
//!   is a SPIFFE ID (`spiffe://<trust-domain>/tenant/<name>` or `.../admin`), the
//!   extraction of an [`pki::Identity`] from a peer certificate, and a rustls
//!   `ServerConfig` that demands client certificates from the CA.
//! - [`token`]: what the caller may do. Capability tokens (biscuit-auth, ed25519)
//!   scoped to tenant, container, path prefix, operations and expiry; attenuable by any
//!   holder without the root key; verified into [`token::Rights`], a plain value with an
//!   [`token::OpMask`] that the data plane checks on every entry.
//! - [`qos`]: how much. Token buckets (bytes/s and ops/s), per-tenant admission and a
//!   start-time fair queue across tenants, with the current time passed in.
//!
//! What this crate deliberately does not do: open sockets, speak gRPC, read a clock, or
//! hold sessions. The agent's tonic services call in here with plain values (a peer
//! certificate, a token string, `now`) and map the typed errors to `tonic::Status` in one
//! place. The only file-system access is loading and creating key material in
//! [`pki::DevPki::load_or_create`], [`pki::issue_client`] and
//! [`token::TokenAuthority::load_or_create`], which write keys with mode `0600` and refuse
//! to load a key that group or others can read.
//!
//! Names shared by all three (tenant and container identifiers, normalised paths) are
//! checked by [`names`], with the same rules as `dpu-agent`'s config and the backend's
//! `NsPath`, so "a tenant" is the same string in a certificate, a token, a config file
//! and a metrics label.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod files;
pub mod names;
pub mod pki;
pub mod qos;
pub mod token;
