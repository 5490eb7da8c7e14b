//! Healing the embedded state file after a write error.
//!
//! After an I/O error (ENOSPC, EIO) redb refuses every later operation on
//! that `Database` ("Previous I/O error occurred. Please close and re-open
//! the database."), so without help one full disk is a permanent outage.
//! [`ReopeningDatabase`] holds the open database; the first failed write
//! takes it out of service, marks the store unwritable ([`StoreHealth`])
//! and starts a thread that reopens the file with backoff (50 ms doubling
//! to [`MAX_BACKOFF`]). A reopen is put back into service only once a
//! probe write of [`PROBE_BYTES`] has committed, so the store reports
//! writable again only when real writes succeed.
//!
//! Why this never repeats an ID: nothing is cached across the reopen.
//! Every reservation (high-water mark, segment range, lease block, strict
//! values) is read from the file inside the write transaction that
//! advances it, and the generator only learns what a commit confirmed. A
//! write that failed may or may not be in the file; if it is, the next
//! reservation starts above it (a gap), and if it is not, nothing of it was
//! handed out. The reopen opens the same path without creating it and
//! checks the device and inode against the [`StateFileGuard`]: a file that
//! was deleted or replaced meanwhile marks the guard lost (final) instead.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use redb::{Database, ReadTransaction, TableDefinition, WriteTransaction};

use super::state_file::{identity, StateFileGuard};
use super::StoreError;
use crate::metrics as m;

/// File-wide facts recorded by `idgen init`; the reopen probe writes
/// into it, so it is defined here and re-exported by the embedded store.
pub(crate) const META: TableDefinition<&str, &str> = TableDefinition::new("meta");

/// Longest wait between two reopen attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// First wait after a failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Size of the probe value written (then removed) after a reopen: enough
/// to need fresh pages, so a disk that is still full fails the probe.
pub const PROBE_BYTES: usize = 64 * 1024;
/// The `meta` key the probe writes and removes again.
const PROBE_KEY: &str = "write_probe";

/// Whether the embedded state file accepts writes, shared with the server
/// (readiness, liveness, metrics).
#[derive(Debug, Default)]
pub struct StoreHealth {
    /// True while a write error is being healed.
    faulty: AtomicBool,
    /// When the current fault began, and the last error seen.
    fault: Mutex<Option<(Instant, String)>>,
    reopens: AtomicU64,
}

impl StoreHealth {
    /// A healthy store.
    pub fn new() -> Self {
        metrics::gauge!(m::STORE_HEALTHY).set(1.0);
        Self::default()
    }

    /// True while the store accepts writes (one atomic load).
    pub fn is_writable(&self) -> bool {
        !self.faulty.load(Ordering::Acquire)
    }

    /// How long the store has been unable to write, if it is.
    pub fn unwritable_for(&self) -> Option<Duration> {
        if self.is_writable() {
            return None;
        }
        self.lock().as_ref().map(|(since, _)| since.elapsed())
    }

    /// The last write error of the current fault, if there is one.
    pub fn last_error(&self) -> Option<String> {
        if self.is_writable() {
            return None;
        }
        self.lock().as_ref().map(|(_, e)| e.clone())
    }

    /// Successful reopens so far.
    pub fn reopens(&self) -> u64 {
        self.reopens.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, String)>> {
        self.fault
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a write error; true if it starts a new fault.
    fn failed(&self, error: &str) -> bool {
        let mut fault = self.lock();
        let new = fault.is_none();
        match fault.as_mut() {
            Some((_, last)) => *last = error.to_owned(),
            None => *fault = Some((Instant::now(), error.to_owned())),
        }
        self.faulty.store(true, Ordering::Release);
        metrics::gauge!(m::STORE_HEALTHY).set(0.0);
        new
    }

    fn healed(&self) -> Duration {
        let since = self.lock().take().map(|(s, _)| s.elapsed());
        self.faulty.store(false, Ordering::Release);
        self.reopens.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(m::STORE_HEALTHY).set(1.0);
        since.unwrap_or_default()
    }
}

/// Why no transaction could be begun: the database is out of service
/// (being reopened), or redb refused.
#[derive(Debug)]
pub enum BeginError {
    /// A write failed earlier; the file is being reopened.
    Unwritable(String),
    /// redb's own error.
    Redb(redb::TransactionError),
}

impl std::fmt::Display for BeginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unwritable(msg) => f.write_str(msg),
            Self::Redb(e) => e.fmt(f),
        }
    }
}

/// The database as it stands when asked for; see
/// [`ReopeningDatabase::get`].
pub struct DbRef {
    db: Result<Arc<Database>, String>,
}

