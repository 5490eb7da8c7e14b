//! Formatted mode's pure core: human-readable IDs from a template, a
//! preset or a Lua rule, with a counter that resets every period in a
//! named time zone and never repeats.
//!
//! - [`FormatDef`]: a format as data (config file, admin API, store).
//! - [`Format`]: a compiled, validated definition; it renders and parses
//!   IDs. [`Format::compile`] refuses anything that could repeat an ID.
//! - [`period`]: reset periods on the zone's wall clock and the rule that
//!   the period never goes back ([`period::decide`]).
//! - [`template`]: the template language; [`preset`]: seed 000's `uniq64`
//!   and seed 001's `idc`; [`lua`]: sandboxed Lua rules (seed 003);
//!   [`token`]: the spaces leased tokens come from.
//! - [`CounterRecord`]: a counter's durable record (period + last reserved
//!   value) and the rule that turns it into the next block, as segment mode
//!   does for tags.
//!
//! Uniqueness contract: IDs are unique per format and, for counters kept
//! per value of scope parameters, per those values (a template renders its
//! scope parameters, so its IDs are unique across them too; a Lua rule's
//! scope parameters are namespaces, as seed 003's `app_name`). IDs of
//! different formats, or of other modes, may coincide.
//!
//! No I/O and no clock: time comes in as Unix milliseconds.

pub mod lua;
pub mod lua_sandbox;
pub mod period;
pub mod preset;
pub mod template;
pub mod token;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use lua::{Deadline, LuaError, LuaLimits, LuaRule};
pub use period::{
    decide, next_period_start, period_key, PeriodDecision, PeriodError, PeriodKey, PeriodStep,
    Reset, Zone,
};
pub use preset::{Idc, PresetError, PresetName, Uniq64, IDC_TEMPLATE};
pub use template::{
    BoundParams, CivilFields, ParseError, ParsedId, RenderError, Template, TemplateError,
};
pub use token::TokenSpace;

/// The definition schema this build writes and reads.
pub const FORMAT_DEF_VERSION: u32 = 1;
/// Longest format name.
pub const MAX_FORMAT_NAME_LEN: usize = 64;
/// The `idc` preset's counter maximum when `max` is not given.
const IDC_DEFAULT_MAX: u64 = 9999;
/// Longest scope-parameter value or Lua salt.
pub const MAX_FREE_PARAM_LEN: usize = 64;
/// How far a busy counter's blocks grow, as a multiple of
/// `formatted.block` ([`Format::largest_block`]).
pub const MAX_BLOCK_GROWTH: u64 = 64;

fn default_version() -> u32 {
    FORMAT_DEF_VERSION
}

fn default_zone() -> String {
    "UTC".to_owned()
}

fn default_step() -> u64 {
    1
}

/// A format as data: stored durably, given in the config file and the
/// admin API. Exactly one of `template`, `lua` and `preset` is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormatDef {
    /// Schema version ([`FORMAT_DEF_VERSION`]); a later one is refused.
    #[serde(default = "default_version")]
    pub version: u32,
    /// The format's name (`[a-z0-9_-]{1,64}`).
    pub name: String,
    /// A template, e.g. `{yyyy}{MM}{dd}{node:2}{seq:6}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// A Lua rule's source (seed 003's four functions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lua: Option<String>,
    /// A preset: `uniq64` or `idc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<PresetName>,
    /// IANA time zone the time fields and periods are in.
    #[serde(default = "default_zone")]
    pub zone: String,
    /// When the counter restarts. Templates: default `never`. Lua rules
    /// set it with `reset_seconds()`; presets have their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset: Option<Reset>,
    /// The counter's first value in a period (default 0; Lua:
    /// `min_counter()`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u64>,
    /// The counter's last value in a period (default: the largest
    /// `{seq:N}` holds; Lua: `max_counter()`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    /// How much the counter grows per ID (default 1).
    #[serde(default = "default_step")]
    pub step: u64,
    /// Parameters whose values each get a counter of their own (e.g.
    /// `app_name`). A template must render them (`{param:NAME:..}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scope_params: Vec<String>,
    /// Lua rules: the exact length of every ID, checked on each call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<usize>,
    /// The local year the format was created in: starts the window of a
    /// template whose year is only `{yy}` or `{y}`. Set by [`FormatDef::stamped`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_year: Option<i32>,
    /// Free text for operators.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

impl FormatDef {
    /// A template definition with defaults.
    pub fn template(name: &str, template: &str, zone: &str, reset: Reset) -> FormatDef {
        FormatDef {
            version: FORMAT_DEF_VERSION,
            name: name.to_owned(),
            template: Some(template.to_owned()),
            lua: None,
            preset: None,
            zone: zone.to_owned(),
            reset: Some(reset),
            min: None,
            max: None,
            step: 1,
            scope_params: Vec::new(),
            length: None,
            origin_year: None,
            description: String::new(),
        }
    }

