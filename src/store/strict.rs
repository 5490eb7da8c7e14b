//! Durable strict counters (strict mode), on both backends.
//!
//! A strict key has one stored number: the last value any node handed out
//! (0 before the first call). [`StrictStore::advance`] turns it into the
//! next values with [`crate::id::strict::advance`] and stores the new last
//! value; the values reach the caller only once that write is durable.
//!
//! # Why a value is never handed out twice
//!
//! Every call reads the counter and writes a larger one in one atomic step
//! (one redb write transaction, or a Consul compare-and-set on the
//! ModifyIndex it read with a quorum-confirmed `?consistent` read), and
//! hands out only values in `(read, written]`. Two calls that succeed on
//! the same key are therefore ordered by the store, and the later one read
//! at least the value the earlier one wrote: the ranges never overlap, and
//! a call that starts after another returned gets larger values. A
//! restart changes nothing, because nothing is kept in memory: the next
//! call reads the stored counter again.
//!
//! A write whose outcome is unknown (a timeout, a dropped connection, a
//! 5xx from Consul, a failed redb commit) fails the call at once and its
//! values are never used. If the write did land after all, the next call
//! reads it and starts above it: a gap, never a repeat. For the same
//! reason a lost compare-and-set race is retried with a fresh read, never
//! with the old one.
//!
//! # Group commit (embedded)
//!
//! An fsync per call would cap a node at a few hundred calls a second, so
//! one committer thread ([`EmbeddedStrictStore`]) takes every request that
//! is waiting, applies them all in one write transaction (requests on the
//! same key in arrival order, each seeing the one before), commits once
//! (redb's default durability: fsync) and only then answers every caller.
//! A request that is invalid or exhausts its key fails alone; a failed
//! commit fails the whole batch, none of whose values were durable.
//!
//! # Consul
//!
//! `<prefix>/<cluster>/strict/<namespace>/<key>` holds the counter as a
//! decimal string, `strict-namespaces/<namespace>` a namespace's step. A
//! node runs one call per key at a time (racing itself would only make it
//! lose compare-and-sets against its own writes); lost races against other
//! nodes are retried with jittered backoff, [`MAX_STRICT_ATTEMPTS`] times
//! in all, and then reported as [`StoreError::Contended`].
//!
//! # Limits and deletes
//!
//! A call on a key that is not live creates it; only then are
//! `strict.max_keys_per_namespace` and `strict.max_namespaces` checked
//! (embedded: against live counts kept in the same transaction, see
//! `store::counts`; Consul: by listing, so concurrent creators on several
//! nodes may overshoot by a few). The admin API deletes a key by moving
//! its last value to a tombstone (`strict_tombstones` table,
//! `strict-deleted/<namespace>/<key>` in Consul) in the same atomic step;
//! a key created again starts from its tombstone, so its values never
//! repeat. Tombstones stay and do not count against the limits.
//!
//! Deleting or lowering a stored counter or tombstone by hand (or by
//! restoring an old backup) makes values repeat; an unreadable one is an
//! error naming the key, never a reset to 0.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use redb::{ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::consul::ClusterKeys;
use super::counts;
use super::embedded::{backend_err, blocking, EmbeddedStore};
use super::StoreError;
use crate::consul::{Consistency, ConsulClient, KvWrite, TxnOp, TxnOutcome};
use crate::id::strict::{advance, check_step, Namespace, StrictKey, Values};
use crate::metrics as m;

/// Strict counters and namespace steps.
#[async_trait]
pub trait StrictStore: Send + Sync + 'static {
    /// Reserves the next `count` values of `key` with `step`, durably
    /// (fsync / quorum) before returning.
    async fn advance(&self, key: &StrictKey, step: u64, count: u64) -> Result<Values, StoreError>;

    /// The key's stored value (0 if never used), strongest consistency.
    async fn current(&self, key: &StrictKey) -> Result<u64, StoreError>;

    /// A namespace's configured step, if one was set.
    async fn namespace_step(&self, ns: &Namespace) -> Result<Option<u64>, StoreError>;

    /// Sets a namespace's step (checked with [`check_step`]).
    async fn set_namespace_step(&self, ns: &Namespace, step: u64) -> Result<(), StoreError>;

    /// Every namespace with a configured step, sorted by name.
    async fn namespaces(&self) -> Result<Vec<(Namespace, u64)>, StoreError>;

    /// The live keys of `ns` and their last values, sorted by key.
    async fn list_keys(&self, ns: &Namespace) -> Result<Vec<(StrictKey, u64)>, StoreError>;

    /// Deletes a live key, leaving a tombstone with its last value
    /// (returned), so the key used again continues above it and frees a
    /// slot of `strict.max_keys_per_namespace`.
    /// [`StoreError::StrictKeyNotFound`] if it is not live.
    async fn delete_key(&self, key: &StrictKey) -> Result<u64, StoreError>;
}

/// Limits on what strict calls may create (config `[strict]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrictLimits {
    /// Most live keys in one namespace (`strict.max_keys_per_namespace`).
    pub max_keys_per_namespace: u64,
    /// Most namespaces with live keys (`strict.max_namespaces`).
    pub max_namespaces: u64,
}

impl StrictLimits {
    /// No limits (tests, tools).
    pub const NONE: Self = Self {
        max_keys_per_namespace: u64::MAX,
        max_namespaces: u64::MAX,
    };

    /// The refusal to create `key`, if `keys_in_ns` live keys of its
    /// namespace and `namespaces` live namespaces exist already.
    fn check(&self, key: &StrictKey, keys_in_ns: u64, namespaces: u64) -> Result<(), StoreError> {
        if keys_in_ns >= self.max_keys_per_namespace {
            return Err(StoreError::limit_reached(
                format!(
                    "strict key {:?} cannot be created (namespace {:?} has {keys_in_ns} live keys)",
                    key.as_str(),
                    key.namespace_str()
                ),
                self.max_keys_per_namespace,
                "strict.max_keys_per_namespace",
            ));
        }
        if keys_in_ns == 0 && namespaces >= self.max_namespaces {
            return Err(StoreError::limit_reached(
                format!(
                    "strict key {:?} cannot be created (it would start namespace {:?}; {namespaces} namespaces have live keys)",
                    key.as_str(),
                    key.namespace_str()
                ),
                self.max_namespaces,
                "strict.max_namespaces",
            ));
        }
        Ok(())
    }
}

