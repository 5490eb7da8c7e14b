//! The `idgen.v1.IdGen` gRPC service: proto <-> domain conversion only.

use std::sync::Arc;
use std::time::Instant;

use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::id::{Mode, RequestError};
use crate::metrics as m;
use crate::proto::{self, id_gen_server::IdGen};

use super::status::{code_name, to_status};
use crate::modes::Issuer;

/// Converts the proto enum (an open `i32`) to a mode.
pub fn mode_from_proto(raw: i32) -> Result<Mode, RequestError> {
    match proto::Mode::try_from(raw) {
        Ok(proto::Mode::Unspecified | proto::Mode::Snowflake) => Ok(Mode::Snowflake),
        Ok(proto::Mode::Segment) => Ok(Mode::Segment),
        Ok(proto::Mode::Lease) => Ok(Mode::Lease),
        Ok(proto::Mode::Strict) => Ok(Mode::Strict),
        Err(_) => Err(RequestError::UnknownMode(raw.to_string())),
    }
}

/// Converts a mode to the proto enum.
pub fn mode_to_proto(mode: Mode) -> proto::Mode {
    match mode {
        Mode::Snowflake => proto::Mode::Snowflake,
        Mode::Segment => proto::Mode::Segment,
        Mode::Lease => proto::Mode::Lease,
        Mode::Strict => proto::Mode::Strict,
    }
}

/// Latency of one rpc, with the success series resolved once (the hot
/// path then records without a registry lookup).
pub struct RpcMetric {
    rpc: &'static str,
    ok: metrics::Histogram,
}

impl RpcMetric {
    /// The metric for `rpc`.
    pub fn new(rpc: &'static str) -> Self {
        Self {
            rpc,
            ok: metrics::histogram!(m::REQUEST_DURATION, "rpc" => rpc, "code" => code_name(tonic::Code::Ok)),
        }
    }

    /// Records a request's latency under its final code.
    pub fn observe<T>(&self, started: Instant, result: &Result<T, Error>) {
        let secs = started.elapsed().as_secs_f64();
        match result {
            Ok(_) => self.ok.record(secs),
            Err(e) => {
                let code = code_name(super::status::code(e));
                metrics::histogram!(m::REQUEST_DURATION, "rpc" => self.rpc, "code" => code)
                    .record(secs);
            }
        }
    }
}

/// The gRPC front end over an [`Issuer`].
pub struct IdGenService {
    issuer: Arc<Issuer>,
    /// Checks the admin credentials a decode of a hidden ID may carry.
    admin: Option<Arc<super::admin::AdminService>>,
    gen_id: RpcMetric,
    gen_ids: RpcMetric,
    decode_id: RpcMetric,
    gen_formatted: RpcMetric,
    parse_formatted: RpcMetric,
    format_counter: RpcMetric,
    gen_uuid: RpcMetric,
    gen_uuids: RpcMetric,
    decode_uuid: RpcMetric,
}

impl IdGenService {
    /// A service answering from `issuer`.
    pub fn new(issuer: Arc<Issuer>) -> Self {
        Self {
            issuer,
            admin: None,
            gen_id: RpcMetric::new("GenId"),
            gen_ids: RpcMetric::new("GenIds"),
            decode_id: RpcMetric::new("DecodeId"),
            gen_formatted: RpcMetric::new("GenFormatted"),
            parse_formatted: RpcMetric::new("ParseFormatted"),
            format_counter: RpcMetric::new("GetFormatCounter"),
            gen_uuid: RpcMetric::new("GenUuid"),
            gen_uuids: RpcMetric::new("GenUuids"),
            decode_uuid: RpcMetric::new("DecodeUuid"),
        }
    }
}

impl IdGenService {
    /// Reveals hidden IDs' internal values to callers that pass `admin`'s
    /// checks (admin token or client certificate).
    pub fn with_admin(mut self, admin: Arc<super::admin::AdminService>) -> Self {
        self.admin = Some(admin);
        self
    }

    /// The admin caller of `request`, if it presents admin credentials
    /// (refused when they are wrong); `None` when anonymous.
    fn admin_caller<Req>(&self, request: &Request<Req>) -> Result<Option<String>, Status> {
        match &self.admin {
            Some(admin) => admin.admin_caller(request),
            None => Ok(None),
        }
    }
}

