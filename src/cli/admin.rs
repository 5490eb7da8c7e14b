//! `idgen admin`: a thin client of `idgen.v1.Admin`. Each command group
//! (`tags`, `holders`, `release`, `strict`, `layout`) has its function;
//! each prints its answer as text or, with `--json`, as JSON (IDs as
//! decimal strings).

use anyhow::{bail, Context};
use serde_json::{json, Value};
use tonic::metadata::MetadataValue;
use tonic::Request;

use std::time::Duration;

use idgen::cluster::holders::MAX_LOCK_DELAY;
use idgen::proto::{self, admin_client::AdminClient, HolderKind};

use super::args::{
    AdminArgs, AdminCommand, DatacentersCommand, LayoutCommand, ReleaseArgs, StrictCommand,
    TagsCommand,
};
use super::client::{failed, Bearer, Client, Out};
use super::output::outln;

/// The admin token from --token, --token-file, IDGEN_ADMIN__TOKEN or the
/// deprecated IDGEN_ADMIN_TOKEN.
fn admin_token(a: &AdminArgs) -> anyhow::Result<Option<String>> {
    admin_token_from(a.admin_token.as_deref(), a.admin_token_file.as_deref())
}

/// The admin token: the inline flag, else the file flag, else the
/// environment. The variable is read here rather than by clap, because
/// clap counts a variable as a given flag: `IDGEN_ADMIN__TOKEN` exported
/// (as the Admin API section says) then made every `--token-file` a
/// conflict with a `--token` nobody typed. A flag on the command line is
/// the caller's choice for this one call, so it wins over the variable.
pub fn admin_token_from(
    token: Option<&str>,
    token_file: Option<&std::path::Path>,
) -> anyhow::Result<Option<String>> {
    token_from(token, token_file, |name| std::env::var(name).ok())
}

/// [`admin_token_from`] with the environment as `var`.
fn token_from(
    token: Option<&str>,
    token_file: Option<&std::path::Path>,
    var: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<String>> {
    if let Some(t) = token {
        return Ok(Some(t.trim().to_owned()));
    }
    if let Some(path) = token_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the admin token file {}", path.display()))?;
        let t = text.trim();
        if t.is_empty() {
            bail!("the admin token file {} is empty", path.display());
        }
        return Ok(Some(t.to_owned()));
    }
    // An empty variable is no token, as an unset one.
    let set = |name: &str| var(name).filter(|t| !t.trim().is_empty());
    if let Some(t) = set("IDGEN_ADMIN__TOKEN") {
        return Ok(Some(t.trim().to_owned()));
    }
    Ok(set("IDGEN_ADMIN_TOKEN").map(|t| {
        eprintln!("warning: IDGEN_ADMIN_TOKEN is deprecated; set IDGEN_ADMIN__TOKEN, the name the server reads too");
        t.trim().to_owned()
    }))
}

/// `request` carrying `authorization: Bearer <token>` (marked sensitive)
/// when a token is given: a non-admin call (DecodeId, ParseFormatted) that
/// asks the node to reveal a hidden ID.
pub fn with_bearer<T>(mut request: Request<T>, token: Option<&str>) -> anyhow::Result<Request<T>> {
    if let Some(t) = token {
        let mut v = MetadataValue::try_from(format!("Bearer {t}"))
            .map_err(|_| anyhow::anyhow!("the admin token has characters a header cannot carry"))?;
        v.set_sensitive(true);
        request.metadata_mut().insert("authorization", v);
    }
    Ok(request)
}

async fn connect(a: &AdminArgs) -> anyhow::Result<Client> {
    connect_to(&a.addr, admin_token(a)?, call_timeout(a), &a.tls).await
}

/// `--timeout`, raised for the calls that wait out a lock-delay (a forced
/// release: up to [`MAX_LOCK_DELAY`]) or move every counter (skip-ahead):
/// cut short by the default 5 s, they went on on the node (each runs to its
/// end on its own task) while the command reported DEADLINE_EXCEEDED.
fn call_timeout(a: &AdminArgs) -> Duration {
    let long = match &a.command {
        AdminCommand::Release(r) => r.force,
        AdminCommand::Datacenters(DatacentersCommand::Release { force, .. }) => *force,
        AdminCommand::SkipAhead { .. } => true,
        _ => false,
    };
    if long {
        a.timeout.max(MAX_LOCK_DELAY + Duration::from_secs(15))
    } else {
        a.timeout
    }
}

