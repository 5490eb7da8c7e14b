//! Reading a backup back and restoring it: a new state file with every
//! counter moved forward by the margin, the floor for counters the backup
//! did not hold, and every high-water mark raised.

use std::collections::BTreeMap;
use std::path::Path;

use redb::{ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition};

use super::rates::{read_counters, Counters};
use super::{copy_table, temp_beside, SNAPSHOT, SNAPSHOT_KIND, SNAPSHOT_RATES};
use crate::id::format::FormatDef;
use crate::id::segment::TagRecord;
use crate::store::counts::COUNTS;
use crate::store::embedded::{
    backend_err, EmbeddedStore, FORMAT_VERSION, HWM, META, RESTORE_FLOOR, RESTORE_FLOOR_STRICT,
};
use crate::store::format::catalog::{StoredFormat, FORMAT_DEFS};
use crate::store::format::counters::FORMATS_RESTORED_UNTIL;
use crate::store::format::restore::{self as format_restore, FormatMargins, RestoredFormat};
use crate::store::lease::{LEASE, LEASE_ZONES};
use crate::store::segment::SEGMENTS;
use crate::store::strict::{STRICT, STRICT_NAMESPACES, STRICT_TOMBSTONES};
use crate::store::StoreError;

/// What a snapshot file holds, read back for restore.
#[derive(Debug, Clone)]
pub struct SnapshotInfo {
    /// When it was taken, Unix ms.
    pub taken_at_ms: u64,
    /// The layout recorded by `idgen init`.
    pub layout: String,
    /// Whether rates were measured (a running node's backup).
    pub rates_known: bool,
    /// What the backup says of its rates ("measured", or why not).
    pub rates_note: String,
    /// Per counter, its rate per second when the snapshot was taken.
    pub rates: BTreeMap<String, f64>,
    /// Every counter's value in the snapshot.
    pub counters: Counters,
    /// Largest segment step: the tags' steps, or the node's max step.
    pub largest_step: u64,
    /// The node's lease block size (0 if unknown or off).
    pub lease_block: u64,
    /// The floor of an earlier restore, carried along.
    pub floor: u64,
    /// The strict floor of an earlier restore, carried along.
    pub strict_floor: u64,
    /// A rescue snapshot: taken by the node after its state file was
    /// deleted or replaced, when it had stopped issuing for good.
    pub taken_after_loss: bool,
    /// A mirror (`store.mirror_path`): rewritten after every commit and
    /// before that commit's IDs were handed out.
    pub mirror: bool,
    /// The node's `formatted.block` (0 if unknown).
    pub formatted_block: u64,
    /// The live format definitions the snapshot holds.
    pub format_defs: Vec<FormatDef>,
}

impl SnapshotInfo {
    /// Whether the snapshot holds every reservation whose IDs anyone saw
    /// (a mirror, or a rescue snapshot), so a restore needs no margin.
    pub fn is_current(&self) -> bool {
        self.mirror || self.taken_after_loss
    }
}

fn not_a_snapshot(path: &Path, why: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!(
        "{} is not an idgen snapshot ({why}); give a file written by `idgen state backup`",
        path.display()
    ))
}

fn open_snapshot(path: &Path) -> Result<redb::ReadOnlyDatabase, StoreError> {
    if !path.is_file() {
        return Err(StoreError::Backend(format!(
            "backup {} does not exist or is not a file",
            path.display()
        )));
    }
    redb::ReadOnlyDatabase::open(path).map_err(|e| not_a_snapshot(path, e))
}

