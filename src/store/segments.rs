//! Durable segment records (segment mode), on both backends.
//!
//! [`SegmentStore::take_range`] is the only way a node gets IDs for a tag:
//! it moves the tag's `max_id` forward by `step` with a compare-and-set and
//! returns the range in between only once that write is acknowledged. A
//! write whose outcome is unknown returns an error and its range is never
//! used (the next take re-reads the record): a wasted range is safe, a
//! range handed out twice is not.
//!
//! - Embedded: one redb write transaction per take (durable on commit).
//! - Consul: `<prefix>/<cluster>/segments/<tag>` holds the record as JSON,
//!   written by a txn `cas` on the ModifyIndex last seen; the txn's result
//!   carries the new index, so a node that keeps taking never re-reads.
//!   Lost races are retried with jittered backoff, a bounded number of
//!   times.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use super::consul::ClusterKeys;
use super::embedded::{backend_err, blocking, EmbeddedStore};
use super::StoreError;
use crate::consul::{Consistency, ConsulClient, TxnOp, TxnOutcome};
use crate::id::segment::{Range, Tag, TagRecord};

/// Segment tag records and range reservations.
#[async_trait]
pub trait SegmentStore: Send + Sync + 'static {
    /// Creates `tag` with `record`; [`StoreError::TagExists`] if it exists.
    async fn create_tag(&self, tag: &Tag, record: &TagRecord) -> Result<(), StoreError>;

    /// Reads a tag's record (strongest consistency the backend offers).
    async fn get_tag(&self, tag: &Tag) -> Result<Option<TagRecord>, StoreError>;

    /// Takes the next `step` IDs of `tag`: `(max_id, max_id + step]`,
    /// durably reserved for the caller before it returns.
    async fn take_range(&self, tag: &Tag, step: u64, now_ms: u64) -> Result<Range, StoreError>;
}

const SEGMENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("segments");

fn decode(tag: &Tag, bytes: &[u8]) -> Result<TagRecord, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| {
        StoreError::Backend(format!(
            "segment record of tag {tag} is unreadable ({e}); restore it from a backup"
        ))
    })
}

fn encode(record: &TagRecord) -> Vec<u8> {
    // A struct of integers and a string: serialising cannot fail.
    serde_json::to_vec(record).unwrap_or_default()
}

impl EmbeddedStore {
    fn read_tag(&self, tag: &Tag) -> Result<Option<TagRecord>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(SEGMENTS) {
            Ok(t) => t,
            // Files made before segment mode have no table yet.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(backend_err(e)),
        };
        let value = table.get(tag.as_str()).map_err(backend_err)?;
        value.map(|v| decode(tag, v.value())).transpose()
    }

    fn insert_tag(&self, tag: &Tag, record: &TagRecord) -> Result<(), StoreError> {
        let txn = self.db().begin_write().map_err(backend_err)?;
        {
            let mut table = txn.open_table(SEGMENTS).map_err(backend_err)?;
            if table.get(tag.as_str()).map_err(backend_err)?.is_some() {
                return Err(StoreError::TagExists(tag.to_string()));
            }
            table
                .insert(tag.as_str(), encode(record).as_slice())
                .map_err(backend_err)?;
        }
        txn.commit().map_err(backend_err)
    }

    fn advance_tag(&self, tag: &Tag, step: u64, now_ms: u64) -> Result<Range, StoreError> {
        let txn = self.db().begin_write().map_err(backend_err)?;
        let range = {
            let mut table = txn.open_table(SEGMENTS).map_err(backend_err)?;
            let record = match table.get(tag.as_str()).map_err(backend_err)? {
                Some(v) => decode(tag, v.value())?,
                None => return Err(StoreError::TagNotFound(tag.to_string())),
            };
            let (range, next) = record.next_range(tag, step, now_ms)?;
            table
                .insert(tag.as_str(), encode(&next).as_slice())
                .map_err(backend_err)?;
            range
        };
        // Durable before the range is handed to anyone.
        txn.commit().map_err(backend_err)?;
        Ok(range)
    }
}

#[async_trait]
impl SegmentStore for EmbeddedStore {
    async fn create_tag(&self, tag: &Tag, record: &TagRecord) -> Result<(), StoreError> {
        let (this, tag, record) = (self.clone(), tag.clone(), record.clone());
        blocking(move || this.insert_tag(&tag, &record)).await
    }

    async fn get_tag(&self, tag: &Tag) -> Result<Option<TagRecord>, StoreError> {
        let (this, tag) = (self.clone(), tag.clone());
        blocking(move || this.read_tag(&tag)).await
    }

