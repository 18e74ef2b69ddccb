//! `--delivery exactly-once` at its edges (issue 35, items 4, 5 and 7), against a private
//! PostgreSQL and a real Apache Kafka broker:
//! * a record the broker refuses for good inside a transaction is known by its place in the
//!   stream, not its event id: with an empty id, or behind another record with its id, it is
//!   dead-lettered once instead of aborting every transaction after it;
//! * while Kafka does not answer at start, `/healthz` stays 200 (a broker outage is readiness,
//!   never liveness) and `/readyz` 503, and events flow once the broker is back;
//! * a logical message emitted outside any transaction, on a deployment that has stored no
//!   position yet, is dead-lettered once: the process stays up, and neither a kill -9 right after
//!   the copy's commit nor the restart writes it again.

mod common;

use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(90);
/// The topic with a small `max.message.bytes`, and the refused records' payload.
const SMALL: &str = "small.v1.events";

fn eos_args<'a>(metrics: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["--delivery", "exactly-once", "--messages-prefix", "outbox", "--metrics-addr", metrics];
    a.extend_from_slice(extra);
    a
}

/// A transactional event message (`pg_logical_emit_message(true, ...)`) for [`SMALL`], keyed `key`.
fn event(id: &str, key: &str, payload: &str) -> String {
    format!(
        "SELECT pg_logical_emit_message(true, 'outbox', '{{\"event_id\": \"{id}\", \"aggregate_type\": \"rules\", \
         \"aggregate_id\": \"{key}\", \"event_type\": \"small.v1\", \"payload\": {payload}}}')"
    )
}

/// Wait until the slot confirmed the WAL written so far, with `d` running.
fn drained(pg: &PgCluster, d: &Outboxd) {
    let end = pg.current_lsn();
    if let Err(e) = pg.slot_reaches_idle_wal_end(&end, Duration::from_secs(30), T) {
        panic!("{e}\n{}", d.log());
    }
}

fn keys(records: &[Consumed]) -> Vec<String> {
    records.iter().filter_map(|c| c.key_str()).collect()
}

fn aborted(port: u16) -> f64 {
    let body = http_get(port, "/metrics").map(|r| r.1).unwrap_or_default();
    metric(&body, "outboxd_kafka_transactions_total{outcome=\"aborted\"}").unwrap_or(0.0)
}

/// Item 4: records the broker refuses (larger than the topic's `max.message.bytes`) with an empty
/// event id, and with the id of a good record of their own transaction (on another partition, so
/// in another batch: the broker refuses a batch whole). Each is dead-lettered once, the good one is
/// delivered (never dead-lettered in its place), the events after them arrive, and few
/// transactions abort. Keyed by (event id, topic), the empty id was never condemned and the shared
/// id condemned the good record instead: every session aborted again, for ever.
#[test]
fn a_refused_record_without_an_event_id_or_with_a_shared_one_is_dead_lettered_once() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    // Ids the uuid primary key cannot hold (none, shared), and a chosen partition.
    pg.psql("ALTER TABLE outbox ADD COLUMN eid text, ADD COLUMN part int NOT NULL DEFAULT 0");
    let broker = Broker::start();
    broker.create_topic_with(SMALL, 2, &[("max.message.bytes", "2000")], false);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let flags = [
        "--status-interval",
        "2s",
        "--table-field-event-id",
        "eid",
        "--table-fields-additional-placement",
        "part:partition",
    ];
    let mut d = Outboxd::spawn_streaming(&daemon_args(&pg, &broker, &eos_args(&addr, &flags)));
    let big = format!("{{\"blob\": \"{}\"}}", "x".repeat(6000));
    let row = |eid: &str, key: &str, part: u8, payload: &str| {
        format!(
            "INSERT INTO outbox (eid, part, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('{eid}', {part}, 'rules', '{key}', 'small.v1', '{payload}')"
        )
    };
    // One PostgreSQL transaction each, drained in between.
    for sql in [
        row("e-1", "s-1", 0, "{}"),
        format!("BEGIN; {}; {}; COMMIT", row("dup", "d-1", 0, "{}"), row("dup", "d-big", 1, &big)),
        row("", "s-big", 0, &big),
        row("e-2", "s-2", 0, "{}"),
    ] {
        pg.psql(&sql);
        drained(&pg, &d);
    }
    assert!(d.is_running(), "{}", d.log());
    let got = broker.consume_all(SMALL, 2, 3, T);
    assert_eq!(keys(&got), ["s-1", "d-1", "s-2"], "read_committed events around the refused ones:\n{}", d.log());
    let dead = keys(&broker.consume_all("outboxd.dlq", 1, 2, T));
    assert_eq!(dead, ["d-big", "s-big"], "one dead-letter copy of each refused record:\n{}", d.log());
    // Each refused transaction, and at most one after each: librdkafka may fail the next one on
    // the sequence gap the refused batch left ("requires epoch bump").
    let aborts = aborted(port);
    eprintln!("[condemned] aborted transactions: {aborts}");
    assert!(aborts <= 4.0, "the refusals looped ({aborts} aborts):\n{}", d.log());
    d.stop_cleanly();
}

