//! What the agent and a tenant's worker say to each other: requests, replies, the
//! backend's errors, and the framing of a channel.
//!
//! Each channel is a Unix stream socket carrying length-prefixed JSON (a 4-byte
//! little-endian length, then the message): one request, then its reply, then the next.
//! JSON because the messages are small (the payload moves through the shared staging
//! memory, never through the socket) and a worker log can quote one readably. The
//! worker trusts the agent (its parent) but still bounds every length and offset, so a
//! bug on one side is an error on the other, not memory corruption.

use std::io::{self, Read, Write};

use dpuio_backend::{Attr, DirEntry, EntryKind, Error, Layout, OpenOptions};
use serde::{Deserialize, Serialize};

/// The largest message either side accepts: a directory listing batch of a few
/// thousand names fits many times over.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// The DAOS backend's settings, as the agent gives them to a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Setup {
    pub tenant: String,
    pub pool: String,
    pub system: String,
    pub agent_socket_dir: String,
    pub create_containers: bool,
    pub chunk_bytes: u64,
    pub object_class: String,
    pub retry_ms: u64,
    pub call_timeout_ms: u64,
    pub dir_cache_ms: u64,
    pub redundancy_factor: u32,
    pub redundancy_level: u32,
}

/// A request on a channel. Containers and objects are named by the ids the worker gave
/// them in this process's life.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    Mount {
        container: String,
        create: bool,
        object_class: String,
    },
    Acl {
        container: u64,
    },
    Stat {
        container: u64,
        path: String,
    },
    Mkdir {
        container: u64,
        path: String,
        mode: u32,
    },
    Readdir {
        container: u64,
        path: String,
        anchor: Option<String>,
        max: usize,
    },
    Open {
        container: u64,
        path: String,
        options: Open,
        mode: u32,
    },
    Remove {
        container: u64,
        path: String,
        recursive: bool,
    },
    Rename {
        container: u64,
        from: String,
        to: String,
    },
    Replace {
        container: u64,
        from: String,
        to: String,
    },
    Truncate {
        container: u64,
        path: String,
        size: u64,
    },
    Sync {
        container: u64,
    },
    /// Pieces of I/O on open objects, each into or out of the staging memory, run
    /// together on the worker's DAOS event queue.
    Io {
        pieces: Vec<Piece>,
    },
    ObjectStat {
        object: u64,
    },
    ObjectTruncate {
        object: u64,
        size: u64,
    },
    ObjectSync {
        object: u64,
    },
    Close {
        object: u64,
    },
}

/// [`OpenOptions`] on the wire.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Open {
    pub write: bool,
    pub create: bool,
    pub exclusive: bool,
    pub truncate: bool,
    pub chunk_bytes: u64,
    pub object_class: u32,
}

impl From<OpenOptions> for Open {
    fn from(o: OpenOptions) -> Open {
        Open {
            write: o.write,
            create: o.create,
            exclusive: o.exclusive,
            truncate: o.truncate,
            chunk_bytes: o.layout.chunk_bytes,
            object_class: o.layout.object_class,
        }
    }
}

impl From<Open> for OpenOptions {
    fn from(o: Open) -> OpenOptions {
        OpenOptions {
            write: o.write,
            create: o.create,
            exclusive: o.exclusive,
            truncate: o.truncate,
            layout: Layout { chunk_bytes: o.chunk_bytes, object_class: o.object_class },
        }
    }
}

/// One read or write of [`Request::Io`]: `len` bytes at `offset` of the file, to or
/// from the staging memory at `staging`, or, with `host`, at `staging` of that host
/// region ([`crate::host`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Piece {
    pub object: u64,
    pub offset: u64,
    pub staging: u64,
    pub len: u64,
    pub write: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<u64>,
}

