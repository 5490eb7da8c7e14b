//! Where a cluster's records live in Consul KV ([`ClusterPaths`]: every
//! KV path of every mode, and what this node wrote under them), and what a
//! lock's value says about its holder ([`OwnerInfo`]). The stores that
//! read and write these keys are in each mode's folder
//! (`store/<mode>/consul.rs`); high-water marks in [`crate::store::hwm`].
//!
//! KV path layout under `<prefix>/<cluster>/` (docs/CONSUL.md has the full
//! table): `workers/<dc>/<worker>` (the lock, holding [`OwnerInfo`]) and
//! `hwm/<dc>/<worker>` (decimal Unix ms). The lock itself, and how a node
//! fences, is [`crate::cluster::worker_lock`].

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::cluster_index::ClusterIndex;
use super::regression::WrittenValues;
use super::{store_err, StoreError, WorkerKey};
use crate::consul::{Consistency, ConsulClient, TxnError, TxnOp};

/// Where a cluster's KV paths live: `<prefix>/<cluster>/...`, and what this
/// node wrote under them ([`WrittenValues`]: every store built from clones
/// of one `ClusterPaths` shares it).
#[derive(Debug, Clone)]
pub struct ClusterPaths {
    root: String,
    written: Arc<WrittenValues>,
    /// The highest Consul index this node saw under `root/`.
    index: Arc<ClusterIndex>,
    /// This node's own high-water mark key and the ModifyIndex of its last
    /// acknowledged write (or passing read) of it: every counter txn checks
    /// it (see [`mark_check`](Self::mark_check)).
    mark: Arc<Mutex<Option<(String, u64)>>>,
}

/// Two `ClusterPaths` are equal when they name the same keys.
impl PartialEq for ClusterPaths {
    fn eq(&self, other: &Self) -> bool {
        self.root == other.root
    }
}

impl Eq for ClusterPaths {}

impl ClusterPaths {
    /// Keys under `<prefix>/<cluster>/`. Both must be `[a-z0-9_-]+`
    /// (prefix may contain `/`), checked by config.
    pub fn new(prefix: &str, cluster: &str) -> Self {
        Self {
            root: format!("{}/{}", prefix.trim_matches('/'), cluster),
            written: Arc::default(),
            index: Arc::new(ClusterIndex::new(&format!(
                "{}/{}",
                prefix.trim_matches('/'),
                cluster
            ))),
            mark: Arc::default(),
        }
    }

    fn mark(&self) -> std::sync::MutexGuard<'_, Option<(String, u64)>> {
        self.mark
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that this node's own mark `key` stood at ModifyIndex `index`
    /// when it last wrote (or read without a regression) it.
    pub fn mark_at(&self, key: &str, index: u64) {
        *self.mark() = Some((key.to_owned(), index));
    }

    /// The op every Consul counter txn ends with: a `check-index` on this
    /// node's own mark at the ModifyIndex of its last acknowledged write.
    /// A snapshot restore puts the mark back to an older index, so a
    /// compare-and-set on a ModifyIndex cached before the snapshot (which
    /// the restore makes current again) fails instead of re-issuing what
    /// other nodes took after the snapshot. `None` before the node's first
    /// mark write (nothing to compare yet).
    pub fn mark_check(&self) -> Option<TxnOp> {
        self.mark().as_ref().map(|(key, index)| TxnOp::CheckIndex {
            key: key.clone(),
            index: *index,
        })
    }

    /// Whether a rolled-back txn of `ops` failed on its last op, the
    /// [`mark_check`](Self::mark_check) pushed by the caller.
    pub fn mark_failed(&self, ops: &[TxnOp], errors: &[TxnError]) -> bool {
        let last = ops.len().saturating_sub(1);
        matches!(ops.last(), Some(TxnOp::CheckIndex { key, .. }) if key.contains("/hwm/"))
            && errors.iter().any(|e| e.op_index == last)
    }

    /// After the mark check failed: re-reads the mark. A value below what
    /// this node wrote there is a rolled-back store
    /// ([`StoreError::Regressed`]); otherwise the mark's keeper wrote
    /// meanwhile, and the new index is remembered for the retry.
    pub async fn recheck_mark(&self, client: &ConsulClient) -> Result<(), StoreError> {
        let Some((key, _)) = self.mark().clone() else {
            return Ok(());
        };
        let floor = self.written.written(&key);
        let (entry, _) = client
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(store_err)?;
        let (value, index) = match entry {
            Some(e) => {
                let text = String::from_utf8_lossy(&e.value);
                let value = text.trim().parse::<u64>().map_err(|_| {
                    StoreError::Backend(format!(
                        "{key} holds {text:?}, not a decimal high-water mark; fix or delete it by hand"
                    ))
                })?;
                (value, e.modify_index)
            }
            None => (0, 0),
        };
        self.written.check("hwm", &key, floor, (0, value))?;
        let mut mark = self.mark();
        if mark.as_ref().is_some_and(|(k, _)| *k == key) {
            *mark = Some((key, index));
        }
        Ok(())
    }

