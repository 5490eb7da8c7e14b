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
//! Dependencies point one way: the binary (`src/main.rs`, `src/cli/`) ->
//! [`server`] -> [`modes`] and [`cluster`] -> [`store`] -> [`id`].
//!
//! - [`id`]: the pure core, no I/O, no tokio, time passed in. Bit layouts
//!   and presets, the lock-free snowflake generator with its clock rules,
//!   segment ranges, lease blocks, strict counters, the double buffer
//!   segment and lease mode serve from ([`id::buffer`]), decoding,
//!   formatted IDs ([`id::format`]: templates, presets, periods, and Lua
//!   rules with their sandbox and load-time checks), and the kind every
//!   error says it is ([`id::ErrorKind`]).
//! - [`store`]: durable state. [`store::HwmStore`] (high-water marks),
//!   [`store::SegmentStore`], [`store::lease::TokenStore`] and
//!   [`store::strict::StrictStore`] and [`store::format::FormatStore`]
//!   (formatted-mode counters), each on the embedded redb backend
//!   ([`store::embedded`]) and on Consul KV; [`store::HwmKeeper`], which
//!   starts a generator above the stored mark and keeps the mark ahead;
//!   the cluster's layout record ([`store::cluster_layout`]); and the
//!   embedded file's guard, backups and healing ([`store::state_file`],
//!   [`store::snapshot`], [`store::reopen`], with formatted counters'
//!   restore margins in [`store::format_restore`]); on Consul, what the node
//!   wrote per key ([`store::regression`]) and the cluster-wide
//!   skip-ahead after a snapshot restore ([`store::skip_ahead`]).
//! - [`modes`]: the engines that serve each mode from its store
//!   ([`modes::snowflake`], [`modes::segment`], [`modes::lease`],
//!   [`modes::strict`], [`modes::format`] for formatted IDs) and the
//!   [`modes::Issuer`] that checks a request
//!   and dispatches it to one; Lua rules run on [`modes::lua_pool`]'s
//!   threads, off the request runtime, under a deadline.
//! - [`cluster`]: membership. [`cluster::membership::Membership`] is the
//!   seam (static on the embedded store, claimed in Consul);
//!   [`cluster::worker_lock`] claims a worker id with a session lock,
//!   [`cluster::supervisor`] renews, fences and re-claims,
//!   [`cluster::registration`] registers the node with a gRPC health check.
//! - [`consul`]: a thin Consul HTTP client (KV, sessions, txn, agent,
//!   health) with timeouts, safe retries and typed errors.
//! - [`server`]: the front ends only. The running [`server::Node`] (start
//!   and ordered shutdown), gRPC (`idgen.v1.IdGen`, `idgen.v1.Admin`,
//!   health, reflection), HTTP (`/metrics`, `/healthz`, `/readyz`,
//!   `/v1/...`, the admin console at `/admin/`), the health monitor, the
//!   connection listener (with its per-peer limits), admin authentication
//!   and its per-peer throttle, and
//!   [`server::status`], where error kinds become gRPC codes and HTTP
//!   statuses.
//! - [`renewal`]: the thread that keeps marks and the worker lock alive
//!   whatever the request load.
//! - [`config`]: TOML + environment + CLI configuration, validated into
//!   typed settings per section.
//! - [`error`]: the crate-wide error; [`metrics`]: every exported metric
//!   and its label values; [`shutdown`]: SIGTERM/SIGINT handling;
//!   [`notify`]: systemd readiness, stopping and watchdog notices;
//!   [`reload`]: files read again when they change or on SIGHUP. (The
//!   `idgen bench` load generator is the `idgen-loadgen` crate,
//!   `loadgen/`, outside the library.)
//! - [`proto`]: the `idgen-proto` crate (`proto/`), generated from
//!   `proto/idgen/v1/idgen.proto` and shared with clients.
//!
//! `docs/ARCHITECTURE.md` explains why IDs never repeat, rule by rule.

#![warn(missing_docs)]

pub mod cluster;
pub mod config;
pub mod consul;
pub mod error;
pub mod id;
pub mod metrics;
pub mod modes;
pub mod notify;
pub mod reload;
pub mod renewal;
pub mod server;
pub mod shutdown;
pub mod store;

pub use error::Error;

/// The `idgen.v1` protobuf messages and gRPC stubs (the `idgen-proto`
/// crate, generated from `proto/idgen/v1/idgen.proto`).
pub use idgen_proto as proto;
