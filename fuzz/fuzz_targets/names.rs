//! Names and paths from clients: namespace paths (`NsPath::parse`, `validate_name`),
//! token paths (`names::validate_path`, `path_within`) and operation lists
//! (`OpMask::parse_list`, as `dpuctl token mint --ops` takes them).
//!
//! Input: `mode u8` (0 a path, 1 an operation list, 2 a name), then the text.
#![no_main]

use dpuio_auth::names;
use dpuio_auth::token::OpMask;
use dpuio_backend::{NsPath, validate_name};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|b: &[u8]| {
    let Some((&mode, rest)) = b.split_first() else { return };
    let Ok(s) = std::str::from_utf8(rest) else { return };
    match mode % 3 {
        0 => {
            if let Ok(path) = NsPath::parse(s) {
                assert_eq!(NsPath::parse(path.as_str()).ok().as_ref(), Some(&path), "a parsed path is normal");
                let mut rebuilt = NsPath::root();
                for c in path.components() {
                    validate_name(c).expect("components of a valid path are valid names");
                    rebuilt = rebuilt.join(c).expect("joining valid names");
                }
                assert_eq!(rebuilt, path);
                if let Some(parent) = path.parent() {
                    assert!(path.starts_with(&parent));
                    assert_eq!(
                        parent.join(path.file_name().expect("a non-root path has a name")).ok(),
                        Some(path.clone())
                    );
                }
            }
            if names::validate_path(s).is_ok() {
                assert!(names::path_within(s, s));
                assert!(names::path_within(s, "/"));
            }
        }
        1 => {
            if let Ok(ops) = OpMask::parse_list(s) {
                let listed = if ops.is_empty() { String::new() } else { ops.to_string() };
                assert_eq!(OpMask::parse_list(&listed).ok(), Some(ops), "an operation list prints back");
                assert_eq!(OpMask::from_bits(ops.bits()), Some(ops));
            }
        }
        _ => {
            if validate_name(s).is_ok() {
                assert_eq!(
                    NsPath::root().join(s).ok().map(|p| p.file_name().map(str::to_owned)),
                    Some(Some(s.to_owned()))
                );
            }
        }
    }
});
