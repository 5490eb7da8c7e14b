//! Lease mode's pure core: the clock-free layout
//! `0 | 7-bit zone | 16-bit token | 40-bit sequence` and the rule that
//! turns a token's durable counter into the next block of sequences.
//!
//! A token's counter holds the largest sequence any holder may have handed
//! out. A node reserves the block `(reserved, reserved + size]` by writing
//! `reserved + size` (durably, and only while it holds the token) and uses
//! it only once that write is acknowledged. Whoever holds the token next
//! continues above the counter, so no sequence of a token is handed out
//! twice, whatever the clocks do. Within one token and zone the IDs of a
//! block are consecutive integers. Sequence 0 is never used, so no lease
//! ID is 0.

use super::kind::ErrorKind;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::segment::Range;

/// Bits of the zone field.
pub const ZONE_BITS: u32 = 7;
/// Bits of the token field.
pub const TOKEN_BITS: u32 = 16;
/// Bits of the sequence field.
pub const SEQUENCE_BITS: u32 = 40;
/// Largest zone.
pub const MAX_ZONE: u64 = (1 << ZONE_BITS) - 1;
/// Largest token.
pub const MAX_TOKEN: u64 = (1 << TOKEN_BITS) - 1;
/// Largest sequence of a token.
pub const MAX_SEQUENCE: u64 = (1 << SEQUENCE_BITS) - 1;
/// Largest block a node may reserve at once.
pub const MAX_BLOCK: u64 = 100_000_000;

/// What is wrong with a lease request or ID.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LeaseError {
    /// Zone outside `0..=127`.
    #[error("lease zone {0} is out of range: use 0 to 127")]
    BadZone(u64),
    /// Token outside `0..=65535`.
    #[error("lease token {0} is out of range: use 0 to 65535")]
    BadToken(u64),
    /// Block size outside `1..=MAX_BLOCK`.
    #[error("lease block {0} is out of range: use 1 to 100000000")]
    BadBlock(u64),
    /// The token's 40-bit sequence is used up.
    #[error("lease token {token} of zone {zone} is used up (all 2^40 sequences handed out)")]
    TokenExhausted {
        /// Zone.
        zone: u64,
        /// Token.
        token: u64,
    },
    /// Every token of the zone is held by another node or used up.
    #[error("no free lease token in zone {zone}: every token is held by another node or used up; stop a node or use another lease.zone")]
    NoFreeToken {
        /// Zone.
        zone: u64,
    },
    /// The number cannot be a lease ID.
    #[error("{0} is not a lease ID: the top bit must be 0 and the sequence above 0")]
    NotALeaseId(u64),
    /// A hidden zone's version width outside 1 to 8.
    #[error("lease.hide.version_bits {0} is out of range: use 1 to 8 (2^bits key versions; the version takes the top bits of the 16-bit token field)")]
    BadHideBits(u32),
    /// The zone was recorded plain or hidden another way.
    #[error("lease zone {zone} is recorded as {stored}, but this node declares it {wanted}: a zone's setting is frozen, since plain and hidden IDs (or two hidings) of one zone could be the same number; restore the recorded setting, or serve the new one in a zone no node used")]
    ZoneFrozen {
        /// Zone.
        zone: u64,
        /// The recorded setting.
        stored: String,
        /// This node's setting.
        wanted: String,
    },
    /// Every token of an embedded node's own range is used up.
    #[error("lease tokens {first} to {last} of zone {zone}, this node's own range, are all used up; set another lease.zone (a zone no other node uses with this worker id)")]
    RangeExhausted {
        /// Zone.
        zone: u64,
        /// First token of the range.
        first: u64,
        /// Last token of the range.
        last: u64,
    },
}

impl LeaseError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::TokenExhausted { .. }
            | Self::NoFreeToken { .. }
            | Self::RangeExhausted { .. } => ErrorKind::Exhausted,
            _ => ErrorKind::BadRequest,
        }
    }
}

