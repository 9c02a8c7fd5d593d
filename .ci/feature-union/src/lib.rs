//! No code: this crate's dependency lists name the union of the features the workspace's
//! crates ask of each shared dependency (written by `cargo hakari generate`, configured in
//! `.config/hakari.toml`). Every member depends on it, so `cargo build -p X`, `cargo test`,
//! maturin and the aarch64 cross-build all compile a shared dependency once, with one feature
//! set, instead of once per set of selected packages. See docs/development.md.
