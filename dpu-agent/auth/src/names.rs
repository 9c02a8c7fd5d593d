//! Identifiers and paths as this crate accepts them.
//!
//! Tenant and container names follow `dpu-agent`'s `config::check_identifier`: 1 to 63
//! bytes of `[A-Za-z0-9._-]`, not starting with `.` or `-`. The same string is a SPIFFE
//! path segment, a directory name, a DAOS label and a metrics label, so the alphabet is
//! the intersection of what all of those accept.
//!
//! Paths are the normal form of the backend's `NsPath` (`/` or `/a/b`: absolute, no
//! empty, `.` or `..` component, no NUL, components of at most 255 bytes, at most 4096
//! bytes in all). This module only *checks* that form; it never normalises, because a
//! token or a rights check that silently rewrote `/a/../b` would authorise something
//! other than what was asked. Callers parse client input into `NsPath` first and pass
//! `NsPath::as_str()`.

use std::fmt;

/// Longest tenant or container name, in bytes.
pub const MAX_IDENTIFIER_BYTES: usize = 63;

/// Longest path component, in bytes (`NAME_MAX`, as in the backend).
pub const MAX_COMPONENT_BYTES: usize = 255;

/// Longest path, in bytes (`PATH_MAX`, as in the backend).
pub const MAX_PATH_BYTES: usize = 4096;

/// How much of an offending value an error quotes: messages reach clients and logs.
const QUOTE_CHARS: usize = 64;

/// What kind of identifier was being checked, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NameKind {
    /// A tenant name (SPIFFE path segment, token fact, QoS key).
    Tenant,
    /// A container name.
    Container,
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::Tenant => "tenant",
            NameKind::Container => "container",
        })
    }
}

/// Why a name or path was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty or longer than [`MAX_IDENTIFIER_BYTES`].
    #[error("{kind} name {value:?} must be 1 to {MAX_IDENTIFIER_BYTES} characters long")]
    Length {
        /// Which identifier.
        kind: NameKind,
        /// The offending value (shortened).
        value: String,
    },
    /// The name starts with `.` or `-` (hidden files, command-line options).
    #[error("{kind} name {value:?} must not start with '.' or '-'")]
    Leading {
        /// Which identifier.
        kind: NameKind,
        /// The offending value (shortened).
        value: String,
    },
    /// The name contains a character outside `[A-Za-z0-9._-]`.
    #[error("{kind} name {value:?} may only contain ASCII letters, digits, '-', '_' and '.', not {bad:?}")]
    Character {
        /// Which identifier.
        kind: NameKind,
        /// The offending value (shortened).
        value: String,
        /// The first character not allowed.
        bad: char,
    },
    /// The path is not in the normal form described in the module documentation.
    #[error("path {path:?} is not a normalised absolute path: {reason}")]
    Path {
        /// The offending path (shortened).
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Check a tenant or container name.
pub fn validate_identifier(kind: NameKind, value: &str) -> Result<(), NameError> {
    if value.is_empty() || value.len() > MAX_IDENTIFIER_BYTES {
        return Err(NameError::Length { kind, value: quote(value) });
    }
    if value.starts_with(['.', '-']) {
        return Err(NameError::Leading { kind, value: quote(value) });
    }
    if let Some(bad) = value.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        return Err(NameError::Character { kind, value: quote(value), bad });
    }
    Ok(())
}

/// Check that `path` is in normal form (`/` or `/a/b`, see the module documentation).
pub fn validate_path(path: &str) -> Result<(), NameError> {
    let refuse = |reason| Err(NameError::Path { path: quote(path), reason });
    if path.len() > MAX_PATH_BYTES {
        return refuse("longer than 4096 bytes");
    }
    let Some(rest) = path.strip_prefix('/') else {
        return refuse("it must start with '/'");
    };
    if rest.is_empty() {
        return Ok(());
    }
    for component in rest.split('/') {
        if component.is_empty() {
            return refuse("empty component (repeated or trailing '/')");
        }
        if component == "." || component == ".." {
            return refuse("'.' and '..' components are not allowed");
        }
        if component.len() > MAX_COMPONENT_BYTES {
            return refuse("a component is longer than 255 bytes");
        }
        if component.contains('\0') {
            return refuse("NUL byte");
        }
    }
    Ok(())
}

/// Whether `path` is `prefix` or lies below it, component by component: `/data` covers
/// `/data` and `/data/x` but not `/database`; `/` covers every path.
///
/// Both arguments must be in normal form; if either is not, the answer is `false`
/// (fail closed), never a guess.
pub fn path_within(path: &str, prefix: &str) -> bool {
    if validate_path(path).is_err() || validate_path(prefix).is_err() {
        return false;
    }
    within_normalised(path, prefix)
}

/// [`path_within`] for arguments already known to be in normal form.
pub(crate) fn within_normalised(path: &str, prefix: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Shorten a value for an error message, on a character boundary.
pub(crate) fn quote(value: &str) -> String {
    match value.char_indices().nth(QUOTE_CHARS) {
        Some((end, _)) => format!("{}...", &value[..end]),
        None => value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        for ok in ["a", "acme", "team-1", "A.b_c", "0", &"x".repeat(63)] {
            validate_identifier(NameKind::Tenant, ok).unwrap();
        }
        let too_long = "x".repeat(64);
        for (bad, want) in [
            ("", "1 to 63"),
            (too_long.as_str(), "1 to 63"),
            (".hidden", "must not start"),
            ("-opt", "must not start"),
            ("a/b", "'/'"),
            ("a b", "' '"),
            ("é", "'é'"),
            ("a\0", "'\\0'"),
        ] {
            let err = validate_identifier(NameKind::Container, bad).unwrap_err().to_string();
            assert!(err.contains(want), "{bad:?}: {err}");
            assert!(err.starts_with("container name"), "{err}");
        }
    }

    #[test]
    fn paths() {
        for ok in ["/", "/a", "/a/b", "/a.b/..c/...", &format!("/{}", "x".repeat(255))] {
            validate_path(ok).unwrap();
        }
        for bad in
            ["", "a", "a/b", "//", "/a/", "/a//b", "/.", "/a/..", "/a/./b", "/a\0", &format!("/{}", "x".repeat(256))]
        {
            assert!(validate_path(bad).is_err(), "{bad:?}");
        }
        let long = "/abc".repeat(1025);
        assert!(validate_path(&long).is_err());
    }

    #[test]
    fn within_is_component_wise() {
        assert!(path_within("/data", "/data"));
        assert!(path_within("/data/x", "/data"));
        assert!(path_within("/data/x/y", "/data/x"));
        assert!(!path_within("/database", "/data"));
        assert!(!path_within("/dat", "/data"));
        assert!(!path_within("/", "/data"));
        assert!(path_within("/anything", "/"));
        assert!(path_within("/", "/"));
        // Not normalised: refused, not interpreted.
        assert!(!path_within("/data/../etc", "/data"));
        assert!(!path_within("/data/x", "/data/"));
        assert!(!path_within("data/x", "/data"));
    }

    #[test]
    fn quote_shortens_on_char_boundary() {
        let s = "é".repeat(100);
        let q = quote(&s);
        assert_eq!(q.chars().count(), QUOTE_CHARS + 3);
    }
}
