//! The running node: gRPC and HTTP front ends over one generator, with
//! start-up and shutdown in the order the safety rules need.
//!
//! [`Node::start`] opens the store and reserves the high-water mark before
//! anything listens; [`Node::serve`] takes already-bound listeners and a
//! shutdown future (tests bind `127.0.0.1:0`), and on shutdown reports
//! NOT_SERVING, stops accepting, drains in-flight calls, then stores the
//! final high-water mark.

pub mod admin;
pub mod console;
pub mod grpc;
pub mod health;
pub mod http;
pub mod listener;
pub mod request_size;
mod serve;
pub mod status;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;

use crate::config::{Backend, Config};
use crate::error::Error;
use crate::id::Clock;
use crate::metrics as m;
use crate::store::format_tokens::{ConsulFormatTokens, EmbeddedFormatTokens, FormatTokens};
use crate::store::lease::{EmbeddedTokens, TokenStore};
use crate::store::reopen::StoreHealth;
use crate::store::snapshot::SnapshotSource;
use crate::store::state_file::{PeriodicThread, StateFileGuard, StateFileWatch};
use crate::store::strict::{ConsulStrictStore, EmbeddedStrictStore, StrictStore};
use crate::store::{EmbeddedStore, HwmStore, SegmentStore, WorkerKey};

use crate::cluster::membership::{IssuePath, Membership, SessionBound};
use crate::cluster::supervisor::ClusterSpec;
use crate::config::ClusterConfig;
use crate::consul::ConsulClient;
use crate::modes::format_reload::FormatCatalog;
use crate::modes::lease::{LeaseSettings, Leases};
use crate::modes::segment::{SegmentSettings, Segments};
use crate::modes::strict::Strict;
pub use crate::modes::{decode_snowflake, Decoded, Issuer};
use crate::renewal::RenewalThread;
use crate::store::consul::{ClusterKeys, OwnerInfo};
use crate::store::lease::ConsulTokens;
use crate::store::{ConsulSegmentStore, StoreError};

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
    pub lease: Option<Arc<dyn TokenStore>>,
    /// Strict counters.
    pub strict: Option<Arc<dyn StrictStore>>,
    /// Formatted-mode counters.
    pub format: Option<Arc<dyn crate::store::format::FormatStore>>,
    /// Stored format definitions (admin API, config file entries).
    pub format_defs: Option<Arc<dyn crate::store::format_def::FormatDefStore>>,
    /// Formatted mode's tokens (`{token}`, `uniq64`).
    pub format_tokens: Option<Arc<dyn FormatTokens>>,
    /// The embedded state file's guard: once it sees the file deleted or
    /// replaced, every mode refuses to issue.
    pub state_file: Option<Arc<StateFileGuard>>,
    /// The embedded store's write health: a write error fails readiness
    /// until the file is reopened, and liveness past `store.max_unhealthy`.
    pub store_health: Option<Arc<StoreHealth>>,
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
}

fn start_renewal() -> Result<RenewalThread, Error> {
    RenewalThread::start()
        .map_err(|e| Error::Setup(format!("cannot start the renewal thread: {e}")))
}

