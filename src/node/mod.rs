//! The node: what assembles the mode engines, their stores and the
//! cluster membership into one process, and runs it.
//!
//! [`Node::start`] opens the store and reserves the high-water mark before
//! anything listens; [`Node::serve`] (`lifecycle.rs`) takes already-bound
//! listeners and a shutdown future (tests bind `127.0.0.1:0`), and on
//! shutdown reports NOT_SERVING, stops accepting, drains in-flight calls,
//! then stores the final high-water mark.
//!
//! - `stores.rs`: [`ModeStores`], opened for the embedded store or Consul;
//! - `issuer.rs`: the [`Issuer`] over every enabled mode's engine, and
//!   the format catalog;
//! - `cluster.rs`: what a Consul node joins with;
//! - `session_bound.rs`: what lives under the worker lock's session;
//! - `lifecycle.rs`: serving, and shutdown in order;
//! - `status.rs`: the issue rate, and on Consul this node's status record
//!   every node's console shows;
//! - [`renewal`]: the thread that keeps marks and the worker lock alive;
//! - [`shutdown`]: SIGTERM/SIGINT; [`systemd`]: readiness, stopping and
//!   watchdog notices.

mod cluster;
mod issuer;
mod lifecycle;
pub mod renewal;
mod session_bound;
pub mod shutdown;
mod status;
mod stores;
pub mod systemd;

use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::cluster::membership::{JoinError, Membership, SessionBound};
use crate::config::{Backend, ClusterConfig, Config};
use crate::error::Error;
use crate::id::lease::ZoneRecord;
use crate::id::Clock;
use crate::metrics as m;
/// Reads the config file's `[[formats]]` again (for SIGHUP reloads).
pub use crate::modes::format_catalog::ConfigSource as FormatConfigSource;
use crate::modes::format_catalog::FormatCatalog;
pub use crate::modes::{decode_snowflake, Decoded, Issuer};
use crate::server::tls;
use crate::store::format::tokens::{ConsulFormatTokens, FormatTokens};
use crate::store::lease::{declare_consul_zone, ConsulLeaseTokens, LeaseTokenStore};
use crate::store::snapshot::SnapshotSource;
use crate::store::state_file::{PeriodicThread, StateFileWatch};
use crate::store::strict::ConsulStrictStore;
use crate::store::{ConsulSegmentStore, HwmStore, SegmentStore, WorkerKey};

use self::cluster::cluster_spec;
pub(crate) use self::cluster::instance_id;
use self::issuer::build_issuer;
use self::renewal::RenewalThread;
use self::session_bound::session_held;
pub use self::stores::ModeStores;
use self::stores::{open_embedded, strict_limits, Embedded};

/// Every series starts at zero so alerts and `rate()` work before the
/// first event.
fn register_series(config: &Config, backend: &'static str) {
    m::register(m::Series {
        backend,
        segment: config.segment.is_some(),
        lease: config.lease.is_some(),
        strict: config.strict.is_some(),
        // Formats can be created through the admin API at any time.
        formatted: true,
    });
}

