//! A format as data ([`FormatDef`]) and the one rule for changing a
//! stored one ([`FormatDef::check_update`]).

use serde::{Deserialize, Serialize};

use super::period::{Reset, Zone};
use super::preset::{self, PresetName};
use super::{FormatError, Template, FORMAT_DEF_VERSION, IDC_DEFAULT_MAX};

fn default_version() -> u32 {
    FORMAT_DEF_VERSION
}

fn default_time_zone() -> String {
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
    /// A Lua rule's source (its four functions, see [`super::lua`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lua: Option<String>,
    /// A preset: `uniq64` or `idc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<PresetName>,
    /// IANA time zone the time fields and periods are in. Read as
    /// `time_zone` or, as before, `zone`; stored and shown as `zone` for
    /// one more release, so that nodes of the release before (which
    /// refuse unknown keys in a stored definition) still read what a
    /// newer node stored during a rolling upgrade.
    #[serde(rename = "zone", alias = "time_zone", default = "default_time_zone")]
    pub time_zone: String,
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
    /// The hide key (`idgen admin keys create KEY_ID`) a `{seq:N:hidden}`
    /// counter is shown through; default: the format's name. Frozen, like
    /// the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hide_key: Option<String>,
    /// Shows every `{seq:N}` of the template as if it were
    /// `{seq:N:hidden}` (N >= 7). Frozen, like the template; a definition
    /// stored without it is plain.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hide: bool,
}

impl FormatDef {
    /// A template definition with defaults.
    pub fn template(name: &str, template: &str, time_zone: &str, reset: Reset) -> FormatDef {
        FormatDef {
            version: FORMAT_DEF_VERSION,
            name: name.to_owned(),
            template: Some(template.to_owned()),
            lua: None,
            preset: None,
            time_zone: time_zone.to_owned(),
            reset: Some(reset),
            min: None,
            max: None,
            step: 1,
            scope_params: Vec::new(),
            length: None,
            origin_year: None,
            description: String::new(),
            hide_key: None,
            hide: false,
        }
    }

    /// The definition as first stored: `origin_year` set to the local year
    /// at `now_ms` when not given. Call once, when the format is created.
    pub fn stamped(mut self, now_ms: i64) -> Result<FormatDef, FormatError> {
        if self.origin_year.is_none() {
            let zone = Zone::get(&self.time_zone)?;
            self.origin_year = Some(i32::from(zone.civil(now_ms)?.year()));
        }
        Ok(self)
    }

    /// The key of the load-time checks of this definition's Lua rule under
    /// `limits` ([`super::check_key`]); `None` when it has no Lua rule.
    pub fn lua_check_key(&self, limits: super::LuaLimits) -> Option<String> {
        let source = self.lua.as_deref()?;
        Some(super::check_key(
            source,
            &self.time_zone,
            self.length,
            self.step,
            limits,
        ))
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
    /// time zone, reset, min, a smaller max, step, scope parameters, length,
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
            time_zone,
            reset,
            min,
            max: _,
            step,
            scope_params,
            length,
            origin_year,
            description: _,
            hide_key,
            hide,
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
        self.check_hide_update(*hide, hide_key.is_some(), new.hide_key_id())?;
        let tz = (&self.time_zone, time_zone);
        frozen("time_zone", tz.0 != tz.1, both(tz.0, tz.1))?;
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

    /// The part of [`FormatDef::check_update`] for hiding: `hide` and the
    /// key are frozen with the template.
    fn check_hide_update(
        &self,
        hide: bool,
        new_names_key: bool,
        new_key_id: &str,
    ) -> Result<(), FormatError> {
        if self.hide != hide {
            return Err(self.frozen_field(
                "hide",
                format!(
                    "{} -> {hide}; plain and hidden counter values of one format could show as the same ID",
                    self.hide
                ),
            ));
        }
        if self.hide_key_id() != new_key_id && (self.hides() || new_names_key) {
            return Err(self.frozen_field(
                "hide_key",
                "the key decides which ID a counter value shows as; another key could show an ID already given".into(),
            ));
        }
        Ok(())
    }

    /// Whether the format shows its counter through a hide key (`hide =
    /// true`, or its template has `{seq:N:hidden}`).
    pub fn hides(&self) -> bool {
        self.hide
            || self
                .template
                .as_deref()
                .is_some_and(|t| t.contains(":hidden}"))
    }

    /// The hide key id of a hiding format: `hide_key`, or its name.
    pub fn hide_key_id(&self) -> &str {
        self.hide_key.as_deref().unwrap_or(&self.name)
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
                Some(t.seq_max())
            }
            (None, Some(PresetName::Idc)) => Some(IDC_DEFAULT_MAX),
            (None, Some(PresetName::Uniq64)) => Some(preset::UNIQ64_MAX_SERIAL),
            (None, None) => None,
        }
    }
}

/// Parses template `src` for `def` (years from `origin_year`, 2000 if
/// unset), naming the format in the error. Compiling uses it too; it
/// lives with the definition it reads.
pub(super) fn template_of(
    def: &FormatDef,
    src: &str,
    reset: Reset,
    max: u64,
) -> Result<Template, FormatError> {
    let origin = def.origin_year.unwrap_or(2000);
    Template::parse_hiding(src, reset, max, origin, def.hide).map_err(|source| {
        FormatError::Template {
            format: def.name.clone(),
            source,
        }
    })
}

/// A counter bound for a message: the number, or `unset`.
fn shown(max: Option<u64>) -> String {
    max.map_or_else(|| "unset".to_owned(), |m| m.to_string())
}
