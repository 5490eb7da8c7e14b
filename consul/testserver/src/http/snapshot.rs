//! `/v1/snapshot`: GET saves the cluster's KV table and sessions as an
//! opaque archive, PUT restores one (what moves on a restore is in
//! `crate::state::snapshot`).
//!
//! Both need a management token, as in Consul: the snapshot endpoint
//! checks `rule.Snapshot()` (`agent/consul/snapshot_endpoint.go`), which
//! only `acl = "write"` grants, since a snapshot holds every secret.

use std::time::Instant;

use axum::http::Method;

use super::{require_method, AgentContext, ApiError, ApiRequest, ApiResult, Reply};
use crate::acl::Access;

pub(super) fn handle(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::GET, Method::PUT])?;
    if !matches!(req.access, Access::All) {
        return Err(ApiError::PermissionDenied);
    }
    if req.method == Method::GET {
        let (archive, index) = agent.cluster.read(|st| st.snapshot_save());
        return Ok(Reply::raw(archive).with_index(index));
    }
    if req.query.has("stale") {
        // Consul: "stale not allowed for restore".
        return Err(ApiError::BadRequest(
            "stale not allowed for restore".to_owned(),
        ));
    }
    let now = Instant::now();
    agent
        .cluster
        .write(|st| st.snapshot_restore(&req.body, now))
        .map_err(|e| ApiError::Internal(format!("failed to restore snapshot: {e}")))?;
    Ok(Reply::empty())
}
