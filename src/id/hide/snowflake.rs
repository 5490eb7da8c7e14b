//! Snowflake IDs, hidden two ways: sortable (time kept) or opaque.

use super::feistel::{mask, Feistel, LANES};
use super::int::feistels;
use super::{HideError, HideKey, KeyVersion, Versions};
use crate::id::layout::{Layout, LayoutSpec};

/// The fewest bits a sortable hider permutes per time unit: below 2^8
/// values the permutation of one millisecond hides too little.
const MIN_SORTABLE_BITS: u32 = 8;
/// The fewest bits an opaque hider permutes.
const MIN_OPAQUE_BITS: u32 = 20;

/// How a snowflake ID is hidden.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnowflakeHiding {
    /// The time bits stay in clear, so hidden IDs still sort by time and
    /// keep B-tree locality; the key version and a permutation of the
    /// datacenter, worker and sequence bits, tweaked by the time, fill the
    /// rest. Hides how many IDs were issued in a time unit and across
    /// units, and which node issued one; shows when an ID was issued.
    ///
    /// Cost: the version field comes out of the sequence, so a node issues
    /// `2^version_bits` times fewer IDs per time unit (the internal layout,
    /// [`SnowflakeHider::internal_spec`], has that many fewer sequence
    /// values).
    Sortable,
    /// The whole ID is permuted (one fixed tweak), the key version on top.
    /// Hides time, node and count; loses order and B-tree locality.
    ///
    /// Cost: the output keeps the layout's width (a `js53` ID stays below
    /// 2^53), so internal IDs must stay below `2^(total_bits -
    /// version_bits)`: the layout runs out of time `2^version_bits` times
    /// sooner ([`SnowflakeHider::max_internal`], [`SnowflakeHider::end_ms`]).
    Opaque,
}

/// Hides snowflake IDs of one layout. Internal IDs are composed under
/// [`SnowflakeHider::internal_spec`] (for sortable, the layout with
/// `version_bits` fewer sequence bits; for opaque, the layout itself, up
/// to [`SnowflakeHider::max_internal`]); hidden IDs use at most the
/// layout's `total_bits`, so they fit wherever plain IDs fit.
///
/// Output, most significant bit first:
/// - sortable: `time | version | F_time(datacenter, worker, sequence)`;
/// - opaque: `version | F(internal id)`.
///
/// ```
/// use idgen::id::hide::{HideKey, SnowflakeHider, SnowflakeHiding};
/// use idgen::id::{Preset, DEFAULT_EPOCH_MS};
///
/// let layout = Preset::Twitter.spec(DEFAULT_EPOCH_MS).validate(DEFAULT_EPOCH_MS + 1).unwrap();
/// let key = HideKey::new(0, [3; 32]);
/// let hider = SnowflakeHider::new(&[&key], 0, &layout, SnowflakeHiding::Sortable, 2).unwrap();
/// let id = (1_000u64 << 20) | 5; // time unit 1000, sequence 5, internal layout
/// let shown = hider.hide(id).unwrap();
/// assert_eq!(shown >> 22, 1_000); // the time stays in clear
/// assert_eq!(hider.reveal(shown).unwrap(), (0, id));
/// ```
pub struct SnowflakeHider {
    versions: Versions<Feistel>,
    hiding: SnowflakeHiding,
    layout: Layout,
    version_bits: u32,
    /// Bits the Feistel permutes.
    permuted_bits: u32,
    /// Bits below the time field in the public layout.
    node_bits: u32,
}

