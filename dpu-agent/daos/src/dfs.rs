//! Safe handles over the loaded DAOS API: the process runtime (`daos_init` ..
//! `daos_fini`), a pool connection, a mounted DFS container and an open DFS object.
//!
//! Ownership encodes DAOS's teardown order: an [`Obj`] holds its [`Fs`], an `Fs` its
//! [`Pool`], a `Pool` the [`Runtime`]; each releases its handle on drop (`dfs_release`,
//! `dfs_umount` + `daos_cont_close`, `daos_pool_disconnect`, `daos_fini`), so no handle
//! outlives what it was opened from and `daos_fini` runs after the last of them.
//!
//! Thread safety: libdaos and libdfs are thread-safe for concurrent calls on the same
//! pool, container, `dfs_t` and `dfs_obj_t` handles (dfuse serves many threads through
//! one `dfs_t`); the wrappers therefore are `Send + Sync`. An [`EventQueue`] is `Send`
//! but not `Sync`: one thread drives it (polling is what progresses its operations).

use std::ffi::{CStr, CString, c_char, c_int};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use dpuio_backend::{HostBytes, HostBytesMut};

use crate::deadline;
use crate::error::{CallError, Code, errno_name};
use crate::sys::{self, Api, daos_anchor_t, daos_handle_t, dfs_obj_t, dfs_t};

mod event_queue;
pub use event_queue::{AsyncIo, EventQueue};

/// Why DAOS could not be set up in this process.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The libraries were not found or lack a symbol we need.
    #[error(
        "cannot load the DAOS client libraries (libgurt.so, libdaos.so, libdfs.so); searched: {}. \
         Install the DAOS client, or set DPUIO_DAOS_PREFIX to the prefix that holds lib64/libdfs.so",
        .tried.join("; ")
    )]
    Libraries { tried: Vec<String> },
    /// No `daos_agent` answers on its dRPC socket.
    #[error(
        "cannot reach the daos_agent at {socket}: {reason}. Start daos_agent on this machine, or set \
         [backend] agent_socket_dir (or DAOS_AGENT_DRPC_DIR) to the directory of its daos_agent.sock"
    )]
    AgentUnreachable { socket: String, reason: String },
    /// `daos_init` failed.
    #[error(
        "{0} (is the daos_agent running and compatible with this libdaos, and are the DAOS engines up? \
         `dmg system query`; [backend] call_timeout_seconds bounds the wait)"
    )]
    Init(CallError),
    /// A libfabric older than DAOS's network layer needs is already loaded in this
    /// process: a process has one `libfabric.so.1`, the first loaded, so DAOS's own
    /// build (shipped with the DAOS client) cannot be used.
    #[error(
        "{path} (libfabric {major}.{minor}) is already loaded in this process, but the DAOS client's \
         network layer (mercury) needs libfabric >= {}.{} (the build shipped with the DAOS client), and a \
         process has only one libfabric.so.1: the first loaded. Remove it from LD_PRELOAD and \
         LD_LIBRARY_PATH; dpu-agent itself loads libfabric only after the DAOS backend",
        MIN_LIBFABRIC.0, MIN_LIBFABRIC.1
    )]
    LibfabricConflict { path: String, major: u32, minor: u32 },
}

/// The oldest libfabric DAOS's mercury works with (DAOS's own build check says 1.20;
/// older ones lack the `FABRIC_1.7` symbols its NA plugin needs).
pub const MIN_LIBFABRIC: (u32, u32) = (1, 20);

/// [`SetupError::LibfabricConflict`] if this process already holds a libfabric older
/// than DAOS needs (loaded by a data-plane transport, a preload, or a link).
fn check_loaded_libfabric() -> Result<(), SetupError> {
    match libfabric_sys::loaded() {
        Some((path, (major, minor))) if (major, minor) < MIN_LIBFABRIC => {
            Err(SetupError::LibfabricConflict { path, major, minor })
        }
        _ => Ok(()),
    }
}

static API: OnceLock<Result<Api, Vec<String>>> = OnceLock::new();
static RUNTIME: Mutex<Weak<Runtime>> = Mutex::new(Weak::new());

/// Where the DAOS prefix comes from: the `DPUIO_DAOS_PREFIX` environment variable.
pub fn prefix_from_env() -> Option<PathBuf> {
    std::env::var_os("DPUIO_DAOS_PREFIX").filter(|p| !p.is_empty()).map(PathBuf::from)
}

/// Load the libraries (once per process) without initialising DAOS. `check-config`
/// uses this to say whether `serve` would find them.
pub fn load_libraries() -> Result<(), SetupError> {
    api().map(drop)
}

