//! The HTTP API of one agent: routing, the headers every answer carries,
//! token checks, fault injection, blocking queries, and the one mapping
//! from errors to status codes. The endpoint modules translate between JSON
//! and [`crate::state`].

mod agent;
mod health;
mod kv;
mod session;
mod snapshot;
mod txn;

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use rand::Rng;
use serde_json::{Map, Value};

use crate::acl::Access;
use crate::cluster::Cluster;
use crate::duration;
use crate::faults::AgentFaults;
use crate::state::{ClusterState, StateError};

/// Largest KV value and txn body Consul accepts by default.
pub(crate) const MAX_VALUE_BYTES: usize = 512 * 1024;
/// Bodies are read up to this size; larger ones are refused outright.
const MAX_READ_BYTES: usize = 4 * 1024 * 1024;
/// Longest blocking-query wait Consul honours.
const MAX_WAIT: Duration = Duration::from_secs(600);
/// Wait used when `?index` comes without `?wait`.
const DEFAULT_WAIT: Duration = Duration::from_secs(300);

/// Endpoint names for request counters; also the routing table. A path
/// matches a name if it equals it or continues with `/`.
const ENDPOINTS: &[&str] = &[
    "kv",
    "txn",
    "session/create",
    "session/renew",
    "session/destroy",
    "session/info",
    "session/list",
    "session/node",
    "agent/service/register",
    "agent/service/deregister",
    "agent/check/pass",
    "agent/check/warn",
    "agent/check/fail",
    "agent/check/update",
    "agent/services",
    "agent/checks",
    "health/service",
    "catalog/services",
    "catalog/datacenters",
    "status/leader",
    "agent/self",
    "snapshot",
];

/// What a handler needs to know about the agent it runs on.
#[derive(Debug)]
pub(crate) struct AgentContext {
    /// Agent name, which is also its node name.
    pub(crate) name: String,
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) faults: Arc<AgentFaults>,
}

impl AgentContext {
    pub(crate) fn router(self: &Arc<Self>) -> Router {
        Router::new().fallback(dispatch).with_state(self.clone())
    }
}

/// Every error a handler can answer with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("Permission denied")]
    PermissionDenied,
    #[error("{0}")]
    NotFound(String),
    #[error("method {0} not allowed")]
    MethodNotAllowed(Method),
    #[error("{0}")]
    TooLarge(String),
    /// An RPC error Consul answers with 500 and plain text.
    #[error("{0}")]
    Internal(String),
    #[error(transparent)]
    State(#[from] StateError),
}

impl ApiError {
    /// The one mapping from errors to HTTP statuses.
    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::PermissionDenied => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) | ApiError::State(StateError::UnknownService(_)) => {
                StatusCode::NOT_FOUND
            }
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::State(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A successful answer before the common headers are added.
#[derive(Debug)]
pub(crate) struct Reply {
    status: StatusCode,
    body: ReplyBody,
    /// `X-Consul-Index`; `None` uses the current raft index.
    index: Option<u64>,
}

#[derive(Debug)]
enum ReplyBody {
    Json(Value),
    Raw(Vec<u8>),
    Empty,
}

impl Reply {
    pub(crate) fn json(body: Value) -> Self {
        Reply {
            status: StatusCode::OK,
            body: ReplyBody::Json(body),
            index: None,
        }
    }

    pub(crate) fn raw(bytes: Vec<u8>) -> Self {
        Reply {
            status: StatusCode::OK,
            body: ReplyBody::Raw(bytes),
            index: None,
        }
    }

    pub(crate) fn empty() -> Self {
        Reply {
            status: StatusCode::OK,
            body: ReplyBody::Empty,
            index: None,
        }
    }

    pub(crate) fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    pub(crate) fn with_index(mut self, index: u64) -> Self {
        self.index = Some(index);
        self
    }
}

pub(crate) type ApiResult = Result<Reply, ApiError>;

/// A parsed request, as the endpoint handlers see it.
#[derive(Debug)]
pub(crate) struct ApiRequest {
    pub(crate) method: Method,
    /// The part of the decoded path after the endpoint name and its `/`.
    pub(crate) rest: String,
    pub(crate) query: Query,
    pub(crate) access: Access,
    pub(crate) body: Bytes,
}

/// Decoded query parameters; flags like `?recurse` have an empty value.
#[derive(Debug, Default)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    fn parse(raw: Option<&str>) -> Self {
        let pairs = raw
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (percent_decode(k, true), percent_decode(v, true))
            })
            .collect();
        Query(pairs)
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(k, _)| k == name)
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A flag that Consul reads as a boolean when it has a value
    /// (`?passing`, `?passing=true`, but not `?passing=false`).
    pub(crate) fn flag(&self, name: &str) -> bool {
        match self.get(name) {
            None => false,
            Some(v) => !matches!(v, "false" | "0"),
        }
    }

    pub(crate) fn u64(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.get(name)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| ApiError::BadRequest(format!("Invalid {name} value {v:?}")))
            })
            .transpose()
    }
}

