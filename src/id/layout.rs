//! The bit layout of a snowflake ID, as data.
//!
//! An ID is `0 | time | datacenter | worker | sequence`, most significant
//! field first, so IDs sort by time, and IDs from one node sort by issue
//! order. The widths, the time unit and the epoch are configurable and
//! validated once; everything after that is shifts and masks.

use super::kind::ErrorKind;
use std::fmt;

use thiserror::Error;

/// Why a layout, or a node's place in it, was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    /// The fields do not fit in 63 bits (the sign bit stays zero so IDs are
    /// positive in every language).
    #[error("layout uses {total} bits (time {time} + datacenter {dc} + worker {worker} + sequence {seq}); at most 63 fit in a positive 64-bit ID")]
    TooWide {
        /// Sum of all widths.
        total: u32,
        /// Time bits.
        time: u8,
        /// Datacenter bits.
        dc: u8,
        /// Worker bits.
        worker: u8,
        /// Sequence bits.
        seq: u8,
    },
    /// Too few time bits to be useful (under 30 bits runs out within days).
    #[error("layout.time_bits = {0} is too small; use at least 30")]
    TimeTooNarrow(u8),
    /// Datacenter and worker fields are at most 16 bits each.
    #[error("layout.{field} = {bits} is too wide; at most 16 bits")]
    NodeFieldTooWide {
        /// Which field.
        field: &'static str,
        /// Its width.
        bits: u8,
    },
    /// A node must be able to issue at least two IDs per time unit.
    #[error("layout.sequence_bits = {0} is too small; use at least 1")]
    SequenceTooNarrow(u8),
    /// The time unit must be a whole number of milliseconds from 1 ms to 1 s.
    #[error("layout.time_unit = {0} ms is out of range; use 1 ms to 1000 ms")]
    BadTimeUnit(u64),
    /// The epoch lies after the current time, so no valid ID could be made.
    #[error("layout.epoch ({epoch_ms} ms since 1970) is in the future (now is {now_ms} ms); pick an epoch in the past")]
    EpochInFuture {
        /// Configured epoch, Unix milliseconds.
        epoch_ms: u64,
        /// The clock's current time, Unix milliseconds.
        now_ms: u64,
    },
    /// The time field is already exhausted at the current time.
    #[error("layout's {bits} time bits ran out at {end_ms} ms since 1970: no more snowflake IDs can be issued under it. Do not move the epoch forward (new IDs would repeat old ones); change to a layout whose IDs all lie above every ID issued so far (`idgen admin layout set` in a cluster refuses any other), or use segment or lease mode")]
    TimeExhausted {
        /// Time bits.
        bits: u8,
        /// Unix milliseconds at which the time field overflows.
        end_ms: u64,
    },
    /// The configured datacenter id does not fit the datacenter bits.
    #[error("datacenter id {id} does not fit in {bits} bits (allowed 0..={max})")]
    DatacenterOutOfRange {
        /// The id.
        id: u64,
        /// Datacenter bits.
        bits: u8,
        /// Largest allowed id.
        max: u64,
    },
    /// The configured worker id does not fit the worker bits.
    #[error("worker id {id} does not fit in {bits} bits (allowed 0..={max})")]
    WorkerOutOfRange {
        /// The id.
        id: u64,
        /// Worker bits.
        bits: u8,
        /// Largest allowed id.
        max: u64,
    },
    /// An unknown preset name.
    #[error("unknown layout preset {0:?}; use twitter, sonyflake or js53")]
    UnknownPreset(String),
}

impl LayoutError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Precondition
    }
}

/// Why an ID could not be decoded under a layout.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("id {id} has bits set above bit {bits} of this layout ({layout}); it was not produced under this layout")]
pub struct DecodeError {
    /// The ID that was refused.
    pub id: u64,
    /// How many bits the layout uses.
    pub bits: u32,
    /// The layout, as text.
    pub layout: String,
}

