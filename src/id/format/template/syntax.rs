//! A template's text read into its parts: literals and fields, with the
//! column of every fault.

use std::fmt;

use super::{TemplateError, MAX_SEQ_WIDTH, MIN_HIDDEN_SEQ_WIDTH};

/// Which characters a token or parameter may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Charset {
    /// `0-9`.
    Digits,
    /// `0-9` and `A-Z` (upper case only: people read these aloud).
    Alnum,
}

impl Charset {
    pub(super) fn allows(self, b: u8) -> bool {
        match self {
            Charset::Digits => b.is_ascii_digit(),
            Charset::Alnum => b.is_ascii_digit() || b.is_ascii_uppercase(),
        }
    }

    /// How many symbols (10 or 36).
    pub fn radix(self) -> u64 {
        match self {
            Charset::Digits => 10,
            Charset::Alnum => 36,
        }
    }

    /// The name templates use (`digits`, `alnum`).
    pub fn name(self) -> &'static str {
        match self {
            Charset::Digits => "digits",
            Charset::Alnum => "alnum",
        }
    }
}

/// Which check digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckKind {
    /// One Luhn digit over the digits before it (all must be digits).
    Luhn,
    /// Two digits, ISO 7064 MOD 97-10 (as in IBAN), over the digits and
    /// letters before it (A = 10 ... Z = 35).
    Mod97,
}

/// One field of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// `{yyyy}`.
    Year4,
    /// `{yy}`.
    Year2,
    /// `{y}`.
    Year1,
    /// `{MM}`.
    Month,
    /// `{dd}`.
    Day,
    /// `{ddd}`: day of the year, 001-366.
    DayOfYear,
    /// `{HH}`.
    Hour,
    /// `{mm}`.
    Minute,
    /// `{ss}`.
    Second,
    /// `{unix_s}`.
    UnixS,
    /// `{node:N}`.
    Node(u8),
    /// `{token:N:charset}`.
    Token(u8, Charset),
    /// `{seq:N}`.
    Seq(u8),
    /// `{seq:N:hidden}`: the counter shown through a keyed permutation of
    /// its N - 1 low digits, led by one digit of key version (see
    /// [`crate::id::hide`]); N - 1 must be at least 6 (FF1's 10^6 minimum).
    HiddenSeq(u8),
    /// `{param:NAME:N:charset}`.
    Param(String, u8, Charset),
    /// `{check:..}`.
    Check(CheckKind),
}

impl Field {
    pub(super) fn width(&self) -> usize {
        match self {
            Field::Year4 => 4,
            Field::Year2 | Field::Month | Field::Day | Field::Hour | Field::Minute => 2,
            Field::Second => 2,
            Field::Year1 => 1,
            Field::DayOfYear => 3,
            Field::UnixS => 10,
            Field::Node(n)
            | Field::Token(n, _)
            | Field::Seq(n)
            | Field::HiddenSeq(n)
            | Field::Param(_, n, _) => usize::from(*n),
            Field::Check(CheckKind::Luhn) => 1,
            Field::Check(CheckKind::Mod97) => 2,
        }
    }

    pub(super) fn may_hold_letters(&self) -> bool {
        matches!(
            self,
            Field::Token(_, Charset::Alnum) | Field::Param(_, _, Charset::Alnum)
        )
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Year4 => f.write_str("{yyyy}"),
            Field::Year2 => f.write_str("{yy}"),
            Field::Year1 => f.write_str("{y}"),
            Field::Month => f.write_str("{MM}"),
            Field::Day => f.write_str("{dd}"),
            Field::DayOfYear => f.write_str("{ddd}"),
            Field::Hour => f.write_str("{HH}"),
            Field::Minute => f.write_str("{mm}"),
            Field::Second => f.write_str("{ss}"),
            Field::UnixS => f.write_str("{unix_s}"),
            Field::Node(n) => write!(f, "{{node:{n}}}"),
            Field::Token(n, c) => write!(f, "{{token:{n}:{}}}", c.name()),
            Field::Seq(n) => write!(f, "{{seq:{n}}}"),
            Field::HiddenSeq(n) => write!(f, "{{seq:{n}:hidden}}"),
            Field::Param(name, n, c) => write!(f, "{{param:{name}:{n}:{}}}", c.name()),
            Field::Check(CheckKind::Luhn) => f.write_str("{check:luhn}"),
            Field::Check(CheckKind::Mod97) => f.write_str("{check:mod97}"),
        }
    }
}

