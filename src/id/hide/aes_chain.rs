//! One value's chain of dependent AES blocks, run with the processor's
//! AES instructions inline: what a single hide (ten rounds, each needing
//! the previous round's output) costs is then close to ten AES latencies.
//!
//! Through the `aes` crate every block is a call that detects AES-NI,
//! loads the round keys and goes through memory both ways; that is fine
//! for eight blocks at once (the batch path) but in a chain it adds to
//! every round. Here, on x86-64 with AES-NI (detected at run time, so a
//! default build serves every x86-64 machine), the key schedule is
//! expanded once into registers' worth of round keys and a whole chain
//! runs inside one function compiled for AES-NI. Elsewhere (no AES-NI,
//! another architecture) [`AesChain::run`] calls the `aes` crate block by
//! block: the same blocks, slower.
//!
//! The key expansion is FIPS 197's, written with `aeskeygenassist` as in
//! Intel's AES-NI white paper; `tests.rs` checks every block against the
//! `aes` crate for random keys, and the known answers (NIST FF1 samples,
//! the fixed outputs) pass through it.

use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
use aes::{Aes128, Aes256};

/// AES-128 or AES-256 under one key, for chains of dependent blocks.
pub(super) struct AesChain {
    /// The `aes` crate's cipher: the fallback, and the batch path's.
    soft: Soft,
    /// The expanded round keys when this x86-64 processor has AES-NI.
    #[cfg(target_arch = "x86_64")]
    ni: Option<ni::RoundKeys>,
}

/// The `aes` crate's cipher (boxed: the two differ in size by more than
/// their key schedules' worth).
enum Soft {
    Aes128(Box<Aes128>),
    Aes256(Box<Aes256>),
}

impl AesChain {
    /// AES-128 under `key`.
    pub(super) fn aes128(key: &[u8; 16]) -> Self {
        Self {
            soft: Soft::Aes128(Box::new(Aes128::new(GenericArray::from_slice(key)))),
            #[cfg(target_arch = "x86_64")]
            ni: ni::RoundKeys::aes128(key),
        }
    }

    /// AES-256 under `key`.
    pub(super) fn aes256(key: &[u8; 32]) -> Self {
        Self {
            soft: Soft::Aes256(Box::new(Aes256::new(GenericArray::from_slice(key)))),
            #[cfg(target_arch = "x86_64")]
            ni: ni::RoundKeys::aes256(key),
        }
    }

    /// Runs `rounds` dependent blocks: encrypts `first`, hands the
    /// encryption of round `i`'s block and the running `state` to
    /// `next(i, encrypted, state)`, which returns round `i + 1`'s block
    /// and the new state (the last round's block is not used); returns
    /// the last state. A block is its 16 bytes read as a little-endian
    /// `u128` (byte 0 lowest). The state is passed by value so a round's
    /// halves stay in registers instead of going through memory between
    /// two AES calls.
    #[inline]
    pub(super) fn run<S: Copy>(
        &self,
        rounds: u8,
        first: u128,
        state: S,
        next: impl FnMut(u8, u128, S) -> (u128, S),
    ) -> S {
        #[cfg(target_arch = "x86_64")]
        if let Some(keys) = &self.ni {
            // SAFETY: `ni` is only Some when the processor has AES-NI
            // (checked in `RoundKeys::aes128` / `aes256`).
            return unsafe { ni::run(keys, rounds, first, state, next) };
        }
        self.run_soft(rounds, first, state, next)
    }

    /// [`AesChain::run`] through the `aes` crate, block by block.
    pub(super) fn run_soft<S: Copy>(
        &self,
        rounds: u8,
        first: u128,
        mut state: S,
        mut next: impl FnMut(u8, u128, S) -> (u128, S),
    ) -> S {
        let mut block = first;
        for i in 0..rounds {
            let mut bytes = GenericArray::from(block.to_le_bytes());
            match &self.soft {
                Soft::Aes128(c) => c.encrypt_block(&mut bytes),
                Soft::Aes256(c) => c.encrypt_block(&mut bytes),
            }
            (block, state) = next(i, u128::from_le_bytes(bytes.into()), state);
        }
        state
    }

