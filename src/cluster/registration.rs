//! Registering a node as Consul service `idgen`, with a gRPC health check
//! the agent runs against `grpc.health.v1`, so clients discover only nodes
//! that are issuing IDs.
//!
//! The agent can forget a service (it restarted with no state).
//! [`Registration::keep_registered`] (and [`keep_current_registered`]) look the instance up in the health
//! catalog every interval and registers again when it is missing. It never
//! re-registers blindly, because a fresh registration restarts the check
//! from critical.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::consul::{ConsulClient, ConsulError, ServiceCheck, ServiceRegistration};
use crate::store::WorkerKey;

/// The Consul service name idgen registers under by default.
pub const SERVICE_NAME: &str = "idgen";

/// How the node appears in Consul.
#[derive(Debug, Clone)]
pub struct RegistrationSpec {
    /// Stable instance id; the service id is `idgen-<instance>`.
    pub instance: String,
    /// Service name (default `idgen`).
    pub service: String,
    /// The gRPC address clients should dial.
    pub grpc: SocketAddr,
    /// The worker id this node holds.
    pub worker: WorkerKey,
    /// Modes this node serves (tags).
    pub modes: Vec<String>,
    /// How often the agent probes gRPC health.
    pub check_interval: Duration,
    /// Probe timeout.
    pub check_timeout: Duration,
    /// Remove the service after its check stayed critical this long.
    pub deregister_after: Duration,
    /// The HTTP (metrics) port, advertised as `Meta.metrics_port` so
    /// Prometheus' `consul_sd_configs` can scrape it (`None`: not known).
    pub metrics_port: Option<u16>,
    /// The node serves gRPC over TLS: the agent's probe uses TLS
    /// (`GRPCUseTLS`) and checks the certificate against this name
    /// (`TLSServerName`). `None`: plaintext probes.
    pub check_tls_server_name: Option<String>,
}

/// A node's registration with its local Consul agent.
#[derive(Debug, Clone)]
pub struct Registration {
    client: ConsulClient,
    registration: ServiceRegistration,
    worker: WorkerKey,
}

impl Registration {
    /// Builds the registration for `spec` (nothing is sent yet). Refuses
    /// an unspecified address (`0.0.0.0`, `::`): the agent's probe would
    /// reach localhost and pass while clients could not dial it.
    pub fn new(client: ConsulClient, spec: &RegistrationSpec) -> Result<Self, String> {
        if spec.grpc.ip().is_unspecified() {
            return Err(format!(
                "cannot register {} in Consul: clients cannot dial an unspecified address; set an advertise address",
                spec.grpc
            ));
        }
        let id = format!("idgen-{}", spec.instance);
        let meta: BTreeMap<String, String> = [
            ("instance", spec.instance.clone()),
            ("datacenter", spec.worker.datacenter.to_string()),
            ("worker", spec.worker.worker.to_string()),
            ("version", env!("CARGO_PKG_VERSION").to_owned()),
        ]
        .into_iter()
        .chain(spec.metrics_port.map(|p| ("metrics_port", p.to_string())))
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let mut tags = vec![
            format!("dc-{}", spec.worker.datacenter),
            format!("worker-{}", spec.worker.worker),
        ];
        tags.extend(spec.modes.iter().cloned());
        let registration = ServiceRegistration {
            checks: vec![ServiceCheck::Grpc {
                check_id: format!("{id}-grpc"),
                target: format!("{}/idgen.v1.IdGen", spec.grpc),
                interval: spec.check_interval,
                timeout: spec.check_timeout,
                deregister_after: Some(spec.deregister_after),
                tls_server_name: spec.check_tls_server_name.clone(),
            }],
            id,
            name: spec.service.clone(),
            tags,
            address: spec.grpc.ip().to_string(),
            port: spec.grpc.port(),
            meta,
        };
        Ok(Self {
            client,
            registration,
            worker: spec.worker,
        })
    }

    /// The worker id the registration advertises.
    pub fn worker(&self) -> WorkerKey {
        self.worker
    }

    /// The service id (`idgen-<instance>`).
    pub fn service_id(&self) -> &str {
        &self.registration.id
    }

    /// Registers (or re-registers) the service.
    pub async fn register(&self) -> Result<(), ConsulError> {
        self.client.service_register(&self.registration).await
    }

    /// Whether this node's agent still has the service (any health). The
    /// agent answers from its own state: one small local read per node,
    /// where reading the service's health list would cost each node a
    /// server read of every instance.
    pub async fn is_registered(&self) -> Result<bool, ConsulError> {
        let ids = self.client.agent_service_ids().await?;
        Ok(ids.contains(&self.registration.id))
    }

    /// Every `interval` until `stop` completes, registers again if the
    /// agent forgot the service. Errors are logged and retried next time.
    pub async fn keep_registered(
        &self,
        interval: Duration,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let current = ArcSwap::from_pointee(self.clone());
        keep_current_registered(&current, interval, None, stop).await;
    }

    /// Removes the service from the agent (shutdown).
    pub async fn deregister(&self) -> Result<(), ConsulError> {
        self.client.service_deregister(&self.registration.id).await
    }
}

/// Like [`Registration::keep_registered`] for a registration that may be
/// replaced while it runs (a node that claimed another worker id): when
/// `changed` is notified, the current one is registered at once.
pub async fn keep_current_registered(
    current: &ArcSwap<Registration>,
    interval: Duration,
    changed: Option<&tokio::sync::Notify>,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await; // the first tick is immediate
                         // An update that failed is sent again at the next tick.
    let mut pending = false;
    loop {
        let now_changed = async {
            match changed {
                Some(n) => n.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stop => return,
            _ = ticker.tick() => {}
            () = now_changed => pending = true,
        }
        let r = current.load_full();
        if pending {
            match r.register().await {
                Ok(()) => {
                    tracing::info!(service = r.service_id(), worker = %r.worker, "registration updated");
                    pending = false;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot update the registration; retrying next interval")
                }
            }
            continue;
        }
        match r.is_registered().await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(service = %r.registration.id, "Consul agent lost the service; registering again");
                if let Err(e) = r.register().await {
                    tracing::warn!(error = %e, "re-registration failed; retrying next interval");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot check the service registration"),
        }
    }
}
