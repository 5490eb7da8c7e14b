//! Formatted mode: human-readable IDs from the stored format definitions
//! (admin API, config file `[[formats]]`).
//!
//! The compiled formats are one table behind an [`ArcSwap`]: a call loads
//! the table once and uses that format to the end, and a reload
//! ([`Formats::compile_table`], then [`Formats::install`]) swaps in a whole
//! new table only after every format in it compiled and validated, so
//! calls see the old definitions or the new ones, never a mix and never a
//! format that failed. Counters are keyed by format name and scope, not by
//! table, so they carry on across reloads (see `modes::format_reload`).
//!
//! Each counter (format, scope-parameter values, and the node for
//! per-node formats) keeps a small block of values in memory. A block is
//! reserved through [`FormatStore::reserve`], which writes the counter's
//! record durably before any value of the block is used; a restart loses
//! at most the rest of the block, never repeats it. Every call decides the
//! period against the block's period ([`Format::decide`]): a later period
//! drops the block and reserves from the minimum, a wall clock stepped back
//! across a boundary keeps the later period (rendering at its first
//! instant) and beyond `clock.max_backward` answers UNAVAILABLE.
//!
//! A counter's refill is serialised by a per-counter async gate held over
//! the store write, so one node never races itself for a block; the
//! in-memory block itself is only touched under that gate. Lua rules
//! serialise their own calls (one `Mutex` per rule, inside [`LuaRule`]).
//!
//! [`LuaRule`]: crate::id::format::LuaRule

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;

use crate::error::Error;
use crate::id::format::{
    CounterRecord, Format, FormatDef, LuaLimits, NodeIds, ParsedId, PeriodKey, Rendered, Scope,
};
use crate::id::{check_count, Clock};
use crate::metrics as m;
use crate::store::format::{CounterKey, FormatStore, Plan, Planned, RestoreFloor};
use crate::store::StoreError;

/// How formatted mode runs.
#[derive(Debug, Clone, Copy)]
pub struct FormatSettings {
    /// Counter values reserved per store write (at least what a call asks).
    pub block: u64,
    /// How far (ms) the wall clock may be behind the period a counter is in
    /// before calls are refused (`clock.max_backward`).
    pub max_behind_ms: u64,
    /// Largest `count` per call (`server.max_batch`).
    pub max_batch: u32,
}

/// Values of one counter reserved and not yet used, all in `period`.
#[derive(Debug, Clone, Copy)]
struct Block {
    period: PeriodKey,
    /// The next value to use.
    next: u64,
    /// How many values are left, `next` included.
    left: u64,
    step: u64,
}

type Gate = Arc<tokio::sync::Mutex<Option<Block>>>;

/// Compiled formats by name: what one reload installs.
pub type FormatTable = HashMap<String, Arc<Format>>;

/// The format that failed to compile, and why.
pub type CompileFailure = Box<(String, Error)>;

/// The formatted-mode engine: compiled formats and their counters.
pub struct Formats {
    store: Arc<dyn FormatStore>,
    clock: Arc<dyn Clock>,
    formats: ArcSwap<FormatTable>,
    /// This node's number, checked against per-node formats at compile.
    node: u64,
    counters: Mutex<HashMap<CounterKey, Gate>>,
    settings: FormatSettings,
    issued: metrics::Counter,
}

/// A counter as `GetFormatCounter` shows it.
#[derive(Debug, Clone, Copy)]
pub struct CounterView {
    /// The durable record.
    pub record: CounterRecord,
    /// When the period after the record's starts, Unix ms (`None`: never).
    pub next_period_start_ms: Option<i64>,
}

/// One answered `GenFormatted` call.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The IDs, in order.
    pub ids: Vec<Rendered>,
    /// Whether the format returns numbers (every ID then has one).
    pub numeric: bool,
}

impl Formats {
    /// Compiles `defs` (already validated by config) at the clock's time;
    /// a per-node format must be able to render `node`.
    pub fn new(
        defs: &[FormatDef],
        store: Arc<dyn FormatStore>,
        clock: Arc<dyn Clock>,
        settings: FormatSettings,
        node: u64,
    ) -> Result<Self, Error> {
        let formats = compile_all(defs, clock.now_millis() as i64, node).map_err(|f| f.1)?;
        Ok(Self {
            store,
            clock,
            formats: ArcSwap::from_pointee(formats),
            node,
            counters: Mutex::new(HashMap::new()),
            settings,
            issued: metrics::counter!(m::IDS_ISSUED, "mode" => "formatted"),
        })
    }

