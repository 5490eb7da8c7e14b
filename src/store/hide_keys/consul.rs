//! Hide key records in Consul KV: `<prefix>/<cluster>/hide-keys/<key_id>`
//! holds the JSON, written through
//! [`compare_and_set`](crate::store::cas::compare_and_set); the master
//! key's fingerprint in `<prefix>/<cluster>/hide-master-fingerprint`.

use std::time::Duration;

use async_trait::async_trait;

use super::{decode, encode, fingerprint, HideKeyRecords, KeyChange, StoredHideKey};
use crate::consul::{Consistency, ConsulClient, ConsulError, KvWrite, TxnOp};
use crate::store::cas::{compare_and_set, Attempt, CasPolicy, CasWrite};
use crate::store::kv_paths::ClusterPaths;
use crate::store::StoreError;

/// How often an admin change that lost a compare-and-set race is tried.
const POLICY: CasPolicy = CasPolicy {
    attempts: 8,
    max_pause: Duration::from_millis(200),
};

/// Hide key records in Consul KV.
#[derive(Clone)]
pub struct ConsulHideKeyRecords {
    client: ConsulClient,
    keys: ClusterPaths,
}

impl ConsulHideKeyRecords {
    /// Records under `keys`' `hide-keys/` folder.
    pub fn new(client: ConsulClient, keys: ClusterPaths) -> Self {
        Self { client, keys }
    }

    fn key(&self, key_id: &str) -> String {
        format!("{}{key_id}", self.dir())
    }

    fn dir(&self) -> String {
        format!("{}/hide-keys/", self.keys.root_dir().trim_end_matches('/'))
    }

    async fn read(&self, key_id: &str) -> Result<Option<(StoredHideKey, u64)>, StoreError> {
        let key = self.key(key_id);
        let (entry, _) = self
            .client
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        entry
            .map(|e| Ok((decode(&key, &e.value)?, e.modify_index)))
            .transpose()
    }
}

/// One change of one record, as the compare-and-set loop runs it.
struct ChangeWrite<'a> {
    records: &'a ConsulHideKeyRecords,
    key_id: &'a str,
    change: KeyChange,
}

#[async_trait]
impl CasWrite for ChangeWrite<'_> {
    type Output = StoredHideKey;

    async fn plan(&self) -> Result<Attempt<StoredHideKey>, StoreError> {
        let existing = self.records.read(self.key_id).await?;
        let index = existing.as_ref().map_or(0, |(_, i)| *i);
        let key = self.records.key(self.key_id);
        // A record below what this node wrote there: the Consul state was
        // rolled back (a snapshot restore). Rotating from it could give a
        // number this node already gave another key.
        let read_top = existing
            .as_ref()
            .and_then(|(r, _)| r.versions.iter().map(|v| v.version).max());
        if let Some((wrote, _)) = self.records.keys.written().written(&key) {
            if read_top.map_or(-1, i64::from) < wrote {
                return Err(StoreError::Regressed {
                    kind: "hide key",
                    key,
                    stored: read_top
                        .map_or_else(|| "nothing".to_owned(), |v| format!("version {v}")),
                    wrote: format!("version {wrote}"),
                });
            }
        }
        let written = (self.change)(existing.as_ref().map(|(r, _)| r))?;
        let top = written
            .versions
            .iter()
            .map(|v| v.version)
            .max()
            .unwrap_or(0);
        Ok(Attempt {
            ops: vec![TxnOp::Cas {
                key: key.clone(),
                value: encode(&written)?,
                index,
            }],
            key,
            level: (i64::from(top), written.versions.len() as u64),
            value: written,
            read: true,
        })
    }

    fn unknown(&self, e: ConsulError) -> StoreError {
        StoreError::Backend(format!(
            "hide key {}: the change may or may not have been written ({e}); read it back with `idgen admin keys list`",
            self.key_id
        ))
    }

    fn contended(&self, attempts: u32) -> StoreError {
        StoreError::Contended(format!(
            "hide key {}: another admin change won the compare-and-set {attempts} times in a row; retry",
            self.key_id
        ))
    }
}

#[async_trait]
impl HideKeyRecords for ConsulHideKeyRecords {
    async fn all(&self) -> Result<Vec<StoredHideKey>, StoreError> {
        let entries = self
            .client
            .kv_list(&self.dir(), Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut out = entries
            .iter()
            .map(|e| decode(&e.key, &e.value))
            .collect::<Result<Vec<_>, _>>()?;
        out.sort_by(|a, b| a.key_id.cmp(&b.key_id));
        Ok(out)
    }

    async fn get(&self, key_id: &str) -> Result<Option<StoredHideKey>, StoreError> {
        Ok(self.read(key_id).await?.map(|(r, _)| r))
    }

    async fn change(&self, key_id: &str, change: KeyChange) -> Result<StoredHideKey, StoreError> {
        let write = ChangeWrite {
            records: self,
            key_id,
            change,
        };
        compare_and_set(&self.client, &self.keys, POLICY, &write).await
    }

    async fn wait_change(&self, index: u64, wait: Duration) -> Result<u64, StoreError> {
        let (_, next) = self
            .client
            .kv_list_blocking(&self.dir(), Consistency::Default, Some((index, wait)))
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(next)
    }

    async fn master_fingerprint(&self) -> Result<Option<String>, StoreError> {
        let key = self.keys.hide_master_fingerprint();
        let (entry, _) = self
            .client
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(format!("cannot read {key}: {e}")))?;
        entry
            .map(|e| fingerprint::parse(&key, &String::from_utf8_lossy(&e.value)))
            .transpose()
    }

    async fn claim_master_fingerprint(&self, mine: &str) -> Result<String, StoreError> {
        let key = self.keys.hide_master_fingerprint();
        // Index 0: only if no node wrote one yet. A refusal or an unknown
        // outcome is settled by reading what is there.
        match self
            .client
            .kv_put(&key, mine.as_bytes(), KvWrite::Cas(0))
            .await
        {
            Ok(true) => return Ok(mine.to_owned()),
            Ok(false) => {}
            Err(e) if e.outcome_unknown() => {}
            Err(e) => return Err(StoreError::Backend(format!("cannot write {key}: {e}"))),
        }
        self.master_fingerprint().await?.ok_or_else(|| {
            StoreError::Backend(format!(
                "{key} was neither written nor found (a concurrent delete?); retry the key change"
            ))
        })
    }
}
