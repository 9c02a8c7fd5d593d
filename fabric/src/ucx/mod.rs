//! The UCX implementation of [`crate::Transport`]: [`Context`], [`Worker`],
//! [`Region`], [`Endpoint`], [`RemoteKey`].
//!
//! Ownership is reference-counted so handles can move into tasks freely, and the
//! order UCX needs is kept by the references themselves: a region and a worker keep
//! their context, an endpoint keeps its worker, a remote key keeps its endpoint, a
//! mapping keeps its remote key, and a posted operation keeps everything it touches
//! (local region, remote key, copied bytes) until UCX reports it complete. Dropping a
//! handle early is therefore always safe; the UCX object goes away when the last user
//! does.
//!
//! Completions are delivered by UCX inside `ucp_worker_progress`. Releasing what an
//! operation kept alive can destroy UCX objects (unmap a region, close an endpoint),
//! which must not happen inside UCX's own callback, so completion callbacks only move
//! those references to a per-worker list that progress empties after UCX returns.
//!
//! Rooms, top down: `worker` (the [`crate::Transport`]: it makes endpoints and
//! regions), `endpoint` (endpoints, remote keys, posted operations), `shared` (the
//! worker's state its endpoints hold: the handle, progress, the graveyard), `region`;
//! the context is this module's own.

mod endpoint;
mod region;
mod shared;
mod worker;

pub use endpoint::{Endpoint, RemoteKey};
pub use region::Region;
pub use worker::Worker;

use std::ffi::{CString, c_char};
use std::ptr;
use std::sync::Arc;

use ucx_sys as sys;

use crate::config::FabricConfig;
use crate::error::{Error, Result, check};

/// The UCX library. Every UCX object comes from a [`Context`], and making the first one
/// loaded the library (or failed, and then there is no object): past that the load's
/// result, kept for the life of the process, is always `Ok`.
pub(crate) fn api() -> &'static sys::Ucx {
    sys::api().expect("UCX was loaded by the Context every UCX object comes from")
}

/// A UCX application context (`ucp_context_h`): the set of transports and the memory
/// registrations. Cheap to clone (a reference); the context is cleaned up when the
/// last clone, worker and region are gone.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    handle: sys::ucp_context_h,
    config: FabricConfig,
}

// SAFETY: the context is created with mt_workers_shared = 1, which makes UCX guard
// the context-level calls we make through it (ucp_mem_map/unmap, ucp_rkey_pack,
// ucp_worker_create) with the context lock; the handle is only destroyed in Drop.
unsafe impl Send for ContextInner {}
// SAFETY: as above; shared use goes through UCX's own locking.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: the handle came from ucp_init; every worker and region holds an Arc
        // to this inner value, so none is left when it drops.
        unsafe { api().ucp_cleanup(self.handle) };
    }
}

impl Context {
    /// Reads UCX's configuration (environment `UCX_*` variables), applies
    /// `config.transports` as `TLS` and `config.ucx_options`, and initialises UCX
    /// with the RMA, active-message and wakeup features. The first context of a
    /// process loads UCX (`ucx_sys::api`).
    pub fn new(config: &FabricConfig) -> Result<Context> {
        config.validate()?;
        sys::api()?;
        let ucx_config = UcxConfig::read()?;
        if let Some(tls) = &config.transports {
            ucx_config.modify("TLS", tls)?;
        }
        for (name, value) in &config.ucx_options {
            ucx_config.modify(name, value)?;
        }
        for (name, value) in tcp_defaults(config, |var| std::env::var_os(var).is_some()) {
            ucx_config.modify(name, value)?;
        }

        let params = sys::ucp_params_t {
            field_mask: u64::from(sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED),
            features: u64::from(sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_AM | sys::UCP_FEATURE_WAKEUP),
            mt_workers_shared: 1,
            ..Default::default()
        };
        let mut handle: sys::ucp_context_h = ptr::null_mut();
        // SAFETY: params is initialised and its field_mask names only set fields;
        // ucx_config is live until the end of this function; handle is writable.
        let status = unsafe { api().ucp_init(&params, ucx_config.ptr, &mut handle) };
        check("initialise UCX (ucp_init)", status)?;
        Ok(Context { inner: Arc::new(ContextInner { handle, config: config.clone() }) })
    }

    /// The configuration this context was built from.
    pub fn config(&self) -> &FabricConfig {
        &self.inner.config
    }

    /// Creates a worker (the unit of progress and the thing peers connect to).
    pub fn create_worker(&self) -> Result<Worker> {
        Worker::new(self.clone())
    }

