//! The uniqueness checks of a parsed template: one of each field, the
//! check digits last, the counter inside `{seq:N}`, and time fields that
//! name every period of the reset (see the module doc of [`super`]).

use super::syntax::{CheckKind, Field, Part};
use super::TemplateError;
use crate::id::format::period::Reset;

/// What one pass over a template's parts finds: its time fields, counter
/// width, whether every character is a digit, and its length.
#[derive(Default)]
pub(super) struct Layout {
    pub(super) time: TimeFields,
    pub(super) seq_width: Option<u8>,
    pub(super) digits_only: bool,
    pub(super) len: usize,
}

impl Layout {
    /// Walks the parts in order, checking that no field follows the check
    /// digits, that no field repeats and that Luhn check digits follow only
    /// digit fields.
    pub(super) fn scan(parts: &[(usize, Part)]) -> Result<Layout, TemplateError> {
        let mut l = Layout {
            digits_only: true,
            ..Layout::default()
        };
        let mut seen: Vec<(String, usize)> = Vec::new();
        let mut check_at: Option<usize> = None;
        let mut lettered: Option<(usize, String)> = None;
        for (column, part) in parts {
            let field = match part {
                Part::Lit(s) => {
                    l.len += s.len();
                    l.digits_only &= s.bytes().all(|b| b.is_ascii_digit());
                    continue;
                }
                Part::Field(f) => f,
            };
            l.len += field.width();
            if check_at.is_some() {
                return Err(TemplateError::CheckNotLast {
                    column: *column,
                    field: field.to_string(),
                });
            }
            let key = field_key(field);
            if seen.iter().any(|(k, _)| *k == key) {
                return Err(TemplateError::Repeated {
                    column: *column,
                    field: key,
                });
            }
            seen.push((key, *column));
            if field.may_hold_letters() {
                l.digits_only = false;
                lettered.get_or_insert((*column, field.to_string()));
            }
            if let Field::Check(kind) = field {
                if let (CheckKind::Luhn, Some((column, field))) = (kind, &lettered) {
                    return Err(TemplateError::LuhnNeedsDigits {
                        column: *column,
                        field: field.clone(),
                    });
                }
                check_at = Some(*column);
            }
            l.note(field);
        }
        Ok(l)
    }

    /// Records a time field or the counter's width (other fields: nothing).
    fn note(&mut self, field: &Field) {
        let t = &mut self.time;
        match field {
            Field::Year4 => t.year4 = true,
            Field::Year2 => t.year2 = true,
            Field::Year1 => t.year1 = true,
            Field::Month => t.month = true,
            Field::Day => t.day = true,
            Field::DayOfYear => t.doy = true,
            Field::Hour => t.hour = true,
            Field::Minute => t.minute = true,
            Field::Second => t.second = true,
            Field::UnixS => t.unix_s = true,
            Field::Seq(w) | Field::HiddenSeq(w) => self.seq_width = Some(*w),
            Field::Check(_) | Field::Node(_) | Field::Token(..) | Field::Param(..) => {}
        }
    }
}

/// The key a field may appear under only once: `{param:NAME}` per
/// parameter, the bare kind for node, token, seq and check, the field
/// itself otherwise.
fn field_key(field: &Field) -> String {
    match field {
        Field::Param(name, ..) => format!("{{param:{name}}}"),
        Field::Node(_)
        | Field::Token(..)
        | Field::Seq(_)
        | Field::HiddenSeq(_)
        | Field::Check(_) => {
            let s = field.to_string();
            s.split(':').next().unwrap_or("").to_owned() + "}"
        }
        other => other.to_string(),
    }
}

/// Checks that a counter of `seq_width` digits holds `counter_max`.
pub(super) fn check_counter_width(counter_max: u64, seq_width: u8) -> Result<(), TemplateError> {
    let limit = 10u64.pow(u32::from(seq_width)) - 1;
    if counter_max > limit {
        return Err(TemplateError::CounterTooWide {
            max: counter_max,
            width: seq_width,
            limit,
        });
    }
    Ok(())
}

/// Which civil unit the fields must name for `reset` (0 year, 1 month,
/// 2 day, 3 hour, 4 minute, 5 second; `None`: never resets). A reset in
/// seconds cannot be named by year and month alone.
pub(super) fn reset_unit(reset: Reset, t: &TimeFields) -> Result<Option<u8>, TemplateError> {
    Ok(match reset {
        Reset::Never => None,
        Reset::Year => Some(0),
        Reset::Month => Some(1),
        Reset::Day => Some(2),
        Reset::Hour => Some(3),
        Reset::Seconds(n) => {
            let finer_than_month = t.unix_s || t.doy || t.day || t.hour || t.minute || t.second;
            if !finer_than_month && (t.month || t.has_year()) {
                return Err(TemplateError::PeriodNotNameable { reset });
            }
            Some(if n % 86_400 == 0 {
                2
            } else if n % 3600 == 0 {
                3
            } else if n % 60 == 0 {
                4
            } else {
                5
            })
        }
    })
}

