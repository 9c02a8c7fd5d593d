//! Attributes as Python sees them: a plain tuple, the same from `Session.stat`,
//! `Session.listdir` and `File.stat`.

use dpuio_shim::{Attr, EntryKind};

/// Attributes as a tuple: (kind, size, mode, mtime_ns, object_id), kind "file" or "dir".
pub(crate) type AttrTuple = (&'static str, u64, u32, i64, u64);

pub(crate) fn attr_tuple(a: &Attr) -> AttrTuple {
    let kind = match a.kind {
        EntryKind::File => "file",
        EntryKind::Directory => "dir",
    };
    (kind, a.size, a.mode, a.mtime_ns, a.object_id)
}
