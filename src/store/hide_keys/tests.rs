use super::*;

fn master() -> Arc<MasterKey> {
    Arc::new(MasterKey::from_bytes([7u8; 32]))
}

fn embedded() -> (tempfile::TempDir, HideKeys) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = crate::store::EmbeddedStore::create(&dir.path().join("state.redb"), "test layout")
        .expect("state file");
    (dir, HideKeys::new(Arc::new(store), Some(master())))
}

#[test]
fn key_ids() {
    for ok in ["a", "orders", "0-x_y", &"a".repeat(63)] {
        assert!(check_key_id(ok).is_ok(), "{ok}");
    }
    for bad in ["", "A", "-a", "_a", "a/b", "a b", "é", &"a".repeat(64)] {
        assert!(check_key_id(bad).is_err(), "{bad}");
    }
}

#[test]
fn master_key_parsing() {
    let hex = "00".repeat(32);
    assert!(MasterKey::parse(&hex, "t").is_ok());
    let b64 = base64::engine::general_purpose::STANDARD.encode([1u8; 32]);
    assert!(MasterKey::parse(&format!(" {b64}\n"), "t").is_ok());
    let short = base64::engine::general_purpose::STANDARD.encode([1u8; 31]);
    let e = MasterKey::parse(&short, "t").expect_err("31 bytes");
    assert!(e.to_string().contains("31 bytes"), "{e}");
    assert!(MasterKey::parse("not a key!", "t").is_err());
    assert_eq!(
        format!("{:?}", MasterKey::from_bytes([9; 32])),
        "MasterKey(..)"
    );
}

#[test]
fn wrap_binds_key_id_and_version_and_master() {
    let m = master();
    let stored = StoredVersion {
        version: 3,
        state: HideKeyState::Active,
        created_ms: 0,
        wrapped: m.wrap("orders", 3, &[5; 32]).expect("wrap"),
    };
    assert_eq!(m.unwrap_key("orders", &stored).expect("open").version(), 3);
    assert!(
        m.unwrap_key("other", &stored).is_err(),
        "bound to the key id"
    );
    let moved = StoredVersion {
        version: 4,
        ..stored.clone()
    };
    assert!(
        m.unwrap_key("orders", &moved).is_err(),
        "bound to the version"
    );
    let wrong = MasterKey::from_bytes([8; 32]);
    let e = wrong
        .unwrap_key("orders", &stored)
        .expect_err("other master");
    assert_eq!(e.kind(), ErrorKind::Precondition);
}

/// A version number names one key for good, even when the record goes
/// back (a Consul snapshot restore) and a rotate makes the number again:
/// the key is derived from the master key, the key id and the version, so
/// the version made again hides every value as the lost one did.
#[tokio::test]
async fn a_version_made_again_after_its_record_went_back_is_the_same_key() {
    use crate::id::hide::IntHider;
    let hides = |ring: &HideKeyRing, version: KeyVersion| -> Vec<u64> {
        let key = ring
            .keys
            .iter()
            .find(|k| k.version() == version)
            .expect("version");
        let hider = IntHider::new(&[key], version, 4, 40).expect("hider");
        (0..64).map(|v| hider.hide(v).expect("hide")).collect()
    };
    let (_a, first) = embedded();
    first.create("orders").await.expect("create");
    first.rotate("orders").await.expect("rotate");
    let lost = first.ring("orders").await.expect("ring").expect("exists");
    // The same record history replayed from version 0 (what a rolled-back
    // record followed by a rotate amounts to).
    let (_b, again) = embedded();
    again.create("orders").await.expect("create");
    again.rotate("orders").await.expect("rotate");
    let made_again = again.ring("orders").await.expect("ring").expect("exists");
    assert_eq!(hides(&lost, 1), hides(&made_again, 1));
    assert_ne!(hides(&lost, 0), hides(&lost, 1), "versions differ");
    let other = master().derive("invoices", 1).expect("derive");
    assert_ne!(other, master().derive("orders", 1).expect("derive"));
}

