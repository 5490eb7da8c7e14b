//! The embedded backend: one redb file with fsync'd commits.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, TableDefinition};

use super::reopen::{database_in, DbRef, ReopeningDatabase, StoreHealth, WriteTxn};
use super::snapshot::{AdminMoves, Mirror};
use super::state_file::StateFileGuard;
use super::StoreError;
use crate::id::Clock;

/// File-wide facts recorded by `idgen init` (defined beside the reopen
/// probe that writes into it).
pub(crate) use super::reopen::META;
/// High-water marks, keyed `"<datacenter>/<worker>"`, in Unix ms.
pub(crate) const HWM: TableDefinition<&str, u64> = TableDefinition::new("hwm");

pub(crate) const FORMAT_VERSION: &str = "1";

/// The `meta` key of the floor set by `idgen state restore`: counters the
/// backup did not hold (a lease token, strict key or segment tag first
/// used after it) start above it instead of at zero.
pub(crate) const RESTORE_FLOOR: &str = "restore_floor";

/// The `meta` key of the floor of strict keys the backup did not hold:
/// strict values count calls, not IDs, so a restore moves them by a margin
/// of their own (`--strict-skip-ahead`). Files restored before it have
/// only [`RESTORE_FLOOR`], which then applies to strict keys too.
pub(crate) const RESTORE_FLOOR_STRICT: &str = "restore_floor_strict";

/// Defined beside [`StoreError`] (the snapshot files use it without
/// importing this one); named here for the embedded stores.
pub(super) use super::backend_err;

/// A single-node state file. Every write is a redb transaction committed
/// with immediate durability (fsync) before it returns. After a write
/// error the file is reopened in the background (see [`super::reopen`]).
#[derive(Clone)]
pub struct EmbeddedStore {
    db: Arc<ReopeningDatabase>,
    path: PathBuf,
    guard: Arc<StateFileGuard>,
    floor: u64,
    strict_floor: u64,
    /// The current copy kept at `store.mirror_path`, if set.
    mirror: Option<Arc<Mirror>>,
    /// Counter moves made by admin calls, left out of issue rates.
    admin_moves: Arc<AdminMoves>,
}

impl std::fmt::Debug for EmbeddedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedStore")
            .field("path", &self.path)
            .finish()
    }
}

