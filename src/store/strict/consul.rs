//! Strict counters in Consul KV: `strict/<namespace>/<key>` holds the
//! counter as a decimal string, `strict-namespaces/<namespace>` a
//! namespace's step, `strict-deleted/<namespace>/<key>` a tombstone.

use std::sync::Arc;

use async_trait::async_trait;

use super::combine::{self, parse_decimal, preview, Combiner, StrictKv, Waiting, STRICT_POLICY};
use super::{StrictLimits, StrictStore};
use crate::consul::{Consistency, ConsulClient, ConsulError, KvWrite, TxnOp};
use crate::id::strict::StrictError;
use crate::id::strict::{check_step, Namespace, StrictKey, Values};
use crate::metrics as m;
use crate::store::cas::{compare_and_set, Attempt, CasWrite};
use crate::store::kv_paths::ClusterPaths;
use crate::store::StoreError;

/// A random pause before attempt `attempt + 1`: full jitter over a cap
/// that doubles from 5 ms up to [`super::MAX_STRICT_BACKOFF`] (the loop in
/// `store/cas.rs` takes it from [`STRICT_POLICY`]; this names it for the
/// test of the cap).
#[cfg(test)]
pub(super) fn backoff(attempt: u32) -> std::time::Duration {
    STRICT_POLICY.pause(attempt)
}

/// Strict counters in Consul KV. Concurrent calls on this node are
/// combined (see `combine.rs`): one write per key per txn, several keys
/// per txn.
pub struct ConsulStrictStore {
    kv: Arc<StrictKv>,
}

impl std::ops::Deref for ConsulStrictStore {
    type Target = StrictKv;

    fn deref(&self) -> &StrictKv {
        &self.kv
    }
}

impl std::fmt::Debug for ConsulStrictStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulStrictStore")
            .field("keys", &self.keys)
            .finish()
    }
}

impl ConsulStrictStore {
    /// Counters under `keys`' `strict/` folder, steps under
    /// `strict-namespaces/`.
    pub fn new(client: ConsulClient, keys: ClusterPaths) -> Self {
        Self::with_limits(client, keys, StrictLimits::NONE)
    }

    /// Like [`new`](Self::new), refusing to create keys past `limits`.
    /// The limits are checked by listing before the creating write (Consul
    /// has no count a txn could check), so nodes creating keys at the same
    /// moment may overshoot them by a few.
    pub fn with_limits(client: ConsulClient, keys: ClusterPaths, limits: StrictLimits) -> Self {
        Self {
            kv: Arc::new(StrictKv {
                client,
                keys,
                conflicts: metrics::counter!(m::STRICT_CONFLICTS),
                limits,
                combiner: Combiner::default(),
            }),
        }
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
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.combiner.push(
            key,
            Waiting {
                step,
                count,
                lost: 0,
                mark_moves: 0,
                reply,
            },
        );
        combine::kick(&self.kv);
        answer.await.map_err(|_| {
            StoreError::Backend(format!(
                "strict key {key}: the write was abandoned (the node is stopping); no values were handed out, retry"
            ))
        })?
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
        let delete = Delete {
            store: &self.kv,
            key,
            kv_key: self.keys.strict(key.as_str()),
        };
        let deleted = compare_and_set(&self.client, &self.keys, STRICT_POLICY, &delete).await;
        // Whatever happened, the key is read again before its next write.
        self.combiner.forget(key);
        deleted
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

    async fn key_namespaces(&self) -> Result<Vec<Namespace>, StoreError> {
        // One name per namespace folder (`?keys&separator=/`), not every key.
        let dir = self.keys.strict("");
        let (folders, _) = self
            .client
            .kv_keys(&dir, "/", Consistency::Consistent)
            .await
            .map_err(|e| {
                StoreError::Backend(format!("cannot list the strict namespaces with keys: {e}"))
            })?;
        let mut out = Vec::with_capacity(folders.len());
        for folder in folders {
            let name = folder.strip_prefix(dir.as_str()).unwrap_or(&folder);
            let Some(name) = name.strip_suffix('/') else {
                continue; // a key outside any namespace folder is no namespace
            };
            out.push(Namespace::parse(name).map_err(|e| {
                StoreError::Backend(format!(
                    "Consul folder {folder} is not a strict namespace ({e}); delete it or restore the folder from a backup"
                ))
            })?);
        }
        out.sort();
        Ok(out)
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

/// The admin delete of a live strict key: the counter goes and the
/// tombstone (never lowered) takes its value, both or neither.
struct Delete<'a> {
    store: &'a StrictKv,
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
            read: true,
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
