//! Durable counters of formatted mode, on both backends.
//!
//! One [`CounterRecord`] (period + last value reserved in it) per format,
//! scope key and, for per-node formats, node. [`FormatStore::reserve`] is
//! the only way a node gets counter values: it reads the record, lets the
//! caller's plan (`Format::decide` then `Format::next_block`) turn it into
//! a block and the record to write, and returns the block only once that
//! write is durable. A write whose outcome is unknown returns an error and
//! its block is never used: a wasted block is safe, a block used twice is
//! not.
//!
//! - Embedded: table `formats`, one redb write transaction per block.
//! - Consul: `<prefix>/<cluster>/formats/<format>/<node|cluster>/<scope>`
//!   holds the record as JSON, written by a txn `cas` on the ModifyIndex of
//!   a consistent read; lost races are retried with jittered backoff.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use redb::{ReadableTable, TableDefinition};

use super::consul::ClusterKeys;
use super::embedded::{backend_err, blocking, EmbeddedStore};
use super::StoreError;
use crate::consul::{Consistency, ConsulClient, TxnOp, TxnOutcome};
use crate::id::format::{CounterBlock, CounterRecord, PeriodDecision};

pub(crate) const FORMATS: TableDefinition<&str, &[u8]> = TableDefinition::new("formats");

/// The `meta` key a restore sets (Unix ms, the restore's high-water floor):
/// the node that was lost may have used any counter in a period up to
/// then, after the snapshot was taken, so such counters start above the
/// restore floor instead of at their minimum.
pub(crate) const FORMATS_RESTORED_UNTIL: &str = "formats_restored_until_ms";

/// What the embedded store says about formats with one counter for the
/// whole cluster (`names`): each state file has its own counters, so two
/// embedded nodes would hand out the same IDs of these formats.
pub fn one_node_formats_warning(names: &[String]) -> String {
    format!(
        "formats {names:?} keep one counter for the whole cluster, but on the embedded store each node's state file has its own: another embedded node would hand out the same IDs of these formats. Serve them from one node, give each node its own counter by rendering it ({{node:N}} or {{token:N:digits}} in the template), or use store.backend = \"consul\""
    )
}

/// After `idgen state restore`: counters starting a period that began at or
/// before `until_ms` start `floor` above their minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreFloor {
    /// The restore's high-water floor, Unix ms.
    pub until_ms: i64,
    /// How far above the minimum (the restore floor, skip-ahead included).
    pub floor: u64,
}

/// The `meta` key a restore sets: JSON, format name -> the margin its new
/// counters start above their minimum in periods up to
/// [`FORMATS_RESTORED_UNTIL`]. A format not in it (created after the
/// restore) has no floor. A file restored before per-format margins has
/// only [`FORMATS_RESTORED_UNTIL`]: every format then uses the restore
/// floor.
pub(crate) const FORMAT_RESTORE_FLOORS: &str = "formats_restore_floors";

/// The `meta` key a restore sets: the margin (counter values) of a format
/// the snapshot does not define, created after the restore (it may be one
/// the lost node created after the backup). Creating such a format adds it
/// to [`FORMAT_RESTORE_FLOORS`] with this margin, or 0 when the operator
/// asserts the name is new (`--fresh`).
pub(crate) const FORMAT_RESTORE_NEW_FLOOR: &str = "formats_restore_new_floor";

/// Stored counter records as bytes (for the snapshot code).
pub(crate) struct CounterRecordBytes;

impl CounterRecordBytes {
    /// The record `bytes` stored under `key`.
    pub(crate) fn decode(key: &str, bytes: &[u8]) -> Result<CounterRecord, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| {
            StoreError::Backend(format!("format counter record {key} unreadable: {e}"))
        })
    }

    /// The last value of the record `bytes` stored under `key`.
    pub(crate) fn last(key: &str, bytes: &[u8]) -> Result<u64, StoreError> {
        Ok(Self::decode(key, bytes)?.last)
    }

    /// `record` as stored.
    pub(crate) fn encode(record: &CounterRecord) -> Vec<u8> {
        encode(record)
    }

    /// The record `bytes` (stored under `key`) moved `skip` forward in its
    /// own period.
    pub(crate) fn skip_ahead(key: &str, bytes: &[u8], skip: u64) -> Result<Vec<u8>, StoreError> {
        let mut record = Self::decode(key, bytes)?;
        record.last = record.last.saturating_add(skip);
        Ok(encode(&record))
    }
}

/// Which counter: a format, the values of its scope parameters, and the
/// node or token for per-node formats.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterKey {
    /// The format's name.
    pub format: String,
    /// The node id, for per-node formats without a token (each node its
    /// own counter).
    pub node: Option<u64>,
    /// The leased token, for formats that render one (`{token}`,
    /// `uniq64`): the counter belongs to the token, so whichever node
    /// holds it next continues above the last holder. Takes precedence
    /// over `node`.
    pub token: Option<u64>,
    /// The scope key (`Bound::scope_key`; empty: the single counter).
    pub scope: String,
}

