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

use super::oid::{INT4, INT8, TIMESTAMP};

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
    if let Some(ms) = walsender_epoch_ms(text, type_oid != TIMESTAMP) {
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

/// The walsender's own spelling, read without the general parser (a record's timestamp is on the
/// hot path): `YYYY-MM-DD HH:MM:SS`, an optional `.` and 1–6 fraction digits, then `+00` when
/// `utc_suffix` (timestamptz, or text that must carry an offset) or nothing (timestamp). Only
/// years 1970..=9998, so the result is never negative and never near jiff's range limits. Anything
/// else, valid or not, is `None` and goes to the general parser, which gives the same instant or
/// the error.
///
/// The fixed part is read eight bytes at a time: each word's separators and digits are checked
/// with a few masks rather than byte by byte, and adjacent digits are paired in one multiply.
fn walsender_epoch_ms(text: &[u8], utc_suffix: bool) -> Option<i64> {
    // `YYYY-MM-` `DD HH:MM` and (overlapping) `HH:MM:SS`, little-endian: byte i of the text is
    // bits 8i.. of its word.
    let word = |at: usize| -> Option<u64> { Some(u64::from_le_bytes(text.get(at..at + 8)?.try_into().ok()?)) };
    let (w0, w1, w2) = (word(0)?, word(8)?, word(11)?);
    // Per word: which bytes are digits (0xff) and which separators must be (the digits' bytes 0).
    const D0: u64 = 0x00ff_ff00_ffff_ffff; // YYYY-MM-
    const S0: u64 = 0x2d00_002d_0000_0000;
    const D1: u64 = 0xffff_00ff_ff00_ffff; // DD HH:MM
    const S1: u64 = 0x0000_3a00_0020_0000;
    const D2: u64 = 0xffff_00ff_ff00_ffff; // HH:MM:SS
    const S2: u64 = 0x0000_3a00_003a_0000;
    let fixed = |w: u64, digits: u64, seps: u64| {
        let ones = 0x0101_0101_0101_0101 & digits;
        // Separators exactly; digits' high nibble 3 and, with 6 added, still 3 (0x30..=0x39).
        // After the first test every byte is at most 0x3f, so adding 6 never carries.
        (w & (!digits | 0xf0f0_f0f0_f0f0_f0f0)) == (seps | (0x30 * ones))
            && (w.wrapping_add(6 * ones) & (0xf0 * ones)) == 0x30 * ones
    };
    if !(fixed(w0, D0, S0) && fixed(w1, D1, S1) && fixed(w2, D2, S2)) {
        return None;
    }
    // Byte i of `pairs(w)` is 10 × digit i + digit i+1 (< 256: no carries between bytes).
    let pairs = |w: u64| (w & 0x0f0f_0f0f_0f0f_0f0f) * 10 + ((w >> 8) & 0x000f_0f0f_0f0f_0f0f);
    let (p0, p1, p2) = (pairs(w0), pairs(w1), pairs(w2));
    let at = |p: u64, i: u32| ((p >> (8 * i)) & 0xff) as i64;
    let year = at(p0, 0) * 100 + at(p0, 2);
    let (month, day) = (at(p0, 5), at(p1, 0));
    let (hour, minute, second) = (at(p2, 0), at(p2, 3), at(p2, 6));
    let mut rest = &text[19..];
    let mut millis = 0;
    if let [b'.', fraction @ ..] = rest {
        // Up to 8 fraction bytes, zero-padded (zero is not a digit); count the leading digits.
        // (The walsender's `ffffff+00` is 9 bytes: one load, no copy.)
        let w = match fraction.first_chunk::<8>() {
            Some(head) => u64::from_le_bytes(*head),
            None => {
                let mut buf = [0u8; 8];
                buf[..fraction.len()].copy_from_slice(fraction);
                u64::from_le_bytes(buf)
            }
        };
        // High bit of each byte set where that byte is not an ASCII digit: `x` is the byte minus
        // '0' for a digit (0..=9); any other byte has its high bit set in `x` already, or a low
        // seven bits of at least 10, which + 0x76 carries into the high bit. No byte carries into
        // the next (at most 0x7f + 0x76).
        let x = w ^ 0x3030_3030_3030_3030;
        let not_digit = ((x & 0x7f7f_7f7f_7f7f_7f7f) + 0x7676_7676_7676_7676) | x;
        let digits = ((not_digit & 0x8080_8080_8080_8080).trailing_zeros() / 8) as usize;
        if !(1..=6).contains(&digits) {
            return None;
        }
        // Milliseconds truncate the fraction, as jiff's `as_millisecond` does for instants >= 1970;
        // digits past the fraction's end count as 0.
        let kept = w & (u64::MAX >> (64 - 8 * digits.min(3)));
        let d = |i: u32| ((kept >> (8 * i)) & 0x0f) as i64;
        millis = d(0) * 100 + d(1) * 10 + d(2);
        rest = &fraction[digits..];
    }
    if rest != if utc_suffix { &b"+00"[..] } else { &b""[..] } {
        return None;
    }
    const MONTH_DAYS: [i64; 12] = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let valid = (1970..=9998).contains(&year)
        && (1..=12).contains(&month)
        && day >= 1
        && day <= MONTH_DAYS[(month - 1) as usize] + i64::from(leap && month == 2)
        && hour < 24
        && minute < 60
        && second < 60;
    if !valid {
        return None;
    }
    // Days since 1970-01-01 of a proleptic Gregorian date (years counted from March, so the leap
    // day ends the year).
    let (y, m) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    let era_days = y / 400 * 146_097;
    let yoe = y % 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let days = era_days + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis)
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

/// Why a record timestamp of `ms` (< 0) is refused: the `invalid_timestamp` bad event's message.
pub fn before_epoch(ms: i64) -> String {
    let at = Timestamp::from_millisecond(ms).map(|t| t.to_string()).unwrap_or_else(|_| ms.to_string());
    format!(
        "timestamp column value {at} is before 1970-01-01T00:00:00Z; Kafka record timestamps cannot be negative \
         (set the column to a later instant, or route without --table-field-event-timestamp)"
    )
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

    /// The general parser alone, for comparison with the fast path.
    fn jiff_epoch_ms(text: &str, tz: bool) -> Option<i64> {
        let Parsed::Finite { at, offset } = parse(text.as_bytes()).ok()? else { return None };
        let offset = if tz { offset? } else { Offset::UTC };
        Some(offset.to_timestamp(at).ok()?.as_millisecond())
    }

    #[test]
    fn fast_path_takes_only_the_walsender_spelling() {
        for (text, utc) in [
            ("2026-12-02 10:49:10.123456+00", true),
            ("2026-12-02 10:49:10+00", true),
            ("2024-02-29 23:59:59.9+00", true),
            ("1970-01-01 00:00:00", false),
            ("9998-12-31 23:59:59.999999", false),
        ] {
            assert_eq!(walsender_epoch_ms(text.as_bytes(), utc), jiff_epoch_ms(text, utc), "{text}");
            assert!(walsender_epoch_ms(text.as_bytes(), utc).is_some(), "{text}");
        }
        for (text, utc) in [
            ("2026-12-02 10:49:10+05:30", true),
            ("2026-12-02 10:49:10", true),
            ("2026-12-02 10:49:10+00", false),
            ("1969-12-31 23:59:59.999+00", true),
            ("9999-01-01 00:00:00+00", true),
            ("2023-02-29 00:00:00+00", true),
            ("2026-12-02 24:00:00+00", true),
            ("2026-12-02 10:49:60+00", true),
            ("2026-12-02 10:49:10.1234567+00", true),
            ("2026-12-02 10:49:10.+00", true),
            ("2026-12-02T10:49:10+00", true),
            ("0044-03-15 12:00:00+00 BC", true),
            ("2026-1a-02 10:49:10+00", true),
            ("2026-12-02 10:49:1", true),
            ("", true),
        ] {
            assert_eq!(walsender_epoch_ms(text.as_bytes(), utc), None, "{text}");
        }
    }

    proptest::proptest! {
        #[test]
        fn fast_path_agrees_with_jiff(
            y in 1970i64..=9998, mo in 1i64..=12, d in 1i64..=31, h in 0i64..24, mi in 0i64..60,
            s in 0i64..60, frac in proptest::option::of((0u32..1_000_000, 1usize..=6)), utc in proptest::bool::ANY,
        ) {
            let mut text = format!("{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}");
            if let Some((f, digits)) = frac {
                let f = format!("{f:06}");
                text.push('.');
                text.push_str(&f[..digits]);
            }
            if utc {
                text.push_str("+00");
            }
            let fast = walsender_epoch_ms(text.as_bytes(), utc);
            let slow = jiff_epoch_ms(&text, utc);
            // Day 31 of a short month: both refuse (jiff with an error, the fast path with None).
            proptest::prop_assert_eq!(fast, slow, "{}", text);
            proptest::prop_assert_eq!(epoch_ms(if utc { TIMESTAMPTZ } else { TIMESTAMP }, text.as_bytes()).ok().flatten(), slow);
        }
    }

    proptest::proptest! {
        /// Near-misses of the walsender's spelling (any byte from a small alphabet of digits,
        /// separators and strays, at any length up to 32): whatever the word-wide checks accept
        /// must read as the general parser reads it.
        #[test]
        fn fast_path_accepts_nothing_jiff_reads_otherwise(
            text in "[0-9 :.+-]{0,6}[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}:[0-9]{2}[0-9:.+a\u{80}\u{e9}é-]{0,10}|[0-9 :.+\\-]{0,32}",
            utc in proptest::bool::ANY,
        ) {
            if let Some(fast) = walsender_epoch_ms(text.as_bytes(), utc) {
                proptest::prop_assert_eq!(Some(fast), jiff_epoch_ms(&text, utc), "{}", text);
            }
        }
    }

    /// A fraction byte that is not an ASCII digit ends the digits, whatever its high nibble: bytes
    /// such as 0x80-0x89 or 0xc3 0xa9 (`é`) are never read as digits.
    #[test]
    fn non_ascii_fraction_bytes_are_not_digits() {
        assert_eq!(walsender_epoch_ms("2026-12-02 10:49:10.é+00".as_bytes(), true), None);
        assert_eq!(walsender_epoch_ms(b"2026-12-02 10:49:10.\x80+00", true), None);
        assert_eq!(walsender_epoch_ms(b"2026-12-02 10:49:10.1\x89+00", true), None);
        assert_eq!(walsender_epoch_ms(b"2026-12-02 10:49:10.12\xf9", false), None);
        assert_eq!(
            walsender_epoch_ms(b"2026-12-02 10:49:10.12", false),
            jiff_epoch_ms("2026-12-02 10:49:10.12", false)
        );
    }

    proptest::proptest! {
        /// Any bytes after a valid date and time and a `.`: what the fast path accepts is text
        /// the general parser reads the same (every byte value, so non-ASCII ones too).
        #[test]
        fn fast_path_fraction_accepts_only_what_jiff_reads(
            tail in proptest::collection::vec(proptest::num::u8::ANY, 0..12),
            utc in proptest::bool::ANY,
        ) {
            let mut text = b"2026-12-02 10:49:10.".to_vec();
            text.extend_from_slice(&tail);
            if let Some(fast) = walsender_epoch_ms(&text, utc) {
                let s = std::str::from_utf8(&text);
                proptest::prop_assert!(s.is_ok(), "accepted bytes that are not UTF-8: {:?}", text);
                proptest::prop_assert_eq!(Some(fast), jiff_epoch_ms(s.unwrap(), utc), "{:?}", text);
            }
        }
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