#[tokio::test]
async fn create_rotate_retire_embedded() {
    let (_dir, keys) = embedded();
    let info = keys.create("orders").await.expect("create");
    assert_eq!(info.active(), Some(0));
    let e = keys.create("orders").await.expect_err("exists");
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    let info = keys.rotate("orders").await.expect("rotate");
    assert_eq!(info.active(), Some(1));
    assert_eq!(info.versions[0].state, HideKeyState::Retired);
    let info = keys.retire("orders").await.expect("retire");
    assert_eq!(info.active(), None);
    assert_eq!(info.versions.len(), 2, "retire never drops a version");
    let info = keys.rotate("orders").await.expect("rotate after retire");
    assert_eq!(info.active(), Some(2), "versions never reuse a number");
    let ring = keys.ring("orders").await.expect("ring").expect("exists");
    assert_eq!(ring.keys.len(), 3);
    assert_eq!(ring.active, Some(2));
    assert_eq!(
        keys.rotate("nope").await.expect_err("unknown").kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        keys.create("Bad").await.expect_err("syntax").kind(),
        ErrorKind::BadRequest
    );
    assert_eq!(keys.list().await.expect("list").len(), 1);
}

#[tokio::test]
async fn no_master_key_is_a_precondition() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = crate::store::EmbeddedStore::create(&dir.path().join("s.redb"), "test layout")
        .expect("state file");
    let keys = HideKeys::new(Arc::new(store), None);
    let e = keys.create("orders").await.expect_err("no master key");
    assert_eq!(e.kind(), ErrorKind::Precondition);
    assert!(
        e.to_string()
            .contains("hide.master_key_file or IDGEN_HIDE_MASTER_KEY"),
        "{e}"
    );
}

#[test]
fn merge_keeps_every_version_and_the_more_retired_state() {
    let v = |version, state| StoredVersion {
        version,
        state,
        created_ms: 0,
        wrapped: format!("w{version}"),
    };
    let mut target = StoredHideKey {
        key_id: "k".into(),
        versions: vec![
            v(0, HideKeyState::Retired),
            v(1, HideKeyState::Retired),
            v(2, HideKeyState::Active),
        ],
    };
    let backup = StoredHideKey {
        key_id: "k".into(),
        versions: vec![v(0, HideKeyState::Retired), v(1, HideKeyState::Active)],
    };
    target.merge(&backup);
    let states: Vec<_> = target
        .versions
        .iter()
        .map(|v| (v.version, v.state))
        .collect();
    assert_eq!(
        states,
        vec![
            (0, HideKeyState::Retired),
            (1, HideKeyState::Retired),
            (2, HideKeyState::Active)
        ]
    );
    // A retired key stays retired when an older backup had it active.
    let mut retired = StoredHideKey {
        key_id: "k".into(),
        versions: vec![v(0, HideKeyState::Retired), v(1, HideKeyState::Retired)],
    };
    retired.merge(&backup);
    assert_eq!(
        retired.info().active(),
        None,
        "a restore never re-activates"
    );
    let mut old = backup.clone();
    old.merge(&StoredHideKey {
        key_id: "k".into(),
        versions: vec![v(2, HideKeyState::Active)],
    });
    assert_eq!(old.versions.len(), 3);
    assert_eq!(old.info().active(), Some(2), "one active: the highest");
}

