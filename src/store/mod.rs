//! Durable coordination state behind one trait.
//!
//! The generator only trusts a high-water mark once a [`HwmStore`] has
//! said it is durable. Two backends implement the trait: [`embedded`] (a
//! redb file, one node) and [`consul`] (Consul KV, written only while this
//! node holds its worker lock).

pub mod cluster_layout;
pub mod consul;
pub(crate) mod counts;
pub mod embedded;
pub mod fault_hook;
pub mod format;
pub mod format_def;
pub mod format_restore;
pub mod format_tokens;
pub mod hwm;
pub mod lease;
pub mod regression;
pub mod reopen;
pub mod segment;
pub mod skip_ahead;
pub mod snapshot;
pub mod state_file;
pub mod strict;

use crate::id::ErrorKind;
use std::fmt;

use async_trait::async_trait;
use thiserror::Error;

pub use embedded::EmbeddedStore;
pub use hwm::HwmKeeper;
pub use segment::{ConsulSegmentStore, SegmentStore};

/// Identifies one snowflake worker in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorkerKey {
    /// Datacenter id.
    pub datacenter: u64,
    /// Worker id within the datacenter.
    pub worker: u64,
}

impl fmt::Display for WorkerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.datacenter, self.worker)
    }
}

/// What went wrong in a store.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The state file does not exist and may not be created implicitly.
    #[error("state file {path} does not exist. It holds this node's snowflake high-water mark and its segment, lease and strict counters; without it the node could hand out IDs it handed out before, so it will not start. To recover, restore the latest backup: `idgen state restore <backup-file> --config <file> --skip-ahead <margin>` (run it without --skip-ahead first: it prints a margin suggested from the backup's age and recorded issue rates). Do not run `idgen init` to get past this error: it creates an empty file, which restarts segment, lease and strict counters and repeats their IDs; it is only for a node that has never issued any")]
    Missing {
        /// The path that was looked for.
        path: String,
    },
    /// `idgen init` found a state file already there.
    #[error("state file {path} already exists; refusing to overwrite it (it holds the high-water marks that keep IDs unique)")]
    AlreadyExists {
        /// The path.
        path: String,
    },
    /// The state file was created for another layout.
    #[error("this node's layout differs from the layout its state file {path} was initialised for: {}. Two layouts over one state can repeat IDs, so the node refuses to start. Set [layout] back to the recorded one ({stored}); the embedded store has no in-place layout change", layout_fields(.stored, .configured))]
    LayoutMismatch {
        /// The path.
        path: String,
        /// Layout recorded at init.
        stored: String,
        /// Layout in the config.
        configured: String,
    },
    /// The state file was deleted or replaced while the node was running:
    /// the node stopped issuing for good and never recreates it.
    #[error("state file {path} was {what} while this node was running; it stopped issuing IDs in every mode and will not recreate the file. First save what this node still holds with `idgen state backup <file> --addr <this node's gRPC address>` (a rescue snapshot), stop it, then restore with `idgen state restore <file> --config <file> --skip-ahead <margin>` and start it again; do not run `idgen init` (it restarts segment, lease and strict counters). Meanwhile call another node")]
    StateFileLost {
        /// The path.
        path: String,
        /// What happened to it (`deleted`, `replaced by ...`).
        what: String,
    },
    /// The backend failed (disk, database, network).
    #[error("state store error: {0}")]
    Backend(String),
    /// No segment tag by that name.
    #[error(
        "unknown segment tag {0:?}: create it first (admin API), or enable auto-creation in config"
    )]
    TagNotFound(String),
    /// A segment tag by that name exists already.
    #[error("segment tag {0:?} exists already")]
    TagExists(String),
    /// A segment tag or range request is invalid, or the tag is used up.
    #[error(transparent)]
    Segment(#[from] crate::id::segment::SegmentError),
    /// Too many nodes raced for the same record; nothing was taken.
    #[error("{0}")]
    Contended(String),
    /// The store definitely refused the write because this node no longer
    /// holds the worker id (or the mark changed under it): stop issuing.
    #[error("state store refused the write: {0}")]
    LockLost(String),
    /// A strict key, step or request is invalid, or the key is used up.
    #[error(transparent)]
    Strict(#[from] crate::id::strict::StrictError),
    /// A lease token's sequence is used up, or no token is free.
    #[error(transparent)]
    Lease(#[from] crate::id::lease::LeaseError),
    /// Creating one more tag, key or namespace would pass a configured
    /// limit; nothing was created or reserved.
    #[error("{what}: the limit of {limit} set by {setting} is reached, so nothing was created; delete unused ones with the admin API (`idgen admin`), or raise {setting}")]
    LimitReached {
        /// What could not be created (`segment tag "x"`, ...).
        what: String,
        /// The limit.
        limit: u64,
        /// The config key that sets it, also the metric label.
        setting: &'static str,
    },
    /// A formatted-mode request or counter refused (bad parameters, a
    /// counter used up in its period, a Lua rule failing...).
    #[error(transparent)]
    Format(#[from] crate::id::format::FormatError),
    /// No format by that name is defined.
    #[error("unknown format {0:?}: create it with `idgen admin formats create` (or a [[formats]] entry in the config file), then call again")]
    FormatNotFound(String),
    /// A format definition refused by the admin API (it does not compile,
    /// or its Lua rule fails its checks); the message names the format.
    #[error("{0}")]
    FormatInvalid(String),
    /// A live format by that name exists already.
    #[error("format {0:?} exists already: change it with `idgen admin formats update`, or pick another name")]
    FormatExists(String),
    /// The format was deleted: its name is kept as a tombstone for good.
    #[error("format {format:?} was deleted (tombstone since {deleted_ms} ms): its name can never be used again, because its counters stay in the store and a new definition could repeat IDs the old one handed out; pick another name")]
    FormatDeleted {
        /// The format.
        format: String,
        /// When it was deleted, Unix ms.
        deleted_ms: u64,
    },
    /// The wall clock is behind the period a format's counter is in by
    /// more than the tolerance: the node will not re-enter the finished
    /// period, nor print times that far ahead.
    #[error("format {format:?}: the wall clock is {behind_ms} ms behind the period its counter is in (more than clock.max_backward); this node refuses until its clock catches up: retry on another node")]
    FormatHeld {
        /// The format.
        format: String,
        /// How far behind, ms.
        behind_ms: i64,
    },
    /// A Consul read found a counter below what this node wrote to it: the
    /// store was rolled back (a snapshot restore). Issuing from it could
    /// repeat IDs, so the node refuses until the key is above its write.
    #[error("Consul key {key} holds {stored}, below {wrote} that this node wrote to it itself: the Consul state was rolled back (a snapshot restore?), and issuing from it could repeat {kind} IDs, so this node refuses it. Move every counter forward once with `idgen admin skip-ahead --margin <N>` (N above the number of IDs issued since the snapshot; see docs/OPERATIONS.md, \"Restoring a Consul snapshot\"); this node resumes by itself once the key is above {wrote}. Meanwhile call another node")]
    Regressed {
        /// The counter's mode (`segment`, `strict`, `lease`, `format`, `hwm`).
        kind: &'static str,
        /// The Consul key.
        key: String,
        /// What the store holds.
        stored: String,
        /// What this node wrote.
        wrote: String,
    },
    /// A format created on a restored state file whose counter cannot
    /// hold the restore's margin for new formats (see
    /// [`format_restore`]).
    #[error("format {format:?} is new since this state file was restored from a backup (restore instant {until_ms} ms): the lost node may have created a format by this name after the backup and issued its IDs, so a new format's counters in periods up to the restore start {margin} above their minimum (the restore's margin for new formats), but its counter ({range}) cannot hold that. If no format by this name ever issued an ID on this cluster, create it with `idgen admin formats create --fresh` (CreateFormat fresh = true): that is your assertion, and it starts at its minimum (a [[formats]] entry: remove it, start the node, create the format with --fresh, then put the entry back). Otherwise give it another name or a wider counter ({{seq:N}} with more digits)")]
    FormatBelowRestore {
        /// The format.
        format: String,
        /// The restore's margin for new formats.
        margin: u64,
        /// The restore instant, Unix ms.
        until_ms: i64,
        /// The counter's range (`min..=max, step s`).
        range: String,
    },
    /// The cluster record of a regression exists: some node read a
    /// counter below its own write, so every node refuses its Consul
    /// counter modes until a skip-ahead deletes the record.
    #[error("Consul key {key} not used: the cluster record {record} says the node holding worker {node} read {found} below what it wrote there itself (the Consul state was rolled back, a snapshot restore?), so every node refuses segment, strict, lease and formatted IDs: issuing could repeat IDs handed out since the snapshot. Run `idgen admin skip-ahead --margin <N>` once (N above the number of IDs issued since the snapshot; see docs/OPERATIONS.md, \"Restoring a Consul snapshot\"); it deletes the record and nodes resume within one hwm.renew_interval")]
    ClusterRegressed {
        /// The key this call would have read.
        key: String,
        /// The record's Consul key.
        record: String,
        /// The node that detected the regression.
        node: String,
        /// The key it found rolled back.
        found: String,
    },
    /// No live strict key by that name.
    #[error("unknown strict key {0:?}: it was never used, or it was deleted")]
    StrictKeyNotFound(String),
    /// A new scope value would pass `formatted.max_scope_values`.
    #[error("format {format:?}: a new scope value would pass the limit of {limit} counters per format set by formatted.max_scope_values, so nothing was created; values already used keep working. Scope counters are never deleted (a new counter for a used value could repeat its IDs): raise formatted.max_scope_values, or give a new set of values a new format")]
    ScopeValuesFull {
        /// The format.
        format: String,
        /// The limit.
        limit: u64,
    },
}

impl StoreError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::TagNotFound(_) | Self::StrictKeyNotFound(_) | Self::FormatNotFound(_) => {
                ErrorKind::NotFound
            }
            Self::TagExists(_) | Self::FormatExists(_) => ErrorKind::AlreadyExists,
            Self::FormatDeleted { .. } | Self::FormatBelowRestore { .. } => ErrorKind::Precondition,
            Self::FormatInvalid(_) => ErrorKind::BadRequest,
            Self::LimitReached { .. } | Self::ScopeValuesFull { .. } => ErrorKind::Exhausted,
            Self::Segment(e) => e.kind(),
            Self::Lease(e) => e.kind(),
            Self::Strict(e) => e.kind(),
            Self::Format(e) => e.kind(),
            // Start-up and backend failures: another node can serve.
            Self::Missing { .. }
            | Self::AlreadyExists { .. }
            | Self::LayoutMismatch { .. }
            | Self::StateFileLost { .. }
            | Self::Backend(_)
            | Self::Contended(_)
            | Self::LockLost(_)
            | Self::FormatHeld { .. }
            | Self::Regressed { .. }
            | Self::ClusterRegressed { .. } => ErrorKind::Unavailable,
        }
    }
}

