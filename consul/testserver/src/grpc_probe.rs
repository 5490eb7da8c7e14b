//! gRPC health checks: each check gets a task that calls
//! `grpc.health.v1.Health/Check` every `Interval` and records passing when
//! the answer is SERVING, critical otherwise. As in Consul's `CheckGRPC`,
//! the first call comes after a random pause of up to one interval
//! (`lib.RandomStagger`), so a new check stays critical for that long.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::transport::Endpoint;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::cluster::Cluster;
use crate::state::catalog::{HealthStatus, ProbeSpec};

/// Starts probing; the task ends when the check is deregistered or
/// re-registered, or the server shuts down.
pub(crate) fn spawn(cluster: Arc<Cluster>, probe: ProbeSpec) {
    tokio::spawn(async move {
        let mut shutdown = cluster.shutdown.clone();
        let stagger = probe.interval.mul_f64(rand::random::<f64>());
        tokio::select! {
            _ = tokio::time::sleep(stagger) => {}
            _ = shutdown.changed() => return,
        }
        loop {
            let current =
                cluster.read(|st| st.probe_is_current(&probe.node, &probe.check_id, probe.serial));
            if !current || *shutdown.borrow_and_update() {
                return;
            }
            let (status, output) = tokio::select! {
                result = probe_once(&probe) => result,
                _ = shutdown.changed() => return,
            };
            let now = Instant::now();
            if !cluster.write(|st| st.record_probe(&probe, status, output, now)) {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(probe.interval) => {}
                _ = shutdown.changed() => return,
            }
        }
    });
}

/// One health call, bounded by the check's timeout.
async fn probe_once(probe: &ProbeSpec) -> (HealthStatus, String) {
    let label = format!("gRPC check {}/{}", probe.target, probe.service);
    match tokio::time::timeout(probe.timeout, call(probe, probe.timeout)).await {
        Ok(Ok(ServingStatus::Serving)) => (HealthStatus::Passing, format!("{label}: success")),
        Ok(Ok(status)) => (
            HealthStatus::Critical,
            format!("{label}: failed with status {}", status.as_str_name()),
        ),
        Ok(Err(error)) => (HealthStatus::Critical, format!("{label}: {error}")),
        Err(_) => (
            HealthStatus::Critical,
            format!("{label}: timed out after {:?}", probe.timeout),
        ),
    }
}

async fn call(probe: &ProbeSpec, timeout: Duration) -> Result<ServingStatus, String> {
    let endpoint = Endpoint::from_shared(format!("http://{}", probe.target))
        .map_err(|e| format!("invalid target: {e}"))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("connect failed: {e}"))?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: probe.service.clone(),
        })
        .await
        .map_err(|status| format!("rpc error: {} {}", status.code(), status.message()))?;
    Ok(ServingStatus::try_from(response.into_inner().status).unwrap_or(ServingStatus::Unknown))
}
