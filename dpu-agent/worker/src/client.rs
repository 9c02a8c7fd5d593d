//! The agent's side: [`WorkerBackend`], a [`Backend`] whose calls run in a tenant's
//! worker process.
//!
//! Each call takes an idle channel (or makes one and hands its other end to the worker),
//! sends its request and waits for the reply; payload goes through a staging slot.
//! Containers and objects remember the worker process they were opened in; when that
//! worker is gone (killed, crashed) the next call starts a new one, mounts and reopens
//! what it needs there (an object without its create, exclusive and truncate flags: the
//! file exists by then), and makes the call again, once. So a tenant's jobs continue
//! across a worker's death as they do across an agent restart, and no other tenant's
//! worker is touched.
//!
//! The lost worker may have made the call before it died. A call that cannot run twice
//! with the same answer is settled by what its second run finds
//! ([`Shared::call_again_settled`]): a remove answered "no such file" and a rename whose
//! source is gone and whose target is there had run; an exclusive create of a put's
//! temporary file (a name unique to that put, [`dpuio_proto::put`]) that finds the file
//! opens it. An exclusive create of any other name keeps its "already exists": whether
//! this call or another made the file cannot be told apart.

use std::cell::Cell;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dpuio_backend::{
    Attr, Backend, Container, DirEntry, Error, HostBytes, HostBytesMut, LentMemory, NsPath, Object, OpenOptions,
    Result, Staged,
};

use crate::control::{self, Control};
use crate::host::{Holder, HostFile};
use crate::link::Link;
use crate::lock;
use crate::spawn::{self, Identity};
use crate::staging::{Slot, Staging};
use crate::wire::{self, Piece, Reply, Request, Setup};

/// Staging slots per worker: pieces in flight at once before one waits (two I/O
/// threads with a batch of 32 each).
const STAGING_SLOTS: usize = 64;
/// Channels kept idle per worker; more are closed when returned.
const IDLE_CHANNELS: usize = 32;
/// Least time between two starts of one tenant's worker, so a worker that dies at once
/// does not spin.
const RESTART_PAUSE: Duration = Duration::from_secs(1);
/// How long a worker may take to answer a host region's offer ([`crate::host`]); one
/// that does not keeps that region's pieces on staging.
const CONTROL_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// A backend run by a tenant's worker process, as `identity`.
pub struct WorkerBackend {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) tenant: String,
    identity: Identity,
    setup: Setup,
    exe: PathBuf,
    pub(crate) slot_bytes: u64,
    /// How long the worker may take to open DAOS before the start is given up.
    start_timeout: Duration,
    current: Mutex<Option<Arc<Process>>>,
    generation: AtomicU64,
    restarts: AtomicU64,
    /// Pieces sent to a worker in host memory it mapped, and in staging slots.
    pub(crate) host_pieces: AtomicU64,
    pub(crate) staged_pieces: AtomicU64,
    last_start: Mutex<Option<Instant>>,
    /// DAOS retry counters of the tenant's workers that are gone, as they last
    /// published them.
    retired: Mutex<dpuio_daos::RetryStats>,
}

/// One worker process and what the agent holds of it.
pub(crate) struct Process {
    pub(crate) generation: u64,
    child: Mutex<Child>,
    control: OwnedFd,
    channels: Mutex<Vec<Channel>>,
    pub(crate) staging: Arc<Staging>,
    /// The host regions offered to it ([`crate::host`]): whether it mapped each.
    host_regions: Mutex<HashMap<u64, bool>>,
    /// Held while a region is offered: the worker's answer is the next control message.
    host_offering: Mutex<()>,
    pub(crate) lost: AtomicBool,
}

/// One channel to a worker, read through a buffer: a batch's piece reports often arrive
/// together, and each would otherwise cost two reads. A read waits only while the worker
/// beats ([`Link`]).
pub(crate) type Channel = std::io::BufReader<Link>;

/// Why a call did not get a reply: the worker process is gone (or its channel broke).
pub(crate) struct Lost(pub(crate) io::Error);

/// A call's failure: the backend's error, or the worker lost (tried again elsewhere).
pub(crate) enum Fault {
    Backend(Error),
    Lost(Lost),
}

