//! Hide key records in the embedded state file: table `hide_keys` (key id
//! -> JSON), one redb write transaction per change; the master key's
//! fingerprint in the `meta` table.

use std::time::Duration;

use async_trait::async_trait;
use redb::ReadableTable;

use super::{decode, encode, fingerprint, HideKeyRecords, KeyChange, StoredHideKey, HIDE_KEYS};
use crate::store::embedded::{backend_err, blocking, EmbeddedStore, META};
use crate::store::StoreError;

impl EmbeddedStore {
    fn hide_keys_blocking(&self) -> Result<Vec<StoredHideKey>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(HIDE_KEYS) {
            Ok(t) => t,
            // Files made before hide keys have no table yet.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(backend_err(e)),
        };
        let mut out = Vec::new();
        for item in table.iter().map_err(backend_err)? {
            let (k, v) = item.map_err(backend_err)?;
            out.push(decode(k.value(), v.value())?);
        }
        Ok(out)
    }

    fn hide_key_blocking(&self, key_id: &str) -> Result<Option<StoredHideKey>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(HIDE_KEYS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(backend_err(e)),
        };
        let value = table.get(key_id).map_err(backend_err)?;
        value.map(|v| decode(key_id, v.value())).transpose()
    }

    fn change_hide_key_blocking(
        &self,
        key_id: &str,
        change: &KeyChange,
    ) -> Result<StoredHideKey, StoreError> {
        let txn = self.begin_write()?;
        let written = {
            let mut table = txn.open_table(HIDE_KEYS).map_err(backend_err)?;
            let existing = match table.get(key_id).map_err(backend_err)? {
                Some(v) => Some(decode(key_id, v.value())?),
                None => None,
            };
            let written = change(existing.as_ref())?;
            table
                .insert(key_id, encode(&written)?.as_slice())
                .map_err(backend_err)?;
            written
        };
        self.commit(txn)?;
        Ok(written)
    }

    fn master_fingerprint_blocking(&self) -> Result<Option<String>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let meta = txn.open_table(META).map_err(backend_err)?;
        let value = meta.get(fingerprint::META_KEY).map_err(backend_err)?;
        value
            .map(|v| fingerprint::parse("the state file's meta table", v.value()))
            .transpose()
    }

    fn claim_master_fingerprint_blocking(&self, mine: &str) -> Result<String, StoreError> {
        let txn = self.begin_write()?;
        let stored = {
            let mut meta = txn.open_table(META).map_err(backend_err)?;
            let existing = meta
                .get(fingerprint::META_KEY)
                .map_err(backend_err)?
                .map(|v| v.value().to_owned());
            match existing {
                Some(text) => Some(fingerprint::parse("the state file's meta table", &text)?),
                None => {
                    meta.insert(fingerprint::META_KEY, mine)
                        .map_err(backend_err)?;
                    None
                }
            }
        };
        match stored {
            Some(stored) => Ok(stored),
            None => {
                self.commit(txn)?;
                Ok(mine.to_owned())
            }
        }
    }
}

#[async_trait]
impl HideKeyRecords for EmbeddedStore {
    async fn all(&self) -> Result<Vec<StoredHideKey>, StoreError> {
        let this = self.clone();
        blocking(move || this.hide_keys_blocking()).await
    }

    async fn get(&self, key_id: &str) -> Result<Option<StoredHideKey>, StoreError> {
        let (this, key_id) = (self.clone(), key_id.to_owned());
        blocking(move || this.hide_key_blocking(&key_id)).await
    }

    async fn change(&self, key_id: &str, change: KeyChange) -> Result<StoredHideKey, StoreError> {
        let (this, key_id) = (self.clone(), key_id.to_owned());
        blocking(move || this.change_hide_key_blocking(&key_id, &change)).await
    }

    async fn wait_change(&self, index: u64, wait: Duration) -> Result<u64, StoreError> {
        // Only this process writes the state file, and it refreshes its
        // rings after every change itself.
        tokio::time::sleep(wait).await;
        Ok(index)
    }

    async fn master_fingerprint(&self) -> Result<Option<String>, StoreError> {
        let this = self.clone();
        blocking(move || this.master_fingerprint_blocking()).await
    }

    async fn claim_master_fingerprint(&self, fingerprint: &str) -> Result<String, StoreError> {
        let (this, mine) = (self.clone(), fingerprint.to_owned());
        blocking(move || this.claim_master_fingerprint_blocking(&mine)).await
    }
}