    /// What this node wrote under these keys (see [`WrittenValues`]).
    pub fn written(&self) -> &WrittenValues {
        &self.written
    }

    /// The same keys, with the cluster's index saved to `file`
    /// (`consul.index_file`) so a restarted node still knows it.
    pub fn with_index_file(mut self, file: Option<std::path::PathBuf>) -> Self {
        self.index = Arc::new(ClusterIndex::new(&self.root).with_file(file));
        self
    }

    /// The highest Consul index this node saw under these keys (see
    /// [`ClusterIndex`]).
    pub fn index(&self) -> &Arc<ClusterIndex> {
        &self.index
    }

    /// At start, before this node writes anything here: compares the
    /// cluster's index with the one this node saved, and starts the pulse
    /// that keeps it fresh.
    pub async fn start_index(&self, client: &ConsulClient) {
        self.index.start(client, &self.written).await;
    }

    /// What every counter write does before its txn is sent: refused
    /// while the cluster record is known; when the write was planned from
    /// a read (`read`), the cluster's index is checked after that read
    /// ([`ClusterIndex::probe`]). Returns the ops the txn ends with: the
    /// record must not exist, then this node's mark check
    /// ([`mark_check`](Self::mark_check), last).
    pub async fn before_write(
        &self,
        client: &ConsulClient,
        key: &str,
        read: bool,
    ) -> Result<Vec<TxnOp>, StoreError> {
        self.written.cluster_gate("counter", key)?;
        if read {
            self.index.probe(client, &self.written).await?;
        }
        let mut ops = vec![TxnOp::CheckNotExists {
            key: self.regression(),
        }];
        ops.extend(self.mark_check());
        Ok(ops)
    }

    /// Whether a rolled-back txn failed on the `check-not-exists` of the
    /// cluster record that [`before_write`](Self::before_write) added.
    pub fn record_failed(&self, ops: &[TxnOp], errors: &[TxnError]) -> bool {
        let record = self.regression();
        errors.iter().any(|e| {
            matches!(ops.get(e.op_index), Some(TxnOp::CheckNotExists { key }) if *key == record)
        })
    }

    /// The refusal of a write whose txn found the cluster record: reads
    /// it (so this node refuses every counter from now on) and names it.
    pub async fn refused_by_record(&self, key: &str) -> StoreError {
        self.written.refresh().await;
        match self.written.cluster_gate("counter", key) {
            Err(e) => e,
            Ok(()) => StoreError::Contended(format!(
                "{key}: not written: the cluster regression record {} existed when this write was sent (a snapshot restore was detected) and is gone now (a skip-ahead ran); retry",
                self.regression()
            )),
        }
    }

    /// The record of the last `idgen admin skip-ahead`, which also floors
    /// formatted-mode counters starting a period up to it.
    pub fn skip_ahead(&self) -> String {
        format!("{}/skip-ahead", self.root)
    }

    /// The cluster record of a detected regression
    /// ([`RegressionRecord`](super::regression::RegressionRecord)).
    pub fn regression(&self) -> String {
        format!("{}/regression", self.root)
    }

    /// The folder of every node's status record (with trailing `/`):
    /// `nodes/<instance>` (`crate::cluster::status`).
    pub fn status_dir(&self) -> String {
        format!("{}/nodes/", self.root)
    }

    /// Everything of the cluster (with trailing `/`).
    pub fn root_dir(&self) -> String {
        format!("{}/", self.root)
    }

    /// The folder of one datacenter's worker locks (with trailing `/`).
    pub fn workers_dir(&self, datacenter: u64) -> String {
        format!("{}/workers/{datacenter}/", self.root)
    }

    /// The lock key of one worker id.
    pub fn worker(&self, key: WorkerKey) -> String {
        format!("{}/workers/{}/{}", self.root, key.datacenter, key.worker)
    }

    /// The record of a segment tag.
    pub fn segment(&self, tag: &str) -> String {
        format!("{}/segments/{tag}", self.root)
    }

    /// A formatted-mode counter (`<format>/<node|cluster>/<scope>`).
    pub fn format_counter(&self, path: &str) -> String {
        format!("{}/formats/{path}", self.root)
    }

