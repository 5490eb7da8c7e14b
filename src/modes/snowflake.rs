//! Snowflake mode serving: the lock-free generator of the worker id held
//! now, and calls that want more than the current time unit holds queued
//! for fair shares of the next units ([`super::fair_shares`]).
//!
//! The generator lives in the [`IssueGate`]: in cluster mode it is replaced
//! when the node loses its worker id and claims one again
//! ([`IssueGate::fence`] closes the current one, calls fail with
//! UNAVAILABLE from then on, and [`IssueGate::install`] puts the next one
//! in place). The [`Issuer`](super::Issuer) checks the gate before a call
//! reaches this engine; the fair-share pump checks the deadline again
//! before every pass.

use std::sync::Arc;
use std::time::Duration;

use super::fair_shares::FairShares;
use super::gate::IssueGate;
use crate::error::Error;
use crate::id::{Clock, GenError, Mode, Snowflake};
use crate::metrics as m;

/// Serves snowflake mode.
pub struct SnowflakeEngine {
    gate: Arc<IssueGate>,
    clock: Arc<dyn Clock>,
    max_wait: Duration,
    shares: FairShares,
    issued: metrics::Counter,
    waits: metrics::Counter,
}

impl SnowflakeEngine {
    /// Snowflake mode over the generator `gate` holds, reading `clock`; a
    /// call waits at most `max_wait` without progress.
    pub fn new(gate: Arc<IssueGate>, clock: Arc<dyn Clock>, max_wait: Duration) -> Self {
        Self {
            shares: FairShares::new(Arc::clone(&gate), Arc::clone(&clock)),
            gate,
            clock,
            max_wait,
            issued: metrics::counter!(m::IDS_ISSUED, "mode" => Mode::Snowflake.as_str()),
            waits: metrics::counter!(m::SEQUENCE_EXHAUSTED_WAITS),
        }
    }

    /// One ID (the caller checked the gate).
    pub async fn take_one(&self) -> Result<u64, Error> {
        // The common case: nobody waits, the unit has room; no Vec.
        if self.shares.is_idle() {
            match self.gate.current().next_id(self.clock.now_micros()) {
                Ok(id) => {
                    self.issued.increment(1);
                    return Ok(id);
                }
                Err(GenError::Exhausted { .. }) => {}
                Err(e) => return Err(self.gate.refusal(e)),
            }
        }
        let ids = self
            .queue(self.gate.generator(), Vec::with_capacity(1), 1)
            .await?;
        self.issued.increment(1);
        ids.first()
            .copied()
            .ok_or(Error::WaitTimeout { waited_ms: 0 })
    }

    /// `count` IDs, strictly increasing (the caller checked the gate).
    pub async fn take(&self, count: usize) -> Result<Vec<u64>, Error> {
        let mut out = Vec::with_capacity(count);
        let generator = self.gate.generator();
        if self.shares.is_idle() {
            match generator.reserve(self.clock.now_micros(), count as u64) {
                Ok(r) => generator.extend_ids(r, &mut out),
                Err(GenError::Exhausted { .. }) => {}
                Err(e) => return Err(self.gate.refusal(e)),
            }
        }
        if out.len() < count {
            out = self.queue(generator, out, count).await?;
        }
        self.issued.increment(count as u64);
        Ok(out)
    }

    /// Queues for fair shares until `out` (from `generator`) holds `count`
    /// IDs. One generator per call, so a batch is strictly increasing even if the node is
    /// fenced and re-claims meanwhile (the call then fails). IDs reserved
    /// before a failure are dropped, never reused.
    async fn queue(
        &self,
        generator: Arc<Snowflake>,
        out: Vec<u64>,
        count: usize,
    ) -> Result<Vec<u64>, Error> {
        self.waits.increment(1);
        self.shares
            .wait_for(generator, out, count, self.max_wait)
            .await
    }
}
