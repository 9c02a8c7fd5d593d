//! `dpuio._native`: the compiled part of the `dpuio` Python package.
//!
//! It exposes three kinds of object on top of the blocking session layer shared with
//! the C ABI and the `LD_PRELOAD` library (`dpuio_shim::blocking`):
//!
//! * `Session`: one attached session (control-only, or with a data plane), with the
//!   namespace calls, batched opens, a recursive listing and batched I/O;
//! * `Region`: registered memory with the buffer protocol, so `numpy.frombuffer` and
//!   `torch.frombuffer` see the bytes the agent put there without a copy;
//! * `File`: an open file.
//!
//! Every blocking call releases the GIL. Errors are raised as the classes of
//! `dpuio._errors` (a `dpuio.Error` hierarchy), chosen by the error's code.
//!
//! What it deliberately leaves to the Python layer (`dpuio/__init__.py`): choosing the
//! agent address, attaching again after `fork`, datasets and checkpoints. A region's
//! memory stays mapped while any Python object refers to the region (including numpy
//! arrays and torch tensors made from it): `free()` only makes it unusable, so no view
//! can ever point at unmapped memory.

use pyo3::prelude::*;

mod attr;
mod errors;
mod file;
mod region;
mod session;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<session::PySession>()?;
    m.add_class::<session::DirIter>()?;
    m.add_class::<region::PyRegion>()?;
    m.add_class::<file::PyFile>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
