//! The Rust driver of the conformance suite (`clients/conformance/`): reads
//! JSON requests, one per line, on stdin and answers each with one JSON
//! line on stdout, calling the idgen-client crate, so that the runner holds
//! this crate to the same scenarios as the Python and TypeScript clients.
//! The protocol is docs/CONFORMANCE.md's; logs go to stderr only.
//!
//! Run: `cargo run -p idgen-client --example conformance` (the runner
//! starts it once per scenario).

use std::io::{BufRead, Write};
use std::time::Duration;

use idgen_client::{Client, ConsulDiscovery, Error, Mode, PrefetchConfig, TlsConfig};
use serde_json::{json, Map, Value};

/// One failed request: the protocol's code, the client's message, and
/// whether the request may have reached a node.
struct Failure {
    code: &'static str,
    message: String,
    sent: bool,
    /// IDs received before the failure (`next` only).
    ids: Option<Vec<String>>,
}

impl Failure {
    /// A request the driver could not read: never sent.
    fn bad_request(message: impl Into<String>) -> Self {
        Self {
            code: "INVALID_ARGUMENT",
            message: message.into(),
            sent: false,
            ids: None,
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let (code, sent) = match &e {
            Error::Status { code, .. } => (code_name(*code), true),
            // A call cut off by the deadline may have reached a node unless
            // no attempt was made at all.
            Error::DeadlineExceeded { attempts, .. } => ("DEADLINE_EXCEEDED", *attempts > 0),
            Error::Transport { .. } => ("UNAVAILABLE", true),
            Error::NoNodes => ("UNAVAILABLE", false),
            // Refused before sending: the nodes in use are a fallback datacenter's.
            Error::CrossesDatacenters { .. } => ("UNAVAILABLE", false),
            Error::Discovery(_) => ("UNAVAILABLE", false),
            Error::Config(_) | Error::StrictNotPrefetchable => ("CONFIG", false),
            Error::BadAnswer { .. } => ("INTERNAL", true),
        };
        Self {
            code,
            message: e.to_string(),
            sent,
            ids: None,
        }
    }
}

/// The gRPC code's canonical name (`UNAVAILABLE`), as every driver spells it.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

type Answer = Result<Map<String, Value>, Failure>;

fn main() {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("conformance driver: cannot start a tokio runtime: {e}");
            std::process::exit(2);
        }
    };
    let mut client: Option<Client> = None;
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                eprintln!("conformance driver: stdin: {e}");
                std::process::exit(2);
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let request: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("conformance driver: not JSON ({e}): {line}");
                std::process::exit(2);
            }
        };
        let id = request.get("id").cloned().unwrap_or(Value::Null);
        let op = request.get("op").and_then(Value::as_str).unwrap_or("");
        let answer = runtime.block_on(handle(&mut client, op, &request));
        let mut out = Map::new();
        out.insert("id".into(), id);
        match answer {
            Ok(fields) => {
                out.insert("ok".into(), Value::Bool(true));
                out.extend(fields);
            }
            Err(f) => {
                out.insert("ok".into(), Value::Bool(false));
                out.insert("code".into(), f.code.into());
                out.insert("message".into(), f.message.into());
                out.insert("sent".into(), f.sent.into());
                if let Some(ids) = f.ids {
                    out.insert("ids".into(), ids.into());
                }
            }
        }
        let mut stdout = std::io::stdout().lock();
        let written = writeln!(stdout, "{}", Value::Object(out)).and_then(|()| stdout.flush());
        if let Err(e) = written {
            eprintln!("conformance driver: stdout: {e}");
            std::process::exit(2);
        }
        if op == "close" {
            break;
        }
    }
}

