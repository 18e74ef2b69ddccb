//! The router: one outbox row in, one Kafka-shaped [`Record`] out.
//!
//! Pure and synchronous, like Debezium's Outbox EventRouter: topic from the route column through the
//! replacement template, key from the key column, value = the payload column's text exactly as
//! PostgreSQL printed it (jsonb text is already JSON), header `id` from the id column, timestamp
//! from the timestamp column (or the commit time).
//!
//! Column positions are resolved once per [`Relation`] message into a [`Route`], so the per-row
//! work is index lookups. A relation that lacks a configured column is a definite error, raised when
//! the relation arrives rather than on the first row.
//!
//! A row whose route value, key or id is NULL is refused with an error naming its event id: the
//! pipeline must stop there rather than skip it.

use bytes::Bytes;

use crate::config::RouteConfig;
use crate::error::Definite;
use crate::pg::pgoutput::{Relation, TupleData, TupleValue};

const ROUTED_BY_VALUE: &str = "${routedByValue}";

/// One event, ready for a sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub key: Option<Bytes>,
    /// `None` is a tombstone (NULL payload).
    pub payload: Option<Bytes>,
    pub headers: Vec<(String, Bytes)>,
    pub timestamp_ms: Option<i64>,
    /// For error messages and logs.
    pub event_id: String,
}

/// One inserted row of the outbox table with the context the router needs.
#[derive(Clone, Copy, Debug)]
pub struct OutboxRow<'a> {
    pub tuple: &'a TupleData,
    /// Commit time of the row's transaction, µs since 2000-01-01 UTC.
    pub commit_time_us: i64,
}

/// Column positions for one version of the outbox relation.
#[derive(Clone, Debug)]
pub struct Route {
    route_by: usize,
    key: usize,
    id: usize,
    payload: usize,
    timestamp: Option<usize>,
    template: String,
}

/// Refuse templates that name a group we do not define.
pub fn check_template(template: &str) -> Result<(), String> {
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed ${{ in {template:?}"))?;
        let name = &after[..end];
        if name != "routedByValue" {
            return Err(format!(
                "{template:?} uses group ${{{name}}}, but the only group defined is ${{routedByValue}}"
            ));
        }
        rest = &after[end + 1..];
    }
    Ok(())
}

impl Route {
    /// Resolve the configured columns against a Relation message.
    pub fn compile(cfg: &RouteConfig, rel: &Relation) -> Result<Route, Definite> {
        let find = |col: &str, flag: &str| {
            rel.columns.iter().position(|c| c.name == col).ok_or_else(|| {
                Definite::Setup(format!(
                    "table {}.{} has no column {col:?} (set by {flag}); add the column or change the flag",
                    rel.namespace, rel.name
                ))
            })
        };
        Ok(Route {
            route_by: find(&cfg.route_by_field, "--route-by-field")?,
            key: find(&cfg.key_field, "--table-field-event-key")?,
            id: find(&cfg.id_field, "--table-field-event-id")?,
            payload: find(&cfg.payload_field, "--table-field-event-payload")?,
            timestamp: match &cfg.timestamp_field {
                Some(c) => Some(find(c, "--table-field-event-timestamp")?),
                None => None,
            },
            template: cfg.topic_replacement.clone(),
        })
    }

    /// Turn one inserted row into a record.
    pub fn route(&self, row: OutboxRow<'_>) -> Result<Record, Definite> {
        let cols = &row.tuple.0;
        let text = |i: usize| -> Result<Option<&Bytes>, String> {
            match cols.get(i) {
                Some(TupleValue::Text(b)) => Ok(Some(b)),
                Some(TupleValue::Null) => Ok(None),
                Some(TupleValue::UnchangedToast) => {
                    Err(format!("column {i} arrived as an unchanged TOAST value"))
                }
                Some(TupleValue::Binary(_)) => Err(format!("column {i} arrived in binary format")),
                None => Err(format!(
                    "row has {} columns, expected at least {}",
                    cols.len(),
                    i + 1
                )),
            }
        };
        // The id first, so every later error can name the event.
        let id = text(self.id).map_err(|reason| Definite::Route {
            event_id: "?".into(),
            reason,
        })?;
        let event_id = match id {
            Some(b) => String::from_utf8_lossy(b).into_owned(),
            None => {
                return Err(Definite::Route {
                    event_id: "(NULL)".into(),
                    reason: "the event id column is NULL".into(),
                })
            }
        };
        let fail = |reason: String| Definite::Route {
            event_id: event_id.clone(),
            reason,
        };
        let routed = text(self.route_by)
            .map_err(fail)?
            .ok_or_else(|| fail("the route-by column is NULL".into()))?;
        let routed = std::str::from_utf8(routed)
            .map_err(|_| fail("the route-by value is not UTF-8".into()))?;
        let topic = self.template.replace(ROUTED_BY_VALUE, routed);
        check_topic(&topic).map_err(fail)?;
        let key = text(self.key)
            .map_err(fail)?
            .ok_or_else(|| fail("the key column is NULL".into()))?
            .clone();
        let payload = text(self.payload).map_err(fail)?.cloned();
        let timestamp_ms = match self.timestamp {
            Some(i) => match text(i).map_err(fail)? {
                Some(b) => parse_timestamptz_ms(b).map_err(fail)?,
                None => Some(pg_us_to_unix_ms(row.commit_time_us)),
            },
            None => Some(pg_us_to_unix_ms(row.commit_time_us)),
        };
        let headers = vec![("id".to_owned(), Bytes::copy_from_slice(event_id.as_bytes()))];
        Ok(Record {
            topic,
            key: Some(key),
            payload,
            headers,
            timestamp_ms,
            event_id,
        })
    }
}

/// Kafka's topic rules: 1-249 of `[A-Za-z0-9._-]`, and not `.` or `..`.
fn check_topic(t: &str) -> Result<(), String> {
    let ok = !t.is_empty()
        && t.len() <= 249
        && t != "."
        && t != ".."
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "topic {t:?} is not a legal Kafka topic name (1-249 of A-Z a-z 0-9 . _ -)"
        ))
    }
}