impl DbRef {
    /// Begins a read transaction.
    pub fn begin_read(&self) -> Result<ReadTransaction, BeginError> {
        use redb::ReadableDatabase;
        match &self.db {
            Ok(db) => db.begin_read().map_err(BeginError::Redb),
            Err(msg) => Err(BeginError::Unwritable(msg.clone())),
        }
    }

    /// Begins a write transaction directly, without the fault tracking of
    /// `EmbeddedStore::begin_write` (tests hold the writer lock
    /// with it).
    pub fn begin_write(&self) -> Result<WriteTransaction, BeginError> {
        match &self.db {
            Ok(db) => db.begin_write().map_err(BeginError::Redb),
            Err(msg) => Err(BeginError::Unwritable(msg.clone())),
        }
    }
}

/// A write transaction and the database it belongs to (so a failure is
/// charged to that database, not to one reopened since). Derefs to
/// redb's transaction.
pub struct WriteTxn {
    txn: WriteTransaction,
    db: Arc<Database>,
}

impl std::ops::Deref for WriteTxn {
    type Target = WriteTransaction;
    fn deref(&self) -> &WriteTransaction {
        &self.txn
    }
}

/// The open database of one state file, reopened after a write error.
pub struct ReopeningDatabase {
    db: RwLock<Option<Arc<Database>>>,
    path: PathBuf,
    guard: Arc<StateFileGuard>,
    health: Arc<StoreHealth>,
    /// True while a reopen thread runs (at most one).
    reopening: AtomicBool,
}

impl std::fmt::Debug for ReopeningDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReopeningDatabase")
            .field("path", &self.path)
            .field("health", &self.health)
            .finish()
    }
}

impl ReopeningDatabase {
    /// Serves `db`, opened from the file `guard` watches.
    pub fn new(db: Database, guard: Arc<StateFileGuard>) -> Self {
        Self {
            db: RwLock::new(Some(Arc::new(db))),
            path: guard.path().to_owned(),
            guard,
            health: Arc::new(StoreHealth::new()),
            reopening: AtomicBool::new(false),
        }
    }

    /// Whether the store accepts writes.
    pub fn health(&self) -> &Arc<StoreHealth> {
        &self.health
    }

    /// The database in service, or why there is none right now.
    pub fn get(&self) -> DbRef {
        DbRef {
            db: self.current().map_err(|e| e.to_string()),
        }
    }

    fn current(&self) -> Result<Arc<Database>, StoreError> {
        let slot = self.db.read().unwrap_or_else(|p| p.into_inner());
        match slot.as_ref() {
            Some(db) => Ok(Arc::clone(db)),
            None => Err(StoreError::Backend(self.unwritable_message())),
        }
    }

    fn unwritable_message(&self) -> String {
        let since = self.health.unwritable_for().unwrap_or_default().as_secs();
        let last = self.health.last_error().unwrap_or_default();
        format!(
            "state file {} cannot be written (for {since} s; last error: {last}); the node reopens it with backoff and resumes issuing by itself once writes succeed (free disk space or fix the device); meanwhile call another node",
            self.path.display()
        )
    }

    /// Begins a write transaction; a failure takes the database out of
    /// service and starts the reopen.
    pub fn begin_write(self: &Arc<Self>) -> Result<WriteTxn, StoreError> {
        let db = self.current().inspect_err(|_| {
            // Out of service: a reopen runs (this starts one only if the
            // last could not be spawned).
            self.start_reopen();
        })?;
        match db.begin_write() {
            Ok(txn) => Ok(WriteTxn { txn, db }),
            Err(e) => Err(self.fault(&db, &e.to_string())),
        }
    }

