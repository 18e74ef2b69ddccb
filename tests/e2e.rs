//! End to end: real PostgreSQL, real Apache Kafka broker, the real binary. Events land on the right
//! topics with the right key, `id` header, payload bytes and timestamp; per-aggregate order is
//! commit order; the slot's confirmed LSN follows.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

struct Row {
    event_type: String,
    aggregate_id: String,
    payload: String,
    created_ms: i64,
}

/// Every outbox row, from the database's point of view.
fn outbox_rows(pg: &PgCluster) -> HashMap<String, Row> {
    pg.psql(
        "SELECT event_id, event_type, aggregate_id, payload::text, \
         floor(extract(epoch FROM created_at) * 1000)::bigint FROM outbox",
    )
    .lines()
    .map(|l| {
        let f: Vec<&str> = l.split('|').collect();
        (
            f[0].to_owned(),
            Row {
                event_type: f[1].into(),
                aggregate_id: f[2].into(),
                payload: f[3].into(),
                created_ms: f[4].parse().unwrap(),
            },
        )
    })
    .collect()
}

#[test]
fn events_reach_topics_with_key_id_payload_timestamp_and_order() {
    let (pg, broker, mut d) = relay(&["--topic-partitions", "3", "--status-interval", "500ms"]);

    // Single-row transactions of three types, with payloads whose text must survive byte for byte.
    for i in 0..30 {
        let ty = ["order.created.v1", "user.registered.v1", "invoice.sent.v1"][i % 3];
        pg.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) \
             VALUES ('t', 'agg-{}', '{ty}', '{{\"n\": {i}, \"price\": 10.50, \"name\": \"\u{00e9}\u{20ac}\"}}', \
             '2026-01-02 03:04:05.{:03}678+00')",
            i % 4,
            i
        ));
    }
    // One transaction of 1000 rows for one aggregate: order within it must hold.
    pg.psql(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'bulk', 'bulk-agg', 'bulk.v1', jsonb_build_object('seq', g) FROM generate_series(1, 1000) g",
    );
    // Mixed transactions: other tables change in the same transaction; only outbox rows count.
    pg.psql("CREATE TABLE side_effects (id serial PRIMARY KEY, note text)");
    for i in 0..20 {
        pg.psql(&format!(
            "BEGIN; INSERT INTO side_effects (note) VALUES ('before {i}'); \
             INSERT INTO orders (user_id, status, total_amount) VALUES ({i}, 'created', 1); \
             UPDATE orders SET status = 'paid' WHERE user_id = {i}; \
             INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('seq', 'seq-agg', 'seq.v1', '{{\"seq\": {i}}}'); \
             INSERT INTO side_effects (note) VALUES ('after {i}'); COMMIT;"
        ));
    }
    let expected = outbox_rows(&pg);
    assert_eq!(expected.len(), 30 + 1000 + 20 + 20);

    let mut seen = HashMap::new();
    for (topic, n) in [
        ("order.created.v1.events", 10),
        ("user.registered.v1.events", 10),
        ("invoice.sent.v1.events", 10),
        ("bulk.v1.events", 1000),
        ("seq.v1.events", 20),
        ("order.paid.v1.events", 20),
    ] {
        let got = broker.consume_all(topic, 3, n, Duration::from_secs(60));
        assert_eq!(got.len(), n, "topic {topic}: expected {n} records, got {}\n{}", got.len(), d.log());
        for r in &got {
            let id = r.header_str("id").expect("every record has an id header");
            let row = expected.get(&id).unwrap_or_else(|| panic!("record with unknown id {id} on {topic}"));
            assert_eq!(format!("{}.events", row.event_type), topic);
            assert_eq!(r.key_str().as_deref(), Some(row.aggregate_id.as_str()), "key of {id}");
            assert_eq!(r.payload.as_deref(), Some(row.payload.as_bytes()), "payload bytes of {id}");
            assert_eq!(r.timestamp_ms, Some(row.created_ms), "timestamp of {id}");
            assert!(seen.insert(id.clone(), ()).is_none(), "duplicate {id} without any crash");
        }
        // Per-aggregate order: one key lives on one partition, in commit order.
        if topic == "bulk.v1.events" || topic == "seq.v1.events" {
            let seqs: Vec<i64> = got.iter().map(|r| r.payload_json()["seq"].as_i64().unwrap()).collect();
            let mut sorted = seqs.clone();
            sorted.sort();
            assert_eq!(seqs, sorted, "events of one aggregate must arrive in commit order");
            assert!(got.iter().all(|r| r.partition == got[0].partition));
        }
    }
    assert_eq!(seen.len(), expected.len());

    // The slot catches up with the WAL once everything is acked.
    let end = pg.psql("SELECT pg_current_wal_insert_lsn()");
    let caught_up = wait_until(Duration::from_secs(20), || {
        pg.psql(&format!(
            "SELECT confirmed_flush_lsn >= '{end}'::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'"
        )) == "t"
    });
    assert!(caught_up, "confirmed_flush_lsn never reached {end}:\n{}", d.log());

    d.sigterm();
    let status = d.wait_exit(Duration::from_secs(20)).expect("outboxd exits after SIGTERM");
    assert!(status.success(), "exit status {status:?}\n{}", d.log());
    assert!(d.log().contains("final status update sent"), "{}", d.log());
}

