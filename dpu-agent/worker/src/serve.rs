//! The worker process: `dpu-agent tenant-worker`, started by the agent as the tenant's
//! DAOS user. It opens the DAOS backend (its own `daos_init`, its own pool handle), then
//! serves each channel the agent hands it on a thread of its own, until the control
//! socket closes (the agent stopped or let it go) or the agent dies (parent-death
//! signal).

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dpuio_backend::{Backend, Container, Error, IoOp, IoQueue, IoRequest, NsPath, Object, Result};
use dpuio_daos::{DaosBackend, DaosContainer, DaosOptions};

use crate::control::{self, Control};
use crate::lock;
use crate::staging::{MappedFile, Mapping};
use crate::wire::{self, Piece, Reply, Request, Setup, WireAttr, WireError};

/// A test-only hook: after each mount the agent asks for, the worker also mounts the
/// container named here and logs the outcome (`test hook:`). The per-tenant identity
/// test uses it to show that DAOS itself refuses a worker another tenant's container.
pub const TEST_HOOK_MOUNT_ENV: &str = "DPUIO_TEST_HOOK_WORKER_MOUNT";

/// A test-only hook: the worker SIGKILLs itself after it made a create, remove, rename
/// or replace whose path holds the text named here, before it answers. The per-tenant
/// identity test uses it to show that such a call, made again on a new worker, answers
/// as the first run would have.
pub const TEST_HOOK_DIE_ENV: &str = "DPUIO_TEST_HOOK_WORKER_DIE_AFTER";

/// Whether [`TEST_HOOK_DIE_ENV`] names a path of `request`, a call that changes the
/// namespace.
fn test_hook_dies_after(request: &Request) -> bool {
    let Ok(text) = std::env::var(TEST_HOOK_DIE_ENV) else { return false };
    match request {
        Request::Open { path, options, .. } => options.create && path.contains(&text),
        Request::Remove { path, .. } => path.contains(&text),
        Request::Rename { from, .. } | Request::Replace { from, .. } => from.contains(&text),
        _ => false,
    }
}

/// A piece this large has its report sent at once; smaller ones wait for company.
const REPORT_AT_ONCE_BYTES: u64 = 64 << 10;
/// Reports of small pieces held before they are sent together.
const REPORTS_HELD: usize = 8;

/// Run a worker on the control socket it was started with; returns when the agent is
/// done with it. The error says why it could not serve at all.
pub fn run(control: OwnedFd) -> std::result::Result<(), String> {
    let (hello, memfd) = control::recv(control.as_fd()).map_err(|e| format!("reading the agent's setup: {e}"))?;
    let (Control::Hello(setup), Some(memfd)) = (hello, memfd) else {
        return Err("the agent's first control message was not a setup with the staging memory".into());
    };
    let staging = Mapping::map(memfd).map_err(|e| format!("mapping the staging memory: {e}"))?;
    let backend = match open_backend(&setup) {
        Ok(b) => b,
        Err(e) => {
            let _ = control::send(control.as_fd(), &Control::Failed(WireError::from(&e)), None);
            return Err(e.to_string());
        }
    };
    control::send(control.as_fd(), &Control::Ready, None).map_err(|e| format!("answering the agent: {e}"))?;
    tracing::info!(tenant = setup.tenant, uid = real_id("Uid"), gid = real_id("Gid"), "tenant worker serving");
    let staging = Arc::new(staging);
    publish_counters(staging.clone()).map_err(|e| format!("starting the counters thread: {e}"))?;
    let worker = Arc::new(Worker {
        tenant: setup.tenant.clone(),
        backend,
        staging,
        host: Mutex::new(HashMap::new()),
        containers: Mutex::new(HashMap::new()),
        objects: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
    });
    loop {
        match control::recv(control.as_fd()) {
            Ok((Control::Channel, Some(fd))) => {
                let worker = worker.clone();
                let stream = UnixStream::from(fd);
                std::thread::Builder::new()
                    .name("dpuio-worker-channel".into())
                    .spawn(move || worker.serve(stream))
                    .map_err(|e| format!("starting a channel thread: {e}"))?;
            }
            Ok((Control::HostMemory { id, offset, len }, Some(fd))) => {
                let mapped = usize::try_from(len)
                    .map_err(|_| std::io::Error::other(format!("{len} bytes do not fit this address space")))
                    .and_then(|len| MappedFile::map(fd.as_fd(), offset, len));
                let error = match mapped {
                    Ok(m) => {
                        lock(&worker.host).insert(id, Arc::new(m));
                        None
                    }
                    Err(e) => Some(format!("mapping host region {id} ({len} bytes at {offset}): {e}")),
                };
                control::send(control.as_fd(), &Control::HostMapped { id, error }, None)
                    .map_err(|e| format!("answering the agent: {e}"))?;
            }
            Ok((Control::ForgetHostMemory { id }, _)) => {
                // Pieces still running in it hold it mapped until they are done.
                lock(&worker.host).remove(&id);
            }
            Ok((other, _)) => return Err(format!("unexpected control message {other:?}")),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("control socket: {e}")),
        }
    }
}

