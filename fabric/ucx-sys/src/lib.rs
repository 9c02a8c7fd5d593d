//! Raw bindings to the UCX UCP API (`<ucp/api/ucp.h>`), generated at build time by
//! bindgen against the UCX found with pkg-config (Debian `libucx-dev`, UCX >= 1.10).
//!
//! This crate is deliberately thin: the bindgen output, plus Rust versions of the few
//! parts of the API that are C macros or `static inline` functions and so have no
//! symbol to link against (`UCS_PTR_*`, `ucp_init`). Everything safe lives in the
//! `fabric` crate; nothing here tries to be idiomatic.
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

/// `ucp_init` is a `static inline` wrapper in the header that passes the API version
/// the caller was compiled against; do the same with the version of the header these
/// bindings were generated from.
///
/// # Safety
///
/// Same contract as the C `ucp_init`: `params` must point to a valid, initialised
/// `ucp_params_t` whose `field_mask` covers only initialised fields; `config` must be
/// null or a live `ucp_config_t` from `ucp_config_read`; `context_p` must be valid for
/// a write.
#[inline]
pub unsafe fn ucp_init(
    params: *const ucp_params_t,
    config: *const ucp_config_t,
    context_p: *mut ucp_context_h,
) -> ucs_status_t {
    // SAFETY: forwarded contract, see the function's `# Safety` section.
    unsafe { ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context_p) }
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
        let (mut major, mut minor, mut release) = (0, 0, 0);
        // SAFETY: ucp_get_version only writes the three out-parameters.
        unsafe { ucp_get_version(&mut major, &mut minor, &mut release) };
        assert_eq!(major, UCP_API_MAJOR);
        assert!(minor >= 10, "UCX {major}.{minor}.{release} is older than 1.10");
    }
}
