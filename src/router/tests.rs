//! Table-driven router tests: rows in, exact records out, one case per option.

use super::render::{BOOL, BYTEA, INT4, JSONB, TEXT, TIMESTAMPTZ};
use super::*;

const UUID: u32 = 2950;
const ID: &str = "0b6b3c1e-0000-4000-8000-000000000001";

/// Our defaults, as `outboxd run` without routing flags has them (shared with `message`'s tests).
pub(super) fn default_route_config() -> RouteConfig {
    cfg()
}

fn cfg() -> RouteConfig {
    RouteConfig {
        id_field: "event_id".into(),
        key_field: "aggregate_id".into(),
        type_field: "event_type".into(),
        payload_field: "payload".into(),
        timestamp_field: Some("created_at".into()),
        placements: Vec::new(),
        additional_missing: MissingPolicy::Error,
        route_by_field: "event_type".into(),
        topic: Arc::new(TopicRule::new("(?<routedByValue>.*)", "${routedByValue}.events").unwrap()),
        tombstone_on_empty_payload: false,
        expand_json_payload: false,
        key_converter: Converter::String,
        value_converter: Converter::String,
        headers_field: HeadersField::IfPresent("headers".into()),
        trace_field: HeadersField::IfPresent("tracingspancontext".into()),
        contracts: None,
        mapping: Default::default(),
    }
}

/// The sql/ schema plus a few extra columns for placements.
const COLS: &[(&str, u32)] = &[
    ("event_id", UUID),
    ("aggregate_type", TEXT),
    ("aggregate_id", TEXT),
    ("event_type", TEXT),
    ("payload", JSONB),
    ("headers", JSONB),
    ("created_at", TIMESTAMPTZ),
    ("shard", INT4),
    ("urgent", BOOL),
    ("text_payload", TEXT),
    ("blob", BYTEA),
];

fn relation(cols: &[(&str, u32)]) -> Table {
    Table {
        schema: "public".into(),
        name: "outbox".into(),
        columns: cols.iter().map(|(n, t)| Column { name: (*n).into(), type_oid: *t, type_modifier: -1 }).collect(),
    }
}

/// The row as the WAL source hands it over: a view of one buffer ([`Row::packed`]).
fn row(overrides: &[(&str, Option<&str>)]) -> Row {
    Row::packed(row_values(overrides))
}

