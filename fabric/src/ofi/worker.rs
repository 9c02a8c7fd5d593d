//! The libfabric worker: fabric, domain, address vector, completion queue, one RDM
//! endpoint; progress, doorbell receipt and the event fd.

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libfabric_sys as sys;

use super::region::{Mr, RegionInner};
use super::{Completion, Endpoint, OfiConfig, Region, check, ofi_error};
use crate::doorbell::{Doorbell, DoorbellQueue, MAX_DOORBELL_BYTES};
use crate::error::{Error, Result};

/// Completion entries read per `fi_cq_read` call.
const CQ_BATCH: usize = 16;
/// Tokens (libfabric `context` values) of receive slots carry this bit.
const RECV_TOKEN: u64 = 1 << 63;

/// Fabric and domain, shared by the worker and every region; closed when the last
/// of them goes. Holds the lock that serialises every libfabric call (module docs).
pub(crate) struct DomainInner {
    lock: Mutex<()>,
    api: &'static sys::Api,
    infos: *mut sys::fi_info,
    fabric: *mut sys::fid_fabric,
    pub(crate) domain: *mut sys::fid_domain,
    mr_local: bool,
    virt_addr: bool,
    /// Without `FI_MR_PROV_KEY` (tcp) the application picks the keys, unique per domain.
    prov_key: bool,
    next_key: AtomicU64,
}

// SAFETY: the raw handles are only used under `lock` (or read-only: the fi_info list
// after fi_getinfo), and closed once in Drop.
unsafe impl Send for DomainInner {}
// SAFETY: as above.
unsafe impl Sync for DomainInner {}

impl DomainInner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `requested_key` for the next registration: ignored under
    /// `FI_MR_PROV_KEY`, otherwise unique in this domain.
    pub(crate) fn requested_key(&self) -> u64 {
        if self.prov_key { 0 } else { self.next_key.fetch_add(1, Ordering::Relaxed) }
    }
}

impl Drop for DomainInner {
    fn drop(&mut self) {
        // SAFETY: every region and the worker hold an Arc to this value, so their
        // registrations and endpoint objects are closed; each handle is closed once,
        // domain before fabric, and the info list freed last.
        unsafe {
            if !self.domain.is_null() {
                sys::fi_close(&mut (*self.domain).fid);
            }
            if !self.fabric.is_null() {
                sys::fi_close(&mut (*self.fabric).fid);
            }
            (self.api.fi_freeinfo)(self.infos);
        }
    }
}

/// Per-endpoint bookkeeping shared with posted operations.
pub(crate) struct OpState {
    pub(crate) in_flight: AtomicUsize,
    /// First error number of an operation since the last flush (0 = none).
    pub(crate) first_error: AtomicI32,
}

impl OpState {
    pub(crate) fn new() -> Arc<OpState> {
        Arc::new(OpState { in_flight: AtomicUsize::new(0), first_error: AtomicI32::new(0) })
    }
}

/// What a posted operation keeps alive until its completion entry is read. The
/// fields are never read: they are held for their `Drop`.
pub(crate) enum Hold {
    Region {
        _region: Arc<RegionInner>,
    },
    /// Copied bytes and, under `FI_MR_LOCAL`, their registration (declared first:
    /// closed before the bytes are freed).
    Bytes {
        _mr: Option<Mr>,
        _bytes: Box<[u8]>,
    },
}

struct Pending {
    state: Arc<OpState>,
    _hold: Hold,
}

/// Receive buffers for doorbells, registered when the provider wants `FI_MR_LOCAL`.
struct RecvPool {
    // Field order is drop order: the registration goes before the buffers.
    mr: Option<Mr>,
    bufs: Box<[[u8; MAX_DOORBELL_BYTES]]>,
}

/// A libfabric worker: one RDM endpoint with its completion queue and address
/// vector. `Send + Sync`, cheap to clone (a reference): hand a clone to a
/// [`crate::ProgressThread`].
#[derive(Clone)]
pub struct Worker {
    pub(crate) inner: Arc<WorkerInner>,
}