    /// Commits durably; a failure takes the database out of service and
    /// starts the reopen. What the transaction reserved is never used.
    pub fn commit(self: &Arc<Self>, txn: WriteTxn) -> Result<(), StoreError> {
        let WriteTxn { txn, db } = txn;
        match txn.commit() {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fault(&db, &e.to_string())),
        }
    }

    /// Takes `failed` out of service (if it still is) and makes sure a
    /// reopen thread runs. Returns the error for the caller.
    fn fault(self: &Arc<Self>, failed: &Arc<Database>, error: &str) -> StoreError {
        {
            // Under the slot lock, as the reopen's install is: a fault of a
            // database put in service a moment ago always finds a reopen
            // to start (never a finished one about to report healed).
            let mut slot = self.db.write().unwrap_or_else(|p| p.into_inner());
            if slot.as_ref().is_some_and(|db| Arc::ptr_eq(db, failed)) {
                // Dropped once the last transaction on it ends; redb keeps
                // the file locked until then, and the reopen waits for it.
                *slot = None;
                metrics::counter!(m::STORE_WRITE_FAULTS).increment(1);
                if self.health.failed(error) {
                    tracing::error!(
                        path = %self.path.display(),
                        error,
                        "state file write failed: refusing writes (readiness fails) and reopening it with backoff"
                    );
                }
            }
        }
        self.start_reopen();
        StoreError::Backend(format!(
            "state file {}: write failed ({error}); nothing it reserved is used. The node reopens the file with backoff and resumes issuing by itself once writes succeed; meanwhile call another node",
            self.path.display()
        ))
    }

    /// Test hook: takes the database in service out as a write error
    /// would.
    #[cfg(test)]
    pub(crate) fn inject_fault(self: &Arc<Self>, why: &str) {
        if let Ok(db) = self.current() {
            let _ = self.fault(&db, why);
        }
    }

    fn start_reopen(self: &Arc<Self>) {
        if self.reopening.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("idgen-store-reopen".into())
            .spawn(move || reopen_loop(&weak));
        if let Err(e) = spawned {
            self.reopening.store(false, Ordering::Release);
            tracing::error!(error = %e, "cannot start the state file reopen thread; the next write error tries again");
        }
    }

    /// One attempt: open the same file again, probe a write, and put the
    /// new database in service.
    /// Returns how long the store was out of service.
    fn try_reopen(&self) -> Result<Duration, StoreError> {
        let db = self.open_same_file()?;
        probe(&db).map_err(|e| StoreError::Backend(format!("probe write failed: {e}")))?;
        // The probe landed in this file, not in one put at the path since.
        self.guard.check()?;
        let mut slot = self.db.write().unwrap_or_else(|p| p.into_inner());
        *slot = Some(Arc::new(db));
        // Healed and done under the slot lock (see `fault`).
        let down = self.health.healed();
        self.reopening.store(false, Ordering::Release);
        Ok(down)
    }

    /// Opens the file at the path if it is still the one this node opened
    /// first; never creates it.
    fn open_same_file(&self) -> Result<Database, StoreError> {
        self.guard.check()?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path);
        let file = match file {
            Ok(f) => f,
            Err(e) => {
                // Gone meanwhile: the guard marks it lost for good.
                self.guard.check()?;
                return Err(StoreError::Backend(format!(
                    "cannot open state file {}: {e}",
                    self.path.display()
                )));
            }
        };
        let meta = file.metadata().map_err(|e| {
            StoreError::Backend(format!(
                "cannot examine state file {}: {e}",
                self.path.display()
            ))
        })?;
        if !self.guard.is_same(identity(&meta)) {
            // Replaced between the check and the open: the guard's own
            // check now sees it and marks the file lost.
            self.guard.check()?;
            return Err(StoreError::Backend(format!(
                "state file {} changed while reopening; not using it",
                self.path.display()
            )));
        }
        if meta.len() == 0 {
            return Err(StoreError::Backend(format!(
                "state file {} is empty; not reopening it",
                self.path.display()
            )));
        }
        database_in(&self.path, file)
    }
}

