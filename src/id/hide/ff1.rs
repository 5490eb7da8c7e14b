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
//! multiplications by a reciprocal computed at construction).
//!
//! [`Ff1Decimal::encrypt_lanes`] runs up to [`LANES`] values side by
//! side, one AES call per round for all of them, so the processor
//! pipelines their blocks: what a batch (`GenIds` of many IDs) costs per
//! ID is a fraction of one value's chain of ten dependent AES calls.

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
/// `ceil(2^128 / m)`, exact for every 64-bit dividend.
#[derive(Clone, Copy)]
pub(super) struct Modulus {
    m: u64,
    /// `ceil(2^128 / m)` (m is no power of two).
    reciprocal: u128,
    /// `2^64 mod m`.
    r64: u64,
}

impl Modulus {
    /// The modulus `m`, `1 < m < 2^34`.
    pub(super) fn new(m: u64) -> Self {
        debug_assert!(m > 1 && m < 1 << 34);
        Self {
            m,
            reciprocal: u128::MAX / u128::from(m) + 1,
            r64: ((1u128 << 64) % u128::from(m)) as u64,
        }
    }

    /// `a mod m`.
    #[inline]
    pub(super) fn rem(self, a: u64) -> u64 {
        let low = self.reciprocal.wrapping_mul(u128::from(a));
        // The top 64 bits of the 192-bit product `low * m`.
        let m = u128::from(self.m);
        let bottom = ((low & u128::from(u64::MAX)) * m) >> 64;
        let top = (low >> 64) * m;
        ((bottom + top) >> 64) as u64
    }

    /// `(a + y) mod m` for `a < m` and `y < 2^96` (FF1's `y` is at most
    /// 12 bytes here). With `y = hi * 2^64 + lo`, `hi * r64` is below
    /// 2^66; its top bits times `r64` and the three remainders sum below
    /// `7m < 2^37`, so every step fits its integer.
    #[inline]
    pub(super) fn add_rem(self, a: u64, y: u128) -> u64 {
        debug_assert!(a < self.m && y >> 96 == 0);
        let t = (y >> 64) * u128::from(self.r64);
        let sum = ((t >> 64) as u64) * self.r64 + self.rem(t as u64) + self.rem(y as u64) + a;
        self.rem(sum)
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
}

/// FF1 radix 10 over exactly `n` digits, with one key and one tweak.
pub(super) struct Ff1Decimal<C> {
    cipher: C,
    /// `10^u` and `10^v`, for `u` digits in the left half `A` and `v`
    /// in the right half `B`.
    pow_u: Modulus,
    pow_v: Modulus,
    /// Bytes of `NUM(B)` in `Q` (the standard's `b`), and of `y` (`d`).
    b: usize,
    d: usize,
    /// The CBC-MAC state after `P` and every block of `Q` but the last.
    state: [u8; 16],
    /// The last block of `Q` with zeros where the round number and
    /// `NUM(B)` go.
    last: [u8; 16],
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
        Self {
            cipher,
            pow_u: Modulus::new(10u64.pow(u)),
            pow_v: Modulus::new(pow_v),
            b,
            d,
            state,
            last,
        }
    }

    /// The last CBC-MAC block of round `i` over the half `half`, before
    /// its encryption.
    #[inline]
    fn round_block(&self, i: u8, half: u64) -> [u8; 16] {
        let mut block = self.last;
        block[15 - self.b] = i;
        block[16 - self.b..].copy_from_slice(&half.to_be_bytes()[8 - self.b..]);
        xor(&mut block, &self.state);
        block
    }

    /// The round value `y = NUM(S)` from the encrypted block `R`.
    #[inline]
    fn num_s(&self, r: &[u8]) -> u128 {
        // d <= 16 here, so S is the first d bytes of R.
        let mut s = [0u8; 16];
        s[16 - self.d..].copy_from_slice(&r[..self.d]);
        u128::from_be_bytes(s)
    }

    /// The round value `y = NUM(S)` for round `i` over the half `half`.
    #[inline]
    fn y(&self, i: u8, half: u64) -> u128 {
        let mut block = self.round_block(i, half);
        self.cipher.encrypt(&mut block);
        self.num_s(&block)
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
        let (mut a, mut b) = (x / self.pow_v.m, x % self.pow_v.m);
        for i in 0..ROUNDS {
            let c = self.modulus(i).add_rem(a, self.y(i, b));
            a = b;
            b = c;
        }
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
                let c = m.add_rem(*a, self.num_s(block));
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
        let (mut a, mut b) = (x / self.pow_v.m, x % self.pow_v.m);
        for i in (0..ROUNDS).rev() {
            let c = self.modulus(i).sub_rem(b, self.y(i, a));
            b = a;
            a = c;
        }
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
