//! `dpuio`: the host command line for a dpuio agent.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
mod forward;
mod fuse;
mod inodes;

use std::io::Write;
use std::os::fd::AsFd;

use dpuio_shim::cli::ConnectArgs;
use dpuio_shim::{Access, Attr, Client, ConnectOptions, DataPlaneOptions, EntryKind, HostBytes, HostBytesMut};

/// Bytes per data-plane request of put/get/cat.
const TRANSFER_CHUNK_BYTES: usize = 4 << 20;
/// Requests in flight per batch.
const TRANSFER_DEPTH: usize = 4;
/// The exit status when whoever reads stdout went away (`dpuio ls | head`): what a
/// shell reports for coreutils killed by SIGPIPE (128 + 13), so `set -o pipefail`
/// scripts see the same as with `ls`; nothing is printed.
const BROKEN_PIPE_STATUS: u8 = 141;

/// Why a command stopped.
enum Failure {
    /// The agent or the data plane said no: printed, exit 1.
    Shim(dpuio_shim::Error),
    /// Writing to stdout (or the local file) failed.
    Output { name: String, error: std::io::Error },
}

impl From<dpuio_shim::Error> for Failure {
    fn from(e: dpuio_shim::Error) -> Failure {
        Failure::Shim(e)
    }
}

/// Writes lines to stdout, remembering the first failure (a closed pipe) so a listing
/// stops instead of panicking in `println!`.
struct Stdout {
    failed: Option<std::io::Error>,
}

impl Stdout {
    fn new() -> Stdout {
        Stdout { failed: None }
    }

    /// Print a line; after a failure, an error that stops a listing (the failure
    /// itself comes from [`Stdout::finish`]).
    fn line(&mut self, line: std::fmt::Arguments<'_>) -> dpuio_shim::Result<()> {
        if self.failed.is_none()
            && let Err(e) = writeln!(std::io::stdout().lock(), "{line}")
        {
            self.failed = Some(e);
        }
        match &self.failed {
            None => Ok(()),
            Some(e) => Err(dpuio_shim::Error::DataPlane { op: "write to stdout".into(), reason: e.to_string() }),
        }
    }

    /// The first write failure, if any, else `result`; flushes.
    fn finish<T>(mut self, result: dpuio_shim::Result<T>) -> Result<T, Failure> {
        if self.failed.is_none()
            && let Err(e) = std::io::stdout().lock().flush()
        {
            self.failed = Some(e);
        }
        match self.failed {
            Some(error) => Err(Failure::Output { name: "stdout".into(), error }),
            None => Ok(result?),
        }
    }
}