/// Reads a snapshot's facts; refuses anything that is not an idgen
/// snapshot (a state file, another redb file, garbage).
pub fn inspect(path: &Path) -> Result<SnapshotInfo, StoreError> {
    let db = open_snapshot(path)?;
    let txn = db.begin_read().map_err(|e| not_a_snapshot(path, e))?;
    let info = snapshot_record(&txn, path)?;
    if info.get("kind").map(String::as_str) != Some(SNAPSHOT_KIND) {
        return Err(not_a_snapshot(path, "wrong kind"));
    }
    if info.get("format_version").map(String::as_str) != Some(FORMAT_VERSION) {
        return Err(not_a_snapshot(
            path,
            format!(
                "format version {:?}, this idgen reads {FORMAT_VERSION}",
                info.get("format_version")
            ),
        ));
    }
    let num = |k: &str| -> u64 { info.get(k).and_then(|v| v.parse().ok()).unwrap_or(0) };
    let taken_at_ms = info
        .get("taken_at_ms")
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| not_a_snapshot(path, "no taken_at_ms"))?;
    let (layout, floor, strict_floor) = {
        let t = txn.open_table(META).map_err(|e| not_a_snapshot(path, e))?;
        let layout = t
            .get("layout")
            .map_err(backend_err)?
            .map(|v| v.value().to_owned())
            .ok_or_else(|| not_a_snapshot(path, "no layout"))?;
        let floor_of = |key: &str| -> Result<Option<u64>, StoreError> {
            Ok(t.get(key)
                .map_err(backend_err)?
                .and_then(|v| v.value().parse().ok()))
        };
        let floor = floor_of(RESTORE_FLOOR)?.unwrap_or(0);
        (
            layout,
            floor,
            floor_of(RESTORE_FLOOR_STRICT)?.unwrap_or(floor),
        )
    };
    let rates = snapshot_rates(&txn)?;
    let counters = read_counters(&txn, usize::MAX)?;
    let mut largest_step = num("segment_max_step");
    if let Ok(t) = txn.open_table(SEGMENTS) {
        for item in t.iter().map_err(backend_err)? {
            let (_, v) = item.map_err(backend_err)?;
            if let Ok(r) = serde_json::from_slice::<TagRecord>(v.value()) {
                largest_step = largest_step.max(r.step);
            }
        }
    }
    Ok(SnapshotInfo {
        taken_at_ms,
        layout,
        rates_known: info.get("rates").map(String::as_str) == Some("measured"),
        rates_note: info.get("rates").cloned().unwrap_or_default(),
        rates,
        counters,
        largest_step,
        lease_block: num("lease_block"),
        floor,
        strict_floor,
        taken_after_loss: info.contains_key("taken_after_loss"),
        mirror: info.get("current").map(String::as_str) == Some(super::mirror::MIRROR),
        formatted_block: num("formatted_block"),
        format_defs: live_format_defs(&txn)?,
    })
}

/// The live (not deleted) format definitions `txn` holds; an unreadable
/// record is left out (restore copies it as it is).
fn live_format_defs(txn: &ReadTransaction) -> Result<Vec<FormatDef>, StoreError> {
    let table = match txn.open_table(FORMAT_DEFS) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(backend_err(e)),
    };
    let mut defs = Vec::new();
    for item in table.iter().map_err(backend_err)? {
        let (_, v) = item.map_err(backend_err)?;
        if let Ok(stored) = serde_json::from_slice::<StoredFormat>(v.value()) {
            if !stored.deleted {
                defs.push(stored.def);
            }
        }
    }
    Ok(defs)
}

/// The snapshot's own record (kind, format, when it was taken, ...).
fn snapshot_record(
    txn: &redb::ReadTransaction,
    path: &Path,
) -> Result<BTreeMap<String, String>, StoreError> {
    let t = match txn.open_table(SNAPSHOT) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => {
            return Err(not_a_snapshot(
                path,
                "it has no snapshot record; a copied state file is not a backup: it may be inconsistent and carries no age or rates",
            ))
        }
        Err(e) => return Err(not_a_snapshot(path, e)),
    };
    let mut m = BTreeMap::new();
    for item in t.iter().map_err(backend_err)? {
        let (k, v) = item.map_err(backend_err)?;
        m.insert(k.value().to_owned(), v.value().to_owned());
    }
    Ok(m)
}

/// The per-counter issue rates a snapshot recorded (none in old ones).
fn snapshot_rates(txn: &redb::ReadTransaction) -> Result<BTreeMap<String, f64>, StoreError> {
    match txn.open_table(SNAPSHOT_RATES) {
        Ok(t) => {
            let mut m = BTreeMap::new();
            for item in t.iter().map_err(backend_err)? {
                let (k, v) = item.map_err(backend_err)?;
                m.insert(k.value().to_owned(), v.value());
            }
            Ok(m)
        }
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(BTreeMap::new()),
        Err(e) => Err(backend_err(e)),
    }
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// Segment tags moved forward (tombstones included).
    pub segments: usize,
    /// Lease token counters moved forward.
    pub lease_tokens: usize,
    /// Strict counters moved forward.
    pub strict_keys: usize,
    /// Formatted-mode counters moved forward.
    pub format_counters: usize,
    /// High-water marks raised.
    pub hwm_marks: usize,
    /// The mark every worker starts above, Unix ms.
    pub hwm_floor_ms: u64,
    /// The floor of segment tags and lease tokens the snapshot did not
    /// hold.
    pub floor: u64,
    /// The floor of strict keys the snapshot did not hold.
    pub strict_floor: u64,
    /// Per format the snapshot defines: its margin, and whether its
    /// counter could hold it.
    pub formats: Vec<RestoredFormat>,
}

