//! Integers of up to 63 bits: version bits on top, a Feistel network of
//! exactly the domain below.

use super::feistel::{mask, Feistel, LANES, MAX_BITS};
use super::{HideError, HideKey, KeyVersion, Versions};

/// The subkey label of the Feistel round function.
pub(super) const FEISTEL_LABEL: &[u8] = b"feistel-aes128-round";
/// The widest version field (256 key versions).
pub(super) const MAX_VERSION_BITS: u32 = 8;

/// The smallest integer domain [`IntHider`] takes.
const MIN_DOMAIN_BITS: u32 = 20;

/// Checks a version field width and returns the largest version.
pub(super) fn max_version(version_bits: u32) -> Result<KeyVersion, HideError> {
    if !(1..=MAX_VERSION_BITS).contains(&version_bits) {
        return Err(HideError::BadWidth {
            what: format!("version_bits = {version_bits} is out of range"),
            fix: "use 1 to 8 bits for the key version (2 to 256 keys over the namespace's life)",
        });
    }
    Ok(mask(version_bits) as KeyVersion)
}

/// Builds one Feistel network of `bits` bits per key.
pub(super) fn feistels(
    keys: &[&HideKey],
    active: KeyVersion,
    version_bits: u32,
    bits: u32,
) -> Result<Versions<Feistel>, HideError> {
    let max = max_version(version_bits)?;
    Versions::build(keys, active, max, |key| {
        Feistel::new(&key.subkey(FEISTEL_LABEL).0, bits)
    })
}

/// Hides integers below `2^domain_bits`: the output's top `version_bits`
/// bits (of `version_bits + domain_bits`) hold the key version, the
/// `domain_bits` below them a keyed Feistel permutation (10 rounds,
/// AES-128 round function) of the internal value.
///
/// Cost, plainly: the version bits come out of the 63 a positive ID has,
/// so with `version_bits = 2` at most 2^61 internal values fit; a
/// namespace can have `2^version_bits` keys over its life.
///
/// ```
/// use idgen::id::hide::{HideKey, IntHider};
///
/// let key = HideKey::new(1, [9; 32]);
/// let hider = IntHider::new(&[&key], 1, 2, 40).unwrap();
/// let shown = hider.hide(1_000).unwrap();
/// assert_eq!(shown >> 40, 1); // the version bits
/// assert_eq!(hider.reveal(shown).unwrap(), (1, 1_000));
/// ```
pub struct IntHider {
    versions: Versions<Feistel>,
    domain_bits: u32,
    version_bits: u32,
}

impl IntHider {
    /// A hider of `domain_bits`-bit values (at least 20) under a
    /// `version_bits`-bit version field (1 to 8), the two together at most
    /// 63 bits, hiding with the key of version `active` and revealing IDs
    /// of every key in `keys` (live and retired).
    pub fn new(
        keys: &[&HideKey],
        active: KeyVersion,
        version_bits: u32,
        domain_bits: u32,
    ) -> Result<Self, HideError> {
        if version_bits.saturating_add(domain_bits) > MAX_BITS {
            return Err(HideError::BadWidth {
                what: format!(
                    "version_bits {version_bits} + domain_bits {domain_bits} = {} bits",
                    version_bits.saturating_add(domain_bits)
                ),
                fix: "the two must fit the 63 bits of a positive 64-bit ID",
            });
        }
        if domain_bits < MIN_DOMAIN_BITS {
            return Err(HideError::DomainTooSmall {
                what: format!("a hidden integer of {domain_bits} bits"),
                got: format!("2^{domain_bits}"),
                min: format!("2^{MIN_DOMAIN_BITS}"),
            });
        }
        let versions = feistels(keys, active, version_bits, domain_bits)?;
        Ok(Self {
            versions,
            domain_bits,
            version_bits,
        })
    }

    /// How many internal values it takes: `2^domain_bits`.
    pub fn capacity(&self) -> u64 {
        1u64 << self.domain_bits
    }

    /// The active version in the top bits, the permuted value below.
    #[inline]
    pub fn hide(&self, internal: u64) -> Result<u64, HideError> {
        if internal >> self.domain_bits != 0 {
            return Err(HideError::OutOfDomain {
                value: internal,
                max: mask(self.domain_bits),
            });
        }
        let (version, feistel) = self.versions.active();
        Ok((u64::from(version) << self.domain_bits) | feistel.encrypt(internal, 0))
    }

    /// Hides every value of `values` in place: the same IDs as
    /// [`IntHider::hide`] one by one, computed sixteen at a time so the AES
    /// calls of a batch overlap (the path for `GenIds` of many IDs). If
    /// any value is outside the domain, nothing is changed and the error
    /// names the first such value.
    pub fn hide_in_place(&self, values: &mut [u64]) -> Result<(), HideError> {
        if let Some(&value) = values.iter().find(|&&v| v >> self.domain_bits != 0) {
            return Err(HideError::OutOfDomain {
                value,
                max: mask(self.domain_bits),
            });
        }
        let (version, feistel) = self.versions.active();
        let version = u64::from(version) << self.domain_bits;
        let tweaks = [0; LANES];
        for chunk in values.chunks_mut(LANES) {
            feistel.encrypt_lanes(chunk, &tweaks[..chunk.len()]);
            for v in chunk {
                *v |= version;
            }
        }
        Ok(())
    }

    /// The hidden IDs of `internal`, in order: [`IntHider::hide_in_place`]
    /// on a copy.
    pub fn hide_many(&self, internal: &[u64]) -> Result<Vec<u64>, HideError> {
        let mut values = internal.to_vec();
        self.hide_in_place(&mut values)?;
        Ok(values)
    }

    /// The version and internal value of a shown ID.
    pub fn reveal(&self, shown: u64) -> Result<(KeyVersion, u64), HideError> {
        let bits = self.domain_bits + self.version_bits;
        if shown >> bits != 0 {
            return Err(HideError::NotHidden {
                value: shown,
                max: mask(bits),
            });
        }
        // shown < 2^(domain + version bits) and version_bits <= 8.
        let version = (shown >> self.domain_bits) as KeyVersion;
        let feistel = self.versions.get(version)?;
        Ok((version, feistel.decrypt(shown & mask(self.domain_bits), 0)))
    }
}