// ---- Embedded ---------------------------------------------------------------

/// Strict counters: `"<namespace>/<key>"` -> the last value handed out.
/// Only live keys: a deleted key moves to [`STRICT_TOMBSTONES`].
pub(crate) const STRICT: TableDefinition<&str, u64> = TableDefinition::new("strict");
/// Deleted strict keys: `"<namespace>/<key>"` -> the last value handed
/// out before the delete. A key used again continues above it.
pub(crate) const STRICT_TOMBSTONES: TableDefinition<&str, u64> =
    TableDefinition::new("strict_tombstones");
/// Namespace steps: `"<namespace>"` -> step.
pub(crate) const STRICT_NAMESPACES: TableDefinition<&str, u64> =
    TableDefinition::new("strict_namespaces");

/// Most requests applied in one write transaction; more wait for the next.
/// Bounds the transaction's size and the latency of the first callers.
const MAX_BATCH: usize = 4096;

/// One call's request, as the committer applies it.
#[derive(Debug)]
struct Ask {
    key: StrictKey,
    step: u64,
    count: u64,
}

/// A request with the channel its answer goes back on.
struct Request {
    ask: Ask,
    reply: oneshot::Sender<Result<Values, StoreError>>,
}

/// Strict counters in the embedded redb file, made durable by group commit.
///
/// Dropping it stops the committer thread after the requests already sent
/// are committed, and waits for it (at most one commit), so the file can
/// be opened again right away.
pub struct EmbeddedStrictStore {
    store: EmbeddedStore,
    requests: Option<mpsc::Sender<Request>>,
    committer: Option<std::thread::JoinHandle<()>>,
    /// Why the committer thread could not start, if it could not.
    start_error: Option<String>,
    commits: Arc<AtomicU64>,
}

impl std::fmt::Debug for EmbeddedStrictStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStrictStore")
            .field("store", &self.store)
            .field("commits", &self.commits())
            .finish()
    }
}

impl EmbeddedStrictStore {
    /// Strict counters in `store`'s file; starts the committer thread
    /// (`idgen-strict-commit`).
    pub fn new(store: EmbeddedStore) -> Self {
        Self::with_limits(store, StrictLimits::NONE)
    }

    /// Like [`new`](Self::new), refusing to create keys past `limits`.
    pub fn with_limits(store: EmbeddedStore, limits: StrictLimits) -> Self {
        let (tx, rx) = mpsc::channel();
        let commits = Arc::new(AtomicU64::new(0));
        let spawned = {
            let (store, commits) = (store.clone(), Arc::clone(&commits));
            std::thread::Builder::new()
                .name("idgen-strict-commit".into())
                .spawn(move || run_committer(&store, &rx, &commits, limits))
        };
        let (committer, start_error) = match spawned {
            Ok(handle) => (Some(handle), None),
            Err(e) => {
                // The receiver went down with the closure: every advance
                // fails with this error instead of the process panicking.
                tracing::error!(error = %e, "cannot start the strict commit thread");
                (None, Some(e.to_string()))
            }
        };
        Self {
            store,
            requests: Some(tx),
            committer,
            start_error,
            commits,
        }
    }

    /// Write transactions committed so far by the committer thread (each
    /// one answers every request of its batch).
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    fn stopped(&self) -> StoreError {
        StoreError::Backend(match &self.start_error {
            Some(e) => format!("the strict commit thread could not start ({e}); restart the node"),
            None => "the strict commit thread has stopped; restart the node".to_owned(),
        })
    }
}

impl Drop for EmbeddedStrictStore {
    fn drop(&mut self) {
        // Closing the channel ends the committer once it has drained it.
        drop(self.requests.take());
        if let Some(handle) = self.committer.take() {
            if handle.join().is_err() {
                tracing::error!("the strict commit thread panicked");
            }
        }
    }
}

/// The committer thread: one write transaction per batch of waiting
/// requests, answered only after the commit.
fn run_committer(
    store: &EmbeddedStore,
    requests: &mpsc::Receiver<Request>,
    commits: &AtomicU64,
    limits: StrictLimits,
) {
    let batch_size = metrics::histogram!(m::STRICT_COMMIT_BATCH);
    while let Ok(first) = requests.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match requests.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        // A caller that gave up needs no values: do not burn them.
        batch.retain(|r| !r.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        batch_size.record(batch.len() as f64);
        match apply_batch(store, batch.iter().map(|r| &r.ask), limits) {
            Ok(outcomes) => {
                commits.fetch_add(1, Ordering::Relaxed);
                for (request, outcome) in batch.into_iter().zip(outcomes) {
                    // A caller that left meanwhile leaves a gap, not a repeat.
                    let _ = request.reply.send(outcome);
                }
            }
            Err(e) => {
                // Nothing of this batch is durable: none of it may be used.
                let reason = e.to_string();
                tracing::warn!(error = %reason, requests = batch.len(), "strict group commit failed");
                for request in batch {
                    let _ = request.reply.send(Err(StoreError::Backend(format!(
                        "strict key {}: the commit failed ({reason}); no values were reserved, retry",
                        request.ask.key
                    ))));
                }
            }
        }
    }
}

