//! Segment records in Consul KV: `<prefix>/<cluster>/segments/<tag>` holds
//! the record as JSON, written by a txn `cas` on the ModifyIndex last seen.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::{decode, encode, CreateTag, SegmentStore, TagListing, ADMIN_CAS_ATTEMPTS};
use crate::consul::{Consistency, ConsulClient, ConsulError, KvEntry, TxnOp};
use crate::id::segment::SegmentError;
use crate::id::segment::{Range, Tag, TagRecord, TagUpdate};
use crate::metrics as m;
use crate::store::cas::{compare_and_set, Attempt, CasPolicy, CasWrite};
use crate::store::kv_paths::ClusterPaths;
use crate::store::StoreError;

/// How often a take that lost a compare-and-set race is tried in all
/// (with jittered backoff growing to 160 ms: about 4 s at worst). A node
/// that just took a range races with a fresh index and no read, so under a
/// burst of refills the others may lose many times in a row.
pub const MAX_CAS_ATTEMPTS: u32 = 32;

/// Segment records in Consul KV.
pub struct ConsulSegmentStore {
    client: ConsulClient,
    keys: ClusterPaths,
    /// Each tag's record and ModifyIndex as last read or written by this
    /// node; dropped after any failure, so the next take re-reads.
    known: Mutex<HashMap<Tag, (TagRecord, u64)>>,
    /// One take per tag at a time on this node: racing itself would only
    /// make it lose compare-and-sets against its own writes.
    takes: Mutex<HashMap<Tag, Arc<tokio::sync::Mutex<()>>>>,
}

impl ConsulSegmentStore {
    /// Records under `keys`' `segments/` folder.
    pub fn new(client: ConsulClient, keys: ClusterPaths) -> Self {
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
        let write = AdminWrite {
            store: self,
            tag,
            key: self.keys.segment(tag.as_str()),
            what: AdminChange::Change(&change),
        };
        let result = compare_and_set(&self.client, &self.keys, ADMIN_POLICY, &write).await;
        self.forget(tag);
        result
    }

    /// Refuses a new tag once `max_tags` live tags exist (and an existing
    /// one as existing); counted by one listing before the write.
    async fn check_limit(&self, tag: &Tag, max_tags: u64) -> Result<(), StoreError> {
        if max_tags < u64::MAX {
            // Counted by one listing before the write: Consul has no count
            // that a txn could check, so nodes creating tags at the same
            // moment may overshoot the limit by a few (documented).
            let listing = self.list_tags().await?;
            let live = (listing.tags.len() + listing.unreadable.len()) as u64;
            metrics::gauge!(m::SEGMENT_TAGS).set(live as f64);
            if listing.tags.iter().any(|(t, _)| t == tag) {
                // As on the embedded store: an existing tag is that, not a limit.
                return Err(StoreError::Segment(SegmentError::TagExists(
                    tag.to_string(),
                )));
            }
            if live >= max_tags {
                return Err(StoreError::Segment(
                    crate::store::limit_reached(
                        format!(
                            "segment tag {:?} cannot be created ({live} live tags)",
                            tag.as_str()
                        ),
                        max_tags,
                        "segment.max_tags",
                    )
                    .into(),
                ));
            }
        }
        Ok(())
    }

    /// Creates `tag` with a txn `cas`; over a tombstone it continues
    /// above it when `revive`, and is refused as deleted otherwise.
    async fn create(
        &self,
        tag: &Tag,
        record: &TagRecord,
        revive: bool,
    ) -> Result<TagRecord, StoreError> {
        let write = AdminWrite {
            store: self,
            tag,
            key: self.keys.segment(tag.as_str()),
            what: AdminChange::Create {
                record,
                blind: AtomicBool::new(true),
                revive,
            },
        };
        let result = compare_and_set(&self.client, &self.keys, ADMIN_POLICY, &write).await;
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
    async fn create_tag(
        &self,
        tag: &Tag,
        record: &TagRecord,
        options: CreateTag,
    ) -> Result<TagRecord, StoreError> {
        if let Some(max_tags) = options.max_tags {
            self.check_limit(tag, max_tags).await?;
        }
        self.create(tag, record, options.revive_deleted).await
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
        let lock = self.take_lock(tag);
        let _one_at_a_time = lock.lock().await;
        let take = Take {
            store: self,
            tag,
            key: self.keys.segment(tag.as_str()),
            step,
            now_ms,
        };
        let (range, _) = compare_and_set(&self.client, &self.keys, TAKE_POLICY, &take).await?;
        Ok(range)
    }
}

/// The policy of takes: [`MAX_CAS_ATTEMPTS`], pauses growing to 160 ms.
const TAKE_POLICY: CasPolicy = CasPolicy {
    attempts: MAX_CAS_ATTEMPTS,
    max_pause: Duration::from_millis(160),
};

/// One take of `step` IDs of `tag`, planned from this node's cached record
/// (a node that keeps taking never re-reads) or a consistent read.
struct Take<'a> {
    store: &'a ConsulSegmentStore,
    tag: &'a Tag,
    key: String,
    step: u64,
    now_ms: u64,
}