impl StoreError {
    /// The refusal for `what` past `limit`, counted in
    /// `idgen_limit_refusals_total{limit=setting}`.
    pub(crate) fn limit_reached(what: String, limit: u64, setting: &'static str) -> Self {
        metrics::counter!(crate::metrics::LIMIT_REFUSALS, "limit" => setting).increment(1);
        Self::LimitReached {
            what,
            limit,
            setting,
        }
    }
}

/// The parts of two layout descriptions (`Layout`'s display form, `time
/// 41x1ms / datacenter 5 / ...`) that differ, as "file has X, this node has
/// Y"; the whole descriptions if they do not line up.
fn layout_fields(stored: &str, configured: &str) -> String {
    let a: Vec<&str> = stored.split(" / ").collect();
    let b: Vec<&str> = configured.split(" / ").collect();
    if a.len() != b.len() {
        return format!("the file has [{stored}], this node has [{configured}]");
    }
    a.iter()
        .zip(&b)
        .filter(|(x, y)| x != y)
        .map(|(x, y)| format!("the file has {x}, this node has {y}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Durable state a node needs to issue IDs safely.
#[async_trait]
pub trait HwmStore: Send + Sync + 'static {
    /// A short name for logs and metrics (`embedded`, `consul`).
    fn backend(&self) -> &'static str;

    /// Reads the stored high-water mark (Unix ms) of `key` with the
    /// strongest consistency the backend offers; `None` if never written.
    async fn load_hwm(&self, key: WorkerKey) -> Result<Option<u64>, StoreError>;

    /// Stores the high-water mark of `key`. Returns only once the value is
    /// durable (fsync'd, or acknowledged by a quorum): the caller hands out
    /// IDs up to it as soon as this returns.
    async fn store_hwm(&self, key: WorkerKey, hwm_ms: u64) -> Result<(), StoreError>;
}
