//! Datacenter ids across Consul datacenters (rule 39), end to end: real
//! `idgen serve` processes against two emulated Consul datacenters, `dc1`
//! (the primary) and `dc2`. A datacenter id is claimed once, in the
//! primary's KV; a node of another Consul datacenter with the same id
//! refuses to start, and a running one whose claim turns out to be another
//! datacenter's fences at its next mark renewal. A datacenter id is
//! released only when its owner is gone, and its new owner starts above the
//! old marks (rule 44).

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{write_datacenter_config, ChildServer};
use consul_testserver::TestConsul;

/// A node of `consul` (one datacenter's agent) with `datacenter_id`.
fn config(dir: &Path, name: &str, consul: &TestConsul, datacenter_id: u64) -> PathBuf {
    write_datacenter_config(dir, name, consul.addr(), datacenter_id, &[])
}

/// [`config`] with more keys (`("section", "key", "toml value")`).
fn config_with(
    dir: &Path,
    name: &str,
    consul: &TestConsul,
    datacenter_id: u64,
    set: &[(&str, &str, &str)],
) -> PathBuf {
    write_datacenter_config(dir, name, consul.addr(), datacenter_id, set)
}

/// The admin token of the node the release tests call.
const TOKEN: &str = "datacenters-admin-secret";

/// Node `a` of dc1 (datacenter id 1), with the admin token the release
/// tests call it with.
fn admin_node(dir: &Path, dc1: &TestConsul) -> ChildServer {
    let token = format!("\"{TOKEN}\"");
    ChildServer::start(&config_with(
        dir,
        "a",
        dc1,
        1,
        &[("admin", "token", &token)],
    ))
}

/// `idgen admin --addr <node> --token .. datacenters <args>`, off the
/// async runtime.
async fn datacenters_cli(node: &ChildServer, args: &[&str]) -> (bool, String) {
    let all = [&["datacenters"][..], args].concat();
    common::admin_cli(node, TOKEN, &all).await
}

/// The claim record of `id` as `consul` (one datacenter) holds it.
fn claim(consul: &TestConsul, id: u64) -> Option<String> {
    consul
        .kv_get(&format!("idgen/test/datacenters/{id}"))
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
}

