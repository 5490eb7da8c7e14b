//! Cluster mode: a worker id claimed in Consul, the high-water mark kept in
//! Consul KV, the service registered with a gRPC health check, and the
//! supervisor that fences the node the moment its lock runs out.
//!
//! # Life of a node
//! 1. [`Cluster::start`] (before anything listens) claims a worker id with
//!    a session lock, reads the stored mark consistently and starts the
//!    generator above it. Any failure here stops start-up with the reason.
//!    Before the claim it compares its layout with the cluster's record
//!    (`store::cluster_layout`); claims, mark renewals, session renewals
//!    and the supervisor run on the node's renewal thread
//!    (the `renewal` runtime handle it is given) with a Consul client of their own, so a busy
//!    request runtime cannot starve them.
//! 2. [`Cluster::run`] (once the gRPC server is up) spawns the supervisor
//!    and registers the service in the background. The supervisor renews
//!    the session every min(TTL, lock-delay)/3, and
//!    when the local deadline passes without a successful renew (or Consul
//!    dropped the session) it closes the generator at once (calls get
//!    UNAVAILABLE, health goes NOT_SERVING), gives the id back if Consul
//!    still listens, and claims an id again with backoff. The new
//!    generator starts above the stored mark of whatever id it got.
//! 3. [`RunningCluster::finish`] (shutdown, after draining) stores the
//!    final mark, releases the lock, destroys the session and deregisters.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use tokio::runtime::Handle;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::settings::ClusterConfig;
use super::worker_lock::{DeadlineHook, WorkerChoice, WorkerLock};
use crate::consul::ConsulClient;
use crate::error::Error;
use crate::id::{Clock, Layout, StartError};
use crate::metrics as m;
use crate::store::cluster_layout::{
    change_layout, check_confirmed_layout, confirm_primary_layout, ensure_layout, fence_reason,
    read_layout, ClusterLayoutError, LayoutGuard, RecordedLayout,
};
use crate::store::datacenter_claim::DatacenterRegistry;
use crate::store::hwm::{HwmSettings, KeeperHandle, KeeperStartError};
use crate::store::{hwm::ConsulHwmStore, kv_paths::OwnerInfo};
use crate::store::{HwmKeeper, StoreError, WorkerKey};

use super::registration::{keep_current_registered, Registration, RegistrationSpec};
use crate::modes::gate::IssueGate;

/// What a node holds under its worker lock's session besides the lock
/// (lease mode's token), built at assembly: moved to the new session
/// after every re-claim, given back before the session is destroyed.
#[async_trait]
pub trait SessionBound: Send + Sync + 'static {
    /// A new `session` holds the worker id: re-create what lived under the
    /// old one.
    fn moved(&self, session: &str, owner: &OwnerInfo) -> Result<(), StoreError>;
    /// Shutdown: give it back while the session still exists.
    async fn release(&self);
}

