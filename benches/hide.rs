//! Hiding volume: nanoseconds per hidden ID for each hider, on one
//! thread, against the plain (unhidden) baseline and the `fpe` crate's
//! general FF1, and per ID in batches of 1,000 (`batch_1000_*`, the
//! `hide_in_place` path a GenIds x1000 takes). Before the benches it checks, in this release build, that
//! ten million random 63-bit values hide to ten million distinct IDs and
//! reveal back (the debug unit test samples one million).
//!
//! The `floor_*` benches are what a single ID cannot go below without
//! changing the permutation: ten dependent AES blocks (AES-256 for FF1,
//! AES-128 for the Feistel), through the `aes` crate block by block and
//! with the AES-NI instructions inline (x86-64 with AES-NI only).
//!
//! `cargo bench --bench hide -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use idgen::id::hide::{DecimalHider, HideKey, IntHider, SnowflakeHider, SnowflakeHiding};
use idgen::id::{Preset, DEFAULT_EPOCH_MS};

/// Ten million random internal values of a 61-bit domain (2 version bits):
/// all hidden IDs distinct and revealed back. Panics otherwise.
fn check_ten_million_samples(hider: &IntHider) {
    let mut rng = fastrand::Rng::with_seed(10_000_000);
    let mut inputs: Vec<u64> = (0..10_000_000)
        .map(|_| rng.u64(..hider.capacity()))
        .collect();
    inputs.sort_unstable();
    inputs.dedup();
    let mut shown: Vec<u64> = inputs
        .iter()
        .map(|&x| {
            let s = hider.hide(x).expect("inside the domain");
            assert_eq!(hider.reveal(s).expect("revealed").1, x);
            s
        })
        .collect();
    shown.sort_unstable();
    shown.dedup();
    assert_eq!(shown.len(), inputs.len(), "two values hid to one ID");
    assert!(shown.iter().all(|&s| s < 1 << 63));
    eprintln!(
        "hide: {} distinct random 63-bit values hid to as many distinct IDs, all revealed back",
        inputs.len()
    );
}

fn bench(c: &mut Criterion) {
    let key = HideKey::new(1, [0x5A; 32]);
    let keys = [&key];
    let int = IntHider::new(&keys, 1, 2, 61).expect("int hider");
    check_ten_million_samples(&int);

    let layout = Preset::Twitter
        .spec(DEFAULT_EPOCH_MS)
        .validate(DEFAULT_EPOCH_MS + 1)
        .expect("layout");
    let sortable = SnowflakeHider::new(&keys, 1, &layout, SnowflakeHiding::Sortable, 2)
        .expect("sortable hider");
    let opaque =
        SnowflakeHider::new(&keys, 1, &layout, SnowflakeHiding::Opaque, 2).expect("opaque hider");
    let mut g = c.benchmark_group("hide");
    let mut x = 0u64;
    g.bench_function("plain_snowflake_compose", |b| {
        b.iter(|| {
            x = x.wrapping_add(1);
            layout.compose(black_box(x) >> 22, 0, x & 4095)
        })
    });
    for digits in [10u32, 12, 18, 19] {
        let hider = DecimalHider::new(&keys, 1, digits).expect("decimal hider");
        let capacity = hider.capacity();
        g.bench_function(format!("decimal_{digits}"), |b| {
            b.iter(|| {
                x = (x + 1) % capacity;
                hider.hide(black_box(x))
            })
        });
    }
    g.bench_function("int_63", |b| {
        b.iter(|| {
            x = (x + 1) & ((1 << 61) - 1);
            int.hide(black_box(x))
        })
    });
    let max = sortable.max_internal();
    g.bench_function("snowflake_sortable", |b| {
        b.iter(|| {
            x = (x + 1) & max;
            sortable.hide(black_box(x))
        })
    });
    g.bench_function("snowflake_opaque", |b| {
        b.iter(|| {
            x = (x + 1) & max;
            opaque.hide(black_box(x))
        })
    });
    batches(&mut g, &int, &sortable, &opaque);
    floors(&mut g);
    g.throughput(Throughput::Elements(1));
    // The general FF1 of the fpe crate on 11 digits (what decimal_12
    // permutes), for comparison: numeral strings, bignums, allocations.
    let fpe = fpe::ff1::FF1::<aes::Aes256>::new(&[0x5A; 32], 10).expect("fpe FF1");
    g.bench_function("fpe_ff1_11_digits", |b| {
        b.iter(|| {
            x = (x + 1) % 100_000_000_000;
            let digits: Vec<u16> = (0..11)
                .rev()
                .map(|i| ((x / 10u64.pow(i)) % 10) as u16)
                .collect();
            fpe.encrypt(&[], &fpe::ff1::FlexibleNumeralString::from(digits))
        })
    });
    g.finish();
}

