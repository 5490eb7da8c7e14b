//! The admin API (`idgen.v1.Admin`) and `idgen admin` end to end, against
//! real `idgen serve` processes: the token check, segment tags with every
//! bad input, delete + re-create never repeating an ID, strict steps taking
//! effect, holders on both backends, and forced release on a two-node
//! Consul cluster (lock-delay 2 s).

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{run_idgen, write_child_config, write_cluster_config, ChildServer};
use consul_testserver::TestConsul;

use idgen::proto::admin_client::AdminClient;
use idgen::proto::{self, GenIdRequest, GenIdsRequest, HolderKind, Mode};
use tonic::transport::Channel;
use tonic::Code;

const TOKEN: &str = "s3cret-admin-token";
const LOCK_DELAY: Duration = Duration::from_secs(2);

/// A request carrying `authorization: Bearer <token>` (or no header).
fn auth<T>(token: Option<&str>, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

/// A request with the right token.
fn ok<T>(msg: T) -> tonic::Request<T> {
    auth(Some(TOKEN), msg)
}

async fn admin(node: &ChildServer) -> AdminClient<Channel> {
    AdminClient::connect(format!("http://{}", node.grpc))
        .await
        .expect("connects")
}

/// An embedded-store child config with `extra` TOML appended.
fn embedded_config(dir: &Path, extra: &str) -> PathBuf {
    let path = write_child_config(dir, true);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(extra);
    std::fs::write(&path, text).unwrap();
    path
}

fn all_modes(token: bool) -> String {
    let mut s = String::from(
        "[segment]\nenabled = true\n[strict]\nenabled = true\ndefault_step = 1\n\
         [lease]\nenabled = true\nzone = 3\ntoken = 2500\n\
         [node]\ndatacenter_id = 1\nworker_id = 7\ninstance_id = \"solo\"\n",
    );
    if token {
        s.push_str(&format!("[admin]\ntoken = \"{TOKEN}\"\n"));
    }
    s
}

fn create(tag: &str, initial: u64, step: u64) -> proto::CreateTagRequest {
    proto::CreateTagRequest {
        tag: tag.into(),
        initial,
        step,
        description: format!("{tag} numbers"),
        ..Default::default()
    }
}

fn update(
    tag: &str,
    step: Option<u64>,
    description: Option<&str>,
    max_id: Option<u64>,
) -> proto::UpdateTagRequest {
    proto::UpdateTagRequest {
        tag: tag.into(),
        step,
        description: description.map(str::to_owned),
        max_id,
    }
}

fn get(tag: &str) -> proto::GetTagRequest {
    proto::GetTagRequest { tag: tag.into() }
}

fn gen(mode: Mode, tag: &str, count: u32) -> GenIdsRequest {
    GenIdsRequest {
        mode: mode as i32,
        tag: tag.into(),
        count,
    }
}

fn code<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>) -> tonic::Status {
    r.expect_err("the call should fail")
}

fn release(kind: HolderKind, datacenter: u64, id: u64, force: bool) -> proto::ForceReleaseRequest {
    proto::ForceReleaseRequest {
        kind: kind as i32,
        datacenter,
        zone: 0,
        id,
        force,
        space: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_need_the_configured_token() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&embedded_config(dir.path(), &all_modes(true)));
    let mut c = admin(&node).await;
    let list = || proto::ListTagsRequest {};

    let e = code(c.list_tags(auth(None, list())).await);
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("authorization: Bearer"), "{e:?}");
    let mut basic = tonic::Request::new(list());
    basic
        .metadata_mut()
        .insert("authorization", format!("Basic {TOKEN}").parse().unwrap());
    assert_eq!(code(c.list_tags(basic).await).code(), Code::Unauthenticated);
    let e = code(c.list_tags(auth(Some("wrong"), list())).await);
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(!e.message().contains(TOKEN));
    let longer = format!("{TOKEN}x");
    let e = code(c.list_tags(auth(Some(&longer), list())).await);
    assert_eq!(e.code(), Code::PermissionDenied);
    // Every method is guarded, not just the reads.
    let e = code(c.create_tag(auth(Some("wrong"), create("t", 0, 1))).await);
    assert_eq!(e.code(), Code::PermissionDenied);
    let e = code(
        c.list_holders(auth(None, proto::ListHoldersRequest {}))
            .await,
    );
    assert_eq!(e.code(), Code::Unauthenticated);
    assert!(c.list_tags(ok(list())).await.is_ok());

    // Counted by method and code; the token never reaches the log.
    let metrics = reqwest::get(format!("http://{}/metrics", node.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "idgen_admin_calls_total{method=\"ListTags\",code=\"UNAUTHENTICATED\"} 2",
        "idgen_admin_calls_total{method=\"ListTags\",code=\"PERMISSION_DENIED\"} 2",
        "idgen_admin_calls_total{method=\"ListTags\",code=\"OK\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
    assert!(!node.log_text().contains(TOKEN), "the token was logged");
    drop(node);

    // No token on the server: the admin API is off for everyone.
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&embedded_config(dir.path(), &all_modes(false)));
    let mut c = admin(&node).await;
    for token in [Some(TOKEN), None] {
        let e = code(c.list_tags(auth(token, list())).await);
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("admin.token"), "{e:?}");
    }
}