/// A rotation whose new version is above the limit (the narrowest field
/// of the namespaces using the key) is refused as FAILED_PRECONDITION
/// naming them and the fix, and writes nothing; without a limit (forced)
/// it rotates as before.
#[tokio::test]
async fn a_rotation_past_the_limit_is_refused_and_writes_nothing() {
    let (_dir, keys) = embedded();
    keys.create("orders").await.expect("create");
    let limit = || {
        Some(VersionLimit {
            max: 2,
            holders: "format \"orders\" (versions 0 to 2)".into(),
        })
    };
    for want in 1..=2 {
        let info = keys.rotate_within("orders", limit()).await.expect("fits");
        assert_eq!(info.active(), Some(want));
    }
    for _ in 0..2 {
        let e = keys
            .rotate_within("orders", limit())
            .await
            .expect_err("version 3 is past the limit");
        assert_eq!(e.kind(), ErrorKind::Precondition, "{e}");
        let text = e.to_string();
        for part in [
            "version 3",
            "format \"orders\"",
            "--force",
            "admin keys create",
        ] {
            assert!(text.contains(part), "{part:?} missing: {text}");
        }
    }
    let info = keys.list().await.expect("list");
    assert_eq!(
        info[0].versions.len(),
        3,
        "a refused rotation wrote nothing"
    );
    assert_eq!(info[0].active(), Some(2), "the active version is unchanged");
    let info = keys.rotate_within("orders", None).await.expect("forced");
    assert_eq!(info.active(), Some(3));
}

/// The master key of a node that holds the wrong one.
fn wrong_master() -> Arc<MasterKey> {
    Arc::new(MasterKey::from_bytes([8u8; 32]))
}

/// On the records `records` (one backend, shared by two nodes): a node
/// with the wrong master key, running before any key existed, cannot
/// create, rotate or retire once the right node made the first key, and
/// would not start; nothing it tried was written (issue 32, item 5: it
/// created and rotated keys the right node could not open).
async fn a_wrong_master_is_refused_on(records: Arc<dyn HideKeyRecords>) {
    let right = HideKeys::new(Arc::clone(&records), Some(master()));
    let wrong = HideKeys::new(Arc::clone(&records), Some(wrong_master()));
    let (ours, theirs) = (master().fingerprint(), wrong_master().fingerprint());
    assert_ne!(ours, theirs);
    assert_eq!(ours.len(), 16, "{ours}");
    wrong
        .check_master()
        .await
        .expect("nothing stored yet: it starts");
    right.create("bkey").await.expect("the first key");
    assert_eq!(
        records.master_fingerprint().await.expect("read"),
        Some(ours.clone()),
        "written with the first key"
    );
    let refusals = [
        ("create", wrong.create("ckey").await.map(|_| ())),
        ("rotate", wrong.rotate("bkey").await.map(|_| ())),
        ("retire", wrong.retire("bkey").await.map(|_| ())),
        ("start", wrong.check_master().await),
    ];
    for (what, refused) in refusals {
        let e = refused.expect_err(what);
        assert_eq!(e.kind(), ErrorKind::Precondition, "{what}: {e}");
        let text = e.to_string();
        for part in [&ours, &theirs, "hide.master_key_file", "restart"] {
            assert!(text.contains(part), "{what}: {part:?} missing: {text}");
        }
    }
    let list = right.list().await.expect("list");
    assert_eq!(list.len(), 1, "no key made by the wrong node: {list:?}");
    assert_eq!(
        (list[0].versions.len(), list[0].active()),
        (1, Some(0)),
        "nothing rotated or retired by the wrong node: {list:?}"
    );
    right.check_master().await.expect("the right node starts");
    assert_eq!(
        right.rotate("bkey").await.expect("rotate").active(),
        Some(1)
    );
}