pub(crate) struct WorkerInner {
    pub(crate) domain: Arc<DomainInner>,
    pub(crate) config: OfiConfig,
    av: *mut sys::fid_av,
    cq: *mut sys::fid_cq,
    pub(crate) ep: *mut sys::fid_ep,
    wait_fd: RawFd,
    /// Our own eventfd when the completion queue has no fd wait object (shm).
    own_fd: Option<OwnedFd>,
    doorbells: DoorbellQueue,
    /// Under the domain lock in practice; a Mutex of its own keeps Rust honest.
    ops: Mutex<Ops>,
    recv: Mutex<RecvPool>,
    describe: String,
}

#[derive(Default)]
struct Ops {
    next_token: u64,
    table: HashMap<u64, Pending>,
}

// SAFETY: the raw handles are used only under the domain lock and closed once in
// Drop; everything else is Mutex/atomic protected.
unsafe impl Send for WorkerInner {}
// SAFETY: as above.
unsafe impl Sync for WorkerInner {}

impl Drop for WorkerInner {
    fn drop(&mut self) {
        let _guard = self.domain.lock();
        // SAFETY: endpoints hold an Arc to this value, so none is left; the endpoint
        // is closed before the objects bound to it, each exactly once. Operations
        // still posted are abandoned with the endpoint; their holds drop after this
        // body (the registrations they hold close under the lock, taken again then).
        unsafe {
            if !self.ep.is_null() {
                sys::fi_close(&mut (*self.ep).fid);
            }
            if !self.cq.is_null() {
                sys::fi_close(&mut (*self.cq).fid);
            }
            if !self.av.is_null() {
                sys::fi_close(&mut (*self.av).fid);
            }
        }
        drop(_guard);
        let ops = std::mem::take(&mut self.ops.lock().unwrap_or_else(|p| p.into_inner()).table);
        drop(ops);
    }
}

fn c_string(what: &str, s: &str) -> Result<*mut libc::c_char> {
    let c = CString::new(s).map_err(|_| Error::Config(format!("{what} {s:?} holds a NUL byte")))?;
    // SAFETY: c is NUL-terminated; strdup returns a malloc'd copy (or NULL), which
    // fi_freeinfo frees together with the hints.
    let p = unsafe { libc::strdup(c.as_ptr()) };
    if p.is_null() {
        return Err(Error::Io { op: "copy a libfabric hint (strdup)", source: std::io::Error::last_os_error() });
    }
    Ok(p)
}

/// Finds a provider for `config` with `fi_getinfo`; returns the whole list.
fn get_info(api: &sys::Api, config: &OfiConfig) -> Result<*mut sys::fi_info> {
    // A zeroed fi_info with its attribute structs allocated (or NULL); it is freed with
    // fi_freeinfo below.
    let hints = api.allocinfo();
    if hints.is_null() {
        return Err(Error::Io {
            op: "allocate libfabric hints (fi_allocinfo)",
            source: std::io::Error::last_os_error(),
        });
    }
    let fill = || -> Result<()> {
        // SAFETY: hints and its attribute pointers were allocated by fi_allocinfo and
        // are exclusively ours; strings put in are malloc'd for fi_freeinfo.
        unsafe {
            let h = &mut *hints;
            h.caps = u64::from(
                sys::FI_RMA
                    | sys::FI_MSG
                    | sys::FI_READ
                    | sys::FI_WRITE
                    | sys::FI_REMOTE_READ
                    | sys::FI_REMOTE_WRITE
                    | sys::FI_SEND
                    | sys::FI_RECV,
            );
            h.mode = 0;
            (*h.ep_attr).type_ = sys::FI_EP_RDM;
            let d = &mut *h.domain_attr;
            // VIRT_ADDR: remote addresses are the peer's virtual addresses (and shm's
            // one-sided CMA path requires it); LOCAL/ALLOCATED/PROV_KEY: what verbs
            // needs, ignored by providers that do not.
            d.mr_mode = (sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY | sys::FI_MR_LOCAL) as i32;
            d.threading = sys::FI_THREAD_DOMAIN;
            d.av_type = sys::FI_AV_TABLE;
            if let Some(name) = &config.domain {
                d.name = c_string("domain", name)?;
            }
            // No RMA ordering: shm only takes its one-sided path without it.
            (*h.tx_attr).msg_order = u64::from(sys::FI_ORDER_NONE);
            (*h.rx_attr).msg_order = u64::from(sys::FI_ORDER_NONE);
            (*h.fabric_attr).prov_name = c_string("provider", &config.provider)?;
        }
        Ok(())
    };
    let mut info: *mut sys::fi_info = ptr::null_mut();
    let ret = fill().map(|()| {
        // SAFETY: hints is a complete fi_info; info is writable.
        unsafe { (api.fi_getinfo)(sys::FI_API_VERSION, ptr::null(), ptr::null(), 0, hints, &mut info) }
    });
    // SAFETY: hints came from fi_allocinfo and is freed once (with the strdup'd names).
    unsafe { (api.fi_freeinfo)(hints) };
    let ret = ret?;
    if ret == -(sys::FI_ENODATA as i32) || (ret == 0 && info.is_null()) {
        return Err(Error::ProviderUnavailable { provider: config.provider.clone() });
    }
    check("find a libfabric provider (fi_getinfo)", ret)?;
    Ok(info)
}