/// The lock a counter write must still hold: a format token's key, held
/// by the node's session (Consul). A write checks it in the same txn, so a
/// node that lost its token can never move that token's counter again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenLock {
    /// The token's lock key.
    pub key: String,
    /// The session that must hold it.
    pub session: String,
}

impl CounterKey {
    /// The stored key: `<format>/<token-T|node-N|cluster>/<hex of scope or
    /// _>`. The scope is hex-encoded so any printable value is a safe path
    /// segment.
    pub fn path(&self) -> String {
        let node = match (self.token, self.node) {
            (Some(t), _) => format!("token-{t}"),
            (None, Some(n)) => format!("node-{n}"),
            (None, None) => "cluster".to_owned(),
        };
        let scope = if self.scope.is_empty() {
            "_".to_owned()
        } else {
            self.scope.bytes().map(|b| format!("{b:02x}")).collect()
        };
        format!("{}/{node}/{scope}", self.format)
    }
}

/// What a plan decided for one reservation: the record to write, and the
/// block and decision the caller uses once that record is durable.
#[derive(Debug, Clone, Copy)]
pub struct Planned {
    /// The record to store before any value of `block` is used.
    pub record: CounterRecord,
    /// The values reserved by writing `record`.
    pub block: CounterBlock,
    /// The period decision the block was made for (render instant...).
    pub decision: PeriodDecision,
}

/// The caller's rule turning the stored record (`None`: never written)
/// into the next record and block (`Format::decide`, then
/// `Format::next_block`). It may run more than once (Consul races).
/// The second argument is set on a store restored from a backup.
pub type Plan = Arc<
    dyn Fn(Option<&CounterRecord>, Option<RestoreFloor>) -> Result<Planned, StoreError>
        + Send
        + Sync
        + 'static,
>;

/// Formatted-mode counter records.
#[async_trait]
pub trait FormatStore: Send + Sync + 'static {
    /// Reads a counter's record (strongest consistency the backend
    /// offers); `None` if never written.
    async fn load(&self, key: &CounterKey) -> Result<Option<CounterRecord>, StoreError>;

    /// Runs `plan` on the stored record and writes the record it returns;
    /// returns the plan only once that write is durable.
    async fn reserve(&self, key: &CounterKey, plan: Plan) -> Result<Planned, StoreError>;

    /// How many counter records of `format` the store holds (every scope
    /// value, node and token; what `formatted.max_scope_values` bounds).
    async fn count_counters(&self, format: &str) -> Result<u64, StoreError>;

    /// [`FormatStore::reserve`] for a token's counter: in Consul the write
    /// also checks that `lock` is still held by its session, and
    /// [`StoreError::LockLost`] says it is not (nothing was written). The
    /// embedded store has no locks (each node's tokens are its own).
    async fn reserve_locked(
        &self,
        key: &CounterKey,
        plan: Plan,
        lock: Option<&TokenLock>,
    ) -> Result<Planned, StoreError> {
        let _ = lock;
        self.reserve(key, plan).await
    }
}

fn decode(key: &CounterKey, bytes: &[u8]) -> Result<CounterRecord, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| {
        StoreError::Backend(format!(
            "counter record of format {} ({}) is unreadable ({e}); restore it from a backup",
            key.format,
            key.path()
        ))
    })
}

fn encode(record: &CounterRecord) -> Vec<u8> {
    // Two integers: serialising cannot fail.
    serde_json::to_vec(record).unwrap_or_default()
}

