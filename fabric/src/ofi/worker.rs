//! The libfabric worker, the [`crate::Transport`] of libfabric: it opens fabric,
//! domain, address vector, completion queue and one RDM endpoint, and makes regions
//! and endpoints; progress, doorbell receipt and the event fd. What its endpoints
//! share with it lives in `shared`.

use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use libfabric_sys as sys;

use super::domain::DomainInner;
use super::region::Mr;
use super::shared::{CQ_BATCH, Ops, RecvPool, WorkerShared};
use super::{Endpoint, OfiConfig, Region, check, ofi_error};
use crate::doorbell::{Doorbell, DoorbellQueue, MAX_DOORBELL_BYTES};
use crate::error::{Error, Result};
use crate::transport::Transport;

/// A libfabric worker: one RDM endpoint with its completion queue and address
/// vector. `Send + Sync`, cheap to clone (a reference): hand a clone to a
/// [`crate::ProgressThread`].
#[derive(Clone)]
pub struct Worker {
    shared: Arc<WorkerShared>,
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
        // libfabric is loaded here, on the first worker (libfabric_sys's docs say why),
        // and the signal handlers its dependencies install at load time are taken back.
        let api = crate::keeping_signal_handlers(sys::api)?;
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

        let mut inner = WorkerShared {
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
            // WorkerShared's Drop closes what was opened.
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
        let worker = Worker { shared: Arc::new(inner) };
        {
            let _guard = domain.lock();
            for slot in 0..config.recv_slots {
                worker.shared.post_recv(slot)?;
            }
        }
        Ok(worker)
    }

    /// The configuration this worker was opened with.
    pub fn config(&self) -> &OfiConfig {
        &self.shared.config
    }

    /// What libfabric chose: provider, fabric, domain, memory-registration mode and
    /// the completion semantics of writes. For logs.
    pub fn describe(&self) -> String {
        self.shared.describe.clone()
    }

