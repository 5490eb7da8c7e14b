//! `PUT /v1/txn`.

use axum::http::{Method, StatusCode};
use base64::Engine as _;
use serde_json::{json, Value};

use super::kv::entry_json;
use super::{
    require_method, AgentContext, ApiError, ApiRequest, ApiResult, Fields, Reply, MAX_VALUE_BYTES,
};
use crate::state::txn::{TxnError, TxnOp, TxnVerb};

/// Consul's limit before 1.14 (128 after); the lower one keeps clients
/// honest for every version.
pub(crate) const MAX_TXN_OPS: usize = 64;

fn decode_op(value: &Value) -> Result<TxnOp, ApiError> {
    let op = Fields::of(value, "transaction operation")?;
    let Some(kv) = op.object("KV")? else {
        return Err(ApiError::BadRequest(
            "consul-testserver supports only KV transaction operations".to_owned(),
        ));
    };
    let verb_text = kv.str("Verb")?.unwrap_or("");
    let verb = TxnVerb::parse(verb_text)
        .ok_or_else(|| ApiError::BadRequest(format!("Unknown KV verb {verb_text:?}")))?;
    let value = match kv.str("Value")? {
        None => Vec::new(),
        Some(text) => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| ApiError::BadRequest(format!("Failed to parse body: Value: {e}")))?,
    };
    Ok(TxnOp {
        verb,
        key: kv.str("Key")?.unwrap_or("").to_owned(),
        value,
        flags: kv.u64("Flags")?.unwrap_or(0),
        index: kv.u64("Index")?.unwrap_or(0),
        session: kv.str("Session")?.unwrap_or("").to_owned(),
    })
}

fn conflict(errors: Vec<TxnError>) -> Reply {
    let errors: Vec<Value> = errors
        .into_iter()
        .map(|e| json!({"OpIndex": e.op_index, "What": e.what}))
        .collect();
    Reply::json(json!({"Results": null, "Errors": errors})).with_status(StatusCode::CONFLICT)
}

pub(super) fn handle(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::PUT])?;
    if req.body.len() > MAX_VALUE_BYTES {
        return Err(ApiError::TooLarge(format!(
            "Request body({} bytes) too large, max size: {MAX_VALUE_BYTES} bytes.",
            req.body.len()
        )));
    }
    let body: Value = serde_json::from_slice(&req.body)
        .map_err(|e| ApiError::BadRequest(format!("Failed to parse body: {e}")))?;
    let Some(items) = body.as_array() else {
        return Err(ApiError::BadRequest(
            "Failed to parse body: expected a JSON list of operations".to_owned(),
        ));
    };
    if items.len() > MAX_TXN_OPS {
        return Err(ApiError::TooLarge(format!(
            "Transaction contains too many operations ({} > {MAX_TXN_OPS})",
            items.len()
        )));
    }
    let ops = items.iter().map(decode_op).collect::<Result<Vec<_>, _>>()?;

    // ACL denials are per operation and come back as a 409, not a 403.
    let denied: Vec<TxnError> = ops
        .iter()
        .enumerate()
        .filter(|(_, op)| {
            let allowed = match (op.verb.writes(), op.verb.is_tree()) {
                (true, true) => req.access.key_write_prefix(&op.key),
                (true, false) => req.access.key_write(&op.key),
                (false, _) => req.access.key_read(&op.key),
            };
            !allowed
        })
        .map(|(op_index, _)| TxnError {
            op_index,
            what: "Permission denied".to_owned(),
        })
        .collect();
    if !denied.is_empty() {
        return Ok(conflict(denied));
    }

    let now = std::time::Instant::now();
    let rewrite = agent
        .cluster
        .faults
        .rewritten_before_txn()
        .filter(|k| ops.iter().any(|op| op.key == *k));
    if let Some(key) = rewrite {
        agent.cluster.write(|st| st.rewrite(&key));
    }
    match agent.cluster.write(|st| st.txn(&ops, now)) {
        Ok(results) => {
            let results: Value = if results.is_empty() {
                // Go encodes the empty result list as null.
                Value::Null
            } else {
                results
                    .iter()
                    .map(|e| json!({ "KV": entry_json(e) }))
                    .collect()
            };
            Ok(Reply::json(json!({"Results": results, "Errors": null})))
        }
        Err(errors) => Ok(conflict(errors)),
    }
}
