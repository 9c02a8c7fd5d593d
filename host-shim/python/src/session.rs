//! `Session`: one attached session of this process, and the calls made through it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dpuio_shim::blocking::{Code, DirStream, Failure, Session};
use dpuio_shim::{Access, Client, ConnectOptions, DataPlaneOptions, EntryKind, Opcode, RegionAccess, Request};
use pyo3::prelude::*;

use crate::attr::{AttrTuple, attr_tuple};
use crate::errors::{Fail, R, exception};
use crate::file::PyFile;
use crate::region::PyRegion;

/// Opens and closes issued at once by `open_many` / `close_many` (one HTTP/2
/// connection carries them; this bounds what one call puts in flight).
const CONCURRENT_CALLS: usize = 64;

fn seconds(name: &str, s: f64) -> Result<Option<Duration>, Failure> {
    if s == 0.0 {
        return Ok(None);
    }
    if !s.is_finite() || !(0.0..=1e9).contains(&s) {
        return Err(Failure::invalid(format!("{name} must be a positive number of seconds, not {s}")));
    }
    Ok(Some(Duration::from_secs_f64(s)))
}

/// One attached session: control-only (`transports=None`) or with a data plane.
#[pyclass(frozen, weakref, module = "dpuio._native", name = "Session")]
pub struct PySession {
    pub(crate) s: Arc<Session>,
}

impl PySession {
    fn client(&self) -> R<&Client> {
        Ok(self.s.client()?)
    }

    /// Run an async call with the GIL released.
    fn call<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(Client) -> std::pin::Pin<Box<dyn std::future::Future<Output = dpuio_shim::Result<T>> + Send>> + Send,
    ) -> R<T> {
        let client = self.client()?.clone();
        py.detach(|| Ok(self.s.run(f(client))??))
    }
}

#[pymethods]
impl PySession {
    #[new]
    #[pyo3(signature = (agent, tenant="", client_name="", transports=None, rings=0, ring_entries=0, timeout_s=0.0, connect_timeout_s=0.0, cert=None, key=None, ca=None, token=None, resume_s=None))]
    #[allow(clippy::too_many_arguments)] // keyword arguments from Python
    fn new(
        py: Python<'_>,
        agent: &str,
        tenant: &str,
        client_name: &str,
        transports: Option<String>,
        rings: usize,
        ring_entries: u32,
        timeout_s: f64,
        connect_timeout_s: f64,
        cert: Option<std::path::PathBuf>,
        key: Option<std::path::PathBuf>,
        ca: Option<std::path::PathBuf>,
        token: Option<String>,
        resume_s: Option<f64>,
    ) -> R<PySession> {
        // Everything not set here comes from the shim's defaults, which read the
        // environment as the CLI does ($DPUIO_CONFIG_DIR, $DPUIO_CERT, $DPUIO_TOKEN, ...).
        let mut options =
            ConnectOptions { agent: agent.to_owned(), tenant: tenant.to_owned(), ..ConnectOptions::default() };
        options.tls.cert = cert.or(options.tls.cert);
        options.tls.key = key.or(options.tls.key);
        options.tls.ca = ca.or(options.tls.ca);
        if let Some(token) = token {
            options.capability_token = token;
        }
        if !client_name.is_empty() {
            options.client_name = client_name.to_owned();
        }
        if let Some(t) = seconds("connect_timeout", connect_timeout_s)? {
            options.connect_timeout = t;
        }
        // None: $DPUIO_RESUME_S or 60 s; 0: do not resume after an agent restart.
        match resume_s {
            Some(0.0) => options.resume.max_wait = std::time::Duration::ZERO,
            Some(s) => options.resume.max_wait = seconds("resume", s)?.unwrap_or_default(),
            None => {}
        }
        if let Some(transports) = transports {
            let mut d = DataPlaneOptions { transports, ..Default::default() };
            if rings > 0 {
                d.rings = rings;
            }
            if ring_entries > 0 {
                if !ring_entries.is_power_of_two() {
                    return Err(Failure::invalid(format!("ring_entries {ring_entries} is not a power of two")).into());
                }
                d.ring_entries = ring_entries;
            }
            if let Some(t) = seconds("timeout", timeout_s)? {
                d.timeout = t;
            }
            options.data_plane = Some(d);
        }
        let session = py.detach(|| Session::attach(options))?;
        Ok(PySession { s: Arc::new(session) })
    }

    /// End the session at the agent. Idempotent.
    fn detach(&self, py: Python<'_>) -> R<()> {
        if self.s.is_detached() || self.s.is_foreign() {
            return Ok(());
        }
        py.detach(|| Ok(self.s.detach()?))
    }

