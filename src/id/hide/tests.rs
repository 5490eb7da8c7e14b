//! Tests of the hiders: FF1 against NIST's samples and the `fpe` crate,
//! the Feistel's known answers, bijection on whole small domains,
//! rotation without collisions, and volume hidden (chi-square).

use super::aes_chain::AesChain;
use super::ff1::{aes256, BlockCipher, Ff1Decimal, Modulus};
use super::keys::hkdf_sha256_32;
use super::{
    DecimalHider, HideError, HideKey, IntHider, KeyVersion, SnowflakeHider, SnowflakeHiding,
};
use crate::id::layout::{Layout, LayoutSpec, DEFAULT_EPOCH_MS};
use aes::cipher::{generic_array::GenericArray, KeyInit};
use aes::{Aes128, Aes192};
use std::collections::HashSet;

/// The key of NIST's FF1 samples (its first 16 / 24 / 32 bytes).
const NIST_KEY: [u8; 32] = [
    0x2B, 0x7E, 0x15, 0x16, 0x28, 0xAE, 0xD2, 0xA6, 0xAB, 0xF7, 0x15, 0x88, 0x09, 0xCF, 0x4F, 0x3C,
    0xEF, 0x43, 0x59, 0xD8, 0xD5, 0x80, 0xAA, 0x4F, 0x7F, 0x03, 0x6D, 0x6F, 0x04, 0xFC, 0x6A, 0x94,
];
/// The tweak of samples 2, 5 and 8 ("9876543210" in ASCII).
const NIST_TWEAK: &[u8] = b"9876543210";

fn key(version: KeyVersion, seed: u8) -> HideKey {
    HideKey::new(version, [seed; 32])
}

fn check_ff1<C: BlockCipher>(cipher: C, tweak: &[u8], plain: u64, expected: u64) {
    let ff1 = Ff1Decimal::new(cipher, 10, tweak);
    assert_eq!(ff1.halves(), (5, 5));
    assert_eq!(ff1.encrypt(plain), expected);
    assert_eq!(ff1.decrypt(expected), plain);
}

/// NIST's FF1 examples (Computer Security Resource Center, "FF1samples.pdf",
/// the examples for SP 800-38G): every radix-10 sample, 1, 2 (AES-128),
/// 4, 5 (AES-192), 7, 8 (AES-256). Samples 3, 6 and 9 are radix 36.
#[test]
fn ff1_matches_nist_samples() {
    let aes128 = || Aes128::new(GenericArray::from_slice(&NIST_KEY[..16]));
    let aes192 = || Aes192::new(GenericArray::from_slice(&NIST_KEY[..24]));
    check_ff1(aes128(), &[], 123_456_789, 2_433_477_484);
    check_ff1(aes128(), NIST_TWEAK, 123_456_789, 6_124_200_773);
    check_ff1(aes192(), &[], 123_456_789, 2_830_668_132);
    check_ff1(aes192(), NIST_TWEAK, 123_456_789, 2_496_655_549);
    check_ff1(aes256(&NIST_KEY), &[], 123_456_789, 6_657_667_009);
    check_ff1(aes256(&NIST_KEY), NIST_TWEAK, 123_456_789, 1_001_623_463);
}

/// The `fpe` crate's FF1 on `n` digits of `x`, as a number.
fn fpe_encrypt(key: &[u8; 32], tweak: &[u8], n: u32, x: u64) -> u64 {
    use fpe::ff1::{FlexibleNumeralString, FF1};
    let ff1 = FF1::<aes::Aes256>::new(key, 10).expect("radix 10 is valid");
    let digits: Vec<u16> = (0..n)
        .rev()
        .map(|i| ((x / 10u64.pow(i)) % 10) as u16)
        .collect();
    let out: Vec<u16> = ff1
        .encrypt(tweak, &FlexibleNumeralString::from(digits))
        .expect("fpe encrypts valid input")
        .into();
    out.iter().fold(0, |acc, d| acc * 10 + u64::from(*d))
}

/// Differential test against the reference implementation: every width
/// the hiders use (6 to 18 digits, 19 too), with and without a tweak, on
/// random inputs. 100,000 inputs in total; fixed seed.
#[test]
fn ff1_matches_the_fpe_crate_on_random_inputs() {
    let mut rng = fastrand::Rng::with_seed(23);
    let mut key = [0u8; 32];
    rng.fill(&mut key);
    let mut checked = 0;
    for n in 6..=19u32 {
        for tweak in [&[][..], NIST_TWEAK, &[7u8; 40][..]] {
            let ff1 = Ff1Decimal::new(aes256(&key), n, tweak);
            for _ in 0..2_381 {
                let x = rng.u64(..10u64.pow(n));
                let shown = ff1.encrypt(x);
                assert_eq!(shown, fpe_encrypt(&key, tweak, n, x), "n {n} x {x}");
                assert_eq!(ff1.decrypt(shown), x);
                checked += 1;
            }
        }
    }
    assert!(checked >= 100_000);
}

