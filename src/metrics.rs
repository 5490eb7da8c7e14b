//! Every metric idgen exports, declared in one place.
//!
//! Names carry the `idgen_` prefix, counters end in `_total`, durations are
//! histograms in `_seconds`. [`install`] sets up the Prometheus recorder
//! once per process and describes each metric; [`register`] creates every
//! series a node will report, at zero, when it starts, so an alert sees
//! `0` rather than no data; [`process::render`] adds the standard
//! `process_*` series to `/metrics`.

use std::sync::OnceLock;

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// IDs handed out, by `mode`.
pub const IDS_ISSUED: &str = "idgen_ids_issued_total";
/// Request latency, by `rpc` and `code`.
pub const REQUEST_DURATION: &str = "idgen_request_duration_seconds";
/// Clock step-back episodes, by `kind` (`tolerated` or `refused`).
pub const CLOCK_STEP_BACK_EVENTS: &str = "idgen_clock_step_back_events_total";
/// Size of each clock step-back episode.
pub const CLOCK_STEP_BACK_SIZE: &str = "idgen_clock_step_back_size_seconds";
/// How far the durable high-water mark is ahead of the wall clock.
pub const HWM_LEAD: &str = "idgen_hwm_lead_seconds";
/// Calls that had to wait for the next time unit's sequence.
pub const SEQUENCE_EXHAUSTED_WAITS: &str = "idgen_sequence_exhausted_waits_total";
/// Durable store write latency, by `backend` and `op`.
pub const STORE_WRITE_DURATION: &str = "idgen_store_write_duration_seconds";
/// Failed store operations, by `backend` and `op`.
pub const STORE_ERRORS: &str = "idgen_store_errors_total";
/// Seconds until the layout's time field runs out.
pub const LAYOUT_TIME_LEFT: &str = "idgen_layout_time_left_seconds";
/// Worker ids per datacenter the layout allows (2^worker_bits).
pub const LAYOUT_WORKER_IDS: &str = "idgen_layout_worker_ids";
/// 1 while this node issues IDs, 0 while it refuses.
pub const SERVING: &str = "idgen_serving";
/// Consul HTTP request latency, by `endpoint` and `code` (the HTTP status,
/// `unreachable`, `tls` for a failed handshake or a scheme the agent does
/// not serve, or `error`).
pub const CONSUL_REQUEST_DURATION: &str = "idgen_consul_request_duration_seconds";
/// Failed Consul requests (each attempt), by `endpoint`.
pub const CONSUL_ERRORS: &str = "idgen_consul_errors_total";
/// 1 while the node is fenced (lost its worker lock), else 0.
pub const FENCED: &str = "idgen_fenced";
/// Times the node lost its worker lock and fenced itself.
pub const FENCINGS: &str = "idgen_fencings_total";
/// Free worker ids passed over by an auto claim because their stored mark
/// was too far ahead of this node's clock.
pub const WORKER_IDS_SKIPPED: &str = "idgen_worker_ids_skipped_total";
/// 1 while the primary Consul datacenter answers the datacenter-id claim
/// check, 0 while this node runs on its datacenter's confirmed copy.
pub const DATACENTER_PRIMARY_REACHABLE: &str = "idgen_datacenter_primary_reachable";
/// Datacenter-id claim checks the primary did not answer.
pub const DATACENTER_PRIMARY_UNREACHABLE_CHECKS: &str =
    "idgen_datacenter_primary_unreachable_checks_total";
