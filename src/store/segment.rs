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
//!
//! # Limits
//! [`SegmentStore::create_tag_limited`] refuses a new (or revived) tag
//! once `segment.max_tags` tags are live. The embedded store keeps the
//! live count in the same write transaction as the records
//! (`store::counts`); Consul counts by listing before the creating write,
//! so nodes creating tags at the same moment may overshoot by a few.
//! Tombstones do not count.
//!
//! # Admin changes
//! Tags are created, updated, listed and deleted by the admin API. An
//! update may move `max_id` only forward. Deleting a tag leaves a
//! tombstone ([`TagRecord::deleted`]) that keeps its `max_id`: the tag
//! then reads as unknown, and creating it again continues above every ID
//! the old tag may have handed out (the new record's `max_id` is raised to
//! the tombstone's when it would start below). In Consul every admin write
//! is a txn `cas` on the ModifyIndex of a consistent read, so it never
//! crosses a concurrent take; and it drops this node's cached record, so
//! the next take re-reads (other nodes' caches fail their next `cas` and
//! re-read too).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redb::{ReadableTable, TableDefinition};

use super::consul::ClusterKeys;
use super::counts;
use super::embedded::{backend_err, blocking, EmbeddedStore};
use super::StoreError;
use crate::consul::{Consistency, ConsulClient, TxnOp, TxnOutcome};
use crate::id::segment::{Range, Tag, TagRecord, TagUpdate};
use crate::metrics as m;

/// Segment tag records and range reservations.
#[async_trait]
pub trait SegmentStore: Send + Sync + 'static {
    /// Creates `tag` with `record`; [`StoreError::TagExists`] if it exists.
    /// A deleted tag is created again above its old `max_id`.
    async fn create_tag(&self, tag: &Tag, record: &TagRecord) -> Result<(), StoreError>;

    /// Reads a tag's record (strongest consistency the backend offers);
    /// `None` for an unknown or deleted tag.
    async fn get_tag(&self, tag: &Tag) -> Result<Option<TagRecord>, StoreError>;

    /// Takes the next `step` IDs of `tag`: `(max_id, max_id + step]`,
    /// durably reserved for the caller before it returns.
    /// [`StoreError::TagNotFound`] for an unknown or deleted tag.
    async fn take_range(&self, tag: &Tag, step: u64, now_ms: u64) -> Result<Range, StoreError>;

    /// Like [`create_tag`](Self::create_tag), returning the record
    /// written: its `max_id` is above `record`'s when a deleted tag by that
    /// name had handed out more. Backends without admin support create
    /// and echo `record`.
    async fn create_tag_record(
        &self,
        tag: &Tag,
        record: &TagRecord,
    ) -> Result<TagRecord, StoreError> {
        self.create_tag(tag, record).await?;
        Ok(record.clone())
    }

    /// Like [`create_tag_record`](Self::create_tag_record), refused with
    /// [`StoreError::LimitReached`] when `max_tags` live tags exist
    /// already (`segment.max_tags`). Backends without limit support create
    /// without counting (the in-memory test stores).
    async fn create_tag_limited(
        &self,
        tag: &Tag,
        record: &TagRecord,
        max_tags: u64,
    ) -> Result<TagRecord, StoreError> {
        let _ = max_tags;
        self.create_tag_record(tag, record).await
    }

    /// Drops what this store caches about `tag` (its buffers were
    /// released); the next take reads the record again.
    fn release(&self, tag: &Tag) {
        let _ = tag;
    }

    /// Every live tag, sorted by name (strongest consistency the backend
    /// offers), and every record that could not be read, so one damaged
    /// record does not hide all the others.
    async fn list_tags(&self) -> Result<TagListing, StoreError> {
        Err(no_admin("list tags"))
    }

    /// Applies `update` to a live tag and returns the record written;
    /// [`StoreError::TagNotFound`] for an unknown or deleted tag.
    async fn update_tag(
        &self,
        tag: &Tag,
        update: &TagUpdate,
        now_ms: u64,
    ) -> Result<TagRecord, StoreError> {
        let _ = (tag, update, now_ms);
        Err(no_admin("update a tag"))
    }

    /// Deletes a live tag, leaving a tombstone that keeps its `max_id`
    /// (returned); [`StoreError::TagNotFound`] for an unknown or deleted
    /// tag.
    async fn delete_tag(&self, tag: &Tag, now_ms: u64) -> Result<TagRecord, StoreError> {
        let _ = (tag, now_ms);
        Err(no_admin("delete a tag"))
    }
}

