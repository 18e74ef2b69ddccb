//! The Kafka sink with a producer queue of one message (`queue.buffering.max.messages=1`): nearly
//! every record meets a full queue, is held by the sink and handed over again when the queue has
//! room (the held-record path of `src/sink/kafka/mod.rs`, and the ack queue behind it). Real
//! PostgreSQL, real Apache Kafka, the real binary: every event arrives exactly once (nothing is
//! restarted, so at-least-once allows no duplicate here), per key in commit order, counted in
//! `outboxd_events_total`, and the slot is confirmed past the last one.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;

const KEYS: usize = 5;
const SINGLE: usize = 100;
const TXNS: usize = 10;
const PER_TXN: usize = 30;
const TOTAL: usize = SINGLE + TXNS * PER_TXN;
const TOPIC: &str = "qfull.v1.events";

/// `n`-th event of the test: key `k{n % KEYS}`, its sequence within the key in the payload.
fn row(n: usize) -> String {
    format!("('q', 'k{}', 'qfull.v1', '{{\"seq\": {}, \"n\": {n}}}')", n % KEYS, n / KEYS)
}

#[test]
fn a_producer_queue_of_one_loses_nothing_and_keeps_each_keys_order() {
    let started = Instant::now();
    let pg = PgCluster::start();
    pg.apply_all_sql();
    let broker = Broker::start();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut d = Outboxd::spawn_streaming(&daemon_args(
        &pg,
        &broker,
        &[
            "--kafka-property",
            "queue.buffering.max.messages=1",
            "--topic-partitions",
            "3",
            "--status-interval",
            "300ms",
            "--metrics-addr",
            &addr,
        ],
    ));

    // Single-row transactions, then transactions of many rows: those hand the sink a burst at
    // once, which a queue of one cannot take.
    let mut n = 0;
    for _ in 0..SINGLE {
        pg.psql(&format!("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES {}", row(n)));
        n += 1;
    }
    for _ in 0..TXNS {
        let rows: Vec<String> = (n..n + PER_TXN).map(row).collect();
        pg.psql(&format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES {}",
            rows.join(", ")
        ));
        n += PER_TXN;
    }
    assert_eq!(n, TOTAL);

    // The slot is confirmed past the last event once every one is acked.
    let end = pg.psql("SELECT pg_current_wal_insert_lsn()");
    let caught_up = wait_until(Duration::from_secs(40), || {
        pg.psql(&format!(
            "SELECT confirmed_flush_lsn >= '{end}'::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outboxd'"
        )) == "t"
    });
    assert!(caught_up, "confirmed_flush_lsn never reached {end}:\n{}", d.log());

    // Everything is acked: the broker holds each event once (a record handed to librdkafka twice
    // would be a second offset), and a consumer reads them all.
    assert_eq!(broker.end_offsets(TOPIC), TOTAL as i64, "records written to {TOPIC}\n{}", d.log());
    let got = broker.consume_all(TOPIC, 3, TOTAL, Duration::from_secs(30));
    let ids = count_by_id(&got);
    let twice: Vec<_> = ids.iter().filter(|(_, c)| **c > 1).collect();
    assert!(twice.is_empty(), "delivered more than once without any failure: {twice:?}");
    assert_eq!(got.len(), TOTAL, "expected {TOTAL} records on {TOPIC}, got {}\n{}", got.len(), d.log());

    // Per key: one partition, sequence 0, 1, 2, ... in commit order, none missing.
    let mut by_key: HashMap<String, Vec<(i32, i64)>> = HashMap::new();
    for r in &got {
        let key = r.key_str().expect("a key");
        by_key.entry(key).or_default().push((r.partition, r.payload_json()["seq"].as_i64().unwrap()));
    }
    assert_eq!(by_key.len(), KEYS);
    for (key, recs) in &by_key {
        assert!(recs.iter().all(|(p, _)| *p == recs[0].0), "key {key} on more than one partition");
        let seqs: Vec<i64> = recs.iter().map(|(_, s)| *s).collect();
        let want: Vec<i64> = (0..seqs.len() as i64).collect();
        assert_eq!(seqs, want, "key {key}: events out of commit order or missing");
    }

    // Every ack counted once, however the records were held and handed over again.
    let counted = wait_until(Duration::from_secs(5), || {
        http_get(port, "/metrics")
            .and_then(|(_, body)| metric(&body, &format!("outboxd_events_total{{topic=\"{TOPIC}\"}}")))
            .is_some_and(|v| v == TOTAL as f64)
    });
    let body = http_get(port, "/metrics").map(|(_, b)| b).unwrap_or_default();
    assert!(counted, "outboxd_events_total is not {TOTAL}:\n{body}");

    d.sigterm();
    let status = d.wait_exit(Duration::from_secs(20)).expect("outboxd exits after SIGTERM");
    assert!(status.success(), "exit status {status:?}\n{}", d.log());
    eprintln!("{TOTAL} events through a producer queue of one in {:?}", started.elapsed());
}