/// An admin client of `addr`, sending `admin_token` as a bearer token; the
/// connection and every call are bounded by `timeout`.
pub async fn connect_to(
    addr: &str,
    admin_token: Option<String>,
    timeout: std::time::Duration,
    tls: &super::args::TlsArgs,
) -> anyhow::Result<Client> {
    let header = match admin_token {
        Some(t) => {
            let mut v = MetadataValue::try_from(format!("Bearer {t}")).map_err(|_| {
                anyhow::anyhow!(
                    "the admin token has characters a header cannot carry (use printable ASCII)"
                )
            })?;
            // Kept out of HTTP/2 header compression tables.
            v.set_sensitive(true);
            Some(v)
        }
        None => None,
    };
    let channel = super::client::channel(addr, timeout, tls).await?;
    Ok(AdminClient::with_interceptor(channel, Bearer(header)))
}

/// A tag as `--json` prints it: `hide` is `null` for a plain tag, so a
/// script can tell the two apart (a hidden tag's IDs decode only with
/// `idgen decode ID --mode segment --tag TAG --addr NODE`).
fn tag_json(t: &proto::SegmentTag) -> Value {
    json!({
        "tag": t.tag,
        "max_id": t.max_id.to_string(),
        "step": t.step,
        "description": t.description,
        "created": t.created,
        "updated": t.updated,
        "hide": t.hide.as_ref().map(|h| json!({
            "key": h.key,
            "version_bits": h.version_bits,
            "domain_bits": h.domain_bits,
        })),
    })
}

fn tag_line(t: &proto::SegmentTag) -> String {
    let hide = t.hide.as_ref().map_or_else(
        || "none".to_owned(),
        |h| {
            format!(
                "key {} version_bits {} domain_bits {}",
                h.key, h.version_bits, h.domain_bits
            )
        },
    );
    format!(
        "{}\tmax_id {}\tstep {}\tcreated {}\tupdated {}\thide {hide}\tdescription {:?}",
        t.tag, t.max_id, t.step, t.created, t.updated, t.description
    )
}

fn kind_name(kind: i32) -> &'static str {
    match HolderKind::try_from(kind) {
        Ok(HolderKind::Worker) => "worker",
        Ok(HolderKind::LeaseToken) => "lease_token",
        Ok(HolderKind::FormatToken) => "format_token",
        _ => "unknown",
    }
}

fn holder_json(h: &proto::Holder) -> Value {
    json!({
        "kind": kind_name(h.kind),
        "datacenter": h.datacenter,
        "zone": h.zone,
        "id": h.id,
        "instance": h.instance,
        "address": h.address,
        "since": h.since,
        "session": h.session,
        "state": h.state,
        "reserved": h.reserved.to_string(),
        "lock_delay_ms": h.lock_delay_ms,
        "session_ttl_ms": h.session_ttl_ms,
        "space": h.space,
        "rendered": h.rendered,
    })
}

fn holder_line(h: &proto::Holder) -> String {
    let place = match HolderKind::try_from(h.kind) {
        Ok(HolderKind::LeaseToken) => format!("token {}/{}", h.zone, h.id),
        Ok(HolderKind::FormatToken) => {
            format!("format token {}/{} ({})", h.space, h.id, h.rendered)
        }
        _ => format!("worker {}/{}", h.datacenter, h.id),
    };
    format!(
        "{place}\t{}\tinstance {}\taddress {}\tsince {}\tsession {}",
        h.state,
        h.instance,
        h.address,
        h.since,
        if h.session.is_empty() {
            "-"
        } else {
            &h.session
        }
    )
}

fn layout_json(l: &proto::IdLayout) -> Value {
    json!({
        "preset": l.preset,
        "epoch": l.epoch,
        "epoch_ms": l.epoch_ms,
        "time_unit_ms": l.time_unit_ms,
        "time_bits": l.time_bits,
        "datacenter_bits": l.datacenter_bits,
        "worker_bits": l.worker_bits,
        "sequence_bits": l.sequence_bits,
    })
}

