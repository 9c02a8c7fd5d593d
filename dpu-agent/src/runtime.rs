//! How the agent's code waits, for every room to share: locks held briefly and never
//! poisoned ([`lock`]), and blocking backend calls kept off the async runtime
//! ([`blocking`]).
//!
//! It sits below every room that takes a lock or calls the backend from a gRPC handler
//! and imports nothing of the crate but its error type.

use std::sync::{Mutex, MutexGuard};

use crate::error::{Error, Result};

/// Lock `m`, also after a panic elsewhere poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind (maps of
    // Arcs); going on with it is safer than taking the whole agent down.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Run a blocking backend call off the async runtime.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    tokio::task::spawn_blocking(f).await.map_err(|e| Error::Internal(format!("blocking task failed: {e}")))?
}
