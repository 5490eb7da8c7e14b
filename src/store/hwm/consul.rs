//! High-water marks in Consul KV (`hwm/<dc>/<worker>`, decimal Unix ms),
//! written only while this node holds the worker lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;

use super::HwmStore;
use crate::consul::{Consistency, ConsulClient, TxnOp, TxnOutcome};
use crate::store::cluster_layout::{
    confirm_primary_layout, primary_fence_reason, read_layout, LayoutGuard, RecordedLayout,
};
use crate::store::datacenter_claim::{DatacenterClaimError, DatacenterRegistry};
use crate::store::kv_paths::ClusterPaths;
use crate::store::regression::Level;
use crate::store::{store_err, StoreError, WorkerKey};

/// High-water marks in Consul KV, written only while the worker lock is
/// held by `session` (a txn with `check-session`).
pub struct ConsulHwmStore {
    client: ConsulClient,
    keys: ClusterPaths,
    session: String,
    /// The ModifyIndex each mark had when last read or written (0: absent);
    /// forgotten whenever an outcome is unknown, so the next write re-reads.
    known: Mutex<HashMap<WorkerKey, u64>>,
    /// The cluster layout this node checked at start: every write checks
    /// the record is unchanged, and no mark is read below its floor.
    layout: Option<LayoutGuard>,
    /// This node's datacenter-id claim, read again before every mark write.
    datacenter: Option<DatacenterRegistry>,
    /// This node's layout, compared before every mark write with the
    /// primary's record when the primary is another Consul datacenter.
    primary_layout: Option<RecordedLayout>,
    /// The generation of the primary's record this store last copied into
    /// this datacenter's KV (`layout-confirmed`, rule 45).
    copied_generation: AtomicU64,
}

impl ConsulHwmStore {
    /// A store writing through the worker lock's `session`.
    pub fn new(client: ConsulClient, keys: ClusterPaths, session: &str) -> Self {
        Self {
            client,
            keys,
            session: session.to_owned(),
            known: Mutex::new(HashMap::new()),
            layout: None,
            datacenter: None,
            primary_layout: None,
            copied_generation: AtomicU64::new(0),
        }
    }

    /// Checks the datacenter-id claim in the primary before every mark
    /// write (rule 39): once the id is released or owned by another Consul
    /// datacenter the write is refused and the node fences itself.
    pub fn with_datacenter(mut self, registry: DatacenterRegistry) -> Self {
        self.datacenter = Some(registry);
        self
    }

    /// The claim check of [`with_datacenter`](Self::with_datacenter).
    async fn check_datacenter(&self) -> Result<(), StoreError> {
        let Some(registry) = &self.datacenter else {
            return Ok(());
        };
        match registry.check().await {
            Ok(_) => Ok(()),
            Err(
                e @ (DatacenterClaimError::PrimaryUnreachable { .. }
                | DatacenterClaimError::FirstClaimNeedsPrimary { .. }),
            ) => Err(StoreError::Backend(format!(
                "high-water mark not written: {e}"
            ))),
            Err(e) => Err(StoreError::LockLost(format!(
                "high-water mark not written: {e}"
            ))),
        }
    }

    /// Compares the primary Consul datacenter's layout record with `mine`
    /// before every mark write, when the primary is another datacenter
    /// (rule 45): a change made there (or in another datacenter, which
    /// writes the primary's record first) fences this node at its next
    /// mark renewal, as this datacenter's own record change does through
    /// the `check-index` of [`with_layout`](Self::with_layout). Needs
    /// [`with_datacenter`](Self::with_datacenter).
    pub fn with_primary_layout(mut self, mine: RecordedLayout) -> Self {
        self.primary_layout = Some(mine);
        self
    }

    /// The comparison of [`with_primary_layout`](Self::with_primary_layout),
    /// right after the claim check. A primary that did not answer that
    /// check, or does not answer this read, fences nothing (rule 42): this
    /// datacenter's own record is still checked by the write itself.
    async fn check_primary_layout(&self) -> Result<(), StoreError> {
        let (Some(mine), Some(registry)) = (&self.primary_layout, &self.datacenter) else {
            return Ok(());
        };
        if !registry.is_remote() || !registry.primary_answered() {
            return Ok(());
        }
        let record = match read_layout(registry.primary_client(), &self.keys).await {
            Ok(read) => read.map(|(record, _)| record),
            Err(e) => {
                tracing::warn!(primary = %registry.primary(), error = %e, "the primary's layout record could not be read at this mark renewal; compared again at the next one");
                return Ok(());
            }
        };
        if let Some(r) = record
            .as_ref()
            .filter(|r| r.generation > self.copied_generation.load(Ordering::Relaxed))
        {
            if confirm_primary_layout(&self.client, &self.keys, registry.primary(), r).await {
                self.copied_generation
                    .store(r.generation, Ordering::Relaxed);
            }
        }
        match primary_fence_reason(record.as_ref(), mine, registry.primary()) {
            None => Ok(()),
            Some(why) => Err(StoreError::LockLost(format!(
                "high-water mark not written: {why}"
            ))),
        }
    }

