//! The blocking session layer shared by the C ABI, the Python extension and the
//! `LD_PRELOAD` library ([`crate::posix`]).
//!
//! [`crate::Client`] is async (tokio). Foreign callers are plain threads, so a
//! [`Session`] owns a small tokio runtime of its own (one worker: the lease renewal and
//! the gRPC connection live there) and runs each call to completion on the caller's
//! thread with `block_on`. Data-plane calls need no runtime: they poll the rings in
//! this process's memory directly on the caller's thread.
//!
//! Fork: a UCX worker and a tokio runtime do not survive `fork`. A session remembers
//! the process that made it; in any other process every call fails with
//! [`Code::Closed`] and dropping it *leaks* it on purpose (running its destructors
//! would wait for threads that exist only in the parent, or touch the parent's UCX
//! state). The child attaches a session of its own.
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::{Client, ConnectOptions, DirEntry, Error, IoStatus, Request};

/// What went wrong, as one of a small set of codes every binding maps to its own
/// idiom (negative integers in C, an exception class in Python).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Code {
    /// A caller mistake: null or invalid pointer, bad UTF-8, bad flag, a range
    /// outside a region, a request larger than the agent allows.
    InvalidArgument = -1,
    NotFound = -2,
    AlreadyExists = -3,
    PermissionDenied = -4,
    /// The entry is in the wrong state: directory not empty, not a directory, ...
    FailedPrecondition = -5,
    /// An agent limit (sessions, handles, regions) or every ring of the client in use.
    ResourceExhausted = -6,
    OutOfRange = -7,
    /// The agent cannot be reached, or it ended the session.
    Unavailable = -8,
    TimedOut = -9,
    /// The agent refused a data-plane request for now (a session or tenant limit):
    /// submit it again later.
    Busy = -10,
    /// The storage backend failed.
    Io = -11,
    /// Data failed an integrity check; none was released.
    Integrity = -12,
    /// The object was closed, freed or detached, or belongs to another process (after
    /// fork).
    Closed = -13,
    /// The agent does not implement this call.
    Unsupported = -14,
    /// The agent answered something this library cannot use.
    Protocol = -15,
    /// A bug in this library (including a caught panic).
    Internal = -16,
}

impl Code {
    /// Every code, for tables in the bindings.
    pub const ALL: [Code; 16] = [
        Code::InvalidArgument,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::FailedPrecondition,
        Code::ResourceExhausted,
        Code::OutOfRange,
        Code::Unavailable,
        Code::TimedOut,
        Code::Busy,
        Code::Io,
        Code::Integrity,
        Code::Closed,
        Code::Unsupported,
        Code::Protocol,
        Code::Internal,
    ];

    /// The code's name, as the bindings spell it (`NOT_FOUND`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::NotFound => "NOT_FOUND",
            Code::AlreadyExists => "ALREADY_EXISTS",
            Code::PermissionDenied => "PERMISSION_DENIED",
            Code::FailedPrecondition => "FAILED_PRECONDITION",
            Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Code::OutOfRange => "OUT_OF_RANGE",
            Code::Unavailable => "UNAVAILABLE",
            Code::TimedOut => "TIMED_OUT",
            Code::Busy => "BUSY",
            Code::Io => "IO",
            Code::Integrity => "INTEGRITY",
            Code::Closed => "CLOSED",
            Code::Unsupported => "UNSUPPORTED",
            Code::Protocol => "PROTOCOL",
            Code::Internal => "INTERNAL",
        }
    }

    /// The code for a data-plane completion status (`None` for `Ok`).
    pub fn from_io_status(status: IoStatus) -> Option<Code> {
        Some(match status {
            IoStatus::Ok => return None,
            IoStatus::Malformed | IoStatus::BadRegion | IoStatus::BadHandle | IoStatus::TooLarge => {
                Code::InvalidArgument
            }
            IoStatus::OutOfRange => Code::OutOfRange,
            IoStatus::Access => Code::PermissionDenied,
            IoStatus::Io => Code::Io,
            IoStatus::Busy => Code::Busy,
            IoStatus::Integrity => Code::Integrity,
            IoStatus::Cancelled | IoStatus::Lost | IoStatus::Unavailable => Code::Unavailable,
            _ => Code::Internal,
        })
    }

    fn from_grpc(code: tonic::Code) -> Code {
        use tonic::Code as G;
        match code {
            G::InvalidArgument => Code::InvalidArgument,
            G::NotFound => Code::NotFound,
            G::AlreadyExists => Code::AlreadyExists,
            G::PermissionDenied | G::Unauthenticated => Code::PermissionDenied,
            G::FailedPrecondition => Code::FailedPrecondition,
            G::ResourceExhausted => Code::ResourceExhausted,
            G::OutOfRange => Code::OutOfRange,
            G::Unavailable | G::Cancelled | G::Aborted => Code::Unavailable,
            G::DeadlineExceeded => Code::TimedOut,
            G::Unimplemented => Code::Unsupported,
            G::DataLoss => Code::Integrity,
            G::Ok | G::Unknown | G::Internal => Code::Internal,
        }
    }
}