impl From<Error> for Fault {
    fn from(e: Error) -> Fault {
        Fault::Backend(e)
    }
}

impl From<Lost> for Fault {
    fn from(l: Lost) -> Fault {
        Fault::Lost(l)
    }
}

impl WorkerBackend {
    /// A backend for `tenant` whose DAOS calls run as `identity` in a worker started from
    /// `exe` (the agent's own executable). The worker starts on first use.
    pub fn new(tenant: &str, identity: Identity, setup: Setup, exe: PathBuf) -> WorkerBackend {
        let slot_bytes = setup.chunk_bytes.max(1 << 20);
        crate::host::wanted();
        let start_timeout = Duration::from_millis(setup.retry_ms) + Duration::from_secs(60);
        WorkerBackend {
            shared: Arc::new(Shared {
                tenant: tenant.to_owned(),
                identity,
                setup,
                exe,
                slot_bytes,
                start_timeout,
                current: Mutex::new(None),
                generation: AtomicU64::new(0),
                restarts: AtomicU64::new(0),
                host_pieces: AtomicU64::new(0),
                staged_pieces: AtomicU64::new(0),
                last_start: Mutex::new(None),
                retired: Mutex::default(),
            }),
        }
    }

    /// Pieces of mapped I/O its workers ran straight in host memory and through staging
    /// ([`crate::host`]), since start.
    pub fn pieces(&self) -> (u64, u64) {
        (self.shared.host_pieces.load(Ordering::Relaxed), self.shared.staged_pieces.load(Ordering::Relaxed))
    }

    /// The DAOS retry counters of the tenant's workers, this one and those before it
    /// (as each last published them, up to half a second old).
    pub fn retry_stats(&self) -> dpuio_daos::RetryStats {
        let mut stats = *lock(&self.shared.retired);
        if let Some(p) = lock(&self.shared.current).as_ref() {
            stats += p.staging.mapping.published();
        }
        stats
    }

    /// The identity the worker runs as.
    pub fn identity(&self) -> &Identity {
        &self.shared.identity
    }

    /// Worker processes started after the first (each a worker lost and replaced).
    pub fn restarts(&self) -> u64 {
        self.shared.restarts.load(Ordering::Relaxed)
    }

    /// The owner and ACL entries of `container`, read by the worker as the tenant's user
    /// (what `daos container get-acl` shows).
    pub fn acl(&self, container: &str) -> Result<(String, Vec<String>)> {
        let c = WorkerContainer::mount(&self.shared, container, false, "")?;
        match self.shared.call(|p| Ok(Request::Acl { container: c.id(p)? }))? {
            Reply::Acl { owner, entries } => Ok((owner, entries)),
            other => Err(unexpected(other)),
        }
    }

    /// Stop the worker (the agent is stopping): its control socket closes and it exits.
    pub fn stop(&self) {
        if let Some(p) = lock(&self.shared.current).take() {
            p.retire();
        }
    }
}

impl Drop for WorkerBackend {
    fn drop(&mut self) {
        self.stop();
    }
}

/// ACL entries of a tenant's container that admit a principal other than the tenant's
/// own user, and an owner other than it: what `check-config` and `serve` name. Deny
/// entries (`D:`) and audit or alarm entries (`U:`, `L:`) admit no one.
pub fn foreign_principals(identity: &Identity, owner: &str, entries: &[String]) -> Vec<String> {
    let me = format!("{}@", identity.user);
    let mut out = Vec::new();
    if owner != me {
        out.push(format!("owner {owner} (not {me})"));
    }
    for entry in entries {
        let mut fields = entry.splitn(4, ':');
        let (kind, _flags, principal) = (fields.next().unwrap_or(""), fields.next(), fields.next().unwrap_or(""));
        if kind.contains('A') && principal != "OWNER@" && principal != me {
            out.push(entry.clone());
        }
    }
    out
}

