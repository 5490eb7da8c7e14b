//! The console's view of every node (`GET /admin/api/cluster`).
//!
//! No node calls another: on Consul each node publishes its own status to
//! KV (`node::status`, records in [`crate::cluster::status`]) and this
//! endpoint reads the records back, joined with Consul's health of each
//! instance. On the embedded store the node is alone, and the view is this
//! node's own. Authorized like every console call
//! (`AdminService::call`, method `ConsoleCluster`).

use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use tonic::Status;

use super::{admin_request, status_response};
use crate::cluster::status::STATUS_INTERVAL;
use crate::server::http_state::HttpState;

/// Unix ms now by the system clock (status records are advisory: a clock
/// step only misreports an age).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// This node's status as a record's fields (what `/admin/api/node` shows).
pub fn node_view(s: &HttpState) -> Map<String, Value> {
    match super::changes::node_json(s) {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The embedded node's one row, in the shape of a Consul row.
fn this_node_only(s: &HttpState) -> Value {
    let mut row = node_view(s);
    row.insert("state".into(), json!(crate::cluster::status::RUNNING));
    row.insert("rate".into(), json!(s.cluster.rate()));
    row.insert("written_ms".into(), json!(now_ms()));
    row.insert(
        "report".into(),
        json!({"state": "reporting", "text": "this node (embedded store: it has no peers)", "age_ms": 0}),
    );
    row.insert("consul".into(), Value::Null);
    row.insert("hides".into(), json!(s.admin.local_hide_uses()));
    Value::Object(row)
}

async fn view(s: HttpState) -> Result<Value, Status> {
    let Some(board) = s.cluster.board() else {
        return Ok(json!({"backend": "embedded", "nodes": [this_node_only(&s)],
                         "interval_ms": STATUS_INTERVAL.as_millis()}));
    };
    let nodes = board.read(now_ms()).await.map_err(|e| {
        Status::unavailable(format!(
            "cannot read the cluster's status from Consul: {e}; check that this node reaches its Consul agent (its log and idgen_consul_errors_total), then refresh"
        ))
    })?;
    Ok(
        json!({"backend": "consul", "nodes": nodes, "this": board.instance(),
              "interval_ms": STATUS_INTERVAL.as_millis()}),
    )
}

/// `GET /admin/api/cluster`: every node's status (a 503 JSON error when
/// Consul cannot be read).
pub(super) async fn cluster(State(s): State<HttpState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let r = admin_request(&parts.headers, &parts.extensions, ());
    let state = s.clone();
    let result = s
        .admin
        .call(crate::metrics::CONSOLE_CLUSTER_METHOD, r, |()| view(state))
        .await;
    match result {
        Ok(v) => Json(v.into_inner()).into_response(),
        Err(e) => status_response(&e),
    }
}
