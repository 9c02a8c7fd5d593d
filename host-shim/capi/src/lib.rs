//! `libdpuio`: the dpuio host shim for C (and anything that calls C).
//!
//! A C program attaches to the agent, registers regions, opens files, and moves data
//! with batches of requests in the shape of 3FS USRBIO and cuFile's batch API: prepare
//! entries, submit them with one doorbell, wait for at least N completions with a
//! timeout. The header `include/dpuio.h` is generated from this file by cbindgen (the
//! test `tests/header.rs` fails when it is stale; `DPUIO_BLESS=1` rewrites it), so the
//! doc comments here are the C documentation.
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
//! The blocking session layer ([`session`]) is shared with the Python extension, which
//! links this crate as an rlib.

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
/// cbindgen:ignore
pub mod session;

use handles::{Handle, Kind};
use session::{Code, DirStream, Failure, ProcessLocal, Result, Session};

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

// ---------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------

/// Fill `options` with the defaults (all NULL / 0).
///
/// # Safety
/// `options` must be NULL (ignored) or point at writable memory for one struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_attach_options_init(options: *mut dpuio_attach_options) {
    let defaults = dpuio_attach_options {
        agent: std::ptr::null(),
        tenant: std::ptr::null(),
        client_name: std::ptr::null(),
        transports: std::ptr::null(),
        rings: 0,
        ring_entries: 0,
        timeout_ms: 0,
        connect_timeout_ms: 0,
        cert: std::ptr::null(),
        key: std::ptr::null(),
        ca: std::ptr::null(),
        token: std::ptr::null(),
        resume_wait_ms: 0,
    };
    // SAFETY: forwarded contract; put() checks NULL and alignment.
    let _ = unsafe { put(options, defaults, "options") };
}

fn connect_options(o: &dpuio_attach_options) -> Result<ConnectOptions> {
    let mut c = ConnectOptions::default();
    // SAFETY: the header requires the strings in options to be NULL or NUL-terminated
    // and valid during the call (also for the three calls below).
    if let Some(agent) = unsafe { optional_text(o.agent, "options.agent") }? {
        c.agent = agent.to_owned();
    }
    // SAFETY: as above.
    if let Some(tenant) = unsafe { optional_text(o.tenant, "options.tenant") }? {
        c.tenant = tenant.to_owned();
    }
    // SAFETY: as above.
    if let Some(name) = unsafe { optional_text(o.client_name, "options.client_name") }? {
        c.client_name = name.to_owned();
    }
    if o.connect_timeout_ms > 0 {
        c.connect_timeout = Duration::from_millis(u64::from(o.connect_timeout_ms));
    }
    match o.resume_wait_ms {
        0 => {}
        ms if ms < 0 => c.resume.max_wait = Duration::ZERO,
        ms => c.resume.max_wait = Duration::from_millis(ms as u64),
    }
    // SAFETY: as above.
    if let Some(cert) = unsafe { optional_text(o.cert, "options.cert") }? {
        c.tls.cert = Some(cert.into());
    }
    // SAFETY: as above.
    if let Some(key) = unsafe { optional_text(o.key, "options.key") }? {
        c.tls.key = Some(key.into());
    }
    // SAFETY: as above.
    if let Some(ca) = unsafe { optional_text(o.ca, "options.ca") }? {
        c.tls.ca = Some(ca.into());
    }
    // SAFETY: as above.
    if let Some(token) = unsafe { optional_text(o.token, "options.token") }? {
        c.capability_token = token.to_owned();
    }
    // SAFETY: as above.
    let transports = unsafe { optional_text(o.transports, "options.transports") }?;
    if transports != Some("none") {
        let mut d = DataPlaneOptions::default();
        if let Some(t) = transports {
            d.transports = t.to_owned();
        }
        if o.rings > 0 {
            d.rings = o.rings as usize;
        }
        if o.ring_entries > 0 {
            if !o.ring_entries.is_power_of_two() {
                return Err(Failure::invalid(format!("options.ring_entries {} is not a power of two", o.ring_entries)));
            }
            d.ring_entries = o.ring_entries;
        }
        if o.timeout_ms > 0 {
            d.timeout = Duration::from_millis(u64::from(o.timeout_ms));
        }
        c.data_plane = Some(d);
    }
    Ok(c)
}

