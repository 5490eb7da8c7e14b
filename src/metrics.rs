//! Every metric idgen exports, declared in one place.
//!
//! Names carry the `idgen_` prefix, counters end in `_total`, durations are
//! histograms in `_seconds`. [`install`] sets up the Prometheus recorder
//! once per process and describes each metric.

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
/// Years until the layout's time field runs out.
pub const LAYOUT_YEARS_LEFT: &str = "idgen_layout_years_left";
/// 1 while this node issues IDs, 0 while it refuses.
pub const SERVING: &str = "idgen_serving";
/// Consul HTTP request latency, by `endpoint` and `code`.
pub const CONSUL_REQUEST_DURATION: &str = "idgen_consul_request_duration_seconds";
/// Failed Consul requests (each attempt), by `endpoint`.
pub const CONSUL_ERRORS: &str = "idgen_consul_errors_total";
/// 1 while the node is fenced (lost its worker id lease), else 0.
pub const FENCED: &str = "idgen_fenced";
/// Times the node lost its worker id lease and fenced itself.
pub const FENCINGS: &str = "idgen_fencings_total";
/// Free worker ids passed over by an auto claim because their stored mark
/// was too far ahead of this node's clock.
pub const WORKER_IDS_SKIPPED: &str = "idgen_worker_ids_skipped_total";
/// The worker id held, labelled by `datacenter`; -1 while fenced.
pub const WORKER_ID: &str = "idgen_worker_id";
/// Seconds since the Consul session was last renewed successfully.
pub const SESSION_RENEW_AGE: &str = "idgen_consul_session_renew_age_seconds";
/// The lease token whose blocks this node serves, by zone.
pub const LEASE_TOKEN: &str = "idgen_lease_token";
/// Requests per group commit of strict counters (embedded store).
pub const STRICT_COMMIT_BATCH: &str = "idgen_strict_commit_batch";
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
/// Open client connections, by `port`.
pub const CONNECTIONS_OPEN: &str = "idgen_connections_open";
/// Connections the node closed on a deadline, by `port` and `reason`.
pub const CONNECTIONS_TIMED_OUT: &str = "idgen_connections_timed_out_total";
/// Constant 1, labelled with the version and the layout.
pub const BUILD_INFO: &str = "idgen_build_info";

const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5,
];

static HANDLE: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// Installs the process-wide Prometheus recorder (once) and returns a handle
/// that renders the text exposition format.
pub fn install() -> Result<PrometheusHandle, String> {
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .map_err(|e| e.to_string())?
                .install_recorder()
                .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
            describe();
            Ok(handle)
        })
        .clone()
}

fn describe() {
    describe_gauge!(
        STORE_HEALTHY,
        "1 while the embedded state file accepts writes; 0 from a write error (disk full, I/O error) until the node has reopened the file and a probe write succeeded."
    );
    describe_counter!(
        STORE_REOPENS,
        "Attempts to reopen the embedded state file after a write error, by result (ok or failed)."
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
        "Calls that waited for the next time unit because the sequence was used up."
    );
    describe_histogram!(
        STORE_WRITE_DURATION,
        Unit::Seconds,
        "Time for a durable write to the state store, by backend and operation."
    );
    describe_counter!(
        STORE_ERRORS,
        "Failed state store operations, by backend and operation."
    );
    describe_gauge!(
        LAYOUT_YEARS_LEFT,
        "Years until the layout's time bits run out at the configured epoch."
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
    describe_gauge!(
        FENCED,
        "1 while the node is fenced: its worker id lease ran out, so it issues nothing until it claims an id again."
    );
    describe_counter!(
        FENCINGS,
        "Times the node lost its worker id lease and stopped issuing."
    );
    describe_counter!(
        WORKER_IDS_SKIPPED,
        "Free worker ids an auto claim passed over because their stored high-water mark was more than clock.max_startup_skew ahead of this node's clock."
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
    describe_histogram!(
        STRICT_COMMIT_BATCH,
        "Strict calls made durable by one group commit of the embedded store."
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
        STRICT_KEYS,
        "Live strict keys in the store, as counted by this node (embedded: at every creation or deletion; Consul: when a key starts a new namespace)."
    );
    describe_gauge!(
        STRICT_NAMESPACES,
        "Strict namespaces holding live keys, as counted by this node (embedded: at every creation or deletion; Consul: when a key starts a new namespace)."
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
/// The `mode` label of [`IDS_ISSUED`] is [`crate::id::Mode::as_str`].
pub mod label {
    /// `backend` of the store metrics for segment records (the embedded
    /// and Consul backends of high-water marks name themselves).
    pub const BACKEND_SEGMENT: &str = "segment";
    /// `backend` of the store metrics for lease-token counters.
    pub const BACKEND_LEASE: &str = "lease";
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
