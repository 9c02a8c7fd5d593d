//! What the two shared-memory transports can cost at best, measured with bare system
//! calls: the ceiling under `dpuio bench seq-read` over `shim-ucx-sm` and
//! `shim-ofi-shm` on this machine.
//!
//! * UCX shared memory maps the host's region into the agent, so a read is one
//!   `pread` from the page cache straight into the host's memory.
//! * libfabric's shm provider cannot map it: the agent `pread`s into its staging region,
//!   then the provider copies that into the host with `process_vm_writev` (CMA), which
//!   pins the target's pages on every call.
//!
//! ```sh
//! cargo run --release -p fabric --example copy_ceiling [FILE_MIB] [ROUNDS]
//! ```
//!
//! Prints GiB/s of 1 MiB copies for: `pread` into a shared mapping (UCX's one copy),
//! `process_vm_writev` alone, and `pread` then `process_vm_writev` (libfabric's two), in
//! the same run, and their ratio. A child process of this program holds the target
//! memory.

use std::io::{BufRead, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::process::{Command, Stdio};
use std::time::Instant;

const MIB: usize = 1 << 20;
/// The target's memory: a region of this many MiB, written round-robin.
const TARGET_MIB: usize = 64;

fn main() {
    let mut args = std::env::args().skip(1);
    let first = args.next();
    if first.as_deref() == Some("--target") {
        target();
        return;
    }
    let file_mib: usize = first.and_then(|a| a.parse().ok()).unwrap_or(256);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);

    // The file, in the page cache (as the benchmark's is).
    let dir = std::env::temp_dir().join(format!("copy-ceiling-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let path = dir.join("data");
    let file =
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).expect("file");
    let block: Vec<u8> = (0..MIB).map(|i| (i * 7 + 3) as u8).collect();
    for i in 0..file_mib {
        file.write_all_at(&block, (i * MIB) as u64).expect("write");
    }

    // The target process and the address of its memory.
    let me = std::env::current_exe().expect("this program");
    let mut child =
        Command::new(me).arg("--target").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("child");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().expect("stdout")).read_line(&mut line).expect("its address");
    let remote: usize = line.trim().parse().expect("an address");
    let pid = child.id() as libc::pid_t;

    let shared = Mapping::new(TARGET_MIB * MIB);
    let mut staging = vec![0u8; MIB];
    let fd = file.as_raw_fd();
    let pread = |dst: *mut u8, at: usize| {
        // SAFETY: dst points to MIB writable bytes (the staging buffer or a block of
        // the mapping); fd is open for reading.
        let n = unsafe { libc::pread(fd, dst.cast(), MIB, at as libc::off_t) };
        assert_eq!(n, MIB as isize, "pread");
    };
    let cma = |src: *const u8, block: usize| {
        let local = libc::iovec { iov_base: src as *mut libc::c_void, iov_len: MIB };
        let far = libc::iovec { iov_base: (remote + (block % TARGET_MIB) * MIB) as *mut libc::c_void, iov_len: MIB };
        // SAFETY: both iovecs describe MIB bytes: ours readable, the child's a block of
        // its mapping; the kernel checks the remote side.
        let n = unsafe { libc::process_vm_writev(pid, &local, 1, &far, 1, 0) };
        assert_eq!(n, MIB as isize, "process_vm_writev: {}", std::io::Error::last_os_error());
    };
    println!("1 MiB copies, a {file_mib} MiB file in the page cache, {rounds} rounds (GiB/s)");
    println!(
        "{:>5} {:>22} {:>20} {:>22} {:>12}",
        "round", "pread into a mapping", "process_vm_writev", "pread + process_vm_w.", "two / one"
    );
    for round in 1..=rounds {
        let time = |f: &mut dyn FnMut(usize)| {
            let t = Instant::now();
            for i in 0..file_mib {
                f(i);
            }
            file_mib as f64 / 1024.0 / t.elapsed().as_secs_f64()
        };
        let one = time(&mut |i| pread(shared.block(i % TARGET_MIB), i * MIB));
        let cma_only = time(&mut |i| cma(staging.as_ptr(), i));
        let two = time(&mut |i| {
            pread(staging.as_mut_ptr(), i * MIB);
            cma(staging.as_ptr(), i);
        });
        println!("{round:>5} {one:>22.2} {cma_only:>20.2} {two:>22.2} {:>11.2}x", two / one);
    }
    drop(child.stdin.take()); // the child exits when its stdin closes
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The target: map memory, say where, and keep it until stdin closes.
fn target() {
    let memory = Mapping::new(TARGET_MIB * MIB);
    println!("{}", memory.block(0) as usize);
    std::io::stdout().flush().expect("stdout");
    let mut rest = String::new();
    let _ = std::io::stdin().read_line(&mut rest);
    drop(memory);
}

/// An anonymous shared mapping, touched once so that no copy pays its page faults.
struct Mapping {
    at: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Mapping {
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        // SAFETY: the mapping is len bytes, readable and writable, and ours alone.
        unsafe { std::ptr::write_bytes(at.cast::<u8>(), 1, len) };
        Mapping { at: at.cast(), len }
    }

    fn block(&self, i: usize) -> *mut u8 {
        assert!((i + 1) * MIB <= self.len);
        self.at.wrapping_add(i * MIB)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`, used by nobody after this.
        unsafe { libc::munmap(self.at.cast(), self.len) };
    }
}
