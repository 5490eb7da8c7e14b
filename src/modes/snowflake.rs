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
use super::hidden::{HiddenOutput, RevealError};
use crate::error::Error;
use crate::id::decode::{decode_snowflake, Decoded};
use crate::id::hide::{HideError, SnowflakeHider, SnowflakeHiding};
use crate::id::{Clock, GenError, Mode};
use crate::id::{DecodeError, Layout};
use crate::metrics as m;

/// Serves snowflake mode.
pub struct SnowflakeEngine {
    gate: Arc<IssueGate>,
    clock: Arc<dyn Clock>,
    max_wait: Duration,
    issued: metrics::Counter,
    waits: metrics::Counter,
    /// A hidden layout's output: IDs are reserved under the generator's
    /// (internal) layout and shown through it.
    hidden: Option<HiddenSnowflakes>,
}

/// A hidden snowflake layout (`layout.hide`): its output, the public
/// layout shown IDs have, and the variant.
#[derive(Clone)]
pub struct HiddenSnowflakes {
    /// The hider, kept current with the key ring.
    pub output: Arc<HiddenOutput<SnowflakeHider>>,
    /// The layout hidden IDs are shown under (the configured one).
    pub public: Layout,
    /// Sortable or opaque.
    pub hiding: SnowflakeHiding,
    /// Bits of key version in a shown ID.
    pub version_bits: u32,
}

impl HiddenSnowflakes {
    fn variant(&self) -> &'static str {
        match self.hiding {
            SnowflakeHiding::Sortable => "sortable",
            SnowflakeHiding::Opaque => "opaque",
        }
    }

    /// The parts of shown `id`: for an admin caller (`reveal`) the
    /// internal ID decoded under `internal` (the generator's layout) and
    /// its key version; otherwise the public view (a sortable ID's time
    /// and key version; for opaque nothing but that it is hidden).
    pub fn decode(&self, internal: &Layout, id: u64, reveal: bool) -> Result<Decoded, Error> {
        // Bits above the public layout: not an ID of this layout.
        let public = decode_snowflake(&self.public, id)?;
        if !reveal {
            let mut view = Decoded {
                hidden: Some(self.variant()),
                ..public
            };
            (view.datacenter, view.worker, view.sequence) = (0, 0, 0);
            match self.hiding {
                SnowflakeHiding::Sortable => {
                    // `time | version | permuted`: the version sits just
                    // below the time field.
                    let node_bits =
                        self.public.total_bits() - u32::from(self.public.spec().time_bits);
                    let version =
                        (id >> (node_bits - self.version_bits)) & ((1u64 << self.version_bits) - 1);
                    view.key_version = Some(version as u32);
                }
                SnowflakeHiding::Opaque => {
                    view.time = String::new();
                    view.unix_millis = 0;
                }
            }
            return Ok(view);
        }
        let (version, internal_id) = self.output.reveal(id).map_err(|e| match e {
            RevealError::Refused(e) => e,
            RevealError::Hide(HideError::NotHidden { .. }) => Error::Decode(DecodeError {
                id,
                bits: self.public.total_bits(),
                layout: self.public.to_string(),
            }),
            RevealError::Hide(e) => Error::Hidden {
                namespace: "the snowflake layout".into(),
                key: self.output.key_id().to_owned(),
                reason: e.to_string(),
            },
        })?;
        let parts = decode_snowflake(internal, internal_id)?;
        Ok(Decoded {
            id,
            hidden: Some(self.variant()),
            key_version: Some(u32::from(version)),
            internal_id: Some(internal_id),
            ..parts
        })
    }
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
            hidden: None,
        }
    }

    /// Shows every ID through `hidden` (`layout.hide`).
    pub fn set_hidden(&mut self, hidden: HiddenSnowflakes) {
        self.hidden = Some(hidden);
    }

    /// The hidden layout, if IDs are hidden.
    pub fn hidden(&self) -> Option<&HiddenSnowflakes> {
        self.hidden.as_ref()
    }

    /// Maps a generator refusal, naming fencing when that is the cause.
    fn refusal(&self, e: GenError) -> Error {
        if e == GenError::Closed && self.gate.is_fenced() {
            self.gate.fenced_error()
        } else {
            e.into()
        }
    }

    /// One ID (the caller checked the gate). A hidden layout's key is
    /// checked first, so a refusal reserves nothing; the ID is mapped
    /// after it was reserved.
    pub async fn take_one(&self) -> Result<u64, Error> {
        let ready = self.hidden.as_ref().map(|h| h.output.ready()).transpose()?;
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
        match ready {
            Some(ready) => ready.hide(id),
            None => Ok(id),
        }
    }

    /// `count` IDs, strictly increasing (the caller checked the gate).
    /// Hidden IDs are mapped after reservation and then sorted: a sortable
    /// batch keeps time order across time units, and every batch stays
    /// increasing as the API promises.
    pub async fn take(&self, count: usize) -> Result<Vec<u64>, Error> {
        let ready = self.hidden.as_ref().map(|h| h.output.ready()).transpose()?;
        let mut out = Vec::with_capacity(count);
        self.fill(&mut out, count).await?;
        self.issued.increment(count as u64);
        if let Some(ready) = ready {
            ready.hide_all(&mut out)?;
            out.sort_unstable();
        }
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
