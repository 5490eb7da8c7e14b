//! The settings a node joins the cluster with: the validated `[consul]`
//! section. Defined here, beside the code that uses them, and re-exported
//! by `config`, which builds them from the file: the cluster never
//! imports the configuration layer above it.

use std::time::Duration;

use super::worker_lock::WorkerLockSettings;
use crate::consul::ConsulConfig;
use crate::store::kv_paths::ClusterPaths;

/// The validated `[consul]` section.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// How to reach the agent (address, token, timeouts).
    pub client: ConsulConfig,
    /// `<prefix>/<cluster>/`.
    pub keys: ClusterPaths,
    /// Consul service name.
    pub service: String,
    /// Claim exactly `node.worker_id` instead of any free id.
    pub static_worker: bool,
    /// Worker lock timing.
    pub lock: WorkerLockSettings,
    /// gRPC health probe interval.
    pub check_interval: Duration,
    /// gRPC health probe timeout.
    pub check_timeout: Duration,
    /// `DeregisterCriticalServiceAfter`.
    pub deregister_after: Duration,
    /// `consul.check_tls_server_name`: the gRPC check's `TLSServerName`
    /// when the node serves TLS; `None`: derived from the certificate.
    pub check_tls_server_name: Option<String>,
    /// Longest pause between claim attempts after the claim was lost (its
    /// Consul session ended).
    pub reclaim_backoff_max: Duration,
    /// `consul.primary_datacenter`: the Consul datacenter whose KV holds
    /// the datacenter-id claims. `None`: the node's own Consul
    /// datacenter.
    pub primary_datacenter: Option<String>,
}
