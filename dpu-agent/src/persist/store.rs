//! The state file on disk: read once at start, rewritten atomically after every change
//! made with `dpuctl` (a temporary file in the same directory, fsync, rename over the
//! old one, fsync of the directory), so that a crash at any point leaves either the old
//! file or the new one, never a mix.
//!
//! A file that cannot be read, is not TOML, or has another version stops the agent with
//! the file's name and what to do: it is never dropped or overwritten unread.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use super::{FormatError, PersistedState, STATE_VERSION, parse, render};
use crate::error::{Error, Result};
use crate::runtime::lock;

/// What the state file's name comes with in every message: what it is and the way out.
const WHAT_TO_DO: &str = "it holds the changes made with dpuctl; repair it by hand (docs/config.md, \
     \"Settings that persist\"), or move it away to start from the config file alone (those changes are then lost)";

/// Why the state file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The file exists but could not be read.
    #[error("cannot read the state file {path}: {source}; {}", WHAT_TO_DO)]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not TOML (a partial write cannot cause this: writes are atomic).
    #[error("the state file {path} is not valid TOML: {message}; {}", WHAT_TO_DO)]
    Syntax { path: PathBuf, message: String },
    /// The file has no `version`, or one this agent does not read (a newer agent wrote it).
    #[error(
        "the state file {path} has {}, and this dpu-agent reads version {}: \
         run the dpu-agent that wrote it, or move the file away to start from the config file alone \
         (the changes made with dpuctl are then lost)",
        found.as_ref().map_or("no version".to_owned(), |v| format!("version {v}")),
        STATE_VERSION
    )]
    Version { path: PathBuf, found: Option<String> },
    /// The file is TOML of this version with a wrong key, type or value.
    #[error("the state file {path} is not what this dpu-agent writes: {reason}; {}", WHAT_TO_DO)]
    Invalid { path: PathBuf, reason: String },
    /// The file could not be written.
    #[error("cannot write the state file {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Read the state file at `path`; a missing file is an empty state.
pub fn load(path: &Path) -> std::result::Result<PersistedState, StateError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(PersistedState::default()),
        Err(source) => return Err(StateError::Read { path: path.to_owned(), source }),
    };
    parse(&text).map_err(|e| {
        let path = path.to_owned();
        match e {
            FormatError::Syntax(message) => StateError::Syntax { path, message },
            FormatError::Version { found } => StateError::Version { path, found },
            FormatError::Invalid(reason) => StateError::Invalid { path, reason },
        }
    })
}

/// Write `text` to `path` atomically: a temporary file in the same directory, synced,
/// renamed over `path`, and the directory synced so the rename is durable too.
pub(crate) fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}-{:016x}.tmp", std::process::id(), rand::random::<u64>()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&temp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written?;
    std::fs::File::open(dir)?.sync_all()
}

/// Now, in Unix seconds, for the records' times.
pub fn now_unix_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The state file of a running agent and its content: changes are made under its lock,
/// so the file always records them in the order they took effect.
pub struct Store {
    path: PathBuf,
    state: Mutex<PersistedState>,
}

impl Store {
    /// A store at `path` whose content is `state` (what [`super::merge`] kept).
    pub fn new(path: PathBuf, state: PersistedState) -> Store {
        Store { path, state: Mutex::new(state) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The content now.
    pub fn state(&self) -> PersistedState {
        lock(&self.state).clone()
    }

    /// Write the content now to the file.
    pub fn save(&self) -> std::result::Result<(), StateError> {
        let state = lock(&self.state);
        self.write(&state)
    }

    fn write(&self, state: &PersistedState) -> std::result::Result<(), StateError> {
        let text = render(state).map_err(|e| StateError::Write {
            path: self.path.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{e:?}")),
        })?;
        write_atomically(&self.path, &text).map_err(|source| StateError::Write { path: self.path.clone(), source })
    }

    /// Make a change: `change` applies it to the agent and records it in the state it is
    /// given; the file is rewritten if the record changed, also when `change` failed
    /// half-way (a key rotation whose new version is current although some files were
    /// not re-wrapped must be kept). Changes are serialized by the store's lock.
    pub fn change<T>(&self, change: impl FnOnce(&mut PersistedState) -> Result<T>) -> Result<T> {
        let mut state = lock(&self.state);
        let before = state.clone();
        let outcome = change(&mut state);
        if *state == before {
            return outcome;
        }
        match (self.write(&state), outcome) {
            (Ok(()), outcome) => outcome,
            (Err(e), Ok(_)) => Err(Error::Internal(format!(
                "{e}: the change is in force now but not saved, so a restart would undo it; \
                 fix the cause and repeat the command (or make any other change) to save it"
            ))),
            (Err(e), Err(first)) => {
                tracing::error!(error = %e, "the state file could not record a change that failed half-way");
                Err(first)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::config::TenantConfig;

    #[test]
    fn a_missing_file_is_empty_and_a_saved_one_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("state.toml");
        assert_eq!(load(&path).unwrap(), PersistedState::default());
        let store = Store::new(path.clone(), PersistedState::default());
        let config = vec![TenantConfig::new("a", "a")];
        store
            .change(|s| {
                s.record_add(&config, &TenantConfig::new("b", "b"), 5);
                Ok(())
            })
            .unwrap();
        assert_eq!(load(&path).unwrap(), store.state());
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left behind");
    }

    #[test]
    fn a_failed_change_that_recorded_nothing_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.toml");
        let store = Store::new(path.clone(), PersistedState::default());
        let e = store.change(|_| -> Result<()> { Err(Error::Internal("no".into())) }).unwrap_err();
        assert!(e.to_string().contains("no"));
        assert!(!path.exists());
    }

    #[test]
    fn an_unwritable_file_says_the_change_is_not_saved() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: the rename fails.
        let path = dir.path().join("state.toml");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("x"), "x").unwrap();
        let store = Store::new(path.clone(), PersistedState::default());
        let e = store
            .change(|s| {
                s.record_add(&[], &TenantConfig::new("b", "b"), 5);
                Ok(())
            })
            .unwrap_err();
        let m = e.to_string();
        assert!(m.contains(&path.display().to_string()) && m.contains("not saved"), "{m}");
        assert_eq!(store.state().tenants.len(), 1, "kept, to be saved by the next change");
    }

    #[test]
    fn bad_files_name_themselves_and_the_way_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.toml");
        std::fs::write(&path, "version = 1\n[tenants\n").unwrap();
        let m = load(&path).unwrap_err().to_string();
        assert!(
            m.contains(&path.display().to_string()) && m.contains("not valid TOML") && m.contains("move it away"),
            "{m}"
        );
        std::fs::write(&path, "version = 7\n").unwrap();
        let m = load(&path).unwrap_err().to_string();
        assert!(m.contains("has version 7") && m.contains("reads version 1"), "{m}");
        std::fs::write(&path, "version = 1\nextra = true\n").unwrap();
        let m = load(&path).unwrap_err().to_string();
        assert!(m.contains("extra") && m.contains("repair it by hand"), "{m}");
    }
}
