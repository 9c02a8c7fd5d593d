//! Raw bindings to libfabric (`<rdma/fabric.h>` and the `fi_*` headers), generated
//! at build time by bindgen against the libfabric found with pkg-config (Debian
//! `libfabric-dev`, 1.17).
//!
//! # Loaded at run time
//!
//! Nothing links `libfabric.so`: [`api`] loads `libfabric.so.1` with `dlopen` the first
//! time a libfabric transport is opened, and the exported functions (`fi_getinfo`,
//! `fi_fabric`, `fi_freeinfo`, ...) are called through the [`Api`] it returns. Two
//! reasons:
//!
//! * **One libfabric per process, and the DAOS client's is the one that must win.**
//!   DAOS's mercury needs libfabric >= 1.20 (symbol version `FABRIC_1.7`) and ships its
//!   own build; the agent's data plane is fine with Debian's 1.17. A process has one
//!   `libfabric.so.1`: had the agent linked Debian's, the loader would have mapped it at
//!   start and handed it to mercury too, and `daos_init` would fail (`version FABRIC_1.7
//!   not found`). Loaded at run time, the agent opens its DAOS backend first, and the
//!   `dlopen` here then finds the library DAOS already mapped (by its soname).
//! * **A process pays nothing until it uses libfabric.** Loading libfabric runs its
//!   providers' start-up (0.2 s on our machines, mostly the PSM provider's); a host
//!   process on UCX, or a program under the preload library that never touches a dpuio
//!   path, no longer does.
//!
//! A newer library than the headers is used through the symbol versions the headers
//! describe: `build.rs` reads the default version of each function from the library it
//! compiled against (`fi_getinfo@@FABRIC_1.3` for 1.17), and [`api`] asks for exactly
//! that version with `dlvsym`. libfabric keeps its old versions as compatibility symbols
//! (1.22 made `FABRIC_1.7` the default, with another `struct fi_info`), so the structs
//! these bindings lay out are the ones the functions expect.
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

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

mod versions {
    include!(concat!(env!("OUT_DIR"), "/symbol_versions.rs"));
}

/// The soname loaded: the runtime package's file (Debian `libfabric1`), or whichever
/// `libfabric.so.1` the process already has.
pub const LIBRARY: &str = "libfabric.so.1";

