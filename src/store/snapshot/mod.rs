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
//! and a backup does not know it. No rate measured before a backup bounds
//! what the node issued after it, so [`restore_with()`] moves every
//! segment `max_id` and lease token counter forward by a margin the
//! operator states (`--skip-ahead`), strict counters by one of their own
//! (`--strict-skip-ahead`: strict values count calls, not IDs), records
//! those margins as the floors of counters the snapshot did not hold yet,
//! and raises every high-water mark to the time of the restore plus the
//! reserve. Without the margins, `idgen state restore` refuses and reports
//! what the backup knows ([`facts`]), never a margin of its own.
//! Formatted counters move by a margin per format instead
//! ([`crate::store::format::restore`]).
//!
//! A current copy needs no margin: the mirror ([`Mirror`],
//! `store.mirror_path`) is rewritten after every commit and before that
//! commit's IDs are handed out, and a rescue snapshot is taken after the
//! node stopped issuing; each holds every reservation whose IDs anyone
//! saw, so restoring it with margin 0 is exact.
//!
//! The parts: `take.rs` writes a backup ([`SnapshotSource`],
//! [`take_offline`], [`write_snapshot_file`]); `rates.rs` samples how fast
//! counters move, leaving admin moves out ([`RateSampler`],
//! [`AdminMoves`]); `mirror.rs` keeps the current copy ([`Mirror`]);
//! `restore.rs` reads a snapshot back ([`inspect`]), says what a backup
//! knows ([`facts`]) and writes a new state file from it with every counter
//! moved forward and the floors set ([`restore()`], [`restore_with`]).

mod mirror;
mod rates;
mod restore;
mod take;

use std::path::{Path, PathBuf};

use redb::{ReadTransaction, ReadableTable, TableDefinition};

use super::backend_err;
use super::StoreError;

pub use mirror::Mirror;
pub use rates::{
    AdminMoves, Counters, RateSampler, MAX_TRACKED_COUNTERS, RATE_WINDOW_MS, SAMPLE_EVERY,
};
pub use restore::{facts, inspect, restore, restore_with, Margins, RestoreReport, SnapshotInfo};
pub use take::{take_offline, write_snapshot_file, SnapshotSource};

/// What a snapshot says about itself.
const SNAPSHOT: TableDefinition<&str, &str> = TableDefinition::new("snapshot");
/// Counter -> how fast it moved when the snapshot was taken, per second.
const SNAPSHOT_RATES: TableDefinition<&str, f64> = TableDefinition::new("snapshot_rates");

/// The `kind` every idgen snapshot carries.
pub const SNAPSHOT_KIND: &str = "idgen-snapshot";

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

/// A path beside `target` to build a file in before linking it into
/// place (any leftover from an earlier run is removed).
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
