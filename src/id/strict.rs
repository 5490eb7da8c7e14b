//! Strict mode's pure core: keys, namespace steps and the rule that turns
//! a key's stored value into the next values.
//!
//! A strict key (`namespace/key`) has one durable counter: the last value
//! any node handed out. A call reserving `count` values writes
//! `value + count * step` with a compare-and-set (or inside one store
//! transaction) and, once that write is acknowledged, returns
//! `value + step, value + 2 * step, ..., value + count * step`. Every value
//! is therefore greater than every value any earlier call returned.

use super::kind::ErrorKind;
use thiserror::Error;

/// Longest namespace name.
pub const MAX_NAMESPACE_LEN: usize = 64;
/// Longest key name (the part after the `/`).
pub const MAX_KEY_LEN: usize = 128;
/// Largest step of a namespace.
pub const MAX_STEP: u64 = 1_000_000;
/// The largest value a strict counter may hand out (fits a signed 64-bit
/// integer, like segment IDs).
pub const MAX_VALUE: u64 = i64::MAX as u64;

/// What is wrong with a strict key, step or request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StrictError {
    /// The key is not `namespace/key` with the allowed characters.
    #[error("strict key {0:?} is malformed: use <namespace>/<key>, a namespace of 1 to 64 and a key of 1 to 128 characters of a-z 0-9 _ -")]
    BadKey(String),
    /// The namespace name is malformed.
    #[error("strict namespace {0:?} is malformed: use 1 to 64 characters of a-z 0-9 _ -")]
    BadNamespace(String),
    /// The step is zero or too large.
    #[error("strict step {0} is out of range: use 1 to 1000000")]
    BadStep(u64),
    /// The key's values are used up.
    #[error("strict key {key:?} is exhausted: value {value} + {count} x step {step} would pass {max}; use a new key")]
    Exhausted {
        /// The key.
        key: String,
        /// Its current value.
        value: u64,
        /// Values asked for.
        count: u64,
        /// The namespace's step.
        step: u64,
        /// The largest allowed value.
        max: u64,
    },
    /// No live strict key by that name.
    #[error("unknown strict key {0:?}: it was never used, or it was deleted")]
    KeyNotFound(String),
    /// Creating one more key or namespace would pass
    /// `strict.max_keys_per_namespace` or `strict.max_namespaces`.
    #[error(transparent)]
    LimitReached(#[from] crate::id::LimitReached),
}

impl StrictError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Exhausted { .. } | Self::LimitReached(_) => ErrorKind::Exhausted,
            Self::KeyNotFound(_) => ErrorKind::NotFound,
            Self::BadKey(_) | Self::BadNamespace(_) | Self::BadStep(_) => ErrorKind::BadRequest,
        }
    }
}

fn valid_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// A validated namespace name (`[a-z0-9_-]{1,64}`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(String);

