//! `idgen decode`: split an ID into its parts, offline under the
//! configured layout, or with `--addr` by the node (DecodeId): a hidden
//! layout's IDs only a node with the key can reveal, and only to an admin.

use anyhow::bail;

use idgen::config::FileConfig;
use idgen::id::{Clock, Mode, SystemClock};
use idgen::modes::{decode_snowflake, Decoded};
use idgen::proto::{self, id_gen_client::IdGenClient};

use super::args::DecodeArgs;
use super::output::outln;

/// Prints the ID's fields (time, datacenter, worker, sequence; or zone,
/// token, sequence for lease IDs). Async because `--addr` calls a node on
/// `main`'s runtime: a runtime of its own here would be nested in that one,
/// which tokio refuses with a panic.
pub async fn run(a: DecodeArgs) -> anyhow::Result<()> {
    let Ok(id) = a.id.parse::<u64>() else {
        if idgen::id::Uuid::parse(a.id.trim()).is_ok() {
            return uuid(&a).await;
        }
        bail!(
            "{:?} is not a decimal 64-bit unsigned integer, nor a UUID (8-4-4-4-12, 32 hex digits or a 26-character ULID)",
            a.id
        );
    };
    if a.addr.is_some() {
        return online(&a, id).await;
    }
    let d = match Mode::parse(&a.mode)? {
        Mode::Snowflake => {
            let file = FileConfig::load(a.config.as_deref())?;
            let now = SystemClock.now_millis();
            let layout = file.layout(now)?;
            if !file.layout.hide.is_empty() {
                bail!(
                    "this config hides its snowflake IDs (layout.hide = {:?}): only a node with the key can decode them; use --addr NODE (and --admin-token for the internal parts)",
                    file.layout.hide
                );
            }
            if a.config.is_none() && layout == FileConfig::default().layout(now)? {
                // Nothing named a layout: say which one the fields below
                // come from, since an ID of another layout (js53, a
                // custom one) decodes to plausible but wrong fields.
                eprintln!(
                    "note: no --config given: decoded under the default layout [{layout}]; an ID made under another layout (js53, sonyflake, a custom one) decodes to wrong fields here. Pass --config FILE (or set IDGEN_CONFIG) naming the node's config, or ask the node with --addr NODE"
                );
            }
            decode_snowflake(&layout, id)?
        }
        Mode::Lease => idgen::modes::decode_lease(id)?,
        Mode::Segment => bail!("mode segment IDs are plain numbers with no fields to decode; a hidden tag's ID decodes only on a node with its key: idgen decode ID --mode segment --tag TAG --addr NODE (add --admin-token-file FILE for the internal value)"),
        other => bail!("mode {other} IDs are plain numbers with no fields to decode"),
    };
    print(&d, a.json)
}

/// DecodeId at `--addr`, with the admin token when given.
async fn online(a: &DecodeArgs, id: u64) -> anyhow::Result<()> {
    let mode = Mode::parse(&a.mode)?;
    let token =
        super::admin::admin_token_from(a.admin_token.as_deref(), a.admin_token_file.as_deref())?;
    let addr = a.addr.clone().unwrap_or_default();
    let channel = super::client::channel(&addr, a.timeout, &a.tls).await?;
    let mut client = IdGenClient::new(channel);
    let request = tonic::Request::new(proto::DecodeIdRequest {
        id,
        mode: proto_mode(mode) as i32,
        tag: a.tag.clone().unwrap_or_default(),
    });
    let request = super::admin::with_bearer(request, token.as_deref())?;
    let r = super::client::call(a.timeout, client.decode_id(request)).await?;
    let d = Decoded {
        id: r.id,
        mode: mode.as_str(),
        time: r.time,
        unix_millis: r.unix_millis,
        datacenter: u64::from(r.datacenter),
        worker: u64::from(r.worker),
        sequence: r.sequence,
        zone: (mode == Mode::Lease).then_some(u64::from(r.zone)),
        // A hidden zone's public view has no token.
        token: (mode == Mode::Lease && (r.hidden.is_empty() || r.internal_id.is_some()))
            .then_some(u64::from(r.token)),
        hidden: match r.hidden.as_str() {
            "sortable" => Some("sortable"),
            "opaque" => Some("opaque"),
            "zone" => Some("zone"),
            "tag" => Some("tag"),
            _ => None,
        },
        key_version: r.key_version,
        internal_id: r.internal_id,
    };
    match a.tag.as_deref() {
        Some(tag) if d.hidden == Some("tag") => print_tag_id(&d, tag, a.json),
        _ => print(&d, a.json),
    }
}

/// A hidden segment tag's ID: the tag, its key version, and for an admin
/// the internal value (the tag's counter).
fn print_tag_id(d: &Decoded, tag: &str, json: bool) -> anyhow::Result<()> {
    if json {
        let mut v = serde_json::to_value(d)?;
        if let Some(o) = v.as_object_mut() {
            // Only the fields a tag's ID has.
            for k in ["time", "unix_millis", "datacenter", "worker", "sequence"] {
                o.remove(k);
            }
            o.insert("tag".into(), tag.into());
        }
        outln!("{v}")?;
        return Ok(());
    }
    outln!(
        "id {}\ntag {tag}\nhidden tag\nkey version {}",
        d.id,
        d.key_version
            .map_or_else(|| "unknown".to_owned(), |v| v.to_string())
    )?;
    if let Some(internal) = d.internal_id {
        outln!("internal id {internal}")?;
    }
    Ok(())
}