fn layout_line(l: &proto::IdLayout) -> String {
    format!(
        "preset {} / time {}x{}ms / datacenter {} / worker {} / sequence {} / epoch {}",
        l.preset,
        l.time_bits,
        l.time_unit_ms,
        l.datacenter_bits,
        l.worker_bits,
        l.sequence_bits,
        l.epoch
    )
}

fn record_out(r: &proto::GetLayoutResponse) -> anyhow::Result<(Value, String)> {
    let l = r
        .layout
        .as_ref()
        .context("the server answered without the layout")?;
    let mut text = format!(
        "generation {}{}: {}",
        r.generation,
        if r.changing {
            " (a change is being checked)"
        } else {
            ""
        },
        layout_line(l)
    );
    if r.floor_ms > 0 {
        text.push_str(&format!("\nstarts no lower than {} ms", r.floor_ms));
    }
    let mut history = Vec::new();
    for h in &r.history {
        if let Some(hl) = &h.layout {
            text.push_str(&format!(
                "\nearlier: generation {}: {} (replaced at {} ms, IDs up to {})",
                h.generation,
                layout_line(hl),
                h.replaced_ms,
                h.max_id
            ));
            history.push(json!({
                "generation": h.generation,
                "layout": layout_json(hl),
                "replaced_ms": h.replaced_ms,
                "max_id": h.max_id.to_string(),
            }));
        }
    }
    Ok((
        json!({
            "generation": r.generation,
            "layout": layout_json(l),
            "floor_ms": r.floor_ms,
            "changing": r.changing,
            "history": history,
        }),
        text,
    ))
}

fn tag_of(t: Option<proto::SegmentTag>) -> anyhow::Result<proto::SegmentTag> {
    t.context("the server answered without the tag")
}

/// Runs one admin command and prints its answer.
pub async fn run(a: AdminArgs) -> anyhow::Result<()> {
    if let AdminCommand::SkipAhead {
        margin,
        config: Some(path),
    } = &a.command
    {
        return skip_ahead_offline(path, *margin, a.json).await;
    }
    let mut c = connect(&a).await?;
    let out = match &a.command {
        AdminCommand::Tags(cmd) => tags(&mut c, cmd).await?,
        AdminCommand::Holders => holders(&mut c).await?,
        AdminCommand::Release(r) => release(&mut c, r, a.json).await?,
        AdminCommand::Renew { session } => renew(&mut c, session).await?,
        AdminCommand::Strict(cmd) => strict(&mut c, cmd).await?,
        AdminCommand::Layout(cmd) => layout(&mut c, cmd).await?,
        AdminCommand::Formats(cmd) => super::admin_formats::run(&mut c, cmd).await?,
        AdminCommand::Keys(cmd) => super::admin_hide_keys::run(&mut c, cmd).await?,
        AdminCommand::Datacenters(cmd) => {
            super::admin_datacenters::run(&mut c, cmd, a.json).await?
        }
        AdminCommand::SkipAhead { margin, .. } => skip_ahead(&mut c, *margin).await?,
    };
    if a.json {
        outln!("{}", out.0)?;
    } else {
        outln!("{}", out.1)?;
    }
    Ok(())
}

/// `admin tags create|update|get|list|delete`.
async fn tags(c: &mut Client, cmd: &TagsCommand) -> anyhow::Result<Out> {
    Ok(match cmd {
        TagsCommand::Create {
            tag,
            initial,
            step,
            description,
            hide_key,
            hide_version_bits,
            hide_domain_bits,
        } => {
            let r = c
                .create_tag(proto::CreateTagRequest {
                    tag: tag.clone(),
                    initial: *initial,
                    step: *step,
                    description: description.clone(),
                    hide: hide_key.as_ref().map(|key| proto::TagHide {
                        key: key.clone(),
                        version_bits: *hide_version_bits,
                        domain_bits: *hide_domain_bits,
                    }),
                })
                .await
                .map_err(failed)?
                .into_inner();
            let t = tag_of(r.tag)?;
            let mut text = format!("created {}", tag_line(&t));
            if !r.note.is_empty() {
                text.push_str(&format!("\nnote: {}", r.note));
            }
            (json!({"tag": tag_json(&t), "note": r.note}), text)
        }
        TagsCommand::Update {
            tag,
            step,
            description,
            max_id,
        } => update_tag(c, tag, *step, description, *max_id).await?,
        TagsCommand::Get { tag } => {
            let r = c
                .get_tag(proto::GetTagRequest { tag: tag.clone() })
                .await
                .map_err(failed)?
                .into_inner();
            let t = tag_of(r.tag)?;
            (json!({"tag": tag_json(&t)}), tag_line(&t))
        }
        TagsCommand::List => list_tags(c).await?,
        TagsCommand::Delete { tag } => {
            let r = c
                .delete_tag(proto::DeleteTagRequest { tag: tag.clone() })
                .await
                .map_err(failed)?
                .into_inner();
            (
                json!({"tag": r.tag, "max_id": r.max_id.to_string(), "note": r.note}),
                format!("deleted {} (max_id {})\nnote: {}", r.tag, r.max_id, r.note),
            )
        }
    })
}

