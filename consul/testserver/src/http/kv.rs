//! `/v1/kv/<key>`: GET (single, `?recurse`, `?keys`, `?raw`, blocking),
//! PUT (`cas`, `acquire`, `release`, `flags`) and DELETE (`recurse`, `cas`).

use std::time::Instant;

use axum::http::Method;
use base64::Engine as _;
use serde_json::{json, Value};

use super::{
    blocking_read, require_method, AgentContext, ApiError, ApiRequest, ApiResult, Blocking, Reply,
    MAX_VALUE_BYTES,
};
use crate::state::kv::{validate_key, DeleteMode, KvEntry, PutMode};

/// The JSON form of an entry. `Session` is left out when unlocked, and an
/// empty value is `null`, as in Consul.
pub(crate) fn entry_json(entry: &KvEntry) -> Value {
    let mut v = json!({
        "LockIndex": entry.lock_index,
        "Key": entry.key,
        "Flags": entry.flags,
        "Value": if entry.value.is_empty() {
            Value::Null
        } else {
            Value::String(base64::engine::general_purpose::STANDARD.encode(&entry.value))
        },
        "CreateIndex": entry.create_index,
        "ModifyIndex": entry.modify_index,
    });
    if let (Some(session), Some(obj)) = (&entry.session, v.as_object_mut()) {
        obj.insert("Session".to_owned(), Value::String(session.clone()));
    }
    v
}

pub(super) async fn handle(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::GET, Method::PUT, Method::DELETE])?;
    validate_key(&req.rest).map_err(ApiError::BadRequest)?;
    match req.method {
        Method::GET => get(agent, req).await,
        Method::PUT => put(agent, req),
        _ => delete(agent, req),
    }
}

fn missing_key() -> ApiError {
    ApiError::BadRequest("Missing key name".to_owned())
}

async fn get(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    let key = req.rest.as_str();
    let blocking = Blocking::from_query(&req.query)?;
    let access = &req.access;
    if req.query.has("keys") {
        let separator = req.query.get("separator").unwrap_or("").to_owned();
        let (index, keys) = blocking_read(&agent.cluster, blocking, |st| {
            let mut keys: Vec<String> = Vec::new();
            for entry in st.kv.list(key).filter(|e| access.key_read(&e.key)) {
                let rest = &entry.key[key.len()..];
                let name = match rest
                    .find(separator.as_str())
                    .filter(|_| !separator.is_empty())
                {
                    Some(pos) => &entry.key[..key.len() + pos + separator.len()],
                    None => entry.key.as_str(),
                };
                if keys.last().map(String::as_str) != Some(name) {
                    keys.push(name.to_owned());
                }
            }
            (st.kv.prefix_index(key), keys)
        })
        .await;
        if keys.is_empty() {
            return Ok(Reply::empty()
                .with_status(axum::http::StatusCode::NOT_FOUND)
                .with_index(index));
        }
        return Ok(Reply::json(json!(keys)).with_index(index));
    }
    if req.query.has("recurse") {
        let (index, entries) = blocking_read(&agent.cluster, blocking, |st| {
            let entries: Vec<Value> = st
                .kv
                .list(key)
                .filter(|e| access.key_read(&e.key))
                .map(entry_json)
                .collect();
            (st.kv.prefix_index(key), entries)
        })
        .await;
        if entries.is_empty() {
            return Ok(Reply::empty()
                .with_status(axum::http::StatusCode::NOT_FOUND)
                .with_index(index));
        }
        return Ok(Reply::json(Value::Array(entries)).with_index(index));
    }
    if key.is_empty() {
        return Err(missing_key());
    }
    if !access.key_read(key) {
        return Err(ApiError::PermissionDenied);
    }
    let (index, entry) = blocking_read(&agent.cluster, blocking, |st| match st.kv.get(key) {
        Some(e) => (e.modify_index, Some(e.clone())),
        None => (st.kv.table_index(), None),
    })
    .await;
    match entry {
        None => Ok(Reply::empty()
            .with_status(axum::http::StatusCode::NOT_FOUND)
            .with_index(index)),
        Some(entry) if req.query.has("raw") => Ok(Reply::raw(entry.value).with_index(index)),
        Some(entry) => Ok(Reply::json(json!([entry_json(&entry)])).with_index(index)),
    }
}

fn put(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    let key = req.rest.as_str();
    if key.is_empty() {
        return Err(missing_key());
    }
    let q = &req.query;
    let given: Vec<&str> = ["cas", "acquire", "release"]
        .into_iter()
        .filter(|name| q.has(name))
        .collect();
    if given.len() > 1 {
        return Err(ApiError::BadRequest(format!(
            "Conflicting flags: {} are mutually exclusive",
            given.join(", ")
        )));
    }
    let mode = if let Some(cas) = q.u64("cas")? {
        PutMode::Cas(cas)
    } else if let Some(session) = q.get("acquire") {
        PutMode::Acquire(session.to_owned())
    } else if let Some(session) = q.get("release") {
        PutMode::Release(session.to_owned())
    } else {
        PutMode::Set
    };
    let flags = q.u64("flags")?.unwrap_or(0);
    if req.body.len() > MAX_VALUE_BYTES {
        return Err(ApiError::TooLarge(format!(
            "Request body({} bytes) too large, max size: {MAX_VALUE_BYTES} bytes.",
            req.body.len()
        )));
    }
    if !req.access.key_write(key) {
        return Err(ApiError::PermissionDenied);
    }
    let value = req.body.to_vec();
    let now = Instant::now();
    let ok = agent
        .cluster
        .write(|st| st.kv_put(key, value, flags, &mode, now))?;
    Ok(Reply::json(Value::Bool(ok)))
}

fn delete(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    let key = req.rest.as_str();
    let recurse = req.query.has("recurse");
    let cas = req.query.u64("cas")?;
    let mode = match (recurse, cas) {
        (true, Some(_)) => {
            return Err(ApiError::BadRequest(
                "Conflicting flags: cas, recurse are mutually exclusive".to_owned(),
            ))
        }
        (true, None) => DeleteMode::Recurse,
        (false, Some(index)) => DeleteMode::Cas(index),
        (false, None) => DeleteMode::One,
    };
    if key.is_empty() && !recurse {
        return Err(missing_key());
    }
    let allowed = if recurse {
        req.access.key_write_prefix(key)
    } else {
        req.access.key_write(key)
    };
    if !allowed {
        return Err(ApiError::PermissionDenied);
    }
    let ok = agent.cluster.write(|st| st.kv_delete(key, mode));
    Ok(Reply::json(Value::Bool(ok)))
}
