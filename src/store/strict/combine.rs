//! Node-local combining of strict calls on Consul (docs/SAFETY-RULES-26-ON.md, rules 27
//! and 28).
//!
//! Every call waits in its key's queue. A key with waiting calls and no
//! txn in flight is *ready*; a txn takes ready keys in the order they
//! became ready, as many as fit in one Consul txn (64 ops: the node's mark
//! check, one `cas` per key, and a tombstone check for a key that may be
//! created), and takes every call waiting on each. At most
//! [`MAX_TXNS_IN_FLIGHT`] txns run at once, so keys that become ready
//! meanwhile share the next one.
//!
//! A txn plans each key from the value and ModifyIndex this node last
//! wrote ([`Cached`]: no read) or from a consistent read, cuts the calls'
//! ranges from it in arrival order, and writes the last value with a `cas`
//! on that index. Only a committed txn answers its calls with values. A
//! rolled-back txn answers nothing: keys whose ops failed lost a race (or
//! were moved by this node's late write) and are read again after a
//! jittered pause, their calls first in the queue; the other keys are
//! planned again at once. A txn whose outcome is unknown fails all its
//! calls and forgets what it knew of its keys.
//!
//! [`StrictKv`], what the store and its txn tasks share, lives here with
//! its reads, so the txn tasks never reach back into `consul.rs`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use super::StrictLimits;
use crate::consul::{Consistency, ConsulClient, KvEntry, TxnError, TxnOp, TxnOutcome};
use crate::id::strict::{advance, StrictKey, Values};
use crate::metrics as m;
use crate::store::cas::CasPolicy;
use crate::store::kv_paths::ClusterPaths;
use crate::store::StoreError;

/// Most operations in one Consul txn (docs/CONSUL.md).
const MAX_TXN_OPS: usize = 64;

/// Most txns of strict calls one node has in flight at once. Keys that
/// become ready while this many run share the next txn.
pub(super) const MAX_TXNS_IN_FLIGHT: usize = 4;

/// Where a waiting call's answer goes.
pub(super) type Reply = oneshot::Sender<Result<Values, StoreError>>;

/// One call waiting for its values.
#[derive(Debug)]
pub(super) struct Waiting {
    pub(super) step: u64,
    pub(super) count: u64,
    /// Races its txns lost so far.
    pub(super) lost: u32,
    /// Txns of it that failed only because this node's high-water mark
    /// moved meanwhile (bounded by [`MAX_MARK_MOVES`]).
    pub(super) mark_moves: u32,
    pub(super) reply: Reply,
}

/// A key's value and ModifyIndex as this node's last committed write left
/// them. A `cas` on `index` succeeds only while the key still holds
/// `value` (rule 28).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cached {
    pub(super) value: u64,
    pub(super) index: u64,
}

/// The queues and the cache of one store.
#[derive(Debug, Default)]
pub(super) struct Combiner {
    queue: Mutex<Queue>,
    cache: Mutex<HashMap<StrictKey, Cached>>,
}

#[derive(Debug, Default)]
struct Queue {
    /// Calls per key, in arrival order.
    waiting: HashMap<StrictKey, VecDeque<Waiting>>,
    /// Keys with waiting calls and no txn in flight, in the order they
    /// became so.
    ready: VecDeque<StrictKey>,
    /// Keys with a txn in flight (or pausing after a lost race).
    busy: HashSet<StrictKey>,
    in_flight: usize,
}

/// The calls of one key taken into one txn.
#[derive(Debug)]
struct KeyBatch {
    key: StrictKey,
    calls: Vec<Waiting>,
    cached: Option<Cached>,
}

/// One key's part of a planned txn.
#[derive(Debug)]
struct Planned {
    key: StrictKey,
    kv_key: String,
    /// The ModifyIndex the `cas` expects (0: the key must not exist).
    index: u64,
    /// For a key being created: the check that its tombstone did not move.
    tomb: Option<TxnOp>,
    /// Its ops in the txn: `ops[first..end]`.
    first: usize,
    end: usize,
    /// The value the `cas` writes: the last of the batch.
    last: u64,
    calls: Vec<(Waiting, Values)>,
}

impl Combiner {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn cache(&self) -> MutexGuard<'_, HashMap<StrictKey, Cached>> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets what this node knew of `key` (after a delete, a lost race,
    /// an unknown outcome).
    pub(super) fn forget(&self, key: &StrictKey) {
        self.cache().remove(key);
    }

