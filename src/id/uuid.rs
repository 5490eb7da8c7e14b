//! UUIDv7 (RFC 9562 section 5.7) with idgen's node guarantees: the bit
//! layout, composing and splitting a UUID, and its two texts (the canonical
//! 8-4-4-4-12 form and ULID's Crockford base32).
//!
//! # Layout
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                         unix_ts_ms (48)                        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |         unix_ts_ms           |  ver  |   counter high (12)    |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |var|   counter low (14)        |  node (n)  |   random (48 - n)  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                        random, continued                       |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//! * `unix_ts_ms` is the node's logical millisecond (the snowflake
//!   generator's clock: never behind the durable mark, moved on logically
//!   when the wall clock steps back), RFC 9562 section 6.2 method 1 with a
//!   [`COUNTER_BITS`]-bit counter split around the version field.
//! * Each millisecond's counter starts at a random offset below
//!   [`COUNTER_START_LIMIT`] and counts up, so one UUID does not tell how
//!   many came before it in its millisecond; two of one millisecond do tell
//!   how many were issued between them. A counter that would overflow moves
//!   to the next logical millisecond; it never wraps.
//! * The node field (RFC 9562 section 6.4) is the layout's datacenter and
//!   worker ids (`n` bits, 10 by default), after the counter: two nodes
//!   never share a node field, so their UUIDs differ whatever the counters.
//! * The rest (38 bits by default, never fewer than [`MIN_RANDOM_BITS`]) is
//!   fresh CSPRNG output per UUID: knowing one UUID, a guess at another of
//!   the same millisecond and counter is right once in 2^38.
//!
//! Order: `(unix_ts_ms, counter)` strictly increases on a node, and they
//! are the high bits, so a node's UUIDs increase in 128-bit big-endian
//! order (the order of PostgreSQL's `uuid` and of byte comparison).

use std::fmt;

use thiserror::Error;

use super::kind::ErrorKind;
use super::layout::Layout;

/// Width of the per-millisecond counter.
pub const COUNTER_BITS: u32 = 26;
/// Each millisecond's counter starts below this (the lower half of the
/// counter's range), so at least 2^25 UUIDs fit in every millisecond.
pub const COUNTER_START_LIMIT: u64 = 1 << (COUNTER_BITS - 1);
/// The node field and the random bits share what the counter leaves.
const NODE_AND_RANDOM_BITS: u32 = 48;
/// Never fewer random bits than this per UUID.
pub const MIN_RANDOM_BITS: u32 = 32;
/// The widest node field that still leaves [`MIN_RANDOM_BITS`].
pub const MAX_NODE_BITS: u32 = NODE_AND_RANDOM_BITS - MIN_RANDOM_BITS;

const VERSION: u128 = 7;
const VARIANT: u128 = 0b10;
const COUNTER_LOW_BITS: u32 = 14;
const TS_MAX: u64 = (1 << 48) - 1;

/// Why text or 128 bits are not a UUID this node can read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UuidError {
    /// Neither canonical UUID text nor a ULID.
    #[error("{text:?} is not a UUID: expected 8-4-4-4-12 hex digits (36 characters), 32 hex digits, or a 26-character ULID")]
    BadText {
        /// The text as given (cut to 80 characters).
        text: String,
    },
    /// A ULID whose first character is above `7`: more than 128 bits.
    #[error("ULID {text:?} is over 128 bits: its first character must be 0-7")]
    UlidOverflow {
        /// The ULID as given.
        text: String,
    },
    /// Not version 7.
    #[error("{uuid} is a version {version} UUID; only version 7 UUIDs can be decoded")]
    WrongVersion {
        /// The UUID.
        uuid: Uuid,
        /// Its version field.
        version: u8,
    },
    /// Not the RFC 9562 variant (`10`).
    #[error("{uuid} has variant bits {variant:02b}; RFC 9562 UUIDs have 10")]
    WrongVariant {
        /// The UUID.
        uuid: Uuid,
        /// Its two variant bits.
        variant: u8,
    },
    /// The layout's node field is too wide to leave enough random bits.
    #[error("the layout's datacenter and worker ids take {node_bits} bits; UUIDs hold at most {MAX_NODE_BITS} (so that {MIN_RANDOM_BITS} bits stay random): use a layout with fewer datacenter/worker bits to serve UUIDs")]
    NodeTooWide {
        /// `datacenter_bits + worker_bits`.
        node_bits: u32,
    },
    /// The layout hides its snowflake IDs opaque, time included; a UUIDv7
    /// shows its time, so it cannot be hidden that way.
    #[error("this cluster's layout is hidden opaque (layout.hide = \"opaque\"), which hides when an ID was issued; a UUIDv7 shows its time, so this node issues no UUIDs. A cluster that serves UUIDs hides with layout.hide = \"sortable\" (time shown, count and node hidden), set before its first ID")]
    OpaqueLayout,
    /// A sortable hidden layout whose key version field would leave the
    /// UUID counter narrower than 24 bits.
    #[error("layout.hide_version_bits = {version_bits} would take {version_bits} of the UUID counter's 26 bits, leaving fewer than 24; this node issues no UUIDs. A cluster that serves hidden UUIDs needs layout.hide_version_bits = 1 or 2, set before its first ID")]
    HideVersionTooWide {
        /// `layout.hide_version_bits`.
        version_bits: u32,
    },
}

