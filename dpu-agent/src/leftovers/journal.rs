//! The journal of unfinished puts on disk: `data_dir/puts.journal`, one line per change.
//!
//! ```text
//! dpuio-agent unfinished puts, version 1
//! + SESSION TENANT CONTAINER PATH     a session made (or claimed) a temporary file
//! - CONTAINER PATH                    it was renamed, removed, or found gone
//! ```
//!
//! Fields are separated by one space; `%`, whitespace and control characters in them are
//! written `%XX` (their UTF-8 bytes). A line is one `write(2)`, made before the file it
//! notes is created, so a crash of the agent loses none; the agent flushes the journal
//! to disk (`fdatasync`) once a second when it changed ([`FLUSH_EVERY`]), so a power
//! loss of the machine loses at most that last second of notes. A flush per Create would
//! be safer against that and cost every put: an `fdatasync` of an appended line takes
//! 3.5 ms on this project's VM disk, a third to half of a whole 4 KiB put there
//! (docs/dataplane.md, "Unfinished puts"). The file is rewritten (atomically, as the state file is) at each start and
//! whenever it holds many times more lines than files noted, so it stays about as long
//! as the list of unfinished puts.
//!
//! A last line without its newline (a power loss mid-write) is dropped with a warning;
//! anything else this agent did not write stops the start with the file's name and the
//! way out.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dpuio_backend::NsPath;

use super::{Record, Temp};
use crate::runtime::lock;

/// The journal's name in the data directory.
pub const JOURNAL_FILE_NAME: &str = "puts.journal";

const HEADER: &str = "dpuio-agent unfinished puts, version 1";

/// How often the agent flushes a journal that changed to disk.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Lines appended since the last rewrite before the journal is rewritten, at least.
const COMPACT_AFTER_LINES: usize = 4096;

/// The journal of the agent whose data directory is `data_dir`.
pub fn journal_file(data_dir: &Path) -> PathBuf {
    data_dir.join(JOURNAL_FILE_NAME)
}

/// Why the journal could not be read.
#[derive(Debug, thiserror::Error)]
#[error(
    "the journal of unfinished puts {path}: {reason}; it lists the temporary files of puts to remove: \
     move it away to start without it (those files then stay until removed with `dpuio rm`)"
)]
pub struct JournalError {
    pub path: PathBuf,
    pub reason: String,
}

/// Read the journal at `path`: its records in order (a missing file has none), and
/// whether a torn last line was dropped.
pub fn load(path: &Path) -> Result<(Vec<Record>, bool), JournalError> {
    let error = |reason: String| JournalError { path: path.to_owned(), reason };
    let text = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), false)),
        Err(e) => return Err(error(format!("cannot read it: {e}"))),
    };
    let text = String::from_utf8(text).map_err(|_| error("it is not UTF-8 text".into()))?;
    let torn = !text.is_empty() && !text.ends_with('\n');
    let mut lines: Vec<&str> = text.split_terminator('\n').collect();
    if torn {
        lines.pop();
    }
    let mut records = Vec::new();
    let mut iter = lines.into_iter().enumerate();
    match iter.next() {
        None => return Ok((records, torn)),
        Some((_, HEADER)) => {}
        Some((_, other)) => {
            return Err(error(format!("its first line is {:?}, and this dpu-agent reads {HEADER:?}", short(other))));
        }
    }
    for (n, line) in iter {
        records.push(parse(line).map_err(|why| error(format!("line {}: {why}", n + 1)))?);
    }
    Ok((records, torn))
}

fn short(s: &str) -> String {
    s.chars().take(60).collect()
}

fn parse(line: &str) -> Result<Record, String> {
    let fields: Vec<&str> = line.split(' ').collect();
    let path = |raw: &str| {
        let text = unescape(raw)?;
        NsPath::parse(&text).map_err(|e| format!("a bad path: {e}"))
    };
    match fields.as_slice() {
        ["+", session, tenant, container, p] => Ok(Record::Made(Temp {
            session: u64::from_str_radix(session, 16).map_err(|_| format!("{session:?} is not a session id"))?,
            tenant: unescape(tenant)?,
            container: unescape(container)?,
            path: path(p)?,
        })),
        ["-", container, p] => Ok(Record::Gone { container: unescape(container)?, path: path(p)? }),
        _ => Err(format!("{:?} is not a record this dpu-agent writes", short(line))),
    }
}

fn render(record: &Record) -> String {
    match record {
        Record::Made(t) => {
            format!("+ {:016x} {} {} {}\n", t.session, escape(&t.tenant), escape(&t.container), escape(t.path.as_str()))
        }
        Record::Gone { container, path } => format!("- {} {}\n", escape(container), escape(path.as_str())),
    }
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '%' || c.is_whitespace() || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn unescape(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or_else(|| format!("{:?} ends inside an escape", short(s)))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("%{hex} in {:?} is not an escape", short(s)))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{:?} is not UTF-8 once unescaped", short(s)))
}

