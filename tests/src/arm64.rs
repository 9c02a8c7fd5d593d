//! The aarch64 (BlueField) build under `qemu-aarch64-static`: where the binaries and the
//! aarch64 DAOS client are, and how to run them.
//!
//! The binaries are the ones `./x test` cross-builds (`target/cross/aarch64-unknown-linux-gnu/debug`,
//! or `$DPUIO_ARM64_BIN_DIR`); the DAOS client is the prebuilt aarch64 tree `./x test`
//! unpacks from `../shared/daos` (`$DPUIO_ARM64_DAOS_PREFIX`). Programs run without `-L`:
//! they load the multiarch arm64 glibc (libc6:arm64) with its own loader. The cross sysroot
//! `/usr/aarch64-linux-gnu` with `qemu -L` mixes another build of glibc's loader with the
//! multiarch libc the arm64 UCX brings, and that hangs in pthread_create under qemu 7.2.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::netns::Side;

/// The emulator.
pub const QEMU: &str = "qemu-aarch64-static";
/// The loader of the multiarch arm64 glibc (libc6:arm64).
pub const LOADER: &str = "/lib/ld-linux-aarch64.so.1";

/// Where the aarch64 binaries are.
pub fn bin_dir() -> PathBuf {
    std::env::var_os("DPUIO_ARM64_BIN_DIR").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/cross/aarch64-unknown-linux-gnu/debug")
    })
}

/// The aarch64 program `name` (e.g. `dpu-agent`), or why it cannot run here.
pub fn program(name: &str) -> Result<PathBuf, String> {
    let path = bin_dir().join(name);
    if !path.is_file() {
        return Err(format!("{} is missing: `./x build-arm64` or `./x test` cross-builds it", path.display()));
    }
    if Command::new(QEMU).arg("--version").output().is_err() {
        return Err(format!("{QEMU} is not installed (Debian package qemu-user-static)"));
    }
    if !Path::new(LOADER).exists() {
        return Err(format!(
            "{LOADER} is missing: install the arm64 C library (`dpkg --add-architecture arm64`, libc6:arm64)"
        ));
    }
    Ok(path)
}

/// `qemu-aarch64-static PROGRAM` as a command to add arguments to.
pub fn emulated(program: &Path) -> Command {
    let mut c = Command::new(QEMU);
    c.arg(program);
    c
}

/// The prefix of the aarch64 DAOS client (`lib64/libdfs.so`, `bin/daos_agent`), or why
/// there is none.
pub fn daos_prefix() -> Result<PathBuf, String> {
    let prefix = std::env::var_os("DPUIO_ARM64_DAOS_PREFIX").map(PathBuf::from).ok_or(
        "DPUIO_ARM64_DAOS_PREFIX is not set: ./x test's DAOS tier unpacks the aarch64 DAOS client and sets it",
    )?;
    for f in ["lib64/libdfs.so", "bin/daos_agent"] {
        if !prefix.join(f).exists() {
            return Err(format!("{} is missing: not an aarch64 DAOS client tree", prefix.join(f).display()));
        }
    }
    Ok(prefix)
}

/// The aarch64 `daos_agent` of `prefix` under qemu, serving its dRPC socket in its own
/// directory for the DAOS system under test; killed when dropped.
pub struct DaosAgent {
    child: Child,
    /// The directory of its `daos_agent.sock`.
    pub socket_dir: PathBuf,
}

impl DaosAgent {
    /// Start it with `config` (a `daos_agent.yml` whose `runtime_dir` is `socket_dir`)
    /// in `dir`, and wait for its socket.
    pub fn start(prefix: &Path, dir: &Path, config: &str, socket_dir: &Path) -> DaosAgent {
        Self::start_in(prefix, dir, config, socket_dir, None)
    }

    /// [`DaosAgent::start`] in the network namespace of `netns` (`None`: the machine's).
    pub fn start_in(prefix: &Path, dir: &Path, config: &str, socket_dir: &Path, netns: Option<&Side>) -> DaosAgent {
        std::fs::create_dir_all(socket_dir).unwrap();
        let path = dir.join("daos_agent.yml");
        std::fs::write(&path, config).unwrap();
        let mut command = match netns {
            Some(side) => side.command(QEMU),
            None => Command::new(QEMU),
        };
        let child = command
            .arg(prefix.join("bin/daos_agent"))
            .arg("-o")
            .arg(&path)
            .env_remove("LD_LIBRARY_PATH")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("daos_agent.stderr")).unwrap())
            .spawn()
            .expect("start the aarch64 daos_agent under qemu");
        let agent = DaosAgent { child, socket_dir: socket_dir.to_owned() };
        crate::daos::wait_for_socket(socket_dir, &dir.join("daos_agent.stderr"));
        agent
    }
}

impl Drop for DaosAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
