//! `--value-converter avro` against a real schema registry (Apicurio Registry 3.3.3, in memory,
//! its Confluent-compatible API, started by `scripts/registry`), read back by a stock client:
//! confluent-kafka's AvroDeserializer in `tools/registry/consume.py`, which fetches each writer
//! schema by the id in the record's Confluent header.
//!
//! * Round trip: rows whose JSON payloads fit the subject's schema arrive as Avro that decodes to
//!   the same values; a payload that does not fit, and a topic whose subject has no schema, are
//!   bad events (dead-lettered with the reason, the original JSON kept), and the rows after them
//!   flow. Basic auth on the registry, with the password from a file that never shows in the log.
//! * Outage: with the registry unreachable (a proxy in front of it pointed at a closed port), the
//!   session stops before the event that needs a schema: the slot is never confirmed past it;
//!   once the registry answers again, it is delivered, encoded, and nothing is lost.
//! * Schema files: `--schema-dir` Avro and JSON Schema files per event type, registered on first
//!   use (`--schema-auto-register`) or looked up, under the subjects `--subject-name-strategy`
//!   names; a file the subject's compatibility rule refuses, and one not registered, are bad
//!   events; keys written as registry strings (`--key-format avro|json-schema`).

mod common;

use std::time::{Duration, Instant};

use common::netfault::FreezeProxy;
use common::registry::Registry;
use common::*;

const ORDER: &str = r#"{"type":"record","name":"OrderPlaced","namespace":"shop.v1","fields":[
  {"name":"order_id","type":"string"},
  {"name":"amount_cents","type":"long"},
  {"name":"items","type":{"type":"array","items":"string"}},
  {"name":"note","type":["null","string"],"default":null}]}"#;

fn insert(pg: &PgCluster, agg: &str, event_type: &str, payload: &str) -> String {
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('shop', '{agg}', '{event_type}', '{payload}') RETURNING event_id"
    ))
}

fn drained(pg: &PgCluster, d: &Outboxd) {
    let end = pg.current_lsn();
    if let Err(e) = pg.slot_reaches_idle_wal_end(&end, Duration::from_secs(30), Duration::from_secs(120)) {
        panic!("{e}\n{}", d.log());
    }
}

/// A private PostgreSQL, Kafka broker and registry with `schema` (of `kind`) registered for
/// `order.placed.v1.events`, and outboxd writing `converter` values; the schema's id.
struct Scene {
    pg: PgCluster,
    broker: Broker,
    reg: Registry,
    d: Outboxd,
    id: u32,
}

fn scene(kind: &str, schema: &str, converter: &str) -> Scene {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let reg = Registry::start();
    let id = reg.register("order.placed.v1.events-value", kind, schema);
    let d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--status-interval", "500ms", "--value-converter", converter, "--schema-registry-url", &reg.url],
    ));
    Scene { pg, broker, reg, d, id }
}

/// The one dead-letter copy of `event`: its `outboxd.error` and `outboxd.error.message`.
fn dead_letter(broker: &Broker, event: &str) -> (String, String) {
    let dead = broker.consume_all("outboxd.dlq", 1, 1, Duration::from_secs(30));
    let copy = dead.iter().find(|c| c.header_str("id").as_deref() == Some(event)).expect("dead letter");
    (copy.header_str("outboxd.error").unwrap_or_default(), copy.header_str("outboxd.error.message").unwrap_or_default())
}