/// A named, well-known layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// Twitter's original: 41 bits of ms, 5 datacenter, 5 worker, 12
    /// sequence (4,096,000 IDs/s per worker, 69 years).
    Twitter,
    /// Sony's sonyflake: 39 bits of 10 ms (174 years), a 16-bit machine id
    /// (here 8 datacenter + 8 worker bits), 8 sequence bits (25,600 IDs/s
    /// per worker). The sequence stays the lowest field so that IDs from
    /// one node are strictly increasing.
    Sonyflake,
    /// Every ID below 2^53, so it survives a JavaScript number: 41 bits of
    /// ms, no datacenter bits, 4 worker bits, 8 sequence bits (256,000
    /// IDs/s per worker, 16 workers).
    Js53,
}

impl Preset {
    /// Parses a preset name as written in config.
    pub fn parse(name: &str) -> Result<Self, LayoutError> {
        match name {
            "twitter" => Ok(Self::Twitter),
            "sonyflake" => Ok(Self::Sonyflake),
            "js53" => Ok(Self::Js53),
            other => Err(LayoutError::UnknownPreset(other.to_owned())),
        }
    }

    /// The widths of this preset, with the given epoch.
    pub fn spec(self, epoch_ms: u64) -> LayoutSpec {
        let (time_unit_ms, time_bits, datacenter_bits, worker_bits, sequence_bits) = match self {
            Self::Twitter => (1, 41, 5, 5, 12),
            Self::Sonyflake => (10, 39, 8, 8, 8),
            Self::Js53 => (1, 41, 0, 4, 8),
        };
        LayoutSpec {
            epoch_ms,
            time_unit_ms,
            time_bits,
            datacenter_bits,
            worker_bits,
            sequence_bits,
        }
    }
}

/// The 2024-01-01T00:00:00Z epoch, in Unix milliseconds.
pub const DEFAULT_EPOCH_MS: u64 = 1_704_067_200_000;

/// An unvalidated layout, as read from config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutSpec {
    /// The instant time zero stands for, in Unix milliseconds.
    pub epoch_ms: u64,
    /// Length of one time step, in milliseconds.
    pub time_unit_ms: u64,
    /// Width of the time field.
    pub time_bits: u8,
    /// Width of the datacenter field (may be 0).
    pub datacenter_bits: u8,
    /// Width of the worker field (may be 0).
    pub worker_bits: u8,
    /// Width of the sequence field.
    pub sequence_bits: u8,
}

impl LayoutSpec {
    /// Checks the widths and the epoch against `now_ms` (Unix milliseconds).
    pub fn validate(self, now_ms: u64) -> Result<Layout, LayoutError> {
        let total = u32::from(self.time_bits)
            + u32::from(self.datacenter_bits)
            + u32::from(self.worker_bits)
            + u32::from(self.sequence_bits);
        if total > 63 {
            return Err(LayoutError::TooWide {
                total,
                time: self.time_bits,
                dc: self.datacenter_bits,
                worker: self.worker_bits,
                seq: self.sequence_bits,
            });
        }
        for (field, bits) in [
            ("datacenter_bits", self.datacenter_bits),
            ("worker_bits", self.worker_bits),
        ] {
            if bits > 16 {
                return Err(LayoutError::NodeFieldTooWide { field, bits });
            }
        }
        if self.time_bits < 30 {
            return Err(LayoutError::TimeTooNarrow(self.time_bits));
        }
        if self.sequence_bits < 1 {
            return Err(LayoutError::SequenceTooNarrow(self.sequence_bits));
        }
        if !(1..=1000).contains(&self.time_unit_ms) {
            return Err(LayoutError::BadTimeUnit(self.time_unit_ms));
        }
        if self.epoch_ms > now_ms {
            return Err(LayoutError::EpochInFuture {
                epoch_ms: self.epoch_ms,
                now_ms,
            });
        }
        let layout = Layout {
            spec: self,
            total_bits: total,
        };
        if layout.units_at(now_ms) > layout.max_time() {
            return Err(LayoutError::TimeExhausted {
                bits: self.time_bits,
                end_ms: layout.end_ms(),
            });
        }
        Ok(layout)
    }
}