/// The inline AES-NI chain encrypts every block exactly as the `aes`
/// crate does, for AES-128 and AES-256 under random keys, over chains of
/// ten dependent blocks; on a processor with AES-NI the inline path is
/// the one taken (so this compares the two, not the crate with itself).
#[test]
fn the_inline_aes_chain_matches_the_aes_crate() {
    let mut rng = fastrand::Rng::with_seed(0xAE5);
    #[cfg(target_arch = "x86_64")]
    let has_ni = std::arch::is_x86_feature_detected!("aes");
    #[cfg(not(target_arch = "x86_64"))]
    let has_ni = false;
    for round in 0..200 {
        let mut k32 = [0u8; 32];
        rng.fill(&mut k32);
        let k16: [u8; 16] = std::array::from_fn(|i| k32[i]);
        let chain = if round % 2 == 0 {
            AesChain::aes128(&k16)
        } else {
            AesChain::aes256(&k32)
        };
        assert_eq!(chain.inline(), has_ni);
        let first = u128::from(rng.u64(..)) << 64 | u128::from(rng.u64(..));
        let (mut inline, mut soft) = (Vec::new(), Vec::new());
        // Each next block depends on the last output, as in FF1.
        // The state counts the rounds and sums their outputs' low bits.
        let inline_state = chain.run(10, first, (0u32, 0u64), |i, r, (n, sum)| {
            inline.push(r);
            (
                r.rotate_left(u32::from(i) + 1),
                (n + 1, sum.wrapping_add(r as u64)),
            )
        });
        let soft_state = chain.run_soft(10, first, (0u32, 0u64), |i, r, (n, sum)| {
            soft.push(r);
            (
                r.rotate_left(u32::from(i) + 1),
                (n + 1, sum.wrapping_add(r as u64)),
            )
        });
        assert_eq!(inline.len(), 10);
        assert_eq!(inline, soft, "key {k32:02x?}");
        assert_eq!(inline_state, soft_state);
        assert_eq!(inline_state.0, 10);
    }
}

/// FF1's single path through the inline AES chain (what `DecimalHider`
/// uses) gives NIST's radix-10 samples for AES-128 and AES-256, and the
/// `fpe` crate's output on random inputs of every width 6 to 19.
#[test]
fn ff1_through_the_aes_chain_matches_nist_and_the_fpe_crate() {
    let k16: [u8; 16] = std::array::from_fn(|i| NIST_KEY[i]);
    let samples = [
        (&[][..], 2_433_477_484, 6_657_667_009),
        (NIST_TWEAK, 6_124_200_773, 1_001_623_463),
    ];
    for (tweak, aes128_out, aes256_out) in samples {
        let aes128 = Aes128::new(GenericArray::from_slice(&k16));
        let ff1 = Ff1Decimal::new(aes128, 10, tweak).with_chain(AesChain::aes128(&k16));
        assert_eq!(ff1.encrypt(123_456_789), aes128_out);
        assert_eq!(ff1.decrypt(aes128_out), 123_456_789);
        let ff1 =
            Ff1Decimal::new(aes256(&NIST_KEY), 10, tweak).with_chain(AesChain::aes256(&NIST_KEY));
        assert_eq!(ff1.encrypt(123_456_789), aes256_out);
        assert_eq!(ff1.decrypt(aes256_out), 123_456_789);
    }
    let mut rng = fastrand::Rng::with_seed(38);
    let mut key = [0u8; 32];
    rng.fill(&mut key);
    for n in 6..=19u32 {
        for tweak in [&[][..], NIST_TWEAK] {
            let ff1 = Ff1Decimal::new(aes256(&key), n, tweak).with_chain(AesChain::aes256(&key));
            for _ in 0..300 {
                let x = rng.u64(..10u64.pow(n));
                let shown = ff1.encrypt(x);
                assert_eq!(shown, fpe_encrypt(&key, tweak, n, x), "n {n} x {x}");
                assert_eq!(ff1.decrypt(shown), x);
            }
        }
    }
}

/// RFC 5869 test case 1: the first 32 bytes of its OKM.
#[test]
fn hkdf_matches_rfc5869() {
    let salt: Vec<u8> = (0..=0x0c).collect();
    let info: Vec<u8> = (0xf0..=0xf9).collect();
    let okm = hkdf_sha256_32(&salt, &[0x0b; 22], &info);
    let expected = "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf";
    let hex: String = okm.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, expected);
}

#[test]
fn a_key_prints_its_version_only() {
    let key = HideKey::new(3, [0xAB; 32]);
    assert_eq!(format!("{key:?}"), "HideKey { version: 3, .. }");
    assert_eq!(format!("{key:#?}").matches("171").count(), 0);
}

fn twitter() -> Layout {
    layout(41, 5, 5, 12)
}

fn layout(time: u8, dc: u8, worker: u8, seq: u8) -> Layout {
    LayoutSpec {
        epoch_ms: DEFAULT_EPOCH_MS,
        time_unit_ms: 1,
        time_bits: time,
        datacenter_bits: dc,
        worker_bits: worker,
        sequence_bits: seq,
    }
    .validate(DEFAULT_EPOCH_MS + 1)
    .expect("a valid layout")
}

