//! The cluster's ID layout, recorded once in Consul KV at
//! `<prefix>/<cluster>/layout`, as the embedded store records it in its
//! state file.
//!
//! A layout (widths, time unit, epoch) decides which number a given time,
//! node and sequence becomes; two nodes on different layouts, or one node
//! restarted on another, can produce the same number. So:
//! - the first node of a cluster records its layout (create-only: a txn
//!   `cas` with index 0; of two first nodes racing, one writes and the
//!   other compares against what it wrote);
//! - every node compares its configured layout with the record (consistent
//!   read) before it claims a worker id, and refuses a different one,
//!   naming each differing field;
//! - every high-water mark write carries a `check-index` on the record, so
//!   a node still running when the record changes fails its next mark
//!   write and fences itself;
//! - a change ([`change_layout`], behind `idgen admin layout set`) is
//!   accepted only when the new layout's first possible ID lies above
//!   every ID any node may have issued: it first marks the record
//!   "changing" (which fences every running node's mark writes and keeps
//!   nodes from starting), then reads every stored mark, which can no
//!   longer move, and writes the new layout (or puts the old one back).
//!
//! The new layout also records `floor_ms`, the time its check was made at:
//! nodes on it start no lower than that, whatever their clocks say.

use crate::id::ErrorKind;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::kv_paths::ClusterPaths;
use crate::consul::{Consistency, ConsulClient, ConsulError, KvEntry, KvWrite, TxnOp, TxnOutcome};
use crate::id::{epoch_text, Clock, Layout, LayoutDifference, LayoutSpec};

/// A layout as recorded: the preset name it came from plus every value
/// that decides the bits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedLayout {
    /// Preset name from the config (`twitter`, `sonyflake+overrides`, ...);
    /// for operators: the widths below are what counts.
    pub preset: String,
    /// The epoch, RFC 3339 (for operators; `epoch_ms` is what counts).
    pub epoch: String,
    /// The epoch, Unix ms.
    pub epoch_ms: u64,
    /// Length of one time unit, ms.
    pub time_unit_ms: u64,
    /// Width of the time field.
    pub time_bits: u8,
    /// Width of the datacenter field.
    pub datacenter_bits: u8,
    /// Width of the worker field.
    pub worker_bits: u8,
    /// Width of the sequence field.
    pub sequence_bits: u8,
    /// How the layout's IDs are hidden (`layout.hide`, its key and version
    /// width, as text); empty: not hidden. Part of the layout: a node
    /// whose hiding differs is refused like one with other widths.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hide: String,
}

impl RecordedLayout {
    /// The record of `layout`, configured from `preset`.
    pub fn of(layout: &Layout, preset: &str) -> Self {
        let s = layout.spec();
        Self {
            preset: preset.to_owned(),
            epoch: epoch_text(s.epoch_ms)
                .split(' ')
                .next()
                .unwrap_or_default()
                .to_owned(),
            epoch_ms: s.epoch_ms,
            time_unit_ms: s.time_unit_ms,
            time_bits: s.time_bits,
            datacenter_bits: s.datacenter_bits,
            worker_bits: s.worker_bits,
            sequence_bits: s.sequence_bits,
            hide: String::new(),
        }
    }

    /// The same record with the hiding `hide` (empty: not hidden).
    pub fn with_hide(mut self, hide: &str) -> Self {
        hide.clone_into(&mut self.hide);
        self
    }

    /// Every field in which the two differ, named by config key: the
    /// widths and epoch, and `layout.hide`. Empty when they make the
    /// same IDs.
    pub fn differences(&self, other: &RecordedLayout) -> Vec<LayoutDifference> {
        let mut out = self.spec().differences(&other.spec());
        if self.hide != other.hide {
            let shown = |h: &str| {
                if h.is_empty() {
                    "off".to_owned()
                } else {
                    h.to_owned()
                }
            };
            out.push(LayoutDifference {
                field: "layout.hide",
                left: shown(&self.hide),
                right: shown(&other.hide),
            });
        }
        out
    }

    /// The widths and epoch.
    pub fn spec(&self) -> LayoutSpec {
        LayoutSpec {
            epoch_ms: self.epoch_ms,
            time_unit_ms: self.time_unit_ms,
            time_bits: self.time_bits,
            datacenter_bits: self.datacenter_bits,
            worker_bits: self.worker_bits,
            sequence_bits: self.sequence_bits,
        }
    }

    /// One line for logs and errors.
    pub fn describe(&self) -> String {
        format!(
            "preset {} / time {}x{}ms / datacenter {} / worker {} / sequence {} / epoch {}",
            self.preset,
            self.time_bits,
            self.time_unit_ms,
            self.datacenter_bits,
            self.worker_bits,
            self.sequence_bits,
            epoch_text(self.epoch_ms)
        ) + &if self.hide.is_empty() {
            String::new()
        } else {
            format!(" / hide {}", self.hide)
        }
    }
}

/// A layout the cluster used before the current one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Its generation.
    pub generation: u64,
    /// The layout.
    pub layout: RecordedLayout,
    /// When it was replaced, Unix ms.
    pub replaced_ms: u64,
    /// The largest ID it may have produced (from the stored marks).
    pub max_id: u64,
}