    /// The names of the formats served, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.formats.load().keys().cloned().collect();
        names.sort();
        names
    }

    /// Compiles `defs` into a table, each checked as at start-up (and
    /// against this node's number when per node). Nothing is served from
    /// it until [`install`](Self::install). The error names the format.
    pub fn compile_table(&self, defs: &[FormatDef]) -> Result<FormatTable, CompileFailure> {
        compile_all(defs, self.clock.now_millis() as i64, self.node)
    }

    /// The table served now.
    pub fn table(&self) -> Arc<FormatTable> {
        self.formats.load_full()
    }

    /// Serves `table` from now on: calls that already loaded the old one
    /// finish with it; every call after this returns uses the new one.
    pub fn install(&self, table: FormatTable) {
        self.formats.store(Arc::new(table));
    }

    fn format(&self, name: &str) -> Result<Arc<Format>, Error> {
        self.formats
            .load()
            .get(name)
            .cloned()
            .ok_or_else(|| StoreError::FormatNotFound(name.chars().take(80).collect()).into())
    }

    fn key(format: &Format, scope: String, node: u64) -> CounterKey {
        CounterKey {
            format: format.name().to_owned(),
            node: (format.scope() == Scope::Node).then_some(node),
            scope,
        }
    }

    fn gate(&self, key: &CounterKey) -> Gate {
        let mut counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(counters.entry(key.clone()).or_default())
    }

    /// Issues `count` IDs of format `name` for `params` on node `node`
    /// (this node's number, [`crate::id::Snowflake::node_number`]).
    pub async fn generate(
        &self,
        name: &str,
        params: &[(String, String)],
        count: u64,
        node: u64,
    ) -> Result<Issued, Error> {
        let count = u64::from(check_count(count, self.settings.max_batch)?);
        let format = self.format(name)?;
        let bound = format
            .bind(params.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(StoreError::from)?;
        let key = Self::key(&format, bound.scope_key(), node);
        let gate = self.gate(&key);
        // Held over the store write: the per-counter refill gate (see the
        // module doc), never a lock other counters wait on.
        let mut held = gate.lock().await;
        let mut ids = Vec::with_capacity(count as usize);
        while (ids.len() as u64) < count {
            let now = self.clock.now_millis() as i64;
            let (block, render_at) = match self.usable(&format, *held, now)? {
                Some(found) => found,
                None => {
                    let want = (count - ids.len() as u64).max(self.settings.block);
                    let planned = self.reserve(&format, &key, now, want).await?;
                    let b = planned.block;
                    let block = Block {
                        period: b.period,
                        next: b.first,
                        left: b.len(),
                        step: b.step,
                    };
                    (block, planned.decision.render_at_ms)
                }
            };
            let mut block = block;
            while (ids.len() as u64) < count && block.left > 0 {
                let value = block.next;
                // Used from here on, rendered or not.
                block.left -= 1;
                if block.left > 0 {
                    block.next += block.step;
                }
                *held = (block.left > 0).then_some(block);
                let id = format
                    .render(render_at, value, node_ids(node), &bound)
                    .map_err(StoreError::from)?;
                ids.push(id);
            }
        }
        self.issued.increment(count);
        Ok(Issued {
            ids,
            numeric: format.numeric(),
        })
    }

    /// The block in memory if it may serve at `now` (same period, or held
    /// within tolerance), with the instant to render at; `None` to reserve
    /// a new one.
    fn usable(
        &self,
        format: &Format,
        held: Option<Block>,
        now: i64,
    ) -> Result<Option<(Block, i64)>, Error> {
        let Some(block) = held else { return Ok(None) };
        if block.left == 0 {
            return Ok(None);
        }
        let decision = format
            .decide(Some(block.period), now)
            .map_err(StoreError::from)?;
        if decision.key != block.period {
            // A later period: the rest of this block is never used.
            return Ok(None);
        }
        check_behind(format, &decision, self.settings.max_behind_ms)?;
        Ok(Some((block, decision.render_at_ms)))
    }

    /// Reserves the next block of `key` durably (see [`FormatStore`]).
    async fn reserve(
        &self,
        format: &Arc<Format>,
        key: &CounterKey,
        now: i64,
        want: u64,
    ) -> Result<Planned, Error> {
        let format = Arc::clone(format);
        let max_behind = self.settings.max_behind_ms;
        let plan: Plan = Arc::new(move |stored: Option<&CounterRecord>, restored| {
            let decision = format.decide(stored.map(|r| r.period), now)?;
            check_behind(&format, &decision, max_behind)?;
            let floored = restored.and_then(|r| floored_start(&format, &decision, r));
            let (block, record) = match floored {
                // Continue above the floor as if it had been stored.
                Some(start) => {
                    let d = format.decide(Some(start.period), now)?;
                    let (block, record) = format.next_block(Some(&start), &d, want)?;
                    return Ok(Planned {
                        record,
                        block,
                        decision: d,
                    });
                }
                None => format.next_block(stored, &decision, want)?,
            };
            Ok(Planned {
                record,
                block,
                decision,
            })
        });
        Ok(self.store.reserve(key, plan).await?)
    }

    /// Splits `id` into the fields of format `name`.
    pub fn parse(&self, name: &str, id: &str) -> Result<ParsedId, Error> {
        Ok(self.format(name)?.parse(id).map_err(StoreError::from)?)
    }

    /// The durable record of a counter (seed 003's monitor): the period
    /// it is in and the last value any node may have used; `None` if the
    /// counter was never used.
    pub async fn counter(
        &self,
        name: &str,
        params: &[(String, String)],
        node: u64,
    ) -> Result<Option<CounterView>, Error> {
        let format = self.format(name)?;
        let bound = format
            .bind(params.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(StoreError::from)?;
        let key = Self::key(&format, bound.scope_key(), node);
        let Some(record) = self.store.load(&key).await? else {
            return Ok(None);
        };
        let next_period_start_ms = format
            .next_period_start(record.period)
            .map_err(StoreError::from)?;
        Ok(Some(CounterView {
            record,
            next_period_start_ms,
        }))
    }

    /// The compiled format `name`.
    pub fn get(&self, name: &str) -> Result<Arc<Format>, Error> {
        self.format(name)
    }
}

/// Compiles every definition at `now` for node `node`; the first failure
/// with the name of the format that failed.
fn compile_all(defs: &[FormatDef], now: i64, node: u64) -> Result<FormatTable, CompileFailure> {
    let mut formats = HashMap::new();
    for def in defs {
        let failed = |e: crate::id::format::FormatError| {
            Box::new((def.name.clone(), StoreError::from(e).into()))
        };
        let format = Format::compile(def.clone(), now, LuaLimits::default()).map_err(failed)?;
        if format.scope() == Scope::Node {
            format.check_node(node_ids(node)).map_err(failed)?;
        }
        formats.insert(def.name.clone(), Arc::new(format));
    }
    Ok(formats)
}

/// On a restored store: a period starting fresh whose first instant is at
/// or before the restore's floor instant may have been used by the lost
/// node after the snapshot, so its counter starts `floor` above the
/// minimum (the record to continue above); `None` otherwise.
fn floored_start(
    format: &Format,
    decision: &crate::id::format::PeriodDecision,
    restored: RestoreFloor,
) -> Option<CounterRecord> {
    if !decision.starts_fresh() || restored.floor == 0 {
        return None;
    }
    let floored = CounterRecord {
        period: decision.key,
        last: format.counter().min.saturating_add(restored.floor),
    };
    match format.decide(None, restored.until_ms) {
        Ok(d) if decision.key > d.key => None,
        // Unknown: floor it (a gap is safe, a repeat is not).
        _ => Some(floored),
    }
}

/// Refuses when the wall clock is further behind the counter's (later)
/// period than the tolerance.
fn check_behind(
    format: &Format,
    decision: &crate::id::format::PeriodDecision,
    max_behind_ms: u64,
) -> Result<(), StoreError> {
    if decision.may_issue(max_behind_ms) {
        return Ok(());
    }
    let behind_ms = match decision.step {
        crate::id::format::PeriodStep::Held { behind_ms } => behind_ms,
        _ => 0,
    };
    Err(StoreError::FormatHeld {
        format: format.name().to_owned(),
        behind_ms,
    })
}

/// The node's identity as formats render it: its number serves as both
/// `{node:N}` and the token (`{token:..}`, `uniq64`).
fn node_ids(node: u64) -> NodeIds {
    NodeIds {
        node: Some(node),
        token: Some(node),
    }
}
