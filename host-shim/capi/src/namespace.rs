//! The namespace by path: stat, mkdir, remove, rename, put, truncate, sync, directories.

use super::*;

/// Attributes of `path`.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_stat(client: *const dpuio_client, path: *const c_char, out: *mut dpuio_attr) -> c_int {
    ffi("dpuio_stat", || {
        // SAFETY: see the header's rules (for both calls).
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        let inner = c.session.client()?;
        let attr = c.session.run(inner.stat(path))??;
        // SAFETY: forwarded contract.
        unsafe { put(out, stat_of(&attr), "out") }?;
        Ok(0)
    })
}

/// Create a directory; with `DPUIO_MKDIR_PARENTS` also its missing parents, and no
/// error if it exists.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_mkdir(client: *const dpuio_client, path: *const c_char, flags: u32) -> c_int {
    ffi("dpuio_mkdir", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        check_flags(flags, DPUIO_MKDIR_PARENTS)?;
        let inner = c.session.client()?;
        c.session.run(inner.mkdir(path, flags & DPUIO_MKDIR_PARENTS != 0))??;
        Ok(0)
    })
}

/// Remove a file or an empty directory; with `DPUIO_REMOVE_RECURSIVE` a whole tree.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_remove(client: *const dpuio_client, path: *const c_char, flags: u32) -> c_int {
    ffi("dpuio_remove", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        check_flags(flags, DPUIO_REMOVE_RECURSIVE)?;
        let inner = c.session.client()?;
        c.session.run(inner.remove(path, flags & DPUIO_REMOVE_RECURSIVE != 0))??;
        Ok(0)
    })
}

/// Rename `from` to `to`; fails with DPUIO_E_ALREADY_EXISTS if `to` exists (so a
/// write-then-rename publish never replaces anything by accident).
///
/// # Safety
/// `client` a live client; `from`, `to` NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_rename(client: *const dpuio_client, from: *const c_char, to: *const c_char) -> c_int {
    ffi("dpuio_rename", || {
        // SAFETY: see the header's rules.
        let (c, from, to) = unsafe { (handles::get(client)?, text(from, "from")?, text(to, "to")?) };
        let inner = c.session.client()?;
        c.session.run(inner.rename(from, to))??;
        Ok(0)
    })
}

/// Replace the file at `path` with the `len` bytes at `data` in one step, as an object
/// store's put does: the bytes go to a temporary file beside it
/// (`.NAME.dpuio-put.SUFFIX`), made durable, then renamed over `path`, and the container
/// is synced. Once this returns 0 the new file is durable; if it fails or the process
/// or agent dies first, `path` is still the old file (a temporary file may be left,
/// which nothing reads). Needs create and write on `path`'s directory.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string; `data` `len` readable bytes
/// (or NULL when `len` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_put(
    client: *const dpuio_client,
    path: *const c_char,
    data: *const c_void,
    len: usize,
) -> c_int {
    ffi("dpuio_put", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        let bytes: &[u8] = match (data.is_null(), len) {
            (_, 0) => &[],
            (true, _) => return Err(Failure::invalid(format!("data is NULL but len is {len}"))),
            // SAFETY: the caller promises `len` readable bytes at `data` for this call;
            // nothing else holds them mutably while it runs.
            (false, _) => unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) },
        };
        let inner = c.session.client()?;
        c.session.run(inner.put_bytes(path, bytes))??;
        Ok(0)
    })
}

/// Set the size of the file at `path`.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_truncate(client: *const dpuio_client, path: *const c_char, size: u64) -> c_int {
    ffi("dpuio_truncate", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        let inner = c.session.client()?;
        c.session.run(inner.truncate(path, size))??;
        Ok(0)
    })
}

/// Make every acknowledged change in the container durable.
///
/// # Safety
/// `client` a live client.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_sync(client: *const dpuio_client) -> c_int {
    ffi("dpuio_sync", || {
        // SAFETY: see the header's rules.
        let c = unsafe { handles::get(client) }?;
        let inner = c.session.client()?;
        c.session.run(inner.sync())??;
        Ok(0)
    })
}

