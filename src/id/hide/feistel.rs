//! A keyed Feistel network over exactly `n` bits (2 to 63), with a 64-bit
//! tweak: the permutation behind [`super::IntHider`] and
//! [`super::SnowflakeHider`].
//!
//! The structure is FF1's (NIST SP 800-38G rev. 1) with radix 2: the
//! value splits into a left half of `n / 2` bits and a right half of the
//! rest (unbalanced when `n` is odd), and each round replaces one half by
//! itself XOR a keyed round function of the other, alternating which half
//! is `n / 2` bits wide. Whatever the round function, each round is
//! undone by repeating it, so the network is a permutation of exactly
//! `0..2^n`: no output leaves the domain and no cycle-walking is needed.
//!
//! The round function is AES-128 under a subkey of its own, on one block
//! holding the tweak, the round number, the width and the half, so every
//! (round, width, tweak) is an independent pseudorandom function.
//!
//! One value's ten rounds are ten dependent AES calls, so its cost is
//! at least ten AES latencies. With AES-NI the whole chain stays in
//! 128-bit registers ([`one`]); elsewhere, and for reveals, it runs
//! through [`AesChain`] (AES-NI inline where the processor has it, else
//! the `aes` crate). [`Feistel::encrypt_lanes`] runs up
//! to [`LANES`] values side by side, which the processor pipelines: a
//! batch costs a fraction of that per value. With VAES and AVX2 (checked
//! at run time) the whole round runs in 256-bit registers, two blocks per
//! instruction and eight instructions in flight ([`wide`]); elsewhere the
//! `aes` crate encrypts each round's blocks eight at a time.

use super::aes_chain::AesChain;
use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
use aes::{Aes128, Block};

/// Rounds of the network (at least 8; FF1 uses 10).
pub(super) const ROUNDS: u8 = 10;
/// The widest domain: a positive 64-bit ID.
pub(super) const MAX_BITS: u32 = 63;
/// How many values [`Feistel::encrypt_lanes`] permutes side by side:
/// sixteen blocks in eight 256-bit registers on the VAES path.
pub(super) const LANES: usize = 16;
/// What the `aes` crate's AES-NI backend encrypts at once (its
/// `ParBlocksSize`): the fallback's lanes.
const CRATE_LANES: usize = 8;

/// A Feistel permutation of `0..2^bits`, keyed, tweakable per call.
pub(super) struct Feistel {
    /// The round function's cipher for batches (eight blocks per call).
    cipher: Aes128,
    /// The same key for single values' chains of ten blocks.
    chain: AesChain,
    /// Whether this processor runs the wide batch path (VAES and AVX2,
    /// with the chain's AES-NI round keys).
    wide: bool,
    /// Bits of the left half (`bits / 2`) and of the right half.
    u: u32,
    v: u32,
}

/// `2^bits - 1` for `bits` in 0..=64.
#[inline]
pub(super) fn mask(bits: u32) -> u64 {
    if bits == 0 {
        0
    } else {
        u64::MAX >> (64 - bits)
    }
}

impl Feistel {
    /// A network over `bits` bits (2..=63, checked by the caller) keyed by
    /// the first 16 bytes of `subkey`.
    pub(super) fn new(subkey: &[u8; 32], bits: u32) -> Self {
        debug_assert!((2..=MAX_BITS).contains(&bits));
        let key: [u8; 16] = std::array::from_fn(|i| subkey[i]);
        let cipher = Aes128::new(GenericArray::from_slice(&key));
        let u = bits / 2;
        let chain = AesChain::aes128(&key);
        Self {
            cipher,
            wide: wide::available(&chain),
            chain,
            u,
            v: bits - u,
        }
    }

    /// The round function's input block for round `i` on the half
    /// `half`: the tweak (bytes 0..8, little-endian), the half's low 32
    /// bits (8..12; a half has at most 32), the round, the width, zeros.
    #[inline]
    fn input(&self, i: u8, half: u64, tweak: u64) -> Block {
        self.input_word(i, half, tweak).to_le_bytes().into()
    }

    /// [`Feistel::input`] as a little-endian number.
    #[inline]
    fn input_word(&self, i: u8, half: u64, tweak: u64) -> u128 {
        u128::from(tweak)
            | u128::from(half as u32) << 64
            | u128::from(i) << 96
            | u128::from(self.u + self.v) << 104
    }

