//! Backups of the embedded state file, and restoring one without repeats.
//!
//! A snapshot is itself a redb file: every table of the state file, copied
//! in one read transaction (redb gives a read transaction a consistent
//! view while the node keeps writing), plus a `snapshot` table saying
//! when it was taken and a `snapshot_rates` table with how fast each
//! counter was moving then. redb lets only one process open a file for
//! writing and the running node holds its state file, so a snapshot of a
//! running node is taken by the node itself (admin rpc `Backup`, `idgen
//! state backup --addr`); a stopped node's file is read directly (`idgen
//! state backup --offline`).
//!
//! Restoring is a recovery, not a rollback: everything handed out between
//! the snapshot and the loss of the file must never be handed out again,
//! and the snapshot does not know it. [`restore`] therefore moves every
//! segment `max_id`, lease token counter and strict counter forward by a
//! margin the operator gives (`--skip-ahead`), records that margin as the
//! floor for counters the snapshot did not hold yet, and raises every
//! high-water mark to the time of the restore plus the reserve. The margin
//! must exceed what the node handed out after the snapshot;
//! [`Suggestion`] derives one from the snapshot's age and recorded rates.
//! Formatted counters move by a margin per format instead
//! ([`crate::store::format::restore`]).

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use redb::{ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

use super::counts::COUNTS;
use super::embedded::{backend_err, EmbeddedStore, FORMAT_VERSION, HWM, META, RESTORE_FLOOR};
use super::format::catalog::{StoredFormat, FORMAT_DEFS};
use super::format::counters::{CounterRecordBytes, FORMATS, FORMATS_RESTORED_UNTIL};
use super::format::restore::{self as format_restore, FormatMargins, RestoredFormat};
use super::lease::LEASE;
use super::segment::SEGMENTS;
use super::strict::{STRICT, STRICT_NAMESPACES, STRICT_TOMBSTONES};
use super::StoreError;
use crate::id::format::FormatDef;
use crate::id::segment::TagRecord;

/// What a snapshot says about itself.
const SNAPSHOT: TableDefinition<&str, &str> = TableDefinition::new("snapshot");
/// Counter -> how fast it moved when the snapshot was taken, per second.
const SNAPSHOT_RATES: TableDefinition<&str, f64> = TableDefinition::new("snapshot_rates");

/// The `kind` every idgen snapshot carries.
pub const SNAPSHOT_KIND: &str = "idgen-snapshot";

/// Tables a state file may hold; a snapshot copies each. A table not in
/// this list makes the backup fail rather than silently leave it out.
const KNOWN_TABLES: [&str; 10] = [
    "meta",
    "hwm",
    "segments",
    "lease",
    "strict",
    "strict_namespaces",
    "strict_tombstones",
    "live_counts",
    "formats",
    "format_defs",
];

/// How long rate samples are kept: rates are measured over about this
/// window (or since the node started, if that is shorter).
pub const RATE_WINDOW_MS: u64 = 5 * 60 * 1000;

/// How often a running node samples its counters for the rates.
pub const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Every counter's current value, keyed by kind and name:
/// `hwm/<dc>/<worker>`, `segment/<tag>`, `lease/<zone>/<token>`,
/// `strict/<namespace>/<key>`, `format/<format>/<node>/<scope>` (the last
/// value reserved in its current period); plus each kind's total as
/// `<kind>/*` (a wrapping sum: counters only grow, so differences of totals
/// are exact; formatted counters start again each period, see
/// [`RateSampler::rates`]).
pub type Counters = BTreeMap<String, u64>;

/// Most counters a running node samples one by one; beyond that only the
/// kinds' totals are kept (their rates bound every counter's from above,
/// so the suggested margin stays safe, only larger).
pub const MAX_TRACKED_COUNTERS: usize = 10_000;

fn read_counters(txn: &ReadTransaction, limit: usize) -> Result<Counters, StoreError> {
    let mut each: Vec<(String, u64)> = Vec::new();
    let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut seen = 0usize;
    let mut add = |kind: &'static str, name: &str, v: u64, each: &mut Vec<(String, u64)>| {
        let t = totals.entry(kind).or_insert(0);
        *t = t.wrapping_add(v);
        seen += 1;
        if seen <= limit {
            each.push((format!("{kind}/{name}"), v));
        }
    };
    let u64_tables = [(HWM, "hwm"), (LEASE, "lease"), (STRICT, "strict")];
    for (def, kind) in u64_tables {
        let table = match txn.open_table(def) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => continue,
            Err(e) => return Err(backend_err(e)),
        };
        for item in table.iter().map_err(backend_err)? {
            let (k, v) = item.map_err(backend_err)?;
            add(kind, k.value(), v.value(), &mut each);
        }
    }
    match txn.open_table(SEGMENTS) {
        Ok(table) => {
            for item in table.iter().map_err(backend_err)? {
                let (k, v) = item.map_err(backend_err)?;
                let record: TagRecord = serde_json::from_slice(v.value()).map_err(|e| {
                    StoreError::Backend(format!("segment record {} unreadable: {e}", k.value()))
                })?;
                add("segment", k.value(), record.max_id, &mut each);
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(backend_err(e)),
    }
    match txn.open_table(FORMATS) {
        Ok(table) => {
            for item in table.iter().map_err(backend_err)? {
                let (k, v) = item.map_err(backend_err)?;
                let last = CounterRecordBytes::last(k.value(), v.value())?;
                add("format", k.value(), last, &mut each);
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(backend_err(e)),
    }
    let mut out: Counters = if seen <= limit {
        each.into_iter().collect()
    } else {
        Counters::new()
    };
    for (kind, total) in totals {
        out.insert(format!("{kind}/*"), total);
    }
    Ok(out)
}

/// Recent samples of every counter, so a backup can record how fast each
/// one moves.
#[derive(Debug, Default)]
pub struct RateSampler {
    samples: VecDeque<(u64, Counters)>,
}

impl RateSampler {
    /// Records the counters at `now_ms`, dropping samples older than the
    /// window (always keeping the oldest one inside it).
    pub fn record(&mut self, now_ms: u64, counters: Counters) {
        self.samples.push_back((now_ms, counters));
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|(t, _)| now_ms.saturating_sub(*t) >= RATE_WINDOW_MS)
        {
            self.samples.pop_front();
        }
    }

    /// Per counter, how fast it moved up to `current` (per second): the
    /// highest average over the spans from each kept sample at least 1 s
    /// old to now, so a recent burst counts as much as a steady rate.
    /// Counters first seen after a sample count from zero there. Empty
    /// when no sample is at least 1 s old.
    pub fn rates(&self, now_ms: u64, current: &Counters) -> BTreeMap<String, f64> {
        let mut out: BTreeMap<String, f64> = BTreeMap::new();
        for (t, old) in &self.samples {
            let secs = now_ms.saturating_sub(*t) as f64 / 1000.0;
            if secs < 1.0 {
                continue;
            }
            for (k, v) in current {
                let mut before = old.get(k).copied().unwrap_or(0);
                if k.starts_with("format/") && *v < before {
                    // A new period began since: it counted up from its
                    // minimum (at most `v`) within the span.
                    before = 0;
                }
                // Counters only grow; totals wrap (see [`Counters`]).
                let rate = v.wrapping_sub(before) as f64 / secs;
                let best = out.entry(k.clone()).or_insert(0.0);
                *best = best.max(rate);
            }
        }
        out
    }
}

/// Takes snapshots of a running node's state file.
#[derive(Clone)]
pub struct SnapshotSource {
    store: EmbeddedStore,
    sampler: Arc<Mutex<RateSampler>>,
    /// Facts of the node's config that size the suggested margin.
    extra: BTreeMap<String, String>,
}

impl std::fmt::Debug for SnapshotSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotSource")
            .field("path", &self.store.path())
            .finish()
    }
}

