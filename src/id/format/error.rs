//! [`FormatError`]: everything that can go wrong with a format, and the
//! kind each failure is.

use thiserror::Error;

use super::period::{PeriodError, PeriodKey, Reset};
use super::{LuaError, ParseError, PresetError, RenderError, TemplateError, FORMAT_DEF_VERSION};

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
    /// An origin year outside [`ORIGIN_YEARS`](super::ORIGIN_YEARS).
    #[error("format {format:?}: origin_year = {year} is out of range: give a year from 1970 to 9999 (the first year a {{yy}} or {{y}} field counts from; left out, it is the year the format is created)")]
    BadOriginYear {
        /// The format.
        format: String,
        /// The year given.
        year: i32,
    },
    /// An update that would change how IDs render (see
    /// [`FormatDef::check_update`](super::FormatDef::check_update)).
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
    /// The time zone's wall clock goes back across a period boundary (a DST
    /// fall-back under periods shorter than the shift).
    #[error("format {format:?}: time zone {zone} turns its wall clock back {back_s} s at {at} (a DST or offset change), across a boundary of its {reset} periods; periods are cut on the time zone's wall clock, so its counter would be held in one period for that long. Use time_zone \"UTC\" (Unix-second fields such as {{unix_s}} render the same in any time zone), or a reset the change stays inside (hour or longer for a one-hour DST shift)")]
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
    /// No format by that name is defined.
    #[error("unknown format {0:?}: create it with `idgen admin formats create` (or a [[formats]] entry in the config file), then call again")]
    NotFound(String),
    /// A format definition refused by the admin API (it does not compile,
    /// or its Lua rule fails its checks); the message names the format.
    #[error("{0}")]
    Invalid(String),
    /// A live format by that name exists already.
    #[error("format {0:?} exists already: change it with `idgen admin formats update`, or pick another name")]
    Exists(String),
    /// The format was deleted: its name is kept as a tombstone for good.
    #[error("format {format:?} was deleted (tombstone since {deleted_ms} ms): its name can never be used again, because its counters stay in the store and a new definition could repeat IDs the old one handed out; pick another name")]
    Deleted {
        /// The format.
        format: String,
        /// When it was deleted, Unix ms.
        deleted_ms: u64,
    },
    /// The wall clock is behind the period a format's counter is in by
    /// more than the tolerance: the node will not re-enter the finished
    /// period, nor print times that far ahead.
    #[error("format {format:?}: the wall clock is {behind_ms} ms behind the period its counter is in (more than clock.max_backward); this node refuses until its clock catches up: retry on another node")]
    Held {
        /// The format.
        format: String,
        /// How far behind, ms.
        behind_ms: i64,
    },
    /// A format created on a restored state file whose counter cannot
    /// hold the restore's margin for new formats (the store's format
    /// restore module says why the margin applies).
    #[error("format {format:?} is new since this state file was restored from a backup (restore instant {until_ms} ms): the lost node may have created a format by this name after the backup and issued its IDs, so a new format's counters in periods up to the restore start {margin} above their minimum (the restore's margin for new formats), but its counter ({range}) cannot hold that. If no format by this name ever issued an ID on this cluster, create it with `idgen admin formats create --fresh` (CreateFormat fresh = true): that is your assertion, and it starts at its minimum (a [[formats]] entry: remove it, start the node, create the format with --fresh, then put the entry back). Otherwise give it another name or a wider counter ({{seq:N}} with more digits)")]
    BelowRestore {
        /// The format.
        format: String,
        /// The restore's margin for new formats.
        margin: u64,
        /// The restore instant, Unix ms.
        until_ms: i64,
        /// The counter's range (`min..=max, step s`).
        range: String,
    },
    /// A new scope value would pass `formatted.max_scope_values`.
    #[error("format {format:?}: a new scope value would pass the limit of {limit} counters per format set by formatted.max_scope_values, so nothing was created; values already used keep working. Scope counters are never deleted (a new counter for a used value could repeat its IDs): raise formatted.max_scope_values, or give a new set of values a new format")]
    ScopeValuesFull {
        /// The format.
        format: String,
        /// The limit.
        limit: u64,
    },
}

impl FormatError {
    /// What kind of failure this is: a caller's bad parameters or ID are
    /// BadRequest; a counter used up in its period is Exhausted; a Lua rule
    /// failing while serving, or a zone/time out of range, is a
    /// Precondition (an operator must fix the rule or definition).
    pub fn kind(&self) -> crate::id::ErrorKind {
        use crate::id::ErrorKind;
        match self {
            Self::Exhausted { .. } | Self::NoToken { .. } | Self::ScopeValuesFull { .. } => {
                ErrorKind::Exhausted
            }
            Self::Render(_)
            | Self::Parse(_)
            | Self::Preset(_)
            | Self::BadName(_)
            | Self::Invalid(_) => ErrorKind::BadRequest,
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::Exists(_) => ErrorKind::AlreadyExists,
            Self::Deleted { .. } | Self::BelowRestore { .. } => ErrorKind::Precondition,
            // The clock catches up, or another node serves.
            Self::Held { .. } => ErrorKind::Unavailable,
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
