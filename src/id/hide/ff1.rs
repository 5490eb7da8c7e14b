//! FF1 (NIST SP 800-38G rev. 1, section 5.1) specialised to radix 10 and
//! at most 19 digits, in integer arithmetic over one AES block cipher.
//!
//! The general algorithm works on numeral strings with bignums; here a
//! half never exceeds 10^10, so every `NUM`/`STR` is a `u64` division and
//! the round value `y` fits a `u128`. Everything that depends only on the
//! key, the tweak and the length (`P`, the tweak blocks of `Q`) is run
//! through the CBC-MAC once at construction, so each of the ten rounds
//! costs one AES block encryption and no allocation. The round's
//! `(A + y) mod 10^m` needs no 128-bit division either ([`Modulus`]:
//! multiplications by a reciprocal computed at construction; up to 18
//! digits `y` is 8 bytes and the remainder is by a constant power of
//! ten, [`Modulus::add_rem64`]).
//!
//! One value's ten rounds are a chain: each AES input needs the previous
//! round's output. So the work between two AES calls is kept short and
//! branch-free: a round's input block is one 128-bit XOR of a per-round
//! constant (the CBC-MAC state, the tweak's last bytes and the round
//! number, all fixed at construction) with the half, `y` is one shift of
//! the output block, and `(A + y) mod 10^m` is one fold and one
//! reciprocal multiplication ([`Modulus::add_rem`]).
//!
//! [`Ff1Decimal::encrypt_lanes`] runs up to [`LANES`] values side by
//! side, one AES call per round for all of them, so the processor
//! pipelines their blocks: what a batch (`GenIds` of many IDs) costs per
//! ID is a fraction of one value's chain of ten dependent AES calls.

use super::aes_chain::AesChain;
use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
use aes::{Aes128, Aes192, Aes256, Block};

/// FF1's ten Feistel rounds (fixed by the standard).
const ROUNDS: u8 = 10;
/// The most digits this implementation takes (both halves then stay at
/// or below 10 digits and `y` within 16 bytes).
pub(super) const MAX_DIGITS: u32 = 19;
/// The fewest digits the standard allows for radix 10 (`radix^minlen >=
/// 1,000,000`).
pub(super) const MIN_DIGITS: u32 = 6;

/// How many values a batch permutes side by side: the `aes` crate's
/// AES-NI backend encrypts 8 blocks at once (its `ParBlocksSize`).
pub(super) const LANES: usize = 8;

/// One AES block encryption, whatever the key size (FF1 allows all three;
/// idgen uses AES-256, the known-answer tests also AES-128 and AES-192).
pub(super) trait BlockCipher: Send + Sync {
    /// Encrypts one block in place.
    fn encrypt(&self, block: &mut [u8; 16]);
    /// Encrypts independent blocks in place, pipelined where the
    /// hardware allows.
    fn encrypt_many(&self, blocks: &mut [Block]);
}

macro_rules! block_cipher {
    ($t:ty) => {
        impl BlockCipher for $t {
            #[inline]
            fn encrypt(&self, block: &mut [u8; 16]) {
                self.encrypt_block(GenericArray::from_mut_slice(block));
            }
            #[inline]
            fn encrypt_many(&self, blocks: &mut [Block]) {
                self.encrypt_blocks(blocks);
            }
        }
    };
}
block_cipher!(Aes128);
block_cipher!(Aes192);
block_cipher!(Aes256);

/// An AES-256 key schedule from 32 bytes.
pub(super) fn aes256(key: &[u8; 32]) -> Aes256 {
    Aes256::new(GenericArray::from_slice(key))
}

/// Remainders modulo one `m` (`10^3..=10^10`, below 2^34) without a
/// division instruction: Lemire, Kaser and Kurz's direct remainder
/// ("Faster remainder by direct computation", 2019) with the reciprocal
/// `c = ceil(2^128 / m)`. Their theorem makes it exact for every
/// dividend below `2^N` when `N + ceil(log2 m) <= 128`: with `m < 2^34`,
/// every dividend below 2^94 ([`Modulus::rem_wide`]).
#[derive(Clone, Copy)]
pub(super) struct Modulus {
    m: u64,
    /// `k` when `m = 10^k` (3 to 9): [`Modulus::add_rem64`] then takes
    /// the remainder by a constant the compiler turns into two
    /// multiplications. 0 otherwise.
    pow10: u32,
    /// `ceil(2^128 / m)` (m is no power of two).
    reciprocal: u128,
    /// `2^64 mod m`.
    r64: u64,
}

