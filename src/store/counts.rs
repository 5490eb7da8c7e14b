//! Live-entry counts of the embedded state file, kept so limits are
//! checked without a scan.
//!
//! The `live_counts` table holds how many live segment tags, strict keys
//! per namespace and strict namespaces the file has. Every write that
//! creates or deletes one of them updates its count in the same write
//! transaction, so a count can never disagree with the data it counts.
//! A file that has no counts yet (made before limits existed, or restored
//! without this table) is counted by one scan, in the first write
//! transaction that needs a count, and never again.

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use super::embedded::backend_err;
use super::StoreError;

/// `"<what>"` -> live entries.
pub(crate) const COUNTS: TableDefinition<&str, u64> = TableDefinition::new("live_counts");
/// Present once the counts below were computed.
const COUNTED: &str = "counted";
/// Live (not deleted) segment tags.
pub(crate) const SEGMENT_TAGS: &str = "segment_tags";
/// Namespaces with at least one live strict key.
pub(crate) const STRICT_NAMESPACES: &str = "strict_namespaces";
/// Live strict keys over all namespaces.
pub(crate) const STRICT_KEYS_TOTAL: &str = "strict_keys";

/// The count record of one namespace's live strict keys.
pub(crate) fn strict_keys(namespace: &str) -> String {
    format!("strict_keys/{namespace}")
}

/// Opens the counts table of `txn`, counting the file first if it was
/// never counted.
pub(crate) fn open<'t>(
    txn: &'t WriteTransaction,
) -> Result<Table<'t, &'static str, u64>, StoreError> {
    let mut counts = txn.open_table(COUNTS).map_err(backend_err)?;
    if counts.get(COUNTED).map_err(backend_err)?.is_none() {
        count_everything(txn, &mut counts)?;
        counts.insert(COUNTED, 1).map_err(backend_err)?;
    }
    Ok(counts)
}

/// The count under `key` (0 if absent).
pub(crate) fn get(counts: &Table<'_, &'static str, u64>, key: &str) -> Result<u64, StoreError> {
    Ok(counts
        .get(key)
        .map_err(backend_err)?
        .map_or(0, |v| v.value()))
}

/// Adds `delta` to the count under `key` (never below 0; a zero count is
/// removed, so deleted namespaces leave no record).
pub(crate) fn add(
    counts: &mut Table<'_, &'static str, u64>,
    key: &str,
    delta: i64,
) -> Result<u64, StoreError> {
    let now = get(counts, key)?.saturating_add_signed(delta);
    if now == 0 {
        counts.remove(key).map_err(backend_err)?;
    } else {
        counts.insert(key, now).map_err(backend_err)?;
    }
    Ok(now)
}

/// One scan of the segment and strict tables.
fn count_everything(
    txn: &WriteTransaction,
    counts: &mut Table<'_, &'static str, u64>,
) -> Result<(), StoreError> {
    let mut tags = 0u64;
    {
        let segments = txn
            .open_table(super::segment::SEGMENTS)
            .map_err(backend_err)?;
        for item in segments.iter().map_err(backend_err)? {
            let (_, v) = item.map_err(backend_err)?;
            // An unreadable record counts as live: it still takes space.
            let deleted = serde_json::from_slice::<crate::id::segment::TagRecord>(v.value())
                .map(|r| r.deleted)
                .unwrap_or(false);
            tags += u64::from(!deleted);
        }
    }
    counts.insert(SEGMENT_TAGS, tags).map_err(backend_err)?;
    let mut per_namespace = std::collections::BTreeMap::<String, u64>::new();
    {
        let strict = txn.open_table(super::strict::STRICT).map_err(backend_err)?;
        for item in strict.iter().map_err(backend_err)? {
            let (k, _) = item.map_err(backend_err)?;
            let ns = k.value().split('/').next().unwrap_or_default().to_owned();
            *per_namespace.entry(ns).or_default() += 1;
        }
    }
    let total: u64 = per_namespace.values().sum();
    counts
        .insert(STRICT_NAMESPACES, per_namespace.len() as u64)
        .map_err(backend_err)?;
    counts
        .insert(STRICT_KEYS_TOTAL, total)
        .map_err(backend_err)?;
    for (ns, n) in per_namespace {
        counts
            .insert(strict_keys(&ns).as_str(), n)
            .map_err(backend_err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::segment::{SegmentError, Tag, TagRecord};
    use crate::id::strict::{StrictError, StrictKey};
    use crate::store::segment::{CreateTag, SegmentStore};
    use crate::store::strict::{EmbeddedStrictStore, StrictLimits, StrictStore};
    use crate::store::{EmbeddedStore, StoreError};

    /// A file written before limits existed (no counts table) is counted
    /// by one scan on first use: live tags and keys count, tombstones do
    /// not, and the limits hold from the first creation on.
    #[tokio::test]
    async fn a_file_without_counts_is_counted_on_first_use() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::create(&dir.path().join("s.redb"), "L").unwrap();
        for name in ["a", "b", "c"] {
            let t = Tag::parse(name).unwrap();
            store
                .create_tag(
                    &t,
                    &TagRecord::new(0, 5, "", 1).unwrap(),
                    CreateTag::UNLIMITED,
                )
                .await
                .unwrap();
        }
        store
            .delete_tag(&Tag::parse("c").unwrap(), 2)
            .await
            .unwrap();
        let strict = EmbeddedStrictStore::new(store.clone());
        for k in ["n1/a", "n1/b", "n2/a"] {
            strict
                .advance(&StrictKey::parse(k).unwrap(), 1, 1)
                .await
                .unwrap();
        }
        drop(strict);
        // Forget the counts, as in a file from before limits.
        let txn = store.db().begin_write().unwrap();
        txn.delete_table(COUNTS).unwrap();
        txn.commit().unwrap();

        let txn = store.db().begin_write().unwrap();
        {
            let counts = open(&txn).unwrap();
            assert_eq!(get(&counts, SEGMENT_TAGS).unwrap(), 2, "c is a tombstone");
            assert_eq!(get(&counts, STRICT_NAMESPACES).unwrap(), 2);
            assert_eq!(get(&counts, STRICT_KEYS_TOTAL).unwrap(), 3);
            assert_eq!(get(&counts, &strict_keys("n1")).unwrap(), 2);
            assert_eq!(get(&counts, &strict_keys("n2")).unwrap(), 1);
        }
        txn.abort().unwrap();

        // And the limits hold against those counts.
        let err = store
            .create_tag(
                &Tag::parse("d").unwrap(),
                &TagRecord::new(0, 5, "", 3).unwrap(),
                CreateTag::limited(2),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Segment(SegmentError::LimitReached(_))),
            "{err:?}"
        );
        let strict = EmbeddedStrictStore::with_limits(
            store.clone(),
            StrictLimits {
                max_keys_per_namespace: 2,
                max_namespaces: 2,
            },
        );
        let err = strict
            .advance(&StrictKey::parse("n1/c").unwrap(), 1, 1)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Strict(StrictError::LimitReached(_))),
            "{err:?}"
        );
        let err = strict
            .advance(&StrictKey::parse("n3/a").unwrap(), 1, 1)
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Strict(StrictError::LimitReached(_))),
            "{err:?}"
        );
        strict
            .advance(&StrictKey::parse("n2/b").unwrap(), 1, 1)
            .await
            .unwrap();
    }
}
