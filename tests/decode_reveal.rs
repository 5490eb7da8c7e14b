//! Revealing hidden IDs to admins, everywhere a node decodes them, against
//! the real `idgen` binary (embedded store): gRPC `DecodeId` of a hidden
//! lease zone's IDs; HTTP `/v1/decode` and `/v1/formatted/<name>/parse`
//! with `Authorization: Bearer` (the internal value for the right token,
//! audit-logged; the public view without a header; the console's refusal
//! for a wrong token or a peer outside `admin.allow`, never the public
//! view); `idgen format parse --admin-token`; hidden formats' counters
//! (GetFormatCounter, the console, `idgen format counter`) for admins
//! only; and `admin keys rotate`
//! refusing a version a namespace using the key cannot hold unless
//! `--force`.

mod common;

use std::path::{Path, PathBuf};

use common::{run_idgen_with_env, test_config, write_child_config, ChildServer, TestServer};
use idgen::config::{AdminToken, AllowList};
use idgen::proto::{self, admin_client::AdminClient, id_gen_client::IdGenClient, Mode};
use serde_json::Value;
use tonic::transport::Channel;
use tonic::Code;

const TOKEN: &str = "decode-reveal-admin-token";
/// 32 bytes, hex: the master key the data keys are wrapped with.
const MASTER: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const ENV: [(&str, &str); 1] = [("IDGEN_HIDE_MASTER_KEY", MASTER)];

fn admin_req<T>(msg: T) -> tonic::Request<T> {
    common::tonic_req(TOKEN, msg)
}

/// An embedded node with the admin token and `extra` (TOML) appended.
fn config(dir: &Path, extra: &str) -> PathBuf {
    let path = write_child_config(dir, true);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!("[admin]\ntoken = \"{TOKEN}\"\n{extra}"));
    std::fs::write(&path, text).unwrap();
    path
}

fn start(config: &Path) -> ChildServer {
    ChildServer::try_start_env(config, &[], &ENV)
        .unwrap_or_else(|log| panic!("idgen did not become ready: {log}"))
}

/// A hidden format `orders` (key `orders`) and hidden lease zone 5 (key
/// `tickets`).
const HIDDEN: &str = "[[formats]]\nname = \"orders\"\ntemplate = \"ORD{seq:8:hidden}\"\n\
     [lease]\nenabled = true\nzone = 5\nblock = 100\n[lease.hide]\nkey = \"tickets\"\n";

async fn lease_ids(c: &mut IdGenClient<Channel>, n: u32) -> Vec<u64> {
    common::lease_ids(c, n).await.expect("lease IDs")
}

async fn orders(c: &mut IdGenClient<Channel>, n: u32) -> Result<Vec<String>, tonic::Status> {
    common::formatted_ids(c, "orders", n).await
}

/// DecodeId of lease `id`, as the admin or anonymously.
async fn decode_lease(
    c: &mut IdGenClient<Channel>,
    id: u64,
    admin: bool,
) -> proto::DecodeIdResponse {
    let msg = proto::DecodeIdRequest {
        id,
        mode: Mode::Lease as i32,
        tag: String::new(),
    };
    let req = if admin {
        admin_req(msg)
    } else {
        tonic::Request::new(msg)
    };
    c.decode_id(req).await.expect("DecodeId").into_inner()
}

