//! The dpuio data plane: registered regions, remote keys, endpoints, one-sided
//! put/get/flush and doorbells, behind one [`Transport`] trait, with UCX
//! ([`ucx`], over our own `ucx-sys` bindings) as the first implementation and
//! libfabric ([`ofi`], over our own `libfabric-sys`) as the second: providers `shm`,
//! `tcp;ofi_rxm` and `verbs;ofi_rxm`. What each libfabric provider guarantees, and
//! where it differs from UCX (no direct mapping of peer memory, no event fd on shm,
//! a first message from the host on shm), is in the [`ofi`] module docs.
//!
//! With the `testing` feature (for consumers' tests only), the `testing` module adds a loopback
//! transport: a test double in which both peers are workers of one process, so the
//! agent's ring engine runs in unit tests without UCX or libfabric.
//!
//! All `unsafe` of the data plane lives in this crate. It deliberately does *not*
//! know the wire format of rings, entries or doorbells (the `proto` crate), sessions,
//! rights or validation (the agent's engine), or any async runtime: it moves bytes,
//! says when they have arrived, and hands out a file descriptor to sleep on.
//!
//! # Who uses what
//!
//! Each provider implements the traits of [`transport`] once, on its own types; the
//! calls below are those traits' methods.
//!
//! * **Host shim**: [`ucx::Worker::open`] with a [`FabricConfig`] preset;
//!   [`Transport::alloc_region`] for each region (its [`SharedMemory::addr`], `len`
//!   and [`transport::Region::packed_key`] go into `RegisterRegion`); reads its rings
//!   with [`SharedMemory::load_u64_acquire`] and payload with
//!   [`SharedMemory::as_slice`]; [`Transport::address`] goes into `Attach`;
//!   [`Transport::connect`] to the agent's address and
//!   [`transport::Endpoint::send_doorbell`]. Over TCP it runs a [`ProgressThread`] and
//!   reports its [`ProgressReport`].
//! * **Agent**: the same worker setup; per session [`Transport::connect`] to the
//!   host's address and [`transport::Endpoint::unpack_key`] per region (with the
//!   address and length the host declared); then either [`transport::RemoteKey::map`]
//!   (shared memory: read files straight into host memory through [`MappedRemote`])
//!   or `put`/`get` from its own staging regions, [`transport::Endpoint::flush`], then
//!   the completion entry. Doorbells arrive during [`Transport::progress`] and are
//!   drained with [`Transport::take_doorbells`]; sleep on [`Transport::event_fd`]
//!   after [`Transport::arm`] returns `true` (tokio: `AsyncFd`).
//!
//! ```no_run
//! use std::time::Duration;
//! use fabric::transport::Endpoint as _;
//! use fabric::{FabricConfig, Transport, ucx::Worker};
//!
//! # fn host_says() -> (Vec<u8>, Vec<u8>, u64, u64) { unimplemented!() }
//! # fn main() -> fabric::Result<()> {
//! let agent = Worker::open(&FabricConfig::shm())?;
//! let (host_address, packed_key, region_addr, region_len) = host_says();
//! let ep = agent.connect(&host_address)?;
//! let key = ep.unpack_key(&packed_key, region_addr, region_len)?;
//!
//! // Payload, flush, then the completion: the host never sees a completion
//! // before its payload.
//! let mut staging = agent.alloc_region(1 << 20)?;
//! staging.write_at(0, &vec![7; 1 << 20]);
//! ep.put(&staging, 0, 1 << 20, region_addr + 4096, &key)?;
//! ep.flush(Duration::from_secs(5))?;
//! ep.put_bytes(&1u64.to_le_bytes(), region_addr, &key)?;
//! ep.flush(Duration::from_secs(5))?;
//!
//! // Event loop: progress, drain doorbells, sleep when armed.
//! let mut doorbells = Vec::new();
//! loop {
//!     while agent.progress() > 0 {}
//!     if agent.take_doorbells(&mut doorbells) > 0 { /* scan every ring */ }
//!     for d in doorbells.drain(..) { let _ = d.as_bytes(); /* validate, schedule */ }
//!     agent.wait(Duration::from_millis(100))?; // arm + poll on the event fd
//! }
//! # }
//! ```
//!
//! # Thread model
//!
//! Every handle is `Send + Sync` and every method takes `&self` (except the byte
//! accessors that need `&mut`); no caller-side `Mutex` is needed.
//!
//! * The UCX context is created with `mt_workers_shared = 1`: regions can be
//!   allocated, packed and dropped from any thread.
//! * Workers are created with `UCS_THREAD_MODE_MULTI` (checked at creation;
//!   [`Error::ThreadMode`] if UCX was built without `--enable-mt`): UCX serialises
//!   calls on a worker with its own lock, so one thread may sleep on the event fd and
//!   progress while others post puts, flush or connect. `flush` progresses the worker
//!   itself, so it works whether or not another thread is progressing. The price is
//!   an uncontended lock per call, small next to the operations; `SERIALIZED` would
//!   save it but push a lock into every caller, held across blocking flushes.
//! * UCX runs completion and doorbell callbacks inside `progress`, on whichever
//!   thread called it. They only touch this crate's own queues (a bounded doorbell
//!   queue, a list of finished operations); anything that could re-enter UCX (unmap a
//!   region, close an endpoint) is released after `ucp_worker_progress` returns.
//! * Lifetimes are reference counted: an endpoint keeps its worker, a remote key its
//!   endpoint, a [`MappedRemote`] its key, a posted operation its local region,
//!   remote key and copied bytes until UCX reports it complete. Dropping any handle
//!   early is safe; the UCX object goes when its last user does. A [`ucx::Region`]
//!   (not `Clone`) unmaps on drop; the *peer* must stop using it first, which is the
//!   control plane's job (`DeregisterRegion`).
//!
//! # Which transports are one-sided (UCX 1.13.1, measured)
//!
//! `tests/two_process.rs` stops the host process with `SIGSTOP`, then has the agent
//! connect, unpack the key, put 64 MiB, flush, put a completion word and flush, all
//! while the host stays in state `T` with its CPU time (`/proc/<pid>/stat`) unchanged;
//! after `SIGCONT` the host finds payload and completion in its region. The
//! `explore_stop_matrix` test (ignored by default) repeats this per `UCX_TLS`:
//!
//! | `UCX_TLS` | put + flush into a stopped host | lanes UCX chose |
//! |---|---|---|
//! | `posix,self` | yes (16 MiB in ~10 ms) | posix (am) |
//! | `posix,self` + host env `UCX_POSIX_USE_PROC_LINK=n` | yes | posix (am) |
//! | `sysv,self` | yes | sysv (am) |
//! | `sysv,posix,self` (the `shm` preset) | yes (16 MiB ~20 ms, 64 MiB ~85 ms) | sysv (am), posix |
//! | `posix,cma,self`, `sysv,cma,self`, `posix,sysv,cma,self`, `sm,self` | yes | sysv or posix (am), cma (rendezvous only) |
//! | `cma,self` | no endpoint: "no active messages transport" (cma has no AM) | — |
//! | `cma,tcp,self` | no: flush times out, data lands after `SIGCONT` | tcp (am), cma (rendezvous) |
//! | `tcp,self` (the `tcp` preset) | no: flush times out, data lands after `SIGCONT` | tcp/lo and tcp/eth0 |
//!
//! Why: `ucp_mem_map(ALLOCATE)` takes memory from the first memory domain in
//! `UCX_ALLOC_PRIO` (default `md:sysv,md:posix,huge,thp,md:*,mmap,heap`), so with
//! sysv or posix enabled a region *is* a shared segment (SysV shm, or a `/dev/shm`
//! file). Unpacking its key attaches the segment in the agent, and a put is a
//! `memcpy` into that mapping (mm `put_short`/`put_bcopy`), a get the reverse: the
//! host's CPU is not involved, and flush completes at once. With cma enabled too,
//! `strace` shows no `process_vm_writev` during a 64 MiB put (only cma's 8-byte
//! self-test at start-up): cma is only used for rendezvous (large
//! active messages), never for `ucp_put`, so memory that is not a shared segment
//! (the shim's own `malloc`, or any memory over TCP) gets puts that need the
//! target's progress. Hence the `shm` preset is `sysv,posix,self` and regions are
//! always allocated through [`ucx::Context::alloc_region`].
//!
//! Deployment notes following from that: sysv needs agent and host in one IPC
//! namespace; posix with `UCX_POSIX_USE_PROC_LINK=y` (the default) unlinks the
//! `/dev/shm` file at once and the peer opens `/proc/<pid>/fd/<fd>`, so it needs one
//! PID namespace and ptrace-read permission on the host; with `=n` the file keeps
//! its name (and leaks if a process dies). If SysV allocation fails (small
//! `kernel.shmmax`), UCX falls back to posix silently.
//!
//! Over TCP UCX carries a put as a message the target's worker writes into memory,
//! so the host needs a [`ProgressThread`]; in the tests that thread used about 70 ms
//! of CPU for an 8 MiB put plus get. On RDMA hardware, leave
//! [`FabricConfig::transports`] `None` and UCX picks rc/dc, which is one-sided again
//! (not testable here).
//!
//! # Other UCX 1.13 facts this crate is built around
//!
//! * **TCP crash**: a bulk put posted right after connecting, to a target that then
//!   stalls (here: `SIGSTOP`), crashed the *target* in `uct_tcp_iface_progress`
//!   (SIGSEGV at `0xfffffffffffffff8`) in 4 of 6 runs. The initiator's endpoint flush
//!   completes before the target has finished its side of the handshake; a round trip
//!   through the target avoids it (0 of 30 runs). Hence UCX's [`Transport::connect`]
//!   flushes the new endpoint and its [`transport::Endpoint::unpack_key`] probes each
//!   key with a one-byte get and a flush (which also rejects a bad key early).
//! * `ucp_rkey_ptr` works where the memory domain says "rkey_ptr is supported"
//!   (`ucx_info -d`: sysv, posix) and returns `UCS_ERR_UNREACHABLE` otherwise (tcp),
//!   which UCX's [`transport::RemoteKey::map`] turns into `None`. It takes no length,
//!   and mm puts do no bounds checks: a host declaring a region longer than its segment
//!   would steer the agent's writes past the mapping. UCX's
//!   [`transport::Endpoint::unpack_key`] therefore checks the declared range against
//!   `/proc/self/maps` whenever the key maps, and every put/get/map is checked against
//!   the declared range. Shared memory
//!   gives no isolation between processes of one user in any case; production relies
//!   on RDMA keys, which the NIC enforces.
//! * Transport-level options with their transport's prefix (`POSIX_USE_PROC_LINK`,
//!   `TCP_TX_SEG_SIZE`, `SYSV_*`) are *not* applied through `ucp_config_modify`: UCX
//!   accepts the call and later warns "invalid configuration". Set them as `UCX_*`
//!   environment variables of the process (the side that allocates, for the posix/sysv
//!   ones). Without the prefix (`TX_SEG_SIZE`) UCX hands the name to every transport's
//!   configuration and it applies where one has it; that is how [`ucx::Context::new`]
//!   sets the tcp transport's segment sizes (64 KiB sent, 256 KiB received, unless the
//!   environment's `UCX_TCP_TX_SEG_SIZE` / `UCX_TCP_RX_SEG_SIZE` say otherwise; see
//!   `docs/benchmarks.md`, TCP). Context options (`TLS`, `NET_DEVICES`, ...) work
//!   through [`FabricConfig::ucx_options`].
//! * Transport names: `posix`, `sysv`, `cma`, `self`, `tcp` here, plus the alias `sm`
//!   (all shared-memory transports); `rc`, `dc`, `ud` (and `_x`/`_verbs` variants) on
//!   RDMA NICs. Over TCP UCX uses every interface, so two processes on one host
//!   spread RMA across `lo` and `eth0`; restrict with `NET_DEVICES`.
//! * `ucp_request_free` on a request with a callback suppresses the callback; the
//!   completion callback therefore frees the request itself. There is no
//!   `UCP_AM_SEND_FLAG_COPY_HEADER` in 1.13: doorbell bytes are kept alive until the
//!   send completes. `UCP_EP_CLOSE_FLAG_FORCE` needs error-handling mode `PEER` on
//!   both sides, which the mm transports do not support, so endpoints close in flush
//!   mode with a timeout (`FabricConfig::close_timeout_ms`).
//! * A 64 MiB put into a fresh region takes ~85 ms (debug build; page faults on
//!   first touch of the mapping), ~9 ms the second time.

