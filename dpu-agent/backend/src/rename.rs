//! The checks both backends make before a rename or a replace, on the paths alone, so
//! that they refuse the same requests with the same errors. What needs the storage
//! (whether `from` exists, what `to` is) stays with each backend.

use crate::{Error, NsPath, Result};

/// Why a directory cannot be renamed to a path below itself.
pub const INTO_OWN_SUBTREE: &str = "a directory cannot move into its own subtree";

/// [`Error::InvalidRename`] of `from` to `to`, for `reason`.
pub fn invalid_rename(from: &NsPath, to: &NsPath, reason: &str) -> Error {
    Error::InvalidRename { from: from.to_string(), to: to.to_string(), reason: reason.to_owned() }
}

/// Before [`crate::Container::rename`]: the container root can neither move nor be
/// replaced.
pub fn check_rename(from: &NsPath, to: &NsPath) -> Result<()> {
    if from.is_root() {
        return Err(invalid_rename(from, to, "the container root cannot be renamed"));
    }
    if to.is_root() {
        return Err(invalid_rename(from, to, "the container root cannot be replaced"));
    }
    Ok(())
}

/// Before [`crate::Container::replace`]: neither end is the container root, and a
/// file does not replace itself.
pub fn check_replace(from: &NsPath, to: &NsPath) -> Result<()> {
    if from.is_root() || to.is_root() {
        return Err(invalid_rename(from, to, "the container root cannot be renamed or replaced"));
    }
    if from == to {
        return Err(invalid_rename(from, to, "a file cannot replace itself"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(path: &str) -> NsPath {
        NsPath::parse(path).unwrap()
    }

    fn reason(r: Result<()>) -> String {
        match r {
            Err(Error::InvalidRename { reason, .. }) => reason,
            other => panic!("expected InvalidRename, got {other:?}"),
        }
    }

    #[test]
    fn the_root_never_moves_and_a_file_never_replaces_itself() {
        assert!(check_rename(&p("/a"), &p("/b")).is_ok());
        assert!(check_rename(&p("/a"), &p("/a")).is_ok(), "the backend says AlreadyExists");
        assert_eq!(reason(check_rename(&p("/"), &p("/b"))), "the container root cannot be renamed");
        assert_eq!(reason(check_rename(&p("/a"), &p("/"))), "the container root cannot be replaced");
        assert!(check_replace(&p("/a"), &p("/b")).is_ok());
        assert!(reason(check_replace(&p("/"), &p("/b"))).contains("root"));
        assert!(reason(check_replace(&p("/a"), &p("/"))).contains("root"));
        assert_eq!(reason(check_replace(&p("/a"), &p("/a"))), "a file cannot replace itself");
    }
}