/// The worker id held, labelled by `datacenter`; -1 while fenced.
pub const WORKER_ID: &str = "idgen_worker_id";
/// Seconds since the Consul session was last renewed successfully.
pub const SESSION_RENEW_AGE: &str = "idgen_consul_session_renew_age_seconds";
/// The lease token whose blocks this node serves, by zone.
pub const LEASE_TOKEN: &str = "idgen_lease_token";
/// Requests per group commit of strict counters (embedded store).
pub const STRICT_COMMIT_BATCH: &str = "idgen_strict_commit_batch";
/// Strict calls answered by one Consul txn (node-local combining).
pub const STRICT_CONSUL_BATCH: &str = "idgen_strict_consul_batch";
/// Compare-and-set conflicts retried by strict calls (Consul).
pub const STRICT_CONFLICTS: &str = "idgen_strict_conflicts_total";
/// Admin calls, by method and status code.
pub const ADMIN_CALLS: &str = "idgen_admin_calls_total";
/// 1 once the embedded state file was deleted or replaced under the
/// running node (it stopped issuing for good), else 0.
pub const STATE_FILE_LOST: &str = "idgen_state_file_lost";
/// 1 while the embedded state file accepts writes, 0 from a write error
/// until a reopen succeeded.
pub const STORE_HEALTHY: &str = "idgen_store_healthy";
/// Reopens of the embedded state file after a write error, by `result`
/// (`ok`, `failed`).
pub const STORE_REOPENS: &str = "idgen_store_reopens_total";
/// Write errors that took the embedded state file out of service.
pub const STORE_WRITE_FAULTS: &str = "idgen_store_write_faults_total";
/// How long the node has been unable to issue because it is fenced or its
/// store cannot write or confirm high-water marks; 0 while it can.
pub const UNABLE_TO_ISSUE: &str = "idgen_unable_to_issue_seconds";
/// Live segment tags in the store, as last counted by this node.
pub const SEGMENT_TAGS: &str = "idgen_segment_tags";
/// Segment tags whose buffers this node holds in memory.
pub const SEGMENT_TAG_BUFFERS: &str = "idgen_segment_tag_buffers";
/// Tag buffers dropped from memory, by `reason` (`idle`, `deleted`).
pub const SEGMENT_BUFFERS_RELEASED: &str = "idgen_segment_buffers_released_total";
/// Segment tags in memory whose current and next ranges are both empty,
/// so calls on them wait for the store; read at each scrape.
pub const SEGMENT_TAGS_WITHOUT_RUNWAY: &str = "idgen_segment_tags_without_runway";
/// Lease IDs held in memory (current and next block), read at each scrape.
pub const LEASE_RUNWAY: &str = "idgen_lease_runway_ids";
/// Live strict keys in the store, as last counted by this node.
pub const STRICT_KEYS: &str = "idgen_strict_keys";
/// Strict namespaces with live keys, as last counted by this node.
pub const STRICT_NAMESPACES: &str = "idgen_strict_namespaces";
/// Creations refused by a configured limit, by `limit` (its config key).
pub const LIMIT_REFUSALS: &str = "idgen_limit_refusals_total";
/// Failed accepts on a listening port, by `port`.
pub const ACCEPT_ERRORS: &str = "idgen_accept_errors_total";
/// Connections closed at once because the port was at its limit, by `port`.
pub const CONNECTIONS_REFUSED: &str = "idgen_connections_refused_total";
/// TLS handshakes that failed or timed out, by `port`.
pub const TLS_HANDSHAKE_FAILURES: &str = "idgen_tls_handshake_failures_total";
/// Calls refused because the peer is not in an allow-list, by `port` and
/// `list` (`server` or `admin`).
pub const PEER_REFUSALS: &str = "idgen_peer_refusals_total";
/// Certificate reloads, by `result` (`ok` or `error`).
pub const TLS_RELOADS: &str = "idgen_tls_reloads_total";
/// The serving certificate's not-after time (Unix seconds), by `listener`
/// (`grpc`, `http`); set at start and on every successful reload.
pub const TLS_CERT_NOT_AFTER: &str = "idgen_tls_cert_not_after_seconds";
/// Reloads of the Consul client's TLS files (`consul.ca_file`,
/// `cert_file`, `key_file`), by `result` (`ok` or `error`).
pub const CONSUL_TLS_RELOADS: &str = "idgen_consul_tls_reloads_total";
/// Reloads of the formatted-mode format table, by `trigger` and `result`.
pub const FORMAT_RELOADS: &str = "idgen_format_reloads_total";
/// Formats the node serves (the table last installed).
pub const FORMATS_SERVED: &str = "idgen_formats_served";
/// Lua rule calls stopped at their deadline in Lua code, by `format`.
pub const LUA_DEADLINE_EXCEEDED: &str = "idgen_lua_deadline_exceeded_total";
/// Lua rule calls stuck past their deadline in a library function, whose
/// thread was set aside, by `format`.
pub const LUA_STUCK_CALLS: &str = "idgen_lua_stuck_calls_total";
/// Lua rules whose load-time checks ran (a stored rule that passed them
/// is not checked again).
pub const LUA_CHECKS: &str = "idgen_lua_checks_total";
/// Lua worker threads set aside and still running a stuck call.
pub const LUA_WORKERS_ASIDE: &str = "idgen_lua_workers_aside";
/// Formatted-mode counters held in memory, by `format`.
pub const FORMAT_COUNTERS_IN_MEMORY: &str = "idgen_format_counters_in_memory";
/// Open client connections, by `port`.
pub const CONNECTIONS_OPEN: &str = "idgen_connections_open";
/// Connections the node closed on a deadline, by `port` and `reason`.
pub const CONNECTIONS_TIMED_OUT: &str = "idgen_connections_timed_out_total";
/// Connections closed to make room for a new one, by `port` and `limit`
/// (`peer` or `port`).
pub const CONNECTIONS_EVICTED: &str = "idgen_connections_evicted_total";
/// Calls answered early because their request did not arrive in full
/// within `server.request_body_timeout` of their headers, by `port`.
pub const REQUESTS_STALLED: &str = "idgen_requests_stalled_total";
/// Failed admin authentications (wrong or missing token or certificate),
/// by `port`.
pub const ADMIN_AUTH_FAILURES: &str = "idgen_admin_auth_failures_total";
/// Admin calls refused unchecked because their peer failed to
/// authenticate too often, by `port`.
pub const ADMIN_AUTH_THROTTLED: &str = "idgen_admin_auth_throttled_total";
/// Constant 1, labelled with the version and the layout.
pub const BUILD_INFO: &str = "idgen_build_info";
/// Consul reads of a counter below what this node wrote, by `kind`.
pub const STORE_REGRESSIONS: &str = "idgen_store_regressions_total";
/// The `kind` label values of [`STORE_REGRESSIONS`]: the Consul counters
/// the store checks against what this node wrote.
pub const STORE_REGRESSION_KINDS: [&str; 6] =
    ["segment", "strict", "lease", "format", "hwm", "index"];

