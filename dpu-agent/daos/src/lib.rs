//! The DAOS backend of `dpu-agent`: the agent runs the DAOS client (libdfs).
//!
//! - `sys`: the DAOS C API as we use it, declared by hand from the DAOS 2.x headers
//!   with compile-time layout checks, and the run-time loader (`libloading`): libgurt,
//!   libdaos and libdfs are opened when a DAOS backend is configured, so a host without
//!   DAOS builds and runs dpuio with the local backend. Search order:
//!   `$DPUIO_DAOS_PREFIX/lib64`, `$DPUIO_DAOS_PREFIX/lib`, `/usr/lib/daos/lib64` (the
//!   `daos-client` package), `/opt/daos/lib64`, then the dynamic loader's default path.
//! - `dfs`: safe owners of DAOS handles (runtime, pool, mounted container, object) whose
//!   drop order is DAOS's teardown order; `daos_init` once per process, `daos_fini` after
//!   the last handle; and the event queue of one I/O thread, which keeps many
//!   `dfs_read`/`dfs_write` calls in flight for the duration of one batch.
//! - [`error`]: DER codes (`daos_*`, negative) and errno (`dfs_*`, positive), kept with
//!   the call and the DAOS name of the error.
//! - `retry`: which DAOS failures are transient (an engine gone, a pool map moving) and
//!   how long a call is made again before the client hears of it, with counts for the
//!   agent's metrics.
//! - `deadline`: a deadline on each blocking call, since with every engine gone DAOS
//!   answers nothing (it retries inside libdaos without end): a call past it is answered
//!   unavailable and left to finish on a thread of its own.
//! - `anchor`: readdir anchors handed to clients, authenticated DFS positions.
//! - [`DaosBackend`]: the `dpuio_backend` traits over all of the above.
//!
//! This is one of the three rooms where `unsafe` lives (with `fabric/` and the shim's C
//! ABI): only `sys` and `dfs` hold it; `anchor` and `backend` forbid it.
//!
//! Deliberately not here yet: per-tenant worker processes under the tenant's uid (DAOS
//! credentials follow the agent's uid), and a bound on data-plane reads and writes DAOS
//! never answers (they write memory the host lent, so they wait for DAOS; see
//! `deadline`).

mod anchor;
mod backend;
mod deadline;
mod dfs;
mod dir_cache;
pub mod error;
mod retry;
mod sys;

// Public for the fuzz targets (fuzz/): a token is bytes from an untrusted host.
pub use anchor::AnchorKey;
pub use backend::{DEFAULT_CHUNK_BYTES, DEFAULT_DIR_CACHE, DaosBackend, DaosContainer, DaosOptions, OpenError};
pub use deadline::{MAX_STUCK, exit_leaving_calls_in_daos, stuck_calls};
pub use dfs::{DEFAULT_AGENT_SOCKET_DIR, SetupError, default_agent_socket_dir, load_libraries, prefix_from_env};
pub use retry::{RetryStats, retry_stats};
pub use sys::{DAOS_ANCHOR_BYTES, daos_anchor_t};

/// For tests: the DAOS name of a DER code (positive), as the loaded libgurt spells it.
pub fn der_name(der: i32) -> Result<String, SetupError> {
    dfs::der_name(der)
}