/// 16 bytes in the 8-4-4-4-12 hex form of a UUID.
pub(crate) fn uuid_text(bytes: [u8; 16]) -> String {
    let hex: String = bytes.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn percent_decode(text: &str, plus_is_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Case-insensitive access to a JSON object's fields. Consul decodes JSON
/// with Go's case-insensitive matching and also accepts snake_case names
/// (`ttl`, `check_id`, `grpc_use_tls`), so clients send all of these.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fields<'a>(&'a Map<String, Value>);

fn normalize_field(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

impl<'a> Fields<'a> {
    pub(crate) fn of(value: &'a Value, what: &str) -> Result<Self, ApiError> {
        value.as_object().map(Fields).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "Request decode failed: {what} must be a JSON object"
            ))
        })
    }

    /// The field, if present and not `null`.
    pub(crate) fn get(&self, name: &str) -> Option<&'a Value> {
        let want = normalize_field(name);
        self.0
            .iter()
            .find(|(k, _)| normalize_field(k) == want)
            .map(|(_, v)| v)
            .filter(|v| !v.is_null())
    }

    fn bad(name: &str, expected: &str) -> ApiError {
        ApiError::BadRequest(format!(
            "Request decode failed: field {name} must be {expected}"
        ))
    }

    pub(crate) fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        self.get(name)
            .map(|v| v.as_str().ok_or_else(|| Self::bad(name, "a string")))
            .transpose()
    }

    pub(crate) fn u64(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.get(name)
            .map(|v| {
                v.as_u64()
                    .or_else(|| {
                        v.as_f64()
                            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                            .map(|f| f as u64)
                    })
                    .ok_or_else(|| Self::bad(name, "a non-negative integer"))
            })
            .transpose()
    }

    pub(crate) fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.get(name)
            .map(|v| v.as_bool().ok_or_else(|| Self::bad(name, "a boolean")))
            .transpose()
    }

    pub(crate) fn list(&self, name: &str) -> Result<Option<&'a Vec<Value>>, ApiError> {
        self.get(name)
            .map(|v| v.as_array().ok_or_else(|| Self::bad(name, "a list")))
            .transpose()
    }

    pub(crate) fn str_list(&self, name: &str) -> Result<Option<Vec<String>>, ApiError> {
        let Some(items) = self.list(name)? else {
            return Ok(None);
        };
        items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| Self::bad(name, "a list of strings"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    pub(crate) fn object(&self, name: &str) -> Result<Option<Fields<'a>>, ApiError> {
        self.get(name)
            .map(|v| {
                v.as_object()
                    .map(Fields)
                    .ok_or_else(|| Self::bad(name, "an object"))
            })
            .transpose()
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = (&'a String, &'a Value)> {
        self.0.iter()
    }

    /// A duration field: a Go duration string, or a number of nanoseconds.
    pub(crate) fn duration(&self, name: &str) -> Result<Option<Duration>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => duration::parse(s)
                .map(Some)
                .ok_or_else(|| Self::bad(name, "a duration such as \"10s\"")),
            Some(v) => v
                .as_u64()
                .map(|n| Some(Duration::from_nanos(n)))
                .ok_or_else(|| Self::bad(name, "a duration such as \"10s\"")),
        }
    }
}

/// Parses a JSON body; an empty body is `{}` (Consul allows it where every
/// field is optional).
pub(crate) fn json_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(Map::new()));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("Request decode failed: {e}")))
}

/// `?index=N&wait=D` of a blocking query.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Blocking {
    min_index: u64,
    wait: Duration,
}

impl Blocking {
    pub(crate) fn from_query(query: &Query) -> Result<Option<Self>, ApiError> {
        let min_index = query
            .get("index")
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| ApiError::BadRequest("Invalid index".to_owned()))
            })
            .transpose()?
            .unwrap_or(0);
        let wait = match query.get("wait") {
            None | Some("") => DEFAULT_WAIT,
            Some(w) => duration::parse(w)
                .ok_or_else(|| ApiError::BadRequest("Invalid wait time".to_owned()))?,
        };
        // Consul never blocks on index 0.
        Ok((min_index > 0).then_some(Blocking {
            min_index,
            wait: wait.min(MAX_WAIT),
        }))
    }
}

