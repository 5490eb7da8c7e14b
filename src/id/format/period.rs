//! Reset periods on the zone's civil (wall-clock) timeline, and the rule
//! that a format's period never goes back.
//!
//! A formatted ID renders *civil* time fields (`{yyyy}{MM}{dd}` in, say,
//! Asia/Shanghai), so periods are cut on the same civil timeline: a "day"
//! is a local calendar day, `N` seconds are `N` seconds of local wall time
//! counted from local midnight of 1970-01-01. That is what makes a period a
//! function of the rendered fields, which uniqueness rests on. Two
//! consequences, both handled here:
//!
//! - On a DST fall-back day the repeated local hour belongs to one period
//!   (both 01:30 EDT and 01:30 EST render `01`), so an hourly counter runs
//!   on through the repeat instead of restarting and repeating itself.
//! - Civil time can go back (a DST fall-back across an `N`-second boundary,
//!   or the wall clock stepped back by an operator or NTP). The period never
//!   does: [`decide`] keeps the stored later period and says at which
//!   instant to render, an instant *inside* that period, so every rendered
//!   field still names the period whose counter is in use.
//!
//! A [`PeriodKey`] is the period's civil start, in seconds of local wall
//! time since 1970-01-01T00:00 local: ordered like the periods.

use std::fmt;
use std::str::FromStr;

use jiff::civil::DateTime;
use jiff::tz::{Offset, TimeZone};
use jiff::{Timestamp, ToSpan};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Longest `N`-second period: a leap year of seconds.
pub const MAX_RESET_SECONDS: u64 = 366 * 86_400;

/// When a format's counter starts again at its minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reset {
    /// Never: one period for the format's whole life.
    Never,
    /// At the start of every local hour.
    Hour,
    /// At local midnight.
    Day,
    /// At local midnight of the first of the month.
    Month,
    /// At local midnight of January 1st.
    Year,
    /// Every `N` seconds of local wall time, counted from local midnight
    /// of 1970-01-01 (so a divisor of 86,400 cuts each day the same way).
    Seconds(u64),
}

impl Reset {
    /// Checks an `N`-second period (1 to [`MAX_RESET_SECONDS`]).
    pub fn seconds(n: u64) -> Result<Reset, PeriodError> {
        if (1..=MAX_RESET_SECONDS).contains(&n) {
            Ok(Reset::Seconds(n))
        } else {
            Err(PeriodError::BadReset(n.to_string()))
        }
    }
}

impl fmt::Display for Reset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reset::Never => f.write_str("never"),
            Reset::Hour => f.write_str("hour"),
            Reset::Day => f.write_str("day"),
            Reset::Month => f.write_str("month"),
            Reset::Year => f.write_str("year"),
            Reset::Seconds(n) => write!(f, "{n}s"),
        }
    }
}

impl FromStr for Reset {
    type Err = PeriodError;

    /// `never`, `hour`, `day`, `month`, `year`, or `<N>s` (e.g. `900s`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "never" => Ok(Reset::Never),
            "hour" => Ok(Reset::Hour),
            "day" => Ok(Reset::Day),
            "month" => Ok(Reset::Month),
            "year" => Ok(Reset::Year),
            other => other
                .strip_suffix('s')
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| PeriodError::BadReset(other.chars().take(40).collect()))
                .and_then(Reset::seconds),
        }
    }
}

impl Serialize for Reset {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Reset {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What is wrong with a zone, a reset period or a time.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PeriodError {
    /// Not an IANA zone name known to the bundled tz database.
    #[error(
        "unknown time zone {0:?}; use an IANA name such as Asia/Shanghai, America/New_York or UTC"
    )]
    UnknownZone(String),
    /// Not a reset period.
    #[error("reset {0:?} is not a period; use never, hour, day, month, year, or N seconds as \"<N>s\" with N from 1 to 31622400")]
    BadReset(String),
    /// A time outside what the calendar code handles (years -9999..9999).
    #[error("time {0} ms since 1970 is out of range")]
    TimeOutOfRange(i128),
}

/// A validated IANA time zone, from the tz database bundled in the binary
/// (no system tzdata is read, so every node cuts periods the same way).
#[derive(Debug, Clone)]
pub struct Zone {
    name: String,
    tz: TimeZone,
}

