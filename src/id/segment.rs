//! Segment mode's pure core (Meituan Leaf style): tags, their durable
//! records, and the rule that turns a record into the next range.
//!
//! A tag's record holds `max_id`, the largest ID any node may have handed
//! out. A node takes the range `(max_id, max_id + step]` by writing the
//! record with `max_id + step` through a compare-and-set; the range is its
//! alone once that write is acknowledged. Storage lives in `store`; this
//! module does no I/O.

use super::kind::ErrorKind;
use std::time::Duration;

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
    /// The tag's ID space is used up: every ID up to its largest was
    /// reserved (the last range may have been shorter than a step).
    #[error("tag {tag:?} is exhausted: every ID up to its largest, {max}, was handed out (max_id {max_id}); create a new tag")]
    Exhausted {
        /// The tag.
        tag: String,
        /// Its current `max_id`.
        max_id: u64,
        /// The step the refused range asked for.
        step: u64,
        /// The largest allowed ID.
        max: u64,
    },
    /// An admin update tried to move `max_id` back.
    #[error("tag {tag:?}: max_id can only move forward (it is {current}, asked for {asked}): moving it back would hand out IDs again; pass a value of at least {current}")]
    MaxIdBackwards {
        /// The tag.
        tag: String,
        /// Its current `max_id`.
        current: u64,
        /// The value asked for.
        asked: u64,
    },
    /// An initial value or `max_id` above the largest segment ID.
    #[error(
        "max_id {0} is out of range: use 0 to 9223372036854775807 (segment IDs stay below 2^63)"
    )]
    BadMaxId(u64),
    /// No segment tag by that name.
    #[error(
        "unknown segment tag {0:?}: create it first (admin API), or enable auto-creation in config"
    )]
    TagNotFound(String),
    /// A segment tag by that name exists already.
    #[error("segment tag {0:?} exists already")]
    TagExists(String),
    /// Auto-creation met a deleted tag: only an explicit create revives it.
    #[error("segment tag {tag:?} was deleted at {}; auto-creation does not bring a deleted tag back: re-create it with `idgen admin tags create {tag}` to use it again (it continues above every ID it handed out)", super::epoch_text(*.deleted_ms))]
    TagDeleted {
        /// The tag.
        tag: String,
        /// When it was deleted (the tombstone's `updated_ms`), Unix ms.
        deleted_ms: u64,
    },
    /// Creating one more tag would pass `segment.max_tags`.
    #[error(transparent)]
    LimitReached(#[from] crate::id::LimitReached),
    /// A `hide` setting that cannot be served.
    #[error("tag {tag:?}: hide {why}")]
    BadHide {
        /// The tag.
        tag: String,
        /// What is wrong and what to do.
        why: String,
    },
    /// A tag created again over a tombstone with another `hide` setting.
    #[error("tag {tag:?} was deleted with hide {old} and is created again with hide {new}: its shown IDs could repeat ones the old tag gave; create it with the same hide setting, or use a new tag name")]
    HideChanged {
        /// The tag.
        tag: String,
        /// The tombstone's setting.
        old: String,
        /// The one asked for.
        new: String,
    },
}

/// How a hidden tag shows its IDs: through a keyed permutation of
/// `domain_bits` bits under `version_bits` bits of key version (see
/// `IntHider` in [`crate::id::hide`]). Set when the tag is created, never
/// changed: hidden and plain IDs of one tag are never mixed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagHide {
    /// The hide key id (`idgen admin keys create KEY_ID`).
    pub key: String,
    /// Bits of key version at the top of every ID, 1 to 8 (versions
    /// `0..2^version_bits`).
    pub version_bits: u32,
    /// Bits permuted under them, 20 to `63 - version_bits`: the tag can
    /// issue `2^domain_bits` IDs in all.
    pub domain_bits: u32,
}

impl TagHide {
    /// Checks the widths and the key id; the error says what to use.
    pub fn check(&self, tag: &str) -> Result<(), SegmentError> {
        let bad = |why: String| {
            Err(SegmentError::BadHide {
                tag: tag.to_owned(),
                why,
            })
        };
        if !(1..=8).contains(&self.version_bits) {
            return bad(format!(
                "version_bits {} is out of range; use 1 to 8",
                self.version_bits
            ));
        }
        let most = 63 - self.version_bits;
        if !(20..=most).contains(&self.domain_bits) {
            return bad(format!(
                "domain_bits {} is out of range; use 20 to {most} (63 - version_bits)",
                self.domain_bits
            ));
        }
        let b = self.key.as_bytes();
        let ok = !b.is_empty()
            && b.len() <= 63
            && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-');
        if !ok {
            return bad(format!(
                "key {:?} is malformed; use [a-z0-9][a-z0-9_-]{{0,62}}",
                self.key
            ));
        }
        Ok(())
    }

