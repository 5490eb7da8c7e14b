//! Snapshots: `GET /v1/snapshot` saves the KV table and the sessions,
//! `PUT /v1/snapshot` puts them back, as Consul's disaster recovery does.
//!
//! What a restore does, as in Consul:
//!
//! - Keys come back with the CreateIndex, ModifyIndex and LockIndex they
//!   had when the snapshot was taken, and the KV table index with them
//!   (`agent/consul/fsm/snapshot_oss.go`, `restoreKV`, which also moves
//!   the table's index to each restored entry's ModifyIndex). So indexes a
//!   client saw after the snapshot can go backwards, and a ModifyIndex a
//!   client cached before the snapshot can match again.
//! - The raft index does not go back: hashicorp/raft's
//!   `restoreUserSnapshot` (`raft.go`) gives the restored state the higher
//!   of the snapshot's index and the current one, plus one. Writes after
//!   the restore get indexes above every earlier one.
//! - Sessions in the snapshot come back, sessions created after it are
//!   gone (with them, any lock they took since). The leader's TTL timers
//!   start again at 2 x TTL (`agent/consul/snapshot_endpoint.go` reasserts
//!   leadership, which runs `initializeSessionTimers`), and lock-delays
//!   are forgotten (they live in the old state store's memory).
//! - Blocking queries return at once with the restored (possibly lower)
//!   index, as Consul's abandoned state store wakes every watcher.
//!
//! Deviation: the catalog (services and checks) is kept as it is. Consul
//! restores it from the snapshot too, but its agents' anti-entropy sync
//! registers their local services again right after; keeping them is what
//! a client sees a minute later.
//!
//! The archive is opaque to clients (Consul's is a gzipped tar); here it is
//! a magic line and a JSON document.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use super::kv::{KvEntry, KvStore};
use super::session::{Behavior, Session, SessionInfo, SESSION_TTL_MULTIPLIER};
use super::ClusterState;

/// First line of every archive; anything else is refused on restore.
const MAGIC: &[u8] = b"consul-testserver-snapshot v1\n";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn entry_json(e: &KvEntry) -> Value {
    json!({
        "Key": e.key, "CreateIndex": e.create_index, "ModifyIndex": e.modify_index,
        "LockIndex": e.lock_index, "Flags": e.flags, "Value": b64(&e.value),
        "Session": e.session,
    })
}

fn session_json(s: &Session) -> Value {
    let i = &s.info;
    json!({
        "ID": i.id, "Name": i.name, "Node": i.node,
        "TTLNanos": i.ttl.map(|t| t.as_nanos() as u64), "TTL": s.ttl_text,
        "Behavior": i.behavior.as_str(), "LockDelayNanos": i.lock_delay.as_nanos() as u64,
        "NodeChecks": i.node_checks, "ServiceChecks": i.service_checks,
        "CreateIndex": i.create_index, "ModifyIndex": i.modify_index,
    })
}

/// A field of a restored document, or an error naming it.
fn field<'a>(v: &'a Value, name: &str) -> Result<&'a Value, String> {
    v.get(name)
        .ok_or_else(|| format!("snapshot is damaged: field {name} is missing"))
}

fn u64_of(v: &Value, name: &str) -> Result<u64, String> {
    field(v, name)?
        .as_u64()
        .ok_or_else(|| format!("snapshot is damaged: field {name} is not a number"))
}

fn str_of(v: &Value, name: &str) -> Result<String, String> {
    field(v, name)?
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("snapshot is damaged: field {name} is not a string"))
}

fn strings_of(v: &Value, name: &str) -> Result<Vec<String>, String> {
    let items = field(v, name)?
        .as_array()
        .ok_or_else(|| format!("snapshot is damaged: field {name} is not a list"))?;
    items
        .iter()
        .map(|s| {
            s.as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("snapshot is damaged: {name} holds a non-string"))
        })
        .collect()
}

