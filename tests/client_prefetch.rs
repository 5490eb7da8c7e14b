//! Prefetch stress: many threads drawing from one client buffer (small
//! batches, so refills, joins and block changes happen all the time)
//! against a real server. No ID is handed out twice, and none is lost: the
//! IDs handed out plus those left in the buffer are exactly the dense
//! range the segment tag issued.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{all_modes_config, TestServer};
use idgen_client::blocking::BlockingClient;
use idgen_client::{Client, Mode, PrefetchConfig};

const THREADS: usize = 8;
const PER_THREAD: usize = 20_000;

#[test]
fn many_threads_never_get_an_id_twice_and_lose_none() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = runtime.block_on(TestServer::start(all_modes_config(dir.path())));
    let client = BlockingClient::connect(
        Client::builder()
            .endpoints([server.grpc.to_string()])
            .deadline(Duration::from_secs(10))
            .prefetch(PrefetchConfig {
                initial_batch: 64,
                min_batch: 16,
                max_batch: 512,
                low_water: 0.5,
                ..PrefetchConfig::default()
            }),
    )
    .unwrap();
    let ids = client.prefetcher(Mode::Segment, "stress").unwrap();
    let handed: Vec<Vec<u64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                let ids = ids.clone();
                s.spawn(move || {
                    (0..PER_THREAD)
                        .map(|_| ids.next_id().expect("next_id"))
                        .collect::<Vec<u64>>()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut seen = HashSet::new();
    for id in handed.iter().flatten() {
        assert!(seen.insert(*id), "ID {id} handed out twice");
    }
    assert_eq!(seen.len(), THREADS * PER_THREAD);

    // What is left in the buffer is not lost: once the refill in flight
    // (if any) has landed, take it out.
    std::thread::sleep(Duration::from_millis(500));
    let p = ids.prefetcher();
    for id in p.drain() {
        assert!(seen.insert(id), "ID {id} handed out twice");
    }
    assert_eq!(p.depth(), 0);
    // Segment IDs of one tag from one node are dense from 1: every ID up
    // to the largest one fetched must be accounted for.
    let max = *seen.iter().max().unwrap();
    let missing: Vec<u64> = (1..=max).filter(|i| !seen.contains(i)).collect();
    assert!(
        missing.is_empty(),
        "{} IDs lost (e.g. {:?})",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    drop(client);
    runtime.block_on(server.stop());
}