/// How far a restore moves each kind of counter: margins the operator
/// states (nothing in a backup bounds what was issued after it), or 0 for
/// a current copy ([`SnapshotInfo::is_current`]).
#[derive(Debug, Clone, Default)]
pub struct Margins {
    /// Segment tags and lease tokens (`--skip-ahead`).
    pub skip_ahead: u64,
    /// Strict keys (`--strict-skip-ahead`): strict values count calls, so
    /// their margin is their own.
    pub strict: u64,
    /// Formatted counters, per format (`--format-skip-ahead`).
    pub formats: FormatMargins,
}

/// Restores the snapshot at `backup` into a new state file at `target`
/// for `layout`, moving every counter forward by `skip_ahead` (formatted
/// counters too, capped at their format's max) and every high-water mark
/// up to at least `hwm_floor_ms`. Refuses to overwrite anything at
/// `target`; the file appears there only once complete.
pub fn restore(
    backup: &Path,
    target: &Path,
    layout: &str,
    skip_ahead: u64,
    hwm_floor_ms: u64,
) -> Result<RestoreReport, StoreError> {
    let margins = Margins {
        skip_ahead,
        strict: skip_ahead,
        formats: FormatMargins::default(),
    };
    restore_with(backup, target, layout, &margins, hwm_floor_ms)
}

/// [`restore`], with strict and formatted counters moved by their own
/// margins (see [`Margins`] and [`crate::store::format::restore`]).
pub fn restore_with(
    backup: &Path,
    target: &Path,
    layout: &str,
    margins: &Margins,
    hwm_floor_ms: u64,
) -> Result<RestoreReport, StoreError> {
    if target.exists() {
        return Err(StoreError::AlreadyExists {
            path: target.display().to_string(),
        });
    }
    let info = inspect(backup)?;
    if info.layout != layout {
        return Err(StoreError::Backend(format!(
            "backup {} was taken for layout [{}] but the config says [{layout}]; restore it with the config the node ran with (changing the layout can repeat IDs)",
            backup.display(),
            info.layout
        )));
    }
    let src = open_snapshot(backup)?;
    let txn = src.begin_read().map_err(backend_err)?;
    // Built beside the target and linked into place only when complete, so
    // a failed restore never leaves a partial state file a node could
    // start from.
    let tmp = temp_beside(target)?;
    let result = (|| {
        let store = EmbeddedStore::create(&tmp, layout)?;
        let report = fill(&txn, &store, &info, margins, hwm_floor_ms)?;
        drop(store);
        std::fs::hard_link(&tmp, target).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                StoreError::AlreadyExists {
                    path: target.display().to_string(),
                }
            } else {
                StoreError::Backend(format!("cannot create {}: {e}", target.display()))
            }
        })?;
        Ok(report)
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