/// Applies `asks` in order in one write transaction and commits it. The
/// outer error fails the whole batch (nothing was committed); an inner
/// error fails only its request (exhausted key, bad step or count).
///
/// A key not live yet is created here: only then are the limits checked
/// (against the live counts kept in the same transaction) and the
/// tombstone read, so calls on existing keys cost what they always did.
fn apply_batch<'a>(
    store: &EmbeddedStore,
    asks: impl IntoIterator<Item = &'a Ask>,
    limits: StrictLimits,
) -> Result<Vec<Result<Values, StoreError>>, StoreError> {
    // A key the restored backup did not hold starts above the restore floor.
    let floor = store.floor().min(crate::id::strict::MAX_VALUE);
    let txn = store.begin_write()?;
    let mut outcomes = Vec::new();
    let mut created = false;
    let mut gauges = None;
    {
        // Opened before the strict table: a file never counted is counted
        // here, by a scan that reads the strict table. Once per group
        // commit, next to an fsync: no cost a call would notice.
        let mut counts = counts::open(&txn)?;
        let mut table = txn.open_table(STRICT).map_err(backend_err)?;
        let mut tombstones = None;
        for ask in asks {
            let key = ask.key.as_str();
            let value = table.get(key).map_err(backend_err)?.map(|v| v.value());
            let start = match value {
                Some(v) => v,
                None => {
                    let tombstones = match &mut tombstones {
                        Some(t) => t,
                        None => tombstones
                            .insert(txn.open_table(STRICT_TOMBSTONES).map_err(backend_err)?),
                    };
                    let ns_key = counts::strict_keys(ask.key.namespace_str());
                    let in_ns = counts::get(&counts, &ns_key)?;
                    let namespaces = counts::get(&counts, counts::STRICT_NAMESPACES)?;
                    if let Err(e) = limits.check(&ask.key, in_ns, namespaces) {
                        outcomes.push(Err(e));
                        continue;
                    }
                    // Check first: a key that cannot advance is not created.
                    let start = tombstones
                        .get(key)
                        .map_err(backend_err)?
                        .map_or(floor, |v| v.value().max(floor));
                    if let Err(e) = advance(&ask.key, start, ask.step, ask.count) {
                        outcomes.push(Err(e.into()));
                        continue;
                    }
                    if in_ns == 0 {
                        counts::add(&mut counts, counts::STRICT_NAMESPACES, 1)?;
                    }
                    counts::add(&mut counts, &ns_key, 1)?;
                    counts::add(&mut counts, counts::STRICT_KEYS_TOTAL, 1)?;
                    created = true;
                    start
                }
            };
            match advance(&ask.key, start, ask.step, ask.count) {
                Ok(values) => {
                    table.insert(key, values.last).map_err(backend_err)?;
                    outcomes.push(Ok(values));
                }
                Err(e) => outcomes.push(Err(e.into())),
            }
        }
        if created {
            gauges = Some(strict_gauges(&counts)?);
        }
    }
    // Default durability: returns after fsync. Until then, nobody sees a value.
    store.commit(txn)?;
    if let Some(gauges) = gauges {
        set_strict_gauges(gauges);
    }
    Ok(outcomes)
}

/// The live strict keys and namespaces in `counts`.
fn strict_gauges(counts: &redb::Table<'_, &'static str, u64>) -> Result<(u64, u64), StoreError> {
    Ok((
        counts::get(counts, counts::STRICT_KEYS_TOTAL)?,
        counts::get(counts, counts::STRICT_NAMESPACES)?,
    ))
}

fn set_strict_gauges((keys, namespaces): (u64, u64)) {
    metrics::gauge!(m::STRICT_KEYS).set(keys as f64);
    metrics::gauge!(m::STRICT_NAMESPACES).set(namespaces as f64);
}

impl EmbeddedStore {
    /// One value of a `&str -> u64` table; `None` if the table or the key
    /// does not exist (files made before strict mode have no tables).
    fn read_u64(
        &self,
        table: TableDefinition<'static, &'static str, u64>,
        key: &str,
    ) -> Result<Option<u64>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(table) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(backend_err(e)),
        };
        let value = table.get(key).map_err(backend_err)?;
        Ok(value.map(|v| v.value()))
    }

    /// The live keys of `ns` (`"<ns>/"` up to `"<ns>0"`: `'0'` follows `'/'`).
    fn list_strict_keys(&self, ns: &Namespace) -> Result<Vec<(StrictKey, u64)>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(STRICT) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(backend_err(e)),
        };
        let (from, to) = (format!("{ns}/"), format!("{ns}0"));
        let mut out = Vec::new();
        for entry in table
            .range(from.as_str()..to.as_str())
            .map_err(backend_err)?
        {
            let (name, value) = entry.map_err(backend_err)?;
            let key = StrictKey::parse(name.value()).map_err(|e| {
                StoreError::Backend(format!(
                    "the state file holds a bad strict key ({e}); restore it from a backup"
                ))
            })?;
            out.push((key, value.value()));
        }
        Ok(out)
    }

    /// Moves a live key to the tombstones (keeping the larger value if
    /// it had one already) and updates the live counts, in one transaction.
    fn delete_strict_key(&self, key: &StrictKey) -> Result<u64, StoreError> {
        let txn = self.begin_write()?;
        let (last, gauges) = {
            // Before the strict table: counting a new file scans it.
            let mut counts = counts::open(&txn)?;
            let mut table = txn.open_table(STRICT).map_err(backend_err)?;
            let Some(last) = table.remove(key.as_str()).map_err(backend_err)? else {
                return Err(StoreError::StrictKeyNotFound(key.to_string()));
            };
            let last = last.value();
            let mut tombstones = txn.open_table(STRICT_TOMBSTONES).map_err(backend_err)?;
            let old = tombstones
                .get(key.as_str())
                .map_err(backend_err)?
                .map_or(0, |v| v.value());
            tombstones
                .insert(key.as_str(), last.max(old))
                .map_err(backend_err)?;
            let left = counts::add(&mut counts, &counts::strict_keys(key.namespace_str()), -1)?;
            if left == 0 {
                counts::add(&mut counts, counts::STRICT_NAMESPACES, -1)?;
            }
            counts::add(&mut counts, counts::STRICT_KEYS_TOTAL, -1)?;
            (last, strict_gauges(&counts)?)
        };
        self.commit(txn)?;
        set_strict_gauges(gauges);
        Ok(last)
    }

    fn write_namespace_step(&self, ns: &Namespace, step: u64) -> Result<(), StoreError> {
        let txn = self.begin_write()?;
        {
            let mut table = txn.open_table(STRICT_NAMESPACES).map_err(backend_err)?;
            table.insert(ns.as_str(), step).map_err(backend_err)?;
        }
        self.commit(txn)
    }

    fn list_namespaces(&self) -> Result<Vec<(Namespace, u64)>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(STRICT_NAMESPACES) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(backend_err(e)),
        };
        let mut out = Vec::new();
        for entry in table.iter().map_err(backend_err)? {
            let (name, step) = entry.map_err(backend_err)?;
            let ns = Namespace::parse(name.value()).map_err(|e| {
                StoreError::Backend(format!(
                    "the state file holds a bad strict namespace ({e}); restore it from a backup"
                ))
            })?;
            out.push((ns, step.value()));
        }
        out.sort();
        Ok(out)
    }
}

