//! idgen: a distributed unique-ID service.
//!
//! Applications call idgen over gRPC (or a small JSON API) for 64-bit IDs
//! that are never handed out twice: not after a crash, not after a restart,
//! not when the machine's clock steps backwards. One node runs on an
//! embedded state file; several coordinate through Consul
//! (`docs/CLUSTER.md`; `consul/README.md`).
//!
//! # Layout
//!
//! The one map of the code is `docs/SOURCE-MAP.md`: every file under
//! `src/` with its one job (`tests/source_map.rs` checks that none is
//! missing), and the layer order its imports follow (the binary's
//! `src/main.rs` and `src/cli/` at the top, [`id`] at the bottom).
//!
//! `docs/SAFETY-RULES.md` explains why IDs never repeat, rule by rule;
//! `docs/GLOSSARY.md` gives each word its one meaning.

#![warn(missing_docs)]

pub mod cluster;
pub mod config;
pub mod consul;
pub mod error;
pub mod file_watch;
pub mod id;
pub mod metrics;
pub mod modes;
pub mod node;
pub mod server;
pub mod store;

pub use error::Error;

/// The `idgen.v1` protobuf messages and gRPC stubs (the `idgen-proto`
/// crate, generated from `proto/idgen/v1/idgen.proto`).
pub use idgen_proto as proto;
