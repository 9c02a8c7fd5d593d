//! The namespace calls a session makes, behind one interface with two implementations:
//! over gRPC ([`Control`], here) and over a data-plane ring ([`super::ring`]), which
//! answers in tens of microseconds where gRPC takes hundreds. A client picks one per
//! call ([`super::Inner::namespace`]); the calls do not branch on the path themselves.
//!
//! Only the calls both paths carry are here (stat, lookup, readdir, open, create,
//! close, remove); the others (mkdir, rename, truncate, sync, delegate) are gRPC's
//! alone and stay plain [`Control::call`]s.
//!
//! Every call is async and never blocks a runtime thread: the ring's waits are
//! blocking, so its implementation runs them where blocking is allowed
//! ([`super::ring::off_runtime`]).

use std::future::Future;
use std::pin::Pin;

use dpuio_proto::attr::{Attr, DirEntry};
use dpuio_proto::v1 as pb;
use tokio_stream::StreamExt;

use super::Access;
use super::control::Control;
use crate::error::{Error, Result};

/// A namespace call in flight.
pub(crate) type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// What an open or create answered: an ordinary session handle, usable over either path.
pub(crate) struct Opened {
    pub handle: u64,
    pub attr: Attr,
    pub chunk_bytes: u64,
}

/// The namespace calls both paths carry. `op` names the call in errors ("stat /a").
pub(crate) trait Namespace: Send + Sync {
    /// Attributes of a path.
    fn stat<'a>(&'a self, op: &'a str, path: &'a str) -> Call<'a, Attr>;
    /// Attributes of an open handle.
    fn stat_handle<'a>(&'a self, op: &'a str, handle: u64) -> Call<'a, Attr>;
    /// Attributes of many paths, each with its own result, in as few calls as the
    /// agent's limit allows.
    fn lookup<'a>(&'a self, paths: &'a [String]) -> Call<'a, Vec<Result<Attr>>>;
    /// A listing of `path` in batches of up to `batch_size` (0: the agent's default),
    /// after `anchor` if given.
    fn readdir<'a>(
        &'a self,
        op: &'a str,
        path: &'a str,
        anchor: Option<&'a str>,
        batch_size: u32,
    ) -> Call<'a, Box<dyn Listing + 'a>>;
    /// Open an existing file.
    fn open<'a>(&'a self, op: &'a str, path: &'a str, access: Access) -> Call<'a, Opened>;
    /// Create (or, unless `exclusive`, truncate) a file and open it for writing.
    fn create<'a>(&'a self, op: &'a str, path: &'a str, exclusive: bool) -> Call<'a, Opened>;
    /// Close a handle; a written file is durable once this returns.
    fn close<'a>(&'a self, op: &'a str, handle: u64) -> Call<'a, ()>;
    /// Remove a file or an empty directory; `recursive` removes a whole tree. Never
    /// sent twice: a remove that ran would then fail with "no such file".
    fn remove<'a>(&'a self, op: &'a str, path: &'a str, recursive: bool) -> Call<'a, ()>;
}

/// A directory listing under way.
pub(crate) trait Listing: Send {
    /// The next batch, in name order; `None` once the listing is done.
    fn next_batch(&mut self) -> Call<'_, Option<Vec<DirEntry>>>;
}

/// Attributes from a gRPC answer.
pub(crate) fn attr_from(op: &str, a: Option<pb::Attr>) -> Result<Attr> {
    let a = a.ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: "attributes missing".into() })?;
    Attr::from_proto(&a)
        .ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: format!("unknown entry kind {}", a.kind) })
}

fn opened(op: &str, r: pb::OpenResponse) -> Result<Opened> {
    Ok(Opened { handle: r.handle, attr: attr_from(op, r.attr)?, chunk_bytes: r.chunk_bytes })
}

