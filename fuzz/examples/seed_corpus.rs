//! Writes the seed corpus, `corpus/<target>/seed-<name>`, from `dpuio_fuzz::seeds`:
//! small valid encodings made by the encoders themselves, so the seeds stay valid
//! when a format changes: after changing one, run `cargo run --example seed_corpus` in
//! fuzz/ (a plain build, no sanitizer) and commit the result.
//!
//! Only `seed-*` files are replaced; inputs the fuzzer found and kept stay.

fn main() -> std::io::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let seeds = dpuio_fuzz::seeds();
    for (target, _, _) in &seeds {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("seed-")) {
                std::fs::remove_file(path)?;
            }
        }
    }
    for (target, name, bytes) in &seeds {
        std::fs::write(root.join(target).join(format!("seed-{name}")), bytes)?;
    }
    println!("{} seeds in {}", seeds.len(), root.display());
    Ok(())
}