    /// The definition as first stored: `origin_year` set to the local year
    /// at `now_ms` when not given. Call once, when the format is created.
    pub fn stamped(mut self, now_ms: i64) -> Result<FormatDef, FormatError> {
        if self.origin_year.is_none() {
            let zone = Zone::get(&self.zone)?;
            self.origin_year = Some(i32::from(zone.civil(now_ms)?.year()));
        }
        Ok(self)
    }

    /// The one rule for changing a stored format (admin `UpdateFormat`, a
    /// config file entry at start or SIGHUP, a reload that finds another
    /// definition than the one served): a format's rendering is frozen.
    /// Only the description may change, and `max` may grow (the new
    /// definition must still compile, so a template's max stays inside its
    /// `{seq:N}`, uniq64's inside 31 bits). Everything else decides which
    /// ID a counter value becomes, or which period it belongs to, so a
    /// change could render an ID already handed out: the Lua code (the
    /// rule's bounds and period come from it), template, preset, kind,
    /// zone, reset, min, a smaller max, step, scope parameters, length,
    /// origin year and name. Effective values are compared (a template's
    /// `max` left out is its field's widest), so restating a default is
    /// not a change.
    pub fn check_update(&self, new: &FormatDef) -> Result<(), FormatError> {
        // Destructured so a new field cannot be added without deciding here
        // whether it may change.
        let FormatDef {
            version: _,
            name,
            template,
            lua,
            preset,
            zone,
            reset,
            min,
            max: _,
            step,
            scope_params,
            length,
            origin_year,
            description: _,
        } = new;
        let frozen = |field: &'static str, differs: bool, why: String| match differs {
            true => Err(self.frozen_field(field, why)),
            false => Ok(()),
        };
        let both = |a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| format!("{a:?} -> {b:?}");
        frozen("name", &self.name != name, both(&self.name, name))?;
        frozen(
            "kind (template, lua or preset)",
            self.lua.is_some() != lua.is_some()
                || self.template.is_some() != template.is_some()
                || self.preset.is_some() != preset.is_some(),
            "a format never becomes another kind".into(),
        )?;
        frozen(
            "lua",
            &self.lua != lua,
            "the rule's code decides every ID and its bounds and period; new code can render an ID the old code already gave".into(),
        )?;
        frozen(
            "template",
            &self.template != template,
            both(&self.template, template),
        )?;
        frozen("preset", &self.preset != preset, both(&self.preset, preset))?;
        frozen("zone", &self.zone != zone, both(&self.zone, zone))?;
        let reset_of = |r: &Option<Reset>| r.unwrap_or(Reset::Never);
        frozen(
            "reset",
            reset_of(&self.reset) != reset_of(reset),
            both(&reset_of(&self.reset), &reset_of(reset)),
        )?;
        let min_of = |m: &Option<u64>| m.unwrap_or(0);
        frozen(
            "min",
            min_of(&self.min) != min_of(min),
            both(&min_of(&self.min), &min_of(min)),
        )?;
        let (old_max, new_max) = (self.effective_max(), new.effective_max());
        let grows = format!(
            "{} -> {}; max may only grow",
            shown(old_max),
            shown(new_max)
        );
        frozen("max", new_max < old_max, grows)?;
        frozen("step", self.step != *step, both(&self.step, step))?;
        frozen(
            "scope_params",
            &self.scope_params != scope_params,
            both(&self.scope_params, scope_params),
        )?;
        frozen("length", &self.length != length, both(&self.length, length))?;
        frozen(
            "origin_year",
            &self.origin_year != origin_year,
            both(&self.origin_year, origin_year),
        )
    }

    /// The refusal of a change to `field`.
    fn frozen_field(&self, field: &'static str, why: String) -> FormatError {
        FormatError::Immutable {
            format: self.name.clone(),
            field,
            why,
        }
    }

    /// The counter's last value as compiled: `max`, or the default of the
    /// kind (a template's widest `{seq:N}`, `idc`'s 9999, `uniq64`'s 31
    /// bits). `None` for Lua rules, whose `max_counter()` is part of the
    /// frozen code, and for a template that does not parse.
    fn effective_max(&self) -> Option<u64> {
        if let Some(max) = self.max {
            return Some(max);
        }
        match (&self.template, self.preset) {
            (Some(src), _) => {
                let reset = self.reset.unwrap_or(Reset::Never);
                let t = template_of(self, src, reset, 0).ok()?;
                Some(10u64.pow(u32::from(t.seq_width())) - 1)
            }
            (None, Some(PresetName::Idc)) => Some(IDC_DEFAULT_MAX),
            (None, Some(PresetName::Uniq64)) => Some(preset::UNIQ64_MAX_SERIAL),
            (None, None) => None,
        }
    }
}

/// A counter bound for a message: the number, or `unset`.
fn shown(max: Option<u64>) -> String {
    max.map_or_else(|| "unset".to_owned(), |m| m.to_string())
}

/// Whose counter an ID uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Each node its own counter; IDs carry the node or token.
    Node,
    /// One counter for the cluster (ranges reserved by the nodes).
    Cluster,
}

