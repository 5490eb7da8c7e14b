//! The running node: gRPC and HTTP front ends over one generator, with
//! start-up and shutdown in the order the safety rules need.
//!
//! [`Node::start`] opens the store and reserves the high-water mark before
//! anything listens; [`Node::serve`] takes already-bound listeners and a
//! shutdown future (tests bind `127.0.0.1:0`), and on shutdown reports
//! NOT_SERVING, stops accepting, drains in-flight calls, then stores the
//! final high-water mark.

pub mod admin;
pub mod cluster;
pub mod grpc;
pub mod http;
pub mod issuer;
pub mod lease;
pub mod listener;
pub mod monitor;
pub mod registration;
pub mod renewal;
pub mod request_size;
pub mod segments;
pub mod status;
pub mod strict;
pub mod ticker;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use crate::config::{Backend, Config};
use crate::error::Error;
use crate::id::Clock;
use crate::metrics as m;
use crate::proto;
use crate::store::hwm::{HwmSettings, KeeperHandle};
use crate::store::lease::{EmbeddedTokens, TokenSource};
use crate::store::reopen::StoreHealth;
use crate::store::snapshot::SnapshotSource;
use crate::store::state_file::{PeriodicThread, StateFileGuard, StateFileWatch};
use crate::store::strict::{ConsulStrictStore, EmbeddedStrictStore, StrictStore};
use crate::store::{EmbeddedStore, HwmKeeper, SegmentStore, StateStore, WorkerKey};

pub use issuer::{decode_snowflake, Decoded, Issuer};
use renewal::RenewalThread;

/// The backing while serving.
enum Running {
    Embedded(KeeperHandle),
    Cluster(cluster::RunningCluster),
}

/// The strict-mode limits of `config` (none when strict mode is off: the
/// store is then only reached by tools).
fn strict_limits(config: &Config) -> crate::store::strict::StrictLimits {
    config
        .strict
        .as_ref()
        .map_or(crate::store::strict::StrictLimits::NONE, |s| {
            crate::store::strict::StrictLimits {
                max_keys_per_namespace: s.max_keys_per_namespace,
                max_namespaces: s.max_namespaces,
            }
        })
}

fn hwm_settings(config: &Config) -> HwmSettings {
    HwmSettings {
        reserve: config.hwm_reserve,
        renew_interval: config.hwm_renew_interval,
        max_startup_skew: config.max_startup_skew,
        max_backward: config.max_backward,
    }
}

/// Counters start at zero so `rate()` works before the first event.
fn zero_counters(backend: &'static str) {
    for kind in ["tolerated", "refused"] {
        metrics::counter!(m::CLOCK_STEP_BACK_EVENTS, "kind" => kind).increment(0);
    }
    metrics::counter!(m::STORE_ERRORS, "backend" => backend, "op" => "store_hwm").increment(0);
    metrics::counter!(m::SEQUENCE_EXHAUSTED_WAITS).increment(0);
}

/// Why serving stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A listener or the transport failed.
    #[error("{0}")]
    Transport(String),
    /// The final high-water mark could not be stored.
    #[error("could not store the final high-water mark")]
    FinalHwm(#[from] crate::store::StoreError),
}

/// What a clean shutdown did.
#[derive(Debug, Clone, Copy)]
pub struct ShutdownReport {
    /// The final high-water mark stored (Unix ms); `None` if the node was
    /// fenced at shutdown and had no worker id to store it for.
    pub final_hwm_ms: Option<u64>,
    /// Whether every in-flight call finished within the grace period.
    pub drained: bool,
}

/// The stores of the modes besides snowflake; each enabled mode needs its
/// own.
#[derive(Default)]
pub struct ModeStores {
    /// Segment records.
    pub segment: Option<Arc<dyn SegmentStore>>,
    /// Lease tokens and their counters.
    pub lease: Option<Arc<dyn TokenSource>>,
    /// Strict counters.
    pub strict: Option<Arc<dyn StrictStore>>,
    /// The embedded state file's guard: once it sees the file deleted or
    /// replaced, every mode refuses to issue.
    pub state_file: Option<Arc<StateFileGuard>>,
    /// The embedded store's write health: a write error fails readiness
    /// until the file is reopened, and liveness past `store.max_unhealthy`.
    pub store_health: Option<Arc<StoreHealth>>,
}

