//! Every node's status, published to Consul KV so any node's console can
//! show the whole cluster without one node ever calling another.
//!
//! Each Consul-backed node writes a [`StatusRecord`] to
//! `<prefix>/<cluster>/nodes/<instance>` every [`STATUS_INTERVAL`] (and a
//! last one with `"state": "stopped"` on a clean shutdown); the console's
//! `GET /admin/api/cluster` reads the folder and joins it with Consul's
//! own view of each instance (`health/service/<service>`) in
//! [`StatusBoard::read`]. A record not rewritten for [`STALE_INTERVALS`]
//! of its interval reads as "not reporting"; one whose instance has not
//! written for [`PRUNE_AFTER`] is deleted by any node's writer (a
//! compare-and-set on the index it read, so an instance that comes back
//! meanwhile keeps its record).
//!
//! The records are advisory: nothing reads them to decide what to issue,
//! so a lost, stale or forged record can mislead an operator, never
//! repeat an ID. One check reads them besides the console: a hide key's
//! rotation ([`HideUse`]) refuses a version that a hidden lease zone or
//! snowflake layout of another node cannot hold (rule 30); a missing
//! record can let such a rotation through, and that namespace then
//! refuses its calls (rule 19), it never repeats an ID.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::consul::{Consistency, ConsulClient, ConsulError, KvWrite, ServiceEntry};
use crate::store::kv_paths::ClusterPaths;

/// How often a node writes its status record: 3 nodes make 0.6 KV writes
/// a second.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(5);

/// A record older than this many of its writer's intervals reads as "not
/// reporting".
pub const STALE_INTERVALS: u64 = 3;

/// Records of instances that have not written for this long are deleted
/// (random pod names must not pile up).
pub const PRUNE_AFTER: Duration = Duration::from_secs(24 * 3600);

/// What `state` a node's last record says.
pub const RUNNING: &str = "running";
/// The `state` of the record a node writes on a clean shutdown.
pub const STOPPED: &str = "stopped";

/// A namespace a node shows IDs of under a hide key, that only the node
/// itself knows of (its hidden lease zone and hidden snowflake layout are
/// set in its own config file, not in the store): published so a rotation
/// through any node can check that every such namespace holds the new
/// version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HideUse {
    /// The hide key id.
    pub key: String,
    /// The namespace, as an operator names it ("lease zone 9", "the
    /// snowflake layout").
    pub namespace: String,
    /// Its version field's width in bits.
    pub version_bits: u32,
}

/// One node's published status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusRecord {
    /// The node's view of itself as the console shows it (instance,
    /// address, version, ready, fenced, reason, node number, layout bits,
    /// IDs issued by mode).
    #[serde(flatten)]
    pub node: Map<String, Value>,
    /// [`RUNNING`] or [`STOPPED`].
    pub state: String,
    /// IDs a second over the last interval, from the node's own counters;
    /// `None` in its first record.
    pub rate: Option<f64>,
    /// When the node wrote it, Unix ms by its clock.
    pub written_ms: u64,
    /// How often the node writes (ms), so readers judge staleness by the
    /// writer's interval.
    pub interval_ms: u64,
    /// The namespaces only this node knows of that show IDs under a hide
    /// key (absent in records of older nodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hides: Vec<HideUse>,
}

impl StatusRecord {
    /// The instance the record is of (empty when the node map has none).
    pub fn instance(&self) -> &str {
        self.node
            .get("instance")
            .and_then(Value::as_str)
            .unwrap_or("")
    }
}

/// Where the status records of one cluster live, and how to read Consul's
/// view of its instances.
#[derive(Debug, Clone)]
pub struct StatusBoard {
    client: ConsulClient,
    keys: ClusterPaths,
    service: String,
    instance: String,
}

impl StatusBoard {
    /// The board of the cluster `keys` name, whose nodes register as
    /// Consul service `service`; `instance` is this node.
    pub fn new(
        client: ConsulClient,
        keys: ClusterPaths,
        service: String,
        instance: String,
    ) -> Self {
        Self {
            client,
            keys,
            service,
            instance,
        }
    }

