//! `outboxd inbox`'s operability against real Apache Kafka and PostgreSQL: the lag gauges through
//! a rebalance between two inbox processes of one group, and the inbox's status page (`/`,
//! `/status.json`) during a drain, its figures checked against the database.
//!
//! A row trigger sleeping 1 ms makes the writer the bottleneck, so a backlog of a few thousand
//! records drains over several seconds on any machine and the lag is there to be seen. librdkafka's
//! statistics (where the lag comes from) are asked for every second.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const PARTITIONS: i32 = 4;

/// `n` records into `topic`, keys spread over every partition, `id` headers `prefix`-i (an empty
/// `id` for each index in `bad`: a record the inbox dead-letters).
fn produce(broker: &Broker, topic: &str, prefix: &str, n: usize, bad: &[usize]) {
    let producer: BaseProducer = broker.client_config().create().expect("producer");
    for i in 0..n {
        let (id, key) = (format!("{prefix}-{i}"), format!("k{}", i % 16));
        let payload = serde_json::json!({ "i": i }).to_string();
        let id = if bad.contains(&i) { "" } else { id.as_str() };
        let headers = OwnedHeaders::new()
            .insert(Header { key: "id", value: Some(id) })
            .insert(Header { key: "eventType", value: Some("order.paid") });
        let mut rec = BaseRecord::to(topic).key(&key).payload(&payload).headers(headers);
        while let Err((_, r)) = producer.send(rec) {
            producer.poll(Duration::from_millis(10));
            rec = r;
        }
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

/// The inbox schema made before the inbox starts, with a row trigger sleeping `ms` per row.
fn slow_inbox(pg: &PgCluster, ms: u32) {
    pg.apply_sql_file(sql_dir().join("08_inbox.sql"));
    pg.psql(&format!(
        "CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS \
           $$BEGIN PERFORM pg_sleep({}); RETURN NEW; END$$; \
         CREATE TRIGGER slow BEFORE INSERT ON public.inbox FOR EACH ROW EXECUTE FUNCTION slow_row();",
        ms as f64 / 1000.0
    ));
}

fn inbox_args(pg: &PgCluster, broker: &Broker, topic: &str, port: u16, extra: &[&str]) -> Vec<String> {
    let mut a = args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &pg.url(),
        "--topics",
        topic,
        "--group",
        "billing",
        "--metrics-addr",
        &format!("127.0.0.1:{port}"),
        "--batch-size",
        "50",
        "--kafka-property",
        "statistics.interval.ms=1000",
        "--kafka-property",
        "session.timeout.ms=6000",
        "--kafka-property",
        "heartbeat.interval.ms=500",
    ]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Each partition's `outboxd_inbox_lag_records` on a process's `/metrics` (series it has made).
fn lags(port: u16) -> BTreeMap<i32, f64> {
    let body = http_get(port, "/metrics").map(|(_, b)| b).unwrap_or_default();
    body.lines()
        .filter_map(|l| l.strip_prefix("outboxd_inbox_lag_records{"))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            let p = labels.split("partition=\"").nth(1)?.split('"').next()?.parse().ok()?;
            Some((p, value.parse().ok()?))
        })
        .collect()
}

fn count(pg: &PgCluster) -> i64 {
    pg.psql("SELECT count(*) FROM public.inbox").trim().parse().unwrap_or(0)
}

/// A starts on a backlog; B joins the group and takes some of A's partitions. On A's `/metrics`
/// the partitions it lost must read 0 (the new owner reports them), not the lag they had when
/// they were taken away, frozen; on B's they read the real lag, then 0 once drained.
#[test]
fn a_partition_taken_by_another_process_reads_lag_0_where_it_was_and_the_real_lag_where_it_is() {
    const TOPIC: &str = "rebalance.events";
    const BACKLOG: usize = 8_000;
    let pg = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, PARTITIONS);
    slow_inbox(&pg, 1);
    produce(&broker, TOPIC, "e", BACKLOG, &[]);
    let (port_a, port_b) = (free_port(), free_port());
    let mut a = Outboxd::spawn(&inbox_args(&pg, &broker, TOPIC, port_a, &[]));
    // A reports a lag on every partition before B comes.
    let all_lagging = |port| {
        let l = lags(port);
        l.len() == PARTITIONS as usize && l.values().all(|v| *v > 0.0)
    };
    assert!(
        wait_until(Duration::from_secs(60), || all_lagging(port_a)),
        "A never reported a lag on every partition: {:?}\n{}",
        lags(port_a),
        a.log()
    );
    let before = lags(port_a);
    let mut b = Outboxd::spawn(&inbox_args(&pg, &broker, TOPIC, port_b, &[]));
    // B's series are the partitions assigned to it (made 0 on assignment, then set by statistics).
    let taken = || lags(port_b).keys().copied().collect::<Vec<_>>();
    assert!(
        wait_until(Duration::from_secs(60), || !taken().is_empty() && lags(port_b).values().any(|v| *v > 0.0)),
        "B never reported a lag on a partition: {:?}\nA:\n{}\nB:\n{}",
        lags(port_b),
        a.log(),
        b.log()
    );
    let lost = taken();
    assert!(lost.len() < PARTITIONS as usize, "B took every partition {lost:?}; A should keep some");
    // At the moment B reads a real lag on a partition, A reads 0 for it (its last value was > 0).
    let (on_a, on_b) = (lags(port_a), lags(port_b));
    let real: Vec<i32> = lost.iter().copied().filter(|p| on_b.get(p).is_some_and(|v| *v > 0.0)).collect();
    assert!(!real.is_empty(), "B's lags {on_b:?}");
    for p in &real {
        assert!(before[p] > 0.0);
        assert_eq!(
            on_a.get(p).copied(),
            Some(0.0),
            "partition {p} was taken by B (which reads lag {}), yet A still reads {:?}; A's lag before: {before:?}",
            on_b[p],
            on_a.get(p)
        );
    }
    // Both drain: every series reads 0 on both, and no row is missing.
    let t0 = Instant::now();
    while count(&pg) < BACKLOG as i64 {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{} of {BACKLOG} rows:\nA:\n{}\nB:\n{}",
            count(&pg),
            a.log(),
            b.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let zero = |port| lags(port).values().all(|v| *v == 0.0);
    assert!(
        wait_until(Duration::from_secs(20), || zero(port_a) && zero(port_b)),
        "after the drain A reads {:?}, B {:?}",
        lags(port_a),
        lags(port_b)
    );
    assert_eq!(pg.psql("SELECT count(DISTINCT event_id) FROM public.inbox").trim(), BACKLOG.to_string());
    a.stop_cleanly();
    b.stop_cleanly();
}
