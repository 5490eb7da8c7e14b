//! Formatted mode: human-readable IDs from the stored format definitions
//! (admin API, config file `[[formats]]`).
//!
//! The compiled formats are one table behind an [`ArcSwap`]: a call loads
//! the table once and uses that format to the end, and a reload
//! ([`FormattedEngine::compile_table`], then [`FormattedEngine::install`]) swaps in a whole
//! new table only after every format in it compiled and validated, so
//! calls see the old definitions or the new ones, never a mix and never a
//! format that failed. Counters are keyed by format name and scope, not by
//! table, so they carry on across reloads (see `modes::format_catalog`).
//!
//! Each counter (format, scope-parameter values, and the node or token
//! for per-node formats) keeps a block of values in memory: at first
//! `formatted.block` values, doubled while blocks are used up within a
//! second (so a busy counter with one-second periods writes about once a
//! period, not once per `formatted.block` IDs) and halved after a minute
//! between reservations (`CounterState`). A block is
//! reserved through [`FormatCounterStore::reserve`], which writes the counter's
//! record durably before any value of the block is used; a restart loses
//! at most the rest of the block, never repeats it. Every call decides the
//! period against the block's period ([`Format::decide`]): a later period
//! drops the block and reserves from the minimum, a wall clock stepped back
//! across a boundary keeps the later period (rendering at its first
//! instant) and beyond `clock.max_backward` answers UNAVAILABLE.
//!
//! Formats that render a token (`{token:N:..}`, `uniq64`) take it from
//! [`FormatTokens`] (lease mode's machinery, a space per width and
//! charset) and keep their counters per token, not per node: a token that
//! passes to another node continues above its last holder's record. In
//! Consul each of their counter writes checks the token's lock; a lock
//! found gone makes the node forget the token and take one again.
//!
//! Counters no call used for ten minutes leave memory ([`EVICT_IDLE_MS`]);
//! their record stays and their next call reserves above it. Each new
//! scope value adds a durable counter for good, so a format holding
//! `formatted.max_scope_values` counters refuses new values.
//!
//! A counter's refill is serialised by a per-counter async gate held over
//! the store write, so one node never races itself for a block; the
//! in-memory block itself is only touched under that gate, and the
//! values are taken from it before they are rendered. A Lua rule renders
//! on the Lua pool's threads under a deadline (`modes::lua_pool`), after
//! the gate is released; the async runtime never runs Lua code.
//!
//! A `{seq:N:hidden}` counter is shown through its format's hider
//! ([`super::hidden`]): checked before a value is reserved, applied to each
//! value taken just before it renders.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;

use crate::error::{Error, Refusal};
use crate::id::format::FormatError;
use crate::id::format::{
    CounterRecord, Format, FormatDef, LoadChecks, LuaLimits, NodeIds, ParsedId, PeriodKey,
    Rendered, Scope,
};
use crate::id::hide::DecimalHider;
use crate::id::Clock;
use crate::metrics as m;
pub use crate::modes::hidden::HiddenView;
use crate::modes::hidden::{shown_all, FormatHiders, Ready};
use crate::modes::hide_keys::HideKeyRings;
use crate::modes::lua_pool::{LuaPool, LuaPoolSettings};
use crate::store::format::counters::{
    CounterKey, FormatCounterStore, Plan, Planned, RestoreFloor, TokenLock,
};
use crate::store::format::tokens::{FormatTokens, HeldToken, TokenError};
use crate::store::StoreError;

/// How formatted mode runs.
#[derive(Debug, Clone, Copy)]
pub struct FormatSettings {
    /// Counter values reserved per store write (at least what a call asks).
    pub block: u64,
    /// How far (ms) the wall clock may be behind the period a counter is in
    /// before calls are refused (`clock.max_backward`).
    pub max_behind_ms: u64,
    /// The threads Lua rules run on (`formatted.lua_workers`,
    /// `formatted.lua_deadline`).
    pub lua: LuaPoolSettings,
    /// Most counters one format keeps in the store, checked when a new
    /// scope value arrives (`formatted.max_scope_values`).
    pub max_scope_values: u64,
    /// Wall-clock time loading one Lua rule may take, its load-time checks
    /// included (`formatted.lua_check_budget`).
    pub lua_check_budget: std::time::Duration,
}

impl FormatSettings {
    /// The limits every Lua rule is loaded under.
    pub fn lua_limits(&self) -> LuaLimits {
        LuaLimits {
            check_budget: self.lua_check_budget,
            ..LuaLimits::default()
        }
    }
}

