//! `include/dpuio.h` is generated from `src/lib.rs` by cbindgen and checked in (C users
//! read it without building anything). This test regenerates it and fails when the
//! checked-in copy is stale; `DPUIO_BLESS=1` rewrites it instead.

use std::path::Path;

#[test]
fn checked_in_header_is_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("read cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses src/lib.rs")
        .write(&mut generated);
    let path = crate_dir.join("include/dpuio.h");
    if std::env::var_os("DPUIO_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/dpuio.h");
        return;
    }
    let current = std::fs::read(&path).unwrap_or_default();
    assert!(
        current == generated,
        "{} is stale: regenerate it with `DPUIO_BLESS=1 cargo test -p dpuio-capi --test header`",
        path.display()
    );
}
