//! The HTTP port: Prometheus metrics, liveness and readiness, and a small
//! JSON API for callers without gRPC. IDs are decimal strings in JSON.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::error::Error;
use crate::id::{Mode, RequestError};

// Defined in their own file: the console's routes take the same state.
pub use super::http_state::{HttpMetrics, HttpState};
use super::status::{code, code_name, http_status};

mod uuid;

/// The HTTP routes.
pub fn router(state: HttpState) -> Router {
    // The JSON API, which browsers on `server.http.cors_allow_origins`
    // may call (the console's `/admin/` API never).
    let api = Router::new()
        .route("/v1/id", get(gen_id))
        .route("/v1/ids", get(gen_ids))
        .route("/v1/decode", get(decode))
        .route("/v1/formatted/{name}", get(gen_formatted))
        .route("/v1/formatted/{name}/parse", get(parse_formatted))
        .route("/v1/uuid", get(uuid::gen_uuid))
        .route("/v1/uuids", get(uuid::gen_uuids))
        .route("/v1/uuid/decode", get(uuid::decode_uuid))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state.cors),
            super::cors::cors,
        ));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .merge(api)
        .merge(super::console::routes())
        .fallback(not_found)
        .layer(axum::middleware::map_response(no_store))
        .with_state(state)
}

/// Every answer is fresh: a caching proxy between a client and the node
/// must never hand one ID (or one health verdict) to several clients.
async fn no_store(mut response: Response) -> Response {
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

/// A JSON error body: `{"error": {"code": "INVALID_ARGUMENT", "message": ...}}`.
struct ApiError(Error);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let c = code(&self.0);
        let body = json!({"error": {"code": code_name(c), "message": self.0.to_string()}});
        (http_status(c), Json(body)).into_response()
    }
}

/// Query parameters of the ID endpoints; unknown ones are refused so a typo
/// (`cout=5`) is an error, not a silent default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IdQuery {
    mode: Option<String>,
    tag: Option<String>,
    count: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecodeQuery {
    id: String,
    mode: Option<String>,
    /// A hidden segment tag's name (`mode=segment`).
    tag: Option<String>,
}

fn parse_query<T: serde::de::DeserializeOwned>(raw: Option<String>) -> Result<T, Error> {
    serde_urlencoded::from_str(raw.as_deref().unwrap_or(""))
        .map_err(|e| RequestError::BadQuery(format!("query string: {e}")).into())
}

fn parse_mode(mode: Option<&str>) -> Result<Mode, Error> {
    Ok(mode
        .map(Mode::parse)
        .transpose()?
        .unwrap_or(Mode::Snowflake))
}

async fn gen_id(State(s): State<HttpState>, RawQuery(raw): RawQuery) -> Response {
    let started = Instant::now();
    let result = async {
        let q: IdQuery = parse_query(raw)?;
        if q.count.is_some() {
            return Err(RequestError::BadQuery("count is for /v1/ids".into()).into());
        }
        let mode = parse_mode(q.mode.as_deref())?;
        s.issuer.gen_id(mode, q.tag.as_deref().unwrap_or("")).await
    }
    .await;
    s.rpc.id.observe(started, &result);
    match result {
        Ok(id) => Json(json!({"id": id.to_string()})).into_response(),
        Err(e) => ApiError(e).into_response(),
    }
}

async fn gen_ids(State(s): State<HttpState>, RawQuery(raw): RawQuery) -> Response {
    let started = Instant::now();
    let result = async {
        let q: IdQuery = parse_query(raw)?;
        let mode = parse_mode(q.mode.as_deref())?;
        let count = q.count.ok_or_else(|| {
            RequestError::BadQuery(format!(
                "count is required, from 1 to {}",
                s.issuer.max_batch()
            ))
        })?;
        s.issuer
            .gen_ids(mode, q.tag.as_deref().unwrap_or(""), count)
            .await
    }
    .await;
    s.rpc.ids.observe(started, &result);
    match result {
        Ok(ids) => {
            let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
            Json(json!({ "ids": ids })).into_response()
        }
        Err(e) => ApiError(e).into_response(),
    }
}

/// The admin caller of an HTTP request that presents admin credentials
/// (`Authorization: Bearer <admin token>`, or a client certificate named
/// in `admin.client_cert_names`), checked exactly as the console's API
/// checks them: `admin.allow`, the token, the certificate, the throttle.
/// `Ok(None)` for an anonymous caller (the public view); credentials that
/// are presented and fail are refused as the console refuses them (401,
/// 403, 429), never answered with the public view, so a typo in a token
/// shows.
fn admin_caller(s: &HttpState, request: Request) -> Result<Option<String>, Box<Response>> {
    let (parts, _) = request.into_parts();
    let call = super::console::admin_request(&parts.headers, &parts.extensions, ());
    s.admin
        .admin_caller(&call)
        .map_err(|status| Box::new(super::console::status_response(&status)))
}

