//! The async layer between requests and the generator: checks a request,
//! waits (outside every lock) when a time unit's sequence is used up, and
//! counts what it hands out. Shared by the gRPC and HTTP front ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::error::Error;
use crate::id::{
    check_count, Clock, Deadline, DecodeError, GenError, Layout, Mode, RequestError, Snowflake,
};
use crate::metrics as m;
use crate::store::reopen::StoreHealth;
use crate::store::state_file::StateFileGuard;
use crate::store::StoreError;

pub mod lease;
pub mod refill;
pub mod segment;
pub mod strict;
pub mod ticker;

use self::lease::Leases;
use self::segment::Segments;
use self::strict::Strict;
use self::ticker::UnitTicker;
use crate::id::segment::Tag;

/// An ID split into its parts, for `DecodeId` and `/v1/decode`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Decoded {
    /// The ID, as a decimal string in JSON.
    #[serde(serialize_with = "as_decimal")]
    pub id: u64,
    /// The mode it was decoded as.
    pub mode: &'static str,
    /// RFC 3339 time with milliseconds, UTC.
    pub time: String,
    /// Unix milliseconds.
    pub unix_millis: u64,
    /// Datacenter field.
    pub datacenter: u64,
    /// Worker field.
    pub worker: u64,
    /// Sequence field.
    pub sequence: u64,
    /// Zone field (lease IDs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<u64>,
    /// Token field (lease IDs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
}

fn as_decimal<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Issues IDs for requests.
///
/// In cluster mode the generator is replaced when the node loses its
/// worker id and claims one again: [`Issuer::fence`] closes the current
/// one (calls fail with UNAVAILABLE from then on) and [`Issuer::install`]
/// puts the next one in place.
pub struct Issuer {
    generator: ArcSwap<Snowflake>,
    segments: Option<Arc<Segments>>,
    leases: Option<Arc<Leases>>,
    strict: Option<Arc<Strict>>,
    state_file: Option<Arc<StateFileGuard>>,
    store_health: Option<Arc<StoreHealth>>,
    layout: Layout,
    fenced: AtomicBool,
    /// The worker lease's deadline on the ticker's coarse clock (cluster
    /// mode; unbounded on the embedded store). Checked on every snowflake
    /// and lease issue, so a node stops at its deadline even if the
    /// supervisor that would fence it runs late.
    lease_deadline: Deadline,
    clock: Arc<dyn Clock>,
    ticker: UnitTicker,
    max_batch: u32,
    max_wait: Duration,
    issued: metrics::Counter,
    waits: metrics::Counter,
}

impl Issuer {
    /// An issuer over `generator`, reading `clock`.
    pub fn new(
        generator: Arc<Snowflake>,
        clock: Arc<dyn Clock>,
        max_batch: u32,
        max_wait: Duration,
    ) -> std::io::Result<Self> {
        Ok(Self {
            ticker: UnitTicker::new(Arc::clone(&clock))?,
            layout: *generator.layout(),
            generator: ArcSwap::new(generator),
            segments: None,
            leases: None,
            strict: None,
            state_file: None,
            store_health: None,
            fenced: AtomicBool::new(false),
            lease_deadline: Deadline::unbounded(),
            clock,
            max_batch,
            max_wait,
            issued: metrics::counter!(m::IDS_ISSUED, "mode" => Mode::Snowflake.as_str()),
            waits: metrics::counter!(m::SEQUENCE_EXHAUSTED_WAITS),
        })
    }

    /// Serves segment mode through `segments`.
    pub fn with_segments(mut self, segments: Arc<Segments>) -> Self {
        self.segments = Some(segments);
        self
    }

    /// Serves lease mode through `leases`.
    pub fn with_leases(mut self, leases: Arc<Leases>) -> Self {
        self.leases = Some(leases);
        self
    }

    /// Serves strict mode through `strict`.
    pub fn with_strict(mut self, strict: Arc<Strict>) -> Self {
        self.strict = Some(strict);
        self
    }

    /// Refuses every call in every mode once `guard` sees the embedded
    /// state file deleted or replaced.
    pub fn with_state_file(mut self, guard: Arc<StateFileGuard>) -> Self {
        self.state_file = Some(guard);
        self
    }

    /// Reports the embedded store's write faults in health (readiness and,
    /// past `store.max_unhealthy`, liveness).
    pub fn with_store_health(mut self, health: Arc<StoreHealth>) -> Self {
        self.store_health = Some(health);
        self
    }

    /// How long the store has been unable to write, and its last error,
    /// while it is (the node reopens it and resumes by itself).
    pub fn store_fault(&self) -> Option<(Duration, String)> {
        let health = self.store_health.as_ref()?;
        let since = health.unwritable_for()?;
        Some((since, health.last_error().unwrap_or_default()))
    }

