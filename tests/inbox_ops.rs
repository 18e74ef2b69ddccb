//! `outboxd inbox`'s operability against real Apache Kafka and PostgreSQL: the lag per partition,
//! `/healthz` and `/readyz` through a PostgreSQL outage.
//!
//! A backlog of records stamped two minutes ago, read five records per transaction, must show
//! `outboxd_inbox_lag_seconds` of about two minutes while it drains, and 0 once caught up. Then
//! while PostgreSQL is down the writer cannot write, the consumer thread waits on its full
//! channel, and records pile up in Kafka: `/readyz` must answer 503 and `/healthz` stay 200
//! (waiting is not a wedge, however much longer than `--health-stall-timeout` it lasts, and the
//! writer's backoff grows past it), and the lag must grow meanwhile: in records by exactly those
//! produced during the outage, in seconds with the clock. When PostgreSQL is back, every record is
//! in the table once and the lag falls back to 0.
//!
//! An idle inbox (no records flowing) must answer 503 too within the documented time of
//! PostgreSQL going away, and 200 again once it is back.

mod common;

use std::time::{Duration, Instant};

use common::inbox::produce_numbered;
use common::*;

const TOPIC: &str = "ops.events";
const BACKLOG: usize = 5_000;

fn count(pg: &PgCluster) -> usize {
    if pg.psql("SELECT to_regclass('public.inbox') IS NULL").trim() == "t" {
        return 0;
    }
    pg.psql("SELECT count(DISTINCT event_id) FROM public.inbox").trim().parse().unwrap_or(0)
}

#[test]
fn a_postgresql_outage_is_readiness_not_liveness_and_the_lag_in_seconds_grows_meanwhile() {
    let mut pg = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, 1);
    let port = free_port();
    let a = args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &pg.url(),
        "--topics",
        TOPIC,
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
        "--batch-size",
        "5",
        "--health-stall-timeout",
        "5s",
    ]);
    let mut inbox = Outboxd::spawn(&a);
    let get = |path: &str| http_get(port, path);
    let status = |path: &str| get(path).map(|(s, _)| s);
    let lag_s = || get("/metrics").and_then(|(_, b)| metric(&b, "outboxd_inbox_lag_seconds{"));
    let lag_n = || get("/metrics").and_then(|(_, b)| metric(&b, "outboxd_inbox_lag_records{"));
    assert!(wait_until(Duration::from_secs(30), || status("/readyz") == Some(200)), "never ready:\n{}", inbox.log());
    // A backlog stamped two minutes ago, drained five records per transaction, each row held 2 ms
    // by a trigger: the drain lasts 10 s or more on any box, so the gauges (set every second)
    // come while records are left (unslowed, a quiet box drained it in half a second, between two).
    pg.psql(
        "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS \
           $$BEGIN PERFORM pg_sleep(0.002); RETURN NEW; END$$; \
         CREATE TRIGGER slow BEFORE INSERT ON public.inbox FOR EACH ROW EXECUTE FUNCTION slow_row();",
    );
    let stamp = jiff::Timestamp::now().as_millisecond() - 120_000;
    produce_numbered(&broker, TOPIC, 0..BACKLOG, |i| format!("k{}", i % 7), Some(stamp));
    let mut seen = Vec::new();
    let drained = wait_until(Duration::from_secs(90), || {
        seen.extend(lag_s());
        count(&pg) == BACKLOG
    });
    assert!(drained, "{} of {BACKLOG} rows:\n{}", count(&pg), inbox.log());
    assert!(
        seen.iter().any(|s| (115.0..200.0).contains(s)),
        "outboxd_inbox_lag_seconds while the backlog drained: {seen:?} (expected about 120)"
    );
    // Caught up, the lag is 0.
    assert!(wait_until(Duration::from_secs(20), || lag_s() == Some(0.0)), "lag {:?} s caught up", lag_s());

    assert_eq!(lag_n(), Some(0.0), "records lag caught up");

    pg.stop("fast");
    // Far more than the writer's channel holds (4 batches), so the consumer thread waits on it.
    produce_numbered(&broker, TOPIC, BACKLOG..BACKLOG + 1_500, |i| format!("k{}", i % 7), None);
    assert!(wait_until(Duration::from_secs(20), || status("/readyz") == Some(503)), "ready with PostgreSQL down");
    // The lag in records is exactly what came during the outage: nothing of it is stored.
    assert!(
        wait_until(Duration::from_secs(10), || lag_n() == Some(1_500.0)),
        "outboxd_inbox_lag_records {:?} with 1,500 records produced during the outage:\n{}",
        lag_n(),
        inbox.log()
    );
    let first_s = lag_s().expect("lag seconds during the outage");
    // Three stall timeouts of outage: liveness holds all along.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(16) {
        assert_eq!(status("/healthz"), Some(200), "/healthz failed during a PostgreSQL outage:\n{}", inbox.log());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(inbox.is_running(), "the inbox exited while PostgreSQL was down:\n{}", inbox.log());
    // More records during the outage: the lag grows by them, and in seconds with the clock (the
    // oldest record not stored is the same one, 16 s older).
    produce_numbered(&broker, TOPIC, BACKLOG + 1_500..BACKLOG + 3_000, |i| format!("k{}", i % 7), None);
    assert!(
        wait_until(Duration::from_secs(10), || lag_n() == Some(3_000.0)),
        "outboxd_inbox_lag_records {:?} with 3,000 records produced during the outage",
        lag_n()
    );
    let later_s = lag_s().expect("lag seconds during the outage");
    assert!(
        later_s >= first_s + 14.0,
        "outboxd_inbox_lag_seconds went from {first_s} to {later_s} over 16 s of outage (expected growth with the clock)"
    );

    pg.start_again();
    assert!(
        wait_until(Duration::from_secs(90), || count(&pg) == BACKLOG + 3_000),
        "{} of {} rows after PostgreSQL came back:\n{}",
        count(&pg),
        BACKLOG + 3_000,
        inbox.log()
    );
    assert_eq!(pg.psql("SELECT count(*) FROM public.inbox").trim(), (BACKLOG + 3_000).to_string(), "a row twice");
    assert_eq!(status("/healthz"), Some(200));
    assert_eq!(status("/readyz"), Some(200));
    // Caught up again: the lag falls back.
    assert!(wait_until(Duration::from_secs(10), || lag_n() == Some(0.0)), "lag {:?} records after", lag_n());
    assert!(wait_until(Duration::from_secs(10), || lag_s() == Some(0.0)), "lag {:?} s after", lag_s());
    inbox.stop_cleanly();
}