/// A reply, in the shape of the request it answers.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Done,
    Mounted {
        container: u64,
        chunk_bytes: u64,
    },
    Acl {
        owner: String,
        entries: Vec<String>,
    },
    Attr(WireAttr),
    Listing {
        entries: Vec<(String, WireAttr)>,
        next: Option<String>,
    },
    /// A file opened: its id in the worker, whether it was opened for writing, and its
    /// attributes as opened (what a client's open answers with).
    Opened {
        object: u64,
        writable: bool,
        attr: WireAttr,
    },
    /// One piece of a [`Request::Io`] done: its index in the request, and the bytes it
    /// moved or its error. Sent as each completes; [`Reply::Done`] follows the last.
    Piece {
        index: u32,
        result: Result<u64, WireError>,
    },
    Failed(WireError),
}

/// [`Attr`] on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireAttr {
    pub directory: bool,
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
    pub object_id: u64,
}

impl From<&Attr> for WireAttr {
    fn from(a: &Attr) -> WireAttr {
        WireAttr {
            directory: a.kind == EntryKind::Directory,
            size: a.size,
            mode: a.mode,
            mtime_ns: a.mtime_ns,
            object_id: a.object_id,
        }
    }
}

impl From<WireAttr> for Attr {
    fn from(a: WireAttr) -> Attr {
        Attr {
            kind: if a.directory { EntryKind::Directory } else { EntryKind::File },
            size: a.size,
            mode: a.mode,
            mtime_ns: a.mtime_ns,
            object_id: a.object_id,
        }
    }
}

/// Listing entries on the wire.
pub fn entries_to_wire(entries: &[DirEntry]) -> Vec<(String, WireAttr)> {
    entries.iter().map(|e| (e.name.clone(), WireAttr::from(&e.attr))).collect()
}

/// The inverse of [`entries_to_wire`].
pub fn entries_from_wire(entries: Vec<(String, WireAttr)>) -> Vec<DirEntry> {
    entries.into_iter().map(|(name, attr)| DirEntry { name, attr: attr.into() }).collect()
}

/// A backend [`Error`] on the wire: each variant with its fields, so the agent maps it
/// to the same status as an error of its own backend would.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WireError {
    InvalidPath { path: String, reason: String },
    InvalidArgument(String),
    NotFound { path: String },
    AlreadyExists { path: String },
    NotADirectory { path: String },
    IsADirectory { path: String },
    DirectoryNotEmpty { path: String },
    InvalidRename { from: String, to: String, reason: String },
    NoSuchContainer { name: String, hint: String },
    AccessMode { path: String, reason: String },
    UnsupportedEntry { path: String, reason: String },
    Denied { what: String, reason: String },
    Unavailable { what: String, reason: String },
    Io { context: String, errno: i32, message: String },
    Integrity { path: String, block_index: Option<u64>, detail: String },
    Key { path: String, reason: String },
}

impl From<&Error> for WireError {
    fn from(e: &Error) -> WireError {
        let s = |v: &String| v.clone();
        match e {
            Error::InvalidPath { path, reason } => WireError::InvalidPath { path: s(path), reason: s(reason) },
            Error::InvalidArgument(m) => WireError::InvalidArgument(s(m)),
            Error::NotFound { path } => WireError::NotFound { path: s(path) },
            Error::AlreadyExists { path } => WireError::AlreadyExists { path: s(path) },
            Error::NotADirectory { path } => WireError::NotADirectory { path: s(path) },
            Error::IsADirectory { path } => WireError::IsADirectory { path: s(path) },
            Error::DirectoryNotEmpty { path } => WireError::DirectoryNotEmpty { path: s(path) },
            Error::InvalidRename { from, to, reason } => {
                WireError::InvalidRename { from: s(from), to: s(to), reason: s(reason) }
            }
            Error::NoSuchContainer { name, hint } => WireError::NoSuchContainer { name: s(name), hint: s(hint) },
            Error::AccessMode { path, reason } => WireError::AccessMode { path: s(path), reason: s(reason) },
            Error::UnsupportedEntry { path, reason } => {
                WireError::UnsupportedEntry { path: s(path), reason: s(reason) }
            }
            Error::Denied { what, reason } => WireError::Denied { what: s(what), reason: s(reason) },
            Error::Unavailable { what, reason } => WireError::Unavailable { what: s(what), reason: s(reason) },
            Error::Io { context, source } => WireError::Io {
                context: s(context),
                errno: source.raw_os_error().unwrap_or(libc::EIO),
                message: source.to_string(),
            },
            Error::Integrity { path, block_index, detail } => {
                WireError::Integrity { path: s(path), block_index: *block_index, detail: s(detail) }
            }
            Error::Key { path, reason } => WireError::Key { path: s(path), reason: s(reason) },
            // A variant newer than this crate: its text, as an I/O error.
            other => WireError::Io { context: other.to_string(), errno: libc::EIO, message: String::new() },
        }
    }
}

