//! `outboxd inbox`'s readiness follows Kafka, against real Apache Kafka and PostgreSQL: with every
//! broker killed `/readyz` answers 503 and `outboxd_connected{component="kafka"}` is 0 (the
//! inbox keeps running and retrying); with the broker back on the same ports and data, readiness
//! returns with no record flowing (librdkafka's statistics show a broker up), and the records
//! produced afterwards all arrive, once.

mod common;

use std::time::Duration;

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TOPIC: &str = "down.events";

fn produce(broker: &Broker, from: usize, n: usize) {
    let producer: BaseProducer = broker.client_config().create().expect("producer");
    for i in from..from + n {
        let id = format!("e{i}");
        let payload = serde_json::json!({ "i": i }).to_string();
        let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
        let mut rec = BaseRecord::to(TOPIC).key("k").payload(&payload).headers(headers);
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
    pg.psql("SELECT count(*) FROM public.inbox").trim().parse().unwrap_or(0)
}

#[test]
fn every_broker_down_turns_readiness_off_and_back_on_without_records() {
    let pg = PgCluster::start();
    let mut broker = Broker::start();
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
    ]);
    let mut inbox = Outboxd::spawn(&a);
    let ready = || http_get(port, "/readyz").map(|(c, _)| c);
    let connected =
        || http_get(port, "/metrics").and_then(|(_, b)| metric(&b, "outboxd_connected{component=\"kafka\"}"));
    assert!(wait_until(Duration::from_secs(60), || ready() == Some(200)), "never ready:\n{}", inbox.log());
    produce(&broker, 0, 10);
    assert!(wait_until(Duration::from_secs(30), || count(&pg) == 10), "{} of 10:\n{}", count(&pg), inbox.log());

    broker.kill();
    let off = wait_until(Duration::from_secs(30), || ready() == Some(503));
    assert!(off, "/readyz stayed {:?} with every broker down:\n{}", ready(), inbox.log());
    assert_eq!(connected(), Some(0.0), "outboxd_connected for Kafka while it is down");
    assert!(inbox.is_running(), "the inbox must keep retrying, not exit:\n{}", inbox.log());

    broker.restart();
    let on = wait_until(Duration::from_secs(60), || ready() == Some(200));
    assert!(on, "/readyz stayed {:?} with the broker back:\n{}", ready(), inbox.log());
    assert_eq!(connected(), Some(1.0));
    produce(&broker, 10, 10);
    assert!(wait_until(Duration::from_secs(30), || count(&pg) >= 20), "{} of 20:\n{}", count(&pg), inbox.log());
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(count(&pg), 20, "rows beyond the records produced");
    let distinct = pg.psql("SELECT count(DISTINCT event_id) FROM public.inbox");
    assert_eq!(distinct.trim(), "20");
    inbox.stop_cleanly();
}