/// `GET /v1/decode?id=N[&mode=M][&tag=T]`: the parts of an ID; a hidden one's
/// internal parts for an admin caller ([`admin_caller`]), audit-logged.
async fn decode(State(s): State<HttpState>, RawQuery(raw): RawQuery, request: Request) -> Response {
    let started = Instant::now();
    let who = match admin_caller(&s, request) {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let result = async {
        let q: DecodeQuery = parse_query(raw)?;
        let id: u64 = q.id.parse().map_err(|_| {
            RequestError::BadQuery(format!(
                "id {:?} is not a decimal 64-bit unsigned integer",
                q.id
            ))
        })?;
        let tag = q.tag.as_deref().unwrap_or("");
        s.issuer
            .decode_as(parse_mode(q.mode.as_deref())?, id, tag, who.as_deref())
            .await
    }
    .await;
    s.rpc.decode.observe(started, &result);
    match result {
        Ok(d) => Json(d).into_response(),
        Err(e) => ApiError(e).into_response(),
    }
}

/// `count` and `param.<name>` from a formatted-ID query; anything else is
/// refused by name.
fn formatted_query(raw: Option<String>) -> Result<(u64, Vec<(String, String)>), Error> {
    let pairs: Vec<(String, String)> = parse_query(raw)?;
    let mut count = None;
    let mut params = Vec::new();
    for (k, v) in pairs {
        if k == "count" {
            let n = v.parse::<u64>().map_err(|_| {
                RequestError::BadQuery(format!("count {v:?} is not a whole number"))
            })?;
            count = Some(n);
        } else if let Some(name) = k.strip_prefix("param.") {
            params.push((name.to_owned(), v));
        } else {
            return Err(RequestError::BadQuery(format!(
                "unknown query parameter {k:?}; use count=N and param.<name>=<value>"
            ))
            .into());
        }
    }
    params.sort();
    Ok((count.unwrap_or(1), params))
}

async fn gen_formatted(
    State(s): State<HttpState>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let started = Instant::now();
    let result = async {
        let (count, params) = formatted_query(raw)?;
        s.issuer.gen_formatted(&name, &params, count).await
    }
    .await;
    s.rpc.formatted.observe(started, &result);
    match result {
        Ok(issued) => {
            let numbers: Option<Vec<String>> = issued
                .numeric
                .then(|| {
                    issued
                        .ids
                        .iter()
                        .map(|r| r.number.map(|n| n.to_string()))
                        .collect()
                })
                .flatten();
            let ids: Vec<&str> = issued.ids.iter().map(|r| r.text.as_str()).collect();
            match numbers {
                Some(numbers) => Json(json!({ "ids": ids, "numbers": numbers })),
                None => Json(json!({ "ids": ids })),
            }
            .into_response()
        }
        Err(e) => ApiError(e).into_response(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ParseQuery {
    id: String,
}

/// `GET /v1/formatted/<name>/parse?id=ID`: the fields of a formatted ID;
/// a hidden counter's key version to anyone, its internal value to an
/// admin caller ([`admin_caller`]), audit-logged.
async fn parse_formatted(
    State(s): State<HttpState>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
    request: Request,
) -> Response {
    let started = Instant::now();
    let who = match admin_caller(&s, request) {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let result = match parse_query::<ParseQuery>(raw) {
        Ok(q) => {
            s.issuer
                .parse_formatted_as(&name, &q.id, who.as_deref())
                .await
        }
        Err(e) => Err(e),
    };
    s.rpc.parse.observe(started, &result);
    match result {
        Ok((p, view)) => Json(json!({
            "year": p.year, "month": p.month, "day": p.day, "hour": p.hour,
            "minute": p.minute, "second": p.second, "unix_seconds": p.unix_s,
            "node": p.node, "token": p.token, "seq": p.seq,
            "params": p.params.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
            "check": p.check,
            "key_version": view.map(|v| v.key_version),
            "internal_seq": view.and_then(|v| v.internal),
        }))
        .into_response(),
        Err(e) => ApiError(e).into_response(),
    }
}

async fn metrics(State(s): State<HttpState>) -> Response {
    s.issuer.update_runway_gauges();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render() + &crate::metrics::process::render(),
    )
        .into_response()
}

async fn healthz(State(s): State<HttpState>) -> Response {
    if s.live.load(Ordering::Acquire) {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "unable to issue for longer than store.max_unhealthy (fenced, or the state store cannot write or confirm marks); restart this node\n",
        )
            .into_response()
    }
}

async fn readyz(State(s): State<HttpState>) -> Response {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n").into_response()
    } else if let Some(reason) = s.issuer.gate().fence_reason() {
        // Fenced for a named cause (a layout change): say it here too.
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not serving: {reason}\n"),
        )
            .into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not serving\n").into_response()
    }
}

async fn not_found() -> Response {
    let body = json!({"error": {"code": "NOT_FOUND", "message": "no such endpoint; see /v1/id, /v1/ids?count=N, /v1/decode?id=N, /v1/formatted/<name>?count=N&param.<name>=<value>, /v1/formatted/<name>/parse?id=<id>, /v1/uuid, /v1/uuids?count=N, /v1/uuid/decode?uuid=<text>, /metrics, /healthz, /readyz, /admin/ (the admin console)"}});
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}