impl Zone {
    /// Looks `name` up in the bundled tz database.
    pub fn get(name: &str) -> Result<Zone, PeriodError> {
        let tz = jiff::tz::db()
            .get(name)
            .map_err(|_| PeriodError::UnknownZone(name.chars().take(80).collect()))?;
        Ok(Zone {
            name: name.to_owned(),
            tz,
        })
    }

    /// UTC.
    pub fn utc() -> Zone {
        Zone {
            name: "UTC".to_owned(),
            tz: TimeZone::UTC,
        }
    }

    /// The zone's name as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The local wall-clock time at `ms` (Unix milliseconds).
    pub fn civil(&self, ms: i64) -> Result<DateTime, PeriodError> {
        let ts =
            Timestamp::from_millisecond(ms).map_err(|_| PeriodError::TimeOutOfRange(ms.into()))?;
        Ok(self.tz.to_datetime(ts))
    }

    /// The instants (Unix ms) at which the zone's offset changes (DST
    /// starts or ends, or the zone's rules change) after `from_ms`, at most
    /// `limit` of them and none at or after `until_ms`.
    pub fn transitions(&self, from_ms: i64, until_ms: i64, limit: usize) -> Vec<i64> {
        let Ok(from) = Timestamp::from_millisecond(from_ms) else {
            return Vec::new();
        };
        self.tz
            .following(from)
            .map(|t| t.timestamp().as_millisecond())
            .take_while(|ms| *ms < until_ms)
            .take(limit)
            .collect()
    }

    /// The first instant (Unix ms) whose wall-clock time is at or after
    /// `dt`: `dt` itself, or the end of the DST gap `dt` falls in; for a
    /// time that occurs twice, the first occurrence.
    pub fn first_instant_at_or_after(&self, dt: DateTime) -> Result<i64, PeriodError> {
        self.tz
            .to_ambiguous_timestamp(dt)
            .compatible()
            .map(Timestamp::as_millisecond)
            .map_err(|_| PeriodError::TimeOutOfRange(0))
    }
}

impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Zone {}

/// A period: its civil start, in seconds of local wall time since
/// 1970-01-01T00:00 local. Later periods have larger keys. Stored with a
/// format's counter record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PeriodKey(pub i64);

impl PeriodKey {
    /// The single period of a format that never resets.
    pub const FOREVER: PeriodKey = PeriodKey(i64::MIN);

    /// The period's civil start (local wall time).
    pub fn civil_start(self) -> Option<DateTime> {
        if self == PeriodKey::FOREVER {
            return None;
        }
        Timestamp::from_second(self.0)
            .ok()
            .map(|ts| Offset::UTC.to_datetime(ts))
    }
}

impl PeriodKey {
    /// The period as a reader names it, on the zone's own calendar (the
    /// key is already local wall time): `2026-12-06` for a day,
    /// `2026-12` for a month, `2026` for a year, `2026-12-06 13:00` for an
    /// hour, the start `2026-12-06 13:20:00` of an `N`-second period. The
    /// stored number (civil seconds since 1970) means nothing to an
    /// operator reading a counter; this is what the IDs of that period
    /// render.
    pub fn label(self, reset: Reset) -> String {
        let Some(dt) = self.civil_start() else {
            return if self == PeriodKey::FOREVER {
                "the only period (reset never)".to_owned()
            } else {
                format!("period {}", self.0)
            };
        };
        let (y, m, d) = (dt.year(), dt.month(), dt.day());
        match reset {
            Reset::Never => "the only period (reset never)".to_owned(),
            Reset::Year => format!("{y:04}"),
            Reset::Month => format!("{y:04}-{m:02}"),
            Reset::Day => format!("{y:04}-{m:02}-{d:02}"),
            Reset::Hour => format!("{y:04}-{m:02}-{d:02} {:02}:00", dt.hour()),
            Reset::Seconds(n) => format!(
                "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} (a {n} s period)",
                dt.hour(),
                dt.minute(),
                dt.second()
            ),
        }
    }
}

impl fmt::Display for PeriodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.civil_start() {
            None if *self == PeriodKey::FOREVER => f.write_str("the only period (reset never)"),
            None => write!(f, "period {}", self.0),
            Some(dt) => write!(f, "the period starting {dt} local time"),
        }
    }
}

