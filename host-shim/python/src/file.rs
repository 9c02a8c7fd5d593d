//! `File`: an open file of the container.

use std::sync::{Arc, Mutex};

use dpuio_shim::blocking::{Failure, ProcessLocal, Session};
use dpuio_shim::{File, Opcode, Request};
use pyo3::prelude::*;

use crate::attr::attr_tuple;
use crate::errors::R;
use crate::region::PyRegion;

/// An open file. Reads and writes move data between the file and a `Region`; the
/// agent does the copying. Closed on `close()`, at the end of a `with` block, or when
/// garbage.
#[pyclass(frozen, module = "dpuio._native", name = "File")]
pub struct PyFile {
    pub(crate) session: Arc<Session>,
    file: Mutex<ProcessLocal<File>>,
    handle: u64,
    path: String,
    size: u64,
    writable: bool,
}

impl PyFile {
    pub(crate) fn new(session: Arc<Session>, file: File, writable: bool) -> PyFile {
        PyFile {
            handle: file.handle(),
            path: file.path().to_owned(),
            size: file.attr().size,
            session,
            file: Mutex::new(ProcessLocal::new(file)),
            writable,
        }
    }

    /// The handle for a request, if the file is open in this process.
    pub(crate) fn usable_handle(&self) -> Result<u64, Failure> {
        self.session.client()?;
        self.locked().get().map_err(|e| self.closed_error(e))?;
        Ok(self.handle)
    }

    pub(crate) fn path_str(&self) -> &str {
        &self.path
    }

    /// Take the shim's file out for closing (None if closed already or foreign).
    pub(crate) fn take(&self) -> Option<File> {
        self.locked().take().ok()
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, ProcessLocal<File>> {
        self.file.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn closed_error(&self, e: Failure) -> Failure {
        Failure::closed(format!("{}: {}", self.path, e.message))
    }

    fn io(&self, py: Python<'_>, opcode: Opcode, region: &PyRegion, spec: IoSpec) -> R<u64> {
        if !Arc::ptr_eq(&self.session, &region.inner.session) {
            return Err(Failure::invalid("the file and the region belong to different sessions").into());
        }
        region.check_usable()?;
        let handle = self.usable_handle()?;
        let region_len = region.len() as u64;
        let length = match spec.length {
            Some(n) => n,
            None => region_len.saturating_sub(spec.region_offset),
        };
        if spec.region_offset.checked_add(length).is_none_or(|end| end > region_len) {
            return Err(Failure::new(
                dpuio_shim::blocking::Code::OutOfRange,
                format!("range {}+{length} lies outside the {region_len}-byte region", spec.region_offset),
            )
            .into());
        }
        let request = Request {
            opcode,
            handle,
            region_id: region.id(),
            region_offset: spec.region_offset,
            file_offset: spec.file_offset,
            length,
            sync: spec.sync,
            user_data: 0,
        };
        // Keep the memory alive for the call even if Python drops the region meanwhile.
        let keep = region.inner.clone();
        let session = self.session.clone();
        let done = py.detach(move || {
            let r = session.submit(&[request]);
            drop(keep);
            r
        })?;
        let op = if opcode == Opcode::Read { "read" } else { "write" };
        match done.first() {
            Some(Ok(n)) => Ok(*n),
            Some(Err(status)) => {
                Err(Failure::io(&format!("{op} {} at offset {}", self.path, spec.file_offset), *status).into())
            }
            None => Ok(0),
        }
    }
}

struct IoSpec {
    file_offset: u64,
    region_offset: u64,
    length: Option<u64>,
    sync: bool,
}

impl Drop for PyFile {
    fn drop(&mut self) {
        let Some(file) = self.take() else { return };
        if self.session.client().is_err() {
            return; // detached: the agent closed it with the session
        }
        if self.session.can_block() {
            let _ = self.session.run(file.close());
        } else {
            self.session.spawn(async move {
                let _ = file.close().await;
            });
        }
    }
}

#[pymethods]
impl PyFile {
    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    /// Size in bytes when the file was opened (see `stat()` for the current one).
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    #[getter]
    fn handle(&self) -> u64 {
        self.handle
    }

    #[getter]
    fn writable(&self) -> bool {
        self.writable
    }

    #[getter]
    fn closed(&self) -> bool {
        self.usable_handle().is_err()
    }

    /// Current attributes, as a tuple (kind, size, mode, mtime_ns, object_id).
    fn stat(&self, py: Python<'_>) -> R<(&'static str, u64, u32, i64, u64)> {
        self.session.client()?;
        py.detach(|| {
            let file = self.locked();
            let file = file.get().map_err(|e| self.closed_error(e))?;
            Ok(attr_tuple(&self.session.run(file.stat())??))
        })
    }

    /// Set the size (needs a writable file).
    fn truncate(&self, py: Python<'_>, size: u64) -> R<()> {
        self.session.client()?;
        py.detach(|| {
            let file = self.locked();
            let file = file.get().map_err(|e| self.closed_error(e))?;
            Ok(self.session.run(file.truncate(size))??)
        })
    }

    /// Make the file durable.
    fn sync(&self, py: Python<'_>) -> R<()> {
        self.session.client()?;
        py.detach(|| {
            let file = self.locked();
            let file = file.get().map_err(|e| self.closed_error(e))?;
            Ok(self.session.run(file.sync())??)
        })
    }

    /// Close the handle (a written file is durable once this returns). Idempotent.
    fn close(&self, py: Python<'_>) -> R<()> {
        let Some(file) = self.take() else { return Ok(()) };
        if self.session.client().is_err() {
            return Ok(());
        }
        py.detach(|| Ok(self.session.run(file.close())??))
    }

    /// Read `length` bytes (default: the rest of the region) at `file_offset` into
    /// `region` at `region_offset`. Returns the bytes read (short only at end of file).
    ///
    /// Both directions take (region, file_offset, *, length, region_offset): only the
    /// two that say where are positional, so a call written for the old orders (which
    /// differed between the two) fails instead of moving the wrong bytes.
    #[pyo3(signature = (region, file_offset=0, *, length=None, region_offset=0))]
    fn read_into(
        &self,
        py: Python<'_>,
        region: &Bound<'_, PyRegion>,
        file_offset: u64,
        length: Option<u64>,
        region_offset: u64,
    ) -> R<u64> {
        self.io(py, Opcode::Read, region.get(), IoSpec { file_offset, region_offset, length, sync: false })
    }

    /// Write `length` bytes (default: the rest of the region) from `region` at
    /// `region_offset` to the file at `file_offset`; with `sync`, durable before it
    /// returns. The arguments are those of `read_into`, plus `sync`.
    #[pyo3(signature = (region, file_offset=0, *, length=None, region_offset=0, sync=false))]
    fn write_from(
        &self,
        py: Python<'_>,
        region: &Bound<'_, PyRegion>,
        file_offset: u64,
        length: Option<u64>,
        region_offset: u64,
        sync: bool,
    ) -> R<u64> {
        if !self.writable {
            return Err(Failure::new(
                dpuio_shim::blocking::Code::PermissionDenied,
                format!("{} is open read-only", self.path),
            )
            .into());
        }
        self.io(py, Opcode::Write, region.get(), IoSpec { file_offset, region_offset, length, sync })
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> R<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let mode = if self.writable { "r+" } else { "r" };
        let state = if self.closed() { " closed" } else { "" };
        format!("<dpuio.File {:?} mode={mode} size={}{state}>", self.path, self.size)
    }
}
