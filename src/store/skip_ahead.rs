//! `idgen admin skip-ahead`: after a Consul snapshot restore, moves every
//! counter of the cluster forward by a margin, so that nothing handed out
//! between the snapshot and the restore is handed out again.
//!
//! One run, in this order:
//!
//! 1. The record at `<prefix>/<cluster>/skip-ahead` is written first: the
//!    time of the run, the margin, and the formatted-mode floor (the sum
//!    of every margin so far). A formatted counter that starts a period
//!    beginning at or before `until_ms` (the run's time plus
//!    `hwm.reserve`) starts that floor above its minimum, since the lost
//!    writes may have used that period.
//! 2. Every segment record (tombstones too), strict counter and strict
//!    tombstone, lease-token counter and formatted counter moves forward by
//!    the margin, and every high-water mark rises to at least `until_ms`.
//!    Each key is one compare-and-set on the ModifyIndex of the listing (or
//!    of a re-read after a node wrote it meanwhile), so a write racing the
//!    run is never overwritten with a lower value.
//!
//! 3. The cluster regression record (`<prefix>/<cluster>/regression`) is
//!    deleted, last: every node resumes its counter modes at its next mark
//!    renewal.
//!
//! Running it twice moves every counter twice: a gap, never a repeat. A
//! run cut short (an error names the key) can simply be run again.

use super::format::counters::CounterRecordBytes;
use super::kv_paths::ClusterPaths;
use super::lease::LeaseTokenRecord;
use super::regression::SkipAheadRecord;
use super::StoreError;
use crate::consul::{Consistency, ConsulClient, KvEntry, TxnOp, TxnOutcome};
use crate::id::segment::TagRecord;

/// How often a key that a node changed under the run is re-read and tried
/// again before the run gives up.
const MAX_ATTEMPTS: u32 = 16;

/// What one run moved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkipAheadReport {
    /// The record written first.
    pub record: Option<SkipAheadRecord>,
    /// Segment records moved (tombstones included).
    pub segments: u64,
    /// Strict counters and tombstones moved.
    pub strict: u64,
    /// Lease-token counters moved.
    pub lease_tokens: u64,
    /// Formatted-mode counters moved.
    pub format_counters: u64,
    /// High-water marks raised.
    pub marks: u64,
}

impl SkipAheadReport {
    /// A sentence for the operator about a run of `margin`.
    pub fn summary(&self, margin: u64) -> String {
        let record = self.record.unwrap_or_default();
        format!(
            "moved {} segment records, {} strict counters and tombstones, {} lease tokens and {} formatted counters forward by {margin}, and raised {} high-water marks to at least {} ms; this was skip-ahead number {} of this cluster (running it again moves everything again: safe)",
            self.segments, self.strict, self.lease_tokens, self.format_counters, self.marks,
            record.until_ms, record.runs
        )
    }
}

/// How one folder's values move: `None` leaves a key as it is.
type Bump<'a> = &'a (dyn Fn(&KvEntry) -> Result<Option<Vec<u8>>, StoreError> + Sync);

fn decimal(entry: &KvEntry) -> Result<u64, StoreError> {
    std::str::from_utf8(&entry.value)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| {
            StoreError::Backend(format!(
                "{} is not a decimal number; fix it by hand (never lower it), then run the skip-ahead again",
                entry.key
            ))
        })
}

fn backend(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!(
        "skip-ahead: {what} ({e}); counters moved so far stay moved: run it again (moving twice is safe)"
    ))
}

/// Moves every counter under `keys` forward by `margin` and every mark to
/// at least `now_ms + reserve_ms` (see the module doc).
pub async fn skip_ahead(
    client: &ConsulClient,
    keys: &ClusterPaths,
    margin: u64,
    now_ms: u64,
    reserve_ms: u64,
) -> Result<SkipAheadReport, StoreError> {
    let until_ms = now_ms.saturating_add(reserve_ms);
    let record = write_record(client, keys, margin, now_ms, until_ms).await?;
    let add = |v: u64, max: u64| v.saturating_add(margin).min(max);
    let segment = |e: &KvEntry| {
        let mut r: TagRecord = serde_json::from_slice(&e.value)
            .map_err(|err| backend(&format!("segment record {} is unreadable", e.key), err))?;
        r.max_id = add(r.max_id, crate::id::segment::MAX_SEGMENT_ID);
        Ok(serde_json::to_vec(&r).ok())
    };
    let strict = |e: &KvEntry| {
        let v = add(decimal(e)?, crate::id::strict::MAX_VALUE);
        Ok(Some(v.to_string().into_bytes()))
    };
    let lease = |e: &KvEntry| {
        let mut r: LeaseTokenRecord = serde_json::from_slice(&e.value)
            .map_err(|err| backend(&format!("lease token {} is unreadable", e.key), err))?;
        r.reserved = add(r.reserved, crate::id::lease::MAX_SEQUENCE);
        Ok(serde_json::to_vec(&r).ok())
    };
    let format = |e: &KvEntry| CounterRecordBytes::skip_ahead(&e.key, &e.value, margin).map(Some);
    let mark = |e: &KvEntry| {
        let v = decimal(e)?;
        Ok((v < until_ms).then(|| until_ms.to_string().into_bytes()))
    };
    let root = keys.root_dir();
    let mut report = SkipAheadReport {
        record: Some(record),
        ..SkipAheadReport::default()
    };
    report.segments = move_folder(client, &format!("{root}segments/"), &segment).await?;
    report.strict = move_folder(client, &format!("{root}strict/"), &strict).await?
        + move_folder(client, &format!("{root}strict-deleted/"), &strict).await?;
    report.lease_tokens = move_folder(client, &format!("{root}lease/"), &lease).await?;
    report.format_counters = move_folder(client, &format!("{root}formats/"), &format).await?;
    report.marks = move_folder(client, &keys.hwm_dir(), &mark).await?;
    // Only now, every counter moved: nodes stop refusing at their next
    // mark renewal.
    let record = keys.regression();
    client
        .kv_delete(&record, None)
        .await
        .map_err(|e| backend(&format!("cannot delete {record}"), e))?;
    Ok(report)
}