impl UuidError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NodeTooWide { .. } | Self::OpaqueLayout | Self::HideVersionTooWide { .. } => {
                ErrorKind::Precondition
            }
            _ => ErrorKind::BadRequest,
        }
    }
}

/// A UUID as 128 bits (big-endian order is numeric order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Uuid(pub u128);

impl Uuid {
    /// The 16 bytes, big-endian (the wire form and PostgreSQL's).
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// From 16 big-endian bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(u128::from_be_bytes(bytes))
    }

    /// The version field.
    pub fn version(self) -> u8 {
        ((self.0 >> 76) & 0xf) as u8
    }

    /// The two variant bits.
    pub fn variant(self) -> u8 {
        ((self.0 >> 62) & 0b11) as u8
    }

    /// Crockford base32 text, 26 characters (ULID's form; sorts like the
    /// UUID).
    pub fn to_ulid(self) -> String {
        const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
        (0..26)
            .map(|i| {
                let shift = 5 * (25 - i);
                char::from(ALPHABET[((self.0 >> shift) & 0x1f) as usize])
            })
            .collect()
    }

    /// Reads canonical text (8-4-4-4-12, any case), 32 hex digits, or a
    /// ULID (26 Crockford base32 characters, any case, `I`/`L` read as 1
    /// and `O` as 0 as Crockford says).
    pub fn parse(text: &str) -> Result<Self, UuidError> {
        let bad = || UuidError::BadText {
            text: text.chars().take(80).collect(),
        };
        match text.len() {
            36 => {
                let dashes = [8, 13, 18, 23];
                let ok = text
                    .char_indices()
                    .all(|(i, c)| dashes.contains(&i) == (c == '-'));
                if !ok {
                    return Err(bad());
                }
                parse_hex(&text.replace('-', "")).ok_or_else(bad)
            }
            32 => parse_hex(text).ok_or_else(bad),
            26 => parse_ulid(text).ok_or_else(bad).and_then(|v| {
                v.ok_or_else(|| UuidError::UlidOverflow {
                    text: text.to_owned(),
                })
            }),
            _ => Err(bad()),
        }
    }
}

fn parse_hex(hex: &str) -> Option<Uuid> {
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(hex, 16).ok().map(Uuid)
}

/// `None` for a character outside the alphabet; `Some(None)` for a value
/// over 128 bits.
fn parse_ulid(text: &str) -> Option<Option<Uuid>> {
    let mut value: u128 = 0;
    for (i, c) in text.chars().enumerate() {
        let digit = match c.to_ascii_uppercase() {
            c @ '0'..='9' => c as u32 - '0' as u32,
            'O' => 0,
            'I' | 'L' => 1,
            c @ 'A'..='H' => c as u32 - 'A' as u32 + 10,
            'J' => 18,
            'K' => 19,
            'M' => 20,
            'N' => 21,
            c @ 'P'..='T' => c as u32 - 'P' as u32 + 22,
            c @ 'V'..='Z' => c as u32 - 'V' as u32 + 27,
            _ => return None,
        };
        if i == 0 && digit > 7 {
            return Some(None);
        }
        value = (value << 5) | u128::from(digit);
    }
    Some(Some(Uuid(value)))
}