/// The gRPC implementation.
impl Namespace for Control {
    fn stat<'a>(&'a self, op: &'a str, path: &'a str) -> Call<'a, Attr> {
        Box::pin(async move {
            let r = self
                .call(op, true, |session_id| {
                    let mut ns = self.ns();
                    let request =
                        pb::StatRequest { session_id, target: Some(pb::stat_request::Target::Path(path.to_owned())) };
                    async move { ns.stat(request).await }
                })
                .await?;
            attr_from(op, r.attr)
        })
    }

    fn stat_handle<'a>(&'a self, op: &'a str, handle: u64) -> Call<'a, Attr> {
        Box::pin(async move {
            let r = self
                .call(op, true, |session_id| {
                    let mut ns = self.ns();
                    let request =
                        pb::StatRequest { session_id, target: Some(pb::stat_request::Target::Handle(handle)) };
                    async move { ns.stat(request).await }
                })
                .await?;
            attr_from(op, r.attr)
        })
    }

    fn lookup<'a>(&'a self, paths: &'a [String]) -> Call<'a, Vec<Result<Attr>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(paths.len());
            for chunk in paths.chunks(self.max_lookup_paths) {
                let r = self
                    .call("lookup", true, |session_id| {
                        let mut ns = self.ns();
                        let request = pb::LookupRequest { session_id, paths: chunk.to_vec() };
                        async move { ns.lookup(request).await }
                    })
                    .await?;
                for result in r.results {
                    let op = format!("lookup {}", result.path);
                    out.push(match result.result {
                        Some(pb::lookup_result::Result::Attr(a)) => attr_from(&op, Some(a)),
                        Some(pb::lookup_result::Result::Error(message)) => {
                            Err(Error::Agent { op, code: tonic::Code::from_i32(result.code), message, reason: None })
                        }
                        None => Err(Error::Protocol { op, reason: "empty result".into() }),
                    });
                }
            }
            Ok(out)
        })
    }

    fn readdir<'a>(
        &'a self,
        op: &'a str,
        path: &'a str,
        anchor: Option<&'a str>,
        batch_size: u32,
    ) -> Call<'a, Box<dyn Listing + 'a>> {
        Box::pin(async move {
            let stream = self
                .call(op, true, |session_id| {
                    let mut ns = self.ns();
                    let request = pb::ReaddirRequest {
                        session_id,
                        path: path.to_owned(),
                        anchor: anchor.unwrap_or_default().to_owned(),
                        batch_size,
                    };
                    async move { ns.readdir(request).await }
                })
                .await?;
            Ok(Box::new(GrpcListing { op, stream, done: false }) as Box<dyn Listing + 'a>)
        })
    }

    fn open<'a>(&'a self, op: &'a str, path: &'a str, access: Access) -> Call<'a, Opened> {
        Box::pin(async move {
            let r = self
                .call(op, true, |session_id| {
                    let mut ns = self.ns();
                    let request = pb::OpenRequest {
                        session_id,
                        path: path.to_owned(),
                        access: match access {
                            Access::ReadOnly => pb::Access::ReadOnly,
                            Access::ReadWrite => pb::Access::ReadWrite,
                        } as i32,
                        truncate: false,
                        handle: 0,
                    };
                    async move { ns.open(request).await }
                })
                .await?;
            opened(op, r)
        })
    }

    fn create<'a>(&'a self, op: &'a str, path: &'a str, exclusive: bool) -> Call<'a, Opened> {
        Box::pin(async move {
            // An exclusive create that ran would fail with "exists" if sent again.
            let r = self
                .call(op, !exclusive, |session_id| {
                    let mut ns = self.ns();
                    let request =
                        pb::CreateRequest { session_id, path: path.to_owned(), exclusive, ..Default::default() };
                    async move { ns.create(request).await }
                })
                .await?;
            opened(op, r)
        })
    }

    fn close<'a>(&'a self, op: &'a str, handle: u64) -> Call<'a, ()> {
        Box::pin(async move {
            self.call(op, true, |session_id| {
                let mut ns = self.ns();
                async move { ns.close(pb::CloseRequest { session_id, handle }).await }
            })
            .await?;
            Ok(())
        })
    }

    fn remove<'a>(&'a self, op: &'a str, path: &'a str, recursive: bool) -> Call<'a, ()> {
        Box::pin(async move {
            self.call(op, false, |session_id| {
                let mut ns = self.ns();
                let request = pb::RemoveRequest { session_id, path: path.to_owned(), recursive };
                async move { ns.remove(request).await }
            })
            .await?;
            Ok(())
        })
    }
}

/// A listing streamed by `Namespace.Readdir`.
struct GrpcListing<'a> {
    op: &'a str,
    stream: tonic::Streaming<pb::ReaddirResponse>,
    done: bool,
}

impl Listing for GrpcListing<'_> {
    fn next_batch(&mut self) -> Call<'_, Option<Vec<DirEntry>>> {
        Box::pin(async move {
            if self.done {
                return Ok(None);
            }
            let Some(batch) = self.stream.next().await else { return Ok(None) };
            let batch = batch.map_err(|s| Error::from_status(self.op, s))?;
            self.done = batch.done;
            let entries = batch
                .entries
                .into_iter()
                .map(|e| Ok(DirEntry { attr: attr_from(self.op, e.attr)?, name: e.name }))
                .collect::<Result<Vec<_>>>()?;
            Ok(Some(entries))
        })
    }
}
