//! The admin console on the HTTP port: a small web page (`/admin/`) and the
//! JSON API behind it (`/admin/api/...`).
//!
//! The page's HTML, CSS and JavaScript are compiled into the binary and
//! nothing is fetched from anywhere else. Every asset carries a strict
//! Content-Security-Policy (scripts and styles from this origin only, no
//! inline script, no framing), so a value shown on the page (an instance
//! name, a tag description) can never run as code.
//!
//! The JSON API is a thin adapter over
//! [`AdminService`](super::admin::AdminService), the very instance the
//! gRPC port serves: each endpoint turns the HTTP request into a tonic
//! request (the `Authorization` header, the peer address, the verified
//! client certificate) and calls the `idgen.v1.Admin` method, so
//! `admin.allow`, the bearer token, `admin.client_cert_names` and every
//! rule of a call are the gRPC service's own code. Errors are the HTTP API's
//! shape, `{"error": {"code", "message"}}`, with the one status mapping
//! (`server::status`).
//!
//! Cross-site requests: the page sends the token in an `Authorization`
//! header read from `sessionStorage`, never a cookie, so another site cannot
//! make a browser send it. With client certificates (which a browser does
//! send by itself) a change still needs a JSON body
//! (`Content-Type: application/json`, which a cross-site form cannot send
//! without a CORS preflight this server never grants) and, when the browser
//! sends `Origin`, an origin equal to the `Host` it asked.
//!
//! Without any admin credential configured the page answers 404 and the
//! API 403, each saying how to turn the console on.

use std::future::Future;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use tonic::transport::server::TcpConnectInfo;
use tonic::Status;

use super::admin::ViaHttp;
use super::http_state::HttpState;
use super::status::{code_name, http_status};
use super::tls::PeerCertificate;
use crate::proto::admin_server::Admin;
use crate::proto::{self, HolderKind};

mod changes;
mod cluster;
mod datacenters;

pub use super::http_state::ClusterStatus;
pub use cluster::{node_view, now_ms};

const INDEX_HTML: &str = include_str!("console/index.html");
const CONSOLE_JS: &str = include_str!("console/console.js");
const CONSOLE_CSS: &str = include_str!("console/console.css");
const FAVICON_SVG: &str = include_str!("console/favicon.svg");

/// The policy of every console answer: this origin's script, style and
/// fetches only; no inline script or style, no plugins, no framing, no
/// form posts anywhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

/// Largest JSON body the console API reads.
const MAX_BODY: usize = 64 * 1024;

const DISABLED_PAGE: &str = "the admin console is disabled on this server: set admin.token or admin.token_file (or admin.client_cert_names, with TLS) in its config and restart it\n";

/// The console's routes, merged into the HTTP port's router.
pub fn routes() -> Router<HttpState> {
    Router::new()
        .route("/admin", get(redirect))
        .route("/admin/", get(index))
        .route("/admin/console.js", get(script))
        .route("/admin/console.css", get(style))
        .route("/admin/favicon.svg", get(icon))
        .route("/admin/api/holders", get(holders))
        .route("/admin/api/tags", get(tags))
        .route("/admin/api/strict", get(strict))
        .route("/admin/api/layout", get(layout))
        .route("/admin/api/formats", get(formats))
        .route("/admin/api/release", post(release))
        .route("/admin/api/renew", post(renew))
        .merge(changes::routes())
        .merge(datacenters::routes())
        .route("/admin/api/cluster", get(cluster::cluster))
        .route("/admin/api/hide-keys", get(hide_keys).post(change_hide_key))
        .route("/admin/api/{*rest}", get(no_endpoint).post(no_endpoint))
        .layer(axum::middleware::map_response(secure_headers))
}

/// Headers on every console answer (pages, assets and API alike).
async fn secure_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    response
}

async fn redirect() -> Response {
    (
        StatusCode::PERMANENT_REDIRECT,
        [(header::LOCATION, "/admin/")],
    )
        .into_response()
}

/// An embedded asset, or 404 when the admin API is off.
fn asset(s: &HttpState, content_type: &'static str, body: &'static str) -> Response {
    if !s.admin.enabled() {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            DISABLED_PAGE,
        )
            .into_response();
    }
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn index(State(s): State<HttpState>) -> Response {
    asset(&s, "text/html; charset=utf-8", INDEX_HTML)
}

