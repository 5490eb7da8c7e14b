//! Prefetching: a local buffer of IDs per (mode, tag), refilled in the
//! background with `GenIds` before it runs dry, and one of UUIDs refilled
//! with `GenUuids`.
//!
//! Both are one generic core ([`Buffered`] over an [`Item`]: `u64` or
//! [`Uuid`]); only the call that fetches a batch differs. The public
//! [`Prefetcher`] and [`UuidPrefetcher`] are thin handles on it.
//!
//! A buffer keeps ahead of a fast reader with several refills in flight
//! at once ("lanes"): each is one `GenIds` call to the node with the fewest
//! calls in flight (power of two choices), so the lanes spread over the
//! nodes. A buffer starts with one lane; callers that had to wait double
//! the batch and, once it is at `max_batch`, add a lane, up to
//! [`PrefetchConfig::refills_in_flight`]. Each answer is its own block, so
//! the order within one node's block is kept; blocks are served in the
//! order they arrived.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idgen_proto::{GenIdsRequest, GenUuidsRequest, Mode};
use tokio::sync::watch;
use tracing::Instrument;

use crate::buffer::{Advanced, Block, IdBuffer};
use crate::call::{Caller, Counted, Retry};
use crate::metrics as m;
use crate::nodes::Route;
use crate::uuid::{uuids_of, Uuid};
use crate::Error;

/// How prefetch buffers size and age their batches.
#[derive(Debug, Clone)]
pub struct PrefetchConfig {
    /// The first refill's batch size (default 1,000).
    pub initial_batch: u32,
    /// The smallest batch the adaptive size shrinks to (default 100).
    pub min_batch: u32,
    /// The largest batch; keep it at most the server's `server.max_batch`
    /// (default 10,000, the server's default). If the server answers that
    /// a batch is too large, the client lowers this to the server's limit.
    pub max_batch: u32,
    /// Refill when fewer than this fraction of a batch is left (default 0.5).
    pub low_water: f64,
    /// Snowflake IDs and UUIDs older than this (since they were received)
    /// are thrown away unused, so their time stays close to the time of
    /// use (default 5 s). Lease and segment IDs do not age.
    pub max_snowflake_age: Duration,
    /// A batch that took longer than this to use up halves the next one
    /// (default 30 s): IDs should not sit unused.
    pub shrink_after: Duration,
    /// The most refills in flight at once (default 6: two per node of a
    /// 3-node cluster, so each node always has the next batch in hand).
    /// A buffer starts with one; each time callers had to wait while the
    /// batch was already at `max_batch` it adds one, and it drops one when
    /// IDs aged out or a batch took over `shrink_after` to use. 1 gives
    /// the one-refill-at-a-time behaviour. At most 64.
    pub refills_in_flight: u32,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        Self {
            initial_batch: 1000,
            min_batch: 100,
            max_batch: 10_000,
            low_water: 0.5,
            max_snowflake_age: Duration::from_secs(5),
            shrink_after: Duration::from_secs(30),
            refills_in_flight: 6,
        }
    }
}

impl PrefetchConfig {
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.min_batch == 0 || self.min_batch > self.max_batch {
            return Err(format!(
                "prefetch batches need 1 <= min_batch ({}) <= max_batch ({})",
                self.min_batch, self.max_batch
            ));
        }
        if !(0.0..1.0).contains(&self.low_water) {
            return Err(format!(
                "prefetch low_water is a fraction of a batch in [0, 1), got {}",
                self.low_water
            ));
        }
        if self.max_snowflake_age.is_zero() {
            return Err("prefetch max_snowflake_age must be above zero".into());
        }
        if !(1..=MAX_REFILLS_IN_FLIGHT).contains(&self.refills_in_flight) {
            return Err(format!(
                "prefetch refills_in_flight must be between 1 and {MAX_REFILLS_IN_FLIGHT}, got {}",
                self.refills_in_flight
            ));
        }
        Ok(())
    }
}