#[test]
fn avro_values_round_trip_through_the_registry_to_a_stock_consumer() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let password = "s3cret:pass\\word";
    let reg = Registry::start_with(Some(("outboxd", password)));
    let id = reg.register("order.placed.v1.events-value", "AVRO", ORDER);
    let (user, file) = reg.auth.clone().expect("auth");
    let mut d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &[
            "--status-interval",
            "500ms",
            "--value-format",
            "avro",
            "--schema-registry-url",
            &reg.url,
            "--schema-registry-user",
            &user,
            "--schema-registry-password-file",
            file.to_str().unwrap(),
        ],
    ));
    let good = [
        r#"{"order_id": "o-1", "amount_cents": 1234, "items": ["a", "b"], "note": "gift"}"#,
        r#"{"order_id": "o-2", "amount_cents": -5, "items": []}"#,
    ];
    let mut ids = vec![insert(&pg, "o-1", "order.placed.v1", good[0]), insert(&pg, "o-2", "order.placed.v1", good[1])];
    // Does not fit: amount_cents missing (no default). Then a topic whose subject has no schema.
    let misfit = insert(&pg, "o-3", "order.placed.v1", r#"{"order_id": "o-3"}"#);
    let unregistered = insert(&pg, "p-1", "payment.taken.v1", r#"{"payment_id": "p-1"}"#);
    let third = r#"{"order_id": "o-4", "amount_cents": 7, "items": ["c"], "note": null}"#;
    ids.push(insert(&pg, "o-4", "order.placed.v1", third));
    drained(&pg, &d);
    assert!(d.is_running(), "{}", d.log());

    let got = reg.consume(&broker.bootstrap(), "order.placed.v1.events", "avro", 3);
    assert_eq!(got.len(), 3, "{got:?}");
    for ((record, want), id_want) in got.iter().zip([good[0], good[1], third]).zip(&ids) {
        assert_eq!(record["schema_id"].as_u64(), Some(id as u64), "{record}");
        let mut want: serde_json::Value = serde_json::from_str(want).unwrap();
        // The default fills a missing optional field.
        want.as_object_mut().unwrap().entry("note").or_insert(serde_json::Value::Null);
        assert_eq!(record["value"], want, "decoded value of {record}");
        assert_eq!(record["headers"]["id"].as_str(), Some(id_want.as_str()), "{record}");
    }
    let keys: Vec<&str> = got.iter().filter_map(|r| r["key"].as_str()).collect();
    assert_eq!(keys, ["o-1", "o-2", "o-4"]);

    let dead = broker.consume_all("outboxd.dlq", 1, 2, Duration::from_secs(30));
    let reason = |event: &str| {
        dead.iter()
            .find(|c| c.header_str("id").as_deref() == Some(event))
            .and_then(|c| c.header_str("outboxd.error"))
            .unwrap_or_else(|| panic!("no dead letter for {event}: {dead:?}\n{}", d.log()))
    };
    assert_eq!(reason(&misfit), "schema_mismatch");
    assert_eq!(reason(&unregistered), "schema_missing");
    let copy = dead.iter().find(|c| c.header_str("id").as_deref() == Some(misfit.as_str())).unwrap();
    assert_eq!(copy.payload_json()["order_id"], "o-3", "the copy keeps the original JSON");
    let log = d.log();
    assert!(!log.contains(password) && !log.contains("s3cret"), "the registry password is in the log:\n{log}");
    d.stop_cleanly();
}

#[test]
fn a_registry_outage_stops_the_pipeline_safely_and_it_resumes() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let reg = Registry::start();
    reg.register("order.placed.v1.events-value", "AVRO", ORDER);
    reg.register("order.shipped.v1.events-value", "AVRO", ORDER);
    let proxy = FreezeProxy::start(reg.port);
    let url = reg.url_via(proxy.port);
    let mut d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &[
            "--value-converter",
            "avro",
            "--schema-registry-url",
            &url,
            "--status-interval",
            "500ms",
            "--reconnect-max-backoff",
            "2s",
        ],
    ));
    let first = r#"{"order_id": "o-1", "amount_cents": 1, "items": []}"#;
    insert(&pg, "o-1", "order.placed.v1", first);
    drained(&pg, &d);

    // The registry unreachable (kept-alive connections closed, new ones refused): a topic whose
    // schema this session has not fetched yet.
    proxy.set_target(free_port());
    proxy.cut();
    let shipped = r#"{"order_id": "o-1", "amount_cents": 1, "items": ["x"]}"#;
    insert(&pg, "o-1", "order.shipped.v1", shipped);
    let waiting = pg.current_lsn();
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        assert!(
            !pg.slot_confirmed_at_least(&waiting),
            "slot confirmed past an event that could not be encoded:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(d.is_running(), "{}", d.log());
    let log = d.log();
    assert!(
        log.contains("unavailable") && log.contains("nothing after the event waiting for its schema is confirmed"),
        "{log}"
    );

    proxy.set_target(reg.port);
    drained(&pg, &d);
    let got = reg.consume(&broker.bootstrap(), "order.shipped.v1.events", "avro", 1);
    assert_eq!(got[0]["value"]["items"], serde_json::json!(["x"]), "{got:?}");
    assert_eq!(broker.end_offsets("outboxd.dlq"), 0, "nothing was dead-lettered during the outage");
    d.stop_cleanly();
}

