//! The namespace calls by path: mkdir, unlink, rename and their kin.

use super::*;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
        return dpuio(|| mount()?.mkdir(&p).map(|()| 0));
    }
    libc_call!(mkdir(path, mode) as fn(*const c_char, mode_t) -> c_int)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(dirfd, path) } {
        return dpuio(|| mount()?.mkdir(&p).map(|()| 0));
    }
    libc_call!(mkdirat(dirfd, path, mode) as fn(c_int, *const c_char, mode_t) -> c_int)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
        return dpuio(|| mount()?.rmdir(&p).map(|()| 0));
    }
    libc_call!(rmdir(path) as fn(*const c_char) -> c_int)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
        return dpuio(|| mount()?.unlink(&p).map(|()| 0));
    }
    libc_call!(unlink(path) as fn(*const c_char) -> c_int)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(dirfd, path) } {
        return dpuio(|| {
            let m = mount()?;
            if flags & libc::AT_REMOVEDIR != 0 { m.rmdir(&p) } else { m.unlink(&p) }.map(|()| 0)
        });
    }
    libc_call!(unlinkat(dirfd, path, flags) as fn(c_int, *const c_char, c_int) -> c_int)
}

/// Both paths dpuio's, or neither: a rename across the prefix is `EXDEV`, as between
/// two mounts.
unsafe fn rename_paths(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
) -> Option<Result<(String, String), c_int>> {
    // SAFETY: the caller's paths.
    let (a, b) = unsafe { (at_path(olddir, old), at_path(newdir, new)) };
    match (a, b) {
        (Some(a), Some(b)) => Some(Ok((a, b))),
        (None, None) => None,
        _ => Some(Err(libc::EXDEV)),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    // SAFETY: the caller's paths.
    match unsafe { rename_paths(libc::AT_FDCWD, old, libc::AT_FDCWD, new) } {
        Some(Ok((a, b))) => dpuio(|| mount()?.rename(&a, &b).map(|()| 0)),
        Some(Err(e)) => fail(e),
        None => libc_call!(rename(old, new) as fn(*const c_char, *const c_char) -> c_int),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat(olddir: c_int, old: *const c_char, newdir: c_int, new: *const c_char) -> c_int {
    // SAFETY: the caller's paths.
    match unsafe { rename_paths(olddir, old, newdir, new) } {
        Some(Ok((a, b))) => dpuio(|| mount()?.rename(&a, &b).map(|()| 0)),
        Some(Err(e)) => fail(e),
        None => {
            libc_call!(renameat(olddir, old, newdir, new) as fn(c_int, *const c_char, c_int, *const c_char) -> c_int)
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat2(
    olddir: c_int,
    old: *const c_char,
    newdir: c_int,
    new: *const c_char,
    flags: std::ffi::c_uint,
) -> c_int {
    // SAFETY: the caller's paths.
    match unsafe { rename_paths(olddir, old, newdir, new) } {
        // RENAME_NOREPLACE is what the agent does anyway; other flags it cannot do.
        Some(Ok((a, b))) if flags == 0 => dpuio(|| mount()?.rename(&a, &b).map(|()| 0)),
        Some(Ok((a, b))) if flags == libc::RENAME_NOREPLACE => dpuio(|| mount()?.rename_noreplace(&a, &b).map(|()| 0)),
        Some(Ok(_)) => fail(libc::EINVAL),
        Some(Err(e)) => fail(e),
        None => libc_call!(renameat2(olddir, old, newdir, new, flags)
            as fn(c_int, *const c_char, c_int, *const c_char, std::ffi::c_uint) -> c_int),
    }
}