fn fill(
    txn: &ReadTransaction,
    store: &EmbeddedStore,
    info: &SnapshotInfo,
    margins: &Margins,
    hwm_floor_ms: u64,
) -> Result<RestoreReport, StoreError> {
    let out = store.begin_write()?;
    let (skip, strict) = (margins.skip_ahead, margins.strict);
    let floor = info.floor.saturating_add(skip);
    let strict_floor = info.strict_floor.saturating_add(strict);
    let mut report = RestoreReport {
        segments: 0,
        lease_tokens: 0,
        strict_keys: 0,
        format_counters: 0,
        hwm_marks: 0,
        hwm_floor_ms,
        floor,
        strict_floor,
        formats: Vec::new(),
    };
    let restored = [
        (RESTORE_FLOOR, floor),
        (RESTORE_FLOOR_STRICT, strict_floor),
        ("restored_from_taken_at_ms", info.taken_at_ms),
        ("restored_skip_ahead", skip),
        ("restored_strict_skip_ahead", strict),
        // Formatted counters in periods up to this instant may have been
        // used after the snapshot: they start above the floor, not at
        // their minimum (see `store::format`).
        (FORMATS_RESTORED_UNTIL, hwm_floor_ms),
    ];
    {
        let mut meta = out.open_table(META).map_err(backend_err)?;
        for (key, value) in restored {
            meta.insert(key, value.to_string().as_str())
                .map_err(backend_err)?;
        }
    }
    let bump = |v: u64, max: u64| v.saturating_add(skip).min(max);
    report.hwm_marks = move_u64(txn, &out, HWM, |v| v.max(hwm_floor_ms))?;
    report.lease_tokens = move_u64(txn, &out, LEASE, |v| {
        bump(v, crate::id::lease::MAX_SEQUENCE)
    })?;
    let bump_strict = |v: u64| v.saturating_add(strict).min(crate::id::strict::MAX_VALUE);
    report.strict_keys = move_u64(txn, &out, STRICT, bump_strict)?;
    // Deleted keys' last values move too: a key used again continues
    // above its tombstone, which must be above anything handed out after
    // the snapshot.
    move_u64(txn, &out, STRICT_TOMBSTONES, bump_strict)?;
    copy_table(txn, &out, STRICT_NAMESPACES)?;
    // Zones stay plain or hidden as their counters were used (never a
    // restored hidden zone read as "used before records, so plain").
    copy_table(txn, &out, LEASE_ZONES)?;
    // The live counts match the restored keys and tags one for one.
    copy_table(txn, &out, COUNTS)?;
    report.segments = move_segments(txn, &out, skip)?;
    let moved = format_restore::move_counters(
        txn,
        &out,
        &info.format_defs,
        (&margins.formats, skip),
        hwm_floor_ms,
    )?;
    report.format_counters = moved.counters;
    report.formats = moved.formats;
    // Definitions and tombstones as they were: a deleted name stays
    // deleted, and restored counters render with the definitions they
    // were reserved under.
    copy_table(txn, &out, FORMAT_DEFS)?;
    // Hide keys, sealed, merged by version with what the target holds
    // (rule 18): never a version dropped or re-activated.
    crate::store::hide_keys::merge_table(txn, &out)?;
    store.commit(out)?;
    Ok(report)
}

/// Moves every segment record's `max_id` (tombstones too: a tag created
/// again continues above them) forward by `skip`.
fn move_segments(
    txn: &ReadTransaction,
    out: &redb::WriteTransaction,
    skip: u64,
) -> Result<usize, StoreError> {
    let Ok(from) = txn.open_table(SEGMENTS) else {
        return Ok(0);
    };
    let mut to = out.open_table(SEGMENTS).map_err(backend_err)?;
    let mut n = 0;
    for item in from.iter().map_err(backend_err)? {
        let (k, v) = item.map_err(backend_err)?;
        let mut record: TagRecord = serde_json::from_slice(v.value()).map_err(|e| {
            StoreError::Backend(format!("segment record {} unreadable: {e}", k.value()))
        })?;
        record.max_id = record
            .max_id
            .saturating_add(skip)
            .min(crate::id::segment::MAX_SEGMENT_ID);
        let bytes = serde_json::to_vec(&record).map_err(backend_err)?;
        to.insert(k.value(), bytes.as_slice())
            .map_err(backend_err)?;
        n += 1;
    }
    Ok(n)
}

fn move_u64(
    txn: &ReadTransaction,
    out: &redb::WriteTransaction,
    def: TableDefinition<&str, u64>,
    f: impl Fn(u64) -> u64,
) -> Result<usize, StoreError> {
    let from = match txn.open_table(def) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(backend_err(e)),
    };
    let mut to = out.open_table(def).map_err(backend_err)?;
    let mut n = 0;
    for item in from.iter().map_err(backend_err)? {
        let (k, v) = item.map_err(backend_err)?;
        to.insert(k.value(), f(v.value())).map_err(backend_err)?;
        n += 1;
    }
    Ok(n)
}

