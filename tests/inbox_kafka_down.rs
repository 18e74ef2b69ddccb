//! `outboxd inbox`'s readiness follows Kafka, against real Apache Kafka and PostgreSQL: with every
//! broker killed `/readyz` answers 503 and `outboxd_connected{component="kafka"}` is 0 (the
//! inbox keeps running and retrying); with the broker back on the same ports and data, readiness
//! returns with no record flowing (librdkafka's statistics show a broker up), and the records
//! produced afterwards all arrive, once.

mod common;

use std::time::Duration;

use common::inbox::{inbox_rows, produce_numbered};
use common::*;

const TOPIC: &str = "down.events";

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
    produce_numbered(&broker, TOPIC, 0..10, |_| "k".into(), None);
    assert!(
        wait_until(Duration::from_secs(30), || inbox_rows(&pg) == 10),
        "{} of 10:\n{}",
        inbox_rows(&pg),
        inbox.log()
    );

    broker.kill();
    let off = wait_until(Duration::from_secs(30), || ready() == Some(503));
    assert!(off, "/readyz stayed {:?} with every broker down:\n{}", ready(), inbox.log());
    assert_eq!(connected(), Some(0.0), "outboxd_connected for Kafka while it is down");
    assert!(inbox.is_running(), "the inbox must keep retrying, not exit:\n{}", inbox.log());

    broker.restart();
    let on = wait_until(Duration::from_secs(60), || ready() == Some(200));
    assert!(on, "/readyz stayed {:?} with the broker back:\n{}", ready(), inbox.log());
    assert_eq!(connected(), Some(1.0));
    produce_numbered(&broker, TOPIC, 10..20, |_| "k".into(), None);
    assert!(
        wait_until(Duration::from_secs(30), || inbox_rows(&pg) >= 20),
        "{} of 20:\n{}",
        inbox_rows(&pg),
        inbox.log()
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(inbox_rows(&pg), 20, "rows beyond the records produced");
    let distinct = pg.psql("SELECT count(DISTINCT event_id) FROM public.inbox");
    assert_eq!(distinct.trim(), "20");
    inbox.stop_cleanly();
}