/// Why libfabric cannot be used in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError {
    /// `dlopen("libfabric.so.1")` failed: the library is not installed (or not on the
    /// loader's path).
    NotFound {
        /// `dlerror()`'s text.
        reason: String,
    },
    /// The library is older than these bindings: it lacks a function at the symbol
    /// version the headers describe.
    MissingSymbol {
        /// The function.
        symbol: &'static str,
        /// The version asked for, e.g. `FABRIC_1.3`.
        version: String,
        /// The file the library was loaded from.
        path: String,
    },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::NotFound { reason } => write!(
                f,
                "libfabric could not be loaded ({reason}): install its runtime package (Debian/Ubuntu \
                 `libfabric1`, RHEL `libfabric`), or put the directory of another build's {LIBRARY} on \
                 LD_LIBRARY_PATH"
            ),
            LoadError::MissingSymbol { symbol, version, path } => write!(
                f,
                "{path} has no {symbol}@{version}: this libfabric is older than the {}.{} headers dpuio was \
                 built with; install libfabric >= {}.{}",
                FI_MAJOR_VERSION, FI_MINOR_VERSION, FI_MAJOR_VERSION, FI_MINOR_VERSION
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// `fi_getinfo`'s C signature.
pub type GetinfoFn =
    unsafe extern "C" fn(u32, *const c_char, *const c_char, u64, *const fi_info, *mut *mut fi_info) -> c_int;
/// `fi_freeinfo`'s C signature.
pub type FreeinfoFn = unsafe extern "C" fn(*mut fi_info);
/// `fi_dupinfo`'s C signature.
pub type DupinfoFn = unsafe extern "C" fn(*const fi_info) -> *mut fi_info;
/// `fi_fabric`'s C signature.
pub type FabricFn = unsafe extern "C" fn(*mut fi_fabric_attr, *mut *mut fid_fabric, *mut c_void) -> c_int;
/// `fi_strerror`'s C signature.
pub type StrerrorFn = unsafe extern "C" fn(c_int) -> *const c_char;
/// `fi_version`'s C signature.
pub type VersionFn = unsafe extern "C" fn() -> u32;

/// The exported libfabric functions, resolved at the symbol versions of the headers
/// (see `man fi_getinfo`, `man fi_fabric`).
pub struct Api {
    /// `fi_getinfo`.
    pub fi_getinfo: GetinfoFn,
    /// `fi_freeinfo`.
    pub fi_freeinfo: FreeinfoFn,
    /// `fi_dupinfo`.
    pub fi_dupinfo: DupinfoFn,
    /// `fi_fabric`.
    pub fi_fabric: FabricFn,
    /// `fi_strerror`.
    pub fi_strerror: StrerrorFn,
    /// `fi_version`.
    pub fi_version: VersionFn,
    path: String,
}

impl Api {
    /// `fi_allocinfo()`: a zeroed `fi_info` with its attribute structs allocated (or
    /// NULL), to be freed with `fi_freeinfo` (the header's inline is `fi_dupinfo(NULL)`).
    pub fn allocinfo(&self) -> *mut fi_info {
        // SAFETY: fi_dupinfo(NULL) allocates a new zeroed fi_info; it reads nothing.
        unsafe { (self.fi_dupinfo)(std::ptr::null()) }
    }

    /// `fi_strerror(code)` as text.
    pub fn strerror(&self, code: c_int) -> String {
        // SAFETY: fi_strerror accepts any number and returns a static NUL-terminated string.
        unsafe { CStr::from_ptr((self.fi_strerror)(code)) }.to_string_lossy().into_owned()
    }

    /// The library's version, `(major, minor)`.
    pub fn version(&self) -> (u32, u32) {
        // SAFETY: fi_version takes nothing and returns a number.
        let v = unsafe { (self.fi_version)() };
        (v >> 16, v & 0xffff)
    }

    /// The file the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// libfabric, loaded on the first call (later calls return the same result).
pub fn api() -> Result<&'static Api, LoadError> {
    static API: OnceLock<Result<Api, LoadError>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// The library if this process has already loaded it, without loading it: for a
/// caller that needs to know which libfabric (if any) another component brought in.
pub fn loaded() -> Option<(String, (u32, u32))> {
    let name = CString::new(LIBRARY).expect("no NUL in the soname");
    // SAFETY: RTLD_NOLOAD only looks the name up among loaded objects; the handle is
    // released below.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return None;
    }
    let version = symbol(handle, "fi_version", "FABRIC_1.0");
    let answer = version.map(|f| {
        // SAFETY: fi_version@FABRIC_1.0 has the signature `uint32_t fi_version(void)`.
        let f = unsafe { std::mem::transmute::<*mut c_void, VersionFn>(f) };
        // SAFETY: as above.
        let v = unsafe { f() };
        (path_of(f as *const c_void), (v >> 16, v & 0xffff))
    });
    // SAFETY: handle came from dlopen above; the library stays loaded (it was before).
    unsafe { libc::dlclose(handle) };
    answer
}

fn load() -> Result<Api, LoadError> {
    let name = CString::new(LIBRARY).expect("no NUL in the soname");
    // SAFETY: dlopen with a soname; the handle is never closed (the functions are used
    // for the life of the process). libfabric's constructors run here.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(LoadError::NotFound { reason: dl_error() });
    }
    let get = |symbol: &'static str| -> Result<*mut c_void, LoadError> {
        let version = versions::SYMBOL_VERSIONS
            .iter()
            .find(|(name, _)| *name == symbol)
            .map(|(_, v)| *v)
            .expect("build.rs records every exported function");
        self::symbol(handle, symbol, version).ok_or_else(|| LoadError::MissingSymbol {
            symbol,
            version: version.to_owned(),
            path: self::symbol(handle, "fi_version", "FABRIC_1.0")
                .map_or_else(|| LIBRARY.to_owned(), |p| path_of(p.cast_const())),
        })
    };
    // SAFETY: (each transmute) the symbol was resolved at the version whose C
    // signature the type names (the headers these bindings come from).
    unsafe {
        let fi_getinfo = std::mem::transmute::<*mut c_void, GetinfoFn>(get("fi_getinfo")?);
        Ok(Api {
            path: path_of(fi_getinfo as *const c_void),
            fi_getinfo,
            fi_freeinfo: std::mem::transmute::<*mut c_void, FreeinfoFn>(get("fi_freeinfo")?),
            fi_dupinfo: std::mem::transmute::<*mut c_void, DupinfoFn>(get("fi_dupinfo")?),
            fi_fabric: std::mem::transmute::<*mut c_void, FabricFn>(get("fi_fabric")?),
            fi_strerror: std::mem::transmute::<*mut c_void, StrerrorFn>(get("fi_strerror")?),
            fi_version: std::mem::transmute::<*mut c_void, VersionFn>(get("fi_version")?),
        })
    }
}

