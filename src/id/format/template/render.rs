//! Rendering: a caller's parameters checked against the template, and a
//! counter turned into an ID of fixed width.

use thiserror::Error;

use super::check_digit::{check_value, push_num};
use super::syntax::{Charset, Field, Part};
use super::{Template, ALNUM};
use crate::id::format::period::{PeriodError, Zone};

/// Why an ID could not be rendered. Every message names what to fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RenderError {
    /// A parameter the template needs was not given.
    #[error("parameter {name:?} is missing; this format needs {expected}")]
    MissingParam {
        /// The parameter.
        name: String,
        /// Every parameter the format takes, with its shape.
        expected: String,
    },
    /// A parameter the format does not take.
    #[error("parameter {name:?} is unknown; this format takes {expected}")]
    UnknownParam {
        /// The parameter.
        name: String,
        /// Every parameter the format takes.
        expected: String,
    },
    /// A parameter of the wrong length or characters.
    #[error("parameter {name:?} = {value:?} is invalid: it must be exactly {width} {charset} characters{hint}")]
    BadParam {
        /// The parameter.
        name: String,
        /// Its value (cut to 40 characters).
        value: String,
        /// Required length.
        width: u8,
        /// Required charset.
        charset: &'static str,
        /// Further advice.
        hint: &'static str,
    },
    /// The template carries the node or a token and none was given.
    #[error("this format carries {field} and no {field} was given (a per-node format runs only on a node with one)")]
    NoNode {
        /// `node` or `token`.
        field: &'static str,
    },
    /// The node id or token does not fit its field.
    #[error("{field} {value} does not fit {width} {charset} characters")]
    NodeTooWide {
        /// `node` or `token`.
        field: &'static str,
        /// The value.
        value: u64,
        /// The field's width.
        width: u8,
        /// Its charset.
        charset: &'static str,
    },
    /// The counter does not fit `{seq:N}`.
    #[error("counter {counter} does not fit {{seq:{width}}}")]
    CounterTooWide {
        /// The counter.
        counter: u64,
        /// The width.
        width: u8,
    },
    /// The year is outside the window a `{yy}`/`{y}`-only template is valid
    /// for.
    #[error("year {year} is outside {first}..={last}, the years this format's {field} names uniquely; create a new format (e.g. with {{yyyy}})")]
    YearOutsideWindow {
        /// The year to render.
        year: i32,
        /// First valid year.
        first: i32,
        /// Last valid year.
        last: i32,
        /// `{yy}` or `{y}`.
        field: &'static str,
    },
    /// A time the fixed-width fields cannot hold.
    #[error("time {0} cannot be rendered with fixed-width fields ({{yyyy}} holds years 0-9999, {{unix_s}} 2001-09-09 to 2286-11-20)")]
    TimeOutOfRange(String),
    /// The zone or calendar refused the time.
    #[error(transparent)]
    Period(#[from] PeriodError),
}

/// A caller's parameters bound to a template: values in the template's
/// order, each checked for length and charset.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BoundParams(Vec<String>);

impl BoundParams {
    /// The values, in the order of the template's `{param}` fields.
    pub fn values(&self) -> &[String] {
        &self.0
    }
}

/// Local time fields of one instant, computed once per batch of IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CivilFields {
    /// Year.
    pub year: i16,
    /// Month 1-12.
    pub month: i8,
    /// Day 1-31.
    pub day: i8,
    /// Day of year 1-366.
    pub day_of_year: i16,
    /// Hour 0-23.
    pub hour: i8,
    /// Minute 0-59.
    pub minute: i8,
    /// Second 0-59.
    pub second: i8,
    /// Unix seconds.
    pub unix_s: i64,
}

impl CivilFields {
    /// The fields of instant `ms` (Unix ms) in `zone`.
    pub fn at(ms: i64, zone: &Zone) -> Result<CivilFields, PeriodError> {
        let dt = zone.civil(ms)?;
        Ok(CivilFields {
            year: dt.year(),
            month: dt.month(),
            day: dt.day(),
            day_of_year: dt.day_of_year(),
            hour: dt.hour(),
            minute: dt.minute(),
            second: dt.second(),
            unix_s: ms.div_euclid(1000),
        })
    }
}

impl Template {
    fn expected_params(&self) -> String {
        let list: Vec<String> = self
            .params()
            .map(|(n, w, c)| format!("{n} ({w} {})", c.name()))
            .collect();
        if list.is_empty() {
            "no parameters".to_owned()
        } else {
            list.join(", ")
        }
    }

