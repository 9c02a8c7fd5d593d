//! Tenants' key-encryption keys: reading them from the config at start, and rotating
//! them while the agent runs ([`Agent::rotate_key`], [`Agent::key_status`]).
//!
//! The key source of each tenant is a [`RotatingKeySource`]: the versions from the
//! config, plus any a rotation adds. The admin service records a rotated-in version
//! (its number and the path of its file, never its bytes) in the state file
//! ([`crate::persist`]), so the next start adds it again and keeps it current; the key
//! file must stay where it is, mode 0600. The key bytes never leave the key source:
//! nothing here logs or returns them.

use std::path::Path;
use std::sync::Arc;

use dpuio_crypto::RotatingKeySource;
use dpuio_encryption::{EncryptedContainer, KeyStatus, RotateError, RotationReport};

use crate::error::{Error, Result};
use crate::runtime::lock;
use crate::state::Agent;

/// The tenant's encryption settings; key files are read and checked now, so a
/// missing or loosely protected key stops the agent at start with the reason.
pub fn encryption_settings(
    tenant: &str,
    container: &str,
    enc: &crate::config::EncryptionConfig,
) -> std::result::Result<dpuio_encryption::EncryptionSettings, crate::serve_error::ServeError> {
    let fail =
        |e: dpuio_crypto::Error| crate::serve_error::ServeError::Encryption { tenant: tenant.to_owned(), source: e };
    let mut keys = dpuio_crypto::FileKeySource::new();
    for (version, file) in &enc.keys {
        keys.add_key_file(tenant, *version, file).map_err(fail)?;
    }
    let keys = Arc::new(RotatingKeySource::new(keys));
    let mut s = dpuio_encryption::EncryptionSettings::new(tenant, container, keys).map_err(fail)?;
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

/// What [`Agent::rotate_key`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRotation {
    pub tenant: String,
    /// The version that was current, whose files were re-wrapped.
    pub old_version: u32,
    /// The new key's version, current from now on.
    pub new_version: u32,
    /// Files re-wrapped, already new, on other versions, unencrypted, failed.
    pub report: RotationReport,
}

/// What [`Agent::key_status`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantKeys {
    pub tenant: String,
    /// The version new files are wrapped under.
    pub current_version: u32,
    /// Every version the tenant's key source has, ascending.
    pub versions: Vec<u32>,
    /// Files per version: a version other than the current one can be retired (its
    /// key removed from the config) once [`KeyStatus::can_retire`] says so.
    pub status: KeyStatus,
}

impl Agent {
    /// Add `new_key_file` as the tenant's next key version (checked like config key
    /// files: 32 bytes, not readable by group/others), make it current for new files,
    /// and re-wrap every file's data key from the old version to it without
    /// re-encrypting data. Files stay readable throughout.
    pub fn rotate_key(&self, tenant: &str, new_key_file: &Path) -> Result<KeyRotation> {
        let (container, running) = self.encrypted_container(tenant)?;
        let outcome = running.rotate_to_key_file(new_key_file);
        // The version may have moved even when the walk failed.
        if let Some(settings) = lock(&self.encryption).get_mut(&container) {
            settings.key_version = running.key_version();
        }
        let change = outcome.map_err(|e| match e {
            // Only a source built elsewhere than `encryption_settings` refuses this.
            RotateError::KeyFile(e @ dpuio_crypto::Error::FixedKeySource { .. }) => Error::Internal(e.to_string()),
            RotateError::KeyFile(e) => Error::invalid("new_key_file", format!("tenant {tenant:?}: {e}")),
            e @ RotateError::Rewrap { .. } => Error::Internal(format!("tenant {tenant:?}: {e}")),
        })?;
        let r = &change.report;
        tracing::info!(
            tenant,
            old_version = change.old_version,
            new_version = change.new_version,
            key_file = %new_key_file.display(),
            rewrapped = r.rewrapped,
            already_new = r.already_new,
            other_version = r.other_version,
            failed = r.failed,
            "key rotated"
        );
        Ok(KeyRotation {
            tenant: tenant.to_owned(),
            old_version: change.old_version,
            new_version: change.new_version,
            report: change.report,
        })
    }

