//! Batches: rings of prepared requests, submitted with one doorbell and waited on.

use super::*;
use crate::file::request;

/// Take one of the client's rings for a batch. Fails with DPUIO_E_RESOURCE_EXHAUSTED
/// when every ring is held by a batch (see `dpuio_limits.rings`).
///
/// # Safety
/// `client` a live client; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_create(client: *const dpuio_client, out: *mut *mut dpuio_batch) -> c_int {
    ffi("dpuio_batch_create", || {
        // SAFETY: see the header's rules.
        let c = unsafe { handles::get(client) }?;
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let inner = c.session.data_client()?;
        let rings = c.session.rings();
        // Client::batch() waits for a free ring; refuse instead of blocking forever
        // when batches hold them all (pread/pwrite only hold one for a call).
        if c.batches.fetch_add(1, Ordering::AcqRel) >= rings {
            c.batches.fetch_sub(1, Ordering::AcqRel);
            return Err(Failure::new(
                Code::ResourceExhausted,
                format!("all {rings} rings of this client are held by batches; destroy one or attach with more rings"),
            ));
        }
        let batch = match inner.batch() {
            Ok(b) => b,
            Err(e) => {
                c.batches.fetch_sub(1, Ordering::AcqRel);
                return Err(e.into());
            }
        };
        let b = handles::into_raw(dpuio_batch {
            session: c.session.clone(),
            batch: ProcessLocal::new(batch),
            ready: VecDeque::new(),
            staged: 0,
            batches: c.batches.clone(),
        });
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, b, "out") }?;
        Ok(0)
    })
}

impl dpuio_batch {
    fn push(&mut self, request: &Request) -> Result<()> {
        let max = self.session.max_io_bytes();
        if request.length > max {
            return Err(Failure::invalid(format!(
                "length {} exceeds the agent's max_io_bytes {max}: split the request",
                request.length
            )));
        }
        if request.length == 0 {
            return Err(Failure::invalid("length is 0"));
        }
        let batch = self.batch.get_mut()?;
        if batch.room() == 0 {
            return Err(Failure::new(
                Code::ResourceExhausted,
                "the ring is full: submit and wait for completions first (see dpuio_batch_room)",
            ));
        }
        batch.push(request)?;
        self.staged += 1;
        Ok(())
    }
}

/// Prepare a read of `length` bytes at `file_offset` into the region at
/// `region_offset` (not visible to the agent until `dpuio_batch_submit`).
///
/// # Safety
/// `batch` a live batch used by this thread only; `file`, `region` live handles of
/// the batch's client.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_prep_read(
    batch: *mut dpuio_batch,
    file: *const dpuio_file,
    region: *const dpuio_region,
    region_offset: u64,
    length: u64,
    file_offset: u64,
    user_data: u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        prep_one(
            "dpuio_batch_prep_read",
            batch,
            file,
            region,
            DPUIO_OP_READ,
            0,
            region_offset,
            length,
            file_offset,
            user_data,
        )
    }
}

/// Prepare a write of `length` bytes from the region at `region_offset` to
/// `file_offset`. `flags`: `DPUIO_IO_SYNC` or 0.
///
/// # Safety
/// As `dpuio_batch_prep_read`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_prep_write(
    batch: *mut dpuio_batch,
    file: *const dpuio_file,
    region: *const dpuio_region,
    region_offset: u64,
    length: u64,
    file_offset: u64,
    flags: u32,
    user_data: u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        prep_one(
            "dpuio_batch_prep_write",
            batch,
            file,
            region,
            DPUIO_OP_WRITE,
            flags,
            region_offset,
            length,
            file_offset,
            user_data,
        )
    }
}

/// The body of `dpuio_batch_prep_read` and `dpuio_batch_prep_write` (`name`): one
/// request of `opcode` pushed onto the batch.
///
/// # Safety
/// As `dpuio_batch_prep_read`.
#[allow(clippy::too_many_arguments)]
unsafe fn prep_one(
    name: &str,
    batch: *mut dpuio_batch,
    file: *const dpuio_file,
    region: *const dpuio_region,
    opcode: u32,
    flags: u32,
    region_offset: u64,
    length: u64,
    file_offset: u64,
    user_data: u64,
) -> c_int {
    ffi(name, || {
        // SAFETY: see the header's rules.
        let (b, f, r) = unsafe { (handles::get_mut(batch)?, handles::get(file)?, handles::get(region)?) };
        let req = request(opcode, flags, f, r, region_offset, length, file_offset, user_data)?;
        same_client(b, f)?;
        b.push(&req)?;
        Ok(0)
    })
}

fn same_client(b: &dpuio_batch, f: &dpuio_file) -> Result<()> {
    if !Arc::ptr_eq(&b.session, &f.session) {
        return Err(Failure::invalid("the batch and the file belong to different clients"));
    }
    Ok(())
}