/// Every bad tag request (the tag "orders" exists), with its code and a
/// message.
async fn every_bad_tag_request_gets_its_code(c: &mut AdminClient<Channel>) {
    // Every bad input, with its code.
    let bad: Vec<(tonic::Status, Code)> = vec![
        (
            code(c.create_tag(ok(create("Bad Tag", 0, 10))).await),
            Code::InvalidArgument,
        ),
        (
            code(c.create_tag(ok(create("", 0, 10))).await),
            Code::InvalidArgument,
        ),
        (
            code(c.create_tag(ok(create(&"x".repeat(65), 0, 10))).await),
            Code::InvalidArgument,
        ),
        (
            code(c.create_tag(ok(create("big", 0, 1_000_000_001))).await),
            Code::InvalidArgument,
        ),
        (
            code(c.create_tag(ok(create("high", u64::MAX, 10))).await),
            Code::InvalidArgument,
        ),
        (
            code(c.create_tag(ok(create("orders", 0, 10))).await),
            Code::AlreadyExists,
        ),
        (
            code(
                c.update_tag(ok(update("orders", Some(0), None, None)))
                    .await,
            ),
            Code::InvalidArgument,
        ),
        (
            code(
                c.update_tag(ok(update("orders", Some(1_000_000_001), None, None)))
                    .await,
            ),
            Code::InvalidArgument,
        ),
        (
            code(c.update_tag(ok(update("orders", None, None, None))).await),
            Code::InvalidArgument,
        ),
        (
            code(c.update_tag(ok(update("nope", Some(5), None, None))).await),
            Code::NotFound,
        ),
        (
            code(c.update_tag(ok(update("Nope!", Some(5), None, None))).await),
            Code::InvalidArgument,
        ),
        (code(c.get_tag(ok(get("nope"))).await), Code::NotFound),
        (
            code(c.get_tag(ok(get("NOPE"))).await),
            Code::InvalidArgument,
        ),
        (
            code(
                c.delete_tag(ok(proto::DeleteTagRequest { tag: "nope".into() }))
                    .await,
            ),
            Code::NotFound,
        ),
    ];
    for (i, (status, want)) in bad.iter().enumerate() {
        assert_eq!(status.code(), *want, "case {i}: {status:?}");
        assert!(
            !status.message().is_empty(),
            "case {i}: a message says what to do"
        );
    }
    let long = proto::CreateTagRequest {
        description: "d".repeat(2000),
        ..create("long", 0, 1)
    };
    assert_eq!(
        code(c.create_tag(ok(long)).await).code(),
        Code::InvalidArgument
    );
    assert!(
        code(c.create_tag(ok(create("big", 0, 1_000_000_001))).await)
            .message()
            .contains("1000000000")
    );
    assert!(code(c.get_tag(ok(get("nope"))).await)
        .message()
        .contains("nope"));
}

