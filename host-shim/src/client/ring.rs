//! The namespace over a data-plane ring: metadata entries ([`crate::dataplane`]'s
//! `metadata`) whose answers are read here, and the calls only a ring carries (whole
//! files and training samples in one submission).
//!
//! A ring's wait is blocking: a thread polls the ring's memory, then sleeps on its
//! futex. An async call must not do that on a thread that runs the runtime's tasks, so
//! the [`Namespace`] implementation runs each call through [`off_runtime`]: in place
//! where the calling thread may block, on the blocking pool otherwise.

use std::sync::Arc;

use dpuio_proto::attr::{Attr, DirEntry};
use dpuio_proto::host_ring::meta::{self, MetaCall};
use dpuio_proto::wire::{self, AnswerRecords, MetaOpcode, RecordOverrun};
use host_bytes::HostBytes;
use tokio::runtime::RuntimeFlavor;

use super::control::Control;
use super::namespace::{Call, Listing, Namespace, Opened};
use super::{Access, Client};
use crate::dataplane::{AnswerTo, DataPlane, RegisteredRegion, on_handle};
use crate::error::{Error, Result};

/// The ring implementation of [`Namespace`]: the session's data plane, and its control
/// plane for what a ring cannot carry (a path longer than the request area, or the
/// reason a session ended).
pub(crate) struct RingNamespace {
    pub(super) dp: Arc<DataPlane>,
    control: Arc<Control>,
}

/// Whether the calling thread may block in a ring's wait: it runs none of a runtime's
/// tasks. True outside any runtime (a plain thread), and in a multi-thread runtime's
/// `block_on` outside a task, where the caller's own thread drives only its own future
/// (the C ABI, Python and the preload library call so, through
/// [`crate::blocking::Session::run`], as does a `#[tokio::main]` body); false in a task,
/// and anywhere on a current-thread runtime, whose one thread runs every task, the
/// lease's renewal included.
pub(super) fn may_block_here() -> bool {
    match tokio::runtime::Handle::try_current() {
        Err(_) => true,
        Ok(runtime) => runtime.runtime_flavor() == RuntimeFlavor::MultiThread && tokio::task::try_id().is_none(),
    }
}

/// Run the blocking ring call `f` without blocking a runtime thread: in place where the
/// calling thread may block ([`may_block_here`]: no hop, the ring's latency is tens of
/// microseconds), else on the runtime's blocking pool.
pub(super) async fn off_runtime<T: Send + 'static>(
    op: &str,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    if may_block_here() {
        return f();
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::DataPlane { op: op.to_owned(), reason: format!("the blocking pool: {e}") })?
}

impl RingNamespace {
    pub(super) fn new(dp: Arc<DataPlane>, control: Arc<Control>) -> RingNamespace {
        RingNamespace { dp, control }
    }

    /// Run `f` on the data plane off the runtime (see [`off_runtime`]).
    async fn run<T: Send + 'static>(
        &self,
        op: &str,
        f: impl FnOnce(&Arc<DataPlane>) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let dp = self.dp.clone();
        off_runtime(op, move || f(&dp)).await
    }
}