/// The value at `<prefix>/<cluster>/layout` (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutRecord {
    /// 1 for the first layout, +1 for every change (and every aborted
    /// change): a node compares it to notice a change.
    pub generation: u64,
    /// The layout in force.
    pub layout: RecordedLayout,
    /// Nodes on this layout start no lower than this time (Unix ms); 0 for
    /// the cluster's first layout.
    #[serde(default)]
    pub floor_ms: u64,
    /// Every ID issued under earlier layouts is at most this (0: none).
    #[serde(default)]
    pub floor_id: u64,
    /// Set while `idgen admin layout set` checks a change: no node may
    /// start and no mark may move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changing_to: Option<RecordedLayout>,
    /// When this generation was written, Unix ms.
    #[serde(default)]
    pub recorded_ms: u64,
    /// Who wrote this generation through `idgen admin layout set` (the
    /// node that served the call); empty for a first node's record.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub recorded_by: String,
    /// Earlier layouts, oldest first.
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
}

/// What a node checked at start: the record's ModifyIndex (every mark
/// write checks it) and the floor of the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutGuard {
    /// The layout key.
    pub key: String,
    /// Its ModifyIndex when read.
    pub index: u64,
    /// The record's generation.
    pub generation: u64,
    /// The layout's floor (Unix ms).
    pub floor_ms: u64,
}

/// Why a layout was refused or could not be checked.
#[derive(Debug, Error)]
pub enum ClusterLayoutError {
    /// The configured layout is not the cluster's.
    #[error("{}", mismatch_text(.key, .generation, .recorded, .configured, .differences))]
    Mismatch {
        /// The layout key.
        key: String,
        /// The record's generation.
        generation: u64,
        /// The recorded layout.
        recorded: Box<RecordedLayout>,
        /// This node's layout.
        configured: Box<RecordedLayout>,
        /// Each differing field.
        differences: Vec<LayoutDifference>,
    },
    /// A change is being checked right now.
    #[error("the cluster layout at {key} is being changed (to {to}); no node starts until `idgen admin layout set` finishes (if it was interrupted, the first node to start a minute after it began puts the old layout back); retry shortly")]
    Changing {
        /// The layout key.
        key: String,
        /// The layout being changed to.
        to: String,
    },
    /// The record cannot be read as a layout record.
    #[error("{key} holds {detail}, not an idgen layout record; restore it (see `idgen admin layout get` on a node that still runs) rather than deleting it: without it nodes with another layout could repeat IDs")]
    Corrupt {
        /// The layout key.
        key: String,
        /// What was wrong.
        detail: String,
    },
    /// The recorded layout itself does not validate (a hand edit).
    #[error("the layout recorded at {key} is invalid: {detail}")]
    Invalid {
        /// The layout key.
        key: String,
        /// Why.
        detail: String,
    },
    /// A change was refused: the new layout could repeat an ID.
    #[error("layout change refused: the new layout's first possible ID now ({first_id}) is not above {max_id}, the largest ID the current layout may have issued (stored high-water mark {mark_ms} ms of worker {worker}{floor}); move layout.epoch back by at least {short_ms} ms more, or widen the time field, so that the new layout's IDs start above every earlier one")]
    Unsafe {
        /// The new layout's first ID at the time of the check.
        first_id: u64,
        /// The bound it must exceed.
        max_id: u64,
        /// The mark that decided it.
        mark_ms: u64,
        /// Which worker's mark (`dc/worker`, or `earlier layouts`).
        worker: String,
        /// Extra text about earlier layouts.
        floor: String,
        /// How far the epoch is short (ms), roughly.
        short_ms: u64,
    },
    /// Another change won the race.
    #[error("the cluster layout changed while this change was checked (generation {seen} is no longer current); read it again with `idgen admin layout get` and retry")]
    Conflict {
        /// The generation this change started from.
        seen: u64,
    },
    /// The new layout is not a valid layout.
    #[error("{0}")]
    BadRequest(String),
    /// In a federation the primary Consul datacenter did not answer the
    /// first read of a layout change (rule 45): nothing was written.
    #[error("cannot reach the primary Consul datacenter {primary:?} (consul.primary_datacenter) to change the cluster layout: {source}. In a federation a layout change writes the primary's layout record first and this datacenter's after it, so nothing was changed, in either; restore the link to {primary:?} (or run the change on a node of {primary:?}) and run `idgen admin layout set` again")]
    PrimaryUnreachable {
        /// The primary Consul datacenter.
        primary: String,
        /// What failed.
        #[source]
        source: ConsulError,
    },
    /// In a federation a change may not move the fields that keep
    /// datacenters apart (rule 45).
    #[error("layout change refused: in a federation of Consul datacenters a layout change may move the epoch, the time unit and the time field only, and this one changes {fields}: with those fields moved an ID of one datacenter's new layout could equal an ID another datacenter issued on the old one. Keep them, or move to a new cluster (new [consul] cluster name) with the layout you want")]
    FederationWidths {
        /// Each changed field, with both values.
        fields: String,
    },
    /// The primary Consul datacenter's record, the federation's layout,
    /// refused this node (rule 40).
    #[error("{source} (this is the layout recorded in the primary Consul datacenter {primary:?}, the one layout of the federation: when it was changed on purpose, restart this datacenter's nodes with that [layout] (`idgen admin layout get` on a node of {primary:?} prints it); the first to start brings this datacenter's own record to it, as `idgen admin layout set` would)")]
    InPrimary {
        /// The primary Consul datacenter.
        primary: String,
        /// The refusal.
        #[source]
        source: Box<ClusterLayoutError>,
    },
    /// The primary's record was changed, this datacenter's was not.
    #[error("the layout in the primary Consul datacenter {primary:?} was changed, but this Consul datacenter's own layout record was not: {source}. Run the same `idgen admin layout set` here again: the primary holds the new layout already, so only this datacenter's record changes")]
    LocalPending {
        /// The primary Consul datacenter.
        primary: String,
        /// Why this datacenter's record was not changed.
        #[source]
        source: Box<ClusterLayoutError>,
    },
    /// Consul failed.
    #[error(transparent)]
    Consul(#[from] ConsulError),
}

impl ClusterLayoutError {
    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Mismatch { .. }
            | Self::Unsafe { .. }
            | Self::Invalid { .. }
            | Self::Corrupt { .. } => ErrorKind::Precondition,
            Self::BadRequest(_) => ErrorKind::BadRequest,
            Self::Conflict { .. } => ErrorKind::Conflict,
            Self::FederationWidths { .. } => ErrorKind::Precondition,
            Self::InPrimary { source, .. } | Self::LocalPending { source, .. } => source.kind(),
            Self::Changing { .. } | Self::Consul(_) | Self::PrimaryUnreachable { .. } => {
                ErrorKind::Unavailable
            }
        }
    }
}

