//! Segment mode serving: per tag, two ranges in memory (Leaf's double
//! buffer), refilled in the background.
//!
//! Calls take IDs from the current range under a short lock and never wait
//! on the store while a range has IDs. Once the current range is 10% used
//! and no next range is held, one background fetch takes the next range
//! from the store (never two at once for a tag). The step adapts: a range
//! used up in under 15 minutes doubles the next step (up to `max_step`),
//! one that lasted over 30 minutes halves it (never below the tag's own
//! step). While the store is down the node serves from what it holds; only
//! with both ranges empty does a call fail, naming the tag.
//!
//! Buffers do not live forever: a tag deleted here (admin API), or found
//! deleted by a fetch (deleted on another node), has its buffers dropped,
//! and so has a tag unused for `segment.idle_release` (a sweep every
//! quarter of it; calls only set a flag, they never read the clock for
//! this). The unused rest of a dropped range is a gap, never reused: the
//! next call takes a fresh range from the store, above it.
//!
//! A tag created with `hide` shows each ID through its hider
//! ([`super::hidden`]), checked before an ID is taken and applied after:
//! the ranges are the same as for a plain tag.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::hidden::{self, HiddenOutput, RevealError};
use super::hide_keys::HideKeyRings;
use super::refill::{self, Refill};
use crate::error::{Error, Refusal};
use crate::id::buffer::{DoubleBuffer, Prefetch};
use crate::id::decode::Decoded;
use crate::id::hide::IntHider;
use crate::id::segment::SegmentError;
use crate::id::segment::{next_step, Range, Tag, TagHide, TagRecord};
use crate::id::Clock;
use crate::id::RequestError;
use crate::metrics as m;
use crate::store::{CreateTag, SegmentStore, StoreError};

/// Segment mode settings.
#[derive(Debug, Clone, Copy)]
pub struct SegmentSettings {
    /// Create unknown tags on first use (with `default_step`).
    pub auto_create: bool,
    /// Step of auto-created tags.
    pub default_step: u64,
    /// Cap of the dynamic step.
    pub max_step: u64,
    /// Longest a call waits for a range when both buffers are empty.
    pub max_wait: Duration,
    /// Most live tags (`segment.max_tags`), checked when one is created.
    pub max_tags: u64,
    /// A tag unused on this node for this long has its buffers dropped
    /// (`segment.idle_release`).
    pub idle_release: Duration,
}

/// Prefetch once the current range is 10% used (Leaf's rule).
const PREFETCH: Prefetch = Prefetch {
    at_per_mille: 100,
    retry: FETCH_RETRY,
};
/// After a failed fetch, the next background attempt waits this long.
const FETCH_RETRY: Duration = Duration::from_millis(500);

struct State {
    buffer: DoubleBuffer<Range>,
    step: u64,
    /// Set when the store answered that the tag reached its largest ID:
    /// no range will ever come again (rule 37), so a call takes what is
    /// buffered and returns it instead of waiting.
    end: Option<SegmentError>,
}

/// One tag's double buffer.
pub struct TagBuffer {
    tag: Tag,
    floor_step: u64,
    state: Mutex<State>,
    filled: Notify,
    /// Set by every call, cleared by the idle sweep: one relaxed store on
    /// the hot path, no clock read.
    used: AtomicBool,
    /// When the idle sweep last saw it used (Unix ms).
    seen_ms: AtomicU64,
    /// Set when the tag was found deleted: calls waiting on this buffer
    /// answer NOT_FOUND instead of waiting for a range that cannot come.
    deleted: AtomicBool,
    /// The store metrics of range fetches (shared by every tag).
    store_op: m::StoreOp,
    /// A hidden tag's output (from its record's `hide`).
    hide: Option<Arc<HiddenOutput<IntHider>>>,
    /// A hidden tag's widths and key (its record's `hide`): the public
    /// view of a decode reads the key version with them.
    hide_setting: Option<TagHide>,
}

