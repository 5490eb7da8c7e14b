//! The highest Consul index this node has seen under its cluster's keys,
//! so that a snapshot restore stops every counter mode before a node can
//! plan a write from a counter the restore took back.
//!
//! A node's own writes are covered by [`WrittenValues`] (a read below
//! what it wrote) and by the mark check in every counter txn. What they
//! cannot see is a key this node never wrote: node A issues strict values
//! 1001..5000 after the snapshot, the restore puts the key back at 1000,
//! and node B, reading it for the first time, would hand out 1001.. again.
//! B's read of the key itself looks current (a single key's
//! `X-Consul-Index` is its own ModifyIndex, which the restore brought
//! back too). The cluster's index says what happened: listing
//! `<prefix>/<cluster>/` answers with the highest ModifyIndex under it
//! (tombstones included), and a restore takes it back below what the
//! nodes saw after the snapshot. Consul's blocking-query docs say the
//! same: an index that goes backwards means a restore.
//!
//! The rule (docs/SAFETY-RULES-11-17.md, rule 15, "the cluster's index never goes back"):
//!
//! - Every node keeps `seen`, the highest such index it has read, raised
//!   by its own committed writes (their ModifyIndex) and by a pulse that
//!   lists the folder every [`PULSE`] (50 ms), so `seen` is at most one
//!   pulse behind other nodes' writes. It is saved to a local file
//!   (`consul.index_file`) so a restarted node compares against it too.
//! - Every counter write planned from a read lists the folder *after*
//!   that read and before its txn ([`ClusterIndex::probe`]): an index
//!   below `seen` means the read may have seen rolled-back state, and
//!   nothing is written. Every counter txn also checks that the cluster
//!   record does not exist (`check-not-exists` on `regression`), so a
//!   write planned from a cache is refused atomically once any node has
//!   detected.
//! - A detection is reported as the cluster record at once (create-only:
//!   the first stays), which stops every node's counter modes until
//!   `idgen admin skip-ahead` has moved every counter and deletes it.
//!
//! What remains (rule 15 states it with the measured window): a
//! write committed between the restore and every node's next pulse or
//! probe raises the index above `seen` again, so a restore is missed when
//! (a) no node saw any write made after the snapshot (then nothing after
//! the snapshot can repeat), or (b) every node that saw such a write is
//! down or partitioned until another node's write lands, or the writes it
//! saw came less than one pulse before the restore and another node's
//! write lands before that node's next pulse.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::regression::WrittenValues;
use super::StoreError;
use crate::consul::{Consistency, ConsulClient, KvEntry};

/// How often a node lists its cluster's folder to keep `seen` fresh and
/// to notice a restore by itself.
pub const PULSE: Duration = Duration::from_millis(50);

/// What the local index file holds.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    /// `<prefix>/<cluster>/`: a file of another cluster is not used.
    dir: String,
    /// The highest index seen there.
    seen: u64,
    /// The skip-ahead runs (`skip-ahead`'s `runs`) when it was saved: a
    /// later run moved every counter past everything, and starts a new
    /// baseline.
    #[serde(default)]
    runs: u64,
}

/// The highest Consul index seen under `<prefix>/<cluster>/` (see the
/// module doc). One per node, shared through
/// [`ClusterPaths`](super::kv_paths::ClusterPaths).
#[derive(Debug)]
pub struct ClusterIndex {
    dir: String,
    seen: AtomicU64,
    /// `consul.index_file`: where `seen` survives a restart.
    file: Option<PathBuf>,
    /// The value last written to `file`.
    saved: AtomicU64,
    /// The skip-ahead runs `seen` belongs to.
    runs: AtomicU64,
    /// [`WrittenValues::clears`] when `seen` was last rebased.
    clears: AtomicU64,
    /// The pulse task, stopped when the last handle is dropped.
    pulse: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// What one listing of the folder says.
#[derive(Debug, PartialEq, Eq)]
enum Reading {
    /// At or above `seen`, no cluster record.
    Current,
    /// The cluster record exists.
    Recorded,
    /// Below `seen`: rolled back.
    WentBack {
        /// What the listing said.
        index: u64,
        /// What this node had seen.
        seen: u64,
    },
}

impl ClusterIndex {
    /// The index of `<root>/`, kept in memory only.
    pub fn new(root: &str) -> Self {
        Self {
            dir: format!("{root}/"),
            seen: AtomicU64::new(0),
            file: None,
            saved: AtomicU64::new(0),
            runs: AtomicU64::new(0),
            clears: AtomicU64::new(0),
            pulse: Mutex::new(None),
        }
    }