    /// Allocates a region of `len` bytes through UCX (`ucp_mem_map` with
    /// `UCP_MEM_MAP_ALLOCATE`), so that on shared-memory transports the memory is a
    /// segment peers attach to and write without this process's help. Contents are
    /// unspecified (zero on shared-memory segments).
    pub fn alloc_region(&self, len: usize) -> Result<Region> {
        Region::allocate(self.inner.clone(), len)
    }

    /// Registers memory the caller mapped, held by `keep`; see
    /// [`crate::any::Worker::register_lent`].
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` must be mapped read/write for as long as `keep` lives.
    pub unsafe fn register_lent(
        &self,
        ptr: *mut u8,
        len: usize,
        keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<Region> {
        // SAFETY: passed on from the caller.
        unsafe { Region::lent(self.inner.clone(), ptr, len, keep) }
    }

    /// UCX's own description of the context (`ucp_context_print_info`): enabled
    /// transports and memory domains. For logs at start-up.
    pub fn describe(&self) -> String {
        capture_stream(|stream| {
            // SAFETY: the context handle is live (self holds it) and stream is a valid
            // FILE* for the duration of the call.
            unsafe { api().ucp_context_print_info(self.inner.handle, stream) }
        })
    }

    /// The UCX components (transport modules) this context loaded, in UCX's order, e.g.
    /// `self, tcp, sysv, posix, cma, ib, rdmacm`: without its module directory only the
    /// built-in ones (self, tcp, sysv, posix) are there, so this says whether the RDMA
    /// modules were found.
    pub fn components(&self) -> Vec<String> {
        components_of(&self.describe())
    }

    pub(crate) fn inner(&self) -> &Arc<ContextInner> {
        &self.inner
    }
}

impl ContextInner {
    pub(crate) fn handle(&self) -> sys::ucp_context_h {
        self.handle
    }
}

/// The tcp transport's segment sizes this crate applies where a context names `tcp`,
/// as (name given to `ucp_config_modify`, value, the environment variable that
/// overrides it). UCX 1.13 carries a put over TCP as active messages of at most
/// `TX_SEG_SIZE` (8 KiB by default), each copied into a send buffer, written to the
/// socket, read into a receive buffer of `RX_SEG_SIZE` and copied into the target
/// region by the target's worker, and acknowledged: a 1 MiB put is 128 of them. At
/// 64 KiB it is 16: on loopback (2026-11-27, load average 5) shim-ucx-tcp's 1 MiB
/// reads at depth 8 went from 0.30 to 0.91 GiB/s, the host's CPU per GiB from 1.15 to
/// 0.72 s. 64 KiB and not more on the sending side: a receiver sized at UCX's default
/// `RX_SEG_SIZE` (64 KiB; an older shim or agent) must still take every message (UCX
/// only asserts the length in debug builds). Receiving takes up to 256 KiB, so a peer
/// sending larger segments is served. The names are the tcp transport's own
/// (`ucp_config_modify` hands names it does not know to every transport's
/// configuration; only tcp has these), so the `UCX_TCP_` variables of the user's
/// environment are what override them.
const TCP_SEGMENT_DEFAULTS: [(&str, &str, &str); 2] =
    [("TX_SEG_SIZE", "64k", "UCX_TCP_TX_SEG_SIZE"), ("RX_SEG_SIZE", "256k", "UCX_TCP_RX_SEG_SIZE")];

/// The [`TCP_SEGMENT_DEFAULTS`] to apply to a context built from `config`: none unless
/// it may use tcp (its transports name `tcp`, or UCX chooses: the agent's `auto`, which
/// serves TCP hosts too), and none the environment (`is_set`) or `config.ucx_options`
/// sets already. Where UCX chooses and opens no tcp interface at all (`NET_DEVICES`
/// naming only RDMA devices), UCX warns once that the two were not used.
fn tcp_defaults(config: &FabricConfig, is_set: impl Fn(&str) -> bool) -> Vec<(&'static str, &'static str)> {
    let may_use_tcp = config.transports.as_deref().is_none_or(|t| t.split(',').any(|tl| tl.trim() == "tcp"));
    if !may_use_tcp {
        return Vec::new();
    }
    TCP_SEGMENT_DEFAULTS
        .iter()
        .filter(|(name, _, var)| {
            let in_options = config.ucx_options.iter().any(|(n, _)| n == name || n == &var["UCX_".len()..]);
            !in_options && !is_set(var)
        })
        .map(|&(name, value, _)| (name, value))
        .collect()
}

/// A `ucp_config_t` released on drop.
struct UcxConfig {
    ptr: *mut sys::ucp_config_t,
}

impl UcxConfig {
    fn read() -> Result<Self> {
        let mut ptr = ptr::null_mut();
        // SAFETY: null prefix and file mean "UCX_ environment variables only"; ptr is
        // writable.
        let status = unsafe { api().ucp_config_read(ptr::null(), ptr::null(), &mut ptr) };
        check("read UCX configuration (ucp_config_read)", status)?;
        Ok(UcxConfig { ptr })
    }

    fn modify(&self, name: &str, value: &str) -> Result<()> {
        let c_name = CString::new(name).map_err(|_| Error::Config(format!("{name:?}")))?;
        let c_value = CString::new(value).map_err(|_| Error::Config(format!("{value:?}")))?;
        // SAFETY: self.ptr is a live config; both strings are NUL-terminated and live
        // for the call; UCX copies the value.
        let status = unsafe { api().ucp_config_modify(self.ptr, c_name.as_ptr(), c_value.as_ptr()) };
        if status == sys::UCS_OK {
            Ok(())
        } else {
            let err = Error::ucx("ucp_config_modify", status);
            Err(Error::Config(format!("UCX rejected option {name}={value}: {err}")))
        }
    }
}

impl Drop for UcxConfig {
    fn drop(&mut self) {
        // SAFETY: ptr came from ucp_config_read and is released exactly once.
        unsafe { api().ucp_config_release(self.ptr) }
    }
}

/// Runs a UCX `*_print_info(…, FILE*)` function against an in-memory stream and
/// returns what it printed.
pub(crate) fn capture_stream(print: impl FnOnce(*mut sys::FILE)) -> String {
    let mut buf: *mut c_char = ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: buf and size are valid out-parameters that stay alive until after
    // fclose, which is when glibc last updates them.
    let stream = unsafe { libc::open_memstream(&mut buf, &mut size) };
    if stream.is_null() {
        return String::new();
    }
    // bindgen's FILE and libc's FILE are the same C type, declared twice.
    print(stream.cast::<sys::FILE>());
    // SAFETY: stream came from open_memstream and is closed exactly once.
    unsafe { libc::fclose(stream) };
    if buf.is_null() {
        return String::new();
    }
    // SAFETY: after fclose, buf points to size bytes written by the stream (plus a
    // NUL), allocated with malloc.
    let text = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), size) };
    let text = String::from_utf8_lossy(text).into_owned();
    // SAFETY: open_memstream's buffer is owned by the caller after fclose and is
    // released with free.
    unsafe { libc::free(buf.cast()) };
    text
}

/// The names in `ucp_context_print_info`'s `component N  :  name` lines.
fn components_of(info: &str) -> Vec<String> {
    info.lines()
        .filter_map(|l| l.trim_start_matches(['#', ' ']).strip_prefix("component "))
        .filter_map(|l| l.split_once(':'))
        .map(|(_, name)| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

#[cfg(test)]
mod component_tests {
    use super::{Context, FabricConfig};

    #[test]
    fn the_built_in_components_are_listed_by_name() {
        let context = Context::new(&FabricConfig::default()).expect("UCX context");
        let components = context.components();
        // Only the `component N  :  name` lines count, not the memory domains naming them.
        assert!(components.iter().all(|c| !c.contains(' ')), "{components:?}");
        for builtin in ["self", "tcp", "posix", "sysv"] {
            assert!(components.iter().any(|c| c == builtin), "{builtin} missing from {components:?}");
        }
    }
}

#[cfg(test)]
mod tcp_default_tests {
    use super::{FabricConfig, tcp_defaults};

    #[test]
    fn tcp_segments_are_set_only_for_tcp_and_only_where_nobody_set_them() {
        let unset = |_: &str| false;
        assert_eq!(tcp_defaults(&FabricConfig::tcp(), unset), [("TX_SEG_SIZE", "64k"), ("RX_SEG_SIZE", "256k")]);
        assert!(tcp_defaults(&FabricConfig::shm(), unset).is_empty());
        assert_eq!(tcp_defaults(&FabricConfig::default(), unset).len(), 2, "UCX chooses: tcp among them");
        assert!(tcp_defaults(&FabricConfig::with_transports("rc_x,self"), unset).is_empty());
        // The user's environment wins.
        let tx_set = |var: &str| var == "UCX_TCP_TX_SEG_SIZE";
        assert_eq!(tcp_defaults(&FabricConfig::tcp(), tx_set), [("RX_SEG_SIZE", "256k")]);
        // And so do the options the caller gave, under either name.
        let mut cfg = FabricConfig::with_transports("self, tcp");
        cfg.ucx_options.push(("TCP_RX_SEG_SIZE".into(), "1m".into()));
        assert_eq!(tcp_defaults(&cfg, unset), [("TX_SEG_SIZE", "64k")]);
        cfg.ucx_options.push(("TX_SEG_SIZE".into(), "32k".into()));
        assert!(tcp_defaults(&cfg, unset).is_empty());
    }
}