fn entry_of(v: &Value) -> Result<KvEntry, String> {
    let value = base64::engine::general_purpose::STANDARD
        .decode(str_of(v, "Value")?)
        .map_err(|e| format!("snapshot is damaged: a value is not base64 ({e})"))?;
    Ok(KvEntry {
        key: str_of(v, "Key")?,
        create_index: u64_of(v, "CreateIndex")?,
        modify_index: u64_of(v, "ModifyIndex")?,
        lock_index: u64_of(v, "LockIndex")?,
        flags: u64_of(v, "Flags")?,
        value,
        session: field(v, "Session")?.as_str().map(str::to_owned),
    })
}

fn session_of(v: &Value, now: Instant) -> Result<Session, String> {
    let ttl = field(v, "TTLNanos")?.as_u64().map(Duration::from_nanos);
    let behavior = match str_of(v, "Behavior")?.as_str() {
        "delete" => Behavior::Delete,
        _ => Behavior::Release,
    };
    let info = SessionInfo {
        id: str_of(v, "ID")?,
        name: str_of(v, "Name")?,
        node: str_of(v, "Node")?,
        ttl,
        behavior,
        lock_delay: Duration::from_nanos(u64_of(v, "LockDelayNanos")?),
        node_checks: strings_of(v, "NodeChecks")?,
        service_checks: strings_of(v, "ServiceChecks")?,
        create_index: u64_of(v, "CreateIndex")?,
        modify_index: u64_of(v, "ModifyIndex")?,
    };
    Ok(Session {
        info,
        ttl_text: str_of(v, "TTL")?,
        // The new leader's timer: 2 x TTL from the restore.
        expires_at: ttl.map(|t| now + t * SESSION_TTL_MULTIPLIER),
    })
}

impl ClusterState {
    /// The archive `GET /v1/snapshot` answers, and the index it was taken
    /// at.
    pub(crate) fn snapshot_save(&self) -> (Vec<u8>, u64) {
        let (entries, table_index, tombstones) = self.kv.snapshot_parts();
        let doc = json!({
            "Index": self.index,
            "KV": entries.into_iter().map(entry_json).collect::<Vec<_>>(),
            "KVTableIndex": table_index,
            "KVTombstones": tombstones,
            "Sessions": self.sessions.values().map(session_json).collect::<Vec<_>>(),
            "SessionsIndex": self.sessions_index,
        });
        let mut out = MAGIC.to_vec();
        out.extend(doc.to_string().into_bytes());
        (out, self.index)
    }