impl Shared {
    /// The running worker, started if there is none (or it was lost).
    pub(crate) fn process(&self) -> Result<Arc<Process>> {
        let mut current = lock(&self.current);
        if let Some(p) = current.as_ref().filter(|p| !p.lost.load(Ordering::Relaxed)) {
            return Ok(p.clone());
        }
        if let Some(old) = current.take() {
            old.retire();
            *lock(&self.retired) += old.staging.mapping.published();
        }
        {
            let mut last = lock(&self.last_start);
            if let Some(wait) = last.and_then(|t| RESTART_PAUSE.checked_sub(t.elapsed())) {
                std::thread::sleep(wait);
            }
            *last = Some(Instant::now());
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        if generation > 1 {
            self.restarts.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(tenant = self.tenant, generation, "restarting the tenant's DAOS worker");
        }
        let process = Arc::new(self.start(generation)?);
        *current = Some(process.clone());
        Ok(process)
    }

    fn start(&self, generation: u64) -> Result<Process> {
        let unavailable = |reason: String| Error::Unavailable {
            what: format!("the DAOS worker of tenant {:?} (user {})", self.tenant, self.identity.user),
            reason,
        };
        let staging = Staging::new(&format!("dpuio-staging-{}", self.tenant), STAGING_SLOTS, self.slot_bytes)
            .map(Arc::new)
            .map_err(|e| unavailable(format!("cannot make its staging memory: {e}")))?;
        let (ours, theirs) =
            control::pair().map_err(|e| unavailable(format!("cannot make its control socket: {e}")))?;
        let child = spawn::start(&self.exe, &self.tenant, &self.identity, theirs).map_err(|e| {
            unavailable(format!(
                "cannot start {} as {}:{}: {e}",
                self.exe.display(),
                self.identity.user,
                self.identity.group
            ))
        })?;
        let process = Process {
            generation,
            child: Mutex::new(child),
            control: ours,
            channels: Mutex::new(Vec::new()),
            staging,
            host_regions: Mutex::new(HashMap::new()),
            host_offering: Mutex::new(()),
            lost: AtomicBool::new(false),
        };
        let ready = (|| {
            control::send(
                process.control.as_fd(),
                &Control::Hello(self.setup.clone()),
                Some(process.staging.mapping.fd()),
            )?;
            rustix::net::sockopt::set_socket_timeout(
                &process.control,
                rustix::net::sockopt::Timeout::Recv,
                Some(self.start_timeout),
            )?;
            let answer = control::recv(process.control.as_fd());
            rustix::net::sockopt::set_socket_timeout(&process.control, rustix::net::sockopt::Timeout::Recv, None)?;
            answer
        })();
        match ready {
            Ok((Control::Ready, _)) => {
                tracing::info!(
                    tenant = self.tenant,
                    user = self.identity.user,
                    group = self.identity.group,
                    pid = lock(&process.child).id(),
                    generation,
                    "tenant DAOS worker started"
                );
                Ok(process)
            }
            Ok((Control::Failed(e), _)) => {
                process.retire();
                Err(e.into())
            }
            Ok((other, _)) => {
                process.retire();
                Err(unavailable(format!("it answered its setup with {other:?}")))
            }
            Err(e) => {
                process.retire();
                Err(unavailable(format!("it did not get ready: {e} (see its log lines above)")))
            }
        }
    }

    /// Run `f` on the current worker; if that worker is lost, once more on a new one.
    fn with_process<T>(&self, mut f: impl FnMut(&Process) -> std::result::Result<T, Fault>) -> Result<T> {
        let mut last = None;
        for _ in 0..2 {
            let process = self.process()?;
            match f(&process) {
                Ok(value) => return Ok(value),
                Err(Fault::Backend(e)) => return Err(e),
                Err(Fault::Lost(Lost(e))) => {
                    tracing::warn!(tenant = self.tenant, generation = process.generation, error = %e,
                        "lost the tenant's DAOS worker; calling again on a new one");
                    process.lost.store(true, Ordering::Relaxed);
                    last = Some(e);
                }
            }
        }
        Err(Error::Unavailable {
            what: format!("the DAOS worker of tenant {:?}", self.tenant),
            reason: format!("lost twice in one call: {}", last.map(|e| e.to_string()).unwrap_or_default()),
        })
    }

    /// Make the request `make` builds; a [`Reply::Failed`] is the backend's error.
    fn call(&self, make: impl Fn(&Process) -> std::result::Result<Request, Fault>) -> Result<Reply> {
        self.with_process(|p| match p.call(&make(p)?)? {
            Reply::Failed(e) => Err(Fault::Backend(e.into())),
            reply => Ok(reply),
        })
    }

    /// As [`Shared::call`], for a call whose second run, after the worker that was sent
    /// it died, may find it made: `had_run` tells from such a run's error whether the
    /// lost worker had made it (`Ok(None)`), else the error stands.
    fn call_again_settled(
        &self,
        make: impl Fn(&Process) -> std::result::Result<Request, Fault>,
        had_run: impl Fn(&Error) -> bool,
    ) -> Result<Option<Reply>> {
        let sent = Cell::new(false);
        self.with_process(|p| {
            let request = make(p)?;
            let again = sent.replace(true);
            match p.call(&request)? {
                Reply::Failed(e) if again => {
                    let e = Error::from(e);
                    if !had_run(&e) {
                        return Err(Fault::Backend(e));
                    }
                    tracing::warn!(tenant = self.tenant, answer = %e,
                        "a call made again after its DAOS worker was lost had run before; taken as done");
                    Ok(None)
                }
                Reply::Failed(e) => Err(Fault::Backend(e.into())),
                reply => Ok(Some(reply)),
            }
        })
    }
}

impl Process {
    fn call(&self, request: &Request) -> std::result::Result<Reply, Lost> {
        let mut channel = self.channel()?;
        wire::send(channel.get_mut(), request).map_err(Lost)?;
        let reply = wire::recv(&mut channel).map_err(Lost)?;
        self.give_back(channel);
        Ok(reply)
    }