/// The journal of a running agent, open for appending.
pub struct Journal {
    path: PathBuf,
    file: Mutex<Open>,
    /// Appended to since the last flush.
    dirty: AtomicBool,
}

struct Open {
    file: Arc<File>,
    /// Lines in the file after its records at the last rewrite.
    appended: usize,
    /// Records at the last rewrite.
    kept: usize,
}

impl Journal {
    /// Rewrite the journal at `path` to hold `records` (atomically) and open it.
    pub fn create(path: &Path, records: &[Record]) -> std::io::Result<Journal> {
        let file = rewrite(path, records)?;
        let open = Open { file, appended: 0, kept: records.len() };
        Ok(Journal { path: path.to_owned(), file: Mutex::new(open), dirty: AtomicBool::new(false) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append `record`; when the file has grown many times longer than what it
    /// records, rewrite it from `all` (the register's records now, the appended one
    /// included) instead.
    pub fn append(&self, record: &Record, all: impl FnOnce() -> Vec<Record>) -> std::io::Result<()> {
        let mut open = lock(&self.file);
        if open.appended >= COMPACT_AFTER_LINES.max(4 * open.kept) {
            let records = all();
            open.file = rewrite(&self.path, &records)?;
            open.appended = 0;
            open.kept = records.len();
            return Ok(());
        }
        (&*open.file).write_all(render(record).as_bytes())?;
        open.appended += 1;
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    /// Make what was appended durable, if anything was since the last flush; returns
    /// whether it flushed.
    pub fn flush(&self) -> std::io::Result<bool> {
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(false);
        }
        // Outside the lock: appends go on while the disk works.
        let file = lock(&self.file).file.clone();
        file.sync_data().inspect_err(|_| self.dirty.store(true, Ordering::Release))?;
        Ok(true)
    }
}

fn rewrite(path: &Path, records: &[Record]) -> std::io::Result<Arc<File>> {
    let mut text = format!("{HEADER}\n");
    for r in records {
        text.push_str(&render(r));
    }
    crate::persist::store::write_atomically(path, &text)?;
    Ok(Arc::new(std::fs::OpenOptions::new().append(true).open(path)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(session: u64, path: &str) -> Temp {
        Temp { session, tenant: "t".into(), container: "c one".into(), path: NsPath::parse(path).unwrap() }
    }

    #[test]
    fn records_read_back_with_odd_names_and_a_torn_line_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_file(dir.path());
        assert_eq!(load(&path).unwrap(), (Vec::new(), false));
        let odd = "/d i r/.a%b\nc.dpuio-put.1";
        let j = Journal::create(&path, &[Record::Made(temp(1, "/.x.dpuio-put.1"))]).unwrap();
        j.append(&Record::Made(temp(u64::MAX, odd)), Vec::new).unwrap();
        j.append(
            &Record::Gone { container: "c one".into(), path: NsPath::parse("/.x.dpuio-put.1").unwrap() },
            Vec::new,
        )
        .unwrap();
        assert!(j.flush().unwrap(), "appended to: flushed");
        assert!(!j.flush().unwrap(), "nothing new: nothing to flush");
        let (records, torn) = load(&path).unwrap();
        assert!(!torn);
        assert_eq!(records.len(), 3);
        assert_eq!(records[1], Record::Made(temp(u64::MAX, odd)));
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("+ 0000000000000001 t c /.half");
        std::fs::write(&path, text).unwrap();
        assert_eq!(load(&path).unwrap(), (records, true));
    }

    #[test]
    fn a_journal_grown_long_is_rewritten_from_the_register() {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_file(dir.path());
        let j = Journal::create(&path, &[]).unwrap();
        let r = Record::Made(temp(1, "/.x.dpuio-put.1"));
        for _ in 0..COMPACT_AFTER_LINES {
            j.append(&r, Vec::new).unwrap();
        }
        assert_eq!(load(&path).unwrap().0.len(), COMPACT_AFTER_LINES);
        j.append(&r, || vec![r.clone()]).unwrap();
        assert_eq!(load(&path).unwrap().0, vec![r.clone()], "rewritten to what the register holds");
        j.append(&r, Vec::new).unwrap();
        assert_eq!(load(&path).unwrap().0.len(), 2, "and appended to again");
    }

    #[test]
    fn what_this_agent_did_not_write_names_the_file_and_the_way_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = journal_file(dir.path());
        std::fs::write(&path, "something else\n").unwrap();
        let m = load(&path).unwrap_err().to_string();
        assert!(
            m.contains(&path.display().to_string()) && m.contains("first line") && m.contains("move it away"),
            "{m}"
        );
        std::fs::write(&path, format!("{HEADER}\n+ zz t c /.a.dpuio-put.1\n")).unwrap();
        let m = load(&path).unwrap_err().to_string();
        assert!(m.contains("line 2") && m.contains("not a session id"), "{m}");
        std::fs::write(&path, format!("{HEADER}\n- c /a/../b\n")).unwrap();
        assert!(load(&path).unwrap_err().to_string().contains("a bad path"));
    }
}
