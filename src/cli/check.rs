//! `idgen check-config`: validate a config (file, `IDGEN_*` environment,
//! flags) and print the effective settings, secrets redacted, without
//! starting anything.

use idgen::config::{Backend, FileConfig};
use idgen::id::{Clock, SystemClock};

use super::args::ServeArgs;
use super::serve::log_filter;

/// Prints the settings as TOML on stdout and a one-line summary on stderr.
pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let mut file = FileConfig::load(a.config.config.as_deref())?;
    file.apply(&a.overrides());
    let config = file.validate(SystemClock.now_millis())?;
    log_filter(&config)?;
    super::output::write(&file.redacted_toml()?)?;
    let backend = match &config.store.backend {
        Backend::Embedded { path, .. } => format!("embedded, state file {}", path.display()),
        Backend::Consul(c) => format!("consul at {}", c.client.address),
    };
    eprintln!(
        "config is valid: layout [{}], datacenter {}, worker {}, {backend}",
        config.layout, config.node.datacenter_id, config.node.worker_id
    );
    Ok(())
}