impl From<WireError> for Error {
    fn from(e: WireError) -> Error {
        match e {
            WireError::InvalidPath { path, reason } => Error::InvalidPath { path, reason },
            WireError::InvalidArgument(m) => Error::InvalidArgument(m),
            WireError::NotFound { path } => Error::NotFound { path },
            WireError::AlreadyExists { path } => Error::AlreadyExists { path },
            WireError::NotADirectory { path } => Error::NotADirectory { path },
            WireError::IsADirectory { path } => Error::IsADirectory { path },
            WireError::DirectoryNotEmpty { path } => Error::DirectoryNotEmpty { path },
            WireError::InvalidRename { from, to, reason } => Error::InvalidRename { from, to, reason },
            WireError::NoSuchContainer { name, hint } => Error::NoSuchContainer { name, hint },
            WireError::AccessMode { path, reason } => Error::AccessMode { path, reason },
            WireError::UnsupportedEntry { path, reason } => Error::UnsupportedEntry { path, reason },
            WireError::Denied { what, reason } => Error::Denied { what, reason },
            WireError::Unavailable { what, reason } => Error::Unavailable { what, reason },
            // The errno's own text is what io::Error prints; the worker's message is
            // the same text from the same errno.
            WireError::Io { context, errno, message: _ } => {
                Error::Io { context, source: io::Error::from_raw_os_error(errno) }
            }
            WireError::Integrity { path, block_index, detail } => Error::Integrity { path, block_index, detail },
            WireError::Key { path, reason } => Error::Key { path, reason },
        }
    }
}

/// Read the answer to a [`Request::Io`] of `pieces` pieces: `on_piece(index, result)`
/// for each as the worker reports it, until its closing [`Reply::Done`]. A
/// [`Reply::Failed`] (the request refused as a whole) is each unreported piece's error.
/// An I/O error means the worker is gone; the pieces reported so far stand.
pub fn recv_pieces(
    stream: &mut impl Read,
    pieces: usize,
    on_piece: &mut dyn FnMut(usize, Result<u64, WireError>),
) -> io::Result<()> {
    let mut reports = Reports::new(pieces);
    while !reports.take(recv::<Reply>(stream)?, on_piece)? {}
    Ok(())
}

/// Which pieces of a [`Request::Io`] the worker reported so far: the answer taken one
/// reply at a time, by a caller that waits for each ([`recv_pieces`]) or one that reads
/// what has arrived ([`crate::direct`]).
pub(crate) struct Reports {
    reported: Vec<bool>,
}

impl Reports {
    pub(crate) fn new(pieces: usize) -> Reports {
        Reports { reported: vec![false; pieces] }
    }

    /// Take one reply: `on_piece(index, result)` for what it reports. Whether the answer
    /// is complete; an error where the reply does not belong to such an answer.
    pub(crate) fn take(
        &mut self,
        reply: Reply,
        on_piece: &mut dyn FnMut(usize, Result<u64, WireError>),
    ) -> io::Result<bool> {
        let pieces = self.reported.len();
        match reply {
            Reply::Piece { index, result } => {
                let index = index as usize;
                match self.reported.get_mut(index) {
                    Some(seen) if !*seen => *seen = true,
                    _ => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("worker reported piece {index} of {pieces} twice or out of range"),
                        ));
                    }
                }
                on_piece(index, result);
                Ok(false)
            }
            Reply::Done if self.reported.iter().all(|r| *r) => Ok(true),
            Reply::Failed(e) => {
                for (index, seen) in self.reported.iter_mut().enumerate().filter(|(_, r)| !**r) {
                    *seen = true;
                    on_piece(index, Err(e.clone()));
                }
                Ok(true)
            }
            other => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("worker answered an I/O request with {other:?}"),
            )),
        }
    }

    /// The pieces not reported yet.
    pub(crate) fn missing(&self) -> impl Iterator<Item = usize> + '_ {
        self.reported.iter().enumerate().filter(|(_, r)| !**r).map(|(i, _)| i)
    }
}