    /// Which key versions the tenant has, which is current, and how many files each
    /// wraps (so an old key can be retired once it wraps none).
    pub fn key_status(&self, tenant: &str) -> Result<TenantKeys> {
        let (_, running) = self.encrypted_container(tenant)?;
        let settings = running.settings();
        let versions = settings
            .key_source
            .key_versions(&settings.tenant)
            .map_err(|e| Error::Internal(format!("tenant {tenant:?}: {e}")))?;
        let current_version = running.key_version();
        let status = running.key_status()?;
        Ok(TenantKeys { tenant: tenant.to_owned(), current_version, versions, status })
    }

    /// The version that wraps the tenant's new files now (`None`: not encrypted, or
    /// not a tenant).
    pub fn current_key_version(&self, tenant: &str) -> Option<u32> {
        let container = lock(&self.tenants).get(tenant).map(|t| t.container.clone())?;
        lock(&self.encryption).get(&container).filter(|s| s.tenant == tenant).map(|s| s.key_version)
    }

    /// The tenant's container name and its running encrypted wrapper.
    fn encrypted_container(&self, tenant: &str) -> Result<(String, EncryptedContainer)> {
        let container = lock(&self.tenants)
            .get(tenant)
            .map(|t| t.container.clone())
            .ok_or_else(|| Error::UnknownTenant { tenant: tenant.to_owned() })?;
        let settings = lock(&self.encryption)
            .get(&container)
            .filter(|s| s.tenant == tenant)
            .cloned()
            .ok_or_else(|| Error::NotEncrypted { tenant: tenant.to_owned() })?;
        // Mounted at start; mounting here covers an agent that did not, and the cached
        // mount keeps the wrapper alive while `running` is looked up.
        let _mounted = self.container(&container)?;
        let running = settings.running_container().ok_or_else(|| {
            Error::Internal(format!("tenant {tenant:?}: container {container:?} is mounted without its encryption"))
        })?;
        Ok((container, running))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use dpuio_backend::{Container, NsPath, OpenOptions};
    use tonic::Code;

    use super::*;
    use crate::config::{BackendConfig, Config};

    /// A fresh random key in a file of the given mode.
    fn key_file(dir: &Path, name: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        let key: [u8; 32] = rand::random();
        std::fs::File::create(&path).unwrap().write_all(&key).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    /// An agent (no data plane) over `dir/data` with tenant "vision" encrypted under
    /// `keys` and tenant "plain" without encryption.
    fn agent(dir: &Path, keys: &[(u32, &Path)]) -> Arc<Agent> {
        let keys: Vec<String> =
            keys.iter().map(|(v, f)| format!("{{ version = {v}, file = {:?} }}", f.display().to_string())).collect();
        let text = format!(
            "[agent]\ndata_dir = {:?}\n[data_plane]\nenabled = false\n\
             [[tenants]]\nname = \"vision\"\ncontainer = \"vision\"\n\
             [tenants.encryption]\nkeys = [{}]\nblock_bytes = 4096\n\
             [[tenants]]\nname = \"plain\"\ncontainer = \"plain\"\n",
            dir.join("data").display().to_string(),
            keys.join(", ")
        );
        let config = Config::parse(&text).unwrap();
        // What the server's start does for this config (a local backend, no data plane),
        // without the server: keys sits below it.
        let BackendConfig::Local { path } = &config.backend else { panic!("a local backend") };
        let backend = Arc::new(dpuio_backend::local::LocalBackend::open(path.clone()).unwrap());
        let tenants = config.tenants.clone();
        let agent = Agent::new(config, backend);
        for tenant in &tenants {
            if let Some(enc) = &tenant.encryption {
                agent.set_encryption(
                    &tenant.container,
                    encryption_settings(&tenant.name, &tenant.container, enc).unwrap(),
                );
            }
        }
        agent.prepare_containers().unwrap();
        Arc::new(agent)
    }

    fn p(s: &str) -> NsPath {
        NsPath::parse(s).unwrap()
    }

    fn content(name: &str, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31) ^ name.len() as u8).collect()
    }

