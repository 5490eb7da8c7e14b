//! Format counters in Consul KV:
//! `<prefix>/<cluster>/formats/<format>/<node|cluster>/<scope>` holds the
//! record as JSON, written by a txn `cas` on the ModifyIndex of a
//! consistent read.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use super::{decode, encode, CounterKey, FormatStore, Plan, Planned, RestoreFloor, TokenLock};
use crate::consul::{Consistency, ConsulClient, TxnOp, TxnOutcome};
use crate::id::format::CounterRecord;
use crate::store::keys::ClusterKeys;
use crate::store::StoreError;

/// all (jittered backoff growing to 160 ms).
pub const MAX_CAS_ATTEMPTS: u32 = 32;

/// Formatted-mode counters in Consul KV.
pub struct ConsulFormatStore {
    client: ConsulClient,
    keys: ClusterKeys,
    /// The floor of the last `idgen admin skip-ahead` (`None`: none ran)
    /// and its record's ModifyIndex (0: absent), as last read; every
    /// reservation checks the record is unchanged in the same txn, and a
    /// refused txn drops this copy.
    floor: Mutex<Option<(Option<RestoreFloor>, u64)>>,
}

impl ConsulFormatStore {
    /// Records under `keys`' `formats/` folder.
    pub fn new(client: ConsulClient, keys: ClusterKeys) -> Self {
        Self {
            client,
            keys,
            floor: Mutex::new(None),
        }
    }

    fn floor_cache(&self) -> std::sync::MutexGuard<'_, Option<(Option<RestoreFloor>, u64)>> {
        self.floor.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// After a skip-ahead (a restored Consul snapshot), counters starting a
    /// period up to the run start above its floor, as on a restored state
    /// file.
    async fn restore_floor(&self) -> Result<(Option<RestoreFloor>, u64), StoreError> {
        if let Some(cached) = *self.floor_cache() {
            return Ok(cached);
        }
        let key = self.keys.skip_ahead();
        let (entry, _) = self
            .client
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let read = match entry {
            None => (None, 0),
            Some(e) => {
                let r = crate::store::skip_ahead::SkipAheadRecord::decode(&key, &e.value)?;
                let floor = RestoreFloor {
                    until_ms: r.until_ms,
                    floor: r.floor,
                };
                (Some(floor), e.modify_index)
            }
        };
        *self.floor_cache() = Some(read);
        Ok(read)
    }

    async fn read(&self, key: &CounterKey) -> Result<Option<(CounterRecord, u64)>, StoreError> {
        let path = self.keys.format_counter(&key.path());
        let floor = self.keys.written().written(&path);
        let (entry, _) = self
            .client
            .kv_get(
                &self.keys.format_counter(&key.path()),
                Consistency::Consistent,
            )
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let Some(e) = entry else {
            self.keys
                .written()
                .check("format", &path, floor, (i64::MIN, 0))?;
            return Ok(None);
        };
        let record = decode(key, &e.value)?;
        // Below this node's own write (an earlier period, or a lower value
        // in the same one): the store was rolled back.
        self.keys
            .written()
            .check("format", &path, floor, (record.period.0, record.last))?;
        Ok(Some((record, e.modify_index)))
    }
}

#[async_trait]
impl FormatStore for ConsulFormatStore {
    async fn load(&self, key: &CounterKey) -> Result<Option<CounterRecord>, StoreError> {
        Ok(self.read(key).await?.map(|(r, _)| r))
    }

    async fn reserve(&self, key: &CounterKey, plan: Plan) -> Result<Planned, StoreError> {
        self.reserve_locked(key, plan, None).await
    }

    async fn count_counters(&self, format: &str) -> Result<u64, StoreError> {
        let prefix = self.keys.format_counter(&format!("{format}/"));
        let entries = self
            .client
            .kv_list(&prefix, Consistency::Default)
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(entries.len() as u64)
    }

    async fn reserve_locked(
        &self,
        key: &CounterKey,
        plan: Plan,
        lock: Option<&TokenLock>,
    ) -> Result<Planned, StoreError> {
        let path = self.keys.format_counter(&key.path());
        for attempt in 0..MAX_CAS_ATTEMPTS {
            let (stored, index) = match self.read(key).await? {
                Some((r, i)) => (Some(r), i),
                // Index 0: create only if still absent.
                None => (None, 0),
            };
            let (floor, floor_index) = self.restore_floor().await?;
            let planned = plan(stored.as_ref(), floor)?;
            let mut ops = Vec::with_capacity(4);
            if let Some(lock) = lock {
                ops.push(TxnOp::CheckSession {
                    key: lock.key.clone(),
                    session: lock.session.clone(),
                });
            }
            let floor_key = self.keys.skip_ahead();
            ops.push(match floor_index {
                0 => TxnOp::CheckNotExists { key: floor_key },
                index => TxnOp::CheckIndex {
                    key: floor_key,
                    index,
                },
            });
            ops.push(TxnOp::Cas {
                key: path.clone(),
                value: encode(&planned.record),
                index,
            });
            ops.extend(self.keys.mark_check());
            match self.client.txn(&ops).await {
                Ok(TxnOutcome::Committed(_)) => {
                    let level = (planned.record.period.0, planned.record.last);
                    self.keys.written().wrote(&path, level);
                    return Ok(planned);
                }
                Ok(TxnOutcome::RolledBack(errors))
                    if lock.is_some() && errors.iter().any(|e| e.op_index == 0) =>
                {
                    return Err(StoreError::LockLost(format!(
                        "format {}: token lock {} is no longer held by this node's session; nothing was reserved",
                        key.format,
                        lock.map_or("", |l| l.key.as_str())
                    )))
                }
                Ok(TxnOutcome::RolledBack(errors)) => {
                    if self.keys.mark_failed(&ops, &errors) {
                        // This node's mark moved: its keeper, or a restore.
                        self.keys.recheck_mark(&self.client).await?;
                        continue;
                    }
                    // The counter or the skip-ahead record moved: re-read.
                    *self.floor_cache() = None;
                    backoff(attempt).await
                }
                Err(e) => {
                    return Err(StoreError::Backend(format!(
                        "format {}: a counter block may or may not have been reserved ({e}); it is not used, retry",
                        key.format
                    )))
                }
            }
        }
        Err(StoreError::Contended(format!(
            "format {}: lost the compare-and-set race {MAX_CAS_ATTEMPTS} times in a row to other nodes reserving counter blocks; retry (or raise the format's step so nodes reserve less often)",
            key.format
        )))
    }
}

async fn backoff(attempt: u32) {
    let cap = 5u64 << attempt.min(5);
    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..=cap))).await;
}
