//! Routing options end to end: rows in, the exact Kafka records out (topic, key, value bytes,
//! headers, partition, timestamp), through the real binary, PostgreSQL and broker.

mod common;

use std::time::Duration;

use common::*;

/// A second outbox table with extra column types for the options that need them.
const SCHEMA: &str = "
CREATE TABLE events_b (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  kind text NOT NULL,
  agg text,
  body text,
  blob bytea,
  shard int,
  urgent boolean,
  at timestamptz NOT NULL DEFAULT now(),
  meta jsonb
);";

fn start(pg: &PgCluster, broker: &Broker, extra: &[&str]) -> Outboxd {
    let mut a = vec!["--status-interval", "200ms"];
    a.extend_from_slice(extra);
    Outboxd::spawn_streaming(&daemon_args(pg, broker, &a))
}

#[test]
fn options_for_a_text_and_bytea_outbox_with_placements() {
    let pg = PgCluster::start();
    pg.psql(SCHEMA);
    let broker = Broker::start();
    broker.create_topic("b.order", 3);
    let d = start(
        &pg,
        &broker,
        &[
            "--table",
            "public.events_b",
            "--table-field-event-id",
            "id",
            "--table-field-event-key",
            "agg",
            "--table-field-event-payload",
            "body",
            "--table-field-event-timestamp",
            "at",
            "--table-field-event-headers",
            "meta",
            "--route-by-field",
            "kind",
            "--route-topic-regex",
            r"(?<family>[a-z]+)\.(?<rest>.*)",
            "--route-topic-replacement",
            "b.${family}",
            "--table-fields-additional-placement",
            "shard:partition,urgent:header:urgent,kind:envelope:type",
            "--table-expand-json-payload",
        ],
    );
    pg.psql(
        "INSERT INTO events_b (kind, agg, body, shard, urgent, at, meta) VALUES \
         ('order.paid', 'a-1', '{ \"n\" : 1 }', 2, true, '2026-01-01 00:00:00+00', '{\"trace\": \"x\\ny\", \"n\": 3}'), \
         ('order.paid', NULL, 'plain text', 1, false, '2026-01-01 00:00:01+00', NULL)",
    );
    let ids: Vec<String> = pg.psql("SELECT id FROM events_b ORDER BY at").lines().map(String::from).collect();
    let got = broker.consume_all("b.order", 3, 2, Duration::from_secs(30));
    assert_eq!(got.len(), 2, "{}", d.log());
    let first = got.iter().find(|r| r.header_str("id").as_deref() == Some(&ids[0])).expect("first event");
    assert_eq!(first.partition, 2, "partition placement");
    assert_eq!(first.key_str().as_deref(), Some("a-1"));
    // Envelope: the expanded (compact) JSON payload plus the placed field.
    assert_eq!(first.payload.as_deref(), Some(&br#"{"payload":{"n":1},"type":"order.paid"}"#[..]));
    assert_eq!(first.header_str("urgent").as_deref(), Some("true"));
    assert_eq!(first.header_str("trace").as_deref(), Some("x\ny"), "expanded headers keep newlines");
    assert_eq!(first.header_str("n").as_deref(), Some("3"));
    assert_eq!(first.timestamp_ms, Some(1_767_225_600_000));
    let second = got.iter().find(|r| r.header_str("id").as_deref() == Some(&ids[1])).expect("second event");
    assert_eq!(second.partition, 1);
    assert_eq!(second.key, None, "NULL key means no key");
    // Not JSON: passed through as a string inside the envelope.
    assert_eq!(second.payload.as_deref(), Some(&br#"{"payload":"plain text","type":"order.paid"}"#[..]));
    assert_eq!(second.header_str("urgent").as_deref(), Some("false"));
}

#[test]
fn two_outbox_tables_bytea_payloads_and_tombstones() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql(SCHEMA);
    let broker = Broker::start();
    // Both tables share the options, so route both by a column they both have under one name.
    pg.psql("ALTER TABLE events_b RENAME COLUMN kind TO event_type");
    pg.psql("ALTER TABLE events_b RENAME COLUMN id TO event_id");
    pg.psql("ALTER TABLE events_b RENAME COLUMN agg TO aggregate_id");
    pg.psql("ALTER TABLE events_b RENAME COLUMN blob TO payload");
    pg.psql("ALTER TABLE events_b RENAME COLUMN at TO created_at");
    let d = start(
        &pg,
        &broker,
        &["--table", "public.outbox", "--table", "public.events_b", "--route-tombstone-on-empty-payload"],
    );
    pg.psql("INSERT INTO events_b (event_type, aggregate_id, payload) VALUES ('bin', 'k1', '\\x00ff10'::bytea), ('bin', 'k2', NULL)");
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', 'k3', 'json', '[1, 2]')",
    );
    let bin = broker.consume_all("bin.events", 1, 2, Duration::from_secs(30));
    assert_eq!(bin.len(), 2, "{}", d.log());
    assert_eq!(bin[0].payload.as_deref(), Some(&[0u8, 255, 16][..]), "bytea arrives as raw bytes");
    assert_eq!(bin[1].key_str().as_deref(), Some("k2"));
    assert_eq!(bin[1].payload, None, "NULL payload with the tombstone option is a tombstone");
    // As Debezium's: a tombstone keeps the `id` header (and any header placements).
    let names: Vec<&str> = bin[1].headers.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["id"], "the tombstone keeps its id header");
    let id = pg.psql("SELECT event_id FROM events_b WHERE aggregate_id = 'k2'");
    assert_eq!(bin[1].header_str("id").as_deref(), Some(id.as_str()));
    let json = broker.consume_all("json.events", 1, 1, Duration::from_secs(30));
    assert_eq!(json.len(), 1, "{}", d.log());
    assert_eq!(json[0].payload.as_deref(), Some(&b"[1, 2]"[..]));
}