fn mismatch_text(
    key: &str,
    generation: &u64,
    recorded: &RecordedLayout,
    configured: &RecordedLayout,
    differences: &[LayoutDifference],
) -> String {
    let mut fields: Vec<String> = differences
        .iter()
        .map(|d| {
            format!(
                "{}: cluster has {}, this node has {}",
                d.field, d.left, d.right
            )
        })
        .collect();
    if recorded.preset != configured.preset {
        fields.insert(
            0,
            format!(
                "layout.preset: cluster has {}, this node has {}",
                recorded.preset, configured.preset
            ),
        );
    }
    format!(
        "this node's layout differs from the cluster's layout recorded at {key} (generation {generation}): {}. Two layouts in one cluster can repeat IDs, so the node refuses to start. Set [layout] back to the recorded one ({}); to change the cluster's layout on purpose use `idgen admin layout set`, which is accepted only when no ID can repeat",
        fields.join("; "),
        recorded.describe()
    )
}

/// Why a node that runs `mine` and checked generation `seen` of the
/// record is fenced, when the record now says the layout changed (or is
/// being changed) away from it: the text its refusals carry. `None` when
/// the record still holds `mine` (the fence was a plain lock loss).
pub fn fence_reason(record: &LayoutRecord, mine: &RecordedLayout, seen: u64) -> Option<String> {
    if record.generation == seen {
        return None;
    }
    let by = if record.recorded_by.is_empty() {
        String::new()
    } else {
        format!(" by {}", record.recorded_by)
    };
    let at = epoch_text(record.recorded_ms);
    if let Some(to) = &record.changing_to {
        return Some(format!(
            "the cluster layout is being changed from {} to {} (marked at {at}{by}, generation {}); this node runs the old layout and is fenced: once the change is recorded, restart it with the new [layout] (`idgen admin layout get` prints it); see docs/OPERATIONS.md#changing-the-cluster-layout",
            mine.describe(),
            to.describe(),
            record.generation
        ));
    }
    if record.layout.differences(mine).is_empty() {
        return None;
    }
    Some(format!(
        "the cluster layout changed from {} to {} (recorded at {at}{by}, generation {}); this node runs {} and is fenced until it restarts with layout {}: set [layout] to it (`idgen admin layout get` prints it) and restart; see docs/OPERATIONS.md#changing-the-cluster-layout",
        mine.describe(),
        record.layout.describe(),
        record.generation,
        mine.describe(),
        record.layout.describe()
    ))
}