/// An error with its [`Code`] and a message for people (names the operation, the
/// path and the agent's reason).
#[derive(Debug, Clone)]
pub struct Failure {
    pub code: Code,
    pub message: String,
}

impl Failure {
    pub fn new(code: Code, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into() }
    }
    pub fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(Code::InvalidArgument, message)
    }
    pub fn closed(message: impl Into<String>) -> Failure {
        Failure::new(Code::Closed, message)
    }
    /// A failed data-plane request.
    pub fn io(op: &str, status: IoStatus) -> Failure {
        Failure::new(
            Code::from_io_status(status).unwrap_or(Code::Internal),
            format!("{op}: {} ({status:?})", status.describe()),
        )
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let message = e.to_string();
        let code = match &e {
            Error::Address { .. } => Code::InvalidArgument,
            Error::Connect { .. } => Code::Unavailable,
            // No usable client certificate, key or CA: the caller's settings.
            Error::Tls { .. } => Code::InvalidArgument,
            Error::Agent { code, .. } => Code::from_grpc(*code),
            // The shim's only timed wait; its message says what is missing.
            Error::DataPlane { op, .. } if op == "wait for completions" => Code::TimedOut,
            Error::DataPlane { .. } => Code::Unavailable,
            Error::Io { status, .. } => Code::from_io_status(*status).unwrap_or(Code::Internal),
            Error::Protocol { .. } => Code::Protocol,
        };
        Failure { code, message }
    }
}

pub type Result<T> = std::result::Result<T, Failure>;

/// How long to wait for a runtime to stop when a session is dropped.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);
/// Data-plane requests the agent refused with `Busy` are submitted again this many
/// times, with growing pauses, before the caller sees [`Code::Busy`].
const BUSY_RETRIES: u32 = 12;

/// One attached client with its own runtime, callable from plain threads.
pub struct Session {
    runtime: Option<tokio::runtime::Runtime>,
    client: Option<Client>,
    pid: u32,
    detached: AtomicBool,
    max_io_bytes: u64,
    data_plane: bool,
    rings: usize,
    timeout: Duration,
    agent: String,
}