/// The lease tokens an embedded node may use: a range of its own, derived
/// from its (datacenter, worker), so embedded nodes with distinct ids
/// never share a token and never hand out the same lease ID.
///
/// The node's index `datacenter << worker_bits | worker` picks one of
/// `2^(datacenter_bits + worker_bits)` equal slices of the 65,536 tokens
/// (64 tokens each under the default 5 + 5 bits). `None` when the layout
/// has more node bits than there are token bits (16).
pub fn node_token_range(
    datacenter: u64,
    worker: u64,
    datacenter_bits: u8,
    worker_bits: u8,
) -> Option<(u64, u64)> {
    node_token_range_in(datacenter, worker, datacenter_bits, worker_bits, TOKEN_BITS)
}

/// [`node_token_range`] over the tokens `0..2^token_bits` (a hidden zone
/// has [`ZoneHide::token_bits`] of them).
pub fn node_token_range_in(
    datacenter: u64,
    worker: u64,
    datacenter_bits: u8,
    worker_bits: u8,
    token_bits: u32,
) -> Option<(u64, u64)> {
    let node_bits = u32::from(datacenter_bits) + u32::from(worker_bits);
    if node_bits > token_bits.min(TOKEN_BITS)
        || datacenter >> datacenter_bits != 0
        || worker >> worker_bits != 0
    {
        return None;
    }
    let per_node = 1u64 << (token_bits - node_bits);
    let index = (datacenter << worker_bits) | worker;
    let first = index * per_node;
    Some((first, first + per_node - 1))
}

/// The (datacenter, worker) whose range [`node_token_range`] puts `token`
/// in, under the same widths.
pub fn token_owner(token: u64, datacenter_bits: u8, worker_bits: u8) -> Option<(u64, u64)> {
    let node_bits = u32::from(datacenter_bits) + u32::from(worker_bits);
    if node_bits > TOKEN_BITS || token > MAX_TOKEN {
        return None;
    }
    let index = token >> (TOKEN_BITS - node_bits);
    Some((index >> worker_bits, index & ((1u64 << worker_bits) - 1)))
}

/// Bits of a lease ID below the zone: the token and the sequence, the
/// internal value a hidden zone permutes.
pub const BELOW_ZONE_BITS: u32 = TOKEN_BITS + SEQUENCE_BITS;
/// Version-field widths a hidden zone may take.
pub const ZONE_HIDE_VERSION_BITS: std::ops::RangeInclusive<u32> = 1..=8;

/// How a hidden zone shows its IDs: `0 | zone | version | P_k(token |
/// sequence)`, the key version in `version_bits` bits and a keyed
/// permutation ([`crate::id::hide::IntHider`]) of the `56 - version_bits`
/// bits below it. The version takes the top of the token field, so a
/// hidden zone uses tokens `0..=`[`ZoneHide::max_token`] only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneHide {
    /// The hide key id (`idgen admin keys create KEY`).
    pub key: String,
    /// Bits of key version in every ID (1 to 8, default 4):
    /// `2^version_bits` keys over the zone's life.
    #[serde(default = "default_zone_version_bits")]
    pub version_bits: u32,
}

fn default_zone_version_bits() -> u32 {
    4
}

impl ZoneHide {
    /// Checks the version width.
    pub fn check(&self) -> Result<(), LeaseError> {
        if ZONE_HIDE_VERSION_BITS.contains(&self.version_bits) {
            Ok(())
        } else {
            Err(LeaseError::BadHideBits(self.version_bits))
        }
    }

    /// Bits the permutation covers: token and sequence minus the version.
    pub fn domain_bits(&self) -> u32 {
        BELOW_ZONE_BITS - self.version_bits
    }

    /// Token bits left to the zone.
    pub fn token_bits(&self) -> u32 {
        TOKEN_BITS - self.version_bits
    }

    /// The largest token a hidden zone uses.
    pub fn max_token(&self) -> u64 {
        (1u64 << self.token_bits()) - 1
    }
}

/// A zone's durable declaration: plain or hidden, recorded the first time
/// a node serves the zone and never changed (docs/SAFETY-RULES-18-25.md, rule 23, "A
/// lease zone is plain or hidden for good").
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZoneRecord {
    /// Hidden (and how), or plain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hide: Option<ZoneHide>,
}

impl ZoneRecord {
    /// How the record reads in messages.
    pub fn describe(&self) -> String {
        match &self.hide {
            None => "plain".to_owned(),
            Some(h) => format!(
                "hidden with key {:?}, {} version bits",
                h.key, h.version_bits
            ),
        }
    }
}

