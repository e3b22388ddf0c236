//! Go-style durations (`180s`, `1m30s`, `1.5h`, `500ms`), as the duration fields of the API
//! (`adjustmentInterval`, `metricPullingInterval`, `decisionTimeout`) are written. The CRD schema
//! checks the format with the same grammar; this parses it into a [`Duration`].

use std::time::Duration;

/// Why a duration string cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The string is not a sequence of `<number><unit>` terms.
    #[error(
        "{0:?} is not a duration: write one or more <number><unit> terms with units ns, us, ms, s, m or h, e.g. 180s or 1m30s"
    )]
    Format(String),
    /// The duration does not fit in 64-bit nanoseconds.
    #[error("{0:?} is too long")]
    Overflow(String),
}

/// Parses a Go duration without sign: one or more `<digits>[.<digits>]<unit>` terms, units `ns`,
/// `us` (or `µs`), `ms`, `s`, `m`, `h`.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let format = || DurationError::Format(text.to_string());
    if text.is_empty() {
        return Err(format());
    }
    let mut rest = text;
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format());
        }
        let mut number_len = digits;
        if rest.as_bytes().get(digits) == Some(&b'.') {
            let fraction = rest[digits + 1..].bytes().take_while(u8::is_ascii_digit).count();
            if fraction == 0 {
                return Err(format());
            }
            number_len = digits + 1 + fraction;
        }
        let number: f64 = rest[..number_len].parse().map_err(|_| format())?;
        rest = &rest[number_len..];
        let (unit_nanos, unit_len) = [
            ("ns", 1.0),
            ("us", 1e3),
            ("µs", 1e3),
            ("ms", 1e6),
            ("s", 1e9),
            ("m", 60e9),
            ("h", 3600e9),
        ]
        .iter()
        // `ms` before `m` and `s`: the longest unit that matches wins.
        .filter(|(unit, _)| rest.starts_with(unit))
        .max_by_key(|(unit, _)| unit.len())
        .map(|(unit, nanos)| (*nanos, unit.len()))
        .ok_or_else(format)?;
        rest = &rest[unit_len..];
        total_nanos += number * unit_nanos;
    }
    if !total_nanos.is_finite() || total_nanos > u64::MAX as f64 {
        return Err(DurationError::Overflow(text.to_string()));
    }
    // Rounded to whole nanoseconds, as Go stores them.
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

/// Formats a duration the short way users write it (`24h`, `5m`, `90s`, `1.5s`, `250ms`), for
/// messages.
pub fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    let secs = duration.as_secs();
    if nanos == 0 {
        "0s".into()
    } else if nanos.is_multiple_of(3_600_000_000_000) {
        format!("{}h", secs / 3600)
    } else if nanos.is_multiple_of(60_000_000_000) {
        format!("{}m", secs / 60)
    } else if nanos.is_multiple_of(1_000_000_000) {
        format!("{}s", nanos / 1_000_000_000)
    } else if nanos >= 1_000_000_000 {
        format!("{}s", duration.as_secs_f64())
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}ms", nanos / 1_000_000)
    } else {
        format!("{nanos}ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        let cases = [
            ("180s", 180_000),
            ("3m", 180_000),
            ("1m30s", 90_000),
            ("1.5h", 5_400_000),
            ("500ms", 500),
            ("1h2m3s4ms", 3_723_004),
            ("0s", 0),
        ];
        for (text, millis) in cases {
            assert_eq!(
                parse_duration(text).unwrap(),
                Duration::from_millis(millis),
                "{text}"
            );
        }
        assert_eq!(parse_duration("10us").unwrap(), Duration::from_micros(10));
        assert_eq!(parse_duration("10µs").unwrap(), Duration::from_micros(10));
        assert_eq!(parse_duration("7ns").unwrap(), Duration::from_nanos(7));
    }

    #[test]
    fn rejects_what_the_schema_rejects() {
        for text in ["", "10", "s", "1.s", ".5s", "-1s", "1 s", "1d", "1sm", "1e3s"] {
            assert!(
                matches!(parse_duration(text), Err(DurationError::Format(_))),
                "{text:?} parsed"
            );
        }
        assert!(matches!(
            parse_duration("99999999999999999h"),
            Err(DurationError::Overflow(_))
        ));
    }

    #[test]
    fn formats_for_messages() {
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(86_400)), "24h");
        assert_eq!(format_duration(Duration::from_secs(300)), "5m");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(format_duration(Duration::ZERO), "0s");
    }
}