/// `dc1` and `dc2`, `dc1` the primary.
async fn federation() -> (TestConsul, TestConsul) {
    let dc1 = common::test_consul().await;
    let dc2 = dc1.add_datacenter("dc2").await.expect("dc2 starts");
    (dc1, dc2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datacenter_id_owned_by_another_consul_datacenter_is_refused_and_distinct_ids_never_repeat(
) {
    let (dc1, dc2) = federation().await;
    let dir = tempfile::tempdir().unwrap();
    let a1 = ChildServer::start(&config(dir.path(), "a1", &dc1, 1));
    let a2 = ChildServer::start(&config(dir.path(), "a2", &dc1, 1));
    let record = claim(&dc1, 1).expect("the first node claims its id in the primary");
    assert!(record.contains("\"consul_datacenter\":\"dc1\""), "{record}");
    assert!(record.contains("\"cluster\":\"test\""), "{record}");

    // dc2 deployed from a copy of dc1's config: same datacenter id.
    for name in ["b1", "b2"] {
        let log = ChildServer::try_start(&config(dir.path(), name, &dc2, 1), &[])
            .err()
            .expect("a second Consul datacenter with the same id must be refused")
            .replace('\\', ""); // JSON or plain text alike
        assert!(
            log.contains("datacenter id 1 belongs to Consul datacenter \"dc1\""),
            "{log}"
        );
        assert!(log.contains("Consul datacenter \"dc2\""), "{log}");
        assert!(log.contains("node.datacenter_id of their own"), "{log}");
    }
    assert!(
        dc2.sessions().is_empty(),
        "a refused node takes no worker id"
    );

    // With an id of its own, dc2's nodes serve; the claim lives in the
    // primary only.
    let b1 = ChildServer::start(&config(dir.path(), "b1", &dc2, 2));
    let b2 = ChildServer::start(&config(dir.path(), "b2", &dc2, 2));
    let record = claim(&dc1, 2).expect("dc2's id is claimed in the primary");
    assert!(record.contains("\"consul_datacenter\":\"dc2\""), "{record}");
    assert_eq!(claim(&dc2, 2), None, "no claim in dc2's own KV");

    let mut seen = HashSet::new();
    for _ in 0..10 {
        for node in [&a1, &a2, &b1, &b2] {
            for id in common::snowflake_ids(node, 1000).await.expect("issues") {
                assert!(seen.insert(id), "ID {id} handed out twice");
            }
        }
    }
    assert_eq!(seen.len(), 40_000);
    for node in [a1, a2, b1, b2] {
        assert!(node.terminate().success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_node_whose_claim_is_another_datacenters_fences_at_its_next_mark_renewal() {
    let (dc1, dc2) = federation().await;
    let dir = tempfile::tempdir().unwrap();
    let b = ChildServer::start(&config(dir.path(), "b", &dc2, 2));
    common::snowflake_ids(&b, 10).await.expect("serves");
    // The claim now names dc1 (as if dc1 had claimed id 2 while dc2's
    // claim was gone): dc2's node must stop at its next mark renewal.
    let key = "idgen/test/datacenters/2";
    let taken = r#"{"consul_datacenter":"dc1","cluster":"test","claimed_ms":1,"claimed_by":"x"}"#;
    let put = reqwest::Client::new()
        .put(format!("http://{}/v1/kv/{key}", dc1.addr()))
        .body(taken)
        .send()
        .await
        .expect("rewrite the claim");
    assert_eq!(put.status().as_u16(), 200);
    // Fenced at the next mark renewal (every second), then refused with
    // the reason once its claim again is refused.
    let mut refusal = None;
    for _ in 0..300 {
        match common::snowflake_ids(&b, 1).await {
            Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                refusal = Some(s);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let s = refusal.unwrap_or_else(|| panic!("not fenced with the reason: {}", b.log_text()));
    let why = s.message();
    assert!(
        why.contains("datacenter id 2 belongs to Consul datacenter \"dc1\""),
        "{why}"
    );
    assert!(why.contains("Consul datacenter \"dc2\""), "{why}");
    assert!(b.log_text().contains("high-water mark not written"));
    b.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datacenter_on_another_layout_than_the_primarys_is_refused() {
    let (dc1, dc2) = federation().await;
    let dir = tempfile::tempdir().unwrap();
    let a = ChildServer::start(&config(dir.path(), "a", &dc1, 1));
    // dc2 has no layout record of its own yet: without the primary's, it
    // would record this one and issue on it.
    let log = ChildServer::try_start_env(
        &config(dir.path(), "b", &dc2, 2),
        &[],
        &[("IDGEN_LAYOUT__EPOCH", "2024-01-01T01:00:00Z")],
    )
    .err()
    .expect("a layout other than the primary's must be refused");
    assert!(
        log.contains("layout.epoch: cluster has 2024-01-01T00:00:00Z"),
        "{log}"
    );
    assert!(
        dc2.sessions().is_empty(),
        "a refused node takes no worker id"
    );
    // The same layout starts, and the primary holds the one record.
    let b = ChildServer::start(&config(dir.path(), "b", &dc2, 2));
    assert!(dc1.kv_get("idgen/test/layout").is_some());
    for node in [a, b] {
        assert!(node.terminate().success());
    }
}

/// The node's `/metrics` exposition.
/// Rule 42: the primary down, a datacenter whose claim the primary
/// confirmed restarts and serves on the copy in its own KV; a first claim
/// (a new datacenter, or a new id in this one) is refused naming the
/// primary; the primary back, claims resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_claim_outlives_a_primary_outage_and_a_first_claim_waits_for_the_primary() {
    let (dc1, dc2) = federation().await;
    let dc3 = dc1.add_datacenter("dc3").await.expect("dc3 starts");
    let dir = tempfile::tempdir().unwrap();
    let a = ChildServer::start(&config(dir.path(), "a", &dc1, 1));
    let b = ChildServer::start(&config(dir.path(), "b", &dc2, 2));
    let copy = dc2
        .kv_get("idgen/test/datacenter-confirmed/2")
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
        .expect("the confirmed claim is copied into dc2's own KV");
    assert!(copy.contains("\"consul_datacenter\":\"dc2\""), "{copy}");
    assert!(copy.contains("\"primary\":\"dc1\""), "{copy}");
    let mut seen: HashSet<u64> = HashSet::new();
    for id in common::snowflake_ids(&b, 1000).await.expect("issues") {
        assert!(seen.insert(id));
    }
    assert!(b.terminate().success());

    dc1.faults().datacenter_down(true);
    // dc2 restarts on its confirmed copy and keeps renewing its marks on
    // it: five checks the primary did not answer, then still issuing.
    let b = ChildServer::start(&config(dir.path(), "b2", &dc2, 2));
    let mut unanswered = 0.0;
    for _ in 0..400 {
        let text = common::metrics_text(&b).await;
        assert_eq!(
            common::metric(&text, "idgen_datacenter_primary_reachable"),
            Some(0.0),
            "{text}"
        );
        unanswered = common::metric(&text, "idgen_datacenter_primary_unreachable_checks_total")
            .unwrap_or(0.0);
        if unanswered >= 5.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(unanswered >= 5.0, "{}", b.log_text());
    for id in common::snowflake_ids(&b, 1000)
        .await
        .expect("serves on the copy")
    {
        assert!(seen.insert(id), "ID {id} handed out twice");
    }
    let log = b.log_text().replace('\\', "");
    assert!(
        log.contains("the primary Consul datacenter \"dc1\" has been unreachable for"),
        "{log}"
    );

    // A first claim needs the primary: a new datacenter, and a new id in
    // dc2 (whose copy is of id 2 only).
    for (name, consul, id) in [("c", &dc3, 3), ("b3", &dc2, 4)] {
        let log = match ChildServer::try_start(&config(dir.path(), name, consul, id), &[]) {
            Ok(node) => panic!(
                "a first claim without the primary must be refused: {}",
                node.log_text()
            ),
            Err(log) => log.replace('\\', ""),
        };
        assert!(
            log.contains(&format!(
                "cannot reach the primary Consul datacenter \"dc1\" (consul.primary_datacenter) to claim datacenter id {id}"
            )),
            "{log}"
        );
        assert!(
            log.contains("a first claim of a datacenter id needs the primary"),
            "{log}"
        );
    }
    assert!(claim(&dc1, 3).is_none() && claim(&dc1, 4).is_none());

    // The primary back: dc3 claims its id; dc2's node confirms again.
    dc1.faults().datacenter_down(false);
    let c = ChildServer::start(&config(dir.path(), "c", &dc3, 3));
    let record = claim(&dc1, 3).expect("dc3's id is claimed once the primary is back");
    assert!(record.contains("\"consul_datacenter\":\"dc3\""), "{record}");
    let mut reachable = None;
    for _ in 0..400 {
        reachable = common::metric(
            &common::metrics_text(&b).await,
            "idgen_datacenter_primary_reachable",
        );
        if reachable == Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(reachable, Some(1.0), "{}", b.log_text());
    for node in [&a, &b, &c] {
        for id in common::snowflake_ids(node, 1000).await.expect("issues") {
            assert!(seen.insert(id), "ID {id} handed out twice");
        }
    }
    for node in [a, b, c] {
        assert!(node.terminate().success());
    }
}

/// Rule 44: a release while the owner datacenter is alive is refused and
/// changes nothing; forced once its node is gone (killed: its session and
/// registration linger), the id goes to another datacenter, whose node
/// starts above the old owner's highest mark although its clock is 20 s
/// behind the old owner's IDs: every ID after the release is above every
/// ID before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datacenter_id_is_released_only_when_its_owner_is_gone_and_its_new_owner_starts_above_the_old_marks(
) {
    let (dc1, dc2) = federation().await;
    let dir = tempfile::tempdir().unwrap();
    let a = admin_node(dir.path(), &dc1);
    let b = ChildServer::start(&config(dir.path(), "b", &dc2, 2));
    let mut before = common::snowflake_ids(&b, 1000).await.expect("issues");

    let (ok, out) = datacenters_cli(&a, &["release", "2"]).await;
    assert!(
        !ok,
        "a release while the owner is alive must be refused: {out}"
    );
    assert!(
        out.contains("datacenter id 2 is owned by Consul datacenter \"dc2\", which still has"),
        "{out}"
    );
    assert!(out.contains("worker id 2/0 held by session"), "{out}");
    let record = claim(&dc1, 2).expect("the claim stays");
    assert!(!record.contains("\"state\""), "still owned: {record}");
    let copy = dc2
        .kv_get("idgen/test/datacenter-confirmed/2")
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
        .expect("dc2's confirmed copy stays");
    assert!(!copy.contains("\"released\":true"), "put back: {copy}");
    before.extend(
        common::snowflake_ids(&b, 1000)
            .await
            .expect("the owner still issues"),
    );

    b.kill();
    let (ok, out) = datacenters_cli(&a, &["release", "2", "--force"]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("released datacenter id 2 of Consul datacenter \"dc2\""),
        "{out}"
    );
    let record = claim(&dc1, 2).expect("the released claim stays, with its floor");
    assert!(record.contains("\"state\":\"released\""), "{record}");
    let copy = dc2
        .kv_get("idgen/test/datacenter-confirmed/2")
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
        .expect("the owner's copy is marked released");
    assert!(copy.contains("\"released\":true"), "{copy}");
    let (ok, out) = datacenters_cli(&a, &["list"]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("datacenter 2 released by Consul datacenter dc2"),
        "{out}"
    );

    // dc1 takes id 2, its clock 20 s behind the IDs dc2 issued.
    let c = ChildServer::try_start(
        &config_with(
            dir.path(),
            "c",
            &dc1,
            2,
            &[("clock", "max_startup_skew", "\"60s\"")],
        ),
        &["--test-clock-offset-ms", "-20000"],
    )
    .unwrap_or_else(|log| panic!("the released id is claimed by dc1: {log}"));
    let record = claim(&dc1, 2).expect("claimed again");
    assert!(record.contains("\"consul_datacenter\":\"dc1\""), "{record}");
    assert!(
        record.contains("\"floor_ms\""),
        "the floor is kept: {record}"
    );
    let after = common::snowflake_ids(&c, 1000).await.expect("issues");
    let highest_before = before.iter().max().copied().unwrap_or(0);
    let lowest_after = after.iter().min().copied().unwrap_or(0);
    assert!(
        lowest_after > highest_before,
        "an ID after the release ({lowest_after}) is not above every ID before it ({highest_before})"
    );
    let mut seen = HashSet::new();
    for id in before.iter().chain(&after) {
        assert!(seen.insert(*id), "ID {id} handed out twice");
    }
    for node in [a, c] {
        assert!(node.terminate().success());
    }
}

/// A forced release whose caller gives up while it waits out the old
/// owner's lock-delay (2 s here; the CLI's default deadline was 5 s against
/// up to 60 s) still ends released: it runs on its own task. Before, the
/// node dropped it half-way and the claim stayed `releasing`, its id
/// claimable by no datacenter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_whose_caller_gives_up_still_ends_released() {
    let (dc1, dc2) = federation().await;
    let dir = tempfile::tempdir().unwrap();
    let a = admin_node(dir.path(), &dc1);
    let b = ChildServer::start(&config(dir.path(), "b", &dc2, 2));
    common::snowflake_ids(&b, 10).await.expect("issues");
    b.kill();
    let mut admin = idgen::proto::admin_client::AdminClient::connect(format!("http://{}", a.grpc))
        .await
        .expect("connects");
    let request = idgen::proto::ReleaseDatacenterRequest { id: 2, force: true };
    let mut request = common::tonic_req(TOKEN, request);
    request.set_timeout(Duration::from_millis(300));
    let gave_up = admin
        .release_datacenter(request)
        .await
        .expect_err("the release waits out a 2 s lock-delay: the 300 ms caller gives up first");
    assert!(
        matches!(
            gave_up.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{gave_up:?}"
    );
    let mut record = String::new();
    for _ in 0..120 {
        record = claim(&dc1, 2).expect("the claim stays");
        if record.contains("\"state\":\"released\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        record.contains("\"state\":\"released\""),
        "the release never finished after its caller gave up: {record}"
    );
    assert!(a.terminate().success());
}

/// A release of an id no Consul datacenter claimed is NOT_FOUND over
/// gRPC, naming the id, the primary and the KV path, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_an_unclaimed_datacenter_id_is_not_found_naming_it() {
    let (dc1, _dc2) = federation().await;
    let dir = tempfile::tempdir().unwrap();
    let a = admin_node(dir.path(), &dc1);
    let mut admin = idgen::proto::admin_client::AdminClient::connect(format!("http://{}", a.grpc))
        .await
        .expect("connects");
    let request = idgen::proto::ReleaseDatacenterRequest { id: 7, force: true };
    let e = admin
        .release_datacenter(common::tonic_req(TOKEN, request))
        .await
        .expect_err("nothing to release");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(
        e.message().contains(
            "datacenter id 7 is not claimed in the primary Consul datacenter \"dc1\" (no idgen/test/datacenters/7)"
        ),
        "{e:?}"
    );
    assert_eq!(claim(&dc1, 7), None, "nothing written");
    assert!(a.terminate().success());
}

/// `idgen admin` against `node` with the admin token.
async fn admin_cli(node: &ChildServer, args: &[&str]) -> (bool, String) {
    common::admin_cli(node, TOKEN, args).await
}

/// The layout record as `consul` (one datacenter) holds it.
fn layout_record(consul: &TestConsul) -> String {
    consul
        .kv_get("idgen/test/layout")
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
        .expect("a layout record")
}

/// The change both layout tests make: the epoch a year back, so every
/// new ID lies above every old one.
const NEW_LAYOUT: [&str; 7] = [
    "layout",
    "set",
    "--preset",
    "twitter",
    "--epoch",
    "2023-01-01T00:00:00Z",
    "--yes",
];

/// The record's epoch as `layout_record` shows it.
const NEW_EPOCH: &str = "\"epoch\":\"2023-01-01T00:00:00Z\"";

/// Polls `node` until it refuses with FAILED_PRECONDITION (a fence with
/// its reason), collecting every ID it still issues into `seen`; the
/// refusal's message. Panics, with the node's log, if it never fences.
async fn until_fenced(node: &ChildServer, seen: &mut HashSet<u64>) -> String {
    for _ in 0..400 {
        match common::snowflake_ids(node, 100).await {
            Ok(ids) => {
                for id in ids {
                    assert!(seen.insert(id), "ID {id} handed out twice");
                }
            }
            Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                return s.message().replace('\\', "")
            }
            // Between the fence and the record read that names it.
            Err(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never fenced with a reason: {}", node.log_text())
}

/// Rule 45: in a federation a layout change writes the primary's record
/// first. With the primary down it is refused from dc2, naming the
/// primary, and changes nothing in either datacenter; a change of the
/// fields that keep datacenters apart is refused; the primary back, the
/// change from dc2 writes the primary's record, then dc2's, and dc1's
/// node fences.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_change_in_a_federation_needs_the_primary_and_writes_it_first() {
    let (dc1, dc2) = federation().await;
    let dir = tempfile::tempdir().unwrap();
    let token = format!("\"{TOKEN}\"");
    let with_admin = [("admin", "token", token.as_str())];
    let a = ChildServer::start(&config_with(dir.path(), "a", &dc1, 1, &with_admin));
    let b = ChildServer::start(&config_with(dir.path(), "b", &dc2, 2, &with_admin));
    let (before1, before2) = (layout_record(&dc1), layout_record(&dc2));

    dc1.faults().datacenter_down(true);
    let (ok, out) = admin_cli(&b, &NEW_LAYOUT).await;
    assert!(
        !ok,
        "a layout change without the primary must be refused: {out}"
    );
    let out = out.replace('\\', "");
    assert!(out.contains("UNAVAILABLE"), "{out}");
    assert!(
        out.contains("cannot reach the primary Consul datacenter \"dc1\""),
        "{out}"
    );
    assert!(out.contains("nothing was changed"), "{out}");
    assert_eq!(layout_record(&dc1), before1, "the primary's record stays");
    assert_eq!(layout_record(&dc2), before2, "dc2's record stays");
    common::snowflake_ids(&b, 100)
        .await
        .expect("dc2 keeps serving on its confirmed claim");
    dc1.faults().datacenter_down(false);

    // Narrower worker field: datacenters could meet; refused, unchanged.
    let narrower = [
        &NEW_LAYOUT[..6],
        &["--worker-bits", "4", "--time-bits", "42", "--yes"],
    ]
    .concat();
    let (ok, out) = admin_cli(&b, &narrower).await;
    assert!(!ok, "{out}");
    assert!(out.contains("FAILED_PRECONDITION"), "{out}");
    assert!(out.contains("layout.worker_bits from 5 to 4"), "{out}");
    assert_eq!(layout_record(&dc1), before1);
    assert_eq!(layout_record(&dc2), before2);

    // The primary back: the change writes dc1's record, then dc2's.
    let (ok, out) = admin_cli(&b, &NEW_LAYOUT).await;
    assert!(ok, "{out}");
    assert!(
        layout_record(&dc1).contains(NEW_EPOCH),
        "{}",
        layout_record(&dc1)
    );
    assert!(
        layout_record(&dc2).contains(NEW_EPOCH),
        "{}",
        layout_record(&dc2)
    );
    // Both datacenters' nodes ran the old layout: both fence.
    let mut seen = HashSet::new();
    for node in [&a, &b] {
        let why = until_fenced(node, &mut seen).await;
        assert!(why.contains("layout"), "{why}");
    }
    for node in [a, b] {
        assert!(node.terminate().success());
    }
}

/// Rule 45: a layout change run in the primary fences a running node of
/// dc2 at its next mark renewal (its own datacenter's record unchanged),
/// its refusals naming the field and the fix; restarted on the old
/// layout it is refused, on the new one it brings dc2's own record to the
/// primary's, and both datacenters serve with no ID repeated across the
/// change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_change_in_the_primary_fences_another_datacenters_node_at_its_next_renewal() {
    let (dc1, dc2) = federation().await;
    let dir = tempfile::tempdir().unwrap();
    let token = format!("\"{TOKEN}\"");
    let with_admin = [("admin", "token", token.as_str())];
    let cfg_a = config_with(dir.path(), "a", &dc1, 1, &with_admin);
    let cfg_b = config_with(dir.path(), "b", &dc2, 2, &with_admin);
    let a = ChildServer::start(&cfg_a);
    let b = ChildServer::start(&cfg_b);
    let mut seen = HashSet::new();
    for node in [&a, &b] {
        for id in common::snowflake_ids(node, 1000).await.expect("issues") {
            assert!(seen.insert(id), "ID {id} handed out twice");
        }
    }
    let before2 = layout_record(&dc2);

    let (ok, out) = admin_cli(&a, &NEW_LAYOUT).await;
    assert!(ok, "{out}");
    assert!(layout_record(&dc1).contains(NEW_EPOCH));
    assert_eq!(
        layout_record(&dc2),
        before2,
        "run in dc1: dc2's record stays"
    );
    until_fenced(&a, &mut seen).await;
    // dc2's node fences at a mark renewal, by the primary's record.
    let why = until_fenced(&b, &mut seen).await;
    assert!(
        why.contains("layout.epoch: cluster has 2023-01-01T00:00:00Z"),
        "{why}"
    );
    assert!(why.contains("primary Consul datacenter \"dc1\""), "{why}");
    assert!(
        why.contains("the first to start brings this datacenter's own record to it"),
        "{why}"
    );
    let log = b.log_text().replace('\\', "");
    assert!(
        log.contains("high-water mark not written: the cluster layout recorded in the primary Consul datacenter \"dc1\""),
        "{log}"
    );

    let old_max = seen.iter().max().copied().unwrap_or(0);
    for node in [a, b] {
        assert!(node.terminate().success());
    }
    // dc2 keeps a copy of the primary's record: with dc1 down, a restart
    // on the old layout is still refused, by the copy.
    let mut copy = String::new();
    for _ in 0..200 {
        copy = dc2
            .kv_get("idgen/test/layout-confirmed")
            .map(|e| String::from_utf8_lossy(&e.value).into_owned())
            .unwrap_or_default();
        if copy.contains(NEW_EPOCH) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(copy.contains(NEW_EPOCH), "dc2's copy: {copy:?}");
    assert!(copy.contains("\"primary\":\"dc1\""), "{copy}");
    dc1.faults().datacenter_down(true);
    let log = ChildServer::try_start(&cfg_b, &[])
        .err()
        .expect("the old layout must be refused by the copy while dc1 is down")
        .replace('\\', "");
    assert!(
        log.contains("recorded at idgen/test/layout-confirmed"),
        "{log}"
    );
    assert!(
        log.contains("layout.epoch: cluster has 2023-01-01T00:00:00Z"),
        "{log}"
    );
    dc1.faults().datacenter_down(false);
    // Restarted on the old layout, dc2's node is refused by the primary's.
    let log = ChildServer::try_start(&cfg_b, &[])
        .err()
        .expect("the old layout must be refused after the change")
        .replace('\\', "");
    assert!(
        log.contains("layout.epoch: cluster has 2023-01-01T00:00:00Z"),
        "{log}"
    );
    assert!(log.contains("primary Consul datacenter \"dc1\""), "{log}");
    assert_eq!(
        layout_record(&dc2),
        before2,
        "a refused node changes nothing"
    );
    // On the new layout, the first node of dc2 brings dc2's own record to
    // the primary's (checked against dc2's marks), and both serve.
    let new_epoch = [("IDGEN_LAYOUT__EPOCH", "2023-01-01T00:00:00Z")];
    let b = ChildServer::try_start_env(&cfg_b, &[], &new_epoch)
        .unwrap_or_else(|log| panic!("dc2 follows the primary's layout: {log}"));
    assert!(layout_record(&dc2).contains(NEW_EPOCH));
    let a = ChildServer::try_start_env(&cfg_a, &[], &new_epoch)
        .unwrap_or_else(|log| panic!("the new layout starts: {log}"));
    for node in [&a, &b] {
        for id in common::snowflake_ids(node, 1000).await.expect("issues") {
            assert!(id > old_max, "new ID {id} not above old {old_max}");
            assert!(seen.insert(id), "ID {id} handed out twice");
        }
    }
    for node in [a, b] {
        assert!(node.terminate().success());
    }
}
