//! The JSON API's UUIDv7 endpoints: `/v1/uuid`, `/v1/uuids?count=N` and
//! `/v1/uuid/decode?uuid=TEXT`. UUIDs are canonical lowercase text, or
//! ULID text with `format=ulid`.

use std::time::Instant;

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::{parse_query, ApiError, HttpState};
use crate::error::Error;
use crate::id::{RequestError, Uuid};

/// Query of `/v1/uuid` and `/v1/uuids`; unknown parameters are refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UuidQuery {
    count: Option<u64>,
    format: Option<String>,
}

/// The text form a caller asked for.
#[derive(Clone, Copy)]
enum TextForm {
    Canonical,
    Ulid,
}

impl TextForm {
    fn parse(format: Option<&str>) -> Result<Self, Error> {
        match format {
            None | Some("uuid") => Ok(Self::Canonical),
            Some("ulid") => Ok(Self::Ulid),
            Some(other) => Err(RequestError::BadQuery(format!(
                "format {other:?} is not a UUID text form; use format=uuid (8-4-4-4-12, the default) or format=ulid"
            ))
            .into()),
        }
    }

    fn render(self, u: &Uuid) -> String {
        match self {
            Self::Canonical => u.to_string(),
            Self::Ulid => u.to_ulid(),
        }
    }
}

/// `GET /v1/uuid[?format=ulid]`: `{"uuid": "0193..."}`.
pub(super) async fn gen_uuid(State(s): State<HttpState>, RawQuery(raw): RawQuery) -> Response {
    let started = Instant::now();
    let result = async {
        let q: UuidQuery = parse_query(raw)?;
        if q.count.is_some() {
            return Err(RequestError::BadQuery("count is for /v1/uuids".into()).into());
        }
        let form = TextForm::parse(q.format.as_deref())?;
        let uuid = s.issuer.gen_uuid().await?;
        Ok(form.render(&uuid))
    }
    .await;
    s.rpc.uuid.observe(started, &result);
    match result {
        Ok(text) => Json(json!({ "uuid": text })).into_response(),
        Err(e) => ApiError(e).into_response(),
    }
}

/// `GET /v1/uuids?count=N[&format=ulid]`: `{"uuids": [...]}`, strictly
/// increasing.
pub(super) async fn gen_uuids(State(s): State<HttpState>, RawQuery(raw): RawQuery) -> Response {
    let started = Instant::now();
    let result = async {
        let q: UuidQuery = parse_query(raw)?;
        let form = TextForm::parse(q.format.as_deref())?;
        let count = q.count.ok_or_else(|| {
            RequestError::BadQuery(format!(
                "count is required, from 1 to {}",
                s.issuer.max_batch()
            ))
        })?;
        let uuids = s.issuer.gen_uuids(count).await?;
        Ok(uuids.iter().map(|u| form.render(u)).collect::<Vec<_>>())
    }
    .await;
    s.rpc.uuids.observe(started, &result);
    match result {
        Ok(texts) => Json(json!({ "uuids": texts })).into_response(),
        Err(e) => ApiError(e).into_response(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecodeUuidQuery {
    uuid: String,
}

/// `GET /v1/uuid/decode?uuid=TEXT` (canonical, 32 hex digits or ULID):
/// its time, datacenter, worker and counter; of a hidden layout's UUID
/// the internal ones for an admin caller only, audit-logged.
pub(super) async fn decode_uuid(
    State(s): State<HttpState>,
    RawQuery(raw): RawQuery,
    request: axum::extract::Request,
) -> Response {
    let started = Instant::now();
    let who = match super::admin_caller(&s, request) {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let result = parse_query::<DecodeUuidQuery>(raw)
        .and_then(|q| s.issuer.decode_uuid_as(&q.uuid, who.as_deref()));
    s.rpc.decode_uuid.observe(started, &result);
    match result {
        Ok(d) => Json(d).into_response(),
        Err(e) => ApiError(e).into_response(),
    }
}
