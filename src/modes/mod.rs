//! The mode engines and the [`Issuer`] that dispatches a request to one
//! (like mini-redis's `cmd`): it checks the request (mode enabled, tag or
//! key present, count in range), refuses every mode once the state file is
//! lost, and passes the call to [`snowflake`], [`segment`], [`lease`] or
//! [`strict`]. Shared by the gRPC and HTTP front ends. The double buffer
//! segment and lease mode serve from is [`crate::id::buffer`]; how they
//! wait for a refill is [`refill`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
pub use crate::id::decode::{decode_lease, decode_snowflake, Decoded};
use crate::id::{check_count, Clock, Layout, Mode, RequestError, Snowflake};
use crate::store::reopen::StoreHealth;
use crate::store::state_file::StateFileGuard;
use crate::store::StoreError;

pub mod format;
pub mod format_reload;
pub mod lease;
pub mod lua_pool;
pub mod refill;
pub mod segment;
pub mod snowflake;
pub mod strict;
pub mod ticker;

use self::lease::Leases;
use self::segment::Segments;
use self::snowflake::Snowflakes;
use self::strict::Strict;
use crate::id::segment::Tag;

/// Issues IDs for requests: checks them and dispatches to the mode engines.
pub struct Issuer {
    snowflakes: Snowflakes,
    segments: Option<Arc<Segments>>,
    leases: Option<Arc<Leases>>,
    strict: Option<Arc<Strict>>,
    formats: Option<Arc<format::Formats>>,
    state_file: Option<Arc<StateFileGuard>>,
    store_health: Option<Arc<StoreHealth>>,
    layout: Layout,
    max_batch: u32,
}

impl Issuer {
    /// Sets the runway gauges (segment tags without IDs in memory, lease
    /// IDs in memory) from the engines' state; called at each scrape.
    pub fn update_runway_gauges(&self) {
        if let Some(segments) = &self.segments {
            metrics::gauge!(crate::metrics::SEGMENT_TAGS_WITHOUT_RUNWAY)
                .set(segments.tags_without_runway() as f64);
        }
        if let Some(leases) = &self.leases {
            metrics::gauge!(crate::metrics::LEASE_RUNWAY).set(leases.runway() as f64);
        }
    }

    /// An issuer over `generator`, reading `clock`.
    pub fn new(
        generator: Arc<Snowflake>,
        clock: Arc<dyn Clock>,
        max_batch: u32,
        max_wait: Duration,
    ) -> std::io::Result<Self> {
        Ok(Self {
            layout: *generator.layout(),
            snowflakes: Snowflakes::new(generator, clock, max_wait)?,
            segments: None,
            leases: None,
            strict: None,
            formats: None,
            state_file: None,
            store_health: None,
            max_batch,
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
        self.snowflakes.close(false);
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

    /// Serves formatted mode with `formats`.
    pub fn with_formats(mut self, formats: Arc<format::Formats>) -> Self {
        self.formats = Some(formats);
        self
    }

    /// Formatted mode's engine, when formats are defined.
    pub fn formats(&self) -> Option<&Arc<format::Formats>> {
        self.formats.as_ref()
    }

    fn formats_for(&self, name: &str) -> Result<&Arc<format::Formats>, Error> {
        self.formats
            .as_ref()
            .ok_or_else(|| StoreError::FormatNotFound(name.chars().take(80).collect()).into())
    }

    /// Issues `count` IDs of format `name` (`GenFormatted`). Refused, like
    /// every mode, once the state file is lost or the worker id is lost.
    pub async fn gen_formatted(
        &self,
        name: &str,
        params: &[(String, String)],
        count: u64,
    ) -> Result<format::Issued, Error> {
        self.check_state_file()?;
        let formats = self.formats_for(name)?;
        if self.snowflakes.is_fenced() {
            return Err(Error::Fenced);
        }
        self.snowflakes.check_deadline()?;
        let node = self.snowflakes.generator().node_number();
        formats.generate(name, params, count, node).await
    }

    /// Splits an ID of format `name` into its fields (`ParseFormatted`).
    pub fn parse_formatted(
        &self,
        name: &str,
        id: &str,
    ) -> Result<crate::id::format::ParsedId, Error> {
        self.formats_for(name)?.parse(name, id)
    }

    /// A counter's durable record (`GetFormatCounter`); per-node formats
    /// show this node's counter.
    pub async fn format_counter(
        &self,
        name: &str,
        params: &[(String, String)],
    ) -> Result<Option<format::CounterView>, Error> {
        let node = self.snowflakes.generator().node_number();
        self.formats_for(name)?.counter(name, params, node).await
    }

    /// The generator in use now.
    pub fn generator(&self) -> Arc<Snowflake> {
        self.snowflakes.generator()
    }

    /// Fencing: stops issuing at once (the current generator is closed,
    /// lease blocks dropped) and marks the node fenced, so calls say why
    /// they fail.
    pub fn fence(&self) {
        self.snowflakes.close(true);
        if let Some(leases) = &self.leases {
            leases.fence();
        }
        if let Some(formats) = &self.formats {
            formats.fence();
        }
    }

    /// Sets the worker lock's deadline: past `at`, snowflake and lease
    /// calls are refused as fenced until a later deadline is set. Called
    /// after every successful renew and on every claim.
    pub fn set_lock_deadline(&self, at: Instant) {
        self.snowflakes.set_deadline(at);
    }

    /// Whether the node is fenced (lost its worker id, not yet re-claimed).
    pub fn is_fenced(&self) -> bool {
        self.snowflakes.is_fenced()
    }

    /// Puts a new generator (above every earlier ID) in place of a closed
    /// one and lifts the fence.
    pub fn install(&self, generator: Arc<Snowflake>) {
        self.snowflakes.install(generator);
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
                self.snowflakes.check_deadline()?;
                return leases.take_one().await;
            }
            Mode::Strict => return Ok(self.strict_mode(tag)?.take(tag, 1).await?.first),
            Mode::Snowflake => {}
        }
        Self::check_mode(mode, tag)?;
        self.snowflakes.take_one().await
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
                self.snowflakes.check_deadline()?;
                return leases.take(count as usize).await;
            }
            Mode::Strict => {
                let values = self.strict_mode(tag)?.take(tag, u64::from(count)).await?;
                return Ok(values.iter().collect());
            }
            Mode::Snowflake => {}
        }
        Self::check_mode(mode, tag)?;
        self.snowflakes.take(count as usize).await
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
        issuer.set_lock_deadline(at);
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
        issuer.set_lock_deadline(Instant::now() + Duration::from_secs(60));
        assert!(issuer.gen_ids(Mode::Snowflake, "", 10).await.is_ok());
    }
}
