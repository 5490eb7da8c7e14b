//! Strict counters in Consul KV: `strict/<namespace>/<key>` holds the
//! counter as a decimal string, `strict-namespaces/<namespace>` a
//! namespace's step, `strict-deleted/<namespace>/<key>` a tombstone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use super::{StrictLimits, StrictStore};
use crate::consul::{Consistency, ConsulClient, ConsulError, KvWrite, TxnError, TxnOp};
use crate::id::strict::StrictError;
use crate::id::strict::{advance, check_step, Namespace, StrictKey, Values};
use crate::metrics as m;
use crate::store::cas::{compare_and_set, Attempt, CasPolicy, CasWrite};
use crate::store::keys::ClusterKeys;
use crate::store::StoreError;

/// How often a strict call that lost a compare-and-set race is tried in
/// all, with jittered backoff growing to [`MAX_STRICT_BACKOFF`] (about
/// 1.5 s at worst), before it fails with [`StoreError::Contended`].
pub const MAX_STRICT_ATTEMPTS: u32 = 16;

/// The longest pause between two attempts of a strict call.
pub const MAX_STRICT_BACKOFF: Duration = Duration::from_millis(100);

/// A random pause before attempt `attempt + 1`: full jitter over a cap
/// that doubles from 5 ms up to [`MAX_STRICT_BACKOFF`] (the loop in
/// `store/cas.rs` takes it from [`STRICT_POLICY`]; this names it for the
/// test of the cap).
#[cfg(test)]
pub(super) fn backoff(attempt: u32) -> Duration {
    STRICT_POLICY.pause(attempt)
}

/// A stored counter or step: plain ASCII digits.
pub(super) fn parse_decimal(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes)
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
}

/// The first bytes of a bad stored value, for an error message.
fn preview(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned()
}

/// Strict counters in Consul KV.
pub struct ConsulStrictStore {
    client: ConsulClient,
    keys: ClusterKeys,
    /// One call per key at a time on this node; an entry lives only while
    /// a call on its key runs or waits.
    turns: Mutex<HashMap<StrictKey, Arc<tokio::sync::Mutex<()>>>>,
    conflicts: metrics::Counter,
    limits: StrictLimits,
}

impl std::fmt::Debug for ConsulStrictStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulStrictStore")
            .field("keys", &self.keys)
            .finish()
    }
}

/// This node's turn on one key; dropping it lets the next call in and
/// forgets the key when no call is waiting.
struct KeyTurn<'a> {
    turns: &'a Mutex<HashMap<StrictKey, Arc<tokio::sync::Mutex<()>>>>,
    key: StrictKey,
    lock: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for KeyTurn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        // Clones are only made under this lock: two references (the map's
        // and ours) mean no other call holds or waits for this key.
        if Arc::strong_count(&self.lock) == 2
            && turns
                .get(&self.key)
                .is_some_and(|l| Arc::ptr_eq(l, &self.lock))
        {
            turns.remove(&self.key);
        }
    }
}

impl ConsulStrictStore {
    /// Counters under `keys`' `strict/` folder, steps under
    /// `strict-namespaces/`.
    pub fn new(client: ConsulClient, keys: ClusterKeys) -> Self {
        Self::with_limits(client, keys, StrictLimits::NONE)
    }

    /// Like [`new`](Self::new), refusing to create keys past `limits`.
    /// The limits are checked by listing before the creating write (Consul
    /// has no count a txn could check), so nodes creating keys at the same
    /// moment may overshoot them by a few.
    pub fn with_limits(client: ConsulClient, keys: ClusterKeys, limits: StrictLimits) -> Self {
        Self {
            client,
            keys,
            turns: Mutex::new(HashMap::new()),
            conflicts: metrics::counter!(m::STRICT_CONFLICTS),
            limits,
        }
    }

    /// Refuses to create `key` past the limits: counts the live keys of
    /// its namespace, and when it has none, the namespaces with live keys.
    async fn check_limits(&self, key: &StrictKey) -> Result<(), StoreError> {
        if self.limits == StrictLimits::NONE {
            return Ok(());
        }
        let list = |dir: String| async move {
            self.client
                .kv_list(&dir, Consistency::Consistent)
                .await
                .map_err(|e| {
                    StoreError::Backend(format!(
                        "strict key {key}: cannot count the live keys under {dir} ({e}); retry"
                    ))
                })
        };
        let in_ns = list(self.keys.strict(&format!("{}/", key.namespace_str())))
            .await?
            .len() as u64;
        let namespaces = if in_ns == 0 {
            let dir = self.keys.strict("");
            let all = list(dir.clone()).await?;
            let names: std::collections::BTreeSet<&str> = all
                .iter()
                .filter_map(|e| e.key.strip_prefix(dir.as_str()))
                .filter_map(|k| k.split('/').next())
                .collect();
            metrics::gauge!(m::STRICT_KEYS).set(all.len() as f64);
            metrics::gauge!(m::STRICT_NAMESPACES).set(names.len() as f64);
            names.len() as u64
        } else {
            0
        };
        self.limits.check(key, in_ns, namespaces)
    }