/// Connect to the agent, attach and mount the tenant's container. `options` may be
/// NULL for the defaults. On success `*out` is the client; free it with
/// `dpuio_detach`.
///
/// Nothing answering at the address is `DPUIO_E_UNAVAILABLE` (worth a retry), even when
/// the client bundle is missing too: the message then names both problems, since a local
/// agent writes the development bundle when it starts. A bundle that cannot be used while
/// the agent does answer is `DPUIO_E_INVALID_ARGUMENT`.
///
/// # Safety
/// `options` must be NULL or a valid struct (see `dpuio_attach_options`); `out` must
/// be valid for writing a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_attach(options: *const dpuio_attach_options, out: *mut *mut dpuio_client) -> c_int {
    ffi("dpuio_attach", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let options = if options.is_null() {
            let mut o = std::mem::MaybeUninit::uninit();
            // SAFETY: o is writable memory for one struct.
            unsafe { dpuio_attach_options_init(o.as_mut_ptr()) };
            // SAFETY: dpuio_attach_options_init wrote every field.
            unsafe { o.assume_init() }
        } else {
            // SAFETY: non-null; the caller guarantees a valid struct.
            unsafe { *options }
        };
        let session = Arc::new(Session::attach(connect_options(&options)?)?);
        let client = handles::into_raw(dpuio_client { session, batches: Arc::new(AtomicUsize::new(0)) });
        // SAFETY: checked non-null above; the caller guarantees it is writable.
        unsafe { put(out, client, "out") }?;
        Ok(0)
    })
}

/// End the session (the agent syncs files written through it) and free the client.
/// The handle is freed even if the agent cannot be told. Regions, files, batches and
/// directory listings of the client stay valid handles that must still be destroyed;
/// their calls fail with DPUIO_E_CLOSED.
///
/// # Safety
/// No other thread may use `client` during or after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_detach(client: *mut dpuio_client) -> c_int {
    ffi("dpuio_detach", || {
        // SAFETY: the caller guarantees no concurrent use.
        let client = unsafe { handles::take(client) }?;
        client.session.detach()?;
        Ok(0)
    })
}

/// The limits the agent applies to this client.
///
/// # Safety
/// `client` must be a live client handle; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_client_limits(client: *const dpuio_client, out: *mut dpuio_limits) -> c_int {
    ffi("dpuio_client_limits", || {
        // SAFETY: see the header's thread-safety rules.
        let c = unsafe { handles::get(client) }?;
        let inner = c.session.client()?;
        let l = inner.limits();
        let limits = dpuio_limits {
            max_io_bytes: c.session.max_io_bytes(),
            chunk_bytes: inner.chunk_bytes(),
            max_handles: l.max_handles,
            max_regions: l.max_regions,
            max_inflight: l.max_inflight,
            rings: c.session.rings() as u32,
        };
        // SAFETY: forwarded contract.
        unsafe { put(out, limits, "out") }?;
        Ok(0)
    })
}

/// The data plane's transport this client uses (what `transports = "auto"` chose), as
/// `transports` names them: `"ucx"`, `"ofi-shm"` or `"ofi-tcp"`. Writes it with its NUL
/// into `buf` of `len` bytes and returns its length without the NUL; `DPUIO_E_OUT_OF_RANGE`
/// when `len` is too small (the message says how many bytes it needs).
///
/// # Safety
/// `client` must be a live client handle; `buf` writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_client_transport(client: *const dpuio_client, buf: *mut c_char, len: usize) -> c_int {
    ffi("dpuio_client_transport", || {
        // SAFETY: see the header's thread-safety rules.
        let c = unsafe { handles::get(client) }?;
        let Some(transport) = c.session.client()?.transport() else {
            return Err(Failure::new(Code::Unsupported, "this client has no data plane"));
        };
        let name = transport.name.as_bytes();
        if buf.is_null() {
            return Err(Failure::invalid("buf is NULL"));
        }
        if len <= name.len() {
            return Err(Failure::new(
                Code::OutOfRange,
                format!("the transport's name {:?} needs {} bytes, buf has {len}", transport.name, name.len() + 1),
            ));
        }
        // SAFETY: buf is non-null and writable for len > name.len() bytes (the caller's
        // contract); the name is copied and NUL-terminated within them.
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr().cast::<c_char>(), buf, name.len());
            buf.add(name.len()).write(0);
        }
        Ok(name.len() as c_int)
    })
}

// ---------------------------------------------------------------------------------
// Namespace
// ---------------------------------------------------------------------------------

/// Attributes of `path`.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_stat(client: *const dpuio_client, path: *const c_char, out: *mut dpuio_attr) -> c_int {
    ffi("dpuio_stat", || {
        // SAFETY: see the header's rules (for both calls).
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        let inner = c.session.client()?;
        let attr = c.session.run(inner.stat(path))??;
        // SAFETY: forwarded contract.
        unsafe { put(out, stat_of(&attr), "out") }?;
        Ok(0)
    })
}

/// Create a directory; with `DPUIO_MKDIR_PARENTS` also its missing parents, and no
/// error if it exists.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_mkdir(client: *const dpuio_client, path: *const c_char, flags: u32) -> c_int {
    ffi("dpuio_mkdir", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        check_flags(flags, DPUIO_MKDIR_PARENTS)?;
        let inner = c.session.client()?;
        c.session.run(inner.mkdir(path, flags & DPUIO_MKDIR_PARENTS != 0))??;
        Ok(0)
    })
}

