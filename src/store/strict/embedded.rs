//! Strict counters in the embedded state file, made durable by group
//! commit (one committer thread, one write transaction per batch).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use async_trait::async_trait;
use redb::{ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::{StrictLimits, StrictStore, STRICT, STRICT_NAMESPACES, STRICT_TOMBSTONES};
use crate::id::strict::StrictError;
use crate::id::strict::{advance, check_step, Namespace, StrictKey, Values};
use crate::metrics as m;
use crate::store::counts;
use crate::store::embedded::{backend_err, blocking, EmbeddedStore};
use crate::store::StoreError;

/// Most requests applied in one write transaction; more wait for the next.
/// Bounds the transaction's size and the latency of the first callers.
const MAX_BATCH: usize = 4096;

/// One call's request, as the committer applies it.
#[derive(Debug)]
pub(super) struct Ask {
    pub(super) key: StrictKey,
    pub(super) step: u64,
    pub(super) count: u64,
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
    pub(super) store: EmbeddedStore,
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
pub(super) fn apply_batch<'a>(
    store: &EmbeddedStore,
    asks: impl IntoIterator<Item = &'a Ask>,
    limits: StrictLimits,
) -> Result<Vec<Result<Values, StoreError>>, StoreError> {
    // A key the restored backup did not hold starts above the restore's
    // strict floor.
    let floor = store.strict_floor().min(crate::id::strict::MAX_VALUE);
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
    pub(super) fn read_u64(
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
        self.list_strict_table(STRICT, ns)
    }

    /// The keys of `ns` in `def` (the live keys or the tombstones).
    fn list_strict_table(
        &self,
        def: TableDefinition<&str, u64>,
        ns: &Namespace,
    ) -> Result<Vec<(StrictKey, u64)>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(def) {
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
                return Err(StoreError::Strict(StrictError::KeyNotFound(
                    key.to_string(),
                )));
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

    /// The namespaces of the live keys: one range lookup per namespace
    /// (after `ns/...` the next one starts at `ns0`, `'0'` following `'/'`).
    fn list_key_namespaces(&self) -> Result<Vec<Namespace>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(STRICT) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(backend_err(e)),
        };
        let mut out = Vec::new();
        let mut from = String::new();
        loop {
            let mut range = table.range(from.as_str()..).map_err(backend_err)?;
            let Some(entry) = range.next() else { break };
            let (name, _) = entry.map_err(backend_err)?;
            let key = StrictKey::parse(name.value()).map_err(|e| {
                StoreError::Backend(format!(
                    "the state file holds a bad strict key ({e}); restore it from a backup"
                ))
            })?;
            from = format!("{}0", key.namespace_str());
            out.push(key.namespace());
        }
        // Key order is not name order ("a-b/x" sorts before "a/x").
        out.sort();
        Ok(out)
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

    async fn list_tombstones(&self, ns: &Namespace) -> Result<Vec<(StrictKey, u64)>, StoreError> {
        let (this, ns) = (self.store.clone(), ns.clone());
        blocking(move || this.list_strict_table(STRICT_TOMBSTONES, &ns)).await
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

    async fn key_namespaces(&self) -> Result<Vec<Namespace>, StoreError> {
        let this = self.store.clone();
        blocking(move || this.list_key_namespaces()).await
    }

    async fn namespaces(&self) -> Result<Vec<(Namespace, u64)>, StoreError> {
        let this = self.store.clone();
        blocking(move || this.list_namespaces()).await
    }
}
