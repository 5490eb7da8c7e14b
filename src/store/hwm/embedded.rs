//! High-water marks in the embedded state file: table `hwm`,
//! `"<dc>/<worker>"` -> Unix ms, one fsync'd transaction per write.

use async_trait::async_trait;

use super::HwmStore;
use crate::store::embedded::{backend_err, blocking, EmbeddedStore, HWM};
use crate::store::{StoreError, WorkerKey};

impl EmbeddedStore {
    fn read_hwm(&self, key: WorkerKey) -> Result<Option<u64>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = txn.open_table(HWM).map_err(backend_err)?;
        let value = table.get(key.to_string().as_str()).map_err(backend_err)?;
        Ok(value.map(|v| v.value()))
    }

    fn write_hwm(&self, key: WorkerKey, hwm_ms: u64) -> Result<(), StoreError> {
        let txn = self.begin_write()?;
        {
            let mut table = txn.open_table(HWM).map_err(backend_err)?;
            table
                .insert(key.to_string().as_str(), hwm_ms)
                .map_err(backend_err)?;
        }
        // Default durability is Immediate: commit returns after fsync.
        self.commit(txn)
    }
}

#[async_trait]
impl HwmStore for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn load_hwm(&self, key: WorkerKey) -> Result<Option<u64>, StoreError> {
        let this = self.clone();
        blocking(move || this.read_hwm(key)).await
    }

    async fn store_hwm(&self, key: WorkerKey, hwm_ms: u64) -> Result<(), StoreError> {
        let this = self.clone();
        blocking(move || this.write_hwm(key, hwm_ms)).await
    }
}
