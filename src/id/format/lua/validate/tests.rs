//! The load-time repeat checks, each on a rule that breaks it and one
//! that does not.

use super::*;
use crate::id::format::lua::{LuaLimits, LuaRule};
use crate::id::format::period::Zone;

fn ms(s: &str) -> i64 {
    s.parse::<jiff::Timestamp>().unwrap().as_millisecond()
}

/// A rule of `max` values resetting every `reset` seconds whose
/// `create_id` returns `ret`, loaded in `zone` at 2026-11-23 03:00 UTC.
fn load(zone: &str, max: u64, reset: u64, ret: &str) -> Result<LuaRule, LuaError> {
    let src = format!(
        "function min_counter() return 0 end\nfunction max_counter() return {max} end\nfunction reset_seconds() return {reset} end\nfunction create_id(counter, now, salt)\n  return {ret}\nend\n"
    );
    LuaRule::load(
        "r",
        &src,
        Zone::get(zone).unwrap(),
        None,
        1,
        LuaLimits::default(),
        ms("2026-11-23T03:00:00Z"),
    )
}

/// The repeat a refused rule names: what, the two calls, the message.
fn refused(r: Result<LuaRule, LuaError>) -> (Repeat, Call, Call, String) {
    match r {
        Err(e @ LuaError::Repeats { .. }) => {
            let text = e.to_string();
            let LuaError::Repeats {
                what,
                first,
                second,
                ..
            } = e
            else {
                unreachable!()
            };
            (what, *first, *second, text)
        }
        other => panic!("expected a repeat, got {other:?}"),
    }
}

const DAY: u64 = 86_400;

#[test]
fn a_daily_rule_without_the_year_is_refused_naming_the_day_a_year_later() {
    let (what, first, second, text) = refused(load(
        "Asia/Shanghai",
        9999,
        DAY,
        "string.format('%02d%02d%04d', now:month(), now:day(), counter)",
    ));
    assert_eq!(what, Repeat::Period);
    assert_eq!((first.counter, second.counter), (0, 0));
    assert!(first.at.starts_with("2026-11-23T11:00:00"), "{first}");
    assert!(second.at.starts_with("2027-11-23T11:00:00"), "{second}");
    assert!(
        text.contains("rule r:")
            && text.contains("\"11230000\"")
            && text.contains("Asia/Shanghai")
            && text.contains("render the full year"),
        "{text}"
    );
}

#[test]
fn the_year_modulo_ten_is_refused_ten_years_later_and_modulo_a_hundred_a_hundred() {
    let (what, first, second, text) = refused(load(
        "Asia/Shanghai",
        9999,
        DAY,
        "string.format('%01d%02d%02d%04d', now:year() % 10, now:month(), now:day(), counter)",
    ));
    assert_eq!(what, Repeat::Period);
    assert!(first.at.starts_with("2026-11-23"), "{first}");
    assert!(second.at.starts_with("2036-11-23"), "{second}");
    assert!(text.contains("\"611230000\""), "{text}");
    let (_, _, second, _) = refused(load(
        "UTC",
        9999,
        DAY,
        "string.format('%02d%02d%02d%04d', now:year() % 100, now:month(), now:day(), counter)",
    ));
    assert!(second.at.starts_with("2126-11-23"), "{second}");
}

#[test]
fn a_rule_with_the_full_year_is_accepted() {
    for (zone, reset) in [
        ("Asia/Shanghai", DAY),
        ("America/New_York", 3600),
        ("UTC", 1),
    ] {
        let rule = load(
            zone,
            9999,
            reset,
            "string.format('%04d%02d%02d%02d%02d%02d%04d', now:year(), now:month(), now:day(), now:hour(), now:min(), now:sec(), counter)",
        );
        assert!(rule.is_ok(), "{zone} {reset}: {rule:?}");
    }
}

