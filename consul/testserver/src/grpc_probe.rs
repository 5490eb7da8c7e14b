//! gRPC health checks: each check gets a task that calls
//! `grpc.health.v1.Health/Check` every `Interval` and records passing when
//! the answer is SERVING, critical otherwise. As in Consul's `CheckGRPC`,
//! the first call comes after a random pause of up to one interval
//! (`lib.RandomStagger`), so a new check stays critical for that long.
//!
//! A check with `GRPCUseTLS` is probed over TLS: the server's certificate
//! must chain to [`CheckTlsConfig::ca_pem`](crate::config::CheckTlsConfig)
//! and carry the check's `TLSServerName` (or the target's host when that
//! is empty); a plaintext server, an unknown issuer or a wrong name leave
//! the check critical, as in Consul.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_rustls::rustls::ClientConfig;
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
        let tls = match &probe.tls {
            Some(_) => match crate::tls::probe_config(&cluster.config.check_tls) {
                Ok(config) => Some(config),
                Err(e) => {
                    tracing::warn!(error = %e, "check TLS settings unusable; the check stays critical");
                    return;
                }
            },
            None => None,
        };
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
                result = probe_once(&probe, tls.clone()) => result,
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
async fn probe_once(probe: &ProbeSpec, tls: Option<Arc<ClientConfig>>) -> (HealthStatus, String) {
    let label = format!("gRPC check {}/{}", probe.target, probe.service);
    match tokio::time::timeout(probe.timeout, call(probe, probe.timeout, tls)).await {
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

async fn call(
    probe: &ProbeSpec,
    timeout: Duration,
    tls: Option<Arc<ClientConfig>>,
) -> Result<ServingStatus, String> {
    let endpoint = Endpoint::from_shared(format!("http://{}", probe.target))
        .map_err(|e| format!("invalid target: {e}"))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = match (tls, &probe.tls) {
        (Some(config), Some(check)) => {
            let (target, name) = (probe.target.clone(), check.server_name.clone());
            endpoint
                .connect_with_connector(tower::service_fn(move |_: tonic::codegen::http::Uri| {
                    let (config, target, name) =
                        (Arc::clone(&config), target.clone(), name.clone());
                    async move {
                        crate::tls::connect(config, &target, &name)
                            .await
                            .map(hyper_util::rt::TokioIo::new)
                    }
                }))
                .await
        }
        _ => endpoint.connect().await,
    }
    .map_err(|e| format!("connect failed: {}", error_chain(&e)))?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: probe.service.clone(),
        })
        .await
        .map_err(|status| format!("rpc error: {} {}", status.code(), status.message()))?;
    Ok(ServingStatus::try_from(response.into_inner().status).unwrap_or(ServingStatus::Unknown))
}

/// An error with its causes, so a TLS failure shows its reason.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        text.push_str(": ");
        text.push_str(&err.to_string());
        cur = err.source();
    }
    text
}
