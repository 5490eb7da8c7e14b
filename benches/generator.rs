//! Criterion benchmarks of the snowflake generator, in process.
//!
//! * `capped/two_threads_one_worker`: the default twitter layout (12-bit
//!   sequence, 4,096,000 IDs/s cap) shared by two threads; a thread that
//!   finds the millisecond used up spins outside the generator until the
//!   next one. Throughput near the cap means no time is lost to contention
//!   or to late wake-ups.
//! * `uncapped/*`: a 22-bit sequence so the cap never binds: the cost of
//!   one ID with the clock read (`next_id`), without it
//!   (`next_id_time_given`), per ID in batches of 1000 (`reserve_1000`),
//!   and of the clock read alone.
//! * `uncapped/next_id_deadline_checked`: `next_id` plus the lease-deadline
//!   check the issuer makes before every snowflake issue (one atomic load
//!   of the ticker thread's coarse clock, one of the deadline, a compare):
//!   its difference to `next_id` is what the check costs.
//! * `uuid/*`: one UUIDv7 against one snowflake ID on the same uncapped
//!   generator setup, in process (issue 36's target: a UUID at most 40 ns
//!   above a snowflake ID). `generator_*` is the position alone
//!   (`next_id` against `reserve_uuids` of one plus composing its bits
//!   with a given random word); `issuer_*` is the whole in-process path a
//!   call takes (`Issuer::gen_id` against `Issuer::gen_uuid`, the
//!   `GenUuid` path: gate, position, two words of the per-thread buffered
//!   AES-CTR random bits, no Vec), and `issuer_*_1000` the same per ID in
//!   batches of 1000 (`gen_ids` against `gen_uuids`).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use idgen::id::{
    Clock, Deadline, GenError, Layout, LayoutSpec, Preset, Snowflake, StartPlan, SystemClock,
    DEFAULT_EPOCH_MS,
};
use idgen::id::{Mode, UuidLayout};
use idgen::modes::ticker::UnitTicker;
use idgen::modes::Issuer;

fn generator(layout: Layout) -> Snowflake {
    let now = SystemClock.now_millis();
    let plan = StartPlan::new(&layout, now, None, 10_000).expect("plan");
    // A mark far ahead: the benchmark measures issuing, not renewal.
    Snowflake::new(layout, 0, 0, 1000, plan, now + 3_600_000).expect("generator")
}

fn twitter() -> Layout {
    Preset::Twitter
        .spec(DEFAULT_EPOCH_MS)
        .validate(SystemClock.now_millis())
        .expect("layout")
}

fn wide() -> Layout {
    LayoutSpec {
        epoch_ms: DEFAULT_EPOCH_MS,
        time_unit_ms: 1,
        time_bits: 41,
        datacenter_bits: 0,
        worker_bits: 0,
        sequence_bits: 22,
    }
    .validate(SystemClock.now_millis())
    .expect("layout")
}