    /// The round function's `m`-bit output from its encrypted block.
    #[inline]
    fn output(block: &Block, m: u32) -> u64 {
        let mut out = [0u8; 8];
        out.copy_from_slice(&block[..8]);
        u64::from_le_bytes(out) & mask(m)
    }

    fn width(&self, i: u8) -> u32 {
        if i.is_multiple_of(2) {
            self.u
        } else {
            self.v
        }
    }

    /// Permutes `x < 2^bits` under `tweak`.
    #[inline]
    pub(super) fn encrypt(&self, x: u64, tweak: u64) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if let Some(keys) = self.chain.ni_keys() {
            // SAFETY: the chain has AES-NI round keys only where the
            // processor has AES-NI.
            return unsafe { one::encrypt(keys.keys(), self.u, self.v, x, tweak) };
        }
        self.encrypt_chain(x, tweak)
    }

    /// [`Feistel::encrypt`] through [`AesChain`]: the path without
    /// AES-NI or off x86-64 (and, in tests, a second path to hold `one`
    /// against).
    pub(super) fn encrypt_chain(&self, x: u64, tweak: u64) -> u64 {
        let (a, b) = (x >> self.v, x & mask(self.v));
        let first = self.input_word(0, b, tweak);
        let (a, b) = self.chain.run(ROUNDS, first, (a, b), |i, r, (a, b)| {
            // The round function's output: the block's low bytes.
            let c = a ^ (r as u64 & mask(self.width(i)));
            let block = match i + 1 {
                ROUNDS => 0,
                next => self.input_word(next, c, tweak),
            };
            (block, (b, c))
        });
        (a << self.v) | b
    }

    /// Permutes every `xs[k] < 2^bits` under `tweaks[k]` in place (at
    /// most [`LANES`] of them), exactly as [`Feistel::encrypt`] one by
    /// one: the same rounds, each round's blocks encrypted side by side.
    pub(super) fn encrypt_lanes(&self, xs: &mut [u64], tweaks: &[u64]) {
        let n = xs.len();
        assert!(
            n <= LANES && tweaks.len() == n,
            "{n} values and {} tweaks for at most {LANES} lanes",
            tweaks.len()
        );
        #[cfg(target_arch = "x86_64")]
        if self.wide {
            if let Some(keys) = self.chain.ni_keys() {
                // SAFETY: `wide` is only true when the processor has VAES,
                // AVX2 and AES-NI (`wide::available`).
                unsafe { wide::encrypt(keys.keys(), self.u, self.v, xs, tweaks) };
                return;
            }
        }
        for (xs, tweaks) in xs.chunks_mut(CRATE_LANES).zip(tweaks.chunks(CRATE_LANES)) {
            self.encrypt_crate_lanes(xs, tweaks);
        }
    }

    /// [`Feistel::encrypt_lanes`] for at most [`CRATE_LANES`] values
    /// through the `aes` crate, one call per round.
    fn encrypt_crate_lanes(&self, xs: &mut [u64], tweaks: &[u64]) {
        let n = xs.len();
        debug_assert!(n <= CRATE_LANES && tweaks.len() == n);
        let (mut left, mut right) = ([0u64; CRATE_LANES], [0u64; CRATE_LANES]);
        for (k, &x) in xs.iter().enumerate() {
            (left[k], right[k]) = (x >> self.v, x & mask(self.v));
        }
        let (left, right) = (&mut left[..n], &mut right[..n]);
        let mut blocks = [Block::default(); CRATE_LANES];
        let blocks = &mut blocks[..n];
        for i in 0..ROUNDS {
            for ((block, &b), &tweak) in blocks.iter_mut().zip(right.iter()).zip(tweaks) {
                *block = self.input(i, b, tweak);
            }
            self.cipher.encrypt_blocks(blocks);
            let m = self.width(i);
            for ((a, b), block) in left.iter_mut().zip(right.iter_mut()).zip(blocks.iter()) {
                let c = *a ^ Self::output(block, m);
                *a = *b;
                *b = c;
            }
        }
        for ((x, a), b) in xs.iter_mut().zip(left.iter()).zip(right.iter()) {
            *x = (a << self.v) | b;
        }
    }

    /// Whether batches take the VAES path here (for tests).
    #[cfg(test)]
    pub(super) fn wide(&self) -> bool {
        self.wide
    }

    /// A copy that takes the `aes` crate's path for batches (for tests:
    /// both paths must give the same IDs).
    #[cfg(test)]
    pub(super) fn without_wide(mut self) -> Self {
        self.wide = false;
        self
    }

    /// Inverts [`Feistel::encrypt`] under the same tweak.
    #[inline]
    pub(super) fn decrypt(&self, x: u64, tweak: u64) -> u64 {
        let (a, b) = (x >> self.v, x & mask(self.v));
        let first = self.input_word(ROUNDS - 1, a, tweak);
        let (a, b) = self.chain.run(ROUNDS, first, (a, b), |step, r, (a, b)| {
            // The rounds backwards: step 0 undoes round 9.
            let i = ROUNDS - 1 - step;
            let c = b ^ (r as u64 & mask(self.width(i)));
            let block = match i {
                0 => 0,
                i => self.input_word(i - 1, c, tweak),
            };
            (block, (c, a))
        });
        (a << self.v) | b
    }
}