/// Remove a file or an empty directory; with `DPUIO_REMOVE_RECURSIVE` a whole tree.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_remove(client: *const dpuio_client, path: *const c_char, flags: u32) -> c_int {
    ffi("dpuio_remove", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        check_flags(flags, DPUIO_REMOVE_RECURSIVE)?;
        let inner = c.session.client()?;
        c.session.run(inner.remove(path, flags & DPUIO_REMOVE_RECURSIVE != 0))??;
        Ok(0)
    })
}

/// Rename `from` to `to`; fails with DPUIO_E_ALREADY_EXISTS if `to` exists (so a
/// write-then-rename publish never replaces anything by accident).
///
/// # Safety
/// `client` a live client; `from`, `to` NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_rename(client: *const dpuio_client, from: *const c_char, to: *const c_char) -> c_int {
    ffi("dpuio_rename", || {
        // SAFETY: see the header's rules.
        let (c, from, to) = unsafe { (handles::get(client)?, text(from, "from")?, text(to, "to")?) };
        let inner = c.session.client()?;
        c.session.run(inner.rename(from, to))??;
        Ok(0)
    })
}

/// Replace the file at `path` with the `len` bytes at `data` in one step, as an object
/// store's put does: the bytes go to a temporary file beside it
/// (`.NAME.dpuio-put.SUFFIX`), made durable, then renamed over `path`, and the container
/// is synced. Once this returns 0 the new file is durable; if it fails or the process
/// or agent dies first, `path` is still the old file (a temporary file may be left,
/// which nothing reads). Needs create and write on `path`'s directory.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string; `data` `len` readable bytes
/// (or NULL when `len` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_put(
    client: *const dpuio_client,
    path: *const c_char,
    data: *const c_void,
    len: usize,
) -> c_int {
    ffi("dpuio_put", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        let bytes: &[u8] = match (data.is_null(), len) {
            (_, 0) => &[],
            (true, _) => return Err(Failure::invalid(format!("data is NULL but len is {len}"))),
            // SAFETY: the caller promises `len` readable bytes at `data` for this call;
            // nothing else holds them mutably while it runs.
            (false, _) => unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) },
        };
        let inner = c.session.client()?;
        c.session.run(inner.put_bytes(path, bytes))??;
        Ok(0)
    })
}

/// Set the size of the file at `path`.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_truncate(client: *const dpuio_client, path: *const c_char, size: u64) -> c_int {
    ffi("dpuio_truncate", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        let inner = c.session.client()?;
        c.session.run(inner.truncate(path, size))??;
        Ok(0)
    })
}

/// Make every acknowledged change in the container durable.
///
/// # Safety
/// `client` a live client.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_sync(client: *const dpuio_client) -> c_int {
    ffi("dpuio_sync", || {
        // SAFETY: see the header's rules.
        let c = unsafe { handles::get(client) }?;
        let inner = c.session.client()?;
        c.session.run(inner.sync())??;
        Ok(0)
    })
}

fn check_flags(flags: u32, known: u32) -> Result<()> {
    if flags & !known != 0 {
        return Err(Failure::invalid(format!("unknown flags {:#x}", flags & !known)));
    }
    Ok(())
}

/// Start listing a directory (in name order, fetched in batches of `batch_size`
/// entries, 0 for the agent's choice). Read it with `dpuio_dir_next`, free it with
/// `dpuio_dir_close` (also to stop early).
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_dir_open(
    client: *const dpuio_client,
    path: *const c_char,
    batch_size: u32,
    out: *mut *mut dpuio_dir,
) -> c_int {
    ffi("dpuio_dir_open", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let stream = DirStream::open(&c.session, path, batch_size)?;
        let dir = handles::into_raw(dpuio_dir { _session: c.session.clone(), stream, name: CString::default() });
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, dir, "out") }?;
        Ok(0)
    })
}

/// The next entry: returns 1 and fills `*entry`, 0 at the end, or a negative code.
/// `entry->name` is valid until the next call on `dir`.
///
/// # Safety
/// `dir` a live listing used by one thread at a time; `entry` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_dir_next(dir: *mut dpuio_dir, entry: *mut dpuio_dirent) -> c_int {
    ffi("dpuio_dir_next", || {
        // SAFETY: see the header's rules (one thread at a time per dir).
        let d = unsafe { handles::get_mut(dir) }?;
        if entry.is_null() {
            return Err(Failure::invalid("entry is NULL"));
        }
        match d.stream.next_entry()? {
            None => Ok(0),
            Some(e) => {
                d.name = CString::new(e.name.clone())
                    .map_err(|_| Failure::new(Code::Protocol, format!("entry name {:?} contains NUL", e.name)))?;
                let out = dpuio_dirent { name: d.name.as_ptr(), attr: stat_of(&e.attr) };
                // SAFETY: checked non-null; the caller guarantees it is writable.
                unsafe { put(entry, out, "entry") }?;
                Ok(1)
            }
        }
    })
}

