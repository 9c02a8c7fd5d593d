//! Metadata entries on the data plane: what the engine asks of the namespace for one
//! entry, and how the answer is laid out in host memory, without I/O.
//!
//! The engine copies an entry's request bytes out of host memory once (host memory is
//! untrusted and may change under it), decodes them into a [`Request`] here, and hands
//! that to the agent's [`Namespace`], which runs the very policy functions the gRPC
//! `Namespace` service runs (`crate::namespace`): rights, prefix, tenant, limits. The
//! [`Reply`] (or the error, with its gRPC code and message) is encoded here into the
//! bytes the engine writes into the entry's answer range. What this module does not do:
//! touch host memory or the backend (the engine does, and reads an open-read's file
//! straight into the answer range).

use std::sync::Arc;
use std::time::Instant;

use dpuio_backend::{Attr, DirEntry, EntryKind, Object};
use dpuio_proto::wire::{self, AttrRecord, MetaHeader, MetaOpcode, MetaSubmission};

use crate::error::{Error, Result};
use crate::metrics::{Op, TenantMetrics};

/// A metadata entry's operation, with its strings decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Stat {
        path: String,
    },
    StatHandle {
        handle: u64,
    },
    Open {
        path: String,
        write: bool,
        truncate: bool,
    },
    Create {
        path: String,
        exclusive: bool,
        mode: u32,
    },
    Close {
        handle: u64,
    },
    OpenRead {
        path: String,
    },
    Lookup {
        paths: Vec<String>,
    },
    /// `anchor` empty: from the start; `max` 0: the agent's default batch.
    Readdir {
        path: String,
        anchor: String,
        max: u32,
    },
    Remove {
        path: String,
        recursive: bool,
    },
}

/// What the namespace answered.
pub enum Reply {
    Attr(Attr),
    Opened {
        handle: u64,
        attr: Attr,
        chunk_bytes: u64,
    },
    /// Done, with nothing to say but that (a close, a remove).
    Done,
    /// An open-read: the object to read from offset 0 (closed when dropped).
    Object {
        object: Arc<dyn Object>,
        attr: Attr,
    },
    Lookup(Vec<Result<Attr>>),
    /// One batch of a listing, and the anchor to continue after (`None`: done).
    Dir {
        entries: Vec<DirEntry>,
        anchor: Option<String>,
    },
}

/// What the engine needs of the agent for metadata entries: the namespace policy of
/// the session that owns the ring.
pub trait Namespace: Send + Sync {
    /// Run `request` for session `session_id` with the same checks as over gRPC.
    fn metadata(&self, session_id: u64, request: Request) -> Result<Reply>;
}

/// The request of `m`, from the bytes the engine copied out of its request range.
pub fn request(m: &MetaSubmission, bytes: &[u8]) -> Result<Request> {
    let mut strings = wire::decode_strings(bytes, m.opcode.strings(m.arg))
        .map_err(|e| Error::invalid("path", format!("metadata request: {e}")))?
        .into_iter();
    let mut next = || strings.next().unwrap_or_default();
    Ok(match m.opcode {
        MetaOpcode::Stat => Request::Stat { path: next() },
        MetaOpcode::StatHandle => Request::StatHandle { handle: m.handle },
        MetaOpcode::Open => Request::Open {
            path: next(),
            write: m.flags & wire::META_WRITE != 0,
            truncate: m.flags & wire::META_TRUNCATE != 0,
        },
        MetaOpcode::Create => {
            Request::Create { path: next(), exclusive: m.flags & wire::META_EXCLUSIVE != 0, mode: m.arg }
        }
        MetaOpcode::Close => Request::Close { handle: m.handle },
        MetaOpcode::OpenRead => Request::OpenRead { path: next() },
        MetaOpcode::Lookup => Request::Lookup { paths: std::iter::from_fn(|| strings.next()).collect() },
        MetaOpcode::Readdir => Request::Readdir { path: next(), anchor: next(), max: m.arg },
        MetaOpcode::Remove => Request::Remove { path: next(), recursive: m.flags & wire::META_RECURSIVE != 0 },
    })
}

pub fn attr_record(a: &Attr) -> AttrRecord {
    AttrRecord {
        kind: match a.kind {
            EntryKind::File => wire::KIND_FILE,
            EntryKind::Directory => wire::KIND_DIRECTORY,
        },
        mode: a.mode,
        size: a.size,
        mtime_ns: a.mtime_ns,
        object_id: a.object_id,
    }
}

