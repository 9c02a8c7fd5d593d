//! Finds UCX with pkg-config and generates bindings for the UCP API with bindgen.
//!
//! Nothing links UCX: the bindings are a table of the functions in [`FUNCTIONS`],
//! which `src/lib.rs` fills from `libucp.so.0` the first time a UCX transport is
//! opened (why: the crate docs).

use std::env;
use std::path::PathBuf;

/// Oldest UCX whose UCP API (the `_nbx` calls, `ucp_worker_set_am_recv_handler`) we use.
const MIN_UCX_VERSION: &str = "1.10";

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    // No link lines: the library is loaded at run time.
    let ucx = match pkg_config::Config::new().atleast_version(MIN_UCX_VERSION).cargo_metadata(false).probe("ucx") {
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
    // Tell dependents the version for diagnostics.
    println!("cargo:version={}", ucx.version);

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        // Only the functions the fabric crate calls, as one table loaded at run time: a
        // library without one of them fails to load with its name, rather than later.
        .allowlist_function(FUNCTIONS.join("|"))
        .dynamic_library_name("Ucx")
        .dynamic_link_require_all(true)
        .allowlist_type("ucp_.*|ucs_.*")
        // Constants only: the few global variables UCX exports would be table entries.
        .allowlist_var("UCP_.*|UCS_.*")
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

/// The UCX functions the `fabric` crate calls (a new call is added here too; the build
/// fails until it is). `libucp.so.0` resolves the `ucs_` ones through its own
/// dependency on `libucs.so.0`.
const FUNCTIONS: &[&str] = &[
    "ucp_am_send_nbx",
    "ucp_cleanup",
    "ucp_config_modify",
    "ucp_config_read",
    "ucp_config_release",
    "ucp_context_print_info",
    "ucp_ep_close_nbx",
    "ucp_ep_create",
    "ucp_ep_flush_nbx",
    "ucp_ep_print_info",
    "ucp_ep_rkey_unpack",
    "ucp_get_nbx",
    "ucp_get_version",
    "ucp_init_version",
    "ucp_mem_map",
    "ucp_mem_query",
    "ucp_mem_unmap",
    "ucp_put_nbx",
    "ucp_request_check_status",
    "ucp_request_free",
    "ucp_rkey_buffer_release",
    "ucp_rkey_destroy",
    "ucp_rkey_pack",
    "ucp_rkey_ptr",
    "ucp_worker_arm",
    "ucp_worker_create",
    "ucp_worker_destroy",
    "ucp_worker_get_address",
    "ucp_worker_get_efd",
    "ucp_worker_progress",
    "ucp_worker_query",
    "ucp_worker_release_address",
    "ucp_worker_set_am_recv_handler",
    "ucp_worker_signal",
    "ucs_status_string",
];
