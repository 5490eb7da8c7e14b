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
    gen_id: RpcMetric,
    gen_ids: RpcMetric,
    decode_id: RpcMetric,
}

impl IdGenService {
    /// A service answering from `issuer`.
    pub fn new(issuer: Arc<Issuer>) -> Self {
        Self {
            issuer,
            gen_id: RpcMetric::new("GenId"),
            gen_ids: RpcMetric::new("GenIds"),
            decode_id: RpcMetric::new("DecodeId"),
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
        let req = request.into_inner();
        let result = mode_from_proto(req.mode)
            .map_err(Error::from)
            .and_then(|mode| self.issuer.decode(mode, req.id));
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
                })
            })
            .map_err(|e| to_status(&e))
    }
}