/// Checks that the fields name every period of `unit`.
pub(super) fn check_period_fields(
    reset: Reset,
    unit: Option<u8>,
    t: &TimeFields,
) -> Result<(), TemplateError> {
    if let Some(unit) = unit {
        if let Some(missing) = t.missing(unit) {
            let also = if matches!(reset, Reset::Seconds(_)) {
                ", or {unix_s}"
            } else {
                ""
            };
            return Err(TemplateError::MissingTimeField {
                reset,
                missing,
                also,
            });
        }
    }
    Ok(())
}

/// The years a resetting template with only `{yy}` or `{y}` can tell
/// apart, starting at `origin_year`, and the field that limits them.
pub(super) fn year_window(
    unit: Option<u8>,
    t: &TimeFields,
    origin_year: i32,
) -> Option<(i32, i32, &'static str)> {
    match (unit.is_some() && !t.unix_s && !t.year4, t.year2, t.year1) {
        (true, true, _) => Some((origin_year, origin_year + 99, "{yy}")),
        (true, false, true) => Some((origin_year, origin_year + 9, "{y}")),
        _ => None,
    }
}

/// The fields that name a period, as present in a template.
#[derive(Default)]
pub(super) struct TimeFields {
    year4: bool,
    year2: bool,
    year1: bool,
    month: bool,
    day: bool,
    doy: bool,
    hour: bool,
    minute: bool,
    second: bool,
    unix_s: bool,
}

impl TimeFields {
    fn has_year(&self) -> bool {
        self.year4 || self.year2 || self.year1
    }

    /// The first field missing to name a period of the given civil unit
    /// (0 year, 1 month, 2 day, 3 hour, 4 minute, 5 second).
    fn missing(&self, unit: u8) -> Option<&'static str> {
        if self.unix_s {
            return None;
        }
        if !self.has_year() {
            return Some("{yyyy}");
        }
        if unit == 1 && !self.month {
            return Some("{MM}");
        }
        if unit >= 2 && !self.doy {
            if !self.month {
                return Some("{MM} (or {ddd})");
            }
            if !self.day {
                return Some("{dd} (or {ddd})");
            }
        }
        [
            (3, self.hour, "{HH}"),
            (4, self.minute, "{mm}"),
            (5, self.second, "{ss}"),
        ]
        .into_iter()
        .find(|(u, present, _)| unit >= *u && !present)
        .map(|(_, _, name)| name)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_helpers::{assert_refused, civil, none, t};
    use super::super::{RenderError, Template, TemplateError};
    use crate::id::format::period::Reset;

    #[test]
    fn repeated_misplaced_or_missing_fields_are_refused_with_their_column() {
        assert_refused(&[
            (
                "{seq:2}-{seq:3}",
                TemplateError::Repeated {
                    column: 9,
                    field: "{seq}".into(),
                },
            ),
            (
                "{seq:2}{check:luhn}{node:1}",
                TemplateError::CheckNotLast {
                    column: 20,
                    field: "{node:1}".into(),
                },
            ),
            (
                "{param:b:2:alnum}{seq:2}{check:luhn}",
                TemplateError::LuhnNeedsDigits {
                    column: 1,
                    field: "{param:b:2:alnum}".into(),
                },
            ),
            ("{yyyy}{MM}", TemplateError::MissingSeq),
        ]);
    }

    #[test]
    fn a_template_longer_than_the_maximum_id_is_refused() {
        assert!(matches!(
            t(&format!("{}{{seq:2}}", "A".repeat(127)), Reset::Never),
            Err(TemplateError::TooLong { len: 129, .. })
        ));
    }