    /// Queues a call on `key`.
    pub(super) fn push(&self, key: &StrictKey, call: Waiting) {
        let mut q = self.queue();
        let calls = q.waiting.entry(key.clone()).or_default();
        let was_empty = calls.is_empty();
        calls.push_back(call);
        if was_empty && !q.busy.contains(key) {
            q.ready.push_back(key.clone());
        }
    }

    /// The next txn's keys and calls, marked busy; empty when nothing is
    /// ready or [`MAX_TXNS_IN_FLIGHT`] txns run.
    fn take(&self) -> Vec<KeyBatch> {
        let cache = self.cache();
        let mut q = self.queue();
        let mut out = Vec::new();
        if q.in_flight >= MAX_TXNS_IN_FLIGHT {
            return out;
        }
        // The mark check takes one op.
        let mut ops = 1;
        while let Some(key) = q.ready.front() {
            let cached = cache.get(key).copied();
            // A key not known live may be created: a tombstone check too.
            let cost = if cached.is_some() { 1 } else { 2 };
            if ops + cost > MAX_TXN_OPS {
                break;
            }
            ops += cost;
            let Some(key) = q.ready.pop_front() else {
                break;
            };
            let calls = q.waiting.remove(&key).unwrap_or_default().into();
            q.busy.insert(key.clone());
            out.push(KeyBatch { key, calls, cached });
        }
        if !out.is_empty() {
            q.in_flight += 1;
        }
        out
    }

    /// Ends `key`'s turn: `again` (calls of a rolled-back txn) go back to
    /// the front of its queue, in their order.
    fn release(&self, key: StrictKey, again: Vec<Waiting>) {
        let mut q = self.queue();
        q.busy.remove(&key);
        let calls = q.waiting.entry(key.clone()).or_default();
        for call in again.into_iter().rev() {
            calls.push_front(call);
        }
        if calls.is_empty() {
            q.waiting.remove(&key);
        } else {
            q.ready.push_back(key);
        }
    }

    fn txn_done(&self) {
        let mut q = self.queue();
        q.in_flight = q.in_flight.saturating_sub(1);
    }
}

/// Starts txns for the ready keys, as many as may run.
pub(super) fn kick(kv: &Arc<StrictKv>) {
    loop {
        let batch = kv.combiner.take();
        if batch.is_empty() {
            return;
        }
        let kv = Arc::clone(kv);
        tokio::spawn(async move {
            let lost = run(&kv, batch).await;
            kv.combiner.txn_done();
            kick(&kv);
            if let Some((pause, lost)) = lost {
                // Keys that lost a race wait out of the in-flight count, so
                // other keys' txns go on meanwhile.
                tokio::time::sleep(pause).await;
                for (key, again) in lost {
                    kv.combiner.release(key, again);
                }
                kick(&kv);
            }
        });
    }
}

/// The same error for each caller of a batch.
fn copy_err(e: &StoreError) -> StoreError {
    match e {
        StoreError::Contended(s) => StoreError::Contended(s.clone()),
        StoreError::LockLost(s) => StoreError::LockLost(s.clone()),
        StoreError::Strict(s) => StoreError::Strict(s.clone()),
        StoreError::Regressed {
            kind,
            key,
            stored,
            wrote,
        } => StoreError::Regressed {
            kind,
            key: key.clone(),
            stored: stored.clone(),
            wrote: wrote.clone(),
        },
        StoreError::IndexWentBack { dir, index, seen } => StoreError::IndexWentBack {
            dir: dir.clone(),
            index: *index,
            seen: *seen,
        },
        StoreError::ClusterRegressed {
            key,
            record,
            node,
            found,
        } => StoreError::ClusterRegressed {
            key: key.clone(),
            record: record.clone(),
            node: node.clone(),
            found: found.clone(),
        },
        other => StoreError::Backend(match other {
            StoreError::Backend(s) => s.clone(),
            e => e.to_string(),
        }),
    }
}

/// How many txns of one call may fail only on this node's mark check
/// before the call is answered with an error.
pub(super) const MAX_MARK_MOVES: u32 = 8;

/// Keys that lost a race, with their calls, and the pause before they
/// are planned again (from a fresh read).
type Lost = (std::time::Duration, Vec<(StrictKey, Vec<Waiting>)>);

