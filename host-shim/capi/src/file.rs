//! Files: open, stat, truncate, sync, close, and blocking pread/pwrite.

use super::*;
use crate::namespace::check_flags;

/// Open (or create) a file. `flags`: `DPUIO_O_RDONLY` or `DPUIO_O_RDWR`, plus
/// `DPUIO_O_CREAT`, `DPUIO_O_EXCL`, `DPUIO_O_TRUNC`.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_open(
    client: *const dpuio_client,
    path: *const c_char,
    flags: u32,
    out: *mut *mut dpuio_file,
) -> c_int {
    ffi("dpuio_open", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        check_flags(flags, DPUIO_O_RDWR | DPUIO_O_CREAT | DPUIO_O_EXCL | DPUIO_O_TRUNC)?;
        if flags & DPUIO_O_EXCL != 0 && flags & DPUIO_O_CREAT == 0 {
            return Err(Failure::invalid("DPUIO_O_EXCL without DPUIO_O_CREAT"));
        }
        let inner = c.session.data_client()?.clone();
        let create = flags & DPUIO_O_CREAT != 0;
        let exclusive = flags & DPUIO_O_EXCL != 0;
        let truncate = flags & DPUIO_O_TRUNC != 0;
        let write = flags & (DPUIO_O_RDWR | DPUIO_O_CREAT | DPUIO_O_TRUNC) != 0;
        let file = c.session.run(async move {
            if create && (exclusive || truncate) {
                // create() truncates an existing file unless exclusive.
                return inner.create(path, exclusive).await;
            }
            let access = if write { Access::ReadWrite } else { Access::ReadOnly };
            match inner.open(path, access).await {
                Err(e) if create && e.code() == Some(tonic::Code::NotFound) => {
                    match inner.create(path, true).await {
                        // Someone else created it meanwhile: open theirs.
                        Err(e) if e.code() == Some(tonic::Code::AlreadyExists) => inner.open(path, access).await,
                        other => other,
                    }
                }
                Ok(f) if truncate => {
                    f.truncate(0).await?;
                    Ok(f)
                }
                other => other,
            }
        })??;
        let f = handles::into_raw(dpuio_file { session: c.session.clone(), file: ProcessLocal::new(file) });
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, f, "out") }?;
        Ok(0)
    })
}

/// The file's size when it was opened.
///
/// # Safety
/// `file` a live file; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_file_size(file: *const dpuio_file, out: *mut u64) -> c_int {
    ffi("dpuio_file_size", || {
        // SAFETY: see the header's rules.
        let f = unsafe { handles::get(file) }?;
        let size = f.file.get()?.attr().size;
        // SAFETY: forwarded contract.
        unsafe { put(out, size, "out") }?;
        Ok(0)
    })
}

/// Current attributes of an open file.
///
/// # Safety
/// `file` a live file; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_fstat(file: *const dpuio_file, out: *mut dpuio_attr) -> c_int {
    ffi("dpuio_fstat", || {
        // SAFETY: see the header's rules.
        let f = unsafe { handles::get(file) }?;
        f.session.client()?;
        let attr = f.session.run(f.file.get()?.stat())??;
        // SAFETY: forwarded contract.
        unsafe { put(out, stat_of(&attr), "out") }?;
        Ok(0)
    })
}

/// Set the size of an open file (needs write access).
///
/// # Safety
/// `file` a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_ftruncate(file: *const dpuio_file, size: u64) -> c_int {
    ffi("dpuio_ftruncate", || {
        // SAFETY: see the header's rules.
        let f = unsafe { handles::get(file) }?;
        f.session.client()?;
        f.session.run(f.file.get()?.truncate(size))??;
        Ok(0)
    })
}

/// Make an open file durable.
///
/// # Safety
/// `file` a live file.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_fsync(file: *const dpuio_file) -> c_int {
    ffi("dpuio_fsync", || {
        // SAFETY: see the header's rules.
        let f = unsafe { handles::get(file) }?;
        f.session.client()?;
        f.session.run(f.file.get()?.sync())??;
        Ok(0)
    })
}

/// Close a file (a written file is durable once this returns) and free the handle.
/// No request may be in flight on it.
///
/// # Safety
/// No other thread may use `file` during or after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_close(file: *mut dpuio_file) -> c_int {
    ffi("dpuio_close", || {
        // SAFETY: the caller guarantees no concurrent use.
        let mut f = unsafe { handles::take(file) }?;
        let Ok(inner) = f.file.take() else { return Ok(0) }; // forked child: leaked
        if f.session.client().is_ok() {
            f.session.run(inner.close())??;
        }
        Ok(0)
    })
}