/// `admin layout set` refuses a hidden cluster: hidden IDs are not
/// ordered by the numbers the change's floor compares.
fn refuse_hidden(record: &LayoutRecord) -> Result<(), ClusterLayoutError> {
    if record.layout.hide.is_empty() {
        return Ok(());
    }
    Err(ClusterLayoutError::BadRequest(format!(
        "the cluster's IDs are hidden ({}): `admin layout set` cannot yet prove a new layout's hidden IDs lie apart from the old ones; keep the layout, or move to a new cluster (new [consul] cluster name) with the layout you want",
        record.layout.describe()
    )))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn decode(entry: &KvEntry) -> Result<LayoutRecord, ClusterLayoutError> {
    serde_json::from_slice(&entry.value).map_err(|e| ClusterLayoutError::Corrupt {
        key: entry.key.clone(),
        detail: format!(
            "{:?} ({e})",
            String::from_utf8_lossy(&entry.value)
                .chars()
                .take(200)
                .collect::<String>()
        ),
    })
}

/// Reads the record (consistent): `None` if the cluster has none yet.
pub async fn read_layout(
    client: &ConsulClient,
    keys: &ClusterPaths,
) -> Result<Option<(LayoutRecord, u64)>, ClusterLayoutError> {
    let (entry, _) = client
        .kv_get(&keys.layout(), Consistency::Consistent)
        .await?;
    match entry {
        None => Ok(None),
        Some(e) => Ok(Some((decode(&e)?, e.modify_index))),
    }
}

/// Compares `layout` with the cluster's record, recording it first if the
/// cluster has none. Returns what every mark write must check.
pub async fn ensure_layout(
    client: &ConsulClient,
    keys: &ClusterPaths,
    layout: &Layout,
    (preset, hide): (&str, &str),
) -> Result<LayoutGuard, ClusterLayoutError> {
    let key = keys.layout();
    let mine = RecordedLayout::of(layout, preset).with_hide(hide);
    // Three rounds at most: absent -> create, or lose the race -> read;
    // a stale change rolled back -> read.
    for _ in 0..3 {
        let Some((record, index)) = read_layout(client, keys).await? else {
            let record = LayoutRecord {
                generation: 1,
                layout: mine.clone(),
                floor_ms: 0,
                floor_id: 0,
                changing_to: None,
                recorded_ms: now_ms(),
                recorded_by: String::new(),
                history: Vec::new(),
            };
            let value = serde_json::to_vec(&record).unwrap_or_default();
            let ops = [TxnOp::Cas {
                key: key.clone(),
                value,
                index: 0,
            }];
            match client.txn(&ops).await? {
                TxnOutcome::Committed(results) => {
                    let index = results
                        .iter()
                        .find(|e| e.key == key)
                        .map(|e| e.modify_index);
                    if let Some(index) = index {
                        tracing::info!(key = %key, layout = %mine.describe(), "first node of the cluster: layout recorded");
                        return Ok(LayoutGuard {
                            key,
                            index,
                            generation: 1,
                            floor_ms: 0,
                        });
                    }
                    // No index in the answer: read it back.
                    continue;
                }
                // Another first node won: compare with what it wrote.
                TxnOutcome::RolledBack(_) => continue,
            }
        };
        if record.changing_to.is_some()
            && now_ms().saturating_sub(record.recorded_ms) > STALE_CHANGE.as_millis() as u64
        {
            roll_back(client, &key, &record, index).await?;
            continue;
        }
        return check(&key, &record, index, &mine);
    }
    let (record, index) =
        read_layout(client, keys)
            .await?
            .ok_or_else(|| ClusterLayoutError::Corrupt {
                key: key.clone(),
                detail: "nothing (it was deleted while this node recorded it)".into(),
            })?;
    check(&key, &record, index, &mine)
}

/// A change still marked in progress this long after it was marked was
/// interrupted (the admin call takes milliseconds between its steps).
pub const STALE_CHANGE: std::time::Duration = std::time::Duration::from_secs(60);

/// Puts the layout in force back after an interrupted change: always safe,
/// since no mark moved and no node started while the change was marked. A
/// `cas`, so an admin call that does finish meanwhile wins (and this node
/// then compares against its result).
async fn roll_back(
    client: &ConsulClient,
    key: &str,
    record: &LayoutRecord,
    index: u64,
) -> Result<(), ClusterLayoutError> {
    let mut restored = record.clone();
    restored.generation += 1;
    restored.changing_to = None;
    restored.recorded_ms = now_ms();
    if cas_record(client, key, &restored, index).await?.is_some() {
        tracing::warn!(
            key = %key,
            generation = restored.generation,
            marked_ms = record.recorded_ms,
            "a layout change was marked more than {}s ago and never finished: put the layout in force back (run `idgen admin layout set` again to change it)",
            STALE_CHANGE.as_secs()
        );
    }
    Ok(())
}

fn check(
    key: &str,
    record: &LayoutRecord,
    index: u64,
    mine: &RecordedLayout,
) -> Result<LayoutGuard, ClusterLayoutError> {
    if let Some(to) = &record.changing_to {
        return Err(ClusterLayoutError::Changing {
            key: key.to_owned(),
            to: to.describe(),
        });
    }
    let differences = record.layout.differences(mine);
    if !differences.is_empty() {
        return Err(ClusterLayoutError::Mismatch {
            key: key.to_owned(),
            generation: record.generation,
            recorded: Box::new(record.layout.clone()),
            configured: Box::new(mine.clone()),
            differences,
        });
    }
    Ok(LayoutGuard {
        key: key.to_owned(),
        index,
        generation: record.generation,
        floor_ms: record.floor_ms,
    })
}

/// The largest ID any node may have issued under `record`: its layout at
/// every stored mark (any node, any sequence), and every earlier layout's.
/// Returns (bound, mark, which worker).
fn issued_bound(
    record: &LayoutRecord,
    layout: &Layout,
    marks: &[(String, u64)],
) -> (u64, u64, String) {
    let mut best = (record.floor_id, 0, "earlier layouts".to_owned());
    for (worker, mark) in marks {
        let id = layout.max_id_at(*mark);
        if id > best.0 {
            best = (id, *mark, worker.clone());
        }
    }
    best
}

/// Reads every stored high-water mark (consistent): (`dc/worker`, ms).
async fn stored_marks(
    client: &ConsulClient,
    keys: &ClusterPaths,
) -> Result<Vec<(String, u64)>, ClusterLayoutError> {
    let dir = keys.hwm_dir();
    let entries = match client.kv_list(&dir, Consistency::Consistent).await {
        Ok(e) => e,
        Err(e) => return Err(e.into()),
    };
    let mut out = Vec::new();
    for e in entries {
        let text = String::from_utf8_lossy(&e.value);
        let mark = text
            .trim()
            .parse::<u64>()
            .map_err(|_| ClusterLayoutError::Corrupt {
                key: e.key.clone(),
                detail: format!("{text:?}"),
            })?;
        let worker = e.key.strip_prefix(&dir).unwrap_or(&e.key).to_owned();
        out.push((worker, mark));
    }
    Ok(out)
}

/// What an accepted change did.
#[derive(Debug, Clone)]
pub struct ChangeReport {
    /// The record now in force.
    pub record: LayoutRecord,
    /// The largest ID the old layout may have issued.
    pub old_max_id: u64,
    /// The new layout's first possible ID.
    pub new_first_id: u64,
}

/// Why a proposed change is unsafe, if it is: checks `new` at `at_ms`
/// against `record` and the stored `marks`.
fn verify(
    record: &LayoutRecord,
    new: &Layout,
    marks: &[(String, u64)],
    at_ms: u64,
    key: &str,
) -> Result<(u64, u64), ClusterLayoutError> {
    let current =
        record
            .layout
            .spec()
            .validate(at_ms)
            .map_err(|e| ClusterLayoutError::Invalid {
                key: key.to_owned(),
                detail: e.to_string(),
            })?;
    let (max_id, mark_ms, worker) = issued_bound(record, &current, marks);
    let first_id = new.first_id_at(at_ms);
    if first_id > max_id {
        return Ok((max_id, first_id));
    }
    // How much earlier the epoch would have to be, at the new layout's
    // time unit: the ID gap over the value of one time unit.
    let unit_value = new.first_id_at(new.unix_ms_of(1)).max(1);
    let short_units = (max_id - first_id) / unit_value + 1;
    Err(ClusterLayoutError::Unsafe {
        first_id,
        max_id,
        mark_ms,
        worker,
        floor: if record.floor_id > 0 {
            format!(", or IDs of earlier layouts up to {}", record.floor_id)
        } else {
            String::new()
        },
        short_ms: short_units.saturating_mul(new.time_unit_ms()),
    })
}

/// Changes the cluster's layout to `new` (from `preset`), if no ID can
/// repeat; see the module doc for the steps. `expect_generation`, when
/// given, must be the current generation (an operator's read-then-write).
/// `clock` dates the check (and so the new layout's floor); `by` names
/// who asked, recorded for the fence reason of nodes on the old layout.
pub async fn change_layout(
    client: &ConsulClient,
    keys: &ClusterPaths,
    (new, preset): (&Layout, &str),
    expect_generation: Option<u64>,
    clock: &dyn Clock,
    by: &str,
) -> Result<ChangeReport, ClusterLayoutError> {
    let now_ms = || clock.now_millis();
    let key = keys.layout();
    let target = RecordedLayout::of(new, preset);
    let Some((record, index)) = read_layout(client, keys).await? else {
        return Err(ClusterLayoutError::BadRequest(format!(
            "no layout is recorded at {key} yet: the first node to start records its configured layout; start the cluster with the layout you want instead"
        )));
    };
    if let Some(g) = expect_generation {
        if g != record.generation {
            return Err(ClusterLayoutError::Conflict { seen: g });
        }
    }
    refuse_hidden(&record)?;
    if record.changing_to.is_none() && record.layout.spec() == target.spec() {
        return Err(ClusterLayoutError::BadRequest(format!(
            "the cluster already uses this layout ({}); nothing to change",
            record.layout.describe()
        )));
    }
    // Refuse early, without disturbing anyone, when it is unsafe already.
    let marks = stored_marks(client, keys).await?;
    verify(&record, new, &marks, now_ms(), &key)?;

    // Step 1: mark the record changing. Every mark write checks the
    // record's index, so from here no stored mark moves and no node starts.
    let mut changing = record.clone();
    changing.generation += 1;
    changing.changing_to = Some(target.clone());
    changing.recorded_ms = now_ms();
    by.clone_into(&mut changing.recorded_by);
    let changing_index =
        cas_record(client, &key, &changing, index)
            .await?
            .ok_or(ClusterLayoutError::Conflict {
                seen: record.generation,
            })?;
    tracing::warn!(key = %key, to = %target.describe(), "layout change: record marked changing; nodes on the old layout fence at their next mark write");

    // Step 2: the marks are final now; check again and write the result.
    let marks = stored_marks(client, keys).await?;
    let at_ms = now_ms();
    let verdict = verify(&changing, new, &marks, at_ms, &key);
    let mut next = changing.clone();
    next.generation += 1;
    next.changing_to = None;
    next.recorded_ms = now_ms();
    by.clone_into(&mut next.recorded_by);
    let outcome = match verdict {
        Ok((old_max_id, new_first_id)) => {
            next.history.push(HistoryEntry {
                generation: record.generation,
                layout: record.layout.clone(),
                replaced_ms: at_ms,
                max_id: old_max_id,
            });
            next.layout = target;
            next.floor_ms = at_ms;
            next.floor_id = old_max_id;
            Ok((old_max_id, new_first_id))
        }
        // Put the old layout back (a new generation: running nodes were
        // fenced and claim again on it).
        Err(e) => Err(e),
    };
    if cas_record(client, &key, &next, changing_index)
        .await?
        .is_none()
    {
        return Err(ClusterLayoutError::Conflict {
            seen: changing.generation,
        });
    }
    let (old_max_id, new_first_id) = outcome?;
    tracing::warn!(key = %key, generation = next.generation, layout = %next.layout.describe(), "cluster layout changed");
    Ok(ChangeReport {
        record: next,
        old_max_id,
        new_first_id,
    })
}

/// Why a running node of a datacenter that is not the primary is fenced
/// when the primary's layout `record` (the federation's, rule 45) no
/// longer holds `mine`: the text its refusals carry, naming each field and
/// the fix. `None` when it still holds `mine` (or the primary has no
/// record: nothing to compare with; the next start records one).
pub fn primary_fence_reason(
    record: Option<&LayoutRecord>,
    mine: &RecordedLayout,
    primary: &str,
) -> Option<String> {
    let record = record?;
    let fix = format!("restart this datacenter's nodes with the primary's [layout] (`idgen admin layout get` on a node of {primary:?} prints it): the first to start brings this datacenter's own record to it, as `idgen admin layout set` would; see docs/CLUSTER.md#several-datacenters");
    if let Some(to) = &record.changing_to {
        return Some(format!(
            "the cluster layout in the primary Consul datacenter {primary:?} is being changed from {} to {} (generation {}); this node runs the old layout and is fenced: once the change is recorded, {fix}",
            mine.describe(),
            to.describe(),
            record.generation
        ));
    }
    let differences = record.layout.differences(mine);
    if differences.is_empty() {
        return None;
    }
    let fields: Vec<String> = differences
        .iter()
        .map(|d| {
            format!(
                "{}: primary has {}, this node has {}",
                d.field, d.left, d.right
            )
        })
        .collect();
    Some(format!(
        "the cluster layout recorded in the primary Consul datacenter {primary:?} (generation {}) is no longer this node's: {}. One federation issues on one layout, so this node is fenced: {fix}",
        record.generation,
        fields.join("; ")
    ))
}

/// The copy of the primary's layout record that a datacenter other than
/// the primary keeps in its own KV, `<prefix>/<cluster>/layout-confirmed`
/// (rule 45): what the primary last said, settled (never a record being
/// changed), compared at start while the primary does not answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfirmedLayout {
    /// The primary Consul datacenter that holds the record.
    pub primary: String,
    /// When it was read there, Unix ms.
    pub confirmed_ms: u64,
    /// The record as the primary held it.
    pub record: LayoutRecord,
}

