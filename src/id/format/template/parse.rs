//! Reading an ID back into its fields: every character, the time fields'
//! ranges and the check digits checked.

use thiserror::Error;

use super::check_digit::check_digits;
use super::syntax::{Charset, Field, Part};
use super::Template;

/// Why an ID string does not parse as this format's.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    /// A character outside ASCII: no template renders one.
    #[error("the ID has a non-ASCII character {found:?} at position {position}; this format's IDs are ASCII only (digits, letters and the template's literals): was it retyped or pasted from a rich-text source?")]
    NonAscii {
        /// Its position, in characters, from 1.
        position: usize,
        /// The character.
        found: char,
    },
    /// Wrong length.
    #[error("the ID has {got} characters; this format's IDs have {expected}")]
    WrongLength {
        /// Expected length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// A character that does not belong where it is.
    #[error("column {column}: expected {expected}, found {found:?}")]
    BadChar {
        /// Where.
        column: usize,
        /// What the format has there.
        expected: String,
        /// What the ID has.
        found: char,
    },
    /// A time field out of its range (month 13, hour 24...).
    #[error("column {column}: {field} = {value} is not a valid {field}")]
    BadTime {
        /// Where.
        column: usize,
        /// Which field.
        field: String,
        /// The value.
        value: u64,
    },
    /// The check digit does not match.
    #[error(
        "the check digits {found:?} do not match (expected {expected:?}); the ID was mistyped"
    )]
    CheckMismatch {
        /// The ID's check digits.
        found: String,
        /// What they should be.
        expected: String,
    },
    /// This format's IDs do not parse back (Lua rules).
    #[error("IDs of format {0:?} come from a Lua rule and have no fields to parse")]
    NotParseable(String),
}

/// The fields of a parsed ID. Time fields the template lacks are `None`;
/// `{yy}`/`{y}` are resolved to a full year within the format's window.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedId {
    /// Full year.
    pub year: Option<i32>,
    /// Month.
    pub month: Option<u8>,
    /// Day of month.
    pub day: Option<u8>,
    /// Day of year.
    pub day_of_year: Option<u16>,
    /// Hour.
    pub hour: Option<u8>,
    /// Minute.
    pub minute: Option<u8>,
    /// Second.
    pub second: Option<u8>,
    /// Unix seconds.
    pub unix_s: Option<u64>,
    /// Node id.
    pub node: Option<u64>,
    /// Token value (decoded from its charset).
    pub token: Option<u64>,
    /// The counter.
    pub seq: u64,
    /// Parameters, in template order.
    pub params: Vec<(String, String)>,
    /// The check digits, already verified.
    pub check: Option<String>,
}

impl Template {
    /// The ID as a number, when the template is [`numeric`](Self::numeric)
    /// and the value is below 2^63.
    pub fn to_u64(&self, id: &str) -> Option<u64> {
        if !self.numeric() || id.len() != self.len {
            return None;
        }
        id.parse::<u64>().ok().filter(|v| *v <= i64::MAX as u64)
    }

    /// Splits an ID of this template into its fields, checking every
    /// character, the time fields' ranges and the check digits.
    pub fn parse_id(&self, id: &str) -> Result<ParsedId, ParseError> {
        // Templates are ASCII only (literals are checked when parsed), so
        // bytes and characters agree once the ID is.
        if let Some((i, found)) = id.chars().enumerate().find(|(_, c)| !c.is_ascii()) {
            return Err(ParseError::NonAscii {
                position: i + 1,
                found,
            });
        }
        let got = id.len();
        if got != self.len {
            return Err(ParseError::WrongLength {
                expected: self.len,
                got,
            });
        }
        let b = id.as_bytes();
        let mut out = ParsedId::default();
        let mut pos = 0;
        let mut short_years = ShortYears::default();
        for (_, part) in &self.parts {
            match part {
                Part::Lit(s) => {
                    check_literal(b, pos, s)?;
                    pos += s.len();
                }
                Part::Field(field) => {
                    read_field(field, id, pos, &mut out, &mut short_years)?;
                    pos += field.width();
                }
            }
        }
        if out.year.is_none() {
            out.year = self.resolve_short_year(short_years);
        }
        Ok(out)
    }

