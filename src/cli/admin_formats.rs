//! `idgen admin formats`: formatted-mode formats as durable objects
//! (`CreateFormat`, `UpdateFormat`, `GetFormat`, `ListFormats`,
//! `DeleteFormat`, `ReloadFormats`). A definition comes from a TOML or
//! JSON file, flags, or both, and is checked here before it is sent, so a
//! typo is reported without a round trip.

use anyhow::{bail, Context};
use serde_json::{json, Map, Value};

use idgen::id::format::FormatDef;
use idgen::proto;

use super::args::{FormatDefArgs, FormatsCommand};
use super::client::{failed, Client, Out};

/// Runs one `admin formats` command.
pub async fn run(c: &mut Client, cmd: &FormatsCommand) -> anyhow::Result<Out> {
    Ok(match cmd {
        FormatsCommand::Create { def, fresh } => {
            let definition_json = definition(def)?;
            let r = c
                .create_format(proto::CreateFormatRequest {
                    definition_json,
                    fresh: *fresh,
                })
                .await
                .map_err(failed)?
                .into_inner();
            let f = r.format.context("the server answered without the format")?;
            changed("created", &f, r.reload.as_ref(), None)
        }
        FormatsCommand::Update(args) => {
            let definition_json = definition(args)?;
            let r = c
                .update_format(proto::UpdateFormatRequest { definition_json })
                .await
                .map_err(failed)?
                .into_inner();
            let f = r.format.context("the server answered without the format")?;
            changed("updated", &f, r.reload.as_ref(), r.previous.as_ref())
        }
        FormatsCommand::Get { name } => {
            let r = c
                .get_format(proto::GetFormatRequest { name: name.clone() })
                .await
                .map_err(failed)?
                .into_inner();
            let f = r.format.context("the server answered without the format")?;
            (json!({"format": format_json(&f)}), format_text(&f))
        }
        FormatsCommand::List => list(c).await?,
        FormatsCommand::Delete { name } => {
            let r = c
                .delete_format(proto::DeleteFormatRequest { name: name.clone() })
                .await
                .map_err(failed)?
                .into_inner();
            let f = r.format.context("the server answered without the format")?;
            let (mut v, text) = changed("deleted", &f, r.reload.as_ref(), None);
            v["note"] = json!(r.note);
            (v, format!("{text}\nnote: {}", r.note))
        }
        FormatsCommand::Reload => {
            let r = c
                .reload_formats(proto::ReloadFormatsRequest {})
                .await
                .map_err(failed)?
                .into_inner();
            (reload_json(&r), reload_text(&r))
        }
    })
}

/// The definition as JSON: the file's keys, then the flags over them;
/// parsed as a `FormatDef` here so mistakes are caught before sending.
fn definition(a: &FormatDefArgs) -> anyhow::Result<String> {
    let mut map = match &a.file {
        Some(path) => read_file(path)?,
        None => Map::new(),
    };
    let mut set = |key: &str, v: Option<Value>| {
        if let Some(v) = v {
            map.insert(key.to_owned(), v);
        }
    };
    set("name", a.name.clone().map(Value::from));
    set("template", a.template.clone().map(Value::from));
    let lua = match &a.lua_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read --lua-file {}", p.display()))?,
        ),
        None => None,
    };
    set("lua", lua.map(Value::from));
    set("preset", a.preset.clone().map(Value::from));
    // Sent under the key every release reads (a newer node also reads
    // `time_zone`).
    set("zone", a.time_zone.clone().map(Value::from));
    set("reset", a.reset.clone().map(Value::from));
    set("min", a.min.map(Value::from));
    set("max", a.max.map(Value::from));
    set("step", a.step.map(Value::from));
    set("length", a.length.map(Value::from));
    set("description", a.description.clone().map(Value::from));
    set("hide", a.hide.then_some(Value::from(true)));
    set("hide_key", a.hide_key.clone().map(Value::from));
    if !a.scope_params.is_empty() {
        map.insert("scope_params".into(), json!(a.scope_params));
    }
    if !map.contains_key("name") {
        bail!("give the format's name (first argument, or `name` in --file)");
    }
    let value = Value::Object(map);
    let def: FormatDef = serde_json::from_value(value.clone())
        .context("not a format definition (keys as in a config file's [[formats]] entry)")?;
    Ok(serde_json::to_string(&def)?)
}

