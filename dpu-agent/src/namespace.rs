//! Namespace policy: what a session may do in its container's tree, checked in a fixed
//! order before the backend does it, so the status a client gets is predictable.
//!
//! Each operation of `dpuio.v1.Namespace` is one function here: it takes the session,
//! the request's values (paths as the client sent them, parsed here and reported
//! against the field they came in) and plain limits, checks that the container is
//! mounted, the paths are well formed and the session's rights allow the operation,
//! then calls the backend. Most of them block on the backend: the gRPC handlers
//! (`service`) run them on the blocking pool, and only translate protobuf to these
//! calls and their answers back. Nothing here knows protobuf or tonic.

use std::sync::Arc;

use dpuio_auth::token::Op;
use dpuio_backend::{Attr, Container, EntryKind, Layout, NsPath, Object, OpenOptions};

use crate::dataplane::meta;
use crate::error::{Error, Result};
use crate::state::{Agent, Session};

/// Entries per Readdir batch when the client does not say.
const DEFAULT_READDIR_BATCH: u32 = 1024;

/// The path in the request field `field`.
pub fn path(field: &'static str, raw: &str) -> Result<NsPath> {
    if raw.is_empty() {
        return Err(Error::invalid(field, "empty path; paths start at the container root, e.g. \"/data\""));
    }
    Ok(NsPath::parse(raw)?)
}

/// Mount the session's container (`requested` empty: its tenant's own) and stat its root.
pub fn mount(agent: &Agent, session: &Session, requested: &str) -> Result<(Arc<dyn Container>, Attr)> {
    let c = agent.mount(session, requested)?;
    let root = c.stat(&NsPath::root())?;
    Ok((c, root))
}

/// The attributes of each of `paths` (each needs Read), or why not, in order; at most
/// `limit` paths in one call.
pub fn lookup(session: &Session, paths: Vec<String>, limit: u32) -> Result<Vec<(String, Result<Attr>)>> {
    let container = session.container()?;
    if paths.len() > limit as usize {
        return Err(Error::Limit { what: "paths in one Lookup", limit: limit.into() });
    }
    Ok(paths
        .into_iter()
        .map(|raw| {
            let outcome = path("paths", &raw).and_then(|p| {
                session.rights.check(Op::Read, &p)?;
                Ok(container.stat(&p)?)
            });
            (raw, outcome)
        })
        .collect())
}

/// The attributes of the file or directory at `raw` (needs Read).
pub fn stat(session: &Session, raw: &str) -> Result<Attr> {
    let p = path("path", raw)?;
    session.rights.check(Op::Read, &p)?;
    let container = session.container()?;
    Ok(container.stat(&p)?)
}

/// The attributes of the file open as `handle`.
pub fn stat_handle(session: &Session, handle: u64) -> Result<Attr> {
    let handle = session.io.handle(handle)?;
    Ok(handle.object.stat()?)
}

/// Make the directory `raw` (needs Create); with `parents`, its missing ancestors too
/// (`mkdir -p`), where an existing directory is no error.
pub fn mkdir(session: &Session, raw: &str, mode: u32, parents: bool) -> Result<Attr> {
    let container = session.container()?;
    let p = path("path", raw)?;
    session.rights.check(Op::Create, &p)?;
    if !parents {
        return Ok(container.mkdir(&p, mode)?);
    }
    let mut at = NsPath::root();
    let mut attr = container.stat(&at)?;
    for name in p.components() {
        at = at.join(name)?;
        if session.rights.check(Op::Create, &at).is_err() {
            // An ancestor above the capability's prefix: it must exist already.
            attr = container.stat(&at)?;
            if attr.kind != EntryKind::Directory {
                return Err(dpuio_backend::Error::NotADirectory { path: at.to_string() }.into());
            }
            continue;
        }
        attr = match container.mkdir(&at, mode) {
            Ok(a) => a,
            Err(dpuio_backend::Error::AlreadyExists { .. }) => {
                let a = container.stat(&at)?;
                if a.kind != EntryKind::Directory {
                    return Err(dpuio_backend::Error::NotADirectory { path: at.to_string() }.into());
                }
                a
            }
            Err(e) => return Err(e.into()),
        };
    }
    Ok(attr)
}

/// The directory a Readdir lists (needs Read): the container to list it from, and its
/// path. Touches no backend, so the caller can answer its errors before streaming.
pub fn readdir_target(session: &Session, raw: &str) -> Result<(Arc<dyn Container>, NsPath)> {
    let container = session.container()?;
    let p = path("path", raw)?;
    session.rights.check(Op::Read, &p)?;
    Ok((container, p))
}

