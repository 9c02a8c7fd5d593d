//! `drop_load_time_signal_handlers` removes the handlers libfabric's dependencies
//! install when they are loaded and leaves every other handler alone. The test loads
//! Debian's libfabric itself (as Python loads the dpuio extension), so the handlers
//! are there whether or not the linker kept libfabric in this binary.

use std::sync::atomic::{AtomicBool, Ordering};

static OURS_RAN: AtomicBool = AtomicBool::new(false);

extern "C" fn ours(_sig: libc::c_int) {
    OURS_RAN.store(true, Ordering::SeqCst);
}

const SIGNALS: [libc::c_int; 6] =
    [libc::SIGILL, libc::SIGABRT, libc::SIGBUS, libc::SIGSEGV, libc::SIGTERM, libc::SIGINT];

fn handler(sig: libc::c_int) -> libc::sighandler_t {
    // SAFETY: a null new action only reads the current one into a zeroed struct.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) }, 0);
    old.sa_sigaction
}

fn ours_address() -> libc::sighandler_t {
    ours as extern "C" fn(libc::c_int) as libc::sighandler_t
}

#[test]
fn load_time_handlers_go_and_the_programs_stay() {
    // SAFETY: loading a system library by name; its constructors are what is tested.
    let lib = unsafe { libc::dlopen(c"libfabric.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null(), "libfabric.so.1 does not load (apt-get install libfabric1)");
    let psm = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps").contains("libinfinipath");
    // The program installs its own handler after the libraries loaded (a handler
    // installed before is overwritten by theirs: IPATH_NO_BACKTRACE=1 in the
    // environment is what prevents that, see docs/dataplane.md).
    // SAFETY: `ours` is async-signal-safe (one atomic store).
    unsafe { libc::signal(libc::SIGINT, ours_address()) };
    let loaded: Vec<_> = SIGNALS.iter().map(|&s| handler(s)).collect();

    let reset = fabric::drop_load_time_signal_handlers();

    for (i, &sig) in SIGNALS.iter().enumerate() {
        let now = handler(sig);
        if reset.contains(&sig) {
            assert_eq!(now, libc::SIG_DFL, "signal {sig}: the library's handler is gone");
        } else {
            assert_eq!(now, loaded[i], "signal {sig}: left alone");
        }
    }
    assert_eq!(handler(libc::SIGINT), ours_address(), "the program's handler stays");
    if psm {
        for sig in [libc::SIGTERM, libc::SIGSEGV, libc::SIGABRT] {
            assert!(reset.contains(&sig), "libinfinipath is loaded: {sig} should have been reset ({reset:?})");
        }
    } else {
        eprintln!("libinfinipath is not among libfabric's dependencies here: only checked nothing else moved");
    }
    // SAFETY: raising SIGINT runs `ours`, installed above.
    unsafe { libc::raise(libc::SIGINT) };
    assert!(OURS_RAN.load(Ordering::SeqCst));
    assert!(fabric::drop_load_time_signal_handlers().is_empty(), "nothing of theirs is left");
}

/// libfabric loaded by the first libfabric worker, after the program installed its
/// handlers: the program keeps them. Run in a child process of its own (this binary,
/// this test alone): the other test loads libfabric.
#[test]
fn a_worker_loading_libfabric_leaves_the_programs_handlers() {
    if std::env::var_os("DPUIO_SIGNALS_CHILD").is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "a_worker_loading_libfabric_leaves_the_programs_handlers", "--nocapture"])
            .env("DPUIO_SIGNALS_CHILD", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let maps = || std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    assert!(!maps().contains("libfabric.so"), "libfabric was loaded before the worker opened");
    // SAFETY: `ours` is async-signal-safe (one atomic store).
    unsafe { libc::signal(libc::SIGTERM, ours_address()) };
    let before: Vec<_> = SIGNALS.iter().map(|&s| handler(s)).collect();
    let worker = fabric::ofi::Worker::open(&fabric::ofi::OfiConfig::tcp());
    assert!(maps().contains("libfabric.so"), "opening a libfabric worker loads libfabric ({:?})", worker.err());
    let after: Vec<_> = SIGNALS.iter().map(|&s| handler(s)).collect();
    assert_eq!(before, after, "loading libfabric changed the program's signal handlers");
    assert_eq!(handler(libc::SIGTERM), ours_address());
}