fn api() -> Result<&'static Api, SetupError> {
    API.get_or_init(|| sys::load(prefix_from_env().as_deref()))
        .as_ref()
        .map_err(|tried| SetupError::Libraries { tried: tried.clone() })
}

/// The DAOS default directory of the agent's socket.
pub const DEFAULT_AGENT_SOCKET_DIR: &str = "/var/run/daos_agent";

/// `D_POLL_TIMEOUT` (microseconds) unless the environment sets it: how long a
/// synchronous DAOS call's progress waits in epoll before it looks again, instead of
/// polling without pause (DAOS's default, 0).
const POLL_TIMEOUT_US: &str = "1000";

/// The agent's socket directory when the config names none: `DAOS_AGENT_DRPC_DIR`, else
/// DAOS's default.
pub fn default_agent_socket_dir() -> PathBuf {
    std::env::var_os("DAOS_AGENT_DRPC_DIR")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_AGENT_SOCKET_DIR), PathBuf::from)
}

/// `daos_init` for this process, held while anything DAOS is open; `daos_fini` when the
/// last holder is dropped.
pub struct Runtime {
    api: &'static Api,
}

impl Runtime {
    /// Load the libraries, check that a `daos_agent` answers at `agent_socket_dir`, and
    /// call `daos_init`, waiting for it at most `call_timeout` (or share the runtime
    /// already initialised in this process).
    pub fn get(agent_socket_dir: &Path, call_timeout: std::time::Duration) -> Result<Arc<Runtime>, SetupError> {
        let mut current = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rt) = current.upgrade() {
            return Ok(rt);
        }
        let socket = agent_socket_dir.join("daos_agent.sock");
        // libdaos would only say DER_AGENT_COMM; probing first names the socket. The
        // agent listens on a SOCK_SEQPACKET socket, so a stream connect to a live agent
        // fails with EPROTOTYPE, while a dead one gives ECONNREFUSED and none ENOENT.
        match UnixStream::connect(&socket) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EPROTOTYPE) => {}
            Err(e) => {
                return Err(SetupError::AgentUnreachable {
                    socket: socket.display().to_string(),
                    reason: e.to_string(),
                });
            }
        }
        let api = api()?;
        check_loaded_libfabric()?;
        if std::env::var_os("DAOS_AGENT_DRPC_DIR").as_deref() != Some(agent_socket_dir.as_os_str()) {
            // libdaos reads the socket directory only from this variable, in daos_init.
            // SAFETY: set_var races with concurrent getenv in other threads. It runs once
            // per process, while the agent is still starting (before it serves), and
            // only when the config names a directory other than the environment's.
            unsafe { std::env::set_var("DAOS_AGENT_DRPC_DIR", agent_socket_dir) };
        }
        if std::env::var_os("D_LOG_FILE").is_none() {
            // libgurt logs to stdout unless told otherwise, and the agent's stdout is
            // for its own lines (scripts read the listening address there).
            // SAFETY: as for DAOS_AGENT_DRPC_DIR above.
            unsafe { std::env::set_var("D_LOG_FILE", "/dev/stderr") };
        }
        if std::env::var_os("D_POLL_TIMEOUT").is_none() {
            // A synchronous DAOS call (every DFS metadata call) busy-polls the network
            // until its answer comes unless this is set (us per progress wait): with every
            // engine gone, the calls DAOS left unanswered kept a core busy (105% for 30 s
            // in the outage test). With it they wait in epoll; measured over DAOS, no
            // change in rate (docs/daos.md).
            // SAFETY: as for DAOS_AGENT_DRPC_DIR above.
            unsafe { std::env::set_var("D_POLL_TIMEOUT", POLL_TIMEOUT_US) };
        }
        // Bounded like every blocking call: with every engine gone, daos_init waited
        // without end (seen in the outage test).
        deadline::call("daos_init", "", call_timeout, move || {
            // SAFETY: daos_init takes no arguments; it is reference counted by libdaos
            // and paired with the daos_fini in Drop (a call left past its deadline here
            // fails the start, and the process ends).
            let rc = unsafe { (api.daos_init)() };
            if rc != 0 { Err(der_error(api, "daos_init", rc)) } else { Ok(()) }
        })
        .map_err(SetupError::Init)?;
        if let Some((path, (major, minor))) = libfabric_sys::loaded() {
            // The data plane's libfabric transports will use this one too.
            tracing::info!(libfabric = %path, version = %format!("{major}.{minor}"), "DAOS client's libfabric");
        }
        let rt = Arc::new(Runtime { api });
        *current = Arc::downgrade(&rt);
        Ok(rt)
    }

    /// The DAOS object class id of a name such as `SX` or `RP_2G1`, if DAOS knows it.
    pub fn object_class(&self, name: &str) -> Option<u32> {
        let c = CString::new(name).ok()?;
        // SAFETY: c is a NUL-terminated string that outlives the call.
        let id = unsafe { (self.api.daos_oclass_name2id)(c.as_ptr()) };
        (id > 0).then_some(id as u32)
    }

    /// Connect to a pool by label or UUID in DAOS system `system`, read-write.
    pub fn connect(self: &Arc<Self>, pool: &str, system: &str) -> Result<Arc<Pool>, CallError> {
        let (c_pool, c_sys) = (cstring(pool)?, cstring(system)?);
        let mut poh = daos_handle_t::default();
        // SAFETY: the strings are NUL-terminated and outlive the call; poh is a valid
        // out-pointer; info and event are optional (NULL: blocking, no info).
        let rc = unsafe {
            (self.api.daos_pool_connect2)(
                c_pool.as_ptr(),
                c_sys.as_ptr(),
                sys::DAOS_PC_RW,
                &mut poh,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(der_error(self.api, "daos_pool_connect", rc));
        }
        Ok(Arc::new(Pool { rt: self.clone(), poh }))
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // SAFETY: pairs the daos_init of Runtime::get; every handle holds the runtime,
        // so none is left open.
        let rc = unsafe { (self.api.daos_fini)() };
        if rc != 0 {
            tracing::warn!(error = %der_error(self.api, "daos_fini", rc), "DAOS shutdown");
        } else {
            tracing::info!("DAOS client finalised (daos_fini)");
        }
    }
}