#[cfg(test)]
impl FormatSettings {
    /// Settings for tests: `block` and `max_scope_values` as given, a
    /// clock allowed 1 s behind, the default Lua pool.
    pub(crate) fn for_tests(block: u64, max_scope_values: u64) -> Self {
        Self {
            block,
            max_behind_ms: 1_000,
            lua: LuaPoolSettings::default(),
            max_scope_values,
            lua_check_budget: crate::id::format::lua::DEFAULT_CHECK_BUDGET,
        }
    }
}

/// A counter unused this long (ms, the format clock) leaves memory; its
/// durable record stays, and its next call reserves above it.
pub const EVICT_IDLE_MS: i64 = 10 * 60 * 1000;
/// How often (ms) creating a counter sweeps idle ones out at most.
const SWEEP_EVERY_MS: i64 = 60 * 1000;

/// Values of one counter reserved and not yet used, all in `period`.
#[derive(Debug, Clone, Copy)]
struct CounterBlock {
    period: PeriodKey,
    /// The next value to use.
    next: u64,
    /// How many values are left, `next` included.
    left: u64,
    step: u64,
}

/// A block that was used up within this long (ms, the format clock) of
/// being reserved makes the next reservation twice as large.
const GROW_WITHIN_MS: i64 = 1_000;
/// A reservation more than this long (ms) after the previous one asks for
/// half as much again (never less than `formatted.block`).
const SHRINK_AFTER_MS: i64 = 60_000;

/// One counter in memory: its block, and how much the next reservation
/// asks for. Sizing, like segment mode's step, only changes how often the
/// store is written and how large a gap a restart leaves: every block is
/// still durable before use.
#[derive(Debug, Default)]
struct CounterState {
    block: Option<CounterBlock>,
    /// Values the next reservation asks for (0 until the first).
    want: u64,
    /// When the last block was reserved (Unix ms; 0: never).
    reserved_at_ms: i64,
    /// The last block was used up (not dropped for a later period).
    used_up: bool,
    /// When a call last used this counter (Unix ms), for eviction.
    used_ms: i64,
}

impl CounterState {
    /// The size of the next reservation at `now`: doubled when the last
    /// block was used up within [`GROW_WITHIN_MS`] (a busy counter, e.g.
    /// idc's one-second periods, then writes about once per period instead
    /// of once per `formatted.block` IDs), halved after
    /// [`SHRINK_AFTER_MS`], within `base..=cap`.
    fn next_want(&mut self, base: u64, cap: u64, now: i64) -> u64 {
        let mut want = self.want.max(base);
        if self.reserved_at_ms != 0 {
            let age = now.saturating_sub(self.reserved_at_ms);
            if self.used_up && age < GROW_WITHIN_MS {
                want = want.saturating_mul(2);
            } else if age > SHRINK_AFTER_MS {
                want /= 2;
            }
        }
        self.want = want.clamp(base, cap.max(base));
        self.used_up = false;
        self.reserved_at_ms = now;
        self.want
    }
}

type Gate = Arc<tokio::sync::Mutex<CounterState>>;

/// Compiled formats by name: what one reload installs.
pub type CompiledFormats = HashMap<String, Arc<Format>>;

/// The format that failed to compile, and why.
pub type CompileFailure = Box<(String, Error)>;

/// The formatted-mode engine: compiled formats and their counters.
pub struct FormattedEngine {
    store: Arc<dyn FormatCounterStore>,
    clock: Arc<dyn Clock>,
    formats: ArcSwap<CompiledFormats>,
    /// This node's number, checked against per-node formats at compile.
    node: u64,
    counters: Mutex<HashMap<CounterKey, Gate>>,
    /// When idle counters were last swept out of `counters` (Unix ms).
    swept_ms: std::sync::atomic::AtomicI64,
    /// Formats found holding `formatted.max_scope_values` counters, and
    /// when (Unix ms): for a second, new values are refused without
    /// counting again, so callers sending new values cannot make every
    /// call a scan of the format's records.
    full: Mutex<HashMap<String, i64>>,
    /// Where `{token}` and `uniq64` formats get their token.
    tokens: Option<Arc<dyn FormatTokens>>,
    settings: FormatSettings,
    /// Where Lua rules run.
    lua: LuaPool,
    issued: metrics::Counter,
    /// Counter reservations (their count is the store writes made).
    store_op: m::StoreOp,
    /// The outputs of `{seq:N:hidden}` formats.
    hiders: FormatHiders,
    /// The Lua rules' load-time checks this engine ran.
    checks: Arc<CheckRuns>,
}