    /// Why the node may not issue because its state file is gone, if so.
    pub fn state_file_lost(&self) -> Option<StoreError> {
        self.state_file.as_ref().and_then(|g| g.lost_error())
    }

    /// Stops issuing at once in every mode (the state file is gone): the
    /// snowflake generator is closed and lease blocks dropped; calls fail
    /// with the guard's error from then on.
    pub fn halt_state_file_lost(&self) {
        self.generator.load().close();
        if let Some(leases) = &self.leases {
            leases.fence();
        }
    }

    /// One atomic load on the issue path.
    fn check_state_file(&self) -> Result<(), Error> {
        match &self.state_file {
            Some(g) if g.is_lost() => Err(g
                .lost_error()
                .unwrap_or_else(|| StoreError::Backend("state file lost".into()))
                .into()),
            _ => Ok(()),
        }
    }

    /// The lease mode server, when enabled.
    pub fn leases(&self) -> Option<&Arc<Leases>> {
        self.leases.as_ref()
    }

    /// The strict mode server, when enabled.
    pub fn strict(&self) -> Option<&Arc<Strict>> {
        self.strict.as_ref()
    }

    /// The segment mode server, when enabled.
    pub fn segment_server(&self) -> Option<&Arc<Segments>> {
        self.segments.as_ref()
    }

    fn lease_mode(&self, tag: &str) -> Result<&Arc<Leases>, Error> {
        let leases = self
            .leases
            .as_ref()
            .ok_or(RequestError::ModeNotEnabled(Mode::Lease))?;
        if !tag.is_empty() {
            return Err(RequestError::UnexpectedTag(Mode::Lease).into());
        }
        Ok(leases)
    }

    fn strict_mode(&self, tag: &str) -> Result<&Arc<Strict>, Error> {
        let strict = self
            .strict
            .as_ref()
            .ok_or(RequestError::ModeNotEnabled(Mode::Strict))?;
        if tag.is_empty() {
            return Err(RequestError::MissingKey.into());
        }
        Ok(strict)
    }

    /// The segment mode server, when enabled.
    fn segments(&self, mode: Mode, tag: &str) -> Result<(&Arc<Segments>, Tag), Error> {
        let segments = self
            .segments
            .as_ref()
            .ok_or(RequestError::ModeNotEnabled(mode))?;
        if tag.is_empty() {
            return Err(RequestError::MissingTag(mode).into());
        }
        let tag = Tag::parse(tag).map_err(crate::store::StoreError::from)?;
        Ok((segments, tag))
    }

    /// The generator in use now.
    pub fn generator(&self) -> Arc<Snowflake> {
        self.generator.load_full()
    }