/// A GET of `path` on the node's HTTP port with `authorization` as the
/// header when given: status and JSON body.
async fn get(http: std::net::SocketAddr, path: &str, authorization: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new().get(format!("http://{http}{path}"));
    if let Some(a) = authorization {
        req = req.header("authorization", a);
    }
    let r = req.send().await.expect("HTTP answer");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The refusals a presented credential gets: the console's status, code
/// and message, never the public view.
async fn refusals(http: std::net::SocketAddr, path: &str) {
    let (status, body) = get(http, path, Some("Bearer wrong")).await;
    assert_eq!(status, 403, "{path}: {body}");
    assert_eq!(body["error"]["code"], "PERMISSION_DENIED", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("admin token is wrong") && message.contains("admin.token"),
        "{body}"
    );
    let (status, body) = get(http, path, Some(&format!("Basic {TOKEN}"))).await;
    assert_eq!(status, 401, "{path}: {body}");
    assert_eq!(body["error"]["code"], "UNAUTHENTICATED", "{body}");
}

/// Hidden lease IDs reveal to admins through DecodeId (zone, token and
/// sequence of the internal ID, key version, internal ID; a rotated-out
/// version too) and show anonymous callers only the zone and key version.
async fn lease_reveal(node: &ChildServer) -> (u64, u64) {
    let mut c = node.client().await;
    let ids = lease_ids(&mut c, 5).await;
    let mut internal = Vec::new();
    for id in &ids {
        let admin = decode_lease(&mut c, *id, true).await;
        assert_eq!(
            (admin.hidden.as_str(), admin.zone, admin.key_version),
            ("zone", 5, Some(0)),
            "{admin:?}"
        );
        let inner = admin.internal_id.expect("the admin sees the internal ID");
        assert_ne!(inner, *id);
        let plain = idgen::modes::decode_lease(inner).unwrap();
        assert_eq!(
            (plain.zone, plain.token, plain.sequence),
            (Some(5), Some(u64::from(admin.token)), admin.sequence),
            "the parts are the internal ID's"
        );
        internal.push(inner);
        let anon = decode_lease(&mut c, *id, false).await;
        assert_eq!(
            (anon.hidden.as_str(), anon.zone, anon.key_version),
            ("zone", 5, Some(0))
        );
        assert_eq!(
            (anon.token, anon.sequence, anon.internal_id),
            (0, 0, None),
            "the anonymous view shows no permuted bits as parts"
        );
    }
    assert!(
        internal.windows(2).all(|w| w[1] == w[0] + 1),
        "the internal IDs of one batch are consecutive: {internal:?}"
    );
    common::hide_key(node, TOKEN, "rotate", "tickets").await;
    let after = lease_ids(&mut c, 1).await[0];
    let later = decode_lease(&mut c, after, true).await;
    assert_eq!(later.key_version, Some(1));
    assert!(
        later.internal_id.unwrap() > internal[4],
        "internal IDs move on"
    );
    let again = decode_lease(&mut c, ids[0], true).await;
    assert_eq!(
        (again.key_version, again.internal_id),
        (Some(0), Some(internal[0])),
        "an ID of the rotated-out version still reveals"
    );
    (ids[0], internal[0])
}

#[tokio::test]
async fn hidden_ids_reveal_to_admins_over_grpc_http_and_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&config(dir.path(), HIDDEN));
    for key in ["orders", "tickets"] {
        common::hide_key(&node, TOKEN, "create", key).await;
    }
    let (lease_id, lease_internal) = lease_reveal(&node).await;

    // HTTP /v1/decode of a hidden lease ID.
    let http = node.http;
    let path = format!("/v1/decode?id={lease_id}&mode=lease");
    let (status, anon) = get(http, &path, None).await;
    assert_eq!(status, 200, "{anon}");
    assert_eq!(
        (anon["hidden"].as_str(), anon["zone"].as_u64()),
        (Some("zone"), Some(5))
    );
    assert_eq!(anon["key_version"], 0);
    assert!(
        anon.get("internal_id").is_none() && anon.get("token").is_none(),
        "{anon}"
    );
    let bearer = format!("Bearer {TOKEN}");
    let (status, admin) = get(http, &path, Some(&bearer)).await;
    assert_eq!(status, 200, "{admin}");
    assert_eq!(admin["internal_id"], lease_internal.to_string(), "{admin}");
    refusals(http, &path).await;

    // HTTP /v1/formatted/orders/parse of a hidden counter.
    let mut c = node.client().await;
    let ids = orders(&mut c, 5).await.unwrap();
    let mut seqs = Vec::new();
    for id in &ids {
        let path = format!("/v1/formatted/orders/parse?id={id}");
        let (status, anon) = get(http, &path, None).await;
        assert_eq!(status, 200, "{anon}");
        assert_eq!(
            (anon["key_version"].as_u64(), &anon["internal_seq"]),
            (Some(0), &Value::Null)
        );
        let (status, admin) = get(http, &path, Some(&bearer)).await;
        assert_eq!(status, 200, "{admin}");
        assert_eq!(admin["key_version"], 0);
        seqs.push(
            admin["internal_seq"]
                .as_u64()
                .expect("the admin sees the counter"),
        );
        assert_ne!(
            Some(seqs[seqs.len() - 1]),
            admin["seq"].as_u64(),
            "seq is the shown one"
        );
    }
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    refusals(http, &format!("/v1/formatted/orders/parse?id={}", ids[0])).await;

    let log = node.log_text();
    for line in ["hidden lease ID decoded", "hidden ID decoded"] {
        assert!(
            log.contains("idgen::audit") && log.contains(line),
            "no {line:?}: {log}"
        );
    }
    assert!(!log.contains(TOKEN), "the admin token was logged");
    let metrics = reqwest::get(format!("http://{http}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (mode, at_least) in [("lease", 8.0), ("formatted", 5.0)] {
        let name = format!("idgen_hidden_reveals_total{{mode=\"{mode}\"}}");
        let n = common::metric(&metrics, &name).unwrap_or_default();
        assert!(n >= at_least, "{name} = {n}");
    }

    cli_reveal(&node, &ids[2], seqs[2]);
    node.kill();
}

