//! STAND-IN for V1's keyed permutations (replaced at merge): same API,
//! toy affine permutations, not secure. Do not ship.

use thiserror::Error;

pub use crate::store::hide_keys::{HideKey, KeyVersion};

fn key_offset(k: &HideKey) -> u64 {
    u64::from(k.version()).wrapping_mul(0x1234_5678_9abc_def1)
}

/// Hiding errors.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HideError {
    /// Too small.
    #[error("domain too small")]
    DomainTooSmall,
    /// Out of domain.
    #[error("value {0} is out of the domain")]
    OutOfDomain(u64),
    /// Version too large.
    #[error("key version {0} does not fit the version field")]
    VersionOutOfRange(u64),
    /// Unknown version.
    #[error("unknown key version {0}")]
    UnknownVersion(u64),
}

fn offsets(keys: &[&HideKey]) -> Vec<(KeyVersion, u64)> {
    keys.iter().map(|k| (k.version(), key_offset(k))).collect()
}

/// Decimal.
pub struct DecimalHider {
    keys: Vec<(KeyVersion, u64)>,
    active: KeyVersion,
    cap: u64,
}

impl DecimalHider {
    /// New.
    pub fn new(keys: &[&HideKey], active: KeyVersion, digits: u32) -> Result<Self, HideError> {
        if digits < 7 {
            return Err(HideError::DomainTooSmall);
        }
        if active > 9 {
            return Err(HideError::VersionOutOfRange(u64::from(active)));
        }
        Ok(Self {
            keys: offsets(keys),
            active,
            cap: 10u64.pow(digits - 1),
        })
    }
    /// Capacity.
    pub fn capacity(&self) -> u64 {
        self.cap
    }
    /// Hide.
    pub fn hide(&self, internal: u64) -> Result<u64, HideError> {
        if internal >= self.cap {
            return Err(HideError::OutOfDomain(internal));
        }
        let k = self
            .keys
            .iter()
            .find(|k| k.0 == self.active)
            .map_or(0, |k| k.1);
        let p = ((u128::from(internal) * 7 + u128::from(k)) % u128::from(self.cap)) as u64;
        Ok(u64::from(self.active) * self.cap + p)
    }
    /// Reveal.
    pub fn reveal(&self, shown: u64) -> Result<(KeyVersion, u64), HideError> {
        let v = (shown / self.cap) as u8;
        let k = self
            .keys
            .iter()
            .find(|k| k.0 == v)
            .ok_or(HideError::UnknownVersion(u64::from(v)))?
            .1;
        let p = u128::from(shown % self.cap);
        let cap = u128::from(self.cap);
        let mut x = (p + cap - u128::from(k) % cap) % cap;
        // inverse of 7 mod cap by search over small multiples
        while x % 7 != 0 {
            x += cap;
        }
        Ok((v, (x / 7) as u64))
    }
}

/// Int.
pub struct IntHider {
    keys: Vec<(KeyVersion, u64)>,
    active: KeyVersion,
    domain_bits: u32,
    version_bits: u32,
}

impl IntHider {
    /// New.
    pub fn new(
        keys: &[&HideKey],
        active: KeyVersion,
        version_bits: u32,
        domain_bits: u32,
    ) -> Result<Self, HideError> {
        if u64::from(active) >= 1 << version_bits {
            return Err(HideError::VersionOutOfRange(u64::from(active)));
        }
        Ok(Self {
            keys: offsets(keys),
            active,
            domain_bits,
            version_bits,
        })
    }
    /// Capacity.
    pub fn capacity(&self) -> u64 {
        1 << self.domain_bits
    }
    /// Hide.
    pub fn hide(&self, internal: u64) -> Result<u64, HideError> {
        if internal >= self.capacity() {
            return Err(HideError::OutOfDomain(internal));
        }
        let k = self
            .keys
            .iter()
            .find(|k| k.0 == self.active)
            .map_or(0, |k| k.1);
        let mask = self.capacity() - 1;
        let p = internal.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(k) & mask;
        Ok((u64::from(self.active) << (63 - self.version_bits)) | p)
    }
    /// Reveal.
    pub fn reveal(&self, shown: u64) -> Result<(KeyVersion, u64), HideError> {
        let v = (shown >> (63 - self.version_bits)) as u8;
        let k = self
            .keys
            .iter()
            .find(|k| k.0 == v)
            .ok_or(HideError::UnknownVersion(u64::from(v)))?
            .1;
        let mask = self.capacity() - 1;
        let inv = {
            let a: u64 = 0x9E37_79B9_7F4A_7C15;
            let mut x: u64 = 1;
            for _ in 0..7 {
                x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
            }
            x
        };
        Ok((v, (shown & mask).wrapping_sub(k).wrapping_mul(inv) & mask))
    }
}