/// The stable instance name: configured, or `<hostname>-<port>`.
fn instance_id(config: &Config, advertise: SocketAddr) -> String {
    if let Some(id) = &config.node.instance_id {
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

/// The issue path as membership drives it.
impl IssuePath for Issuer {
    fn fence(&self) {
        Issuer::fence(self);
    }

    fn set_deadline(&self, at: std::time::Instant) {
        self.set_lock_deadline(at);
    }

    fn install(&self, generator: Arc<crate::id::Snowflake>) {
        Issuer::install(self, generator);
    }
}

/// Lease mode's token in a cluster: held under the worker lock's session,
/// so it follows every re-claim to the new session.
struct SessionTokens {
    leases: Arc<Leases>,
    client: ConsulClient,
    keys: ClusterKeys,
    zone: u64,
}

#[async_trait::async_trait]
impl SessionBound for SessionTokens {
    fn moved(&self, session: &str, owner: &OwnerInfo) -> Result<(), StoreError> {
        let tokens = ConsulTokens::new(
            self.client.clone(),
            self.keys.clone(),
            self.zone,
            session.to_owned(),
            owner.clone(),
        )?;
        self.leases.install(Arc::new(tokens));
        Ok(())
    }

    async fn release(&self) {
        if let Err(e) = self.leases.release().await {
            tracing::warn!(error = %e, "cannot release the lease token; it frees itself when the session ends");
        }
    }
}

/// Formatted mode's tokens in a cluster: held under the worker lock's
/// session, taken again under the new one after every re-claim.
struct SessionFormatTokens(Arc<ConsulFormatTokens>);

#[async_trait::async_trait]
impl SessionBound for SessionFormatTokens {
    fn moved(&self, session: &str, owner: &OwnerInfo) -> Result<(), StoreError> {
        self.0.moved(session, owner);
        Ok(())
    }

    async fn release(&self) {
        self.0.release().await;
    }
}

/// Everything held under the worker lock's session, moved and released
/// together.
struct SessionHeld(Vec<Arc<dyn SessionBound>>);

#[async_trait::async_trait]
impl SessionBound for SessionHeld {
    fn moved(&self, session: &str, owner: &OwnerInfo) -> Result<(), StoreError> {
        let mut result = Ok(());
        for held in &self.0 {
            if let Err(e) = held.moved(session, owner) {
                result = Err(e);
            }
        }
        result
    }

    async fn release(&self) {
        for held in &self.0 {
            held.release().await;
        }
    }
}

/// What `issuer` holds under the worker lock's session: lease mode's
/// token (in `zone`) and formatted mode's tokens, when enabled.
fn session_held(
    issuer: &Issuer,
    zone: Option<u64>,
    (client, keys): (ConsulClient, ClusterKeys),
    format_tokens: Arc<ConsulFormatTokens>,
) -> Option<Arc<dyn SessionBound>> {
    let mut held: Vec<Arc<dyn SessionBound>> = Vec::new();
    if let (Some(zone), Some(leases)) = (zone, issuer.leases()) {
        held.push(Arc::new(SessionTokens {
            leases: Arc::clone(leases),
            client,
            keys,
            zone,
        }));
    }
    if issuer.formats().is_some() {
        held.push(Arc::new(SessionFormatTokens(format_tokens)));
    }
    (!held.is_empty()).then(|| Arc::new(SessionHeld(held)) as Arc<dyn SessionBound>)
}

/// The embedded store and what the node runs beside it.
struct Embedded {
    store: EmbeddedStore,
    stores: ModeStores,
    guard: Arc<StateFileGuard>,
    snapshots: SnapshotSource,
}

/// Opens the state file and the stores of the enabled modes on it.
async fn open_embedded(
    config: &Config,
    path: &std::path::Path,
    init: bool,
) -> Result<Embedded, Error> {
    let layout_desc = config.layout.to_string();
    let file = path.to_path_buf();
    let store = tokio::task::spawn_blocking(move || EmbeddedStore::open(&file, &layout_desc, init))
        .await
        .map_err(|e| Error::Setup(format!("store open task: {e}")))??;
    let lease: Option<Arc<dyn TokenStore>> = match &config.lease {
        Some(l) => Some(Arc::new(embedded_tokens(config, l.zone, l.token, &store)?)),
        None => None,
    };
    if config.segment.is_some() || config.strict.is_some() {
        tracing::warn!(
            path = %path.display(),
            "segment and strict modes on the embedded store serve this one node only: another node with its own state file would hand out the same segment IDs and strict values; for several nodes use store.backend = \"consul\""
        );
    }
    let guard = Arc::clone(store.guard());
    let stores = ModeStores {
        segment: Some(Arc::new(store.clone())),
        lease,
        strict: Some(Arc::new(EmbeddedStrictStore::with_limits(
            store.clone(),
            strict_limits(config),
        ))),
        format: Some(Arc::new(store.clone())),
        format_defs: Some(Arc::new(store.clone())),
        format_tokens: Some(Arc::new(EmbeddedFormatTokens::new(
            config.node.datacenter_id,
            config.node.worker_id,
            config.layout.spec().datacenter_bits,
            config.layout.spec().worker_bits,
        ))),
        state_file: Some(Arc::clone(&guard)),
        store_health: Some(Arc::clone(store.health())),
    };
    let snapshots = SnapshotSource::new(
        store.clone(),
        config.lease.as_ref().map_or(0, |l| l.block),
        config.segment.as_ref().map_or(0, |s| s.max_step),
    )
    .with_formatted_block(config.formatted.block);
    Ok(Embedded {
        store,
        stores,
        guard,
        snapshots,
    })
}

/// Lease tokens on the embedded store: only this node's own token range,
/// derived from its datacenter and worker id.
fn embedded_tokens(
    config: &Config,
    zone: u64,
    token: Option<u64>,
    store: &EmbeddedStore,
) -> Result<EmbeddedTokens, Error> {
    // Validated config: the range exists and holds the token.
    let spec = config.layout.spec();
    let range = crate::id::lease::node_token_range(
        config.node.datacenter_id,
        config.node.worker_id,
        spec.datacenter_bits,
        spec.worker_bits,
    )
    .ok_or_else(|| Error::Setup("lease mode: this layout leaves no token range per node".into()))?;
    tracing::info!(
        zone,
        first_token = range.0,
        last_token = range.1,
        "lease mode (embedded): this node uses only its own token range, derived from its datacenter and worker id"
    );
    Ok(EmbeddedTokens::new(
        store.clone(),
        zone,
        token.unwrap_or(range.0),
        range,
    )?)
}

/// The issuer over `generator` with every enabled mode's engine, and the
/// catalog of stored format definitions formatted mode serves from.
fn build_issuer(
    config: &Config,
    clock: &Arc<dyn Clock>,
    generator: Arc<crate::id::Snowflake>,
    stores: ModeStores,
) -> Result<(Issuer, Option<Arc<FormatCatalog>>), Error> {
    let mut issuer = Issuer::new(
        generator,
        Arc::clone(clock),
        config.server.max_batch,
        config.server.max_wait,
    )
    .map_err(|e| Error::Setup(format!("cannot start the ticker thread: {e}")))?;
    if let Some(s) = &config.segment {
        let store = stores
            .segment
            .ok_or_else(|| missing("segment mode", "segment store"))?;
        let settings = SegmentSettings {
            auto_create: s.auto_create,
            default_step: s.default_step,
            max_step: s.max_step,
            max_wait: config.server.max_wait,
            max_tags: s.max_tags,
            idle_release: s.idle_release,
        };
        let segments = Arc::new(Segments::new(store, Arc::clone(clock), settings));
        segments.spawn_idle_sweeper();
        issuer = issuer.with_segments(segments);
        tracing::info!(auto_create = s.auto_create, "segment mode enabled");
    }
    if let Some(l) = &config.lease {
        let source = stores
            .lease
            .ok_or_else(|| missing("lease mode", "token source"))?;
        let settings = LeaseSettings {
            block: l.block,
            max_wait: config.server.max_wait,
        };
        issuer = issuer.with_leases(Arc::new(Leases::new(source, settings)));
    }
    if let Some(guard) = stores.state_file {
        issuer = issuer.with_state_file(guard);
    }
    if let Some(health) = stores.store_health {
        issuer = issuer.with_store_health(health);
    }
    if let Some(s) = &config.strict {
        let store = stores
            .strict
            .ok_or_else(|| missing("strict mode", "strict store"))?;
        issuer = issuer.with_strict(Arc::new(Strict::with_limits(
            store,
            s.default_step,
            strict_limits(config),
        )));
        tracing::info!(default_step = s.default_step, "strict mode enabled");
    }
    let node = issuer.generator().node_number();
    let catalog = format_catalog(
        config,
        clock,
        node,
        (stores.format, stores.format_defs, stores.format_tokens),
    )?;
    if let Some(catalog) = &catalog {
        issuer = issuer.with_formats(Arc::clone(catalog.formats()));
    }
    Ok((issuer, catalog))
}

/// Formatted mode's stores: counters, definitions and tokens.
type FormatStores = (
    Option<Arc<dyn crate::store::format::FormatStore>>,
    Option<Arc<dyn crate::store::format_def::FormatDefStore>>,
    Option<Arc<dyn FormatTokens>>,
);

/// Formatted mode's engine (empty until the catalog's start-up reload in
/// `Node::prime`) and the catalog of stored definitions it serves from.
fn format_catalog(
    config: &Config,
    clock: &Arc<dyn Clock>,
    node: u64,
    (store, defs, tokens): FormatStores,
) -> Result<Option<Arc<FormatCatalog>>, Error> {
    let (Some(store), Some(defs)) = (store, defs) else {
        if !config.formatted.formats.is_empty() {
            return Err(missing("formatted mode", "format store"));
        }
        return Ok(None);
    };
    let settings = crate::modes::format::FormatSettings {
        block: config.formatted.block,
        max_behind_ms: config.hwm.max_backward.as_millis() as u64,
        max_batch: config.server.max_batch,
        lua: crate::modes::lua_pool::LuaPoolSettings {
            workers: config.formatted.lua_workers,
            deadline: config.formatted.lua_deadline,
        },
        max_scope_values: config.formatted.max_scope_values,
    };
    let formats =
        crate::modes::format::Formats::new(&[], store, Arc::clone(clock), settings, node)?;
    let formats = Arc::new(match tokens {
        Some(tokens) => formats.with_tokens(tokens),
        None => formats,
    });
    Ok(Some(Arc::new(FormatCatalog::new(
        defs,
        formats,
        Arc::clone(clock),
        config.formatted.formats.clone(),
    ))))
}

/// What a Consul node joins with: the advertised address (refused when
/// clients could not dial it), the name the agent's TLS probe verifies,
/// and the cluster's keys.
fn cluster_spec(
    config: &Config,
    cluster: ClusterConfig,
) -> Result<(ClusterSpec, ClusterKeys), Error> {
    let advertise = config.node.advertise.unwrap_or(config.server.grpc_listen);
    if advertise.ip().is_unspecified() || advertise.port() == 0 {
        return Err(Error::Setup(format!(
            "cannot advertise {advertise} in Consul: clients cannot dial it; set node.advertise to this node's IP:port"
        )));
    }
    // With TLS the agent's probe must use it, and verify a name the
    // certificate carries.
    let check_tls_server_name = match &config.server.tls {
        Some(settings) => Some(
            tls::check_server_name(
                settings,
                advertise.ip(),
                cluster.check_tls_server_name.as_deref(),
            )
            .map_err(|e| Error::Setup(e.to_string()))?,
        ),
        None => None,
    };
    let keys = cluster.keys.clone();
    let spec = ClusterSpec {
        check_tls_server_name,
        config: cluster,
        datacenter: config.node.datacenter_id,
        worker_id: config.node.worker_id,
        layout: config.layout,
        layout_preset: config.layout_preset.clone(),
        hwm: config.hwm,
        instance: instance_id(config, advertise),
        advertise,
        lease_zone: config.lease.as_ref().map(|l| l.zone),
        // Port 0 (bound later, in tests) is not advertised.
        metrics_port: Some(config.server.http_listen.port()).filter(|p| *p != 0),
        modes: served_modes(config),
    };
    Ok((spec, keys))
}

/// The modes `config` serves, as registration tags: snowflake and
/// formatted always, segment, lease and strict when enabled.
fn served_modes(config: &Config) -> Vec<String> {
    [
        ("snowflake", true),
        ("segment", config.segment.is_some()),
        ("lease", config.lease.is_some()),
        ("strict", config.strict.is_some()),
        ("formatted", true),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .map(|(mode, _)| mode.to_owned())
    .collect()
}

fn missing(mode: &str, store: &str) -> Error {
    Error::Setup(format!("{mode} is enabled but no {store} was given"))
}

impl Node {
    /// Opens the state store (or claims a worker id in Consul) and starts
    /// the generator above the stored high-water mark. Fails, and issues
    /// nothing, if the state file is missing or made for another layout,
    /// Consul cannot be reached or refuses, no worker id is free, or the
    /// clock is too far behind the stored mark.
    pub async fn start(config: Config, clock: Arc<dyn Clock>) -> Result<Self, Error> {
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
            } => {
                let file = (path.clone(), *init_if_missing);
                Self::start_embedded(config, file, clock, metrics).await
            }
        }
    }

    async fn start_consul(
        config: Config,
        cluster: ClusterConfig,
        clock: Arc<dyn Clock>,
        metrics: PrometheusHandle,
    ) -> Result<Self, Error> {
        let (spec, keys) = cluster_spec(&config, cluster)?;
        register_series(&config, "consul");
        let renewal = start_renewal()?;
        let membership = Membership::join_consul(spec, Arc::clone(&clock), &renewal).await?;
        let Membership::Consul(claimed) = &membership else {
            return Err(Error::Setup("a Consul member without a claim".into()));
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
        let lease: Option<Arc<dyn TokenStore>> = match &config.lease {
            Some(l) => Some(Arc::new(claimed.tokens(l.zone)?)),
            None => None,
        };
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
            format: Some(Arc::new(crate::store::format::ConsulFormatStore::new(
                client.clone(),
                keys.clone(),
            ))),
            format_defs: Some(Arc::new(
                crate::store::format_def::ConsulFormatDefStore::new(client.clone(), keys.clone()),
            )),
            format_tokens: Some(Arc::clone(&format_tokens) as Arc<dyn FormatTokens>),
            state_file: None,
            store_health: None,
        };
        let zone = config.lease.as_ref().map(|l| l.zone);
        let deadline = membership.deadline();
        let mut node = Self::assemble(config, clock, membership, stores, (metrics, renewal))?;
        node.bound = session_held(&node.issuer, zone, (client, keys), format_tokens);
        if let Some(deadline) = deadline {
            // Until the supervisor takes over, the claim's own deadline.
            node.issuer.set_lock_deadline(deadline);
        }
        node.prime().await
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
        } = open_embedded(&config, &path, init).await?;
        let interval = (config.hwm.renew_interval / 2).min(std::time::Duration::from_millis(100));
        let key = WorkerKey {
            datacenter: config.node.datacenter_id,
            worker: config.node.worker_id,
        };
        let store: Arc<dyn HwmStore> = Arc::new(store);
        register_series(&config, store.backend());
        // Started on the renewal thread, so its renewal task lives there.
        let renewal = start_renewal()?;
        let (layout, hwm) = (config.layout, config.hwm);
        let membership =
            Membership::join_static(store, key, layout, Arc::clone(&clock), hwm, &renewal).await?;
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
                crate::store::format::one_node_formats_warning(&cluster_wide)
            );
        }
    }

    /// The stored format definitions and their reloads.
    pub fn format_catalog(&self) -> Option<&Arc<FormatCatalog>> {
        self.formats.as_ref()
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
        let (issuer, formats) = build_issuer(&config, &clock, generator, stores)?;
        metrics::gauge!(m::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "layout" => config.layout.to_string())
            .set(1.0);
        metrics::gauge!(m::LAYOUT_WORKER_IDS)
            .set(2f64.powi(i32::from(config.layout.spec().worker_bits)));
        metrics::gauge!(m::LAYOUT_TIME_LEFT).set(m::layout_time_left_seconds(
            &config.layout,
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
        })
    }

    /// The issuer, for in-process callers.
    pub fn issuer(&self) -> &Arc<Issuer> {
        &self.issuer
    }
}
