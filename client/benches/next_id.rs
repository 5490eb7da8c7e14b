//! `next_id` from a filled prefetch buffer: the in-memory hot path (one
//! load of the current block, one `fetch_add`), on one thread and on two
//! threads sharing the buffer. Run with `cargo bench -p idgen-client`.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use idgen_client::Prefetcher;

/// IDs per filled buffer; each timed run uses fresh buffers so no refill
/// is ever measured here (refill stalls are in scripts/bench-client.sh).
const FILL: u64 = 1 << 22;

fn one_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("next_id");
    g.throughput(Throughput::Elements(1));
    g.bench_function("filled_buffer_1_thread", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(FILL);
                let p = Prefetcher::detached((1..=n).collect());
                let start = Instant::now();
                for _ in 0..n {
                    std::hint::black_box(p.try_next());
                }
                total += start.elapsed();
                left -= n;
            }
            total
        })
    });
    g.bench_function("filled_buffer_2_threads", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                // `n` IDs taken by two threads together.
                let n = left.min(FILL);
                let p = Prefetcher::detached((1..=n).collect());
                let barrier = std::sync::Barrier::new(2);
                let start = std::thread::scope(|s| {
                    let other = s.spawn(|| {
                        barrier.wait();
                        while std::hint::black_box(p.try_next()).is_some() {}
                    });
                    barrier.wait();
                    let start = Instant::now();
                    while std::hint::black_box(p.try_next()).is_some() {}
                    other.join().unwrap();
                    start
                });
                total += start.elapsed();
                left -= n;
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, one_thread);
criterion_main!(benches);