fn proto_mode(mode: Mode) -> proto::Mode {
    match mode {
        Mode::Lease => proto::Mode::Lease,
        Mode::Segment => proto::Mode::Segment,
        Mode::Strict => proto::Mode::Strict,
        Mode::Snowflake => proto::Mode::Snowflake,
    }
}

fn print(d: &Decoded, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string(d)?)?;
    } else if let (Some(hidden), None, Some(zone)) = (d.hidden, d.internal_id, d.zone) {
        // A hidden lease zone's public view: the zone and key version.
        outln!(
            "id {}\nhidden {hidden}\nzone {zone}\nkey version {}",
            d.id,
            d.key_version.unwrap_or_default()
        )?;
    } else if d.hidden.is_some() && d.internal_id.is_none() {
        // The public view: what an anonymous caller may see.
        outln!(
            "id {}\nhidden {}\ntime {}\nkey version {}",
            d.id,
            d.hidden.unwrap_or_default(),
            if d.time.is_empty() { "hidden" } else { &d.time },
            d.key_version
                .map_or_else(|| "hidden".to_owned(), |v| v.to_string())
        )?;
    } else if let (Some(zone), Some(token)) = (d.zone, d.token) {
        outln!(
            "id {}\nzone {zone}\ntoken {token}\nsequence {}",
            d.id,
            d.sequence
        )?;
        print_revealed(d)?;
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
        print_revealed(d)?;
    }
    Ok(())
}

/// What an admin was shown of a hidden ID, after its internal parts.
fn print_revealed(d: &Decoded) -> anyhow::Result<()> {
    if let (Some(hidden), Some(internal)) = (d.hidden, d.internal_id) {
        outln!(
            "hidden {hidden}\nkey version {}\ninternal id {internal}",
            d.key_version.unwrap_or_default()
        )?;
    }
    Ok(())
}

/// A UUIDv7's parts: offline under the configured layout's datacenter and
/// worker widths, or with `--addr` by the node (DecodeUuid; a hidden
/// layout's internal parts with the admin token).
async fn uuid(a: &DecodeArgs) -> anyhow::Result<()> {
    let d = match &a.addr {
        Some(addr) => {
            let token = super::admin::admin_token_from(
                a.admin_token.as_deref(),
                a.admin_token_file.as_deref(),
            )?;
            let channel = super::client::channel(addr, a.timeout, &a.tls).await?;
            let mut client = IdGenClient::new(channel);
            let request = tonic::Request::new(proto::DecodeUuidRequest {
                text: a.id.clone(),
                uuid: Vec::new(),
            });
            let request = super::admin::with_bearer(request, token.as_deref())?;
            let r = super::client::call(a.timeout, client.decode_uuid(request)).await?;
            idgen::modes::uuid::DecodedUuid {
                uuid: r.uuid,
                ulid: r.ulid,
                time: r.time,
                unix_millis: r.unix_millis,
                datacenter: u64::from(r.datacenter),
                worker: u64::from(r.worker),
                counter: r.counter,
                hidden: (r.hidden == "sortable").then_some("sortable"),
                key_version: r.key_version,
                internal_uuid: (!r.internal_uuid.is_empty()).then_some(r.internal_uuid),
            }
        }
        None => {
            let file = FileConfig::load(a.config.as_deref())?;
            if !file.layout.hide.is_empty() {
                bail!(
                    "this config hides its IDs (layout.hide = {:?}), UUIDs included: only a node with the key can decode them; use --addr NODE (and --admin-token-file FILE for the internal parts)",
                    file.layout.hide
                );
            }
            let layout = file.layout(SystemClock.now_millis())?;
            idgen::modes::uuid::decode(&layout, &a.id)?
        }
    };
    if a.json {
        outln!("{}", serde_json::to_string(&d)?)?;
        return Ok(());
    }
    if let (Some(hidden), None) = (d.hidden, &d.internal_uuid) {
        // The public view of a hidden UUID: its time and key version only.
        outln!(
            "uuid {}\nulid {}\nhidden {hidden}\ntime {}\nunix_millis {}\nkey version {}",
            d.uuid,
            d.ulid,
            d.time,
            d.unix_millis,
            d.key_version
                .map_or_else(|| "?".to_owned(), |v| v.to_string())
        )?;
        return Ok(());
    }
    outln!(
        "uuid {}\nulid {}\ntime {}\nunix_millis {}\ndatacenter {}\nworker {}\ncounter {}",
        d.uuid,
        d.ulid,
        d.time,
        d.unix_millis,
        d.datacenter,
        d.worker,
        d.counter
    )?;
    if let Some(internal) = &d.internal_uuid {
        outln!(
            "internal uuid {internal}\nkey version {}",
            d.key_version.unwrap_or_default()
        )?;
    }
    Ok(())
}