fn no_admin(what: &str) -> StoreError {
    StoreError::Backend(format!("this segment store cannot {what}"))
}

/// How often an admin write that lost a compare-and-set race to takes on
/// other nodes is tried in all.
const ADMIN_CAS_ATTEMPTS: u32 = 16;

pub(crate) const SEGMENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("segments");

/// What listing the tags found.
#[derive(Debug, Default)]
pub struct TagListing {
    /// Live tags, sorted by name.
    pub tags: Vec<(Tag, TagRecord)>,
    /// Records that could not be read: the stored key and why.
    pub unreadable: Vec<(String, String)>,
}

impl TagListing {
    /// Files one stored record under live tags, or under unreadable.
    fn add(&mut self, key: &str, name: Option<&str>, bytes: &[u8]) {
        let Some(tag) = name.and_then(|n| Tag::parse(n).ok()) else {
            self.unreadable
                .push((key.to_owned(), "not a valid tag name".to_owned()));
            return;
        };
        match decode(&tag, bytes) {
            Ok(record) if record.deleted => {}
            Ok(record) => self.tags.push((tag, record)),
            Err(e) => self.unreadable.push((key.to_owned(), e.to_string())),
        }
    }
}

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
        let record = value.map(|v| decode(tag, v.value())).transpose()?;
        Ok(record.filter(|r| !r.deleted))
    }

    fn list_tags_blocking(&self) -> Result<TagListing, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(SEGMENTS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(TagListing::default()),
            Err(e) => return Err(backend_err(e)),
        };
        let mut listing = TagListing::default();
        for item in table.iter().map_err(backend_err)? {
            let (k, v) = item.map_err(backend_err)?;
            listing.add(k.value(), Some(k.value()), v.value());
        }
        // redb iterates in key order, which is the names' order.
        Ok(listing)
    }

    fn insert_tag(
        &self,
        tag: &Tag,
        record: &TagRecord,
        max_tags: u64,
    ) -> Result<TagRecord, StoreError> {
        let txn = self.begin_write()?;
        let (written, live) = {
            let mut counts = counts::open(&txn)?;
            let mut table = txn.open_table(SEGMENTS).map_err(backend_err)?;
            let old = match table.get(tag.as_str()).map_err(backend_err)? {
                Some(v) => Some(decode(tag, v.value())?),
                None => None,
            };
            let written = match old {
                Some(old) if !old.deleted => return Err(StoreError::TagExists(tag.to_string())),
                Some(tombstone) => tombstone.revived(record),
                // A tag the restored backup did not know may have handed
                // out IDs after the backup: start above the restore floor.
                None => TagRecord {
                    max_id: record
                        .max_id
                        .max(self.floor().min(crate::id::segment::MAX_SEGMENT_ID)),
                    ..record.clone()
                },
            };
            let live = counts::get(&counts, counts::SEGMENT_TAGS)?;
            if live >= max_tags {
                metrics::gauge!(m::SEGMENT_TAGS).set(live as f64);
                return Err(StoreError::limit_reached(
                    format!(
                        "segment tag {:?} cannot be created ({live} live tags)",
                        tag.as_str()
                    ),
                    max_tags,
                    "segment.max_tags",
                ));
            }
            table
                .insert(tag.as_str(), encode(&written).as_slice())
                .map_err(backend_err)?;
            let live = counts::add(&mut counts, counts::SEGMENT_TAGS, 1)?;
            (written, live)
        };
        self.commit(txn)?;
        metrics::gauge!(m::SEGMENT_TAGS).set(live as f64);
        Ok(written)
    }

    /// Rewrites a live tag's record as `change` says, in one transaction.
    /// `live_delta` is how the change moves the live-tag count (-1 for a
    /// delete), applied in the same transaction.
    fn change_tag(
        &self,
        tag: &Tag,
        live_delta: i64,
        change: impl FnOnce(&TagRecord) -> Result<TagRecord, StoreError>,
    ) -> Result<TagRecord, StoreError> {
        let txn = self.begin_write()?;
        let written = {
            let mut counts = counts::open(&txn)?;
            let mut table = txn.open_table(SEGMENTS).map_err(backend_err)?;
            let record = match table.get(tag.as_str()).map_err(backend_err)? {
                Some(v) => decode(tag, v.value())?,
                None => return Err(StoreError::TagNotFound(tag.to_string())),
            };
            if record.deleted {
                return Err(StoreError::TagNotFound(tag.to_string()));
            }
            let written = change(&record)?;
            table
                .insert(tag.as_str(), encode(&written).as_slice())
                .map_err(backend_err)?;
            if live_delta != 0 {
                let live = counts::add(&mut counts, counts::SEGMENT_TAGS, live_delta)?;
                metrics::gauge!(m::SEGMENT_TAGS).set(live as f64);
            }
            written
        };
        self.commit(txn)?;
        Ok(written)
    }

    fn advance_tag(&self, tag: &Tag, step: u64, now_ms: u64) -> Result<Range, StoreError> {
        let txn = self.begin_write()?;
        let range = {
            let mut table = txn.open_table(SEGMENTS).map_err(backend_err)?;
            let record = match table.get(tag.as_str()).map_err(backend_err)? {
                Some(v) => decode(tag, v.value())?,
                None => return Err(StoreError::TagNotFound(tag.to_string())),
            };
            if record.deleted {
                return Err(StoreError::TagNotFound(tag.to_string()));
            }
            let (range, next) = record.next_range(tag, step, now_ms)?;
            table
                .insert(tag.as_str(), encode(&next).as_slice())
                .map_err(backend_err)?;
            range
        };
        // Durable before the range is handed to anyone.
        self.commit(txn)?;
        Ok(range)
    }
}