    /// The largest internal ID the tag may reach: `2^domain_bits - 1`.
    pub fn max_internal(&self) -> u64 {
        (1u64 << self.domain_bits) - 1
    }
}

impl std::fmt::Display for TagHide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{{ key = {:?}, version_bits = {}, domain_bits = {} }}",
            self.key, self.version_bits, self.domain_bits
        )
    }
}

/// A tag's `hide` as messages show it.
fn hide_shown(hide: &Option<TagHide>) -> String {
    hide.as_ref()
        .map_or_else(|| "none".to_owned(), ToString::to_string)
}

impl SegmentError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Exhausted { .. } | Self::LimitReached(_) => ErrorKind::Exhausted,
            Self::TagNotFound(_) | Self::TagDeleted { .. } => ErrorKind::NotFound,
            Self::HideChanged { .. } => ErrorKind::Precondition,
            Self::TagExists(_) => ErrorKind::AlreadyExists,
            Self::BadTag(_)
            | Self::BadStep(_)
            | Self::MaxIdBackwards { .. }
            | Self::BadMaxId(_)
            | Self::BadHide { .. } => ErrorKind::BadRequest,
        }
    }
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

/// Checks an initial value or a new `max_id`.
pub fn check_max_id(max_id: u64) -> Result<u64, SegmentError> {
    if max_id <= MAX_SEGMENT_ID {
        Ok(max_id)
    } else {
        Err(SegmentError::BadMaxId(max_id))
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What an admin update changes; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TagUpdate {
    /// A new configured step.
    pub step: Option<u64>,
    /// A new description.
    pub description: Option<String>,
    /// A new `max_id`; only forward (IDs up to it are never handed out).
    pub max_id: Option<u64>,
}

impl TagUpdate {
    /// Whether the update changes nothing.
    pub fn is_empty(&self) -> bool {
        self.step.is_none() && self.description.is_none() && self.max_id.is_none()
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
    /// A deleted tag's tombstone. The record stays, with its `max_id`, so
    /// that a tag created again by the same name continues above every ID
    /// the old one may have handed out. A deleted tag reads as unknown.
    #[serde(default, skip_serializing_if = "is_false")]
    pub deleted: bool,
    /// Set on a hidden tag: how its IDs are shown. Fixed at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hide: Option<TagHide>,
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
            deleted: false,
            hide: None,
        })
    }

    /// The largest ID the tag may hand out: a hidden tag's internal IDs
    /// stay inside its permuted domain, a plain tag's below 2^63.
    pub fn largest_id(&self) -> u64 {
        self.hide
            .as_ref()
            .map_or(MAX_SEGMENT_ID, TagHide::max_internal)
    }

    /// The record with `hide` set (checked).
    pub fn with_hide(mut self, tag: &Tag, hide: Option<TagHide>) -> Result<Self, SegmentError> {
        if let Some(h) = &hide {
            h.check(tag.as_str())?;
            if self.max_id > h.max_internal() {
                return Err(SegmentError::BadHide {
                    tag: tag.to_string(),
                    why: format!(
                        "domain_bits {} holds IDs up to {}, below the initial value {}; raise domain_bits",
                        h.domain_bits,
                        h.max_internal(),
                        self.max_id
                    ),
                });
            }
        }
        self.hide = hide;
        Ok(self)
    }

    /// The record after `update`; `max_id` may only move forward.
    pub fn updated(
        &self,
        tag: &Tag,
        update: &TagUpdate,
        now_ms: u64,
    ) -> Result<TagRecord, SegmentError> {
        let mut next = self.clone();
        if let Some(step) = update.step {
            next.step = check_step(step)?;
        }
        if let Some(max_id) = update.max_id {
            check_max_id(max_id)?;
            if max_id < self.max_id {
                return Err(SegmentError::MaxIdBackwards {
                    tag: tag.to_string(),
                    current: self.max_id,
                    asked: max_id,
                });
            }
            next.max_id = max_id;
        }
        if let Some(d) = &update.description {
            next.description.clone_from(d);
        }
        next.updated_ms = now_ms.max(self.updated_ms);
        Ok(next)
    }

    /// The tombstone left by deleting the tag: same `max_id`, marked
    /// deleted.
    pub fn tombstone(&self, now_ms: u64) -> TagRecord {
        TagRecord {
            deleted: true,
            updated_ms: now_ms.max(self.updated_ms),
            ..self.clone()
        }
    }

    /// The record that re-creates a deleted tag (`self` is its tombstone)
    /// as `fresh` asks, except that it continues above the old `max_id`
    /// when `fresh` would start below it. Refused when `fresh` hides
    /// otherwise than the old tag did: a shown ID could repeat.
    pub fn revived(&self, tag: &Tag, fresh: &TagRecord) -> Result<TagRecord, SegmentError> {
        if self.hide != fresh.hide {
            return Err(SegmentError::HideChanged {
                tag: tag.to_string(),
                old: hide_shown(&self.hide),
                new: hide_shown(&fresh.hide),
            });
        }
        Ok(TagRecord {
            max_id: fresh.max_id.max(self.max_id),
            deleted: false,
            ..fresh.clone()
        })
    }

    /// The range `(max_id, max_id + step]` and the record to write for it;
    /// near the end of the tag's ID space the range stops at its largest
    /// ID (rule 37: the last partial range is reserved like any other, so a
    /// 2^20-domain hidden tag hands out all 1,048,575 IDs). Once `max_id`
    /// is that largest ID, [`SegmentError::Exhausted`].
    pub fn next_range(
        &self,
        tag: &Tag,
        step: u64,
        now_ms: u64,
    ) -> Result<(Range, TagRecord), SegmentError> {
        let step = check_step(step)?;
        let max = self.largest_id();
        if self.max_id >= max {
            return Err(SegmentError::Exhausted {
                tag: tag.to_string(),
                max_id: self.max_id,
                step,
                max,
            });
        }
        // Above max_id (checked just above), at most max: never an ID
        // this record already reserved, never past the domain.
        let last = self.max_id.saturating_add(step).min(max);
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

/// A range used up faster than this doubles the next step.
pub const FAST_RANGE: Duration = Duration::from_secs(15 * 60);
/// A range that lasted longer than this halves the next step.
pub const SLOW_RANGE: Duration = Duration::from_secs(30 * 60);

/// The next step after a range that lasted `lasted`.
pub fn next_step(step: u64, floor: u64, cap: u64, lasted: Duration) -> u64 {
    let floor = floor.max(1);
    let cap = cap.max(floor);
    if lasted < FAST_RANGE {
        step.saturating_mul(2).min(cap)
    } else if lasted > SLOW_RANGE {
        (step / 2).max(floor)
    } else {
        step.clamp(floor, cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_step_is_capped_floored_and_kept_between_fast_and_slow() {
        assert_eq!(next_step(100, 100, 1000, Duration::ZERO), 200, "doubled");
        assert_eq!(next_step(100, 100, 150, Duration::ZERO), 150, "capped");
        assert_eq!(next_step(400, 100, 1000, SLOW_RANGE * 2), 200, "halved");
        assert_eq!(next_step(100, 100, 1000, SLOW_RANGE * 2), 100, "floored");
        assert_eq!(
            next_step(400, 100, 1000, FAST_RANGE + Duration::from_secs(1)),
            400
        );
    }

    #[test]
    fn a_revived_tag_keeps_its_hide_setting() {
        let tag = Tag::parse("orders").unwrap();
        let hide = TagHide {
            key: "orders".into(),
            version_bits: 4,
            domain_bits: 40,
        };
        let hidden = TagRecord::new(0, 10, "", 1)
            .unwrap()
            .with_hide(&tag, Some(hide.clone()))
            .unwrap();
        let (_, used) = hidden.next_range(&tag, 10, 2).unwrap();
        let tomb = used.tombstone(3);
        // Created again plain over a hidden tombstone: refused, since a
        // plain ID could equal a hidden one the old tag showed.
        let plain = TagRecord::new(0, 10, "", 4).unwrap();
        let err = tomb.revived(&tag, &plain).unwrap_err();
        assert!(matches!(err, SegmentError::HideChanged { .. }), "{err:?}");
        assert!(err.to_string().contains("same hide setting"), "{err}");
        // And the other way round, and with another key.
        let plain_tomb = plain.tombstone(5);
        assert!(plain_tomb.revived(&tag, &hidden).is_err());
        let other_key = TagRecord::new(0, 10, "", 4)
            .unwrap()
            .with_hide(
                &tag,
                Some(TagHide {
                    key: "other".into(),
                    ..hide.clone()
                }),
            )
            .unwrap();
        assert!(tomb.revived(&tag, &other_key).is_err());
        // The same setting continues above the tombstone.
        let back = tomb.revived(&tag, &hidden).unwrap();
        assert_eq!((back.max_id, back.hide.as_ref()), (10, Some(&hide)));
        // Bad widths and keys say what to use; the domain bounds ranges.
        for (vb, db, key) in [
            (0, 40, "k"),
            (9, 40, "k"),
            (4, 19, "k"),
            (4, 60, "k"),
            (4, 40, "K"),
        ] {
            let h = TagHide {
                key: key.into(),
                version_bits: vb,
                domain_bits: db,
            };
            let e = TagRecord::new(0, 10, "", 1)
                .unwrap()
                .with_hide(&tag, Some(h));
            assert!(
                matches!(e, Err(SegmentError::BadHide { .. })),
                "{vb} {db} {key}"
            );
        }
        let small = TagHide {
            domain_bits: 20,
            ..hide
        };
        let r = TagRecord::new((1 << 20) - 5, 10, "", 1)
            .unwrap()
            .with_hide(&tag, Some(small))
            .unwrap();
        let (last, end) = r.next_range(&tag, 10, 2).unwrap();
        assert_eq!((last.first, last.last), ((1 << 20) - 4, (1 << 20) - 1));
        assert!(matches!(
            end.next_range(&tag, 10, 3),
            Err(SegmentError::Exhausted { .. })
        ));
    }

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

    /// Rule 37: a tag's last range is reserved even when it is shorter
    /// than the step, so a hidden tag of 2^20 internal values hands out
    /// every one of its 1,048,575 IDs (1 to 2^20 - 1), in disjoint
    /// contiguous ranges, and only then answers `Exhausted`. (Issue 33:
    /// with the last partial range refused it stopped at 1,048,000 with
    /// steps of 4,000.)
    #[test]
    fn the_last_partial_range_is_reserved_then_the_tag_is_exhausted() {
        let tag = Tag::parse("small").unwrap();
        let hide = TagHide {
            key: "k".into(),
            version_bits: 4,
            domain_bits: 20,
        };
        let mut r = TagRecord::new(0, 4000, "", 1)
            .unwrap()
            .with_hide(&tag, Some(hide))
            .unwrap();
        let mut handed = 0u64;
        let mut last = 0u64;
        loop {
            match r.next_range(&tag, 4000, 2) {
                Ok((range, next)) => {
                    assert_eq!(range.first, last + 1, "contiguous, never overlapping");
                    assert!(range.len() <= 4000);
                    handed += range.len();
                    last = range.last;
                    r = next;
                }
                Err(e) => {
                    assert!(matches!(e, SegmentError::Exhausted { .. }), "{e}");
                    assert_eq!(e.kind(), ErrorKind::Exhausted);
                    assert!(e.to_string().contains("create a new tag"), "{e}");
                    break;
                }
            }
        }
        assert_eq!((handed, last, r.max_id), (1_048_575, 1_048_575, 1_048_575));
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

    #[test]
    fn updates_only_move_max_id_forward_and_check_the_step() {
        let tag = Tag::parse("t").unwrap();
        let r = TagRecord::new(100, 10, "old", 1).unwrap();
        let up = |step, description: Option<&str>, max_id| TagUpdate {
            step,
            description: description.map(str::to_owned),
            max_id,
        };
        let n = r
            .updated(&tag, &up(Some(20), Some("new"), Some(500)), 5)
            .unwrap();
        assert_eq!((n.step, n.description.as_str(), n.max_id), (20, "new", 500));
        assert_eq!((n.created_ms, n.updated_ms), (1, 5));
        // Unchanged fields stay; the same max_id is allowed.
        let same = r.updated(&tag, &up(None, None, Some(100)), 0).unwrap();
        assert_eq!((same.step, same.max_id, same.updated_ms), (10, 100, 1));
        assert!(matches!(
            r.updated(&tag, &up(None, None, Some(99)), 5),
            Err(SegmentError::MaxIdBackwards {
                current: 100,
                asked: 99,
                ..
            })
        ));
        assert_eq!(
            r.updated(&tag, &up(Some(0), None, None), 5),
            Err(SegmentError::BadStep(0))
        );
        assert_eq!(
            r.updated(&tag, &up(None, None, Some(u64::MAX)), 5),
            Err(SegmentError::BadMaxId(u64::MAX))
        );
        assert!(up(None, None, None).is_empty());
    }

    #[test]
    fn a_revived_tag_continues_above_its_tombstone() {
        let tag = Tag::parse("t").unwrap();
        let old = TagRecord::new(0, 10, "", 1).unwrap();
        let (_, old) = old.next_range(&tag, 10, 2).unwrap();
        let tomb = old.tombstone(3);
        assert!(tomb.deleted);
        assert_eq!(tomb.max_id, 10);
        let fresh = TagRecord::new(0, 5, "again", 4).unwrap();
        let back = tomb.revived(&tag, &fresh).unwrap();
        assert!(!back.deleted);
        assert_eq!((back.max_id, back.step, back.created_ms), (10, 5, 4));
        let higher = TagRecord::new(50, 5, "", 4).unwrap();
        assert_eq!(tomb.revived(&tag, &higher).unwrap().max_id, 50);
        // Live records serialise as before (no `deleted` key).
        let json = String::from_utf8(serde_json::to_vec(&fresh).unwrap()).unwrap();
        assert!(!json.contains("deleted"), "{json}");
        let parsed: TagRecord = serde_json::from_str(&json).unwrap();
        assert!(!parsed.deleted);
    }
}