impl SnapshotSource {
    /// A source for `store`; `lease_block` and `segment_max_step` (0 when
    /// the mode is off) size the margin restore suggests.
    pub fn new(store: EmbeddedStore, lease_block: u64, segment_max_step: u64) -> Self {
        let extra = BTreeMap::from([
            ("lease_block".to_owned(), lease_block.to_string()),
            ("segment_max_step".to_owned(), segment_max_step.to_string()),
        ]);
        Self {
            store,
            sampler: Arc::default(),
            extra,
        }
    }

    /// Records `formatted.block`, which sizes the margins restore suggests
    /// for formatted counters.
    pub fn with_formatted_block(mut self, block: u64) -> Self {
        self.extra
            .insert("formatted_block".to_owned(), block.to_string());
        self
    }

    /// Samples every counter now (a read transaction); called every
    /// [`SAMPLE_EVERY`] while serving.
    pub fn sample(&self, now_ms: u64) -> Result<(), StoreError> {
        let txn = self.store.db().begin_read().map_err(backend_err)?;
        let counters = read_counters(&txn, MAX_TRACKED_COUNTERS)?;
        self.sampler
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(now_ms, counters);
        Ok(())
    }

    /// Samples every [`SAMPLE_EVERY`] on its own thread
    /// (`idgen-rate-sample`) until the handle is dropped or the state file
    /// is lost, so reading many counters never delays the state file
    /// checks or the requests.
    pub fn start_sampling(
        &self,
        clock: Arc<dyn crate::id::Clock>,
    ) -> std::io::Result<super::state_file::PeriodicThread> {
        let this = self.clone();
        super::state_file::PeriodicThread::start("idgen-rate-sample", SAMPLE_EVERY, move || {
            if this.store.guard().is_lost() {
                return false;
            }
            if let Err(e) = this.sample(clock.now_millis()) {
                tracing::warn!(error = %e, "cannot sample counters for backup rates");
            }
            true
        })
    }

