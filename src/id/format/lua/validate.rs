//! What a rule is checked for when it loads, beyond running at all: that
//! `create_id` cannot give one ID for two counter values the format may
//! issue.
//!
//! A counter value is issued once per period (per scope), whatever the
//! salt, so two calls may render the same ID only when they have the same
//! counter in the same period. The checks render samples and refuse the
//! rule at the first pair that breaks this, naming both calls and the ID:
//!
//! - **Counters.** Every value of one period when the range holds at most
//!   [`FULL_SCAN`] values; beyond that the first [`DENSE`], the last
//!   [`TAIL`] and [`SPREAD`] spread pseudo-randomly (a fixed seed, so every
//!   node reaches the same verdict). Catches `counter // 2` and
//!   `counter % 1000`. (A million values took 5.5 s in a release build:
//!   too slow to scan in full at every load.)
//! - **Periods.** A few counter values now, in the next period, 1, 10 and
//!   100 years later, and every half hour through each day the zone
//!   changes its offset in the year ahead (DST). Catches a missing year,
//!   `now:year() % 10`, and fields that repeat on a 25-hour day.
//! - **Salts.** The first counter values and the last with salts nil, "",
//!   "1", "12", "A", a 64-character one and a non-ASCII one. Catches
//!   `salt or counter` and a salt glued to the counter. A call that fails
//!   for a salt is skipped: it issues nothing.
//!
//! The whole scan is bounded by [`SCAN_INSTRUCTIONS`] Lua instructions
//! (counted, so deterministic, not timed): a costly rule is scanned over a
//! shorter prefix of the same sample order. Instructions do not bound
//! time spent in library functions, so the load as a whole also has a
//! wall-clock budget ([`super::LuaLimits::check_budget`]): a rule whose
//! checks do not finish within it is refused
//! ([`super::LuaError::CheckBudget`]), never half checked. A sample is not a proof; a
//! rule whose IDs repeat only for inputs never sampled still loads, and
//! its author answers for that.

use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};

use jiff::ToSpan;

use super::{LuaError, LuaRule};
use crate::id::format::period::{next_period_start, period_key, PeriodKey, Reset};

/// Ranges of at most this many counter values are scanned in full. A
/// release build renders about 100,000 IDs in 0.4-0.7 s and a million in
/// 5.5 s on a busy 2-core machine: a million is too slow for every
/// create, update and start, so larger ranges are sampled.
pub const FULL_SCAN: u64 = 100_000;
/// Beyond [`FULL_SCAN`]: the first values scanned.
pub const DENSE: u64 = 50_000;
/// Beyond [`FULL_SCAN`]: the last values scanned.
pub const TAIL: u64 = 10_000;
/// Beyond [`FULL_SCAN`]: values spread over the rest.
pub const SPREAD: u64 = 50_000;
/// Lua instructions the counter scan may spend in all (a simple rule
/// needs about 30 per call, so its whole scan fits many times over).
pub const SCAN_INSTRUCTIONS: u64 = 100_000_000;
/// The version of these checks, part of a rule's check key
/// ([`super::check_key`]): bump it when a check changes, so that rules
/// stored as having passed the old checks are checked again.
pub const CHECKS_VERSION: u32 = 1;
/// The pseudo-random spread's seed: fixed, so the sample is the same on
/// every node and every load.
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// How many first counter values the salt samples use.
const SALTED_COUNTERS: u64 = 13;

/// One call of `create_id` a check made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The counter value.
    pub counter: u64,
    /// The instant, as local time in the rule's zone.
    pub at: String,
    /// The salt (`None`: nil).
    pub salt: Option<String>,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "counter {} at {}", self.counter, self.at)?;
        match &self.salt {
            Some(s) => write!(f, " with salt {s:?}"),
            None => f.write_str(" with salt nil"),
        }
    }
}

/// What two calls that gave one ID differ in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repeat {
    /// Two counter values of one period.
    Counter,
    /// One counter value in two periods.
    Period,
    /// Two counter values with different salts.
    Salt,
}