/// What a node declaring `wanted` for `zone` must do, given the record
/// `stored` (if any) and whether any token of the zone has a counter
/// (`used`: the zone issued IDs before records existed): `Ok(None)` to
/// serve as recorded, `Ok(Some(record))` to write that record first
/// (create-only), or the refusal. A zone that issued plain IDs is never
/// hidden later, and a recorded setting never changes.
pub fn declare_zone(
    zone: u64,
    stored: Option<&ZoneRecord>,
    used: bool,
    wanted: &ZoneRecord,
) -> Result<Option<ZoneRecord>, LeaseError> {
    match stored {
        Some(s) if s == wanted => Ok(None),
        Some(s) => Err(LeaseError::ZoneFrozen {
            zone,
            stored: s.describe(),
            wanted: wanted.describe(),
        }),
        None if used && wanted.hide.is_some() => Err(LeaseError::ZoneFrozen {
            zone,
            stored: "plain (it issued plain IDs before)".to_owned(),
            wanted: wanted.describe(),
        }),
        None => Ok(Some(wanted.clone())),
    }
}

/// The internal value a hidden zone permutes: the token and sequence.
pub fn below_zone(id: u64) -> u64 {
    id & ((1u64 << BELOW_ZONE_BITS) - 1)
}

/// A hidden zone's shown ID: the zone on top of the permuted value.
pub fn with_zone(zone: u64, shown: u64) -> u64 {
    debug_assert!(zone <= MAX_ZONE && shown >> BELOW_ZONE_BITS == 0);
    (zone << BELOW_ZONE_BITS) | shown
}

/// Checks a zone.
pub fn check_zone(zone: u64) -> Result<u64, LeaseError> {
    if zone <= MAX_ZONE {
        Ok(zone)
    } else {
        Err(LeaseError::BadZone(zone))
    }
}

/// Checks a token.
pub fn check_token(token: u64) -> Result<u64, LeaseError> {
    if token <= MAX_TOKEN {
        Ok(token)
    } else {
        Err(LeaseError::BadToken(token))
    }
}

/// Checks a block size.
pub fn check_block(size: u64) -> Result<u64, LeaseError> {
    if (1..=MAX_BLOCK).contains(&size) {
        Ok(size)
    } else {
        Err(LeaseError::BadBlock(size))
    }
}

/// The fields of a lease ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseParts {
    /// Zone.
    pub zone: u64,
    /// Token.
    pub token: u64,
    /// Sequence within the token.
    pub sequence: u64,
}

/// Builds an ID from checked fields.
pub fn compose(zone: u64, token: u64, sequence: u64) -> u64 {
    debug_assert!(zone <= MAX_ZONE && token <= MAX_TOKEN && sequence <= MAX_SEQUENCE);
    (zone << (TOKEN_BITS + SEQUENCE_BITS)) | (token << SEQUENCE_BITS) | sequence
}

/// Splits a lease ID.
pub fn decompose(id: u64) -> Result<LeaseParts, LeaseError> {
    let sequence = id & MAX_SEQUENCE;
    if id >> 63 != 0 || sequence == 0 {
        return Err(LeaseError::NotALeaseId(id));
    }
    Ok(LeaseParts {
        zone: (id >> (TOKEN_BITS + SEQUENCE_BITS)) & MAX_ZONE,
        token: (id >> SEQUENCE_BITS) & MAX_TOKEN,
        sequence,
    })
}

/// A token's durable record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TokenCounter {
    /// The largest sequence any holder may have handed out (0: none yet).
    pub reserved: u64,
}

impl TokenCounter {
    /// Whether every sequence of the token is reserved.
    pub fn exhausted(&self) -> bool {
        self.reserved >= MAX_SEQUENCE
    }