    /// The full year a `{yy}` or `{y}` read names, within the format's
    /// year window (from 2000 without one); `None` without either.
    fn resolve_short_year(&self, short: ShortYears) -> Option<i32> {
        let (digits, modulus) = match (short.y2, short.y1) {
            (Some(y), _) => (Some(y), 100),
            (None, Some(y)) => (Some(y), 10),
            _ => (None, 1),
        };
        let d = digits?;
        let first = self.year_window.map_or(2000, |(f, _, _)| f);
        Some(first + (d - first).rem_euclid(modulus))
    }
}

/// The `{yy}` and `{y}` values an ID holds, before they are made full
/// years.
#[derive(Default)]
struct ShortYears {
    y2: Option<i32>,
    y1: Option<i32>,
}

/// Checks that the ID bytes at `pos` are the literal `s`, naming the first
/// column that differs.
fn check_literal(b: &[u8], pos: usize, s: &str) -> Result<(), ParseError> {
    for (i, want) in s.bytes().enumerate() {
        if b[pos + i] != want {
            return Err(ParseError::BadChar {
                column: pos + i + 1,
                expected: format!("{:?}", want as char),
                found: b[pos + i] as char,
            });
        }
    }
    Ok(())
}

/// Reads `field` from the ID at byte `pos` into `out` (short years into
/// `short`), checking its characters, a time field's range and check
/// digits (over everything before them).
fn read_field(
    field: &Field,
    id: &str,
    pos: usize,
    out: &mut ParsedId,
    short: &mut ShortYears,
) -> Result<(), ParseError> {
    let b = id.as_bytes();
    let w = field.width();
    let span = &b[pos..pos + w];
    let column = pos + 1;
    let num = |charset: Charset| read_radix(span, charset, column);
    let time = |name: &str, lo: u64, hi: u64| -> Result<u64, ParseError> {
        let v = read_radix(span, Charset::Digits, column)?;
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(ParseError::BadTime {
                column,
                field: name.to_owned(),
                value: v,
            })
        }
    };
    match field {
        Field::Year4 => out.year = Some(time("year", 0, 9999)? as i32),
        Field::Year2 => short.y2 = Some(time("year", 0, 99)? as i32),
        Field::Year1 => short.y1 = Some(time("year", 0, 9)? as i32),
        Field::Month => out.month = Some(time("month", 1, 12)? as u8),
        Field::Day => out.day = Some(time("day", 1, 31)? as u8),
        Field::DayOfYear => out.day_of_year = Some(time("day of year", 1, 366)? as u16),
        Field::Hour => out.hour = Some(time("hour", 0, 23)? as u8),
        Field::Minute => out.minute = Some(time("minute", 0, 59)? as u8),
        Field::Second => out.second = Some(time("second", 0, 59)? as u8),
        Field::UnixS => out.unix_s = Some(num(Charset::Digits)?),
        Field::Node(_) => out.node = Some(num(Charset::Digits)?),
        Field::Token(_, c) => out.token = Some(num(*c)?),
        Field::Seq(_) | Field::HiddenSeq(_) => out.seq = num(Charset::Digits)?,
        Field::Param(name, _, c) => {
            num(*c)?;
            out.params.push((name.clone(), id[pos..pos + w].to_owned()));
        }
        Field::Check(kind) => {
            let expected = check_digits(*kind, &b[..pos]);
            let found = &id[pos..pos + w];
            if found != expected {
                return Err(ParseError::CheckMismatch {
                    found: found.to_owned(),
                    expected,
                });
            }
            out.check = Some(expected);
        }
    }
    Ok(())
}

