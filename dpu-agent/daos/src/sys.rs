//! Declarations from the DAOS 2.x public headers and the run-time loader.
//!
//! Written by hand from `include/daos_types.h`, `gurt/types.h`, `daos_pool.h`,
//! `daos_cont.h`, `daos_fs.h` and `daos_obj_class.h` of DAOS 2.9 (the tree in
//! `../shared/daos`), for only what the backend calls. Every struct whose address we pass
//! has its size and field offsets checked at compile time against the header's layout on
//! 64-bit Linux, so a mismatch fails the build rather than corrupting memory. `struct
//! stat` and `struct dirent` come from `libc`: they differ between x86-64 and aarch64.
//!
//! `daos_pool_connect` and `daos_cont_open` are macros in the 2.x headers for the
//! exported symbols `daos_pool_connect2` and `daos_cont_open2`; those are what we load.
//! `dfs_*` return a positive errno; `daos_*` a negative DER code.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};

use libc::{dirent, mode_t, stat};
use libloading::Library;

/// `daos_handle_t`: a pool, container, object or event-queue handle.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct daos_handle_t {
    pub cookie: u64,
}
const _: () = assert!(size_of::<daos_handle_t>() == 8);

/// `d_iov_t` (gurt/types.h): one memory buffer.
#[repr(C)]
#[derive(Debug)]
pub struct d_iov_t {
    pub iov_buf: *mut c_void,
    pub iov_buf_len: usize,
    pub iov_len: usize,
}
const _: () = assert!(size_of::<d_iov_t>() == 24);
const _: () = assert!(offset_of!(d_iov_t, iov_buf) == 0);
const _: () = assert!(offset_of!(d_iov_t, iov_buf_len) == 8);
const _: () = assert!(offset_of!(d_iov_t, iov_len) == 16);

/// `d_sg_list_t` (gurt/types.h): a scatter/gather list of `d_iov_t`.
#[repr(C)]
#[derive(Debug)]
pub struct d_sg_list_t {
    pub sg_nr: u32,
    pub sg_nr_out: u32,
    pub sg_iovs: *mut d_iov_t,
}
const _: () = assert!(size_of::<d_sg_list_t>() == 16);
const _: () = assert!(offset_of!(d_sg_list_t, sg_nr) == 0);
const _: () = assert!(offset_of!(d_sg_list_t, sg_nr_out) == 4);
const _: () = assert!(offset_of!(d_sg_list_t, sg_iovs) == 8);

/// `DAOS_ANCHOR_BUF_MAX` of daos_types.h.
pub const DAOS_ANCHOR_BUF_MAX: usize = 104;
/// `DAOS_ANCHOR_TYPE_EOF`: iteration is complete.
pub const DAOS_ANCHOR_TYPE_EOF: u16 = 3;

/// `daos_anchor_t`: an iteration position. 120 bytes in DAOS 2.x (2+2+4+8+104).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct daos_anchor_t {
    pub da_type: u16,
    pub da_shard: u16,
    pub da_flags: u32,
    pub da_sub_anchors: u64,
    pub da_buf: [u8; DAOS_ANCHOR_BUF_MAX],
}
pub const DAOS_ANCHOR_BYTES: usize = 120;
const _: () = assert!(size_of::<daos_anchor_t>() == DAOS_ANCHOR_BYTES);
const _: () = assert!(offset_of!(daos_anchor_t, da_type) == 0);
const _: () = assert!(offset_of!(daos_anchor_t, da_shard) == 2);
const _: () = assert!(offset_of!(daos_anchor_t, da_flags) == 4);
const _: () = assert!(offset_of!(daos_anchor_t, da_sub_anchors) == 8);
const _: () = assert!(offset_of!(daos_anchor_t, da_buf) == 16);

impl daos_anchor_t {
    /// `DAOS_ANCHOR_INIT`.
    pub const ZERO: daos_anchor_t =
        daos_anchor_t { da_type: 0, da_shard: 0, da_flags: 0, da_sub_anchors: 0, da_buf: [0; DAOS_ANCHOR_BUF_MAX] };

    /// `daos_anchor_is_eof` (a static inline in daos_types.h).
    pub fn is_eof(&self) -> bool {
        self.da_type == DAOS_ANCHOR_TYPE_EOF
    }

