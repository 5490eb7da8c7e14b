//! Segment records in the embedded state file: table `segments`, one redb
//! write transaction per take (durable on commit), the live tag count in
//! the same transaction.

use async_trait::async_trait;
use redb::ReadableTable;

use super::{decode, encode, CreateTag, SegmentStore, TagListing, SEGMENTS};
use crate::id::segment::SegmentError;
use crate::id::segment::{Range, Tag, TagRecord, TagUpdate};
use crate::metrics as m;
use crate::store::counts;
use crate::store::embedded::{backend_err, blocking, EmbeddedStore};
use crate::store::StoreError;

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
        revive: bool,
    ) -> Result<TagRecord, StoreError> {
        let txn = self.begin_write()?;
        let (written, live, before) = {
            let mut counts = counts::open(&txn)?;
            let mut table = txn.open_table(SEGMENTS).map_err(backend_err)?;
            let old = match table.get(tag.as_str()).map_err(backend_err)? {
                Some(v) => Some(decode(tag, v.value())?),
                None => None,
            };
            let before = old.as_ref().map_or(0, |r| r.max_id);
            let written = match old {
                Some(old) if !old.deleted => {
                    return Err(StoreError::Segment(SegmentError::TagExists(
                        tag.to_string(),
                    )))
                }
                Some(tombstone) if !revive => {
                    return Err(StoreError::Segment(SegmentError::TagDeleted {
                        tag: tag.to_string(),
                        deleted_ms: tombstone.updated_ms,
                    }))
                }
                Some(tombstone) => tombstone.revived(tag, record)?,
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
            table
                .insert(tag.as_str(), encode(&written).as_slice())
                .map_err(backend_err)?;
            let live = counts::add(&mut counts, counts::SEGMENT_TAGS, 1)?;
            (written, live, before)
        };
        // The max_id a tag is created with (its start, a floor, a
        // tombstone's) was never issued: not an issue rate.
        let moved = written.max_id.saturating_sub(before);
        self.admin_moves()
            .record(&format!("segment/{}", tag.as_str()), moved, || {
                self.commit(txn)
            })?;
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
        let (written, before) = {
            let mut counts = counts::open(&txn)?;
            let mut table = txn.open_table(SEGMENTS).map_err(backend_err)?;
            let record = live_record(&table, tag)?;
            let written = change(&record)?;
            table
                .insert(tag.as_str(), encode(&written).as_slice())
                .map_err(backend_err)?;
            if live_delta != 0 {
                let live = counts::add(&mut counts, counts::SEGMENT_TAGS, live_delta)?;
                metrics::gauge!(m::SEGMENT_TAGS).set(live as f64);
            }
            (written, record.max_id)
        };
        // An admin raise of max_id (`tags update --max-id`) issued nothing:
        // recorded so the backup's rates leave it out.
        let moved = written.max_id.saturating_sub(before);
        self.admin_moves()
            .record(&format!("segment/{}", tag.as_str()), moved, || {
                self.commit(txn)
            })?;
        Ok(written)
    }

    fn advance_tag(&self, tag: &Tag, step: u64, now_ms: u64) -> Result<Range, StoreError> {
        let txn = self.begin_write()?;
        let range = {
            let mut table = txn.open_table(SEGMENTS).map_err(backend_err)?;
            let record = live_record(&table, tag)?;
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
    async fn create_tag(
        &self,
        tag: &Tag,
        record: &TagRecord,
        options: CreateTag,
    ) -> Result<TagRecord, StoreError> {
        let (this, tag, record) = (self.clone(), tag.clone(), record.clone());
        let max_tags = options.max_tags.unwrap_or(u64::MAX);
        let revive = options.revive_deleted;
        blocking(move || this.insert_tag(&tag, &record, max_tags, revive)).await
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

/// `tag`'s record in `table` if the tag exists and is not deleted;
/// [`SegmentError::TagNotFound`] otherwise (a deleted tag reads as absent).
fn live_record(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    tag: &Tag,
) -> Result<TagRecord, StoreError> {
    let not_found = || StoreError::Segment(SegmentError::TagNotFound(tag.to_string()));
    let Some(v) = table.get(tag.as_str()).map_err(backend_err)? else {
        return Err(not_found());
    };
    let record = decode(tag, v.value())?;
    if record.deleted {
        return Err(not_found());
    }
    Ok(record)
}