    /// This node's instance name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    fn dir(&self) -> String {
        self.keys.status_dir()
    }

    /// Writes this node's record (a plain set, sent once, bounded by the
    /// client's `consul.timeout`).
    pub async fn publish(&self, record: &StatusRecord) -> Result<(), ConsulError> {
        // This write raises the cluster's index too: a restore this node
        // can see is recorded before it does (rule 15).
        let _ = self
            .keys
            .index()
            .probe(&self.client, self.keys.written())
            .await;
        let key = format!("{}{}", self.dir(), self.instance);
        let value = serde_json::to_vec(record).unwrap_or_default();
        self.client.kv_put(&key, &value, KvWrite::Set).await?;
        Ok(())
    }

    /// Deletes the records of other instances last written more than
    /// [`PRUNE_AFTER`] before `now_ms`, each by a compare-and-set on the
    /// index it was read at; returns how many went.
    pub async fn prune(&self, now_ms: u64) -> Result<usize, ConsulError> {
        let entries = self
            .client
            .kv_list(&self.dir(), Consistency::Default)
            .await?;
        let limit = u64::try_from(PRUNE_AFTER.as_millis()).unwrap_or(u64::MAX);
        let mut pruned = 0;
        for e in entries {
            let Ok(r) = serde_json::from_slice::<StatusRecord>(&e.value) else {
                continue;
            };
            if r.instance() == self.instance || now_ms.saturating_sub(r.written_ms) < limit {
                continue;
            }
            if self.client.kv_delete(&e.key, Some(e.modify_index)).await? {
                pruned += 1;
            }
        }
        Ok(pruned)
    }

    /// Every node's status as of `now_ms`: each record joined with Consul's
    /// health of its instance, sorted by instance.
    pub async fn read(&self, now_ms: u64) -> Result<Vec<Value>, ConsulError> {
        let entries = self
            .client
            .kv_list(&self.dir(), Consistency::Default)
            .await?;
        let health = self.client.health_service(&self.service, false).await?;
        let records = entries
            .iter()
            .map(|e| {
                let name = e.key.rsplit('/').next().unwrap_or(&e.key).to_owned();
                (name, serde_json::from_slice::<StatusRecord>(&e.value))
            })
            .map(|(name, r)| (name, r.map_err(|e| e.to_string())))
            .collect();
        Ok(join(records, &health, now_ms))
    }
}

/// Every readable status record of the cluster `keys` name, read
/// consistently (a rotation's check must not miss a record a stale
/// follower lacks).
pub async fn records(
    client: &ConsulClient,
    keys: &ClusterPaths,
) -> Result<Vec<StatusRecord>, ConsulError> {
    let entries = client
        .kv_list(&keys.status_dir(), Consistency::Consistent)
        .await?;
    Ok(entries
        .iter()
        .filter_map(|e| serde_json::from_slice::<StatusRecord>(&e.value).ok())
        .collect())
}

/// How a record reads at `now_ms`: (`state`, words) where state is
/// `reporting`, `not_reporting` or `stopped`.
pub fn report(r: &StatusRecord, now_ms: u64) -> (&'static str, String) {
    let age_s = now_ms.saturating_sub(r.written_ms) / 1000;
    if r.state == STOPPED {
        return ("stopped", format!("stopped {age_s} s ago"));
    }
    let stale_ms = r.interval_ms.max(1).saturating_mul(STALE_INTERVALS);
    if now_ms.saturating_sub(r.written_ms) > stale_ms {
        return ("not_reporting", format!("not reporting for {age_s} s"));
    }
    ("reporting", format!("reported {age_s} s ago"))
}

/// Consul's view of one instance: its worst check status and what those
/// checks said.
fn consul_view(entry: Option<&ServiceEntry>) -> Value {
    let Some(e) = entry else {
        return json!({"status": "not registered", "output": "no such instance in the Consul catalog (deregistered, or never registered)"});
    };
    let rank = |s: &str| match s {
        "critical" => 2,
        "warning" => 1,
        _ => 0,
    };
    let worst = e
        .check_statuses
        .iter()
        .max_by_key(|s| rank(s))
        .map_or("passing", String::as_str);
    let outputs: Vec<&str> = e
        .check_statuses
        .iter()
        .zip(&e.check_outputs)
        .filter(|(s, o)| *s == worst && !o.trim().is_empty())
        .map(|(_, o)| o.trim())
        .collect();
    // Passing: the last check is the node's own (the agent's comes first).
    let output = if worst == "passing" {
        outputs.last().map(|o| (*o).to_owned()).unwrap_or_default()
    } else {
        outputs.join("; ")
    };
    json!({"status": worst, "output": output})
}