/// A counter's bounds and step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterRange {
    /// First value of a period.
    pub min: u64,
    /// Last value of a period.
    pub max: u64,
    /// Growth per ID.
    pub step: u64,
}

impl CounterRange {
    /// How many values a period holds.
    pub fn capacity(&self) -> u64 {
        (self.max - self.min) / self.step + 1
    }
}

/// A block of counter values `first, first + step, ..., last`, reserved
/// durably in `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterBlock {
    /// The period the values belong to.
    pub period: PeriodKey,
    /// First value.
    pub first: u64,
    /// Last value (inclusive).
    pub last: u64,
    /// Step between values.
    pub step: u64,
}

impl CounterBlock {
    /// How many values.
    pub fn len(&self) -> u64 {
        (self.last - self.first) / self.step + 1
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A counter's durable record: the period it is in and the last value
/// reserved in it. Written (compare-and-set) before any value of a block
/// is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterRecord {
    /// The period.
    pub period: PeriodKey,
    /// The last value any node may have used in it.
    pub last: u64,
}

impl CounterRecord {
    /// The next block of at most `want` values for a decision made by
    /// [`period::decide`] on this record (`None`: nothing stored yet), and
    /// the record to write for it. A new period starts at `min`; the same
    /// (or held) period continues above `last`. Exhausted: the error names
    /// the format and when the next period starts.
    pub fn next_block(
        stored: Option<&CounterRecord>,
        decision: &PeriodDecision,
        counter: &CounterRange,
        want: u64,
        format: &str,
        next_start_ms: Option<i64>,
    ) -> Result<(CounterBlock, CounterRecord), FormatError> {
        let want = want.max(1);
        let mismatch = || FormatError::PeriodMismatch {
            format: format.to_owned(),
        };
        // The decision must have been made on this very record.
        let first = match (stored, decision.step) {
            (None, PeriodStep::First) => Some(counter.min),
            (Some(r), PeriodStep::Later) if decision.key > r.period => Some(counter.min),
            (Some(r), PeriodStep::Same | PeriodStep::Held { .. }) if r.period == decision.key => r
                .last
                .checked_add(counter.step)
                .filter(|v| *v <= counter.max),
            _ => return Err(mismatch()),
        };
        let first = first.ok_or_else(|| FormatError::Exhausted {
            format: format.to_owned(),
            period: decision.key,
            next_start_ms,
        })?;
        let room = (counter.max - first) / counter.step;
        let last = first + room.min(want - 1) * counter.step;
        Ok((
            CounterBlock {
                period: decision.key,
                first,
                last,
                step: counter.step,
            },
            CounterRecord {
                period: decision.key,
                last,
            },
        ))
    }
}

/// Everything that can go wrong with a format.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormatError {
    /// A malformed name.
    #[error("format name {0:?} is malformed; use 1 to 64 characters of a-z 0-9 _ -")]
    BadName(String),
    /// A definition from a later schema.
    #[error("format {format:?} has definition version {version}; this build reads up to {FORMAT_DEF_VERSION}: upgrade idgen")]
    FutureVersion {
        /// The format.
        format: String,
        /// Its version.
        version: u32,
    },
    /// Not exactly one of template, lua, preset.
    #[error("format {0:?} needs exactly one of template, lua or preset")]
    NoSource(String),
    /// A field that does not apply to this kind of format.
    #[error("format {format:?}: {field} does not apply to {kind} formats ({why})")]
    NotApplicable {
        /// The format.
        format: String,
        /// The field.
        field: &'static str,
        /// Template, Lua or preset.
        kind: &'static str,
        /// Why.
        why: &'static str,
    },
    /// Bad counter bounds.
    #[error("format {format:?}: counter {why}")]
    BadCounter {
        /// The format.
        format: String,
        /// What is wrong.
        why: String,
    },
    /// A scope parameter the template does not render, or malformed.
    #[error("format {format:?}: scope parameter {param:?} {why}")]
    BadScopeParam {
        /// The format.
        format: String,
        /// The parameter.
        param: String,
        /// What is wrong.
        why: &'static str,
    },
    /// A template without `{yyyy}` whose origin year was never stamped.
    #[error("format {0:?} has {{yy}} or {{y}} as its year but no origin_year; stamp the definition when creating it")]
    NoOriginYear(String),
    /// An origin year outside [`ORIGIN_YEARS`].
    #[error("format {format:?}: origin_year = {year} is out of range: give a year from 1970 to 9999 (the first year a {{yy}} or {{y}} field counts from; left out, it is the year the format is created)")]
    BadOriginYear {
        /// The format.
        format: String,
        /// The year given.
        year: i32,
    },
    /// An update that would change how IDs render (see
    /// [`FormatDef::check_update`]).
    #[error("format {format:?}: {field} cannot change ({why}): a format's rendering is frozen once created, and a changed one could hand out an ID already issued; create a new format (e.g. {format}-v2) instead")]
    Immutable {
        /// The format.
        format: String,
        /// The field the update changes.
        field: &'static str,
        /// Old and new value, or why the field is frozen.
        why: String,
    },
    /// The counter of a period is used up.
    #[error("format {format:?}: counter exhausted in {period}; {}", next_hint(*.next_start_ms))]
    Exhausted {
        /// The format.
        format: String,
        /// The period.
        period: PeriodKey,
        /// When the next period starts, Unix ms (`None`: never resets).
        next_start_ms: Option<i64>,
    },
    /// A decision not made on the record given (a caller bug).
    #[error("format {format:?}: the stored period and the decision disagree; decide on the stored record")]
    PeriodMismatch {
        /// The format.
        format: String,
    },
    /// No token of the format's space is free for this node (Consul: every
    /// token is held; embedded: the node's worker id has no token in it).
    #[error("format {format:?}: no token of space {space} ({size} tokens) for this node: {why}")]
    NoToken {
        /// The format.
        format: String,
        /// The token space's name.
        space: String,
        /// How many tokens it holds.
        size: u64,
        /// Why, and what to do.
        why: String,
    },
    /// A node id or token outside what the format renders.
    #[error("format {format:?}: {why}")]
    BadNode {
        /// The format.
        format: String,
        /// What is wrong.
        why: String,
    },
    /// The template was refused.
    #[error("format {format:?}: template: {source}")]
    Template {
        /// The format.
        format: String,
        /// Why.
        source: TemplateError,
    },
    /// The zone's wall clock goes back across a period boundary (a DST
    /// fall-back under periods shorter than the shift).
    #[error("format {format:?}: zone {zone} turns its wall clock back {back_s} s at {at} (a DST or offset change), across a boundary of its {reset} periods; periods are cut on the zone's wall clock, so its counter would be held in one period for that long. Use zone \"UTC\" (Unix-second fields such as {{unix_s}} render the same in any zone), or a reset the change stays inside (hour or longer for a one-hour DST shift)")]
    ClockGoesBack {
        /// The format.
        format: String,
        /// The zone.
        zone: String,
        /// The reset period.
        reset: Reset,
        /// When, RFC 3339.
        at: String,
        /// How far back, seconds.
        back_s: i64,
    },
    /// A zone or period problem.
    #[error(transparent)]
    Period(#[from] PeriodError),
    /// An ID could not be rendered (bad parameters...).
    #[error(transparent)]
    Render(#[from] RenderError),
    /// An ID does not parse.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// A preset value does not encode or decode.
    #[error(transparent)]
    Preset(#[from] PresetError),
    /// A Lua rule was refused or failed.
    #[error(transparent)]
    Lua(#[from] LuaError),
}

impl FormatError {
    /// What kind of failure this is: a caller's bad parameters or ID are
    /// BadRequest; a counter used up in its period is Exhausted; a Lua rule
    /// failing while serving, or a zone/time out of range, is a
    /// Precondition (an operator must fix the rule or definition).
    pub fn kind(&self) -> crate::id::ErrorKind {
        use crate::id::ErrorKind;
        match self {
            Self::Exhausted { .. } | Self::NoToken { .. } => ErrorKind::Exhausted,
            Self::Render(_) | Self::Parse(_) | Self::Preset(_) | Self::BadName(_) => {
                ErrorKind::BadRequest
            }
            Self::PeriodMismatch { .. } => ErrorKind::Internal,
            Self::Lua(e) => e.kind(),
            Self::Period(_) | Self::BadNode { .. } => ErrorKind::Precondition,
            Self::FutureVersion { .. }
            | Self::NoSource(_)
            | Self::NotApplicable { .. }
            | Self::ClockGoesBack { .. }
            | Self::BadCounter { .. }
            | Self::BadScopeParam { .. }
            | Self::NoOriginYear(_)
            | Self::BadOriginYear { .. }
            | Self::Immutable { .. }
            | Self::Template { .. } => ErrorKind::BadRequest,
        }
    }
}

fn next_hint(next: Option<i64>) -> String {
    match next.and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok()) {
        Some(ts) => format!("the next period starts at {ts}; widen the counter (max, {{seq:N}}) or reset more often"),
        None => "it never resets: create a new format with a wider counter".to_owned(),
    }
}

/// Checks a format name.
pub fn check_name(name: &str) -> Result<(), FormatError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_FORMAT_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(FormatError::BadName(name.chars().take(80).collect()))
    }
}

/// What compiling a format's source gives: the rule, its reset, and its
/// counter's min and max.
type Compiled = (Kind, Reset, u64, u64);

/// The error for a definition field that does not apply to its kind.
fn not_applicable(
    def: &FormatDef,
    field: &'static str,
    kind: &'static str,
    why: &'static str,
) -> FormatError {
    FormatError::NotApplicable {
        format: def.name.clone(),
        field,
        kind,
        why,
    }
}

/// The error for a counter the definition cannot have.
fn bad_counter(def: &FormatDef, why: String) -> FormatError {
    FormatError::BadCounter {
        format: def.name.clone(),
        why,
    }
}

/// Checks what every kind of format shares: the step, the scope
/// parameters' names, exactly one source, and `length` only for Lua.
fn check_common_fields(def: &FormatDef) -> Result<(), FormatError> {
    if def.step == 0 {
        return Err(bad_counter(def, "step must be at least 1".into()));
    }
    if let Some(year) = def.origin_year.filter(|y| !ORIGIN_YEARS.contains(y)) {
        return Err(FormatError::BadOriginYear {
            format: def.name.clone(),
            year,
        });
    }
    for p in &def.scope_params {
        let ok = !p.is_empty()
            && p.len() <= 32
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && p != "salt";
        if !ok {
            return Err(FormatError::BadScopeParam {
                format: def.name.clone(),
                param: p.chars().take(40).collect(),
                why: "is malformed; use 1 to 32 characters of a-z 0-9 _ (not salt)",
            });
        }
    }
    let sources = [
        def.template.is_some(),
        def.lua.is_some(),
        def.preset.is_some(),
    ];
    if sources.iter().filter(|s| **s).count() != 1 {
        return Err(FormatError::NoSource(def.name.clone()));
    }
    if def.length.is_some() && def.lua.is_none() {
        return Err(not_applicable(
            def,
            "length",
            "template and preset",
            "their length follows from the layout",
        ));
    }
    Ok(())
}

/// The origin years a definition may give: IDs are issued after 1970, and
/// a `{yy}` window past 9999 could not be rendered (nor computed near
/// `i32::MAX`).
pub const ORIGIN_YEARS: std::ops::RangeInclusive<i32> = 1970..=9999;

/// Parses template `src` for `def` (years from `origin_year`, 2000 if
/// unset), naming the format in the error.
fn template_of(
    def: &FormatDef,
    src: &str,
    reset: Reset,
    max: u64,
) -> Result<Template, FormatError> {
    let origin = def.origin_year.unwrap_or(2000);
    Template::parse(src, reset, max, origin).map_err(|source| FormatError::Template {
        format: def.name.clone(),
        source,
    })
}

/// Compiles a template format; `max` defaults to the widest counter the
/// `{seq:N}` field holds.
fn compile_template(def: &FormatDef, src: &str) -> Result<Compiled, FormatError> {
    let reset = def.reset.unwrap_or(Reset::Never);
    let min = def.min.unwrap_or(0);
    // The widest counter the field holds, when max is not given.
    let probe = template_of(def, src, reset, 0)?;
    let max = def
        .max
        .unwrap_or(10u64.pow(u32::from(probe.seq_width())) - 1);
    let t = template_of(def, src, reset, max)?;
    if t.year_window().is_some() && def.origin_year.is_none() {
        return Err(FormatError::NoOriginYear(def.name.clone()));
    }
    Ok((Kind::Template(t), reset, min, max))
}

/// Compiles a Lua format: the rule sets reset, min and max, so the
/// definition may not; the rule is test-run at `now_ms`.
fn compile_lua(
    def: &FormatDef,
    code: &str,
    zone: &Zone,
    limits: LuaLimits,
    now_ms: i64,
) -> Result<Compiled, FormatError> {
    if def.reset.is_some() {
        return Err(not_applicable(
            def,
            "reset",
            "Lua",
            "the rule's reset_seconds() sets it",
        ));
    }
    if def.min.is_some() || def.max.is_some() {
        return Err(not_applicable(
            def,
            "min and max",
            "Lua",
            "the rule's min_counter() and max_counter() set them",
        ));
    }
    let rule = LuaRule::load(
        &def.name,
        code,
        zone.clone(),
        def.length,
        def.step,
        limits,
        now_ms,
    )?;
    let (reset, min, max) = (rule.reset(), rule.min_counter(), rule.max_counter());
    Ok((Kind::Lua(Box::new(rule)), reset, min, max))
}

/// Compiles the `idc` preset: its counter resets every Unix second, in UTC.
fn compile_idc(def: &FormatDef) -> Result<Compiled, FormatError> {
    if def.reset.is_some() {
        return Err(not_applicable(
            def,
            "reset",
            "idc",
            "its counter resets every second",
        ));
    }
    // Its one-second periods in a DST zone are refused by the rule every
    // format follows (`check_wall_clock`).
    let max = def.max.unwrap_or(IDC_DEFAULT_MAX);
    let t = template_of(def, IDC_TEMPLATE, Reset::Seconds(1), max)?;
    Ok((
        Kind::Template(t),
        Reset::Seconds(1),
        def.min.unwrap_or(0),
        max,
    ))
}

/// Compiles the `uniq64` preset: a daily serial of at most 31 bits, no
/// scope parameters.
fn compile_uniq64(def: &FormatDef) -> Result<Compiled, FormatError> {
    if def.reset.is_some() {
        return Err(not_applicable(
            def,
            "reset",
            "uniq64",
            "its serial resets every local day",
        ));
    }
    if !def.scope_params.is_empty() {
        return Err(not_applicable(
            def,
            "scope_params",
            "uniq64",
            "its IDs have no room for them",
        ));
    }
    let max = def.max.unwrap_or(preset::UNIQ64_MAX_SERIAL);
    if max > preset::UNIQ64_MAX_SERIAL {
        return Err(bad_counter(
            def,
            format!(
                "max {max} does not fit uniq64's 31-bit serial (at most {})",
                preset::UNIQ64_MAX_SERIAL
            ),
        ));
    }
    Ok((Kind::Uniq64, Reset::Day, def.min.unwrap_or(0), max))
}

/// Refuses a format whose zone turns its wall clock back across a period
/// boundary from `now_ms` on ([`period::wall_clock_goes_back`]): one rule
/// for templates, presets (`idc` in a DST zone) and Lua rules.
fn check_wall_clock(
    def: &FormatDef,
    zone: &Zone,
    reset: Reset,
    now_ms: i64,
) -> Result<(), FormatError> {
    let Some(back) = period::wall_clock_goes_back(zone, reset, now_ms)? else {
        return Ok(());
    };
    let at = jiff::Timestamp::from_millisecond(back.at_ms)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| back.at_ms.to_string());
    Err(FormatError::ClockGoesBack {
        format: def.name.clone(),
        zone: zone.name().to_owned(),
        reset,
        at,
        back_s: back.back_s,
    })
}

