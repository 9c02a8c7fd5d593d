//! The libfabric implementation of [`crate::Transport`]: [`Worker`], [`Region`],
//! [`Endpoint`], [`RemoteKey`], over our own `libfabric-sys` bindings.
//!
//! # Mapping onto libfabric
//!
//! | trait | libfabric |
//! |---|---|
//! | [`Worker`] (the transport) | `fi_getinfo` (RDM endpoint, `FI_RMA \| FI_MSG`), fabric, domain, one `FI_AV_TABLE` address vector, one completion queue with an `FI_WAIT_FD` wait object, one RDM endpoint |
//! | [`address`](crate::Transport::address) / [`connect`](crate::Transport::connect) | `fi_getname` / `fi_av_insert` (an [`Endpoint`] is a peer's `fi_addr_t` on the one RDM endpoint) |
//! | [`Region`] | anonymous `mmap` + `fi_mr_reg` (remote read/write); [`packed_key`](crate::transport::Region::packed_key) is `fi_mr_key` |
//! | `put` / `get` / `put_bytes` | `fi_writemsg` / `fi_readmsg`, one local and one remote iov, each with a completion queue entry |
//! | `flush` | progress the completion queue until every operation posted on the endpoint has its entry |
//! | doorbells | `fi_send` of at most [`crate::MAX_DOORBELL_BYTES`] into receive buffers the worker keeps posted ([`OfiConfig::recv_slots`]) |
//! | event fd, `arm`, `wake` | `fi_control(FI_GETWAIT)` on the completion queue, `fi_trywait`, `fi_cq_signal`; on shm (no fd wait object) an eventfd of ours and [`crate::Transport::wakes_on_receive`] `false` |
//! | [`map`](crate::transport::RemoteKey::map) | always `None`: libfabric has no portable way to map a peer's memory |
//!
//! # What a completion means, per provider (libfabric 1.17, measured)
//!
//! `flush` promises that the bytes are *at the target*. A libfabric completion entry
//! only promises that by default when the provider says so:
//!
//! * **`shm`** with `FI_MR_VIRT_ADDR` in the hints, no RMA ordering asked
//!   (`msg_order` 0) and one remote iov per write: writes and reads go through
//!   `process_vm_writev`/`process_vm_readv` (CMA) directly from the initiator, and the
//!   completion is written after that call returned, so the data has arrived. The
//!   target's CPU is not involved: a process stopped with `SIGSTOP` still receives a
//!   64 MiB put, and `flush` completes (`tests/ofi_two_process.rs`). Asking for
//!   `FI_DELIVERY_COMPLETE`, for RMA ordering, or setting `FI_SHM_DISABLE_CMA=1`
//!   moves the write onto the target's command queue and it waits for the target;
//!   hence [`Completion::Transmit`] for shm, and [`Completion::Delivery`] when
//!   `FI_SHM_DISABLE_CMA` is set. CMA needs ptrace permission on the peer (same
//!   user, Yama `ptrace_scope` 0 or 1 with a parent relation); shm falls back to the
//!   command queue without it.
//! * **`tcp;ofi_rxm`** needs the *target* to progress (its completion queue read by a
//!   [`crate::ProgressThread`], whose CPU time is reported), and its default local
//!   completion only means the send buffer is reusable, not that the bytes arrived.
//!   Writes are therefore posted with `FI_DELIVERY_COMPLETE` ([`Completion::Delivery`]),
//!   so "payload, flush, completion word" keeps its order; the ordering test checks
//!   that a host polling the completion word always finds the payload complete.
//! * **One-sided on shm only up to 1024 operations.** Each CMA write or read still
//!   takes a slot of the *target's* command queue (1024 per endpoint), returned only
//!   when the target progresses: a stopped host takes 1024 operations, then posts
//!   get `FI_EAGAIN` ([`Error::Again`] after `connect_timeout_ms`) until it runs
//!   again. The host therefore needs a (mostly sleeping) progress thread on shm too;
//!   `ofi_stopped_host_queue_limit_shm` measures the limit.
//! * **Set-up on shm is two-sided, once.** Before the first operation towards a
//!   peer, shm exchanges names through the peers' command queues: the operation
//!   returns `FI_EAGAIN` until the *other* side has progressed and answered. If the
//!   host speaks first (connects to the agent and sends a doorbell, which the agent
//!   receives), the pair is known on both sides and the agent's connect, key probe,
//!   puts and gets need nothing more from the host, even while it is stopped. The
//!   tests do exactly that; the shim must do the same at attach time.
//! * **Wake-ups on shm.** shm's completion queue accepts only `FI_WAIT_NONE` /
//!   `FI_WAIT_YIELD` (`fi_cq_open` answers `ENOSYS` for `FI_WAIT_FD`), so nothing
//!   makes an fd readable when a doorbell arrives. The worker then hands out an
//!   eventfd that only [`wake`](crate::Transport::wake) signals, and says so through
//!   `wakes_on_receive() == false`: a loop waiting for doorbells sleeps in short
//!   slices. `tcp;ofi_rxm` has a real fd (`FI_WAIT_FD`), also for counters.
//! * **Keys and addresses on tcp.** `tcp;ofi_rxm` returns `mr_mode` 0: keys are
//!   chosen by us (unique per domain) and remote addresses are offsets into the
//!   peer's registration. [`Endpoint`] converts the virtual addresses the trait
//!   speaks in; shm returns `FI_MR_VIRT_ADDR` and uses them as they are.
//! * **`verbs;ofi_rxm`** (the RDMA path on real NICs) is accepted by name with the
//!   same settings as tcp; it is not tested here (no RDMA NIC).
//!
//! # Thread model
//!
//! Handles are `Send + Sync`, methods take `&self`. The domain is opened with
//! `FI_THREAD_DOMAIN` and every libfabric call on it (endpoint, completion queue,
//! address vector, memory registration) is made under one mutex of ours: the
//! providers here are single-threaded inside anyway, and a lock we own cannot be
//! held by the provider across a callback. `flush` and retries take and release the
//! lock per round, so another thread may post or progress in between. Posted
//! operations are recorded in a table under a small integer token (the libfabric
//! `context`), holding the local region or copied bytes until their completion entry
//! is read; what they held is released after the lock is dropped (closing a memory
//! registration takes the lock again).
//!
//! # Limits
//!
//! Operations in flight per worker ([`OfiConfig::max_in_flight_ops`], sizing the
//! completion queue with [`OfiConfig::recv_slots`]), doorbells buffered
//! ([`OfiConfig::doorbell_queue_len`]), doorbell size ([`crate::MAX_DOORBELL_BYTES`]).

