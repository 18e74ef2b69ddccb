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

/// Each partition's next offset stored in PostgreSQL.
fn stored(pg: &PgCluster) -> BTreeMap<i32, i64> {
    pg.psql("SELECT kafka_partition, next_offset FROM public.inbox_offsets")
        .lines()
        .filter_map(|l| {
            let (p, n) = l.trim().split_once('|')?;
            Some((p.trim().parse().ok()?, n.trim().parse().ok()?))
        })
        .collect()
}

fn status_json(port: u16) -> serde_json::Value {
    let (code, body) = http_get(port, "/status.json").expect("/status.json answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/status.json is not JSON ({e}): {body}"))
}

/// The page's stored offsets per partition.
fn page_stored(s: &serde_json::Value) -> BTreeMap<i32, Option<i64>> {
    s["partitions"]
        .as_array()
        .expect("partitions[]")
        .iter()
        .map(|p| (p["partition"].as_i64().unwrap() as i32, p["stored_offset"].as_i64()))
        .collect()
}

/// The status page during a drain: no partition's stored offset is ahead of the database's after
/// the request, one behind its value before the request catches up at once, the lag is there, and once drained every figure equals the
/// database's (stored offsets, the partitions' ends, unprocessed rows and the oldest's age after
/// a worker marks rows processed) and the dead letters are listed; PostgreSQL stopped, the writer
/// reads paused and not ready, then running again.
#[test]
fn the_inbox_status_page_during_a_drain_matches_the_database() {
    const TOPIC: &str = "page.events";
    const TOTAL: usize = 3_000;
    const BAD: [usize; 2] = [5, 1_500];
    let mut pg = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, PARTITIONS);
    slow_inbox(&pg, 1);
    produce(&broker, TOPIC, "p", TOTAL, &BAD);
    let port = free_port();
    let mut inbox = Outboxd::spawn(&inbox_args(&pg, &broker, TOPIC, port, &["--reconnect-max-backoff", "1s"]));
    let rows = TOTAL as i64 - BAD.len() as i64;
    let (mut checked, mut lag_seen) = (0, false);
    let t0 = Instant::now();
    while count(&pg) < rows {
        assert!(t0.elapsed() < Duration::from_secs(120), "{} of {rows} rows:\n{}", count(&pg), inbox.log());
        let before = stored(&pg);
        let Some((200, body)) = http_get(port, "/status.json") else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let after = stored(&pg);
        let s: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        for (p, on_page) in page_stored(&s) {
            let Some(on_page) = on_page else { continue };
            let (lo, hi) = (before.get(&p).copied().unwrap_or(0), after.get(&p).copied().unwrap_or(i64::MAX));
            // Never ahead of the database: the writer tells the page only after its commit.
            assert!(on_page <= hi, "partition {p}: the page says {on_page} stored, the database only {hi}");
            // It may trail by the batch committed but not yet told; then it catches up at once.
            if on_page < lo {
                let caught_up = wait_until(Duration::from_secs(5), || {
                    page_stored(&status_json(port)).get(&p).copied().flatten().is_some_and(|n| n >= lo)
                });
                assert!(
                    caught_up,
                    "partition {p}: the page says {on_page} stored, the database {lo} before, and the page stays behind"
                );
            }
            checked += 1;
        }
        lag_seen |= s["partitions"].as_array().unwrap().iter().any(|p| p["lag_records"].as_i64() > Some(0));
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(checked >= 8, "only {checked} stored offsets compared during the drain:\n{}", inbox.log());
    assert!(lag_seen, "no lag on the page during the drain");
    // Drained: the page's figures are the database's and Kafka's.
    let settled = |s: &serde_json::Value| {
        let parts = s["partitions"].as_array().unwrap();
        parts.len() == PARTITIONS as usize
            && page_stored(s).into_iter().map(|(p, n)| (p, n.unwrap_or(-1))).collect::<BTreeMap<_, _>>() == stored(&pg)
            && parts.iter().map(|p| p["high_watermark"].as_i64().unwrap_or(-1)).sum::<i64>() == TOTAL as i64
            && parts.iter().all(|p| p["lag_records"].as_i64() == Some(0))
            && s["unprocessed_rows"].as_i64() == Some(rows)
    };
    assert!(
        wait_until(Duration::from_secs(30), || settled(&status_json(port))),
        "after the drain: {:#}\noffsets in PostgreSQL {:?}",
        status_json(port),
        stored(&pg)
    );
    assert_eq!(stored(&pg).values().sum::<i64>(), TOTAL as i64, "the dead letters' offsets moved on too");
    let s = status_json(port);
    assert_eq!((s["command"].as_str(), s["ready"].as_bool()), (Some("inbox"), Some(true)), "{s:#}");
    assert_eq!(s["writer"]["state"], "running", "{s:#}");
    assert_eq!(s["rows_total"].as_i64(), Some(rows), "{s:#}");
    assert_eq!(s["dead_letters"]["total"].as_i64(), Some(BAD.len() as i64), "{s:#}");
    assert_eq!(s["dead_letters"]["by_reason"][0]["reason"], "inbox_bad_event_id", "{s:#}");
    assert_eq!(s["dead_letters"]["newest"].as_array().map(Vec::len), Some(BAD.len()), "{s:#}");
    // A worker processes a third: the backlog figures follow the table (queried every 5 s).
    pg.psql("UPDATE public.inbox SET processed_at = now() WHERE seq IN (SELECT seq FROM public.inbox ORDER BY seq LIMIT 1000)");
    let unprocessed = rows - 1000;
    assert!(
        wait_until(Duration::from_secs(20), || status_json(port)["unprocessed_rows"].as_i64() == Some(unprocessed)),
        "{:#}",
        status_json(port)
    );
    let oldest_db: f64 = pg
        .psql("SELECT extract(epoch FROM now() - min(received_at)) FROM public.inbox WHERE processed_at IS NULL")
        .trim()
        .parse()
        .unwrap();
    let oldest_page = status_json(port)["oldest_unprocessed_seconds"].as_f64().unwrap();
    assert!((oldest_page - oldest_db).abs() < 7.0, "oldest unprocessed: page {oldest_page} s, database {oldest_db} s");
    // The HTML carries the same figures without JavaScript.
    let (code, html) = http_get(port, "/").expect("/ answers");
    assert_eq!(code, 200);
    let wants = [
        format!("data-partition=\"{TOPIC}/0\""),
        "inbox_bad_event_id".into(),
        "running".into(),
        unprocessed.to_string(),
    ];
    for want in wants {
        assert!(html.contains(&want), "the page lacks {want}:\n{html}");
    }
    let (code, js) = http_get(port, "/status.js").expect("/status.js answers");
    assert!(code == 200 && js.contains("partitions"), "{js}");
    // PostgreSQL away: the writer is paused (with the reason) and the process not ready.
    pg.stop("fast");
    produce(&broker, TOPIC, "q", 10, &[]);
    let paused = |s: &serde_json::Value| s["writer"]["state"] == "paused" && s["ready"] == false;
    assert!(wait_until(Duration::from_secs(30), || paused(&status_json(port))), "{:#}", status_json(port));
    assert!(status_json(port)["writer"]["reason"].as_str().is_some_and(|r| !r.is_empty()));
    pg.start_again();
    assert!(
        wait_until(Duration::from_secs(60), || status_json(port)["writer"]["state"] == "running"
            && count(&pg) == rows + 10),
        "{:#}\n{}",
        status_json(port),
        inbox.log()
    );
    inbox.stop_cleanly();
}

