//! idgen: a distributed unique-ID service.
//!
//! Applications call idgen over gRPC (or a small JSON API) for 64-bit IDs
//! that are never handed out twice: not after a crash, not after a restart,
//! not when the machine's clock steps backwards. One node runs on an
//! embedded state file; several coordinate through Consul (README,
//! "Cluster mode"; `consul/README.md`).
//!
//! # Layout
//!
//! Dependencies point one way: `main` -> [`server`] -> [`store`] -> [`id`].
//!
//! - [`id`]: the pure core. Bit layouts and their presets, the lock-free
//!   snowflake generator with its logical clock, step-back and high-water
//!   mark rules, and the [`id::Clock`] trait. No I/O, no tokio.
//! - [`store`]: durable state behind the [`store::StateStore`] trait (the
//!   embedded redb backend, Consul), [`store::HwmKeeper`], which starts a
//!   generator above the stored high-water mark and keeps the mark ahead,
//!   and [`store::cluster_layout`], the layout a Consul cluster records
//!   once and guards; [`store::state_file`] notices a state file deleted or
//!   replaced under the node, [`store::snapshot`] backs it up and restores
//!   it with a skip-ahead, [`store::reopen`] reopens it after a write error
//!   (disk full, EIO) and reports whether it can write.
//! - [`server`]: the running node: gRPC (`idgen.v1.IdGen`, health,
//!   reflection) and HTTP (`/metrics`, `/healthz`, `/readyz`, `/v1/...`)
//!   front ends, the one error-to-status mapping, the health monitor,
//!   the renewal thread that keeps marks and leases alive whatever the
//!   request load, and ordered shutdown.
//! - [`consul`]: a thin Consul HTTP client (KV, sessions, txn, agent,
//!   health) with timeouts, safe retries and typed errors, for cluster mode.
//! - [`config`]: TOML + environment + CLI configuration, validated into
//!   [`config::Config`].
//! - [`metrics`]: every exported metric, declared in one place.
//! - [`shutdown`]: SIGTERM/SIGINT handling (a second signal exits at once).
//! - [`notify`]: systemd readiness, stopping and watchdog notifications.
//! - [`bench`]: the `idgen bench` gRPC load generator and a bare baseline
//!   server to compare against.
//! - [`proto`]: the `idgen-proto` crate, code generated from
//!   `proto/idgen/v1/idgen.proto`, shared with clients.
//! - [`error`]: the crate-wide error enum.

#![warn(missing_docs)]

pub mod bench;
pub mod config;
pub mod consul;
pub mod error;
pub mod id;
pub mod metrics;
pub mod notify;
pub mod server;
pub mod shutdown;
pub mod store;

pub use error::Error;

/// The `idgen.v1` protobuf messages and gRPC stubs (the `idgen-proto`
/// crate, generated from `proto/idgen/v1/idgen.proto`).
pub use idgen_proto as proto;