/// Bucket bounds of every `_seconds` histogram. A unary call answered from
/// memory takes 5 to 50 us, so the low end is fine-grained: with a first
/// bucket of 50 us nearly every call fell in it and the quantiles said
/// nothing.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Bucket bounds of [`STRICT_COMMIT_BATCH`] (calls per group commit, at
/// most 4096 per batch): a histogram, so batches aggregate across nodes.
pub const COMMIT_BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];

// Hiding volume: hide keys (issue 23). Never material, only counts.
/// Counter: hide key rotations made through this node, by key id.
pub const HIDE_KEY_ROTATIONS: &str = "idgen_hide_key_rotations_total";
/// Gauge: hide key ids by state (`active`: one version issues; `retired`:
/// decode-only).
pub const HIDE_KEYS: &str = "idgen_hide_keys";
/// Counter: hidden IDs revealed to admin callers, by `mode` (`snowflake`, `uuid`,
/// `lease`, `formatted`); each is also audit-logged.
pub const HIDDEN_REVEALS: &str = "idgen_hidden_reveals_total";

static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once) and returns a handle
/// that renders the text exposition format.
pub fn install() -> Result<PrometheusHandle, String> {
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .map_err(|e| e.to_string())?
                .set_buckets_for_metric(
                    Matcher::Full(STRICT_COMMIT_BATCH.into()),
                    COMMIT_BATCH_BUCKETS,
                )
                .map_err(|e| e.to_string())?
                .set_buckets_for_metric(
                    Matcher::Full(STRICT_CONSUL_BATCH.into()),
                    COMMIT_BATCH_BUCKETS,
                )
                .map_err(|e| e.to_string())?
                .install_recorder()
                .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
            describe();
            Ok(handle)
        })
        .clone()
}

fn describe() {
    describe_state();
    describe_serving();
    describe_cluster();
    describe_reloads();
    describe_lua();
    describe_hostile_peers();
    describe_hide_keys();
}

/// Hide keys (issue 23): counts only, never material.
fn describe_hide_keys() {
    describe_counter!(
        HIDE_KEY_ROTATIONS,
        "Hide key rotations made through this node's admin API, by hide key id."
    );
    describe_gauge!(
        HIDE_KEYS,
        "Hide key ids this node loaded, by state: active (one version issues new IDs) or retired (decode-only)."
    );
    describe_counter!(
        HIDDEN_REVEALS,
        "Hidden IDs (and hidden format counters) whose internal value this node revealed to an admin caller (DecodeId, DecodeUuid, ParseFormatted, GetFormatCounter, their HTTP routes and the console), by mode; each one is audit-logged."
    );
}

/// The threads Lua rules run on (`modes::lua_pool`).
fn describe_lua() {
    describe_counter!(
        LUA_DEADLINE_EXCEEDED,
        "Lua rule calls stopped at formatted.lua_deadline while running Lua code, by format; each answered FAILED_PRECONDITION."
    );
    describe_counter!(
        LUA_STUCK_CALLS,
        "Lua rule calls still running at twice formatted.lua_deadline inside a library function, by format; each answered FAILED_PRECONDITION and cost a thread until it returns (a rule is quarantined after 3)."
    );
    describe_counter!(
        LUA_CHECKS,
        "Lua rules whose load-time checks ran, each within formatted.lua_check_budget: at a create, and at a load of a stored rule without a matching record of passing them (a restart with rules already checked adds none)."
    );
    describe_gauge!(
        LUA_WORKERS_ASIDE,
        "Lua worker threads set aside because their call is stuck; each was replaced while at most formatted.lua_workers are aside."
    );
}

/// What the node does about peers that flood or guess.
fn describe_hostile_peers() {
    describe_counter!(
        CONNECTIONS_EVICTED,
        "Connections closed to let a new one in, by port and limit: peer (the peer had server.max_connections_per_peer open) or port (the port had its maximum open); only connections waiting for request headers, the HTTP/2 preface or the bodies of all their open calls are closed."
    );
    describe_counter!(
        REQUESTS_STALLED,
        "Calls answered before their handler ran because their request body did not arrive in full within server.request_body_timeout of their headers (DEADLINE_EXCEEDED on gRPC, 408 on HTTP), by port; their connections are closed first to make room from then on."
    );
    describe_counter!(
        ADMIN_AUTH_FAILURES,
        "Admin calls whose admin token or client certificate was missing or wrong, by port."
    );
    describe_counter!(
        ADMIN_AUTH_THROTTLED,
        "Admin calls refused without checking their credentials because their peer had failed to authenticate too often, by port."
    );
}

