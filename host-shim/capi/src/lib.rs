//! `libdpuio`: the dpuio host shim for C (and anything that calls C).
//!
//! A C program attaches to the agent, registers regions, opens files, and moves data
//! with batches of requests in the shape of 3FS USRBIO and cuFile's batch API: prepare
//! entries, submit them with one doorbell, wait for at least N completions with a
//! timeout. The header `include/dpuio.h` is generated from this crate by cbindgen (the
//! test `tests/header.rs` fails when it is stale; `DPUIO_BLESS=1` rewrites it), so the
//! doc comments here and in the family modules are the C documentation.
//!
//! Conventions: every function returns an `int` that is `DPUIO_OK` (0), a count (>= 0)
//! where the function says so, or a negative `DPUIO_E_*` code;
//! `dpuio_last_error_message()` then says what went wrong. No panic crosses the ABI
//! (each entry point catches it and returns `DPUIO_E_INTERNAL`). Handles are checked
//! against a registry of live objects, so NULL, destroyed or wrong-kind handles are
//! refused instead of dereferenced.
//!
//! What it deliberately does not do: run callbacks on its own threads (the readdir
//! callback runs on the caller's thread), or retry behind the caller's back, except
//! data-plane requests the agent refused with `Busy` in the blocking helpers.
//!
//! The blocking session layer is [`dpuio_shim::blocking`], shared with the Python
//! extension and the `LD_PRELOAD` library.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dpuio_shim::{
    Access, Attr, Batch, ConnectOptions, DataPlaneOptions, Done, EntryKind, File, Opcode, RegionAccess,
    RegisteredRegion, Request,
};

/// cbindgen:ignore
mod handles;

use dpuio_shim::blocking::{Code, DirStream, Failure, ProcessLocal, Result, Session};
use handles::{Handle, Kind};

// ---------------------------------------------------------------------------------
// Codes, flags and plain structs
// ---------------------------------------------------------------------------------

/// Return codes. Functions return `DPUIO_OK`, a non-negative count where documented,
/// or one of the negative codes below.
#[allow(non_camel_case_types)]
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum dpuio_code {
    DPUIO_OK = 0,
    /// A caller mistake: NULL or dead handle, bad UTF-8, unknown flag, a range outside
    /// a region, a request longer than the agent's `max_io_bytes`.
    DPUIO_E_INVALID_ARGUMENT = -1,
    DPUIO_E_NOT_FOUND = -2,
    DPUIO_E_ALREADY_EXISTS = -3,
    DPUIO_E_PERMISSION_DENIED = -4,
    /// Wrong state of an entry: directory not empty, not a directory, ...
    DPUIO_E_FAILED_PRECONDITION = -5,
    /// An agent limit (sessions, handles, regions), or every ring of the client is
    /// held by a batch.
    DPUIO_E_RESOURCE_EXHAUSTED = -6,
    DPUIO_E_OUT_OF_RANGE = -7,
    /// The agent cannot be reached, or it ended the session.
    DPUIO_E_UNAVAILABLE = -8,
    DPUIO_E_TIMED_OUT = -9,
    /// The agent refused a data-plane request for now (a session or tenant limit);
    /// submit it again later.
    DPUIO_E_BUSY = -10,
    /// The storage backend failed.
    DPUIO_E_IO = -11,
    /// Data failed an integrity check; none was released.
    DPUIO_E_INTEGRITY = -12,
    /// The object was closed or detached, or was made by another process (after fork).
    DPUIO_E_CLOSED = -13,
    /// The agent does not implement this call.
    DPUIO_E_UNSUPPORTED = -14,
    /// The agent answered something this library cannot use.
    DPUIO_E_PROTOCOL = -15,
    /// A bug in libdpuio (including a caught panic): please report it.
    DPUIO_E_INTERNAL = -16,
}

/// `dpuio_attr.kind` of a file.
pub const DPUIO_KIND_FILE: u32 = 1;
/// `dpuio_attr.kind` of a directory.
pub const DPUIO_KIND_DIRECTORY: u32 = 2;

/// `dpuio_mkdir` flag: create missing parents; no error if the directory exists.
pub const DPUIO_MKDIR_PARENTS: u32 = 1;
/// `dpuio_remove` flag: remove a directory and everything under it.
pub const DPUIO_REMOVE_RECURSIVE: u32 = 1;