    async fn take_range(&self, tag: &Tag, step: u64, now_ms: u64) -> Result<Range, StoreError> {
        let (this, tag) = (self.clone(), tag.clone());
        blocking(move || this.advance_tag(&tag, step, now_ms)).await
    }
}

/// How often a take that lost a compare-and-set race is tried in all
/// (with jittered backoff growing to 160 ms: about 4 s at worst). A node
/// that just took a range races with a fresh index and no read, so under a
/// burst of refills the others may lose many times in a row.
pub const MAX_CAS_ATTEMPTS: u32 = 32;

/// Segment records in Consul KV.
pub struct ConsulSegmentStore {
    client: ConsulClient,
    keys: ClusterKeys,
    /// Each tag's record and ModifyIndex as last read or written by this
    /// node; dropped after any failure, so the next take re-reads.
    known: Mutex<HashMap<Tag, (TagRecord, u64)>>,
    /// One take per tag at a time on this node: racing itself would only
    /// make it lose compare-and-sets against its own writes.
    takes: Mutex<HashMap<Tag, Arc<tokio::sync::Mutex<()>>>>,
}

impl ConsulSegmentStore {
    /// Records under `keys`' `segments/` folder.
    pub fn new(client: ConsulClient, keys: ClusterKeys) -> Self {
        Self {
            client,
            keys,
            known: Mutex::new(HashMap::new()),
            takes: Mutex::new(HashMap::new()),
        }
    }

    fn take_lock(&self, tag: &Tag) -> Arc<tokio::sync::Mutex<()>> {
        let mut takes = self
            .takes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(takes.entry(tag.clone()).or_default())
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<Tag, (TagRecord, u64)>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn read(&self, tag: &Tag) -> Result<Option<(TagRecord, u64)>, StoreError> {
        let (entry, _) = self
            .client
            .kv_get(&self.keys.segment(tag.as_str()), Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        match entry {
            None => Ok(None),
            Some(e) => {
                let record = decode(tag, &e.value)?;
                self.known()
                    .insert(tag.clone(), (record.clone(), e.modify_index));
                Ok(Some((record, e.modify_index)))
            }
        }
    }
}

#[async_trait]
impl SegmentStore for ConsulSegmentStore {
    async fn create_tag(&self, tag: &Tag, record: &TagRecord) -> Result<(), StoreError> {
        let key = self.keys.segment(tag.as_str());
        let ops = [TxnOp::Cas {
            key: key.clone(),
            value: encode(record),
            index: 0,
        }];
        match self.client.txn(&ops).await {
            Ok(TxnOutcome::Committed(_)) => Ok(()),
            Ok(TxnOutcome::RolledBack(_)) => Err(StoreError::TagExists(tag.to_string())),
            Err(e) => Err(StoreError::Backend(e.to_string())),
        }
    }

    async fn get_tag(&self, tag: &Tag) -> Result<Option<TagRecord>, StoreError> {
        Ok(self.read(tag).await?.map(|(r, _)| r))
    }

    async fn take_range(&self, tag: &Tag, step: u64, now_ms: u64) -> Result<Range, StoreError> {
        let key = self.keys.segment(tag.as_str());
        let lock = self.take_lock(tag);
        let _one_at_a_time = lock.lock().await;
        for attempt in 0..MAX_CAS_ATTEMPTS {
            let cached = self.known().get(tag).cloned();
            let (record, index) = match cached {
                Some(c) => c,
                None => self
                    .read(tag)
                    .await?
                    .ok_or_else(|| StoreError::TagNotFound(tag.to_string()))?,
            };
            let (range, next) = record.next_range(tag, step, now_ms)?;
            let ops = [TxnOp::Cas {
                key: key.clone(),
                value: encode(&next),
                index,
            }];
            match self.client.txn(&ops).await {
                Ok(TxnOutcome::Committed(results)) => {
                    match results.iter().find(|e| e.key == key) {
                        Some(e) => self.known().insert(tag.clone(), (next, e.modify_index)),
                        None => self.known().remove(tag),
                    };
                    return Ok(range);
                }
                Ok(TxnOutcome::RolledBack(_)) => {
                    // Another node moved the record: re-read and retry.
                    self.known().remove(tag);
                    let cap = 5u64 << attempt.min(5);
                    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..=cap))).await;
                }
                Err(e) => {
                    // Maybe applied: never use this range, re-read next time.
                    self.known().remove(tag);
                    return Err(StoreError::Backend(e.to_string()));
                }
            }
        }
        Err(StoreError::Contended(format!(
            "segment tag {tag}: lost the compare-and-set race {MAX_CAS_ATTEMPTS} times in a row; too many nodes refill it at once (raise its step)"
        )))
    }
}
