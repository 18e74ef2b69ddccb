//! PostgreSQL's text output of the types Debezium maps to numbers, read into those numbers: a
//! `numeric` or `money` as an unscaled integer and a scale, a `date` as days since the epoch, a
//! `time` as microseconds since midnight, a `timetz` moved to UTC, a `timestamp` or `timestamptz`
//! as microseconds since the epoch, an `interval` as its parts, and a one-dimensional array's
//! elements. The walsender's settings are fixed (`DateStyle=ISO`, `TimeZone=UTC`; the server's
//! `IntervalStyle=postgres` and `lc_monetary` as PostgreSQL ships them).
//!
//! Invariant: every function returns `Err` with a one-line message for text it cannot read or a
//! value out of range; nothing here panics or wraps (checked arithmetic throughout).

use num_bigint::BigInt;

const US_PER_DAY: i64 = 86_400_000_000;

fn bad(what: &str, text: &str) -> String {
    let shown: String = text.chars().take(64).collect();
    format!("cannot read {what} value {shown:?}")
}

/// A `numeric` text (`-12.50`, `1e-20` never: PostgreSQL prints plain digits) as an unscaled
/// integer and its scale; `NaN` and the infinities are `None`.
pub fn numeric(text: &str) -> Result<Option<(BigInt, i32)>, String> {
    if matches!(text, "NaN" | "Infinity" | "-Infinity") {
        return Ok(None);
    }
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    let digits = format!("{int}{frac}");
    let unscaled: BigInt = digits.parse().map_err(|_| bad("numeric", text))?;
    let scale = i32::try_from(frac.len()).map_err(|_| bad("numeric", text))?;
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("numeric", text));
    }
    Ok(Some((unscaled, scale)))
}

/// `unscaled × 10^-scale` at scale `to` (only ever widened: PostgreSQL prints a declared scale's
/// digits in full).
pub fn rescale(unscaled: BigInt, scale: i32, to: i32) -> BigInt {
    if to > scale {
        unscaled * BigInt::from(10u8).pow((to - scale) as u32)
    } else {
        unscaled
    }
}

/// Trailing fraction zeros dropped (`10.50` → 105 scale 1, `100` stays 100 scale 0), as
/// Debezium's variable-scale decimal carries a `numeric` without a declared scale.
pub fn strip(mut unscaled: BigInt, mut scale: i32) -> (BigInt, i32) {
    let ten = BigInt::from(10u8);
    while scale > 0 && (&unscaled % &ten) == BigInt::from(0u8) {
        unscaled /= &ten;
        scale -= 1;
    }
    (unscaled, scale)
}

/// A `money` text (`$1,234.50`, `-$1,000.00`) as an unscaled integer at scale 2.
pub fn money(text: &str) -> Result<(BigInt, i32), String> {
    let negative = text.starts_with('-') || text.starts_with('(');
    let plain: String = text.chars().filter(|c| c.is_ascii_digit() || *c == '.').collect();
    let (u, s) = numeric(&plain)?.ok_or_else(|| bad("money", text))?;
    if s > 2 || plain.is_empty() {
        return Err(bad("money", text));
    }
    let u = rescale(u, s, 2);
    Ok((if negative { -u } else { u }, 2))
}

/// Days from 1970-01-01 to a proleptic Gregorian date (year 0 is 1 BC).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
}

/// `YYYY-MM-DD` with an optional ` BC`, as days since the epoch.
pub fn date(text: &str) -> Result<i64, String> {
    let (iso, bc) = match text.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (text, false),
    };
    let mut parts = iso.splitn(3, '-');
    let mut next = |max: i64| -> Option<i64> { parts.next()?.parse::<i64>().ok().filter(|v| (1..=max).contains(v)) };
    let (y, m, d) = match (next(5_874_897), next(12), next(31)) {
        (Some(y), Some(m), Some(d)) => (y, m, d),
        _ => return Err(bad("date", text)),
    };
    Ok(days_from_civil(if bc { 1 - y } else { y }, m, d))
}