/// What keeps the generator's worker id and high-water mark.
enum Backing {
    /// The embedded state file; the worker id comes from config.
    Embedded(KeeperHandle),
    /// Consul: a claimed worker id, supervised once serving.
    Cluster(Box<cluster::Cluster>),
}

/// A node that has claimed its place and reserved its high-water mark.
pub struct Node {
    config: Config,
    clock: Arc<dyn Clock>,
    issuer: Arc<Issuer>,
    backing: Backing,
    metrics: PrometheusHandle,
    admin_segments: Option<Arc<dyn SegmentStore>>,
    /// Where mark and lease renewals run; dropped last.
    renewal: RenewalThread,
    /// Checks the embedded state file on its own thread while serving.
    state_watch: Option<StateFileWatch>,
    /// Snapshots of the embedded state file, for the admin `Backup`.
    snapshots: Option<SnapshotSource>,
    /// Samples the counters for the rates a backup records.
    rate_sampling: Option<PeriodicThread>,
}

fn start_renewal() -> Result<RenewalThread, Error> {
    RenewalThread::start()
        .map_err(|e| Error::Setup(format!("cannot start the renewal thread: {e}")))
}

/// The stable instance name: configured, or `<hostname>-<port>`.
fn instance_id(config: &Config, advertise: SocketAddr) -> String {
    if let Some(id) = &config.instance_id {
        return id.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| {
            h.trim()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .take(50)
                .collect::<String>()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "idgen".into());
    format!("{host}-{}", advertise.port())
}

impl Node {
    /// Opens the state store (or claims a worker id in Consul) and starts
    /// the generator above the stored high-water mark. Fails, and issues
    /// nothing, if the state file is missing or made for another layout,
    /// Consul cannot be reached or refuses, no worker id is free, or the
    /// clock is too far behind the stored mark.
    pub async fn start(config: Config, clock: Arc<dyn Clock>) -> Result<Self, Error> {
        let metrics = m::install().map_err(Error::Setup)?;
        if let Backend::Consul(cluster_config) = &config.backend {
            let advertise = config.advertise.unwrap_or(config.grpc_listen);
            if advertise.ip().is_unspecified() || advertise.port() == 0 {
                return Err(Error::Setup(format!(
                    "cannot advertise {advertise} in Consul: clients cannot dial it; set node.advertise to this node's IP:port"
                )));
            }
            let spec = cluster::ClusterSpec {
                config: (**cluster_config).clone(),
                datacenter: config.datacenter_id,
                worker_id: config.worker_id,
                layout: config.layout,
                layout_preset: config.layout_preset.clone(),
                hwm: hwm_settings(&config),
                instance: instance_id(&config, advertise),
                advertise,
                lease_zone: config.lease.as_ref().map(|l| l.zone),
                // Port 0 (bound later, in tests) is not advertised.
                metrics_port: Some(config.http_listen.port()).filter(|p| *p != 0),
            };
            zero_counters("consul");
            let renewal = start_renewal()?;
            let cluster = cluster::Cluster::start(spec, Arc::clone(&clock), &renewal).await?;
            let generator = Arc::clone(cluster.generator());
            let (client, keys) = (cluster.client().clone(), cluster_config.keys.clone());
            let lease: Option<Arc<dyn TokenSource>> = match &config.lease {
                Some(l) => Some(Arc::new(cluster.tokens(l.zone)?)),
                None => None,
            };
            let stores = ModeStores {
                segment: Some(Arc::new(crate::store::ConsulSegmentStore::new(
                    client.clone(),
                    keys.clone(),
                ))),
                lease,
                strict: Some(Arc::new(ConsulStrictStore::with_limits(
                    client,
                    keys,
                    strict_limits(&config),
                ))),
                state_file: None,
                store_health: None,
            };
            let deadline = cluster.lease_deadline();
            let node = Self::assemble(
                config,
                clock,
                generator,
                Backing::Cluster(Box::new(cluster)),
                stores,
                (metrics, renewal),
            )?;
            // Until the supervisor takes over, the claim's own deadline.
            node.issuer.set_lease_deadline(deadline);
            return node.prime().await;
        }
        let layout_desc = config.layout.to_string();
        let path = config.state_path.clone();
        let init = config.init_if_missing;
        let store =
            tokio::task::spawn_blocking(move || EmbeddedStore::open(&path, &layout_desc, init))
                .await
                .map_err(|e| Error::Setup(format!("store open task: {e}")))??;
        let lease: Option<Arc<dyn TokenSource>> = match &config.lease {
            Some(l) => {
                // Validated config: the range exists and holds the token.
                let spec = config.layout.spec();
                let range = crate::id::lease::node_token_range(
                    config.datacenter_id,
                    config.worker_id,
                    spec.datacenter_bits,
                    spec.worker_bits,
                )
                .ok_or_else(|| {
                    Error::Setup("lease mode: this layout leaves no token range per node".into())
                })?;
                let first = l.token.unwrap_or(range.0);
                tracing::info!(
                    zone = l.zone,
                    first_token = range.0,
                    last_token = range.1,
                    "lease mode (embedded): this node uses only its own token range, derived from its datacenter and worker id"
                );
                Some(Arc::new(EmbeddedTokens::new(
                    store.clone(),
                    l.zone,
                    first,
                    range,
                )?))
            }
            None => None,
        };
        if config.segment.is_some() || config.strict.is_some() {
            tracing::warn!(
                path = %config.state_path.display(),
                "segment and strict modes on the embedded store serve this one node only: another node with its own state file would hand out the same segment IDs and strict values; for several nodes use store.backend = \"consul\""
            );
        }
        let guard = Arc::clone(store.guard());
        let stores = ModeStores {
            segment: Some(Arc::new(store.clone())),
            lease,
            strict: Some(Arc::new(EmbeddedStrictStore::with_limits(
                store.clone(),
                strict_limits(&config),
            ))),
            state_file: Some(Arc::clone(&guard)),
            store_health: Some(Arc::clone(store.health())),
        };
        let interval = (config.hwm_renew_interval / 2).min(std::time::Duration::from_millis(100));
        let snapshots = SnapshotSource::new(
            store.clone(),
            config.lease.as_ref().map_or(0, |l| l.block),
            config.segment.as_ref().map_or(0, |s| s.max_step),
        );
        let mut node =
            Self::start_with_store(config, clock, Arc::new(store), stores, metrics).await?;
        let issuer = Arc::clone(&node.issuer);
        node.state_watch = Some(
            StateFileWatch::start(guard, interval, move || issuer.halt_state_file_lost()).map_err(
                |e| Error::Setup(format!("cannot start the state file watch thread: {e}")),
            )?,
        );
        node.rate_sampling = Some(
            snapshots
                .start_sampling(Arc::clone(&node.clock))
                .map_err(|e| Error::Setup(format!("cannot start the rate sampling thread: {e}")))?,
        );
        node.snapshots = Some(snapshots);
        node.prime().await
    }

    /// Reserves what the enabled modes need before serving (the first
    /// lease block), so a store that cannot deliver fails start-up loudly.
    async fn prime(self) -> Result<Self, Error> {
        if let Some(leases) = self.issuer.leases() {
            leases.prime().await?;
            tracing::info!(token = leases.token(), "lease mode enabled");
        }
        Ok(self)
    }

    /// Like [`Node::start`] with stores supplied by the caller (each
    /// enabled mode needs its store in `stores`).
    pub async fn start_with_store(
        config: Config,
        clock: Arc<dyn Clock>,
        store: Arc<dyn StateStore>,
        stores: ModeStores,
        metrics: PrometheusHandle,
    ) -> Result<Self, Error> {
        let key = WorkerKey {
            datacenter: config.datacenter_id,
            worker: config.worker_id,
        };
        zero_counters(store.backend());
        // Started on the renewal thread, so its renewal task lives there.
        let renewal = start_renewal()?;
        let (layout, start_clock, settings) =
            (config.layout, Arc::clone(&clock), hwm_settings(&config));
        let (generator, keeper) = renewal
            .run(async move { HwmKeeper::start(store, key, layout, start_clock, settings).await })
            .await??;
        metrics::gauge!(m::WORKER_ID, "datacenter" => key.datacenter.to_string())
            .set(key.worker as f64);
        Self::assemble(
            config,
            clock,
            generator,
            Backing::Embedded(keeper),
            stores,
            (metrics, renewal),
        )
    }

    fn assemble(
        config: Config,
        clock: Arc<dyn Clock>,
        generator: Arc<crate::id::Snowflake>,
        backing: Backing,
        stores: ModeStores,
        (metrics, renewal): (PrometheusHandle, RenewalThread),
    ) -> Result<Self, Error> {
        let admin_segments = if config.segment.is_some() {
            stores.segment.clone()
        } else {
            None
        };
        let mut issuer = Issuer::new(
            generator,
            Arc::clone(&clock),
            config.max_batch,
            config.max_wait,
        )
        .map_err(|e| Error::Setup(format!("cannot start the ticker thread: {e}")))?;
        if let Some(s) = &config.segment {
            let store = stores.segment.ok_or_else(|| {
                Error::Setup("segment mode is enabled but no segment store was given".into())
            })?;
            let settings = segments::SegmentSettings {
                auto_create: s.auto_create,
                default_step: s.default_step,
                max_step: s.max_step,
                max_wait: config.max_wait,
                max_tags: s.max_tags,
                idle_release: s.idle_release,
            };
            let segments = Arc::new(segments::Segments::new(store, Arc::clone(&clock), settings));
            segments.spawn_idle_sweeper();
            issuer = issuer.with_segments(segments);
            tracing::info!(auto_create = s.auto_create, "segment mode enabled");
        }
        if let Some(l) = &config.lease {
            let source = stores.lease.ok_or_else(|| {
                Error::Setup("lease mode is enabled but no token source was given".into())
            })?;
            let settings = lease::LeaseSettings {
                block: l.block,
                max_wait: config.max_wait,
            };
            issuer = issuer.with_leases(Arc::new(lease::Leases::new(source, settings)));
        }
        if let Some(guard) = stores.state_file {
            issuer = issuer.with_state_file(guard);
        }
        if let Some(health) = stores.store_health {
            issuer = issuer.with_store_health(health);
        }
        if let Some(s) = &config.strict {
            let store = stores.strict.ok_or_else(|| {
                Error::Setup("strict mode is enabled but no strict store was given".into())
            })?;
            issuer = issuer.with_strict(Arc::new(strict::Strict::with_limits(
                store,
                s.default_step,
                strict_limits(&config),
            )));
            tracing::info!(default_step = s.default_step, "strict mode enabled");
        }
        metrics::gauge!(m::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "layout" => config.layout.to_string())
            .set(1.0);
        metrics::gauge!(m::LAYOUT_YEARS_LEFT).set(config.layout.years_left(clock.now_millis()));
        Ok(Self {
            config,
            clock,
            issuer: Arc::new(issuer),
            backing,
            metrics,
            admin_segments,
            renewal,
            state_watch: None,
            snapshots: None,
            rate_sampling: None,
        })
    }

    /// The issuer, for in-process callers.
    pub fn issuer(&self) -> &Arc<Issuer> {
        &self.issuer
    }

    /// Serves gRPC on `grpc` and HTTP on `http` until `shutdown` completes,
    /// then shuts down in order and returns what it stored.
    pub async fn serve(
        self,
        grpc: TcpListener,
        http: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<ShutdownReport, ServeError> {
        let Node {
            config,
            clock,
            issuer,
            backing,
            metrics,
            admin_segments,
            renewal,
            state_watch,
            snapshots,
            rate_sampling,
        } = self;
        let (reporter, health_service) = tonic_health::server::health_reporter();
        let state = monitor::ServingState::new(reporter);
        let monitor_stop = Arc::new(Notify::new());
        let monitor_task = tokio::spawn(monitor::run(
            Arc::clone(&issuer),
            Arc::clone(&clock),
            state.clone(),
            Arc::clone(&monitor_stop),
            config.max_unhealthy,
        ));

        // Reflection v1, and v1alpha for older tools (grpcurl before 1.8.8,
        // Python's grpcio-reflection, older Postman and Evans).
        let reflection_builder = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let reflection = reflection_builder()
            .build_v1()
            .map_err(|e| ServeError::Transport(format!("reflection: {e}")))?;
        let reflection_v1alpha = reflection_builder()
            .build_v1alpha()
            .map_err(|e| ServeError::Transport(format!("reflection v1alpha: {e}")))?;
        let max_request = config.max_request_size;
        let idgen =
            proto::id_gen_server::IdGenServer::new(grpc::IdGenService::new(Arc::clone(&issuer)))
                .max_decoding_message_size(max_request);

        let admin_cluster = match (&backing, &config.backend) {
            (Backing::Cluster(c), Backend::Consul(cc)) => {
                Some((c.client().clone(), cc.keys.clone()))
            }
            _ => None,
        };
        let admin_worker = match &backing {
            Backing::Embedded(keeper) => keeper.key(),
            Backing::Cluster(c) => c.key(),
        };
        let advertise = config.advertise.unwrap_or(config.grpc_listen);
        let admin = admin::service(admin::AdminDeps {
            token: config.admin_token.clone(),
            segments: admin_segments,
            strict: issuer.strict().cloned(),
            segment_server: issuer.segment_server().cloned(),
            cluster: admin_cluster,
            node: admin::NodeFacts {
                instance: instance_id(&config, advertise),
                address: advertise.to_string(),
                worker: admin_worker,
                lease: issuer.leases().cloned(),
                lease_zone: config.lease.as_ref().map(|l| l.zone),
            },
            clock: Arc::clone(&clock),
            snapshots,
        })
        .max_decoding_message_size(max_request);
        let (stop_tx, stop_rx) = watch::channel(false);
        let wait_stop = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let grpc_addr = grpc.local_addr().ok();
        let grpc_routes = tonic::service::Routes::new(health_service)
            .add_service(reflection)
            .add_service(reflection_v1alpha)
            .add_service(idgen)
            .add_service(admin)
            .prepare();
        let grpc_task = tokio::spawn(listener::serve(
            grpc,
            listener::Port::Grpc,
            config.connections,
            tower::Layer::layer(
                &request_size::RequestSizeLayer::new(max_request),
                grpc_routes,
            ),
            wait_stop(stop_rx.clone()),
        ));
        let http_addr = http.local_addr().ok();
        let router = http::router(http::HttpState {
            issuer: Arc::clone(&issuer),
            metrics: metrics.clone(),
            ready: Arc::clone(&state.ready),
            live: Arc::clone(&state.live),
            rpc: Arc::new(http::HttpMetrics::default()),
        });
        let http_task = tokio::spawn(listener::serve(
            http,
            listener::Port::Http,
            config.connections,
            router,
            wait_stop(stop_rx.clone()),
        ));
        let upkeep_task = {
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let mut t = tokio::time::interval(std::time::Duration::from_secs(5));
                loop {
                    t.tick().await;
                    metrics.run_upkeep();
                }
            })
        };
        let worker = match &backing {
            Backing::Embedded(keeper) => keeper.key(),
            Backing::Cluster(c) => c.key(),
        };
        let backing = match backing {
            Backing::Embedded(keeper) => Running::Embedded(keeper),
            Backing::Cluster(c) => Running::Cluster(c.run(Arc::clone(&issuer)).await),
        };
        tracing::info!(
            grpc = grpc_addr.map(tracing::field::display),
            http = http_addr.map(tracing::field::display),
            datacenter = worker.datacenter,
            worker = worker.worker,
            layout = %config.layout,
            "idgen serving"
        );

        // Run until the shutdown signal, or until a front end dies.
        let mut grpc_task = grpc_task;
        let mut http_task = http_task;
        let early = tokio::select! {
            _ = shutdown => None,
            r = &mut grpc_task => Some(format!("gRPC server stopped: {r:?}")),
            r = &mut http_task => Some(format!("HTTP server stopped: {r:?}")),
        };

        tracing::info!("shutting down: NOT_SERVING, draining in-flight calls");
        // Stop the monitor first so it cannot report SERVING after drain.
        monitor_stop.notify_one();
        let _ = monitor_task.await;
        state.drain().await;
        let _ = stop_tx.send(true);
        let grace = config.shutdown_grace;
        let drained = tokio::time::timeout(grace, async {
            if !grpc_task.is_finished() {
                let _ = (&mut grpc_task).await;
            }
            if !http_task.is_finished() {
                let _ = (&mut http_task).await;
            }
        })
        .await
        .is_ok();
        if !drained {
            tracing::warn!(grace = %humantime::format_duration(grace), "calls still in flight after the grace period; closing anyway");
            grpc_task.abort();
            http_task.abort();
        }
        upkeep_task.abort();
        // Closing the generator and storing the final mark happen together;
        // in a cluster the lock is released and the service deregistered
        // after that.
        let final_hwm_ms = match backing {
            Running::Embedded(keeper) => Some(keeper.finish().await?),
            Running::Cluster(c) => c.finish().await?,
        };
        drop(rate_sampling);
        drop(state_watch);
        // Last: nothing renews once the mark is final and the lock gone.
        drop(renewal);
        tracing::info!(final_hwm_ms, drained, "idgen stopped");
        match early {
            Some(reason) => Err(ServeError::Transport(reason)),
            None => Ok(ShutdownReport {
                final_hwm_ms,
                drained,
            }),
        }
    }
}