/// Entries in one Readdir batch: what the client asked (0: the default), at most `max`.
pub fn readdir_batch(asked: u32, max: u32) -> usize {
    let batch = match asked {
        0 => DEFAULT_READDIR_BATCH.min(max),
        n => n.min(max),
    };
    batch as usize
}

/// How Open opens a file: for writing too if `write`; `truncate` needs `write`.
pub fn open_options(write: bool, truncate: bool) -> Result<OpenOptions> {
    if truncate && !write {
        return Err(Error::invalid("truncate", "truncate on open needs ACCESS_READ_WRITE"));
    }
    Ok(OpenOptions { write, truncate, ..OpenOptions::default() })
}

/// How Create opens a file, and its mode bits (0: 0644): for writing, created,
/// truncated unless `exclusive` (then an existing file is an error).
pub fn create_options(exclusive: bool, mode: u32, layout: Layout) -> (OpenOptions, u32) {
    let mode = if mode == 0 { 0o644 } else { mode & 0o7777 };
    (OpenOptions { write: true, create: true, exclusive, truncate: !exclusive, layout }, mode)
}

/// Where an open of `raw` with `options` goes, once the session may do it: creating
/// needs Create, the access asked for Read or Write.
fn open_target(session: &Session, raw: &str, options: &OpenOptions) -> Result<(Arc<dyn Container>, NsPath)> {
    let container = session.container()?;
    let p = path("path", raw)?;
    if options.create {
        session.rights.check(Op::Create, &p)?;
    }
    session.rights.check(if options.write { Op::Write } else { Op::Read }, &p)?;
    Ok((container, p))
}

/// Open the file at `raw` for reading, with the checks of [`open`], as an object that
/// is no handle of the session: a whole-file read (the data plane's open-read) that
/// closes it when the object is dropped. Returns it with its attributes.
pub fn open_read(session: &Session, raw: &str) -> Result<(Arc<dyn Object>, Attr)> {
    let options = OpenOptions::default();
    let (container, p) = open_target(session, raw, &options)?;
    Ok(container.open_stat(&p, options, 0)?)
}

/// Open (or create, as `options` say) the file at `raw` as a handle of the session:
/// creating needs Create, and the access asked for needs Read or Write; a session has
/// at most `max_handles` open, and as many unfinished puts. `claim`: the handle id to
/// open it under (a resuming client's; 0 for a fresh one). Returns the handle, the
/// file's attributes and its chunk size.
///
/// A put's temporary file a session creates is noted before it is made, and a noted one
/// it opens for writing is taken over (a client resuming its put after an agent
/// restart): the agent removes it if the session ends before renaming it
/// ([`crate::leftovers`]).
pub fn open(
    agent: &Agent,
    session: &Session,
    raw: &str,
    options: OpenOptions,
    mode: u32,
    max_handles: u32,
    claim: u64,
) -> Result<(u64, Attr, u64)> {
    let (container, p) = open_target(session, raw, &options)?;
    if session.io.handle_count() >= max_handles as usize {
        return Err(Error::Limit { what: "open handles in this session", limit: max_handles.into() });
    }
    let chunk_bytes =
        if options.layout.chunk_bytes == 0 { container.chunk_bytes() } else { options.layout.chunk_bytes };
    let noted = options.create && agent.put_temp_creating(session, &p, max_handles)?;
    let (object, attr) = match container.open_stat(&p, options, mode) {
        Ok(o) => o,
        Err(e) => {
            if noted {
                agent.put_temp_gone(session, &p);
            }
            return Err(e.into());
        }
    };
    if options.write && !options.create {
        agent.put_temp_opened(session, &p);
    }
    let handle = session.add_handle(object, max_handles, claim)?;
    Ok((handle, attr, chunk_bytes))
}

/// Remove the file or directory at `raw` (needs Delete); a directory with entries only
/// when `recursive`.
pub fn remove(agent: &Agent, session: &Session, raw: &str, recursive: bool) -> Result<()> {
    let container = session.container()?;
    let p = path("path", raw)?;
    session.rights.check(Op::Delete, &p)?;
    container.remove(&p, recursive)?;
    agent.put_temp_gone(session, &p);
    Ok(())
}

