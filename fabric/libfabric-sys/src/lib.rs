//! Raw bindings to libfabric (`<rdma/fabric.h>` and the `fi_*` headers), generated
//! at build time by bindgen against the libfabric found with pkg-config (Debian
//! `libfabric-dev`, 1.17).
//!
//! # Static inline calls
//!
//! Most of libfabric's API has no symbol in `libfabric.so`: `fi_domain`,
//! `fi_endpoint`, `fi_mr_reg`, `fi_write`, `fi_cq_read`, `fi_close`, ... are
//! `static inline` functions in the headers that call through the ops tables of each
//! object (`ep->rma->write(...)`), some with version checks on the table size
//! (`FI_CHECK_OP`). Of the three ways to reach them we use bindgen's
//! `wrap_static_fns`: bindgen writes a C file with one exported wrapper per inline
//! (`fi_write__extern` calling `fi_write`), the build script compiles it with `cc`,
//! and the Rust functions keep the C names. That is
//!
//! * **sound**: the wrappers are the header's own code compiled by a C compiler, so
//!   struct layouts, ops-table offsets and the `FI_CHECK_OP` size checks are exactly
//!   what the installed headers say; nothing is transcribed by hand;
//! * **simple**: no list of functions to maintain (a hand-written C shim would need
//!   one entry per call, and calling the ops tables from Rust would re-implement
//!   every inline, including its checks, and break silently when a table grows).
//!
//! The cost is one extra call per operation, which is noise next to the provider.
//!
//! Function-like macros have no bindgen output; the few we need are below
//! ([`FI_VERSION`], [`FI_ADDR_UNSPEC`]). C enums are generated as integer constants
//! (`EnumVariation::Consts`) because libfabric ORs enum values together.
//!
//! The published `libfabric-sys` crate on crates.io (2018) builds a bundled
//! libfabric from source and no longer builds; this is our own crate of the same name.
//! Everything safe lives in the `fabric` crate (`fabric::ofi`).

// The re-implemented macros keep their C names, so `grep FI_VERSION` finds both.
#![allow(non_snake_case)]

/// bindgen output: C names, no docs, unsafe fns without `# Safety` sections.
mod generated {
    #![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code)]
    #![allow(unsafe_op_in_unsafe_fn, clippy::all, clippy::undocumented_unsafe_blocks)]
    #![allow(clippy::missing_safety_doc, rustdoc::all, improper_ctypes)]
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}
pub use generated::*;

/// `FI_VERSION(major, minor)`: the API version a caller asks `fi_getinfo` for.
#[inline]
pub const fn FI_VERSION(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// The API version of the headers these bindings were generated from.
pub const FI_API_VERSION: u32 = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);

/// `FI_ADDR_UNSPEC`: "any source" / "no address" (`(uint64_t) -1`).
pub const FI_ADDR_UNSPEC: fi_addr_t = u64::MAX;

/// `FI_ADDR_NOTAVAIL`: an address vector slot that could not be filled.
pub const FI_ADDR_NOTAVAIL: fi_addr_t = u64::MAX;

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn library_version_is_at_least_the_headers() {
        // SAFETY: fi_version takes no arguments and only returns a number.
        let v = unsafe { fi_version() };
        assert!(v >= FI_VERSION(1, 12), "libfabric {}.{} is older than 1.12", v >> 16, v & 0xffff);
        assert_eq!(FI_API_VERSION >> 16, FI_MAJOR_VERSION);
    }

    #[test]
    fn strerror_and_inline_wrappers_link() {
        // SAFETY: fi_strerror returns a static NUL-terminated string for any errno.
        let text = unsafe { CStr::from_ptr(fi_strerror(FI_EAGAIN as i32)) };
        assert!(!text.to_bytes().is_empty());
        // fi_allocinfo is a static inline: calling it proves the wrappers are linked.
        // SAFETY: fi_allocinfo allocates a zeroed fi_info (or returns NULL), which
        // fi_freeinfo releases.
        unsafe {
            let info = fi_allocinfo();
            assert!(!info.is_null());
            assert!(!(*info).ep_attr.is_null());
            fi_freeinfo(info);
        }
    }
}