    /// The expanded round keys when this processor has AES-NI (for the
    /// Feistel's wide batch path).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn ni_keys(&self) -> Option<&ni::RoundKeys> {
        self.ni.as_ref()
    }

    /// Whether chains run on AES-NI here (for tests and the bench).
    #[cfg(test)]
    pub(super) fn inline(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return self.ni.is_some();
        #[cfg(not(target_arch = "x86_64"))]
        false
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod ni {
    use std::arch::x86_64::{
        __m128i, _mm_aesenc_si128, _mm_aesenclast_si128, _mm_aeskeygenassist_si128,
        _mm_loadu_si128, _mm_shuffle_epi32, _mm_slli_si128, _mm_xor_si128,
    };

    /// An expanded key: 11 round keys (AES-128) or 15 (AES-256).
    pub(in super::super) struct RoundKeys {
        keys: [__m128i; 15],
        /// 10 or 14.
        rounds: usize,
    }

    impl Drop for RoundKeys {
        fn drop(&mut self) {
            // Wipe the schedule like the `aes` crate's `zeroize` does.
            for k in &mut self.keys {
                // SAFETY: writing a valid value through a unique reference.
                unsafe { std::ptr::write_volatile(k, std::mem::zeroed()) };
            }
        }
    }

    impl RoundKeys {
        /// The round keys in order: 11 (AES-128) or 15 (AES-256).
        pub(in super::super) fn keys(&self) -> &[__m128i] {
            &self.keys[..=self.rounds]
        }

        /// AES-128's schedule of `key`, or `None` without AES-NI.
        pub(super) fn aes128(key: &[u8; 16]) -> Option<Self> {
            if !std::arch::is_x86_feature_detected!("aes") {
                return None;
            }
            // SAFETY: AES-NI (and SSE2, part of x86-64) is present.
            Some(unsafe { expand128(key) })
        }

        /// AES-256's schedule of `key`, or `None` without AES-NI.
        pub(super) fn aes256(key: &[u8; 32]) -> Option<Self> {
            if !std::arch::is_x86_feature_detected!("aes") {
                return None;
            }
            // SAFETY: as above.
            Some(unsafe { expand256(key) })
        }
    }

    /// `k ^ (k << 32) ^ (k << 64) ^ (k << 96)`: each word XOR every word
    /// before it, the schedule's running XOR.
    #[inline]
    #[target_feature(enable = "aes")]
    unsafe fn prefix_xor(mut k: __m128i) -> __m128i {
        k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
        k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
        _mm_xor_si128(k, _mm_slli_si128::<4>(k))
    }

    macro_rules! next128 {
        ($keys:ident, $i:literal, $rcon:literal) => {
            let t = _mm_shuffle_epi32::<0xff>(_mm_aeskeygenassist_si128::<$rcon>($keys[$i - 1]));
            $keys[$i] = _mm_xor_si128(prefix_xor($keys[$i - 1]), t);
        };
    }

    #[target_feature(enable = "aes")]
    unsafe fn expand128(key: &[u8; 16]) -> RoundKeys {
        let mut keys = [_mm_loadu_si128(key.as_ptr().cast()); 15];
        next128!(keys, 1, 0x01);
        next128!(keys, 2, 0x02);
        next128!(keys, 3, 0x04);
        next128!(keys, 4, 0x08);
        next128!(keys, 5, 0x10);
        next128!(keys, 6, 0x20);
        next128!(keys, 7, 0x40);
        next128!(keys, 8, 0x80);
        next128!(keys, 9, 0x1b);
        next128!(keys, 10, 0x36);
        RoundKeys { keys, rounds: 10 }
    }

    macro_rules! next256 {
        // An even round key: from the two before, with the round constant.
        (even $keys:ident, $i:literal, $rcon:literal) => {
            let t = _mm_shuffle_epi32::<0xff>(_mm_aeskeygenassist_si128::<$rcon>($keys[$i - 1]));
            $keys[$i] = _mm_xor_si128(prefix_xor($keys[$i - 2]), t);
        };
        // An odd one: SubWord of the last word, no rotation or constant.
        (odd $keys:ident, $i:literal) => {
            let t = _mm_shuffle_epi32::<0xaa>(_mm_aeskeygenassist_si128::<0>($keys[$i - 1]));
            $keys[$i] = _mm_xor_si128(prefix_xor($keys[$i - 2]), t);
        };
    }

    #[target_feature(enable = "aes")]
    unsafe fn expand256(key: &[u8; 32]) -> RoundKeys {
        let lo = _mm_loadu_si128(key.as_ptr().cast());
        let mut keys = [lo; 15];
        keys[1] = _mm_loadu_si128(key[16..].as_ptr().cast());
        next256!(even keys, 2, 0x01);
        next256!(odd keys, 3);
        next256!(even keys, 4, 0x02);
        next256!(odd keys, 5);
        next256!(even keys, 6, 0x04);
        next256!(odd keys, 7);
        next256!(even keys, 8, 0x08);
        next256!(odd keys, 9);
        next256!(even keys, 10, 0x10);
        next256!(odd keys, 11);
        next256!(even keys, 12, 0x20);
        next256!(odd keys, 13);
        next256!(even keys, 14, 0x40);
        RoundKeys { keys, rounds: 14 }
    }

    /// See [`super::AesChain::run`]: the key size picks a loop whose
    /// rounds are unrolled.
    ///
    /// # Safety
    /// The processor must have AES-NI.
    #[target_feature(enable = "aes")]
    pub(super) unsafe fn run<S: Copy>(
        keys: &RoundKeys,
        rounds: u8,
        first: u128,
        state: S,
        next: impl FnMut(u8, u128, S) -> (u128, S),
    ) -> S {
        if keys.rounds == 10 {
            chain::<10, S>(&keys.keys, rounds, first, state, next)
        } else {
            chain::<14, S>(&keys.keys, rounds, first, state, next)
        }
    }

    /// The chain under an `NR`-round AES (10: AES-128, 14: AES-256).
    ///
    /// # Safety
    /// The processor must have AES-NI.
    #[inline]
    #[target_feature(enable = "aes")]
    unsafe fn chain<const NR: usize, S: Copy>(
        k: &[__m128i; 15],
        rounds: u8,
        first: u128,
        mut state: S,
        mut next: impl FnMut(u8, u128, S) -> (u128, S),
    ) -> S {
        let mut block = first;
        for i in 0..rounds {
            // A u128 and an __m128i are both 16 bytes, byte 0 lowest.
            let mut b = std::mem::transmute::<u128, __m128i>(block);
            b = _mm_xor_si128(b, k[0]);
            for key in &k[1..NR] {
                b = _mm_aesenc_si128(b, *key);
            }
            b = _mm_aesenclast_si128(b, k[NR]);
            (block, state) = next(i, std::mem::transmute::<__m128i, u128>(b), state);
        }
        state
    }
}
