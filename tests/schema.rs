//! Event contracts (`--schema-dir`) against the real database and broker: a violating event goes
//! to the DLQ with reason `schema` and its validation errors while valid ones are delivered; a
//! changed schema applies after SIGHUP, and a broken one leaves the old rules in force. And
//! `outboxd schema check` on samples and on the rows still in the outbox table.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

const TIMEOUT: Duration = Duration::from_secs(30);

const AMOUNT: &str = r#"{"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}}"#;
const AMOUNT_AND_CURRENCY: &str = r#"{"type": "object", "required": ["amount", "currency"],
  "properties": {"amount": {"type": "integer"}, "currency": {"type": "string", "minLength": 3}}}"#;

fn insert(pg: &PgCluster, event_type: &str, payload: &str) -> String {
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o-1', '{event_type}', '{payload}') RETURNING event_id"
    ))
    .lines()
    .next()
    .unwrap()
    .to_owned()
}

fn ids(records: &[Consumed]) -> Vec<String> {
    records.iter().filter_map(|r| r.header_str("id")).collect()
}

fn write_schema(dir: &Path, event_type: &str, text: &str) {
    std::fs::write(dir.join(format!("{event_type}.json")), text).unwrap();
}

#[test]
fn violations_are_dead_lettered_and_sighup_applies_a_changed_schema() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let broker = Broker::start();
    let schemas = tempfile::tempdir().unwrap();
    write_schema(schemas.path(), "order.paid.v1", AMOUNT);
    let dir = schemas.path().display().to_string();
    let port = free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let mut d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--schema-dir", &dir, "--status-interval", "200ms", "--metrics-addr", &addr],
    ));
    assert!(d.log().contains("event contracts loaded"), "{}", d.log());

    let good1 = insert(&pg, "order.paid.v1", r#"{"amount": 5}"#);
    let bad = insert(&pg, "order.paid.v1", r#"{"amount": "5", "card": "4111111111111111"}"#);
    let unchecked = insert(&pg, "order.created.v1", r#"{"anything": true}"#);
    let good2 = insert(&pg, "order.paid.v1", r#"{"amount": 6}"#);
    let ok = broker.consume_all("order.paid.v1.events", 1, 2, TIMEOUT);
    assert_eq!(ids(&ok), [good1.clone(), good2.clone()], "{}", d.log());
    let created = broker.consume_all("order.created.v1.events", 1, 1, TIMEOUT);
    assert_eq!(ids(&created), [unchecked], "a type without a schema passes under allow");
    let dlq = broker.consume_all("outboxd.dlq", 1, 1, TIMEOUT);
    assert_eq!(ids(&dlq), std::slice::from_ref(&bad), "{}", d.log());
    let r = &dlq[0];
    assert_eq!(r.header_str("outboxd.error").as_deref(), Some("schema"));
    assert_eq!(r.header_str("outboxd.original.topic").as_deref(), Some("order.paid.v1.events"));
    let message = r.header_str("outboxd.error.message").unwrap();
    assert!(
        message.contains("violates the schema of event type \"order.paid.v1\"")
            && message.contains("at /amount: value is not of type \"integer\""),
        "{message}"
    );
    let errors: serde_json::Value = serde_json::from_slice(r.header("outboxd.schema.errors").unwrap()).unwrap();
    assert_eq!(errors, serde_json::json!([{"path": "/amount", "message": "value is not of type \"integer\""}]));
    assert_eq!(r.payload_json()["card"], "4111111111111111", "the copy keeps the payload for replay");
    assert!(!d.log().contains("4111111111111111"), "payload values must not reach the log:\n{}", d.log());

    // A stricter schema applies after SIGHUP, to events inserted after the reload.
    write_schema(schemas.path(), "order.paid.v1", AMOUNT_AND_CURRENCY);
    assert!(send_signal(d.pid().unwrap(), "HUP"));
    assert!(d.wait_for_log("event contracts reloaded", TIMEOUT), "{}", d.log());
    let no_currency = insert(&pg, "order.paid.v1", r#"{"amount": 7}"#);
    let with_currency = insert(&pg, "order.paid.v1", r#"{"amount": 8, "currency": "EUR"}"#);

    // A schema that does not compile: one clear error, and the rules in force stay.
    write_schema(schemas.path(), "order.refunded.v1", "{ not json");
    assert!(send_signal(d.pid().unwrap(), "HUP"));
    assert!(d.wait_for_log("event contracts not reloaded", TIMEOUT), "{}", d.log());
    let still_no_currency = insert(&pg, "order.paid.v1", r#"{"amount": 9}"#);
    let last = insert(&pg, "order.paid.v1", r#"{"amount": 10, "currency": "USD"}"#);

    let ok = broker.consume_all("order.paid.v1.events", 1, 4, TIMEOUT);
    assert_eq!(ids(&ok), [good1, good2, with_currency, last], "{}", d.log());
    let dlq = broker.consume_all("outboxd.dlq", 1, 3, TIMEOUT);
    assert_eq!(ids(&dlq), [bad, no_currency, still_no_currency], "{}", d.log());
    let errors = dlq[1].header_str("outboxd.schema.errors").unwrap();
    assert!(errors.contains(r#""message":"\"currency\" is a required property""#), "{errors}");
    let log = d.log();
    let failed: Vec<&str> = log.lines().filter(|l| l.contains("event contracts not reloaded")).collect();
    assert_eq!(failed.len(), 1, "{log}");
    assert!(
        failed[0].contains("order.refunded.v1.json: not JSON") && failed[0].contains("still using the 1 schemas"),
        "{}",
        failed[0]
    );
    let (_, body) = http_get(port.parse().unwrap(), "/metrics").expect("metrics answer");
    assert_eq!(metric(&body, "outboxd_dlq_events_total{reason=\"schema\"}"), Some(3.0), "{body}");
    d.stop_cleanly();
}

fn check(extra: &[&str]) -> (Option<i32>, String) {
    let mut a = args(&["schema", "check"]);
    a.extend(extra.iter().map(|s| s.to_string()));
    run_to_exit(&a, TIMEOUT)
}

#[test]
fn schema_check_reports_rows_still_in_the_outbox() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let schemas = tempfile::tempdir().unwrap();
    write_schema(schemas.path(), "order.paid.v1", AMOUNT);
    let dir = schemas.path().display().to_string();
    let url = pg.url();
    insert(&pg, "order.paid.v1", r#"{"amount": 5}"#);
    let bad = insert(&pg, "order.paid.v1", r#"{"amount": 1.5}"#);
    insert(&pg, "order.created.v1", r#"{}"#);
    let (code, out) = check(&[&dir, "--from-table", "--postgres-url", &url]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains(&format!("public.outbox id={bad}: the payload violates the schema")), "{out}");
    assert!(out.contains("    /amount: value is not of type \"integer\"\n"), "{out}");
    assert!(out.contains("3 events: 1 valid, 1 violating, 1 unchecked"), "{out}");
    assert!(!out.contains("1.5"), "values are not printed:\n{out}");
    // Requiring a schema for every type makes the created event a violation too.
    let (code, out) = check(&[&dir, "--from-table", "--postgres-url", &url, "--schema-missing", "reject"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("\"order.created.v1\" has no schema"), "{out}");

    pg.psql(&format!("DELETE FROM outbox WHERE event_id = '{bad}'"));
    let (code, out) = check(&[&dir, "--from-table", "--postgres-url", &url]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("2 events: 1 valid, 0 violating, 1 unchecked"), "{out}");

    // A text payload column may hold what is not JSON: that cannot pass a schema.
    pg.psql("ALTER TABLE outbox ALTER COLUMN payload TYPE text");
    let text = insert(&pg, "order.paid.v1", "amount=5");
    let (code, out) = check(&[&dir, "--from-table", "--postgres-url", &url]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains(&format!("public.outbox id={text}: the payload is not JSON")), "{out}");

    let (code, out) = check(&[&dir, "--from-table", "--postgres-url", &url, "--table-field-event-type", "kind"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("--table-field-event-type") && out.contains("kind"), "{out}");
}

#[test]
fn schema_check_on_samples_and_its_exit_codes() {
    let schemas = tempfile::tempdir().unwrap();
    write_schema(schemas.path(), "order.paid.v1", AMOUNT);
    let dir = schemas.path().display().to_string();
    let files = tempfile::tempdir().unwrap();
    let sample = files.path().join("events.jsonl");
    let path = sample.display().to_string();
    std::fs::write(
        &sample,
        "{\"event_type\": \"order.paid.v1\", \"payload\": {\"amount\": 5}}\n\
         {\"event_type\": \"order.paid.v1\", \"payload\": {\"amount\": 6}, \"id\": \"e-2\"}\n",
    )
    .unwrap();
    let (code, out) = check(&[&dir, "--sample", &path]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("2 events: 2 valid, 0 violating, 0 unchecked"), "{out}");

    std::fs::write(&sample, "{\"event_type\": \"order.paid.v1\", \"payload\": {}, \"id\": \"e-3\"}\n").unwrap();
    let (code, out) = check(&[&dir, "--sample", &path]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains(&format!("{path}:1 id=e-3: the payload violates")), "{out}");
    assert!(out.contains("    /: \"amount\" is a required property"), "{out}");

    // Bad input is exit 2 with one line naming it: a malformed sample, a broken schema, no source.
    std::fs::write(&sample, "{\"event_type\": \"order.paid.v1\"\n").unwrap();
    let (code, out) = check(&[&dir, "--sample", &path]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains(&format!("--sample {path}:1: expected one JSON object per line")), "{out}");
    write_schema(schemas.path(), "order.created.v1", r#"{"minimum": "zero"}"#);
    let (code, out) = check(&[&dir, "--sample", &path]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("order.created.v1.json: not a valid draft 2020-12 schema at /minimum"), "{out}");
    let (code, out) = check(&[&dir]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--sample"), "{out}");
}