/// Copies the primary's settled `record` into this datacenter's KV
/// (`local`) when the copy there is of a lower generation, by
/// check-and-set on the copy's ModifyIndex, so nodes copying different
/// generations leave the highest. Whether the copy holds `record`'s
/// generation now; a failure is logged and the next read copies again.
pub async fn confirm_primary_layout(
    local: &ConsulClient,
    keys: &ClusterPaths,
    primary: &str,
    record: &LayoutRecord,
) -> bool {
    if record.changing_to.is_some() {
        return false;
    }
    let key = keys.layout_confirmed();
    for _ in 0..3 {
        let entry = match local.kv_get(&key, Consistency::Consistent).await {
            Ok((entry, _)) => entry,
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "the primary's layout record could not be copied into this datacenter's KV; retried at the next read");
                return false;
            }
        };
        let index = entry.as_ref().map_or(0, |e| e.modify_index);
        let held = entry
            .and_then(|e| serde_json::from_slice::<ConfirmedLayout>(&e.value).ok())
            .filter(|c| c.primary == primary)
            .map(|c| c.record.generation);
        if held.is_some_and(|g| g >= record.generation) {
            return true;
        }
        let copy = ConfirmedLayout {
            primary: primary.to_owned(),
            confirmed_ms: now_ms(),
            record: record.clone(),
        };
        let Ok(value) = serde_json::to_vec(&copy) else {
            return false;
        };
        match local.kv_put(&key, &value, KvWrite::Cas(index)).await {
            Ok(true) => return true,
            // Another node copied meanwhile: compare with its copy.
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "the primary's layout record could not be copied into this datacenter's KV; retried at the next read");
                return false;
            }
        }
    }
    false
}