/// Why a node could not start; nothing was issued.
#[derive(Debug, thiserror::Error)]
pub enum NodeStartError {
    /// It could not join the cluster (no worker id free, Consul or the
    /// cluster's layout refused, the clock behind the stored mark).
    #[error(transparent)]
    Join(#[from] JoinError),
    /// The store, a mode or the process set-up failed.
    #[error(transparent)]
    Node(#[from] Error),
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

/// A node that has claimed its place and reserved its high-water mark.
pub struct Node {
    config: Config,
    clock: Arc<dyn Clock>,
    issuer: Arc<Issuer>,
    membership: Membership,
    /// What lives under the worker lock's session (lease tokens).
    bound: Option<Arc<dyn SessionBound>>,
    metrics: PrometheusHandle,
    admin_segments: Option<Arc<dyn SegmentStore>>,
    /// Stored format definitions and the reloads of the served table.
    formats: Option<Arc<FormatCatalog>>,
    /// Where mark and lease renewals run; dropped last.
    renewal: RenewalThread,
    /// Checks the embedded state file on its own thread while serving.
    state_watch: Option<StateFileWatch>,
    /// Snapshots of the embedded state file, for the admin `Backup`.
    snapshots: Option<SnapshotSource>,
    /// Samples the counters for the rates a backup records.
    rate_sampling: Option<PeriodicThread>,
    /// The hide key rings hidden namespaces issue and decode with.
    hide_keys: crate::modes::hide_keys::HideKeyRings,
}

fn start_renewal() -> Result<RenewalThread, Error> {
    RenewalThread::start()
        .map_err(|e| Error::Setup(format!("cannot start the renewal thread: {e}")))
}

impl Node {
    /// Opens the state store (or claims a worker id in Consul) and starts
    /// the generator above the stored high-water mark. Fails, and issues
    /// nothing, if the state file is missing or made for another layout,
    /// Consul cannot be reached or refuses, no worker id is free, or the
    /// clock is too far behind the stored mark.
    pub async fn start(config: Config, clock: Arc<dyn Clock>) -> Result<Self, NodeStartError> {
        let metrics = m::install().map_err(Error::Setup)?;
        // A wrong certificate or key stops the node before it claims
        // anything.
        if let Some(settings) = &config.server.tls {
            tls::Identity::load(settings).map_err(|e| Error::Setup(e.to_string()))?;
        }
        match &config.store.backend {
            Backend::Consul(cluster) => {
                let cluster = (**cluster).clone();
                Self::start_consul(config, cluster, clock, metrics).await
            }
            Backend::Embedded {
                path,
                init_if_missing,
                ..
            } => {
                let file = (path.clone(), *init_if_missing);
                Ok(Self::start_embedded(config, file, clock, metrics).await?)
            }
        }
    }

    async fn start_consul(
        config: Config,
        cluster: ClusterConfig,
        clock: Arc<dyn Clock>,
        metrics: PrometheusHandle,
    ) -> Result<Self, NodeStartError> {
        let (spec, keys) = cluster_spec(&config, cluster)?;
        register_series(&config, "consul");
        let renewal = start_renewal()?;
        let membership =
            Membership::join_consul(spec, Arc::clone(&clock), renewal.handle()).await?;
        let Membership::Consul(claimed) = &membership else {
            return Err(Error::Setup("a Consul member without a claim".into()).into());
        };
        let client = claimed.client().clone();
        let format_tokens = {
            let (session, owner) = claimed.session();
            Arc::new(ConsulFormatTokens::new(
                client.clone(),
                keys.clone(),
                session,
                owner,
            ))
        };
        let lease = consul_lease_source(&config, claimed, &client, &keys).await?;
        let stores = ModeStores {
            segment: Some(Arc::new(ConsulSegmentStore::new(
                client.clone(),
                keys.clone(),
            ))),
            lease,
            strict: Some(Arc::new(ConsulStrictStore::with_limits(
                client.clone(),
                keys.clone(),
                strict_limits(&config),
            ))),
            format: Some(Arc::new(
                crate::store::format::counters::ConsulFormatCounterStore::new(
                    client.clone(),
                    keys.clone(),
                ),
            )),
            format_defs: Some(Arc::new(
                crate::store::format::catalog::ConsulFormatCatalogStore::new(
                    client.clone(),
                    keys.clone(),
                ),
            )),
            format_tokens: Some(Arc::clone(&format_tokens) as Arc<dyn FormatTokens>),
            state_file: None,
            store_health: None,
            hide_keys: Some(
                stores::hide_key_rings(
                    &config,
                    Arc::new(crate::store::hide_keys::ConsulHideKeyRecords::new(
                        client.clone(),
                        keys.clone(),
                    )),
                )
                .await?,
            ),
        };
        let zone = config.lease.as_ref().map(|l| (l.zone, l.max_token()));
        let deadline = membership.deadline();
        let mut node = Self::assemble(config, clock, membership, stores, (metrics, renewal))?;
        node.bound = session_held(&node.issuer, zone, (client, keys), format_tokens);
        if let Some(deadline) = deadline {
            // Until the supervisor takes over, the claim's own deadline.
            node.issuer.set_lock_deadline(deadline);
        }
        Ok(node.prime().await?)
    }

    async fn start_embedded(
        config: Config,
        (path, init): (std::path::PathBuf, bool),
        clock: Arc<dyn Clock>,
        metrics: PrometheusHandle,
    ) -> Result<Self, Error> {
        let Embedded {
            store,
            stores,
            guard,
            snapshots,
        } = open_embedded(&config, &path, init, Arc::clone(&clock)).await?;
        let interval = (config.hwm.renew_interval / 2).min(std::time::Duration::from_millis(100));
        let key = WorkerKey {
            datacenter: config.node.datacenter_id,
            worker: config.node.worker_id,
        };
        let store: Arc<dyn HwmStore> = Arc::new(store);
        register_series(&config, store.backend());
        // Started on the renewal thread, so its renewal task lives there.
        let renewal = start_renewal()?;
        let (layout, hwm) = (config.generator_layout(), config.hwm);
        let membership = Membership::join_static(
            store,
            key,
            layout,
            Arc::clone(&clock),
            hwm,
            renewal.handle(),
        )
        .await?;
        let mut node = Self::assemble(config, clock, membership, stores, (metrics, renewal))?;
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

    /// The hide key rings hidden namespaces issue and decode with.
    pub fn hide_keys(&self) -> &crate::modes::hide_keys::HideKeyRings {
        &self.hide_keys
    }

    /// Reserves what the enabled modes need before serving (the first
    /// lease block), so a store that cannot deliver fails start-up loudly.
    async fn prime(self) -> Result<Self, Error> {
        if let Some(leases) = self.issuer.leases() {
            leases.prime().await?;
            tracing::info!(token = leases.token(), "lease mode enabled");
        }
        if let Some(catalog) = &self.formats {
            let served = catalog
                .start()
                .await
                .map_err(|e| Error::Setup(format!("formatted mode: {e}")))?;
            tracing::info!(formats = ?served.formats, "formatted mode enabled");
            self.warn_one_node_formats(&served.formats);
        }
        if let Some(formats) = self.issuer.formats() {
            formats.prime_tokens().await?;
        }
        Ok(self)
    }

    /// On the embedded store, names the served formats whose counter is
    /// cluster-wide: like segment and strict, they serve one node only.
    fn warn_one_node_formats(&self, served: &[String]) {
        if self.config.store.state_path().is_none() {
            return;
        }
        let Some(formats) = self.issuer.formats() else {
            return;
        };
        let cluster_wide: Vec<String> = served
            .iter()
            .filter(|name| {
                formats
                    .get(name)
                    .is_ok_and(|f| f.scope() == crate::id::format::Scope::Cluster)
            })
            .cloned()
            .collect();
        if !cluster_wide.is_empty() {
            tracing::warn!(
                formats = ?cluster_wide,
                "{}",
                crate::store::format::counters::one_node_formats_warning(&cluster_wide)
            );
        }
    }

    /// The stored format definitions and their reloads.
    pub fn format_catalog(&self) -> Option<&Arc<FormatCatalog>> {
        self.formats.as_ref()
    }

    /// SIGHUP reads the config file's `[[formats]]` again through
    /// `reread` (nothing to do when formatted mode has no catalog).
    pub fn reread_formats_with(&self, reread: FormatConfigSource) {
        if let Some(catalog) = &self.formats {
            catalog.set_config_source(reread);
        }
    }

    fn assemble(
        config: Config,
        clock: Arc<dyn Clock>,
        membership: Membership,
        stores: ModeStores,
        (metrics, renewal): (PrometheusHandle, RenewalThread),
    ) -> Result<Self, Error> {
        // Until the monitor's first tick: not yet serving, and the lead
        // the generator starts with.
        let generator = membership.generator();
        metrics::gauge!(m::SERVING).set(0.0);
        metrics::gauge!(m::HWM_LEAD)
            .set((generator.hwm_ms() as f64 - clock.now_millis() as f64) / 1000.0);
        let admin_segments = if config.segment.is_some() {
            stores.segment.clone()
        } else {
            None
        };
        let hide_keys = stores
            .hide_keys
            .clone()
            .ok_or_else(|| Error::Setup("the backend opened no hide key store".into()))?;
        let (issuer, formats) = build_issuer(&config, &clock, generator, stores)?;
        metrics::gauge!(m::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "layout" => config.layout.to_string())
            .set(1.0);
        metrics::gauge!(m::LAYOUT_WORKER_IDS)
            .set(2f64.powi(i32::from(config.layout.spec().worker_bits)));
        metrics::gauge!(m::LAYOUT_TIME_LEFT).set(m::layout_time_left_seconds(
            &config.generator_layout(),
            clock.now_millis(),
        ));
        Ok(Self {
            config,
            clock,
            issuer: Arc::new(issuer),
            membership,
            bound: None,
            metrics,
            admin_segments,
            formats,
            renewal,
            state_watch: None,
            snapshots: None,
            rate_sampling: None,
            hide_keys,
        })
    }

    /// The issuer, for in-process callers.
    pub fn issuer(&self) -> &Arc<Issuer> {
        &self.issuer
    }
}

/// Lease mode's token source on Consul, after the zone's setting is
/// declared (recorded, or checked against the record): tokens of the zone
/// up to its largest (lower for a hidden zone), under the claim's session.
async fn consul_lease_source(
    config: &Config,
    claimed: &crate::cluster::supervisor::Cluster,
    client: &crate::consul::ConsulClient,
    keys: &crate::store::kv_paths::ClusterPaths,
) -> Result<Option<Arc<dyn LeaseTokenStore>>, Error> {
    Ok(match &config.lease {
        Some(l) => {
            let record = ZoneRecord {
                hide: l.hide.clone(),
            };
            declare_consul_zone(client, keys, l.zone, &record)
                .await
                .map_err(Error::from)?;
            let (session, owner) = claimed.session();
            Some(Arc::new(
                ConsulLeaseTokens::new(
                    client.clone(),
                    keys.clone(),
                    l.zone,
                    session.to_owned(),
                    owner.clone(),
                )
                .map_err(Error::from)?
                .with_max_token(l.max_token()),
            ))
        }
        None => None,
    })
}