/// Prepare `count` requests given as an array. All are checked before any is
/// prepared: on failure none is, and the error names the index of the bad one.
/// Returns `count` or a negative code.
///
/// # Safety
/// `batch` a live batch used by this thread only; `ios` points at `count` structs
/// whose handles are live handles of the batch's client.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_prep(batch: *mut dpuio_batch, ios: *const dpuio_io, count: usize) -> c_int {
    ffi("dpuio_batch_prep", || {
        // SAFETY: see the header's rules.
        let b = unsafe { handles::get_mut(batch) }?;
        if count == 0 {
            return Ok(0);
        }
        if ios.is_null() || !ios.is_aligned() {
            return Err(Failure::invalid("ios is NULL or misaligned"));
        }
        let count_int = c_int::try_from(count).map_err(|_| Failure::invalid("count is too large"))?;
        // SAFETY: non-null and aligned; the caller guarantees count valid structs.
        let ios = unsafe { std::slice::from_raw_parts(ios, count) };
        let room = b.batch.get()?.room();
        if count > room {
            return Err(Failure::new(
                Code::ResourceExhausted,
                format!("{count} requests but room for {room}: submit and wait for completions first"),
            ));
        }
        let mut requests = Vec::with_capacity(count);
        for (i, io) in ios.iter().enumerate() {
            let at = |e: Failure| Failure::new(e.code, format!("ios[{i}]: {}", e.message));
            // SAFETY: see the header's rules.
            let (f, r) = unsafe { (handles::get(io.file).map_err(at)?, handles::get(io.region).map_err(at)?) };
            same_client(b, f).map_err(at)?;
            let req = request(io.opcode, io.flags, f, r, io.region_offset, io.length, io.file_offset, io.user_data)
                .map_err(at)?;
            if req.length == 0 || req.length > b.session.max_io_bytes() {
                return Err(at(Failure::invalid(format!(
                    "length {} is 0 or exceeds the agent's max_io_bytes {}",
                    req.length,
                    b.session.max_io_bytes()
                ))));
            }
            requests.push(req);
        }
        for req in &requests {
            b.push(req)?;
        }
        Ok(count_int)
    })
}

/// Make every prepared request visible to the agent with one doorbell. Returns how
/// many were submitted.
///
/// # Safety
/// `batch` a live batch used by this thread only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_submit(batch: *mut dpuio_batch) -> c_int {
    ffi("dpuio_batch_submit", || {
        // SAFETY: see the header's rules.
        let b = unsafe { handles::get_mut(batch) }?;
        b.session.data_client()?;
        let n = b.batch.get_mut()?.submit()?;
        b.staged = 0;
        Ok(c_int::try_from(n).unwrap_or(c_int::MAX))
    })
}

/// Wait until at least `min` completions are available (fewer if fewer requests are
/// submitted and not yet returned) or `timeout_ms` passes (negative: no limit; 0: only
/// take what is there), then copy up to `max` of them into `out`. Returns how many
/// were copied: fewer than `min` means the timeout passed. Completions beyond `max`
/// stay for the next call.
///
/// # Safety
/// `batch` a live batch used by this thread only; `out` valid for `max` structs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_wait(
    batch: *mut dpuio_batch,
    out: *mut dpuio_completion,
    max: usize,
    min: usize,
    timeout_ms: i64,
) -> c_int {
    ffi("dpuio_batch_wait", || {
        // SAFETY: see the header's rules.
        let b = unsafe { handles::get_mut(batch) }?;
        if max > 0 && (out.is_null() || !out.is_aligned()) {
            return Err(Failure::invalid("out is NULL or misaligned"));
        }
        if min > max {
            return Err(Failure::invalid(format!("min {min} is larger than max {max}")));
        }
        let deadline = (timeout_ms >= 0).then(|| Instant::now() + Duration::from_millis(timeout_ms as u64));
        let staged = b.staged;
        let ready = &mut b.ready;
        let ring = b.batch.get_mut()?;
        let submitted = ring.in_flight() - staged;
        let want = min.min(ready.len() + submitted);
        ready.extend(ring.poll());
        while ready.len() < want {
            // Wait for one completion at a time: the shim's wait returns everything
            // that arrived, and on a timeout it has taken nothing (with a minimum of
            // one, nothing is lost).
            let slice = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if slice.is_zero() {
                break;
            }
            match ring.wait(1, slice) {
                Ok(done) => ready.extend(done),
                Err(e) => {
                    let f = Failure::from(e);
                    if f.code == Code::TimedOut {
                        if deadline.is_some() {
                            break;
                        }
                        continue;
                    }
                    return Err(f);
                }
            }
        }
        let n = ready.len().min(max).min(c_int::MAX as usize);
        for i in 0..n {
            let d = ready.pop_front().expect("n <= ready.len()");
            // SAFETY: out is non-null and aligned (checked) and valid for max >= n
            // structs (the caller's contract).
            unsafe { out.add(i).write(completion_of(&d)) };
        }
        Ok(n as c_int)
    })
}

/// Requests prepared or submitted whose completion was not returned yet.
///
/// # Safety
/// `batch` a live batch used by this thread only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_in_flight(batch: *const dpuio_batch) -> usize {
    ffi_value("dpuio_batch_in_flight", 0, || {
        // SAFETY: see the header's rules.
        let b = unsafe { handles::get(batch) }?;
        Ok(b.batch.get()?.in_flight() + b.ready.len())
    })
}

/// Requests that can still be prepared before completions must be waited for.
///
/// # Safety
/// `batch` a live batch used by this thread only.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_room(batch: *const dpuio_batch) -> usize {
    ffi_value("dpuio_batch_room", 0, || {
        // SAFETY: see the header's rules.
        let b = unsafe { handles::get(batch) }?;
        Ok(b.batch.get()?.room())
    })
}

/// Free a batch and give its ring back. Requests submitted and not completed are
/// waited for first (the agent may still be writing their regions); prepared but
/// unsubmitted ones are dropped.
///
/// # Safety
/// No other thread may use `batch` during or after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dpuio_batch_destroy(batch: *mut dpuio_batch) -> c_int {
    ffi("dpuio_batch_destroy", || {
        // SAFETY: the caller guarantees no concurrent use.
        drop(unsafe { handles::take(batch) }?);
        Ok(0)
    })
}