    /// Checks the caller's parameters against the template: each present,
    /// exactly its width, of its charset; none unknown. Errors name the
    /// parameter.
    pub fn bind<'a>(
        &self,
        params: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
    ) -> Result<BoundParams, RenderError> {
        for (name, _) in params.clone() {
            if !self.params().any(|(n, ..)| n == name) {
                return Err(RenderError::UnknownParam {
                    name: name.chars().take(40).collect(),
                    expected: self.expected_params(),
                });
            }
        }
        let mut values = Vec::new();
        for (name, width, charset) in self.params() {
            let value = params
                .clone()
                .into_iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v)
                .ok_or_else(|| RenderError::MissingParam {
                    name: name.to_owned(),
                    expected: self.expected_params(),
                })?;
            if value.len() != usize::from(width) || !value.bytes().all(|b| charset.allows(b)) {
                let hint =
                    if charset == Charset::Alnum && value.bytes().any(|b| b.is_ascii_lowercase()) {
                        " (letters in upper case)"
                    } else if charset == Charset::Digits && value.len() < usize::from(width) {
                        " (pad with leading zeros)"
                    } else {
                        ""
                    };
                return Err(RenderError::BadParam {
                    name: name.to_owned(),
                    value: value.chars().take(40).collect(),
                    width,
                    charset: charset.name(),
                    hint,
                });
            }
            values.push(value.to_owned());
        }
        Ok(BoundParams(values))
    }

    /// Parameters of the right shape (all `0`), for checks that render
    /// without a caller, such as [`crate::id::format::Format::check_node`].
    pub fn placeholder_params(&self) -> BoundParams {
        BoundParams(
            self.params()
                .map(|(_, w, _)| "0".repeat(usize::from(w)))
                .collect(),
        )
    }

    /// Renders one ID into `out` (cleared first). A `{seq:N:hidden}`
    /// counter arrives already shown: the engine maps it through its hider.
    pub fn render_into(
        &self,
        out: &mut String,
        time: &CivilFields,
        counter: u64,
        node: Option<u64>,
        token: Option<u64>,
        params: &BoundParams,
    ) -> Result<(), RenderError> {
        out.clear();
        if let Some((first, last, field)) = self.year_window {
            let year = i32::from(time.year);
            if year < first || year > last {
                return Err(RenderError::YearOutsideWindow {
                    year,
                    first,
                    last,
                    field,
                });
            }
        }
        let mut param_index = 0;
        for (_, part) in &self.parts {
            let field = match part {
                Part::Lit(s) => {
                    out.push_str(s);
                    continue;
                }
                Part::Field(f) => f,
            };
            match field {
                Field::Year4 => {
                    if !(0..=9999).contains(&time.year) {
                        return Err(RenderError::TimeOutOfRange(format!("year {}", time.year)));
                    }
                    push_num(out, time.year as u64, 4);
                }
                Field::Year2 => push_num(out, time.year.rem_euclid(100) as u64, 2),
                Field::Year1 => push_num(out, time.year.rem_euclid(10) as u64, 1),
                Field::Month => push_num(out, time.month as u64, 2),
                Field::Day => push_num(out, time.day as u64, 2),
                Field::DayOfYear => push_num(out, time.day_of_year as u64, 3),
                Field::Hour => push_num(out, time.hour as u64, 2),
                Field::Minute => push_num(out, time.minute as u64, 2),
                Field::Second => push_num(out, time.second as u64, 2),
                Field::UnixS => {
                    if !(1_000_000_000..=9_999_999_999).contains(&time.unix_s) {
                        return Err(RenderError::TimeOutOfRange(format!(
                            "unix_s {}",
                            time.unix_s
                        )));
                    }
                    push_num(out, time.unix_s as u64, 10);
                }
                Field::Node(w) => {
                    let v = node.ok_or(RenderError::NoNode { field: "node" })?;
                    push_radix(out, v, *w, Charset::Digits, "node")?;
                }
                Field::Token(w, c) => {
                    let v = token.ok_or(RenderError::NoNode { field: "token" })?;
                    push_radix(out, v, *w, *c, "token")?;
                }
                Field::Seq(w) | Field::HiddenSeq(w) => {
                    if counter >= 10u64.pow(u32::from(*w)) {
                        return Err(RenderError::CounterTooWide { counter, width: *w });
                    }
                    push_num(out, counter, usize::from(*w));
                }
                Field::Param(name, ..) => {
                    // bind() produced one value per param field, in order.
                    let v = params
                        .0
                        .get(param_index)
                        .ok_or_else(|| RenderError::MissingParam {
                            name: name.clone(),
                            expected: self.expected_params(),
                        })?;
                    out.push_str(v);
                    param_index += 1;
                }
                Field::Check(kind) => {
                    // The payload is everything rendered so far.
                    let (value, width) = check_value(*kind, out.as_bytes());
                    push_num(out, value, width);
                }
            }
        }
        Ok(())
    }

    /// Renders one ID.
    pub fn render(
        &self,
        time: &CivilFields,
        counter: u64,
        node: Option<u64>,
        token: Option<u64>,
        params: &BoundParams,
    ) -> Result<String, RenderError> {
        let mut out = String::with_capacity(self.len);
        self.render_into(&mut out, time, counter, node, token, params)?;
        Ok(out)
    }
}