/// Reloads of files and tables while the node runs.
fn describe_reloads() {
    describe_counter!(
        TLS_RELOADS,
        "TLS certificate reloads (files changed, or SIGHUP), by result: ok, or error (the previous certificate stays in use)."
    );
    describe_gauge!(
        TLS_CERT_NOT_AFTER,
        "When the certificate the node serves stops being valid (its not-after, Unix seconds), by listener (grpc, http); set at start and on each successful TLS reload. Alert well before it: a node with an expired certificate fails every handshake."
    );
    describe_counter!(
        CONSUL_TLS_RELOADS,
        "Reloads of the Consul client's TLS files (files changed, or SIGHUP), by result: ok, or error (the previous files stay in use). Only with an https:// Consul address."
    );
    describe_counter!(
        FORMAT_RELOADS,
        "Reloads of the formatted-mode format table, by trigger (start, admin, sighup, watch) and result: ok, or error (the previous table stays in use)."
    );
}

/// The first part of [`describe`], in declaration order.
fn describe_state() {
    describe_gauge!(
        STORE_HEALTHY,
        "1 while the embedded state file accepts writes; 0 from a write error (disk full, I/O error) until the node has reopened the file and a probe write succeeded."
    );
    describe_counter!(
        STORE_REOPENS,
        "Attempts to reopen the embedded state file after a write error, by result (ok or failed)."
    );
    describe_counter!(
        STORE_REGRESSIONS,
        "Consul reads that found a counter or high-water mark below what this node wrote itself (Consul state rolled back, as by a snapshot restore), by kind (segment, strict, lease, format, hwm; index: the cluster's Consul index below the highest this node saw); the node refuses that counter until `idgen admin skip-ahead` moves it above."
    );
    describe_counter!(
        STORE_WRITE_FAULTS,
        "Write errors that took the embedded state file out of service until it was reopened."
    );
    describe_gauge!(
        UNABLE_TO_ISSUE,
        Unit::Seconds,
        "How long the node has been unable to issue because it is fenced or its store cannot write or confirm high-water marks; 0 while it can. Past store.max_unhealthy /healthz fails."
    );
    describe_gauge!(
        STATE_FILE_LOST,
        "1 once the embedded state file was deleted or replaced under the running node, which then stopped issuing in every mode until it is restarted on a restored file; else 0."
    );
    describe_counter!(IDS_ISSUED, "IDs handed out to callers, by mode.");
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Time to answer a request, by rpc and status code."
    );
    describe_counter!(
        CLOCK_STEP_BACK_EVENTS,
        "Episodes of the wall clock stepping back, by kind: tolerated (kept issuing) or refused (stopped issuing)."
    );
    describe_histogram!(
        CLOCK_STEP_BACK_SIZE,
        Unit::Seconds,
        "How far the wall clock stepped back in each episode."
    );
    describe_gauge!(
        HWM_LEAD,
        Unit::Seconds,
        "How far the durably stored high-water mark is ahead of the wall clock; at zero the node stops issuing."
    );
    describe_counter!(
        SEQUENCE_EXHAUSTED_WAITS,
        "Calls that queued for a later time unit because the sequence was used up or other calls already waited for it."
    );
    describe_histogram!(
        STORE_WRITE_DURATION,
        Unit::Seconds,
        "Time for a durable write to the state store, by backend and operation."
    );
}

/// The second part of [`describe`].
fn describe_serving() {
    describe_counter!(
        STORE_ERRORS,
        "Failed state store operations, by backend and operation."
    );
    describe_gauge!(
        LAYOUT_TIME_LEFT,
        Unit::Seconds,
        "Time until the layout's time bits run out at the configured epoch; negative once they have."
    );
    describe_gauge!(
        LAYOUT_WORKER_IDS,
        "Worker ids per datacenter the layout allows (2 to the power of its worker bits); alerts compare the ids in use with it."
    );
    describe_gauge!(
        SERVING,
        "1 while this node issues IDs, 0 while it refuses them."
    );
    describe_histogram!(
        CONSUL_REQUEST_DURATION,
        Unit::Seconds,
        "Time for one Consul HTTP request, by endpoint and status code."
    );
    describe_counter!(
        CONSUL_ERRORS,
        "Failed Consul HTTP requests (each attempt), by endpoint."
    );
    describe_counter!(
        STATUS_WRITES,
        "Writes of this node's status record to Consul KV (what every node's console shows), by result: ok or error."
    );
    describe_gauge!(
        FENCED,
        "1 while the node is fenced: its worker lock ran out, so it issues nothing until it claims an id again."
    );
    describe_counter!(
        FENCINGS,
        "Times the node lost its worker lock and stopped issuing."
    );
    describe_counter!(
        WORKER_IDS_SKIPPED,
        "Free worker ids an auto claim passed over because their stored high-water mark was more than clock.max_startup_skew ahead of this node's clock."
    );
    describe_gauge!(
        DATACENTER_PRIMARY_REACHABLE,
        "1 while the primary Consul datacenter (consul.primary_datacenter) answers this node's datacenter-id claim check; 0 while it cannot be reached and the node issues on the claim its datacenter's KV holds as last confirmed (rule 42). Set at start on Consul."
    );
    describe_counter!(
        DATACENTER_PRIMARY_UNREACHABLE_CHECKS,
        "Datacenter-id claim checks (at start and at every mark renewal) that the primary Consul datacenter did not answer."
    );
    describe_gauge!(
        WORKER_ID,
        "The worker id this node holds, by datacenter; -1 while fenced."
    );
    describe_gauge!(
        SESSION_RENEW_AGE,
        Unit::Seconds,
        "Time since the Consul session holding the worker id was last renewed."
    );
    describe_gauge!(
        LEASE_TOKEN,
        "The lease token whose sequence blocks this node serves, by zone."
    );
}

