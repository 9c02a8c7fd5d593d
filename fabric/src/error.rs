//! The one error type of the data plane.

use std::ffi::CStr;

/// Result of every fallible call in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in the data plane, and while doing what.
///
/// Variants carry the operation that failed (`op`, a short phrase naming our action
/// and the transport call, e.g. `"allocate region (ucp_mem_map)"`) so a log line reads
/// without the code at hand.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A UCX call returned an error status. `status` is the `ucs_status_t` value and
    /// `reason` the text of `ucs_status_string` for it.
    #[error("{op}: {reason} (UCX status {status})")]
    Ucx {
        /// Our action and the UCX function that failed.
        op: &'static str,
        /// The raw `ucs_status_t`.
        status: i32,
        /// `ucs_status_string(status)`.
        reason: String,
    },

    /// A libfabric call failed. `code` is the positive `FI_E*` / errno value and
    /// `reason` the text of `fi_strerror` for it.
    #[error("{op}: {reason} (libfabric error {code})")]
    Ofi {
        /// Our action and the libfabric function that failed.
        op: &'static str,
        /// The positive error number (libfabric returns it negated).
        code: i32,
        /// `fi_strerror(code)`.
        reason: String,
    },

    /// libfabric itself cannot be loaded (not installed, or older than the headers this
    /// crate was built with): no libfabric provider is available in this process.
    #[error("{0}")]
    Library(#[from] libfabric_sys::LoadError),

    /// UCX itself cannot be loaded (not installed, or older than the headers this crate
    /// was built with): no UCX transport is available in this process.
    #[error("{0}")]
    UcxLibrary(#[from] ucx_sys::LoadError),

    /// libfabric has no provider of this name on this machine (`fi_getinfo` found
    /// nothing matching; `fi_info -l` lists what is there).
    #[error("libfabric provider {provider:?} is not available here (see `fi_info -l`)")]
    ProviderUnavailable {
        /// The provider name asked for.
        provider: String,
    },

    /// The provider refused to take an operation (`FI_EAGAIN`) for `waited_ms` while
    /// we progressed: nothing was posted. On libfabric shm this means the peer has
    /// not progressed for 1024 operations (its command queue is full); over rxm, a
    /// connection that is not up yet. Retry once the peer runs.
    #[error("{op}: the provider answered FI_EAGAIN for {waited_ms} ms; nothing was posted (is the peer progressing?)")]
    Again {
        /// Our action and the libfabric function.
        op: &'static str,
        /// How long we retried.
        waited_ms: u64,
    },

    /// An operation that needs the peer or the network did not finish in time. Over
    /// TCP this usually means the peer is not progressing its worker (stopped, or no
    /// progress thread); the operation stays posted and may still complete later.
    #[error("{op} did not complete within {timeout_ms} ms")]
    Timeout {
        /// What was being waited for.
        op: &'static str,
        /// The timeout that expired.
        timeout_ms: u64,
    },

    /// A `FabricConfig` value UCX cannot take (empty, or holding a NUL byte).
    #[error("invalid fabric config: {0}")]
    Config(String),

    /// A byte range reaches outside the region, remote key or mapping it addresses.
    #[error("bytes {offset}..{offset}+{len} lie outside the {what} ({bound} bytes)")]
    OutOfRange {
        /// Which bound was violated, e.g. "local region", "remote key range".
        what: &'static str,
        /// Start of the range (an offset, or a remote address for remote keys).
        offset: u64,
        /// Length of the range.
        len: u64,
        /// The size (or end address) it had to fit in.
        bound: u64,
    },

    /// A local region used in `put`/`get` was allocated by a different transport
    /// context than the endpoint's worker, so it has no memory handle there.
    #[error("the local region belongs to another transport context")]
    ForeignRegion,

    /// A handle of one provider was used with another's (UCX region, libfabric endpoint).
    #[error("{what} belongs to another provider than the endpoint (UCX and libfabric handles do not mix)")]
    MixedProviders { what: &'static str },

    /// A doorbell longer than [`crate::MAX_DOORBELL_BYTES`].
    #[error("doorbell of {len} bytes exceeds the limit of {max} bytes")]
    DoorbellTooLong {
        /// Bytes offered.
        len: usize,
        /// [`crate::MAX_DOORBELL_BYTES`].
        max: usize,
    },

    /// The endpoint already has `max` operations posted and not yet completed
    /// (`FabricConfig::max_in_flight_ops`). Flush, then retry.
    #[error("{in_flight} operations in flight on the endpoint (limit {max}); flush first")]
    Busy {
        /// Operations currently posted.
        in_flight: usize,
        /// The configured limit.
        max: usize,
    },

    /// The UCX library was built without thread support (`--enable-mt`), which the
    /// thread model of this crate requires (see the crate docs).
    #[error("UCX granted thread mode {granted} instead of UCS_THREAD_MODE_MULTI; rebuild UCX with --enable-mt")]
    ThreadMode {
        /// The `ucs_thread_mode_t` UCX granted.
        granted: u32,
    },

    /// A remote key claims a range that is not backed by one shared mapping in this
    /// process although UCX mapped it directly: the peer declared a region larger
    /// than the memory it registered. Accepting it would let writes through the
    /// mapping (or shared-memory puts) land outside the peer's segment.
    #[error("remote range {addr:#x}+{len} is not covered by the shared mapping UCX made for its key")]
    RemoteRangeUnmapped {
        /// The remote address declared by the peer.
        addr: u64,
        /// The length declared by the peer.
        len: u64,
    },

    /// A network interface named in the configuration (UCX `NET_DEVICES`, the
    /// libfabric tcp domain) does not exist in this process's network namespace.
    /// Checked up front: UCX only warns about an unknown device and is then left with
    /// no transport to the peer, which fails much later without saying why.
    #[error("network interface {name:?} does not exist here; this network namespace has: {}", available.join(", "))]
    NoSuchInterface {
        /// The name asked for.
        name: String,
        /// The interfaces that do exist (`ip link`).
        available: Vec<String>,
    },

    /// The libfabric provider has no domain of the name asked for ([`crate::ofi::OfiConfig::domain`]).
    /// A tcp domain is a network interface that has an address and is up.
    #[error("libfabric provider {provider:?} has no domain {domain:?} here; its domains are: {}", available.join(", "))]
    NoSuchDomain {
        /// The provider name.
        provider: String,
        /// The domain asked for.
        domain: String,
        /// The domains `fi_getinfo` offered (`fi_info -p PROVIDER` lists them too).
        available: Vec<String>,
    },

    /// An operating-system call failed (poll on the event fd, thread spawn, ...).
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Builds [`Error::Ucx`] from a `ucs_status_t`, looking up UCX's text for it.
    pub(crate) fn ucx(op: &'static str, status: ucx_sys::ucs_status_t) -> Self {
        let reason = match ucx_sys::api() {
            // SAFETY: ucs_status_string accepts any status value and returns a pointer
            // to a static NUL-terminated string (it never returns NULL; unknown codes
            // map to a static "Unknown error" text).
            Ok(ucx) => unsafe { CStr::from_ptr(ucx.ucs_status_string(status)) }.to_string_lossy().into_owned(),
            Err(e) => e.to_string(),
        };
        Error::Ucx { op, status: i32::from(status), reason }
    }

    /// True for [`Error::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }
}

/// Turns a `ucs_status_t` into `Ok(())` or [`Error::Ucx`].
pub(crate) fn check(op: &'static str, status: ucx_sys::ucs_status_t) -> Result<()> {
    if status == ucx_sys::UCS_OK { Ok(()) } else { Err(Error::ucx(op, status)) }
}