#[test]
fn non_insert_changes_and_other_tables_produce_nothing() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    // `orders` shares the publication with the outbox (its rows reach outboxd and must be passed
    // over); `audit` is not published (its WAL is skipped by the server).
    pg.psql(
        "CREATE TABLE orders (id int PRIMARY KEY, note text); CREATE TABLE audit (id int); \
         CREATE PUBLICATION outboxd FOR TABLE outbox, orders",
    );
    let mut d =
        Outboxd::spawn_streaming(&daemon_args_pg_only(&pg, &["--sink", "stdout", "--status-interval", "500ms"]));
    pg.psql("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', '1', 'x.v1', '{\"k\": 1}')");
    pg.psql("INSERT INTO orders SELECT g, 'o' FROM generate_series(1, 500) g");
    pg.psql("INSERT INTO audit SELECT generate_series(1, 500)");
    pg.psql("UPDATE outbox SET attempts = attempts + 1");
    pg.psql("DELETE FROM outbox");
    // One transaction mixing both published tables.
    pg.psql(
        "BEGIN; INSERT INTO orders VALUES (1000, 'mixed'); \
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', '2', 'y.v1', '{\"k\": 2}'); \
         INSERT INTO orders VALUES (1001, 'mixed'); COMMIT",
    );
    pg.psql("UPDATE orders SET note = 'changed' WHERE id < 50; DELETE FROM orders WHERE id < 10; TRUNCATE audit");
    // Last come transactions of other tables only: they carry no event, and must not hold the
    // slot back (a transaction without records still completes).
    pg.psql("INSERT INTO orders SELECT g, 'tail' FROM generate_series(2000, 2100) g");
    pg.psql("INSERT INTO audit VALUES (1)");
    let end = pg.psql("SELECT pg_current_wal_insert_lsn()");
    assert!(wait_until(Duration::from_secs(15), || d.log().contains("\"key\":\"2\"")), "{}", d.log());
    let caught_up = wait_until(Duration::from_secs(30), || {
        pg.psql(&format!(
            "SELECT confirmed_flush_lsn >= '{end}'::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'"
        )) == "t"
    });
    assert!(caught_up, "other tables' transactions stalled the slot before {end}:\n{}", d.log());
    d.stop_cleanly();
    let log = d.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.starts_with("{\"topic\"")).collect();
    assert_eq!(lines.len(), 2, "exactly the two outbox inserts become events:\n{log}");
    assert!(
        lines[0].contains(r#""topic":"x.v1.events""#) && lines[0].contains(r#""payload":{"k": 1}"#),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains(r#""topic":"y.v1.events""#), "{}", lines[1]);
    assert!(log.contains("UPDATE on the outbox produces no event"), "{log}");
}

#[test]
fn update_with_fatal_op_behavior_stops_without_confirming_it() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let mut d = Outboxd::spawn_streaming(&daemon_args_pg_only(
        &pg,
        &["--sink", "null", "--status-interval", "200ms", "--table-op-invalid-behavior", "fatal"],
    ));
    pg.psql("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a', '1', 'x.v1', '{}')");
    pg.psql("UPDATE outbox SET attempts = 1");
    let status = d.wait_exit(Duration::from_secs(20)).expect("outboxd stops on a fatal UPDATE");
    assert_eq!(status.code(), Some(1), "{}", d.log());
    assert!(d.log().contains("--table-op-invalid-behavior is fatal"), "{}", d.log());
}