#[async_trait]
impl StrictStore for EmbeddedStrictStore {
    async fn advance(&self, key: &StrictKey, step: u64, count: u64) -> Result<Values, StoreError> {
        check_step(step)?;
        let (reply, answer) = oneshot::channel();
        let request = Request {
            ask: Ask {
                key: key.clone(),
                step,
                count,
            },
            reply,
        };
        let requests = self.requests.as_ref().ok_or_else(|| self.stopped())?;
        requests.send(request).map_err(|_| self.stopped())?;
        answer.await.map_err(|_| self.stopped())?
    }

    async fn current(&self, key: &StrictKey) -> Result<u64, StoreError> {
        let (this, key) = (self.store.clone(), key.clone());
        blocking(move || {
            // A deleted key reads as its tombstone: the value it continues above.
            match this.read_u64(STRICT, key.as_str())? {
                Some(v) => Ok(v),
                None => Ok(this.read_u64(STRICT_TOMBSTONES, key.as_str())?.unwrap_or(0)),
            }
        })
        .await
    }

    async fn list_keys(&self, ns: &Namespace) -> Result<Vec<(StrictKey, u64)>, StoreError> {
        let (this, ns) = (self.store.clone(), ns.clone());
        blocking(move || this.list_strict_keys(&ns)).await
    }

    async fn delete_key(&self, key: &StrictKey) -> Result<u64, StoreError> {
        let (this, key) = (self.store.clone(), key.clone());
        blocking(move || this.delete_strict_key(&key)).await
    }

    async fn namespace_step(&self, ns: &Namespace) -> Result<Option<u64>, StoreError> {
        let (this, ns) = (self.store.clone(), ns.clone());
        blocking(move || this.read_u64(STRICT_NAMESPACES, ns.as_str())).await
    }

    async fn set_namespace_step(&self, ns: &Namespace, step: u64) -> Result<(), StoreError> {
        check_step(step)?;
        let (this, ns) = (self.store.clone(), ns.clone());
        blocking(move || this.write_namespace_step(&ns, step)).await
    }

    async fn namespaces(&self) -> Result<Vec<(Namespace, u64)>, StoreError> {
        let this = self.store.clone();
        blocking(move || this.list_namespaces()).await
    }
}

// ---- Consul -----------------------------------------------------------------

/// How often a strict call that lost a compare-and-set race is tried in
/// all, with jittered backoff growing to [`MAX_STRICT_BACKOFF`] (about
/// 1.5 s at worst), before it fails with [`StoreError::Contended`].
pub const MAX_STRICT_ATTEMPTS: u32 = 16;

/// The longest pause between two attempts of a strict call.
pub const MAX_STRICT_BACKOFF: Duration = Duration::from_millis(100);

/// A random pause before attempt `attempt + 1`: full jitter over a cap
/// that doubles from 5 ms up to [`MAX_STRICT_BACKOFF`].
fn backoff(attempt: u32) -> Duration {
    let cap = (5u64 << attempt.min(5)).min(MAX_STRICT_BACKOFF.as_millis() as u64);
    Duration::from_millis(fastrand::u64(0..=cap))
}

/// A stored counter or step: plain ASCII digits.
fn parse_decimal(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes)
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
}

/// The first bytes of a bad stored value, for an error message.
fn preview(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned()
}

/// Strict counters in Consul KV.
pub struct ConsulStrictStore {
    client: ConsulClient,
    keys: ClusterKeys,
    /// One call per key at a time on this node; an entry lives only while
    /// a call on its key runs or waits.
    turns: Mutex<HashMap<StrictKey, Arc<tokio::sync::Mutex<()>>>>,
    conflicts: metrics::Counter,
    limits: StrictLimits,
}

impl std::fmt::Debug for ConsulStrictStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulStrictStore")
            .field("keys", &self.keys)
            .finish()
    }
}

/// This node's turn on one key; dropping it lets the next call in and
/// forgets the key when no call is waiting.
struct KeyTurn<'a> {
    turns: &'a Mutex<HashMap<StrictKey, Arc<tokio::sync::Mutex<()>>>>,
    key: StrictKey,
    lock: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for KeyTurn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        // Clones are only made under this lock: two references (the map's
        // and ours) mean no other call holds or waits for this key.
        if Arc::strong_count(&self.lock) == 2
            && turns
                .get(&self.key)
                .is_some_and(|l| Arc::ptr_eq(l, &self.lock))
        {
            turns.remove(&self.key);
        }
    }
}

impl ConsulStrictStore {
    /// Counters under `keys`' `strict/` folder, steps under
    /// `strict-namespaces/`.
    pub fn new(client: ConsulClient, keys: ClusterKeys) -> Self {
        Self::with_limits(client, keys, StrictLimits::NONE)
    }

