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
/// taken, and the fastest-moving counters (the margin a restore needs).
fn print_backup(file: &Path, size: usize) -> anyhow::Result<()> {
    let info = snapshot::inspect(file)?;
    let taken = std::time::UNIX_EPOCH + Duration::from_millis(info.taken_at_ms);
    println!(
        "wrote snapshot {} ({size} bytes), taken {}, layout [{}]",
        file.display(),
        humantime::format_rfc3339_millis(taken),
        info.layout
    );
    let mut fastest: Vec<(&String, &f64)> = info
        .rates
        .iter()
        .filter(|(k, r)| !k.starts_with("hwm/") && **r > 0.0)
        .collect();
    fastest.sort_by(|x, y| y.1.total_cmp(x.1));
    if info.taken_after_loss {
        println!("rescue snapshot: the node's state file was lost and it had stopped issuing; this covers everything it handed out (stop the node, then `idgen state restore`)");
    } else if !info.rates_known {
        println!("issue rates: not recorded (offline backup)");
    } else if fastest.is_empty() {
        println!("issue rates: no counter was moving");
    } else {
        for (k, r) in fastest.iter().take(5) {
            println!("issue rate {k}: {r:.1}/s");
        }
    }
    Ok(())
}

/// Recreates a lost state file from a snapshot, every counter moved
/// forward: segment, lease and strict by `--skip-ahead`, each format's by
/// its own margin.
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
    let suggestion = snapshot::suggest(&info, now_ms);
    let formats = format_restore::suggest_formats(&info, now_ms, config.formatted.block);
    let Some(skip) = a.skip_ahead else {
        bail!(
            "--skip-ahead is required: every segment, lease and strict counter must move past what the node handed out after this snapshot (each format's counters move by that format's own margin instead).\nsuggested: --skip-ahead {} ({}){}",
            suggestion.margin,
            suggestion.explanation,
            format_lines(&formats)
        );
    };
    if skip < suggestion.margin {
        eprintln!(
            "warning: --skip-ahead {skip} is below the suggested {} ({})",
            suggestion.margin, suggestion.explanation
        );
    }
    let mut margins = format_margins(&a.format_skip_ahead, &formats)?;
    let new_margin = margins
        .default
        .unwrap_or_else(|| format_restore::new_format_margin(&formats, config.formatted.block));
    margins.default = Some(new_margin);
    // Every worker's mark moves to at least now + reserve: a restart right
    // after a crash still starts above every ID the lost file covered.
    let hwm_floor_ms = now_ms.saturating_add(config.hwm.reserve.as_millis() as u64);
    let r = snapshot::restore_with_formats(
        &a.backup,
        &state_path,
        &layout,
        (skip, &margins),
        hwm_floor_ms,
    )?;
    println!(
        "restored {} from {} (taken {} ago): {} segment tags, {} lease token counters and {} strict counters moved forward by {skip}; counters the snapshot did not hold start above {}; {} high-water marks raised to at least {} ms",
        state_path.display(),
        a.backup.display(),
        humantime::format_duration(Duration::from_secs(
            now_ms.saturating_sub(info.taken_at_ms) / 1000
        )),
        r.segments,
        r.lease_tokens,
        r.strict_keys,
        r.floor,
        r.hwm_marks,
        r.hwm_floor_ms
    );
    print_formats(&r, new_margin);
    Ok(())
}

/// The suggested margin of each format, one line each.
fn format_lines(formats: &[format_restore::FormatSuggestion]) -> String {
    let mut out = String::new();
    for f in formats {
        let fit = match f.fits {
            Some(false) => " (does not fit its counter: see the restore report)",
            _ => "",
        };
        out.push_str(&format!(
            "\nformat {}: moves by {}{fit} ({}); override with --format-skip-ahead {}=<N>",
            f.name, f.margin, f.explanation, f.name
        ));
    }
    out
}

/// The margin of every format: the operator's (`--format-skip-ahead`),
/// else the suggested one. Refuses a name the snapshot does not define.
fn format_margins(
    given: &[String],
    suggested: &[format_restore::FormatSuggestion],
) -> anyhow::Result<format_restore::FormatMargins> {
    let given = format_restore::FormatMargins::parse(given).map_err(anyhow::Error::msg)?;
    for name in given.per_format.keys() {
        if !suggested.iter().any(|s| &s.name == name) {
            let known: Vec<&str> = suggested.iter().map(|s| s.name.as_str()).collect();
            bail!("--format-skip-ahead {name}=...: the snapshot defines no format {name:?} (it defines {known:?})");
        }
    }
    let mut margins = format_restore::FormatMargins::default();
    for s in suggested {
        let margin = given
            .per_format
            .get(&s.name)
            .copied()
            .or(given.default)
            .unwrap_or(s.margin);
        if margin < s.margin {
            eprintln!(
                "warning: format {}: --format-skip-ahead {margin} is below the suggested {} ({})",
                s.name, s.margin, s.explanation
            );
        }
        margins.per_format.insert(s.name.clone(), margin);
    }
    // A bare N is also the margin of formats created after the restore.
    margins.default = given.default;
    Ok(margins)
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