/// The last part of [`describe`].
fn describe_cluster() {
    describe_histogram!(
        STRICT_COMMIT_BATCH,
        "Strict calls made durable by one group commit of the embedded store."
    );
    describe_histogram!(
        STRICT_CONSUL_BATCH,
        "Strict calls answered by one Consul transaction of this node (calls on one strict key share a compare-and-set, several strict keys share the transaction)."
    );
    describe_counter!(
        STRICT_CONFLICTS,
        "Strict calls' compare-and-set conflicts in Consul, retried with backoff."
    );
    describe_gauge!(
        SEGMENT_TAGS,
        "Live segment tags in the store, as counted by this node when it last created or deleted one (Consul: when it last created one)."
    );
    describe_gauge!(
        SEGMENT_TAG_BUFFERS,
        "Segment tags whose ID buffers this node holds in memory."
    );
    describe_counter!(
        SEGMENT_BUFFERS_RELEASED,
        "Segment tag buffers dropped from memory, by reason: idle or deleted."
    );
    describe_gauge!(
        SEGMENT_TAGS_WITHOUT_RUNWAY,
        "Segment tags in memory whose current and next ranges are both empty: calls on them wait for the store (read at each scrape)."
    );
    describe_gauge!(
        LEASE_RUNWAY,
        "Lease IDs held in memory, current and next block (read at each scrape); 0 means lease calls wait for the store."
    );
    describe_gauge!(
        STRICT_KEYS,
        "Live strict keys in the store, as counted by this node (embedded: at every creation or deletion; Consul: when a key starts a new namespace)."
    );
    describe_gauge!(
        STRICT_NAMESPACES,
        "Strict namespaces holding live strict keys, as counted by this node (embedded: at every creation or deletion; Consul: when a strict key starts a new namespace)."
    );
    describe_counter!(
        LIMIT_REFUSALS,
        "Creations of a tag, strict key or strict namespace refused by a configured limit, by limit (its config key)."
    );
    describe_counter!(ADMIN_CALLS, "Admin API calls, by method and status code.");
    describe_counter!(
        ACCEPT_ERRORS,
        "Failed accepts on a listening port (out of descriptors or memory), by port; the node backs off from 10 ms to 1 s between tries."
    );
    describe_counter!(
        CONNECTIONS_REFUSED,
        "New connections closed at once because the port had its maximum open, by port."
    );
    describe_counter!(
        TLS_HANDSHAKE_FAILURES,
        "TLS handshakes that failed (plaintext client, untrusted or wrong certificate, protocol error) or did not finish within server.header_timeout, by port."
    );
    describe_counter!(
        PEER_REFUSALS,
        "Calls refused because the peer address is not in server.allow or admin.allow, by port and list."
    );
    describe_gauge!(
        FORMATS_SERVED,
        "Formats this node serves: the table last installed by a reload."
    );
    describe_gauge!(
        FORMAT_COUNTERS_IN_MEMORY,
        "Formatted-mode counters (format, scope value, node or format token) this node holds in memory, by format; idle ones leave after ten minutes."
    );
    describe_gauge!(CONNECTIONS_OPEN, "Client connections open, by port.");
    describe_counter!(
        CONNECTIONS_TIMED_OUT,
        "Connections the node closed on a deadline, by port and reason: preface (no HTTP/2 preface in time), header (HTTP request headers not complete in time, or no next request on a kept-alive connection), idle (no gRPC call in progress for too long)."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; labelled with the idgen version and the ID layout."
    );
}

/// Label values used at more than one call site, so they cannot drift.
/// The `mode` label of [`IDS_ISSUED`] is [`crate::id::Mode::as_str`], or
/// `formatted` for formatted mode.
pub mod label {
    /// `backend` of the store metrics for segment records (the embedded
    /// and Consul backends of high-water marks name themselves).
    pub const BACKEND_SEGMENT: &str = "segment";
    /// `backend` of the store metrics for lease-token counters.
    pub const BACKEND_LEASE: &str = "lease";
    /// `backend` of the store metrics for formatted-mode counters.
    pub const BACKEND_FORMAT: &str = "formatted";
    /// `op`: a formatted-mode counter block reserved (one durable write:
    /// at least one per counter and period in use).
    pub const OP_RESERVE_COUNTER: &str = "reserve_counter";
    /// `op`: a high-water mark write.
    pub const OP_STORE_HWM: &str = "store_hwm";
    /// `op`: a segment range taken.
    pub const OP_TAKE_RANGE: &str = "take_range";
    /// `op`: a lease block reserved.
    pub const OP_RESERVE_BLOCK: &str = "reserve_block";
    /// `kind` of [`super::CLOCK_STEP_BACK_EVENTS`]: absorbed by the logical clock.
    pub const STEP_BACK_TOLERATED: &str = "tolerated";
    /// `kind` of [`super::CLOCK_STEP_BACK_EVENTS`]: past `clock.max_backward`.
    pub const STEP_BACK_REFUSED: &str = "refused";
    /// `reason` of [`super::SEGMENT_BUFFERS_RELEASED`] and
    /// [`super::CONNECTIONS_TIMED_OUT`]: unused for too long.
    pub const REASON_IDLE: &str = "idle";
    /// `reason` of [`super::CONNECTIONS_TIMED_OUT`]: no HTTP/2 preface in time.
    pub const REASON_PREFACE: &str = "preface";
    /// `result` of [`super::STORE_REOPENS`].
    pub const RESULT_OK: &str = "ok";
    /// `result` of [`super::STORE_REOPENS`].
    pub const RESULT_FAILED: &str = "failed";
}

