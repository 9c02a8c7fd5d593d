//! A crash (a `kill -9` of the agent) at any point of a write or truncate.

use super::*;

/// A container whose objects stop writing after a budget of mutating calls, the
/// last one torn at a page boundary of the file, as a `kill -9` of the agent in the
/// middle of a large `pwrite` leaves it.
struct Crashing {
    inner: Arc<dyn Container>,
    budget: Arc<AtomicI64>,
}

struct CrashingObject {
    inner: Arc<dyn Object>,
    budget: Arc<AtomicI64>,
}

fn crashed() -> Error {
    Error::Io { context: "crash".into(), source: std::io::Error::other("the agent was killed") }
}

impl Container for Crashing {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn chunk_bytes(&self) -> u64 {
        self.inner.chunk_bytes()
    }
    fn stat(&self, path: &NsPath) -> Result<Attr> {
        self.inner.stat(path)
    }
    fn mkdir(&self, path: &NsPath, mode: u32) -> Result<Attr> {
        self.inner.mkdir(path, mode)
    }
    fn readdir(&self, path: &NsPath, anchor: Option<&str>, max: usize) -> Result<(Vec<DirEntry>, Option<String>)> {
        self.inner.readdir(path, anchor, max)
    }
    fn open(&self, path: &NsPath, options: OpenOptions, mode: u32) -> Result<Arc<dyn Object>> {
        let inner = self.inner.open(path, options, mode)?;
        Ok(Arc::new(CrashingObject { inner, budget: self.budget.clone() }))
    }
    fn remove(&self, path: &NsPath, recursive: bool) -> Result<()> {
        self.inner.remove(path, recursive)
    }
    fn rename(&self, from: &NsPath, to: &NsPath) -> Result<()> {
        self.inner.rename(from, to)
    }
    fn replace(&self, from: &NsPath, to: &NsPath) -> Result<()> {
        self.inner.replace(from, to)
    }
    fn truncate(&self, path: &NsPath, size: u64) -> Result<()> {
        self.inner.truncate(path, size)
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
}

impl Object for CrashingObject {
    fn path(&self) -> &NsPath {
        self.inner.path()
    }
    fn writable(&self) -> bool {
        self.inner.writable()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        match self.budget.fetch_sub(1, Ordering::SeqCst) {
            left if left > 0 => self.inner.write_at(buf, offset),
            0 => {
                let cut = ((offset as usize + buf.len() / 2) / 4096 * 4096).saturating_sub(offset as usize);
                if cut > 0 && cut < buf.len() {
                    self.inner.write_at(&buf[..cut], offset)?;
                }
                Err(crashed())
            }
            _ => Err(crashed()),
        }
    }
    fn stat(&self) -> Result<Attr> {
        self.inner.stat()
    }
    fn truncate(&self, size: u64) -> Result<()> {
        if self.budget.fetch_sub(1, Ordering::SeqCst) > 0 { self.inner.truncate(size) } else { Err(crashed()) }
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
}

enum CrashOp {
    Write(usize, Vec<u8>),
    Truncate(usize),
}

/// After a crash at any point of any kind of write or truncate, the file opens,
/// its size is the old or the new one, and every block reads as its old or new
/// content or fails with an integrity error; and the next write repairs it.
#[test]
fn a_crash_at_any_point_leaves_old_or_new_blocks() {
    let env = Env::new();
    let raw = env.raw("c");
    let key = env.key_file("k");
    let keys = source(&[("t", 1, &key)]);
    let enc = encrypted(&raw, settings("t", "c", keys.clone(), 1));
    let stored_path = env.stored("c", "/f");
    let mut rng = StdRng::seed_from_u64(12);
    let mut integrity_seen = 0;
    for round in 0..150 {
        // A fresh file with random content.
        let len = rng.random_range(1..5 * B);
        let base = random_bytes(&mut rng, len);
        let f = enc.open(&p("/f"), OpenOptions { truncate: true, ..rw() }, 0o644).unwrap();
        f.write_at(&base, 0).unwrap();
        drop(f);
        let image = fs::read(&stored_path).unwrap();
        let op = match round % 5 {
            0 | 1 => {
                let at = rng.random_range(0..base.len() + 2 * B);
                let len = rng.random_range(1..3 * B);
                CrashOp::Write(at, random_bytes(&mut rng, len))
            }
            2 => CrashOp::Write(base.len() + rng.random_range(0..3 * B), random_bytes(&mut rng, B + 7)),
            3 => CrashOp::Truncate(rng.random_range(0..base.len())),
            _ => CrashOp::Truncate(base.len() + rng.random_range(1..3 * B)),
        };
        let mut after = base.clone();
        match &op {
            CrashOp::Write(at, data) => {
                after.resize(after.len().max(at + data.len()), 0);
                after[*at..at + data.len()].copy_from_slice(data);
            }
            CrashOp::Truncate(size) => after.resize(*size, 0),
        }
        for budget in 0.. {
            fs::write(&stored_path, &image).unwrap();
            let crashing: Arc<dyn Container> =
                Arc::new(Crashing { inner: raw.clone(), budget: Arc::new(AtomicI64::new(budget)) });
            let doomed = encrypted(&crashing, settings("t", "c", keys.clone(), 1));
            let f = doomed.open(&p("/f"), OpenOptions { write: true, ..ro() }, 0).unwrap();
            let outcome = match &op {
                CrashOp::Write(at, data) => f.write_at(data, *at as u64),
                CrashOp::Truncate(size) => f.truncate(*size as u64),
            };
            drop((f, doomed));
            // What a restarted agent sees.
            let fresh = encrypted(&raw, settings("t", "c", keys.clone(), 1));
            let f = fresh.open(&p("/f"), ro(), 0).unwrap();
            let size = f.stat().unwrap().size as usize;
            assert!(size == base.len() || size == after.len(), "round {round} budget {budget}: size {size}");
            let fits = |model: &[u8], range: &Range<usize>, got: &[u8]| model.get(range.clone()) == Some(got);
            let mut seen = Vec::with_capacity(size);
            let mut torn = false;
            for index in 0..size.div_ceil(B) {
                let range = index * B..((index + 1) * B).min(size);
                let mut buf = vec![0u8; range.len()];
                match f.read_at(&mut buf, range.start as u64) {
                    Ok(n) => {
                        assert_eq!(n, range.len());
                        assert!(
                            fits(&base, &range, &buf) || fits(&after, &range, &buf),
                            "round {round} budget {budget}: block {index} is neither old nor new"
                        );
                    }
                    Err(Error::Integrity { block_index: Some(i), .. }) if i == index as u64 => {
                        integrity_seen += 1;
                        torn = true;
                        assert!(outcome.is_err(), "round {round}: integrity error after a completed op");
                    }
                    Err(e) => panic!("round {round} budget {budget}: block {index}: {e}"),
                }
                seen.extend_from_slice(&buf);
            }
            drop(f);
            // The restarted agent writes on: repair, then an append reads back (a
            // torn block cannot be extended: that file is created again instead).
            let (options, at) = if torn { (OpenOptions { truncate: true, ..rw() }, 0) } else { (rw(), size) };
            let f = fresh.open(&p("/f"), options, 0).unwrap();
            f.write_at(b"tail", at as u64).unwrap();
            let mut tail = [0u8; 4];
            assert_eq!(f.read_at(&mut tail, at as u64).unwrap(), 4);
            assert_eq!(&tail, b"tail");
            let layout = Layout::new(B as u32).unwrap();
            assert_eq!(fs::metadata(&stored_path).unwrap().len(), layout.stored_bytes(at as u64 + 4));
            if outcome.is_ok() {
                assert_eq!(seen, after, "round {round}: the op completed");
                break;
            }
        }
    }
    assert!(integrity_seen > 0, "no torn block was ever produced: the test does not test");
}