/// Write one message.
pub fn send<T: Serialize>(stream: &mut impl Write, message: &T) -> io::Result<()> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    if body.len() > MAX_MESSAGE_BYTES {
        return Err(io::Error::other(format!(
            "worker message of {} bytes is over the limit of {MAX_MESSAGE_BYTES}",
            body.len()
        )));
    }
    let mut framed = Vec::with_capacity(4 + body.len());
    framed.extend_from_slice(&(body.len() as u32).to_le_bytes());
    framed.extend_from_slice(&body);
    stream.write_all(&framed)
}

/// Read one message; `UnexpectedEof` when the other side is gone.
pub fn recv<T: for<'de> Deserialize<'de>>(stream: &mut impl Read) -> io::Result<T> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("worker message of {len} bytes announced, over the limit of {MAX_MESSAGE_BYTES}"),
        ));
    }
    let mut body = vec![0; len];
    stream.read_exact(&mut body)?;
    serde_json::from_slice(&body)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("malformed worker message: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_their_variant_across_the_wire() {
        let e = Error::Denied { what: "DAOS container \"a\"".into(), reason: "DER_NO_PERM(-1001)".into() };
        let back: Error = WireError::from(&e).into();
        assert!(matches!(&back, Error::Denied { reason, .. } if reason.contains("DER_NO_PERM")), "{back}");
        let e = Error::Io { context: "dfs_read".into(), source: io::Error::from_raw_os_error(libc::EIO) };
        let back: Error = WireError::from(&e).into();
        assert!(matches!(&back, Error::Io { source, .. } if source.raw_os_error() == Some(libc::EIO)), "{back}");
    }

    #[test]
    fn pieces_are_reported_once_each_and_a_refusal_covers_the_rest() {
        let ok = |index| Reply::Piece { index, result: Ok(u64::from(index) + 1) };
        let mut stream = Vec::new();
        for reply in [ok(1), ok(0), Reply::Done] {
            send(&mut stream, &reply).unwrap();
        }
        let mut seen = Vec::new();
        recv_pieces(&mut stream.as_slice(), 2, &mut |i, r| seen.push((i, r.unwrap()))).unwrap();
        assert_eq!(seen, [(1, 2), (0, 1)]);

        let mut stream = Vec::new();
        for reply in [ok(0), Reply::Failed(WireError::InvalidArgument("no".into()))] {
            send(&mut stream, &reply).unwrap();
        }
        let mut failed = Vec::new();
        recv_pieces(&mut stream.as_slice(), 3, &mut |i, r| {
            if r.is_err() {
                failed.push(i)
            }
        })
        .unwrap();
        assert_eq!(failed, [1, 2]);

        for replies in [vec![ok(0), ok(0)], vec![ok(5)], vec![ok(0), Reply::Done, Reply::Done]] {
            let mut stream = Vec::new();
            for reply in &replies {
                send(&mut stream, reply).unwrap();
            }
            let err = recv_pieces(&mut stream.as_slice(), 2, &mut |_, _| {}).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{replies:?}: {err}");
        }
    }

    #[test]
    fn framing_round_trips_and_bounds_the_length() {
        let mut buf = Vec::new();
        send(&mut buf, &Request::Sync { container: 7 }).unwrap();
        let back: Request = recv(&mut buf.as_slice()).unwrap();
        assert!(matches!(back, Request::Sync { container: 7 }));
        let mut huge = ((MAX_MESSAGE_BYTES + 1) as u32).to_le_bytes().to_vec();
        huge.extend_from_slice(b"{}");
        let err = recv::<Request>(&mut huge.as_slice()).unwrap_err();
        assert!(err.to_string().contains("over the limit"), "{err}");
        let err = recv::<Request>(&mut [].as_slice()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
