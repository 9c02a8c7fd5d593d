//! The name of a whole-file put's temporary file, shared by the shim (which makes it)
//! and the agent (which lets whoever may write the target publish it).
//!
//! A put of `DIR/NAME` writes `DIR/.NAME.dpuio-put.SUFFIX`, syncs it and renames it over
//! `DIR/NAME` in one step (`Namespace.Rename` with `replace`): a crash leaves the old
//! file or the new one, and at worst this temporary file beside them. The name says
//! what it is, starts with a dot (hidden by `ls -a`-less listings and by checkpoint
//! listings) and stays in NAME's directory, so a capability token scoped to that
//! directory covers it.

/// What follows the target's name in a temporary file's name.
pub const TEMP_MARKER: &str = ".dpuio-put.";

/// The longest file name a container accepts (the backend's `MAX_NAME_BYTES`).
const MAX_NAME_BYTES: usize = 255;

/// The temporary file name for a put of the file named `target` (a file name, not a
/// path), with `suffix` making it unique. `None` when the name would be longer than a
/// container allows: such a put has no temporary name of this form.
pub fn temp_name(target: &str, suffix: &str) -> Option<String> {
    let name = format!(".{target}{TEMP_MARKER}{suffix}");
    (!target.is_empty() && !suffix.is_empty() && !suffix.contains(['.', '/']) && name.len() <= MAX_NAME_BYTES)
        .then_some(name)
}

/// Whether the file name `temp` is a put's temporary name for the file named `target`
/// (both file names in the same directory).
pub fn is_temp_of(temp: &str, target: &str) -> bool {
    temp.strip_prefix('.')
        .and_then(|rest| rest.strip_prefix(target))
        .and_then(|rest| rest.strip_prefix(TEMP_MARKER))
        .is_some_and(|suffix| !target.is_empty() && !suffix.is_empty() && !suffix.contains(['.', '/']))
}

/// The target's file name if the file name `name` has the shape of a put's temporary
/// file (`.NAME.dpuio-put.SUFFIX`), else `None`: how the agent tells, from a Create
/// alone, that a session starts a put whose temporary file it must not leave behind.
pub fn target_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix('.')?;
    // The suffix holds no '.', so the last marker is the one that ends the target.
    let at = rest.rfind(TEMP_MARKER)?;
    let target = &rest[..at];
    is_temp_of(name, target).then_some(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temp_name_names_its_target_and_nothing_else() {
        let t = temp_name("model.pt", "3f9a01c2").unwrap();
        assert_eq!(t, ".model.pt.dpuio-put.3f9a01c2");
        assert!(is_temp_of(&t, "model.pt"));
        for other in ["model", "model.p", "model.pt2", ".model.pt", ""] {
            assert!(!is_temp_of(&t, other), "{t} is no temporary of {other:?}");
        }
        for not_temp in ["model.pt", ".model.pt.dpuio-put.", ".model.pt.dpuio-put.a.b", "x.model.pt.dpuio-put.1"] {
            assert!(!is_temp_of(not_temp, "model.pt"), "{not_temp}");
        }
    }

    #[test]
    fn the_target_is_read_back_from_a_temp_name() {
        assert_eq!(target_of(".model.pt.dpuio-put.3f9a"), Some("model.pt"));
        assert_eq!(target_of(".a.dpuio-put.b.dpuio-put.1"), Some("a.dpuio-put.b"));
        assert_eq!(target_of(&temp_name("x y\nz", "01").unwrap()), Some("x y\nz"));
        for not_temp in
            ["model.pt", ".model.pt", ".model.pt.dpuio-put.", ".dpuio-put.1", "..dpuio-put.1", ".a.dpuio-put.x.y"]
        {
            assert_eq!(target_of(not_temp), None, "{not_temp}");
        }
    }

    #[test]
    fn no_temp_name_past_the_name_limit() {
        assert!(temp_name(&"n".repeat(230), "0123456789abcdef").is_none());
        assert!(temp_name(&"n".repeat(200), "0123456789abcdef").is_some());
        assert!(temp_name("", "1").is_none());
        assert!(temp_name("a", "").is_none());
        assert!(temp_name("a", "x.y").is_none());
    }
}
