//! An ID split back into its parts, for `DecodeId`, `/v1/decode` and
//! `idgen decode`.

use std::time::Duration;

use super::layout::{DecodeError, Layout};
use super::mode::Mode;

/// An ID split into its parts, for `DecodeId` and `/v1/decode`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Decoded {
    /// The ID, as a decimal string in JSON.
    #[serde(serialize_with = "as_decimal")]
    pub id: u64,
    /// The mode it was decoded as.
    pub mode: &'static str,
    /// RFC 3339 time with milliseconds, UTC.
    pub time: String,
    /// Unix milliseconds.
    pub unix_millis: u64,
    /// Datacenter field.
    pub datacenter: u64,
    /// Worker field.
    pub worker: u64,
    /// Sequence field.
    pub sequence: u64,
    /// Zone field (lease IDs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<u64>,
    /// Token field (lease IDs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// How the ID is hidden (`sortable`, `opaque`; `layout.hide`); absent
    /// for a plain ID. The parts above are then the internal ones for an
    /// admin caller, and the public view (a sortable ID's time, nothing
    /// for opaque) for anyone else.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<&'static str>,
    /// The hide key version of a hidden ID (not for an anonymous opaque view).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_version: Option<u32>,
    /// The internal ID behind a hidden one: admin callers only.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "opt_decimal"
    )]
    pub internal_id: Option<u64>,
}

fn as_decimal<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

fn opt_decimal<S: serde::Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

/// Splits a snowflake `id` under `layout`; used online and by `idgen decode`.
pub fn decode_snowflake(layout: &Layout, id: u64) -> Result<Decoded, DecodeError> {
    let parts = layout.decompose(id)?;
    let time = std::time::UNIX_EPOCH + Duration::from_millis(parts.unix_ms);
    Ok(Decoded {
        id,
        mode: Mode::Snowflake.as_str(),
        time: humantime::format_rfc3339_millis(time).to_string(),
        unix_millis: parts.unix_ms,
        datacenter: parts.datacenter,
        worker: parts.worker,
        sequence: parts.sequence,
        zone: None,
        token: None,
        hidden: None,
        key_version: None,
        internal_id: None,
    })
}

/// Splits a lease `id` (`0 | zone | token | sequence`); needs no config.
pub fn decode_lease(id: u64) -> Result<Decoded, super::lease::LeaseError> {
    let parts = super::lease::decompose(id)?;
    Ok(Decoded {
        id,
        mode: Mode::Lease.as_str(),
        time: String::new(),
        unix_millis: 0,
        datacenter: 0,
        worker: 0,
        sequence: parts.sequence,
        zone: Some(parts.zone),
        token: Some(parts.token),
        hidden: None,
        key_version: None,
        internal_id: None,
    })
}