fn open_backend(setup: &Setup) -> Result<DaosBackend> {
    let options = DaosOptions {
        pool: setup.pool.clone(),
        system: setup.system.clone(),
        agent_socket_dir: setup.agent_socket_dir.clone().into(),
        create_containers: setup.create_containers,
        chunk_bytes: setup.chunk_bytes,
        object_class: setup.object_class.clone(),
        retry: Duration::from_millis(setup.retry_ms),
        call_timeout: Duration::from_millis(setup.call_timeout_ms),
        dir_cache: Duration::from_millis(setup.dir_cache_ms),
        private_containers: true,
        redundancy_factor: setup.redundancy_factor,
        redundancy_level: setup.redundancy_level,
    };
    DaosBackend::open(options).map_err(|e| match e {
        dpuio_daos::OpenError::Pool { .. } => {
            Error::Denied { what: format!("DAOS pool {:?}", setup.pool), reason: e.to_string() }
        }
        other => Error::Unavailable { what: "DAOS".into(), reason: other.to_string() },
    })
}

/// This process's real uid or gid, from /proc (for the log line that shows the drop).
fn real_id(field: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with(field)).map(|l| l.split_whitespace().nth(1).unwrap_or("").to_owned())
        })
        .unwrap_or_default()
}

/// How often the worker publishes its DAOS retry counters for the agent's metrics.
const COUNTERS_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Publish this process's DAOS retry counters in the staging memory's counters page,
/// with a beat that says it runs, from a thread of their own (a call stuck in DAOS does
/// not stop them; the agent takes a worker that stops beating as lost).
fn publish_counters(staging: Arc<Mapping>) -> std::io::Result<()> {
    std::thread::Builder::new().name("dpuio-worker-counters".into()).spawn(move || {
        loop {
            staging.publish(&dpuio_daos::retry_stats());
            staging.beat();
            std::thread::sleep(COUNTERS_EVERY);
        }
    })?;
    Ok(())
}

struct Worker {
    tenant: String,
    backend: DaosBackend,
    staging: Arc<Mapping>,
    /// Host regions the agent lent ([`crate::host`]), by id.
    host: Mutex<HashMap<u64, Arc<MappedFile>>>,
    containers: Mutex<HashMap<u64, Arc<DaosContainer>>>,
    objects: Mutex<HashMap<u64, Arc<dyn Object>>>,
    next_id: AtomicU64,
}

impl Worker {
    fn serve(&self, stream: UnixStream) {
        // Requests are read through a buffer; replies are written whole, one write each.
        let mut stream = std::io::BufReader::new(stream);
        let mut queue: Option<Box<dyn IoQueue>> = None;
        loop {
            let request: Request = match wire::recv(&mut stream) {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return,
                Err(e) => {
                    tracing::warn!(error = %e, "tenant worker channel closed");
                    return;
                }
            };
            if let Request::Io { pieces } = &request {
                if let Err(e) = self.io(pieces, &mut queue, stream.get_mut()) {
                    tracing::warn!(error = %e, "tenant worker cannot answer the agent");
                    return;
                }
                continue;
            }
            let dies = test_hook_dies_after(&request);
            let reply = self.handle(request).unwrap_or_else(|e| Reply::Failed(WireError::from(&e)));
            if dies && !matches!(reply, Reply::Failed(_)) {
                tracing::warn!(tenant = self.tenant, "test hook: dying before answering");
                let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
            }
            if let Err(e) = wire::send(stream.get_mut(), &reply) {
                tracing::warn!(error = %e, "tenant worker cannot answer the agent");
                return;
            }
        }
    }

