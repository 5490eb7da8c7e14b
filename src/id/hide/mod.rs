//! Hiding volume: keyed permutations that turn an internal counter or
//! snowflake into an ID that does not show how many were issued.
//!
//! Each hider is a bijection of exactly its domain under one key, plus a
//! key-version field written in clear into the output. So:
//!
//! 1. **Uniqueness carries over.** Two different internal values under one
//!    key give two different outputs (a permutation has an inverse:
//!    `reveal(hide(x)) == x`), and every output stays inside the domain
//!    (FF1 and the Feistel network are permutations of exactly `0..10^n`
//!    or `0..2^n`; no truncation, no modulo that could merge values).
//! 2. **Rotation cannot collide.** Outputs of two key versions differ in
//!    the version field, so they can never be equal whatever the keys and
//!    internal values. The price: a version number may never be given to
//!    a second key (the caller's key store enforces it), so a namespace
//!    has at most 10 (decimal) or `2^version_bits` keys over its life.
//! 3. **One key, one algorithm.** The 32 bytes of a [`HideKey`] are never
//!    used directly: FF1 and the Feistel round function each get their own
//!    subkey, derived with HKDF-SHA256 under a label naming the algorithm.
//!
//! The variants: [`DecimalHider`] (fixed-width decimal fields, FF1 radix
//! 10 per NIST SP 800-38G rev. 1, with AES-256), [`IntHider`] (integers of
//! up to 63 bits, a keyed Feistel network), [`SnowflakeHider`]
//! (snowflake IDs, sortable or opaque; see [`SnowflakeHiding`]) and
//! [`UuidHider`] (UUIDv7, sortable: the same Feistel over the counter and
//! node bits).
//!
//! Hiders are built once from every key a namespace still decodes (live
//! and retired) and the active version, and then `hide` and `reveal` take
//! `&self`, allocate nothing and are safe to share between threads. For
//! many values at once, `hide_in_place` (and `hide_many`, which returns a
//! new `Vec`) gives the same IDs as `hide` one by one, computed side by
//! side (sixteen in 256-bit VAES registers for integers and snowflakes
//! where the processor has them, else eight per AES call), so a batch
//! costs a fraction of what single calls do.
//!
//! What hiding does not do: it is not encryption of a secret. Anyone with
//! many IDs still sees their number and, for sortable snowflakes, their
//! times; what they cannot read is how many IDs were issued between two
//! of theirs. `docs/HIDING.md` states the costs.

mod aes_chain;
mod decimal;
mod feistel;
mod ff1;
mod int;
mod keys;
mod snowflake;
#[cfg(test)]
mod tests;
mod uuid;

pub use decimal::DecimalHider;
pub use int::IntHider;
pub use keys::{HideKey, KeyVersion};
pub use snowflake::{SnowflakeHider, SnowflakeHiding};
pub use uuid::{UuidHider, MIN_HIDDEN_COUNTER_BITS};

use super::kind::ErrorKind;
use thiserror::Error;

/// Why a hider could not be built, or a value could not be hidden or
/// revealed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HideError {
    /// The permuted domain is too small to hide anything (FF1 needs at
    /// least 10^6 values, NIST SP 800-38G rev. 1; the Feistel at least
    /// 2^8 values per tweak).
    #[error("{what} permutes only {got}, below the minimum of {min}; give the hidden field more digits or bits")]
    DomainTooSmall {
        /// What was being built (`decimal field of 6 digits`, ...).
        what: String,
        /// The domain asked for, as text (`10^5`, `2^6`).
        got: String,
        /// The smallest allowed domain, as text.
        min: String,
    },
    /// The widths asked for do not fit a positive 64-bit ID.
    #[error("{what}; {fix}")]
    BadWidth {
        /// What is wrong (`version_bits 4 + domain_bits 62 = 66 > 63`).
        what: String,
        /// What to do about it.
        fix: &'static str,
    },
    /// A value to hide lies outside the hider's domain.
    #[error("internal value {value} is outside the hidden domain (at most {max}); it cannot be hidden without risking a repeat. Stop issuing in this namespace, or move it to a wider field")]
    OutOfDomain {
        /// The refused value.
        value: u64,
        /// The largest value the hider takes.
        max: u64,
    },
    /// Not a version 7, variant `10` UUID: no UUID hider made or takes it.
    #[error("{uuid} is not a version 7 UUID of this cluster; check that it was issued here")]
    NotUuid {
        /// The UUID's text.
        uuid: String,
    },
    /// A shown value is not one this hider could have produced (wrong
    /// width or bits where the hider writes none).
    #[error("{value} is not a hidden ID of this namespace (hidden IDs here are at most {max}); check that it was issued here")]
    NotHidden {
        /// The refused value.
        value: u64,
        /// The largest value the hider produces.
        max: u64,
    },
    /// A key version does not fit the version field.
    #[error("key version {version} does not fit the version field (versions 0..={max}); a namespace cannot have more keys over its life than its version field counts: move it to a new namespace with a wider field")]
    VersionOutOfRange {
        /// The version.
        version: KeyVersion,
        /// The largest version the field holds.
        max: KeyVersion,
    },
    /// A shown ID carries a version for which no key was given.
    #[error("key version {version} is not loaded; if the key was retired, load it again (retired keys stay decode-only); if it was deleted, IDs of that version can no longer be revealed")]
    UnknownVersion {
        /// The version read from the ID.
        version: KeyVersion,
    },
    /// Two keys were given with the same version.
    #[error("two keys have version {version}; a version belongs to one key forever (reusing it could repeat IDs): give each key its own version")]
    DuplicateVersion {
        /// The repeated version.
        version: KeyVersion,
    },
    /// No key was given for the active version.
    #[error(
        "no key with the active version {version} was given; load it or make a loaded key active"
    )]
    ActiveKeyMissing {
        /// The active version.
        version: KeyVersion,
    },
}

