//! The [`Issuer`] a node serves from: every enabled mode's engine over
//! its store, and the catalog of stored format definitions formatted mode
//! serves from.

use std::sync::Arc;

use super::stores::{strict_limits, ModeStores};
use crate::config::Config;
use crate::error::Error;
use crate::id::Clock;
use crate::modes::format_catalog::FormatCatalog;
use crate::modes::lease::{LeaseEngine, LeaseSettings};
use crate::modes::segment::{SegmentEngine, SegmentSettings};
use crate::modes::strict::StrictEngine;
use crate::modes::Issuer;
use crate::store::format::tokens::FormatTokens;

/// The issuer over `generator` with every enabled mode's engine, and the
/// catalog of stored format definitions formatted mode serves from.
/// Gives the issuer the hide key rings (re-read when a call names a key
/// this node does not have yet), and shows snowflake IDs through the
/// layout's hider when `layout.hide` is set.
fn hiding(config: &Config, stores: &ModeStores, mut issuer: Issuer) -> Issuer {
    if let Some(rings) = &stores.hide_keys {
        issuer = issuer.with_hide_keys(rings.clone());
    }
    if let Some(h) = &config.layout_hide {
        let output = crate::modes::hidden::snowflake_output(
            &h.key_id,
            stores.hide_keys.clone(),
            config.layout,
            h.hiding,
            h.version_bits,
        );
        issuer = issuer.with_hidden_snowflakes(crate::modes::snowflake::HiddenSnowflakes {
            output,
            public: config.layout,
            hiding: h.hiding,
            version_bits: h.version_bits,
        });
        tracing::info!(hide = %h.record_text(), "snowflake IDs are hidden");
        issuer = issuer.with_uuid_hiding(uuid_hiding(config, stores, h));
    }
    issuer
}

/// How UUIDs follow the layout's hiding: sortable hides them the same way
/// (time shown, counter and node permuted, the layout's key and version
/// width); a hiding that cannot hold a UUIDv7 refuses UUID calls, and
/// says so once at start-up. A layout too wide for UUIDs at all is
/// refused by the engine itself ([`crate::id::UuidError::NodeTooWide`]).
fn uuid_hiding(
    config: &Config,
    stores: &ModeStores,
    h: &crate::config::LayoutHide,
) -> crate::modes::uuid::UuidHiding {
    use crate::id::hide::{SnowflakeHiding, MIN_HIDDEN_COUNTER_BITS};
    use crate::id::uuid::{UuidError, COUNTER_BITS};
    use crate::modes::uuid::UuidHiding;
    let refused = match h.hiding {
        SnowflakeHiding::Opaque => Some(UuidError::OpaqueLayout),
        SnowflakeHiding::Sortable if COUNTER_BITS - h.version_bits < MIN_HIDDEN_COUNTER_BITS => {
            Some(UuidError::HideVersionTooWide {
                version_bits: h.version_bits,
            })
        }
        SnowflakeHiding::Sortable => None,
    };
    if let Some(why) = refused {
        tracing::warn!(reason = %why, "UUID calls will be refused");
        return UuidHiding::Refused(why);
    }
    match crate::id::UuidLayout::of(&config.layout) {
        Ok(layout) => UuidHiding::Sortable {
            output: crate::modes::hidden::uuid_output(
                &h.key_id,
                stores.hide_keys.clone(),
                layout,
                h.version_bits,
            ),
            version_bits: h.version_bits,
        },
        Err(why) => UuidHiding::Refused(why),
    }
}

pub(super) fn build_issuer(
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
    issuer = hiding(config, &stores, issuer);
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
        let mut segments = SegmentEngine::new(store, Arc::clone(clock), settings);
        if let Some(rings) = &stores.hide_keys {
            segments = segments.with_hide_rings(rings.clone());
        }
        let segments = Arc::new(segments);
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
        let mut leases = LeaseEngine::new(source, settings);
        if let Some(h) = &l.hide {
            let output = crate::modes::hidden::int_output(
                format!("lease zone {}", l.zone),
                &h.key,
                stores.hide_keys.clone(),
                h.version_bits,
                h.domain_bits(),
            );
            leases = leases.with_hide(l.zone, h, output);
            tracing::info!(zone = l.zone, key = %h.key, "lease zone hidden");
        }
        issuer = issuer.with_leases(Arc::new(leases));
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
        issuer = issuer.with_strict(Arc::new(StrictEngine::with_limits(
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
        stores.hide_keys,
    )?;
    if let Some(catalog) = &catalog {
        issuer = issuer.with_catalog(Arc::clone(catalog));
    }
    Ok((issuer, catalog))
}

/// Formatted mode's stores: counters, definitions and tokens.
type FormatStores = (
    Option<Arc<dyn crate::store::format::counters::FormatCounterStore>>,
    Option<Arc<dyn crate::store::format::catalog::FormatCatalogStore>>,
    Option<Arc<dyn FormatTokens>>,
);

/// Formatted mode's engine (empty until the catalog's start-up reload in
/// `Node::prime`) and the catalog of stored definitions it serves from.
fn format_catalog(
    config: &Config,
    clock: &Arc<dyn Clock>,
    node: u64,
    (store, defs, tokens): FormatStores,
    hide_keys: Option<crate::modes::hide_keys::HideKeyRings>,
) -> Result<Option<Arc<FormatCatalog>>, Error> {
    let (Some(store), Some(defs)) = (store, defs) else {
        if !config.formatted.formats.is_empty() {
            return Err(missing("formatted mode", "format store"));
        }
        return Ok(None);
    };
    let settings = crate::modes::formatted::FormatSettings {
        block: config.formatted.block,
        max_behind_ms: config.hwm.max_backward.as_millis() as u64,
        lua: crate::modes::lua_pool::LuaPoolSettings {
            workers: config.formatted.lua_workers,
            deadline: config.formatted.lua_deadline,
        },
        max_scope_values: config.formatted.max_scope_values,
        lua_check_budget: config.formatted.lua_check_budget,
    };
    let formats = crate::modes::formatted::FormattedEngine::new(
        &[],
        store,
        Arc::clone(clock),
        settings,
        node,
    )?;
    let formats = match tokens {
        Some(tokens) => formats.with_tokens(tokens),
        None => formats,
    };
    let formats = Arc::new(match hide_keys {
        Some(rings) => formats.with_hide_rings(rings),
        None => formats,
    });
    Ok(Some(Arc::new(FormatCatalog::new(
        defs,
        formats,
        Arc::clone(clock),
        config.formatted.formats.clone(),
    ))))
}

pub(super) fn missing(mode: &str, store: &str) -> Error {
    Error::Setup(format!("{mode} is enabled but no {store} was given"))
}
