//! `/v1/agent/*`: service registration with TTL and gRPC checks, check
//! updates, and the agent's own service and check lists.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::Method;
use serde_json::{json, Map, Value};

use super::{
    json_body, require_method, AgentContext, ApiError, ApiRequest, ApiResult, Fields, Reply,
};
use crate::config::MIN_CHECK_INTERVAL;
use crate::grpc_probe;
use crate::state::catalog::{
    Check, CheckDef, CheckDefKind, CheckKind, GrpcTls, HealthStatus, Service, ServiceDef,
};
use crate::state::StateError;

/// Consul's default gRPC check timeout.
const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::BadRequest(message.into())
}

fn parse_check(
    agent: &AgentContext,
    fields: Fields<'_>,
    default_id: String,
    service_name: &str,
) -> Result<CheckDef, ApiError> {
    let id = fields
        .str("CheckID")?
        .or(fields.str("ID")?)
        .filter(|s| !s.is_empty())
        .map_or(default_id, str::to_owned);
    let name = fields
        .str("Name")?
        .filter(|s| !s.is_empty())
        .map_or_else(|| format!("Service '{service_name}' check"), str::to_owned);
    let status = match fields.str("Status")? {
        None | Some("") => None,
        Some(text) => Some(
            HealthStatus::parse(text)
                .ok_or_else(|| bad(format!("Invalid check status {text:?}")))?,
        ),
    };
    let ttl = fields.duration("TTL")?.filter(|d| !d.is_zero());
    let grpc = fields.str("GRPC")?.filter(|s| !s.is_empty());
    let kind = match (ttl, grpc) {
        (Some(ttl), None) => CheckDefKind::Ttl(ttl),
        (None, Some(target)) => {
            let tls = if fields.bool("GRPCUseTLS")?.unwrap_or(false) {
                if fields.bool("TLSSkipVerify")?.unwrap_or(false) {
                    // Stricter than Consul: a check that trusts anything
                    // proves nothing in a test.
                    return Err(bad("TLSSkipVerify is not supported by consul-testserver"));
                }
                Some(GrpcTls {
                    server_name: fields.str("TLSServerName")?.unwrap_or("").to_owned(),
                })
            } else {
                None
            };
            let interval = fields
                .duration("Interval")?
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    bad(format!(
                        "Check {id:?}: Interval is required for GRPC checks"
                    ))
                })?
                // Consul raises it to `checks.MinInterval` (with a warning).
                .max(MIN_CHECK_INTERVAL);
            let timeout = fields
                .duration("Timeout")?
                .filter(|d| !d.is_zero())
                .unwrap_or(DEFAULT_CHECK_TIMEOUT);
            let (address, service) = target.split_once('/').unwrap_or((target, ""));
            CheckDefKind::Grpc {
                target: address.to_owned(),
                service: service.to_owned(),
                interval,
                timeout,
                tls,
            }
        }
        (Some(_), Some(_)) => return Err(bad(format!("Check {id:?}: TTL and GRPC are exclusive"))),
        (None, None) => {
            return Err(bad(format!(
                "Check {id:?}: consul-testserver supports only TTL and GRPC checks"
            )))
        }
    };
    let deregister_after = fields
        .duration("DeregisterCriticalServiceAfter")?
        .filter(|d| !d.is_zero())
        .map(|d| d.max(agent.cluster.config.min_deregister_critical_after));
    Ok(CheckDef {
        id,
        name,
        notes: fields.str("Notes")?.unwrap_or("").to_owned(),
        status,
        kind,
        deregister_after,
    })
}

