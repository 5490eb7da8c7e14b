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
//! at least ten AES latencies; they run through [`AesChain`], with AES-NI
//! inline where the processor has it. [`Feistel::encrypt_lanes`] runs up to [`LANES`]
//! values side by side with one AES call per round for all of them, which
//! the processor pipelines: a batch costs a fraction of that per value.

use super::aes_chain::AesChain;
use super::ff1::LANES;
use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
use aes::{Aes128, Block};

/// Rounds of the network (at least 8; FF1 uses 10).
pub(super) const ROUNDS: u8 = 10;
/// The widest domain: a positive 64-bit ID.
pub(super) const MAX_BITS: u32 = 63;

/// A Feistel permutation of `0..2^bits`, keyed, tweakable per call.
pub(super) struct Feistel {
    /// The round function's cipher for batches (eight blocks per call).
    cipher: Aes128,
    /// The same key for single values' chains of ten blocks.
    chain: AesChain,
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
        Self {
            cipher,
            chain: AesChain::aes128(&key),
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
        let (mut a, mut b) = (x >> self.v, x & mask(self.v));
        let first = self.input_word(0, b, tweak);
        self.chain.run(ROUNDS, first, |i, r| {
            // The round function's output: the block's low bytes.
            let c = a ^ (r as u64 & mask(self.width(i)));
            a = b;
            b = c;
            match i + 1 {
                ROUNDS => 0,
                next => self.input_word(next, b, tweak),
            }
        });
        (a << self.v) | b
    }

    /// Permutes every `xs[k] < 2^bits` under `tweaks[k]` in place (at
    /// most [`LANES`] of them), exactly as [`Feistel::encrypt`] one by
    /// one: the same rounds, each round's blocks encrypted in one call.
    pub(super) fn encrypt_lanes(&self, xs: &mut [u64], tweaks: &[u64]) {
        let n = xs.len();
        assert!(
            n <= LANES && tweaks.len() == n,
            "{n} values and {} tweaks for at most {LANES} lanes",
            tweaks.len()
        );
        let (mut left, mut right) = ([0u64; LANES], [0u64; LANES]);
        for (k, &x) in xs.iter().enumerate() {
            (left[k], right[k]) = (x >> self.v, x & mask(self.v));
        }
        let (left, right) = (&mut left[..n], &mut right[..n]);
        let mut blocks = [Block::default(); LANES];
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

    /// Inverts [`Feistel::encrypt`] under the same tweak.
    #[inline]
    pub(super) fn decrypt(&self, x: u64, tweak: u64) -> u64 {
        let (mut a, mut b) = (x >> self.v, x & mask(self.v));
        let first = self.input_word(ROUNDS - 1, a, tweak);
        self.chain.run(ROUNDS, first, |step, r| {
            // The rounds backwards: step 0 undoes round 9.
            let i = ROUNDS - 1 - step;
            let c = b ^ (r as u64 & mask(self.width(i)));
            b = a;
            a = c;
            match i {
                0 => 0,
                i => self.input_word(i - 1, a, tweak),
            }
        });
        (a << self.v) | b
    }
}