    /// Ties every mark write to the layout record as `guard` saw it: once
    /// the record changes (an operator changed the cluster's layout) the
    /// next write fails and the node fences itself. Marks read below the
    /// layout's floor are raised to it, so a node on a new layout starts
    /// above every ID of the old one.
    pub fn with_layout(mut self, guard: LayoutGuard) -> Self {
        self.layout = Some(guard);
        self
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<WorkerKey, u64>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads the cluster regression record (at start, then with every
    /// mark renewal), so every counter mode of this node refuses while it
    /// exists (see [`RegressionRecord`](super::regression::RegressionRecord)).
    async fn watch_regression(&self, key: WorkerKey) {
        let written = self.keys.written();
        written.attach(&self.client, self.keys.regression(), key.to_string());
        written.refresh().await;
    }

    /// Reads the mark and remembers (and returns) its ModifyIndex.
    async fn read(&self, key: WorkerKey) -> Result<(Option<u64>, u64), StoreError> {
        let hwm_key = self.keys.hwm(key);
        let floor = self.keys.written().written(&hwm_key);
        let (entry, _) = self
            .client
            .kv_get(&hwm_key, Consistency::Consistent)
            .await
            .map_err(store_err)?;
        let Some(entry) = entry else {
            let own = self.own_mark(&hwm_key, floor, (i64::MIN, 0))?;
            self.known().insert(key, 0);
            return Ok((own, 0));
        };
        let text = String::from_utf8_lossy(&entry.value);
        let value = text.trim().parse().map_err(|_| {
            StoreError::Backend(format!(
                "{} holds {text:?}, not a decimal high-water mark; fix or delete it by hand",
                entry.key
            ))
        })?;
        let value = self
            .own_mark(&hwm_key, floor, (0, value))?
            .map_or(value, |own| own.max(value));
        self.known().insert(key, entry.modify_index);
        self.keys.mark_at(&hwm_key, entry.modify_index);
        Ok((Some(value), entry.modify_index))
    }

    /// Checks a mark read as `stored` against `floor`, what this node
    /// wrote there. Below it, the store was rolled back (a snapshot
    /// restore): that is reported once, as every regression is (the
    /// cluster record then stops the counter modes until a skip-ahead),
    /// and the node's own write is the mark from then on. Only this node
    /// writes this key and every ID it issued is below what it wrote, so
    /// starting above that is exactly as safe as before the restore; the
    /// next write puts the mark back above it. Refusing instead would keep
    /// snowflake down, and would report again at every retry, rewriting
    /// the record a skip-ahead running meanwhile deletes.
    fn own_mark(
        &self,
        hwm_key: &str,
        floor: Option<Level>,
        stored: Level,
    ) -> Result<Option<u64>, StoreError> {
        match self.keys.written().check("hwm", hwm_key, floor, stored) {
            Ok(()) => Ok(None),
            Err(StoreError::Regressed { .. }) => Ok(floor.map(|(_, wrote)| wrote)),
            Err(e) => Err(e),
        }
    }
}
#[async_trait]
impl HwmStore for ConsulHwmStore {
    fn backend(&self) -> &'static str {
        "consul"
    }

    async fn load_hwm(&self, key: WorkerKey) -> Result<Option<u64>, StoreError> {
        self.watch_regression(key).await;
        let stored = self.read(key).await?.0;
        let floor = self
            .layout
            .as_ref()
            .filter(|g| g.floor_ms > 0)
            .map(|g| g.floor_ms - 1);
        // Rule 44: a datacenter id released by another Consul datacenter
        // carries that owner's highest mark; its marks stay in the old
        // owner's KV, so without this floor only the clock would keep this
        // node's IDs above the old owner's.
        let released_floor = self
            .datacenter
            .as_ref()
            .map(DatacenterRegistry::floor_ms)
            .filter(|f| *f > 0);
        Ok(stored.max(floor).max(released_floor))
    }

    async fn store_hwm(&self, key: WorkerKey, hwm_ms: u64) -> Result<(), StoreError> {
        self.watch_regression(key).await;
        self.check_datacenter().await?;
        self.check_primary_layout().await?;
        let known = self.known().get(&key).copied();
        let index = match known {
            Some(i) => i,
            None => self.read(key).await?.1,
        };
        let hwm_key = self.keys.hwm(key);
        let mut ops = Vec::with_capacity(3);
        if let Some(g) = &self.layout {
            ops.push(TxnOp::CheckIndex {
                key: g.key.clone(),
                index: g.index,
            });
        }
        ops.extend([
            TxnOp::CheckSession {
                key: self.keys.worker(key),
                session: self.session.clone(),
            },
            TxnOp::Cas {
                key: hwm_key.clone(),
                value: hwm_ms.to_string().into_bytes(),
                index,
            },
        ]);
        let outcome = self.client.txn(&ops).await.map_err(|e| {
            // Applied or not, we cannot tell: re-read before the next write.
            self.known().remove(&key);
            store_err(e)
        })?;
        match outcome {
            TxnOutcome::Committed(results) => {
                // Exactly, not the highest: a clean stop writes its final
                // mark below the reserve it wrote before.
                self.keys.written().wrote_exactly(&hwm_key, (0, hwm_ms));
                match results.iter().find(|e| e.key == hwm_key) {
                    Some(e) => {
                        self.keys.mark_at(&hwm_key, e.modify_index);
                        self.known().insert(key, e.modify_index)
                    }
                    None => self.known().remove(&key),
                };
                Ok(())
            }
            TxnOutcome::RolledBack(errors) => {
                self.known().remove(&key);
                if let Some(g) = self
                    .layout
                    .as_ref()
                    .filter(|_| errors.iter().any(|e| e.op_index == 0))
                {
                    return Err(StoreError::LockLost(format!(
                        "high-water mark not written: the cluster layout record {} changed since this node checked it (generation {}); an operator changed the layout, so this node stops issuing for good: restart it with the cluster's new [layout] (see `idgen admin layout get`)",
                        g.key, g.generation
                    )));
                }
                Err(StoreError::LockLost(format!(
                    "high-water mark not written: this node no longer holds worker {key}, or the mark changed under it ({})",
                    errors
                        .iter()
                        .map(|e| e.what.as_str())
                        .collect::<Vec<_>>()
                        .join("; ")
                )))
            }
        }
    }
}