    /// True once detached, and in a process other than the one that attached.
    #[getter]
    fn closed(&self) -> bool {
        self.s.client().is_err()
    }

    #[getter]
    fn session_id(&self) -> R<u64> {
        Ok(self.client()?.session_id())
    }

    #[getter]
    fn tenant(&self) -> R<String> {
        Ok(self.client()?.tenant().to_owned())
    }

    #[getter]
    fn container(&self) -> R<String> {
        Ok(self.client()?.container().to_owned())
    }

    #[getter]
    fn chunk_bytes(&self) -> R<u64> {
        Ok(self.client()?.chunk_bytes())
    }

    /// The agent's limits for this session, as a dict.
    #[getter]
    fn limits(&self) -> R<std::collections::HashMap<&'static str, u64>> {
        let l = self.client()?.limits();
        Ok([
            ("max_handles", u64::from(l.max_handles)),
            ("max_regions", u64::from(l.max_regions)),
            ("max_io_bytes", self.s.max_io_bytes()),
            ("max_inflight", u64::from(l.max_inflight)),
            ("max_readdir_batch", u64::from(l.max_readdir_batch)),
            ("max_lookup_paths", u64::from(l.max_lookup_paths)),
            ("rings", self.s.rings() as u64),
        ]
        .into_iter()
        .collect())
    }

    /// The data plane's transport as (name, provider, fabric_provider, detail), or None
    /// for a control-only session: what "auto" chose.
    #[getter]
    fn transport(&self) -> R<Option<(String, String, String, String)>> {
        Ok(self.client()?.transport().map(|t| (t.name, t.provider, t.fabric_provider, t.detail)))
    }

    /// CPU seconds of the data plane's progress thread (0 on shared memory).
    #[getter]
    fn progress_cpu_s(&self) -> R<f64> {
        Ok(self.client()?.data_plane_stats().progress_cpu.as_secs_f64())
    }

    fn stat(&self, py: Python<'_>, path: String) -> R<AttrTuple> {
        let a = self.call(py, move |c| Box::pin(async move { c.stat(&path).await }))?;
        Ok(attr_tuple(&a))
    }

    /// One result per path: an attribute tuple, or an exception object (not raised).
    fn lookup(&self, py: Python<'_>, paths: Vec<String>) -> R<Vec<Py<PyAny>>> {
        let results = self.call(py, move |c| Box::pin(async move { c.lookup(&paths).await }))?;
        results
            .into_iter()
            .map(|r| match r {
                Ok(a) => Ok(attr_tuple(&a).into_pyobject(py).map_err(|e| Fail(internal(e)))?.into_any().unbind()),
                Err(e) => Ok(exception(py, e.into())),
            })
            .collect()
    }

    #[pyo3(signature = (path, parents=false))]
    fn mkdir(&self, py: Python<'_>, path: String, parents: bool) -> R<AttrTuple> {
        let a = self.call(py, move |c| Box::pin(async move { c.mkdir(&path, parents).await }))?;
        Ok(attr_tuple(&a))
    }

    #[pyo3(signature = (path, recursive=false))]
    fn remove(&self, py: Python<'_>, path: String, recursive: bool) -> R<()> {
        self.call(py, move |c| Box::pin(async move { c.remove(&path, recursive).await }))
    }

    /// Rename; with `replace`, over an existing file in one step (a put's publish).
    #[pyo3(signature = (src, dst, replace=false))]
    fn rename(&self, py: Python<'_>, src: String, dst: String, replace: bool) -> R<()> {
        self.call(py, move |c| {
            Box::pin(
                async move { if replace { c.rename_replace(&src, &dst).await } else { c.rename(&src, &dst).await } },
            )
        })
    }

    /// A fresh temporary path for a whole-file put of `path` (beside it).
    #[staticmethod]
    fn put_temp_path(path: &str) -> R<String> {
        Ok(dpuio_shim::put_temp_path(path)?)
    }

    fn truncate(&self, py: Python<'_>, path: String, size: u64) -> R<()> {
        self.call(py, move |c| Box::pin(async move { c.truncate(&path, size).await }))
    }

    fn sync(&self, py: Python<'_>) -> R<()> {
        self.call(py, move |c| Box::pin(async move { c.sync().await }))
    }

    /// A directory listing as an iterator of batches: lists of (name, attr tuple).
    #[pyo3(signature = (path, batch_size=0))]
    fn readdir(&self, py: Python<'_>, path: String, batch_size: u32) -> R<DirIter> {
        let stream = py.detach(|| DirStream::open(&self.s, &path, batch_size))?;
        Ok(DirIter { stream: Mutex::new(stream), _session: self.s.clone() })
    }

    /// Every file under `path` (recursively), as sorted (path, size) pairs. Directories
    /// are listed with batched readdir, `concurrency` of them at a time.
    #[pyo3(signature = (path, concurrency=8))]
    fn list_files(&self, py: Python<'_>, path: String, concurrency: usize) -> R<Vec<(String, u64)>> {
        let concurrency = concurrency.clamp(1, 256);
        self.call(py, move |c| Box::pin(walk(c, path, concurrency)))
    }

    /// Open (or create) one file.
    #[pyo3(signature = (path, write=false, create=false, exclusive=false, truncate=false))]
    fn open(
        &self,
        py: Python<'_>,
        path: String,
        write: bool,
        create: bool,
        exclusive: bool,
        truncate: bool,
    ) -> R<PyFile> {
        if exclusive && !create {
            return Err(Failure::invalid("exclusive needs create").into());
        }
        let writable = write || create || truncate;
        let file = self.call(py, move |c| {
            Box::pin(async move {
                if create && (exclusive || truncate) {
                    return c.create(&path, exclusive).await; // truncates unless exclusive
                }
                let access = if writable { Access::ReadWrite } else { Access::ReadOnly };
                match c.open(&path, access).await {
                    Err(e) if create && e.code() == Some(tonic::Code::NotFound) => match c.create(&path, true).await {
                        Err(e) if e.code() == Some(tonic::Code::AlreadyExists) => c.open(&path, access).await,
                        other => other,
                    },
                    Ok(f) if truncate => {
                        f.truncate(0).await?;
                        Ok(f)
                    }
                    other => other,
                }
            })
        })?;
        Ok(PyFile::new(self.s.clone(), file, writable))
    }

    /// Open many files read-only at once (the opens are in flight together). One
    /// result per path: a File, or an exception object (not raised).
    fn open_many(&self, py: Python<'_>, paths: Vec<String>) -> R<Vec<Py<PyAny>>> {
        let opened = self.call(py, move |c| {
            Box::pin(async move {
                Ok(concurrently(paths, CONCURRENT_CALLS, move |path| {
                    let c = c.clone();
                    async move { c.open(&path, Access::ReadOnly).await }
                })
                .await)
            })
        })?;
        opened
            .into_iter()
            .map(|r| match r {
                Ok(file) => {
                    Ok(Py::new(py, PyFile::new(self.s.clone(), file, false)).map_err(|e| Fail(internal(e)))?.into_any())
                }
                Err(e) => Ok(exception(py, e.into())),
            })
            .collect()
    }

    /// Close many files at once; raises the first error after trying them all.
    fn close_many(&self, py: Python<'_>, files: Vec<Bound<'_, PyFile>>) -> R<()> {
        let taken: Vec<_> = files.iter().filter_map(|f| f.get().take()).collect();
        if taken.is_empty() || self.s.client().is_err() {
            return Ok(());
        }
        let results = self.call(py, move |_| {
            Box::pin(async move { Ok(concurrently(taken, CONCURRENT_CALLS, |f| f.close()).await) })
        })?;
        results.into_iter().find_map(Result::err).map_or(Ok(()), |e| Err(e.into()))
    }

    /// Register `length` bytes. `access`: "rw" (default), "w" (the agent writes it:
    /// reads land there) or "r" (the agent reads it: writes come from there).
    #[pyo3(signature = (length, access="rw"))]
    fn region(&self, py: Python<'_>, length: usize, access: &str) -> R<PyRegion> {
        if length == 0 {
            return Err(Failure::invalid("a region needs at least one byte").into());
        }
        let access = match access {
            "rw" => RegionAccess::ReadWrite,
            "w" => RegionAccess::WriteByAgent,
            "r" => RegionAccess::ReadByAgent,
            other => {
                return Err(Failure::invalid(format!("access must be \"rw\", \"w\" or \"r\", not {other:?}")).into());
            }
        };
        self.s.data_client()?;
        let region = self.call(py, move |c| Box::pin(async move { c.register_region(length, access).await }))?;
        Ok(PyRegion::new(self.s.clone(), region))
    }

    /// Submit many requests through one ring and wait for all. Each op is a tuple
    /// (write, file, region, region_offset, length, file_offset, sync). Returns the
    /// bytes moved per op; raises the first failure (naming the file and offset).
    fn submit(&self, py: Python<'_>, ops: Vec<Op<'_>>) -> R<Vec<u64>> {
        let mut requests = Vec::with_capacity(ops.len());
        let mut keep = Vec::with_capacity(ops.len());
        for (i, (write, file, region, region_offset, length, file_offset, sync)) in ops.iter().enumerate() {
            let (f, r) = (file.get(), region.get());
            let at = |e: Failure| Failure::new(e.code, format!("op {i} ({}): {}", f.path_str(), e.message));
            if !Arc::ptr_eq(&f.session, &self.s) || !Arc::ptr_eq(&r.inner.session, &self.s) {
                return Err(at(Failure::invalid("the file or region belongs to another session")).into());
            }
            r.check_usable().map_err(at)?;
            let handle = f.usable_handle().map_err(at)?;
            if region_offset.checked_add(*length).is_none_or(|end| end > r.len() as u64) {
                return Err(at(Failure::new(
                    Code::OutOfRange,
                    format!("range {region_offset}+{length} lies outside the {}-byte region", r.len()),
                ))
                .into());
            }
            requests.push(Request {
                opcode: if *write { Opcode::Write } else { Opcode::Read },
                handle,
                region_id: r.id(),
                region_offset: *region_offset,
                file_offset: *file_offset,
                length: *length,
                sync: *sync,
                user_data: i as u64,
            });
            keep.push(r.inner.clone());
        }
        let session = self.s.clone();
        // `keep` holds the regions' memory for the call, whatever Python does meanwhile.
        let results = py.detach(move || {
            let r = session.submit(&requests);
            drop(keep);
            r
        })?;
        results
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.map_err(|status| {
                    let (write, file, _, _, _, file_offset, _) = &ops[i];
                    let op = if *write { "write" } else { "read" };
                    Failure::io(&format!("{op} {} at offset {file_offset}", file.get().path_str()), status).into()
                })
            })
            .collect()
    }

    fn __reduce__(&self) -> R<()> {
        Err(Failure::invalid("a Session cannot be pickled; dpuio.Client can").into())
    }
}

