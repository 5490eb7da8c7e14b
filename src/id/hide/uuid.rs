//! UUIDv7, hidden sortable: the time, version and variant stay in clear,
//! the counter and node bits are permuted per millisecond.

use super::feistel::{mask, Feistel, LANES};
use super::int::feistels;
use super::{HideError, HideKey, KeyVersion, Versions};
use crate::id::uuid::{Uuid, UuidLayout, COUNTER_BITS};

/// The narrowest internal counter a hidden UUID keeps: the issue's 24
/// bits (at least 2^23 UUIDs in every millisecond, since a millisecond's
/// counter starts in the lower half of its range).
pub const MIN_HIDDEN_COUNTER_BITS: u32 = 24;

/// Set in every tweak of a UUID permutation: a snowflake tweak is a time
/// unit below 2^63, so a key shared with a sortable snowflake layout
/// never permutes UUIDs and snowflakes under the same tweak.
const UUID_TWEAK: u64 = 1 << 63;

/// Hides UUIDv7 sortable: `unix_ts_ms | 0111 | version | F_ms(counter,
/// node) | 10 | ... | random`. The key version takes the top
/// `version_bits` of the 26-bit counter field, so internal UUIDs are
/// composed with counters below `2^(26 - version_bits)`
/// ([`UuidHider::counter_bits`]); the Feistel permutes those counter bits
/// and the node bits together under the millisecond as its tweak, and
/// writes them back into the counter and node fields. The random bits are
/// left as they are (they are random already).
///
/// What it keeps: every shown UUID is a valid version 7, variant `10`
/// UUID; UUIDs of different milliseconds sort by time. Within one
/// millisecond the order is permuted. What it hides: how many UUIDs a
/// millisecond held or the node issued, and which node issued one.
///
/// ```
/// use idgen::id::hide::{HideKey, UuidHider};
/// use idgen::id::{Preset, UuidLayout, DEFAULT_EPOCH_MS};
///
/// let layout = Preset::Twitter.spec(DEFAULT_EPOCH_MS).validate(DEFAULT_EPOCH_MS + 1).unwrap();
/// let uuids = UuidLayout::of(&layout).unwrap();
/// let key = HideKey::new(1, [3; 32]);
/// let hider = UuidHider::new(&[&key], 1, &uuids, 2).unwrap();
/// let internal = uuids.compose(1_765_000_000_000, 5, uuids.node(1, 2), 77);
/// let shown = hider.hide(internal).unwrap();
/// assert_eq!(shown.version(), 7);
/// assert_eq!(shown.0 >> 80, internal.0 >> 80); // the time stays in clear
/// assert_eq!(hider.reveal(shown).unwrap(), (1, internal));
/// ```
pub struct UuidHider {
    versions: Versions<Feistel>,
    layout: UuidLayout,
    version_bits: u32,
    /// Bits of the node field.
    node_bits: u32,
}

impl UuidHider {
    /// A hider for UUIDs of `layout`, hiding with the key of version
    /// `active` and revealing UUIDs of every key in `keys`, with a
    /// `version_bits`-bit version field. Refused when the internal counter
    /// would be narrower than [`MIN_HIDDEN_COUNTER_BITS`].
    pub fn new(
        keys: &[&HideKey],
        active: KeyVersion,
        layout: &UuidLayout,
        version_bits: u32,
    ) -> Result<Self, HideError> {
        let counter_bits = COUNTER_BITS.saturating_sub(version_bits);
        if counter_bits < MIN_HIDDEN_COUNTER_BITS {
            return Err(HideError::BadWidth {
                what: format!(
                    "a hidden UUID takes its {version_bits} key version bits from the {COUNTER_BITS}-bit counter, leaving {counter_bits} (at least {MIN_HIDDEN_COUNTER_BITS} are needed)"
                ),
                fix: "use layout.hide_version_bits of 1 or 2 on a layout that serves hidden UUIDs",
            });
        }
        let node_bits = layout.node_bits();
        // The Feistel permutes the internal counter and the node bits.
        let versions = feistels(keys, active, version_bits, counter_bits + node_bits)?;
        Ok(Self {
            versions,
            layout: *layout,
            version_bits,
            node_bits,
        })
    }