    fn container(&self, id: u64) -> Result<Arc<DaosContainer>> {
        lock(&self.containers).get(&id).cloned().ok_or_else(|| unknown("container", id))
    }

    fn object(&self, id: u64) -> Result<Arc<dyn Object>> {
        lock(&self.objects).get(&id).cloned().ok_or_else(|| unknown("object", id))
    }

    fn handle(&self, request: Request) -> Result<Reply> {
        let path = |p: &str| NsPath::parse(p);
        Ok(match request {
            Request::Mount { container, create, object_class } => {
                let c = self.backend.open_container(&container, create, &object_class)?;
                if let Ok(name) = std::env::var(TEST_HOOK_MOUNT_ENV) {
                    match self.backend.open_container(&name, false, "") {
                        Ok(_) => tracing::warn!(tenant = self.tenant, container = name, "test hook: mounted"),
                        Err(e) => {
                            tracing::warn!(tenant = self.tenant, container = name, error = %e, "test hook: mount refused")
                        }
                    }
                }
                let chunk_bytes = c.chunk_bytes();
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                lock(&self.containers).insert(id, c);
                Reply::Mounted { container: id, chunk_bytes }
            }
            Request::Acl { container } => {
                let (owner, entries) = self.container(container)?.acl()?;
                Reply::Acl { owner, entries }
            }
            Request::Stat { container, path: p } => {
                Reply::Attr(WireAttr::from(&self.container(container)?.stat(&path(&p)?)?))
            }
            Request::Mkdir { container, path: p, mode } => {
                Reply::Attr(WireAttr::from(&self.container(container)?.mkdir(&path(&p)?, mode)?))
            }
            Request::Readdir { container, path: p, anchor, max } => {
                let (entries, next) = self.container(container)?.readdir(&path(&p)?, anchor.as_deref(), max)?;
                Reply::Listing { entries: wire::entries_to_wire(&entries), next }
            }
            Request::Open { container, path: p, options, mode } => {
                // With its attributes: over DAOS no dearer than the open alone, and what
                // the agent's open answers the client with.
                let (object, attr) = self.container(container)?.open_stat(&path(&p)?, options.into(), mode)?;
                let writable = object.writable();
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                lock(&self.objects).insert(id, object);
                Reply::Opened { object: id, writable, attr: WireAttr::from(&attr) }
            }
            Request::Remove { container, path: p, recursive } => {
                self.container(container)?.remove(&path(&p)?, recursive)?;
                Reply::Done
            }
            Request::Rename { container, from, to } => {
                self.container(container)?.rename(&path(&from)?, &path(&to)?)?;
                Reply::Done
            }
            Request::Replace { container, from, to } => {
                self.container(container)?.replace(&path(&from)?, &path(&to)?)?;
                Reply::Done
            }
            Request::Truncate { container, path: p, size } => {
                self.container(container)?.truncate(&path(&p)?, size)?;
                Reply::Done
            }
            Request::Sync { container } => {
                self.container(container)?.sync()?;
                Reply::Done
            }
            Request::Io { .. } => {
                return Err(Error::InvalidArgument("an I/O request is answered piece by piece".into()));
            }
            Request::ObjectStat { object } => Reply::Attr(WireAttr::from(&self.object(object)?.stat()?)),
            Request::ObjectTruncate { object, size } => {
                self.object(object)?.truncate(size)?;
                Reply::Done
            }
            Request::ObjectSync { object } => {
                self.object(object)?.sync()?;
                Reply::Done
            }
            Request::Close { object } => {
                lock(&self.objects).remove(&object);
                Reply::Done
            }
        })
    }