#[test]
fn an_idle_inbox_answers_503_within_seconds_of_a_postgresql_outage_and_200_after() {
    let mut pg = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, 1);
    let port = free_port();
    let a = args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &pg.url(),
        "--topics",
        TOPIC,
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
        "--reconnect-max-backoff",
        "2s",
    ]);
    let mut inbox = Outboxd::spawn(&a);
    let status = |path: &str| http_get(port, path).map(|(s, _)| s);
    assert!(wait_until(Duration::from_secs(30), || status("/readyz") == Some(200)), "never ready:\n{}", inbox.log());
    assert!(
        wait_until(Duration::from_secs(30), || inbox.log().contains("assigned;")),
        "no assignment:\n{}",
        inbox.log()
    );
    // No record at all: only the idle writer's check can notice the outage. The documented bound
    // is about 6 s after the last success (docs/src/inbox.md); PostgreSQL refuses at once here.
    pg.stop("fast");
    let t0 = Instant::now();
    assert!(
        wait_until(Duration::from_secs(15), || status("/readyz") == Some(503)),
        "/readyz {:?} 15 s into a PostgreSQL outage with no records flowing:\n{}",
        status("/readyz"),
        inbox.log()
    );
    eprintln!("503 after {:?}", t0.elapsed());
    assert_eq!(status("/healthz"), Some(200), "an outage is readiness, not liveness");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(status("/readyz"), Some(503), "ready again with PostgreSQL still down");
    pg.start_again();
    assert!(
        wait_until(Duration::from_secs(20), || status("/readyz") == Some(200)),
        "/readyz {:?} 20 s after PostgreSQL came back:\n{}",
        status("/readyz"),
        inbox.log()
    );
    assert!(inbox.is_running(), "the inbox exited:\n{}", inbox.log());
    // And it still writes: a record produced now is in the table.
    produce_numbered(&broker, TOPIC, 0..1, |i| format!("k{}", i % 7), None);
    assert!(wait_until(Duration::from_secs(20), || count(&pg) == 1), "the record after the outage:\n{}", inbox.log());
    inbox.stop_cleanly();
}