/// A definition file: JSON when named `.json`, else TOML (the keys alone,
/// or a file with one `[[formats]]` entry).
fn read_file(path: &std::path::Path) -> anyhow::Result<Map<String, Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --file {}", path.display()))?;
    let value: Value = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?
    } else {
        let t: toml::Value =
            toml::from_str(&text).with_context(|| format!("{} is not TOML", path.display()))?;
        serde_json::to_value(t)?
    };
    let value = match value {
        Value::Object(mut m) if m.contains_key("formats") => match m.remove("formats") {
            Some(Value::Array(mut entries)) if entries.len() == 1 => entries.remove(0),
            _ => bail!(
                "{}: [[formats]] must hold exactly one entry here",
                path.display()
            ),
        },
        other => other,
    };
    match value {
        Value::Object(m) => Ok(m),
        _ => bail!("{}: expected a table of definition keys", path.display()),
    }
}

fn format_json(f: &proto::FormatDefinition) -> Value {
    let definition: Value = serde_json::from_str(&f.definition_json)
        .unwrap_or(Value::String(f.definition_json.clone()));
    json!({
        "name": f.name,
        "definition": definition,
        "deleted": f.deleted,
        "source": f.source,
        "created": f.created,
        "updated": f.updated,
        "served": f.served,
    })
}

fn format_text(f: &proto::FormatDefinition) -> String {
    let state = if f.deleted {
        "deleted (tombstone)"
    } else if f.served {
        "served here"
    } else {
        "stored, not served here yet"
    };
    format!(
        "{}\t{state}\tsource {}\tcreated {}\tupdated {}\n  {}",
        f.name, f.source, f.created, f.updated, f.definition_json
    )
}

fn reload_json(r: &proto::ReloadFormatsResponse) -> Value {
    json!({"formats": r.formats, "changed": r.changed})
}

fn reload_text(r: &proto::ReloadFormatsResponse) -> String {
    format!(
        "serving {} format(s): {}; changed: {}",
        r.formats.len(),
        r.formats.join(", "),
        if r.changed.is_empty() {
            "none".to_owned()
        } else {
            r.changed.join(", ")
        }
    )
}

/// What a create, update or delete prints.
fn changed(
    what: &str,
    f: &proto::FormatDefinition,
    reload: Option<&proto::ReloadFormatsResponse>,
    previous: Option<&proto::FormatDefinition>,
) -> Out {
    let mut text = format!("{what} {}", format_text(f));
    if let Some(p) = previous {
        text.push_str(&format!("\nwas: {}", p.definition_json));
    }
    if let Some(r) = reload {
        text.push_str(&format!("\nthis node: {}", reload_text(r)));
    }
    (
        json!({
            "format": format_json(f),
            "previous": previous.map(format_json),
            "reload": reload.map(reload_json),
        }),
        text,
    )
}

/// `admin formats list`; unreadable records warned about on stderr.
async fn list(c: &mut Client) -> anyhow::Result<Out> {
    let r = c
        .list_formats(proto::ListFormatsRequest {})
        .await
        .map_err(failed)?
        .into_inner();
    for u in &r.unreadable {
        eprintln!(
            "warning: unreadable format definition {:?}: {}",
            u.key, u.error
        );
    }
    let text = if r.formats.is_empty() {
        "no formats".to_owned()
    } else {
        r.formats
            .iter()
            .map(format_text)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let unreadable: Vec<Value> = r
        .unreadable
        .iter()
        .map(|u| json!({"key": u.key, "error": u.error}))
        .collect();
    Ok((
        json!({"formats": r.formats.iter().map(format_json).collect::<Vec<_>>(), "unreadable": unreadable}),
        text,
    ))
}