impl Repeat {
    /// What to do about it.
    pub fn hint(self, reset: Reset) -> String {
        match self {
            Repeat::Counter => "every counter value of a period must give its own ID: render the whole counter (e.g. %06d of counter, not counter // 2 or counter % 1000)".into(),
            Repeat::Period => format!("a counter value is used again in every period (reset {reset}), so the ID must tell every period apart for the format's whole life: render the full year (now:year(), not now:year() % 10) and each field of the period"),
            Repeat::Salt => "the salt must not replace or run into the counter: render the whole counter at a fixed place and width, or leave the salt out".into(),
        }
    }
}

/// The ID and the call each rendered ID came from, with its period.
#[derive(Default)]
struct Seen {
    calls: HashMap<String, (PeriodKey, Call)>,
}

/// A splitmix64 step: the spread's pseudo-random numbers.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The indices (0 = min) of the counter values the scan renders, in the
/// order it renders them: all of them, or the dense head, the tail and
/// the spread.
pub fn scan_indices(capacity: u64) -> Vec<u64> {
    if capacity <= FULL_SCAN {
        return (0..capacity).collect();
    }
    let mut out: Vec<u64> = (0..DENSE).chain(capacity - TAIL..capacity).collect();
    let (mut state, span) = (SEED, capacity - TAIL - DENSE);
    out.extend((0..SPREAD).map(|_| DENSE + splitmix(&mut state) % span));
    out
}

