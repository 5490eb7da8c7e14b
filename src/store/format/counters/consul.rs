//! Format counters in Consul KV:
//! `<prefix>/<cluster>/formats/<format>/<node|cluster>/<scope>` holds the
//! record as JSON, written by a txn `cas` on the ModifyIndex of a
//! consistent read.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    decode, encode, CounterKey, FormatCounterStore, Plan, Planned, RestoreFloor, TokenLock,
};
use crate::consul::{Consistency, ConsulClient, ConsulError, TxnError, TxnOp};
use crate::id::format::CounterRecord;
use crate::store::cas::{compare_and_set, Attempt, CasPolicy, CasWrite};
use crate::store::kv_paths::ClusterPaths;
use crate::store::StoreError;

/// all (jittered backoff growing to 160 ms).
pub const MAX_CAS_ATTEMPTS: u32 = 32;

/// Formatted-mode counters in Consul KV.
pub struct ConsulFormatCounterStore {
    client: ConsulClient,
    keys: ClusterPaths,
    /// The floor of the last `idgen admin skip-ahead` (`None`: none ran)
    /// and its record's ModifyIndex (0: absent), as last read; every
    /// reservation checks the record is unchanged in the same txn, and a
    /// refused txn drops this copy.
    floor: Mutex<Option<(Option<RestoreFloor>, u64)>>,
}

impl ConsulFormatCounterStore {
    /// Records under `keys`' `formats/` folder.
    pub fn new(client: ConsulClient, keys: ClusterPaths) -> Self {
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
                let r = crate::store::regression::SkipAheadRecord::decode(&key, &e.value)?;
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
impl FormatCounterStore for ConsulFormatCounterStore {
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
        let reservation = Reservation {
            store: self,
            key,
            path: self.keys.format_counter(&key.path()),
            plan,
            lock,
        };
        compare_and_set(&self.client, &self.keys, RESERVE_POLICY, &reservation).await
    }
}

/// The policy of reservations: [`MAX_CAS_ATTEMPTS`], pauses growing to
/// 160 ms.
const RESERVE_POLICY: CasPolicy = CasPolicy {
    attempts: MAX_CAS_ATTEMPTS,
    max_pause: Duration::from_millis(160),
};

/// One reservation of a counter block, planned from a consistent read of
/// the counter and of the skip-ahead record (checked unchanged in the same
/// txn), and, for a token's counter, the token's lock.
struct Reservation<'a> {
    store: &'a ConsulFormatCounterStore,
    key: &'a CounterKey,
    path: String,
    plan: Plan,
    lock: Option<&'a TokenLock>,
}

#[async_trait]
impl CasWrite for Reservation<'_> {
    type Output = Planned;

    async fn plan(&self) -> Result<Attempt<Planned>, StoreError> {
        let store = self.store;
        let (stored, index) = match store.read(self.key).await? {
            Some((r, i)) => (Some(r), i),
            // Index 0: create only if still absent.
            None => (None, 0),
        };
        let (floor, floor_index) = store.restore_floor().await?;
        let planned = (self.plan)(stored.as_ref(), floor)?;
        let mut ops = Vec::with_capacity(4);
        if let Some(lock) = self.lock {
            ops.push(TxnOp::CheckSession {
                key: lock.key.clone(),
                session: lock.session.clone(),
            });
        }
        let floor_key = store.keys.skip_ahead();
        ops.push(match floor_index {
            0 => TxnOp::CheckNotExists { key: floor_key },
            index => TxnOp::CheckIndex {
                key: floor_key,
                index,
            },
        });
        ops.push(TxnOp::Cas {
            key: self.path.clone(),
            value: encode(&planned.record),
            index,
        });
        Ok(Attempt {
            ops,
            key: self.path.clone(),
            level: (planned.record.period.0, planned.record.last),
            value: planned,
            read: true,
        })
    }

    fn refused(&self, _ops: &[TxnOp], errors: &[TxnError]) -> Option<StoreError> {
        let lock = self.lock?;
        errors.iter().any(|e| e.op_index == 0).then(|| {
            StoreError::LockLost(format!(
                "format {}: token lock {} is no longer held by this node's session; nothing was reserved",
                self.key.format, lock.key
            ))
        })
    }

    fn lost(&self, mark_moved: bool) {
        if !mark_moved {
            // The counter or the skip-ahead record moved: re-read.
            *self.store.floor_cache() = None;
        }
    }

    fn unknown(&self, e: ConsulError) -> StoreError {
        StoreError::Backend(format!(
            "format {}: a counter block may or may not have been reserved ({e}); it is not used, retry",
            self.key.format
        ))
    }

    fn contended(&self, attempts: u32) -> StoreError {
        StoreError::Contended(format!(
            "format {}: lost the compare-and-set race {attempts} times in a row to other nodes reserving counter blocks; retry (or raise the format's step so nodes reserve less often)",
            self.key.format
        ))
    }
}
