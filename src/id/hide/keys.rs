//! Hiding keys: 32 bytes of secret material and the version they are
//! known by, and the per-algorithm subkeys derived from them.

use ring::hmac;
use std::fmt;
use zeroize::Zeroize;

/// The version of a hiding key, written in clear into every ID it hides
/// (the leading digit of a decimal field, the top bits of an integer).
/// Version 0 is a valid version; the largest is 9 for decimal fields and
/// `2^version_bits - 1` for integers and snowflakes.
pub type KeyVersion = u8;

/// A hiding key: 32 bytes of secret material and its version.
///
/// It prints its version only (`HideKey { version: 3, .. }`), has no
/// `Display` and no serde support, so it cannot end up in a log line, a
/// metric or an API answer by accident; the material is zeroed on drop.
#[derive(Clone)]
pub struct HideKey {
    version: KeyVersion,
    material: [u8; 32],
}

impl HideKey {
    /// A key from its version and secret material (32 random bytes; the
    /// caller loads them from a key file or the environment).
    pub fn new(version: KeyVersion, material: [u8; 32]) -> HideKey {
        HideKey { version, material }
    }

    /// The version this key is known by.
    pub fn version(&self) -> KeyVersion {
        self.version
    }

    /// The subkey for one algorithm: HKDF-SHA256 (RFC 5869) of the
    /// material, with a fixed salt and `label` as the info, 32 bytes. One
    /// label per algorithm, so no key ever serves two algorithms.
    pub(super) fn subkey(&self, label: &[u8]) -> Subkey {
        Subkey(hkdf_sha256_32(b"idgen hide v1", &self.material, label))
    }
}

impl fmt::Debug for HideKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HideKey")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Drop for HideKey {
    fn drop(&mut self) {
        self.material.zeroize();
    }
}

/// 32 bytes derived for one algorithm; zeroed on drop.
pub(super) struct Subkey(pub(super) [u8; 32]);

impl Drop for Subkey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// HKDF-SHA256 with a 32-byte output: extract `PRK = HMAC(salt, ikm)`,
/// then the first expand block `T(1) = HMAC(PRK, info || 0x01)`.
pub(super) fn hkdf_sha256_32(salt: &[u8], ikm: &[u8], info: &[u8]) -> [u8; 32] {
    let prk = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, salt), ikm);
    let mut ctx = hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, prk.as_ref()));
    ctx.update(info);
    ctx.update(&[1]);
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.sign().as_ref());
    out
}
