//! Compiles `proto/idgen/v1/idgen.proto` with a pure-Rust protobuf compiler
//! (protox), so a fresh machine needs no system `protoc`.

use std::{env, path::PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/idgen/v1/idgen.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    // The encoded descriptors serve gRPC reflection.
    std::fs::write(out.join("idgen_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        // Undecodable requests are the caller's fault: INVALID_ARGUMENT.
        .codec_path("crate::codec::ProtoCodec")
        .compile_fds(fds)?;
    Ok(())
}