/// Item 5: Kafka frozen (SIGSTOP) before outboxd starts with `--delivery exactly-once`. The
/// producer's start waits for it (up to three minutes, then again), which used to leave the
/// loop quiet past `--health-stall-timeout`: a liveness probe restarted the process for a broker
/// outage. Now `/healthz` stays 200 while `/readyz` is 503, and the event written meanwhile is
/// delivered once the broker answers.
#[test]
fn healthz_stays_green_while_exactly_once_waits_for_an_unreachable_kafka() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    broker.pause();
    let mut d = Outboxd::spawn(&daemon_args(
        &pg,
        &broker,
        &eos_args(&addr, &["--status-interval", "1s", "--health-stall-timeout", "3s"]),
    ));
    let answered = wait_until(Duration::from_secs(30), || http_get(port, "/healthz").is_some());
    assert!(answered, "the endpoint never answered:\n{}", d.log());
    // Five times the stall timeout.
    let until = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < until {
        let live = http_get(port, "/healthz");
        assert_eq!(live.as_ref().map(|r| r.0), Some(200), "/healthz while Kafka is frozen: {live:?}\n{}", d.log());
        assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(503), "ready without Kafka?\n{}", d.log());
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(d.is_running(), "{}", d.log());
    // Written while the producer waits (the slot exists by now): delivered once Kafka answers.
    assert!(!pg.confirmed_lsn().is_empty(), "no slot yet:\n{}", d.log());
    pg.psql(&event("e-1", "k-1", "{}"));
    broker.resume();
    assert!(d.wait_for_streaming(Duration::from_secs(240)), "{}", d.log());
    let got = broker.consume_all(SMALL, 1, 1, T);
    assert_eq!(keys(&got), ["k-1"], "{}", d.log());
    assert!(wait_until(Duration::from_secs(20), || http_get(port, "/readyz").map(|r| r.0) == Some(200)));
    d.stop_cleanly();
}

/// A non-transactional message with the event prefix; returns the LSN PostgreSQL gives it.
fn emit_outside_a_transaction(pg: &PgCluster, id: &str) -> String {
    pg.psql(&format!(
        "SELECT pg_logical_emit_message(false, 'outbox', '{{\"event_id\": \"{id}\", \"aggregate_type\": \"rules\", \
         \"aggregate_id\": \"{id}\", \"event_type\": \"small.v1\", \"payload\": {{}}}}')::text"
    ))
}

/// The dead-letter copies of the non-transactional message `id`, read_committed.
fn copies_of(broker: &Broker, id: &str, at_least: usize) -> usize {
    let dead = broker.consume_all("outboxd.dlq", 1, at_least, Duration::from_secs(10));
    let mine = dead.iter().filter(|c| c.header_str("id").as_deref() == Some(id));
    mine.inspect(|c| assert_eq!(c.header_str("outboxd.error").as_deref(), Some("non_transactional"), "{c:?}")).count()
}

/// The copy of `id` is committed in Kafka; kill -9 at once (before the slot is confirmed past the
/// message: `--status-interval` is long), start again, write an event after it and let it drain:
/// the copy is still there once.
fn crash_after_the_copy_and_resume(
    pg: &PgCluster,
    broker: &Broker,
    args: &[String],
    d: &mut Outboxd,
    id: &str,
    lsn: &str,
) {
    assert!(wait_until(T, || copies_of(broker, id, 1) >= 1), "no copy of {id}:\n{}", d.log());
    d.kill9();
    let confirmed = pg.confirmed_lsn();
    assert!(
        !pg.slot_confirmed_at_least(lsn),
        "the slot confirmed {confirmed} past the message at {lsn} before the kill; the test needs it behind"
    );
    eprintln!("[standalone] killed with the slot at {confirmed}, the message at {lsn}");
    *d = Outboxd::spawn_streaming(args);
    pg.psql(&event("after", "after", "{}"));
    drained(pg, d);
    assert!(d.is_running(), "{}", d.log());
    assert_eq!(copies_of(broker, id, 1), 1, "the copy of {id}, read_committed:\n{}", d.log());
    let got = broker.consume_all(SMALL, 1, 1, T);
    assert!(keys(&got).ends_with(&["after".to_string()]), "{got:?}\n{}", d.log());
}

/// Item 7: on a fresh deployment (no position stored), a non-transactional message comes first.
/// Its dead-letter copy is the first Kafka transaction's only record, which used to have no
/// position to store: the process exited ("an exactly-once commit without a position"), on every
/// start. Now the position is the message's LSN; the copy is written once, also across a kill -9
/// right after its commit and the restart.
#[test]
fn a_message_outside_any_transaction_first_on_a_fresh_deployment_is_dead_lettered_once() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let port = free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let args = daemon_args(&pg, &broker, &eos_args(&addr, &["--status-interval", "30s"]));
    let mut d = Outboxd::spawn_streaming(&args);
    let lsn = emit_outside_a_transaction(&pg, "m-1");
    crash_after_the_copy_and_resume(&pg, &broker, &args, &mut d, "m-1", &lsn);
    d.stop_cleanly();
}

/// Item 7, after a position was stored: the copy of a non-transactional message went into a Kafka
/// transaction whose position did not cover the message, so a kill -9 after that commit (the slot
/// still behind) wrote the copy a second time on restart.
#[test]
fn a_message_outside_any_transaction_is_not_dead_lettered_again_after_a_crash() {
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let port = free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let args = daemon_args(&pg, &broker, &eos_args(&addr, &["--status-interval", "30s"]));
    let mut d = Outboxd::spawn_streaming(&args);
    pg.psql(&event("before", "before", "{}"));
    assert_eq!(keys(&broker.consume_all(SMALL, 1, 1, T)), ["before"], "{}", d.log());
    let lsn = emit_outside_a_transaction(&pg, "m-2");
    crash_after_the_copy_and_resume(&pg, &broker, &args, &mut d, "m-2", &lsn);
    d.stop_cleanly();
}