/// Counts the Lua rules whose load-time checks ran
/// (`idgen_lua_checks_total`): at a create, at an update of a definition
/// stored without its check key, and at a load of a stored definition
/// whose check key does not match. Tests read it to see that a restart
/// checks nothing already checked, and can hold a check until released.
#[derive(Default)]
pub struct CheckRuns {
    runs: std::sync::atomic::AtomicU64,
    /// Tests: called with the format's name just before its checks run,
    /// on the compiling thread.
    #[cfg(test)]
    pub(crate) before: Mutex<Option<CheckHook>>,
}

/// Tests: what [`CheckRuns`] calls before a check.
#[cfg(test)]
pub(crate) type CheckHook = Arc<dyn Fn(&str) + Send + Sync>;

impl CheckRuns {
    /// How many rules' checks ran.
    pub fn runs(&self) -> u64 {
        self.runs.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn starting(&self, name: &str) {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!(m::LUA_CHECKS).increment(1);
        #[cfg(test)]
        {
            let hook = self
                .before
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let Some(hook) = hook {
                hook(name);
            }
        }
        #[cfg(not(test))]
        let _ = name;
    }
}

/// A counter as `GetFormatCounter` shows it.
#[derive(Debug, Clone)]
pub struct CounterView {
    /// The durable record.
    pub record: CounterRecord,
    /// When the period after the record's starts, Unix ms (`None`: never).
    pub next_period_start_ms: Option<i64>,
    /// The token whose counter this is, as IDs render it (token formats).
    pub token: Option<String>,
}

/// A format's counters as the console lists them
/// ([`FormattedEngine::counter_overview`]).
#[derive(Debug, Clone)]
pub enum CounterOverview {
    /// An unscoped format's one counter (`None`: never used).
    Single(Option<CounterView>),
    /// A scoped format: its scope parameters and how many counters the
    /// store holds for it.
    Scoped {
        /// The format's `scope_params`.
        params: Vec<String>,
        /// Stored counters, every scope value, node and token.
        counters: u64,
    },
}

/// One answered `GenFormatted` call.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The IDs, in order.
    pub ids: Vec<Rendered>,
    /// Whether the format returns numbers (every ID then has one).
    pub numeric: bool,
}

impl FormattedEngine {
    /// Compiles `defs` (already validated by config) at the clock's time;
    /// a per-node format must be able to render `node`.
    pub fn new(
        defs: &[FormatDef],
        store: Arc<dyn FormatCounterStore>,
        clock: Arc<dyn Clock>,
        settings: FormatSettings,
        node: u64,
    ) -> Result<Self, Error> {
        let checks = Arc::new(CheckRuns::default());
        let defs: Vec<(FormatDef, LoadChecks)> =
            defs.iter().map(|d| (d.clone(), LoadChecks::Run)).collect();
        let at = (clock.now_millis() as i64, node);
        let formats = compile_all(&defs, at, settings.lua_limits(), &checks).map_err(|f| f.1)?;
        Ok(Self {
            store,
            clock,
            formats: ArcSwap::from_pointee(formats),
            node,
            counters: Mutex::new(HashMap::new()),
            swept_ms: std::sync::atomic::AtomicI64::new(0),
            full: Mutex::new(HashMap::new()),
            tokens: None,
            settings,
            lua: LuaPool::new(settings.lua),
            issued: metrics::counter!(m::IDS_ISSUED, "mode" => "formatted"),
            store_op: m::StoreOp::new(m::label::BACKEND_FORMAT, m::label::OP_RESERVE_COUNTER),
            hiders: FormatHiders::default(),
            checks,
        })
    }

    /// Serves `{seq:N:hidden}` formats with the keys of `rings`.
    pub fn with_hide_rings(mut self, rings: HideKeyRings) -> Self {
        self.hiders = FormatHiders::new(rings);
        self
    }

    /// What a parsed ID of a `{seq:N:hidden}` format shows about its
    /// counter `shown` (see [`FormatHiders::view`]); `None` for a plain
    /// format.
    pub fn hidden_view(
        &self,
        name: &str,
        shown: u64,
        reveal: bool,
    ) -> Result<Option<HiddenView>, Error> {
        let format = self.format(name)?;
        self.hiders.view(&format, shown, reveal)
    }