/// `--value-converter json-schema`: each value is the Confluent header and the payload's JSON,
/// validated against the subject's latest JSON Schema; confluent-kafka's JSONDeserializer (which
/// validates too) reads it back. A payload that breaks the schema is dead-lettered with where.
#[test]
fn json_schema_values_round_trip_and_a_violation_is_dead_lettered() {
    let schema = r#"{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount_cents": {"type": "integer", "minimum": 0}},
        "required": ["order_id", "amount_cents"]}"#;
    let Scene { pg, broker, reg, mut d, id } = scene("JSON", schema, "json-schema");
    let first = insert(&pg, "o-1", "order.placed.v1", r#"{"order_id": "o-1", "amount_cents": 10}"#);
    let bad = insert(&pg, "o-2", "order.placed.v1", r#"{"order_id": "o-2", "amount_cents": -1}"#);
    let last = insert(&pg, "o-3", "order.placed.v1", r#"{"order_id": "o-3", "amount_cents": 0, "extra": true}"#);
    drained(&pg, &d);
    let got = reg.consume(&broker.bootstrap(), "order.placed.v1.events", "json-schema", 2);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["schema_id"].as_u64(), Some(id as u64));
    assert_eq!(got[0]["value"], serde_json::json!({"order_id": "o-1", "amount_cents": 10}));
    assert_eq!(got[1]["value"]["extra"], true);
    assert_eq!(got[0]["headers"]["id"].as_str(), Some(first.as_str()));
    assert_eq!(got[1]["headers"]["id"].as_str(), Some(last.as_str()));
    let (code, message) = dead_letter(&broker, &bad);
    assert_eq!(code, "schema_mismatch");
    assert!(message.ends_with(r#"field "amount_cents": expected at least 0, got -1"#), "{message}");
    d.stop_cleanly();
}

/// `--value-converter protobuf`: the JSON payload as the first message of the subject's latest
/// `.proto` (registered as text, compiled by outboxd at run time), behind the header and the
/// message index `[0]`; confluent-kafka's ProtobufDeserializer reads it back (consume.py compiles
/// the schema client-side, since Apicurio cannot serve it as that client asks). A field the
/// message does not have is a bad event.
#[test]
fn protobuf_values_round_trip_and_a_misfit_is_dead_lettered() {
    let proto = "syntax = \"proto3\";\npackage shop.v1;\nmessage OrderPlaced {\n  string order_id = 1;\n  int64 amount_cents = 2;\n  repeated string items = 3;\n}\nmessage Other { string x = 1; }\n";
    let Scene { pg, broker, reg, mut d, id } = scene("PROTOBUF", proto, "protobuf");
    let first =
        insert(&pg, "o-1", "order.placed.v1", r#"{"order_id": "o-1", "amount_cents": 1234, "items": ["a", "b"]}"#);
    let bad = insert(&pg, "o-2", "order.placed.v1", r#"{"order_id": "o-2", "colour": "red"}"#);
    let last = insert(&pg, "o-3", "order.placed.v1", r#"{"orderId": "o-3", "amountCents": "7"}"#);
    drained(&pg, &d);
    let got = reg.consume(&broker.bootstrap(), "order.placed.v1.events", "protobuf", 2);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0]["schema_id"].as_u64(), Some(id as u64));
    assert_eq!(got[0]["message_indexes"], serde_json::json!([0]), "{}", got[0]);
    assert_eq!(got[0]["value"]["order_id"], "o-1", "{}", got[0]);
    assert_eq!(got[0]["value"]["amount_cents"].to_string().trim_matches('"'), "1234", "{}", got[0]);
    assert_eq!(got[0]["value"]["items"], serde_json::json!(["a", "b"]));
    assert_eq!(got[1]["value"]["order_id"], "o-3", "{}", got[1]);
    assert_eq!(got[0]["headers"]["id"].as_str(), Some(first.as_str()));
    assert_eq!(got[1]["headers"]["id"].as_str(), Some(last.as_str()));
    let (code, message) = dead_letter(&broker, &bad);
    assert_eq!(code, "schema_mismatch", "{message}");
    d.stop_cleanly();
}

/// An https registry: outboxd trusts it through `--schema-registry-ca-file` (and, without it,
/// refuses the unknown certificate: the registry counts as unreachable, nothing is confirmed).
#[test]
fn an_https_registry_is_trusted_through_the_ca_file() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let reg = Registry::start_tls();
    assert!(reg.url.starts_with("https://127.0.0.1:"), "{}", reg.url);
    let ca = reg.ca.clone().expect("CA file");
    reg.register("order.placed.v1.events-value", "AVRO", ORDER);
    let base = ["--status-interval", "500ms", "--value-converter", "avro", "--schema-registry-url", &reg.url];
    // Without the CA: the certificate is not trusted, so nothing is confirmed.
    let mut a = daemon_args(&pg, &broker, &base);
    let mut untrusting = Outboxd::spawn_streaming(&a);
    insert(&pg, "o-1", "order.placed.v1", r#"{"order_id": "o-1", "amount_cents": 1, "items": []}"#);
    let waiting = pg.current_lsn();
    assert!(
        wait_until(Duration::from_secs(30), || untrusting.log().contains("unavailable")),
        "an untrusted certificate must not be accepted:\n{}",
        untrusting.log()
    );
    assert!(!pg.slot_confirmed_at_least(&waiting), "{}", untrusting.log());
    untrusting.stop_cleanly();
    // With it: the event arrives, encoded.
    a.extend(["--schema-registry-ca-file".to_owned(), ca.display().to_string()]);
    let mut d = Outboxd::spawn_streaming(&a);
    drained(&pg, &d);
    let got = reg.consume(&broker.bootstrap(), "order.placed.v1.events", "avro", 1);
    assert_eq!(got[0]["value"]["order_id"], "o-1", "{got:?}");
    d.stop_cleanly();
}

/// The event types' Avro files in `--schema-dir`, registered on first use under their record
/// names (RecordNameStrategy), keys as Avro strings under `<topic>-key`: a stock consumer decodes
/// both with the ids outboxd registered. A file the subject's BACKWARD rule refuses is a bad event
/// (`schema_incompatible`; the subject keeps its one version, the copy keeps the original key),
/// and an event type without a file uses the latest version of the subject named after it.
/// A private PostgreSQL (every `sql/` file applied), Kafka broker and registry.
fn services() -> (PgCluster, Broker, Registry) {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    (pg, Broker::start(), Registry::start())
}

/// outboxd routing every event of the `shop` aggregate to `shop.events` (several event types in
/// one topic), with schema files from `dir` and `extra` flags.
fn shop_events(at: (&PgCluster, &Broker, &Registry), dir: &std::path::Path, extra: &[&str]) -> Outboxd {
    let (pg, broker, reg) = at;
    let mut args = vec!["--status-interval", "500ms", "--route-by-field", "aggregate_type"];
    args.extend(["--schema-registry-url", &reg.url, "--schema-dir", dir.to_str().unwrap()]);
    args.extend(extra);
    Outboxd::spawn_streaming(&daemon_args(pg, broker, &args))
}

#[test]
fn schema_files_register_under_record_names_with_avro_keys() {
    let (pg, broker, reg) = services();
    let cancelled_v1 = r#"{"type":"record","name":"OrderCancelled","namespace":"shop.v1","fields":[{"name":"order_id","type":"string"}]}"#;
    let cancelled_v2 = r#"{"type":"record","name":"OrderCancelled","namespace":"shop.v1","fields":[
        {"name":"order_id","type":"string"},{"name":"reason","type":"string"}]}"#;
    reg.register("shop.v1.OrderCancelled", "AVRO", cancelled_v1);
    reg.set_compatibility("shop.v1.OrderCancelled", "BACKWARD");
    let shipped = r#"{"type":"record","name":"Shipped","fields":[{"name":"order_id","type":"string"},{"name":"carrier","type":"string"}]}"#;
    let shipped_id = reg.register("order.shipped.v1", "AVRO", shipped);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("order.placed.v1.avsc"), ORDER).unwrap();
    std::fs::write(dir.path().join("order.cancelled.v1.avsc"), cancelled_v2).unwrap();
    let mut d = shop_events(
        (&pg, &broker, &reg),
        dir.path(),
        &[
            "--key-format",
            "avro",
            "--value-format",
            "avro",
            "--schema-auto-register",
            "--subject-name-strategy",
            "record",
        ],
    );
    let placed = r#"{"order_id": "o-1", "amount_cents": 5, "items": ["a"]}"#;
    let first = insert(&pg, "o-1", "order.placed.v1", placed);
    let refused = insert(&pg, "o-2", "order.cancelled.v1", r#"{"order_id": "o-2", "reason": "late"}"#);
    let second = insert(&pg, "o-3", "order.shipped.v1", r#"{"order_id": "o-3", "carrier": "dhl"}"#);
    let third = insert(&pg, "o-1", "order.placed.v1", r#"{"order_id": "o-1", "amount_cents": 6, "items": []}"#);
    drained(&pg, &d);
    assert!(d.is_running(), "{}", d.log());

    let placed_id = reg.latest_id("shop.v1.OrderPlaced").unwrap_or_else(|| panic!("not registered\n{}", d.log()));
    let key_id = reg.latest_id("shop.events-key").expect("the key schema registered");
    assert_eq!(reg.versions("shop.v1.OrderCancelled"), [1], "the incompatible file was not registered");
    assert!(reg.latest_id("shop.events-value").is_none(), "nothing under the topic's subject");

    let got = reg.consume_keyed(&broker.bootstrap(), "shop.events", "avro", "avro", 3);
    assert_eq!(got.len(), 3, "{got:?}");
    let summary: Vec<(&str, &str, u64)> = got
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap_or("?"),
                r["headers"]["id"].as_str().unwrap_or("?"),
                r["schema_id"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("o-1", first.as_str(), placed_id as u64),
            ("o-3", second.as_str(), shipped_id as u64),
            ("o-1", third.as_str(), placed_id as u64)
        ]
    );
    assert_eq!(got[0]["key_schema_id"].as_u64(), Some(key_id as u64), "{}", got[0]);
    assert_eq!(got[1]["value"], serde_json::json!({"order_id": "o-3", "carrier": "dhl"}));
    assert_eq!(got[2]["value"]["amount_cents"], 6);

    let dead = broker.consume_all("outboxd.dlq", 1, 1, Duration::from_secs(30));
    let copy = dead.iter().find(|c| c.header_str("id").as_deref() == Some(refused.as_str())).expect("dead letter");
    assert_eq!(copy.header_str("outboxd.error").as_deref(), Some("schema_incompatible"), "{copy:?}");
    assert!(
        copy.header_str("outboxd.error.message").unwrap_or_default().contains("order.cancelled.v1.avsc"),
        "{copy:?}"
    );
    assert_eq!(copy.key_str().as_deref(), Some("o-2"), "the copy keeps the key as routed");
    d.stop_cleanly();
}

/// Without `--schema-auto-register`, a JSON Schema file must be registered under its subject
/// already (TopicRecordNameStrategy: `<topic>-<title>`): outboxd looks its id up and registers
/// nothing; a file that is not there is a bad event (`schema_missing`, naming the flag). Keys are
/// JSON Schema strings, with the latest schema of `<topic>-key`, read by the stock JSONDeserializer.
#[test]
fn unregistered_schema_files_are_bad_events_without_auto_register() {
    let (pg, broker, reg) = services();
    let placed = r#"{"title": "OrderPlaced", "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}"#;
    let paid = r#"{"title": "OrderPaid", "type": "object", "properties": {"order_id": {"type": "string"}}}"#;
    let placed_id = reg.register("shop.events-OrderPlaced", "JSON", placed);
    let key_id = reg.register(
        "shop.events-key",
        "JSON",
        r#"{"$schema": "http://json-schema.org/draft-07/schema#", "type": "string"}"#,
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("order.placed.v1.json"), placed).unwrap();
    std::fs::write(dir.path().join("order.paid.v1.json"), paid).unwrap();
    let mut d = shop_events(
        (&pg, &broker, &reg),
        dir.path(),
        &["--key-format", "json-schema", "--value-format", "json-schema", "--subject-name-strategy", "topic-record"],
    );
    let first = insert(&pg, "o-1", "order.placed.v1", r#"{"order_id": "o-1"}"#);
    let missing = insert(&pg, "o-1", "order.paid.v1", r#"{"order_id": "o-1"}"#);
    let second = insert(&pg, "o-2", "order.placed.v1", r#"{"order_id": "o-2"}"#);
    drained(&pg, &d);
    let got = reg.consume_keyed(&broker.bootstrap(), "shop.events", "json-schema", "json-schema", 2);
    assert_eq!(got.len(), 2, "{got:?}");
    for (record, (id, key)) in got.iter().zip([(&first, "o-1"), (&second, "o-2")]) {
        assert_eq!(record["headers"]["id"].as_str(), Some(id.as_str()), "{record}");
        assert_eq!(record["key"].as_str(), Some(key), "{record}");
        assert_eq!(record["schema_id"].as_u64(), Some(placed_id as u64), "{record}");
        assert_eq!(record["key_schema_id"].as_u64(), Some(key_id as u64), "{record}");
    }
    let (code, message) = dead_letter(&broker, &missing);
    assert_eq!(code, "schema_missing");
    assert!(message.contains("--schema-auto-register") && message.contains("shop.events-OrderPaid"), "{message}");
    assert!(reg.versions("shop.events-OrderPaid").is_empty(), "outboxd registered a schema without being asked");
    d.stop_cleanly();
}
