//! Timestamp values: PostgreSQL's text to an instant (the record timestamp) and to ISO 8601 (headers
//! and envelope fields).
//!
//! pgoutput sends `timestamptz` and `timestamp` in the walsender's `DateStyle=ISO, TimeZone=UTC`:
//! `2026-12-02 10:49:10.123456+00`, `0044-03-15 12:00:00+00 BC`, `infinity`. A `text` or
//! `varchar` timestamp column holds whatever the application wrote, so it goes through the same
//! parser (which also takes RFC 3339, `2026-12-02T10:49:10Z`).
//!
//! Invariant: nothing here panics or wraps. Every date and offset computation is jiff's checked
//! arithmetic; a value jiff cannot represent (an instant outside -9999-01-02..9999-12-30 UTC, where
//! PostgreSQL goes on to 294276 AD) or cannot read is an `Err` with a one-line message, and the router turns it
//! into a `bad_value` event that `--on-bad-event` handles.

use jiff::civil::DateTime;
use jiff::fmt::temporal::{DateTimePrinter, Pieces};
use jiff::tz::Offset;
use jiff::Timestamp;

use super::render::{INT4, INT8, TIMESTAMP};

/// One readable timestamp value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parsed {
    /// `infinity` or `-infinity`: PostgreSQL's special values, which no instant stands for.
    Infinite(&'static str),
    Finite {
        at: DateTime,
        offset: Option<Offset>,
    },
}

/// A timestamp column's value in ms since the Unix epoch: `timestamptz`/`timestamp` text
/// (`timestamp` read as UTC; text must carry an offset), or an integer column taken as epoch
/// milliseconds. `infinity` gives `None`: the record keeps no timestamp.
pub fn epoch_ms(type_oid: u32, text: &[u8]) -> Result<Option<i64>, String> {
    if matches!(type_oid, INT8 | INT4) {
        let ms = std::str::from_utf8(text)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| format!("timestamp column value {} is not an integer", shown(text)))?;
        Timestamp::from_millisecond(ms).map_err(|e| out_of_range(text, e))?;
        return Ok(Some(ms));
    }
    let (at, offset) = match parse(text)? {
        Parsed::Infinite(_) => return Ok(None),
        Parsed::Finite { at, offset } => (at, offset),
    };
    let offset = match (type_oid, offset) {
        (TIMESTAMP, _) => Offset::UTC,
        (_, Some(o)) => o,
        (_, None) => {
            return Err(format!(
                "timestamp {} has no UTC offset; expected ISO format like 2026-12-02 10:49:10.5+00",
                shown(text)
            ))
        }
    };
    let ts = offset.to_timestamp(at).map_err(|e| out_of_range(text, e))?;
    Ok(Some(ts.as_millisecond()))
}

/// A `timestamptz` (`tz`) or `timestamp` value as ISO 8601: `2026-12-02T10:49:10.5Z`, other
/// offsets as `+05:30`, BC years as negative (astronomical) years, `infinity` as itself.
pub fn iso(text: &[u8], tz: bool) -> Result<String, String> {
    let (at, offset) = match parse(text)? {
        Parsed::Infinite(s) => return Ok(s.to_owned()),
        Parsed::Finite { at, offset } => (at, offset),
    };
    match (tz, offset) {
        (false, _) => Ok(at.to_string()),
        (true, None) => Err(format!("timestamptz {} has no UTC offset", shown(text))),
        (true, Some(o)) => {
            let ts = o.to_timestamp(at).map_err(|e| out_of_range(text, e))?;
            if o == Offset::UTC {
                return Ok(ts.to_string());
            }
            let mut out = String::new();
            DateTimePrinter::new().print_timestamp_with_offset(&ts, o, &mut out).map_err(|e| out_of_range(text, e))?;
            Ok(out)
        }
    }
}

fn parse(text: &[u8]) -> Result<Parsed, String> {
    let s = std::str::from_utf8(text).map_err(|_| "timestamp is not UTF-8".to_owned())?;
    match s {
        "infinity" => return Ok(Parsed::Infinite("infinity")),
        "-infinity" => return Ok(Parsed::Infinite("-infinity")),
        _ => {}
    }
    let (iso, bc) = match s.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (s, false),
    };
    let bad = |e: jiff::Error| {
        format!(
            "cannot read timestamp {} ({e}); expected ISO format like 2026-12-02 10:49:10.5+00 with a year in -9999..=9999",
            shown(text)
        )
    };
    let pieces = Pieces::parse(iso).map_err(bad)?;
    let time = pieces.time().ok_or_else(|| format!("timestamp {} has no time of day", shown(text)))?;
    let mut at = pieces.date().to_datetime(time);
    if bc {
        // 1 BC is year 0, 44 BC is year -43.
        if at.year() < 1 {
            return Err(format!("timestamp {} has a BC year below 1", shown(text)));
        }
        at = at.with().year(1 - at.year()).build().map_err(bad)?;
    }
    Ok(Parsed::Finite { at, offset: pieces.to_numeric_offset() })
}

fn out_of_range(text: &[u8], e: jiff::Error) -> String {
    format!("timestamp {} is out of range ({e}); the supported range is years -9999..=9999", shown(text))
}