/// Checks that `min` is not above `max` and `max` fits an i64.
fn check_counter_range(def: &FormatDef, min: u64, max: u64) -> Result<(), FormatError> {
    if min > max {
        return Err(bad_counter(def, format!("min {min} is above max {max}")));
    }
    if max > i64::MAX as u64 {
        return Err(bad_counter(def, format!("max {max} is above 2^63 - 1")));
    }
    Ok(())
}

/// Checks that a template names every scope parameter, so counters per
/// value cannot repeat each other's IDs.
fn check_scope_in_template(def: &FormatDef, kind: &Kind) -> Result<(), FormatError> {
    if let Kind::Template(t) = kind {
        for p in &def.scope_params {
            if !t.params().any(|(n, ..)| n == p) {
                return Err(FormatError::BadScopeParam {
                    format: def.name.clone(),
                    param: p.clone(),
                    why: "is not in the template; add {param:NAME:N:digits|alnum}, or counters per value would repeat each other's IDs",
                });
            }
        }
    }
    Ok(())
}

#[derive(Debug)]
enum Kind {
    Template(Template),
    Uniq64,
    Lua(Box<LuaRule>),
}

/// One rendered ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The ID.
    pub text: String,
    /// The ID as a number, when the format allows (all digits, below 2^63;
    /// `uniq64` always).
    pub number: Option<u64>,
}