/// A pool connection.
pub struct Pool {
    rt: Arc<Runtime>,
    poh: daos_handle_t,
}

impl Pool {
    /// Open container `label` and mount it with DFS, read-write. With `create`, a
    /// missing container is first created as a POSIX container.
    ///
    /// With `private`, a container this call creates admits its owner only: DAOS gives a
    /// new container `A::OWNER@:rwdtTaAo` and `A:G:GROUP@:rwtT`, and the group entry is
    /// removed before the container is used (the owner is this process's DAOS user).
    ///
    /// `redundancy` (factor, level; 0 for DAOS's default) is the new container's
    /// `rd_fac` and `rd_lvl`.
    pub fn mount(
        self: &Arc<Self>,
        label: &str,
        create: bool,
        private: bool,
        redundancy: (u32, u32),
    ) -> Result<Arc<Fs>, CallError> {
        let api = self.rt.api;
        let c_label = cstring(label)?;
        let mut coh = daos_handle_t::default();
        let open = |coh: &mut daos_handle_t| {
            // SAFETY: c_label outlives the call, coh is a valid out-pointer, info and
            // event may be NULL.
            unsafe {
                (api.daos_cont_open2)(
                    self.poh,
                    c_label.as_ptr(),
                    sys::DAOS_COO_RW,
                    coh,
                    ptr::null_mut(),
                    ptr::null_mut(),
                )
            }
        };
        let mut rc = open(&mut coh);
        if create && is_nonexist(rc) {
            let mut uuid: sys::uuid_t = [0; 16];
            let props = redundancy_props(api, redundancy)?;
            // SAFETY: dfs_attr_t is plain old data; all zero is DFS's defaults.
            let mut attr: sys::dfs_attr_t = unsafe { std::mem::zeroed() };
            attr.da_props = props;
            // SAFETY: poh is connected; c_label outlives the call; attr (zero but for
            // its properties, NULL when none) outlives it; the uuid out-pointer is valid;
            // NULL coh/dfs ask for neither to be left open.
            let erc = unsafe {
                (api.dfs_cont_create_with_label)(
                    self.poh,
                    c_label.as_ptr(),
                    (&mut attr as *mut sys::dfs_attr_t).cast(),
                    &mut uuid,
                    ptr::null_mut(),
                    ptr::null_mut(),
                )
            };
            if !props.is_null() {
                // SAFETY: allocated by daos_prop_alloc in redundancy_props, freed once;
                // DFS copied what it needed.
                unsafe { (api.daos_prop_free)(props) };
            }
            // EEXIST: another agent created it in between; open it all the same.
            if erc != 0 && erc != libc::EEXIST {
                return Err(errno_error("dfs_cont_create_with_label", erc));
            }
            rc = open(&mut coh);
            if rc == 0 && erc == 0 && private {
                // SAFETY: coh is open; a NULL name is what the owner-group principal takes.
                let drc =
                    unsafe { (api.daos_cont_delete_acl)(coh, sys::DAOS_ACL_OWNER_GROUP, ptr::null(), ptr::null_mut()) };
                if drc != 0 {
                    // SAFETY: coh was opened above and is not used again.
                    unsafe { (api.daos_cont_close)(coh, ptr::null_mut()) };
                    return Err(der_error(api, "daos_cont_delete_acl", drc));
                }
            }
        }
        if rc != 0 {
            return Err(der_error(api, "daos_cont_open", rc));
        }
        let mut dfs: *mut dfs_t = ptr::null_mut();
        // SAFETY: poh and coh are open; dfs is a valid out-pointer.
        let rc = unsafe { (api.dfs_mount)(self.poh, coh, libc::O_RDWR, &mut dfs) };
        if rc != 0 {
            // SAFETY: coh was opened above and is not used again.
            unsafe { (api.daos_cont_close)(coh, ptr::null_mut()) };
            return Err(errno_error("dfs_mount", rc));
        }
        Ok(Arc::new(Fs { pool: self.clone(), coh, dfs }))
    }
}