/// At start while the primary does not answer: `mine` compared with this
/// datacenter's copy of the primary's record, refused (naming each field)
/// on a difference. `Ok(false)`: no copy of this primary to compare with.
pub async fn check_confirmed_layout(
    local: &ConsulClient,
    keys: &ClusterPaths,
    primary: &str,
    mine: &RecordedLayout,
) -> Result<bool, ClusterLayoutError> {
    let key = keys.layout_confirmed();
    let (entry, _) = local.kv_get(&key, Consistency::Consistent).await?;
    let copy = entry
        .and_then(|e| serde_json::from_slice::<ConfirmedLayout>(&e.value).ok())
        .filter(|c| c.primary == primary);
    match copy {
        Some(copy) => check(&key, &copy.record, 0, mine).map(|_| true),
        None => Ok(false),
    }
}

/// In a federation a change may move the time field only (epoch, time
/// unit, time width): the datacenter field then sits at the same bits in
/// the old and the new layout, so two IDs of different datacenter ids
/// differ there, whichever layout each was issued on (rule 45).
fn same_low_widths(old: &RecordedLayout, new: &RecordedLayout) -> Result<(), ClusterLayoutError> {
    let fields: Vec<String> = old
        .spec()
        .differences(&new.spec())
        .into_iter()
        .filter(|d| {
            matches!(
                d.field,
                "layout.datacenter_bits" | "layout.worker_bits" | "layout.sequence_bits"
            )
        })
        .map(|d| format!("{} from {} to {}", d.field, d.left, d.right))
        .collect();
    if fields.is_empty() {
        return Ok(());
    }
    Err(ClusterLayoutError::FederationWidths {
        fields: fields.join(", "),
    })
}

/// Where a layout change runs in a federation of Consul datacenters.
#[derive(Debug, Clone, Copy)]
pub struct LayoutFederation<'a> {
    /// The primary Consul datacenter's name.
    pub primary: &'a str,
    /// A client of the primary (`?dc=`; the local client when the change
    /// runs there).
    pub primary_client: &'a ConsulClient,
    /// The local datacenter's client when it is not the primary (its own
    /// record changes after the primary's); `None` in the primary.
    pub local: Option<&'a ConsulClient>,
}

