//! What `outboxd backfill` re-publishes: its flags checked into a [`Range`] before anything
//! connects. Pure: "now" is an argument.

use jiff::{SignedDuration, Timestamp};

use crate::config::BackfillArgs;
use crate::error::Definite;

/// A validated backfill range. At least one bound is set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    /// `created_at >= since`.
    pub since: Option<Timestamp>,
    /// `created_at < until`.
    pub until: Option<Timestamp>,
    /// `event_id >= from_id`, compared as the column's type.
    pub from_id: Option<String>,
    /// `event_id <= to_id`.
    pub to_id: Option<String>,
    pub batch_size: usize,
}

impl Range {
    pub fn from_args(a: &BackfillArgs, now: Timestamp) -> Result<Range, Definite> {
        let bad = |m: String| Definite::Config(m);
        let since = a.since.as_deref().map(|s| parse_time("--since", s, now)).transpose()?;
        let until = a.until.as_deref().map(|s| parse_time("--until", s, now)).transpose()?;
        if let (Some(s), Some(u)) = (since, until) {
            if s >= u {
                return Err(bad(format!("--since {s} is not before --until {u}: nothing lies between them")));
            }
        }
        let id = |flag: &str, v: &Option<String>| match v.as_deref() {
            Some("") => Err(bad(format!("{flag} is empty; give an event id, or leave the flag out"))),
            other => Ok(other.map(str::to_owned)),
        };
        let from_id = id("--from-event-id", &a.from_event_id)?;
        let to_id = id("--to-event-id", &a.to_event_id)?;
        if since.is_none() && until.is_none() && from_id.is_none() && to_id.is_none() {
            return Err(bad("give a range: --since/--until (created_at) and/or --from-event-id/--to-event-id".into()));
        }
        if a.batch_size == 0 || a.batch_size > 100_000 {
            return Err(bad(format!("--batch-size {} must be between 1 and 100000", a.batch_size)));
        }
        Ok(Range { since, until, from_id, to_id, batch_size: a.batch_size })
    }

    /// Whether a time bound is set: the pages then go in created_at order.
    pub fn by_time(&self) -> bool {
        self.since.is_some() || self.until.is_some()
    }
}

/// RFC 3339 (`2026-12-01T00:00:00Z`, `2026-12-01T01:00:00+01:00`) or a duration back from `now`
/// (`90m`, `36h`, `7d`, `45s`).
fn parse_time(flag: &str, s: &str, now: Timestamp) -> Result<Timestamp, Definite> {
    if let Ok(t) = s.parse::<Timestamp>() {
        return Ok(t);
    }
    let bad = || {
        Definite::Config(format!(
            "{flag} {s:?}: expected an RFC 3339 time like 2026-12-01T00:00:00Z or a duration back from now like 90m, 36h or 7d"
        ))
    };
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (num, unit) = t.split_at(split);
    let n: i64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86_400),
        _ => None,
    }
    .ok_or_else(bad)?;
    now.checked_sub(SignedDuration::from_secs(secs)).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> BackfillArgs {
        use clap::Parser;
        let mut full = vec!["outboxd", "backfill", "--postgres-url", "postgres://u@h/db"];
        full.extend_from_slice(list);
        match crate::config::Cli::try_parse_from(full).unwrap().command {
            crate::config::Command::Backfill(a) => *a,
            _ => unreachable!("backfill"),
        }
    }

    fn now() -> Timestamp {
        "2026-12-03T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn times_and_durations() {
        let r = Range::from_args(&args(&["--since", "90m", "--until", "2026-12-03T13:00:00+01:00"]), now()).unwrap();
        assert_eq!(r.since, Some("2026-12-03T10:30:00Z".parse().unwrap()));
        assert_eq!(r.until, Some("2026-12-03T12:00:00Z".parse().unwrap()));
        assert!(r.by_time());
        let r = Range::from_args(&args(&["--since", "7d"]), now()).unwrap();
        assert_eq!(r.since, Some("2026-11-26T12:00:00Z".parse().unwrap()));
        let r = Range::from_args(&args(&["--from-event-id", "a", "--to-event-id", "b"]), now()).unwrap();
        assert!(!r.by_time());
        assert_eq!((r.from_id.as_deref(), r.to_id.as_deref()), (Some("a"), Some("b")));
    }

    #[test]
    fn refusals_name_the_flag() {
        for (a, needle) in [
            (vec![], "give a range"),
            (vec!["--since", "yesterday"], "--since \"yesterday\""),
            (vec!["--since", "2026-12-01T00:00:00"], "--since"),
            (vec!["--until", "5w"], "--until"),
            (vec!["--since", "1h", "--until", "2h"], "is not before --until"),
            (vec!["--from-event-id", ""], "--from-event-id is empty"),
            (vec!["--since", "1h", "--batch-size", "0"], "--batch-size 0"),
        ] {
            let e = Range::from_args(&args(&a), now()).unwrap_err().to_string();
            assert!(e.contains(needle), "{a:?}: {e}");
        }
    }
}