/// Free a listing (also stops fetching further batches).
///
/// # Safety
/// No other thread may use `dir` during or after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_dir_close(dir: *mut dpuio_dir) -> c_int {
    ffi("dpuio_dir_close", || {
        // SAFETY: the caller guarantees no concurrent use.
        drop(unsafe { handles::take(dir) }?);
        Ok(0)
    })
}

/// List a directory, calling `callback(ctx, entry)` for each entry on the calling
/// thread (the callback may call other dpuio functions). Returns 0 after the last
/// entry, 1 if the callback stopped early, or a negative code.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string; `callback` a valid
/// function that does not unwind (no C++ exceptions, no longjmp out of it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_readdir(
    client: *const dpuio_client,
    path: *const c_char,
    callback: dpuio_readdir_fn,
    ctx: *mut c_void,
) -> c_int {
    ffi("dpuio_readdir", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        let callback = callback.ok_or_else(|| Failure::invalid("callback is NULL"))?;
        let mut stream = DirStream::open(&c.session, path, 0)?;
        while let Some(e) = stream.next_entry()? {
            let name = CString::new(e.name.clone())
                .map_err(|_| Failure::new(Code::Protocol, format!("entry name {:?} contains NUL", e.name)))?;
            let entry = dpuio_dirent { name: name.as_ptr(), attr: stat_of(&e.attr) };
            // SAFETY: the caller guarantees a valid, non-unwinding callback; entry and
            // the name it points at live until the call returns.
            if unsafe { callback(ctx, &entry) } != 0 {
                return Ok(1);
            }
        }
        Ok(0)
    })
}

// ---------------------------------------------------------------------------------
// Regions
// ---------------------------------------------------------------------------------

/// Allocate `length` bytes through the transport and register them with the agent.
/// `access` is one of `DPUIO_REGION_*`. The memory is zero-filled, page-aligned and
/// stays at the same address until `dpuio_region_destroy`.
///
/// # Safety
/// `client` a live client; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_region_create(
    client: *const dpuio_client,
    length: usize,
    access: u32,
    out: *mut *mut dpuio_region,
) -> c_int {
    ffi("dpuio_region_create", || {
        // SAFETY: see the header's rules.
        let c = unsafe { handles::get(client) }?;
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        if length == 0 {
            return Err(Failure::invalid("length is 0"));
        }
        let access = match access {
            DPUIO_REGION_WRITE_BY_AGENT => RegionAccess::WriteByAgent,
            DPUIO_REGION_READ_BY_AGENT => RegionAccess::ReadByAgent,
            DPUIO_REGION_READ_WRITE => RegionAccess::ReadWrite,
            other => return Err(Failure::invalid(format!("unknown region access {other}"))),
        };
        let inner = c.session.data_client()?;
        let region = c.session.run(inner.register_region(length, access))??;
        let r = handles::into_raw(dpuio_region { session: c.session.clone(), region: ProcessLocal::new(region) });
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, r, "out") }?;
        Ok(0)
    })
}

/// The region's first byte (NULL, with the error recorded, for a bad handle). Read a
/// range only after the completion of the read that fills it.
///
/// # Safety
/// `region` a live region handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_region_ptr(region: *const dpuio_region) -> *mut c_void {
    ffi_value("dpuio_region_ptr", std::ptr::null_mut(), || {
        // SAFETY: see the header's rules.
        let r = unsafe { handles::get(region) }?;
        Ok(r.region.get()?.as_ptr().cast())
    })
}

/// The region's length in bytes (0, with the error recorded, for a bad handle).
///
/// # Safety
/// `region` a live region handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_region_len(region: *const dpuio_region) -> usize {
    ffi_value("dpuio_region_len", 0, || {
        // SAFETY: see the header's rules.
        let r = unsafe { handles::get(region) }?;
        Ok(r.region.get()?.len())
    })
}

/// Deregister the region and free its memory. No request may be in flight on it.
///
/// # Safety
/// No other thread may use `region` during or after this call, and no pointer into
/// its memory may be used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_region_destroy(region: *mut dpuio_region) -> c_int {
    ffi("dpuio_region_destroy", || {
        // SAFETY: the caller guarantees no concurrent use.
        let mut r = unsafe { handles::take(region) }?;
        let Ok(registered) = r.region.take() else { return Ok(0) }; // forked child: leaked
        match r.session.client() {
            Ok(client) => {
                let client = client.clone();
                r.session.run(client.deregister_region(registered))??;
            }
            Err(_) => drop(registered), // detached: the agent forgot it already
        }
        Ok(0)
    })
}

