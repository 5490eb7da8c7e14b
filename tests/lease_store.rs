//! Lease tokens in Consul (the test server): two sessions never share a
//! token, blocks are disjoint, a used-up token is given back for another,
//! a restarted instance gets its token back (unless the token is inside
//! its lock-delay: then it takes another), a lost session stops the
//! reservations, and a reservation whose outcome was unknown is never
//! reused.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::consul;
use consul_testserver::{Config, TestConsul};
use idgen::consul::{ConsulClient, KvWrite, SessionBehavior, SessionSpec};
use idgen::id::lease::{Block, MAX_SEQUENCE};
use idgen::store::kv_paths::{ClusterPaths, OwnerInfo};
use idgen::store::lease::{ConsulLeaseTokens, LeaseTokenRecord, LeaseTokenStore};
use idgen::store::StoreError;

async fn session(c: &ConsulClient) -> String {
    session_with_lock_delay(c, Duration::from_secs(1)).await
}

async fn session_with_lock_delay(c: &ConsulClient, lock_delay: Duration) -> String {
    c.session_create(&SessionSpec {
        name: "test".into(),
        ttl: Duration::from_secs(30),
        behavior: SessionBehavior::Release,
        lock_delay,
        node_checks: Some(vec![]),
        service_checks: vec![],
    })
    .await
    .unwrap()
}

fn owner(instance: &str) -> OwnerInfo {
    OwnerInfo {
        instance: instance.into(),
        address: "127.0.0.1:1".into(),
        since_ms: 1,
    }
}

async fn tokens(c: &ConsulClient, instance: &str) -> (ConsulLeaseTokens, String) {
    let s = session(c).await;
    (tokens_in(c, instance, s.clone()), s)
}

fn tokens_in(c: &ConsulClient, instance: &str, s: String) -> ConsulLeaseTokens {
    ConsulLeaseTokens::new(
        c.clone(),
        ClusterPaths::new("idgen", "test"),
        2,
        s,
        owner(instance),
    )
    .unwrap()
}

fn ids(b: &Block) -> std::ops::RangeInclusive<u64> {
    b.ids().first..=b.ids().last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_hold_different_tokens_and_blocks_never_overlap() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let c = consul::client(&consul, Duration::from_secs(2), 0);
    let (a, _) = tokens(&c, "a").await;
    let (b, _) = tokens(&c, "b").await;
    let mut seen = HashSet::new();
    for _ in 0..20 {
        for src in [&a, &b] {
            let block = src.reserve(10).await.unwrap();
            assert_eq!(block.zone, 2);
            for id in ids(&block) {
                assert!(seen.insert(id), "{id} twice");
            }
        }
    }
    let (ta, tb) = (a.token().unwrap(), b.token().unwrap());
    assert_ne!(ta, tb);
    let entry = consul.kv_get(&format!("idgen/test/lease/2/{ta}")).unwrap();
    let record: LeaseTokenRecord = serde_json::from_slice(&entry.value).unwrap();
    assert_eq!(
        (record.owner.instance.as_str(), record.reserved),
        ("a", 200)
    );

    // A gives its token back; B cannot take it (it holds one), a new
    // instance "c" takes the lowest free one, which is A's, and continues
    // above its counter.
    a.release().await.unwrap();
    assert!(consul
        .kv_get(&format!("idgen/test/lease/2/{ta}"))
        .unwrap()
        .session
        .is_none());
    let (c2, _) = tokens(&c, "c").await;
    let block = c2.reserve(10).await.unwrap();
    assert_eq!((block.token, block.first), (ta, 201));
    // And "a", back, gets a new token: its old one is held by "c".
    let (a2, _) = tokens(&c, "a").await;
    let block = a2.reserve(10).await.unwrap();
    assert!(block.token != ta && block.token != tb);
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_used_up_token_is_given_back_for_another_and_a_restarted_instance_gets_its_own() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let c = consul::client(&consul, Duration::from_secs(2), 0);
    // Token 0 nearly used up, token 1 free with a counter, both unheld.
    for (token, reserved, inst) in [(0, MAX_SEQUENCE - 5, "x"), (1, 500, "a")] {
        let record = LeaseTokenRecord {
            owner: owner(inst),
            reserved,
        };
        c.kv_put(
            &format!("idgen/test/lease/2/{token}"),
            &serde_json::to_vec(&record).unwrap(),
            KvWrite::Set,
        )
        .await
        .unwrap();
    }
    // "a" held token 1 before: it gets it back, above its counter.
    let (a, _) = tokens(&c, "a").await;
    let block = a.reserve(100).await.unwrap();
    assert_eq!((block.token, block.first, block.last), (1, 501, 600));
    // "b" gets token 0 (lowest free), serves its last 5, then moves on.
    let (b, _) = tokens(&c, "b").await;
    let block = b.reserve(100).await.unwrap();
    assert_eq!((block.token, block.len()), (0, 5));
    let block = b.reserve(100).await.unwrap();
    assert_eq!((block.token, block.first), (2, 1), "a fresh token");
    let entry = consul.kv_get("idgen/test/lease/2/0").unwrap();
    assert!(entry.session.is_none(), "the used-up token was given back");
    // Nobody takes a used-up token again.
    let (d, _) = tokens(&c, "d").await;
    assert_eq!(d.reserve(1).await.unwrap().token, 3);
    consul.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_stops_reservations_and_an_unknown_outcome_is_never_reused() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let c = consul::client(&consul, Duration::from_millis(300), 0);
    let (a, s) = tokens(&c, "a").await;
    let first = a.reserve(10).await.unwrap();
    assert_eq!(first.first, 1);
    // Answers come too late: the write is applied, the client times out.
    consul
        .faults()
        .delay("agent-0", Some(Duration::from_millis(800)));
    assert!(matches!(a.reserve(10).await, Err(StoreError::Backend(_))));
    consul.faults().delay("agent-0", None);
    tokio::time::sleep(Duration::from_millis(900)).await;
    // 11..=20 may have been handed to nobody, but it is gone for good.
    let next = a.reserve(10).await.unwrap();
    assert_eq!(next.first, 21);

    // The session is destroyed (an operator's force-release): the next
    // reservation is refused as a lost lock, not retried on a new token.
    c.session_destroy(&s).await.unwrap();
    let e = a.reserve(10).await.unwrap_err();
    assert!(matches!(e, StoreError::LockLost(_)), "{e:?}");
    consul.shutdown().await;
}