/// Rename `from` to `to`: Delete on the old name, Create on the new one. With
/// `replace`, a file at `to` is replaced in one step (see [`replace_rights`]).
pub fn rename(agent: &Agent, session: &Session, from: &str, to: &str, replace: bool) -> Result<()> {
    let container = session.container()?;
    let (from, to) = (path("from", from)?, path("to", to)?);
    if !replace {
        session.rights.check(Op::Delete, &from)?;
        session.rights.check(Op::Create, &to)?;
        container.rename(&from, &to)?;
    } else {
        for (op, p) in replace_rights(&from, &to) {
            session.rights.check(op, p)?;
        }
        container.replace(&from, &to)?;
    }
    // A put published (or a temporary file moved away, or replaced by another file):
    // neither name holds a temporary file of the session's any more.
    agent.put_temp_gone(session, &from);
    agent.put_temp_gone(session, &to);
    Ok(())
}

/// What a replacing rename of `from` onto `to` needs, in the order checked.
///
/// Replacing `to` destroys its contents, which only a session that may create and
/// write `to` could do anyway (a create truncates): so Create and Write on `to`. The
/// source name goes away, which is a Delete of it; except when `from` is a whole-file
/// put's temporary file of `to` (`.NAME.dpuio-put.SUFFIX` beside NAME,
/// [`dpuio_proto::put`]): a put needs no more than Create and Write on NAME, and its
/// temporary file only ever ends as NAME, so Write on it suffices (it was created with
/// Create and Write). Nothing here is wider than a put that truncates and rewrites
/// NAME in place, which those rights already allow.
pub fn replace_rights<'p>(from: &'p NsPath, to: &'p NsPath) -> [(Op, &'p NsPath); 3] {
    let put_temp = from.parent() == to.parent()
        && matches!((from.file_name(), to.file_name()), (Some(f), Some(t)) if dpuio_proto::put::is_temp_of(f, t));
    [(Op::Create, to), (Op::Write, to), (if put_temp { Op::Write } else { Op::Delete }, from)]
}

/// Set the size of the file at `raw` (needs Write).
pub fn truncate(session: &Session, raw: &str, size: u64) -> Result<()> {
    let p = path("path", raw)?;
    session.rights.check(Op::Write, &p)?;
    let container = session.container()?;
    Ok(container.truncate(&p, size)?)
}

/// Set the size of the file open as `handle`, which must be open for writing.
pub fn truncate_handle(session: &Session, handle: u64, size: u64) -> Result<()> {
    let h = handle;
    let handle = session.io.handle(h)?;
    if !handle.writable {
        return Err(Error::PermissionDenied(format!(
            "handle {h:#018x} ({}) was opened read-only; open it with ACCESS_READ_WRITE to truncate",
            handle.object.path()
        )));
    }
    Ok(handle.object.truncate(size)?)
}

/// Make durable the file open as `handle`, or with `handle` 0 the whole container.
pub fn sync(session: &Session, handle: u64) -> Result<()> {
    if handle == 0 {
        let container = session.container()?;
        return Ok(container.sync()?);
    }
    let handle = session.io.handle(handle)?;
    Ok(handle.object.sync()?)
}