impl TagBuffer {
    fn new(
        tag: Tag,
        record: &TagRecord,
        store_op: &m::StoreOp,
        rings: &Option<HideKeyRings>,
    ) -> Self {
        let hide = record.hide.as_ref().map(|h| tag_output(&tag, h, rings));
        Self {
            tag,
            floor_step: record.step,
            state: Mutex::new(State {
                buffer: DoubleBuffer::new(PREFETCH),
                step: record.step,
                end: None,
            }),
            filled: Notify::new(),
            used: AtomicBool::new(true),
            seen_ms: AtomicU64::new(0),
            deleted: AtomicBool::new(false),
            store_op: store_op.clone(),
            hide,
            hide_setting: record.hide.clone(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The step the next fetch will use.
    pub fn step(&self) -> u64 {
        self.state().step
    }

    /// Takes up to `want` IDs from memory into `out`. Returns whether a
    /// background fetch should start (and marks it started).
    fn take_local(&self, want: usize, out: &mut Vec<u64>, clock: &dyn Clock) -> bool {
        let mut st = self.state();
        // The clock is read only at a range switch.
        st.buffer.take(want, out, &mut || clock.now_millis());
        st.buffer.claim_fetch(std::time::Instant::now)
    }

    /// One ID from the current range when it has one (no switch, no
    /// allocation, no clock read); otherwise `None` and the caller takes
    /// the long way. Also says whether to start a background fetch.
    fn take_one_local(&self) -> (Option<u64>, bool) {
        let mut st = self.state();
        let id = st.buffer.take_one();
        if id.is_none() {
            return (None, false);
        }
        (id, st.buffer.claim_fetch(std::time::Instant::now))
    }

    /// Fetches the next range into the buffer (the caller marked it
    /// started). Wakes waiting calls either way.
    async fn fetch(
        &self,
        store: &dyn SegmentStore,
        settings: &SegmentSettings,
        clock: &dyn Clock,
    ) -> Result<(), Error> {
        let now_ms = clock.now_millis();
        let step = {
            let mut st = self.state();
            if let Some(lasted) = st.buffer.take_lasted() {
                st.step = next_step(st.step, self.floor_step, settings.max_step, lasted);
            }
            st.step
        };
        let started = std::time::Instant::now();
        let result = store.take_range(&self.tag, step, now_ms).await;
        self.store_op.took(started);
        let outcome = {
            let mut st = self.state();
            match result {
                Ok(range) => {
                    st.buffer.fetched(range);
                    Ok(())
                }
                Err(e) => {
                    st.buffer.fetch_failed(std::time::Instant::now());
                    self.store_op.failed();
                    if let StoreError::Segment(end @ SegmentError::Exhausted { .. }) = &e {
                        st.end = Some(end.clone());
                    }
                    Err(Error::from(e))
                }
            }
        };
        self.filled.notify_waiters();
        outcome
    }
}

/// The output a hidden tag shows its IDs through.
fn tag_output(
    tag: &Tag,
    hide: &TagHide,
    rings: &Option<HideKeyRings>,
) -> Arc<HiddenOutput<IntHider>> {
    hidden::int_output(
        format!("segment tag {:?}", tag.as_str()),
        &hide.key,
        rings.clone(),
        hide.version_bits,
        hide.domain_bits,
    )
}

/// What `hidden` says of a hidden segment tag's decoded ID.
pub const HIDDEN_TAG: &str = "tag";

/// Serves segment mode for every tag this node has seen.
pub struct SegmentEngine {
    store: Arc<dyn SegmentStore>,
    clock: Arc<dyn Clock>,
    settings: SegmentSettings,
    tags: RwLock<HashMap<Tag, Arc<TagBuffer>>>,
    issued: metrics::Counter,
    store_op: m::StoreOp,
    /// The hide key rings hidden tags use (`None`: no keys loaded).
    rings: Option<HideKeyRings>,
}

impl SegmentEngine {
    /// Segment mode over `store`.
    pub fn new(
        store: Arc<dyn SegmentStore>,
        clock: Arc<dyn Clock>,
        settings: SegmentSettings,
    ) -> Self {
        Self {
            store,
            clock,
            settings,
            tags: RwLock::new(HashMap::new()),
            issued: metrics::counter!(m::IDS_ISSUED, "mode" => crate::id::Mode::Segment.as_str()),
            store_op: m::StoreOp::new(m::label::BACKEND_SEGMENT, m::label::OP_TAKE_RANGE),
            rings: None,
        }
    }

    /// Serves hidden tags with the keys of `rings`.
    pub fn with_hide_rings(mut self, rings: HideKeyRings) -> Self {
        self.rings = Some(rings);
        self
    }

    /// The buffer of `tag`, loading (or auto-creating) its record once.
    pub async fn buffer(&self, tag: &Tag) -> Result<Arc<TagBuffer>, Error> {
        if let Some(b) = self
            .tags
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(tag)
        {
            b.used.store(true, Ordering::Relaxed);
            return Ok(Arc::clone(b));
        }
        let record = match self.store.get_tag(tag).await? {
            Some(r) => r,
            None if self.settings.auto_create => {
                let r = TagRecord::new(
                    0,
                    self.settings.default_step,
                    "auto-created",
                    self.clock.now_millis(),
                )
                .map_err(StoreError::from)?;
                match self
                    .store
                    // A deleted tag is refused, not re-created with defaults.
                    .create_tag(tag, &r, CreateTag::auto(self.settings.max_tags))
                    .await
                {
                    Ok(_) => tracing::info!(%tag, step = r.step, "segment tag auto-created"),
                    Err(StoreError::Segment(SegmentError::TagExists(_))) => {}
                    Err(e) => return Err(e.into()),
                }
                self.store.get_tag(tag).await?.ok_or_else(|| {
                    StoreError::Segment(SegmentError::TagNotFound(tag.to_string()))
                })?
            }
            None => {
                return Err(StoreError::Segment(SegmentError::TagNotFound(tag.to_string())).into())
            }
        };
        let mut tags = self
            .tags
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let buffer = Arc::clone(tags.entry(tag.clone()).or_insert_with(|| {
            Arc::new(TagBuffer::new(
                tag.clone(),
                &record,
                &self.store_op,
                &self.rings,
            ))
        }));
        buffer
            .seen_ms
            .store(self.clock.now_millis(), Ordering::Relaxed);
        metrics::gauge!(m::SEGMENT_TAG_BUFFERS).set(tags.len() as f64);
        Ok(buffer)
    }

    /// Drops the buffers of `tag` from memory (the tag was deleted, here
    /// or on another node): their unused IDs become a gap, never reused,
    /// and a tag created again starts from the store's record. Returns
    /// whether this node held any.
    pub fn release(&self, tag: &Tag, reason: &'static str) -> bool {
        let removed = {
            let mut tags = self
                .tags
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let removed = tags.remove(tag);
            metrics::gauge!(m::SEGMENT_TAG_BUFFERS).set(tags.len() as f64);
            removed
        };
        let removed = removed.is_some_and(|buffer| {
            buffer.deleted.store(true, Ordering::Relaxed);
            buffer.filled.notify_waiters();
            true
        });
        self.store.release(tag);
        if removed {
            metrics::counter!(m::SEGMENT_BUFFERS_RELEASED, "reason" => reason).increment(1);
            tracing::debug!(%tag, reason, "segment tag buffers released");
        }
        removed
    }

    /// Drops the buffers of tags not used since the previous sweep for
    /// `segment.idle_release`; returns how many. The next call on such a
    /// tag takes a fresh range above everything this node held.
    pub fn sweep_idle(&self) -> usize {
        let now_ms = self.clock.now_millis();
        let idle_ms = u64::try_from(self.settings.idle_release.as_millis()).unwrap_or(u64::MAX);
        let idle: Vec<Tag> = {
            let tags = self
                .tags
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            tags.values()
                .filter(|b| {
                    if b.used.swap(false, Ordering::Relaxed) {
                        b.seen_ms.store(now_ms, Ordering::Relaxed);
                        return false;
                    }
                    now_ms.saturating_sub(b.seen_ms.load(Ordering::Relaxed)) >= idle_ms
                })
                .map(|b| b.tag.clone())
                .collect()
        };
        let mut released = 0;
        for tag in idle {
            let mut tags = self
                .tags
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Used again since it was looked at: keep it.
            if tags
                .get(&tag)
                .is_some_and(|b| !b.used.load(Ordering::Relaxed))
            {
                tags.remove(&tag);
                released += 1;
                metrics::gauge!(m::SEGMENT_TAG_BUFFERS).set(tags.len() as f64);
                drop(tags);
                self.store.release(&tag);
                metrics::counter!(m::SEGMENT_BUFFERS_RELEASED, "reason" => m::label::REASON_IDLE)
                    .increment(1);
            }
        }
        released
    }

    /// The live-tag limit creations are checked against (`segment.max_tags`).
    pub fn max_tags(&self) -> u64 {
        self.settings.max_tags
    }

    /// Tags whose buffers this node holds.
    pub fn buffered_tags(&self) -> usize {
        self.tags
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Tags in memory whose current and next ranges are both empty (calls
    /// on them wait for the store).
    pub fn tags_without_runway(&self) -> usize {
        let tags = self
            .tags
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tags.values()
            .filter(|b| b.state().buffer.buffered() == 0)
            .count()
    }

    /// Runs [`sweep_idle`](Self::sweep_idle) in the background, a few
    /// times per `idle_release`, until `self` is dropped.
    pub fn spawn_idle_sweeper(self: &Arc<Self>) {
        let period = (self.settings.idle_release / 4)
            .clamp(Duration::from_millis(250), Duration::from_secs(60));
        let this: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(segments) = this.upgrade() else {
                    return;
                };
                segments.sweep_idle();
            }
        });
    }

    /// `count` IDs of `tag`: strictly increasing for a plain tag; a hidden
    /// tag's are its increasing internal IDs shown through its keyed
    /// permutation, so in no order. Waits on the store only when both
    /// ranges are empty, and then at most `max_wait`; IDs taken before a
    /// failure are dropped, never reused. At the end of the tag's ID space
    /// (rule 37) the call returns the tag's last IDs, fewer than `count`,
    /// and the next call is refused as exhausted.
    pub async fn take(self: &Arc<Self>, tag: &Tag, count: usize) -> Result<Vec<u64>, Error> {
        let buffer = self.buffer(tag).await?;
        // A hidden tag that cannot show IDs now is refused before any is
        // taken: nothing reserved is lost.
        let hider = buffer.hide.as_ref().map(|h| h.ready()).transpose()?;
        let refill = TagRefill {
            segments: self,
            buffer: &buffer,
        };
        let mut ids = refill::take(&refill, count, self.settings.max_wait, FETCH_RETRY, || {
            self.fetch_in_background(&buffer)
        })
        .await?;
        if let Some(hider) = &hider {
            hider.hide_all(&mut ids)?;
        }
        self.issued.increment(ids.len() as u64);
        Ok(ids)
    }

    /// One ID of `tag`: [`SegmentEngine::take`] without the Vec on the path
    /// served from memory.
    pub async fn take_one(self: &Arc<Self>, tag: &Tag) -> Result<u64, Error> {
        let buffer = self.buffer(tag).await?;
        let hider = buffer.hide.as_ref().map(|h| h.ready()).transpose()?;
        let (id, start_fetch) = buffer.take_one_local();
        if start_fetch {
            self.fetch_in_background(&buffer);
        }
        match id {
            Some(id) => {
                let id = match &hider {
                    Some(hider) => hider.hide(id)?,
                    None => id,
                };
                self.issued.increment(1);
                Ok(id)
            }
            // `take` shows it (and checks the hider again).
            None => Ok(self.take(tag, 1).await?[0]),
        }
    }

    /// What `id` of hidden tag `tag` shows: its key version to anyone,
    /// and with `reveal` (an admin caller) the internal value behind it,
    /// undone with the version it carries: an ID of a rotated-out or
    /// retired version still reveals (versions are kept decode-only, never
    /// deleted); a version the key never had is refused naming it. Reads
    /// the tag's record when this node holds no buffer of it (never
    /// creates a tag); a plain tag is refused, its IDs have no parts.
    pub async fn decode(&self, tag: &Tag, id: u64, reveal: bool) -> Result<Decoded, Error> {
        let buffered = self
            .tags
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(tag)
            .cloned();
        let (setting, output) = match buffered {
            Some(b) => (b.hide_setting.clone(), b.hide.clone()),
            None => {
                let record = self.store.get_tag(tag).await?.ok_or_else(|| {
                    StoreError::Segment(SegmentError::TagNotFound(tag.to_string()))
                })?;
                let output = record
                    .hide
                    .as_ref()
                    .map(|h| tag_output(tag, h, &self.rings));
                (record.hide, output)
            }
        };
        let (Some(h), Some(output)) = (setting, output) else {
            return Err(RequestError::PlainTag(tag.to_string()).into());
        };
        let bits = h.version_bits + h.domain_bits;
        if id >> bits != 0 {
            return Err(RequestError::NotTagId {
                id,
                tag: tag.to_string(),
                bits,
            }
            .into());
        }
        let mut view = Decoded {
            id,
            mode: crate::id::Mode::Segment.as_str(),
            time: String::new(),
            unix_millis: 0,
            datacenter: 0,
            worker: 0,
            sequence: 0,
            zone: None,
            token: None,
            hidden: Some(HIDDEN_TAG),
            key_version: Some((id >> h.domain_bits) as u32),
            internal_id: None,
        };
        if !reveal {
            return Ok(view);
        }
        let (version, internal) = output.reveal(id).map_err(|e| match e {
            RevealError::Refused(e) => *e,
            RevealError::Hide(e) => RequestError::NotRevealed {
                id,
                tag: tag.to_string(),
                key: h.key.clone(),
                why: e.to_string(),
            }
            .into(),
        })?;
        view.key_version = Some(u32::from(version));
        view.internal_id = Some(internal);
        Ok(view)
    }

    fn fetch_in_background(self: &Arc<Self>, buffer: &Arc<TagBuffer>) {
        let (this, buffer) = (Arc::clone(self), Arc::clone(buffer));
        tokio::spawn(async move {
            let fetched = buffer
                .fetch(this.store.as_ref(), &this.settings, this.clock.as_ref())
                .await;
            match fetched {
                Err(Error::Refused(Refusal::Segment(SegmentError::TagNotFound(_)))) => {
                    // Deleted (maybe on another node): what is in memory
                    // was reserved and stays unique; the buffers go.
                    this.release(&buffer.tag, "deleted");
                }
                Err(e) => {
                    tracing::warn!(tag = %buffer.tag, error = %e, "cannot fetch the next segment range; serving from memory");
                }
                Ok(()) => {}
            }
        });
    }
}

/// One tag's buffer as [`refill::take`] drives it.
struct TagRefill<'a> {
    segments: &'a Arc<SegmentEngine>,
    buffer: &'a Arc<TagBuffer>,
}

impl Refill for TagRefill<'_> {
    fn take_local(&self, want: usize, out: &mut Vec<u64>) -> Result<bool, Error> {
        Ok(self
            .buffer
            .take_local(want, out, self.segments.clock.as_ref()))
    }