/// A validated layout. Cheap to copy; all methods are shifts and masks.
///
/// ```
/// use idgen::id::{Preset, DEFAULT_EPOCH_MS};
///
/// let now_ms = DEFAULT_EPOCH_MS + 86_400_000; // a day after the epoch
/// let layout = Preset::Twitter.spec(DEFAULT_EPOCH_MS).validate(now_ms).unwrap();
/// let id = layout.compose(layout.units_at(now_ms), layout.node_bits(3, 17), 42);
/// let parts = layout.decompose(id).unwrap();
/// assert_eq!((parts.unix_ms, parts.datacenter, parts.worker, parts.sequence), (now_ms, 3, 17, 42));
/// // Bits above the layout's 63 are refused.
/// assert!(layout.decompose(u64::MAX).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    spec: LayoutSpec,
    total_bits: u32,
}

/// The parts of a decoded ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdParts {
    /// Time units since the layout's epoch.
    pub time_units: u64,
    /// The ID's time in Unix milliseconds (start of its time unit).
    pub unix_ms: u64,
    /// Datacenter field.
    pub datacenter: u64,
    /// Worker field.
    pub worker: u64,
    /// Sequence field.
    pub sequence: u64,
}

fn mask(bits: u8) -> u64 {
    if bits == 0 {
        0
    } else {
        u64::MAX >> (64 - u32::from(bits))
    }
}

impl Layout {
    /// The widths and epoch.
    pub fn spec(&self) -> LayoutSpec {
        self.spec
    }

    /// How many bits an ID uses (at most 63).
    pub fn total_bits(&self) -> u32 {
        self.total_bits
    }

    /// Length of a time unit in milliseconds.
    pub fn time_unit_ms(&self) -> u64 {
        self.spec.time_unit_ms
    }

    /// The largest time value the layout can hold.
    pub fn max_time(&self) -> u64 {
        mask(self.spec.time_bits)
    }

    /// The largest sequence value per time unit.
    pub fn max_sequence(&self) -> u64 {
        mask(self.spec.sequence_bits)
    }

    /// Sequence width.
    pub fn sequence_bits(&self) -> u8 {
        self.spec.sequence_bits
    }

    /// The largest datacenter id.
    pub fn max_datacenter(&self) -> u64 {
        mask(self.spec.datacenter_bits)
    }

    /// The largest worker id.
    pub fn max_worker(&self) -> u64 {
        mask(self.spec.worker_bits)
    }

    /// Checks a node's datacenter and worker ids against the widths.
    pub fn check_node(&self, datacenter: u64, worker: u64) -> Result<(), LayoutError> {
        if datacenter > self.max_datacenter() {
            return Err(LayoutError::DatacenterOutOfRange {
                id: datacenter,
                bits: self.spec.datacenter_bits,
                max: self.max_datacenter(),
            });
        }
        if worker > self.max_worker() {
            return Err(LayoutError::WorkerOutOfRange {
                id: worker,
                bits: self.spec.worker_bits,
                max: self.max_worker(),
            });
        }
        Ok(())
    }

    /// Time units since the epoch at Unix time `unix_ms` (0 before the epoch).
    pub fn units_at(&self, unix_ms: u64) -> u64 {
        unix_ms.saturating_sub(self.spec.epoch_ms) / self.spec.time_unit_ms
    }

    /// Unix milliseconds at the start of time unit `units`.
    pub fn unix_ms_of(&self, units: u64) -> u64 {
        self.spec
            .epoch_ms
            .saturating_add(units.saturating_mul(self.spec.time_unit_ms))
    }

    /// Unix milliseconds at which the time field overflows.
    pub fn end_ms(&self) -> u64 {
        self.unix_ms_of(self.max_time().saturating_add(1))
    }

    /// Years from `now_ms` until the time field runs out (negative once it has).
    pub fn years_left(&self, now_ms: u64) -> f64 {
        const MS_PER_YEAR: f64 = 365.25 * 24.0 * 3600.0 * 1000.0;
        (self.end_ms() as f64 - now_ms as f64) / MS_PER_YEAR
    }

