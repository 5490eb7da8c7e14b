//! Segment mode in process, on one thread: IDs per second from the double
//! buffer, with refills (embedded store, fsync'd) in the background.
//!
//! The same batches from a hidden tag (`segment/hidden_take_1000`, its IDs
//! shown through a keyed Feistel permutation) run in the same process, so
//! their ratio to `take_1000` is the cost of hiding a GenIds x1000 call
//! on the engine (gRPC adds the same to both).
//!
//! `cargo bench --bench segment`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use idgen::id::segment::{Tag, TagHide, TagRecord};
use idgen::id::SystemClock;
use idgen::modes::segment::{SegmentEngine, SegmentSettings};
use idgen::store::{CreateTag, EmbeddedStore, SegmentStore};

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
    let plain = TagRecord::new(0, 1_000_000, "", 1).expect("record");
    rt.block_on(store.create_tag(&tag, &plain, CreateTag::UNLIMITED))
        .expect("create tag");
    // A hidden tag, its key sealed with a throwaway master key.
    let hidden = Tag::parse("hidden").expect("tag");
    let records: Arc<dyn idgen::store::hide_keys::HideKeyRecords> = Arc::new((*store).clone());
    let master = idgen::store::hide_keys::MasterKey::from_bytes([7; 32]);
    let keys: Arc<dyn idgen::store::hide_keys::HideKeyStore> = Arc::new(
        idgen::store::hide_keys::HideKeys::new(records, Some(Arc::new(master))),
    );
    let rings = rt.block_on(async {
        let rings = idgen::modes::hide_keys::HideKeyRings::load(keys)
            .await
            .expect("rings");
        rings.create("bench", "bench").await.expect("hide key");
        rings
    });
    let hide = TagHide {
        key: "bench".into(),
        version_bits: 4,
        domain_bits: 40,
    };
    let record = plain.with_hide(&hidden, Some(hide)).expect("record");
    rt.block_on(store.create_tag(&hidden, &record, CreateTag::UNLIMITED))
        .expect("create hidden tag");
    let engine = SegmentEngine::new(
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
    )
    .with_hide_rings(rings);
    // Built inside the runtime: the hidden tag's hider watches its ring.
    let segments = rt.block_on(async { Arc::new(engine) });
    let mut g = c.benchmark_group("segment");
    let cases = [
        (1usize, &tag, ""),
        (1000, &tag, ""),
        (1000, &hidden, "hidden_"),
    ];
    for (batch, which, prefix) in cases {
        g.throughput(Throughput::Elements(batch as u64));
        g.bench_function(format!("{prefix}take_{batch}"), |b| {
            b.iter_custom(|iters| {
                let segments = Arc::clone(&segments);
                let tag = which.clone();
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