/// A row value quoted for an error message, cut short so a huge value cannot flood the log.
fn shown(text: &[u8]) -> String {
    let s = String::from_utf8_lossy(text);
    match s.char_indices().nth(64) {
        Some((i, _)) => format!("{:?}…", &s[..i]),
        None => format!("{s:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::render::{TEXT, TIMESTAMPTZ};
    use super::*;

    #[test]
    fn epoch_ms_table() {
        let ok: &[(u32, &str, Option<i64>)] = &[
            (TIMESTAMPTZ, "1970-01-01 00:00:00+00", Some(0)),
            (TIMESTAMPTZ, "1970-01-01 05:30:00.5+05:30", Some(500)),
            (TIMESTAMPTZ, "2000-03-01 00:00:00-01", Some(951_868_800_000 + 3_600_000)),
            (TIMESTAMPTZ, "2026-12-02 10:49:10.123456+00", Some(1_796_208_550_123)),
            (TIMESTAMPTZ, "1969-12-31 23:59:59.999+00", Some(-1)),
            (TIMESTAMPTZ, "1970-01-01 00:00:00-03:30:12", Some(12_612_000)),
            // PostgreSQL's BC spelling: 1 BC is astronomical year 0.
            (TIMESTAMPTZ, "0001-12-31 23:59:59+00 BC", Some(-62_135_596_801_000)),
            (TIMESTAMPTZ, "4713-11-24 00:00:00+00 BC", Some(-210_835_180_800_000)),
            (TIMESTAMPTZ, "9999-12-30 21:59:59.999+00", Some(253_402_207_199_999)),
            (TIMESTAMPTZ, "infinity", None),
            (TIMESTAMPTZ, "-infinity", None),
            (TIMESTAMP, "1970-01-01 00:00:01", Some(1000)),
            (TIMESTAMP, "infinity", None),
            // A text column: PostgreSQL's format or RFC 3339.
            (TEXT, "2026-12-02T10:49:10.123Z", Some(1_796_208_550_123)),
            (TEXT, "2026-12-02 10:49:10.123+00", Some(1_796_208_550_123)),
            (INT8, "1234", Some(1234)),
            (INT8, "-1234", Some(-1234)),
        ];
        for (oid, text, want) in ok {
            assert_eq!(epoch_ms(*oid, text.as_bytes()), Ok(*want), "{text}");
        }
    }

    #[test]
    fn bad_timestamps_are_errors_not_panics() {
        let bad: &[(u32, &str, &str)] = &[
            // Overflowed 64-bit day arithmetic before: now a message.
            (TIMESTAMPTZ, "99999999999999999-01-01 00:00:00+00", "cannot read timestamp"),
            (TEXT, "99999999999999999-01-01 00:00:00+00", "cannot read timestamp"),
            // Legal in PostgreSQL (up to 294276 AD, down to 4713 BC) but beyond a Kafka-sane range.
            (TIMESTAMPTZ, "294276-12-31 23:59:59+00", "cannot read timestamp"),
            (TIMESTAMPTZ, "10000-01-01 00:00:00+00", "cannot read timestamp"),
            (TIMESTAMPTZ, "0000-01-01 00:00:00+00 BC", "BC year below 1"),
            (TIMESTAMPTZ, "-9999-01-01 00:00:00+00 BC", "cannot read timestamp"),
            // The offset pushes an edge date out of range.
            (TIMESTAMPTZ, "9999-12-31 23:00:00-05", "out of range"),
            (TIMESTAMPTZ, "9999-12-31 23:59:59.999+00", "out of range"),
            (TIMESTAMPTZ, "2026-12-02 10:49:10+99", "cannot read timestamp"),
            (TIMESTAMPTZ, "2026-12-02 10:49:10", "no UTC offset"),
            (TIMESTAMPTZ, "2026-12-02", "no time of day"),
            (TIMESTAMPTZ, "2026-13-01 00:00:00+00", "cannot read timestamp"),
            (TIMESTAMPTZ, "", "cannot read timestamp"),
            (TIMESTAMPTZ, "a-b-c d:e:f+00", "cannot read timestamp"),
            (TIMESTAMPTZ, "yesterday", "cannot read timestamp"),
            (TIMESTAMPTZ, "\u{1F600}", "cannot read timestamp"),
            (INT8, "12.5", "not an integer"),
            (INT8, "9223372036854775807", "out of range"),
            (INT8, "-9223372036854775808", "out of range"),
            (INT8, "99999999999999999999", "not an integer"),
        ];
        for (oid, text, want) in bad {
            let e = epoch_ms(*oid, text.as_bytes()).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
        assert_eq!(epoch_ms(TIMESTAMPTZ, &[0xff, 0xfe]).unwrap_err(), "timestamp is not UTF-8");
        let long = "9".repeat(10_000);
        assert!(epoch_ms(TEXT, long.as_bytes()).unwrap_err().len() < 400, "a huge value is cut short");
    }

    #[test]
    fn iso_rendering_table() {
        let cases: &[(&str, bool, &str)] = &[
            ("2026-12-02 10:49:10.5+00", true, "2026-12-02T10:49:10.5Z"),
            ("2026-12-02 10:49:10.123456+00", true, "2026-12-02T10:49:10.123456Z"),
            ("2026-12-02 10:49:10+05:30", true, "2026-12-02T10:49:10+05:30"),
            ("2026-12-02 10:49:10-03", true, "2026-12-02T10:49:10-03:00"),
            ("0044-03-15 12:00:00+00 BC", true, "-000043-03-15T12:00:00Z"),
            ("infinity", true, "infinity"),
            ("-infinity", false, "-infinity"),
            ("2026-12-02 10:49:10", false, "2026-12-02T10:49:10"),
            ("2026-12-02 10:49:10.25", false, "2026-12-02T10:49:10.25"),
            ("0001-01-01 00:00:00 BC", false, "0000-01-01T00:00:00"),
        ];
        for (text, tz, want) in cases {
            assert_eq!(iso(text.as_bytes(), *tz).as_deref(), Ok(*want), "{text}");
        }
        for (text, tz) in [("99999999999999999-01-01 00:00:00+00", true), ("294276-01-01 00:00:00", false)] {
            assert!(iso(text.as_bytes(), tz).is_err(), "{text}");
        }
    }
}