impl EmbeddedStore {
    /// Creates a new state file for `layout` (a description recorded so a
    /// later start with another layout is refused). Fails if it exists.
    pub fn create(path: &Path, layout: &str) -> Result<Self, StoreError> {
        if path.exists() {
            return Err(StoreError::AlreadyExists {
                path: path.display().to_string(),
            });
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Backend(format!("cannot create directory {}: {e}", dir.display()))
            })?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    StoreError::AlreadyExists {
                        path: path.display().to_string(),
                    }
                } else {
                    StoreError::Backend(format!("cannot create state file {}: {e}", path.display()))
                }
            })?;
        let (db, guard) = open_db(path, file)?;
        let txn = db.begin_write().map_err(backend_err)?;
        {
            let mut meta = txn.open_table(META).map_err(backend_err)?;
            meta.insert("format_version", FORMAT_VERSION)
                .map_err(backend_err)?;
            meta.insert("layout", layout).map_err(backend_err)?;
            txn.open_table(HWM).map_err(backend_err)?;
        }
        txn.commit().map_err(backend_err)?;
        Ok(Self::serving(db, path, guard, (0, 0)))
    }

    /// Opens an existing state file and checks it was made for `layout`.
    /// With `init_if_missing` a missing file is created instead of refused.
    pub fn open(path: &Path, layout: &str, init_if_missing: bool) -> Result<Self, StoreError> {
        if !path.exists() {
            if init_if_missing {
                tracing::warn!(
                    path = %path.display(),
                    "state file missing: creating it because store.init_if_missing = true (development only; in production run `idgen init` once and leave this false)"
                );
                return Self::create(path, layout);
            }
            return Err(StoreError::Missing {
                path: path.display().to_string(),
            });
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| {
                StoreError::Backend(format!("cannot open state file {}: {e}", path.display()))
            })?;
        // An empty file would be initialised by redb: refuse it untouched.
        if file.metadata().map(|m| m.len()).unwrap_or(0) == 0 {
            return Err(StoreError::Backend(format!(
                "{} is empty, not an idgen state file; restore it from a backup (`idgen state restore`)",
                path.display()
            )));
        }
        let (db, guard) = open_db(path, file)?;
        let (stored, floors) = {
            let txn = db.begin_read().map_err(backend_err)?;
            let meta = txn.open_table(META).map_err(|e| {
                StoreError::Backend(format!(
                    "{} is not an idgen state file ({e}); was it created by `idgen init`?",
                    path.display()
                ))
            })?;
            let version = meta.get("format_version").map_err(backend_err)?;
            check_format_version(path, version.as_ref().map(|v| v.value()))?;
            let layout = meta.get("layout").map_err(backend_err)?;
            let floor = read_floor(&meta, RESTORE_FLOOR, path)?.unwrap_or(0);
            let strict_floor = read_floor(&meta, RESTORE_FLOOR_STRICT, path)?.unwrap_or(floor);
            (
                layout.map(|v| v.value().to_owned()).unwrap_or_default(),
                (floor, strict_floor),
            )
        };
        if stored != layout {
            return Err(StoreError::LayoutMismatch {
                path: path.display().to_string(),
                stored,
                configured: layout.to_owned(),
            });
        }
        Ok(Self::serving(db, path, guard, floors))
    }

    fn serving(
        db: Database,
        path: &Path,
        guard: StateFileGuard,
        (floor, strict_floor): (u64, u64),
    ) -> Self {
        let guard = Arc::new(guard);
        Self {
            db: Arc::new(ReopeningDatabase::new(db, Arc::clone(&guard))),
            path: path.to_owned(),
            guard,
            floor,
            strict_floor,
            mirror: None,
            admin_moves: Arc::default(),
        }
    }

    /// Keeps a current copy of the file at `mirror` from now on (see
    /// [`Mirror`]): refuses a file behind a mirror already there, writes
    /// the first copy, then rewrites it after every commit. Call it right
    /// after opening, before anything is reserved.
    pub fn with_mirror(mut self, mirror: &Path, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        let m = Mirror::new(mirror, &self.path, clock);
        m.start(&self.db())?;
        self.mirror = Some(Arc::new(m));
        Ok(self)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The database in service, for the other record kinds kept in the
    /// same file (its transactions fail while a write error is healed).
    pub(crate) fn db(&self) -> DbRef {
        self.db.get()
    }

    /// Whether the file accepts writes; false from a write error until a
    /// reopen succeeded.
    pub fn health(&self) -> &Arc<StoreHealth> {
        self.db.health()
    }

    /// What notices the file being deleted or replaced under this node.
    pub fn guard(&self) -> &Arc<StateFileGuard> {
        &self.guard
    }

    /// Where counters missing from the file start (0, or the floor a
    /// restore set; see [`RESTORE_FLOOR`]).
    pub(crate) fn floor(&self) -> u64 {
        self.floor
    }

    /// Counter moves made by admin calls since the node started, which the
    /// backup's rate sampler leaves out.
    pub(crate) fn admin_moves(&self) -> &AdminMoves {
        &self.admin_moves
    }

    /// Where strict keys missing from the file start (see
    /// [`RESTORE_FLOOR_STRICT`]).
    pub(crate) fn strict_floor(&self) -> u64 {
        self.strict_floor
    }

    /// Begins a write, after checking that the path still names the file
    /// this node opened (a deleted or replaced file refuses every write).
    /// Fails at once while a write error is being healed.
    pub(crate) fn begin_write(&self) -> Result<WriteTxn, StoreError> {
        self.guard.check()?;
        self.db.begin_write()
    }

    /// Commits durably, then checks the file again: a commit that landed
    /// in a file deleted meanwhile reports an error, so what it reserved
    /// is never handed out. A failed commit starts the reopen. With a
    /// mirror, returns only once the mirror holds the commit (rule 11).
    pub(crate) fn commit(&self, txn: WriteTxn) -> Result<(), StoreError> {
        self.db.commit(txn)?;
        self.guard.check()?;
        match &self.mirror {
            Some(mirror) => mirror.after_commit(&self.db()),
            None => Ok(()),
        }
    }

    /// Test hook: fails the database in service as a write error would.
    #[cfg(test)]
    pub(crate) fn inject_write_fault(&self, why: &str) {
        self.db.inject_fault(why);
    }
}

/// A restore floor recorded in `meta` under `key`, if any.
fn read_floor(
    meta: &redb::ReadOnlyTable<&str, &str>,
    key: &str,
    path: &Path,
) -> Result<Option<u64>, StoreError> {
    match meta.get(key).map_err(backend_err)? {
        Some(v) => v.value().parse::<u64>().map(Some).map_err(|e| {
            StoreError::Backend(format!(
                "state file {}: unreadable {key} ({e}); restore it from a backup",
                path.display()
            ))
        }),
        None => Ok(None),
    }
}

/// Refuses a state file whose records this binary cannot read: one
/// written by a newer idgen (read with the old rules, its counters could
/// go back), or one without the version `idgen init` records.
fn check_format_version(path: &Path, version: Option<&str>) -> Result<(), StoreError> {
    match version {
        Some(FORMAT_VERSION) => Ok(()),
        Some(other) => Err(StoreError::Backend(format!(
            "state file {} has format version {other:?} and this idgen reads version {FORMAT_VERSION}: it was written by another idgen release; run the release that wrote it (or a newer one), or restore a backup made by this one (`idgen state restore`)",
            path.display()
        ))),
        None => Err(StoreError::Backend(format!(
            "state file {} records no format version, so it was not made by `idgen init`: restore the node's state file from a backup (`idgen state restore`)",
            path.display()
        ))),
    }
}