    /// Like [`new`](Self::new), refusing to create keys past `limits`.
    /// The limits are checked by listing before the creating write (Consul
    /// has no count a txn could check), so nodes creating keys at the same
    /// moment may overshoot them by a few.
    pub fn with_limits(client: ConsulClient, keys: ClusterKeys, limits: StrictLimits) -> Self {
        Self {
            client,
            keys,
            turns: Mutex::new(HashMap::new()),
            conflicts: metrics::counter!(m::STRICT_CONFLICTS),
            limits,
        }
    }

    /// Refuses to create `key` past the limits: counts the live keys of
    /// its namespace, and when it has none, the namespaces with live keys.
    async fn check_limits(&self, key: &StrictKey) -> Result<(), StoreError> {
        if self.limits == StrictLimits::NONE {
            return Ok(());
        }
        let list = |dir: String| async move {
            self.client
                .kv_list(&dir, Consistency::Consistent)
                .await
                .map_err(|e| {
                    StoreError::Backend(format!(
                        "strict key {key}: cannot count the live keys under {dir} ({e}); retry"
                    ))
                })
        };
        let in_ns = list(self.keys.strict(&format!("{}/", key.namespace_str())))
            .await?
            .len() as u64;
        let namespaces = if in_ns == 0 {
            let dir = self.keys.strict("");
            let all = list(dir.clone()).await?;
            let names: std::collections::BTreeSet<&str> = all
                .iter()
                .filter_map(|e| e.key.strip_prefix(dir.as_str()))
                .filter_map(|k| k.split('/').next())
                .collect();
            metrics::gauge!(m::STRICT_KEYS).set(all.len() as f64);
            metrics::gauge!(m::STRICT_NAMESPACES).set(names.len() as f64);
            names.len() as u64
        } else {
            0
        };
        self.limits.check(key, in_ns, namespaces)
    }

    /// A deleted key's last value and the tombstone's ModifyIndex; `(0, 0)`
    /// if the key was never deleted.
    async fn read_tombstone(&self, key: &StrictKey) -> Result<(u64, u64), StoreError> {
        let kv_key = self.keys.strict_tombstone(key.as_str());
        let (entry, _) = self
            .client
            .kv_get(&kv_key, Consistency::Consistent)
            .await
            .map_err(|e| {
                StoreError::Backend(format!("strict key {key}: cannot read its tombstone: {e}"))
            })?;
        let Some(entry) = entry else {
            return Ok((0, 0));
        };
        let value = parse_decimal(&entry.value).ok_or_else(|| {
            StoreError::Backend(format!(
                "strict key {key}: the tombstone in Consul key {kv_key} is not a decimal number ({:?}); restore it from a backup (never lower it: values would repeat)",
                preview(&entry.value)
            ))
        })?;
        Ok((value, entry.modify_index))
    }

    /// The txn op that fails the write if the tombstone moved since it
    /// was read at `index` (0: it did not exist).
    fn tombstone_unchanged(&self, key: &StrictKey, index: u64) -> TxnOp {
        let key = self.keys.strict_tombstone(key.as_str());
        if index == 0 {
            TxnOp::CheckNotExists { key }
        } else {
            TxnOp::CheckIndex { key, index }
        }
    }

    async fn turn(&self, key: &StrictKey) -> KeyTurn<'_> {
        let lock = {
            let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(turns.entry(key.clone()).or_default())
        };
        let guard = Arc::clone(&lock).lock_owned().await;
        KeyTurn {
            turns: &self.turns,
            key: key.clone(),
            lock,
            guard: Some(guard),
        }
    }

    /// The counter and its ModifyIndex, from a quorum-confirmed read;
    /// `(0, 0)` for a key never used (and a write with index 0 creates it
    /// only if it is still absent).
    async fn read_counter(&self, key: &StrictKey) -> Result<(u64, u64), StoreError> {
        let kv_key = self.keys.strict(key.as_str());
        let (entry, _) = self
            .client
            .kv_get(&kv_key, Consistency::Consistent)
            .await
            .map_err(|e| {
                StoreError::Backend(format!("strict key {key}: cannot read its counter: {e}"))
            })?;
        let Some(entry) = entry else {
            return Ok((0, 0));
        };
        let value = parse_decimal(&entry.value).ok_or_else(|| {
            StoreError::Backend(format!(
                "strict key {key}: the counter in Consul key {kv_key} is not a decimal number ({:?}); restore it from a backup (never lower it: values would repeat)",
                preview(&entry.value)
            ))
        })?;
        Ok((value, entry.modify_index))
    }
}