/// One txn: plan every key, write, answer or requeue, release the keys
/// (those that lost a race are returned, to be released after a pause).
async fn run(kv: &Arc<StrictKv>, batch: Vec<KeyBatch>) -> Option<Lost> {
    let mut ops = Vec::new();
    let mut planned = Vec::new();
    let (plans, read) = plan_keys(kv, batch).await;
    for b in plans {
        match b {
            Ok(mut p) => {
                p.first = ops.len();
                ops.extend(p.tomb.take());
                ops.push(TxnOp::Cas {
                    key: p.kv_key.clone(),
                    value: p.last.to_string().into_bytes(),
                    index: p.index,
                });
                p.end = ops.len();
                planned.push(p);
            }
            Err(key) => kv.combiner.release(key, Vec::new()),
        }
    }
    if planned.is_empty() {
        return None;
    }
    // The cluster record (cached plans too) and, after the reads, the
    // cluster's index; then the record's check and the mark check.
    match kv
        .keys
        .before_write(&kv.client, &planned[0].kv_key, read)
        .await
    {
        Ok(guards) => ops.extend(guards),
        Err(e) => {
            fail_all(kv, planned, &e);
            return None;
        }
    }
    let calls: usize = planned.iter().map(|p| p.calls.len()).sum();
    metrics::histogram!(m::STRICT_CONSUL_BATCH).record(calls as f64);
    match kv.client.txn(&ops).await {
        Ok(TxnOutcome::Committed(results)) => {
            kv.keys.index().committed(&results);
            committed(kv, planned, &results)
        }
        Ok(TxnOutcome::RolledBack(errors)) if kv.keys.record_failed(&ops, &errors) => {
            let e = kv.keys.refused_by_record(&planned[0].kv_key).await;
            fail_all(kv, planned, &e);
        }
        Ok(TxnOutcome::RolledBack(errors)) => return rolled_back(kv, planned, &ops, &errors).await,
        Err(e) => {
            // Maybe applied: these values are never used, and every key is
            // read again (a gap at worst).
            for p in planned {
                kv.combiner.forget(&p.key);
                let error = StoreError::Backend(format!(
                    "strict key {}: the write of its counter failed ({e}); no values were handed out, retry",
                    p.key
                ));
                for (call, _) in p.calls {
                    let _ = call.reply.send(Err(copy_err(&error)));
                }
                kv.combiner.release(p.key, Vec::new());
            }
        }
    }
    None
}

/// Nothing was written: every call of the batch gets `e`, and every key
/// is read again next time.
fn fail_all(kv: &StrictKv, planned: Vec<Planned>, e: &StoreError) {
    for p in planned {
        kv.combiner.forget(&p.key);
        for (call, _) in p.calls {
            let _ = call.reply.send(Err(copy_err(e)));
        }
        kv.combiner.release(p.key, Vec::new());
    }
}

/// The write is durable: remember it, then hand out the values.
fn committed(kv: &StrictKv, planned: Vec<Planned>, results: &[KvEntry]) {
    for p in planned {
        kv.keys.written().wrote(&p.kv_key, (0, p.last));
        match results.iter().find(|e| e.key == p.kv_key) {
            Some(e) => kv.combiner.cache().insert(
                p.key.clone(),
                Cached {
                    value: p.last,
                    index: e.modify_index,
                },
            ),
            None => kv.combiner.cache().remove(&p.key),
        };
        for (call, values) in p.calls {
            // A caller that left meanwhile leaves a gap, not a repeat.
            let _ = call.reply.send(Ok(values));
        }
        kv.combiner.release(p.key, Vec::new());
    }
}

