//! How fast counters move: samples of every counter while the node runs
//! (admin moves left out, [`AdminMoves`]) and the rates a backup records
//! (what a restore tells the operator of them is `restore.rs`'s
//! [`facts`](super::facts)).
//! Rates are information only: measured before the backup, they bound
//! nothing issued after it, so no margin is derived from them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use redb::{ReadTransaction, ReadableTable};

use crate::id::segment::TagRecord;
use crate::store::embedded::{backend_err, HWM};
use crate::store::format::counters::{CounterRecordBytes, FORMATS};
use crate::store::lease::LEASE;
use crate::store::segment::SEGMENTS;
use crate::store::strict::STRICT;
use crate::store::StoreError;

/// How long rate samples are kept: rates are measured over about this
/// window (or since the node started, if that is shorter).
pub const RATE_WINDOW_MS: u64 = 5 * 60 * 1000;

/// How often a running node samples its counters for the rates.
pub const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Every counter's current value, keyed by kind and name:
/// `hwm/<dc>/<worker>`, `segment/<tag>`, `lease/<zone>/<token>`,
/// `strict/<namespace>/<key>`, `format/<format>/<node>/<scope>` (the last
/// value reserved in its current period); plus each kind's total as
/// `<kind>/*` (a wrapping sum: counters only grow, so differences of totals
/// are exact; formatted counters start again each period, see
/// [`RateSampler::rates`]).
pub type Counters = BTreeMap<String, u64>;

/// Most counters a running node samples one by one; beyond that only the
/// kinds' totals are kept (their rates bound every counter's from above).
pub const MAX_TRACKED_COUNTERS: usize = 10_000;