/// The `rd_fac` and `rd_lvl` properties of a new container (NULL: DAOS's defaults).
fn redundancy_props(api: &Api, (factor, level): (u32, u32)) -> Result<*mut sys::daos_prop_t, CallError> {
    let wanted: Vec<(u32, u64)> = [(sys::DAOS_PROP_CO_REDUN_FAC, factor), (sys::DAOS_PROP_CO_REDUN_LVL, level)]
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(t, v)| (t, u64::from(v)))
        .collect();
    if wanted.is_empty() {
        return Ok(ptr::null_mut());
    }
    // SAFETY: allocates a zeroed property list of that many entries (or NULL).
    let props = unsafe { (api.daos_prop_alloc)(wanted.len() as u32) };
    // SAFETY: a non-NULL result has dpp_nr entries at dpp_entries.
    let Some(list) = (unsafe { props.as_mut() }) else {
        return Err(errno_error("daos_prop_alloc", libc::ENOMEM));
    };
    for (i, (kind, value)) in wanted.into_iter().enumerate() {
        // SAFETY: i < dpp_nr (allocated for exactly these entries).
        let entry = unsafe { &mut *list.dpp_entries.add(i) };
        entry.dpe_type = kind;
        // The union's u64 member: a number, not a pointer.
        entry.dpe_val_ptr = value as usize as *mut std::ffi::c_void;
    }
    Ok(props)
}

fn is_nonexist(rc: c_int) -> bool {
    rc == -crate::error::der::NONEXIST || rc == -crate::error::der::NONEXIST_CONT
}

impl Pool {
    /// The DAOS object class id of a name such as `SX` or `RP_2G1`, if DAOS knows it.
    pub fn object_class(&self, name: &str) -> Option<u32> {
        self.rt.object_class(name)
    }

    /// A new event queue of this process's DAOS runtime, for one I/O thread.
    pub fn event_queue(&self, depth: usize) -> Result<EventQueue, CallError> {
        EventQueue::new(self.rt.clone(), depth)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: every container of this pool holds the pool, so none is open now.
        let rc = unsafe { (self.rt.api.daos_pool_disconnect)(self.poh, ptr::null_mut()) };
        if rc != 0 {
            tracing::warn!(error = %der_error(self.rt.api, "daos_pool_disconnect", rc), "DAOS pool");
        }
    }
}

/// A container mounted with DFS.
pub struct Fs {
    pool: Arc<Pool>,
    coh: daos_handle_t,
    dfs: *mut dfs_t,
}

// SAFETY: a dfs_t is safe to use from many threads at once (module doc); the pointer is
// only freed in Drop, which needs exclusive ownership.
unsafe impl Send for Fs {}
// SAFETY: as for Send.
unsafe impl Sync for Fs {}

impl Drop for Fs {
    fn drop(&mut self) {
        let api = self.pool.rt.api;
        // SAFETY: every object of this mount holds the Fs, so none is open now; dfs and
        // coh came from dfs_mount and daos_cont_open and are released once.
        let rc = unsafe { (api.dfs_umount)(self.dfs) };
        if rc != 0 {
            tracing::warn!(error = %errno_error("dfs_umount", rc), "DAOS container");
        }
        // SAFETY: as above.
        let rc = unsafe { (api.daos_cont_close)(self.coh, ptr::null_mut()) };
        if rc != 0 {
            tracing::warn!(error = %der_error(api, "daos_cont_close", rc), "DAOS container");
        }
    }
}

/// What `dfs_stat`/`dfs_ostat` and `dfs_readdirplus` report, reduced to what we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub mode: u32,
    pub size: u64,
    pub ino: u64,
    pub mtime_ns: i64,
}

impl From<&libc::stat> for Stat {
    fn from(st: &libc::stat) -> Stat {
        Stat {
            mode: st.st_mode,
            size: st.st_size as u64,
            ino: st.st_ino,
            mtime_ns: st.st_mtime.saturating_mul(1_000_000_000).saturating_add(st.st_mtime_nsec),
        }
    }
}