fn parse_service(agent: &AgentContext, body: &Value) -> Result<ServiceDef, ApiError> {
    let fields = Fields::of(body, "service")?;
    let name = fields
        .str("Name")?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("Missing service name"))?
        .to_owned();
    let id = fields
        .str("ID")?
        .filter(|s| !s.is_empty())
        .unwrap_or(&name)
        .to_owned();
    let port = fields.u64("Port")?.unwrap_or(0);
    let port = u16::try_from(port).map_err(|_| bad(format!("Invalid port {port}")))?;
    let mut meta = BTreeMap::new();
    if let Some(m) = fields.object("Meta")? {
        for (k, v) in m.entries() {
            let v = v
                .as_str()
                .ok_or_else(|| bad(format!("Meta value for {k:?} must be a string")))?;
            meta.insert(k.clone(), v.to_owned());
        }
    }
    let mut defs: Vec<Fields<'_>> = Vec::new();
    if let Some(check) = fields.object("Check")? {
        defs.push(check);
    }
    for item in fields.list("Checks")?.into_iter().flatten() {
        defs.push(Fields::of(item, "check")?);
    }
    let single = defs.len() == 1;
    let checks = defs
        .into_iter()
        .enumerate()
        .map(|(n, check)| {
            let default_id = if single {
                format!("service:{id}")
            } else {
                format!("service:{id}:{}", n + 1)
            };
            parse_check(agent, check, default_id, &name)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ServiceDef {
        id,
        name,
        tags: fields.str_list("Tags")?.unwrap_or_default(),
        address: fields.str("Address")?.unwrap_or("").to_owned(),
        port,
        meta,
        checks,
    })
}

pub(super) fn register(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::PUT])?;
    let body = json_body(&req.body)?;
    let def = parse_service(agent, &body)?;
    if !req.access.service_write(&def.name) {
        return Err(ApiError::PermissionDenied);
    }
    let replace = req.query.flag("replace-existing-checks");
    let now = Instant::now();
    let probes = agent
        .cluster
        .write(|st| st.register_service(&agent.name, def, replace, now))?;
    for probe in probes {
        grpc_probe::spawn(Arc::clone(&agent.cluster), probe);
    }
    Ok(Reply::empty())
}

/// The name of the service `service_id` on this agent, for ACL checks.
fn service_name(agent: &AgentContext, service_id: &str) -> Option<String> {
    agent.cluster.read(|st| {
        st.node_state(&agent.name)?
            .services
            .get(service_id)
            .map(|s| s.name.clone())
    })
}

pub(super) fn deregister(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::PUT])?;
    let id = req.rest.as_str();
    let name = service_name(agent, id)
        .ok_or_else(|| ApiError::State(StateError::UnknownService(id.to_owned())))?;
    if !req.access.service_write(&name) {
        return Err(ApiError::PermissionDenied);
    }
    let now = Instant::now();
    agent
        .cluster
        .write(|st| st.deregister_service(&agent.name, id, now))?;
    Ok(Reply::empty())
}

/// `pass|warn|fail/<id>?note=` and `update/<id>` with `{"Status","Output"}`.
pub(super) fn update_check(agent: &AgentContext, endpoint: &str, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::PUT])?;
    let check_id = req.rest.as_str();
    let (status, output) = match endpoint {
        "agent/check/pass" => (HealthStatus::Passing, None),
        "agent/check/warn" => (HealthStatus::Warning, None),
        "agent/check/fail" => (HealthStatus::Critical, None),
        _ => {
            let body = json_body(&req.body)?;
            let fields = Fields::of(&body, "check update")?;
            let text = fields.str("Status")?.unwrap_or("");
            let status = HealthStatus::parse(text)
                .ok_or_else(|| bad(format!("Invalid check status: {text:?}")))?;
            (status, Some(fields.str("Output")?.unwrap_or("").to_owned()))
        }
    };
    let output = output.unwrap_or_else(|| req.query.get("note").unwrap_or("").to_owned());
    let owner = agent.cluster.read(|st| {
        let node = st.node_state(&agent.name)?;
        let check = node.checks.get(check_id)?;
        node.services.get(&check.service_id).map(|s| s.name.clone())
    });
    let Some(owner) = owner else {
        return Err(StateError::NoTtlCheck(check_id.to_owned()).into());
    };
    if !req.access.service_write(&owner) {
        return Err(ApiError::PermissionDenied);
    }
    let now = Instant::now();
    agent
        .cluster
        .write(|st| st.update_ttl_check(&agent.name, check_id, status, output, now))?;
    Ok(Reply::empty())
}

pub(crate) fn service_json(service: &Service) -> Value {
    json!({
        "ID": service.id,
        "Service": service.name,
        "Tags": service.tags,
        "Address": service.address,
        "Meta": service.meta,
        "Port": service.port,
        "Weights": {"Passing": 1, "Warning": 1},
        "EnableTagOverride": false,
        "CreateIndex": service.create_index,
        "ModifyIndex": service.modify_index,
    })
}