/// Answers one request.
async fn handle(client: &mut Option<Client>, op: &str, req: &Value) -> Answer {
    if op == "open" {
        let built = open(req).await?;
        let nodes = built.nodes();
        *client = Some(built);
        return Ok(fields([("nodes", json!(nodes))]));
    }
    if op == "close" {
        *client = None;
        return Ok(Map::new());
    }
    let Some(c) = client.as_ref() else {
        return Err(Failure::bad_request(format!(
            "{op:?} before a successful open"
        )));
    };
    match op {
        "gen" => {
            let (ids, node) = c
                .gen_ids_from(mode(req)?, &text(req, "tag")?, count(req)?)
                .await?;
            Ok(fields([("ids", strings(&ids)), ("node", json!(node))]))
        }
        "next" => next(c, req).await,
        "formatted" => {
            let none: [(String, String); 0] = [];
            let r = c
                .gen_formatted(&text(req, "format")?, none, count(req)?)
                .await?;
            Ok(fields([("ids", json!(r.ids))]))
        }
        "parse" => parse(c, req).await,
        "counter" => {
            let none: [(String, String); 0] = [];
            let r = c.format_counter(&text(req, "format")?, none).await?;
            let counter = json!({
                "used": r.used.to_string(),
                "period": r.period.to_string(),
                "last": r.last.to_string(),
                "next_period_start_ms": r.next_period_start_ms.to_string(),
                "token": r.token,
            });
            Ok(fields([("counter", counter)]))
        }
        "decode" => {
            let r = c.decode_id(id_arg(req)?, mode(req)?).await?;
            Ok(fields([("fields", decoded(&r))]))
        }
        "reveal" => {
            let r = c
                .decode_segment_id(&text(req, "tag")?, id_arg(req)?)
                .await?;
            Ok(fields([("fields", decoded(&r))]))
        }
        "uuid" => {
            let uuids = c.gen_uuids(count(req)?).await?;
            let text: Vec<String> = uuids.iter().map(ToString::to_string).collect();
            Ok(fields([("uuids", json!(text))]))
        }
        "strict_route" => {
            let node = c.strict_node(&text(req, "key")?);
            Ok(fields([("node", json!(node))]))
        }
        "nodes" => Ok(fields([("nodes", json!(c.nodes()))])),
        other => Err(Failure {
            code: "UNIMPLEMENTED",
            message: format!("unknown op {other:?}"),
            sent: false,
            ids: None,
        }),
    }
}

/// `open`: a client configured as the request says.
async fn open(req: &Value) -> Result<Client, Failure> {
    let ms = |k: &str| -> Result<Duration, Failure> {
        req.get(k)
            .and_then(Value::as_u64)
            .map(Duration::from_millis)
            .ok_or_else(|| Failure::bad_request(format!("open needs {k} (milliseconds)")))
    };
    let mut builder = Client::builder()
        .deadline(ms("deadline_ms")?)
        .attempt_timeout(ms("attempt_ms")?);
    builder = match req.get("discovery").and_then(Value::as_str) {
        Some("consul") => {
            let consul = ConsulDiscovery::from_env().map_err(|e| Failure {
                code: "CONFIG",
                message: e,
                sent: false,
                ids: None,
            })?;
            // Optional: other Consul datacenters to fall back to, in order.
            builder.consul(consul.fallback_datacenters(string_list(req, "fallback_datacenters")))
        }
        Some("static") => builder.endpoints(string_list(req, "nodes")),
        other => {
            return Err(Failure::bad_request(format!(
                "discovery must be consul or static, not {other:?}"
            )))
        }
    };
    if let Some(tls) = req.get("tls").filter(|v| !v.is_null()) {
        builder = builder.tls(tls_config(tls)?);
    }
    if let Some(p) = req.get("prefetch").filter(|v| !v.is_null()) {
        let number = |k: &str| p.get(k).and_then(Value::as_u64).unwrap_or(0);
        let size = u32::try_from(number("size").max(1)).unwrap_or(u32::MAX);
        builder = builder.prefetch(PrefetchConfig {
            initial_batch: size,
            min_batch: size,
            max_batch: size,
            low_water: (number("low") as f64 / f64::from(size)).clamp(0.0, 1.0),
            ..PrefetchConfig::default()
        });
    }
    if let Some(token) = req.get("admin_token").and_then(Value::as_str) {
        builder = builder.admin_token(token);
    }
    Ok(builder.build().await?)
}

/// The request's `tls` object as the crate's [`TlsConfig`].
fn tls_config(tls: &Value) -> Result<TlsConfig, Failure> {
    let path = |k: &str| tls.get(k).and_then(Value::as_str);
    let ca = path("ca").ok_or_else(|| Failure::bad_request("tls needs ca"))?;
    let mut config = TlsConfig::from_ca_file(ca)?;
    if let (Some(cert), Some(key)) = (path("cert"), path("key")) {
        config = config.identity_files(cert, key)?;
    }
    if let Some(name) = path("server_name") {
        config = config.server_name(name);
    }
    Ok(config)
}

