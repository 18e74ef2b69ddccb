//! Durations and sizes as flags spell them (`500ms`, `10s`, `64MiB`): one parser each, with the
//! one-line error that names the flag and shows the accepted forms; and the two spellings
//! `outboxd config` prints back (a duration in milliseconds, a value enum by its name). Pure; bounded (a duration is at
//! most a year, a size never overflows).

use std::time::Duration;

use clap::ValueEnum;

use crate::error::Definite;

/// A value enum as its flag spelling (`Dlq` → `dlq`).
pub(crate) fn value_name(v: impl ValueEnum) -> String {
    v.to_possible_value().map(|p| p.get_name().to_owned()).unwrap_or_default()
}

/// A duration as `outboxd config` prints it: whole milliseconds, which every duration flag reads.
pub(crate) fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// `64MiB`, `512KiB`, `1GB`, `1000000`: a byte count, binary (KiB, MiB, GiB) or decimal (KB, MB, GB).
pub fn parse_size(flag: &str, s: &str) -> Result<usize, Definite> {
    let bad = || Definite::Config(format!("{flag} {s:?}: expected a size like 64MiB, 512KiB or 1000000"));
    let (num, unit) = number_and_unit(s);
    let n: usize = num.parse().map_err(|_| bad())?;
    let mult: usize = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(mult).ok_or_else(bad)
}

/// The leading digits of `s` and the rest (a unit), both trimmed.
fn number_and_unit(s: &str) -> (&str, &str) {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    (num, unit.trim())
}

/// The longest duration any flag takes (a year): beyond it clocks overflow, and no setting needs it.
const MAX_DURATION_SECS: u64 = 366 * 24 * 3600;

/// `500ms`, `10s`, `2m`, `1h`; a bare number is seconds; at most a year.
pub fn parse_duration(flag: &str, s: &str) -> Result<Duration, Definite> {
    let bad = || Definite::Config(format!("{flag} {s:?}: expected a duration like 500ms, 10s or 2m"));
    let (num, unit) = number_and_unit(s);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    if d > Duration::from_secs(MAX_DURATION_SECS) {
        return Err(Definite::Config(format!("{flag} {s:?}: at most a year (8784h)")));
    }
    Ok(d)
}
