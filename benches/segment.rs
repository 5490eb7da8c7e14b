//! Segment mode in process, on one thread: IDs per second from the double
//! buffer, with refills (embedded store, fsync'd) in the background.
//!
//! `cargo bench --bench segment`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use idgen::id::segment::{Tag, TagRecord};
use idgen::id::SystemClock;
use idgen::modes::segment::{SegmentEngine, SegmentSettings};
use idgen::store::{EmbeddedStore, SegmentStore};

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    // One worker runs the calls; the other runs background refills.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let store =
        Arc::new(EmbeddedStore::create(&dir.path().join("s.redb"), "bench").expect("store"));
    let tag = Tag::parse("bench").expect("tag");
    rt.block_on(store.create_tag(&tag, &TagRecord::new(0, 1_000_000, "", 1).expect("record")))
        .expect("create tag");
    let segments = Arc::new(SegmentEngine::new(
        store,
        Arc::new(SystemClock),
        SegmentSettings {
            auto_create: false,
            default_step: 1_000_000,
            max_step: 100_000_000,
            max_wait: Duration::from_secs(2),
            max_tags: 10_000,
            idle_release: Duration::from_secs(3600),
        },
    ));
    let mut g = c.benchmark_group("segment");
    for batch in [1usize, 1000] {
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_function(format!("take_{batch}"), |b| {
            b.iter_custom(|iters| {
                let segments = Arc::clone(&segments);
                let tag = tag.clone();
                rt.block_on(async move {
                    let started = Instant::now();
                    for _ in 0..iters {
                        if batch == 1 {
                            let id = segments.take_one(&tag).await.expect("id");
                            std::hint::black_box(id);
                        } else {
                            let ids = segments.take(&tag, batch).await.expect("ids");
                            std::hint::black_box(ids);
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
