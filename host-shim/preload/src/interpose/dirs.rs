//! Directories: opendir, readdir, getdents and the descriptors they read from.

use super::io::buffer;
use super::open::close;
use super::*;

static OPEN_DIRS: AtomicUsize = AtomicUsize::new(0);

fn dirs() -> &'static Mutex<HashSet<usize>> {
    static DIRS: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    DIRS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Our `Dir` behind `d`, if `d` is one of ours.
fn our_dir<'a>(d: *mut c_void) -> Option<&'a mut Dir> {
    if is_inside() || OPEN_DIRS.load(Ordering::Acquire) == 0 || d.is_null() {
        return None;
    }
    if !dirs().lock().unwrap_or_else(|p| p.into_inner()).contains(&(d as usize)) {
        return None;
    }
    // SAFETY: the address is in DIRS, so it is a live `Box<Dir>` this library made and
    // has not freed; DIR streams are not shared between threads without locking (POSIX).
    Some(unsafe { &mut *d.cast::<Dir>() })
}

fn new_dir(fd: c_int, path: String) -> *mut c_void {
    // SAFETY: all-zero bytes are a valid dirent64.
    let entry: libc::dirent64 = unsafe { std::mem::zeroed() };
    let d = Box::into_raw(Box::new(Dir { fd, path, stream: None, dots: 2, entry, position: 0, held: false }))
        .cast::<c_void>();
    dirs().lock().unwrap_or_else(|p| p.into_inner()).insert(d as usize);
    OPEN_DIRS.fetch_add(1, Ordering::AcqRel);
    d
}