    /// Fencing: stops issuing at once (the current generator is closed) and
    /// marks the node fenced, so calls say why they fail.
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::SeqCst);
        self.generator.load().close();
        if let Some(leases) = &self.leases {
            leases.fence();
        }
    }

    /// Sets the worker lease's deadline: past `at`, snowflake and lease
    /// calls are refused as fenced until a later deadline is set. Called
    /// after every successful renew and on every claim.
    pub fn set_lease_deadline(&self, at: Instant) {
        self.lease_deadline
            .set(self.ticker.coarse().deadline_at(at));
    }

    /// Refuses once the lease deadline has passed: one atomic load and a
    /// compare against the ticker's coarse clock.
    #[inline]
    fn check_lease_deadline(&self) -> Result<(), Error> {
        if self.lease_deadline.passed(self.ticker.coarse().now_ms()) {
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

    /// The largest batch a call may ask for.
    pub fn max_batch(&self) -> u32 {
        self.max_batch
    }

    /// Checks that `mode` is served here and `tag` fits it.
    fn check_mode(mode: Mode, tag: &str) -> Result<(), RequestError> {
        match mode {
            Mode::Snowflake if tag.is_empty() => Ok(()),
            Mode::Snowflake => Err(RequestError::UnexpectedTag(mode)),
            other => Err(RequestError::ModeNotEnabled(other)),
        }
    }

    /// One ID.
    pub async fn gen_id(&self, mode: Mode, tag: &str) -> Result<u64, Error> {
        self.check_state_file()?;
        match mode {
            Mode::Segment => {
                let (segments, tag) = self.segments(mode, tag)?;
                return segments.take_one(&tag).await;
            }
            Mode::Lease => {
                let leases = self.lease_mode(tag)?;
                self.check_lease_deadline()?;
                return leases.take_one().await;
            }
            Mode::Strict => return Ok(self.strict_mode(tag)?.take(tag, 1).await?.first),
            Mode::Snowflake => {}
        }
        Self::check_mode(mode, tag)?;
        self.check_lease_deadline()?;
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
    pub async fn gen_ids(&self, mode: Mode, tag: &str, count: u64) -> Result<Vec<u64>, Error> {
        let count = check_count(count, self.max_batch)?;
        self.check_state_file()?;
        match mode {
            Mode::Segment => {
                let (segments, tag) = self.segments(mode, tag)?;
                return segments.take(&tag, count as usize).await;
            }
            Mode::Lease => {
                let leases = self.lease_mode(tag)?;
                self.check_lease_deadline()?;
                return leases.take(count as usize).await;
            }
            Mode::Strict => {
                let values = self.strict_mode(tag)?.take(tag, u64::from(count)).await?;
                return Ok(values.iter().collect());
            }
            Mode::Snowflake => {}
        }
        Self::check_mode(mode, tag)?;
        let mut out = Vec::with_capacity(count as usize);
        self.fill(&mut out, count as usize).await?;
        self.issued.increment(u64::from(count));
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
            self.check_lease_deadline()?;
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

    /// Splits `id` into its parts under the configured layout.
    pub fn decode(&self, mode: Mode, id: u64) -> Result<Decoded, Error> {
        match mode {
            Mode::Snowflake => Ok(decode_snowflake(&self.layout, id)?),
            // The layout is fixed: lease IDs decode on any node.
            Mode::Lease => Ok(decode_lease(id).map_err(crate::store::StoreError::from)?),
            Mode::Segment | Mode::Strict => Err(RequestError::NothingToDecode(mode).into()),
        }
    }
}

/// Splits a snowflake `id` under `layout`; used online and by `idgen decode`.
pub fn decode_snowflake(layout: &Layout, id: u64) -> Result<Decoded, DecodeError> {
    let parts = layout.decompose(id)?;
    let time = std::time::UNIX_EPOCH + Duration::from_millis(parts.unix_ms);
    Ok(Decoded {
        id,
        mode: Mode::Snowflake.as_str(),
        time: humantime::format_rfc3339_millis(time).to_string(),
        unix_millis: parts.unix_ms,
        datacenter: parts.datacenter,
        worker: parts.worker,
        sequence: parts.sequence,
        zone: None,
        token: None,
    })
}

/// Splits a lease `id` (`0 | zone | token | sequence`); needs no config.
pub fn decode_lease(id: u64) -> Result<Decoded, crate::id::lease::LeaseError> {
    let parts = crate::id::lease::decompose(id)?;
    Ok(Decoded {
        id,
        mode: Mode::Lease.as_str(),
        time: String::new(),
        unix_millis: 0,
        datacenter: 0,
        worker: 0,
        sequence: parts.sequence,
        zone: Some(parts.zone),
        token: Some(parts.token),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::{Preset, StartPlan, SystemClock, DEFAULT_EPOCH_MS};

    fn issuer() -> (Issuer, Arc<Snowflake>) {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let now_ms = clock.now_millis();
        let layout = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(now_ms)
            .unwrap();
        let plan = StartPlan::new(&layout, now_ms, None, 0).unwrap();
        let g = Arc::new(Snowflake::new(layout, 0, 1, 1000, plan, now_ms + 600_000).unwrap());
        let issuer = Issuer::new(Arc::clone(&g), clock, 100, Duration::from_secs(1)).unwrap();
        (issuer, g)
    }

    #[tokio::test]
    async fn the_issue_path_refuses_past_the_lease_deadline_with_no_supervisor() {
        let (issuer, g) = issuer();
        assert!(
            issuer.gen_id(Mode::Snowflake, "").await.is_ok(),
            "no deadline: issues"
        );
        let at = Instant::now() + Duration::from_millis(50);
        issuer.set_lease_deadline(at);
        // Nothing fences this node (no supervisor runs): only the deadline
        // check on the issue path can stop it. Bounded wait.
        let mut refused = None;
        for _ in 0..400 {
            match issuer.gen_id(Mode::Snowflake, "").await {
                Ok(_) => {}
                Err(e) => {
                    refused = Some(e);
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(matches!(refused, Some(Error::Fenced)), "{refused:?}");
        assert!(matches!(
            issuer.gen_ids(Mode::Snowflake, "", 10).await,
            Err(Error::Fenced)
        ));
        assert!(!g.is_closed(), "refused by the deadline alone");
        // A renew moves the deadline on and issuing resumes.
        issuer.set_lease_deadline(Instant::now() + Duration::from_secs(60));
        assert!(issuer.gen_ids(Mode::Snowflake, "", 10).await.is_ok());
    }
}
