//! Finds UCX with pkg-config and generates bindings for the UCP API with bindgen.

use std::env;
use std::path::PathBuf;

/// Oldest UCX whose UCP API (the `_nbx` calls, `ucp_worker_set_am_recv_handler`) we use.
const MIN_UCX_VERSION: &str = "1.10";

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let ucx = match pkg_config::Config::new().atleast_version(MIN_UCX_VERSION).probe("ucx") {
        Ok(lib) => lib,
        Err(err) => {
            // Panicking in build.rs is how a build script reports a fatal error;
            // make the message say what to do, not only what failed.
            panic!(
                "\n\nucx-sys: UCX >= {MIN_UCX_VERSION} not found through pkg-config (`ucx.pc`).\n\
                 Install the development package, e.g. `apt-get install libucx-dev` \
                 (Debian/Ubuntu) or `dnf install ucx-devel`, or point PKG_CONFIG_PATH \
                 at the directory holding ucx.pc of a custom UCX build (the UCX of DOCA / \
                 MLNX_OFED on BlueField ships its own ucx.pc).\n\
                 pkg-config said: {err}\n\n"
            );
        }
    };
    // pkg-config for Debian's ucx.pc names only -lucp -luct -lucs -lucm; it has already
    // printed the cargo:rustc-link-* lines. Tell dependents the version for diagnostics.
    println!("cargo:version={}", ucx.version);

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .allowlist_function("ucp_.*|ucs_.*")
        .allowlist_type("ucp_.*|ucs_.*")
        .allowlist_var("ucp_.*|ucs_.*|UCP_.*|UCS_.*")
        // C enums become plain integer constants plus a type alias: UCX uses its enums as
        // bit flags and ORs them together, and a Rust enum with an unlisted value is UB.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        // Keep struct layouts exactly as C has them; no Debug/Default magic on unions.
        .derive_default(true)
        .derive_debug(false)
        .layout_tests(true)
        .generate_comments(false);
    for path in &ucx.include_paths {
        builder = builder.clang_arg(format!("-I{}", path.display()));
    }

    let bindings = builder.generate().unwrap_or_else(|err| {
        panic!(
            "\n\nucx-sys: bindgen could not parse <ucp/api/ucp.h>: {err}\n\
             bindgen needs libclang: `apt-get install libclang-dev clang`.\n\n"
        )
    });
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings.write_to_file(out.join("bindings.rs")).expect("write bindings.rs into OUT_DIR");
}