/// A layout change in a federation (rule 45): the primary's record first,
/// then this datacenter's, each by [`change_layout`] (marked changing,
/// marks read, check-and-set), and only a change of the time field. A
/// primary that does not answer the first read refuses the change with
/// nothing written; a primary that holds `new` already (the change was run
/// in another datacenter) is left alone and only this datacenter's record
/// changes. `expect_generation` is the primary's.
pub async fn change_federated_layout(
    fed: LayoutFederation<'_>,
    keys: &ClusterPaths,
    (new, preset): (&Layout, &str),
    expect_generation: Option<u64>,
    clock: &dyn Clock,
    by: &str,
) -> Result<ChangeReport, ClusterLayoutError> {
    let primary = fed.primary.to_owned();
    let target = RecordedLayout::of(new, preset);
    let holds = |r: &LayoutRecord| r.changing_to.is_none() && r.layout.spec() == target.spec();
    let read = read_layout(fed.primary_client, keys)
        .await
        .map_err(|e| match e {
            ClusterLayoutError::Consul(source) => ClusterLayoutError::PrimaryUnreachable {
                primary: primary.clone(),
                source,
            },
            other => other,
        })?;
    let Some((record, _)) = read else {
        return Err(ClusterLayoutError::BadRequest(format!(
            "no layout is recorded at {} in the primary Consul datacenter {primary:?} yet: the first node to start records its configured layout; start the cluster with the layout you want instead",
            keys.layout()
        )));
    };
    same_low_widths(&record.layout, &target)?;
    // This datacenter's record, checked against its own marks before the
    // primary is touched, so a change unsafe here changes nothing.
    let mut local = None;
    if let Some(client) = fed.local {
        if let Some((own, _)) = read_layout(client, keys).await? {
            if !holds(&own) {
                refuse_hidden(&own)?;
                let marks = stored_marks(client, keys).await?;
                verify(&own, new, &marks, clock.now_millis(), &keys.layout())?;
                local = Some(client);
            }
        }
    }
    let mut report = None;
    if !holds(&record) {
        report = Some(
            change_layout(
                fed.primary_client,
                keys,
                (new, preset),
                expect_generation,
                clock,
                by,
            )
            .await?,
        );
    } else if let Some(seen) = expect_generation.filter(|g| *g != record.generation) {
        return Err(ClusterLayoutError::Conflict { seen });
    }
    if let Some(client) = local {
        match change_layout(client, keys, (new, preset), None, clock, by).await {
            Ok(done) => report = Some(done),
            Err(e) if report.is_some() => {
                return Err(ClusterLayoutError::LocalPending {
                    primary,
                    source: Box::new(e),
                })
            }
            Err(e) => return Err(e),
        }
    }
    report.ok_or_else(|| {
        ClusterLayoutError::BadRequest(format!(
            "the primary Consul datacenter {primary:?} and this datacenter already use this layout ({}); nothing to change",
            record.layout.describe()
        ))
    })
}