/// `dpuio_open` flags (combine with `|`). Exactly one of RDONLY / RDWR.
pub const DPUIO_O_RDONLY: u32 = 0;
pub const DPUIO_O_RDWR: u32 = 1;
/// Create the file if it does not exist (implies RDWR).
pub const DPUIO_O_CREAT: u32 = 0x100;
/// With CREAT: fail with DPUIO_E_ALREADY_EXISTS if the file exists.
pub const DPUIO_O_EXCL: u32 = 0x200;
/// Truncate to zero length (implies RDWR).
pub const DPUIO_O_TRUNC: u32 = 0x400;

/// Region access, as the agent checks it: reads land in regions the agent may write,
/// writes come from regions the agent may read.
pub const DPUIO_REGION_WRITE_BY_AGENT: u32 = 1;
pub const DPUIO_REGION_READ_BY_AGENT: u32 = 2;
pub const DPUIO_REGION_READ_WRITE: u32 = 3;

/// `dpuio_io.opcode`: read from the file into the region.
pub const DPUIO_OP_READ: u32 = 1;
/// `dpuio_io.opcode`: write from the region to the file.
pub const DPUIO_OP_WRITE: u32 = 2;
/// I/O flag: make a write durable before it completes.
pub const DPUIO_IO_SYNC: u32 = 1;

/// Attributes of a file or directory.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct dpuio_attr {
    /// `DPUIO_KIND_FILE` or `DPUIO_KIND_DIRECTORY`.
    pub kind: u32,
    /// Permission bits.
    pub mode: u32,
    /// Size in bytes (files).
    pub size: u64,
    /// Last modification, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// The backend's object id.
    pub object_id: u64,
}

/// One directory entry. `name` stays valid until the next call on the same
/// `dpuio_dir` (or, in a readdir callback, until the callback returns).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dpuio_dirent {
    pub name: *const c_char,
    pub attr: dpuio_attr,
}

/// How to attach. Fill it with `dpuio_attach_options_init` first, then set fields;
/// NULL strings and zero numbers mean "the default".
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dpuio_attach_options {
    /// `host:port` or `http://host:port`. Default: `$DPUIO_AGENT`, else 127.0.0.1:7300.
    pub agent: *const c_char,
    /// Tenant to attach as (agents without client authentication). Default: the
    /// agent's default tenant.
    pub tenant: *const c_char,
    /// Shown in the agent's logs. Default: the program name and pid.
    pub client_name: *const c_char,
    /// Data plane: "ucx-shm", "ucx-tcp", "ofi-shm", "ofi-tcp" (libfabric), "auto" (the
    /// first of UCX, ofi-shm, ofi-tcp the agent offers), "shm"/"tcp" (UCX), a UCX_TLS
    /// list, or "none" for a control-only client (namespace calls only). Default:
    /// `$DPUIO_TRANSPORT`, else "auto".
    pub transports: *const c_char,
    /// Rings: how many threads can have requests in flight at once (each batch holds
    /// one ring while it lives). Default: the number of CPUs, 2..16.
    pub rings: u32,
    /// Entries per ring, a power of two: the queue depth of one batch. Default 128.
    pub ring_entries: u32,
    /// Longest wait for a completion in the blocking helpers. Default 60000.
    pub timeout_ms: u32,
    /// Longest wait to connect. Default 5000.
    pub connect_timeout_ms: u32,
    /// Client certificate, its key and the agent's CA (PEM files) for mutual TLS.
    /// Default: `$DPUIO_CERT`, `$DPUIO_KEY`, `$DPUIO_CA`, else `client.pem`,
    /// `client.key` and `ca.pem` in `$DPUIO_CONFIG_DIR` or `~/.config/dpuio` (where a
    /// local agent writes a development bundle). Unused with an `http://` agent.
    pub cert: *const c_char,
    pub key: *const c_char,
    pub ca: *const c_char,
    /// A capability token narrowing what this client may do. Default: `$DPUIO_TOKEN`.
    pub token: *const c_char,
    /// How long calls wait for a restarted agent while the client attaches again
    /// (regions, files and requests in flight are restored; calls see a stall, not an
    /// error). Negative: do not resume (a restart fails calls with DPUIO_E_UNAVAILABLE).
    /// Default (0): `$DPUIO_RESUME_S` seconds, else 60000.
    pub resume_wait_ms: i32,
}

