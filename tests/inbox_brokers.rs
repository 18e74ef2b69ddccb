//! `outboxd inbox` through broker failures: three Apache Kafka brokers, a topic replicated three
//! times, and the leader of a partition killed (kill -9) three times while a producer sends and
//! the inbox reads, each time started again. Every event must be in the inbox once, each key's
//! events in the order produced (the payload's `n` runs 0, 1, 2, ... per key in `seq` order).

mod common;

use std::time::Duration;

use common::*;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

const TOPIC: &str = "orders.events";
const KEYS: usize = 12;

#[test]
fn leader_kills_on_three_brokers_lose_and_double_nothing() {
    let pg = PgCluster::start();
    let broker = Broker::options().brokers(3).prop("group.min.session.timeout.ms=1000").start();
    broker.create_topic(TOPIC, 3);
    let mut inbox = Outboxd::spawn(&args(&[
        "inbox",
        "--kafka-brokers",
        &broker.bootstrap(),
        "--postgres-url",
        &pg.url(),
        "--topics",
        TOPIC,
        "--metrics-addr",
        "off",
        "--kafka-property",
        "session.timeout.ms=6000",
    ]));
    let mut cfg = broker.client_config();
    cfg.set("enable.idempotence", "true").set("acks", "all").set("linger.ms", "5");
    let producer: BaseProducer = cfg.create().unwrap();
    let total = 9_000;
    let mut per_key = [0usize; KEYS];
    for i in 0..total {
        let k = i % KEYS;
        let (key, id) = (format!("k{k}"), format!("e{i}"));
        let payload = serde_json::json!({"n": per_key[k], "i": i}).to_string();
        per_key[k] += 1;
        let headers = OwnedHeaders::new().insert(Header { key: "id", value: Some(id.as_str()) });
        let mut rec = BaseRecord::to(TOPIC).key(&key).payload(&payload).headers(headers);
        while let Err((_, r)) = producer.send(rec) {
            producer.poll(Duration::from_millis(10));
            rec = r;
        }
        producer.poll(Duration::ZERO);
        // Three leader kills spread over the run, each node started again after a few seconds.
        if i % 3000 == 1500 {
            let (_, leader, _) = broker.replicas(TOPIC)[i / 3000 % 3].clone();
            assert!(leader > 0, "no leader for the partition");
            broker.kill_node(leader as u32);
            eprintln!("killed broker {leader}, the leader of partition {}", i / 3000 % 3);
            for _ in 0..300 {
                producer.poll(Duration::from_millis(10));
            }
            broker.start_node(leader as u32);
        }
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
    let count = || {
        if pg.psql("SELECT to_regclass('public.inbox') IS NULL").trim() == "t" {
            return 0;
        }
        pg.psql("SELECT count(*) FROM public.inbox").trim().parse::<usize>().unwrap_or(0)
    };
    assert!(wait_until(Duration::from_secs(120), || count() >= total), "{} of {total}\n{}", count(), inbox.log());
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(count(), total, "{}", inbox.log());
    let disorder = pg.psql(
        "SELECT aggregate_key, n, rn FROM (SELECT aggregate_key, (payload_json->>'n')::int AS n, \
           row_number() OVER (PARTITION BY aggregate_key ORDER BY seq) - 1 AS rn FROM public.inbox) x \
          WHERE n <> rn LIMIT 5",
    );
    assert!(disorder.trim().is_empty(), "keys out of order or with gaps: {disorder}");
    let ids = pg.psql("SELECT count(*) FROM public.inbox WHERE event_id <> 'e' || (payload_json->>'i')");
    assert_eq!(ids.trim(), "0");
    inbox.stop_cleanly();
}