/// The largest [`PrefetchConfig::refills_in_flight`] accepted.
const MAX_REFILLS_IN_FLIGHT: u32 = 64;

/// The last refill's outcome, for callers waiting on it.
#[derive(Debug, Clone, Default)]
struct Refilled {
    error: Option<Error>,
}

/// What a prefetch buffer holds, and the one call that fetches a batch of
/// it: the only part of prefetching that differs between IDs and UUIDs.
pub(crate) trait Item: Copy + Send + Sync + fmt::Debug + 'static {
    /// What to fetch: (mode, tag) for IDs, nothing for UUIDs.
    type Source: fmt::Debug + Send + Sync + 'static;

    /// One batch of `count` from a node (with the client's retries).
    fn fetch<'a>(
        caller: &'a Caller,
        source: &'a Self::Source,
        count: u32,
    ) -> impl Future<Output = Result<Vec<Self>, Error>> + Send + 'a;

    /// Whether a batch carries its issue time, so it ages out after
    /// [`PrefetchConfig::max_snowflake_age`].
    fn ages(source: &Self::Source) -> bool;

    /// The `mode` and `tag` metric labels.
    fn labels(source: &Self::Source) -> [(&'static str, String); 2];
}

/// IDs of one (mode, tag), from `GenIds`.
impl Item for u64 {
    type Source = (Mode, String);

    fn fetch<'a>(
        caller: &'a Caller,
        (mode, tag): &'a (Mode, String),
        count: u32,
    ) -> impl Future<Output = Result<Vec<u64>, Error>> + Send + 'a {
        let counted = Counted::Mode(*mode, tag);
        caller.call_routed(
            "GenIds",
            Retry::Idempotent,
            Route::Spread,
            counted,
            move |mut c, left| {
                let mut req = tonic::Request::new(GenIdsRequest {
                    mode: *mode as i32,
                    tag: tag.clone(),
                    count,
                });
                req.set_timeout(left);
                async move { c.gen_ids(req).await.map(|r| r.into_inner().ids) }
            },
        )
    }

    fn ages((mode, _): &(Mode, String)) -> bool {
        *mode == Mode::Snowflake || *mode == Mode::Unspecified
    }

    fn labels((mode, tag): &(Mode, String)) -> [(&'static str, String); 2] {
        [
            (
                "mode",
                mode.as_str_name().to_ascii_lowercase().replace("mode_", ""),
            ),
            ("tag", tag.clone()),
        ]
    }
}

/// UUIDv7 from `GenUuids`: they carry their issue time, so they age like
/// snowflake IDs.
impl Item for Uuid {
    type Source = ();

    async fn fetch(caller: &Caller, _: &(), count: u32) -> Result<Vec<Uuid>, Error> {
        let bytes = caller
            .call("GenUuids", Retry::Idempotent, |mut c, left| {
                let mut req = tonic::Request::new(GenUuidsRequest {
                    count,
                    with_text: false,
                });
                req.set_timeout(left);
                async move { c.gen_uuids(req).await.map(|r| r.into_inner().uuids) }
            })
            .await?;
        uuids_of(&bytes, count)
    }

    fn ages(_: &()) -> bool {
        true
    }

    fn labels(_: &()) -> [(&'static str, String); 2] {
        [("mode", "uuid".into()), ("tag", String::new())]
    }
}

/// A prefetch buffer for one (mode, tag). Cheap to clone (shared); all
/// clones serve from the same buffer.
///
/// ```no_run
/// # async fn run() -> Result<(), idgen_client::Error> {
/// use idgen_client::{Client, Mode};
/// let client = Client::builder().endpoints(["127.0.0.1:50051"]).build().await?;
/// let ids = client.prefetcher(Mode::Snowflake, "")?;
/// let id = ids.next_id().await?; // from memory once the buffer is filled
/// # let _ = id; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Prefetcher {
    buffered: Buffered<u64>,
}