#[async_trait]
impl SegmentStore for EmbeddedStore {
    async fn create_tag(&self, tag: &Tag, record: &TagRecord) -> Result<(), StoreError> {
        self.create_tag_record(tag, record).await.map(|_| ())
    }

    async fn create_tag_record(
        &self,
        tag: &Tag,
        record: &TagRecord,
    ) -> Result<TagRecord, StoreError> {
        self.create_tag_limited(tag, record, u64::MAX).await
    }

    async fn create_tag_limited(
        &self,
        tag: &Tag,
        record: &TagRecord,
        max_tags: u64,
    ) -> Result<TagRecord, StoreError> {
        let (this, tag, record) = (self.clone(), tag.clone(), record.clone());
        blocking(move || this.insert_tag(&tag, &record, max_tags)).await
    }

    async fn list_tags(&self) -> Result<TagListing, StoreError> {
        let this = self.clone();
        blocking(move || this.list_tags_blocking()).await
    }

    async fn update_tag(
        &self,
        tag: &Tag,
        update: &TagUpdate,
        now_ms: u64,
    ) -> Result<TagRecord, StoreError> {
        let (this, tag, update) = (self.clone(), tag.clone(), update.clone());
        blocking(move || this.change_tag(&tag, 0, |r| Ok(r.updated(&tag, &update, now_ms)?))).await
    }