    /// The anchor's bytes, exactly as the C struct holds them (little-endian fields).
    pub fn to_bytes(self) -> [u8; DAOS_ANCHOR_BYTES] {
        let mut out = [0u8; DAOS_ANCHOR_BYTES];
        out[0..2].copy_from_slice(&self.da_type.to_le_bytes());
        out[2..4].copy_from_slice(&self.da_shard.to_le_bytes());
        out[4..8].copy_from_slice(&self.da_flags.to_le_bytes());
        out[8..16].copy_from_slice(&self.da_sub_anchors.to_le_bytes());
        out[16..].copy_from_slice(&self.da_buf);
        out
    }

    /// The inverse of [`daos_anchor_t::to_bytes`].
    pub fn from_bytes(bytes: &[u8; DAOS_ANCHOR_BYTES]) -> daos_anchor_t {
        let mut da_buf = [0u8; DAOS_ANCHOR_BUF_MAX];
        da_buf.copy_from_slice(&bytes[16..]);
        daos_anchor_t {
            da_type: u16::from_le_bytes([bytes[0], bytes[1]]),
            da_shard: u16::from_le_bytes([bytes[2], bytes[3]]),
            da_flags: u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
            da_sub_anchors: u64::from_le_bytes(bytes[8..16].try_into().unwrap_or([0; 8])),
            da_buf,
        }
    }
}

/// `daos_obj_id_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct daos_obj_id_t {
    pub lo: u64,
    pub hi: u64,
}
const _: () = assert!(size_of::<daos_obj_id_t>() == 16);
const _: () = assert!(offset_of!(daos_obj_id_t, hi) == 8);

/// `dfs_obj_info_t` (daos_fs.h).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct dfs_obj_info_t {
    pub doi_oclass_id: u32,
    pub doi_chunk_size: u64,
    pub doi_dir_oclass_id: u32,
    pub doi_file_oclass_id: u32,
    pub doi_oid: daos_obj_id_t,
}
const _: () = assert!(size_of::<dfs_obj_info_t>() == 40);
const _: () = assert!(offset_of!(dfs_obj_info_t, doi_chunk_size) == 8);
const _: () = assert!(offset_of!(dfs_obj_info_t, doi_dir_oclass_id) == 16);
const _: () = assert!(offset_of!(dfs_obj_info_t, doi_file_oclass_id) == 20);
const _: () = assert!(offset_of!(dfs_obj_info_t, doi_oid) == 24);

/// `daos_event_t` (daos_types.h): the completion of one asynchronous call. `ev_error`
/// is the call's result once the event completed (for `dfs_*` calls, which set
/// `daos_event_errno_rc`, a positive errno); the rest is DAOS's own.
#[repr(C)]
pub struct daos_event_t {
    pub ev_error: c_int,
    /// 152 bytes of DAOS state plus 8 of padding for `pthread_mutex_t` on aarch64.
    pub ev_private: [u64; 20],
    pub ev_debug: u64,
}
const _: () = assert!(size_of::<daos_event_t>() == 176);
const _: () = assert!(offset_of!(daos_event_t, ev_error) == 0);
const _: () = assert!(offset_of!(daos_event_t, ev_private) == 8);
const _: () = assert!(offset_of!(daos_event_t, ev_debug) == 168);

impl daos_event_t {
    /// An event before `daos_event_init`, which fills it.
    pub const ZERO: daos_event_t = daos_event_t { ev_error: 0, ev_private: [0; 20], ev_debug: 0 };
}

/// `uuid_t` of libuuid: 16 bytes.
pub type uuid_t = [u8; 16];
const _: () = assert!(size_of::<uuid_t>() == 16);

/// `struct stat` and `struct dirent` as glibc lays them out on the two targets we build.
#[cfg(target_arch = "x86_64")]
const _: () = {
    assert!(size_of::<stat>() == 144);
    assert!(offset_of!(stat, st_size) == 48);
    assert!(size_of::<dirent>() == 280);
    assert!(offset_of!(dirent, d_type) == 18);
    assert!(offset_of!(dirent, d_name) == 19);
};
#[cfg(target_arch = "aarch64")]
const _: () = {
    assert!(size_of::<stat>() == 128);
    assert!(size_of::<dirent>() == 280);
    assert!(offset_of!(dirent, d_name) == 19);
};

/// Opaque `dfs_t`.
#[repr(C)]
pub struct dfs_t {
    _private: [u8; 0],
}
/// Opaque `dfs_obj_t`.
#[repr(C)]
pub struct dfs_obj_t {
    _private: [u8; 0],
}

