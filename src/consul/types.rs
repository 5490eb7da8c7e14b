//! Request and answer shapes of the Consul calls idgen makes. Unknown
//! fields in answers are ignored (Consul's documented behaviour: "ignore unknown fields").

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::ConsulError;

/// Encodes bytes as Consul's base64 `Value`.
fn encode_value(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Read consistency (Consul API, "Every request").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// The leader's view; may be stale during a leader change.
    Default,
    /// Quorum-confirmed: use for every read that safety depends on.
    Consistent,
    /// Any server.
    Stale,
}

impl Consistency {
    pub(super) fn query(self) -> Vec<(&'static str, String)> {
        match self {
            Self::Default => vec![],
            Self::Consistent => vec![("consistent", String::new())],
            Self::Stale => vec![("stale", String::new())],
        }
    }
}

/// How a KV PUT is conditioned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvWrite<'a> {
    /// Unconditional set.
    Set,
    /// Only if ModifyIndex equals this (0: only if absent).
    Cas(u64),
    /// Take the lock with this session (value is overwritten too).
    Acquire(&'a str),
    /// Release the lock held by this session (value is overwritten too).
    Release(&'a str),
}

/// A KV entry with its value decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// Full key.
    pub key: String,
    /// Index at creation.
    pub create_index: u64,
    /// Index of the last change.
    pub modify_index: u64,
    /// How many times a new session acquired the lock. Never use it as a
    /// fencing token: a plain set or `cas` on a locked key writes it back
    /// to 0 while the holder stays (Consul's `kvsSetTxn`). idgen fences on
    /// `Session` and ModifyIndex instead.
    pub lock_index: u64,
    /// Opaque flags.
    pub flags: u64,
    /// The value (empty for a null value).
    pub value: Vec<u8>,
    /// The session holding the lock, if any.
    pub session: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(super) struct RawKv {
    key: String,
    #[serde(default)]
    create_index: u64,
    #[serde(default)]
    modify_index: u64,
    #[serde(default)]
    lock_index: u64,
    #[serde(default)]
    flags: u64,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    session: Option<String>,
}

impl RawKv {
    pub(super) fn into_entry(self, endpoint: &'static str) -> Result<KvEntry, ConsulError> {
        let value = match self.value {
            None => Vec::new(),
            Some(v) => base64::engine::general_purpose::STANDARD
                .decode(v.as_bytes())
                .map_err(|e| ConsulError::Decode {
                    endpoint,
                    detail: format!("value of {} is not base64: {e}", self.key),
                })?,
        };
        Ok(KvEntry {
            key: self.key,
            create_index: self.create_index,
            modify_index: self.modify_index,
            lock_index: self.lock_index,
            flags: self.flags,
            value,
            session: self.session.filter(|s| !s.is_empty()),
        })
    }
}

/// What happens to a session's locks when it is invalidated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionBehavior {
    /// Locks are released; values stay.
    Release,
    /// Locked keys are deleted.
    Delete,
}

/// A session to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSpec {
    /// Human-readable name.
    pub name: String,
    /// TTL (10 s to 86400 s).
    pub ttl: Duration,
    /// Release or delete held keys on invalidation.
    pub behavior: SessionBehavior,
    /// How long released keys stay un-acquirable (at most 60 s).
    pub lock_delay: Duration,
    /// Node checks to bind to; `None` keeps Consul's default (`serfHealth`),
    /// `Some(vec![])` binds to none.
    pub node_checks: Option<Vec<String>>,
    /// Service check ids to bind to.
    pub service_checks: Vec<String>,
}

impl SessionSpec {
    pub(super) fn to_json(&self) -> Value {
        let mut v = json!({
            "Name": self.name,
            "TTL": format!("{}s", self.ttl.as_secs().max(1)),
            "Behavior": match self.behavior {
                SessionBehavior::Release => "release",
                SessionBehavior::Delete => "delete",
            },
            "LockDelay": format!("{}s", self.lock_delay.as_secs()),
        });
        if let Some(checks) = &self.node_checks {
            v["NodeChecks"] = json!(checks);
        }
        if !self.service_checks.is_empty() {
            v["ServiceChecks"] = Value::Array(
                self.service_checks
                    .iter()
                    .map(|id| json!({ "ID": id }))
                    .collect(),
            );
        }
        v
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct CreatedId {
    #[serde(rename = "ID")]
    pub(super) id: String,
}

/// A session as Consul reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// Session id.
    pub id: String,
    /// Name.
    pub name: String,
    /// The TTL Consul applies (may exceed what was asked).
    pub ttl: Option<Duration>,
    /// Lock-delay.
    pub lock_delay: Option<Duration>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawSession {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "Name", default)]
    name: String,
    #[serde(rename = "TTL", default)]
    ttl: Option<String>,
    #[serde(rename = "LockDelay", default)]
    lock_delay: Option<Value>,
}