/// Build a request after checking what the agent will check anyway, so mistakes get
/// a precise message at once instead of a completion status later.
#[allow(clippy::too_many_arguments)] // the fields of one request, as C passes them
pub(super) fn request(
    opcode: u32,
    flags: u32,
    file: &dpuio_file,
    region: &dpuio_region,
    region_offset: u64,
    length: u64,
    file_offset: u64,
    user_data: u64,
) -> Result<Request> {
    let opcode = match opcode {
        DPUIO_OP_READ => Opcode::Read,
        DPUIO_OP_WRITE => Opcode::Write,
        other => return Err(Failure::invalid(format!("unknown opcode {other}"))),
    };
    check_flags(flags, DPUIO_IO_SYNC)?;
    if !Arc::ptr_eq(&file.session, &region.session) {
        return Err(Failure::invalid("the file and the region belong to different clients"));
    }
    let r = region.region.get()?;
    let end = region_offset.checked_add(length);
    if end.is_none_or(|end| end > r.len() as u64) {
        return Err(Failure::new(
            Code::OutOfRange,
            format!("range {region_offset}+{length} lies outside the {}-byte region", r.len()),
        ));
    }
    let f = file.file.get()?;
    Ok(Request {
        opcode,
        handle: f.handle(),
        region_id: r.id(),
        region_offset,
        file_offset,
        length,
        sync: flags & DPUIO_IO_SYNC != 0,
        user_data,
    })
}

fn blocking_io(request: Request, session: &Session, path: &str) -> Result<u64> {
    let done = session.submit(&[request])?;
    let op = if request.opcode == Opcode::Read { "read" } else { "write" };
    match done.first() {
        Some(Ok(n)) => Ok(*n),
        Some(Err(status)) => Err(Failure::io(&format!("{op} {path}"), *status)),
        None => Err(Failure::new(Code::Protocol, "no completion")),
    }
}

/// Read `length` bytes at `file_offset` into the region at `region_offset` and wait
/// (requests longer than the agent's `max_io_bytes` are split). `*bytes` gets the
/// bytes read (short only at end of file). Takes one ring for the call.
///
/// # Safety
/// `file`, `region` live handles of one client; `bytes` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_pread(
    file: *const dpuio_file,
    region: *const dpuio_region,
    region_offset: u64,
    length: u64,
    file_offset: u64,
    bytes: *mut u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { blocking_call("dpuio_pread", file, region, DPUIO_OP_READ, 0, region_offset, length, file_offset, bytes) }
}

/// Write `length` bytes from the region at `region_offset` to `file_offset` and wait.
/// `flags`: `DPUIO_IO_SYNC` or 0. `*bytes` gets the bytes written.
///
/// # Safety
/// `file`, `region` live handles of one client; `bytes` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_pwrite(
    file: *const dpuio_file,
    region: *const dpuio_region,
    region_offset: u64,
    length: u64,
    file_offset: u64,
    flags: u32,
    bytes: *mut u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        blocking_call("dpuio_pwrite", file, region, DPUIO_OP_WRITE, flags, region_offset, length, file_offset, bytes)
    }
}

/// The body of `dpuio_pread` and `dpuio_pwrite` (`name`): one request of `opcode`, waited
/// for, its byte count into `*bytes`.
///
/// # Safety
/// As `dpuio_pread`.
#[allow(clippy::too_many_arguments)]
unsafe fn blocking_call(
    name: &str,
    file: *const dpuio_file,
    region: *const dpuio_region,
    opcode: u32,
    flags: u32,
    region_offset: u64,
    length: u64,
    file_offset: u64,
    bytes: *mut u64,
) -> c_int {
    ffi(name, || {
        // SAFETY: see the header's rules.
        let (f, r) = unsafe { (handles::get(file)?, handles::get(region)?) };
        let req = request(opcode, flags, f, r, region_offset, length, file_offset, 0)?;
        let n = blocking_io(req, &f.session, f.file.get()?.path())?;
        if !bytes.is_null() {
            // SAFETY: non-null; the caller guarantees it is writable.
            unsafe { put(bytes, n, "bytes") }?;
        }
        Ok(0)
    })
}