fn civil_seconds(dt: DateTime) -> Result<i64, PeriodError> {
    Offset::UTC
        .to_timestamp(dt)
        .map(Timestamp::as_second)
        .map_err(|_| PeriodError::TimeOutOfRange(0))
}

fn from_civil_seconds(s: i64) -> Result<DateTime, PeriodError> {
    Timestamp::from_second(s)
        .map(|ts| Offset::UTC.to_datetime(ts))
        .map_err(|_| PeriodError::TimeOutOfRange(i128::from(s) * 1000))
}

fn truncate(dt: DateTime, reset: Reset) -> Result<DateTime, PeriodError> {
    let day = dt.start_of_day();
    Ok(match reset {
        Reset::Never => day,
        Reset::Hour => day + (dt.hour() as i64).hours(),
        Reset::Day => day,
        Reset::Month => day.first_of_month(),
        Reset::Year => day.first_of_year(),
        Reset::Seconds(n) => {
            let s = civil_seconds(dt)?;
            let n = n as i64;
            from_civil_seconds(s.div_euclid(n) * n)?
        }
    })
}

/// The period that the instant `now_ms` (Unix ms) falls in, in `zone`.
pub fn period_key(now_ms: i64, zone: &Zone, reset: Reset) -> Result<PeriodKey, PeriodError> {
    if reset == Reset::Never {
        return Ok(PeriodKey::FOREVER);
    }
    let dt = zone.civil(now_ms)?;
    Ok(PeriodKey(civil_seconds(truncate(dt, reset)?)?))
}

fn next_civil_start(key: PeriodKey, reset: Reset) -> Result<Option<DateTime>, PeriodError> {
    let Some(start) = key.civil_start() else {
        return Ok(None);
    };
    let next = match reset {
        Reset::Never => return Ok(None),
        Reset::Hour => start.checked_add(1.hour()),
        Reset::Day => start.checked_add(1.day()),
        Reset::Month => start.checked_add(1.month()),
        Reset::Year => start.checked_add(1.year()),
        Reset::Seconds(n) => start.checked_add((n as i64).seconds()),
    };
    next.map(Some)
        .map_err(|_| PeriodError::TimeOutOfRange(i128::from(key.0) * 1000))
}

/// The first instant (Unix ms) of the period after `key`: when a counter
/// exhausted in `key` can go on. `None` when the format never resets.
pub fn next_period_start(
    key: PeriodKey,
    zone: &Zone,
    reset: Reset,
) -> Result<Option<i64>, PeriodError> {
    match next_civil_start(key, reset)? {
        None => Ok(None),
        Some(dt) => zone.first_instant_at_or_after(dt).map(Some),
    }
}

/// The first instant (Unix ms) that falls in `key`'s period: where a node
/// whose wall clock is behind the stored period renders its IDs. `None`
/// when no instant has this key (a period wholly inside a DST gap, which
/// [`period_key`] never returns).
pub fn period_first_instant(
    key: PeriodKey,
    zone: &Zone,
    reset: Reset,
) -> Result<Option<i64>, PeriodError> {
    let Some(start) = key.civil_start() else {
        return Ok(Some(i64::MIN));
    };
    let at = zone.first_instant_at_or_after(start)?;
    Ok((period_key(at, zone, reset)? == key).then_some(at))
}

/// How far ahead [`wall_clock_goes_back`] looks for the zone's offset
/// changes: three years, so every yearly DST cycle is seen.
pub const CLOCK_CHANGE_LOOKAHEAD_MS: i64 = 3 * 366 * 86_400_000;

/// A change of the zone's offset that turns its wall clock back across a
/// period boundary (see [`wall_clock_goes_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockGoesBack {
    /// When, Unix ms.
    pub at_ms: i64,
    /// How far the wall clock goes back, seconds.
    pub back_s: i64,
}

