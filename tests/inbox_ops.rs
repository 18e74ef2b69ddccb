//! `outboxd inbox`'s operability against real Apache Kafka and PostgreSQL: the lag in seconds per
//! partition, and `/healthz` through a PostgreSQL outage.
//!
//! A backlog of records stamped two minutes ago, read five records per transaction, must show
//! `outboxd_inbox_lag_seconds` of about two minutes while it drains, and 0 once caught up. Then
//! while PostgreSQL is down the writer cannot write, the consumer thread waits on its full
//! channel, and records pile up in Kafka: `/readyz` must answer 503 and `/healthz` stay 200
//! (waiting is not a wedge, however much longer than `--health-stall-timeout` it lasts, and the
//! writer's backoff grows past it). When PostgreSQL is back, every record is in the table once.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TOPIC: &str = "ops.events";
const BACKLOG: usize = 5_000;

fn produce(broker: &Broker, from: usize, n: usize, stamp_ms: Option<i64>) {
    let producer: BaseProducer = broker.client_config().create().expect("producer");
    for i in from..from + n {
        let (id, key) = (format!("e{i}"), format!("k{}", i % 7));
        let payload = serde_json::json!({ "i": i }).to_string();
        let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
        let mut rec = BaseRecord::to(TOPIC).key(&key).payload(&payload).headers(headers);
        if let Some(ts) = stamp_ms {
            rec = rec.timestamp(ts);
        }
        while let Err((_, r)) = producer.send(rec) {
            producer.poll(Duration::from_millis(10));
            rec = r;
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

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
        // Statistics (the lag gauges) every 0.5 s instead of 5 s, so they come while the backlog drains.
        "--kafka-property",
        "statistics.interval.ms=500",
        "--health-stall-timeout",
        "5s",
    ]);
    let mut inbox = Outboxd::spawn(&a);
    let get = |path: &str| http_get(port, path);
    let status = |path: &str| get(path).map(|(s, _)| s);
    let lag_s = || get("/metrics").and_then(|(_, b)| metric(&b, "outboxd_inbox_lag_seconds{"));
    assert!(wait_until(Duration::from_secs(30), || status("/readyz") == Some(200)), "never ready:\n{}", inbox.log());
    // A backlog stamped two minutes ago, drained five records per transaction: librdkafka's
    // statistics come while records are left.
    let stamp = jiff::Timestamp::now().as_millisecond() - 120_000;
    produce(&broker, 0, BACKLOG, Some(stamp));
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

    pg.stop("fast");
    // Far more than the writer's channel holds (4 batches), so the consumer thread waits on it.
    produce(&broker, BACKLOG, 3_000, None);
    assert!(wait_until(Duration::from_secs(20), || status("/readyz") == Some(503)), "ready with PostgreSQL down");
    // Three stall timeouts of outage: liveness holds all along.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(16) {
        assert_eq!(status("/healthz"), Some(200), "/healthz failed during a PostgreSQL outage:\n{}", inbox.log());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(inbox.is_running(), "the inbox exited while PostgreSQL was down:\n{}", inbox.log());

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
    inbox.stop_cleanly();
}