#[async_trait]
impl CasWrite for Take<'_> {
    type Output = (Range, TagRecord);

    async fn plan(&self) -> Result<Attempt<(Range, TagRecord)>, StoreError> {
        let (store, tag) = (self.store, self.tag);
        let cached = store.known().get(tag).cloned();
        let read = cached.is_none();
        let (record, index) = match cached {
            Some(c) => c,
            None => store
                .read(tag)
                .await?
                .ok_or_else(|| StoreError::Segment(SegmentError::TagNotFound(tag.to_string())))?,
        };
        if record.deleted {
            store.forget(tag);
            return Err(StoreError::Segment(SegmentError::TagNotFound(
                tag.to_string(),
            )));
        }
        let (range, next) = record.next_range(tag, self.step, self.now_ms)?;
        Ok(Attempt {
            ops: vec![TxnOp::Cas {
                key: self.key.clone(),
                value: encode(&next),
                index,
            }],
            key: self.key.clone(),
            level: (0, next.max_id),
            value: (range, next),
            read,
        })
    }

    fn lost(&self, _mark_moved: bool) {
        // Another node moved the record, or this node's mark moved (its
        // keeper, or a restore): re-read before the next attempt.
        self.store.forget(self.tag);
    }

    fn committed(&self, attempt: &Attempt<(Range, TagRecord)>, results: &[KvEntry]) {
        let next = attempt.value.1.clone();
        match results.iter().find(|e| e.key == self.key) {
            Some(e) => self
                .store
                .known()
                .insert(self.tag.clone(), (next, e.modify_index)),
            None => self.store.known().remove(self.tag),
        };
    }

    fn unknown(&self, e: ConsulError) -> StoreError {
        // Maybe applied: never use this range, re-read next time.
        self.store.forget(self.tag);
        StoreError::Backend(e.to_string())
    }

    fn contended(&self, attempts: u32) -> StoreError {
        StoreError::Contended(format!(
            "segment tag {}: lost the compare-and-set race {attempts} times in a row; too many nodes refill it at once (raise its step)",
            self.tag
        ))
    }
}

/// The policy of admin writes: [`ADMIN_CAS_ATTEMPTS`], pauses growing to
/// 160 ms.
const ADMIN_POLICY: CasPolicy = CasPolicy {
    attempts: ADMIN_CAS_ATTEMPTS,
    max_pause: Duration::from_millis(160),
};

/// An admin write of a tag's record: a create (over nothing or over a
/// tombstone) or a change of a live record; a txn `cas` on the
/// ModifyIndex of a consistent read, so it never crosses a take.
struct AdminWrite<'a> {
    store: &'a ConsulSegmentStore,
    tag: &'a Tag,
    key: String,
    what: AdminChange<'a>,
}

/// What an [`AdminWrite`] writes.
enum AdminChange<'a> {
    /// Create with `record`: the first attempt writes it without a read
    /// (index 0: only if absent), later ones read first and create over a
    /// tombstone above its `max_id`.
    Create {
        record: &'a TagRecord,
        blind: AtomicBool,
        /// Whether a tombstone is revived (an explicit create) or refused
        /// (auto-creation).
        revive: bool,
    },
    /// The live record as this function rewrites it.
    Change(&'a (dyn Fn(&TagRecord) -> Result<TagRecord, StoreError> + Send + Sync)),
}

#[async_trait]
impl CasWrite for AdminWrite<'_> {
    type Output = TagRecord;

    async fn plan(&self) -> Result<Attempt<TagRecord>, StoreError> {
        let (store, tag) = (self.store, self.tag);
        let (written, index) = match &self.what {
            AdminChange::Create {
                record,
                blind,
                revive,
            } => {
                if blind.swap(false, Ordering::Relaxed) {
                    ((*record).clone(), 0)
                } else {
                    match store.read(tag).await? {
                        Some((old, _)) if !old.deleted => {
                            return Err(StoreError::Segment(SegmentError::TagExists(
                                tag.to_string(),
                            )))
                        }
                        Some((tombstone, _)) if !*revive => {
                            return Err(StoreError::Segment(SegmentError::TagDeleted {
                                tag: tag.to_string(),
                                deleted_ms: tombstone.updated_ms,
                            }))
                        }
                        Some((tombstone, i)) => (tombstone.revived(tag, record)?, i),
                        None => ((*record).clone(), 0),
                    }
                }
            }
            AdminChange::Change(change) => {
                let (record, index) = match store.read(tag).await? {
                    Some((r, _)) if r.deleted => None,
                    other => other,
                }
                .ok_or_else(|| StoreError::Segment(SegmentError::TagNotFound(tag.to_string())))?;
                (change(&record)?, index)
            }
        };
        Ok(Attempt {
            ops: vec![TxnOp::Cas {
                key: self.key.clone(),
                value: encode(&written),
                index,
            }],
            key: self.key.clone(),
            level: (0, written.max_id),
            value: written,
            read: true,
        })
    }

    fn unknown(&self, e: ConsulError) -> StoreError {
        unknown_outcome(self.tag, &e)
    }

    fn contended(&self, _attempts: u32) -> StoreError {
        contended(self.tag)
    }
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