/// `next`: `count` IDs from the prefetching API, stopping at the first error.
async fn next(c: &Client, req: &Value) -> Answer {
    let (mode, tag, count) = (mode(req)?, text(req, "tag")?, count(req)?);
    let mut ids: Vec<String> = Vec::with_capacity(count as usize);
    for _ in 0..count {
        match c.next_id(mode, &tag).await {
            Ok(id) => ids.push(id.to_string()),
            Err(e) => {
                let mut f = Failure::from(e);
                f.ids = Some(ids);
                return Err(f);
            }
        }
    }
    Ok(fields([("ids", json!(ids))]))
}

/// `parse`: the formatted ID's fields, every value as a string.
async fn parse(c: &Client, req: &Value) -> Answer {
    let r = c
        .parse_formatted(&text(req, "format")?, &text(req, "value")?)
        .await?;
    let mut f = Map::new();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            f.insert(k.into(), v.into());
        }
    };
    put("year", r.year.map(|v| v.to_string()));
    put("month", r.month.map(|v| v.to_string()));
    put("day", r.day.map(|v| v.to_string()));
    put("hour", r.hour.map(|v| v.to_string()));
    put("minute", r.minute.map(|v| v.to_string()));
    put("second", r.second.map(|v| v.to_string()));
    put("unix_seconds", r.unix_seconds.map(|v| v.to_string()));
    put("node", r.node.map(|v| v.to_string()));
    put("token", r.token.map(|v| v.to_string()));
    put("seq", Some(r.seq.to_string()));
    for (k, v) in r.params {
        f.insert(format!("param.{k}"), v.into());
    }
    Ok(fields([("fields", Value::Object(f))]))
}

/// A decoded ID's parts under the protocol's names, as strings (fields
/// the node left out, such as a hidden ID's internal value without the
/// admin token, are absent).
fn decoded(r: &idgen_client::DecodeIdResponse) -> Value {
    let mut f = Map::new();
    f.insert("id".into(), r.id.to_string().into());
    f.insert("timestamp_ms".into(), r.unix_millis.to_string().into());
    f.insert("datacenter_id".into(), r.datacenter.to_string().into());
    f.insert("worker_id".into(), r.worker.to_string().into());
    f.insert("sequence".into(), r.sequence.to_string().into());
    f.insert("zone".into(), r.zone.to_string().into());
    f.insert("token".into(), r.token.to_string().into());
    f.insert("hidden".into(), r.hidden.clone().into());
    if let Some(internal) = r.internal_id {
        f.insert("internal_id".into(), internal.to_string().into());
    }
    if let Some(version) = r.key_version {
        f.insert("key_version".into(), version.to_string().into());
    }
    Value::Object(f)
}

fn fields<const N: usize>(pairs: [(&str, Value); N]) -> Map<String, Value> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// IDs as decimal strings: exact above 2^53 in every language's JSON.
fn strings(ids: &[u64]) -> Value {
    json!(ids.iter().map(u64::to_string).collect::<Vec<_>>())
}

fn text(req: &Value, key: &str) -> Result<String, Failure> {
    req.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| Failure::bad_request(format!("{key} must be a string")))
}

fn count(req: &Value) -> Result<u32, Failure> {
    req.get("count")
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| Failure::bad_request("count must be a number up to 2^32 - 1"))
}

/// The `id` field: a decimal string, parsed exactly.
fn id_arg(req: &Value) -> Result<u64, Failure> {
    let s = text(req, "value")?;
    s.parse()
        .map_err(|_| Failure::bad_request(format!("id {s:?} is not a decimal u64")))
}

fn mode(req: &Value) -> Result<Mode, Failure> {
    match req
        .get("mode")
        .and_then(Value::as_str)
        .unwrap_or("snowflake")
    {
        "snowflake" => Ok(Mode::Snowflake),
        "segment" => Ok(Mode::Segment),
        "lease" => Ok(Mode::Lease),
        "strict" => Ok(Mode::Strict),
        other => Err(Failure::bad_request(format!("unknown mode {other:?}"))),
    }
}

/// The strings of the array `key` of `req` (none when it is absent).
fn string_list(req: &Value, key: &str) -> Vec<String> {
    req.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}
