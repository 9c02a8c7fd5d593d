//! Whole-file puts that replace a file in one step, as an object store's put does.
//!
//! A put of `DIR/NAME` writes a temporary file beside it
//! (`DIR/.NAME.dpuio-put.SUFFIX`, [`dpuio_proto::put`]), makes it durable (close), then
//! renames it over `DIR/NAME` with `replace` and syncs the container so the new
//! directory entry is durable too. Until the rename, `DIR/NAME` is the old file, whole;
//! after it, the new one. A crash of the agent or of this process before the rename
//! leaves the old file and the temporary one, which nothing reads; the agent removes it
//! when the session ends for good, or a lease after its own restart unless this client
//! resumes and finishes the put (docs/dataplane.md, "Unfinished puts"). A put that fails
//! returns its error after removing the temporary file where the session may (`delete`
//! right, or any session without a token).
//!
//! Rights: a put needs what writing NAME in place needs, create and write on NAME; the
//! temporary file is in NAME's directory, so a token scoped to that directory (or
//! above) covers it, and the agent publishes a put's temporary file of NAME with write
//! rights on both names (docs/security.md). A token scoped to the file NAME alone does
//! not reach the temporary name: such a put fails before writing anything and says so.
//!
//! What this deliberately does not do: keep the temporary file across attempts (a
//! retried put starts again), or hide temporary files from listings.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use dpuio_proto::v1 as pb;

use crate::client::{Client, File};
use crate::error::{Error, Result};

/// An unfinished whole-file put: write the new contents through [`Put::file`], then
/// [`Put::commit`] (or [`Put::abort`]). Dropped without either, the temporary file is
/// left until the session ends, when the agent removes it (see the module docs); the
/// target is untouched.
#[derive(Debug)]
pub struct Put {
    client: Client,
    file: Option<File>,
    temp: String,
    target: String,
}

/// A suffix that no other put of this or another process picks at the same time:
/// process id, time and a counter, mixed by the standard library's randomly keyed hash.
fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    h.write_u128(now.as_nanos());
    format!("{:016x}", h.finish())
}

/// A fresh temporary path for a put of `target` (a container path): for helpers that
/// write it themselves (the Python package) and then [`Client::rename_replace`] it.
pub fn temp_path(target: &str) -> Result<String> {
    let invalid = |reason: &str| Error::Agent {
        op: format!("put {target}"),
        code: tonic::Code::InvalidArgument,
        message: reason.to_owned(),
        reason: None,
    };
    let (dir, name) = target.rsplit_once('/').unwrap_or(("", target));
    if name.is_empty() {
        return Err(invalid("a put needs a file name, not a directory or the container root"));
    }
    let temp = dpuio_proto::put::temp_name(name, &unique_suffix()).ok_or_else(|| {
        invalid(&format!(
            "the file name is too long for a put's temporary name (.{name}{}SUFFIX must fit in 255 bytes); use a \
             shorter name",
            dpuio_proto::put::TEMP_MARKER
        ))
    })?;
    Ok(format!("{dir}/{temp}"))
}

impl Client {
    /// Rename `from` over the file `to` in one step, replacing it if it exists (as
    /// rename(2) does); `from` and an existing `to` must be files. Needs create and
    /// write on `to`, and delete on `from` unless `from` is a put's temporary file of
    /// `to`. Durable after [`Client::sync`].
    pub async fn rename_replace(&self, from: &str, to: &str) -> Result<()> {
        self.call(&format!("rename {from} over {to}"), false, |session_id| {
            let mut ns = self.ns();
            let request = pb::RenameRequest { session_id, from: from.to_owned(), to: to.to_owned(), replace: true };
            async move { ns.rename(request).await }
        })
        .await?;
        Ok(())
    }

    /// Start a whole-file put of `path`: a new temporary file beside it, open for
    /// writing. Nothing at `path` changes until [`Put::commit`].
    pub async fn put(&self, path: &str) -> Result<Put> {
        let temp = temp_path(path)?;
        let file = match self.create(&temp, true).await {
            Ok(file) => file,
            Err(Error::Agent { code, message, reason, .. }) if code == tonic::Code::PermissionDenied => {
                return Err(Error::Agent {
                    op: format!(
                        "put {path}: create its temporary file {temp} (a put writes there, then renames it over \
                         {path}; the session needs create and write in the directory of {path})"
                    ),
                    code,
                    message,
                    reason,
                });
            }
            Err(e) => return Err(e),
        };
        Ok(Put { client: self.clone(), file: Some(file), temp, target: path.to_owned() })
    }

