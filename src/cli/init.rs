//! `idgen init`: create an empty state file for a new node.

use anyhow::bail;

use idgen::config::Config;
use idgen::id::{Clock, SystemClock};
use idgen::store::EmbeddedStore;

use super::args::ConfigArgs;
use super::output::outln;

/// Printed by every `idgen init`: an empty state file is right for a new
/// node only.
const INIT_WARNING: &str = "warning: `idgen init` creates an EMPTY state file: segment, lease, strict and formatted counters start again from their initial values, and it holds no stored formats. Use it only for a node that has never issued IDs. If this node's state file was lost, do not init: restore its mirror or latest backup with `idgen state restore <file> --config <file>` (a backup needs margins you state: --skip-ahead etc.; see docs/BACKUP.md), or the node hands out IDs it handed out before.";

/// Creates the state file named by the config; refuses to overwrite one.
pub fn run(a: ConfigArgs) -> anyhow::Result<()> {
    let config = Config::load(
        a.config.as_deref(),
        &a.overrides(),
        SystemClock.now_millis(),
    )?;
    let Some(state_path) = config.store.state_path() else {
        bail!("idgen init creates the embedded state file; with store.backend = \"consul\" there is nothing to create (nodes claim worker ids at start)");
    };
    eprintln!("{INIT_WARNING}");
    EmbeddedStore::create(state_path, &config.layout_record())?;
    outln!(
        "created state file {} for layout [{}]",
        state_path.display(),
        config.layout
    )?;
    Ok(())
}
