//! Opaque handles handed to C, and the checks made on every handle C hands back.
//!
//! A handle is a `Box` leaked to C. Every live handle is recorded with its kind, so a
//! pointer that is null, was destroyed already, or points at another kind of object
//! is refused with `DPUIO_E_INVALID_ARGUMENT` instead of being dereferenced. (An address
//! reused by a new object of the same kind cannot be told apart: the header says so.)
//!
//! What the registry cannot check is concurrent use: a thread destroying a handle
//! while another uses it. The header's thread-safety rules forbid that; the `unsafe`
//! functions here state it as their safety contract.

use std::collections::HashMap;
use std::sync::RwLock;

use dpuio_shim::blocking::{Failure, Result};

/// Which kind of object a handle is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Client,
    Region,
    File,
    Batch,
    Dir,
}

/// Implemented by every type handed to C as an opaque handle.
pub(crate) trait Handle: Sized {
    const KIND: Kind;
}

static LIVE: RwLock<Option<HashMap<usize, Kind>>> = RwLock::new(None);

fn refusal(map: Option<&HashMap<usize, Kind>>, address: usize, kind: Kind) -> Option<Failure> {
    let name = format!("{kind:?}").to_lowercase();
    if address == 0 {
        return Some(Failure::invalid(format!("the {name} handle is NULL")));
    }
    match map.and_then(|m| m.get(&address)) {
        Some(k) if *k == kind => None,
        Some(k) => Some(Failure::invalid(format!(
            "expected a {name} handle, got a {} handle",
            format!("{k:?}").to_lowercase()
        ))),
        None => Some(Failure::invalid(format!("not a live {name} handle (destroyed already, or never made by dpuio)"))),
    }
}

fn check(address: usize, kind: Kind) -> Result<()> {
    let live = LIVE.read().unwrap_or_else(|p| p.into_inner());
    refusal(live.as_ref(), address, kind).map_or(Ok(()), Err)
}

/// Hand `value` to C.
pub(crate) fn into_raw<T: Handle>(value: T) -> *mut T {
    let p = Box::into_raw(Box::new(value));
    LIVE.write().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).insert(p as usize, T::KIND);
    p
}

/// Borrow the object behind a handle from C.
///
/// # Safety
/// No other thread may destroy this handle while the returned reference lives (the
/// header's thread-safety rules). Everything else about `p` is checked.
pub(crate) unsafe fn get<'a, T: Handle>(p: *const T) -> Result<&'a T> {
    check(p as usize, T::KIND)?;
    // SAFETY: check() proved p came from into_raw::<T> and was not taken back since,
    // so it points at a live, properly aligned T; the caller guarantees it is not
    // destroyed while the reference lives.
    Ok(unsafe { &*p })
}

/// Borrow the object behind a handle from C, exclusively.
///
/// # Safety
/// As [`get`], and no other thread may use this handle at all meanwhile (handles
/// borrowed mutably are the ones the header calls "one thread at a time").
pub(crate) unsafe fn get_mut<'a, T: Handle>(p: *mut T) -> Result<&'a mut T> {
    check(p as usize, T::KIND)?;
    // SAFETY: as in get(); exclusivity is the caller's contract.
    Ok(unsafe { &mut *p })
}

/// Take a handle back from C (to destroy it). Later uses of `p` are refused.
///
/// # Safety
/// No other thread may use this handle meanwhile.
pub(crate) unsafe fn take<T: Handle>(p: *mut T) -> Result<Box<T>> {
    let address = p as usize;
    {
        let mut live = LIVE.write().unwrap_or_else(|p| p.into_inner());
        if let Some(refused) = refusal(live.as_ref(), address, T::KIND) {
            return Err(refused);
        }
        live.get_or_insert_with(HashMap::new).remove(&address);
    }
    // SAFETY: the registry held p as a live T made by into_raw (Box::into_raw), and we
    // removed it under the lock, so this is the one place that turns it back into a Box.
    Ok(unsafe { Box::from_raw(p) })
}