/// A caller's parameters, checked against a format.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bound {
    params: BoundParams,
    salt: Option<String>,
    scope: Vec<(String, String)>,
}

impl Bound {
    /// The scope parameters' values, in the definition's order: the
    /// counter's key (empty: the format's single counter).
    pub fn scope(&self) -> &[(String, String)] {
        &self.scope
    }

    /// The caller's `salt` for a Lua rule.
    pub fn salt(&self) -> Option<&str> {
        self.salt.as_deref()
    }

    /// A printable key for the counter (`""`, or `name=value/name=value`);
    /// values are checked printable ASCII without `/` or `=`.
    pub fn scope_key(&self) -> String {
        self.scope
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("/")
    }
}

/// The node identity an ID may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeIds {
    /// The node id (`{node:N}`).
    pub node: Option<u64>,
    /// The leased token (`{token:..}`, `uniq64`).
    pub token: Option<u64>,
}

/// A compiled format.
#[derive(Debug)]
pub struct Format {
    def: FormatDef,
    zone: Zone,
    reset: Reset,
    counter: CounterRange,
    scope: Scope,
    kind: Kind,
}

impl Format {
    /// Validates `def` and compiles it. `now_ms` is when (Unix ms): a Lua
    /// rule is test-run at that time and in the next period.
    pub fn compile(def: FormatDef, now_ms: i64, limits: LuaLimits) -> Result<Format, FormatError> {
        check_name(&def.name)?;
        if def.version > FORMAT_DEF_VERSION {
            return Err(FormatError::FutureVersion {
                format: def.name.clone(),
                version: def.version,
            });
        }
        let zone = Zone::get(&def.zone)?;
        check_common_fields(&def)?;
        let (kind, reset, min, max) = match (&def.template, &def.lua, def.preset) {
            (Some(src), _, _) => compile_template(&def, src)?,
            (None, Some(code), _) => compile_lua(&def, code, &zone, limits, now_ms)?,
            (None, None, Some(PresetName::Idc)) => compile_idc(&def)?,
            (None, None, Some(PresetName::Uniq64)) => compile_uniq64(&def)?,
            (None, None, None) => return Err(FormatError::NoSource(def.name.clone())),
        };
        check_counter_range(&def, min, max)?;
        check_scope_in_template(&def, &kind)?;
        check_wall_clock(&def, &zone, reset, now_ms)?;
        let scope = match &kind {
            Kind::Template(t) if t.per_node() => Scope::Node,
            Kind::Uniq64 => Scope::Node,
            _ => Scope::Cluster,
        };
        Ok(Format {
            counter: CounterRange {
                min,
                max,
                step: def.step,
            },
            def,
            zone,
            reset,
            scope,
            kind,
        })
    }