/// Why a node could not join the cluster (take its worker id and start
/// its generator above the stored mark); nothing was issued.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// No worker id could be claimed in Consul.
    #[error(transparent)]
    WorkerLock(#[from] super::worker_lock::WorkerLockError),
    /// The datacenter id belongs to another Consul datacenter, or the
    /// primary could not confirm it.
    #[error(transparent)]
    Datacenter(#[from] crate::store::datacenter_claim::DatacenterClaimError),
    /// Consul, the cluster's layout record, the store or the start-up rule
    /// refused.
    #[error(transparent)]
    Node(#[from] Error),
}

/// Runs `f` on `runtime` (the node's renewal thread, where the claim's
/// mark renewal and the supervisor then live) and waits for its result,
/// from any runtime.
pub async fn on_renewal_thread<F>(runtime: &Handle, f: F) -> Result<F::Output, Error>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    runtime
        .spawn(f)
        .await
        .map_err(|e| Error::Setup(format!("renewal thread task failed: {e}")))
}

/// First pause between claim attempts after fencing; doubles up to
/// `consul.reclaim_backoff_max`.
const RECLAIM_BACKOFF_MIN: Duration = Duration::from_millis(200);

/// How often the node checks that the agent still lists its service.
const REGISTRATION_CHECK: Duration = Duration::from_secs(10);

/// Everything needed to claim a worker id and start a generator on it.
pub struct ClusterSpec {
    /// The `[consul]` section.
    pub config: ClusterConfig,
    /// This node's datacenter id.
    pub datacenter: u64,
    /// The worker id for `consul.worker = "static"`.
    pub worker_id: u64,
    /// The ID layout.
    pub layout: Layout,
    /// The layout's preset name, recorded with it in Consul.
    pub layout_preset: String,
    /// How the layout's IDs are hidden, recorded with it in Consul (empty:
    /// not hidden).
    pub layout_hide: String,
    /// The layout the generator composes IDs under: `layout` itself, or a
    /// hidden layout's effective layout.
    pub generator_layout: Layout,
    /// High-water mark timing and the clock rules.
    pub hwm: HwmSettings,
    /// Stable instance name.
    pub instance: String,
    /// The gRPC address clients and the agent dial.
    pub advertise: SocketAddr,
    /// The HTTP (metrics) port advertised in the registration's `Meta`.
    pub metrics_port: Option<u16>,
    /// The gRPC check's `TLSServerName` when the node serves TLS (the
    /// probe then uses TLS); `None`: plaintext.
    pub check_tls_server_name: Option<String>,
    /// The modes this node serves, registered as tags (`snowflake`,
    /// `segment`, `lease`, `strict`, `formatted`), so clients can find the
    /// nodes that serve the mode they use (Consul `?tag=`).
    pub modes: Vec<String>,
}

/// A worker id held, with its generator running.
struct Claim {
    lock: Arc<WorkerLock>,
    keeper: KeeperHandle,
    owner: OwnerInfo,
    /// The layout record's generation this claim was checked against.
    layout_generation: u64,
}

/// A node's place in the cluster, claimed but not yet supervised.
pub struct Cluster {
    spec: Arc<ClusterSpec>,
    client: ConsulClient,
    /// The client of the renewal thread: worker claims, session renewals
    /// and mark writes (its connections live on that thread).
    coord: ConsulClient,
    renewal: tokio::runtime::Handle,
    clock: Arc<dyn Clock>,
    held: Claim,
    registration: Registration,
}

impl Cluster {
    /// Claims a worker id and starts the generator above its stored mark,
    /// on `renewal`'s thread (where the mark renewal then runs).
    pub async fn start(
        spec: ClusterSpec,
        clock: Arc<dyn Clock>,
        renewal: &tokio::runtime::Handle,
    ) -> Result<Self, JoinError> {
        let client = ConsulClient::new(spec.config.client.clone()).map_err(Error::from)?;
        let coord = ConsulClient::new(spec.config.client.clone()).map_err(Error::from)?;
        let spec = Arc::new(spec);
        metrics::counter!(m::FENCINGS).increment(0);
        // At zero from the start (also without Consul TLS, where it stays
        // there), so the reload alert's series exists on every Consul node.
        for result in ["ok", "error"] {
            metrics::counter!(m::CONSUL_TLS_RELOADS, "result" => result).increment(0);
        }
        let held = {
            let (spec, coord, clock) = (Arc::clone(&spec), coord.clone(), Arc::clone(&clock));
            on_renewal_thread(renewal, async move { claim(&spec, &coord, &clock).await }).await??
        };
        let registration =
            registration_for(&spec, &client, held.lock.key()).map_err(Error::Setup)?;
        record_claim(held.lock.key(), false);
        Ok(Self {
            spec,
            client,
            coord,
            renewal: renewal.clone(),
            clock,
            held,
            registration,
        })
    }

    /// The held lock's local deadline now.
    pub fn lock_deadline(&self) -> Instant {
        self.held.lock.deadline()
    }

    /// The generator of the worker id held now.
    pub fn generator(&self) -> &Arc<crate::id::Snowflake> {
        self.held.keeper.generator()
    }

    /// The Consul client (one connection pool for everything the node
    /// keeps in Consul).
    pub fn client(&self) -> &ConsulClient {
        &self.client
    }

    /// The worker id held now.
    pub fn key(&self) -> WorkerKey {
        self.held.lock.key()
    }

    /// The worker lock's session and what its value says about this node.
    pub fn session(&self) -> (&str, &OwnerInfo) {
        (self.held.lock.session(), &self.held.owner)
    }

    /// Registers the service and starts supervising the lock. Call once
    /// the gRPC server answers health checks.
    /// `gate` is the issue path's gate the supervisor fences and re-arms;
    /// `bound` is what lives under the session (lease mode's token), moved
    /// to the new session after every re-claim and released at shutdown.
    pub async fn run(
        self,
        gate: Arc<IssueGate>,
        bound: Option<Arc<dyn SessionBound>>,
    ) -> RunningCluster {
        let Cluster {
            spec,
            client,
            coord,
            renewal,
            clock,
            held,
            registration,
        } = self;
        // From here every renew moves the issue path's deadline on.
        held.lock.on_renew(deadline_hook(&gate));
        let registration = Arc::new(ArcSwap::from_pointee(registration));
        let changed = Arc::new(Notify::new());
        let (stop, stopped) = watch::channel(false);
        // The lock is renewed from now on; registration never delays it.
        let supervisor = renewal.spawn(supervise(
            Arc::clone(&spec),
            (coord, client.clone()),
            clock,
            held,
            (Arc::clone(&gate), bound.clone()),
            (Arc::clone(&registration), Arc::clone(&changed)),
            stopped.clone(),
        ));
        let registrar = {
            let registration = Arc::clone(&registration);
            tokio::spawn(async move {
                let first = registration.load_full();
                match first.register().await {
                    Ok(()) => tracing::info!(
                        service = first.service_id(),
                        "registered in Consul with a gRPC health check"
                    ),
                    Err(e) => tracing::warn!(
                        error = %e,
                        "cannot register the service in Consul yet; retrying every {}s",
                        REGISTRATION_CHECK.as_secs()
                    ),
                }
                keep_current_registered(
                    &registration,
                    REGISTRATION_CHECK,
                    Some(&changed),
                    wait_stop(stopped),
                )
                .await;
            })
        };
        // Rotated Consul client certificates are used by the next
        // connection (every client of this node shares the material).
        let tls_watch = spec
            .config
            .client
            .tls
            .clone()
            .map(|tls| tokio::spawn(crate::consul::tls::watch(tls)));
        RunningCluster {
            stop,
            supervisor,
            registrar,
            registration,
            bound,
            tls_watch,
        }
    }
}

/// The supervised cluster membership of a serving node.
pub struct RunningCluster {
    stop: watch::Sender<bool>,
    supervisor: JoinHandle<Option<Claim>>,
    registrar: JoinHandle<()>,
    registration: Arc<ArcSwap<Registration>>,
    bound: Option<Arc<dyn SessionBound>>,
    /// Reloads the Consul TLS files when they change (HTTPS to Consul).
    tls_watch: Option<JoinHandle<()>>,
}

impl RunningCluster {
    /// Shutdown, after the front ends drained: stores the final mark (if
    /// the id is still held), releases the lock, destroys the session and
    /// deregisters the service. Returns the final mark stored, if any.
    pub async fn finish(self) -> Result<Option<u64>, crate::store::StoreError> {
        let _ = self.stop.send(true);
        if let Some(watch) = &self.tls_watch {
            watch.abort();
        }
        let held = self.supervisor.await.ok().flatten();
        let _ = self.registrar.await;
        let mut result = Ok(None);
        if let Some(Claim { lock, keeper, .. }) = held {
            result = keeper.finish().await.map(Some);
            if let Some(bound) = &self.bound {
                // Before the session goes: the token keeps its counter and
                // this instance gets it back on restart.
                bound.release().await;
            }
            match lock.release().await {
                Ok(()) => {
                    tracing::info!(worker = %lock.key(), "worker id released, session destroyed")
                }
                Err(e) => tracing::warn!(
                    worker = %lock.key(),
                    error = %e,
                    "cannot release the worker id; it frees itself when the session expires"
                ),
            }
        }
        let registration = self.registration.load();
        match registration.deregister().await {
            Ok(()) => tracing::info!(
                service = registration.service_id(),
                "deregistered from Consul"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "cannot deregister from Consul; the agent removes the service once its check stays critical")
            }
        }
        result
    }
}