/// What the agent allows this client (see `dpuio_client_limits`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct dpuio_limits {
    /// Longest single request; `dpuio_pread`/`dpuio_pwrite` split longer ones, batch
    /// entries must not exceed it.
    pub max_io_bytes: u64,
    /// The container's chunk size: a good request size.
    pub chunk_bytes: u64,
    pub max_handles: u32,
    pub max_regions: u32,
    /// Requests in flight per client at the agent; more complete with DPUIO_E_BUSY.
    pub max_inflight: u32,
    /// Rings of this client (how many batches can live at once).
    pub rings: u32,
}

/// One I/O request for `dpuio_batch_prep` (cuFile-style array form).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dpuio_io {
    /// `DPUIO_OP_READ` or `DPUIO_OP_WRITE`.
    pub opcode: u32,
    /// `DPUIO_IO_SYNC` or 0.
    pub flags: u32,
    pub file: *const dpuio_file,
    pub region: *const dpuio_region,
    pub region_offset: u64,
    pub length: u64,
    pub file_offset: u64,
    /// Returned in the completion.
    pub user_data: u64,
}

/// One completed request.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct dpuio_completion {
    /// As given when the request was prepared.
    pub user_data: u64,
    /// Bytes moved (>= 0; short only at end of file), or a negative `DPUIO_E_*` code.
    pub result: i64,
    /// The agent's completion status (0 = ok; see the agent's wire format).
    pub status: i32,
    pub reserved: u32,
}

/// Called for each directory entry by `dpuio_readdir`; return 0 to go on, anything
/// else to stop.
#[allow(non_camel_case_types)]
pub type dpuio_readdir_fn = Option<unsafe extern "C" fn(ctx: *mut c_void, entry: *const dpuio_dirent) -> c_int>;

// ---------------------------------------------------------------------------------
// Opaque objects
// ---------------------------------------------------------------------------------

/// An attached client (a session with the agent). Thread-safe.
#[allow(non_camel_case_types)]
pub struct dpuio_client {
    session: Arc<Session>,
    batches: Arc<AtomicUsize>,
}

/// Memory registered with the agent; the agent moves file data into and out of it.
#[allow(non_camel_case_types)]
pub struct dpuio_region {
    session: Arc<Session>,
    region: ProcessLocal<RegisteredRegion>,
}

/// An open file.
#[allow(non_camel_case_types)]
pub struct dpuio_file {
    session: Arc<Session>,
    file: ProcessLocal<File>,
}

/// A batch: one ring of the client, used by one thread at a time.
#[allow(non_camel_case_types)]
pub struct dpuio_batch {
    session: Arc<Session>,
    batch: ProcessLocal<Batch>,
    /// Completions taken from the ring but not yet returned to the caller.
    ready: VecDeque<Done>,
    /// Entries prepared since the last submit.
    staged: usize,
    batches: Arc<AtomicUsize>,
}

/// A directory being listed.
#[allow(non_camel_case_types)]
pub struct dpuio_dir {
    _session: Arc<Session>,
    stream: DirStream,
    name: CString,
}

impl Handle for dpuio_client {
    const KIND: Kind = Kind::Client;
}
impl Handle for dpuio_region {
    const KIND: Kind = Kind::Region;
}
impl Handle for dpuio_file {
    const KIND: Kind = Kind::File;
}
impl Handle for dpuio_batch {
    const KIND: Kind = Kind::Batch;
}
impl Handle for dpuio_dir {
    const KIND: Kind = Kind::Dir;
}