mod domain;
mod endpoint;
mod region;
mod shared;
mod worker;

pub use endpoint::{Endpoint, RemoteKey};
pub use region::Region;
pub use worker::Worker;

/// The libfabric this process has loaded, if any: its file and `(major, minor)`
/// version. libfabric is loaded when the first [`Worker`] opens (or by another
/// component before, such as the DAOS client, whose build then serves us too).
pub fn loaded_library() -> Option<(String, (u32, u32))> {
    sys::loaded()
}

use libfabric_sys as sys;

use crate::error::{Error, Result};

/// `tcp;ofi_rxm`: reliable datagrams over TCP connections (rxm over the tcp provider).
pub const TCP_PROVIDER: &str = "tcp;ofi_rxm";
/// `shm`: shared memory between processes of one host (CMA for RMA).
pub const SHM_PROVIDER: &str = "shm";
/// `verbs;ofi_rxm`: RDMA NICs (untested here).
pub const VERBS_PROVIDER: &str = "verbs;ofi_rxm";

/// What a completion queue entry of a write must mean before `flush` may return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Completion {
    /// The provider's default (`FI_TRANSMIT_COMPLETE` semantics); only right where
    /// the provider writes the target memory before completing (shm over CMA).
    Transmit,
    /// `FI_DELIVERY_COMPLETE` on every write: the entry appears once the data is
    /// visible at the target.
    Delivery,
}

/// How to open a libfabric [`Worker`]. Consumers map their own config onto this.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OfiConfig {
    /// Provider name as `fi_info -l` / `FI_PROVIDER` spell it: [`SHM_PROVIDER`],
    /// [`TCP_PROVIDER`] or [`VERBS_PROVIDER`].
    pub provider: String,
    /// Domain (interface) name to restrict to, e.g. `"lo"` for tcp; `None` takes
    /// libfabric's first match.
    pub domain: Option<String>,
    /// Completion semantics of writes (see the module docs); set by the presets.
    pub completion: Completion,
    /// Doorbells buffered between `progress` and `take_doorbells`.
    pub doorbell_queue_len: usize,
    /// Receive buffers kept posted for doorbells (each [`crate::MAX_DOORBELL_BYTES`]).
    pub recv_slots: usize,
    /// Operations posted on the worker (all endpoints) and not yet completed before
    /// `put`/`get` return [`Error::Busy`]. Sizes the completion queue.
    pub max_in_flight_ops: usize,
    /// How long posting retries while the provider answers `FI_EAGAIN` (then
    /// [`Error::Again`]), and how long
    /// [`unpack_key`](crate::transport::Endpoint::unpack_key) waits for its probe (a TCP peer must progress).
    pub connect_timeout_ms: u64,
}