/// Joins records (by instance) with Consul's health entries: one row per
/// instance either knows, sorted by instance.
pub fn join(
    records: Vec<(String, Result<StatusRecord, String>)>,
    health: &[ServiceEntry],
    now_ms: u64,
) -> Vec<Value> {
    let by_instance: BTreeMap<&str, &ServiceEntry> = health
        .iter()
        .map(|e| {
            let name = e.meta.get("instance").map_or_else(
                || e.id.strip_prefix("idgen-").unwrap_or(&e.id),
                String::as_str,
            );
            (name, e)
        })
        .collect();
    let mut rows: BTreeMap<String, Value> = BTreeMap::new();
    for (name, record) in records {
        let row = match record {
            Ok(r) => {
                let (state, text) = report(&r, now_ms);
                let instance = if r.instance().is_empty() {
                    name
                } else {
                    r.instance().to_owned()
                };
                let mut row = r.node.clone();
                row.insert("instance".into(), json!(instance));
                row.insert("state".into(), json!(r.state));
                row.insert("rate".into(), json!(r.rate));
                row.insert("written_ms".into(), json!(r.written_ms));
                row.insert("hides".into(), json!(r.hides));
                row.insert("report".into(), json!({"state": state, "text": text, "age_ms": now_ms.saturating_sub(r.written_ms)}));
                row
            }
            Err(e) => {
                let mut row = Map::new();
                row.insert("instance".into(), json!(name));
                row.insert("report".into(), json!({"state": "unreadable", "text": format!("its status record is unreadable: {e}")}));
                row
            }
        };
        let instance = row["instance"].as_str().unwrap_or_default().to_owned();
        rows.insert(instance, Value::Object(row));
    }
    for name in by_instance.keys() {
        rows.entry((*name).to_owned()).or_insert_with(|| {
            json!({"instance": name, "report": {"state": "no_record", "text": "no status record (a node older than this console, or not yet written)"}})
        });
    }
    rows.into_iter()
        .map(|(name, mut row)| {
            row["consul"] = consul_view(by_instance.get(name.as_str()).copied());
            row
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(instance: &str, state: &str, written_ms: u64) -> StatusRecord {
        let mut node = Map::new();
        node.insert("instance".into(), json!(instance));
        node.insert("version".into(), json!("1.2.3"));
        StatusRecord {
            node,
            state: state.into(),
            rate: Some(2.5),
            written_ms,
            interval_ms: 5000,
            hides: vec![],
        }
    }

    fn entry(instance: &str, checks: &[(&str, &str)]) -> ServiceEntry {
        ServiceEntry {
            node: "agent".into(),
            id: format!("idgen-{instance}"),
            service: "idgen".into(),
            tags: vec![],
            address: "127.0.0.1".into(),
            port: 1,
            meta: [("instance".to_owned(), instance.to_owned())].into(),
            check_statuses: checks.iter().map(|c| c.0.to_owned()).collect(),
            check_outputs: checks.iter().map(|c| c.1.to_owned()).collect(),
        }
    }

    #[test]
    fn a_record_reads_as_reporting_stale_or_stopped() {
        let now = 100_000;
        assert_eq!(
            report(&record("a", RUNNING, now - 2_000), now).0,
            "reporting"
        );
        assert_eq!(
            report(&record("a", RUNNING, now - 15_000), now).0,
            "reporting"
        );
        let (state, text) = report(&record("a", RUNNING, now - 15_001), now);
        assert_eq!(
            (state, text.as_str()),
            ("not_reporting", "not reporting for 15 s")
        );
        assert_eq!(
            report(&record("a", STOPPED, now - 99_000), now).0,
            "stopped"
        );
        // A writer's clock ahead of the reader's is "0 s ago", not a panic.
        assert_eq!(
            report(&record("a", RUNNING, now + 9_000), now).0,
            "reporting"
        );
    }

    #[test]
    fn records_join_consuls_view_sorted_by_instance() {
        let now = 50_000;
        let records = vec![
            ("b".to_owned(), Ok(record("b", RUNNING, now - 1_000))),
            ("a".to_owned(), Ok(record("a", STOPPED, now - 1_000))),
            ("z".to_owned(), Err("expected value".to_owned())),
        ];
        let health = [
            entry(
                "b",
                &[
                    ("passing", "Agent alive"),
                    ("critical", "connection refused"),
                ],
            ),
            entry("c", &[("passing", "Agent alive"), ("passing", "SERVING")]),
        ];
        let rows = join(records, &health, now);
        let names: Vec<&str> = rows
            .iter()
            .map(|r| r["instance"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "b", "c", "z"]);
        assert_eq!(rows[0]["report"]["state"], "stopped");
        assert_eq!(rows[0]["consul"]["status"], "not registered");
        assert_eq!(rows[1]["consul"]["status"], "critical");
        assert_eq!(rows[1]["consul"]["output"], "connection refused");
        assert_eq!(rows[1]["version"], "1.2.3");
        assert_eq!(rows[1]["rate"], 2.5);
        assert_eq!(rows[2]["report"]["state"], "no_record");
        assert_eq!(rows[2]["consul"]["output"], "SERVING");
        assert_eq!(rows[3]["report"]["state"], "unreadable");
    }

    #[test]
    fn a_record_round_trips_with_the_node_fields_flat() {
        let r = record("a", RUNNING, 7);
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"instance\":\"a\""), "{text}");
        let back: StatusRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
    }
}
