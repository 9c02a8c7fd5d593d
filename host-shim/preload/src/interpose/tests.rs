use super::stdio::mode_flags;
use super::*;

#[test]
fn fopen_modes_are_the_open_flags_of_the_c_standard() {
    use libc::{O_APPEND, O_CLOEXEC, O_CREAT, O_EXCL, O_RDONLY, O_RDWR, O_TRUNC, O_WRONLY};
    let cases: [(&[u8], Option<c_int>); 9] = [
        (b"r", Some(O_RDONLY)),
        (b"rb", Some(O_RDONLY)),
        (b"r+", Some(O_RDWR)),
        (b"w", Some(O_WRONLY | O_CREAT | O_TRUNC)),
        (b"wb+", Some(O_RDWR | O_CREAT | O_TRUNC)),
        (b"a", Some(O_WRONLY | O_CREAT | O_APPEND)),
        (b"wx", Some(O_WRONLY | O_CREAT | O_TRUNC | O_EXCL)),
        (b"re", Some(O_RDONLY | O_CLOEXEC)),
        (b"q", None),
    ];
    for (mode, want) in cases {
        assert_eq!(mode_flags(mode), want, "{}", String::from_utf8_lossy(mode));
    }
}

#[test]
fn open_flags_say_which_way_and_how() {
    let f = open_flags(libc::O_RDONLY);
    assert!(f.read && !f.write && !f.create);
    let f = open_flags(libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL);
    assert!(!f.read && f.write && f.create && f.exclusive && !f.truncate);
    let f = open_flags(libc::O_RDWR | libc::O_APPEND | libc::O_TRUNC);
    assert!(f.read && f.write && f.append && f.truncate);
}

#[test]
fn placeholder_labels_name_what_an_exec_inherits() {
    let attr = Attr { kind: EntryKind::Directory, size: 0, mode: 0, mtime_ns: 0, object_id: 0 };
    let dir = Node::Directory { path: "/a/b".into(), attr };
    assert_eq!(label(&dir, libc::O_RDONLY), "dpuio:d:/a/b");
    let link = |label: &str| format!("/memfd:{label} (deleted)");
    assert!(matches!(parse_label(&link("dpuio:d:/a/b")), Some(Node::Directory { path, .. }) if path == "/a/b"));
    let Some(Node::File(f)) = parse_label(&link("dpuio:401:/x y/z")) else { panic!("a file label") };
    assert_eq!(f.path, "/x y/z");
    assert!(f.flags.write && !f.flags.read && f.flags.append && !f.flags.create);
    for other in ["/dev/null", "/memfd:other (deleted)", "/memfd:dpuio:zz:/p (deleted)", "/memfd:dpuio:0:rel (deleted)"]
    {
        assert!(parse_label(other).is_none(), "{other}");
    }
}

#[test]
fn without_a_prefix_nothing_is_dpuio() {
    // The test process has no DPUIO_MOUNT: every path goes to libc.
    // SAFETY: a NUL-terminated literal.
    assert!(unsafe { at_path(libc::AT_FDCWD, c"/mnt/dpuio/x".as_ptr()) }.is_none());
    assert!(!is_marked(0) && !is_marked(-1) && !is_marked(1 << 20));
}