    /// Also saved to `path` (read at [`start`](Self::start)).
    pub fn with_file(mut self, path: Option<PathBuf>) -> Self {
        self.file = path;
        self
    }

    /// The highest index seen so far.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::Acquire)
    }

    /// Raises `seen` to `index`.
    pub fn saw(&self, index: u64) {
        self.seen.fetch_max(index, Ordering::AcqRel);
    }

    /// A committed txn's results: the keys it wrote under the folder now
    /// stand at its ModifyIndex, so the folder's index is at least that.
    pub fn committed(&self, results: &[KvEntry]) {
        if let Some(top) = results
            .iter()
            .filter(|e| e.key.starts_with(&self.dir))
            .map(|e| e.modify_index)
            .max()
        {
            self.saw(top);
        }
    }

    /// Judges one listing: `index` and the names directly under the
    /// folder, against `floor`, what [`seen`](Self::seen) said *before the
    /// listing was sent*. A write of this node committed while the
    /// listing was out may be above what the listing saw, and is no
    /// rollback; everything seen before it was sent must be in it.
    fn judge(&self, floor: u64, index: u64, names: &[String]) -> Reading {
        let record = format!("{}regression", self.dir);
        if names.contains(&record) {
            return Reading::Recorded;
        }
        if index < floor {
            return Reading::WentBack { index, seen: floor };
        }
        self.saw(index);
        Reading::Current
    }

    /// Lists the folder (a consistent read) and refuses when its index is
    /// below `seen` (reported as the cluster record, written at once) or
    /// the cluster record exists. Call it after the reads a write was
    /// planned from and before the write is sent.
    pub async fn probe(
        &self,
        client: &ConsulClient,
        written: &WrittenValues,
    ) -> Result<(), StoreError> {
        let clears = written.clears();
        if self.clears.load(Ordering::Acquire) != clears {
            // A skip-ahead deleted the record: every counter is past
            // everything issued, and the index starts a new baseline
            // (after a Consul rebuilt empty it may stay below the old one).
            // The runs are read first and the three stored with no await
            // between: a probe dropped at the read (its request gone)
            // leaves the rebase to the next probe, not half-done (the
            // clears taken as handled with the old runs, which a restart
            // reads as a stale index and throws away).
            let runs = self.skip_ahead_runs(client).await;
            if self.clears.swap(clears, Ordering::AcqRel) != clears {
                self.seen.store(0, Ordering::Release);
                self.runs.store(runs, Ordering::Release);
            }
        }
        let floor = self.seen();
        let (names, index) = client
            .kv_keys(&self.dir, "/", Consistency::Consistent)
            .await
            .map_err(super::store_err)?;
        match self.judge(floor, index, &names) {
            Reading::Current => {
                if written.has_record() {
                    // Gone from the listing (a skip-ahead deleted it), or
                    // detected here and not written yet: read it again or
                    // write it, so nodes resume within a pulse.
                    written.refresh().await;
                }
                Ok(())
            }
            Reading::Recorded => {
                if !written.has_record() {
                    written.refresh().await;
                }
                written.cluster_gate("index", &self.dir)?;
                // Deleted between the listing and the read: a skip-ahead
                // ran; the next write probes again.
                Ok(())
            }
            Reading::WentBack { index, seen } => {
                let e = written.index_went_back(&self.dir, index, seen);
                // Written now, not at the next renewal: every node stops
                // as soon as it reads it.
                written.refresh().await;
                Err(e)
            }
        }
    }

