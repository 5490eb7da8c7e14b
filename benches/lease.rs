//! Lease mode in process, on one thread: IDs per second from the two
//! blocks, with reservations (embedded store, fsync'd) in the background.
//!
//! `cargo bench --bench lease`
//!
//! The block is 10,000,000 sequences: at 100 M IDs/s that is ten durable
//! reservations a second, each done while the other half of the block is
//! served. With the default block of 1,000 the store's fsync rate, not the
//! buffer, would set the pace.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use idgen::modes::lease::{LeaseEngine, LeaseSettings};
use idgen::store::lease::EmbeddedLeaseTokens;
use idgen::store::EmbeddedStore;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    // One worker runs the calls; the other runs background reservations.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let store = EmbeddedStore::create(&dir.path().join("s.redb"), "bench").expect("store");
    let tokens = EmbeddedLeaseTokens::new(store, 0, 0, (0, 63)).expect("tokens");
    let leases = Arc::new(LeaseEngine::new(
        Arc::new(tokens),
        LeaseSettings {
            block: 10_000_000,
            max_wait: Duration::from_secs(2),
        },
    ));
    rt.block_on(leases.prime()).expect("first block");
    let mut g = c.benchmark_group("lease");
    for batch in [1usize, 1000] {
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_function(format!("take_{batch}"), |b| {
            b.iter_custom(|iters| {
                let leases = Arc::clone(&leases);
                rt.block_on(async move {
                    let started = Instant::now();
                    for _ in 0..iters {
                        if batch == 1 {
                            std::hint::black_box(leases.take_one().await.expect("id"));
                        } else {
                            std::hint::black_box(leases.take(batch).await.expect("ids"));
                        }
                    }
                    started.elapsed()
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
