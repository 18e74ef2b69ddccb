//! Logical messages as the outbox (`--messages-prefix`): real PostgreSQL, real Apache Kafka, the real
//! binary. Transactional messages become records routed like rows (key, `id`, expanded headers,
//! payload bytes, timestamp from `created_at` in both forms or the commit time); an aborted
//! transaction's message never appears; non-transactional and malformed messages are bad events;
//! rows and messages share one slot, and the slot is never confirmed past an unacked message.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

fn emit(pg: &PgCluster, transactional: bool, prefix: &str, content: &str) {
    pg.psql(&format!("SELECT pg_logical_emit_message({transactional}, '{prefix}', '{content}')"));
}

#[test]
fn transactional_messages_are_events_routed_like_rows() {
    let (pg, broker, _d) = relay(&["--messages-prefix", "outbox", "--status-interval", "500ms"]);

    // Through sql/06_emit.sql, with headers; created_at is the transaction's start.
    let row = pg.psql(
        "BEGIN; SELECT outbox_emit('order', 'o-1', 'msg.paid.v1', '{\"orderId\": \"o-1\", \"total\": 10.50}', \
         '{\"traceparent\": \"00-abc-01\", \"attempt\": 2}')::text, \
         floor(extract(epoch FROM now()) * 1000)::bigint; COMMIT;",
    );
    let f: Vec<&str> = row.lines().find(|l| l.contains('|')).expect("outbox_emit row").split('|').collect();
    let (emitted_id, tx_start_ms) = (f[0].to_owned(), f[1].parse::<i64>().unwrap());
    // created_at as RFC 3339 with an offset, as epoch milliseconds, and absent (commit time).
    emit(
        &pg,
        true,
        "outbox",
        r#"{"event_id": "e-rfc", "aggregate_id": "o-2", "event_type": "msg.paid.v1", "payload": {"n": 2}, "created_at": "2026-12-01T10:00:00.250+02:00"}"#,
    );
    emit(
        &pg,
        true,
        "outbox",
        r#"{"event_id": "e-ms", "aggregate_id": "o-3", "event_type": "msg.paid.v1", "payload": [3], "created_at": 1796119200500}"#,
    );
    let before_ms: i64 = pg.psql("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").parse().unwrap();
    emit(
        &pg,
        true,
        "outbox",
        r#"{"event_id": "e-commit", "aggregate_id": "o-4", "event_type": "msg.paid.v1", "payload": "four"}"#,
    );
    let after_ms: i64 = pg.psql("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint").parse().unwrap();
    // Other prefixes are not events: a longer one, a shorter one, our own heartbeat prefix.
    for prefix in ["outbox.other", "outbo", "outboxd.heartbeat"] {
        emit(
            &pg,
            true,
            prefix,
            r#"{"event_id": "e-other", "aggregate_id": "x", "event_type": "msg.paid.v1", "payload": 0}"#,
        );
    }

    let got = broker.consume_all("msg.paid.v1.events", 1, 4, T);
    let ids: Vec<String> = got.iter().map(|c| c.header_str("id").unwrap_or_default()).collect();
    assert_eq!(ids, vec![emitted_id.clone(), "e-rfc".into(), "e-ms".into(), "e-commit".into()], "{got:?}");

    let first = &got[0];
    assert_eq!(first.key_str().as_deref(), Some("o-1"));
    assert_eq!(first.header_str("traceparent").as_deref(), Some("00-abc-01"));
    assert_eq!(first.header_str("attempt").as_deref(), Some("2"));
    assert_eq!(first.payload_json(), serde_json::json!({"orderId": "o-1", "total": 10.50}));
    // jsonb's now() has microseconds: the record keeps the millisecond.
    assert_eq!(first.timestamp_ms, Some(tx_start_ms), "created_at of outbox_emit is the transaction start");

    // Payload bytes exactly as the producer wrote them.
    assert_eq!(got[1].payload.as_deref(), Some(&br#"{"n": 2}"#[..]));
    assert_eq!(got[1].timestamp_ms, Some(1_796_112_000_250), "RFC 3339 with +02:00");
    assert_eq!(got[2].payload.as_deref(), Some(&b"[3]"[..]));
    assert_eq!(got[2].timestamp_ms, Some(1_796_119_200_500), "epoch milliseconds");
    assert_eq!(got[3].payload.as_deref(), Some(&br#""four""#[..]));
    let commit_ms = got[3].timestamp_ms.expect("timestamp");
    assert!((before_ms..=after_ms).contains(&commit_ms), "commit time {commit_ms} not in [{before_ms}, {after_ms}]");

    assert!(pg.wait_slot_reaches_wal_end(T), "the slot did not confirm the messages");
}

#[test]
fn an_aborted_transactions_message_never_appears() {
    let (pg, broker, d) = relay(&["--messages-prefix", "outbox", "--status-interval", "500ms"]);
    pg.psql("SELECT outbox_emit('a', 'k', 'abort.v1', '{\"n\": \"before\"}')");
    // Emitted, then rolled back: explicitly, by an error, and in a subtransaction rolled back to a
    // savepoint while the outer transaction commits something else.
    pg.psql("BEGIN; SELECT outbox_emit('a', 'k', 'abort.v1', '{\"n\": \"rolled-back\"}'); ROLLBACK;");
    let failed = std::process::Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", &pg.url(), "-c"])
        .arg("BEGIN; SELECT outbox_emit('a', 'k', 'abort.v1', '{\"n\": \"failed\"}'); SELECT 1/0; COMMIT;")
        .output()
        .expect("run psql");
    assert!(!failed.status.success(), "the division by zero should abort the transaction");
    pg.psql(
        "BEGIN; SAVEPOINT s; SELECT outbox_emit('a', 'k', 'abort.v1', '{\"n\": \"savepoint\"}'); \
         ROLLBACK TO SAVEPOINT s; SELECT outbox_emit('a', 'k', 'abort.v1', '{\"n\": \"after-savepoint\"}'); COMMIT;",
    );
    pg.psql("SELECT outbox_emit('a', 'k', 'abort.v1', '{\"n\": \"after\"}')");

    let got = broker.consume_all("abort.v1.events", 1, 3, T);
    let ns: Vec<String> = got.iter().map(|c| c.payload_json()["n"].as_str().unwrap_or_default().to_owned()).collect();
    assert_eq!(ns, vec!["before", "after-savepoint", "after"], "{}", d.log());
    assert!(pg.wait_slot_reaches_wal_end(T));
}

#[test]
fn non_transactional_and_malformed_messages_are_bad_events() {
    let (pg, broker, d) = relay(&["--messages-prefix", "outbox", "--status-interval", "500ms"]);
    emit(&pg, false, "outbox", r#"{"event_id": "e-nontx", "aggregate_id": "k", "event_type": "bad.v1", "payload": 1}"#);
    emit(&pg, true, "outbox", "not json at all");
    emit(&pg, true, "outbox", r#"{"event_id": "e-nokey", "event_type": "bad.v1", "payload": 1}"#);
    emit(&pg, true, "outbox", r#"{"event_id": "e-noroute", "aggregate_id": "k", "payload": 1}"#);
    emit(&pg, true, "outbox", r#"{"event_id": "e-good", "aggregate_id": "k", "event_type": "bad.v1", "payload": 1}"#);

    let good = broker.consume_all("bad.v1.events", 1, 1, T);
    let ids: Vec<String> = good.iter().filter_map(|c| c.header_str("id")).collect();
    assert_eq!(ids, vec!["e-good"], "only the good message is an event:\n{}", d.log());
    let dlq = broker.consume_all("outboxd.dlq", 1, 4, T);
    let seen: Vec<(String, String, String)> = dlq
        .iter()
        .map(|c| {
            (
                c.header_str("outboxd.error").unwrap_or_default(),
                c.header_str("id").unwrap_or_default(),
                c.header_str("outboxd.source.table").unwrap_or_default(),
            )
        })
        .collect();
    let want = |code: &str, id: &str| (code.to_owned(), id.to_owned(), "message:outbox".to_owned());
    assert_eq!(
        seen,
        vec![
            want("non_transactional", "e-nontx"),
            want("invalid_json", ""),
            want("missing_key", "e-nokey"),
            want("null_route", "e-noroute"),
        ],
        "{}",
        d.log()
    );
    // The non-transactional message's content is kept for a later replay.
    assert_eq!(dlq[0].payload_json()["event_id"], "e-nontx");
    assert_eq!(dlq[1].payload.as_deref(), Some(&b"not json at all"[..]));
    assert!(pg.wait_slot_reaches_wal_end(T), "the slot did not move past the dead-lettered messages");
}

#[test]
fn a_non_transactional_message_stops_the_relay_with_on_bad_event_fail() {
    let (pg, _broker, mut d) =
        relay(&["--messages-prefix", "outbox", "--on-bad-event", "fail", "--status-interval", "500ms"]);
    emit(&pg, false, "outbox", r#"{"event_id": "e-nontx", "aggregate_id": "k", "event_type": "bad.v1", "payload": 1}"#);
    let status = d.wait_exit(T);
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{}", d.log());
    assert!(d.log().contains("e-nontx") && d.log().contains("non-transactionally"), "{}", d.log());
    // Nothing after the message's start was confirmed.
    let after = pg.current_lsn();
    assert!(!pg.slot_confirmed_at_least(&after), "the slot was confirmed past the refused message");
}

/// One slot, one transaction carrying a row and a message: both are delivered. While the broker
/// is frozen, the slot is never confirmed past a transaction whose only record is a message.
#[test]
fn rows_and_messages_share_a_slot_and_the_ack_rule() {
    let (pg, broker, d) = relay(&["--messages-prefix", "outbox", "--status-interval", "200ms"]);
    pg.psql(
        "BEGIN; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('m', 'k', 'mix.v1', '{\"from\": \"row-0\"}'); \
         SELECT outbox_emit('m', 'k', 'mix.v1', '{\"from\": \"message-0\"}'); COMMIT;",
    );
    assert_eq!(broker.consume_all("mix.v1.events", 1, 2, T).len(), 2, "{}", d.log());
    assert!(pg.wait_slot_reaches_wal_end(T));

    broker.pause();
    // A transaction whose only record is a message, then one with a message and a row.
    // `before_commit` is the WAL position after the message and before its commit record.
    let lsn_of = |out: String| out.lines().rev().find(|l| l.contains('/')).expect("lsn").trim().to_owned();
    let before_commit = lsn_of(pg.psql(
        "BEGIN; SELECT outbox_emit('m', 'k', 'mix.v1', '{\"from\": \"message-1\"}'); \
         SELECT pg_current_wal_insert_lsn(); COMMIT;",
    ));
    pg.psql(
        "BEGIN; SELECT outbox_emit('m', 'k', 'mix.v1', '{\"from\": \"message-2\"}'); \
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('m', 'k', 'mix.v1', '{\"from\": \"row-2\"}'); COMMIT;",
    );
    pg.psql("CREATE TABLE noise (x int); INSERT INTO noise SELECT generate_series(1, 5000)");
    let end = pg.current_lsn();
    let sent_all = format!(
        "SELECT coalesce(bool_or(r.sent_lsn >= '{end}'::pg_lsn), false)::text FROM pg_stat_replication r \
         JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = 'outboxd'"
    );
    assert!(wait_until(T, || pg.psql(&sent_all) == "true"), "the server did not send the transaction");
    // 15 status intervals, each a chance to confirm past the unacked transaction.
    for _ in 0..15 {
        assert!(!pg.slot_confirmed_at_least(&before_commit), "slot confirmed past unacked records:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    broker.resume();
    let got = broker.consume_all("mix.v1.events", 1, 5, T);
    let from: Vec<String> =
        got.iter().map(|c| c.payload_json()["from"].as_str().unwrap_or_default().to_owned()).collect();
    assert_eq!(from, vec!["row-0", "message-0", "message-1", "message-2", "row-2"], "{}", d.log());
    assert!(pg.wait_slot_reaches_wal_end(T), "{}", d.log());
}

/// Messages only: no outbox table at all (`--table ''`), emitted by an ordinary role.
#[test]
fn messages_without_any_table() {
    let pg = PgCluster::start();
    pg.apply_sql_file(sql_dir().join("06_emit.sql"));
    let broker = Broker::start();
    let _d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &["--table", "", "--messages-prefix", "outbox", "--publication", "msgs_only"],
    ));
    pg.psql("SELECT outbox_emit('a', 'k', 'tableless.v1', '{}')");
    // An ordinary application role (no superuser, no REPLICATION) may emit.
    pg.psql("CREATE ROLE app_writer NOLOGIN");
    pg.psql("SET ROLE app_writer; SELECT outbox_emit('a', 'k', 'tableless.v1', '{\"by\": \"app_writer\"}')");
    let got = broker.consume_all("tableless.v1.events", 1, 2, T);
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].payload_json()["by"], "app_writer");
    assert_eq!(pg.psql("SELECT count(*) FROM pg_publication_tables WHERE pubname = 'msgs_only'"), "0");
}

/// PostgreSQL 13's pgoutput cannot send messages: a clear error at start, naming the fix.
#[test]
fn messages_prefix_on_postgres_13_is_refused_at_start() {
    let pg = PgCluster::start_version(13);
    pg.apply_sql_file(sql_dir().join("01_outbox.sql"));
    let (code, log) = run_to_exit(&daemon_args_pg_only(&pg, &["--messages-prefix", "outbox", "--sink", "null"]), T);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("--messages-prefix needs PostgreSQL 14 or later"), "{log}");
}