/// Every counter `txn` sees, one by one up to `limit` of them, and each
/// kind's total (see [`Counters`]).
pub(super) fn read_counters(txn: &ReadTransaction, limit: usize) -> Result<Counters, StoreError> {
    let mut each: Vec<(String, u64)> = Vec::new();
    let mut totals: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut seen = 0usize;
    let mut add = |kind: &'static str, name: &str, v: u64, each: &mut Vec<(String, u64)>| {
        let t = totals.entry(kind).or_insert(0);
        *t = t.wrapping_add(v);
        seen += 1;
        if seen <= limit {
            each.push((format!("{kind}/{name}"), v));
        }
    };
    let u64_tables = [(HWM, "hwm"), (LEASE, "lease"), (STRICT, "strict")];
    for (def, kind) in u64_tables {
        let table = match txn.open_table(def) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => continue,
            Err(e) => return Err(backend_err(e)),
        };
        for item in table.iter().map_err(backend_err)? {
            let (k, v) = item.map_err(backend_err)?;
            add(kind, k.value(), v.value(), &mut each);
        }
    }
    match txn.open_table(SEGMENTS) {
        Ok(table) => {
            for item in table.iter().map_err(backend_err)? {
                let (k, v) = item.map_err(backend_err)?;
                let record: TagRecord = serde_json::from_slice(v.value()).map_err(|e| {
                    StoreError::Backend(format!("segment record {} unreadable: {e}", k.value()))
                })?;
                add("segment", k.value(), record.max_id, &mut each);
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(backend_err(e)),
    }
    match txn.open_table(FORMATS) {
        Ok(table) => {
            for item in table.iter().map_err(backend_err)? {
                let (k, v) = item.map_err(backend_err)?;
                let last = CounterRecordBytes::last(k.value(), v.value())?;
                add("format", k.value(), last, &mut each);
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(backend_err(e)),
    }
    let mut out: Counters = if seen <= limit {
        each.into_iter().collect()
    } else {
        Counters::new()
    };
    for (kind, total) in totals {
        out.insert(format!("{kind}/*"), total);
    }
    Ok(out)
}

/// Recent samples of every counter, so a backup can record how fast each
/// one moves.
#[derive(Debug, Default)]
pub struct RateSampler {
    samples: VecDeque<(u64, Counters)>,
}

impl RateSampler {
    /// Records the counters at `now_ms`, dropping samples older than the
    /// window (always keeping the oldest one inside it).
    pub fn record(&mut self, now_ms: u64, counters: Counters) {
        self.samples.push_back((now_ms, counters));
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|(t, _)| now_ms.saturating_sub(*t) >= RATE_WINDOW_MS)
        {
            self.samples.pop_front();
        }
    }

    /// Per counter, how fast it moved up to `current` (per second): the
    /// highest average over the spans from each kept sample at least 1 s
    /// old to now, so a recent burst counts as much as a steady rate.
    /// Counters first seen after a sample count from zero there. Empty
    /// when no sample is at least 1 s old.
    pub fn rates(&self, now_ms: u64, current: &Counters) -> BTreeMap<String, f64> {
        let mut out: BTreeMap<String, f64> = BTreeMap::new();
        for (t, old) in &self.samples {
            let secs = now_ms.saturating_sub(*t) as f64 / 1000.0;
            if secs < 1.0 {
                continue;
            }
            for (k, v) in current {
                let mut before = old.get(k).copied().unwrap_or(0);
                if k.starts_with("format/") && *v < before {
                    // A new period began since: it counted up from its
                    // minimum (at most `v`) within the span.
                    before = 0;
                }
                // Counters only grow; totals wrap (see [`Counters`]).
                let rate = v.wrapping_sub(before) as f64 / secs;
                let best = out.entry(k.clone()).or_insert(0.0);
                *best = best.max(rate);
            }
        }
        out
    }
}

/// Counter moves made by admin calls (a segment tag created with a
/// `max_id`, or raised by `idgen admin tags update --max-id`), kept so the
/// rate sampler counts only what was issued: an admin raise of a million
/// is not a million IDs a second.
///
/// An admin write commits while holding the lock and records its move
/// before releasing it, and the sampler opens its read transaction under
/// the same lock, so a sample either sees the moved value with the move
/// recorded, or neither.
#[derive(Debug, Default)]
pub struct AdminMoves {
    moved: Mutex<BTreeMap<String, u64>>,
}

impl AdminMoves {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u64>> {
        self.moved.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `commit`, an admin write moving counter `key` (as in
    /// [`Counters`]) forward by `by`, and records the move if it
    /// committed.
    pub(crate) fn record<T, E>(
        &self,
        key: &str,
        by: u64,
        commit: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let mut moved = self.lock();
        let out = commit()?;
        if by > 0 {
            let m = moved.entry(key.to_owned()).or_insert(0);
            *m = m.wrapping_add(by);
        }
        Ok(out)
    }

    /// Every counter `db` holds now (see [`read_counters`]) less the admin
    /// moves, so differences between two reads are what was issued.
    pub(crate) fn issued_counters(
        &self,
        db: &crate::store::reopen::DbRef,
        limit: usize,
    ) -> Result<(ReadTransaction, Counters), StoreError> {
        let (txn, moved) = {
            let moved = self.lock();
            (db.begin_read().map_err(backend_err)?, moved.clone())
        };
        let mut counters = read_counters(&txn, limit)?;
        for (key, by) in moved {
            if let Some(v) = counters.get_mut(&key) {
                *v = v.wrapping_sub(by);
            }
            let kind = key.split('/').next().unwrap_or_default();
            if let Some(total) = counters.get_mut(&format!("{kind}/*")) {
                *total = total.wrapping_sub(by);
            }
        }
        Ok((txn, counters))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;
    use crate::store::CreateTag;

    #[test]
    fn past_the_cap_only_totals_are_sampled() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::create(&dir.path().join("s.redb"), "L").unwrap();
        let txn = store.begin_write().unwrap();
        {
            let mut t = txn.open_table(STRICT).unwrap();
            for (k, v) in [("a/1", 10u64), ("a/2", 20), ("a/3", 30)] {
                t.insert(k, v).unwrap();
            }
        }
        store.commit(txn).unwrap();
        let read = store.db().begin_read().unwrap();
        let all = read_counters(&read, 10).unwrap();
        assert_eq!(all.get("strict/a/2"), Some(&20));
        assert_eq!(all.get("strict/*"), Some(&60));
        let capped = read_counters(&read, 2).unwrap();
        assert_eq!(capped.get("strict/a/2"), None);
        assert_eq!(capped.get("strict/*"), Some(&60));
    }

    /// `idgen admin tags update --max-id` (and a tag's creation) moves a
    /// counter without issuing anything: the sampler leaves it out, so a
    /// raise by a million is not read as a million IDs a second.
    #[tokio::test]
    async fn admin_moves_are_not_issue_rates() {
        use crate::id::segment::{Tag, TagUpdate};
        use crate::store::SegmentStore;
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::create(&dir.path().join("s.redb"), "L").unwrap();
        let tag = Tag::parse("orders").unwrap();
        store
            .create_tag(
                &tag,
                &TagRecord::new(500, 100, "", 0).unwrap(),
                CreateTag::UNLIMITED,
            )
            .await
            .unwrap();
        let mut sampler = RateSampler::default();
        let read = |store: &EmbeddedStore| {
            store
                .admin_moves()
                .issued_counters(&store.db(), usize::MAX)
                .unwrap()
                .1
        };
        sampler.record(0, read(&store));
        store.take_range(&tag, 100, 0).await.unwrap();
        let update = TagUpdate {
            max_id: Some(1_000_600),
            ..TagUpdate::default()
        };
        store.update_tag(&tag, &update, 0).await.unwrap();
        store.take_range(&tag, 100, 0).await.unwrap();
        let rates = sampler.rates(10_000, &read(&store));
        // 200 IDs taken in 10 s; the raise of 1,000,000 is not counted.
        assert_eq!(rates.get("segment/orders").copied(), Some(20.0));
        assert_eq!(rates.get("segment/*").copied(), Some(20.0));
    }

    #[test]
    fn rates_take_the_fastest_recent_span() {
        let mut s = RateSampler::default();
        let c = |v: u64| Counters::from([("lease/0/0".to_owned(), v)]);
        assert!(s.rates(0, &c(0)).is_empty());
        s.record(0, c(0));
        s.record(100_000, c(100));
        // 100 in the first 100 s, then 1000 in the last 10 s.
        let r = s.rates(110_000, &c(1100));
        assert_eq!(r.get("lease/0/0").copied(), Some(100.0));
        // Samples older than the window go, keeping one inside it.
        s.record(400_000, c(2000));
        s.record(500_000, c(3000));
        assert_eq!(s.samples.front().map(|x| x.0), Some(100_000));
    }

    /// A formatted counter that started a new period since a sample went
    /// down: it counted up from its minimum within the span, not "wrapped".
    #[test]
    fn formatted_counters_in_a_new_period_count_from_zero() {
        let mut s = RateSampler::default();
        let c = |v: u64| Counters::from([("format/daily/cluster/_".to_owned(), v)]);
        s.record(0, c(90_000));
        let r = s.rates(10_000, &c(500));
        assert_eq!(r.get("format/daily/cluster/_").copied(), Some(50.0));
    }
}