async fn script(State(s): State<HttpState>) -> Response {
    asset(&s, "text/javascript; charset=utf-8", CONSOLE_JS)
}

async fn style(State(s): State<HttpState>) -> Response {
    asset(&s, "text/css; charset=utf-8", CONSOLE_CSS)
}

async fn icon(State(s): State<HttpState>) -> Response {
    asset(&s, "image/svg+xml", FAVICON_SVG)
}

/// A JSON error in the HTTP API's shape.
fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = json!({"error": {"code": code, "message": message.into()}});
    let mut response = (status, Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"idgen admin\""),
        );
    }
    response
}

/// A change refused before it reaches the admin service: status, code,
/// message.
struct Refused(StatusCode, &'static str, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        error(self.0, self.1, self.2)
    }
}

pub(super) fn status_response(s: &Status) -> Response {
    error(http_status(s.code()), code_name(s.code()), s.message())
}

async fn no_endpoint() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "NOT_FOUND",
        "no such console endpoint; see GET /admin/api/node, /cluster, /holders, /tags, /strict, /strict/keys?namespace=NS, /layout, /formats, /hide-keys, /datacenters and POST /admin/api/release, /renew, /hide-keys, /datacenters/release, /tags/create, /tags/update, /tags/delete, /formats/create, /formats/update, /formats/delete, /strict/step, /strict/keys/delete",
    )
}

/// `msg` as a tonic request carrying what the HTTP request proves: its
/// `Authorization` header, the peer address, the verified client
/// certificate.
pub(super) fn admin_request<T>(
    headers: &HeaderMap,
    extensions: &axum::http::Extensions,
    msg: T,
) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| tonic::metadata::MetadataValue::try_from(v.as_bytes()).ok())
    {
        r.metadata_mut().insert("authorization", v);
    }
    if let Some(info) = extensions.get::<TcpConnectInfo>() {
        r.extensions_mut().insert(info.clone());
    }
    if let Some(peer) = extensions.get::<PeerCertificate>() {
        r.extensions_mut().insert(peer.clone());
    }
    r.extensions_mut().insert(ViaHttp);
    r
}

/// Runs one admin call for a GET and renders its answer.
async fn read_call<Req, T, Fut>(
    request: Request,
    msg: Req,
    call: impl FnOnce(tonic::Request<Req>) -> Fut,
    render: impl FnOnce(T) -> Value,
) -> Response
where
    Fut: Future<Output = Result<tonic::Response<T>, Status>>,
{
    let (parts, _) = request.into_parts();
    match call(admin_request(&parts.headers, &parts.extensions, msg)).await {
        Ok(r) => Json(render(r.into_inner())).into_response(),
        Err(s) => status_response(&s),
    }
}

/// The JSON body of a change, after the cross-site checks.
async fn change_body<B: DeserializeOwned>(
    request: Request,
) -> Result<(axum::http::request::Parts, B), Refused> {
    let (parts, body) = request.into_parts();
    let json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if !json {
        return Err(Refused(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "INVALID_ARGUMENT",
            "console changes take a JSON body: send Content-Type: application/json".into(),
        ));
    }
    check_origin(&parts.headers)?;
    let bytes: Bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|_| {
        Refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            "INVALID_ARGUMENT",
            format!("the body is over {MAX_BODY} bytes"),
        )
    })?;
    let parsed = serde_json::from_slice(&bytes).map_err(|e| {
        Refused(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            format!("the JSON body does not fit this endpoint: {e}"),
        )
    })?;
    Ok((parts, parsed))
}

/// Refuses a change whose `Origin` (when the browser sends one) is not
/// the host it addressed.
fn check_origin(headers: &HeaderMap) -> Result<(), Refused> {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return Ok(());
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let origin_host = origin
        .split_once("://")
        .map_or(origin, |(_, rest)| rest)
        .trim_end_matches('/');
    if !host.is_empty() && origin_host.eq_ignore_ascii_case(host) {
        return Ok(());
    }
    Err(Refused(
        StatusCode::FORBIDDEN,
        "PERMISSION_DENIED",
        format!("a change from origin {origin:?} is refused: the console only accepts changes from its own page (host {host:?})"),
    ))
}

