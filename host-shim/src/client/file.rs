//! An open file: its handle, the calls on it, and its requests on the data plane.

use std::future::Future;
use std::sync::Arc;

use dpuio_proto::attr::Attr;
use dpuio_proto::host_ring::meta::OPEN_READ_BYTES;
use dpuio_proto::v1 as pb;
use dpuio_proto::wire::{MetaOpcode, Opcode};

use super::namespace::Opened;
use super::{Client, Inner, ring};
use crate::dataplane::{DataPlane, RegisteredRegion, Request};
use crate::error::{Error, Result};
use crate::resume::FileRecord;

/// An open file handle.
pub struct File {
    inner: Arc<Inner>,
    handle: u64,
    path: String,
    attr: Attr,
    chunk_bytes: u64,
}

impl File {
    /// A file the agent opened as `handle`: kept in the session's registry, to be
    /// opened again under the same handle after an agent restart.
    pub(super) fn opened(inner: &Arc<Inner>, opened: Opened, path: &str, write: bool) -> File {
        let Opened { handle, attr, chunk_bytes } = opened;
        inner.registry.add_file(handle, FileRecord { path: path.to_owned(), write });
        File { inner: inner.clone(), handle, path: path.to_owned(), attr, chunk_bytes }
    }

    /// A control-plane call on this file's handle (see [`Client::call`]).
    async fn call<T, F, Fut>(&self, op: &str, f: F) -> Result<T>
    where
        F: Fn(u64) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.inner.control.call(op, true, f).await
    }

    pub fn handle(&self) -> u64 {
        self.handle
    }
    pub fn path(&self) -> &str {
        &self.path
    }
    /// Attributes as of open.
    pub fn attr(&self) -> &Attr {
        &self.attr
    }
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// Current attributes (over the ring when the session has a data plane).
    pub async fn stat(&self) -> Result<Attr> {
        let op = format!("stat {}", self.path);
        self.inner.handle_namespace().stat_handle(&op, self.handle).await
    }

    /// Set the size through the handle (needs write access).
    pub async fn truncate(&self, size: u64) -> Result<()> {
        self.call(&format!("truncate {}", self.path), |session_id| {
            let mut ns = self.inner.control.ns();
            let request = pb::TruncateRequest {
                session_id,
                target: Some(pb::truncate_request::Target::Handle(self.handle)),
                size,
            };
            async move { ns.truncate(request).await }
        })
        .await?;
        Ok(())
    }

    /// Make this file durable.
    pub async fn sync(&self) -> Result<()> {
        self.call(&format!("sync {}", self.path), |session_id| {
            let mut ns = self.inner.control.ns();
            let handle = self.handle;
            async move { ns.sync(pb::SyncRequest { session_id, handle }).await }
        })
        .await?;
        Ok(())
    }

    /// A request reading `length` bytes at `file_offset` into `region` at `region_offset`.
    pub fn read_request(
        &self,
        region: &RegisteredRegion,
        region_offset: u64,
        length: u64,
        file_offset: u64,
    ) -> Request {
        Request {
            opcode: Opcode::Read,
            handle: self.handle,
            region_id: region.id(),
            region_offset,
            file_offset,
            length,
            sync: false,
            user_data: file_offset,
        }
    }

    /// A request writing `length` bytes from `region` at `region_offset` to `file_offset`.
    pub fn write_request(
        &self,
        region: &RegisteredRegion,
        region_offset: u64,
        length: u64,
        file_offset: u64,
    ) -> Request {
        Request { opcode: Opcode::Write, ..self.read_request(region, region_offset, length, file_offset) }
    }

    fn one(&self, op: &str, request: Request) -> Result<u64> {
        let data = self.inner.data().ok_or_else(|| Error::DataPlane {
            op: op.into(),
            reason: "this client attached without a data plane; set ConnectOptions::data_plane".into(),
        })?;
        let done = data.run(&[request])?;
        let d = done.first().ok_or_else(|| Error::Protocol { op: op.into(), reason: "no completion".into() })?;
        d.result.map_err(|status| Error::Io { op: format!("{op} {}", self.path), status })
    }

    /// Read into the whole region at `file_offset`; returns the bytes read (short only
    /// at end of file). Blocking: the agent puts the bytes straight into the region.
    pub fn read_at(&self, region: &RegisteredRegion, file_offset: u64) -> Result<u64> {
        self.one("read", self.read_request(region, 0, region.len() as u64, file_offset))
    }

    /// Write `length` bytes from the start of the region at `file_offset`. Blocking.
    pub fn write_at(&self, region: &RegisteredRegion, length: u64, file_offset: u64) -> Result<u64> {
        self.one("write", self.write_request(region, 0, length, file_offset))
    }

    /// Read from `data.len()` up to `size` bytes into `data` (the rest of a file
    /// larger than one open-read answer).
    pub(super) fn read_rest(&self, dp: &Arc<DataPlane>, data: &mut Vec<u8>, size: u64) -> Result<()> {
        dp.read_through_ring(&format!("read {}", self.path), self.handle, data, size)
    }

    /// Close the handle over the ring, blocking (for calls that are blocking already).
    pub(super) fn close_blocking(self, dp: &Arc<DataPlane>) -> Result<()> {
        ring::close(dp, &format!("close {}", self.path), self.handle)
    }

    /// Close a handle nothing was written through (nor truncated) with this process's
    /// next metadata call over the ring, in its submission, instead of a round trip of
    /// its own; without a data plane, now over gRPC. For callers that know the handle
    /// unwritten (`dpuio_shim::posix`): closing a written one so would return before
    /// its bytes are durable.
    pub async fn close_unwritten(self) -> Result<()> {
        let Some(dp) = self.inner.data().cloned() else { return self.close().await };
        let handle = self.handle;
        ring::off_runtime("close", move || dp.close_later(handle)).await
    }

    /// Close the handle; a written file is durable once this returns (over the ring
    /// when the session has a data plane).
    pub async fn close(self) -> Result<()> {
        let op = format!("close {}", self.path);
        self.inner.handle_namespace().close(&op, self.handle).await
    }
}

impl Drop for File {
    fn drop(&mut self) {
        // Closed, or no longer anyone's to use: not to be opened again on a resume.
        self.inner.registry.remove_file(self.handle);
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("handle", &format_args!("{:#018x}", self.handle))
            .field("path", &self.path)
            .finish()
    }
}

impl Client {
    /// The whole file at `path` in one submission where it fits the ring's answer
    /// area (512 KiB): the agent opens it, reads it into this process's memory and
    /// closes it. A larger file goes on with an open, reads and a close. Blocking on
    /// the ring; without a data plane this fails like any data-plane call.
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let dp = self.data()?;
        let (attr, mut data) = self.read_head(path, OPEN_READ_BYTES)?;
        if (data.len() as u64) < attr.size && data.len() == OPEN_READ_BYTES {
            // Longer than the answer area: read the rest through a handle.
            let opened = ring::open(dp, &format!("open {path}"), path, MetaOpcode::Open, 0)?;
            let file = File::opened(&self.inner, opened, path, false);
            let rest = file.read_rest(dp, &mut data, attr.size);
            let closed = file.close_blocking(dp);
            rest?;
            closed?;
        }
        Ok(data)
    }
}
