//! Nodes (one per agent), their services and health checks: registration,
//! TTL and gRPC check results, TTL expiry, and reaping services whose check
//! stayed critical for `DeregisterCriticalServiceAfter`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{ClusterState, StateError};

/// A health check status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HealthStatus {
    /// Healthy.
    Passing,
    /// Degraded; excluded by `?passing`.
    Warning,
    /// Unhealthy; invalidates sessions bound to the check.
    Critical,
}

impl HealthStatus {
    /// The wire form: `"passing"`, `"warning"` or `"critical"`.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Passing => "passing",
            HealthStatus::Warning => "warning",
            HealthStatus::Critical => "critical",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "passing" => Some(HealthStatus::Passing),
            "warning" => Some(HealthStatus::Warning),
            "critical" => Some(HealthStatus::Critical),
            _ => None,
        }
    }
}

/// A registered service with its checks, as returned by
/// [`TestConsul::services`](crate::TestConsul::services).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    /// The node (agent name) the service was registered through.
    pub node: String,
    /// Service instance id.
    pub id: String,
    /// Service name.
    pub name: String,
    /// Tags.
    pub tags: Vec<String>,
    /// Address (empty: use the node's).
    pub address: String,
    /// Port.
    pub port: u16,
    /// Metadata.
    pub meta: BTreeMap<String, String>,
    /// Worst status over the service's checks (passing when it has none).
    pub status: HealthStatus,
    /// The service's checks.
    pub checks: Vec<CheckInfo>,
}

/// One check of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckInfo {
    /// Check id, unique on its node.
    pub id: String,
    /// Check name.
    pub name: String,
    /// Current status.
    pub status: HealthStatus,
    /// Last output (a TTL update's note, or the gRPC probe's result).
    pub output: String,
    /// `"ttl"` or `"grpc"`.
    pub kind: &'static str,
}

#[derive(Debug, Clone)]
pub(crate) struct Service {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) tags: Vec<String>,
    pub(crate) address: String,
    pub(crate) port: u16,
    pub(crate) meta: BTreeMap<String, String>,
    pub(crate) create_index: u64,
    pub(crate) modify_index: u64,
}

#[derive(Debug, Clone)]
pub(crate) enum CheckKind {
    Ttl {
        ttl: Duration,
        expires_at: Option<Instant>,
    },
    Grpc {
        target: String,
        service: String,
        interval: Duration,
        timeout: Duration,
        /// `GRPCUseTLS`, with its `TLSServerName`.
        tls: Option<GrpcTls>,
        serial: u64,
    },
}

/// A gRPC check probed over TLS (`GRPCUseTLS: true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GrpcTls {
    /// `TLSServerName`; empty: the target's host, as Consul's Go client
    /// derives it.
    pub(crate) server_name: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Check {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) notes: String,
    pub(crate) service_id: String,
    pub(crate) status: HealthStatus,
    pub(crate) output: String,
    pub(crate) kind: CheckKind,
    pub(crate) deregister_after: Option<Duration>,
    pub(crate) critical_since: Option<Instant>,
    pub(crate) create_index: u64,
    pub(crate) modify_index: u64,
}

