//! Tenants' key-encryption keys: reading them from the config at start.

use std::sync::Arc;

/// The tenant's encryption settings; key files are read and checked now, so a
/// missing or loosely protected key stops the agent at start with the reason.
pub fn encryption_settings(
    tenant: &str,
    container: &str,
    enc: &crate::config::EncryptionConfig,
) -> Result<crate::encryption::EncryptionSettings, crate::server::ServeError> {
    let fail = |e: dpuio_crypto::Error| crate::server::ServeError::Encryption { tenant: tenant.to_owned(), source: e };
    let mut keys = dpuio_crypto::FileKeySource::new();
    for (version, file) in &enc.keys {
        keys.add_key_file(tenant, *version, file).map_err(fail)?;
    }
    let mut s = crate::encryption::EncryptionSettings::new(tenant, container, Arc::new(keys)).map_err(fail)?;
    if let Some(p) = &enc.provider {
        s.provider = dpuio_crypto::provider_by_name(p).map_err(fail)?;
    }
    if let Some(b) = enc.block_bytes {
        s.block_bytes = b;
    }
    if let Some(v) = enc.key_version {
        s.key_version = v;
    }
    s.validate().map_err(fail)?;
    Ok(s)
}