    /// Registers memory the caller mapped, held by `keep`; see
    /// [`crate::any::Worker::register_lent`].
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` must be mapped read/write for as long as `keep` lives.
    pub unsafe fn register_lent(
        &self,
        ptr: *mut u8,
        len: usize,
        keep: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<Region> {
        // SAFETY: passed on from the caller.
        unsafe { Region::lent(self.shared.domain.clone(), ptr, len, keep) }
    }

    /// Doorbells that were not (too long, or failed), since the worker opened.
    pub fn malformed_doorbells(&self) -> u64 {
        self.shared.doorbells.malformed()
    }
}

impl Transport for Worker {
    type Region = Region;
    type Endpoint = Endpoint;

    fn name(&self) -> &'static str {
        "ofi"
    }

    /// Allocates `len` bytes (anonymous memory, page-aligned) and registers them with
    /// the domain for local and remote read/write.
    fn alloc_region(&self, len: usize) -> Result<Region> {
        Region::allocate(self.shared.domain.clone(), len)
    }

    /// This endpoint's address (`fi_getname`), for the peer's [`Transport::connect`].
    fn address(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        loop {
            let mut len = buf.len();
            let ret = {
                let _guard = self.shared.domain.lock();
                // SAFETY: ep open; buf is writable for len bytes; len writable.
                unsafe { sys::fi_getname(&mut (*self.shared.ep).fid, buf.as_mut_ptr().cast(), &mut len) }
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
    /// operation, which the probe of
    /// [`unpack_key`](crate::transport::Endpoint::unpack_key) performs.
    ///
    /// The provider parses the address: accept addresses only from authenticated
    /// peers (the control plane's mTLS session).
    fn connect(&self, peer_address: &[u8]) -> Result<Endpoint> {
        if peer_address.is_empty() {
            return Err(Error::Config("empty peer address".into()));
        }
        let mut addr: sys::fi_addr_t = sys::FI_ADDR_NOTAVAIL;
        let ret = {
            let _guard = self.shared.domain.lock();
            // SAFETY: av open; peer_address readable for the call (the provider copies
            // it); addr writable for one entry.
            unsafe { sys::fi_av_insert(self.shared.av, peer_address.as_ptr().cast(), 1, &mut addr, 0, ptr::null_mut()) }
        };
        if ret != 1 {
            return Err(if ret < 0 {
                ofi_error("insert peer address (fi_av_insert)", i64::from(ret))
            } else {
                Error::Config("the provider refused the peer address (fi_av_insert inserted 0)".into())
            });
        }
        Ok(Endpoint::new(self.shared.clone(), addr))
    }

    /// Reads the completion queue until it is empty; returns the entries handled.
    /// Completed operations release what they held; doorbells land in the queue read
    /// by [`Transport::take_doorbells`]. Over `tcp;ofi_rxm` this is also what answers
    /// peers (manual progress).
    fn progress(&self) -> usize {
        self.shared.progress()
    }

    /// The completion queue's wait fd (`fi_control(FI_GETWAIT)`): readable when
    /// [`Transport::progress`] has work. Owned by the queue: do not close it.
    fn event_fd(&self) -> Result<RawFd> {
        Ok(self.shared.wait_fd)
    }

    /// `fi_trywait` on the completion queue: `Ok(true)` if nothing is pending and it
    /// is safe to sleep on the fd, `Ok(false)` if entries are pending.
    ///
    /// Without an fd wait object (shm) it drains the eventfd and reads the queue
    /// instead: `Ok(false)` if that found entries (their doorbells are queued for
    /// [`Transport::take_doorbells`]).
    fn arm(&self) -> Result<bool> {
        if let Some(own) = &self.shared.own_fd {
            let mut counter = 0u64;
            // SAFETY: own is an open nonblocking eventfd; counter is 8 writable bytes.
            // EAGAIN (nothing to drain) is the normal case and needs no handling.
            unsafe { libc::read(own.as_raw_fd(), ptr::from_mut(&mut counter).cast(), 8) };
            return Ok(self.shared.progress() == 0);
        }
        let _guard = self.shared.domain.lock();
        let mut fids = [
            // SAFETY: cq open; taking the address of its fid field.
            unsafe { &raw mut (*self.shared.cq).fid },
        ];
        // SAFETY: fabric open; fids holds one live fid of this fabric.
        let ret = unsafe { sys::fi_trywait(self.shared.domain.fabric, fids.as_mut_ptr(), 1) };
        match ret {
            0 => Ok(true),
            r if r == -(sys::FI_EAGAIN as i32) => Ok(false),
            r => Err(ofi_error("arm completion queue fd (fi_trywait)", i64::from(r))),
        }
    }

    /// Wakes a thread sleeping on the event fd (`fi_cq_signal`, or a write to our
    /// eventfd when the queue has no fd).
    fn wake(&self) -> Result<()> {
        if let Some(own) = &self.shared.own_fd {
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
        let _guard = self.shared.domain.lock();
        // SAFETY: cq open (lock held); fi_cq_signal only signals its wait object.
        let ret = unsafe { sys::fi_cq_signal(self.shared.cq) };
        check("wake completion queue (fi_cq_signal)", ret)
    }

    /// Whether the event fd becomes readable by itself when a doorbell arrives or an
    /// operation completes: true over tcp/verbs (the completion queue's fd), false
    /// on shm, whose completion queue has no fd wait object in libfabric 1.17 (the
    /// fd then only reports [`Transport::wake`]; sleep in short slices).
    fn wakes_on_receive(&self) -> bool {
        self.shared.own_fd.is_none()
    }

    /// Moves doorbells received so far into `out`; returns how many were dropped
    /// since the last call because the queue was full.
    fn take_doorbells(&self, out: &mut Vec<Doorbell>) -> u64 {
        self.shared.doorbells.take(out)
    }
}