fn zeroed_stat() -> libc::stat {
    // SAFETY: struct stat is plain integers; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

impl Fs {
    /// The container's owner (`user@`) and its ACL, one entry per string in DAOS's
    /// own format (`A::OWNER@:rwdtTaAo`), as `daos container get-acl` prints them.
    pub fn acl(&self) -> Result<(String, Vec<String>), CallError> {
        let api = self.pool.rt.api;
        let mut prop: *mut sys::daos_prop_t = ptr::null_mut();
        // SAFETY: coh is open; prop is a valid out-pointer; NULL event: blocking.
        let rc = unsafe { (api.daos_cont_get_acl)(self.coh, &mut prop, ptr::null_mut()) };
        if rc != 0 {
            return Err(der_error(api, "daos_cont_get_acl", rc));
        }
        let text = |entry: *mut sys::daos_prop_entry| -> Option<String> {
            // SAFETY: entry is NULL or an entry of prop (alive until daos_prop_free
            // below).
            let value = unsafe { entry.as_ref() }?.dpe_val_ptr;
            if value.is_null() {
                return None;
            }
            // SAFETY: the owner entry's value is a NUL-terminated string of prop.
            Some(unsafe { CStr::from_ptr(value as *const c_char) }.to_string_lossy().into_owned())
        };
        // SAFETY: prop came from daos_cont_get_acl.
        let owner = text(unsafe { (api.daos_prop_entry_get)(prop, sys::DAOS_PROP_CO_OWNER) }).unwrap_or_default();
        // SAFETY: as above.
        let acl_entry = unsafe { (api.daos_prop_entry_get)(prop, sys::DAOS_PROP_CO_ACL) };
        let mut entries = Vec::new();
        // SAFETY: acl_entry is NULL or an entry of prop; its value is a struct daos_acl.
        if let Some(entry) = unsafe { acl_entry.as_ref() }.filter(|e| !e.dpe_val_ptr.is_null()) {
            let (mut strs, mut n): (*mut *mut c_char, usize) = (ptr::null_mut(), 0);
            // SAFETY: the ACL pointer is valid while prop is; strs and n are valid
            // out-pointers; each string and the array are malloc'd for us to free.
            let rc = unsafe { (api.daos_acl_to_strs)(entry.dpe_val_ptr, &mut strs, &mut n) };
            if rc == 0 && !strs.is_null() {
                for i in 0..n {
                    // SAFETY: strs holds n pointers.
                    let s = unsafe { *strs.add(i) };
                    // SAFETY: each is a NUL-terminated malloc'd string.
                    entries.push(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned());
                    // SAFETY: malloc'd by daos_acl_to_strs, freed once.
                    unsafe { libc::free(s.cast()) };
                }
                // SAFETY: as above.
                unsafe { libc::free(strs.cast()) };
            }
            if rc != 0 {
                // SAFETY: prop came from daos_cont_get_acl and is freed once.
                unsafe { (api.daos_prop_free)(prop) };
                return Err(der_error(api, "daos_acl_to_strs", rc));
            }
        }
        // SAFETY: prop came from daos_cont_get_acl and is freed once.
        unsafe { (api.daos_prop_free)(prop) };
        Ok((owner, entries))
    }

    fn api(&self) -> &'static Api {
        self.pool.rt.api
    }

    fn parent_ptr(parent: Option<&Obj>) -> *mut dfs_obj_t {
        parent.map_or(ptr::null_mut(), |p| p.obj)
    }

    /// `dfs_lookup` of an absolute path (`/` is the root), not following a final link.
    pub fn lookup(self: &Arc<Self>, path: &str, write: bool) -> Result<(Obj, Stat), CallError> {
        let c = cstring(path)?;
        let mut obj: *mut dfs_obj_t = ptr::null_mut();
        let mut mode: libc::mode_t = 0;
        let mut st = zeroed_stat();
        let flags = if write { libc::O_RDWR } else { libc::O_RDONLY } | libc::O_NOFOLLOW;
        // SAFETY: dfs is mounted; c outlives the call; obj, mode and st are valid
        // out-pointers.
        let rc = unsafe { (self.api().dfs_lookup)(self.dfs, c.as_ptr(), flags, &mut obj, &mut mode, &mut st) };
        check("dfs_lookup", rc)?;
        Ok((Obj { fs: self.clone(), obj }, Stat::from(&st)))
    }

    /// `dfs_lookup_rel` of `name` in `parent` (the root when `None`), not following a
    /// link: the entry opened and its stat, as [`Fs::lookup`] gives for a whole path
    /// but with one fetch from DAOS for the entry (and one for a file's size) instead of
    /// one per component.
    pub fn lookup_rel(
        self: &Arc<Self>,
        parent: Option<&Obj>,
        name: &str,
        write: bool,
    ) -> Result<(Obj, Stat), CallError> {
        let c = cstring(name)?;
        let mut obj: *mut dfs_obj_t = ptr::null_mut();
        let mut mode: libc::mode_t = 0;
        let mut st = zeroed_stat();
        let flags = if write { libc::O_RDWR } else { libc::O_RDONLY } | libc::O_NOFOLLOW;
        // SAFETY: dfs is mounted; parent (if any) is an open object of this mount; c
        // outlives the call; obj, mode and st are valid out-pointers.
        let rc = unsafe {
            (self.api().dfs_lookup_rel)(
                self.dfs,
                Self::parent_ptr(parent),
                c.as_ptr(),
                flags,
                &mut obj,
                &mut mode,
                &mut st,
            )
        };
        check("dfs_lookup_rel", rc)?;
        Ok((Obj { fs: self.clone(), obj }, Stat::from(&st)))
    }

    /// `dfs_stat` of `name` in `parent` (the root when `None`).
    pub fn stat(&self, parent: Option<&Obj>, name: &str) -> Result<Stat, CallError> {
        let c = cstring(name)?;
        let mut st = zeroed_stat();
        // SAFETY: dfs is mounted; parent (if any) is an open object of this mount; c
        // outlives the call; st is a valid out-pointer.
        let rc = unsafe { (self.api().dfs_stat)(self.dfs, Self::parent_ptr(parent), c.as_ptr(), &mut st) };
        check("dfs_stat", rc)?;
        Ok(Stat::from(&st))
    }

    /// `dfs_open_stat` of `name` in `parent` with open(2) `flags`: the object, and with
    /// `stat` (which needs `O_CREAT`: DFS refuses it otherwise) its attributes from the
    /// same call. Without `stat` this is `dfs_open` (DFS's `dfs_open` is this call with no
    /// stat). A file it creates costs no more than `dfs_open` (its size is 0 and its entry
    /// is the one just written); where DFS finds an existing file it reads its size too,
    /// and where `O_TRUNC` cut it, the size is 0 with no read. The owner of an entry it
    /// creates is this process's effective uid and gid, as `dfs_open` makes it.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        self: &Arc<Self>,
        parent: Option<&Obj>,
        name: &str,
        mode: u32,
        flags: c_int,
        object_class: u32,
        chunk_bytes: u64,
        stat: bool,
    ) -> Result<(Obj, Option<Stat>), CallError> {
        if stat && flags & libc::O_CREAT == 0 {
            return Err(CallError {
                call: "argument check",
                code: Code::Errno(libc::EINVAL),
                name: "EINVAL".to_owned(),
                description: format!("dfs_open_stat of {name:?} without O_CREAT (use dfs_lookup)"),
            });
        }
        let c = cstring(name)?;
        let mut obj: *mut dfs_obj_t = ptr::null_mut();
        let mut st = zeroed_stat();
        // The owner of an entry this call creates is taken from the stat passed in.
        // SAFETY: geteuid and getegid cannot fail.
        (st.st_uid, st.st_gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let st_ptr: *mut libc::stat = if stat { &mut st } else { ptr::null_mut() };
        // SAFETY: dfs is mounted; parent (if any) is an open object of this mount; c
        // outlives the call; no symlink value; obj is a valid out-pointer and st_ptr NULL
        // or one.
        let rc = unsafe {
            (self.api().dfs_open_stat)(
                self.dfs,
                Self::parent_ptr(parent),
                c.as_ptr(),
                mode,
                flags,
                object_class,
                chunk_bytes,
                ptr::null(),
                &mut obj,
                st_ptr,
            )
        };
        check(if stat { "dfs_open_stat" } else { "dfs_open" }, rc)?;
        Ok((Obj { fs: self.clone(), obj }, stat.then(|| Stat::from(&st))))
    }

    /// `dfs_mkdir` of `name` in `parent`.
    pub fn mkdir(&self, parent: Option<&Obj>, name: &str, mode: u32, object_class: u32) -> Result<(), CallError> {
        let c = cstring(name)?;
        // SAFETY: dfs is mounted; parent (if any) is an open object of this mount; c
        // outlives the call.
        let rc = unsafe { (self.api().dfs_mkdir)(self.dfs, Self::parent_ptr(parent), c.as_ptr(), mode, object_class) };
        check("dfs_mkdir", rc)
    }

    /// `dfs_remove` of `name` in `parent`; `force` removes a non-empty directory.
    pub fn remove(&self, parent: Option<&Obj>, name: &str, force: bool) -> Result<(), CallError> {
        let c = cstring(name)?;
        // SAFETY: dfs is mounted; parent (if any) is an open object of this mount; c
        // outlives the call; the removed oid is not asked for.
        let rc =
            unsafe { (self.api().dfs_remove)(self.dfs, Self::parent_ptr(parent), c.as_ptr(), force, ptr::null_mut()) };
        check("dfs_remove", rc)
    }

    /// `dfs_move`: rename `name` in `parent` to `new_name` in `new_parent`.
    pub fn rename(
        &self,
        parent: Option<&Obj>,
        name: &str,
        new_parent: Option<&Obj>,
        new_name: &str,
    ) -> Result<(), CallError> {
        let (c, n) = (cstring(name)?, cstring(new_name)?);
        // SAFETY: dfs is mounted; both parents (if any) are open objects of this mount;
        // the strings outlive the call; the clobbered oid is not asked for.
        let rc = unsafe {
            (self.api().dfs_move)(
                self.dfs,
                Self::parent_ptr(parent),
                c.as_ptr(),
                Self::parent_ptr(new_parent),
                n.as_ptr(),
                ptr::null_mut(),
            )
        };
        check("dfs_move", rc)
    }

    /// One `dfs_readdirplus` call: up to `max` entries of `dir` from `anchor`, which it
    /// advances. Names that are not UTF-8 are returned lossily (dpuio never makes them).
    pub fn readdir(&self, dir: &Obj, anchor: &mut daos_anchor_t, max: u32) -> Result<Vec<(String, Stat)>, CallError> {
        // SAFETY: struct dirent is plain integers and a char array; zero is valid.
        let mut dirents: Vec<libc::dirent> = vec![unsafe { std::mem::zeroed() }; max as usize];
        let mut stats: Vec<libc::stat> = vec![zeroed_stat(); max as usize];
        let mut nr = max;
        // SAFETY: dfs is mounted; dir is an open directory of this mount; anchor is a
        // valid daos_anchor_t (ours, or one we issued and authenticated); both arrays
        // hold nr elements, as DFS requires.
        let rc = unsafe {
            (self.api().dfs_readdirplus)(self.dfs, dir.obj, anchor, &mut nr, dirents.as_mut_ptr(), stats.as_mut_ptr())
        };
        check("dfs_readdirplus", rc)?;
        let nr = (nr as usize).min(max as usize);
        Ok(dirents[..nr]
            .iter()
            .zip(&stats[..nr])
            .map(|(d, st)| {
                // SAFETY: DFS wrote a NUL-terminated name (at most NAME_MAX bytes) into
                // d_name, which is 256 bytes.
                let name = unsafe { CStr::from_ptr(d.d_name.as_ptr()) };
                (name.to_string_lossy().into_owned(), Stat::from(st))
            })
            .collect())
    }

    /// `dfs_sync` (a no-op in DFS today: a write is durable once it completes).
    pub fn sync(&self) -> Result<(), CallError> {
        // SAFETY: dfs is mounted.
        let rc = unsafe { (self.api().dfs_sync)(self.dfs) };
        check("dfs_sync", rc)
    }
}