/// The cluster's layout record, checked against this node's layout and
/// hiding (or recorded, by the first node).
async fn layout_guard(spec: &ClusterSpec, client: &ConsulClient) -> Result<LayoutGuard, JoinError> {
    let ids = (spec.layout_preset.as_str(), spec.layout_hide.as_str());
    let guard = ensure_layout(client, &spec.config.keys, &spec.layout, ids)
        .await
        .map_err(Error::from)?;
    Ok(guard)
}

/// What comes before a worker id is claimed: the cluster's index, the
/// datacenter id (rule 39: it must be this Consul datacenter's, or every
/// worker id under it could repeat another datacenter's IDs), then the
/// layout (a node on another layout must not even take a worker id), in
/// the primary when it is another datacenter, then in this one.
async fn before_claim(
    spec: &ClusterSpec,
    client: &ConsulClient,
    clock: &dyn Clock,
) -> Result<(DatacenterRegistry, LayoutGuard), JoinError> {
    check_cluster_index(spec, client).await;
    let registry = datacenter_claim(spec, client).await?;
    if registry.is_remote() && registry.primary_answered() {
        // One layout for the federation (rule 40): the primary's record,
        // made by the first node of any datacenter, must match, before
        // this datacenter records one of its own.
        copy_primary_layout(spec, client, &registry).await;
        layout_guard(spec, registry.primary_client())
            .await
            .map_err(|e| in_primary(e, registry.primary()))?;
    } else if registry.is_remote() {
        // Started on the confirmed claim (rule 42): compared with the copy
        // of the primary's record instead (rule 45).
        without_primary_layout(spec, client, &registry).await?;
    }
    let guard = match layout_guard(spec, client).await {
        Err(JoinError::Node(Error::ClusterLayout(ClusterLayoutError::Mismatch { .. })))
            if registry.is_remote() && registry.primary_answered() =>
        {
            follow_primary(spec, client, clock, &registry).await?
        }
        other => other?,
    };
    Ok((registry, guard))
}

