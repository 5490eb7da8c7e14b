//! Format definitions in the embedded state file: table `format_defs`
//! (name -> JSON), one redb write transaction per change.

use async_trait::async_trait;
use redb::ReadableTable;

use super::{
    check_creatable, decode, encode, live, DefChange, DefListing, FormatCatalogStore, StoredFormat,
    FORMAT_DEFS,
};
use crate::store::embedded::{backend_err, blocking, EmbeddedStore};
use crate::store::StoreError;

impl EmbeddedStore {
    fn list_defs_blocking(&self) -> Result<DefListing, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(FORMAT_DEFS) {
            Ok(t) => t,
            // Files made before formats were stored have no table yet.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(DefListing::default()),
            Err(e) => return Err(backend_err(e)),
        };
        let mut listing = DefListing::default();
        for item in table.iter().map_err(backend_err)? {
            let (k, v) = item.map_err(backend_err)?;
            listing.add(k.value(), v.value());
        }
        Ok(listing)
    }

    fn get_def_blocking(&self, name: &str) -> Result<Option<StoredFormat>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(FORMAT_DEFS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(backend_err(e)),
        };
        let value = table.get(name).map_err(backend_err)?;
        value.map(|v| decode(name, v.value())).transpose()
    }

    /// Reads `name`, lets `write` decide the record, and stores it, all in
    /// one write transaction.
    fn write_def(
        &self,
        name: &str,
        write: impl FnOnce(
            &redb::WriteTransaction,
            Option<&StoredFormat>,
        ) -> Result<StoredFormat, StoreError>,
    ) -> Result<StoredFormat, StoreError> {
        let txn = self.begin_write()?;
        let written = {
            let mut table = txn.open_table(FORMAT_DEFS).map_err(backend_err)?;
            let existing = match table.get(name).map_err(backend_err)? {
                Some(v) => Some(decode(name, v.value())?),
                None => None,
            };
            let written = write(&txn, existing.as_ref())?;
            table
                .insert(name, encode(&written)?.as_slice())
                .map_err(backend_err)?;
            written
        };
        self.commit(txn)?;
        Ok(written)
    }
}

#[async_trait]
impl FormatCatalogStore for EmbeddedStore {
    async fn list(&self) -> Result<DefListing, StoreError> {
        let this = self.clone();
        blocking(move || this.list_defs_blocking()).await
    }

    async fn get(&self, name: &str) -> Result<Option<StoredFormat>, StoreError> {
        let (this, name) = (self.clone(), name.to_owned());
        blocking(move || this.get_def_blocking(&name)).await
    }

    async fn create(&self, record: &StoredFormat) -> Result<StoredFormat, StoreError> {
        let (this, record) = (self.clone(), record.clone());
        blocking(move || {
            this.write_def(&record.def.name.clone(), |txn, existing| {
                check_creatable(existing)?;
                // A name new since a restore: floored (or refused) as the
                // lost node may have used it after the backup.
                crate::store::format::restore::floor_new_format(txn, &record)?;
                Ok(record)
            })
        })
        .await
    }

    async fn change(&self, name: &str, change: DefChange) -> Result<StoredFormat, StoreError> {
        let (this, name) = (self.clone(), name.to_owned());
        blocking(move || this.write_def(&name, |_, existing| change(live(&name, existing)?))).await
    }
}