/// Work with the files of your tenant's container through the dpuio agent.
#[derive(Parser)]
#[command(name = "dpuio", version, about)]
struct Cli {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Data plane for put/get/cat/mount: ucx-shm, ucx-tcp, ofi-shm, ofi-tcp (libfabric), auto
    /// (the first of UCX, ofi-shm, ofi-tcp the agent offers), shm/tcp (UCX), or a
    /// UCX_TLS list.
    #[arg(long, env = "DPUIO_TRANSPORT", default_value = "auto", global = true)]
    transport: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List a directory (by name on the local backend; in DFS hash order over DAOS).
    Ls {
        /// Long format: kind, size, modification time, name.
        #[arg(short, long)]
        long: bool,
        #[arg(default_value = "/")]
        path: String,
    },
    /// Show the attributes of paths.
    Stat {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Create directories.
    Mkdir {
        /// Create missing parents; no error if the directory exists.
        #[arg(short, long)]
        parents: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Remove files or directories.
    Rm {
        /// Remove directories and everything under them.
        #[arg(short, long)]
        recursive: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Rename a file or directory (fails if the destination exists).
    Mv { from: String, to: String },
    /// Copy a local file into the container, replacing REMOTE in one step if it exists:
    /// the data goes to a temporary file beside it (.NAME.dpuio-put.SUFFIX), synced,
    /// then renamed over REMOTE, so an interrupted put leaves the old file whole.
    Put { local: std::path::PathBuf, remote: String },
    /// Copy a file of the container to a local file.
    Get { remote: String, local: std::path::PathBuf },
    /// Write files of the container to stdout.
    Cat {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Measure workloads through the shim and through POSIX on the same files, or
    /// (`dpuio bench crypto`) the agent's ciphers against OpenSSL: runs `dpuio-bench`
    /// (`dpuio bench --help` for its options).
    #[command(disable_help_flag = true)]
    Bench {
        /// What `dpuio-bench` takes: workloads and their options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Create empty files, or leave existing ones as they are.
    Touch {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Mount the container as a file system (FUSE) at MOUNTPOINT, for programs that
    /// read and write by path; unmount with `fusermount3 -u MOUNTPOINT` (or SIGTERM to
    /// the mount process).
    ///
    /// Reads go through the kernel's page cache (a file unchanged since it was last
    /// opened keeps its cached pages) in pieces of up to 1 MiB; `close` of a written file
    /// makes it durable. Failures are the errno programs expect: EACCES where the
    /// capability token denies, EIO where stored data failed its integrity check. Modes,
    /// owners and times are not stored (chmod, chown and touch -d change nothing); links,
    /// symlinks and extended attributes are not supported. See docs/unmodified-apps.md.
    Mount(fuse::MountArgs),
    /// Print a capability token narrower than this session's, for a child process
    /// (pass it as --token or DPUIO_TOKEN).
    Delegate {
        /// Only paths under this prefix [default: all the parent may reach].
        #[arg(long, default_value = "")]
        prefix: String,
        /// Operations kept, comma-separated: read, write, create, delete [default: the parent's].
        #[arg(long, default_value = "")]
        ops: String,
        /// Lifetime in seconds [default: the parent's, or one hour for a session without a token].
        #[arg(long, default_value_t = 0)]
        lifetime: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Bench { args } = &cli.command {
        return forward::bench(&cli.connect, args);
    }
    if let Command::Mount(args) = &cli.command {
        // Blocking calls of its own, outside any async runtime.
        return fuse::command(&cli.connect, &cli.transport, args);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dpuio: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Output { error, .. }) if error.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::from(BROKEN_PIPE_STATUS)
        }
        Err(Failure::Output { name, error }) => {
            // eprintln! could panic the same way when stderr is gone too.
            let _ = writeln!(std::io::stderr(), "dpuio: write to {name}: {error}");
            ExitCode::FAILURE
        }
        Err(Failure::Shim(e)) => {
            let _ = writeln!(std::io::stderr(), "dpuio: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let base = cli.connect.connect_options("dpuio cli");
    let command = cli.command;
    let moves_data = matches!(command, Command::Put { .. } | Command::Get { .. } | Command::Cat { .. });
    let client = Client::connect(ConnectOptions {
        data_plane: moves_data.then(|| DataPlaneOptions {
            transports: cli.transport,
            rings: 1,
            interface: cli.connect.interface,
            ..Default::default()
        }),
        ..base
    })
    .await?;
    let result = run_command(&client, command).await;
    // Detach even after a failed command, so the agent frees the session at once.
    let detached = client.detach().await;
    result.and(detached.map_err(Failure::from))
}

async fn run_command(client: &Client, command: Command) -> Result<(), Failure> {
    match command {
        Command::Delegate { prefix, ops, lifetime } => {
            let ops: Vec<String> = ops.split(',').map(str::trim).filter(|o| !o.is_empty()).map(String::from).collect();
            let (token, _expires) = client.delegate(&prefix, &ops, lifetime).await?;
            let mut out = Stdout::new();
            let printed = out.line(format_args!("{token}"));
            out.finish(printed)?;
        }
        Command::Ls { long, path } => {
            let mut out = Stdout::new();
            let listed = client
                .readdir_batches(&path, None, 0, |batch| {
                    for e in batch {
                        if long {
                            out.line(format_args!("{}", long_line(&e.attr, &e.name)))?;
                        } else {
                            out.line(format_args!("{}", e.name))?;
                        }
                    }
                    Ok(())
                })
                .await;
            out.finish(listed)?;
        }
        Command::Stat { paths } => {
            let mut out = Stdout::new();
            for path in paths {
                let a = client.stat(&path).await?;
                if out.line(format_args!("{}", long_line(&a, &path))).is_err() {
                    break; // finish() says why
                }
            }
            out.finish(Ok(()))?;
        }
        Command::Mkdir { parents, paths } => {
            for path in paths {
                client.mkdir(&path, parents).await?;
            }
        }
        Command::Rm { recursive, paths } => {
            for path in paths {
                client.remove(&path, recursive).await?;
            }
        }
        Command::Mv { from, to } => client.rename(&from, &to).await?,
        Command::Put { local, remote } => put(client, &local, &remote).await?,
        Command::Get { remote, local } => {
            let out = std::fs::File::create(&local).map_err(|e| local_error(&local, e))?;
            get(client, &remote, out, &local.display().to_string()).await?;
        }
        Command::Cat { paths } => {
            for path in paths {
                get(client, &path, std::io::stdout().lock(), "stdout").await?;
            }
        }
        // Handed to dpuio-bench or the mount before any client attaches (see main).
        Command::Bench { .. } | Command::Mount(_) => {}
        Command::Touch { paths } => {
            for path in paths {
                match client.create(&path, true).await {
                    Ok(file) => file.close().await?,
                    Err(e) if e.code() == Some(tonic::Code::AlreadyExists) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(())
}

fn long_line(a: &Attr, name: &str) -> String {
    let kind = match a.kind {
        EntryKind::Directory => 'd',
        EntryKind::File => '-',
    };
    let secs = a.mtime_ns.div_euclid(1_000_000_000);
    format!("{kind}{:04o} {:>14} {:>12} {name}", a.mode & 0o7777, a.size, secs)
}

fn local_error(path: &std::path::Path, e: std::io::Error) -> dpuio_shim::Error {
    dpuio_shim::Error::DataPlane { op: format!("local file {}", path.display()), reason: e.to_string() }
}

/// Read a local file into registered buffers and have the agent write them to a
/// temporary file beside `remote`, then replace `remote` with it in one step
/// ([`dpuio_shim::Put`]): a put that does not finish leaves the old file whole. Each
/// batch fills up to TRANSFER_DEPTH buffers and waits for all of them.
async fn put(client: &Client, local: &std::path::Path, remote: &str) -> dpuio_shim::Result<()> {
    let mut input = std::fs::File::open(local).map_err(|e| local_error(local, e))?;
    let put = client.put(remote).await?;
    match write_from(client, &put, &mut input, local).await {
        Ok(()) => put.commit().await, // durable, and in place, once this returns
        Err(e) => {
            put.abort().await;
            Err(e)
        }
    }
}

async fn write_from(
    client: &Client,
    put: &dpuio_shim::Put,
    input: &mut std::fs::File,
    local: &std::path::Path,
) -> dpuio_shim::Result<()> {
    let file = put.file();
    let pool = client.region_pool(TRANSFER_CHUNK_BYTES, TRANSFER_DEPTH).await?;
    let mut offset = 0u64;
    loop {
        let mut buffers = Vec::new();
        let mut requests = Vec::new();
        for _ in 0..TRANSFER_DEPTH {
            let mut buf = pool.get();
            let len = buf.len();
            let n = read_full(input, buf.bytes_mut(0, len)).map_err(|e| local_error(local, e))?;
            if n == 0 {
                break;
            }
            requests.push(file.write_request(&buf, 0, n as u64, offset));
            offset += n as u64;
            buffers.push(buf);
            if n < TRANSFER_CHUNK_BYTES {
                break;
            }
        }
        if requests.is_empty() {
            return Ok(());
        }
        let last =
            requests.len() < TRANSFER_DEPTH || requests.last().is_some_and(|r| r.length < TRANSFER_CHUNK_BYTES as u64);
        for done in client.submit(requests).await? {
            done.result.map_err(|status| dpuio_shim::Error::Io { op: format!("write {}", put.temp_path()), status })?;
        }
        drop(buffers);
        if last {
            return Ok(());
        }
    }
}

/// Have the agent read a file into registered buffers, then write them to `out`
/// (straight from the buffers: `write(2)` on them).
async fn get(client: &Client, remote: &str, mut out: impl Write + AsFd, name: &str) -> Result<(), Failure> {
    let output = |error| Failure::Output { name: name.to_owned(), error };
    out.flush().map_err(output)?; // nothing buffered may come after the file's bytes
    let file = client.open(remote, Access::ReadOnly).await?;
    let size = file.attr().size;
    let pool = client.region_pool(TRANSFER_CHUNK_BYTES, TRANSFER_DEPTH).await?;
    let mut offset = 0u64;
    while offset < size {
        let buffers: Vec<_> = (0..TRANSFER_DEPTH)
            .map(|k| offset + (k * TRANSFER_CHUNK_BYTES) as u64)
            .take_while(|&at| at < size)
            .map(|at| (at, pool.get()))
            .collect();
        let requests = buffers
            .iter()
            .map(|(at, buf)| file.read_request(buf, 0, (size - at).min(TRANSFER_CHUNK_BYTES as u64), *at))
            .collect();
        let done = client.submit(requests).await?;
        for ((_, buf), d) in buffers.iter().zip(&done) {
            let n = d.result.map_err(|status| dpuio_shim::Error::Io { op: format!("read {remote}"), status })?;
            if let Err(e) = write_all(&out, buf.bytes(0, n as usize)) {
                let _ = file.close().await;
                return Err(output(e));
            }
            offset += n;
            if n == 0 {
                offset = size; // the file shrank under us
            }
        }
    }
    out.flush().map_err(output)?;
    Ok(file.close().await?)
}

/// Fill `buf` from `input` (`read(2)` straight into the region); fewer bytes only at
/// the end of the input.
fn read_full(input: &impl AsFd, mut buf: HostBytesMut<'_>) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match buf.slice_mut(n..).read(input) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Write all of `bytes` to `out` (`write(2)` straight from the region).
fn write_all(out: &impl AsFd, mut bytes: HostBytes<'_>) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match bytes.write(out) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(k) => bytes = bytes.slice(k..),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