    /// The next block of at most `size` sequences and the counter to store
    /// for it. The last block of a token may be shorter.
    pub fn next_block(
        &self,
        zone: u64,
        token: u64,
        size: u64,
    ) -> Result<(Block, TokenCounter), LeaseError> {
        check_zone(zone)?;
        check_token(token)?;
        check_block(size)?;
        if self.exhausted() {
            return Err(LeaseError::TokenExhausted { zone, token });
        }
        let first = self.reserved + 1;
        let last = self.reserved.saturating_add(size).min(MAX_SEQUENCE);
        Ok((
            Block {
                zone,
                token,
                first,
                last,
            },
            TokenCounter { reserved: last },
        ))
    }
}

/// Sequences `first..=last` of one token, reserved durably.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Zone.
    pub zone: u64,
    /// Token.
    pub token: u64,
    /// First sequence.
    pub first: u64,
    /// Last sequence.
    pub last: u64,
}

impl Block {
    /// The block's IDs: consecutive integers, since zone and token are the
    /// high bits.
    pub fn ids(&self) -> Range {
        Range {
            first: compose(self.zone, self.token, self.first),
            last: compose(self.zone, self.token, self.last),
        }
    }

    /// How many sequences.
    pub fn len(&self) -> u64 {
        self.last - self.first + 1
    }

