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
//!
//! The parts: [`syntax`] reads a template's text into fields, [`rules`]
//! checks they name every period and fit the counter, [`render`] turns a
//! counter into an ID, [`parse`] reads an ID back, [`check_digit`]
//! computes Luhn and MOD 97-10 digits.

pub mod check_digit;
pub mod parse;
pub mod render;
pub mod rules;
pub mod syntax;

use thiserror::Error;

use super::period::Reset;
use rules::{check_counter_width, check_period_fields, reset_unit, year_window, Layout};
use syntax::{tokenize, Part};

pub use check_digit::check_digits;
pub use parse::{ParseError, ParsedId};
pub use render::{BoundParams, CivilFields, RenderError};
pub use syntax::{Charset, CheckKind, Field};

/// Longest template output.
pub const MAX_ID_LEN: usize = 128;
/// Widest counter field (`10^18 - 1` fits an i64).
pub const MAX_SEQ_WIDTH: u8 = 18;
/// Narrowest `{seq:N:hidden}`: one key-version digit and six permuted
/// digits (FF1 refuses domains below 10^6, NIST SP 800-38G rev. 1).
pub const MIN_HIDDEN_SEQ_WIDTH: u8 = 7;

const ALNUM: &[u8; 36] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";

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
    #[error("column {column}: unknown field {{{field}}}; use yyyy yy y MM dd ddd HH mm ss unix_s node:N token:N:digits|alnum seq:N seq:N:hidden param:NAME:N:digits|alnum check:luhn|mod97")]
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

/// Turns every `{seq:N}` into `{seq:N:hidden}` (a format's `hide =
/// true`), refusing a counter too narrow for FF1.
fn hide_every_seq(parts: &mut [(usize, Part)]) -> Result<(), TemplateError> {
    for (column, part) in parts.iter_mut() {
        if let Part::Field(Field::Seq(width)) = part {
            if *width < MIN_HIDDEN_SEQ_WIDTH {
                return Err(TemplateError::BadWidth {
                    column: *column,
                    field: "seq under hide = true (one key-version digit + at least 6 permuted digits, FF1's 10^6 minimum; widen it or drop hide)",
                    width: width.to_string(),
                    min: MIN_HIDDEN_SEQ_WIDTH,
                    max: MAX_SEQ_WIDTH,
                });
            }
            *part = Part::Field(Field::HiddenSeq(*width));
        }
    }
    Ok(())
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
        Self::parse_hiding(source, reset, counter_max, origin_year, false)
    }

    /// [`Template::parse`], with every `{seq:N}` read as `{seq:N:hidden}`
    /// when `hide_all` (a format's `hide = true`); a counter narrower than
    /// [`MIN_HIDDEN_SEQ_WIDTH`] is then refused, naming its column.
    pub fn parse_hiding(
        source: &str,
        reset: Reset,
        counter_max: u64,
        origin_year: i32,
        hide_all: bool,
    ) -> Result<Template, TemplateError> {
        if source.is_empty() {
            return Err(TemplateError::Empty);
        }
        let mut parts = tokenize(source)?;
        if hide_all {
            hide_every_seq(&mut parts)?;
        }
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
        let hidden = parts
            .iter()
            .any(|(_, p)| matches!(p, Part::Field(Field::HiddenSeq(_))));
        // A hidden counter's first digit is the key version.
        check_counter_width(counter_max, seq_width - u8::from(hidden))?;
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

    /// Whether the counter is `{seq:N:hidden}`: the engine shows it
    /// through a keyed permutation before rendering.
    pub fn hidden_seq(&self) -> bool {
        self.fields().any(|f| matches!(f, Field::HiddenSeq(_)))
    }

    /// The largest counter value the template can show: `10^N - 1`, or
    /// `10^(N-1) - 1` for a hidden counter (its first digit is the key
    /// version).
    pub fn seq_max(&self) -> u64 {
        let digits = match self.hidden_seq() {
            true => self.seq_width.saturating_sub(1),
            false => self.seq_width,
        };
        10u64.pow(u32::from(digits)) - 1
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
}

/// Helpers the tests of every part share.
#[cfg(test)]
mod test_helpers {
    use super::*;
    use crate::id::format::period::Zone;

    pub(super) fn t(src: &str, reset: Reset) -> Result<Template, TemplateError> {
        Template::parse(src, reset, 0, 2026)
    }

    pub(super) fn civil(s: &str, zone: &str) -> CivilFields {
        let ms = s.parse::<jiff::Timestamp>().unwrap().as_millisecond();
        CivilFields::at(ms, &Zone::get(zone).unwrap()).unwrap()
    }

    pub(super) fn none() -> BoundParams {
        BoundParams::default()
    }

    /// Asserts that each source is refused (never resetting) with exactly
    /// its error, and that every message says where or what.
    pub(super) fn assert_refused(cases: &[(&str, TemplateError)]) {
        for (src, want) in cases {
            assert_eq!(t(src, Reset::Never).as_ref(), Err(want), "{src}");
            // Every message says where or what.
            let msg = want.to_string();
            assert!(!msg.is_empty());
        }
    }
}

#[cfg(test)]
mod hidden_tests {
    use super::test_helpers::t;
    use super::*;

    #[test]
    fn hidden_seq_needs_six_permuted_digits() {
        // Seven digits: one key-version digit and 10^6 permuted values.
        let ok = t("ORD{seq:7:hidden}", Reset::Never).unwrap();
        assert!(ok.hidden_seq());
        assert_eq!(ok.seq_width(), 7);
        assert_eq!(ok.seq_max(), 999_999);
        assert_eq!(ok.len(), 10);
        assert_eq!(ok.source(), "ORD{seq:7:hidden}");
        // Six digits leave 10^5 permuted values: below FF1's minimum.
        let err = t("ORD{seq:6:hidden}", Reset::Never).unwrap_err();
        assert!(
            matches!(err, TemplateError::BadWidth { min: 7, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("10^6"), "{err}");
        // A plain counter is not hidden and keeps its whole width.
        let plain = t("ORD{seq:7}", Reset::Never).unwrap();
        assert!(!plain.hidden_seq());
        assert_eq!(plain.seq_max(), 9_999_999);
        // A max that needs the version digit is refused.
        let wide = Template::parse("{seq:7:hidden}", Reset::Never, 1_000_000, 2026);
        assert!(
            matches!(wide, Err(TemplateError::CounterTooWide { .. })),
            "{wide:?}"
        );
        // Anything but `hidden` after the width is unknown.
        assert!(matches!(
            t("{seq:7:secret}", Reset::Never),
            Err(TemplateError::UnknownField { .. })
        ));
    }
}