/// Keys made before fingerprints (none stored): a node whose master key
/// does not open every stored version cannot change anything or record
/// itself; the first change from the right node records the right
/// fingerprint, after which the wrong node is refused by it.
async fn an_old_ring_gets_its_fingerprint_on(
    records: Arc<dyn HideKeyRecords>,
    forget: impl std::future::Future<Output = ()>,
) {
    let right = HideKeys::new(Arc::clone(&records), Some(master()));
    let wrong = HideKeys::new(Arc::clone(&records), Some(wrong_master()));
    right.create("akey").await.expect("create");
    right.rotate("akey").await.expect("rotate");
    forget.await;
    assert_eq!(records.master_fingerprint().await.expect("read"), None);
    wrong
        .check_master()
        .await
        .expect("nothing to compare at start");
    for refused in [
        wrong.rotate("akey").await.map(|_| ()),
        wrong.create("zkey").await.map(|_| ()),
    ] {
        let e = refused.expect_err("the wrong master opens no stored key");
        assert!(e.to_string().contains("cannot be unwrapped"), "{e}");
    }
    assert_eq!(
        records.master_fingerprint().await.expect("read"),
        None,
        "a master that opens no key never records itself"
    );
    assert_eq!(right.list().await.expect("list").len(), 1, "no zkey");
    right
        .create("zkey")
        .await
        .expect("the right node's first change");
    assert_eq!(
        records.master_fingerprint().await.expect("read"),
        Some(master().fingerprint()),
        "backfilled"
    );
    let e = wrong
        .check_master()
        .await
        .expect_err("now refused at start");
    assert!(e.to_string().contains(&master().fingerprint()), "{e}");
}

fn embedded_records(dir: &std::path::Path) -> crate::store::EmbeddedStore {
    crate::store::EmbeddedStore::create(&dir.join("state.redb"), "test layout").expect("state file")
}

#[tokio::test]
async fn a_wrong_master_cannot_change_embedded_keys_or_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    a_wrong_master_is_refused_on(Arc::new(embedded_records(dir.path()))).await;
}

#[tokio::test]
async fn an_embedded_ring_from_before_fingerprints_gets_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = embedded_records(dir.path());
    let forget = {
        let store = store.clone();
        async move {
            let txn = store.db().begin_write().expect("write");
            txn.open_table(crate::store::embedded::META)
                .expect("meta")
                .remove(fingerprint::META_KEY)
                .expect("remove");
            txn.commit().expect("commit");
        }
    };
    an_old_ring_gets_its_fingerprint_on(Arc::new(store), forget).await;
}

fn consul_records(consul: &consul_testserver::TestConsul, cluster: &str) -> ConsulHideKeyRecords {
    ConsulHideKeyRecords::new(
        crate::store::test_consul_client(consul.addr()),
        crate::store::kv_paths::ClusterPaths::new("idgen", cluster),
    )
}

/// On Consul as on the state file; and on a fresh cluster two nodes with
/// different master keys creating keys at once: exactly one succeeds, the
/// other is refused naming both fingerprints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_master_cannot_change_consul_keys_or_start() {
    let consul = consul_testserver::TestConsul::start(consul_testserver::Config::default())
        .await
        .expect("test consul");
    a_wrong_master_is_refused_on(Arc::new(consul_records(&consul, "wrong"))).await;
    let records = consul_records(&consul, "old");
    let forget = {
        let (client, key) = (
            crate::store::test_consul_client(consul.addr()),
            crate::store::kv_paths::ClusterPaths::new("idgen", "old").hide_master_fingerprint(),
        );
        async move {
            client.kv_delete(&key, None).await.expect("delete");
        }
    };
    an_old_ring_gets_its_fingerprint_on(Arc::new(records), forget).await;
    for round in 0..4 {
        let records: Arc<dyn HideKeyRecords> =
            Arc::new(consul_records(&consul, &format!("race-{round}")));
        let right = HideKeys::new(Arc::clone(&records), Some(master()));
        let wrong = HideKeys::new(Arc::clone(&records), Some(wrong_master()));
        let (a, b) = tokio::join!(right.create("one"), wrong.create("two"));
        let won = usize::from(a.is_ok()) + usize::from(b.is_ok());
        assert_eq!(won, 1, "round {round}: {a:?} {b:?}");
        let e = a.err().or(b.err()).expect("one refused");
        assert!(e.to_string().contains("fingerprint"), "{e}");
        assert_eq!(records.all().await.expect("all").len(), 1, "round {round}");
    }
    consul.shutdown().await;
}