fn row_values(overrides: &[(&str, Option<&str>)]) -> Vec<Value> {
    let base: [(&str, Option<&str>); 11] = [
        ("event_id", Some(ID)),
        ("aggregate_type", Some("order")),
        ("aggregate_id", Some("42")),
        ("event_type", Some("order.paid.v1")),
        ("payload", Some(r#"{"total": 10.50, "x": "é"}"#)),
        ("headers", Some(r#"{"traceId": "abc", "attempt": 2, "nested": {"a": [1]}}"#)),
        ("created_at", Some("2026-12-02 10:49:10.123456+00")),
        ("shard", Some("2")),
        ("urgent", Some("t")),
        ("text_payload", Some(r#"{ "spaced" : true }"#)),
        ("blob", Some("\\x00ff")),
    ];
    base.iter()
        .map(|(name, v)| {
            let v = overrides.iter().find(|(n, _)| n == name).map_or(*v, |(_, o)| *o);
            match v {
                Some(s) => Value::Text(Bytes::copy_from_slice(s.as_bytes())),
                None => Value::Null,
            }
        })
        .collect()
}

/// Column values replacing the defaults of [`row`]; `None` is NULL.
type Overrides<'a> = &'a [(&'a str, Option<&'a str>)];

// Tests compare whole results; the size of a bad event does not matter here.
#[allow(clippy::result_large_err)]
fn route_with(c: &RouteConfig, overrides: Overrides<'_>) -> Result<Record, BadEvent> {
    let r = Route::compile(c, &relation(COLS)).unwrap();
    r.route(OutboxRow { tuple: &row(overrides), commit_time_us: 1_000_000 })
}

fn h(rec: &Record) -> Vec<(&str, String)> {
    rec.headers.iter().map(|(k, v)| (&**k, String::from_utf8_lossy(v).into_owned())).collect()
}

#[test]
fn defaults_route_like_the_event_router() {
    let rec = route_with(&cfg(), &[]).unwrap();
    assert_eq!(rec.topic, "order.paid.v1.events");
    assert_eq!(rec.key.as_deref(), Some(&b"42"[..]));
    assert_eq!(rec.payload.as_deref(), Some(r#"{"total": 10.50, "x": "é"}"#.as_bytes()));
    assert_eq!(rec.timestamp_ms, Some(1_796_208_550_123));
    assert_eq!(rec.partition, None);
    // `id` first, then the expanded headers column: strings as text, others as JSON.
    assert_eq!(
        h(&rec),
        vec![
            ("id", ID.to_owned()),
            ("attempt", "2".into()),
            ("nested", r#"{"a":[1]}"#.into()),
            ("traceId", "abc".into())
        ]
    );
}

#[test]
fn table_of_options() {
    type Tweak = fn(&mut RouteConfig);
    type Check = fn(&Record);
    let cases: Vec<(&str, Tweak, Overrides<'_>, Check)> = vec![
        ("key NULL means no key", |_| {}, &[("aggregate_id", None)], |r| assert_eq!(r.key, None)),
        (
            "key from another column",
            |c| c.key_field = "aggregate_type".into(),
            &[],
            |r| assert_eq!(r.key.as_deref(), Some(&b"order"[..])),
        ),
        (
            "route by another column, Debezium replacement",
            |c| {
                c.route_by_field = "aggregate_type".into();
                c.topic = Arc::new(TopicRule::new("(?<routedByValue>.*)", "outbox.event.${routedByValue}").unwrap());
            },
            &[],
            |r| assert_eq!(r.topic, "outbox.event.order"),
        ),
        (
            "regex groups",
            |c| c.topic = Arc::new(TopicRule::new(r"(?<agg>[a-z]+)\.(?<act>[a-z]+)\.(v\d+)", "${agg}-$3").unwrap()),
            &[],
            |r| assert_eq!(r.topic, "order-v1"),
        ),
        (
            "regex that does not match leaves the plain value",
            |c| c.topic = Arc::new(TopicRule::new(r"(?<agg>[0-9]+)", "n.${agg}").unwrap()),
            &[],
            |r| assert_eq!(r.topic, "order.paid.v1"),
        ),
        (
            "timestamp empty means commit time",
            |c| c.timestamp_field = None,
            &[],
            |r| assert_eq!(r.timestamp_ms, Some(946_684_801_000)),
        ),
        (
            "NULL timestamp falls back to commit time",
            |_| {},
            &[("created_at", None)],
            |r| assert_eq!(r.timestamp_ms, Some(946_684_801_000)),
        ),
        (
            "NULL payload is a null value with headers",
            |_| {},
            &[("payload", None)],
            |r| {
                assert_eq!(r.payload, None);
                assert_eq!(r.headers[0].0, "id");
            },
        ),
        (
            "tombstone option leaves real payloads alone",
            |c| c.tombstone_on_empty_payload = true,
            &[],
            |r| assert!(r.payload.is_some()),
        ),
        (
            "text payload passes through as bytes",
            |c| c.payload_field = "text_payload".into(),
            &[],
            |r| assert_eq!(r.payload.as_deref(), Some(&br#"{ "spaced" : true }"#[..])),
        ),
        (
            "expand json payload re-serializes text",
            |c| {
                c.payload_field = "text_payload".into();
                c.expand_json_payload = true;
            },
            &[],
            |r| assert_eq!(r.payload.as_deref(), Some(&br#"{"spaced":true}"#[..])),
        ),
        (
            "expand json payload passes non-JSON text through",
            |c| {
                c.payload_field = "text_payload".into();
                c.expand_json_payload = true;
            },
            &[("text_payload", Some("not json"))],
            |r| assert_eq!(r.payload.as_deref(), Some(&b"not json"[..])),
        ),
        (
            "expand json payload leaves jsonb bytes exact",
            |c| c.expand_json_payload = true,
            &[],
            |r| assert_eq!(r.payload.as_deref(), Some(r#"{"total": 10.50, "x": "é"}"#.as_bytes())),
        ),
        (
            "bytea payload is raw bytes",
            |c| c.payload_field = "blob".into(),
            &[],
            |r| assert_eq!(r.payload.as_deref(), Some(&[0u8, 255][..])),
        ),
        (
            "header placements with aliases and rendering",
            |c| {
                c.placements = Placement::parse_list(
                    "aggregate_type:header,event_type:header:eventType,urgent:header:urgent,created_at:header:at,event_id:header:eid",
                )
                .unwrap()
            },
            &[],
            |r| {
                let hs = h(r);
                assert!(hs.contains(&("aggregate_type", "order".into())), "{hs:?}");
                assert!(hs.contains(&("eventType", "order.paid.v1".into())));
                assert!(hs.contains(&("urgent", "true".into())));
                assert!(hs.contains(&("at", "2026-12-02T10:49:10.123456Z".into())));
                assert!(hs.contains(&("eid", ID.into())));
            },
        ),
        (
            "envelope placement wraps the payload",
            |c| {
                c.placements =
                    Placement::parse_list("event_type:envelope:type,shard:envelope,urgent:envelope:u").unwrap()
            },
            &[],
            |r| {
                let v: serde_json::Value = serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap();
                assert_eq!(v["type"], "order.paid.v1");
                assert_eq!(v["shard"], 2);
                assert_eq!(v["u"], true);
                assert_eq!(v["payload"]["x"], "é");
            },
        ),
        (
            "partition placement",
            |c| c.placements = Placement::parse_list("shard:partition").unwrap(),
            &[],
            |r| assert_eq!(r.partition, Some(2)),
        ),
        (
            "headers column disabled",
            |c| c.headers_field = HeadersField::Disabled,
            &[],
            |r| assert_eq!(h(r), vec![("id", ID.to_owned())]),
        ),
        ("headers column NULL", |_| {}, &[("headers", None)], |r| assert_eq!(r.headers.len(), 1)),
        (
            "header values may hold newlines",
            |_| {},
            &[("headers", Some(r#"{"note": "a\nb"}"#))],
            |r| assert_eq!(h(r)[1], ("note", "a\nb".to_owned())),
        ),
    ];
    for (name, tweak, overrides, check) in cases {
        let mut c = cfg();
        tweak(&mut c);
        let rec = route_with(&c, overrides).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        check(&rec);
    }
}

#[test]
fn bad_events_carry_reason_and_salvage() {
    let cases: Vec<(Overrides<'_>, &str)> = vec![
        (&[("event_type", None)], "null_route"),
        (&[("event_id", None)], "null_id"),
        (&[("event_type", Some("bad topic!"))], "invalid_topic"),
        (&[("created_at", Some("yesterday"))], "bad_value"),
        (&[("headers", Some("[1, 2]"))], "invalid_json"),
    ];
    for (overrides, code) in cases {
        let e = route_with(&cfg(), overrides).unwrap_err();
        assert_eq!(e.code, code, "{e:?}");
        if code != "null_id" {
            assert_eq!(e.event_id.as_deref(), Some(ID));
        }
        assert_eq!(e.key.as_deref(), Some(&b"42"[..]), "key salvaged for the DLQ");
        assert!(e.payload.is_some(), "payload salvaged for the DLQ");
        assert!(e.into_definite().to_string().contains(if code == "null_id" { "(unknown)" } else { ID }));
    }
    let mut c = cfg();
    c.placements = Placement::parse_list("aggregate_type:partition").unwrap();
    assert_eq!(route_with(&c, &[]).unwrap_err().code, "bad_value");
}

#[test]
fn missing_columns() {
    let e = Route::compile(&cfg(), &relation(&[("event_id", UUID), ("aggregate_id", TEXT), ("payload", JSONB)]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"event_type\"") && e.contains("--route-by-field"), "{e}");
    let mut c = cfg();
    c.placements = Placement::parse_list("nope:header").unwrap();
    let e = Route::compile(&c, &relation(COLS)).unwrap_err().to_string();
    assert!(e.contains("\"nope\"") && e.contains("--table-field-additional-missing ignore"), "{e}");
    c.additional_missing = MissingPolicy::Ignore;
    assert!(Route::compile(&c, &relation(COLS)).is_ok());
    c.headers_field = HeadersField::Required("hdrs".into());
    assert!(Route::compile(&c, &relation(COLS)).unwrap_err().to_string().contains("--table-field-event-headers"));
    // The default headers column is optional.
    let without: Vec<(&str, u32)> = COLS.iter().copied().filter(|(n, _)| *n != "headers").collect();
    assert!(Route::compile(&cfg(), &relation(&without)).is_ok());
}

#[test]
fn placement_syntax() {
    assert_eq!(
        Placement::parse_list("a:header, b:envelope:x ,c:partition").unwrap(),
        vec![
            Placement { column: "a".into(), target: PlacementTarget::Header("a".into()) },
            Placement { column: "b".into(), target: PlacementTarget::Envelope("x".into()) },
            Placement { column: "c".into(), target: PlacementTarget::Partition },
        ]
    );
    for bad in ["a", "a:nowhere", "a:partition:x", ":header", "a:header:"] {
        assert!(Placement::parse_list(bad).is_err(), "{bad}");
    }
    // An empty value or entry is a configuration error, as in Debezium (no placements is the flag
    // left out); the message says what to do.
    for (bad, says) in [
        ("", "leave the flag out"),
        ("  ", "leave the flag out"),
        ("a:header,,b:header", "empty entry"),
        ("a:header,", "empty entry"),
        ("a:header,,", "empty entry"),
        (",a:header", "empty entry"),
        ("a:header, ,b:header", "empty entry"),
    ] {
        let e = Placement::parse_list(bad).unwrap_err();
        assert!(e.contains(says), "{bad:?}: {e}");
    }
}

/// Row data never panics the router: every unreadable or out-of-range timestamp, wherever it is
/// used, is a `bad_value` event with the row salvaged for the dead-letter topic.
#[test]
fn out_of_range_timestamps_are_bad_events() {
    const FAR: &str = "99999999999999999-01-01 00:00:00+00";
    let text_ts: Vec<(&str, u32)> =
        COLS.iter().map(|&(n, t)| if n == "created_at" { (n, TEXT) } else { (n, t) }).collect();
    type Tweak = fn(&mut RouteConfig);
    type Columns<'a> = &'a [(&'a str, u32)];
    let cases: Vec<(&str, Columns<'_>, Tweak, &str, &str)> = vec![
        ("far-future timestamptz", COLS, |_| {}, FAR, "cannot read timestamp"),
        ("far-future text timestamp", &text_ts, |_| {}, FAR, "cannot read timestamp"),
        ("year past 9999", COLS, |_| {}, "294276-12-31 23:59:59+00", "cannot read timestamp"),
        ("offset past the edge", COLS, |_| {}, "9999-12-31 23:00:00-05", "out of range"),
        ("text without offset", &text_ts, |_| {}, "2026-12-02 10:49:10", "no UTC offset"),
        (
            "header placement of a far-future timestamp",
            COLS,
            |c| {
                c.timestamp_field = None;
                c.placements = Placement::parse_list("created_at:header").unwrap();
            },
            FAR,
            "cannot read timestamp",
        ),
        (
            "envelope placement of a far-future timestamp",
            COLS,
            |c| {
                c.timestamp_field = None;
                c.placements = Placement::parse_list("created_at:envelope").unwrap();
            },
            FAR,
            "cannot read timestamp",
        ),
        (
            "route by a far-future timestamp",
            COLS,
            |c| c.route_by_field = "created_at".into(),
            FAR,
            "cannot read timestamp",
        ),
    ];
    for (name, cols, tweak, value, want) in cases {
        let mut c = cfg();
        tweak(&mut c);
        let r = Route::compile(&c, &relation(cols)).unwrap();
        let e = r.route(OutboxRow { tuple: &row(&[("created_at", Some(value))]), commit_time_us: 0 }).unwrap_err();
        assert_eq!(e.code, "bad_value", "{name}: {e:?}");
        assert!(e.message.contains(want), "{name}: {}", e.message);
        assert_eq!((e.event_id.as_deref(), e.key.as_deref()), (Some(ID), Some(&b"42"[..])), "{name}: salvage");
    }
    // An instant before 1970 is no record timestamp (`invalid_timestamp`, salvaged like the
    // others); one inside the millisecond before the epoch truncates to 0, as Debezium's does.
    for before in ["0044-03-15 12:00:00+00 BC", "1969-12-31 23:59:59.999+00", "1960-01-01 00:00:00+00"] {
        let e = route_with(&cfg(), &[("created_at", Some(before))]).unwrap_err();
        assert_eq!((e.code, e.event_id.as_deref()), ("invalid_timestamp", Some(ID)), "{before}: {e:?}");
        assert!(e.message.contains("before 1970-01-01T00:00:00Z"), "{}", e.message);
    }
    let rec = route_with(&cfg(), &[("created_at", Some("1969-12-31 23:59:59.9995+00"))]).unwrap();
    assert_eq!(rec.timestamp_ms, Some(0));
    // As a placed value a BC year is fine.
    let mut c = cfg();
    c.timestamp_field = None;
    c.placements = Placement::parse_list("created_at:header:at").unwrap();
    let rec = route_with(&c, &[("created_at", Some("0044-03-15 12:00:00+00 BC"))]).unwrap();
    assert_eq!(h(&rec).last().unwrap(), &("at", "-0043-03-15T12:00:00.000000Z".to_owned()));
    // `infinity` keeps no timestamp rather than inventing one.
    assert_eq!(route_with(&cfg(), &[("created_at", Some("infinity"))]).unwrap().timestamp_ms, None);
}

/// pgoutput sends text unless asked for binary; a binary or unchanged-TOAST value (a protocol
/// surprise) is a bad event, not a misread.
#[test]
fn binary_and_toast_timestamps_are_bad_events() {
    let r = Route::compile(&cfg(), &relation(COLS)).unwrap();
    let at = COLS.iter().position(|(n, _)| *n == "created_at").unwrap();
    for (v, want) in
        [(Value::Binary(Bytes::from_static(&[0x7f; 8])), "binary format"), (Value::UnchangedToast, "unchanged TOAST")]
    {
        let mut values = row_values(&[]);
        values[at] = v;
        let t = Row::packed(values);
        let e = r.route(OutboxRow { tuple: &t, commit_time_us: 0 }).unwrap_err();
        assert_eq!(e.code, "bad_value");
        assert!(e.message.contains(want), "{}", e.message);
    }
}

/// Debezium's EventRouter builds a tombstone after the headers and placements, so it keeps the
/// `id` header, every `:header` placement and the partition; only the value (and with it the
/// envelope) is null. Its emptiness test is `payload.toString().trim().isEmpty()`.
#[test]
fn tombstones_keep_headers_like_debezium() {
    type Tweak = fn(&mut RouteConfig);
    type Check = fn(&Record);
    let placements: Tweak = |c| {
        c.tombstone_on_empty_payload = true;
        c.placements = Placement::parse_list("event_type:header:eventType,shard:partition,urgent:envelope").unwrap();
    };
    let text_payload: Tweak = |c| {
        c.tombstone_on_empty_payload = true;
        c.payload_field = "text_payload".into();
    };
    fn tombstone(r: &Record) {
        assert_eq!(r.payload, None, "a tombstone");
        assert_eq!(r.key.as_deref(), Some(&b"42"[..]));
        assert_eq!(r.headers[0], ("id".into(), Bytes::from_static(ID.as_bytes())));
    }
    let cases: Vec<(&str, Tweak, Overrides<'_>, Check)> = vec![
        (
            "NULL payload keeps id and the headers column",
            |c| c.tombstone_on_empty_payload = true,
            &[("payload", None)],
            |r| {
                tombstone(r);
                assert_eq!(h(r).iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["id", "attempt", "nested", "traceId"]);
            },
        ),
        (
            "NULL payload keeps header placements and the partition, drops the envelope",
            placements,
            &[("payload", None)],
            |r| {
                tombstone(r);
                assert!(h(r).contains(&("eventType", "order.paid.v1".into())), "{:?}", h(r));
                assert_eq!(r.partition, Some(2));
            },
        ),
        ("empty text payload", text_payload, &[("text_payload", Some(""))], tombstone),
        ("whitespace-only text payload (Java trim)", text_payload, &[("text_payload", Some(" \t\r\n"))], tombstone),
        ("text payload with content", text_payload, &[("text_payload", Some(" x "))], |r| {
            assert_eq!(r.payload.as_deref(), Some(&b" x "[..]))
        }),
        (
            "empty bytea is a value, not a tombstone (a byte array's toString is never empty)",
            |c| {
                c.tombstone_on_empty_payload = true;
                c.payload_field = "blob".into();
            },
            &[("blob", Some("\\x"))],
            |r| assert_eq!(r.payload.as_deref(), Some(&b""[..])),
        ),
        (
            "without the option a NULL payload is a null value with the same headers",
            |c| c.placements = Placement::parse_list("event_type:header:eventType").unwrap(),
            &[("payload", None)],
            |r| {
                assert_eq!(r.payload, None);
                assert_eq!(h(r).last().unwrap(), &("eventType", "order.paid.v1".to_owned()));
            },
        ),
    ];
    for (name, tweak, overrides, check) in cases {
        let mut c = cfg();
        tweak(&mut c);
        let rec = route_with(&c, overrides).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        eprintln!("case: {name}");
        check(&rec);
    }
}

/// With `table.field.additional.missing=ignore`, Debezium decides "envelope or bare payload" from
/// the configuration: a configured `:envelope` placement whose column is missing still yields
/// `{"payload": …}`, so every record on a topic has one shape.
#[test]
fn missing_envelope_column_still_yields_an_envelope() {
    let cases: &[(&str, &str, serde_json::Value)] = &[
        ("only envelope column missing", "nope:envelope", serde_json::json!({"payload": {"total": 10.50, "x": "é"}})),
        (
            "one of two envelope columns missing",
            "nope:envelope,shard:envelope:s",
            serde_json::json!({"payload": {"total": 10.50, "x": "é"}, "s": 2}),
        ),
        ("missing header column: bare payload", "nope:header", serde_json::json!({"total": 10.50, "x": "é"})),
    ];
    for (name, placements, want) in cases {
        let mut c = cfg();
        c.additional_missing = MissingPolicy::Ignore;
        c.placements = Placement::parse_list(placements).unwrap();
        let rec = route_with(&c, &[]).unwrap();
        let got: serde_json::Value = serde_json::from_slice(rec.payload.as_deref().unwrap()).unwrap();
        assert_eq!(&got, want, "{name}");
    }
    // A NULL payload inside an envelope is `"payload": null`.
    let mut c = cfg();
    c.additional_missing = MissingPolicy::Ignore;
    c.placements = Placement::parse_list("nope:envelope").unwrap();
    let rec = route_with(&c, &[("payload", None)]).unwrap();
    assert_eq!(rec.payload.as_deref(), Some(&br#"{"payload":null}"#[..]));
}

/// `cfg()` with `--schema-dir` holding `files`, under `missing`.
fn with_contracts(files: &[(&str, &str)], missing: contract::SchemaMissing) -> (tempfile::TempDir, RouteConfig) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let mut c = cfg();
    c.contracts = Some(Contracts::load(dir.path(), missing).unwrap());
    (dir, c)
}

#[test]
fn a_payload_that_keeps_its_contract_routes_unchanged() {
    use contract::SchemaMissing::Reject;
    let schema = r#"{"type": "object", "required": ["total"], "properties": {"total": {"type": "number"}}}"#;
    let (_d, mut c) = with_contracts(&[("order.paid.v1.json", schema)], Reject);
    assert_eq!(route_with(&c, &[]).unwrap(), route_with(&cfg(), &[]).unwrap());
    // The schema applies to the payload column as written, not to the envelope around it.
    c.placements = Placement::parse_list("aggregate_type:envelope:type").unwrap();
    let rec = route_with(&c, &[]).unwrap();
    let value = String::from_utf8_lossy(rec.payload.as_deref().unwrap()).into_owned();
    assert_eq!(value, r#"{"payload":{"total":10.5,"x":"é"},"type":"order"}"#);
}

#[test]
fn a_payload_that_breaks_its_contract_is_a_bad_event_with_the_whole_record() {
    use contract::SchemaMissing::Allow;
    let schema = r#"{"type": "object", "required": ["currency"], "properties": {"total": {"type": "string"}}}"#;
    let (_d, c) = with_contracts(&[("order.paid.v1.json", schema)], Allow);
    let e = route_with(&c, &[]).unwrap_err();
    let good = route_with(&cfg(), &[]).unwrap();
    assert_eq!(e.code, "schema");
    assert!(e.message.contains("at /: \"currency\" is a required property (and 1 more error)"), "{}", e.message);
    assert_eq!((e.event_id.as_deref(), e.topic.as_deref()), (Some(ID), Some("order.paid.v1.events")));
    assert_eq!((&e.key, &e.payload), (&good.key, &good.payload));
    let names: Vec<&str> = e.headers.iter().map(|(k, _)| &**k).collect();
    assert_eq!(names, ["id", "attempt", "nested", "traceId", contract::H_ERRORS]);
    let errors: serde_json::Value = serde_json::from_slice(&e.headers[4].1).unwrap();
    assert_eq!(errors[1]["path"], "/total");
    // Another event type has no schema: allowed.
    assert!(route_with(&c, &[("event_type", Some("order.created.v1"))]).is_ok());
}

#[test]
fn contracts_need_json_payloads_and_an_event_type_column() {
    use contract::SchemaMissing::{Allow, Reject};
    let (_d, mut c) = with_contracts(&[("order.paid.v1.json", "{}")], Allow);
    c.payload_field = "blob".into();
    let e = route_with(&c, &[]).unwrap_err();
    assert_eq!(e.code, "schema");
    assert!(e.message.starts_with("the payload is not JSON"), "{}", e.message);
    assert!(route_with(&c, &[("blob", Some(r#"\x7b7d"#))]).is_ok(), "bytea holding {{}} is JSON");
    // Tombstones carry no payload to check.
    c.tombstone_on_empty_payload = true;
    assert_eq!(route_with(&c, &[("blob", None)]).unwrap().payload, None);
    let (_d, c) = with_contracts(&[], Reject);
    assert_eq!(route_with(&c, &[]).unwrap_err().code, "schema");
    let e = route_with(&c, &[("event_type", None)]).unwrap_err();
    assert_eq!(e.code, "null_route", "the route-by column is the type column here");
    let without: Vec<(&str, u32)> = COLS.iter().copied().filter(|(n, _)| *n != "event_type").collect();
    let mut c = c;
    c.route_by_field = "aggregate_type".into();
    let e = Route::compile(&c, &relation(&without)).unwrap_err().to_string();
    assert!(e.contains("\"event_type\"") && e.contains("--schema-dir"), "{e}");
}

#[test]
fn an_envelope_under_the_json_converter_is_debeziums_struct_as_json() {
    let mut c = cfg();
    c.value_converter = Converter::Json;
    c.placements = Placement::parse_list(
        "event_type:envelope:type,shard:envelope,urgent:envelope:u,blob:envelope,aggregate_type:envelope:\"q\"",
    )
    .unwrap();
    let route = Route::compile(&c, &relation(COLS)).unwrap();
    let out = |overrides: Overrides<'_>| {
        let rec = route.route(OutboxRow { tuple: &row(overrides), commit_time_us: 1_000_000 }).unwrap();
        String::from_utf8(route.convert(rec).payload.unwrap().to_vec()).unwrap()
    };
    // The payload first (jsonb as a JSON string, Jackson's escapes), then the placements in their
    // order, each typed as Debezium types its column; the conversion leaves it as it is.
    assert_eq!(
        out(&[]),
        r#"{"payload":"{\"total\": 10.50, \"x\": \"é\"}","type":"order.paid.v1","shard":2,"u":true,"blob":"AP8=","\"q\"":"order"}"#
    );
    assert_eq!(
        out(&[("payload", None), ("shard", None), ("blob", None)]),
        r#"{"payload":null,"type":"order.paid.v1","shard":null,"u":true,"blob":null,"\"q\"":"order"}"#
    );
    // A timestamptz in the envelope is Debezium's ZonedTimestamp string (router::placed).
    c.placements = Placement::parse_list("created_at:envelope").unwrap();
    let route = Route::compile(&c, &relation(COLS)).unwrap();
    let rec = route.route(OutboxRow { tuple: &row(&[]), commit_time_us: 0 }).unwrap();
    let value = String::from_utf8(route.convert(rec).payload.unwrap().to_vec()).unwrap();
    assert!(value.ends_with(r#","created_at":"2026-12-02T10:49:10.123456Z"}"#), "{value}");
    // A geometric column, which Debezium writes as a struct outboxd does not reproduce, is
    // refused when the table is first seen, naming the column; in a header too.
    let mut cols = COLS.to_vec();
    cols.push(("spot", 600));
    for p in ["spot:envelope", "spot:header"] {
        c.placements = Placement::parse_list(p).unwrap();
        let e = Route::compile(&c, &relation(&cols)).unwrap_err().to_string();
        assert!(e.contains("column \"spot\"") && e.contains("point"), "{e}");
    }
}

/// The trace context column becomes `traceparent` and `tracestate` headers (replacing any from the
/// headers column); a value that is not trace context leaves them out and the event still goes.
#[test]
fn the_trace_context_column_becomes_w3c_headers() {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut c = cfg();
    c.trace_field = HeadersField::Required("text_payload".into());
    let props = format!("#Thu Dec 03 2026\ntraceparent={TP}\ntracestate=rojo\\=1\n");
    let headers = r#"{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01", "k": "v"}"#;
    let rec = route_with(&c, &[("text_payload", Some(&props)), ("headers", Some(headers))]).unwrap();
    let hs = h(&rec);
    assert_eq!(hs.iter().filter(|(k, _)| *k == "traceparent").collect::<Vec<_>>(), [&("traceparent", TP.to_string())]);
    assert!(hs.contains(&("tracestate", "rojo=1".to_string())), "{hs:?}");
    assert!(hs.contains(&("k", "v".to_string())), "{hs:?}");
    let rec = route_with(&c, &[("text_payload", Some("not trace context")), ("headers", Some("{}"))]).unwrap();
    assert!(!h(&rec).iter().any(|(k, _)| k.starts_with("trace")), "{:?}", h(&rec));
    let rec = route_with(&c, &[("text_payload", None)]).unwrap();
    assert!(!h(&rec).iter().any(|(k, _)| *k == "traceparent"));
    // The default column name is used only when the table has it (this one does not).
    assert!(route_with(&cfg(), &[]).is_ok());
    c.trace_field = HeadersField::Required("nope".into());
    assert!(Route::compile(&c, &relation(COLS)).unwrap_err().to_string().contains("--tracing-span-context-field"));
}