/// Before the primary's record is compared (the primary answered): a copy
/// of it in this datacenter's KV, for starts while the primary is away.
async fn copy_primary_layout(
    spec: &ClusterSpec,
    client: &ConsulClient,
    registry: &DatacenterRegistry,
) {
    let keys = &spec.config.keys;
    if let Ok(Some((record, _))) = read_layout(registry.primary_client(), keys).await {
        confirm_primary_layout(client, keys, registry.primary(), &record).await;
    }
}

/// The primary does not answer (rule 42): this node's layout compared with
/// this datacenter's copy of the primary's record (rule 45), refused on a
/// difference; without a copy only this datacenter's own record is.
async fn without_primary_layout(
    spec: &ClusterSpec,
    client: &ConsulClient,
    registry: &DatacenterRegistry,
) -> Result<(), JoinError> {
    let mine = RecordedLayout::of(&spec.layout, &spec.layout_preset).with_hide(&spec.layout_hide);
    match check_confirmed_layout(client, &spec.config.keys, registry.primary(), &mine).await {
        Ok(true) => Ok(()),
        Ok(false) => {
            tracing::warn!(primary = %registry.primary(), "the primary does not answer and this datacenter holds no copy of its layout record; only this datacenter's own record is compared");
            Ok(())
        }
        Err(e) => Err(in_primary(Error::from(e).into(), registry.primary())),
    }
}