    /// A deleted key's last value and the tombstone's ModifyIndex; `(0, 0)`
    /// if the key was never deleted.
    async fn read_tombstone(&self, key: &StrictKey) -> Result<(u64, u64), StoreError> {
        let kv_key = self.keys.strict_tombstone(key.as_str());
        let (entry, _) = self
            .client
            .kv_get(&kv_key, Consistency::Consistent)
            .await
            .map_err(|e| {
                StoreError::Backend(format!("strict key {key}: cannot read its tombstone: {e}"))
            })?;
        let Some(entry) = entry else {
            return Ok((0, 0));
        };
        let value = parse_decimal(&entry.value).ok_or_else(|| {
            StoreError::Backend(format!(
                "strict key {key}: the tombstone in Consul key {kv_key} is not a decimal number ({:?}); restore it from a backup (never lower it: values would repeat)",
                preview(&entry.value)
            ))
        })?;
        Ok((value, entry.modify_index))
    }

    /// The txn op that fails the write if the tombstone moved since it
    /// was read at `index` (0: it did not exist).
    fn tombstone_unchanged(&self, key: &StrictKey, index: u64) -> TxnOp {
        let key = self.keys.strict_tombstone(key.as_str());
        if index == 0 {
            TxnOp::CheckNotExists { key }
        } else {
            TxnOp::CheckIndex { key, index }
        }
    }

    async fn turn(&self, key: &StrictKey) -> KeyTurn<'_> {
        let lock = {
            let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(turns.entry(key.clone()).or_default())
        };
        let guard = Arc::clone(&lock).lock_owned().await;
        KeyTurn {
            turns: &self.turns,
            key: key.clone(),
            lock,
            guard: Some(guard),
        }
    }

    /// The counter and its ModifyIndex, from a quorum-confirmed read;
    /// `(0, 0)` for a key never used (and a write with index 0 creates it
    /// only if it is still absent).
    async fn read_counter(&self, key: &StrictKey) -> Result<(u64, u64), StoreError> {
        let kv_key = self.keys.strict(key.as_str());
        let (entry, _) = self
            .client
            .kv_get(&kv_key, Consistency::Consistent)
            .await
            .map_err(|e| {
                StoreError::Backend(format!("strict key {key}: cannot read its counter: {e}"))
            })?;
        let Some(entry) = entry else {
            return Ok((0, 0));
        };
        let value = parse_decimal(&entry.value).ok_or_else(|| {
            StoreError::Backend(format!(
                "strict key {key}: the counter in Consul key {kv_key} is not a decimal number ({:?}); restore it from a backup (never lower it: values would repeat)",
                preview(&entry.value)
            ))
        })?;
        Ok((value, entry.modify_index))
    }
}

impl ConsulStrictStore {
    /// The strict keys of `ns` stored under `dir` (`root` is the prefix a
    /// key's name follows), with their values, sorted by key.
    async fn list_under(
        &self,
        ns: &Namespace,
        root: &str,
        dir: &str,
    ) -> Result<Vec<(StrictKey, u64)>, StoreError> {
        let entries = self
            .client
            .kv_list(dir, Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(format!("cannot list strict namespace {ns}: {e}")))?;
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let name = entry.key.strip_prefix(root).unwrap_or(&entry.key);
            let key = StrictKey::parse(name).map_err(|e| {
                StoreError::Backend(format!(
                    "Consul key {} is not a strict key ({e}); delete it or restore the folder from a backup",
                    entry.key
                ))
            })?;
            let value = parse_decimal(&entry.value).ok_or_else(|| {
                StoreError::Backend(format!(
                    "strict key {key}: the counter in Consul key {} is not a decimal number ({:?}); restore it from a backup",
                    entry.key,
                    preview(&entry.value)
                ))
            })?;
            out.push((key, value));
        }
        out.sort();
        Ok(out)
    }
}