/// The step whose EBUSY [`Worker::open`] retries.
const ENABLE: &str = "enable endpoint (fi_enable)";

impl Worker {
    /// Finds the provider `config.provider` (`fi_getinfo` with `FI_RMA | FI_MSG` on
    /// an RDM endpoint), opens fabric, domain, address vector, completion queue and
    /// endpoint, and posts the doorbell receive buffers.
    ///
    /// [`Error::ProviderUnavailable`] when libfabric has no such provider here.
    pub fn open(config: &OfiConfig) -> Result<Worker> {
        // The shm provider names each endpoint's shared-memory region itself; endpoints
        // opened at once in one process have been seen to collide (fi_enable EBUSY, once
        // in a run of the e2e tests under DAOS's libfabric build). A new endpoint gets a
        // new name: try again, a few times.
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            match Worker::open_once(config) {
                Err(Error::Ofi { op, code, .. }) if op == ENABLE && code == libc::EBUSY && attempt < ATTEMPTS => {
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn open_once(config: &OfiConfig) -> Result<Worker> {
        config.validate()?;
        // libfabric is loaded here, on the first worker (libfabric_sys's docs say why).
        let api = sys::api()?;
        let infos = get_info(api, config)?;
        // rxm does not filter on the domain name hint: pick the entry ourselves, and
        // refuse a name it does not offer rather than open the first domain (traffic
        // on another interface than the one configured).
        let mut chosen = infos;
        if let Some(want) = &config.domain {
            let mut seen: Vec<String> = Vec::new();
            let mut p = infos;
            chosen = ptr::null_mut();
            while !p.is_null() {
                // SAFETY: p walks the list fi_getinfo returned; names are C strings or NULL.
                let (name, next) = unsafe { ((*(*p).domain_attr).name, (*p).next) };
                if !name.is_null() {
                    // SAFETY: as above.
                    let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
                    if name == want.as_str() {
                        chosen = p;
                        break;
                    }
                    if !seen.iter().any(|s| *s == name) {
                        seen.push(name.into_owned());
                    }
                }
                p = next;
            }
            if chosen.is_null() {
                // SAFETY: infos came from fi_getinfo and nothing else holds it yet.
                unsafe { (api.fi_freeinfo)(infos) };
                return Err(Error::NoSuchDomain {
                    provider: config.provider.clone(),
                    domain: want.clone(),
                    available: seen,
                });
            }
        }
        // SAFETY: chosen is a non-null entry of the list from fi_getinfo.
        let info = unsafe { &*chosen };
        // SAFETY: the attribute pointers of a returned fi_info are valid.
        let mr_mode = unsafe { (*info.domain_attr).mr_mode } as u32;
        let mut domain = DomainInner {
            lock: Mutex::new(()),
            api,
            infos,
            fabric: ptr::null_mut(),
            domain: ptr::null_mut(),
            mr_local: mr_mode & sys::FI_MR_LOCAL != 0,
            virt_addr: mr_mode & sys::FI_MR_VIRT_ADDR != 0,
            prov_key: mr_mode & sys::FI_MR_PROV_KEY != 0,
            next_key: AtomicU64::new(1),
        };
        // SAFETY: the fabric attributes come from fi_getinfo; fabric is writable. From
        // here on, DomainInner's Drop closes whatever was opened.
        let ret = unsafe { (api.fi_fabric)(info.fabric_attr, &mut domain.fabric, ptr::null_mut()) };
        check("open fabric (fi_fabric)", ret)?;
        // SAFETY: fabric open; info from fi_getinfo; domain writable.
        let ret = unsafe { sys::fi_domain(domain.fabric, chosen, &mut domain.domain, ptr::null_mut()) };
        check("open domain (fi_domain)", ret)?;
        let domain = Arc::new(domain);
        // SAFETY: names in a returned fi_info are valid C strings or NULL.
        let name = |p: *const libc::c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: see above.
                unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        // SAFETY: the attribute pointers of a returned fi_info are valid.
        let (prov, fabric_name, domain_name) = unsafe {
            (name((*info.fabric_attr).prov_name), name((*info.fabric_attr).name), name((*info.domain_attr).name))
        };
        let describe = format!(
            "{prov} (fabric {fabric_name}, domain {domain_name}, mr_mode {mr_mode:#x}, completion {:?})",
            config.completion
        );

        let mut inner = WorkerInner {
            domain: domain.clone(),
            config: config.clone(),
            av: ptr::null_mut(),
            cq: ptr::null_mut(),
            ep: ptr::null_mut(),
            wait_fd: -1,
            own_fd: None,
            doorbells: DoorbellQueue::new(config.doorbell_queue_len),
            ops: Mutex::new(Ops { next_token: 1, table: HashMap::new() }),
            recv: Mutex::new(RecvPool { mr: None, bufs: vec![[0u8; MAX_DOORBELL_BYTES]; config.recv_slots].into() }),
            describe,
        };
        {
            let _guard = domain.lock();
            let mut av_attr = sys::fi_av_attr { type_: sys::FI_AV_TABLE, count: 64, ..Default::default() };
            // SAFETY: domain open; av_attr initialised; inner.av writable. From here on
            // WorkerInner's Drop closes what was opened.
            let ret = unsafe { sys::fi_av_open(domain.domain, &mut av_attr, &mut inner.av, ptr::null_mut()) };
            check("open address vector (fi_av_open)", ret)?;
            let mut cq_attr = sys::fi_cq_attr {
                size: config.max_in_flight_ops + config.recv_slots + CQ_BATCH,
                format: sys::FI_CQ_FORMAT_DATA,
                wait_obj: sys::FI_WAIT_FD,
                ..Default::default()
            };
            // SAFETY: as above for the completion queue.
            let mut ret = unsafe { sys::fi_cq_open(domain.domain, &mut cq_attr, &mut inner.cq, ptr::null_mut()) };
            if ret == -(libc::ENOSYS) || ret == -(libc::EINVAL) {
                // shm (1.17) has no fd wait object (only none/yield): fall back to an
                // eventfd of ours that only `wake` signals (see `wakes_on_receive`).
                cq_attr.wait_obj = sys::FI_WAIT_NONE;
                // SAFETY: as above.
                ret = unsafe { sys::fi_cq_open(domain.domain, &mut cq_attr, &mut inner.cq, ptr::null_mut()) };
                // SAFETY: eventfd has no pointer arguments.
                let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
                if fd < 0 {
                    return Err(Error::Io { op: "create wake-up eventfd", source: std::io::Error::last_os_error() });
                }
                // SAFETY: fd is a new descriptor owned by nobody else.
                inner.own_fd = Some(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            check("open completion queue (fi_cq_open)", ret)?;
            // SAFETY: domain open; info is the fi_info the domain was opened with.
            let ret = unsafe { sys::fi_endpoint(domain.domain, chosen, &mut inner.ep, ptr::null_mut()) };
            check("open endpoint (fi_endpoint)", ret)?;
            // SAFETY: ep, av and cq are open objects of this domain.
            unsafe {
                check("bind address vector (fi_ep_bind)", sys::fi_ep_bind(inner.ep, &mut (*inner.av).fid, 0))?;
                let flags = u64::from(sys::FI_TRANSMIT | sys::FI_RECV);
                check("bind completion queue (fi_ep_bind)", sys::fi_ep_bind(inner.ep, &mut (*inner.cq).fid, flags))?;
                check(ENABLE, sys::fi_enable(inner.ep))?;
            }
            if let Some(own) = &inner.own_fd {
                inner.wait_fd = own.as_raw_fd();
            } else {
                let mut fd: libc::c_int = -1;
                // SAFETY: cq open with FI_WAIT_FD; FI_GETWAIT writes one int.
                let ret = unsafe {
                    sys::fi_control(
                        &mut (*inner.cq).fid,
                        sys::FI_GETWAIT as i32,
                        ptr::from_mut(&mut fd).cast::<c_void>(),
                    )
                };
                check("get the completion queue's fd (fi_control FI_GETWAIT)", ret)?;
                inner.wait_fd = fd;
            }
        }
        if domain.mr_local {
            let pool = inner.recv.get_mut().unwrap_or_else(|p| p.into_inner());
            let len = std::mem::size_of_val(&*pool.bufs);
            // SAFETY: the buffers live in the pool next to the Mr, boxed (stable
            // address), and the pool drops them after the Mr (field order).
            pool.mr =
                Some(unsafe { Mr::register(domain.clone(), pool.bufs.as_ptr().cast(), len, u64::from(sys::FI_RECV)) }?);
        }
        let worker = Worker { inner: Arc::new(inner) };
        {
            let _guard = domain.lock();
            for slot in 0..config.recv_slots {
                worker.post_recv(slot)?;
            }
        }
        Ok(worker)
    }

    /// The configuration this worker was opened with.
    pub fn config(&self) -> &OfiConfig {
        &self.inner.config
    }

    /// What libfabric chose: provider, fabric, domain, memory-registration mode and
    /// the completion semantics of writes. For logs.
    pub fn describe(&self) -> String {
        self.inner.describe.clone()
    }

    /// Allocates `len` bytes (anonymous memory, page-aligned) and registers them with
    /// the domain for local and remote read/write.
    pub fn alloc_region(&self, len: usize) -> Result<Region> {
        Region::allocate(self.inner.domain.clone(), len)
    }

    /// This endpoint's address (`fi_getname`), for the peer's [`Worker::connect`].
    pub fn address(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        loop {
            let mut len = buf.len();
            let ret = {
                let _guard = self.inner.domain.lock();
                // SAFETY: ep open; buf is writable for len bytes; len writable.
                unsafe { sys::fi_getname(&mut (*self.inner.ep).fid, buf.as_mut_ptr().cast(), &mut len) }
            };
            if ret == -(sys::FI_ETOOSMALL as i32) && len > buf.len() && len <= 1 << 16 {
                buf.resize(len, 0);
                continue;
            }
            check("get endpoint address (fi_getname)", ret)?;
            buf.truncate(len);
            return Ok(buf);
        }
    }

    /// Inserts the peer's address into the address vector (`fi_av_insert`). Nothing
    /// travels yet: connection-oriented providers (rxm) connect on the first
    /// operation, which [`Endpoint::unpack_key`]'s probe performs.
    ///
    /// The provider parses the address: accept addresses only from authenticated
    /// peers (the control plane's mTLS session).
    pub fn connect(&self, peer_address: &[u8]) -> Result<Endpoint> {
        if peer_address.is_empty() {
            return Err(Error::Config("empty peer address".into()));
        }
        let mut addr: sys::fi_addr_t = sys::FI_ADDR_NOTAVAIL;
        let ret = {
            let _guard = self.inner.domain.lock();
            // SAFETY: av open; peer_address readable for the call (the provider copies
            // it); addr writable for one entry.
            unsafe { sys::fi_av_insert(self.inner.av, peer_address.as_ptr().cast(), 1, &mut addr, 0, ptr::null_mut()) }
        };
        if ret != 1 {
            return Err(if ret < 0 {
                ofi_error("insert peer address (fi_av_insert)", i64::from(ret))
            } else {
                Error::Config("the provider refused the peer address (fi_av_insert inserted 0)".into())
            });
        }
        Ok(Endpoint::new(self.clone(), addr))
    }

    /// Reads the completion queue until it is empty; returns the entries handled.
    /// Completed operations release what they held; doorbells land in the queue read
    /// by [`Worker::take_doorbells`]. Over `tcp;ofi_rxm` this is also what answers
    /// peers (manual progress).
    pub fn progress(&self) -> usize {
        let mut dead = Vec::new();
        let n = {
            let _guard = self.inner.domain.lock();
            self.progress_locked(&mut dead)
        };
        drop(dead);
        n
    }

    /// [`Worker::progress`] with the domain lock held; released holds go to `dead`.
    pub(crate) fn progress_locked(&self, dead: &mut Vec<Hold>) -> usize {
        let mut handled = 0;
        loop {
            let mut entries = [sys::fi_cq_data_entry::default(); CQ_BATCH];
            // SAFETY: cq open (lock held); entries has room for CQ_BATCH entries of
            // the queue's format (FI_CQ_FORMAT_DATA).
            let n = unsafe { sys::fi_cq_read(self.inner.cq, entries.as_mut_ptr().cast(), CQ_BATCH) };
            if n > 0 {
                let n = n as usize;
                for e in &entries[..n] {
                    self.complete(e.op_context as u64, 0, e.len, dead);
                }
                handled += n;
                continue;
            }
            if n == -(sys::FI_EAVAIL as isize) {
                let mut err = sys::fi_cq_err_entry::default();
                // SAFETY: cq open; err writable; err_data_size 0 lets the provider use
                // its own buffer for error data.
                let m = unsafe { sys::fi_cq_readerr(self.inner.cq, &mut err, 0) };
                if m == 1 {
                    self.complete(err.op_context as u64, err.err.max(1), err.len, dead);
                    handled += 1;
                    continue;
                }
            }
            return handled;
        }
    }

    fn complete(&self, token: u64, err: i32, len: usize, dead: &mut Vec<Hold>) {
        if token & RECV_TOKEN != 0 {
            let slot = (token & !RECV_TOKEN) as usize;
            if err == 0 {
                let pool = self.inner.recv.lock().unwrap_or_else(|p| p.into_inner());
                match pool.bufs.get(slot) {
                    Some(buf) if len <= MAX_DOORBELL_BYTES => self.inner.doorbells.push(&buf[..len]),
                    _ => self.inner.doorbells.note_malformed(),
                }
            } else if err != sys::FI_ECANCELED as i32 {
                // Too long (FI_ETRUNC) or otherwise broken: a misbehaving peer.
                self.inner.doorbells.note_malformed();
            }
            // A slot that cannot be reposted is lost; later doorbells use the others.
            let _ = self.post_recv(slot);
            return;
        }
        let pending = self.inner.ops.lock().unwrap_or_else(|p| p.into_inner()).table.remove(&token);
        if let Some(p) = pending {
            if err != 0 {
                let _ = p.state.first_error.compare_exchange(0, err, Ordering::AcqRel, Ordering::Acquire);
            }
            p.state.in_flight.fetch_sub(1, Ordering::AcqRel);
            dead.push(p._hold);
        }
    }

    /// Posts receive slot `slot` (domain lock held by the caller).
    fn post_recv(&self, slot: usize) -> Result<()> {
        let pool = self.inner.recv.lock().unwrap_or_else(|p| p.into_inner());
        let Some(buf) = pool.bufs.get(slot) else { return Ok(()) };
        let desc = pool.mr.as_ref().map_or(ptr::null_mut(), Mr::desc);
        let token = RECV_TOKEN | slot as u64;
        // SAFETY: ep open (caller holds the lock); the buffer is MAX_DOORBELL_BYTES in
        // a boxed slice owned by the worker, which closes the endpoint (cancelling the
        // receive) before freeing it; token is an integer context we never
        // dereference.
        let ret = unsafe {
            sys::fi_recv(
                self.inner.ep,
                buf.as_ptr().cast_mut().cast(),
                MAX_DOORBELL_BYTES,
                desc,
                sys::FI_ADDR_UNSPEC,
                token as *mut c_void,
            )
        };
        if ret < 0 { Err(ofi_error("post doorbell receive (fi_recv)", ret as i64)) } else { Ok(()) }
    }

    /// Records a posted operation under a new token and calls `post` with it,
    /// retrying (progressing in between) while the provider says `FI_EAGAIN`, up to
    /// `connect_timeout_ms`, then [`Error::Again`].
    pub(crate) fn post(
        &self,
        op: &'static str,
        state: &Arc<OpState>,
        hold: Hold,
        post: impl Fn(*mut c_void) -> isize,
    ) -> Result<()> {
        let max = self.inner.config.max_in_flight_ops;
        let token = {
            let mut ops = self.inner.ops.lock().unwrap_or_else(|p| p.into_inner());
            if ops.table.len() >= max {
                return Err(Error::Busy { in_flight: ops.table.len(), max });
            }
            let token = ops.next_token;
            ops.next_token = (ops.next_token + 1) & !RECV_TOKEN;
            ops.table.insert(token, Pending { state: state.clone(), _hold: hold });
            token
        };
        state.in_flight.fetch_add(1, Ordering::AcqRel);
        let deadline = Instant::now() + Duration::from_millis(self.inner.config.connect_timeout_ms);
        let mut dead = Vec::new();
        let result = loop {
            let ret = {
                let _guard = self.inner.domain.lock();
                let ret = post(token as *mut c_void);
                if ret == -(sys::FI_EAGAIN as isize) {
                    self.progress_locked(&mut dead);
                }
                ret
            };
            drop(std::mem::take(&mut dead));
            if ret >= 0 {
                break Ok(());
            }
            if ret != -(sys::FI_EAGAIN as isize) {
                break Err(ofi_error(op, ret as i64));
            }
            if Instant::now() >= deadline {
                break Err(Error::Again { op, waited_ms: self.inner.config.connect_timeout_ms });
            }
            std::thread::yield_now();
        };
        if result.is_err() {
            // Not posted: no completion will come for the token.
            let p = self.inner.ops.lock().unwrap_or_else(|p| p.into_inner()).table.remove(&token);
            if p.is_some() {
                state.in_flight.fetch_sub(1, Ordering::AcqRel);
            }
        }
        result
    }

    /// Copies `data` for a posted operation, registered if the provider wants
    /// `FI_MR_LOCAL`. Returns the hold and the pointer and descriptor to post.
    pub(crate) fn hold_bytes(&self, data: &[u8]) -> Result<(Hold, *const u8, *mut c_void)> {
        let bytes: Box<[u8]> = if data.is_empty() { Box::new([0u8]) } else { data.into() };
        let ptr = bytes.as_ptr();
        let mr = if self.inner.domain.mr_local {
            // SAFETY: the bytes are boxed (stable address) and travel in the same Hold
            // as the Mr, declared after it, so they are freed after it is closed.
            Some(unsafe {
                Mr::register(self.inner.domain.clone(), ptr, bytes.len(), u64::from(sys::FI_WRITE | sys::FI_SEND))
            }?)
        } else {
            None
        };
        let desc = mr.as_ref().map_or(ptr::null_mut(), Mr::desc);
        Ok((Hold::Bytes { _mr: mr, _bytes: bytes }, ptr, desc))
    }

    /// Remote address to post for `addr` in a region whose base the peer declared
    /// as `base`: the address itself under `FI_MR_VIRT_ADDR`, else the offset.
    pub(crate) fn target_addr(&self, base: u64, addr: u64) -> u64 {
        if self.inner.domain.virt_addr { addr } else { addr - base }
    }

    pub(crate) fn mr_local(&self) -> bool {
        self.inner.domain.mr_local
    }

    pub(crate) fn completion(&self) -> Completion {
        self.inner.config.completion
    }

    /// The completion queue's wait fd (`fi_control(FI_GETWAIT)`): readable when
    /// [`Worker::progress`] has work. Owned by the queue: do not close it.
    pub fn event_fd(&self) -> Result<RawFd> {
        Ok(self.inner.wait_fd)
    }

    /// `fi_trywait` on the completion queue: `Ok(true)` if nothing is pending and it
    /// is safe to sleep on the fd, `Ok(false)` if entries are pending.
    ///
    /// Without an fd wait object (shm) it drains the eventfd and reads the queue
    /// instead: `Ok(false)` if that found entries (their doorbells are queued for
    /// [`Worker::take_doorbells`]).
    pub fn arm(&self) -> Result<bool> {
        if let Some(own) = &self.inner.own_fd {
            let mut counter = 0u64;
            // SAFETY: own is an open nonblocking eventfd; counter is 8 writable bytes.
            // EAGAIN (nothing to drain) is the normal case and needs no handling.
            unsafe { libc::read(own.as_raw_fd(), ptr::from_mut(&mut counter).cast(), 8) };
            return Ok(self.progress() == 0);
        }
        let _guard = self.inner.domain.lock();
        let mut fids = [
            // SAFETY: cq open; taking the address of its fid field.
            unsafe { &raw mut (*self.inner.cq).fid },
        ];
        // SAFETY: fabric open; fids holds one live fid of this fabric.
        let ret = unsafe { sys::fi_trywait(self.inner.domain.fabric, fids.as_mut_ptr(), 1) };
        match ret {
            0 => Ok(true),
            r if r == -(sys::FI_EAGAIN as i32) => Ok(false),
            r => Err(ofi_error("arm completion queue fd (fi_trywait)", i64::from(r))),
        }
    }

    /// Wakes a thread sleeping on the event fd (`fi_cq_signal`, or a write to our
    /// eventfd when the queue has no fd).
    pub fn wake(&self) -> Result<()> {
        if let Some(own) = &self.inner.own_fd {
            let one = 1u64;
            // SAFETY: own is an open eventfd; one is 8 readable bytes.
            let n = unsafe { libc::write(own.as_raw_fd(), ptr::from_ref(&one).cast(), 8) };
            if n == 8 || std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock {
                return Ok(());
            }
            return Err(Error::Io { op: "wake (write eventfd)", source: std::io::Error::last_os_error() });
        }
        // The lock is never held across a sleep, so taking it here cannot stall the
        // wake-up, and keeps the FI_THREAD_DOMAIN contract for this call too.
        let _guard = self.inner.domain.lock();
        // SAFETY: cq open (lock held); fi_cq_signal only signals its wait object.
        let ret = unsafe { sys::fi_cq_signal(self.inner.cq) };
        check("wake completion queue (fi_cq_signal)", ret)
    }

    /// Whether the event fd becomes readable by itself when a doorbell arrives or an
    /// operation completes: true over tcp/verbs (the completion queue's fd), false
    /// on shm, whose completion queue has no fd wait object in libfabric 1.17 (the
    /// fd then only reports [`Worker::wake`]; sleep in short slices).
    pub fn wakes_on_receive(&self) -> bool {
        self.inner.own_fd.is_none()
    }

    /// Moves doorbells received so far into `out`; returns how many were dropped
    /// since the last call because the queue was full.
    pub fn take_doorbells(&self, out: &mut Vec<Doorbell>) -> u64 {
        self.inner.doorbells.take(out)
    }

    /// Doorbells that were not (too long, or failed), since the worker opened.
    pub fn malformed_doorbells(&self) -> u64 {
        self.inner.doorbells.malformed()
    }
}

impl crate::transport::Transport for Worker {
    type Region = Region;
    type Endpoint = Endpoint;

    fn name(&self) -> &'static str {
        "ofi"
    }
    fn alloc_region(&self, len: usize) -> Result<Region> {
        Worker::alloc_region(self, len)
    }
    fn address(&self) -> Result<Vec<u8>> {
        Worker::address(self)
    }
    fn connect(&self, peer_address: &[u8]) -> Result<Endpoint> {
        Worker::connect(self, peer_address)
    }
    fn progress(&self) -> usize {
        Worker::progress(self)
    }
    fn event_fd(&self) -> Result<RawFd> {
        Worker::event_fd(self)
    }
    fn arm(&self) -> Result<bool> {
        Worker::arm(self)
    }
    fn wake(&self) -> Result<()> {
        Worker::wake(self)
    }
    fn take_doorbells(&self, out: &mut Vec<Doorbell>) -> u64 {
        Worker::take_doorbells(self, out)
    }
    fn wakes_on_receive(&self) -> bool {
        Worker::wakes_on_receive(self)
    }
}