// ---------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------

/// Open (or create) a file. `flags`: `DPUIO_O_RDONLY` or `DPUIO_O_RDWR`, plus
/// `DPUIO_O_CREAT`, `DPUIO_O_EXCL`, `DPUIO_O_TRUNC`.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_open(
    client: *const dpuio_client,
    path: *const c_char,
    flags: u32,
    out: *mut *mut dpuio_file,
) -> c_int {
    ffi("dpuio_open", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        check_flags(flags, DPUIO_O_RDWR | DPUIO_O_CREAT | DPUIO_O_EXCL | DPUIO_O_TRUNC)?;
        if flags & DPUIO_O_EXCL != 0 && flags & DPUIO_O_CREAT == 0 {
            return Err(Failure::invalid("DPUIO_O_EXCL without DPUIO_O_CREAT"));
        }
        let inner = c.session.data_client()?.clone();
        let create = flags & DPUIO_O_CREAT != 0;
        let exclusive = flags & DPUIO_O_EXCL != 0;
        let truncate = flags & DPUIO_O_TRUNC != 0;
        let write = flags & (DPUIO_O_RDWR | DPUIO_O_CREAT | DPUIO_O_TRUNC) != 0;
        let file = c.session.run(async move {
            if create && (exclusive || truncate) {
                // create() truncates an existing file unless exclusive.
                return inner.create(path, exclusive).await;
            }
            let access = if write { Access::ReadWrite } else { Access::ReadOnly };
            match inner.open(path, access).await {
                Err(e) if create && e.code() == Some(tonic::Code::NotFound) => {
                    match inner.create(path, true).await {
                        // Someone else created it meanwhile: open theirs.
                        Err(e) if e.code() == Some(tonic::Code::AlreadyExists) => inner.open(path, access).await,
                        other => other,
                    }
                }
                Ok(f) if truncate => {
                    f.truncate(0).await?;
                    Ok(f)
                }
                other => other,
            }
        })??;
        let f = handles::into_raw(dpuio_file { session: c.session.clone(), file: ProcessLocal::new(file) });
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, f, "out") }?;
        Ok(0)
    })
}

/// The file's size when it was opened.
///
/// # Safety
/// `file` a live file; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_file_size(file: *const dpuio_file, out: *mut u64) -> c_int {
    ffi("dpuio_file_size", || {
        // SAFETY: see the header's rules.
        let f = unsafe { handles::get(file) }?;
        let size = f.file.get()?.attr().size;
        // SAFETY: forwarded contract.
        unsafe { put(out, size, "out") }?;
        Ok(0)
    })
}

/// Current attributes of an open file.
///
/// # Safety
/// `file` a live file; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_fstat(file: *const dpuio_file, out: *mut dpuio_attr) -> c_int {
    ffi("dpuio_fstat", || {
        // SAFETY: see the header's rules.
        let f = unsafe { handles::get(file) }?;
        f.session.client()?;
        let attr = f.session.run(f.file.get()?.stat())??;
        // SAFETY: forwarded contract.
        unsafe { put(out, stat_of(&attr), "out") }?;
        Ok(0)
    })
}

/// Set the size of an open file (needs write access).
///
/// # Safety
/// `file` a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_ftruncate(file: *const dpuio_file, size: u64) -> c_int {
    ffi("dpuio_ftruncate", || {
        // SAFETY: see the header's rules.
        let f = unsafe { handles::get(file) }?;
        f.session.client()?;
        f.session.run(f.file.get()?.truncate(size))??;
        Ok(0)
    })
}

/// Make an open file durable.
///
/// # Safety
/// `file` a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_fsync(file: *const dpuio_file) -> c_int {
    ffi("dpuio_fsync", || {
        // SAFETY: see the header's rules.
        let f = unsafe { handles::get(file) }?;
        f.session.client()?;
        f.session.run(f.file.get()?.sync())??;
        Ok(0)
    })
}

/// Close a file (a written file is durable once this returns) and free the handle.
/// No request may be in flight on it.
///
/// # Safety
/// No other thread may use `file` during or after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_close(file: *mut dpuio_file) -> c_int {
    ffi("dpuio_close", || {
        // SAFETY: the caller guarantees no concurrent use.
        let mut f = unsafe { handles::take(file) }?;
        let Ok(inner) = f.file.take() else { return Ok(0) }; // forked child: leaked
        if f.session.client().is_ok() {
            f.session.run(inner.close())??;
        }
        Ok(0)
    })
}

