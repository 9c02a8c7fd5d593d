//! Finds libfabric with pkg-config, generates bindings with bindgen, compiles the C
//! wrappers bindgen writes for the header's `static inline` functions, and records which
//! symbol version of each exported function those headers describe.
//!
//! Nothing links libfabric: `src/lib.rs` loads `libfabric.so.1` when a libfabric
//! transport is first opened (why: the crate docs).

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

    // No link lines: the library is loaded at run time.
    let lib =
        match pkg_config::Config::new().atleast_version(MIN_LIBFABRIC_VERSION).cargo_metadata(false).probe("libfabric")
        {
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
        // The exported functions are called through the table `src/lib.rs` loads; an
        // `extern` declaration of them would be a link-time dependency. fi_allocinfo is
        // the one inline that calls one of them (fi_dupinfo): lib.rs has it too.
        .blocklist_function(EXPORTED.join("|"))
        .blocklist_function("fi_allocinfo")
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

    let versions = exported_versions(&lib);
    let mut table = String::from(
        "/// The symbol version of each exported function that the headers' structs match.\n\
         pub(crate) const SYMBOL_VERSIONS: &[(&str, &str)] = &[\n",
    );
    for (name, version) in &versions {
        table.push_str(&format!("    (\"{name}\", \"{version}\"),\n"));
    }
    table.push_str("];\n");
    std::fs::write(out.join("symbol_versions.rs"), table).expect("write symbol_versions.rs into OUT_DIR");
}

/// The exported functions `src/lib.rs` loads.
const EXPORTED: &[&str] = &["fi_getinfo", "fi_freeinfo", "fi_dupinfo", "fi_fabric", "fi_strerror", "fi_version"];

/// The default symbol version (`name@@VERSION`) of each function in [`EXPORTED`], read
/// from the dynamic symbol table of the library pkg-config found: the version whose
/// `struct fi_info` the headers just parsed describe. A newer libfabric (1.18 made
/// FABRIC_1.7 the default of fi_getinfo, with another `fi_info`) keeps the older
/// versions as compatibility symbols, and asking for them by name at run time is what
/// the static linker would have recorded.
fn exported_versions(lib: &pkg_config::Library) -> Vec<(String, String)> {
    let found = lib
        .link_paths
        .iter()
        .chain([&PathBuf::from("/usr/lib")])
        .find_map(|dir| ["libfabric.so", "libfabric.so.1"].iter().map(|n| dir.join(n)).find(|p| p.exists()));
    let Some(path) = found else {
        panic!(
            "\n\nlibfabric-sys: libfabric.so not found in the link paths pkg-config gave ({:?})\n\n",
            lib.link_paths
        );
    };
    println!("cargo:rerun-if-changed={}", path.display());
    let readelf = env::var("READELF").unwrap_or_else(|_| "readelf".into());
    let out = std::process::Command::new(&readelf)
        .args(["--dyn-syms", "--wide"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("\n\nlibfabric-sys: cannot run {readelf} (binutils): {e}\n\n"));
    assert!(
        out.status.success(),
        "\n\nlibfabric-sys: {readelf} --dyn-syms {} failed: {}\n\n",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    EXPORTED
        .iter()
        .map(|name| {
            let default = text.split_whitespace().find_map(|w| w.strip_prefix(&format!("{name}@@")));
            let Some(version) = default else {
                panic!("\n\nlibfabric-sys: {} has no default version of {name}\n\n", path.display());
            };
            ((*name).to_owned(), version.to_owned())
        })
        .collect()
}