/// Writes `record` if the key's ModifyIndex is still `index`; the new
/// ModifyIndex, or `None` if it changed.
async fn cas_record(
    client: &ConsulClient,
    key: &str,
    record: &LayoutRecord,
    index: u64,
) -> Result<Option<u64>, ClusterLayoutError> {
    let ops = [TxnOp::Cas {
        key: key.to_owned(),
        value: serde_json::to_vec(record).unwrap_or_default(),
        index,
    }];
    match client.txn(&ops).await? {
        TxnOutcome::Committed(results) => Ok(Some(
            results
                .iter()
                .find(|e| e.key == key)
                .map(|e| e.modify_index)
                .unwrap_or(index),
        )),
        TxnOutcome::RolledBack(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::{Preset, DEFAULT_EPOCH_MS};

    const NOW: u64 = 1_790_000_000_000;

    fn record(layout: &Layout) -> LayoutRecord {
        LayoutRecord {
            generation: 1,
            layout: RecordedLayout::of(layout, "twitter"),
            floor_ms: 0,
            floor_id: 0,
            changing_to: None,
            recorded_ms: NOW,
            recorded_by: String::new(),
            history: vec![],
        }
    }

    #[test]
    fn a_later_epoch_is_unsafe_and_an_earlier_one_safe() {
        let old = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(NOW)
            .unwrap();
        let r = record(&old);
        let marks = vec![("0/3".to_owned(), NOW + 3000)];
        // Epoch moved forward by a day: its IDs at NOW are far lower.
        let later = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS + 86_400_000)
            .validate(NOW)
            .unwrap();
        let err = verify(&r, &later, &marks, NOW, "k").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("refused") && text.contains("0/3"), "{text}");
        // Same epoch, but the mark is ahead of now: still unsafe.
        let same_epoch_fewer_worker_bits = LayoutSpec {
            worker_bits: 4,
            time_bits: 42,
            ..old.spec()
        }
        .validate(NOW)
        .unwrap();
        assert!(verify(&r, &same_epoch_fewer_worker_bits, &marks, NOW, "k").is_err());
        // Epoch moved back by a year: every new ID is higher.
        let earlier = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS - 365 * 86_400_000)
            .validate(NOW)
            .unwrap();
        let (max, first) = verify(&r, &earlier, &marks, NOW, "k").unwrap();
        assert!(first > max);
        assert_eq!(max, old.max_id_at(NOW + 3000));
        // Earlier layouts' bound counts too.
        let mut r2 = r.clone();
        r2.floor_id = u64::MAX >> 1;
        assert!(verify(&r2, &earlier, &marks, NOW, "k").is_err());
    }

    #[test]
    fn a_hide_change_is_a_layout_difference() {
        let layout = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(NOW)
            .unwrap();
        let plain = record(&layout);
        let sortable = RecordedLayout::of(&layout, "twitter")
            .with_hide("sortable with key \"k\", 2 version bits");
        let opaque = RecordedLayout::of(&layout, "twitter")
            .with_hide("opaque with key \"k\", 2 version bits");
        // Hiding switched on over a plain record: refused, naming layout.hide.
        let err = check("k", &plain, 7, &sortable).unwrap_err().to_string();
        assert!(
            err.contains("layout.hide") && err.contains("off") && err.contains("sortable"),
            "{err}"
        );
        // Sortable switched to opaque, and hiding switched off: refused.
        let mut hidden = plain.clone();
        hidden.layout = sortable.clone();
        assert!(check("k", &hidden, 7, &opaque)
            .unwrap_err()
            .to_string()
            .contains("opaque"));
        let off = RecordedLayout::of(&layout, "twitter");
        assert!(check("k", &hidden, 7, &off).is_err());
        // The same hiding passes, and a running node is not fenced by it.
        assert!(check("k", &hidden, 7, &sortable).is_ok());
        hidden.generation = 2;
        assert_eq!(fence_reason(&hidden, &sortable, 1), None);
        assert!(fence_reason(&hidden, &off, 1).is_some());
        // An old record without the field reads as not hidden.
        let json = serde_json::to_string(&plain).unwrap();
        assert!(!json.contains("hide"));
        let back: LayoutRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back.layout.hide, "");
    }

    #[test]
    fn mismatch_names_every_field_and_both_values() {
        let old = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(NOW)
            .unwrap();
        let new = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS + 1000)
            .validate(NOW)
            .unwrap();
        let err = check(
            "idgen/c/layout",
            &record(&old),
            7,
            &RecordedLayout::of(&new, "twitter"),
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("layout.epoch: cluster has 2024-01-01T00:00:00Z"),
            "{text}"
        );
        assert!(
            text.contains("this node has 2024-01-01T00:00:01Z"),
            "{text}"
        );
        assert!(text.contains("idgen admin layout set"), "{text}");
        let ok = check("k", &record(&old), 7, &RecordedLayout::of(&old, "twitter")).unwrap();
        assert_eq!((ok.index, ok.generation), (7, 1));
    }

    /// Rule 45: in a federation only the time field may move, so the
    /// datacenter field keeps its bits across the change.
    #[test]
    fn a_federation_change_may_move_the_time_field_only() {
        let old = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(NOW)
            .unwrap();
        let earlier = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS - 365 * 86_400_000)
            .validate(NOW)
            .unwrap();
        let mine = RecordedLayout::of(&old, "twitter");
        assert!(same_low_widths(&mine, &RecordedLayout::of(&earlier, "twitter")).is_ok());
        let narrower = LayoutSpec {
            worker_bits: 4,
            time_bits: 42,
            ..old.spec()
        }
        .validate(NOW)
        .unwrap();
        let err = same_low_widths(&mine, &RecordedLayout::of(&narrower, "twitter"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("layout.worker_bits from 5 to 4"), "{err}");
        assert!(!err.contains("time_bits"), "{err}");
    }

    /// Rule 45: a node of another datacenter is fenced by the primary's
    /// record when it is being changed or holds another layout, and the
    /// reason names each field and the fix.
    #[test]
    fn the_primarys_record_fences_another_datacenters_node_naming_each_field() {
        let old = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(NOW)
            .unwrap();
        let new = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS - 365 * 86_400_000)
            .validate(NOW)
            .unwrap();
        let mine = RecordedLayout::of(&old, "twitter");
        assert_eq!(
            primary_fence_reason(Some(&record(&old)), &mine, "dc1"),
            None
        );
        assert_eq!(primary_fence_reason(None, &mine, "dc1"), None);
        let text = primary_fence_reason(Some(&record(&new)), &mine, "dc1").expect("a reason");
        assert!(text.contains("primary Consul datacenter \"dc1\""), "{text}");
        assert!(
            text.contains("layout.epoch: primary has 2023-01-01T00:00:00Z"),
            "{text}"
        );
        assert!(
            text.contains("this node has 2024-01-01T00:00:00Z"),
            "{text}"
        );
        assert!(
            text.contains("restart this datacenter's nodes with the primary's [layout]"),
            "{text}"
        );
        let mut changing = record(&old);
        changing.changing_to = Some(RecordedLayout::of(&new, "twitter"));
        let text = primary_fence_reason(Some(&changing), &mine, "dc1").expect("a reason");
        assert!(text.contains("is being changed from"), "{text}");
    }

    #[test]
    fn the_fence_reason_names_both_layouts_or_nothing() {
        let old = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS)
            .validate(NOW)
            .unwrap();
        let new = Preset::Twitter
            .spec(DEFAULT_EPOCH_MS - 365 * 86_400_000)
            .validate(NOW)
            .unwrap();
        let mine = RecordedLayout::of(&old, "twitter");
        // The record this node checked: a plain lock loss.
        assert_eq!(fence_reason(&record(&old), &mine, 1), None);
        // A rolled-back change (new generation, same layout): no reason,
        // the node claims again on it.
        let mut rolled = record(&old);
        rolled.generation = 3;
        assert_eq!(fence_reason(&rolled, &mine, 1), None);
        // Changed: both layouts, when and by whom, and what to do.
        let mut changed = record(&new);
        changed.generation = 3;
        changed.recorded_by = "`idgen admin layout set` on node n1".into();
        let text = fence_reason(&changed, &mine, 1).expect("a reason");
        assert!(
            text.contains("the cluster layout changed from preset twitter"),
            "{text}"
        );
        assert!(text.contains("epoch 2024-01-01T00:00:00Z"), "{text}");
        assert!(text.contains("to preset twitter"), "{text}");
        assert!(text.contains("epoch 2023-01-01T00:00:00Z"), "{text}");
        assert!(text.contains("recorded at 2026-09-21"), "{text}");
        assert!(text.contains("on node n1"), "{text}");
        assert!(
            text.contains("fenced until it restarts with layout"),
            "{text}"
        );
        // Being changed: names the target.
        let mut changing = record(&old);
        changing.generation = 2;
        changing.changing_to = Some(RecordedLayout::of(&new, "twitter"));
        let text = fence_reason(&changing, &mine, 1).expect("a reason");
        assert!(text.contains("is being changed from"), "{text}");
        assert!(text.contains("epoch 2023-01-01T00:00:00Z"), "{text}");
    }
}
