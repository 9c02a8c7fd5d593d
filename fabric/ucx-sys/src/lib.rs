//! Raw bindings to the UCX UCP API (`<ucp/api/ucp.h>`), generated at build time by
//! bindgen against the UCX found with pkg-config (Debian `libucx-dev`, UCX >= 1.10).
//!
//! This crate is deliberately thin: the bindgen output, plus Rust versions of the few
//! parts of the API that are C macros or `static inline` functions and so have no
//! symbol to link against (`UCS_PTR_*`, `ucp_init`). Everything safe lives in the
//! `fabric` crate; nothing here tries to be idiomatic.
//!
//! # Loaded at run time
//!
//! Nothing links `libucp.so`: [`api`] loads `libucp.so.0` (and with it `libucs`,
//! `libuct`, `libucm`) the first time a UCX transport is opened, and the functions are
//! called through the [`Ucx`] table it returns (`api()?.ucp_put_nbx(...)`). Loading
//! UCX runs its libraries' constructors (configuration parsing, memory hooks, about
//! 2 ms): linked at load, every process under `libdpuio_preload.so` and every `dpuio`
//! command paid them, including those that never touch a dpuio path. libfabric is
//! loaded the same way, for the same reason (`libfabric-sys`).
//!
//! The table holds only the functions `build.rs` lists; a library that lacks one fails
//! to load with its name ([`LoadError::Library`]), never at the call.
//!
//! C enums are generated as integer constants (`EnumVariation::Consts`) because UCX
//! ORs its enum values together as bit masks.
//!
//! The published `ucx-sys` crate on crates.io (2017) builds a bundled UCX from source
//! and no longer builds; this is our own crate of the same name.

// The re-implemented macros keep their C names, so `grep UCS_PTR_IS_ERR` finds both.
#![allow(non_snake_case)]

/// bindgen output: C names, no docs, unsafe fns without `# Safety` sections.
mod generated {
    #![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code)]
    #![allow(unsafe_op_in_unsafe_fn, clippy::all, clippy::undocumented_unsafe_blocks)]
    #![allow(clippy::missing_safety_doc, rustdoc::all, improper_ctypes)]
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}
pub use generated::*;

use std::ffi::CString;
use std::sync::OnceLock;

/// The soname loaded: the runtime package's file (Debian `libucx0`), or whichever
/// `libucp.so.0` the process already has.
pub const LIBRARY: &str = "libucp.so.0";

