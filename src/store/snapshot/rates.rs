//! How fast counters move: samples of every counter while the node runs,
//! the rates a backup records, and the margin suggested from them when
//! restoring.

use std::collections::{BTreeMap, VecDeque};

use redb::{ReadTransaction, ReadableTable};

use super::SnapshotInfo;
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
/// kinds' totals are kept (their rates bound every counter's from above,
/// so the suggested margin stays safe, only larger).
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

/// A margin suggested for restoring a snapshot now.
#[derive(Debug, Clone)]
pub struct Suggestion {
    /// The suggested `--skip-ahead`.
    pub margin: u64,
    /// How it was worked out, for the operator.
    pub explanation: String,
}

/// Suggests a margin: twice what the fastest counter (segment, lease or
/// strict) could have moved since the snapshot at its recorded rate, plus
/// two of the largest reservations a node makes at once (a segment range
/// at the largest step, a lease block), rounded up to a thousand.
pub fn suggest(info: &SnapshotInfo, now_ms: u64) -> Suggestion {
    let age_s = now_ms.saturating_sub(info.taken_at_ms) as f64 / 1000.0;
    // Per kind: the fastest single counter when counters were sampled one
    // by one, else the kind's total (an upper bound for each of them).
    let mut fastest = String::new();
    let mut rate = 0.0f64;
    for kind in ["segment", "lease", "strict"] {
        let prefix = format!("{kind}/");
        let total_key = format!("{kind}/*");
        let each: Vec<(&String, &f64)> = info
            .rates
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix) && **k != total_key)
            .collect();
        let candidates: Vec<(&String, &f64)> = if each.is_empty() {
            info.rates.get_key_value(&total_key).into_iter().collect()
        } else {
            each
        };
        for (k, r) in candidates {
            if *r > rate {
                fastest = k.clone();
                rate = *r;
            }
        }
    }
    let moved = (2.0 * rate * age_s).ceil();
    let moved = if moved.is_finite() && moved < 1e18 {
        moved as u64
    } else {
        u64::MAX / 4
    };
    let lump = 2 * info.largest_step.max(info.lease_block).max(1);
    let raw = moved.saturating_add(lump);
    let margin = raw.div_ceil(1000).saturating_mul(1000).max(1000);
    let age = humantime::format_duration(std::time::Duration::from_secs(age_s as u64));
    // A rescue snapshot holds everything the node issued: nothing moved
    // after it, whatever its age.
    let (rate, moved, raw, margin) = if info.taken_after_loss {
        (
            0.0,
            0,
            lump,
            lump.div_ceil(1000).saturating_mul(1000).max(1000),
        )
    } else {
        (rate, moved, raw, margin)
    };
    let mut explanation = if info.taken_after_loss {
        format!(
            "a rescue snapshot, taken by the node after its state file was lost, when it had stopped issuing: it holds every reservation the node made; two of the largest reservations (2 x {}) = {margin} for good measure. If another node ran on a new file at that path meanwhile, stop it and add what it handed out",
            lump / 2
        )
    } else if info.rates_known {
        if rate > 0.0 {
            format!(
                "the snapshot is {age} old; its fastest counter ({fastest}) moved {rate:.1}/s when it was taken: 2 x {rate:.1}/s x {age_s:.0} s = {moved}, plus two of the largest reservations (2 x {}) = {raw}, rounded up to {margin}",
                lump / 2
            )
        } else {
            format!(
                "the snapshot is {age} old and no counter was moving when it was taken; two of the largest reservations (2 x {}) = {margin}",
                lump / 2
            )
        }
    } else {
        format!(
            "the snapshot records no issue rates (taken offline, or within a second of the node's start); {margin} covers only two of the largest reservations (2 x {}). Add what the node handed out after the snapshot (IDs per second x seconds it ran since, per segment tag, lease token or strict key)",
            lump / 2
        )
    };
    explanation.push_str(
        ". A larger margin only wastes numbers; a smaller one can repeat IDs handed out after the snapshot",
    );
    Suggestion {
        margin,
        explanation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::embedded::EmbeddedStore;

    #[test]
    fn past_the_cap_only_totals_are_sampled_and_suggest_uses_them() {
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
        // Suggest: the fastest single counter when there are some, else the
        // kind's total.
        let mut info = SnapshotInfo {
            taken_at_ms: 0,
            layout: "L".into(),
            rates_known: true,
            rates: BTreeMap::from([
                ("strict/a/1".to_owned(), 10.0),
                ("strict/a/2".to_owned(), 30.0),
                ("strict/*".to_owned(), 40.0),
            ]),
            counters: Counters::new(),
            largest_step: 0,
            lease_block: 0,
            floor: 0,
            taken_after_loss: false,
            formatted_block: 0,
            format_defs: Vec::new(),
        };
        // 2 x 30/s x 100 s + 2 = 6002 -> 7000.
        assert_eq!(suggest(&info, 100_000).margin, 7000);
        info.rates.retain(|k, _| k == "strict/*");
        // 2 x 40/s x 100 s + 2 = 8002 -> 9000.
        assert_eq!(suggest(&info, 100_000).margin, 9000);
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
