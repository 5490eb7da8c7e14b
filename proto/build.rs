//! Compiles `idgen/v1/idgen.proto` with a pure-Rust protobuf compiler
//! (protox), so a fresh machine needs no system `protoc`.

use std::{env, path::PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "idgen/v1/idgen.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["."])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    // The encoded descriptors serve gRPC reflection.
    std::fs::write(out.join("idgen_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(env::var_os("CARGO_FEATURE_CLIENT").is_some())
        .build_server(env::var_os("CARGO_FEATURE_SERVER").is_some())
        // Undecodable messages are the sender's fault: INVALID_ARGUMENT.
        .codec_path("crate::codec::ProtoCodec")
        .compile_fds(fds)?;
    Ok(())
}