pub(crate) fn check_json(node: &str, check: &Check, service: Option<&Service>) -> Value {
    let mut v = json!({
        "Node": node,
        "CheckID": check.id,
        "Name": check.name,
        "Status": check.status.as_str(),
        "Notes": check.notes,
        "Output": check.output,
        "ServiceID": check.service_id,
        "ServiceName": service.map_or("", |s| s.name.as_str()),
        "ServiceTags": service.map_or(&[][..], |s| s.tags.as_slice()),
        "Type": check.kind_name(),
        "CreateIndex": check.create_index,
        "ModifyIndex": check.modify_index,
    });
    if let (
        CheckKind::Grpc {
            target,
            service,
            interval,
            timeout,
            tls,
            ..
        },
        Some(obj),
    ) = (&check.kind, v.as_object_mut())
    {
        obj.insert("GRPC".into(), format!("{target}/{service}").into());
        obj.insert("GRPCUseTLS".into(), tls.is_some().into());
        if let Some(tls) = tls {
            obj.insert("TLSServerName".into(), tls.server_name.clone().into());
            obj.insert("TLSSkipVerify".into(), false.into());
        }
        obj.insert("Interval".into(), crate::duration::format(*interval).into());
        obj.insert("Timeout".into(), crate::duration::format(*timeout).into());
    }
    v
}

pub(super) fn services(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::GET])?;
    let out = agent.cluster.read(|st| {
        let mut out = Map::new();
        for service in st
            .node_state(&agent.name)
            .into_iter()
            .flat_map(|n| n.services.values())
        {
            if req.access.service_read(&service.name) {
                out.insert(service.id.clone(), service_json(service));
            }
        }
        out
    });
    Ok(Reply::json(Value::Object(out)))
}

pub(super) fn checks(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::GET])?;
    let out = agent.cluster.read(|st| {
        let mut out = Map::new();
        if let Some(node) = st.node_state(&agent.name) {
            for check in node.checks.values() {
                let service = node.services.get(&check.service_id);
                if service.is_some_and(|s| req.access.service_read(&s.name)) {
                    out.insert(check.id.clone(), check_json(&agent.name, check, service));
                }
            }
        }
        out
    });
    Ok(Reply::json(Value::Object(out)))
}

/// The Consul version the test server reports in `/v1/agent/self`: the
/// API it imitates was checked against this release's source.
pub(crate) const CONSUL_VERSION: &str = "1.21.5";

/// `GET /v1/agent/self`: the agent's configuration and its serf member, in
/// the shape Consul answers (clients read `Config.Datacenter`,
/// `Config.NodeName` and `Config.Version` from it). A server agent in dev
/// mode, one per node name.
pub(super) fn agent_self(agent: &AgentContext, req: ApiRequest) -> ApiResult {
    require_method(&req, &[Method::GET])?;
    let node_id = node_id(&agent.name);
    Ok(Reply::json(json!({
        "Config": {
            "Datacenter": agent.cluster.datacenter,
            "PrimaryDatacenter": agent.cluster.federation.primary,
            "NodeName": agent.name,
            "NodeID": node_id,
            "Revision": "consul-testserver",
            "Server": true,
            "Version": CONSUL_VERSION,
            "BuildDate": "2025-01-01T00:00:00Z",
        },
        "DebugConfig": {},
        "Coord": null,
        "Member": {
            "Name": agent.name,
            "Addr": "127.0.0.1",
            "Port": 8301,
            "Tags": {
                "dc": agent.cluster.datacenter,
                "role": "consul",
                "id": node_id,
                "build": format!("{CONSUL_VERSION}:consul-testserver"),
            },
            "Status": 1,
            "ProtocolMin": 1,
            "ProtocolMax": 5,
            "ProtocolCur": 2,
            "DelegateMin": 2,
            "DelegateMax": 5,
            "DelegateCur": 4,
        },
        "Stats": {"agent": {"checks": "0", "services": "0"}},
        "Meta": {"consul-network-segment": ""},
        "xDS": null,
    })))
}

/// A stable, UUID-shaped node id derived from the node name.
fn node_id(name: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut halves = [0u64; 2];
    for (salt, half) in halves.iter_mut().enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (salt, name).hash(&mut h);
        *half = h.finish();
    }
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&halves[0].to_be_bytes());
    bytes[8..].copy_from_slice(&halves[1].to_be_bytes());
    super::uuid_text(bytes)
}