fn kind_name(kind: i32) -> &'static str {
    match HolderKind::try_from(kind) {
        Ok(HolderKind::Worker) => "worker",
        Ok(HolderKind::LeaseToken) => "lease_token",
        Ok(HolderKind::FormatToken) => "format_token",
        _ => "unspecified",
    }
}

/// A holder as JSON; sequences are decimal strings (they may pass 2^53).
fn holder_json(h: &proto::Holder) -> Value {
    json!({
        "kind": kind_name(h.kind),
        "datacenter": h.datacenter,
        "zone": h.zone,
        "id": h.id,
        "space": h.space,
        "rendered": h.rendered,
        "instance": h.instance,
        "address": h.address,
        "since": h.since,
        "session": h.session,
        "state": h.state,
        "reserved": h.reserved.to_string(),
        "lock_delay_ms": h.lock_delay_ms,
        "session_ttl_ms": h.session_ttl_ms,
    })
}

async fn holders(State(s): State<HttpState>, request: Request) -> Response {
    read_call(
        request,
        proto::ListHoldersRequest {},
        |r| async move { s.admin.list_holders(r).await },
        |h| json!({"backend": h.backend, "holders": h.holders.iter().map(holder_json).collect::<Vec<_>>()}),
    )
    .await
}

async fn tags(State(s): State<HttpState>, request: Request) -> Response {
    read_call(
        request,
        proto::ListTagsRequest {},
        |r| async move { s.admin.list_tags(r).await },
        |t| {
            let tags: Vec<Value> = t
                .tags
                .iter()
                .map(|t| {
                    json!({
                        "tag": t.tag, "max_id": t.max_id.to_string(), "step": t.step,
                        "next": t.max_id.saturating_add(1).to_string(),
                        "description": t.description, "created": t.created, "updated": t.updated,
                        "hide": changes::hide_json(t.hide.as_ref()),
                    })
                })
                .collect();
            let unreadable: Vec<Value> = t
                .unreadable
                .iter()
                .map(|u| json!({"key": u.key, "error": u.error}))
                .collect();
            json!({"tags": tags, "unreadable": unreadable})
        },
    )
    .await
}

async fn strict(State(s): State<HttpState>, request: Request) -> Response {
    read_call(
        request,
        proto::ListStrictNamespacesRequest {},
        |r| async move { s.admin.list_strict_namespaces(r).await },
        |n| {
            let namespaces: Vec<Value> = n
                .namespaces
                .iter()
                .map(|n| json!({"namespace": n.namespace, "step": n.step, "step_stored": n.step_stored}))
                .collect();
            json!({"namespaces": namespaces, "default_step": n.default_step})
        },
    )
    .await
}

fn layout_json(l: Option<&proto::IdLayout>) -> Value {
    l.map_or(Value::Null, |l| {
        json!({
            "preset": l.preset, "epoch": l.epoch, "epoch_ms": l.epoch_ms,
            "time_unit_ms": l.time_unit_ms, "time_bits": l.time_bits,
            "datacenter_bits": l.datacenter_bits, "worker_bits": l.worker_bits,
            "sequence_bits": l.sequence_bits,
        })
    })
}

async fn layout(State(s): State<HttpState>, request: Request) -> Response {
    read_call(
        request,
        proto::GetLayoutRequest {},
        |r| async move { s.admin.get_layout(r).await },
        |l| {
            let history: Vec<Value> = l
                .history
                .iter()
                .map(|h| {
                    json!({
                        "generation": h.generation, "layout": layout_json(h.layout.as_ref()),
                        "replaced_ms": h.replaced_ms, "max_id": h.max_id.to_string(),
                    })
                })
                .collect();
            json!({
                "layout": layout_json(l.layout.as_ref()), "generation": l.generation,
                "floor_ms": l.floor_ms, "changing": l.changing, "history": history,
            })
        },
    )
    .await
}

