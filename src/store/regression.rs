//! What this node wrote under each Consul key, so that a read below it
//! stops issuing instead of repeating IDs.
//!
//! Restoring a Consul snapshot (`consul snapshot restore`) puts every key
//! back as it was when the snapshot was taken: segment `max_id`s, strict,
//! lease-token and format counters and high-water marks go back, and
//! nothing in Consul says so. A node that keeps the highest value it wrote
//! to each key notices on the next read it does anyway (the consistent
//! read before a compare-and-set): a stored value below its own write is a
//! rolled-back store. It then refuses to issue from that key
//! ([`StoreError::Regressed`], UNAVAILABLE, counted in
//! `idgen_store_regressions_total{kind}`) until `idgen admin skip-ahead`
//! has moved the key above what it wrote; the next read after that passes
//! and the node issues again, without a restart.
//!
//! Values, not ModifyIndexes, are compared: a restore brings back the
//! indexes a key had when the snapshot was taken, so an index this node
//! cached before the snapshot can match again.
//!
//! Memory is bounded by the keys this node wrote (its segment tags, strict
//! keys, tokens, format counters and its own mark).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::consul::{Consistency, ConsulClient, KvWrite};
use crate::metrics as m;

/// The cluster record `<prefix>/<cluster>/regression`: the first
/// regression a node detected. While it exists every node refuses its
/// Consul counter modes, a node restarted since the restore included
/// (it remembers no write of its own to compare with); `idgen admin
/// skip-ahead` deletes it after moving every counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegressionRecord {
    /// The node (worker `dc/worker`) that detected it.
    pub node: String,
    /// The Consul key it read.
    pub key: String,
    /// What the store held.
    pub stored: String,
    /// What that node had written there.
    pub wrote: String,
    /// When it was detected, Unix ms.
    pub at_ms: u64,
}

/// The record of the last skip-ahead (`<prefix>/<cluster>/skip-ahead`).
/// It lives beside the regression record it clears: the regression check
/// reads it (a run newer than a detection covers it), and the run in
/// [`super::skip_ahead`] writes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkipAheadRecord {
    /// When the run started, Unix ms.
    pub at_ms: u64,
    /// The run's margin.
    pub margin: u64,
    /// Formatted counters starting a period that begins at or before this
    /// instant (Unix ms) start `floor` above their minimum.
    pub until_ms: i64,
    /// The sum of every run's margin.
    pub floor: u64,
    /// How many runs so far.
    pub runs: u64,
}

impl SkipAheadRecord {
    /// Reads a stored record; the error names `key`.
    pub fn decode(key: &str, bytes: &[u8]) -> Result<Self, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| {
            StoreError::Backend(format!(
                "{key} is unreadable ({e}); run `idgen admin skip-ahead` again to rewrite it"
            ))
        })
    }
}

/// Where this node reports a regression and reads the cluster's record.
#[derive(Debug)]
struct Reporter {
    client: ConsulClient,
    key: String,
    /// The instance name until a worker id is claimed, then `dc/worker`.
    node: Mutex<String>,
}

/// A stored level, compared as a pair: formatted-mode counters are (period
/// start, last value); every other counter is (0, value).
pub type Level = (i64, u64);

/// The highest level this node wrote to each key (see the module doc).
/// One per node, shared by every Consul store through
/// [`ClusterPaths`](super::kv_paths::ClusterPaths).
#[derive(Debug, Default)]
pub struct WrittenValues {
    values: Mutex<HashMap<String, Level>>,
    reporter: OnceLock<Reporter>,
    /// The cluster record as last read (`None`: absent).
    cluster: Mutex<Option<RegressionRecord>>,
    /// A record this node could not write yet (retried at each refresh).
    pending: Mutex<Option<RegressionRecord>>,
    /// How many times the record was read gone after it was there (a
    /// skip-ahead ran): the cluster's index starts a new baseline then
    /// ([`ClusterIndex`](super::cluster_index::ClusterIndex)).
    clears: std::sync::atomic::AtomicU64,
}

fn shown(kind: &str, level: Level) -> String {
    if kind == "format" {
        format!("period {} last {}", level.0, level.1)
    } else {
        level.1.to_string()
    }
}