    /// The largest block one counter of this format reserves at once when
    /// `formatted.block` is `base`: [`MAX_BLOCK_GROWTH`] times `base`
    /// (`base` itself when it is 1: gap-free counters never grow), and for
    /// a cluster-wide counter at most a sixteenth of a period's values, so
    /// one busy node cannot take a short period's values away from the
    /// others. Restores size their margins by it too.
    pub fn largest_block(&self, base: u64) -> u64 {
        if base == 1 {
            return 1;
        }
        let cap = base.saturating_mul(MAX_BLOCK_GROWTH);
        match self.scope {
            Scope::Node => cap,
            Scope::Cluster => cap.min(self.counter.capacity() / 16),
        }
    }

    /// The definition it was compiled from.
    pub fn def(&self) -> &FormatDef {
        &self.def
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The zone.
    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    /// The reset period.
    pub fn reset(&self) -> Reset {
        self.reset
    }

    /// Counter bounds and step.
    pub fn counter(&self) -> CounterRange {
        self.counter
    }

    /// Per node or cluster-wide.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// Where the format's token comes from, when its IDs carry one
    /// (`{token:N:..}`, `uniq64`): its counters are then kept per token.
    pub fn token_space(&self) -> Option<TokenSpace> {
        match &self.kind {
            Kind::Template(t) => t
                .token()
                .map(|(width, charset)| TokenSpace::Chars { width, charset }),
            Kind::Uniq64 => Some(TokenSpace::Uniq64),
            Kind::Lua(_) => None,
        }
    }

    /// The template, for template and `idc` formats.
    pub fn template(&self) -> Option<&Template> {
        match &self.kind {
            Kind::Template(t) => Some(t),
            _ => None,
        }
    }

    /// Whether IDs come back as numbers too (some or all of them).
    pub fn numeric(&self) -> bool {
        match &self.kind {
            Kind::Template(t) => t.numeric(),
            Kind::Uniq64 => true,
            Kind::Lua(_) => false,
        }
    }

    /// Checks the node's identity once, at startup: a per-node format
    /// needs the node id or token its template renders, and it must fit.
    pub fn check_node(&self, ids: NodeIds) -> Result<(), FormatError> {
        let probe = self.counter.min;
        let fields = CivilFields {
            year: 2026,
            month: 1,
            day: 1,
            day_of_year: 1,
            hour: 0,
            minute: 0,
            second: 0,
            unix_s: 1_767_225_600,
        };
        let bad = |why: String| FormatError::BadNode {
            format: self.def.name.clone(),
            why,
        };
        match &self.kind {
            Kind::Template(t) => {
                let mut out = String::new();
                let params = t.placeholder_params();
                // Render with placeholder params: only node errors matter.
                match t.render_into(&mut out, &fields, probe, ids.node, ids.token, &params) {
                    Err(e @ (RenderError::NoNode { .. } | RenderError::NodeTooWide { .. })) => {
                        Err(bad(e.to_string()))
                    }
                    _ => Ok(()),
                }
            }
            Kind::Uniq64 => match ids.token {
                Some(t) if t <= preset::UNIQ64_MAX_TOKEN => Ok(()),
                Some(t) => Err(bad(format!(
                    "token {t} does not fit uniq64's 12 bits (0-4095)"
                ))),
                None => Err(bad("uniq64 needs a leased token".into())),
            },
            Kind::Lua(_) => Ok(()),
        }
    }

    /// The Lua rule of a Lua format (`None` for the others).
    pub fn lua_rule(&self) -> Option<&LuaRule> {
        match &self.kind {
            Kind::Lua(rule) => Some(rule),
            _ => None,
        }
    }

    /// Checks a caller's parameters: a template's `{param}` fields (length
    /// and charset), a Lua rule's `salt`, and the scope parameters. Errors
    /// name the parameter.
    pub fn bind<'a>(
        &self,
        params: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
    ) -> Result<Bound, FormatError> {
        let mut bound = Bound::default();
        match &self.kind {
            Kind::Template(t) => bound.params = t.bind(params.clone())?,
            Kind::Uniq64 | Kind::Lua(_) => {
                let takes_salt = matches!(self.kind, Kind::Lua(_));
                for (name, value) in params.clone() {
                    if takes_salt && name == "salt" {
                        check_free_param(name, value)?;
                        bound.salt = Some(value.to_owned());
                    } else if !self.def.scope_params.iter().any(|p| p == name) {
                        let mut takes: Vec<&str> =
                            self.def.scope_params.iter().map(String::as_str).collect();
                        if takes_salt {
                            takes.push("salt");
                        }
                        return Err(RenderError::UnknownParam {
                            name: name.chars().take(40).collect(),
                            expected: if takes.is_empty() {
                                "no parameters".into()
                            } else {
                                takes.join(", ")
                            },
                        }
                        .into());
                    }
                }
            }
        }
        for p in &self.def.scope_params {
            let value = params
                .clone()
                .into_iter()
                .find(|(n, _)| n == p)
                .map(|(_, v)| v)
                .ok_or_else(|| RenderError::MissingParam {
                    name: p.clone(),
                    expected: format!("scope parameters {}", self.def.scope_params.join(", ")),
                })?;
            check_free_param(p, value)?;
            bound.scope.push((p.clone(), value.to_owned()));
        }
        Ok(bound)
    }