impl Namespace for RingNamespace {
    fn stat<'a>(&'a self, op: &'a str, path: &'a str) -> Call<'a, Attr> {
        Box::pin(async move {
            let (o, p) = (op.to_owned(), path.to_owned());
            let r = self.run(op, move |dp| stat(dp, &o, &p)).await;
            if r.is_ok() || !self.dp.is_ended() {
                return r;
            }
            // The session ended while waiting: gRPC says why.
            self.control.stat(op, path).await
        })
    }

    fn stat_handle<'a>(&'a self, op: &'a str, handle: u64) -> Call<'a, Attr> {
        Box::pin(async move {
            let o = op.to_owned();
            self.run(op, move |dp| stat_handle(dp, &o, handle)).await
        })
    }

    fn lookup<'a>(&'a self, paths: &'a [String]) -> Call<'a, Vec<Result<Attr>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(paths.len());
            let mut rest = paths;
            while !rest.is_empty() {
                let n = meta::lookup_group(rest, self.control.max_lookup_paths);
                if n == 0 {
                    // One path longer than the request area: let gRPC answer it.
                    out.extend(self.control.lookup(&rest[..1]).await?);
                    rest = &rest[1..];
                    continue;
                }
                let (chunk, next) = rest.split_at(n);
                let chunk = chunk.to_vec();
                out.extend(self.run("lookup", move |dp| lookup(dp, &chunk)).await?);
                rest = next;
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
        let listing = RingListing {
            ring: self,
            op: op.to_owned(),
            path: path.to_owned(),
            anchor: Some(anchor.unwrap_or_default().to_owned()),
            batch_size,
        };
        Box::pin(async move { Ok(Box::new(listing) as Box<dyn Listing + 'a>) })
    }

    fn open<'a>(&'a self, op: &'a str, path: &'a str, access: Access) -> Call<'a, Opened> {
        let flags = if access == Access::ReadWrite { wire::META_WRITE } else { 0 };
        Box::pin(async move {
            let (o, p) = (op.to_owned(), path.to_owned());
            self.run(op, move |dp| open(dp, &o, &p, MetaOpcode::Open, flags)).await
        })
    }

    fn create<'a>(&'a self, op: &'a str, path: &'a str, exclusive: bool) -> Call<'a, Opened> {
        let flags = if exclusive { wire::META_EXCLUSIVE } else { 0 };
        Box::pin(async move {
            let (o, p) = (op.to_owned(), path.to_owned());
            self.run(op, move |dp| open(dp, &o, &p, MetaOpcode::Create, flags)).await
        })
    }

    fn close<'a>(&'a self, op: &'a str, handle: u64) -> Call<'a, ()> {
        Box::pin(async move {
            let o = op.to_owned();
            self.run(op, move |dp| close(dp, &o, handle)).await
        })
    }

    fn remove<'a>(&'a self, op: &'a str, path: &'a str, recursive: bool) -> Call<'a, ()> {
        let flags = if recursive { wire::META_RECURSIVE } else { 0 };
        Box::pin(async move {
            let (o, p) = (op.to_owned(), path.to_owned());
            self.run(op, move |dp| {
                let paths = [p.as_str()];
                dp.metadata(&o, &on_path(MetaOpcode::Remove, flags, &paths), AnswerTo::RING, |_| Ok(()))
            })
            .await
        })
    }
}

/// A listing in batches over the ring, each from the anchor the last one ended at.
struct RingListing<'a> {
    ring: &'a RingNamespace,
    op: String,
    path: String,
    /// Where the next batch starts (empty: the start); `None` once done.
    anchor: Option<String>,
    batch_size: u32,
}

impl Listing for RingListing<'_> {
    fn next_batch(&mut self) -> Call<'_, Option<Vec<DirEntry>>> {
        Box::pin(async move {
            let Some(anchor) = self.anchor.take() else { return Ok(None) };
            let (op, path, batch_size) = (self.op.clone(), self.path.clone(), self.batch_size);
            let (entries, next) =
                self.ring.run(&self.op, move |dp| readdir(dp, &op, &path, &anchor, batch_size)).await?;
            self.anchor = next;
            Ok(Some(entries))
        })
    }
}

/// The metadata entry of `opcode` on one path.
fn on_path<'a>(opcode: MetaOpcode, flags: u16, path: &'a [&'a str]) -> MetaCall<'a> {
    MetaCall { opcode, flags, handle: 0, strings: path, arg: 0 }
}

/// Attributes from a metadata answer's record.
fn attr_of(op: &str, r: &wire::AttrRecord) -> Result<Attr> {
    Attr::from_record(r)
        .ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: format!("unknown entry kind {}", r.kind) })
}

/// The header of a metadata answer (the bytes the agent wrote).
fn meta_header(op: &str, answer: HostBytes<'_>) -> Result<wire::MetaHeader> {
    let mut b = [0u8; wire::META_ANSWER_HEADER_BYTES as usize];
    let head = answer
        .get(..b.len())
        .ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: format!("an answer of {} bytes", answer.len()) })?;
    head.copy_to_slice(&mut b);
    wire::MetaHeader::decode(&b)
        .ok_or_else(|| Error::Protocol { op: op.to_owned(), reason: "a malformed answer".into() })
}