    /// A whole-file put of `data` at `path` through one registered region: the
    /// Python and C whole-file helpers' path. Returns the bytes written.
    pub async fn put_bytes(&self, path: &str, data: &[u8]) -> Result<u64> {
        let put = self.put(path).await?;
        let written = put.write_all(data).await;
        match written {
            Ok(()) => put.commit().await.map(|()| data.len() as u64),
            Err(e) => {
                put.abort().await;
                Err(e)
            }
        }
    }
}

impl Put {
    /// The temporary file the new contents go to.
    pub fn file(&self) -> &File {
        self.file.as_ref().expect("a put holds its file until commit or abort")
    }

    /// The temporary file's path.
    pub fn temp_path(&self) -> &str {
        &self.temp
    }

    /// The path this put replaces.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Write `data` from offset 0 through one registered region of at most the
    /// agent's request size, reused chunk by chunk.
    async fn write_all(&self, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let max = usize::try_from(self.client.limits().max_io_bytes).unwrap_or(usize::MAX).max(4096);
        let chunk = data.len().min(max).min(64 << 20);
        let mut region = self.client.register_region(chunk, pb::RegionAccess::ReadByAgent).await?;
        let mut result = Ok(());
        for (k, piece) in data.chunks(chunk).enumerate() {
            region.write_at(0, piece);
            let file = self.file();
            let requests = vec![file.write_request(&region, 0, piece.len() as u64, (k * chunk) as u64)];
            let done = match self.client.submit(requests).await {
                Ok(done) => done,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            if let Some(Err(status)) = done.first().map(|d| d.result) {
                result = Err(Error::Io { op: format!("write {}", self.temp), status });
                break;
            }
        }
        let freed = self.client.deregister_region(region).await;
        result.and(freed)
    }

    /// Make the new contents durable, put them at the target in one step, and make
    /// that durable: once this returns, a restart of the agent finds the new file. On
    /// failure the temporary file is removed where the session may, and the target is
    /// the old file (or, if the rename itself was done and only the final sync failed,
    /// the new one, not yet known to be durable).
    pub async fn commit(mut self) -> Result<()> {
        let file = self.file.take().expect("a put holds its file until commit or abort");
        let published = async {
            file.close().await?;
            self.client.rename_replace(&self.temp, &self.target).await
        }
        .await;
        if let Err(e) = published {
            self.remove_temp().await;
            return Err(e);
        }
        self.client.sync().await
    }

    /// Give up: close and remove the temporary file (where the session may delete it);
    /// the target is untouched.
    pub async fn abort(mut self) {
        if let Some(file) = self.file.take() {
            let _ = file.close().await;
        }
        self.remove_temp().await;
    }

    async fn remove_temp(&self) {
        // Best effort: the put's own error is what the caller needs; a temporary file
        // left behind is harmless and named for what it is.
        let _ = self.client.remove(&self.temp, false).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temporary_file_is_beside_its_target_and_says_whose_it_is() {
        let t = temp_path("/data/model.pt").unwrap();
        let (dir, name) = t.rsplit_once('/').unwrap();
        assert_eq!(dir, "/data");
        assert!(dpuio_proto::put::is_temp_of(name, "model.pt"), "{t}");
        let root = temp_path("/top").unwrap();
        assert!(root.starts_with("/.top.dpuio-put."), "{root}");
        assert_ne!(temp_path("/data/model.pt").unwrap(), t, "two puts, two names");
        for bad in ["/", "", "/data/"] {
            let e = temp_path(bad).map(|_| ()).unwrap_err();
            assert_eq!(e.code(), Some(tonic::Code::InvalidArgument), "{bad:?}: {e}");
        }
        let e = temp_path(&format!("/d/{}", "n".repeat(240))).unwrap_err();
        assert!(e.to_string().contains("too long"), "{e}");
    }
}