impl Namespace {
    /// Checks `name`.
    pub fn parse(name: &str) -> Result<Self, StrictError> {
        if valid_name(name, MAX_NAMESPACE_LEN) {
            Ok(Self(name.to_owned()))
        } else {
            Err(StrictError::BadNamespace(name.chars().take(80).collect()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated strict key: `<namespace>/<key>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StrictKey {
    full: String,
    split: usize,
}

impl StrictKey {
    /// Checks `name` (`<namespace>/<key>`).
    pub fn parse(name: &str) -> Result<Self, StrictError> {
        let bad = || StrictError::BadKey(name.chars().take(200).collect());
        let (ns, key) = name.split_once('/').ok_or_else(bad)?;
        if !valid_name(ns, MAX_NAMESPACE_LEN) || !valid_name(key, MAX_KEY_LEN) {
            return Err(bad());
        }
        Ok(Self {
            full: name.to_owned(),
            split: ns.len(),
        })
    }

    /// The namespace part.
    pub fn namespace(&self) -> Namespace {
        Namespace(self.full[..self.split].to_owned())
    }

    /// The namespace name.
    pub fn namespace_str(&self) -> &str {
        &self.full[..self.split]
    }

    /// The key part (after the `/`).
    pub fn key(&self) -> &str {
        &self.full[self.split + 1..]
    }

    /// `<namespace>/<key>`.
    pub fn as_str(&self) -> &str {
        &self.full
    }
}

impl std::fmt::Display for StrictKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.full)
    }
}

/// Checks a namespace step.
pub fn check_step(step: u64) -> Result<u64, StrictError> {
    if (1..=MAX_STEP).contains(&step) {
        Ok(step)
    } else {
        Err(StrictError::BadStep(step))
    }
}

/// Values handed out by one call: `first, first + step, ..., last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Values {
    /// The first (smallest) value.
    pub first: u64,
    /// The last (largest) value; the key's new stored value.
    pub last: u64,
    /// The distance between consecutive values.
    pub step: u64,
}

impl Values {
    /// How many values.
    pub fn count(&self) -> u64 {
        (self.last - self.first) / self.step + 1
    }

    /// Every value, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u64> {
        let (first, step) = (self.first, self.step);
        (0..self.count()).map(move |i| first + i * step)
    }
}

/// The next `count` values of `key` whose stored value is `value`; the
/// returned [`Values::last`] is the value to store.
pub fn advance(key: &StrictKey, value: u64, step: u64, count: u64) -> Result<Values, StrictError> {
    check_step(step)?;
    let exhausted = || StrictError::Exhausted {
        key: key.to_string(),
        value,
        count,
        step,
        max: MAX_VALUE,
    };
    if count == 0 {
        return Err(exhausted());
    }
    let last = count
        .checked_mul(step)
        .and_then(|n| value.checked_add(n))
        .filter(|l| *l <= MAX_VALUE)
        .ok_or_else(exhausted)?;
    Ok(Values {
        first: value + step,
        last,
        step,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> StrictKey {
        StrictKey::parse(s).unwrap()
    }

    #[test]
    fn keys_need_a_namespace_and_a_key() {
        let k = key("books/moby-dick_2");
        assert_eq!(k.namespace_str(), "books");
        assert_eq!(k.key(), "moby-dick_2");
        assert_eq!(k.namespace(), Namespace::parse("books").unwrap());
        for bad in [
            "",
            "books",
            "/k",
            "books/",
            "Books/k",
            "books/k/x",
            "bo ok/k",
            "books/ä",
        ] {
            assert!(StrictKey::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(StrictKey::parse(&format!("{}/k", "n".repeat(64))).is_ok());
        assert!(StrictKey::parse(&format!("{}/k", "n".repeat(65))).is_err());
        assert!(StrictKey::parse(&format!("n/{}", "k".repeat(128))).is_ok());
        assert!(StrictKey::parse(&format!("n/{}", "k".repeat(129))).is_err());
        let msg = StrictKey::parse("nope").unwrap_err().to_string();
        assert!(msg.contains("<namespace>/<key>"), "{msg}");
    }

    #[test]
    fn advance_hands_out_values_above_the_stored_one() {
        let k = key("books/b1");
        let v = advance(&k, 0, 1, 1).unwrap();
        assert_eq!((v.first, v.last, v.count()), (1, 1, 1));
        let v = advance(&k, 10, 5, 3).unwrap();
        assert_eq!(v.iter().collect::<Vec<_>>(), vec![15, 20, 25]);
        assert_eq!(v.last, 25);
    }

    #[test]
    fn advance_refuses_to_pass_the_maximum() {
        let k = key("books/b1");
        assert!(advance(&k, MAX_VALUE - 2, 1, 2).is_ok());
        let e = advance(&k, MAX_VALUE - 2, 1, 3).unwrap_err();
        assert!(matches!(e, StrictError::Exhausted { .. }), "{e:?}");
        assert!(advance(&k, 0, u64::MAX / 2, 3).is_err());
        assert_eq!(advance(&k, 0, 0, 1), Err(StrictError::BadStep(0)));
        assert!(advance(&k, 0, 1, 0).is_err());
    }
}
