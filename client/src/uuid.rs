//! A UUIDv7 as a node issued it: 16 bytes, shown as canonical text or as
//! a ULID.

use std::fmt;

use crate::Error;

/// A UUID from `GenUuid`/`GenUuids`: 16 big-endian bytes (byte order is
/// issue order on a node). `Display` gives canonical lowercase 8-4-4-4-12
/// text; [`Uuid::to_ulid`] the same 128 bits in Crockford base32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    /// From a 16-byte slice; `None` for any other length.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        <[u8; 16]>::try_from(bytes).ok().map(Self)
    }

    /// The 128 bits as a number (big-endian).
    pub fn as_u128(&self) -> u128 {
        u128::from_be_bytes(self.0)
    }

    /// Crockford base32, 26 characters (ULID's form; sorts like the bytes).
    pub fn to_ulid(&self) -> String {
        const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
        let v = self.as_u128();
        (0..26)
            .map(|i| char::from(ALPHABET[((v >> (5 * (25 - i))) & 0x1f) as usize]))
            .collect()
    }
}

/// The `count` UUIDs of a `GenUuids` answer (16 bytes each); an answer of
/// another length is a [`Error::BadAnswer`], never a short batch.
pub(crate) fn uuids_of(bytes: &[u8], count: u32) -> Result<Vec<Uuid>, Error> {
    if bytes.len() != count as usize * 16 {
        return Err(Error::BadAnswer {
            what: format!(
                "GenUuids for {count} UUIDs answered {} bytes, not {}",
                bytes.len(),
                count as usize * 16
            ),
        });
    }
    Ok(bytes
        .chunks_exact(16)
        .filter_map(Uuid::from_slice)
        .collect())
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms_of_the_rfc_example() {
        let u = Uuid(0x017F_22E2_79B0_7CC3_98C4_DC0C_0C07_398F_u128.to_be_bytes());
        assert_eq!(u.to_string(), "017f22e2-79b0-7cc3-98c4-dc0c0c07398f");
        assert_eq!(u.to_ulid().len(), 26);
        assert_eq!(Uuid::from_slice(&[0; 15]), None);
    }
}