    /// Replaces the KV table and the sessions with an archive's (see the
    /// module doc for what moves and what does not). Nothing changes if the
    /// archive is refused.
    pub(crate) fn snapshot_restore(&mut self, archive: &[u8], now: Instant) -> Result<(), String> {
        let body = archive
            .strip_prefix(MAGIC)
            .ok_or("not a snapshot archive of this server (bad header)")?;
        let doc: Value = serde_json::from_slice(body)
            .map_err(|e| format!("snapshot is damaged: not JSON ({e})"))?;
        let snapshot_index = u64_of(&doc, "Index")?;
        let entries = field(&doc, "KV")?
            .as_array()
            .ok_or("snapshot is damaged: KV is not a list")?
            .iter()
            .map(entry_of)
            .collect::<Result<Vec<_>, _>>()?;
        let tombstones: BTreeMap<String, u64> =
            serde_json::from_value(field(&doc, "KVTombstones")?.clone())
                .map_err(|e| format!("snapshot is damaged: KVTombstones ({e})"))?;
        let sessions = field(&doc, "Sessions")?
            .as_array()
            .ok_or("snapshot is damaged: Sessions is not a list")?
            .iter()
            .map(|s| session_of(s, now).map(|s| (s.info.id.clone(), s)))
            .collect::<Result<BTreeMap<_, _>, _>>()?;
        let sessions_index = u64_of(&doc, "SessionsIndex")?;
        let table_index = u64_of(&doc, "KVTableIndex")?;
        self.kv = KvStore::restored(entries, table_index, tombstones);
        self.sessions = sessions;
        self.sessions_index = sessions_index;
        self.index = self.index.max(snapshot_index) + 1;
        self.restores += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::kv::PutMode;
    use super::super::session::SessionSpec;
    use super::*;

    fn spec(id: &str) -> SessionSpec {
        SessionSpec {
            id: id.to_owned(),
            name: "n".to_owned(),
            node: "agent-0".to_owned(),
            ttl: Some((Duration::from_secs(10), "10s".to_owned())),
            behavior: Behavior::Release,
            lock_delay: Duration::from_secs(15),
            node_checks: vec![],
            service_checks: vec![],
        }
    }

    #[test]
    fn a_restore_brings_back_keys_indexes_and_sessions_and_moves_the_raft_index_on() {
        let mut st = ClusterState::new(2.0);
        st.add_node("agent-0");
        let t0 = Instant::now();
        st.session_create(spec("s1"), t0)
            .map(|_| ())
            .unwrap_or_else(|e| panic!("{e}"));
        let put = |st: &mut ClusterState, k: &str, v: &str, m: PutMode| {
            st.kv_put(k, v.as_bytes().to_vec(), 0, &m, t0)
        };
        assert_eq!(put(&mut st, "c", "10", PutMode::Set), Ok(true));
        assert_eq!(
            put(&mut st, "l", "x", PutMode::Acquire("s1".into())),
            Ok(true)
        );
        let before = st.kv.get("c").cloned();
        let (archive, taken_at) = st.snapshot_save();
        assert_eq!(taken_at, st.index);

        // After the snapshot: the counter moves, a key and a session appear.
        assert_eq!(put(&mut st, "c", "20", PutMode::Set), Ok(true));
        assert_eq!(put(&mut st, "new", "n", PutMode::Set), Ok(true));
        st.session_create(spec("s2"), t0)
            .map(|_| ())
            .unwrap_or_else(|e| panic!("{e}"));
        let seen = st.index;

        let t1 = t0 + Duration::from_secs(5);
        assert_eq!(st.snapshot_restore(&archive, t1), Ok(()));
        assert_eq!(
            st.kv.get("c").cloned(),
            before,
            "value and indexes as saved"
        );
        assert!(st.kv.get("new").is_none());
        assert!(st.session_get("s1").is_some() && st.session_get("s2").is_none());
        assert_eq!(st.index, seen + 1, "the raft index never goes back");
        assert!(st.kv.table_index() < seen, "the KV table index does");
        assert_eq!(
            st.next_deadline(false),
            Some(t1 + Duration::from_secs(20)),
            "timers restart at 2 x TTL"
        );
        assert_eq!(st.restores, 1);
        assert_eq!(
            st.kv.get("l").and_then(|e| e.session.clone()),
            Some("s1".to_owned())
        );
        // A cas on the index seen before the snapshot succeeds again.
        let old = before.map_or(0, |e| e.modify_index);
        assert_eq!(put(&mut st, "c", "11", PutMode::Cas(old)), Ok(true));
        assert!(st.kv.get("c").is_some_and(|e| e.modify_index > seen));
    }

    #[test]
    fn a_damaged_archive_is_refused_and_changes_nothing() {
        let mut st = ClusterState::new(2.0);
        let now = Instant::now();
        assert_eq!(
            st.kv_put("k", b"v".to_vec(), 0, &PutMode::Set, now),
            Ok(true)
        );
        let index = st.index;
        let (mut archive, _) = st.snapshot_save();
        assert!(st.snapshot_restore(b"tar.gz", now).is_err());
        archive.truncate(archive.len() - 3);
        let err = st.snapshot_restore(&archive, now).err().unwrap_or_default();
        assert!(err.contains("damaged"), "{err}");
        assert_eq!((st.index, st.restores), (index, 0));
        assert!(st.kv.get("k").is_some());
    }
}