impl fmt::Display for Uuid {
    /// Canonical lowercase 8-4-4-4-12 text.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = format!("{:032x}", self.0);
        write!(
            f,
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }
}

/// Where the node field and the random bits sit, worked out from a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UuidLayout {
    datacenter_bits: u32,
    worker_bits: u32,
}

/// The parts of a decoded UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UuidParts {
    /// `unix_ts_ms`.
    pub unix_ms: u64,
    /// The per-millisecond counter.
    pub counter: u64,
    /// Datacenter field.
    pub datacenter: u64,
    /// Worker field.
    pub worker: u64,
    /// The random bits.
    pub random: u64,
}

impl UuidLayout {
    /// The UUID layout of nodes composed under `layout`; refused when its
    /// node field would leave fewer than [`MIN_RANDOM_BITS`] random bits.
    pub fn of(layout: &Layout) -> Result<Self, UuidError> {
        let spec = layout.spec();
        let (datacenter_bits, worker_bits) =
            (u32::from(spec.datacenter_bits), u32::from(spec.worker_bits));
        let node_bits = datacenter_bits + worker_bits;
        if node_bits > MAX_NODE_BITS {
            return Err(UuidError::NodeTooWide { node_bits });
        }
        Ok(Self {
            datacenter_bits,
            worker_bits,
        })
    }

    /// Width of the node field (datacenter and worker bits).
    pub fn node_bits(&self) -> u32 {
        self.datacenter_bits + self.worker_bits
    }

    /// How many random bits each UUID carries.
    pub fn random_bits(&self) -> u32 {
        NODE_AND_RANDOM_BITS - self.datacenter_bits - self.worker_bits
    }

    /// The node field of (`datacenter`, `worker`), checked by the layout.
    pub fn node(&self, datacenter: u64, worker: u64) -> u64 {
        (datacenter << self.worker_bits) | worker
    }

    /// Builds a UUID. `counter` must be below 2^[`COUNTER_BITS`] and
    /// `unix_ms` below 2^48 (the generator guarantees both); only the low
    /// [`UuidLayout::random_bits`] of `random` are used.
    #[inline]
    pub fn compose(&self, unix_ms: u64, counter: u64, node: u64, random: u64) -> Uuid {
        let random_bits = self.random_bits();
        let low48 =
            (u128::from(node) << random_bits) | u128::from(random & ((1u64 << random_bits) - 1));
        let counter = u128::from(counter);
        Uuid(
            (u128::from(unix_ms & TS_MAX) << 80)
                | (VERSION << 76)
                | ((counter >> COUNTER_LOW_BITS) << 64)
                | (VARIANT << 62)
                | ((counter & ((1 << COUNTER_LOW_BITS) - 1)) << 48)
                | low48,
        )
    }