impl Drop for dpuio_batch {
    fn drop(&mut self) {
        self.batches.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for dpuio_region {
    fn drop(&mut self) {
        // Tell the agent to forget it, then unmap (only in the process that made it:
        // ProcessLocal leaks it in a forked child).
        if let Ok(region) = self.region.take() {
            match self.session.client() {
                Ok(client) if self.session.can_block() => {
                    let client = client.clone();
                    let _ = self.session.run(client.deregister_region(region));
                }
                _ => drop(region),
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Error plumbing
// ---------------------------------------------------------------------------------

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn code_of(code: Code) -> c_int {
    code as i32 as c_int
}

/// Run an entry point: its result as an int, failures recorded for
/// `dpuio_last_error_message`, panics caught (never unwound into C).
fn ffi(name: &str, f: impl FnOnce() -> Result<c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(failure)) => {
            set_last_error(&format!("{name}: {}", failure.message));
            code_of(failure.code)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("{name}: internal error in libdpuio: {what}"));
            code_of(Code::Internal)
        }
    }
}

/// [`ffi`] for a call that returns a value rather than a status: `fallback` when it
/// fails (the error is recorded for `dpuio_last_error` as usual).
fn ffi_value<T>(name: &str, fallback: T, f: impl FnOnce() -> Result<T>) -> T {
    let mut out = None;
    ffi(name, || {
        out = Some(f()?);
        Ok(0)
    });
    out.unwrap_or(fallback)
}

/// A string argument.
///
/// # Safety
/// `p` must be NULL or point at a NUL-terminated string that stays valid during the call.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-null, and the caller guarantees a live NUL-terminated string.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|_| Failure::invalid(format!("{what} is not valid UTF-8")))
}

/// An optional string argument (NULL or "" means "not given").
///
/// # Safety
/// As [`text`].
unsafe fn optional_text<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: forwarded contract.
    let s = unsafe { text(p, what) }?;
    Ok(if s.is_empty() { None } else { Some(s) })
}

/// Store `value` through an out-pointer.
///
/// # Safety
/// `out` must be NULL or valid for writing a `T`.
unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Result<()> {
    if out.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    if !out.is_aligned() {
        return Err(Failure::invalid(format!("{what} is misaligned")));
    }
    // SAFETY: non-null and aligned, and the caller guarantees it is writable; write()
    // does not drop whatever (possibly uninitialised) bytes were there.
    unsafe { out.write(value) };
    Ok(())
}

fn stat_of(a: &Attr) -> dpuio_attr {
    dpuio_attr {
        kind: match a.kind {
            EntryKind::File => DPUIO_KIND_FILE,
            EntryKind::Directory => DPUIO_KIND_DIRECTORY,
        },
        mode: a.mode,
        size: a.size,
        mtime_ns: a.mtime_ns,
        object_id: a.object_id,
    }
}

fn completion_of(d: &Done) -> dpuio_completion {
    match d.result {
        Ok(n) => dpuio_completion { user_data: d.user_data, result: n as i64, status: 0, reserved: 0 },
        Err(status) => dpuio_completion {
            user_data: d.user_data,
            result: i64::from(Code::from_io_status(status).map_or(code_of(Code::Internal), code_of)),
            status: status as i32,
            reserved: 0,
        },
    }
}

// ---------------------------------------------------------------------------------
// Library
// ---------------------------------------------------------------------------------

/// The library version, e.g. "0.1.0". Static storage.
#[unsafe(no_mangle)]
pub extern "C" fn dpuio_version() -> *const c_char {
    static VERSION: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => c"unknown",
    };
    VERSION.as_ptr()
}

/// What the most recent failed call on this thread went wrong with ("" if none).
/// Valid until the next failing dpuio call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn dpuio_last_error_message() -> *const c_char {
    catch_unwind(|| LAST_ERROR.with(|e| e.borrow().as_ptr())).unwrap_or(c"".as_ptr())
}

/// The name of a return code ("OK", "NOT_FOUND", ...; "UNKNOWN" for other values).
/// Static storage.
#[unsafe(no_mangle)]
pub extern "C" fn dpuio_code_name(code: c_int) -> *const c_char {
    const NAMES: [&CStr; 17] = [
        c"OK",
        c"INVALID_ARGUMENT",
        c"NOT_FOUND",
        c"ALREADY_EXISTS",
        c"PERMISSION_DENIED",
        c"FAILED_PRECONDITION",
        c"RESOURCE_EXHAUSTED",
        c"OUT_OF_RANGE",
        c"UNAVAILABLE",
        c"TIMED_OUT",
        c"BUSY",
        c"IO",
        c"INTEGRITY",
        c"CLOSED",
        c"UNSUPPORTED",
        c"PROTOCOL",
        c"INTERNAL",
    ];
    match usize::try_from(-(code as i64)) {
        Ok(i) if i < NAMES.len() => NAMES[i].as_ptr(),
        _ => c"UNKNOWN".as_ptr(),
    }
}

// The C functions by family, in the order the header lists them (cbindgen follows
// these declarations, so they are kept apart to keep rustfmt from sorting them).
mod client;

mod namespace;

mod region;

mod file;

mod batch;