    /// A consistent snapshot of the whole file, as the bytes of a redb
    /// file.
    ///
    /// Also after the state file was deleted or replaced: the node still
    /// holds the file it wrote, and every block, range or value it handed
    /// out was committed to it first (and nothing was handed out after the
    /// loss was seen), so this rescue snapshot covers everything the node
    /// issued. It is marked as such and restore suggests a margin without
    /// rates for it.
    pub fn take(&self, now_ms: u64) -> Result<Vec<u8>, StoreError> {
        let lost = self.store.guard().lost_error();
        let txn = self.store.db().begin_read().map_err(backend_err)?;
        let counters = read_counters(&txn, MAX_TRACKED_COUNTERS)?;
        let rates = self
            .sampler
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rates(now_ms, &counters);
        let mut info = self.extra.clone();
        let measured = if rates.is_empty() {
            "unknown (taken within a second of the node's start)"
        } else {
            "measured"
        };
        info.insert("rates".into(), measured.into());
        if let Some(e) = lost {
            info.insert("taken_after_loss".into(), e.to_string());
        }
        info.insert("source".into(), self.store.path().display().to_string());
        snapshot_bytes(&txn, now_ms, info, &rates)
    }
}

/// Takes a snapshot of a state file no node holds (`idgen state backup
/// --offline`). It records no rates: nothing issued while it was taken.
pub fn take_offline(path: &Path, now_ms: u64) -> Result<Vec<u8>, StoreError> {
    if !path.exists() {
        return Err(StoreError::Backend(format!(
            "state file {} does not exist: nothing to back up",
            path.display()
        )));
    }
    // Opened for writing, like a starting node would: the exclusive lock
    // keeps a node from starting on it meanwhile, and a file left by a
    // crash (kill -9, power loss) is repaired first, which a read-only
    // open cannot do.
    let db = redb::Database::open(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Backend(format!(
            "state file {} is held by a running node: back it up through the node instead (`idgen state backup <file> --addr http://<node>:<grpc port>` with its admin token)",
            path.display()
        )),
        e => StoreError::Backend(format!("cannot open state file {}: {e}", path.display())),
    })?;
    let txn = db.begin_read().map_err(backend_err)?;
    let info = BTreeMap::from([
        ("rates".to_owned(), "unknown (offline backup)".to_owned()),
        ("source".to_owned(), path.display().to_string()),
    ]);
    snapshot_bytes(&txn, now_ms, info, &BTreeMap::new())
}

/// Copies table `def` from `txn` to `out` as it is (nothing if the source
/// has no such table).
fn copy_table<V: redb::Value + 'static>(
    txn: &ReadTransaction,
    out: &redb::WriteTransaction,
    def: TableDefinition<&str, V>,
) -> Result<(), StoreError> {
    let from = match txn.open_table(def) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(backend_err(e)),
    };
    let mut to = out.open_table(def).map_err(backend_err)?;
    for item in from.iter().map_err(backend_err)? {
        let (k, v) = item.map_err(backend_err)?;
        to.insert(k.value(), v.value()).map_err(backend_err)?;
    }
    Ok(())
}

