//! Segment mode's pure core (Meituan Leaf style): tags, their durable
//! records, and the rule that turns a record into the next range.
//!
//! A tag's record holds `max_id`, the largest ID any node may have handed
//! out. A node takes the range `(max_id, max_id + step]` by writing the
//! record with `max_id + step` through a compare-and-set; the range is its
//! alone once that write is acknowledged. Storage lives in `store`; this
//! module does no I/O.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Longest tag name.
pub const MAX_TAG_LEN: usize = 64;

/// The largest ID a segment may hand out: IDs stay below 2^63 so that
/// they fit signed 64-bit integers (Java `long`, SQL `BIGINT`).
pub const MAX_SEGMENT_ID: u64 = i64::MAX as u64;

/// What is wrong with a tag or a range request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SegmentError {
    /// The tag name is malformed.
    #[error("tag {0:?} is malformed: use 1 to 64 characters of a-z 0-9 _ -")]
    BadTag(String),
    /// The step is zero or too large.
    #[error("step {0} is out of range: use 1 to 1000000000")]
    BadStep(u64),
    /// The tag's ID space is used up.
    #[error("tag {tag:?} is exhausted: max_id {max_id} + step {step} would pass {max}; create a new tag")]
    Exhausted {
        /// The tag.
        tag: String,
        /// Its current `max_id`.
        max_id: u64,
        /// The step asked for.
        step: u64,
        /// The largest allowed ID.
        max: u64,
    },
}

/// Largest step of one range.
pub const MAX_STEP: u64 = 1_000_000_000;

/// A validated tag name (`[a-z0-9_-]{1,64}`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(String);

impl Tag {
    /// Checks `name`.
    pub fn parse(name: &str) -> Result<Self, SegmentError> {
        let ok = !name.is_empty()
            && name.len() <= MAX_TAG_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if ok {
            Ok(Self(name.to_owned()))
        } else {
            Err(SegmentError::BadTag(name.chars().take(80).collect()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks a step.
pub fn check_step(step: u64) -> Result<u64, SegmentError> {
    if (1..=MAX_STEP).contains(&step) {
        Ok(step)
    } else {
        Err(SegmentError::BadStep(step))
    }
}

/// A tag's durable record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TagRecord {
    /// The largest ID any node may have handed out.
    pub max_id: u64,
    /// The configured step: the size of a range, and the floor of the
    /// dynamic step.
    pub step: u64,
    /// Free text for operators.
    #[serde(default)]
    pub description: String,
    /// When the tag was created, Unix ms.
    pub created_ms: u64,
    /// When the record last changed, Unix ms.
    pub updated_ms: u64,
}

impl TagRecord {
    /// A new tag whose first ID will be `initial + 1`.
    pub fn new(
        initial: u64,
        step: u64,
        description: &str,
        now_ms: u64,
    ) -> Result<Self, SegmentError> {
        Ok(Self {
            max_id: initial.min(MAX_SEGMENT_ID),
            step: check_step(step)?,
            description: description.to_owned(),
            created_ms: now_ms,
            updated_ms: now_ms,
        })
    }

    /// The range `(max_id, max_id + step]` and the record to write for it.
    pub fn next_range(
        &self,
        tag: &Tag,
        step: u64,
        now_ms: u64,
    ) -> Result<(Range, TagRecord), SegmentError> {
        let step = check_step(step)?;
        let last = self
            .max_id
            .checked_add(step)
            .filter(|l| *l <= MAX_SEGMENT_ID)
            .ok_or_else(|| SegmentError::Exhausted {
                tag: tag.to_string(),
                max_id: self.max_id,
                step,
                max: MAX_SEGMENT_ID,
            })?;
        let range = Range {
            first: self.max_id + 1,
            last,
        };
        let next = TagRecord {
            max_id: last,
            updated_ms: now_ms.max(self.updated_ms),
            ..self.clone()
        };
        Ok((range, next))
    }
}

/// A range of IDs owned by one node: `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// First ID.
    pub first: u64,
    /// Last ID (inclusive).
    pub last: u64,
}

impl Range {
    /// How many IDs it holds.
    pub fn len(&self) -> u64 {
        self.last - self.first + 1
    }

    /// Never true: a range holds at least one ID.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether two ranges share an ID.
    pub fn overlaps(&self, other: &Range) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_checked() {
        for good in ["a", "order-id", "user_42", &"x".repeat(64)] {
            assert!(Tag::parse(good).is_ok(), "{good}");
        }
        for bad in ["", "Order", "a b", "a/b", "é", &"x".repeat(65)] {
            assert!(
                matches!(Tag::parse(bad), Err(SegmentError::BadTag(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn ranges_follow_each_other_without_gaps_or_overlaps() {
        let tag = Tag::parse("t").unwrap();
        let mut r = TagRecord::new(0, 1000, "", 1).unwrap();
        let mut seen: Vec<Range> = Vec::new();
        for i in 0..5u64 {
            let step = 1000 * (i + 1);
            let (range, next) = r.next_range(&tag, step, 2 + i).unwrap();
            assert_eq!(range.len(), step);
            assert_eq!(range.first, r.max_id + 1);
            assert_eq!(next.max_id, range.last);
            assert!(seen.iter().all(|s| !s.overlaps(&range)));
            seen.push(range);
            r = next;
        }
        assert_eq!(r.max_id, 15_000);
        assert_eq!(r.step, 1000, "the configured step is kept");
        assert_eq!(r.updated_ms, 6);
    }

    #[test]
    fn a_tag_runs_out_with_a_clear_error_and_bad_steps_are_refused() {
        let tag = Tag::parse("t").unwrap();
        let r = TagRecord::new(MAX_SEGMENT_ID - 10, 5, "", 1).unwrap();
        let (range, r) = r.next_range(&tag, 10, 1).unwrap();
        assert_eq!(range.last, MAX_SEGMENT_ID);
        let err = r.next_range(&tag, 1, 1).unwrap_err();
        assert!(matches!(err, SegmentError::Exhausted { .. }));
        assert!(err.to_string().contains("create a new tag"));
        assert_eq!(r.next_range(&tag, 0, 1), Err(SegmentError::BadStep(0)));
        assert!(TagRecord::new(0, MAX_STEP + 1, "", 1).is_err());
        let huge = TagRecord::new(u64::MAX, 1, "", 1).unwrap();
        assert_eq!(huge.max_id, MAX_SEGMENT_ID);
    }
}
