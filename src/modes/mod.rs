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

pub mod fair_shares;
pub mod format_catalog;
pub mod formatted;
pub mod gate;
pub mod hidden;
pub mod hide_keys;
pub mod lease;
pub mod lua_pool;
pub mod miss;
pub mod refill;
pub mod segment;
pub mod snowflake;
pub mod strict;
pub mod ticker;
pub mod uuid;

use self::gate::IssueGate;
use self::lease::LeaseEngine;
use self::segment::SegmentEngine;
use self::snowflake::SnowflakeEngine;
use self::strict::StrictEngine;
use crate::id::format::FormatError;
use crate::id::segment::Tag;

/// Where a checked `GenId`/`GenIds` call goes ([`Issuer::route`]).
enum Route<'a> {
    Segment(&'a Arc<SegmentEngine>, Tag),
    Lease(&'a Arc<LeaseEngine>),
    /// The strict key is the call's tag.
    Strict(&'a Arc<StrictEngine>),
    Snowflake,
}

/// Issues IDs for requests: checks them and dispatches to the mode engines.
pub struct Issuer {
    /// Whether this node still holds its worker id: checked once per
    /// snowflake, lease and formatted call.
    gate: Arc<IssueGate>,
    snowflakes: SnowflakeEngine,
    uuids: self::uuid::UuidEngine,
    segments: Option<Arc<SegmentEngine>>,
    leases: Option<Arc<LeaseEngine>>,
    strict: Option<Arc<StrictEngine>>,
    formats: Option<Arc<formatted::FormattedEngine>>,
    /// The catalog the formats come from: asked to reload when a call
    /// names a format this node does not know yet.
    catalog: Option<Arc<format_catalog::FormatCatalog>>,
    state_file: Option<Arc<StateFileGuard>>,
    store_health: Option<Arc<StoreHealth>>,
    /// The hide key rings: re-read when a call is refused for a key this
    /// node does not have yet.
    hide_keys: Option<hide_keys::HideKeyRings>,
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
        let gate = Arc::new(IssueGate::new(generator, Arc::clone(&clock))?);
        Ok(Self {
            layout: *gate.generator().layout(),
            snowflakes: SnowflakeEngine::new(Arc::clone(&gate), Arc::clone(&clock), max_wait),
            uuids: self::uuid::UuidEngine::new(Arc::clone(&gate), clock, max_wait),
            gate,
            segments: None,
            leases: None,
            strict: None,
            formats: None,
            catalog: None,
            state_file: None,
            store_health: None,
            hide_keys: None,
            max_batch,
        })
    }

    /// Re-reads `rings` when a call is refused for a hide key this node
    /// does not have, or has only retired (the call then runs once more).
    pub fn with_hide_keys(mut self, rings: hide_keys::HideKeyRings) -> Self {
        self.hide_keys = Some(rings);
        self
    }

    /// `call`, and once more after the hide key rings were re-read when it
    /// was refused for a key this node does not have or has only retired
    /// (created or rotated through another node moments ago): served from
    /// the first call, not after this node's watch. Every engine refuses a
    /// hidden namespace before it takes any value, so the first attempt
    /// took nothing. A missing key waits for a re-read that started after
    /// the call came (at most [`hide_keys::MISS_REFRESH_GAP`]); a retired
    /// one re-reads only when no re-read started within that gap and is
    /// otherwise refused at once.
    async fn learning_hide_keys<T, F, Fut>(&self, call: F) -> Result<T, Error>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        let first = call().await;
        let (Err(Error::Hidden { key, .. }), Some(rings)) = (&first, &self.hide_keys) else {
            return first;
        };
        if rings.issues(key) || !rings.has_master() {
            return first;
        }
        if rings.is_retired(key) {
            rings.refresh_if_due().await;
        } else {
            rings.refresh_on_miss().await;
        }
        if !rings.issues(key) {
            return first;
        }
        call().await
    }

    /// Shows snowflake IDs through `hidden` (`layout.hide`); the generator
    /// composes them under its effective layout.
    pub fn with_hidden_snowflakes(mut self, hidden: snowflake::HiddenSnowflakes) -> Self {
        self.snowflakes.set_hidden(hidden);
        self
    }

    /// Serves segment mode through `segments`.
    pub fn with_segments(mut self, segments: Arc<SegmentEngine>) -> Self {
        self.segments = Some(segments);
        self
    }

    /// Serves lease mode through `leases`.
    pub fn with_leases(mut self, leases: Arc<LeaseEngine>) -> Self {
        let fenced = Arc::clone(&leases);
        self.gate.on_fence(move || fenced.fence());
        self.leases = Some(leases);
        self
    }

    /// Serves strict mode through `strict`.
    pub fn with_strict(mut self, strict: Arc<StrictEngine>) -> Self {
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
        self.gate.close();
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
    pub fn leases(&self) -> Option<&Arc<LeaseEngine>> {
        self.leases.as_ref()
    }

    /// The strict mode server, when enabled.
    pub fn strict(&self) -> Option<&Arc<StrictEngine>> {
        self.strict.as_ref()
    }

    /// The segment mode server, when enabled.
    pub fn segment_server(&self) -> Option<&Arc<SegmentEngine>> {
        self.segments.as_ref()
    }

    fn lease_mode(&self, tag: &str) -> Result<&Arc<LeaseEngine>, Error> {
        let leases = self
            .leases
            .as_ref()
            .ok_or(RequestError::ModeNotEnabled(Mode::Lease))?;
        if !tag.is_empty() {
            return Err(RequestError::UnexpectedTag(Mode::Lease).into());
        }
        Ok(leases)
    }

    fn strict_mode(&self, tag: &str) -> Result<&Arc<StrictEngine>, Error> {
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
    fn segments(&self, mode: Mode, tag: &str) -> Result<(&Arc<SegmentEngine>, Tag), Error> {
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
    pub fn with_formats(mut self, formats: Arc<formatted::FormattedEngine>) -> Self {
        let fenced = Arc::clone(&formats);
        self.gate.on_fence(move || fenced.fence());
        self.formats = Some(formats);
        self
    }

    /// Formatted mode over `catalog`'s engine; a call naming a format
    /// this node does not serve yet has the catalog reload first (another
    /// node may have just defined it).
    pub fn with_catalog(self, catalog: Arc<format_catalog::FormatCatalog>) -> Self {
        let mut issuer = self.with_formats(Arc::clone(catalog.formats()));
        issuer.catalog = Some(catalog);
        issuer
    }

    /// Makes sure this node knows format `name` if any node defined it:
    /// when it serves no such format, the catalog reloads (at most once
    /// per [`format_catalog::MISS_RELOAD_GAP`]) instead of waiting for its
    /// watch. Every formatted call of the Issuer (issue, parse, counter)
    /// runs it first, so the front ends never do.
    async fn learn_format(&self, name: &str) {
        let (Some(catalog), Some(formats)) = (&self.catalog, &self.formats) else {
            return;
        };
        if formats.get(name).is_err() {
            catalog.reload_on_miss().await;
        }
    }

    /// Formatted mode's engine, when formats are defined.
    pub fn formats(&self) -> Option<&Arc<formatted::FormattedEngine>> {
        self.formats.as_ref()
    }

    fn formats_for(&self, name: &str) -> Result<&Arc<formatted::FormattedEngine>, Error> {
        self.formats.as_ref().ok_or_else(|| {
            StoreError::Format(FormatError::NotFound(name.chars().take(80).collect())).into()
        })
    }

    /// Issues `count` IDs of format `name` (`GenFormatted`). Refused, like
    /// every mode, once the state file is lost or the worker id is lost.
    pub async fn gen_formatted(
        &self,
        name: &str,
        params: &[(String, String)],
        count: u64,
    ) -> Result<formatted::Issued, Error> {
        self.check_state_file()?;
        self.learn_format(name).await;
        let formats = self.formats_for(name)?;
        self.learning_hide_keys(|| async {
            self.gate.check()?;
            // Checked here like every mode's batch (after the gate, where
            // the engine checked it before, so a call both fenced and too
            // large is still refused as fenced).
            let count = check_count(count, self.max_batch)?;
            formats
                .generate(name, params, count, self.gate.node_number())
                .await
        })
        .await
    }

    /// Splits an ID of format `name` into its fields (`ParseFormatted`),
    /// after learning the format if another node defined it moments ago
    /// (`learn_format`), as issuing does.
    pub async fn parse_formatted(
        &self,
        name: &str,
        id: &str,
    ) -> Result<crate::id::format::ParsedId, Error> {
        self.learn_format(name).await;
        self.formats_for(name)?.parse(name, id)
    }

    /// [`parse_formatted`](Self::parse_formatted) for a caller, with the
    /// view of a hidden counter (`{seq:N:hidden}`, `hide = true`; `None`
    /// for a plain format): its key version to anyone, and the internal
    /// counter only to an admin caller (`who`), logged on `idgen::audit`.
    /// Learns the format first, so no front end has to.
    pub async fn parse_formatted_as(
        &self,
        name: &str,
        id: &str,
        who: Option<&str>,
    ) -> Result<(crate::id::format::ParsedId, Option<formatted::HiddenView>), Error> {
        self.learn_format(name).await;
        let formats = self.formats_for(name)?;
        let parsed = formats.parse(name, id)?;
        let view = formats.hidden_view(name, parsed.seq, who.is_some())?;
        if let (Some(who), Some(v)) = (who, view) {
            if let Some(internal) = v.internal {
                tracing::info!(
                    target: "idgen::audit",
                    who,
                    format = %name,
                    id = %id,
                    key_version = v.key_version,
                    internal,
                    "hidden ID decoded"
                );
                metrics::counter!(crate::metrics::HIDDEN_REVEALS, "mode" => "formatted")
                    .increment(1);
            }
        }
        Ok((parsed, view))
    }

    /// A counter's durable record (`GetFormatCounter`); per-node formats
    /// show this node's counter. A hidden format's record is its internal
    /// value (how many IDs it issued, which hiding exists to keep from
    /// strangers), so it is answered only to an admin caller (`who`),
    /// logged on `idgen::audit` like a decode, and refused as
    /// [`Error::AdminOnly`] to anyone else before anything is read.
    pub async fn format_counter(
        &self,
        name: &str,
        params: &[(String, String)],
        who: Option<&str>,
    ) -> Result<Option<formatted::CounterView>, Error> {
        let node = self.gate.node_number();
        self.learn_format(name).await;
        let formats = self.formats_for(name)?;
        let hidden = formats.get(name)?.hides_counter();
        if hidden && who.is_none() {
            return Err(Error::AdminOnly {
                what: format!("the counter of hidden format {name:?}"),
            });
        }
        let view = formats.counter(name, params, node).await?;
        if let (true, Some(who)) = (hidden, who) {
            tracing::info!(
                target: "idgen::audit",
                who,
                format = %name,
                period = view.as_ref().map(|v| v.record.period.0),
                last = view.as_ref().map(|v| v.record.last),
                "hidden format counter read"
            );
            metrics::counter!(crate::metrics::HIDDEN_REVEALS, "mode" => "formatted").increment(1);
        }
        Ok(view)
    }

    /// Every counter of format `name` at a glance (the console's "Counter
    /// now"): [`FormattedEngine::counter_overview`](formatted::FormattedEngine::counter_overview),
    /// read by the admin `who` and audit-logged for a hidden format like
    /// [`Issuer::format_counter`].
    pub async fn format_counter_overview(
        &self,
        name: &str,
        who: &str,
    ) -> Result<formatted::CounterOverview, Error> {
        let node = self.gate.node_number();
        self.learn_format(name).await;
        let formats = self.formats_for(name)?;
        let overview = formats.counter_overview(name, node).await?;
        if formats.get(name)?.hides_counter() {
            let view = match &overview {
                formatted::CounterOverview::Single(v) => v.as_ref(),
                formatted::CounterOverview::Scoped { .. } => None,
            };
            tracing::info!(
                target: "idgen::audit",
                who,
                format = %name,
                period = view.map(|v| v.record.period.0),
                last = view.map(|v| v.record.last),
                "hidden format counter read"
            );
            metrics::counter!(crate::metrics::HIDDEN_REVEALS, "mode" => "formatted").increment(1);
        }
        Ok(overview)
    }

    /// The generator in use now.
    pub fn generator(&self) -> Arc<Snowflake> {
        self.gate.generator()
    }

    /// The gate every snowflake, lease and formatted call passes; the
    /// cluster supervisor fences it, moves its deadline and installs the
    /// generator of a re-claimed worker id.
    pub fn gate(&self) -> &Arc<IssueGate> {
        &self.gate
    }

    /// Sets the worker lock's deadline: past `at`, snowflake, lease and
    /// formatted calls are refused as fenced until a later deadline is
    /// set. Called after every successful renew and on every claim.
    pub fn set_lock_deadline(&self, at: Instant) {
        self.gate.set_deadline(at);
    }

    /// Whether the node is fenced (lost its worker id, not yet re-claimed).
    pub fn is_fenced(&self) -> bool {
        self.gate.is_fenced()
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
        self.learning_hide_keys(|| async {
            match self.route(mode, tag)? {
                Route::Segment(segments, tag) => segments.take_one(&tag).await,
                Route::Lease(leases) => leases.take_one().await,
                Route::Strict(strict) => Ok(strict.take(tag, 1).await?.first),
                Route::Snowflake => self.snowflakes.take_one().await,
            }
        })
        .await
    }

    /// `count` IDs (fewer only at a segment tag's end, rule 37), in the
    /// order `GenIdsResponse` documents per mode: a hidden namespace's are
    /// not increasing.
    pub async fn gen_ids(&self, mode: Mode, tag: &str, count: u64) -> Result<Vec<u64>, Error> {
        let count = check_count(count, self.max_batch)?;
        self.learning_hide_keys(|| async {
            match self.route(mode, tag)? {
                Route::Segment(segments, tag) => segments.take(&tag, count as usize).await,
                Route::Lease(leases) => leases.take(count as usize).await,
                Route::Strict(strict) => {
                    Ok(strict.take(tag, u64::from(count)).await?.iter().collect())
                }
                Route::Snowflake => self.snowflakes.take(count as usize).await,
            }
        })
        .await
    }

    /// Issues `count` UUIDv7 (`GenUuid`, `GenUuids`, `/v1/uuid`,
    /// `/v1/uuids`): from the snowflake generator's clock and mark, refused
    /// where a snowflake call is (state file lost, node fenced).
    pub async fn gen_uuids(&self, count: u64) -> Result<Vec<crate::id::Uuid>, Error> {
        let count = check_count(count, self.max_batch)?;
        self.check_state_file()?;
        self.gate.check()?;
        self.learning_hide_keys(|| self.uuids.take(count as usize))
            .await
    }

    /// Issues one UUIDv7 (`GenUuid`, `/v1/uuid`): what
    /// [`gen_uuids`](Self::gen_uuids) of one issues, refused where it is,
    /// without a Vec ([`uuid::UuidEngine::take_one`]).
    pub async fn gen_uuid(&self) -> Result<crate::id::Uuid, Error> {
        self.check_state_file()?;
        self.gate.check()?;
        self.learning_hide_keys(|| self.uuids.take_one()).await
    }

    /// Shows UUIDs as `hiding` says (the layout's `hide`).
    pub fn with_uuid_hiding(mut self, hiding: self::uuid::UuidHiding) -> Self {
        self.uuids.set_hiding(hiding);
        self
    }

    /// Splits UUID text (canonical, 32 hex digits or ULID) into its parts
    /// under this node's layout (`DecodeUuid`, `/v1/uuid/decode`): the
    /// public view of a hidden UUID (see
    /// [`decode_uuid_as`](Self::decode_uuid_as)).
    pub fn decode_uuid(&self, text: &str) -> Result<self::uuid::DecodedUuid, Error> {
        self.decode_uuid_as(text, None)
    }

    /// [`decode_uuid`](Self::decode_uuid) for a caller: a UUID of a hidden
    /// layout gives an admin caller (`who`) the internal UUID and its
    /// parts, logged on `idgen::audit`; anyone else gets its time and key
    /// version.
    pub fn decode_uuid_as(
        &self,
        text: &str,
        who: Option<&str>,
    ) -> Result<self::uuid::DecodedUuid, Error> {
        let uuid = crate::id::Uuid::parse(text.trim())?;
        let decoded = self.uuids.decode(&self.layout, uuid, who.is_some())?;
        if let (Some(who), Some(internal)) = (who, &decoded.internal_uuid) {
            tracing::info!(
                target: "idgen::audit",
                who,
                mode = "uuid",
                uuid = %decoded.uuid,
                key_version = decoded.key_version,
                internal = %internal,
                "hidden uuid decoded"
            );
            metrics::counter!(crate::metrics::HIDDEN_REVEALS, "mode" => "uuid").increment(1);
        }
        Ok(decoded)
    }

    /// The one check of a `GenId`/`GenIds` call before any value is taken
    /// (the count is checked before it): the state file is kept, the mode
    /// is served here, the tag or strict key fits it, and the gate is open
    /// for the gated modes. Both calls route through it, so a rule added
    /// here holds for one ID and for a batch alike.
    fn route(&self, mode: Mode, tag: &str) -> Result<Route<'_>, Error> {
        self.check_state_file()?;
        match mode {
            Mode::Segment => {
                let (segments, tag) = self.segments(mode, tag)?;
                return Ok(Route::Segment(segments, tag));
            }
            Mode::Lease => {
                let leases = self.lease_mode(tag)?;
                self.gate.check()?;
                return Ok(Route::Lease(leases));
            }
            Mode::Strict => return Ok(Route::Strict(self.strict_mode(tag)?)),
            Mode::Snowflake => {}
        }
        Self::check_mode(mode, tag)?;
        self.gate.check()?;
        Ok(Route::Snowflake)
    }

    /// [`decode`](Self::decode) for a caller: an ID of a hidden snowflake
    /// layout, of this node's hidden lease zone, or of hidden segment tag
    /// `tag` (mode segment only) gives an admin caller (`who`) the internal
    /// parts, and the answer is logged on `idgen::audit`; anyone else gets
    /// the public view.
    pub async fn decode_as(
        &self,
        mode: Mode,
        id: u64,
        tag: &str,
        who: Option<&str>,
    ) -> Result<Decoded, Error> {
        let reveal = who.is_some();
        if !tag.is_empty() && mode != Mode::Segment {
            return Err(RequestError::UnexpectedTag(mode).into());
        }
        let decoded = match (mode, self.snowflakes.hidden(), &self.leases) {
            (Mode::Segment, _, _) if !tag.is_empty() => {
                let (segments, tag) = self.segments(mode, tag)?;
                segments.decode(&tag, id, reveal).await?
            }
            (Mode::Snowflake, Some(h), _) => h.decode(&self.layout, id, reveal)?,
            (Mode::Snowflake, None, _) => decode_snowflake(&self.layout, id)?,
            (Mode::Lease, _, Some(leases)) => leases.decode(id, reveal)?,
            // The layout is fixed: lease IDs decode on any node.
            (Mode::Lease, _, None) => decode_lease(id).map_err(crate::store::StoreError::from)?,
            (Mode::Segment | Mode::Strict, _, _) => {
                return Err(RequestError::NothingToDecode(mode).into())
            }
        };
        if let (Some(who), Some(internal)) = (who, decoded.internal_id) {
            tracing::info!(
                target: "idgen::audit",
                who,
                mode = decoded.mode,
                tag = (!tag.is_empty()).then_some(tag),
                id,
                key_version = decoded.key_version,
                internal,
                "hidden {} ID decoded",
                decoded.mode
            );
            metrics::counter!(crate::metrics::HIDDEN_REVEALS, "mode" => decoded.mode).increment(1);
        }
        Ok(decoded)
    }

    /// Splits `id` into its parts under the configured layout: the public
    /// view of a hidden ID (see [`decode_as`](Self::decode_as)).
    pub async fn decode(&self, mode: Mode, id: u64) -> Result<Decoded, Error> {
        self.decode_as(mode, id, "", None).await
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::error::Refusal;
    use crate::id::{Preset, StartPlan, SystemClock, DEFAULT_EPOCH_MS};

    /// An issuer over a fresh Twitter-layout generator (node 1).
    pub(crate) fn issuer() -> (Issuer, Arc<Snowflake>) {
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

    /// An issuer serving snowflake, lease and formatted mode, on an
    /// embedded store in a temporary directory.
    fn gated_issuer() -> (tempfile::TempDir, Issuer, Arc<Snowflake>) {
        use crate::id::format::{FormatDef, Reset};
        use crate::store::lease::EmbeddedLeaseTokens;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::EmbeddedStore::create(&dir.path().join("s.redb"), "l").unwrap();
        let tokens = EmbeddedLeaseTokens::new(store.clone(), 1, 5, (5, 9)).unwrap();
        let leases = Arc::new(lease::LeaseEngine::new(
            Arc::new(tokens),
            lease::LeaseSettings {
                block: 10,
                max_wait: Duration::from_secs(5),
            },
        ));
        let settings = formatted::FormatSettings::for_tests(10, 10);
        let def = FormatDef::template("order", "{seq:6}", "UTC", Reset::Never);
        let clock: Arc<dyn Clock> = Arc::new(crate::id::SystemClock);
        let formats =
            formatted::FormattedEngine::new(&[def], Arc::new(store), clock, settings, 1).unwrap();
        let (issuer, g) = issuer();
        let issuer = issuer.with_leases(leases).with_formats(Arc::new(formats));
        (dir, issuer, g)
    }

    /// Each gated mode's answer to one call: `Ok` or the error.
    async fn serve_each(issuer: &Issuer) -> [Result<(), Error>; 3] {
        ask_each(issuer, 3).await
    }

    /// Each gated mode's answer to a call for `count` IDs.
    async fn ask_each(issuer: &Issuer, count: u64) -> [Result<(), Error>; 3] {
        [
            issuer.gen_ids(Mode::Snowflake, "", count).await.map(drop),
            issuer.gen_ids(Mode::Lease, "", count).await.map(drop),
            issuer.gen_formatted("order", &[], count).await.map(drop),
        ]
    }

    /// Issue 34 item 5: `GenId` and `GenIds` pass one check
    /// ([`Issuer::route`]), so every request one refuses, the other
    /// refuses with the same error, in every mode.
    #[tokio::test]
    async fn one_id_and_a_batch_pass_the_same_check() {
        let (_dir, issuer, _) = gated_issuer();
        let refused = |mode, tag: &'static str, want: RequestError| (mode, tag, want);
        let cases = [
            refused(
                Mode::Snowflake,
                "t",
                RequestError::UnexpectedTag(Mode::Snowflake),
            ),
            refused(Mode::Lease, "t", RequestError::UnexpectedTag(Mode::Lease)),
            refused(
                Mode::Segment,
                "t",
                RequestError::ModeNotEnabled(Mode::Segment),
            ),
            refused(
                Mode::Strict,
                "k",
                RequestError::ModeNotEnabled(Mode::Strict),
            ),
        ];
        for (mode, tag, want) in cases {
            let one = issuer.gen_id(mode, tag).await.map(drop);
            let batch = issuer.gen_ids(mode, tag, 2).await.map(drop);
            let is_want = |r: &Result<_, Error>| matches!(r, Err(Error::Request(e)) if *e == want);
            assert!(
                is_want(&one) && is_want(&batch),
                "{mode}: {one:?} / {batch:?}"
            );
        }
        for mode in [Mode::Snowflake, Mode::Lease] {
            assert!(issuer.gen_id(mode, "").await.is_ok(), "{mode}");
            assert!(issuer.gen_ids(mode, "", 2).await.is_ok(), "{mode}");
        }
        issuer.gate().fence();
        for mode in [Mode::Snowflake, Mode::Lease] {
            let one = issuer.gen_id(mode, "").await;
            let batch = issuer.gen_ids(mode, "", 2).await;
            assert!(
                matches!((&one, &batch), (Err(Error::Fenced), Err(Error::Fenced))),
                "{mode}: {one:?} / {batch:?}"
            );
        }
    }

    /// Issue 34 item 5: a refusal by a mode's rules reaches the front
    /// ends as [`Error::Refused`], not inside a `StoreError`, whether the
    /// Issuer, an engine or the format itself refused.
    #[tokio::test]
    async fn a_formatted_refusal_reaches_the_front_ends_as_refused() {
        let (_dir, issuer, _) = gated_issuer();
        let unknown = issuer.gen_formatted("nope", &[], 1).await;
        let bad = issuer.parse_formatted_as("order", "x", None).await;
        let (plain, _) = self::issuer(); // no formatted mode
        let none = plain.parse_formatted("order", "000001").await;
        for r in [unknown.map(drop), bad.map(drop), none.map(drop)] {
            assert!(
                matches!(r, Err(Error::Refused(Refusal::Format(_)))),
                "{r:?}"
            );
        }
    }

    /// Issue 34 item 5: the Issuer checks the batch size of every mode
    /// against its own `max_batch` (100 here), formatted mode included.
    /// Before, a formatted call was checked only by the engine, against
    /// a limit of its own that the node's assembly had to keep equal.
    #[tokio::test]
    async fn the_issuer_checks_every_modes_batch_size() {
        let (_dir, issuer, _) = gated_issuer();
        for got in [0, 101, u64::MAX] {
            for (mode, r) in ["snowflake", "lease", "formatted"]
                .into_iter()
                .zip(ask_each(&issuer, got).await)
            {
                let refused = matches!(
                    r,
                    Err(Error::Request(RequestError::BadCount { got: g, max: 100 })) if g == got
                );
                assert!(refused, "{mode}, {got}: {r:?}");
            }
        }
        for (mode, r) in ["snowflake", "lease", "formatted"]
            .into_iter()
            .zip(ask_each(&issuer, 100).await)
        {
            assert!(r.is_ok(), "{mode}, the largest batch: {r:?}");
        }
    }

    #[tokio::test]
    async fn the_gate_refuses_every_mode_while_fenced() {
        let (_dir, issuer, _) = gated_issuer();
        for r in serve_each(&issuer).await {
            assert!(r.is_ok(), "open gate: {r:?}");
        }
        issuer.gate().fence();
        for (mode, r) in ["snowflake", "lease", "formatted"]
            .into_iter()
            .zip(serve_each(&issuer).await)
        {
            assert!(matches!(r, Err(Error::Fenced)), "{mode}: {r:?}");
        }
    }

    #[tokio::test]
    async fn the_gate_refuses_every_mode_past_the_lock_deadline() {
        let (_dir, issuer, g) = gated_issuer();
        issuer
            .gate()
            .set_deadline(Instant::now() + Duration::from_millis(20));
        // Bounded wait for the coarse clock to pass the deadline.
        let mut refused = false;
        for _ in 0..400 {
            if issuer.gate().check().is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(refused, "the deadline never passed");
        for (mode, r) in ["snowflake", "lease", "formatted"]
            .into_iter()
            .zip(serve_each(&issuer).await)
        {
            assert!(matches!(r, Err(Error::Fenced)), "{mode}: {r:?}");
        }
        assert!(!issuer.is_fenced() && !g.is_closed(), "the deadline alone");
    }

    #[tokio::test]
    async fn a_reclaimed_node_serves_every_mode_again() {
        let (_dir, issuer, g) = gated_issuer();
        issuer.gate().fence();
        assert!(g.is_closed(), "fencing closes the generator");
        // The re-claim: a new generator above the old one's IDs, a later
        // deadline, and lease mode's source under the new session.
        let now_ms = crate::id::SystemClock.now_millis();
        let layout = *g.layout();
        let plan = crate::id::StartPlan::new(&layout, now_ms, None, 0).unwrap();
        let next = Arc::new(Snowflake::new(layout, 0, 2, 1000, plan, now_ms + 600_000).unwrap());
        issuer.gate().install(next);
        issuer
            .gate()
            .set_deadline(Instant::now() + Duration::from_secs(60));
        let leases = issuer.leases().unwrap();
        let dir2 = tempfile::tempdir().unwrap();
        let store = crate::store::EmbeddedStore::create(&dir2.path().join("s.redb"), "l").unwrap();
        let tokens = crate::store::lease::EmbeddedLeaseTokens::new(store, 1, 5, (5, 9)).unwrap();
        leases.install(Arc::new(tokens));
        for (mode, r) in ["snowflake", "lease", "formatted"]
            .into_iter()
            .zip(serve_each(&issuer).await)
        {
            assert!(r.is_ok(), "{mode}: {r:?}");
        }
        assert_eq!(issuer.gate().node_number(), 2, "the new worker id's number");
    }
}