fn overrun(op: &str) -> impl Fn(RecordOverrun) -> Error + '_ {
    move |e| Error::Protocol { op: op.to_owned(), reason: e.to_string() }
}

fn stat(dp: &Arc<DataPlane>, op: &str, path: &str) -> Result<Attr> {
    let paths = [path];
    let call = on_path(MetaOpcode::Stat, 0, &paths);
    dp.metadata(op, &call, AnswerTo::RING, |answer| attr_of(op, &meta_header(op, answer)?.attr))
}

fn stat_handle(dp: &Arc<DataPlane>, op: &str, handle: u64) -> Result<Attr> {
    let call = on_handle(MetaOpcode::StatHandle, handle);
    dp.metadata(op, &call, AnswerTo::RING, |answer| attr_of(op, &meta_header(op, answer)?.attr))
}

/// Attributes of `paths`, which fit one entry ([`meta::lookup_group`]).
fn lookup(dp: &Arc<DataPlane>, paths: &[String]) -> Result<Vec<Result<Attr>>> {
    let strings: Vec<&str> = paths.iter().map(String::as_str).collect();
    let call = MetaCall { opcode: MetaOpcode::Lookup, flags: 0, handle: 0, strings: &strings, arg: paths.len() as u32 };
    dp.metadata("lookup", &call, AnswerTo::RING, |answer| {
        let header = meta_header("lookup", answer)?;
        if header.count != paths.len() as u64 {
            return Err(Error::Protocol { op: "lookup".into(), reason: format!("{} results", header.count) });
        }
        let bytes = answer.to_vec();
        let mut records = AnswerRecords::new(&bytes);
        paths
            .iter()
            .map(|path| {
                let op = format!("lookup {path}");
                let r = records.lookup().map_err(overrun(&op))?;
                Ok(match r.code {
                    0 => attr_of(&op, &r.attr),
                    code => Err(Error::agent(op, wire::CodeWord::from_u32(code), r.message)),
                })
            })
            .collect()
    })
}

/// One batch of a listing from `anchor`, and where the next starts (`None`: done).
fn readdir(
    dp: &Arc<DataPlane>,
    op: &str,
    path: &str,
    anchor: &str,
    batch_size: u32,
) -> Result<(Vec<DirEntry>, Option<String>)> {
    let call = MetaCall { opcode: MetaOpcode::Readdir, flags: 0, handle: 0, strings: &[path, anchor], arg: batch_size };
    dp.metadata(op, &call, AnswerTo::RING, |answer| {
        let header = meta_header(op, answer)?;
        let bytes = answer.to_vec();
        let mut records = AnswerRecords::new(&bytes);
        let mut entries = Vec::with_capacity(header.count.min(1 << 16) as usize);
        for _ in 0..header.count {
            let r = records.dir_entry().map_err(overrun(op))?;
            entries.push(DirEntry { attr: attr_of(op, &r.attr)?, name: r.name });
        }
        let next = records.anchor().map_err(overrun(op))?;
        Ok((entries, header.more.then_some(next)))
    })
}

/// Open or create over the ring: the handle is an ordinary session handle.
pub(super) fn open(dp: &Arc<DataPlane>, op: &str, path: &str, opcode: MetaOpcode, flags: u16) -> Result<Opened> {
    let paths = [path];
    let call = on_path(opcode, flags, &paths);
    let header = dp.metadata(op, &call, AnswerTo::RING, |answer| meta_header(op, answer))?;
    Ok(Opened { handle: header.handle, attr: attr_of(op, &header.attr)?, chunk_bytes: header.chunk_bytes })
}

pub(super) fn close(dp: &Arc<DataPlane>, op: &str, handle: u64) -> Result<()> {
    dp.metadata(op, &on_handle(MetaOpcode::Close, handle), AnswerTo::RING, |_| Ok(()))
}

