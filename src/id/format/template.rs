//! The template language of formatted IDs: parsing with precise errors,
//! the uniqueness checks, rendering and parsing IDs back.
//!
//! A template is literal text with fields in braces:
//!
//! | field | renders | width |
//! |---|---|---|
//! | `{yyyy}` `{yy}` `{y}` | local year, last 2 or last digit | 4, 2, 1 |
//! | `{MM}` `{dd}` `{ddd}` | month, day of month, day of year | 2, 2, 3 |
//! | `{HH}` `{mm}` `{ss}` | hour (00-23), minute, second | 2 each |
//! | `{unix_s}` | Unix seconds | 10 |
//! | `{node:N}` | the node's id, zero-padded | N (1-5) |
//! | `{token:N:digits\|alnum}` | the node's leased token, base 10 or 36 (0-9A-Z) | N (1-4) |
//! | `{seq:N}` | the counter, zero-padded | N (1-18) |
//! | `{param:NAME:N:digits\|alnum}` | a caller's parameter, exactly N characters | N (1-32) |
//! | `{check:luhn}` `{check:mod97}` | a check digit (Luhn) or two (ISO 7064 MOD 97-10) over what precedes it | 1, 2 |
//!
//! `{{` and `}}` are literal braces; other literals are printable ASCII
//! without spaces. Every ID of a template has the same length.
//!
//! # Why a valid template never repeats an ID
//!
//! Within one period and scope the counter never repeats, and `{seq:N}`
//! prints it injectively. Across periods, the rendered time fields must
//! name the period, so validation asks for the fields down to the reset's
//! granularity: a year (`{yyyy}`, or `{yy}`/`{y}` within a window, below),
//! then `{MM}`, then `{dd}` (or `{ddd}` for both), `{HH}`, `{mm}`, `{ss}`.
//! `{unix_s}` names the second, hence any period. An `N`-second period
//! (cut on local wall time, see [`super::period`]) is named by the
//! fields down to the coarsest unit that divides `N`: a day if 86,400
//! divides N, an hour if 3,600 does, a minute if 60 does, else the second.
//! Per-node counters are told apart by `{node:N}` or `{token:..}`.
//!
//! `{yy}` repeats every 100 years and `{y}` every 10: when the year is
//! named only by them, the format is valid for that window from its origin
//! year (set when it is created) and refuses to render outside it.

use std::fmt;

use thiserror::Error;

use super::period::{PeriodError, Reset, Zone};

/// Longest template output.
pub const MAX_ID_LEN: usize = 128;
/// Widest counter field (`10^18 - 1` fits an i64).
pub const MAX_SEQ_WIDTH: u8 = 18;

const ALNUM: &[u8; 36] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Which characters a token or parameter may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Charset {
    /// `0-9`.
    Digits,
    /// `0-9` and `A-Z` (upper case only: people read these aloud).
    Alnum,
}

impl Charset {
    fn allows(self, b: u8) -> bool {
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
    /// `{param:NAME:N:charset}`.
    Param(String, u8, Charset),
    /// `{check:..}`.
    Check(CheckKind),
}

impl Field {
    fn width(&self) -> usize {
        match self {
            Field::Year4 => 4,
            Field::Year2 | Field::Month | Field::Day | Field::Hour | Field::Minute => 2,
            Field::Second => 2,
            Field::Year1 => 1,
            Field::DayOfYear => 3,
            Field::UnixS => 10,
            Field::Node(n) | Field::Token(n, _) | Field::Seq(n) | Field::Param(_, n, _) => {
                usize::from(*n)
            }
            Field::Check(CheckKind::Luhn) => 1,
            Field::Check(CheckKind::Mod97) => 2,
        }
    }

    fn may_hold_letters(&self) -> bool {
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
            Field::Param(name, n, c) => write!(f, "{{param:{name}:{n}:{}}}", c.name()),
            Field::Check(CheckKind::Luhn) => f.write_str("{check:luhn}"),
            Field::Check(CheckKind::Mod97) => f.write_str("{check:mod97}"),
        }
    }
}

