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
//!   and presets (`id/layout.rs`), the clock (`id/clock.rs`), the
//!   lock-free snowflake generator with its clock rules
//!   (`id/snowflake.rs`), the fencing deadline (`id/deadline.rs`),
//!   segment ranges (`id/segment.rs`), lease blocks (`id/lease.rs`),
//!   strict counters (`id/strict.rs`), the double buffer segment and
//!   lease mode serve from ([`id::buffer`]), modes (`id/mode.rs`),
//!   decoding (`id/decode.rs`), formatted IDs ([`id::format`]: templates
//!   `id/format/template.rs`, presets `id/format/preset.rs`, periods
//!   `id/format/period.rs`, format tokens `id/format/token.rs`, and Lua
//!   rules `id/format/lua.rs` with their sandbox
//!   `id/format/lua_sandbox.rs` and load-time checks
//!   `id/format/lua/validate.rs`), and the kind every error says it is
//!   ([`id::ErrorKind`], `id/kind.rs`).
//! - [`store`]: durable state. [`store::HwmStore`] (high-water marks),
//!   [`store::SegmentStore`] (`store/segment.rs`),
//!   [`store::lease::TokenStore`] and [`store::strict::StrictStore`] and
//!   [`store::format::FormatStore`] (formatted-mode counters; stored
//!   format definitions in `store/format_def.rs`, format tokens in
//!   `store/format_tokens.rs`), each on the embedded redb backend
//!   ([`store::embedded`]) and on Consul KV (`store/consul.rs`);
//!   [`store::HwmKeeper`] (`store/hwm.rs`), which starts a generator above
//!   the stored mark and keeps the mark ahead; record counts
//!   (`store/counts.rs`); the cluster's layout record
//!   ([`store::cluster_layout`]); and the embedded file's guard, backups
//!   and healing ([`store::state_file`], [`store::snapshot`],
//!   [`store::reopen`], with formatted counters' restore margins in
//!   [`store::format_restore`], and the test-only disk-full hook
//!   `store/fault_hook.rs`); on Consul, what the node wrote per key
//!   ([`store::regression`]) and the cluster-wide skip-ahead after a
//!   snapshot restore ([`store::skip_ahead`]).
//! - [`modes`]: the engines that serve each mode from its store
//!   ([`modes::snowflake`], [`modes::segment`], [`modes::lease`],
//!   [`modes::strict`], [`modes::format`] for formatted IDs, whose table
//!   [`modes::format_reload`] builds from stored definitions) and the
//!   [`modes::Issuer`] that checks a request and dispatches it to one;
//!   segment and lease refill through `modes/refill.rs`, snowflake
//!   callers wait on `modes/ticker.rs`; Lua rules run on
//!   [`modes::lua_pool`]'s threads, off the request runtime, under a
//!   deadline.
//! - [`cluster`]: membership. [`cluster::membership::Membership`] is the
//!   seam (static on the embedded store, claimed in Consul);
//!   [`cluster::worker_lock`] claims a worker id with a session lock,
//!   [`cluster::supervisor`] renews, fences and re-claims,
//!   [`cluster::registration`] registers the node with a gRPC health check.
//! - [`consul`]: a thin Consul HTTP client (KV, sessions, txn, agent,
//!   health) with timeouts, safe retries and typed errors; its wire types
//!   (`consul/types.rs`) and TLS (`consul/tls.rs`).
//! - [`server`]: the front ends. The running [`server::Node`] (start
//!   and ordered shutdown; the serve lifecycle in `server/serve.rs`),
//!   gRPC (`server/grpc.rs`: `idgen.v1.IdGen`, `idgen.v1.Admin`, health,
//!   reflection), HTTP (`server/http.rs`: `/metrics`, `/healthz`,
//!   `/readyz`, `/v1/...`, the admin console `server/console.rs` at
//!   `/admin/`), the admin API (`server/admin.rs`), the health monitor
//!   (`server/health.rs`), the connection listener (`server/listener.rs`,
//!   with its per-peer limits in `server/listener/table.rs`), the request
//!   size limit (`server/request_size.rs`), TLS (`server/tls.rs`), admin
//!   authentication's per-peer throttle (`server/admin/auth_throttle.rs`),
//!   and [`server::status`], where error kinds become gRPC codes and HTTP
//!   statuses.
//! - [`renewal`]: the thread that keeps marks and the worker lock alive
//!   whatever the request load.
//! - [`config`]: TOML + environment + CLI configuration (`config/file.rs`,
//!   CIDR lists in `config/allow.rs`), validated into typed settings per
//!   section (`config/validate/mod.rs`, the `[consul]` section in
//!   `config/validate/consul.rs`).
//! - [`error`]: the crate-wide error; [`metrics`]: every exported metric
//!   and its label values; [`shutdown`]: SIGTERM/SIGINT handling;
//!   [`notify`]: systemd readiness, stopping and watchdog notices;
//!   [`reload`]: files read again when they change or on SIGHUP.
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