/// One value's ten rounds in 128-bit registers with AES-NI: the halves
/// stay in the vector unit, so between two AES calls a round costs a
/// mask, two XORs and a byte shift (no moves to and from general
/// registers). The halves sit in the low 64 bits of their register; the
/// input block is the half shifted into bits 64 to 96, XOR the round's
/// constant block (tweak, round, width) already whitened with round key
/// 0. The result is exactly [`super::Feistel::encrypt`]'s chain through
/// [`AesChain`](super::AesChain).
#[cfg(target_arch = "x86_64")]
mod one {
    use super::{mask, ROUNDS};
    use std::arch::x86_64::{
        __m128i, _mm_aesenc_si128, _mm_aesenclast_si128, _mm_and_si128, _mm_cvtsi128_si64,
        _mm_set_epi64x, _mm_slli_si128, _mm_xor_si128,
    };

    /// Permutes `x` (below `2^(u + v)`) under `tweak` with AES-128's
    /// eleven round `keys`.
    ///
    /// # Safety
    /// The processor must have AES-NI.
    #[target_feature(enable = "aes")]
    pub(super) unsafe fn encrypt(keys: &[__m128i], u: u32, v: u32, x: u64, tweak: u64) -> u64 {
        debug_assert!(keys.len() == 11);
        let k: [__m128i; 11] = std::array::from_fn(|r| keys[r]);
        let width = u64::from(u + v) << 40;
        // `_mm_set_epi64x` takes the high 64 bits first.
        let base: [__m128i; ROUNDS as usize] = std::array::from_fn(|i| {
            let constant = ((i as u64) << 32) | width;
            _mm_xor_si128(_mm_set_epi64x(constant as i64, tweak as i64), k[0])
        });
        let masks = [
            _mm_set_epi64x(0, mask(u) as i64),
            _mm_set_epi64x(0, mask(v) as i64),
        ];
        let mut a = _mm_set_epi64x(0, (x >> v) as i64);
        let mut b = _mm_set_epi64x(0, (x & mask(v)) as i64);
        for (i, base) in base.iter().enumerate() {
            let mut s = _mm_xor_si128(_mm_slli_si128::<8>(b), *base);
            for key in &k[1..10] {
                s = _mm_aesenc_si128(s, *key);
            }
            s = _mm_aesenclast_si128(s, k[10]);
            // Even rounds yield `u` bits, odd rounds `v`.
            let c = _mm_xor_si128(a, _mm_and_si128(s, masks[i % 2]));
            a = b;
            b = c;
        }
        let (a, b) = (_mm_cvtsi128_si64(a) as u64, _mm_cvtsi128_si64(b) as u64);
        (a << v) | b
    }
}