/// Why a template was refused. Columns count characters from 1.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TemplateError {
    /// Nothing to render.
    #[error("the template is empty; write e.g. {{yyyy}}{{MM}}{{dd}}{{seq:6}}")]
    Empty,
    /// A `{` without its `}`.
    #[error("column {column}: '{{' is not closed; close the field with '}}' or write '{{{{' for a literal brace")]
    Unclosed {
        /// Where the field starts.
        column: usize,
    },
    /// A `}` outside a field.
    #[error("column {column}: stray '}}'; write '}}}}' for a literal brace")]
    StrayClose {
        /// Where.
        column: usize,
    },
    /// A literal character that IDs may not hold.
    #[error("column {column}: character {ch:?} is not allowed in an ID; literals are printable ASCII without spaces")]
    BadLiteral {
        /// Where.
        column: usize,
        /// The character.
        ch: char,
    },
    /// A field name that does not exist.
    #[error("column {column}: unknown field {{{field}}}; use yyyy yy y MM dd ddd HH mm ss unix_s node:N token:N:digits|alnum seq:N param:NAME:N:digits|alnum check:luhn|mod97")]
    UnknownField {
        /// Where.
        column: usize,
        /// What was written between the braces.
        field: String,
    },
    /// A width that is not a number in range.
    #[error("column {column}: {field} width {width:?} is out of range; use {min} to {max}")]
    BadWidth {
        /// Where.
        column: usize,
        /// Which field (`node`, `token`, `seq`, `param`).
        field: &'static str,
        /// What was written.
        width: String,
        /// Smallest width.
        min: u8,
        /// Largest width.
        max: u8,
    },
    /// A charset other than `digits` or `alnum`.
    #[error("column {column}: charset {got:?} is unknown; use digits or alnum")]
    BadCharset {
        /// Where.
        column: usize,
        /// What was written.
        got: String,
    },
    /// A malformed parameter name.
    #[error("column {column}: parameter name {name:?} is malformed; use 1 to 32 characters of a-z 0-9 _")]
    BadParamName {
        /// Where.
        column: usize,
        /// The name.
        name: String,
    },
    /// A field that may appear once appears again.
    #[error("column {column}: {field} appears twice; a template has one {field}")]
    Repeated {
        /// Where the second one is.
        column: usize,
        /// Which field.
        field: String,
    },
    /// A check digit followed by a field.
    #[error("column {column}: {field} comes after the check digit; the check digit must be the last field (literals may follow)")]
    CheckNotLast {
        /// Where the field is.
        column: usize,
        /// Which field.
        field: String,
    },
    /// Luhn over a field that may hold letters.
    #[error("column {column}: {{check:luhn}} works on digits only, but {field} can hold letters; use {{check:mod97}} or a digits charset")]
    LuhnNeedsDigits {
        /// Where the lettered field is.
        column: usize,
        /// Which field.
        field: String,
    },
    /// No counter.
    #[error("the template has no counter; add {{seq:N}} (IDs in one period differ only by it)")]
    MissingSeq,
    /// Longer than [`MAX_ID_LEN`].
    #[error("IDs of this template are {len} characters long; at most {max}")]
    TooLong {
        /// The length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The time fields do not name the reset period, so IDs could repeat.
    #[error("reset {reset} needs the period in the ID, or IDs repeat once the counter restarts: the template is missing {missing}{also}")]
    MissingTimeField {
        /// The reset period.
        reset: Reset,
        /// The first missing field.
        missing: &'static str,
        /// Further advice.
        also: &'static str,
    },
    /// `reset = "<N>s"` with a month or year as finest field.
    #[error("reset {reset}: months and years have no fixed length, so {reset} periods cannot be named by them; add {{dd}} (with 86400 dividing N), finer fields, or {{unix_s}}")]
    PeriodNotNameable {
        /// The reset.
        reset: Reset,
    },
    /// The counter's maximum needs more digits than `{seq:N}` has.
    #[error("counter max {max} does not fit {{seq:{width}}} (at most {limit}); lower max or widen the field")]
    CounterTooWide {
        /// The counter's maximum.
        max: u64,
        /// The field's width.
        width: u8,
        /// The largest value the field holds.
        limit: u64,
    },
}

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

/// A template part: literal text or a field, with the column it starts at.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Field(Field),
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

