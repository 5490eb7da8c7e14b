//! Fixed-width decimal fields: a version digit, then FF1 radix 10.

use super::aes_chain::AesChain;
use super::ff1::{aes256, Ff1Decimal, LANES, MAX_DIGITS, MIN_DIGITS};
use super::{HideError, HideKey, KeyVersion, Versions};
use aes::Aes256;

/// The subkey label of FF1 radix 10 (see [`HideKey`]: one label per
/// algorithm).
const FF1_LABEL: &[u8] = b"ff1-radix10-aes256";

/// Hides values of a decimal field `digits` wide: the leading digit is the
/// key version (0 to 9), the other `digits - 1` digits are FF1 (radix 10,
/// AES-256, empty tweak) of the internal value under that version's key.
///
/// Cost, plainly: one digit of the field goes to the version, so the field
/// holds `10^(digits - 1)` internal values ([`DecimalHider::capacity`]),
/// a tenth of the plain field, and a namespace can have ten keys over its
/// life. FF1 needs at least 10^6 values, so `digits` is 7 to 19.
///
/// ```
/// use idgen::id::hide::{DecimalHider, HideKey};
///
/// let key = HideKey::new(2, [7; 32]);
/// let hider = DecimalHider::new(&[&key], 2, 10).unwrap();
/// let shown = hider.hide(41).unwrap();
/// assert_eq!(shown / 1_000_000_000, 2); // the version digit
/// assert_eq!(hider.reveal(shown).unwrap(), (2, 41));
/// ```
pub struct DecimalHider {
    versions: Versions<Ff1Decimal<Aes256>>,
    digits: u32,
    capacity: u64,
}

impl DecimalHider {
    /// A hider for a field of `digits` digits (7 to 19) that hides with
    /// the key of version `active` and reveals IDs of every key in `keys`
    /// (live and retired).
    pub fn new(keys: &[&HideKey], active: KeyVersion, digits: u32) -> Result<Self, HideError> {
        if digits > MAX_DIGITS {
            return Err(HideError::BadWidth {
                what: format!("a hidden decimal field of {digits} digits does not fit a 64-bit ID"),
                fix: "use at most 19 digits",
            });
        }
        if digits < MIN_DIGITS + 1 {
            return Err(HideError::DomainTooSmall {
                what: format!("a hidden decimal field of {digits} digits (one is the key version)"),
                got: format!("10^{}", digits.saturating_sub(1)),
                min: format!("10^{MIN_DIGITS} (FF1's minimum, so at least 7 digits)"),
            });
        }
        let n = digits - 1;
        let versions = Versions::build(keys, active, 9, |key| {
            let subkey = key.subkey(FF1_LABEL);
            Ff1Decimal::new(aes256(&subkey.0), n, &[]).with_chain(AesChain::aes256(&subkey.0))
        })?;
        Ok(Self {
            versions,
            digits,
            capacity: 10u64.pow(n),
        })
    }

    /// How many internal values the field holds: `10^(digits - 1)`; hide
    /// takes `0..capacity`.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The field's width in digits, version digit included.
    pub fn digits(&self) -> u32 {
        self.digits
    }

    /// The active version's digit followed by FF1 of `internal`.
    #[inline]
    pub fn hide(&self, internal: u64) -> Result<u64, HideError> {
        if internal >= self.capacity {
            return Err(HideError::OutOfDomain {
                value: internal,
                max: self.capacity - 1,
            });
        }
        let (version, ff1) = self.versions.active();
        Ok(u64::from(version) * self.capacity + ff1.encrypt(internal))
    }

    /// Hides every value of `values` in place: the same IDs as
    /// [`DecimalHider::hide`] one by one, computed eight at a time so the
    /// AES calls of a batch overlap (the path for `GenIds` of many IDs).
    /// If any value is outside the domain, nothing is changed and the
    /// error names the first such value.
    pub fn hide_in_place(&self, values: &mut [u64]) -> Result<(), HideError> {
        if let Some(&value) = values.iter().find(|&&v| v >= self.capacity) {
            return Err(HideError::OutOfDomain {
                value,
                max: self.capacity - 1,
            });
        }
        let (version, ff1) = self.versions.active();
        let shift = u64::from(version) * self.capacity;
        for chunk in values.chunks_mut(LANES) {
            ff1.encrypt_lanes(chunk);
            for v in chunk {
                *v += shift;
            }
        }
        Ok(())
    }

    /// The hidden IDs of `internal`, in order: [`DecimalHider::hide_in_place`]
    /// on a copy.
    pub fn hide_many(&self, internal: &[u64]) -> Result<Vec<u64>, HideError> {
        let mut values = internal.to_vec();
        self.hide_in_place(&mut values)?;
        Ok(values)
    }

    /// The version and internal value of a shown field value.
    pub fn reveal(&self, shown: u64) -> Result<(KeyVersion, u64), HideError> {
        let max = 10 * self.capacity - 1;
        if shown > max {
            return Err(HideError::NotHidden { value: shown, max });
        }
        // shown <= 10 * capacity - 1, so the quotient is at most 9.
        let version = (shown / self.capacity) as KeyVersion;
        let ff1 = self.versions.get(version)?;
        Ok((version, ff1.decrypt(shown % self.capacity)))
    }
}