    fn worker_shift(&self) -> u32 {
        u32::from(self.spec.sequence_bits)
    }

    fn datacenter_shift(&self) -> u32 {
        self.worker_shift() + u32::from(self.spec.worker_bits)
    }

    fn time_shift(&self) -> u32 {
        self.datacenter_shift() + u32::from(self.spec.datacenter_bits)
    }

    /// The datacenter and worker fields, in place, ready to OR into an ID.
    /// The caller has checked them with [`Layout::check_node`].
    pub fn node_bits(&self, datacenter: u64, worker: u64) -> u64 {
        ((datacenter & self.max_datacenter()) << self.datacenter_shift())
            | ((worker & self.max_worker()) << self.worker_shift())
    }

    /// Builds an ID from a time value, precomputed node bits and a sequence.
    #[inline]
    pub fn compose(&self, time_units: u64, node_bits: u64, sequence: u64) -> u64 {
        (time_units << self.time_shift()) | node_bits | sequence
    }

    /// Splits an ID into its parts; refuses bits above the layout's width.
    pub fn decompose(&self, id: u64) -> Result<IdParts, DecodeError> {
        if self.total_bits < 64 && id >> self.total_bits != 0 {
            return Err(DecodeError {
                id,
                bits: self.total_bits,
                layout: self.to_string(),
            });
        }
        let time_units = id >> self.time_shift();
        Ok(IdParts {
            time_units,
            unix_ms: self.unix_ms_of(time_units),
            datacenter: (id >> self.datacenter_shift()) & self.max_datacenter(),
            worker: (id >> self.worker_shift()) & self.max_worker(),
            sequence: id & self.max_sequence(),
        })
    }
}

impl Layout {
    /// The largest ID this layout can have produced for a time at or before
    /// `unix_ms`, on any node: that time unit with the largest datacenter,
    /// worker and sequence. What a layout change must stay above.
    pub fn max_id_at(&self, unix_ms: u64) -> u64 {
        let units = self.units_at(unix_ms).min(self.max_time());
        let node = self.node_bits(self.max_datacenter(), self.max_worker());
        self.compose(units, node, self.max_sequence())
    }

    /// The smallest ID this layout can produce at or after `unix_ms`, on any
    /// node: that time unit, datacenter 0, worker 0, sequence 0.
    pub fn first_id_at(&self, unix_ms: u64) -> u64 {
        self.compose(self.units_at(unix_ms).min(self.max_time()), 0, 0)
    }
}

/// One field in which two layouts differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutDifference {
    /// The config key (`layout.epoch`, `layout.time_bits`, ...).
    pub field: &'static str,
    /// The value on one side (for example the recorded layout), as text.
    pub left: String,
    /// The value on the other side (for example the configured layout).
    pub right: String,
}

impl LayoutSpec {
    /// Every field in which `self` and `other` differ, named by config key;
    /// empty when they describe the same IDs.
    pub fn differences(&self, other: &LayoutSpec) -> Vec<LayoutDifference> {
        let mut out = Vec::new();
        let mut cmp = |field: &'static str, a: String, b: String| {
            if a != b {
                out.push(LayoutDifference {
                    field,
                    left: a,
                    right: b,
                });
            }
        };
        cmp(
            "layout.epoch",
            epoch_text(self.epoch_ms),
            epoch_text(other.epoch_ms),
        );
        cmp(
            "layout.time_unit",
            format!("{}ms", self.time_unit_ms),
            format!("{}ms", other.time_unit_ms),
        );
        cmp(
            "layout.time_bits",
            self.time_bits.to_string(),
            other.time_bits.to_string(),
        );
        cmp(
            "layout.datacenter_bits",
            self.datacenter_bits.to_string(),
            other.datacenter_bits.to_string(),
        );
        cmp(
            "layout.worker_bits",
            self.worker_bits.to_string(),
            other.worker_bits.to_string(),
        );
        cmp(
            "layout.sequence_bits",
            self.sequence_bits.to_string(),
            other.sequence_bits.to_string(),
        );
        out
    }
}