/// `admin tags update`: at least one of step, description, max_id.
async fn update_tag(
    c: &mut Client,
    tag: &str,
    step: Option<u64>,
    description: &Option<String>,
    max_id: Option<u64>,
) -> anyhow::Result<Out> {
    if step.is_none() && description.is_none() && max_id.is_none() {
        bail!("nothing to change: pass --step, --description or --max-id");
    }
    let r = c
        .update_tag(proto::UpdateTagRequest {
            tag: tag.to_owned(),
            step,
            description: description.clone(),
            max_id,
        })
        .await
        .map_err(failed)?
        .into_inner();
    let t = tag_of(r.tag)?;
    Ok((
        json!({"tag": tag_json(&t)}),
        format!("updated {}", tag_line(&t)),
    ))
}

/// `admin tags list`; records the server could not read are warned about
/// on stderr and listed in the JSON.
async fn list_tags(c: &mut Client) -> anyhow::Result<Out> {
    let r = c
        .list_tags(proto::ListTagsRequest {})
        .await
        .map_err(failed)?
        .into_inner();
    let lines: Vec<String> = r.tags.iter().map(tag_line).collect();
    let text = if lines.is_empty() {
        "no tags".to_owned()
    } else {
        lines.join("\n")
    };
    for u in &r.unreadable {
        eprintln!(
            "warning: unreadable segment record {:?}: {}",
            u.key, u.error
        );
    }
    let unreadable: Vec<Value> = r
        .unreadable
        .iter()
        .map(|u| json!({"key": u.key, "error": u.error}))
        .collect();
    Ok((
        json!({"tags": r.tags.iter().map(tag_json).collect::<Vec<_>>(), "unreadable": unreadable}),
        text,
    ))
}

/// `admin holders`: who holds each worker id and lease token.
async fn holders(c: &mut Client) -> anyhow::Result<Out> {
    let r = c
        .list_holders(proto::ListHoldersRequest {})
        .await
        .map_err(failed)?
        .into_inner();
    let mut text = format!("backend {}", r.backend);
    for h in &r.holders {
        text.push('\n');
        text.push_str(&holder_line(h));
    }
    Ok((
        json!({
            "backend": r.backend,
            "holders": r.holders.iter().map(holder_json).collect::<Vec<_>>(),
        }),
        text,
    ))
}

/// The holder kind `--kind` names: `lease-token` (as printed,
/// `lease_token`; `token` is the older name, still accepted).
fn holder_kind(kind: &str) -> anyhow::Result<HolderKind> {
    Ok(match kind {
        "worker" => HolderKind::Worker,
        "lease-token" | "lease_token" | "token" => HolderKind::LeaseToken,
        "format_token" | "format-token" => HolderKind::FormatToken,
        other => bail!("--kind {other:?}: use worker, lease-token or format-token"),
    })
}

