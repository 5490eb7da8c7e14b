//! Snowflake calls at saturation through the Issuer (in this process, no
//! network): fair shares of each time unit never hand one ID to two calls,
//! a cancelled call's share leaks to nobody, and closing the generator
//! while calls wait answers them UNAVAILABLE instead of leaving them hung.
//! The scheduling itself is tested unit by unit in
//! `src/modes/fair_shares.rs`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use idgen::error::Error;
use idgen::id::{
    Clock, ErrorKind, ManualClock, Mode, Preset, Snowflake, StartPlan, SystemClock,
    DEFAULT_EPOCH_MS,
};
use idgen::modes::Issuer;

/// An issuer over a fresh generator whose mark lies an hour ahead.
fn issuer(clock: Arc<dyn Clock>, max_wait: Duration) -> Arc<Issuer> {
    let now_ms = clock.now_millis();
    let layout = Preset::Twitter
        .spec(DEFAULT_EPOCH_MS)
        .validate(now_ms)
        .unwrap();
    let plan = StartPlan::new(&layout, now_ms, None, 0).unwrap();
    let g = Snowflake::new(layout, 0, 1, 1000, plan, now_ms + 3_600_000).unwrap();
    Arc::new(Issuer::new(Arc::new(g), clock, 100_000, max_wait).unwrap())
}

/// One call of `size` IDs (a unary GenId for 1).
async fn call(issuer: &Issuer, size: u64) -> Result<Vec<u64>, Error> {
    if size == 1 {
        issuer.gen_id(Mode::Snowflake, "").await.map(|id| vec![id])
    } else {
        issuer.gen_ids(Mode::Snowflake, "", size).await
    }
}

/// Every call's IDs strictly increase, each caller's calls follow one
/// another, and no ID reaches two calls.
fn check_unique(per_caller: Vec<Vec<Vec<u64>>>) -> usize {
    let mut seen = HashSet::new();
    for calls in per_caller {
        let mut last = 0;
        for ids in calls {
            for id in ids {
                assert!(id > last, "{id} after {last} within one caller");
                last = id;
                assert!(seen.insert(id), "{id} handed out twice");
            }
        }
    }
    seen.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_sizes_at_saturation_never_repeat_and_each_call_increases() {
    let issuer = issuer(Arc::new(SystemClock), Duration::from_secs(30));
    let sizes = [1000u64, 10, 1, 3000, 300, 4096, 1000, 5];
    let tasks: Vec<_> = (0..48)
        .map(|i| {
            let issuer = Arc::clone(&issuer);
            let size = sizes[i % sizes.len()];
            tokio::spawn(async move {
                let mut calls = Vec::new();
                for _ in 0..20 {
                    let ids = call(&issuer, size).await.expect("served");
                    assert_eq!(ids.len() as u64, size);
                    calls.push(ids);
                }
                calls
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.unwrap());
    }
    let want: u64 = (0..48).map(|i| 20 * sizes[i % sizes.len()]).sum();
    assert_eq!(check_unique(all) as u64, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_callers_leak_nothing_to_others() {
    let issuer = issuer(Arc::new(SystemClock), Duration::from_secs(30));
    let keep: Vec<_> = (0..24)
        .map(|_| {
            let issuer = Arc::clone(&issuer);
            tokio::spawn(async move {
                let mut calls = Vec::new();
                for _ in 0..10 {
                    calls.push(call(&issuer, 5000).await.expect("served"));
                }
                calls
            })
        })
        .collect();
    // Callers that give up part-way: their calls are dropped while queued
    // (the IDs they held are lost), again and again.
    let mut rng = fastrand::Rng::with_seed(23);
    for _ in 0..40 {
        let issuer = Arc::clone(&issuer);
        let quit = tokio::spawn(async move { call(&issuer, 20_000).await });
        tokio::time::sleep(Duration::from_micros(rng.u64(200..3000))).await;
        quit.abort();
    }
    let mut all = Vec::new();
    for t in keep {
        all.push(t.await.unwrap());
    }
    assert_eq!(check_unique(all), 24 * 10 * 5000);
    // Nothing is stuck: a new call is served (a generous bound, only to
    // turn a hang into a failure).
    let after = tokio::time::timeout(Duration::from_secs(20), call(&issuer, 10)).await;
    assert_eq!(after.expect("not hung").expect("served").len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_callers_wait_answers_unavailable() {
    for fence in [false, true] {
        // A frozen clock: once its unit is used up, callers can only wait.
        let clock = Arc::new(ManualClock::at_millis(SystemClock.now_millis()));
        let issuer = issuer(clock.clone(), Duration::from_secs(600));
        assert_eq!(call(&issuer, 4096).await.unwrap().len(), 4096);
        let waiting: Vec<_> = (0..8)
            .map(|i| {
                let issuer = Arc::clone(&issuer);
                tokio::spawn(async move { call(&issuer, [1, 10, 1000, 4096][i % 4]).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            waiting.iter().all(|t| !t.is_finished()),
            "nothing can be served on a frozen, used-up unit"
        );
        if fence {
            issuer.gate().fence();
        } else {
            issuer.gate().close();
        }
        for t in waiting {
            let answer = tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("a waiting call must not hang after shutdown")
                .unwrap();
            let e = answer.expect_err("nothing may be issued after close");
            assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        }
    }
}