/// Why UCX cannot be used in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError {
    /// `dlopen("libucp.so.0")` failed, or the library lacks one of the functions these
    /// bindings call (a UCX older than the headers they were generated from).
    Library {
        /// The loader's text (`dlerror()`), which names the missing file or symbol.
        reason: String,
    },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Library { reason } => write!(
                f,
                "UCX could not be loaded ({reason}): install its runtime package (Debian/Ubuntu `libucx0`, \
                 RHEL `ucx`) at version {UCP_API_MAJOR}.{UCP_API_MINOR} or newer, or put the directory of \
                 another build's {LIBRARY} on LD_LIBRARY_PATH"
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// UCX, loaded on the first call (later calls return the same result).
pub fn api() -> Result<&'static Ucx, LoadError> {
    static API: OnceLock<Result<Ucx, LoadError>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Whether this process has `libucp.so.0` mapped (by [`api`], by a program that links
/// it, or by another component), without loading it.
pub fn loaded() -> bool {
    let name = CString::new(LIBRARY).expect("no NUL in the soname");
    // SAFETY: RTLD_NOLOAD only looks the name up among loaded objects; a handle it
    // returns is released at once (the library stays, as it was before).
    unsafe {
        let handle = libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if handle.is_null() {
            return false;
        }
        libc::dlclose(handle);
    }
    true
}

fn load() -> Result<Ucx, LoadError> {
    // RTLD_NOW: a missing dependency shows here, not at some later call; RTLD_LOCAL:
    // UCX's symbols stay out of the global scope of the program it is loaded into.
    // SAFETY: loading runs UCX's constructors, which have no preconditions; the library
    // is never unloaded (the table lives in a static), so its functions stay valid.
    let library = unsafe { libloading::os::unix::Library::open(Some(LIBRARY), libc::RTLD_NOW | libc::RTLD_LOCAL) }
        .map_err(|e| LoadError::Library { reason: e.to_string() })?;
    // SAFETY: every symbol is resolved by the name bindgen took from the headers, with
    // the C signature the headers give it.
    unsafe { Ucx::from_library(library) }.map_err(|e| LoadError::Library { reason: e.to_string() })
}

/// `UCS_PTR_IS_ERR(ptr)`: the pointer returned by a `*_nb`/`*_nbx` call encodes an
/// error status (the values `UCS_ERR_LAST..=-1` cast to a pointer).
#[inline]
pub fn UCS_PTR_IS_ERR(ptr: ucs_status_ptr_t) -> bool {
    (ptr as usize) >= (UCS_ERR_LAST as isize as usize)
}

/// `UCS_PTR_IS_PTR(ptr)`: the pointer is a real request handle (neither `NULL`, which
/// means "completed in place", nor an encoded error).
#[inline]
pub fn UCS_PTR_IS_PTR(ptr: ucs_status_ptr_t) -> bool {
    (ptr as usize).wrapping_sub(1) < (UCS_ERR_LAST as isize as usize).wrapping_sub(1)
}

/// `UCS_PTR_RAW_STATUS(ptr)`: reinterpret the pointer as a status code.
#[inline]
pub fn UCS_PTR_RAW_STATUS(ptr: ucs_status_ptr_t) -> ucs_status_t {
    ptr as isize as ucs_status_t
}

/// `UCS_PTR_STATUS(ptr)`: `UCS_INPROGRESS` for a request handle, otherwise the status
/// encoded in the pointer (`UCS_OK` for `NULL`).
#[inline]
pub fn UCS_PTR_STATUS(ptr: ucs_status_ptr_t) -> ucs_status_t {
    if UCS_PTR_IS_PTR(ptr) { UCS_INPROGRESS } else { UCS_PTR_RAW_STATUS(ptr) }
}

impl Ucx {
    /// `ucp_init` is a `static inline` wrapper in the header that passes the API
    /// version the caller was compiled against; do the same with the version of the
    /// header these bindings were generated from.
    ///
    /// # Safety
    ///
    /// Same contract as the C `ucp_init`: `params` must point to a valid, initialised
    /// `ucp_params_t` whose `field_mask` covers only initialised fields; `config` must
    /// be null or a live `ucp_config_t` from `ucp_config_read`; `context_p` must be
    /// valid for a write.
    #[inline]
    pub unsafe fn ucp_init(
        &self,
        params: *const ucp_params_t,
        config: *const ucp_config_t,
        context_p: *mut ucp_context_h,
    ) -> ucs_status_t {
        // SAFETY: forwarded contract, see the function's `# Safety` section.
        unsafe { self.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context_p) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_pointer_macros() {
        let null: ucs_status_ptr_t = std::ptr::null_mut();
        assert!(!UCS_PTR_IS_ERR(null));
        assert!(!UCS_PTR_IS_PTR(null));
        assert_eq!(UCS_PTR_STATUS(null), UCS_OK);

        let err = UCS_ERR_NO_MEMORY as isize as ucs_status_ptr_t;
        assert!(UCS_PTR_IS_ERR(err));
        assert!(!UCS_PTR_IS_PTR(err));
        assert_eq!(UCS_PTR_STATUS(err), UCS_ERR_NO_MEMORY);

        let mut req = 0u64;
        let ptr = (&mut req as *mut u64).cast::<std::ffi::c_void>();
        assert!(!UCS_PTR_IS_ERR(ptr));
        assert!(UCS_PTR_IS_PTR(ptr));
        assert_eq!(UCS_PTR_STATUS(ptr), UCS_INPROGRESS);
    }

    #[test]
    fn library_version_matches_header_major() {
        let ucx = api().expect("UCX loads");
        assert!(loaded());
        let (mut major, mut minor, mut release) = (0, 0, 0);
        // SAFETY: ucp_get_version only writes the three out-parameters.
        unsafe { ucx.ucp_get_version(&mut major, &mut minor, &mut release) };
        assert_eq!(major, UCP_API_MAJOR);
        assert!(minor >= 10, "UCX {major}.{minor}.{release} is older than 1.10");
    }
}