/// Pinned outputs: a change to FF1's use, the Feistel, the key derivation
/// or where the version goes changes these, and would make every hidden
/// ID already issued unrevealable. Change them only with a new format.
#[test]
fn known_answers_stay_fixed() {
    let k = key(1, 42);
    let decimal = DecimalHider::new(&[&k], 1, 12).unwrap();
    let int = IntHider::new(&[&k], 1, 2, 61).unwrap();
    let sortable = SnowflakeHider::new(&[&k], 1, &twitter(), SnowflakeHiding::Sortable, 2).unwrap();
    let opaque = SnowflakeHider::new(&[&k], 1, &twitter(), SnowflakeHiding::Opaque, 2).unwrap();
    let got = [
        decimal.hide(0).unwrap(),
        decimal.hide(12_345).unwrap(),
        int.hide(0).unwrap(),
        int.hide(12_345).unwrap(),
        sortable.hide(0).unwrap(),
        sortable.hide(12_345 << 20 | 7).unwrap(),
        opaque.hide(0).unwrap(),
        opaque.hide(12_345).unwrap(),
    ];
    let pinned = [
        141_408_178_796,
        115_948_436_039,
        2_547_121_320_350_227_555,
        2_852_975_014_721_662_576,
        1_296_844,
        51_780_473_385,
        2_547_121_320_350_227_555,
        2_852_975_014_721_662_576,
    ];
    assert_eq!(got, pinned);
    // The version is where the docs say: leading digit, top bits, and
    // between time and the permuted bits for sortable.
    assert_eq!(got[0] / 100_000_000_000, 1);
    assert_eq!(got[2] >> 61, 1);
    assert_eq!((got[5] >> 22, (got[5] >> 20) & 3), (12_345, 1));
}

/// Every value of a 7-digit field (10^6 internal values): outputs in
/// range, all distinct, and revealed back.
#[test]
fn decimal_hiding_is_a_bijection_of_its_whole_domain() {
    let k = key(4, 1);
    let hider = DecimalHider::new(&[&k], 4, 7).unwrap();
    assert_eq!(hider.capacity(), 1_000_000);
    let mut seen = vec![false; 1_000_000];
    for x in 0..hider.capacity() {
        let shown = hider.hide(x).unwrap();
        assert_eq!(shown / 1_000_000, 4, "version digit of {x}");
        let slot = &mut seen[(shown % 1_000_000) as usize];
        assert!(!*slot, "{x} hides to {shown}, already issued");
        *slot = true;
        assert_eq!(hider.reveal(shown).unwrap(), (4, x));
    }
    assert!(matches!(
        hider.hide(1_000_000),
        Err(HideError::OutOfDomain { .. })
    ));
}

/// Checks that `hide` maps `0..2^bits` one-to-one into values whose
/// masked part is below `2^bits`, and that reveal undoes it.
fn assert_bijection(
    bits: u32,
    hide: impl Fn(u64) -> u64,
    reveal: impl Fn(u64) -> (KeyVersion, u64),
    part: impl Fn(u64) -> u64,
) {
    let mut seen = vec![false; 1 << bits];
    for x in 0..1u64 << bits {
        let shown = hide(x);
        let slot = seen
            .get_mut(part(shown) as usize)
            .unwrap_or_else(|| panic!("{x} hides to {shown}, outside the domain"));
        assert!(!*slot, "{x} hides to {shown}, already issued");
        *slot = true;
        assert_eq!(reveal(shown).1, x);
    }
}

#[test]
fn int_hiding_is_a_bijection_of_a_2_pow_20_domain() {
    let k = key(2, 5);
    let hider = IntHider::new(&[&k], 2, 3, 20).unwrap();
    assert_eq!(hider.capacity(), 1 << 20);
    assert_bijection(
        20,
        |x| hider.hide(x).unwrap(),
        |s| hider.reveal(s).unwrap(),
        |s| {
            assert_eq!(s >> 20, 2, "version bits of {s}");
            s & ((1 << 20) - 1)
        },
    );
    assert!(matches!(
        hider.hide(1 << 20),
        Err(HideError::OutOfDomain { .. })
    ));
}

/// Sortable over a layout whose internal IDs span 2^20: 4 time units of
/// 2^18 node-and-sequence values; each unit is permuted on its own and
/// keeps its time bits.
#[test]
fn snowflake_hiding_is_a_bijection_of_a_2_pow_20_domain() {
    // 2 time bits are too few for a real layout, so use 30 time bits and
    // only the IDs of the first 4 time units.
    let wide = layout(30, 5, 5, 9);
    let k = key(1, 6);
    let sortable = SnowflakeHider::new(&[&k], 1, &wide, SnowflakeHiding::Sortable, 1).unwrap();
    assert_eq!(sortable.internal_spec().sequence_bits, 8);
    assert_bijection(
        20,
        |x| sortable.hide(x).unwrap(),
        |s| sortable.reveal(s).unwrap(),
        |s| {
            assert_eq!((s >> 18) & 1, 1, "version bit of {s}");
            ((s >> 19) << 18) | (s & ((1 << 18) - 1))
        },
    );
    // Opaque: a layout is at least 31 bits wide, so its whole domain is
    // too big to walk in a test (the Feistel under it is IntHider's, walked
    // above); take its first 2^16 internal IDs: distinct, inside the
    // layout's width, the version on top, revealed back.
    let js53 = layout(41, 0, 4, 8);
    let opaque = SnowflakeHider::new(&[&k], 1, &js53, SnowflakeHiding::Opaque, 1).unwrap();
    assert_eq!(opaque.max_internal(), (1 << 52) - 1);
    let mut seen = HashSet::with_capacity(1 << 16);
    for x in 0..1u64 << 16 {
        let shown = opaque.hide(x).unwrap();
        assert_eq!(shown >> 52, 1, "version bit of {shown}");
        assert!(seen.insert(shown), "{x} hides to {shown}, already issued");
        assert_eq!(opaque.reveal(shown).unwrap(), (1, x));
    }
}

