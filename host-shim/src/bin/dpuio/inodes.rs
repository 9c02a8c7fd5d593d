//! The inode numbers of `dpuio mount`: one per container path the kernel was told of,
//! the same number for the same path for as long as the kernel remembers it.
//!
//! The agent names files by path, the kernel by inode number. This table is the whole
//! translation, kept without I/O so that its rules (lookup counts, forget, rename of a
//! directory moving everything under it) are tested in microseconds. A node lives while
//! the kernel holds lookups on it: every reply that hands the kernel an entry (lookup,
//! create, mkdir, readdirplus) counts one, `forget` gives them back, and at zero the
//! node goes. So the table grows no larger than the kernel's own inode cache.

use std::collections::HashMap;

/// The root directory's inode number, fixed by the FUSE protocol.
pub const ROOT: u64 = 1;

struct Node {
    /// `None` once the path was unlinked or renamed over while the kernel still holds
    /// the inode (an open file being removed): it names nothing any more.
    path: Option<String>,
    lookups: u64,
}

pub struct Inodes {
    by_path: HashMap<String, u64>,
    nodes: HashMap<u64, Node>,
    next: u64,
}

impl Inodes {
    pub fn new() -> Inodes {
        let mut inodes = Inodes { by_path: HashMap::new(), nodes: HashMap::new(), next: ROOT + 1 };
        // The root is never forgotten: one lookup the kernel never gives back.
        inodes.by_path.insert("/".into(), ROOT);
        inodes.nodes.insert(ROOT, Node { path: Some("/".into()), lookups: 1 });
        inodes
    }

    /// The path inode `ino` names now (`None`: unknown, or removed since).
    pub fn path(&self, ino: u64) -> Option<&str> {
        self.nodes.get(&ino)?.path.as_deref()
    }

    /// The inode `path` names, if it has one.
    pub fn path_ino(&self, path: &str) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// The inode of `path`, made if new, without counting a lookup (a plain `readdir`
    /// entry, which the kernel does not count either).
    pub fn assign(&mut self, path: &str) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_path.insert(path.to_owned(), ino);
        self.nodes.insert(ino, Node { path: Some(path.to_owned()), lookups: 0 });
        ino
    }

    /// The inode of `path` with one more lookup: what replying with an entry tells
    /// the kernel.
    pub fn remember(&mut self, path: &str) -> u64 {
        let ino = self.assign(path);
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups += 1;
        }
        ino
    }

    /// The kernel dropped `count` lookups of `ino`; at none left the node goes.
    pub fn forget(&mut self, ino: u64, count: u64) {
        if ino == ROOT {
            return;
        }
        let Some(node) = self.nodes.get_mut(&ino) else { return };
        node.lookups = node.lookups.saturating_sub(count);
        if node.lookups == 0
            && let Some(node) = self.nodes.remove(&ino)
            && let Some(path) = node.path
            && self.by_path.get(&path) == Some(&ino)
        {
            self.by_path.remove(&path);
        }
    }

    /// `path` was removed: its inode (if the kernel still holds it) names nothing now.
    pub fn removed(&mut self, path: &str) {
        if let Some(ino) = self.by_path.remove(path) {
            self.drop_path(ino);
        }
    }

    /// `from` was renamed to `to`: its inode, and those of everything under it, move
    /// with it; whatever `to` named before names nothing now.
    pub fn renamed(&mut self, from: &str, to: &str) {
        self.removed(to);
        let under = format!("{}/", from.trim_end_matches('/'));
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.as_str() == from || p.starts_with(&under))
            .map(|(p, &ino)| (p.clone(), ino))
            .collect();
        for (old, ino) in moved {
            let new = format!("{to}{}", &old[from.len()..]);
            self.by_path.remove(&old);
            self.by_path.insert(new.clone(), ino);
            if let Some(node) = self.nodes.get_mut(&ino) {
                node.path = Some(new);
            }
        }
    }

    fn drop_path(&mut self, ino: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.path = None;
            if node.lookups == 0 {
                self.nodes.remove(&ino);
            }
        }
    }

    /// Inodes in the table (the root included).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_keeps_its_number_until_the_kernel_forgets_it() {
        let mut t = Inodes::new();
        assert_eq!(t.path(ROOT), Some("/"));
        let a = t.remember("/a");
        assert_eq!(t.remember("/a"), a, "the same path, the same inode");
        assert_ne!(t.remember("/b"), a);
        t.forget(a, 1);
        assert_eq!(t.path(a), Some("/a"), "one lookup is still held");
        t.forget(a, 1);
        assert_eq!(t.path(a), None);
        assert_eq!(t.len(), 2, "the root and /b");
        assert_ne!(t.remember("/a"), a, "a forgotten number is not reused for the path");
        t.forget(ROOT, 100);
        assert_eq!(t.path(ROOT), Some("/"), "the root is never forgotten");
    }

    #[test]
    fn renaming_a_directory_moves_everything_under_it() {
        let mut t = Inodes::new();
        let d = t.remember("/d");
        let f = t.remember("/d/f");
        let deep = t.remember("/d/e/g");
        let other = t.remember("/dx");
        let target = t.remember("/n");
        t.renamed("/d", "/n");
        assert_eq!(t.path(d), Some("/n"));
        assert_eq!(t.path(f), Some("/n/f"));
        assert_eq!(t.path(deep), Some("/n/e/g"));
        assert_eq!(t.path(other), Some("/dx"), "a sibling sharing the prefix stays");
        assert_eq!(t.path(target), None, "what /n was is replaced");
        assert_eq!(t.assign("/n/f"), f);
        t.forget(target, 1);
        assert_eq!(t.len(), 5);
    }

    #[test]
    fn a_removed_path_names_nothing_and_goes_when_forgotten() {
        let mut t = Inodes::new();
        let a = t.remember("/a");
        t.removed("/a");
        assert_eq!(t.path(a), None);
        assert_ne!(t.assign("/a"), a, "a new file at the path is a new inode");
        t.forget(a, 1);
        assert_eq!(t.len(), 2);
        let unlooked = t.assign("/u");
        t.removed("/u");
        assert_eq!(t.path(unlooked), None);
        assert_eq!(t.len(), 2, "an inode the kernel never counted goes at once");
    }
}