    /// A stored format definition.
    pub fn format_def(&self, name: &str) -> String {
        format!("{}/format-defs/{name}", self.root)
    }

    /// The folder of every stored format definition.
    pub fn format_defs_dir(&self) -> String {
        format!("{}/format-defs/", self.root)
    }

    /// The counter of a strict key (`<namespace>/<key>`).
    pub fn strict(&self, key: &str) -> String {
        format!("{}/strict/{key}", self.root)
    }

    /// The tombstone of a deleted strict key (its last value).
    pub fn strict_tombstone(&self, key: &str) -> String {
        format!("{}/strict-deleted/{key}", self.root)
    }

    /// The settings (step) of a strict namespace.
    pub fn strict_namespace(&self, namespace: &str) -> String {
        format!("{}/strict-namespaces/{namespace}", self.root)
    }

    /// The folder of strict namespace settings (with trailing `/`).
    pub fn strict_namespaces_dir(&self) -> String {
        format!("{}/strict-namespaces/", self.root)
    }

    /// The folder of one zone's lease tokens (with trailing `/`).
    pub fn lease_dir(&self, zone: u64) -> String {
        format!("{}/lease/{zone}/", self.root)
    }

    /// A lease zone's recorded setting (plain or hidden).
    pub fn lease_zone(&self, zone: u64) -> String {
        format!("{}/lease-zones/{zone}", self.root)
    }

    /// The lock and counter of one lease token.
    pub fn lease(&self, zone: u64, token: u64) -> String {
        format!("{}/lease/{zone}/{token}", self.root)
    }

    /// The folder of every formatted-mode token space (with trailing `/`).
    pub fn format_tokens_dir(&self) -> String {
        format!("{}/format-tokens/", self.root)
    }

    /// The folder of one formatted-mode token space (`digits-2`,
    /// `uniq64`...), with trailing `/`: each key is one token's lock.
    pub fn format_token_dir(&self, space: &str) -> String {
        format!("{}/format-tokens/{space}/", self.root)
    }

    /// The fingerprint of the master key the hide keys are sealed with
    /// (`store::hide_keys`, `fingerprint.rs`); beside `hide-keys/`, not in
    /// it, so listing the keys never reads it as one.
    pub fn hide_master_fingerprint(&self) -> String {
        format!("{}/hide-master-fingerprint", self.root)
    }

    /// The claim of datacenter id `id`, kept in the primary Consul
    /// datacenter ([`super::datacenter_claim`]).
    pub fn datacenter_claim(&self, id: u64) -> String {
        format!("{}/datacenters/{id}", self.root)
    }

    /// The copy of this datacenter's confirmed claim of datacenter id
    /// `id`, kept in the owner's own Consul datacenter (rule 42); outside
    /// `datacenters/` so a listing of claims never reads it as one.
    pub fn datacenter_confirmed(&self, id: u64) -> String {
        format!("{}/datacenter-confirmed/{id}", self.root)
    }

    /// The folder of every datacenter claim (with trailing `/`).
    pub fn datacenter_claims_dir(&self) -> String {
        format!("{}/datacenters/", self.root)
    }

    /// The cluster name: the last part of `<prefix>/<cluster>`.
    pub fn cluster_name(&self) -> &str {
        self.root.rsplit('/').next().unwrap_or(&self.root)
    }

    /// The cluster's layout record.
    pub fn layout(&self) -> String {
        format!("{}/layout", self.root)
    }

    /// The copy of the primary's layout record a datacenter that is not
    /// the primary keeps in its own KV (rule 45).
    pub fn layout_confirmed(&self) -> String {
        format!("{}/layout-confirmed", self.root)
    }

    /// The folder of every high-water mark (with trailing `/`).
    pub fn hwm_dir(&self) -> String {
        format!("{}/hwm/", self.root)
    }

    /// The high-water mark key of one worker id.
    pub fn hwm(&self, key: WorkerKey) -> String {
        format!("{}/hwm/{}/{}", self.root, key.datacenter, key.worker)
    }
}

/// What a worker lock's value says about its holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerInfo {
    /// Stable instance id of the node (survives restarts).
    pub instance: String,
    /// The node's gRPC address.
    pub address: String,
    /// When the node claimed the id, Unix ms.
    pub since_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_documented_layout() {
        let k = ClusterPaths::new("idgen/", "prod");
        let w = WorkerKey {
            datacenter: 2,
            worker: 7,
        };
        assert_eq!(k.worker(w), "idgen/prod/workers/2/7");
        assert_eq!(k.hwm(w), "idgen/prod/hwm/2/7");
        assert_eq!(k.workers_dir(2), "idgen/prod/workers/2/");
    }
}