/// Segment or strict mode off: FAILED_PRECONDITION saying what to set.
async fn tag_and_step_calls_need_their_mode_on() {
    // Segment or strict mode off: FAILED_PRECONDITION saying what to set.
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&embedded_config(
        dir.path(),
        &format!("[admin]\ntoken = \"{TOKEN}\"\n"),
    ));
    let mut c = admin(&node).await;
    let e = code(c.create_tag(ok(create("orders", 0, 10))).await);
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("[segment] enabled = true"), "{e:?}");
    let e = code(c.list_tags(ok(proto::ListTagsRequest {})).await);
    assert_eq!(e.code(), Code::FailedPrecondition);
    let e = code(
        c.get_strict_step(ok(proto::GetStrictStepRequest {
            namespace: "books".into(),
        }))
        .await,
    );
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("[strict] enabled = true"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_are_created_read_listed_updated_and_deleted_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&embedded_config(dir.path(), &all_modes(true)));
    let mut c = admin(&node).await;

    let t = c
        .create_tag(ok(create("orders", 1000, 50)))
        .await
        .unwrap()
        .into_inner();
    let tag = t.tag.unwrap();
    assert_eq!(
        (tag.tag.as_str(), tag.max_id, tag.step),
        ("orders", 1000, 50)
    );
    assert_eq!(tag.description, "orders numbers");
    assert!(
        tag.created.ends_with('Z') && tag.created.contains('T'),
        "{tag:?}"
    );
    assert!(t.note.is_empty());
    // Defaults: initial 0 (first ID 1), step 1000.
    let d = c
        .create_tag(ok(proto::CreateTagRequest {
            tag: "defaults".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .tag
        .unwrap();
    assert_eq!((d.max_id, d.step), (0, 1000));

    // The first ID is initial + 1.
    let mut ids = node.client().await;
    let first = ids
        .gen_id(GenIdRequest {
            mode: Mode::Segment as i32,
            tag: "orders".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    assert_eq!(first, 1001);

    let got = c.get_tag(ok(get("orders"))).await.unwrap().into_inner();
    assert!(got.tag.unwrap().max_id >= 1050, "a range was taken");
    let names: Vec<String> = c
        .list_tags(ok(proto::ListTagsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .tags
        .into_iter()
        .map(|t| t.tag)
        .collect();
    assert_eq!(names, ["defaults", "orders"]);

    // Update: step, description, max_id forward.
    let u = c
        .update_tag(ok(update(
            "orders",
            Some(100),
            Some("renamed"),
            Some(1_000_000),
        )))
        .await
        .unwrap()
        .into_inner()
        .tag
        .unwrap();
    assert_eq!(
        (u.step, u.description.as_str(), u.max_id),
        (100, "renamed", 1_000_000)
    );
    let e = code(
        c.update_tag(ok(update("orders", None, None, Some(999_999))))
            .await,
    );
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("only move forward"), "{e:?}");
    assert!(
        e.message().contains("1000000"),
        "names the current max_id: {e:?}"
    );

    every_bad_tag_request_gets_its_code(&mut c).await;

    // Delete: gone from get and list, refused again.
    let del = c
        .delete_tag(ok(proto::DeleteTagRequest {
            tag: "defaults".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((del.tag.as_str(), del.max_id), ("defaults", 0));
    assert!(del.note.contains("tombstone"), "{del:?}");
    assert_eq!(
        code(c.get_tag(ok(get("defaults"))).await).code(),
        Code::NotFound
    );
    let names: Vec<String> = c
        .list_tags(ok(proto::ListTagsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .tags
        .into_iter()
        .map(|t| t.tag)
        .collect();
    assert_eq!(names, ["orders"]);
    drop(node);

    tag_and_step_calls_need_their_mode_on().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_and_recreated_tag_never_repeats_an_id() {
    let dir = tempfile::tempdir().unwrap();
    let config = embedded_config(dir.path(), &all_modes(true));
    let node = ChildServer::start(&config);
    let mut c = admin(&node).await;
    let mut ids = node.client().await;
    c.create_tag(ok(create("orders", 0, 10))).await.unwrap();
    let mut seen = HashSet::new();
    fn take(got: Vec<u64>, seen: &mut HashSet<u64>) {
        for id in got {
            assert!(seen.insert(id), "{id} handed out twice");
        }
    }
    let got = ids.gen_ids(gen(Mode::Segment, "orders", 35)).await.unwrap();
    take(got.into_inner().ids, &mut seen);

    let del = c
        .delete_tag(ok(proto::DeleteTagRequest {
            tag: "orders".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    let max_before = *seen.iter().max().unwrap();
    assert!(del.max_id >= max_before, "{del:?}");
    // The node may finish the range it holds (never handed out), then the
    // tag is unknown.
    let mut refused = None;
    for _ in 0..100 {
        match ids.gen_ids(gen(Mode::Segment, "orders", 1)).await {
            Ok(r) => take(r.into_inner().ids, &mut seen),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let refused = refused.expect("a deleted tag stops serving once its ranges run out");
    assert!(
        matches!(refused.code(), Code::NotFound | Code::Unavailable),
        "{refused:?}"
    );
    assert!(refused.message().contains("orders"), "{refused:?}");

    // Created again from 0: continues above everything handed out.
    let again = c
        .create_tag(ok(create("orders", 0, 10)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.tag.as_ref().unwrap().max_id, del.max_id);
    assert!(again.note.contains("deleted"), "{again:?}");
    let max_before = *seen.iter().max().unwrap();
    let got = ids
        .gen_ids(gen(Mode::Segment, "orders", 35))
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert!(got[0] > max_before, "{} <= {max_before}", got[0]);
    take(got, &mut seen);

    // The tombstone survives a restart.
    c.delete_tag(ok(proto::DeleteTagRequest {
        tag: "orders".into(),
    }))
    .await
    .unwrap();
    assert!(node.terminate().success());
    let node = ChildServer::start(&config);
    let mut c = admin(&node).await;
    assert_eq!(
        code(c.get_tag(ok(get("orders"))).await).code(),
        Code::NotFound
    );
    let mut ids = node.client().await;
    assert_eq!(
        code(ids.gen_ids(gen(Mode::Segment, "orders", 1)).await).code(),
        Code::NotFound
    );
    c.create_tag(ok(create("orders", 5, 10))).await.unwrap();
    let got = ids
        .gen_ids(gen(Mode::Segment, "orders", 50))
        .await
        .unwrap()
        .into_inner()
        .ids;
    let max_before = *seen.iter().max().unwrap();
    assert!(got[0] > max_before, "{} <= {max_before}", got[0]);
    take(got, &mut seen);
    assert!(seen.len() >= 120);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_steps_are_set_read_listed_and_used() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&embedded_config(dir.path(), &all_modes(true)));
    let mut c = admin(&node).await;
    let mut ids = node.client().await;
    let get_step = |ns: &str| proto::GetStrictStepRequest {
        namespace: ns.into(),
    };
    let set_step = |ns: &str, step| proto::SetStrictStepRequest {
        namespace: ns.into(),
        step,
    };

    let g = c
        .get_strict_step(ok(get_step("books")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((g.step, g.stored), (1, false), "the server default");
    let v = ids
        .gen_ids(gen(Mode::Strict, "books/b1", 2))
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert_eq!(v[1], v[0] + 1);

    let s = c
        .set_strict_step(ok(set_step("books", 5)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((s.namespace.as_str(), s.step, s.previous), ("books", 5, 1));
    let g = c
        .get_strict_step(ok(get_step("books")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((g.step, g.stored), (5, true));
    // The node where it was set forgets its cached step at once.
    let w = ids
        .gen_ids(gen(Mode::Strict, "books/b1", 3))
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert_eq!(w, [v[1] + 5, v[1] + 10, v[1] + 15]);
    c.set_strict_step(ok(set_step("chats", 2))).await.unwrap();
    // A namespace in use without a stored step is listed too, with the
    // default step it counts with.
    ids.gen_ids(gen(Mode::Strict, "aardvarks/a1", 1))
        .await
        .unwrap();
    let l = c
        .list_strict_namespaces(ok(proto::ListStrictNamespacesRequest {}))
        .await
        .unwrap()
        .into_inner();
    let listed: Vec<(&str, u64, bool)> = l
        .namespaces
        .iter()
        .map(|n| (n.namespace.as_str(), n.step, n.step_stored))
        .collect();
    assert_eq!(
        listed,
        [
            ("aardvarks", 1, false),
            ("books", 5, true),
            ("chats", 2, true)
        ]
    );
    assert_eq!(l.default_step, 1);

    for (req, what) in [
        (set_step("Bad/NS", 2), "namespace"),
        (set_step("", 2), "namespace"),
        (set_step("books", 0), "step"),
        (set_step("books", 1_000_001), "step"),
    ] {
        let e = code(c.set_strict_step(ok(req)).await);
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(what), "{e:?}");
    }
    let e = code(c.get_strict_step(ok(get_step("a b"))).await);
    assert_eq!(e.code(), Code::InvalidArgument);
    // A refused change changed nothing.
    let g = c
        .get_strict_step(ok(get_step("books")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(g.step, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_holders_show_this_node_and_nothing_can_be_released() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&embedded_config(dir.path(), &all_modes(true)));
    let mut c = admin(&node).await;
    let h = c
        .list_holders(ok(proto::ListHoldersRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(h.backend, "embedded");
    assert_eq!(h.holders.len(), 2, "{h:?}");
    let w = &h.holders[0];
    assert_eq!(w.kind, HolderKind::Worker as i32);
    assert_eq!((w.datacenter, w.id), (1, 7));
    assert_eq!(w.instance, "solo");
    assert_eq!(w.address, node.grpc.to_string());
    assert_eq!(w.state, "embedded (this node)");
    assert!(w.since.ends_with('Z'), "{w:?}");
    let t = &h.holders[1];
    assert_eq!(t.kind, HolderKind::LeaseToken as i32);
    assert_eq!((t.zone, t.id), (3, 2500));

    let e = code(
        c.force_release(ok(release(HolderKind::Worker, 1, 7, true)))
            .await,
    );
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("embedded"), "{e:?}");
    let e = code(
        c.force_release(ok(release(HolderKind::Unspecified, 0, 7, false)))
            .await,
    );
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("worker"), "{e:?}");

    // No datacenter id claims without Consul: listing and releasing are
    // refused, naming the setting that would allow them.
    let e = code(
        c.list_datacenters(ok(proto::ListDatacentersRequest {}))
            .await,
    );
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("store.backend = \"consul\""), "{e:?}");
    let e = code(
        c.release_datacenter(ok(proto::ReleaseDatacenterRequest { id: 1, force: true }))
            .await,
    );
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("store.backend = \"consul\""), "{e:?}");
}

fn cluster_node(dir: &Path, name: &str, consul: std::net::SocketAddr) -> ChildServer {
    let token = format!("\"{TOKEN}\"");
    let set: &[(&str, &str, &str)] = &[
        ("admin", "token", &token),
        ("lease", "enabled", "true"),
        ("lease", "block", "100"),
        ("segment", "enabled", "true"),
        ("strict", "enabled", "true"),
    ];
    ChildServer::start(&write_cluster_config(dir, name, consul, set))
}

async fn holders(c: &mut AdminClient<Channel>) -> Vec<proto::Holder> {
    let h = c
        .list_holders(ok(proto::ListHoldersRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(h.backend, "consul");
    h.holders
}

/// Snowflake and lease IDs from `node`, recorded in `seen` (no repeats).
async fn issue(node: &ChildServer, seen: &mut HashSet<u64>) -> Result<(), tonic::Status> {
    let mut c = node.client().await;
    for mode in [Mode::Snowflake, Mode::Lease] {
        for id in c.gen_ids(gen(mode, "", 150)).await?.into_inner().ids {
            assert!(seen.insert(id), "{mode:?} ID {id} handed out twice");
        }
    }
    Ok(())
}

/// Both nodes registered with every mode as a tag, and holding their worker
/// ids and lease tokens; n1's worker id and session.
async fn registered_with_their_holders(
    consul: &TestConsul,
    c: &mut AdminClient<Channel>,
    n1: &ChildServer,
) -> (u64, String) {
    // Each node registers the modes it serves as tags.
    let mut registered = 0;
    for _ in 0..100 {
        registered = consul.services().len();
        if registered == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(registered, 2, "both nodes registered");
    for service in consul.services() {
        for mode in ["snowflake", "segment", "lease", "strict", "formatted"] {
            assert!(
                service.tags.iter().any(|t| t == mode),
                "{mode} in {service:?}"
            );
        }
    }

    // Holders: both nodes' worker ids and lease tokens, alive.
    let hs = holders(c).await;
    assert_eq!(hs.len(), 4, "{hs:?}");
    let workers: Vec<&proto::Holder> = hs
        .iter()
        .filter(|h| h.kind == HolderKind::Worker as i32)
        .collect();
    let tokens: Vec<&proto::Holder> = hs
        .iter()
        .filter(|h| h.kind == HolderKind::LeaseToken as i32)
        .collect();
    assert_eq!((workers.len(), tokens.len()), (2, 2), "{hs:?}");
    for h in &hs {
        assert_eq!(h.state, "alive", "{h:?}");
        assert!(!h.session.is_empty() && h.since.ends_with('Z'), "{h:?}");
    }
    let w1 = workers
        .iter()
        .find(|h| h.instance == "n1")
        .expect("n1's worker");
    assert_eq!(w1.address, n1.grpc.to_string());
    let t1 = tokens
        .iter()
        .find(|h| h.instance == "n1")
        .expect("n1's token");
    assert_eq!(
        t1.session, w1.session,
        "the token is held under the worker session"
    );
    let (n1_worker, n1_session) = (w1.id, w1.session.clone());
    (n1_worker, n1_session)
}

/// n1's worker id released: refused while alive without `--force`, then
/// forced; n1 claims again and issues on, nothing repeated.
async fn force_release_a_live_worker(
    consul: &TestConsul,
    c: &mut AdminClient<Channel>,
    [n0, n1]: [&ChildServer; 2],
    (n1_worker, n1_session): (u64, String),
    seen: &mut HashSet<u64>,
) {
    // Never claimed: NOT_FOUND. Alive without --force: refused, naming it.
    let e = code(
        c.force_release(ok(release(HolderKind::Worker, 0, 30, false)))
            .await,
    );
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = code(
        c.force_release(ok(release(HolderKind::Worker, 0, n1_worker, false)))
            .await,
    );
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("n1") && e.message().contains("--force"),
        "{e:?}"
    );
    assert!(e.message().contains(&n1.grpc.to_string()), "{e:?}");
    assert!(consul.sessions().iter().any(|s| s.id == n1_session));

    // Forced: the session is destroyed and the call outlasts the lock-delay.
    let started = Instant::now();
    let r = c
        .force_release(ok(release(HolderKind::Worker, 0, n1_worker, true)))
        .await
        .unwrap()
        .into_inner();
    let took = started.elapsed();
    assert!(r.released, "{r:?}");
    assert!(
        took >= LOCK_DELAY,
        "returned after {took:?}, inside the lock-delay"
    );
    assert!(r.waited_ms >= LOCK_DELAY.as_millis() as u64, "{r:?}");
    assert!(
        r.message.contains("frees") || r.message.contains("freed"),
        "{r:?}"
    );
    assert_eq!(r.holder.as_ref().unwrap().instance, "n1");
    assert!(
        !consul.sessions().iter().any(|s| s.id == n1_session),
        "the holder's session is gone"
    );

    // n1 notices, claims again and keeps issuing, without duplicates.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // Issuing also makes n1 take a lease token again (lazily).
        let issued = issue(n1, seen).await;
        let hs = holders(c).await;
        let back = hs
            .iter()
            .filter(|h| h.instance == "n1" && h.state == "alive" && h.session != n1_session)
            .count();
        if back == 2 && issued.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "n1 did not come back: {issued:?} {hs:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    issue(n0, seen).await.unwrap();
    issue(n1, seen).await.unwrap();
}

/// A tag created on one node, deleted and re-created on the other.
async fn tags_across_nodes(
    c: &mut AdminClient<Channel>,
    c1: &mut AdminClient<Channel>,
    n0: &ChildServer,
    n1: &ChildServer,
) {
    // Tags in Consul: created on one node, deleted and re-created on the
    // other, never repeating an ID.
    c.create_tag(ok(create("orders", 0, 20))).await.unwrap();
    let mut got = HashSet::new();
    for n in [n0, n1] {
        let mut ids = n.client().await;
        for id in ids
            .gen_ids(gen(Mode::Segment, "orders", 30))
            .await
            .unwrap()
            .into_inner()
            .ids
        {
            assert!(got.insert(id));
        }
    }
    let del = c1
        .delete_tag(ok(proto::DeleteTagRequest {
            tag: "orders".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(del.max_id >= *got.iter().max().unwrap());
    assert_eq!(
        code(c.get_tag(ok(get("orders"))).await).code(),
        Code::NotFound
    );
    let again = c1
        .create_tag(ok(create("orders", 0, 20)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.tag.unwrap().max_id, del.max_id);
    let e = code(
        c.update_tag(ok(update("orders", None, None, Some(1))))
            .await,
    );
    assert_eq!(e.code(), Code::FailedPrecondition);
    let listed = c.list_tags(ok(proto::ListTagsRequest {})).await.unwrap();
    assert_eq!(listed.into_inner().tags.len(), 1);
}

/// A strict step set on n0 reaches n1 once its cache expires.
async fn strict_step_reaches_the_other_node(
    c: &mut AdminClient<Channel>,
    c1: &mut AdminClient<Channel>,
    n1: &ChildServer,
) {
    // Strict steps: set on n0, used by n1 once its 10 s cache expires.
    let mut ids1 = n1.client().await;
    let v = ids1
        .gen_ids(gen(Mode::Strict, "books/b1", 2))
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert_eq!(v[1], v[0] + 1);
    c.set_strict_step(ok(proto::SetStrictStepRequest {
        namespace: "books".into(),
        step: 7,
    }))
    .await
    .unwrap();
    let g = c1
        .get_strict_step(ok(proto::GetStrictStepRequest {
            namespace: "books".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (g.step, g.stored),
        (7, true),
        "stored in Consul for every node"
    );
    let deadline = Instant::now() + Duration::from_secs(12);
    loop {
        let w = ids1
            .gen_ids(gen(Mode::Strict, "books/b1", 2))
            .await
            .unwrap()
            .into_inner()
            .ids;
        if w[1] == w[0] + 7 {
            break;
        }
        assert_eq!(w[1], w[0] + 1, "old step until the cache expires");
        assert!(Instant::now() < deadline, "n1 still uses the old step");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// docs/ADMIN.md's releases on a Consul cluster, as written there. The
/// console's JSON API (`POST /admin/api/release`, the page's body) for a
/// stopped node's worker id `stopped`: nothing to do. Then `idgen admin
/// release --kind worker --datacenter 0 --id N` of n0's own, live, worker
/// id: refused without `--force`, naming it; with it, n0's session is
/// destroyed and the command says what that freed. n0 claims again and
/// issues on, nothing repeated.
async fn releases_as_the_admin_page_shows_them(
    c: &mut AdminClient<Channel>,
    n0: &ChildServer,
    stopped: u64,
    seen: &mut HashSet<u64>,
) {
    let body = format!(r#"{{"kind": "worker", "datacenter": 0, "id": {stopped}, "force": true}}"#);
    let r = reqwest::Client::new()
        .post(format!("http://{}/admin/api/release", n0.http))
        .bearer_auth(TOKEN)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .expect("the console API answers");
    assert_eq!(r.status().as_u16(), 200);
    let v: serde_json::Value = r.json().await.expect("a JSON reply");
    assert_eq!(v["released"], false, "{v}");
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("nothing to do")),
        "{v}"
    );

    let n0_worker = holders(c)
        .await
        .into_iter()
        .find(|h| h.instance == "n0" && h.kind == HolderKind::Worker as i32)
        .expect("n0 holds a worker id");
    let id = n0_worker.id.to_string();
    let release = [
        "release",
        "--kind",
        "worker",
        "--datacenter",
        "0",
        "--id",
        &id,
    ];
    let (ok_, out) = common::admin_cli(n0, TOKEN, &release).await;
    assert!(
        !ok_ && out.contains("FAILED_PRECONDITION") && out.contains("--force"),
        "{out}"
    );
    let (ok_, out) = common::admin_cli(n0, TOKEN, &[&release[..], &["--force"]].concat()).await;
    assert!(
        ok_ && out.contains(&format!("destroyed session {}", n0_worker.session))
            && out.contains("is free now"),
        "{out}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let issued = issue(n0, seen).await;
        if issued.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "n0 did not come back: {issued:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_holders_force_release_tags_and_steps() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let n0 = cluster_node(dir.path(), "n0", consul.addr());
    let n1 = cluster_node(dir.path(), "n1", consul.addr());
    let mut c = admin(&n0).await;
    let mut seen = HashSet::new();
    issue(&n0, &mut seen).await.unwrap();
    issue(&n1, &mut seen).await.unwrap();

    let (n1_worker, n1_session) = registered_with_their_holders(&consul, &mut c, &n1).await;

    force_release_a_live_worker(
        &consul,
        &mut c,
        [&n0, &n1],
        (n1_worker, n1_session),
        &mut seen,
    )
    .await;

    let mut c1 = admin(&n1).await;
    tags_across_nodes(&mut c, &mut c1, &n0, &n1).await;

    strict_step_reaches_the_other_node(&mut c, &mut c1, &n1).await;

    // After a clean stop the lock is released: nothing to do.
    let n1_now = holders(&mut c)
        .await
        .into_iter()
        .find(|h| h.instance == "n1" && h.kind == HolderKind::Worker as i32)
        .expect("n1 holds a worker id");
    assert!(n1.terminate().success());
    let r = c
        .force_release(ok(release(HolderKind::Worker, 0, n1_now.id, true)))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.released, "{r:?}");
    assert!(r.message.contains("nothing to do"), "{r:?}");
    let hs = holders(&mut c).await;
    let h = hs
        .iter()
        .find(|h| h.kind == HolderKind::Worker as i32 && h.id == n1_now.id)
        .expect("the key stays with its last holder");
    assert_eq!((h.state.as_str(), h.instance.as_str()), ("released", "n1"));
    assert!(h.session.is_empty());
    issue(&n0, &mut seen).await.unwrap();
    releases_as_the_admin_page_shows_them(&mut c, &n0, n1_now.id, &mut seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_manages_tags_and_steps_and_fails_on_a_wrong_token() {
    let dir = tempfile::tempdir().unwrap();
    let node = ChildServer::start(&embedded_config(dir.path(), &all_modes(true)));
    let addr = format!("http://{}", node.grpc);
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let tf = token_file.to_str().unwrap();
    let cli = |args: &[&str]| {
        let mut all = vec!["admin", "--addr", &addr];
        all.extend_from_slice(args);
        run_idgen(&all)
    };

    let (ok_, out) = cli(&[
        "--token",
        TOKEN,
        "tags",
        "create",
        "orders",
        "--initial",
        "10",
        "--step",
        "50",
    ]);
    assert!(ok_, "{out}");
    assert!(
        out.contains("created orders") && out.contains("max_id 10"),
        "{out}"
    );
    let (ok_, out) = cli(&["--token-file", tf, "tags", "list", "--json"]);
    assert!(ok_, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(v["tags"][0]["tag"], "orders");
    assert_eq!(v["tags"][0]["max_id"], "10", "IDs as decimal strings");
    assert_eq!(v["tags"][0]["step"], 50);
    let (ok_, out) = cli(&[
        "--token-file",
        tf,
        "tags",
        "update",
        "orders",
        "--max-id",
        "5",
    ]);
    assert!(!ok_, "{out}");
    assert!(out.contains("FAILED_PRECONDITION"), "{out}");

    let (ok_, out) = cli(&["--token-file", tf, "strict", "set-step", "books", "4"]);
    assert!(ok_, "{out}");
    assert!(out.contains("step 4"), "{out}");
    let (ok_, out) = cli(&["--token-file", tf, "strict", "get-step", "books", "--json"]);
    assert!(ok_, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(
        (v["step"].as_u64(), v["stored"].as_bool()),
        (Some(4), Some(true))
    );
    let (ok_, out) = cli(&["--token-file", tf, "holders"]);
    assert!(
        ok_ && out.contains("worker 1/7") && out.contains("solo"),
        "{out}"
    );

    // Errors: the gRPC code and message, and a failing exit status.
    let (ok_, out) = cli(&["--token", "wrong", "tags", "list"]);
    assert!(!ok_, "{out}");
    assert!(
        out.contains("PERMISSION_DENIED") && out.contains("admin token is wrong"),
        "{out}"
    );
    let (ok_, out) = cli(&["tags", "list"]);
    assert!(!ok_, "{out}");
    assert!(out.contains("UNAUTHENTICATED"), "{out}");
    let (ok_, out) = cli(&["--token", TOKEN, "strict", "set-step", "books", "0"]);
    assert!(!ok_ && out.contains("INVALID_ARGUMENT"), "{out}");
    let (ok_, out) = cli(&["--token", TOKEN, "release", "--kind", "disk", "--id", "1"]);
    assert!(
        !ok_ && out.contains("use worker, lease-token or format-token"),
        "{out}"
    );
}

/// `admin strict keys` lists the tombstones after the live keys, with
/// their last values (`books/b`, deleted after handing out 1).
fn strict_keys_lists_the_tombstone_of_books_b(cli: &dyn Fn(&[&str]) -> (bool, String)) {
    let (ok_, out) = cli(&["keys", "books"]);
    assert!(
        ok_ && out.contains("deleted keys (tombstones")
            && out.contains("books/b\tdeleted, last value 1"),
        "{out}"
    );
    let (ok_, out) = cli(&["keys", "books", "--json"]);
    assert!(ok_, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    let tombstones = v["tombstones"].as_array().expect("tombstones");
    assert!(
        tombstones
            .iter()
            .any(|t| t["key"] == "books/b" && t["value"] == "1"),
        "{v}"
    );
}

/// The limits end to end on a real node: auto-created and admin-created
/// tags past `segment.max_tags`, and strict keys past
/// `strict.max_keys_per_namespace`, answer RESOURCE_EXHAUSTED naming the
/// setting; existing ones keep working; deleting one (admin API and CLI)
/// frees a slot; a deleted strict key used again continues above its
/// last value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_refuse_the_next_tag_or_key_and_deleting_frees_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "[segment]\nenabled = true\nauto_create = true\ndefault_step = 10\nmax_tags = 2\n\
         [strict]\nenabled = true\nmax_keys_per_namespace = 2\nmax_namespaces = 5\n\
         [node]\ndatacenter_id = 1\nworker_id = 7\ninstance_id = \"solo\"\n\
         [admin]\ntoken = \"{TOKEN}\"\n"
    );
    let node = ChildServer::start(&embedded_config(dir.path(), &extra));
    let mut c = admin(&node).await;
    let mut ids = node.client().await;

    // Tags: two auto-created, the third refused (auto or admin).
    let t1 = ids
        .gen_ids(gen(Mode::Segment, "t1", 3))
        .await
        .unwrap()
        .into_inner()
        .ids;
    ids.gen_ids(gen(Mode::Segment, "t2", 1)).await.unwrap();
    let e = code(ids.gen_ids(gen(Mode::Segment, "t3", 1)).await);
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("segment.max_tags"), "{e:?}");
    assert!(
        e.message()
            .starts_with("segment tag \"t3\" cannot be created"),
        "{e:?}"
    );
    let e = code(c.create_tag(ok(create("t4", 0, 10))).await);
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    // Nothing was created by the refusals.
    let listed = c
        .list_tags(ok(proto::ListTagsRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.tags.len(), 2, "{listed:?}");
    let more = ids
        .gen_ids(gen(Mode::Segment, "t1", 1))
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert!(more[0] > t1[2]);
    // Deleting t2 frees a slot for t3.
    c.delete_tag(ok(proto::DeleteTagRequest { tag: "t2".into() }))
        .await
        .unwrap();
    ids.gen_ids(gen(Mode::Segment, "t3", 1)).await.unwrap();

    // Strict keys: two per namespace.
    let a = ids
        .gen_ids(gen(Mode::Strict, "books/a", 3))
        .await
        .unwrap()
        .into_inner()
        .ids;
    ids.gen_ids(gen(Mode::Strict, "books/b", 1)).await.unwrap();
    let e = code(ids.gen_ids(gen(Mode::Strict, "books/c", 1)).await);
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("strict.max_keys_per_namespace")
            && e.message()
                .starts_with("strict key \"books/c\" cannot be created"),
        "{e:?}"
    );
    let keys = c
        .list_strict_keys(ok(proto::ListStrictKeysRequest {
            namespace: "books".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    let listed: Vec<(String, u64)> = keys.keys.into_iter().map(|k| (k.key, k.value)).collect();
    assert_eq!(
        listed,
        [("books/a".to_owned(), a[2]), ("books/b".to_owned(), 1)]
    );
    assert_eq!(keys.max_keys, 2);
    let d = c
        .delete_strict_key(ok(proto::DeleteStrictKeyRequest {
            key: "books/a".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.last_value, a[2]);
    let e = code(
        c.delete_strict_key(ok(proto::DeleteStrictKeyRequest {
            key: "books/a".into(),
        }))
        .await,
    );
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = code(
        c.delete_strict_key(ok(proto::DeleteStrictKeyRequest {
            key: "no-slash".into(),
        }))
        .await,
    );
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    // Used again: above its last value, never a repeat.
    let again = ids
        .gen_ids(gen(Mode::Strict, "books/a", 1))
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert_eq!(again, [a[2] + 1]);

    // The CLI lists and deletes too.
    let addr = format!("http://{}", node.grpc);
    let cli = |args: &[&str]| {
        let mut all = vec!["admin", "--addr", &addr, "--token", TOKEN, "strict"];
        all.extend_from_slice(args);
        run_idgen(&all)
    };
    let (ok_, out) = cli(&["keys", "books", "--json"]);
    assert!(ok_, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect(&out);
    assert_eq!(v["keys"][0]["key"], "books/a");
    assert_eq!(v["keys"][0]["value"], (a[2] + 1).to_string());
    let (ok_, out) = cli(&["delete", "books/b"]);
    assert!(ok_ && out.contains("tombstone"), "{out}");
    ids.gen_ids(gen(Mode::Strict, "books/c", 1)).await.unwrap();
    let (ok_, out) = cli(&["delete", "books/b"]);
    assert!(!ok_ && out.contains("NOT_FOUND"), "{out}");
    strict_keys_lists_the_tombstone_of_books_b(&cli);

    // Counted, with the limit's config key as the only label.
    let metrics = reqwest::get(format!("http://{}/metrics", node.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "idgen_limit_refusals_total{limit=\"segment.max_tags\"} 2",
        "idgen_limit_refusals_total{limit=\"strict.max_keys_per_namespace\"} 1",
        "idgen_segment_tags 2",
        "idgen_segment_tag_buffers 2",
        "idgen_segment_buffers_released_total{reason=\"deleted\"} 1",
        "idgen_strict_keys 2",
        "idgen_strict_namespaces 1",
    ] {
        assert!(metrics.contains(line), "{line} missing from:\n{metrics}");
    }
}