/// Runs `read` until the index it reports passes the query's index, or the
/// wait (plus up to wait/16 of jitter, like Consul) runs out. Without a
/// blocking query it runs once. Returns the index and the last result.
pub(crate) async fn blocking_read<T>(
    cluster: &Cluster,
    blocking: Option<Blocking>,
    mut read: impl FnMut(&ClusterState) -> (u64, T),
) -> (u64, T) {
    let Some(blocking) = blocking else {
        return cluster.read(read);
    };
    let jitter_nanos = (blocking.wait.as_nanos() / 16) as u64;
    let jitter = Duration::from_nanos(rand::rng().random_range(0..=jitter_nanos));
    let deadline = tokio::time::Instant::now() + blocking.wait + jitter;
    let mut index_rx = cluster.subscribe_index();
    let mut shutdown = cluster.shutdown.clone();
    let restores = cluster.read(|st| st.restores);
    loop {
        index_rx.borrow_and_update();
        let ((index, value), restored) = cluster.read(|st| (read(st), st.restores != restores));
        if index > blocking.min_index || restored || tokio::time::Instant::now() >= deadline {
            return (index, value);
        }
        tokio::select! {
            changed = index_rx.changed() => if changed.is_err() { return (index, value) },
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutdown.changed() => return (index, value),
        }
    }
}

fn endpoint_of(path: &str) -> Option<(&'static str, &str)> {
    ENDPOINTS.iter().find_map(|name| {
        let rest = path.strip_prefix(name)?;
        if rest.is_empty() {
            Some((*name, ""))
        } else {
            rest.strip_prefix('/').map(|r| (*name, r))
        }
    })
}

fn token_of(headers: &HeaderMap) -> Option<String> {
    if let Some(token) = headers.get("x-consul-token").and_then(|v| v.to_str().ok()) {
        return Some(token.trim().to_owned());
    }
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    auth.strip_prefix("Bearer ").map(|t| t.trim().to_owned())
}

/// The fallback handler that serves every path of an agent.
async fn dispatch(State(agent): State<Arc<AgentContext>>, request: Request) -> Response {
    let path = percent_decode(request.uri().path(), false);
    if let Some(rest) = path.strip_prefix(CONTROL_PREFIX) {
        return control(&agent, rest, &request);
    }
    let route = path.strip_prefix("/v1/").and_then(endpoint_of);
    agent
        .cluster
        .counters
        .record(&agent.name, route.map_or("other", |(name, _)| name));

    let faults = agent.faults.current();
    if faults.refuse || faults.drop_requests {
        // Never answer: the connection task closes the connection on
        // `refuse`, and the client times out on `drop_requests`.
        std::future::pending::<()>().await;
    }
    if faults.no_leader {
        return finish(
            StatusCode::INTERNAL_SERVER_ERROR,
            ReplyBody::Raw(b"No cluster leader".to_vec()),
            None,
        );
    }

    let is_read = request.method() == Method::GET;
    let result = match route {
        Some((endpoint, rest)) => handle(&agent, endpoint, rest.to_owned(), request).await,
        None => Err(ApiError::NotFound(format!("404 page not found: {path}"))),
    };
    // Consul sets the query meta headers on reads that were served (a
    // value, or a 404 for a missing key), never on writes or errors.
    let response = match result {
        Ok(reply) => {
            let meta = is_read.then(|| {
                reply
                    .index
                    .unwrap_or_else(|| agent.cluster.read(|st| st.index))
            });
            finish(reply.status, reply.body, meta)
        }
        Err(error) => finish(
            error.status(),
            ReplyBody::Raw(error.to_string().into_bytes()),
            None,
        ),
    };
    if let Some(delay) = agent.faults.current().delay.or(faults.delay) {
        tokio::time::sleep(delay).await;
    }
    response
}

/// The test server's own control API. It lives outside Consul's `/v1`
/// space, so it can never shadow a Consul endpoint, and it ignores the
/// agent's faults (a test can still steer a server it cut off).
const CONTROL_PREFIX: &str = "/_testserver/";

