//! Payload a backend read into memory of its own, lent to the caller.
//!
//! A backend whose I/O runs in another process (the DAOS worker of a tenant with a DAOS
//! identity of its own) reads into memory shared with that process. A caller that
//! moves the bytes on with a transport can register that memory once and put straight
//! from it, instead of giving a buffer of its own and having the bytes copied into it.
//! [`Object::read_staged`](crate::Object::read_staged) offers this for reads, and
//! [`Object::staging_for_write`](crate::Object::staging_for_write) with
//! [`Object::write_staged`](crate::Object::write_staged) for writes (the caller gets
//! the host's bytes straight into the backend's memory); everything else uses
//! [`Object::read_into`](crate::Object::read_into) and
//! [`Object::write_from`](crate::Object::write_from).

use std::sync::Arc;

use host_bytes::{HostBytes, HostBytesMut, LentMemory};

/// Bytes a backend read into memory of its own ([`LentMemory`]): lent until this value drops, when
/// the backend may reuse the memory. Whoever puts from it keeps it until the put is done.
pub struct Staged {
    memory: Arc<dyn LentMemory>,
    offset: usize,
    len: usize,
    _lease: Box<dyn Send + Sync>,
}

impl Staged {
    /// `len` bytes at `offset` of `memory`, lent while `lease` lives. `None` if the
    /// range is outside the memory.
    pub fn new(memory: Arc<dyn LentMemory>, offset: usize, len: usize, lease: Box<dyn Send + Sync>) -> Option<Staged> {
        memory.bytes(offset, len)?;
        Some(Staged { memory, offset, len, _lease: lease })
    }

    /// The memory the bytes are in.
    pub fn memory(&self) -> &Arc<dyn LentMemory> {
        &self.memory
    }

    /// Where in [`Staged::memory`] they start.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// How many bytes were read (fewer than asked only at the end of the file).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was read (the end of the file).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn bytes(&self) -> HostBytes<'_> {
        self.memory.bytes(self.offset, self.len).expect("checked in Staged::new")
    }

    /// The bytes, to fill (memory lent for a write, [`crate::Object::staging_for_write`]).
    pub fn bytes_mut(&mut self) -> HostBytesMut<'_> {
        self.memory.bytes_mut(self.offset, self.len).expect("checked in Staged::new")
    }
}