pub mod any;
pub mod config;
mod doorbell;
mod error;
mod memory;
pub mod ofi;
mod progress;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transport;
pub mod ucx;

pub use config::{FabricConfig, SHM_TRANSPORTS, TCP_TRANSPORTS};
pub use doorbell::{Doorbell, MAX_DOORBELL_BYTES};
pub use error::{Error, Result};
pub use host_bytes::{HostBytes, HostBytesMut};
pub use memory::{MappedRemote, SharedMapping, SharedMemory};
pub use progress::{ProgressReport, ProgressThread};
pub use transport::{Transport, wait_any, wait_any_or};

/// Signals for which libraries this crate loads install handlers when they are
/// loaded: Debian's libfabric pulls in the PSM libraries, whose `libinfinipath`
/// catches these at load time, prints a backtrace and calls `exit(1)`. A training job
/// stopped with SIGTERM then exits 1 at once, and a crash exits 1 without a core dump.
const LOAD_TIME_HANDLED: [libc::c_int; 6] =
    [libc::SIGILL, libc::SIGABRT, libc::SIGBUS, libc::SIGSEGV, libc::SIGTERM, libc::SIGINT];

/// The libraries whose load-time signal handlers [`drop_load_time_signal_handlers`]
/// removes.
const LOAD_TIME_HANDLER_LIBRARIES: [&str; 2] = ["libinfinipath", "libpsm"];