/// What only a ring carries: a whole file, or a training sample, in one submission.
impl Client {
    /// The attributes of the file at `path` and its first bytes, at most `max_bytes`
    /// (up to 512 KiB - 64), in one submission: the agent opens it, reads them into this
    /// process's memory and closes it. The whole file when `attr.size` is the length
    /// returned. Blocking on the ring.
    pub fn read_head(&self, path: &str, max_bytes: usize) -> Result<(Attr, Vec<u8>)> {
        let mut data = Vec::new();
        let attr = self.read_head_into(path, max_bytes, &mut data)?;
        Ok((attr, data))
    }

    /// [`Client::read_head`] into `out` (cleared first), for callers that reuse their
    /// buffers: a fresh vector per small file is mmapped and faulted in by glibc's
    /// malloc each time at these sizes.
    pub fn read_head_into(&self, path: &str, max_bytes: usize, out: &mut Vec<u8>) -> Result<Attr> {
        let op = format!("read {path}");
        let dp = self.data()?;
        let paths = [path];
        let call = on_path(MetaOpcode::OpenRead, 0, &paths);
        let room = (max_bytes + wire::META_ANSWER_HEADER_BYTES as usize).min(meta::ANSWER_BYTES) as u32;
        dp.metadata(&op, &call, AnswerTo::Ring(room), |answer| {
            let header = meta_header(&op, answer)?;
            let start = wire::META_ANSWER_HEADER_BYTES as usize;
            let count = header.count.min((answer.len() - start) as u64) as usize;
            let attr = attr_of(&op, &header.attr)?;
            out.clear();
            out.resize(count, 0);
            answer.slice(start..start + count).copy_to_slice(out);
            Ok(attr)
        })
    }

    /// A training sample in one submission: the agent opens `path`, reads it into
    /// `region` at `offset + 64` (up to `length - 64` bytes) and closes it, and writes
    /// the file's attributes before it (a 64-byte header). Returns the attributes and
    /// the bytes read, which start at `offset + 64`. No byte passes through this
    /// process's CPU. Blocking.
    pub fn read_sample(&self, path: &str, region: &RegisteredRegion, offset: u64, length: u32) -> Result<(Attr, u64)> {
        let op = format!("read {path}");
        let paths = [path];
        let call = on_path(MetaOpcode::OpenRead, 0, &paths);
        self.data()?.metadata(&op, &call, AnswerTo::Region(region, offset, length), |answer| {
            let header = meta_header(&op, answer)?;
            Ok((attr_of(&op, &header.attr)?, header.count))
        })
    }

    /// A batch of training samples in one submission: for each `(path, offset,
    /// length)`, what [`Client::read_sample`] does, into ranges of one `region` that
    /// must not overlap. One doorbell and one wait for the batch (a loader's batch of
    /// samples costs this process about one sleep and wake-up, not one per sample).
    /// Each sample gets its own result, in order: a missing file fails alone. Batches
    /// larger than a ring go out in several submissions. Blocking.
    pub fn read_samples(
        &self,
        region: &RegisteredRegion,
        samples: &[(&str, u64, u32)],
    ) -> Result<Vec<Result<(Attr, u64)>>> {
        let strings: Vec<[&str; 1]> = samples.iter().map(|&(path, ..)| [path]).collect();
        let calls: Vec<_> = samples
            .iter()
            .zip(&strings)
            .map(|(&(path, offset, length), strings)| {
                (format!("read {path}"), on_path(MetaOpcode::OpenRead, 0, strings), (region, offset, length))
            })
            .collect();
        self.data()?.metadata_batch(&calls, |op, answer| {
            let header = meta_header(op, answer)?;
            Ok((attr_of(op, &header.attr)?, header.count))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::may_block_here;

    #[test]
    fn only_threads_that_run_no_tasks_block_in_a_rings_wait() {
        assert!(may_block_here(), "a plain thread");
        let multi = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
        assert!(multi.block_on(async { may_block_here() }), "a multi-thread runtime's block_on: the caller's thread");
        assert!(!multi.block_on(multi.spawn(async { may_block_here() })).unwrap(), "a task on a worker");
        let current = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert!(!current.block_on(async { may_block_here() }), "a current-thread runtime's one thread");
        assert!(!current.block_on(async { tokio::spawn(async { may_block_here() }).await.unwrap() }), "its task");
    }
}
