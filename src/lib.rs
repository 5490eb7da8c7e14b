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
//! ("Layer order"): the binary (`src/main.rs`, `src/cli/`) -> [`node`] ->
//! [`server`] -> [`config`] -> [`cluster`] -> [`modes`] -> [`error`] ->
//! [`store`] -> [`consul`] -> [`metrics`] -> [`file_watch`] -> [`id`].
//! Every file under `src/` is named below (`tests/source_map.rs` checks
//! it).
//!
//! - The binary: `src/main.rs` and `src/cli/` (`cli/mod.rs`, the flags in
//!   `cli/args.rs`; the commands `cli/serve.rs`, `cli/init.rs`,
//!   `cli/gen.rs`, `cli/decode.rs`, `cli/admin.rs`,
//!   `cli/admin_formats.rs`, `cli/admin_hide_keys.rs`, `cli/bench.rs`, `cli/check.rs`,
//!   `cli/state.rs`; `cli/client.rs` dials a node with `cli/tls.rs`'s
//!   files; `cli/output.rs` prints). The `idgen bench` load generator is
//!   the `idgen-loadgen` crate (`loadgen/`), outside the library.
//! - [`node`]: the running [`node::Node`]: assembly of the stores
//!   (`node/stores.rs`), the Issuer (`node/issuer.rs`), the cluster spec
//!   (`node/cluster.rs`) and what the worker lock's session holds
//!   (`node/session_bound.rs`); serving and ordered shutdown
//!   (`node/lifecycle.rs`); the status record it publishes
//!   (`node/status.rs`); the process pieces: [`node::renewal`] (the
//!   thread that keeps marks and the worker lock alive whatever the
//!   request load), [`node::shutdown`] (SIGTERM/SIGINT) and
//!   [`node::systemd`] (readiness, stopping and watchdog notices).
//! - [`server`]: the front ends only: gRPC ([`server::grpc`]:
//!   `idgen.v1.IdGen`, health, reflection), HTTP ([`server::http`]:
//!   `/metrics`, `/healthz`, `/readyz`, `/v1/...`, with CORS for browsers
//!   in [`server::cors`]; the state its handlers and the console's share
//!   in [`server::http_state`]), the admin console
//!   ([`server::console`], at `/admin/`, with its node view and changes in
//!   `server/console/changes.rs` and every node's status in
//!   `server/console/cluster.rs`), the health monitor
//!   ([`server::health`]), request bounds ([`server::request_size`]), TLS
//!   ([`server::tls`]), the connection listener ([`server::listener`],
//!   with its per-peer limits in `server/listener/table.rs`, its TLS
//!   handshakes in `server/listener/handshake.rs` and the deadline on
//!   request bodies in `server/listener/body.rs`), the admin
//!   service (`idgen.v1.Admin`, `server/admin/`, one file per concern:
//!   `server/admin/auth.rs` and its per-peer throttle
//!   `server/admin/auth_throttle.rs`, `server/admin/tags.rs`,
//!   `server/admin/strict.rs`, `server/admin/holders.rs`,
//!   `server/admin/layout.rs`, `server/admin/formats.rs`,
//!   `server/admin/hide_keys.rs` (hide keys),
//!   `server/admin/backup.rs`), and
//!   [`server::status`], where error kinds become gRPC codes and HTTP
//!   statuses.
//! - [`config`]: TOML + environment + CLI configuration (the file's
//!   sections in `config/file.rs`, CIDR lists in `config/allow.rs`, CORS
//!   origins in `config/cors.rs`, the
//!   `IDGEN_*` variables checked in `config/environment.rs`, the hide
//!   master key's source in `config/hide.rs`, `[layout]` and the hiding
//!   of snowflake IDs in `config/layout.rs`), validated
//!   into typed settings per section (`config/validate/mod.rs`, with the
//!   `[consul]` section in `config/validate/consul.rs`).
//! - [`cluster`]: membership. [`cluster::membership::Membership`] is the
//!   seam (static on the embedded store, claimed in Consul);
//!   [`cluster::worker_lock`] claims a worker id with a session lock,
//!   [`cluster::supervisor`] renews, fences the Issuer's gate and
//!   re-claims, [`cluster::registration`] registers the node with a gRPC
//!   health check, [`cluster::holders`] reads and releases the holders of
//!   worker ids and tokens for the admin API, [`cluster::status`] each
//!   node's status record in Consul KV (advisory, for the console);
//!   [`cluster::settings`] holds the validated `[consul]` section.
//! - [`modes`]: the engines that serve each mode from its store
//!   ([`modes::snowflake`], [`modes::segment`], [`modes::lease`],
//!   [`modes::strict`], [`modes::formatted`] for formatted IDs, with
//!   [`modes::format_catalog`] turning stored format definitions into the
//!   formats it serves) and the [`modes::Issuer`] that checks a request
//!   and dispatches it to one, checking [`modes::gate`]'s `IssueGate`
//!   (fenced, lock deadline) once for snowflake, lease and formatted;
//!   segment and lease refill through [`modes::refill`], snowflake
//!   callers that want more than a time unit holds queue for
//!   [`modes::fair_shares`], whose pump runs on [`modes::ticker`]'s
//!   thread; Lua rules run on [`modes::lua_pool`]'s threads, off the
//!   request runtime, under a deadline; [`modes::hide_keys`] keeps the
//!   hide key rings fresh and runs (and audits) their admin changes, and
//!   hidden namespaces show their IDs through [`modes::hidden`]'s hiders, kept current with them;
//!   a call naming a format or hide key this node does not know yet
//!   re-reads the store once a second at most ([`modes::miss`]).
//! - [`error`]: the request-path crate error.
//! - [`store`]: durable state, one folder per mode, each with its trait
//!   in `mod.rs`, the embedded redb impl in `embedded.rs` and the Consul
//!   KV impl in `consul.rs`: [`store::hwm`] ([`store::HwmStore`] in
//!   `store/hwm/embedded.rs` and `store/hwm/consul.rs`, and
//!   [`store::HwmKeeper`] in `store/hwm/keeper.rs`, which starts a
//!   generator above the stored mark and keeps the mark ahead);
//!   [`store::segment`] (`store/segment/embedded.rs`,
//!   `store/segment/consul.rs`); [`store::lease`] (lease-mode tokens,
//!   `store/lease/embedded.rs`, `store/lease/consul.rs`);
//!   [`store::strict`] (`store/strict/embedded.rs`,
//!   `store/strict/consul.rs`, and `store/strict/combine.rs`, which
//!   combines a node's concurrent Consul calls into shared txns); and [`store::format`] (formatted mode's
//!   [`store::format::counters`] with `store/format/counters/embedded.rs`
//!   and `store/format/counters/consul.rs`, the definitions
//!   [`store::format::catalog`] with `store/format/catalog/embedded.rs`
//!   and `store/format/catalog/consul.rs`, [`store::format::tokens`], and
//!   the restore margins [`store::format::restore`]); [`store::hide_keys`]
//!   (hide keys sealed with the master key, `store/hide_keys/embedded.rs`,
//!   `store/hide_keys/consul.rs`; the master key's fingerprint stored with
//!   them, `store/hide_keys/fingerprint.rs`). Backend plumbing:
//!   the state file's database handle ([`store::embedded`]), its guard,
//!   backups and healing ([`store::state_file`], [`store::snapshot`]:
//!   `store/snapshot/take.rs`, `store/snapshot/rates.rs`,
//!   `store/snapshot/mirror.rs`, `store/snapshot/restore.rs`;
//!   [`store::reopen`]; the test-only
//!   disk-full hook [`store::fault_hook`]); record counts against their
//!   limits (`store/counts.rs`); every Consul key path
//!   ([`store::kv_paths`]), the one Consul compare-and-set loop
//!   ([`store::cas`]), the cluster's layout record
//!   ([`store::cluster_layout`]), what the node wrote per key
//!   ([`store::regression`]), the highest Consul index it saw under the
//!   cluster's keys ([`store::cluster_index`]) and the cluster-wide skip-ahead after a
//!   snapshot restore ([`store::skip_ahead`]).
//! - [`consul`]: a thin Consul HTTP client (KV, sessions, txn, agent,
//!   health) with timeouts, safe retries and typed errors; the API's
//!   records in [`consul::types`], HTTPS to the agent in [`consul::tls`].
//! - [`metrics`]: every exported metric and its label values.
//! - [`file_watch`]: files read again when they change or on SIGHUP (the
//!   TLS loaders of server and consul use it).
//! - [`id`]: the pure core, no I/O, no tokio, time passed in. Bit layouts
//!   and presets ([`id::layout`]), the clock ([`id::clock`]), the
//!   lock-free snowflake generator with its clock rules
//!   ([`id::snowflake`]), the fencing deadline ([`id::deadline`]), segment
//!   ranges ([`id::segment`]), lease blocks ([`id::lease`]), strict
//!   counters ([`id::strict`]), the double buffer segment and lease mode
//!   serve from ([`id::buffer`]), modes ([`id::mode`]), decoding
//!   ([`id::decode`]), formatted IDs ([`id::format`]: definitions and
//!   their update rule (`id/format/def.rs`), compiled formats
//!   (`id/format/compile.rs`, `id/format/compiled.rs`), counter records
//!   (`id/format/counter.rs`), errors (`id/format/error.rs`), the
//!   template language ([`id::format::template`]:
//!   `id/format/template/syntax.rs`, the uniqueness checks in
//!   `id/format/template/rules.rs`, `id/format/template/render.rs`,
//!   `id/format/template/parse.rs`, `id/format/template/check_digit.rs`),
//!   presets (`id/format/preset.rs`), periods (`id/format/period.rs`),
//!   format tokens (`id/format/token.rs`), and Lua rules
//!   (`id/format/lua.rs`) with their sandbox (`id/format/lua_sandbox.rs`)
//!   and load-time checks (`id/format/lua/validate.rs`)), hiding volume
//!   ([`id::hide`]: keys and their subkeys in `id/hide/keys.rs`, FF1
//!   radix 10 in `id/hide/ff1.rs`, the keyed Feistel network in
//!   `id/hide/feistel.rs`, one value's chain of AES blocks with AES-NI
//!   inline in `id/hide/aes_chain.rs`, and the hiders in `id/hide/decimal.rs`,
//!   `id/hide/int.rs` and `id/hide/snowflake.rs`), and the kind
//!   every error says it is ([`id::ErrorKind`], `id/kind.rs`).
//! - [`proto`]: the `idgen-proto` crate (`proto/`), generated from
//!   `proto/idgen/v1/idgen.proto` and shared with clients.
//!
//! `docs/ARCHITECTURE.md` explains why IDs never repeat, rule by rule.

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
