//! A Lua rule stuck where its deadline cannot stop it costs the node one
//! thread, not its service: on a real node (gRPC and HTTP ports), a call
//! stuck inside a library function answers FAILED_PRECONDITION naming the
//! rule and the deadline, while snowflake GenId, `/healthz` and another
//! format keep answering; with every Lua thread stuck, Lua calls fail at
//! once with UNAVAILABLE and the rest of the node still answers.
//!
//! The sandbox bounds every library loop known to be long, so the stuck
//! call is simulated: `__test_stall(ms)` (enabled by
//! `lua_sandbox::allow_test_stall`, tests only) sleeps in Rust, where the
//! count hook never runs, exactly as a C loop would.

mod common;

use std::time::Duration;

use common::{metric, test_config, TestServer};
use idgen::config::FormattedSettings;
use idgen::id::format::{FormatDef, Reset};
use idgen::proto::{GenFormattedRequest, GenIdRequest, Mode};
use tonic::Code;

/// Generous bound on any answer: the node answers in milliseconds; a
/// blocked runtime would not answer until the stall ends (a minute).
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

fn lua(name: &str, prefix: &str) -> FormatDef {
    let mut def = FormatDef::template(name, "", "UTC", Reset::Never);
    def.template = None;
    def.reset = None;
    def.lua = Some(format!(
        "function min_counter() return 0 end\nfunction max_counter() return 999999999 end\nfunction reset_seconds() return 0 end\nfunction create_id(counter, now, salt)\n  if salt == 'stall' then __test_stall(60000) end\n  return string.format('{prefix}%09d', counter)\nend\n"
    ));
    def
}

async fn gen_formatted(
    server: &TestServer,
    format: &str,
    salt: Option<&str>,
) -> Result<Vec<String>, tonic::Status> {
    let mut client = server.client().await;
    let request = GenFormattedRequest {
        format: format.into(),
        params: salt
            .map(|s| [("salt".to_owned(), s.to_owned())].into())
            .unwrap_or_default(),
        count: 2,
    };
    let call = client.gen_formatted(request);
    let answer = tokio::time::timeout(ANSWER_WITHIN, call)
        .await
        .unwrap_or_else(|_| {
            panic!("GenFormatted {format} did not answer within {ANSWER_WITHIN:?}")
        });
    answer.map(|r| r.into_inner().ids)
}

/// Snowflake GenId and `/healthz` answer, within the bound.
async fn rest_of_node_answers(server: &TestServer) {
    let mut client = server.client().await;
    let id = tokio::time::timeout(
        ANSWER_WITHIN,
        client.gen_id(GenIdRequest {
            mode: Mode::Snowflake as i32,
            tag: String::new(),
        }),
    )
    .await
    .expect("GenId answers while a Lua call is stuck")
    .expect("GenId succeeds");
    assert!(id.into_inner().id > 0);
    let health = tokio::time::timeout(ANSWER_WITHIN, reqwest::get(server.url("/healthz")))
        .await
        .expect("/healthz answers while a Lua call is stuck")
        .expect("/healthz reachable");
    assert_eq!(health.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_lua_call_fails_alone_and_the_node_keeps_answering() {
    idgen::id::format::lua_sandbox::allow_test_stall();
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.formatted = FormattedSettings {
        block: 10,
        formats: vec![lua("stuck", "S"), lua("stuck2", "T"), lua("other", "O")],
        lua_deadline: Duration::from_millis(50),
        lua_workers: 1,
        ..FormattedSettings::default()
    };
    let server = TestServer::start(config).await;
    assert_eq!(
        gen_formatted(&server, "other", None).await.unwrap(),
        ["O000000000", "O000000001"]
    );

    // The stuck call answers, naming the rule and the deadline.
    let err = gen_formatted(&server, "stuck", Some("stall"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("rule stuck") && err.message().contains("50 ms deadline"),
        "{err:?}"
    );
    // Its thread was replaced: the rest of the node, and another format,
    // answer; the stuck rule itself fails at once while its call runs.
    rest_of_node_answers(&server).await;
    let other = gen_formatted(&server, "other", None).await.unwrap();
    assert_eq!(other.len(), 2);
    let busy = gen_formatted(&server, "stuck", None).await.unwrap_err();
    assert_eq!(busy.code(), Code::FailedPrecondition, "{busy:?}");
    assert!(busy.message().contains("still running"), "{busy:?}");

    // A second rule stuck: more threads set aside than lua_workers, so no
    // replacement; Lua calls fail at once, UNAVAILABLE, and say why.
    let err = gen_formatted(&server, "stuck2", Some("stall"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let none = gen_formatted(&server, "other", None).await.unwrap_err();
    assert_eq!(none.code(), Code::Unavailable, "{none:?}");
    assert!(none.message().contains("no Lua worker free"), "{none:?}");
    rest_of_node_answers(&server).await;

    let text = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        metric(&text, "idgen_lua_workers_aside"),
        Some(2.0),
        "{text}"
    );
    assert!(
        text.contains("idgen_lua_stuck_calls_total{format=\"stuck\"} 1"),
        "{text}"
    );
    tokio::time::timeout(ANSWER_WITHIN, server.stop())
        .await
        .expect("the node stops with Lua threads stuck");
}