    fn spawn_fetch(&self) -> JoinHandle<Result<(), Error>> {
        let (s, buffer) = (Arc::clone(self.segments), Arc::clone(self.buffer));
        tokio::spawn(async move {
            buffer
                .fetch(s.store.as_ref(), &s.settings, s.clock.as_ref())
                .await
        })
    }

    fn filled(&self) -> &Notify {
        &self.buffer.filled
    }

    fn fetch_failed(&self, e: Error) -> Error {
        let tag = &self.buffer.tag;
        if matches!(
            e,
            Error::Refused(Refusal::Segment(SegmentError::TagNotFound(_)))
        ) {
            // Deleted (maybe on another node): free its memory.
            self.segments.release(tag, "deleted");
        }
        match e {
            // The tag's own refusals reach the caller as they are (as
            // before the refusals moved into SegmentError: an existing tag
            // or a limit, which taking a range never raises, stays
            // "unavailable").
            Error::Refused(Refusal::Segment(ref s))
                if !matches!(
                    s,
                    SegmentError::TagExists(_) | SegmentError::LimitReached(_)
                ) =>
            {
                e
            }
            other => Error::SegmentUnavailable {
                tag: tag.to_string(),
                reason: other.to_string(),
            },
        }
    }

    fn check_waiting(&self) -> Result<(), Error> {
        if self.buffer.deleted.load(Ordering::Relaxed) {
            return Err(StoreError::Segment(SegmentError::TagNotFound(
                self.buffer.tag.to_string(),
            ))
            .into());
        }
        Ok(())
    }