/// An in-memory redb backend whose bytes can be taken out afterwards.
#[derive(Debug, Clone, Default)]
struct VecBackend(Arc<Mutex<Vec<u8>>>);

impl VecBackend {
    fn bytes(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl redb::StorageBackend for VecBackend {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.bytes().len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let data = self.bytes();
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let end = start
            .checked_add(out.len())
            .filter(|e| *e <= data.len())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        out.copy_from_slice(&data[start..end]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let len = usize::try_from(len).map_err(std::io::Error::other)?;
        self.bytes().resize(len, 0);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut buf = self.bytes();
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let end = start + data.len();
        if end > buf.len() {
            buf.resize(end, 0);
        }
        buf[start..end].copy_from_slice(data);
        Ok(())
    }
}

/// Copies every table `txn` sees into a new in-memory redb file with the
/// snapshot's own tables, and returns its bytes.
fn snapshot_bytes(
    txn: &ReadTransaction,
    now_ms: u64,
    mut info: BTreeMap<String, String>,
    rates: &BTreeMap<String, f64>,
) -> Result<Vec<u8>, StoreError> {
    for table in txn.list_tables().map_err(backend_err)? {
        if !KNOWN_TABLES.contains(&table.name()) {
            return Err(StoreError::Backend(format!(
                "the state file has a table {:?} this idgen version does not know; back it up with the idgen version that wrote it",
                table.name()
            )));
        }
    }
    let backend = VecBackend::default();
    let db = redb::Builder::new()
        .create_with_backend(backend.clone())
        .map_err(backend_err)?;
    let out = db.begin_write().map_err(backend_err)?;
    copy_table(txn, &out, META)?;
    copy_table(txn, &out, HWM)?;
    copy_table(txn, &out, SEGMENTS)?;
    copy_table(txn, &out, LEASE)?;
    copy_table(txn, &out, STRICT)?;
    copy_table(txn, &out, STRICT_NAMESPACES)?;
    copy_table(txn, &out, STRICT_TOMBSTONES)?;
    copy_table(txn, &out, COUNTS)?;
    copy_table(txn, &out, FORMATS)?;
    copy_table(txn, &out, FORMAT_DEFS)?;
    {
        info.insert("kind".into(), SNAPSHOT_KIND.into());
        info.insert("format_version".into(), FORMAT_VERSION.into());
        info.insert("taken_at_ms".into(), now_ms.to_string());
        let mut t = out.open_table(SNAPSHOT).map_err(backend_err)?;
        for (k, v) in &info {
            t.insert(k.as_str(), v.as_str()).map_err(backend_err)?;
        }
        let mut r = out.open_table(SNAPSHOT_RATES).map_err(backend_err)?;
        for (k, v) in rates {
            r.insert(k.as_str(), *v).map_err(backend_err)?;
        }
    }
    out.commit().map_err(backend_err)?;
    drop(db);
    let bytes = std::mem::take(&mut *backend.bytes());
    Ok(bytes)
}

/// What a snapshot file holds, read back for restore.
#[derive(Debug, Clone)]
pub struct SnapshotInfo {
    /// When it was taken, Unix ms.
    pub taken_at_ms: u64,
    /// The layout recorded by `idgen init`.
    pub layout: String,
    /// Whether rates were measured (a running node's backup).
    pub rates_known: bool,
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
    /// A rescue snapshot: taken by the node after its state file was
    /// deleted or replaced, when it had stopped issuing for good.
    pub taken_after_loss: bool,
    /// The node's `formatted.block` (0 if unknown).
    pub formatted_block: u64,
    /// The live format definitions the snapshot holds.
    pub format_defs: Vec<FormatDef>,
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
    let (layout, floor) = {
        let t = txn.open_table(META).map_err(|e| not_a_snapshot(path, e))?;
        let layout = t
            .get("layout")
            .map_err(backend_err)?
            .map(|v| v.value().to_owned())
            .ok_or_else(|| not_a_snapshot(path, "no layout"))?;
        let floor = t
            .get(RESTORE_FLOOR)
            .map_err(backend_err)?
            .and_then(|v| v.value().parse().ok())
            .unwrap_or(0);
        (layout, floor)
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
        rates,
        counters,
        largest_step,
        lease_block: num("lease_block"),
        floor,
        taken_after_loss: info.contains_key("taken_after_loss"),
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

/// A margin suggested for restoring a snapshot now.
#[derive(Debug, Clone)]
pub struct Suggestion {
    /// The suggested `--skip-ahead`.
    pub margin: u64,
    /// How it was worked out, for the operator.
    pub explanation: String,
}

/// Suggests a margin: twice what the fastest counter (segment, lease or
/// strict) could have moved since the snapshot at its recorded rate, plus
/// two of the largest reservations a node makes at once (a segment range
/// at the largest step, a lease block), rounded up to a thousand.
pub fn suggest(info: &SnapshotInfo, now_ms: u64) -> Suggestion {
    let age_s = now_ms.saturating_sub(info.taken_at_ms) as f64 / 1000.0;
    // Per kind: the fastest single counter when counters were sampled one
    // by one, else the kind's total (an upper bound for each of them).
    let mut fastest = String::new();
    let mut rate = 0.0f64;
    for kind in ["segment", "lease", "strict"] {
        let prefix = format!("{kind}/");
        let total_key = format!("{kind}/*");
        let each: Vec<(&String, &f64)> = info
            .rates
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix) && **k != total_key)
            .collect();
        let candidates: Vec<(&String, &f64)> = if each.is_empty() {
            info.rates.get_key_value(&total_key).into_iter().collect()
        } else {
            each
        };
        for (k, r) in candidates {
            if *r > rate {
                fastest = k.clone();
                rate = *r;
            }
        }
    }
    let moved = (2.0 * rate * age_s).ceil();
    let moved = if moved.is_finite() && moved < 1e18 {
        moved as u64
    } else {
        u64::MAX / 4
    };
    let lump = 2 * info.largest_step.max(info.lease_block).max(1);
    let raw = moved.saturating_add(lump);
    let margin = raw.div_ceil(1000).saturating_mul(1000).max(1000);
    let age = humantime::format_duration(std::time::Duration::from_secs(age_s as u64));
    // A rescue snapshot holds everything the node issued: nothing moved
    // after it, whatever its age.
    let (rate, moved, raw, margin) = if info.taken_after_loss {
        (
            0.0,
            0,
            lump,
            lump.div_ceil(1000).saturating_mul(1000).max(1000),
        )
    } else {
        (rate, moved, raw, margin)
    };
    let mut explanation = if info.taken_after_loss {
        format!(
            "a rescue snapshot, taken by the node after its state file was lost, when it had stopped issuing: it holds every reservation the node made; two of the largest reservations (2 x {}) = {margin} for good measure. If another node ran on a new file at that path meanwhile, stop it and add what it handed out",
            lump / 2
        )
    } else if info.rates_known {
        if rate > 0.0 {
            format!(
                "the snapshot is {age} old; its fastest counter ({fastest}) moved {rate:.1}/s when it was taken: 2 x {rate:.1}/s x {age_s:.0} s = {moved}, plus two of the largest reservations (2 x {}) = {raw}, rounded up to {margin}",
                lump / 2
            )
        } else {
            format!(
                "the snapshot is {age} old and no counter was moving when it was taken; two of the largest reservations (2 x {}) = {margin}",
                lump / 2
            )
        }
    } else {
        format!(
            "the snapshot records no issue rates (taken offline, or within a second of the node's start); {margin} covers only two of the largest reservations (2 x {}). Add what the node handed out after the snapshot (IDs per second x seconds it ran since, per segment tag, lease token or strict key)",
            lump / 2
        )
    };
    explanation.push_str(
        ". A larger margin only wastes numbers; a smaller one can repeat IDs handed out after the snapshot",
    );
    Suggestion {
        margin,
        explanation,
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
    /// The floor of counters the snapshot did not hold.
    pub floor: u64,
    /// Per format the snapshot defines: its margin, and whether its
    /// counter could hold it.
    pub formats: Vec<RestoredFormat>,
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
    restore_with_formats(
        backup,
        target,
        layout,
        (skip_ahead, &FormatMargins::default()),
        hwm_floor_ms,
    )
}

/// [`restore`], with formatted counters moved by their own margins
/// (`formats`, see [`crate::store::format::restore`]) instead of
/// `skip_ahead`.
pub fn restore_with_formats(
    backup: &Path,
    target: &Path,
    layout: &str,
    (skip_ahead, formats): (u64, &FormatMargins),
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
        let report = fill(&txn, &store, &info, (skip_ahead, formats), hwm_floor_ms)?;
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

fn temp_beside(target: &Path) -> Result<PathBuf, StoreError> {
    let name = target
        .file_name()
        .ok_or_else(|| StoreError::Backend(format!("{} is not a file path", target.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".restore-{}", std::process::id()));
    let tmp = target.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    Ok(tmp)
}

fn fill(
    txn: &ReadTransaction,
    store: &EmbeddedStore,
    info: &SnapshotInfo,
    (skip, margins): (u64, &FormatMargins),
    hwm_floor_ms: u64,
) -> Result<RestoreReport, StoreError> {
    let out = store.begin_write()?;
    let floor = info.floor.saturating_add(skip);
    let mut report = RestoreReport {
        segments: 0,
        lease_tokens: 0,
        strict_keys: 0,
        format_counters: 0,
        hwm_marks: 0,
        hwm_floor_ms,
        floor,
        formats: Vec::new(),
    };
    {
        let mut meta = out.open_table(META).map_err(backend_err)?;
        meta.insert(RESTORE_FLOOR, floor.to_string().as_str())
            .map_err(backend_err)?;
        meta.insert(
            "restored_from_taken_at_ms",
            info.taken_at_ms.to_string().as_str(),
        )
        .map_err(backend_err)?;
        meta.insert("restored_skip_ahead", skip.to_string().as_str())
            .map_err(backend_err)?;
        // Formatted counters in periods up to this instant may have been
        // used after the snapshot: they start above the floor, not at
        // their minimum (see `store::format`).
        meta.insert(FORMATS_RESTORED_UNTIL, hwm_floor_ms.to_string().as_str())
            .map_err(backend_err)?;
    }
    let bump = |v: u64, max: u64| v.saturating_add(skip).min(max);
    report.hwm_marks = move_u64(txn, &out, HWM, |v| v.max(hwm_floor_ms))?;
    report.lease_tokens = move_u64(txn, &out, LEASE, |v| {
        bump(v, crate::id::lease::MAX_SEQUENCE)
    })?;
    report.strict_keys = move_u64(txn, &out, STRICT, |v| bump(v, crate::id::strict::MAX_VALUE))?;
    // Deleted keys' last values move too: a key used again continues
    // above its tombstone, which must be above anything handed out after
    // the snapshot.
    move_u64(txn, &out, STRICT_TOMBSTONES, |v| {
        bump(v, crate::id::strict::MAX_VALUE)
    })?;
    copy_table(txn, &out, STRICT_NAMESPACES)?;
    // The live counts match the restored keys and tags one for one.
    copy_table(txn, &out, COUNTS)?;
    if let Ok(from) = txn.open_table(SEGMENTS) {
        let mut to = out.open_table(SEGMENTS).map_err(backend_err)?;
        for item in from.iter().map_err(backend_err)? {
            let (k, v) = item.map_err(backend_err)?;
            let mut record: TagRecord = serde_json::from_slice(v.value()).map_err(|e| {
                StoreError::Backend(format!("segment record {} unreadable: {e}", k.value()))
            })?;
            // Tombstones too: a tag created again continues above them.
            record.max_id = bump(record.max_id, crate::id::segment::MAX_SEGMENT_ID);
            let bytes = serde_json::to_vec(&record).map_err(backend_err)?;
            to.insert(k.value(), bytes.as_slice())
                .map_err(backend_err)?;
            report.segments += 1;
        }
    }
    let moved =
        format_restore::move_counters(txn, &out, &info.format_defs, (margins, skip), hwm_floor_ms)?;
    report.format_counters = moved.counters;
    report.formats = moved.formats;
    // Definitions and tombstones as they were: a deleted name stays
    // deleted, and restored counters render with the definitions they
    // were reserved under.
    copy_table(txn, &out, FORMAT_DEFS)?;
    store.commit(out)?;
    Ok(report)
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

/// Writes snapshot bytes to `path`, refusing to overwrite a file there;
/// the file appears only once complete and synced.
pub fn write_snapshot_file(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    use std::io::Write;
    if path.exists() {
        return Err(StoreError::Backend(format!(
            "{} exists already; refusing to overwrite it (give a new file name)",
            path.display()
        )));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Backend(format!("cannot create directory {}: {e}", dir.display()))
        })?;
    }
    let tmp = temp_beside(path)?;
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)
            .map_err(|e| StoreError::Backend(format!("cannot write {}: {e}", tmp.display())))?;
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| StoreError::Backend(format!("cannot write {}: {e}", tmp.display())))?;
        std::fs::hard_link(&tmp, path)
            .map_err(|e| StoreError::Backend(format!("cannot create {}: {e}", path.display())))
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::segment::Tag;
    use crate::store::lease::EmbeddedLeaseTokens;
    use crate::store::lease::LeaseTokenStore;
    use crate::store::SegmentStore;
    use crate::store::{HwmStore, WorkerKey};

    const KEY: WorkerKey = WorkerKey {
        datacenter: 0,
        worker: 0,
    };

    #[test]
    fn past_the_cap_only_totals_are_sampled_and_suggest_uses_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::create(&dir.path().join("s.redb"), "L").unwrap();
        let txn = store.begin_write().unwrap();
        {
            let mut t = txn.open_table(STRICT).unwrap();
            for (k, v) in [("a/1", 10u64), ("a/2", 20), ("a/3", 30)] {
                t.insert(k, v).unwrap();
            }
        }
        store.commit(txn).unwrap();
        let read = store.db().begin_read().unwrap();
        let all = read_counters(&read, 10).unwrap();
        assert_eq!(all.get("strict/a/2"), Some(&20));
        assert_eq!(all.get("strict/*"), Some(&60));
        let capped = read_counters(&read, 2).unwrap();
        assert_eq!(capped.get("strict/a/2"), None);
        assert_eq!(capped.get("strict/*"), Some(&60));
        // Suggest: the fastest single counter when there are some, else the
        // kind's total.
        let mut info = SnapshotInfo {
            taken_at_ms: 0,
            layout: "L".into(),
            rates_known: true,
            rates: BTreeMap::from([
                ("strict/a/1".to_owned(), 10.0),
                ("strict/a/2".to_owned(), 30.0),
                ("strict/*".to_owned(), 40.0),
            ]),
            counters: Counters::new(),
            largest_step: 0,
            lease_block: 0,
            floor: 0,
            taken_after_loss: false,
            formatted_block: 0,
            format_defs: Vec::new(),
        };
        // 2 x 30/s x 100 s + 2 = 6002 -> 7000.
        assert_eq!(suggest(&info, 100_000).margin, 7000);
        info.rates.retain(|k, _| k == "strict/*");
        // 2 x 40/s x 100 s + 2 = 8002 -> 9000.
        assert_eq!(suggest(&info, 100_000).margin, 9000);
    }

    #[test]
    fn rates_take_the_fastest_recent_span() {
        let mut s = RateSampler::default();
        let c = |v: u64| Counters::from([("lease/0/0".to_owned(), v)]);
        assert!(s.rates(0, &c(0)).is_empty());
        s.record(0, c(0));
        s.record(100_000, c(100));
        // 100 in the first 100 s, then 1000 in the last 10 s.
        let r = s.rates(110_000, &c(1100));
        assert_eq!(r.get("lease/0/0").copied(), Some(100.0));
        // Samples older than the window go, keeping one inside it.
        s.record(400_000, c(2000));
        s.record(500_000, c(3000));
        assert_eq!(s.samples.front().map(|x| x.0), Some(100_000));
    }

    /// A formatted counter that started a new period since a sample went
    /// down: it counted up from its minimum within the span, not "wrapped".
    #[test]
    fn formatted_counters_in_a_new_period_count_from_zero() {
        let mut s = RateSampler::default();
        let c = |v: u64| Counters::from([("format/daily/cluster/_".to_owned(), v)]);
        s.record(0, c(90_000));
        let r = s.rates(10_000, &c(500));
        assert_eq!(r.get("format/daily/cluster/_").copied(), Some(50.0));
    }

    #[tokio::test]
    async fn restore_moves_every_counter_forward_and_sets_the_floor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::create(&path, "L").unwrap();
        store.store_hwm(KEY, 5_000).await.unwrap();
        let tag = Tag::parse("orders").unwrap();
        store
            .create_tag(&tag, &TagRecord::new(100, 10, "", 0).unwrap())
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
        let s = suggest(&info, 71_000);
        // 2 x 5/s x 60 s = 600, plus 2 x 50 = 700, rounded up: 1000.
        assert_eq!(s.margin, 1000, "{}", s.explanation);

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
}
