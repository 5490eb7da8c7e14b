//! Segment mode over gRPC on the embedded store: uniqueness under
//! concurrent callers, strict increase per node and tag, bad input, and
//! no reuse across a clean restart or a kill -9.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{call_until_stopped, test_config, ChildServer, TestServer};
use idgen::config::SegmentModeSettings;
use idgen::proto::{DecodeIdRequest, GenIdRequest, GenIdsRequest, Mode};

fn segment_config(dir: &std::path::Path, auto_create: bool) -> idgen::config::Config {
    let mut c = test_config(dir);
    c.segment = Some(SegmentModeSettings {
        auto_create,
        default_step: 500,
        max_step: 100_000,
        ..SegmentModeSettings::default()
    });
    c
}

fn req(tag: &str, count: u32) -> GenIdsRequest {
    GenIdsRequest {
        mode: Mode::Segment as i32,
        tag: tag.into(),
        count,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_ids_are_unique_and_increase_per_tag_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(segment_config(dir.path(), true)).await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let mut c = server.client().await;
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for j in 0..40 {
                let n = 1 + ((i * 7 + j * 13) % 300) as u32;
                let ids = c.gen_ids(req("orders", n)).await.unwrap().into_inner().ids;
                assert_eq!(ids.len(), n as usize);
                got.extend(ids);
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        let got = t.await.unwrap();
        // Each caller sees strictly increasing IDs (one node, one tag).
        assert!(got.windows(2).all(|w| w[0] < w[1]));
        all.extend(got);
    }
    let distinct: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "duplicates");
    // Tags are independent sequences.
    let mut c = server.client().await;
    let other = c
        .gen_id(GenIdRequest {
            mode: Mode::Segment as i32,
            tag: "users".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .id;
    assert_eq!(other, 1);
    // The JSON API serves the same sequences.
    let body: serde_json::Value =
        reqwest::get(server.url("/v1/ids?mode=segment&tag=users&count=2"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    assert_eq!(body["ids"], serde_json::json!(["2", "3"]));
    server.stop().await;

    // A restart continues above every ID handed out (ranges are durable).
    let server = TestServer::start(segment_config(dir.path(), true)).await;
    let mut c = server.client().await;
    let next = c.gen_ids(req("orders", 10)).await.unwrap().into_inner().ids;
    let max_before = *all.iter().max().unwrap();
    assert!(next[0] > max_before, "{} <= {max_before}", next[0]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_segment_requests_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(segment_config(dir.path(), false)).await;
    let mut c = server.client().await;
    let code =
        |r: Result<tonic::Response<idgen::proto::GenIdsResponse>, tonic::Status>| r.unwrap_err();
    let e = code(c.gen_ids(req("unknown", 1)).await);
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(e.message().contains("unknown"), "{e:?}");
    let e = code(c.gen_ids(req("Bad Tag", 1)).await);
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = code(c.gen_ids(req("", 1)).await);
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("needs a tag"), "{e:?}");
    let e = code(c.gen_ids(req("orders", 0)).await);
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = c
        .decode_id(DecodeIdRequest {
            id: 5,
            mode: Mode::Segment as i32,
            tag: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    server.stop().await;

    // Not enabled: FAILED_PRECONDITION that says how to enable it.
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_config(dir.path())).await;
    let mut c = server.client().await;
    let e = code(c.gen_ids(req("orders", 1)).await);
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("[segment]"), "{e:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_load_never_leads_to_reuse() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::write_child_config(dir.path(), true);
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("[segment]\nenabled = true\nauto_create = true\ndefault_step = 100\n");
    std::fs::write(&config, text).unwrap();
    let mut seen = HashSet::new();
    for round in 0..3 {
        let node = ChildServer::start(&config);
        // Callers still in flight when the kill lands; small batches on
        // ranges of 100 mean a refill is running most of the time.
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let c = node.client().await;
            tasks.push(call_until_stopped(c, req("orders", 37), Arc::clone(&stop)));
        }
        let mut c = node.client().await;
        let mut mine = 0;
        for _ in 0..50 {
            let ids = c.gen_ids(req("orders", 37)).await.unwrap().into_inner().ids;
            mine += ids.len();
            for id in ids {
                assert!(seen.insert(id), "round {round}: {id} handed out twice");
            }
        }
        node.kill();
        stop.store(true, Ordering::SeqCst);
        let mut theirs = 0;
        for t in tasks {
            for id in t.await.unwrap() {
                theirs += 1;
                assert!(seen.insert(id), "round {round}: {id} handed out twice");
            }
        }
        assert_eq!(mine, 50 * 37);
        assert!(theirs > 0, "round {round}: the concurrent callers got IDs");
    }
}

fn admin_req<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", "Bearer seg-admin".parse().unwrap());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_tag_stays_deleted_with_auto_create_and_comes_back_above_its_old_ids() {
    use idgen::proto::admin_client::AdminClient;
    use idgen::proto::{CreateTagRequest, DeleteTagRequest, GetTagRequest};
    let dir = tempfile::tempdir().unwrap();
    let mut config = segment_config(dir.path(), true);
    config.admin.token = Some(idgen::config::AdminToken("seg-admin".into()));
    let server = TestServer::start(config).await;
    let mut admin = AdminClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    admin
        .create_tag(admin_req(CreateTagRequest {
            tag: "invoices".into(),
            step: 30,
            description: "settings to keep".into(),
            ..Default::default()
        }))
        .await
        .unwrap();
    let mut c = server.client().await;
    let old = c
        .gen_ids(req("invoices", 50))
        .await
        .unwrap()
        .into_inner()
        .ids;
    let old_max = *old.iter().max().unwrap();
    admin
        .delete_tag(admin_req(DeleteTagRequest {
            tag: "invoices".into(),
        }))
        .await
        .unwrap();
    // Auto-creation is on, yet every call is refused and issues nothing.
    for _ in 0..3 {
        let e = c.gen_ids(req("invoices", 5)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
        assert!(e.message().contains("was deleted at"), "{e:?}");
        assert!(e.message().contains("idgen admin tags create"), "{e:?}");
    }
    let e = admin
        .get_tag(admin_req(GetTagRequest {
            tag: "invoices".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "not recreated: {e:?}");
    // An explicit create brings it back, above every ID it handed out.
    admin
        .create_tag(admin_req(CreateTagRequest {
            tag: "invoices".into(),
            step: 30,
            description: "back".into(),
            ..Default::default()
        }))
        .await
        .unwrap();
    let new = c
        .gen_ids(req("invoices", 50))
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert!(new.iter().all(|id| *id > old_max), "{old_max} vs {new:?}");
    server.stop().await;
}