/// `admin release`: free a worker id, lease token or format token held in
/// Consul.
async fn release(c: &mut Client, r: &ReleaseArgs, json: bool) -> anyhow::Result<Out> {
    let kind = holder_kind(&r.kind)?;
    let which = |k: HolderKind| match k {
        HolderKind::Worker => "--datacenter",
        HolderKind::LeaseToken => "--zone",
        _ => "--space",
    };
    for (given, flag, owner) in [
        (r.datacenter.is_some(), "--datacenter", HolderKind::Worker),
        (r.zone.is_some(), "--zone", HolderKind::LeaseToken),
        (r.space.is_some(), "--space", HolderKind::FormatToken),
    ] {
        if given && kind != owner {
            bail!(
                "{flag} is not for --kind {}: it takes {}",
                r.kind,
                which(kind)
            );
        }
    }
    if kind == HolderKind::FormatToken && r.space.is_none() {
        bail!("--kind format-token needs --space (digits-2, alnum-3, uniq64...: the space `idgen admin holders` shows)");
    }
    if r.force && !json {
        eprintln!("releasing with --force: waiting out the holder's lock-delay (up to 60 s)...");
    }
    let resp = c
        .force_release(proto::ForceReleaseRequest {
            kind: kind as i32,
            datacenter: r.datacenter.unwrap_or(0),
            zone: r.zone.unwrap_or(0),
            id: r.id,
            force: r.force,
            space: r.space.clone().unwrap_or_default(),
        })
        .await
        .map_err(failed)?
        .into_inner();
    Ok((
        json!({
            "released": resp.released,
            "waited_ms": resp.waited_ms,
            "message": resp.message,
            "holder": resp.holder.as_ref().map(holder_json),
        }),
        resp.message,
    ))
}

/// `admin renew`: renew a holder's Consul session once.
async fn renew(c: &mut Client, session: &str) -> anyhow::Result<Out> {
    let r = c
        .renew_session(proto::RenewSessionRequest {
            session: session.to_owned(),
        })
        .await
        .map_err(failed)?
        .into_inner();
    Ok((
        json!({
            "session": r.session,
            "ttl_ms": r.ttl_ms,
            "message": r.message,
            "holders": r.holders.iter().map(holder_json).collect::<Vec<_>>(),
        }),
        r.message,
    ))
}

/// `admin skip-ahead --margin N`: move every counter of the cluster on.
async fn skip_ahead(c: &mut Client, margin: u64) -> anyhow::Result<Out> {
    let r = c
        .skip_ahead(proto::SkipAheadRequest { margin })
        .await
        .map_err(failed)?
        .into_inner();
    Ok((
        json!({
            "segments": r.segments,
            "strict": r.strict,
            "lease_tokens": r.lease_tokens,
            "format_counters": r.format_counters,
            "marks": r.marks,
            "until_ms": r.until_ms,
            "floor": r.floor,
            "runs": r.runs,
            "message": r.message,
        }),
        r.message,
    ))
}

/// `admin skip-ahead --margin N --config <file>`: the same moves as the
/// admin rpc, run from here against the Consul cluster `path` names.
async fn skip_ahead_offline(path: &std::path::Path, margin: u64, json: bool) -> anyhow::Result<()> {
    use idgen::id::Clock as _;
    let now = idgen::id::SystemClock.now_millis();
    let config = idgen::config::Config::load(Some(path), &Default::default(), now)?;
    let idgen::config::Backend::Consul(cluster) = &config.store.backend else {
        anyhow::bail!("skip-ahead moves the counters of a Consul cluster; {} uses the embedded store, whose restore is `idgen state restore <backup> --skip-ahead <N>`", path.display());
    };
    if margin == 0 {
        anyhow::bail!("give --margin N above the number of IDs any one counter handed out between the Consul snapshot and its restore");
    }
    let client = idgen::consul::ConsulClient::new(cluster.client.clone())?;
    let reserve_ms = u64::try_from(config.hwm.reserve.as_millis()).unwrap_or(u64::MAX);
    let r = idgen::store::skip_ahead::skip_ahead(&client, &cluster.keys, margin, now, reserve_ms)
        .await?;
    let record = r.record.unwrap_or_default();
    let message = r.summary(margin);
    if json {
        let v = json!({
            "segments": r.segments, "strict": r.strict, "lease_tokens": r.lease_tokens,
            "format_counters": r.format_counters, "marks": r.marks, "until_ms": record.until_ms,
            "floor": record.floor, "runs": record.runs, "message": message,
        });
        outln!("{v}")?;
    } else {
        outln!("{message}")?;
    }
    Ok(())
}

