//! The console's view of the node it runs on (`GET /admin/api/node`) and
//! its changes: segment tags, format definitions, strict steps and keys.
//!
//! Every change is one `idgen.v1.Admin` call on the very service the gRPC
//! port serves (the same allow-list, credentials, rules and metrics), after
//! the console's cross-site checks (`change_body`). Nothing here writes to
//! a store by itself.
//!
//! 64-bit values a change moves (a tag's `initial` and `max_id`) travel as
//! decimal strings and are parsed exactly: a JSON number is refused, since
//! a browser's JavaScript rounds any integer above 2^53, and a tag created
//! with its initial value rounded down would repeat IDs its previous
//! system handed out (rule 17, docs/SAFETY-RULES-11-17.md).

use std::future::Future;
use std::sync::atomic::Ordering;

use axum::extract::{Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tonic::Status;

use super::{admin_request, change_body, read_call, status_response, Refused};
use crate::proto;
use crate::proto::admin_server::Admin;
use crate::server::http_state::HttpState;

/// The console's read and change routes beyond the first listings.
pub(super) fn routes() -> Router<HttpState> {
    Router::new()
        .route("/admin/api/node", get(node))
        .route("/admin/api/strict/keys", get(strict_keys))
        .route("/admin/api/tags/create", post(create_tag))
        .route("/admin/api/tags/update", post(update_tag))
        .route("/admin/api/tags/delete", post(delete_tag))
        .route("/admin/api/formats/create", post(create_format))
        .route("/admin/api/formats/update", post(update_format))
        .route("/admin/api/formats/delete", post(delete_format))
        .route("/admin/api/strict/step", post(set_strict_step))
        .route("/admin/api/strict/keys/delete", post(delete_strict_key))
}

/// A 64-bit value given as a decimal string, parsed exactly; `None` when
/// absent or null. A JSON number is refused (see the module doc).
pub(super) fn exact_u64(field: &str, v: Option<&Value>) -> Result<Option<u64>, Refused> {
    let bad = |what: String| Refused(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", what);
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => s.trim().parse::<u64>().map(Some).map_err(|_| {
            bad(format!(
                "{field} {s:?} is not a decimal number from 0 to {}",
                u64::MAX
            ))
        }),
        Some(other) => Err(bad(format!(
            "{field} must be a decimal string such as \"1000\" (got {other}): a JSON number above 2^53 loses digits on the way"
        ))),
    }
}

/// Runs one change: the body after the cross-site checks, turned into the
/// admin request by `to_msg`, sent through `call`, rendered by `render`.
pub(super) async fn change<B, Req, T, Fut>(
    request: Request,
    to_msg: impl FnOnce(B) -> Result<Req, Refused>,
    call: impl FnOnce(tonic::Request<Req>) -> Fut,
    render: impl FnOnce(T) -> Value,
) -> Response
where
    B: DeserializeOwned,
    Fut: Future<Output = Result<tonic::Response<T>, Status>>,
{
    let (parts, body) = match change_body::<B>(request).await {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let msg = match to_msg(body) {
        Ok(m) => m,
        Err(r) => return r.into_response(),
    };
    match call(admin_request(&parts.headers, &parts.extensions, msg)).await {
        Ok(r) => Json(render(r.into_inner())).into_response(),
        Err(s) => status_response(&s),
    }
}

/// The IDs this node issued since it started, by mode, read from its own
/// `idgen_ids_issued_total` series (the console turns two readings into a
/// rate).
fn issued_by_mode(rendered: &str) -> Map<String, Value> {
    let mut out = Map::new();
    let prefix = format!("{}{{", crate::metrics::IDS_ISSUED);
    for line in rendered.lines().filter(|l| l.starts_with(&prefix)) {
        let Some((labels, value)) = line[prefix.len()..].split_once("} ") else {
            continue;
        };
        let mode = labels
            .split(',')
            .find_map(|l| l.strip_prefix("mode=\""))
            .map(|m| m.trim_end_matches('"'));
        let (Some(mode), Ok(value)) = (mode, value.trim().parse::<f64>()) else {
            continue;
        };
        let before = out.get(mode).and_then(Value::as_f64).unwrap_or(0.0);
        out.insert(mode.to_owned(), json!(before + value));
    }
    out
}

/// Why this node does not issue now, in words, or `None` when it does.
fn not_issuing_reason(s: &HttpState) -> Option<String> {
    if let Some(e) = s.issuer.state_file_lost() {
        return Some(format!("state file lost: {e}"));
    }
    if let Some(reason) = s.issuer.gate().fence_reason() {
        return Some(format!("fenced: {reason}"));
    }
    if s.issuer.is_fenced() {
        return Some(
            "fenced: this node lost its worker id (see its log and /readyz for the cause)".into(),
        );
    }
    if let Some((since, error)) = s.issuer.store_fault() {
        return Some(format!(
            "the store has been unable to write for {} s: {error}",
            since.as_secs()
        ));
    }
    if !s.ready.load(Ordering::Acquire) {
        return Some("not ready (starting, draining, or its clock stepped back)".into());
    }
    None
}

/// This node's status: what `/admin/api/node` answers and what its status
/// record publishes.
pub(super) fn node_json(s: &HttpState) -> Value {
    let (instance, address) = s.admin.node_identity();
    let generator = s.issuer.generator();
    let spec = generator.layout().spec();
    json!({
        "instance": instance,
        "address": address,
        "version": env!("CARGO_PKG_VERSION"),
        "ready": s.ready.load(Ordering::Acquire),
        "live": s.live.load(Ordering::Acquire),
        "fenced": s.issuer.is_fenced(),
        "reason": not_issuing_reason(s),
        "node_number": generator.node_number(),
        "layout": {
            "epoch_ms": spec.epoch_ms, "time_unit_ms": spec.time_unit_ms,
            "time_bits": spec.time_bits, "datacenter_bits": spec.datacenter_bits,
            "worker_bits": spec.worker_bits, "sequence_bits": spec.sequence_bits,
        },
        "issued": issued_by_mode(&s.metrics.render()),
    })
}

/// `GET /admin/api/node`: the node this console runs on (authorized like
/// every admin call).
async fn node(State(s): State<HttpState>, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    let r = admin_request(&parts.headers, &parts.extensions, ());
    let state = s.clone();
    let result = s
        .admin
        .call(crate::metrics::CONSOLE_NODE_METHOD, r, |()| async move {
            Ok(node_json(&state))
        })
        .await;
    match result {
        Ok(v) => Json(v.into_inner()).into_response(),
        Err(e) => status_response(&e),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NamespaceQuery {
    namespace: String,
}

/// `GET /admin/api/strict/keys?namespace=NS`: a namespace's live keys.
async fn strict_keys(
    State(s): State<HttpState>,
    q: Result<Query<NamespaceQuery>, axum::extract::rejection::QueryRejection>,
    request: Request,
) -> Response {
    let Ok(Query(q)) = q else {
        return Refused(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            "give the namespace: /admin/api/strict/keys?namespace=NAME".into(),
        )
        .into_response();
    };
    let msg = proto::ListStrictKeysRequest {
        namespace: q.namespace,
    };
    read_call(
        request,
        msg,
        |r| async move { s.admin.list_strict_keys(r).await },
        |k| {
            let keys: Vec<Value> = k
                .keys
                .iter()
                .map(|k| json!({"key": k.key, "value": k.value.to_string()}))
                .collect();
            let tombstones: Vec<Value> = k
                .tombstones
                .iter()
                .map(|k| json!({"key": k.key, "last_value": k.value.to_string()}))
                .collect();
            json!({"namespace": k.namespace, "keys": keys, "max_keys": k.max_keys, "tombstones": tombstones})
        },
    )
    .await
}

/// The body of a tag change; `initial`/`max_id` are decimal strings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TagBody {
    tag: String,
    #[serde(default)]
    step: Option<u64>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    initial: Option<Value>,
    #[serde(default)]
    max_id: Option<Value>,
    /// Creates a hidden tag with this hide key (`idgen admin keys create`);
    /// empty or absent: a plain tag.
    #[serde(default)]
    hide_key: Option<String>,
}

fn tag_json(t: Option<&proto::SegmentTag>) -> Value {
    t.map_or(Value::Null, |t| {
        json!({"tag": t.tag, "max_id": t.max_id.to_string(), "step": t.step,
               "description": t.description, "updated": t.updated, "hide": hide_json(t.hide.as_ref())})
    })
}

/// A tag's hiding as JSON (`null` for a plain tag).
pub(super) fn hide_json(h: Option<&proto::TagHide>) -> Value {
    h.map_or(
        Value::Null,
        |h| json!({"key": h.key, "version_bits": h.version_bits, "domain_bits": h.domain_bits}),
    )
}

fn only_for(what: &str, field: &str, given: bool) -> Result<(), Refused> {
    if given {
        return Err(Refused(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            format!("{field} is not a field of {what}"),
        ));
    }
    Ok(())
}

async fn create_tag(State(s): State<HttpState>, request: Request) -> Response {
    let to_msg = |b: TagBody| {
        only_for("a tag creation (use initial)", "max_id", b.max_id.is_some())?;
        // A hidden tag: the admin call checks the key (missing or retired
        // is its error, shown verbatim); default version and domain bits.
        let hide = b
            .hide_key
            .map(|k| k.trim().to_owned())
            .filter(|k| !k.is_empty())
            .map(|key| proto::TagHide {
                key,
                version_bits: 0,
                domain_bits: 0,
            });
        Ok(proto::CreateTagRequest {
            tag: b.tag,
            step: b.step.unwrap_or(0),
            description: b.description.unwrap_or_default(),
            initial: exact_u64("initial", b.initial.as_ref())?.unwrap_or(0),
            hide,
        })
    };
    change(
        request,
        to_msg,
        |r| async move { s.admin.create_tag(r).await },
        |t| json!({"tag": tag_json(t.tag.as_ref()), "message": t.note}),
    )
    .await
}

async fn update_tag(State(s): State<HttpState>, request: Request) -> Response {
    let to_msg = |b: TagBody| {
        only_for("a tag change (use max_id)", "initial", b.initial.is_some())?;
        only_for(
            "a tag change (hiding is fixed when a tag is created)",
            "hide_key",
            b.hide_key.is_some(),
        )?;
        Ok(proto::UpdateTagRequest {
            tag: b.tag,
            step: b.step,
            description: b.description,
            max_id: exact_u64("max_id", b.max_id.as_ref())?,
        })
    };
    change(
        request,
        to_msg,
        |r| async move { s.admin.update_tag(r).await },
        |t| json!({"tag": tag_json(t.tag.as_ref()), "message": "tag updated"}),
    )
    .await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NameBody {
    name: String,
}

async fn delete_tag(State(s): State<HttpState>, request: Request) -> Response {
    change(
        request,
        |b: NameBody| Ok(proto::DeleteTagRequest { tag: b.name }),
        |r| async move { s.admin.delete_tag(r).await },
        |t| json!({"tag": t.tag, "max_id": t.max_id.to_string(), "message": t.note}),
    )
    .await
}

/// The body of a format change: the definition as an object with the keys
/// of a config file's `[[formats]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FormatBody {
    definition: Value,
    #[serde(default)]
    fresh: bool,
}

fn definition_json(v: &Value) -> Result<String, Refused> {
    if !v.is_object() {
        return Err(Refused(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            "definition must be a JSON object with the keys of a [[formats]] entry (name, template | lua | preset, ...)".into(),
        ));
    }
    Ok(v.to_string())
}

fn format_json(f: Option<&proto::FormatDefinition>) -> Value {
    f.map_or(Value::Null, |f| {
        json!({"name": f.name, "definition_json": f.definition_json, "deleted": f.deleted,
               "served": f.served, "updated": f.updated})
    })
}

fn reload_json(r: Option<&proto::ReloadFormatsResponse>) -> Value {
    r.map_or(
        Value::Null,
        |r| json!({"formats": r.formats, "changed": r.changed}),
    )
}

async fn create_format(State(s): State<HttpState>, request: Request) -> Response {
    let to_msg = |b: FormatBody| {
        Ok(proto::CreateFormatRequest {
            definition_json: definition_json(&b.definition)?,
            fresh: b.fresh,
        })
    };
    change(
        request,
        to_msg,
        |r| async move { s.admin.create_format(r).await },
        |f| {
            let name = f.format.as_ref().map(|f| f.name.clone()).unwrap_or_default();
            json!({"format": format_json(f.format.as_ref()), "reload": reload_json(f.reload.as_ref()),
                   "message": format!("format {name} created")})
        },
    )
    .await
}

async fn update_format(State(s): State<HttpState>, request: Request) -> Response {
    let to_msg = |b: FormatBody| {
        only_for("a format change", "fresh", b.fresh)?;
        Ok(proto::UpdateFormatRequest {
            definition_json: definition_json(&b.definition)?,
        })
    };
    change(
        request,
        to_msg,
        |r| async move { s.admin.update_format(r).await },
        |f| {
            let name = f.format.as_ref().map(|f| f.name.clone()).unwrap_or_default();
            json!({"format": format_json(f.format.as_ref()), "reload": reload_json(f.reload.as_ref()),
                   "message": format!("format {name} updated")})
        },
    )
    .await
}

async fn delete_format(State(s): State<HttpState>, request: Request) -> Response {
    change(
        request,
        |b: NameBody| Ok(proto::DeleteFormatRequest { name: b.name }),
        |r| async move { s.admin.delete_format(r).await },
        |f| json!({"format": format_json(f.format.as_ref()), "message": f.note}),
    )
    .await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepBody {
    namespace: String,
    step: u64,
}

async fn set_strict_step(State(s): State<HttpState>, request: Request) -> Response {
    change(
        request,
        |b: StepBody| {
            Ok(proto::SetStrictStepRequest {
                namespace: b.namespace,
                step: b.step,
            })
        },
        |r| async move { s.admin.set_strict_step(r).await },
        |n| {
            json!({"namespace": n.namespace, "step": n.step, "previous": n.previous,
                   "message": format!("namespace {} step {} (was {})", n.namespace, n.step, n.previous)})
        },
    )
    .await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyBody {
    key: String,
}

async fn delete_strict_key(State(s): State<HttpState>, request: Request) -> Response {
    change(
        request,
        |b: KeyBody| Ok(proto::DeleteStrictKeyRequest { key: b.key }),
        |r| async move { s.admin.delete_strict_key(r).await },
        |k| json!({"key": k.key, "last_value": k.last_value.to_string(), "message": k.note}),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixty_four_bit_values_are_exact_strings_never_numbers() {
        let big = "18446744073709551615";
        assert_eq!(
            exact_u64("max_id", Some(&json!(big))).ok().flatten(),
            Some(u64::MAX)
        );
        assert_eq!(
            exact_u64("max_id", Some(&json!("9007199254740993")))
                .ok()
                .flatten(),
            Some(9_007_199_254_740_993)
        );
        assert_eq!(exact_u64("max_id", None).ok().flatten(), None);
        assert_eq!(exact_u64("max_id", Some(&json!(""))).ok().flatten(), None);
        for bad in [
            json!(5),
            json!(9_007_199_254_740_993_u64),
            json!("-1"),
            json!("1e3"),
        ] {
            assert!(exact_u64("max_id", Some(&bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn issued_ids_are_read_from_the_nodes_own_counter() {
        let text = "# HELP idgen_ids_issued_total x\nidgen_ids_issued_total{mode=\"snowflake\"} 12\nidgen_ids_issued_total{mode=\"segment\",x=\"y\"} 3\nidgen_ids_issued_total{mode=\"segment\",x=\"z\"} 4\nidgen_other{mode=\"lease\"} 9\n";
        let m = issued_by_mode(text);
        assert_eq!(m.get("snowflake"), Some(&json!(12.0)));
        assert_eq!(m.get("segment"), Some(&json!(7.0)));
        assert!(m.get("lease").is_none());
    }
}