/// Rule 45: this node runs the primary's layout (just compared with it)
/// and its own datacenter's record holds another, so the federation's
/// layout was changed and this datacenter's record has not followed. The
/// node makes the change this datacenter's `idgen admin layout set` would
/// (rule 7: the record marked changing, this datacenter's marks read,
/// accepted only when no ID can repeat), then compares again; a refused
/// change leaves the node refused, with the record's mismatch.
async fn follow_primary(
    spec: &ClusterSpec,
    client: &ConsulClient,
    clock: &dyn Clock,
    registry: &DatacenterRegistry,
) -> Result<LayoutGuard, JoinError> {
    let by = format!(
        "node {} of Consul datacenter {:?}, following the primary {:?}",
        spec.instance,
        registry.local(),
        registry.primary()
    );
    let layout = (&spec.layout, spec.layout_preset.as_str());
    match change_layout(client, &spec.config.keys, layout, None, clock, &by).await {
        Ok(done) => {
            tracing::warn!(generation = done.record.generation, primary = %registry.primary(), layout = %done.record.layout.describe(), "this Consul datacenter's layout record brought to the primary's")
        }
        // Another node of this datacenter changed it meanwhile, or the
        // change is refused: the comparison below says which.
        Err(e) => {
            tracing::warn!(error = %e, primary = %registry.primary(), "this Consul datacenter's layout record was not brought to the primary's")
        }
    }
    layout_guard(spec, client).await
}

/// A refusal of the primary's layout record, said to be the primary's
/// (with the federation's fix); Consul failures stay as they are.
fn in_primary(e: JoinError, primary: &str) -> JoinError {
    match e {
        JoinError::Node(Error::ClusterLayout(e)) if !matches!(e, ClusterLayoutError::Consul(_)) => {
            JoinError::Node(Error::ClusterLayout(ClusterLayoutError::InPrimary {
                primary: primary.to_owned(),
                source: Box::new(e),
            }))
        }
        other => other,
    }
}

/// The claim of this node's datacenter id in the primary Consul
/// datacenter, made if there is none, refused if another owns it.
async fn datacenter_claim(
    spec: &ClusterSpec,
    client: &ConsulClient,
) -> Result<DatacenterRegistry, JoinError> {
    let registry = DatacenterRegistry::connect(
        client,
        &spec.config.keys,
        spec.config.primary_datacenter.as_deref(),
        spec.datacenter,
    )
    .await
    .map_err(Error::from)?;
    registry.ensure(&spec.instance).await?;
    Ok(registry)
}

/// Before this node writes anything under the cluster's keys: is the
/// cluster's Consul index below the one this node saved (a snapshot
/// restore, or Consul rebuilt empty, while it was down)? A detection is
/// recorded for the whole cluster; the node starts either way (snowflake
/// has its own rule), and its counter modes refuse.
async fn check_cluster_index(spec: &ClusterSpec, client: &ConsulClient) {
    let keys = &spec.config.keys;
    keys.written()
        .attach(client, keys.regression(), spec.instance.clone());
    keys.start_index(client).await;
}