    #[test]
    fn templates_that_could_repeat_are_refused_naming_the_missing_field() {
        let missing = |src: &str, reset: Reset| match t(src, reset) {
            Err(TemplateError::MissingTimeField { missing, .. }) => missing,
            other => panic!("{src} {reset}: {other:?}"),
        };
        assert_eq!(missing("{MM}{dd}{seq:4}", Reset::Day), "{yyyy}");
        assert_eq!(missing("{yyyy}{dd}{seq:4}", Reset::Day), "{MM} (or {ddd})");
        assert_eq!(missing("{yyyy}{MM}{seq:4}", Reset::Day), "{dd} (or {ddd})");
        assert_eq!(missing("{yyyy}{seq:4}", Reset::Month), "{MM}");
        assert_eq!(missing("{yyyy}{MM}{dd}{seq:4}", Reset::Hour), "{HH}");
        assert_eq!(missing("{seq:4}", Reset::Year), "{yyyy}");
        assert_eq!(
            missing("{yyyy}{MM}{dd}{HH}{seq:4}", Reset::Seconds(900)),
            "{mm}"
        );
        assert_eq!(
            missing("{yyyy}{MM}{dd}{HH}{mm}{seq:4}", Reset::Seconds(90)),
            "{ss}"
        );
        let msg = t("{yyyy}{MM}{seq:4}", Reset::Day).unwrap_err().to_string();
        assert!(msg.contains("missing {dd}"), "{msg}");
        assert!(matches!(
            t("{yyyy}{MM}{seq:4}", Reset::Seconds(86_400 * 30)),
            Err(TemplateError::PeriodNotNameable { .. })
        ));
        // Enough fields, each way.
        for (src, reset) in [
            ("{seq:4}", Reset::Never),
            ("{yyyy}{seq:4}", Reset::Year),
            ("{yyyy}{MM}{seq:4}", Reset::Month),
            ("{yyyy}{MM}{dd}{seq:4}", Reset::Day),
            ("{yy}{ddd}{seq:4}", Reset::Day),
            ("{yyyy}{MM}{dd}{HH}{seq:4}", Reset::Hour),
            ("{yyyy}{MM}{dd}{seq:4}", Reset::Seconds(2 * 86_400)),
            ("{yyyy}{MM}{dd}{HH}{seq:4}", Reset::Seconds(7200)),
            ("{yyyy}{MM}{dd}{HH}{mm}{seq:4}", Reset::Seconds(900)),
            ("{yyyy}{MM}{dd}{HH}{mm}{ss}{seq:4}", Reset::Seconds(7)),
            ("{unix_s}{seq:4}", Reset::Seconds(1)),
            ("{unix_s}{seq:4}", Reset::Month),
        ] {
            assert!(t(src, reset).is_ok(), "{src} {reset}");
        }
    }

    #[test]
    fn the_counter_maximum_must_fit_the_seq_field() {
        assert!(Template::parse("{seq:4}", Reset::Never, 9999, 2026).is_ok());
        let err = Template::parse("{seq:4}", Reset::Never, 10_000, 2026).unwrap_err();
        assert_eq!(
            err,
            TemplateError::CounterTooWide {
                max: 10_000,
                width: 4,
                limit: 9999
            }
        );
        let tpl = Template::parse("{seq:2}", Reset::Never, 99, 2026).unwrap();
        let at = civil("2026-01-01T00:00:00Z", "UTC");
        assert_eq!(
            tpl.render(&at, 100, None, None, &none()),
            Err(RenderError::CounterTooWide {
                counter: 100,
                width: 2
            })
        );
    }

    #[test]
    fn short_years_are_valid_only_in_their_window() {
        let tpl = Template::parse("{y}{MM}{dd}{seq:4}", Reset::Day, 9999, 2026).unwrap();
        assert_eq!(tpl.year_window(), Some((2026, 2035)));
        let ok = civil("2035-12-31T00:00:00Z", "UTC");
        let id = tpl.render(&ok, 1, None, None, &none()).unwrap();
        assert_eq!(id, "512310001");
        assert_eq!(tpl.parse_id(&id).unwrap().year, Some(2035));
        let late = civil("2036-01-01T00:00:00Z", "UTC");
        assert!(matches!(
            tpl.render(&late, 1, None, None, &none()),
            Err(RenderError::YearOutsideWindow { year: 2036, .. })
        ));
        let early = civil("2025-12-31T00:00:00Z", "UTC");
        assert!(tpl.render(&early, 1, None, None, &none()).is_err());
        // With {yyyy} or {unix_s}, or no reset, there is no window.
        assert_eq!(
            t("{yyyy}{yy}{MM}{dd}{seq:4}", Reset::Day)
                .unwrap()
                .year_window(),
            None
        );
        assert_eq!(
            t("{y}{unix_s}{seq:4}", Reset::Day).unwrap().year_window(),
            None
        );
        assert_eq!(t("{y}{seq:4}", Reset::Never).unwrap().year_window(), None);
    }
}