impl EmbeddedStore {
    fn read_counter(&self, key: &CounterKey) -> Result<Option<CounterRecord>, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(FORMATS) {
            Ok(t) => t,
            // Files made before formatted mode have no table yet.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(backend_err(e)),
        };
        let value = table.get(key.path().as_str()).map_err(backend_err)?;
        value.map(|v| decode(key, v.value())).transpose()
    }

    /// The restore floor of `format`'s counters, if this file was
    /// restored from a backup that defined the format.
    pub(crate) fn restore_floor(
        &self,
        txn: &redb::WriteTransaction,
        format: &str,
    ) -> Result<Option<RestoreFloor>, StoreError> {
        let unreadable = |key: &str, e: &dyn std::fmt::Display| {
            StoreError::Backend(format!(
                "state file: unreadable {key} ({e}); restore it from a backup"
            ))
        };
        let meta = txn.open_table(super::embedded::META).map_err(backend_err)?;
        let until = match meta.get(FORMATS_RESTORED_UNTIL).map_err(backend_err)? {
            Some(v) => v
                .value()
                .parse::<i64>()
                .map_err(|e| unreadable(FORMATS_RESTORED_UNTIL, &e))?,
            None => return Ok(None),
        };
        let floor = match meta.get(FORMAT_RESTORE_FLOORS).map_err(backend_err)? {
            Some(v) => {
                let floors: std::collections::BTreeMap<String, u64> =
                    serde_json::from_str(v.value())
                        .map_err(|e| unreadable(FORMAT_RESTORE_FLOORS, &e))?;
                match floors.get(format) {
                    Some(f) => *f,
                    // Not in the snapshot, nor recorded at creation: the
                    // margin of new formats (a gap is safe, a repeat is
                    // not).
                    None => match meta.get(FORMAT_RESTORE_NEW_FLOOR).map_err(backend_err)? {
                        Some(v) => v
                            .value()
                            .parse::<u64>()
                            .map_err(|e| unreadable(FORMAT_RESTORE_NEW_FLOOR, &e))?,
                        None => return Ok(None),
                    },
                }
            }
            None => self.floor(),
        };
        Ok(Some(RestoreFloor {
            until_ms: until,
            floor,
        }))
    }

    /// Counts the records under `<format>/` (a range read: keys of
    /// `<format>/` sort between `<format>/` and `<format>0`).
    fn count_format_counters(&self, format: &str) -> Result<u64, StoreError> {
        let txn = self.db().begin_read().map_err(backend_err)?;
        let table = match txn.open_table(FORMATS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
            Err(e) => return Err(backend_err(e)),
        };
        let (from, to) = (format!("{format}/"), format!("{format}0"));
        let mut n = 0;
        for item in table
            .range(from.as_str()..to.as_str())
            .map_err(backend_err)?
        {
            item.map_err(backend_err)?;
            n += 1;
        }
        Ok(n)
    }

    fn advance_counter(&self, key: &CounterKey, plan: &Plan) -> Result<Planned, StoreError> {
        let path = key.path();
        let txn = self.begin_write()?;
        let planned = {
            let mut table = txn.open_table(FORMATS).map_err(backend_err)?;
            let stored = match table.get(path.as_str()).map_err(backend_err)? {
                Some(v) => Some(decode(key, v.value())?),
                None => None,
            };
            let planned = plan(stored.as_ref(), self.restore_floor(&txn, &key.format)?)?;
            table
                .insert(path.as_str(), encode(&planned.record).as_slice())
                .map_err(backend_err)?;
            planned
        };
        // Durable before any value of the block is used.
        self.commit(txn)?;
        Ok(planned)
    }
}

#[async_trait]
impl FormatStore for EmbeddedStore {
    async fn load(&self, key: &CounterKey) -> Result<Option<CounterRecord>, StoreError> {
        let (this, key) = (self.clone(), key.clone());
        blocking(move || this.read_counter(&key)).await
    }

    async fn reserve(&self, key: &CounterKey, plan: Plan) -> Result<Planned, StoreError> {
        let (this, key) = (self.clone(), key.clone());
        blocking(move || this.advance_counter(&key, &plan)).await
    }

    async fn count_counters(&self, format: &str) -> Result<u64, StoreError> {
        let (this, format) = (self.clone(), format.to_owned());
        blocking(move || this.count_format_counters(&format)).await
    }
}

/// How often a reservation that lost a compare-and-set race is tried in
/// all (jittered backoff growing to 160 ms).
pub const MAX_CAS_ATTEMPTS: u32 = 32;

/// Formatted-mode counters in Consul KV.
pub struct ConsulFormatStore {
    client: ConsulClient,
    keys: ClusterKeys,
    /// The floor of the last `idgen admin skip-ahead` (`None`: none ran)
    /// and its record's ModifyIndex (0: absent), as last read; every
    /// reservation checks the record is unchanged in the same txn, and a
    /// refused txn drops this copy.
    floor: Mutex<Option<(Option<RestoreFloor>, u64)>>,
}

impl ConsulFormatStore {
    /// Records under `keys`' `formats/` folder.
    pub fn new(client: ConsulClient, keys: ClusterKeys) -> Self {
        Self {
            client,
            keys,
            floor: Mutex::new(None),
        }
    }

    fn floor_cache(&self) -> std::sync::MutexGuard<'_, Option<(Option<RestoreFloor>, u64)>> {
        self.floor.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// After a skip-ahead (a restored Consul snapshot), counters starting a
    /// period up to the run start above its floor, as on a restored state
    /// file.
    async fn restore_floor(&self) -> Result<(Option<RestoreFloor>, u64), StoreError> {
        if let Some(cached) = *self.floor_cache() {
            return Ok(cached);
        }
        let key = self.keys.skip_ahead();
        let (entry, _) = self
            .client
            .kv_get(&key, Consistency::Consistent)
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let read = match entry {
            None => (None, 0),
            Some(e) => {
                let r = super::skip_ahead::SkipAheadRecord::decode(&key, &e.value)?;
                let floor = RestoreFloor {
                    until_ms: r.until_ms,
                    floor: r.floor,
                };
                (Some(floor), e.modify_index)
            }
        };
        *self.floor_cache() = Some(read);
        Ok(read)
    }

