//! The seam between a node and how it holds its identity (in the spirit
//! of uid-generator's `WorkerIdAssigner`): [`Membership::Static`] for the
//! embedded backend, whose worker id comes from the configuration, and
//! [`Membership::Consul`] for a claimed, supervised worker id. A node
//! joins, takes its generator, runs (supervised, in a cluster) and
//! finishes, without knowing which one it has.

use std::sync::Arc;
use std::time::Instant;

use super::supervisor::{Cluster, ClusterSpec, RunningCluster};
// Defined beside the supervisor that uses them, and named here too: a
// node joins through this seam.
pub use super::supervisor::{on_renewal_thread, JoinError, SessionBound};
use crate::consul::ConsulClient;
use crate::error::Error;
use crate::id::{Clock, Layout, Snowflake};
use crate::metrics as m;
use crate::modes::gate::IssueGate;
use crate::store::hwm::{HwmSettings, KeeperHandle};
use crate::store::{HwmKeeper, HwmStore, StoreError, WorkerKey};
use tokio::runtime::Handle;

/// How a node holds its worker id and high-water mark.
pub enum Membership {
    /// The embedded state file; the worker id comes from the configuration.
    Static(KeeperHandle),
    /// A worker id claimed in Consul, supervised once serving.
    Consul(Box<Cluster>),
}

impl Membership {
    /// Starts the generator of the configured worker id above its mark in
    /// `store`, on the `renewal` runtime (where the mark renewal then runs).
    pub async fn join_static(
        store: Arc<dyn HwmStore>,
        key: WorkerKey,
        layout: Layout,
        clock: Arc<dyn Clock>,
        settings: HwmSettings,
        renewal: &Handle,
    ) -> Result<Self, Error> {
        let (generator, keeper) = on_renewal_thread(renewal, async move {
            HwmKeeper::start(store, key, layout, clock, settings).await
        })
        .await??;
        drop(generator);
        metrics::gauge!(m::WORKER_ID, "datacenter" => key.datacenter.to_string())
            .set(key.worker as f64);
        Ok(Self::Static(keeper))
    }

    /// Claims a worker id in Consul and starts its generator above the
    /// stored mark (see [`Cluster::start`]).
    pub async fn join_consul(
        spec: ClusterSpec,
        clock: Arc<dyn Clock>,
        renewal: &Handle,
    ) -> Result<Self, JoinError> {
        Ok(Self::Consul(Box::new(
            Cluster::start(spec, clock, renewal).await?,
        )))
    }

    /// The generator of the worker id held now.
    pub fn generator(&self) -> Arc<Snowflake> {
        match self {
            Self::Static(keeper) => Arc::clone(keeper.generator()),
            Self::Consul(cluster) => Arc::clone(cluster.generator()),
        }
    }

    /// The worker id held now.
    pub fn key(&self) -> WorkerKey {
        match self {
            Self::Static(keeper) => keeper.key(),
            Self::Consul(cluster) => cluster.key(),
        }
    }

    /// The Consul client, in a cluster.
    pub fn consul(&self) -> Option<&ConsulClient> {
        match self {
            Self::Static(_) => None,
            Self::Consul(cluster) => Some(cluster.client()),
        }
    }

    /// The worker lock's local deadline, in a cluster.
    pub fn deadline(&self) -> Option<Instant> {
        match self {
            Self::Static(_) => None,
            Self::Consul(cluster) => Some(cluster.lock_deadline()),
        }
    }

    /// Starts supervising (in a cluster: renewals, fencing, re-claims,
    /// registration). Call once the gRPC server answers health checks.
    /// `gate` is the issue path's gate the supervisor fences and re-arms.
    pub async fn run(self, gate: Arc<IssueGate>, bound: Option<Arc<dyn SessionBound>>) -> Running {
        match self {
            Self::Static(keeper) => Running::Static(keeper),
            Self::Consul(cluster) => Running::Consul(cluster.run(gate, bound).await),
        }
    }
}

/// The membership of a serving node.
pub enum Running {
    /// See [`Membership::Static`].
    Static(KeeperHandle),
    /// See [`Membership::Consul`].
    Consul(RunningCluster),
}

impl Running {
    /// Shutdown, after the front ends drained: stores the final mark (if
    /// the id is still held) and, in a cluster, releases the lock and
    /// deregisters. Returns the final mark stored, if any.
    pub async fn finish(self) -> Result<Option<u64>, StoreError> {
        match self {
            Self::Static(keeper) => keeper.finish().await.map(Some),
            Self::Consul(cluster) => cluster.finish().await,
        }
    }
}
