//! Durable format definitions (formatted mode), on both backends.
//!
//! Every format a node serves is a [`StoredFormat`] here: made by the admin
//! API (`CreateFormat`) or written from a config file's `[[formats]]` entry
//! the first time a node starts with it. The store, not any one node's
//! config, is what every node of a cluster serves.
//!
//! Deleting a format leaves a tombstone that keeps its definition: the name
//! can never be created again ([`StoreError::FormatDeleted`]), because its
//! counters stay in the store under that name and a new definition could
//! render IDs the old one already handed out.
//!
//! - Embedded: table `format_defs` (name -> JSON), one redb write
//!   transaction per change; carried by backups.
//! - Consul: `<prefix>/<cluster>/format-defs/<name>` holds the JSON, written
//!   by a txn `cas` (index 0 to create; the ModifyIndex of a consistent read
//!   to change), so two admins racing cannot both win.

use async_trait::async_trait;
use redb::{ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::consul::ClusterKeys;
use super::embedded::{backend_err, blocking, EmbeddedStore};
use super::StoreError;
use crate::consul::{Consistency, ConsulClient, TxnOp, TxnOutcome};
use crate::id::format::FormatDef;

pub(crate) const FORMAT_DEFS: TableDefinition<&str, &[u8]> = TableDefinition::new("format_defs");

/// How a definition got into the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DefSource {
    /// A config file's `[[formats]]` entry.
    Config,
    /// The admin API.
    Admin,
}

impl DefSource {
    /// The name shown to operators.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::Admin => "admin",
        }
    }
}

/// A stored format definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredFormat {
    /// The definition (stamped with its origin year at creation).
    pub def: FormatDef,
    /// Deleted: a tombstone; the name is never used again.
    #[serde(default)]
    pub deleted: bool,
    /// Who wrote it last.
    pub source: DefSource,
    /// When it was created, Unix ms.
    pub created_ms: u64,
    /// When it last changed, Unix ms.
    pub updated_ms: u64,
    /// Created with the operator's assertion that the name never issued
    /// an ID on this cluster before (`--fresh`): on a restored state file
    /// it skips the restore's margin for new formats
    /// ([`crate::store::format_restore`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh: bool,
}

/// What listing the definitions found.
#[derive(Debug, Default, Clone)]
pub struct DefListing {
    /// Every record (tombstones included), sorted by name.
    pub formats: Vec<StoredFormat>,
    /// Records that could not be read: the stored key and why.
    pub unreadable: Vec<(String, String)>,
}

impl DefListing {
    /// The live definitions.
    pub fn live(&self) -> impl Iterator<Item = &StoredFormat> {
        self.formats.iter().filter(|f| !f.deleted)
    }

    fn add(&mut self, key: &str, bytes: &[u8]) {
        match decode(key, bytes) {
            Ok(f) => self.formats.push(f),
            Err(e) => self.unreadable.push((key.to_owned(), e.to_string())),
        }
    }
}

/// A change to one stored definition, decided on the record as read (it
/// may run more than once when Consul writes race).
pub type DefChange =
    std::sync::Arc<dyn Fn(&StoredFormat) -> Result<StoredFormat, StoreError> + Send + Sync>;

/// Stored format definitions.
#[async_trait]
pub trait FormatDefStore: Send + Sync + 'static {
    /// Every definition, tombstones included (strongest consistency the
    /// backend offers), and every record that could not be read.
    async fn list(&self) -> Result<DefListing, StoreError>;

    /// One definition, tombstone included; `None` if never stored.
    async fn get(&self, name: &str) -> Result<Option<StoredFormat>, StoreError>;

    /// Stores a new definition. [`StoreError::FormatExists`] if live,
    /// [`StoreError::FormatDeleted`] if a tombstone holds the name.
    async fn create(&self, record: &StoredFormat) -> Result<StoredFormat, StoreError>;

    /// Rewrites a live definition as `change` says and returns what was
    /// written; [`StoreError::FormatNotFound`] if never stored,
    /// [`StoreError::FormatDeleted`] for a tombstone.
    async fn change(&self, name: &str, change: DefChange) -> Result<StoredFormat, StoreError>;
}

fn decode(key: &str, bytes: &[u8]) -> Result<StoredFormat, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| {
        StoreError::Backend(format!(
            "format definition {key} is unreadable ({e}); restore it from a backup"
        ))
    })
}

fn encode(record: &StoredFormat) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(record).map_err(|e| StoreError::Backend(format!("format definition: {e}")))
}

fn deleted(record: &StoredFormat) -> StoreError {
    StoreError::FormatDeleted {
        format: record.def.name.clone(),
        deleted_ms: record.updated_ms,
    }
}

/// Whether `existing` lets a new definition be created over it.
fn check_creatable(existing: Option<&StoredFormat>) -> Result<(), StoreError> {
    match existing {
        None => Ok(()),
        Some(r) if r.deleted => Err(deleted(r)),
        Some(r) => Err(StoreError::FormatExists(r.def.name.clone())),
    }
}