/// `admin strict set-step|get-step|list|keys|delete`.
async fn strict(c: &mut Client, cmd: &StrictCommand) -> anyhow::Result<Out> {
    Ok(match cmd {
        StrictCommand::SetStep { namespace, step } => {
            let r = c
                .set_strict_step(proto::SetStrictStepRequest {
                    namespace: namespace.clone(),
                    step: *step,
                })
                .await
                .map_err(failed)?
                .into_inner();
            (
                json!({"namespace": r.namespace, "step": r.step, "previous": r.previous}),
                format!(
                    "namespace {}: step {} (was {}); other nodes use it within 10 s",
                    r.namespace, r.step, r.previous
                ),
            )
        }
        StrictCommand::GetStep { namespace } => {
            let r = c
                .get_strict_step(proto::GetStrictStepRequest {
                    namespace: namespace.clone(),
                })
                .await
                .map_err(failed)?
                .into_inner();
            let origin = if r.stored { "set" } else { "server default" };
            (
                json!({"namespace": r.namespace, "step": r.step, "stored": r.stored}),
                format!("namespace {}: step {} ({origin})", r.namespace, r.step),
            )
        }
        StrictCommand::List => strict_namespaces(c).await?,
        StrictCommand::Keys { namespace } => strict_keys(c, namespace).await?,
        StrictCommand::Delete { key } => {
            let r = c
                .delete_strict_key(proto::DeleteStrictKeyRequest { key: key.clone() })
                .await
                .map_err(failed)?
                .into_inner();
            (
                json!({"key": r.key, "last_value": r.last_value.to_string(), "note": r.note}),
                r.note,
            )
        }
    })
}

/// `admin strict list`: namespaces with a stored step or a live key.
async fn strict_namespaces(c: &mut Client) -> anyhow::Result<Out> {
    let r = c
        .list_strict_namespaces(proto::ListStrictNamespacesRequest {})
        .await
        .map_err(failed)?
        .into_inner();
    let mut text = format!("default step {}", r.default_step);
    for n in &r.namespaces {
        let default = if n.step_stored { "" } else { " (default)" };
        text.push_str(&format!("\n{}\tstep {}{default}", n.namespace, n.step));
    }
    let list: Vec<Value> = r
        .namespaces
        .iter()
        .map(|n| json!({"namespace": n.namespace, "step": n.step, "step_stored": n.step_stored}))
        .collect();
    Ok((
        json!({"namespaces": list, "default_step": r.default_step}),
        text,
    ))
}

/// `admin strict keys`: a namespace's live keys and their last values,
/// then its deleted keys (tombstones) and the last value each handed out
/// (the key used again continues above it). The store keeps no deletion
/// time for a strict key, so none is shown.
async fn strict_keys(c: &mut Client, namespace: &str) -> anyhow::Result<Out> {
    let r = c
        .list_strict_keys(proto::ListStrictKeysRequest {
            namespace: namespace.to_owned(),
        })
        .await
        .map_err(failed)?
        .into_inner();
    let mut text = format!(
        "namespace {}: {} live keys (limit {})",
        r.namespace,
        r.keys.len(),
        r.max_keys
    );
    for k in &r.keys {
        text.push_str(&format!("\n{}\t{}", k.key, k.value));
    }
    if !r.tombstones.is_empty() {
        text.push_str(&format!(
            "\n{} deleted keys (tombstones; used again, a key continues above its last value):",
            r.tombstones.len()
        ));
        for k in &r.tombstones {
            text.push_str(&format!("\n{}\tdeleted, last value {}", k.key, k.value));
        }
    }
    let pairs = |keys: &[proto::StrictKeyValue]| -> Vec<Value> {
        keys.iter()
            .map(|k| json!({"key": k.key, "value": k.value.to_string()}))
            .collect()
    };
    Ok((
        json!({
            "namespace": r.namespace,
            "keys": pairs(&r.keys),
            "max_keys": r.max_keys,
            "tombstones": pairs(&r.tombstones),
        }),
        text,
    ))
}