/// A hidden format `orders` and a plain one, `plain`.
const COUNTERS: &str = "[[formats]]\nname = \"orders\"\ntemplate = \"ORD{seq:8:hidden}\"\n\
     [[formats]]\nname = \"plain\"\ntemplate = \"P{seq:6}\"\n";

/// GetFormatCounter of `format`, anonymously or with `token`.
async fn counter(
    c: &mut IdGenClient<Channel>,
    format: &str,
    token: Option<&str>,
) -> Result<proto::GetFormatCounterResponse, tonic::Status> {
    let msg = proto::GetFormatCounterRequest {
        format: format.into(),
        params: Default::default(),
    };
    let req = match token {
        Some(t) => common::tonic_req(t, msg),
        None => tonic::Request::new(msg),
    };
    Ok(c.get_format_counter(req).await?.into_inner())
}

/// A hidden format's counter is its internal value (how many IDs it
/// issued), so GetFormatCounter answers it only to admin credentials:
/// anonymous callers get UNAUTHENTICATED naming the admin token, a wrong
/// token PERMISSION_DENIED; the console on the HTTP port shows it to the
/// admin only; `idgen format counter` needs `--admin-token`; each read is
/// audit-logged and counted. A plain format's counter stays public
/// (issue 32, item 4: after 26,201 IDs a stranger read `last: 27207`).
#[tokio::test]
async fn a_hidden_formats_counter_is_shown_to_admins_only() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&config(dir.path(), COUNTERS));
    common::hide_key(&node, TOKEN, "create", "orders").await;
    let mut c = node.client().await;
    orders(&mut c, 5).await.expect("orders");
    common::formatted_ids(&mut c, "plain", 3)
        .await
        .expect("plain");

    let err = counter(&mut c, "orders", None).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    for part in [
        "hidden format \"orders\"",
        "admin token",
        "admin.client_cert_names",
    ] {
        assert!(err.message().contains(part), "{part:?}: {}", err.message());
    }
    let err = counter(&mut c, "orders", Some("wrong")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let admin = counter(&mut c, "orders", Some(TOKEN)).await.expect("admin");
    assert!(admin.used && admin.last >= 5, "{admin:?}");
    let plain = counter(&mut c, "plain", None)
        .await
        .expect("plain is public");
    assert!(plain.used && plain.last >= 3, "{plain:?}");

    // The console (HTTP port): admin only, and the admin sees the counter.
    let (status, body) = get(node.http, "/admin/api/formats", None).await;
    assert_eq!(status, 401, "{body}");
    let bearer = format!("Bearer {TOKEN}");
    let (status, body) = get(node.http, "/admin/api/formats", Some(&bearer)).await;
    assert_eq!(status, 200, "{body}");
    let shown = body["formats"]
        .as_array()
        .and_then(|l| l.iter().find(|f| f["name"] == "orders"))
        .map(|f| f["current"].clone())
        .unwrap_or_default();
    assert_eq!(shown["last"], admin.last.to_string(), "{body}");

    cli_counter(&node, admin.last);
    let log = node.log_text();
    assert_eq!(
        log.matches("hidden format counter read").count(),
        3,
        "gRPC, console and CLI admin reads, each audit-logged: {log}"
    );
    assert!(
        log.contains("idgen::audit") && !log.contains(TOKEN),
        "{log}"
    );
    let metrics = reqwest::get(format!("http://{}/metrics", node.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let name = "idgen_hidden_reveals_total{mode=\"formatted\"}";
    assert_eq!(common::metric(&metrics, name), Some(3.0), "{metrics}");
    node.kill();
}

/// `idgen format counter` of a hidden format fails without the admin
/// token (saying so) and prints the counter with it; a plain format's
/// needs none.
fn cli_counter(node: &ChildServer, last: u64) {
    let addr = format!("http://{}", node.grpc);
    let run = |name: &str, extra: &[&str]| {
        let mut args = vec!["format", "counter", name, "--addr", &addr, "--json"];
        args.extend_from_slice(extra);
        run_idgen_with_env(&args, &[])
    };
    let (ok, out) = run("orders", &[]);
    assert!(
        !ok && out.contains("UNAUTHENTICATED") && out.contains("--admin-token-file"),
        "{out}"
    );
    let (ok, out) = run("orders", &["--admin-token", TOKEN]);
    assert!(ok, "{out}");
    let line = out.lines().last().unwrap_or_default();
    let json: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(json["last"], last, "{out}");
    let (ok, out) = run("plain", &[]);
    assert!(ok, "{out}");
}

/// `idgen format parse --admin-token` (or IDGEN_ADMIN__TOKEN, or the
/// token file) prints the internal counter; without a token the public
/// view; a wrong token fails, naming it.
fn cli_reveal(node: &ChildServer, id: &str, internal: u64) {
    let addr = format!("http://{}", node.grpc);
    let parse = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["format", "parse", "orders", id, "--addr", &addr, "--json"];
        args.extend_from_slice(extra);
        let (ok, out) = run_idgen_with_env(&args, env);
        assert!(ok, "{args:?}: {out}");
        let line = out.lines().last().unwrap_or_default();
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    let anon = parse(&[], &[]);
    assert_eq!(anon["key_version"], 0, "{anon}");
    assert!(anon.get("internal_seq").is_none(), "{anon}");
    assert_eq!(
        parse(&["--admin-token", TOKEN], &[])["internal_seq"],
        internal
    );
    assert_eq!(
        parse(&[], &[("IDGEN_ADMIN__TOKEN", TOKEN)])["internal_seq"],
        internal
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let file = file.to_string_lossy().into_owned();
    assert_eq!(
        parse(&["--admin-token-file", &file], &[])["internal_seq"],
        internal
    );
    let (ok, out) = run_idgen_with_env(
        &[
            "format",
            "parse",
            "orders",
            id,
            "--addr",
            &addr,
            "--admin-token",
            "wrong",
        ],
        &[],
    );
    assert!(!ok && out.contains("admin token is wrong"), "{out}");
    // The text form names the revealed counter too.
    let (ok, out) = run_idgen_with_env(
        &[
            "format",
            "parse",
            "orders",
            id,
            "--addr",
            &addr,
            "--admin-token",
            TOKEN,
        ],
        &[],
    );
    assert!(
        ok && out.contains(&format!("internal_seq {internal}")),
        "{out}"
    );
}

/// `admin.allow` applies to the admin view: a peer outside it that
/// presents the admin token is refused on HTTP and gRPC (naming the
/// list), and still gets the public view without credentials.
#[tokio::test]
async fn a_peer_outside_admin_allow_gets_no_admin_view() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.admin.token = Some(AdminToken(TOKEN.into()));
    config.admin.allow = AllowList::parse(&["10.0.0.0/8".into()]).unwrap();
    let server = TestServer::start(config).await;
    let mut c = server.client().await;
    let id = c
        .gen_id(proto::GenIdRequest::default())
        .await
        .unwrap()
        .into_inner()
        .id;
    let path = format!("/v1/decode?id={id}");
    let (status, body) = get(server.http, &path, Some(&format!("Bearer {TOKEN}"))).await;
    assert_eq!(status, 403, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("admin.allow") && message.contains("127.0.0.1"),
        "{body}"
    );
    let (status, body) = get(server.http, &path, None).await;
    assert_eq!(
        (status, body["id"].as_str()),
        (200, Some(id.to_string().as_str()))
    );
    let err = c
        .decode_id(admin_req(proto::DecodeIdRequest {
            id,
            mode: 0,
            tag: String::new(),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    server.stop().await;
}

async fn rotate(node: &ChildServer, key: &str, force: bool) -> Result<u32, tonic::Status> {
    let mut admin = AdminClient::connect(format!("http://{}", node.grpc))
        .await
        .unwrap();
    let r = admin
        .rotate_hide_key(admin_req(proto::RotateHideKeyRequest {
            key_id: key.into(),
            force,
        }))
        .await?;
    Ok(r.into_inner()
        .key
        .and_then(|k| k.active)
        .unwrap_or_default())
}

/// A rotation whose new version a namespace using the key cannot hold is
/// refused with FAILED_PRECONDITION naming it (a `{seq:8:hidden}` format
/// holds versions 0 to 9, a lease zone or tag with 1 version bit 0 and 1), and
/// the namespace keeps issuing; `force` (`--force`) rotates anyway, after
/// which that namespace refuses and its old IDs still reveal.
#[tokio::test]
async fn a_rotation_past_a_hidden_format_field_is_refused_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    // A hidden layout on key `narrow` too, with 1 version bit.
    let zone = "[layout]\nhide = \"sortable\"\nhide_key = \"narrow\"\nhide_version_bits = 1\n\
                [lease]\nenabled = true\nzone = 6\nblock = 100\n\
                [lease.hide]\nkey = \"narrow\"\nversion_bits = 1\n";
    let text = format!(
        "[segment]\nenabled = true\n\
         [[formats]]\nname = \"orders\"\ntemplate = \"ORD{{seq:8:hidden}}\"\n{zone}"
    );
    let node = start(&config(dir.path(), &text));
    for key in ["orders", "narrow"] {
        common::hide_key(&node, TOKEN, "create", key).await;
    }
    let mut c = node.client().await;
    let first = orders(&mut c, 1).await.unwrap().remove(0);
    for want in 1..=9 {
        assert_eq!(rotate(&node, "orders", false).await.unwrap(), want);
    }
    for _ in 0..2 {
        let err = rotate(&node, "orders", false).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        for part in [
            "version 10",
            "format \"orders\"",
            "versions 0 to 9",
            "--force",
        ] {
            assert!(err.message().contains(part), "{part:?}: {}", err.message());
        }
    }
    let last = orders(&mut c, 1).await.expect("the format still issues");
    assert!(last[0].starts_with("ORD9"), "{last:?}");
    // The CLI says the same, and --force rotates.
    let addr = format!("http://{}", node.grpc);
    let cli = |force: bool| {
        let mut args = vec!["admin", "--addr", &addr, "--token", TOKEN, "keys", "rotate"];
        if force {
            args.push("--force");
        }
        args.push("orders");
        run_idgen_with_env(&args, &[])
    };
    let (ok, out) = cli(false);
    assert!(
        !ok && out.contains("format \"orders\"") && out.contains("--force"),
        "{out}"
    );
    let (ok, out) = cli(true);
    assert!(ok, "{out}");
    let err = orders(&mut c, 1).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let old = c
        .parse_formatted(admin_req(proto::ParseFormattedRequest {
            format: "orders".into(),
            id: first,
        }))
        .await
        .expect("an old ID still reveals")
        .into_inner();
    assert_eq!(
        (old.key_version, old.internal_seq.is_some()),
        (Some(0), true)
    );

    // The lease zone's 1 version bit holds versions 0 and 1.
    assert_eq!(rotate(&node, "narrow", false).await.unwrap(), 1);
    let err = rotate(&node, "narrow", false).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    for part in ["lease zone 6", "the snowflake layout"] {
        assert!(err.message().contains(part), "{part:?}: {}", err.message());
    }
    assert_eq!(lease_ids(&mut c, 3).await.len(), 3, "the zone still issues");

    // A hidden tag with 1 version bit likewise.
    common::hide_key(&node, TOKEN, "create", "tagged").await;
    let mut admin = AdminClient::connect(format!("http://{}", node.grpc))
        .await
        .unwrap();
    admin
        .create_tag(admin_req(proto::CreateTagRequest {
            tag: "items".into(),
            hide: Some(proto::TagHide {
                key: "tagged".into(),
                version_bits: 1,
                domain_bits: 40,
            }),
            ..Default::default()
        }))
        .await
        .expect("create hidden tag");
    assert_eq!(rotate(&node, "tagged", false).await.unwrap(), 1);
    let err = rotate(&node, "tagged", false).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("segment tag \"items\"")
            && err.message().contains("versions 0 to 1"),
        "{}",
        err.message()
    );
    node.kill();
}

/// The client crate reveals hidden IDs when built with the admin token
/// (`ClientBuilder::admin_token`): `decode_id` of a hidden lease ID
/// answers its internal ID, `parse_formatted` of a hidden counter its
/// internal counter; the same client without the token gets the public
/// view, a wrong token is refused as PERMISSION_DENIED, and a token a header
/// cannot carry is refused when the client is built.
#[tokio::test]
async fn the_client_crate_reveals_with_the_admin_token_only() {
    use idgen_client::{Client, Error};
    let dir = tempfile::tempdir().unwrap();
    let node = start(&config(dir.path(), HIDDEN));
    for key in ["orders", "tickets"] {
        common::hide_key(&node, TOKEN, "create", key).await;
    }
    let build = async |token: Option<&str>| {
        let mut b = Client::builder().endpoints([node.grpc.to_string()]);
        if let Some(t) = token {
            b = b.admin_token(t);
        }
        b.build().await
    };
    let admin = build(Some(TOKEN)).await.expect("client with the token");
    let anon = build(None).await.expect("client without");
    let wrong = build(Some("not-the-token"))
        .await
        .expect("client, wrong token");
    assert!(
        !format!("{admin:?}").contains(TOKEN),
        "the token shows in Debug"
    );

    // Lease: the client makes the IDs (no token sent), then decodes them.
    let ids = admin.gen_ids(Mode::Lease, "", 4).await.expect("lease IDs");
    let mut internal = Vec::new();
    for id in &ids {
        let seen = admin.decode_id(*id, Mode::Lease).await.expect("decode");
        assert_eq!((seen.hidden.as_str(), seen.zone), ("zone", 5));
        internal.push(seen.internal_id.expect("the admin sees the internal ID"));
        let public = anon.decode_id(*id, Mode::Lease).await.expect("decode");
        assert_eq!(
            (public.hidden.as_str(), public.internal_id, public.sequence),
            ("zone", None, 0),
            "the public view"
        );
        let refused = wrong.decode_id(*id, Mode::Lease).await.unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    }
    assert!(
        internal.windows(2).all(|w| w[1] == w[0] + 1),
        "the internal IDs of one batch are consecutive: {internal:?}"
    );

    // Formatted: the internal counter of a hidden `{seq:8:hidden}`.
    let made = admin
        .gen_formatted("orders", Vec::<(String, String)>::new(), 3)
        .await
        .expect("orders");
    let mut seqs = Vec::new();
    for id in &made.ids {
        let seen = admin.parse_formatted("orders", id).await.expect("parse");
        assert_eq!(seen.key_version, Some(0));
        seqs.push(seen.internal_seq.expect("the admin sees the counter"));
        let public = anon.parse_formatted("orders", id).await.expect("parse");
        assert_eq!((public.key_version, public.internal_seq), (Some(0), None));
    }
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // The hidden format's counter: to the admin client only.
    let counter = admin
        .format_counter("orders", Vec::<(String, String)>::new())
        .await
        .expect("the admin reads the hidden counter");
    assert!(counter.used && counter.last >= seqs[2], "{counter:?}");
    let refused = anon
        .format_counter("orders", Vec::<(String, String)>::new())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");

    // Each reveal is audit-logged by the node; the public views are not.
    let log = node.log_text();
    assert_eq!(log.matches("hidden lease ID decoded").count(), 4, "{log}");
    for bad in ["", "two\nlines"] {
        match build(Some(bad)).await {
            Err(Error::Config(why)) => assert!(why.contains("admin token"), "{why}"),
            other => panic!("token {bad:?} must be refused at build: {other:?}"),
        }
    }
}

/// DecodeId of a hidden segment tag's ID, as the admin or anonymously.
async fn decode_tag(
    c: &mut IdGenClient<Channel>,
    id: u64,
    tag: &str,
    admin: bool,
) -> Result<proto::DecodeIdResponse, tonic::Status> {
    let msg = proto::DecodeIdRequest {
        id,
        mode: Mode::Segment as i32,
        tag: tag.into(),
    };
    let req = if admin {
        admin_req(msg)
    } else {
        tonic::Request::new(msg)
    };
    Ok(c.decode_id(req).await?.into_inner())
}

/// A hidden segment tag's IDs reveal to their owner (issue 33, item 2:
/// DecodeId of one answered INVALID_ARGUMENT, whatever the token):
/// DecodeId with the tag gives an admin the internal value and key version
/// (audit-logged, counted) and anyone else the key version only; IDs of a
/// rotated-out version, and of a retired key, still reveal; an ID whose
/// version the key never had, a plain tag, an unknown tag and a tag with
/// another mode are refused, each saying why. The same over HTTP
/// (`/v1/decode?...&mode=segment&tag=users`) and with the documented
/// command, `idgen decode ID --mode segment --tag users --addr NODE`.
#[tokio::test]
async fn a_hidden_tags_ids_reveal_to_admins_over_grpc_http_and_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&config(dir.path(), "[segment]\nenabled = true\n"));
    common::hide_key(&node, TOKEN, "create", "users").await;
    let mut admin = AdminClient::connect(format!("http://{}", node.grpc))
        .await
        .unwrap();
    for (tag, hide) in [
        (
            "users",
            Some(proto::TagHide {
                key: "users".into(),
                version_bits: 4,
                domain_bits: 40,
            }),
        ),
        ("plain", None),
    ] {
        admin
            .create_tag(admin_req(proto::CreateTagRequest {
                tag: tag.into(),
                step: 100,
                hide,
                ..Default::default()
            }))
            .await
            .expect("create tag");
    }
    let mut c = node.client().await;
    let gen = |n| proto::GenIdsRequest {
        mode: Mode::Segment as i32,
        tag: "users".into(),
        count: n,
    };
    let ids = c.gen_ids(gen(5)).await.expect("GenIds").into_inner().ids;
    let mut internal = Vec::new();
    for id in &ids {
        let a = decode_tag(&mut c, *id, "users", true).await.expect("admin");
        assert_eq!(
            (a.mode, a.hidden.as_str(), a.key_version),
            (Mode::Segment as i32, "tag", Some(0)),
            "{a:?}"
        );
        internal.push(a.internal_id.expect("the admin sees the internal value"));
        let p = decode_tag(&mut c, *id, "users", false).await.expect("anon");
        assert_eq!(
            (p.hidden.as_str(), p.key_version, p.internal_id),
            ("tag", Some(0), None),
            "{p:?}"
        );
    }
    assert_eq!(internal, vec![1, 2, 3, 4, 5], "the tag's counter");

    // Rotated: new IDs carry version 1, old ones still reveal; retired: too.
    common::hide_key(&node, TOKEN, "rotate", "users").await;
    let later = c.gen_ids(gen(1)).await.expect("GenIds").into_inner().ids[0];
    let l = decode_tag(&mut c, later, "users", true)
        .await
        .expect("admin");
    assert_eq!((l.key_version, l.internal_id), (Some(1), Some(6)), "{l:?}");
    common::hide_key(&node, TOKEN, "retire", "users").await;
    for (id, version, inner) in [(ids[0], 0, 1), (later, 1, 6)] {
        let a = decode_tag(&mut c, id, "users", true)
            .await
            .expect("retired");
        assert_eq!((a.key_version, a.internal_id), (Some(version), Some(inner)));
    }
    refused_tag_decodes(&mut c, ids[0]).await;

    // HTTP /v1/decode with the tag.
    let path = format!("/v1/decode?id={}&mode=segment&tag=users", ids[0]);
    let (status, anon) = get(node.http, &path, None).await;
    assert_eq!(status, 200, "{anon}");
    assert_eq!(
        (anon["hidden"].as_str(), &anon["key_version"]),
        (Some("tag"), &Value::from(0))
    );
    assert!(anon.get("internal_id").is_none(), "{anon}");
    let bearer = format!("Bearer {TOKEN}");
    let (status, body) = get(node.http, &path, Some(&bearer)).await;
    assert_eq!(
        (status, &body["internal_id"]),
        (200, &Value::from("1")),
        "{body}"
    );
    refusals(node.http, &path).await;

    cli_tag_reveal(&node, ids[0]);
    let log = node.log_text();
    assert!(
        log.contains("hidden segment ID decoded") && log.contains("\"tag\":\"users\""),
        "no audit line naming the tag: {log}"
    );
    assert!(!log.contains(TOKEN), "the admin token was logged");
    let metrics = reqwest::get(format!("http://{}/metrics", node.http))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let name = "idgen_hidden_reveals_total{mode=\"segment\"}";
    let n = common::metric(&metrics, name).unwrap_or_default();
    assert!(n >= 10.0, "{name} = {n}");
    node.kill();
}

/// What DecodeId refuses around hidden tags, each with its reason.
async fn refused_tag_decodes(c: &mut IdGenClient<Channel>, id: u64) {
    // Version 9 was never made: not an ID this tag showed.
    let forged = (9u64 << 40) | 12345;
    let e = decode_tag(c, forged, "users", true).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("key version 9"), "{e:?}");
    let e = decode_tag(c, 1u64 << 50, "users", false).await.unwrap_err();
    assert!(
        e.code() == Code::InvalidArgument && e.message().contains("below 2^44"),
        "{e:?}"
    );
    let e = decode_tag(c, id, "plain", true).await.unwrap_err();
    assert!(
        e.code() == Code::InvalidArgument && e.message().contains("is not hidden"),
        "{e:?}"
    );
    let e = decode_tag(c, id, "nobody", true).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = decode_tag(c, id, "", true).await.unwrap_err();
    assert!(
        e.code() == Code::InvalidArgument && e.message().contains("--tag NAME"),
        "{e:?}"
    );
    let msg = proto::DecodeIdRequest {
        id,
        mode: Mode::Lease as i32,
        tag: "users".into(),
    };
    let e = c.decode_id(admin_req(msg)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let mut wrong = tonic::Request::new(proto::DecodeIdRequest {
        id,
        mode: Mode::Segment as i32,
        tag: "users".into(),
    });
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer wrong".parse().unwrap());
    let e = c.decode_id(wrong).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
}

/// The documented command, `idgen decode ID --mode segment --tag users
/// --addr NODE`: the key version without a token, the internal value with
/// `--admin-token-file` (text and JSON); offline it says to add --addr.
/// `idgen admin tags get users --json` shows the tag's `hide`.
fn cli_tag_reveal(node: &ChildServer, id: u64) {
    let addr = format!("http://{}", node.grpc);
    let id = id.to_string();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let file = file.to_string_lossy().into_owned();
    let decode = |extra: &[&str]| {
        let mut args = vec![
            "decode", &id, "--mode", "segment", "--tag", "users", "--addr", &addr,
        ];
        args.extend_from_slice(extra);
        let (ok, out) = run_idgen_with_env(&args, &[]);
        assert!(ok, "{args:?}: {out}");
        out
    };
    let anon = decode(&[]);
    assert!(
        anon.contains("tag users") && anon.contains("key version 0") && !anon.contains("internal"),
        "{anon}"
    );
    let text = decode(&["--admin-token-file", &file]);
    assert!(text.contains("internal id 1"), "{text}");
    let json = decode(&["--admin-token-file", &file, "--json"]);
    let line = json.lines().last().unwrap_or_default();
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(
        (&v["tag"], &v["key_version"], &v["internal_id"]),
        (&Value::from("users"), &Value::from(0), &Value::from("1")),
        "{v}"
    );
    let (ok, out) = run_idgen_with_env(&["decode", &id, "--mode", "segment"], &[]);
    assert!(!ok && out.contains("--addr NODE"), "{out}");

    let (ok, out) = run_idgen_with_env(
        &[
            "admin",
            "--addr",
            &addr,
            "--token-file",
            &file,
            "tags",
            "get",
            "users",
            "--json",
        ],
        &[],
    );
    assert!(ok, "{out}");
    let line = out.lines().last().unwrap_or_default();
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["tag"]["hide"]["key"], "users", "{v}");
    assert_eq!(v["tag"]["hide"]["domain_bits"], 40, "{v}");
    let (ok, out) = run_idgen_with_env(
        &[
            "admin",
            "--addr",
            &addr,
            "--token-file",
            &file,
            "tags",
            "get",
            "users",
        ],
        &[],
    );
    assert!(
        ok && out.contains("hide key users version_bits 4 domain_bits 40"),
        "{out}"
    );
}
