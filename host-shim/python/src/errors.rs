//! Errors as Python exceptions of the `dpuio.Error` hierarchy.
//!
//! The classes live in Python (`dpuio/_errors.py`), so they can also derive from the
//! built-in classes users already catch (`FileNotFoundError`, `PermissionError`, ...).

use dpuio_shim::blocking::{Code, Failure};
use pyo3::prelude::*;
use pyo3::types::PyType;

/// A failure on its way to Python.
pub(crate) struct Fail(pub(crate) Failure);

pub(crate) type R<T> = Result<T, Fail>;

impl From<Failure> for Fail {
    fn from(f: Failure) -> Fail {
        Fail(f)
    }
}

impl From<dpuio_shim::Error> for Fail {
    fn from(e: dpuio_shim::Error) -> Fail {
        Fail(e.into())
    }
}

impl From<Fail> for PyErr {
    fn from(f: Fail) -> PyErr {
        Python::attach(|py| to_pyerr(py, f.0))
    }
}

/// The `dpuio._errors` class for a code.
fn class_name(code: Code) -> &'static str {
    match code {
        Code::InvalidArgument => "InvalidArgument",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::OutOfRange => "OutOfRange",
        Code::Unavailable => "Unavailable",
        Code::TimedOut => "TimedOut",
        Code::Busy => "Busy",
        Code::Io => "BackendError",
        Code::Integrity => "IntegrityError",
        Code::Closed => "Closed",
        Code::Unsupported => "Unsupported",
        Code::Protocol => "ProtocolError",
        Code::Internal => "InternalError",
    }
}

pub(crate) fn to_pyerr(py: Python<'_>, f: Failure) -> PyErr {
    let class = py
        .import("dpuio._errors")
        .and_then(|m| m.getattr(class_name(f.code)))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
    match class {
        Ok(class) => PyErr::from_type(class, (f.message,)),
        Err(e) => e,
    }
}

/// An exception object (not raised), for calls that return one result per item.
pub(crate) fn exception(py: Python<'_>, f: Failure) -> Py<PyAny> {
    to_pyerr(py, f).into_value(py).into_any()
}
