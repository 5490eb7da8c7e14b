//! Bad requests on both front ends of a node in this process: every bad
//! gRPC request gets the right code and a message that says what to fix,
//! every bad HTTP request a JSON error with the right status; the good
//! paths next to them still answer.

mod common;

use common::{test_config, TestServer};
use idgen::proto::{self, DecodeIdRequest, GenIdRequest, GenIdsRequest};
use tonic::Code;

#[tokio::test]
async fn grpc_bad_input_gets_the_right_code() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_config(dir.path())).await;
    let mut c = server.client().await;
    let count = |n| GenIdsRequest {
        count: n,
        ..Default::default()
    };
    let e = c.gen_ids(count(0)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("between 1 and 10000"),
        "{}",
        e.message()
    );
    let e = c.gen_ids(count(10_001)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(
        c.gen_ids(count(10_000))
            .await
            .unwrap()
            .into_inner()
            .ids
            .len(),
        10_000
    );

    let e = c
        .gen_id(GenIdRequest {
            mode: 99,
            tag: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("unknown mode"), "{}", e.message());
    for mode in [
        proto::Mode::Segment,
        proto::Mode::Lease,
        proto::Mode::Strict,
    ] {
        let e = c
            .gen_id(GenIdRequest {
                mode: mode as i32,
                tag: "orders".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{mode:?}");
        assert!(e.message().contains("not enabled"), "{}", e.message());
    }
    let e = c
        .gen_id(GenIdRequest {
            mode: proto::Mode::Snowflake as i32,
            tag: "orders".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // Decoding: a real ID round-trips; one with the sign bit set does not.
    let id = c
        .gen_id(GenIdRequest::default())
        .await
        .unwrap()
        .into_inner()
        .id;
    let d = c
        .decode_id(DecodeIdRequest {
            id,
            mode: 0,
            tag: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.id, id);
    assert_eq!((d.datacenter, d.worker), (0, 0));
    let age = idgen::id::Clock::now_millis(&idgen::id::SystemClock) - d.unix_millis;
    assert!(age < 60_000, "decoded time is now-ish, off by {age} ms");
    assert!(d.time.ends_with('Z'));
    let e = c
        .decode_id(DecodeIdRequest {
            id: 1 << 63,
            mode: 0,
            tag: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("not produced under this layout"),
        "{}",
        e.message()
    );
    server.stop().await;
}

#[tokio::test]
async fn http_bad_input_gets_a_json_error_with_the_right_status() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(test_config(dir.path())).await;
    let http = reqwest::Client::new();
    let cases = [
        ("/v1/ids?count=0", 400, "INVALID_ARGUMENT"),
        ("/v1/ids?count=10001", 400, "INVALID_ARGUMENT"),
        ("/v1/ids?count=abc", 400, "INVALID_ARGUMENT"),
        ("/v1/ids", 400, "INVALID_ARGUMENT"),
        ("/v1/ids?count=5&cout=5", 400, "INVALID_ARGUMENT"),
        ("/v1/id?mode=uuid", 400, "INVALID_ARGUMENT"),
        ("/v1/id?mode=segment&tag=orders", 400, "FAILED_PRECONDITION"),
        ("/v1/id?count=3", 400, "INVALID_ARGUMENT"),
        ("/v1/id?%zz", 400, "INVALID_ARGUMENT"),
        ("/v1/decode?id=-1", 400, "INVALID_ARGUMENT"),
        (
            "/v1/decode?id=18446744073709551615",
            400,
            "INVALID_ARGUMENT",
        ),
        ("/v1/decode", 400, "INVALID_ARGUMENT"),
        ("/v2/nothing", 404, "NOT_FOUND"),
    ];
    for (path, status, code) in cases {
        let resp = http.get(server.url(path)).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), status, "{path}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], code, "{path}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().len() > 10,
            "{path}: message says what was wrong"
        );
    }
    // And the good paths.
    let body: serde_json::Value = http
        .get(server.url("/v1/id"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id: u64 = body["id"].as_str().unwrap().parse().unwrap();
    let d: serde_json::Value = http
        .get(server.url(&format!("/v1/decode?id={id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(d["id"], id.to_string());
    assert_eq!(d["worker"], 0);
    for path in ["/healthz", "/readyz"] {
        let resp = http.get(server.url(path)).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{path}");
    }
    server.stop().await;
}