    /// Never true: a block holds at least one sequence.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl super::buffer::Span for Block {
    fn ids(&self) -> Range {
        Block::ids(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_their_fields() {
        for (z, t, s) in [(0, 0, 1), (127, 65535, MAX_SEQUENCE), (5, 300, 12345)] {
            let id = compose(z, t, s);
            assert!(id < 1 << 63);
            assert_eq!(
                decompose(id),
                Ok(LeaseParts {
                    zone: z,
                    token: t,
                    sequence: s
                })
            );
        }
        assert_eq!(decompose(0), Err(LeaseError::NotALeaseId(0)));
        assert!(decompose(1 << 63 | 1).is_err());
        assert!(decompose(compose(3, 4, 0)).is_err());
    }

    #[test]
    fn blocks_follow_the_counter_and_stop_at_forty_bits() {
        let c = TokenCounter::default();
        let (b, c) = c.next_block(1, 2, 1000).unwrap();
        assert_eq!((b.first, b.last, c.reserved), (1, 1000, 1000));
        let (b2, c2) = c.next_block(1, 2, 1000).unwrap();
        assert_eq!((b2.first, b2.last, c2.reserved), (1001, 2000, 2000));
        let ids = b2.ids();
        assert_eq!(ids.last - ids.first + 1, b2.len());
        assert_eq!(decompose(ids.first).unwrap().sequence, 1001);

        let near = TokenCounter {
            reserved: MAX_SEQUENCE - 10,
        };
        let (b, c) = near.next_block(0, 0, 1000).unwrap();
        assert_eq!((b.len(), c.reserved), (10, MAX_SEQUENCE));
        assert!(c.exhausted());
        assert_eq!(
            c.next_block(0, 0, 1),
            Err(LeaseError::TokenExhausted { zone: 0, token: 0 })
        );
    }

    #[test]
    fn node_token_ranges_are_disjoint_and_cover_the_tokens() {
        // Default twitter widths: 5 + 5 node bits, 64 tokens per node.
        assert_eq!(node_token_range(0, 0, 5, 5), Some((0, 63)));
        assert_eq!(node_token_range(0, 1, 5, 5), Some((64, 127)));
        assert_eq!(node_token_range(1, 0, 5, 5), Some((2048, 2111)));
        assert_eq!(node_token_range(31, 31, 5, 5), Some((65472, 65535)));
        assert_eq!(token_owner(2100, 5, 5), Some((1, 0)));
        // Every node of a small layout: disjoint, in order, covering all.
        let mut next = 0;
        for dc in 0..4 {
            for w in 0..8 {
                let (a, b) = node_token_range(dc, w, 2, 3).unwrap();
                assert_eq!(a, next);
                assert_eq!(token_owner(a, 2, 3), Some((dc, w)));
                assert_eq!(token_owner(b, 2, 3), Some((dc, w)));
                next = b + 1;
            }
        }
        assert_eq!(next, MAX_TOKEN + 1);
        // Sixteen node bits: one token each; more do not fit.
        assert_eq!(node_token_range(255, 255, 8, 8), Some((65535, 65535)));
        assert_eq!(node_token_range(0, 0, 9, 8), None);
        assert_eq!(node_token_range(0, 32, 5, 5), None);
    }

    #[test]
    fn bad_fields_are_refused() {
        let c = TokenCounter::default();
        assert_eq!(c.next_block(128, 0, 1), Err(LeaseError::BadZone(128)));
        assert_eq!(c.next_block(0, 65536, 1), Err(LeaseError::BadToken(65536)));
        assert_eq!(c.next_block(0, 0, 0), Err(LeaseError::BadBlock(0)));
        assert!(c.next_block(0, 0, MAX_BLOCK + 1).is_err());
    }
    /// A lease zone is plain or hidden for good: a zone's record is written once and never changes; a zone
    /// that issued plain IDs before records existed is never hidden.
    #[test]
    fn a_zone_setting_is_recorded_once_and_frozen() {
        let plain = ZoneRecord::default();
        let hidden = ZoneRecord {
            hide: Some(ZoneHide {
                key: "tickets".into(),
                version_bits: 4,
            }),
        };
        let other_bits = ZoneRecord {
            hide: Some(ZoneHide {
                key: "tickets".into(),
                version_bits: 3,
            }),
        };
        // Nothing stored: write what the node declares.
        assert_eq!(
            declare_zone(3, None, false, &hidden),
            Ok(Some(hidden.clone()))
        );
        assert_eq!(declare_zone(3, None, true, &plain), Ok(Some(plain.clone())));
        // Used before the record existed: plain only.
        let e = declare_zone(3, None, true, &hidden).unwrap_err();
        assert!(e.to_string().contains("issued plain IDs before"), "{e}");
        // Stored: the same setting serves, any other is refused.
        assert_eq!(declare_zone(3, Some(&hidden), true, &hidden), Ok(None));
        for (stored, wanted) in [(&hidden, &plain), (&plain, &hidden), (&hidden, &other_bits)] {
            let e = declare_zone(3, Some(stored), false, wanted).unwrap_err();
            assert!(matches!(e, LeaseError::ZoneFrozen { zone: 3, .. }), "{e:?}");
            assert!(e.to_string().contains("frozen"), "{e}");
        }
        assert_eq!(
            ZoneHide {
                key: "k".into(),
                version_bits: 9
            }
            .check(),
            Err(LeaseError::BadHideBits(9))
        );
    }

    /// A hidden zone's IDs keep their zone, never collide across
    /// tokens, sequences or key versions, and reveal to what was issued.
    #[test]
    fn hidden_zone_ids_keep_the_zone_and_never_collide_across_versions() {
        use crate::id::hide::{HideKey, IntHider};
        let hide = ZoneHide {
            key: "tickets".into(),
            version_bits: 4,
        };
        assert_eq!((hide.domain_bits(), hide.max_token()), (52, 4095));
        let keys = [HideKey::new(0, [1; 32]), HideKey::new(1, [2; 32])];
        let refs: Vec<&HideKey> = keys.iter().collect();
        let mut seen = std::collections::HashSet::new();
        for active in [0, 1] {
            let h = IntHider::new(&refs, active, hide.version_bits, hide.domain_bits()).unwrap();
            for token in [0, 1, hide.max_token()] {
                for seq in 1..=2_000 {
                    let internal = compose(5, token, seq);
                    let shown = with_zone(5, h.hide(below_zone(internal)).unwrap());
                    assert!(shown < 1 << 63);
                    assert_eq!(shown >> BELOW_ZONE_BITS, 5, "the zone is kept");
                    assert!(seen.insert(shown), "{shown} shown twice");
                    let (version, back) = h.reveal(below_zone(shown)).unwrap();
                    assert_eq!((version, with_zone(5, back)), (active, internal));
                }
            }
            // A token above the hidden zone's range is outside the domain.
            let too_high = below_zone(compose(5, hide.max_token() + 1, 1));
            assert!(h.hide(too_high).is_err());
        }
        // Hidden zone ranges: the same node slices over 12 token bits.
        assert_eq!(node_token_range_in(0, 1, 5, 5, 12), Some((4, 7)));
        assert_eq!(node_token_range_in(31, 31, 5, 5, 12), Some((4092, 4095)));
        assert_eq!(node_token_range_in(0, 0, 7, 6, 12), None);
    }
}
