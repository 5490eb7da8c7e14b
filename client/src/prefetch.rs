//! Prefetching: a local buffer of IDs per (mode, tag), refilled in the
//! background with `GenIds` before it runs dry.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idgen_proto::{GenIdsRequest, Mode};
use tokio::sync::watch;
use tracing::Instrument;

use crate::buffer::{Advanced, Block, IdBuffer};
use crate::call::{Caller, Retry};
use crate::metrics as m;
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
    /// Snowflake IDs older than this (since they were received) are thrown
    /// away unused, so their time stays close to the time of use (default
    /// 5 s). Lease and segment IDs do not age.
    pub max_snowflake_age: Duration,
    /// A batch that took longer than this to use up halves the next one
    /// (default 30 s): IDs should not sit unused.
    pub shrink_after: Duration,
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
        Ok(())
    }
}

/// The last refill's outcome, for callers waiting on it.
#[derive(Debug, Clone, Default)]
struct Refilled {
    error: Option<Error>,
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
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    buffer: IdBuffer,
    caller: Option<Arc<Caller>>,
    runtime: Option<tokio::runtime::Handle>,
    mode: Mode,
    tag: String,
    config: PrefetchConfig,
    batch: AtomicU32,
    max_batch: AtomicU32,
    refilling: AtomicBool,
    /// A caller found the buffer empty since the last refill started.
    stalled: AtomicBool,
    refilled: watch::Sender<Refilled>,
    /// When the current block was put in service.
    served_since: Mutex<Instant>,
    labels: [(&'static str, String); 2],
}

impl Prefetcher {
    pub(crate) fn new(
        caller: Arc<Caller>,
        runtime: tokio::runtime::Handle,
        mode: Mode,
        tag: String,
        config: PrefetchConfig,
    ) -> Self {
        let batch = config
            .initial_batch
            .clamp(config.min_batch, config.max_batch);
        let labels = [
            (
                "mode",
                mode.as_str_name().to_ascii_lowercase().replace("mode_", ""),
            ),
            ("tag", tag.clone()),
        ];
        let inner = Inner {
            buffer: IdBuffer::new(low_water(batch, config.low_water)),
            caller: Some(caller),
            runtime: Some(runtime),
            mode,
            tag,
            max_batch: AtomicU32::new(config.max_batch),
            config,
            batch: AtomicU32::new(batch),
            refilling: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            refilled: watch::Sender::new(Refilled::default()),
            served_since: Mutex::new(Instant::now()),
            labels,
        };
        metrics::gauge!(m::BATCH_SIZE, &inner.labels).set(f64::from(batch));
        Self {
            inner: Arc::new(inner),
        }
    }

    /// A buffer holding `ids` and connected to nothing: for benchmarks of
    /// the in-memory path. Once `ids` are used up, `next_id` fails with
    /// [`Error::NoNodes`].
    #[doc(hidden)]
    pub fn detached(ids: Vec<u64>) -> Self {
        let inner = Inner {
            buffer: IdBuffer::new(0),
            caller: None,
            runtime: None,
            mode: Mode::Segment,
            tag: String::new(),
            config: PrefetchConfig::default(),
            batch: AtomicU32::new(1),
            max_batch: AtomicU32::new(1),
            refilling: AtomicBool::new(false),
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

    /// The hot path: an ID from memory, or `None` when the buffer is empty
    /// (then [`Prefetcher::next_id`] waits for the refill). Takes no lock
    /// and never waits while the current block holds IDs (moving to the
    /// next fetched block takes a short lock once per block); crossing the
    /// low-water mark starts a background refill.
    #[inline]
    pub fn try_next(&self) -> Option<u64> {
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
    fn next_block(&self) -> Option<crate::buffer::Claimed> {
        if self.inner.buffer.has_queued() && self.inner.advance() {
            self.inner.buffer.try_claim()
        } else {
            None
        }
    }

    /// The next ID: from memory when the buffer holds one (no lock, no
    /// wait), else after the refill in flight (one per buffer; every
    /// caller arriving meanwhile waits on the same one), within the
    /// client's deadline.
    pub async fn next_id(&self) -> Result<u64, Error> {
        match self.try_next() {
            Some(id) => Ok(id),
            None => self.next_slow().await,
        }
    }

    #[cold]
    async fn next_slow(&self) -> Result<u64, Error> {
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
            inner.request_refill();
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
                            return Err(e);
                        }
                    }
                }
            }
        }
    }