#[async_trait]
impl StrictStore for ConsulStrictStore {
    async fn advance(&self, key: &StrictKey, step: u64, count: u64) -> Result<Values, StoreError> {
        check_step(step)?;
        let kv_key = self.keys.strict(key.as_str());
        let _turn = self.turn(key).await;
        for attempt in 0..MAX_STRICT_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(backoff(attempt - 1)).await;
            }
            // Always a fresh read: after a lost race or an unknown outcome
            // the counter may have moved (even by our own late write).
            let floor = self.keys.written().written(&kv_key);
            let (mut value, index) = self.read_counter(key).await?;
            let mut ops = Vec::with_capacity(3);
            if index == 0 {
                // Not live: this call creates the key, above its tombstone,
                // and only if no delete moved the tombstone meanwhile.
                self.check_limits(key).await?;
                let (last, tomb_index) = self.read_tombstone(key).await?;
                value = last;
                ops.push(self.tombstone_unchanged(key, tomb_index));
            }
            // The live counter, or the tombstone of a deleted key: below
            // this node's own write, the store was rolled back.
            self.keys
                .written()
                .check("strict", &kv_key, floor, (0, value))?;
            let values = advance(key, value, step, count)?;
            ops.push(TxnOp::Cas {
                key: kv_key.clone(),
                value: values.last.to_string().into_bytes(),
                index,
            });
            ops.extend(self.keys.mark_check());
            match self.client.txn(&ops).await {
                Ok(TxnOutcome::Committed(_)) => {
                    self.keys.written().wrote(&kv_key, (0, values.last));
                    return Ok(values);
                }
                Ok(TxnOutcome::RolledBack(errors)) => {
                    // ACL denials come back as rolled-back txns too: retrying
                    // cannot help those.
                    if let Some(denied) = errors
                        .iter()
                        .find(|e| e.what.to_ascii_lowercase().contains("permission denied"))
                    {
                        return Err(StoreError::Backend(format!(
                            "strict key {key}: Consul refused the write of {kv_key} ({}); check that the ACL token has the policy in consul/acl-policy.hcl",
                            denied.what
                        )));
                    }
                    if self.keys.mark_failed(&ops, &errors) {
                        // This node's mark moved: its keeper, or a restore.
                        self.keys.recheck_mark(&self.client).await?;
                        continue;
                    }
                    // Another node moved the counter first: read again.
                    self.conflicts.increment(1);
                }
                Err(e) => {
                    // Maybe applied: these values are never used, and the
                    // next call reads whatever landed (a gap at worst).
                    return Err(StoreError::Backend(format!(
                        "strict key {key}: the write of its counter failed ({e}); no values were handed out, retry"
                    )));
                }
            }
        }
        Err(StoreError::Contended(format!(
            "strict key {key}: lost the compare-and-set race {MAX_STRICT_ATTEMPTS} times in a row; too many nodes write it at once: retry later, ask for more values per call (count), or spread the load over more keys"
        )))
    }

    async fn current(&self, key: &StrictKey) -> Result<u64, StoreError> {
        match self.read_counter(key).await? {
            (_, 0) => Ok(self.read_tombstone(key).await?.0),
            (value, _) => Ok(value),
        }
    }

    async fn list_keys(&self, ns: &Namespace) -> Result<Vec<(StrictKey, u64)>, StoreError> {
        let root = self.keys.strict("");
        let dir = self.keys.strict(&format!("{ns}/"));
        let entries = self
            .client
            .kv_list(&dir, Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(format!("cannot list strict namespace {ns}: {e}")))?;
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let name = entry.key.strip_prefix(root.as_str()).unwrap_or(&entry.key);
            let key = StrictKey::parse(name).map_err(|e| {
                StoreError::Backend(format!(
                    "Consul key {} is not a strict key ({e}); delete it or restore the folder from a backup",
                    entry.key
                ))
            })?;
            let value = parse_decimal(&entry.value).ok_or_else(|| {
                StoreError::Backend(format!(
                    "strict key {key}: the counter in Consul key {} is not a decimal number ({:?}); restore it from a backup",
                    entry.key,
                    preview(&entry.value)
                ))
            })?;
            out.push((key, value));
        }
        out.sort();
        Ok(out)
    }

    async fn delete_key(&self, key: &StrictKey) -> Result<u64, StoreError> {
        let kv_key = self.keys.strict(key.as_str());
        let _turn = self.turn(key).await;
        for attempt in 0..MAX_STRICT_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(backoff(attempt - 1)).await;
            }
            let (value, index) = self.read_counter(key).await?;
            if index == 0 {
                return Err(StoreError::StrictKeyNotFound(key.to_string()));
            }
            let (old, tomb_index) = self.read_tombstone(key).await?;
            // Both or neither: the counter goes only if the tombstone
            // (never lowered) takes its value.
            let ops = [
                TxnOp::DeleteCas {
                    key: kv_key.clone(),
                    index,
                },
                TxnOp::Cas {
                    key: self.keys.strict_tombstone(key.as_str()),
                    value: value.max(old).to_string().into_bytes(),
                    index: tomb_index,
                },
            ];
            match self.client.txn(&ops).await {
                Ok(TxnOutcome::Committed(_)) => return Ok(value),
                Ok(TxnOutcome::RolledBack(_)) => self.conflicts.increment(1),
                Err(e) => {
                    return Err(StoreError::Backend(format!(
                        "strict key {key}: the delete may or may not have been applied ({e}); list the keys before retrying"
                    )))
                }
            }
        }
        Err(StoreError::Contended(format!(
            "strict key {key}: lost the compare-and-set race {MAX_STRICT_ATTEMPTS} times in a row while deleting it; retry"
        )))
    }

    async fn namespace_step(&self, ns: &Namespace) -> Result<Option<u64>, StoreError> {
        let kv_key = self.keys.strict_namespace(ns.as_str());
        let (entry, _) = self
            .client
            .kv_get(&kv_key, Consistency::Consistent)
            .await
            .map_err(|e| {
                StoreError::Backend(format!("strict namespace {ns}: cannot read its step: {e}"))
            })?;
        entry.map(|e| parse_step(&kv_key, &e.value)).transpose()
    }

    async fn set_namespace_step(&self, ns: &Namespace, step: u64) -> Result<(), StoreError> {
        check_step(step)?;
        let kv_key = self.keys.strict_namespace(ns.as_str());
        let written = self
            .client
            .kv_put(&kv_key, step.to_string().as_bytes(), KvWrite::Set)
            .await
            .map_err(|e| {
                StoreError::Backend(format!(
                    "strict namespace {ns}: cannot write its step ({e}); retry"
                ))
            })?;
        if written {
            Ok(())
        } else {
            Err(StoreError::Backend(format!(
                "strict namespace {ns}: Consul did not apply the write of {kv_key}; retry"
            )))
        }
    }

    async fn namespaces(&self) -> Result<Vec<(Namespace, u64)>, StoreError> {
        let dir = self.keys.strict_namespaces_dir();
        let entries = self
            .client
            .kv_list(&dir, Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(format!("cannot list the strict namespaces: {e}")))?;
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let name = entry.key.strip_prefix(dir.as_str()).unwrap_or(&entry.key);
            let ns = Namespace::parse(name).map_err(|e| {
                StoreError::Backend(format!(
                    "Consul key {} is not a strict namespace ({e}); delete it or restore the folder from a backup",
                    entry.key
                ))
            })?;
            out.push((ns, parse_step(&entry.key, &entry.value)?));
        }
        out.sort();
        Ok(out)
    }
}