#[async_trait]
impl StrictStore for ConsulStrictStore {
    async fn advance(&self, key: &StrictKey, step: u64, count: u64) -> Result<Values, StoreError> {
        check_step(step)?;
        let _turn = self.turn(key).await;
        let call = Advance {
            store: self,
            key,
            kv_key: self.keys.strict(key.as_str()),
            step,
            count,
        };
        compare_and_set(&self.client, &self.keys, STRICT_POLICY, &call).await
    }

    async fn current(&self, key: &StrictKey) -> Result<u64, StoreError> {
        match self.read_counter(key).await? {
            (_, 0) => Ok(self.read_tombstone(key).await?.0),
            (value, _) => Ok(value),
        }
    }

    async fn list_keys(&self, ns: &Namespace) -> Result<Vec<(StrictKey, u64)>, StoreError> {
        let root = self.keys.strict("");
        let dir = self.keys.strict(&format!("{ns}/"));
        self.list_under(ns, &root, &dir).await
    }

    async fn list_tombstones(&self, ns: &Namespace) -> Result<Vec<(StrictKey, u64)>, StoreError> {
        let root = self.keys.strict_tombstone("");
        let dir = self.keys.strict_tombstone(&format!("{ns}/"));
        self.list_under(ns, &root, &dir).await
    }

    async fn delete_key(&self, key: &StrictKey) -> Result<u64, StoreError> {
        let _turn = self.turn(key).await;
        let delete = Delete {
            store: self,
            key,
            kv_key: self.keys.strict(key.as_str()),
        };
        compare_and_set(&self.client, &self.keys, STRICT_POLICY, &delete).await
    }

    async fn namespace_step(&self, ns: &Namespace) -> Result<Option<u64>, StoreError> {
        let kv_key = self.keys.strict_namespace(ns.as_str());
        let (entry, _) = self
            .client
            .kv_get(&kv_key, Consistency::Consistent)
            .await
            .map_err(|e| {
                StoreError::Backend(format!("strict namespace {ns}: cannot read its step: {e}"))
            })?;
        entry.map(|e| parse_step(&kv_key, &e.value)).transpose()
    }

    async fn set_namespace_step(&self, ns: &Namespace, step: u64) -> Result<(), StoreError> {
        check_step(step)?;
        let kv_key = self.keys.strict_namespace(ns.as_str());
        let written = self
            .client
            .kv_put(&kv_key, step.to_string().as_bytes(), KvWrite::Set)
            .await
            .map_err(|e| {
                StoreError::Backend(format!(
                    "strict namespace {ns}: cannot write its step ({e}); retry"
                ))
            })?;
        if written {
            Ok(())
        } else {
            Err(StoreError::Backend(format!(
                "strict namespace {ns}: Consul did not apply the write of {kv_key}; retry"
            )))
        }
    }

    async fn namespaces(&self) -> Result<Vec<(Namespace, u64)>, StoreError> {
        let dir = self.keys.strict_namespaces_dir();
        let entries = self
            .client
            .kv_list(&dir, Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(format!("cannot list the strict namespaces: {e}")))?;
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let name = entry.key.strip_prefix(dir.as_str()).unwrap_or(&entry.key);
            let ns = Namespace::parse(name).map_err(|e| {
                StoreError::Backend(format!(
                    "Consul key {} is not a strict namespace ({e}); delete it or restore the folder from a backup",
                    entry.key
                ))
            })?;
            out.push((ns, parse_step(&entry.key, &entry.value)?));
        }
        out.sort();
        Ok(out)
    }
}

/// The policy of strict calls: [`MAX_STRICT_ATTEMPTS`], pauses growing
/// to [`MAX_STRICT_BACKOFF`].
const STRICT_POLICY: CasPolicy = CasPolicy {
    attempts: MAX_STRICT_ATTEMPTS,
    max_pause: MAX_STRICT_BACKOFF,
};

/// One strict call on `key`, always planned from a fresh read: after a
/// lost race or an unknown outcome the counter may have moved (even by
/// this node's own late write).
struct Advance<'a> {
    store: &'a ConsulStrictStore,
    key: &'a StrictKey,
    kv_key: String,
    step: u64,
    count: u64,
}