/// Metadata entries of the data plane run through the functions above, exactly as the
/// gRPC handlers call them: same checks, same limits, same errors. The session is the
/// one that owns the ring the entry came on.
impl meta::Namespace for Agent {
    fn metadata(&self, session_id: u64, request: meta::Request) -> Result<meta::Reply> {
        use meta::{Reply, Request};
        let session = self.session(session_id)?;
        let max_handles = self.session_limits(&session.tenant).0;
        let opened = |(handle, attr, chunk_bytes)| Reply::Opened { handle, attr, chunk_bytes };
        Ok(match request {
            Request::Stat { path } => Reply::Attr(stat(&session, &path)?),
            Request::StatHandle { handle } => Reply::Attr(stat_handle(&session, handle)?),
            Request::Open { path, write, truncate } => {
                opened(open(self, &session, &path, open_options(write, truncate)?, 0, max_handles, 0)?)
            }
            Request::Create { path, exclusive, mode } => {
                let (options, mode) = create_options(exclusive, mode, Layout::default());
                opened(open(self, &session, &path, options, mode, max_handles, 0)?)
            }
            Request::Close { handle } => {
                session.io.close_handle(handle)?;
                Reply::Done
            }
            Request::Remove { path, recursive } => {
                remove(self, &session, &path, recursive)?;
                Reply::Done
            }
            Request::OpenRead { path } => {
                let (object, attr) = open_read(&session, &path)?;
                Reply::Object { object, attr }
            }
            Request::Lookup { paths } => Reply::Lookup(
                lookup(&session, paths, self.limits().max_lookup_paths)?.into_iter().map(|(_, r)| r).collect(),
            ),
            Request::Readdir { path, anchor, max } => {
                let (container, p) = readdir_target(&session, &path)?;
                let batch = readdir_batch(max, self.limits().max_readdir_batch);
                let (entries, anchor) =
                    container.readdir(&p, (!anchor.is_empty()).then_some(anchor.as_str()), batch)?;
                Reply::Dir { entries, anchor }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::SessionRights;

    /// An agent over the local backend in `dir`, serving tenant "a", with a mounted session.
    fn agent_with_session(dir: &std::path::Path) -> (Agent, Arc<Session>) {
        let config = crate::config::Config {
            tenants: vec![crate::config::TenantConfig::new("a", "a")],
            ..crate::config::Config::default()
        };
        let backend = dpuio_backend::local::LocalBackend::open(dir.to_owned()).unwrap();
        let agent = Agent::new(config, Arc::new(backend));
        let session = agent.attach("a", "test", SessionRights::full()).unwrap();
        mount(&agent, &session, "").unwrap();
        (agent, session)
    }

    #[test]
    fn a_session_that_ends_takes_its_unfinished_puts_temporary_files_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let (agent, session) = agent_with_session(dir.path());
        let (create, mode) = create_options(false, 0, Layout::default());
        let made = |path: &str| open(&agent, &session, path, create, mode, 8, 0).unwrap();
        for path in ["/kept", "/.kept.dpuio-put.1", "/.left.dpuio-put.2", "/.gone.dpuio-put.3"] {
            made(path);
        }
        rename(&agent, &session, "/.kept.dpuio-put.1", "/kept", true).unwrap();
        remove(&agent, &session, "/.gone.dpuio-put.3", false).unwrap();
        assert_eq!(agent.put_temps(), (1, 0));
        let exists = |p: &str| session.container().unwrap().stat(&NsPath::parse(p).unwrap()).is_ok();
        agent.detach(session.id).unwrap();
        assert!(exists("/kept"), "a put renamed into place stays");
        assert!(!exists("/.left.dpuio-put.2"), "the unfinished put's temporary file is gone");
        assert_eq!(agent.metrics.put_temps_removed("a", "session_closed"), 1);
        assert_eq!(agent.put_temps(), (0, 0));
    }

    #[test]
    fn a_session_closed_by_the_agent_stopping_keeps_them_for_its_resume() {
        let dir = tempfile::tempdir().unwrap();
        let (agent, session) = agent_with_session(dir.path());
        let (create, mode) = create_options(false, 0, Layout::default());
        let (handle, _, _) = open(&agent, &session, "/.f.dpuio-put.1", create, mode, 8, 0).unwrap();
        session.io.close_handle(handle).unwrap();
        let e = open(&agent, &session, "/.g.dpuio-put.1", create, mode, 1, 0).unwrap_err();
        assert!(e.to_string().contains("unfinished puts in this session"), "{e}");
        assert!(session.container().unwrap().stat(&NsPath::parse("/.g.dpuio-put.1").unwrap()).is_err(), "not made");
        agent.close_everything().unwrap();
        assert!(session.container().unwrap().stat(&NsPath::parse("/.f.dpuio-put.1").unwrap()).is_ok());
        assert_eq!(agent.put_temps(), (1, 0), "still noted (and in the journal), for the next start");
    }

    #[test]
    fn a_replacing_rename_needs_what_a_put_in_place_needs() {
        let p = |s: &str| NsPath::parse(s).unwrap();
        let (temp, target) = (p("/d/.model.pt.dpuio-put.1a2b"), p("/d/model.pt"));
        let ops: Vec<String> = replace_rights(&temp, &target).iter().map(|(op, path)| format!("{op} {path}")).collect();
        assert_eq!(
            ops,
            ["create /d/model.pt", "write /d/model.pt", "write /d/.model.pt.dpuio-put.1a2b"],
            "a put's temporary file is published with the rights of a put"
        );
        // Anything else moved over a file is a Delete of its old name, as a rename is.
        for from in ["/d/other", "/e/.model.pt.dpuio-put.1a2b", "/d/.model.pt.dpuio-put.", "/d/.other.dpuio-put.1"] {
            let from = p(from);
            let [_, _, (op, path)] = replace_rights(&from, &target);
            assert_eq!((op, path.to_string()), (Op::Delete, from.to_string()));
        }
    }
}
