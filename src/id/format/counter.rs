//! Counters: whose counter an ID uses, its bounds, the blocks reserved
//! from it, and its durable record with the rule that gives the next
//! block.

use serde::{Deserialize, Serialize};

use super::period::{PeriodDecision, PeriodKey, PeriodStep};
use super::FormatError;

/// Whose counter an ID uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Each node its own counter; IDs carry the node or token.
    Node,
    /// One counter for the cluster (ranges reserved by the nodes).
    Cluster,
}

/// A counter's bounds and step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterRange {
    /// First value of a period.
    pub min: u64,
    /// Last value of a period.
    pub max: u64,
    /// Growth per ID.
    pub step: u64,
}

impl CounterRange {
    /// How many values a period holds.
    pub fn capacity(&self) -> u64 {
        (self.max - self.min) / self.step + 1
    }
}

/// A block of counter values `first, first + step, ..., last`, reserved
/// durably in `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterBlock {
    /// The period the values belong to.
    pub period: PeriodKey,
    /// First value.
    pub first: u64,
    /// Last value (inclusive).
    pub last: u64,
    /// Step between values.
    pub step: u64,
}

impl CounterBlock {
    /// How many values.
    pub fn len(&self) -> u64 {
        (self.last - self.first) / self.step + 1
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A counter's durable record: the period it is in and the last value
/// reserved in it. Written (compare-and-set) before any value of a block
/// is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterRecord {
    /// The period.
    pub period: PeriodKey,
    /// The last value any node may have used in it.
    pub last: u64,
}

impl CounterRecord {
    /// The next block of at most `want` values for a decision made by
    /// [`period::decide`](super::period::decide) on this record (`None`: nothing stored yet), and
    /// the record to write for it. A new period starts at `min`; the same
    /// (or held) period continues above `last`. Exhausted: the error names
    /// the format and when the next period starts.
    pub fn next_block(
        stored: Option<&CounterRecord>,
        decision: &PeriodDecision,
        counter: &CounterRange,
        want: u64,
        format: &str,
        next_start_ms: Option<i64>,
    ) -> Result<(CounterBlock, CounterRecord), FormatError> {
        let want = want.max(1);
        let mismatch = || FormatError::PeriodMismatch {
            format: format.to_owned(),
        };
        // The decision must have been made on this very record.
        let first = match (stored, decision.step) {
            (None, PeriodStep::First) => Some(counter.min),
            (Some(r), PeriodStep::Later) if decision.key > r.period => Some(counter.min),
            (Some(r), PeriodStep::Same | PeriodStep::Held { .. }) if r.period == decision.key => r
                .last
                .checked_add(counter.step)
                .filter(|v| *v <= counter.max),
            _ => return Err(mismatch()),
        };
        let first = first.ok_or_else(|| FormatError::Exhausted {
            format: format.to_owned(),
            period: decision.key,
            next_start_ms,
        })?;
        let room = (counter.max - first) / counter.step;
        let last = first + room.min(want - 1) * counter.step;
        Ok((
            CounterBlock {
                period: decision.key,
                first,
                last,
                step: counter.step,
            },
            CounterRecord {
                period: decision.key,
                last,
            },
        ))
    }
}