/// The Feistel on every width from 2 to 16 bits, odd widths split
/// unbalanced: a permutation of exactly `0..2^bits` each time.
#[test]
fn the_feistel_permutes_every_small_width_exactly() {
    use super::feistel::Feistel;
    for bits in 2..=16u32 {
        let feistel = Feistel::new(&[bits as u8; 32], bits);
        let mut seen = vec![false; 1 << bits];
        for x in 0..1u64 << bits {
            let y = feistel.encrypt(x, 99);
            assert!(y < 1 << bits, "{bits} bits: {x} -> {y}");
            assert!(!seen[y as usize], "{bits} bits: {y} twice");
            seen[y as usize] = true;
            assert_eq!(feistel.decrypt(y, 99), x);
        }
    }
}

/// Every Feistel path gives the network's definition, written out here
/// with the `aes` crate block by block: one value in 128-bit registers
/// (`one`, where the processor has AES-NI), one value through the AES
/// chain (what a node without AES-NI, or off x86-64, computes), and both
/// batch paths (the VAES registers where the processor has them, the
/// `aes` crate's eight blocks otherwise), on every width from 2 to 63
/// bits, every batch length up to 16, values and tweaks at their edges
/// (a tweak's top bit set: a sortable snowflake's time unit) and random
/// ones; each output reveals back.
#[test]
fn every_feistel_path_equals_the_definition() {
    use super::feistel::{mask, Feistel, LANES};
    use aes::cipher::BlockEncrypt;
    fn definition(key: &[u8; 32], bits: u32, x: u64, tweak: u64) -> u64 {
        let aes = Aes128::new(GenericArray::from_slice(&key[..16]));
        let (u, v) = (bits / 2, bits - bits / 2);
        let (mut a, mut b) = (x >> v, x & mask(v));
        for i in 0..10u8 {
            // tweak | half (32 bits) | round | width, little-endian.
            let mut block = [0u8; 16];
            block[..8].copy_from_slice(&tweak.to_le_bytes());
            block[8..12].copy_from_slice(&(b as u32).to_le_bytes());
            block[12] = i;
            block[13] = bits as u8;
            let mut block = GenericArray::from(block);
            aes.encrypt_block(&mut block);
            let out = u64::from_le_bytes(std::array::from_fn(|k| block[k]));
            let c = a ^ (out & mask(if i % 2 == 0 { u } else { v }));
            (a, b) = (b, c);
        }
        (a << v) | b
    }
    let mut rng = fastrand::Rng::with_seed(2063);
    let wide_here = Feistel::new(&[1; 32], 20).wide();
    eprintln!("the wide (VAES) batch path runs on this processor: {wide_here}");
    let tweak_edges = [
        0,
        1,
        u64::MAX,
        1 << 63,
        (1 << 63) - 1,
        0xFF00_0000_0000_00FF,
    ];
    for bits in 2..=63u32 {
        let key: [u8; 32] = std::array::from_fn(|_| rng.u8(..));
        let (max, v) = (mask(bits), bits - bits / 2);
        let value_edges = [
            0,
            1,
            max,
            max - 1,
            mask(v),
            (mask(v) + 1) & max,
            max ^ mask(v),
            max >> 1,
        ];
        for feistel in [
            Feistel::new(&key, bits),
            Feistel::new(&key, bits).without_wide(),
        ] {
            for n in 0..=LANES {
                let xs: Vec<u64> = (0..n)
                    .map(|k| match k % 3 {
                        0 => value_edges[(k + n) % value_edges.len()],
                        _ => rng.u64(..) & max,
                    })
                    .collect();
                let tweaks: Vec<u64> = (0..n)
                    .map(|k| match k % 2 {
                        0 => tweak_edges[(k + bits as usize) % tweak_edges.len()],
                        _ => rng.u64(..),
                    })
                    .collect();
                let expected: Vec<u64> = xs
                    .iter()
                    .zip(&tweaks)
                    .map(|(&x, &t)| definition(&key, bits, x, t))
                    .collect();
                for ((&x, &t), &want) in xs.iter().zip(&tweaks).zip(&expected) {
                    assert_eq!(
                        feistel.encrypt(x, t),
                        want,
                        "one: {bits} bits x={x} t={t:#x}"
                    );
                    let chain = feistel.encrypt_chain(x, t);
                    assert_eq!(chain, want, "chain: {bits} bits x={x} t={t:#x}");
                    assert_eq!(feistel.decrypt(want, t), x, "decrypt: {bits} bits");
                }
                let mut got = xs.clone();
                feistel.encrypt_lanes(&mut got, &tweaks);
                let wide = feistel.wide();
                assert_eq!(
                    got, expected,
                    "lanes: {bits} bits, {n} lanes, wide path {wide}"
                );
            }
        }
    }
}