fn hash_of(id: &str) -> u64 {
    let mut h = DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

impl LuaRule {
    /// Runs every check of the module doc on a rule whose counter grows by
    /// `step`, sampled from `at_ms` (Unix ms) on.
    pub(super) fn check_repeats(&self, step: u64, at_ms: i64) -> Result<(), LuaError> {
        self.check_counters(step, at_ms)?;
        let mut seen = Seen::default();
        self.check_salts(step, at_ms, &mut seen)?;
        self.check_periods(step, at_ms, &mut seen)
    }

    /// A call record for `counter` at `at_ms` with `salt`.
    fn call_at(&self, counter: u64, at_ms: i64, salt: Option<&str>) -> Call {
        let at = match self.zone.civil(at_ms) {
            Ok(dt) => format!("{dt} {}", self.zone.name()),
            Err(_) => format!("{at_ms} ms"),
        };
        Call {
            counter,
            at,
            salt: salt.map(str::to_owned),
        }
    }

    fn repeats(&self, id: String, first: Call, second: Call, what: Repeat) -> LuaError {
        LuaError::Repeats {
            rule: self.name.clone(),
            id: id.chars().take(40).collect(),
            first: Box::new(first),
            second: Box::new(second),
            what,
            reset: self.reset,
        }
    }

    /// Every counter value of one period (or the sample of
    /// [`scan_indices`]), salt nil, at `at_ms`: no two give one ID.
    fn check_counters(&self, step: u64, at_ms: i64) -> Result<(), LuaError> {
        let capacity = (self.max - self.min) / step + 1;
        // Hashes of the IDs, to the counter that gave them: a hit is
        // rendered again to tell a repeat from a hash collision.
        let mut by_hash: HashMap<u64, u64> = HashMap::new();
        let mut spent = 0u64;
        for i in scan_indices(capacity) {
            let counter = self.min + i * step;
            let id = self.create_id(counter, at_ms, None)?;
            spent += self.meter.spent().max(1);
            match by_hash.entry(hash_of(&id)) {
                Entry::Vacant(v) => {
                    v.insert(counter);
                }
                Entry::Occupied(o) if *o.get() != counter => {
                    let other = *o.get();
                    if self.create_id(other, at_ms, None)? == id {
                        return Err(self.repeats(
                            id,
                            self.call_at(other, at_ms, None),
                            self.call_at(counter, at_ms, None),
                            Repeat::Counter,
                        ));
                    }
                }
                Entry::Occupied(_) => {}
            }
            if spent > SCAN_INSTRUCTIONS {
                break;
            }
        }
        Ok(())
    }

    /// Renders `counter` at `at_ms` with `salt` and records it, or the
    /// repeat it makes with a call recorded before.
    fn note(
        &self,
        seen: &mut Seen,
        counter: u64,
        at_ms: i64,
        salt: Option<&str>,
    ) -> Result<(), LuaError> {
        let id = match self.create_id(counter, at_ms, salt) {
            Ok(id) => id,
            // A salted call that fails issues nothing; but a load past its
            // budget stops here.
            Err(e) if salt.is_some() && !matches!(e, LuaError::CheckBudget { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let period = period_key(at_ms, &self.zone, self.reset).map_err(|e| LuaError::Period {
            rule: self.name.clone(),
            source: e,
        })?;
        let call = self.call_at(counter, at_ms, salt);
        match seen.calls.entry(id) {
            Entry::Vacant(v) => {
                v.insert((period, call));
                Ok(())
            }
            Entry::Occupied(o) => {
                let (p, first) = o.get();
                if *p == period && first.counter == counter {
                    return Ok(());
                }
                let what = if first.counter == counter {
                    Repeat::Period
                } else if first.salt != call.salt {
                    Repeat::Salt
                } else {
                    Repeat::Counter
                };
                Err(self.repeats(o.key().clone(), first.clone(), call, what))
            }
        }
    }

    /// The first counter values and the last, with each sample salt.
    fn check_salts(&self, step: u64, at_ms: i64, seen: &mut Seen) -> Result<(), LuaError> {
        let long = "x".repeat(64);
        let salts = [
            None,
            Some(""),
            Some("1"),
            Some("12"),
            Some("A"),
            Some(long.as_str()),
            Some("é-ünïcödé-盐"),
        ];
        let mut counters: Vec<u64> = (0..SALTED_COUNTERS)
            .filter_map(|i| self.min.checked_add(i * step))
            .filter(|c| *c <= self.max)
            .collect();
        counters.push(self.max);
        for salt in salts {
            for c in &counters {
                self.note(seen, *c, at_ms, salt)?;
            }
        }
        Ok(())
    }

    /// The instants the period check renders at: see the module doc.
    fn sample_instants(&self, at_ms: i64) -> Result<Vec<i64>, LuaError> {
        let period = |e| LuaError::Period {
            rule: self.name.clone(),
            source: e,
        };
        let mut out = vec![at_ms];
        let key = period_key(at_ms, &self.zone, self.reset).map_err(period)?;
        if let Some(next) = next_period_start(key, &self.zone, self.reset).map_err(period)? {
            out.push(next);
        }
        let local = self.zone.civil(at_ms).map_err(period)?;
        for years in [1, 10, 100] {
            if let Ok(later) = local.checked_add(years.years()) {
                out.push(self.zone.first_instant_at_or_after(later).map_err(period)?);
            }
        }
        const HALF_HOUR: i64 = 1_800_000;
        let year_ahead = at_ms.saturating_add(366 * 86_400_000);
        for t in self.zone.transitions(at_ms, year_ahead, 4) {
            let day = self.zone.civil(t).map_err(period)?.start_of_day();
            let start = self.zone.first_instant_at_or_after(day).map_err(period)?;
            // 26 hours: the whole of a 25-hour day.
            out.extend((0..=52).map(|i| start + i * HALF_HOUR));
            out.extend([t - 1, t]);
        }
        Ok(out)
    }

    /// A few counter values at each sample instant: one value in two
    /// periods, or two values, never give one ID.
    fn check_periods(&self, step: u64, at_ms: i64, seen: &mut Seen) -> Result<(), LuaError> {
        let mut counters = vec![self.min];
        if let Some(next) = self.min.checked_add(step).filter(|n| *n <= self.max) {
            counters.push(next);
        }
        if !counters.contains(&self.max) {
            counters.push(self.max);
        }
        for at in self.sample_instants(at_ms)? {
            for c in &counters {
                self.note(seen, *c, at, None)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
