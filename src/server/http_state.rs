//! What the HTTP port's handlers share: the JSON API (`http.rs`) and the
//! console (`console.rs`) both take it as their router state, so it
//! lives in neither (each would otherwise import the other).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};

use metrics_exporter_prometheus::PrometheusHandle;

use super::grpc::RpcMetric;
use crate::cluster::status::StatusBoard;
use crate::modes::Issuer;

/// What the HTTP handlers share.
#[derive(Clone)]
pub struct HttpState {
    /// Issues IDs.
    pub issuer: Arc<Issuer>,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
    /// True while the node issues IDs (drives `/readyz`).
    pub ready: Arc<AtomicBool>,
    /// False once the node has been unable to issue (fenced, or its store
    /// cannot write) for longer than `store.max_unhealthy` (drives
    /// `/healthz`, so an orchestrator restarts it).
    pub live: Arc<AtomicBool>,
    /// Latency metrics of the JSON endpoints.
    pub rpc: Arc<HttpMetrics>,
    /// The admin service the gRPC port serves; the console's JSON API
    /// calls it (`server::console`).
    pub admin: Arc<super::admin::AdminService>,
    /// Every node's status for the console (`/admin/api/cluster`).
    pub cluster: ClusterStatus,
    /// Origins a browser may call `/v1/` from (`super::cors`).
    pub cors: Arc<crate::config::CorsOrigins>,
}

/// Latency metrics of the JSON endpoints.
pub struct HttpMetrics {
    pub(super) id: RpcMetric,
    pub(super) ids: RpcMetric,
    pub(super) decode: RpcMetric,
    pub(super) formatted: RpcMetric,
    pub(super) parse: RpcMetric,
    pub(super) uuid: RpcMetric,
    pub(super) uuids: RpcMetric,
    pub(super) decode_uuid: RpcMetric,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        Self {
            id: RpcMetric::new("http_id"),
            ids: RpcMetric::new("http_ids"),
            decode: RpcMetric::new("http_decode"),
            formatted: RpcMetric::new("http_formatted"),
            parse: RpcMetric::new("http_formatted_parse"),
            uuid: RpcMetric::new("http_uuid"),
            uuids: RpcMetric::new("http_uuids"),
            decode_uuid: RpcMetric::new("http_uuid_decode"),
        }
    }
}

/// Where the console finds every node's status: the Consul board (none on
/// the embedded store), and this node's issue rate as its status task last
/// measured it.
#[derive(Debug, Clone, Default)]
pub struct ClusterStatus {
    board: Option<StatusBoard>,
    rate: Arc<Mutex<Option<f64>>>,
}

impl ClusterStatus {
    /// The view of a Consul cluster through `board`, or of this node alone
    /// (`None`).
    pub fn new(board: Option<StatusBoard>) -> Self {
        Self {
            board,
            rate: Arc::default(),
        }
    }

    /// The Consul board, when the node runs on Consul.
    pub fn board(&self) -> Option<&StatusBoard> {
        self.board.as_ref()
    }

    /// Records this node's issue rate (IDs a second over the last
    /// interval).
    pub fn set_rate(&self, rate: Option<f64>) {
        *self.rate.lock().unwrap_or_else(PoisonError::into_inner) = rate;
    }

    pub(super) fn rate(&self) -> Option<f64> {
        *self.rate.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