/// Build a request after checking what the agent will check anyway, so mistakes get
/// a precise message at once instead of a completion status later.
#[allow(clippy::too_many_arguments)] // the fields of one request, as C passes them
fn request(
    opcode: u32,
    flags: u32,
    file: &dpuio_file,
    region: &dpuio_region,
    region_offset: u64,
    length: u64,
    file_offset: u64,
    user_data: u64,
) -> Result<Request> {
    let opcode = match opcode {
        DPUIO_OP_READ => Opcode::Read,
        DPUIO_OP_WRITE => Opcode::Write,
        other => return Err(Failure::invalid(format!("unknown opcode {other}"))),
    };
    check_flags(flags, DPUIO_IO_SYNC)?;
    if !Arc::ptr_eq(&file.session, &region.session) {
        return Err(Failure::invalid("the file and the region belong to different clients"));
    }
    let r = region.region.get()?;
    let end = region_offset.checked_add(length);
    if end.is_none_or(|end| end > r.len() as u64) {
        return Err(Failure::new(
            Code::OutOfRange,
            format!("range {region_offset}+{length} lies outside the {}-byte region", r.len()),
        ));
    }
    let f = file.file.get()?;
    Ok(Request {
        opcode,
        handle: f.handle(),
        region_id: r.id(),
        region_offset,
        file_offset,
        length,
        sync: flags & DPUIO_IO_SYNC != 0,
        user_data,
    })
}

fn blocking_io(request: Request, session: &Session, path: &str) -> Result<u64> {
    let done = session.submit(&[request])?;
    let op = if request.opcode == Opcode::Read { "read" } else { "write" };
    match done.first() {
        Some(Ok(n)) => Ok(*n),
        Some(Err(status)) => Err(Failure::io(&format!("{op} {path}"), *status)),
        None => Err(Failure::new(Code::Protocol, "no completion")),
    }
}

/// Read `length` bytes at `file_offset` into the region at `region_offset` and wait
/// (requests longer than the agent's `max_io_bytes` are split). `*bytes` gets the
/// bytes read (short only at end of file). Takes one ring for the call.
///
/// # Safety
/// `file`, `region` live handles of one client; `bytes` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_pread(
    file: *const dpuio_file,
    region: *const dpuio_region,
    region_offset: u64,
    length: u64,
    file_offset: u64,
    bytes: *mut u64,
) -> c_int {
    ffi("dpuio_pread", || {
        // SAFETY: see the header's rules.
        let (f, r) = unsafe { (handles::get(file)?, handles::get(region)?) };
        let req = request(DPUIO_OP_READ, 0, f, r, region_offset, length, file_offset, 0)?;
        let n = blocking_io(req, &f.session, f.file.get()?.path())?;
        if !bytes.is_null() {
            // SAFETY: non-null; the caller guarantees it is writable.
            unsafe { put(bytes, n, "bytes") }?;
        }
        Ok(0)
    })
}

/// Write `length` bytes from the region at `region_offset` to `file_offset` and wait.
/// `flags`: `DPUIO_IO_SYNC` or 0. `*bytes` gets the bytes written.
///
/// # Safety
/// `file`, `region` live handles of one client; `bytes` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_pwrite(
    file: *const dpuio_file,
    region: *const dpuio_region,
    region_offset: u64,
    length: u64,
    file_offset: u64,
    flags: u32,
    bytes: *mut u64,
) -> c_int {
    ffi("dpuio_pwrite", || {
        // SAFETY: see the header's rules.
        let (f, r) = unsafe { (handles::get(file)?, handles::get(region)?) };
        let req = request(DPUIO_OP_WRITE, flags, f, r, region_offset, length, file_offset, 0)?;
        let n = blocking_io(req, &f.session, f.file.get()?.path())?;
        if !bytes.is_null() {
            // SAFETY: non-null; the caller guarantees it is writable.
            unsafe { put(bytes, n, "bytes") }?;
        }
        Ok(0)
    })
}

// ---------------------------------------------------------------------------------
// Batches
// ---------------------------------------------------------------------------------

/// Take one of the client's rings for a batch. Fails with DPUIO_E_RESOURCE_EXHAUSTED
/// when every ring is held by a batch (see `dpuio_limits.rings`).
///
/// # Safety
/// `client` a live client; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_create(client: *const dpuio_client, out: *mut *mut dpuio_batch) -> c_int {
    ffi("dpuio_batch_create", || {
        // SAFETY: see the header's rules.
        let c = unsafe { handles::get(client) }?;
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let inner = c.session.data_client()?;
        let rings = c.session.rings();
        // Client::batch() waits for a free ring; refuse instead of blocking forever
        // when batches hold them all (pread/pwrite only hold one for a call).
        if c.batches.fetch_add(1, Ordering::AcqRel) >= rings {
            c.batches.fetch_sub(1, Ordering::AcqRel);
            return Err(Failure::new(
                Code::ResourceExhausted,
                format!("all {rings} rings of this client are held by batches; destroy one or attach with more rings"),
            ));
        }
        let batch = match inner.batch() {
            Ok(b) => b,
            Err(e) => {
                c.batches.fetch_sub(1, Ordering::AcqRel);
                return Err(e.into());
            }
        };
        let b = handles::into_raw(dpuio_batch {
            session: c.session.clone(),
            batch: ProcessLocal::new(batch),
            ready: VecDeque::new(),
            staged: 0,
            batches: c.batches.clone(),
        });
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, b, "out") }?;
        Ok(0)
    })
}