/// `PUT /_testserver/leader-election`: runs
/// [`Faults::leader_election`](crate::Faults::leader_election) and answers
/// `{"SessionsRestarted": n}`. With ACLs on it needs the master token.
/// For tests that drive the `consul-testserver` binary from outside Rust.
fn control(agent: &AgentContext, rest: &str, request: &Request) -> Response {
    let answer = |status: StatusCode, text: &str| {
        finish(status, ReplyBody::Raw(text.as_bytes().to_vec()), None)
    };
    if !matches!(
        agent
            .cluster
            .resolve_token(token_of(request.headers()).as_deref()),
        Some(Access::All)
    ) {
        return answer(StatusCode::FORBIDDEN, "Permission denied");
    }
    match (request.method(), rest) {
        (&Method::PUT, "leader-election") => {
            let faults = crate::Faults {
                cluster: Arc::clone(&agent.cluster),
            };
            let restarted = faults.leader_election();
            finish(
                StatusCode::OK,
                ReplyBody::Json(serde_json::json!({ "SessionsRestarted": restarted })),
                None,
            )
        }
        (_, "leader-election") => answer(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("method {} not allowed", request.method()),
        ),
        (&Method::PUT, "wan-partition") => wan_partition(agent, request),
        (_, "wan-partition") => answer(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("method {} not allowed", request.method()),
        ),
        _ => answer(
            StatusCode::NOT_FOUND,
            &format!("unknown control endpoint {CONTROL_PREFIX}{rest}"),
        ),
    }
}

/// `PUT /_testserver/wan-partition?on=true|false[&dc=NAME]`: runs
/// [`Faults::wan_partition`](crate::Faults::wan_partition) on NAME (by
/// default the agent's own datacenter); NAME may be any linked datacenter,
/// so a partition can be healed through any agent. Answers
/// `{"Datacenter": NAME, "Partitioned": on}`.
fn wan_partition(agent: &AgentContext, request: &Request) -> Response {
    let query = Query::parse(request.uri().query());
    let bad = |text: String| {
        finish(
            StatusCode::BAD_REQUEST,
            ReplyBody::Raw(text.into_bytes()),
            None,
        )
    };
    let on = match query.get("on") {
        Some("true") => true,
        Some("false") => false,
        _ => return bad("wan-partition needs ?on=true or ?on=false".to_owned()),
    };
    let name = query
        .get("dc")
        .filter(|dc| !dc.is_empty())
        .unwrap_or(&agent.cluster.datacenter)
        .to_owned();
    let target = if name == agent.cluster.datacenter {
        Some(Arc::clone(&agent.cluster))
    } else {
        agent.cluster.federation.get(&name)
    };
    let Some(target) = target else {
        return bad(format!("no datacenter {name:?} is linked"));
    };
    target.set_partitioned(on);
    finish(
        StatusCode::OK,
        ReplyBody::Json(serde_json::json!({ "Datacenter": name, "Partitioned": on })),
        None,
    )
}

async fn handle(
    agent: &AgentContext,
    endpoint: &'static str,
    rest: String,
    request: Request,
) -> ApiResult {
    let query = Query::parse(request.uri().query());
    if query.has("stale") && query.has("consistent") {
        return Err(ApiError::BadRequest(
            "Cannot specify ?stale with ?consistent, conflicting semantics.".to_owned(),
        ));
    }
    let forwarded = forward(agent, endpoint, query.get("dc").unwrap_or(""))?;
    let agent = forwarded.as_ref();
    let access = agent
        .cluster
        .resolve_token(token_of(request.headers()).as_deref())
        .ok_or(ApiError::PermissionDenied)?;
    let method = request.method().clone();
    let body = if matches!(method, Method::PUT | Method::POST | Method::DELETE) {
        axum::body::to_bytes(request.into_body(), MAX_READ_BYTES)
            .await
            .map_err(|e| ApiError::TooLarge(format!("Request body could not be read: {e}")))?
    } else {
        Bytes::new()
    };
    agent
        .cluster
        .latency
        .wait(endpoint, &method, query.has("consistent"))
        .await;
    let req = ApiRequest {
        method,
        rest,
        query,
        access,
        body,
    };
    match endpoint {
        "kv" => kv::handle(agent, req).await,
        "txn" => txn::handle(agent, req),
        "session/create" => session::create(agent, req),
        "session/renew" => session::renew(agent, req),
        "session/destroy" => session::destroy(agent, req),
        "session/info" | "session/list" | "session/node" => {
            session::read(agent, endpoint, req).await
        }
        "agent/service/register" => agent::register(agent, req),
        "agent/service/deregister" => agent::deregister(agent, req),
        "agent/check/pass" | "agent/check/warn" | "agent/check/fail" | "agent/check/update" => {
            agent::update_check(agent, endpoint, req)
        }
        "agent/services" => agent::services(agent, req),
        "agent/self" => agent::agent_self(agent, req),
        "agent/checks" => agent::checks(agent, req),
        "health/service" => health::service(agent, req).await,
        "catalog/services" => health::catalog_services(agent, req).await,
        "catalog/datacenters" => health::catalog_datacenters(agent, req),
        "snapshot" => snapshot::handle(agent, req),
        "status/leader" => {
            require_method(&req, &[Method::GET])?;
            Ok(Reply::json(Value::String("127.0.0.1:8300".to_owned())))
        }
        _ => Err(ApiError::NotFound(format!(
            "404 page not found: {endpoint}"
        ))),
    }
}