#[test]
fn a_rule_that_is_not_one_to_one_in_the_counter_is_refused() {
    let (what, first, second, text) =
        refused(load("UTC", 9999, 0, "string.format('%05d', counter // 2)"));
    assert_eq!(what, Repeat::Counter);
    assert_eq!((first.counter, second.counter), (0, 1));
    assert!(
        text.contains("\"00000\"") && text.contains("counter // 2"),
        "{text}"
    );
    // Within a range of 10^4, % 1000 repeats at 1000: every value is
    // rendered, not just the ends.
    let (what, first, second, _) = refused(load(
        "UTC",
        9999,
        0,
        "string.format('%03d', counter % 1000)",
    ));
    assert_eq!(what, Repeat::Counter);
    assert_eq!((first.counter, second.counter), (0, 1000));
    assert!(load("UTC", 9999, 0, "string.format('%04d', counter)").is_ok());
}

#[test]
fn a_rule_whose_salt_can_stand_for_the_counter_is_refused() {
    let (what, first, second, text) = refused(load("UTC", 9999, 0, "salt or tostring(counter)"));
    assert_eq!(what, Repeat::Salt);
    assert_ne!(first.counter, second.counter);
    assert!(text.contains("with salt"), "{text}");
    // Glued on: salt "1" and counter 2 give what salt "" and 12 give.
    let (what, ..) = refused(load("UTC", 9999, 0, "(salt or '') .. counter"));
    assert_eq!(what, Repeat::Salt);
    // At a fixed place and width, the salt is harmless; one the rule
    // refuses (an error) issues nothing.
    let fixed = "string.format('%04d-%s', counter, salt or '')";
    assert!(load("UTC", 9999, 0, fixed).is_ok());
    let picky = "(function() if salt and #salt > 8 then error('salt too long') end return string.format('%04d-%s', counter, salt or '') end)()";
    assert!(load("UTC", 9999, 0, picky).is_ok());
}

/// Local date + the UTC hour is one-to-one on every day of 24 hours; on
/// the 25-hour day DST ends, local 00:00 and 23:00 share the UTC hour.
#[test]
fn a_rule_is_checked_through_the_days_its_zone_changes_offset() {
    let ret = "string.format('%04d%02d%02d%02d%04d', now:year(), now:month(), now:day(), (now:unix() // 3600) % 24, counter)";
    assert!(load("Asia/Shanghai", 9999, 3600, ret).is_ok());
    let (what, first, second, text) = refused(load("America/New_York", 9999, 3600, ret));
    assert_eq!(what, Repeat::Period);
    assert!(
        first.at.starts_with("2027-11-07T00:00:00") && second.at.starts_with("2027-11-07T23:00:00"),
        "{first} / {second}"
    );
    assert!(text.contains("America/New_York"), "{text}");
}

#[test]
fn ranges_above_a_million_are_sampled_densely_at_both_ends_and_spread_between() {
    assert_eq!(scan_indices(FULL_SCAN), (0..FULL_SCAN).collect::<Vec<_>>());
    let cap = 1_000_000_000;
    let idx = scan_indices(cap);
    assert_eq!(idx.len() as u64, DENSE + TAIL + SPREAD);
    assert!(idx.iter().all(|i| *i < cap));
    assert_eq!(idx, scan_indices(cap), "the same sample every time");
    let spread: Vec<_> = idx[(DENSE + TAIL) as usize..].to_vec();
    assert!(spread.iter().all(|i| (DENSE..cap - TAIL).contains(i)));
    assert!(spread.iter().any(|i| *i > cap / 2) && spread.iter().any(|i| *i < cap / 2));
    // A repeat at the top of a range of 10^9 is found in the tail.
    let (what, first, second, _) = refused(load(
        "UTC",
        999_999_999,
        0,
        "string.format('%09d', counter == 999999999 and 999999998 or counter)",
    ));
    assert_eq!(what, Repeat::Counter);
    assert_eq!((first.counter, second.counter), (999_999_998, 999_999_999));
}