/// Issues `n` IDs one at a time, spinning (outside the generator) when the
/// sequence is used up. Returns a checksum so nothing is optimised away.
fn issue(g: &Snowflake, clock: &SystemClock, n: u64) -> u64 {
    let mut sum = 0u64;
    let mut done = 0;
    while done < n {
        match g.next_id(clock.now_micros()) {
            Ok(id) => {
                sum = sum.wrapping_add(id);
                done += 1;
            }
            Err(GenError::Exhausted { retry_after_micros }) => {
                let until = clock.now_micros() + retry_after_micros;
                while clock.now_micros() < until {
                    std::hint::spin_loop();
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
    sum
}

fn capped(c: &mut Criterion) {
    let mut group = c.benchmark_group("capped");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("two_threads_one_worker", |b| {
        let g = Arc::new(generator(twitter()));
        b.iter_custom(|iters| {
            let start = Instant::now();
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let g = Arc::clone(&g);
                    std::thread::spawn(move || issue(&g, &SystemClock, iters / 2))
                })
                .collect();
            for h in handles {
                black_box(h.join().expect("bench thread"));
            }
            start.elapsed()
        });
    });
    group.finish();
}

fn uncapped(c: &mut Criterion) {
    let mut group = c.benchmark_group("uncapped");
    group.throughput(Throughput::Elements(1));
    let g = generator(wide());
    let clock = SystemClock;
    group.bench_function("next_id", |b| {
        b.iter(|| black_box(g.next_id(clock.now_micros())))
    });
    // The generator alone: time is handed in (advancing 1 ms per 2^20
    // IDs), so the VM's clock read is not part of the figure.
    let g2 = generator(wide());
    let base = clock.now_micros();
    group.bench_function("next_id_time_given", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for i in 0..iters {
                black_box(g2.next_id(base + (i >> 20) * 1000).ok());
            }
            start.elapsed()
        })
    });
    let ticker = UnitTicker::new(Arc::new(SystemClock)).expect("ticker thread");
    let deadline = Deadline::unbounded();
    deadline.set(
        ticker
            .coarse()
            .deadline_at(Instant::now() + Duration::from_secs(3600)),
    );
    let g3 = generator(wide());
    group.bench_function("next_id_deadline_checked", |b| {
        b.iter(|| {
            if deadline.passed(ticker.coarse().now_ms()) {
                panic!("deadline passed");
            }
            black_box(g3.next_id(clock.now_micros()))
        })
    });
    let mut out = Vec::with_capacity(1000);
    group.throughput(Throughput::Elements(1000));
    group.bench_function("reserve_1000", |b| {
        b.iter(|| {
            out.clear();
            let r = g.reserve(clock.now_micros(), 1000).expect("reserve");
            g.extend_ids(r, &mut out);
            black_box(out.len())
        })
    });
    group.throughput(Throughput::Elements(1));
    group.bench_function("clock_read_only", |b| {
        b.iter(|| black_box(clock.now_micros()))
    });
    group.finish();
}

/// Times `iters` awaits of `call` on a current-thread runtime (one
/// `block_on` for the lot, so the runtime adds nothing per call).
fn timed<F, Fut, T>(rt: &tokio::runtime::Runtime, iters: u64, mut call: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, idgen::Error>>,
{
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            black_box(call().await.expect("issue"));
        }
        start.elapsed()
    })
}

fn uuid(c: &mut Criterion) {
    let mut group = c.benchmark_group("uuid");
    group.throughput(Throughput::Elements(1));
    let clock = SystemClock;
    let g = generator(wide());
    group.bench_function("generator_snowflake_one", |b| {
        b.iter(|| black_box(g.next_id(clock.now_micros())))
    });
    let g2 = generator(wide());
    let layout = UuidLayout::of(g2.layout()).expect("uuid layout");
    let node = g2.node_number();
    // A given random word (a Weyl sequence): the position and the bits
    // alone; the issuer figures below add the real random source.
    let mut word = 0u64;
    group.bench_function("generator_uuid_one", |b| {
        b.iter(|| {
            word = word.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let r = g2
                .reserve_uuids(clock.now_micros(), 1, word)
                .expect("reserve");
            black_box(layout.compose(r.unix_ms, r.first_counter, node, word))
        })
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let issuer = Issuer::new(
        Arc::new(generator(wide())),
        Arc::new(SystemClock),
        1000,
        Duration::from_secs(1),
    )
    .expect("issuer");
    group.bench_function("issuer_snowflake_one", |b| {
        b.iter_custom(|iters| timed(&rt, iters, || issuer.gen_id(Mode::Snowflake, "")))
    });
    group.bench_function("issuer_uuid_one", |b| {
        b.iter_custom(|iters| timed(&rt, iters, || issuer.gen_uuid()))
    });
    group.throughput(Throughput::Elements(1000));
    group.bench_function("issuer_snowflake_1000", |b| {
        b.iter_custom(|iters| timed(&rt, iters, || issuer.gen_ids(Mode::Snowflake, "", 1000)))
    });
    group.bench_function("issuer_uuid_1000", |b| {
        b.iter_custom(|iters| timed(&rt, iters, || issuer.gen_uuids(1000)))
    });
    group.finish();
}

criterion_group!(benches, capped, uncapped, uuid);
criterion_main!(benches);