impl WrittenValues {
    fn values(&self) -> std::sync::MutexGuard<'_, HashMap<String, Level>> {
        self.values.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that the store acknowledged `level` at `key`.
    pub fn wrote(&self, key: &str, level: Level) {
        let mut values = self.values();
        match values.get_mut(key) {
            Some(v) => *v = (*v).max(level),
            None => {
                values.insert(key.to_owned(), level);
            }
        }
    }

    /// Records that the store acknowledged `level` at `key`, even below
    /// what was recorded before: for the node's own high-water mark, which
    /// only this node writes and which a clean stop lowers on purpose to
    /// the highest time it used (a later read of that final mark is no
    /// rollback).
    pub fn wrote_exactly(&self, key: &str, level: Level) {
        self.values().insert(key.to_owned(), level);
    }

    /// The highest level this node wrote to `key`, if any.
    pub fn written(&self, key: &str) -> Option<Level> {
        self.values().get(key).copied()
    }

    /// What this node wrote to every key under `prefix`, taken before a
    /// listing (see [`check`](Self::check)).
    pub fn floors(&self, prefix: &str) -> HashMap<String, Level> {
        self.values()
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Reports regressions to, and reads the cluster record from, `key`
    /// (the first call wins); `node` names this node in the record (a
    /// later call renames it: the instance at start, then its worker id).
    pub fn attach(&self, client: &ConsulClient, key: String, node: String) {
        if let Some(r) = self.reporter.get() {
            *r.node.lock().unwrap_or_else(PoisonError::into_inner) = node;
            return;
        }
        let _ = self.reporter.set(Reporter {
            client: client.clone(),
            key,
            node: Mutex::new(node),
        });
    }

    fn cluster(&self) -> std::sync::MutexGuard<'_, Option<RegressionRecord>> {
        self.cluster.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Option<RegressionRecord>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the cluster record as read (tests and [`refresh`](Self::refresh)).
    pub fn set_cluster(&self, record: Option<RegressionRecord>) {
        *self.cluster() = record;
    }

    /// Writes a pending record (create-only: the first detection stays),
    /// then reads the cluster record; called at start and with each mark
    /// renewal. A failed read keeps what was last read.
    pub async fn refresh(&self) {
        let Some(r) = self.reporter.get() else {
            return;
        };
        let mut pending = self.pending().clone();
        if let Some(p) = &pending {
            if self.covered_by_skip_ahead(r, p).await {
                *self.pending() = None;
                pending = None;
            }
        }
        if let Some(record) = pending {
            let bytes = serde_json::to_vec(&record).unwrap_or_default();
            if r.client
                .kv_put(&r.key, &bytes, KvWrite::Cas(0))
                .await
                .is_ok()
            {
                *self.pending() = None;
            }
        }
        match r.client.kv_get(&r.key, Consistency::Consistent).await {
            Ok((None, _)) => {
                let was = self.cluster().take().is_some();
                if was && self.pending().is_none() {
                    self.clears
                        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                }
            }
            Ok((Some(e), _)) => {
                let record =
                    serde_json::from_slice(&e.value).unwrap_or_else(|_| RegressionRecord {
                        node: "?".into(),
                        key: format!("(unreadable: {})", String::from_utf8_lossy(&e.value)),
                        stored: "?".into(),
                        wrote: "?".into(),
                        at_ms: 0,
                    });
                self.set_cluster(Some(record));
            }
            Err(e) => {
                tracing::warn!(key = %r.key, error = %e, "cannot read the cluster regression record; keeping the last one read")
            }
        }
    }

    /// Whether a skip-ahead started after `pending` was detected: it moves
    /// every counter past what the detection saw, so the record is not
    /// written (written after that run deleted the record, it would stop
    /// the cluster until another run). The skip-ahead record sits beside
    /// the regression record (`<root>/skip-ahead`).
    async fn covered_by_skip_ahead(&self, r: &Reporter, pending: &RegressionRecord) -> bool {
        let Some(root) = r.key.strip_suffix("regression") else {
            return false;
        };
        let key = format!("{root}skip-ahead");
        match r.client.kv_get(&key, Consistency::Consistent).await {
            Ok((Some(e), _)) => {
                SkipAheadRecord::decode(&key, &e.value).is_ok_and(|run| run.at_ms >= pending.at_ms)
            }
            _ => false,
        }
    }

    /// Queues the record of a regression this node detected.
    fn report(&self, key: &str, stored: &str, wrote: &str) {
        let Some(r) = self.reporter.get() else {
            return;
        };
        let record = RegressionRecord {
            node: r
                .node
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            key: key.to_owned(),
            stored: stored.to_owned(),
            wrote: wrote.to_owned(),
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        // This node refuses at once; the record is written by the next
        // refresh (the next mark renewal, about one renew interval). A
        // record this node already knows of stands for this detection too:
        // queued again, it could be written after a skip-ahead running now
        // deleted the known one, and stop the cluster until another run.
        // If the known one is already gone, this node still refuses until
        // its next read says so, and then detects again.
        let mut cluster = self.cluster();
        if cluster.is_some() {
            return;
        }
        *cluster = Some(record.clone());
        drop(cluster);
        let mut pending = self.pending();
        if pending.is_none() {
            *pending = Some(record);
        }
    }

    /// How many times the cluster record was read gone after this node
    /// knew it (each a skip-ahead's end).
    pub fn clears(&self) -> u64 {
        self.clears.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether the cluster record is known to exist (as last read, or
    /// detected by this node).
    pub fn has_record(&self) -> bool {
        self.cluster().is_some()
    }

    /// Refuses this node's Consul counters because the cluster's index
    /// went below `seen`, the highest this node had seen under `dir`: the
    /// state was rolled back (a snapshot restore). Counted, logged and
    /// queued as the cluster record like a counter read below a write;
    /// the caller writes it at once ([`refresh`](Self::refresh)).
    pub fn index_went_back(&self, dir: &str, index: u64, seen: u64) -> StoreError {
        metrics::counter!(m::STORE_REGRESSIONS, "kind" => "index").increment(1);
        tracing::error!(dir, index, seen, "the Consul index of the cluster's keys went below the highest this node saw: the Consul state was rolled back (a snapshot restore?); refusing every counter mode");
        self.report(dir, &format!("index {index}"), &format!("index {seen}"));
        StoreError::IndexWentBack {
            dir: dir.to_owned(),
            index,
            seen,
        }
    }

    /// Refuses every read of a counter mode while the cluster record
    /// exists (the `hwm` kind keeps its own rule): every Consul counter
    /// write checks it before it is sent, whether it was planned from a
    /// read or from what this node cached.
    pub fn cluster_gate(&self, kind: &'static str, key: &str) -> Result<(), StoreError> {
        if kind == "hwm" {
            return Ok(());
        }
        match self.cluster().as_ref() {
            None => Ok(()),
            Some(r) => Err(StoreError::ClusterRegressed {
                key: key.to_owned(),
                record: self
                    .reporter
                    .get()
                    .map_or_else(|| "regression".to_owned(), |x| x.key.clone()),
                node: r.node.clone(),
                found: r.key.clone(),
            }),
        }
    }

    /// Refuses a read of `key` (a `kind` counter) that found `stored`
    /// below `floor`, what [`written`](Self::written) said *before the read
    /// was sent*: a consistent read sent after a write was acknowledged
    /// sees it, while a write acknowledged during the read (a concurrent
    /// call of this node) may not be in it. A key absent from the store
    /// reads as level `(i64::MIN, 0)`.
    pub fn check(
        &self,
        kind: &'static str,
        key: &str,
        floor: Option<Level>,
        stored: Level,
    ) -> Result<(), StoreError> {
        self.cluster_gate(kind, key)?;
        let Some(wrote) = floor else {
            return Ok(());
        };
        if stored >= wrote {
            return Ok(());
        }
        metrics::counter!(m::STORE_REGRESSIONS, "kind" => kind).increment(1);
        let (stored, wrote) = (shown(kind, stored), shown(kind, wrote));
        tracing::error!(kind, key, %stored, %wrote, "Consul holds a counter below what this node wrote: the store was rolled back; refusing to issue from it");
        self.report(key, &stored, &wrote);
        Err(StoreError::Regressed {
            kind,
            key: key.to_owned(),
            stored,
            wrote,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_below_the_highest_write_is_refused_until_the_store_is_above_it() {
        let w = WrittenValues::default();
        let check = |kind, key: &str, stored| w.check(kind, key, w.written(key), stored);
        assert!(check("strict", "k", (0, 0)).is_ok(), "never written");
        w.wrote("k", (0, 50));
        w.wrote("k", (0, 40));
        assert_eq!(w.written("k"), Some((0, 50)), "the highest write counts");
        assert!(check("strict", "k", (0, 50)).is_ok());
        let err = check("strict", "k", (0, 30)).err().map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(
            err.contains("k") && err.contains("30") && err.contains("50"),
            "{err}"
        );
        assert!(err.contains("idgen admin skip-ahead"), "{err}");
        assert!(check("strict", "k", (0, 80)).is_ok(), "skipped ahead");
        // A later period is above any value of an earlier one.
        w.wrote("f", (100, 7));
        assert!(check("format", "f", (50, 1_000)).is_err());
        assert!(check("format", "f", (200, 0)).is_ok());
        assert!(
            check("format", "f", (i64::MIN, 0)).is_err(),
            "a missing key"
        );
        assert_eq!(w.floors("f").len(), 1);
    }

    /// A detection made while this node knows of a record queues none:
    /// queued, it would be written after a skip-ahead running meanwhile
    /// deleted the known one (the run moves the key detected only later
    /// in its pass), and stop the cluster until another run.
    #[test]
    fn a_detection_while_a_record_is_known_queues_no_second_record() {
        let w = WrittenValues::default();
        let client = crate::consul::ConsulClient::new(crate::consul::ConsulConfig {
            address: "http://127.0.0.1:9".into(),
            ..crate::consul::ConsulConfig::default()
        })
        .expect("a client; nothing is sent");
        w.attach(&client, "idgen/test/regression".into(), "0/1".into());
        w.wrote("idgen/test/hwm/0/1", (0, 500));
        let known = RegressionRecord {
            node: "0/0".into(),
            key: "idgen/test/".into(),
            stored: "index 3".into(),
            wrote: "index 9".into(),
            at_ms: 1,
        };
        w.set_cluster(Some(known.clone()));
        let floor = w.written("idgen/test/hwm/0/1");
        assert!(w
            .check("hwm", "idgen/test/hwm/0/1", floor, (0, 400))
            .is_err());
        assert!(w.pending().is_none(), "a second record was queued");
        assert_eq!(w.cluster().as_ref(), Some(&known), "the known one stays");
        // With none known, the same detection is queued and refuses here.
        w.set_cluster(None);
        assert!(w
            .check("hwm", "idgen/test/hwm/0/1", floor, (0, 400))
            .is_err());
        let queued = w.pending().clone().map(|r| r.key);
        assert_eq!(queued.as_deref(), Some("idgen/test/hwm/0/1"));
        assert!(w.has_record());
    }

    #[test]
    fn the_cluster_record_refuses_every_counter_read_but_the_mark() {
        let w = WrittenValues::default();
        w.set_cluster(Some(RegressionRecord {
            node: "0/1".into(),
            key: "idgen/test/strict/k".into(),
            stored: "3".into(),
            wrote: "9".into(),
            at_ms: 1,
        }));
        for kind in ["segment", "strict", "lease", "format"] {
            let err = w.check(kind, "idgen/test/x", None, (0, 100)).err();
            let text = err.map(|e| e.to_string()).unwrap_or_default();
            assert!(
                text.contains("idgen/test/x")
                    && text.contains("idgen/test/strict/k")
                    && text.contains("0/1")
                    && text.contains("idgen admin skip-ahead --margin"),
                "{kind}: {text:?}"
            );
        }
        assert!(w.check("hwm", "idgen/test/hwm/0/1", None, (0, 1)).is_ok());
        w.set_cluster(None);
        assert!(w.check("segment", "idgen/test/x", None, (0, 100)).is_ok());
    }

    #[test]
    fn a_write_acknowledged_during_a_read_is_not_held_against_it() {
        let w = WrittenValues::default();
        w.wrote("k", (0, 10));
        let floor = w.written("k");
        // Another call of this node commits 20 while the read is out; the
        // read saw 10, which was above everything written before it.
        w.wrote("k", (0, 20));
        assert!(w.check("strict", "k", floor, (0, 10)).is_ok());
        assert!(w.check("strict", "k", floor, (0, 9)).is_err());
    }
}
