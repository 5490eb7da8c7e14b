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
//! [`SegmentStore::create_tag`] with [`CreateTag::max_tags`] refuses a new
//! (or revived) tag once `segment.max_tags` tags are live. The embedded store keeps the
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
//! the tombstone's when it would start below). Auto-creation
//! ([`CreateTag::auto`]) refuses a tombstone instead: a
//! deleted tag stays deleted until an operator creates it again. In Consul every admin write
//! is a txn `cas` on the ModifyIndex of a consistent read, so it never
//! crosses a concurrent take; and it drops this node's cached record, so
//! the next take re-reads (other nodes' caches fail their next `cas` and
//! re-read too).

mod consul;
mod embedded;
#[cfg(test)]
mod tests;

use async_trait::async_trait;
use redb::TableDefinition;

use super::StoreError;
use crate::id::segment::{Range, Tag, TagRecord, TagUpdate};

pub use consul::{ConsulSegmentStore, MAX_CAS_ATTEMPTS};

/// How [`SegmentStore::create_tag`] creates a tag: one create with
/// options, so the three ways a tag comes to be (a test or tool, an
/// admin's create, auto-creation on first use) differ only here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateTag {
    /// Refuse once this many live tags exist (`segment.max_tags`);
    /// `None` creates without counting (and, in Consul, without listing).
    pub max_tags: Option<u64>,
    /// Whether a deleted tag is created again above its old `max_id` (an
    /// explicit create) or refused (auto-creation: a deleted tag stays
    /// deleted until an operator creates it again).
    pub revive_deleted: bool,
}

impl CreateTag {
    /// An explicit create with no limit (tests, tools).
    pub const UNLIMITED: Self = Self {
        max_tags: None,
        revive_deleted: true,
    };

    /// An admin's create under `segment.max_tags`.
    pub fn limited(max_tags: u64) -> Self {
        Self {
            max_tags: Some(max_tags),
            revive_deleted: true,
        }
    }

    /// Auto-creation (`segment.auto_create`) under `segment.max_tags`: a
    /// deleted tag is refused, not revived.
    pub fn auto(max_tags: u64) -> Self {
        Self {
            max_tags: Some(max_tags),
            revive_deleted: false,
        }
    }
}

impl Default for CreateTag {
    fn default() -> Self {
        Self::UNLIMITED
    }
}

/// Segment tag records and range reservations.
#[async_trait]
pub trait SegmentStore: Send + Sync + 'static {
    /// Creates `tag` with `record` as `options` say and returns the
    /// record written; [`SegmentError::TagExists`](crate::id::segment::SegmentError::TagExists)
    /// if it exists. A deleted tag is created again above its old `max_id`
    /// (the record written then has the higher `max_id`), or refused with
    /// [`SegmentError::TagDeleted`](crate::id::segment::SegmentError::TagDeleted)
    /// in the same write when [`CreateTag::revive_deleted`] is false.
    /// With [`CreateTag::max_tags`] set, refused with
    /// [`SegmentError::LimitReached`](crate::id::segment::SegmentError::LimitReached)
    /// once that many live tags exist. Backends without tombstones or
    /// limits (the in-memory test stores) create and echo `record`.
    async fn create_tag(
        &self,
        tag: &Tag,
        record: &TagRecord,
        options: CreateTag,
    ) -> Result<TagRecord, StoreError>;

    /// Reads a tag's record (strongest consistency the backend offers);
    /// `None` for an unknown or deleted tag.
    async fn get_tag(&self, tag: &Tag) -> Result<Option<TagRecord>, StoreError>;

    /// Takes the next `step` IDs of `tag`: `(max_id, max_id + step]`,
    /// durably reserved for the caller before it returns.
    /// [`SegmentError::TagNotFound`](crate::id::segment::SegmentError::TagNotFound) for an unknown or deleted tag.
    async fn take_range(&self, tag: &Tag, step: u64, now_ms: u64) -> Result<Range, StoreError>;

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
    /// [`SegmentError::TagNotFound`](crate::id::segment::SegmentError::TagNotFound) for an unknown or deleted tag.
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
    /// (returned); [`SegmentError::TagNotFound`](crate::id::segment::SegmentError::TagNotFound) for an unknown or deleted
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