pub(super) fn check_flags(flags: u32, known: u32) -> Result<()> {
    if flags & !known != 0 {
        return Err(Failure::invalid(format!("unknown flags {:#x}", flags & !known)));
    }
    Ok(())
}

/// Start listing a directory (in name order, fetched in batches of `batch_size`
/// entries, 0 for the agent's choice). Read it with `dpuio_dir_next`, free it with
/// `dpuio_dir_close` (also to stop early).
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_dir_open(
    client: *const dpuio_client,
    path: *const c_char,
    batch_size: u32,
    out: *mut *mut dpuio_dir,
) -> c_int {
    ffi("dpuio_dir_open", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let stream = DirStream::open(&c.session, path, batch_size)?;
        let dir = handles::into_raw(dpuio_dir { _session: c.session.clone(), stream, name: CString::default() });
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, dir, "out") }?;
        Ok(0)
    })
}

/// The next entry: returns 1 and fills `*entry`, 0 at the end, or a negative code.
/// `entry->name` is valid until the next call on `dir`.
///
/// # Safety
/// `dir` a live listing used by one thread at a time; `entry` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_dir_next(dir: *mut dpuio_dir, entry: *mut dpuio_dirent) -> c_int {
    ffi("dpuio_dir_next", || {
        // SAFETY: see the header's rules (one thread at a time per dir).
        let d = unsafe { handles::get_mut(dir) }?;
        if entry.is_null() {
            return Err(Failure::invalid("entry is NULL"));
        }
        match d.stream.next_entry()? {
            None => Ok(0),
            Some(e) => {
                d.name = CString::new(e.name.clone())
                    .map_err(|_| Failure::new(Code::Protocol, format!("entry name {:?} contains NUL", e.name)))?;
                let out = dpuio_dirent { name: d.name.as_ptr(), attr: stat_of(&e.attr) };
                // SAFETY: checked non-null; the caller guarantees it is writable.
                unsafe { put(entry, out, "entry") }?;
                Ok(1)
            }
        }
    })
}

/// Free a listing (also stops fetching further batches).
///
/// # Safety
/// No other thread may use `dir` during or after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_dir_close(dir: *mut dpuio_dir) -> c_int {
    ffi("dpuio_dir_close", || {
        // SAFETY: the caller guarantees no concurrent use.
        drop(unsafe { handles::take(dir) }?);
        Ok(0)
    })
}

/// List a directory, calling `callback(ctx, entry)` for each entry on the calling
/// thread (the callback may call other dpuio functions). Returns 0 after the last
/// entry, 1 if the callback stopped early, or a negative code.
///
/// # Safety
/// `client` a live client; `path` a NUL-terminated string; `callback` a valid
/// function that does not unwind (no C++ exceptions, no longjmp out of it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_readdir(
    client: *const dpuio_client,
    path: *const c_char,
    callback: dpuio_readdir_fn,
    ctx: *mut c_void,
) -> c_int {
    ffi("dpuio_readdir", || {
        // SAFETY: see the header's rules.
        let (c, path) = unsafe { (handles::get(client)?, text(path, "path")?) };
        let callback = callback.ok_or_else(|| Failure::invalid("callback is NULL"))?;
        let mut stream = DirStream::open(&c.session, path, 0)?;
        while let Some(e) = stream.next_entry()? {
            let name = CString::new(e.name.clone())
                .map_err(|_| Failure::new(Code::Protocol, format!("entry name {:?} contains NUL", e.name)))?;
            let entry = dpuio_dirent { name: name.as_ptr(), attr: stat_of(&e.attr) };
            // SAFETY: the caller guarantees a valid, non-unwinding callback; entry and
            // the name it points at live until the call returns.
            if unsafe { callback(ctx, &entry) } != 0 {
                return Ok(1);
            }
        }
        Ok(0)
    })
}
