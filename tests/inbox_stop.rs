//! `outboxd inbox` against real Kafka and PostgreSQL: where the writer stops when shutdown comes
//! while a record waits for the schema registry (the stored offset never passes the waiting
//! record, though later records of its chunk need no registry), and a burst that ends exactly on
//! a full chunk of the consumer is written at once, not after `--batch-timeout`.

mod common;

use std::time::Duration;

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TOPIC: &str = "orders.events";

/// The next offset stored for partition 0 (0 while none is stored).
fn stored(pg: &PgCluster) -> i64 {
    pg.psql("SELECT coalesce(max(next_offset), 0) FROM public.inbox_offsets").trim().parse().unwrap_or(0)
}

/// A record with event id `id` on partition 0; `None`: a tombstone.
fn send(p: &BaseProducer, id: &str, value: Option<&[u8]>) {
    let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id) });
    let mut rec = BaseRecord::<str, [u8]>::to(TOPIC).partition(0).key(id).headers(headers);
    if let Some(v) = value {
        rec = rec.payload(v);
    }
    p.send(rec).map_err(|(e, _)| e).expect("send");
}

fn inbox_args(broker: &Broker, pg: &PgCluster, extra: &[&str]) -> Vec<String> {
    let mut a = args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &pg.url(),
        "--topics",
        TOPIC,
        "--group",
        "stop",
    ]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Records 0 (a tombstone), 1 (Avro wire format: the registry must be asked) and 2 (a tombstone,
/// which needs no registry) come in one chunk; the registry cannot be reached, so record 1 waits
/// (the same wait as an unknown schema id within --schema-missing-timeout). SIGTERM during the
/// wait: record 0 is stored (written before the wait), and the stored next offset stays 1, not 3
/// past the waiting record. Meanwhile the status page shows the writer paused for the registry.
#[test]
fn shutdown_while_a_record_waits_for_the_registry_stores_nothing_past_it() {
    let pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    let broker = Broker::start();
    broker.create_topic(TOPIC, 1);
    let producer: BaseProducer = broker.client_config().create().unwrap();
    send(&producer, "e0", None);
    send(&producer, "e1", Some(&[0, 0, 0, 0, 42, 2, b'x']));
    send(&producer, "e2", None);
    producer.flush(Duration::from_secs(10)).unwrap();
    // Port 9 (discard) is closed here: the registry is "unavailable", never a bad record.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut inbox = Outboxd::spawn(&inbox_args(
        &broker,
        &pg,
        &[
            "--value-format",
            "avro",
            "--schema-registry-url",
            "http://127.0.0.1:9",
            "--reconnect-max-backoff",
            "1s",
            "--metrics-addr",
            &addr,
        ],
    ));
    assert!(inbox.wait_for_log("waiting for the registry", Duration::from_secs(60)), "no wait:\n{}", inbox.log());
    assert!(wait_until(Duration::from_secs(10), || stored(&pg) == 1), "offset {}:\n{}", stored(&pg), inbox.log());
    let writer = || -> serde_json::Value {
        let body = http_get(port, "/status.json").map(|(_, b)| b).unwrap_or_default();
        serde_json::from_str::<serde_json::Value>(&body).map(|v| v["writer"].clone()).unwrap_or_default()
    };
    assert!(
        wait_until(Duration::from_secs(10), || writer()["state"] == "paused"
            && writer()["reason"].as_str().is_some_and(|r| r.contains("schema registry"))),
        "the status page shows the writer {} while it waits for the registry",
        writer()
    );
    std::thread::sleep(Duration::from_secs(2));
    inbox.sigterm();
    assert!(inbox.wait_exit(Duration::from_secs(60)).is_some(), "no exit:\n{}", inbox.log());
    assert_eq!(stored(&pg), 1, "the stored offset passed the record waiting for the registry:\n{}", inbox.log());
    let ids = pg.psql("SELECT string_agg(event_id, ',' ORDER BY event_id) FROM public.inbox");
    assert_eq!(ids.trim(), "e0", "{}", inbox.log());
}

/// 64 records (one full chunk of the consumer, `CHUNK`) in one burst, with `--batch-timeout 60s`:
/// the poll that finds nothing after the full chunk marks it idle, and the batch is written at
/// once rather than after the timeout.
#[test]
fn a_burst_ending_on_a_full_chunk_is_written_without_waiting_for_the_batch_timeout() {
    let pg = PgCluster::start();
    pg.apply_sql_file(concat!(env!("CARGO_MANIFEST_DIR"), "/sql/08_inbox.sql"));
    let broker = Broker::start();
    broker.create_topic(TOPIC, 1);
    let producer: BaseProducer = broker.client_config().create().unwrap();
    for n in 0..64 {
        send(&producer, &format!("e{n}"), Some(format!("{{\"n\":{n}}}").as_bytes()));
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    let mut inbox = Outboxd::spawn(&inbox_args(&broker, &pg, &["--batch-timeout", "60s", "--metrics-addr", "off"]));
    assert!(
        wait_until(Duration::from_secs(20), || stored(&pg) == 64),
        "stored {} after 20 s (--batch-timeout 60s):\n{}",
        stored(&pg),
        inbox.log()
    );
    inbox.sigterm();
    assert!(inbox.wait_exit(Duration::from_secs(60)).is_some(), "no exit:\n{}", inbox.log());
}
