//! `/v1/session/*`: create, renew, destroy, info, list, node.

use std::time::{Duration, Instant};

use axum::http::Method;
use rand::RngCore;
use serde_json::{json, Value};

use super::{
    blocking_read, json_body, require_method, AgentContext, ApiError, ApiRequest, ApiResult,
    Blocking, Fields, Reply,
};
use crate::config::{DEFAULT_LOCK_DELAY, MAX_SESSION_TTL};
use crate::duration;
use crate::state::session::{Behavior, Session, SessionSpec, SERF_HEALTH};

/// A random version-4 UUID, the form Consul uses for session ids.
fn new_uuid() -> String {
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    super::uuid_text(b)
}

pub(crate) fn session_json(session: &Session) -> Value {
    let info = &session.info;
    let service_checks: Value = if info.service_checks.is_empty() {
        Value::Null
    } else {
        info.service_checks
            .iter()
            .map(|id| json!({"ID": id, "Namespace": ""}))
            .collect()
    };
    json!({
        "ID": info.id,
        "Name": info.name,
        "Node": info.node,
        "LockDelay": info.lock_delay.as_nanos() as u64,
        "Behavior": info.behavior.as_str(),
        "TTL": session.ttl_text,
        "NodeChecks": info.node_checks,
        "ServiceChecks": service_checks,
        "CreateIndex": info.create_index,
        "ModifyIndex": info.modify_index,
    })
}

/// Consul reads a numeric LockDelay below 1000 as seconds, else as
/// nanoseconds.
fn lock_delay(fields: &Fields<'_>) -> Result<Option<Duration>, ApiError> {
    match fields.get("LockDelay") {
        Some(Value::Number(n)) => {
            let n = n.as_u64().ok_or_else(|| {
                ApiError::BadRequest("Request decode failed: invalid LockDelay".to_owned())
            })?;
            Ok(Some(if n < 1000 {
                Duration::from_secs(n)
            } else {
                Duration::from_nanos(n)
            }))
        }
        _ => fields.duration("LockDelay"),
    }
}

pub(super) fn create(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::PUT])?;
    if !req.access.session_write() {
        return Err(ApiError::PermissionDenied);
    }
    let body = json_body(&req.body)?;
    let fields = Fields::of(&body, "session")?;
    let config = &agent.cluster.config;

    let ttl = match fields.str("TTL")? {
        None | Some("") => None,
        Some(text) => {
            let ttl = duration::parse(text).ok_or_else(|| {
                ApiError::BadRequest(format!("Request decode failed: invalid TTL {text:?}"))
            })?;
            if ttl.is_zero() {
                None
            } else if ttl < config.min_ttl || ttl > MAX_SESSION_TTL {
                // Consul's session endpoint (an RPC error, so 500) prints
                // the TTL as nanoseconds.
                return Err(ApiError::Internal(format!(
                    "Invalid Session TTL '{}', must be between [{}={}]",
                    ttl.as_nanos(),
                    duration::format(config.min_ttl),
                    duration::format(MAX_SESSION_TTL)
                )));
            } else {
                Some((ttl, text.to_owned()))
            }
        }
    };
    let behavior = match fields.str("Behavior")? {
        None | Some("") | Some("release") => Behavior::Release,
        Some("delete") => Behavior::Delete,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "Invalid Behavior setting '{other}'"
            )))
        }
    };
    let lock_delay = lock_delay(&fields)?
        .unwrap_or(DEFAULT_LOCK_DELAY)
        .min(config.max_lock_delay);
    let node_checks = match (fields.str_list("NodeChecks")?, fields.str_list("Checks")?) {
        (Some(checks), _) | (None, Some(checks)) => checks,
        (None, None) => vec![SERF_HEALTH.to_owned()],
    };
    let service_checks = match fields.list("ServiceChecks")? {
        None => Vec::new(),
        Some(items) => items
            .iter()
            .map(|item| {
                Fields::of(item, "ServiceChecks entry")?
                    .str("ID")?
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        ApiError::BadRequest("ServiceChecks entries need an ID".to_owned())
                    })
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let spec = SessionSpec {
        id: new_uuid(),
        name: fields.str("Name")?.unwrap_or("").to_owned(),
        node: fields.str("Node")?.unwrap_or(&agent.name).to_owned(),
        ttl,
        behavior,
        lock_delay,
        node_checks,
        service_checks,
    };
    let now = Instant::now();
    let info = agent.cluster.write(|st| st.session_create(spec, now))?;
    Ok(Reply::json(json!({ "ID": info.id })))
}

pub(super) fn renew(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::PUT])?;
    if !req.access.session_write() {
        return Err(ApiError::PermissionDenied);
    }
    let now = Instant::now();
    match agent.cluster.write(|st| st.session_renew(&req.rest, now)) {
        Some(session) => Ok(Reply::json(json!([session_json(&session)]))),
        None => Err(ApiError::NotFound(format!(
            "Session id '{}' not found",
            req.rest
        ))),
    }
}

pub(super) fn destroy(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::PUT])?;
    if !req.access.session_write() {
        return Err(ApiError::PermissionDenied);
    }
    let now = Instant::now();
    agent
        .cluster
        .write(|st| st.session_invalidate(&req.rest, now));
    Ok(Reply::json(Value::Bool(true)))
}

/// `info/<id>`, `list` and `node/<node>`, all blocking on the session table.
pub(super) async fn read(agent: &AgentContext, endpoint: &str, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::GET])?;
    if !req.access.session_read() {
        return Err(ApiError::PermissionDenied);
    }
    let blocking = Blocking::from_query(&req.query)?;
    let wanted = |s: &Session| match endpoint {
        "session/info" => s.info.id == req.rest,
        "session/node" => s.info.node == req.rest,
        _ => true,
    };
    let (index, sessions) = blocking_read(&agent.cluster, blocking, |st| {
        let list: Vec<Value> = st
            .session_list()
            .filter(|s| wanted(s))
            .map(session_json)
            .collect();
        (st.sessions_index(), list)
    })
    .await;
    Ok(Reply::json(Value::Array(sessions)).with_index(index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_version_4() {
        let id = new_uuid();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(id, new_uuid());
    }
}