    /// Width of the internal counter: the generator issues counters below
    /// `2^counter_bits` (each millisecond starting below half of that).
    pub fn counter_bits(&self) -> u32 {
        COUNTER_BITS - self.version_bits
    }

    /// The permuted value of an internal UUID (its counter over its node),
    /// its millisecond and its random bits; refused when the counter is
    /// too wide.
    #[inline]
    fn split(&self, internal: Uuid) -> Result<(u64, u64, u64), HideError> {
        let p = self
            .layout
            .decompose(internal)
            .map_err(|_| not_hidden_internal(internal))?;
        if p.counter >> self.counter_bits() != 0 {
            return Err(HideError::OutOfDomain {
                value: p.counter,
                max: mask(self.counter_bits()),
            });
        }
        let node = self.layout.node(p.datacenter, p.worker);
        Ok(((p.counter << self.node_bits) | node, p.unix_ms, p.random))
    }

    /// The shown UUID of permuted value `permuted` in millisecond
    /// `unix_ms` under key `version`, with the internal UUID's `random`.
    #[inline]
    fn shown(&self, unix_ms: u64, version: KeyVersion, permuted: u64, random: u64) -> Uuid {
        let counter = (u64::from(version) << self.counter_bits()) | (permuted >> self.node_bits);
        let node = permuted & mask(self.node_bits);
        self.layout.compose(unix_ms, counter, node, random)
    }

    /// Hides an internal UUID (its counter below `2^counter_bits`).
    #[inline]
    pub fn hide(&self, internal: Uuid) -> Result<Uuid, HideError> {
        let (value, ms, random) = self.split(internal)?;
        let (version, feistel) = self.versions.active();
        let permuted = feistel.encrypt(value, UUID_TWEAK | ms);
        Ok(self.shown(ms, version, permuted, random))
    }

    /// Hides every internal UUID of `uuids` in place: the same UUIDs as
    /// [`UuidHider::hide`] one by one, sixteen at a time so the AES calls
    /// of a batch overlap. On an error nothing is changed.
    pub fn hide_in_place(&self, uuids: &mut [Uuid]) -> Result<(), HideError> {
        let mut values = Vec::with_capacity(uuids.len());
        for u in uuids.iter() {
            values.push(self.split(*u)?);
        }
        let (version, feistel) = self.versions.active();
        let (mut xs, mut tweaks) = ([0u64; LANES], [0u64; LANES]);
        for (chunk, parts) in uuids.chunks_mut(LANES).zip(values.chunks(LANES)) {
            let n = chunk.len();
            for (k, &(value, ms, _)) in parts.iter().enumerate() {
                (xs[k], tweaks[k]) = (value, UUID_TWEAK | ms);
            }
            feistel.encrypt_lanes(&mut xs[..n], &tweaks[..n]);
            for (k, (u, &(_, ms, random))) in chunk.iter_mut().zip(parts).enumerate() {
                *u = self.shown(ms, version, xs[k], random);
            }
        }
        Ok(())
    }

    /// The key version and internal UUID of a shown one.
    pub fn reveal(&self, shown: Uuid) -> Result<(KeyVersion, Uuid), HideError> {
        let p = self
            .layout
            .decompose(shown)
            .map_err(|_| not_hidden_internal(shown))?;
        let counter_bits = self.counter_bits();
        // version_bits <= 2 here (checked in `new`): the field fits a KeyVersion.
        let version = (p.counter >> counter_bits) as KeyVersion;
        let feistel = self.versions.get(version)?;
        let node = self.layout.node(p.datacenter, p.worker);
        let permuted = ((p.counter & mask(counter_bits)) << self.node_bits) | node;
        let value = feistel.decrypt(permuted, UUID_TWEAK | p.unix_ms);
        let internal = self.layout.compose(
            p.unix_ms,
            value >> self.node_bits,
            value & mask(self.node_bits),
            p.random,
        );
        Ok((version, internal))
    }
}

