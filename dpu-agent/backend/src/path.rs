//! Validated paths inside a container.
//!
//! Every path a client sends is parsed into an [`NsPath`] before any backend sees it,
//! so backends never meet an empty component, `.`, `..` or a NUL byte, and every path
//! names something below its container root. Escapes such as `/a/../../etc` are
//! rejected, never normalised: resolving `..` lexically would make "what the client
//! asked for" and "what the backend touched" differ (and `..` after a renamed or
//! linked directory does not mean what the text suggests), so a request that contains
//! one is a bug or an attack and gets a clear error.
//!
//! Deliberately not here: any file-system access. A path is a value; whether it exists,
//! and whether a link hides in it, is the backend's business.

use std::fmt;

use crate::{Error, Result};

/// Longest single component, in bytes (`NAME_MAX` on Linux; DFS has the same limit).
pub const MAX_NAME_BYTES: usize = 255;

/// Longest whole path, in bytes, as normalised (`PATH_MAX` on Linux).
pub const MAX_PATH_BYTES: usize = 4096;

/// How much of an offending name or path an error message quotes. Messages go back to
/// clients and into logs, so they stay short even for a 4 KiB path.
const QUOTE_CHARS: usize = 48;

/// A path inside a container: absolute, normalised to `/a/b` (the root is `/`), every
/// component a valid name (see [`validate_name`]), at most [`MAX_PATH_BYTES`] long.
///
/// The only ways to build one are [`NsPath::parse`], [`NsPath::root`] and
/// [`NsPath::join`], which all check, so holding an `NsPath` is proof of validity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NsPath(String);

impl NsPath {
    /// The container root, `/`.
    pub fn root() -> NsPath {
        NsPath("/".to_owned())
    }

    /// Parse a client path. A relative path (`a/b`) is taken from the root, repeated
    /// slashes collapse and a trailing slash is ignored; an empty path, a `.` or `..`
    /// component, a NUL byte, a component over [`MAX_NAME_BYTES`] or a result over
    /// [`MAX_PATH_BYTES`] is [`Error::InvalidPath`].
    pub fn parse(s: &str) -> Result<NsPath> {
        if s.is_empty() {
            return Err(invalid(s, "the path is empty (the container root is \"/\")".into()));
        }
        // The output never exceeds MAX_PATH_BYTES + one component before we bail out,
        // so a huge input costs no more than a scan.
        let mut out = String::with_capacity(s.len().min(MAX_PATH_BYTES + 1));
        for (index, name) in s.split('/').filter(|c| !c.is_empty()).enumerate() {
            if let Err(reason) = check_component(name) {
                return Err(invalid(s, format!("component {} {reason}", index + 1)));
            }
            out.push('/');
            out.push_str(name);
            if out.len() > MAX_PATH_BYTES {
                return Err(invalid(s, format!("the path is longer than {MAX_PATH_BYTES} bytes")));
            }
        }
        if out.is_empty() {
            out.push('/');
        }
        Ok(NsPath(out))
    }

    /// Whether this is the container root.
    pub fn is_root(&self) -> bool {
        self.0 == "/"
    }

    /// The normalised text, `/` or `/a/b`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The components from the root down; none for the root.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        // "/" leaves an empty string after the leading slash; no other empty
        // component can exist in a normalised path.
        self.0[1..].split('/').filter(|c| !c.is_empty())
    }

    /// The parent directory; `None` for the root.
    pub fn parent(&self) -> Option<NsPath> {
        if self.is_root() {
            return None;
        }
        match self.0.rfind('/') {
            Some(0) | None => Some(NsPath::root()),
            Some(i) => Some(NsPath(self.0[..i].to_owned())),
        }
    }

    /// The last component; `None` for the root.
    pub fn file_name(&self) -> Option<&str> {
        if self.is_root() {
            return None;
        }
        self.0.rfind('/').map(|i| &self.0[i + 1..])
    }

    /// This path with one more component. `name` must be a single valid name (see
    /// [`validate_name`]) and the result must fit in [`MAX_PATH_BYTES`].
    pub fn join(&self, name: &str) -> Result<NsPath> {
        validate_name(name)?;
        let mut out = String::with_capacity(self.0.len() + 1 + name.len());
        if !self.is_root() {
            out.push_str(&self.0);
        }
        out.push('/');
        out.push_str(name);
        if out.len() > MAX_PATH_BYTES {
            return Err(invalid(&out, format!("the path is longer than {MAX_PATH_BYTES} bytes")));
        }
        Ok(NsPath(out))
    }

    /// Whether `base` is this path or one of its ancestors, component by component
    /// (`/a/bc` does not start with `/a/b`).
    pub fn starts_with(&self, base: &NsPath) -> bool {
        if base.is_root() {
            return true;
        }
        match self.0.strip_prefix(base.as_str()) {
            Some(rest) => rest.is_empty() || rest.starts_with('/'),
            None => false,
        }
    }
}