impl Modulus {
    /// The modulus `m`, `1 < m < 2^34`.
    pub(super) fn new(m: u64) -> Self {
        debug_assert!(m > 1 && m < 1 << 34);
        let k = m.ilog10();
        Self {
            m,
            pow10: if 10u64.pow(k) == m && (3..=9).contains(&k) {
                k
            } else {
                0
            },
            reciprocal: u128::MAX / u128::from(m) + 1,
            r64: ((1u128 << 64) % u128::from(m)) as u64,
        }
    }

    /// `a mod m` (for tests: the rounds use [`Modulus::add_rem`]).
    #[cfg(test)]
    pub(super) fn rem(self, a: u64) -> u64 {
        self.rem_wide(u128::from(a))
    }

    /// `n mod m` for `n < 2^94` (the theorem's bound for `m < 2^34`).
    #[inline]
    pub(super) fn rem_wide(self, n: u128) -> u64 {
        debug_assert!(n >> 94 == 0);
        let low = self.reciprocal.wrapping_mul(n);
        // The top bits (above 2^128) of `low * m`, m < 2^34: both partial
        // products stay below 2^98.
        let m = u128::from(self.m);
        let bottom = ((low & u128::from(u64::MAX)) * m) >> 64;
        let top = (low >> 64) * m;
        ((bottom + top) >> 64) as u64
    }

    /// `(a + y) mod m` for `a < m` and `y < 2^96` (FF1's `y` is at most
    /// 12 bytes here). With `y = hi * 2^64 + lo` and `r64 = 2^64 mod m`,
    /// `a + y` is congruent to `hi * r64 + lo + a`, which is below
    /// `2^32 * 2^34 + 2^64 + 2^34 < 2^67`: one [`Modulus::rem_wide`].
    #[inline]
    pub(super) fn add_rem(self, a: u64, y: u128) -> u64 {
        debug_assert!(a < self.m && y >> 96 == 0);
        let folded = (y >> 64) * u128::from(self.r64) + (y & u128::from(u64::MAX)) + u128::from(a);
        self.rem_wide(folded)
    }

    /// `(b - y) mod m` for `b < m` and `y < 2^96`.
    #[inline]
    pub(super) fn sub_rem(self, b: u64, y: u128) -> u64 {
        let y = self.add_rem(0, y);
        if b >= y {
            b - y
        } else {
            b + self.m - y
        }
    }

    /// `y mod m` for a 64-bit `y`: by a constant when `m` is `10^3` to
    /// `10^9` (one predictable branch picks it), else [`Modulus::rem_wide`].
    #[inline]
    fn rem64(self, y: u64) -> u64 {
        match self.pow10 {
            3 => y % 1_000,
            4 => y % 10_000,
            5 => y % 100_000,
            6 => y % 1_000_000,
            7 => y % 10_000_000,
            8 => y % 100_000_000,
            9 => y % 1_000_000_000,
            _ => self.rem_wide(u128::from(y)),
        }
    }

    /// `(a + y) mod m` for `a < m` and a 64-bit `y` (FF1's `y` when it
    /// is 8 bytes, up to 18 digits): shorter than [`Modulus::add_rem`].
    #[inline]
    pub(super) fn add_rem64(self, a: u64, y: u64) -> u64 {
        debug_assert!(a < self.m);
        let c = a + self.rem64(y);
        if c >= self.m {
            c - self.m
        } else {
            c
        }
    }

    /// `(b - y) mod m` for `b < m` and a 64-bit `y`.
    #[inline]
    pub(super) fn sub_rem64(self, b: u64, y: u64) -> u64 {
        let y = self.rem64(y);
        if b >= y {
            b - y
        } else {
            b + self.m - y
        }
    }
}

/// FF1 radix 10 over exactly `n` digits, with one key and one tweak.
pub(super) struct Ff1Decimal<C> {
    cipher: C,
    /// The same key for single values' chains of ten blocks, with AES-NI
    /// inline where the processor has it ([`Ff1Decimal::with_chain`]).
    chain: Option<AesChain>,
    /// `10^u` and `10^v`, for `u` digits in the left half `A` and `v`
    /// in the right half `B`.
    pow_u: Modulus,
    pow_v: Modulus,
    /// Bits of `NUM(B)` in `Q` (8 times the standard's `b`): the round
    /// number sits just above them.
    num_bits: u32,
    /// `128 - 8d`: `y = NUM(S)` is the encrypted block's first `d` bytes,
    /// the block read as a big-endian number shifted right this far.
    y_shift: u32,
    /// Whether `d` is 8 (up to 18 digits): `y` is then the block's first
    /// 8 bytes, a `u64`, and the rounds take [`Modulus::add_rem64`].
    y64: bool,
    /// Round `i`'s CBC-MAC input before `NUM(B)`, as a little-endian
    /// number (the chain's form): the state after `P` and every block of
    /// `Q` but the last, XOR the last block of `Q` with the round number
    /// `i` in place and zeros where `NUM(B)` goes. Adding `NUM(B)` is one
    /// byte swap of the half and one XOR, since it fills only the zeros.
    round_base_le: [u128; ROUNDS as usize],
}