impl SnowflakeHider {
    /// A hider for IDs of `layout`, hiding with the key of version
    /// `active` and revealing IDs of every key in `keys` (live and
    /// retired), with a `version_bits`-bit version field (1 to 8).
    pub fn new(
        keys: &[&HideKey],
        active: KeyVersion,
        layout: &Layout,
        hiding: SnowflakeHiding,
        version_bits: u32,
    ) -> Result<Self, HideError> {
        let spec = layout.spec();
        let node_bits = u32::from(spec.datacenter_bits)
            + u32::from(spec.worker_bits)
            + u32::from(spec.sequence_bits);
        let permuted_bits = match hiding {
            SnowflakeHiding::Sortable => sortable_bits(&spec, node_bits, version_bits)?,
            SnowflakeHiding::Opaque => opaque_bits(layout.total_bits(), version_bits)?,
        };
        let versions = feistels(keys, active, version_bits, permuted_bits)?;
        Ok(Self {
            versions,
            hiding,
            layout: *layout,
            version_bits,
            permuted_bits,
            node_bits,
        })
    }

    /// The layout internal IDs are composed under: for sortable the
    /// layout with `version_bits` fewer sequence bits, for opaque the
    /// layout itself (whose IDs must also stay at or below
    /// [`SnowflakeHider::max_internal`]).
    pub fn internal_spec(&self) -> LayoutSpec {
        let mut spec = self.layout.spec();
        if self.hiding == SnowflakeHiding::Sortable {
            spec.sequence_bits -= self.version_bits as u8;
        }
        spec
    }

    /// The layout a generator composes internal IDs under, for a hider of
    /// `spec` with `hiding` and `version_bits`: for sortable
    /// [`SnowflakeHider::internal_spec`]; for opaque the layout with
    /// `version_bits` fewer time bits, whose every ID is at most
    /// [`SnowflakeHider::max_internal`] (so its time runs out
    /// `2^version_bits` times sooner, and a time-left check on it says
    /// so). Computed without keys, so configuration can check it.
    pub fn generator_spec(
        spec: LayoutSpec,
        hiding: SnowflakeHiding,
        version_bits: u32,
    ) -> LayoutSpec {
        let bits = version_bits.min(u32::from(u8::MAX)) as u8;
        let mut out = spec;
        match hiding {
            SnowflakeHiding::Sortable => out.sequence_bits = out.sequence_bits.saturating_sub(bits),
            SnowflakeHiding::Opaque => out.time_bits = out.time_bits.saturating_sub(bits),
        }
        out
    }

    /// The largest internal ID it can take: `2^(total_bits -
    /// version_bits) - 1` for both variants. For sortable that is the
    /// internal layout's last ID; for opaque it cuts the layout's time.
    pub fn max_internal(&self) -> u64 {
        mask(self.layout.total_bits() - self.version_bits)
    }

    /// Unix milliseconds at which internal IDs would pass
    /// [`SnowflakeHider::max_internal`]: the end of the layout for
    /// sortable, `2^version_bits` times sooner after the epoch for opaque.
    pub fn end_ms(&self) -> u64 {
        let last_unit = self.max_internal() >> self.node_bits;
        let last_unit = match self.hiding {
            SnowflakeHiding::Sortable => self.layout.max_time(),
            SnowflakeHiding::Opaque => last_unit,
        };
        self.layout.unix_ms_of(last_unit + 1)
    }

    /// Which variant this is.
    pub fn hiding(&self) -> SnowflakeHiding {
        self.hiding
    }

    /// Hides an internal ID (see [`SnowflakeHider::internal_spec`]).
    #[inline]
    pub fn hide(&self, id: u64) -> Result<u64, HideError> {
        if id > self.max_internal() {
            return Err(HideError::OutOfDomain {
                value: id,
                max: self.max_internal(),
            });
        }
        let (version, feistel) = self.versions.active();
        let version = u64::from(version);
        let p = self.permuted_bits;
        Ok(match self.hiding {
            SnowflakeHiding::Sortable => {
                let time = id >> p;
                (time << self.node_bits) | (version << p) | feistel.encrypt(id & mask(p), time)
            }
            SnowflakeHiding::Opaque => (version << p) | feistel.encrypt(id, 0),
        })
    }

