//! `idgen decode`: split an ID into its parts, offline, under the
//! configured layout.

use anyhow::bail;

use idgen::config::FileConfig;
use idgen::id::{Clock, Mode, SystemClock};
use idgen::modes::decode_snowflake;

use super::args::DecodeArgs;
use super::output::outln;

/// Prints the ID's fields (time, datacenter, worker, sequence; or zone,
/// token, sequence for lease IDs).
pub fn run(a: DecodeArgs) -> anyhow::Result<()> {
    let Ok(id) = a.id.parse::<u64>() else {
        bail!("{:?} is not a decimal 64-bit unsigned integer", a.id);
    };
    let d = match Mode::parse(&a.mode)? {
        Mode::Snowflake => {
            let file = FileConfig::load(a.config.as_deref())?;
            let layout = file.layout(SystemClock.now_millis())?;
            decode_snowflake(&layout, id)?
        }
        Mode::Lease => idgen::modes::decode_lease(id)?,
        other => bail!("mode {other} IDs are plain numbers with no fields to decode"),
    };
    if a.json {
        outln!("{}", serde_json::to_string(&d)?)?;
    } else if let (Some(zone), Some(token)) = (d.zone, d.token) {
        outln!(
            "id {}\nzone {zone}\ntoken {token}\nsequence {}",
            d.id,
            d.sequence
        )?;
    } else {
        outln!(
            "id {}\ntime {} ({} ms)\ndatacenter {}\nworker {}\nsequence {}",
            d.id,
            d.time,
            d.unix_millis,
            d.datacenter,
            d.worker,
            d.sequence
        )?;
    }
    Ok(())
}