impl<C: BlockCipher> Ff1Decimal<C> {
    /// FF1 over `n` digits (`MIN_DIGITS..=MAX_DIGITS`, checked by the
    /// caller) with `tweak`.
    pub(super) fn new(cipher: C, n: u32, tweak: &[u8]) -> Self {
        debug_assert!((MIN_DIGITS..=MAX_DIGITS).contains(&n));
        let u = n / 2;
        let v = n - u;
        let pow_v = 10u64.pow(v);
        // b = ceil(ceil(v * log2(10)) / 8): 10^v is not a power of two,
        // so ceil(v * log2(10)) is the bit length of 10^v.
        let b = (64 - pow_v.leading_zeros()).div_ceil(8) as usize;
        let d = 4 * b.div_ceil(4) + 4;
        let t = tweak.len();
        let mut p = [
            1,
            2,
            1,
            0,
            0,
            10,
            10,
            (u % 256) as u8,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ];
        p[8..12].copy_from_slice(&n.to_be_bytes());
        p[12..16].copy_from_slice(&(t as u32).to_be_bytes());
        // Q = T || 0^((-t-b-1) mod 16) || [i] || [NUM(B)]^b, a whole
        // number of blocks; every block but the last is constant.
        let pad = (16 - (t + b + 1) % 16) % 16;
        let mut q = Vec::with_capacity(t + pad + 1 + b);
        q.extend_from_slice(tweak);
        q.resize(t + pad + 1 + b, 0);
        let mut state = p;
        cipher.encrypt(&mut state);
        let (head, tail) = q.split_at(q.len() - 16);
        for chunk in head.chunks_exact(16) {
            xor(&mut state, chunk);
            cipher.encrypt(&mut state);
        }
        let mut last = [0u8; 16];
        last.copy_from_slice(tail);
        xor(&mut last, &state);
        let base = u128::from_be_bytes(last);
        // b <= 5 bytes (10^10 < 2^40), so the round number's byte and
        // NUM(B) lie inside the block.
        let num_bits = 8 * b as u32;
        Self {
            cipher,
            chain: None,
            pow_u: Modulus::new(10u64.pow(u)),
            pow_v: Modulus::new(pow_v),
            num_bits,
            y_shift: 128 - 8 * d as u32,
            y64: d == 8,
            round_base_le: std::array::from_fn(|i| (base ^ ((i as u128) << num_bits)).swap_bytes()),
        }
    }

    /// Single values (`encrypt`, `decrypt`) run their ten blocks through
    /// `chain`, which must hold the same key as the cipher (the known
    /// answers check it).
    pub(super) fn with_chain(mut self, chain: AesChain) -> Self {
        self.chain = Some(chain);
        self
    }

    /// The last CBC-MAC block of round `i` over the half `half` (below
    /// `10^v`, so it fits its `b` bytes), before its encryption, as a
    /// little-endian number: the half (at most 5 bytes) fills the block's
    /// last bytes, the top of the little-endian number, byte-reversed.
    #[inline]
    fn round_word_le(&self, i: u8, half: u64) -> u128 {
        debug_assert!(u128::from(half) >> self.num_bits == 0);
        self.round_base_le[usize::from(i)] ^ (u128::from(half.swap_bytes()) << 64)
    }

    /// [`Ff1Decimal::round_word_le`] as bytes.
    #[inline]
    fn round_block(&self, i: u8, half: u64) -> [u8; 16] {
        self.round_word_le(i, half).to_le_bytes()
    }

    /// One value's ten dependent blocks (see [`AesChain::run`]; blocks
    /// here are little-endian numbers): through the chain when there is
    /// one, else block by block through the cipher.
    #[inline]
    fn rounds(
        &self,
        first: u128,
        mut state: (u64, u64),
        mut next: impl FnMut(u8, u128, (u64, u64)) -> (u128, (u64, u64)),
    ) -> (u64, u64) {
        if let Some(chain) = &self.chain {
            return chain.run(ROUNDS, first, state, next);
        }
        let mut block = first;
        for i in 0..ROUNDS {
            let mut bytes = block.to_le_bytes();
            self.cipher.encrypt(&mut bytes);
            (block, state) = next(i, u128::from_le_bytes(bytes), state);
        }
        state
    }

