//! Hostile ring entries, each of which the agent must refuse with its own completion
//! status while other sessions go on: shared by the in-process test
//! (`tests/data_plane.rs`) and `dpuio-test-host hostile` (a host in another network
//! namespace, `tests/two_hosts.rs`), so both check the same cases.

use std::time::Duration;

use dpuio_shim::{Access, Client, IoStatus, Opcode, RegionAccess, Request};
use rand::{Rng, SeedableRng};

/// Bytes of the file the checks read: at least 1000 + 8192.
pub const FILE_BYTES: u64 = 1 << 20;

/// The byte the file holds at offset `i` (write it with [`pattern_bytes`]).
pub fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(7).wrapping_add(3) % 251) as u8
}

/// The file the checks read, [`FILE_BYTES`] long.
pub fn pattern_bytes() -> Vec<u8> {
    (0..FILE_BYTES).map(pattern).collect()
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was tried, e.g. "guessed handle".
    pub name: String,
    pub passed: bool,
    /// What happened, and what was wanted when it differs.
    pub detail: String,
}

impl std::fmt::Display for Check {
    /// `ok NAME: DETAIL` or `FAILED NAME: DETAIL`: one line, as `dpuio-test-host
    /// hostile` prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", if self.passed { "ok" } else { "FAILED" }, self.name, self.detail)
    }
}

fn check(name: &str, passed: bool, detail: String) -> Check {
    Check { name: name.to_owned(), passed, detail }
}

/// Submit the hostile cases on `a`'s data plane (with regions and handles of `b`, a
/// second session of the same tenant, as the foreign ones) and 100 ring entries of
/// random bytes; then read `path` (holding [`pattern_bytes`]) through both sessions.
/// Every check is returned, passed or not: the caller asserts (or prints).
/// Panics only where the set-up itself fails (open, register).
pub async fn hostile_entries(a: &Client, b: &Client, path: &str) -> Vec<Check> {
    let ro = a.open(path, Access::ReadOnly).await.expect("open the file read-only");
    let region = a.register_region(64 << 10, RegionAccess::ReadWrite).await.expect("register a region");
    let read_only_region = a.register_region(4096, RegionAccess::ReadByAgent).await.expect("register a region");
    // B owns more regions than A, so B has region ids that A does not.
    let mut b_regions = Vec::new();
    for _ in 0..4 {
        b_regions.push(b.register_region(4096, RegionAccess::ReadWrite).await.expect("register a region of b"));
    }
    let b_file = b.open(path, Access::ReadOnly).await.expect("open the file in b");
    let foreign_region = b_regions.last().expect("four regions").id();

    let good = ro.read_request(&region, 0, 4096, 0);
    let cases: Vec<(&str, Request, IoStatus)> = vec![
        (
            "region offset past the end",
            Request { region_offset: (64 << 10) - 10, length: 100, ..good },
            IoStatus::OutOfRange,
        ),
        ("longer than the region", Request { length: (64 << 10) + 1, ..good }, IoStatus::OutOfRange),
        ("offset overflow", Request { region_offset: u64::MAX - 1, length: 4, ..good }, IoStatus::OutOfRange),
        ("region of another session", Request { region_id: foreign_region, ..good }, IoStatus::BadRegion),
        ("handle of another session", Request { handle: b_file.handle(), ..good }, IoStatus::BadHandle),
        ("guessed handle", Request { handle: 0x1234_5678, ..good }, IoStatus::BadHandle),
        ("write through a read-only handle", Request { opcode: Opcode::Write, ..good }, IoStatus::Access),
        (
            "read into a region the agent may not write",
            Request { region_id: read_only_region.id(), ..good },
            IoStatus::Access,
        ),
        ("zero length", Request { length: 0, ..good }, IoStatus::Malformed),
        ("over max_io_bytes", Request { length: 1 << 40, ..good }, IoStatus::TooLarge),
    ];
    let a2 = a.clone();
    let (results, garbage) = tokio::task::spawn_blocking(move || {
        let mut batch = a2.batch().expect("a batch");
        for (i, (_, r, _)) in cases.iter().enumerate() {
            batch.push(&Request { user_data: i as u64, ..*r }).expect("push a case");
        }
        batch.submit().expect("submit the cases");
        let done = batch.wait(cases.len(), Duration::from_secs(30)).expect("completions of the cases");
        // Random bytes as ring entries.
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..100 {
            let mut e = [0u8; 64];
            rng.fill(&mut e[..]);
            batch.push_raw_entry(&e).expect("push random bytes");
        }
        batch.submit().expect("submit random bytes");
        let garbage = batch.wait(100, Duration::from_secs(30)).expect("completions of random bytes");
        (done.into_iter().zip(cases).collect::<Vec<_>>(), garbage)
    })
    .await
    .expect("the submitting thread");
    let mut checks: Vec<Check> = results
        .into_iter()
        .map(|(done, (name, _, want))| {
            let detail = if done.result == Err(want) {
                format!("{want:?}")
            } else {
                format!("got {:?}, want Err({want:?})", done.result)
            };
            check(name, done.result == Err(want), detail)
        })
        .collect();
    let malformed = garbage.iter().filter(|d| d.result == Err(IoStatus::Malformed)).count();
    checks.push(check(
        "100 entries of random bytes",
        garbage.len() == 100 && malformed == 100,
        format!("{} completions, {malformed} Malformed", garbage.len()),
    ));

    // Both sessions still work, with the right bytes.
    for (session, client) in [("a", a), ("b", b)] {
        let file = client.open(path, Access::ReadOnly).await.expect("open again");
        let buf = client.register_region(8192, RegionAccess::WriteByAgent).await.expect("register a region");
        let c = client.clone();
        let req = file.read_request(&buf, 0, 8192, 1000);
        let done = tokio::task::spawn_blocking(move || c.submit_blocking(&[req])).await.expect("the reading thread");
        let name = format!("session {session} still reads");
        let bytes_ok = buf.bytes(0, buf.len()).to_vec().iter().enumerate().all(|(i, &x)| x == pattern(1000 + i as u64));
        checks.push(match done {
            Ok(done) if done[0].result == Ok(8192) && bytes_ok => check(&name, true, "8192 bytes, as written".into()),
            Ok(done) => check(&name, false, format!("result {:?}, bytes as written: {bytes_ok}", done[0].result)),
            Err(e) => check(&name, false, e.to_string()),
        });
    }
    checks
}
