//! Formatted mode's pure core: human-readable IDs from a template, a
//! preset or a Lua rule, with a counter that resets every period in a
//! named time zone and never repeats.
//!
//! - [`FormatDef`] (`def.rs`): a format as data (config file, admin API,
//!   store), and the one rule for changing a stored one.
//! - [`Format`] (`compiled.rs`): a compiled, validated definition; it
//!   renders and parses IDs. [`Format::compile`] refuses anything that
//!   could repeat an ID, through the checks in `compile.rs`.
//! - [`FormatError`] (`error.rs`): every refusal, and its kind.
//! - [`period`]: reset periods on the zone's wall clock and the rule that
//!   the period never goes back ([`period::decide`]).
//! - [`template`]: the template language; [`preset`]: the `uniq64`
//!   and `idc` layouts; [`lua`]: sandboxed Lua rules;
//!   [`token`]: the spaces leased tokens come from.
//! - [`CounterRecord`] (`counter.rs`): a counter's durable record (its
//!   period and last reserved value) and the rule that turns it into the
//!   next block, as segment mode does for tags.
//!
//! Uniqueness contract: IDs are unique per format and, for counters kept
//! per value of scope parameters, per those values (a template renders its
//! scope parameters, so its IDs are unique across them too; a Lua rule's
//! scope parameters are namespaces, e.g. an `app_name` per caller). IDs of
//! different formats, or of other modes, may coincide.
//!
//! No I/O and no clock: time comes in as Unix milliseconds.

pub mod lua;
pub mod lua_sandbox;
pub mod period;
pub mod preset;
pub mod template;
pub mod token;

mod compile;
mod compiled;
mod counter;
mod def;
mod error;

pub use compiled::{Bound, Format, NodeIds, Rendered};
pub use counter::{CounterBlock, CounterRange, CounterRecord, Scope};
pub use def::FormatDef;
pub use error::FormatError;
pub use lua::{check_key, Deadline, LoadChecks, LuaError, LuaLimits, LuaRule};
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

/// The origin years a definition may give: IDs are issued after 1970, and
/// a `{yy}` window past 9999 could not be rendered (nor computed near
/// `i32::MAX`).
pub const ORIGIN_YEARS: std::ops::RangeInclusive<i32> = 1970..=9999;

#[cfg(test)]
mod tests;