    /// An idle channel, or a new one (its other end handed to the worker).
    pub(crate) fn channel(&self) -> std::result::Result<Channel, Lost> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(Lost(io::Error::other("worker already lost")));
        }
        if let Some(c) = lock(&self.channels).pop() {
            return Ok(c);
        }
        let (ours, theirs) = UnixStream::pair().map_err(Lost)?;
        control::send(self.control.as_fd(), &Control::Channel, Some(theirs.as_fd())).map_err(Lost)?;
        Ok(Channel::new(Link::new(ours, self.staging.clone())))
    }

    /// Whether the worker has `file` mapped, offering it first if it has not seen it.
    pub(crate) fn has_host(self: &Arc<Self>, file: &Arc<HostFile>) -> bool {
        if let Some(&mapped) = lock(&self.host_regions).get(&file.id) {
            return mapped;
        }
        let _offering = lock(&self.host_offering);
        if let Some(&mapped) = lock(&self.host_regions).get(&file.id) {
            return mapped;
        }
        let offer = Control::HostMemory { id: file.id, offset: file.file_offset, len: file.len as u64 };
        let mapped = match self.offer_host(&offer, file.file(), file.id) {
            Ok(None) => true,
            Ok(Some(error)) => {
                tracing::warn!(
                    region = file.id,
                    error,
                    "a tenant worker could not map a host region: its pieces go through staging"
                );
                false
            }
            Err(e) => {
                tracing::warn!(region = file.id, error = %e,
                    "a tenant worker did not answer a host region's offer: its pieces go through staging");
                false
            }
        };
        lock(&self.host_regions).insert(file.id, mapped);
        if mapped {
            let holder: Arc<dyn Holder> = self.clone();
            file.held_by(Arc::downgrade(&holder));
        }
        mapped
    }

    /// Send `offer` (with the region's file) on the control socket and wait, at most
    /// [`CONTROL_ANSWER_TIMEOUT`], for the worker's [`Control::HostMapped`] of `id`: the
    /// error it could not map it with, if any (an answer to an earlier offer that came
    /// too late is passed over).
    fn offer_host(&self, offer: &Control, file: BorrowedFd<'_>, id: u64) -> io::Result<Option<String>> {
        control::send(self.control.as_fd(), offer, Some(file))?;
        let deadline = Instant::now() + CONTROL_ANSWER_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer within {} s", CONTROL_ANSWER_TIMEOUT.as_secs()),
                ));
            }
            rustix::net::sockopt::set_socket_timeout(&self.control, rustix::net::sockopt::Timeout::Recv, Some(left))?;
            let answer = control::recv(self.control.as_fd());
            rustix::net::sockopt::set_socket_timeout(&self.control, rustix::net::sockopt::Timeout::Recv, None)?;
            match answer? {
                (Control::HostMapped { id: answered, error }, _) if answered == id => return Ok(error),
                (Control::HostMapped { .. }, _) => continue,
                (other, _) => return Err(io::Error::other(format!("unexpected answer {other:?}"))),
            }
        }
    }

    /// A channel whose last reply was read in full, for the next call.
    pub(crate) fn give_back(&self, channel: Channel) {
        let mut idle = lock(&self.channels);
        if idle.len() < IDLE_CHANNELS {
            idle.push(channel);
        }
    }

    /// Close the control socket and reap the child (killed if it does not go).
    fn retire(&self) {
        self.lost.store(true, Ordering::Relaxed);
        let _ = rustix::net::shutdown(&self.control, rustix::net::Shutdown::Both);
        lock(&self.channels).clear();
        let mut child = lock(&self.child);
        for _ in 0..50 {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Holder for Process {
    fn forget_host(&self, id: u64) {
        if lock(&self.host_regions).remove(&id) == Some(true) && !self.lost.load(Ordering::Relaxed) {
            // A worker that does not get it is lost or going: its mappings go with it.
            let _ = control::send(self.control.as_fd(), &Control::ForgetHostMemory { id }, None);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Ok(None) = child.try_wait() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Backend for WorkerBackend {
    fn kind(&self) -> &'static str {
        "daos"
    }

    fn mount(&self, container: &str, create: bool) -> Result<Arc<dyn Container>> {
        self.mount_with_class(container, create, "")
    }

    fn mount_with_class(&self, container: &str, create: bool, object_class: &str) -> Result<Arc<dyn Container>> {
        Ok(WorkerContainer::mount(&self.shared, container, create, object_class)?)
    }
}

/// Which worker a container or object id belongs to, and the id there.
#[derive(Default)]
struct Remote {
    generation: u64,
    id: u64,
}

/// A container mounted in the tenant's worker.
pub struct WorkerContainer {
    /// This container itself, for the objects opened in it (they remount it in a new
    /// worker through it, once for all of them).
    me: std::sync::Weak<WorkerContainer>,
    shared: Arc<Shared>,
    name: String,
    object_class: String,
    chunk_bytes: u64,
    remote: Mutex<Remote>,
}

impl WorkerContainer {
    fn mount(shared: &Arc<Shared>, name: &str, create: bool, object_class: &str) -> Result<Arc<WorkerContainer>> {
        let request = Request::Mount { container: name.to_owned(), create, object_class: object_class.to_owned() };
        let (generation, id, chunk_bytes) = shared.with_process(|p| match p.call(&request)? {
            Reply::Mounted { container, chunk_bytes } => Ok((p.generation, container, chunk_bytes)),
            Reply::Failed(e) => Err(Fault::Backend(e.into())),
            other => Err(Fault::Backend(unexpected(other))),
        })?;
        Ok(Arc::new_cyclic(|me| WorkerContainer {
            me: me.clone(),
            shared: shared.clone(),
            name: name.to_owned(),
            object_class: object_class.to_owned(),
            chunk_bytes,
            remote: Mutex::new(Remote { generation, id }),
        }))
    }

    /// The container's id in `process`, mounting it there first if it is a newer worker.
    fn id(&self, process: &Process) -> std::result::Result<u64, Fault> {
        let mut remote = lock(&self.remote);
        if remote.generation != process.generation {
            let request =
                Request::Mount { container: self.name.clone(), create: false, object_class: self.object_class.clone() };
            match process.call(&request)? {
                Reply::Mounted { container, .. } => *remote = Remote { generation: process.generation, id: container },
                Reply::Failed(e) => return Err(Fault::Backend(e.into())),
                other => return Err(Fault::Backend(unexpected(other))),
            }
        }
        Ok(remote.id)
    }

    fn done(&self, make: impl Fn(&Process, u64) -> Request) -> Result<()> {
        match self.shared.call(|p| Ok(make(p, self.id(p)?)))? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// As [`WorkerContainer::done`] for a remove or rename: made again on a new worker,
    /// `had_run` tells from its error whether the lost worker had made it.
    fn done_once(&self, make: impl Fn(u64) -> Request, had_run: impl Fn(&Error) -> bool) -> Result<()> {
        match self.shared.call_again_settled(|p| Ok(make(self.id(p)?)), had_run)? {
            None | Some(Reply::Done) => Ok(()),
            Some(other) => Err(unexpected(other)),
        }
    }

    /// Whether a rename's second run that failed with `e` finds the first had run:
    /// `from` is gone and `to` is there.
    fn renamed(&self, e: &Error, to: &NsPath) -> bool {
        matches!(e, Error::NotFound { .. }) && self.stat(to).is_ok()
    }

    fn attr(&self, make: impl Fn(u64) -> Request) -> Result<Attr> {
        match self.shared.call(|p| Ok(make(self.id(p)?)))? {
            Reply::Attr(a) => Ok(a.into()),
            other => Err(unexpected(other)),
        }
    }
}

impl Container for WorkerContainer {
    fn name(&self) -> &str {
        &self.name
    }

    fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    fn stat(&self, path: &NsPath) -> Result<Attr> {
        self.attr(|container| Request::Stat { container, path: path.to_string() })
    }

    fn mkdir(&self, path: &NsPath, mode: u32) -> Result<Attr> {
        self.attr(|container| Request::Mkdir { container, path: path.to_string(), mode })
    }

    fn readdir(&self, path: &NsPath, anchor: Option<&str>, max: usize) -> Result<(Vec<DirEntry>, Option<String>)> {
        let request =
            |container| Request::Readdir { container, path: path.to_string(), anchor: anchor.map(str::to_owned), max };
        match self.shared.call(|p| Ok(request(self.id(p)?)))? {
            Reply::Listing { entries, next } => Ok((wire::entries_from_wire(entries), next)),
            other => Err(unexpected(other)),
        }
    }

    fn open(&self, path: &NsPath, options: OpenOptions, mode: u32) -> Result<Arc<dyn Object>> {
        Ok(self.open_stat(path, options, mode)?.0)
    }

    /// One call to the worker, which opens and stats there ([`Container::open_stat`] of
    /// the tenant's container: one DFS lookup, or the parent's and one `dfs_open_stat`).
    fn open_stat(&self, path: &NsPath, options: OpenOptions, mode: u32) -> Result<(Arc<dyn Object>, Attr)> {
        let container = self
            .me
            .upgrade()
            .ok_or_else(|| Error::InvalidArgument(format!("container {:?} is unmounted", self.name)))?;
        // The first open creates, truncates or fails as asked; a reopen does none. A put's
        // temporary file that an exclusive create made on a worker lost before it
        // answered is this put's (its name is unique to it): the second run opens it.
        let unique = options.exclusive && path.file_name().is_some_and(|n| dpuio_proto::put::target_of(n).is_some());
        let sent = Cell::new(false);
        let (generation, id, writable, attr) = self.shared.with_process(|p| {
            let container = self.id(p)?;
            let request = Request::Open { container, path: path.to_string(), options: options.into(), mode };
            let again = sent.replace(true);
            let reply = match p.call(&request)? {
                Reply::Failed(e)
                    if again && unique && matches!(Error::from(e.clone()), Error::AlreadyExists { .. }) =>
                {
                    tracing::warn!(tenant = self.shared.tenant, %path,
                        "a put's temporary file was made by a DAOS worker lost before it answered; opening it");
                    let options = OpenOptions { create: false, exclusive: false, truncate: false, ..options };
                    p.call(&Request::Open { container, path: path.to_string(), options: options.into(), mode })?
                }
                reply => reply,
            };
            match reply {
                Reply::Opened { object, writable, attr } => Ok((p.generation, object, writable, Attr::from(attr))),
                Reply::Failed(e) => Err(Fault::Backend(e.into())),
                other => Err(Fault::Backend(unexpected(other))),
            }
        })?;
        let object = WorkerObject {
            container,
            path: path.clone(),
            options,
            mode,
            writable,
            remote: Mutex::new(Remote { generation, id }),
        };
        Ok((Arc::new(object), attr))
    }

    fn remove(&self, path: &NsPath, recursive: bool) -> Result<()> {
        self.done_once(
            |container| Request::Remove { container, path: path.to_string(), recursive },
            |e| matches!(e, Error::NotFound { .. }),
        )
    }

    fn rename(&self, from: &NsPath, to: &NsPath) -> Result<()> {
        self.done_once(
            |container| Request::Rename { container, from: from.to_string(), to: to.to_string() },
            |e| self.renamed(e, to),
        )
    }

    fn replace(&self, from: &NsPath, to: &NsPath) -> Result<()> {
        self.done_once(
            |container| Request::Replace { container, from: from.to_string(), to: to.to_string() },
            |e| self.renamed(e, to),
        )
    }

    fn truncate(&self, path: &NsPath, size: u64) -> Result<()> {
        self.done(|_, container| Request::Truncate { container, path: path.to_string(), size })
    }

    fn sync(&self) -> Result<()> {
        self.done(|_, container| Request::Sync { container })
    }
}

/// `object` as a worker's, if it is one.
pub(crate) fn worker_object(object: &dyn Object) -> Option<&WorkerObject> {
    object.as_any()?.downcast_ref()
}

/// A file open in the tenant's worker.
pub struct WorkerObject {
    container: Arc<WorkerContainer>,
    path: NsPath,
    options: OpenOptions,
    mode: u32,
    writable: bool,
    remote: Mutex<Remote>,
}

impl WorkerObject {
    /// The object's id in `process`, reopening it there if it is a newer worker.
    pub(crate) fn id(&self, process: &Process) -> std::result::Result<u64, Fault> {
        let mut remote = lock(&self.remote);
        if remote.generation != process.generation {
            let options = OpenOptions { create: false, exclusive: false, truncate: false, ..self.options };
            let request = Request::Open {
                container: self.container.id(process)?,
                path: self.path.to_string(),
                options: options.into(),
                mode: self.mode,
            };
            match process.call(&request)? {
                Reply::Opened { object, .. } => *remote = Remote { generation: process.generation, id: object },
                Reply::Failed(e) => return Err(Fault::Backend(e.into())),
                other => return Err(Fault::Backend(unexpected(other))),
            }
        }
        Ok(remote.id)
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.container.shared
    }

    /// One piece through a staging slot, the bytes of a write coming from `fill`.
    /// Returns the bytes moved and the slot taken for it, which holds a read's bytes
    /// until it drops (none where a write's bytes were in the worker's slot already).
    fn piece(&self, offset: u64, len: u64, fill: Fill<'_>) -> Result<(u64, Option<Slot>)> {
        let staging_error = |e: io::Error| Fault::Backend(Error::InvalidArgument(e.to_string()));
        let write = !matches!(fill, Fill::Read);
        self.shared().with_process(|p| {
            let (at, slot) = match fill {
                Fill::Staged(s) if std::ptr::addr_eq(Arc::as_ptr(s.memory()), Arc::as_ptr(&p.staging)) => {
                    (s.offset() as u64, None)
                }
                _ => {
                    let slot = p.staging.take();
                    let into = || p.staging.mapping.bytes_mut(slot.offset, len).map_err(staging_error);
                    match fill {
                        Fill::Read => {}
                        Fill::Copy(bytes) => into()?.copy_from_view(bytes),
                        // The worker whose slot holds them was replaced since.
                        Fill::Staged(s) => into()?.copy_from_view(s.bytes()),
                    }
                    (slot.offset, Some(slot))
                }
            };
            let object = self.id(p)?;
            let request = Request::Io { pieces: vec![Piece { object, offset, staging: at, len, write, host: None }] };
            let mut channel = p.channel()?;
            wire::send(channel.get_mut(), &request).map_err(Lost)?;
            let mut outcome = None;
            wire::recv_pieces(&mut channel, 1, &mut |_, r| outcome = Some(r)).map_err(Lost)?;
            p.give_back(channel);
            match outcome {
                Some(Ok(n)) => Ok((n.min(len), slot)),
                Some(Err(e)) => Err(Fault::Backend(e.into())),
                None => Err(Fault::Backend(Error::InvalidArgument("the worker reported no piece".into()))),
            }
        })
    }

    /// A read's piece: its byte count and the slot holding the bytes.
    fn read_piece(&self, offset: u64, len: u64) -> Result<(u64, Slot)> {
        match self.piece(offset, len, Fill::Read)? {
            (n, Some(slot)) => Ok((n, slot)),
            (_, None) => Err(Error::InvalidArgument("a read piece without a staging slot".into())),
        }
    }
}

/// Where a piece's bytes come from.
#[derive(Clone, Copy)]
enum Fill<'a> {
    /// Nowhere: a read.
    Read,
    /// A write from the caller's memory, copied into a slot.
    Copy(HostBytes<'a>),
    /// A write whose bytes the caller put in a slot ([`Object::staging_for_write`]).
    Staged(&'a Staged),
}

impl Object for WorkerObject {
    fn path(&self) -> &NsPath {
        &self.path
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn read_into(&self, mut buf: HostBytesMut<'_>, offset: u64) -> Result<usize> {
        let slot_bytes = self.shared().slot_bytes as usize;
        let mut done = 0;
        while done < buf.len() {
            let len = (buf.len() - done).min(slot_bytes);
            let (n, slot) = self.read_piece(offset + done as u64, len as u64)?;
            let staged =
                slot.staging().mapping.bytes(slot.offset, n).map_err(|e| Error::InvalidArgument(e.to_string()))?;
            buf.slice_mut(done..done + n as usize).copy_from_view(staged);
            done += n as usize;
            if (n as usize) < len {
                break;
            }
        }
        Ok(done)
    }

    fn lends_staging(&self) -> bool {
        true
    }

    fn read_staged(&self, offset: u64, len: usize) -> Option<Result<Staged>> {
        if len as u64 > self.shared().slot_bytes {
            return None;
        }
        Some(self.read_piece(offset, len as u64).and_then(|(n, slot)| {
            let memory: Arc<dyn LentMemory> = slot.staging().clone();
            let at = slot.offset as usize;
            Staged::new(memory, at, n as usize, Box::new(slot))
                .ok_or_else(|| Error::InvalidArgument(format!("the worker read {n} bytes into a slot of {len}")))
        }))
    }

    fn write_from(&self, buf: HostBytes<'_>, offset: u64) -> Result<()> {
        let slot_bytes = self.shared().slot_bytes as usize;
        let mut done = 0;
        while done < buf.len() {
            let len = (buf.len() - done).min(slot_bytes);
            let piece = buf.slice(done..done + len);
            self.piece(offset + done as u64, len as u64, Fill::Copy(piece))?;
            done += len;
        }
        Ok(())
    }

    fn staging_for_write(&self, len: usize) -> Option<Result<Staged>> {
        if len as u64 > self.shared().slot_bytes {
            return None;
        }
        Some(self.shared().process().and_then(|p| {
            let slot = p.staging.take();
            let memory: Arc<dyn LentMemory> = p.staging.clone();
            let at = slot.offset as usize;
            Staged::new(memory, at, len, Box::new(slot))
                .ok_or_else(|| Error::InvalidArgument(format!("a write of {len} bytes does not fit a staging slot")))
        }))
    }

    fn write_staged(&self, staged: Staged, offset: u64) -> Result<()> {
        self.piece(offset, staged.len() as u64, Fill::Staged(&staged)).map(|_| ())
    }

    fn stat(&self) -> Result<Attr> {
        match self.shared().call(|p| Ok(Request::ObjectStat { object: self.id(p)? }))? {
            Reply::Attr(a) => Ok(a.into()),
            other => Err(unexpected(other)),
        }
    }

    fn truncate(&self, size: u64) -> Result<()> {
        match self.shared().call(|p| Ok(Request::ObjectTruncate { object: self.id(p)?, size }))? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    fn sync(&self) -> Result<()> {
        match self.shared().call(|p| Ok(Request::ObjectSync { object: self.id(p)? }))? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl Drop for WorkerObject {
    fn drop(&mut self) {
        let remote = lock(&self.remote);
        let current = lock(&self.container.shared.current).clone();
        if let Some(p) = current.filter(|p| p.generation == remote.generation && !p.lost.load(Ordering::Relaxed)) {
            // Best effort: a worker lost meanwhile took the object with it.
            let _ = p.call(&Request::Close { object: remote.id });
        }
    }
}

pub(crate) fn unexpected(reply: Reply) -> Error {
    Error::InvalidArgument(format!("tenant worker answered out of turn: {reply:?}"))
}