    async fn read(&self, key: &CounterKey) -> Result<Option<(CounterRecord, u64)>, StoreError> {
        let path = self.keys.format_counter(&key.path());
        let floor = self.keys.written().written(&path);
        let (entry, _) = self
            .client
            .kv_get(
                &self.keys.format_counter(&key.path()),
                Consistency::Consistent,
            )
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let Some(e) = entry else {
            self.keys
                .written()
                .check("format", &path, floor, (i64::MIN, 0))?;
            return Ok(None);
        };
        let record = decode(key, &e.value)?;
        // Below this node's own write (an earlier period, or a lower value
        // in the same one): the store was rolled back.
        self.keys
            .written()
            .check("format", &path, floor, (record.period.0, record.last))?;
        Ok(Some((record, e.modify_index)))
    }
}

#[async_trait]
impl FormatStore for ConsulFormatStore {
    async fn load(&self, key: &CounterKey) -> Result<Option<CounterRecord>, StoreError> {
        Ok(self.read(key).await?.map(|(r, _)| r))
    }

    async fn reserve(&self, key: &CounterKey, plan: Plan) -> Result<Planned, StoreError> {
        self.reserve_locked(key, plan, None).await
    }

    async fn count_counters(&self, format: &str) -> Result<u64, StoreError> {
        let prefix = self.keys.format_counter(&format!("{format}/"));
        let entries = self
            .client
            .kv_list(&prefix, Consistency::Default)
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(entries.len() as u64)
    }

    async fn reserve_locked(
        &self,
        key: &CounterKey,
        plan: Plan,
        lock: Option<&TokenLock>,
    ) -> Result<Planned, StoreError> {
        let path = self.keys.format_counter(&key.path());
        for attempt in 0..MAX_CAS_ATTEMPTS {
            let (stored, index) = match self.read(key).await? {
                Some((r, i)) => (Some(r), i),
                // Index 0: create only if still absent.
                None => (None, 0),
            };
            let (floor, floor_index) = self.restore_floor().await?;
            let planned = plan(stored.as_ref(), floor)?;
            let mut ops = Vec::with_capacity(4);
            if let Some(lock) = lock {
                ops.push(TxnOp::CheckSession {
                    key: lock.key.clone(),
                    session: lock.session.clone(),
                });
            }
            let floor_key = self.keys.skip_ahead();
            ops.push(match floor_index {
                0 => TxnOp::CheckNotExists { key: floor_key },
                index => TxnOp::CheckIndex {
                    key: floor_key,
                    index,
                },
            });
            ops.push(TxnOp::Cas {
                key: path.clone(),
                value: encode(&planned.record),
                index,
            });
            ops.extend(self.keys.mark_check());
            match self.client.txn(&ops).await {
                Ok(TxnOutcome::Committed(_)) => {
                    let level = (planned.record.period.0, planned.record.last);
                    self.keys.written().wrote(&path, level);
                    return Ok(planned);
                }
                Ok(TxnOutcome::RolledBack(errors))
                    if lock.is_some() && errors.iter().any(|e| e.op_index == 0) =>
                {
                    return Err(StoreError::LockLost(format!(
                        "format {}: token lock {} is no longer held by this node's session; nothing was reserved",
                        key.format,
                        lock.map_or("", |l| l.key.as_str())
                    )))
                }
                Ok(TxnOutcome::RolledBack(errors)) => {
                    if self.keys.mark_failed(&ops, &errors) {
                        // This node's mark moved: its keeper, or a restore.
                        self.keys.recheck_mark(&self.client).await?;
                        continue;
                    }
                    // The counter or the skip-ahead record moved: re-read.
                    *self.floor_cache() = None;
                    backoff(attempt).await
                }
                Err(e) => {
                    return Err(StoreError::Backend(format!(
                        "format {}: a counter block may or may not have been reserved ({e}); it is not used, retry",
                        key.format
                    )))
                }
            }
        }
        Err(StoreError::Contended(format!(
            "format {}: lost the compare-and-set race {MAX_CAS_ATTEMPTS} times in a row to other nodes reserving counter blocks; retry (or raise the format's step so nodes reserve less often)",
            key.format
        )))
    }
}

async fn backoff(attempt: u32) {
    let cap = 5u64 << attempt.min(5);
    tokio::time::sleep(Duration::from_millis(fastrand::u64(0..=cap))).await;
}
