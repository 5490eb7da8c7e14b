//! The admin console's JSON API (`/admin/api/...`) and its page, against a
//! node in this process: the same credentials as the gRPC admin service
//! (401 without a token, 403 for a wrong one, 403 for a peer outside
//! `admin.allow`, a client certificate over TLS), off without any
//! credential, the shape of every endpoint, the cross-site checks on
//! changes, and `RenewSession` plus lock-delay and TTL of holders on a
//! Consul node.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{
    all_modes_config, test_config, write_cluster_config, write_datacenter_config, ChildServer,
    TestServer,
};
use idgen::config::{AdminToken, AllowList, TlsSettings};
use idgen::proto::admin_client::AdminClient;
use idgen::proto::{self, HolderKind};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

const TOKEN: &str = "console-api-token";

fn ok<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    r
}

/// A GET with `Authorization: Bearer <token>` when given: status, headers,
/// JSON body (`Null` when not JSON).
async fn get(
    server: &TestServer,
    path: &str,
    token: Option<&str>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut req = reqwest::Client::new().get(server.url(path));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("HTTP answer");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let body = r.json().await.unwrap_or(Value::Null);
    (status, headers, body)
}

/// A POST of `body` (JSON unless `content_type` says otherwise).
async fn post(
    server: &TestServer,
    path: &str,
    body: &str,
    content_type: &str,
    origin: Option<&str>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(server.url(path))
        .bearer_auth(TOKEN)
        .header("content-type", content_type)
        .body(body.to_owned());
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    let r = req.send().await.expect("HTTP answer");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn error_of(body: &Value) -> (&str, &str) {
    (
        body["error"]["code"].as_str().unwrap_or_default(),
        body["error"]["message"].as_str().unwrap_or_default(),
    )
}

fn with_token(dir: &Path) -> idgen::config::Config {
    let mut c = all_modes_config(dir);
    c.admin.token = Some(AdminToken(TOKEN.into()));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_api_needs_the_admin_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(with_token(dir.path())).await;

    let (status, headers, body) = get(&server, "/admin/api/holders", None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(error_of(&body).0, "UNAUTHENTICATED", "{body}");
    assert!(error_of(&body).1.contains("Bearer"), "{body}");
    assert!(headers["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Bearer"));

    for path in [
        "/admin/api/holders",
        "/admin/api/tags",
        "/admin/api/formats",
    ] {
        let (status, _, body) = get(&server, path, Some("not-the-token")).await;
        assert_eq!(status, 403, "{path}: {body}");
        let (code, message) = error_of(&body);
        assert_eq!(code, "PERMISSION_DENIED", "{path}: {body}");
        assert!(
            message.contains("wrong") && message.contains("admin.token"),
            "{body}"
        );
        assert!(!body.to_string().contains(TOKEN), "the token never shows");
    }
    let (status, body) = {
        let r = reqwest::Client::new()
            .post(server.url("/admin/api/release"))
            .bearer_auth("not-the-token")
            .json(&json!({"kind": "worker", "id": 0, "force": true}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_error((status, &body), 403, "PERMISSION_DENIED", "");

    let (status, _, _) = get(&server, "/admin/api/holders", Some(TOKEN)).await;
    assert_eq!(status, 200);
    server.stop().await;
}

/// A JSON POST of `body` with the token, from no origin.
async fn post_json(server: &TestServer, path: &str, body: &str) -> (u16, Value) {
    post(server, path, body, "application/json", None).await
}

/// `(got, body)` is an error with this HTTP `status` and gRPC `code`
/// whose message says `says`.
fn assert_error((got, body): (u16, &Value), status: u16, code: &str, says: &str) {
    assert_eq!((got, error_of(body).0), (status, code), "{body}");
    assert!(
        error_of(body).1.contains(says),
        "the message says {says:?}: {body}"
    );
}

/// Calls the embedded backend cannot serve, bad bodies, a foreign origin,
/// an unknown path: each answered with its status and the reason.
async fn refusals_answer_with_the_reason(server: &TestServer) {
    let t = Some(TOKEN);
    // Calls the backend cannot serve: the gRPC service's own refusal.
    let (status, _, layout) = get(server, "/admin/api/layout", t).await;
    assert_error((status, &layout), 400, "FAILED_PRECONDITION", "embedded");
    let release = r#"{"kind": "worker", "datacenter": 0, "id": 0, "force": true}"#;
    let (status, r) = post_json(server, "/admin/api/release", release).await;
    assert_error((status, &r), 400, "FAILED_PRECONDITION", "embedded");
    let (status, r) = post_json(server, "/admin/api/renew", r#"{"session": "abc"}"#).await;
    assert_error(
        (status, &r),
        400,
        "FAILED_PRECONDITION",
        "no Consul session",
    );

    // Bad bodies, each with the reason.
    let bad = [
        (r#"{"kind": "node", "id": 1}"#, "kind"),
        (r#"{"kind": "worker", "id": 1, "extra": 1}"#, "extra"),
        (r#"{"kind": "worker", "id": -1}"#, "id"),
        ("not json", "JSON"),
        (
            r#"{"kind": "lease_token", "datacenter": 1, "id": 1}"#,
            "zone",
        ),
    ];
    for (body, says) in bad {
        let (status, r) = post_json(server, "/admin/api/release", body).await;
        assert_error((status, &r), 400, "INVALID_ARGUMENT", says);
    }
    let (status, r) = post(server, "/admin/api/release", "{}", "text/plain", None).await;
    assert_eq!(status, 415, "{r}");
    assert!(error_of(&r).1.contains("application/json"), "{r}");
    let evil = Some("http://evil.example");
    let (status, r) = post(
        server,
        "/admin/api/renew",
        r#"{"session": "abc"}"#,
        "application/json",
        evil,
    )
    .await;
    assert_error((status, &r), 403, "PERMISSION_DENIED", "origin");
    let (status, _, r) = get(server, "/admin/api/nope", t).await;
    assert_error((status, &r), 404, "NOT_FOUND", "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_console_endpoint_answers_in_its_shape() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(with_token(dir.path())).await;
    let mut admin = AdminClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    admin
        .create_tag(ok(proto::CreateTagRequest {
            tag: "orders".into(),
            step: 10,
            initial: 9_007_199_254_740_993,
            description: "<b>not html</b>".into(),
            ..Default::default()
        }))
        .await
        .unwrap();
    admin
        .set_strict_step(ok(proto::SetStrictStepRequest {
            namespace: "books".into(),
            step: 5,
        }))
        .await
        .unwrap();
    let t = Some(TOKEN);

    let (status, _, h) = get(&server, "/admin/api/holders", t).await;
    assert_eq!(status, 200, "{h}");
    assert_eq!(h["backend"], "embedded");
    let holders = h["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "worker id and lease token: {h}");
    assert_eq!(holders[0]["kind"], "worker");
    assert_eq!(holders[0]["state"], "embedded (this node)");
    assert!(
        holders[0]["address"]
            .as_str()
            .is_some_and(|a| !a.is_empty()),
        "{h}"
    );
    assert_eq!(holders[1]["kind"], "lease_token");
    for key in [
        "datacenter",
        "zone",
        "id",
        "lock_delay_ms",
        "session_ttl_ms",
    ] {
        assert!(holders[0][key].is_u64(), "{key}: {h}");
    }
    assert!(holders[0]["reserved"].is_string(), "{h}");

    let (status, _, tags) = get(&server, "/admin/api/tags", t).await;
    assert_eq!(status, 200, "{tags}");
    assert_eq!(tags["tags"][0]["tag"], "orders");
    assert_eq!(
        tags["tags"][0]["max_id"], "9007199254740993",
        "above 2^53: a string, exact"
    );
    assert_eq!(tags["tags"][0]["step"], 10);
    assert_eq!(tags["tags"][0]["description"], "<b>not html</b>");
    assert_eq!(tags["unreadable"], json!([]));

    let (status, _, strict) = get(&server, "/admin/api/strict", t).await;
    assert_eq!(status, 200, "{strict}");
    assert_eq!(
        strict["namespaces"],
        json!([{"namespace": "books", "step": 5, "step_stored": true}])
    );
    assert_eq!(strict["default_step"], 1);

    // Formatted mode is always on (formats can be created through the
    // admin API at any time); this node has none yet.
    let (status, _, formats) = get(&server, "/admin/api/formats", t).await;
    assert_eq!(
        (status, &formats),
        (200, &json!({"enabled": true, "formats": []}))
    );

    refusals_answer_with_the_reason(&server).await;

    // Every call was counted like a gRPC admin call.
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // (Other tests in this process add to the same counters.)
    for series in [
        r#"idgen_admin_calls_total{method="ListHolders",code="OK"}"#,
        r#"idgen_admin_calls_total{method="ConsoleFormats",code="OK"}"#,
        r#"idgen_admin_calls_total{method="ForceRelease",code="FAILED_PRECONDITION"}"#,
    ] {
        assert!(
            common::metric(&metrics, series).unwrap_or(0.0) >= 1.0,
            "{series}: {metrics}"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_with_a_strict_policy_and_only_when_admin_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(with_token(dir.path())).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = client.get(server.url("/admin")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 308);
    assert_eq!(r.headers()["location"], "/admin/");
    for (path, ty) in [
        ("/admin/", "text/html"),
        ("/admin/console.js", "text/javascript"),
        ("/admin/console.css", "text/css"),
        ("/admin/favicon.svg", "image/svg+xml"),
    ] {
        let r = client.get(server.url(path)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
        let h = r.headers().clone();
        assert!(
            h["content-type"].to_str().unwrap().starts_with(ty),
            "{path}"
        );
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("default-src 'none'")
                && csp.contains("script-src 'self'")
                && csp.contains("frame-ancestors 'none'")
                && !csp.contains("unsafe"),
            "{path}: {csp}"
        );
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["cache-control"], "no-store", "{path}");
        let text = r.text().await.unwrap();
        assert!(!text.contains(TOKEN), "{path}: no secret in the assets");
    }
    server.stop().await;

    // No admin credential: the page is not served, the API says why.
    let dir = tempfile::tempdir().unwrap();
    let off = TestServer::start(all_modes_config(dir.path())).await;
    let r = reqwest::get(off.url("/admin/")).await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("disabled") && text.contains("admin.token"),
        "{text}"
    );
    let (status, _, body) = get(&off, "/admin/api/holders", Some("anything")).await;
    assert_error((status, &body), 403, "PERMISSION_DENIED", "disabled");
    off.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_allow_refuses_the_console_api_by_peer_address() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = with_token(dir.path());
    config.admin.allow = AllowList::parse(&["10.0.0.0/8".into()]).unwrap();
    let server = TestServer::start(config).await;
    let (status, _, body) = get(&server, "/admin/api/holders", Some(TOKEN)).await;
    assert_eq!(status, 403, "{body}");
    let (code, message) = error_of(&body);
    assert_eq!(code, "PERMISSION_DENIED");
    assert!(
        message.contains("admin.allow") && message.contains("127.0.0.1"),
        "{body}"
    );
    // IDs are still served to that peer; only admin is refused.
    let r = reqwest::get(server.url("/v1/id")).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        common::metric(
            &metrics,
            r#"idgen_peer_refusals_total{port="http",list="admin"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    server.stop().await;
}

/// One HTTP/1.1 GET of `path` over TLS presenting `client` (PEM cert,
/// key) if given; the status code.
async fn https_status(
    addr: std::net::SocketAddr,
    root: &tokio_rustls::rustls::pki_types::CertificateDer<'static>,
    client: Option<(&Path, &Path)>,
    path: &str,
) -> u16 {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
    let mut store = RootCertStore::empty();
    store.add(root.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store);
    let mut config = match client {
        Some((cert, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                .unwrap()
                .map(Result::unwrap)
                .collect();
            builder
                .with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(key).unwrap())
                .unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake");
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out).await;
    out.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_client_certificate_opens_the_console_api_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let cert = common::tls::server_cert(dir.path(), "server");
    let ca = common::tls::ca(dir.path(), "clients");
    let (ops_c, ops_k) = common::tls::client_cert(dir.path(), &ca, "ops-admin", &[]);
    let (app_c, app_k) = common::tls::client_cert(dir.path(), &ca, "app-1", &[]);
    let mut config = test_config(dir.path());
    config.server.tls = Some(TlsSettings {
        cert: cert.cert.clone(),
        key: cert.key.clone(),
        client_ca: Some(ca.cert.clone()),
        client_required: false,
    });
    config.admin.client_cert_names = vec!["ops-admin".into()];
    let server = TestServer::start(config).await;
    let path = "/admin/api/holders";
    let listed = https_status(server.http, &cert.der, Some((&ops_c, &ops_k)), path).await;
    assert_eq!(
        listed, 200,
        "a certificate named in admin.client_cert_names"
    );
    let other = https_status(server.http, &cert.der, Some((&app_c, &app_k)), path).await;
    assert_eq!(other, 403, "a certificate not listed");
    let none = https_status(server.http, &cert.der, None, path).await;
    assert_eq!(none, 401, "no certificate");
    assert_eq!(
        https_status(server.http, &cert.der, None, "/admin/").await,
        200,
        "the page itself holds nothing secret"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_show_lock_delay_and_ttl_and_sessions_renew_by_hand() {
    let consul = common::test_consul().await;
    let dir = tempfile::tempdir().unwrap();
    let token = format!("\"{TOKEN}\"");
    let node = ChildServer::start(&write_cluster_config(
        dir.path(),
        "n0",
        consul.addr(),
        &[("admin", "token", &token)],
    ));
    let mut admin = AdminClient::connect(format!("http://{}", node.grpc))
        .await
        .unwrap();
    let holders = admin
        .list_holders(ok(proto::ListHoldersRequest {}))
        .await
        .unwrap()
        .into_inner()
        .holders;
    let worker = holders
        .iter()
        .find(|h| h.kind == HolderKind::Worker as i32)
        .expect("n0's worker id");
    assert_eq!(worker.lock_delay_ms, 2000, "{worker:?}");
    assert_eq!(worker.session_ttl_ms, 2000, "{worker:?}");

    let renewed = admin
        .renew_session(ok(proto::RenewSessionRequest {
            session: worker.session.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(renewed.session, worker.session);
    assert_eq!(renewed.ttl_ms, 2000);
    assert!(renewed.holders.iter().any(|h| h.id == worker.id));
    assert!(renewed.message.contains("n0"), "{renewed:?}");

    for (session, code) in [
        ("", Code::InvalidArgument),
        ("00000000-0000-0000-0000-000000000000", Code::NotFound),
        ("../../kv/x?dc=y", Code::NotFound),
    ] {
        let e = admin
            .renew_session(ok(proto::RenewSessionRequest {
                session: session.into(),
            }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{session}: {e:?}");
    }

    // The same from the command line.
    let addr = format!("http://{}", node.grpc);
    let (ok_, out) = common::run_idgen(&[
        "admin",
        "--addr",
        &addr,
        "--token",
        TOKEN,
        "renew",
        &worker.session,
    ]);
    assert!(ok_ && out.contains("renewed session"), "{out}");
    let (ok_, out) = common::run_idgen(&[
        "admin",
        "--addr",
        &addr,
        "--token",
        TOKEN,
        "renew",
        "no-such-session",
    ]);
    assert!(!ok_ && out.contains("NOT_FOUND"), "{out}");

    // The same through the console's JSON API.
    let http = format!("http://{}/admin/api/renew", node.http);
    let r = reqwest::Client::new()
        .post(&http)
        .bearer_auth(TOKEN)
        .json(&json!({"session": worker.session}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["ttl_ms"], 2000, "{body}");
    assert_eq!(body["holders"][0]["instance"], "n0", "{body}");
    let r = reqwest::Client::new()
        .post(&http)
        .bearer_auth(TOKEN)
        .json(&json!({"session": "00000000-0000-0000-0000-000000000000"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let body: Value = r.json().await.unwrap();
    assert!(error_of(&body).1.contains("holds no worker id"), "{body}");
}

/// A console change: `body` posted as JSON to `/admin/api/<path>`.
async fn console_change(server: &TestServer, path: &str, body: Value) -> (u16, Value) {
    post(
        server,
        &format!("/admin/api/{path}"),
        &body.to_string(),
        "application/json",
        None,
    )
    .await
}

/// `count` IDs from the node's own JSON endpoint, as numbers.
async fn ids_of(server: &TestServer, query: &str) -> Vec<u64> {
    let body: Value = reqwest::get(server.url(&format!("/v1/ids?{query}")))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["ids"]
        .as_array()
        .unwrap_or_else(|| panic!("{query}: {body}"))
        .iter()
        .map(|v| v.as_str().unwrap().parse().unwrap())
        .collect()
}

/// A rule with few counter values, so its load-time check is quick.
const CONSOLE_LUA: &str = "function min_counter() return 1 end\nfunction max_counter() return 99 end\nfunction reset_seconds() return 0 end\nfunction create_id(counter, now, salt) return string.format(\"C%02d\", counter) end\n";

/// Tags from the console: created above 2^53 (exact), edited, deleted and
/// created again, every ID new.
async fn console_tags_keep_their_rules(server: &TestServer) {
    // The previous system handed out IDs up to 2^53 + 1.
    let initial: u64 = 9_007_199_254_740_993;
    let (status, r) = console_change(
        server,
        "tags/create",
        json!({"tag": "books", "step": 10, "initial": initial.to_string(), "description": "from the console"}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let mut seen = std::collections::HashSet::new();
    for id in ids_of(server, "mode=segment&tag=books&count=25").await {
        assert!(id > initial, "{id} was handed out by the previous system");
        assert!(seen.insert(id), "{id} twice");
    }
    assert_eq!(r["tag"]["max_id"], initial.to_string(), "exact: {r}");
    // A number is refused, saying what to send.
    let (status, r) = console_change(
        server,
        "tags/create",
        json!({"tag": "numbers", "initial": 5}),
    )
    .await;
    assert_error((status, &r), 400, "INVALID_ARGUMENT", "decimal string");

    // Editing the step leaves max_id where it is; a max_id below it is
    // the service's own refusal, verbatim.
    let (_, _, before) = get(server, "/admin/api/tags", Some(TOKEN)).await;
    let (status, r) =
        console_change(server, "tags/update", json!({"tag": "books", "step": 50})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["tag"]["step"], 50);
    let max_id = |v: &Value| v.as_str().map(|n| n.parse::<u64>().unwrap());
    // (A background fetch of the next range may raise it meanwhile.)
    assert!(
        max_id(&r["tag"]["max_id"]) >= max_id(&before["tags"][0]["max_id"]),
        "an edit of the step never lowers max_id: {r} {before}"
    );
    assert_eq!(
        before["tags"][0]["next"]
            .as_str()
            .map(|n| n.parse::<u64>().unwrap()),
        before["tags"][0]["max_id"]
            .as_str()
            .map(|n| n.parse::<u64>().unwrap() + 1)
    );
    let (status, r) = console_change(
        server,
        "tags/update",
        json!({"tag": "books", "max_id": initial.to_string()}),
    )
    .await;
    assert_error((status, &r), 400, "FAILED_PRECONDITION", "");

    // Deleted, then created again from the console: it continues above.
    let (status, r) = console_change(server, "tags/delete", json!({"name": "books"})).await;
    assert_eq!(status, 200, "{r}");
    assert!(r["message"].as_str().unwrap().contains("tombstone"), "{r}");
    let (status, r) = console_change(server, "tags/create", json!({"tag": "books"})).await;
    assert_eq!(status, 200, "{r}");
    assert!(
        r["message"].as_str().unwrap().contains("continues above"),
        "{r}"
    );
    for id in ids_of(server, "mode=segment&tag=books&count=25").await {
        assert!(
            seen.insert(id),
            "{id} handed out again after the re-creation"
        );
    }
}

/// Strict steps and keys from the console: a deleted key used again
/// continues above its last value.
async fn console_strict_keeps_its_rules(server: &TestServer) {
    let (status, r) = console_change(
        server,
        "strict/step",
        json!({"namespace": "inv", "step": 7}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        (r["step"].as_u64(), r["previous"].as_u64()),
        (Some(7), Some(1)),
        "{r}"
    );
    let (status, r) = console_change(
        server,
        "strict/step",
        json!({"namespace": "inv", "step": 0}),
    )
    .await;
    assert_error((status, &r), 400, "INVALID_ARGUMENT", "");
    let first = ids_of(server, "mode=strict&tag=inv/a&count=3").await;
    let (status, _, keys) = get(server, "/admin/api/strict/keys?namespace=inv", Some(TOKEN)).await;
    assert_eq!(status, 200, "{keys}");
    assert_eq!(
        keys["keys"],
        json!([{"key": "inv/a", "value": first[2].to_string()}])
    );
    assert_eq!(keys["tombstones"], json!([]), "{keys}");
    let (status, _, r) = get(server, "/admin/api/strict/keys", Some(TOKEN)).await;
    assert_error((status, &r), 400, "INVALID_ARGUMENT", "");
    let (status, r) = console_change(server, "strict/keys/delete", json!({"key": "inv/a"})).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["last_value"], first[2].to_string());
    let (_, _, keys) = get(server, "/admin/api/strict/keys?namespace=inv", Some(TOKEN)).await;
    assert_eq!(keys["keys"], json!([]), "{keys}");
    assert_eq!(
        keys["tombstones"],
        json!([{"key": "inv/a", "last_value": first[2].to_string()}]),
        "the tombstone is listed with its last value"
    );
    let again = ids_of(server, "mode=strict&tag=inv/a&count=1").await;
    assert!(again[0] > first[2], "{again:?} after {first:?}");
}

/// Formats from the console: a Lua rule created, its code shown, its
/// counter now, then deleted; the name is never created again.
async fn console_formats_keep_their_rules(server: &TestServer) {
    let def = json!({"name": "clua", "lua": CONSOLE_LUA});
    let (status, r) = console_change(server, "formats/create", json!({"definition": def})).await;
    assert_eq!(status, 200, "{r}");
    let (_, _, f) = get(server, "/admin/api/formats", Some(TOKEN)).await;
    let clua = f["formats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "clua")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (&clua["kind"], &clua["definition"]["lua"]),
        (&json!("lua"), &json!(CONSOLE_LUA)),
        "{f}"
    );
    assert_eq!(clua["current"], json!({"used": false}), "{f}");
    let issued: Value = reqwest::get(server.url("/v1/formatted/clua?count=2"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(issued["ids"], json!(["C01", "C02"]), "{issued}");
    let (_, _, f) = get(server, "/admin/api/formats", Some(TOKEN)).await;
    let clua = f["formats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "clua")
        .cloned()
        .unwrap_or_default();
    assert_eq!(clua["current"]["used"], true, "{f}");
    assert!(
        clua["current"]["last"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 2,
        "{f}"
    );
    let (status, r) = console_change(server, "formats/create", json!({"definition": "clua"})).await;
    assert_error((status, &r), 400, "INVALID_ARGUMENT", "");
    let (status, r) = console_change(server, "formats/delete", json!({"name": "clua"})).await;
    assert_eq!(status, 200, "{r}");
    let (status, r) = console_change(server, "formats/create", json!({"definition": def})).await;
    assert!(status >= 400, "a deleted name is never created again: {r}");
    assert!(
        !error_of(&r).1.is_empty(),
        "the service's reason, verbatim: {r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_changes_keep_every_admin_rule_and_exact_values() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(with_token(dir.path())).await;
    console_tags_keep_their_rules(&server).await;
    console_strict_keeps_its_rules(&server).await;
    console_formats_keep_their_rules(&server).await;

    // Changes need the token and the console's own origin.
    let (status, r) = post(
        &server,
        "/admin/api/tags/create",
        r#"{"tag": "x"}"#,
        "application/json",
        Some("http://evil.example"),
    )
    .await;
    assert_error((status, &r), 403, "PERMISSION_DENIED", "");
    let r = reqwest::Client::new()
        .post(server.url("/admin/api/tags/delete"))
        .bearer_auth("not-the-token")
        .json(&json!({"name": "books"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let (_, _, tags) = get(&server, "/admin/api/tags", Some(TOKEN)).await;
    assert_eq!(tags["tags"][0]["tag"], "books", "still there: {tags}");
    server.stop().await;
}

/// The formats the console lists, by name.
async fn console_format(server: &TestServer, name: &str) -> Value {
    let (status, _, f) = get(server, "/admin/api/formats", Some(TOKEN)).await;
    assert_eq!(status, 200, "{f}");
    f["formats"]
        .as_array()
        .and_then(|l| l.iter().find(|f| f["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("no format {name}: {f}"))
}

/// A format's "counter now" names its period as its IDs render it (the
/// raw key, civil seconds, only beside it), and a scoped format shows
/// how many counters it stores, never an error about missing parameters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_counters_show_their_period_and_scoped_ones_their_count() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(with_token(dir.path())).await;
    let defs = [
        json!({"name": "daily", "template": "D{yyyy}{MM}{dd}{seq:6}", "reset": "day", "time_zone": "Asia/Shanghai"}),
        json!({"name": "shops", "template": "S{param:shop:3:digits}{seq:6}", "scope_params": ["shop"]}),
    ];
    for def in defs {
        let (status, r) =
            console_change(&server, "formats/create", json!({"definition": def})).await;
        assert_eq!(status, 200, "{r}");
    }
    let shops = console_format(&server, "shops").await;
    assert_eq!(
        shops["current"],
        json!({"scoped": true, "scope_params": ["shop"], "counters": 0}),
        "{shops}"
    );
    for query in [
        "daily?count=2",
        "shops?count=1&param.shop=001",
        "shops?count=1&param.shop=002",
    ] {
        let r = reqwest::get(server.url(&format!("/v1/formatted/{query}")))
            .await
            .unwrap();
        assert!(r.status().is_success(), "{query}: {}", r.status());
        let issued: Value = r.json().await.unwrap();
        if query.starts_with("daily") {
            // The period is the day the ID renders (Shanghai's, not UTC's).
            let id = issued["ids"][0].as_str().unwrap_or_default().to_owned();
            let daily = console_format(&server, "daily").await;
            let c = &daily["current"];
            let day = format!("{}-{}-{}", &id[1..5], &id[5..7], &id[7..9]);
            assert_eq!(c["period_label"], json!(day), "{daily}");
            let last = c["last"].as_str().and_then(|l| l.parse::<u64>().ok());
            assert!(c["period"].is_i64() && last >= Some(2), "{daily}");
        }
    }
    let shops = console_format(&server, "shops").await;
    assert_eq!(shops["current"]["counters"], 2, "{shops}");
    assert!(shops["current"].get("error").is_none(), "{shops}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_node_it_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(with_token(dir.path())).await;
    let (status, _, r) = get(&server, "/admin/api/node", None).await;
    assert_error((status, &r), 401, "UNAUTHENTICATED", "");
    let before = ids_of(&server, "mode=snowflake&count=7").await;
    assert_eq!(before.len(), 7);
    let (status, _, n) = get(&server, "/admin/api/node", Some(TOKEN)).await;
    assert_eq!(status, 200, "{n}");
    assert_eq!(n["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        (&n["ready"], &n["fenced"], &n["reason"]),
        (&json!(true), &json!(false), &Value::Null),
        "{n}"
    );
    assert!(n["instance"].as_str().is_some_and(|i| !i.is_empty()), "{n}");
    assert_eq!(
        n["layout"]["sequence_bits"].as_u64().map(|b| b > 0),
        Some(true),
        "{n}"
    );
    // (Other tests in this process add to the same counters.)
    assert!(
        n["issued"]["snowflake"].as_f64().unwrap_or(0.0) >= 7.0,
        "{n}"
    );
    server.stop().await;
}

/// `GET /admin/api/cluster` on the node at `http`, with `token` if given.
async fn cluster_view(http: std::net::SocketAddr, token: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new().get(format!("http://{http}/admin/api/cluster"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("HTTP answer");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The row of `instance` in a cluster view.
fn row_of<'a>(view: &'a Value, instance: &str) -> Option<&'a Value> {
    view["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["instance"] == instance)
}

/// Polls the cluster view of the node at `http` (at most 150 times, 200 ms
/// apart: generous for a loaded machine) until `want` holds of it.
async fn view_until(
    http: std::net::SocketAddr,
    what: &str,
    want: impl Fn(&Value) -> bool,
) -> Value {
    let mut last = Value::Null;
    for _ in 0..150 {
        let (status, view) = cluster_view(http, Some(TOKEN)).await;
        if status == 200 && want(&view) {
            return view;
        }
        last = view;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("{what}: never seen; last view {last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_console_lists_exactly_this_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = with_token(dir.path());
    if let Some(lease) = config.lease.as_mut() {
        lease.hide = Some(idgen::id::lease::ZoneHide {
            key: "zone-key".into(),
            version_bits: 3,
        });
    }
    let server = TestServer::start(config).await;
    let (status, r) = cluster_view(server.http, None).await;
    assert_error((status, &r), 401, "UNAUTHENTICATED", "");
    let (status, r) = cluster_view(server.http, Some("not-the-token")).await;
    assert_error((status, &r), 403, "PERMISSION_DENIED", "admin.token");
    let (status, view) = cluster_view(server.http, Some(TOKEN)).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["backend"], "embedded", "{view}");
    let (_, _, this) = get(&server, "/admin/api/node", Some(TOKEN)).await;
    let nodes = view["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 1, "{view}");
    let n = &nodes[0];
    assert_eq!(n["instance"], this["instance"], "{view}");
    assert_eq!(
        (&n["ready"], &n["fenced"], &n["version"]),
        (
            &json!(true),
            &json!(false),
            &json!(env!("CARGO_PKG_VERSION"))
        ),
        "{view}"
    );
    assert_eq!(n["report"]["state"], "reporting", "{view}");
    assert!(n["layout"]["worker_bits"].as_u64().is_some(), "{view}");
    // What it hides with, as a Consul node publishes it (the console's
    // "Hidden with" column).
    assert_eq!(
        n["hides"],
        json!([{"key": "zone-key", "namespace": "lease zone 0", "version_bits": 3}]),
        "{view}"
    );

    // A hidden tag from the console names a missing key in its refusal.
    let (status, r) = console_change(
        &server,
        "tags/create",
        json!({"tag": "hid", "hide_key": "no-such-key"}),
    )
    .await;
    assert_error((status, &r), 400, "FAILED_PRECONDITION", "no-such-key");
    assert!(error_of(&r).1.contains("idgen admin keys create"), "{r}");
    let (status, r) = console_change(
        &server,
        "tags/update",
        json!({"tag": "hid", "hide_key": "k"}),
    )
    .await;
    assert_error((status, &r), 400, "INVALID_ARGUMENT", "hide_key");
    server.stop().await;
}

const MASTER: &str = "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

fn consul_node(dir: &Path, name: &str, consul: std::net::SocketAddr) -> ChildServer {
    let token = format!("\"{TOKEN}\"");
    let config = write_cluster_config(
        dir,
        name,
        consul,
        &[("admin", "token", &token), ("segment", "enabled", "true")],
    );
    ChildServer::try_start_env(&config, &[], &[("IDGEN_HIDE_MASTER_KEY", MASTER)])
        .unwrap_or_else(|log| panic!("{name} did not become ready: {log}"))
}

/// Every node's status on Consul: each node's console lists every node
/// (ready, version, layout, rate, Consul's check); a node killed shows
/// as not reporting or failing its check, one stopped cleanly as stopped;
/// a hidden tag is created through the console.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_nodes_status_is_in_each_console_on_consul() {
    let consul = common::test_consul().await;
    // Records of instances gone for over a day are pruned at a node's
    // start; one silent for an hour stays (and reads "not reporting").
    let kv = common::consul::default_client(&consul);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for (name, age_ms) in [("ghost", 25 * 3_600_000), ("recent", 3_600_000)] {
        let record = json!({"instance": name, "state": "running", "rate": null,
                            "written_ms": now_ms - age_ms, "interval_ms": 5000});
        let key = format!("idgen/test/nodes/{name}");
        let set = idgen::consul::KvWrite::Set;
        assert!(kv
            .kv_put(&key, record.to_string().as_bytes(), set)
            .await
            .unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let a = consul_node(dir.path(), "n0", consul.addr());
    let b = consul_node(dir.path(), "n1", consul.addr());
    let view = view_until(a.http, "the day-old record pruned", |v| {
        row_of(v, "ghost").is_none()
    })
    .await;
    let recent = row_of(&view, "recent").expect("the hour-old record stays");
    assert_eq!(recent["report"]["state"], "not_reporting", "{view}");
    assert_eq!(recent["consul"]["status"], "not registered", "{view}");
    let (status, r) = cluster_view(a.http, None).await;
    assert_error((status, &r), 401, "UNAUTHENTICATED", "");
    let (status, r) = cluster_view(a.http, Some("not-the-token")).await;
    assert_error((status, &r), 403, "PERMISSION_DENIED", "");

    let both_up = |v: &Value| {
        ["n0", "n1"].iter().all(|n| {
            row_of(v, n).is_some_and(|r| {
                r["report"]["state"] == "reporting"
                    && r["ready"] == true
                    && r["fenced"] == false
                    && r["consul"]["status"] == "passing"
            })
        })
    };
    let view = view_until(a.http, "n0 and n1 ready and passing", both_up).await;
    assert_eq!(view["backend"], "consul", "{view}");
    for n in ["n0", "n1"] {
        let r = row_of(&view, n).unwrap();
        assert_eq!(r["version"], env!("CARGO_PKG_VERSION"), "{view}");
        assert!(r["layout"]["sequence_bits"].as_u64().is_some(), "{view}");
        assert!(
            r.get("rate").is_some() && r.get("node_number").is_some(),
            "{view}"
        );
    }
    // B's issue rate, from its own counters, once it wrote twice.
    let mut c = b.client().await;
    let req = proto::GenIdsRequest {
        mode: proto::Mode::Snowflake as i32,
        count: 100,
        ..Default::default()
    };
    c.gen_ids(req).await.unwrap();
    view_until(a.http, "n1 reports a rate and its IDs", |v| {
        row_of(v, "n1").is_some_and(|r| {
            r["rate"].is_number() && r["issued"]["snowflake"].as_f64() >= Some(100.0)
        })
    })
    .await;

    // A hidden tag from the console; a missing key is refused by name.
    common::hide_key(&a, TOKEN, "create", "console-key").await;
    let create = |body: Value| {
        reqwest::Client::new()
            .post(format!("http://{}/admin/api/tags/create", a.http))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
    };
    let r = create(json!({"tag": "hid", "hide_key": "console-key"}))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["tag"]["hide"]["key"], "console-key", "{body}");
    let r = create(json!({"tag": "hid2", "hide_key": "missing-key"}))
        .await
        .unwrap();
    assert_ne!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    assert!(error_of(&body).1.contains("missing-key"), "{body}");
    common::hide_key(&a, TOKEN, "create", "old-key").await;
    common::hide_key(&a, TOKEN, "retire", "old-key").await;
    let r = create(json!({"tag": "hid3", "hide_key": "old-key"}))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(error_of(&body).1.contains("retired"), "{body}");

    // kill -9 B: A's view shows it silent or failing its Consul check.
    b.kill();
    view_until(a.http, "n1 not reporting or failing its check", |v| {
        row_of(v, "n1").is_some_and(|r| {
            r["report"]["state"] == "not_reporting" || r["consul"]["status"] != "passing"
        })
    })
    .await;
    // A stopped cleanly: a third node's view says so.
    assert!(a.terminate().success());
    let c = consul_node(dir.path(), "n2", consul.addr());
    let view = view_until(c.http, "n0 stopped, n2 reporting", |v| {
        row_of(v, "n0").is_some_and(|r| r["report"]["state"] == "stopped")
            && row_of(v, "n2").is_some_and(|r| r["report"]["state"] == "reporting")
    })
    .await;
    assert_eq!(
        view["nodes"].as_array().map(Vec::len),
        Some(4),
        "n0-n2 and recent: {view}"
    );
    c.terminate();
}

/// `GET /admin/api/datacenters` of the node at `http`, with `token`.
async fn datacenters_view(http: std::net::SocketAddr, token: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new().get(format!("http://{http}/admin/api/datacenters"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("HTTP answer");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// `POST /admin/api/datacenters/release` of `body` to the node at `http`,
/// with `token` and `origin` when given.
async fn release_datacenter(
    http: std::net::SocketAddr,
    token: Option<&str>,
    origin: Option<&str>,
    body: Value,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("http://{http}/admin/api/datacenters/release"))
        .json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    let r = req.send().await.expect("HTTP answer");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// The claim of `id` in a datacenters view.
fn claim_of(view: &Value, id: u64) -> &Value {
    view["claims"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["id"] == id))
        .unwrap_or_else(|| panic!("no claim of datacenter id {id}: {view}"))
}

/// The Datacenters panel's API on two emulated Consul datacenters (`dc1`
/// the primary, `dc2`): both claims listed; no token, a foreign origin and
/// a release while `dc2`'s node runs refused (the node's own words,
/// nothing changed); an id never claimed is NOT_FOUND; once `dc2`'s node
/// is gone a forced release from the console frees the id with a floor,
/// audited with the caller like the CLI's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_lists_datacenter_claims_and_releases_one_through_the_admin_service() {
    let dc1 = common::test_consul().await;
    let dc2 = dc1.add_datacenter("dc2").await.expect("dc2 starts");
    let dir = tempfile::tempdir().unwrap();
    let token = format!("\"{TOKEN}\"");
    let with_admin = [("admin", "token", token.as_str())];
    let a = ChildServer::start(&write_datacenter_config(
        dir.path(),
        "a",
        dc1.addr(),
        1,
        &with_admin,
    ));
    let b = ChildServer::start(&write_datacenter_config(
        dir.path(),
        "b",
        dc2.addr(),
        2,
        &[],
    ));

    let (status, view) = datacenters_view(a.http, Some(TOKEN)).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["primary"], "dc1", "{view}");
    assert_eq!(view["unreadable"], json!([]), "{view}");
    for (id, owner, instance) in [(1, "dc1", "a"), (2, "dc2", "b")] {
        let c = claim_of(&view, id);
        assert_eq!(
            (&c["state"], &c["consul_datacenter"], &c["cluster"]),
            (&json!("owned"), &json!(owner), &json!("test")),
            "{view}"
        );
        assert!(
            c["claimed_by"]
                .as_str()
                .is_some_and(|s| s.contains(instance)),
            "{view}"
        );
        assert!(
            c["claimed"].as_str().is_some_and(|s| s.ends_with('Z')),
            "{view}"
        );
        assert_eq!(c["floor_ms"], 0, "{view}");
    }

    // The console's credentials and cross-site checks, as on every change.
    let (status, r) = datacenters_view(a.http, None).await;
    assert_error(
        (status, &r),
        401,
        "UNAUTHENTICATED",
        "authorization: Bearer",
    );
    let (status, r) = release_datacenter(a.http, None, None, json!({"id": 2})).await;
    assert_error(
        (status, &r),
        401,
        "UNAUTHENTICATED",
        "authorization: Bearer",
    );
    let evil = Some("http://evil.example");
    let body = json!({"id": 2, "force": true});
    let (status, r) = release_datacenter(a.http, Some(TOKEN), evil, body).await;
    assert_error((status, &r), 403, "PERMISSION_DENIED", "origin");
    let (status, r) = release_datacenter(a.http, Some(TOKEN), None, json!({"id": "2"})).await;
    assert_error(
        (status, &r),
        400,
        "INVALID_ARGUMENT",
        "does not fit this endpoint",
    );

    // dc2's node runs: refused in the node's words, the claim unchanged.
    let (status, r) = release_datacenter(a.http, Some(TOKEN), None, json!({"id": 2})).await;
    assert_error(
        (status, &r),
        400,
        "FAILED_PRECONDITION",
        "datacenter id 2 is owned by Consul datacenter \"dc2\", which still has",
    );
    assert!(error_of(&r).1.contains("--force"), "{r}");
    let (_, view) = datacenters_view(a.http, Some(TOKEN)).await;
    assert_eq!(claim_of(&view, 2)["state"], "owned", "{view}");
    let (status, r) = release_datacenter(a.http, Some(TOKEN), None, json!({"id": 9})).await;
    assert_error(
        (status, &r),
        404,
        "NOT_FOUND",
        "datacenter id 9 is not claimed in the primary Consul datacenter \"dc1\"",
    );

    // dc2's node gone (killed: its session lingers): forced, released.
    b.kill();
    let body = json!({"id": 2, "force": true});
    let (status, r) = release_datacenter(a.http, Some(TOKEN), None, body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["released"], true, "{r}");
    assert!(
        r["message"]
            .as_str()
            .is_some_and(|m| m.contains("released datacenter id 2 of Consul datacenter \"dc2\"")),
        "{r}"
    );
    assert_eq!(r["previous"]["consul_datacenter"], "dc2", "{r}");
    let floor = r["floor_ms"].as_u64().unwrap_or(0);
    assert!(floor > 0, "the old owner's highest mark: {r}");
    let (_, view) = datacenters_view(a.http, Some(TOKEN)).await;
    let c = claim_of(&view, 2);
    assert_eq!(
        (&c["state"], &c["floor_ms"]),
        (&json!("released"), &json!(floor)),
        "{view}"
    );
    let log = a.log_text();
    for line in [
        "datacenter id release refused or failed",
        "datacenter id released",
    ] {
        assert!(
            log.lines().any(|l| l.contains("idgen::audit")
                && l.contains(line)
                && l.contains("admin token from 127.0.0.1")),
            "audited with the caller: {line}: {log}"
        );
    }
    assert!(a.terminate().success());
}

/// On the embedded store there are no datacenter claims: the panel's read
/// answers the service's FAILED_PRECONDITION, naming `store.backend`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_console_says_why_it_lists_no_datacenters() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(with_token(dir.path())).await;
    let (status, _, r) = get(&server, "/admin/api/datacenters", Some(TOKEN)).await;
    assert_error(
        (status, &r),
        400,
        "FAILED_PRECONDITION",
        "store.backend = \"consul\"",
    );
    let (status, r) = post_json(&server, "/admin/api/datacenters/release", r#"{"id": 1}"#).await;
    assert_error(
        (status, &r),
        400,
        "FAILED_PRECONDITION",
        "store.backend = \"consul\"",
    );
    server.stop().await;
}