/// The context a request runs in: the agent's own datacenter, or, with
/// `?dc=NAME`, NAME's state served through this agent, as a Consul server
/// forwards the RPC (`forwardDC` in `agent/consul/rpc.go`): an unknown
/// name answers 500 `No path to datacenter`, a linked one no server of
/// which answers (partitioned, shut down) 500 `Remote DC has no server
/// currently reachable`. The agent endpoints always describe the local
/// agent; `?dc=` there is only checked.
fn forward(agent: &AgentContext, endpoint: &str, dc: &str) -> Result<Arc<AgentContext>, ApiError> {
    use crate::cluster::RouteError;
    let target = agent
        .cluster
        .federation
        .route(&agent.cluster, dc)
        .map_err(|e| {
            tracing::debug!(dc, ?e, "request for a datacenter out of reach");
            ApiError::Internal(
                match e {
                    RouteError::NoPath => "No path to datacenter",
                    RouteError::Unreachable => "Remote DC has no server currently reachable",
                }
                .to_owned(),
            )
        })?;
    let cluster = if endpoint.starts_with("agent/") {
        Arc::clone(&agent.cluster)
    } else {
        target
    };
    Ok(Arc::new(AgentContext {
        name: agent.name.clone(),
        cluster,
        faults: Arc::clone(&agent.faults),
    }))
}

pub(crate) fn require_method(req: &ApiRequest, allowed: &[Method]) -> Result<(), ApiError> {
    if allowed.contains(&req.method) {
        Ok(())
    } else {
        Err(ApiError::MethodNotAllowed(req.method.clone()))
    }
}

/// Builds an answer; with `read_index`, a served read, it carries Consul's
/// query meta: `X-Consul-Index`, `X-Consul-KnownLeader`,
/// `X-Consul-LastContact`.
fn finish(status: StatusCode, body: ReplyBody, read_index: Option<u64>) -> Response {
    let (content_type, bytes) = match body {
        ReplyBody::Json(v) => ("application/json", v.to_string().into_bytes()),
        ReplyBody::Raw(b) if status.is_success() => ("application/octet-stream", b),
        ReplyBody::Raw(b) => ("text/plain; charset=utf-8", b),
        ReplyBody::Empty => ("text/plain; charset=utf-8", Vec::new()),
    };
    let mut response = (status, Body::from(bytes)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Some(index) = read_index {
        headers.insert("x-consul-index", HeaderValue::from(index.max(1)));
        headers.insert("x-consul-knownleader", HeaderValue::from_static("true"));
        headers.insert("x-consul-lastcontact", HeaderValue::from_static("0"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_counter_names() {
        assert_eq!(endpoint_of("kv/a/b"), Some(("kv", "a/b")));
        assert_eq!(endpoint_of("kv/"), Some(("kv", "")));
        assert_eq!(
            endpoint_of("session/renew/abc"),
            Some(("session/renew", "abc"))
        );
        assert_eq!(endpoint_of("txn"), Some(("txn", "")));
        assert_eq!(endpoint_of("txnx"), None);
        assert_eq!(
            endpoint_of("agent/check/pass/c1"),
            Some(("agent/check/pass", "c1"))
        );
    }

    #[test]
    fn query_and_percent_decoding() {
        let q = Query::parse(Some("recurse&cas=0&note=a+b%21&passing=false"));
        assert!(q.has("recurse"));
        assert_eq!(q.get("cas"), Some("0"));
        assert_eq!(q.get("note"), Some("a b!"));
        assert!(!q.flag("passing"));
        assert_eq!(percent_decode("a%2Fb+c%", false), "a/b+c%");
    }

    #[test]
    fn fields_match_case_insensitively_and_snake_case() {
        let v: Value = serde_json::json!({"ttl": "10s", "check_id": "c", "GRPCUseTLS": false});
        let f = Fields::of(&v, "body").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            f.duration("TTL").ok().flatten(),
            Some(Duration::from_secs(10))
        );
        assert_eq!(f.str("CheckID").ok().flatten(), Some("c"));
        assert_eq!(f.bool("grpc_use_tls").ok().flatten(), Some(false));
        assert!(f.str("TTL").is_ok());
        assert!(f.u64("TTL").is_err());
    }
}