/// Writes [`PROBE_BYTES`] into `meta` and removes them again, in two
/// durable commits (a crash in between leaves one harmless `meta` key,
/// which the next probe removes).
fn probe(db: &Database) -> Result<(), String> {
    let value = "0".repeat(PROBE_BYTES);
    for keep in [true, false] {
        let txn = db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut meta = txn.open_table(META).map_err(|e| e.to_string())?;
            if keep {
                meta.insert(PROBE_KEY, value.as_str())
                    .map_err(|e| e.to_string())?;
            } else {
                meta.remove(PROBE_KEY).map_err(|e| e.to_string())?;
            }
        }
        txn.commit().map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn reopen_loop(weak: &Weak<ReopeningDatabase>) {
    let mut delay = FIRST_BACKOFF;
    let mut attempts = 0u64;
    loop {
        std::thread::sleep(delay);
        let Some(this) = weak.upgrade() else { return };
        attempts += 1;
        match this.try_reopen() {
            Ok(down) => {
                metrics::counter!(m::STORE_REOPENS, "result" => m::label::RESULT_OK).increment(1);
                tracing::info!(
                    path = %this.path.display(),
                    attempts,
                    down_ms = down.as_millis() as u64,
                    "state file reopened and writable again: issuing resumes"
                );
                return;
            }
            Err(e @ StoreError::StateFileLost { .. }) => {
                // Final: the guard stopped every mode; nothing to reopen.
                tracing::error!(error = %e, "state file lost while reopening it; not retrying");
                this.reopening.store(false, Ordering::Release);
                return;
            }
            Err(e) => {
                metrics::counter!(m::STORE_REOPENS, "result" => m::label::RESULT_FAILED)
                    .increment(1);
                let e = match e {
                    StoreError::Backend(msg) => msg,
                    e => e.to_string(),
                };
                if attempts == 1 || attempts.is_power_of_two() {
                    tracing::warn!(
                        path = %this.path.display(),
                        attempts,
                        error = %e,
                        "state file still cannot be written; retrying"
                    );
                }
                this.health.note(&e);
            }
        }
        delay = (delay * 2).min(MAX_BACKOFF);
    }
}

impl StoreHealth {
    /// Updates the last error of the current fault.
    fn note(&self, error: &str) {
        if let Some((_, last)) = self.lock().as_mut() {
            *last = error.to_owned();
        }
    }
}

/// Opens the redb database in `file` (already opened at `path`).
/// The embedded store opens its file the same way.
pub(super) fn database_in(path: &Path, file: std::fs::File) -> Result<Database, StoreError> {
    let backend = redb::backends::FileBackend::new(file).map_err(|e| {
        StoreError::Backend(format!("cannot open state file {}: {e}", path.display()))
    })?;
    let db = redb::Builder::new()
        .create_with_backend(super::fault_hook::HookedFile(backend))
        .map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Backend(format!(
                "state file {} is open in another idgen process (one node per state file; to back it up while it runs use `idgen state backup`)",
                path.display()
            )),
            e => StoreError::Backend(format!("cannot open state file {}: {e}", path.display())),
        })?;
    Ok(db)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{EmbeddedStore, HwmStore, WorkerKey};

    const KEY: WorkerKey = WorkerKey {
        datacenter: 1,
        worker: 7,
    };

    /// Polls `cond` every 20 ms for at most 10 s.
    fn eventually(mut cond: impl FnMut() -> bool) -> bool {
        for _ in 0..500 {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[tokio::test]
    async fn a_fault_reopens_the_same_file_once_the_old_database_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let store = EmbeddedStore::create(&path, "L").unwrap();
        store.store_hwm(KEY, 100).await.unwrap();
        // A transaction still open on the old database keeps it (and its
        // file lock) alive: the reopen must wait for it.
        let held = store.db();
        let reader = held.begin_read().unwrap();
        store.inject_write_fault("injected: No space left on device");
        let health = Arc::clone(store.health());
        assert!(!health.is_writable());
        let err = store.store_hwm(KEY, 200).await.unwrap_err().to_string();
        assert!(err.contains("cannot be written"), "{err}");
        assert!(err.contains("injected: No space left"), "{err}");
        assert!(err.contains("resumes issuing by itself"), "{err}");
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !health.is_writable(),
            "never two databases on one file: the reopen waits for the old one"
        );
        drop(reader);
        drop(held);
        assert!(eventually(|| health.is_writable()), "reopened");
        assert_eq!(health.reopens(), 1);
        assert!(health.unwritable_for().is_none());
        // Re-read from the file: what was confirmed is there, the failed
        // write is not, and writes work again.
        assert_eq!(store.load_hwm(KEY).await.unwrap(), Some(100));
        store.store_hwm(KEY, 300).await.unwrap();
        assert_eq!(store.load_hwm(KEY).await.unwrap(), Some(300));
        drop(store);
        // The probe left nothing behind.
        let store = EmbeddedStore::open(&path, "L", false).unwrap();
        let txn = store.db().begin_read().unwrap();
        let meta = txn.open_table(META).unwrap();
        assert!(meta.get(PROBE_KEY).unwrap().is_none());
    }

    #[tokio::test]
    async fn a_file_deleted_during_a_fault_is_lost_and_never_recreated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let store = EmbeddedStore::create(&path, "L").unwrap();
        let held = store.db();
        store.inject_write_fault("injected");
        std::fs::remove_file(&path).unwrap();
        drop(held);
        assert!(eventually(|| store.guard().is_lost()), "the reopen saw it");
        std::thread::sleep(Duration::from_millis(200));
        assert!(!path.exists(), "a reopen never creates the file");
        assert!(!store.health().is_writable());
        assert!(matches!(
            store.store_hwm(KEY, 1).await,
            Err(StoreError::StateFileLost { .. })
        ));
    }

    #[test]
    fn a_file_replaced_during_a_fault_is_lost_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let store = EmbeddedStore::create(&path, "L").unwrap();
        let held = store.db();
        store.inject_write_fault("injected");
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"someone else's file").unwrap();
        drop(held);
        assert!(eventually(|| store.guard().is_lost()), "the reopen saw it");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(std::fs::read(&path).unwrap(), b"someone else's file");
        assert!(!store.health().is_writable());
    }
}
