//! Writing a backup: a consistent copy of every table of the state file,
//! with the snapshot's own record and the counters' rates, taken by the
//! running node or from a file no node holds.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use redb::{ReadTransaction, ReadableDatabase, TableHandle};

use super::rates::{RateSampler, MAX_TRACKED_COUNTERS, SAMPLE_EVERY};
use super::{copy_table, temp_beside, SNAPSHOT, SNAPSHOT_KIND, SNAPSHOT_RATES};
use crate::store::counts::COUNTS;
use crate::store::embedded::{backend_err, EmbeddedStore, FORMAT_VERSION, HWM, META};
use crate::store::format::catalog::FORMAT_DEFS;
use crate::store::format::counters::FORMATS;
use crate::store::hide_keys::HIDE_KEYS;
use crate::store::lease::{LEASE, LEASE_ZONES};
use crate::store::segment::SEGMENTS;
use crate::store::state_file::PeriodicThread;
use crate::store::strict::{STRICT, STRICT_NAMESPACES, STRICT_TOMBSTONES};
use crate::store::StoreError;

/// Tables a state file may hold; a snapshot copies each. A table not in
/// this list makes the backup fail rather than silently leave it out.
const KNOWN_TABLES: [&str; 12] = [
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
    "hide_keys",
    "lease_zones",
];

/// Takes snapshots of a running node's state file.
#[derive(Clone)]
pub struct SnapshotSource {
    store: EmbeddedStore,
    sampler: Arc<Mutex<RateSampler>>,
    /// Facts of the node's config the restore reports (block sizes).
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
    /// the mode is off) are reported by restore.
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

    /// Records `formatted.block`, which restore reports.
    pub fn with_formatted_block(mut self, block: u64) -> Self {
        self.extra
            .insert("formatted_block".to_owned(), block.to_string());
        self
    }

    /// Samples every counter now (a read transaction); called every
    /// [`SAMPLE_EVERY`] while serving.
    pub fn sample(&self, now_ms: u64) -> Result<(), StoreError> {
        let (_, counters) = self
            .store
            .admin_moves()
            .issued_counters(&self.store.db(), MAX_TRACKED_COUNTERS)?;
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
    ) -> std::io::Result<PeriodicThread> {
        let this = self.clone();
        PeriodicThread::start("idgen-rate-sample", SAMPLE_EVERY, move || {
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
    /// issued. It is marked as such and restore needs no margin for it.
    pub fn take(&self, now_ms: u64) -> Result<Vec<u8>, StoreError> {
        let lost = self.store.guard().lost_error();
        let (txn, counters) = self
            .store
            .admin_moves()
            .issued_counters(&self.store.db(), MAX_TRACKED_COUNTERS)?;
        let rates = self
            .sampler
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rates(now_ms, &counters);
        let mut info = self.extra.clone();
        let measured = if rates.is_empty() {
            "not measured yet (taken within a second of the node's start)"
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
        (
            "rates".to_owned(),
            "not recorded (offline backup)".to_owned(),
        ),
        ("source".to_owned(), path.display().to_string()),
    ]);
    snapshot_bytes(&txn, now_ms, info, &BTreeMap::new())
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
pub(super) fn snapshot_bytes(
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
    // Each zone's plain or hidden record, as the counters were used under.
    copy_table(txn, &out, LEASE_ZONES)?;
    copy_table(txn, &out, STRICT)?;
    copy_table(txn, &out, STRICT_NAMESPACES)?;
    copy_table(txn, &out, STRICT_TOMBSTONES)?;
    copy_table(txn, &out, COUNTS)?;
    copy_table(txn, &out, FORMATS)?;
    copy_table(txn, &out, FORMAT_DEFS)?;
    // Hide keys sealed as stored: a restore keeps old hidden IDs decodable.
    copy_table(txn, &out, HIDE_KEYS)?;
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