    async fn delete_tag(&self, tag: &Tag, now_ms: u64) -> Result<TagRecord, StoreError> {
        let (this, tag) = (self.clone(), tag.clone());
        blocking(move || this.change_tag(&tag, -1, |r| Ok(r.tombstone(now_ms)))).await
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

    fn forget(&self, tag: &Tag) {
        self.known().remove(tag);
    }

    /// Rewrites a live tag's record as `change` says: a txn `cas` on the
    /// ModifyIndex of a consistent read, retried when a take on another
    /// node got in between. Drops this node's cached record either way.
    async fn change_tag(
        &self,
        tag: &Tag,
        change: impl Fn(&TagRecord) -> Result<TagRecord, StoreError> + Send + Sync,
    ) -> Result<TagRecord, StoreError> {
        let key = self.keys.segment(tag.as_str());
        let result = async {
            for attempt in 0..ADMIN_CAS_ATTEMPTS {
                let (record, index) = match self.read(tag).await? {
                    Some((r, _)) if r.deleted => None,
                    other => other,
                }
                .ok_or_else(|| StoreError::TagNotFound(tag.to_string()))?;
                let written = change(&record)?;
                let ops = [TxnOp::Cas {
                    key: key.clone(),
                    value: encode(&written),
                    index,
                }];
                match self.client.txn(&ops).await {
                    Ok(TxnOutcome::Committed(_)) => {
                        self.keys.written().wrote(&key, (0, written.max_id));
                        return Ok(written);
                    }
                    Ok(TxnOutcome::RolledBack(_)) => backoff(attempt).await,
                    Err(e) => return Err(unknown_outcome(tag, &e)),
                }
            }
            Err(contended(tag))
        }
        .await;
        self.forget(tag);
        result
    }

    async fn read(&self, tag: &Tag) -> Result<Option<(TagRecord, u64)>, StoreError> {
        let key = self.keys.segment(tag.as_str());
        let written = self.keys.written();
        let floor = written.written(&key);
        let (entry, _) = self
            .client
            .kv_get(&self.keys.segment(tag.as_str()), Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        match entry {
            None => {
                written.check("segment", &key, floor, (i64::MIN, 0))?;
                Ok(None)
            }
            Some(e) => {
                let record = decode(tag, &e.value)?;
                // Below this node's own write: a rolled-back store.
                written.check("segment", &key, floor, (0, record.max_id))?;
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
        self.create_tag_record(tag, record).await.map(|_| ())
    }

    async fn create_tag_record(
        &self,
        tag: &Tag,
        record: &TagRecord,
    ) -> Result<TagRecord, StoreError> {
        let key = self.keys.segment(tag.as_str());
        let result = async {
            // Index 0: create only if absent. Over a tombstone: its index.
            let mut index = 0;
            let mut written = record.clone();
            for attempt in 0..ADMIN_CAS_ATTEMPTS {
                let ops = [TxnOp::Cas {
                    key: key.clone(),
                    value: encode(&written),
                    index,
                }];
                match self.client.txn(&ops).await {
                    Ok(TxnOutcome::Committed(_)) => {
                        self.keys.written().wrote(&key, (0, written.max_id));
                        return Ok(written);
                    }
                    Ok(TxnOutcome::RolledBack(_)) => {}
                    Err(e) => return Err(unknown_outcome(tag, &e)),
                }
                match self.read(tag).await? {
                    Some((old, _)) if !old.deleted => {
                        return Err(StoreError::TagExists(tag.to_string()))
                    }
                    Some((tombstone, i)) => {
                        written = tombstone.revived(record);
                        index = i;
                    }
                    None => {
                        written = record.clone();
                        index = 0;
                    }
                }
                if attempt > 0 {
                    backoff(attempt).await;
                }
            }
            Err(contended(tag))
        }
        .await;
        self.forget(tag);
        result
    }

    async fn create_tag_limited(
        &self,
        tag: &Tag,
        record: &TagRecord,
        max_tags: u64,
    ) -> Result<TagRecord, StoreError> {
        if max_tags < u64::MAX {
            // Counted by one listing before the write: Consul has no count
            // that a txn could check, so nodes creating tags at the same
            // moment may overshoot the limit by a few (documented).
            let listing = self.list_tags().await?;
            let live = (listing.tags.len() + listing.unreadable.len()) as u64;
            metrics::gauge!(m::SEGMENT_TAGS).set(live as f64);
            if listing.tags.iter().any(|(t, _)| t == tag) {
                // As on the embedded store: an existing tag is that, not a limit.
                return Err(StoreError::TagExists(tag.to_string()));
            }
            if live >= max_tags {
                return Err(StoreError::limit_reached(
                    format!(
                        "segment tag {:?} cannot be created ({live} live tags)",
                        tag.as_str()
                    ),
                    max_tags,
                    "segment.max_tags",
                ));
            }
        }
        self.create_tag_record(tag, record).await
    }

    fn release(&self, tag: &Tag) {
        self.forget(tag);
        let mut takes = self
            .takes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Only the map holds it: no take is running or waiting.
        if takes.get(tag).is_some_and(|l| Arc::strong_count(l) == 1) {
            takes.remove(tag);
        }
    }

    async fn get_tag(&self, tag: &Tag) -> Result<Option<TagRecord>, StoreError> {
        Ok(self.read(tag).await?.map(|(r, _)| r).filter(|r| !r.deleted))
    }

    async fn list_tags(&self) -> Result<TagListing, StoreError> {
        // `segment("")` is the folder, with its trailing `/`.
        let dir = self.keys.segment("");
        let entries = self
            .client
            .kv_list(&dir, Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut listing = TagListing::default();
        for e in entries {
            listing.add(&e.key, e.key.strip_prefix(&dir), &e.value);
        }
        listing.tags.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(listing)
    }

    async fn update_tag(
        &self,
        tag: &Tag,
        update: &TagUpdate,
        now_ms: u64,
    ) -> Result<TagRecord, StoreError> {
        self.change_tag(tag, |r| Ok(r.updated(tag, update, now_ms)?))
            .await
    }

    async fn delete_tag(&self, tag: &Tag, now_ms: u64) -> Result<TagRecord, StoreError> {
        self.change_tag(tag, |r| Ok(r.tombstone(now_ms))).await
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
            if record.deleted {
                self.forget(tag);
                return Err(StoreError::TagNotFound(tag.to_string()));
            }
            let (range, next) = record.next_range(tag, step, now_ms)?;
            let mut ops = vec![TxnOp::Cas {
                key: key.clone(),
                value: encode(&next),
                index,
            }];
            ops.extend(self.keys.mark_check());
            match self.client.txn(&ops).await {
                Ok(TxnOutcome::Committed(results)) => {
                    self.keys.written().wrote(&key, (0, next.max_id));
                    match results.iter().find(|e| e.key == key) {
                        Some(e) => self.known().insert(tag.clone(), (next, e.modify_index)),
                        None => self.known().remove(tag),
                    };
                    return Ok(range);
                }
                Ok(TxnOutcome::RolledBack(errors)) => {
                    // Another node moved the record, or this node's mark
                    // moved (its keeper, or a restore): re-read and retry.
                    self.known().remove(tag);
                    if self.keys.mark_failed(&ops, &errors) {
                        self.keys.recheck_mark(&self.client).await?;
                        continue;
                    }
                    backoff(attempt).await;
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

/// Pauses before another compare-and-set attempt (jittered, growing to
/// 160 ms).
async fn backoff(attempt: u32) {
    let cap = 5u64 << attempt.min(5);
    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..=cap))).await;
}

fn unknown_outcome(tag: &Tag, e: &crate::consul::ConsulError) -> StoreError {
    StoreError::Backend(format!(
        "segment tag {tag}: the change may or may not have been applied ({e}); read the tag back before retrying"
    ))
}

fn contended(tag: &Tag) -> StoreError {
    StoreError::Contended(format!(
        "segment tag {tag}: lost the compare-and-set race {ADMIN_CAS_ATTEMPTS} times in a row to nodes taking ranges; retry"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consul::ConsulConfig;
    use crate::id::segment::SegmentError;

    fn tag(name: &str) -> Tag {
        Tag::parse(name).unwrap()
    }

    fn update(step: Option<u64>, description: Option<&str>, max_id: Option<u64>) -> TagUpdate {
        TagUpdate {
            step,
            description: description.map(str::to_owned),
            max_id,
        }
    }

    /// The admin operations' contract, the same on every backend.
    async fn admin_contract(store: &dyn SegmentStore) {
        let (a, b) = (tag("b-orders"), tag("a-users"));
        store
            .create_tag(&a, &TagRecord::new(100, 10, "orders", 1).unwrap())
            .await
            .unwrap();
        store
            .create_tag(&b, &TagRecord::new(0, 5, "", 1).unwrap())
            .await
            .unwrap();
        let names = tag_names(store).await;
        assert_eq!(names, ["a-users", "b-orders"], "sorted by name");
        assert_eq!(store.take_range(&a, 10, 2).await.unwrap().first, 101);

        // Update: step and description; max_id only forward.
        let r = store
            .update_tag(&a, &update(Some(20), Some("new"), Some(500)), 3)
            .await
            .unwrap();
        assert_eq!((r.step, r.description.as_str(), r.max_id), (20, "new", 500));
        assert_eq!(store.get_tag(&a).await.unwrap(), Some(r));
        // The next take starts above the moved max_id (no stale cache).
        assert_eq!(store.take_range(&a, 10, 4).await.unwrap().first, 501);
        let err = store
            .update_tag(&a, &update(None, None, Some(499)), 5)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Segment(SegmentError::MaxIdBackwards {
                    current: 510,
                    asked: 499,
                    ..
                })
            ),
            "{err:?}"
        );
        assert!(matches!(
            store
                .update_tag(&tag("nope"), &update(Some(1), None, None), 5)
                .await,
            Err(StoreError::TagNotFound(_))
        ));

        // Delete: a tombstone that reads as unknown and keeps max_id.
        let tomb = store.delete_tag(&a, 6).await.unwrap();
        assert_eq!(tomb.max_id, 510);
        assert_eq!(store.get_tag(&a).await.unwrap(), None);
        assert!(matches!(
            store.take_range(&a, 10, 7).await,
            Err(StoreError::TagNotFound(_))
        ));
        assert!(matches!(
            store.delete_tag(&a, 7).await,
            Err(StoreError::TagNotFound(_))
        ));
        assert!(matches!(
            store.update_tag(&a, &update(Some(1), None, None), 7).await,
            Err(StoreError::TagNotFound(_))
        ));
        let names = tag_names(store).await;
        assert_eq!(names, ["a-users"]);
        recreate_contract(store, &a, &b).await;
    }

    async fn tag_names(store: &dyn SegmentStore) -> Vec<String> {
        let listed = store.list_tags().await.unwrap().tags;
        listed.into_iter().map(|(t, _)| t.to_string()).collect()
    }

    /// A tag created again continues above its tombstone (`a` deleted at
    /// max_id 510, `b` live).
    async fn recreate_contract(store: &dyn SegmentStore, a: &Tag, b: &Tag) {
        let (a, b) = (a.clone(), b.clone());
        // Created again: continues above the tombstone, whatever it asks.
        let again = store
            .create_tag_record(&a, &TagRecord::new(0, 7, "again", 8).unwrap())
            .await
            .unwrap();
        assert_eq!((again.max_id, again.step, again.deleted), (510, 7, false));
        assert_eq!(store.take_range(&a, 7, 9).await.unwrap().first, 511);
        assert!(matches!(
            store
                .create_tag(&a, &TagRecord::new(0, 7, "", 9).unwrap())
                .await,
            Err(StoreError::TagExists(_))
        ));
        // Asking for more than the tombstone's max_id is honoured.
        store.delete_tag(&b, 10).await.unwrap();
        let higher = store
            .create_tag_record(&b, &TagRecord::new(1000, 5, "", 11).unwrap())
            .await
            .unwrap();
        assert_eq!(higher.max_id, 1000);
    }

    #[tokio::test]
    async fn embedded_admin_changes_never_move_ids_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let store = EmbeddedStore::create(&path, "L").unwrap();
        assert!(store.list_tags().await.unwrap().tags.is_empty());
        admin_contract(&store).await;
        // Tombstones are durable.
        store.delete_tag(&tag("a-users"), 20).await.unwrap();
        drop(store);
        let store = EmbeddedStore::open(&path, "L", false).unwrap();
        assert_eq!(store.get_tag(&tag("a-users")).await.unwrap(), None);
        let back = store
            .create_tag_record(&tag("a-users"), &TagRecord::new(0, 5, "", 21).unwrap())
            .await
            .unwrap();
        assert_eq!(back.max_id, 1000);
    }

    #[tokio::test]
    async fn one_unreadable_record_is_reported_and_the_other_tags_still_list() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::create(&dir.path().join("s.redb"), "L").unwrap();
        store
            .create_tag(&tag("orders"), &TagRecord::new(0, 5, "", 1).unwrap())
            .await
            .unwrap();
        let txn = store.db().begin_write().unwrap();
        txn.open_table(SEGMENTS)
            .unwrap()
            .insert("broken", b"{not json".as_slice())
            .unwrap();
        txn.commit().unwrap();
        let listed = store.list_tags().await.unwrap();
        assert_eq!(listed.tags.len(), 1, "{listed:?}");
        assert_eq!(listed.tags[0].0.as_str(), "orders");
        assert_eq!(listed.unreadable.len(), 1, "{listed:?}");
        assert_eq!(listed.unreadable[0].0, "broken");
        assert!(
            listed.unreadable[0].1.contains("restore it from a backup"),
            "{listed:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn consul_admin_changes_never_move_ids_back() {
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
        let store = ConsulSegmentStore::new(client(), keys.clone());
        assert!(store.list_tags().await.unwrap().tags.is_empty());
        admin_contract(&store).await;
        // Another node's cached record cannot take below an admin change:
        // its compare-and-set fails and it re-reads.
        let other = ConsulSegmentStore::new(client(), keys.clone());
        let t = tag("shared");
        store
            .create_tag(&t, &TagRecord::new(0, 10, "", 1).unwrap())
            .await
            .unwrap();
        assert_eq!(other.take_range(&t, 10, 1).await.unwrap().first, 1);
        store
            .update_tag(&t, &update(None, None, Some(1000)), 2)
            .await
            .unwrap();
        assert_eq!(other.take_range(&t, 10, 3).await.unwrap().first, 1001);
        store.delete_tag(&t, 4).await.unwrap();
        assert!(matches!(
            other.take_range(&t, 10, 5).await,
            Err(StoreError::TagNotFound(_))
        ));
        // A key outside the tag alphabet, and a record that is not JSON,
        // are reported beside the readable tags, not instead of them.
        client()
            .kv_put(
                "idgen/test/segments/Not A Tag",
                b"{}",
                crate::consul::KvWrite::Set,
            )
            .await
            .unwrap();
        client()
            .kv_put(
                "idgen/test/segments/garbled",
                b"{not json",
                crate::consul::KvWrite::Set,
            )
            .await
            .unwrap();
        let listed = store.list_tags().await.unwrap();
        assert!(listed.tags.iter().all(|(t, _)| t.as_str() != "shared"));
        assert_eq!(listed.tags.len(), 2, "{listed:?}");
        let unreadable: Vec<&str> = listed.unreadable.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            unreadable,
            [
                "idgen/test/segments/Not A Tag",
                "idgen/test/segments/garbled"
            ],
            "{listed:?}"
        );
        assert!(listed.unreadable[1].1.contains("unreadable"), "{listed:?}");
        consul.shutdown().await;
    }

    /// The mark check of every counter txn: a mark its keeper moved on is
    /// re-read and the take retried; a mark below the node's own write (a
    /// restore) refuses the take, though the tag's own record is intact.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_take_retries_past_its_keepers_mark_write_and_refuses_a_mark_gone_back() {
        use crate::consul::KvWrite;
        let consul = consul_testserver::TestConsul::start(consul_testserver::Config::default())
            .await
            .unwrap();
        let client = ConsulClient::new(ConsulConfig {
            address: format!("http://{}", consul.addr()),
            retries: 0,
            ..ConsulConfig::default()
        })
        .unwrap();
        let keys = ClusterKeys::new("idgen", "test");
        let store = ConsulSegmentStore::new(client.clone(), keys.clone());
        let t = tag("marked");
        store
            .create_tag(&t, &TagRecord::new(0, 10, "", 1).unwrap())
            .await
            .unwrap();
        let mark = "idgen/test/hwm/0/1";
        let put = |v: &'static str| {
            let client = client.clone();
            async move { client.kv_put(mark, v.as_bytes(), KvWrite::Set).await }
        };
        put("100").await.unwrap();
        let (entry, _) = client.kv_get(mark, Consistency::Consistent).await.unwrap();
        keys.mark_at(mark, entry.unwrap().modify_index);
        keys.written().wrote(mark, (0, 100));
        assert_eq!(store.take_range(&t, 10, 2).await.unwrap().first, 1);
        // The keeper writes a higher mark: the take re-reads it and goes on.
        put("200").await.unwrap();
        keys.written().wrote(mark, (0, 200));
        assert_eq!(store.take_range(&t, 10, 3).await.unwrap().first, 11);
        // The mark goes back below the node's write: refused.
        put("150").await.unwrap();
        let err = store.take_range(&t, 10, 4).await.unwrap_err().to_string();
        assert!(
            err.contains(mark) && err.contains("idgen admin skip-ahead"),
            "{err}"
        );
        consul.shutdown().await;
    }
}
