//! Snowflake mode serving: the lock-free generator of the worker id held
//! now, and calls that found a time unit's sequence used up waiting
//! (outside every lock) for the next unit.
//!
//! The generator lives in the [`IssueGate`]: in cluster mode it is replaced
//! when the node loses its worker id and claims one again
//! ([`IssueGate::fence`] closes the current one, calls fail with
//! UNAVAILABLE from then on, and [`IssueGate::install`] puts the next one
//! in place). The [`Issuer`](super::Issuer) checks the gate before a call
//! reaches this engine; a batch checks the deadline again after every
//! wait.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::gate::IssueGate;
use crate::error::Error;
use crate::id::{Clock, GenError, Mode};
use crate::metrics as m;

/// Serves snowflake mode.
pub struct SnowflakeEngine {
    gate: Arc<IssueGate>,
    clock: Arc<dyn Clock>,
    max_wait: Duration,
    issued: metrics::Counter,
    waits: metrics::Counter,
}

impl SnowflakeEngine {
    /// Snowflake mode over the generator `gate` holds, reading `clock`; a
    /// call waits at most `max_wait` without progress.
    pub fn new(gate: Arc<IssueGate>, clock: Arc<dyn Clock>, max_wait: Duration) -> Self {
        Self {
            gate,
            clock,
            max_wait,
            issued: metrics::counter!(m::IDS_ISSUED, "mode" => Mode::Snowflake.as_str()),
            waits: metrics::counter!(m::SEQUENCE_EXHAUSTED_WAITS),
        }
    }

    /// Maps a generator refusal, naming fencing when that is the cause.
    fn refusal(&self, e: GenError) -> Error {
        if e == GenError::Closed && self.gate.is_fenced() {
            self.gate.fenced_error()
        } else {
            e.into()
        }
    }

    /// One ID (the caller checked the gate).
    pub async fn take_one(&self) -> Result<u64, Error> {
        // The common case: no Vec, no wait.
        let id = match self.gate.generator().next_id(self.clock.now_micros()) {
            Ok(id) => id,
            Err(GenError::Exhausted { .. }) => {
                let mut out = Vec::with_capacity(1);
                self.fill(&mut out, 1).await?;
                out[0]
            }
            Err(e) => return Err(self.refusal(e)),
        };
        self.issued.increment(1);
        Ok(id)
    }

    /// `count` IDs, strictly increasing (the caller checked the gate).
    pub async fn take(&self, count: usize) -> Result<Vec<u64>, Error> {
        let mut out = Vec::with_capacity(count);
        self.fill(&mut out, count).await?;
        self.issued.increment(count as u64);
        Ok(out)
    }

    /// Reserves until `out` holds `count` IDs, waiting between time units.
    /// IDs reserved before a failure are dropped, never reused.
    async fn fill(&self, out: &mut Vec<u64>, count: usize) -> Result<(), Error> {
        // `max_wait` bounds each stretch without progress, not the whole
        // batch: a large batch legitimately spans many time units.
        let mut stalled_since: Option<Instant> = None;
        let mut waited = false;
        // One generator per call, so a batch is strictly increasing even if
        // the node is fenced and re-claims meanwhile (the call then fails).
        let generator = self.gate.generator();
        let ticker = self.gate.ticker();
        while out.len() < count {
            // Again on every round: a batch may span units, and the
            // deadline (the gate was checked before the call came here).
            self.gate.check_deadline()?;
            let now = self.clock.now_micros();
            match generator.reserve(now, (count - out.len()) as u64) {
                Ok(r) => {
                    generator.extend_ids(r, out);
                    stalled_since = None;
                }
                Err(GenError::Exhausted { retry_after_micros }) => {
                    self.waits.increment(1);
                    let since = *stalled_since.get_or_insert_with(Instant::now);
                    let stalled = since.elapsed();
                    if stalled >= self.max_wait {
                        return Err(Error::WaitTimeout {
                            waited_ms: stalled.as_millis() as u64,
                        });
                    }
                    ticker
                        .wait_until(now + retry_after_micros, self.max_wait - stalled)
                        .await;
                    waited = true;
                }
                Err(e) => return Err(self.refusal(e)),
            }
        }
        if waited {
            ticker.pass_on();
        }
        Ok(())
    }
}