/// `HH:MM:SS[.ffffff]` as microseconds (hours may pass 24 in an interval).
pub fn time(text: &str) -> Result<i64, String> {
    let mut parts = text.splitn(3, ':');
    let (h, m, s) = match (parts.next(), parts.next(), parts.next()) {
        (Some(h), Some(m), Some(s)) => (h, m, s),
        _ => return Err(bad("time", text)),
    };
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let num = |v: &str| v.parse::<i64>().ok().filter(|_| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
    let (Some(h), Some(m), Some(secs)) = (num(h), num(m), num(secs)) else {
        return Err(bad("time", text));
    };
    if frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("time", text));
    }
    let micros = format!("{frac:0<6}").parse::<i64>().unwrap_or(0);
    h.checked_mul(3_600_000_000)
        .and_then(|v| v.checked_add(m * 60_000_000 + secs * 1_000_000 + micros))
        .ok_or_else(|| bad("time", text))
}

/// A trailing UTC offset (`+00`, `-05:30`, `+05:30:15`) split off: the text before it and the
/// offset in microseconds east of UTC.
fn offset(text: &str) -> Result<(&str, i64), String> {
    let at = text.rfind(['+', '-']).filter(|i| *i > 0).ok_or_else(|| bad("offset", text))?;
    let (rest, off) = text.split_at(at);
    let sign = if off.starts_with('-') { -1 } else { 1 };
    let mut us = 0i64;
    for (i, part) in off[1..].split(':').enumerate() {
        let v: i64 = part.parse().map_err(|_| bad("offset", text))?;
        us += v * [3_600_000_000, 60_000_000, 1_000_000].get(i).ok_or_else(|| bad("offset", text))?;
    }
    Ok((rest, sign * us))
}

/// A `timetz` as microseconds since midnight UTC.
pub fn timetz(text: &str) -> Result<i64, String> {
    let (t, off) = offset(text)?;
    Ok((time(t)? - off).rem_euclid(US_PER_DAY))
}

/// A `timestamp` (`tz` false) or `timestamptz` as microseconds since the epoch, UTC.
pub fn timestamp(text: &str, tz: bool) -> Result<i64, String> {
    let (body, bc) = match text.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (text, false),
    };
    let (d, rest) = body.split_once(' ').ok_or_else(|| bad("timestamp", text))?;
    let (t, off) = if tz { offset(rest)? } else { (rest, 0) };
    let days = date(&format!("{d}{}", if bc { " BC" } else { "" })).map_err(|_| bad("timestamp", text))?;
    days.checked_mul(US_PER_DAY)
        .and_then(|v| v.checked_add(time(t).ok()?))
        .and_then(|v| v.checked_sub(off))
        .ok_or_else(|| bad("timestamp", text))
}

/// An `interval`'s parts: months (years folded in), days, and microseconds.
pub fn interval(text: &str) -> Result<(i64, i64, i64), String> {
    let (mut months, mut days, mut micros) = (0i64, 0i64, 0i64);
    let mut words = text.split(' ');
    while let Some(w) = words.next() {
        if w.contains(':') {
            let (sign, t) = match w.strip_prefix('-') {
                Some(t) => (-1, t),
                None => (1, w.strip_prefix('+').unwrap_or(w)),
            };
            micros = sign * time(t)?;
            continue;
        }
        let n: i64 = w.parse().map_err(|_| bad("interval", text))?;
        match words.next() {
            Some("year" | "years") => months += n.checked_mul(12).ok_or_else(|| bad("interval", text))?,
            Some("mon" | "mons") => months += n,
            Some("day" | "days") => days = n,
            _ => return Err(bad("interval", text)),
        }
    }
    Ok((months, days, micros))
}

