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
//! Dependencies point down the layer order of `docs/ARCHITECTURE.md`
//! ("Layer order"): the binary (`src/main.rs`, `src/cli/`) -> node ->
//! [`server`] -> [`config`] -> [`cluster`] -> [`modes`] -> [`error`] ->
//! [`store`] -> [`consul`] -> [`metrics`] -> [`id`]. Every file under
//! `src/` is named below (`tests/source_map.rs` checks it).
//!
//! - The binary: `src/main.rs` and `src/cli/` (`cli/mod.rs`, the flags in
//!   `cli/args.rs`; the commands `cli/serve.rs`, `cli/init.rs`,
//!   `cli/gen.rs`, `cli/decode.rs`, `cli/admin.rs`,
//!   `cli/admin_formats.rs`, `cli/bench.rs`, `cli/check.rs`,
//!   `cli/state.rs`; `cli/client.rs` dials a node with `cli/tls.rs`'s
//!   files; `cli/output.rs` prints). The `idgen bench` load generator is
//!   the `idgen-loadgen` crate (`loadgen/`), outside the library.
//! - [`id`]: the pure core, no I/O, no tokio, time passed in. Bit layouts
//!   and presets, the lock-free snowflake generator with its clock rules,
//!   segment ranges, lease blocks, strict counters, the double buffer
//!   segment and lease mode serve from ([`id::buffer`]), decoding,
//!   formatted IDs ([`id::format`]: definitions and their update rule
//!   (`def.rs`), compiled formats (`compile.rs`, `compiled.rs`), counter
//!   records (`counter.rs`), errors (`error.rs`), the template language
//!   ([`id::format::template`]: `syntax.rs`, the uniqueness checks in
//!   `rules.rs`, `render.rs`, `parse.rs`, `check_digit.rs`), presets,
//!   periods, and Lua rules with their sandbox and load-time checks), and
//!   the kind every error says it is ([`id::ErrorKind`]).
//! - [`store`]: durable state, one folder per mode, each with its trait
//!   in `mod.rs`, the embedded redb impl in `embedded.rs` and the Consul
//!   KV impl in `consul.rs`: [`store::hwm`] ([`store::HwmStore`] and
//!   [`store::HwmKeeper`], which starts a generator above the stored mark
//!   and keeps the mark ahead), [`store::segment`], [`store::lease`]
//!   (lease-mode tokens), [`store::strict`], and [`store::format`]
//!   (formatted mode's [`store::format::counters`], the definitions
//!   [`store::format::catalog`], [`store::format::tokens`], and the
//!   restore margins [`store::format::restore`]). Backend plumbing: the
//!   state file's database handle ([`store::embedded`]), its guard,
//!   backups and healing ([`store::state_file`], [`store::snapshot`] (`take.rs`, `rates.rs`, `restore.rs`),
//!   [`store::reopen`]); every Consul key path ([`store::keys`]), the one
//!   Consul compare-and-set loop ([`store::cas`]), the cluster's layout
//!   record ([`store::cluster_layout`]), what the node wrote per key
//!   ([`store::regression`]) and the cluster-wide skip-ahead after a
//!   snapshot restore ([`store::skip_ahead`]).
//! - [`modes`]: the engines that serve each mode from its store
//!   ([`modes::snowflake`], [`modes::segment`], [`modes::lease`],
//!   [`modes::strict`], [`modes::formatted`] for formatted IDs, with
//!   [`modes::format_catalog`] turning stored format definitions into the
//!   formats it serves) and the [`modes::Issuer`] that checks a request
//!   and dispatches it to one, passing [`modes::gate`]'s `IssueGate`
//!   (fenced, lock deadline) for snowflake, lease and formatted; Lua rules
//!   run on [`modes::lua_pool`]'s threads, off the request runtime, under
//!   a deadline.
//! - [`cluster`]: membership. [`cluster::membership::Membership`] is the
//!   seam (static on the embedded store, claimed in Consul);
//!   [`cluster::worker_lock`] claims a worker id with a session lock,
//!   [`cluster::supervisor`] renews, fences and re-claims,
//!   [`cluster::registration`] registers the node with a gRPC health check,
//!   [`cluster::holders`] reads and releases the holders of worker ids and
//!   tokens for the admin API; [`cluster::settings`] holds the validated
//!   `[consul]` section.
//! - [`consul`]: a thin Consul HTTP client (KV, sessions, txn, agent,
//!   health) with timeouts, safe retries and typed errors.
//! - [`node`]: the running [`node::Node`]: assembly of the stores
//!   (`node/stores.rs`), the Issuer (`node/issuer.rs`), the cluster spec
//!   (`node/cluster.rs`) and what the worker lock's session holds
//!   (`node/session_bound.rs`); serving and ordered shutdown
//!   (`node/lifecycle.rs`); the process pieces: [`node::renewal`] (the
//!   thread that keeps marks and the worker lock alive whatever the
//!   request load), [`node::shutdown`] (SIGTERM/SIGINT) and
//!   [`node::systemd`] (readiness, stopping and watchdog notices).
//! - [`server`]: the front ends only: gRPC (`idgen.v1.IdGen`, `idgen.v1.Admin`,
//!   health, reflection), HTTP (`/metrics`, `/healthz`, `/readyz`,
//!   `/v1/...`, the admin console at `/admin/`), the health monitor, the
//!   connection listener (with its per-peer limits), the admin service
//!   (`server/admin/`, one file per concern: authentication and its
//!   per-peer throttle, tags, strict, holders, layout, formats, backup), and
//!   [`server::status`], where error kinds become gRPC codes and HTTP
//!   statuses.
//! - [`config`]: TOML + environment + CLI configuration, validated into
//!   typed settings per section.
//! - [`error`]: the crate-wide error; [`metrics`]: every exported metric
//!   and its label values;
//!   [`reload`]: files read again when they change or on SIGHUP;
//!   [`bench`](mod@bench): the `idgen bench` load generator.
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
pub mod node;
pub mod reload;
pub mod server;
pub mod store;

pub use error::Error;

/// The `idgen.v1` protobuf messages and gRPC stubs (the `idgen-proto`
/// crate, generated from `proto/idgen/v1/idgen.proto`).
pub use idgen_proto as proto;
