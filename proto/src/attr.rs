//! The attributes of a namespace entry, as both sides of the wire hold them: the agent's
//! backends return them, the shim hands them to its callers. One definition, so that a
//! field added on one side cannot be forgotten on the other.
//!
//! On the wire they travel as `v1::Attr` (gRPC) or as an [`AttrRecord`] (the data
//! plane); the conversions from both are here. A kind neither side knows (a newer peer)
//! converts to `None`, and the caller says what it was asked.

use crate::wire::{AttrRecord, KIND_DIRECTORY, KIND_FILE};

/// Kind of an entry in a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Directory,
}

/// Attributes of one entry, as `stat` returns them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub kind: EntryKind,
    /// File size in bytes (0 for directories).
    pub size: u64,
    /// Permission bits (`0o755` style); informational, the agent enforces access itself.
    pub mode: u32,
    /// Last modification, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
    /// A number that identifies the entry within its container while it exists
    /// (the inode number for `local`, the object id for DAOS).
    pub object_id: u64,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub attr: Attr,
}

impl EntryKind {
    /// The kind an [`AttrRecord`] names ([`KIND_FILE`], [`KIND_DIRECTORY`]).
    pub fn from_record(kind: u8) -> Option<EntryKind> {
        match kind {
            KIND_FILE => Some(EntryKind::File),
            KIND_DIRECTORY => Some(EntryKind::Directory),
            _ => None,
        }
    }

    /// Its number in an [`AttrRecord`].
    pub fn record_kind(self) -> u8 {
        match self {
            EntryKind::File => KIND_FILE,
            EntryKind::Directory => KIND_DIRECTORY,
        }
    }
}

impl Attr {
    /// The attributes a data-plane answer carries; `None` for a kind this build does not
    /// know.
    pub fn from_record(r: &AttrRecord) -> Option<Attr> {
        Some(Attr {
            kind: EntryKind::from_record(r.kind)?,
            size: r.size,
            mode: r.mode,
            mtime_ns: r.mtime_ns,
            object_id: r.object_id,
        })
    }

    /// As a data-plane answer carries them.
    pub fn to_record(&self) -> AttrRecord {
        AttrRecord {
            kind: self.kind.record_kind(),
            mode: self.mode,
            size: self.size,
            mtime_ns: self.mtime_ns,
            object_id: self.object_id,
        }
    }

    /// The attributes a gRPC answer carries; `None` for a kind this build does not know
    /// (`ENTRY_KIND_UNSPECIFIED` included).
    #[cfg(feature = "grpc")]
    pub fn from_proto(a: &crate::v1::Attr) -> Option<Attr> {
        use crate::v1::EntryKind as Kind;
        let kind = match Kind::try_from(a.kind).ok()? {
            Kind::File => EntryKind::File,
            Kind::Directory => EntryKind::Directory,
            Kind::Unspecified => return None,
        };
        Some(Attr { kind, size: a.size, mode: a.mode, mtime_ns: a.mtime_ns, object_id: a.object_id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_unknown_kinds_are_none() {
        let a = Attr { kind: EntryKind::Directory, size: 0, mode: 0o755, mtime_ns: -3, object_id: 9 };
        assert_eq!(Attr::from_record(&a.to_record()), Some(a.clone()));
        assert_eq!(Attr::from_record(&AttrRecord { kind: 3, ..a.to_record() }), None);
        assert_eq!(Attr::from_record(&AttrRecord::default()), None, "an all-zero record names no kind");
    }

    #[cfg(feature = "grpc")]
    #[test]
    fn grpc_attributes_convert_and_unspecified_kinds_are_none() {
        use crate::v1;
        let p = v1::Attr { kind: v1::EntryKind::File as i32, size: 7, mode: 0o644, mtime_ns: 1, object_id: 2 };
        let a = Attr::from_proto(&p).unwrap();
        assert_eq!(a, Attr { kind: EntryKind::File, size: 7, mode: 0o644, mtime_ns: 1, object_id: 2 });
        for kind in [0, 3, -1] {
            assert_eq!(Attr::from_proto(&v1::Attr { kind, ..p }), None, "kind {kind}");
        }
    }
}
