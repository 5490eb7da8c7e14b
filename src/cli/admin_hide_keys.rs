//! `idgen admin keys`: hide keys (`CreateHideKey`, `RotateHideKey`,
//! `RetireHideKey`, `ListHideKeys`). Output lists versions and states,
//! never key material (the node never sends it).

use anyhow::Context;
use serde_json::{json, Value};

use idgen::proto;

use super::args::KeysCommand;
use super::client::{failed, Client, Out};

/// Runs one `admin keys` command.
pub async fn run(c: &mut Client, cmd: &KeysCommand) -> anyhow::Result<Out> {
    let (what, r) = match cmd {
        KeysCommand::Create { key_id } => (
            "created",
            c.create_hide_key(proto::CreateHideKeyRequest {
                key_id: key_id.clone(),
            })
            .await,
        ),
        KeysCommand::Rotate { key_id, force } => (
            "rotated",
            c.rotate_hide_key(proto::RotateHideKeyRequest {
                key_id: key_id.clone(),
                force: *force,
            })
            .await,
        ),
        KeysCommand::Retire { key_id } => (
            "retired",
            c.retire_hide_key(proto::RetireHideKeyRequest {
                key_id: key_id.clone(),
            })
            .await,
        ),
        KeysCommand::List => return list(c).await,
    };
    let key = r
        .map_err(failed)?
        .into_inner()
        .key
        .context("the server answered without the key")?;
    Ok((
        json!({ what: key_json(&key) }),
        format!("{what} {}", key_text(&key)),
    ))
}

async fn list(c: &mut Client) -> anyhow::Result<Out> {
    let r = c
        .list_hide_keys(proto::ListHideKeysRequest {})
        .await
        .map_err(failed)?
        .into_inner();
    let text = if r.keys.is_empty() {
        "no hide keys; create one with `idgen admin keys create KEY_ID`".to_owned()
    } else {
        r.keys.iter().map(key_text).collect::<Vec<_>>().join("\n")
    };
    Ok((
        json!({"keys": r.keys.iter().map(key_json).collect::<Vec<_>>()}),
        text,
    ))
}

fn key_json(k: &proto::HideKey) -> Value {
    json!({
        "key_id": k.key_id,
        "active": k.active,
        "versions": k.versions.iter().map(|v| json!({
            "version": v.version,
            "state": v.state,
            "created_ms": v.created_ms,
            "created": v.created,
        })).collect::<Vec<_>>(),
    })
}

fn key_text(k: &proto::HideKey) -> String {
    let active = k.active.map_or_else(
        || "none (retired: rotate it to issue again)".to_owned(),
        |v| v.to_string(),
    );
    let mut out = format!("{}: active version {active}", k.key_id);
    for v in &k.versions {
        out.push_str(&format!(
            "\n  version {} {} (created {})",
            v.version, v.state, v.created
        ));
    }
    out
}