/// (write, file, region, region_offset, length, file_offset, sync)
type Op<'py> = (bool, Bound<'py, PyFile>, Bound<'py, PyRegion>, u64, u64, u64, bool);

fn internal(e: impl std::fmt::Display) -> Failure {
    Failure::new(Code::Internal, e.to_string())
}

/// Run `f` over `items` with at most `limit` in flight; results in item order.
async fn concurrently<I, T, F, Fut>(items: Vec<I>, limit: usize, f: F) -> Vec<dpuio_shim::Result<T>>
where
    I: Send + 'static,
    T: Send + 'static,
    F: Fn(I) -> Fut,
    Fut: std::future::Future<Output = dpuio_shim::Result<T>> + Send + 'static,
{
    let n = items.len();
    let mut results: Vec<Option<dpuio_shim::Result<T>>> = (0..n).map(|_| None).collect();
    let mut set = tokio::task::JoinSet::new();
    let mut items = items.into_iter().enumerate();
    loop {
        while set.len() < limit {
            let Some((i, item)) = items.next() else { break };
            let fut = f(item);
            set.spawn(async move { (i, fut.await) });
        }
        let Some(joined) = set.join_next().await else { break };
        match joined {
            Ok((i, r)) => results[i] = Some(r),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(dpuio_shim::Error::Protocol { op: "concurrent call".into(), reason: "no result".into() })
            })
        })
        .collect()
}

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') { format!("{dir}{name}") } else { format!("{dir}/{name}") }
}

