//! Regions: memory this process registers for the agent to read and write.

use super::*;

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