/// µs between 1970-01-01 and 2000-01-01.
const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;

pub fn pg_us_to_unix_ms(us: i64) -> i64 {
    us.saturating_add(PG_EPOCH_OFFSET_US).div_euclid(1000)
}

/// Parse `timestamptz` text in ISO DateStyle (`2026-12-02 10:49:10.123456+00`, offsets may be
/// `+05:30` or `-03:30:12`). `infinity` values give `None` (the record keeps no timestamp).
fn parse_timestamptz_ms(b: &[u8]) -> Result<Option<i64>, String> {
    let s = std::str::from_utf8(b).map_err(|_| "timestamp is not UTF-8".to_owned())?;
    if s == "infinity" || s == "-infinity" {
        return Ok(None);
    }
    let bad = || {
        format!("cannot read timestamp {s:?}; expected ISO format like 2026-12-02 10:49:10.5+00")
    };
    let num = |t: &str| -> Result<i64, String> {
        if t.is_empty() || !t.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        t.parse::<i64>().map_err(|_| bad())
    };
    let (date, rest) = s.split_once(' ').ok_or_else(bad)?;
    let mut d = date.splitn(3, '-');
    let (y, mo, da) = (
        num(d.next().ok_or_else(bad)?)?,
        num(d.next().ok_or_else(bad)?)?,
        num(d.next().ok_or_else(bad)?)?,
    );
    let sign_at = rest.find(['+', '-']).ok_or_else(bad)?;
    let (time, offset) = rest.split_at(sign_at);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':');
    let (h, mi, se) = (
        num(t.next().ok_or_else(bad)?)?,
        num(t.next().ok_or_else(bad)?)?,
        num(t.next().ok_or_else(bad)?)?,
    );
    let millis = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().chain("000".chars()).take(3).collect();
        num(&frac[..frac.len()])?;
        num(&digits)?
    };
    let neg = offset.starts_with('-');
    let mut o = offset[1..].splitn(3, ':');
    let oh = num(o.next().ok_or_else(bad)?)?;
    let om = o.next().map(num).transpose()?.unwrap_or(0);
    let os = o.next().map(num).transpose()?.unwrap_or(0);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&da) || h > 24 || mi > 59 || se > 60 {
        return Err(bad());
    }
    let off_s = (oh * 3600 + om * 60 + os) * if neg { -1 } else { 1 };
    let days = days_from_civil(y, mo, da);
    let secs = days * 86_400 + h * 3600 + mi * 60 + se - off_s;
    Ok(Some(secs * 1000 + millis))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::pgoutput::Column;

    fn cfg() -> RouteConfig {
        RouteConfig {
            route_by_field: "event_type".into(),
            topic_replacement: "${routedByValue}.events".into(),
            key_field: "aggregate_id".into(),
            id_field: "event_id".into(),
            payload_field: "payload".into(),
            timestamp_field: Some("created_at".into()),
        }
    }

    fn relation(cols: &[&str]) -> Relation {
        Relation {
            xid: None,
            id: 1,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: cols
                .iter()
                .map(|n| Column {
                    flags: 0,
                    name: (*n).into(),
                    type_oid: 25,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    const COLS: [&str; 7] = [
        "event_id",
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "payload",
        "headers",
        "created_at",
    ];

    fn row(vals: [Option<&str>; 7]) -> TupleData {
        TupleData(
            vals.iter()
                .map(|v| match v {
                    Some(s) => TupleValue::Text(Bytes::copy_from_slice(s.as_bytes())),
                    None => TupleValue::Null,
                })
                .collect(),
        )
    }

    fn good() -> [Option<&'static str>; 7] {
        [
            Some("0b6b3c1e-0000-4000-8000-000000000001"),
            Some("order"),
            Some("42"),
            Some("order.paid.v1"),
            Some(r#"{"total": 10.50, "x": "é"}"#),
            Some("{}"),
            Some("2026-12-02 10:49:10.123456+00"),
        ]
    }

    #[test]
    fn routes_like_the_event_router() {
        let r = Route::compile(&cfg(), &relation(&COLS)).unwrap();
        let t = row(good());
        let rec = r
            .route(OutboxRow {
                tuple: &t,
                commit_time_us: 0,
            })
            .unwrap();
        assert_eq!(rec.topic, "order.paid.v1.events");
        assert_eq!(rec.key.as_deref(), Some(&b"42"[..]));
        assert_eq!(
            rec.payload.as_deref(),
            Some(r#"{"total": 10.50, "x": "é"}"#.as_bytes())
        );
        assert_eq!(
            rec.headers,
            vec![(
                "id".to_owned(),
                Bytes::from_static(b"0b6b3c1e-0000-4000-8000-000000000001")
            )]
        );
        assert_eq!(rec.timestamp_ms, Some(1_796_208_550_123));
    }

    #[test]
    fn table_of_failures_names_the_event() {
        let r = Route::compile(&cfg(), &relation(&COLS)).unwrap();
        let cases: [(usize, Option<&str>, &str); 4] = [
            (3, None, "route-by column is NULL"),
            (2, None, "key column is NULL"),
            (3, Some("bad topic!"), "not a legal Kafka topic"),
            (6, Some("yesterday"), "cannot read timestamp"),
        ];
        for (col, val, want) in cases {
            let mut v = good();
            v[col] = val;
            let t = row(v);
            let e = r
                .route(OutboxRow {
                    tuple: &t,
                    commit_time_us: 0,
                })
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(want) && e.contains("0b6b3c1e-0000-4000-8000-000000000001"),
                "{e}"
            );
        }
        let mut v = good();
        v[0] = None;
        let t = row(v);
        assert!(r
            .route(OutboxRow {
                tuple: &t,
                commit_time_us: 0
            })
            .unwrap_err()
            .to_string()
            .contains("NULL"));
    }

    #[test]
    fn null_payload_is_a_tombstone_and_null_timestamp_uses_commit_time() {
        let r = Route::compile(&cfg(), &relation(&COLS)).unwrap();
        let mut v = good();
        v[4] = None;
        v[6] = None;
        let t = row(v);
        let rec = r
            .route(OutboxRow {
                tuple: &t,
                commit_time_us: 1_000_000,
            })
            .unwrap();
        assert_eq!(rec.payload, None);
        assert_eq!(rec.timestamp_ms, Some(946_684_801_000));
    }

    #[test]
    fn missing_columns_fail_at_compile() {
        let e = Route::compile(
            &cfg(),
            &relation(&["event_id", "aggregate_id", "payload", "created_at"]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("\"event_type\"") && e.contains("--route-by-field"),
            "{e}"
        );
    }

    #[test]
    fn templates() {
        assert!(check_template("${routedByValue}.events").is_ok());
        assert!(check_template("static").is_ok());
        let e = check_template("${r}.events").unwrap_err();
        assert!(e.contains("${r}") && e.contains("${routedByValue}"), "{e}");
        assert!(check_template("${oops").is_err());
    }

    #[test]
    fn timestamps() {
        let p = |s: &str| parse_timestamptz_ms(s.as_bytes());
        assert_eq!(p("1970-01-01 00:00:00+00").unwrap(), Some(0));
        assert_eq!(p("1970-01-01 05:30:00.5+05:30").unwrap(), Some(500));
        assert_eq!(
            p("2000-03-01 00:00:00-01").unwrap(),
            Some(951_868_800_000 + 3_600_000)
        );
        assert_eq!(p("infinity").unwrap(), None);
        for s in [
            "",
            "2026-12-02",
            "2026-13-01 00:00:00+00",
            "2026-12-02 10:49:10",
            "a-b-c d:e:f+00",
        ] {
            assert!(p(s).is_err(), "{s}");
        }
    }
}