impl RawSession {
    pub(super) fn into_info(self) -> SessionInfo {
        SessionInfo {
            id: self.id,
            name: self.name,
            ttl: self
                .ttl
                .as_deref()
                .and_then(|t| humantime::parse_duration(t).ok()),
            // Consul reports LockDelay in nanoseconds (a number) or as text.
            lock_delay: match self.lock_delay {
                Some(Value::Number(n)) => n.as_u64().map(Duration::from_nanos),
                Some(Value::String(s)) => humantime::parse_duration(&s).ok(),
                _ => None,
            },
        }
    }
}

/// One KV operation inside a txn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    /// Unconditional set.
    Set {
        /// Key.
        key: String,
        /// Value.
        value: Vec<u8>,
    },
    /// Set only if ModifyIndex equals `index` (0: only if absent).
    Cas {
        /// Key.
        key: String,
        /// Value.
        value: Vec<u8>,
        /// Expected ModifyIndex.
        index: u64,
    },
    /// Acquire the lock with `session`.
    Lock {
        /// Key.
        key: String,
        /// Value.
        value: Vec<u8>,
        /// Session.
        session: String,
    },
    /// Release the lock held by `session`.
    Unlock {
        /// Key.
        key: String,
        /// Value.
        value: Vec<u8>,
        /// Session.
        session: String,
    },
    /// Read a key (fails the txn if missing).
    Get {
        /// Key.
        key: String,
    },
    /// Fail unless the key's ModifyIndex equals `index`.
    CheckIndex {
        /// Key.
        key: String,
        /// Expected ModifyIndex.
        index: u64,
    },
    /// Fail unless `session` holds the key's lock.
    CheckSession {
        /// Key.
        key: String,
        /// Session.
        session: String,
    },
    /// Fail if the key exists.
    CheckNotExists {
        /// Key.
        key: String,
    },
    /// Delete a key.
    Delete {
        /// Key.
        key: String,
    },
    /// Delete only if ModifyIndex equals `index`.
    DeleteCas {
        /// Key.
        key: String,
        /// Expected ModifyIndex.
        index: u64,
    },
}

impl TxnOp {
    pub(super) fn to_json(&self) -> Value {
        let kv = match self {
            Self::Set { key, value } => {
                json!({"Verb": "set", "Key": key, "Value": encode_value(value)})
            }
            Self::Cas { key, value, index } => {
                json!({"Verb": "cas", "Key": key, "Value": encode_value(value), "Index": index})
            }
            Self::Lock {
                key,
                value,
                session,
            } => {
                json!({"Verb": "lock", "Key": key, "Value": encode_value(value), "Session": session})
            }
            Self::Unlock {
                key,
                value,
                session,
            } => {
                json!({"Verb": "unlock", "Key": key, "Value": encode_value(value), "Session": session})
            }
            Self::Get { key } => json!({"Verb": "get", "Key": key}),
            Self::CheckIndex { key, index } => {
                json!({"Verb": "check-index", "Key": key, "Index": index})
            }
            Self::CheckSession { key, session } => {
                json!({"Verb": "check-session", "Key": key, "Session": session})
            }
            Self::CheckNotExists { key } => json!({"Verb": "check-not-exists", "Key": key}),
            Self::Delete { key } => json!({"Verb": "delete", "Key": key}),
            Self::DeleteCas { key, index } => {
                json!({"Verb": "delete-cas", "Key": key, "Index": index})
            }
        };
        json!({ "KV": kv })
    }
}

/// Why a txn was rolled back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnError {
    /// Which operation failed (0-based).
    pub op_index: usize,
    /// Consul's explanation.
    pub what: String,
}

/// The result of a txn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Applied; one entry per non-delete operation, with new ModifyIndex.
    Committed(Vec<KvEntry>),
    /// Nothing applied (409).
    RolledBack(Vec<TxnError>),
}