/// A one-dimensional array's elements (`{1,2}`, `{a,"b c",NULL}`), each `None` for NULL.
pub fn array(text: &str) -> Result<Vec<Option<String>>, String> {
    let inner = text.strip_prefix('{').and_then(|t| t.strip_suffix('}')).ok_or_else(|| bad("array", text))?;
    if inner.starts_with('{') {
        return Err(format!("{} is a multi-dimensional array, which outboxd does not place", bad("array", text)));
    }
    let mut out = Vec::new();
    if inner.is_empty() {
        return Ok(out);
    }
    let mut chars = inner.chars().peekable();
    loop {
        if chars.peek() == Some(&'"') {
            chars.next();
            let mut s = String::new();
            loop {
                match chars.next() {
                    Some('\\') => s.push(chars.next().ok_or_else(|| bad("array", text))?),
                    Some('"') => break,
                    Some(c) => s.push(c),
                    None => return Err(bad("array", text)),
                }
            }
            out.push(Some(s));
        } else {
            let s: String = std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect();
            out.push(if s == "NULL" { None } else { Some(s) });
        }
        match chars.next() {
            Some(',') => continue,
            None => return Ok(out),
            Some(_) => return Err(bad("array", text)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_walsender_writes() {
        assert_eq!(numeric("-12.50").unwrap(), Some((BigInt::from(-1250), 2)));
        assert_eq!(numeric("NaN").unwrap(), None);
        assert!(numeric("1x").is_err() && numeric("").is_err());
        assert_eq!(strip(BigInt::from(1050), 2), (BigInt::from(105), 1));
        assert_eq!(strip(BigInt::from(100), 0), (BigInt::from(100), 0));
        assert_eq!(money("-$1,000.00").unwrap(), (BigInt::from(-100000), 2));
        assert_eq!(money("$1,234,567.5").unwrap(), (BigInt::from(123456750), 2));
        assert_eq!(date("2026-01-01").unwrap(), 20454);
        assert_eq!(date("1969-12-31").unwrap(), -1);
        assert_eq!(date("0001-01-01").unwrap(), -719162);
        assert_eq!(date("0001-12-31 BC").unwrap(), -719163);
        assert!(date("2026-13-01").is_err() && date("x").is_err());
        assert_eq!(time("23:59:59.999999").unwrap(), 86_399_999_999);
        assert_eq!(time("00:00:00.5").unwrap(), 500_000);
        assert_eq!(timetz("23:59:59.123456-05:30").unwrap(), time("05:29:59.123456").unwrap());
        assert_eq!(timetz("08:00:00+02").unwrap(), time("06:00:00").unwrap());
        assert_eq!(timestamp("2026-12-05 09:34:36", false).unwrap(), 1_796_463_276_000_000);
        assert_eq!(timestamp("1969-12-31 23:59:59.5", false).unwrap(), -500_000);
        assert_eq!(
            timestamp("2026-12-05 08:00:00.5+02", true).unwrap(),
            timestamp("2026-12-05 06:00:00.5", false).unwrap()
        );
        assert_eq!(interval("1 year 2 mons 3 days 04:05:06.789").unwrap(), (14, 3, 14_706_789_000));
        assert_eq!(interval("-1 days").unwrap(), (0, -1, 0));
        assert_eq!(interval("00:00:00").unwrap(), (0, 0, 0));
        assert_eq!(interval("-1 years -2 mons +3 days -04:05:06").unwrap(), (-14, 3, -14_706_000_000));
        let s = |v: &[Option<&str>]| v.iter().map(|e| e.map(str::to_owned)).collect::<Vec<_>>();
        assert_eq!(array(r#"{a,"b c","d\"e",NULL}"#).unwrap(), s(&[Some("a"), Some("b c"), Some("d\"e"), None]));
        assert_eq!(array("{}").unwrap(), s(&[]));
        assert!(array("{{1},{2}}").is_err() && array("{\"a}").is_err());
    }
}