/// `admin layout get|set`.
async fn layout(c: &mut Client, cmd: &LayoutCommand) -> anyhow::Result<Out> {
    match cmd {
        LayoutCommand::Get => {
            let r = c
                .get_layout(proto::GetLayoutRequest {})
                .await
                .map_err(failed)?
                .into_inner();
            record_out(&r)
        }
        LayoutCommand::Set {
            preset,
            epoch,
            time_unit,
            time_bits,
            datacenter_bits,
            worker_bits,
            sequence_bits,
            expect_generation,
            yes,
        } => {
            if !yes {
                bail!("{LAYOUT_PROCEDURE}\nNothing was changed: run the command again with --yes (or --i-understand-this-fences) once the clients are ready");
            }
            let time_unit_ms = match time_unit {
                Some(d) if d.subsec_nanos() % 1_000_000 != 0 => {
                    bail!("--time-unit must be a whole number of milliseconds")
                }
                Some(d) => Some(d.as_millis() as u64),
                None => None,
            };
            let request = proto::SetLayoutRequest {
                preset: preset.clone(),
                epoch: epoch.clone(),
                time_unit_ms,
                time_bits: *time_bits,
                datacenter_bits: *datacenter_bits,
                worker_bits: *worker_bits,
                sequence_bits: *sequence_bits,
                expect_generation: expect_generation.unwrap_or(0),
            };
            set_layout(c, request).await
        }
    }
}

/// What `admin layout set` without `--yes` prints (docs/OPERATIONS.md#changing-the-cluster-layout
/// has the same steps).
const LAYOUT_PROCEDURE: &str = "changing the cluster layout fences every node still on the old layout: they stop issuing (clients get FAILED_PRECONDITION naming the change) until each is restarted with the new [layout]. It is a maintenance procedure:
  1. drain: point clients at nodes you will restart first, or accept that IDs pause until step 3;
  2. set: idgen admin layout set ... --yes (refused, changing nothing, if the new layout could repeat an ID);
  3. restart each node with the new [layout] (`idgen admin layout get` prints it); a node on the old layout refuses to start;
  4. verify: `idgen admin layout get` shows the new generation, and every node's /readyz answers ready.";

/// `admin layout set`: the new record, and what the change means for the
/// running nodes.
async fn set_layout(c: &mut Client, request: proto::SetLayoutRequest) -> anyhow::Result<Out> {
    let r = c.set_layout(request).await.map_err(failed)?.into_inner();
    let record = r
        .record
        .as_ref()
        .context("the server answered without the record")?;
    let (mut v, text) = record_out(record)?;
    v["old_max_id"] = json!(r.old_max_id.to_string());
    v["new_first_id"] = json!(r.new_first_id.to_string());
    Ok((
        v,
        format!(
            "layout changed: {text}\nevery earlier ID is at most {}; the new layout starts at {} or above\nnodes still on the old layout have stopped issuing (fenced, FAILED_PRECONDITION naming this change): restart every node with the new [layout], then check that each one's /readyz answers ready",
            r.old_max_id, r.new_first_id
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::token_from;
    use super::{holder_kind, kind_name, HolderKind};

    /// The glossary's word: a lease-mode holder is printed `lease_token`
    /// (as the console does), and `token`, its older name, still works as
    /// input.
    #[test]
    fn a_lease_token_holder_is_named_lease_token_and_token_still_reads() {
        assert_eq!(kind_name(HolderKind::LeaseToken as i32), "lease_token");
        for given in ["lease-token", "lease_token", "token"] {
            assert_eq!(holder_kind(given).unwrap(), HolderKind::LeaseToken);
        }
        assert_eq!(holder_kind("worker").unwrap(), HolderKind::Worker);
        let err = holder_kind("lease").unwrap_err().to_string();
        assert!(err.contains("lease-token"), "{err}");
    }

    /// The environment of a shell that exported both variables.
    fn exported(name: &str) -> Option<String> {
        match name {
            "IDGEN_ADMIN__TOKEN" => Some("from-env".into()),
            "IDGEN_ADMIN_TOKEN" => Some("from-old-env".into()),
            _ => None,
        }
    }

    #[test]
    fn a_flag_wins_over_the_environment_and_the_new_variable_over_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let got = |flag, path| token_from(flag, path, exported).unwrap();
        assert_eq!(got(Some("from-flag"), None).as_deref(), Some("from-flag"));
        assert_eq!(got(None, Some(&file)).as_deref(), Some("from-file"));
        assert_eq!(got(None, None).as_deref(), Some("from-env"));
        let old_only = |name: &str| exported(name).filter(|_| name == "IDGEN_ADMIN_TOKEN");
        assert_eq!(
            token_from(None, None, old_only).unwrap().as_deref(),
            Some("from-old-env")
        );
        let blank = |_: &str| Some("  ".to_owned());
        assert_eq!(token_from(None, None, blank).unwrap(), None);
    }
}