/// A format's counter now (its durable record: the period it is in, named
/// as its IDs render it, and the last value any node may have used in it);
/// for a scoped format, how many counters it stores. `who` is the
/// console's admin caller: a hidden format's counter is read as theirs,
/// audit-logged. A failed read is an `error` beside the counter, never in
/// its place.
async fn current_counter(
    issuer: &crate::modes::Issuer,
    name: &str,
    reset: crate::id::format::Reset,
    who: &str,
) -> Value {
    use crate::modes::formatted::CounterOverview;
    match issuer.format_counter_overview(name, who).await {
        Ok(CounterOverview::Single(Some(c))) => json!({
            "used": true, "period": c.record.period.0,
            "period_label": c.record.period.label(reset),
            "last": c.record.last.to_string(),
            "next_period_start_ms": c.next_period_start_ms, "format_token": c.token,
        }),
        Ok(CounterOverview::Single(None)) => json!({"used": false}),
        Ok(CounterOverview::Scoped { params, counters }) => {
            json!({"scoped": true, "scope_params": params, "counters": counters})
        }
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// The formats this node serves as its engine compiled them, each with
/// its allowed range and its current counter.
async fn format_list(issuer: std::sync::Arc<crate::modes::Issuer>, who: String) -> Value {
    let Some(formats) = issuer.formats() else {
        return json!({"enabled": false, "formats": []});
    };
    let mut list = Vec::new();
    for name in formats.names() {
        let Ok(f) = formats.get(&name) else { continue };
        let counter = f.counter();
        let def = f.def();
        let kind = if def.lua.is_some() {
            "lua"
        } else if def.preset.is_some() {
            "preset"
        } else {
            "template"
        };
        list.push(json!({
            "name": f.name(),
            "kind": kind,
            "definition": def,
            "scope": f.scope(),
            "scope_params": def.scope_params,
            "time_zone": f.time_zone().name(),
            "reset": format!("{:?}", f.reset()).to_lowercase(),
            "numeric": f.numeric(),
            "counter": {"min": counter.min.to_string(), "max": counter.max.to_string(), "step": counter.step},
            "current": current_counter(&issuer, &name, f.reset(), &who).await,
        }));
    }
    json!({"enabled": true, "formats": list})
}

/// The formats this node serves (authorized like every admin call).
async fn formats(State(s): State<HttpState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let r = admin_request(&parts.headers, &parts.extensions, ());
    let issuer = std::sync::Arc::clone(&s.issuer);
    // Used only once `call` has checked the credentials.
    let who = s.admin.caller_name(&r);
    let result = s
        .admin
        .call(crate::metrics::CONSOLE_FORMATS_METHOD, r, |()| async move {
            Ok(format_list(issuer, who).await)
        })
        .await;
    match result {
        Ok(v) => Json(v.into_inner()).into_response(),
        Err(s) => status_response(&s),
    }
}

/// `POST /admin/api/release`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseBody {
    /// `worker`, `lease_token` or `format_token`.
    kind: String,
    #[serde(default)]
    datacenter: u64,
    #[serde(default)]
    zone: u64,
    /// The space of a format token.
    #[serde(default)]
    space: String,
    id: u64,
    #[serde(default)]
    force: bool,
}

async fn release(State(s): State<HttpState>, request: Request) -> Response {
    let (parts, body) = match change_body::<ReleaseBody>(request).await {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let kind = match body.kind.as_str() {
        "worker" => HolderKind::Worker,
        "lease_token" | "token" => HolderKind::LeaseToken,
        "format_token" => HolderKind::FormatToken,
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                "INVALID_ARGUMENT",
                format!("kind {other:?} is not one to release: use \"worker\", \"lease_token\" or \"format_token\""),
            )
        }
    };
    let msg = proto::ForceReleaseRequest {
        kind: kind as i32,
        datacenter: body.datacenter,
        zone: body.zone,
        id: body.id,
        force: body.force,
        space: body.space,
    };
    match s
        .admin
        .force_release(admin_request(&parts.headers, &parts.extensions, msg))
        .await
    {
        Ok(r) => {
            let r = r.into_inner();
            Json(json!({
                "released": r.released,
                "holder": r.holder.as_ref().map(holder_json),
                "waited_ms": r.waited_ms,
                "message": r.message,
            }))
            .into_response()
        }
        Err(e) => status_response(&e),
    }
}

/// `POST /admin/api/renew`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewBody {
    session: String,
}