/// An open DFS object (file or directory).
pub struct Obj {
    fs: Arc<Fs>,
    obj: *mut dfs_obj_t,
}

// SAFETY: DFS objects may be used from many threads at once (module doc); the pointer is
// released only in Drop.
unsafe impl Send for Obj {}
// SAFETY: as for Send.
unsafe impl Sync for Obj {}

impl Drop for Obj {
    fn drop(&mut self) {
        // SAFETY: obj came from dfs_open/dfs_lookup and is released once.
        let rc = unsafe { (self.fs.api().dfs_release)(self.obj) };
        if rc != 0 {
            tracing::warn!(error = %errno_error("dfs_release", rc), "DAOS object");
        }
    }
}

impl Obj {
    /// `dfs_read` into `buf` at `offset`; returns the bytes read (short at end of file).
    /// DAOS writes straight into the view (the host's mapped region on the data plane).
    pub fn read_at(&self, mut buf: HostBytesMut<'_>, offset: u64) -> Result<usize, CallError> {
        let mut iov = sys::d_iov_t { iov_buf: buf.as_mut_ptr().cast(), iov_buf_len: buf.len(), iov_len: buf.len() };
        let mut sgl = sys::d_sg_list_t { sg_nr: 1, sg_nr_out: 0, sg_iovs: &mut iov };
        let mut read: u64 = 0;
        // SAFETY: the sgl describes buf, a view valid for writes of its length and
        // borrowed for the call; the call is blocking (NULL event), so DFS is done with
        // it when it returns.
        let rc =
            unsafe { (self.fs.api().dfs_read)(self.fs.dfs, self.obj, &mut sgl, offset, &mut read, ptr::null_mut()) };
        check("dfs_read", rc)?;
        Ok((read as usize).min(buf.len()))
    }

