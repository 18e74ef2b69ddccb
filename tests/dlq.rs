//! Bad events never block the outbox: each `--on-bad-event` policy against the real database and
//! broker, with the slot moving past the bad row only when the policy says so.

mod common;

use std::time::Duration;

use common::*;

/// An outbox that accepts the rows the default schema forbids.
fn lax_outbox(pg: &PgCluster) {
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    pg.psql("ALTER TABLE outbox ALTER COLUMN event_type DROP NOT NULL");
}

fn insert(pg: &PgCluster, agg: &str, event_type: Option<&str>, payload: &str) -> String {
    let ty = event_type.map_or("NULL".to_owned(), |t| format!("'{t}'"));
    pg.psql(&format!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('t', '{agg}', {ty}, '{payload}') RETURNING event_id"
    ))
    .lines()
    .next()
    .unwrap()
    .to_owned()
}

fn slot_reaches_wal_end(pg: &PgCluster) -> bool {
    let end = pg.psql("SELECT pg_current_wal_insert_lsn()");
    wait_until(Duration::from_secs(20), || {
        pg.psql(&format!("SELECT confirmed_flush_lsn >= '{end}' FROM pg_replication_slots WHERE slot_name = 'outboxd'"))
            == "t"
    })
}

#[test]
fn default_policy_dead_letters_and_keeps_going() {
    let pg = PgCluster::start();
    lax_outbox(&pg);
    let broker = Broker::start();
    let mut d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &["--status-interval", "200ms"]));
    let good1 = insert(&pg, "a", Some("ok.v1"), "{\"n\": 1}");
    let bad = insert(&pg, "b", None, "{\"n\": 2}");
    let good2 = insert(&pg, "c", Some("ok.v1"), "{\"n\": 3}");
    let ok = broker.consume_all("ok.v1.events", 1, 2, Duration::from_secs(30));
    let ids: Vec<String> = ok.iter().filter_map(|r| r.header_str("id")).collect();
    assert_eq!(ids, vec![good1, good2], "{}", d.log());
    let dlq = broker.consume_all("outboxd.dlq", 1, 1, Duration::from_secs(30));
    assert_eq!(dlq.len(), 1, "{}", d.log());
    let r = &dlq[0];
    assert_eq!(r.header_str("id"), Some(bad));
    assert_eq!(r.header_str("outboxd.error").as_deref(), Some("null_route"));
    assert!(r.header_str("outboxd.error.message").unwrap().contains("NULL"));
    assert_eq!(r.header_str("outboxd.source.table").as_deref(), Some("public.outbox"));
    assert!(r.header_str("outboxd.source.lsn").unwrap().contains('/'));
    assert_eq!(r.key_str().as_deref(), Some("b"));
    assert_eq!(r.payload.as_deref(), Some(&b"{\"n\": 2}"[..]));
    assert!(slot_reaches_wal_end(&pg), "the DLQ ack must let the slot move on\n{}", d.log());
    d.stop_cleanly();
}

#[test]
fn oversize_events_go_to_the_dlq_without_their_payload() {
    let pg = PgCluster::start();
    lax_outbox(&pg);
    let broker = Broker::start();
    let mut d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--status-interval", "200ms", "--kafka-property", "message.max.bytes=4000"],
    ));
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(10_000));
    let bad = insert(&pg, "big", Some("size.v1"), &big);
    let good = insert(&pg, "small", Some("size.v1"), "{}");
    let ok = broker.consume_all("size.v1.events", 1, 1, Duration::from_secs(30));
    assert_eq!(ok.len(), 1, "{}", d.log());
    assert_eq!(ok[0].header_str("id"), Some(good));
    let dlq = broker.consume_all("outboxd.dlq", 1, 1, Duration::from_secs(30));
    assert_eq!(dlq.len(), 1, "{}", d.log());
    assert_eq!(dlq[0].header_str("id"), Some(bad));
    assert_eq!(dlq[0].header_str("outboxd.error").as_deref(), Some("too_large"));
    assert_eq!(dlq[0].header_str("outboxd.original.topic").as_deref(), Some("size.v1.events"));
    assert_eq!(dlq[0].header_str("outboxd.payload.size"), Some(big.len().to_string()));
    assert_eq!(dlq[0].payload, None);
    // The row stays in the outbox for a later replay.
    assert_eq!(pg.psql("SELECT count(*) FROM outbox WHERE aggregate_id = 'big'"), "1");
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    d.stop_cleanly();
}

#[test]
fn skip_policy_counts_and_moves_on() {
    let pg = PgCluster::start();
    lax_outbox(&pg);
    let broker = Broker::start();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--status-interval", "200ms", "--on-bad-event", "skip", "--metrics-addr", &addr],
    ));
    let bad = insert(&pg, "b", None, "{}");
    let good = insert(&pg, "g", Some("skip.v1"), "{}");
    let ok = broker.consume_all("skip.v1.events", 1, 1, Duration::from_secs(30));
    assert_eq!(ok.len(), 1, "{}", d.log());
    assert_eq!(ok[0].header_str("id"), Some(good));
    assert!(d.log().contains(&bad) && d.log().contains("skipping bad event"), "{}", d.log());
    let (_, body) = http_get(port, "/metrics").unwrap();
    assert_eq!(metric(&body, "outboxd_events_failed_total{reason=\"null_route\"}"), Some(1.0), "{body}");
    assert_eq!(metric(&body, "outboxd_dlq_events_total{reason=\"null_route\"}"), Some(0.0), "{body}");
    assert!(!broker.topics().contains(&"outboxd.dlq".to_owned()));
    assert!(slot_reaches_wal_end(&pg), "{}", d.log());
    d.stop_cleanly();
}

#[test]
fn fail_policy_stops_at_the_bad_row_without_confirming_it() {
    let pg = PgCluster::start();
    lax_outbox(&pg);
    let broker = Broker::start();
    let mut d =
        Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &["--status-interval", "200ms", "--on-bad-event", "fail"]));
    let before = pg.psql("SELECT pg_current_wal_insert_lsn()");
    let bad = insert(&pg, "b", None, "{}");
    let status = d.wait_exit(Duration::from_secs(20)).expect("outboxd stops on a bad row with --on-bad-event fail");
    assert_eq!(status.code(), Some(1), "{}", d.log());
    let err = d.log().lines().find(|l| l.starts_with("outboxd: error:")).unwrap_or_default().to_owned();
    assert!(err.contains(&bad) && err.contains("NULL"), "{err}");
    let confirmed = pg.psql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'");
    assert_eq!(
        pg.psql(&format!("SELECT '{confirmed}'::pg_lsn <= '{before}'::pg_lsn")),
        "t",
        "slot confirmed {confirmed}, past the bad row's transaction (which began after {before})"
    );
}