impl dpuio_batch {
    fn push(&mut self, request: &Request) -> Result<()> {
        let max = self.session.max_io_bytes();
        if request.length > max {
            return Err(Failure::invalid(format!(
                "length {} exceeds the agent's max_io_bytes {max}: split the request",
                request.length
            )));
        }
        if request.length == 0 {
            return Err(Failure::invalid("length is 0"));
        }
        let batch = self.batch.get_mut()?;
        if batch.room() == 0 {
            return Err(Failure::new(
                Code::ResourceExhausted,
                "the ring is full: submit and wait for completions first (see dpuio_batch_room)",
            ));
        }
        batch.push(request)?;
        self.staged += 1;
        Ok(())
    }
}

/// Prepare a read of `length` bytes at `file_offset` into the region at
/// `region_offset` (not visible to the agent until `dpuio_batch_submit`).
///
/// # Safety
/// `batch` a live batch used by this thread only; `file`, `region` live handles of
/// the batch's client.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_prep_read(
    batch: *mut dpuio_batch,
    file: *const dpuio_file,
    region: *const dpuio_region,
    region_offset: u64,
    length: u64,
    file_offset: u64,
    user_data: u64,
) -> c_int {
    ffi("dpuio_batch_prep_read", || {
        // SAFETY: see the header's rules.
        let (b, f, r) = unsafe { (handles::get_mut(batch)?, handles::get(file)?, handles::get(region)?) };
        let req = request(DPUIO_OP_READ, 0, f, r, region_offset, length, file_offset, user_data)?;
        same_client(b, f)?;
        b.push(&req)?;
        Ok(0)
    })
}

/// Prepare a write of `length` bytes from the region at `region_offset` to
/// `file_offset`. `flags`: `DPUIO_IO_SYNC` or 0.
///
/// # Safety
/// As `dpuio_batch_prep_read`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_prep_write(
    batch: *mut dpuio_batch,
    file: *const dpuio_file,
    region: *const dpuio_region,
    region_offset: u64,
    length: u64,
    file_offset: u64,
    flags: u32,
    user_data: u64,
) -> c_int {
    ffi("dpuio_batch_prep_write", || {
        // SAFETY: see the header's rules.
        let (b, f, r) = unsafe { (handles::get_mut(batch)?, handles::get(file)?, handles::get(region)?) };
        let req = request(DPUIO_OP_WRITE, flags, f, r, region_offset, length, file_offset, user_data)?;
        same_client(b, f)?;
        b.push(&req)?;
        Ok(0)
    })
}

fn same_client(b: &dpuio_batch, f: &dpuio_file) -> Result<()> {
    if !Arc::ptr_eq(&b.session, &f.session) {
        return Err(Failure::invalid("the batch and the file belong to different clients"));
    }
    Ok(())
}

/// Prepare `count` requests given as an array. All are checked before any is
/// prepared: on failure none is, and the error names the index of the bad one.
/// Returns `count` or a negative code.
///
/// # Safety
/// `batch` a live batch used by this thread only; `ios` points at `count` structs
/// whose handles are live handles of the batch's client.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_prep(batch: *mut dpuio_batch, ios: *const dpuio_io, count: usize) -> c_int {
    ffi("dpuio_batch_prep", || {
        // SAFETY: see the header's rules.
        let b = unsafe { handles::get_mut(batch) }?;
        if count == 0 {
            return Ok(0);
        }
        if ios.is_null() || !ios.is_aligned() {
            return Err(Failure::invalid("ios is NULL or misaligned"));
        }
        let count_int = c_int::try_from(count).map_err(|_| Failure::invalid("count is too large"))?;
        // SAFETY: non-null and aligned; the caller guarantees count valid structs.
        let ios = unsafe { std::slice::from_raw_parts(ios, count) };
        let room = b.batch.get()?.room();
        if count > room {
            return Err(Failure::new(
                Code::ResourceExhausted,
                format!("{count} requests but room for {room}: submit and wait for completions first"),
            ));
        }
        let mut requests = Vec::with_capacity(count);
        for (i, io) in ios.iter().enumerate() {
            let at = |e: Failure| Failure::new(e.code, format!("ios[{i}]: {}", e.message));
            // SAFETY: see the header's rules.
            let (f, r) = unsafe { (handles::get(io.file).map_err(at)?, handles::get(io.region).map_err(at)?) };
            same_client(b, f).map_err(at)?;
            let req = request(io.opcode, io.flags, f, r, io.region_offset, io.length, io.file_offset, io.user_data)
                .map_err(at)?;
            if req.length == 0 || req.length > b.session.max_io_bytes() {
                return Err(at(Failure::invalid(format!(
                    "length {} is 0 or exceeds the agent's max_io_bytes {}",
                    req.length,
                    b.session.max_io_bytes()
                ))));
            }
            requests.push(req);
        }
        for req in &requests {
            b.push(req)?;
        }
        Ok(count_int)
    })
}