    /// Takes the tokens of `{token}` and `uniq64` formats from `tokens`.
    pub fn with_tokens(mut self, tokens: Arc<dyn FormatTokens>) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// Takes the token of every format that needs one now (start-up), so
    /// a store that cannot deliver fails loudly; a space with no token for
    /// this node is only logged (its formats answer RESOURCE_EXHAUSTED
    /// until one is free).
    pub async fn prime_tokens(&self) -> Result<(), Error> {
        let table = self.formats.load_full();
        let mut names: Vec<&String> = table.keys().collect();
        names.sort();
        for name in names {
            let format = &table[name];
            match self.token_for(format).await {
                Ok(Some(held)) => {
                    tracing::info!(format = %name, token = held.token, "format token held")
                }
                Ok(None) => {}
                Err(Error::Refused(Refusal::Format(e @ FormatError::NoToken { .. }))) => {
                    tracing::warn!(error = %e, "no token for this format yet; its calls answer RESOURCE_EXHAUSTED until one is free")
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The lease was lost (fencing): drops every block of a token's
    /// counter (the tokens went with the session; values left in those
    /// blocks are only a gap).
    pub fn fence(&self) {
        let counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, gate) in counters.iter() {
            if key.token.is_some() {
                if let Ok(mut held) = gate.try_lock() {
                    held.block = None;
                }
            }
        }
    }

    /// The token `format` renders, held now (taken if needed); `None` for
    /// formats without one.
    async fn token_for(&self, format: &Format) -> Result<Option<HeldToken>, Error> {
        let Some(space) = format.token_space() else {
            return Ok(None);
        };
        let no_token = |why: String| -> Error {
            StoreError::Format(FormatError::NoToken {
                format: format.name().to_owned(),
                space: space.name(),
                size: space.size(),
                why,
            })
            .into()
        };
        let tokens = self
            .tokens
            .as_ref()
            .ok_or_else(|| no_token("this node has no token source".into()))?;
        match tokens.hold(space).await {
            Ok(held) => Ok(Some(held)),
            Err(TokenError::Exhausted { why, .. }) => Err(no_token(why)),
            Err(TokenError::Store(e)) => Err(e.into()),
        }
    }

    /// The format tokens this node holds now, by space.
    pub fn held_tokens(&self) -> Vec<(crate::id::format::TokenSpace, u64)> {
        self.tokens.as_ref().map(|t| t.held()).unwrap_or_default()
    }

    /// The names of the formats served, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.formats.load().keys().cloned().collect();
        names.sort();
        names
    }

    /// Compiles `defs` into a table, each checked as at start-up (and
    /// against this node's number when per node), a Lua rule's load-time
    /// checks run or skipped as its [`LoadChecks`] says. Nothing is served
    /// from it until [`install`](Self::install). The error names the
    /// format. Runs on a thread of its own ([`off_runtime`]): compiling a
    /// Lua rule runs it.
    pub async fn compile_table(
        &self,
        defs: Vec<(FormatDef, LoadChecks)>,
    ) -> Result<CompiledFormats, CompileFailure> {
        let at = (self.clock.now_millis() as i64, self.node);
        let (limits, checks) = (self.lua_limits(), Arc::clone(&self.checks));
        off_runtime(move || compile_all(&defs, at, limits, &checks))
            .await
            .unwrap_or_else(|e| {
                let why = format!("compiling the formats failed: {e}");
                Err(Box::new((String::new(), Error::Setup(why))))
            })
    }

    /// The limits Lua rules are loaded under (a stored rule's check key
    /// is taken under them).
    pub fn lua_limits(&self) -> LuaLimits {
        self.settings.lua_limits()
    }

    /// The Lua rules' load-time checks this engine ran.
    pub fn check_runs(&self) -> &CheckRuns {
        &self.checks
    }

    /// The table served now.
    pub fn table(&self) -> Arc<CompiledFormats> {
        self.formats.load_full()
    }

    /// Serves `table` from now on: calls that already loaded the old one
    /// finish with it; every call after this returns uses the new one.
    pub fn install(&self, table: CompiledFormats) {
        self.formats.store(Arc::new(table));
    }

    fn format(&self, name: &str) -> Result<Arc<Format>, Error> {
        self.formats.load().get(name).cloned().ok_or_else(|| {
            StoreError::Format(FormatError::NotFound(name.chars().take(80).collect())).into()
        })
    }

    fn key(format: &Format, scope: String, node: u64, token: Option<u64>) -> CounterKey {
        let per_node = format.scope() == Scope::Node;
        CounterKey {
            format: format.name().to_owned(),
            node: (per_node && token.is_none()).then_some(node),
            token: token.filter(|_| per_node),
            scope,
        }
    }

    fn gate(&self, key: &CounterKey) -> Gate {
        let mut counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(gate) = counters.get(key) {
            return Arc::clone(gate);
        }
        let now = self.clock.now_millis() as i64;
        let swept = self.swept_ms.load(std::sync::atomic::Ordering::Relaxed);
        if now.saturating_sub(swept) >= SWEEP_EVERY_MS {
            self.swept_ms
                .store(now, std::sync::atomic::Ordering::Relaxed);
            sweep(&mut counters, now);
        }
        live_counters(&key.format).increment(1.0);
        Arc::clone(counters.entry(key.clone()).or_default())
    }

    /// Drops the counters no call used for [`EVICT_IDLE_MS`] from memory
    /// (also done when a counter is created, at most once a minute);
    /// returns how many. Their blocks were durable before use, so the next
    /// call reserves above every value they held: an evicted counter never
    /// restarts below its record, it only skips the rest of its block.
    pub fn evict_idle(&self) -> usize {
        let now = self.clock.now_millis() as i64;
        let mut counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        sweep(&mut counters, now)
    }

    /// Refuses a scope value that would add a counter to a format holding
    /// `formatted.max_scope_values` already. A value whose counter is in
    /// memory or in the store (evicted, or another node's) passes.
    async fn check_scope_values(&self, format: &Format, key: &CounterKey) -> Result<(), Error> {
        if key.scope.is_empty() {
            return Ok(());
        }
        let in_memory = self
            .counters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(key);
        if in_memory || self.store.load(key).await?.is_some() {
            return Ok(());
        }
        let limit = self.settings.max_scope_values;
        let now = self.clock.now_millis() as i64;
        let full_lately = self
            .full
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(format.name())
            .is_some_and(|at| now.saturating_sub(*at) < 1_000);
        let full = full_lately || self.store.count_counters(format.name()).await? >= limit;
        if full {
            if !full_lately {
                self.full
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(format.name().to_owned(), now);
            }
            metrics::counter!(m::LIMIT_REFUSALS, "limit" => "formatted.max_scope_values")
                .increment(1);
            return Err(StoreError::Format(FormatError::ScopeValuesFull {
                format: format.name().to_owned(),
                limit,
            })
            .into());
        }
        Ok(())
    }

    /// Issues `count` IDs of format `name` for `params` on node `node`
    /// (this node's number, [`crate::id::Snowflake::node_number`]).
    /// `count` was checked against `server.max_batch` by the Issuer, which
    /// checks every mode's request (a `u32` here, as a checked batch is).
    pub async fn generate(
        &self,
        name: &str,
        params: &[(String, String)],
        count: u32,
        node: u64,
    ) -> Result<Issued, Error> {
        let count = u64::from(count);
        let format = self.format(name)?;
        let bound = format
            .bind(params.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(StoreError::from)?;
        // Refused here, before any value is reserved, when a hidden
        // counter cannot be shown now.
        let output = self.hiders.output(&format);
        let hider = output.as_ref().map(|o| o.ready()).transpose()?;
        let token = self.token_for(&format).await?;
        let key = Self::key(
            &format,
            bound.scope_key(),
            node,
            token.as_ref().map(|t| t.token),
        );
        let lock = token.as_ref().and_then(|t| t.lock.as_ref());
        self.check_scope_values(&format, &key).await?;
        let gate = self.gate(&key);
        // Held over the store write: the per-counter refill gate (see the
        // module doc), never a lock other counters wait on.
        let mut held = gate.lock().await;
        held.used_ms = self.clock.now_millis() as i64;
        // (value, instant to render at) of every value taken.
        let mut ids = Vec::with_capacity(count as usize);
        while (ids.len() as u64) < count {
            let now = self.clock.now_millis() as i64;
            let (block, render_at) = match self.usable(&format, held.block, now)? {
                Some(found) => found,
                None => {
                    let cap = growth_cap(&format, self.settings.block);
                    let want = held.next_want(self.settings.block, cap, now);
                    let want = (count - ids.len() as u64).max(want);
                    let planned = self.reserve(&format, &key, now, want, lock).await?;
                    let b = planned.block;
                    let block = CounterBlock {
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
                held.block = (block.left > 0).then_some(block);
                held.used_up = block.left == 0;
                ids.push((value, render_at));
            }
        }
        // The values are taken: other calls of this counter go on while
        // these render.
        drop(held);
        let ids = self
            .render(&format, ids, node_ids(node, key.token), &bound, hider)
            .await?;
        self.issued.increment(count);
        Ok(Issued {
            ids,
            numeric: format.numeric(),
        })
    }

    /// Renders the values taken: a Lua rule's on the Lua pool (never on
    /// the async runtime), the others here.
    async fn render(
        &self,
        format: &Arc<Format>,
        taken: Vec<(u64, i64)>,
        ids: NodeIds,
        bound: &crate::id::format::Bound,
        hider: Option<Ready<'_, DecimalHider>>,
    ) -> Result<Vec<Rendered>, Error> {
        if format.lua_rule().is_some() {
            let salt = bound.salt().map(str::to_owned);
            let texts = self
                .lua
                .render(Arc::clone(format), taken, salt)
                .await
                .map_err(|e| StoreError::from(FormatError::from(e)))?;
            return Ok(texts
                .into_iter()
                .map(|text| Rendered { text, number: None })
                .collect());
        }
        // Hidden in one batch (rule 25), then rendered value by value.
        let shown = shown_all(hider.as_ref(), taken.iter().map(|&(value, _)| value))?;
        taken
            .iter()
            .zip(shown)
            .map(|(&(_, at), shown)| {
                Ok(format
                    .render(at, shown, ids, bound)
                    .map_err(StoreError::from)?)
            })
            .collect()
    }

    /// The block in memory if it may serve at `now` (same period, or held
    /// within tolerance), with the instant to render at; `None` to reserve
    /// a new one.
    fn usable(
        &self,
        format: &Format,
        held: Option<CounterBlock>,
        now: i64,
    ) -> Result<Option<(CounterBlock, i64)>, Error> {
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

    /// Reserves the next block of `key` durably (see [`FormatCounterStore`]).
    async fn reserve(
        &self,
        format: &Arc<Format>,
        key: &CounterKey,
        now: i64,
        want: u64,
        lock: Option<&TokenLock>,
    ) -> Result<Planned, Error> {
        let space = format.token_space();
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
        let started = std::time::Instant::now();
        let result = self.store.reserve_locked(key, plan, lock).await;
        self.store_op.record(started, result.is_ok());
        match result {
            Ok(planned) => Ok(planned),
            Err(e @ StoreError::LockLost(_)) => {
                // The token is not this node's any more: take one again at
                // the next call (nothing was written).
                if let (Some(space), Some(token), Some(tokens)) = (space, key.token, &self.tokens) {
                    tokens.forget(space, token);
                }
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
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
        self.counter_of(&format, bound.scope_key(), node).await
    }

    /// Every counter of format `name` at a glance, for the console: the one
    /// counter of an unscoped format (read without the caller's
    /// parameters: a template's free `{param}` fields never split its
    /// counter), or how many counters a scoped format stores (one per
    /// scope value, node and token), since no single one is "the" counter.
    pub async fn counter_overview(&self, name: &str, node: u64) -> Result<CounterOverview, Error> {
        let format = self.format(name)?;
        let params = &format.def().scope_params;
        if params.is_empty() {
            let view = self.counter_of(&format, String::new(), node).await?;
            return Ok(CounterOverview::Single(view));
        }
        Ok(CounterOverview::Scoped {
            params: params.clone(),
            counters: self.store.count_counters(format.name()).await?,
        })
    }

    /// The counter of `format` for the scope key `scope` (see
    /// [`FormattedEngine::counter`]).
    async fn counter_of(
        &self,
        format: &Format,
        scope: String,
        node: u64,
    ) -> Result<Option<CounterView>, Error> {
        let token = self.token_for(format).await?.map(|t| t.token);
        let key = Self::key(format, scope, node, token);
        let Some(record) = self.store.load(&key).await? else {
            return Ok(None);
        };
        let next_period_start_ms = format
            .next_period_start(record.period)
            .map_err(StoreError::from)?;
        Ok(Some(CounterView {
            record,
            next_period_start_ms,
            token: format
                .token_space()
                .zip(key.token)
                .map(|(space, t)| space.render(t)),
        }))
    }

    /// The compiled format `name`.
    pub fn get(&self, name: &str) -> Result<Arc<Format>, Error> {
        self.format(name)
    }
}

/// Name of the threads [`off_runtime`] starts.
pub const COMPILE_THREAD: &str = "idgen-compile";

/// Runs `f` (pure work: compiling formats, reading the config file again)
/// on a thread of its own and waits for its result. A Lua rule's
/// load-time checks render up to about a million IDs, seconds of work:
/// on a worker it would stall requests, and on the runtime's blocking pool
/// it would hold the process after `idgen stopped` (dropping the runtime
/// waits for every blocking task to finish). Abandoned by a shutdown,
/// the thread is left to the process exit; nothing it does is durable.
pub async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(COMPILE_THREAD.into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| format!("cannot start a compile thread: {e}"))?;
    rx.await
        .map_err(|_| "the compile thread stopped without an answer (it panicked)".to_owned())
}

/// Compiles every definition at `now` for node `node` under `limits`
/// (counting the Lua checks run in `runs`); the first failure with the
/// name of the format that failed.
fn compile_all(
    defs: &[(FormatDef, LoadChecks)],
    (now, node): (i64, u64),
    limits: LuaLimits,
    runs: &CheckRuns,
) -> Result<CompiledFormats, CompileFailure> {
    let mut formats = HashMap::new();
    for (def, checks) in defs {
        let failed = |e: crate::id::format::FormatError| {
            Box::new((def.name.clone(), StoreError::from(e).into()))
        };
        if def.lua.is_some() && *checks == LoadChecks::Run {
            runs.starting(&def.name);
        }
        let format = Format::compile_with(def.clone(), now, limits, *checks).map_err(failed)?;
        if format.scope() == Scope::Node {
            // The token is leased later; only the node must fit here.
            format.check_node(node_ids(node, Some(0))).map_err(failed)?;
        }
        formats.insert(def.name.clone(), Arc::new(format));
    }
    Ok(formats)
}

/// Removes from `counters` those no call holds or used within
/// [`EVICT_IDLE_MS`] of `now`; returns how many.
fn sweep(counters: &mut HashMap<CounterKey, Gate>, now: i64) -> usize {
    let before = counters.len();
    counters.retain(|key, gate| {
        // A call between `gate` and its lock holds a clone: in use.
        if Arc::strong_count(gate) > 1 {
            return true;
        }
        let idle = gate
            .try_lock()
            .is_ok_and(|state| now.saturating_sub(state.used_ms) >= EVICT_IDLE_MS);
        if idle {
            live_counters(&key.format).decrement(1.0);
        }
        !idle
    });
    before - counters.len()
}

/// `idgen_format_counters_in_memory{format}`.
fn live_counters(format: &str) -> metrics::Gauge {
    metrics::gauge!(m::FORMAT_COUNTERS_IN_MEMORY, "format" => format.to_owned())
}

/// The largest block a counter of `format` grows to
/// ([`Format::largest_block`]).
fn growth_cap(format: &Format, base: u64) -> u64 {
    format.largest_block(base)
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
    Err(StoreError::Format(FormatError::Held {
        format: format.name().to_owned(),
        behind_ms,
    }))
}

/// The node's identity as formats render it: its number as `{node:N}`,
/// and the token leased for the format (`{token:..}`, `uniq64`).
fn node_ids(node: u64, token: Option<u64>) -> NodeIds {
    NodeIds {
        node: Some(node),
        token,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::format::Reset;
    use crate::id::ManualClock;
    use crate::store::EmbeddedStore;
    use std::collections::HashSet;

    /// The embedded store, recording the size of every block reserved.
    struct Counting {
        inner: EmbeddedStore,
        blocks: Mutex<Vec<u64>>,
    }

    #[async_trait::async_trait]
    impl FormatCounterStore for Counting {
        async fn load(&self, key: &CounterKey) -> Result<Option<CounterRecord>, StoreError> {
            self.inner.load(key).await
        }

        async fn reserve(&self, key: &CounterKey, plan: Plan) -> Result<Planned, StoreError> {
            let planned = self.inner.reserve(key, plan).await?;
            self.blocks.lock().unwrap().push(planned.block.len());
            Ok(planned)
        }

        async fn count_counters(&self, format: &str) -> Result<u64, StoreError> {
            self.inner.count_counters(format).await
        }
    }

    fn engine(
        def: FormatDef,
        clock: Arc<ManualClock>,
    ) -> (tempfile::TempDir, Arc<Counting>, FormattedEngine) {
        let dir = tempfile::tempdir().unwrap();
        let inner = EmbeddedStore::create(&dir.path().join("s.redb"), "layout").unwrap();
        let store = Arc::new(Counting {
            inner,
            blocks: Mutex::new(Vec::new()),
        });
        let settings = FormatSettings::for_tests(100, 3);
        let formats = FormattedEngine::new(&[def], store.clone(), clock, settings, 3).unwrap();
        (dir, store, formats)
    }

    async fn take(formats: &FormattedEngine, name: &str, n: u64, seen: &mut HashSet<String>) {
        for _ in 0..n / 10 {
            for id in formats.generate(name, &[], 10, 3).await.unwrap().ids {
                assert!(seen.insert(id.text.clone()), "{} handed out twice", id.text);
            }
        }
    }

    /// A busy counter with one-second periods (idc style): blocks used up
    /// quickly double, so 2,000 IDs a second take a handful of durable
    /// writes instead of one per `formatted.block` (100) IDs, and never a
    /// repeated ID.
    #[tokio::test]
    async fn busy_short_period_counters_grow_their_blocks() {
        let clock = Arc::new(ManualClock::at_millis(1_780_000_000_000));
        let def = FormatDef::template("fast", "{unix_s}{seq:4}{node:2}", "UTC", Reset::Seconds(1));
        let (_dir, store, formats) = engine(def, clock.clone());
        let mut seen = HashSet::new();
        take(&formats, "fast", 2_000, &mut seen).await;
        assert_eq!(*store.blocks.lock().unwrap(), [100, 200, 400, 800, 1_600]);
        clock.advance_millis(1_000);
        take(&formats, "fast", 2_000, &mut seen).await;
        let blocks = store.blocks.lock().unwrap().clone();
        assert_eq!(blocks[5..], [1_600, 3_200], "{blocks:?}");
        // Idle for over a minute: the next block is half as large.
        clock.advance_millis(61_000);
        take(&formats, "fast", 10, &mut seen).await;
        assert_eq!(store.blocks.lock().unwrap().last(), Some(&1_600));
    }

    /// A cluster-wide counter grows to at most a sixteenth of a period's
    /// values, leaving the rest of a short period to the other nodes.
    #[tokio::test]
    async fn cluster_counters_grow_to_a_sixteenth_of_a_period() {
        let clock = Arc::new(ManualClock::at_millis(1_780_000_000_000));
        let def = FormatDef::template("shared", "{unix_s}{seq:4}", "UTC", Reset::Seconds(1));
        let (_dir, store, formats) = engine(def, clock);
        let mut seen = HashSet::new();
        take(&formats, "shared", 3_000, &mut seen).await;
        let blocks = store.blocks.lock().unwrap().clone();
        assert_eq!(blocks[..4], [100, 200, 400, 625], "{blocks:?}");
        assert!(blocks.iter().all(|b| *b <= 625), "{blocks:?}");
    }
}

#[cfg(test)]
mod scope_tests {
    use super::*;
    use crate::id::format::Reset;
    use crate::id::ManualClock;
    use crate::store::EmbeddedStore;

    fn shops(clock: Arc<ManualClock>) -> (tempfile::TempDir, FormattedEngine) {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::create(&dir.path().join("s.redb"), "layout").unwrap();
        let def = FormatDef {
            scope_params: vec!["app".into()],
            ..FormatDef::template("apps", "{param:app:4:digits}{seq:6}", "UTC", Reset::Never)
        };
        let settings = FormatSettings::for_tests(10, 3);
        let formats = FormattedEngine::new(&[def], Arc::new(store), clock, settings, 0).unwrap();
        (dir, formats)
    }

    async fn seq(formats: &FormattedEngine, app: &str, n: u32) -> Result<Vec<u64>, Error> {
        let params = [("app".to_owned(), app.to_owned())];
        let issued = formats.generate("apps", &params, n, 0).await?;
        Ok(issued
            .ids
            .iter()
            .map(|r| r.text[4..].parse().unwrap())
            .collect())
    }

    /// Past `formatted.max_scope_values` a new scope value is refused as
    /// exhausted, naming the setting and the format; values already used
    /// go on, also after their idle counters left memory, and continue
    /// above their durable record (the rest of the evicted block is
    /// skipped, never reissued).
    #[tokio::test]
    async fn scope_values_are_capped_and_evicted_counters_continue_above_their_record() {
        let clock = Arc::new(ManualClock::at_millis(1_780_000_000_000));
        let (_dir, formats) = shops(clock.clone());
        for app in ["0001", "0002", "0003"] {
            assert_eq!(seq(&formats, app, 3).await.unwrap(), [0, 1, 2]);
        }
        let e = seq(&formats, "0004", 1).await.unwrap_err();
        assert_eq!(e.kind(), crate::id::ErrorKind::Exhausted, "{e}");
        let text = e.to_string();
        assert!(
            text.contains("formatted.max_scope_values") && text.contains("\"apps\""),
            "{text}"
        );
        assert_eq!(seq(&formats, "0002", 2).await.unwrap(), [3, 4]);

        // Idle for longer than EVICT_IDLE_MS: every counter leaves memory.
        assert_eq!(formats.evict_idle(), 0, "not idle yet");
        clock.advance_millis(EVICT_IDLE_MS as u64);
        assert_eq!(formats.evict_idle(), 3);
        // Their records (blocks of 10: last 9) are read again: above them.
        assert_eq!(seq(&formats, "0002", 2).await.unwrap(), [10, 11]);
        assert_eq!(seq(&formats, "0001", 1).await.unwrap(), [10]);
        // Still three values in the store: a fourth is still refused.
        assert!(seq(&formats, "0004", 1).await.is_err());
    }
}
