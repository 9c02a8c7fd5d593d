//! Compiles the dpuio.v1 protobufs with protoc (Debian's `protobuf-compiler`) and keeps
//! the file descriptor set for gRPC reflection.

#[cfg(feature = "grpc")]
use std::path::PathBuf;

#[cfg(feature = "grpc")]
const PROTOS: &[&str] = &[
    "dpuio/v1/common.proto",
    "dpuio/v1/session.proto",
    "dpuio/v1/namespace.proto",
    "dpuio/v1/memory.proto",
    "dpuio/v1/admin.proto",
];

#[cfg(not(feature = "grpc"))]
fn main() {}

#[cfg(feature = "grpc")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() && which("protoc").is_none() {
        return Err("protoc not found: install it with `apt-get install -y protobuf-compiler` \
                    (or set PROTOC to its path)"
            .into());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("dpuio_v1_descriptor.bin"))
        .compile_protos(PROTOS, &["."])?;
    Ok(())
}

#[cfg(feature = "grpc")]
fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).map(|dir| dir.join(program)).find(|candidate| candidate.is_file())
    })
}