/// Claims an id and starts its generator; on a start-up refusal (clock
/// behind the stored mark) the id is given back before failing.
async fn claim(
    spec: &ClusterSpec,
    client: &ConsulClient,
    clock: &Arc<dyn Clock>,
) -> Result<Claim, JoinError> {
    let owner = OwnerInfo {
        instance: spec.instance.clone(),
        address: spec.advertise.to_string(),
        since_ms: clock.now_millis(),
    };
    let (registry, guard) = before_claim(spec, client, clock.as_ref()).await?;
    let choice = if spec.config.static_worker {
        WorkerChoice::Static(spec.worker_id)
    } else {
        WorkerChoice::Auto {
            max: spec.layout.max_worker(),
        }
    };
    // Auto claims pass over ids whose stored mark is too far ahead of this
    // clock (a node with a fast clock ran there): another free id works.
    let mut poisoned = Vec::new();
    loop {
        let lock = WorkerLock::claim_skipping(
            client.clone(),
            spec.config.keys.clone(),
            spec.datacenter,
            choice,
            &owner,
            spec.config.lock,
            &poisoned,
        )
        .await?;
        tracing::info!(
            worker = %lock.key(),
            session = lock.session(),
            instance = %spec.instance,
            "worker id claimed in Consul"
        );
        let store = Arc::new(
            ConsulHwmStore::new(client.clone(), spec.config.keys.clone(), lock.session())
                .with_layout(guard.clone())
                .with_datacenter(registry.clone())
                .with_primary_layout(
                    RecordedLayout::of(&spec.layout, &spec.layout_preset)
                        .with_hide(&spec.layout_hide),
                ),
        );
        let layout = spec.generator_layout;
        let started =
            HwmKeeper::start(store, lock.key(), layout, Arc::clone(clock), spec.hwm).await;
        let e = match started {
            Ok((_, keeper)) => {
                return Ok(Claim {
                    lock: Arc::new(lock),
                    keeper,
                    owner,
                    layout_generation: guard.generation,
                })
            }
            Err(e) => e,
        };
        if let Err(r) = lock.release().await {
            tracing::warn!(error = %r, "cannot give the worker id back; it frees itself when the session expires");
        }
        match (&e, choice) {
            (
                KeeperStartError::Start(StartError::ClockBehindHwm {
                    behind_ms,
                    limit_ms,
                }),
                WorkerChoice::Auto { .. },
            ) => {
                let key = lock.key();
                tracing::warn!(
                    worker = %key,
                    skew_ms = behind_ms,
                    max_startup_skew_ms = limit_ms,
                    "the stored high-water mark of this worker id is {behind_ms} ms ahead of this node's clock (limit clock.max_startup_skew = {limit_ms} ms): gave it back, trying the next free id"
                );
                metrics::counter!(m::WORKER_IDS_SKIPPED).increment(1);
                poisoned.push(key.worker);
            }
            _ => return Err(Error::from(e).into()),
        }
    }
}

fn record_claim(key: WorkerKey, again: bool) {
    metrics::gauge!(m::WORKER_ID, "datacenter" => key.datacenter.to_string())
        .set(key.worker as f64);
    metrics::gauge!(m::FENCED).set(0.0);
    // The claim just created or renewed the session.
    metrics::gauge!(m::SESSION_RENEW_AGE).set(0.0);
    if again {
        tracing::info!(worker = %key, "worker id claimed again: issuing resumes");
    }
}

fn spec_for(spec: &ClusterSpec, key: WorkerKey) -> RegistrationSpec {
    RegistrationSpec {
        instance: spec.instance.clone(),
        service: spec.config.service.clone(),
        grpc: spec.advertise,
        worker: key,
        modes: spec.modes.clone(),
        check_interval: spec.config.check_interval,
        check_timeout: spec.config.check_timeout,
        deregister_after: spec.config.deregister_after,
        metrics_port: spec.metrics_port,
        check_tls_server_name: spec.check_tls_server_name.clone(),
    }
}

fn registration_for(
    spec: &ClusterSpec,
    client: &ConsulClient,
    key: WorkerKey,
) -> Result<Registration, String> {
    Registration::new(client.clone(), &spec_for(spec, key))
}

