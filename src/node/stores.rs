//! The stores of the modes besides snowflake, opened for the backend the
//! node runs on: [`ModeStores`], and on the embedded store the state file
//! and what runs beside it.

use std::sync::Arc;

use crate::config::Config;
use crate::error::Error;
use crate::modes::hide_keys::HideKeyRings;
use crate::store::format::tokens::{EmbeddedFormatTokens, FormatTokens};
use crate::store::hide_keys::{HideKeyRecords, HideKeys};
use crate::store::lease::{declare_embedded_zone, EmbeddedLeaseTokens, LeaseTokenStore};
use crate::store::reopen::StoreHealth;
use crate::store::snapshot::SnapshotSource;
use crate::store::state_file::StateFileGuard;
use crate::store::strict::{EmbeddedStrictStore, StrictStore};
use crate::store::{EmbeddedStore, SegmentStore};

/// The stores of the modes besides snowflake; each enabled mode needs its
/// own.
#[derive(Default)]
pub struct ModeStores {
    /// Segment records.
    pub segment: Option<Arc<dyn SegmentStore>>,
    /// Lease tokens and their counters.
    pub lease: Option<Arc<dyn LeaseTokenStore>>,
    /// Strict counters.
    pub strict: Option<Arc<dyn StrictStore>>,
    /// Formatted-mode counters.
    pub format: Option<Arc<dyn crate::store::format::counters::FormatCounterStore>>,
    /// Stored format definitions (admin API, config file entries).
    pub format_defs: Option<Arc<dyn crate::store::format::catalog::FormatCatalogStore>>,
    /// Formatted mode's tokens (`{token}`, `uniq64`).
    pub format_tokens: Option<Arc<dyn FormatTokens>>,
    /// The embedded state file's guard: once it sees the file deleted or
    /// replaced, every mode refuses to issue.
    pub state_file: Option<Arc<StateFileGuard>>,
    /// The embedded store's write health: a write error fails readiness
    /// until the file is reopened, and liveness past `store.max_unhealthy`.
    pub store_health: Option<Arc<StoreHealth>>,
    /// The hide key rings (issue 23), loaded from where the namespaces
    /// live; every backend sets them.
    pub hide_keys: Option<HideKeyRings>,
}

/// The hide key rings over `records`, sealed with the master key the
/// config names (`hide.master_key_file` or `IDGEN_HIDE_MASTER_KEY`):
/// loaded once here, so a bad or wrong master key stops the node at start.
pub(super) async fn hide_key_rings(
    config: &Config,
    records: Arc<dyn HideKeyRecords>,
) -> Result<HideKeyRings, Error> {
    let master = match config.hide.master_key() {
        Ok(Some((key, warning))) => {
            if let Some(w) = warning {
                tracing::warn!("{w}");
            }
            Some(key)
        }
        Ok(None) => None,
        Err(e) => return Err(Error::Setup(e.to_string())),
    };
    let keys: Arc<dyn crate::store::hide_keys::HideKeyStore> =
        Arc::new(HideKeys::new(records, master));
    HideKeyRings::load(keys)
        .await
        .map_err(|e| Error::Setup(format!("hide keys: {e}")))
}

/// The strict-mode limits of `config` (none when strict mode is off: the
/// store is then only reached by tools).
pub(super) fn strict_limits(config: &Config) -> crate::store::strict::StrictLimits {
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

/// The embedded store and what the node runs beside it.
pub(super) struct Embedded {
    pub(super) store: EmbeddedStore,
    pub(super) stores: ModeStores,
    pub(super) guard: Arc<StateFileGuard>,
    pub(super) snapshots: SnapshotSource,
}

/// Opens the state file and the stores of the enabled modes on it.
pub(super) async fn open_embedded(
    config: &Config,
    path: &std::path::Path,
    init: bool,
    clock: Arc<dyn crate::id::Clock>,
) -> Result<Embedded, Error> {
    let layout_desc = config.layout_record();
    let file = path.to_path_buf();
    let mirror = config.store.mirror_path().map(std::path::Path::to_path_buf);
    // The mirror is set before anything is reserved, so every reservation
    // of this run is in it before its IDs are handed out (rule 11).
    let store = tokio::task::spawn_blocking(move || {
        let store = EmbeddedStore::open(&file, &layout_desc, init)?;
        match mirror {
            Some(m) => store.with_mirror(&m, clock),
            None => Ok(store),
        }
    })
    .await
    .map_err(|e| Error::Setup(format!("store open task: {e}")))??;
    let lease: Option<Arc<dyn LeaseTokenStore>> = match &config.lease {
        Some(l) => {
            let record = crate::id::lease::ZoneRecord {
                hide: l.hide.clone(),
            };
            let (zone_store, zone) = (store.clone(), l.zone);
            tokio::task::spawn_blocking(move || declare_embedded_zone(&zone_store, zone, &record))
                .await
                .map_err(|e| Error::Setup(format!("lease zone declaration task: {e}")))??;
            Some(Arc::new(embedded_tokens(config, l, &store)?))
        }
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
        hide_keys: Some(hide_key_rings(config, Arc::new(store.clone())).await?),
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
    lease: &crate::config::LeaseModeSettings,
    store: &EmbeddedStore,
) -> Result<EmbeddedLeaseTokens, Error> {
    let (zone, token) = (lease.zone, lease.token);
    // Validated config: the range exists and holds the token.
    let spec = config.layout.spec();
    let range = crate::id::lease::node_token_range_in(
        config.node.datacenter_id,
        config.node.worker_id,
        spec.datacenter_bits,
        spec.worker_bits,
        lease.token_bits(),
    )
    .ok_or_else(|| Error::Setup("lease mode: this layout leaves no token range per node".into()))?;
    tracing::info!(
        zone,
        first_token = range.0,
        last_token = range.1,
        "lease mode (embedded): this node uses only its own token range, derived from its datacenter and worker id"
    );
    Ok(EmbeddedLeaseTokens::new(
        store.clone(),
        zone,
        token.unwrap_or(range.0),
        range,
    )?)
}