/// The duration histogram and error counter of one store operation,
/// built once by the component that makes it.
#[derive(Clone)]
pub struct StoreOp {
    duration: metrics::Histogram,
    errors: metrics::Counter,
}

impl StoreOp {
    /// The handles of `op` on `backend` (see [`label`]).
    pub fn new(backend: &'static str, op: &'static str) -> Self {
        Self {
            duration: metrics::histogram!(STORE_WRITE_DURATION, "backend" => backend, "op" => op),
            errors: metrics::counter!(STORE_ERRORS, "backend" => backend, "op" => op),
        }
    }

    /// Records one call that started at `started`; counts it as an error
    /// unless `ok`.
    pub fn record(&self, started: std::time::Instant, ok: bool) {
        self.took(started);
        if !ok {
            self.failed();
        }
    }

    /// Records the duration of one call that started at `started`.
    pub fn took(&self, started: std::time::Instant) {
        self.duration.record(started.elapsed().as_secs_f64());
    }

    /// Counts one failed call.
    pub fn failed(&self) {
        self.errors.increment(1);
    }

    /// Exports the error counter at zero before the first error.
    pub fn zero(&self) {
        self.errors.increment(0);
    }
}

/// What a node runs: which series [`register`] creates.
#[derive(Debug, Clone, Copy)]
pub struct Series {
    /// `embedded` or `consul`: the `backend` label of the HWM store series.
    pub backend: &'static str,
    /// Segment mode is enabled.
    pub segment: bool,
    /// Lease mode is enabled.
    pub lease: bool,
    /// Strict mode is enabled.
    pub strict: bool,
    /// Formatted mode serves at least one format.
    pub formatted: bool,
}

/// Every Consul endpoint the client calls (the `endpoint` label).
pub const CONSUL_ENDPOINTS: &[&str] = &[
    "agent/check/update",
    "agent/service/deregister",
    "agent/service/register",
    "health/service",
    "kv/delete",
    "kv/get",
    "kv/keys",
    "kv/list",
    "kv/put",
    "session/create",
    "session/destroy",
    "session/info",
    "session/renew",
    "txn",
];

/// Every admin rpc (the `method` label of [`ADMIN_CALLS`]).
pub const ADMIN_METHODS: &[&str] = &[
    "GetLayout",
    "SetLayout",
    "Backup",
    "CreateTag",
    "UpdateTag",
    "GetTag",
    "ListTags",
    "DeleteTag",
    "ListHolders",
    "ForceRelease",
    "SetStrictStep",
    "GetStrictStep",
    "ListStrictNamespaces",
    "ListStrictKeys",
    "DeleteStrictKey",
    "RenewSession",
    "CreateFormat",
    "UpdateFormat",
    "GetFormat",
    "ListFormats",
    "DeleteFormat",
    "ReloadFormats",
    "SkipAhead",
    "CreateHideKey",
    "RotateHideKey",
    "RetireHideKey",
    "ListHideKeys",
    "ListDatacenters",
    "ReleaseDatacenter",
];

/// The `method` label of the admin console's list of formats
/// (`/admin/api/formats`, an admin call that is not an rpc).
pub const CONSOLE_FORMATS_METHOD: &str = "ConsoleFormats";

/// The `method` label of the admin console's view of the node it runs on
/// (`/admin/api/node`: readiness, fencing, version, layout, IDs issued).
pub const CONSOLE_NODE_METHOD: &str = "ConsoleNode";

// ---- Every node's status in the console ------------------------------------

/// The `method` label of the admin console's view of every node
/// (`/admin/api/cluster`: the status records in Consul KV).
pub const CONSOLE_CLUSTER_METHOD: &str = "ConsoleCluster";
/// Writes of this node's status record to Consul KV, by `result`
/// (registered at zero by the task that writes them, on Consul only).
pub const STATUS_WRITES: &str = "idgen_status_record_writes_total";

/// The series of a node on Consul, at zero (see [`register`]).
fn register_consul() {
    use metrics::counter;
    for kind in STORE_REGRESSION_KINDS {
        counter!(STORE_REGRESSIONS, "kind" => kind).increment(0);
    }
    counter!(FENCINGS).increment(0);
    counter!(WORKER_IDS_SKIPPED).increment(0);
    counter!(DATACENTER_PRIMARY_UNREACHABLE_CHECKS).increment(0);
    for endpoint in CONSUL_ENDPOINTS {
        counter!(CONSUL_ERRORS, "endpoint" => *endpoint).increment(0);
    }
}