    /// Where the counter stands at `now_ms` against the stored period
    /// ([`period::decide`]).
    pub fn decide(
        &self,
        stored: Option<PeriodKey>,
        now_ms: i64,
    ) -> Result<PeriodDecision, FormatError> {
        Ok(decide(stored, now_ms, &self.zone, self.reset)?)
    }

    /// When the period after `key` starts (Unix ms); `None`: never resets.
    pub fn next_period_start(&self, key: PeriodKey) -> Result<Option<i64>, FormatError> {
        Ok(next_period_start(key, &self.zone, self.reset)?)
    }

    /// The next block of counter values (see [`CounterRecord::next_block`]),
    /// with the exhaustion error filled in for this format.
    pub fn next_block(
        &self,
        stored: Option<&CounterRecord>,
        decision: &PeriodDecision,
        want: u64,
    ) -> Result<(CounterBlock, CounterRecord), FormatError> {
        let next = self.next_period_start(decision.key)?;
        CounterRecord::next_block(stored, decision, &self.counter, want, self.name(), next)
    }

    /// Renders one ID for `counter` at `render_at_ms` (the decision's
    /// instant, not the raw wall clock).
    pub fn render(
        &self,
        render_at_ms: i64,
        counter: u64,
        ids: NodeIds,
        bound: &Bound,
    ) -> Result<Rendered, FormatError> {
        match &self.kind {
            Kind::Template(t) => {
                let fields = CivilFields::at(render_at_ms, &self.zone)?;
                self.render_fields(t, &fields, counter, ids, bound)
            }
            Kind::Uniq64 => {
                let dt = self.zone.civil(render_at_ms)?;
                let year = i32::from(dt.year()) - 2000;
                let u = Uniq64 {
                    year: u8::try_from(year).map_err(|_| {
                        RenderError::TimeOutOfRange(format!(
                            "year {} (uniq64 holds 2000-2127)",
                            dt.year()
                        ))
                    })?,
                    month: dt.month() as u8,
                    day: dt.day() as u8,
                    hour: dt.hour() as u8,
                    token: u16::try_from(ids.token.ok_or(RenderError::NoNode { field: "token" })?)
                        .unwrap_or(u16::MAX),
                    serial: u32::try_from(counter).unwrap_or(u32::MAX),
                };
                let v = u.encode()?;
                Ok(Rendered {
                    text: v.to_string(),
                    number: Some(v),
                })
            }
            Kind::Lua(rule) => Ok(Rendered {
                text: rule.create_id(counter, render_at_ms, bound.salt.as_deref())?,
                number: None,
            }),
        }
    }

