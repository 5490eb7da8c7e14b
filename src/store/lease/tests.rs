use super::*;
use crate::id::lease::{LeaseError, MAX_TOKEN};
use crate::store::EmbeddedStore;
use std::collections::HashSet;

fn store() -> (tempfile::TempDir, EmbeddedStore) {
    let dir = tempfile::tempdir().unwrap();
    let s = EmbeddedStore::create(&dir.path().join("s.redb"), "layout").unwrap();
    (dir, s)
}

#[tokio::test]
async fn embedded_blocks_are_disjoint_and_durable() {
    let (dir, s) = store();
    let tokens = EmbeddedLeaseTokens::new(s, 3, 7, (0, 63)).unwrap();
    let mut seen = HashSet::new();
    for _ in 0..20 {
        let b = tokens.reserve(100).await.unwrap();
        assert_eq!((b.zone, b.token), (3, 7));
        for id in b.ids().first..=b.ids().last {
            assert!(seen.insert(id), "duplicate {id}");
        }
    }
    assert_eq!(tokens.counter(7).unwrap().reserved, 2000);
    drop(tokens);
    let s = EmbeddedStore::open(&dir.path().join("s.redb"), "layout", false).unwrap();
    let tokens = EmbeddedLeaseTokens::new(s, 3, 7, (0, 63)).unwrap();
    let b = tokens.reserve(100).await.unwrap();
    assert_eq!(b.first, 2001, "a reopened store continues above");
}

#[tokio::test]
async fn embedded_moves_to_the_next_token_when_one_is_used_up() {
    let (_dir, s) = store();
    let tokens =
        EmbeddedLeaseTokens::new(s, 0, MAX_TOKEN - 1, (MAX_TOKEN - 63, MAX_TOKEN)).unwrap();
    tokens
        .advance_counter(MAX_TOKEN - 1, crate::id::lease::MAX_SEQUENCE - 5)
        .unwrap();
    let b = tokens.reserve(100).await.unwrap();
    assert_eq!((b.token, b.len()), (MAX_TOKEN - 1, 5));
    let b = tokens.reserve(100).await.unwrap();
    assert_eq!((b.token, b.first), (MAX_TOKEN, 1));
    assert_eq!(tokens.token(), Some(MAX_TOKEN));
    tokens
        .advance_counter(MAX_TOKEN, crate::id::lease::MAX_SEQUENCE)
        .unwrap();
    let e = tokens.reserve(100).await.unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Lease(LeaseError::RangeExhausted {
                zone: 0,
                last: MAX_TOKEN,
                ..
            })
        ),
        "{e:?}"
    );
    // Counters never move back.
    tokens.advance_counter(MAX_TOKEN, 1).unwrap();
    assert!(tokens.counter(MAX_TOKEN).unwrap().exhausted());
}

#[tokio::test]
async fn embedded_never_leaves_its_own_range() {
    let (_dir, s) = store();
    // The range of datacenter 0, worker 0 under 5 + 5 bits: 0 to 63.
    let tokens = EmbeddedLeaseTokens::new(s, 0, 63, (0, 63)).unwrap();
    tokens
        .advance_counter(63, crate::id::lease::MAX_SEQUENCE)
        .unwrap();
    let e = tokens.reserve(10).await.unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Lease(LeaseError::RangeExhausted {
                first: 0,
                last: 63,
                ..
            })
        ),
        "token 64 belongs to the next worker: {e:?}"
    );
    assert_eq!(tokens.token(), Some(63));
    assert_eq!(tokens.counter(64).unwrap().reserved, 0, "never touched");
}

/// A lease zone is plain or hidden for good, on both backends: the first
/// declaration is recorded, the same one passes again, any other is
/// refused; a zone with counters but no record (used before records) is
/// recorded plain and refuses to become hidden.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_record_is_written_once_and_refuses_another_setting() {
    use crate::id::lease::{ZoneHide, ZoneRecord};
    let plain = ZoneRecord::default();
    let hidden = ZoneRecord {
        hide: Some(ZoneHide {
            key: "tickets".into(),
            version_bits: 4,
        }),
    };
    let frozen = |e: StoreError| {
        assert!(
            matches!(e, StoreError::Lease(LeaseError::ZoneFrozen { .. })),
            "{e:?}"
        )
    };
    // Embedded.
    let (_dir, s) = store();
    assert_eq!(declare_embedded_zone(&s, 3, &hidden).unwrap(), hidden);
    assert_eq!(declare_embedded_zone(&s, 3, &hidden).unwrap(), hidden);
    frozen(declare_embedded_zone(&s, 3, &plain).unwrap_err());
    let used = EmbeddedLeaseTokens::new(s.clone(), 30, 0, (0, 63)).unwrap();
    used.reserve(10).await.unwrap();
    // Zone 3's record does not make zone 30 (a key "30/0") look recorded,
    // and zone 30's counters do not make zone 3 look used.
    frozen(declare_embedded_zone(&s, 30, &hidden).unwrap_err());
    assert_eq!(declare_embedded_zone(&s, 30, &plain).unwrap(), plain);
    frozen(declare_embedded_zone(&s, 30, &hidden).unwrap_err());
    assert_eq!(declare_embedded_zone(&s, 4, &hidden).unwrap(), hidden);

    // Consul.
    let consul = consul_testserver::TestConsul::start(consul_testserver::Config::default())
        .await
        .unwrap();
    let client = crate::store::test_consul_client(consul.addr());
    let keys = crate::store::kv_paths::ClusterPaths::new("idgen", "test");
    assert_eq!(
        declare_consul_zone(&client, &keys, 3, &hidden)
            .await
            .unwrap(),
        hidden
    );
    assert_eq!(
        declare_consul_zone(&client, &keys, 3, &hidden)
            .await
            .unwrap(),
        hidden
    );
    frozen(
        declare_consul_zone(&client, &keys, 3, &plain)
            .await
            .unwrap_err(),
    );
    let other = ZoneRecord {
        hide: Some(ZoneHide {
            key: "tickets".into(),
            version_bits: 5,
        }),
    };
    frozen(
        declare_consul_zone(&client, &keys, 3, &other)
            .await
            .unwrap_err(),
    );
    // A zone whose tokens have counters but no record: plain only.
    client
        .kv_put(
            &keys.lease(7, 0),
            br#"{"instance":"old","reserved":10}"#,
            crate::consul::KvWrite::Set,
        )
        .await
        .unwrap();
    frozen(
        declare_consul_zone(&client, &keys, 7, &hidden)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        declare_consul_zone(&client, &keys, 7, &plain)
            .await
            .unwrap(),
        plain
    );
}
