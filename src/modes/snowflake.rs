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
use super::hidden::{HiddenOutput, RevealError};
use crate::error::Error;
use crate::id::decode::{decode_snowflake, Decoded};
use crate::id::hide::{HideError, SnowflakeHider, SnowflakeHiding};
use crate::id::{Clock, GenError, Mode, Snowflake};
use crate::id::{DecodeError, Layout};
use crate::metrics as m;

/// Serves snowflake mode.
pub struct SnowflakeEngine {
    gate: Arc<IssueGate>,
    clock: Arc<dyn Clock>,
    max_wait: Duration,
    shares: FairShares,
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
            RevealError::Refused(e) => *e,
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
            shares: FairShares::new(Arc::clone(&gate), Arc::clone(&clock)),
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

    /// One ID (the caller checked the gate). A hidden layout's key is
    /// checked first, so a refusal reserves nothing; the ID is mapped
    /// after it was reserved.
    pub async fn take_one(&self) -> Result<u64, Error> {
        let ready = self.hidden.as_ref().map(|h| h.output.ready()).transpose()?;
        let id = self.reserve_one().await?;
        match ready {
            Some(ready) => ready.hide(id),
            None => Ok(id),
        }
    }

    /// One internal ID: straight from the generator when nobody waits and
    /// the unit has room (no Vec), else through the fair-share queue.
    async fn reserve_one(&self) -> Result<u64, Error> {
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
    /// Hidden IDs are mapped after reservation and then sorted: a sortable
    /// batch keeps time order across time units, and every batch stays
    /// increasing as the API promises.
    pub async fn take(&self, count: usize) -> Result<Vec<u64>, Error> {
        let ready = self.hidden.as_ref().map(|h| h.output.ready()).transpose()?;
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
        if let Some(ready) = ready {
            ready.hide_all(&mut out)?;
            out.sort_unstable();
        }
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
