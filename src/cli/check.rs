//! `idgen check-config`: validate a config (file, `IDGEN_*` environment,
//! flags) and print the effective settings, secrets redacted, without
//! starting anything.

use idgen::config::{Backend, FileConfig};
use idgen::id::format::{Format, FormatDef, LoadChecks, LuaLimits, Scope};
use idgen::id::{Clock, SystemClock};
use idgen::store::format::counters::one_node_formats_warning;

use super::args::ServeArgs;
use super::serve::log_filter;

/// Prints the settings as TOML on stdout and a one-line summary on stderr.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let mut file = FileConfig::load(a.config.config.as_deref())?;
    file.apply(&a.overrides());
    let config = file.validate(SystemClock.now_millis())?;
    log_filter(&config)?;
    check_lua_rules(&config)?;
    // The hide master key: read (never printed) so a bad one fails here
    // as it would at start, with the warning `serve` logs (one check,
    // `MasterKey::from_file`), printed after the settings, beside the
    // summary, where it is not scrolled away by them.
    let (hide, key_warning) = match config.hide.master_key()? {
        Some((_, warning)) => ("hide master key loaded", warning),
        None => (
            "no hide master key (hide key admin calls are refused)",
            None,
        ),
    };
    super::output::write(&file.redacted_toml()?)?;
    if let Some(w) = key_warning {
        eprintln!("warning: {w}");
    }
    let backend = match &config.store.backend {
        Backend::Embedded { path, .. } => format!("embedded, state file {}", path.display()),
        Backend::Consul(c) => format!("consul at {}", c.client.address),
    };
    eprintln!(
        "config is valid: layout [{}], datacenter {}, worker {}, {backend}; {hide}",
        config.layout, config.node.datacenter_id, config.node.worker_id
    );
    eprintln!("{}", time_left_line(&config));
    if config.store.state_path().is_some() {
        warn_one_node_formats(&config.formatted.formats);
    }
    Ok(())
}

/// Runs each config Lua rule's load-time checks under
/// `formatted.lua_check_budget`. Validation skips them (a node runs them
/// once, when it first stores the entry), so without this a rule the node
/// would refuse at start would pass here.
fn check_lua_rules(config: &idgen::config::Config) -> anyhow::Result<()> {
    let now = SystemClock.now_millis() as i64;
    let limits = LuaLimits {
        check_budget: config.formatted.lua_check_budget,
        ..LuaLimits::default()
    };
    let lua = config.formatted.formats.iter().enumerate();
    for (i, def) in lua.filter(|(_, d)| d.lua.is_some()) {
        Format::compile(def.clone(), now, limits)
            .map_err(|e| anyhow::anyhow!("formats: entry {} ({:?}): {e}", i + 1, def.name))?;
    }
    Ok(())
}

/// Names the config's formats whose counter is cluster-wide: on the
/// embedded store they serve one node only. (Formats made with the admin
/// API live in the state file; the node names those at start-up.)
fn warn_one_node_formats(defs: &[FormatDef]) {
    let now = SystemClock.now_millis() as i64;
    let cluster_wide: Vec<String> = defs
        .iter()
        .filter(|d| {
            Format::compile_with((*d).clone(), now, LuaLimits::default(), LoadChecks::Skip)
                .is_ok_and(|f| f.scope() == Scope::Cluster)
        })
        .map(|d| d.name.clone())
        .collect();
    if !cluster_wide.is_empty() {
        eprintln!("warning: {}", one_node_formats_warning(&cluster_wide));
    }
}

/// How long the layout lasts, on the effective layout: a hidden opaque
/// layout takes its key-version bits from the time, so it ends sooner.
fn time_left_line(config: &idgen::config::Config) -> String {
    let effective = config.generator_layout();
    let years = effective.years_left(SystemClock.now_millis());
    match &config.layout_hide {
        Some(h) => format!(
            "layout time left: {years:.1} years (hidden {}, effective layout [{effective}])",
            h.record_text()
        ),
        None => format!("layout time left: {years:.1} years"),
    }
}