    /// `dfs_write` of all of `buf` at `offset`, straight from the view.
    pub fn write_at(&self, buf: HostBytes<'_>, offset: u64) -> Result<(), CallError> {
        // DFS only reads through iov_buf on a write; the pointer is *mut by C's type.
        let mut iov =
            sys::d_iov_t { iov_buf: buf.as_ptr().cast_mut().cast(), iov_buf_len: buf.len(), iov_len: buf.len() };
        let mut sgl = sys::d_sg_list_t { sg_nr: 1, sg_nr_out: 0, sg_iovs: &mut iov };
        // SAFETY: the sgl describes buf, a view valid for reads of its length, borrowed
        // for the call and only read by DFS; the call is blocking (NULL event).
        let rc = unsafe { (self.fs.api().dfs_write)(self.fs.dfs, self.obj, &mut sgl, offset, ptr::null_mut()) };
        check("dfs_write", rc)
    }

    /// `dfs_punch` from `offset` to the end: the file's size becomes `offset`.
    pub fn truncate(&self, size: u64) -> Result<(), CallError> {
        // SAFETY: dfs and obj are open. DFS_MAX_FSIZE (~0) as the length means "to the
        // end", which sets the size to `size` (growing it if it was smaller).
        let rc = unsafe { (self.fs.api().dfs_punch)(self.fs.dfs, self.obj, size, u64::MAX) };
        check("dfs_punch", rc)
    }