/// The error record of a refused entry, at most `room` bytes: the code and message
/// gRPC would answer.
pub fn error_answer(e: &Error, room: usize) -> Vec<u8> {
    wire::MetaError { code: code_word(e), message: e.to_string() }.encode(room)
}

/// The code and finer reason gRPC would answer for `e`, as the data plane carries them.
fn code_word(e: &Error) -> wire::CodeWord {
    wire::CodeWord { code: e.code() as i32 as u16, reason: crate::error::reason(e) }
}

/// The answer header of an open-read that read `count` bytes of a file with `attr`.
pub fn open_read_header(attr: &Attr, count: u64) -> [u8; wire::META_ANSWER_HEADER_BYTES as usize] {
    MetaHeader { attr: attr_record(attr), count, ..MetaHeader::default() }.encode()
}

/// The answer bytes of `reply` (not [`Reply::Object`]: the engine writes those), at
/// most `room` bytes; `Err` if it does not fit (a listing is then asked again for
/// fewer entries).
pub fn answer(reply: &Reply, room: usize) -> std::result::Result<Vec<u8>, usize> {
    let mut out = Vec::new();
    match reply {
        Reply::Attr(a) => out.extend(MetaHeader { attr: attr_record(a), ..MetaHeader::default() }.encode()),
        Reply::Opened { handle, attr, chunk_bytes } => out.extend(
            MetaHeader { handle: *handle, chunk_bytes: *chunk_bytes, attr: attr_record(attr), ..MetaHeader::default() }
                .encode(),
        ),
        Reply::Done => out.extend(MetaHeader::default().encode()),
        Reply::Object { attr, .. } => out.extend(open_read_header(attr, 0)),
        Reply::Lookup(results) => {
            out.extend(MetaHeader { count: results.len() as u64, ..MetaHeader::default() }.encode());
            for r in results {
                let (code, message, attr) = match r {
                    Ok(a) => (0u32, String::new(), attr_record(a)),
                    Err(e) => (code_word(e).to_u32(), e.to_string(), AttrRecord::default()),
                };
                out.extend(code.to_le_bytes());
                out.extend((message.len() as u32).to_le_bytes());
                out.extend(attr.encode());
                out.extend(message.as_bytes());
                out.resize(wire::pad8(out.len()), 0);
            }
        }
        Reply::Dir { entries, anchor } => {
            let header = MetaHeader { count: entries.len() as u64, more: anchor.is_some(), ..MetaHeader::default() };
            out.extend(header.encode());
            for e in entries {
                let len = u16::try_from(e.name.len()).map_err(|_| room)?;
                out.extend(len.to_le_bytes());
                out.extend([0u8; 6]);
                out.extend(attr_record(&e.attr).encode());
                out.extend(e.name.as_bytes());
                out.resize(wire::pad8(out.len()), 0);
            }
            let anchor = anchor.as_deref().unwrap_or_default();
            out.extend(wire::encode_strings(&[anchor]).ok_or(room)?);
        }
    }
    if out.len() > room { Err(out.len()) } else { Ok(out) }
}

/// What to ask again when `reply` to `asked` needed `need` bytes and the answer range
/// holds `room`: a batch of a listing asks for as many entries as fit on average (fewer
/// each time, so asking again ends); any other answer cannot shrink (`None`).
pub fn fewer(reply: &Reply, asked: &Request, room: usize, need: usize) -> Option<Request> {
    match (reply, asked) {
        (Reply::Dir { entries, .. }, Request::Readdir { path, anchor, .. }) if entries.len() > 1 => {
            let max = ((entries.len() * room / need) as u32).clamp(1, entries.len() as u32 - 1);
            Some(Request::Readdir { path: path.clone(), anchor: anchor.clone(), max })
        }
        _ => None,
    }
}

/// The answer bytes of `reply` to `asked` (not [`Reply::Object`]) in at most `room`
/// bytes: where it does not fit, asked again for fewer through `call` ([`fewer`]), and
/// refused where it cannot shrink.
pub fn fitting(
    mut reply: Reply,
    mut asked: Request,
    room: usize,
    mut call: impl FnMut(Request) -> Result<Reply>,
) -> Result<Vec<u8>> {
    loop {
        let need = match answer(&reply, room) {
            Ok(bytes) => return Ok(bytes),
            Err(need) => need,
        };
        let Some(again) = fewer(&reply, &asked, room, need) else {
            return Err(Error::invalid(
                "answer_length",
                format!("the answer needs {need} bytes; the entry gives {room}"),
            ));
        };
        asked = again;
        reply = call(asked.clone())?;
    }
}