/// A UUID that is not version 7 / variant 10 cannot have come from (or go
/// through) a UUID hider.
fn not_hidden_internal(uuid: Uuid) -> HideError {
    HideError::NotUuid {
        uuid: uuid.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    const MS: u64 = 1_765_000_000_000;

    use crate::id::uuid::tests::layout;

    fn key(version: KeyVersion) -> HideKey {
        HideKey::new(version, [version + 1; 32])
    }

    /// Internal UUIDs of `ms` as a node issues them: consecutive counters
    /// from `start` (below 2^24), nodes 1 and 2, random bits per UUID.
    fn internal(ms: u64, start: u64, n: u64) -> Vec<Uuid> {
        let l = layout();
        (0..n)
            .map(|i| l.compose(ms, start + i / 2, l.node(0, 1 + i % 2), i * 0x9e37_79b9))
            .collect()
    }

    /// Every shown UUID is version 7 and variant 10 with the internal
    /// UUID's time and random bits; it reveals to its internal UUID and
    /// key version; a batch shows what one-by-one hiding shows.
    #[test]
    fn every_hidden_uuid_is_v7_keeps_its_time_and_reveals_to_its_internal_one() {
        let l = layout();
        let k = key(1);
        let hider = UuidHider::new(&[&k], 1, &l, 2).expect("fits");
        assert_eq!(hider.counter_bits(), 24);
        let all = internal(MS, (1 << 24) - 600, 1_000);
        let mut batch = all.clone();
        hider.hide_in_place(&mut batch).expect("batch");
        for (u, shown) in all.iter().zip(&batch) {
            assert_eq!(hider.hide(*u), Ok(*shown), "batch and single differ");
            assert_eq!((shown.version(), shown.variant()), (7, 0b10), "{shown}");
            let (p, q) = (l.decompose(*u).unwrap(), l.decompose(*shown).unwrap());
            assert_eq!((q.unix_ms, q.random), (p.unix_ms, p.random));
            assert_eq!(q.counter >> 24, 1, "the key version in clear");
            assert_eq!(hider.reveal(*shown), Ok((1, *u)));
        }
        // A counter the key version would overwrite is refused.
        let wide = l.compose(MS, 1 << 24, 0, 0);
        assert!(matches!(
            hider.hide(wide),
            Err(HideError::OutOfDomain { .. })
        ));
    }

    /// Before and after a rotation (the same internal positions even,
    /// which a node never issues twice): every shown UUID is distinct,
    /// since the version field differs; the ones of a later millisecond
    /// sort after every one of an earlier millisecond; each reveals
    /// through the key that hid it, with both keys loaded.
    #[test]
    fn a_key_rotation_keeps_uuids_unique_and_ordered_by_time() {
        let l = layout();
        let (k0, k1) = (key(0), key(1));
        let before = UuidHider::new(&[&k0], 0, &l, 2).expect("fits");
        let after = UuidHider::new(&[&k0, &k1], 1, &l, 2).expect("fits");
        let mut seen = HashSet::new();
        let mut by_ms: Vec<(u64, Uuid, Uuid, KeyVersion)> = Vec::new();
        for ms in MS..MS + 4 {
            for (hider, version) in [(&before, 0), (&after, 1)] {
                for u in internal(ms, 5, 256) {
                    let shown = hider.hide(u).expect("hide");
                    assert!(seen.insert(shown), "{shown} shown twice");
                    by_ms.push((ms, shown, u, version));
                }
            }
        }
        for ms in MS..MS + 3 {
            let of = |m: u64| by_ms.iter().filter(move |e| e.0 == m).map(|e| e.1);
            let (last, next) = (of(ms).max(), of(ms + 1).min());
            assert!(last < next, "time order lost: {last:?} then {next:?}");
        }
        for (_, shown, u, version) in by_ms {
            assert_eq!(after.reveal(shown), Ok((version, u)));
        }
    }

    #[test]
    fn a_version_field_that_leaves_under_24_counter_bits_is_refused() {
        let k = key(0);
        let err = UuidHider::new(&[&k], 0, &layout(), 3)
            .err()
            .expect("refused");
        assert!(
            matches!(err, HideError::BadWidth { .. })
                && err.to_string().contains("hide_version_bits"),
            "{err}"
        );
    }
}