/// 63-bit domains, sampled: one million random internal values (and
/// the first and last 1,000) hide to distinct values of 63 bits or
/// fewer, revealed back. The bench (`benches/hide.rs`) repeats it with
/// ten million in a release build.
#[test]
fn sixty_three_bit_hiding_is_one_to_one_on_a_million_samples() {
    let k = key(3, 8);
    let hider = IntHider::new(&[&k], 3, 2, 61).unwrap();
    let mut rng = fastrand::Rng::with_seed(63);
    let max = hider.capacity() - 1;
    let inputs: HashSet<u64> = (0..1_000_000)
        .map(|_| rng.u64(..=max))
        .chain(0..1_000)
        .chain(max - 999..=max)
        .collect();
    let mut outputs = HashSet::with_capacity(inputs.len());
    for &x in &inputs {
        let shown = hider.hide(x).unwrap();
        assert!(shown < 1 << 63 && shown >> 61 == 3, "{x} -> {shown}");
        assert!(
            outputs.insert(shown),
            "{x} hides to {shown}, already issued"
        );
        assert_eq!(hider.reveal(shown).unwrap(), (3, x));
    }
    assert_eq!(outputs.len(), inputs.len());
}

type Hide<'a> = Box<dyn Fn(u64) -> Result<u64, HideError> + 'a>;
type Reveal<'a> = Box<dyn Fn(u64) -> Result<(KeyVersion, u64), HideError> + 'a>;

/// One kind of hider built three ways: hiding with version 0 (key 0
/// only), hiding with version 1 and revealing both, and knowing version 1
/// only.
struct Rotation<'a> {
    name: &'static str,
    old: Hide<'a>,
    new: Hide<'a>,
    reveal_both: Reveal<'a>,
    reveal_new_only: Reveal<'a>,
    inputs: Vec<u64>,
}

fn rotations<'a>(k0: &'a HideKey, k1: &'a HideKey) -> Vec<Rotation<'a>> {
    let twitter = twitter();
    let decimal = |keys: &[&HideKey], v| DecimalHider::new(keys, v, 8).unwrap();
    let int = |keys: &[&HideKey], v| IntHider::new(keys, v, 2, 30).unwrap();
    let snow =
        |keys: &[&HideKey], v, hiding| SnowflakeHider::new(keys, v, &twitter, hiding, 2).unwrap();
    // Snowflake inputs: 20,000 IDs over 5 time units of the internal
    // layout (20 bits below the time).
    let snowflakes: Vec<u64> = (0..20_000u64).map(|x| ((x % 5) << 20) | (x / 5)).collect();
    macro_rules! rotation {
        ($name:expr, $make:expr, $inputs:expr) => {{
            let (old, both, only) = ($make(&[k0], 0), $make(&[k0, k1], 1), $make(&[k1], 1));
            let both2 = $make(&[k0, k1], 1);
            Rotation {
                name: $name,
                old: Box::new(move |x| old.hide(x)),
                new: Box::new(move |x| both.hide(x)),
                reveal_both: Box::new(move |s| both2.reveal(s)),
                reveal_new_only: Box::new(move |s| only.reveal(s)),
                inputs: $inputs,
            }
        }};
    }
    vec![
        rotation!("decimal", decimal, (0..20_000).collect()),
        rotation!("int", int, (0..20_000).collect()),
        rotation!(
            "sortable",
            |k, v| snow(k, v, SnowflakeHiding::Sortable),
            snowflakes.clone()
        ),
        rotation!(
            "opaque",
            |k, v| snow(k, v, SnowflakeHiding::Opaque),
            snowflakes
        ),
    ]
}

/// Rotation: the same internal values hidden under version 0 and under
/// version 1 never give the same ID, with different key material and
/// even with the same material under both versions (only the version
/// field tells them apart). A hider that knows both versions reveals
/// either one with its version; one that lost version 0 says so.
#[test]
fn rotated_versions_never_collide_and_old_ids_still_reveal() {
    let k0 = key(0, 10);
    for (k1, material) in [(key(1, 11), "different"), (key(1, 10), "the same")] {
        for r in rotations(&k0, &k1) {
            let old: Vec<u64> = r.inputs.iter().map(|&x| (r.old)(x).unwrap()).collect();
            let new: Vec<u64> = r.inputs.iter().map(|&x| (r.new)(x).unwrap()).collect();
            let old_set: HashSet<u64> = old.iter().copied().collect();
            assert_eq!(
                old_set.len(),
                old.len(),
                "{}: repeats under one key",
                r.name
            );
            for (x, shown) in r.inputs.iter().zip(&new) {
                assert!(
                    !old_set.contains(shown),
                    "{} with {material} material: {x} hides to {shown}, an ID version 0 gave out",
                    r.name
                );
            }
            for (x, shown) in r.inputs.iter().zip(&new) {
                assert_eq!((r.reveal_both)(*shown).unwrap(), (1, *x), "{}", r.name);
            }
            for (x, shown) in r.inputs.iter().zip(&old) {
                assert_eq!((r.reveal_both)(*shown).unwrap(), (0, *x), "{}", r.name);
                assert_eq!(
                    (r.reveal_new_only)(*shown),
                    Err(HideError::UnknownVersion { version: 0 }),
                    "{}",
                    r.name
                );
            }
        }
    }
}

/// Buckets for the chi-square test, and the statistic's critical value
/// for 99 degrees of freedom at a significance of 0.001.
const BUCKETS: u64 = 100;
const CHI2_CRITICAL_99_DF_0_001: f64 = 148.23;

/// The chi-square statistic of `values` (each below `domain`) against
/// the uniform distribution over [`BUCKETS`] equal buckets.
fn chi_square(values: &[u64], domain: u64) -> f64 {
    let mut counts = [0u64; BUCKETS as usize];
    for &v in values {
        counts[(u128::from(v) * u128::from(BUCKETS) / u128::from(domain)) as usize] += 1;
    }
    let expected = values.len() as f64 / BUCKETS as f64;
    counts
        .iter()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum()
}