/// Creates, at zero, every counter, gauge and histogram series whose label
/// values are known at start-up, so rules such as
/// `increase(idgen_store_errors_total[5m]) > 0` or `idgen_fenced == 1`
/// evaluate to a value from the first scrape instead of to "no data".
/// Gauges that the node sets from its state at start (serving, fenced,
/// worker id, HWM lead, store health) are left to the code that knows the
/// value; registering them here would show a wrong 0 for a moment.
pub fn register(s: Series) {
    use metrics::{counter, gauge, histogram};
    let consul = s.backend == "consul";
    for mode in ["snowflake", "segment", "lease", "strict", "formatted"] {
        let enabled = match mode {
            "segment" => s.segment,
            "lease" => s.lease,
            "strict" => s.strict,
            "formatted" => s.formatted,
            _ => true,
        };
        if enabled {
            counter!(IDS_ISSUED, "mode" => mode).increment(0);
        }
    }
    for trigger in ["start", "admin", "sighup", "watch"] {
        for result in ["ok", "error"] {
            counter!(FORMAT_RELOADS, "trigger" => trigger, "result" => result).increment(0);
        }
    }
    if s.formatted {
        gauge!(LUA_WORKERS_ASIDE).set(0.0);
        counter!(LUA_CHECKS).increment(0);
    }
    for kind in ["tolerated", "refused"] {
        counter!(CLOCK_STEP_BACK_EVENTS, "kind" => kind).increment(0);
    }
    let _ = histogram!(CLOCK_STEP_BACK_SIZE);
    counter!(SEQUENCE_EXHAUSTED_WAITS).increment(0);
    gauge!(UNABLE_TO_ISSUE).set(0.0);
    for method in ADMIN_METHODS {
        counter!(ADMIN_CALLS, "method" => *method, "code" => "OK").increment(0);
    }
    counter!(ADMIN_CALLS, "method" => CONSOLE_FORMATS_METHOD, "code" => "OK").increment(0);
    counter!(ADMIN_CALLS, "method" => CONSOLE_NODE_METHOD, "code" => "OK").increment(0);
    counter!(ADMIN_CALLS, "method" => CONSOLE_CLUSTER_METHOD, "code" => "OK").increment(0);
    let mut store_ops = vec![(s.backend, "store_hwm")];
    if s.segment {
        store_ops.push(("segment", "take_range"));
        gauge!(SEGMENT_TAGS).increment(0.0);
        gauge!(SEGMENT_TAG_BUFFERS).increment(0.0);
        for reason in ["idle", "deleted"] {
            counter!(SEGMENT_BUFFERS_RELEASED, "reason" => reason).increment(0);
        }
        counter!(LIMIT_REFUSALS, "limit" => "segment.max_tags").increment(0);
        gauge!(SEGMENT_TAGS_WITHOUT_RUNWAY).set(0.0);
    }
    if s.lease {
        store_ops.push(("lease", "reserve_block"));
    }
    if s.strict {
        gauge!(STRICT_KEYS).increment(0.0);
        gauge!(STRICT_NAMESPACES).increment(0.0);
        for limit in ["strict.max_keys_per_namespace", "strict.max_namespaces"] {
            counter!(LIMIT_REFUSALS, "limit" => limit).increment(0);
        }
        if consul {
            counter!(STRICT_CONFLICTS).increment(0);
        } else {
            let _ = histogram!(STRICT_COMMIT_BATCH);
        }
    }
    for (backend, op) in store_ops {
        counter!(STORE_ERRORS, "backend" => backend, "op" => op).increment(0);
        let _ = histogram!(STORE_WRITE_DURATION, "backend" => backend, "op" => op);
    }
    if consul {
        register_consul();
    } else {
        counter!(STORE_WRITE_FAULTS).increment(0);
        for result in ["ok", "failed"] {
            counter!(STORE_REOPENS, "result" => result).increment(0);
        }
    }
}

/// Seconds from `now_ms` until `layout`'s time field runs out (negative
/// once it has): the value of [`LAYOUT_TIME_LEFT`].
pub fn layout_time_left_seconds(layout: &crate::id::Layout, now_ms: u64) -> f64 {
    (layout.end_ms() as f64 - now_ms as f64) / 1000.0
}

/// The standard `process_*` series (CPU, memory, descriptors, start time),
/// read from `/proc/self` at each scrape.
///
/// They keep the names every Prometheus client library uses, without the
/// `idgen_` prefix, so stock dashboards and alerts for processes work on
/// idgen unchanged.
pub mod process {
    use std::fmt::Write as _;

    /// What `/proc/self` says about this process.
    #[derive(Debug, Clone, Copy, Default, PartialEq)]
    pub struct Sample {
        /// User plus system CPU time, in seconds.
        pub cpu_seconds: f64,
        /// Resident memory, in bytes.
        pub resident_bytes: u64,
        /// Virtual memory, in bytes.
        pub virtual_bytes: u64,
        /// Open file descriptors.
        pub open_fds: u64,
        /// The soft limit on open file descriptors, when it is finite.
        pub max_fds: Option<u64>,
        /// Start time, in seconds since the Unix epoch.
        pub start_time_seconds: f64,
    }

