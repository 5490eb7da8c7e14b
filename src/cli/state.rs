//! `idgen state backup|restore`: snapshots of the embedded state file, and
//! recreating a lost one from a snapshot, skipping ahead.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;

use idgen::config::Config;
use idgen::id::{Clock, SystemClock};
use idgen::proto;
use idgen::store::{format::restore as format_restore, snapshot};

use super::admin;
use super::args::{BackupArgs, ConfigArgs, RestoreArgs};
use super::client::status_error;

/// Loads the config of `idgen state ...` and checks it is embedded;
/// returns it with its state file.
fn embedded_config(a: &ConfigArgs, what: &str) -> anyhow::Result<(Config, PathBuf)> {
    let config = Config::load(
        a.config.as_deref(),
        &a.overrides(),
        SystemClock.now_millis(),
    )?;
    let Some(path) = config.store.state_path().map(PathBuf::from) else {
        bail!("idgen state {what} is for the embedded state file; with store.backend = \"consul\" the state lives in Consul: back up Consul (`consul snapshot save`)");
    };
    Ok((config, path))
}

/// Writes a snapshot, taken by the running node or (`--offline`) read
/// from a stopped node's state file, and says what it holds.
pub async fn backup(a: BackupArgs) -> anyhow::Result<()> {
    if a.file.exists() {
        bail!(
            "{} exists already; refusing to overwrite it (give a new file name)",
            a.file.display()
        );
    }
    let bytes = if a.offline {
        let (_, path) = embedded_config(&a.config, "backup --offline")?;
        tokio::task::spawn_blocking(move || snapshot::take_offline(&path, SystemClock.now_millis()))
            .await??
    } else {
        if a.config.config.is_some() || a.config.state.is_some() {
            bail!("--config/--state are for --offline; a running node is reached with --addr");
        }
        fetch_from_node(&a).await?
    };
    let file = a.file.clone();
    let size = bytes.len();
    tokio::task::spawn_blocking(move || snapshot::write_snapshot_file(&file, &bytes)).await??;
    print_backup(&a.file, size)
}

/// The snapshot the running node takes (admin rpc `Backup`), all of it.
async fn fetch_from_node(a: &BackupArgs) -> anyhow::Result<Vec<u8>> {
    let token = admin::admin_token_from(a.admin_token.as_deref(), a.admin_token_file.as_deref())?;
    let mut client = admin::connect_to(&a.addr, token, a.timeout, &a.tls).await?;
    let mut stream = client
        .backup(proto::BackupRequest {})
        .await
        .map_err(status_error)?
        .into_inner();
    let mut bytes = Vec::new();
    let mut total = None;
    while let Some(chunk) = stream.message().await.map_err(status_error)? {
        total = Some(chunk.total_bytes);
        bytes.extend_from_slice(&chunk.data);
    }
    if total != Some(bytes.len() as u64) {
        bail!(
            "the snapshot stream ended early ({} of {:?} bytes); nothing was written, try again",
            bytes.len(),
            total
        );
    }
    Ok(bytes)
}

/// What the written snapshot holds: when and for which layout it was
/// taken, the rates at that moment (information only), and what a
/// restore from it will need.
fn print_backup(file: &Path, size: usize) -> anyhow::Result<()> {
    let info = snapshot::inspect(file)?;
    let taken = std::time::UNIX_EPOCH + Duration::from_millis(info.taken_at_ms);
    println!(
        "wrote snapshot {} ({size} bytes), taken {}, layout [{}]",
        file.display(),
        humantime::format_rfc3339_millis(taken),
        info.layout
    );
    if info.taken_after_loss {
        println!("rescue snapshot: the node's state file was lost and it had stopped issuing; this covers everything it handed out (stop the node, then `idgen state restore`)");
        return Ok(());
    }
    let mut fastest: Vec<(&String, &f64)> = info
        .rates
        .iter()
        .filter(|(k, r)| !k.starts_with("hwm/") && **r > 0.0)
        .collect();
    fastest.sort_by(|x, y| y.1.total_cmp(x.1));
    if !info.rates_known {
        println!("issue rates: {}", info.rates_note);
    } else if fastest.is_empty() {
        println!("issue rates: no counter was moving");
    } else {
        for (k, r) in fastest.iter().take(5) {
            println!("issue rate {k}: {r:.1}/s");
        }
    }
    println!("the node keeps issuing after this backup and nothing here bounds how much: a restore from it needs margins you state (what the node issues from now until it stops). A restore that needs none: set store.mirror_path");
    Ok(())
}