    /// Hides every internal ID of `ids` in place: the same IDs as
    /// [`SnowflakeHider::hide`] one by one, computed sixteen at a time so
    /// the AES calls of a batch overlap (the path for `GenIds` of many
    /// IDs). If any ID is above [`SnowflakeHider::max_internal`], nothing
    /// is changed and the error names the first such ID.
    pub fn hide_in_place(&self, ids: &mut [u64]) -> Result<(), HideError> {
        let max = self.max_internal();
        if let Some(&value) = ids.iter().find(|&&id| id > max) {
            return Err(HideError::OutOfDomain { value, max });
        }
        let (version, feistel) = self.versions.active();
        let p = self.permuted_bits;
        let version = u64::from(version) << p;
        let mut tweaks = [0u64; LANES];
        for chunk in ids.chunks_mut(LANES) {
            let tweaks = &mut tweaks[..chunk.len()];
            if self.hiding == SnowflakeHiding::Sortable {
                for (id, tweak) in chunk.iter_mut().zip(tweaks.iter_mut()) {
                    *tweak = *id >> p;
                    *id &= mask(p);
                }
            }
            feistel.encrypt_lanes(chunk, tweaks);
            for (id, &time) in chunk.iter_mut().zip(tweaks.iter()) {
                // For opaque every tweak is 0: only the version is added.
                *id |= (time << self.node_bits) | version;
            }
        }
        Ok(())
    }

    /// The hidden IDs of `ids`, in order: [`SnowflakeHider::hide_in_place`]
    /// on a copy.
    pub fn hide_many(&self, ids: &[u64]) -> Result<Vec<u64>, HideError> {
        let mut values = ids.to_vec();
        self.hide_in_place(&mut values)?;
        Ok(values)
    }

    /// The version and internal ID of a shown ID.
    pub fn reveal(&self, shown: u64) -> Result<(KeyVersion, u64), HideError> {
        let total = self.layout.total_bits();
        if shown >> total != 0 {
            return Err(HideError::NotHidden {
                value: shown,
                max: mask(total),
            });
        }
        let p = self.permuted_bits;
        // version_bits <= 8, so the masked field fits a KeyVersion.
        let version = ((shown >> p) & mask(self.version_bits)) as KeyVersion;
        let feistel = self.versions.get(version)?;
        let internal = match self.hiding {
            SnowflakeHiding::Sortable => {
                let time = shown >> self.node_bits;
                (time << p) | feistel.decrypt(shown & mask(p), time)
            }
            SnowflakeHiding::Opaque => feistel.decrypt(shown & mask(p), 0),
        };
        Ok((version, internal))
    }
}

/// Bits a sortable hider permutes: datacenter, worker and the sequence
/// bits left after the version field.
fn sortable_bits(spec: &LayoutSpec, node_bits: u32, version_bits: u32) -> Result<u32, HideError> {
    if version_bits >= u32::from(spec.sequence_bits) {
        return Err(HideError::BadWidth {
            what: format!(
                "sortable hiding takes its {version_bits} version bits from the {} sequence bits, leaving none",
                spec.sequence_bits
            ),
            fix: "use fewer version bits, or a layout with more sequence bits",
        });
    }
    let bits = node_bits - version_bits;
    if bits < MIN_SORTABLE_BITS {
        return Err(HideError::DomainTooSmall {
            what: "sortable hiding of this layout's datacenter, worker and sequence bits".into(),
            got: format!("2^{bits} per time unit"),
            min: format!("2^{MIN_SORTABLE_BITS}"),
        });
    }
    Ok(bits)
}

/// Bits an opaque hider permutes: the layout's width less the version.
fn opaque_bits(total_bits: u32, version_bits: u32) -> Result<u32, HideError> {
    let bits = total_bits.saturating_sub(version_bits);
    if bits < MIN_OPAQUE_BITS {
        return Err(HideError::DomainTooSmall {
            what: "opaque hiding of this layout".into(),
            got: format!("2^{bits}"),
            min: format!("2^{MIN_OPAQUE_BITS}"),
        });
    }
    Ok(bits)
}