/// A stored namespace step, checked like a configured one.
fn parse_step(kv_key: &str, bytes: &[u8]) -> Result<u64, StoreError> {
    parse_decimal(bytes)
        .and_then(|s| check_step(s).ok())
        .ok_or_else(|| {
            StoreError::Backend(format!(
                "the strict namespace step in Consul key {kv_key} is not a number from 1 to {} ({:?}); set it again with the admin API",
                crate::id::strict::MAX_STEP,
                preview(bytes)
            ))
        })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;
    use crate::id::strict::{StrictError, MAX_VALUE};

    fn key(s: &str) -> StrictKey {
        StrictKey::parse(s).unwrap()
    }

    fn ns(s: &str) -> Namespace {
        Namespace::parse(s).unwrap()
    }

    fn ask(k: &str, step: u64, count: u64) -> Ask {
        Ask {
            key: key(k),
            step,
            count,
        }
    }

    fn fresh(dir: &Path) -> (std::path::PathBuf, EmbeddedStrictStore) {
        let path = dir.join("state.redb");
        let store = EmbeddedStore::create(&path, "layout").unwrap();
        (path, EmbeddedStrictStore::new(store))
    }

    /// Writes a counter directly, bypassing the committer.
    fn seed(store: &EmbeddedStore, k: &str, value: u64) {
        let txn = store.db().begin_write().unwrap();
        txn.open_table(STRICT).unwrap().insert(k, value).unwrap();
        txn.commit().unwrap();
    }

    #[tokio::test]
    async fn values_follow_each_other_with_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let (_, store) = fresh(dir.path());
        let k = key("books/b1");
        assert_eq!(store.current(&k).await.unwrap(), 0);
        for expected in 1..=3 {
            let v = store.advance(&k, 1, 1).await.unwrap();
            assert_eq!((v.first, v.last, v.step), (expected, expected, 1));
        }
        assert_eq!(store.current(&k).await.unwrap(), 3);

        let k5 = key("books/b5");
        let v = store.advance(&k5, 5, 3).await.unwrap();
        assert_eq!((v.first, v.last, v.step), (5, 15, 5));
        assert_eq!(v.iter().collect::<Vec<_>>(), vec![5, 10, 15]);
        let v = store.advance(&k5, 5, 1).await.unwrap();
        assert_eq!((v.first, v.last), (20, 20));
        assert_eq!(store.current(&k5).await.unwrap(), 20);
        // The other key did not move.
        assert_eq!(store.current(&k).await.unwrap(), 3);
    }

    #[tokio::test]
    async fn bad_requests_are_refused_without_moving_the_counter() {
        let dir = tempfile::tempdir().unwrap();
        let (_, store) = fresh(dir.path());
        let k = key("books/b1");
        store.advance(&k, 1, 2).await.unwrap();
        for (step, count) in [(0, 1), (crate::id::strict::MAX_STEP + 1, 1), (1, 0)] {
            let err = store.advance(&k, step, count).await.unwrap_err();
            assert!(matches!(err, StoreError::Strict(_)), "{err:?}");
        }
        assert_eq!(store.current(&k).await.unwrap(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_get_distinct_contiguous_increasing_values() {
        const TASKS: usize = 64;
        const CALLS: usize = 50;
        const KEYS: usize = 8;
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = fresh(dir.path());
        let store = Arc::new(store);
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let store = Arc::clone(&store);
            tasks.push(tokio::spawn(async move {
                let k = key(&format!("chats/c{}", t % KEYS));
                let count = 1 + (t % 3) as u64;
                let mut got = Vec::new();
                for _ in 0..CALLS {
                    got.push(store.advance(&k, 1, count).await.unwrap());
                }
                (k, got)
            }));
        }
        let mut per_key: BTreeMap<StrictKey, Vec<u64>> = BTreeMap::new();
        for task in tasks {
            let (k, got) = task.await.unwrap();
            // Each caller's values strictly increase, call after call.
            for pair in got.windows(2) {
                assert!(pair[1].first > pair[0].last, "{k}: {pair:?}");
            }
            per_key
                .entry(k)
                .or_default()
                .extend(got.iter().flat_map(Values::iter));
        }
        assert_eq!(per_key.len(), KEYS);
        let mut requests = 0;
        for (k, mut values) in per_key {
            let n = values.len() as u64;
            values.sort_unstable();
            // Every commit succeeded, so no gaps: exactly 1..=n, each once.
            assert_eq!(values, (1..=n).collect::<Vec<_>>(), "{k}");
            assert_eq!(store.current(&k).await.unwrap(), n, "{k}");
            requests += 1;
        }
        assert_eq!(requests, KEYS);
        let commits = store.commits();
        let calls = (TASKS * CALLS) as u64;
        assert!(
            commits >= 1 && commits < calls,
            "{commits} commits for {calls} calls"
        );

        // A restart: the next value is above every value handed out.
        let before = store.current(&key("chats/c0")).await.unwrap();
        drop(store);
        let reopened =
            EmbeddedStrictStore::new(EmbeddedStore::open(&path, "layout", false).unwrap());
        let v = reopened.advance(&key("chats/c0"), 1, 1).await.unwrap();
        assert_eq!(v.first, before + 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_calls_share_one_commit() {
        let dir = tempfile::tempdir().unwrap();
        let (_, store) = fresh(dir.path());
        let store = Arc::new(store);
        let db = store.store.clone();
        // Hold the write lock so every call piles up behind the committer.
        let held = db.db().begin_write().unwrap();
        let mut tasks = Vec::new();
        for i in 0..64u64 {
            let store = Arc::clone(&store);
            tasks.push(tokio::spawn(async move {
                store
                    .advance(&key(&format!("n/k{}", i % 4)), 1, 1)
                    .await
                    .unwrap()
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            store.commits(),
            0,
            "nothing may commit while the lock is held"
        );
        held.abort().unwrap();
        let mut values = Vec::new();
        for task in tasks {
            values.push(task.await.unwrap().first);
        }
        values.sort_unstable();
        values.dedup();
        assert_eq!(values, (1..=16).collect::<Vec<_>>());
        // The first request alone (already taken when the lock was held),
        // then everything that queued meanwhile.
        let commits = store.commits();
        assert!((1..=3).contains(&commits), "{commits} commits for 64 calls");
    }

    #[test]
    fn one_exhausted_request_does_not_fail_its_batch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let store = EmbeddedStore::create(&path, "layout").unwrap();
        seed(&store, "n/full", MAX_VALUE - 1);
        let batch = [
            ask("n/a", 1, 1),
            ask("n/full", 1, 2),
            ask("n/a", 1, 1),
            ask("n/full", 1, 1),
            ask("n/b", 3, 2),
            ask("n/full", 1, 1),
        ];
        let out = apply_batch(&store, &batch, StrictLimits::NONE).unwrap();
        assert_eq!(out.len(), batch.len());
        // Same key, one batch: each request sees the one before it.
        assert_eq!(out[0].as_ref().unwrap().first, 1);
        assert_eq!(out[2].as_ref().unwrap().first, 2);
        assert!(
            matches!(
                out[1],
                Err(StoreError::Strict(StrictError::Exhausted { .. }))
            ),
            "{:?}",
            out[1]
        );
        assert_eq!(out[3].as_ref().unwrap().first, MAX_VALUE);
        let b = out[4].as_ref().unwrap();
        assert_eq!((b.first, b.last), (3, 6));
        assert!(matches!(
            out[5],
            Err(StoreError::Strict(StrictError::Exhausted { .. }))
        ));
        // Committed: the good requests are durable.
        assert_eq!(store.read_u64(STRICT, "n/a").unwrap(), Some(2));
        assert_eq!(store.read_u64(STRICT, "n/b").unwrap(), Some(6));
        assert_eq!(store.read_u64(STRICT, "n/full").unwrap(), Some(MAX_VALUE));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_exhausted_key_fails_alone_through_the_committer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let inner = EmbeddedStore::create(&path, "layout").unwrap();
        seed(&inner, "n/full", MAX_VALUE);
        let store = Arc::new(EmbeddedStrictStore::new(inner.clone()));
        let held = inner.db().begin_write().unwrap();
        let mut tasks = Vec::new();
        for i in 0..20 {
            let store = Arc::clone(&store);
            let k = if i % 2 == 0 { "n/full" } else { "n/ok" };
            tasks.push(tokio::spawn(
                async move { store.advance(&key(k), 1, 1).await },
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        held.abort().unwrap();
        let mut ok = Vec::new();
        for (i, task) in tasks.into_iter().enumerate() {
            match task.await.unwrap() {
                Ok(v) if i % 2 == 1 => ok.push(v.first),
                Err(StoreError::Strict(StrictError::Exhausted { .. })) if i % 2 == 0 => {}
                other => panic!("call {i}: {other:?}"),
            }
        }
        ok.sort_unstable();
        assert_eq!(ok, (1..=10).collect::<Vec<_>>());
        assert!(store.commits() < 20, "{} commits", store.commits());
    }

    #[tokio::test]
    async fn files_without_strict_tables_read_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let (_, store) = fresh(dir.path());
        assert_eq!(store.current(&key("a/b")).await.unwrap(), 0);
        assert_eq!(store.namespace_step(&ns("a")).await.unwrap(), None);
        assert!(store.namespaces().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn namespace_steps_round_trip_and_list_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = fresh(dir.path());
        store.set_namespace_step(&ns("orders"), 10).await.unwrap();
        store.set_namespace_step(&ns("books"), 3).await.unwrap();
        store.set_namespace_step(&ns("chats"), 7).await.unwrap();
        store.set_namespace_step(&ns("orders"), 20).await.unwrap();
        assert!(matches!(
            store.set_namespace_step(&ns("books"), 0).await,
            Err(StoreError::Strict(StrictError::BadStep(0)))
        ));
        assert_eq!(store.namespace_step(&ns("orders")).await.unwrap(), Some(20));
        assert_eq!(store.namespace_step(&ns("books")).await.unwrap(), Some(3));
        assert_eq!(store.namespace_step(&ns("none")).await.unwrap(), None);
        let expected = vec![(ns("books"), 3), (ns("chats"), 7), (ns("orders"), 20)];
        assert_eq!(store.namespaces().await.unwrap(), expected);
        drop(store);
        let store = EmbeddedStrictStore::new(EmbeddedStore::open(&path, "layout", false).unwrap());
        assert_eq!(store.namespaces().await.unwrap(), expected);
    }

    #[test]
    fn dropping_the_store_stops_its_thread() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = fresh(dir.path());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(store.advance(&key("n/k"), 1, 1)).unwrap();
        drop(store);
        // The committer held the file; it is free again at once.
        let reopened = EmbeddedStore::open(&path, "layout", false).unwrap();
        assert_eq!(reopened.read_u64(STRICT, "n/k").unwrap(), Some(1));
    }

    #[test]
    fn stored_numbers_must_be_plain_digits() {
        assert_eq!(parse_decimal(b"42"), Some(42));
        assert_eq!(parse_decimal(b"0"), Some(0));
        for bad in [
            &b""[..],
            b"+1",
            b"-1",
            b" 1",
            b"1.0",
            b"garbage",
            b"99999999999999999999",
        ] {
            assert_eq!(
                parse_decimal(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(parse_step("k", b"0").is_err());
        assert!(parse_step("k", b"1000001").is_err());
        assert_eq!(parse_step("k", b"5").unwrap(), 5);
    }

    #[test]
    fn backoff_stays_under_its_cap() {
        for attempt in 0..40 {
            let d = backoff(attempt);
            assert!(d <= MAX_STRICT_BACKOFF, "attempt {attempt}: {d:?}");
            assert!(d <= Duration::from_millis(5 << attempt.min(5)));
        }
    }
}
