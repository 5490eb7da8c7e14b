//! Noticing that the embedded state file was deleted or replaced under a
//! running node.
//!
//! The node keeps the file open, so after an `rm` (or an `rm` followed by
//! `idgen init` at the same path) its writes would still succeed: they go
//! to the unlinked inode, and a second node started on the new file hands
//! out the same segment IDs, lease IDs and strict values again.
//! [`StateFileGuard`] remembers the device and inode of the file it
//! opened and compares them with what the path names now, before every
//! durable write and, from [`StateFileWatch`]'s own thread, several times
//! per high-water-mark renewal interval. The first mismatch is final: the
//! guard stays lost, every write and every issue fails with
//! [`StoreError::StateFileLost`], and nothing ever recreates the file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use super::StoreError;
use crate::metrics as m;

/// The identity of the state file this node opened.
#[derive(Debug)]
pub struct StateFileGuard {
    path: PathBuf,
    dev: u64,
    ino: u64,
    /// Set once, when the loss is first seen: what happened.
    lost: OnceLock<String>,
    /// Fast path for the issue path: true once `lost` is set.
    lost_flag: AtomicBool,
}

/// The (device, inode) of an open file.
#[cfg(unix)]
pub(crate) fn identity(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// Without inode numbers only deletion can be seen (the length stands in).
#[cfg(not(unix))]
pub(crate) fn identity(_meta: &std::fs::Metadata) -> (u64, u64) {
    (0, 0)
}

impl StateFileGuard {
    /// A guard for the file at `path`, whose open handle has `meta`.
    pub(crate) fn new(path: &Path, meta: &std::fs::Metadata) -> Self {
        let (dev, ino) = identity(meta);
        metrics::gauge!(m::STATE_FILE_LOST).set(0.0);
        Self {
            path: path.to_owned(),
            dev,
            ino,
            lost: OnceLock::new(),
            lost_flag: AtomicBool::new(false),
        }
    }

    /// The guarded path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether an open file with this (device, inode) is the one this
    /// node opened (a reopen after a write error checks it).
    pub(crate) fn is_same(&self, id: (u64, u64)) -> bool {
        id == (self.dev, self.ino)
    }

    /// Whether the file was seen deleted or replaced (one atomic load).
    pub fn is_lost(&self) -> bool {
        self.lost_flag.load(Ordering::Acquire)
    }

    /// The error every write and issue gets once the file is lost.
    pub fn lost_error(&self) -> Option<StoreError> {
        self.lost.get().map(|what| StoreError::StateFileLost {
            path: self.path.display().to_string(),
            what: what.clone(),
        })
    }

    /// Compares the path with the open file. A deleted or replaced file
    /// marks the guard lost for good (logged once, metric set) and is an
    /// error from then on; a path that cannot be examined for another
    /// reason (permissions, I/O) fails this check only.
    pub fn check(&self) -> Result<(), StoreError> {
        if let Some(e) = self.lost_error() {
            return Err(e);
        }
        match std::fs::metadata(&self.path) {
            Ok(meta) if identity(&meta) == (self.dev, self.ino) => Ok(()),
            Ok(meta) => {
                let (dev, ino) = identity(&meta);
                Err(self.mark_lost(format!(
                    "replaced by another file (device {dev}, inode {ino}; this node opened device {}, inode {})",
                    self.dev, self.ino
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(self.mark_lost("deleted".to_owned()))
            }
            Err(e) => Err(StoreError::Backend(format!(
                "cannot check state file {}: {e}; refusing to write until it can be checked",
                self.path.display()
            ))),
        }
    }

    fn mark_lost(&self, what: String) -> StoreError {
        if self.lost.set(what).is_ok() {
            self.lost_flag.store(true, Ordering::Release);
            metrics::gauge!(m::STATE_FILE_LOST).set(1.0);
            if let Some(e) = self.lost_error() {
                tracing::error!(path = %self.path.display(), error = %e, "state file lost: stopped issuing in every mode");
            }
        }
        self.lost_error()
            .unwrap_or_else(|| StoreError::Backend("state file lost".into()))
    }
}

/// A named thread that runs a job every `interval` until the job says to
/// stop or the handle is dropped (which wakes and joins it). Independent of
/// the async runtime: a saturated runtime cannot delay it.
pub struct PeriodicThread {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeriodicThread {
    /// Runs `job` now and then every `interval` on a thread named `name`,
    /// until `job` returns false or the handle is dropped.
    pub fn start(
        name: &str,
        interval: Duration,
        mut job: impl FnMut() -> bool + Send + 'static,
    ) -> std::io::Result<Self> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name(name.to_owned())
                .spawn(move || {
                    let (lock, cvar) = &*stop;
                    let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                    while !*stopped {
                        drop(stopped);
                        if !job() {
                            return;
                        }
                        stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                        if *stopped {
                            return;
                        }
                        stopped = cvar
                            .wait_timeout(stopped, interval)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    }
                })?
        };
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for PeriodicThread {
    fn drop(&mut self) {
        let (lock, cvar) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cvar.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Checks a [`StateFileGuard`] every `interval` on its own thread
/// (`idgen-state-watch`) until the file is lost or this is dropped.
pub struct StateFileWatch {
    /// Stopped and joined when the watch is dropped.
    _thread: PeriodicThread,
}

impl StateFileWatch {
    /// Starts checking `guard` every `interval`; `on_lost` runs once, on
    /// the watch thread, when the file is first seen lost.
    pub fn start(
        guard: Arc<StateFileGuard>,
        interval: Duration,
        on_lost: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Self> {
        let mut on_lost = Some(on_lost);
        PeriodicThread::start("idgen-state-watch", interval, move || {
            if guard.check().is_err() && guard.is_lost() {
                if let Some(f) = on_lost.take() {
                    f();
                }
                return false;
            }
            true
        })
        .map(|thread| Self { _thread: thread })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deleted_and_replaced_files_are_seen_and_stay_lost() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let guard = StateFileGuard::new(&path, &file.metadata().unwrap());
        guard.check().unwrap();
        assert!(!guard.is_lost());
        // Replaced: a new file at the same path while the old one is open.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"x").unwrap();
        let err = guard.check().unwrap_err();
        assert!(guard.is_lost());
        assert!(err.to_string().contains("replaced"), "{err}");
        // Sticky, whatever the path holds later.
        assert!(guard.check().is_err());

        let path2 = dir.path().join("g");
        std::fs::write(&path2, b"x").unwrap();
        let file2 = std::fs::File::open(&path2).unwrap();
        let guard2 = StateFileGuard::new(&path2, &file2.metadata().unwrap());
        std::fs::remove_file(&path2).unwrap();
        let err = guard2.check().unwrap_err();
        assert!(err.to_string().contains("deleted"), "{err}");
        assert!(!path2.exists(), "a check never recreates the file");
    }

    #[test]
    fn the_watch_thread_notices_and_calls_back_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let guard = Arc::new(StateFileGuard::new(&path, &file.metadata().unwrap()));
        let (tx, rx) = std::sync::mpsc::channel();
        let watch =
            StateFileWatch::start(Arc::clone(&guard), Duration::from_millis(10), move || {
                let _ = tx.send(());
            })
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the watch thread saw the deletion");
        drop(watch);
        assert!(guard.is_lost());
    }

    #[test]
    fn a_periodic_thread_runs_until_its_job_or_its_handle_stops_it() {
        let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = Arc::clone(&runs);
        let t = PeriodicThread::start("test-periodic", Duration::from_millis(1), move || {
            counted.fetch_add(1, Ordering::SeqCst) < 2
        })
        .unwrap();
        for _ in 0..1000 {
            if runs.load(Ordering::SeqCst) >= 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(t);
        assert_eq!(runs.load(Ordering::SeqCst), 3, "stops when the job says so");
        // Dropping the handle stops a long interval at once.
        let t = PeriodicThread::start("test-periodic", Duration::from_secs(3600), || true).unwrap();
        drop(t);
    }
}
