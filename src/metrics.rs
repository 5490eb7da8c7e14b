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