    /// Reads a [`Sample`]; `None` where `/proc` is not mounted or readable
    /// (the series are then left out rather than reported as zeros).
    pub fn sample() -> Option<Sample> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        // The directory handle read_dir holds is one of the entries.
        let open_fds = open_fds.saturating_sub(1);
        let ticks = clock_ticks_per_second();
        let mut s = parse_stat(&stat, ticks, page_size())?;
        let boot_time: f64 = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        s.start_time_seconds += boot_time;
        s.open_fds = open_fds;
        s.max_fds = parse_max_open_files(&limits);
        Some(s)
    }

    /// Parses `/proc/<pid>/stat`. The command name (field 2) is in
    /// parentheses and may itself hold spaces or parentheses, so fields are
    /// counted from the last `)`. The start time is relative to boot.
    pub fn parse_stat(stat: &str, ticks_per_second: f64, page_size: u64) -> Option<Sample> {
        let rest = &stat[stat.rfind(')')? + 1..];
        // rest[0] is field 3 (state).
        let f: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| -> Option<u64> { f.get(n - 3)?.parse().ok() };
        let (utime, stime) = (field(14)?, field(15)?);
        Some(Sample {
            cpu_seconds: (utime + stime) as f64 / ticks_per_second,
            start_time_seconds: field(22)? as f64 / ticks_per_second,
            virtual_bytes: field(23)?,
            resident_bytes: field(24)?.saturating_mul(page_size),
            ..Sample::default()
        })
    }

    /// The soft "Max open files" limit from `/proc/<pid>/limits`.
    fn parse_max_open_files(limits: &str) -> Option<u64> {
        let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
        line["Max open files".len()..]
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// One value from the auxiliary vector the kernel handed this process.
    fn auxv(kind: u64) -> Option<u64> {
        let raw = std::fs::read("/proc/self/auxv").ok()?;
        raw.chunks_exact(16).find_map(|pair| {
            let k = u64::from_ne_bytes(pair[..8].try_into().ok()?);
            let v = u64::from_ne_bytes(pair[8..].try_into().ok()?);
            (k == kind).then_some(v)
        })
    }

    /// `sysconf(_SC_CLK_TCK)`, the unit of `/proc` CPU times, read from
    /// the auxiliary vector (`AT_CLKTCK`); 100 (Linux's `USER_HZ`) if
    /// that cannot be read.
    fn clock_ticks_per_second() -> f64 {
        const AT_CLKTCK: u64 = 17;
        auxv(AT_CLKTCK).filter(|&t| t > 0).unwrap_or(100) as f64
    }

    /// The page size (`AT_PAGESZ`), the unit of the resident set in
    /// `/proc/self/stat`; 4096 if it cannot be read.
    fn page_size() -> u64 {
        const AT_PAGESZ: u64 = 6;
        auxv(AT_PAGESZ).filter(|&p| p > 0).unwrap_or(4096)
    }

    /// The `process_*` series in the Prometheus text format, to append to
    /// the recorder's output; empty without `/proc`.
    pub fn render() -> String {
        let Some(s) = sample() else {
            return String::new();
        };
        let mut out = String::new();
        let mut series = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let _ = writeln!(out, "{name} {value}");
            let _ = writeln!(out);
        };
        series(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            s.cpu_seconds,
        );
        series(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            s.resident_bytes as f64,
        );
        series(
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            s.virtual_bytes as f64,
        );
        series(
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            s.open_fds as f64,
        );
        if let Some(max) = s.max_fds {
            series(
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors (the soft limit).",
                max as f64,
            );
        }
        series(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since the Unix epoch in seconds.",
            s.start_time_seconds,
        );
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_stat_with_a_command_name_holding_spaces_and_parentheses() {
            // Fields 3.. of a real line; utime 250, stime 50, starttime
            // 12345, vsize 1 MiB, rss 300 pages.
            let stat = "4242 (idgen (a) b) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 12345 1048576 300 18446744073709551615";
            let s = parse_stat(stat, 100.0, 4096).expect("parses");
            assert_eq!(s.cpu_seconds, 3.0);
            assert_eq!(s.start_time_seconds, 123.45);
            assert_eq!(s.virtual_bytes, 1_048_576);
            assert_eq!(s.resident_bytes, 300 * 4096);
            assert_eq!(parse_stat("garbage", 100.0, 4096), None);
        }

        #[test]
        fn reads_this_process() {
            let s = sample().expect("/proc is mounted on Linux");
            assert!(s.resident_bytes > 0);
            assert!(s.open_fds >= 3, "stdin, stdout, stderr at least");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_secs_f64();
            // Started within the last day, not in the future (a wrong
            // tick unit would put it decades off).
            assert!(s.start_time_seconds <= now + 1.0);
            assert!(s.start_time_seconds > now - 86_400.0);
            let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax open files            1024                 524288               files     \n";
            assert_eq!(parse_max_open_files(limits), Some(1024));
        }
    }
}