/// Batches of 1,000 (a GenIds x1000), values side by side (sixteen on
/// the VAES path, else eight per AES call): time per ID with
/// `Throughput::Elements`.
fn batches(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    int: &IntHider,
    sortable: &SnowflakeHider,
    opaque: &SnowflakeHider,
) {
    let key = HideKey::new(1, [0x5A; 32]);
    let keys = [&key];
    let max = sortable.max_internal();
    let mut x = 0u64;
    let mut batch = vec![0u64; 1000];
    let mut next = |batch: &mut [u64], max: u64| {
        for v in batch.iter_mut() {
            x = x.wrapping_add(1);
            *v = x % max;
        }
    };
    g.throughput(Throughput::Elements(batch.len() as u64));
    let decimal = DecimalHider::new(&keys, 1, 12).expect("decimal hider");
    g.bench_function("batch_1000_decimal_12", |b| {
        b.iter(|| {
            next(&mut batch, decimal.capacity());
            decimal.hide_in_place(black_box(&mut batch))
        })
    });
    g.bench_function("batch_1000_int_63", |b| {
        b.iter(|| {
            next(&mut batch, int.capacity());
            int.hide_in_place(black_box(&mut batch))
        })
    });
    g.bench_function("batch_1000_snowflake_sortable", |b| {
        b.iter(|| {
            next(&mut batch, max);
            sortable.hide_in_place(black_box(&mut batch))
        })
    });
    g.bench_function("batch_1000_snowflake_opaque", |b| {
        b.iter(|| {
            next(&mut batch, max);
            opaque.hide_in_place(black_box(&mut batch))
        })
    });
}

/// Ten dependent AES blocks: the floor of one hidden ID.
fn floors(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    use aes::cipher::{BlockEncrypt, KeyInit};
    g.throughput(Throughput::Elements(1));
    let aes256 = aes::Aes256::new(&[0x5A; 32].into());
    let aes128 = aes::Aes128::new(&[0x5A; 16].into());
    let mut x = 0u8;
    g.bench_function("floor_aes256_x10_crate", |b| {
        b.iter(|| {
            x = x.wrapping_add(1);
            let mut block = black_box([x; 16]).into();
            for _ in 0..10 {
                aes256.encrypt_block(&mut block);
            }
            block
        })
    });
    g.bench_function("floor_aes128_x10_crate", |b| {
        b.iter(|| {
            x = x.wrapping_add(1);
            let mut block = black_box([x; 16]).into();
            for _ in 0..10 {
                aes128.encrypt_block(&mut block);
            }
            block
        })
    });
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("aes") {
        for (name, rounds) in [
            ("floor_aes256_x10_inline", 14),
            ("floor_aes128_x10_inline", 10),
        ] {
            g.bench_function(name, |b| {
                b.iter(|| {
                    x = x.wrapping_add(1);
                    // SAFETY: AES-NI was detected above.
                    unsafe { inline_chain(black_box(u128::from(x)), rounds) }
                })
            });
        }
    }
}

/// Ten dependent AES blocks of `rounds` rounds (14: AES-256, 10:
/// AES-128) with AES-NI inline, under fixed round keys (the key schedule
/// does not change the time). Safety: the processor must have AES-NI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "aes")]
unsafe fn inline_chain(block: u128, rounds: usize) -> u128 {
    use std::arch::x86_64::{__m128i, _mm_aesenc_si128, _mm_aesenclast_si128, _mm_xor_si128};
    let keys: [__m128i; 15] = std::array::from_fn(|i| std::mem::transmute(i as u128 * 0x0101_0101));
    let mut b: __m128i = std::mem::transmute(block);
    for _ in 0..10 {
        b = _mm_xor_si128(b, keys[0]);
        for key in &keys[1..rounds] {
            b = _mm_aesenc_si128(b, *key);
        }
        b = _mm_aesenclast_si128(b, keys[rounds]);
    }
    std::mem::transmute(b)
}

criterion_group!(benches, bench);
criterion_main!(benches);