    /// At start, before this node writes anything under the folder: loads
    /// the saved index, probes (a restart after a restore, or onto a
    /// Consul rebuilt empty, is caught here), and starts the pulse on the
    /// current runtime. Later calls only probe.
    pub async fn start(self: &Arc<Self>, client: &ConsulClient, written: &Arc<WrittenValues>) {
        let first = {
            let pulse = self.pulse.lock().unwrap_or_else(PoisonError::into_inner);
            pulse.is_none()
        };
        if first {
            self.load(self.skip_ahead_runs(client).await);
        }
        if let Err(e) = self.probe(client, written).await {
            tracing::warn!(error = %e, "cluster index check at start");
        }
        if first {
            self.save().await;
            let task = tokio::spawn(pulse(
                Arc::downgrade(self),
                client.clone(),
                Arc::clone(written),
            ));
            let mut slot = self.pulse.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(old) = slot.replace(task) {
                old.abort();
            }
        }
    }

    /// How many skip-ahead runs the cluster's `skip-ahead` record counts
    /// (0 when there is none or it cannot be read).
    async fn skip_ahead_runs(&self, client: &ConsulClient) -> u64 {
        let key = format!("{}skip-ahead", self.dir);
        match client.kv_get(&key, Consistency::Consistent).await {
            Ok((Some(e), _)) => {
                super::regression::SkipAheadRecord::decode(&key, &e.value).map_or(0, |r| r.runs)
            }
            _ => 0,
        }
    }

    /// Reads the saved index, if any, given the skip-ahead `runs` now (a
    /// file of another folder, saved before a later skip-ahead, or that
    /// cannot be read is reported and not used).
    fn load(&self, runs: u64) {
        self.runs.store(runs, Ordering::Release);
        let Some(path) = &self.file else {
            tracing::warn!(dir = %self.dir, "consul.index_file is not set: a node restarted after a Consul snapshot restore cannot tell by itself (running nodes still detect it)");
            return;
        };
        let text = match std::fs::read(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read consul.index_file; starting without the index it saved");
                return;
            }
        };
        match serde_json::from_slice::<Saved>(&text) {
            Ok(s) if s.dir == self.dir && s.runs < runs => {
                tracing::info!(path = %path.display(), "a skip-ahead ran since this node saved its cluster index: starting a new baseline");
            }
            Ok(s) if s.dir == self.dir => {
                self.saw(s.seen);
                self.saved.fetch_max(s.seen, Ordering::AcqRel);
            }
            Ok(s) => {
                tracing::warn!(path = %path.display(), file_dir = %s.dir, dir = %self.dir, "consul.index_file was saved for other keys; not used (it is rewritten for these)");
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "consul.index_file is not an index file; not used (it is rewritten)");
            }
        }
    }

    /// Writes `seen` to the file when it moved (a temporary file synced
    /// and renamed over it, so a crash leaves the old or the new one).
    async fn save(&self) {
        let Some(path) = self.file.clone() else {
            return;
        };
        let seen = self.seen();
        if seen <= self.saved.load(Ordering::Acquire) {
            return;
        }
        let body = Saved {
            dir: self.dir.clone(),
            seen,
            runs: self.runs.load(Ordering::Acquire),
        };
        let written = tokio::task::spawn_blocking(move || write_atomically(&path, &body)).await;
        match written {
            Ok(Ok(())) => {
                self.saved.fetch_max(seen, Ordering::AcqRel);
            }
            Ok(Err(e)) => {
                tracing::warn!(file = ?self.file, error = %e, "cannot save the cluster index to consul.index_file; a restart after a snapshot restore may not be detected by this node")
            }
            Err(e) => tracing::warn!(error = %e, "the index file writer failed"),
        }
    }
}