    /// Splits a version 7 UUID into its parts.
    pub fn decompose(&self, uuid: Uuid) -> Result<UuidParts, UuidError> {
        if uuid.version() != VERSION as u8 {
            return Err(UuidError::WrongVersion {
                uuid,
                version: uuid.version(),
            });
        }
        if uuid.variant() != VARIANT as u8 {
            return Err(UuidError::WrongVariant {
                uuid,
                variant: uuid.variant(),
            });
        }
        let v = uuid.0;
        let random_bits = self.random_bits();
        let node =
            ((v >> random_bits) & ((1 << (self.datacenter_bits + self.worker_bits)) - 1)) as u64;
        Ok(UuidParts {
            unix_ms: (v >> 80) as u64,
            counter: ((((v >> 64) & 0xfff) << COUNTER_LOW_BITS) | ((v >> 48) & 0x3fff)) as u64,
            datacenter: node >> self.worker_bits,
            worker: node & ((1 << self.worker_bits) - 1),
            random: (v & ((1 << random_bits) - 1)) as u64,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::id::{Preset, DEFAULT_EPOCH_MS};

    /// The Twitter layout's UUID fields (10 node bits), for the tests of
    /// this module and of the UUID hider.
    pub(crate) fn layout() -> UuidLayout {
        let l = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(DEFAULT_EPOCH_MS + 1)
            .expect("twitter layout");
        UuidLayout::of(&l).expect("10 node bits fit")
    }

    #[test]
    fn every_field_round_trips_with_version_and_variant_set() {
        let l = layout();
        let max_counter = (1 << COUNTER_BITS) - 1;
        for (ms, counter, dc, worker, random) in [
            (0, 0, 0, 0, 0),
            (TS_MAX, max_counter, 31, 31, u64::MAX),
            (1_765_000_000_000, 12_345_678, 3, 17, 0x1234_5678_9abc),
        ] {
            let u = l.compose(ms, counter, l.node(dc, worker), random);
            assert_eq!(u.version(), 7, "{u}");
            assert_eq!(u.variant(), 0b10, "{u}");
            let p = l.decompose(u).expect("decodes");
            assert_eq!(
                (p.unix_ms, p.counter, p.datacenter, p.worker),
                (ms, counter, dc, worker)
            );
            assert_eq!(p.random, random & ((1 << l.random_bits()) - 1));
        }
        assert_eq!(l.random_bits(), 38);
    }

    #[test]
    fn order_follows_time_then_counter_whatever_the_node_and_random_bits() {
        let l = layout();
        let a = l.compose(5, 7, l.node(31, 31), u64::MAX);
        let b = l.compose(5, 8, 0, 0);
        let c = l.compose(6, 0, 0, 0);
        assert!(a < b && b < c);
        assert!(a.to_bytes() < b.to_bytes() && b.to_bytes() < c.to_bytes());
        assert!(a.to_ulid() < b.to_ulid() && b.to_ulid() < c.to_ulid());
    }

    #[test]
    fn two_nodes_never_share_a_uuid_even_with_the_same_counter_and_random_bits() {
        let l = layout();
        let a = l.compose(5, 7, l.node(0, 1), 99);
        let b = l.compose(5, 7, l.node(1, 0), 99);
        assert_ne!(a, b);
    }

    #[test]
    fn the_rfc_9562_example_decodes_to_its_documented_time() {
        // RFC 9562 appendix A.6: 017F22E2-79B0-7CC3-98C4-DC0C0C07398F is
        // Tuesday, February 22, 2022 2:22:22.00 PM GMT-05:00.
        let u = Uuid::parse("017F22E2-79B0-7CC3-98C4-DC0C0C07398F").expect("parses");
        let p = layout().decompose(u).expect("version 7");
        assert_eq!(p.unix_ms, 0x017F_22E2_79B0);
        assert_eq!(p.unix_ms, 1_645_557_742_000);
        assert_eq!(u.to_string(), "017f22e2-79b0-7cc3-98c4-dc0c0c07398f");
    }

    #[test]
    fn text_forms_round_trip_and_bad_text_is_named() {
        let u = layout().compose(1_765_000_000_000, 42, 5, 77);
        assert_eq!(Uuid::parse(&u.to_string()), Ok(u));
        assert_eq!(Uuid::parse(&u.to_ulid()), Ok(u));
        assert_eq!(Uuid::parse(&u.to_ulid().to_lowercase()), Ok(u));
        assert_eq!(Uuid::parse(&format!("{:032x}", u.0)), Ok(u));
        assert_eq!(Uuid::from_bytes(u.to_bytes()), u);
        assert_eq!(Uuid(u128::MAX).to_ulid(), "7ZZZZZZZZZZZZZZZZZZZZZZZZZ");
        for bad in [
            "",
            "017f22e2-79b0-7cc3-98c4-dc0c0c07398",
            "017f22e279b0-7cc3-98c4-dc0c0c07398f-",
            "017f22e2-79b0-7cc3-98c4-dc0c0c07398g",
            "01ARZ3NDEKTSV4RRFFQ69G5FAU",
        ] {
            assert!(
                matches!(Uuid::parse(bad), Err(UuidError::BadText { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            Uuid::parse("8ZZZZZZZZZZZZZZZZZZZZZZZZZ"),
            Err(UuidError::UlidOverflow { .. })
        ));
    }

    #[test]
    fn other_versions_and_variants_are_refused() {
        let l = layout();
        let v4 = Uuid::parse("f47ac10b-58cc-4372-a567-0e02b2c3d479").expect("parses");
        assert!(matches!(
            l.decompose(v4),
            Err(UuidError::WrongVersion { version: 4, .. })
        ));
        let v7 = l.compose(1, 1, 1, 1);
        let wrong_variant = Uuid(v7.0 ^ (1 << 63));
        assert!(matches!(
            l.decompose(wrong_variant),
            Err(UuidError::WrongVariant { variant: 0, .. })
        ));
    }
}