    /// Renders with time fields computed once (a batch at one instant);
    /// template formats only.
    pub fn render_fields(
        &self,
        t: &Template,
        fields: &CivilFields,
        counter: u64,
        ids: NodeIds,
        bound: &Bound,
    ) -> Result<Rendered, FormatError> {
        let text = t.render(fields, counter, ids.node, ids.token, &bound.params)?;
        let number = t.to_u64(&text);
        Ok(Rendered { text, number })
    }

    /// Splits an ID back into its fields (`ParseFormatted`).
    pub fn parse(&self, id: &str) -> Result<ParsedId, FormatError> {
        match &self.kind {
            Kind::Template(t) => Ok(t.parse_id(id)?),
            Kind::Uniq64 => {
                let v: u64 = id.parse().map_err(|_| ParseError::BadChar {
                    column: id.bytes().position(|b| !b.is_ascii_digit()).unwrap_or(0) + 1,
                    expected: "a decimal uniq64 value".into(),
                    found: id.chars().find(|c| !c.is_ascii_digit()).unwrap_or(' '),
                })?;
                let u = Uniq64::decode(v)?;
                Ok(ParsedId {
                    year: Some(u.full_year()),
                    month: Some(u.month),
                    day: Some(u.day),
                    hour: Some(u.hour),
                    token: Some(u64::from(u.token)),
                    seq: u64::from(u.serial),
                    ..ParsedId::default()
                })
            }
            Kind::Lua(_) => Err(ParseError::NotParseable(self.def.name.clone()).into()),
        }
    }
}

fn check_free_param(name: &str, value: &str) -> Result<(), RenderError> {
    let ok = !value.is_empty()
        && value.len() <= MAX_FREE_PARAM_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b'=');
    if ok {
        Ok(())
    } else {
        Err(RenderError::BadParam {
            name: name.to_owned(),
            value: value.chars().take(40).collect(),
            width: MAX_FREE_PARAM_LEN as u8,
            charset: "printable ASCII (no / or =)",
            hint: " (at most; at least 1)",
        })
    }
}

#[cfg(test)]
mod tests;
