//! The task that measures this node's issue rate and, on Consul,
//! publishes its status record every
//! [`STATUS_INTERVAL`](crate::cluster::status::STATUS_INTERVAL) (the
//! records every node's console shows, `cluster::status`), then a last
//! record saying "stopped" on a clean shutdown.
//!
//! A failed write is logged at debug and counted
//! (`idgen_status_record_writes_total{result="error"}`); the node serves
//! on regardless: the records are advisory.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster::status::{StatusRecord, PRUNE_AFTER, RUNNING, STATUS_INTERVAL, STOPPED};
use crate::metrics as m;
use crate::server::console::{node_view, now_ms};
use crate::server::http::HttpState;

/// Prune other instances' old records once every this many writes (about
/// hourly), and at start.
const PRUNE_EVERY: u64 = 720;

/// How long a clean shutdown waits for the last record.
const FINAL_WRITE_LIMIT: Duration = Duration::from_secs(3);

/// The running status task.
pub(super) struct StatusTask {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// IDs issued so far, summed over modes.
fn total_issued(node: &serde_json::Map<String, Value>) -> f64 {
    node.get("issued")
        .and_then(Value::as_object)
        .map_or(0.0, |m| m.values().filter_map(Value::as_f64).sum())
}

/// The rate between two readings of the node's counters.
struct RateMeter {
    last: Option<(Instant, f64)>,
}

impl RateMeter {
    fn sample(&mut self, total: f64) -> Option<f64> {
        let now = Instant::now();
        let rate = self.last.and_then(|(at, before)| {
            let secs = now.duration_since(at).as_secs_f64();
            (secs > 0.0 && total >= before).then(|| (total - before) / secs)
        });
        self.last = Some((now, total));
        rate
    }
}

fn record(state: &HttpState, label: &str, rate: Option<f64>) -> StatusRecord {
    StatusRecord {
        node: node_view(state),
        state: label.to_owned(),
        rate,
        written_ms: now_ms(),
        interval_ms: u64::try_from(STATUS_INTERVAL.as_millis()).unwrap_or(u64::MAX),
        hides: state.admin.local_hide_uses(),
    }
}

/// Writes one record; counts and logs a failure.
async fn publish(state: &HttpState, record: &StatusRecord) {
    let Some(board) = state.cluster.board() else {
        return;
    };
    let result = match board.publish(record).await {
        Ok(()) => "ok",
        Err(e) => {
            tracing::debug!(error = %e, "could not write this node's status record to Consul");
            "error"
        }
    };
    metrics::counter!(m::STATUS_WRITES, "result" => result).increment(1);
}

async fn run(state: HttpState, mut stop: watch::Receiver<bool>) {
    let mut meter = RateMeter { last: None };
    let mut tick = tokio::time::interval(STATUS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut writes: u64 = 0;
    let mut rate = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let r = record(&state, RUNNING, None);
        rate = meter.sample(total_issued(&r.node));
        state.cluster.set_rate(rate);
        publish(&state, &StatusRecord { rate, ..r }).await;
        if let (Some(board), 0) = (state.cluster.board(), writes % PRUNE_EVERY) {
            match board.prune(now_ms()).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    pruned = n,
                    after = %humantime::format_duration(PRUNE_AFTER),
                    "deleted the status records of instances that stopped writing"
                ),
                Err(e) => tracing::debug!(error = %e, "could not prune old status records"),
            }
        }
        writes += 1;
    }
    publish(&state, &record(&state, STOPPED, rate)).await;
}

impl StatusTask {
    /// Starts the task over the HTTP front end's state (its `cluster`
    /// says whether and where to publish).
    pub(super) fn start(state: HttpState) -> Self {
        let (stop, rx) = watch::channel(false);
        if state.cluster.board().is_some() {
            for result in ["ok", "error"] {
                metrics::counter!(m::STATUS_WRITES, "result" => result).increment(0);
            }
        }
        Self {
            stop,
            task: tokio::spawn(run(state, rx)),
        }
    }

    /// Stops the task after it wrote its last record ("stopped"), waiting
    /// at most a few seconds for Consul.
    pub(super) async fn finish(mut self) {
        let _ = self.stop.send(true);
        if tokio::time::timeout(FINAL_WRITE_LIMIT, &mut self.task)
            .await
            .is_err()
        {
            tracing::debug!("the last status record was not written in time");
            self.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_needs_two_readings_and_never_goes_negative() {
        let mut m = RateMeter { last: None };
        assert_eq!(m.sample(10.0), None);
        std::thread::sleep(Duration::from_millis(5));
        assert!(m.sample(20.0).is_some_and(|r| r > 0.0));
        assert_eq!(m.sample(5.0), None, "a counter reset is no rate");
    }
}