/// What a restore knows about a snapshot, one line each, for the operator
/// who states the margins: its age, the rates it recorded (information
/// only: a rate measured before the backup bounds nothing issued after
/// it), and each kind's highest counter with the room left above it. It
/// never proposes a margin.
pub fn facts(info: &SnapshotInfo, now_ms: u64) -> Vec<String> {
    let age = std::time::Duration::from_secs(now_ms.saturating_sub(info.taken_at_ms) / 1000);
    let taken = std::time::UNIX_EPOCH + std::time::Duration::from_millis(info.taken_at_ms);
    let mut lines = vec![format!(
        "taken {} ago ({})",
        humantime::format_duration(age),
        humantime::format_rfc3339_millis(taken)
    )];
    let mut moving: Vec<(&String, &f64)> = info
        .rates
        .iter()
        .filter(|(k, r)| !k.starts_with("hwm/") && **r > 0.0)
        .collect();
    moving.sort_by(|x, y| y.1.total_cmp(x.1));
    let rates = if !info.rates_known {
        info.rates_note.clone()
    } else if moving.is_empty() {
        "no counter was moving".to_owned()
    } else {
        let top: Vec<String> = moving
            .iter()
            .take(5)
            .map(|(k, r)| format!("{k} {r:.1}/s"))
            .collect();
        top.join(", ")
    };
    lines.push(format!(
        "issue rates when it was taken (information only: they do not bound what was issued after it): {rates}"
    ));
    let kinds = [
        ("segment", "tags", crate::id::segment::MAX_SEGMENT_ID),
        ("lease", "token counters", crate::id::lease::MAX_SEQUENCE),
        ("strict", "keys", crate::id::strict::MAX_VALUE),
    ];
    for (kind, what, max) in kinds {
        let prefix = format!("{kind}/");
        let values: Vec<u64> = info
            .counters
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix) && !k.ends_with("/*"))
            .map(|(_, v)| *v)
            .collect();
        if let Some(highest) = values.iter().max() {
            lines.push(format!(
                "{kind}: {} {what}, the highest at {highest} (room for {} more above it)",
                values.len(),
                max.saturating_sub(*highest)
            ));
        }
    }
    if info.largest_step > 0 || info.lease_block > 0 {
        lines.push(format!(
            "one reservation: a segment range of up to {} IDs, a lease block of {} (a margin must cover what was handed out, and a reservation can be handed out in part)",
            info.largest_step, info.lease_block
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::super::{write_snapshot_file, SnapshotSource};
    use super::*;
    use crate::id::segment::Tag;
    use crate::store::lease::EmbeddedLeaseTokens;
    use crate::store::lease::LeaseTokenStore;
    use crate::store::CreateTag;
    use crate::store::SegmentStore;
    use crate::store::{HwmStore, WorkerKey};
    use std::sync::Arc;

    const KEY: WorkerKey = WorkerKey {
        datacenter: 0,
        worker: 0,
    };

    #[tokio::test]
    async fn restore_moves_every_counter_forward_and_sets_the_floor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::create(&path, "L").unwrap();
        store.store_hwm(KEY, 5_000).await.unwrap();
        let tag = Tag::parse("orders").unwrap();
        store
            .create_tag(
                &tag,
                &TagRecord::new(100, 10, "", 0).unwrap(),
                CreateTag::UNLIMITED,
            )
            .await
            .unwrap();
        let tokens = EmbeddedLeaseTokens::new(store.clone(), 0, 0, (0, 63)).unwrap();
        tokens.reserve(50).await.unwrap();
        let source = SnapshotSource::new(store.clone(), 50, 0);
        source.sample(1_000).unwrap();
        tokens.reserve(50).await.unwrap();
        let bytes = source.take(11_000).unwrap();
        let backup = dir.path().join("b.snap");
        write_snapshot_file(&backup, &bytes).unwrap();
        assert!(
            write_snapshot_file(&backup, &bytes).is_err(),
            "no overwrite"
        );

        let info = inspect(&backup).unwrap();
        assert_eq!(info.taken_at_ms, 11_000);
        assert!(info.rates_known);
        // 50 lease sequences in 10 s.
        assert_eq!(info.rates.get("lease/0/0").copied(), Some(5.0));
        assert!(!info.is_current(), "a backup is not a current copy");

        // Refusals: existing target, wrong layout, not a snapshot.
        assert!(matches!(
            restore(&backup, &path, "L", 10, 0),
            Err(StoreError::AlreadyExists { .. })
        ));
        let target = dir.path().join("restored.redb");
        let e = restore(&backup, &target, "other", 10, 0).unwrap_err();
        assert!(e.to_string().contains("layout"), "{e}");
        let e = restore(&path, &target, "L", 10, 0).unwrap_err();
        assert!(e.to_string().contains("not an idgen snapshot"), "{e}");
        assert!(!target.exists());
        drop((tokens, source, store));

        let r = restore(&backup, &target, "L", 1_000_000, 9_000).unwrap();
        assert_eq!((r.segments, r.lease_tokens, r.hwm_marks), (1, 1, 1));
        let restored = EmbeddedStore::open(&target, "L", false).unwrap();
        assert_eq!(restored.load_hwm(KEY).await.unwrap(), Some(9_000));
        let tokens = EmbeddedLeaseTokens::new(restored.clone(), 0, 0, (0, 63)).unwrap();
        assert_eq!(tokens.counter(0).unwrap().reserved, 100 + 1_000_000);
        let range = restored.take_range(&tag, 10, 0).await.unwrap();
        assert_eq!(range.first, 100 + 1_000_000 + 1);
        // A token the snapshot did not hold starts above the floor.
        let tokens = EmbeddedLeaseTokens::new(restored.clone(), 0, 5, (0, 63)).unwrap();
        assert_eq!(tokens.reserve(1).await.unwrap().first, 1_000_001);
    }

    #[tokio::test]
    async fn deleted_strict_keys_are_backed_up_and_their_tombstones_skip_ahead() {
        use crate::id::strict::StrictKey;
        use crate::store::strict::{EmbeddedStrictStore, StrictStore};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::create(&path, "L").unwrap();
        let strict = EmbeddedStrictStore::new(store.clone());
        let key = StrictKey::parse("books/a").unwrap();
        let live = StrictKey::parse("books/b").unwrap();
        assert_eq!(strict.advance(&key, 1, 5).await.unwrap().last, 5);
        assert_eq!(strict.advance(&live, 1, 3).await.unwrap().last, 3);
        assert_eq!(strict.delete_key(&key).await.unwrap(), 5);
        // The live counts and the tombstones are tables of the file: a
        // snapshot must carry them, not refuse them as unknown.
        let source = SnapshotSource::new(store.clone(), 50, 0);
        let bytes = source.take(1_000).unwrap();
        let backup = dir.path().join("b.snap");
        write_snapshot_file(&backup, &bytes).unwrap();
        drop((strict, source, store));

        let target = dir.path().join("restored.redb");
        restore(&backup, &target, "L", 1_000, 0).unwrap();
        let restored = EmbeddedStrictStore::new(EmbeddedStore::open(&target, "L", false).unwrap());
        // Used again after the restore: above its tombstone plus the margin,
        // so above anything handed out after the snapshot.
        assert_eq!(restored.advance(&key, 1, 1).await.unwrap().first, 1_006);
        assert_eq!(restored.advance(&live, 1, 1).await.unwrap().first, 1_004);
        assert_eq!(restored.list_keys(&key.namespace()).await.unwrap().len(), 2);
    }

    /// Strict keys move by their own margin, not the segment/lease one, and
    /// a key the snapshot did not hold starts above the strict floor.
    #[tokio::test]
    async fn strict_keys_move_by_their_own_margin() {
        use crate::id::strict::StrictKey;
        use crate::store::strict::{EmbeddedStrictStore, StrictStore};
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::create(&dir.path().join("s.redb"), "L").unwrap();
        let strict = EmbeddedStrictStore::new(store.clone());
        let key = StrictKey::parse("chat/room1").unwrap();
        assert_eq!(strict.advance(&key, 1, 56).await.unwrap().last, 56);
        let bytes = SnapshotSource::new(store.clone(), 50, 0)
            .take(1_000)
            .unwrap();
        let backup = dir.path().join("b.snap");
        write_snapshot_file(&backup, &bytes).unwrap();
        drop((strict, store));
        let target = dir.path().join("restored.redb");
        let margins = Margins {
            skip_ahead: 2_000_000,
            strict: 100,
            formats: FormatMargins::default(),
        };
        let r = restore_with(&backup, &target, "L", &margins, 0).unwrap();
        assert_eq!((r.floor, r.strict_floor), (2_000_000, 100));
        let restored = EmbeddedStrictStore::new(EmbeddedStore::open(&target, "L", false).unwrap());
        assert_eq!(restored.advance(&key, 1, 1).await.unwrap().first, 157);
        let new = StrictKey::parse("chat/room2").unwrap();
        assert_eq!(restored.advance(&new, 1, 1).await.unwrap().first, 101);
    }

    /// A mirror holds every commit before it returns: after reservations
    /// of every counter kind, the mirror on disk is a current snapshot, and
    /// a restore from it with no margin continues above every value
    /// handed out.
    #[tokio::test]
    async fn a_mirror_holds_every_reservation_and_restores_with_no_margin() {
        use crate::id::strict::StrictKey;
        use crate::id::SystemClock;
        use crate::store::strict::{EmbeddedStrictStore, StrictStore};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let mirror = dir.path().join("mirror/s.mirror");
        let store = EmbeddedStore::create(&path, "L")
            .unwrap()
            .with_mirror(&mirror, Arc::new(SystemClock))
            .unwrap();
        assert!(inspect(&mirror).unwrap().mirror, "written at once");
        let tag = Tag::parse("orders").unwrap();
        store
            .create_tag(
                &tag,
                &TagRecord::new(0, 10, "", 0).unwrap(),
                CreateTag::UNLIMITED,
            )
            .await
            .unwrap();
        let tokens = EmbeddedLeaseTokens::new(store.clone(), 0, 0, (0, 63)).unwrap();
        let strict = EmbeddedStrictStore::new(store.clone());
        let key = StrictKey::parse("chat/room1").unwrap();
        let mut last = (0, 0, 0);
        for _ in 0..5 {
            last.0 = store.take_range(&tag, 10, 0).await.unwrap().last;
            last.1 = tokens.reserve(50).await.unwrap().last;
            last.2 = strict.advance(&key, 1, 3).await.unwrap().last;
            // After each commit returned, the mirror already holds it.
            let info = inspect(&mirror).unwrap();
            assert!(info.is_current());
            assert_eq!(info.counters.get("segment/orders"), Some(&last.0));
            assert_eq!(info.counters.get("lease/0/0"), Some(&last.1));
            assert_eq!(info.counters.get("strict/chat/room1"), Some(&last.2));
        }
        drop((tokens, strict, store));
        std::fs::remove_file(&path).unwrap();
        let r = restore_with(&mirror, &path, "L", &Margins::default(), 0).unwrap();
        assert_eq!(r.floor, 0);
        let restored = EmbeddedStore::open(&path, "L", false).unwrap();
        assert_eq!(
            restored.take_range(&tag, 10, 0).await.unwrap().first,
            last.0 + 1
        );
        let tokens = EmbeddedLeaseTokens::new(restored.clone(), 0, 0, (0, 63)).unwrap();
        assert_eq!(tokens.reserve(1).await.unwrap().first, last.1 + 1);
        let strict = EmbeddedStrictStore::new(restored.clone());
        assert_eq!(strict.advance(&key, 1, 1).await.unwrap().first, last.2 + 1);
        drop((tokens, strict, restored));

        // A state file behind its mirror (re-created by `idgen init`) is
        // refused: starting would overwrite the copy that knows.
        std::fs::remove_file(&path).unwrap();
        let fresh = EmbeddedStore::create(&path, "L").unwrap();
        let e = fresh
            .with_mirror(&mirror, Arc::new(SystemClock))
            .unwrap_err();
        assert!(e.to_string().contains("behind its mirror"), "{e}");
    }

    #[test]
    fn facts_give_rates_as_information_and_never_a_margin() {
        let info = SnapshotInfo {
            taken_at_ms: 0,
            layout: "L".into(),
            rates_known: true,
            rates_note: "measured".into(),
            rates: BTreeMap::from([("lease/0/0".to_owned(), 30.0)]),
            counters: Counters::from([("lease/0/0".to_owned(), 400)]),
            largest_step: 0,
            lease_block: 200,
            floor: 0,
            strict_floor: 0,
            taken_after_loss: false,
            mirror: false,
            formatted_block: 0,
            format_defs: Vec::new(),
        };
        let text = facts(&info, 100_000).join("\n");
        assert!(text.contains("taken 1m 40s ago"), "{text}");
        assert!(
            text.contains("information only") && text.contains("lease/0/0 30.0/s"),
            "{text}"
        );
        assert!(text.contains("the highest at 400"), "{text}");
        assert!(!text.contains("--skip-ahead"), "{text}");
    }
}