impl Check {
    pub(crate) fn kind_name(&self) -> &'static str {
        match self.kind {
            CheckKind::Ttl { .. } => "ttl",
            CheckKind::Grpc { .. } => "grpc",
        }
    }

    pub(crate) fn info(&self) -> CheckInfo {
        CheckInfo {
            id: self.id.clone(),
            name: self.name.clone(),
            status: self.status,
            output: self.output.clone(),
            kind: self.kind_name(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct NodeState {
    pub(crate) services: BTreeMap<String, Service>,
    pub(crate) checks: BTreeMap<String, Check>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Catalog {
    pub(crate) nodes: BTreeMap<String, NodeState>,
    /// Highest index of any service or check change.
    pub(crate) index: u64,
    next_serial: u64,
}

impl Catalog {
    pub(crate) fn has_node(&self, node: &str) -> bool {
        self.nodes.contains_key(node)
    }

    pub(crate) fn check_status(&self, node: &str, check_id: &str) -> Option<HealthStatus> {
        self.nodes.get(node)?.checks.get(check_id).map(|c| c.status)
    }
}

/// A validated check definition from a service registration.
#[derive(Debug, Clone)]
pub(crate) struct CheckDef {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) notes: String,
    pub(crate) status: Option<HealthStatus>,
    pub(crate) kind: CheckDefKind,
    pub(crate) deregister_after: Option<Duration>,
}

#[derive(Debug, Clone)]
pub(crate) enum CheckDefKind {
    Ttl(Duration),
    Grpc {
        target: String,
        service: String,
        interval: Duration,
        timeout: Duration,
        tls: Option<GrpcTls>,
    },
}

/// A validated `PUT /v1/agent/service/register` body.
#[derive(Debug, Clone)]
pub(crate) struct ServiceDef {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) tags: Vec<String>,
    pub(crate) address: String,
    pub(crate) port: u16,
    pub(crate) meta: BTreeMap<String, String>,
    pub(crate) checks: Vec<CheckDef>,
}

/// A gRPC check the I/O layer must start probing. The probe stops once
/// the check with this `serial` is gone (deregistered or re-registered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProbeSpec {
    pub(crate) node: String,
    pub(crate) check_id: String,
    pub(crate) serial: u64,
    pub(crate) target: String,
    pub(crate) service: String,
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
    pub(crate) tls: Option<GrpcTls>,
}

/// The check `def` registers for `service_id` on `node` at index `idx`,
/// and for a gRPC check the probe the I/O layer must start (numbered from
/// `next_serial`). Re-registering keeps a check's status and output unless
/// the definition sets a status, like Consul's agent does.
fn new_check(
    def: CheckDef,
    previous: Option<&Check>,
    node: &str,
    service_id: &str,
    idx: u64,
    now: Instant,
    next_serial: &mut u64,
) -> (Check, Option<ProbeSpec>) {
    let (status, output, critical_since, create_index) = match (def.status, previous) {
        (Some(status), prev) => (
            status,
            String::new(),
            (status == HealthStatus::Critical).then_some(now),
            prev.map_or(idx, |p| p.create_index),
        ),
        (None, Some(prev)) => (
            prev.status,
            prev.output.clone(),
            prev.critical_since,
            prev.create_index,
        ),
        (None, None) => (HealthStatus::Critical, String::new(), Some(now), idx),
    };
    let mut probe = None;
    let kind = match def.kind {
        CheckDefKind::Ttl(ttl) => CheckKind::Ttl {
            ttl,
            expires_at: Some(now + ttl),
        },
        CheckDefKind::Grpc {
            target,
            service,
            interval,
            timeout,
            tls,
        } => {
            *next_serial += 1;
            let serial = *next_serial;
            probe = Some(ProbeSpec {
                node: node.to_owned(),
                check_id: def.id.clone(),
                serial,
                target: target.clone(),
                service: service.clone(),
                interval,
                timeout,
                tls: tls.clone(),
            });
            CheckKind::Grpc {
                target,
                service,
                interval,
                timeout,
                tls,
                serial,
            }
        }
    };
    let check = Check {
        id: def.id,
        name: def.name,
        notes: def.notes,
        service_id: service_id.to_owned(),
        status,
        output,
        kind,
        deregister_after: def.deregister_after,
        critical_since,
        create_index,
        modify_index: idx,
    };
    (check, probe)
}

impl ClusterState {
    pub(crate) fn add_node(&mut self, node: &str) -> bool {
        if self.catalog.nodes.contains_key(node) {
            return false;
        }
        self.catalog
            .nodes
            .insert(node.to_owned(), NodeState::default());
        true
    }

    pub(crate) fn register_service(
        &mut self,
        node: &str,
        def: ServiceDef,
        replace_existing_checks: bool,
        now: Instant,
    ) -> Result<Vec<ProbeSpec>, StateError> {
        let idx = self.index + 1;
        let Some(state) = self.catalog.nodes.get_mut(node) else {
            return Err(StateError::UnknownNode(node.to_owned()));
        };
        let create_index = state.services.get(&def.id).map_or(idx, |s| s.create_index);
        let mut removed_checks = Vec::new();
        if replace_existing_checks {
            let keep: Vec<&str> = def.checks.iter().map(|c| c.id.as_str()).collect();
            removed_checks = state
                .checks
                .values()
                .filter(|c| c.service_id == def.id && !keep.contains(&c.id.as_str()))
                .map(|c| c.id.clone())
                .collect();
            for id in &removed_checks {
                state.checks.remove(id);
            }
        }
        let mut probes = Vec::new();
        for check in def.checks {
            let previous = state.checks.get(&check.id);
            let (check, probe) = new_check(
                check,
                previous,
                node,
                &def.id,
                idx,
                now,
                &mut self.catalog.next_serial,
            );
            probes.extend(probe);
            state.checks.insert(check.id.clone(), check);
        }
        state.services.insert(
            def.id.clone(),
            Service {
                id: def.id,
                name: def.name,
                tags: def.tags,
                address: def.address,
                port: def.port,
                meta: def.meta,
                create_index,
                modify_index: idx,
            },
        );
        self.catalog.index = idx;
        self.index = idx;
        for id in removed_checks {
            self.invalidate_sessions_bound_to(node, &id, now);
        }
        Ok(probes)
    }

    pub(crate) fn deregister_service(
        &mut self,
        node: &str,
        service_id: &str,
        now: Instant,
    ) -> Result<(), StateError> {
        let state = self
            .catalog
            .nodes
            .get_mut(node)
            .filter(|n| n.services.contains_key(service_id))
            .ok_or_else(|| StateError::UnknownService(service_id.to_owned()))?;
        state.services.remove(service_id);
        let removed: Vec<String> = state
            .checks
            .values()
            .filter(|c| c.service_id == service_id)
            .map(|c| c.id.clone())
            .collect();
        for id in &removed {
            state.checks.remove(id);
        }
        let idx = self.index + 1;
        self.catalog.index = idx;
        self.index = idx;
        for id in removed {
            self.invalidate_sessions_bound_to(node, &id, now);
        }
        Ok(())
    }

    /// `PUT /v1/agent/check/{pass,warn,fail,update}/<id>`: only TTL checks
    /// take updates.
    pub(crate) fn update_ttl_check(
        &mut self,
        node: &str,
        check_id: &str,
        status: HealthStatus,
        output: String,
        now: Instant,
    ) -> Result<(), StateError> {
        let check = self
            .catalog
            .nodes
            .get_mut(node)
            .and_then(|n| n.checks.get_mut(check_id))
            .ok_or_else(|| StateError::NoTtlCheck(check_id.to_owned()))?;
        match &mut check.kind {
            CheckKind::Ttl { ttl, expires_at } => *expires_at = Some(now + *ttl),
            CheckKind::Grpc { .. } => return Err(StateError::NoTtlCheck(check_id.to_owned())),
        }
        self.set_check_status(node, check_id, status, output, now);
        Ok(())
    }

    /// Records a check result. Only a status change is a catalog write (an
    /// output-only change is not synced right away by Consul's agent
    /// either), so steady heartbeats do not wake blocking health queries.
    fn set_check_status(
        &mut self,
        node: &str,
        check_id: &str,
        status: HealthStatus,
        output: String,
        now: Instant,
    ) {
        let idx = self.index + 1;
        let Some(check) = self
            .catalog
            .nodes
            .get_mut(node)
            .and_then(|n| n.checks.get_mut(check_id))
        else {
            return;
        };
        check.output = output;
        if check.status == status {
            return;
        }
        check.status = status;
        check.modify_index = idx;
        check.critical_since = (status == HealthStatus::Critical).then_some(now);
        self.catalog.index = idx;
        self.index = idx;
        if status == HealthStatus::Critical {
            self.invalidate_sessions_bound_to(node, check_id, now);
        }
    }

    /// Whether the gRPC check a probe task was started for still exists.
    pub(crate) fn probe_is_current(&self, node: &str, check_id: &str, serial: u64) -> bool {
        self.catalog
            .nodes
            .get(node)
            .and_then(|n| n.checks.get(check_id))
            .is_some_and(|c| matches!(c.kind, CheckKind::Grpc { serial: s, .. } if s == serial))
    }

    /// Applies a probe result, if the probed check is still current.
    pub(crate) fn record_probe(
        &mut self,
        probe: &ProbeSpec,
        status: HealthStatus,
        output: String,
        now: Instant,
    ) -> bool {
        if !self.probe_is_current(&probe.node, &probe.check_id, probe.serial) {
            return false;
        }
        self.set_check_status(&probe.node, &probe.check_id, status, output, now);
        true
    }

    pub(super) fn expire_ttl_checks(&mut self, now: Instant) {
        let mut expired = Vec::new();
        for (node, state) in &mut self.catalog.nodes {
            for check in state.checks.values_mut() {
                if let CheckKind::Ttl { expires_at, .. } = &mut check.kind {
                    if expires_at.is_some_and(|t| t <= now) {
                        *expires_at = None;
                        expired.push((node.clone(), check.id.clone()));
                    }
                }
            }
        }
        for (node, id) in expired {
            self.set_check_status(
                &node,
                &id,
                HealthStatus::Critical,
                "TTL expired".into(),
                now,
            );
        }
    }

    fn critical_reap_due(check: &Check) -> Option<Instant> {
        Some(check.critical_since? + check.deregister_after?)
    }

    /// The reaper: removes every service with a check critical for longer
    /// than its `DeregisterCriticalServiceAfter`. With a reaper period it
    /// only runs at its ticks, like Consul's agent loop.
    pub(super) fn reap_critical_services(&mut self, now: Instant) {
        if let Some((interval, next)) = &mut self.check_reap {
            if now < *next {
                return;
            }
            while *next <= now {
                *next += *interval;
            }
        }
        let mut due = Vec::new();
        for (node, state) in &self.catalog.nodes {
            for check in state.checks.values() {
                if Self::critical_reap_due(check).is_some_and(|t| t <= now) {
                    due.push((node.clone(), check.service_id.clone()));
                }
            }
        }
        due.sort();
        due.dedup();
        for (node, service_id) in due {
            // A service with two reapable checks is only deregistered once.
            let _already_gone = self.deregister_service(&node, &service_id, now);
        }
    }

    pub(super) fn next_catalog_deadline(&self) -> Option<Instant> {
        let reaper_tick = self.check_reap.map(|(_, next)| next);
        self.catalog
            .nodes
            .values()
            .flat_map(|n| n.checks.values())
            .filter_map(|c| {
                let ttl = match c.kind {
                    CheckKind::Ttl { expires_at, .. } => expires_at,
                    CheckKind::Grpc { .. } => None,
                };
                // A reapable check wakes the reaper at its next tick (at
                // the due time itself without a reaper period).
                let reap = Self::critical_reap_due(c).map(|due| reaper_tick.unwrap_or(due));
                ttl.into_iter().chain(reap).min()
            })
            .min()
    }

    /// Snapshot of every service, for assertions.
    pub(crate) fn service_infos(&self) -> Vec<ServiceInfo> {
        let mut out = Vec::new();
        for (node, state) in &self.catalog.nodes {
            for service in state.services.values() {
                let checks: Vec<CheckInfo> = state
                    .checks
                    .values()
                    .filter(|c| c.service_id == service.id)
                    .map(Check::info)
                    .collect();
                let status = checks
                    .iter()
                    .map(|c| c.status)
                    .max()
                    .unwrap_or(HealthStatus::Passing);
                out.push(ServiceInfo {
                    node: node.clone(),
                    id: service.id.clone(),
                    name: service.name.clone(),
                    tags: service.tags.clone(),
                    address: service.address.clone(),
                    port: service.port,
                    meta: service.meta.clone(),
                    status,
                    checks,
                });
            }
        }
        out
    }

    /// Every instance of `name`, with its node and checks.
    pub(crate) fn service_instances(&self, name: &str) -> Vec<(&str, &Service, Vec<&Check>)> {
        let mut out = Vec::new();
        for (node, state) in &self.catalog.nodes {
            for service in state.services.values().filter(|s| s.name == name) {
                let checks = state
                    .checks
                    .values()
                    .filter(|c| c.service_id == service.id)
                    .collect();
                out.push((node.as_str(), service, checks));
            }
        }
        out
    }

    pub(crate) fn node_state(&self, node: &str) -> Option<&NodeState> {
        self.catalog.nodes.get(node)
    }

    pub(crate) fn catalog_index(&self) -> u64 {
        self.catalog.index
    }

    pub(crate) fn all_nodes(&self) -> impl Iterator<Item = (&String, &NodeState)> {
        self.catalog.nodes.iter()
    }
}