#[tonic::async_trait]
impl IdGen for IdGenService {
    async fn gen_id(
        &self,
        request: Request<proto::GenIdRequest>,
    ) -> Result<Response<proto::GenIdResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let result = match mode_from_proto(req.mode) {
            Ok(mode) => self.issuer.gen_id(mode, &req.tag).await,
            Err(e) => Err(e.into()),
        };
        self.gen_id.observe(started, &result);
        result
            .map(|id| Response::new(proto::GenIdResponse { id }))
            .map_err(|e| to_status(&e))
    }

    async fn gen_ids(
        &self,
        request: Request<proto::GenIdsRequest>,
    ) -> Result<Response<proto::GenIdsResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let result = match mode_from_proto(req.mode) {
            Ok(mode) => {
                self.issuer
                    .gen_ids(mode, &req.tag, u64::from(req.count))
                    .await
            }
            Err(e) => Err(e.into()),
        };
        self.gen_ids.observe(started, &result);
        result
            .map(|ids| Response::new(proto::GenIdsResponse { ids }))
            .map_err(|e| to_status(&e))
    }

    async fn decode_id(
        &self,
        request: Request<proto::DecodeIdRequest>,
    ) -> Result<Response<proto::DecodeIdResponse>, Status> {
        let started = Instant::now();
        let who = self.admin_caller(&request)?;
        let req = request.into_inner();
        let result = match mode_from_proto(req.mode) {
            Ok(mode) => {
                self.issuer
                    .decode_as(mode, req.id, &req.tag, who.as_deref())
                    .await
            }
            Err(e) => Err(Error::from(e)),
        };
        self.decode_id.observe(started, &result);
        result
            .map(|d| {
                Response::new(proto::DecodeIdResponse {
                    id: d.id,
                    mode: mode_to_proto(Mode::parse(d.mode).unwrap_or(Mode::Snowflake)) as i32,
                    time: d.time,
                    unix_millis: d.unix_millis,
                    datacenter: d.datacenter as u32,
                    worker: d.worker as u32,
                    sequence: d.sequence,
                    zone: d.zone.unwrap_or(0) as u32,
                    token: d.token.unwrap_or(0) as u32,
                    hidden: d.hidden.unwrap_or_default().to_owned(),
                    key_version: d.key_version,
                    internal_id: d.internal_id,
                })
            })
            .map_err(|e| to_status(&e))
    }

    async fn gen_formatted(
        &self,
        request: Request<proto::GenFormattedRequest>,
    ) -> Result<Response<proto::GenFormattedResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let params = sorted_params(req.params);
        let count = u64::from(req.count.max(1));
        let result = self.issuer.gen_formatted(&req.format, &params, count).await;
        self.gen_formatted.observe(started, &result);
        result
            .map(|issued| Response::new(formatted_response(issued)))
            .map_err(|e| to_status(&e))
    }

    async fn parse_formatted(
        &self,
        request: Request<proto::ParseFormattedRequest>,
    ) -> Result<Response<proto::ParseFormattedResponse>, Status> {
        let started = Instant::now();
        let who = self.admin_caller(&request)?;
        let req = request.into_inner();
        let result = self
            .issuer
            .parse_formatted_as(&req.format, &req.id, who.as_deref())
            .await
            .map(|(p, view)| {
                let mut parsed = parsed_message(p);
                if let Some(view) = view {
                    parsed.key_version = Some(u32::from(view.key_version));
                    parsed.internal_seq = view.internal;
                }
                parsed
            });
        self.parse_formatted.observe(started, &result);
        result.map(Response::new).map_err(|e| to_status(&e))
    }

    async fn get_format_counter(
        &self,
        request: Request<proto::GetFormatCounterRequest>,
    ) -> Result<Response<proto::GetFormatCounterResponse>, Status> {
        let started = Instant::now();
        let who = self.admin_caller(&request)?;
        let req = request.into_inner();
        let params = sorted_params(req.params);
        let result = self
            .issuer
            .format_counter(&req.format, &params, who.as_deref())
            .await;
        self.format_counter.observe(started, &result);
        result
            .map(|c| {
                Response::new(match c {
                    Some(c) => proto::GetFormatCounterResponse {
                        used: true,
                        period: c.record.period.0,
                        last: c.record.last,
                        next_period_start_ms: c.next_period_start_ms.unwrap_or(0),
                        token: c.token.unwrap_or_default(),
                    },
                    None => proto::GetFormatCounterResponse::default(),
                })
            })
            .map_err(|e| to_status(&e))
    }

    async fn gen_uuid(
        &self,
        _request: Request<proto::GenUuidRequest>,
    ) -> Result<Response<proto::GenUuidResponse>, Status> {
        self.gen_uuid_inner().await.map(Response::new)
    }

    async fn gen_uuids(
        &self,
        request: Request<proto::GenUuidsRequest>,
    ) -> Result<Response<proto::GenUuidsResponse>, Status> {
        self.gen_uuids_inner(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn decode_uuid(
        &self,
        request: Request<proto::DecodeUuidRequest>,
    ) -> Result<Response<proto::DecodeUuidResponse>, Status> {
        let who = self.admin_caller(&request)?;
        self.decode_uuid_inner(request.into_inner(), who.as_deref())
            .map(Response::new)
    }
}

/// The UUID rpcs, apart so the trait impl above reads as the ID rpcs.
impl IdGenService {
    async fn gen_uuid_inner(&self) -> Result<proto::GenUuidResponse, Status> {
        let started = Instant::now();
        let result = self.issuer.gen_uuid().await;
        self.gen_uuid.observe(started, &result);
        let uuid = result.map_err(|e| to_status(&e))?;
        Ok(proto::GenUuidResponse {
            uuid: uuid.to_bytes().to_vec(),
            text: uuid.to_string(),
        })
    }

    async fn gen_uuids_inner(
        &self,
        req: proto::GenUuidsRequest,
    ) -> Result<proto::GenUuidsResponse, Status> {
        let started = Instant::now();
        let result = self.issuer.gen_uuids(u64::from(req.count)).await;
        self.gen_uuids.observe(started, &result);
        let uuids = result.map_err(|e| to_status(&e))?;
        let mut bytes = Vec::with_capacity(uuids.len() * 16);
        for u in &uuids {
            bytes.extend_from_slice(&u.to_bytes());
        }
        Ok(proto::GenUuidsResponse {
            uuids: bytes,
            texts: if req.with_text {
                uuids.iter().map(ToString::to_string).collect()
            } else {
                Vec::new()
            },
        })
    }

    fn decode_uuid_inner(
        &self,
        req: proto::DecodeUuidRequest,
        who: Option<&str>,
    ) -> Result<proto::DecodeUuidResponse, Status> {
        let started = Instant::now();
        let text = if req.uuid.is_empty() {
            Ok(req.text)
        } else {
            <[u8; 16]>::try_from(req.uuid.as_slice())
                .map(|b| crate::id::Uuid::from_bytes(b).to_string())
                .map_err(|_| {
                    Error::from(RequestError::BadQuery(format!(
                        "uuid has {} bytes; a UUID has 16",
                        req.uuid.len()
                    )))
                })
        };
        let result = text.and_then(|t| self.issuer.decode_uuid_as(&t, who));
        self.decode_uuid.observe(started, &result);
        let d = result.map_err(|e| to_status(&e))?;
        Ok(proto::DecodeUuidResponse {
            uuid: d.uuid,
            ulid: d.ulid,
            time: d.time,
            unix_millis: d.unix_millis,
            datacenter: d.datacenter as u32,
            worker: d.worker as u32,
            counter: d.counter,
            hidden: d.hidden.unwrap_or_default().to_owned(),
            key_version: d.key_version,
            internal_uuid: d.internal_uuid.unwrap_or_default(),
        })
    }
}

/// Parameters in name order (a proto map has none).
fn sorted_params(params: std::collections::HashMap<String, String>) -> Vec<(String, String)> {
    let mut params: Vec<(String, String)> = params.into_iter().collect();
    params.sort();
    params
}

fn formatted_response(issued: crate::modes::formatted::Issued) -> proto::GenFormattedResponse {
    let numbers = if issued.numeric {
        issued.ids.iter().filter_map(|r| r.number).collect()
    } else {
        Vec::new()
    };
    // A numeric format whose ID did not fit: no partial list.
    let numeric = issued.numeric && numbers.len() == issued.ids.len();
    proto::GenFormattedResponse {
        numbers: if numeric { numbers } else { Vec::new() },
        numeric,
        ids: issued.ids.into_iter().map(|r| r.text).collect(),
    }
}

/// A parsed ID as the proto shows it (the public fields).
fn parsed_message(p: crate::id::format::ParsedId) -> proto::ParseFormattedResponse {
    proto::ParseFormattedResponse {
        year: p.year,
        month: p.month.map(u32::from),
        day: p.day.map(u32::from),
        hour: p.hour.map(u32::from),
        minute: p.minute.map(u32::from),
        second: p.second.map(u32::from),
        unix_seconds: p.unix_s,
        node: p.node,
        token: p.token,
        seq: p.seq,
        params: p.params.into_iter().collect(),
        check: p.check,
        key_version: None,
        internal_seq: None,
    }
}