/// The live record `existing`, or why it cannot be changed.
fn live<'a>(
    name: &str,
    existing: Option<&'a StoredFormat>,
) -> Result<&'a StoredFormat, StoreError> {
    match existing {
        None => Err(StoreError::FormatNotFound(name.chars().take(80).collect())),
        Some(r) if r.deleted => Err(deleted(r)),
        Some(r) => Ok(r),
    }
}

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
impl FormatDefStore for EmbeddedStore {
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
                super::format_restore::floor_new_format(txn, &record)?;
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

/// How often an admin write that lost a compare-and-set race is tried.
const CAS_ATTEMPTS: u32 = 8;

/// Format definitions in Consul KV.
pub struct ConsulFormatDefStore {
    client: ConsulClient,
    keys: ClusterKeys,
}

impl ConsulFormatDefStore {
    /// Definitions under `keys`' `format-defs/` folder.
    pub fn new(client: ConsulClient, keys: ClusterKeys) -> Self {
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
impl FormatDefStore for ConsulFormatDefStore {
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
    keys: &ClusterKeys,
) -> Result<Vec<(String, u64)>, StoreError> {
    Ok(consul_fingerprint_after(client, keys, None).await?.0)
}

/// [`consul_fingerprint`] as a blocking query: waits until the
/// definitions' index passes `wait.0`, or `wait.1` elapses; also returns
/// the index to wait on next.
pub async fn consul_fingerprint_after(
    client: &ConsulClient,
    keys: &ClusterKeys,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consul::ConsulConfig;
    use crate::id::format::Reset;

    fn record(name: &str, template: &str) -> StoredFormat {
        StoredFormat {
            def: FormatDef::template(name, template, "UTC", Reset::Day),
            deleted: false,
            source: DefSource::Admin,
            created_ms: 1,
            updated_ms: 1,
            fresh: false,
        }
    }

    /// The contract, the same on both backends.
    async fn contract(store: &dyn FormatDefStore) {
        let a = record("orders", "{yyyy}{MM}{dd}{seq:4}");
        store.create(&a).await.unwrap();
        store
            .create(&record("b", "{yyyy}{MM}{dd}{seq:2}"))
            .await
            .unwrap();
        assert!(matches!(
            store.create(&a).await,
            Err(StoreError::FormatExists(n)) if n == "orders"
        ));
        let listed = store.list().await.unwrap();
        let names: Vec<&str> = listed.formats.iter().map(|f| f.def.name.as_str()).collect();
        assert_eq!(names, ["b", "orders"], "sorted by name");
        let changed = store
            .change(
                "orders",
                std::sync::Arc::new(|r| {
                    let mut r = r.clone();
                    r.def.description = "new".into();
                    r.updated_ms = 2;
                    Ok(r)
                }),
            )
            .await
            .unwrap();
        assert_eq!(changed.def.description, "new");
        assert_eq!(store.get("orders").await.unwrap(), Some(changed));
        assert!(matches!(
            store
                .change("nope", std::sync::Arc::new(|r| Ok(r.clone())))
                .await,
            Err(StoreError::FormatNotFound(_))
        ));
        // Delete: a tombstone; never created again, never changed.
        store
            .change(
                "orders",
                std::sync::Arc::new(|r| {
                    Ok(StoredFormat {
                        deleted: true,
                        updated_ms: 3,
                        ..r.clone()
                    })
                }),
            )
            .await
            .unwrap();
        let refused = store.create(&a).await.unwrap_err();
        assert!(
            matches!(refused, StoreError::FormatDeleted { ref format, deleted_ms: 3 } if format == "orders"),
            "{refused:?}"
        );
        assert_eq!(refused.kind(), crate::id::ErrorKind::Precondition);
        assert!(matches!(
            store
                .change("orders", std::sync::Arc::new(|r| Ok(r.clone())))
                .await,
            Err(StoreError::FormatDeleted { .. })
        ));
        let listed = store.list().await.unwrap();
        let live: Vec<&str> = listed.live().map(|f| f.def.name.as_str()).collect();
        assert_eq!(live, ["b"]);
        assert_eq!(listed.formats.len(), 2, "the tombstone is listed too");
    }

    #[tokio::test]
    async fn embedded_definitions_are_durable_and_tombstones_final() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::create(&path, "L").unwrap();
        assert!(store.list().await.unwrap().formats.is_empty());
        contract(&store).await;
        drop(store);
        let store = EmbeddedStore::open(&path, "L", false).unwrap();
        assert!(matches!(
            store.create(&record("orders", "{yyyy}{seq:9}")).await,
            Err(StoreError::FormatDeleted { .. })
        ));
        assert_eq!(store.list().await.unwrap().live().count(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn consul_definitions_are_shared_and_tombstones_final() {
        let consul = consul_testserver::TestConsul::start(consul_testserver::Config::default())
            .await
            .unwrap();
        let client = || {
            ConsulClient::new(ConsulConfig {
                address: format!("http://{}", consul.addr()),
                retries: 0,
                ..ConsulConfig::default()
            })
            .unwrap()
        };
        let keys = ClusterKeys::new("idgen", "test");
        let store = ConsulFormatDefStore::new(client(), keys.clone());
        let before = consul_fingerprint(&client(), &keys).await.unwrap();
        contract(&store).await;
        let other = ConsulFormatDefStore::new(client(), keys.clone());
        assert_eq!(other.list().await.unwrap().formats.len(), 2);
        let after = consul_fingerprint(&client(), &keys).await.unwrap();
        assert_ne!(before, after);
        consul.shutdown().await;
    }
}