/// `dlvsym(handle, name, version)`, or None.
fn symbol(handle: *mut c_void, name: &str, version: &str) -> Option<*mut c_void> {
    let (name, version) = (CString::new(name).ok()?, CString::new(version).ok()?);
    // SAFETY: handle is a live dlopen handle; both strings are NUL-terminated.
    let p = unsafe { libc::dlvsym(handle, name.as_ptr(), version.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// The file holding the code at `addr`.
fn path_of(addr: *const c_void) -> String {
    let mut info: libc::Dl_info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only fills `info`; dli_fname points into the loader's own data.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return LIBRARY.to_owned();
    }
    // SAFETY: as above, a NUL-terminated path.
    unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned()
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message owned by the loader.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "dlopen failed".to_owned()
    } else {
        // SAFETY: see above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

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

    #[test]
    fn library_version_is_at_least_the_headers() {
        let api = api().unwrap();
        let (major, minor) = api.version();
        assert!((major, minor) >= (1, 12), "libfabric {major}.{minor} is older than 1.12");
        assert_eq!(FI_API_VERSION >> 16, FI_MAJOR_VERSION);
        assert!(api.path().contains("libfabric.so"), "{}", api.path());
        assert_eq!(loaded().map(|(path, _)| path), Some(api.path().to_owned()));
    }

    #[test]
    fn strerror_allocinfo_and_inline_wrappers() {
        let api = api().unwrap();
        assert!(!api.strerror(FI_EAGAIN as i32).is_empty());
        let info = api.allocinfo();
        assert!(!info.is_null());
        // SAFETY: info came from fi_dupinfo(NULL): its attribute structs are allocated;
        // fi_freeinfo releases it all once.
        unsafe {
            assert!(!(*info).ep_attr.is_null());
            (api.fi_freeinfo)(info);
        }
        // A static inline: calling one proves the wrappers are compiled in. fi_close on
        // a fid whose ops table reports an error number must just return it.
        let mut ops = fi_ops { size: std::mem::size_of::<fi_ops>(), close: Some(close_fails), ..Default::default() };
        let mut fid = fid { fclass: 0, context: std::ptr::null_mut(), ops: &mut ops };
        // SAFETY: fid's ops table is valid for the call; close_fails only returns.
        assert_eq!(unsafe { fi_close(&mut fid) }, -(FI_EINVAL as i32));
    }

    unsafe extern "C" fn close_fails(_: *mut fid) -> c_int {
        -(FI_EINVAL as i32)
    }
}