/// The first change of `zone`'s offset from `from_ms` on (within
/// [`CLOCK_CHANGE_LOOKAHEAD_MS`]) that turns its wall clock back across a
/// boundary of `reset`'s periods, if any.
///
/// Periods are cut on the wall clock, so after such a change (a DST
/// fall-back, typically one hour) the wall clock is in a period before the
/// one the counter is in. The period never goes back ([`decide`]), so the
/// counter would be held in the later period, rendering at its first
/// instant, for as long as the change (refused beyond
/// `clock.max_backward`): an hour of one period's values for a one-second
/// `{unix_s}` template. A format whose periods such a change crosses is
/// therefore refused. A change that stays inside one period (an hourly
/// reset at a one-hour fall-back: both 01:30 render `01`) is fine.
pub fn wall_clock_goes_back(
    zone: &Zone,
    reset: Reset,
    from_ms: i64,
) -> Result<Option<ClockGoesBack>, PeriodError> {
    if reset == Reset::Never {
        return Ok(None);
    }
    let from = Timestamp::from_millisecond(from_ms)
        .map_err(|_| PeriodError::TimeOutOfRange(from_ms.into()))?;
    let end = from_ms.saturating_add(CLOCK_CHANGE_LOOKAHEAD_MS);
    // Bounded: a zone changes its offset a few times a year at most.
    for change in zone.tz.following(from).take(64) {
        let at_ms = change.timestamp().as_millisecond();
        if at_ms > end {
            break;
        }
        let before = zone.tz.to_offset(
            Timestamp::from_millisecond(at_ms - 1)
                .map_err(|_| PeriodError::TimeOutOfRange(at_ms.into()))?,
        );
        let back_s = i64::from(before.seconds()) - i64::from(change.offset().seconds());
        if back_s > 0 && period_key(at_ms, zone, reset)? < period_key(at_ms - 1, zone, reset)? {
            return Ok(Some(ClockGoesBack { at_ms, back_s }));
        }
    }
    Ok(None)
}

/// Where `now` stands against the stored period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeriodStep {
    /// Nothing stored yet: the first period, start at the minimum.
    First,
    /// The stored period: continue above the stored counter.
    Same,
    /// A later period: start at the minimum (the stored one is finished
    /// for good).
    Later,
    /// The wall clock is behind the stored period (stepped back across a
    /// boundary, or a DST fall-back across an `N`-second boundary): stay in
    /// the stored, later period, rendering at its first instant; never
    /// re-enter the finished one.
    Held {
        /// How far `now` is behind the stored period's first instant, ms.
        behind_ms: i64,
    },
}

/// What [`decide`] says: which period to use, how, and at which instant to
/// render time fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeriodDecision {
    /// The period whose counter to use (and to store).
    pub key: PeriodKey,
    /// How `now` relates to the stored period.
    pub step: PeriodStep,
    /// The instant (Unix ms) to render time fields at: `now`, or the held
    /// period's first instant. Rendering at `now` while held would print an
    /// earlier period's fields next to the later period's counter and
    /// could repeat an ID.
    pub render_at_ms: i64,
}

impl PeriodDecision {
    /// Whether to issue at all: always in the same or a new period; when
    /// held, only while the wall clock is at most `max_behind_ms` behind
    /// (beyond that, answer UNAVAILABLE until the clock catches up, as
    /// snowflake does past `clock.max_backward`). Either way no ID repeats.
    pub fn may_issue(&self, max_behind_ms: u64) -> bool {
        match self.step {
            PeriodStep::Held { behind_ms } => behind_ms.unsigned_abs() <= max_behind_ms,
            _ => true,
        }
    }

    /// Whether the counter starts again at its minimum.
    pub fn starts_fresh(&self) -> bool {
        matches!(self.step, PeriodStep::First | PeriodStep::Later)
    }
}