fn push_radix(
    out: &mut String,
    v: u64,
    width: u8,
    charset: Charset,
    field: &'static str,
) -> Result<(), RenderError> {
    let radix = charset.radix();
    let too_wide = || RenderError::NodeTooWide {
        field,
        value: v,
        width,
        charset: charset.name(),
    };
    let limit = radix.checked_pow(u32::from(width)).ok_or_else(too_wide)?;
    if v >= limit {
        return Err(too_wide());
    }
    let mut buf = [b'0'; 8];
    let mut x = v;
    let w = usize::from(width);
    for i in (0..w).rev() {
        buf[i] = ALNUM[(x % radix) as usize];
        x /= radix;
    }
    for &b in &buf[..w] {
        out.push(b as char);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::test_helpers::{civil, none, t};
    use super::super::RenderError;
    use crate::id::format::period::Reset;

    #[test]
    fn fields_render_fixed_width_in_the_zone() {
        let tpl = t(
            "ORD-{yyyy}{MM}{dd}{HH}{mm}{ss}-{ddd}-{yy}{y}-{unix_s}-{node:3}-{token:2:alnum}-{seq:6}",
            Reset::Day,
        )
        .unwrap();
        // 2026-03-01 00:00:05 in Shanghai is 2026-02-28T16:00:05Z.
        let at = civil("2026-02-28T16:00:05Z", "Asia/Shanghai");
        let id = tpl
            .render(&at, 42, Some(7), Some(36 + 35), &none())
            .unwrap();
        assert_eq!(id, "ORD-20260301000005-060-266-1772294405-007-1Z-000042");
        assert_eq!(id.len(), tpl.len());
        assert!(tpl.per_node());
        assert!(!tpl.numeric());
    }

    #[test]
    fn parameters_are_checked_and_errors_name_them() {
        let tpl = t(
            "{param:biz:2:digits}{param:tag:3:alnum}{seq:3}",
            Reset::Never,
        )
        .unwrap();
        let at = civil("2026-01-01T00:00:00Z", "UTC");
        let p = tpl.bind([("biz", "07"), ("tag", "AB1")]).unwrap();
        assert_eq!(tpl.render(&at, 9, None, None, &p).unwrap(), "07AB1009");
        let err = |params: &[(&str, &str)]| tpl.bind(params.iter().copied()).unwrap_err();
        assert!(
            matches!(err(&[("tag", "AB1")]), RenderError::MissingParam { name, .. } if name == "biz")
        );
        assert!(matches!(
            err(&[("biz", "07"), ("tag", "AB1"), ("x", "1")]),
            RenderError::UnknownParam { name, .. } if name == "x"
        ));
        let e = err(&[("biz", "7"), ("tag", "AB1")]);
        assert!(e.to_string().contains("\"biz\""), "{e}");
        assert!(e.to_string().contains("leading zeros"), "{e}");
        let e = err(&[("biz", "07"), ("tag", "ab1")]);
        assert!(
            e.to_string().contains("\"tag\"") && e.to_string().contains("upper"),
            "{e}"
        );
        assert!(matches!(
            err(&[("biz", "0A"), ("tag", "AB1")]),
            RenderError::BadParam { .. }
        ));
        assert!(matches!(
            err(&[("biz", "07"), ("tag", "AB-")]),
            RenderError::BadParam { .. }
        ));
    }

    #[test]
    fn node_and_token_must_be_given_and_fit() {
        let tpl = t("{node:2}{token:2:alnum}{seq:2}", Reset::Never).unwrap();
        let at = civil("2026-01-01T00:00:00Z", "UTC");
        assert_eq!(
            tpl.render(&at, 1, None, Some(1), &none()),
            Err(RenderError::NoNode { field: "node" })
        );
        assert!(matches!(
            tpl.render(&at, 1, Some(100), Some(1), &none()),
            Err(RenderError::NodeTooWide { field: "node", .. })
        ));
        assert!(matches!(
            tpl.render(&at, 1, Some(1), Some(36 * 36), &none()),
            Err(RenderError::NodeTooWide { field: "token", .. })
        ));
        assert_eq!(
            tpl.render(&at, 1, Some(99), Some(36 * 36 - 1), &none())
                .unwrap(),
            "99ZZ01"
        );
    }

    #[test]
    fn numeric_templates_give_numbers_below_two_to_the_63() {
        let tpl = t(
            "{unix_s}{seq:4}{node:2}{param:k:1}{param:r:2}",
            Reset::Seconds(1),
        )
        .unwrap();
        assert!(tpl.numeric());
        assert_eq!(tpl.len(), 19);
        let at = civil("2026-11-23T00:00:00Z", "UTC");
        let p = tpl.bind([("k", "1"), ("r", "00")]).unwrap();
        let id = tpl.render(&at, 9998, Some(1), None, &p).unwrap();
        assert_eq!(id, "1795392000999801100");
        assert_eq!(tpl.to_u64(&id), Some(1_795_392_000_999_801_100));
        assert_eq!(tpl.to_u64("9999999999999999999"), None, "above 2^63");
        assert!(!t("X{seq:4}", Reset::Never).unwrap().numeric());
        assert!(!t("{seq:18}{node:2}", Reset::Never).unwrap().numeric());
    }
}
