//! Finds libfabric with pkg-config, generates bindings with bindgen, and compiles the
//! C wrappers bindgen writes for the header's `static inline` functions.

use std::env;
use std::path::PathBuf;

/// Oldest libfabric whose API we use (`fi_mr_regattr` with `iface`, `FI_HMEM`
/// fields in the attributes, provider names such as `tcp;ofi_rxm`): Debian 12 ships
/// 1.17.
const MIN_LIBFABRIC_VERSION: &str = "1.12";

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let lib = match pkg_config::Config::new().atleast_version(MIN_LIBFABRIC_VERSION).probe("libfabric") {
        Ok(lib) => lib,
        Err(err) => {
            // Panicking in build.rs is how a build script reports a fatal error; say
            // what to do, not only what failed.
            panic!(
                "\n\nlibfabric-sys: libfabric >= {MIN_LIBFABRIC_VERSION} not found through pkg-config \
                 (`libfabric.pc`).\n\
                 Install the development package, e.g. `apt-get install libfabric-dev` \
                 (Debian/Ubuntu) or `dnf install libfabric-devel`, or point PKG_CONFIG_PATH \
                 at the directory holding libfabric.pc of another build (DOCA / MLNX_OFED \
                 on BlueField, or the AWS EFA installer, ship their own).\n\
                 pkg-config said: {err}\n\n"
            );
        }
    };
    println!("cargo:version={}", lib.version);

    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let wrapper = manifest.join("wrapper.h");
    let static_fns = out.join("static_fns");

    let mut builder = bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*|fid.*")
        .allowlist_var("FI_.*|fi_.*")
        // The static inline calls (fi_domain, fi_write, fi_cq_read, ...) have no symbol
        // in libfabric.so: bindgen writes a C file of exported wrappers that call them,
        // compiled below, and binds the Rust names to the wrappers.
        .wrap_static_fns(true)
        .wrap_static_fns_path(&static_fns)
        // C enums become plain integer constants plus a type alias: libfabric ORs its
        // enum values (mr modes, flags) together, and a Rust enum holding an unlisted
        // value is undefined behaviour.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate_comments(false);
    for path in &lib.include_paths {
        builder = builder.clang_arg(format!("-I{}", path.display()));
    }
    let bindings = builder.generate().unwrap_or_else(|err| {
        panic!(
            "\n\nlibfabric-sys: bindgen could not parse <rdma/fabric.h>: {err}\n\
             bindgen needs libclang: `apt-get install libclang-dev clang`.\n\n"
        )
    });
    bindings.write_to_file(out.join("bindings.rs")).expect("write bindings.rs into OUT_DIR");

    // bindgen names the file static_fns.c and includes wrapper.h by absolute path.
    let mut cc = cc::Build::new();
    cc.file(static_fns.with_extension("c")).include(&manifest).warnings(false);
    for path in &lib.include_paths {
        cc.include(path);
    }
    cc.compile("libfabric_static_fns");
    // cc links the archive first; libfabric itself must come after it on the line.
    for l in &lib.libs {
        println!("cargo:rustc-link-lib={l}");
    }
}