/// Make every prepared request visible to the agent with one doorbell. Returns how
/// many were submitted.
///
/// # Safety
/// `batch` a live batch used by this thread only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_submit(batch: *mut dpuio_batch) -> c_int {
    ffi("dpuio_batch_submit", || {
        // SAFETY: see the header's rules.
        let b = unsafe { handles::get_mut(batch) }?;
        b.session.data_client()?;
        let n = b.batch.get_mut()?.submit()?;
        b.staged = 0;
        Ok(c_int::try_from(n).unwrap_or(c_int::MAX))
    })
}

/// Wait until at least `min` completions are available (fewer if fewer requests are
/// submitted and not yet returned) or `timeout_ms` passes (negative: no limit; 0: only
/// take what is there), then copy up to `max` of them into `out`. Returns how many
/// were copied: fewer than `min` means the timeout passed. Completions beyond `max`
/// stay for the next call.
///
/// # Safety
/// `batch` a live batch used by this thread only; `out` valid for `max` structs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_wait(
    batch: *mut dpuio_batch,
    out: *mut dpuio_completion,
    max: usize,
    min: usize,
    timeout_ms: i64,
) -> c_int {
    ffi("dpuio_batch_wait", || {
        // SAFETY: see the header's rules.
        let b = unsafe { handles::get_mut(batch) }?;
        if max > 0 && (out.is_null() || !out.is_aligned()) {
            return Err(Failure::invalid("out is NULL or misaligned"));
        }
        if min > max {
            return Err(Failure::invalid(format!("min {min} is larger than max {max}")));
        }
        let deadline = (timeout_ms >= 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
        let staged = b.staged;
        let ready = &mut b.ready;
        let ring = b.batch.get_mut()?;
        let submitted = ring.in_flight() - staged;
        let want = min.min(ready.len() + submitted);
        ready.extend(ring.poll());
        while ready.len() < want {
            // Wait for one completion at a time: the shim's wait returns everything
            // that arrived, and on a timeout it has taken nothing (with a minimum of
            // one, nothing is lost).
            let slice = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if slice.is_zero() {
                break;
            }
            match ring.wait(1, slice) {
                Ok(done) => ready.extend(done),
                Err(e) => {
                    let f = Failure::from(e);
                    if f.code == Code::TimedOut {
                        if deadline.is_some() {
                            break;
                        }
                        continue;
                    }
                    return Err(f);
                }
            }
        }
        let n = ready.len().min(max).min(c_int::MAX as usize);
        for i in 0..n {
            let d = ready.pop_front().expect("n <= ready.len()");
            // SAFETY: out is non-null and aligned (checked) and valid for max >= n
            // structs (the caller's contract).
            unsafe { out.add(i).write(completion_of(&d)) };
        }
        Ok(n as c_int)
    })
}

/// Requests prepared or submitted whose completion was not returned yet.
///
/// # Safety
/// `batch` a live batch used by this thread only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_in_flight(batch: *const dpuio_batch) -> usize {
    ffi_value("dpuio_batch_in_flight", 0, || {
        // SAFETY: see the header's rules.
        let b = unsafe { handles::get(batch) }?;
        Ok(b.batch.get()?.in_flight() + b.ready.len())
    })
}

/// Requests that can still be prepared before completions must be waited for.
///
/// # Safety
/// `batch` a live batch used by this thread only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_room(batch: *const dpuio_batch) -> usize {
    ffi_value("dpuio_batch_room", 0, || {
        // SAFETY: see the header's rules.
        let b = unsafe { handles::get(batch) }?;
        Ok(b.batch.get()?.room())
    })
}

/// Free a batch and give its ring back. Requests submitted and not completed are
/// waited for first (the agent may still be writing their regions); prepared but
/// unsubmitted ones are dropped.
///
/// # Safety
/// No other thread may use `batch` during or after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_destroy(batch: *mut dpuio_batch) -> c_int {
    ffi("dpuio_batch_destroy", || {
        // SAFETY: the caller guarantees no concurrent use.
        drop(unsafe { handles::take(batch) }?);
        Ok(0)
    })
}

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