/// Differences `shown[i + gap] - shown[i]` modulo `domain` (the permuted
/// part) for the first 10^5 `i`.
fn differences(shown: &[u64], gap: usize, domain: u64) -> Vec<u64> {
    shown
        .windows(gap + 1)
        .take(100_000)
        .map(|w| (w[gap] % domain + domain - w[0] % domain) % domain)
        .collect()
}

/// One variant for the chi-square test: its name, how it hides, the
/// internal values it hides in order, and the permuted domain.
type Case<'a> = (&'static str, &'a dyn Fn(u64) -> u64, &'a [u64], u64);

/// Volume hidden: the difference between two hidden IDs says nothing
/// about how many were issued between them. For each variant, 10^5
/// differences between IDs 1, 1,000 and 1,024 apart (successive IDs of one
/// node for snowflakes, where 1,024 apart is the same sequence value one
/// time unit later), bucketed, pass a chi-square test against uniform
/// at a significance of 0.001 (fixed key and inputs, so it cannot flake);
/// the plain values fail the same test by far.
#[test]
fn differences_of_hidden_ids_are_uniform_and_of_plain_ids_are_not() {
    let k = key(1, 77);
    let decimal = DecimalHider::new(&[&k], 1, 10).unwrap();
    let int = IntHider::new(&[&k], 1, 2, 61).unwrap();
    let wide = twitter();
    let sortable = SnowflakeHider::new(&[&k], 1, &wide, SnowflakeHiding::Sortable, 2).unwrap();
    let opaque = SnowflakeHider::new(&[&k], 1, &wide, SnowflakeHiding::Opaque, 2).unwrap();
    let counters: Vec<u64> = (5_000_000..5_101_001).collect();
    // One node (datacenter 3, worker 7) issuing every sequence value of
    // the internal layout (10 bits) in time units from 1,000 on.
    let node = (3 << 15) | (7 << 10);
    let snowflakes: Vec<u64> = (0..101_001u64)
        .map(|i| ((1_000 + (i >> 10)) << 20) | node | (i & 1023))
        .collect();
    let cases: [Case; 4] = [
        (
            "decimal",
            &|x| decimal.hide(x).unwrap(),
            &counters,
            decimal.capacity(),
        ),
        ("int", &|x| int.hide(x).unwrap(), &counters, int.capacity()),
        (
            "sortable",
            &|x| sortable.hide(x).unwrap(),
            &snowflakes,
            1 << 20,
        ),
        ("opaque", &|x| opaque.hide(x).unwrap(), &snowflakes, 1 << 61),
    ];
    for (name, hide, inputs, domain) in cases {
        let shown: Vec<u64> = inputs.iter().map(|&x| hide(x)).collect();
        for gap in [1, 1_000, 1_024] {
            let hidden = chi_square(&differences(&shown, gap, domain), domain);
            assert!(
                hidden < CHI2_CRITICAL_99_DF_0_001,
                "{name}, gap {gap}: chi-square {hidden:.1} says the differences are not uniform"
            );
            let plain = chi_square(&differences(inputs, gap, domain), domain);
            assert!(
                plain > 10.0 * CHI2_CRITICAL_99_DF_0_001,
                "{name}, gap {gap}: the plain values pass ({plain:.1}), so the test cannot bite"
            );
        }
    }
}

