//! [`Format`]: a compiled format, which renders IDs, reserves counter
//! blocks and parses IDs back.

use super::compile::{
    check_common_fields, check_counter_range, check_scope_in_template, check_wall_clock,
    compile_idc, compile_lua, compile_template, compile_uniq64, Kind,
};
use super::period::{decide, next_period_start, PeriodDecision, PeriodKey, Reset, Zone};
use super::preset::{self, PresetName, Uniq64};
use super::{
    check_name, BoundParams, CivilFields, CounterBlock, CounterRange, CounterRecord, FormatDef,
    FormatError, LoadChecks, LuaLimits, LuaRule, ParseError, ParsedId, RenderError, Scope,
    Template, TokenSpace, FORMAT_DEF_VERSION, MAX_BLOCK_GROWTH, MAX_FREE_PARAM_LEN,
};

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
        Self::compile_with(def, now_ms, limits, LoadChecks::Run)
    }

    /// [`compile`](Self::compile), running a Lua rule's load-time checks
    /// or not as `checks` says (a stored definition that passed them
    /// skips them; see [`super::lua`]).
    pub fn compile_with(
        def: FormatDef,
        now_ms: i64,
        limits: LuaLimits,
        checks: LoadChecks,
    ) -> Result<Format, FormatError> {
        check_name(&def.name)?;
        if def.version > FORMAT_DEF_VERSION {
            return Err(FormatError::FutureVersion {
                format: def.name.clone(),
                version: def.version,
            });
        }
        let zone = Zone::get(&def.time_zone)?;
        check_common_fields(&def)?;
        let (kind, reset, min, max) = match (&def.template, &def.lua, def.preset) {
            (Some(src), _, _) => compile_template(&def, src)?,
            (None, Some(code), _) => compile_lua(&def, code, &zone, limits, now_ms, checks)?,
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

    /// The IANA time zone its periods and time fields are in.
    pub fn time_zone(&self) -> &Zone {
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

    /// Whether the counter is shown through a hide key (`{seq:N:hidden}`
    /// or `hide = true`): its internal value, which tells how many IDs
    /// were issued, is then for admin callers only.
    pub fn hides_counter(&self) -> bool {
        self.template().is_some_and(Template::hidden_seq)
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
    /// ([`period::decide`](super::period::decide)).
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
