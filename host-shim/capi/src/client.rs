//! Clients: attach options, attach and detach, a client's limits and transport.

use super::*;

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