impl fmt::Display for NsPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Check one name (a directory entry or a container name): not empty, not `.` or `..`,
/// no `/`, no NUL byte, at most [`MAX_NAME_BYTES`].
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(invalid(name, "the name is empty".into()));
    }
    if name.contains('/') {
        return Err(invalid(name, format!("{} contains '/' but must be a single name", quote(name))));
    }
    check_component(name).map_err(|reason| invalid(name, format!("name {reason}")))
}

/// The checks a non-empty, slash-free component must pass; the error is the reason,
/// worded to follow "component 3 " or "name ".
fn check_component(name: &str) -> std::result::Result<(), String> {
    if name == "." || name == ".." {
        return Err(format!(
            "{name:?} is not allowed: paths name entries directly and cannot step to a parent \
             or to the same directory"
        ));
    }
    if name.contains('\0') {
        return Err(format!("{} contains a NUL byte", quote(name)));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!("{} is {} bytes, over the limit of {MAX_NAME_BYTES}", quote(name), name.len()));
    }
    Ok(())
}

fn invalid(path: &str, reason: String) -> Error {
    // An over-long path is quoted, not copied whole into the error.
    let path = if path.len() > MAX_PATH_BYTES {
        let head: String = path.chars().take(QUOTE_CHARS).collect();
        format!("{head}…")
    } else {
        path.to_owned()
    };
    Error::InvalidPath { path, reason }
}