/// Bad set-ups and bad values get a typed error that says what to do,
/// never a panic or a value outside the domain.
#[test]
fn bad_widths_versions_and_values_are_refused_with_what_to_do() {
    let k = key(2, 1);
    let keys = [&k];
    let wide = twitter();
    let err = |r: Result<DecimalHider, HideError>| r.err().expect("refused");
    assert!(matches!(
        err(DecimalHider::new(&keys, 2, 6)),
        HideError::DomainTooSmall { .. }
    ));
    assert!(err(DecimalHider::new(&keys, 2, 6))
        .to_string()
        .contains("at least 7 digits"));
    assert!(matches!(
        err(DecimalHider::new(&keys, 2, 20)),
        HideError::BadWidth { .. }
    ));
    assert_eq!(
        err(DecimalHider::new(&[&key(10, 1)], 10, 8)),
        HideError::VersionOutOfRange {
            version: 10,
            max: 9
        }
    );
    assert_eq!(
        err(DecimalHider::new(&[&k, &key(2, 3)], 2, 8)),
        HideError::DuplicateVersion { version: 2 }
    );
    assert_eq!(
        err(DecimalHider::new(&keys, 3, 8)),
        HideError::ActiveKeyMissing { version: 3 }
    );
    let int = |vb, db| IntHider::new(&keys, 2, vb, db).err().expect("refused");
    assert!(matches!(int(8, 56), HideError::BadWidth { .. }));
    assert!(matches!(int(2, 19), HideError::DomainTooSmall { .. }));
    assert!(matches!(int(0, 40), HideError::BadWidth { .. }));
    assert!(matches!(int(9, 40), HideError::BadWidth { .. }));
    assert_eq!(
        int(1, 40),
        HideError::VersionOutOfRange { version: 2, max: 1 }
    );
    let snow = |layout: &Layout, hiding, vb| {
        SnowflakeHider::new(&keys, 2, layout, hiding, vb)
            .err()
            .expect("refused")
    };
    // Sortable takes the version from the sequence: 8 sequence bits
    // cannot give 8, and js53's 12 bits below the time minus 5 leave 7.
    let js53 = layout(41, 0, 4, 8);
    assert!(matches!(
        snow(&js53, SnowflakeHiding::Sortable, 8),
        HideError::BadWidth { .. }
    ));
    assert!(matches!(
        snow(&js53, SnowflakeHiding::Sortable, 5),
        HideError::DomainTooSmall { .. }
    ));
    assert!(matches!(
        snow(&wide, SnowflakeHiding::Opaque, 9),
        HideError::BadWidth { .. }
    ));

    let decimal = DecimalHider::new(&keys, 2, 8).unwrap();
    assert_eq!(
        decimal.hide(10_000_000),
        Err(HideError::OutOfDomain {
            value: 10_000_000,
            max: 9_999_999
        })
    );
    assert_eq!(
        decimal.reveal(100_000_000),
        Err(HideError::NotHidden {
            value: 100_000_000,
            max: 99_999_999
        })
    );
    assert_eq!(
        decimal.reveal(30_000_000),
        Err(HideError::UnknownVersion { version: 3 })
    );
    let sortable = SnowflakeHider::new(&keys, 2, &wide, SnowflakeHiding::Sortable, 2).unwrap();
    assert_eq!(sortable.internal_spec().sequence_bits, 10);
    assert!(matches!(
        sortable.hide(1 << 61),
        Err(HideError::OutOfDomain { .. })
    ));
    assert!(matches!(
        sortable.reveal(1 << 63),
        Err(HideError::NotHidden { .. })
    ));
    assert!(matches!(
        sortable.reveal(0),
        Err(HideError::UnknownVersion { version: 0 })
    ));
    let opaque = SnowflakeHider::new(&keys, 2, &wide, SnowflakeHiding::Opaque, 2).unwrap();
    assert!(matches!(
        opaque.hide(1 << 61),
        Err(HideError::OutOfDomain { .. })
    ));
    // Opaque with 2 version bits: a quarter of twitter's 69 years.
    let years = |ms: u64| (ms - DEFAULT_EPOCH_MS) as f64 / 3.156e10;
    assert!(
        (years(opaque.end_ms()) - 17.4).abs() < 0.1,
        "{}",
        years(opaque.end_ms())
    );
    assert!(
        (years(sortable.end_ms()) - 69.7).abs() < 0.1,
        "{}",
        years(sortable.end_ms())
    );
}

/// The remainders FF1's rounds take without a division agree with `%` on
/// every modulus a half can have (10^3 to 10^10), at the edges and on
/// random values, for `rem`, `rem_wide` (up to 2^94 - 1), `add_rem` (y up
/// to 2^96 - 1), `sub_rem`, and their 64-bit forms `add_rem64` and
/// `sub_rem64` (by a constant for 10^3 to 10^9).
#[test]
fn the_division_free_remainders_are_exact() {
    let mut rng = fastrand::Rng::with_seed(96);
    for m in (3..=10).map(|k| 10u64.pow(k)) {
        let modulus = Modulus::new(m);
        let edges = [0, 1, m - 1, m, m + 1, 2 * m - 1, u64::MAX, u64::MAX - 1];
        for a in edges.into_iter().chain((0..20_000).map(|_| rng.u64(..))) {
            assert_eq!(modulus.rem(a), a % m, "{a} mod {m}");
        }
        // Dividends up to 2^94 (add_rem folds into below 2^67).
        let top = (1u128 << 94) - 1;
        let wide = [top, top - 1, 1 << 93, (1 << 67) - 1, u128::from(m) << 60];
        let randoms =
            (0..20_000).map(|_| (u128::from(rng.u64(..)) << 30) ^ u128::from(rng.u64(..)));
        for n in wide.into_iter().chain(randoms) {
            let n = n & top;
            assert_eq!(
                u128::from(modulus.rem_wide(n)),
                n % u128::from(m),
                "{n} mod {m}"
            );
        }
        let top = (1u128 << 96) - 1;
        let ys = [0, 1, top, top - 1, u128::from(u64::MAX), 1 << 64, 1 << 95];
        let randoms: Vec<u128> = (0..20_000)
            .map(|_| (u128::from(rng.u64(..)) << 32) | u128::from(rng.u32(..)))
            .collect();
        for y in ys.into_iter().chain(randoms) {
            for a in [0, m - 1, rng.u64(..m)] {
                let sum = (u128::from(a) + y) % u128::from(m);
                assert_eq!(
                    u128::from(modulus.add_rem(a, y)),
                    sum,
                    "({a} + {y}) mod {m}"
                );
                let y_mod = y % u128::from(m);
                let diff = (u128::from(a) + u128::from(m) - y_mod) % u128::from(m);
                assert_eq!(
                    u128::from(modulus.sub_rem(a, y)),
                    diff,
                    "({a} - {y}) mod {m}"
                );
                // The 64-bit forms, on the low 64 bits of y.
                let y64 = y as u64;
                let wide = u128::from(y64);
                let sum = (u128::from(a) + wide) % u128::from(m);
                assert_eq!(
                    u128::from(modulus.add_rem64(a, y64)),
                    sum,
                    "({a} + {y64}) mod {m}"
                );
                let diff = (u128::from(a) + u128::from(m) - wide % u128::from(m)) % u128::from(m);
                assert_eq!(
                    u128::from(modulus.sub_rem64(a, y64)),
                    diff,
                    "({a} - {y64}) mod {m}"
                );
            }
        }
    }
    // A modulus that is no power of ten takes the reciprocal in the
    // 64-bit forms too.
    let m = 999_983;
    let modulus = Modulus::new(m);
    let ys: Vec<u64> = (0..20_000).map(|_| rng.u64(..)).collect();
    for y in [0, 1, u64::MAX, u64::MAX - 1].into_iter().chain(ys) {
        let a = rng.u64(..m);
        assert_eq!(
            modulus.add_rem64(a, y),
            ((u128::from(a) + u128::from(y)) % u128::from(m)) as u64
        );
    }
}