    /// Run the pieces on this channel's event queue (made on first use), reporting each
    /// on `stream` as it completes, then [`Reply::Done`]; a piece whose object or
    /// staging range is wrong fails alone. An error is the channel's (the agent gone).
    fn io(
        &self,
        pieces: &[Piece],
        queue: &mut Option<Box<dyn IoQueue>>,
        stream: &mut UnixStream,
    ) -> std::io::Result<()> {
        // Reports of small pieces are sent eight at a time (each write wakes the agent's
        // thread: on a DPU's few cores the wake-ups, not the bytes, bound 4 KiB reads);
        // a large piece's report goes at once, so its request completes early.
        let mut pending: Vec<u8> = Vec::new();
        let mut held = 0;
        let mut broken: Option<std::io::Error> = None;
        let mut report = |index: usize, result: std::result::Result<u64, WireError>| {
            if broken.is_some() {
                return;
            }
            let flush_now = pieces.get(index).is_none_or(|p| p.len >= REPORT_AT_ONCE_BYTES);
            let written = wire::send(&mut pending, &Reply::Piece { index: index as u32, result });
            held += 1;
            let sent = written.and_then(|()| {
                if flush_now || held >= REPORTS_HELD {
                    held = 0;
                    stream.write_all(&pending).map(|()| pending.clear())
                } else {
                    Ok(())
                }
            });
            if let Err(e) = sent {
                broken = Some(e);
            }
        };
        let queue = match queue {
            Some(q) => q,
            None => match self.backend.io_queue() {
                Ok(q) => queue.insert(q),
                Err(e) => {
                    let e = WireError::from(&e);
                    (0..pieces.len()).for_each(|i| report(i, Err(e.clone())));
                    if let Some(e) = broken {
                        return Err(e);
                    }
                    wire::send(&mut pending, &Reply::Done)?;
                    return stream.write_all(&pending);
                }
            },
        };
        let mut objects = Vec::with_capacity(pieces.len());
        let mut regions = Vec::with_capacity(pieces.len());
        let mut runnable = Vec::with_capacity(pieces.len());
        for (i, piece) in pieces.iter().enumerate() {
            match self.object(piece.object) {
                Ok(o) => {
                    objects.push(o);
                    regions.push(piece.host.map(|id| lock(&self.host).get(&id).cloned().ok_or(id)));
                    runnable.push((i, piece));
                }
                Err(e) => report(i, Err(WireError::from(&e))),
            }
        }
        let mut batch = Vec::with_capacity(runnable.len());
        let mut index = Vec::with_capacity(runnable.len());
        for (((i, piece), object), region) in runnable.iter().zip(&objects).zip(&regions) {
            let (p, n) = (piece.staging, piece.len);
            let op = match region {
                None if piece.write => self.staging.bytes(p, n).map(IoOp::Write),
                None => self.staging.bytes_mut(p, n).map(IoOp::Read),
                Some(Ok(m)) if piece.write => m.bytes(p, n, m.len(), "host region").map(IoOp::Write),
                Some(Ok(m)) => m.bytes_mut(p, n, m.len(), "host region").map(IoOp::Read),
                Some(Err(id)) => Err(std::io::Error::other(format!("host region {id} is not mapped in this worker"))),
            };
            match op {
                Ok(op) => {
                    batch.push(IoRequest { object: object.as_ref(), offset: piece.offset, op });
                    index.push(*i);
                }
                Err(e) => report(*i, Err(WireError::InvalidArgument(e.to_string()))),
            }
        }
        queue.run(&mut batch, &mut |j, r| report(index[j], r.map(|n| n as u64).map_err(|e| WireError::from(&e))));
        if let Some(e) = broken {
            return Err(e);
        }
        wire::send(&mut pending, &Reply::Done)?;
        stream.write_all(&pending)
    }
}

fn unknown(what: &str, id: u64) -> Error {
    Error::InvalidArgument(format!("tenant worker: no {what} {id} open here (the worker may have been restarted)"))
}
