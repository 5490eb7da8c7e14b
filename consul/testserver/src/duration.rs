//! Go-style duration strings (`"15s"`, `"1m30s"`, `"500ms"`), the form Consul
//! uses for every duration on the wire.

use std::time::Duration;

/// Parses a Go duration string. Consul decodes durations with Go's
/// `time.ParseDuration`, so `"10s"`, `"1.5h"` and `"1h30m"` are all valid,
/// while a bare number is not (callers that accept numbers handle them).
pub(crate) fn parse(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() || text.starts_with('-') {
        return None;
    }
    let text = text.strip_prefix('+').unwrap_or(text);
    let mut rest = text;
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if number_len == 0 {
            return None;
        }
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit_nanos = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total_nanos += number * unit_nanos;
    }
    if !total_nanos.is_finite() || total_nanos > u64::MAX as f64 {
        return None;
    }
    Some(Duration::from_nanos(total_nanos.round() as u64))
}

/// Formats a duration the way Go's `Duration.String` does for whole
/// milliseconds and above (`"15s"`, `"1m0s"`, `"1h30m0s"`, `"500ms"`), so
/// echoed TTLs look like Consul's.
pub(crate) fn format(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    if nanos < 1_000_000_000 {
        if nanos.is_multiple_of(1_000_000) {
            return format!("{}ms", nanos / 1_000_000);
        }
        if nanos.is_multiple_of(1_000) {
            return format!("{}µs", nanos / 1_000);
        }
        return format!("{nanos}ns");
    }
    let hours = d.as_secs() / 3600;
    let minutes = (d.as_secs() / 60) % 60;
    let secs = d.as_secs() % 60;
    let frac = d.subsec_nanos();
    let mut seconds = secs.to_string();
    if frac != 0 {
        let digits = format!("{frac:09}");
        seconds.push('.');
        seconds.push_str(digits.trim_end_matches('0'));
    }
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("15s"), Some(Duration::from_secs(15)));
        assert_eq!(parse("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse("0"), Some(Duration::ZERO));
        assert_eq!(parse("0s"), Some(Duration::ZERO));
        assert_eq!(parse("10"), None);
        assert_eq!(parse("s"), None);
        assert_eq!(parse("-1s"), None);
        assert_eq!(parse("5x"), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format(Duration::from_secs(15)), "15s");
        assert_eq!(format(Duration::from_secs(60)), "1m0s");
        assert_eq!(format(Duration::from_secs(5400)), "1h30m0s");
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format(Duration::from_millis(500)), "500ms");
        assert_eq!(format(Duration::ZERO), "0s");
    }
}
