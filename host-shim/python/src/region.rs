//! `Region`: registered memory, exposed to Python through the buffer protocol.
//!
//! Lifetime: the memory is unmapped (and deregistered) only when the `Region` object is
//! garbage, never earlier. `torch.frombuffer` keeps a reference to the object it was
//! given but releases its buffer view at once, so counting views alone could not tell
//! whether a tensor still points into the memory; tying the mapping to the object's
//! lifetime can. `free()` makes the region unusable for new I/O and new views at once.

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use dpuio_shim::RegisteredRegion;
use dpuio_shim::blocking::{Failure, ProcessLocal, Session};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::errors::{Fail, R};

/// The registered memory and the session it belongs to; dropped when the last
/// reference goes (the Python object, or an I/O call in flight).
pub(crate) struct RegionInner {
    pub(crate) session: Arc<Session>,
    region: ProcessLocal<RegisteredRegion>,
}

impl Drop for RegionInner {
    fn drop(&mut self) {
        // In a forked child take() fails and ProcessLocal leaks the region.
        let Ok(region) = self.region.take() else { return };
        match self.session.client() {
            Ok(client) => {
                let client = client.clone();
                if self.session.can_block() {
                    let _ = self.session.run(client.deregister_region(region));
                } else {
                    self.session.spawn(async move {
                        let _ = client.deregister_region(region).await;
                    });
                }
            }
            Err(_) => drop(region), // detached: the agent forgot it with the session
        }
    }
}

/// Memory registered with the agent. Supports the buffer protocol (writable, bytes):
/// `memoryview(r)`, `numpy.frombuffer(r, dtype)`, `torch.frombuffer(r, dtype=...)` are
/// views of the memory the agent reads into and writes from.
#[pyclass(frozen, module = "dpuio._native", name = "Region")]
pub struct PyRegion {
    pub(crate) inner: Arc<RegionInner>,
    freed: AtomicBool,
    exports: AtomicUsize,
    ptr: usize,
    len: usize,
    id: u32,
}

impl PyRegion {
    pub(crate) fn new(session: Arc<Session>, region: RegisteredRegion) -> PyRegion {
        let (ptr, len, id) = (region.as_ptr() as usize, region.len(), region.id());
        PyRegion {
            inner: Arc::new(RegionInner { session, region: ProcessLocal::new(region) }),
            freed: AtomicBool::new(false),
            exports: AtomicUsize::new(0),
            ptr,
            len,
            id,
        }
    }

    /// Why the region cannot take part in new I/O or views, if it cannot.
    pub(crate) fn check_usable(&self) -> Result<(), Failure> {
        if self.freed.load(Ordering::Acquire) {
            return Err(Failure::closed(format!("region {} was freed", self.id)));
        }
        // Fails in a forked child, and after the client detached.
        self.inner.session.client()?;
        Ok(())
    }

    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[pymethods]
impl PyRegion {
    fn __len__(&self) -> usize {
        self.len
    }

    /// Length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    /// The region's id in ring entries.
    #[getter(id)]
    fn region_id(&self) -> u32 {
        self.id
    }

    /// True after `free()` (or once the client detached, or in another process).
    #[getter]
    fn freed(&self) -> bool {
        self.check_usable().is_err()
    }

    /// Buffer views (memoryviews, numpy arrays) currently made from this region.
    #[getter]
    fn exports(&self) -> usize {
        self.exports.load(Ordering::Acquire)
    }

    /// Make the region unusable: no new I/O, no new views. The memory is deregistered
    /// and unmapped once no Python object refers to the region any more (so arrays and
    /// tensors made from it never see unmapped memory). Idempotent.
    fn free(&self) {
        self.freed.store(true, Ordering::Release);
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.free();
        false
    }

    fn __repr__(&self) -> String {
        let state = if self.freed.load(Ordering::Acquire) { " freed" } else { "" };
        format!("<dpuio.Region id={} nbytes={}{state}>", self.id, self.len)
    }

    fn __reduce__(&self) -> R<()> {
        Err(Fail(Failure::invalid(
            "a Region cannot be pickled: it is memory of this process registered with the agent",
        )))
    }

    /// # Safety
    /// Called by Python with a valid `view` to fill (the buffer protocol).
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        this.check_usable().map_err(Fail)?;
        // SAFETY: view is the caller's Py_buffer to fill; ptr/len describe the mapping,
        // which lives as long as `slf` (RegionInner is dropped only with the object,
        // and PyBuffer_FillInfo stores a new reference to slf in view->obj). The memory
        // is writable by design (reads land there, writes are prepared there).
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(view, slf.as_ptr(), this.ptr as *mut c_void, this.len as ffi::Py_ssize_t, 0, flags)
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        this.exports.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// # Safety
    /// Called by Python once per successful `__getbuffer__`.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::AcqRel);
    }
}