/// Every file under `root`, sorted by path.
async fn walk(client: Client, root: String, concurrency: usize) -> dpuio_shim::Result<Vec<(String, u64)>> {
    let mut files = Vec::new();
    let mut pending = std::collections::VecDeque::from([root]);
    let mut set = tokio::task::JoinSet::new();
    loop {
        while set.len() < concurrency {
            let Some(dir) = pending.pop_front() else { break };
            let c = client.clone();
            set.spawn(async move {
                let listed = c.readdir(&dir).await;
                (dir, listed)
            });
        }
        let Some(joined) = set.join_next().await else { break };
        let (dir, listed) =
            joined.map_err(|e| dpuio_shim::Error::Protocol { op: "list".into(), reason: e.to_string() })?;
        for e in listed? {
            let path = join(&dir, &e.name);
            match e.attr.kind {
                EntryKind::Directory => pending.push_back(path),
                EntryKind::File => files.push((path, e.attr.size)),
            }
        }
    }
    files.sort_unstable();
    Ok(files)
}

/// Batches of a directory listing: `for batch in session.readdir(path)`.
#[pyclass(frozen, module = "dpuio._native", name = "DirIter")]
pub struct DirIter {
    stream: Mutex<DirStream>,
    _session: Arc<Session>,
}

#[pymethods]
impl DirIter {
    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> R<Option<Vec<(String, AttrTuple)>>> {
        let batch = py.detach(|| self.stream.lock().unwrap_or_else(|p| p.into_inner()).next_batch())?;
        Ok(batch.map(|b| b.into_iter().map(|e| (e.name, attr_tuple(&e.attr))).collect()))
    }
}