/// Inputs for the batch test: every batch length from 0 to 35 (empty,
/// partial chunks, exactly 8 and 16, more than one chunk) at the domain's
/// edges, then 1,000 random values below `max`, all at most `max`.
fn batches(max: u64, rng: &mut fastrand::Rng) -> Vec<Vec<u64>> {
    let mut out: Vec<Vec<u64>> = (0..36u64)
        .map(|n| {
            (0..n)
                .map(|i| if i % 2 == 0 { i } else { max - i })
                .collect()
        })
        .collect();
    out.push((0..1_000).map(|_| rng.u64(..=max)).collect());
    out
}

/// A hider's batch form: hides a slice in place.
type HideAll = Box<dyn Fn(&mut [u64]) -> Result<(), HideError>>;

/// One hider seen two ways: one value at a time, and in place in a batch.
struct BatchCase {
    name: String,
    /// The largest value it hides.
    max: u64,
    one: Hide<'static>,
    all: HideAll,
}

/// A batch is hidden to exactly what one-by-one hiding gives, for every
/// variant (every decimal width, 7 to 19 digits, several integer widths,
/// both snowflake kinds, sortable inputs of many
/// time units in one batch), so a `GenIds` of many IDs and single calls
/// show one mapping; a batch with a value outside the domain is refused
/// and left unchanged.
#[test]
fn batch_hiding_equals_one_by_one_for_every_variant() {
    let (k0, k1) = (key(0, 11), key(1, 12));
    let keys = [&k0, &k1];
    let mut rng = fastrand::Rng::with_seed(8);
    let mut cases: Vec<BatchCase> = Vec::new();
    for digits in 7..=19 {
        let h = DecimalHider::new(&keys, 1, digits).unwrap();
        let max = h.capacity() - 1;
        let h = std::rc::Rc::new(h);
        let one = std::rc::Rc::clone(&h);
        let all = std::rc::Rc::clone(&h);
        assert_eq!(
            h.hide_many(&[0, max]).unwrap(),
            [h.hide(0).unwrap(), h.hide(max).unwrap()]
        );
        cases.push(BatchCase {
            name: format!("decimal {digits}"),
            max,
            one: Box::new(move |x| one.hide(x)),
            all: Box::new(move |v| all.hide_in_place(v)),
        });
    }
    for (version_bits, domain_bits) in [(1, 20), (2, 33), (2, 61), (8, 55)] {
        let h = std::rc::Rc::new(IntHider::new(&keys, 1, version_bits, domain_bits).unwrap());
        let max = h.capacity() - 1;
        let (one, all) = (std::rc::Rc::clone(&h), std::rc::Rc::clone(&h));
        assert_eq!(h.hide_many(&[max]).unwrap(), [h.hide(max).unwrap()]);
        cases.push(BatchCase {
            name: format!("int {version_bits}+{domain_bits}"),
            max,
            one: Box::new(move |x| one.hide(x)),
            all: Box::new(move |v| all.hide_in_place(v)),
        });
    }
    for (name, layout) in [("twitter", twitter()), ("odd", layout(30, 3, 4, 10))] {
        for hiding in [SnowflakeHiding::Sortable, SnowflakeHiding::Opaque] {
            let h = SnowflakeHider::new(&keys, 1, &layout, hiding, 2).unwrap();
            let h = std::rc::Rc::new(h);
            let max = h.max_internal();
            let (one, all) = (std::rc::Rc::clone(&h), std::rc::Rc::clone(&h));
            assert_eq!(h.hide_many(&[max]).unwrap(), [h.hide(max).unwrap()]);
            cases.push(BatchCase {
                name: format!("snowflake {name} {hiding:?}"),
                max,
                one: Box::new(move |x| one.hide(x)),
                all: Box::new(move |v| all.hide_in_place(v)),
            });
        }
    }
    // Every variant is checked and every failure named, not only the first.
    let mut failures = Vec::new();
    for BatchCase {
        name,
        max,
        one,
        all,
    } in &cases
    {
        for batch in batches(*max, &mut rng) {
            let expected: Vec<u64> = batch.iter().map(|&x| one(x).unwrap()).collect();
            let mut got = batch.clone();
            all(&mut got).unwrap();
            if got != expected {
                failures.push(format!(
                    "{name}: a batch of {} hid differently",
                    batch.len()
                ));
            }
        }
        let mut bad: Vec<u64> = (0..12).chain([max + 1]).collect();
        let before = bad.clone();
        let refused = all(&mut bad);
        let out_of_domain = HideError::OutOfDomain {
            value: max + 1,
            max: *max,
        };
        if refused != Err(out_of_domain) || bad != before {
            failures.push(format!(
                "{name}: {refused:?}, the batch changed: {}",
                bad != before
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