/// The batch path in 256-bit registers: sixteen values, two per register,
/// each value's block `[tweak | half, round, width]` built, encrypted and
/// folded back without leaving the vector unit.
///
/// A register holds two 128-bit lanes, one value each. The halves `A` and
/// `B` live in the high 64 bits of their lane with zeros below, so a
/// round's input block is `B | tweak | (round, width)` (the tweak fills
/// the low 64 bits, the constant the bits above the half's 32), and the
/// round function's output (the block's low 64 bits) moves up to meet
/// them with one byte shift. Unused lanes of a short batch carry zeros
/// and are dropped.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{mask, AesChain, LANES, ROUNDS};
    use std::arch::x86_64::{
        __m128i, __m256i, _mm256_aesenc_epi128, _mm256_aesenclast_epi128, _mm256_and_si256,
        _mm256_broadcastsi128_si256, _mm256_bslli_epi128, _mm256_extract_epi64, _mm256_or_si256,
        _mm256_set_epi64x, _mm256_xor_si256,
    };

    /// Registers per batch (two values each).
    const REGS: usize = LANES / 2;

    /// Whether the wide path runs here: VAES and AVX2, and the chain has
    /// its AES-NI round keys.
    pub(super) fn available(chain: &AesChain) -> bool {
        std::arch::is_x86_feature_detected!("vaes")
            && std::arch::is_x86_feature_detected!("avx2")
            && chain.ni_keys().is_some()
    }

    /// [`super::Feistel::encrypt_lanes`] under AES-128's eleven round
    /// `keys`, for `u`/`v`-bit halves.
    ///
    /// # Safety
    /// The processor must have VAES, AVX2 and AES-NI.
    #[target_feature(enable = "aes,avx2,vaes")]
    pub(super) unsafe fn encrypt(keys: &[__m128i], u: u32, v: u32, xs: &mut [u64], tweaks: &[u64]) {
        debug_assert!(keys.len() == 11 && xs.len() <= LANES && tweaks.len() == xs.len());
        let keys: [__m256i; 11] = std::array::from_fn(|r| _mm256_broadcastsi128_si256(keys[r]));
        let value = |k: usize| xs.get(k).copied().unwrap_or(0);
        let tweak = |k: usize| tweaks.get(k).copied().unwrap_or(0);
        // `_mm256_set_epi64x` takes the highest 64 bits first.
        let high = |lo: u64, hi: u64| _mm256_set_epi64x(hi as i64, 0, lo as i64, 0);
        let mut a: [__m256i; REGS] =
            std::array::from_fn(|j| high(value(2 * j) >> v, value(2 * j + 1) >> v));
        let mut b: [__m256i; REGS] =
            std::array::from_fn(|j| high(value(2 * j) & mask(v), value(2 * j + 1) & mask(v)));
        let t: [__m256i; REGS] = std::array::from_fn(|j| {
            _mm256_set_epi64x(0, tweak(2 * j + 1) as i64, 0, tweak(2 * j) as i64)
        });
        let width = u64::from(u + v) << 40;
        for i in 0..ROUNDS {
            let constant = (u64::from(i) << 32) | width;
            let constant = high(constant, constant);
            let m = if i.is_multiple_of(2) { u } else { v };
            let m = high(mask(m), mask(m));
            let mut s: [__m256i; REGS] = std::array::from_fn(|j| {
                _mm256_xor_si256(
                    _mm256_or_si256(_mm256_or_si256(b[j], t[j]), constant),
                    keys[0],
                )
            });
            for key in &keys[1..10] {
                for block in &mut s {
                    *block = _mm256_aesenc_epi128(*block, *key);
                }
            }
            for j in 0..REGS {
                let out = _mm256_aesenclast_epi128(s[j], keys[10]);
                let c = _mm256_xor_si256(a[j], _mm256_and_si256(_mm256_bslli_epi128::<8>(out), m));
                a[j] = b[j];
                b[j] = c;
            }
        }
        for (k, x) in xs.iter_mut().enumerate() {
            let (j, second) = (k / 2, k % 2 == 1);
            let (hi, lo) = if second {
                (
                    _mm256_extract_epi64::<3>(a[j]),
                    _mm256_extract_epi64::<3>(b[j]),
                )
            } else {
                (
                    _mm256_extract_epi64::<1>(a[j]),
                    _mm256_extract_epi64::<1>(b[j]),
                )
            };
            *x = ((hi as u64) << v) | lo as u64;
        }
    }
}

/// No wide path off x86-64: batches take the `aes` crate's.
#[cfg(not(target_arch = "x86_64"))]
mod wide {
    pub(super) fn available(_: &super::AesChain) -> bool {
        false
    }
}