/// A template part: literal text or a field, with the column it starts at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Part {
    Lit(String),
    Field(Field),
}

fn parse_width(
    column: usize,
    field: &'static str,
    s: Option<&str>,
    min: u8,
    max: u8,
) -> Result<u8, TemplateError> {
    let text = s.unwrap_or("");
    text.parse::<u8>()
        .ok()
        .filter(|w| (min..=max).contains(w) && !text.starts_with('+'))
        .ok_or_else(|| TemplateError::BadWidth {
            column,
            field,
            width: text.chars().take(20).collect(),
            min,
            max,
        })
}

fn parse_charset(column: usize, s: Option<&str>) -> Result<Charset, TemplateError> {
    match s {
        None | Some("digits") => Ok(Charset::Digits),
        Some("alnum") => Ok(Charset::Alnum),
        Some(other) => Err(TemplateError::BadCharset {
            column,
            got: other.chars().take(20).collect(),
        }),
    }
}

fn valid_param_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn parse_field(column: usize, body: &str) -> Result<Field, TemplateError> {
    let unknown = || TemplateError::UnknownField {
        column,
        field: body.chars().take(40).collect(),
    };
    let mut it = body.split(':');
    let head = it.next().unwrap_or("");
    let args: Vec<&str> = it.collect();
    let simple = |f: Field| {
        if args.is_empty() {
            Ok(f)
        } else {
            Err(unknown())
        }
    };
    match head {
        "yyyy" => simple(Field::Year4),
        "yy" => simple(Field::Year2),
        "y" => simple(Field::Year1),
        "MM" => simple(Field::Month),
        "dd" => simple(Field::Day),
        "ddd" => simple(Field::DayOfYear),
        "HH" => simple(Field::Hour),
        "mm" => simple(Field::Minute),
        "ss" => simple(Field::Second),
        "unix_s" => simple(Field::UnixS),
        "node" if args.len() == 1 => Ok(Field::Node(parse_width(
            column,
            "node",
            args.first().copied(),
            1,
            5,
        )?)),
        "token" if (1..=2).contains(&args.len()) => Ok(Field::Token(
            parse_width(column, "token", args.first().copied(), 1, 4)?,
            parse_charset(column, args.get(1).copied())?,
        )),
        "seq" if args.len() == 1 => Ok(Field::Seq(parse_width(
            column,
            "seq",
            args.first().copied(),
            1,
            MAX_SEQ_WIDTH,
        )?)),
        "seq" if args.get(1) == Some(&"hidden") && args.len() == 2 => {
            Ok(Field::HiddenSeq(parse_width(
                column,
                "hidden seq (one key-version digit + at least 6 permuted digits, FF1's 10^6 minimum)",
                args.first().copied(),
                MIN_HIDDEN_SEQ_WIDTH,
                MAX_SEQ_WIDTH,
            )?))
        }
        "param" if (2..=3).contains(&args.len()) => {
            let name = args[0];
            if !valid_param_name(name) {
                return Err(TemplateError::BadParamName {
                    column,
                    name: name.chars().take(40).collect(),
                });
            }
            Ok(Field::Param(
                name.to_owned(),
                parse_width(column, "param", args.get(1).copied(), 1, 32)?,
                parse_charset(column, args.get(2).copied())?,
            ))
        }
        "check" => match args.as_slice() {
            ["luhn"] => Ok(Field::Check(CheckKind::Luhn)),
            ["mod97"] => Ok(Field::Check(CheckKind::Mod97)),
            _ => Err(unknown()),
        },
        _ => Err(unknown()),
    }
}