impl Drop for ClusterIndex {
    fn drop(&mut self) {
        let pulse = self.pulse.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(task) = pulse.take() {
            task.abort();
        }
    }
}

fn write_atomically(path: &std::path::Path, body: &Saved) -> std::io::Result<()> {
    use std::io::Write as _;
    let bytes = serde_json::to_vec(body).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&bytes)?;
    f.sync_data()?;
    std::fs::rename(&tmp, path)
}

/// Lists the folder every [`PULSE`] while the index lives: keeps `seen`
/// fresh, detects a restore with no write of this node's, and saves.
async fn pulse(index: Weak<ClusterIndex>, client: ConsulClient, written: Arc<WrittenValues>) {
    loop {
        tokio::time::sleep(PULSE).await;
        let Some(index) = index.upgrade() else {
            return;
        };
        match index.probe(&client, &written).await {
            // Refusals are logged and recorded where they are found.
            Ok(())
            | Err(StoreError::IndexWentBack { .. } | StoreError::ClusterRegressed { .. }) => {}
            Err(e) => tracing::debug!(error = %e, "cluster index pulse"),
        }
        index.save().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, modify_index: u64) -> KvEntry {
        KvEntry {
            key: key.into(),
            value: Vec::new(),
            create_index: 1,
            modify_index,
            lock_index: 0,
            flags: 0,
            session: None,
        }
    }

    #[test]
    fn an_index_below_the_highest_seen_is_a_rollback_and_writes_raise_it() {
        let i = ClusterIndex::new("idgen/test");
        let judge = |index, names: &[String]| i.judge(i.seen(), index, names);
        assert_eq!(judge(10, &[]), Reading::Current);
        assert_eq!(judge(10, &[]), Reading::Current, "equal is current");
        assert_eq!(judge(9, &[]), Reading::WentBack { index: 9, seen: 10 });
        i.committed(&[entry("idgen/test/strict/k", 40), entry("other/x", 99)]);
        assert_eq!(i.seen(), 40, "only writes under the folder count");
        assert_eq!(
            judge(39, &[]),
            Reading::WentBack {
                index: 39,
                seen: 40
            }
        );
        assert_eq!(judge(41, &[]), Reading::Current);
        assert_eq!(
            judge(41, &["idgen/test/regression".into()]),
            Reading::Recorded
        );
        assert_eq!(
            judge(41, &["idgen/test/regressions/".into()]),
            Reading::Current,
            "only the record itself"
        );
        // A write of this node committed while a listing was out.
        let floor = i.seen();
        i.committed(&[entry("idgen/test/strict/k", 50)]);
        assert_eq!(i.judge(floor, 45, &[]), Reading::Current);
        assert_eq!(i.seen(), 50, "not lowered");
    }

    #[tokio::test]
    async fn the_saved_index_survives_a_restart_and_another_clusters_file_is_not_used() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("index.json");
        let a = ClusterIndex::new("idgen/test").with_file(Some(path.clone()));
        a.saw(77);
        a.save().await;
        let b = ClusterIndex::new("idgen/test").with_file(Some(path.clone()));
        b.load(0);
        assert_eq!(b.seen(), 77);
        assert_eq!(
            b.judge(b.seen(), 70, &[]),
            Reading::WentBack {
                index: 70,
                seen: 77
            }
        );
        let other = ClusterIndex::new("idgen/prod").with_file(Some(path.clone()));
        other.load(0);
        assert_eq!(other.seen(), 0);
        std::fs::write(&path, b"garbage").unwrap_or_else(|e| panic!("{e}"));
        let c = ClusterIndex::new("idgen/test").with_file(Some(path));
        c.load(0);
        assert_eq!(c.seen(), 0, "an unreadable file is not used");
        a.saw(78);
        a.save().await;
        let d = ClusterIndex::new("idgen/test").with_file(Some(dir.path().join("index.json")));
        d.load(1);
        assert_eq!(d.seen(), 0, "saved before a skip-ahead ran");
    }
}