/// `DAOS_PC_RW` (daos_pool.h): connect read-write.
pub const DAOS_PC_RW: c_uint = 1 << 1;
/// `DAOS_COO_RW` (daos_cont.h): open a container read-write.
pub const DAOS_COO_RW: c_uint = 1 << 1;

/// `daos_prop_entry` (daos_prop.h): one property; the union is a u64, a string or a
/// pointer (an ACL).
#[repr(C)]
pub struct daos_prop_entry {
    pub dpe_type: u32,
    pub dpe_flags: u16,
    pub dpe_reserv: u16,
    pub dpe_val_ptr: *mut c_void,
}
const _: () = assert!(size_of::<daos_prop_entry>() == 16);
const _: () = assert!(offset_of!(daos_prop_entry, dpe_val_ptr) == 8);

/// `daos_prop_t` (daos_prop.h); only ever held through libdaos's own pointer.
#[repr(C)]
pub struct daos_prop_t {
    pub dpp_nr: u32,
    pub dpp_reserv: u32,
    pub dpp_entries: *mut daos_prop_entry,
}
const _: () = assert!(size_of::<daos_prop_t>() == 16);

/// `dfs_attr_t` (daos_fs.h): how `dfs_cont_create_with_label` makes a container.
#[repr(C)]
pub struct dfs_attr_t {
    pub da_id: u64,
    pub da_chunk_size: u64,
    pub da_oclass_id: u32,
    pub da_props: *mut daos_prop_t,
    pub da_mode: u32,
    pub da_dir_oclass_id: u32,
    pub da_file_oclass_id: u32,
    pub da_hints: [c_char; 128],
}
const _: () = assert!(offset_of!(dfs_attr_t, da_props) == 24);
const _: () = assert!(offset_of!(dfs_attr_t, da_mode) == 32);
const _: () = assert!(offset_of!(dfs_attr_t, da_hints) == 44);
const _: () = assert!(size_of::<dfs_attr_t>() == 176);

/// `DAOS_PROP_CO_REDUN_FAC` (DAOS_PROP_CO_MIN 0x1000 + 7): the redundancy factor.
pub const DAOS_PROP_CO_REDUN_FAC: u32 = 0x1007;
/// `DAOS_PROP_CO_REDUN_LVL`: the fault domain level it counts (1 rank, 2 node).
pub const DAOS_PROP_CO_REDUN_LVL: u32 = 0x1008;

/// `DAOS_PROP_CO_ACL` of `enum daos_cont_props` (DAOS_PROP_CO_MIN 0x1000 + 10).
pub const DAOS_PROP_CO_ACL: u32 = 0x100a;
/// `DAOS_PROP_CO_OWNER`: the owner's principal, `user@`.
pub const DAOS_PROP_CO_OWNER: u32 = 0x100d;
/// `DAOS_ACL_OWNER_GROUP` of `enum daos_acl_principal_type` (daos_security.h).
pub const DAOS_ACL_OWNER_GROUP: c_int = 2;

/// One exported function: its symbol and its C type.
macro_rules! api {
    ($( $lib:ident : $name:ident : fn($($arg:ty),*) -> $ret:ty; )*) => {
        /// Every function we call, resolved once when the libraries are loaded.
        pub struct Api {
            $( pub $name: unsafe extern "C" fn($($arg),*) -> $ret, )*
            _libs: Libraries,
        }

        impl Api {
            fn resolve(libs: Libraries) -> Result<Api, String> {
                $(
                    // SAFETY: the declared type is the one in the DAOS 2.x header for
                    // this symbol (see the module doc); the library stays loaded as long
                    // as `Api` lives (it owns `libs`), so the pointer never dangles.
                    let $name = unsafe {
                        *libs.$lib
                            .get::<unsafe extern "C" fn($($arg),*) -> $ret>(concat!(stringify!($name), "\0").as_bytes())
                            .map_err(|e| format!("{}: symbol {}: {e}", libs.paths.$lib.display(), stringify!($name)))?
                    };
                )*
                Ok(Api { $( $name, )* _libs: libs })
            }
        }
    };
}