/// Nothing was written and nothing is handed out. Keys whose ops failed
/// are read again after a pause; the others are planned again at once.
async fn rolled_back(
    kv: &StrictKv,
    planned: Vec<Planned>,
    ops: &[TxnOp],
    errors: &[TxnError],
) -> Option<Lost> {
    if let Some(denied) = errors
        .iter()
        .find(|e| e.what.to_ascii_lowercase().contains("permission denied"))
    {
        // ACL denials come back as rolled-back txns too: retrying cannot
        // help those.
        for p in planned {
            let error = StoreError::Backend(format!(
                "strict key {}: Consul refused the write of {} ({}); check that the ACL token has the policy in consul/acl-policy.hcl",
                p.key, p.kv_key, denied.what
            ));
            for (call, _) in p.calls {
                let _ = call.reply.send(Err(copy_err(&error)));
            }
            kv.combiner.release(p.key, Vec::new());
        }
        return None;
    }
    let mark_moved = kv.keys.mark_failed(ops, errors);
    if mark_moved {
        // This node's mark moved (its keeper, or a restore): re-read it;
        // every key is read again too.
        if let Err(e) = kv.keys.recheck_mark(&kv.client).await {
            for p in planned {
                kv.combiner.forget(&p.key);
                for (call, _) in p.calls {
                    let _ = call.reply.send(Err(copy_err(&e)));
                }
                kv.combiner.release(p.key, Vec::new());
            }
            return None;
        }
    }
    let mut lost = Vec::new();
    for p in planned {
        let failed = errors
            .iter()
            .any(|e| (p.first..p.end).contains(&e.op_index));
        if failed || mark_moved {
            kv.combiner.forget(&p.key);
        }
        if failed && !mark_moved {
            // Another node (or this node's late write) moved the key.
            kv.conflicts.increment(1);
            lost.push(p);
        } else if mark_moved {
            let again = after_mark_move(&p.key, p.calls);
            kv.combiner.release(p.key, again);
        } else {
            let again = p.calls.into_iter().map(|(c, _)| c).collect();
            kv.combiner.release(p.key, again);
        }
    }
    let mut worst = 0;
    let lost: Vec<(StrictKey, Vec<Waiting>)> = lost
        .into_iter()
        .map(|p| {
            let mut again = Vec::new();
            for (mut call, _) in p.calls {
                call.lost += 1;
                if call.lost >= STRICT_POLICY.attempts {
                    let _ = call.reply.send(Err(StoreError::Contended(format!(
                        "strict key {}: lost the compare-and-set race {} times in a row; too many nodes write it at once: retry later, ask for more values per call (count), or spread the load over more keys",
                        p.key, call.lost
                    ))));
                } else {
                    worst = worst.max(call.lost);
                    again.push(call);
                }
            }
            (p.key, again)
        })
        .collect();
    (!lost.is_empty()).then(|| (STRICT_POLICY.pause(worst.saturating_sub(1)), lost))
}

/// The calls of `key` to plan again after a txn that failed only on this
/// node's mark check; a call that failed so [`MAX_MARK_MOVES`] times is
/// answered instead (its mark keeps moving between the re-read and the
/// write, which its keeper's one write a second never does for long).
fn after_mark_move(key: &StrictKey, calls: Vec<(Waiting, Values)>) -> Vec<Waiting> {
    let mut again = Vec::new();
    for (mut call, _) in calls {
        call.mark_moves += 1;
        if call.mark_moves >= MAX_MARK_MOVES {
            let _ = call.reply.send(Err(StoreError::Contended(format!(
                "strict key {key}: this node's high-water mark moved during each of its last {} writes; no values were handed out, retry (and check what writes the mark besides this node)",
                call.mark_moves
            ))));
        } else {
            again.push(call);
        }
    }
    again
}

/// Plans each key of `batch` (the reads run at once); a key none of
/// whose calls gets values comes back as `Err(key)`, its calls answered.
/// Plans every key of `batch` (from its cached write, or a read), and
/// says whether any key was read.
async fn plan_keys(
    kv: &Arc<StrictKv>,
    batch: Vec<KeyBatch>,
) -> (Vec<Result<Planned, StrictKey>>, bool) {
    let mut reads = tokio::task::JoinSet::new();
    // The key each read task plans, for a task that panics.
    let mut reading = HashMap::new();
    let mut out = Vec::with_capacity(batch.len());
    let mut spawned = 0usize;
    for (i, mut b) in batch.into_iter().enumerate() {
        // A caller that gave up needs no values: do not burn them.
        b.calls.retain(|c| !c.reply.is_closed());
        if b.calls.is_empty() {
            out.push((i, Err(b.key)));
            continue;
        }
        let kv_key = kv.keys.strict(b.key.as_str());
        match b.cached {
            Some(c) => out.push((i, cut(b, kv_key, c.value, c.index, None))),
            None => {
                let kv = Arc::clone(kv);
                let key = b.key.clone();
                let task = reads.spawn(async move {
                    #[cfg(test)]
                    panic_once_on(&b.key);
                    let start = kv.read_for_write(&b.key, &kv_key).await;
                    (i, b, kv_key, start)
                });
                reading.insert(task.id(), (i, key));
                spawned += 1;
            }
        }
    }
    while let Some(read) = reads.join_next().await {
        let (i, b, kv_key, start) = match read {
            Ok(read) => read,
            Err(e) => {
                // A read task that panicked dropped its calls' senders
                // (the callers see an error); its key is freed for the
                // next calls.
                if let Some((i, key)) = reading.remove(&e.id()) {
                    out.push((i, Err(key)));
                }
                continue;
            }
        };
        match start {
            Ok((value, index, tomb)) => out.push((i, cut(b, kv_key, value, index, tomb))),
            Err(e) => {
                for call in b.calls {
                    let _ = call.reply.send(Err(copy_err(&e)));
                }
                out.push((i, Err(b.key)));
            }
        }
    }
    out.sort_by_key(|(i, _)| *i);
    let read = spawned > 0;
    (out.into_iter().map(|(_, p)| p).collect(), read)
}