/// Behind a transactional producer each commit marker takes an offset and holds no record: once
/// the inbox has stored every record and stepped over the markers, every partition reads 0 lag
/// on `/metrics` and the status page, though Kafka's ends lie past the stored offsets.
#[test]
fn a_caught_up_partition_behind_a_transactional_producer_reads_no_lag() {
    const TOPIC: &str = "txn.events";
    const TXNS: usize = 4;
    const PER_TXN: usize = 10;
    let pg = PgCluster::start();
    let broker = Broker::start();
    broker.create_topic(TOPIC, PARTITIONS);
    let producer: BaseProducer = broker
        .client_config()
        .set("transactional.id", unique_name("inbox-txn"))
        .create()
        .expect("transactional producer");
    producer.init_transactions(Duration::from_secs(30)).expect("init_transactions");
    for t in 0..TXNS {
        producer.begin_transaction().expect("begin");
        for i in 0..PER_TXN {
            let n = t * PER_TXN + i;
            let (id, key, payload) =
                (format!("x-{n}"), format!("k{}", n % 16), serde_json::json!({ "i": n }).to_string());
            let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
            let mut rec = BaseRecord::to(TOPIC).key(&key).payload(&payload).headers(headers);
            while let Err((_, r)) = producer.send(rec) {
                producer.poll(Duration::from_millis(10));
                rec = r;
            }
        }
        producer.commit_transaction(Duration::from_secs(30)).expect("commit");
    }
    let port = free_port();
    let mut inbox = Outboxd::spawn(&inbox_args(&pg, &broker, TOPIC, port, &[]));
    let rows = (TXNS * PER_TXN) as i64;
    let done = wait_until(Duration::from_secs(60), || common::inbox::inbox_rows(&pg) as i64 == rows);
    assert!(done, "{} of {rows} rows:\n{}", common::inbox::inbox_rows(&pg), inbox.log());
    // The markers are there: Kafka's ends lie past the offsets stored, on every partition written.
    let ends = broker.end_offsets(TOPIC);
    assert!(
        ends > stored(&pg).values().sum::<i64>(),
        "no commit marker past the stored offsets: ends {ends}, {:?}",
        stored(&pg)
    );
    let caught_up = || {
        let l = lags(port);
        let s = status_json(port);
        l.len() == PARTITIONS as usize
            && l.values().all(|v| *v == 0.0)
            && s["partitions"].as_array().is_some_and(|ps| ps.iter().all(|p| p["lag_records"].as_i64() == Some(0)))
    };
    assert!(
        wait_until(Duration::from_secs(20), caught_up),
        "lag {:?}, page {:#}, stored {:?}, ends {ends}",
        lags(port),
        status_json(port)["partitions"],
        stored(&pg)
    );
    inbox.stop_cleanly();
}