    /// The round value `y = NUM(S)` from the encrypted block `R`.
    #[inline]
    fn num_s(&self, r: &[u8; 16]) -> u128 {
        // d <= 16 here, so S is the first d bytes of R.
        u128::from_be_bytes(*r) >> self.y_shift
    }

    fn modulus(&self, i: u8) -> Modulus {
        if i.is_multiple_of(2) {
            self.pow_u
        } else {
            self.pow_v
        }
    }

    /// Encrypts `x < 10^n` (the digit string `x` zero-padded to `n`).
    #[inline]
    pub(super) fn encrypt(&self, x: u64) -> u64 {
        let (a, b) = (x / self.pow_v.m, x % self.pow_v.m);
        let first = self.round_word_le(0, b);
        let (a, b) = self.rounds(first, (a, b), |i, r, (a, b)| {
            // Blocks are little-endian: the first 8 bytes are `r as u64`.
            let c = if self.y64 {
                self.modulus(i).add_rem64(a, (r as u64).swap_bytes())
            } else {
                self.modulus(i).add_rem(a, r.swap_bytes() >> self.y_shift)
            };
            let block = match i + 1 {
                ROUNDS => 0,
                next => self.round_word_le(next, c),
            };
            (block, (b, c))
        });
        a * self.pow_v.m + b
    }

    /// Encrypts every value of `xs` (each `< 10^n`, at most [`LANES`] of
    /// them) in place, exactly as [`Ff1Decimal::encrypt`] one by one: the
    /// same rounds, each round's blocks encrypted in one call.
    pub(super) fn encrypt_lanes(&self, xs: &mut [u64]) {
        let n = xs.len();
        assert!(n <= LANES, "at most {LANES} lanes, got {n}");
        let (mut left, mut right) = ([0u64; LANES], [0u64; LANES]);
        for (k, &x) in xs.iter().enumerate() {
            (left[k], right[k]) = (x / self.pow_v.m, x % self.pow_v.m);
        }
        let (left, right) = (&mut left[..n], &mut right[..n]);
        let mut blocks = [Block::default(); LANES];
        let blocks = &mut blocks[..n];
        for i in 0..ROUNDS {
            for (block, &b) in blocks.iter_mut().zip(right.iter()) {
                *block = self.round_block(i, b).into();
            }
            self.cipher.encrypt_many(blocks);
            let m = self.modulus(i);
            for ((a, b), block) in left.iter_mut().zip(right.iter_mut()).zip(blocks.iter()) {
                // Branch-free for the batch: the lanes' multiplications
                // overlap, so the reciprocal costs no more than a constant.
                let c = m.add_rem(*a, self.num_s(&(*block).into()));
                *a = *b;
                *b = c;
            }
        }
        for ((x, a), b) in xs.iter_mut().zip(left.iter()).zip(right.iter()) {
            *x = a * self.pow_v.m + b;
        }
    }

    /// Decrypts what [`Ff1Decimal::encrypt`] produced.
    #[inline]
    pub(super) fn decrypt(&self, x: u64) -> u64 {
        let (a, b) = (x / self.pow_v.m, x % self.pow_v.m);
        let first = self.round_word_le(ROUNDS - 1, a);
        let (a, b) = self.rounds(first, (a, b), |step, r, (a, b)| {
            // The rounds backwards: step 0 undoes round 9.
            let i = ROUNDS - 1 - step;
            let c = if self.y64 {
                self.modulus(i).sub_rem64(b, (r as u64).swap_bytes())
            } else {
                self.modulus(i).sub_rem(b, r.swap_bytes() >> self.y_shift)
            };
            let block = match i {
                0 => 0,
                i => self.round_word_le(i - 1, c),
            };
            (block, (c, a))
        });
        a * self.pow_v.m + b
    }

    /// Digits in each half (for tests).
    #[cfg(test)]
    pub(super) fn halves(&self) -> (u32, u32) {
        (self.pow_u.m.ilog10(), self.pow_v.m.ilog10())
    }
}

fn xor(block: &mut [u8; 16], other: &[u8]) {
    for (x, y) in block.iter_mut().zip(other) {
        *x ^= y;
    }
}