impl Session {
    /// Start a runtime, connect and attach. Blocking.
    pub fn attach(options: ConnectOptions) -> Result<Session> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dpuio-runtime")
            .enable_all()
            .build()
            .map_err(|e| Failure::new(Code::Internal, format!("start the dpuio runtime: {e}")))?;
        ensure_outside_runtime()?;
        let data_plane = options.data_plane.clone();
        let agent = options.agent.clone();
        let client = runtime.block_on(Client::connect(options))?;
        let max_io_bytes = client.limits().max_io_bytes;
        Ok(Session {
            runtime: Some(runtime),
            client: Some(client),
            pid: std::process::id(),
            detached: AtomicBool::new(false),
            // An agent that states no limit still gets requests of a sane size.
            max_io_bytes: if max_io_bytes == 0 { 64 << 20 } else { max_io_bytes },
            data_plane: data_plane.is_some(),
            rings: data_plane.as_ref().map_or(0, |d| d.rings),
            timeout: data_plane.map_or(Duration::from_secs(60), |d| d.timeout),
            agent,
        })
    }

    /// The client, unless the session was detached or belongs to another process.
    pub fn client(&self) -> Result<&Client> {
        if self.pid != std::process::id() {
            return Err(Failure::closed(format!(
                "this dpuio client was attached by process {} and cannot be used in process {} \
                 (after fork, attach a new client in the child)",
                self.pid,
                std::process::id()
            )));
        }
        if self.detached.load(Ordering::Acquire) {
            return Err(Failure::closed("the dpuio client is detached"));
        }
        self.client.as_ref().ok_or_else(|| Failure::closed("the dpuio client is detached"))
    }

    /// Like [`Session::client`], and the client must have a data plane.
    pub fn data_client(&self) -> Result<&Client> {
        let client = self.client()?;
        if !self.data_plane {
            return Err(Failure::invalid("this client attached without a data plane (transports \"none\")"));
        }
        Ok(client)
    }

    /// Run a future to completion on the calling thread.
    pub fn run<T>(&self, f: impl std::future::Future<Output = T>) -> Result<T> {
        ensure_outside_runtime()?;
        let runtime = self.runtime.as_ref().ok_or_else(|| Failure::closed("the dpuio client is detached"))?;
        Ok(runtime.block_on(f))
    }

    /// Run a future on the session's runtime in the background (for clean-up from
    /// destructors that may run inside the runtime).
    pub fn spawn(&self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        if let Some(runtime) = &self.runtime {
            drop(runtime.spawn(f));
        }
    }

    /// Whether the calling thread can block on this session's runtime now.
    pub fn can_block(&self) -> bool {
        tokio::runtime::Handle::try_current().is_err()
    }

    /// True when used in a process other than the one that attached (after fork).
    pub fn is_foreign(&self) -> bool {
        self.pid != std::process::id()
    }

    /// End the session at the agent. Later calls fail with [`Code::Closed`].
    pub fn detach(&self) -> Result<()> {
        let client = self.client()?.clone();
        if self.detached.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.run(client.detach())?.map_err(Failure::from)
    }

    pub fn is_detached(&self) -> bool {
        self.detached.load(Ordering::Acquire)
    }

    /// Largest request the agent takes; longer ones are split by [`Session::submit`].
    pub fn max_io_bytes(&self) -> u64 {
        self.max_io_bytes
    }

    /// Rings of the data plane (how many threads can have requests in flight at once).
    pub fn rings(&self) -> usize {
        self.rings
    }

    /// How long a data-plane wait may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The agent address this session attached to.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// Submit requests and wait for all of them (blocking, on the caller's thread).
    ///
    /// Requests longer than the agent's `max_io_bytes` are split; results come back in
    /// request order as bytes moved (for a split read, the sum of its pieces). Pieces
    /// the agent refused with `Busy` are submitted again after a growing pause, a few
    /// times, before `Busy` is reported. The first failed piece decides a request's
    /// result.
    pub fn submit(&self, requests: &[Request]) -> Result<Vec<std::result::Result<u64, IoStatus>>> {
        let client = self.data_client()?;
        let max = self.max_io_bytes;
        // pieces[p] belongs to requests[owner[p]]; user_data carries p.
        let mut pieces = Vec::with_capacity(requests.len());
        let mut owner = Vec::with_capacity(requests.len());
        for (i, r) in requests.iter().enumerate() {
            if r.length == 0 {
                continue; // nothing to move; the agent would call it malformed
            }
            let mut at = 0;
            loop {
                let length = (r.length - at).min(max);
                pieces.push(Request {
                    region_offset: r.region_offset + at,
                    file_offset: r.file_offset + at,
                    length,
                    user_data: pieces.len() as u64,
                    ..*r
                });
                owner.push(i);
                at += length;
                if at >= r.length {
                    break;
                }
            }
        }
        let mut results: Vec<std::result::Result<u64, IoStatus>> = vec![Ok(0); requests.len()];
        let mut todo = pieces.clone();
        let mut pause = Duration::from_micros(200);
        for attempt in 0..=BUSY_RETRIES {
            let mut again = Vec::new();
            for d in client.submit_blocking(&todo)? {
                let p = d.user_data as usize;
                let i = *owner
                    .get(p)
                    .ok_or_else(|| Failure::new(Code::Protocol, format!("completion for unknown request {p}")))?;
                match d.result {
                    Err(IoStatus::Busy) if attempt < BUSY_RETRIES => again.push(pieces[p]),
                    Err(status) => {
                        if results[i].is_ok() {
                            results[i] = Err(status);
                        }
                    }
                    Ok(n) => {
                        if let Ok(total) = &mut results[i] {
                            *total += n;
                        }
                    }
                }
            }
            if again.is_empty() {
                break;
            }
            todo = again;
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        Ok(results)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.is_foreign() {
            // After fork: the runtime's threads and the UCX worker's progress state
            // exist only in the parent. Leak both (see the module docs).
            std::mem::forget(self.client.take());
            std::mem::forget(self.runtime.take());
            return;
        }
        let client = self.client.take();
        if let (Some(client), Some(runtime)) = (client, self.runtime.as_ref()) {
            // The last reference is gone without a detach: end the session now rather
            // than leave it to the lease (only where blocking is allowed).
            if !self.detached.load(Ordering::Acquire) && tokio::runtime::Handle::try_current().is_err() {
                let _ = runtime.block_on(async { tokio::time::timeout(SHUTDOWN_TIMEOUT, client.detach()).await });
            }
        }
        if let Some(runtime) = self.runtime.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                runtime.shutdown_background();
            } else {
                runtime.shutdown_timeout(SHUTDOWN_TIMEOUT);
            }
        }
    }
}

