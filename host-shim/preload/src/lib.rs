//! `libdpuio_preload.so`: unmodified programs read and write dpuio files by path.
//!
//! With `LD_PRELOAD=libdpuio_preload.so` and `DPUIO_MOUNT=/mnt/dpuio`, the libc calls
//! this library defines look at their path or descriptor: a path under the prefix (or a
//! descriptor opened from one) goes to the agent through [`dpuio_shim::posix`]; anything
//! else goes on to the next definition, libc's, found with `dlsym(RTLD_NEXT)`.
//!
//! Descriptors are real kernel descriptors: each dpuio file or directory holds an
//! `O_PATH` descriptor of an empty memfd named after it, which reserves its number (so
//! `select` limits, close-on-exec and numbering stay the kernel's) and lets a program
//! started by `exec` find its inherited dpuio descriptors; a table maps the number to
//! the open dpuio file. A call that reaches the kernel with such a descriptor anyway (a
//! static binary, glibc-internal I/O, `io_uring`) fails with `EBADF`, never with wrong
//! data.
//!
//! What it deliberately does not do: interpose `malloc` or anything the runtime needs
//! before it is up; resolve relative paths against a working directory inside the
//! mount (they go to libc); share file offsets across `fork` (a child reopens its
//! files by path, lazily, with an offset of its own).
//!
//! Unsafe code is the point of this crate (raw pointers from C callers, `dlsym`); each
//! block says why it is sound. The interposers keep the safety contract of the libc
//! function of the same name, which is their `# Safety` section.

mod interpose;
mod state;

/// Runs when the library is loaded, before `main`: a program started by `exec` from a
/// preloaded one picks up the dpuio descriptors it inherited.
extern "C" fn on_load() {
    if state::prefix().is_some() {
        interpose::inherit();
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;