    /// `dfs_ostat`.
    pub fn stat(&self) -> Result<Stat, CallError> {
        let mut st = zeroed_stat();
        // SAFETY: dfs and obj are open; st is a valid out-pointer.
        let rc = unsafe { (self.fs.api().dfs_ostat)(self.fs.dfs, self.obj, &mut st) };
        check("dfs_ostat", rc)?;
        Ok(Stat::from(&st))
    }

    /// `dfs_obj_get_info`: object class, chunk size and object id.
    pub fn info(&self) -> Result<sys::dfs_obj_info_t, CallError> {
        let mut info = sys::dfs_obj_info_t::default();
        // SAFETY: dfs and obj are open; info is a valid out-pointer of the header's layout.
        let rc = unsafe { (self.fs.api().dfs_obj_get_info)(self.fs.dfs, self.obj, &mut info) };
        check("dfs_obj_get_info", rc)?;
        Ok(info)
    }
}

/// A name or label for C. Paths and labels are validated long before (no NUL byte can
/// get here from a client), so this is a last check, reported as EINVAL.
fn cstring(s: &str) -> Result<CString, CallError> {
    CString::new(s).map_err(|_| CallError {
        call: "argument check",
        code: Code::Errno(libc::EINVAL),
        name: "EINVAL".to_owned(),
        description: format!("{s:?} contains a NUL byte"),
    })
}

fn check(call: &'static str, rc: c_int) -> Result<(), CallError> {
    if rc == 0 { Ok(()) } else { Err(errno_error(call, rc)) }
}

/// An errno returned by a `dfs_*` call.
pub fn errno_error(call: &'static str, errno: c_int) -> CallError {
    CallError {
        call,
        code: Code::Errno(errno),
        name: errno_name(errno).to_owned(),
        description: std::io::Error::from_raw_os_error(errno).to_string(),
    }
}

/// A negative DER code returned by a `daos_*` call, named by libgurt's `d_errstr`.
fn der_error(api: &Api, call: &'static str, rc: c_int) -> CallError {
    let text = |f: unsafe extern "C" fn(c_int) -> *const c_char| {
        // SAFETY: d_errstr/d_errdesc return a pointer to a static NUL-terminated string
        // for any value (DER_UNKNOWN for an unknown one), or NULL.
        let p = unsafe { f(rc) };
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: p is non-NULL and points to a static C string (above).
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    CallError { call, code: Code::Der(-rc), name: text(api.d_errstr), description: text(api.d_errdesc) }
}

/// For tests: the DAOS name of DER code `der` (positive), from the loaded libgurt.
pub fn der_name(der: i32) -> Result<String, SetupError> {
    Ok(der_error(api()?, "", -der).name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_load_says_what_was_searched_and_what_to_set() {
        let tried = vec!["/p/lib64: no libdfs.so".to_owned(), "/opt/daos/lib64: not an ELF file".to_owned()];
        let message = SetupError::Libraries { tried }.to_string();
        assert!(message.contains("/p/lib64: no libdfs.so; /opt/daos/lib64"), "{message}");
        assert!(message.contains("DPUIO_DAOS_PREFIX") && message.contains("libdfs.so"), "{message}");
    }
}
