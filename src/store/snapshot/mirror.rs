//! The state file's mirror (`store.mirror_path`): a snapshot of the whole
//! file rewritten after every commit and before that commit's IDs are
//! handed out, so it is never behind what the node issued.
//!
//! A backup taken at some instant does not know what the node handed out
//! after it, and no rate measured before can bound that: a restore from
//! it needs a margin the operator states. The mirror closes that gap for a
//! price (one more synced file write per reservation): every reservation
//! (high-water mark, segment range, lease block, strict values, formatted
//! block) is committed to the state file, then the mirror is rewritten
//! from a read transaction that sees that commit, synced and renamed into
//! place, and only then does the commit return to its caller, who hands
//! the IDs out. A crash at any point leaves either the old mirror (the new
//! reservation was never handed out) or the new one. So the mirror holds
//! every reservation whose IDs anyone saw, and `idgen state restore` from
//! it needs no margin: every counter continues above its mirrored value,
//! which is exact.
//!
//! Commits on several threads share mirror writes: each commit counts
//! itself after committing, and a writer records the count it saw before
//! opening its read transaction, so one write covers every commit counted
//! by then and later commits it already covers return at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::rates::{read_counters, Counters};
use super::take::snapshot_bytes;
use super::temp_beside;
use crate::id::Clock;
use crate::store::embedded::backend_err;
use crate::store::reopen::DbRef;
use crate::store::StoreError;

/// The `snapshot` record's `current` value of a mirror.
pub(crate) const MIRROR: &str = "mirror";

/// Keeps `store.mirror_path` current; one per state file.
pub struct Mirror {
    path: PathBuf,
    source: PathBuf,
    clock: Arc<dyn Clock>,
    /// Commits counted so far (each counts itself after committing).
    commits: AtomicU64,
    /// The count the last written mirror covers; held while writing, so
    /// mirrors are written one at a time and never go back.
    written: Mutex<u64>,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror").field("path", &self.path).finish()
    }
}

impl Mirror {
    /// A mirror at `path` of the state file at `source`.
    pub fn new(path: &Path, source: &Path, clock: Arc<dyn Clock>) -> Self {
        Self {
            path: path.to_owned(),
            source: source.to_owned(),
            clock,
            commits: AtomicU64::new(0),
            written: Mutex::new(0),
        }
    }

    /// Where the mirror is written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Called after every commit to the state file, before the commit's
    /// caller hands anything out: returns once a mirror that holds this
    /// commit is synced in place. An error means the reservation must not
    /// be used (a gap, never a repeat).
    pub(crate) fn after_commit(&self, db: &DbRef) -> Result<(), StoreError> {
        let mine = self.commits.fetch_add(1, Ordering::AcqRel) + 1;
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        if *written >= mine {
            return Ok(());
        }
        let covers = self.commits.load(Ordering::Acquire);
        self.write(db)?;
        *written = covers;
        Ok(())
    }

    /// Writes the mirror from what `db` holds now (at start-up, before
    /// anything is issued), after checking the state file is not behind
    /// a mirror already there.
    pub(crate) fn start(&self, db: &DbRef) -> Result<(), StoreError> {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        self.refuse_if_behind(db)?;
        let covers = self.commits.load(Ordering::Acquire);
        self.write(db)?;
        *written = covers;
        Ok(())
    }

    /// Refuses a state file that is behind the mirror at the path: a file
    /// re-created by `idgen init`, or restored from an older backup with
    /// too small a margin. Starting on it would overwrite the one copy
    /// that knows what was issued.
    fn refuse_if_behind(&self, db: &DbRef) -> Result<(), StoreError> {
        if !self.path.exists() {
            return Ok(());
        }
        let mirrored = mirrored_counters(&self.path)?;
        let txn = db.begin_read().map_err(backend_err)?;
        let state = read_counters(&txn, usize::MAX)?;
        if let Some((key, m, s)) = first_behind(&mirrored, &state) {
            return Err(StoreError::Backend(format!(
                "state file {} is behind its mirror {} ({key}: mirror {m}, state file {s}): it was re-created or restored from an older backup, and starting would overwrite the copy that holds what the node issued. Move the state file away and restore from the mirror (`idgen state restore {}`); or, if you mean to discard the mirror, move it away first",
                self.source.display(),
                self.path.display(),
                self.path.display()
            )));
        }
        Ok(())
    }

    /// One mirror write: a snapshot of what `db` holds now, written beside
    /// the mirror, synced, renamed over it, and the directory synced.
    fn write(&self, db: &DbRef) -> Result<(), StoreError> {
        let txn = db.begin_read().map_err(backend_err)?;
        let info = BTreeMap::from([
            ("current".to_owned(), MIRROR.to_owned()),
            ("rates".to_owned(), "not recorded (mirror)".to_owned()),
            ("source".to_owned(), self.source.display().to_string()),
        ]);
        let bytes = snapshot_bytes(&txn, self.clock.now_millis(), info, &BTreeMap::new())?;
        drop(txn);
        replace_file(&self.path, &bytes).map_err(|e| {
            StoreError::Backend(format!(
                "state mirror {} cannot be written ({e}); nothing this write reserved is handed out. Fix the mirror's disk (or unset store.mirror_path and restart)",
                self.path.display()
            ))
        })
    }
}

/// The counters of the mirror at `path` (a snapshot file).
fn mirrored_counters(path: &Path) -> Result<Counters, StoreError> {
    use redb::ReadableDatabase;
    let db = redb::ReadOnlyDatabase::open(path).map_err(|e| {
        StoreError::Backend(format!(
            "state mirror {} cannot be read ({e}); move it away if it is not a mirror idgen wrote",
            path.display()
        ))
    })?;
    let txn = db.begin_read().map_err(backend_err)?;
    read_counters(&txn, usize::MAX)
}

/// The first counter (mark, segment tag, lease token, strict key) the
/// mirror holds above the state file; formatted counters restart each
/// period, so a lower one is no sign of loss and they are left out.
fn first_behind(mirrored: &Counters, state: &Counters) -> Option<(String, u64, u64)> {
    mirrored
        .iter()
        .filter(|(k, _)| {
            !k.ends_with("/*")
                && ["hwm/", "segment/", "lease/", "strict/"]
                    .iter()
                    .any(|p| k.starts_with(p))
        })
        .find_map(|(k, m)| {
            let s = state.get(k).copied().unwrap_or(0);
            (s < *m).then(|| (k.clone(), *m, s))
        })
}

/// Writes `bytes` beside `path`, syncs it, renames it over `path` and
/// syncs the directory: `path` is the old file or the new one, whole.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let tmp = temp_beside(path).map_err(|e| e.to_string())?;
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mirror_ahead_of_the_state_file_is_named() {
        let c = |pairs: &[(&str, u64)]| -> Counters {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
        };
        let mirror = c(&[
            ("segment/orders", 5_000),
            ("segment/*", 5_000),
            ("format/inv/cluster/_", 90),
        ]);
        // Equal, or ahead: fine. Formatted counters restart each period.
        let same = c(&[("segment/orders", 5_000), ("format/inv/cluster/_", 3)]);
        assert_eq!(first_behind(&mirror, &same), None);
        // Behind, or missing (a re-created file): named.
        let behind = c(&[("segment/orders", 3_000)]);
        assert_eq!(
            first_behind(&mirror, &behind),
            Some(("segment/orders".to_owned(), 5_000, 3_000))
        );
        assert_eq!(
            first_behind(&mirror, &Counters::new()),
            Some(("segment/orders".to_owned(), 5_000, 0))
        );
    }
}
