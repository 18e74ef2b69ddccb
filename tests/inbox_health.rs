//! `outboxd inbox`'s `/healthz` during a long catch-up, against real Apache Kafka and PostgreSQL.
//!
//! In a catch-up the writer is the bottleneck and the consumer keeps its channel full; the
//! writer's loop must still turn once a second (its `/healthz` tick, the backlog gauges), or a
//! liveness probe kills a healthy drain after `--health-stall-timeout` and the restart meets the
//! same backlog: a crash loop. A row trigger sleeping 3 ms makes each batch of 5 records take
//! at least 15 ms, so a backlog of 4,000 drains over several stall timeouts (5 s) on any machine;
//! `/healthz` is asked twice a second all along and must answer 200, and the backlog gauge must
//! move while the drain lasts.

mod common;

use std::time::{Duration, Instant};

use common::inbox::{inbox_rows, produce_numbered};
use common::*;

const TOPIC: &str = "health.events";
const BACKLOG: usize = 4_000;
const STALL: Duration = Duration::from_secs(5);

#[test]
fn healthz_stays_200_while_a_backlog_drains_for_several_stall_timeouts() {
    let pg = PgCluster::start();
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
    let status = |path: &str| http_get(port, path).map(|(s, _)| s);
    let unprocessed = || http_get(port, "/metrics").and_then(|(_, b)| metric(&b, "outboxd_inbox_unprocessed_rows"));
    assert!(wait_until(Duration::from_secs(30), || status("/readyz") == Some(200)), "never ready:\n{}", inbox.log());
    // The table is the inbox's own (made at start); a slow row makes the writer the bottleneck.
    pg.psql(
        "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS \
           $$BEGIN PERFORM pg_sleep(0.003); RETURN NEW; END$$; \
         CREATE TRIGGER slow BEFORE INSERT ON public.inbox FOR EACH ROW EXECUTE FUNCTION slow_row();",
    );
    produce_numbered(&broker, TOPIC, 0..BACKLOG, |i| format!("k{}", i % 7), None);
    let t0 = Instant::now();
    let mut backlog_seen = Vec::new();
    let mut probes = 0;
    while inbox_rows(&pg) < BACKLOG {
        assert!(t0.elapsed() < Duration::from_secs(120), "{} of {BACKLOG} rows:\n{}", inbox_rows(&pg), inbox.log());
        let s = status("/healthz");
        assert_eq!(
            s,
            Some(200),
            "/healthz failed {:?} into a healthy drain ({} of {BACKLOG} rows):\n{}",
            t0.elapsed(),
            inbox_rows(&pg),
            inbox.log()
        );
        probes += 1;
        backlog_seen.extend(unprocessed());
        std::thread::sleep(Duration::from_millis(500));
    }
    let drain = t0.elapsed();
    eprintln!(
        "drained {BACKLOG} records in {drain:?}, /healthz 200 on {probes} probes; backlog gauge {backlog_seen:?}"
    );
    // Otherwise the test proves nothing: the drain must outlast the stall timeout well.
    assert!(drain > STALL * 2, "the drain took only {drain:?}: too short to test the stall check");
    // The backlog gauge (every 5 s) was read while the drain lasted, not only after it.
    assert!(
        backlog_seen.iter().any(|n| *n > 0.0 && *n < BACKLOG as f64),
        "outboxd_inbox_unprocessed_rows during the drain: {backlog_seen:?}"
    );
    assert_eq!(status("/healthz"), Some(200));
    assert!(inbox.is_running(), "{}", inbox.log());
    inbox.stop_cleanly();
}
