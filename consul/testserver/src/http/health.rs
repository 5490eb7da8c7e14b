//! Discovery: `/v1/health/service/<name>` and `/v1/catalog/services`, both
//! blocking on the catalog index.

use std::collections::{BTreeMap, BTreeSet};

use axum::http::Method;
use serde_json::{json, Value};

use super::agent::{check_json, service_json};
use super::{blocking_read, require_method, AgentContext, ApiRequest, ApiResult, Blocking, Reply};
use crate::state::catalog::HealthStatus;
use crate::state::session::SERF_HEALTH;

/// Every agent's node is on loopback.
const NODE_ADDRESS: &str = "127.0.0.1";

fn node_json(node: &str) -> Value {
    json!({
        "ID": "",
        "Node": node,
        "Address": NODE_ADDRESS,
        "Datacenter": "dc1",
        "TaggedAddresses": {"lan": NODE_ADDRESS, "wan": NODE_ADDRESS},
        "Meta": {},
    })
}

/// The always-passing node check every Consul node has.
fn serf_health_json(node: &str) -> Value {
    json!({
        "Node": node,
        "CheckID": SERF_HEALTH,
        "Name": "Serf Health Status",
        "Status": "passing",
        "Notes": "",
        "Output": "Agent alive and reachable",
        "ServiceID": "",
        "ServiceName": "",
        "ServiceTags": [],
        "Type": "",
    })
}

pub(super) async fn service(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::GET])?;
    let name = req.rest.as_str();
    let passing_only = req.query.flag("passing");
    let tags: Vec<&str> = req.query.get_all("tag").collect();
    let blocking = Blocking::from_query(&req.query)?;
    let readable = req.access.service_read(name);
    let (index, entries) = blocking_read(&agent.cluster, blocking, |st| {
        let mut entries = Vec::new();
        for (node, service, checks) in st.service_instances(name) {
            if !readable || !tags.iter().all(|t| service.tags.iter().any(|s| s == t)) {
                continue;
            }
            if passing_only && checks.iter().any(|c| c.status != HealthStatus::Passing) {
                continue;
            }
            let mut check_list = vec![serf_health_json(node)];
            check_list.extend(checks.iter().map(|c| check_json(node, c, Some(service))));
            entries.push(json!({
                "Node": node_json(node),
                "Service": service_json(service),
                "Checks": check_list,
            }));
        }
        (st.catalog_index(), entries)
    })
    .await;
    Ok(Reply::json(Value::Array(entries)).with_index(index))
}

pub(super) async fn catalog_services(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::GET])?;
    let blocking = Blocking::from_query(&req.query)?;
    let (index, services) = blocking_read(&agent.cluster, blocking, |st| {
        let mut services: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (_, node) in st.all_nodes() {
            for service in node.services.values() {
                if req.access.service_read(&service.name) {
                    services
                        .entry(service.name.clone())
                        .or_default()
                        .extend(service.tags.iter().cloned());
                }
            }
        }
        (st.catalog_index(), services)
    })
    .await;
    Ok(Reply::json(json!(services)).with_index(index))
}

/// `GET /v1/catalog/datacenters`: every linked datacenter, the local one
/// first and the others by name, as Consul's `GetDatacentersByDistance`
/// sorts them (the local one has no round trip; the emulator's others are
/// all equally far). A partitioned datacenter stays listed: Consul keeps
/// it until the WAN pool reaps its servers.
pub(super) fn catalog_datacenters(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::GET])?;
    let local = agent.cluster.datacenter.clone();
    let names: Vec<String> = std::iter::once(local.clone())
        .chain(
            agent
                .cluster
                .federation
                .names()
                .into_iter()
                .filter(|name| *name != local),
        )
        .collect();
    Ok(Reply::json(json!(names)))
}
