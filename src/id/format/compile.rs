//! The steps of [`Format::compile`](super::Format::compile): the checks
//! every definition passes and the compilation of each kind (template,
//! Lua rule, `idc`, `uniq64`) into the rule that renders its IDs.

use super::def::template_of;
use super::period::{self, Reset, Zone};
use super::preset::{self, PresetName, IDC_TEMPLATE};
use super::{
    FormatDef, FormatError, LoadChecks, LuaLimits, LuaRule, Template, IDC_DEFAULT_MAX, ORIGIN_YEARS,
};

/// What compiling a format's source gives: the rule, its reset, and its
/// counter's min and max.
pub(super) type Compiled = (Kind, Reset, u64, u64);

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

/// A hide key id: `[a-z0-9][a-z0-9_-]{0,62}`.
fn valid_hide_key_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

/// Checks what every kind of format shares: the step, the scope
/// parameters' names, exactly one source, and `length` only for Lua.
pub(super) fn check_common_fields(def: &FormatDef) -> Result<(), FormatError> {
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
    if def.hide_key.is_some() && !def.hides() {
        return Err(not_applicable(
            def,
            "hide_key",
            "unhidden",
            "only a template with {seq:N:hidden} is shown through a key; hide the counter or drop hide_key",
        ));
    }
    if def.hide && def.template.is_none() && def.preset != Some(PresetName::Idc) {
        return Err(not_applicable(
            def,
            "hide",
            "Lua and uniq64",
            "only a template's decimal {seq:N} can be hidden; write the format as a template with {seq:N} (N >= 7), or drop hide",
        ));
    }
    if def.hides() && !valid_hide_key_id(def.hide_key_id()) {
        return Err(bad_counter(
            def,
            format!(
                "hide key id {:?} is malformed; set hide_key to [a-z0-9][a-z0-9_-]{{0,62}}",
                def.hide_key_id()
            ),
        ));
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

/// Compiles a template format; `max` defaults to the widest counter the
/// `{seq:N}` field holds.
pub(super) fn compile_template(def: &FormatDef, src: &str) -> Result<Compiled, FormatError> {
    let reset = def.reset.unwrap_or(Reset::Never);
    let min = def.min.unwrap_or(0);
    // The widest counter the field holds, when max is not given.
    let probe = template_of(def, src, reset, 0)?;
    let max = def.max.unwrap_or(probe.seq_max());
    let t = template_of(def, src, reset, max)?;
    if t.year_window().is_some() && def.origin_year.is_none() {
        return Err(FormatError::NoOriginYear(def.name.clone()));
    }
    Ok((Kind::Template(t), reset, min, max))
}

/// Compiles a Lua format: the rule sets reset, min and max, so the
/// definition may not; the rule is test-run at `now_ms` unless `checks`
/// says it passed before.
pub(super) fn compile_lua(
    def: &FormatDef,
    code: &str,
    zone: &Zone,
    limits: LuaLimits,
    now_ms: i64,
    checks: LoadChecks,
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
    let rule = match checks {
        LoadChecks::Run => LuaRule::load(
            &def.name,
            code,
            zone.clone(),
            def.length,
            def.step,
            limits,
            now_ms,
        )?,
        LoadChecks::Skip => {
            LuaRule::load_unchecked(&def.name, code, zone.clone(), def.length, limits)?
        }
    };
    let (reset, min, max) = (rule.reset(), rule.min_counter(), rule.max_counter());
    Ok((Kind::Lua(Box::new(rule)), reset, min, max))
}

/// Compiles the `idc` preset: its counter resets every Unix second, in UTC.
pub(super) fn compile_idc(def: &FormatDef) -> Result<Compiled, FormatError> {
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
pub(super) fn compile_uniq64(def: &FormatDef) -> Result<Compiled, FormatError> {
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
pub(super) fn check_wall_clock(
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
pub(super) fn check_counter_range(def: &FormatDef, min: u64, max: u64) -> Result<(), FormatError> {
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
pub(super) fn check_scope_in_template(def: &FormatDef, kind: &Kind) -> Result<(), FormatError> {
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
pub(super) enum Kind {
    Template(Template),
    Uniq64,
    Lua(Box<LuaRule>),
}
