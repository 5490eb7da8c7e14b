//! Format counters in the embedded state file: table `formats`, one redb
//! write transaction per block, restore floors from the `meta` table.

use async_trait::async_trait;
use redb::ReadableTable;

use super::{
    decode, encode, CounterKey, FormatCounterStore, Plan, Planned, RestoreFloor, FORMATS,
    FORMATS_RESTORED_UNTIL, FORMAT_RESTORE_FLOORS, FORMAT_RESTORE_NEW_FLOOR,
};
use crate::id::format::CounterRecord;
use crate::store::embedded::{backend_err, blocking, EmbeddedStore};
use crate::store::StoreError;

impl EmbeddedStore {
    fn read_counter(&self, key: &CounterKey) -> Result<Option<CounterRecord>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(FORMATS) {
            Ok(t) => t,
            // Files made before formatted mode have no table yet.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(backend_err(e)),
        };
        let value = table.get(key.path().as_str()).map_err(backend_err)?;
        value.map(|v| decode(key, v.value())).transpose()
    }

    /// The restore floor of `format`'s counters, if this file was
    /// restored from a backup that defined the format.
    pub(crate) fn restore_floor(
        &self,
        txn: &redb::WriteTransaction,
        format: &str,
    ) -> Result<Option<RestoreFloor>, StoreError> {
        let unreadable = |key: &str, e: &dyn std::fmt::Display| {
            StoreError::Backend(format!(
                "state file: unreadable {key} ({e}); restore it from a backup"
            ))
        };
        let meta = txn
            .open_table(crate::store::embedded::META)
            .map_err(backend_err)?;
        let until = match meta.get(FORMATS_RESTORED_UNTIL).map_err(backend_err)? {
            Some(v) => v
                .value()
                .parse::<i64>()
                .map_err(|e| unreadable(FORMATS_RESTORED_UNTIL, &e))?,
            None => return Ok(None),
        };
        let floor = match meta.get(FORMAT_RESTORE_FLOORS).map_err(backend_err)? {
            Some(v) => {
                let floors: std::collections::BTreeMap<String, u64> =
                    serde_json::from_str(v.value())
                        .map_err(|e| unreadable(FORMAT_RESTORE_FLOORS, &e))?;
                match floors.get(format) {
                    Some(f) => *f,
                    // Not in the snapshot, nor recorded at creation: the
                    // margin of new formats (a gap is safe, a repeat is
                    // not).
                    None => match meta.get(FORMAT_RESTORE_NEW_FLOOR).map_err(backend_err)? {
                        Some(v) => v
                            .value()
                            .parse::<u64>()
                            .map_err(|e| unreadable(FORMAT_RESTORE_NEW_FLOOR, &e))?,
                        None => return Ok(None),
                    },
                }
            }
            None => self.floor(),
        };
        Ok(Some(RestoreFloor {
            until_ms: until,
            floor,
        }))
    }

    /// Counts the records under `<format>/` (a range read: keys of
    /// `<format>/` sort between `<format>/` and `<format>0`).
    fn count_format_counters(&self, format: &str) -> Result<u64, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(FORMATS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
            Err(e) => return Err(backend_err(e)),
        };
        let (from, to) = (format!("{format}/"), format!("{format}0"));
        let mut n = 0;
        for item in table
            .range(from.as_str()..to.as_str())
            .map_err(backend_err)?
        {
            item.map_err(backend_err)?;
            n += 1;
        }
        Ok(n)
    }

    fn advance_counter(&self, key: &CounterKey, plan: &Plan) -> Result<Planned, StoreError> {
        let path = key.path();
        let txn = self.begin_write()?;
        let planned = {
            let mut table = txn.open_table(FORMATS).map_err(backend_err)?;
            let stored = match table.get(path.as_str()).map_err(backend_err)? {
                Some(v) => Some(decode(key, v.value())?),
                None => None,
            };
            let planned = plan(stored.as_ref(), self.restore_floor(&txn, &key.format)?)?;
            table
                .insert(path.as_str(), encode(&planned.record).as_slice())
                .map_err(backend_err)?;
            planned
        };
        // Durable before any value of the block is used.
        self.commit(txn)?;
        Ok(planned)
    }
}

#[async_trait]
impl FormatCounterStore for EmbeddedStore {
    async fn load(&self, key: &CounterKey) -> Result<Option<CounterRecord>, StoreError> {
        let (this, key) = (self.clone(), key.clone());
        blocking(move || this.read_counter(&key)).await
    }

    async fn reserve(&self, key: &CounterKey, plan: Plan) -> Result<Planned, StoreError> {
        let (this, key) = (self.clone(), key.clone());
        blocking(move || this.advance_counter(&key, &plan)).await
    }

    async fn count_counters(&self, format: &str) -> Result<u64, StoreError> {
        let (this, format) = (self.clone(), format.to_owned());
        blocking(move || this.count_format_counters(&format)).await
    }
}