/// How a metadata entry went, counted as the same call over gRPC is: by operation,
/// refusals by their code; an open-read also as a read of the file bytes it wrote after
/// its header (`answered`: the bytes written into the answer range).
pub fn count(metrics: &TenantMetrics, opcode: MetaOpcode, answered: &Result<u64>, started: Instant) {
    let op = Op::of_meta(opcode);
    match (answered, op) {
        (Ok(written), Op::Read) => metrics.request(
            op,
            wire::Status::Ok,
            written.saturating_sub(u64::from(wire::META_ANSWER_HEADER_BYTES)),
            started.elapsed(),
        ),
        (Ok(_), _) => metrics.call(op, Ok(())),
        (Err(refused), _) => metrics.call(op, Err(refused.code())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(opcode: MetaOpcode, arg: u32) -> MetaSubmission {
        MetaSubmission {
            opcode,
            flags: 0,
            user_data: 1,
            handle: 0,
            request_region: 1,
            answer_region: 1,
            request_offset: 0,
            answer_offset: 4096,
            request_length: 1,
            answer_length: 4096,
            arg,
        }
    }

    #[test]
    fn hostile_requests_are_invalid_arguments_not_panics() {
        let m = entry(MetaOpcode::Stat, 0);
        for bytes in [&b""[..], &[5, 0, b'/'], &[1, 0, 0xff], &[1, 0, b'/', 0]] {
            let e = request(&m, bytes).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e}");
            assert!(e.to_string().starts_with("path: metadata request"), "{e}");
        }
        assert_eq!(request(&m, &wire::encode_strings(&["/a"]).unwrap()).unwrap(), Request::Stat { path: "/a".into() });
        let l = entry(MetaOpcode::Lookup, 2);
        let two = wire::encode_strings(&["/a", "/b"]).unwrap();
        assert_eq!(request(&l, &two).unwrap(), Request::Lookup { paths: vec!["/a".into(), "/b".into()] });
        let d = entry(MetaOpcode::Readdir, 5);
        let r = request(&d, &wire::encode_strings(&["/d", ""]).unwrap()).unwrap();
        assert_eq!(r, Request::Readdir { path: "/d".into(), anchor: String::new(), max: 5 });
        let rm = MetaSubmission { flags: wire::META_RECURSIVE, ..entry(MetaOpcode::Remove, 0) };
        let r = request(&rm, &wire::encode_strings(&["/t"]).unwrap()).unwrap();
        assert_eq!(r, Request::Remove { path: "/t".into(), recursive: true });
    }

    #[test]
    fn answers_fit_or_say_how_much_they_need() {
        let attr = Attr { kind: EntryKind::File, size: 3, mode: 0o644, mtime_ns: 1, object_id: 2 };
        let a = answer(&Reply::Attr(attr.clone()), 64).unwrap();
        let h = MetaHeader::decode(&a).unwrap();
        assert_eq!((h.attr.size, h.attr.kind), (3, wire::KIND_FILE));
        let entries: Vec<DirEntry> =
            (0..10).map(|i| DirEntry { name: format!("file-{i}"), attr: attr.clone() }).collect();
        let dir = Reply::Dir { entries, anchor: Some("file-9".into()) };
        let need = answer(&dir, 100).unwrap_err();
        assert!(need > 100);
        assert_eq!(answer(&dir, need).unwrap().len(), need);
        let asked = Request::Readdir { path: "/d".into(), anchor: String::new(), max: 0 };
        let again = fewer(&dir, &asked, 100, need).expect("a listing asks again");
        let Request::Readdir { max, .. } = again else { panic!("{again:?}") };
        assert_eq!(max as usize, (10 * 100 / need).max(1), "as many as fit on average");
        let one = Reply::Dir { entries: vec![DirEntry { name: "f".into(), attr: attr.clone() }], anchor: None };
        assert_eq!(fewer(&one, &asked, 10, 100), None, "one entry that does not fit cannot shrink");
        assert_eq!(fewer(&Reply::Attr(attr.clone()), &asked, 10, 100), None);
        let two = Reply::Dir {
            entries: (0..2).map(|i| DirEntry { name: format!("{i}"), attr: attr.clone() }).collect(),
            anchor: None,
        };
        assert_eq!(
            fewer(&two, &asked, 1, 1000),
            Some(Request::Readdir { path: "/d".into(), anchor: String::new(), max: 1 })
        );
        let e = Error::NoHandle { handle: 5 };
        let rec = wire::MetaError::decode(&error_answer(&e, 64)).unwrap();
        assert_eq!(rec.code, wire::CodeWord { code: tonic::Code::NotFound as u16, reason: None });
        assert!(e.to_string().starts_with(&rec.message));
    }
}