    fn write(c: &dyn Container, name: &str, data: &[u8]) {
        let f = c.open(&p(name), OpenOptions { write: true, create: true, ..OpenOptions::default() }, 0o644).unwrap();
        f.write_at(data, 0).unwrap();
        f.sync().unwrap();
    }

    fn read(c: &dyn Container, name: &str) -> Vec<u8> {
        let f = c.open(&p(name), OpenOptions::default(), 0).unwrap();
        let mut buf = vec![0u8; f.stat().unwrap().size as usize];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), buf.len());
        buf
    }

    #[test]
    fn rotation_rewraps_files_while_one_is_read_and_another_written() {
        let dir = tempfile::tempdir().unwrap();
        let k1 = key_file(dir.path(), "k1", 0o600);
        let agent = agent(dir.path(), &[(1, &k1)]);
        let vision = agent.container("vision").unwrap();
        let mut files = BTreeMap::new();
        vision.mkdir(&p("/d"), 0o755).unwrap();
        for (name, len) in [("/a", 10), ("/d/b", 40_000), ("/d/c", 4096), ("/grow", 100)] {
            write(&*vision, name, &content(name, len));
            files.insert(name, content(name, len));
        }

        let before = agent.key_status("vision").unwrap();
        assert_eq!((before.current_version, before.versions.as_slice()), (1, &[1][..]));
        assert_eq!(before.status.files_by_version, BTreeMap::from([(1, 4)]));
        assert!(!before.status.can_retire(1));

        // A reader of /d/b and a writer growing /grow run through the rotation.
        let k2 = key_file(dir.path(), "k2", 0o600);
        let stop = AtomicBool::new(false);
        let reads = AtomicU64::new(0);
        let grow = vision.open(&p("/grow"), OpenOptions { write: true, ..OpenOptions::default() }, 0).unwrap();
        let reader = vision.open(&p("/d/b"), OpenOptions::default(), 0).unwrap();
        let mut grown = files["/grow"].clone();
        let rotation = std::thread::scope(|s| {
            s.spawn(|| {
                let mut buf = vec![0u8; 40_000];
                while !stop.load(Ordering::Relaxed) || reads.load(Ordering::Relaxed) < 3 {
                    assert_eq!(reader.read_at(&mut buf, 0).expect("readable during rotation"), buf.len());
                    assert!(buf == files["/d/b"], "wrong content during rotation");
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
            let writer = s.spawn(|| {
                let mut written = Vec::new();
                while !stop.load(Ordering::Relaxed) || written.len() < 3000 {
                    let piece = [written.len() as u8; 1000];
                    grow.write_at(&piece, (100 + written.len()) as u64).unwrap();
                    written.extend_from_slice(&piece);
                }
                written
            });
            let rotation = agent.rotate_key("vision", &k2);
            stop.store(true, Ordering::Relaxed);
            grown.extend_from_slice(&writer.join().unwrap());
            rotation
        });
        let rotation = rotation.unwrap();
        assert_eq!((rotation.tenant.as_str(), rotation.old_version, rotation.new_version), ("vision", 1, 2));
        assert_eq!((rotation.report.rewrapped, rotation.report.failed), (4, 0), "{:?}", rotation.report);
        assert!(reads.load(Ordering::Relaxed) >= 3);
        files.insert("/grow", grown);
        drop((grow, reader));

        // New files go under the new version; nothing is left under the old one.
        write(&*vision, "/new", b"after the rotation");
        files.insert("/new", b"after the rotation".to_vec());
        let after = agent.key_status("vision").unwrap();
        assert_eq!((after.current_version, after.versions.as_slice()), (2, &[1, 2][..]));
        assert_eq!(after.status.files_by_version, BTreeMap::from([(2, 5)]));
        assert!(after.status.can_retire(1) && !after.status.can_retire(2));
        for (name, data) in &files {
            assert!(&read(&*vision, name) == data, "{name}");
        }

        // A second rotation, from 2 to 3.
        let k3 = key_file(dir.path(), "k3", 0o600);
        let second = agent.rotate_key("vision", &k3).unwrap();
        assert_eq!((second.old_version, second.new_version, second.report.rewrapped), (2, 3, 5));
        let status = agent.key_status("vision").unwrap();
        assert_eq!((status.current_version, status.versions.as_slice()), (3, &[1, 2, 3][..]));
        assert_eq!(status.status.files_by_version, BTreeMap::from([(3, 5)]));
        agent.close_everything().unwrap();
        drop((vision, agent));

        // Restarted with version 3 alone: everything opens, nothing needed 1 or 2.
        let restarted = super::tests::agent(dir.path(), &[(3, &k3)]);
        let vision = restarted.container("vision").unwrap();
        for (name, data) in &files {
            assert!(&read(&*vision, name) == data, "{name} after restart");
        }
    }

    #[test]
    fn bad_requests_are_refused_with_the_tenant_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let k1 = key_file(dir.path(), "k1", 0o600);
        let agent = agent(dir.path(), &[(1, &k1)]);
        write(&*agent.container("vision").unwrap(), "/f", b"secret");
        let unchanged = |agent: &Agent| {
            let status = agent.key_status("vision").unwrap();
            assert_eq!((status.current_version, status.versions.as_slice()), (1, &[1][..]));
            assert_eq!(status.status.files_by_version, BTreeMap::from([(1, 1)]));
        };

        let loose = key_file(dir.path(), "loose", 0o644);
        let err = agent.rotate_key("vision", &loose).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        let message = err.to_string();
        assert!(message.contains("\"vision\"") && message.contains("chmod 600"), "{message}");
        unchanged(&agent);

        let short = dir.path().join("short");
        std::fs::write(&short, [7u8; 31]).unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = agent.rotate_key("vision", &short).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.to_string().contains("not a 256-bit key"), "{err}");
        let err = agent.rotate_key("vision", &dir.path().join("missing")).unwrap_err();
        assert!(err.to_string().contains("cannot read key file"), "{err}");
        // The key it has already: rotating to it would change nothing.
        let err = agent.rotate_key("vision", &k1).unwrap_err();
        assert!(err.to_string().contains("version 1 already"), "{err}");
        unchanged(&agent);

        let err = agent.rotate_key("nobody", &k1).unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert!(err.to_string().contains("\"nobody\""), "{err}");
        for err in [agent.rotate_key("plain", &k1).unwrap_err(), agent.key_status("plain").unwrap_err()] {
            assert_eq!(err.code(), Code::FailedPrecondition);
            assert!(err.to_string().contains("\"plain\"") && err.to_string().contains("[tenants.encryption]"));
        }
        assert_eq!(agent.key_status("nobody").unwrap_err().code(), Code::NotFound);

        // Nothing printed about a key shows its bytes.
        let key_bytes = std::fs::read(&k1).unwrap();
        let k2 = key_file(dir.path(), "k2", 0o600);
        let rotation = agent.rotate_key("vision", &k2).unwrap();
        let shown = format!("{rotation:?} {:?}", agent.key_status("vision").unwrap());
        let hex: String = key_bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert!(!shown.contains(&hex[..16]) && !shown.contains(&format!("{:?}", &key_bytes[..4])), "{shown}");
    }
}