#[derive(Debug, Deserialize)]
pub(super) struct RawTxnReply {
    #[serde(rename = "Results", default)]
    pub(super) results: Option<Vec<RawTxnResult>>,
    #[serde(rename = "Errors", default)]
    pub(super) errors: Option<Vec<RawTxnError>>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawTxnResult {
    #[serde(rename = "KV", default)]
    pub(super) kv: Option<RawKv>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawTxnError {
    #[serde(rename = "OpIndex", default)]
    pub(super) op_index: usize,
    #[serde(rename = "What", default)]
    pub(super) what: String,
}

/// A health check attached to a service registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceCheck {
    /// The agent probes `grpc.health.v1` at `target` (`host:port/service`).
    Grpc {
        /// Check id (always set explicitly).
        check_id: String,
        /// `host:port/service`.
        target: String,
        /// Probe interval.
        interval: Duration,
        /// Probe timeout.
        timeout: Duration,
        /// Deregister after being critical this long (at least 1 minute).
        deregister_after: Option<Duration>,
        /// Probe over TLS (`GRPCUseTLS`), verifying the certificate
        /// against this name (`TLSServerName`); `None`: plaintext.
        /// `TLSSkipVerify` is never set.
        tls_server_name: Option<String>,
    },
    /// The service reports itself with `check_update`.
    Ttl {
        /// Check id.
        check_id: String,
        /// TTL.
        ttl: Duration,
        /// Start passing instead of critical.
        passing: bool,
        /// Deregister after being critical this long (at least 1 minute).
        deregister_after: Option<Duration>,
    },
}

fn secs(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

impl ServiceCheck {
    fn to_json(&self) -> Value {
        let mut v = match self {
            Self::Grpc {
                check_id,
                target,
                interval,
                timeout,
                tls_server_name,
                ..
            } => {
                let mut v = json!({
                    "CheckID": check_id,
                    "Name": format!("gRPC health {target}"),
                    "GRPC": target,
                    "GRPCUseTLS": tls_server_name.is_some(),
                    "Interval": secs(*interval),
                    "Timeout": secs(*timeout),
                });
                if let Some(name) = tls_server_name {
                    v["TLSServerName"] = json!(name);
                    v["TLSSkipVerify"] = json!(false);
                }
                v
            }
            Self::Ttl {
                check_id,
                ttl,
                passing,
                ..
            } => {
                let mut v = json!({"CheckID": check_id, "Name": "idgen TTL", "TTL": secs(*ttl)});
                if *passing {
                    v["Status"] = json!("passing");
                }
                v
            }
        };
        let after = match self {
            Self::Grpc {
                deregister_after, ..
            }
            | Self::Ttl {
                deregister_after, ..
            } => *deregister_after,
        };
        if let Some(after) = after {
            v["DeregisterCriticalServiceAfter"] = json!(secs(after.max(Duration::from_secs(60))));
        }
        v
    }
}

/// A service to register with the local agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRegistration {
    /// Unique instance id, e.g. `idgen-<instance>`.
    pub id: String,
    /// Service name, e.g. `idgen`.
    pub name: String,
    /// Tags.
    pub tags: Vec<String>,
    /// Address clients should dial (empty: the node's address).
    pub address: String,
    /// Port clients should dial.
    pub port: u16,
    /// Free-form metadata.
    pub meta: BTreeMap<String, String>,
    /// Health checks.
    pub checks: Vec<ServiceCheck>,
}

impl ServiceRegistration {
    pub(super) fn to_json(&self) -> Value {
        json!({
            "ID": self.id,
            "Name": self.name,
            "Tags": self.tags,
            "Address": self.address,
            "Port": self.port,
            "Meta": self.meta,
            "Checks": self.checks.iter().map(ServiceCheck::to_json).collect::<Vec<_>>(),
        })
    }
}

/// One instance from `health/service`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceEntry {
    /// Node name.
    pub node: String,
    /// Service instance id.
    pub id: String,
    /// Service name.
    pub service: String,
    /// Tags.
    pub tags: Vec<String>,
    /// Address to dial (the node's when the service has none).
    pub address: String,
    /// Port to dial.
    pub port: u16,
    /// Metadata.
    pub meta: BTreeMap<String, String>,
    /// Every check's status (`passing`, `warning`, `critical`).
    pub check_statuses: Vec<String>,
    /// Every check's last output, in the order of `check_statuses`.
    pub check_outputs: Vec<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawHealthEntry {
    #[serde(rename = "Node")]
    node: RawNode,
    #[serde(rename = "Service")]
    service: RawService,
    #[serde(rename = "Checks", default)]
    checks: Vec<RawCheck>,
}

#[derive(Debug, Deserialize)]
struct RawNode {
    #[serde(rename = "Node", default)]
    node: String,
    #[serde(rename = "Address", default)]
    address: String,
}

#[derive(Debug, Deserialize)]
struct RawService {
    #[serde(rename = "ID", default)]
    id: String,
    #[serde(rename = "Service", default)]
    service: String,
    #[serde(rename = "Tags", default)]
    tags: Option<Vec<String>>,
    #[serde(rename = "Address", default)]
    address: String,
    #[serde(rename = "Port", default)]
    port: u16,
    #[serde(rename = "Meta", default)]
    meta: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
struct RawCheck {
    #[serde(rename = "Status", default)]
    status: String,
    #[serde(rename = "Output", default)]
    output: Option<String>,
}

impl RawHealthEntry {
    pub(super) fn into_entry(self) -> ServiceEntry {
        let address = if self.service.address.is_empty() {
            self.node.address
        } else {
            self.service.address
        };
        ServiceEntry {
            node: self.node.node,
            id: self.service.id,
            service: self.service.service,
            tags: self.service.tags.unwrap_or_default(),
            address,
            port: self.service.port,
            meta: self.service.meta.unwrap_or_default(),
            check_statuses: self.checks.iter().map(|c| c.status.clone()).collect(),
            check_outputs: self
                .checks
                .into_iter()
                .map(|c| c.output.unwrap_or_default())
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_answers_decode_with_null_values_and_unknown_fields() {
        let raw: Vec<RawKv> = serde_json::from_str(
            r#"[{"Key":"a","CreateIndex":3,"ModifyIndex":5,"LockIndex":1,"Flags":0,"Value":"aGk=","Session":"","Namespace":"x"},
                {"Key":"b","CreateIndex":4,"ModifyIndex":4,"LockIndex":0,"Flags":0,"Value":null,"Session":"s1"}]"#,
        )
        .unwrap();
        let e: Vec<KvEntry> = raw
            .into_iter()
            .map(|r| r.into_entry("t").unwrap())
            .collect();
        assert_eq!(e[0].value, b"hi");
        assert_eq!(e[0].session, None, "empty Session means unlocked");
        assert_eq!(e[1].value, b"");
        assert_eq!(e[1].session.as_deref(), Some("s1"));
    }

    #[test]
    fn bad_base64_is_a_decode_error() {
        let raw: RawKv = serde_json::from_str(r#"{"Key":"a","Value":"%%%"}"#).unwrap();
        assert!(matches!(
            raw.into_entry("t"),
            Err(ConsulError::Decode { .. })
        ));
    }

    #[test]
    fn txn_ops_encode_as_documented() {
        let op = TxnOp::Cas {
            key: "k".into(),
            value: b"v".to_vec(),
            index: 7,
        };
        assert_eq!(
            op.to_json(),
            json!({"KV": {"Verb": "cas", "Key": "k", "Value": "dg==", "Index": 7}})
        );
        let op = TxnOp::CheckSession {
            key: "k".into(),
            session: "s".into(),
        };
        assert_eq!(op.to_json()["KV"]["Verb"], "check-session");
    }

    #[test]
    fn session_spec_encodes_ttl_and_checks() {
        let spec = SessionSpec {
            name: "idgen".into(),
            ttl: Duration::from_secs(15),
            behavior: SessionBehavior::Release,
            lock_delay: Duration::from_secs(15),
            node_checks: Some(vec![]),
            service_checks: vec!["c1".into()],
        };
        let v = spec.to_json();
        assert_eq!(v["TTL"], "15s");
        assert_eq!(v["Behavior"], "release");
        assert_eq!(v["NodeChecks"], json!([]));
        assert_eq!(v["ServiceChecks"], json!([{"ID": "c1"}]));
    }

    #[test]
    fn health_entries_fall_back_to_the_node_address() {
        let raw: Vec<RawHealthEntry> = serde_json::from_str(
            r#"[{"Node":{"Node":"n1","Address":"10.0.0.1"},"Service":{"ID":"idgen-a","Service":"idgen","Tags":null,"Address":"","Port":50051,"Meta":null},"Checks":[{"Status":"passing"}]}]"#,
        )
        .unwrap();
        let e = raw.into_iter().next().unwrap().into_entry();
        assert_eq!(e.address, "10.0.0.1");
        assert_eq!(e.port, 50051);
        assert_eq!(e.check_statuses, vec!["passing"]);
    }
}

/// The part of `/v1/agent/self` idgen reads.
#[derive(Debug, Deserialize)]
pub(super) struct RawAgentSelf {
    #[serde(rename = "Config")]
    pub(super) config: RawAgentConfig,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawAgentConfig {
    #[serde(rename = "Datacenter", default)]
    pub(super) datacenter: String,
    #[serde(rename = "PrimaryDatacenter", default)]
    pub(super) primary_datacenter: Option<String>,
}
