//! CORS for the HTTP API's `/v1/` endpoints (`server.http.cors_allow_origins`,
//! off by default): a browser page on an allowed origin may call them.
//!
//! - A preflight (`OPTIONS` with `Access-Control-Request-Method`) from an
//!   allowed origin is answered here, 204 with the allowed origin, `GET`,
//!   the headers the browser asked for and a 10-minute max age; from any
//!   other origin (or with CORS off) 403 naming the setting.
//! - Other calls go on as usual; from an allowed origin the answer carries
//!   `Access-Control-Allow-Origin` (and `Vary: Origin`).
//! - `Access-Control-Allow-Credentials` is never sent: the API takes no
//!   cookies or HTTP authentication, so a page never needs to send them,
//!   and with `*` a browser must not.
//!
//! The admin console's API (`/admin/`) is never opened to other origins.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::config::CorsOrigins;

/// How long a browser may cache a preflight's answer, in seconds.
const MAX_AGE_SECS: &str = "600";

/// The middleware (see the module doc).
pub async fn cors(State(origins): State<Arc<CorsOrigins>>, req: Request, next: Next) -> Response {
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let allowed = origin.as_deref().and_then(|o| origins.allow(o));
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        return match allowed {
            Some(value) => preflight_answer(&value, &req),
            None => refused(origin.as_deref(), &origins),
        };
    }
    let mut response = next.run(req).await;
    if let Some(value) = allowed.and_then(|v| HeaderValue::from_str(&v).ok()) {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

fn preflight_answer(origin: &str, req: &Request) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let headers = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(origin) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET"),
    );
    // The API reads no request header a page could set, so whatever the
    // browser asks for may be sent.
    if let Some(asked) = req.headers().get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
    }
    headers.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static(MAX_AGE_SECS),
    );
    headers.insert(
        header::VARY,
        HeaderValue::from_static(
            "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
        ),
    );
    response
}

fn refused(origin: Option<&str>, origins: &CorsOrigins) -> Response {
    let message = match (origin, origins) {
        (_, CorsOrigins::Off) => "cross-origin calls are off on this node: list the page's origin in server.http.cors_allow_origins (for example [\"https://app.example.com\"])".to_owned(),
        (Some(o), _) => format!("origin {o} is not in server.http.cors_allow_origins: add it there (scheme, host and port, as the browser sends it) to call this API from that page"),
        (None, _) => "a preflight without an Origin header: only browsers send preflights".to_owned(),
    };
    let body = json!({"error": {"code": "PERMISSION_DENIED", "message": message}});
    (StatusCode::FORBIDDEN, Json(body)).into_response()
}