#[async_trait]
impl CasWrite for Advance<'_> {
    type Output = Values;

    async fn plan(&self) -> Result<Attempt<Values>, StoreError> {
        let (store, key) = (self.store, self.key);
        let floor = store.keys.written().written(&self.kv_key);
        let (mut value, index) = store.read_counter(key).await?;
        let mut ops = Vec::with_capacity(3);
        if index == 0 {
            // Not live: this call creates the key, above its tombstone,
            // and only if no delete moved the tombstone meanwhile.
            store.check_limits(key).await?;
            let (last, tomb_index) = store.read_tombstone(key).await?;
            value = last;
            ops.push(store.tombstone_unchanged(key, tomb_index));
        }
        // The live counter, or the tombstone of a deleted key: below
        // this node's own write, the store was rolled back.
        store
            .keys
            .written()
            .check("strict", &self.kv_key, floor, (0, value))?;
        let values = advance(key, value, self.step, self.count)?;
        ops.push(TxnOp::Cas {
            key: self.kv_key.clone(),
            value: values.last.to_string().into_bytes(),
            index,
        });
        Ok(Attempt {
            ops,
            key: self.kv_key.clone(),
            level: (0, values.last),
            value: values,
        })
    }

    fn refused(&self, _ops: &[TxnOp], errors: &[TxnError]) -> Option<StoreError> {
        // ACL denials come back as rolled-back txns too: retrying cannot
        // help those.
        let denied = errors
            .iter()
            .find(|e| e.what.to_ascii_lowercase().contains("permission denied"))?;
        Some(StoreError::Backend(format!(
            "strict key {}: Consul refused the write of {} ({}); check that the ACL token has the policy in consul/acl-policy.hcl",
            self.key, self.kv_key, denied.what
        )))
    }

    fn lost(&self, mark_moved: bool) {
        if !mark_moved {
            // Another node moved the counter first: read again.
            self.store.conflicts.increment(1);
        }
    }

    fn unknown(&self, e: ConsulError) -> StoreError {
        // Maybe applied: these values are never used, and the next call
        // reads whatever landed (a gap at worst).
        StoreError::Backend(format!(
            "strict key {}: the write of its counter failed ({e}); no values were handed out, retry",
            self.key
        ))
    }

    fn contended(&self, attempts: u32) -> StoreError {
        StoreError::Contended(format!(
            "strict key {}: lost the compare-and-set race {attempts} times in a row; too many nodes write it at once: retry later, ask for more values per call (count), or spread the load over more keys",
            self.key
        ))
    }
}

/// The admin delete of a live strict key: the counter goes and the
/// tombstone (never lowered) takes its value, both or neither.
struct Delete<'a> {
    store: &'a ConsulStrictStore,
    key: &'a StrictKey,
    kv_key: String,
}

#[async_trait]
impl CasWrite for Delete<'_> {
    type Output = u64;

    async fn plan(&self) -> Result<Attempt<u64>, StoreError> {
        let (store, key) = (self.store, self.key);
        let (value, index) = store.read_counter(key).await?;
        if index == 0 {
            return Err(StoreError::Strict(StrictError::KeyNotFound(
                key.to_string(),
            )));
        }
        let (old, tomb_index) = store.read_tombstone(key).await?;
        let last = value.max(old);
        Ok(Attempt {
            ops: vec![
                TxnOp::DeleteCas {
                    key: self.kv_key.clone(),
                    index,
                },
                TxnOp::Cas {
                    key: store.keys.strict_tombstone(key.as_str()),
                    value: last.to_string().into_bytes(),
                    index: tomb_index,
                },
            ],
            // A key used again starts from its tombstone, checked against
            // what this node wrote to the counter's key.
            key: self.kv_key.clone(),
            level: (0, last),
            value,
        })
    }

    fn lost(&self, mark_moved: bool) {
        if !mark_moved {
            self.store.conflicts.increment(1);
        }
    }

    fn unknown(&self, e: ConsulError) -> StoreError {
        StoreError::Backend(format!(
            "strict key {}: the delete may or may not have been applied ({e}); list the keys before retrying",
            self.key
        ))
    }

    fn contended(&self, attempts: u32) -> StoreError {
        StoreError::Contended(format!(
            "strict key {}: lost the compare-and-set race {attempts} times in a row while deleting it; retry",
            self.key
        ))
    }
}

/// A stored namespace step, checked like a configured one.
pub(super) fn parse_step(kv_key: &str, bytes: &[u8]) -> Result<u64, StoreError> {
    parse_decimal(bytes)
        .and_then(|s| check_step(s).ok())
        .ok_or_else(|| {
            StoreError::Backend(format!(
                "the strict namespace step in Consul key {kv_key} is not a number from 1 to {} ({:?}); set it again with the admin API",
                crate::id::strict::MAX_STEP,
                preview(bytes)
            ))
        })
}