/// An epoch as RFC 3339 text plus Unix ms, as an operator compares them.
/// Pure arithmetic (civil-from-days), no clock.
pub fn epoch_text(epoch_ms: u64) -> String {
    let secs = epoch_ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let ms = epoch_ms % 1000;
    let frac = if ms == 0 {
        String::new()
    } else {
        format!(".{ms:03}")
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}{frac}Z ({epoch_ms} ms)",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.spec;
        write!(
            f,
            "time {}x{}ms / datacenter {} / worker {} / sequence {} / epoch {}ms",
            s.time_bits,
            s.time_unit_ms,
            s.datacenter_bits,
            s.worker_bits,
            s.sequence_bits,
            s.epoch_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_790_000_000_000; // 2026-09

    #[test]
    fn epoch_text_reads_as_rfc3339() {
        assert_eq!(
            epoch_text(DEFAULT_EPOCH_MS),
            "2024-01-01T00:00:00Z (1704067200000 ms)"
        );
        assert_eq!(
            epoch_text(1_790_000_000_123),
            "2026-09-21T14:13:20.123Z (1790000000123 ms)"
        );
    }

    #[test]
    fn differences_name_each_field() {
        let a = Preset::Twitter.spec(DEFAULT_EPOCH_MS);
        assert!(a.differences(&a).is_empty());
        let b = Preset::Sonyflake.spec(DEFAULT_EPOCH_MS + 1000);
        let fields: Vec<_> = a.differences(&b).iter().map(|d| d.field).collect();
        assert_eq!(
            fields,
            [
                "layout.epoch",
                "layout.time_unit",
                "layout.time_bits",
                "layout.datacenter_bits",
                "layout.worker_bits",
                "layout.sequence_bits"
            ]
        );
    }

    #[test]
    fn max_and_first_ids_bound_every_node() {
        let l = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(NOW)
            .unwrap();
        let at = l.units_at(NOW);
        let top = l.compose(at, l.node_bits(31, 31), 4095);
        assert_eq!(l.max_id_at(NOW), top);
        assert_eq!(l.first_id_at(NOW), l.compose(at, 0, 0));
        // Every ID of that unit lies between the two.
        let some = l.compose(at, l.node_bits(3, 9), 17);
        assert!(l.first_id_at(NOW) <= some && some <= l.max_id_at(NOW));
        assert!(l.max_id_at(NOW) < l.first_id_at(NOW + 1));
    }

    fn all_presets() -> [Preset; 3] {
        [Preset::Twitter, Preset::Sonyflake, Preset::Js53]
    }

    #[test]
    fn presets_validate_and_fit() {
        for p in all_presets() {
            let l = p
                .spec(DEFAULT_EPOCH_MS)
                .validate(NOW)
                .expect("preset is valid");
            assert!(l.total_bits() <= 63, "{p:?}");
            assert!(
                l.years_left(NOW) > 30.0,
                "{p:?} has {} years",
                l.years_left(NOW)
            );
        }
        let js = Preset::Js53.spec(DEFAULT_EPOCH_MS).validate(NOW).unwrap();
        assert!(js.total_bits() <= 53);
        let tw = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(NOW)
            .unwrap();
        assert_eq!(tw.max_sequence(), 4095);
        assert_eq!(tw.max_worker(), 31);
        assert_eq!(tw.max_datacenter(), 31);
    }

    #[test]
    fn round_trip_every_preset_at_the_field_edges() {
        for p in all_presets() {
            let l = p.spec(DEFAULT_EPOCH_MS).validate(NOW).unwrap();
            let times = [0, 1, l.units_at(NOW), l.max_time()];
            let dcs = [0, l.max_datacenter()];
            let workers = [0, 1.min(l.max_worker()), l.max_worker()];
            let seqs = [0, 1, l.max_sequence()];
            for &t in &times {
                for &dc in &dcs {
                    for &w in &workers {
                        for &s in &seqs {
                            let id = l.compose(t, l.node_bits(dc, w), s);
                            assert!(id < 1 << l.total_bits(), "{p:?} overflowed");
                            let parts = l.decompose(id).unwrap();
                            assert_eq!(
                                (
                                    parts.time_units,
                                    parts.datacenter,
                                    parts.worker,
                                    parts.sequence
                                ),
                                (t, dc, w, s),
                                "{p:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn ids_sort_by_time_then_node_then_sequence() {
        let l = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(NOW)
            .unwrap();
        let a = l.compose(10, l.node_bits(31, 31), 4095);
        let b = l.compose(11, l.node_bits(0, 0), 0);
        assert!(a < b);
        let c = l.compose(11, l.node_bits(0, 0), 1);
        assert!(b < c);
    }

    #[test]
    fn refuses_bad_layouts() {
        let mut s = Preset::Twitter.spec(DEFAULT_EPOCH_MS);
        s.time_bits = 42;
        assert!(matches!(
            s.validate(NOW),
            Err(LayoutError::TooWide { total: 64, .. })
        ));
        let mut s = Preset::Twitter.spec(DEFAULT_EPOCH_MS);
        s.sequence_bits = 0;
        s.time_bits = 41;
        assert!(matches!(
            s.validate(NOW),
            Err(LayoutError::SequenceTooNarrow(0))
        ));
        let mut s = Preset::Twitter.spec(DEFAULT_EPOCH_MS);
        s.time_unit_ms = 0;
        assert!(matches!(s.validate(NOW), Err(LayoutError::BadTimeUnit(0))));
        let s = Preset::Twitter.spec(NOW + 1);
        assert!(matches!(
            s.validate(NOW),
            Err(LayoutError::EpochInFuture { .. })
        ));
        let mut s = Preset::Twitter.spec(DEFAULT_EPOCH_MS);
        s.time_bits = 30; // 2^30 ms is 12 days, long gone since 2024
        s.sequence_bits = 23;
        assert!(matches!(
            s.validate(NOW),
            Err(LayoutError::TimeExhausted { .. })
        ));
        let mut s = Preset::Twitter.spec(DEFAULT_EPOCH_MS);
        s.time_bits = 29;
        assert!(matches!(
            s.validate(NOW),
            Err(LayoutError::TimeTooNarrow(29))
        ));
        let mut s = Preset::Twitter.spec(DEFAULT_EPOCH_MS);
        s.worker_bits = 17;
        s.sequence_bits = 0;
        assert!(matches!(
            s.validate(NOW),
            Err(LayoutError::NodeFieldTooWide { .. })
        ));
        assert!(matches!(
            Preset::parse("tweeter"),
            Err(LayoutError::UnknownPreset(_))
        ));
    }

    #[test]
    fn node_ids_are_range_checked() {
        let l = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(NOW)
            .unwrap();
        assert!(l.check_node(31, 31).is_ok());
        assert!(matches!(
            l.check_node(32, 0),
            Err(LayoutError::DatacenterOutOfRange { id: 32, .. })
        ));
        assert!(matches!(
            l.check_node(0, 32),
            Err(LayoutError::WorkerOutOfRange { id: 32, .. })
        ));
        let js = Preset::Js53.spec(DEFAULT_EPOCH_MS).validate(NOW).unwrap();
        assert!(js.check_node(1, 0).is_err(), "js53 has no datacenter bits");
    }

    #[test]
    fn decode_refuses_bits_above_the_layout() {
        let l = Preset::Js53.spec(DEFAULT_EPOCH_MS).validate(NOW).unwrap();
        let err = l.decompose(1 << 53).unwrap_err();
        assert_eq!(err.bits, 53);
        let tw = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(NOW)
            .unwrap();
        assert!(tw.decompose(u64::MAX).is_err());
        assert!(tw.decompose(i64::MAX as u64).is_ok());
    }
}
