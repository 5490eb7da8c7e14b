//! Watches the generator and turns what it sees into health, readiness,
//! metrics and one log line per event.
//!
//! The generator only keeps counters (it does no I/O); every
//! [`TICK`] this task applies the clock rules with no request in flight,
//! so a clock that steps back too far flips health to NOT_SERVING even on
//! an idle node, and back to SERVING once the clock has caught up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::id::{Clock, GenError, Snowflake, StepBackStats};
use crate::metrics as m;

use crate::modes::Issuer;

/// How often the monitor looks.
pub const TICK: Duration = Duration::from_millis(100);

/// The gRPC service names whose health the monitor reports.
pub const HEALTH_SERVICES: [&str; 2] = ["", "idgen.v1.IdGen"];

/// Shared serving state: ready flag and the switch that keeps the node
/// NOT_SERVING once shutdown has begun.
#[derive(Clone)]
pub struct ServingState {
    /// True while IDs can be issued.
    pub ready: Arc<AtomicBool>,
    /// Set at the start of shutdown; never cleared.
    pub draining: Arc<AtomicBool>,
    /// False once the node has been unable to issue (fenced, or its store
    /// cannot write) for longer than `store.max_unhealthy`: `/healthz`
    /// fails so an orchestrator restarts it.
    pub live: Arc<AtomicBool>,
    reporter: HealthReporter,
}

impl ServingState {
    /// Starts NOT_SERVING until the first check.
    pub fn new(reporter: HealthReporter) -> Self {
        Self {
            ready: Arc::new(AtomicBool::new(false)),
            draining: Arc::new(AtomicBool::new(false)),
            live: Arc::new(AtomicBool::new(true)),
            reporter,
        }
    }

    /// Reports `serving` on gRPC health, `/readyz` and the metric.
    pub async fn set(&self, serving: bool) {
        let serving = serving && !self.draining.load(Ordering::Acquire);
        self.ready.store(serving, Ordering::Release);
        metrics::gauge!(m::SERVING).set(if serving { 1.0 } else { 0.0 });
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in HEALTH_SERVICES {
            self.reporter.set_service_status(name, status).await;
        }
    }

    /// Enters drain: NOT_SERVING from now on.
    pub async fn drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.set(false).await;
    }
}

/// Runs until `stop` is notified. Follows the issuer's generator when it
/// is replaced after fencing. Liveness fails once the node has been
/// fenced, or its store unable to write or to confirm high-water marks,
/// for longer than `max_unhealthy` (a clock that stepped back does not
/// count: a restart would not help; nor does a lost state file, where a
/// restart must not happen behind the operator's back).
pub async fn run(
    issuer: Arc<Issuer>,
    clock: Arc<dyn Clock>,
    state: ServingState,
    stop: Arc<Notify>,
    max_unhealthy: Duration,
) {
    let mut fenced_since: Option<std::time::Instant> = None;
    let mut unconfirmed_since: Option<std::time::Instant> = None;
    let mut generator = issuer.generator();
    let mut seen = StepBackStats::default();
    let mut serving: Option<bool> = None;
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.notified() => return,
            _ = ticker.tick() => {}
        }
        let current = issuer.generator();
        if !Arc::ptr_eq(&current, &generator) {
            // Step-back counts belong to each generator.
            generator = current;
            seen = StepBackStats::default();
        }
        let now_ms = clock.now_millis();
        let check = generator.check(clock.now_micros());
        report_step_backs(&generator, &mut seen);
        metrics::gauge!(m::LAYOUT_TIME_LEFT)
            .set(m::layout_time_left_seconds(generator.layout(), now_ms));
        let lead = generator.hwm_ms() as f64 - now_ms as f64;
        metrics::gauge!(m::HWM_LEAD).set(lead / 1000.0);
        let lost = issuer.state_file_lost();
        let store_fault = issuer.store_fault();
        let ok = check.is_ok() && lost.is_none() && store_fault.is_none();
        if serving != Some(ok) {
            match &check {
                _ if lost.is_some() => {
                    if let Some(e) = &lost {
                        tracing::error!(error = %e, "stopped issuing: NOT_SERVING");
                    }
                }
                _ if store_fault.is_some() => {
                    if let Some((_, e)) = &store_fault {
                        tracing::error!(
                            error = %e,
                            "state store cannot write: NOT_SERVING until the file is reopened and writable"
                        );
                    }
                }
                Ok(()) if serving.is_some() => tracing::info!("issuing again: SERVING"),
                Ok(()) => {}
                Err(_) if issuer.is_fenced() => tracing::error!(
                    error = %issuer.gate().fenced_error(),
                    "stopped issuing: NOT_SERVING"
                ),
                Err(e) => tracing::error!(error = %e, "stopped issuing: NOT_SERVING"),
            }
            state.set(ok).await;
            serving = Some(ok);
        }
        // The store not confirming marks (a Consul KV that refuses writes
        // while the session lives, say) counts like a store that cannot
        // write.
        let unconfirmed = matches!(check, Err(GenError::HwmReached { .. }));
        let since = |cond: bool, at: &mut Option<std::time::Instant>| {
            if !cond {
                *at = None;
            } else if at.is_none() {
                *at = Some(std::time::Instant::now());
            }
            at.map(|s| s.elapsed())
        };
        let unable = since(issuer.is_fenced(), &mut fenced_since)
            .max(since(unconfirmed, &mut unconfirmed_since))
            .max(store_fault.as_ref().map(|(d, _)| *d))
            .filter(|_| lost.is_none());
        update_liveness(&state, unable, max_unhealthy);
    }
}

/// Fails liveness once `unable` (how long the node has been unable to
/// issue for a reason a restart can cure) exceeds `max_unhealthy`.
fn update_liveness(state: &ServingState, unable: Option<Duration>, max_unhealthy: Duration) {
    metrics::gauge!(m::UNABLE_TO_ISSUE).set(unable.map_or(0.0, |d| d.as_secs_f64()));
    let live = unable.is_none_or(|d| d <= max_unhealthy);
    if state.live.swap(live, Ordering::AcqRel) != live {
        if live {
            tracing::info!("able to issue again: /healthz answers 200");
        } else {
            tracing::error!(
                max_unhealthy_s = max_unhealthy.as_secs_f64(),
                "unable to issue (fenced, or the state store cannot write or confirm marks) for longer than store.max_unhealthy: /healthz fails so the node is restarted"
            );
        }
    }
}

fn report_step_backs(generator: &Snowflake, seen: &mut StepBackStats) {
    let now = generator.step_back_stats();
    let size = now.last_back_ms as f64 / 1000.0;
    let tolerated = now.tolerated - seen.tolerated;
    let refused = now.refused - seen.refused;
    if tolerated > 0 {
        metrics::counter!(m::CLOCK_STEP_BACK_EVENTS, "kind" => m::label::STEP_BACK_TOLERATED)
            .increment(tolerated);
        metrics::histogram!(m::CLOCK_STEP_BACK_SIZE).record(size);
        tracing::warn!(
            back_ms = now.last_back_ms,
            "wall clock stepped back within clock.max_backward; issuing continues on the logical clock"
        );
    }
    if refused > 0 {
        metrics::counter!(m::CLOCK_STEP_BACK_EVENTS, "kind" => m::label::STEP_BACK_REFUSED)
            .increment(refused);
        metrics::histogram!(m::CLOCK_STEP_BACK_SIZE).record(size);
        tracing::error!(
            back_ms = now.last_back_ms,
            "wall clock stepped back beyond clock.max_backward; refusing to issue until it catches up"
        );
    }
    *seen = now;
}