/// Recreates a lost state file from a snapshot, every counter moved
/// forward: segment and lease by `--skip-ahead`, strict by
/// `--strict-skip-ahead`, each format's by its own margin. A backup cannot
/// know what was issued after it, so without the margins it refuses and
/// says what it knows; a mirror or rescue snapshot needs none.
pub fn restore(a: RestoreArgs) -> anyhow::Result<()> {
    let (config, state_path) = embedded_config(&a.config, "restore")?;
    let now_ms = SystemClock.now_millis();
    if state_path.exists() {
        bail!(
            "state file {} exists; refusing to overwrite it (restore is for a lost state file: move this one away first if you really mean to replace it)",
            state_path.display()
        );
    }
    let info = snapshot::inspect(&a.backup)?;
    let layout = config.layout_record();
    if info.layout != layout {
        bail!(
            "backup {} was taken for layout [{}] but the config says [{layout}]; restore it with the config the node ran with",
            a.backup.display(),
            info.layout
        );
    }
    let margins = if info.is_current() {
        current_margins(&a, &info)?
    } else {
        stated_margins(&a, &info, &config, now_ms)?
    };
    // Every worker's mark moves to at least now + reserve: a restart right
    // after a crash still starts above every ID the lost file covered.
    let hwm_floor_ms = now_ms.saturating_add(config.hwm.reserve.as_millis() as u64);
    let r = snapshot::restore_with(&a.backup, &state_path, &layout, &margins, hwm_floor_ms)?;
    println!(
        "restored {} from {} (taken {} ago): {} segment tags and {} lease token counters moved forward by {}, {} strict counters by {}; tags and tokens the snapshot did not hold start above {}, strict keys above {}; {} high-water marks raised to at least {} ms",
        state_path.display(),
        a.backup.display(),
        humantime::format_duration(Duration::from_secs(
            now_ms.saturating_sub(info.taken_at_ms) / 1000
        )),
        r.segments,
        r.lease_tokens,
        margins.skip_ahead,
        r.strict_keys,
        margins.strict,
        r.floor,
        r.strict_floor,
        r.hwm_marks,
        r.hwm_floor_ms
    );
    print_formats(&r, margins.formats.default.unwrap_or(0));
    Ok(())
}

/// A mirror or rescue snapshot holds every reservation whose IDs anyone
/// saw: every counter continues above its value, so the margins are 0
/// (exact), or what the operator adds.
fn current_margins(
    a: &RestoreArgs,
    info: &snapshot::SnapshotInfo,
) -> anyhow::Result<snapshot::Margins> {
    let what = if info.mirror {
        "a mirror (store.mirror_path), rewritten after every reservation and before its IDs were handed out"
    } else {
        "a rescue snapshot, taken by the node after its state file was lost, when it had stopped issuing (if another node ran on a new file at that path meanwhile, stop it and add what it handed out with the margins)"
    };
    println!("{} is {what}: it holds every reservation whose IDs were handed out, so every counter continues above its value, with no margin (exact: 0)", a.backup.display());
    let mut formats =
        format_restore::FormatMargins::parse(&a.format_skip_ahead).map_err(anyhow::Error::msg)?;
    known_formats(&formats, info)?;
    // It holds every format the node created too: none is missing.
    formats.default = Some(formats.default.unwrap_or(0));
    Ok(snapshot::Margins {
        skip_ahead: a.skip_ahead.unwrap_or(0),
        strict: a.strict_skip_ahead.unwrap_or(0),
        formats,
    })
}