/// A validated template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<(usize, Part)>,
    len: usize,
    seq_width: u8,
    year_window: Option<(i32, i32, &'static str)>,
    digits_only: bool,
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

fn tokenize(source: &str) -> Result<Vec<(usize, Part)>, TemplateError> {
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

/// What one pass over a template's parts finds: its time fields, counter
/// width, whether every character is a digit, and its length.
#[derive(Default)]
struct Layout {
    time: TimeFields,
    seq_width: Option<u8>,
    digits_only: bool,
    len: usize,
}

impl Layout {
    /// Walks the parts in order, checking that no field follows the check
    /// digits, that no field repeats and that Luhn check digits follow only
    /// digit fields.
    fn scan(parts: &[(usize, Part)]) -> Result<Layout, TemplateError> {
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
            Field::Seq(w) => self.seq_width = Some(*w),
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
        Field::Node(_) | Field::Token(..) | Field::Seq(_) | Field::Check(_) => {
            let s = field.to_string();
            s.split(':').next().unwrap_or("").to_owned() + "}"
        }
        other => other.to_string(),
    }
}

/// Checks that a counter of `seq_width` digits holds `counter_max`.
fn check_counter_width(counter_max: u64, seq_width: u8) -> Result<(), TemplateError> {
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
fn reset_unit(reset: Reset, t: &TimeFields) -> Result<Option<u8>, TemplateError> {
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
fn check_period_fields(
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
fn year_window(
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
struct TimeFields {
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

impl Template {
    /// Parses and checks `source` for a format that resets every `reset`
    /// with counter maximum `counter_max`. `origin_year` is the local year
    /// the format was created in; it starts the window of a template whose
    /// year is only `{yy}` or `{y}`.
    pub fn parse(
        source: &str,
        reset: Reset,
        counter_max: u64,
        origin_year: i32,
    ) -> Result<Template, TemplateError> {
        if source.is_empty() {
            return Err(TemplateError::Empty);
        }
        let parts = tokenize(source)?;
        let layout = Layout::scan(&parts)?;
        let Layout {
            time: t,
            seq_width,
            digits_only,
            len,
        } = layout;
        if len > MAX_ID_LEN {
            return Err(TemplateError::TooLong {
                len,
                max: MAX_ID_LEN,
            });
        }
        let seq_width = seq_width.ok_or(TemplateError::MissingSeq)?;
        check_counter_width(counter_max, seq_width)?;
        let unit = reset_unit(reset, &t)?;
        check_period_fields(reset, unit, &t)?;
        let year_window = year_window(unit, &t, origin_year);
        Ok(Template {
            source: source.to_owned(),
            parts,
            len,
            seq_width,
            year_window,
            digits_only,
        })
    }

    /// The template as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The length of every ID.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a template renders at least its counter.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The counter's width.
    pub fn seq_width(&self) -> u8 {
        self.seq_width
    }

    /// Whether IDs carry the node or a token, so counters are per node.
    pub fn per_node(&self) -> bool {
        self.fields()
            .any(|f| matches!(f, Field::Node(_) | Field::Token(..)))
    }

    /// The `{token:N:charset}` field's width and charset, if any (a
    /// template has at most one).
    pub fn token(&self) -> Option<(u8, Charset)> {
        self.fields().find_map(|f| match f {
            Field::Token(w, c) => Some((*w, *c)),
            _ => None,
        })
    }

    /// Whether every ID is all digits and at most 19 long, so it may be
    /// returned as a number too ([`Template::to_u64`] then says whether a
    /// given ID is below 2^63; with 18 digits or fewer it always is).
    pub fn numeric(&self) -> bool {
        self.digits_only && self.len <= 19
    }

    /// The years the template names uniquely, when its year is only
    /// `{yy}` or `{y}`: `(first, last)`.
    pub fn year_window(&self) -> Option<(i32, i32)> {
        self.year_window.map(|(a, b, _)| (a, b))
    }

    /// The template's fields, in order.
    pub fn fields(&self) -> impl Iterator<Item = &Field> {
        self.parts.iter().filter_map(|(_, p)| match p {
            Part::Field(f) => Some(f),
            Part::Lit(_) => None,
        })
    }

    /// The `{param}` fields: name, width, charset.
    pub fn params(&self) -> impl Iterator<Item = (&str, u8, Charset)> {
        self.fields().filter_map(|f| match f {
            Field::Param(n, w, c) => Some((n.as_str(), *w, *c)),
            _ => None,
        })
    }

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
    /// without a caller, such as [`super::Format::check_node`].
    pub fn placeholder_params(&self) -> BoundParams {
        BoundParams(
            self.params()
                .map(|(_, w, _)| "0".repeat(usize::from(w)))
                .collect(),
        )
    }

    /// Renders one ID into `out` (cleared first).
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
                Field::Seq(w) => {
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
        Field::Seq(_) => out.seq = num(Charset::Digits)?,
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

fn push_num(out: &mut String, v: u64, width: usize) {
    let mut buf = [b'0'; 20];
    let mut i = buf.len();
    let mut v = v;
    while v > 0 {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    let start = buf.len() - width.max(buf.len() - i);
    for &b in &buf[start..] {
        out.push(b as char);
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

/// The check digits of `payload` (what precedes the check field). Luhn
/// reads its digits; MOD 97-10 its digits and upper-case letters; other
/// literal characters are skipped.
pub fn check_digits(kind: CheckKind, payload: &[u8]) -> String {
    let (value, width) = check_value(kind, payload);
    let mut out = String::with_capacity(2);
    push_num(&mut out, value, width);
    out
}

/// The check digits of `payload` as a number, and how many digits.
fn check_value(kind: CheckKind, payload: &[u8]) -> (u64, usize) {
    match kind {
        CheckKind::Luhn => {
            let mut sum = 0u64;
            let digits = payload.iter().rev().filter(|b| b.is_ascii_digit());
            for (i, b) in digits.enumerate() {
                let mut d = u64::from(b - b'0');
                if i % 2 == 0 {
                    d *= 2;
                    if d > 9 {
                        d -= 9;
                    }
                }
                sum += d;
            }
            ((10 - sum % 10) % 10, 1)
        }
        CheckKind::Mod97 => {
            // Reduce only when the accumulator nears overflow: below 2^56,
            // r * 100 + 35 still fits, and divisions are the cost here.
            let mut r: u64 = 0;
            for &b in payload {
                if b.is_ascii_digit() {
                    r = r * 10 + u64::from(b - b'0');
                } else if b.is_ascii_uppercase() {
                    r = r * 100 + u64::from(b - b'A' + 10);
                } else {
                    continue;
                }
                if r >= 1 << 56 {
                    r %= 97;
                }
            }
            (98 - (r % 97 * 100) % 97, 2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn t(src: &str, reset: Reset) -> Result<Template, TemplateError> {
        Template::parse(src, reset, 0, 2026)
    }

    fn civil(s: &str, zone: &str) -> CivilFields {
        let ms = s.parse::<jiff::Timestamp>().unwrap().as_millisecond();
        CivilFields::at(ms, &Zone::get(zone).unwrap()).unwrap()
    }

    fn none() -> BoundParams {
        BoundParams::default()
    }

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
    fn doubled_braces_render_as_literal_braces() {
        let tpl = t("{{{yyyy}{MM}{dd}}}{seq:2}", Reset::Day).unwrap();
        let at = civil("2026-11-23T01:00:00Z", "UTC");
        assert_eq!(
            tpl.render(&at, 5, None, None, &none()).unwrap(),
            "{20261123}05"
        );
    }

    /// Asserts that each source is refused (never resetting) with exactly
    /// its error, and that every message says where or what.
    fn assert_refused(cases: &[(&str, TemplateError)]) {
        for (src, want) in cases {
            assert_eq!(t(src, Reset::Never).as_ref(), Err(want), "{src}");
            // Every message says where or what.
            let msg = want.to_string();
            assert!(!msg.is_empty());
        }
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

    #[test]
    fn check_digits_are_the_standard_ones() {
        // Luhn: 7992739871 -> 3; MOD 97-10: IBAN GB82 WEST 1234 5698 7654 32
        // rearranged is WEST12345698765432GB00 -> 82.
        // The lazily reduced MOD 97 agrees with reducing at every step, on
        // long payloads of digits and letters.
        let naive = |p: &[u8]| {
            let mut r = 0u64;
            for &b in p {
                if b.is_ascii_digit() {
                    r = (r * 10 + u64::from(b - b'0')) % 97;
                } else if b.is_ascii_uppercase() {
                    r = (r * 100 + u64::from(b - b'A' + 10)) % 97;
                }
            }
            format!("{:02}", 98 - (r * 100) % 97)
        };
        let mut x: u64 = 12345;
        for len in 1..120 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let p: Vec<u8> = (0..len)
                .map(|i| ALNUM[((x >> (i % 50)) % 36) as usize])
                .collect();
            assert_eq!(check_digits(CheckKind::Mod97, &p), naive(&p), "{len}");
        }
        assert_eq!(check_digits(CheckKind::Luhn, b"7992739871"), "3");
        assert_eq!(check_digits(CheckKind::Luhn, b"7992-739871"), "3");
        assert_eq!(
            check_digits(CheckKind::Mod97, b"WEST12345698765432GB"),
            "82"
        );
        let tpl = t("{yyyy}{MM}{dd}{seq:4}{check:luhn}", Reset::Day).unwrap();
        let at = civil("2026-11-23T10:00:00Z", "UTC");
        let id = tpl.render(&at, 17, None, None, &none()).unwrap();
        assert_eq!(
            id,
            format!(
                "202611230017{}",
                check_digits(CheckKind::Luhn, b"202611230017")
            )
        );
        // Every single-digit typo is caught.
        for i in 0..id.len() - 1 {
            let mut typo = id.clone().into_bytes();
            typo[i] = if typo[i] == b'9' { b'0' } else { typo[i] + 1 };
            let typo = String::from_utf8(typo).unwrap();
            assert!(
                matches!(
                    tpl.parse_id(&typo),
                    Err(ParseError::CheckMismatch { .. }) | Err(ParseError::BadTime { .. })
                ),
                "{typo}"
            );
        }
    }

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