/// A prefetch buffer of UUIDv7 (`GenUuids`), the UUID twin of
/// [`Prefetcher`]: the same buffer, refills and batch sizing, with
/// batches that age like snowflake IDs. Within one batch UUIDs increase;
/// batches are served in the order they arrived. Cheap to clone (shared).
///
/// ```no_run
/// # async fn run() -> Result<(), idgen_client::Error> {
/// use idgen_client::Client;
/// let client = Client::builder().endpoints(["127.0.0.1:50051"]).build().await?;
/// let uuids = client.uuid_prefetcher();
/// let uuid = uuids.next_uuid().await?; // from memory once the buffer is filled
/// # let _ = uuid; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct UuidPrefetcher {
    buffered: Buffered<Uuid>,
}

/// The generic core behind both handles: a shared buffer of `T` and its
/// refills.
#[derive(Debug)]
pub(crate) struct Buffered<T: Item> {
    inner: Arc<Inner<T>>,
}

// Derived `Clone` would ask `T: Clone` of the handle; only the `Arc` is cloned.
impl<T: Item> Clone for Buffered<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

#[derive(Debug)]
struct Inner<T: Item> {
    buffer: IdBuffer<T>,
    caller: Option<Arc<Caller>>,
    runtime: Option<tokio::runtime::Handle>,
    source: T::Source,
    config: PrefetchConfig,
    batch: AtomicU32,
    max_batch: AtomicU32,
    /// Refills started and not yet landed.
    in_flight: AtomicU32,
    /// How many refills may be in flight now (1..=config.refills_in_flight).
    lanes: AtomicU32,
    /// A caller found the buffer empty since the last refill started.
    stalled: AtomicBool,
    refilled: watch::Sender<Refilled>,
    /// When the current block was put in service.
    served_since: Mutex<Instant>,
    labels: [(&'static str, String); 2],
}

impl<T: Item> Buffered<T> {
    fn new(
        caller: Arc<Caller>,
        runtime: tokio::runtime::Handle,
        source: T::Source,
        config: PrefetchConfig,
    ) -> Self {
        let batch = config
            .initial_batch
            .clamp(config.min_batch, config.max_batch);
        let labels = T::labels(&source);
        let inner = Inner {
            buffer: IdBuffer::new(low_water(batch, config.low_water)),
            caller: Some(caller),
            runtime: Some(runtime),
            source,
            max_batch: AtomicU32::new(config.max_batch),
            config,
            batch: AtomicU32::new(batch),
            in_flight: AtomicU32::new(0),
            lanes: AtomicU32::new(1),
            stalled: AtomicBool::new(false),
            refilled: watch::Sender::new(Refilled::default()),
            served_since: Mutex::new(Instant::now()),
            labels,
        };
        metrics::gauge!(m::BATCH_SIZE, &inner.labels).set(f64::from(batch));
        metrics::gauge!(m::REFILL_LANES, &inner.labels).set(1.0);
        Self {
            inner: Arc::new(inner),
        }
    }

    /// A buffer holding `ids` and connected to nothing (see
    /// [`Prefetcher::detached`]).
    fn detached(ids: Vec<T>, source: T::Source) -> Self {
        let inner = Inner {
            buffer: IdBuffer::new(0),
            caller: None,
            runtime: None,
            source,
            config: PrefetchConfig::default(),
            batch: AtomicU32::new(1),
            max_batch: AtomicU32::new(1),
            in_flight: AtomicU32::new(0),
            lanes: AtomicU32::new(1),
            stalled: AtomicBool::new(false),
            refilled: watch::Sender::new(Refilled::default()),
            served_since: Mutex::new(Instant::now()),
            labels: [("mode", "detached".into()), ("tag", String::new())],
        };
        inner.buffer.push(Arc::new(Block::new(ids)));
        inner.buffer.advance();
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The hot path (see [`Prefetcher::try_next`]).
    #[inline]
    fn try_next(&self) -> Option<T> {
        let claimed = match self.inner.buffer.try_claim() {
            Some(c) => c,
            None => self.next_block()?,
        };
        if claimed.refill {
            self.inner.request_refill();
        }
        Some(claimed.id)
    }

    /// The current block is spent: put a queued one in service (a short
    /// lock, once per block) and claim from it.
    #[cold]
    fn next_block(&self) -> Option<crate::buffer::Claimed<T>> {
        if self.inner.buffer.has_queued() && self.inner.advance() {
            // A block went into service: keep the lanes busy.
            self.inner.start_refills(false);
            self.inner.buffer.try_claim()
        } else {
            None
        }
    }

    /// The next item (see [`Prefetcher::next_id`]).
    async fn next(&self) -> Result<T, Error> {
        match self.try_next() {
            Some(id) => Ok(id),
            None => self.next_slow().await,
        }
    }

    #[cold]
    async fn next_slow(&self) -> Result<T, Error> {
        let inner = &self.inner;
        let Some(caller) = &inner.caller else {
            return Err(Error::NoNodes);
        };
        let deadline = caller.settings.deadline;
        let started = Instant::now();
        let mut refilled = inner.refilled.subscribe();
        let mut counted = false;
        loop {
            if let Some(id) = self.try_next() {
                return Ok(id);
            }
            if inner.advance() {
                continue;
            }
            refilled.borrow_and_update();
            if !counted {
                metrics::counter!(m::STALLS).increment(1);
                counted = true;
            }
            inner.stalled.store(true, Ordering::Relaxed);
            inner.start_refills(true);
            // A refill may have landed between the checks above and the
            // subscription: look once more before sleeping.
            if let Some(id) = self.try_next() {
                return Ok(id);
            }
            if inner.advance() {
                continue;
            }
            let left = deadline.saturating_sub(started.elapsed());
            match tokio::time::timeout(left, refilled.changed()).await {
                Err(_) => {
                    return Err(Error::DeadlineExceeded {
                        deadline,
                        last: "waiting for a prefetch refill".into(),
                        attempts: 0,
                        nodes: 0,
                    })
                }
                Ok(Err(_)) => return Err(Error::NoNodes),
                Ok(Ok(())) => {
                    let error = refilled.borrow_and_update().error.clone();
                    if let Some(e) = error {
                        if let Some(id) = self.try_next() {
                            return Ok(id);
                        }
                        if !inner.advance() {
                            if inner.in_flight.load(Ordering::Acquire) > 0 {
                                // Another refill may still land in time.
                                continue;
                            }
                            return Err(e);
                        }
                    }
                }
            }
        }
    }

    /// Every item still buffered (see [`Prefetcher::drain`]).
    fn drain(&self) -> Vec<T> {
        let mut ids = Vec::new();
        loop {
            match self.inner.buffer.try_claim() {
                Some(c) => ids.push(c.id),
                None if self.inner.buffer.has_queued() && self.inner.advance() => {}
                None => return ids,
            }
        }
    }

    fn depth(&self) -> usize {
        self.inner.buffer.depth()
    }

    fn batch_size(&self) -> u32 {
        self.inner.batch.load(Ordering::Relaxed)
    }

    fn refills_in_flight(&self) -> u32 {
        self.inner.in_flight.load(Ordering::Relaxed)
    }
}

impl Prefetcher {
    pub(crate) fn new(
        caller: Arc<Caller>,
        runtime: tokio::runtime::Handle,
        mode: Mode,
        tag: String,
        config: PrefetchConfig,
    ) -> Self {
        Self {
            buffered: Buffered::new(caller, runtime, (mode, tag), config),
        }
    }

    /// A buffer holding `ids` and connected to nothing: for benchmarks of
    /// the in-memory path. Once `ids` are used up, `next_id` fails with
    /// [`Error::NoNodes`].
    #[doc(hidden)]
    pub fn detached(ids: Vec<u64>) -> Self {
        Self {
            buffered: Buffered::detached(ids, (Mode::Segment, String::new())),
        }
    }

    /// The hot path: an ID from memory, or `None` when the buffer is empty
    /// (then [`Prefetcher::next_id`] waits for the refill). Takes no lock
    /// and never waits while the current block holds IDs (moving to the
    /// next fetched block takes a short lock once per block); crossing the
    /// low-water mark starts a background refill.
    #[inline]
    pub fn try_next(&self) -> Option<u64> {
        self.buffered.try_next()
    }

    /// The next ID: from memory when the buffer holds one (no lock, no
    /// wait), else after the next refill lands (every caller arriving
    /// meanwhile waits for the refills already in flight), within the
    /// client's deadline.
    pub async fn next_id(&self) -> Result<u64, Error> {
        self.buffered.next().await
    }

    /// Takes every ID still buffered, without starting a refill: for an
    /// application that shuts down and wants to record or reuse what it
    /// fetched (IDs merely dropped are gaps, never repeats). A refill
    /// already in flight may still land afterwards.
    pub fn drain(&self) -> Vec<u64> {
        self.buffered.drain()
    }

    /// IDs held in memory and not yet handed out.
    pub fn depth(&self) -> usize {
        self.buffered.depth()
    }

    /// The batch size the next refill asks for.
    pub fn batch_size(&self) -> u32 {
        self.buffered.batch_size()
    }

    /// Refills in flight right now (at most
    /// [`PrefetchConfig::refills_in_flight`]).
    pub fn refills_in_flight(&self) -> u32 {
        self.buffered.refills_in_flight()
    }
}

impl UuidPrefetcher {
    pub(crate) fn new(
        caller: Arc<Caller>,
        runtime: tokio::runtime::Handle,
        config: PrefetchConfig,
    ) -> Self {
        Self {
            buffered: Buffered::new(caller, runtime, (), config),
        }
    }

    /// A buffer holding `uuids` and connected to nothing: for tests and
    /// benchmarks of the in-memory path.
    #[doc(hidden)]
    pub fn detached(uuids: Vec<Uuid>) -> Self {
        Self {
            buffered: Buffered::detached(uuids, ()),
        }
    }

    /// A UUID from memory, or `None` when the buffer is empty (the same
    /// lock-free path as [`Prefetcher::try_next`]).
    #[inline]
    pub fn try_next(&self) -> Option<Uuid> {
        self.buffered.try_next()
    }

    /// The next UUID: from memory when the buffer holds one, else after
    /// the next refill lands, within the client's deadline (as
    /// [`Prefetcher::next_id`]).
    pub async fn next_uuid(&self) -> Result<Uuid, Error> {
        self.buffered.next().await
    }

    /// Takes every UUID still buffered, without starting a refill (as
    /// [`Prefetcher::drain`]; UUIDs merely dropped are gaps, never repeats).
    pub fn drain(&self) -> Vec<Uuid> {
        self.buffered.drain()
    }

    /// UUIDs held in memory and not yet handed out.
    pub fn depth(&self) -> usize {
        self.buffered.depth()
    }

    /// The batch size the next refill asks for.
    pub fn batch_size(&self) -> u32 {
        self.buffered.batch_size()
    }

    /// Refills in flight right now.
    pub fn refills_in_flight(&self) -> u32 {
        self.buffered.refills_in_flight()
    }
}

fn low_water(batch: u32, fraction: f64) -> usize {
    (f64::from(batch) * fraction) as usize
}

impl<T: Item> Inner<T> {
    /// Puts the next block in service when the current one is spent.
    /// True when there are IDs to claim.
    fn advance(&self) -> bool {
        let Advanced { ready, discarded } = self.buffer.advance();
        if discarded > 0 {
            metrics::counter!(m::DISCARDED, "reason" => "age").increment(discarded as u64);
            // IDs sat unused until they aged out: fetch less ahead.
            self.shrink();
        }
        if ready {
            let mut since = self.served_since.lock().unwrap_or_else(|e| e.into_inner());
            if since.elapsed() > self.config.shrink_after {
                self.shrink();
            }
            *since = Instant::now();
            metrics::gauge!(m::BUFFER_DEPTH, &self.labels).set(self.buffer.depth() as f64);
        }
        ready
    }

    /// Callers had to wait: a larger batch, or once the batch is at its
    /// largest, one more refill in flight.
    fn grow(&self) {
        let batch = self.batch.load(Ordering::Relaxed);
        if batch < self.max_batch.load(Ordering::Relaxed) {
            self.resize(|b| b.saturating_mul(2));
        } else {
            self.set_lanes(|l| l + 1);
        }
    }

    /// IDs sat unused: one refill in flight fewer, or once down to one,
    /// half the batch.
    fn shrink(&self) {
        if self.lanes.load(Ordering::Relaxed) > 1 {
            self.set_lanes(|l| l - 1);
        } else {
            self.resize(|b| b / 2);
        }
    }

    fn set_lanes(&self, f: impl Fn(u32) -> u32) {
        let old = self.lanes.load(Ordering::Relaxed);
        let new = f(old).clamp(1, self.config.refills_in_flight.max(1));
        if new != old {
            self.lanes.store(new, Ordering::Relaxed);
            metrics::gauge!(m::REFILL_LANES, &self.labels).set(f64::from(new));
            tracing::debug!(source = ?self.source, lanes = new, "prefetch refills in flight changed");
        }
    }

    /// Whether the IDs held plus those on their way (`in_flight` batches)
    /// are below what this buffer keeps ahead: the low-water mark of one
    /// batch, plus one whole batch for every lane beyond the first.
    fn wants_more(&self, in_flight: u32) -> bool {
        let batch = self.batch.load(Ordering::Relaxed) as usize;
        let lanes = self.lanes.load(Ordering::Relaxed).max(1) as usize;
        let ahead = low_water(batch as u32, self.config.low_water) + (lanes - 1) * batch;
        self.buffer.depth() + in_flight as usize * batch < ahead
    }

    fn resize(&self, f: impl Fn(u32) -> u32) {
        let max = self.max_batch.load(Ordering::Relaxed);
        let old = self.batch.load(Ordering::Relaxed);
        let new = f(old).clamp(self.config.min_batch.min(max), max);
        if new != old {
            self.batch.store(new, Ordering::Relaxed);
            self.buffer
                .set_low_water(low_water(new, self.config.low_water));
            metrics::gauge!(m::BATCH_SIZE, &self.labels).set(f64::from(new));
            tracing::debug!(source = ?self.source, batch = new, "prefetch batch resized");
        }
    }

    /// A claim crossed the low-water mark: start a refill if none is in
    /// flight, and more while the buffer is below what it keeps ahead.
    fn request_refill(self: &Arc<Self>) {
        self.start_refills(true);
    }

    /// Starts refills while fewer than `lanes` are in flight and the
    /// buffer wants more; `asked`: a caller needs one, so start one when
    /// none is in flight whatever the depth. The count only moves by
    /// compare-and-swap, so concurrent callers never exceed the lanes.
    fn start_refills(self: &Arc<Self>, asked: bool) {
        let Some(runtime) = &self.runtime else { return };
        let lanes = self.lanes.load(Ordering::Relaxed).max(1);
        for _ in 0..lanes {
            let n = self.in_flight.load(Ordering::Acquire);
            if n >= lanes || !((asked && n == 0) || self.wants_more(n)) {
                return;
            }
            if self
                .in_flight
                .compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                runtime.spawn(Arc::clone(self).refill());
            }
        }
    }

    async fn refill(self: Arc<Self>) {
        let Some(caller) = self.caller.clone() else {
            return;
        };
        if self.stalled.swap(false, Ordering::Relaxed) {
            // Callers found the buffer empty: fetch further ahead.
            self.grow();
        }
        let span = tracing::debug_span!("idgen.refill", source = ?self.source);
        let result = self.fetch(&caller).instrument(span).await;
        self.land(result);
    }

    /// One `GenIds` (or `GenUuids`) call with the client's retries,
    /// lowering the batch to the server's limit if the server says it is
    /// too large.
    async fn fetch(&self, caller: &Caller) -> Result<Vec<T>, Error> {
        loop {
            let count = self.batch.load(Ordering::Relaxed);
            let got = T::fetch(caller, &self.source, count).await;
            match got {
                Err(Error::Status {
                    code: tonic::Code::InvalidArgument,
                    message,
                }) => match server_max_batch(&message) {
                    Some(max) if max < count && max > 0 => {
                        tracing::info!(
                            max_batch = max,
                            "the server's max batch is lower than the client's: using it"
                        );
                        self.max_batch.store(max, Ordering::Relaxed);
                        self.resize(|b| b.min(max));
                    }
                    _ => {
                        return Err(Error::Status {
                            code: tonic::Code::InvalidArgument,
                            message,
                        })
                    }
                },
                other => return other,
            }
        }
    }

    /// Queues what a refill got (or hands its error to the waiting
    /// callers) and counts the refill as landed.
    fn land(self: &Arc<Self>, result: Result<Vec<T>, Error>) {
        let outcome = match result {
            Ok(ids) if !ids.is_empty() => {
                let block = Arc::new(Block::new(ids));
                if T::ages(&self.source) {
                    let weak = Arc::downgrade(&block);
                    let age = self.config.max_snowflake_age;
                    tokio::spawn(async move {
                        tokio::time::sleep(age).await;
                        if let Some(b) = weak.upgrade() {
                            b.expire();
                        }
                    });
                }
                self.buffer.push(block);
                metrics::gauge!(m::BUFFER_DEPTH, &self.labels).set(self.buffer.depth() as f64);
                None
            }
            Ok(_) => Some(Error::Status {
                code: tonic::Code::Internal,
                message: "the server answered an empty batch".into(),
            }),
            Err(e) => Some(e),
        };
        let label = if outcome.is_none() { "ok" } else { "error" };
        metrics::counter!(m::REFILLS, "mode" => self.labels[0].1.clone(), "outcome" => label)
            .increment(1);
        if let Some(e) = &outcome {
            tracing::warn!(source = ?self.source, error = %e, "prefetch refill failed");
        }
        let landed = outcome.is_none();
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.refilled.send_replace(Refilled { error: outcome });
        if landed {
            // Keep the other lanes busy; after an error, the next caller
            // that finds the buffer low starts the next attempt.
            self.start_refills(false);
        }
    }
}

impl<T: Item> Drop for Inner<T> {
    fn drop(&mut self) {
        let left = self.buffer.depth();
        if left > 0 && self.caller.is_some() {
            // Never handed out: gaps, not repeats.
            metrics::counter!(m::DISCARDED, "reason" => "shutdown").increment(left as u64);
        }
    }
}

/// The server's limit from its INVALID_ARGUMENT message ("count must be
/// between 1 and {max}, got {n}; ...").
fn server_max_batch(message: &str) -> Option<u32> {
    let rest = message.split("between 1 and ").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_servers_max_batch_from_its_message() {
        assert_eq!(
            server_max_batch("count must be between 1 and 500, got 1000; split larger batches into several calls"),
            Some(500)
        );
        assert_eq!(server_max_batch("unknown mode"), None);
    }

    #[test]
    fn a_detached_buffer_hands_out_its_ids_once_then_says_no_nodes() {
        let p = Prefetcher::detached(vec![7, 8]);
        assert_eq!(p.try_next(), Some(7));
        assert_eq!(p.try_next(), Some(8));
        assert_eq!(p.try_next(), None);
    }
}
