//! The `idgen.v1.IdGen` gRPC service: proto <-> domain conversion only.

use std::sync::Arc;
use std::time::Instant;

use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::id::{Mode, RequestError};
use crate::metrics as m;
use crate::proto::{self, id_gen_server::IdGen};

use super::issuer::Issuer;
use super::status::{code_name, to_status};

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

/// Records a request's latency under its rpc name and final code.
pub fn observe<T>(rpc: &'static str, started: Instant, result: &Result<T, Error>) {
    let code = match result {
        Ok(_) => "OK",
        Err(e) => code_name(super::status::code(e)),
    };
    metrics::histogram!(m::REQUEST_DURATION, "rpc" => rpc, "code" => code)
        .record(started.elapsed().as_secs_f64());
}

/// The gRPC front end over an [`Issuer`].
pub struct IdGenService {
    issuer: Arc<Issuer>,
}

impl IdGenService {
    /// A service answering from `issuer`.
    pub fn new(issuer: Arc<Issuer>) -> Self {
        Self { issuer }
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
        observe("GenId", started, &result);
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
        observe("GenIds", started, &result);
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
        observe("DecodeId", started, &result);
        result
            .map(|d| {
                Response::new(proto::DecodeIdResponse {
                    id: d.id,
                    mode: mode_to_proto(Mode::Snowflake) as i32,
                    time: d.time,
                    unix_millis: d.unix_millis,
                    datacenter: d.datacenter as u32,
                    worker: d.worker as u32,
                    sequence: d.sequence,
                })
            })
            .map_err(|e| to_status(&e))
    }
}