    /// Takes every ID still buffered, without starting a refill: for an
    /// application that shuts down and wants to record or reuse what it
    /// fetched (IDs merely dropped are gaps, never repeats). A refill
    /// already in flight may still land afterwards.
    pub fn drain(&self) -> Vec<u64> {
        let mut ids = Vec::new();
        loop {
            match self.inner.buffer.try_claim() {
                Some(c) => ids.push(c.id),
                None if self.inner.buffer.has_queued() && self.inner.advance() => {}
                None => return ids,
            }
        }
    }

    /// IDs held in memory and not yet handed out.
    pub fn depth(&self) -> usize {
        self.inner.buffer.depth()
    }

    /// The batch size the next refill asks for.
    pub fn batch_size(&self) -> u32 {
        self.inner.batch.load(Ordering::Relaxed)
    }
}

fn low_water(batch: u32, fraction: f64) -> usize {
    (f64::from(batch) * fraction) as usize
}

impl Inner {
    /// Puts the next block in service when the current one is spent.
    /// True when there are IDs to claim.
    fn advance(&self) -> bool {
        let Advanced { ready, discarded } = self.buffer.advance();
        if discarded > 0 {
            metrics::counter!(m::DISCARDED, "reason" => "age").increment(discarded as u64);
            // IDs sat unused until they aged out: ask for fewer.
            self.resize(|b| b / 2);
        }
        if ready {
            let mut since = self.served_since.lock().unwrap_or_else(|e| e.into_inner());
            if since.elapsed() > self.config.shrink_after {
                self.resize(|b| b / 2);
            }
            *since = Instant::now();
            metrics::gauge!(m::BUFFER_DEPTH, &self.labels).set(self.buffer.depth() as f64);
        }
        ready
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
            tracing::debug!(mode = ?self.mode, tag = %self.tag, batch = new, "prefetch batch resized");
        }
    }

    /// Starts a refill unless one is in flight.
    fn request_refill(self: &Arc<Self>) {
        let Some(runtime) = &self.runtime else { return };
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        runtime.spawn(Arc::clone(self).refill());
    }

    async fn refill(self: Arc<Self>) {
        let Some(caller) = self.caller.clone() else {
            return;
        };
        if self.stalled.swap(false, Ordering::Relaxed) {
            // Callers found the buffer empty: fetch further ahead.
            self.resize(|b| b.saturating_mul(2));
        }
        let span = tracing::debug_span!("idgen.refill", mode = ?self.mode, tag = %self.tag);
        let result = async {
            loop {
                let count = self.batch.load(Ordering::Relaxed);
                let (mode, tag) = (self.mode as i32, self.tag.clone());
                let got = caller
                    .call("GenIds", Retry::Idempotent, |mut c, left| {
                        let mut req = tonic::Request::new(GenIdsRequest {
                            mode,
                            tag: tag.clone(),
                            count,
                        });
                        req.set_timeout(left);
                        async move { c.gen_ids(req).await.map(|r| r.into_inner().ids) }
                    })
                    .await;
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
        .instrument(span)
        .await;
        let outcome = match result {
            Ok(ids) if !ids.is_empty() => {
                let block = Arc::new(Block::new(ids));
                if self.mode == Mode::Snowflake || self.mode == Mode::Unspecified {
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
            tracing::warn!(mode = ?self.mode, tag = %self.tag, error = %e, "prefetch refill failed");
        }
        self.refilling.store(false, Ordering::Release);
        self.refilled.send_replace(Refilled { error: outcome });
    }
}

impl Drop for Inner {
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
