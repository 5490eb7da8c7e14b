//! Token spaces: where a per-node format's leased token comes from.
//!
//! A format that renders `{token:N:digits|alnum}`, or the `uniq64` preset
//! (12 bits), needs a token the node holds alone. Tokens are leased by the
//! same machinery as lease mode (a lock under the worker id's Consul
//! session, or a disjoint range per node on the embedded store), in a
//! space of their own per width and charset, so they never collide with
//! lease mode's tokens nor with a space of another size. Formats with the
//! same space share the node's one token of it.
//!
//! The counters of such a format are kept per token, not per node: a token
//! that passes to another node continues above the old holder's counter.

use std::fmt;

use super::preset::UNIQ64_MAX_TOKEN;
use super::template::Charset;

/// Where a format's tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TokenSpace {
    /// `{token:width:charset}`: `radix^width` tokens.
    Chars {
        /// Characters (1-4).
        width: u8,
        /// Digits (base 10) or alnum (base 36).
        charset: Charset,
    },
    /// The `uniq64` preset's 12-bit token (4,096 tokens).
    Uniq64,
}

impl TokenSpace {
    /// How many tokens the space holds (`0..size`).
    pub fn size(self) -> u64 {
        match self {
            Self::Chars { width, charset } => charset
                .radix()
                .checked_pow(u32::from(width))
                .unwrap_or(u64::MAX),
            Self::Uniq64 => UNIQ64_MAX_TOKEN + 1,
        }
    }

    /// The largest token.
    pub fn max(self) -> u64 {
        self.size() - 1
    }

    /// The space's name, a path segment: `digits-2`, `alnum-3`, `uniq64`.
    pub fn name(self) -> String {
        match self {
            Self::Chars { width, charset } => format!("{}-{width}", charset.name()),
            Self::Uniq64 => "uniq64".to_owned(),
        }
    }

    /// The space named `name` (the inverse of [`TokenSpace::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        if name == "uniq64" {
            return Some(Self::Uniq64);
        }
        let (charset, width) = name.split_once('-')?;
        let charset = match charset {
            "digits" => Charset::Digits,
            "alnum" => Charset::Alnum,
            _ => return None,
        };
        let width: u8 = width.parse().ok().filter(|w| (1..=4).contains(w))?;
        Some(Self::Chars { width, charset })
    }

    /// `token` as IDs show it (`07`, `A7`; uniq64: decimal).
    pub fn render(self, token: u64) -> String {
        match self {
            Self::Chars { width, charset } => {
                let radix = charset.radix();
                let mut out = vec![b'0'; usize::from(width)];
                let mut x = token;
                for slot in out.iter_mut().rev() {
                    *slot = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"[(x % radix) as usize];
                    x /= radix;
                }
                String::from_utf8(out).unwrap_or_default()
            }
            Self::Uniq64 => token.to_string(),
        }
    }

    /// An embedded node's own tokens, `(first, last)`: disjoint from every
    /// other `(datacenter, worker)` under the same widths. The node index
    /// `datacenter << worker_bits | worker` picks an equal slice when the
    /// space has at least one token per possible node; otherwise nodes
    /// whose index is below the space's size get the token equal to their
    /// index and the others none (`None`), as do ids that do not fit.
    pub fn node_range(
        self,
        datacenter: u64,
        worker: u64,
        datacenter_bits: u8,
        worker_bits: u8,
    ) -> Option<(u64, u64)> {
        let node_bits = u32::from(datacenter_bits) + u32::from(worker_bits);
        if node_bits >= 63
            || datacenter
                .checked_shr(u32::from(datacenter_bits))
                .unwrap_or(0)
                != 0
            || worker.checked_shr(u32::from(worker_bits)).unwrap_or(0) != 0
        {
            return None;
        }
        let nodes = 1u64 << node_bits;
        let index = (datacenter << worker_bits) | worker;
        let per_node = self.size() / nodes;
        if per_node == 0 {
            return (index < self.size()).then_some((index, index));
        }
        let first = index * per_node;
        Some((first, first + per_node - 1))
    }
}

impl fmt::Display for TokenSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALNUM2: TokenSpace = TokenSpace::Chars {
        width: 2,
        charset: Charset::Alnum,
    };
    const DIGITS2: TokenSpace = TokenSpace::Chars {
        width: 2,
        charset: Charset::Digits,
    };

    #[test]
    fn sizes_names_and_rendering() {
        assert_eq!(ALNUM2.size(), 1296);
        assert_eq!(DIGITS2.size(), 100);
        assert_eq!(TokenSpace::Uniq64.size(), 4096);
        for s in [ALNUM2, DIGITS2, TokenSpace::Uniq64] {
            assert_eq!(TokenSpace::from_name(&s.name()), Some(s));
        }
        assert_eq!(TokenSpace::from_name("alnum-5"), None);
        assert_eq!(TokenSpace::from_name("hex-2"), None);
        assert_eq!(ALNUM2.render(36 + 10), "1A");
        assert_eq!(DIGITS2.render(7), "07");
        assert_eq!(TokenSpace::Uniq64.render(4095), "4095");
    }

    #[test]
    fn node_ranges_are_disjoint_and_inside_the_space() {
        for space in [ALNUM2, DIGITS2, TokenSpace::Uniq64] {
            for (dc_bits, w_bits) in [(5u8, 5u8), (2, 3), (0, 4)] {
                let mut seen = std::collections::HashSet::new();
                for dc in 0..(1u64 << dc_bits) {
                    for w in 0..(1u64 << w_bits) {
                        let Some((a, b)) = space.node_range(dc, w, dc_bits, w_bits) else {
                            continue;
                        };
                        assert!(a <= b && b <= space.max(), "{space} {dc}/{w}: {a}-{b}");
                        for t in a..=b {
                            assert!(seen.insert(t), "{space}: token {t} given twice");
                        }
                    }
                }
                assert!(!seen.is_empty());
            }
        }
        // 1,024 nodes, 100 tokens: the first 100 node indexes get one each.
        assert_eq!(DIGITS2.node_range(0, 7, 5, 5), Some((7, 7)));
        assert_eq!(DIGITS2.node_range(3, 7, 5, 5), None);
        assert_eq!(TokenSpace::Uniq64.node_range(0, 1, 5, 5), Some((4, 7)));
        assert_eq!(ALNUM2.node_range(0, 32, 5, 5), None, "worker too wide");
    }
}