/// Renews the lock until stopped; on loss fences and claims again.
/// Returns the id still held at shutdown, or `None` if it was lost.
async fn supervise(
    spec: Arc<ClusterSpec>,
    (coord, client): (ConsulClient, ConsulClient),
    clock: Arc<dyn Clock>,
    mut held: Claim,
    (gate, bound): (Arc<IssueGate>, Option<Arc<dyn SessionBound>>),
    (registration, registration_changed): (Arc<ArcSwap<Registration>>, Arc<Notify>),
    mut stopped: watch::Receiver<bool>,
) -> Option<Claim> {
    loop {
        let lock = Arc::clone(&held.lock);
        let kept = tokio::select! {
            kept = lock.keep_alive(wait_stop(stopped.clone())) => kept,
            // The store refused a mark write: another session holds the id.
            () = held.keeper.lock_lost() => false,
            never = report_renew_age(&lock) => match never {},
        };
        if kept {
            return Some(held);
        }
        // Fence first, then everything else.
        gate.fence();
        let last_ms = held.keeper.abort();
        metrics::gauge!(m::FENCED).set(1.0);
        metrics::counter!(m::FENCINGS).increment(1);
        tracing::error!(
            worker = %lock.key(),
            last_time_ms = last_ms,
            "worker lock lost: stopped issuing (fenced, NOT_SERVING); claiming a worker id again"
        );
        metrics::gauge!(m::WORKER_ID, "datacenter" => spec.datacenter.to_string()).set(-1.0);
        let seen = held.layout_generation;
        name_layout_change(&spec, &coord, seen, &gate).await;
        // Hand the id back (release the lock, destroy the session) as soon
        // as Consul answers, instead of leaving it locked for up to 2 x TTL
        // + lock-delay; otherwise every partition would use up another id.
        // Safe: nothing more is issued or written with it.
        // Claiming waits for the hand-back, so the node comes back on its
        // own id; but never longer than the old session can live anyway.
        held = reclaim(&spec, &coord, &clock, (lock, seen, &gate), &mut stopped).await?;
        // Checked against the deadline just above, with no await since.
        held.lock.on_renew(deadline_hook(&gate));
        if let Some(bound) = &bound {
            if let Err(e) = bound.moved(held.lock.session(), &held.owner) {
                tracing::error!(error = %e, "cannot move what the session holds (lease tokens) to the new session");
            }
        }
        gate.install(Arc::clone(held.keeper.generator()));
        let key = held.lock.key();
        record_claim(key, true);
        if registration.load().worker() != key {
            match registration_for(&spec, &client, key) {
                Ok(r) => {
                    // The registrar task sends it; nothing here waits on it.
                    registration.store(Arc::new(r));
                    registration_changed.notify_one();
                }
                Err(e) => tracing::error!(error = %e, "cannot build the service registration"),
            }
        }
    }
}