fn do_opendir(path: &str) -> Result<*mut c_void, PosixError> {
    let fd = do_open(path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC)?;
    Ok(new_dir(fd, path.to_owned()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut c_void {
    // SAFETY: the caller's path.
    if let Some(p) = unsafe { at_path(libc::AT_FDCWD, path) } {
        return dpuio(|| do_opendir(&p));
    }
    libc_call!(opendir(path) as fn(*const c_char) -> *mut c_void)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut c_void {
    if let Some(n) = node(fd) {
        return match &*n {
            Node::Directory { path, .. } => new_dir(fd, path.clone()),
            Node::File(_) => fail(libc::ENOTDIR),
        };
    }
    libc_call!(fdopendir(fd) as fn(c_int) -> *mut c_void)
}

/// The next entry of `d`, into `d.entry`; `Ok(false)` at the end.
fn next_entry(d: &mut Dir) -> Result<bool, PosixError> {
    let (name, ino, kind) = if d.dots > 0 {
        d.dots -= 1;
        let name = if d.dots == 1 { "." } else { ".." };
        (
            name.to_owned(),
            inode(&d.path, &Attr { kind: EntryKind::Directory, size: 0, mode: 0, mtime_ns: 0, object_id: 0 }),
            libc::DT_DIR,
        )
    } else {
        if d.stream.is_none() {
            d.stream = Some(mount()?.readdir(&d.path)?);
        }
        let Some(stream) = d.stream.as_mut() else { return Ok(false) };
        match stream.next_entry()? {
            None => return Ok(false),
            Some(e) => {
                let path = join(&d.path, &e.name);
                let kind = if e.attr.kind == EntryKind::Directory { libc::DT_DIR } else { libc::DT_REG };
                (e.name, inode(&path, &e.attr), kind)
            }
        }
    };
    d.position += 1;
    d.entry.d_ino = ino;
    d.entry.d_off = d.position;
    d.entry.d_type = kind;
    d.entry.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
    let bytes = name.as_bytes();
    let n = bytes.len().min(d.entry.d_name.len() - 1);
    for (dst, src) in d.entry.d_name.iter_mut().zip(&bytes[..n]) {
        *dst = *src as c_char;
    }
    d.entry.d_name[n] = 0;
    Ok(true)
}

fn do_readdir(d: &mut Dir) -> *mut libc::dirent64 {
    inside(|| match next_entry(d) {
        Ok(true) => &mut d.entry as *mut libc::dirent64,
        // The end: NULL with errno untouched.
        Ok(false) => std::ptr::null_mut(),
        Err(e) => fail(e.errno),
    })
}

interpose! {
    fn readdir | readdir64 (d: *mut c_void) -> *mut libc::dirent64 {
        if let Some(dir) = our_dir(d) {
            return do_readdir(dir);
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn closedir(d: *mut c_void) -> c_int {
    if let Some(dir) = our_dir(d) {
        let fd = dir.fd;
        dirs().lock().unwrap_or_else(|p| p.into_inner()).remove(&(d as usize));
        OPEN_DIRS.fetch_sub(1, Ordering::AcqRel);
        // SAFETY: made by Box::into_raw in new_dir and now out of DIRS: freed once.
        inside(|| drop(unsafe { Box::from_raw(d.cast::<Dir>()) }));
        // SAFETY: the descriptor this stream owned.
        return unsafe { close(fd) };
    }
    libc_call!(closedir(d) as fn(*mut c_void) -> c_int)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dirfd(d: *mut c_void) -> c_int {
    if let Some(dir) = our_dir(d) {
        return dir.fd;
    }
    libc_call!(dirfd(d) as fn(*mut c_void) -> c_int)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rewinddir(d: *mut c_void) {
    if let Some(dir) = our_dir(d) {
        inside(|| {
            dir.stream = None;
            dir.dots = 2;
            dir.position = 0;
            dir.held = false;
        });
        return;
    }
    if let Some(f) = real!(rewinddir as fn(*mut c_void) -> ()) {
        // SAFETY: the caller's stream, to libc's function.
        unsafe { f(d) }
    }
}

// Every libc function that takes a `DIR*` must be here: handed one of ours, libc's
// would read a `Dir` as its own structure.

#[unsafe(no_mangle)]
pub unsafe extern "C" fn telldir(d: *mut c_void) -> std::ffi::c_long {
    if let Some(dir) = our_dir(d) {
        return dir.position as std::ffi::c_long;
    }
    libc_call!(telldir(d) as fn(*mut c_void) -> std::ffi::c_long)
}

/// Back to a position `telldir` gave: start over and skip that many entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn seekdir(d: *mut c_void, position: std::ffi::c_long) {
    if let Some(dir) = our_dir(d) {
        inside(|| {
            dir.stream = None;
            dir.dots = 2;
            dir.position = 0;
            dir.held = false;
            while (dir.position as std::ffi::c_long) < position {
                if !matches!(next_entry(dir), Ok(true)) {
                    break;
                }
            }
        });
        return;
    }
    if let Some(f) = real!(seekdir as fn(*mut c_void, std::ffi::c_long) -> ()) {
        // SAFETY: the caller's stream, to libc's function.
        unsafe { f(d, position) }
    }
}

/// The reentrant form: the entry is copied into the caller's `entry`.
unsafe fn our_readdir_r(dir: &mut Dir, entry: *mut libc::dirent64, result: *mut *mut libc::dirent64) -> c_int {
    inside(|| match next_entry(dir) {
        Ok(true) => {
            // SAFETY: the caller's dirent and result pointers (readdir_r's contract).
            unsafe {
                *entry = dir.entry;
                *result = entry;
            }
            0
        }
        Ok(false) => {
            // SAFETY: as above.
            unsafe { *result = std::ptr::null_mut() };
            0
        }
        Err(e) => e.errno,
    })
}

interpose! {
    fn readdir_r | readdir64_r (d: *mut c_void, entry: *mut libc::dirent64, result: *mut *mut libc::dirent64) -> c_int {
        if let Some(dir) = our_dir(d) {
            // SAFETY: the caller's arguments.
            return unsafe { our_readdir_r(dir, entry, result) };
        }
    }
}

/// Offset of `d_name` in a kernel `linux_dirent64` record.
const DIRENT_NAME_OFFSET: usize = 19;

fn do_getdents(fd: c_int, path: &str, out: &mut [u8]) -> Result<isize, PosixError> {
    let mut listings = listings().lock().unwrap_or_else(|p| p.into_inner());
    let d = listings.entry(fd).or_insert_with(|| {
        // SAFETY: all-zero bytes are a valid dirent64.
        let entry: libc::dirent64 = unsafe { std::mem::zeroed() };
        Box::new(Dir { fd, path: path.to_owned(), stream: None, dots: 2, entry, position: 0, held: false })
    });
    let mut used = 0;
    loop {
        if !d.held {
            if !next_entry(d)? {
                break;
            }
            d.held = true;
        }
        let name: Vec<u8> = d.entry.d_name.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
        let reclen = (DIRENT_NAME_OFFSET + name.len() + 1).next_multiple_of(8);
        if used + reclen > out.len() {
            if used == 0 {
                return Err(errno_error(libc::EINVAL, "getdents64: buffer too small for the next entry"));
            }
            break;
        }
        let record = &mut out[used..used + reclen];
        record.fill(0);
        record[0..8].copy_from_slice(&d.entry.d_ino.to_ne_bytes());
        record[8..16].copy_from_slice(&d.entry.d_off.to_ne_bytes());
        record[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
        record[18] = d.entry.d_type;
        record[DIRENT_NAME_OFFSET..DIRENT_NAME_OFFSET + name.len()].copy_from_slice(&name);
        used += reclen;
        d.held = false;
    }
    Ok(used as isize)
}

/// Direct readers of directory descriptors (glibc's own `readdir` uses an internal
/// call; this is for programs that call `getdents64` themselves).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    if let Some(n) = node(fd) {
        return match &*n {
            Node::Directory { path, .. } => {
                // SAFETY: the caller's buffer of `len` bytes.
                let out = unsafe { buffer(buf, len) };
                dpuio(|| do_getdents(fd, path, out))
            }
            Node::File(_) => fail(libc::ENOTDIR),
        };
    }
    libc_call!(getdents64(fd, buf, len) as fn(c_int, *mut c_void, size_t) -> ssize_t)
}