    fn ended(&self) -> Option<Error> {
        let end = self.buffer.state().end.clone()?;
        Some(StoreError::Segment(end).into())
    }

    fn timed_out(&self, max_wait: Duration) -> Error {
        Error::SegmentUnavailable {
            tag: self.buffer.tag.to_string(),
            reason: format!(
                "no range arrived within server.max_wait ({} ms)",
                max_wait.as_millis()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use async_trait::async_trait;

    use super::*;
    use crate::id::ManualClock;

    /// An in-memory segment store that records the steps asked for, can
    /// fail, and can hold fetches until released.
    #[derive(Default)]
    struct MemStore {
        records: Mutex<HashMap<Tag, TagRecord>>,
        steps: Mutex<Vec<u64>>,
        fail: AtomicBool,
        hold: AtomicBool,
        /// Fetches that waited for `release`.
        held: AtomicU64,
        release: Notify,
    }

    #[async_trait]
    impl SegmentStore for MemStore {
        async fn create_tag(
            &self,
            tag: &Tag,
            record: &TagRecord,
            _: CreateTag,
        ) -> Result<TagRecord, StoreError> {
            let mut r = self.records.lock().unwrap();
            if r.contains_key(tag) {
                return Err(StoreError::Segment(SegmentError::TagExists(
                    tag.to_string(),
                )));
            }
            r.insert(tag.clone(), record.clone());
            Ok(record.clone())
        }
        async fn get_tag(&self, tag: &Tag) -> Result<Option<TagRecord>, StoreError> {
            Ok(self.records.lock().unwrap().get(tag).cloned())
        }
        async fn take_range(&self, tag: &Tag, step: u64, now_ms: u64) -> Result<Range, StoreError> {
            if self.hold.load(Ordering::SeqCst) {
                self.held.fetch_add(1, Ordering::SeqCst);
                self.release.notified().await;
            }
            if self.fail.load(Ordering::SeqCst) {
                return Err(StoreError::Backend("injected outage".into()));
            }
            self.steps.lock().unwrap().push(step);
            let mut r = self.records.lock().unwrap();
            let rec = r
                .get_mut(tag)
                .ok_or_else(|| StoreError::Segment(SegmentError::TagNotFound(tag.to_string())))?;
            let (range, next) = rec.next_range(tag, step, now_ms)?;
            *rec = next;
            Ok(range)
        }
    }

    const T0: u64 = 1_790_000_000_000;
    const IDLE: Duration = Duration::from_secs(600);

    fn setup(step: u64) -> (Arc<MemStore>, Arc<ManualClock>, Arc<SegmentEngine>, Tag) {
        let store = Arc::new(MemStore::default());
        let clock = Arc::new(ManualClock::at_millis(T0));
        let tag = Tag::parse("orders").unwrap();
        store
            .records
            .lock()
            .unwrap()
            .insert(tag.clone(), TagRecord::new(0, step, "", T0).unwrap());
        let segments = Arc::new(SegmentEngine::new(
            store.clone(),
            clock.clone(),
            SegmentSettings {
                auto_create: false,
                default_step: step,
                max_step: 1_000_000,
                max_wait: Duration::from_millis(300),
                max_tags: u64::MAX,
                idle_release: IDLE,
            },
        ));
        (store, clock, segments, tag)
    }

    async fn until(cond: impl Fn() -> bool) {
        for _ in 0..200 {
            if cond() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("condition not reached in 1 s");
    }

    #[tokio::test]
    async fn a_hidden_tag_without_its_key_is_refused_before_any_range_is_taken() {
        let (store, _clock, seg, tag) = setup(100);
        let hide = crate::id::segment::TagHide {
            key: "orders".into(),
            version_bits: 4,
            domain_bits: 40,
        };
        let hidden = TagRecord::new(0, 100, "", T0)
            .unwrap()
            .with_hide(&tag, Some(hide))
            .unwrap();
        store.records.lock().unwrap().insert(tag.clone(), hidden);
        // This engine has no key rings: every call is refused, naming the
        // tag, the key and the fix, and no range is ever taken.
        for _ in 0..3 {
            let err = seg.take(&tag, 10).await.unwrap_err();
            assert_eq!(err.kind(), crate::error::ErrorKind::Precondition);
            let msg = err.to_string();
            assert!(
                msg.contains("\"orders\"") && msg.contains("IDGEN_HIDE_MASTER_KEY"),
                "{msg}"
            );
            assert!(seg.take_one(&tag).await.is_err());
        }
        tokio::task::yield_now().await;
        assert!(store.steps.lock().unwrap().is_empty(), "a range was taken");
        assert_eq!(store.records.lock().unwrap()[&tag].max_id, 0);
    }

    #[tokio::test]
    async fn serves_from_memory_prefetches_at_ten_percent_and_stays_increasing() {
        let (store, _clock, seg, tag) = setup(100);
        let mut all = seg.take(&tag, 1).await.unwrap();
        assert_eq!(store.steps.lock().unwrap().len(), 1);
        all.extend(seg.take(&tag, 8).await.unwrap());
        tokio::task::yield_now().await;
        assert_eq!(
            store.steps.lock().unwrap().len(),
            1,
            "no prefetch below 10%"
        );
        all.extend(seg.take(&tag, 1).await.unwrap());
        until(|| store.steps.lock().unwrap().len() == 2).await;
        // A batch across both ranges, then more: strictly increasing, no gaps.
        all.extend(seg.take(&tag, 250).await.unwrap());
        assert!(
            all.windows(2).all(|w| w[1] == w[0] + 1),
            "contiguous and increasing"
        );
        assert_eq!(all[0], 1);
    }

    #[tokio::test]
    async fn a_call_dropped_while_it_fetches_leaves_the_next_range_to_land() {
        let (store, _clock, seg, tag) = setup(100);
        store.hold.store(true, Ordering::SeqCst);
        // Nothing in memory: this call claims the fetch and waits on the
        // store; then its client goes (the call is dropped).
        let call = tokio::spawn({
            let (seg, tag) = (Arc::clone(&seg), tag.clone());
            async move { seg.take(&tag, 10).await }
        });
        refill::yield_until("the fetch at the store", || {
            store.held.load(Ordering::SeqCst) == 1
        })
        .await;
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        store.hold.store(false, Ordering::SeqCst);
        store.release.notify_waiters();
        // The fetch landed all the same: the next calls are served from
        // the range it took, in order, each ID once (before rule 46: they
        // waited max_wait, UNAVAILABLE).
        let mut got = Vec::new();
        for _ in 0..5 {
            got.extend(seg.take(&tag, 10).await.unwrap());
        }
        assert_eq!(got, (1..=50).collect::<Vec<u64>>());
        assert_eq!(
            store.steps.lock().unwrap().len(),
            1,
            "one range, the dropped call's"
        );
    }

    #[tokio::test]
    async fn a_call_never_waits_on_the_store_while_a_range_has_ids() {
        let (store, _clock, seg, tag) = setup(100);
        seg.take(&tag, 10).await.unwrap();
        // Prefetch is now in flight and stuck in the store.
        store.hold.store(true, Ordering::SeqCst);
        seg.take(&tag, 1).await.unwrap();
        let quick = tokio::time::timeout(Duration::from_millis(200), seg.take(&tag, 80)).await;
        assert!(quick.is_ok(), "served from memory while the store hangs");
        store.hold.store(false, Ordering::SeqCst);
        store.release.notify_waiters();
    }

    #[tokio::test]
    async fn during_an_outage_buffers_are_served_then_calls_fail_naming_the_tag() {
        let (store, _clock, seg, tag) = setup(100);
        let mut got = seg.take(&tag, 20).await.unwrap();
        until(|| store.steps.lock().unwrap().len() == 2).await;
        store.fail.store(true, Ordering::SeqCst);
        assert_eq!(seg.tags_without_runway(), 0, "180 IDs in memory");
        // 180 IDs left in memory: all served.
        got.extend(seg.take(&tag, 180).await.unwrap());
        assert_eq!(got.len(), 200);
        assert_eq!(seg.tags_without_runway(), 1, "the tag's ranges are empty");
        let err = seg.take(&tag, 1).await.unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::Unavailable);
        assert!(err.to_string().contains("\"orders\""), "{err}");
        // Back: serving resumes above everything handed out.
        store.fail.store(false, Ordering::SeqCst);
        tokio::time::sleep(FETCH_RETRY).await;
        let next = seg.take(&tag, 1).await.unwrap();
        assert!(next[0] > 200);
    }

    #[tokio::test]
    async fn the_step_doubles_after_a_fast_range_and_halves_after_a_slow_one() {
        let (store, clock, seg, tag) = setup(100);
        seg.take(&tag, 100).await.unwrap(); // range 1 used up at once
        until(|| store.steps.lock().unwrap().len() == 2).await;
        seg.take(&tag, 10).await.unwrap(); // switch to range 2, 10% used
        until(|| store.steps.lock().unwrap().len() == 3).await;
        assert_eq!(*store.steps.lock().unwrap(), vec![100, 100, 200]);
        // Range 2 lasts 40 minutes: the next step halves back.
        clock.advance_millis(40 * 60 * 1000);
        seg.take(&tag, 90).await.unwrap(); // range 2 done
        seg.take(&tag, 20).await.unwrap(); // switch to range 3 (200), 10% used
        until(|| store.steps.lock().unwrap().len() == 4).await;
        assert_eq!(store.steps.lock().unwrap()[3], 100);
    }

    #[tokio::test]
    async fn unknown_tags_are_not_found_unless_auto_created() {
        let (store, clock, seg, _tag) = setup(100);
        let other = Tag::parse("other").unwrap();
        let err = seg.take(&other, 1).await.unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::NotFound);
        let auto = Arc::new(SegmentEngine::new(
            store.clone(),
            clock,
            SegmentSettings {
                auto_create: true,
                default_step: 50,
                max_step: 1000,
                max_wait: Duration::from_millis(300),
                max_tags: u64::MAX,
                idle_release: IDLE,
            },
        ));
        assert_eq!(auto.take(&other, 3).await.unwrap(), vec![1, 2, 3]);
        assert_eq!(store.records.lock().unwrap()[&other].step, 50);
    }

    #[tokio::test]
    async fn idle_tags_are_released_and_continue_above_their_old_range() {
        let (store, clock, seg, tag) = setup(100);
        let other = Tag::parse("other").unwrap();
        store
            .records
            .lock()
            .unwrap()
            .insert(other.clone(), TagRecord::new(0, 100, "", T0).unwrap());
        let mut seen = seg.take(&tag, 10).await.unwrap();
        until(|| store.steps.lock().unwrap().len() == 2).await;
        seg.take(&other, 1).await.unwrap();
        assert_eq!(seg.buffered_tags(), 2);

        // Used since the last sweep: kept, however much time passed.
        clock.advance_millis(IDLE.as_millis() as u64 * 2);
        assert_eq!(seg.sweep_idle(), 0);
        assert_eq!(seg.buffered_tags(), 2);
        // `tag` stays in use; `other` is not touched again.
        clock.advance_millis(IDLE.as_millis() as u64 - 1);
        seen.extend(seg.take(&tag, 1).await.unwrap());
        assert_eq!(seg.sweep_idle(), 0, "idle for less than idle_release");
        clock.advance_millis(1);
        assert_eq!(seg.sweep_idle(), 1, "other: idle for idle_release");
        assert_eq!(seg.buffered_tags(), 1);
        // Now `tag` goes idle too, with 189 IDs of its two ranges unused.
        clock.advance_millis(IDLE.as_millis() as u64);
        assert_eq!(seg.sweep_idle(), 1);
        assert_eq!(seg.buffered_tags(), 0);

        // Used again: a fresh range, above everything the old buffers
        // held (their unused IDs are a gap, never handed out).
        let again = seg.take(&tag, 3).await.unwrap();
        assert_eq!(seg.buffered_tags(), 1);
        assert!(again[0] > 200, "{again:?} after {seen:?}");
        assert!(again.windows(2).all(|w| w[1] > w[0]));
        let again_other = seg.take(&other, 1).await.unwrap();
        assert!(again_other[0] > 100, "{again_other:?}");
    }

    #[tokio::test]
    async fn a_tag_deleted_in_the_store_is_released_when_a_fetch_finds_it_gone() {
        let (store, _clock, seg, tag) = setup(10);
        let got = seg.take(&tag, 10).await.unwrap();
        until(|| store.steps.lock().unwrap().len() == 2).await;
        assert_eq!(seg.buffered_tags(), 1);
        // Deleted on another node: this one still serves what it reserved,
        store.records.lock().unwrap().remove(&tag);
        let rest = seg.take(&tag, 10).await.unwrap();
        assert!(rest[0] > got[9]);
        // then the next fetch answers TagNotFound and the buffers go.
        let err = seg.take(&tag, 1).await.unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::NotFound);
        assert_eq!(seg.buffered_tags(), 0);
        // Released here directly (an admin delete on this node).
        store
            .records
            .lock()
            .unwrap()
            .insert(tag.clone(), TagRecord::new(500, 10, "", T0).unwrap());
        assert_eq!(seg.take(&tag, 1).await.unwrap(), vec![501]);
        assert!(seg.release(&tag, "deleted"));
        assert!(!seg.release(&tag, "deleted"));
        assert_eq!(seg.buffered_tags(), 0);
    }

    /// Rule 37 through the engine: a tag 2,500 IDs from its end, drained
    /// in batches of 700, hands out exactly those 2,500 IDs, each once:
    /// the batch that meets the end returns the IDs it took (the last
    /// partial range included) instead of dropping them, and the call
    /// after it is refused as exhausted (RESOURCE_EXHAUSTED), as is every
    /// later one. (Issue 33: the partial range was never reserved and the
    /// failing batch dropped what it held.)
    #[tokio::test]
    async fn a_tag_hands_out_every_id_to_its_end_then_refuses() {
        let (store, _clock, seg, tag) = setup(1000);
        let start = crate::id::segment::MAX_SEGMENT_ID - 2500;
        store
            .records
            .lock()
            .unwrap()
            .insert(tag.clone(), TagRecord::new(start, 1000, "", T0).unwrap());
        let mut got = Vec::new();
        let end = loop {
            match seg.take(&tag, 700).await {
                Ok(ids) => {
                    assert!(!ids.is_empty() && ids.len() <= 700);
                    got.extend(ids);
                }
                Err(e) => break e,
            }
            assert!(got.len() <= 2500, "more IDs than the tag holds");
        };
        assert_eq!(end.kind(), crate::error::ErrorKind::Exhausted, "{end}");
        assert!(end.to_string().contains("create a new tag"), "{end}");
        let expected: Vec<u64> = (start + 1..=crate::id::segment::MAX_SEGMENT_ID).collect();
        assert_eq!(got.len(), 2500, "IDs handed out before the end");
        assert_eq!(got, expected, "every ID once, in order");
        let again = seg.take_one(&tag).await.unwrap_err();
        assert_eq!(again.kind(), crate::error::ErrorKind::Exhausted);
    }

    #[tokio::test]
    async fn auto_created_tags_past_the_limit_are_resource_exhausted() {
        // The in-memory store does not count: the limit is the store's
        // job (see tests/limits.rs); here the error's code and text.
        let err: Error = StoreError::Segment(
            crate::id::LimitReached {
                what: "segment tag \"x\" cannot be created (3 live tags)".into(),
                limit: 3,
                setting: "segment.max_tags",
            }
            .into(),
        )
        .into();
        assert_eq!(err.kind(), crate::error::ErrorKind::Exhausted);
        assert!(err.to_string().contains("raise segment.max_tags"), "{err}");
    }
}