api! {
    gurt: d_errstr: fn(c_int) -> *const c_char;
    gurt: d_errdesc: fn(c_int) -> *const c_char;
    daos: daos_init: fn() -> c_int;
    daos: daos_fini: fn() -> c_int;
    daos: daos_pool_connect2: fn(*const c_char, *const c_char, c_uint, *mut daos_handle_t, *mut c_void, *mut c_void) -> c_int;
    daos: daos_pool_disconnect: fn(daos_handle_t, *mut c_void) -> c_int;
    daos: daos_cont_open2: fn(daos_handle_t, *const c_char, c_uint, *mut daos_handle_t, *mut c_void, *mut c_void) -> c_int;
    daos: daos_cont_close: fn(daos_handle_t, *mut c_void) -> c_int;
    daos: daos_oclass_name2id: fn(*const c_char) -> c_int;
    daos: daos_cont_get_acl: fn(daos_handle_t, *mut *mut daos_prop_t, *mut c_void) -> c_int;
    daos: daos_cont_delete_acl: fn(daos_handle_t, c_int, *const c_char, *mut c_void) -> c_int;
    // libdaos_common's, found through libdaos (dlsym searches a library's dependencies).
    daos: daos_prop_entry_get: fn(*mut daos_prop_t, u32) -> *mut daos_prop_entry;
    daos: daos_prop_free: fn(*mut daos_prop_t) -> ();
    daos: daos_prop_alloc: fn(u32) -> *mut daos_prop_t;
    daos: daos_acl_to_strs: fn(*mut c_void, *mut *mut *mut c_char, *mut usize) -> c_int;
    daos: daos_eq_create: fn(*mut daos_handle_t) -> c_int;
    daos: daos_eq_destroy: fn(daos_handle_t, c_int) -> c_int;
    daos: daos_eq_poll: fn(daos_handle_t, c_int, i64, c_uint, *mut *mut daos_event_t) -> c_int;
    daos: daos_event_init: fn(*mut daos_event_t, daos_handle_t, *mut daos_event_t) -> c_int;
    daos: daos_event_fini: fn(*mut daos_event_t) -> c_int;
    dfs: dfs_cont_create_with_label: fn(daos_handle_t, *const c_char, *mut c_void, *mut uuid_t, *mut daos_handle_t, *mut *mut dfs_t) -> c_int;
    dfs: dfs_mount: fn(daos_handle_t, daos_handle_t, c_int, *mut *mut dfs_t) -> c_int;
    dfs: dfs_umount: fn(*mut dfs_t) -> c_int;
    dfs: dfs_lookup: fn(*mut dfs_t, *const c_char, c_int, *mut *mut dfs_obj_t, *mut mode_t, *mut stat) -> c_int;
    dfs: dfs_lookup_rel: fn(*mut dfs_t, *mut dfs_obj_t, *const c_char, c_int, *mut *mut dfs_obj_t, *mut mode_t, *mut stat) -> c_int;
    // Not in daos_fs.h but exported by libdfs (dfuse's create): dfs_open (which is this
    // call with a NULL stat) that also fills a stat of the entry it made or opened.
    dfs: dfs_open_stat: fn(*mut dfs_t, *mut dfs_obj_t, *const c_char, mode_t, c_int, u32, u64, *const c_char, *mut *mut dfs_obj_t, *mut stat) -> c_int;
    dfs: dfs_release: fn(*mut dfs_obj_t) -> c_int;
    dfs: dfs_read: fn(*mut dfs_t, *mut dfs_obj_t, *mut d_sg_list_t, u64, *mut u64, *mut daos_event_t) -> c_int;
    dfs: dfs_write: fn(*mut dfs_t, *mut dfs_obj_t, *mut d_sg_list_t, u64, *mut daos_event_t) -> c_int;
    dfs: dfs_punch: fn(*mut dfs_t, *mut dfs_obj_t, u64, u64) -> c_int;
    dfs: dfs_readdirplus: fn(*mut dfs_t, *mut dfs_obj_t, *mut daos_anchor_t, *mut u32, *mut dirent, *mut stat) -> c_int;
    dfs: dfs_mkdir: fn(*mut dfs_t, *mut dfs_obj_t, *const c_char, mode_t, u32) -> c_int;
    dfs: dfs_remove: fn(*mut dfs_t, *mut dfs_obj_t, *const c_char, bool, *mut daos_obj_id_t) -> c_int;
    dfs: dfs_move: fn(*mut dfs_t, *mut dfs_obj_t, *const c_char, *mut dfs_obj_t, *const c_char, *mut daos_obj_id_t) -> c_int;
    dfs: dfs_stat: fn(*mut dfs_t, *mut dfs_obj_t, *const c_char, *mut stat) -> c_int;
    dfs: dfs_ostat: fn(*mut dfs_t, *mut dfs_obj_t, *mut stat) -> c_int;
    dfs: dfs_obj_get_info: fn(*mut dfs_t, *mut dfs_obj_t, *mut dfs_obj_info_t) -> c_int;
    dfs: dfs_sync: fn(*mut dfs_t) -> c_int;
}

