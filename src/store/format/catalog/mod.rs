//! Durable format definitions (formatted mode), on both backends.
//!
//! Every format a node serves is a [`StoredFormat`] here: made by the admin
//! API (`CreateFormat`) or written from a config file's `[[formats]]` entry
//! the first time a node starts with it. The store, not any one node's
//! config, is what every node of a cluster serves.
//!
//! Deleting a format leaves a tombstone that keeps its definition: the name
//! can never be created again ([`FormatError::Deleted`]), because its
//! counters stay in the store under that name and a new definition could
//! render IDs the old one already handed out.
//!
//! - Embedded: table `format_defs` (name -> JSON), one redb write
//!   transaction per change; carried by backups.
//! - Consul: `<prefix>/<cluster>/format-defs/<name>` holds the JSON, written
//!   by a txn `cas` (index 0 to create; the ModifyIndex of a consistent read
//!   to change), so two admins racing cannot both win.

mod consul;
mod embedded;
#[cfg(test)]
mod tests;

use async_trait::async_trait;
use redb::TableDefinition;
use serde::{Deserialize, Serialize};

use crate::id::format::FormatDef;
use crate::id::format::FormatError;
use crate::store::StoreError;

pub use consul::{consul_fingerprint, consul_fingerprint_after, ConsulFormatCatalogStore};

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
    /// ([`crate::store::format::restore`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh: bool,
    /// The check key ([`crate::id::format::check_key`]) of the load-time
    /// checks this definition's Lua rule passed when it was stored: a node
    /// loading it under the same key skips them (a restart does not render
    /// every stored rule's hundred thousand IDs again). `None`, or another
    /// key (a changed sandbox, limits or checks): checked again at load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lua_checked: Option<String>,
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
pub trait FormatCatalogStore: Send + Sync + 'static {
    /// Every definition, tombstones included (strongest consistency the
    /// backend offers), and every record that could not be read.
    async fn list(&self) -> Result<DefListing, StoreError>;

    /// One definition, tombstone included; `None` if never stored.
    async fn get(&self, name: &str) -> Result<Option<StoredFormat>, StoreError>;

    /// Stores a new definition. [`FormatError::Exists`] if live,
    /// [`FormatError::Deleted`] if a tombstone holds the name.
    async fn create(&self, record: &StoredFormat) -> Result<StoredFormat, StoreError>;

    /// Rewrites a live definition as `change` says and returns what was
    /// written; [`FormatError::NotFound`] if never stored,
    /// [`FormatError::Deleted`] for a tombstone.
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
    StoreError::Format(FormatError::Deleted {
        format: record.def.name.clone(),
        deleted_ms: record.updated_ms,
    })
}

/// Whether `existing` lets a new definition be created over it.
fn check_creatable(existing: Option<&StoredFormat>) -> Result<(), StoreError> {
    match existing {
        None => Ok(()),
        Some(r) if r.deleted => Err(deleted(r)),
        Some(r) => Err(StoreError::Format(FormatError::Exists(r.def.name.clone()))),
    }
}

/// The live record `existing`, or why it cannot be changed.
fn live<'a>(
    name: &str,
    existing: Option<&'a StoredFormat>,
) -> Result<&'a StoredFormat, StoreError> {
    match existing {
        None => Err(StoreError::Format(FormatError::NotFound(
            name.chars().take(80).collect(),
        ))),
        Some(r) if r.deleted => Err(deleted(r)),
        Some(r) => Ok(r),
    }
}
