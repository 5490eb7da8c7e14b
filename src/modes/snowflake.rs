//! Snowflake mode serving: the lock-free generator of the worker id held
//! now, calls that found a time unit's sequence used up waiting (outside
//! every lock) for the next unit, and the fencing deadline checked on
//! every issue.
//!
//! In cluster mode the generator is replaced when the node loses its
//! worker id and claims one again: [`SnowflakeEngine::close`] closes the
//! current one (calls fail with UNAVAILABLE from then on) and
//! [`SnowflakeEngine::install`] puts the next one in place.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use super::ticker::UnitTicker;
use crate::error::Error;
use crate::id::{Clock, Deadline, GenError, Mode, Snowflake};
use crate::metrics as m;

/// Serves snowflake mode.
pub struct SnowflakeEngine {
    generator: ArcSwap<Snowflake>,
    fenced: AtomicBool,
    /// The worker lock's deadline on the ticker's coarse clock (cluster
    /// mode; unbounded on the embedded store). Checked on every snowflake
    /// and lease issue, so a node stops at its deadline even if the
    /// supervisor that would fence it runs late.
    deadline: Deadline,
    clock: Arc<dyn Clock>,
    ticker: UnitTicker,
    max_wait: Duration,
    issued: metrics::Counter,
    waits: metrics::Counter,
}

impl SnowflakeEngine {
    /// Snowflake mode over `generator`, reading `clock`; a call waits at
    /// most `max_wait` without progress.
    pub fn new(
        generator: Arc<Snowflake>,
        clock: Arc<dyn Clock>,
        max_wait: Duration,
    ) -> std::io::Result<Self> {
        Ok(Self {
            ticker: UnitTicker::new(Arc::clone(&clock))?,
            generator: ArcSwap::new(generator),
            fenced: AtomicBool::new(false),
            deadline: Deadline::unbounded(),
            clock,
            max_wait,
            issued: metrics::counter!(m::IDS_ISSUED, "mode" => Mode::Snowflake.as_str()),
            waits: metrics::counter!(m::SEQUENCE_EXHAUSTED_WAITS),
        })
    }

    /// The generator in use now.
    pub fn generator(&self) -> Arc<Snowflake> {
        self.generator.load_full()
    }

    /// Stops issuing at once: the current generator is closed. `fenced`:
    /// because the worker id was lost (calls then say so).
    pub fn close(&self, fenced: bool) {
        if fenced {
            self.fenced.store(true, Ordering::SeqCst);
        }
        self.generator.load().close();
    }

    /// Sets the worker lock's deadline: past `at`, calls are refused as
    /// fenced until a later deadline is set.
    pub fn set_deadline(&self, at: Instant) {
        self.deadline.set(self.ticker.coarse().deadline_at(at));
    }

    /// Refuses once the deadline has passed: one atomic load and a compare
    /// against the ticker's coarse clock.
    #[inline]
    pub fn check_deadline(&self) -> Result<(), Error> {
        if self.deadline.passed(self.ticker.coarse().now_ms()) {
            return Err(Error::Fenced);
        }
        Ok(())
    }

    /// Whether the node is fenced (lost its worker id, not yet re-claimed).
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// Puts a new generator (above every earlier ID) in place of a closed
    /// one and lifts the fence.
    pub fn install(&self, generator: Arc<Snowflake>) {
        self.generator.store(generator);
        self.fenced.store(false, Ordering::SeqCst);
    }

    /// Maps a generator refusal, naming fencing when that is the cause.
    fn refusal(&self, e: GenError) -> Error {
        if e == GenError::Closed && self.is_fenced() {
            Error::Fenced
        } else {
            e.into()
        }
    }

    /// One ID.
    pub async fn take_one(&self) -> Result<u64, Error> {
        self.check_deadline()?;
        // The common case: no Vec, no wait.
        let id = match self.generator.load().next_id(self.clock.now_micros()) {
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

    /// `count` IDs, strictly increasing.
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
        let generator = self.generator.load_full();
        while out.len() < count {
            // Again after every wait: a batch may span a deadline.
            self.check_deadline()?;
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
                    self.ticker
                        .wait_until(now + retry_after_micros, self.max_wait - stalled)
                        .await;
                    waited = true;
                }
                Err(e) => return Err(self.refusal(e)),
            }
        }
        if waited {
            self.ticker.pass_on();
        }
        Ok(())
    }
}
