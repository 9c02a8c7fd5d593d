// A build script, so that cargo also applies the crate's [build-dependencies] feature union.
fn main() {}