/// Puts back the default action of every signal whose handler is code of a library
/// known to install one when it is loaded ([`LOAD_TIME_HANDLER_LIBRARIES`]). Handlers
/// of the program and of anything else (Python's, tokio's, a crash reporter's) are left
/// alone, so any process that links this crate can call it at any time: the agent does
/// before it installs its own handlers (tokio chains to a handler it finds, which made
/// SIGTERM exit 1 instead of stopping gracefully), and the shim when it connects (a
/// `DataLoader` worker stopped with SIGTERM, or a host program that crashes, then ends
/// as the signal says). Returns the signals it reset.
pub fn drop_load_time_signal_handlers() -> Vec<libc::c_int> {
    let mut reset = Vec::new();
    for sig in LOAD_TIME_HANDLED {
        // SAFETY: sigaction with a null new action only reads the current one into
        // `old`, a properly sized, zeroed struct.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `sig` is a valid standard signal number.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        let handler = old.sa_sigaction;
        if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
            continue;
        }
        if !handler_lives_in(handler, &LOAD_TIME_HANDLER_LIBRARIES) {
            continue;
        }
        // SAFETY: setting a standard signal to SIG_DFL installs no code of ours and is
        // async-signal-safe.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
        reset.push(sig);
    }
    reset
}

/// Runs `load` (which loads libfabric, and with it the PSM libraries) and puts back
/// every handler of [`LOAD_TIME_HANDLED`] that one of [`LOAD_TIME_HANDLER_LIBRARIES`]
/// replaced meanwhile. libfabric is loaded when the first libfabric transport opens,
/// long after the program installed its own handlers (Python's SIGINT among them): what
/// the program had, it keeps.
pub(crate) fn keeping_signal_handlers<T>(load: impl FnOnce() -> T) -> T {
    // SAFETY: sigaction with a null new action only reads the current one into `old`,
    // a properly sized, zeroed struct; the signals are valid standard signal numbers.
    let before: Vec<libc::sigaction> = LOAD_TIME_HANDLED
        .iter()
        .map(|&sig| {
            // SAFETY: as above.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
            old
        })
        .collect();
    let loaded = load();
    for (sig, old) in LOAD_TIME_HANDLED.into_iter().zip(before) {
        // SAFETY: as above.
        let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut now) } != 0 {
            continue;
        }
        if now.sa_sigaction != old.sa_sigaction && handler_lives_in(now.sa_sigaction, &LOAD_TIME_HANDLER_LIBRARIES) {
            // SAFETY: reinstalls the action this process had a moment ago, as read.
            unsafe { libc::sigaction(sig, &old, std::ptr::null_mut()) };
        }
    }
    loaded
}

/// Puts SIGTERM and SIGINT back to their default action whoever installed the handler:
/// for a program about to install its own. Besides the load-time handlers above,
/// libfabric's shm provider installs its own when an endpoint opens (it removes its
/// shared-memory files, then calls the handler it found, which may be
/// `libinfinipath`'s `exit(1)`); tokio chains to whatever handler it finds, so a
/// graceful stop on SIGTERM needs the default there first.
pub fn restore_default_termination_signals() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: setting a standard signal to SIG_DFL installs no code of ours and is
        // async-signal-safe; called before the program installs its own handlers.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// Whether the code at `handler` belongs to a shared object whose file name contains
/// one of `libraries`.
fn handler_lives_in(handler: libc::sighandler_t, libraries: &[&str]) -> bool {
    // SAFETY: dladdr only looks the address up in the loaded objects' tables and fills
    // `info`; it dereferences nothing at `handler`.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::dladdr(handler as *const libc::c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dladdr succeeded, so dli_fname points at the object's NUL-terminated
    // path, which lives as long as the object stays loaded (libraries with handlers
    // installed are not unloaded while we look).
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    let file = name.rsplit('/').next().unwrap_or(&name);
    libraries.iter().any(|l| file.starts_with(l))
}
