//! The console's Datacenters panel: the datacenter id claims held in the
//! primary Consul datacenter (`GET /admin/api/datacenters`, rpc
//! `ListDatacenters`) and their release (`POST
//! /admin/api/datacenters/release`, rpc `ReleaseDatacenter`, rule 44).
//!
//! Both are calls of the very `idgen.v1.Admin` service `idgen admin
//! datacenters` calls: the release's liveness checks, floor and audit line
//! (with the caller) are the service's, never a second copy here. A change
//! passes the console's cross-site checks first (`change_body`).

use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use super::changes::change;
use super::read_call;
use crate::proto;
use crate::proto::admin_server::Admin;
use crate::server::http_state::HttpState;

/// The panel's two routes.
pub(super) fn routes() -> Router<HttpState> {
    Router::new()
        .route("/admin/api/datacenters", get(list))
        .route("/admin/api/datacenters/release", post(release))
}

/// A claim as JSON, with the names `idgen admin datacenters list --json`
/// prints. `floor_ms` is a Unix time in ms, far below 2^53: a number.
fn claim_json(c: &proto::DatacenterClaim) -> Value {
    json!({
        "id": c.id,
        "state": c.state,
        "consul_datacenter": c.consul_datacenter,
        "cluster": c.cluster,
        "claimed_by": c.claimed_by,
        "claimed": c.claimed,
        "floor_ms": c.floor_ms,
    })
}

/// `GET /admin/api/datacenters`: the primary's name, every claim, and the
/// records that are not claims.
async fn list(State(s): State<HttpState>, request: Request) -> Response {
    read_call(
        request,
        proto::ListDatacentersRequest {},
        |r| async move { s.admin.list_datacenters(r).await },
        |l| {
            json!({
                "primary": l.primary,
                "claims": l.claims.iter().map(claim_json).collect::<Vec<_>>(),
                "unreadable": l.unreadable.iter().map(|u| json!({"key": u.key, "error": u.error})).collect::<Vec<_>>(),
            })
        },
    )
    .await
}

/// `POST /admin/api/datacenters/release`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseBody {
    /// The datacenter id.
    id: u64,
    /// Destroy the owner's sessions of the id and wait out their
    /// lock-delay (`--force`).
    #[serde(default)]
    force: bool,
}

async fn release(State(s): State<HttpState>, request: Request) -> Response {
    change(
        request,
        |b: ReleaseBody| {
            Ok(proto::ReleaseDatacenterRequest {
                id: b.id,
                force: b.force,
            })
        },
        |r| async move { s.admin.release_datacenter(r).await },
        |r| {
            json!({
                "released": r.released,
                "message": r.message,
                "previous": r.previous.as_ref().map(claim_json),
                "floor_ms": r.floor_ms,
                "waited_ms": r.waited_ms,
            })
        },
    )
    .await
}
