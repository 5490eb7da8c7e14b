//! `idgen admin datacenters`: the datacenter id claims held in the primary
//! Consul datacenter (`ListDatacenters`) and their release
//! (`ReleaseDatacenter`, rule 44).

use serde_json::{json, Value};

use idgen::proto;

use super::args::DatacentersCommand;
use super::client::{failed, Client, Out};

/// Runs one `admin datacenters` command.
pub async fn run(c: &mut Client, cmd: &DatacentersCommand, json: bool) -> anyhow::Result<Out> {
    match cmd {
        DatacentersCommand::List => list(c).await,
        DatacentersCommand::Release { id, force } => release(c, *id, *force, json).await,
    }
}

fn claim_json(c: &proto::DatacenterClaim) -> Value {
    json!({
        "id": c.id,
        "consul_datacenter": c.consul_datacenter,
        "cluster": c.cluster,
        "claimed_by": c.claimed_by,
        "claimed": c.claimed,
        "state": c.state,
        "floor_ms": c.floor_ms,
    })
}

fn claim_line(c: &proto::DatacenterClaim) -> String {
    let floor = if c.floor_ms > 0 {
        format!(" floor {} ms", c.floor_ms)
    } else {
        String::new()
    };
    format!(
        "datacenter {} {} by Consul datacenter {} (cluster {}, claimed by {} at {}){floor}",
        c.id, c.state, c.consul_datacenter, c.cluster, c.claimed_by, c.claimed
    )
}

async fn list(c: &mut Client) -> anyhow::Result<Out> {
    let r = c
        .list_datacenters(proto::ListDatacentersRequest {})
        .await
        .map_err(failed)?
        .into_inner();
    let mut text = format!("primary {}", r.primary);
    if r.claims.is_empty() {
        text.push_str(
            "\nno datacenter id claimed yet (the first node of a datacenter claims its id)",
        );
    }
    for claim in &r.claims {
        text.push('\n');
        text.push_str(&claim_line(claim));
    }
    for u in &r.unreadable {
        text.push_str(&format!("\nunreadable {}: {}", u.key, u.error));
    }
    Ok((
        json!({
            "primary": r.primary,
            "claims": r.claims.iter().map(claim_json).collect::<Vec<_>>(),
            "unreadable": r.unreadable.iter().map(|u| json!({"key": u.key, "error": u.error})).collect::<Vec<_>>(),
        }),
        text,
    ))
}

async fn release(c: &mut Client, id: u64, force: bool, json: bool) -> anyhow::Result<Out> {
    if force && !json {
        eprintln!("releasing with --force: waiting out the owner's lock-delay (up to 60 s)...");
    }
    let r = c
        .release_datacenter(proto::ReleaseDatacenterRequest { id, force })
        .await
        .map_err(failed)?
        .into_inner();
    Ok((
        json!({
            "released": r.released,
            "message": r.message,
            "floor_ms": r.floor_ms,
            "waited_ms": r.waited_ms,
            "previous": r.previous.as_ref().map(claim_json),
        }),
        r.message,
    ))
}