/// After a loss: hands the lost id back as soon as Consul answers, then
/// claims again with backoff (every claim waits for the hand-back, but
/// never longer than the old session can live). `None`: stopped first.
async fn reclaim(
    spec: &ClusterSpec,
    coord: &ConsulClient,
    clock: &Arc<dyn Clock>,
    (lock, seen, gate): (Arc<WorkerLock>, u64, &IssueGate),
    stopped: &mut watch::Receiver<bool>,
) -> Option<Claim> {
    let lock_ends = lock.last_renewed() + 2 * spec.config.lock.ttl + spec.config.lock.lock_delay;
    let mut lost = Some(lock);
    let mut pause = RECLAIM_BACKOFF_MIN;
    loop {
        if *stopped.borrow() {
            if let Some(old) = &lost {
                // Shutting down while fenced: one last bounded try, so
                // a restart does not wait out the old session.
                let limit = spec.config.lock.ttl / 3;
                let _ = tokio::time::timeout(limit, old.hand_back()).await;
            }
            return None;
        }
        if let Some(old) = &lost {
            metrics::gauge!(m::SESSION_RENEW_AGE).set(old.last_renewed().elapsed().as_secs_f64());
            let limit = spec.config.lock.ttl / 3;
            match tokio::time::timeout(limit, old.hand_back()).await {
                Ok(Ok(())) => {
                    tracing::info!(worker = %old.key(), "lost worker id handed back to Consul");
                    lost = None;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "cannot hand the lost worker id back yet")
                }
                Err(_) => tracing::debug!("cannot hand the lost worker id back yet: timed out"),
            }
        }
        if lost.is_none() || Instant::now() >= lock_ends {
            match claim(spec, coord, clock).await {
                Ok(new) if Instant::now() < new.lock.deadline() => return Some(new),
                Ok(late) => {
                    // Too slow to be safe: the lock ran out while starting.
                    late.keeper.abort();
                    let _ = late.lock.release().await;
                    tracing::warn!("claimed a worker id too slowly to use it; trying again");
                }
                Err(JoinError::Node(Error::ClusterLayout(
                    e @ (ClusterLayoutError::Mismatch { .. }
                    | ClusterLayoutError::Changing { .. }
                    | ClusterLayoutError::InPrimary { .. }),
                ))) => {
                    // This datacenter's record names the change, else the
                    // refusal itself does (the primary's record, rule 45).
                    let reason = e.to_string();
                    if !name_layout_change(spec, coord, seen, gate).await
                        && gate.fence_reason().as_deref() != Some(&reason)
                    {
                        tracing::error!(
                            error = %e,
                            "the cluster's layout was changed: this node stays fenced; restart it with the cluster's [layout]"
                        );
                        gate.set_fence_reason(reason);
                    }
                }
                Err(JoinError::Datacenter(e)) => {
                    // Rule 39: the refusals name the owner and the fix.
                    let reason = e.to_string();
                    if gate.fence_reason().as_deref() != Some(&reason) {
                        tracing::error!(reason = %reason, "fenced: the datacenter id is not this Consul datacenter's");
                        gate.set_fence_reason(reason);
                    }
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    retry_in_ms = pause.as_millis() as u64,
                    "cannot claim a worker id yet"
                ),
            }
        }
        tokio::select! {
            _ = stopped.changed() => {}
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(spec.config.reclaim_backoff_max);
    }
}

/// After a fence: reads the layout record and, when an operator changed
/// the layout away from this node's (the record is no longer generation
/// `seen` and holds another layout), names that change as the fence's
/// reason, logged once. The node is fenced already; this changes only what
/// its refusals say. Bounded: a Consul that does not answer leaves the
/// lock-lost refusal. Returns whether a layout change is the reason.
async fn name_layout_change(
    spec: &ClusterSpec,
    client: &ConsulClient,
    seen: u64,
    gate: &IssueGate,
) -> bool {
    let read = tokio::time::timeout(
        spec.config.lock.ttl / 3,
        read_layout(client, &spec.config.keys),
    )
    .await;
    let Ok(Ok(Some((record, _)))) = read else {
        return false;
    };
    let mine = RecordedLayout::of(&spec.layout, &spec.layout_preset).with_hide(&spec.layout_hide);
    let Some(reason) = fence_reason(&record, &mine, seen) else {
        return false;
    };
    if gate.fence_reason().as_deref() != Some(&reason) {
        tracing::error!(reason = %reason, "fenced: the cluster layout changed");
        gate.set_fence_reason(reason);
    }
    true
}

/// Copies each new lock deadline to the issue gate's cheap check.
fn deadline_hook(gate: &Arc<IssueGate>) -> DeadlineHook {
    let gate = Arc::clone(gate);
    Arc::new(move |at| gate.set_deadline(at))
}

async fn wait_stop(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

/// Publishes the age of the last successful renew once a second; never
/// returns.
async fn report_renew_age(lock: &WorkerLock) -> std::convert::Infallible {
    let mut t = tokio::time::interval(Duration::from_secs(1));
    loop {
        t.tick().await;
        metrics::gauge!(m::SESSION_RENEW_AGE).set(lock.last_renewed().elapsed().as_secs_f64());
    }
}
