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