/// The rule "the period never goes back". Given the stored period (if
/// any) and the wall clock, decides which period the next IDs belong to.
pub fn decide(
    stored: Option<PeriodKey>,
    now_ms: i64,
    zone: &Zone,
    reset: Reset,
) -> Result<PeriodDecision, PeriodError> {
    let now_key = period_key(now_ms, zone, reset)?;
    let (key, step, render_at_ms) = match stored {
        None => (now_key, PeriodStep::First, now_ms),
        Some(s) if s == now_key => (s, PeriodStep::Same, now_ms),
        Some(s) if s < now_key => (now_key, PeriodStep::Later, now_ms),
        Some(s) => {
            // The stored key came from a real instant, so it has one; the
            // fallback (the next period's start minus 1 ms) is inside it too.
            let at = match period_first_instant(s, zone, reset)? {
                Some(at) => at,
                None => next_period_start(s, zone, reset)?.map_or(now_ms, |n| n - 1),
            };
            let behind_ms = at.saturating_sub(now_ms).max(0);
            (s, PeriodStep::Held { behind_ms }, at)
        }
    };
    Ok(PeriodDecision {
        key,
        step,
        render_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_is_labelled_as_its_ids_render_it() {
        // 1796515200: 2026-12-06T00:00 on the zone's wall clock.
        let key = PeriodKey(1_796_515_200);
        assert_eq!(key.label(Reset::Day), "2026-12-06");
        assert_eq!(key.label(Reset::Month), "2026-12");
        assert_eq!(key.label(Reset::Year), "2026");
        assert_eq!(
            PeriodKey(1_796_515_200 + 13 * 3600).label(Reset::Hour),
            "2026-12-06 13:00"
        );
        assert_eq!(
            PeriodKey(1_796_515_200 + 1200).label(Reset::Seconds(600)),
            "2026-12-06 00:20:00 (a 600 s period)"
        );
        assert_eq!(
            PeriodKey::FOREVER.label(Reset::Never),
            "the only period (reset never)"
        );
        // In a zone east of UTC the key is still its local day.
        let zone = Zone::get("Asia/Shanghai").unwrap();
        // 2026-12-05T16:00Z: already 2026-12-06 00:00 in Shanghai (+08).
        let at = 1_796_486_400_000;
        let key = period_key(at, &zone, Reset::Day).unwrap();
        assert_eq!(key.label(Reset::Day), "2026-12-06");
    }

    fn ms(s: &str) -> i64 {
        s.parse::<Timestamp>().unwrap().as_millisecond()
    }

    fn zone(name: &str) -> Zone {
        Zone::get(name).unwrap()
    }

    fn key(at: &str, z: &Zone, r: Reset) -> PeriodKey {
        period_key(ms(at), z, r).unwrap()
    }

    #[test]
    fn reset_periods_parse_and_print_back() {
        for s in [
            "never", "hour", "day", "month", "year", "1s", "900s", "86400s",
        ] {
            let r: Reset = s.parse().unwrap();
            assert_eq!(r.to_string(), s);
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Reset>(&json).unwrap(), r);
        }
        for bad in ["", "0s", "daily", "s", "-5s", "31622401s"] {
            assert!(bad.parse::<Reset>().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<Reset>("\"weekly\"").is_err());
    }

    #[test]
    fn unknown_zones_are_refused_with_a_hint() {
        let err = Zone::get("Mars/Olympus").unwrap_err();
        assert!(err.to_string().contains("IANA"), "{err}");
        assert!(Zone::get("Asia/Shanghai").is_ok());
    }

    #[test]
    fn the_day_turns_at_local_midnight_in_shanghai() {
        let z = zone("Asia/Shanghai");
        // 2026-11-23 23:59:59.999 +08 = 15:59:59.999Z; midnight = 16:00Z.
        let before = key("2026-11-23T15:59:59.999Z", &z, Reset::Day);
        let after = key("2026-11-23T16:00:00Z", &z, Reset::Day);
        assert!(after > before);
        assert_eq!(before, key("2026-11-22T16:00:00Z", &z, Reset::Day));
        assert_eq!(
            next_period_start(before, &z, Reset::Day).unwrap(),
            Some(ms("2026-11-23T16:00:00Z"))
        );
        assert_eq!(
            period_first_instant(after, &z, Reset::Day).unwrap(),
            Some(ms("2026-11-23T16:00:00Z"))
        );
        // UTC midnight is 08:00 in Shanghai: not a boundary.
        assert_eq!(
            key("2026-11-23T23:59:59Z", &z, Reset::Day),
            key("2026-11-24T00:00:01Z", &z, Reset::Day)
        );
    }

    #[test]
    fn new_york_days_follow_dst_changes() {
        let z = zone("America/New_York");
        // 2026-03-08: 02:00 EST jumps to 03:00 EDT; the day is 23 hours.
        let d = key("2026-03-08T05:00:00Z", &z, Reset::Day); // 00:00 EST
        assert!(key("2026-03-08T04:59:59.999Z", &z, Reset::Day) < d);
        assert_eq!(
            next_period_start(d, &z, Reset::Day).unwrap(),
            Some(ms("2026-03-09T04:00:00Z")) // midnight EDT
        );
        // 2026-11-01: 02:00 EDT falls back to 01:00 EST; the day is 25 hours.
        let d = key("2026-11-01T04:00:00Z", &z, Reset::Day); // 00:00 EDT
        assert_eq!(d, key("2026-11-02T04:59:59Z", &z, Reset::Day));
        assert_eq!(
            next_period_start(d, &z, Reset::Day).unwrap(),
            Some(ms("2026-11-02T05:00:00Z")) // midnight EST
        );
    }

    #[test]
    fn the_repeated_fall_back_hour_is_one_period_and_the_skipped_hour_none() {
        let z = zone("America/New_York");
        // 01:30 EDT and 01:30 EST render the same hour: one period.
        let first = key("2026-11-01T05:30:00Z", &z, Reset::Hour);
        let second = key("2026-11-01T06:30:00Z", &z, Reset::Hour);
        assert_eq!(first, second);
        assert_eq!(
            next_period_start(first, &z, Reset::Hour).unwrap(),
            Some(ms("2026-11-01T07:00:00Z")) // 02:00 EST
        );
        assert_eq!(
            period_first_instant(first, &z, Reset::Hour).unwrap(),
            Some(ms("2026-11-01T05:00:00Z")) // 01:00 EDT
        );
        // Spring forward: 01:xx EST is followed by 03:00 EDT.
        let one = key("2026-03-08T06:59:59Z", &z, Reset::Hour);
        assert_eq!(
            next_period_start(one, &z, Reset::Hour).unwrap(),
            Some(ms("2026-03-08T07:00:00Z"))
        );
        let three = key("2026-03-08T07:00:00Z", &z, Reset::Hour);
        assert_eq!(three.0 - one.0, 2 * 3600, "local 02:00 never happens");
    }

    #[test]
    fn month_and_year_ends_and_the_leap_day() {
        let z = zone("Asia/Shanghai");
        // 2028-02-29 is a leap day; March starts at 2028-02-29T16:00Z.
        let feb = key("2028-02-29T15:59:59Z", &z, Reset::Month);
        let leap_day = key("2028-02-29T12:00:00Z", &z, Reset::Day);
        assert_eq!(
            next_period_start(leap_day, &z, Reset::Day).unwrap(),
            Some(ms("2028-02-29T16:00:00Z"))
        );
        assert_eq!(
            leap_day.civil_start().unwrap().to_string(),
            "2028-02-29T00:00:00"
        );
        assert_eq!(
            next_period_start(feb, &z, Reset::Month).unwrap(),
            Some(ms("2028-02-29T16:00:00Z"))
        );
        let y = key("2026-12-31T15:59:59Z", &z, Reset::Year);
        assert_eq!(
            next_period_start(y, &z, Reset::Year).unwrap(),
            Some(ms("2026-12-31T16:00:00Z"))
        );
        assert!(key("2026-12-31T16:00:00Z", &z, Reset::Year) > y);
    }

    #[test]
    fn n_second_periods_are_cut_on_local_wall_time() {
        let z = zone("Asia/Shanghai");
        // 900 s periods start on local quarter hours; 86,400 s at local
        // midnight, like reset = day.
        let k = key("2026-11-23T16:14:59Z", &z, Reset::Seconds(900));
        assert_eq!(k.civil_start().unwrap().to_string(), "2026-11-24T00:00:00");
        assert_eq!(
            next_period_start(k, &z, Reset::Seconds(900)).unwrap(),
            Some(ms("2026-11-23T16:15:00Z"))
        );
        assert_eq!(
            key("2026-11-23T16:00:00Z", &z, Reset::Seconds(86_400)).0,
            key("2026-11-23T16:00:00Z", &z, Reset::Day).0
        );
        assert_eq!(
            key("1999-01-01T00:00:00Z", &z, Reset::Never),
            PeriodKey::FOREVER
        );
        assert_eq!(
            next_period_start(PeriodKey::FOREVER, &z, Reset::Never).unwrap(),
            None
        );
    }

    #[test]
    fn hour_day_month_and_year_keys_never_decrease_through_a_dst_year() {
        // Every 7 minutes through 2026 in New York: hour, day, month keys
        // never decrease (the fall-back hour is one period).
        let z = zone("America/New_York");
        for reset in [Reset::Hour, Reset::Day, Reset::Month, Reset::Year] {
            let mut t = ms("2026-01-01T00:00:00Z");
            let end = ms("2027-01-01T00:00:00Z");
            let mut last = period_key(t, &z, reset).unwrap();
            while t < end {
                t += 7 * 60 * 1000;
                let k = period_key(t, &z, reset).unwrap();
                assert!(k >= last, "{reset} went back at {t}");
                last = k;
            }
        }
    }

    #[test]
    fn decide_continues_starts_fresh_or_holds_the_later_period() {
        let z = zone("Asia/Shanghai");
        let day = Reset::Day;
        let mon = key("2026-11-23T03:00:00Z", &z, day);
        let first = decide(None, ms("2026-11-23T03:00:00Z"), &z, day).unwrap();
        assert_eq!((first.key, first.step), (mon, PeriodStep::First));
        assert!(first.starts_fresh());

        let same = decide(Some(mon), ms("2026-11-23T15:00:00Z"), &z, day).unwrap();
        assert_eq!(same.step, PeriodStep::Same);
        assert!(!same.starts_fresh());

        // Restart after local midnight: a new period, never the old one.
        let later = decide(Some(mon), ms("2026-11-23T16:00:00Z"), &z, day).unwrap();
        assert_eq!(later.step, PeriodStep::Later);
        assert!(later.key > mon && later.starts_fresh());

        // The wall clock steps back 2 s across midnight: stay in the new
        // day, render at its first instant.
        let tue = later.key;
        let back = ms("2026-11-23T15:59:58Z");
        let held = decide(Some(tue), back, &z, day).unwrap();
        assert_eq!(held.key, tue);
        assert_eq!(held.step, PeriodStep::Held { behind_ms: 2000 });
        assert_eq!(held.render_at_ms, ms("2026-11-23T16:00:00Z"));
        assert_eq!(period_key(held.render_at_ms, &z, day).unwrap(), tue);
        assert!(held.may_issue(5_000));
        assert!(!held.may_issue(1_000));
        assert!(!held.starts_fresh());
    }

    #[test]
    fn a_fall_back_across_an_n_second_boundary_holds_the_later_period() {
        // 1800 s periods; at 2026-11-01 02:00 EDT local time goes back to
        // 01:00 EST: 01:59 EDT is in period 01:30, 01:00 EST in 01:00.
        let z = zone("America/New_York");
        let r = Reset::Seconds(1800);
        let late = key("2026-11-01T05:59:00Z", &z, r); // 01:59 EDT
        let after = ms("2026-11-01T06:05:00Z"); // 01:05 EST
        assert!(period_key(after, &z, r).unwrap() < late);
        let d = decide(Some(late), after, &z, r).unwrap();
        assert_eq!(d.key, late);
        // Rendered at 01:30 EDT, the held period's first instant (in the
        // past): the rendered fields name the period whose counter is used.
        assert_eq!(d.render_at_ms, ms("2026-11-01T05:30:00Z"));
        assert_eq!(d.step, PeriodStep::Held { behind_ms: 0 });
        assert_eq!(period_key(d.render_at_ms, &z, r).unwrap(), late);
    }

    #[test]
    fn a_fall_back_across_a_period_boundary_is_found_and_one_inside_a_period_is_not() {
        let ny = zone("America/New_York");
        let from = ms("2026-06-01T00:00:00Z");
        // One-second and half-hour periods: 01:59:59 EDT -> 01:00:00 EST
        // re-enters earlier periods.
        for r in [
            Reset::Seconds(1),
            Reset::Seconds(1800),
            Reset::Seconds(5400),
        ] {
            let back = wall_clock_goes_back(&ny, r, from).unwrap().expect("found");
            assert_eq!(back.at_ms, ms("2026-11-01T06:00:00Z"), "{r}");
            assert_eq!(back.back_s, 3600);
        }
        // The repeated hour stays in one period of an hour, two hours, a day.
        for r in [Reset::Hour, Reset::Seconds(7200), Reset::Day, Reset::Never] {
            assert_eq!(wall_clock_goes_back(&ny, r, from).unwrap(), None, "{r}");
        }
        // No offset changes ahead: UTC, Asia/Shanghai.
        for z in ["UTC", "Asia/Shanghai"] {
            let z = zone(z);
            assert_eq!(
                wall_clock_goes_back(&z, Reset::Seconds(1), from).unwrap(),
                None
            );
        }
    }
}