async fn renew(State(s): State<HttpState>, request: Request) -> Response {
    let (parts, body) = match change_body::<RenewBody>(request).await {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let msg = proto::RenewSessionRequest {
        session: body.session,
    };
    match s
        .admin
        .renew_session(admin_request(&parts.headers, &parts.extensions, msg))
        .await
    {
        Ok(r) => {
            let r = r.into_inner();
            Json(json!({
                "session": r.session,
                "ttl_ms": r.ttl_ms,
                "holders": r.holders.iter().map(holder_json).collect::<Vec<_>>(),
                "message": r.message,
            }))
            .into_response()
        }
        Err(e) => status_response(&e),
    }
}

/// `GET /admin/api/hide-keys`: every hide key's versions and states.
async fn hide_keys(State(s): State<HttpState>, request: Request) -> Response {
    read_call(
        request,
        proto::ListHideKeysRequest {},
        |r| async move { s.admin.list_hide_keys(r).await },
        |k| json!({"keys": k.keys.iter().map(super::admin::hide_key_json).collect::<Vec<_>>()}),
    )
    .await
}

/// `POST /admin/api/hide-keys`: `{"action": "create"|"rotate"|"retire",
/// "key_id": "...", "force": false}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HideKeyBody {
    action: String,
    key_id: String,
    /// A rotation past what a namespace using the key can hold
    /// (`idgen admin keys rotate --force`); only with `rotate`.
    #[serde(default)]
    force: bool,
}

async fn change_hide_key(State(s): State<HttpState>, request: Request) -> Response {
    let (parts, body) = match change_body::<HideKeyBody>(request).await {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let (h, x, key_id) = (&parts.headers, &parts.extensions, body.key_id);
    if body.force && body.action != "rotate" {
        return error(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            format!(
                "force applies to a rotation only, not to {:?}: leave it out",
                body.action
            ),
        );
    }
    let r = match body.action.as_str() {
        "create" => {
            let m = proto::CreateHideKeyRequest { key_id };
            s.admin.create_hide_key(admin_request(h, x, m)).await
        }
        "rotate" => {
            let force = body.force;
            let m = proto::RotateHideKeyRequest { key_id, force };
            s.admin.rotate_hide_key(admin_request(h, x, m)).await
        }
        "retire" => {
            let m = proto::RetireHideKeyRequest { key_id };
            s.admin.retire_hide_key(admin_request(h, x, m)).await
        }
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                "INVALID_ARGUMENT",
                format!("action {other:?} is not a hide key change: use \"create\", \"rotate\" or \"retire\""),
            )
        }
    };
    match r {
        Ok(r) => Json(json!({"key": r.into_inner().key.as_ref().map(super::admin::hide_key_json)}))
            .into_response(),
        Err(e) => status_response(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn changes_from_another_origin_are_refused() {
        let ok = |h: &HeaderMap| check_origin(h).is_ok();
        assert!(
            ok(&headers(&[(header::HOST, "127.0.0.1:8080")])),
            "no Origin: not a browser's cross-site call"
        );
        assert!(ok(&headers(&[
            (header::HOST, "127.0.0.1:8080"),
            (header::ORIGIN, "http://127.0.0.1:8080"),
        ])));
        assert!(ok(&headers(&[
            (header::HOST, "idgen.example:8443"),
            (header::ORIGIN, "https://IDGEN.example:8443"),
        ])));
        for origin in ["http://evil.example", "http://127.0.0.1:8081", "null"] {
            assert!(
                !ok(&headers(&[
                    (header::HOST, "127.0.0.1:8080"),
                    (header::ORIGIN, origin)
                ])),
                "{origin}"
            );
        }
        assert!(
            !ok(&headers(&[(header::ORIGIN, "http://127.0.0.1:8080")])),
            "no Host to match"
        );
    }

    #[test]
    fn the_page_runs_no_inline_script_and_holds_no_secret() {
        assert!(INDEX_HTML.contains("<script src=\"console.js\""));
        let inline = INDEX_HTML.matches("<script").count();
        assert_eq!(
            inline,
            INDEX_HTML.matches("<script src=").count(),
            "every script is a file"
        );
        for bad in ["style=", "javascript:", "http://", "https://", "token="] {
            assert!(!INDEX_HTML.contains(bad), "{bad}");
        }
        let handler = INDEX_HTML.split(" on").skip(1).any(|rest| {
            let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        });
        assert!(!handler, "no inline event handler");
        assert!(
            !CONSOLE_JS.contains("innerHTML"),
            "values are set as text, never parsed as HTML"
        );
        assert!(!CONSOLE_JS.contains("localStorage") && !CONSOLE_JS.contains("document.cookie"));
        assert!(CONTENT_SECURITY_POLICY.contains("script-src 'self'"));
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe"));
    }
}