impl HideError {
    /// What kind of failure this is (see [`ErrorKind`]): a value outside
    /// the domain or not from this namespace is the caller's mistake; the
    /// rest are set-up problems an operator must fix.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NotHidden { .. } | Self::NotUuid { .. } => ErrorKind::BadRequest,
            Self::UnknownVersion { .. } => ErrorKind::NotFound,
            Self::OutOfDomain { .. } => ErrorKind::Exhausted,
            Self::DomainTooSmall { .. }
            | Self::BadWidth { .. }
            | Self::VersionOutOfRange { .. }
            | Self::DuplicateVersion { .. }
            | Self::ActiveKeyMissing { .. } => ErrorKind::Precondition,
        }
    }
}

/// A keyed permutation an engine shows internal values through: one
/// trait over the three hiders, so an engine's hidden output
/// (`modes::hidden`) is written once for all of them. It lives here, with
/// the hiders it covers, because it is pure: no I/O, no key ring.
pub trait Hider: Send + Sync + 'static {
    /// The value shown for `internal`.
    fn hide(&self, internal: u64) -> Result<u64, HideError>;
    /// The key version and internal value behind `shown`.
    fn reveal(&self, shown: u64) -> Result<(KeyVersion, u64), HideError>;
    /// Shows every value of `values` in place, as `hide` would one by
    /// one; on an error nothing is changed.
    fn hide_in_place(&self, values: &mut [u64]) -> Result<(), HideError>;
}

impl Hider for IntHider {
    fn hide(&self, internal: u64) -> Result<u64, HideError> {
        IntHider::hide(self, internal)
    }
    fn reveal(&self, shown: u64) -> Result<(KeyVersion, u64), HideError> {
        IntHider::reveal(self, shown)
    }
    fn hide_in_place(&self, values: &mut [u64]) -> Result<(), HideError> {
        IntHider::hide_in_place(self, values)
    }
}

impl Hider for DecimalHider {
    fn hide(&self, internal: u64) -> Result<u64, HideError> {
        DecimalHider::hide(self, internal)
    }
    fn reveal(&self, shown: u64) -> Result<(KeyVersion, u64), HideError> {
        DecimalHider::reveal(self, shown)
    }
    fn hide_in_place(&self, values: &mut [u64]) -> Result<(), HideError> {
        DecimalHider::hide_in_place(self, values)
    }
}

impl Hider for SnowflakeHider {
    fn hide(&self, internal: u64) -> Result<u64, HideError> {
        SnowflakeHider::hide(self, internal)
    }
    fn reveal(&self, shown: u64) -> Result<(KeyVersion, u64), HideError> {
        SnowflakeHider::reveal(self, shown)
    }
    fn hide_in_place(&self, values: &mut [u64]) -> Result<(), HideError> {
        SnowflakeHider::hide_in_place(self, values)
    }
}

/// The ciphers of every key version a hider knows, indexed by version,
/// and the active one. Built once; lookups are an index.
struct Versions<C> {
    by_version: Vec<Option<C>>,
    active: KeyVersion,
}

impl<C> Versions<C> {
    /// Builds one cipher per key with `make`; refuses versions above
    /// `max`, repeated versions and a missing active key.
    fn build(
        keys: &[&HideKey],
        active: KeyVersion,
        max: KeyVersion,
        make: impl Fn(&HideKey) -> C,
    ) -> Result<Self, HideError> {
        if active > max {
            return Err(HideError::VersionOutOfRange {
                version: active,
                max,
            });
        }
        let mut by_version: Vec<Option<C>> = (0..=max).map(|_| None).collect();
        for key in keys {
            let version = key.version();
            let slot = by_version
                .get_mut(usize::from(version))
                .ok_or(HideError::VersionOutOfRange { version, max })?;
            if slot.is_some() {
                return Err(HideError::DuplicateVersion { version });
            }
            *slot = Some(make(key));
        }
        if by_version[usize::from(active)].is_none() {
            return Err(HideError::ActiveKeyMissing { version: active });
        }
        Ok(Self { by_version, active })
    }

    /// The active version's cipher.
    fn active(&self) -> (KeyVersion, &C) {
        // `build` checked that the active slot is filled.
        match &self.by_version[usize::from(self.active)] {
            Some(cipher) => (self.active, cipher),
            None => unreachable!("Versions::build checks the active key"),
        }
    }

    /// The cipher of `version`, or [`HideError::UnknownVersion`].
    fn get(&self, version: KeyVersion) -> Result<&C, HideError> {
        self.by_version
            .get(usize::from(version))
            .and_then(Option::as_ref)
            .ok_or(HideError::UnknownVersion { version })
    }
}