pub(super) fn tokenize(source: &str) -> Result<Vec<(usize, Part)>, TemplateError> {
    let chars: Vec<char> = source.chars().collect();
    let mut parts = Vec::new();
    let mut lit = String::new();
    let mut lit_col = 1;
    let mut i = 0;
    while i < chars.len() {
        let column = i + 1;
        match chars[i] {
            '{' if chars.get(i + 1) == Some(&'{') => {
                if lit.is_empty() {
                    lit_col = column;
                }
                lit.push('{');
                i += 2;
            }
            '}' if chars.get(i + 1) == Some(&'}') => {
                if lit.is_empty() {
                    lit_col = column;
                }
                lit.push('}');
                i += 2;
            }
            '}' => return Err(TemplateError::StrayClose { column }),
            '{' => {
                let close = chars[i + 1..]
                    .iter()
                    .position(|c| *c == '}')
                    .ok_or(TemplateError::Unclosed { column })?;
                let body: String = chars[i + 1..i + 1 + close].iter().collect();
                if body.contains('{') {
                    return Err(TemplateError::Unclosed { column });
                }
                if !lit.is_empty() {
                    parts.push((lit_col, Part::Lit(std::mem::take(&mut lit))));
                }
                parts.push((column, Part::Field(parse_field(column, &body)?)));
                i += close + 2;
            }
            ch if ch.is_ascii_graphic() => {
                if lit.is_empty() {
                    lit_col = column;
                }
                lit.push(ch);
                i += 1;
            }
            ch => return Err(TemplateError::BadLiteral { column, ch }),
        }
    }
    if !lit.is_empty() {
        parts.push((lit_col, Part::Lit(lit)));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::super::test_helpers::{assert_refused, civil, none, t};
    use super::super::TemplateError;
    use crate::id::format::period::Reset;

    #[test]
    fn doubled_braces_render_as_literal_braces() {
        let tpl = t("{{{yyyy}{MM}{dd}}}{seq:2}", Reset::Day).unwrap();
        let at = civil("2026-11-23T01:00:00Z", "UTC");
        assert_eq!(
            tpl.render(&at, 5, None, None, &none()).unwrap(),
            "{20261123}05"
        );
    }

    #[test]
    fn malformed_syntax_is_refused_with_the_column_of_the_fault() {
        assert_refused(&[
            ("", TemplateError::Empty),
            ("AB{seq:2", TemplateError::Unclosed { column: 3 }),
            ("AB}{seq:2}", TemplateError::StrayClose { column: 3 }),
            (
                "A B{seq:2}",
                TemplateError::BadLiteral { column: 2, ch: ' ' },
            ),
            (
                "{seq:2}é",
                TemplateError::BadLiteral {
                    column: 8, ch: 'é'
                },
            ),
            (
                "x{week}{seq:2}",
                TemplateError::UnknownField {
                    column: 2,
                    field: "week".into(),
                },
            ),
        ]);
    }

    #[test]
    fn bad_field_arguments_are_refused_with_the_column_of_the_field() {
        assert_refused(&[
            (
                "{seq:0}",
                TemplateError::BadWidth {
                    column: 1,
                    field: "seq",
                    width: "0".into(),
                    min: 1,
                    max: 18,
                },
            ),
            (
                "{seq:2}{node:6}",
                TemplateError::BadWidth {
                    column: 8,
                    field: "node",
                    width: "6".into(),
                    min: 1,
                    max: 5,
                },
            ),
            (
                "{seq:2}{token:2:hex}",
                TemplateError::BadCharset {
                    column: 8,
                    got: "hex".into(),
                },
            ),
            (
                "{seq:2}{param:Biz:2}",
                TemplateError::BadParamName {
                    column: 8,
                    name: "Biz".into(),
                },
            ),
        ]);
    }
}