impl OfiConfig {
    /// A configuration for `provider` with the completion semantics it needs.
    pub fn provider(provider: &str) -> OfiConfig {
        let completion = if provider == SHM_PROVIDER && std::env::var_os("FI_SHM_DISABLE_CMA").is_none() {
            Completion::Transmit
        } else {
            Completion::Delivery
        };
        OfiConfig {
            provider: provider.to_owned(),
            domain: None,
            completion,
            doorbell_queue_len: 4096,
            recv_slots: 256,
            max_in_flight_ops: 4096,
            connect_timeout_ms: 10_000,
        }
    }

    /// The shm provider: one-sided, a stopped peer still receives puts.
    pub fn shm() -> OfiConfig {
        Self::provider(SHM_PROVIDER)
    }

    /// `tcp;ofi_rxm`, restricted to the loopback interface when `domain` is `"lo"`.
    pub fn tcp() -> OfiConfig {
        Self::provider(TCP_PROVIDER)
    }

    /// `verbs;ofi_rxm` (RDMA NICs; untested here).
    pub fn verbs() -> OfiConfig {
        Self::provider(VERBS_PROVIDER)
    }

    /// A preset by provider name; `None` for names this crate does not support.
    pub fn preset(name: &str) -> Option<OfiConfig> {
        Self::PROVIDERS.contains(&name).then(|| Self::provider(name))
    }

    /// Provider names accepted by [`OfiConfig::preset`].
    pub const PROVIDERS: &'static [&'static str] = &[SHM_PROVIDER, TCP_PROVIDER, VERBS_PROVIDER];

    /// Checks what libfabric would otherwise reject obscurely.
    pub fn validate(&self) -> Result<()> {
        if self.provider.is_empty() || self.provider.contains('\0') {
            return Err(Error::Config(format!("libfabric provider name {:?} is empty or holds a NUL", self.provider)));
        }
        if self.domain.as_deref().is_some_and(|d| d.is_empty() || d.contains('\0')) {
            return Err(Error::Config(format!("libfabric domain name {:?} is empty or holds a NUL", self.domain)));
        }
        if self.doorbell_queue_len == 0 || self.recv_slots == 0 || self.max_in_flight_ops == 0 {
            return Err(Error::Config(
                "doorbell_queue_len, recv_slots and max_in_flight_ops must be at least 1".into(),
            ));
        }
        if self.recv_slots > 1 << 20 || self.max_in_flight_ops > 1 << 20 {
            return Err(Error::Config("recv_slots and max_in_flight_ops are limited to 2^20".into()));
        }
        Ok(())
    }
}

/// Builds [`Error::Ofi`] from a libfabric return value (a negative error number).
pub(crate) fn ofi_error(op: &'static str, ret: i64) -> Error {
    let code = i32::try_from(ret.unsigned_abs()).unwrap_or(i32::MAX);
    // Errors come from calls into a loaded libfabric; were it not, the errno text.
    let reason =
        sys::api().map_or_else(|_| std::io::Error::from_raw_os_error(code).to_string(), |api| api.strerror(code));
    Error::Ofi { op, code, reason }
}

/// `Ok(())` for 0, [`Error::Ofi`] for a negative return.
pub(crate) fn check(op: &'static str, ret: i32) -> Result<()> {
    if ret >= 0 { Ok(()) } else { Err(ofi_error(op, i64::from(ret))) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_completion_modes() {
        for name in OfiConfig::PROVIDERS {
            OfiConfig::preset(name).unwrap().validate().unwrap();
        }
        assert!(OfiConfig::preset("sockets").is_none());
        assert_eq!(OfiConfig::tcp().completion, Completion::Delivery);
        assert_eq!(OfiConfig::verbs().completion, Completion::Delivery);
        let bad = OfiConfig { recv_slots: 0, ..OfiConfig::shm() };
        assert!(matches!(bad.validate(), Err(Error::Config(_))));
    }

    #[test]
    fn a_tcp_domain_that_is_not_there_is_refused_naming_those_that_are() {
        let cfg = OfiConfig { domain: Some("dpuio-nosuch0".into()), ..OfiConfig::tcp() };
        match Worker::open(&cfg) {
            Err(Error::NoSuchDomain { domain, available, .. }) => {
                assert_eq!(domain, "dpuio-nosuch0");
                assert!(available.iter().any(|d| d == "lo"), "{available:?}");
            }
            Err(e @ Error::ProviderUnavailable { .. }) => eprintln!("skipped: {e}"),
            Err(e) => panic!("expected NoSuchDomain, got {e}"),
            Ok(_) => panic!("opened a domain that does not exist"),
        }
    }

    #[test]
    fn errors_carry_fi_strerror_text() {
        let err = ofi_error("post write (fi_writemsg)", -(sys::FI_EAGAIN as i64));
        let text = err.to_string();
        assert!(text.starts_with("post write (fi_writemsg): "), "{text}");
        assert!(text.contains("libfabric error 11"), "{text}");
    }
}