/// The margins of a restore from a backup, as the operator stated them;
/// refuses, saying what the backup knows, when one is missing.
fn stated_margins(
    a: &RestoreArgs,
    info: &snapshot::SnapshotInfo,
    config: &Config,
    now_ms: u64,
) -> anyhow::Result<snapshot::Margins> {
    let mut formats =
        format_restore::FormatMargins::parse(&a.format_skip_ahead).map_err(anyhow::Error::msg)?;
    known_formats(&formats, info)?;
    let mut missing = Vec::new();
    if a.skip_ahead.is_none() {
        missing.push("--skip-ahead N: segment tags and lease tokens, in IDs".to_owned());
    }
    let strict_used =
        config.strict.is_some() || info.counters.keys().any(|k| k.starts_with("strict/"));
    if a.strict_skip_ahead.is_none() && strict_used {
        missing.push("--strict-skip-ahead N: strict keys, in values (calls, not IDs)".to_owned());
    }
    let unset: Vec<&str> = info
        .format_defs
        .iter()
        .map(|d| d.name.as_str())
        .filter(|n| formats.default.is_none() && !formats.per_format.contains_key(*n))
        .collect();
    if !unset.is_empty() {
        missing.push(format!(
            "--format-skip-ahead NAME=N for format(s) {}, in counter values (or a bare N for every format)",
            unset.join(", ")
        ));
    }
    if !missing.is_empty() {
        bail!("{}", refusal(a, info, now_ms, &missing));
    }
    let skip = a.skip_ahead.unwrap_or(0);
    formats.default = Some(format_restore::new_format_margin(&formats));
    Ok(snapshot::Margins {
        skip_ahead: skip,
        strict: a.strict_skip_ahead.unwrap_or(skip),
        formats,
    })
}

/// Why a restore from a backup without margins is refused, and what the
/// backup knows: never a margin, since nothing in it bounds what was
/// issued after it.
fn refusal(
    a: &RestoreArgs,
    info: &snapshot::SnapshotInfo,
    now_ms: u64,
    missing: &[String],
) -> String {
    let mut out = format!(
        "{} is a backup: idgen cannot know how much the node handed out after it was taken (rates measured before a backup do not bound what came after), so it will not propose a margin. State margins that cover everything the node issued from the backup until it stopped (a larger margin only wastes numbers; a smaller one repeats IDs):",
        a.backup.display()
    );
    for m in missing {
        out.push_str(&format!("\n  {m}"));
    }
    out.push_str("\nWhat the backup knows:");
    for line in snapshot::facts(info, now_ms) {
        out.push_str(&format!("\n  {line}"));
    }
    for f in format_restore::format_facts(info, now_ms) {
        out.push_str(&format!("\n  {}", f.line()));
    }
    out.push_str("\nA restore that needs no margin: from the node's mirror (store.mirror_path), written before every reservation's IDs were handed out, or from a rescue snapshot of a node that lost its file while running.");
    out
}

/// Refuses a `--format-skip-ahead NAME=N` for a format the snapshot does
/// not define.
fn known_formats(
    given: &format_restore::FormatMargins,
    info: &snapshot::SnapshotInfo,
) -> anyhow::Result<()> {
    for name in given.per_format.keys() {
        if !info.format_defs.iter().any(|d| &d.name == name) {
            let known: Vec<&str> = info.format_defs.iter().map(|d| d.name.as_str()).collect();
            bail!("--format-skip-ahead {name}=...: the snapshot defines no format {name:?} (it defines {known:?})");
        }
    }
    Ok(())
}

/// What the restore did to formatted counters; formats whose counter
/// cannot hold their margin are named, with what to do.
fn print_formats(r: &snapshot::RestoreReport, new_margin: u64) {
    for f in &r.formats {
        println!(
            "format {}: {} counters moved forward by {}; its new counters in periods up to the restore start {} above their minimum",
            f.name, f.counters, f.margin, f.margin
        );
        if let Some(why) = &f.too_narrow {
            eprintln!("warning: {why}");
        }
    }
    println!("formats created after the restore that the backup does not define start {new_margin} above their minimum in periods up to the restore (the lost node may have created one after the backup; override with --format-skip-ahead <N>); one whose counter cannot hold that is refused at creation, unless created with `idgen admin formats create --fresh` (your assertion that the name never issued an ID)");
}