/// Opens the redb database in `file` (already opened at `path`) and
/// records the file's identity, so a later deletion or replacement of the
/// path is noticed.
fn open_db(path: &Path, file: std::fs::File) -> Result<(Database, StateFileGuard), StoreError> {
    let meta = file.metadata().map_err(|e| {
        StoreError::Backend(format!("cannot examine state file {}: {e}", path.display()))
    })?;
    let guard = StateFileGuard::new(path, &meta);
    Ok((database_in(path, file)?, guard))
}

/// Runs a redb call on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Backend(format!("store task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{HwmStore, WorkerKey};

    const KEY: WorkerKey = WorkerKey {
        datacenter: 1,
        worker: 7,
    };

    /// Writes `version` (or removes it) in the `meta` table of `path`.
    fn set_version(path: &Path, version: Option<&str>) {
        let db = Database::open(path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            match version {
                Some(v) => meta.insert("format_version", v).map(drop).unwrap(),
                None => meta.remove("format_version").map(drop).unwrap(),
            }
        }
        txn.commit().unwrap();
    }

    #[tokio::test]
    async fn a_state_file_of_another_format_version_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let store = EmbeddedStore::create(&path, "L").unwrap();
        store.store_hwm(KEY, 456).await.unwrap();
        drop(store);
        for (version, says) in [
            (
                Some("2"),
                "format version \"2\" and this idgen reads version 1",
            ),
            (Some("one"), "format version \"one\""),
            (None, "records no format version"),
        ] {
            set_version(&path, version);
            let e = EmbeddedStore::open(&path, "L", false).unwrap_err();
            assert!(e.to_string().contains(says), "{version:?}: {e}");
        }
        // Back to this release's version: the file was left as it was.
        set_version(&path, Some(FORMAT_VERSION));
        let store = EmbeddedStore::open(&path, "L", false).unwrap();
        assert_eq!(store.load_hwm(KEY).await.unwrap(), Some(456));
    }

    #[tokio::test]
    async fn hwm_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let store = EmbeddedStore::create(&path, "L").unwrap();
        assert_eq!(store.load_hwm(KEY).await.unwrap(), None);
        store.store_hwm(KEY, 123).await.unwrap();
        store.store_hwm(KEY, 456).await.unwrap();
        drop(store);
        let store = EmbeddedStore::open(&path, "L", false).unwrap();
        assert_eq!(store.load_hwm(KEY).await.unwrap(), Some(456));
        let other = WorkerKey {
            datacenter: 1,
            worker: 8,
        };
        assert_eq!(store.load_hwm(other).await.unwrap(), None);
    }

    #[test]
    fn missing_file_is_refused_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/state.redb");
        let err = EmbeddedStore::open(&path, "L", false).unwrap_err();
        assert!(matches!(err, StoreError::Missing { .. }));
        let text = err.to_string();
        // It says what the file holds and how to recover, and warns
        // against `idgen init` instead of suggesting it.
        for needle in [
            "high-water mark",
            "segment, lease and strict counters",
            "idgen state restore",
            "--skip-ahead",
            "Do not run `idgen init`",
            "restarts segment, lease and strict counters",
        ] {
            assert!(text.contains(needle), "missing {needle:?}: {text}");
        }
        assert!(!text.contains("create it with `idgen init`"), "{text}");
        assert!(!path.exists());
        EmbeddedStore::open(&path, "L", true).unwrap();
        assert!(path.exists());
    }

    #[test]
    fn create_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        EmbeddedStore::create(&path, "L").unwrap();
        assert!(matches!(
            EmbeddedStore::create(&path, "L"),
            Err(StoreError::AlreadyExists { .. })
        ));
    }

    #[test]
    fn layout_change_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        drop(EmbeddedStore::create(&path, "twitter").unwrap());
        let err = EmbeddedStore::open(&path, "js53", false).unwrap_err();
        assert!(matches!(err, StoreError::LayoutMismatch { .. }), "{err}");
        let epoch =
            |ms: u64| format!("time 41x1ms / datacenter 5 / worker 5 / sequence 12 / epoch {ms}ms");
        let path2 = dir.path().join("state2.redb");
        drop(EmbeddedStore::create(&path2, &epoch(1000)).unwrap());
        let err = EmbeddedStore::open(&path2, &epoch(2000), false).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("the file has epoch 1000ms, this node has epoch 2000ms"),
            "{text}"
        );
        assert!(!text.contains("datacenter 5, this node"), "{text}");
    }

    #[test]
    fn empty_file_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        std::fs::write(&path, b"").unwrap();
        let err = EmbeddedStore::open(&path, "L", false).unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }

    #[test]
    fn garbage_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        std::fs::write(&path, b"not a database").unwrap();
        let err = EmbeddedStore::open(&path, "L", false).unwrap_err();
        assert!(matches!(err, StoreError::Backend(_)), "{err}");
    }
}
