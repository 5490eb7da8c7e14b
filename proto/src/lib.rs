//! The `idgen.v1` protobuf messages and gRPC stubs.
//!
//! Generated at build time from `idgen/v1/idgen.proto` (in this crate) by a
//! pure-Rust protobuf compiler, so building needs no `protoc`. The idgen
//! server and the `idgen-client` crate both use this crate; applications in
//! other languages generate their stubs from the same `.proto` file.
//!
//! Features: `client` (the `*_client` modules) and `server` (the
//! `*_server` modules); both are on by default.

#![warn(missing_docs)]

pub mod codec;

#[allow(missing_docs, clippy::all, clippy::pedantic)]
mod generated {
    tonic::include_proto!("idgen.v1");
}

pub use generated::*;

/// gRPC metadata key a node sets on a refusal that another node may not
/// give (value: the reason, e.g. `layout-changed` from a node fenced by a
/// cluster layout change while others already run the new layout).
/// Clients treat such a refusal like UNAVAILABLE: try another node.
pub const RETRY_ELSEWHERE: &str = "idgen-retry-elsewhere";

/// The encoded descriptor set of `idgen.v1`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("idgen_descriptor");
