//! FF1 (NIST SP 800-38G rev. 1, section 5.1) specialised to radix 10 and
//! at most 19 digits, in integer arithmetic over one AES block cipher.
//!
//! The general algorithm works on numeral strings with bignums; here a
//! half never exceeds 10^10, so every `NUM`/`STR` is a `u64` division and
//! the round value `y` fits a `u128`. Everything that depends only on the
//! key, the tweak and the length (`P`, the tweak blocks of `Q`) is run
//! through the CBC-MAC once at construction, so each of the ten rounds
//! costs one AES block encryption and no allocation.

use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
use aes::{Aes128, Aes192, Aes256};

/// FF1's ten Feistel rounds (fixed by the standard).
const ROUNDS: u8 = 10;
/// The most digits this implementation takes (both halves then stay at
/// or below 10 digits and `y` within 16 bytes).
pub(super) const MAX_DIGITS: u32 = 19;
/// The fewest digits the standard allows for radix 10 (`radix^minlen >=
/// 1,000,000`).
pub(super) const MIN_DIGITS: u32 = 6;

/// One AES block encryption, whatever the key size (FF1 allows all three;
/// idgen uses AES-256, the known-answer tests also AES-128 and AES-192).
pub(super) trait BlockCipher: Send + Sync {
    /// Encrypts one block in place.
    fn encrypt(&self, block: &mut [u8; 16]);
}

macro_rules! block_cipher {
    ($t:ty) => {
        impl BlockCipher for $t {
            #[inline]
            fn encrypt(&self, block: &mut [u8; 16]) {
                self.encrypt_block(GenericArray::from_mut_slice(block));
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

/// FF1 radix 10 over exactly `n` digits, with one key and one tweak.
pub(super) struct Ff1Decimal<C> {
    cipher: C,
    /// `10^u` and `10^v`, for `u` digits in the left half `A` and `v`
    /// in the right half `B`.
    pow_u: u64,
    pow_v: u64,
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
            pow_u: 10u64.pow(u),
            pow_v,
            b,
            d,
            state,
            last,
        }
    }

    /// The round value `y = NUM(S)` for round `i` over the half `half`.
    #[inline]
    fn y(&self, i: u8, half: u64) -> u128 {
        let mut block = self.last;
        block[15 - self.b] = i;
        block[16 - self.b..].copy_from_slice(&half.to_be_bytes()[8 - self.b..]);
        xor(&mut block, &self.state);
        self.cipher.encrypt(&mut block);
        // d <= 16 here, so S is the first d bytes of R.
        let mut s = [0u8; 16];
        s[16 - self.d..].copy_from_slice(&block[..self.d]);
        u128::from_be_bytes(s)
    }

    fn modulus(&self, i: u8) -> u64 {
        if i.is_multiple_of(2) {
            self.pow_u
        } else {
            self.pow_v
        }
    }

    /// Encrypts `x < 10^n` (the digit string `x` zero-padded to `n`).
    #[inline]
    pub(super) fn encrypt(&self, x: u64) -> u64 {
        let (mut a, mut b) = (x / self.pow_v, x % self.pow_v);
        for i in 0..ROUNDS {
            let m = self.modulus(i);
            let c = ((u128::from(a) + self.y(i, b)) % u128::from(m)) as u64;
            a = b;
            b = c;
        }
        a * self.pow_v + b
    }

    /// Decrypts what [`Ff1Decimal::encrypt`] produced.
    #[inline]
    pub(super) fn decrypt(&self, x: u64) -> u64 {
        let (mut a, mut b) = (x / self.pow_v, x % self.pow_v);
        for i in (0..ROUNDS).rev() {
            let m = u128::from(self.modulus(i));
            let y = self.y(i, a) % m;
            let c = ((u128::from(b) + m - y) % m) as u64;
            b = a;
            a = c;
        }
        a * self.pow_v + b
    }

    /// Digits in each half (for tests).
    #[cfg(test)]
    pub(super) fn halves(&self) -> (u32, u32) {
        (self.pow_u.ilog10(), self.pow_v.ilog10())
    }
}

fn xor(block: &mut [u8; 16], other: &[u8]) {
    for (x, y) in block.iter_mut().zip(other) {
        *x ^= y;
    }
}