fn read_radix(span: &[u8], charset: Charset, column: usize) -> Result<u64, ParseError> {
    let mut v: u64 = 0;
    for (i, &b) in span.iter().enumerate() {
        if !charset.allows(b) {
            return Err(ParseError::BadChar {
                column: column + i,
                expected: match charset {
                    Charset::Digits => "a digit".to_owned(),
                    Charset::Alnum => "0-9 or A-Z".to_owned(),
                },
                found: b as char,
            });
        }
        let d = if b.is_ascii_digit() {
            b - b'0'
        } else {
            b - b'A' + 10
        };
        v = v * charset.radix() + u64::from(d);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::test_helpers::{civil, t};
    use super::super::{CivilFields, ParseError, Template};
    use crate::id::format::period::{Reset, Zone};

    #[test]
    fn parse_gives_back_every_field_and_checks_characters() {
        let tpl = t(
            "PO{yyyy}{MM}{dd}{HH}-{node:2}{token:3:alnum}{param:biz:2}{seq:5}{check:mod97}",
            Reset::Hour,
        )
        .unwrap();
        let at = civil("2026-11-01T05:30:00Z", "America/New_York");
        let p = tpl.bind([("biz", "42")]).unwrap();
        let id = tpl.render(&at, 12345, Some(3), Some(46655), &p).unwrap();
        let parsed = tpl.parse_id(&id).unwrap();
        assert_eq!(
            (parsed.year, parsed.month, parsed.day, parsed.hour),
            (Some(2026), Some(11), Some(1), Some(1))
        );
        assert_eq!(
            (parsed.node, parsed.token, parsed.seq),
            (Some(3), Some(46655), 12345)
        );
        assert_eq!(parsed.params, vec![("biz".to_owned(), "42".to_owned())]);
        assert!(parsed.check.is_some());
        assert!(matches!(
            tpl.parse_id("PO"),
            Err(ParseError::WrongLength { .. })
        ));
        // A non-ASCII character is named with its position, never a
        // length that counts bytes on one side and characters on the other.
        let mut accented: Vec<char> = id.chars().collect();
        accented[1] = 'Ö';
        let accented: String = accented.into_iter().collect();
        let err = tpl.parse_id(&accented).unwrap_err();
        assert_eq!(
            err,
            ParseError::NonAscii {
                position: 2,
                found: 'Ö'
            }
        );
        assert!(
            err.to_string()
                .contains("non-ASCII character 'Ö' at position 2"),
            "{err}"
        );
        let short: String = id.chars().skip(1).collect();
        let err = tpl.parse_id(&format!("{short}é")).unwrap_err();
        assert!(
            matches!(err, ParseError::NonAscii { position, .. } if position == id.len()),
            "{err}"
        );
        let bad = id.replacen("PO", "P0", 1);
        assert_eq!(
            tpl.parse_id(&bad),
            Err(ParseError::BadChar {
                column: 2,
                expected: "'O'".into(),
                found: '0'
            })
        );
        let month13 = format!("PO202613{}", &id[8..]);
        assert!(matches!(
            tpl.parse_id(&month13),
            Err(ParseError::BadTime { .. })
        ));
    }

    #[test]
    fn distinct_counters_render_distinct_ids_and_parse_back_property() {
        // A cheap property test over a deterministic pseudo-random walk.
        let tpl = Template::parse(
            "{yy}{ddd}{HH}{node:2}{param:b:2}{seq:6}{check:luhn}",
            Reset::Hour,
            999_999,
            2026,
        )
        .unwrap();
        let zone = Zone::get("Asia/Shanghai").unwrap();
        let p = tpl.bind([("b", "09")]).unwrap();
        let mut seen = HashSet::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let start = "2026-03-01T00:00:00Z"
            .parse::<jiff::Timestamp>()
            .unwrap()
            .as_millisecond();
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let ms = start + (x % (40 * 86_400_000)) as i64;
            let counter = i % 1_000_000;
            let node = x % 100;
            let at = CivilFields::at(ms, &zone).unwrap();
            let id = tpl.render(&at, counter, Some(node), None, &p).unwrap();
            assert_eq!(id.len(), tpl.len());
            let back = tpl.parse_id(&id).unwrap();
            assert_eq!(
                (back.seq, back.node, back.hour),
                (counter, Some(node), Some(at.hour as u8))
            );
            assert_eq!(back.day_of_year, Some(at.day_of_year as u16));
            assert_eq!(back.year, Some(i32::from(at.year)));
            // Every counter is used once, so every ID is new.
            assert!(seen.insert(id.clone()), "{id} repeated");
        }
        assert_eq!(seen.len(), 20_000);
    }
}