/// Real Consul refuses a txn `lock` on a key inside its lock-delay (409,
/// `failed to lock key ... due to lock delay`). A token whose holder's
/// session was invalidated while holding it is in that state: the instance
/// coming back does not wait for it but takes another free token at once,
/// and the old token is taken again (above its counter) once the delay is
/// over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_inside_its_lock_delay_is_passed_over_for_another() {
    let consul = TestConsul::start(Config::default()).await.unwrap();
    let c = consul::client(&consul, Duration::from_secs(2), 0);
    let lock_delay = Duration::from_secs(3);
    let s = session_with_lock_delay(&c, lock_delay).await;
    let a = tokens_in(&c, "a", s.clone());
    let first = a.reserve(10).await.unwrap();
    let token = first.token;
    // The session ends while it still holds the token (a crash, an
    // operator's destroy): the key enters its 3 s lock-delay.
    c.session_destroy(&s).await.unwrap();
    let destroyed = std::time::Instant::now();
    let key = format!("idgen/test/lease/2/{token}");
    assert!(consul.kv_get(&key).unwrap().session.is_none());

    // The same instance, back at once: its own token is refused by the
    // lock-delay, so it takes the next free one.
    let (again, _) = tokens(&c, "a").await;
    let block = again.reserve(10).await.unwrap();
    assert!(
        destroyed.elapsed() < lock_delay,
        "the machine was too slow to test inside the lock-delay"
    );
    assert_ne!(
        block.token, token,
        "a token inside its lock-delay was taken"
    );
    assert_eq!(block.first, 1);
    let record: LeaseTokenRecord =
        serde_json::from_slice(&consul.kv_get(&key).unwrap().value).unwrap();
    assert_eq!(
        record.reserved, 10,
        "the passed-over token kept its counter"
    );

    // After the delay the old token is free for whoever comes, above its
    // counter.
    tokio::time::sleep(lock_delay.saturating_sub(destroyed.elapsed())).await;
    let (b, _) = tokens(&c, "b").await;
    let block = b.reserve(10).await.unwrap();
    assert_eq!((block.token, block.first), (token, 11));
    consul.shutdown().await;
}
