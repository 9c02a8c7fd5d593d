//! The blocking session layer, shared with the Python extension and the `LD_PRELOAD`
//! library: it lives in [`dpuio_shim::blocking`] so that every blocking caller runs the
//! async client the same way. Re-exported here under its old path.
pub use dpuio_shim::blocking::*;