fn ensure_outside_runtime() -> Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Failure::new(
            Code::InvalidArgument,
            "dpuio blocking calls cannot be made from inside a tokio runtime (use dpuio_shim directly there)",
        ));
    }
    Ok(())
}

/// A directory listing streamed in batches from a background thread, so a huge
/// directory never has to fit in memory and the caller can stop early.
pub struct DirStream {
    rx: mpsc::Receiver<Result<Vec<DirEntry>>>,
    batch: std::vec::IntoIter<DirEntry>,
    finished: bool,
}

impl DirStream {
    /// Start listing `path` in batches of `batch_size` entries (0: the agent's choice).
    pub fn open(session: &Session, path: &str, batch_size: u32) -> Result<DirStream> {
        let client = session.client()?.clone();
        let runtime = session.runtime.as_ref().ok_or_else(|| Failure::closed("the dpuio client is detached"))?;
        let handle = runtime.handle().clone();
        // One batch ahead: enough to overlap the next round trip with the caller's work.
        let (tx, rx) = mpsc::sync_channel::<Result<Vec<DirEntry>>>(1);
        let path = path.to_owned();
        // A blocking-pool thread may block on the channel; a runtime worker may not.
        drop(runtime.spawn_blocking(move || {
            let result = handle.block_on(
                client.readdir_batches(&path, None, batch_size, |batch| tx.send(Ok(batch)).map_err(|_| abandoned())),
            );
            match result {
                Ok(()) => {}
                Err(e) if is_abandoned(&e) => {}
                Err(e) => {
                    let _ = tx.send(Err(e.into()));
                }
            }
        }));
        Ok(DirStream { rx, batch: Vec::new().into_iter(), finished: false })
    }

    /// The next entry, `None` at the end. Blocking.
    pub fn next_entry(&mut self) -> Result<Option<DirEntry>> {
        loop {
            if let Some(e) = self.batch.next() {
                return Ok(Some(e));
            }
            if self.finished {
                return Ok(None);
            }
            match self.rx.recv() {
                Ok(Ok(batch)) => self.batch = batch.into_iter(),
                Ok(Err(e)) => {
                    self.finished = true;
                    return Err(e);
                }
                Err(mpsc::RecvError) => self.finished = true,
            }
        }
    }

    /// The next whole batch, `None` at the end. Blocking.
    pub fn next_batch(&mut self) -> Result<Option<Vec<DirEntry>>> {
        let rest: Vec<DirEntry> = self.batch.by_ref().collect();
        if !rest.is_empty() {
            return Ok(Some(rest));
        }
        if self.finished {
            return Ok(None);
        }
        match self.rx.recv() {
            Ok(Ok(batch)) => Ok(Some(batch)),
            Ok(Err(e)) => {
                self.finished = true;
                Err(e)
            }
            Err(mpsc::RecvError) => {
                self.finished = true;
                Ok(None)
            }
        }
    }
}

const ABANDONED: &str = "listing abandoned by the caller";

fn abandoned() -> Error {
    Error::Protocol { op: "readdir".into(), reason: ABANDONED.into() }
}

fn is_abandoned(e: &Error) -> bool {
    matches!(e, Error::Protocol { reason, .. } if reason == ABANDONED)
}

/// A value that belongs to the process that made it: dropped normally there, leaked
/// in any other (a forked child), where its destructor would touch the parent's UCX
/// or runtime state.
pub struct ProcessLocal<T> {
    value: Option<T>,
    pid: u32,
}

impl<T> ProcessLocal<T> {
    pub fn new(value: T) -> ProcessLocal<T> {
        ProcessLocal { value: Some(value), pid: std::process::id() }
    }

    /// The value, in the process that made it.
    pub fn get(&self) -> Result<&T> {
        self.check()?;
        self.value.as_ref().ok_or_else(|| Failure::closed("the object was closed"))
    }

    /// The value, mutably, in the process that made it.
    pub fn get_mut(&mut self) -> Result<&mut T> {
        self.check()?;
        self.value.as_mut().ok_or_else(|| Failure::closed("the object was closed"))
    }

    /// Take the value out (to close it), in the process that made it.
    pub fn take(&mut self) -> Result<T> {
        self.check()?;
        self.value.take().ok_or_else(|| Failure::closed("the object was closed already"))
    }

    pub fn is_present(&self) -> bool {
        self.value.is_some()
    }

    fn check(&self) -> Result<()> {
        if self.pid != std::process::id() {
            return Err(Failure::closed(format!(
                "this dpuio object was made by process {} and cannot be used in process {} (after fork, \
                 make it again in the child)",
                self.pid,
                std::process::id()
            )));
        }
        Ok(())
    }
}

impl<T> Drop for ProcessLocal<T> {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            std::mem::forget(self.value.take());
        }
    }
}