/// A name for a message: Debug-quoted (so NUL and control bytes are visible) and
/// shortened.
fn quote(name: &str) -> String {
    if name.chars().count() <= QUOTE_CHARS {
        format!("{name:?}")
    } else {
        let head: String = name.chars().take(QUOTE_CHARS).collect();
        format!("{head:?}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> NsPath {
        NsPath::parse(s).unwrap()
    }

    /// The reason of an `InvalidPath`, or a panic naming what came back instead.
    fn rejected(s: &str) -> String {
        match NsPath::parse(s) {
            Err(Error::InvalidPath { reason, .. }) => reason,
            other => panic!("{s:?} should be rejected, got {other:?}"),
        }
    }

    #[test]
    fn parse_normalises() {
        assert_eq!(p("/").as_str(), "/");
        assert_eq!(p("///").as_str(), "/");
        assert_eq!(p("/a/b").as_str(), "/a/b");
        assert_eq!(p("a/b").as_str(), "/a/b");
        assert_eq!(p("//a///b//").as_str(), "/a/b");
        assert_eq!(p("/a/b/").as_str(), "/a/b");
        assert_eq!(p("a").as_str(), "/a");
        // Names that merely contain dots are ordinary names.
        assert_eq!(p("/.hidden/..x/x..").as_str(), "/.hidden/..x/x..");
        assert_eq!(p("/ä/😀").as_str(), "/ä/😀");
    }

    #[test]
    fn parse_rejects_empty() {
        assert!(rejected("").contains("empty"));
    }

    #[test]
    fn parse_rejects_dot_components_naming_them() {
        let reason = rejected("/a/./b");
        assert!(reason.contains("component 2") && reason.contains("\".\""), "{reason}");
        let reason = rejected("/a/../../etc");
        assert!(reason.contains("component 2") && reason.contains("\"..\""), "{reason}");
        rejected("..");
        rejected(".");
        rejected("/a/..");
        rejected("../x");
    }

    #[test]
    fn parse_rejects_nul() {
        let reason = rejected("/a/b\0c");
        assert!(reason.contains("component 2") && reason.contains("NUL"), "{reason}");
    }

    #[test]
    fn parse_enforces_name_limit() {
        let longest = "n".repeat(MAX_NAME_BYTES);
        assert_eq!(p(&format!("/{longest}")).as_str().len(), MAX_NAME_BYTES + 1);
        let reason = rejected(&format!("/ok/{}", "n".repeat(MAX_NAME_BYTES + 1)));
        assert!(reason.contains("component 2") && reason.contains("256 bytes"), "{reason}");
        // Bytes count, not characters: 128 two-byte characters are 256 bytes.
        rejected(&"é".repeat(128));
    }

    #[test]
    fn parse_enforces_path_limit() {
        // 16 components of 255 bytes plus 16 slashes = 4096 bytes: the longest path.
        let name = "n".repeat(MAX_NAME_BYTES);
        let longest = format!("/{name}").repeat(16);
        assert_eq!(longest.len(), MAX_PATH_BYTES);
        assert_eq!(p(&longest).as_str().len(), MAX_PATH_BYTES);
        let reason = rejected(&format!("{longest}/x"));
        assert!(reason.contains("4096"), "{reason}");
        // Redundant slashes do not count against the limit.
        assert_eq!(p(&format!("//{}", longest.replace('/', "//"))), p(&longest));
    }

    #[test]
    fn huge_inputs_are_quoted_not_copied() {
        let huge = "x/".repeat(100_000);
        match NsPath::parse(&huge) {
            Err(Error::InvalidPath { path, .. }) => assert!(path.len() < 200, "{}", path.len()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn accessors() {
        let root = NsPath::root();
        assert!(root.is_root());
        assert_eq!(root, p("/"));
        assert_eq!(root.components().count(), 0);
        assert_eq!(root.parent(), None);
        assert_eq!(root.file_name(), None);

        let ab = p("/a/b");
        assert!(!ab.is_root());
        assert_eq!(ab.components().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(ab.parent(), Some(p("/a")));
        assert_eq!(p("/a").parent(), Some(NsPath::root()));
        assert_eq!(ab.file_name(), Some("b"));
        assert_eq!(ab.to_string(), "/a/b");
        assert_eq!(format!("{root}"), "/");
    }

    #[test]
    fn join_validates_a_single_name() {
        assert_eq!(NsPath::root().join("a").unwrap(), p("/a"));
        assert_eq!(p("/a").join("b").unwrap(), p("/a/b"));
        for bad in ["", ".", "..", "a/b", "/", "a\0", &"n".repeat(MAX_NAME_BYTES + 1)] {
            assert!(matches!(p("/a").join(bad), Err(Error::InvalidPath { .. })), "join({bad:?}) should fail");
        }
        // The result must still fit.
        let name = "n".repeat(MAX_NAME_BYTES);
        let full = p(&format!("/{name}").repeat(16));
        assert!(matches!(full.join("x"), Err(Error::InvalidPath { .. })));
    }

    #[test]
    fn starts_with_is_component_wise() {
        let root = NsPath::root();
        assert!(p("/a/b").starts_with(&root));
        assert!(root.starts_with(&root));
        assert!(p("/a/b").starts_with(&p("/a")));
        assert!(p("/a/b").starts_with(&p("/a/b")));
        assert!(!p("/a/bc").starts_with(&p("/a/b")));
        assert!(!p("/a").starts_with(&p("/a/b")));
        assert!(!root.starts_with(&p("/a")));
    }

    #[test]
    fn validate_name_cases() {
        validate_name("file.txt").unwrap();
        validate_name(".hidden").unwrap();
        validate_name(&"n".repeat(MAX_NAME_BYTES)).unwrap();
        for (bad, needle) in
            [("", "empty"), (".", "not allowed"), ("..", "not allowed"), ("a/b", "'/'"), ("/", "'/'"), ("a\0b", "NUL")]
        {
            match validate_name(bad) {
                Err(Error::InvalidPath { reason, .. }) => {
                    assert!(reason.contains(needle), "{bad:?}: {reason}")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        match validate_name(&"n".repeat(MAX_NAME_BYTES + 1)) {
            Err(Error::InvalidPath { reason, .. }) => {
                assert!(reason.contains("256 bytes") && reason.contains('…'), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
}
