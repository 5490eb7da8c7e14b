//! What this node wrote under each Consul key, so that a read below it
//! stops issuing instead of repeating IDs.
//!
//! Restoring a Consul snapshot (`consul snapshot restore`) puts every key
//! back as it was when the snapshot was taken: segment `max_id`s, strict,
//! lease-token and format counters and high-water marks go back, and
//! nothing in Consul says so. A node that keeps the highest value it wrote
//! to each key notices on the next read it does anyway (the consistent
//! read before a compare-and-set): a stored value below its own write is a
//! rolled-back store. It then refuses to issue from that key
//! ([`StoreError::Regressed`], UNAVAILABLE, counted in
//! `idgen_store_regressions_total{kind}`) until `idgen admin skip-ahead`
//! has moved the key above what it wrote; the next read after that passes
//! and the node issues again, without a restart.
//!
//! Values, not ModifyIndexes, are compared: a restore brings back the
//! indexes a key had when the snapshot was taken, so an index this node
//! cached before the snapshot can match again.
//!
//! Memory is bounded by the keys this node wrote (its segment tags, strict
//! keys, tokens, format counters and its own mark).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::StoreError;
use crate::metrics as m;

/// The `kind` label values of `idgen_store_regressions_total`.
pub const KINDS: [&str; 5] = ["segment", "strict", "lease", "format", "hwm"];

/// A stored level, compared as a pair: formatted-mode counters are (period
/// start, last value); every other counter is (0, value).
pub type Level = (i64, u64);

/// The highest level this node wrote to each key (see the module doc).
/// One per node, shared by every Consul store through
/// [`ClusterKeys`](super::consul::ClusterKeys).
#[derive(Debug, Default)]
pub struct WrittenValues {
    values: Mutex<HashMap<String, Level>>,
}

fn shown(kind: &str, level: Level) -> String {
    if kind == "format" {
        format!("period {} last {}", level.0, level.1)
    } else {
        level.1.to_string()
    }
}

impl WrittenValues {
    fn values(&self) -> std::sync::MutexGuard<'_, HashMap<String, Level>> {
        self.values.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that the store acknowledged `level` at `key`.
    pub fn wrote(&self, key: &str, level: Level) {
        let mut values = self.values();
        match values.get_mut(key) {
            Some(v) => *v = (*v).max(level),
            None => {
                values.insert(key.to_owned(), level);
            }
        }
    }

    /// The highest level this node wrote to `key`, if any.
    pub fn written(&self, key: &str) -> Option<Level> {
        self.values().get(key).copied()
    }

    /// What this node wrote to every key under `prefix`, taken before a
    /// listing (see [`check`](Self::check)).
    pub fn floors(&self, prefix: &str) -> HashMap<String, Level> {
        self.values()
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Refuses a read of `key` (a `kind` counter) that found `stored`
    /// below `floor`, what [`written`](Self::written) said *before the read
    /// was sent*: a consistent read sent after a write was acknowledged
    /// sees it, while a write acknowledged during the read (a concurrent
    /// call of this node) may not be in it. A key absent from the store
    /// reads as level `(i64::MIN, 0)`.
    pub fn check(
        &self,
        kind: &'static str,
        key: &str,
        floor: Option<Level>,
        stored: Level,
    ) -> Result<(), StoreError> {
        let Some(wrote) = floor else {
            return Ok(());
        };
        if stored >= wrote {
            return Ok(());
        }
        metrics::counter!(m::STORE_REGRESSIONS, "kind" => kind).increment(1);
        let (stored, wrote) = (shown(kind, stored), shown(kind, wrote));
        tracing::error!(kind, key, %stored, %wrote, "Consul holds a counter below what this node wrote: the store was rolled back; refusing to issue from it");
        Err(StoreError::Regressed {
            kind,
            key: key.to_owned(),
            stored,
            wrote,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_below_the_highest_write_is_refused_until_the_store_is_above_it() {
        let w = WrittenValues::default();
        let check = |kind, key: &str, stored| w.check(kind, key, w.written(key), stored);
        assert!(check("strict", "k", (0, 0)).is_ok(), "never written");
        w.wrote("k", (0, 50));
        w.wrote("k", (0, 40));
        assert_eq!(w.written("k"), Some((0, 50)), "the highest write counts");
        assert!(check("strict", "k", (0, 50)).is_ok());
        let err = check("strict", "k", (0, 30)).err().map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(
            err.contains("k") && err.contains("30") && err.contains("50"),
            "{err}"
        );
        assert!(err.contains("idgen admin skip-ahead"), "{err}");
        assert!(check("strict", "k", (0, 80)).is_ok(), "skipped ahead");
        // A later period is above any value of an earlier one.
        w.wrote("f", (100, 7));
        assert!(check("format", "f", (50, 1_000)).is_err());
        assert!(check("format", "f", (200, 0)).is_ok());
        assert!(
            check("format", "f", (i64::MIN, 0)).is_err(),
            "a missing key"
        );
        assert_eq!(w.floors("f").len(), 1);
    }

    #[test]
    fn a_write_acknowledged_during_a_read_is_not_held_against_it() {
        let w = WrittenValues::default();
        w.wrote("k", (0, 10));
        let floor = w.written("k");
        // Another call of this node commits 20 while the read is out; the
        // read saw 10, which was above everything written before it.
        w.wrote("k", (0, 20));
        assert!(w.check("strict", "k", floor, (0, 10)).is_ok());
        assert!(w.check("strict", "k", floor, (0, 9)).is_err());
    }
}