/// The three libraries, kept loaded for as long as the [`Api`] that owns them.
struct Libraries {
    gurt: Library,
    daos: Library,
    dfs: Library,
    paths: LibraryPaths,
}

struct LibraryPaths {
    gurt: PathBuf,
    daos: PathBuf,
    dfs: PathBuf,
}

/// Where the libraries are looked for, in order: `$DPUIO_DAOS_PREFIX/lib64`,
/// `$DPUIO_DAOS_PREFIX/lib`, `/usr/lib/daos/lib64` (the `daos-client` package of
/// deploy/daos), `/opt/daos/lib64`, then the dynamic loader's own search
/// (`LD_LIBRARY_PATH`, `ld.so.cache`, `/usr/lib`...), given as `None`.
pub fn search_dirs(prefix: Option<&Path>) -> Vec<Option<PathBuf>> {
    let mut dirs = Vec::new();
    if let Some(prefix) = prefix {
        dirs.push(Some(prefix.join("lib64")));
        dirs.push(Some(prefix.join("lib")));
    }
    dirs.push(Some(PathBuf::from("/usr/lib/daos/lib64")));
    dirs.push(Some(PathBuf::from("/opt/daos/lib64")));
    dirs.push(None);
    dirs
}

/// Load libgurt, libdaos and libdfs from the first place that has all three, and
/// resolve every symbol. The error lists each place tried and why it failed.
pub fn load(prefix: Option<&Path>) -> Result<Api, Vec<String>> {
    load_from(search_dirs(prefix))
}

fn load_from(dirs: Vec<Option<PathBuf>>) -> Result<Api, Vec<String>> {
    let mut tried = Vec::new();
    for dir in dirs {
        let path = |name: &str| dir.as_ref().map_or_else(|| PathBuf::from(name), |d| d.join(name));
        let paths = LibraryPaths { gurt: path("libgurt.so"), daos: path("libdaos.so"), dfs: path("libdfs.so") };
        let where_ =
            dir.as_ref().map_or_else(|| "the dynamic loader's default path".to_owned(), |d| d.display().to_string());
        if let Some(d) = &dir
            && !d.join("libdfs.so").exists()
        {
            tried.push(format!("{where_}: no libdfs.so there"));
            continue;
        }
        let open = |p: &Path| {
            // SAFETY: loading a library runs its initialisers. These are the DAOS client
            // libraries, whose initialisers only set up their own module state; we load
            // them once per process (see `crate::runtime`).
            unsafe { Library::new(p) }.map_err(|e| format!("{where_}: {e}"))
        };
        let libs = (|| {
            Ok::<_, String>(Libraries {
                gurt: open(&paths.gurt)?,
                daos: open(&paths.daos)?,
                dfs: open(&paths.dfs)?,
                paths: LibraryPaths { gurt: paths.gurt.clone(), daos: paths.daos.clone(), dfs: paths.dfs.clone() },
            })
        })();
        match libs.and_then(Api::resolve) {
            Ok(api) => {
                tracing::info!("DAOS client libraries loaded from {where_}");
                return Ok(api);
            }
            Err(e) => tried.push(e),
        }
    }
    Err(tried)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_order_puts_the_prefix_first_and_the_loader_last() {
        let dirs = search_dirs(Some(Path::new("/p")));
        assert_eq!(
            dirs,
            [
                Some("/p/lib64".into()),
                Some("/p/lib".into()),
                Some("/usr/lib/daos/lib64".into()),
                Some("/opt/daos/lib64".into()),
                None::<PathBuf>
            ]
        );
        assert_eq!(search_dirs(None).len(), 3);
    }

    #[test]
    fn a_failed_search_names_every_place_and_why() {
        let empty = tempfile::tempdir().unwrap();
        let broken = tempfile::tempdir().unwrap();
        for lib in ["libgurt.so", "libdaos.so", "libdfs.so"] {
            std::fs::write(broken.path().join(lib), b"not an ELF file").unwrap();
        }
        let Err(tried) = load_from(vec![Some(empty.path().into()), Some(broken.path().into())]) else {
            panic!("loaded DAOS from files that are not libraries")
        };
        assert_eq!(tried.len(), 2, "{tried:?}");
        assert!(tried[0].contains(&empty.path().display().to_string()) && tried[0].contains("no libdfs.so"));
        assert!(tried[1].contains(&broken.path().display().to_string()), "{tried:?}");
    }
}