/// Writes the run's record (a compare-and-set on the one it replaces).
async fn write_record(
    client: &ConsulClient,
    keys: &ClusterPaths,
    margin: u64,
    now_ms: u64,
    until_ms: u64,
) -> Result<SkipAheadRecord, StoreError> {
    let key = keys.skip_ahead();
    for _ in 0..MAX_ATTEMPTS {
        let (entry, _) = client
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(|e| backend(&format!("cannot read {key}"), e))?;
        let (old, index) = match &entry {
            Some(e) => (
                Some(SkipAheadRecord::decode(&key, &e.value)?),
                e.modify_index,
            ),
            None => (None, 0),
        };
        let record = SkipAheadRecord {
            at_ms: now_ms,
            margin,
            until_ms: i64::try_from(until_ms).unwrap_or(i64::MAX),
            floor: old.map_or(0, |o| o.floor).saturating_add(margin),
            runs: old.map_or(0, |o| o.runs) + 1,
        };
        let ops = [TxnOp::Cas {
            key: key.clone(),
            value: serde_json::to_vec(&record).unwrap_or_default(),
            index,
        }];
        match client.txn(&ops).await {
            Ok(TxnOutcome::Committed(_)) => return Ok(record),
            Ok(TxnOutcome::RolledBack(_)) => continue,
            Err(e) => return Err(backend(&format!("the write of {key} failed"), e)),
        }
    }
    Err(StoreError::Contended(format!(
        "skip-ahead: {key} changed {MAX_ATTEMPTS} times while it was written (another skip-ahead running?); run it again"
    )))
}

/// Moves every key under `dir` as `bump` says; returns how many moved.
async fn move_folder(client: &ConsulClient, dir: &str, bump: Bump<'_>) -> Result<u64, StoreError> {
    let entries = client
        .kv_list(dir, Consistency::Consistent)
        .await
        .map_err(|e| backend(&format!("cannot list {dir}"), e))?;
    let mut moved = 0;
    for entry in entries {
        if move_key(client, entry, bump).await? {
            moved += 1;
        }
    }
    Ok(moved)
}

/// One key: a compare-and-set on the index it was read at, re-read and
/// tried again when a node wrote it meanwhile. A cas keeps the lock of a
/// held lease token; its holder's next write fails once, and it takes the
/// token back with the moved counter.
async fn move_key(
    client: &ConsulClient,
    entry: KvEntry,
    bump: Bump<'_>,
) -> Result<bool, StoreError> {
    let mut entry = entry;
    for _ in 0..MAX_ATTEMPTS {
        let Some(value) = bump(&entry)? else {
            return Ok(false);
        };
        let ops = [TxnOp::Cas {
            key: entry.key.clone(),
            value,
            index: entry.modify_index,
        }];
        match client.txn(&ops).await {
            Ok(TxnOutcome::Committed(_)) => return Ok(true),
            Ok(TxnOutcome::RolledBack(_)) => {}
            Err(e) => return Err(backend(&format!("the write of {} failed", entry.key), e)),
        }
        let key = entry.key.clone();
        match client.kv_get(&key, Consistency::Consistent).await {
            Ok((Some(e), _)) => entry = e,
            // Deleted meanwhile (a strict key moved to its tombstone,
            // which the run moves too).
            Ok((None, _)) => return Ok(false),
            Err(e) => return Err(backend(&format!("cannot read {key}"), e)),
        }
    }
    Err(StoreError::Contended(format!(
        "skip-ahead: {} changed {MAX_ATTEMPTS} times in a row under the run; run it again (moving twice is safe)",
        entry.key
    )))
}