pub use batch::*;
pub use client::*;
pub use file::*;
pub use namespace::*;
pub use region::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_match_the_enum() {
        for code in Code::ALL {
            // SAFETY: dpuio_code_name returns static NUL-terminated strings.
            let name = unsafe { CStr::from_ptr(dpuio_code_name(code as i32)) };
            assert_eq!(name.to_str().unwrap(), code.name());
        }
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(dpuio_code_name(0)) }, c"OK");
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(dpuio_code_name(-99)) }, c"UNKNOWN");
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(dpuio_code_name(i32::MIN)) }, c"UNKNOWN");
    }

    #[test]
    fn c_codes_match_session_codes() {
        assert_eq!(dpuio_code::DPUIO_E_INVALID_ARGUMENT as i32, Code::InvalidArgument as i32);
        assert_eq!(dpuio_code::DPUIO_E_INTERNAL as i32, Code::Internal as i32);
        assert_eq!(dpuio_code::DPUIO_E_CLOSED as i32, Code::Closed as i32);
        assert_eq!(dpuio_code::DPUIO_E_BUSY as i32, Code::Busy as i32);
    }

    #[test]
    fn bad_handles_and_pointers_are_refused() {
        let mut st = dpuio_attr::default();
        // SAFETY: exercising the checks with NULL and a dangling pointer is the point:
        // the functions must refuse both without dereferencing.
        unsafe {
            assert_eq!(dpuio_stat(std::ptr::null(), c"/".as_ptr(), &mut st), code_of(Code::InvalidArgument));
            let bogus = 0x1000 as *const dpuio_client;
            assert_eq!(dpuio_stat(bogus, c"/".as_ptr(), &mut st), code_of(Code::InvalidArgument));
            let msg = CStr::from_ptr(dpuio_last_error_message()).to_str().unwrap().to_owned();
            assert!(msg.contains("not a live client handle"), "{msg}");
            assert_eq!(dpuio_detach(std::ptr::null_mut()), code_of(Code::InvalidArgument));
            assert!(dpuio_region_ptr(std::ptr::null()).is_null());
            assert_eq!(dpuio_region_len(0x2000 as *const dpuio_region), 0);
            assert_eq!(dpuio_attach(std::ptr::null(), std::ptr::null_mut()), code_of(Code::InvalidArgument));
        }
    }

    /// Attach to `agent` with client bundle files that do not exist, whatever is in the
    /// home directory or the environment; returns the code and the last error message.
    fn attach_without_bundle(agent: &str) -> (i32, String) {
        let missing = std::env::temp_dir().join(format!("dpuio-capi-no-bundle-{}", std::process::id()));
        let file = |name: &str| CString::new(missing.join(name).to_str().unwrap()).unwrap();
        let (cert, key, ca) = (file("client.pem"), file("client.key"), file("ca.pem"));
        let agent = CString::new(agent).unwrap();
        let mut o = std::mem::MaybeUninit::uninit();
        // SAFETY: o is writable; init fills it; every string outlives the call.
        let code = unsafe {
            dpuio_attach_options_init(o.as_mut_ptr());
            let mut o = o.assume_init();
            o.agent = agent.as_ptr();
            o.transports = c"none".as_ptr();
            o.connect_timeout_ms = 2000;
            (o.cert, o.key, o.ca) = (cert.as_ptr(), key.as_ptr(), ca.as_ptr());
            let mut client = std::ptr::null_mut();
            dpuio_attach(&o, &mut client)
        };
        // SAFETY: static/thread-local NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(dpuio_last_error_message()) }.to_str().unwrap().to_owned();
        (code, msg)
    }

    #[test]
    fn unreachable_agent_is_unavailable_with_a_message() {
        // No agent and no client bundle: reachability comes first (UNAVAILABLE, worth a
        // retry), and the message names the bundle problem too.
        let (code, msg) = attach_without_bundle("127.0.0.1:1");
        assert_eq!(code, code_of(Code::Unavailable), "{msg}");
        assert!(msg.starts_with("dpuio_attach: cannot reach the agent at 127.0.0.1:1"), "{msg}");
        assert!(msg.contains("the client bundle is not usable: cannot read the client certificate"), "{msg}");
    }

    #[test]
    fn missing_bundle_with_a_listener_is_an_invalid_argument() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (code, msg) = attach_without_bundle(&listener.local_addr().unwrap().to_string());
        assert_eq!(code, code_of(Code::InvalidArgument), "{msg}");
        assert!(msg.contains("cannot read the client certificate"), "{msg}");
    }
}
