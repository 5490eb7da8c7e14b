//! Format definitions in Consul KV: `<prefix>/<cluster>/format-defs/<name>`
//! holds the JSON, written by a txn `cas`.

use async_trait::async_trait;

use super::{
    check_creatable, decode, encode, live, DefChange, DefListing, FormatCatalogStore, StoredFormat,
};
use crate::consul::{Consistency, ConsulClient, TxnOp, TxnOutcome};
use crate::store::kv_paths::ClusterPaths;
use crate::store::StoreError;

/// How often an admin write that lost a compare-and-set race is tried.
const CAS_ATTEMPTS: u32 = 8;

/// Format definitions in Consul KV.
pub struct ConsulFormatCatalogStore {
    client: ConsulClient,
    keys: ClusterPaths,
}

impl ConsulFormatCatalogStore {
    /// Definitions under `keys`' `format-defs/` folder.
    pub fn new(client: ConsulClient, keys: ClusterPaths) -> Self {
        Self { client, keys }
    }

    async fn read(&self, name: &str) -> Result<Option<(StoredFormat, u64)>, StoreError> {
        let key = self.keys.format_def(name);
        let (entry, _) = self
            .client
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        entry
            .map(|e| Ok((decode(&key, &e.value)?, e.modify_index)))
            .transpose()
    }

    /// Writes `record` at `name` if its ModifyIndex is still `index` (0:
    /// absent); `false` if another write got in between.
    async fn cas(&self, name: &str, record: &StoredFormat, index: u64) -> Result<bool, StoreError> {
        let ops = [TxnOp::Cas {
            key: self.keys.format_def(name),
            value: encode(record)?,
            index,
        }];
        match self.client.txn(&ops).await {
            Ok(TxnOutcome::Committed(_)) => Ok(true),
            Ok(TxnOutcome::RolledBack(_)) => Ok(false),
            Err(e) => Err(StoreError::Backend(format!(
                "format {name}: the definition may or may not have been written ({e}); read it back with `idgen admin formats get {name}`"
            ))),
        }
    }

    fn contended(name: &str) -> StoreError {
        StoreError::Contended(format!(
            "format {name}: another admin change won the compare-and-set {CAS_ATTEMPTS} times in a row; retry"
        ))
    }
}

#[async_trait]
impl FormatCatalogStore for ConsulFormatCatalogStore {
    async fn list(&self) -> Result<DefListing, StoreError> {
        let entries = self
            .client
            .kv_list(&self.keys.format_defs_dir(), Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut listing = DefListing::default();
        for e in entries {
            listing.add(&e.key, &e.value);
        }
        listing.formats.sort_by(|a, b| a.def.name.cmp(&b.def.name));
        Ok(listing)
    }

    async fn get(&self, name: &str) -> Result<Option<StoredFormat>, StoreError> {
        Ok(self.read(name).await?.map(|(r, _)| r))
    }

    async fn create(&self, record: &StoredFormat) -> Result<StoredFormat, StoreError> {
        let name = record.def.name.as_str();
        for _ in 0..CAS_ATTEMPTS {
            let existing = self.read(name).await?;
            check_creatable(existing.as_ref().map(|(r, _)| r))?;
            if self.cas(name, record, 0).await? {
                return Ok(record.clone());
            }
        }
        Err(Self::contended(name))
    }

    async fn change(&self, name: &str, change: DefChange) -> Result<StoredFormat, StoreError> {
        for _ in 0..CAS_ATTEMPTS {
            let existing = self.read(name).await?;
            let index = existing.as_ref().map_or(0, |(_, i)| *i);
            let written = change(live(name, existing.as_ref().map(|(r, _)| r))?)?;
            if self.cas(name, &written, index).await? {
                return Ok(written);
            }
        }
        Err(Self::contended(name))
    }
}

/// A fingerprint of the stored definitions (each key and ModifyIndex), so
/// a node can tell cheaply that another node changed them.
pub async fn consul_fingerprint(
    client: &ConsulClient,
    keys: &ClusterPaths,
) -> Result<Vec<(String, u64)>, StoreError> {
    Ok(consul_fingerprint_after(client, keys, None).await?.0)
}

/// [`consul_fingerprint`] as a blocking query: waits until the
/// definitions' index passes `wait.0`, or `wait.1` elapses; also returns
/// the index to wait on next.
pub async fn consul_fingerprint_after(
    client: &ConsulClient,
    keys: &ClusterPaths,
    wait: Option<(u64, std::time::Duration)>,
) -> Result<(Vec<(String, u64)>, u64), StoreError> {
    let (entries, index) = client
        .kv_list_blocking(&keys.format_defs_dir(), Consistency::Default, wait)
        .await
        .map_err(|e| StoreError::Backend(e.to_string()))?;
    let mut seen: Vec<(String, u64)> = entries
        .into_iter()
        .map(|e| (e.key, e.modify_index))
        .collect();
    seen.sort();
    Ok((seen, index))
}