/// The key whose first read panics, for the test of a panicking read.
#[cfg(test)]
pub(super) const PANICS_ON_FIRST_READ: &str = "combiner/panics-on-first-read";

#[cfg(test)]
fn panic_once_on(key: &StrictKey) {
    static PANICKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if key.as_str() == PANICS_ON_FIRST_READ
        && !PANICKED.swap(true, std::sync::atomic::Ordering::SeqCst)
    {
        panic!("the test's panicking read of {key}");
    }
}

/// Cuts the calls' ranges from `value` in arrival order; a call that
/// cannot advance (the key used up) fails alone.
fn cut(
    b: KeyBatch,
    kv_key: String,
    value: u64,
    index: u64,
    tomb: Option<TxnOp>,
) -> Result<Planned, StrictKey> {
    let mut last = value;
    let mut calls = Vec::with_capacity(b.calls.len());
    for call in b.calls {
        match advance(&b.key, last, call.step, call.count) {
            Ok(values) => {
                last = values.last;
                calls.push((call, values));
            }
            Err(e) => {
                let _ = call.reply.send(Err(e.into()));
            }
        }
    }
    if calls.is_empty() {
        return Err(b.key);
    }
    Ok(Planned {
        key: b.key,
        kv_key,
        index,
        tomb,
        first: 0,
        end: 0,
        last,
        calls,
    })
}

/// How often a strict call that lost a compare-and-set race is tried in
/// all, with jittered backoff growing to [`MAX_STRICT_BACKOFF`] (about
/// 1.5 s at worst), before it fails with [`StoreError::Contended`].
pub const MAX_STRICT_ATTEMPTS: u32 = 16;

/// The longest pause between two attempts of a strict call.
pub const MAX_STRICT_BACKOFF: Duration = Duration::from_millis(100);

/// The policy of strict calls: [`MAX_STRICT_ATTEMPTS`], pauses growing
/// to [`MAX_STRICT_BACKOFF`].
pub(super) const STRICT_POLICY: CasPolicy = CasPolicy {
    attempts: MAX_STRICT_ATTEMPTS,
    max_pause: MAX_STRICT_BACKOFF,
};

/// What the store and its txn tasks share (not nameable outside
/// `store::strict`).
pub struct StrictKv {
    pub(super) client: ConsulClient,
    pub(super) keys: ClusterPaths,
    pub(super) conflicts: metrics::Counter,
    pub(super) limits: StrictLimits,
    pub(super) combiner: Combiner,
}

impl StrictKv {
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
    pub(super) async fn read_tombstone(&self, key: &StrictKey) -> Result<(u64, u64), StoreError> {
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

    /// The value a batch on `key` (Consul key `kv_key`) starts from, the
    /// ModifyIndex its `cas` expects, and for a key that is not live the
    /// check that its tombstone does not move: always from a fresh read,
    /// checked against what this node wrote there.
    pub(super) async fn read_for_write(
        &self,
        key: &StrictKey,
        kv_key: &str,
    ) -> Result<(u64, u64, Option<TxnOp>), StoreError> {
        let floor = self.keys.written().written(kv_key);
        let (mut value, index) = self.read_counter(key).await?;
        let mut tomb = None;
        if index == 0 {
            // Not live: this batch creates the key, above its tombstone,
            // and only if no delete moved the tombstone meanwhile.
            self.check_limits(key).await?;
            let (last, tomb_index) = self.read_tombstone(key).await?;
            value = last;
            tomb = Some(self.tombstone_unchanged(key, tomb_index));
        }
        // The live counter, or the tombstone of a deleted key: below
        // this node's own write, the store was rolled back.
        self.keys
            .written()
            .check("strict", kv_key, floor, (0, value))?;
        Ok((value, index, tomb))
    }

    pub(super) async fn read_counter(&self, key: &StrictKey) -> Result<(u64, u64), StoreError> {
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

/// A stored counter or step: plain ASCII digits.
pub(super) fn parse_decimal(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes)
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
}

/// The first bytes of a bad stored value, for an error message.
pub(super) fn preview(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned()
}
