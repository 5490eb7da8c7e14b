//! Durable counters of formatted mode, on both backends.
//!
//! One [`CounterRecord`] (period + last value reserved in it) per format,
//! scope key and, for per-node formats, node. [`FormatCounterStore::reserve`] is
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

mod consul;
mod embedded;

use std::sync::Arc;

use async_trait::async_trait;
use redb::TableDefinition;

use crate::id::format::{CounterBlock, CounterRecord, PeriodDecision};
use crate::store::StoreError;

pub use consul::{ConsulFormatCounterStore, MAX_CAS_ATTEMPTS};

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
pub trait FormatCounterStore: Send + Sync + 'static {
    /// Reads a counter's record (strongest consistency the backend
    /// offers); `None` if never written.
    async fn load(&self, key: &CounterKey) -> Result<Option<CounterRecord>, StoreError>;

    /// Runs `plan` on the stored record and writes the record it returns;
    /// returns the plan only once that write is durable.
    async fn reserve(&self, key: &CounterKey, plan: Plan) -> Result<Planned, StoreError>;

    /// How many counter records of `format` the store holds (every scope
    /// value, node and token; what `formatted.max_scope_values` bounds).
    async fn count_counters(&self, format: &str) -> Result<u64, StoreError>;

    /// [`FormatCounterStore::reserve`] for a token's counter: in Consul the write
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
